/* kvg_sampler.h: a session's token sampler and its RNG (private).
 *
 * The sampler is a chain of stages over a candidate list (id, logit, p). Today the chain is
 * temperature -> top-k -> softmax -> top-p -> draw; logit bias, repetition penalties and min-p
 * slot in as further stages on the same candidate list without changing the callers. */
#ifndef KVG_SAMPLER_H
#define KVG_SAMPLER_H
#include <stddef.h>
#include <stdint.h>
#include "kvgen.h"

/* xoshiro256**: small, fast, and its whole state lives in the session. */
typedef struct kvg_rng {
    uint64_t s[4];
} kvg_rng;

void kvg_rng_seed(kvg_rng *r, uint64_t seed); /* expands the seed with splitmix64 */
uint64_t kvg_rng_next(kvg_rng *r);
double kvg_rng_uniform(kvg_rng *r); /* [0, 1) with 53 random bits */

typedef struct kvg_sampler_params {
    uint64_t seed;     /* 0: 0x5eed */
    float temperature; /* <= 0: greedy */
    int top_k;         /* <= 0: off */
    float top_p;       /* <= 0 or >= 1: off */
} kvg_sampler_params;

typedef struct kvg_candidate {
    int32_t id;
    float logit;
    float p;
} kvg_candidate;

typedef struct kvg_sampler {
    kvg_sampler_params params;
    kvg_rng rng;
    int n_vocab;
    kvg_candidate *cand; /* n_vocab scratch entries: no allocation per sample */
} kvg_sampler;

kvgen_status kvg_sampler_init(kvg_sampler *s, const kvg_sampler_params *params, int n_vocab, kvgen_error *err);
void kvg_sampler_free(kvg_sampler *s);
void kvg_sampler_reset(kvg_sampler *s); /* re-seeds the RNG */
/* Picks a token from n_vocab logits. Deterministic for a given seed and call sequence. */
int32_t kvg_sampler_sample(kvg_sampler *s, const float *logits);
/* index of the largest logit, lowest id on ties */
int32_t kvg_argmax(const float *logits, int n);

#endif
