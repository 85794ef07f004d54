/* grammar_vocab.c: the vocabulary as a byte trie (built once per model) and the token mask:
 * the matcher walked over the trie, a subtree whose first byte is refused never entered. */
#include <stdlib.h>
#include <string.h>
#include "grammar_internal.h"
#include "kvg_model.h"
#include "kvg_tokenizer.h"

/* Nodes in depth-first order, children by byte: node i's subtree is [i, end[i]), its first
 * child (if any) is i + 1 and the next sibling of a child c is end[c]. Node 0 is the root. */
struct kvg_vocab_trie {
    int n_vocab, n_nodes;
    int depth; /* the longest token's length */
    uint8_t *byte;
    int32_t *end;
    int32_t *tok_at, *tok_n; /* tokens whose bytes end at the node: toks[tok_at .. + tok_n) */
    int32_t *toks;
    int32_t *eog;
    int n_eog;
};

static void trie_free(void *p) {
    kvg_vocab_trie *t = p;
    if (!t) return;
    kvg_free(t->byte);
    kvg_free(t->end);
    kvg_free(t->tok_at);
    kvg_free(t->tok_n);
    kvg_free(t->toks);
    kvg_free(t->eog);
    kvg_free(t);
}

typedef struct tok_ref {
    const unsigned char *b;
    uint32_t len;
    int32_t id;
} tok_ref;

static int tok_cmp(const void *a, const void *b) {
    const tok_ref *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->b, y->b, n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The trie of n tokens whose bytes are bytes[off[t] .. off[t + 1]); eog[t]: an
 * end-of-generation token (never in the trie). */
static kvg_vocab_trie *trie_from(int n, const uint32_t *off, const unsigned char *bytes, const uint8_t *eog) {
    kvg_vocab_trie *t = kvg_calloc(1, sizeof *t);
    tok_ref *refs = kvg_malloc(((size_t)n + 1) * sizeof *refs);
    bool ok = t && refs;
    size_t total = off[n];
    int n_refs = 0, n_eog = 0;
    for (int i = 0; ok && i < n; i++) {
        n_eog += eog[i] != 0;
        if (off[i + 1] > off[i] && !eog[i]) refs[n_refs++] = (tok_ref){bytes + off[i], off[i + 1] - off[i], i};
    }
    if (ok) {
        t->n_vocab = n;
        t->eog = kvg_malloc(((size_t)n_eog + 1) * sizeof *t->eog);
        ok = t->eog != NULL;
        for (int i = 0; ok && i < n; i++)
            if (eog[i]) t->eog[t->n_eog++] = i;
    }
    size_t cap = total + 1; /* at most one node per byte, plus the root */
    if (ok) {
        qsort(refs, (size_t)n_refs, sizeof *refs, tok_cmp);
        t->byte = kvg_malloc(cap);
        t->end = kvg_malloc(cap * sizeof *t->end);
        t->tok_at = kvg_calloc(cap, sizeof *t->tok_at);
        t->tok_n = kvg_calloc(cap, sizeof *t->tok_n);
        t->toks = kvg_malloc(((size_t)n_refs + 1) * sizeof *t->toks);
        ok = t->byte && t->end && t->tok_at && t->tok_n && t->toks;
    }
    uint32_t max_len = 0;
    for (int i = 0; ok && i < n_refs; i++)
        if (refs[i].len > max_len) max_len = refs[i].len;
    int32_t *path = ok ? kvg_malloc(((size_t)max_len + 1) * sizeof *path) : NULL;
    if (ok && (ok = path != NULL)) {
        int nodes = 1, depth = 0;
        path[0] = 0;
        t->byte[0] = 0;
        const tok_ref *prev = NULL;
        for (int i = 0; i < n_refs; i++) {
            const tok_ref *r = &refs[i];
            uint32_t lcp = 0;
            if (prev)
                while (lcp < r->len && lcp < prev->len && r->b[lcp] == prev->b[lcp]) lcp++;
            while ((uint32_t)depth > lcp) t->end[path[depth--]] = nodes;
            for (uint32_t k = lcp; k < r->len; k++) {
                t->byte[nodes] = r->b[k];
                path[++depth] = nodes++;
            }
            int at = path[depth];
            if (t->tok_n[at] == 0) t->tok_at[at] = i;
            t->tok_n[at]++;
            t->toks[i] = r->id;
            prev = r;
        }
        while (depth >= 0) t->end[path[depth--]] = nodes;
        t->n_nodes = nodes;
        t->depth = (int)max_len;
    }
    kvg_free(path);
    kvg_free(refs);
    if (!ok) {
        trie_free(t);
        return NULL;
    }
    return t;
}

kvg_vocab_trie *kvg_vocab_trie_build(int n, const uint32_t *off, const unsigned char *bytes, const uint8_t *eog) {
    return trie_from(n, off, bytes, eog);
}

void kvg_vocab_trie_free(kvg_vocab_trie *t) { trie_free(t); }

/* the model's token bytes (kvg_token_bytes_get: control tokens are empty) */
static kvg_vocab_trie *trie_build(const kvgen_model *m) {
    int n = m->w.hp.n_vocab;
    const kvg_token_bytes *tb = kvg_token_bytes_get(m->tok, n);
    uint8_t *eog = tb ? kvg_malloc((size_t)n + 1) : NULL;
    if (!eog) return NULL;
    for (int i = 0; i < n; i++) eog[i] = kvgen_token_is_eog(m, i) != 0;
    kvg_vocab_trie *t = trie_from(n, tb->off, tb->bytes, eog);
    kvg_free(eog);
    return t;
}

/* the model's trie, hung on it (kvg_model_attach) when a grammar first needs it */
static const kvg_attach_key vocab_trie_key = {"vocabulary trie", trie_free};

kvgen_status kvg_vocab_trie_get(const kvgen_model *cm, const kvg_vocab_trie **out, kvgen_error *err) {
    kvgen_model *m = (kvgen_model *)cm; /* the trie is a cache of the model's vocabulary */
    kvg_vocab_trie *t = kvg_model_attached(m, &vocab_trie_key);
    if (!t) {
        kvg_vocab_trie *mine = trie_build(m);
        if (mine && (t = kvg_model_attach(m, &vocab_trie_key, mine)) != mine) trie_free(mine); /* another thread's won */
        if (!t) return kvg_fail(err, KVGEN_E_NO_MEMORY, "grammar: out of memory for the vocabulary trie");
    }
    *out = t;
    return KVGEN_OK;
}

/* The trie walked depth first with a list of levels (a token may be longer than the C stack
 * is deep): each level is (node, its next child to try, the state at the node). A child whose
 * byte is refused is never entered, and each state's transitions are computed once. */
int kvg_gram_mask(kvg_gram_match *mt, const kvg_vocab_trie *t, uint8_t *allowed, kvgen_error *err) {
    memset(allowed, 0, (size_t)t->n_vocab);
    int count = 0;
    size_t need = ((size_t)t->depth + 2) * 3;
    if (kvg_gram_begin_call(mt) && need > mt->cap_walk) {
        int32_t *w = kvg_realloc(mt->walk, need * sizeof *w);
        if (w) {
            mt->walk = w;
            mt->cap_walk = need;
        } else {
            kvg_gram_nomem(mt);
        }
    }
    if (!mt->oom && kvg_gram_cur_state(mt) && kvg_gram_cur_state(mt)->n > 0) {
        int32_t *w = mt->walk;
        int top = 0;
        w[0] = 0;
        w[1] = 1;
        w[2] = mt->cur;
        while (top >= 0 && !mt->oom) {
            int32_t *lv = w + 3 * top;
            int c = lv[1];
            if (c >= t->end[lv[0]]) {
                top--;
                continue;
            }
            lv[1] = t->end[c];
            int s2 = kvg_gram_advance(mt, lv[2], t->byte[c]);
            if (s2 < 0) continue;
            for (int k = 0; k < t->tok_n[c]; k++) allowed[t->toks[t->tok_at[c] + k]] = 1;
            count += t->tok_n[c];
            if (mt->st[s2].n > 0 && t->end[c] > c + 1) {
                int32_t *nx = w + 3 * ++top;
                nx[0] = c;
                nx[1] = c + 1;
                nx[2] = s2;
            }
        }
    }
    if (mt->oom) {
        memset(allowed, 0, (size_t)t->n_vocab);
        kvg_fail(err, mt->fail.status != KVGEN_OK ? mt->fail.status : KVGEN_E_NO_MEMORY, "%s",
                 mt->fail.status != KVGEN_OK ? mt->fail.message : "grammar: out of memory for the matcher");
        return -1;
    }
    if (kvg_gram_can_end(mt)) {
        for (int i = 0; i < t->n_eog; i++) allowed[t->eog[i]] = 1;
        count += t->n_eog;
    }
    return count;
}

/* Each token fed from the current state on its own. The caches are rebuilt (begin_call) once,
 * before the first: a rebuild between tokens would renumber the state they all start from. */
int kvg_gram_mask_brute(kvg_gram_match *mt, const kvgen_model *m, uint8_t *allowed) {
    int n = m->w.hp.n_vocab, count = 0;
    bool live = kvg_gram_begin_call(mt) && kvg_gram_cur_state(mt);
    bool can_end = kvg_gram_can_end(mt);
    int cur = mt->cur;
    for (int t = 0; t < n; t++) {
        allowed[t] = 0;
        if (kvgen_token_is_eog(m, t)) {
            allowed[t] = can_end;
        } else if (live && !mt->oom) {
            size_t len = kvgen_token_piece(m, t, 0, NULL, 0);
            unsigned char buf[1024];
            if (len == 0 || len >= sizeof buf) continue;
            kvgen_token_piece(m, t, 0, (char *)buf, sizeof buf);
            mt->steps = 0; /* each token is a feed of its own */
            int s = cur;
            for (size_t i = 0; i < len && s >= 0; i++) s = mt->st[s].n == 0 ? -1 : kvg_gram_advance(mt, s, buf[i]);
            allowed[t] = s >= 0 && !mt->oom;
        }
        count += allowed[t];
    }
    return count;
}
