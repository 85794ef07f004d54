/* buf.c: the growable byte buffer the text layers share (kvg_buf.h). */
#include <stdlib.h>
#include <string.h>
#include "kvg_buf.h"

bool kvg_buf_add(kvg_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = kvg_realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}
