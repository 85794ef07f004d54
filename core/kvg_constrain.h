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
#include "kvg_sampler.h"

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

/* Every token's bytes (flags 0: control tokens are empty), built once per session. */
struct kvg_pieces {
    int n;
    uint32_t *off; /* n + 1 offsets into bytes */
    unsigned char *bytes;
};
kvgen_status kvg_pieces_get(kvgen_session *s, const kvg_pieces **out, kvgen_error *err);

/* allowed[t] = 1 for each token whose bytes the matcher accepts from st (end-of-generation
 * tokens when it can end). Returns how many are allowed. */
int kvg_cons_mask(const kvg_cons *k, const kvg_cons_state *st, const kvg_pieces *p, const kvgen_model *m,
                  uint8_t *allowed);

#endif
