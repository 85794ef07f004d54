/* test_kv_types.c: K/V pages of q8_0 and q4_0 (kvgen_model_desc.kv_type) on the cpu backend.
 * Logits stay within a stated share of the logit range of f16 pages, in prefill and decode, on
 * a grouped-query model and on one with sliding-window layers (neox RoPE); every session
 * operation (fork, rewind, context shift, save and restore across types, prefix reuse) works on
 * quantized pages; pages take the bytes the types promise; a kv_type no backend stores, or one
 * the chosen backend does not, is refused by name. */
#include <math.h>
#include <string.h>
#include "testutil.h"

static const char *const QTYPES[2] = {"q8_0", "q4_0"};
/* the largest logit difference from f16 pages, as a share of the f16 logits' range: q8_0 keeps
 * each element to 1/254 of its block's largest, q4_0 to 1/16 (random weights make peaked
 * attention: the worst measured here is 0.013 and 0.16) */
static const double TOL[2] = {0.02, 0.2};

/* ---- logits against f16 pages ------------------------------------------------------------ */

/* 100 tokens of prefill (every position's logits), then 16 decodes, on f16 and on each block
 * type; the worst difference of each as a share of the f16 logits' range */
static void test_logits(const char *path, const char *what) {
    enum { N = 100, DEC = 16 };
    kvgen_model *f16 = tu_load_kv(path, "f16", KVGEN_BACKEND_CPU);
    if (!f16) return;
    int V = tu_vocab(f16);
    int32_t t[N + DEC];
    tu_fill_tokens(t, N + DEC, 7, V);
    float *want = malloc((size_t)N * V * sizeof *want), *got = malloc((size_t)N * V * sizeof *got);
    float *want_dec = malloc((size_t)DEC * V * sizeof *want_dec);
    CHECK(want && got && want_dec);
    kvgen_error err = {0};
    kvgen_session *s = tu_open_session(f16, NULL);
    if (!s || !want || !got || !want_dec) goto done;
    CHECK_OK(kvgen_session_prefill(s, t, N, want, &err));
    for (int i = 0; i < DEC; i++) {
        CHECK_OK(kvgen_session_decode(s, t[N + i], &err));
        memcpy(want_dec + (size_t)i * V, kvgen_session_logits(s), (size_t)V * sizeof(float));
    }
    kvgen_session_close(s);
    for (int q = 0; q < 2; q++) {
        kvgen_model *m = tu_load_kv(path, QTYPES[q], KVGEN_BACKEND_CPU);
        if (!m) continue;
        kvgen_session *qs = tu_open_session(m, NULL);
        double pre = 0.0, dec = 0.0;
        int same_top = 0;
        CHECK_OK(kvgen_session_prefill(qs, t, N, got, &err));
        for (int p = 0; p < N; p++) pre = fmax(pre, tu_rel_diff(got + (size_t)p * V, want + (size_t)p * V, (size_t)V));
        for (int i = 0; i < DEC; i++) {
            CHECK_OK(kvgen_session_decode(qs, t[N + i], &err));
            const float *l = kvgen_session_logits(qs), *w = want_dec + (size_t)i * V;
            dec = fmax(dec, tu_rel_diff(l, w, (size_t)V));
            int a = 0, b = 0;
            for (int k = 1; k < V; k++) {
                if (l[k] > l[a]) a = k;
                if (w[k] > w[b]) b = k;
            }
            same_top += a == b;
        }
        printf("%s %s: logits within %.4f (prefill) and %.4f (decode) of f16's range; decode argmax the same "
               "%d/%d\n", what, QTYPES[q], pre, dec, same_top, DEC);
        CHECKF(pre <= TOL[q], "%s %s prefill: %.4f of the range from f16 pages", what, QTYPES[q], pre);
        CHECKF(dec <= TOL[q], "%s %s decode: %.4f of the range from f16 pages", what, QTYPES[q], dec);
        /* they do differ: the pages really hold the block type */
        CHECKF(pre > 0.0, "%s %s: the same logits as f16 pages", what, QTYPES[q]);
        kvgen_session_close(qs);
        kvgen_model_unload(m);
    }
done:
    free(want);
    free(got);
    free(want_dec);
    kvgen_model_unload(f16);
}

/* ---- bytes ------------------------------------------------------------------------------- */

static void test_bytes(const char *path) {
    kvgen_model *m[3] = {tu_load_kv(path, NULL, KVGEN_BACKEND_CPU), tu_load_kv(path, "q8_0", KVGEN_BACKEND_CPU),
                         tu_load_kv(path, "q4_0", KVGEN_BACKEND_CPU)};
    if (!m[0] || !m[1] || !m[2]) goto done;
    kvgen_pool_info pi[3];
    kvgen_cache_info ci[3];
    for (int i = 0; i < 3; i++)
        if (!tu_cache_sizes(m[i], 70, &pi[i], &ci[i])) goto done;
    /* 34 and 18 bytes for 32 elements of 2 */
    CHECKF(ci[1].bytes_per_token * 64 == ci[0].bytes_per_token * 34, "q8_0: %zu bytes a token, f16 %zu",
           ci[1].bytes_per_token, ci[0].bytes_per_token);
    CHECKF(ci[2].bytes_per_token * 64 == ci[0].bytes_per_token * 18, "q4_0: %zu bytes a token, f16 %zu",
           ci[2].bytes_per_token, ci[0].bytes_per_token);
    /* a pool of the same tokens costs that much less */
    CHECK(pi[1].bytes_per_page * 64 == pi[0].bytes_per_page * 34 && pi[1].pages_total == pi[0].pages_total);
done:
    for (int i = 0; i < 3; i++) kvgen_model_unload(m[i]);
}

/* ---- session operations on quantized pages ------------------------------------------------- */

static void test_fork_rewind(kvgen_model *m, const char *kt) {
    kvgen_error err = {0};
    int V = tu_vocab(m);
    int32_t t[200];
    tu_fill_tokens(t, 200, 11, V);
    kvgen_session *p = tu_open_session(m, NULL), *c = NULL;
    if (!p) return;
    CHECK_OK(kvgen_session_prefill(p, t, 100, NULL, &err));
    CHECK_OK(kvgen_session_fork(p, &c, &err));
    if (c) {
        kvgen_cache_info ci;
        kvgen_session_cache_info(c, &ci);
        CHECKF(ci.pages_shared == 3, "%s fork: %zu pages shared", kt, ci.pages_shared);
        /* the child writes into the shared partial page: copy on write keeps the parent's rows */
        CHECK_OK(kvgen_session_decode(c, t[150], &err));
        CHECK_OK(kvgen_session_decode(p, t[100], &err));
        CHECK_OK(kvgen_session_prefill(p, t + 101, 20, NULL, &err));
        CHECK_OK(kvgen_session_prefill(c, t + 151, 30, NULL, &err));
        tu_diff_to_fresh(m, p, "fork parent", 1e-4);
        tu_diff_to_fresh(m, c, "fork child", 1e-4);
    }
    kvgen_session_close(c);
    /* rewind into the middle of a page and run other tokens: the same logits as without the detour */
    float *before = malloc((size_t)V * sizeof *before);
    CHECK_OK(kvgen_session_rewind(p, kvgen_session_length(p) - 70, &err));
    CHECK_OK(kvgen_session_prefill(p, t + 160, 25, NULL, &err));
    if (before) memcpy(before, kvgen_session_logits(p), (size_t)V * sizeof *before);
    CHECK_OK(kvgen_session_rewind(p, 12, &err));
    CHECK(kvgen_session_length(p) == 83);
    CHECK_OK(kvgen_session_prefill(p, t + 173, 12, NULL, &err));
    CHECKF(before && tu_rel_diff(kvgen_session_logits(p), before, (size_t)V) == 0.0, "%s rewind: other logits", kt);
    tu_diff_to_fresh(m, p, "rewind", 1e-4);
    free(before);
    kvgen_session_close(p);
}

static void test_prefix_reuse(kvgen_model *m, const char *kt) {
    kvgen_error err = {0};
    int32_t t[160];
    tu_fill_tokens(t, 160, 13, tu_vocab(m));
    kvgen_session *a = tu_open_session(m, NULL), *b = tu_open_session(m, NULL);
    if (!a || !b) goto done;
    CHECK_OK(kvgen_session_prefill(a, t, 100, NULL, &err));
    CHECK_OK(kvgen_session_prefill(b, t, 120, NULL, &err));
    kvgen_cache_info ci;
    kvgen_session_cache_info(b, &ci);
    CHECKF(ci.tokens_reused == 96 && ci.pages_shared == 3, "%s prefix: %zu tokens reused, %zu pages shared", kt,
           ci.tokens_reused, ci.pages_shared);
    tu_diff_to_fresh(m, b, "prefix reuse", 1e-4);
    /* a released session's pages stay cached for the next one */
    kvgen_session_close(a);
    a = tu_open_session(m, NULL);
    CHECK_OK(kvgen_session_prefill(a, t, 70, NULL, &err));
    kvgen_session_cache_info(a, &ci);
    CHECKF(ci.tokens_reused == 64, "%s prefix after release: %zu reused", kt, ci.tokens_reused);
    tu_diff_to_fresh(m, a, "prefix reuse after release", 1e-4);
done:
    kvgen_session_close(a);
    kvgen_session_close(b);
}

/* A context shift re-rotates the kept keys (dequantize, rotate, quantize): the first layer's are
 * close to the keys a recomputation at the new positions quantizes, within about two
 * quantization steps of the largest key (later layers' keys differ anyway: the dropped tokens
 * shaped them), and the logits of the shifted session are within the type's tolerance of the
 * same shift on f16 pages. */
static void test_shift(kvgen_model *m, kvgen_model *f16, int q) {
    const char *kt = QTYPES[q];
    kvgen_error err = {0};
    int32_t t[100];
    tu_fill_tokens(t, 100, 5, tu_vocab(m));
    kvgen_session_desc sd = {.n_ctx = 64, .on_full = KVGEN_ON_FULL_SHIFT, .keep = 8};
    kvgen_session *s = tu_open_session(m, &sd), *o = NULL;
    if (!s) return;
    CHECK_OK(kvgen_session_prefill(s, t, 64, NULL, &err));
    CHECK_OK(kvgen_session_decode(s, t[64], &err));
    kvgen_cache_info ci;
    kvgen_session_cache_info(s, &ci);
    CHECKF(ci.shifts == 1 && ci.length == 37, "%s shift: %zu shifts, length %zu", kt, ci.shifts, ci.length);
    kvgen_session_desc od = {.n_ctx = 64, .no_prefix_reuse = 1};
    o = tu_open_session(m, &od);
    if (!o) goto done;
    CHECK_OK(kvgen_session_prefill(o, kvgen_session_tokens(s), ci.length, NULL, &err));
    size_t nf = (size_t)ci.n_head_kv * ci.length * (size_t)ci.head_dim;
    float *a = malloc(nf * sizeof *a), *b = malloc(nf * sizeof *b);
    CHECK(a && b);
    for (int l = 0; a && b && l < 1; l++) {
        CHECK_OK(kvgen_session_read_cache(s, l, 0, a, nf, &err));
        CHECK_OK(kvgen_session_read_cache(o, l, 0, b, nf, &err));
        double d = 0.0, amax = 0.0;
        for (size_t i = 0; i < nf; i++) {
            d = fmax(d, fabs((double)a[i] - b[i]));
            amax = fmax(amax, fabs((double)b[i]));
        }
        double step = amax / (q == 0 ? 127.0 : 8.0);
        CHECKF(d <= 2.0 * step, "%s shift: layer %d keys %.3g from the recomputation (step %.3g)", kt, l, d, step);
        printf("%s shift: re-rotated keys within %.2f steps of the recomputed ones\n", kt, d / step);
    }
    free(a);
    free(b);
    kvgen_session *h = tu_open_session(f16, &sd);
    if (h) {
        CHECK_OK(kvgen_session_prefill(h, t, 64, NULL, &err));
        CHECK_OK(kvgen_session_decode(h, t[64], &err));
        double d = 0.0;
        for (int i = 0; i < 8; i++) {
            CHECK_OK(kvgen_session_decode(s, t[70 + i], &err));
            CHECK_OK(kvgen_session_decode(h, t[70 + i], &err));
            d = fmax(d, tu_rel_diff(kvgen_session_logits(s), kvgen_session_logits(h), (size_t)tu_vocab(m)));
        }
        printf("%s shift: logits within %.4f of the range of the same shift on f16 pages\n", kt, d);
        CHECKF(d <= TOL[q], "%s shift: logits %.3g of the range from the same shift on f16 pages", kt, d);
        kvgen_session_close(h);
    }
    /* and on through many shifts */
    for (int i = 0; i < 100; i++) CHECK_OK(kvgen_session_decode(s, t[i], &err));
    CHECK(kvgen_session_length(s) <= 64 && memcmp(kvgen_session_tokens(s), t, 8 * sizeof *t) == 0);
done:
    kvgen_session_close(o);
    kvgen_session_close(s);
}

/* A saved session is f32 K/V: it restores into pages of any type. Into the type it came from it
 * is the same pages (requantizing a block's dequantized values gives them back), so the next
 * logits are the same; into another type, within that type's tolerance. */
static void test_save_restore(kvgen_model *const *models, const char *const *names, int n_models) {
    kvgen_error err = {0};
    int V = tu_vocab(models[0]);
    int32_t t[90];
    tu_fill_tokens(t, 90, 17, V);
    char *file = tu_tmpfile("kv_types.session");
    float *want = malloc((size_t)V * sizeof *want);
    CHECK(file && want);
    for (int from = 0; file && want && from < n_models; from++) {
        kvgen_session *s = tu_open_session(models[from], NULL);
        if (!s) continue;
        CHECK_OK(kvgen_session_prefill(s, t, 80, NULL, &err));
        CHECK_OK(kvgen_session_save(s, file, &err));
        CHECK_OK(kvgen_session_decode(s, t[80], &err));
        memcpy(want, kvgen_session_logits(s), (size_t)V * sizeof *want);
        kvgen_session_close(s);
        for (int to = 0; to < n_models; to++) {
            kvgen_session *r = NULL;
            CHECK_OK(kvgen_session_restore(models[to], file, &r, &err));
            if (!r) continue;
            CHECK(kvgen_session_length(r) == 80);
            CHECK_OK(kvgen_session_decode(r, t[80], &err));
            double d = tu_rel_diff(kvgen_session_logits(r), want, (size_t)V);
            /* the coarser of the two types bounds the difference */
            double tol = from == to ? 0.0 : fmax(from ? TOL[from - 1] : 0.0, to ? TOL[to - 1] : 0.0);
            printf("saved from %s, restored into %s: next logits within %.4f of the range\n", names[from], names[to],
                   d);
            CHECKF(d <= tol, "saved from %s, restored into %s: next logits %.4g of the range apart", names[from],
                   names[to], d);
            kvgen_session_close(r);
        }
    }
    free(want);
    free(file);
}

/* Across backends: the reference's f32 pages saved, restored into the cpu backend's q8_0 and
 * q4_0 pages, and those saved and restored into the reference; the next logits within the
 * block type's tolerance (plus the backends' own difference, far smaller on f32 weights) of
 * the session that saved. */
static void test_save_restore_backends(const char *path) {
    kvgen_model *ref = tu_load_kv(path, NULL, KVGEN_BACKEND_REFERENCE);
    kvgen_model *q[2] = {tu_load_kv(path, "q8_0", KVGEN_BACKEND_CPU), tu_load_kv(path, "q4_0", KVGEN_BACKEND_CPU)};
    char *file = tu_tmpfile("kv_backends.session");
    if (!ref || !q[0] || !q[1] || !file) goto done;
    kvgen_error err = {0};
    int V = tu_vocab(ref);
    int32_t t[70];
    tu_fill_tokens(t, 70, 19, V);
    for (int k = 0; k < 2; k++)
        for (int dir = 0; dir < 2; dir++) { /* 0: reference -> cpu; 1: cpu -> reference */
            kvgen_model *from = dir ? q[k] : ref, *to = dir ? ref : q[k];
            kvgen_session *s = tu_open_session(from, NULL), *r = NULL;
            if (!s) continue;
            CHECK_OK(kvgen_session_prefill(s, t, 60, NULL, &err));
            CHECK_OK(kvgen_session_save(s, file, &err));
            CHECK_OK(kvgen_session_decode(s, t[60], &err));
            CHECK_OK(kvgen_session_restore(to, file, &r, &err));
            if (r) {
                CHECK_OK(kvgen_session_decode(r, t[60], &err));
                double d = tu_rel_diff(kvgen_session_logits(r), kvgen_session_logits(s), (size_t)V);
                printf("saved on the %s backend, restored into the %s one (%s): next logits within %.4f\n",
                       dir ? "cpu" : "reference", dir ? "reference" : "cpu", QTYPES[k], d);
                CHECKF(d <= TOL[k] + 0.01, "%s across backends (%d): %.4g of the range", QTYPES[k], dir, d);
            }
            kvgen_session_close(r);
            kvgen_session_close(s);
        }
done:
    free(file);
    kvgen_model_unload(ref);
    kvgen_model_unload(q[0]);
    kvgen_model_unload(q[1]);
}

/* ---- refusals ------------------------------------------------------------------------------- */

static void expect_refused(const char *path, kvgen_backend backend, const char *kv_type, kvgen_status want,
                           const char *must_say) {
    kvgen_model_desc md = {.path = path, .backend = backend, .n_threads = 1, .kv_type = kv_type};
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvgen_model_load(&md, &m, &err);
    if (st == KVGEN_E_UNSUPPORTED && strstr(err.message, "built without")) return; /* no such backend here */
    CHECKF(st == want && m == NULL, "kv_type %s: %s (%s)", kv_type, kvgen_status_name(st), err.message);
    CHECKF(strstr(err.message, "kvgen_model_load") && strstr(err.message, "kv_type") &&
               strstr(err.message, kv_type) && strstr(err.message, must_say),
           "kv_type %s: message \"%s\" lacks \"%s\"", kv_type, err.message, must_say);
    kvgen_model_unload(m);
}

static void test_refusals(const char *path, const char *narrow) {
    expect_refused(path, KVGEN_BACKEND_CPU, "q5_1", KVGEN_E_INVALID_ARGUMENT, "f16, q8_0, q4_0");
    expect_refused(path, KVGEN_BACKEND_DEFAULT, "Q8_0", KVGEN_E_INVALID_ARGUMENT, "not a KV type");
    expect_refused(path, KVGEN_BACKEND_CPU, "f32", KVGEN_E_UNSUPPORTED, "cpu backend");
    expect_refused(path, KVGEN_BACKEND_REFERENCE, "q8_0", KVGEN_E_UNSUPPORTED, "reference backend");
    expect_refused(path, KVGEN_BACKEND_VULKAN, "f32", KVGEN_E_UNSUPPORTED, "vulkan");
    expect_refused(narrow, KVGEN_BACKEND_CPU, "q8_0", KVGEN_E_UNSUPPORTED, "head_dim 16");
    /* the defaults and the explicit names load */
    kvgen_model *m = tu_load_kv(path, "", KVGEN_BACKEND_CPU);
    kvgen_model_unload(m);
    m = tu_load_kv(path, "f32", KVGEN_BACKEND_REFERENCE);
    kvgen_model_unload(m);
    m = tu_load_kv(narrow, "f16", KVGEN_BACKEND_CPU);
    kvgen_model_unload(m);
}

int main(void) {
    /* grouped-query attention, head_dim 32 */
    char *gqa = tu_make_model("kv-gqa.gguf", "--seed 41 --layers 2 --embd 128 --ff 192 --heads 4 --kv-heads 2 "
                                             "--ctx 1024");
    /* local layers with a window of 16, neox RoPE, Q/K norms */
    char *swa = tu_make_model("kv-swa.gguf", "--arch gemma3 --qk-norm --post-norms --swa 16 --layers 4 --embd 64 "
                                             "--heads 4 --kv-heads 2 --head-dim 32 --ff 96 --ctx 1024 --seed 43");
    /* head_dim 16: no whole blocks */
    char *narrow = tu_make_model("kv-narrow.gguf", "--seed 45 --layers 1 --embd 64 --ff 96 --heads 4 --kv-heads 2");
    CHECK(gqa && swa && narrow);
    if (!gqa || !swa || !narrow) return tu_finish("test_kv_types");
    test_logits(gqa, "gqa");
    test_logits(swa, "swa");
    test_bytes(gqa);
    kvgen_model *models[3] = {tu_load_kv(gqa, "f16", KVGEN_BACKEND_CPU), tu_load_kv(gqa, "q8_0", KVGEN_BACKEND_CPU),
                              tu_load_kv(gqa, "q4_0", KVGEN_BACKEND_CPU)};
    const char *names[3] = {"f16", "q8_0", "q4_0"};
    if (models[0] && models[1] && models[2]) {
        for (int q = 0; q < 2; q++) {
            test_fork_rewind(models[q + 1], QTYPES[q]);
            test_prefix_reuse(models[q + 1], QTYPES[q]);
            test_shift(models[q + 1], models[0], q);
        }
        test_save_restore(models, names, 3);
    }
    for (int i = 0; i < 3; i++) kvgen_model_unload(models[i]);
    test_save_restore_backends(gqa);
    test_refusals(gqa, narrow);
    free(gqa);
    free(swa);
    free(narrow);
    return tu_finish("test_kv_types");
}
