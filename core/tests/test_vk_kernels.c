/* test_vk_kernels.c: each Vulkan kernel against a CPU computation in double on random inputs of
 * awkward sizes (odd row counts, rows not a multiple of 32, reduction lengths and contexts past
 * 65,535 so a shader loop that lavapipe would silently cut short shows), on the fp16-KV path and
 * the forced-f32 path, with both mat-vec layouts (cooperative, and rows per lane with the
 * inputs read through uniform windows where they fit) and both attention kernels (cooperative,
 * and attn_lane.comp for CPU devices: one invocation per token, KV head and position range)
 * reading the paged KV pool: pages of 1-256 positions, tables in order and shuffled over a pool
 * with spare pages, every slot outside the session NaN. Every weight type of the Vulkan table
 * (the K types with K = 256 n, n odd) runs the decode mat-vec (1, 3, 8 tokens), the GEMM and the
 * lane mat-vec over 8-token groups, and the embedding lookup (against the CPU's dequantization,
 * with a scale, the matrix split into parts); the worst error per type is printed. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kvg_model.h"
#include "kvg_quant.h"
#include "kvg_vk.h"
#include "testutil.h"

static uint64_t rng = 0x12345678ull;
/* KVGEN_TEST_TRACE=1: each case is named on stderr before it runs and timed after, so a case
 * that never finishes (a driver spinning in a dispatch or a compile) is the last line */
static double trace_t0;
static int trace_on(void) {
    static int on = -1;
    if (on < 0) on = getenv("KVGEN_TEST_TRACE") && *getenv("KVGEN_TEST_TRACE") && strcmp(getenv("KVGEN_TEST_TRACE"), "0");
    return on;
}
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
#define TRACE_BEGIN(...)                                                                                               \
    do {                                                                                                               \
        if (trace_on()) {                                                                                              \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fflush(stderr);                                                                                            \
            trace_t0 = now_s();                                                                                        \
        }                                                                                                              \
    } while (0)
#define TRACE_END()                                                                                                    \
    do {                                                                                                               \
        if (trace_on()) fprintf(stderr, " %.2f s\n", now_s() - trace_t0);                                             \
    } while (0)

/* KVGEN_TEST_TYPES=F32,Q4_K: only those weight types' mat-mul and embedding cases (a first
 * look on a driver that compiles slowly); unset: every type */
static int type_wanted(uint32_t type) {
    const char *list = getenv("KVGEN_TEST_TYPES"), *name = kvg_type_name(type);
    if (!list || !*list) return 1;
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
    return 0;
}

static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static const uint32_t types[] = {KVG_TYPE_F32,  KVG_TYPE_F16,  KVG_TYPE_BF16,   KVG_TYPE_Q8_0, KVG_TYPE_Q4_0,
                                 KVG_TYPE_Q4_1, KVG_TYPE_Q5_0, KVG_TYPE_Q5_1,   KVG_TYPE_IQ4_NL, KVG_TYPE_Q4_K,
                                 KVG_TYPE_Q5_K, KVG_TYPE_Q6_K, KVG_TYPE_Q2_K,   KVG_TYPE_Q3_K, KVG_TYPE_IQ4_XS};
#define N_TYPES (sizeof types / sizeof types[0])
/* per type: the worst |vulkan - double| / sum |w x| over every mat-mul case (printed at the end) */
static double worst_rel[N_TYPES];
/* the same over the integer-dot mat-vec's and GEMM's cases, against the quantized input */
static double worst_dot;
/* the same over the f16-tile GEMM's cases (gemm_h) */
static double worst_half, worst_matrix;
static int matrix_cases; /* cooperative-matrix GEMM cases run */
/* the inputs' amplitude: uniform in [-x_amp, x_amp) */
static float x_amp = 2.0f;
static int type_index(uint32_t type) {
    for (size_t i = 0; i < N_TYPES; i++)
        if (types[i] == type) return (int)i;
    return 0;
}

/* tolerance: f32 accumulation over K terms, relative to sum |w x| */
static void check_matmul(kvg_vk_ctx *ctx, uint32_t type, uint32_t rows, uint32_t K, uint32_t ncols, bool norm, int epi,
                         kvg_vk_layout layout) {
    if (!type_wanted(type)) return;
    size_t rb = kvg_row_bytes(type, K);
    uint8_t *w = malloc(rb * rows);
    float *row = malloc(sizeof(float) * K), *x = malloc(sizeof(float) * K * ncols), *g = malloc(sizeof(float) * K);
    float *deq = malloc(sizeof(float) * K * rows);
    uint32_t out_rows = epi == 3 ? rows / 2 : rows;
    float *y = malloc(sizeof(float) * out_rows * ncols), *y0 = malloc(sizeof(float) * out_rows * ncols);
    for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t k = 0; k < K; k++) row[k] = frand() * 0.5f;
        kvg_quantize_row(type, row, w + rb * r, K);
        kvg_dequantize_row(type, w + rb * r, deq + (size_t)K * r, K);
    }
    for (size_t i = 0; i < (size_t)K * ncols; i++) x[i] = frand() * x_amp;
    for (uint32_t k = 0; k < K; k++) g[k] = 0.5f + frand() * 0.25f;
    for (size_t i = 0; i < (size_t)out_rows * ncols; i++) y[i] = y0[i] = frand();
    kvgen_error err = {0};
    TRACE_BEGIN("matmul %s rows %u K %u ncols %u norm %d epi %d %s:", kvg_type_name(type), rows, K, ncols, norm,
                epi, kvg_vk_layout_name(layout));
    kvgen_status st = kvg_vk_test_matmul(ctx, type, w, rows, K, x, ncols, norm ? g : NULL, 1e-5f, epi, layout, y, &err);
    TRACE_END();
    CHECKF(st == KVGEN_OK, "%s", err.message);
    int bad = 0;
    double worst = 0;
    bool dot = layout == KVG_VK_LAYOUT_DOT; /* the mat-vec (1 or a batch's 2-8 tokens) or the GEMM */
    /* the GEMM's f16 tiles (gemm_h): each weight and each input (times 1/16) rounded to f16, by
     * round to nearest or toward zero (2^-10 relative each, the products' sum then within
     * 2.1e-3 of sum |w x|); a value below f16's normals, if the driver flushes it, is off by
     * 2^-14 (an input by 16 x 2^-14) at most */
    bool matrix = layout == KVG_VK_LAYOUT_MATRIX; /* cooperative matrices: f16 operands as gemm_h */
    bool half = layout == KVG_VK_LAYOUT_HALF || matrix;
    if (matrix) matrix_cases++;
    double rel_tol = half ? 2.1e-3 : 2e-5;
    float *xq = malloc(sizeof(float) * K);
    for (uint32_t c = 0; c < ncols && st == KVGEN_OK; c++) {
        const float *xc = x + (size_t)c * K;
        double scale = 1.0;
        if (norm) {
            double ss = 0;
            for (uint32_t k = 0; k < K; k++) ss += (double)xc[k] * xc[k];
            scale = 1.0 / sqrt(ss / K + 1e-5);
        }
        /* the integer-dot mat-vec and GEMM multiply by the input (times the norm's weight)
         * quantized per 32 elements: the largest magnitude to 127, rounded to even, in f32 as the
         * shaders do. Their f32 division may round 127 / max differently (2.5 ulp on a GPU),
         * moving an element that sits at a rounding boundary by a step: slack of two steps
         * times the row's largest weight */
        double dq_step = 0;
        for (uint32_t k = 0; k < K; k++) xq[k] = norm ? xc[k] * g[k] : xc[k];
        for (uint32_t b = 0; dot && b < K / 32; b++) {
            float amax = 0;
            for (uint32_t i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xq[b * 32 + i]));
            float ix = amax > 0 ? 127.0f / amax : 0.0f, dx = amax / 127.0f;
            for (uint32_t i = 0; i < 32; i++) xq[b * 32 + i] = rintf(xq[b * 32 + i] * ix) * dx;
            if (dx * scale > dq_step) dq_step = dx * scale;
        }
        double dots[2], mags[2], slack[2];
        for (uint32_t r = 0; r < rows; r++) {
            double d = 0, mag = 0, wmax = 0, flush = 0;
            for (uint32_t k = 0; k < K; k++) {
                double xv = dot ? (double)xq[k] * scale : xc[k] * (norm ? scale * g[k] : 1.0);
                double wv = deq[(size_t)K * r + k];
                d += wv * xv;
                mag += fabs(wv * xv);
                wmax = fmax(wmax, fabs(wv));
                if (half && fabs(wv) < 0x1p-14) flush += 0x1p-14 * fabs(xv);
                if (half && fabs(xv) < 0x1p-10) flush += 0x1p-10 * fabs(wv);
            }
            slack[r & 1] = 2 * wmax * dq_step + flush;
            double want, tol;
            size_t oi;
            if (epi == 3) {
                dots[r & 1] = d;
                mags[r & 1] = mag;
                if (!(r & 1)) continue;
                double gt = dots[0], up = dots[1];
                want = gt / (1.0 + exp(-gt)) * up;
                tol = rel_tol * (mags[0] * (fabs(up) + 1) + mags[1] * (fabs(gt) + 1)) + 1e-5 +
                      slack[0] * (fabs(up) + 1) + slack[1] * (fabs(gt) + 1);
                oi = (size_t)c * out_rows + r / 2;
            } else {
                oi = (size_t)c * out_rows + r;
                want = d + (epi == 1 ? y0[oi] : 0.0);
                tol = rel_tol * mag + 1e-5 + slack[r & 1];
            }
            double diff = fabs(y[oi] - want);
            if (diff > worst) worst = diff;
            double rel = diff / (epi == 3 ? mags[0] * (fabs(dots[1]) + 1) + mags[1] * (fabs(dots[0]) + 1) : mag);
            if (dot && rel > worst_dot) worst_dot = rel;
            if (half && !matrix && rel > worst_half) worst_half = rel;
            if (matrix && rel > worst_matrix) worst_matrix = rel;
            if (!dot && !half && rel > worst_rel[type_index(type)]) worst_rel[type_index(type)] = rel;
            if (!(diff <= tol) && bad++ < 3)
                fprintf(stderr, "  type %s rows %u K %u ncols %u norm %d epi %d %s: [%u][%zu] got %g want %g\n",
                        kvg_type_name(type), rows, K, ncols, norm, epi, kvg_vk_layout_name(layout), c, oi, y[oi], want);
        }
    }
    CHECKF(bad == 0, "matmul %s rows %u K %u ncols %u norm %d epi %d %s: %d wrong (worst |d| %g)",
           kvg_type_name(type), rows, K, ncols, norm, epi, kvg_vk_layout_name(layout), bad, worst);
    free(w); free(row); free(x); free(g); free(deq); free(y); free(y0); free(xq);
}

/* the embedding lookup: rows tokens[i] of a random matrix, times scale, against the CPU's
 * dequantization; the matrix split into parts of `part` bytes (0: one part) */
static double worst_embed;
static void check_embed(kvg_vk_ctx *ctx, uint32_t type, uint32_t rows, uint32_t K, float scale, size_t part) {
    if (!type_wanted(type)) return;
    size_t rb = kvg_row_bytes(type, K);
    uint8_t *w = malloc(rb * rows);
    float *row = malloc(sizeof(float) * K), *deq = malloc(sizeof(float) * K * rows);
    for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t k = 0; k < K; k++) row[k] = frand() * (0.5f + (float)(r % 7));
        kvg_quantize_row(type, row, w + rb * r, K);
        kvg_dequantize_row(type, w + rb * r, deq + (size_t)K * r, K);
    }
    int32_t tok[11] = {0, (int32_t)rows - 1, 5 % rows, 1 % rows, (int32_t)(rows / 2), 0, (int32_t)(rows * 7 / 8),
                       (int32_t)(rows / 3), 2 % rows, (int32_t)rows - 2, (int32_t)(rows / 5)};
    uint32_t n = 11;
    float *out = malloc(sizeof(float) * K * n);
    char env[32];
    if (part) {
        snprintf(env, sizeof env, "%zu", part);
        setenv("KVGEN_VK_MAX_PART", env, 1);
    }
    kvgen_error err = {0};
    TRACE_BEGIN("embed %s rows %u K %u part %zu:", kvg_type_name(type), rows, K, part);
    kvgen_status st = kvg_vk_test_embed(ctx, type, w, rows, K, tok, n, scale, out, &err);
    TRACE_END();
    if (part) unsetenv("KVGEN_VK_MAX_PART");
    CHECKF(st == KVGEN_OK, "%s", err.message);
    int bad = 0;
    for (uint32_t i = 0; i < n && st == KVGEN_OK; i++) {
        const float *d = deq + (size_t)K * (uint32_t)tok[i];
        double mx = 0;
        for (uint32_t k = 0; k < K; k++) mx = fmax(mx, fabs(d[k]));
        for (uint32_t k = 0; k < K; k++) {
            double want = (double)d[k] * scale, diff = fabs(out[(size_t)i * K + k] - want);
            /* one rounding of the scale, and fused or unfused q * d - m */
            double tol = 1e-6 * (fabs(want) + mx * scale) + 1e-30;
            if (mx > 0 && diff / (mx * scale) > worst_embed) worst_embed = diff / (mx * scale);
            if (!(diff <= tol) && bad++ < 3)
                fprintf(stderr, "  embed %s row %d [%u]: got %g want %g\n", kvg_type_name(type), tok[i], k,
                        out[(size_t)i * K + k], want);
        }
    }
    CHECKF(bad == 0, "embed %s rows %u K %u scale %g part %zu: %d wrong", kvg_type_name(type), rows, K, scale, part,
           bad);
    free(w); free(row); free(deq); free(out);
}

static void check_embed_all(kvg_vk_ctx *ctx) {
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t t = types[ti];
        uint32_t K = kvg_type_block_elems(t) == 256 ? 768 : 96;
        check_embed(ctx, t, 301, K, 1.0f, 0);
        check_embed(ctx, t, 37, 2 * K, 27.7128f, 0); /* gemma: sqrt(n_embd) */
        /* parts of 64 rows: tokens in every part, and a part holding none */
        check_embed(ctx, t, 301, K, 1.0f, kvg_row_bytes(t, K) * 70);
    }
    check_embed(ctx, KVG_TYPE_F16, 10, 70, 2.0f, 0); /* a row that is not whole 32-blocks */
    printf("embedding: worst |vulkan - CPU| / max|row| %.3g\n", worst_embed);
}

static float round_kv(const kvg_vk_ctx *ctx, float v) { return ctx->kv_f16 ? kvg_f16_to_f32(kvg_f32_to_f16(v)) : v; }

/* page: positions per KV page; shuffle: the session's pages in a pseudo-random order */
static void check_attention(kvg_vk_ctx *ctx, int n_head, int n_kv, int hd, int pos0, int ncols, int nsplit,
                            kvg_vk_layout layout, int page, bool shuffle) {
    int n_ctx = pos0 + ncols + 3;
    size_t nkv = (size_t)n_kv * n_ctx * hd, nq = (size_t)ncols * n_head * hd;
    float *k = malloc(nkv * 4), *v = malloc(nkv * 4), *q = malloc(nq * 4), *out = malloc(nq * 4);
    for (size_t i = 0; i < nkv; i++) {
        k[i] = frand();
        v[i] = frand();
    }
    for (size_t i = 0; i < nq; i++) q[i] = frand() * 2.0f;
    kvgen_error err = {0};
    TRACE_BEGIN("attention heads %d/%d hd %d pos0 %d ncols %d nsplit %d %s page %d:", n_head, n_kv, hd, pos0,
                ncols, nsplit, kvg_vk_layout_name(layout), page);
    kvgen_status st = kvg_vk_test_attention(ctx, n_head, n_kv, hd, n_ctx, pos0, ncols, nsplit, layout, page, shuffle,
                                            0, q, k, v, out, &err);
    TRACE_END();
    CHECKF(st == KVGEN_OK, "%s", err.message);
    int bad = 0;
    double worst = 0;
    double *s = malloc(sizeof(double) * (size_t)(pos0 + ncols));
    int G = n_head / n_kv;
    for (int t = 0; t < ncols && st == KVGEN_OK; t++) {
        int len = pos0 + t + 1;
        for (int h = 0; h < n_head; h++) {
            const float *qh = q + ((size_t)t * n_head + h) * hd;
            int kvh = h / G;
            double mx = -1e300, sum = 0;
            for (int p = 0; p < len; p++) {
                const float *kp = k + ((size_t)kvh * n_ctx + p) * hd;
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)qh[e] * round_kv(ctx, kp[e]);
                s[p] = d / sqrt((double)hd);
                if (s[p] > mx) mx = s[p];
            }
            for (int p = 0; p < len; p++) sum += (s[p] = exp(s[p] - mx));
            for (int e = 0; e < hd; e++) {
                double o = 0;
                for (int p = 0; p < len; p++) o += s[p] * round_kv(ctx, v[((size_t)kvh * n_ctx + p) * hd + e]);
                o /= sum;
                double got = out[((size_t)t * n_head + h) * hd + e];
                double diff = fabs(got - o);
                if (diff > worst) worst = diff;
                if (!(diff <= 2e-4) && bad++ < 3)
                    fprintf(stderr, "  attn t %d h %d e %d: got %g want %g\n", t, h, e, got, o);
            }
        }
    }
    CHECKF(bad == 0,
           "attention heads %d/%d hd %d pos0 %d ncols %d nsplit %d %s page %d shuffle %d kv_f16 %d: %d wrong "
           "(worst %g)",
           n_head, n_kv, hd, pos0, ncols, nsplit, kvg_vk_layout_name(layout), page, shuffle, ctx->kv_f16, bad, worst);
    free(s); free(k); free(v); free(q); free(out);
}

static void run_all(kvg_vk_ctx *ctx) {
    bool subgroups = ctx->info.subgroup_arithmetic;
    const kvg_vk_layout DEV = KVG_VK_LAYOUT_DEVICE, COOP = KVG_VK_LAYOUT_COOP, LANE = KVG_VK_LAYOUT_LANE,
                        SG = KVG_VK_LAYOUT_SUBGROUP, SG1 = KVG_VK_LAYOUT_SUBGROUP_ONE;
    kvg_vk_layout last = subgroups ? SG : LANE; /* the layouts this device runs: COOP..last */
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t t = types[ti];
        if (kvg_type_block_elems(t) == 256) {
            /* 256-element super-blocks: K = 256 n with n odd (a workgroup's rows never a
             * multiple of the row count), each row's scale headers read per super-block */
            for (kvg_vk_layout l = COOP; l <= LANE; l++) {
                check_matmul(ctx, t, 37, 1280, 1, true, 0, l);
                check_matmul(ctx, t, 38, 768, 3, false, 3, l);
                check_matmul(ctx, t, 21, 256, 8, false, 1, l);
                check_matmul(ctx, t, 75, 1280, 45, true, 0, l);
                check_matmul(ctx, t, 130, 256, 33, false, 3, l);
                check_matmul(ctx, t, 65, 768, 9, false, 1, l);
            }
            check_matmul(ctx, t, 22, 2304, 17, true, 0, LANE); /* 8 tokens exceed one 64 KiB window */
            /* the cooperative mat-vec with subgroup reductions, in 64-invocation workgroups
             * (SG) and in one subgroup per workgroup (SG1) */
            for (kvg_vk_layout l = SG; subgroups && l <= SG1; l++) {
                check_matmul(ctx, t, 37, 1280, 1, true, 0, l);
                check_matmul(ctx, t, 38, 768, 3, false, 3, l);
                check_matmul(ctx, t, 21, 256, 8, false, 1, l);
            }
            continue;
        }
        /* decode: the cooperative mat-vec (COOP; SG, SG1: its subgroup reductions) and the lane one */
        for (kvg_vk_layout l = COOP; l <= (subgroups ? SG1 : last); l++) {
            check_matmul(ctx, t, 37, 1536 + 32, 1, true, 0, l);
            check_matmul(ctx, t, 38, 1536 + 32, 3, false, 3, l);
            check_matmul(ctx, t, 21, 256, 8, false, 1, l);
        }
        /* prefill: the tiled GEMM (COOP) and the lane mat-vec over 8-token groups (LANE):
         * partial row tiles, partial token groups, inputs through uniform windows and not */
        for (kvg_vk_layout l = COOP; l <= LANE; l++) {
            check_matmul(ctx, t, 75, 1536 + 32, 45, true, 0, l);
            check_matmul(ctx, t, 130, 96, 33, false, 3, l);
            check_matmul(ctx, t, 65, 64, 40, false, 1, l);
        }
        check_matmul(ctx, t, 22, 2048 + 64, 17, true, 0, LANE); /* 8 tokens exceed one 64 KiB window */
    }
    /* 8-bit activations by integer dot products, every integer type: the decode mat-vec (one
     * token, a batch's 3 and 8 tokens) and the prefill GEMM (partial row and token tiles), with
     * the norm, the SwiGLU pair epilogue and the residual add, and rows past 65,535 elements */
    bool dots = subgroups && ctx->int_dot;
    for (size_t ti = 0; dots && ti < N_TYPES; ti++) {
        uint32_t t = types[ti];
        if (t == KVG_TYPE_F32 || t == KVG_TYPE_F16 || t == KVG_TYPE_BF16) continue;
        uint32_t K = kvg_type_block_elems(t) == 256 ? 1280 : 1536 + 32;
        check_matmul(ctx, t, 37, K, 1, true, 0, KVG_VK_LAYOUT_DOT);
        check_matmul(ctx, t, 38, K, 1, false, 3, KVG_VK_LAYOUT_DOT);
        check_matmul(ctx, t, 21, 256, 1, false, 1, KVG_VK_LAYOUT_DOT);
        check_matmul(ctx, t, 40, K, 3, true, 3, KVG_VK_LAYOUT_DOT);
        check_matmul(ctx, t, 42, 256, 8, false, 1, KVG_VK_LAYOUT_DOT);
        check_matmul(ctx, t, 75, K, 45, true, 0, KVG_VK_LAYOUT_DOT);
        check_matmul(ctx, t, 130, 256, 33, false, 3, KVG_VK_LAYOUT_DOT);
        check_matmul(ctx, t, 65, 768, 9, false, 1, KVG_VK_LAYOUT_DOT);
    }
    if (dots) {
        check_matmul(ctx, KVG_TYPE_Q4_0, 6, 32 * 2101, 1, true, 0, KVG_VK_LAYOUT_DOT);
        check_matmul(ctx, KVG_TYPE_Q4_K, 6, 256 * 263, 1, true, 0, KVG_VK_LAYOUT_DOT);
        check_matmul(ctx, KVG_TYPE_Q6_K, 6, 256 * 263, 1, false, 0, KVG_VK_LAYOUT_DOT);
    }
    /* the prefill GEMM with f16 tiles in double-buffered shared memory (gemm_h, the GPUs'
     * choice), and the one on cooperative matrices (gemm_cm) where the device offers them
     * (Mesa's lavapipe emulates them from 25.1; scripts/vk_drivers.sh trixie): every type,
     * partial row and token tiles, the norm, the SwiGLU pair epilogue and the residual add, a
     * single block step, and rows of 1,200 blocks (38,400 elements: on lavapipe, whose loops
     * stop after 65,535 iterations, the GEMMs' rows stay below about 1,300 block steps) */
    const int tiled[] = {KVG_VK_LAYOUT_HALF, KVG_VK_LAYOUT_MATRIX};
    for (size_t li = 0; li < sizeof tiled / sizeof tiled[0]; li++) {
        int layout = tiled[li];
        if (layout == KVG_VK_LAYOUT_MATRIX && !ctx->coopmat) {
            printf("cooperative-matrix GEMM: not offered by %s (or not in this build); skipped\n", ctx->info.name);
            continue;
        }
        for (size_t ti = 0; ti < N_TYPES; ti++) {
            uint32_t t = types[ti];
            bool super = kvg_type_block_elems(t) == 256;
            check_matmul(ctx, t, 75, super ? 1280 : 1536 + 32, 45, true, 0, layout);
            check_matmul(ctx, t, 130, super ? 256 : 96, 33, false, 3, layout);
            check_matmul(ctx, t, 65, super ? 256 : 32, 40, false, 1, layout);
        }
        check_matmul(ctx, KVG_TYPE_Q4_0, 6, 32 * 1200, 10, true, 0, layout);
        check_matmul(ctx, KVG_TYPE_F16, 9, 70, 20, true, 0, layout);
        x_amp = 3e5f; /* inputs past f16's 65,504 (the tiles hold them times 1/16) */
        check_matmul(ctx, KVG_TYPE_Q8_0, 66, 96, 33, false, 1, layout);
        x_amp = 2.0f;
    }
    /* rows that are not whole 32-blocks (F32/F16 only) */
    check_matmul(ctx, KVG_TYPE_F32, 9, 100, 1, true, 0, COOP);
    check_matmul(ctx, KVG_TYPE_F16, 9, 70, 1, true, 0, LANE);
    check_matmul(ctx, KVG_TYPE_F16, 9, 70, 20, true, 0, DEV);
    /* a reduction longer than 65,535 elements */
    check_matmul(ctx, KVG_TYPE_Q4_1, 6, 32 * 2101, 1, true, 0, COOP);
    check_matmul(ctx, KVG_TYPE_Q8_0, 6, 32 * 2101, 1, false, 0, LANE);
    check_matmul(ctx, KVG_TYPE_Q4_0, 6, 32 * 2101, 10, true, 0, DEV);
    check_matmul(ctx, KVG_TYPE_Q5_0, 6, 32 * 2101, 1, true, 0, LANE);
    check_matmul(ctx, KVG_TYPE_Q4_K, 6, 256 * 263, 1, true, 0, COOP);
    check_matmul(ctx, KVG_TYPE_Q6_K, 6, 256 * 263, 1, false, 0, LANE);
    check_matmul(ctx, KVG_TYPE_Q3_K, 6, 256 * 263, 10, true, 0, DEV);
    if (subgroups) {
        check_matmul(ctx, KVG_TYPE_Q4_0, 6, 32 * 2101, 1, true, 0, SG);
        check_matmul(ctx, KVG_TYPE_F16, 9, 70, 5, true, 0, SG);
        check_matmul(ctx, KVG_TYPE_Q4_0, 6, 32 * 2101, 1, true, 0, SG1);
        check_matmul(ctx, KVG_TYPE_F16, 9, 70, 5, true, 0, SG1);
        check_matmul(ctx, KVG_TYPE_Q6_K, 6, 256 * 263, 8, true, 0, SG1);
    }

    /* both kernels: the cooperative one (COOP; SG: attn.comp's subgroup variant) and
     * attn_lane.comp for CPU devices (LANE), every case within 2e-4 of the CPU result on the
     * same rounded K/V, over shuffled pages of 16 (COOP, SG) and 32 (LANE) positions: every
     * span crosses pages, a tile of 64 several */
    for (kvg_vk_layout l = COOP; l <= last; l++) {
        int P = l == LANE ? 32 : 16;
        check_attention(ctx, 6, 2, 64, 0, 37, 1, l, P, true);    /* prefill from empty */
        check_attention(ctx, 6, 2, 64, 100, 5, 1, l, P, true);   /* prefill after a cached prefix */
        check_attention(ctx, 6, 2, 64, 5000, 3, 1, l, P, true);  /* prefill past 4096: split + reduce */
        check_attention(ctx, 4, 4, 80, 0, 1, 8, l, P, true);     /* decode, first token, split; no GQA */
        check_attention(ctx, 8, 1, 32, 77, 1, 8, l, P, true);    /* 8 query heads per KV head */
        check_attention(ctx, 9, 3, 64, 4999, 1, 8, l, P, true);  /* decode past 4096 */
        check_attention(ctx, 9, 3, 64, 4999, 1, 1, l, P, true);
        check_attention(ctx, 2, 1, 64, 70000, 1, 1, l, P, true); /* a context longer than 65,535 */
        check_attention(ctx, 2, 1, 64, 70000, 1, 8, l, P, true);
        /* the table in order over a pool without spare pages; a page per position; pages of 256
         * (a whole tile, and more, in one page) */
        check_attention(ctx, 6, 2, 64, 100, 5, 1, l, P, false);
        check_attention(ctx, 9, 3, 64, 4999, 1, 8, l, P, false);
        check_attention(ctx, 8, 1, 32, 77, 1, 8, l, 1, true);
        check_attention(ctx, 6, 2, 64, 700, 9, 1, l, 256, true);
        /* prefill query tiles (attn.comp: 8 / GQ tokens per workgroup): 8 tokens of one head
         * with a partial last tile, 4 of two heads at head_dim 128, two tiles over 2 splits */
        check_attention(ctx, 3, 3, 64, 30, 21, 1, l, P, true);
        check_attention(ctx, 4, 2, 128, 0, 13, 1, l, P, true);
        check_attention(ctx, 2, 2, 32, 5000, 11, 1, l, P, true);
    }
    /* attn_lane only: splits that are one lane each over a workgroup boundary (16 splits, 2
     * workgroups of 8), short contexts leaving most splits empty, a prefill chunk whose tokens
     * span two workgroups with uneven causal ends, head_dim 128 */
    check_attention(ctx, 9, 3, 64, 2047, 1, 16, LANE, 16, true);
    check_attention(ctx, 9, 3, 64, 40, 1, 16, LANE, 32, true);
    check_attention(ctx, 9, 3, 64, 500, 13, 1, LANE, 16, true);
    check_attention(ctx, 4, 2, 128, 33, 20, 1, LANE, 32, true);
    check_attention(ctx, 3, 3, 64, 9000, 9, 1, LANE, 16, true);     /* prefill, 3 splits of <= 4096 */
}

int main(void) {
    int n_dev = 0;
    kvgen_error err = {0};
    if (kvgen_devices(NULL, 0, &n_dev, &err) != KVGEN_OK || n_dev == 0) tu_skip("no Vulkan device");
    for (int force = 0; force <= 1; force++) {
        kvg_vk_ctx_desc d = {.force_f32 = force};
        kvg_vk_ctx *ctx = NULL;
        kvgen_status st = kvg_vk_ctx_create(&d, &ctx, &err);
        CHECKF(st == KVGEN_OK, "%s", err.message);
        if (st != KVGEN_OK) break;
        CHECK(ctx->kv_f16 == !force || getenv("KVGEN_FORCE_F32"));
        run_all(ctx);
        check_embed_all(ctx);
        /* where the device offers subgroup size control, the one-subgroup mat-vecs (run above,
         * with validation) require one full subgroup of the device's size; nothing else does */
        uint32_t spec[KVG_SPEC_COUNT] = {0}, sg = ctx->info.subgroup_size;
        spec[KVG_SPEC_WG] = sg;
        bool sg1 = kvg_vk_one_subgroup(ctx, "matvec_sg_q4_0", spec);
        CHECK(sg1 == ctx->sg_size_control);
        CHECK(!kvg_vk_one_subgroup(ctx, "matvec_q4_0", spec) && !kvg_vk_one_subgroup(ctx, "attn", spec));
        spec[KVG_SPEC_WG] = 2 * sg;
        CHECK(!kvg_vk_one_subgroup(ctx, "matvec_sg_q4_0", spec));
        if (!force)
            printf("subgroup size control: %s (sizes %u..%u); one-subgroup mat-vecs require full subgroups of %u: %s\n",
                   ctx->sg_size_control ? "on" : "off", ctx->sg_min, ctx->sg_max, sg, sg1 ? "yes" : "no");
        CHECKF(kvg_vk_validation_count(ctx) == 0, "%d validation messages", kvg_vk_validation_count(ctx));
        kvg_vk_ctx_destroy(ctx);
    }
    for (size_t i = 0; i < N_TYPES; i++)
        printf("mat-mul %-7s worst |vulkan - double| / sum|w x|: %.3g (tolerance 2e-5 + 1e-5 absolute)\n",
               kvg_type_name(types[i]), worst_rel[i]);
    printf("integer-dot mat-vec and GEMM worst |vulkan - double with the quantized input| / sum|w x|: %.3g "
           "(tolerance 2e-5 + 1e-5 absolute + two input steps)\n",
           worst_dot);
    printf("f16-tile GEMM worst |vulkan - double| / sum|w x|: %.3g (tolerance 2.1e-3 + 1e-5 absolute + f16 "
           "flushes)\n",
           worst_half);
    if (matrix_cases > 0)
        printf("cooperative-matrix GEMM (%d cases) worst |vulkan - double| / sum|w x|: %.3g (tolerance 2.1e-3 + "
               "1e-5 absolute + f16 flushes)\n",
               matrix_cases, worst_matrix);
    return tu_finish("test_vk_kernels");
}
