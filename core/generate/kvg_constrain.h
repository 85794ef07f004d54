/* kvg_constrain.h: constrained output as a byte-level matcher over a sequence of segments
 * (literal text, a JSON string body, a JSON number, one of a set of strings) (private).
 *
 * The matcher state is a few integers, so checking a token is: copy the state, feed the
 * token's bytes, see whether every byte was accepted. */
#ifndef KVG_CONSTRAIN_H
#define KVG_CONSTRAIN_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvg_generate.h"
#include "kvg_sampler.h"
#include "kvg_spell.h"
#include "kvg_tokenizer.h" /* kvg_detok_exact: the text of constrained output */

typedef struct kvg_cons kvg_cons;

typedef struct kvg_cons_state {
    int seg;     /* current segment; == n_segs: complete */
    int a, b, c; /* the segment's own progress */
} kvg_cons_state;

/* Validates and compiles a public constraint (kind NONE gives *out = NULL). */
kvgen_status kvg_cons_build(const kvgen_constraint *k, kvg_cons **out, kvgen_error *err);
void kvg_cons_free(kvg_cons *k);
void kvg_cons_start(const kvg_cons *k, kvg_cons_state *st);
/* false (state unspecified) when the byte is not allowed here */
bool kvg_cons_feed(const kvg_cons *k, kvg_cons_state *st, unsigned char byte);
/* The text could end here (an end-of-generation token is allowed). */
bool kvg_cons_can_end(const kvg_cons *k, const kvg_cons_state *st);
/* Nothing can follow: generation is finished. */
bool kvg_cons_done(const kvg_cons *k, const kvg_cons_state *st);


/* allowed[t] = 1 for each token whose bytes the matcher accepts from st (end-of-generation
 * tokens when it can end); once a choice is picked (kvg_cons_select), only the next token of
 * its spelling. *n_allowed: how many are allowed. An error when a grammar's matcher reaches
 * one of its bounds (work per token, memory): the generation ends with it. */
kvgen_status kvg_cons_mask(const kvg_cons *k, const kvg_cons_state *st, const kvg_token_bytes *p, const kvgen_model *m,
                           uint8_t *allowed, int *n_allowed, kvgen_error *err);

/* ---- choices (KVGEN_CONSTRAIN_CHOICE; JSON enum values are only checked) ------------------- */

/* Spells every string of every choice segment; KVGEN_E_INVALID_ARGUMENT naming the first one
 * the vocabulary cannot spell. keep_spelling: a choice constraint keeps them for
 * kvg_cons_select. */
kvgen_status kvg_cons_spell(kvg_cons *k, kvg_speller *sp, bool keep_spelling, kvgen_error *err);
/* kvg_cons_build and kvg_cons_spell for a check only (job submit: touches no session). */
kvgen_status kvg_cons_check(const kvgen_constraint *c, const kvgen_model *m, kvgen_error *err);
/* A choice constraint, before its first token: scores every choice from the session's
 * current logits exactly as kvgen_session_choose scores the caller's list (first occurrences,
 * in order) and picks one: greedy samplers the best total log-probability (the first on
 * ties), others draw one number from the session's RNG with p ~ exp(logprob / temperature).
 * Choices that need a token the logit bias bans (-inf) are never picked. Then st holds that
 * choice alone and kvg_cons_mask allows exactly its spelling. No-op for other constraints and
 * after the pick. */
kvgen_status kvg_cons_select(kvg_cons *k, kvg_cons_state *st, kvgen_session *s, kvgen_error *err);

/* choose.c: the scores kvgen_session_choose gives n spelled candidates (total log-probability
 * of each token sequence as a continuation of the session's current logits; the session is
 * unchanged). */
kvgen_status kvg_score_sequences(kvgen_session *s, const int32_t *const *toks, const size_t *n_toks, size_t n,
                                 double *logprob, kvgen_error *err);

#endif
