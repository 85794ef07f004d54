/* test_sampler.c: each stage of the sampler chain on hand-made logits, determinism, the
 * partial selection against a full sort, state clone/save/load, and the cost per token of
 * partial selection versus sorting the whole vocabulary (printed, never asserted). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <string.h>
#include <time.h>
#include "kvg_sampler.h"
#include "testutil.h"

static kvg_sampler make(const kvgen_sampler_desc *d, int n_vocab) {
    kvg_sampler s;
    kvgen_error err = {0};
    CHECK_OK(kvg_sampler_init(&s, NULL, n_vocab, &err));
    CHECK_OK(kvg_sampler_set(&s, d, true, &err));
    return s;
}

static void test_greedy_bias_ban(void) {
    float l[5] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
    kvg_sampler s = make(NULL, 5);
    CHECK(kvg_sampler_sample(&s, l) == 1); /* ties: lowest id */
    kvg_sampler_free(&s);
    kvgen_logit_bias b[2] = {{1, -INFINITY}, {4, 3.5f}};
    kvgen_sampler_desc d = {.bias = b, .n_bias = 2};
    s = make(&d, 5);
    CHECK(kvg_sampler_sample(&s, l) == 3);
    for (int i = 0; i < 50; i++) CHECK(kvg_sampler_sample(&s, l) == 3);
    kvg_sampler_free(&s);
    d.temperature = 2.0f; /* a banned token is never drawn, even hot */
    s = make(&d, 5);
    int seen1 = 0;
    for (int i = 0; i < 2000; i++) seen1 += kvg_sampler_sample(&s, l) == 1;
    CHECK(seen1 == 0);
    kvg_sampler_free(&s);
    kvgen_logit_bias all[3] = {{0, -INFINITY}, {1, -INFINITY}, {2, -INFINITY}};
    kvgen_sampler_desc none = {.bias = all, .n_bias = 3};
    float l3[3] = {0, 1, 2};
    s = make(&none, 3);
    CHECK(kvg_sampler_sample(&s, l3) == -1);
    kvg_sampler_free(&s);
}

static void test_penalties(void) {
    float l[4] = {2.0f, 1.9f, 0.5f, -1.0f};
    int32_t hist[3] = {0, 0, 3};
    kvgen_sampler_desc rep = {.repeat_penalty = 1.2f};
    kvg_sampler s = make(&rep, 4);
    CHECK(kvg_sampler_sample_ctx(&s, l, hist, 3, NULL) == 1); /* 2.0/1.2 < 1.9 */
    CHECK(kvg_sampler_sample_ctx(&s, l, NULL, 0, NULL) == 0);
    kvg_sampler_free(&s);
    kvgen_sampler_desc freq = {.frequency_penalty = 0.06f}; /* 2 occurrences: 2.0 - 0.12 < 1.9 */
    s = make(&freq, 4);
    CHECK(kvg_sampler_sample_ctx(&s, l, hist, 3, NULL) == 1);
    CHECK(kvg_sampler_sample_ctx(&s, l, hist + 1, 2, NULL) == 0); /* one occurrence: 1.94 */
    kvg_sampler_free(&s);
    kvgen_sampler_desc pres = {.presence_penalty = 0.15f};
    s = make(&pres, 4);
    CHECK(kvg_sampler_sample_ctx(&s, l, hist, 3, NULL) == 1);
    kvg_sampler_free(&s);
    kvgen_sampler_desc win = {.repeat_penalty = 1.2f, .penalty_window = 1}; /* only token 3 in the window */
    s = make(&win, 4);
    CHECK(kvg_sampler_sample_ctx(&s, l, hist, 3, NULL) == 0);
    for (int i = 0; i < 4; i++) CHECK(s.counts[i] == 0); /* scratch left clean */
    kvg_sampler_free(&s);
}

static int draws_in(kvg_sampler *s, const float *l, int n, const int *allowed_ids, int n_allowed, int *hits) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int32_t t = kvg_sampler_sample(s, l);
        int ok = 0;
        for (int k = 0; k < n_allowed; k++)
            if (t == allowed_ids[k]) {
                ok = 1;
                hits[k]++;
            }
        bad += !ok;
    }
    return bad;
}

static void test_truncation(void) {
    /* probabilities 0.5, 0.3, 0.15, 0.05 at T = 1 */
    float l[6] = {logf(0.15f), logf(0.5f), -INFINITY, logf(0.05f), logf(0.3f), -INFINITY};
    int hits[3] = {0};
    kvgen_sampler_desc k2 = {.temperature = 1.0f, .top_k = 2};
    kvg_sampler s = make(&k2, 6);
    int top2[2] = {1, 4};
    CHECK(draws_in(&s, l, 3000, top2, 2, hits) == 0);
    CHECKF(hits[0] > 1650 && hits[0] < 2100, "top-k 2: %d of 3000 are token 1 (expect ~1875)", hits[0]);
    kvg_sampler_free(&s);
    kvgen_sampler_desc p = {.temperature = 1.0f, .top_p = 0.7f}; /* 0.5 + 0.3 reaches 0.7 */
    s = make(&p, 6);
    memset(hits, 0, sizeof hits);
    CHECK(draws_in(&s, l, 3000, top2, 2, hits) == 0 && hits[1] > 800);
    kvg_sampler_free(&s);
    kvgen_sampler_desc mp = {.temperature = 1.0f, .min_p = 0.25f}; /* keeps p >= 0.125 */
    s = make(&mp, 6);
    int top3[3] = {1, 4, 0};
    memset(hits, 0, sizeof hits);
    CHECK(draws_in(&s, l, 3000, top3, 3, hits) == 0 && hits[2] > 200);
    kvg_sampler_free(&s);
    kvgen_sampler_desc k1 = {.temperature = 5.0f, .top_k = 1};
    s = make(&k1, 6);
    int top1[1] = {1};
    CHECK(draws_in(&s, l, 200, top1, 1, hits) == 0);
    kvg_sampler_free(&s);
    /* a low temperature sharpens: token 1 dominates */
    kvgen_sampler_desc cold = {.temperature = 0.1f};
    s = make(&cold, 6);
    memset(hits, 0, sizeof hits);
    draws_in(&s, l, 1000, top1, 1, hits);
    CHECK(hits[0] > 990);
    kvg_sampler_free(&s);
}

static void fill_random(float *l, int n, uint64_t seed) {
    kvg_rng r;
    kvg_rng_seed(&r, seed);
    /* peaked like a language model's: most tokens far below a few likely ones */
    for (int i = 0; i < n; i++) {
        double u = kvg_rng_uniform(&r);
        l[i] = (float)(-8.0 + 22.0 * u * u * u * u * u * u * u * u);
    }
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* partial selection must pick exactly what sorting everything picks; prints the cost of both */
static void test_partial_vs_full(void) {
    enum { V = 49152, N = 60 };
    float *l = malloc(V * sizeof *l);
    kvgen_sampler_desc cfgs[4] = {{.temperature = 0.8f, .top_k = 40, .seed = 3},
                                  {.temperature = 0.8f, .top_p = 0.9f, .seed = 3},
                                  {.temperature = 1.0f, .top_k = 100, .top_p = 0.5f, .seed = 3},
                                  {.temperature = 0.7f, .top_p = 0.95f, .min_p = 0.05f, .seed = 3}};
    for (int c = 0; c < 4; c++) {
        kvg_sampler fast = make(&cfgs[c], V), slow = make(&cfgs[c], V);
        slow.params.full_sort = true;
        int same = 0;
        double t_fast = 0, t_slow = 0;
        for (int i = 0; i < N; i++) {
            fill_random(l, V, (uint64_t)i + 1);
            double t0 = now();
            int32_t a = kvg_sampler_sample(&fast, l);
            double t1 = now();
            int32_t b = kvg_sampler_sample(&slow, l);
            double t2 = now();
            t_fast += t1 - t0;
            t_slow += t2 - t1;
            same += a == b;
        }
        CHECKF(same == N, "config %d: partial selection and full sort agree on %d of %d draws", c, same, N);
        printf("sampling cost, vocab %d, config %d (T %.1f top_k %d top_p %.2f min_p %.2f): partial %.3f ms/token, "
               "full sort %.3f ms/token (%.1fx)\n",
               V, c, (double)cfgs[c].temperature, cfgs[c].top_k, (double)cfgs[c].top_p, (double)cfgs[c].min_p,
               t_fast / N * 1e3, t_slow / N * 1e3, t_slow / (t_fast > 0 ? t_fast : 1e-9));
        kvg_sampler_free(&fast);
        kvg_sampler_free(&slow);
    }
    kvgen_sampler_desc hot = {.temperature = 1.0f};
    kvg_sampler s = make(&hot, V);
    double t0 = now();
    for (int i = 0; i < N; i++) {
        fill_random(l, V, (uint64_t)i + 1);
        kvg_sampler_sample(&s, l);
    }
    printf("sampling cost, vocab %d, plain temperature (no sort): %.3f ms/token (incl. filling logits)\n", V,
           (now() - t0) / N * 1e3);
    kvg_sampler_free(&s);
    free(l);
}

static void test_determinism_and_state(void) {
    enum { V = 1000 };
    float l[V];
    fill_random(l, V, 99);
    kvgen_sampler_desc d = {.temperature = 1.5f, .top_p = 0.95f, .seed = 1234, .repeat_penalty = 1.1f};
    kvg_sampler a = make(&d, V), b = make(&d, V);
    int differ = 0;
    for (int i = 0; i < 100; i++) differ += kvg_sampler_sample(&a, l) != kvg_sampler_sample(&b, l);
    CHECK(differ == 0);
    kvgen_sampler_desc d2 = d;
    d2.seed = 1235;
    kvg_sampler c = make(&d2, V);
    differ = 0;
    for (int i = 0; i < 100; i++) differ += kvg_sampler_sample(&a, l) != kvg_sampler_sample(&c, l);
    CHECK(differ > 50);
    kvg_sampler_free(&c);

    /* clone and save/load continue the stream exactly */
    kvgen_error err = {0};
    kvg_sampler cl;
    CHECK_OK(kvg_sampler_clone(&cl, &a, &err));
    size_t n = kvg_sampler_state_size(&a);
    unsigned char *blob = malloc(n);
    kvg_sampler_state_save(&a, blob);
    kvg_sampler re;
    CHECK_OK(kvg_sampler_init(&re, NULL, V, &err));
    CHECK_OK(kvg_sampler_state_load(&re, blob, n, NULL, &err));
    CHECK(re.params.seed == 1234 && re.params.top_p == 0.95f && re.params.repeat_penalty == 1.1f);
    differ = 0;
    for (int i = 0; i < 100; i++) {
        int32_t x = kvg_sampler_sample(&a, l);
        differ += x != kvg_sampler_sample(&cl, l);
        differ += x != kvg_sampler_sample(&re, l);
    }
    CHECK(differ == 0);
    /* a damaged blob is refused and changes nothing */
    kvg_rng before = re.rng;
    CHECK(kvg_sampler_state_load(&re, blob, n - 1, NULL, &err) == KVGEN_E_FORMAT);
    /* followed by other data: refused as the whole blob, read as a prefix of known length */
    unsigned char *longer = calloc(n + 3, 1);
    memcpy(longer, blob, n);
    size_t used = 0;
    CHECK(kvg_sampler_state_load(&re, longer, n + 3, NULL, &err) == KVGEN_E_FORMAT);
    blob[0] ^= 0xff;
    CHECK(kvg_sampler_state_load(&re, blob, n, NULL, &err) == KVGEN_E_FORMAT);
    CHECK(memcmp(&before, &re.rng, sizeof before) == 0);
    CHECK_OK(kvg_sampler_state_load(&re, longer, n + 3, &used, &err));
    CHECK(used == n);
    free(longer);
    free(blob);
    kvg_sampler_free(&cl);
    kvg_sampler_free(&re);

    /* set_sampler with seed 0 keeps the stream, with a seed re-seeds */
    kvgen_sampler_desc keep = {.temperature = 1.5f, .top_p = 0.95f, .repeat_penalty = 1.1f};
    kvg_sampler x = make(&d, V), y = make(&d, V);
    kvg_sampler_sample(&x, l);
    kvg_sampler_sample(&y, l);
    CHECK_OK(kvg_sampler_set(&x, &keep, false, &err));
    CHECK(x.params.seed == 1234);
    CHECK(kvg_sampler_sample(&x, l) == kvg_sampler_sample(&y, l));
    CHECK_OK(kvg_sampler_set(&x, &d, false, &err)); /* re-seeded: replays the first draw */
    kvg_sampler z = make(&d, V);
    CHECK(kvg_sampler_sample(&x, l) == kvg_sampler_sample(&z, l));
    kvg_sampler_free(&x);
    kvg_sampler_free(&y);
    kvg_sampler_free(&z);
    kvg_sampler_free(&a);
    kvg_sampler_free(&b);
}

static void test_refusals(void) {
    kvg_sampler s;
    kvgen_error err = {0};
    CHECK_OK(kvg_sampler_init(&s, NULL, 10, &err));
    kvgen_sampler_desc bad[] = {{.temperature = NAN}, {.top_k = -1}, {.top_p = -0.5f}, {.min_p = 1.5f},
                                {.repeat_penalty = -1.0f}, {.penalty_window = -2}, {.n_bias = 2}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.message[0] = 0;
        CHECKF(kvg_sampler_set(&s, &bad[i], false, &err) == KVGEN_E_INVALID_ARGUMENT && err.message[0], "case %zu",
               i);
    }
    kvgen_logit_bias b = {10, 1.0f};
    kvgen_sampler_desc oob = {.bias = &b, .n_bias = 1};
    CHECK(kvg_sampler_set(&s, &oob, false, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "token 10"));
    b = (kvgen_logit_bias){3, INFINITY};
    CHECK(kvg_sampler_set(&s, &oob, false, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(s.params.temperature == 0.0f && s.params.n_bias == 0); /* unchanged */
    kvg_sampler_free(&s);
    CHECK(kvg_sampler_init(&s, NULL, 0, &err) == KVGEN_E_INVALID_ARGUMENT);
    kvg_sampler_free(&s);
}

int main(void) {
    test_greedy_bias_ban();
    test_penalties();
    test_truncation();
    test_determinism_and_state();
    test_refusals();
    test_partial_vs_full();
    return tu_finish("test_sampler");
}
