/* grammar_internal.h: what the grammar's files share (private to grammar_*.c): the compiled
 * grammar, the parser's rules (grammar_parse.c builds them, grammar_check.c checks them) and the
 * matcher's state (grammar_match.c runs it, grammar_vocab.c walks it over the vocabulary).
 *
 * A grammar compiles to rules; a rule is a list of alternatives, an alternative a sequence of
 * elements (a byte class, a reference to a rule) closed by END. Groups and repetitions become
 * helper rules: x* is R ::= x R | (empty), x? is R ::= x | (empty), x{m,n} is m copies of x
 * followed by a chain of n-m nested optionals. */
#ifndef KVG_GRAMMAR_INTERNAL_H
#define KVG_GRAMMAR_INTERNAL_H
#include "kvg_grammar.h"
#include "kvg_model.h" /* kvg_fail, kvg_malloc */

typedef enum el_kind { E_END = 0, E_REF, E_CHARS } el_kind;

typedef struct gel {
    uint8_t kind;
    int32_t arg; /* E_REF: rule; E_CHARS: class */
} gel;

typedef struct bclass {
    uint32_t bits[8];
} bclass;

struct kvg_gram {
    int n_rules, root;
    gel *elems;
    int n_elems;
    int32_t *alt_start; /* every alternative's first element */
    int32_t *rule_alt;  /* rule r's alternatives: alt_start[rule_alt[r] .. rule_alt[r + 1]) */
    bclass *classes;
    int n_classes;
    /* loop[e]: e follows x in the first alternative of a repetition's helper (x R or x O_k-1):
     * an iteration of x that read nothing is not followed there (it adds no text) */
    uint8_t *loop;
    /* chain[e], rank[e]: e is at the same place in the x alternative of O_rank of one chain
     * x{m,n} (O_k ::= x O_k-1 | (empty)); what may follow it grows with the rank (0: no chain) */
    int32_t *chain, *rank;
    bool has_chains;
};

static inline bool has_byte(const bclass *c, unsigned b) { return (c->bits[b >> 5] >> (b & 31)) & 1u; }

/* ---- the parser's rules (grammar_parse.c, grammar_check.c) ------------------------------- */

typedef struct palt {
    gel *e;
    int n, cap;
    bool loop; /* x R / x O_k-1 of a repetition (kvg_gram's loop) */
    int chain, rank; /* the x alternative of O_rank of a chain (kvg_gram's chain), or 0 */
} palt;

typedef struct prule {
    char *name;
    int line, col;     /* definition (or first use, while undefined) */
    bool defined, used;
    int owner;         /* helper rules: the user rule they belong to; user rules: themselves */
    const char *what;  /* helper rules: what made them (for messages) */
    palt *alts;
    int n_alts, cap_alts;
} prule;

typedef struct parser {
    const char *src, *p;
    prule *rules;
    int n_rules, cap_rules;
    bclass *cls;
    int n_cls, cap_cls;
    int single[256]; /* class of one byte, or -1 */
    int utf8_rule;   /* one multi-byte UTF-8 character, or -1 */
    int n_elems;
    int n_chains;
    int depth;       /* groups open around the parser */
    double expanded; /* the rules so far with their repetitions written out (elements) */
    int32_t *cls_at;  /* classes by content (open addressing, -1 empty) */
    uint32_t cls_at_cap;
    int32_t *names;   /* named rules by name (open addressing, -1 empty) */
    uint32_t names_cap;
    const char *w_at; /* where() goes on from its last answer: the text is read once */
    int w_line, w_col;
    kvgen_error *err;
    kvgen_status st;
} parser;

/* the parse fails with "out of memory" (unless it failed already) */
static inline void kvg_gram_parse_oom(parser *P) {
    if (P->st == KVGEN_OK) P->st = kvg_fail(P->err, KVGEN_E_NO_MEMORY, "grammar: out of memory");
}
/* Every rule defined, root (the rule named root, -1: none) present, no rule that never
 * completes (its dead alternatives are dropped), no left recursion; otherwise P->st and the
 * message say what is wrong. */
void kvg_gram_check(parser *P, int root);

/* ---- the matcher's state (grammar_match.c, grammar_vocab.c) ------------------------------ */

typedef struct mstate {
    int32_t off, n; /* tops[off .. off + n): stacks whose top is a byte class, sorted */
    uint8_t accept;
    int32_t *trans; /* 256 next states (-2: not computed, -1: refused); NULL until needed */
} mstate;

struct kvg_gram_match {
    const kvg_gram *g;
    int32_t *npos, *npar; /* node: element position, node to go on with (-1: the end) */
    uint32_t *nstamp;
    uint32_t *cstamp; /* closure: a frame made in it, by fresh entries only (stamp + 1) or not (stamp) */
    int n_nodes, cap_nodes;
    int32_t *nhash; /* node ids by (pos, parent); -1 empty */
    uint32_t nhash_cap;
    mstate *st;
    int n_st, cap_st;
    int32_t *tops;
    size_t n_tops, cap_tops;
    int32_t *shash; /* state ids by content */
    uint32_t shash_cap;
    int32_t *tmp; /* the state being built */
    int n_tmp, cap_tmp;
    int32_t *todo; /* closure's nodes still to follow */
    int n_todo, cap_todo;
    int32_t *walk; /* the mask's trie walk: (node, next child, state) per level */
    size_t cap_walk;
    uint8_t accept;
    uint32_t stamp;
    int start, cur;
    int widest;            /* the most stacks a state has held */
    long steps, max_steps; /* work of this call, and its bound */
    bool oom;              /* a bound was hit or memory ran out: the call stops (fail holds why) */
    kvgen_error fail;
};


/* the current state, or NULL where there is none: a rebuild that failed (a reset under a step
 * bound the start state needs more than, or out of memory) leaves no table and no start */
static inline const mstate *kvg_gram_cur_state(const kvg_gram_match *mt) {
    return mt->st && mt->cur >= 0 && mt->cur < mt->n_st ? &mt->st[mt->cur] : NULL;
}
/* Starts a call (a feed, a mask): the work count starts again, and past the soft bounds the
 * caches are rebuilt. False when the matcher failed (now or before). */
bool kvg_gram_begin_call(kvg_gram_match *mt);
/* the state after byte b from state s; -1: b is refused (or a bound was hit: mt->oom) */
int kvg_gram_advance(kvg_gram_match *mt, int s, unsigned b);
/* the call fails with "out of memory" (unless it failed already) */
void kvg_gram_nomem(kvg_gram_match *mt);

#endif
