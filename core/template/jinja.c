/* jinja.c: the chat-template interpreter (kvg_jinja.h): a lexer that applies Jinja's
 * whitespace rules, a recursive-descent parser to a tree, and a tree-walking renderer.
 *
 * All memory of a parse or a render comes from one arena, freed at once; errors unwind with
 * longjmp to the entry point (as Lua's own errors do), so no path leaks or half-frees. */
#include "kvg_jinja.h"
#include "kvg_host.h"
#include <ctype.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* ---- arena and failure ----------------------------------------------------------------- */

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
    size_t at; /* the position being parsed or evaluated, for errors without a better one */
} jx;

static _Noreturn void failf(jx *x, size_t pos, const char *fmt, ...) {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos && i < x->src_len; i++) {
        if (x->src[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    int k = snprintf(x->msg, x->msg_size, "line %d column %d: ", line, col);
    if (k < 0) k = 0;
    if ((size_t)k < x->msg_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->msg + k, x->msg_size - (size_t)k, fmt, ap);
        va_end(ap);
    }
    longjmp(x->jb, 1);
}

static _Noreturn void too_big(jx *x) {
    failf(x, x->at, "template needs more than %d MiB of memory", MAX_MEMORY >> 20);
}

static void *alloc(jx *x, size_t n) {
    if (n > MAX_MEMORY) too_big(x);
    n = (n + 15) & ~(size_t)15;
    if (n >= BIG_ALLOC) {
        if (x->total + n > MAX_MEMORY) too_big(x);
        block *b = kvg_malloc(sizeof *b + n);
        if (!b) failf(x, x->at, "out of memory");
        b->prev = NULL;
        b->next = x->bigs;
        if (x->bigs) x->bigs->prev = b;
        x->bigs = b;
        b->used = b->cap = n;
        x->total += n;
        memset(b->data, 0, n);
        return b->data;
    }
    block *b = x->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (x->total + cap > MAX_MEMORY) too_big(x);
        b = kvg_malloc(sizeof *b + cap);
        if (!b) failf(x, x->at, "out of memory");
        b->next = x->blocks;
        b->used = 0;
        b->cap = cap;
        x->blocks = b;
        x->total += cap;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

/* Gives back an allocation of n bytes that nothing points into any more (a grown buffer's old
 * storage): a big one is freed and stops counting; a small one stays in its arena block. */
static void release(jx *x, void *p, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!p || n < BIG_ALLOC) return;
    block *b = (block *)(void *)((unsigned char *)p - offsetof(block, data));
    if (b->prev) b->prev->next = b->next;
    else x->bigs = b->next;
    if (b->next) b->next->prev = b->prev;
    x->total -= b->cap;
    kvg_free(b);
}

/* Charges n bytes of comparing, searching or copying to the render's work bound. */
static void charge(jx *x, uint64_t n) {
    x->work += n;
    if (x->work > MAX_WORK)
        failf(x, x->at, "template does too much work (more than %llu MiB of bytes compared, searched or copied)",
              (unsigned long long)(MAX_WORK >> 20));
}

static void arena_free(block *b) {
    while (b) {
        block *n = b->next;
        kvg_free(b);
        b = n;
    }
}

/* ---- values ---------------------------------------------------------------------------- */

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
enum { F_RANGE, F_NAMESPACE, F_RAISE, F_STRFTIME, F_DICT };

struct node;
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
        int fn;
    };
} jv;

struct jlist {
    size_t n, cap;
    jv *v;
    int tuple; /* printed as (a, b) */
};
struct jdict {
    size_t n, cap;
    const jstr **k;
    jv *v;
    int ns; /* a namespace(): its attributes may be assigned */
};

static const jv UNDEF = {.t = V_UNDEF};
static const jv NONE = {.t = V_NONE};

static jv mk_bool(int b) { return (jv){.t = V_BOOL, .b = b != 0}; }
static jv mk_int(int64_t i) { return (jv){.t = V_INT, .i = i}; }
static jv mk_float(double f) { return (jv){.t = V_FLOAT, .f = f}; }
static jv mk_str(const jstr *s) { return (jv){.t = V_STR, .s = s}; }

static jstr *str_new(jx *x, const char *p, size_t n, const unsigned char *u) {
    charge(x, n);
    jstr *s = alloc(x, sizeof *s);
    char *d = alloc(x, n + 1);
    if (n) memcpy(d, p, n);
    s->p = d;
    s->n = n;
    if (u) {
        unsigned char *du = alloc(x, n + 1);
        int any = 0;
        for (size_t i = 0; i < n; i++) any |= (du[i] = u[i]);
        s->u = any ? du : NULL;
    }
    return s;
}
static jstr *str_c(jx *x, const char *c) { return str_new(x, c, strlen(c), NULL); }
static jstr *str_sub(jx *x, const jstr *s, size_t a, size_t b) {
    return str_new(x, s->p + a, b - a, s->u ? s->u + a : NULL);
}

/* a string under construction, with its content flags */
typedef struct sbuf {
    char *p;
    unsigned char *u;
    size_t n, cap;
    int any;
} sbuf;

static void sb_grow(jx *x, sbuf *b, size_t more) {
    if (b->n + more <= b->cap) return;
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->n + more) cap *= 2;
    char *p = alloc(x, cap);
    unsigned char *u = alloc(x, cap);
    if (b->n) {
        memcpy(p, b->p, b->n);
        memcpy(u, b->u, b->n);
    }
    release(x, b->p, b->cap);
    release(x, b->u, b->cap);
    b->p = p;
    b->u = u;
    b->cap = cap;
}
static void sb_add(jx *x, sbuf *b, const char *p, size_t n, const unsigned char *u, int flag) {
    if (n == 0) return;
    charge(x, n);
    sb_grow(x, b, n);
    memcpy(b->p + b->n, p, n);
    for (size_t i = 0; i < n; i++) b->any |= (b->u[b->n + i] = (unsigned char)(u ? u[i] : flag));
    b->n += n;
}
static void sb_str(jx *x, sbuf *b, const jstr *s) { sb_add(x, b, s->p, s->n, s->u, 0); }
static void sb_c(jx *x, sbuf *b, const char *c) { sb_add(x, b, c, strlen(c), NULL, 0); }
static jstr *sb_done(jx *x, sbuf *b) {
    jstr *s = alloc(x, sizeof *s);
    char *p = alloc(x, b->n + 1);
    if (b->n) memcpy(p, b->p, b->n);
    s->p = p;
    s->n = b->n;
    s->u = b->any ? b->u : NULL; /* the builder is done with: its flags are the string's */
    release(x, b->p, b->cap);
    if (!b->any) release(x, b->u, b->cap);
    *b = (sbuf){0};
    return s;
}
/* a ~ b: appended in place when a ends its buffer's used part and there is room */
static jstr *str_cat(jx *x, const jstr *a, const jstr *b) {
    if (a->n > MAX_MEMORY || b->n > MAX_MEMORY) too_big(x);
    size_t n = a->n + b->n;
    growbuf *g = a->g;
    if (!g || a->p + a->n != g->p + g->used || g->cap - g->used < b->n) {
        g = alloc(x, sizeof *g);
        g->cap = n + n / 2 + 16;
        g->p = alloc(x, g->cap);
        if (a->u) g->u = alloc(x, g->cap);
        charge(x, a->n);
        if (a->n) memcpy(g->p, a->p, a->n);
        if (a->u) memcpy(g->u, a->u, a->n);
        g->used = a->n;
    }
    charge(x, b->n);
    if (b->u && !g->u) g->u = alloc(x, g->cap); /* zeros: no byte so far came from content */
    if (b->n) memcpy(g->p + g->used, b->p, b->n);
    if (b->u) memcpy(g->u + g->used, b->u, b->n);
    jstr *s = alloc(x, sizeof *s);
    s->p = g->p + (a->g == g ? a->p - g->p : 0);
    s->n = n;
    s->u = a->u || b->u ? g->u + (s->p - g->p) : NULL;
    s->g = g;
    g->used += b->n;
    return s;
}

static jlist *list_new(jx *x) { return alloc(x, sizeof(jlist)); }
static void list_push(jx *x, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        jv *nv = alloc(x, cap * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        release(x, l->v, l->cap * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

static int str_eq(const jstr *a, const char *p, size_t n) { return a->n == n && memcmp(a->p, p, n) == 0; }

static jdict *dict_new(jx *x) { return alloc(x, sizeof(jdict)); }
static jv *dict_find(const jdict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (str_eq(d->k[i], k, n)) return &d->v[i];
    return NULL;
}
static void dict_set(jx *x, jdict *d, const jstr *k, jv v) {
    jv *have = dict_find(d, k->p, k->n);
    if (have) {
        *have = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        const jstr **nk = alloc(x, cap * sizeof *nk);
        jv *nv = alloc(x, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        release(x, d->k, d->cap * sizeof *nk);
        release(x, d->v, d->cap * sizeof *nv);
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}
static void dict_setc(jx *x, jdict *d, const char *k, jv v) {
    size_t n = strlen(k);
    jv *have = dict_find(d, k, n);
    if (have) {
        *have = v;
        return;
    }
    /* a slot emptied by a reset (a loop's scope, every iteration) still holds its key */
    const jstr *key = d->n < d->cap && d->k[d->n] && str_eq(d->k[d->n], k, n) ? d->k[d->n] : str_c(x, k);
    dict_set(x, d, key, v);
}

/* ---- lexer ----------------------------------------------------------------------------- */

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

static void push_tok(lexer *L, tok t) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        tok *nv = alloc(L->x, cap * sizeof *nv);
        if (L->n) memcpy(nv, L->v, L->n * sizeof *nv);
        release(L->x, L->v, L->cap * sizeof *nv);
        L->v = nv;
        L->cap = cap;
    }
    L->v[L->n++] = t;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* The tokens inside one tag, up to and including its end; returns the position after it. */
static size_t lex_tag(lexer *L, size_t pos, int var, int *strip_after, int *ate_newline) {
    jx *x = L->x;
    const char *s = x->src;
    size_t n = x->src_len;
    int depth = 0;
    for (;;) {
        while (pos < n && is_ws(s[pos])) pos++;
        if (pos >= n) failf(x, pos, "unclosed %s tag", var ? "{{" : "{%");
        const char *end = var ? "}}" : "%}";
        if (depth == 0) {
            /* the source is NUL-terminated: strncmp stops there */
            int sign = (s[pos] == '-' || s[pos] == '+') && strncmp(s + pos + 1, end, 2) == 0;
            if (sign || strncmp(s + pos, end, 2) == 0) {
                size_t at = pos;
                char c = sign ? s[pos] : 0;
                pos += sign ? 3 : 2;
                push_tok(L, (tok){.k = var ? T_VEND : T_BEND, .pos = at});
                *strip_after = c == '-';
                *ate_newline = 0;
                if (c == '-') {
                    size_t p0 = pos;
                    while (pos < n && is_ws(s[pos])) pos++;
                    *ate_newline = pos > p0 && s[pos - 1] == '\n';
                } else if (!var && c != '+' && pos < n && s[pos] == '\n') { /* trim_blocks */
                    pos++;
                    *ate_newline = 1;
                }
                return pos;
            }
        }
        char c = s[pos];
        size_t start = pos;
        if (isalpha((unsigned char)c) || c == '_') {
            while (pos < n && (isalnum((unsigned char)s[pos]) || s[pos] == '_')) pos++;
            push_tok(L, (tok){.k = T_NAME, .pos = start, .p = s + start, .n = pos - start});
        } else if (isdigit((unsigned char)c)) {
            int is_float = 0;
            char num[64];
            size_t k = 0;
            while (pos < n && (isdigit((unsigned char)s[pos]) || s[pos] == '_' ||
                               (s[pos] == '.' && !is_float && pos + 1 < n && isdigit((unsigned char)s[pos + 1])) ||
                               ((s[pos] == 'e' || s[pos] == 'E') && pos + 1 < n &&
                                (isdigit((unsigned char)s[pos + 1]) || s[pos + 1] == '-' || s[pos + 1] == '+')))) {
                if (s[pos] == '.') is_float = 1;
                if (s[pos] == 'e' || s[pos] == 'E') {
                    is_float = 1;
                    if (k < sizeof num - 1) num[k++] = s[pos];
                    pos++;
                }
                if (s[pos] != '_' && k < sizeof num - 1) num[k++] = s[pos];
                pos++;
            }
            num[k] = 0;
            tok t = {.k = is_float ? T_FLOAT : T_INT, .pos = start};
            if (is_float) t.f = strtod(num, NULL);
            else t.i = (int64_t)strtoll(num, NULL, 10);
            push_tok(L, t);
        } else if (c == '\'' || c == '"') {
            sbuf b = {0};
            pos++;
            for (;;) {
                if (pos >= n) failf(x, start, "unterminated string");
                char d = s[pos];
                if (d == c) {
                    pos++;
                    break;
                }
                if (d == '\\' && pos + 1 < n) {
                    char e = s[pos + 1], o = 0;
                    pos += 2;
                    switch (e) {
                    case 'n': o = '\n'; break;
                    case 't': o = '\t'; break;
                    case 'r': o = '\r'; break;
                    case '\\': o = '\\'; break;
                    case '\'': o = '\''; break;
                    case '"': o = '"'; break;
                    case '0': o = 0; sb_add(x, &b, &o, 1, NULL, 0); continue;
                    case '\n': continue;
                    default: sb_add(x, &b, s + pos - 2, 2, NULL, 0); continue; /* kept as written */
                    }
                    sb_add(x, &b, &o, 1, NULL, 0);
                    continue;
                }
                sb_add(x, &b, &d, 1, NULL, 0);
                pos++;
            }
            jstr *js = sb_done(x, &b);
            push_tok(L, (tok){.k = T_STR, .pos = start, .p = js->p, .n = js->n});
        } else {
            static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
            size_t len = 0;
            for (int i = 0; ops2[i]; i++)
                if (pos + 2 <= n && strncmp(s + pos, ops2[i], 2) == 0) len = 2;
            if (!len) {
                if (!strchr("+-*/%~<>=()[]{}.,:|", c) || c == 0) failf(x, pos, "unexpected character '%c'", c);
                len = 1;
                if (c == '(' || c == '[' || c == '{') depth++;
                if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            }
            push_tok(L, (tok){.k = T_OP, .pos = start, .p = s + start, .n = len});
            pos += len;
        }
    }
}

static void lex(lexer *L) {
    jx *x = L->x;
    const char *s = x->src;
    size_t n = x->src_len, pos = 0;
    int strip_next = 0, line_starting = 1; /* strip_next: the last tag ended with '-' */
    while (pos < n) {
        /* the next tag opener */
        size_t t = pos;
        int kind = 0; /* 1 {{, 2 {%, 3 {# */
        for (; t + 1 < n; t++)
            if (s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#')) {
                kind = s[t + 1] == '{' ? 1 : s[t + 1] == '%' ? 2 : 3;
                break;
            }
        if (!kind) t = n;
        size_t a = pos, b = t;
        if (strip_next)
            while (a < b && is_ws(s[a])) a++;
        char sign = kind && t + 2 < n ? s[t + 2] : 0;
        if (kind && sign == '-') {
            while (b > a && is_ws(s[b - 1])) b--;
        } else if (kind >= 2 && sign != '+') { /* lstrip_blocks: only blanks between line start and tag */
            size_t l = b;
            while (l > a && (s[l - 1] == ' ' || s[l - 1] == '\t' || s[l - 1] == '\r' || s[l - 1] == '\f' ||
                             s[l - 1] == '\v'))
                l--;
            if ((l > a && s[l - 1] == '\n') || (l == a && line_starting)) b = l;
        }
        if (b > a) push_tok(L, (tok){.k = T_TEXT, .pos = a, .p = s + a, .n = b - a});
        if (!kind) break;
        pos = t + 2 + (sign == '-' || sign == '+');
        int ate = 0;
        strip_next = 0;
        if (kind == 3) {
            const char *e = NULL;
            for (size_t k = pos; k + 1 < n; k++)
                if (s[k] == '#' && s[k + 1] == '}') {
                    e = s + k;
                    break;
                }
            if (!e) failf(x, t, "unclosed comment");
            size_t q = (size_t)(e - s);
            char c = q > pos && (s[q - 1] == '-' || s[q - 1] == '+') ? s[q - 1] : 0;
            pos = q + 2;
            if (c == '-') {
                size_t p0 = pos;
                while (pos < n && is_ws(s[pos])) pos++;
                ate = pos > p0 && s[pos - 1] == '\n';
                strip_next = 0;
            } else if (c != '+' && pos < n && s[pos] == '\n') {
                pos++;
                ate = 1;
            }
        } else {
            push_tok(L, (tok){.k = kind == 1 ? T_VBEGIN : T_BBEGIN, .pos = t});
            pos = lex_tag(L, pos, kind == 1, &strip_next, &ate);
            strip_next = 0; /* the tag already consumed the whitespace it strips */
        }
        line_starting = ate;
    }
    push_tok(L, (tok){.k = T_EOF, .pos = n});
}

/* ---- syntax tree ----------------------------------------------------------------------- */

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

typedef struct parser {
    jx *x;
    tok *t;
    size_t i;
    int depth;
} parser;

static node *mk(parser *P, int kind, size_t pos) {
    node *n = alloc(P->x, sizeof *n);
    n->kind = kind;
    n->pos = pos;
    return n;
}
static void nl_push(jx *x, nlist *l, node *n) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        node **v = alloc(x, (size_t)cap * sizeof *v);
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = n;
}
static const char *cstr(jx *x, const char *p, size_t n) {
    char *d = alloc(x, n + 1);
    memcpy(d, p, n);
    return d;
}

static tok *cur(parser *P) { return &P->t[P->i]; }
static int is_op(const tok *t, const char *op) {
    return t->k == T_OP && t->n == strlen(op) && memcmp(t->p, op, t->n) == 0;
}
static int is_name(const tok *t, const char *nm) {
    return t->k == T_NAME && t->n == strlen(nm) && memcmp(t->p, nm, t->n) == 0;
}
static const char *tok_desc(parser *P, const tok *t) {
    static const char *const kinds[] = {"text", "'{{'", "'}}'", "'{%'", "'%}'", "name", "string", "integer",
                                        "number", "operator", "end of template"};
    if (t->k == T_NAME || t->k == T_OP) {
        char *d = alloc(P->x, t->n + 3);
        d[0] = '\'';
        memcpy(d + 1, t->p, t->n);
        d[t->n + 1] = '\'';
        return d;
    }
    return kinds[t->k];
}
static void expect_op(parser *P, const char *op) {
    if (!is_op(cur(P), op)) failf(P->x, cur(P)->pos, "expected '%s', got %s", op, tok_desc(P, cur(P)));
    P->i++;
}
static const char *expect_name(parser *P) {
    tok *t = cur(P);
    if (t->k != T_NAME) failf(P->x, t->pos, "expected a name, got %s", tok_desc(P, t));
    P->i++;
    return cstr(P->x, t->p, t->n);
}
static void enter(parser *P) {
    if (++P->depth > MAX_DEPTH) failf(P->x, cur(P)->pos, "template nested too deeply (more than %d levels)", MAX_DEPTH);
}

static node *p_expr(parser *P);
static node *p_unary(parser *P, int with_filter);

static void p_args(parser *P, node *call) {
    expect_op(P, "(");
    while (!is_op(cur(P), ")")) {
        tok *t = cur(P);
        if (t->k == T_NAME && is_op(&P->t[P->i + 1], "=")) {
            node *kw = mk(P, N_KWARG, t->pos);
            kw->name = cstr(P->x, t->p, t->n);
            P->i += 2;
            kw->a = p_expr(P);
            nl_push(P->x, &call->kids2, kw);
        } else {
            nl_push(P->x, &call->kids, p_expr(P));
        }
        if (!is_op(cur(P), ",")) break;
        P->i++;
    }
    expect_op(P, ")");
}

static node *p_primary(parser *P) {
    tok *t = cur(P);
    node *n;
    enter(P);
    if (t->k == T_NAME) {
        P->i++;
        n = mk(P, N_LIT, t->pos);
        if (is_name(t, "true") || is_name(t, "True")) n->lit = mk_bool(1);
        else if (is_name(t, "false") || is_name(t, "False")) n->lit = mk_bool(0);
        else if (is_name(t, "none") || is_name(t, "None")) n->lit = NONE;
        else {
            n->kind = N_NAME;
            n->name = cstr(P->x, t->p, t->n);
        }
    } else if (t->k == T_STR) {
        sbuf b = {0};
        while (cur(P)->k == T_STR) { /* adjacent literals concatenate */
            sb_add(P->x, &b, cur(P)->p, cur(P)->n, NULL, 0);
            P->i++;
        }
        n = mk(P, N_LIT, t->pos);
        n->lit = mk_str(sb_done(P->x, &b));
    } else if (t->k == T_INT || t->k == T_FLOAT) {
        P->i++;
        n = mk(P, N_LIT, t->pos);
        n->lit = t->k == T_INT ? mk_int(t->i) : mk_float(t->f);
    } else if (is_op(t, "(")) {
        P->i++;
        if (is_op(cur(P), ")")) {
            P->i++;
            n = mk(P, N_LIST, t->pos);
            n->neg = 1;
        } else {
            n = p_expr(P);
            if (is_op(cur(P), ",")) { /* a tuple */
                node *l = mk(P, N_LIST, t->pos);
                l->neg = 1;
                nl_push(P->x, &l->kids, n);
                while (is_op(cur(P), ",")) {
                    P->i++;
                    if (is_op(cur(P), ")")) break;
                    nl_push(P->x, &l->kids, p_expr(P));
                }
                n = l;
            }
            expect_op(P, ")");
        }
    } else if (is_op(t, "[")) {
        P->i++;
        n = mk(P, N_LIST, t->pos);
        while (!is_op(cur(P), "]")) {
            nl_push(P->x, &n->kids, p_expr(P));
            if (!is_op(cur(P), ",")) break;
            P->i++;
        }
        expect_op(P, "]");
    } else if (is_op(t, "{")) {
        P->i++;
        n = mk(P, N_DICT, t->pos);
        while (!is_op(cur(P), "}")) {
            node *pr = mk(P, N_PAIR, cur(P)->pos);
            pr->a = p_expr(P);
            expect_op(P, ":");
            pr->b = p_expr(P);
            nl_push(P->x, &n->kids, pr);
            if (!is_op(cur(P), ",")) break;
            P->i++;
        }
        expect_op(P, "}");
    } else {
        failf(P->x, t->pos, "expected an expression, got %s", tok_desc(P, t));
    }
    P->depth--;
    return n;
}

static node *p_postfix(parser *P, node *n) {
    for (;;) {
        tok *t = cur(P);
        if (is_op(t, ".")) {
            P->i++;
            tok *a = cur(P);
            node *g = mk(P, N_ATTR, a->pos);
            g->a = n;
            if (a->k == T_INT) {
                g->kind = N_ITEM;
                g->b = mk(P, N_LIT, a->pos);
                g->b->lit = mk_int(a->i);
                P->i++;
            } else {
                g->name = expect_name(P);
            }
            n = g;
        } else if (is_op(t, "[")) {
            P->i++;
            node *g = mk(P, N_ITEM, t->pos);
            g->a = n;
            node *parts[3] = {NULL, NULL, NULL};
            int colons = 0;
            for (;;) {
                if (is_op(cur(P), ":")) {
                    if (++colons > 2) failf(P->x, cur(P)->pos, "a slice has at most two ':'");
                    P->i++;
                    continue;
                }
                if (is_op(cur(P), "]")) break;
                if (parts[colons]) failf(P->x, cur(P)->pos, "expected ':' or ']', got %s", tok_desc(P, cur(P)));
                parts[colons] = p_expr(P);
            }
            expect_op(P, "]");
            if (colons) {
                g->kind = N_SLICE;
                g->b = parts[0];
                g->c = parts[1];
                nl_push(P->x, &g->kids, parts[2]);
            } else {
                if (!parts[0]) failf(P->x, t->pos, "empty subscript");
                g->b = parts[0];
            }
            n = g;
        } else if (is_op(t, "(")) {
            node *c = mk(P, N_CALL, t->pos);
            c->a = n;
            p_args(P, c);
            n = c;
        } else {
            return n;
        }
    }
}

static int starts_test_arg(const tok *t) {
    if (t->k == T_STR || t->k == T_INT || t->k == T_FLOAT) return 1;
    if (t->k == T_NAME)
        return !(is_name(t, "and") || is_name(t, "or") || is_name(t, "else") || is_name(t, "if") ||
                 is_name(t, "in") || is_name(t, "is") || is_name(t, "not"));
    return is_op(t, "[") || is_op(t, "{") || is_op(t, "-");
}

static node *p_filters(parser *P, node *n) {
    for (;;) {
        tok *t = cur(P);
        if (is_op(t, "|")) {
            P->i++;
            node *f = mk(P, N_FILTER, cur(P)->pos);
            f->name = expect_name(P);
            f->a = n;
            if (is_op(cur(P), "(")) p_args(P, f);
            n = f;
        } else if (is_name(t, "is")) {
            P->i++;
            node *f = mk(P, N_TEST, cur(P)->pos);
            if (is_name(cur(P), "not")) {
                f->neg = 1;
                P->i++;
            }
            tok *nt = cur(P);
            if (nt->k == T_NAME) f->name = expect_name(P);
            else if (is_name(nt, "none")) f->name = "none";
            else failf(P->x, nt->pos, "expected a test name, got %s", tok_desc(P, nt));
            f->a = n;
            if (is_op(cur(P), "(")) p_args(P, f);
            else if (starts_test_arg(cur(P))) nl_push(P->x, &f->kids, p_unary(P, 0));
            n = f;
        } else {
            return n;
        }
    }
}

static node *p_unary(parser *P, int with_filter) {
    tok *t = cur(P);
    node *n;
    enter(P);
    if (is_op(t, "-") || is_op(t, "+")) {
        P->i++;
        n = mk(P, N_NEG, t->pos);
        n->a = p_unary(P, 0);
        if (is_op(t, "+")) n = n->a;
    } else {
        n = p_primary(P);
    }
    n = p_postfix(P, n);
    if (with_filter) n = p_filters(P, n);
    P->depth--;
    return n;
}

static node *bin(parser *P, const tok *t, node *a, node *b) {
    node *n = mk(P, N_BIN, t->pos);
    n->name = cstr(P->x, t->p, t->n);
    n->a = a;
    n->b = b;
    return n;
}

static node *p_pow(parser *P) {
    node *n = p_unary(P, 1);
    while (is_op(cur(P), "**")) {
        tok *t = cur(P);
        P->i++;
        n = bin(P, t, n, p_unary(P, 1));
    }
    return n;
}
static node *p_math2(parser *P) {
    node *n = p_pow(P);
    for (;;) {
        tok *t = cur(P);
        if (!(is_op(t, "*") || is_op(t, "/") || is_op(t, "//") || is_op(t, "%"))) return n;
        P->i++;
        n = bin(P, t, n, p_pow(P));
    }
}
static node *p_concat(parser *P) {
    node *n = p_math2(P);
    while (is_op(cur(P), "~")) {
        tok *t = cur(P);
        P->i++;
        n = bin(P, t, n, p_math2(P));
    }
    return n;
}
static node *p_math1(parser *P) {
    node *n = p_concat(P);
    for (;;) {
        tok *t = cur(P);
        if (!(is_op(t, "+") || is_op(t, "-"))) return n;
        P->i++;
        n = bin(P, t, n, p_concat(P));
    }
}
static node *p_compare(parser *P) {
    node *n = p_math1(P);
    for (;;) {
        tok *t = cur(P);
        if (is_op(t, "==") || is_op(t, "!=") || is_op(t, "<") || is_op(t, "<=") || is_op(t, ">") ||
            is_op(t, ">=") || is_name(t, "in")) {
            P->i++;
            n = bin(P, t, n, p_math1(P));
        } else if (is_name(t, "not") && is_name(&P->t[P->i + 1], "in")) {
            P->i += 2;
            node *b = mk(P, N_BIN, t->pos);
            b->name = "not in";
            b->a = n;
            b->b = p_math1(P);
            n = b;
        } else {
            return n;
        }
    }
}
static node *p_not(parser *P) {
    tok *t = cur(P);
    if (is_name(t, "not")) {
        P->i++;
        enter(P);
        node *n = mk(P, N_NOT, t->pos);
        n->a = p_not(P);
        P->depth--;
        return n;
    }
    return p_compare(P);
}
static node *p_and(parser *P) {
    node *n = p_not(P);
    while (is_name(cur(P), "and")) {
        node *a = mk(P, N_AND, cur(P)->pos);
        P->i++;
        a->a = n;
        a->b = p_not(P);
        n = a;
    }
    return n;
}
static node *p_or(parser *P) {
    node *n = p_and(P);
    while (is_name(cur(P), "or")) {
        node *o = mk(P, N_OR, cur(P)->pos);
        P->i++;
        o->a = n;
        o->b = p_and(P);
        n = o;
    }
    return n;
}
static node *p_expr(parser *P) {
    enter(P);
    node *n = p_or(P);
    while (is_name(cur(P), "if")) {
        node *c = mk(P, N_COND, cur(P)->pos);
        P->i++;
        c->a = p_or(P); /* condition */
        c->b = n;       /* then */
        if (is_name(cur(P), "else")) {
            P->i++;
            c->c = p_expr(P);
        }
        n = c;
    }
    P->depth--;
    return n;
}

static void expect_end(parser *P) {
    if (cur(P)->k != T_BEND) failf(P->x, cur(P)->pos, "expected '%%}', got %s", tok_desc(P, cur(P)));
    P->i++;
}

/* Parses statements until a {% name %} in `stops` (returned, the tag's name consumed) or EOF. */
static const char *p_body(parser *P, nlist *body, const char *const *stops);

static node *p_target(parser *P) {
    tok *t = cur(P);
    node *n = mk(P, N_NAME, t->pos);
    n->name = expect_name(P);
    if (is_op(cur(P), ".")) {
        P->i++;
        node *a = mk(P, N_ATTR, cur(P)->pos);
        a->a = n;
        a->name = expect_name(P);
        return a;
    }
    return n;
}

static node *p_stmt(parser *P, const tok *begin) {
    tok *t = cur(P);
    if (t->k != T_NAME) failf(P->x, t->pos, "expected a statement name, got %s", tok_desc(P, t));
    if (is_name(t, "if")) {
        P->i++;
        node *n = mk(P, N_IF, begin->pos);
        node *br = mk(P, N_BODY, t->pos);
        br->a = p_expr(P);
        expect_end(P);
        for (;;) {
            static const char *const stops[] = {"elif", "else", "endif", NULL};
            nl_push(P->x, &n->kids, br);
            size_t at = cur(P)->pos;
            const char *stop = p_body(P, &br->kids, stops);
            if (!stop) failf(P->x, begin->pos, "'if' is never closed (expected 'endif')");
            if (strcmp(stop, "endif") == 0) {
                expect_end(P);
                return n;
            }
            br = mk(P, N_BODY, at);
            if (strcmp(stop, "elif") == 0) br->a = p_expr(P);
            expect_end(P);
        }
    }
    if (is_name(t, "for")) {
        P->i++;
        node *n = mk(P, N_FOR, begin->pos);
        do {
            node *nm = mk(P, N_NAME, cur(P)->pos);
            nm->name = expect_name(P);
            nl_push(P->x, &n->kids2, nm); /* targets, moved below */
        } while (is_op(cur(P), ",") && (P->i++, 1));
        if (!is_name(cur(P), "in")) failf(P->x, cur(P)->pos, "expected 'in', got %s", tok_desc(P, cur(P)));
        P->i++;
        n->a = p_or(P); /* the iterable: an inline 'if' filters */
        if (is_name(cur(P), "if")) {
            P->i++;
            n->b = p_expr(P);
        }
        if (is_name(cur(P), "recursive")) failf(P->x, cur(P)->pos, "recursive loops are not supported");
        expect_end(P);
        node *targets = mk(P, N_LIST, t->pos);
        targets->kids = n->kids2;
        n->c = targets;
        n->kids2 = (nlist){0};
        static const char *const stops[] = {"else", "endfor", NULL};
        const char *stop = p_body(P, &n->kids, stops);
        if (!stop) failf(P->x, begin->pos, "'for' is never closed (expected 'endfor')");
        expect_end(P);
        if (strcmp(stop, "else") == 0) {
            static const char *const stops2[] = {"endfor", NULL};
            if (!p_body(P, &n->kids2, stops2)) failf(P->x, begin->pos, "'for' is never closed (expected 'endfor')");
            expect_end(P);
        }
        return n;
    }
    if (is_name(t, "set")) {
        P->i++;
        node *n = mk(P, N_SET, begin->pos);
        node *tg = p_target(P);
        if (is_op(cur(P), ",")) {
            node *l = mk(P, N_LIST, tg->pos);
            nl_push(P->x, &l->kids, tg);
            while (is_op(cur(P), ",")) {
                P->i++;
                nl_push(P->x, &l->kids, p_target(P));
            }
            tg = l;
        }
        n->a = tg;
        if (cur(P)->k == T_BEND && tg->kind == N_NAME) {
            P->i++;
            n->kind = N_SETBLOCK;
            static const char *const stops[] = {"endset", NULL};
            if (!p_body(P, &n->kids, stops)) failf(P->x, begin->pos, "'set' is never closed (expected 'endset')");
            expect_end(P);
            return n;
        }
        expect_op(P, "=");
        n->b = p_expr(P);
        if (is_op(cur(P), ",")) { /* set a = 1, 2 */
            node *l = mk(P, N_LIST, n->b->pos);
            nl_push(P->x, &l->kids, n->b);
            while (is_op(cur(P), ",")) {
                P->i++;
                nl_push(P->x, &l->kids, p_expr(P));
            }
            n->b = l;
        }
        expect_end(P);
        return n;
    }
    if (is_name(t, "macro")) {
        P->i++;
        node *n = mk(P, N_MACRO, begin->pos);
        n->name = expect_name(P);
        expect_op(P, "(");
        while (!is_op(cur(P), ")")) {
            node *pm = mk(P, N_KWARG, cur(P)->pos);
            pm->name = expect_name(P);
            if (is_op(cur(P), "=")) {
                P->i++;
                pm->a = p_expr(P);
            }
            nl_push(P->x, &n->kids2, pm);
            if (!is_op(cur(P), ",")) break;
            P->i++;
        }
        expect_op(P, ")");
        expect_end(P);
        static const char *const stops[] = {"endmacro", NULL};
        if (!p_body(P, &n->kids, stops)) failf(P->x, begin->pos, "'macro' is never closed (expected 'endmacro')");
        if (cur(P)->k == T_NAME) P->i++; /* {% endmacro name %} */
        expect_end(P);
        return n;
    }
    if (is_name(t, "break") || is_name(t, "continue")) {
        P->i++;
        node *n = mk(P, is_name(t, "break") ? N_BREAK : N_CONTINUE, begin->pos);
        expect_end(P);
        return n;
    }
    if (is_name(t, "generation")) { /* transformers' assistant-mask marker: renders its body */
        P->i++;
        expect_end(P);
        node *n = mk(P, N_BODY, begin->pos);
        static const char *const stops[] = {"endgeneration", NULL};
        if (!p_body(P, &n->kids, stops)) failf(P->x, begin->pos, "'generation' is never closed");
        expect_end(P);
        return n;
    }
    failf(P->x, t->pos, "unknown statement '%.*s'", (int)t->n, t->p);
}

static const char *p_body(parser *P, nlist *body, const char *const *stops) {
    enter(P);
    for (;;) {
        tok *t = cur(P);
        if (t->k == T_EOF) {
            P->depth--;
            return NULL;
        }
        if (t->k == T_TEXT) {
            node *n = mk(P, N_TEXT, t->pos);
            n->lit = mk_str(str_new(P->x, t->p, t->n, NULL));
            nl_push(P->x, body, n);
            P->i++;
        } else if (t->k == T_VBEGIN) {
            P->i++;
            node *n = mk(P, N_OUT, t->pos);
            n->a = p_expr(P);
            if (cur(P)->k != T_VEND) failf(P->x, cur(P)->pos, "expected '}}', got %s", tok_desc(P, cur(P)));
            P->i++;
            nl_push(P->x, body, n);
        } else if (t->k == T_BBEGIN) {
            tok *nm = &P->t[P->i + 1];
            for (int k = 0; stops && stops[k]; k++)
                if (is_name(nm, stops[k])) {
                    P->i += 2;
                    P->depth--;
                    return stops[k];
                }
            if (nm->k == T_NAME && (strncmp(nm->p, "end", 3) == 0 || is_name(nm, "elif") || is_name(nm, "else")))
                failf(P->x, nm->pos, "unexpected '%.*s'", (int)nm->n, nm->p);
            P->i++;
            nl_push(P->x, body, p_stmt(P, t));
        } else {
            failf(P->x, t->pos, "unexpected %s", tok_desc(P, t));
        }
    }
}

struct kvg_jinja {
    block *blocks, *bigs;
    node *root;
    char *src;
    size_t src_len;
};

bool kvg_jinja_parse(const char *src, size_t len, kvg_jinja **out, char *msg, size_t msg_size) {
    *out = NULL;
    kvg_jinja *t = kvg_calloc(1, sizeof *t);
    char *copy = kvg_malloc(len + 1);
    if (!t || !copy) {
        kvg_free(t);
        kvg_free(copy);
        snprintf(msg, msg_size, "out of memory");
        return false;
    }
    memcpy(copy, src, len);
    copy[len] = 0;
    jx x = {.msg = msg, .msg_size = msg_size, .src = copy, .src_len = len};
    if (setjmp(x.jb)) {
        arena_free(x.blocks);
        arena_free(x.bigs);
        kvg_free(copy);
        kvg_free(t);
        return false;
    }
    lexer L = {.x = &x};
    lex(&L);
    parser P = {.x = &x, .t = L.v};
    node *root = mk(&P, N_BODY, 0);
    if (p_body(&P, &root->kids, NULL) == NULL && cur(&P)->k != T_EOF)
        failf(&x, cur(&P)->pos, "unexpected %s", tok_desc(&P, cur(&P)));
    t->blocks = x.blocks;
    t->bigs = x.bigs;
    t->root = root;
    t->src = copy;
    t->src_len = len;
    *out = t;
    return true;
}

void kvg_jinja_free(kvg_jinja *t) {
    if (!t) return;
    arena_free(t->blocks);
    arena_free(t->bigs);
    kvg_free(t->src);
    kvg_free(t);
}

/* ---- rendering ------------------------------------------------------------------------- */

typedef struct scope {
    struct scope *parent;
    jdict *vars;
} scope;

typedef struct rctx {
    jx *x;
    sbuf out; /* what is rendered (a macro or set block renders into its own) */
    scope *globals;
    int depth, calls;
    long iterations;
    int loop_ctl; /* 1 break, 2 continue */
} rctx;

static void out_add(rctx *r, const char *p, size_t n, const unsigned char *u, size_t pos) {
    if (r->out.n + n > MAX_OUTPUT) failf(r->x, pos, "output longer than %d bytes", MAX_OUTPUT);
    sb_add(r->x, &r->out, p, n, u, 0);
}

static const char *type_name(const jv *v) {
    static const char *const names[] = {"undefined", "none", "boolean", "integer", "float",
                                        "string",    "list", "dict",    "macro",   "function"};
    return names[v->t];
}

static int truthy(const jv *v) {
    switch (v->t) {
    case V_BOOL: return v->b;
    case V_INT: return v->i != 0;
    case V_FLOAT: return v->f != 0;
    case V_STR: return v->s->n != 0;
    case V_LIST: return v->l->n != 0;
    case V_DICT: return v->d->n != 0 || v->d->ns;
    case V_MACRO:
    case V_FUNC: return 1;
    default: return 0;
    }
}

static void fmt_float(char *buf, size_t size, double f) {
    if (isnan(f)) {
        snprintf(buf, size, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, size, f < 0 ? "-inf" : "inf");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, f);
        if (strtod(buf, NULL) == f) break;
    }
    if (!strpbrk(buf, ".en")) strncat(buf, ".0", size - strlen(buf) - 1);
}

static void repr(rctx *r, sbuf *b, const jv *v, int top);

/* Jinja's str(): strings as they are, the rest as Python prints them. */
static const jstr *to_str(rctx *r, const jv *v) {
    if (v->t == V_STR) return v->s;
    sbuf b = {0};
    repr(r, &b, v, 1);
    return sb_done(r->x, &b);
}

static void repr(rctx *r, sbuf *b, const jv *v, int top) {
    jx *x = r->x;
    char num[64];
    switch (v->t) {
    case V_UNDEF: break;
    case V_NONE: sb_c(x, b, "None"); break;
    case V_BOOL: sb_c(x, b, v->b ? "True" : "False"); break;
    case V_INT: snprintf(num, sizeof num, "%lld", (long long)v->i); sb_c(x, b, num); break;
    case V_FLOAT: fmt_float(num, sizeof num, v->f); sb_c(x, b, num); break;
    case V_STR:
        if (top) sb_str(x, b, v->s);
        else {
            int dq = memchr(v->s->p, '\'', v->s->n) && !memchr(v->s->p, '"', v->s->n);
            sb_c(x, b, dq ? "\"" : "'");
            for (size_t i = 0; i < v->s->n; i++) {
                char c = v->s->p[i];
                int flag = v->s->u ? v->s->u[i] : 0;
                const char *e = c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r"
                                : (c == '\'' && !dq) ? "\\'" : NULL;
                if (e) sb_add(x, b, e, strlen(e), NULL, flag);
                else sb_add(x, b, &c, 1, NULL, flag);
            }
            sb_c(x, b, dq ? "\"" : "'");
        }
        break;
    case V_LIST:
        sb_c(x, b, v->l->tuple ? "(" : "[");
        for (size_t i = 0; i < v->l->n; i++) {
            if (i) sb_c(x, b, ", ");
            repr(r, b, &v->l->v[i], 0);
        }
        sb_c(x, b, v->l->tuple ? (v->l->n == 1 ? ",)" : ")") : "]");
        break;
    case V_DICT:
        sb_c(x, b, "{");
        for (size_t i = 0; i < v->d->n; i++) {
            if (i) sb_c(x, b, ", ");
            jv k = mk_str(v->d->k[i]);
            repr(r, b, &k, 0);
            sb_c(x, b, ": ");
            repr(r, b, &v->d->v[i], 0);
        }
        sb_c(x, b, "}");
        break;
    default: sb_c(x, b, v->t == V_MACRO ? "<macro>" : "<function>"); break;
    }
}

/* json.dumps(ensure_ascii=False), as transformers' tojson filter */
static void tojson(rctx *r, sbuf *b, const jv *v, int indent, int level, size_t pos) {
    jx *x = r->x;
    char num[64];
    if (level > MAX_DEPTH) failf(x, pos, "tojson: value nested too deeply");
    switch (v->t) {
    case V_UNDEF: failf(x, pos, "tojson: value is undefined");
    case V_NONE: sb_c(x, b, "null"); break;
    case V_BOOL: sb_c(x, b, v->b ? "true" : "false"); break;
    case V_INT: snprintf(num, sizeof num, "%lld", (long long)v->i); sb_c(x, b, num); break;
    case V_FLOAT:
        fmt_float(num, sizeof num, v->f);
        sb_c(x, b, strcmp(num, "nan") == 0 ? "NaN" : strcmp(num, "inf") == 0 ? "Infinity"
                   : strcmp(num, "-inf") == 0 ? "-Infinity" : num);
        break;
    case V_STR:
        sb_c(x, b, "\"");
        for (size_t i = 0; i < v->s->n; i++) {
            unsigned char c = (unsigned char)v->s->p[i];
            int flag = v->s->u ? v->s->u[i] : 0;
            char e[8];
            if (c == '"') strcpy(e, "\\\"");
            else if (c == '\\') strcpy(e, "\\\\");
            else if (c == '\n') strcpy(e, "\\n");
            else if (c == '\r') strcpy(e, "\\r");
            else if (c == '\t') strcpy(e, "\\t");
            else if (c == '\b') strcpy(e, "\\b");
            else if (c == '\f') strcpy(e, "\\f");
            else if (c < 0x20 || c == 0x7f) snprintf(e, sizeof e, "\\u%04x", c);
            else {
                e[0] = (char)c;
                e[1] = 0;
            }
            sb_add(x, b, e, strlen(e), NULL, flag);
        }
        sb_c(x, b, "\"");
        break;
    case V_LIST:
    case V_DICT: {
        int is_list = v->t == V_LIST;
        size_t n = is_list ? v->l->n : v->d->n;
        sb_c(x, b, is_list ? "[" : "{");
        for (size_t i = 0; i < n; i++) {
            if (i) sb_c(x, b, indent >= 0 ? "," : ", ");
            if (indent >= 0) {
                sb_c(x, b, "\n");
                for (int k = 0; k < indent * (level + 1); k++) sb_c(x, b, " ");
            }
            if (!is_list) {
                jv k = mk_str(v->d->k[i]);
                tojson(r, b, &k, indent, level + 1, pos);
                sb_c(x, b, ": ");
            }
            tojson(r, b, is_list ? &v->l->v[i] : &v->d->v[i], indent, level + 1, pos);
        }
        if (indent >= 0 && n) {
            sb_c(x, b, "\n");
            for (int k = 0; k < indent * level; k++) sb_c(x, b, " ");
        }
        sb_c(x, b, is_list ? "]" : "}");
        break;
    }
    default: failf(x, pos, "tojson: a %s is not serializable", type_name(v));
    }
}

static jv *lookup(rctx *r, scope *s, const char *name) {
    (void)r;
    for (; s; s = s->parent) {
        jv *v = dict_find(s->vars, name, strlen(name));
        if (v) return v;
    }
    return NULL;
}

static int num(const jv *v) { return v->t == V_INT || v->t == V_FLOAT || v->t == V_BOOL; }
static double as_f(const jv *v) { return v->t == V_FLOAT ? v->f : v->t == V_INT ? (double)v->i : v->b; }
/* A float as an integer, saturated at the int64 range (NaN: 0): C leaves the conversion of an
 * out-of-range float undefined. */
static int64_t f_to_i(double f) {
    if (isnan(f)) return 0;
    if (f >= 9223372036854775808.0) return INT64_MAX;
    if (f < -9223372036854775808.0) return INT64_MIN;
    return (int64_t)f;
}
/* A float that must become an integer exactly (the int filter): outside the range is an error. */
static int64_t f_to_i_checked(jx *x, double f, const char *what, size_t pos) {
    if (isnan(f) || f >= 9223372036854775808.0 || f < -9223372036854775808.0)
        failf(x, pos, "%s: %g is outside the 64-bit integer range", what, f);
    return (int64_t)f;
}
static int64_t as_i(const jv *v) { return v->t == V_INT ? v->i : v->t == V_BOOL ? v->b : f_to_i(v->f); }

static int equal(jx *x, const jv *a, const jv *b) {
    charge(x, 1);
    if (num(a) && num(b)) {
        if (a->t == V_FLOAT || b->t == V_FLOAT) return as_f(a) == as_f(b);
        return as_i(a) == as_i(b);
    }
    if (a->t != b->t) return 0;
    switch (a->t) {
    case V_UNDEF:
    case V_NONE: return 1;
    case V_STR:
        if (a->s->n == b->s->n) charge(x, a->s->n);
        return str_eq(a->s, b->s->p, b->s->n);
    case V_LIST:
        if (a->l->n != b->l->n) return 0;
        for (size_t i = 0; i < a->l->n; i++)
            if (!equal(x, &a->l->v[i], &b->l->v[i])) return 0;
        return 1;
    case V_DICT:
        if (a->d->n != b->d->n) return 0;
        for (size_t i = 0; i < a->d->n; i++) {
            jv *o = dict_find(b->d, a->d->k[i]->p, a->d->k[i]->n);
            if (!o || !equal(x, &a->d->v[i], o)) return 0;
        }
        return 1;
    case V_MACRO: return a->m == b->m;
    case V_FUNC: return a->fn == b->fn;
    default: return 0;
    }
}

static int compare(rctx *r, const jv *a, const jv *b, size_t pos) {
    if (num(a) && num(b)) {
        double x = as_f(a), y = as_f(b);
        return x < y ? -1 : x > y;
    }
    if (a->t == V_STR && b->t == V_STR) {
        size_t n = a->s->n < b->s->n ? a->s->n : b->s->n;
        charge(r->x, n + 1);
        int c = memcmp(a->s->p, b->s->p, n);
        if (c) return c < 0 ? -1 : 1;
        return a->s->n < b->s->n ? -1 : a->s->n > b->s->n;
    }
    failf(r->x, pos, "cannot compare a %s with a %s", type_name(a), type_name(b));
}

static int contains(rctx *r, const jv *hay, const jv *needle, size_t pos) {
    if (hay->t == V_STR) {
        if (needle->t != V_STR) failf(r->x, pos, "'in <string>' needs a string, got a %s", type_name(needle));
        const jstr *h = hay->s, *n = needle->s;
        if (n->n == 0) return 1;
        for (size_t i = 0; i + n->n <= h->n; i++) {
            charge(r->x, n->n); /* at most this many bytes compared at each place */
            if (memcmp(h->p + i, n->p, n->n) == 0) return 1;
        }
        return 0;
    }
    if (hay->t == V_LIST) {
        for (size_t i = 0; i < hay->l->n; i++)
            if (equal(r->x, &hay->l->v[i], needle)) return 1;
        return 0;
    }
    if (hay->t == V_DICT) return needle->t == V_STR && dict_find(hay->d, needle->s->p, needle->s->n) != NULL;
    failf(r->x, pos, "'in' needs a string, list or dict on its right, got a %s", type_name(hay));
}

static jv eval(rctx *r, scope *s, const node *n);

/* Items to iterate: a list's elements, a dict's keys, a string's characters. */
static jlist *iter_items(rctx *r, const jv *v, size_t pos) {
    jx *x = r->x;
    if (v->t == V_LIST) return v->l;
    jlist *l = list_new(x);
    if (v->t == V_DICT) {
        for (size_t i = 0; i < v->d->n; i++) list_push(x, l, mk_str(v->d->k[i]));
    } else if (v->t == V_STR) {
        for (size_t i = 0; i < v->s->n;) {
            size_t k = i + 1;
            while (k < v->s->n && ((unsigned char)v->s->p[k] & 0xC0) == 0x80) k++;
            list_push(x, l, mk_str(str_sub(x, v->s, i, k)));
            i = k;
        }
    } else if (v->t != V_UNDEF && v->t != V_NONE) {
        failf(x, pos, "a %s is not iterable", type_name(v));
    } else if (v->t == V_NONE) {
        failf(x, pos, "none is not iterable");
    }
    return l;
}

static jv get_item(rctx *r, const jv *obj, const jv *key, size_t pos) {
    if (obj->t == V_DICT) {
        if (key->t != V_STR) return UNDEF;
        jv *v = dict_find(obj->d, key->s->p, key->s->n);
        return v ? *v : UNDEF;
    }
    if ((obj->t == V_LIST || obj->t == V_STR) && (key->t == V_INT || key->t == V_BOOL)) {
        int64_t n = obj->t == V_LIST ? (int64_t)obj->l->n : (int64_t)obj->s->n, i = as_i(key);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return UNDEF;
        if (obj->t == V_LIST) return obj->l->v[i];
        return mk_str(str_sub(r->x, obj->s, (size_t)i, (size_t)i + 1));
    }
    if (obj->t == V_UNDEF) failf(r->x, pos, "subscript of an undefined value");
    return UNDEF;
}

static int64_t clamp_index(int64_t i, int64_t n, int64_t step, int is_start) {
    if (i < 0) i += n;
    if (step > 0) return i < 0 ? 0 : i > n ? n : i;
    (void)is_start;
    return i < -1 ? -1 : i > n - 1 ? n - 1 : i;
}

static jv slice(rctx *r, const jv *obj, const jv *a, const jv *b, const jv *c, size_t pos) {
    jx *x = r->x;
    if (obj->t != V_LIST && obj->t != V_STR) failf(x, pos, "cannot slice a %s", type_name(obj));
    int64_t n = obj->t == V_LIST ? (int64_t)obj->l->n : (int64_t)obj->s->n;
    int64_t step = c->t == V_UNDEF || c->t == V_NONE ? 1 : as_i(c);
    if (step == 0) failf(x, pos, "slice step cannot be zero");
    int64_t lo, hi;
    if (a->t == V_UNDEF || a->t == V_NONE) lo = step > 0 ? 0 : n - 1;
    else lo = clamp_index(as_i(a), n, step, 1);
    if (b->t == V_UNDEF || b->t == V_NONE) hi = step > 0 ? n : -1;
    else hi = clamp_index(as_i(b), n, step, 0);
    /* lo and hi lie in [-1, n]: the count, then lo + k * step, never past them (no overflow) */
    uint64_t count = 0;
    if (step > 0 && lo < hi) count = ((uint64_t)hi - (uint64_t)lo - 1) / (uint64_t)step + 1;
    if (step < 0 && lo > hi) count = ((uint64_t)lo - (uint64_t)hi - 1) / (0 - (uint64_t)step) + 1;
    if (obj->t == V_LIST) {
        jlist *l = list_new(x);
        for (uint64_t k = 0; k < count; k++) list_push(x, l, obj->l->v[(int64_t)((uint64_t)lo + k * (uint64_t)step)]);
        return (jv){.t = V_LIST, .l = l};
    }
    sbuf sb = {0};
    for (uint64_t k = 0; k < count; k++) {
        int64_t i = (int64_t)((uint64_t)lo + k * (uint64_t)step);
        sb_add(x, &sb, obj->s->p + i, 1, obj->s->u ? obj->s->u + i : NULL, 0);
    }
    return mk_str(sb_done(x, &sb));
}

/* evaluated call arguments */
typedef struct args {
    int n, nkw;
    jv v[16];
    const char *kwn[16];
    jv kwv[16];
} args;

static void eval_args(rctx *r, scope *s, const node *call, args *a, int first) {
    a->n = first;
    a->nkw = 0;
    if (call->kids.n + first > 16 || call->kids2.n > 16) failf(r->x, call->pos, "too many arguments");
    for (int i = 0; i < call->kids.n; i++) a->v[a->n++] = eval(r, s, call->kids.v[i]);
    for (int i = 0; i < call->kids2.n; i++) {
        a->kwn[a->nkw] = call->kids2.v[i]->name;
        a->kwv[a->nkw++] = eval(r, s, call->kids2.v[i]->a);
    }
}
static jv arg(const args *a, int i, const char *kw) {
    if (i >= 0 && i < a->n) return a->v[i];
    for (int k = 0; kw && k < a->nkw; k++)
        if (strcmp(a->kwn[k], kw) == 0) return a->kwv[k];
    return UNDEF;
}
static const jstr *arg_str(rctx *r, const args *a, int i, const char *kw, const char *what, size_t pos) {
    jv v = arg(a, i, kw);
    if (v.t != V_STR) failf(r->x, pos, "%s: argument %d must be a string, got a %s", what, i, type_name(&v));
    return v.s;
}

static int is_space_c(char c, const jstr *chars) {
    if (!chars) return is_ws(c);
    return memchr(chars->p, c, chars->n) != NULL;
}
static jv strip(rctx *r, const jstr *s, const jstr *chars, int left, int right) {
    size_t a = 0, b = s->n;
    if (left)
        while (a < b && is_space_c(s->p[a], chars)) a++;
    if (right)
        while (b > a && is_space_c(s->p[b - 1], chars)) b--;
    return mk_str(str_sub(r->x, s, a, b));
}

static jv str_case(rctx *r, const jstr *s, int mode) { /* 0 lower, 1 upper, 2 title, 3 capitalize */
    jstr *d = str_new(r->x, s->p, s->n, s->u);
    char *p = (char *)d->p;
    int prev_alpha = 0;
    for (size_t i = 0; i < d->n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (mode == 0) p[i] = (char)tolower(c);
        else if (mode == 1) p[i] = (char)toupper(c);
        else if (mode == 2) {
            p[i] = (char)(prev_alpha ? tolower(c) : toupper(c));
            prev_alpha = isalpha(c) || c >= 0x80;
        } else {
            p[i] = (char)(i == 0 ? toupper(c) : tolower(c));
        }
    }
    return mk_str(d);
}

static jv str_replace(rctx *r, const jstr *s, const jstr *old, const jstr *rep, int64_t count) {
    jx *x = r->x;
    sbuf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (old->n == 0) {
        for (; i <= s->n && (count < 0 || done < count); i++, done++) {
            sb_str(x, &b, rep);
            if (i < s->n) sb_add(x, &b, s->p + i, 1, s->u ? s->u + i : NULL, 0);
        }
        if (i < s->n) sb_add(x, &b, s->p + i, s->n - i, s->u ? s->u + i : NULL, 0);
        return mk_str(sb_done(x, &b));
    }
    while (i < s->n) {
        charge(x, old->n);
        if ((count < 0 || done < count) && i + old->n <= s->n && memcmp(s->p + i, old->p, old->n) == 0) {
            sb_str(x, &b, rep);
            i += old->n;
            done++;
        } else {
            sb_add(x, &b, s->p + i, 1, s->u ? s->u + i : NULL, 0);
            i++;
        }
    }
    return mk_str(sb_done(x, &b));
}

static jv str_split(rctx *r, const jstr *s, const jstr *sep, int64_t maxsplit, size_t pos) {
    jx *x = r->x;
    jlist *l = list_new(x);
    if (!sep) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            while (i < s->n && is_ws(s->p[i])) i++;
            if (i >= s->n) break;
            size_t k = i;
            if (maxsplit >= 0 && done >= maxsplit) k = s->n;
            else
                while (k < s->n && !is_ws(s->p[k])) k++;
            size_t e = k;
            if (k == s->n)
                while (e > i && is_ws(s->p[e - 1])) e--;
            list_push(x, l, mk_str(str_sub(x, s, i, e)));
            done++;
            i = k;
        }
        return (jv){.t = V_LIST, .l = l};
    }
    if (sep->n == 0) failf(x, pos, "split: empty separator");
    size_t start = 0, i = 0;
    int64_t done = 0;
    while (i + sep->n <= s->n) {
        charge(x, sep->n);
        if ((maxsplit < 0 || done < maxsplit) && memcmp(s->p + i, sep->p, sep->n) == 0) {
            list_push(x, l, mk_str(str_sub(x, s, start, i)));
            i += sep->n;
            start = i;
            done++;
        } else {
            i++;
        }
    }
    list_push(x, l, mk_str(str_sub(x, s, start, s->n)));
    return (jv){.t = V_LIST, .l = l};
}

static int affix(const jstr *s, const jv *p, int end) {
    if (p->t == V_LIST) {
        for (size_t i = 0; i < p->l->n; i++)
            if (affix(s, &p->l->v[i], end)) return 1;
        return 0;
    }
    if (p->t != V_STR || p->s->n > s->n) return 0;
    return memcmp(s->p + (end ? s->n - p->s->n : 0), p->s->p, p->s->n) == 0;
}

static jv call_macro(rctx *r, const node *m, const args *a, size_t pos);

static jv method(rctx *r, const jv *obj, const char *name, const args *a, size_t pos) {
    jx *x = r->x;
    if (obj->t == V_STR) {
        const jstr *s = obj->s;
        jv c0 = arg(a, 0, NULL);
        const jstr *chars = c0.t == V_STR ? c0.s : NULL;
        if (!strcmp(name, "strip")) return strip(r, s, chars, 1, 1);
        if (!strcmp(name, "lstrip")) return strip(r, s, chars, 1, 0);
        if (!strcmp(name, "rstrip")) return strip(r, s, chars, 0, 1);
        if (!strcmp(name, "lower")) return str_case(r, s, 0);
        if (!strcmp(name, "upper")) return str_case(r, s, 1);
        if (!strcmp(name, "title")) return str_case(r, s, 2);
        if (!strcmp(name, "capitalize")) return str_case(r, s, 3);
        if (!strcmp(name, "startswith")) return mk_bool(affix(s, &c0, 0));
        if (!strcmp(name, "endswith")) return mk_bool(affix(s, &c0, 1));
        if (!strcmp(name, "split")) {
            jv m = arg(a, 1, "maxsplit");
            return str_split(r, s, chars, m.t == V_INT ? m.i : -1, pos);
        }
        if (!strcmp(name, "replace")) {
            jv cnt = arg(a, 2, "count");
            return str_replace(r, s, arg_str(r, a, 0, NULL, "replace", pos), arg_str(r, a, 1, NULL, "replace", pos),
                               cnt.t == V_INT ? cnt.i : -1);
        }
        if (!strcmp(name, "find")) {
            const jstr *n = arg_str(r, a, 0, NULL, "find", pos);
            for (size_t i = 0; i + n->n <= s->n; i++) {
                charge(x, n->n + 1);
                if (memcmp(s->p + i, n->p, n->n) == 0) return mk_int((int64_t)i);
            }
            return mk_int(-1);
        }
        if (!strcmp(name, "count")) {
            const jstr *n = arg_str(r, a, 0, NULL, "count", pos);
            int64_t k = 0;
            if (!n->n) return mk_int((int64_t)s->n + 1);
            for (size_t i = 0; i + n->n <= s->n;)
                if (charge(x, n->n), memcmp(s->p + i, n->p, n->n) == 0) {
                    k++;
                    i += n->n;
                } else {
                    i++;
                }
            return mk_int(k);
        }
    } else if (obj->t == V_DICT) {
        if (!strcmp(name, "items") || !strcmp(name, "keys") || !strcmp(name, "values")) {
            jlist *l = list_new(x);
            for (size_t i = 0; i < obj->d->n; i++) {
                jv k = mk_str(obj->d->k[i]);
                if (name[0] == 'i') {
                    jlist *pair = list_new(x);
                    pair->tuple = 1;
                    list_push(x, pair, k);
                    list_push(x, pair, obj->d->v[i]);
                    list_push(x, l, (jv){.t = V_LIST, .l = pair});
                } else {
                    list_push(x, l, name[0] == 'k' ? k : obj->d->v[i]);
                }
            }
            return (jv){.t = V_LIST, .l = l};
        }
        if (!strcmp(name, "get")) {
            jv k = arg(a, 0, NULL);
            jv v = get_item(r, obj, &k, pos);
            if (v.t == V_UNDEF) {
                jv d = arg(a, 1, "default");
                return d.t == V_UNDEF ? NONE : d;
            }
            return v;
        }
        jv *f = dict_find(obj->d, name, strlen(name));
        if (f && f->t == V_MACRO) return call_macro(r, f->m, a, pos);
    }
    failf(x, pos, "a %s has no method '%s'", type_name(obj), name);
}

static jv attr(rctx *r, const jv *obj, const char *name, size_t pos) {
    if (obj->t == V_DICT) {
        jv *v = dict_find(obj->d, name, strlen(name));
        return v ? *v : UNDEF;
    }
    if (obj->t == V_UNDEF) failf(r->x, pos, "'%s' of an undefined value", name);
    if (obj->t == V_NONE) failf(r->x, pos, "'%s' of none", name);
    return UNDEF;
}

static int run_test(rctx *r, const char *name, const jv *v, const args *a, size_t pos) {
    jv o = arg(a, 0, NULL);
    if (!strcmp(name, "defined")) return v->t != V_UNDEF;
    if (!strcmp(name, "undefined")) return v->t == V_UNDEF;
    if (!strcmp(name, "none")) return v->t == V_NONE;
    if (!strcmp(name, "string")) return v->t == V_STR;
    if (!strcmp(name, "number")) return v->t == V_INT || v->t == V_FLOAT;
    if (!strcmp(name, "integer")) return v->t == V_INT;
    if (!strcmp(name, "float")) return v->t == V_FLOAT;
    if (!strcmp(name, "boolean")) return v->t == V_BOOL;
    if (!strcmp(name, "true")) return v->t == V_BOOL && v->b;
    if (!strcmp(name, "false")) return v->t == V_BOOL && !v->b;
    if (!strcmp(name, "mapping")) return v->t == V_DICT;
    if (!strcmp(name, "sequence")) return v->t == V_LIST || v->t == V_STR || v->t == V_DICT;
    if (!strcmp(name, "iterable")) return v->t == V_LIST || v->t == V_STR || v->t == V_DICT;
    if (!strcmp(name, "callable")) return v->t == V_MACRO || v->t == V_FUNC;
    if (!strcmp(name, "even") || !strcmp(name, "odd")) {
        if (v->t != V_INT) failf(r->x, pos, "test '%s' needs an integer, got a %s", name, type_name(v));
        return (v->i % 2 == 0) == (name[0] == 'e');
    }
    if (!strcmp(name, "divisibleby")) {
        if (!num(v) || !num(&o) || as_i(&o) == 0) failf(r->x, pos, "test 'divisibleby' needs non-zero integers");
        int64_t d = as_i(&o);
        return d == -1 || as_i(v) % d == 0; /* INT64_MIN % -1 overflows in C */
    }
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) return equal(r->x, v, &o);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !equal(r->x, v, &o);
    if (!strcmp(name, "sameas")) return equal(r->x, v, &o) && v->t == o.t;
    if (!strcmp(name, "in")) return contains(r, &o, v, pos);
    if (!strcmp(name, "lt") || !strcmp(name, "<")) return compare(r, v, &o, pos) < 0;
    if (!strcmp(name, "le") || !strcmp(name, "<=")) return compare(r, v, &o, pos) <= 0;
    if (!strcmp(name, "gt") || !strcmp(name, ">")) return compare(r, v, &o, pos) > 0;
    if (!strcmp(name, "ge") || !strcmp(name, ">=")) return compare(r, v, &o, pos) >= 0;
    if (!strcmp(name, "lower")) return v->t == V_STR && str_eq(str_case(r, v->s, 0).s, v->s->p, v->s->n);
    if (!strcmp(name, "upper")) return v->t == V_STR && str_eq(str_case(r, v->s, 1).s, v->s->p, v->s->n);
    failf(r->x, pos, "unknown test '%s'", name);
}

static jv join(rctx *r, const jlist *l, const jstr *sep, const char *attribute, size_t pos) {
    sbuf b = {0};
    for (size_t i = 0; i < l->n; i++) {
        if (i && sep) sb_str(r->x, &b, sep);
        jv v = attribute ? attr(r, &l->v[i], attribute, pos) : l->v[i];
        sb_str(r->x, &b, to_str(r, &v));
    }
    return mk_str(sb_done(r->x, &b));
}

static int64_t length(rctx *r, const jv *v, size_t pos) {
    if (v->t == V_STR) {
        int64_t k = 0;
        for (size_t i = 0; i < v->s->n; i++) k += ((unsigned char)v->s->p[i] & 0xC0) != 0x80;
        return k;
    }
    if (v->t == V_LIST) return (int64_t)v->l->n;
    if (v->t == V_DICT) return (int64_t)v->d->n;
    if (v->t == V_UNDEF) return 0;
    failf(r->x, pos, "a %s has no length", type_name(v));
}

static jv filter(rctx *r, const char *name, const jv *v, const args *a, size_t pos) {
    jx *x = r->x;
    if (!strcmp(name, "trim")) {
        if (v->t != V_STR) return strip(r, to_str(r, v), NULL, 1, 1);
        jv c = arg(a, 0, "chars");
        return strip(r, v->s, c.t == V_STR ? c.s : NULL, 1, 1);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) return mk_int(length(r, v, pos));
    if (!strcmp(name, "string")) return mk_str(to_str(r, v));
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") || !strcmp(name, "capitalize")) {
        int mode = name[0] == 'l' ? 0 : name[0] == 'u' ? 1 : name[0] == 't' ? 2 : 3;
        return str_case(r, to_str(r, v), mode);
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        jv b = arg(a, 1, "boolean");
        if (v->t == V_UNDEF || (truthy(&b) && !truthy(v))) {
            jv d = arg(a, 0, "default_value");
            return d.t == V_UNDEF ? mk_str(str_c(x, "")) : d;
        }
        return *v;
    }
    if (!strcmp(name, "tojson")) {
        jv ind = arg(a, 0, "indent");
        sbuf b = {0};
        tojson(r, &b, v, ind.t == V_INT ? (int)ind.i : -1, 0, pos);
        return mk_str(sb_done(x, &b));
    }
    if (!strcmp(name, "join")) {
        jv sep = arg(a, 0, "d");
        jv at = arg(a, 1, "attribute");
        if (sep.t != V_STR && sep.t != V_UNDEF) failf(x, pos, "join: separator must be a string");
        const char *atn = at.t == V_STR ? cstr(x, at.s->p, at.s->n) : NULL;
        return join(r, iter_items(r, v, pos), sep.t == V_STR ? sep.s : NULL, atn, pos);
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        jlist *l = iter_items(r, v, pos);
        if (!l->n) return UNDEF;
        return name[0] == 'f' ? l->v[0] : l->v[l->n - 1];
    }
    if (!strcmp(name, "list")) return (jv){.t = V_LIST, .l = iter_items(r, v, pos)};
    if (!strcmp(name, "reverse")) {
        jv none = UNDEF, step = mk_int(-1);
        if (v->t == V_DICT) {
            jv l = {.t = V_LIST, .l = iter_items(r, v, pos)};
            return slice(r, &l, &none, &none, &step, pos);
        }
        return slice(r, v, &none, &none, &step, pos);
    }
    if (!strcmp(name, "replace")) {
        jv cnt = arg(a, 2, "count");
        return str_replace(r, to_str(r, v), arg_str(r, a, 0, "old", "replace", pos),
                           arg_str(r, a, 1, "new", "replace", pos), cnt.t == V_INT ? cnt.i : -1);
    }
    if (!strcmp(name, "int")) {
        if (v->t == V_INT) return *v;
        if (v->t == V_FLOAT) return mk_int(f_to_i_checked(x, v->f, "int", pos));
        if (num(v)) return mk_int(as_i(v));
        if (v->t == V_STR) {
            char buf[64];
            size_t n = v->s->n < sizeof buf - 1 ? v->s->n : sizeof buf - 1;
            memcpy(buf, v->s->p, n);
            buf[n] = 0;
            char *end;
            double f = strtod(buf, &end);
            while (*end && is_ws(*end)) end++;
            if (end != buf && !*end) return mk_int(f_to_i_checked(x, f, "int", pos));
        }
        jv d = arg(a, 0, "default");
        return d.t == V_UNDEF ? mk_int(0) : d;
    }
    if (!strcmp(name, "float")) {
        if (num(v)) return mk_float(as_f(v));
        if (v->t == V_STR) {
            char buf[64];
            size_t n = v->s->n < sizeof buf - 1 ? v->s->n : sizeof buf - 1;
            memcpy(buf, v->s->p, n);
            buf[n] = 0;
            char *end;
            double f = strtod(buf, &end);
            if (end != buf) return mk_float(f);
        }
        return mk_float(0);
    }
    if (!strcmp(name, "abs")) {
        if (v->t == V_INT) return mk_int(v->i < 0 ? (int64_t)(0 - (uint64_t)v->i) : v->i); /* abs(min) wraps */
        if (num(v)) return mk_float(fabs(as_f(v)));
        failf(x, pos, "abs: a %s is not a number", type_name(v));
    }
    if (!strcmp(name, "items")) {
        if (v->t == V_UNDEF) return (jv){.t = V_LIST, .l = list_new(x)};
        if (v->t != V_DICT) failf(x, pos, "items: a %s is not a dict", type_name(v));
        return method(r, v, "items", a, pos);
    }
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr") || !strcmp(name, "select") ||
        !strcmp(name, "reject")) {
        int on_attr = strstr(name, "attr") != NULL, keep = name[0] == 's';
        jlist *in = iter_items(r, v, pos), *outl = list_new(x);
        int base = on_attr ? 1 : 0;
        jv tn = arg(a, base, NULL);
        if (on_attr && arg(a, 0, NULL).t != V_STR) failf(x, pos, "%s: the attribute must be a string", name);
        if (tn.t != V_UNDEF && tn.t != V_STR) failf(x, pos, "%s: the test name must be a string", name);
        const char *tname = tn.t == V_STR ? cstr(x, tn.s->p, tn.s->n) : NULL;
        args ta = {0};
        for (int i = base + 1; i < a->n && ta.n < 16; i++) ta.v[ta.n++] = a->v[i];
        const char *an = on_attr ? cstr(x, a->v[0].s->p, a->v[0].s->n) : NULL;
        for (size_t i = 0; i < in->n; i++) {
            jv e = on_attr ? attr(r, &in->v[i], an, pos) : in->v[i];
            int ok = tname ? run_test(r, tname, &e, &ta, pos) : truthy(&e);
            if (ok == keep) list_push(x, outl, in->v[i]);
        }
        return (jv){.t = V_LIST, .l = outl};
    }
    if (!strcmp(name, "map")) {
        jv at = arg(a, -1, "attribute");
        jlist *in = iter_items(r, v, pos), *outl = list_new(x);
        if (at.t == V_STR) {
            const char *an = cstr(x, at.s->p, at.s->n);
            jv d = arg(a, -1, "default");
            for (size_t i = 0; i < in->n; i++) {
                jv e = attr(r, &in->v[i], an, pos);
                list_push(x, outl, e.t == V_UNDEF && d.t != V_UNDEF ? d : e);
            }
            return (jv){.t = V_LIST, .l = outl};
        }
        jv fn = arg(a, 0, NULL);
        if (fn.t != V_STR) failf(x, pos, "map: give a filter name or attribute=");
        const char *fname = cstr(x, fn.s->p, fn.s->n);
        args fa = {0};
        for (int i = 1; i < a->n && fa.n < 16; i++) fa.v[fa.n++] = a->v[i];
        for (size_t i = 0; i < in->n; i++) list_push(x, outl, filter(r, fname, &in->v[i], &fa, pos));
        return (jv){.t = V_LIST, .l = outl};
    }
    if (!strcmp(name, "dictsort")) {
        if (v->t != V_DICT) failf(x, pos, "dictsort: a %s is not a dict", type_name(v));
        jv items = method(r, v, "items", a, pos);
        jlist *l = items.l;
        for (size_t i = 1; i < l->n; i++) /* insertion sort by key: dicts in templates are small */
            for (size_t k = i; k > 0 && compare(r, &l->v[k - 1].l->v[0], &l->v[k].l->v[0], pos) > 0; k--) {
                jv t = l->v[k];
                l->v[k] = l->v[k - 1];
                l->v[k - 1] = t;
            }
        return items;
    }
    if (!strcmp(name, "indent")) {
        jv w = arg(a, 0, "width");
        jv f = arg(a, 1, "first");
        int64_t width = w.t == V_INT ? w.i : 4;
        const jstr *s = to_str(r, v);
        sbuf b = {0};
        char pad[64];
        int np = width < 0 ? 0 : width > 63 ? 63 : (int)width;
        memset(pad, ' ', (size_t)np);
        if (truthy(&f)) sb_add(x, &b, pad, (size_t)np, NULL, 0);
        for (size_t i = 0; i < s->n; i++) {
            sb_add(x, &b, s->p + i, 1, s->u ? s->u + i : NULL, 0);
            if (s->p[i] == '\n' && i + 1 < s->n && s->p[i + 1] != '\n') sb_add(x, &b, pad, (size_t)np, NULL, 0);
        }
        return mk_str(sb_done(x, &b));
    }
    failf(x, pos, "unknown filter '%s'", name);
}

static jv call_func(rctx *r, int fn, const args *a, size_t pos) {
    jx *x = r->x;
    switch (fn) {
    case F_RANGE: {
        jv a0 = arg(a, 0, NULL), a1 = arg(a, 1, NULL), a2 = arg(a, 2, NULL);
        if (!num(&a0) || (a1.t != V_UNDEF && !num(&a1)) || (a2.t != V_UNDEF && !num(&a2)))
            failf(x, pos, "range: arguments must be integers");
        int64_t lo = a1.t == V_UNDEF ? 0 : as_i(&a0), hi = a1.t == V_UNDEF ? as_i(&a0) : as_i(&a1);
        int64_t step = a2.t == V_UNDEF ? 1 : as_i(&a2);
        if (step == 0) failf(x, pos, "range: step cannot be zero");
        /* the count first (in uint64: no step overflows), then one array of that size */
        uint64_t count = 0;
        if (step > 0 && lo < hi) count = ((uint64_t)hi - (uint64_t)lo - 1) / (uint64_t)step + 1;
        if (step < 0 && lo > hi) count = ((uint64_t)lo - (uint64_t)hi - 1) / (0 - (uint64_t)step) + 1;
        if (count > MAX_ITERATIONS) failf(x, pos, "range: more than %d items", MAX_ITERATIONS);
        jlist *l = list_new(x);
        if (count) {
            l->v = alloc(x, (size_t)count * sizeof *l->v);
            l->cap = (size_t)count;
        }
        for (uint64_t k = 0; k < count; k++)
            l->v[l->n++] = mk_int((int64_t)((uint64_t)lo + k * (uint64_t)step));
        return (jv){.t = V_LIST, .l = l};
    }
    case F_NAMESPACE:
    case F_DICT: {
        jdict *d = dict_new(x);
        d->ns = fn == F_NAMESPACE;
        jv init = arg(a, 0, NULL);
        if (init.t == V_DICT)
            for (size_t i = 0; i < init.d->n; i++) dict_set(x, d, init.d->k[i], init.d->v[i]);
        for (int i = 0; i < a->nkw; i++) dict_setc(x, d, a->kwn[i], a->kwv[i]);
        return (jv){.t = V_DICT, .d = d};
    }
    case F_RAISE: {
        jv m = arg(a, 0, NULL);
        const jstr *s = to_str(r, &m);
        failf(x, pos, "raise_exception: %.*s", (int)s->n, s->p);
    }
    case F_STRFTIME: {
        jv f = arg(a, 0, NULL);
        if (f.t != V_STR) failf(x, pos, "strftime_now: the format must be a string");
        char fmtc[256], buf[512];
        size_t n = f.s->n < sizeof fmtc - 1 ? f.s->n : sizeof fmtc - 1;
        memcpy(fmtc, f.s->p, n);
        fmtc[n] = 0;
        time_t now = time(NULL);
        struct tm tmv, *tp = localtime(&now);
        if (tp) tmv = *tp;
        else memset(&tmv, 0, sizeof tmv);
        size_t k = strftime(buf, sizeof buf, fmtc, &tmv);
        return mk_str(str_new(x, buf, k, NULL));
    }
    default: failf(x, pos, "not callable");
    }
}

static void exec_body(rctx *r, scope *s, const nlist *body);

static jv call_macro(rctx *r, const node *m, const args *a, size_t pos) {
    jx *x = r->x;
    if (++r->calls > MAX_CALLS) failf(x, pos, "macro calls nested more than %d deep", MAX_CALLS);
    scope sc = {.parent = r->globals, .vars = dict_new(x)};
    if (a->n > m->kids2.n) failf(x, pos, "macro '%s' takes %d arguments, got %d", m->name, m->kids2.n, a->n);
    for (int i = 0; i < m->kids2.n; i++) {
        const node *pm = m->kids2.v[i];
        jv v = arg(a, i, pm->name);
        if (v.t == V_UNDEF && pm->a) v = eval(r, &sc, pm->a);
        dict_setc(x, sc.vars, pm->name, v);
    }
    for (int k = 0; k < a->nkw; k++) {
        int found = 0;
        for (int i = 0; i < m->kids2.n; i++) found |= strcmp(m->kids2.v[i]->name, a->kwn[k]) == 0;
        if (!found) failf(x, pos, "macro '%s' has no argument '%s'", m->name, a->kwn[k]);
    }
    /* the macro renders into its own buffer: its text is its value */
    sbuf saved = r->out;
    r->out = (sbuf){0};
    exec_body(r, &sc, &m->kids);
    sbuf got = r->out;
    r->out = saved;
    jstr *s = sb_done(x, &got);
    r->calls--;
    return mk_str(s);
}

static jv arith(rctx *r, const char *op, const jv *a, const jv *b, size_t pos) {
    jx *x = r->x;
    if (op[0] == '~') {
        const jstr *sa = to_str(r, a);
        return mk_str(str_cat(x, sa, to_str(r, b)));
    }
    if (op[0] == '+' && a->t == V_STR && b->t == V_STR) return mk_str(str_cat(x, a->s, b->s));
    if (op[0] == '+' && a->t == V_LIST && b->t == V_LIST) {
        jlist *l = list_new(x);
        charge(x, (a->l->n + b->l->n) * sizeof(jv));
        for (size_t i = 0; i < a->l->n; i++) list_push(x, l, a->l->v[i]);
        for (size_t i = 0; i < b->l->n; i++) list_push(x, l, b->l->v[i]);
        return (jv){.t = V_LIST, .l = l};
    }
    if (op[0] == '*' && op[1] == 0 && ((a->t == V_STR && b->t == V_INT) || (a->t == V_INT && b->t == V_STR))) {
        const jstr *s = a->t == V_STR ? a->s : b->s;
        int64_t k = a->t == V_INT ? a->i : b->i;
        if (k > 0 && (uint64_t)k * s->n > MAX_OUTPUT) failf(x, pos, "string repeated past %d bytes", MAX_OUTPUT);
        sbuf sb = {0};
        if (s->n == 0) k = 0; /* nothing to repeat: no loop of k empty steps */
        for (int64_t i = 0; i < k; i++) sb_str(x, &sb, s);
        return mk_str(sb_done(x, &sb));
    }
    if (!num(a) || !num(b))
        failf(x, pos, "operator '%s' on a %s and a %s", op, type_name(a), type_name(b));
    int fl = a->t == V_FLOAT || b->t == V_FLOAT;
    double fa = as_f(a), fb = as_f(b);
    int64_t ia = as_i(a), ib = as_i(b);
    switch (op[0]) {
    case '+': return fl ? mk_float(fa + fb) : mk_int((int64_t)((uint64_t)ia + (uint64_t)ib));
    case '-': return fl ? mk_float(fa - fb) : mk_int((int64_t)((uint64_t)ia - (uint64_t)ib));
    case '*':
        if (op[1] == '*') {
            if (fl || ib < 0) return mk_float(pow(fa, fb));
            int64_t p = 1;
            for (int64_t i = 0; i < ib && i < 64; i++) p = (int64_t)((uint64_t)p * (uint64_t)ia);
            return mk_int(p);
        }
        return fl ? mk_float(fa * fb) : mk_int((int64_t)((uint64_t)ia * (uint64_t)ib));
    case '/':
        if (fb == 0) failf(x, pos, "division by zero");
        if (op[1] == '/') {
            if (fl) return mk_float(floor(fa / fb));
            if (ia == INT64_MIN && ib == -1) failf(x, pos, "integer overflow");
            int64_t q = ia / ib;
            if ((ia % ib != 0) && ((ia < 0) != (ib < 0))) q--;
            return mk_int(q);
        }
        return mk_float(fa / fb);
    case '%':
        if (fb == 0) failf(x, pos, "modulo by zero");
        if (fl) {
            double m = fmod(fa, fb);
            if (m != 0 && ((m < 0) != (fb < 0))) m += fb;
            return mk_float(m);
        }
        if (ib == -1) return mk_int(0);
        {
            int64_t m = ia % ib;
            if (m != 0 && ((m < 0) != (ib < 0))) m += ib;
            return mk_int(m);
        }
    default: failf(x, pos, "unknown operator '%s'", op);
    }
}

static jv eval(rctx *r, scope *s, const node *n) {
    jx *x = r->x;
    if (++r->depth > MAX_DEPTH) failf(x, n->pos, "evaluation nested more than %d deep", MAX_DEPTH);
    x->at = n->pos;
    jv v = UNDEF;
    switch (n->kind) {
    case N_LIT: v = n->lit; break;
    case N_NAME: {
        jv *f = lookup(r, s, n->name);
        v = f ? *f : UNDEF;
        break;
    }
    case N_ATTR: {
        jv o = eval(r, s, n->a);
        v = attr(r, &o, n->name, n->pos);
        break;
    }
    case N_ITEM: {
        jv o = eval(r, s, n->a), k = eval(r, s, n->b);
        v = get_item(r, &o, &k, n->pos);
        break;
    }
    case N_SLICE: {
        jv o = eval(r, s, n->a);
        jv a = n->b ? eval(r, s, n->b) : UNDEF, b = n->c ? eval(r, s, n->c) : UNDEF;
        jv c = n->kids.v[0] ? eval(r, s, n->kids.v[0]) : UNDEF;
        v = slice(r, &o, &a, &b, &c, n->pos);
        break;
    }
    case N_CALL: {
        args a;
        if (n->a->kind == N_ATTR) {
            jv o = eval(r, s, n->a->a);
            if (!(o.t == V_DICT && dict_find(o.d, n->a->name, strlen(n->a->name)) &&
                  dict_find(o.d, n->a->name, strlen(n->a->name))->t != V_MACRO)) {
                eval_args(r, s, n, &a, 0);
                v = method(r, &o, n->a->name, &a, n->pos);
                break;
            }
        }
        jv f = eval(r, s, n->a);
        eval_args(r, s, n, &a, 0);
        if (f.t == V_MACRO) v = call_macro(r, f.m, &a, n->pos);
        else if (f.t == V_FUNC) v = call_func(r, f.fn, &a, n->pos);
        else if (n->a->kind == N_NAME) failf(x, n->pos, "'%s' is %s, not callable", n->a->name,
                                             f.t == V_UNDEF ? "undefined" : type_name(&f));
        else failf(x, n->pos, "a %s is not callable", type_name(&f));
        break;
    }
    case N_FILTER: {
        jv o = eval(r, s, n->a);
        args a;
        eval_args(r, s, n, &a, 0);
        v = filter(r, n->name, &o, &a, n->pos);
        break;
    }
    case N_TEST: {
        jv o = eval(r, s, n->a);
        args a;
        eval_args(r, s, n, &a, 0);
        v = mk_bool(run_test(r, n->name, &o, &a, n->pos) != n->neg);
        break;
    }
    case N_NOT: {
        jv o = eval(r, s, n->a);
        v = mk_bool(!truthy(&o));
        break;
    }
    case N_NEG: {
        jv o = eval(r, s, n->a);
        if (o.t == V_INT) v = mk_int((int64_t)(0 - (uint64_t)o.i));
        else if (num(&o)) v = mk_float(-as_f(&o));
        else failf(x, n->pos, "cannot negate a %s", type_name(&o));
        break;
    }
    case N_AND:
    case N_OR: {
        jv a = eval(r, s, n->a);
        int t = truthy(&a);
        v = (n->kind == N_AND ? !t : t) ? a : eval(r, s, n->b);
        break;
    }
    case N_COND: {
        jv c = eval(r, s, n->a);
        v = truthy(&c) ? eval(r, s, n->b) : n->c ? eval(r, s, n->c) : UNDEF;
        break;
    }
    case N_BIN: {
        jv a = eval(r, s, n->a), b = eval(r, s, n->b);
        const char *op = n->name;
        if (!strcmp(op, "==")) v = mk_bool(equal(x, &a, &b));
        else if (!strcmp(op, "!=")) v = mk_bool(!equal(x, &a, &b));
        else if (!strcmp(op, "<")) v = mk_bool(compare(r, &a, &b, n->pos) < 0);
        else if (!strcmp(op, "<=")) v = mk_bool(compare(r, &a, &b, n->pos) <= 0);
        else if (!strcmp(op, ">")) v = mk_bool(compare(r, &a, &b, n->pos) > 0);
        else if (!strcmp(op, ">=")) v = mk_bool(compare(r, &a, &b, n->pos) >= 0);
        else if (!strcmp(op, "in")) v = mk_bool(contains(r, &b, &a, n->pos));
        else if (!strcmp(op, "not in")) v = mk_bool(!contains(r, &b, &a, n->pos));
        else v = arith(r, op, &a, &b, n->pos);
        break;
    }
    case N_LIST: {
        jlist *l = list_new(x);
        for (int i = 0; i < n->kids.n; i++) list_push(x, l, eval(r, s, n->kids.v[i]));
        l->tuple = n->neg;
        v = (jv){.t = V_LIST, .l = l};
        break;
    }
    case N_DICT: {
        jdict *d = dict_new(x);
        for (int i = 0; i < n->kids.n; i++) {
            jv k = eval(r, s, n->kids.v[i]->a);
            if (k.t != V_STR) failf(x, n->kids.v[i]->pos, "dict keys must be strings, got a %s", type_name(&k));
            dict_set(x, d, k.s, eval(r, s, n->kids.v[i]->b));
        }
        v = (jv){.t = V_DICT, .d = d};
        break;
    }
    default: failf(x, n->pos, "not an expression");
    }
    r->depth--;
    return v;
}

static void assign(rctx *r, scope *s, const node *target, jv v) {
    jx *x = r->x;
    if (target->kind == N_NAME) {
        dict_setc(x, s->vars, target->name, v);
    } else if (target->kind == N_ATTR) {
        jv o = eval(r, s, target->a);
        if (o.t != V_DICT || !o.d->ns)
            failf(x, target->pos, "can set attribute '%s' only on a namespace(), not on a %s", target->name,
                  type_name(&o));
        dict_setc(x, o.d, target->name, v);
    } else { /* a, b = ... */
        if (v.t != V_LIST || (int)v.l->n != target->kids.n)
            failf(x, target->pos, "cannot unpack a %s into %d names", type_name(&v), target->kids.n);
        for (int i = 0; i < target->kids.n; i++) assign(r, s, target->kids.v[i], v.l->v[i]);
    }
}

static void emit(rctx *r, const jv *v, size_t pos) {
    if (v->t == V_UNDEF) return;
    const jstr *s = to_str(r, v);
    out_add(r, s->p, s->n, s->u, pos);
}

static void exec_for(rctx *r, scope *s, const node *n) {
    jx *x = r->x;
    jv it = eval(r, s, n->a);
    jlist *items = iter_items(r, &it, n->a->pos);
    const node *targets = n->c;
    scope sc = {.parent = s, .vars = dict_new(x)};
    if (n->b) { /* {% for x in xs if cond %}: loop.* counts the kept items */
        jlist *kept = list_new(x);
        for (size_t i = 0; i < items->n; i++) {
            if (++r->iterations > MAX_ITERATIONS) failf(x, n->pos, "more than %d loop iterations", MAX_ITERATIONS);
            assign(r, &sc, targets->kids.n == 1 ? targets->kids.v[0] : targets, items->v[i]);
            jv c = eval(r, &sc, n->b);
            if (truthy(&c)) list_push(x, kept, items->v[i]);
        }
        items = kept;
    }
    if (items->n == 0) {
        exec_body(r, s, &n->kids2);
        return;
    }
    /* one loop object and one scope, updated in place: a long loop does not grow memory */
    static const char *const keys[] = {"index", "index0", "revindex", "revindex0", "first", "last",
                                       "length", "depth", "depth0", "previtem", "nextitem"};
    jdict *loop = dict_new(x);
    for (int k = 0; k < 11; k++) dict_setc(x, loop, keys[k], UNDEF);
    jv loopv = {.t = V_DICT, .d = loop};
    for (size_t i = 0; i < items->n; i++) {
        if (++r->iterations > MAX_ITERATIONS) failf(x, n->pos, "more than %d loop iterations", MAX_ITERATIONS);
        int64_t len = (int64_t)items->n, k = (int64_t)i;
        loop->v[0] = mk_int(k + 1);
        loop->v[1] = mk_int(k);
        loop->v[2] = mk_int(len - k);
        loop->v[3] = mk_int(len - k - 1);
        loop->v[4] = mk_bool(k == 0);
        loop->v[5] = mk_bool(k == len - 1);
        loop->v[6] = mk_int(len);
        loop->v[7] = mk_int(1);
        loop->v[8] = mk_int(0);
        loop->v[9] = i > 0 ? items->v[i - 1] : UNDEF;
        loop->v[10] = i + 1 < items->n ? items->v[i + 1] : UNDEF;
        sc.vars->n = 0;
        dict_setc(x, sc.vars, "loop", loopv);
        assign(r, &sc, targets->kids.n == 1 ? targets->kids.v[0] : targets, items->v[i]);
        exec_body(r, &sc, &n->kids);
        if (r->loop_ctl == 1) {
            r->loop_ctl = 0;
            break;
        }
        r->loop_ctl = 0;
    }
}

static void exec_body(rctx *r, scope *s, const nlist *body) {
    jx *x = r->x;
    if (++r->depth > MAX_DEPTH) failf(x, 0, "blocks nested more than %d deep", MAX_DEPTH);
    for (int i = 0; i < body->n && !r->loop_ctl; i++) {
        const node *n = body->v[i];
        x->at = n->pos;
        switch (n->kind) {
        case N_TEXT: out_add(r, n->lit.s->p, n->lit.s->n, NULL, n->pos); break;
        case N_OUT: {
            jv v = eval(r, s, n->a);
            emit(r, &v, n->pos);
            break;
        }
        case N_IF:
            for (int k = 0; k < n->kids.n; k++) {
                const node *br = n->kids.v[k];
                jv c = br->a ? eval(r, s, br->a) : mk_bool(1);
                if (truthy(&c)) {
                    exec_body(r, s, &br->kids);
                    break;
                }
            }
            break;
        case N_FOR: exec_for(r, s, n); break;
        case N_SET: assign(r, s, n->a, eval(r, s, n->b)); break;
        case N_SETBLOCK: {
            sbuf saved = r->out;
            r->out = (sbuf){0};
            exec_body(r, s, &n->kids);
            sbuf got = r->out;
            r->out = saved;
            jstr *str = sb_done(x, &got);
            assign(r, s, n->a, mk_str(str));
            break;
        }
        case N_MACRO: dict_setc(x, s->vars, n->name, (jv){.t = V_MACRO, .m = n}); break;
        case N_BREAK: r->loop_ctl = 1; break;
        case N_CONTINUE: r->loop_ctl = 2; break;
        case N_BODY: exec_body(r, s, &n->kids); break;
        default: failf(x, n->pos, "not a statement");
        }
    }
    r->depth--;
}

bool kvg_jinja_render(const kvg_jinja *t, const kvg_jinja_input *in, kvg_jinja_output *out, char *msg,
                      size_t msg_size) {
    memset(out, 0, sizeof *out);
    jx x = {.msg = msg, .msg_size = msg_size, .src = t->src, .src_len = t->src_len};
    rctx r = {.x = &x};
    if (setjmp(x.jb)) {
        arena_free(x.blocks);
        arena_free(x.bigs);
        return false;
    }
    scope *g = alloc(&x, sizeof *g);
    g->vars = dict_new(&x);
    r.globals = g;
    jlist *msgs = list_new(&x);
    for (size_t i = 0; i < in->n_messages; i++) {
        jdict *m = dict_new(&x);
        const char *role = in->messages[i].role ? in->messages[i].role : "";
        const char *content = in->messages[i].content ? in->messages[i].content : "";
        size_t cn = strlen(content);
        jstr *c = str_new(&x, content, cn, NULL);
        unsigned char *u = alloc(&x, cn + 1);
        memset(u, 1, cn);
        c->u = cn ? u : NULL;
        dict_setc(&x, m, "role", mk_str(str_c(&x, role)));
        dict_setc(&x, m, "content", mk_str(c));
        list_push(&x, msgs, (jv){.t = V_DICT, .d = m});
    }
    dict_setc(&x, g->vars, "messages", (jv){.t = V_LIST, .l = msgs});
    dict_setc(&x, g->vars, "add_generation_prompt", mk_bool(in->add_generation_prompt));
    dict_setc(&x, g->vars, "bos_token", mk_str(str_c(&x, in->bos_token ? in->bos_token : "")));
    dict_setc(&x, g->vars, "eos_token", mk_str(str_c(&x, in->eos_token ? in->eos_token : "")));
    dict_setc(&x, g->vars, "range", (jv){.t = V_FUNC, .fn = F_RANGE});
    dict_setc(&x, g->vars, "namespace", (jv){.t = V_FUNC, .fn = F_NAMESPACE});
    dict_setc(&x, g->vars, "dict", (jv){.t = V_FUNC, .fn = F_DICT});
    dict_setc(&x, g->vars, "raise_exception", (jv){.t = V_FUNC, .fn = F_RAISE});
    dict_setc(&x, g->vars, "strftime_now", (jv){.t = V_FUNC, .fn = F_STRFTIME});
    exec_body(&r, g, &t->root->kids);
    out->text = kvg_malloc(r.out.n + 1);
    out->user = kvg_malloc(r.out.n + 1);
    if (!out->text || !out->user) {
        kvg_free(out->text);
        kvg_free(out->user);
        memset(out, 0, sizeof *out);
        snprintf(msg, msg_size, "out of memory for %zu bytes of output", r.out.n);
        arena_free(x.blocks);
        arena_free(x.bigs);
        return false;
    }
    if (r.out.n) {
        memcpy(out->text, r.out.p, r.out.n);
        memcpy(out->user, r.out.u, r.out.n);
    }
    out->text[r.out.n] = 0;
    out->user[r.out.n] = 0;
    out->len = r.out.n;
    arena_free(x.blocks);
    arena_free(x.bigs);
    return true;
}
