/* grammar_match.c: the byte matcher over a compiled grammar (kvg_gram_match_*, kvg_gram_feed).
 *
 * The matcher is a set of stacks. A stack is a node (an element position, the node to go on
 * with after that position's rule ends) and nodes are hash-consed: the same (position, next)
 * pair is the same node, so equal stacks are equal ids. A matcher state is the sorted set of
 * stacks whose top is a byte class, plus whether the text can end here; states are interned
 * too, and each state's transitions by byte are computed once and remembered. The matcher is
 * thus a deterministic automaton built lazily as the text and the mask walk visit it: the mask
 * is one table lookup per trie edge it walks, and a subtree whose first byte is refused is
 * never entered. A reference that is the last element of its alternative does not keep a
 * frame (x* in a rule's tail stays one stack deep however long it repeats). An iteration of a
 * repetition that read nothing is not followed on, and a stack that another one dominates (a
 * chain x{m,n} with more iterations left, the rest equal) is dropped, so nested counted
 * repetitions keep a few stacks per state. Every routine that would recurse as deep as the
 * grammar (or a token) is a loop over a list of its own, and the matcher's work is counted in
 * steps and bounded per call (see the bounds below). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar_internal.h"

/* The matcher's bounds. Its work is counted in steps (a stack followed, a node interned, a
 * stack tested against a byte), never in time, so a grammar ends the same way on every
 * machine; its caches are forgotten between tokens past the soft bounds, so only one token's
 * work can reach the hard ones. */
#define MAX_STEPS (1 << 21)         /* per call: one token's mask, or one feed */
#define MAX_NODES (1 << 22)         /* matcher stacks (hard) */
#define SOFT_NODES (1 << 20)
#define MAX_STATES (1 << 16)        /* matcher states (each keeps a 1 KiB transition table) */
#define SOFT_STATES (1 << 13)
#define MAX_TOPS ((size_t)1 << 23)  /* stacks listed by all the states together */
#define SOFT_TOPS ((size_t)1 << 21)
#if defined(__GNUC__) && !defined(__MINGW32__) /* mingw checks against msvcrt's printf (no %zu) */
__attribute__((format(printf, 3, 4)))
#endif
static void mfail(kvg_gram_match *mt, kvgen_status st, const char *fmt, ...) {
    mt->oom = true;
    if (mt->fail.status != KVGEN_OK) return;
    mt->fail.status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mt->fail.message, sizeof mt->fail.message, fmt, ap);
    va_end(ap);
}

void kvg_gram_nomem(kvg_gram_match *mt) { mfail(mt, KVGEN_E_NO_MEMORY, "grammar: out of memory for the matcher"); }

/* one step of work; false (and the call stops) past the bound */
static bool step(kvg_gram_match *mt) {
    if (++mt->steps <= mt->max_steps) return true;
    if (mt->n_st == 0) {
        mfail(mt, KVGEN_E_UNSUPPORTED,
              "grammar: its start needs over %ld matcher steps (%d stack nodes): make the grammar less ambiguous or "
              "its repetitions shorter",
              mt->max_steps, mt->n_nodes);
        return false;
    }
    mfail(mt, KVGEN_E_UNSUPPORTED,
          "grammar: one token needs over %ld matcher steps (the grammar's cost here: %d states of up to %d stacks, "
          "%d stack nodes); the generation ends: make the grammar less ambiguous or its repetitions shorter",
          mt->max_steps, mt->n_st, mt->n_tmp > mt->widest ? mt->n_tmp : mt->widest, mt->n_nodes);
    return false;
}

static uint32_t mix(uint32_t h) {
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    return h;
}

static bool node_rehash(kvg_gram_match *mt, uint32_t cap) {
    int32_t *h = kvg_malloc((size_t)cap * sizeof *h);
    if (!h) return false;
    memset(h, 0xff, (size_t)cap * sizeof *h);
    for (int i = 0; i < mt->n_nodes; i++) {
        uint32_t k = mix((uint32_t)mt->npos[i] * 0x9e3779b1u ^ (uint32_t)mt->npar[i]) & (cap - 1);
        while (h[k] >= 0) k = (k + 1) & (cap - 1);
        h[k] = i;
    }
    kvg_free(mt->nhash);
    mt->nhash = h;
    mt->nhash_cap = cap;
    return true;
}

static int intern_node(kvg_gram_match *mt, int32_t pos, int32_t par) {
    if (!step(mt)) return -1;
    uint32_t mask = mt->nhash_cap - 1;
    uint32_t k = mix((uint32_t)pos * 0x9e3779b1u ^ (uint32_t)par) & mask;
    for (; mt->nhash[k] >= 0; k = (k + 1) & mask) {
        int i = mt->nhash[k];
        if (mt->npos[i] == pos && mt->npar[i] == par) return i;
    }
    if (mt->n_nodes >= MAX_NODES) {
        mfail(mt, KVGEN_E_UNSUPPORTED,
              "grammar: the matcher reached %d stacks in one token (the grammar is too ambiguous here); the "
              "generation ends",
              MAX_NODES);
        return -1;
    }
    if (mt->n_nodes == mt->cap_nodes) {
        int cap = mt->cap_nodes * 2;
        int32_t *a = kvg_realloc(mt->npos, (size_t)cap * sizeof *a);
        if (a) mt->npos = a;
        int32_t *b = a ? kvg_realloc(mt->npar, (size_t)cap * sizeof *b) : NULL;
        if (b) mt->npar = b;
        uint32_t *c = b ? kvg_realloc(mt->nstamp, (size_t)cap * sizeof *c) : NULL;
        if (c) mt->nstamp = c;
        uint32_t *d = c ? kvg_realloc(mt->cstamp, (size_t)cap * sizeof *d) : NULL;
        if (!d) {
            kvg_gram_nomem(mt);
            return -1;
        }
        mt->cstamp = d;
        mt->cap_nodes = cap;
    }
    int i = mt->n_nodes++;
    mt->npos[i] = pos;
    mt->npar[i] = par;
    mt->nstamp[i] = 0;
    mt->cstamp[i] = 0;
    mt->nhash[k] = i;
    if ((uint32_t)mt->n_nodes * 2 > mt->nhash_cap && !node_rehash(mt, mt->nhash_cap * 2)) kvg_gram_nomem(mt);
    return i;
}

static bool push_i32(kvg_gram_match *mt, int32_t **v, int *n, int *cap, int32_t x) {
    if (*n == *cap) {
        int c = *cap * 2;
        int32_t *t = kvg_realloc(*v, (size_t)c * sizeof *t);
        if (!t) {
            kvg_gram_nomem(mt);
            return false;
        }
        *v = t;
        *cap = c;
    }
    (*v)[(*n)++] = x;
    return true;
}

/* Follows node n until every stack's top is a byte class (into tmp) or the text may end. The
 * nodes still to follow are a list, not the C stack: nested repetitions of text that can be
 * empty reach thousands of rules deep before they read a byte. Each entry is node * 2 + fresh,
 * fresh when the node's parent was made by entering a rule in this closure, on this path (so
 * nothing was read since): an iteration of a repetition that ends fresh read nothing and is
 * not followed on (x{0,n} with an x that can be empty would otherwise hold a stack for every
 * count of empty iterations). A node is followed once as fresh and once as not (which allows
 * more), a stamp for each: stamp (not fresh) and stamp + 1 (fresh only). A frame made for a
 * reference keeps whether the node that made it was fresh (cstamp): a rule that ends fresh
 * goes on in that frame as fresh as its maker. */
static void closure(kvg_gram_match *mt, int n) {
    const kvg_gram *g = mt->g;
    mt->n_todo = 0;
    if (n < 0 || !push_i32(mt, &mt->todo, &mt->n_todo, &mt->cap_todo, n * 2)) return;
    while (mt->n_todo > 0 && !mt->oom) {
        int32_t entry = mt->todo[--mt->n_todo];
        bool fresh = entry & 1;
        n = entry >> 1;
        uint32_t seen = mt->nstamp[n];
        if (seen == mt->stamp || (fresh && seen == mt->stamp + 1) || !step(mt)) continue;
        mt->nstamp[n] = fresh ? mt->stamp + 1 : mt->stamp;
        int32_t pos = mt->npos[n], par = mt->npar[n];
        const gel *e = &g->elems[pos];
        if (e->kind == E_CHARS) {
            if (seen != mt->stamp + 1) push_i32(mt, &mt->tmp, &mt->n_tmp, &mt->cap_tmp, n);
        } else if (e->kind == E_END) {
            if (par < 0) mt->accept = 1;
            else if (!fresh) push_i32(mt, &mt->todo, &mt->n_todo, &mt->cap_todo, par * 2);
            else if (!g->loop[mt->npos[par]]) /* (a fresh end at a loop: an empty iteration) */
                push_i32(mt, &mt->todo, &mt->n_todo, &mt->cap_todo, par * 2 + (mt->cstamp[par] == mt->stamp + 1));
        } else {
            /* a reference: each alternative, going on after it (a reference in tail position
             * goes straight on with the parent: no frame, and the parent stays as fresh as it
             * was) */
            bool tail = g->elems[pos + 1].kind == E_END;
            int32_t cont = tail ? par : intern_node(mt, pos + 1, par);
            int32_t child_fresh = tail ? fresh : 1;
            if (!tail && cont >= 0) {
                uint32_t made = mt->cstamp[cont];
                if (made != mt->stamp && made != mt->stamp + 1) {
                    mt->cstamp[cont] = fresh ? mt->stamp + 1 : mt->stamp;
                } else if (made == mt->stamp + 1 && !fresh) {
                    mt->cstamp[cont] = mt->stamp; /* followed on as fresh already: again, as not */
                    if (mt->nstamp[cont] == mt->stamp + 1) push_i32(mt, &mt->todo, &mt->n_todo, &mt->cap_todo, cont * 2);
                }
            }
            int r = e->arg;
            for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1] && !mt->oom; a++) {
                int c = intern_node(mt, g->alt_start[a], cont);
                if (c >= 0) push_i32(mt, &mt->todo, &mt->n_todo, &mt->cap_todo, c * 2 + child_fresh);
            }
        }
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static uint32_t state_hash(const int32_t *t, int n, uint8_t accept) {
    uint32_t h = 0x12345u + accept;
    for (int i = 0; i < n; i++) h = mix(h ^ (uint32_t)t[i]) + 0x9e3779b9u;
    return h;
}

static bool state_rehash(kvg_gram_match *mt, uint32_t cap) {
    int32_t *h = kvg_malloc((size_t)cap * sizeof *h);
    if (!h) return false;
    memset(h, 0xff, (size_t)cap * sizeof *h);
    for (int i = 0; i < mt->n_st; i++) {
        const mstate *s = &mt->st[i];
        uint32_t k = state_hash(mt->tops + s->off, s->n, s->accept) & (cap - 1);
        while (h[k] >= 0) k = (k + 1) & (cap - 1);
        h[k] = i;
    }
    kvg_free(mt->shash);
    mt->shash = h;
    mt->shash_cap = cap;
    return true;
}

/* Stack a matches every text stack b matches: as deep, and at each level the same position
 * or the same place in a chain of a repetition with at least as many iterations left. */
static bool dominates(const kvg_gram_match *mt, int32_t a, int32_t b) {
    const kvg_gram *g = mt->g;
    while (a >= 0 && b >= 0 && a != b) {
        int32_t pa = mt->npos[a], pb = mt->npos[b];
        if (pa != pb && !(g->chain[pa] && g->chain[pa] == g->chain[pb] && g->rank[pa] >= g->rank[pb])) return false;
        a = mt->npar[a];
        b = mt->npar[b];
    }
    return a == b;
}

/* Drops from tmp each stack another one dominates: the state then allows the same bytes, and
 * the states after x{0,n} read a few different ways (how many iterations each part took) are
 * one state, not one per way. Pairs are compared in wide states only up to a bound. */
#define MAX_PRUNE 256
static void prune(kvg_gram_match *mt) {
    int n = mt->n_tmp;
    if (!mt->g->has_chains || n < 2 || n > MAX_PRUNE) return;
    uint8_t drop[MAX_PRUNE] = {0};
    const kvg_gram *g = mt->g;
    for (int i = 0; i < n; i++) {
        int32_t pi = mt->npos[mt->tmp[i]];
        for (int j = 0; j < n && !drop[i]; j++) {
            int32_t pj = mt->npos[mt->tmp[j]];
            if (j == i || (pi != pj && (!g->chain[pi] || g->chain[pi] != g->chain[pj]))) continue; /* at once */
            if (step(mt) && dominates(mt, mt->tmp[j], mt->tmp[i])) drop[i] = 1;
        }
    }
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!drop[i]) mt->tmp[k++] = mt->tmp[i];
    mt->n_tmp = k;
}

/* the state tmp + accept describe: its id, -1 when it is dead (or a bound was hit) */
static int intern_state(kvg_gram_match *mt) {
    if (mt->oom || (mt->n_tmp == 0 && !mt->accept)) return -1;
    prune(mt);
    if (mt->oom) return -1;
    if (mt->n_tmp > 1) qsort(mt->tmp, (size_t)mt->n_tmp, sizeof *mt->tmp, cmp_i32);
    uint32_t mask = mt->shash_cap - 1;
    uint32_t k = state_hash(mt->tmp, mt->n_tmp, mt->accept) & mask;
    for (; mt->shash[k] >= 0; k = (k + 1) & mask) {
        const mstate *s = &mt->st[mt->shash[k]];
        if (s->n == mt->n_tmp && s->accept == mt->accept &&
            memcmp(mt->tops + s->off, mt->tmp, (size_t)s->n * sizeof *mt->tmp) == 0)
            return mt->shash[k];
    }
    if (mt->n_st >= MAX_STATES || mt->n_tops + (size_t)mt->n_tmp > MAX_TOPS) {
        mfail(mt, KVGEN_E_UNSUPPORTED,
              "grammar: the matcher reached %d states or %d listed stacks in one token (the grammar is too costly "
              "here); the generation ends",
              MAX_STATES, (int)MAX_TOPS);
        return -1;
    }
    if (mt->n_st == mt->cap_st) {
        int cap = mt->cap_st * 2;
        mstate *n = kvg_realloc(mt->st, (size_t)cap * sizeof *n);
        if (!n) {
            kvg_gram_nomem(mt);
            return -1;
        }
        mt->st = n;
        mt->cap_st = cap;
    }
    if (mt->n_tops + (size_t)mt->n_tmp > mt->cap_tops) {
        size_t cap = mt->cap_tops * 2 + (size_t)mt->n_tmp;
        int32_t *t = kvg_realloc(mt->tops, cap * sizeof *t);
        if (!t) {
            kvg_gram_nomem(mt);
            return -1;
        }
        mt->tops = t;
        mt->cap_tops = cap;
    }
    memcpy(mt->tops + mt->n_tops, mt->tmp, (size_t)mt->n_tmp * sizeof *mt->tmp);
    if (mt->n_tmp > mt->widest) mt->widest = mt->n_tmp;
    int id = mt->n_st++;
    mt->st[id] = (mstate){(int32_t)mt->n_tops, mt->n_tmp, mt->accept, NULL};
    mt->n_tops += (size_t)mt->n_tmp;
    mt->shash[k] = id;
    if ((uint32_t)mt->n_st * 2 > mt->shash_cap && !state_rehash(mt, mt->shash_cap * 2)) kvg_gram_nomem(mt);
    return id;
}

static void begin_build(kvg_gram_match *mt) {
    mt->n_tmp = 0;
    mt->accept = 0;
    mt->stamp += 2; /* stamp and stamp + 1 (closure) */
    if (mt->stamp < 2) { /* wrapped: forget every mark */
        memset(mt->nstamp, 0, (size_t)mt->n_nodes * sizeof *mt->nstamp);
        memset(mt->cstamp, 0, (size_t)mt->n_nodes * sizeof *mt->cstamp);
        mt->stamp = 2;
    }
}

/* the state after byte b from state s; -1: b is refused (or a bound was hit: mt->oom) */
int kvg_gram_advance(kvg_gram_match *mt, int s, unsigned b) {
    mstate *S = &mt->st[s];
    if (S->trans && S->trans[b] != -2) return S->trans[b];
    if (mt->oom) return -1;
    if (!S->trans) {
        S->trans = kvg_malloc(256 * sizeof *S->trans);
        if (!S->trans) {
            kvg_gram_nomem(mt);
            return -1;
        }
        for (int i = 0; i < 256; i++) S->trans[i] = -2;
    }
    const kvg_gram *g = mt->g;
    begin_build(mt);
    int32_t off = S->off, n = S->n;
    for (int32_t i = 0; i < n && step(mt); i++) {
        int top = mt->tops[off + i];
        int32_t pos = mt->npos[top];
        if (!has_byte(&g->classes[g->elems[pos].arg], b)) continue;
        int nx = intern_node(mt, pos + 1, mt->npar[top]);
        if (nx < 0) break;
        closure(mt, nx);
    }
    int id = intern_state(mt);
    if (!mt->oom) mt->st[s].trans[b] = id; /* st may have moved */
    return id;
}

/* the state of the text's start: the root's alternatives, followed */
static int start_state(kvg_gram_match *mt) {
    const kvg_gram *g = mt->g;
    begin_build(mt);
    for (int a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++) {
        int c = intern_node(mt, g->alt_start[a], -1);
        if (c >= 0) closure(mt, c);
    }
    return intern_state(mt);
}

static void drop_tables(kvg_gram_match *mt) {
    for (int i = 0; i < mt->n_st; i++) kvg_free(mt->st[i].trans);
    kvg_free(mt->st);
    kvg_free(mt->tops);
    kvg_free(mt->shash);
    kvg_free(mt->npos);
    kvg_free(mt->npar);
    kvg_free(mt->nstamp);
    kvg_free(mt->cstamp);
    kvg_free(mt->nhash);
    mt->st = NULL;
    mt->tops = NULL;
    mt->shash = mt->npos = mt->npar = mt->nhash = NULL;
    mt->nstamp = mt->cstamp = NULL;
    mt->n_st = mt->n_nodes = 0;
    mt->n_tops = 0;
}

static bool new_tables(kvg_gram_match *mt) {
    mt->cap_nodes = 1024;
    mt->npos = kvg_malloc(1024 * sizeof *mt->npos);
    mt->npar = kvg_malloc(1024 * sizeof *mt->npar);
    mt->nstamp = kvg_malloc(1024 * sizeof *mt->nstamp);
    mt->cstamp = kvg_malloc(1024 * sizeof *mt->cstamp);
    mt->cap_st = 64;
    mt->st = kvg_malloc(64 * sizeof *mt->st);
    mt->cap_tops = 256;
    mt->tops = kvg_malloc(256 * sizeof *mt->tops);
    return mt->npos && mt->npar && mt->nstamp && mt->cstamp && mt->st && mt->tops && node_rehash(mt, 4096) &&
           state_rehash(mt, 256);
}

/* Forgets every node and state but the text's start and (keep_cur) the current state, whose
 * stacks are copied over: a long generation's caches stay within the soft bounds. */
static bool rebuild(kvg_gram_match *mt, bool keep_cur) {
    int32_t *chains = NULL; /* each top's stack, bottom first, after its length */
    size_t n_chain = 0;
    uint8_t accept = 0;
    int n_top = 0;
    if (keep_cur && mt->cur != mt->start && kvg_gram_cur_state(mt)) {
        const mstate *S = &mt->st[mt->cur];
        accept = S->accept;
        n_top = S->n;
        for (int i = 0; i < S->n; i++)
            for (int32_t v = mt->tops[S->off + i]; v >= 0; v = mt->npar[v]) n_chain++;
        chains = kvg_malloc((n_chain + (size_t)n_top + 1) * sizeof *chains);
        if (!chains) return false;
        size_t at = 0;
        for (int i = 0; i < S->n; i++) {
            size_t len_at = at++, len = 0;
            for (int32_t v = mt->tops[S->off + i]; v >= 0; v = mt->npar[v]) chains[at + len++] = mt->npos[v];
            for (size_t a = 0, z = len - 1; a < z; a++, z--) { /* bottom first */
                int32_t t = chains[at + a];
                chains[at + a] = chains[at + z];
                chains[at + z] = t;
            }
            chains[len_at] = (int32_t)len;
            at += len;
        }
    } else {
        keep_cur = false;
    }
    drop_tables(mt);
    mt->steps = 0;
    bool ok = new_tables(mt) && (mt->start = start_state(mt)) >= 0;
    mt->cur = mt->start;
    if (ok && keep_cur) {
        begin_build(mt);
        for (size_t i = 0, at = 0; ok && i < (size_t)n_top; i++) {
            int32_t len = chains[at++], node = -1;
            for (int32_t k = 0; ok && k < len; k++) ok = (node = intern_node(mt, chains[at + k], node)) >= 0;
            at += (size_t)len;
            ok = ok && push_i32(mt, &mt->tmp, &mt->n_tmp, &mt->cap_tmp, node);
        }
        mt->accept = accept;
        if (ok) ok = (mt->cur = intern_state(mt)) >= 0;
    }
    kvg_free(chains);
    mt->steps = 0;
    return ok && !mt->oom;
}

/* Between calls: past the soft bounds the caches are rebuilt (within the hard ones a single
 * call cannot go far past); the work count starts again. */
bool kvg_gram_begin_call(kvg_gram_match *mt) {
    if (mt->oom) return false;
    mt->steps = 0;
    if ((mt->n_nodes > SOFT_NODES || mt->n_st > SOFT_STATES || mt->n_tops > SOFT_TOPS) && !rebuild(mt, true)) {
        if (!mt->oom) kvg_gram_nomem(mt);
        return false;
    }
    return true;
}

void kvg_gram_match_free(kvg_gram_match *mt) {
    if (!mt) return;
    drop_tables(mt);
    kvg_free(mt->tmp);
    kvg_free(mt->todo);
    kvg_free(mt->walk);
    kvg_free(mt);
}

kvgen_status kvg_gram_match_new(const kvg_gram *g, kvg_gram_match **out, kvgen_error *err) {
    *out = NULL;
    kvg_gram_match *mt = kvg_calloc(1, sizeof *mt);
    if (mt) {
        mt->g = g;
        mt->max_steps = MAX_STEPS;
        mt->cap_tmp = 64;
        mt->tmp = kvg_malloc(64 * sizeof *mt->tmp);
        mt->cap_todo = 64;
        mt->todo = kvg_malloc(64 * sizeof *mt->todo);
    }
    if (!mt || !mt->tmp || !mt->todo || !new_tables(mt)) {
        kvg_gram_match_free(mt);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "grammar: out of memory for the matcher");
    }
    mt->start = start_state(mt);
    if (mt->start < 0) { /* a bound, or out of memory: root is productive */
        kvgen_status st = mt->fail.status != KVGEN_OK ? mt->fail.status : KVGEN_E_NO_MEMORY;
        kvgen_status rc = kvg_fail(err, st, "%s", mt->fail.status != KVGEN_OK ? mt->fail.message
                                                  : "grammar: out of memory for the matcher");
        kvg_gram_match_free(mt);
        return rc;
    }
    mt->cur = mt->start;
    *out = mt;
    return KVGEN_OK;
}

void kvg_gram_match_reset(kvg_gram_match *mt) {
    if (mt->oom) { /* a bound was hit: start again with empty caches */
        mt->oom = false;
        mt->fail = (kvgen_error){0};
        if (!rebuild(mt, false) && !mt->oom) kvg_gram_nomem(mt);
    }
    mt->cur = mt->start;
}

void kvg_gram_match_set_max_steps(kvg_gram_match *mt, long max_steps) {
    mt->max_steps = max_steps > 0 ? max_steps : MAX_STEPS;
}

const kvgen_error *kvg_gram_match_failure(const kvg_gram_match *mt) { return mt->oom ? &mt->fail : NULL; }

bool kvg_gram_feed(kvg_gram_match *mt, const unsigned char *bytes, size_t n) {
    if (!kvg_gram_begin_call(mt) || !kvg_gram_cur_state(mt)) return false;
    int s = mt->cur;
    for (size_t i = 0; i < n && s >= 0; i++) {
        if (mt->st[s].n == 0) return false;
        s = kvg_gram_advance(mt, s, bytes[i]);
    }
    if (s < 0) return false;
    mt->cur = s;
    return true;
}

bool kvg_gram_can_end(const kvg_gram_match *mt) {
    const mstate *S = kvg_gram_cur_state(mt);
    return S && S->accept != 0;
}

bool kvg_gram_done(const kvg_gram_match *mt) {
    const mstate *S = kvg_gram_cur_state(mt);
    return S && S->accept && S->n == 0;
}

