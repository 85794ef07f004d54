/* test_vk_kv_q8.c: the Vulkan backend's q8_0 K/V pages (blocks of 32 elements: an f16 scale and
 * 32 int8, 34 bytes, so rows start at any even byte). Both attention kernels (cooperative, and
 * attn_lane.comp for CPU devices) read a one-layer pool of q8_0 pages written through the pool's
 * own page writes (which quantize as the cpu backend does), every slot outside the session with
 * NaN scales; each output is compared, in double, with attention over the same K/V quantized
 * and dequantized on the host (tolerance 2e-4, as test_vk_kernels for f16 pages) and, as a
 * bound on what quantizing costs, over the unquantized K/V (printed). */
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

static double worst_q8, worst_f32;

/* rows of hd floats through q8_0 and back */
static void q8_round(float *x, size_t rows, int hd) {
    uint8_t blk[34 * 8];
    for (size_t r = 0; r < rows; r++) {
        kvg_quantize_row(KVG_TYPE_Q8_0, x + r * (size_t)hd, blk, (uint64_t)hd);
        kvg_dequantize_row(KVG_TYPE_Q8_0, blk, x + r * (size_t)hd, (uint64_t)hd);
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

static void check_attention(kvg_vk_ctx *ctx, int n_head, int n_kv, int hd, int pos0, int ncols, int nsplit, int lane,
                            int page, bool shuffle) {
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
    q8_round(kq, (size_t)n_kv * n_ctx, hd);
    q8_round(vq, (size_t)n_kv * n_ctx, hd);
    kvgen_error err = {0};
    kvgen_status st = kvg_vk_test_attention(ctx, n_head, n_kv, hd, n_ctx, pos0, ncols, nsplit, lane, page, shuffle,
                                            true, q, k, v, out, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    int bad = 0;
    for (int t = 0; t < ncols && st == KVGEN_OK; t++)
        for (int h = 0; h < n_head; h++) {
            attend(q, kq, vq, n_head, n_kv, hd, n_ctx, pos0 + t + 1, t, h, s, want);
            attend(q, k, v, n_head, n_kv, hd, n_ctx, pos0 + t + 1, t, h, s, exact);
            for (int e = 0; e < hd; e++) {
                double got = out[((size_t)t * n_head + h) * hd + e], diff = fabs(got - want[e]);
                if (diff > worst_q8) worst_q8 = diff;
                if (fabs(got - exact[e]) > worst_f32) worst_f32 = fabs(got - exact[e]);
                if (!(diff <= 2e-4) && bad++ < 3)
                    fprintf(stderr, "  attn t %d h %d e %d: got %g want %g\n", t, h, e, got, want[e]);
            }
        }
    CHECKF(bad == 0, "q8_0 attention heads %d/%d hd %d pos0 %d ncols %d nsplit %d lane %d page %d shuffle %d: %d wrong",
           n_head, n_kv, hd, pos0, ncols, nsplit, lane, page, shuffle, bad);
    free(k); free(v); free(kq); free(vq); free(q); free(out); free(s); free(want); free(exact);
}

int main(void) {
    int n_dev = 0;
    kvgen_error err = {0};
    if (kvgen_devices(NULL, 0, &n_dev, &err) != KVGEN_OK || n_dev == 0) tu_skip("no Vulkan device");
    kvg_vk_ctx_desc d = {0};
    kvg_vk_ctx *ctx = NULL;
    kvgen_status st = kvg_vk_ctx_create(&d, &ctx, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    if (st != KVGEN_OK) return tu_finish("test_vk_kv_q8");
    /* head_dim 32 (34-byte rows: every other row starts at 2 mod 4), 64, 128; pages of 1 (a
     * page per position), 16 and 32, shuffled over spare pages; prefill and decode, split and not */
    for (int lane = 0; lane <= 1; lane++) {
        int P = lane ? 32 : 16;
        check_attention(ctx, 6, 2, 64, 0, 37, 1, lane, P, true);   /* prefill from empty */
        check_attention(ctx, 6, 2, 64, 100, 5, 1, lane, P, true);  /* prefill after a cached prefix */
        check_attention(ctx, 8, 1, 32, 77, 1, 8, lane, P, true);   /* decode, split, 8 query heads per KV head */
        check_attention(ctx, 4, 4, 32, 40, 3, 1, lane, 1, true);   /* a page per position */
        check_attention(ctx, 9, 3, 64, 300, 1, 8, lane, P, false); /* decode, the table in order */
        check_attention(ctx, 4, 2, 128, 33, 20, 1, lane, P, true); /* head_dim 128 */
    }
    check_attention(ctx, 4, 2, 96, 50, 1, 1, 1, 7, true); /* head_dim 96: 3 blocks; pages of 7 */
    CHECKF(kvg_vk_validation_count(ctx) == 0, "%d validation messages", kvg_vk_validation_count(ctx));
    kvg_vk_ctx_destroy(ctx);
    printf("q8_0 pages: worst |vulkan - double on the dequantized K/V| %.3g (tolerance 2e-4); "
           "against the unquantized K/V %.3g\n", worst_q8, worst_f32);
    return tu_finish("test_vk_kv_q8");
}
