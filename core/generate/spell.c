/* spell.c: the model's token bytes and spelling a string as tokens (kvg_spell.h), shared by
 * choice scoring (choose.c) and constrained output (constrain.c). */
#include "kvg_spell.h"
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"

kvgen_status kvg_vocab_bytes(const kvgen_model *m, const kvg_token_bytes **out, kvgen_error *err) {
    *out = kvg_token_bytes_get(m->tok, m->w.hp.n_vocab);
    return *out ? KVGEN_OK : kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory for the token table");
}

/* ---- spelling ----------------------------------------------------------------------------- */

void kvg_speller_init(kvg_speller *sp, const kvgen_model *m) {
    memset(sp, 0, sizeof *sp);
    sp->m = m;
}

void kvg_speller_free(kvg_speller *sp) {
    kvg_free(sp->by_first);
    memset(sp, 0, sizeof *sp);
}

/* The token table and the tokens grouped by first byte (only a spelling that the tokenizer's
 * own tokens cannot give needs them). */
static kvgen_status speller_table(kvg_speller *sp, kvgen_error *err) {
    if (sp->by_first) return KVGEN_OK;
    kvgen_status st = sp->p ? KVGEN_OK : kvg_vocab_bytes(sp->m, &sp->p, err);
    if (st != KVGEN_OK) return st;
    const kvg_token_bytes *p = sp->p;
    sp->by_first = kvg_malloc(((size_t)p->n + 1) * sizeof *sp->by_first);
    if (!sp->by_first) return kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory for the token table");
    uint32_t count[257] = {0};
    for (int t = 0; t < p->n; t++)
        if (p->off[t + 1] > p->off[t]) count[p->bytes[p->off[t]] + 1]++;
    for (int b = 0; b < 256; b++) count[b + 1] += count[b];
    memcpy(sp->first_off, count, sizeof count);
    for (int t = 0; t < p->n; t++) /* ascending ids within each byte */
        if (p->off[t + 1] > p->off[t]) sp->by_first[count[p->bytes[p->off[t]]]++] = (uint32_t)t;
    return KVGEN_OK;
}

/* Whether `toks` spell exactly text[0..len). */
static bool spells(const kvgen_model *m, const int32_t *toks, size_t n, const char *text, size_t len) {
    size_t at = 0;
    char small[64];
    for (size_t i = 0; i < n; i++) {
        size_t k = kvgen_token_piece(m, toks[i], 0, NULL, 0);
        if (k == 0 || k > len - at) return false;
        char *buf = k < sizeof small ? small : kvg_malloc(k + 1);
        if (!buf) return false;
        kvgen_token_piece(m, toks[i], 0, buf, k + 1);
        bool same = memcmp(buf, text + at, k) == 0;
        if (buf != small) kvg_free(buf);
        if (!same) return false;
        at += k;
    }
    return at == len;
}

/* The fewest tokens whose bytes are exactly text[0..len) (lowest ids among equals), or
 * KVGEN_E_INVALID_ARGUMENT when the vocabulary cannot spell it. */
static kvgen_status spell_exact(kvg_speller *sp, const char *text, size_t len, int32_t **out, size_t *n_out,
                                kvgen_error *err) {
    kvgen_status st = speller_table(sp, err);
    if (st != KVGEN_OK) return st;
    const kvg_token_bytes *p = sp->p;
    size_t *best = kvg_malloc((len + 1) * sizeof *best);
    int32_t *via = kvg_malloc((len + 1) * sizeof *via);
    if (!best || !via) {
        kvg_free(best);
        kvg_free(via);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory");
    }
    best[0] = 0;
    for (size_t i = 1; i <= len; i++) best[i] = SIZE_MAX;
    for (size_t i = 0; i < len; i++) {
        if (best[i] == SIZE_MAX) continue;
        unsigned char b = (unsigned char)text[i];
        for (uint32_t e = sp->first_off[b]; e < sp->first_off[b + 1]; e++) {
            int32_t t = (int32_t)sp->by_first[e];
            size_t k = p->off[t + 1] - p->off[t];
            if (k > len - i || kvgen_token_is_eog(sp->m, t) || memcmp(p->bytes + p->off[t], text + i, k) != 0) continue;
            if (best[i] + 1 < best[i + k]) {
                best[i + k] = best[i] + 1;
                via[i + k] = t;
            }
        }
    }
    if (best[len] == SIZE_MAX) {
        kvg_free(best);
        kvg_free(via);
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "the vocabulary has no tokens that spell these bytes exactly");
    }
    size_t n = best[len];
    int32_t *v = kvg_malloc((n ? n : 1) * sizeof *v);
    if (!v) {
        kvg_free(best);
        kvg_free(via);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory");
    }
    for (size_t at = len, j = n; j > 0; j--) {
        v[j - 1] = via[at];
        at -= p->off[via[at] + 1] - p->off[via[at]];
    }
    kvg_free(best);
    kvg_free(via);
    *out = v;
    *n_out = n;
    return KVGEN_OK;
}

kvgen_status kvg_spell(kvg_speller *sp, const char *text, int32_t **out, size_t *n_out, kvgen_error *err) {
    *out = NULL;
    *n_out = 0;
    size_t len = strlen(text), cap = len + 8, n = 0;
    int32_t *v = kvg_malloc(cap * sizeof *v);
    if (!v) return kvg_fail(err, KVGEN_E_NO_MEMORY, "out of memory");
    kvgen_error terr = {0};
    kvgen_status st = kvgen_tokenize(sp->m, text, len, 0, v, cap, &n, &terr);
    if (st == KVGEN_E_INVALID_ARGUMENT && n > cap) {
        int32_t *w = kvg_realloc(v, n * sizeof *v);
        if (!w) {
            kvg_free(v);
            return kvg_fail(err, KVGEN_E_NO_MEMORY, "out of memory");
        }
        v = w;
        cap = n;
        st = kvgen_tokenize(sp->m, text, len, 0, v, cap, &n, &terr);
    }
    if (st == KVGEN_E_NO_MEMORY) {
        kvg_free(v);
        if (err) *err = terr;
        return st;
    }
    /* the tokenizer's own tokens when they give back exactly these bytes (byte-level BPE always
     * does; SentencePiece's prefix space does not) */
    if (st == KVGEN_OK && n > 0 && spells(sp->m, v, n, text, len)) {
        *out = v;
        *n_out = n;
        return KVGEN_OK;
    }
    kvg_free(v);
    return spell_exact(sp, text, len, out, n_out, err);
}
