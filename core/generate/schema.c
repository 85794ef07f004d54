/* schema.c: a JSON schema subset compiled to GBNF (kvg_grammar.h; docs/generation.md,
 * "JSON schemas"). A small JSON reader turns the schema text into values; each schema node
 * becomes one rule, and the output is compact JSON (no whitespace) with an object's
 * properties in the schema's order. Anything the compiler cannot guarantee is refused with
 * the schema path and the keyword. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_buf.h"
#include "kvg_grammar.h"
#include "kvg_model.h"

#define MAX_DEPTH 64
#define DEFAULT_MAX_LENGTH 64 /* a string without maxLength: at most this many characters */
#define MAX_LENGTH 4096
#define INT_LIMIT 999999999999999LL /* integers without a bound: at most 15 digits */

/* ---- the JSON reader ----------------------------------------------------------------------- */

typedef enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
    jtype t;
    bool b;
    double num;
    char *s;  /* J_STR: the string (NUL-terminated, may hold NULs: len); J_NUM: its text */
    size_t len;
    struct jval *items; /* J_ARR, J_OBJ: n values */
    char **keys;        /* J_OBJ: n keys */
    int n;
} jval;

static void jfree(jval *v) {
    if (!v) return;
    kvg_free(v->s);
    for (int i = 0; i < v->n; i++) {
        jfree(&v->items[i]);
        if (v->keys) kvg_free(v->keys[i]);
    }
    kvg_free(v->items);
    kvg_free(v->keys);
}

typedef struct jreader {
    const char *src, *p;
    kvgen_error *err;
    kvgen_status st;
} jreader;

static void jerr(jreader *R, const char *what) {
    if (R->st == KVGEN_OK)
        R->st = kvg_fail(R->err, KVGEN_E_INVALID_ARGUMENT, "schema: not valid JSON at byte %ld: %s",
                         (long)(R->p - R->src), what);
}

static void jspace(jreader *R) {
    while (*R->p == ' ' || *R->p == '\t' || *R->p == '\n' || *R->p == '\r') R->p++;
}

static int hex4(const char *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

static bool jstring(jreader *R, char **out, size_t *len) {
    R->p++; /* '"' */
    kvg_buf b = {0};
    bool ok = kvg_buf_add(&b, "", 0);
    while (ok && *R->p != '"') {
        unsigned char c = (unsigned char)*R->p;
        if (c == 0 || c < 0x20) {
            jerr(R, "unterminated string or control character in a string");
            ok = false;
            break;
        }
        if (c != '\\') {
            ok = kvg_buf_add(&b, R->p++, 1);
            continue;
        }
        char e = R->p[1], ch;
        R->p += 2;
        switch (e) {
        case '"': ch = '"'; break;
        case '\\': ch = '\\'; break;
        case '/': ch = '/'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case 'u': {
            long v = hex4(R->p);
            if (v < 0) {
                jerr(R, "\\u needs 4 hexadecimal digits");
                ok = false;
                break;
            }
            R->p += 4;
            if (v >= 0xd800 && v < 0xdc00 && R->p[0] == '\\' && R->p[1] == 'u') {
                long lo = hex4(R->p + 2);
                if (lo >= 0xdc00 && lo < 0xe000) {
                    v = 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
                    R->p += 6;
                }
            }
            if (v >= 0xd800 && v < 0xe000) {
                jerr(R, "a lone UTF-16 surrogate");
                ok = false;
                break;
            }
            char u[4];
            int n;
            if (v < 0x80) {
                u[0] = (char)v;
                n = 1;
            } else if (v < 0x800) {
                u[0] = (char)(0xc0 | (v >> 6));
                u[1] = (char)(0x80 | (v & 0x3f));
                n = 2;
            } else if (v < 0x10000) {
                u[0] = (char)(0xe0 | (v >> 12));
                u[1] = (char)(0x80 | ((v >> 6) & 0x3f));
                u[2] = (char)(0x80 | (v & 0x3f));
                n = 3;
            } else {
                u[0] = (char)(0xf0 | (v >> 18));
                u[1] = (char)(0x80 | ((v >> 12) & 0x3f));
                u[2] = (char)(0x80 | ((v >> 6) & 0x3f));
                u[3] = (char)(0x80 | (v & 0x3f));
                n = 4;
            }
            ok = kvg_buf_add(&b, u, (size_t)n);
            continue;
        }
        default: jerr(R, "unknown escape in a string"); ok = false;
        }
        if (ok) ok = kvg_buf_add(&b, &ch, 1);
    }
    if (!ok) {
        if (R->st == KVGEN_OK) R->st = kvg_fail(R->err, KVGEN_E_NO_MEMORY, "schema: out of memory");
        kvg_free(b.p);
        return false;
    }
    R->p++;
    *out = b.p;
    *len = b.n;
    return true;
}

static bool jvalue(jreader *R, jval *v, int depth) {
    memset(v, 0, sizeof *v);
    jspace(R);
    if (depth > MAX_DEPTH) {
        jerr(R, "nested too deeply");
        return false;
    }
    char c = *R->p;
    if (c == '"') {
        v->t = J_STR;
        return jstring(R, &v->s, &v->len);
    }
    if (c == '{' || c == '[') {
        bool obj = c == '{';
        v->t = obj ? J_OBJ : J_ARR;
        R->p++;
        jspace(R);
        if (*R->p == (obj ? '}' : ']')) {
            R->p++;
            return true;
        }
        int cap = 0;
        for (;;) {
            if (v->n == cap) {
                cap = cap ? cap * 2 : 4;
                jval *it = kvg_realloc(v->items, (size_t)cap * sizeof *it);
                char **ks = obj ? kvg_realloc(v->keys, (size_t)cap * sizeof *ks) : NULL;
                if (it) v->items = it;
                if (ks) v->keys = ks;
                if (!it || (obj && !ks)) {
                    if (R->st == KVGEN_OK) R->st = kvg_fail(R->err, KVGEN_E_NO_MEMORY, "schema: out of memory");
                    return false;
                }
            }
            jspace(R);
            char *key = NULL;
            size_t klen;
            if (obj) {
                if (*R->p != '"') {
                    jerr(R, "expected a string key");
                    return false;
                }
                if (!jstring(R, &key, &klen)) return false;
                jspace(R);
                if (*R->p != ':') {
                    kvg_free(key);
                    jerr(R, "expected ':'");
                    return false;
                }
                R->p++;
                v->keys[v->n] = key;
            }
            bool ok = jvalue(R, &v->items[v->n], depth + 1);
            v->n++;
            if (!ok) return false;
            jspace(R);
            if (*R->p == ',') {
                R->p++;
                continue;
            }
            if (*R->p == (obj ? '}' : ']')) {
                R->p++;
                return true;
            }
            jerr(R, obj ? "expected ',' or '}'" : "expected ',' or ']'");
            return false;
        }
    }
    if (strncmp(R->p, "true", 4) == 0 || strncmp(R->p, "false", 5) == 0) {
        v->t = J_BOOL;
        v->b = *R->p == 't';
        R->p += v->b ? 4 : 5;
        return true;
    }
    if (strncmp(R->p, "null", 4) == 0) {
        v->t = J_NULL;
        R->p += 4;
        return true;
    }
    const char *start = R->p;
    if (*R->p == '-') R->p++;
    if (*R->p == '0') R->p++;
    else if (*R->p >= '1' && *R->p <= '9')
        while (*R->p >= '0' && *R->p <= '9') R->p++;
    else {
        jerr(R, "expected a value");
        return false;
    }
    if (*R->p == '.') {
        R->p++;
        if (*R->p < '0' || *R->p > '9') {
            jerr(R, "expected a digit after '.'");
            return false;
        }
        while (*R->p >= '0' && *R->p <= '9') R->p++;
    }
    if (*R->p == 'e' || *R->p == 'E') {
        R->p++;
        if (*R->p == '+' || *R->p == '-') R->p++;
        if (*R->p < '0' || *R->p > '9') {
            jerr(R, "expected a digit in the exponent");
            return false;
        }
        while (*R->p >= '0' && *R->p <= '9') R->p++;
    }
    v->t = J_NUM;
    v->len = (size_t)(R->p - start);
    v->s = kvg_malloc(v->len + 1);
    if (!v->s) {
        if (R->st == KVGEN_OK) R->st = kvg_fail(R->err, KVGEN_E_NO_MEMORY, "schema: out of memory");
        return false;
    }
    memcpy(v->s, start, v->len);
    v->s[v->len] = 0;
    v->num = strtod(v->s, NULL);
    return true;
}

static const jval *jget(const jval *o, const char *key) {
    if (!o || o->t != J_OBJ) return NULL;
    for (int i = 0; i < o->n; i++)
        if (strcmp(o->keys[i], key) == 0) return &o->items[i];
    return NULL;
}

/* ---- the compiler ---------------------------------------------------------------------------- */

typedef struct comp {
    kvg_buf out; /* the grammar */
    int n_rules;
    const jval *root;
    struct {
        const char *name;
        int rule;
    } defs[256];
    int n_defs;
    kvgen_error *err;
    kvgen_status st;
} comp;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int cerr(comp *C, const char *path, const char *fmt, ...) {
    if (C->st != KVGEN_OK) return -1;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    C->st = kvg_fail(C->err, KVGEN_E_INVALID_ARGUMENT, "schema: %s: %s", path[0] ? path : "#", msg);
    return -1;
}

static bool add(comp *C, kvg_buf *b, const char *s) {
    if (C->st != KVGEN_OK) return false;
    if (!kvg_buf_add(b, s, strlen(s))) {
        C->st = kvg_fail(C->err, KVGEN_E_NO_MEMORY, "schema: out of memory");
        return false;
    }
    return true;
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static bool addf(comp *C, kvg_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    return add(C, b, tmp);
}

/* bytes as a GBNF string literal */
static void lit(comp *C, kvg_buf *b, const char *s, size_t n) {
    add(C, b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') addf(C, b, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) addf(C, b, "\\x%02x", c);
        else {
            char one[2] = {(char)c, 0};
            add(C, b, one);
        }
    }
    add(C, b, "\"");
}

/* a value as compact JSON text */
static void to_json(comp *C, kvg_buf *b, const jval *v) {
    switch (v->t) {
    case J_NULL: add(C, b, "null"); break;
    case J_BOOL: add(C, b, v->b ? "true" : "false"); break;
    case J_NUM: add(C, b, v->s); break;
    case J_STR:
        add(C, b, "\"");
        for (size_t i = 0; i < v->len; i++) {
            unsigned char c = (unsigned char)v->s[i];
            const char *esc = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : c == '\b' ? "\\b"
                              : c == '\f' ? "\\f" : NULL;
            if (c == '"' || c == '\\') addf(C, b, "\\%c", c);
            else if (esc) add(C, b, esc);
            else if (c < 0x20) addf(C, b, "\\u%04x", c);
            else if (C->st == KVGEN_OK && !kvg_buf_add(b, (const char *)&v->s[i], 1))
                C->st = kvg_fail(C->err, KVGEN_E_NO_MEMORY, "schema: out of memory");
        }
        add(C, b, "\"");
        break;
    case J_ARR:
    case J_OBJ:
        add(C, b, v->t == J_ARR ? "[" : "{");
        for (int i = 0; i < v->n; i++) {
            if (i) add(C, b, ",");
            if (v->t == J_OBJ) {
                jval k = {.t = J_STR, .s = v->keys[i], .len = strlen(v->keys[i])};
                to_json(C, b, &k);
                add(C, b, ":");
            }
            to_json(C, b, &v->items[i]);
        }
        add(C, b, v->t == J_ARR ? "]" : "}");
        break;
    }
}

static bool utf8_text(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t cl, ok;
        kvg_utf8_scan((const unsigned char *)s + i, n - i, &cl, &ok);
        if (cl == 0 || ok != cl) return false;
        i += cl;
    }
    return true;
}

/* every string in v (keys too) is UTF-8: JSON text is, and so must the grammar's text be */
static bool utf8_value(const jval *v) {
    if (v->t == J_STR) return utf8_text(v->s, v->len);
    if (v->t != J_ARR && v->t != J_OBJ) return true;
    for (int i = 0; i < v->n; i++)
        if ((v->keys && !utf8_text(v->keys[i], strlen(v->keys[i]))) || !utf8_value(&v->items[i])) return false;
    return true;
}

static void json_lit(comp *C, kvg_buf *b, const jval *v) {
    kvg_buf t = {0};
    to_json(C, &t, v);
    if (C->st == KVGEN_OK) lit(C, b, t.p, t.n);
    kvg_free(t.p);
}

/* n digits from lo to hi (strings of n digits, lo <= hi) */
static void digit_range(comp *C, kvg_buf *b, const char *lo, const char *hi, int n) {
    if (n == 1) {
        addf(C, b, "[%c-%c]", lo[0], hi[0]);
        return;
    }
    if (lo[0] == hi[0]) {
        addf(C, b, "\"%c\" ", lo[0]);
        digit_range(C, b, lo + 1, hi + 1, n - 1);
        return;
    }
    bool lo_zero = true, hi_nine = true;
    for (int i = 1; i < n; i++) {
        lo_zero &= lo[i] == '0';
        hi_nine &= hi[i] == '9';
    }
    if (lo_zero && hi_nine) {
        addf(C, b, "[%c-%c] [0-9]{%d}", lo[0], hi[0], n - 1);
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    char first = lo[0], last = hi[0];
    add(C, b, "(");
    bool any = false;
    if (!lo_zero) {
        addf(C, b, "\"%c\" ", lo[0]);
        digit_range(C, b, lo + 1, nines, n - 1);
        first++;
        any = true;
    }
    if (!hi_nine) last--;
    if (first <= last) {
        addf(C, b, "%s[%c-%c] [0-9]{%d}", any ? " | " : "", first, last, n - 1);
        any = true;
    }
    if (!hi_nine) {
        addf(C, b, "%s\"%c\" ", any ? " | " : "", hi[0]);
        digit_range(C, b, zeros, hi + 1, n - 1);
    }
    add(C, b, ")");
}

/* the integers a..b (0 <= a <= b), written without leading zeros */
static void nonneg_range(comp *C, kvg_buf *b, long long a, long long z) {
    add(C, b, "(");
    long long p = 1;
    bool any = false;
    for (int d = 1; d <= 18; d++, p *= 10) {
        long long lo = d == 1 ? 0 : p, hi = p * 10 - 1;
        if (lo < a) lo = a;
        if (hi > z) hi = z;
        if (lo > hi) continue;
        char ls[24], hs[24];
        snprintf(ls, sizeof ls, "%lld", lo);
        snprintf(hs, sizeof hs, "%lld", hi);
        if (any) add(C, b, " | ");
        digit_range(C, b, ls, hs, d);
        any = true;
    }
    add(C, b, ")");
}

static void int_range(comp *C, kvg_buf *b, long long lo, long long hi) {
    add(C, b, "(");
    if (hi >= 0) nonneg_range(C, b, lo > 0 ? lo : 0, hi);
    if (lo < 0) {
        long long a = hi < -1 ? -hi : 1;
        add(C, b, hi >= 0 ? " | \"-\" " : "\"-\" ");
        nonneg_range(C, b, a, -lo);
    }
    add(C, b, ")");
}

static const char *const known_keys[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const",
    "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "$ref",
    "$defs", "definitions", "title", "description", "$schema", "$id", "$comment", "default", "examples", NULL};
static const char *const annotation_keys[] = {"title", "description", "$schema", "$id", "$comment", "default",
                                              "examples", "$defs", "definitions", NULL};

static bool in(const char *const *list, const char *k) {
    for (int i = 0; list[i]; i++)
        if (strcmp(list[i], k) == 0) return true;
    return false;
}

static int gen(comp *C, const jval *s, const char *path, int depth);

/* a rule with body b (consumed): its number */
static int emit_rule(comp *C, kvg_buf *body) {
    int r = C->n_rules++;
    addf(C, &C->out, "r%d ::= ", r);
    if (body->p) add(C, &C->out, body->p);
    add(C, &C->out, "\n");
    kvg_free(body->p);
    memset(body, 0, sizeof *body);
    return C->st == KVGEN_OK ? r : -1;
}

/* emits rule r with body b (for rules numbered before their body is known) */
static void emit_numbered(comp *C, int r, kvg_buf *body) {
    addf(C, &C->out, "r%d ::= ", r);
    if (body->p) add(C, &C->out, body->p);
    add(C, &C->out, "\n");
    kvg_free(body->p);
    memset(body, 0, sizeof *body);
}

static bool number_kw(comp *C, const jval *s, const char *kw, const char *path, double *v) {
    const jval *k = jget(s, kw);
    if (!k) return false;
    if (k->t != J_NUM) {
        cerr(C, path, "keyword '%s' must be a number", kw);
        return false;
    }
    *v = k->num;
    return true;
}

static long long count_kw(comp *C, const jval *s, const char *kw, const char *path, long long dflt, long long max) {
    const jval *k = jget(s, kw);
    if (!k) return dflt;
    if (k->t != J_NUM || k->num < 0 || k->num != floor(k->num) || k->num > (double)max) {
        cerr(C, path, "keyword '%s' must be a whole number in 0..%lld", kw, max);
        return -1;
    }
    return (long long)k->num;
}

/* integer bounds: ceil(minimum), floor(maximum), exclusive ones one further in */
static bool int_bounds(comp *C, const jval *s, const char *path, long long *lo, long long *hi) {
    double v;
    *lo = -INT_LIMIT;
    *hi = INT_LIMIT;
    if (number_kw(C, s, "minimum", path, &v) && ceil(v) > (double)*lo) *lo = v > (double)INT_LIMIT ? INT_LIMIT + 1 : (long long)ceil(v);
    if (number_kw(C, s, "exclusiveMinimum", path, &v) && floor(v) + 1 > (double)*lo)
        *lo = v >= (double)INT_LIMIT ? INT_LIMIT + 1 : (long long)floor(v) + 1;
    if (number_kw(C, s, "maximum", path, &v) && floor(v) < (double)*hi) *hi = v < -(double)INT_LIMIT ? -INT_LIMIT - 1 : (long long)floor(v);
    if (number_kw(C, s, "exclusiveMaximum", path, &v) && ceil(v) - 1 < (double)*hi)
        *hi = v <= -(double)INT_LIMIT ? -INT_LIMIT - 1 : (long long)ceil(v) - 1;
    if (C->st != KVGEN_OK) return false;
    if (*lo > *hi) {
        cerr(C, path, "keywords 'minimum'/'maximum' leave no integer in %lld..%lld", *lo, *hi);
        return false;
    }
    return true;
}

static void gen_object(comp *C, const jval *s, const char *path, int depth, kvg_buf *b) {
    const jval *props = jget(s, "properties"), *req = jget(s, "required");
    if (props && props->t != J_OBJ) {
        cerr(C, path, "keyword 'properties' must be an object");
        return;
    }
    if (req && req->t != J_ARR) {
        cerr(C, path, "keyword 'required' must be an array of property names");
        return;
    }
    int n = props ? props->n : 0;
    bool *required = kvg_calloc((size_t)n + 1, sizeof *required);
    int *rule = kvg_calloc((size_t)n + 1, sizeof *rule);
    if (!required || !rule) {
        kvg_free(required);
        kvg_free(rule);
        C->st = kvg_fail(C->err, KVGEN_E_NO_MEMORY, "schema: out of memory");
        return;
    }
    for (int p = 0; p < n && C->st == KVGEN_OK; p++)
        if (!utf8_text(props->keys[p], strlen(props->keys[p])))
            cerr(C, path, "keyword 'properties': property name %d is not valid UTF-8", p);
    for (int i = 0; req && i < req->n && C->st == KVGEN_OK; i++) {
        const jval *k = &req->items[i];
        int at = -1;
        for (int p = 0; k->t == J_STR && p < n; p++)
            if (strcmp(props->keys[p], k->s) == 0) at = p;
        if (at < 0)
            cerr(C, path, "keyword 'required' names %s%s%s, which is not in 'properties'", k->t == J_STR ? "'" : "",
                 k->t == J_STR ? k->s : "a value that is not a string", k->t == J_STR ? "'" : "");
        else
            required[at] = true;
    }
    /* each property: "key":value */
    for (int p = 0; p < n && C->st == KVGEN_OK; p++) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/properties/%s", path, props->keys[p]);
        int v = gen(C, &props->items[p], sub, depth + 1);
        if (v < 0) break;
        kvg_buf body = {0};
        jval key = {.t = J_STR, .s = props->keys[p], .len = strlen(props->keys[p])};
        kvg_buf k = {0};
        to_json(C, &k, &key);
        add(C, &k, ":");
        if (C->st == KVGEN_OK) lit(C, &body, k.p, k.n);
        kvg_free(k.p);
        addf(C, &body, " r%d", v);
        rule[p] = emit_rule(C, &body);
    }
    if (C->st == KVGEN_OK) {
        /* after[i]: properties i.. once one was written; first[i]: before any was */
        int after_next = -1, first_next = -1;
        for (int i = n - 1; i >= 0 && C->st == KVGEN_OK; i--) {
            kvg_buf a = {0}, f = {0};
            char next_a[32] = "", next_f[32] = "";
            if (after_next >= 0) snprintf(next_a, sizeof next_a, " r%d", after_next);
            if (first_next >= 0) snprintf(next_f, sizeof next_f, "r%d", first_next);
            if (required[i]) {
                addf(C, &a, "\",\" r%d%s", rule[i], next_a);
                addf(C, &f, "r%d%s", rule[i], next_a);
            } else {
                addf(C, &a, "(\",\" r%d)?%s", rule[i], next_a);
                addf(C, &f, "r%d%s%s%s", rule[i], next_a, first_next >= 0 ? " | " : " | \"\"", next_f);
            }
            after_next = emit_rule(C, &a);
            first_next = emit_rule(C, &f);
        }
        add(C, b, "\"{\" ");
        if (first_next >= 0) addf(C, b, "r%d ", first_next);
        add(C, b, "\"}\"");
    }
    kvg_free(required);
    kvg_free(rule);
}

static void gen_typed(comp *C, const jval *s, const char *type, const char *path, int depth, kvg_buf *b) {
    if (strcmp(type, "object") == 0) {
        gen_object(C, s, path, depth, b);
    } else if (strcmp(type, "array") == 0) {
        const jval *items = jget(s, "items");
        if (items && items->t == J_ARR) {
            cerr(C, path, "keyword 'items' as an array (tuples) is not supported");
            return;
        }
        long long lo = count_kw(C, s, "minItems", path, 0, 4096), hi = count_kw(C, s, "maxItems", path, -1, 4096);
        if (lo < 0 || C->st != KVGEN_OK) return;
        if (hi >= 0 && hi < lo) {
            cerr(C, path, "keyword 'maxItems' %lld is below 'minItems' %lld", hi, lo);
            return;
        }
        char sub[512];
        snprintf(sub, sizeof sub, "%s/items", path);
        int it = items ? gen(C, items, sub, depth + 1) : -1;
        if (C->st != KVGEN_OK) return;
        char item[32];
        snprintf(item, sizeof item, items ? "r%d" : "jvalue", it);
        if (hi == 0) add(C, b, "\"[\" \"]\"");
        else if (lo == 0 && hi < 0) addf(C, b, "\"[\" (%s (\",\" %s)*)? \"]\"", item, item);
        else if (lo == 0) addf(C, b, "\"[\" (%s (\",\" %s){0,%lld})? \"]\"", item, item, hi - 1);
        else if (hi < 0) addf(C, b, "\"[\" %s (\",\" %s){%lld,} \"]\"", item, item, lo - 1);
        else addf(C, b, "\"[\" %s (\",\" %s){%lld,%lld} \"]\"", item, item, lo - 1, hi - 1);
    } else if (strcmp(type, "string") == 0) {
        long long lo = count_kw(C, s, "minLength", path, 0, MAX_LENGTH);
        long long hi = count_kw(C, s, "maxLength", path, lo > DEFAULT_MAX_LENGTH ? lo : DEFAULT_MAX_LENGTH, MAX_LENGTH);
        if (lo < 0 || hi < 0) return;
        if (hi < lo) {
            cerr(C, path, "keyword 'maxLength' %lld is below 'minLength' %lld", hi, lo);
            return;
        }
        addf(C, b, "\"\\\"\" jchar{%lld,%lld} \"\\\"\"", lo, hi);
    } else if (strcmp(type, "integer") == 0) {
        long long lo, hi;
        if (int_bounds(C, s, path, &lo, &hi)) int_range(C, b, lo, hi);
    } else if (strcmp(type, "number") == 0) {
        double v;
        if (number_kw(C, s, "exclusiveMinimum", path, &v) || number_kw(C, s, "exclusiveMaximum", path, &v)) {
            cerr(C, path, "keywords 'exclusiveMinimum'/'exclusiveMaximum' are supported for integers only");
            return;
        }
        if (C->st != KVGEN_OK) return;
        bool bounded = jget(s, "minimum") || jget(s, "maximum");
        if (!bounded) {
            add(C, b, "jnumber");
            return;
        }
        /* integers in range, and k.ddd only where all of [k, k+1] is in range */
        long long lo, hi;
        if (!int_bounds(C, s, path, &lo, &hi)) return;
        add(C, b, "(");
        int_range(C, b, lo, hi);
        long long plo = lo > 0 ? lo : 0;
        if (plo <= hi - 1) {
            add(C, b, " | ");
            nonneg_range(C, b, plo, hi - 1);
            add(C, b, " \".\" [0-9]{1,6}");
        }
        long long klo = hi < -1 ? -hi : 1, khi = -lo - 1; /* -k.ddd in (-(k+1), -k] */
        if (klo <= khi) {
            add(C, b, " | \"-\" ");
            nonneg_range(C, b, klo, khi);
            add(C, b, " \".\" [0-9]{1,6}");
        }
        add(C, b, ")");
    } else if (strcmp(type, "boolean") == 0) {
        add(C, b, "(\"true\" | \"false\")");
    } else if (strcmp(type, "null") == 0) {
        add(C, b, "\"null\"");
    } else {
        cerr(C, path, "type '%s' is not supported (object, array, string, integer, number, boolean, null)", type);
    }
}

static int gen_ref(comp *C, const char *ref, const char *path, int depth) {
    const char *name = NULL, *where = NULL;
    if (strncmp(ref, "#/$defs/", 8) == 0) name = ref + 8, where = "$defs";
    else if (strncmp(ref, "#/definitions/", 14) == 0) name = ref + 14, where = "definitions";
    const jval *def = name ? jget(jget(C->root, where), name) : NULL;
    if (!def) return cerr(C, path, "keyword '$ref' \"%s\": only #/$defs/NAME (or #/definitions/NAME) of this schema", ref);
    for (int i = 0; i < C->n_defs; i++)
        if (strcmp(C->defs[i].name, ref) == 0) return C->defs[i].rule;
    if (C->n_defs == 256) return cerr(C, path, "keyword '$ref': over 256 definitions");
    int r = C->n_rules++; /* numbered first: a definition may refer to itself */
    C->defs[C->n_defs].name = ref;
    C->defs[C->n_defs].rule = r;
    C->n_defs++;
    char sub[512];
    snprintf(sub, sizeof sub, "#/%s/%s", where, name);
    int v = gen(C, def, sub, depth + 1);
    if (v < 0) return -1;
    kvg_buf b = {0};
    addf(C, &b, "r%d", v);
    emit_numbered(C, r, &b);
    return C->st == KVGEN_OK ? r : -1;
}

/* the rule for schema s, its body built in *bp; gen() frees what is left in *bp on every return */
static int gen_into(comp *C, const jval *s, const char *path, int depth, kvg_buf *bp) {
    if (s->t == J_BOOL) {
        if (!s->b) return cerr(C, path, "the schema false accepts nothing");
        add(C, bp, "jvalue");
        return emit_rule(C, bp);
    }
    if (s->t != J_OBJ) return cerr(C, path, "a schema must be an object or a boolean");
    for (int i = 0; i < s->n; i++)
        if (!in(known_keys, s->keys[i])) return cerr(C, path, "keyword '%s' is not supported", s->keys[i]);
    const jval *ref = jget(s, "$ref"), *cnst = jget(s, "const"), *en = jget(s, "enum");
    const jval *any = jget(s, "anyOf") ? jget(s, "anyOf") : jget(s, "oneOf");
    const char *any_kw = jget(s, "anyOf") ? "anyOf" : "oneOf";
    const jval *type = jget(s, "type");
    if (jget(s, "anyOf") && jget(s, "oneOf")) return cerr(C, path, "keywords 'anyOf' and 'oneOf' together are not supported");
    const char *shape = ref ? "$ref" : cnst ? "const" : en ? "enum" : any ? any_kw : NULL;
    if (shape) { /* these stand alone (const and enum may have a type beside them) */
        for (int i = 0; i < s->n; i++) {
            const char *k = s->keys[i];
            if (in(annotation_keys, k) || strcmp(k, shape) == 0) continue;
            if (strcmp(k, "type") == 0 && (cnst || en)) continue;
            return cerr(C, path, "keyword '%s' beside '%s' is not supported", k, shape);
        }
    }
    if ((cnst || en) && type) { /* every value must be of the type */
        const jval *vals = cnst ? cnst : en;
        int nv = cnst ? 1 : en->t == J_ARR ? en->n : 0;
        for (int i = 0; i < nv; i++) {
            const jval *v = cnst ? vals : &vals->items[i];
            static const char *const names[] = {"null", "boolean", "number", "string", "array", "object"};
            bool fits = false;
            for (int t = 0; t < (type->t == J_ARR ? type->n : 1); t++) {
                const jval *tv = type->t == J_ARR ? &type->items[t] : type;
                if (tv->t != J_STR) return cerr(C, path, "keyword 'type' must be a string or an array of strings");
                fits |= strcmp(tv->s, names[v->t]) == 0 ||
                        (v->t == J_NUM && strcmp(tv->s, "integer") == 0 && v->num == floor(v->num));
            }
            if (!fits) return cerr(C, path, "keyword '%s' holds a value that is not of the schema's 'type'", shape);
        }
    }
    if (ref) {
        if (ref->t != J_STR) return cerr(C, path, "keyword '$ref' must be a string");
        return gen_ref(C, ref->s, path, depth);
    }
    if (cnst) {
        if (!utf8_value(cnst)) return cerr(C, path, "keyword 'const' holds a string that is not valid UTF-8");
        json_lit(C, bp, cnst);
        return emit_rule(C, bp);
    }
    if (en) {
        if (en->t != J_ARR || en->n == 0) return cerr(C, path, "keyword 'enum' must be a non-empty array");
        add(C, bp, "(");
        for (int i = 0; i < en->n; i++) {
            if (!utf8_value(&en->items[i]))
                return cerr(C, path, "keyword 'enum' value %d holds a string that is not valid UTF-8", i);
            if (i) add(C, bp, " | ");
            json_lit(C, bp, &en->items[i]);
        }
        add(C, bp, ")");
        return emit_rule(C, bp);
    }
    if (any) {
        if (any->t != J_ARR || any->n == 0) return cerr(C, path, "keyword '%s' must be a non-empty array", any_kw);
        int *alts = kvg_malloc((size_t)any->n * sizeof *alts);
        if (!alts) {
            C->st = kvg_fail(C->err, KVGEN_E_NO_MEMORY, "schema: out of memory");
            return -1;
        }
        for (int i = 0; i < any->n && C->st == KVGEN_OK; i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/%s/%d", path, any_kw, i);
            alts[i] = gen(C, &any->items[i], sub, depth + 1);
        }
        for (int i = 0; i < any->n && C->st == KVGEN_OK; i++) addf(C, bp, "%sr%d", i ? " | " : "", alts[i]);
        kvg_free(alts);
        return C->st == KVGEN_OK ? emit_rule(C, bp) : -1;
    }
    if (!type) { /* no type: an object or array by their keywords, else any value */
        if (jget(s, "properties") || jget(s, "required")) gen_typed(C, s, "object", path, depth, bp);
        else if (jget(s, "items")) gen_typed(C, s, "array", path, depth, bp);
        else add(C, bp, "jvalue");
    } else if (type->t == J_STR) {
        gen_typed(C, s, type->s, path, depth, bp);
    } else if (type->t == J_ARR && type->n > 0) {
        add(C, bp, "(");
        for (int i = 0; i < type->n && C->st == KVGEN_OK; i++) {
            if (type->items[i].t != J_STR) return cerr(C, path, "keyword 'type' lists a value that is not a string");
            if (i) add(C, bp, " | ");
            gen_typed(C, s, type->items[i].s, path, depth, bp);
        }
        add(C, bp, ")");
    } else {
        return cerr(C, path, "keyword 'type' must be a string or a non-empty array of strings");
    }
    if (C->st != KVGEN_OK) return -1;
    return emit_rule(C, bp);
}

static int gen(comp *C, const jval *s, const char *path, int depth) {
    if (C->st != KVGEN_OK) return -1;
    if (depth > MAX_DEPTH) return cerr(C, path, "the schema is nested over %d levels", MAX_DEPTH);
    kvg_buf b = {0};
    int r = gen_into(C, s, path, depth, &b);
    kvg_free(b.p); /* emit_rule took the body when it succeeded; an error leaves it here */
    return r;
}

static const char common_rules[] =
    "jchar ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\/bfnrt]\n"
    "jstring ::= \"\\\"\" jchar* \"\\\"\"\n"
    "jnumber ::= \"-\"? (\"0\" | [1-9] [0-9]{0,14}) (\".\" [0-9]{1,6})?\n"
    "jvalue ::= jobject | jarray | jstring | jnumber | \"true\" | \"false\" | \"null\"\n"
    "jobject ::= \"{\" (jstring \":\" jvalue (\",\" jstring \":\" jvalue)*)? \"}\"\n"
    "jarray ::= \"[\" (jvalue (\",\" jvalue)*)? \"]\"\n";

kvgen_status kvg_schema_to_gbnf(const char *text, char **gbnf, kvgen_error *err) {
    *gbnf = NULL;
    if (!text) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "schema: the schema text is NULL");
    jreader R = {text, text, err, KVGEN_OK};
    jval root;
    bool ok = jvalue(&R, &root, 0);
    if (ok) {
        jspace(&R);
        if (*R.p) jerr(&R, "text after the schema");
    }
    if (R.st != KVGEN_OK) {
        jfree(&root);
        return R.st;
    }
    comp C = {.root = &root, .err = err, .st = KVGEN_OK};
    add(&C, &C.out, common_rules);
    int top = gen(&C, &root, "#", 0);
    if (top >= 0) addf(&C, &C.out, "root ::= r%d\n", top);
    jfree(&root);
    if (C.st != KVGEN_OK) {
        kvg_free(C.out.p);
        return C.st;
    }
    *gbnf = C.out.p;
    return KVGEN_OK;
}
