/* grammar.c: GBNF grammars (kvg_grammar.h): the parser, the checks that refuse a grammar
 * that cannot complete, the byte matcher and the token mask over the vocabulary's byte trie.
 *
 * A grammar compiles to rules; a rule is a list of alternatives, an alternative a sequence of
 * elements (a byte class, a reference to a rule) closed by END. Groups and repetitions become
 * helper rules: x* is R ::= x R | (empty), x? is R ::= x | (empty), x{m,n} is m copies of x
 * followed by a chain of n-m nested optionals.
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
#include "kvg_grammar.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_tokenizer.h"

#define MAX_REPEAT 4096        /* x{m,n}: m and n at most this */
#define MAX_ELEMS (1 << 22)    /* elements of a compiled grammar */
#define MAX_EXPANDED (1 << 20) /* elements of the grammar with every repetition written out */
#define MAX_NESTING 256        /* groups inside groups */
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

static bool has_byte(const bclass *c, unsigned b) { return (c->bits[b >> 5] >> (b & 31)) & 1u; }
static void set_byte(bclass *c, unsigned b) { c->bits[b >> 5] |= 1u << (b & 31); }
static void set_range(bclass *c, unsigned lo, unsigned hi) {
    for (unsigned b = lo; b <= hi; b++) set_byte(c, b);
}

/* ---- the parser --------------------------------------------------------------------------- */

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

static void where(parser *P, const char *at, int *line, int *col) {
    const char *q = P->src;
    *line = 1;
    *col = 1;
    if (P->w_at && P->w_at <= at) {
        q = P->w_at;
        *line = P->w_line;
        *col = P->w_col;
    }
    for (; q < at && *q; q++) {
        if (*q == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
    P->w_at = q;
    P->w_line = *line;
    P->w_col = *col;
}

#if defined(__GNUC__) && !defined(__MINGW32__) /* mingw checks against msvcrt's printf (no %zu) */
__attribute__((format(printf, 3, 4)))
#endif
static void perr(parser *P, const char *at, const char *fmt, ...) {
    if (P->st != KVGEN_OK) return;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    where(P, at, &line, &col);
    P->st = kvg_fail(P->err, KVGEN_E_INVALID_ARGUMENT, "grammar: line %d column %d: %s", line, col, msg);
}

static void poom(parser *P) {
    if (P->st == KVGEN_OK) P->st = kvg_fail(P->err, KVGEN_E_NO_MEMORY, "grammar: out of memory");
}

static uint32_t class_hash(const bclass *c) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < 8; i++) h = (h ^ c->bits[i]) * 16777619u;
    return h ^ (h >> 15);
}

/* the slot of class c in the table: its index, or the empty slot where it goes */
static uint32_t class_slot(const parser *P, const bclass *c) {
    uint32_t mask = P->cls_at_cap - 1, k = class_hash(c) & mask;
    while (P->cls_at[k] >= 0 && memcmp(&P->cls[P->cls_at[k]], c, sizeof *c) != 0) k = (k + 1) & mask;
    return k;
}

static int add_class(parser *P, const bclass *c) {
    if ((uint32_t)(P->n_cls + 1) * 2 > P->cls_at_cap) {
        uint32_t cap = P->cls_at_cap ? P->cls_at_cap * 2 : 128;
        int32_t *t = kvg_malloc((size_t)cap * sizeof *t);
        if (!t) {
            poom(P);
            return -1;
        }
        memset(t, 0xff, (size_t)cap * sizeof *t);
        kvg_free(P->cls_at);
        P->cls_at = t;
        P->cls_at_cap = cap;
        for (int i = 0; i < P->n_cls; i++) P->cls_at[class_slot(P, &P->cls[i])] = i;
    }
    uint32_t k = class_slot(P, c);
    if (P->cls_at[k] >= 0) return P->cls_at[k];
    if (P->n_cls == P->cap_cls) {
        int cap = P->cap_cls ? P->cap_cls * 2 : 64;
        bclass *n = kvg_realloc(P->cls, (size_t)cap * sizeof *n);
        if (!n) {
            poom(P);
            return -1;
        }
        P->cls = n;
        P->cap_cls = cap;
    }
    P->cls[P->n_cls] = *c;
    P->cls_at[k] = P->n_cls;
    return P->n_cls++;
}

static int byte_class(parser *P, unsigned b) {
    if (P->single[b] < 0) {
        bclass c = {{0}};
        set_byte(&c, b);
        P->single[b] = add_class(P, &c);
    }
    return P->single[b];
}

static uint32_t name_hash(const char *name, size_t len) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)name[i]) * 16777619u;
    return h;
}

/* the slot of name in the table: its rule, or the empty slot where it goes */
static uint32_t name_slot(const parser *P, const char *name, size_t len) {
    uint32_t mask = P->names_cap - 1, k = name_hash(name, len) & mask;
    for (; P->names[k] >= 0; k = (k + 1) & mask) {
        const char *n = P->rules[P->names[k]].name;
        if (strlen(n) == len && memcmp(n, name, len) == 0) break;
    }
    return k;
}

static int find_rule(parser *P, const char *name, size_t len) {
    return P->names_cap ? P->names[name_slot(P, name, len)] : -1;
}

/* lists named rule r in the table */
static bool name_rule(parser *P, int r) {
    if ((uint32_t)P->n_rules * 2 >= P->names_cap) {
        uint32_t cap = P->names_cap ? P->names_cap * 2 : 64;
        while ((uint32_t)P->n_rules * 2 >= cap) cap *= 2;
        int32_t *t = kvg_malloc((size_t)cap * sizeof *t);
        if (!t) return false;
        memset(t, 0xff, (size_t)cap * sizeof *t);
        int32_t *old = P->names;
        uint32_t old_cap = P->names_cap;
        P->names = t;
        P->names_cap = cap;
        for (uint32_t i = 0; i < old_cap; i++)
            if (old[i] >= 0) P->names[name_slot(P, P->rules[old[i]].name, strlen(P->rules[old[i]].name))] = old[i];
        kvg_free(old);
    }
    const char *n = P->rules[r].name;
    P->names[name_slot(P, n, strlen(n))] = r;
    return true;
}

static int new_rule(parser *P, const char *name, size_t len, int line, int col) {
    if (P->n_rules == P->cap_rules) {
        int cap = P->cap_rules ? P->cap_rules * 2 : 32;
        prule *n = kvg_realloc(P->rules, (size_t)cap * sizeof *n);
        if (!n) {
            poom(P);
            return -1;
        }
        P->rules = n;
        P->cap_rules = cap;
    }
    prule *r = &P->rules[P->n_rules];
    memset(r, 0, sizeof *r);
    r->name = kvg_malloc(len + 1);
    if (!r->name) {
        poom(P);
        return -1;
    }
    memcpy(r->name, name, len);
    r->name[len] = 0;
    r->line = line;
    r->col = col;
    r->owner = P->n_rules;
    int id = P->n_rules++;
    if (len > 0 && !name_rule(P, id)) {
        poom(P);
        return -1;
    }
    return id;
}

static int helper_rule(parser *P, int owner, const char *what) {
    int r = new_rule(P, "", 0, 0, 0);
    if (r < 0) return -1;
    P->rules[r].defined = P->rules[r].used = true;
    P->rules[r].owner = P->rules[owner].owner;
    P->rules[r].what = what;
    return r;
}

static int new_alt(parser *P, int r) {
    prule *R = &P->rules[r];
    if (R->n_alts == R->cap_alts) {
        int cap = R->cap_alts ? R->cap_alts * 2 : 4;
        palt *n = kvg_realloc(R->alts, (size_t)cap * sizeof *n);
        if (!n) {
            poom(P);
            return -1;
        }
        R->alts = n;
        R->cap_alts = cap;
    }
    memset(&R->alts[R->n_alts], 0, sizeof R->alts[0]);
    return R->n_alts++;
}

static void push_el(parser *P, int r, int a, el_kind kind, int arg) {
    if (P->st != KVGEN_OK || arg < 0) return;
    if (++P->n_elems > MAX_ELEMS) {
        perr(P, P->p, "the grammar expands to over %d elements", MAX_ELEMS);
        return;
    }
    palt *A = &P->rules[r].alts[a];
    if (A->n == A->cap) {
        int cap = A->cap ? A->cap * 2 : 8;
        gel *n = kvg_realloc(A->e, (size_t)cap * sizeof *n);
        if (!n) {
            poom(P);
            return;
        }
        A->e = n;
        A->cap = cap;
    }
    A->e[A->n++] = (gel){(uint8_t)kind, arg};
}

/* one multi-byte UTF-8 character (well-formed: no overlong forms, surrogates or > U+10FFFF) */
static int utf8_rule(parser *P, int owner) {
    if (P->utf8_rule >= 0) return P->utf8_rule;
    static const struct {
        uint8_t lo, hi;
    } seqs[8][4] = {
        {{0xc2, 0xdf}, {0x80, 0xbf}},
        {{0xe0, 0xe0}, {0xa0, 0xbf}, {0x80, 0xbf}},
        {{0xe1, 0xec}, {0x80, 0xbf}, {0x80, 0xbf}},
        {{0xed, 0xed}, {0x80, 0x9f}, {0x80, 0xbf}},
        {{0xee, 0xef}, {0x80, 0xbf}, {0x80, 0xbf}},
        {{0xf0, 0xf0}, {0x90, 0xbf}, {0x80, 0xbf}, {0x80, 0xbf}},
        {{0xf1, 0xf3}, {0x80, 0xbf}, {0x80, 0xbf}, {0x80, 0xbf}},
        {{0xf4, 0xf4}, {0x80, 0x8f}, {0x80, 0xbf}, {0x80, 0xbf}},
    };
    int r = helper_rule(P, owner, "a UTF-8 character");
    if (r < 0) return -1;
    for (int s = 0; s < 8; s++) {
        int a = new_alt(P, r);
        if (a < 0) return -1;
        for (int k = 0; k < 4 && seqs[s][k].lo; k++) {
            bclass c = {{0}};
            set_range(&c, seqs[s][k].lo, seqs[s][k].hi);
            push_el(P, r, a, E_CHARS, add_class(P, &c));
        }
    }
    P->utf8_rule = r;
    return r;
}

static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* spaces and comments; newlines too when newline_ok */
static void skip_space(parser *P, bool newline_ok) {
    for (;;) {
        char c = *P->p;
        if (c == ' ' || c == '\t' || c == '\r' || (newline_ok && c == '\n')) {
            P->p++;
        } else if (c == '#') {
            while (*P->p && *P->p != '\n') P->p++;
        } else {
            return;
        }
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* one character of a literal or class: an escape or a UTF-8 character; -1 on error */
static long parse_char(parser *P) {
    const char *at = P->p;
    unsigned char c = (unsigned char)*P->p;
    if (c == 0) {
        perr(P, at, "unexpected end of the grammar");
        return -1;
    }
    if (c == '\\') {
        char e = P->p[1];
        if (e == 0) { /* the text ends inside the escape: stay on its last byte */
            perr(P, at, "'\\' at the end of the grammar (byte %ld)", (long)(at - P->src));
            return -1;
        }
        P->p += 2;
        switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': return (unsigned char)e;
        case 'x': case 'u': case 'U': {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            long v = 0;
            for (int i = 0; i < digits; i++) {
                int h = hexval(*P->p);
                if (h < 0) {
                    perr(P, at, "\\%c needs %d hexadecimal digits", e, digits);
                    return -1;
                }
                v = v * 16 + h;
                P->p++;
            }
            if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) {
                perr(P, at, "\\%c escape U+%lX is not a Unicode character", e, (unsigned long)v);
                return -1;
            }
            return v;
        }
        default: perr(P, at, "unknown escape \\%c", e); return -1;
        }
    }
    size_t cl, ok, avail = 0;
    while (avail < 4 && P->p[avail]) avail++; /* one character at most: not the whole text's length */
    kvg_utf8_scan((const unsigned char *)P->p, avail, &cl, &ok);
    if (ok != cl || cl == 0) {
        perr(P, at, "the grammar text is not valid UTF-8");
        return -1;
    }
    long v = cl == 1 ? c : cl == 2 ? c & 0x1f : cl == 3 ? c & 0x0f : c & 0x07;
    for (size_t i = 1; i < cl; i++) v = (v << 6) | (P->p[i] & 0x3f);
    P->p += cl;
    return v;
}

static int utf8_encode(long v, unsigned char *out) {
    if (v < 0x80) {
        out[0] = (unsigned char)v;
        return 1;
    }
    if (v < 0x800) {
        out[0] = (unsigned char)(0xc0 | (v >> 6));
        out[1] = (unsigned char)(0x80 | (v & 0x3f));
        return 2;
    }
    if (v < 0x10000) {
        out[0] = (unsigned char)(0xe0 | (v >> 12));
        out[1] = (unsigned char)(0x80 | ((v >> 6) & 0x3f));
        out[2] = (unsigned char)(0x80 | (v & 0x3f));
        return 3;
    }
    out[0] = (unsigned char)(0xf0 | (v >> 18));
    out[1] = (unsigned char)(0x80 | ((v >> 12) & 0x3f));
    out[2] = (unsigned char)(0x80 | ((v >> 6) & 0x3f));
    out[3] = (unsigned char)(0x80 | (v & 0x3f));
    return 4;
}

static void push_codepoint(parser *P, int r, int a, long v) {
    unsigned char b[4];
    int n = utf8_encode(v, b);
    for (int i = 0; i < n; i++) push_el(P, r, a, E_CHARS, byte_class(P, b[i]));
}

/* [...] after the '[': ASCII as one byte class; other characters (at most 256 of them in a
 * class that lists them) as alternatives of their byte sequences; [^...] excludes ASCII only
 * and matches any other whole UTF-8 character. */
static void parse_class(parser *P, int r, int a, int owner) {
    const char *start = P->p - 1;
    bool neg = *P->p == '^';
    if (neg) P->p++;
    bclass ascii = {{0}};
    long wide[256][2];
    int n_wide = 0;
    long n_wide_chars = 0;
    bool any = false;
    while (P->st == KVGEN_OK && *P->p != ']') {
        if (!*P->p) {
            perr(P, start, "character class is not closed with ']'");
            return;
        }
        long lo = parse_char(P), hi = lo;
        if (lo < 0) return;
        if (P->p[0] == '-' && P->p[1] && P->p[1] != ']') {
            P->p++;
            hi = parse_char(P);
            if (hi < 0) return;
            if (hi < lo) {
                perr(P, start, "range end U+%04lX is below its start U+%04lX", (unsigned long)hi, (unsigned long)lo);
                return;
            }
        }
        any = true;
        for (long v = lo; v <= hi && v < 0x80; v++) set_byte(&ascii, (unsigned)v);
        if (hi >= 0x80) {
            long wlo = lo < 0x80 ? 0x80 : lo;
            if (neg) {
                perr(P, start, "a negated class may exclude only ASCII characters (U+%04lX)", (unsigned long)wlo);
                return;
            }
            n_wide_chars += hi - wlo + 1;
            if (n_wide == 256 || n_wide_chars > 256) {
                perr(P, start, "a class may list at most 256 non-ASCII characters");
                return;
            }
            wide[n_wide][0] = wlo;
            wide[n_wide][1] = hi;
            n_wide++;
        }
    }
    if (P->st != KVGEN_OK) return;
    P->p++; /* ']' */
    if (!any && !neg) {
        perr(P, start, "empty character class");
        return;
    }
    if (neg) {
        bclass c = {{0}};
        for (unsigned b = 0; b < 0x80; b++)
            if (!has_byte(&ascii, b)) set_byte(&c, b);
        int u = utf8_rule(P, owner);
        bool ascii_any = false;
        for (int i = 0; i < 4; i++) ascii_any |= c.bits[i] != 0;
        if (!ascii_any) {
            push_el(P, r, a, E_REF, u);
            return;
        }
        int h = helper_rule(P, owner, "a character class");
        if (h < 0) return;
        int a1 = new_alt(P, h), a2 = new_alt(P, h);
        if (a1 < 0 || a2 < 0) return;
        push_el(P, h, a1, E_CHARS, add_class(P, &c));
        push_el(P, h, a2, E_REF, u);
        push_el(P, r, a, E_REF, h);
        return;
    }
    bool ascii_any = false;
    for (int i = 0; i < 4; i++) ascii_any |= ascii.bits[i] != 0;
    if (n_wide == 0) {
        push_el(P, r, a, E_CHARS, add_class(P, &ascii));
        return;
    }
    int h = helper_rule(P, owner, "a character class");
    if (h < 0) return;
    if (ascii_any) {
        int a1 = new_alt(P, h);
        if (a1 < 0) return;
        push_el(P, h, a1, E_CHARS, add_class(P, &ascii));
    }
    for (int w = 0; w < n_wide; w++)
        for (long v = wide[w][0]; v <= wide[w][1]; v++) {
            int ai = new_alt(P, h);
            if (ai < 0) return;
            push_codepoint(P, h, ai, v);
        }
    push_el(P, r, a, E_REF, h);
}

static double parse_alternates(parser *P, int r, int owner, bool nested);

static bool parse_count(parser *P, long *v) {
    if (*P->p < '0' || *P->p > '9') return false;
    *v = 0;
    while (*P->p >= '0' && *P->p <= '9') {
        if (*v <= MAX_REPEAT) *v = *v * 10 + (*P->p - '0');
        P->p++;
    }
    return true;
}

/* copies the element into its own rule when it is several (a literal) */
static gel single_of(parser *P, int r, int a, int from, int owner) {
    palt *A = &P->rules[r].alts[a];
    if (A->n - from == 1) {
        gel e = A->e[from];
        A->n = from;
        return e;
    }
    int h = helper_rule(P, owner, "a repeated literal");
    int ha = h >= 0 ? new_alt(P, h) : -1;
    if (ha < 0) return (gel){E_END, -1};
    A = &P->rules[r].alts[a];
    for (int i = from; i < A->n; i++) {
        gel e = P->rules[r].alts[a].e[i];
        push_el(P, h, ha, (el_kind)e.kind, e.arg);
    }
    P->rules[r].alts[a].n = from;
    return (gel){E_REF, h};
}

/* x{m,n} (n < 0: unbounded) in place of the elements from `from` */
static void repeat(parser *P, int r, int a, int from, long m, long n, int owner) {
    gel x = single_of(P, r, a, from, owner);
    if (P->st != KVGEN_OK || x.arg < 0) return;
    for (long i = 0; i < m; i++) push_el(P, r, a, (el_kind)x.kind, x.arg);
    if (n < 0) { /* R ::= x R | (empty) */
        int h = helper_rule(P, owner, "a repetition");
        int a1 = h >= 0 ? new_alt(P, h) : -1, a2 = h >= 0 ? new_alt(P, h) : -1;
        if (a1 < 0 || a2 < 0) return;
        push_el(P, h, a1, (el_kind)x.kind, x.arg);
        push_el(P, h, a1, E_REF, h);
        P->rules[h].alts[a1].loop = true;
        push_el(P, r, a, E_REF, h);
        return;
    }
    int prev = -1; /* O_k ::= x O_{k-1} | (empty) */
    int chain = ++P->n_chains;
    for (long k = 0; k < n - m; k++) {
        int h = helper_rule(P, owner, "a repetition");
        int a1 = h >= 0 ? new_alt(P, h) : -1, a2 = h >= 0 ? new_alt(P, h) : -1;
        if (a1 < 0 || a2 < 0) return;
        push_el(P, h, a1, (el_kind)x.kind, x.arg);
        if (prev >= 0) {
            push_el(P, h, a1, E_REF, prev);
            P->rules[h].alts[a1].loop = true;
        }
        P->rules[h].alts[a1].chain = chain;
        P->rules[h].alts[a1].rank = (int)k + 1;
        prev = h;
    }
    if (prev >= 0) push_el(P, r, a, E_REF, prev);
}

/* A sequence, into alternative a of rule r; returns its size with every repetition written
 * out (a reference to a named rule counts one: its own size is counted once, where it is
 * defined). */
static double parse_sequence(parser *P, int r, int a, int owner, bool nested) {
    int last = -1;       /* where the last element's elements start */
    double size = 0, last_size = 0;
    while (P->st == KVGEN_OK) {
        const char *at = P->p;
        char c = *P->p;
        int before = P->rules[r].alts[a].n;
        if (c == '"') {
            P->p++;
            while (P->st == KVGEN_OK && *P->p != '"') {
                if (!*P->p || *P->p == '\n') {
                    perr(P, at, "string literal is not closed with '\"'");
                    return size;
                }
                long v = parse_char(P);
                if (v < 0) return size;
                push_codepoint(P, r, a, v);
            }
            if (P->st != KVGEN_OK) return size;
            P->p++;
            if (P->rules[r].alts[a].n == before) { /* "" matches the empty text */
                last = -1;
                skip_space(P, nested);
                continue;
            }
            last_size = P->rules[r].alts[a].n - before;
        } else if (c == '[') {
            P->p++;
            parse_class(P, r, a, owner);
            last_size = 1;
        } else if (c == '.') { /* any character: an ASCII byte or a multi-byte character */
            P->p++;
            int u = utf8_rule(P, owner), h = u >= 0 ? helper_rule(P, owner, "'.'") : -1;
            int a1 = h >= 0 ? new_alt(P, h) : -1, a2 = a1 >= 0 ? new_alt(P, h) : -1;
            if (a2 < 0) return size;
            bclass all = {{0}};
            set_range(&all, 0, 0x7f);
            push_el(P, h, a1, E_CHARS, add_class(P, &all));
            push_el(P, h, a2, E_REF, u);
            push_el(P, r, a, E_REF, h);
            last_size = 1;
        } else if (name_char(c)) {
            const char *name = P->p;
            while (name_char(*P->p)) P->p++;
            size_t len = (size_t)(P->p - name);
            /* a name followed by ::= starts the next rule */
            const char *q = P->p;
            while (*q == ' ' || *q == '\t') q++;
            if (q[0] == ':' && q[1] == ':' && q[2] == '=') {
                if (nested) perr(P, name, "'::=' inside a group");
                P->p = name;
                return size;
            }
            int ref = find_rule(P, name, len);
            if (ref < 0) {
                int line, col;
                where(P, name, &line, &col);
                ref = new_rule(P, name, len, line, col);
            }
            if (ref >= 0) P->rules[ref].used = true;
            push_el(P, r, a, E_REF, ref);
            last_size = 1;
        } else if (c == '(') {
            if (P->depth >= MAX_NESTING) { /* the parser recurses once per group */
                perr(P, at, "groups nested over %d deep (byte %ld)", MAX_NESTING, (long)(at - P->src));
                return size;
            }
            P->p++;
            skip_space(P, true);
            int h = helper_rule(P, owner, "a group");
            if (h < 0) return size;
            P->depth++;
            last_size = parse_alternates(P, h, owner, true);
            P->depth--;
            if (P->st != KVGEN_OK) return size;
            if (*P->p != ')') {
                perr(P, at, "group is not closed with ')'");
                return size;
            }
            P->p++;
            push_el(P, r, a, E_REF, h);
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last < 0) {
                perr(P, at, "'%c' follows nothing it could repeat", c);
                return size;
            }
            P->p++;
            long m = 0, n = -1;
            if (c == '+') m = 1;
            else if (c == '?') n = 1;
            else if (c == '{') {
                skip_space(P, false);
                if (!parse_count(P, &m)) {
                    perr(P, at, "'{' needs a count: {m}, {m,} or {m,n}");
                    return size;
                }
                skip_space(P, false);
                n = m;
                if (*P->p == ',') {
                    P->p++;
                    skip_space(P, false);
                    if (!parse_count(P, &n)) n = -1;
                    skip_space(P, false);
                }
                if (*P->p != '}') {
                    perr(P, at, "'{' is not closed with '}'");
                    return size;
                }
                P->p++;
                if (m > MAX_REPEAT || n > MAX_REPEAT) {
                    perr(P, at, "repetition count over %d", MAX_REPEAT);
                    return size;
                }
                if (n >= 0 && n < m) {
                    perr(P, at, "repetition {%ld,%ld}: the maximum is below the minimum", m, n);
                    return size;
                }
            }
            /* x{m,n} is n copies of x (m and a tail when unbounded): nested repetitions multiply */
            double copies = n < 0 ? (double)m + 1 : n > 0 ? (double)n : 1;
            double rep_size = last_size * copies;
            if (rep_size > MAX_EXPANDED) {
                perr(P, at, "the repetition expands to %.0f elements, over the limit of %d (byte %ld)", rep_size,
                     MAX_EXPANDED, (long)(at - P->src));
                return size;
            }
            size += rep_size - last_size;
            repeat(P, r, a, last, m, n, owner);
            last = -1; /* x** is refused: write (x*)* */
            skip_space(P, nested);
            continue;
        } else {
            return size;
        }
        size += last_size;
        last = before;
        skip_space(P, nested);
    }
    return size;
}

/* the alternatives' sizes, added (see parse_sequence) */
static double parse_alternates(parser *P, int r, int owner, bool nested) {
    double size = 0;
    for (;;) {
        int a = new_alt(P, r);
        if (a < 0) return size;
        size += parse_sequence(P, r, a, owner, nested);
        if (P->st != KVGEN_OK) return size;
        const char *q = P->p;
        if (!nested) { /* a rule goes on on the next line when that line starts with '|' */
            while (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n' || *q == '#') {
                if (*q == '#')
                    while (*q && *q != '\n') q++;
                else
                    q++;
            }
        }
        if (*q != '|') return size;
        P->p = q + 1;
        skip_space(P, true);
    }
}

static void parse_grammar(parser *P) {
    skip_space(P, true);
    while (P->st == KVGEN_OK && *P->p) {
        const char *at = P->p;
        const char *name = P->p;
        while (name_char(*P->p)) P->p++;
        size_t len = (size_t)(P->p - name);
        if (len == 0) {
            perr(P, at, "expected a rule name");
            return;
        }
        skip_space(P, false);
        if (strncmp(P->p, "::=", 3) != 0) {
            perr(P, P->p, "expected '::=' after rule name '%.*s'", (int)len, name);
            return;
        }
        P->p += 3;
        int r = find_rule(P, name, len);
        int line, col;
        where(P, name, &line, &col);
        if (r >= 0 && P->rules[r].defined) {
            perr(P, name, "rule '%.*s' is defined twice (first at line %d column %d)", (int)len, name,
                 P->rules[r].line, P->rules[r].col);
            return;
        }
        if (r < 0) r = new_rule(P, name, len, line, col);
        if (r < 0) return;
        P->rules[r].defined = true;
        P->rules[r].line = line;
        P->rules[r].col = col;
        skip_space(P, true);
        P->expanded += parse_alternates(P, r, r, false);
        if (P->st != KVGEN_OK) return;
        if (P->expanded > MAX_EXPANDED) {
            perr(P, name, "the grammar expands to over %d elements with its repetitions written out (rule '%.*s', "
                 "byte %ld)", MAX_EXPANDED, (int)len, name, (long)(name - P->src));
            return;
        }
        if (*P->p && *P->p != '\n' && !name_char(*P->p)) {
            perr(P, P->p, "unexpected '%c' in rule '%.*s'", *P->p, (int)len, name);
            return;
        }
        skip_space(P, true);
    }
}

/* ---- checks: every rule defined, root present, no dead alternatives, no left recursion ---- */

static const char *rule_desc(const parser *P, int r, char *buf, size_t size) {
    const prule *u = &P->rules[P->rules[r].owner];
    snprintf(buf, size, "rule '%s' (line %d column %d)", u->name, u->line, u->col);
    return buf;
}

static bool alt_all(const palt *A, const bool *ok) {
    for (int i = 0; i < A->n; i++)
        if (A->e[i].kind == E_REF && !ok[A->e[i].arg]) return false;
    return true;
}

/* flag[r] for each rule with an alternative whose references all have the flag: productive
 * (the rule matches some complete text) or, bytes_fail, nullable (it matches the empty text:
 * an alternative with a byte class never does). Settled from a list of the rules just flagged,
 * not in rounds, so a chain of rules costs one pass. False when out of memory. */
static bool settle(const parser *P, bool *flag, bool bytes_fail) {
    size_t n_alt = 0, n_ref = 0;
    for (int r = 0; r < P->n_rules; r++) {
        n_alt += (size_t)P->rules[r].n_alts;
        for (int a = 0; a < P->rules[r].n_alts; a++)
            for (int i = 0; i < P->rules[r].alts[a].n; i++) n_ref += P->rules[r].alts[a].e[i].kind == E_REF;
    }
    int *left = kvg_malloc((n_alt + 1) * sizeof *left);       /* an alternative's references not flagged */
    int *alt_rule = kvg_malloc((n_alt + 1) * sizeof *alt_rule);
    int *use_at = kvg_calloc((size_t)P->n_rules + 2, sizeof *use_at); /* the alternatives using rule t: */
    int *uses = kvg_malloc((n_ref + 1) * sizeof *uses);              /* uses[use_at[t] .. use_at[t + 1]) */
    int *queue = kvg_malloc(((size_t)P->n_rules + 1) * sizeof *queue);
    bool ok = left && alt_rule && use_at && uses && queue;
    int n_queue = 0;
    if (ok) {
        size_t id = 0;
        for (int r = 0; r < P->n_rules; r++)
            for (int a = 0; a < P->rules[r].n_alts; a++, id++) {
                const palt *A = &P->rules[r].alts[a];
                alt_rule[id] = r;
                left[id] = 0;
                for (int i = 0; i < A->n; i++) {
                    if (A->e[i].kind == E_REF) {
                        left[id]++;
                        use_at[A->e[i].arg + 2]++;
                    } else if (bytes_fail) {
                        left[id] = -1 - A->n; /* never reaches 0 */
                        break;
                    }
                }
                if (left[id] == 0 && !flag[r]) flag[r] = true, queue[n_queue++] = r;
            }
        for (int t = 0; t < P->n_rules; t++) use_at[t + 2] += use_at[t + 1];
        id = 0;
        for (int r = 0; r < P->n_rules; r++)
            for (int a = 0; a < P->rules[r].n_alts; a++, id++) {
                const palt *A = &P->rules[r].alts[a];
                for (int i = 0; i < A->n; i++)
                    if (A->e[i].kind == E_REF) uses[use_at[A->e[i].arg + 1]++] = (int)id;
            }
        /* use_at[t + 1] is now the end of t's uses, use_at[t] their start */
        while (n_queue > 0) {
            int t = queue[--n_queue];
            for (int u = use_at[t]; u < use_at[t + 1]; u++) {
                int al = uses[u];
                if (--left[al] == 0 && !flag[alt_rule[al]]) {
                    flag[alt_rule[al]] = true;
                    queue[n_queue++] = alt_rule[al];
                }
            }
        }
    }
    kvg_free(left);
    kvg_free(alt_rule);
    kvg_free(use_at);
    kvg_free(uses);
    kvg_free(queue);
    return ok;
}

/* Depth first from rule `from` over references, with an explicit stack (frames: room for
 * every rule; a grammar may chain rules deeper than the C stack goes). left: the references an
 * alternative can start with (flag: the rule can match the empty text); otherwise the
 * references to rules that never complete (flag: the rule is productive). Returns the rule
 * where a cycle closes, -1 when there is none. */
typedef struct dfs_frame {
    int r, a, i;
} dfs_frame;

static int find_cycle(const parser *P, int from, const bool *flag, bool left, uint8_t *color, dfs_frame *fr) {
    int top = 0;
    fr[0] = (dfs_frame){from, 0, 0};
    color[from] = 1;
    while (top >= 0) {
        dfs_frame *f = &fr[top];
        const prule *R = &P->rules[f->r];
        if (f->a >= R->n_alts) {
            color[f->r] = 2;
            top--;
            continue;
        }
        const palt *A = &R->alts[f->a];
        if (f->i >= A->n || (left && A->e[f->i].kind != E_REF)) {
            f->a++;
            f->i = 0;
            continue;
        }
        const gel *e = &A->e[f->i];
        if (!left && (e->kind != E_REF || flag[e->arg])) {
            f->i++;
            continue;
        }
        int t = e->arg;
        f->i = left && !flag[t] ? A->n : f->i + 1; /* left: what follows t comes after a byte */
        if (color[t] == 1) return t;
        if (color[t] == 0) {
            color[t] = 1;
            fr[++top] = (dfs_frame){t, 0, 0};
        }
    }
    return -1;
}

static void check_grammar(parser *P) {
    char d[160];
    for (int r = 0; r < P->n_rules && P->st == KVGEN_OK; r++)
        if (!P->rules[r].defined) {
            P->st = kvg_fail(P->err, KVGEN_E_INVALID_ARGUMENT,
                             "grammar: rule '%s' is used (line %d column %d) but never defined", P->rules[r].name,
                             P->rules[r].line, P->rules[r].col);
            return;
        }
    int root = find_rule(P, "root", 4);
    if (root < 0) {
        P->st = kvg_fail(P->err, KVGEN_E_INVALID_ARGUMENT, "grammar: no rule 'root' (the rule the text must match)");
        return;
    }
    size_t n = (size_t)P->n_rules;
    bool *flag = kvg_calloc(n, sizeof *flag);
    uint8_t *color = kvg_calloc(n, 1);
    dfs_frame *frames = kvg_malloc(n * sizeof *frames);
    if (!flag || !color || !frames) {
        kvg_free(flag);
        kvg_free(color);
        kvg_free(frames);
        poom(P);
        return;
    }
    if (!settle(P, flag, false)) {
        kvg_free(flag);
        kvg_free(color);
        kvg_free(frames);
        poom(P);
        return;
    }
    if (!flag[root]) {
        int c = find_cycle(P, root, flag, false, color, frames);
        P->st = kvg_fail(P->err, KVGEN_E_INVALID_ARGUMENT,
                         "grammar: %s never completes: every way through it needs itself again (the grammar matches "
                         "no text)",
                         rule_desc(P, c >= 0 ? c : root, d, sizeof d));
    }
    /* alternatives that can never complete are dropped: every text the matcher accepts can
     * then be completed */
    for (int r = 0; P->st == KVGEN_OK && r < P->n_rules; r++) {
        prule *R = &P->rules[r];
        int k = 0;
        for (int a = 0; a < R->n_alts; a++) {
            if (alt_all(&R->alts[a], flag)) R->alts[k++] = R->alts[a];
            else kvg_free(R->alts[a].e);
        }
        R->n_alts = k;
    }
    if (P->st == KVGEN_OK) {
        memset(flag, 0, n * sizeof *flag);
        if (!settle(P, flag, true)) poom(P);
        for (int r = 0; r < P->n_rules && P->st == KVGEN_OK; r++) {
            if (color[r]) continue;
            int c = find_cycle(P, r, flag, true, color, frames);
            if (c >= 0) {
                const char *what = P->rules[c].what;
                P->st = kvg_fail(P->err, KVGEN_E_INVALID_ARGUMENT,
                                 "grammar: %s is left-recursive: it can reach itself without reading a byte%s%s%s",
                                 rule_desc(P, c, d, sizeof d), what ? " (in " : "", what ? what : "",
                                 what ? " of text that can be empty)" : "");
            }
        }
    }
    kvg_free(flag);
    kvg_free(color);
    kvg_free(frames);
}

static void parser_free(parser *P) {
    for (int r = 0; r < P->n_rules; r++) {
        for (int a = 0; a < P->rules[r].n_alts; a++) kvg_free(P->rules[r].alts[a].e);
        kvg_free(P->rules[r].alts);
        kvg_free(P->rules[r].name);
    }
    kvg_free(P->rules);
    kvg_free(P->cls);
    kvg_free(P->cls_at);
    kvg_free(P->names);
}

void kvg_gram_free(kvg_gram *g) {
    if (!g) return;
    kvg_free(g->elems);
    kvg_free(g->alt_start);
    kvg_free(g->rule_alt);
    kvg_free(g->classes);
    kvg_free(g->loop);
    kvg_free(g->chain);
    kvg_free(g->rank);
    kvg_free(g);
}

kvgen_status kvg_gram_parse(const char *text, kvg_gram **out, kvgen_error *err) {
    *out = NULL;
    if (!text) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "grammar: the grammar text is NULL");
    parser P = {.src = text, .p = text, .utf8_rule = -1, .err = err, .st = KVGEN_OK};
    for (int b = 0; b < 256; b++) P.single[b] = -1;
    parse_grammar(&P);
    if (P.st == KVGEN_OK) check_grammar(&P);
    kvg_gram *g = NULL;
    if (P.st == KVGEN_OK) {
        int n_alts = 0, n_el = 0;
        for (int r = 0; r < P.n_rules; r++) {
            n_alts += P.rules[r].n_alts;
            for (int a = 0; a < P.rules[r].n_alts; a++) n_el += P.rules[r].alts[a].n + 1;
        }
        g = kvg_calloc(1, sizeof *g);
        if (g) {
            g->elems = kvg_malloc((size_t)(n_el + 1) * sizeof *g->elems);
            g->alt_start = kvg_malloc((size_t)(n_alts + 1) * sizeof *g->alt_start);
            g->rule_alt = kvg_malloc((size_t)(P.n_rules + 1) * sizeof *g->rule_alt);
            g->classes = kvg_malloc((size_t)(P.n_cls + 1) * sizeof *g->classes);
            g->loop = kvg_calloc((size_t)n_el + 1, 1);
            g->chain = kvg_calloc((size_t)n_el + 1, sizeof *g->chain);
            g->rank = kvg_calloc((size_t)n_el + 1, sizeof *g->rank);
        }
        if (!g || !g->elems || !g->alt_start || !g->rule_alt || !g->classes || !g->loop || !g->chain || !g->rank) {
            poom(&P);
        } else {
            int e = 0, al = 0;
            for (int r = 0; r < P.n_rules; r++) {
                g->rule_alt[r] = al;
                for (int a = 0; a < P.rules[r].n_alts; a++) {
                    g->alt_start[al++] = e;
                    const palt *A = &P.rules[r].alts[a];
                    if (A->loop && A->n == 2) g->loop[e + 1] = 1;
                    for (int i = 0; A->chain && i < A->n; i++) {
                        g->chain[e + i] = A->chain * 2 + i; /* x, then the rest of the chain */
                        g->rank[e + i] = A->rank;
                        g->has_chains = true;
                    }
                    if (P.rules[r].alts[a].n > 0) /* an empty alternative has no elements (e is NULL) */
                        memcpy(g->elems + e, P.rules[r].alts[a].e, (size_t)P.rules[r].alts[a].n * sizeof *g->elems);
                    e += P.rules[r].alts[a].n;
                    g->elems[e++] = (gel){E_END, 0};
                }
            }
            g->rule_alt[P.n_rules] = al;
            g->n_rules = P.n_rules;
            g->n_elems = e;
            g->root = find_rule(&P, "root", 4);
            if (P.n_cls > 0) memcpy(g->classes, P.cls, (size_t)P.n_cls * sizeof *g->classes);
            g->n_classes = P.n_cls;
        }
    }
    kvgen_status st = P.st;
    parser_free(&P);
    if (st != KVGEN_OK) {
        kvg_gram_free(g);
        return st;
    }
    *out = g;
    return KVGEN_OK;
}

/* ---- the matcher -------------------------------------------------------------------------- */

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

static void mnomem(kvg_gram_match *mt) { mfail(mt, KVGEN_E_NO_MEMORY, "grammar: out of memory for the matcher"); }

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
            mnomem(mt);
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
    if ((uint32_t)mt->n_nodes * 2 > mt->nhash_cap && !node_rehash(mt, mt->nhash_cap * 2)) mnomem(mt);
    return i;
}

static bool push_i32(kvg_gram_match *mt, int32_t **v, int *n, int *cap, int32_t x) {
    if (*n == *cap) {
        int c = *cap * 2;
        int32_t *t = kvg_realloc(*v, (size_t)c * sizeof *t);
        if (!t) {
            mnomem(mt);
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
            mnomem(mt);
            return -1;
        }
        mt->st = n;
        mt->cap_st = cap;
    }
    if (mt->n_tops + (size_t)mt->n_tmp > mt->cap_tops) {
        size_t cap = mt->cap_tops * 2 + (size_t)mt->n_tmp;
        int32_t *t = kvg_realloc(mt->tops, cap * sizeof *t);
        if (!t) {
            mnomem(mt);
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
    if ((uint32_t)mt->n_st * 2 > mt->shash_cap && !state_rehash(mt, mt->shash_cap * 2)) mnomem(mt);
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
static int advance(kvg_gram_match *mt, int s, unsigned b) {
    mstate *S = &mt->st[s];
    if (S->trans && S->trans[b] != -2) return S->trans[b];
    if (mt->oom) return -1;
    if (!S->trans) {
        S->trans = kvg_malloc(256 * sizeof *S->trans);
        if (!S->trans) {
            mnomem(mt);
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

/* the current state, or NULL where there is none: a rebuild that failed (a reset under a step
 * bound the start state needs more than, or out of memory) leaves no table and no start */
static const mstate *cur_state(const kvg_gram_match *mt) {
    return mt->st && mt->cur >= 0 && mt->cur < mt->n_st ? &mt->st[mt->cur] : NULL;
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
    if (keep_cur && mt->cur != mt->start && cur_state(mt)) {
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
static bool begin_call(kvg_gram_match *mt) {
    if (mt->oom) return false;
    mt->steps = 0;
    if ((mt->n_nodes > SOFT_NODES || mt->n_st > SOFT_STATES || mt->n_tops > SOFT_TOPS) && !rebuild(mt, true)) {
        if (!mt->oom) mnomem(mt);
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
        if (!rebuild(mt, false) && !mt->oom) mnomem(mt);
    }
    mt->cur = mt->start;
}

void kvg_gram_match_set_max_steps(kvg_gram_match *mt, long max_steps) {
    mt->max_steps = max_steps > 0 ? max_steps : MAX_STEPS;
}

const kvgen_error *kvg_gram_match_failure(const kvg_gram_match *mt) { return mt->oom ? &mt->fail : NULL; }

bool kvg_gram_feed(kvg_gram_match *mt, const unsigned char *bytes, size_t n) {
    if (!begin_call(mt) || !cur_state(mt)) return false;
    int s = mt->cur;
    for (size_t i = 0; i < n && s >= 0; i++) {
        if (mt->st[s].n == 0) return false;
        s = advance(mt, s, bytes[i]);
    }
    if (s < 0) return false;
    mt->cur = s;
    return true;
}

bool kvg_gram_can_end(const kvg_gram_match *mt) {
    const mstate *S = cur_state(mt);
    return S && S->accept != 0;
}

bool kvg_gram_done(const kvg_gram_match *mt) {
    const mstate *S = cur_state(mt);
    return S && S->accept && S->n == 0;
}

/* ---- the vocabulary trie and the mask ------------------------------------------------------ */

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

/* every token's bytes (flags 0: control tokens are empty) */
static kvg_vocab_trie *trie_build(const kvgen_model *m) {
    int n = m->w.hp.n_vocab;
    uint32_t *off = kvg_malloc(((size_t)n + 1) * sizeof *off);
    uint8_t *eog = kvg_malloc((size_t)n + 1);
    unsigned char *bytes = NULL;
    bool ok = off && eog;
    size_t total = 0;
    for (int i = 0; ok && i < n; i++) {
        off[i] = (uint32_t)total;
        total += kvgen_token_piece(m, i, 0, NULL, 0);
        eog[i] = kvgen_token_is_eog(m, i) != 0;
    }
    if (ok) {
        off[n] = (uint32_t)total;
        ok = total < UINT32_MAX && (bytes = kvg_malloc(total + 1)) != NULL;
    }
    for (int i = 0; ok && i < n; i++) {
        uint32_t len = off[i + 1] - off[i];
        if (len == 0) continue;
        char *tmp = kvg_malloc(len + 1);
        if (!(ok = tmp != NULL)) break;
        kvgen_token_piece(m, i, 0, tmp, len + 1);
        memcpy(bytes + off[i], tmp, len);
        kvg_free(tmp);
    }
    kvg_vocab_trie *t = ok ? trie_from(n, off, bytes, eog) : NULL;
    kvg_free(off);
    kvg_free(eog);
    kvg_free(bytes);
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
    if (begin_call(mt) && need > mt->cap_walk) {
        int32_t *w = kvg_realloc(mt->walk, need * sizeof *w);
        if (w) {
            mt->walk = w;
            mt->cap_walk = need;
        } else {
            mnomem(mt);
        }
    }
    if (!mt->oom && cur_state(mt) && cur_state(mt)->n > 0) {
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
            int s2 = advance(mt, lv[2], t->byte[c]);
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
    bool live = begin_call(mt) && cur_state(mt);
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
            for (size_t i = 0; i < len && s >= 0; i++) s = mt->st[s].n == 0 ? -1 : advance(mt, s, buf[i]);
            allowed[t] = s >= 0 && !mt->oom;
        }
        count += allowed[t];
    }
    return count;
}
