/* detok.c: token ids back to text: whole sequences, and the streaming detokenizer that only
 * ever hands out complete UTF-8 (kvgen_detok), also byte-exact for constrained output. */
#include <stdlib.h>
#include <string.h>
#include "kvg_host.h"
#include "kvg_tokenizer.h"

#define REPLACEMENT "\xEF\xBF\xBD" /* U+FFFD */

/* Appends src to buf[at..size) (truncating; keeps room for the NUL) and returns the new length. */
static size_t append(char *buf, size_t size, size_t at, const char *src, size_t n) {
    if (size > 0 && at < size - 1) {
        size_t room = size - 1 - at;
        memcpy(buf + at, src, n < room ? n : room);
    }
    return at + n;
}

static void terminate(char *buf, size_t size, size_t len) {
    if (size > 0) buf[len < size ? len : size - 1] = 0;
}

/* The piece of `token` in `small`, or in *heap (caller frees) when it is longer; SentencePiece's
 * prefix space is removed from the first piece. Returns the length (0 when memory runs out). */
static size_t piece_of(const kvg_tokenizer *t, int32_t token, unsigned flags, int first, char *small, size_t cap,
                       char **heap, const char **start) {
    *heap = NULL;
    *start = small;
    size_t n = kvg_token_piece(t, token, flags, small, cap);
    if (n > cap) {
        *heap = kvg_malloc(n + 1);
        if (!*heap) return 0;
        kvg_token_piece(t, token, flags, *heap, n + 1);
        *start = *heap;
    }
    if (first && n > 0 && (*start)[0] == ' ' && kvg_tokenizer_strips_leading_space(t)) {
        (*start)++;
        n--;
    }
    return n;
}

size_t kvg_detokenize(const kvg_tokenizer *t, const int32_t *tokens, size_t n, unsigned flags, char *buf,
                      size_t size) {
    if (!buf) size = 0;
    if (!t || (!tokens && n)) {
        terminate(buf, size, 0);
        return 0;
    }
    size_t len = 0;
    char small[256], *heap;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t pn = piece_of(t, tokens[i], flags, i == 0, small, sizeof small, &heap, &p);
        len = append(buf, size, len, p, pn);
        kvg_free(heap);
    }
    terminate(buf, size, len);
    return len;
}

void kvgen_detok_init(kvgen_detok *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->first = 1;
}

/* Moves every complete character of src into buf; invalid bytes become U+FFFD and a valid
 * but unfinished character at the end is kept in d->pending. */
static size_t emit_utf8(kvgen_detok *d, const unsigned char *src, size_t n, char *buf, size_t size, size_t len) {
    size_t i = 0;
    while (i < n) {
        size_t cl, ok;
        kvg_utf8_scan(src + i, n - i, &cl, &ok);
        if (ok == cl) {
            len = append(buf, size, len, (const char *)src + i, cl);
            i += cl;
        } else if (ok == n - i) { /* cut off by the end: wait for the next token */
            memcpy(d->pending, src + i, ok);
            d->n_pending = (int)ok;
            return len;
        } else {
            len = append(buf, size, len, REPLACEMENT, 3);
            i += ok ? ok : 1;
        }
    }
    return len;
}

size_t kvg_detok_push(const kvg_tokenizer *t, kvgen_detok *d, int32_t token, unsigned flags, char *buf,
                      size_t size) {
    if (!buf) size = 0;
    if (!t || !d) {
        terminate(buf, size, 0);
        return 0;
    }
    char small[256], *heap;
    const char *p;
    size_t pn = piece_of(t, token, flags, d->first, small, sizeof small, &heap, &p);
    d->first = 0;
    if (d->n_pending < 0 || d->n_pending > 3) d->n_pending = 0;
    /* the held-back bytes go in front of the new piece and are scanned with it */
    unsigned char joined_small[sizeof small + 8], *joined = joined_small;
    size_t have = (size_t)d->n_pending, len = 0;
    if (have + pn > sizeof joined_small) {
        joined = kvg_malloc(have + pn);
        if (!joined) {
            kvg_free(heap);
            terminate(buf, size, 0);
            return 0;
        }
    }
    memcpy(joined, d->pending, have);
    if (pn) memcpy(joined + have, p, pn);
    d->n_pending = 0;
    len = emit_utf8(d, joined, have + pn, buf, size, len);
    if (joined != joined_small) kvg_free(joined);
    kvg_free(heap);
    terminate(buf, size, len);
    return len;
}

size_t kvgen_detok_flush(kvgen_detok *d, char *buf, size_t size) {
    if (!buf) size = 0;
    size_t len = 0;
    if (d && d->n_pending > 0) len = append(buf, size, len, REPLACEMENT, 3);
    if (d) d->n_pending = 0;
    terminate(buf, size, len);
    return len;
}

/* ---- constrained output: exact bytes ---- */

bool kvg_detok_exact(kvgen_detok *d, const unsigned char *src, size_t n, kvg_buf *out) {
    if (d->n_pending < 0 || d->n_pending > 3) d->n_pending = 0;
    unsigned char small[264], *joined = small;
    size_t have = (size_t)d->n_pending, total = have + n;
    if (total > sizeof small && !(joined = kvg_malloc(total))) return false;
    memcpy(joined, d->pending, have);
    if (n) memcpy(joined + have, src, n);
    d->n_pending = 0;
    size_t i = 0;
    bool ok = true;
    while (i < total) {
        size_t cl, good;
        kvg_utf8_scan(joined + i, total - i, &cl, &good);
        if (good != cl && good == total - i) { /* a character cut off by the end: wait */
            memcpy(d->pending, joined + i, good);
            d->n_pending = (int)good;
            break;
        }
        i += good == cl ? cl : good ? good : 1; /* a complete character, or bytes as they are */
    }
    if (i > 0) ok = kvg_buf_add(out, (const char *)joined, i);
    if (joined != small) kvg_free(joined);
    return ok;
}

size_t kvg_detok_flush_exact(kvgen_detok *d, char *buf, size_t size) {
    size_t n = d && d->n_pending > 0 && d->n_pending <= 3 ? (size_t)d->n_pending : 0;
    if (n > 0) append(buf, size, 0, (const char *)d->pending, n);
    if (d) d->n_pending = 0;
    terminate(buf, size, n);
    return n;
}
