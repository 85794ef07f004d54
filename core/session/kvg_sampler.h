/* kvg_sampler.h: a session's token sampler and its RNG (private).
 *
 * The chain works on a candidate list (id, logit, p):
 *   mask (constraints) -> logit bias / bans -> repetition, frequency, presence penalties ->
 *   greedy | temperature -> min-p -> top-k -> top-p -> draw.
 * top-k selects by the logits before temperature (the same order; no rounding ties), so a
 * device's top-k set gives the same draws (kvg_sampler_sample_top).
 * Nothing sorts the whole vocabulary: top-k is a partial selection; top-p grows a selected
 * prefix until it holds the probability mass it needs; plain temperature sampling draws in id
 * order without sorting.
 *
 * For sessions (fork, save/restore): a forked session calls kvg_sampler_clone; a saved one
 * writes kvg_sampler_state_size() bytes with kvg_sampler_state_save and reads them back with
 * kvg_sampler_state_load into a sampler made by kvg_sampler_init for the same vocabulary. The
 * blob holds the settings and the RNG state, little-endian, versioned. */
#ifndef KVG_SAMPLER_H
#define KVG_SAMPLER_H
#include <stdbool.h>
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

/* The settings (kvgen_sampler_desc with its defaults resolved). `bias` is owned. */
typedef struct kvg_sampler_params {
    uint64_t seed;     /* 0: 0x5eed */
    float temperature; /* <= 0: greedy */
    int top_k;         /* <= 0: off */
    float top_p;       /* <= 0 or >= 1: off */
    float min_p;       /* <= 0: off */
    float repeat_penalty, frequency_penalty, presence_penalty;
    int penalty_window; /* 0: 64; < 0: whole history */
    kvgen_logit_bias *bias;
    int n_bias;
    bool full_sort; /* tests and benchmarks: sort the whole vocabulary (the slow baseline) */
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
    int32_t *counts;     /* n_vocab zeros between samples (penalty counting) */
} kvg_sampler;

/* params may be NULL (defaults); params->bias is copied. */
kvgen_status kvg_sampler_init(kvg_sampler *s, const kvg_sampler_params *params, int n_vocab, kvgen_error *err);
void kvg_sampler_free(kvg_sampler *s);
void kvg_sampler_reset(kvg_sampler *s); /* re-seeds the RNG */
/* Applies a public desc (NULL: all defaults). reseed: always re-seed (creation); otherwise only
 * when desc->seed != 0. Validates every field; on error nothing changes. */
kvgen_status kvg_sampler_set(kvg_sampler *s, const kvgen_sampler_desc *desc, bool reseed, kvgen_error *err);
void kvg_sampler_get(const kvg_sampler *s, kvgen_sampler_desc *desc);

/* Picks a token from n_vocab logits, with penalties over `history` (the session's tokens) and
 * only tokens whose `allowed` byte is non-zero (NULL: all). Returns -1 when no token is left
 * (everything banned or masked). Deterministic for a given seed and call sequence; greedy
 * draws no random number, every other choice exactly one. */
int32_t kvg_sampler_sample_ctx(kvg_sampler *s, const float *logits, const int32_t *history, size_t n_history,
                               const uint8_t *allowed);
/* ---- sampling from a bounded candidate set (a device's top-k; docs/generation.md) ----
 * How many of the best logits kvg_sampler_sample_top needs to draw exactly what
 * kvg_sampler_sample_ctx would draw from the whole vector: 1 for greedy, top_k + 1 for
 * temperature with top_k < KVG_SAMPLER_MAX_TOP (min-p and top-p on top are fine); 0 (the whole
 * vector) with a mask, logit bias or bans, penalties that apply (history of n_history tokens),
 * full_sort, or temperature without top-k. */
#define KVG_SAMPLER_MAX_TOP 64
#define KVG_SAMPLE_NEED_ALL (-2)
int kvg_sampler_top_needed(const kvg_sampler *s, size_t n_history, bool masked);
/* Draws from the n_top best logits, sorted best first (higher logit, then lower id; NaN as
 * -inf), n_top >= kvg_sampler_top_needed(): the same token and RNG use as
 * kvg_sampler_sample_ctx on the whole vector. Returns KVG_SAMPLE_NEED_ALL, drawing nothing,
 * when the set cannot decide (more tokens tie at +inf than it holds): sample the whole vector. */
int32_t kvg_sampler_sample_top(kvg_sampler *s, const int32_t *ids, const float *logits, int n_top);
/* kvg_sampler_sample_ctx without history or mask. */
int32_t kvg_sampler_sample(kvg_sampler *s, const float *logits);
/* index of the largest logit, lowest id on ties, NaN never wins (as -inf) */
int32_t kvg_argmax(const float *logits, int n);

/* Deep copy into an uninitialised dst (fork). */
kvgen_status kvg_sampler_clone(kvg_sampler *dst, const kvg_sampler *src, kvgen_error *err);
/* Serialised settings + RNG (save/restore). */
size_t kvg_sampler_state_size(const kvg_sampler *s);
void kvg_sampler_state_save(const kvg_sampler *s, void *buf); /* writes exactly state_size bytes */
/* Loads a state saved by kvg_sampler_state_save from buf[0, size): with `used` NULL the state
 * must be all of it; otherwise it may be followed by other data and *used is its length. On
 * error the sampler is as it was. */
kvgen_status kvg_sampler_state_load(kvg_sampler *s, const void *buf, size_t size, size_t *used, kvgen_error *err);

/* api.c: private accessors into a session (the session struct is api.c's) */
kvg_sampler *kvg_session_sampler(kvgen_session *s);
kvgen_model *kvg_session_model(const kvgen_session *s);
/* session.c: whether the session has logits to sample from (without fetching them) */
bool kvg_session_has_logits(const kvgen_session *s);
/* session.c: kvgen_session_sample with a token mask (NULL: none); reads back from the device
 * only what the sampler needs (kvg_sampler_top_needed); -1 when no token is left. */
int32_t kvg_session_sample_masked(kvgen_session *s, const uint8_t *allowed);

#endif
