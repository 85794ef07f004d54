/* sampler.c: the session's sampler chain and RNG (see kvg_sampler.h). */
#include "kvg_sampler.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"

/* ---- RNG -------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kvg_rng_seed(kvg_rng *r, uint64_t seed) {
    /* splitmix64 never yields an all-zero xoshiro state, which would be stuck at zero */
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kvg_rng_next(kvg_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double kvg_rng_uniform(kvg_rng *r) { return (double)(kvg_rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

/* ---- sampler ---------------------------------------------------------------------------- */

kvgen_status kvg_sampler_init(kvg_sampler *s, const kvg_sampler_params *params, int n_vocab, kvgen_error *err) {
    memset(s, 0, sizeof *s);
    if (n_vocab <= 0) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "sampler: n_vocab %d must be > 0", n_vocab);
    if (params) s->params = *params;
    if (s->params.seed == 0) s->params.seed = 0x5eed;
    if (!(s->params.temperature == s->params.temperature)) /* NaN */
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "sampler: temperature is NaN");
    if (!(s->params.top_p == s->params.top_p)) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "sampler: top_p is NaN");
    s->n_vocab = n_vocab;
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    if (!s->cand) return kvg_fail(err, KVGEN_E_NO_MEMORY, "sampler: out of memory for %d candidates", n_vocab);
    kvg_rng_seed(&s->rng, s->params.seed);
    return KVGEN_OK;
}

void kvg_sampler_free(kvg_sampler *s) {
    free(s->cand);
    s->cand = NULL;
}

void kvg_sampler_reset(kvg_sampler *s) { kvg_rng_seed(&s->rng, s->params.seed); }

int32_t kvg_argmax(const float *logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* Descending by logit, then ascending id: a total order, so qsort's instability cannot make
 * the same seed pick different tokens on different libcs. NaN sorts last. */
static int cand_cmp(const void *a, const void *b) {
    const kvg_candidate *x = a, *y = b;
    bool xn = isnan(x->logit), yn = isnan(y->logit);
    if (xn != yn) return xn ? 1 : -1;
    if (!xn && x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Stage: scales logits by 1/T. */
static void stage_temperature(kvg_candidate *c, int n, float temperature) {
    for (int i = 0; i < n; i++) c[i].logit /= temperature;
}

/* Stage: softmax over the candidates (which are sorted, so c[0] holds the maximum). */
static void stage_softmax(kvg_candidate *c, int n) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        c[i].p = isnan(c[i].logit) ? 0.0f : expf(c[i].logit - c[0].logit);
        sum += c[i].p;
    }
    for (int i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
}

/* Stage: keeps the smallest prefix whose probability reaches top_p (at least one). */
static int stage_top_p(const kvg_candidate *c, int n, float top_p) {
    double cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (cum >= top_p) return i + 1;
    }
    return n;
}

/* Stage: draws one candidate in proportion to p. */
static int32_t stage_draw(const kvg_candidate *c, int n, kvg_rng *rng) {
    double total = 0.0;
    for (int i = 0; i < n; i++) total += c[i].p;
    double r = kvg_rng_uniform(rng) * total, cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (r < cum) return c[i].id;
    }
    return c[n - 1].id; /* r landed on the rounding slack at the end */
}

int32_t kvg_sampler_sample(kvg_sampler *s, const float *logits) {
    const kvg_sampler_params *p = &s->params;
    int n = s->n_vocab;
    if (p->temperature <= 0.0f) return kvg_argmax(logits, n);

    kvg_candidate *c = s->cand;
    for (int i = 0; i < n; i++) c[i] = (kvg_candidate){.id = i, .logit = logits[i], .p = 0.0f};
    stage_temperature(c, n, p->temperature);
    qsort(c, (size_t)n, sizeof *c, cand_cmp);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    if (!isfinite(c[0].logit)) return c[0].id; /* inf/NaN at the top: nothing meaningful to draw */
    stage_softmax(c, n);
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        n = stage_top_p(c, n, p->top_p);
    }
    return stage_draw(c, n, &s->rng);
}
