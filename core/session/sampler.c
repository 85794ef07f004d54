/* sampler.c: the session's sampler chain and RNG (see kvg_sampler.h). */
#include "kvg_sampler.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"

#define KVG_DEFAULT_SEED 0x5eed
#define KVG_DEFAULT_PENALTY_WINDOW 64

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

/* ---- settings --------------------------------------------------------------------------- */

static kvgen_status check_params(const kvg_sampler_params *p, int n_vocab, kvgen_error *err) {
    if (isnan(p->temperature) || isnan(p->top_p) || isnan(p->min_p) || isnan(p->repeat_penalty) ||
        isnan(p->frequency_penalty) || isnan(p->presence_penalty))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "sampler: a setting is NaN");
    if (p->top_k < 0) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "sampler: top_k %d is negative", p->top_k);
    if (p->top_p < 0.0f) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "sampler: top_p %g is negative", (double)p->top_p);
    if (p->min_p < 0.0f || p->min_p > 1.0f)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "sampler: min_p %g is outside [0, 1]", (double)p->min_p);
    if (p->repeat_penalty < 0.0f || isinf(p->repeat_penalty))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "sampler: repeat_penalty %g must be a finite number >= 0",
                        (double)p->repeat_penalty);
    if (isinf(p->frequency_penalty) || isinf(p->presence_penalty) || isinf(p->temperature))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "sampler: temperature and penalties must be finite");
    if (p->penalty_window < -1)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "sampler: penalty_window %d (-1: whole session, 0: 64)",
                        p->penalty_window);
    if (p->n_bias < 0 || (p->n_bias > 0 && !p->bias))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "sampler: n_bias %d without a bias array", p->n_bias);
    for (int i = 0; i < p->n_bias; i++) {
        if (p->bias[i].token < 0 || p->bias[i].token >= n_vocab)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "sampler: bias[%d]: token %d is outside the vocabulary [0, %d)",
                            i, (int)p->bias[i].token, n_vocab);
        float b = p->bias[i].bias;
        if (isnan(b) || (isinf(b) && b > 0))
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "sampler: bias[%d] is %g (finite, or -INFINITY to ban)", i,
                            (double)b);
    }
    return KVGEN_OK;
}

/* Validated copy of p with its bias array duplicated; *out untouched on error. */
static kvgen_status copy_params(kvg_sampler_params *out, const kvg_sampler_params *p, int n_vocab, kvgen_error *err) {
    kvgen_status st = check_params(p, n_vocab, err);
    if (st != KVGEN_OK) return st;
    kvg_sampler_params q = *p;
    if (q.seed == 0) q.seed = KVG_DEFAULT_SEED;
    q.bias = NULL;
    if (p->n_bias > 0) {
        q.bias = kvg_malloc((size_t)p->n_bias * sizeof *q.bias);
        if (!q.bias) return kvg_fail(err, KVGEN_E_NO_MEMORY, "sampler: out of memory for %d biases", p->n_bias);
        memcpy(q.bias, p->bias, (size_t)p->n_bias * sizeof *q.bias);
    }
    *out = q;
    return KVGEN_OK;
}

static kvgen_status alloc_scratch(kvg_sampler *s, int n_vocab, kvgen_error *err) {
    s->n_vocab = n_vocab;
    s->cand = kvg_malloc((size_t)n_vocab * sizeof *s->cand);
    s->counts = kvg_calloc((size_t)n_vocab, sizeof *s->counts);
    if (!s->cand || !s->counts) return kvg_fail(err, KVGEN_E_NO_MEMORY, "sampler: out of memory for %d candidates", n_vocab);
    return KVGEN_OK;
}

kvgen_status kvg_sampler_init(kvg_sampler *s, const kvg_sampler_params *params, int n_vocab, kvgen_error *err) {
    memset(s, 0, sizeof *s);
    if (n_vocab <= 0) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "sampler: n_vocab %d must be > 0", n_vocab);
    kvg_sampler_params dflt = {0};
    kvgen_status st = copy_params(&s->params, params ? params : &dflt, n_vocab, err);
    if (st == KVGEN_OK) st = alloc_scratch(s, n_vocab, err);
    if (st != KVGEN_OK) {
        kvg_sampler_free(s);
        return st;
    }
    kvg_rng_seed(&s->rng, s->params.seed);
    return KVGEN_OK;
}

void kvg_sampler_free(kvg_sampler *s) {
    kvg_free(s->params.bias);
    kvg_free(s->cand);
    kvg_free(s->counts);
    s->params.bias = NULL;
    s->params.n_bias = 0;
    s->cand = NULL;
    s->counts = NULL;
}

void kvg_sampler_reset(kvg_sampler *s) {
    kvg_rng_seed(&s->rng, s->params.seed);
}

kvgen_status kvg_sampler_set(kvg_sampler *s, const kvgen_sampler_desc *desc, bool reseed, kvgen_error *err) {
    kvgen_sampler_desc d = {0};
    if (desc) d = *desc;
    kvg_sampler_params p = {.seed = d.seed,
                            .temperature = d.temperature,
                            .top_k = d.top_k,
                            .top_p = d.top_p,
                            .min_p = d.min_p,
                            .repeat_penalty = d.repeat_penalty,
                            .frequency_penalty = d.frequency_penalty,
                            .presence_penalty = d.presence_penalty,
                            .penalty_window = d.penalty_window,
                            .bias = (kvgen_logit_bias *)d.bias,
                            .n_bias = d.n_bias,
                            .full_sort = s->params.full_sort};
    kvg_sampler_params q;
    kvgen_status st = copy_params(&q, &p, s->n_vocab, err);
    if (st != KVGEN_OK) return st;
    bool seed_given = d.seed != 0;
    if (!seed_given && !reseed) q.seed = s->params.seed; /* keep reporting the seed of the running stream */
    kvg_free(s->params.bias);
    s->params = q;
    if (reseed || seed_given) kvg_rng_seed(&s->rng, q.seed);
    return KVGEN_OK;
}

void kvg_sampler_get(const kvg_sampler *s, kvgen_sampler_desc *d) {
    const kvg_sampler_params *p = &s->params;
    *d = (kvgen_sampler_desc){.seed = p->seed,
                              .temperature = p->temperature,
                              .top_k = p->top_k,
                              .top_p = p->top_p,
                              .min_p = p->min_p,
                              .repeat_penalty = p->repeat_penalty,
                              .frequency_penalty = p->frequency_penalty,
                              .presence_penalty = p->presence_penalty,
                              .penalty_window = p->penalty_window,
                              .bias = p->bias,
                              .n_bias = p->n_bias};
}

kvgen_status kvg_sampler_clone(kvg_sampler *dst, const kvg_sampler *src, kvgen_error *err) {
    kvgen_status st = kvg_sampler_init(dst, &src->params, src->n_vocab, err);
    if (st != KVGEN_OK) return st;
    dst->rng = src->rng;
    return KVGEN_OK;
}

/* ---- state blob ------------------------------------------------------------------------- */

#define STATE_MAGIC 0x5347564bu /* "KVGS" */
#define STATE_VERSION 1u
#define STATE_HEAD (4 + 4 + 8 + 4 * 9 + 32) /* up to the RNG; then the biases */

static unsigned char *put_u32(unsigned char *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
    return b + 4;
}
static unsigned char *put_u64(unsigned char *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    return b + 8;
}
static unsigned char *put_f32(unsigned char *b, float f) {
    uint32_t v;
    memcpy(&v, &f, 4);
    return put_u32(b, v);
}
static uint32_t get_u32(const unsigned char *b) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)b[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
    return v;
}
static float get_f32(const unsigned char *b) {
    uint32_t v = get_u32(b);
    float f;
    memcpy(&f, &v, 4);
    return f;
}

size_t kvg_sampler_state_size(const kvg_sampler *s) {
    return STATE_HEAD + (size_t)s->params.n_bias * 8;
}

void kvg_sampler_state_save(const kvg_sampler *s, void *buf) {
    const kvg_sampler_params *p = &s->params;
    unsigned char *b = buf;
    b = put_u32(b, STATE_MAGIC);
    b = put_u32(b, STATE_VERSION);
    b = put_u64(b, p->seed);
    b = put_f32(b, p->temperature);
    b = put_u32(b, (uint32_t)p->top_k);
    b = put_f32(b, p->top_p);
    b = put_f32(b, p->min_p);
    b = put_f32(b, p->repeat_penalty);
    b = put_f32(b, p->frequency_penalty);
    b = put_f32(b, p->presence_penalty);
    b = put_u32(b, (uint32_t)p->penalty_window);
    b = put_u32(b, (uint32_t)p->n_bias);
    for (int i = 0; i < 4; i++) b = put_u64(b, s->rng.s[i]);
    for (int i = 0; i < p->n_bias; i++) {
        b = put_u32(b, (uint32_t)p->bias[i].token);
        b = put_f32(b, p->bias[i].bias);
    }
}

kvgen_status kvg_sampler_state_load(kvg_sampler *s, const void *buf, size_t size, size_t *used, kvgen_error *err) {
    const unsigned char *b = buf;
    if (size < STATE_HEAD || get_u32(b) != STATE_MAGIC)
        return kvg_fail(err, KVGEN_E_FORMAT, "sampler state: not a sampler state (%zu bytes)", size);
    if (get_u32(b + 4) > STATE_VERSION)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "sampler state: version %u is newer than this kvgen's %u",
                        (unsigned)get_u32(b + 4), STATE_VERSION);
    kvg_sampler_params p = {0};
    p.seed = get_u64(b + 8);
    p.temperature = get_f32(b + 16);
    p.top_k = (int32_t)get_u32(b + 20);
    p.top_p = get_f32(b + 24);
    p.min_p = get_f32(b + 28);
    p.repeat_penalty = get_f32(b + 32);
    p.frequency_penalty = get_f32(b + 36);
    p.presence_penalty = get_f32(b + 40);
    p.penalty_window = (int32_t)get_u32(b + 44);
    uint32_t n_bias = get_u32(b + 48);
    kvg_rng rng;
    for (int i = 0; i < 4; i++) rng.s[i] = get_u64(b + 52 + 8 * i);
    size_t off = STATE_HEAD;
    if (n_bias > (uint32_t)s->n_vocab || (size - off) / 8 < n_bias)
        return kvg_fail(err, KVGEN_E_FORMAT, "sampler state: %u biases do not fit in %zu bytes", (unsigned)n_bias, size);
    kvgen_logit_bias *bias = NULL;
    if (n_bias) {
        bias = kvg_malloc(n_bias * sizeof *bias);
        if (!bias) return kvg_fail(err, KVGEN_E_NO_MEMORY, "sampler state: out of memory");
        for (uint32_t i = 0; i < n_bias; i++, off += 8)
            bias[i] = (kvgen_logit_bias){(int32_t)get_u32(b + off), get_f32(b + off + 4)};
    }
    p.bias = bias;
    p.n_bias = (int)n_bias;
    p.full_sort = s->params.full_sort;
    kvg_sampler_params q;
    kvgen_status st = KVGEN_OK;
    if (!used && off != size)
        st = kvg_fail(err, KVGEN_E_FORMAT, "sampler state: %zu bytes after the state", size - off);
    if (st == KVGEN_OK) st = copy_params(&q, &p, s->n_vocab, err);
    kvg_free(bias);
    if (st != KVGEN_OK) return st;
    kvg_free(s->params.bias);
    s->params = q;
    s->rng = rng;
    if (used) *used = off;
    return KVGEN_OK;
}

/* ---- the chain -------------------------------------------------------------------------- */

int32_t kvg_argmax(const float *logits, int n) {
    /* NaN counts as -inf (it never wins), as in the device's argmax (shaders/argmax.comp) */
    int32_t best = 0;
    float bv = isnan(logits[0]) ? -INFINITY : logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > bv) {
            bv = logits[i];
            best = i;
        }
    return best;
}

/* The candidate order: higher logit first, then lower id. A total order (NaN never reaches it),
 * so neither selection nor qsort can make one seed pick different tokens on different libcs. */
static inline bool better(const kvg_candidate *a, const kvg_candidate *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp(const void *a, const void *b) {
    const kvg_candidate *x = a, *y = b;
    return better(x, y) ? -1 : better(y, x) ? 1 : 0;
}

static inline void swap_cand(kvg_candidate *a, kvg_candidate *b) {
    kvg_candidate t = *a;
    *a = *b;
    *b = t;
}

/* Partial selection (quickselect, median-of-three pivot): afterwards c[0..k) hold the k best
 * candidates in no particular order. O(n) on average instead of the O(n log n) of a sort. */
static void select_top(kvg_candidate *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (hi > lo) {
        int mid = lo + (hi - lo) / 2;
        if (better(&c[mid], &c[lo])) swap_cand(&c[mid], &c[lo]);
        if (better(&c[hi], &c[lo])) swap_cand(&c[hi], &c[lo]);
        if (better(&c[mid], &c[hi])) swap_cand(&c[mid], &c[hi]);
        /* c[hi] is now the median of the three: the pivot */
        int i = lo;
        for (int j = lo; j < hi; j++)
            if (better(&c[j], &c[hi])) swap_cand(&c[i++], &c[j]);
        swap_cand(&c[i], &c[hi]);
        if (i == k - 1 || i == k) return;
        if (i > k) hi = i - 1;
        else lo = i + 1;
    }
}

/* c[0..k) become the k best, sorted. */
static void sorted_top(kvg_candidate *c, int n, int k, bool full_sort) {
    if (full_sort) {
        qsort(c, (size_t)n, sizeof *c, cand_cmp);
        return;
    }
    if (k < n) select_top(c, n, k);
    qsort(c, (size_t)k, sizeof *c, cand_cmp);
}

/* p = exp(logit - max); returns the sum (unnormalised: draws scale by it) */
static double exp_weights(kvg_candidate *c, int n, float max) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        c[i].p = expf(c[i].logit - max);
        sum += c[i].p;
    }
    return sum;
}

/* The length of the shortest prefix of sorted c[0..n) whose weight reaches `mass`; 0 when
 * none does. */
static int keep_top_p(const kvg_candidate *c, int n, float max, double mass) {
    double cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += expf(c[i].logit - max);
        if (cum >= mass) return i + 1;
    }
    return 0;
}

static int32_t draw(const kvg_candidate *c, int n, double total, kvg_rng *rng) {
    double r = kvg_rng_uniform(rng) * total, cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (r < cum) return c[i].id;
    }
    return c[n - 1].id; /* r landed on the rounding slack at the end */
}

/* Penalties over the last `window` tokens of history, each distinct token once. */
static void apply_penalties(kvg_sampler *s, const int32_t *history, size_t n_history) {
    const kvg_sampler_params *p = &s->params;
    bool rep = p->repeat_penalty > 0.0f && p->repeat_penalty != 1.0f;
    if (!history || n_history == 0 || (!rep && p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f)) return;
    size_t window = p->penalty_window < 0 ? n_history
                    : p->penalty_window == 0 ? KVG_DEFAULT_PENALTY_WINDOW
                                             : (size_t)p->penalty_window;
    if (window > n_history) window = n_history;
    const int32_t *h = history + (n_history - window);
    int32_t *counts = s->counts;
    kvg_candidate *c = s->cand; /* still in id order here */
    for (size_t i = 0; i < window; i++)
        if (h[i] >= 0 && h[i] < s->n_vocab) counts[h[i]]++;
    for (size_t i = 0; i < window; i++) {
        int32_t t = h[i];
        if (t < 0 || t >= s->n_vocab || counts[t] == 0) continue;
        float l = c[t].logit;
        if (rep) l = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= (float)counts[t] * p->frequency_penalty + p->presence_penalty;
        c[t].logit = l;
        counts[t] = 0; /* done; also leaves the array zeroed for the next call */
    }
}

/* The chain after top-k: c[0..n) hold temperature-scaled logits (max is their largest), either
 * the top_k best sorted (selected) or every survivor in id order. Shared by the full-vector
 * path and the bounded one, so both draw the same token from the same state. */
static int32_t finish_chain(kvg_sampler *s, kvg_candidate *c, int n, float max, bool selected) {
    const kvg_sampler_params *p = &s->params;
    bool top_p = p->top_p > 0.0f && p->top_p < 1.0f;
    if (!selected && !top_p && !p->full_sort) {
        /* plain temperature (and min-p): draw over the survivors in id order, no sort */
        double total = exp_weights(c, n, max);
        return draw(c, n, total, &s->rng);
    }
    if (!selected) {
        /* top-p needs the most likely first: select a prefix big enough to hold the mass,
         * growing it 4x when it is not, instead of sorting everything */
        double total = exp_weights(c, n, max);
        int k = p->full_sort || n < 64 ? n : 64;
        for (;;) {
            sorted_top(c, n, k, p->full_sort);
            int keep = top_p ? keep_top_p(c, k, max, p->top_p * total) : 0;
            if (keep > 0) {
                n = keep;
                break;
            }
            if (k == n) break;
            k = k > n / 4 ? n : k * 4;
        }
    } else if (top_p) {
        int keep = keep_top_p(c, n, max, p->top_p * exp_weights(c, n, max));
        if (keep > 0) n = keep;
    }
    double total = exp_weights(c, n, max);
    return draw(c, n, total, &s->rng);
}

/* the lowest id among c[0..n) whose scaled logit (in .p) is `v` */
static int32_t lowest_id_at(const kvg_candidate *c, int n, float v) {
    int32_t id = -1;
    for (int i = 0; i < n; i++)
        if (c[i].p == v && (id < 0 || c[i].id < id)) id = c[i].id;
    return id;
}

/* keeps the candidates whose scaled logit (in .p) reaches the min-p cut; the order is kept */
static int filter_min_p(kvg_candidate *c, int n, float max, float min_p) {
    float cut = max + logf(min_p); /* p_i >= min_p * p_max  <=>  logit_i >= max + log(min_p) */
    int m = 0;
    for (int i = 0; i < n; i++)
        if (c[i].p >= cut) c[m++] = c[i];
    return m;
}

/* the scaled logits (.p) become the logits the rest of the chain works on */
static void use_scaled(kvg_candidate *c, int n) {
    for (int i = 0; i < n; i++) c[i].logit = c[i].p;
}

static int id_cmp(const void *a, const void *b) {
    const kvg_candidate *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

int32_t kvg_sampler_sample_ctx(kvg_sampler *s, const float *logits, const int32_t *history, size_t n_history,
                               const uint8_t *allowed) {
    const kvg_sampler_params *p = &s->params;
    int V = s->n_vocab;
    bool greedy = p->temperature <= 0.0f;
    bool rep = p->repeat_penalty > 0.0f && p->repeat_penalty != 1.0f;
    bool penalties = n_history > 0 && (rep || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f);
    if (greedy && !allowed && p->n_bias == 0 && !penalties) return kvg_argmax(logits, V);

    kvg_candidate *c = s->cand;
    for (int i = 0; i < V; i++) {
        float l = logits[i];
        if (isnan(l) || (allowed && !allowed[i])) l = -INFINITY;
        c[i] = (kvg_candidate){.id = i, .logit = l, .p = 0.0f};
    }
    for (int i = 0; i < p->n_bias; i++) c[p->bias[i].token].logit += p->bias[i].bias;
    apply_penalties(s, history, n_history);

    /* drop what is banned or masked; the order (by id) is kept */
    int n = 0;
    for (int i = 0; i < V; i++)
        if (c[i].logit > -INFINITY) c[n++] = c[i];
    if (n == 0) return -1;
    if (greedy) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (better(&c[i], &c[best])) best = i;
        return c[best].id;
    }
    /* the scaled logit goes to .p while .logit keeps the unscaled one: top-k selects by the
     * unscaled order (the same set and order as the scaled one, but rounding can never tie two
     * logits there), which is what a device's top-k hands kvg_sampler_sample_top */
    float max = -INFINITY;
    for (int i = 0; i < n; i++) {
        c[i].p = c[i].logit / p->temperature;
        if (i == 0 || c[i].p > max) max = c[i].p;
    }
    if (isinf(max)) return lowest_id_at(c, n, max); /* those tokens win outright, deterministically */
    if (p->min_p > 0.0f) n = filter_min_p(c, n, max, p->min_p);
    bool selected = p->top_k > 0 && p->top_k < n;
    if (selected) {
        sorted_top(c, n, p->top_k, p->full_sort);
        n = p->top_k;
    }
    use_scaled(c, n);
    return finish_chain(s, c, n, max, selected);
}

int kvg_sampler_top_needed(const kvg_sampler *s, size_t n_history, bool masked) {
    const kvg_sampler_params *p = &s->params;
    bool rep = p->repeat_penalty > 0.0f && p->repeat_penalty != 1.0f;
    bool penalties = n_history > 0 && (rep || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f);
    if (masked || penalties || p->n_bias > 0 || p->full_sort) return 0;
    if (p->temperature <= 0.0f) return 1;
    if (p->top_k > 0 && p->top_k < KVG_SAMPLER_MAX_TOP) return p->top_k + 1;
    return 0;
}

int32_t kvg_sampler_sample_top(kvg_sampler *s, const int32_t *ids, const float *logits, int n_top) {
    const kvg_sampler_params *p = &s->params;
    if (n_top < 1 || n_top > KVG_SAMPLER_MAX_TOP) return KVG_SAMPLE_NEED_ALL;
    if (p->temperature <= 0.0f) return ids[0];
    int k = p->top_k;
    if (k <= 0 || k >= n_top) return KVG_SAMPLE_NEED_ALL;
    /* the finite ones: a prefix, since -inf (and NaN, counted as -inf) sort last */
    kvg_candidate c[KVG_SAMPLER_MAX_TOP];
    int n = 0;
    for (int i = 0; i < n_top && i <= k; i++)
        if (logits[i] > -INFINITY) {
            c[n] = (kvg_candidate){.id = ids[i], .logit = logits[i], .p = logits[i] / p->temperature};
            n++;
        }
    if (n == 0) return -1;
    /* n == k + 1: more than top_k survive the bans, and every token not here is worse than
     * all of these; n <= k: these are all the survivors */
    bool full = n == k + 1;
    float max = c[0].p;
    if (isinf(max)) {
        if (full && c[n - 1].p == max) return KVG_SAMPLE_NEED_ALL; /* the tie may go on past the set */
        return lowest_id_at(c, n, max);
    }
    if (p->min_p > 0.0f) {
        int m = filter_min_p(c, n, max, p->min_p);
        full = full && m == n; /* min-p is a threshold: what it keeps is again a best prefix */
        n = m;
    }
    bool selected = full;
    if (selected) {
        n = k;
    } else {
        qsort(c, (size_t)n, sizeof *c, id_cmp); /* the full path holds the survivors in id order */
    }
    use_scaled(c, n);
    return finish_chain(s, c, n, max, selected);
}

int32_t kvg_sampler_sample(kvg_sampler *s, const float *logits) {
    return kvg_sampler_sample_ctx(s, logits, NULL, 0, NULL);
}
