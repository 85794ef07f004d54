/* jinja_internal.h: what the files of the template interpreter share; private to
 * core/template/ (kvg_jinja.h stays the folder's interface).
 *
 * The files, lowest first (each calls only the ones before it):
 *   jinja_value.c     the arena and the failure path, memory and work accounting, values and
 *                     what Python does with them (str(), ==, <, in, iteration, indexing, slicing)
 *   jinja_lex.c       source to tokens, with Jinja's whitespace rules
 *   jinja_parse.c     tokens to a syntax tree (kvg_jinja_parse, kvg_jinja_free)
 *   jinja_builtins.c  the filters, tests, methods and global functions, one table each
 *   jinja_render.c    the tree-walking renderer (kvg_jinja_render)
 *
 * All memory of a parse or a render comes from one arena, freed at once; errors unwind with
 * longjmp to the entry point (as Lua's own errors do), so no path leaks or half-frees. */
#ifndef KVG_JINJA_INTERNAL_H
#define KVG_JINJA_INTERNAL_H
#include <math.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "kvg_buf.h"
#include "kvg_jinja.h"

enum {
    MAX_OUTPUT = 1 << 22,    /* rendered bytes */
    MAX_MEMORY = 64 << 20,   /* live arena bytes of one parse or render */
    MAX_DEPTH = 200,         /* nesting of parsed expressions/blocks and of evaluation */
    MAX_CALLS = 64,          /* nested macro calls */
    MAX_ITERATIONS = 1000000, /* loop iterations of one render */
    BIG_ALLOC = 16384         /* allocations this large get a block of their own, returned when dead */
};
/* bytes compared, searched or copied by one render: a million iterations of cheap steps fit
 * many times over, a million comparisons of megabyte strings do not */
#define MAX_WORK ((uint64_t)1 << 30)

/* ---- arena and failure (jinja_value.c) -------------------------------------------------- */

typedef struct block {
    struct block *next, *prev; /* prev: big blocks only */
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} block;

typedef struct jx {
    block *blocks; /* small allocations, bump-allocated */
    block *bigs;   /* allocations of BIG_ALLOC bytes or more, one per block */
    size_t total;  /* bytes held by both lists: what is live, counting arena blocks whole */
    uint64_t work; /* bytes compared, searched or copied so far */
    jmp_buf jb;
    char *msg;
    size_t msg_size;
    const char *src; /* for line/column of a position */
    size_t src_len;
    size_t at;       /* the position being parsed or evaluated, for errors without a better one */
    kvg_buf scratch; /* tojson's escaped text, one piece at a time */
} jx;

/* Writes "line L column C: <fmt>" for source position pos and unwinds to the entry point. */
_Noreturn void kvg_jx_fail(jx *x, size_t pos, const char *fmt, ...);
_Noreturn void kvg_jx_too_big(jx *x);
/* n zeroed bytes, 16-aligned, that live until the arena is freed (or kvg_jx_release) */
void *kvg_jx_alloc(jx *x, size_t n);
/* Gives back an allocation of n bytes that nothing points into any more (a grown buffer's old
 * storage): a big one is freed and stops counting; a small one stays in its arena block. */
void kvg_jx_release(jx *x, void *p, size_t n);
/* Charges n bytes of comparing, searching or copying to the render's work bound. */
void kvg_jx_charge(jx *x, uint64_t n);
void kvg_jx_free_all(block *b);
/* everything x holds: its arena and its scratch buffer */
void kvg_jx_free(jx *x);
/* a NUL-terminated copy of n bytes */
const char *kvg_jx_cstr(jx *x, const char *p, size_t n);

/* ---- values (jinja_value.c) ------------------------------------------------------------- */

/* The storage of strings built by concatenation: a string that ends where the buffer's used
 * part ends may be extended in place (its own bytes never change), so a string built one piece
 * at a time costs its length, not the sum of every intermediate one. */
typedef struct growbuf {
    char *p;
    unsigned char *u; /* NULL while no byte written here came from message content */
    size_t used, cap;
} growbuf;

typedef struct jstr {
    size_t n;
    const char *p;
    const unsigned char *u; /* NULL: no byte from message content */
    growbuf *g;             /* non-NULL: p lies in this buffer (not NUL-terminated) */
} jstr;

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_MACRO, V_FUNC };

struct node;
struct jglobal;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jv {
    int t;
    union {
        int b;
        int64_t i;
        double f;
        const jstr *s;
        jlist *l;
        jdict *d;
        const struct node *m;
        const struct jglobal *fn; /* a row of the globals' table */
    };
} jv;

struct jlist {
    size_t n, cap;
    jv *v;
    int tuple; /* printed as (a, b) */
};
struct jdict {
    size_t n, cap;
    jv *k; /* strings, or (dict literals, dict()) other hashable values: numbers, booleans, none */
    jv *v;
    int ns; /* a namespace(): its attributes may be assigned */
};

static const jv UNDEF = {.t = V_UNDEF};
static const jv NONE = {.t = V_NONE};

static inline jv mk_bool(int b) { return (jv){.t = V_BOOL, .b = b != 0}; }
static inline jv mk_int(int64_t i) { return (jv){.t = V_INT, .i = i}; }
static inline jv mk_float(double f) { return (jv){.t = V_FLOAT, .f = f}; }
static inline jv mk_str(const jstr *s) { return (jv){.t = V_STR, .s = s}; }
static inline jv mk_list(jlist *l) { return (jv){.t = V_LIST, .l = l}; }

static inline int num(const jv *v) { return v->t == V_INT || v->t == V_FLOAT || v->t == V_BOOL; }
static inline double as_f(const jv *v) { return v->t == V_FLOAT ? v->f : v->t == V_INT ? (double)v->i : v->b; }
/* A float as an integer, saturated at the int64 range (NaN: 0): C leaves the conversion of an
 * out-of-range float undefined. */
static inline int64_t f_to_i(double f) {
    if (isnan(f)) return 0;
    if (f >= 9223372036854775808.0) return INT64_MAX;
    if (f < -9223372036854775808.0) return INT64_MIN;
    return (int64_t)f;
}
static inline int64_t as_i(const jv *v) { return v->t == V_INT ? v->i : v->t == V_BOOL ? v->b : f_to_i(v->f); }
static inline int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

jstr *kvg_jstr_new(jx *x, const char *p, size_t n, const unsigned char *u);
jstr *kvg_jstr_c(jx *x, const char *c);
jstr *kvg_jstr_sub(jx *x, const jstr *s, size_t a, size_t b);
/* a ~ b: appended in place when a ends its buffer's used part and there is room */
jstr *kvg_jstr_cat(jx *x, const jstr *a, const jstr *b);
int kvg_jstr_eq(const jstr *a, const char *p, size_t n);

/* a string under construction, with its content flags */
typedef struct sbuf {
    char *p;
    unsigned char *u;
    size_t n, cap;
    int any;
} sbuf;

/* n bytes with their flags u (NULL: every byte flagged `flag`) */
void kvg_sb_add(jx *x, sbuf *b, const char *p, size_t n, const unsigned char *u, int flag);
void kvg_sb_str(jx *x, sbuf *b, const jstr *s);
void kvg_sb_c(jx *x, sbuf *b, const char *c);
/* the string built; the builder is reset */
jstr *kvg_sb_done(jx *x, sbuf *b);

jlist *kvg_jlist_new(jx *x);
void kvg_jlist_push(jx *x, jlist *l, jv v);
jdict *kvg_jdict_new(jx *x);
jv *kvg_jdict_find(const jdict *d, const char *k, size_t n);
void kvg_jdict_set(jx *x, jdict *d, const jstr *k, jv v);
/* d[k] = v for any key Python can hash here (a string, number, boolean or none; 1, 1.0 and true
 * are one key); others fail */
void kvg_jdict_put(jx *x, jdict *d, jv k, jv v, size_t pos);
/* d[k], NULL when absent */
jv *kvg_jdict_lookup(jx *x, const jdict *d, const jv *k);
void kvg_jdict_setc(jx *x, jdict *d, const char *k, jv v);

const char *kvg_jv_type_name(const jv *v);
int kvg_jv_truthy(const jv *v);
/* Python's repr() of a float: the shortest text that reads back the same, ".0" when integral */
void kvg_jv_fmt_float(char *buf, size_t size, double f);
/* Jinja's str(): strings as they are, the rest as Python prints them. */
const jstr *kvg_jv_str(jx *x, const jv *v);
int kvg_jv_equal(jx *x, const jv *a, const jv *b);
/* -1, 0, 1; numbers with numbers, strings with strings, anything else fails */
int kvg_jv_compare(jx *x, const jv *a, const jv *b, size_t pos);
/* needle in hay */
int kvg_jv_contains(jx *x, const jv *hay, const jv *needle, size_t pos);
/* Items to iterate: a list's elements, a dict's keys, a string's characters. */
jlist *kvg_jv_items(jx *x, const jv *v, size_t pos);
jv kvg_jv_item(jx *x, const jv *obj, const jv *key, size_t pos);
jv kvg_jv_slice(jx *x, const jv *obj, const jv *a, const jv *b, const jv *c, size_t pos);
jv kvg_jv_attr(jx *x, const jv *obj, const char *name, size_t pos);

/* ---- tokens (jinja_lex.c) --------------------------------------------------------------- */

enum { T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct tok {
    int k;
    size_t pos;
    const char *p; /* NAME, OP: source bytes; TEXT, STR: decoded */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct lexer {
    jx *x;
    tok *v;
    size_t n, cap;
} lexer;

/* x->src (NUL-terminated) to tokens, ending with T_EOF */
void kvg_jinja_lex(lexer *L);

/* ---- syntax tree (jinja_parse.c) -------------------------------------------------------- */

enum {
    /* expressions */
    N_LIT, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NOT, N_NEG, N_BIN, N_AND, N_OR, N_COND,
    N_LIST, N_DICT, N_KWARG, N_PAIR,
    /* statements */
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_BODY
};

typedef struct nlist {
    struct node **v;
    int n, cap;
} nlist;

typedef struct node {
    int kind;
    size_t pos;
    const char *name; /* NUL-terminated: names, attributes, filters, tests, operators */
    jv lit;
    struct node *a, *b, *c;
    nlist kids, kids2; /* arguments, elements, bodies */
    int neg;           /* N_TEST: is not; N_LIST: a tuple */
} node;

struct kvg_jinja {
    block *blocks, *bigs;
    node *root;
    char *src;
    size_t src_len;
};

/* ---- builtins (jinja_builtins.c) -------------------------------------------------------- */

/* evaluated call arguments */
typedef struct args {
    int n, nkw;
    jv v[16];
    const char *kwn[16];
    jv kwv[16];
} args;

/* positional argument i, else the keyword argument kw (NULL: none), else undefined */
static inline jv arg(const args *a, int i, const char *kw) {
    if (i >= 0 && i < a->n) return a->v[i];
    for (int k = 0; kw && k < a->nkw; k++)
        if (strcmp(a->kwn[k], kw) == 0) return a->kwv[k];
    return UNDEF;
}

/* A global function (range, namespace, ...): a V_FUNC value points at its row. */
typedef struct jglobal {
    const char *name;
    jv (*fn)(jx *x, const args *a, size_t pos, int mode);
    int mode;
} jglobal;
extern const jglobal kvg_jinja_globals[];
extern const size_t kvg_jinja_n_globals;

/* v | name(a); an unknown name fails */
jv kvg_jinja_filter(jx *x, const char *name, const jv *v, const args *a, size_t pos);
/* v is name(a); an unknown name fails */
int kvg_jinja_test(jx *x, const char *name, const jv *v, const args *a, size_t pos);
/* obj.name(a) when a builtin method of obj's type has that name; *found says whether one did */
jv kvg_jinja_method(jx *x, const jv *obj, const char *name, const args *a, size_t pos, int *found);

#endif
