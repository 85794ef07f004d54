/* test_api.c: the model and session calls of kvgen.h: argument errors, context limits, the
 * cache's shape, reset, sampling determinism, reference counting; and, on the default model,
 * two greedy generations whose answers are known. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <string.h>
#include "testutil.h"

static int contains(const char *s, const char *what) { return s && strstr(s, what) != NULL; }

static void test_load_errors(const char *path) {
    kvgen_error err = {0};
    kvgen_model *m = (kvgen_model *)&err; /* must be cleared on failure */
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE};
    CHECK(kvgen_model_load(NULL, &m, &err) == KVGEN_E_INVALID_ARGUMENT && m == NULL);
    CHECK(contains(err.message, "desc"));
    CHECK(kvgen_model_load(&md, NULL, &err) == KVGEN_E_INVALID_ARGUMENT);
    kvgen_model_desc empty = {0};
    CHECK(kvgen_model_load(&empty, &m, &err) == KVGEN_E_INVALID_ARGUMENT && contains(err.message, "path"));
    kvgen_model_desc bad_backend = {.path = path, .backend = (kvgen_backend)7};
    CHECK(kvgen_model_load(&bad_backend, &m, &err) == KVGEN_E_INVALID_ARGUMENT && contains(err.message, "backend"));
    kvgen_model_desc bad_threads = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = -1};
    CHECK(kvgen_model_load(&bad_threads, &m, &err) == KVGEN_E_INVALID_ARGUMENT);
    kvgen_model_desc bad_bits = {.path = path, .backend = KVGEN_BACKEND_CPU, .activation_bits = 4};
    CHECK(kvgen_model_load(&bad_bits, &m, &err) == KVGEN_E_INVALID_ARGUMENT &&
          contains(err.message, "desc.activation_bits 4"));
    kvgen_model_desc missing = {.path = "/nonexistent/kvgen-model.gguf", .backend = KVGEN_BACKEND_REFERENCE};
    kvgen_status st = kvgen_model_load(&missing, &m, &err);
    CHECKF(st == KVGEN_E_IO && contains(err.message, "/nonexistent/kvgen-model.gguf"), "%s: %s",
           kvgen_status_name(st), err.message);
    /* a bad KVGEN_BACKEND is reported, not silently ignored */
    setenv("KVGEN_BACKEND", "quantum", 1);
    kvgen_model_desc dflt = {.path = path};
    CHECK(kvgen_model_load(&dflt, &m, &err) == KVGEN_E_INVALID_ARGUMENT && contains(err.message, "quantum"));
    setenv("KVGEN_BACKEND", "reference", 1);
    CHECK_OK(kvgen_model_load(&dflt, &m, &err));
    if (m) {
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        CHECK(strcmp(info.backend, "reference") == 0 && strcmp(info.device, "cpu") == 0);
        kvgen_model_unload(m);
    }
    unsetenv("KVGEN_BACKEND");
    kvgen_model_unload(NULL);
    kvgen_session_close(NULL);
}

static void test_info(kvgen_model *m) {
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    CHECK(strcmp(info.architecture, "llama") == 0);
    CHECK(info.n_layer == 2 && info.n_embd == 64 && info.n_head == 4 && info.n_head_kv == 2);
    CHECK(info.head_dim == 16 && info.n_params > 0 && info.weight_bytes > 0);
    size_t need = kvgen_model_describe(m, NULL, 0);
    CHECK(need > 100);
    char *full = malloc(need + 1);
    CHECK(kvgen_model_describe(m, full, need + 1) == need && strlen(full) == need);
    CHECK(contains(full, "llama") && contains(full, "Q4_1") && contains(full, "layers:"));
    char small[16];
    CHECK(kvgen_model_describe(m, small, sizeof small) == need && strlen(small) == sizeof small - 1);
    CHECK(strncmp(small, full, sizeof small - 1) == 0);
    free(full);
    kvgen_model_get_info(NULL, &info);
    CHECK(info.name == NULL && info.n_layer == 0);
}

static void test_session_errors(kvgen_model *m, int n_vocab) {
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    CHECK(kvgen_session_create(NULL, NULL, &s, &err) == KVGEN_E_INVALID_ARGUMENT && contains(err.message, "model"));
    CHECK(kvgen_session_create(m, NULL, NULL, &err) == KVGEN_E_INVALID_ARGUMENT);
    kvgen_session_desc neg = {.n_ctx = -5};
    CHECK(kvgen_session_create(m, &neg, &s, &err) == KVGEN_E_INVALID_ARGUMENT && s == NULL);
    CHECK(contains(err.message, "n_ctx"));
    kvgen_session_desc bad_k = {.top_k = -1};
    CHECK(kvgen_session_create(m, &bad_k, &s, &err) == KVGEN_E_INVALID_ARGUMENT);
    kvgen_session_desc bad_p = {.top_p = NAN};
    CHECK(kvgen_session_create(m, &bad_p, &s, &err) == KVGEN_E_INVALID_ARGUMENT);

    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    if (!s) return;
    int32_t ok[2] = {1, 2};
    CHECK(kvgen_session_prefill(NULL, ok, 2, NULL, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_session_prefill(s, NULL, 2, NULL, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_session_decode(NULL, 1, &err) == KVGEN_E_INVALID_ARGUMENT);
    int32_t bad[3] = {1, n_vocab, 2};
    CHECK(kvgen_session_prefill(s, bad, 3, NULL, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECKF(contains(err.message, "outside the vocabulary"), "%s", err.message);
    CHECK(kvgen_session_decode(s, -1, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_session_decode(s, 5, NULL) == KVGEN_OK); /* err may be NULL */
    CHECK(kvgen_session_decode(s, -7, NULL) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_session_length(s) == 1 && kvgen_session_tokens(s)[0] == 5);
    float out[4];
    CHECK(kvgen_session_read_cache(s, -1, 0, out, 4, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_session_read_cache(s, 0, 2, out, 4, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_session_read_cache(s, 0, 0, out, 4, &err) == KVGEN_E_INVALID_ARGUMENT); /* needs 2*1*16 */
    CHECK(contains(err.message, "needs 32"));
    CHECK(kvgen_session_read_cache(NULL, 0, 0, out, 4, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_session_logits(NULL) == NULL && kvgen_session_sample(NULL) == -1 && kvgen_session_length(NULL) == 0);
    kvgen_session_close(s);
}

static void test_context_full(kvgen_model *m, int n_vocab) {
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {.n_ctx = 8};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    if (!s) return;
    int32_t toks[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    CHECK_OK(kvgen_session_prefill(s, toks, 6, NULL, &err));
    float *before = malloc((size_t)n_vocab * sizeof(float));
    memcpy(before, kvgen_session_logits(s), (size_t)n_vocab * sizeof(float));
    CHECK(kvgen_session_prefill(s, toks, 3, NULL, &err) == KVGEN_E_CONTEXT_FULL);
    CHECKF(contains(err.message, "context full (6/8)"), "%s", err.message);
    CHECK(err.status == KVGEN_E_CONTEXT_FULL);
    CHECK(kvgen_session_length(s) == 6 && memcmp(kvgen_session_logits(s), before, (size_t)n_vocab * 4) == 0);
    CHECK_OK(kvgen_session_decode(s, 7, &err));
    CHECK_OK(kvgen_session_decode(s, 8, &err));
    CHECK(kvgen_session_decode(s, 9, &err) == KVGEN_E_CONTEXT_FULL && kvgen_session_length(s) == 8);
    /* the first 8 tokens at once give the same logits as the session that hit the wall */
    kvgen_session *t = NULL;
    CHECK_OK(kvgen_session_create(m, &sd, &t, &err));
    if (t) {
        CHECK_OK(kvgen_session_prefill(t, toks, 8, NULL, &err));
        const float *a = kvgen_session_logits(s), *b = kvgen_session_logits(t);
        double d = 0;
        for (int i = 0; a && b && i < n_vocab; i++) d = fmax(d, fabs((double)a[i] - b[i]));
        CHECKF(a && b && d < 1e-4, "logits after a refused append differ by %g", d);
    }
    kvgen_cache_info ci;
    kvgen_session_cache_info(s, &ci);
    CHECK(ci.capacity == 8 && ci.length == 8);
    free(before);
    kvgen_session_close(t);
    kvgen_session_close(s);
}

static void test_cache(kvgen_model *m) {
    kvgen_error err = {0};
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    kvgen_session *a = NULL, *b = NULL;
    kvgen_session_desc sd = {.n_ctx = 32};
    CHECK_OK(kvgen_session_create(m, &sd, &a, &err));
    CHECK_OK(kvgen_session_create(m, &sd, &b, &err));
    if (!a || !b) return;
    kvgen_cache_info ci;
    kvgen_session_cache_info(a, &ci);
    size_t per_token = 2 * (size_t)info.n_layer * (size_t)info.n_head_kv * (size_t)info.head_dim * sizeof(float);
    CHECK(ci.n_layer == info.n_layer && ci.n_head_kv == info.n_head_kv && ci.head_dim == info.head_dim);
    CHECK(ci.length == 0 && ci.capacity == 32 && ci.bytes == 0 && ci.bytes_per_token == per_token);

    int32_t toks[5] = {3, 1, 4, 1, 5};
    CHECK_OK(kvgen_session_prefill(a, toks, 5, NULL, &err));
    CHECK_OK(kvgen_session_prefill(b, toks, 3, NULL, &err));
    kvgen_session_cache_info(a, &ci);
    CHECK(ci.length == 5 && ci.bytes == 5 * per_token);

    /* (kv_heads, length, head_dim): the first 3 positions of every head match the session that
     * holds only those 3 tokens; any other layout would misalign them */
    int H = info.n_head_kv, hd = info.head_dim;
    float *ka = malloc((size_t)H * 5 * hd * sizeof(float)), *kb = malloc((size_t)H * 3 * hd * sizeof(float));
    for (int layer = 0; layer < info.n_layer; layer++)
        for (int which = 0; which < 2; which++) {
            CHECK_OK(kvgen_session_read_cache(a, layer, which, ka, (size_t)H * 5 * hd, &err));
            CHECK_OK(kvgen_session_read_cache(b, layer, which, kb, (size_t)H * 3 * hd, &err));
            int same = 1, nonzero = 0;
            for (int h = 0; h < H; h++)
                for (int p = 0; p < 3; p++)
                    for (int i = 0; i < hd; i++) {
                        float x = ka[((size_t)h * 5 + p) * hd + i], y = kb[((size_t)h * 3 + p) * hd + i];
                        same &= fabsf(x - y) <= 1e-5f;
                        nonzero |= x != 0.0f;
                    }
            CHECKF(same && nonzero, "layer %d %s: cache prefix differs or is empty", layer, which ? "V" : "K");
        }
    /* V of position 1 and position 3 (both token 1) differ only through their inputs at layer 0,
     * which are the same embedding: V carries no position, K does (RoPE) */
    CHECK_OK(kvgen_session_read_cache(a, 0, 1, ka, (size_t)H * 5 * hd, &err));
    CHECK(memcmp(ka + 1 * hd, ka + 3 * hd, (size_t)hd * sizeof(float)) == 0);
    CHECK_OK(kvgen_session_read_cache(a, 0, 0, ka, (size_t)H * 5 * hd, &err));
    CHECK(memcmp(ka + 1 * hd, ka + 3 * hd, (size_t)hd * sizeof(float)) != 0);

    /* reset: empty, no logits, and the same tokens give the same logits again */
    size_t V = (size_t)info.n_vocab;
    float *first = malloc(V * sizeof(float));
    memcpy(first, kvgen_session_logits(a), V * sizeof(float));
    kvgen_session_reset(a);
    CHECK(kvgen_session_length(a) == 0 && kvgen_session_logits(a) == NULL && kvgen_session_sample(a) == -1);
    kvgen_session_cache_info(a, &ci);
    CHECK(ci.length == 0 && ci.bytes == 0);
    CHECK_OK(kvgen_session_read_cache(a, 0, 0, NULL, 0, &err)); /* nothing to copy */
    CHECK_OK(kvgen_session_prefill(a, toks, 5, NULL, &err));
    CHECK(kvgen_session_logits(a) && memcmp(first, kvgen_session_logits(a), V * sizeof(float)) == 0);
    free(first);
    free(ka);
    free(kb);
    kvgen_session_close(a);
    kvgen_session_close(b);
}

static void sample_run(kvgen_model *m, const kvgen_session_desc *sd, int32_t *out, int n, int reset_midway) {
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(m, sd, &s, &err));
    if (!s) return;
    int32_t t = 1;
    for (int i = 0; i < n; i++) {
        if (reset_midway && i == n / 2) {
            kvgen_session_reset(s);
            t = 1;
        }
        CHECK_OK(kvgen_session_decode(s, t, &err));
        t = out[i] = kvgen_session_sample(s);
    }
    kvgen_session_close(s);
}

static void test_sampling(kvgen_model *m) {
    enum { N = 12 };
    kvgen_session_desc greedy = {.n_ctx = 64};
    kvgen_session_desc warm = {.n_ctx = 64, .seed = 1234, .temperature = 1.5f, .top_k = 50, .top_p = 0.95f};
    kvgen_session_desc other = warm;
    other.seed = 99;
    int32_t a[N], b[N], c[N], g[N], r[N];
    sample_run(m, &warm, a, N, 0);
    sample_run(m, &warm, b, N, 0);
    sample_run(m, &other, c, N, 0);
    sample_run(m, &greedy, g, N, 0);
    CHECK(memcmp(a, b, sizeof a) == 0);          /* same seed, same tokens */
    CHECK(memcmp(a, c, sizeof a) != 0);          /* another seed, other tokens (12 draws at T = 1.5) */
    /* reset re-seeds: the second half replays the first */
    sample_run(m, &warm, r, N, 1);
    CHECK(memcmp(r, r + N / 2, (N / 2) * sizeof(int32_t)) == 0 && memcmp(r, a, (N / 2) * sizeof(int32_t)) == 0);

    /* greedy picks the arg max */
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(m, &greedy, &s, &err));
    if (s) {
        CHECK(kvgen_session_sample(s) == -1);
        CHECK_OK(kvgen_session_decode(s, 1, &err));
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        const float *l = kvgen_session_logits(s);
        int best = 0;
        for (int i = 1; i < info.n_vocab; i++)
            if (l[i] > l[best]) best = i;
        CHECK(kvgen_session_sample(s) == best && g[0] == best);
        /* top_k = 1 is greedy too, whatever the temperature */
        kvgen_session *k1 = NULL;
        kvgen_session_desc one = {.n_ctx = 8, .temperature = 5.0f, .top_k = 1, .seed = 7};
        CHECK_OK(kvgen_session_create(m, &one, &k1, &err));
        if (k1) {
            CHECK_OK(kvgen_session_decode(k1, 1, &err));
            for (int i = 0; i < 5; i++) CHECK(kvgen_session_sample(k1) == best);
        }
        kvgen_session_close(k1);
    }
    kvgen_session_close(s);
}

static void test_refcount(const char *path) {
    kvgen_error err = {0};
    kvgen_model *m = NULL;
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 2};
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    if (!m) return;
    kvgen_session *s1 = NULL, *s2 = NULL;
    CHECK_OK(kvgen_session_create(m, NULL, &s1, &err));
    CHECK_OK(kvgen_session_create(m, NULL, &s2, &err));
    kvgen_model_unload(m); /* the sessions keep it alive */
    int32_t t[3] = {4, 5, 6};
    CHECK_OK(kvgen_session_prefill(s1, t, 3, NULL, &err));
    kvgen_session_close(s1);
    CHECK_OK(kvgen_session_prefill(s2, t, 3, NULL, &err)); /* still alive: s2 holds it */
    CHECK(kvgen_session_sample(s2) >= 0);
    kvgen_session_close(s2); /* frees the model (ASan would report a leak or a use after free) */
}

/* Greedy generation of up to n tokens; returns the text (malloc'd) and the stop token. */
static char *generate(kvgen_model *m, const char *prompt, unsigned flags, int n, int32_t *stop) {
    kvgen_error err = {0};
    int32_t ids[256];
    size_t n_ids = 0;
    *stop = -1;
    CHECK_OK(kvgen_tokenize(m, prompt, strlen(prompt), flags | KVGEN_TOKENIZE_ADD_BOS, ids, 256, &n_ids, &err));
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {0};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    char *text = calloc(1, 4096);
    size_t len = 0;
    if (!s || n_ids == 0) return text;
    CHECK_OK(kvgen_session_prefill(s, ids, n_ids, NULL, &err));
    kvgen_detok d;
    kvgen_detok_init(&d);
    for (int i = 0; i < n; i++) {
        int32_t t = kvgen_session_sample(s);
        if (kvgen_token_is_eog(m, t)) {
            *stop = t;
            break;
        }
        char piece[256];
        size_t k = kvgen_detok_push(m, &d, t, 0, piece, sizeof piece);
        if (len + k < 4000) {
            memcpy(text + len, piece, k);
            len += k;
        }
        CHECK_OK(kvgen_session_decode(s, t, &err));
    }
    kvgen_session_close(s);
    return text;
}

static void test_default_model(void) {
    const char *path = tu_model_path();
    if (!path) {
        printf("note: default model absent, its checks were skipped (run scripts/setup.sh)\n");
        return;
    }
    kvgen_error err = {0};
    kvgen_model *m = NULL;
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE};
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    if (!m) {
        fprintf(stderr, "%s\n", err.message);
        return;
    }
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    CHECK(info.n_layer == 30 && info.n_embd == 576 && info.n_head == 9 && info.n_head_kv == 3 && info.tied_embeddings);
    CHECK(info.n_vocab == 49152 && info.n_ctx_train > 0);
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    kvgen_cache_info ci;
    kvgen_session_cache_info(s, &ci);
    int want_ctx = info.n_ctx_train < 4096 ? info.n_ctx_train : 4096;
    CHECK(ci.capacity == (size_t)want_ctx && ci.bytes_per_token == 2 * 30 * 3 * 64 * sizeof(float));
    kvgen_session_close(s);

    int32_t stop;
    char *text = generate(m, "The capital of France is", 0, 16, &stop);
    printf("\"The capital of France is\" ->%s\n", text);
    CHECKF(contains(text, "Paris"), "greedy continuation lacks Paris: %s", text);
    free(text);

    const char *chat = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    text = generate(m, chat, KVGEN_TOKENIZE_SPECIAL, 64, &stop);
    printf("chat reply: %s [stop %d]\n", text, (int)stop);
    CHECKF(stop == 2, "the reply did not end with <|im_end|> within 64 tokens (stop %d)", (int)stop);
    CHECK(kvgen_token_find(m, "<|im_end|>") == 2);
    CHECK(contains(text, "Paris"));
    free(text);
    kvgen_model_unload(m);
}

int main(void) {
    char *path = tu_make_model("api_gqa.gguf", "--seed 11 --layers 2 --embd 64 --ff 96 --heads 4 --kv-heads 2 "
                                               "--type Q4_1");
    CHECK(path != NULL);
    if (path) {
        test_load_errors(path);
        kvgen_error err = {0};
        kvgen_model *m = NULL;
        kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 2};
        CHECK_OK(kvgen_model_load(&md, &m, &err));
        if (m) {
            kvgen_model_info info;
            kvgen_model_get_info(m, &info);
            test_info(m);
            test_session_errors(m, info.n_vocab);
            test_context_full(m, info.n_vocab);
            test_cache(m);
            test_sampling(m);
            kvgen_model_unload(m);
        }
        test_refcount(path);
        free(path);
    }
    test_default_model();
    return tu_finish("test_api");
}
