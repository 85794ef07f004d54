/* token_bytes.c: every token's bytes in one table (kvg_token_bytes_get), built once per
 * tokenizer when first asked for and kept with it: the grammar's vocabulary trie, constrained
 * output and spelling a string as tokens all read this one table. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_host.h"
#include "kvg_tokenizer.h"

static kvg_token_bytes *token_bytes_build(const kvg_tokenizer *t, int n) {
    kvg_token_bytes *b = kvg_calloc(1, sizeof *b);
    if (b) b->off = kvg_malloc(((size_t)n + 1) * sizeof *b->off);
    if (!b || !b->off) {
        kvg_token_bytes_free(b);
        return NULL;
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        b->off[i] = (uint32_t)total;
        total += kvg_token_piece(t, i, 0, NULL, 0);
    }
    b->off[n] = (uint32_t)total;
    if (total >= UINT32_MAX || !(b->bytes = kvg_malloc(total + 1))) {
        kvg_token_bytes_free(b);
        return NULL;
    }
    for (int i = 0; i < n; i++) { /* exactly the piece's bytes (kvg_token_piece adds no NUL then) */
        size_t len = b->off[i + 1] - b->off[i];
        if (len) kvg_token_piece(t, i, 0, (char *)b->bytes + b->off[i], len);
    }
    b->bytes[total] = 0;
    b->n = n;
    return b;
}

const kvg_token_bytes *kvg_token_bytes_get(const kvg_tokenizer *t, int n_ids) {
    if (!t || n_ids < 0) return NULL;
    kvg_token_bytes **slot = kvg_tokenizer_bytes_slot(t);
    kvg_token_bytes *b = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (!b) {
        kvg_token_bytes *mine = token_bytes_build(t, n_ids);
        if (!mine) return NULL;
        kvg_token_bytes *expected = NULL;
        if (__atomic_compare_exchange_n(slot, &expected, mine, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            b = mine;
        } else { /* another thread stored its table first */
            kvg_token_bytes_free(mine);
            b = expected;
        }
    }
    return b->n == n_ids ? b : NULL;
}
