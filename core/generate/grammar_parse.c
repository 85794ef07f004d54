/* grammar_parse.c: GBNF text to a compiled grammar (kvg_gram_parse): the parser builds the
 * rules (grammar_internal.h), grammar_check.c checks them, and they are packed into the
 * kvg_gram the matcher reads. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar_internal.h"

#define MAX_REPEAT 4096        /* x{m,n}: m and n at most this */
#define MAX_ELEMS (1 << 22)    /* elements of a compiled grammar */
#define MAX_EXPANDED (1 << 20) /* elements of the grammar with every repetition written out */
#define MAX_NESTING 256        /* groups inside groups */

static void set_byte(bclass *c, unsigned b) { c->bits[b >> 5] |= 1u << (b & 31); }
static void set_range(bclass *c, unsigned lo, unsigned hi) {
    for (unsigned b = lo; b <= hi; b++) set_byte(c, b);
}

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
            kvg_gram_parse_oom(P);
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
            kvg_gram_parse_oom(P);
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
            kvg_gram_parse_oom(P);
            return -1;
        }
        P->rules = n;
        P->cap_rules = cap;
    }
    prule *r = &P->rules[P->n_rules];
    memset(r, 0, sizeof *r);
    r->name = kvg_malloc(len + 1);
    if (!r->name) {
        kvg_gram_parse_oom(P);
        return -1;
    }
    memcpy(r->name, name, len);
    r->name[len] = 0;
    r->line = line;
    r->col = col;
    r->owner = P->n_rules;
    int id = P->n_rules++;
    if (len > 0 && !name_rule(P, id)) {
        kvg_gram_parse_oom(P);
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
            kvg_gram_parse_oom(P);
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
            kvg_gram_parse_oom(P);
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
    if (P.st == KVGEN_OK) kvg_gram_check(&P, find_rule(&P, "root", 4));
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
            kvg_gram_parse_oom(&P);
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

