/* spell.c: the session's token-piece table and spelling a string as tokens (kvg_spell.h),
 * shared by choice scoring (choose.c) and constrained output (constrain.c). */
#include "kvg_spell.h"
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_sampler.h"

void kvg_pieces_free(kvg_pieces *p) {
    if (!p) return;
    kvg_free(p->off);
    kvg_free(p->bytes);
    kvg_free(p);
}

/* Every token's bytes (flags 0) into one table. */
static kvgen_status pieces_build(const kvgen_model *m, int n, kvg_pieces **out, kvgen_error *err) {
    *out = NULL;
    kvg_pieces *p = kvg_calloc(1, sizeof *p);
    if (p) p->off = kvg_malloc(((size_t)n + 1) * sizeof *p->off);
    if (!p || !p->off) {
        kvg_pieces_free(p);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory for the token table");
    }
    size_t total = 0;
    for (int t = 0; t < n; t++) {
        p->off[t] = (uint32_t)total;
        total += kvgen_token_piece(m, t, 0, NULL, 0);
    }
    p->off[n] = (uint32_t)total;
    p->bytes = kvg_malloc(total + 1);
    if (!p->bytes || total > UINT32_MAX) {
        kvg_pieces_free(p);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory for the token table");
    }
    for (int t = 0; t < n; t++) {
        size_t len = p->off[t + 1] - p->off[t];
        if (len) {
            char *tmp = kvg_malloc(len + 1);
            if (!tmp) {
                kvg_pieces_free(p);
                return kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory for the token table");
            }
            kvgen_token_piece(m, t, 0, tmp, len + 1);
            memcpy(p->bytes + p->off[t], tmp, len);
            kvg_free(tmp);
        }
    }
    p->n = n;
    *out = p;
    return KVGEN_OK;
}

kvgen_status kvg_pieces_get(kvgen_session *s, const kvg_pieces **out, kvgen_error *err) {
    kvg_sampler *sm = kvg_session_sampler(s);
    if (!sm->pieces) {
        kvgen_status st = pieces_build(kvg_session_model(s), sm->n_vocab, &sm->pieces, err);
        if (st != KVGEN_OK) return st;
        sm->pieces_free = kvg_pieces_free;
    }
    *out = sm->pieces;
    return KVGEN_OK;
}

/* ---- spelling ----------------------------------------------------------------------------- */

void kvg_speller_init(kvg_speller *sp, const kvgen_model *m, kvgen_session *s, const kvg_pieces *p) {
    memset(sp, 0, sizeof *sp);
    sp->m = m;
    sp->s = s;
    sp->p = p;
}

void kvg_speller_free(kvg_speller *sp) {
    kvg_pieces_free(sp->own);
    kvg_free(sp->by_first);
    memset(sp, 0, sizeof *sp);
}

/* The token table and the tokens grouped by first byte (only a spelling that the tokenizer's
 * own tokens cannot give needs them). */
static kvgen_status speller_table(kvg_speller *sp, kvgen_error *err) {
    if (sp->by_first) return KVGEN_OK;
    kvgen_status st = KVGEN_OK;
    if (!sp->p && sp->s) st = kvg_pieces_get(sp->s, &sp->p, err);
    if (st == KVGEN_OK && !sp->p) {
        st = pieces_build(sp->m, sp->m->w.hp.n_vocab, &sp->own, err);
        sp->p = sp->own;
    }
    if (st != KVGEN_OK) return st;
    const kvg_pieces *p = sp->p;
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
    const kvg_pieces *p = sp->p;
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
