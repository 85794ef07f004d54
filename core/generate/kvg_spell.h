/* kvg_spell.h: every token's bytes, and the tokens whose bytes are exactly a given string
 * (private; below choice scoring and constrained output, which both spell this way). */
#ifndef KVG_SPELL_H
#define KVG_SPELL_H
#include <stddef.h>
#include <stdint.h>
#include "kvg_sampler.h"
#include "kvgen.h"

/* Every token's bytes (flags 0: control tokens are empty), built once per session. */
struct kvg_pieces {
    int n;
    uint32_t *off; /* n + 1 offsets into bytes */
    unsigned char *bytes;
};
/* The session's table (kept with its sampler), built on first use. */
kvgen_status kvg_pieces_get(kvgen_session *s, const kvg_pieces **out, kvgen_error *err);
void kvg_pieces_free(kvg_pieces *p);

/* ---- spelling: the tokens whose bytes are exactly a given string --------------------------
 * The tokenizer's own tokens when they give back exactly its bytes (byte-level BPE always
 * does, for any bytes); otherwise (SentencePiece's prefix space, text it normalises) the
 * fewest tokens of the vocabulary whose bytes are exactly the string, from the token table:
 * the session's when `s` is given (built once per session), `p` when given, else a private
 * one built on first need. Both kvgen_session_choose and choice generation spell this way, so
 * the tokens scored are the tokens generated. */
typedef struct kvg_speller {
    const kvgen_model *m;
    kvgen_session *s;
    const kvg_pieces *p;
    kvg_pieces *own;
    uint32_t *by_first; /* token ids with a non-empty piece, grouped by first byte */
    uint32_t first_off[257];
} kvg_speller;
void kvg_speller_init(kvg_speller *sp, const kvgen_model *m, kvgen_session *s, const kvg_pieces *p);
void kvg_speller_free(kvg_speller *sp);
/* *out (malloc'd, caller frees) gets n >= 1 ids; KVGEN_E_INVALID_ARGUMENT (with a message
 * saying so) when no tokens of the vocabulary spell the string. */
kvgen_status kvg_spell(kvg_speller *sp, const char *text, int32_t **out, size_t *n, kvgen_error *err);

#endif
