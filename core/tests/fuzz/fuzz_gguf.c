/* fuzz_gguf: the GGUF reader (kvg_gguf_open and every getter over what it found), then a model
 * load of the same bytes on the reference backend (architecture tables, hyperparameters,
 * tensor shapes, the tokenizer's vocabulary and merges). A refusal is fine; a crash, a
 * sanitizer report or a leak is a finding. Seeds: corpus/gguf/ (small models of
 * kvgen-mkmodel, a few architectures and tensor types). */
#include "fuzz_util.h"
#include "kvg_gguf.h"

static void quiet(void *user, kvgen_log_level level, const char *message) {
    (void)user;
    (void)level;
    (void)message;
}

static volatile uint64_t sink;

static void walk(const kvg_gguf *g) {
    uint64_t acc = kvg_gguf_version(g) + kvg_gguf_file_size(g) + kvg_gguf_alignment(g);
    int n = kvg_gguf_n_kv(g);
    for (int i = 0; i < n; i++) {
        const char *key = kvg_gguf_key(g, i);
        acc += (uint64_t)kvg_gguf_kv_type(g, i) + (uint64_t)kvg_gguf_find_key(g, key);
        uint32_t u;
        int64_t l;
        float f;
        bool b;
        kvg_str s;
        if (kvg_gguf_get_u32(g, key, &u)) acc += u;
        if (kvg_gguf_get_i64(g, key, &l)) acc += (uint64_t)l;
        if (kvg_gguf_get_f32(g, key, &f)) acc += (uint64_t)(f == f);
        if (kvg_gguf_get_bool(g, key, &b)) acc += b;
        if (kvg_gguf_get_str(g, key, &s) && s.len) acc += (unsigned char)s.ptr[0] + (unsigned char)s.ptr[s.len - 1];
        kvg_gguf_vtype et;
        uint64_t count;
        if (!kvg_gguf_get_arr(g, key, &et, &count) || count == 0) continue;
        uint64_t last = count - 1;
        if (et == KVG_GGUF_STRING) {
            for (uint64_t k = 0; k < count && k < 64; k++) {
                kvg_str e = kvg_gguf_arr_str(g, key, k);
                if (e.len) acc += (unsigned char)e.ptr[e.len - 1];
            }
            kvg_str e = kvg_gguf_arr_str(g, key, last);
            if (e.len) acc += (unsigned char)e.ptr[0];
        } else if (et == KVG_GGUF_ARRAY) {
            kvg_gguf_vtype it;
            uint64_t ic;
            const void *data;
            if (kvg_gguf_arr_arr(g, key, 0, &it, &ic, &data)) acc += ic;
            if (kvg_gguf_arr_arr(g, key, last, &it, &ic, &data)) acc += ic;
        } else {
            const unsigned char *d = kvg_gguf_arr_data(g, key);
            if (d) acc += d[0];
        }
    }
    int nt = kvg_gguf_n_tensors(g);
    for (int i = 0; i < nt; i++) {
        const kvg_tensor *t = kvg_gguf_tensor(g, i);
        acc += t->type + t->n_elements + (uint64_t)(kvg_gguf_find_tensor(g, t->name) != NULL);
        if (t->nbytes) acc += ((const unsigned char *)t->data)[0] + ((const unsigned char *)t->data)[t->nbytes - 1];
    }
    sink = acc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char path[512];
    if (!path[0]) {
        fuzz_path(path, sizeof path, "input.gguf");
        kvgen_set_logger(quiet, NULL);
    }
    if (!fuzz_write(path, data, size)) return 0;
    kvg_gguf *g = NULL;
    kvgen_error err = {0};
    if (kvg_gguf_open(path, &g, &err) != KVGEN_OK) return 0;
    walk(g);
    kvg_gguf_close(g);
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 1, .kv_pool_tokens = 64};
    kvgen_model *m = NULL;
    if (kvgen_model_load(&md, &m, &err) == KVGEN_OK) {
        /* the vocabulary it built: a round trip through the tokenizer */
        int32_t toks[64];
        size_t nt = 0;
        if (kvgen_tokenize(m, "Hello, world! <|im_start|>", 26, KVGEN_TOKENIZE_SPECIAL, toks, 64, &nt, &err) == KVGEN_OK) {
            char buf[256];
            kvgen_detokenize(m, toks, nt, KVGEN_TOKENIZE_SPECIAL, buf, sizeof buf);
        }
        kvgen_model_unload(m);
    }
    return 0;
}
