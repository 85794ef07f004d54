/* test_vk_sample.c: what sampling reads back from the device.
 *  - kernels: the device argmax and top-k (shaders/argmax.comp, topk.comp) against the CPU
 *    order (higher first, lowest id on ties, NaN as -inf) on vocabularies of awkward sizes
 *    (one value to 262,144; one chunk to many, the last one partial), with ties (also across
 *    chunks), NaN, -inf and -0;
 *  - sampler: kvg_sampler_sample_top on a bounded candidate set draws the same tokens as
 *    kvg_sampler_sample_ctx on the whole vector, seed for seed (top-k with min-p / top-p, bans
 *    leaving fewer than k tokens, ties);
 *  - whole model on Vulkan: greedy and seeded top-k token sequences through the device path
 *    (one id or 64 candidates read back) equal those with the whole vector read back
 *    (KVGEN_FULL_LOGITS=1), also with two sessions interleaving (kept logits set aside), and
 *    the lazily fetched logits equal the full path's; greedy equals the reference backend's;
 *  - the kernels again under lowered device limits (KVGEN_VK_MAX_*): smaller workgroups and
 *    dispatches split into pieces, the same exact results.
 * With KVGEN_VALIDATE=1 the validation layer must stay silent. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_sampler.h"
#include "kvg_vk.h"
#include "kvg_vk_select.h"
#include "testutil.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t urand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

/* values on a coarse grid (many ties), a few NaN, -inf, -0 and +0 */
static void fill(float *x, uint32_t n, int ties) {
    for (uint32_t i = 0; i < n; i++) {
        uint32_t r = urand();
        x[i] = ties ? (float)((int)(r % 64) - 32) * 0.25f : (float)((double)r / 2147483648.0 * 20.0 - 10.0);
        if (r % 97 == 0) x[i] = NAN;
        else if (r % 89 == 0) x[i] = -INFINITY;
        else if (r % 83 == 0) x[i] = -0.0f;
        else if (r % 79 == 0) x[i] = 0.0f;
    }
}

static int ord_cmp(const void *a, const void *b) {
    const kvg_candidate *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* the CPU's k best in the sampler's order (NaN as -inf) */
static void cpu_top(const float *x, uint32_t n, kvg_candidate *c) {
    for (uint32_t i = 0; i < n; i++) c[i] = (kvg_candidate){.id = (int32_t)i, .logit = isnan(x[i]) ? -INFINITY : x[i]};
    qsort(c, n, sizeof *c, ord_cmp);
}

static void check_select(kvg_vk_ctx *ctx, uint32_t n, int ties) {
    float *x = malloc(n * sizeof *x);
    kvg_candidate *c = malloc(n * sizeof *c);
    fill(x, n, ties);
    if (n > 700) x[n - 1] = 1e30f; /* the best in the last, partial chunk */
    cpu_top(x, n, c);
    int32_t ids[KVG_VK_TOPK];
    float vals[KVG_VK_TOPK];
    int got = 0;
    kvgen_error err = {0};
    kvgen_status st = kvg_vk_test_select(ctx, x, n, 1, 1, ids, NULL, &got, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    CHECKF(st != KVGEN_OK || (got == 1 && ids[0] == kvg_argmax(x, (int)n) && ids[0] == c[0].id),
           "argmax n %u: device %d, cpu %d", n, ids[0], kvg_argmax(x, (int)n));
    st = kvg_vk_test_select(ctx, x, n, 1, KVG_VK_TOPK, ids, vals, &got, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    int want = n < KVG_VK_TOPK ? (int)n : KVG_VK_TOPK, bad = 0;
    for (int i = 0; st == KVGEN_OK && i < got; i++)
        if (ids[i] != c[i].id || !(vals[i] == c[i].logit)) bad++; /* -0 comes back as +0: equal */
    CHECKF(st != KVGEN_OK || (got == want && bad == 0), "topk n %u ties %d: %d of %d differ", n, ties, bad, got);
    free(x);
    free(c);
}

/* A batch's rows in one submission (one row per sequence): each row's argmax and top-k equal
 * the CPU's for that row alone, exactly. */
static void check_select_rows(kvg_vk_ctx *ctx, uint32_t n, uint32_t rows) {
    float *x = malloc((size_t)n * rows * sizeof *x);
    kvg_candidate *c = malloc(n * sizeof *c);
    int32_t *ids = malloc((size_t)rows * KVG_VK_TOPK * sizeof *ids);
    float *vals = malloc((size_t)rows * KVG_VK_TOPK * sizeof *vals);
    for (uint32_t r = 0; r < rows; r++) fill(x + (size_t)r * n, n, (int)(r % 2));
    int got = 0, bad = 0;
    kvgen_error err = {0};
    kvgen_status st = kvg_vk_test_select(ctx, x, n, rows, 1, ids, NULL, &got, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    for (uint32_t r = 0; st == KVGEN_OK && r < rows; r++)
        bad += ids[(size_t)r * KVG_VK_TOPK] != kvg_argmax(x + (size_t)r * n, (int)n);
    CHECKF(bad == 0, "argmax over %u rows of %u: %d rows differ", rows, n, bad);
    st = kvg_vk_test_select(ctx, x, n, rows, KVG_VK_TOPK, ids, vals, &got, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    bad = 0;
    for (uint32_t r = 0; st == KVGEN_OK && r < rows; r++) {
        cpu_top(x + (size_t)r * n, n, c);
        for (int i = 0; i < got; i++)
            if (ids[(size_t)r * KVG_VK_TOPK + i] != c[i].id || !(vals[(size_t)r * KVG_VK_TOPK + i] == c[i].logit)) bad++;
    }
    CHECKF(bad == 0, "topk over %u rows of %u: %d entries differ", rows, n, bad);
    free(x);
    free(c);
    free(ids);
    free(vals);
}

/* Argmax across argmax.comp's chunks of 4,096 values (pass 0 per chunk, pass 1 merges): rows
 * whose maximum ties within and across chunks (the lowest index wins, wherever the chunks'
 * winners lie), a -0 / +0 tie, rows all -inf, all NaN, NaN before -inf, and the best in the
 * first or the last value; each row's id equals the CPU's (kvg_argmax) and the one expected. */
static void check_argmax_cases(kvg_vk_ctx *ctx, uint32_t n) {
    enum { ROWS = 8 };
    const uint32_t C = 4096; /* argmax.comp's CHUNK */
    float *x = malloc((size_t)n * ROWS * sizeof *x);
    int32_t want[ROWS], ids[ROWS * KVG_VK_TOPK];
    for (uint32_t r = 0; r < ROWS; r++) {
        float *row = x + (size_t)r * n;
        for (uint32_t i = 0; i < n; i++) row[i] = -1.0f - (float)(urand() % 1000) * 0.001f;
        uint32_t last = n - 1;
        switch (r) {
        case 0: { /* the maximum twice in chunk 1, late in it, again in later chunks at lower
                   * offsets (chunk 2's second value) and as the last value */
            uint32_t a = last;
            if (n > C) a = C + (n - C - 1 < C - 6 ? (n - C - 1) / 2 : C - 6);
            row[a] = row[last] = 3.0f;
            if (a + 1 < n) row[a + 1] = 3.0f;
            if (n > 2 * C + 1) row[2 * C + 1] = 3.0f;
            want[r] = (int32_t)a;
            break;
        }
        case 1: /* one value per chunk ties, at the same offset: the first chunk's wins */
            for (uint32_t i = 7 % n; i < n; i += C) row[i] = 2.5f;
            want[r] = (int32_t)(7 % n);
            break;
        case 2: /* -0 before +0 in a later chunk (and +0 after that): equal, the first wins */
            row[n / 3] = -0.0f;
            row[last] = 0.0f;
            if (n > C) row[n / 3 + C < last ? n / 3 + C : last] = 0.0f;
            want[r] = (int32_t)(n / 3);
            break;
        case 3: /* all -inf */
            for (uint32_t i = 0; i < n; i++) row[i] = -INFINITY;
            want[r] = 0;
            break;
        case 4: /* all NaN */
            for (uint32_t i = 0; i < n; i++) row[i] = NAN;
            want[r] = 0;
            break;
        case 5: /* NaN at the maximum's place and before it; -inf elsewhere: NaN never wins */
            for (uint32_t i = 0; i < n; i++) row[i] = i % 3 ? -INFINITY : NAN;
            want[r] = 0;
            break;
        case 6: /* the best is the first value, NaN in every later chunk's first value */
            row[0] = 1.0f;
            for (uint32_t i = C; i < n; i += C) row[i] = NAN;
            want[r] = 0;
            break;
        default: /* the best is the last value, the runner-up just before it */
            row[last] = 1e30f;
            if (last > 0) row[last - 1] = 1e29f;
            want[r] = (int32_t)last;
            break;
        }
    }
    int got = 0, bad = 0;
    kvgen_error err = {0};
    kvgen_status st = kvg_vk_test_select(ctx, x, n, ROWS, 1, ids, NULL, &got, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    for (uint32_t r = 0; st == KVGEN_OK && r < ROWS; r++) {
        int32_t dev = ids[(size_t)r * KVG_VK_TOPK], cpu = kvg_argmax(x + (size_t)r * n, (int)n);
        if (dev != cpu || dev != want[r]) {
            bad++;
            printf("argmax n %u row %u: device %d, cpu %d, expected %d\n", n, r, dev, cpu, want[r]);
        }
    }
    CHECKF(bad == 0, "argmax cases over %u values: %d rows differ", n, bad);
    free(x);
}

/* ---- the sampler on a bounded set ---- */

static void check_bounded(const kvgen_sampler_desc *d, int V, int ties, int bans) {
    kvg_sampler full, top;
    kvgen_error err = {0};
    CHECK_OK(kvg_sampler_init(&full, NULL, V, &err));
    CHECK_OK(kvg_sampler_init(&top, NULL, V, &err));
    CHECK_OK(kvg_sampler_set(&full, d, true, &err));
    CHECK_OK(kvg_sampler_set(&top, d, true, &err));
    float *x = malloc((size_t)V * sizeof *x);
    kvg_candidate *c = malloc((size_t)V * sizeof *c);
    int need = kvg_sampler_top_needed(&top, 0, false), same = 0, bounded = 0, steps = 200;
    CHECK(need > 0 && need <= KVG_SAMPLER_MAX_TOP);
    for (int step = 0; step < steps; step++) {
        fill(x, (uint32_t)V, ties);
        for (int i = 0; i < V; i++)
            if (bans && (urand() % 8 != 0 || i < 0)) x[i] = -INFINITY; /* few survivors: fewer than k */
        cpu_top(x, (uint32_t)V, c);
        int32_t ids[KVG_SAMPLER_MAX_TOP];
        float vals[KVG_SAMPLER_MAX_TOP];
        for (int i = 0; i < need; i++) {
            ids[i] = c[i].id;
            vals[i] = c[i].logit;
        }
        int32_t a = kvg_sampler_sample_ctx(&full, x, NULL, 0, NULL);
        int32_t b = kvg_sampler_sample_top(&top, ids, vals, need);
        if (b == KVG_SAMPLE_NEED_ALL) b = kvg_sampler_sample_ctx(&top, x, NULL, 0, NULL);
        else bounded++;
        same += a == b;
    }
    CHECKF(same == steps, "T %g top_k %d top_p %g min_p %g ties %d bans %d: %d of %d draws differ",
           (double)d->temperature, d->top_k, (double)d->top_p, (double)d->min_p, ties, bans, steps - same, steps);
    CHECK(bounded == steps); /* nothing here needs the whole vector */
    CHECK(memcmp(&full.rng, &top.rng, sizeof full.rng) == 0);
    free(x);
    free(c);
    kvg_sampler_free(&full);
    kvg_sampler_free(&top);
}

static void test_sampler_bounded(void) {
    kvgen_sampler_desc cfgs[] = {{.temperature = 0.8f, .top_k = 40, .seed = 3},
                                 {.temperature = 1.0f, .top_k = 1, .seed = 4},
                                 {.temperature = 0.7f, .top_k = 63, .top_p = 0.9f, .seed = 5},
                                 {.temperature = 1.3f, .top_k = 20, .min_p = 0.05f, .seed = 6},
                                 {.temperature = 0.5f, .top_k = 10, .min_p = 0.5f, .top_p = 0.5f, .seed = 7},
                                 {.temperature = 0.0f, .seed = 8}};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
        for (int ties = 0; ties <= 1; ties++)
            for (int bans = 0; bans <= 1; bans++) check_bounded(&cfgs[i], 1000, ties, bans);
    /* what needs the whole vector says so */
    kvg_sampler s;
    kvgen_error err = {0};
    CHECK_OK(kvg_sampler_init(&s, NULL, 100, &err));
    kvgen_sampler_desc d = {.temperature = 1.0f, .top_k = 64};
    CHECK_OK(kvg_sampler_set(&s, &d, true, &err));
    CHECK(kvg_sampler_top_needed(&s, 0, false) == 0); /* 65 candidates: more than a device selects */
    d = (kvgen_sampler_desc){.temperature = 1.0f, .top_p = 0.9f};
    CHECK_OK(kvg_sampler_set(&s, &d, true, &err));
    CHECK(kvg_sampler_top_needed(&s, 0, false) == 0);
    d = (kvgen_sampler_desc){.repeat_penalty = 1.3f};
    CHECK_OK(kvg_sampler_set(&s, &d, true, &err));
    CHECK(kvg_sampler_top_needed(&s, 0, false) == 1 && kvg_sampler_top_needed(&s, 5, false) == 0);
    CHECK(kvg_sampler_top_needed(&s, 0, true) == 0);
    kvgen_logit_bias b = {3, -INFINITY};
    d = (kvgen_sampler_desc){.bias = &b, .n_bias = 1};
    CHECK_OK(kvg_sampler_set(&s, &d, true, &err));
    CHECK(kvg_sampler_top_needed(&s, 0, false) == 0);
    kvg_sampler_free(&s);
}

/* ---- whole model ---- */

static kvgen_model *load(const char *path, kvgen_backend backend) {
    kvgen_model_desc d = {.path = path, .backend = backend, .n_threads = 2};
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvgen_model_load(&d, &m, &err);
    CHECKF(st == KVGEN_OK, "load %s: %s", path, err.message);
    return m;
}

/* n tokens sampled and decoded one by one after a prompt; full: the whole vector read back */
static void run(kvgen_model *m, const kvgen_sampler_desc *sd, bool full, int n, int32_t *out, float *logits_at_end) {
    setenv("KVGEN_FULL_LOGITS", full ? "1" : "0", 1);
    kvgen_session_desc d = {.n_ctx = 256, .sampler = sd};
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_create(m, &d, &s, &err));
    unsetenv("KVGEN_FULL_LOGITS");
    if (!s) return;
    int32_t prompt[5] = {1, 17, 33, 250, 999 % 1000};
    CHECK_OK(kvgen_session_prefill(s, prompt, 5, NULL, &err));
    for (int i = 0; i < n; i++) {
        out[i] = kvgen_session_sample(s);
        if (out[i] < 0) break;
        CHECK_OK(kvgen_session_decode(s, out[i], &err));
    }
    const float *l = kvgen_session_logits(s);
    CHECK(l != NULL);
    if (l && logits_at_end) memcpy(logits_at_end, l, 1000 * sizeof(float));
    kvgen_session_close(s);
}

/* two sessions decoding in turn: each step's kept logits are set aside for the other */
static void run_interleaved(kvgen_model *m, const kvgen_sampler_desc *sd, int n, int32_t *a, int32_t *b) {
    kvgen_session_desc d = {.n_ctx = 256, .sampler = sd};
    kvgen_session *s[2] = {NULL, NULL};
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_create(m, &d, &s[0], &err));
    CHECK_OK(kvgen_session_create(m, &d, &s[1], &err));
    if (!s[0] || !s[1]) return;
    int32_t prompt[5] = {1, 17, 33, 250, 999};
    for (int k = 0; k < 2; k++) CHECK_OK(kvgen_session_prefill(s[k], prompt, 5, NULL, &err));
    int32_t *out[2] = {a, b};
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++) {
            out[k][i] = kvgen_session_sample(s[k]);
            CHECK_OK(kvgen_session_decode(s[k], out[k][i], &err));
        }
    kvgen_session_close(s[0]);
    kvgen_session_close(s[1]);
}

static void test_model(void) {
    char *path = tu_make_model("vk_sample.gguf", "--type Q8_0 --seed 5 --embd 64 --heads 4 --kv-heads 2 --ff 96 "
                                                 "--layers 2 --vocab-size 1000");
    CHECK(path != NULL);
    if (!path) return;
    kvgen_model *mv = load(path, KVGEN_BACKEND_VULKAN), *mr = load(path, KVGEN_BACKEND_REFERENCE);
    enum { N = 40 };
    kvgen_sampler_desc cfgs[] = {{.temperature = 0.0f},
                                 {.temperature = 0.9f, .top_k = 40, .seed = 11},
                                 {.temperature = 1.5f, .top_k = 8, .min_p = 0.1f, .top_p = 0.8f, .seed = 12}};
    for (size_t c = 0; mv && c < sizeof cfgs / sizeof cfgs[0]; c++) {
        int32_t dev[N], full[N], a[N], b[N];
        float ld[1000], lf[1000];
        memset(dev, 0xff, sizeof dev);
        memset(full, 0xfe, sizeof full);
        run(mv, &cfgs[c], false, N, dev, ld);
        run(mv, &cfgs[c], true, N, full, lf);
        CHECKF(memcmp(dev, full, sizeof dev) == 0, "config %zu: device-selection and full-vector tokens differ", c);
        CHECKF(memcmp(ld, lf, sizeof ld) == 0, "config %zu: lazily fetched logits differ", c);
        run_interleaved(mv, &cfgs[c], N, a, b);
        CHECKF(memcmp(a, dev, sizeof a) == 0 && memcmp(b, dev, sizeof b) == 0,
               "config %zu: interleaved sessions differ", c);
        if (c == 0 && mr) {
            int32_t r[N];
            run(mr, &cfgs[c], false, N, r, NULL);
            int agree = 0;
            while (agree < N && r[agree] == dev[agree]) agree++;
            /* random weights give small top-1 margins somewhere: the f16 cache may flip a near
             * tie, so only the first steps must agree */
            CHECKF(agree >= 8, "greedy: vulkan and reference agree for %d tokens only", agree);
        }
    }
    if (mv) CHECK(kvg_vk_validation_count(kvg_vk_model_ctx(mv)) == 0);
    kvgen_model_unload(mv);
    kvgen_model_unload(mr);
    free(path);
}

/* The selection under lowered limits (KVGEN_VK_MAX_*): 16 KiB of shared memory and 128
 * invocations choose argmax at 128 invocations and topk at 16 (16,256 + 64 bytes), and at most 3
 * workgroups per dimension split the passes over many chunks (argmax: 18 of 70,000 values, topk:
 * 9) and the 8-row dispatches into pieces;
 * the results equal the CPU's exactly, as with the device's own limits. A value that is not a
 * positive integer fails the context, naming the variable. */
static void test_small_limits(void) {
    setenv("KVGEN_VK_MAX_GROUP_COUNT", "3", 1);
    setenv("KVGEN_VK_MAX_SHARED", "16384", 1);
    setenv("KVGEN_VK_MAX_INVOCATIONS", "128", 1);
    kvg_vk_ctx_desc d = {0};
    kvg_vk_ctx *ctx = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvg_vk_ctx_create(&d, &ctx, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    if (ctx) {
        uint32_t sizes[] = {70000, 1000, 63, 8193};
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            for (int ties = 0; ties <= 1; ties++) check_select(ctx, sizes[i], ties);
        check_argmax_cases(ctx, 20000);
        check_select_rows(ctx, 49152, 8);
        check_select_rows(ctx, 8193, 5);
        uint32_t spec[KVG_SPEC_COUNT] = {0};
        spec[KVG_SPEC_WG] = 128;
        CHECKF(kvg_vk_pipeline_find(ctx, "argmax", spec) != VK_NULL_HANDLE, "argmax did not run at 128 invocations");
        spec[KVG_SPEC_MODE] = 1;
        CHECKF(kvg_vk_pipeline_find(ctx, "argmax", spec) != VK_NULL_HANDLE, "argmax did not merge chunks");
        spec[KVG_SPEC_MODE] = 0;
        spec[KVG_SPEC_WG] = 16;
        CHECKF(kvg_vk_pipeline_find(ctx, "topk", spec) != VK_NULL_HANDLE, "topk did not run at 16 invocations");
        CHECK(atomic_load(&ctx->split_dispatches) > 0);
        /* a pipeline past the lowered limits is refused with the shader, need and limit named */
        spec[KVG_SPEC_WG] = 256;
        VkPipeline p = VK_NULL_HANDLE;
        st = kvg_vk_pipeline_get(ctx, "argmax", spec, &p, &err);
        CHECKF(st == KVGEN_E_UNSUPPORTED && strstr(err.message, "argmax") && strstr(err.message, "256") &&
                   strstr(err.message, "128"),
               "argmax at 256 invocations under a limit of 128: status %d, \"%s\"", (int)st, err.message);
        spec[KVG_SPEC_WG] = 32;
        st = kvg_vk_pipeline_get(ctx, "topk", spec, &p, &err);
        CHECKF(st == KVGEN_E_UNSUPPORTED && strstr(err.message, "16512") && strstr(err.message, "16384"),
               "topk at 32 invocations under 16 KiB: status %d, \"%s\"", (int)st, err.message);
        CHECKF(kvg_vk_validation_count(ctx) == 0, "%d validation messages", kvg_vk_validation_count(ctx));
        kvg_vk_ctx_destroy(ctx);
    }
    setenv("KVGEN_VK_MAX_SHARED", "16k", 1);
    ctx = NULL;
    st = kvg_vk_ctx_create(&d, &ctx, &err);
    CHECKF(st == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "KVGEN_VK_MAX_SHARED") && strstr(err.message, "16k"),
           "KVGEN_VK_MAX_SHARED=16k: status %d, \"%s\"", (int)st, err.message);
    kvg_vk_ctx_destroy(ctx);
    unsetenv("KVGEN_VK_MAX_GROUP_COUNT");
    unsetenv("KVGEN_VK_MAX_SHARED");
    unsetenv("KVGEN_VK_MAX_INVOCATIONS");
}

int main(void) {
    test_sampler_bounded();
    int n_dev = 0;
    kvgen_error err = {0};
    if (kvgen_devices(NULL, 0, &n_dev, &err) != KVGEN_OK || n_dev == 0) {
        if (tu_failures) return tu_finish("test_vk_sample");
        tu_skip("no Vulkan device");
    }
    kvg_vk_ctx_desc d = {0};
    kvg_vk_ctx *ctx = NULL;
    kvgen_status st = kvg_vk_ctx_create(&d, &ctx, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    if (ctx) {
        /* argmax chunks (4,096 values): 1, 2 (4,097: the second holds one value), 3, 12, 18, 64 */
        uint32_t sizes[] = {49152, 1000, 257, 63, 1, 4096, 4097, 8192, 8193, 70000, 262144};
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            for (int ties = 0; ties <= 1; ties++) check_select(ctx, sizes[i], ties);
        uint32_t cases[] = {1, 2, 4095, 4096, 4097, 8191, 12289, 20000, 262144};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_argmax_cases(ctx, cases[i]);
        check_select_rows(ctx, 49152, 8);
        check_select_rows(ctx, 8193, 3);
        check_select_rows(ctx, 63, 5);
        check_select_rows(ctx, 1, 7);
        CHECKF(kvg_vk_validation_count(ctx) == 0, "%d validation messages", kvg_vk_validation_count(ctx));
        kvg_vk_ctx_destroy(ctx);
    }
    test_small_limits();
    test_model();
    return tu_finish("test_vk_sample");
}
