/* test_vk_lora.c: shaders/lora.comp (down: t = s A x, with and without the RMSNorm prologue;
 * up: the per-token delta B t at a mat-mul's rows) against kvg_lora_add on random adapters:
 * tokens with different sets (several adapters, none, the same adapter at two scales, alpha
 * set and not), a fused output (Q/K/V concatenated; gate/up interleaved), ranks above the
 * workgroup size; then again under the smallest limits kvgen allows (KVGEN_VK_MAX_GROUP_COUNT=3,
 * KVGEN_VK_MAX_SHARED=16384, KVGEN_VK_MAX_INVOCATIONS=128: every grid split into pieces).
 * Tolerance: 1e-5 absolute plus 1e-4 of the value. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_vk_backend.h"
#include "testutil.h"

enum { N_LAYER = 2, LAYER = 1 };

static uint64_t rng = 0x5eed1234ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

/* an adapter with pairs of `rank` for the given targets of LAYER (shapes n_in x n_out[t]) */
static kvgen_adapter *make_adapter(float alpha, int rank, const int *n_in, const int *n_out) {
    kvgen_adapter *a = calloc(1, sizeof *a);
    a->alpha = alpha;
    a->pairs = calloc(N_LAYER * KVG_LORA_TARGETS, sizeof *a->pairs);
    for (int t = 0; t < KVG_LORA_TARGETS; t++) {
        if (!n_out[t]) continue;
        kvg_lora_pair *p = &a->pairs[LAYER * KVG_LORA_TARGETS + t];
        p->rank = rank;
        p->n_in = n_in[t];
        p->n_out = n_out[t];
        p->a = malloc((size_t)rank * n_in[t] * sizeof(float));
        p->b = malloc((size_t)rank * n_out[t] * sizeof(float));
        for (int i = 0; i < rank * n_in[t]; i++) p->a[i] = 0.2f * frand();
        for (int i = 0; i < rank * n_out[t]; i++) p->b[i] = 0.2f * frand();
        a->n_pairs++;
    }
    /* another layer's pair, packed before LAYER's: offsets must skip it */
    kvg_lora_pair *p0 = &a->pairs[0];
    p0->rank = 3;
    p0->n_in = 5;
    p0->n_out = 7;
    p0->a = calloc(15, sizeof(float));
    p0->b = calloc(21, sizeof(float));
    return a;
}

static void free_adapter(kvgen_adapter *a) {
    for (int i = 0; i < N_LAYER * KVG_LORA_TARGETS; i++) {
        free(a->pairs[i].a);
        free(a->pairs[i].b);
    }
    free(a->pairs);
    free(a);
}

static double worst;

/* one mat-mul's parts for n tokens with sets[c] */
static void check(kvg_vk_ctx *ctx, const char *what, const kvg_lora_set *const *sets, uint32_t n,
                  const kvg_vk_lora_part *parts, int n_parts, uint32_t in_dim, bool norm, uint32_t nrows) {
    const float eps = 1e-5f;
    float *x = malloc((size_t)n * in_dim * sizeof *x), *xn = malloc((size_t)n * in_dim * sizeof *xn);
    float *w = malloc(in_dim * sizeof *w);
    float *got = malloc((size_t)n * nrows * sizeof *got), *want = calloc((size_t)n * nrows, sizeof *want);
    for (uint32_t i = 0; i < n * in_dim; i++) x[i] = frand();
    for (uint32_t i = 0; i < in_dim; i++) w[i] = 1.0f + 0.5f * frand();
    for (uint32_t c = 0; c < n; c++) {
        double ss = 0;
        for (uint32_t i = 0; i < in_dim; i++) ss += (double)x[c * in_dim + i] * x[c * in_dim + i];
        float scale = norm ? (float)(1.0 / sqrt(ss / in_dim + eps)) : 1.0f;
        for (uint32_t i = 0; i < in_dim; i++) {
            float v = x[c * in_dim + i];
            xn[c * in_dim + i] = norm ? v * scale * w[i] : v;
        }
    }
    for (int j = 0; j < n_parts; j++) {
        float *y = calloc((size_t)n * parts[j].n_out, sizeof *y);
        kvg_lora_add(sets, LAYER, parts[j].target, xn, (int)in_dim, (int)n, y, (int)parts[j].n_out);
        for (uint32_t c = 0; c < n; c++)
            for (uint32_t o = 0; o < parts[j].n_out; o++)
                want[c * nrows + parts[j].row0 + parts[j].stride * o] += y[c * parts[j].n_out + o];
        free(y);
    }
    kvgen_error err = {0};
    kvgen_status st = kvg_vk_test_lora(ctx, sets, n, N_LAYER, LAYER, parts, n_parts, x, in_dim, norm ? w : NULL, eps,
                                       nrows, got, &err);
    CHECKF(st == KVGEN_OK, "%s: %s", what, err.message);
    int bad = 0;
    for (uint32_t i = 0; st == KVGEN_OK && i < n * nrows; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d / (1e-5 + fabs(want[i])) > worst && fabs(want[i]) > 1e-3) worst = d / fabs(want[i]);
        if (d > 1e-5 + 1e-4 * fabs(want[i]) && bad++ < 5)
            fprintf(stderr, "  %s: token %u row %u: got %g want %g\n", what, i / nrows, i % nrows, got[i], want[i]);
    }
    CHECKF(bad == 0, "%s: %d values off", what, bad);
    free(x);
    free(xn);
    free(w);
    free(got);
    free(want);
}

static void run(kvg_vk_ctx *ctx);

int main(void) {
    int n_dev = 0;
    kvgen_error err = {0};
    if (kvgen_devices(NULL, 0, &n_dev, &err) != KVGEN_OK || n_dev == 0) tu_skip("no Vulkan device");
    for (int small = 0; small <= 1; small++) {
        if (small) {
            setenv("KVGEN_VK_MAX_GROUP_COUNT", "3", 1);
            setenv("KVGEN_VK_MAX_SHARED", "16384", 1);
            setenv("KVGEN_VK_MAX_INVOCATIONS", "128", 1);
        }
        kvg_vk_ctx_desc d = {0};
        kvg_vk_ctx *ctx = NULL;
        kvgen_status st = kvg_vk_ctx_create(&d, &ctx, &err);
        CHECKF(st == KVGEN_OK, "%s", err.message);
        if (st != KVGEN_OK) break;
        run(ctx);
        CHECKF(kvg_vk_validation_count(ctx) == 0, "%d validation messages", kvg_vk_validation_count(ctx));
        kvg_vk_ctx_destroy(ctx);
    }
    printf("lora: worst |vulkan - kvg_lora_add| / |value| %.3g (tolerance 1e-5 + 1e-4 |value|)\n", worst);
    return tu_finish("test_vk_lora");
}

static void run(kvg_vk_ctx *ctx) {

    /* a layer of n_embd 96, Q 96 rows, K/V 32, n_ff 80 */
    const int E = 96, Q = 96, KV = 32, F = 80;
    int n_in[KVG_LORA_TARGETS] = {E, E, E, Q, E, E, F};
    int all[KVG_LORA_TARGETS] = {Q, KV, KV, E, F, F, E};
    int qv_up[KVG_LORA_TARGETS] = {Q, 0, KV, 0, 0, F, 0};
    kvgen_adapter *a = make_adapter(16.0f, 8, n_in, all);   /* alpha 16, rank 8 */
    kvgen_adapter *b = make_adapter(0.0f, 3, n_in, qv_up);  /* no alpha */
    kvgen_adapter *c = make_adapter(4.0f, 70, n_in, all);   /* a rank above the workgroup size */
    kvg_lora_set s_a = {.n = 1, .adapter = {a}, .scale = {1.0f}};
    kvg_lora_set s_ab = {.n = 2, .adapter = {a, b}, .scale = {0.5f, -1.25f}};
    kvg_lora_set s_ba = {.n = 2, .adapter = {b, a}, .scale = {2.0f, 0.75f}};
    kvg_lora_set s_aa = {.n = 2, .adapter = {a, a}, .scale = {1.0f, 0.25f}};
    kvg_lora_set s_c = {.n = 1, .adapter = {c}, .scale = {1.0f}};
    kvg_lora_set s_cab = {.n = 3, .adapter = {c, a, b}, .scale = {0.3f, 1.0f, 1.0f}};
    const kvg_lora_set *sets[9] = {&s_a, NULL, &s_ab, &s_ba, &s_aa, &s_c, NULL, &s_cab, &s_a};

    kvg_vk_lora_part qkv[3] = {{KVG_LORA_Q, E, Q, 0, 1}, {KVG_LORA_K, E, KV, Q, 1}, {KVG_LORA_V, E, KV, Q + KV, 1}};
    kvg_vk_lora_part gu[2] = {{KVG_LORA_GATE, E, F, 0, 2}, {KVG_LORA_UP, E, F, 1, 2}};
    kvg_vk_lora_part o[1] = {{KVG_LORA_O, Q, E, 0, 1}};
    kvg_vk_lora_part down[1] = {{KVG_LORA_DOWN, F, E, 0, 1}};
    check(ctx, "qkv, normed", sets, 9, qkv, 3, E, true, Q + 2 * KV);
    check(ctx, "gate/up interleaved, normed", sets, 9, gu, 2, E, true, 2 * F);
    check(ctx, "wo", sets, 9, o, 1, Q, false, E);
    check(ctx, "down", sets, 9, down, 1, F, false, E);
    check(ctx, "one token", sets + 7, 1, qkv, 3, E, true, Q + 2 * KV);
    const kvg_lora_set *none[3] = {NULL, NULL, NULL};
    check(ctx, "no adapters", none, 3, qkv, 3, E, true, Q + 2 * KV);
    free_adapter(a);
    free_adapter(b);
    free_adapter(c);
}
