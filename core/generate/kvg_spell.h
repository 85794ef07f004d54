/* kvg_spell.h: the model's token bytes, and the tokens whose bytes are exactly a given string
 * (private; below choice scoring and constrained output, which both spell this way). */
#ifndef KVG_SPELL_H
#define KVG_SPELL_H
#include <stddef.h>
#include <stdint.h>
#include "kvg_tokenizer.h"
#include "kvgen.h"

/* Every token's bytes (kvg_token_bytes_get: built once per model, on first use), or
 * KVGEN_E_NO_MEMORY saying so. */
kvgen_status kvg_vocab_bytes(const kvgen_model *m, const kvg_token_bytes **out, kvgen_error *err);

/* ---- spelling: the tokens whose bytes are exactly a given string --------------------------
 * The tokenizer's own tokens when they give back exactly its bytes (byte-level BPE always
 * does, for any bytes); otherwise (SentencePiece's prefix space, text it normalises) the
 * fewest tokens of the vocabulary whose bytes are exactly the string, from the model's token
 * bytes (kvg_vocab_bytes). Both kvgen_session_choose and choice generation spell this way, so
 * the tokens scored are the tokens generated. */
typedef struct kvg_speller {
    const kvgen_model *m;
    const kvg_token_bytes *p; /* NULL until a spelling needs it */
    uint32_t *by_first; /* token ids with a non-empty piece, grouped by first byte */
    uint32_t first_off[257];
} kvg_speller;
void kvg_speller_init(kvg_speller *sp, const kvgen_model *m);
void kvg_speller_free(kvg_speller *sp);
/* *out (malloc'd, caller frees) gets n >= 1 ids; KVGEN_E_INVALID_ARGUMENT (with a message
 * saying so) when no tokens of the vocabulary spell the string. */
kvgen_status kvg_spell(kvg_speller *sp, const char *text, int32_t **out, size_t *n, kvgen_error *err);

#endif
