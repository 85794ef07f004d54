/* test_session.c: paged KV sessions on the reference backend. Every operation (fork, rewind,
 * prefix reuse, shift) must leave logits equal to recomputing the same token sequence from
 * scratch; the oracle is a second load of the same file (its own pool, nothing shared) whose
 * sessions run the whole sequence from position 0 without prefix reuse. */
#include <math.h>
#include <string.h>
#include "testutil.h"

static int n_vocab;
static kvgen_model *oracle; /* the same weights, its own pool */

static kvgen_model *load(const char *path, const kvgen_model_desc *extra) {
    kvgen_model_desc md = {0};
    if (extra) md = *extra;
    md.path = path;
    md.backend = KVGEN_BACKEND_REFERENCE;
    md.n_threads = 2;
    return tu_load(&md);
}

static double max_diff(const float *a, const float *b) {
    return (!a || !b) ? INFINITY : tu_max_diff(a, b, n_vocab);
}

/* logits of a fresh oracle session that runs `tokens` from position 0 */
static double diff_to_scratch(const kvgen_session *s, const char *what) {
    kvgen_error err = {0};
    kvgen_session *o = NULL;
    kvgen_session_desc sd = {.n_ctx = 1024, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(oracle, &sd, &o, &err));
    size_t n = kvgen_session_length(s);
    CHECK_OK(kvgen_session_prefill(o, kvgen_session_tokens(s), n, NULL, &err));
    double d = max_diff(kvgen_session_logits(s), kvgen_session_logits(o));
    CHECKF(d <= 1e-5, "%s: logits differ from a recomputation of the %zu tokens by %g", what, n, d);
    kvgen_session_close(o);
    return d;
}

static void test_fork(kvgen_model *m) {
    kvgen_error err = {0};
    kvgen_session *p = NULL, *c = NULL;
    kvgen_session_desc sd = {.n_ctx = 1024, .temperature = 0.9f, .seed = 77};
    CHECK_OK(kvgen_session_create(m, &sd, &p, &err));
    int32_t t[200];
    tu_fill_tokens(t, 200, 1, n_vocab);
    CHECK_OK(kvgen_session_prefill(p, t, 100, NULL, &err)); /* 3 full pages of 32 + 4 tokens */
    CHECK_OK(kvgen_session_fork(p, &c, &err));
    if (!c) return;
    kvgen_cache_info ci;
    kvgen_session_cache_info(c, &ci);
    CHECKF(ci.length == 100 && ci.pages == 4 && ci.pages_shared == 3 && ci.page_size == 32,
           "child: length %zu pages %zu shared %zu", ci.length, ci.pages, ci.pages_shared);
    CHECK(max_diff(kvgen_session_logits(p), kvgen_session_logits(c)) == 0);
    /* same sampler state: the same draws */
    for (int i = 0; i < 3; i++) CHECK(kvgen_session_sample(p) == kvgen_session_sample(c));
    /* they diverge: each must see only its own tokens */
    CHECK_OK(kvgen_session_prefill(p, t + 100, 40, NULL, &err));
    CHECK_OK(kvgen_session_prefill(c, t + 150, 50, NULL, &err));
    diff_to_scratch(p, "fork parent");
    diff_to_scratch(c, "fork child");
    /* the parent closes first: the child keeps the shared pages */
    kvgen_session_close(p);
    CHECK_OK(kvgen_session_decode(c, t[0], &err));
    diff_to_scratch(c, "fork child after the parent closed");
    /* fork of a fork at a page boundary */
    kvgen_session *g = NULL;
    CHECK_OK(kvgen_session_rewind(c, kvgen_session_length(c) - 64, &err));
    CHECK_OK(kvgen_session_fork(c, &g, &err));
    if (g) {
        kvgen_session_cache_info(g, &ci);
        CHECK(ci.pages == 2 && ci.pages_shared == 2);
        CHECK_OK(kvgen_session_decode(g, t[5], &err));
        diff_to_scratch(g, "grandchild");
    }
    kvgen_session_close(g);
    kvgen_session_close(c);
}

static void test_rewind(kvgen_model *m) {
    kvgen_error err = {0};
    kvgen_session *s = NULL, *c = NULL;
    kvgen_session_desc sd = {.n_ctx = 256};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    int32_t t[120];
    tu_fill_tokens(t, 120, 2, n_vocab);
    CHECK_OK(kvgen_session_prefill(s, t, 80, NULL, &err));
    CHECK(kvgen_session_rewind(s, 81, &err) == KVGEN_E_INVALID_ARGUMENT && kvgen_session_length(s) == 80);
    CHECK_OK(kvgen_session_rewind(s, 30, &err));
    CHECK(kvgen_session_length(s) == 50);
    kvgen_cache_info ci;
    kvgen_session_cache_info(s, &ci);
    CHECK(ci.pages == 2);
    diff_to_scratch(s, "rewind");
    CHECK_OK(kvgen_session_prefill(s, t + 90, 25, NULL, &err));
    diff_to_scratch(s, "rewind then append");
    /* a child rewinds into pages it shares with its parent, then writes over them */
    CHECK_OK(kvgen_session_fork(s, &c, &err));
    if (c) {
        CHECK_OK(kvgen_session_rewind(c, 20, &err));
        CHECK_OK(kvgen_session_prefill(c, t, 30, NULL, &err));
        diff_to_scratch(c, "child rewound into shared pages");
        diff_to_scratch(s, "parent of a rewound child");
    }
    CHECK_OK(kvgen_session_rewind(s, kvgen_session_length(s), &err));
    CHECK(kvgen_session_length(s) == 0 && kvgen_session_logits(s) == NULL);
    kvgen_session_cache_info(s, &ci);
    CHECK(ci.pages == 0);
    kvgen_session_close(c);
    kvgen_session_close(s);
}

static void test_prefix_reuse(kvgen_model *m) {
    kvgen_error err = {0};
    kvgen_session *a = NULL, *b = NULL, *c = NULL;
    kvgen_session_desc sd = {.n_ctx = 512};
    int32_t t[200], u[200];
    tu_fill_tokens(t, 200, 3, n_vocab);
    memcpy(u, t, sizeof u);
    tu_fill_tokens(u + 150, 20, 4, n_vocab);
    CHECK_OK(kvgen_session_create(m, &sd, &a, &err));
    CHECK_OK(kvgen_session_prefill(a, t, 200, NULL, &err));
    CHECK_OK(kvgen_session_create(m, &sd, &b, &err));
    CHECK_OK(kvgen_session_prefill(b, u, 170, NULL, &err));
    kvgen_cache_info ci;
    kvgen_session_cache_info(b, &ci);
    /* pages [0,128) match; the page [128,160) differs from position 150 on */
    CHECKF(ci.tokens_reused == 128 && ci.pages_shared == 4, "reused %zu shared %zu", ci.tokens_reused,
           ci.pages_shared);
    printf("prefix reuse: %zu of 170 tokens reused\n", ci.tokens_reused);
    diff_to_scratch(b, "prefix reuse");
    /* the pages outlive their session in the prefix cache */
    kvgen_session_close(a);
    kvgen_session_close(b);
    kvgen_pool_info pi;
    kvgen_model_pool_info(m, &pi);
    CHECKF(pi.pages_cached >= 6 && pi.pages_used == 0, "cached %zu used %zu", pi.pages_cached, pi.pages_used);
    CHECK_OK(kvgen_session_create(m, &sd, &c, &err));
    CHECK_OK(kvgen_session_prefill(c, t, 200, NULL, &err));
    kvgen_session_cache_info(c, &ci);
    CHECKF(ci.tokens_reused == 192, "reused %zu after the owners closed", ci.tokens_reused);
    diff_to_scratch(c, "prefix reuse from cached pages");
    kvgen_session_close(c);
    /* opting out */
    kvgen_session_desc no = {.n_ctx = 512, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(m, &no, &c, &err));
    CHECK_OK(kvgen_session_prefill(c, t, 200, NULL, &err));
    kvgen_session_cache_info(c, &ci);
    CHECK(ci.tokens_reused == 0);
    kvgen_session_close(c);
}

/* K of layer 0 depends only on the token and its position, V only on the token: after a shift
 * both must equal a fresh run of the shifted sequence. On a one-layer model that makes the
 * whole next-token computation equal to the recomputation. */
static void test_shift(kvgen_model *m, int one_layer) {
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {.n_ctx = 64, .on_full = KVGEN_ON_FULL_SHIFT, .keep = 8};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    int32_t t[100];
    tu_fill_tokens(t, 100, 5, n_vocab);
    CHECK_OK(kvgen_session_prefill(s, t, 64, NULL, &err));
    CHECK_OK(kvgen_session_decode(s, t[64], &err));
    /* dropped (64 - 8) / 2 = 28: tokens [0,8) + [36,65) */
    CHECK(kvgen_session_length(s) == 37);
    int32_t want[37];
    memcpy(want, t, 8 * sizeof *t);
    memcpy(want + 8, t + 36, 29 * sizeof *t);
    CHECK(memcmp(kvgen_session_tokens(s), want, sizeof want) == 0);
    kvgen_cache_info ci;
    kvgen_session_cache_info(s, &ci);
    CHECK(ci.shifts == 1 && ci.pages == 2);

    kvgen_session *o = NULL;
    kvgen_session_desc od = {.n_ctx = 64};
    CHECK_OK(kvgen_session_create(oracle, &od, &o, &err));
    CHECK_OK(kvgen_session_prefill(o, want, 37, NULL, &err));
    int H = ci.n_head_kv, hd = ci.head_dim;
    size_t nf = (size_t)H * 37 * hd;
    float *a = malloc(nf * sizeof *a), *b = malloc(nf * sizeof *b);
    for (int which = 0; which < 2; which++) {
        CHECK_OK(kvgen_session_read_cache(s, 0, which, a, nf, &err));
        CHECK_OK(kvgen_session_read_cache(o, 0, which, b, nf, &err));
        double d = 0;
        for (size_t i = 0; i < nf; i++) d = fmax(d, fabs((double)a[i] - b[i]));
        CHECKF(d <= 1e-4, "shift: layer 0 %s differs from the recomputation by %g", which ? "V" : "K", d);
        if (which == 0) printf("shift: re-rotated keys within %.2g of the recomputed ones\n", d);
    }
    if (one_layer) {
        double d = max_diff(kvgen_session_logits(s), kvgen_session_logits(o));
        /* the token decoded right after the shift ran with re-rotated keys */
        CHECKF(d <= 1e-4, "shift (1 layer): logits differ from the recomputation by %g", d);
        CHECK_OK(kvgen_session_decode(s, t[70], &err));
        CHECK_OK(kvgen_session_decode(o, t[70], &err));
        d = max_diff(kvgen_session_logits(s), kvgen_session_logits(o));
        CHECKF(d <= 1e-4, "shift (1 layer), next token: logits differ by %g", d);
    }
    /* it keeps going past many shifts */
    for (int i = 0; i < 100; i++) CHECK_OK(kvgen_session_decode(s, t[i % 100], &err));
    CHECK(kvgen_session_length(s) <= 64 && memcmp(kvgen_session_tokens(s), t, 8 * sizeof *t) == 0);
    free(a);
    free(b);
    kvgen_session_close(o);
    kvgen_session_close(s);

    /* on_full = error */
    kvgen_session_desc ed = {.n_ctx = 40};
    CHECK_OK(kvgen_session_create(m, &ed, &s, &err));
    CHECK_OK(kvgen_session_prefill(s, t, 40, NULL, &err));
    CHECK(kvgen_session_decode(s, t[0], &err) == KVGEN_E_CONTEXT_FULL);
    CHECKF(strstr(err.message, "context full (40/40)") != NULL, "message: %s", err.message);
    CHECK(kvgen_session_length(s) == 40);
    diff_to_scratch(s, "after context full");
    kvgen_session_close(s);
}

static void test_load_options(const char *path) {
    kvgen_error err = {0};
    kvgen_model *m = NULL;
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .kv_page_size = 48};
    CHECK(kvgen_model_load(&md, &m, &err) == KVGEN_E_INVALID_ARGUMENT && !m);
    CHECKF(strstr(err.message, "kv_page_size 48") != NULL, "%s", err.message);
    md.kv_page_size = 512;
    CHECK(kvgen_model_load(&md, &m, &err) == KVGEN_E_INVALID_ARGUMENT);
    md.kv_page_size = 16;
    md.kv_pool_bytes = 100;
    CHECK(kvgen_model_load(&md, &m, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECKF(strstr(err.message, "less than one KV page") != NULL, "%s", err.message);
    md.kv_pool_bytes = 0;
    md.kv_pool_tokens = 100; /* rounded up to 7 pages of 16 */
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    kvgen_pool_info pi;
    kvgen_model_pool_info(m, &pi);
    CHECK(pi.page_size == 16 && pi.pages_total == 7 && pi.pages_used == 0 && pi.bytes_committed == 0);
    CHECK(pi.bytes_per_page == 16 * pi.bytes_per_token && pi.bytes_total == 7 * pi.bytes_per_page);
    kvgen_model_unload(m);
    /* default: documented as 16 sessions of min(context_length, 8192) tokens, RAM permitting */
    md.kv_pool_tokens = 0;
    md.kv_page_size = 0;
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    kvgen_model_pool_info(m, &pi);
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    size_t ctx = info.n_ctx_train < 8192 ? (size_t)info.n_ctx_train : 8192;
    CHECKF(pi.page_size == 32 && pi.pages_total * 32 <= 16 * ctx && pi.pages_total * 32 + 32 > 16 * ctx,
           "default pool %zu pages of %zu", pi.pages_total, pi.page_size);
    kvgen_model_unload(m);
}

int main(void) {
    char *path = tu_make_model("session.gguf", "--seed 31 --layers 2 --embd 64 --ff 96 --heads 4 --kv-heads 2 "
                                               "--ctx 1024");
    char *path1 = tu_make_model("session1.gguf", "--seed 32 --layers 1 --embd 64 --ff 96 --heads 4 --kv-heads 2");
    CHECK(path && path1);
    if (!path || !path1) return tu_finish("test_session");
    kvgen_model *m = load(path, NULL);
    oracle = load(path, NULL);
    if (m && oracle) {
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        n_vocab = info.n_vocab;
        test_fork(m);
        test_rewind(m);
        test_prefix_reuse(m);
        test_shift(m, 0);
    }
    kvgen_model_unload(m);
    kvgen_model_unload(oracle);
    m = load(path1, NULL);
    oracle = load(path1, NULL);
    if (m && oracle) test_shift(m, 1);
    kvgen_model_unload(m);
    kvgen_model_unload(oracle);
    test_load_options(path);
    free(path);
    free(path1);
    return tu_finish("test_session");
}
