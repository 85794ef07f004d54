/* test_model.c: kvg_weights_describe on the default model and on kvgen-mkmodel outputs of several
 * shapes and types, and its refusals (architecture, missing tensor, bad shape, unsupported type,
 * inconsistent hyperparameters), each with a message that names the file and the problem. */
#include <math.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_quant.h"
#include "testutil.h"

static void test_default_model(void) {
    const char *path = tu_model_path();
    if (!path) {
        printf("default model absent: skipping its checks\n");
        return;
    }
    kvg_gguf *g = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvg_gguf_open(path, &g, &err));
    if (!g) return;
    kvg_weights w;
    kvgen_status st = kvg_weights_describe(g, &w, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    if (st == KVGEN_OK) {
        const kvg_hparams *hp = &w.hp;
        CHECK(hp->n_layer == 30 && hp->n_embd == 576 && hp->n_ff == 1536);
        CHECK(hp->n_head == 9 && hp->n_head_kv == 3 && hp->head_dim == 64 && hp->n_rot == 64);
        CHECK(hp->n_vocab == 49152 && hp->n_ctx_train == 8192);
        CHECK(hp->rope_freq_base == 100000.0f && fabsf(hp->rms_norm_eps - 1e-5f) < 1e-9f);
        CHECK(w.tied && w.output == w.tok_embd && w.tok_embd->type == KVG_TYPE_Q8_0);
        CHECK(w.output_norm->type == KVG_TYPE_F32);
        CHECK(w.layers[0].wq->type == KVG_TYPE_Q4_1 && w.layers[0].wq->ne[1] == 576);
        CHECK(w.layers[29].wk->ne[0] == 576 && w.layers[29].wk->ne[1] == 192);
        CHECK(w.layers[29].w_down->ne[0] == 1536 && w.layers[29].w_down->ne[1] == 576);
        CHECK(strcmp(w.layers[17].ffn_norm->name, "blk.17.ffn_norm.weight") == 0);
        kvg_weights_free(&w);
        CHECK(w.layers == NULL);
    }
    kvg_gguf_close(g);
}

/* describes a file; returns the status and leaves the message in err */
static kvgen_status describe(const char *path, kvg_weights *w, kvgen_error *err) {
    kvg_gguf *g = NULL;
    kvgen_status st = kvg_gguf_open(path, &g, err);
    if (st) return st;
    st = kvg_weights_describe(g, w, err);
    kvg_weights_free(w);
    kvg_gguf_close(g);
    return st;
}

typedef struct shape_case {
    const char *name, *args;
    int layers, embd, ff, heads, kv_heads, vocab;
    uint32_t type, embd_type;
    bool tied;
} shape_case;

static void test_generated_shapes(void) {
    const shape_case cases[] = {
        {"m-default.gguf", "--seed 3", 2, 64, 128, 4, 4, 0, KVG_TYPE_F32, KVG_TYPE_F32, true},
        {"m-gqa.gguf", "--heads 8 --kv-heads 2 --embd 128 --ff 256 --type Q4_0 --untied", 2, 128, 256, 8, 2, 0,
         KVG_TYPE_Q4_0, KVG_TYPE_Q4_0, false},
        {"m-odd.gguf", "--embd 30 --heads 3 --ff 50 --layers 1 --type F32 --vocab-size 301", 1, 30, 50, 3, 3, 301,
         KVG_TYPE_F32, KVG_TYPE_F32, true},
        {"m-odd-f16.gguf", "--embd 42 --heads 3 --kv-heads 1 --ff 22 --layers 3 --type F16", 3, 42, 22, 3, 1, 0,
         KVG_TYPE_F16, KVG_TYPE_F16, true},
        {"m-q8.gguf", "--embd 64 --heads 2 --ff 96 --type Q8_0 --embd-type F16 --untied", 2, 64, 96, 2, 2, 0,
         KVG_TYPE_Q8_0, KVG_TYPE_F16, false},
        {"m-q41.gguf", "--embd 96 --heads 6 --kv-heads 3 --ff 160 --type Q4_1 --embd-type Q8_0", 2, 96, 160, 6, 3, 0,
         KVG_TYPE_Q4_1, KVG_TYPE_Q8_0, true},
        {"m-bf16.gguf", "--type BF16 --layers 1 --rope-base 500000 --ctx 77", 1, 64, 128, 4, 4, 0, KVG_TYPE_BF16,
         KVG_TYPE_BF16, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const shape_case *c = &cases[i];
        char *path = tu_make_model(c->name, c->args);
        CHECKF(path != NULL, "mkmodel %s", c->args);
        if (!path) continue;
        kvg_gguf *g = NULL;
        kvgen_error err = {0};
        CHECK_OK(kvg_gguf_open(path, &g, &err));
        kvg_weights w;
        kvgen_status st = g ? kvg_weights_describe(g, &w, &err) : KVGEN_E_IO;
        CHECKF(st == KVGEN_OK, "%s: %s", c->args, err.message);
        if (st == KVGEN_OK) {
            const kvg_hparams *hp = &w.hp;
            int hd = c->embd / c->heads;
            CHECKF(hp->n_layer == c->layers && hp->n_embd == c->embd && hp->n_ff == c->ff, "%s", c->args);
            CHECKF(hp->n_head == c->heads && hp->n_head_kv == c->kv_heads && hp->head_dim == hd && hp->n_rot == hd,
                   "%s", c->args);
            CHECKF(c->vocab == 0 || hp->n_vocab == c->vocab, "%s: vocab %d", c->args, hp->n_vocab);
            CHECKF(hp->n_vocab >= 256 + 3, "%s: vocab %d", c->args, hp->n_vocab);
            CHECKF(w.tied == c->tied && (w.output == w.tok_embd) == c->tied, "%s", c->args);
            CHECKF(w.tok_embd->type == c->embd_type && w.output->type == c->embd_type, "%s", c->args);
            CHECKF(w.layers[0].wq->type == c->type && w.layers[c->layers - 1].w_down->type == c->type, "%s", c->args);
            CHECKF(w.layers[0].wk->ne[1] == (uint64_t)(c->kv_heads * hd), "%s", c->args);
            CHECKF(w.layers[0].attn_norm->type == KVG_TYPE_F32, "%s", c->args);
            if (strstr(c->args, "--rope-base")) CHECK(hp->rope_freq_base == 500000.0f && hp->n_ctx_train == 77);
            else CHECK(hp->rope_freq_base == 10000.0f && hp->n_ctx_train == 512);

            /* the weights are well scaled: finite, std 0.02 to 0.08, norms near 1 */
            const kvg_tensor *t = w.layers[0].wq;
            float *row = malloc((size_t)t->ne[0] * sizeof *row);
            double sum = 0, sq = 0;
            size_t rb = kvg_row_bytes(t->type, t->ne[0]);
            for (uint64_t r = 0; r < t->ne[1]; r++) {
                kvg_dequantize_row(t->type, (const uint8_t *)t->data + r * rb, row, t->ne[0]);
                for (uint64_t j = 0; j < t->ne[0]; j++) sum += row[j], sq += (double)row[j] * row[j];
            }
            double cnt = (double)t->n_elements, mean = sum / cnt, sd = sqrt(sq / cnt - mean * mean);
            CHECKF(isfinite(sd) && sd > 0.015 && sd < 0.09 && fabs(mean) < 0.02, "%s: wq mean %g std %g", c->args,
                   mean, sd);
            const float *norm = w.output_norm->data;
            float lo = norm[0], hi = norm[0];
            for (int j = 0; j < c->embd; j++) lo = fminf(lo, norm[j]), hi = fmaxf(hi, norm[j]);
            CHECKF(lo > 0.7f && hi < 1.3f && hi > lo, "%s: norm range %g..%g", c->args, lo, hi);
            free(row);
            kvg_weights_free(&w);
        }
        kvg_gguf_close(g);
        free(path);
    }

    /* the same seed gives the same bytes; another seed different weights */
    char *a = tu_make_model("m-seed-a.gguf", "--seed 7"), *b = tu_make_model("m-seed-b.gguf", "--seed 7"),
         *c = tu_make_model("m-seed-c.gguf", "--seed 8");
    size_t na = 0, nb = 0, nc = 0;
    char *da = a ? tu_read_file(a, &na) : NULL, *db = b ? tu_read_file(b, &nb) : NULL,
         *dc = c ? tu_read_file(c, &nc) : NULL;
    CHECK(da && db && dc && na == nb && na == nc);
    CHECK(da && db && memcmp(da, db, na) == 0);
    CHECK(da && dc && na == nc && memcmp(da, dc, na) != 0);
    free(da), free(db), free(dc), free(a), free(b), free(c);

    /* sizes a block type cannot hold are refused by the generator */
    char *bad = tu_make_model("m-bad.gguf", "--embd 30 --heads 3 --type Q8_0 2>/dev/null");
    CHECK(bad == NULL);
    free(bad);
}

static void test_vocab_copy(void) {
    char *vocab = tu_testdata("tokenizer/ggml-vocab-gpt-2.gguf");
    FILE *f = fopen(vocab, "rb");
    if (!f) {
        printf("gpt-2 vocab absent: skipping --vocab\n");
        free(vocab);
        return;
    }
    fclose(f);
    char args[1024];
    snprintf(args, sizeof args, "--layers 1 --embd 32 --heads 2 --ff 64 --vocab %s", vocab);
    char *path = tu_make_model("m-vocab.gguf", args);
    CHECK(path != NULL);
    if (path) {
        kvg_gguf *g = NULL, *src = NULL;
        kvgen_error err = {0};
        CHECK_OK(kvg_gguf_open(path, &g, &err));
        CHECK_OK(kvg_gguf_open(vocab, &src, &err));
        kvg_weights w;
        if (g && src) {
            CHECK_OK(kvg_weights_describe(g, &w, &err));
            CHECK(w.hp.n_vocab == 50257 && w.tok_embd->ne[1] == 50257);
            kvg_weights_free(&w);
            kvg_str s1, s2;
            CHECK(kvg_gguf_get_str(g, "tokenizer.ggml.model", &s1) && s1.len == 4 && memcmp(s1.ptr, "gpt2", 4) == 0);
            int copied = 0;
            for (int i = 0; i < kvg_gguf_n_kv(src); i++)
                if (strncmp(kvg_gguf_key(src, i), "tokenizer.", 10) == 0) {
                    copied++;
                    CHECKF(kvg_gguf_find_key(g, kvg_gguf_key(src, i)) >= 0, "missing %s", kvg_gguf_key(src, i));
                }
            CHECK(copied >= 3);
            s1 = kvg_gguf_arr_str(g, "tokenizer.ggml.tokens", 50256);
            s2 = kvg_gguf_arr_str(src, "tokenizer.ggml.tokens", 50256);
            CHECK(s1.len == s2.len && s1.len > 0 && memcmp(s1.ptr, s2.ptr, s1.len) == 0);
        }
        kvg_gguf_close(g);
        kvg_gguf_close(src);
    }
    free(path);
    free(vocab);
}

static void test_synthetic_vocab(void) {
    char *path = tu_make_model("m-synth.gguf", "--layers 1");
    if (!path) {
        CHECK(path != NULL);
        return;
    }
    kvg_gguf *g = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvg_gguf_open(path, &g, &err));
    if (g) {
        kvg_str s;
        CHECK(kvg_gguf_get_str(g, "tokenizer.ggml.model", &s) && s.len == 4 && memcmp(s.ptr, "gpt2", 4) == 0);
        /* "gpt-2", the spelling llama.cpp requires, so the oracle can load generated models */
        CHECK(kvg_gguf_get_str(g, "tokenizer.ggml.pre", &s) && s.len == 5 && memcmp(s.ptr, "gpt-2", 5) == 0);
        kvg_gguf_vtype et;
        uint64_t n = 0, nt = 0;
        CHECK(kvg_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) && et == KVG_GGUF_STRING && n >= 259);
        CHECK(kvg_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &nt) && et == KVG_GGUF_INT32 && nt == n);
        CHECK(kvg_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &nt) && et == KVG_GGUF_STRING && nt > 0);
        /* byte tokens in the GPT-2 mapping: 'A' is itself, space is U+0120 "Ġ", newline U+010A "Ċ" */
        s = kvg_gguf_arr_str(g, "tokenizer.ggml.tokens", 'A');
        CHECK(s.len == 1 && s.ptr[0] == 'A');
        s = kvg_gguf_arr_str(g, "tokenizer.ggml.tokens", ' ');
        CHECK(s.len == 2 && memcmp(s.ptr, "\xc4\xa0", 2) == 0);
        s = kvg_gguf_arr_str(g, "tokenizer.ggml.tokens", '\n');
        CHECK(s.len == 2 && memcmp(s.ptr, "\xc4\x8a", 2) == 0);
        s = kvg_gguf_arr_str(g, "tokenizer.ggml.tokens", 0xad);
        CHECK(s.len == 2 && memcmp(s.ptr, "\xc5\x83", 2) == 0); /* soft hyphen: the 68th remapped byte, U+0143 */
        const int32_t *types = kvg_gguf_arr_data(g, "tokenizer.ggml.token_type");
        uint32_t eos = 0, bos = 0;
        CHECK(kvg_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos) && eos < n);
        CHECK(kvg_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos) && bos < n);
        s = kvg_gguf_arr_str(g, "tokenizer.ggml.tokens", eos);
        CHECK(s.len == 10 && memcmp(s.ptr, "<|im_end|>", 10) == 0);
        int controls = 0;
        for (uint64_t i = 0; types && i < n; i++) {
            int32_t ty;
            memcpy(&ty, types + i, 4);
            if (ty == 3) {
                controls++;
                s = kvg_gguf_arr_str(g, "tokenizer.ggml.tokens", i);
                CHECK(s.len > 4 && s.ptr[0] == '<' && s.ptr[1] == '|');
            }
        }
        CHECK(controls == 3);
        kvg_gguf_close(g);
    }
    free(path);
}

/* rewrites a model: every key and tensor copied, except that `edit` may change them */
typedef struct edit {
    const char *arch;           /* new general.architecture */
    const char *drop_tensor;    /* leave this tensor out */
    const char *retype_tensor;  /* replace this tensor by zeros of retype */
    uint32_t retype;
    const char *reshape_tensor; /* swap this tensor's two dimensions */
    const char *set_key;        /* set this u32 key to set_value */
    uint32_t set_value;
    const char *drop_key;
} edit;

static void edit_keys(kvg_gguf_writer *w, const kvg_gguf *src, const void *ctx) {
    const edit *e = ctx;
    for (int i = 0; i < kvg_gguf_n_kv(src); i++) {
        const char *key = kvg_gguf_key(src, i);
        if (e->drop_key && strcmp(key, e->drop_key) == 0) continue;
        kvg_gguf_copy_kv(w, src, key);
    }
    if (e->arch) kvg_gguf_set_str(w, "general.architecture", e->arch);
    if (e->set_key) kvg_gguf_set_u32(w, e->set_key, e->set_value);
}

static void edit_tensor(kvg_gguf_writer *w, const kvg_tensor *t, const void *ctx) {
    const edit *e = ctx;
    if (e->drop_tensor && strcmp(t->name, e->drop_tensor) == 0) return;
    if (e->retype_tensor && strcmp(t->name, e->retype_tensor) == 0) {
        size_t nb = kvg_row_bytes(e->retype, t->n_elements);
        void *z = calloc(1, nb);
        kvg_gguf_add_tensor(w, t->name, e->retype, t->n_dims, t->ne, z, nb);
        free(z);
    } else if (e->reshape_tensor && strcmp(t->name, e->reshape_tensor) == 0) {
        uint64_t ne[2] = {t->ne[1], t->ne[0]};
        kvg_gguf_add_tensor(w, t->name, t->type, 2, ne, t->data, t->nbytes);
    } else {
        kvg_gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->nbytes);
    }
}

static char *rewrite(const char *src_path, const char *name, const edit *e) {
    return tu_gguf_rewrite(src_path, name, &(tu_gguf_edit){.keys = edit_keys, .tensor = edit_tensor, .ctx = e});
}

static void expect_refusal(const char *src, const char *name, const edit *e, kvgen_status want, const char *phrase) {
    char *path = rewrite(src, name, e);
    CHECKF(path != NULL, "%s: could not write", name);
    if (!path) return;
    kvg_weights w;
    kvgen_error err = {0};
    kvgen_status st = describe(path, &w, &err);
    CHECKF(st == want, "%s: status %s, want %s (%s)", name, kvgen_status_name(st), kvgen_status_name(want),
           err.message);
    CHECKF(st == KVGEN_OK || strstr(err.message, path) != NULL, "%s: message does not name the file: %s", name,
           err.message);
    CHECKF(!phrase || strstr(err.message, phrase) != NULL, "%s: message lacks '%s': %s", name, phrase, err.message);
    free(path);
}

static void test_refusals(void) {
    /* 256-wide rows so an IQ2_XXS tensor (256-element blocks) can stand in for a matrix */
    char *src = tu_make_model("m-src.gguf", "--layers 2 --embd 256 --heads 4 --kv-heads 2 --ff 256 --type Q8_0");
    CHECK(src != NULL);
    if (!src) return;
    expect_refusal(src, "r-same.gguf", &(edit){0}, KVGEN_OK, NULL);
    expect_refusal(src, "r-arch.gguf", &(edit){.arch = "gpt2"}, KVGEN_E_UNSUPPORTED,
                   "architecture 'gpt2' is not supported (kvgen runs: llama, qwen2, qwen3, gemma2, gemma3, phi3, bert)");
    expect_refusal(src, "r-no-arch.gguf", &(edit){.drop_key = "general.architecture"}, KVGEN_E_FORMAT,
                   "general.architecture");
    expect_refusal(src, "r-missing.gguf", &(edit){.drop_tensor = "blk.1.ffn_up.weight"}, KVGEN_E_FORMAT,
                   "missing tensor blk.1.ffn_up.weight");
    expect_refusal(src, "r-missing-embd.gguf", &(edit){.drop_tensor = "token_embd.weight"}, KVGEN_E_FORMAT,
                   "token_embd.weight");
    expect_refusal(src, "r-iq2xxs.gguf", &(edit){.retype_tensor = "blk.0.attn_q.weight", .retype = 16},
                   KVGEN_E_UNSUPPORTED, "blk.0.attn_q.weight has type IQ2_XXS");
    /* a K type is a row of the traits table: described like any other */
    expect_refusal(src, "r-q6k.gguf", &(edit){.retype_tensor = "blk.0.attn_q.weight", .retype = KVG_TYPE_Q6_K},
                   KVGEN_OK, NULL);
    expect_refusal(src, "r-norm-f16.gguf", &(edit){.retype_tensor = "blk.0.ffn_norm.weight", .retype = KVG_TYPE_F16},
                   KVGEN_E_UNSUPPORTED, "blk.0.ffn_norm.weight");
    expect_refusal(src, "r-shape.gguf", &(edit){.reshape_tensor = "blk.1.attn_k.weight"}, KVGEN_E_FORMAT,
                   "blk.1.attn_k.weight has shape [128, 256], expected [256, 128]");
    expect_refusal(src, "r-heads0.gguf", &(edit){.set_key = "llama.attention.head_count", .set_value = 0},
                   KVGEN_E_FORMAT, "llama.attention.head_count");
    expect_refusal(src, "r-kv-heads.gguf", &(edit){.set_key = "llama.attention.head_count_kv", .set_value = 3},
                   KVGEN_E_FORMAT, "not a multiple of head_count_kv 3");
    expect_refusal(src, "r-heads.gguf", &(edit){.set_key = "llama.attention.head_count", .set_value = 3},
                   KVGEN_E_FORMAT, "not a multiple of head_count 3");
    expect_refusal(src, "r-layers.gguf", &(edit){.set_key = "llama.block_count", .set_value = 3}, KVGEN_E_FORMAT,
                   "missing tensor blk.2.attn_norm.weight");
    expect_refusal(src, "r-no-layers.gguf", &(edit){.drop_key = "llama.block_count"}, KVGEN_E_FORMAT,
                   "llama.block_count");
    expect_refusal(src, "r-rot.gguf", &(edit){.set_key = "llama.rope.dimension_count", .set_value = 65},
                   KVGEN_E_FORMAT, "rope.dimension_count");
    /* head_count_kv defaults to head_count (4): the [256, 128] K/V matrices no longer fit */
    expect_refusal(src, "r-kv-default.gguf", &(edit){.drop_key = "llama.attention.head_count_kv"}, KVGEN_E_FORMAT,
                   "blk.0.attn_k.weight has shape");

    /* the vocabulary size falls back to the tokenizer's token count */
    char *p = rewrite(src, "r-no-vocab-size.gguf", &(edit){.drop_key = "llama.vocab_size"});
    CHECK(p != NULL);
    if (p) {
        kvg_gguf *g = NULL;
        kvgen_error err = {0};
        CHECK_OK(kvg_gguf_open(p, &g, &err));
        kvg_weights w;
        if (g) {
            CHECK_OK(kvg_weights_describe(g, &w, &err));
            CHECK(w.hp.n_vocab == (int)w.tok_embd->ne[1] && w.hp.n_vocab >= 259);
            CHECK(w.hp.rms_norm_eps > 0.0f && w.hp.n_head_kv == 2);
            kvg_weights_free(&w);
            kvg_gguf_close(g);
        }
        free(p);
    }
    free(src);
}

int main(void) {
    test_default_model();
    test_generated_shapes();
    test_vocab_copy();
    test_synthetic_vocab();
    test_refusals();
    return tu_finish("test_model");
}
