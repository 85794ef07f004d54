/* test_vk_kv_types.c: the Vulkan backend's block K/V pages, q8_0 and q4_0 (blocks of 32 elements:
 * an f16 scale and 32 int8, 34 bytes, or 32 nibbles, 18 bytes, so rows start at any even byte).
 * Each type, kernels: both attention kernels
 * (cooperative, and attn_lane.comp for CPU devices) read a one-layer pool of such pages written
 * through the pool's own page writes (which quantize as the cpu backend does), every slot
 * outside the session with NaN scales; each output is compared, in double, with attention over
 * the same K/V quantized and dequantized on the host (tolerance 2e-4, as test_vk_kernels for f16
 * pages) and, as a bound on what quantizing costs, over the unquantized K/V (printed). Models
 * (random, head_dim 32 and 64, one with sliding-window layers and Q/K norms): logits of prefill
 * and decode against the cpu backend's pages of the type and the reference's f32 (within the
 * type's share of the logit range: test_kv_types' 0.02 and 0.2), bytes per token, fork, rewind,
 * context shift (keys re-rotated in the pages), save/restore (into Vulkan pages of the type: the
 * same logits; into the cpu's: within its tolerance); fork, rewind and shift again on a pool
 * spread over all 8 slabs. With
 * KVGEN_VALIDATE=1 the validation layer must stay silent. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_quant.h"
#include "kvg_vk.h"
#include "testutil.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static const char *const QTYPES[2] = {"q8_0", "q4_0"};
static const uint32_t QT[2] = {KVG_TYPE_Q8_0, KVG_TYPE_Q4_0};
/* shares of the logit range (test_kv_types: q8_0 keeps each element to 1/254 of its block's
 * largest, q4_0 to 1/16) */
static const double TOL[2] = {0.02, 0.2};
/* against the cpu backend's pages of the same type (measured at most 0.0089 and 0.036) */
static const double CPU_TOL[2] = {0.02, 0.1};
/* the type under test */
static int qi;

static double worst_q[2], worst_f32[2];

/* rows of hd floats through the type and back */
static void q_round(float *x, size_t rows, int hd) {
    uint8_t blk[34 * 8];
    for (size_t r = 0; r < rows; r++) {
        kvg_quantize_row(QT[qi], x + r * (size_t)hd, blk, (uint64_t)hd);
        kvg_dequantize_row(QT[qi], blk, x + r * (size_t)hd, (uint64_t)hd);
    }
}

/* attention of query (t, h) in double over k, v ((n_kv, n_ctx, hd)) */
static void attend(const float *q, const float *k, const float *v, int n_head, int n_kv, int hd, int n_ctx, int len,
                   int t, int h, double *s, double *o) {
    const float *qh = q + ((size_t)t * n_head + h) * hd;
    int kvh = h / (n_head / n_kv);
    double mx = -1e300, sum = 0;
    for (int p = 0; p < len; p++) {
        const float *kp = k + ((size_t)kvh * n_ctx + p) * hd;
        double d = 0;
        for (int e = 0; e < hd; e++) d += (double)qh[e] * kp[e];
        s[p] = d / sqrt((double)hd);
        if (s[p] > mx) mx = s[p];
    }
    for (int p = 0; p < len; p++) sum += (s[p] = exp(s[p] - mx));
    for (int e = 0; e < hd; e++) {
        double acc = 0;
        for (int p = 0; p < len; p++) acc += s[p] * v[((size_t)kvh * n_ctx + p) * hd + e];
        o[e] = acc / sum;
    }
}

static void check_attention(kvg_vk_ctx *ctx, int n_head, int n_kv, int hd, int pos0, int ncols, int nsplit,
                            kvg_vk_layout layout, int page, bool shuffle) {
    int n_ctx = pos0 + ncols + 3;
    size_t nkv = (size_t)n_kv * n_ctx * hd, nq = (size_t)ncols * n_head * hd;
    float *k = malloc(nkv * 4), *v = malloc(nkv * 4), *kq = malloc(nkv * 4), *vq = malloc(nkv * 4);
    float *q = malloc(nq * 4), *out = malloc(nq * 4);
    double *s = malloc(sizeof(double) * (size_t)n_ctx), *want = malloc(sizeof(double) * (size_t)hd);
    double *exact = malloc(sizeof(double) * (size_t)hd);
    for (size_t i = 0; i < nkv; i++) {
        k[i] = frand();
        v[i] = frand() * 3.0f;
    }
    for (size_t i = 0; i < nq; i++) q[i] = frand() * 2.0f;
    memcpy(kq, k, nkv * 4);
    memcpy(vq, v, nkv * 4);
    q_round(kq, (size_t)n_kv * n_ctx, hd);
    q_round(vq, (size_t)n_kv * n_ctx, hd);
    kvgen_error err = {0};
    kvgen_status st = kvg_vk_test_attention(ctx, n_head, n_kv, hd, n_ctx, pos0, ncols, nsplit, layout, page, shuffle,
                                            QT[qi], q, k, v, out, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    int bad = 0;
    for (int t = 0; t < ncols && st == KVGEN_OK; t++)
        for (int h = 0; h < n_head; h++) {
            attend(q, kq, vq, n_head, n_kv, hd, n_ctx, pos0 + t + 1, t, h, s, want);
            attend(q, k, v, n_head, n_kv, hd, n_ctx, pos0 + t + 1, t, h, s, exact);
            for (int e = 0; e < hd; e++) {
                double got = out[((size_t)t * n_head + h) * hd + e], diff = fabs(got - want[e]);
                if (diff > worst_q[qi]) worst_q[qi] = diff;
                if (fabs(got - exact[e]) > worst_f32[qi]) worst_f32[qi] = fabs(got - exact[e]);
                if (!(diff <= 2e-4) && bad++ < 3)
                    fprintf(stderr, "  attn t %d h %d e %d: got %g want %g\n", t, h, e, got, want[e]);
            }
        }
    CHECKF(bad == 0, "%s attention heads %d/%d hd %d pos0 %d ncols %d nsplit %d %s page %d shuffle %d: %d wrong",
           QTYPES[qi], n_head, n_kv, hd, pos0, ncols, nsplit, kvg_vk_layout_name(layout), page, shuffle, bad);
    free(k); free(v); free(kq); free(vq); free(q); free(out); free(s); free(want); free(exact);
}

/* ---- whole models ------------------------------------------------------------------------- */

enum { N_PRE = 100, N_DEC = 16 };

/* every prefill position's logits, then N_DEC decodes' */
static float *run_logits(kvgen_model *m, const int32_t *t) {
    int V = tu_vocab(m);
    float *out = malloc((size_t)(N_PRE + N_DEC) * V * sizeof *out);
    kvgen_session *s = tu_open_session(m, NULL);
    kvgen_error err = {0};
    if (!out || !s) {
        kvgen_session_close(s);
        free(out);
        return NULL;
    }
    CHECK_OK(kvgen_session_prefill(s, t, N_PRE, out, &err));
    for (int i = 0; i < N_DEC; i++) {
        CHECK_OK(kvgen_session_decode(s, t[N_PRE + i], &err));
        memcpy(out + (size_t)(N_PRE + i) * V, kvgen_session_logits(s), (size_t)V * sizeof *out);
    }
    kvgen_session_close(s);
    return out;
}

static double worst_rows(const float *a, const float *b, int rows, int V) {
    double d = 0.0;
    for (int r = 0; a && b && r < rows; r++)
        d = fmax(d, tu_rel_diff(a + (size_t)r * V, b + (size_t)r * V, (size_t)V));
    return a && b ? d : INFINITY;
}

/* Vulkan's block pages against the cpu backend's of the type (the same quantization of nearly the
 * same K/V: they differ where a K/V value's rounding tips a q over), the reference's f32 and
 * Vulkan's own f16 pages, as shares of the other's logit range */
static void test_logits(const char *path, const char *what) {
    kvgen_model *vq = tu_load_kv(path, QTYPES[qi], KVGEN_BACKEND_VULKAN);
    kvgen_model *cq = tu_load_kv(path, QTYPES[qi], KVGEN_BACKEND_CPU);
    kvgen_model *ref = tu_load_kv(path, NULL, KVGEN_BACKEND_REFERENCE);
    kvgen_model *vh = tu_load_kv(path, "f16", KVGEN_BACKEND_VULKAN);
    if (vq && cq && ref && vh) {
        int V = tu_vocab(vq), rows = N_PRE + N_DEC;
        int32_t t[N_PRE + N_DEC];
        tu_fill_tokens(t, N_PRE + N_DEC, 7, V);
        float *a = run_logits(vq, t), *b = run_logits(cq, t), *c = run_logits(ref, t), *d = run_logits(vh, t);
        double to_cpu = worst_rows(a, b, rows, V), to_ref = worst_rows(a, c, rows, V);
        double to_f16 = worst_rows(a, d, rows, V), cpu_to_ref = worst_rows(b, c, rows, V);
        const char *kt = QTYPES[qi];
        printf("%s: vulkan %s logits within %.4f of the cpu's %s, %.4f of the reference's f32 (cpu %s: %.4f), "
               "%.4f of vulkan f16 (shares of the range)\n", what, kt, to_cpu, kt, to_ref, kt, cpu_to_ref, to_f16);
        CHECKF(to_cpu <= CPU_TOL[qi], "%s: vulkan %s %.4g of the range from the cpu's", what, kt, to_cpu);
        CHECKF(to_ref <= TOL[qi], "%s: vulkan %s %.4g of the range from the reference", what, kt, to_ref);
        CHECKF(to_f16 > 0.0, "%s: vulkan %s gives f16's logits", what, kt);
        CHECK(kvg_vk_validation_count(kvg_vk_model_ctx(vq)) == 0);
        free(a); free(b); free(c); free(d);
    }
    kvgen_model_unload(vq); kvgen_model_unload(cq); kvgen_model_unload(ref); kvgen_model_unload(vh);
}

/* 34 bytes for 32 elements of 2, in the pool and in a session's cache */
static void test_bytes(const char *path) {
    kvgen_model *m[2] = {tu_load_kv(path, NULL, KVGEN_BACKEND_VULKAN),
                         tu_load_kv(path, QTYPES[qi], KVGEN_BACKEND_VULKAN)};
    if (!m[0] || !m[1]) goto done;
    kvgen_pool_info pi[2];
    kvgen_cache_info ci[2];
    for (int i = 0; i < 2; i++)
        if (!tu_cache_sizes(m[i], 70, &pi[i], &ci[i])) goto done;
    size_t blk = qi ? 18 : 34;
    CHECKF(ci[1].bytes_per_token * 64 == ci[0].bytes_per_token * blk, "%s: %zu bytes a token, f16 %zu", QTYPES[qi],
           ci[1].bytes_per_token, ci[0].bytes_per_token);
    printf("bytes per token: f16 %zu, %s %zu\n", ci[0].bytes_per_token, QTYPES[qi], ci[1].bytes_per_token);
done:
    kvgen_model_unload(m[0]);
    kvgen_model_unload(m[1]);
}

/* A recomputation runs the K/V through other kernels (a prefill chunk where the session ran
 * decodes): a value that rounds to another q shows, so the tolerance is the type's, not f16's. */
#define OPS_TOL TOL[qi]

static void test_fork_rewind(kvgen_model *m) {
    kvgen_error err = {0};
    int V = tu_vocab(m);
    int32_t t[200];
    tu_fill_tokens(t, 200, 11, V);
    kvgen_session *p = tu_open_session(m, NULL), *c = NULL;
    if (!p) return;
    CHECK_OK(kvgen_session_prefill(p, t, 100, NULL, &err));
    CHECK_OK(kvgen_session_fork(p, &c, &err));
    if (c) {
        /* the child writes into the shared partial page: copy on write keeps the parent's rows */
        CHECK_OK(kvgen_session_decode(c, t[150], &err));
        CHECK_OK(kvgen_session_decode(p, t[100], &err));
        CHECK_OK(kvgen_session_prefill(p, t + 101, 20, NULL, &err));
        CHECK_OK(kvgen_session_prefill(c, t + 151, 30, NULL, &err));
        tu_diff_to_fresh(m, p, "fork parent", OPS_TOL);
        tu_diff_to_fresh(m, c, "fork child", OPS_TOL);
    }
    kvgen_session_close(c);
    /* rewind into the middle of a page and run other tokens: the same logits as without the detour */
    float *before = malloc((size_t)V * sizeof *before);
    CHECK_OK(kvgen_session_rewind(p, kvgen_session_length(p) - 70, &err));
    CHECK_OK(kvgen_session_prefill(p, t + 160, 25, NULL, &err));
    if (before) memcpy(before, kvgen_session_logits(p), (size_t)V * sizeof *before);
    CHECK_OK(kvgen_session_rewind(p, 12, &err));
    CHECK_OK(kvgen_session_prefill(p, t + 173, 12, NULL, &err));
    double d = before ? tu_rel_diff(kvgen_session_logits(p), before, (size_t)V) : INFINITY;
    CHECKF(d == 0.0, "rewind: logits %.3g from the same tokens without the detour", d);
    free(before);
    kvgen_session_close(p);
}

/* A context shift re-rotates the kept keys in the pages (dequantize, rotate, quantize): the first
 * layer's keys within two quantization steps of the largest key of those a recomputation at the
 * new positions stores, the logits within the type's tolerance of the same shift on f16 pages. */
static void test_shift(kvgen_model *m, kvgen_model *f16) {
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
    CHECKF(ci.shifts == 1 && ci.length == 37, "shift: %zu shifts, length %zu", ci.shifts, ci.length);
    kvgen_session_desc od = {.n_ctx = 64, .no_prefix_reuse = 1};
    o = tu_open_session(m, &od);
    if (!o) goto done;
    CHECK_OK(kvgen_session_prefill(o, kvgen_session_tokens(s), ci.length, NULL, &err));
    size_t nf = (size_t)ci.n_head_kv * ci.length * (size_t)ci.head_dim;
    float *a = malloc(nf * sizeof *a), *b = malloc(nf * sizeof *b);
    if (a && b) {
        CHECK_OK(kvgen_session_read_cache(s, 0, 0, a, nf, &err));
        CHECK_OK(kvgen_session_read_cache(o, 0, 0, b, nf, &err));
        double d = 0.0, amax = 0.0;
        for (size_t i = 0; i < nf; i++) {
            d = fmax(d, fabs((double)a[i] - b[i]));
            amax = fmax(amax, fabs((double)b[i]));
        }
        double step = amax / (qi ? 8.0 : 127.0);
        printf("shift: re-rotated keys within %.2f steps of the recomputed ones\n", d / step);
        CHECKF(d <= 2.0 * step, "shift: layer 0 keys %.3g from the recomputation (step %.3g)", d, step);
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
        printf("shift: logits within %.4f of the range of the same shift on f16 pages\n", d);
        CHECKF(d <= TOL[qi], "shift: logits %.3g of the range from the same shift on f16 pages", d);
        kvgen_session_close(h);
    }
    for (int i = 0; i < 60; i++) CHECK_OK(kvgen_session_decode(s, t[i], &err));
    CHECK(kvgen_session_length(s) <= 64);
done:
    kvgen_session_close(o);
    kvgen_session_close(s);
}

/* A session saved from block pages holds the dequantized K/V as f32: restored into Vulkan pages
 * of the type it is the same pages (the same next logits), into the cpu backend's within
 * the backends' difference */
static void test_save_restore(kvgen_model *vq, kvgen_model *cq) {
    kvgen_error err = {0};
    int V = tu_vocab(vq);
    int32_t t[90];
    tu_fill_tokens(t, 90, 17, V);
    char *file = tu_tmpfile("vk_kv_types.session");
    kvgen_session *s = tu_open_session(vq, NULL), *r = NULL;
    if (!file || !s) goto done;
    CHECK_OK(kvgen_session_prefill(s, t, 80, NULL, &err));
    CHECK_OK(kvgen_session_save(s, file, &err));
    CHECK_OK(kvgen_session_decode(s, t[80], &err));
    kvgen_model *into[2] = {vq, cq};
    const double tol[2] = {0.0, TOL[qi]};
    for (int k = 0; k < 2; k++) {
        CHECK_OK(kvgen_session_restore(into[k], file, &r, &err));
        if (!r) continue;
        CHECK_OK(kvgen_session_decode(r, t[80], &err));
        double d = tu_rel_diff(kvgen_session_logits(r), kvgen_session_logits(s), (size_t)V);
        printf("saved from vulkan %s, restored into %s %s: next logits within %.4f\n", QTYPES[qi],
               k ? "cpu" : "vulkan", QTYPES[qi], d);
        CHECKF(d <= tol[k], "restored into %s: next logits %.4g of the range apart", k ? "cpu" : "vulkan", d);
        kvgen_session_close(r);
        r = NULL;
    }
done:
    kvgen_session_close(s);
    free(file);
}

/* every slab holds 2 pages (a forced small maxStorageBufferRange): the pool of 16 spans all 8
 * buffers, so the kernels' slab switch (and the atomics of the shared words) run on every slab */
static void test_slabs(const char *path, kvgen_model *f16) {
    kvgen_model_desc d = {.path = path, .backend = KVGEN_BACKEND_VULKAN, .kv_type = QTYPES[qi],
                          .kv_pool_tokens = 16 * 32};
    if (!tu_two_page_slabs(&d)) return;
    kvgen_model *m = tu_load(&d);
    if (m) {
        kvgen_pool_info pi;
        kvgen_model_pool_info(m, &pi);
        CHECK(pi.pages_total == 16);
        test_fork_rewind(m);
        test_shift(m, f16);
        CHECK(kvg_vk_validation_count(kvg_vk_model_ctx(m)) == 0);
        kvgen_model_unload(m);
    }
    unsetenv("KVGEN_VK_MAX_PART");
}

static void test_models(void) {
    /* grouped-query attention, head_dim 32 (34-byte rows) */
    char *gqa = tu_make_model("vk-kv-gqa.gguf", "--seed 41 --layers 2 --embd 128 --ff 192 --heads 4 --kv-heads 2 "
                                                "--ctx 1024");
    /* local layers with a window of 16, neox RoPE, Q/K norms (the heads op writes the raw K|V) */
    char *swa = tu_make_model("vk-kv-swa.gguf", "--arch gemma3 --qk-norm --post-norms --swa 16 --layers 4 --embd 64 "
                                                "--heads 4 --kv-heads 2 --head-dim 32 --ff 96 --ctx 1024 --seed 43");
    /* head_dim 64 */
    char *wide = tu_make_model("vk-kv-wide.gguf", "--seed 47 --layers 2 --embd 128 --ff 192 --heads 2 --kv-heads 1 "
                                                  "--ctx 1024");
    CHECK(gqa && swa && wide);
    if (!gqa || !swa || !wide) return;
    test_logits(gqa, "gqa");
    test_logits(swa, "swa");
    test_logits(wide, "head_dim 64");
    test_bytes(gqa);
    kvgen_model *vq = tu_load_kv(gqa, QTYPES[qi], KVGEN_BACKEND_VULKAN);
    kvgen_model *vh = tu_load_kv(gqa, "f16", KVGEN_BACKEND_VULKAN);
    kvgen_model *cq = tu_load_kv(gqa, QTYPES[qi], KVGEN_BACKEND_CPU);
    if (vq && vh && cq) {
        test_fork_rewind(vq);
        test_shift(vq, vh);
        test_save_restore(vq, cq);
        CHECK(kvg_vk_validation_count(kvg_vk_model_ctx(vq)) == 0);
        test_slabs(gqa, vh);
    }
    kvgen_model_unload(vq);
    kvgen_model_unload(vh);
    kvgen_model_unload(cq);
    free(gqa);
    free(swa);
    free(wide);
}

int main(void) {
    int n_dev = 0;
    kvgen_error err = {0};
    if (kvgen_devices(NULL, 0, &n_dev, &err) != KVGEN_OK || n_dev == 0) tu_skip("no Vulkan device");
    kvg_vk_ctx_desc d = {0};
    kvg_vk_ctx *ctx = NULL;
    kvgen_status st = kvg_vk_ctx_create(&d, &ctx, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    if (st != KVGEN_OK) return tu_finish("test_vk_kv_types");
    /* head_dim 32 (34- and 18-byte rows: every other row starts at 2 mod 4), 64, 96, 128; pages
     * of 1 (a page per position), 7, 16 and 32, shuffled over spare pages; prefill and decode,
     * split and not */
    for (qi = 0; qi < 2; qi++) {
        kvg_vk_layout last = ctx->info.subgroup_arithmetic ? KVG_VK_LAYOUT_SUBGROUP : KVG_VK_LAYOUT_LANE;
        for (kvg_vk_layout l = KVG_VK_LAYOUT_COOP; l <= last; l++) { /* SUBGROUP: attn_sg */
            int P = l == KVG_VK_LAYOUT_LANE ? 32 : 16;
            check_attention(ctx, 6, 2, 64, 0, 37, 1, l, P, true);   /* prefill from empty */
            check_attention(ctx, 6, 2, 64, 100, 5, 1, l, P, true);  /* prefill after a cached prefix */
            check_attention(ctx, 8, 1, 32, 77, 1, 8, l, P, true);   /* decode, split, 8 query heads per KV head */
            check_attention(ctx, 4, 4, 32, 40, 3, 1, l, 1, true);   /* a page per position */
            check_attention(ctx, 9, 3, 64, 300, 1, 8, l, P, false); /* decode, the table in order */
            check_attention(ctx, 4, 2, 128, 33, 20, 1, l, P, true); /* head_dim 128 */
        }
        check_attention(ctx, 4, 2, 96, 50, 1, 1, KVG_VK_LAYOUT_LANE, 7, true); /* head_dim 96: 3 blocks; pages of 7 */
    }
    CHECKF(kvg_vk_validation_count(ctx) == 0, "%d validation messages", kvg_vk_validation_count(ctx));
    kvg_vk_ctx_destroy(ctx);
    for (qi = 0; qi < 2; qi++) test_models();
    for (int i = 0; i < 2; i++)
        printf("%s pages: worst |vulkan - double on the dequantized K/V| %.3g (tolerance 2e-4); "
               "against the unquantized K/V %.3g\n", QTYPES[i], worst_q[i], worst_f32[i]);
    return tu_finish("test_vk_kv_types");
}
