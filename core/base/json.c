/* json.c: kvgen's JSON codec (kvg_json.h): the reader, the builders and the compact writer. */
#include <float.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_json.h"

/* ---- numbers, whatever the C locale's decimal point ------------------------------------------- */

static char locale_point(void) {
    const char *p = localeconv()->decimal_point;
    return p && p[0] && !p[1] ? p[0] : '.';
}

/* the double of a JSON number's text (n bytes, already checked) */
static double read_number(const char *s, size_t n) {
    char tmp[64], *t = n < sizeof tmp ? tmp : kvg_malloc(n + 1);
    if (!t) return NAN; /* the caller reports the lack of memory */
    memcpy(t, s, n);
    t[n] = 0;
    char point = locale_point();
    if (point != '.') {
        char *dot = strchr(t, '.');
        if (dot) *dot = point;
    }
    double v = strtod(t, NULL);
    if (t != tmp) kvg_free(t);
    return v;
}

/* ---- the reader ---------------------------------------------------------------------------- */

typedef struct reader {
    const char *s;
    size_t len, at;
    int max_depth;
    unsigned flags;
    bool failed, no_memory;
    size_t err_at;
    const char *what;
} reader;

static void fail_at(reader *R, size_t at, const char *what) {
    if (R->failed) return;
    R->failed = true;
    R->err_at = at > R->len ? R->len : at;
    R->what = what;
}

static void fail_memory(reader *R) {
    fail_at(R, R->at, "out of memory");
    R->no_memory = true;
}

static int peek(const reader *R) { return R->at < R->len ? (unsigned char)R->s[R->at] : -1; }

static void skip_space(reader *R) {
    while (R->at < R->len) {
        char c = R->s[R->at];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        R->at++;
    }
}

static int hex4(const reader *R, size_t at) {
    if (at > R->len || R->len - at < 4) return -1;
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = R->s[at + (size_t)i];
        int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* the length of the UTF-8 sequence at s (n bytes left), 0 when it is not one (overlong forms,
 * surrogates and code points over U+10FFFF are not) */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t k;
    unsigned min, cp;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) k = 2, min = 0x80, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) k = 3, min = 0x800, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) k = 4, min = 0x10000, cp = c & 0x07;
    else return 0;
    if (n < k) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000)) return 0;
    return k;
}

static size_t utf8_put(char *u, unsigned long v) {
    if (v < 0x80) {
        u[0] = (char)v;
        return 1;
    }
    if (v < 0x800) {
        u[0] = (char)(0xc0 | (v >> 6));
        u[1] = (char)(0x80 | (v & 0x3f));
        return 2;
    }
    if (v < 0x10000) {
        u[0] = (char)(0xe0 | (v >> 12));
        u[1] = (char)(0x80 | ((v >> 6) & 0x3f));
        u[2] = (char)(0x80 | (v & 0x3f));
        return 3;
    }
    u[0] = (char)(0xf0 | (v >> 18));
    u[1] = (char)(0x80 | ((v >> 12) & 0x3f));
    u[2] = (char)(0x80 | ((v >> 6) & 0x3f));
    u[3] = (char)(0x80 | (v & 0x3f));
    return 4;
}

/* a string at R->at (its '"'): its bytes in *out (NUL-terminated), their count in *len */
static bool read_string(reader *R, char **out, size_t *len) {
    R->at++;
    kvg_buf b = {0};
    if (!kvg_buf_add(&b, "", 0)) {
        fail_memory(R);
        return false;
    }
    for (;;) {
        int c = peek(R);
        if (c == '"') break;
        if (c < 0x20) {
            fail_at(R, R->at, "unterminated string or control character in a string");
            goto fail;
        }
        if (c != '\\') {
            /* a run of plain bytes at once */
            size_t start = R->at;
            while (R->at < R->len) {
                unsigned char d = (unsigned char)R->s[R->at];
                if (d == '"' || d == '\\' || d < 0x20) break;
                if (d < 0x80 || (R->flags & KVG_JSON_ANY_BYTES)) {
                    R->at++;
                    continue;
                }
                size_t k = utf8_len((const unsigned char *)R->s + R->at, R->len - R->at);
                if (!k) {
                    fail_at(R, R->at, "a string that is not valid UTF-8");
                    goto fail;
                }
                R->at += k;
            }
            if (!kvg_buf_add(&b, R->s + start, R->at - start)) goto oom;
            continue;
        }
        int e = R->at + 1 < R->len ? (unsigned char)R->s[R->at + 1] : -1;
        R->at += 2;
        char ch;
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
            long v = hex4(R, R->at);
            if (v < 0) {
                fail_at(R, R->at, "\\u needs 4 hexadecimal digits");
                goto fail;
            }
            R->at += 4;
            if (v >= 0xd800 && v < 0xdc00 && R->len - R->at >= 6 && R->s[R->at] == '\\' && R->s[R->at + 1] == 'u') {
                long lo = hex4(R, R->at + 2);
                if (lo >= 0xdc00 && lo < 0xe000) {
                    v = 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
                    R->at += 6;
                }
            }
            if (v >= 0xd800 && v < 0xe000) {
                fail_at(R, R->at, "a lone UTF-16 surrogate");
                goto fail;
            }
            char u[4];
            if (!kvg_buf_add(&b, u, utf8_put(u, (unsigned long)v))) goto oom;
            continue;
        }
        default: fail_at(R, R->at, "unknown escape in a string"); goto fail;
        }
        if (!kvg_buf_add(&b, &ch, 1)) goto oom;
    }
    R->at++;
    *out = b.p;
    *len = b.n;
    return true;
oom:
    fail_memory(R);
fail:
    kvg_free(b.p);
    return false;
}

static kvg_json *new_value(reader *R, kvg_json_type t, size_t at) {
    kvg_json *v = kvg_calloc(1, sizeof *v);
    if (!v) {
        fail_memory(R);
        return NULL;
    }
    v->type = t;
    v->offset = at;
    return v;
}

static bool literal(const reader *R, const char *word, size_t n) {
    return R->len - R->at >= n && memcmp(R->s + R->at, word, n) == 0;
}

static bool is_digit(int c) { return c >= '0' && c <= '9'; }

static kvg_json *read_value(reader *R, int depth);

/* an array or object at R->at ('[' or '{') */
static kvg_json *read_container(reader *R, kvg_json *v, int depth) {
    bool obj = v->type == KVG_JSON_OBJECT;
    char close = obj ? '}' : ']';
    R->at++;
    skip_space(R);
    if (peek(R) == close) {
        R->at++;
        return v;
    }
    for (;;) {
        skip_space(R);
        char *key = NULL;
        size_t key_len = 0;
        if (obj) {
            if (peek(R) != '"') {
                fail_at(R, R->at, "expected a string key");
                return v;
            }
            if (!read_string(R, &key, &key_len)) return v;
            skip_space(R);
            if (peek(R) != ':') {
                kvg_free(key);
                fail_at(R, R->at, "expected ':'");
                return v;
            }
            R->at++;
        }
        kvg_json *c = read_value(R, depth + 1);
        if (!c) {
            kvg_free(key);
            return v;
        }
        c->key = key;
        c->key_len = key_len;
        if (v->last) v->last->next = c;
        else v->child = c;
        v->last = c;
        v->n++;
        if (R->failed) return v;
        skip_space(R);
        int d = peek(R);
        if (d == ',') {
            R->at++;
            continue;
        }
        if (d == close) {
            R->at++;
            return v;
        }
        fail_at(R, R->at, obj ? "expected ',' or '}'" : "expected ',' or ']'");
        return v;
    }
}

/* the value at R->at (after spaces); on an error R->failed is set and what was built so far is
 * returned for the caller to free (NULL when nothing was) */
static kvg_json *read_value(reader *R, int depth) {
    skip_space(R);
    if (depth > R->max_depth) {
        fail_at(R, R->at, "nested too deeply");
        return NULL;
    }
    size_t at = R->at;
    int c = peek(R);
    if (c == '"') {
        kvg_json *v = new_value(R, KVG_JSON_STRING, at);
        if (v && !read_string(R, &v->str, &v->len)) {
            kvg_free(v);
            return NULL;
        }
        return v;
    }
    if (c == '{' || c == '[') {
        kvg_json *v = new_value(R, c == '{' ? KVG_JSON_OBJECT : KVG_JSON_ARRAY, at);
        return v ? read_container(R, v, depth) : NULL;
    }
    if (literal(R, "true", 4) || literal(R, "false", 5) || literal(R, "null", 4)) {
        kvg_json_type t = c == 't' ? KVG_JSON_TRUE : c == 'f' ? KVG_JSON_FALSE : KVG_JSON_NULL;
        R->at += t == KVG_JSON_FALSE ? 5 : 4;
        return new_value(R, t, at);
    }
    if (c == '-') R->at++;
    if (peek(R) == '0') R->at++;
    else if (peek(R) >= '1' && peek(R) <= '9')
        while (is_digit(peek(R))) R->at++;
    else {
        fail_at(R, R->at, "expected a value");
        return NULL;
    }
    if (peek(R) == '.') {
        R->at++;
        if (!is_digit(peek(R))) {
            fail_at(R, R->at, "expected a digit after '.'");
            return NULL;
        }
        while (is_digit(peek(R))) R->at++;
    }
    if (peek(R) == 'e' || peek(R) == 'E') {
        R->at++;
        if (peek(R) == '+' || peek(R) == '-') R->at++;
        if (!is_digit(peek(R))) {
            fail_at(R, R->at, "expected a digit in the exponent");
            return NULL;
        }
        while (is_digit(peek(R))) R->at++;
    }
    kvg_json *v = new_value(R, KVG_JSON_NUMBER, at);
    if (!v) return NULL;
    v->number = read_number(R->s + at, R->at - at);
    if ((R->flags & KVG_JSON_NUMBER_TEXT) && !isnan(v->number)) {
        v->len = R->at - at;
        v->str = kvg_malloc(v->len + 1);
        if (v->str) {
            memcpy(v->str, R->s + at, v->len);
            v->str[v->len] = 0;
        }
    }
    if (isnan(v->number) || ((R->flags & KVG_JSON_NUMBER_TEXT) && !v->str)) {
        /* (a JSON number's text reads as NaN only when its copy found no memory) */
        kvg_free(v);
        fail_memory(R);
        return NULL;
    }
    return v;
}

kvg_json *kvg_json_parse_ex(const char *text, size_t len, int max_depth, unsigned flags, size_t *end,
                            size_t *err_offset, char *err, size_t err_size) {
    reader R = {.s = text ? text : "", .len = text ? len : 0, .max_depth = max_depth, .flags = flags};
    kvg_json *v = read_value(&R, 0);
    if (!R.failed && end) *end = R.at;
    if (!R.failed && !end) {
        skip_space(&R);
        if (R.at < R.len) fail_at(&R, R.at, "text after the value");
    }
    if (!R.failed) return v;
    kvg_json_free(v);
    if (err_offset) *err_offset = R.no_memory ? KVG_JSON_NO_MEMORY : R.err_at;
    if (err && err_size) {
        if (R.no_memory) snprintf(err, err_size, "out of memory");
        else snprintf(err, err_size, "not valid JSON at byte %zu: %s", R.err_at, R.what);
    }
    return NULL;
}

kvg_json *kvg_json_parse(const char *text, size_t len, int max_depth, size_t *err_offset, char *err, size_t err_size) {
    return kvg_json_parse_ex(text, len, max_depth, 0, NULL, err_offset, err, err_size);
}

/* ---- values ---------------------------------------------------------------------------------- */

void kvg_json_free(kvg_json *v) {
    if (!v) return;
    for (kvg_json *c = v->child, *next; c; c = next) {
        next = c->next;
        kvg_json_free(c);
    }
    kvg_free(v->str);
    kvg_free(v->key);
    kvg_free(v);
}

kvg_json *kvg_json_get(const kvg_json *object, const char *key) {
    if (!object || object->type != KVG_JSON_OBJECT || !key) return NULL;
    size_t n = strlen(key);
    for (kvg_json *c = object->child; c; c = c->next)
        if (c->key && c->key_len == n && memcmp(c->key, key, n) == 0) return c;
    return NULL;
}

kvg_json *kvg_json_item(const kvg_json *array, size_t i) {
    if (!array || (array->type != KVG_JSON_ARRAY && array->type != KVG_JSON_OBJECT)) return NULL;
    kvg_json *c = array->child;
    while (c && i--) c = c->next;
    return c;
}

const char *kvg_json_get_string(const kvg_json *object, const char *key, size_t *len) {
    const kvg_json *v = kvg_json_get(object, key);
    if (!v || v->type != KVG_JSON_STRING) return NULL;
    if (len) *len = v->len;
    return v->str;
}

kvg_json *kvg_json_new(kvg_json_type type) {
    kvg_json *v = kvg_calloc(1, sizeof *v);
    if (v) v->type = type;
    return v;
}

kvg_json *kvg_json_new_number(double x) {
    kvg_json *v = kvg_json_new(KVG_JSON_NUMBER);
    if (v) v->number = x;
    return v;
}

kvg_json *kvg_json_new_bool(bool x) { return kvg_json_new(x ? KVG_JSON_TRUE : KVG_JSON_FALSE); }

kvg_json *kvg_json_new_string(const char *s, size_t len) {
    kvg_json *v = kvg_json_new(KVG_JSON_STRING);
    if (!v) return NULL;
    v->str = kvg_malloc(len + 1);
    if (!v->str) {
        kvg_free(v);
        return NULL;
    }
    if (len) memcpy(v->str, s, len); /* NUL bytes included */
    v->str[len] = 0;
    v->len = len;
    return v;
}

size_t kvg_json_remove(kvg_json *object, const char *key) {
    size_t removed = 0;
    if (!object || object->type != KVG_JSON_OBJECT) return 0;
    kvg_json **at = &object->child, *prev = NULL;
    while (*at) {
        if ((*at)->key && strcmp((*at)->key, key) == 0) {
            kvg_json *gone = *at;
            *at = gone->next;
            gone->next = NULL;
            kvg_json_free(gone);
            object->n--;
            removed++;
            continue;
        }
        prev = *at;
        at = &(*at)->next;
    }
    object->last = prev;
    return removed;
}

kvg_json *kvg_json_add(kvg_json *container, const char *key, kvg_json *v) {
    if (!v) return NULL;
    if (!container || (container->type != KVG_JSON_ARRAY && container->type != KVG_JSON_OBJECT) ||
        (container->type == KVG_JSON_OBJECT) != (key != NULL)) {
        kvg_json_free(v);
        return NULL;
    }
    if (key) {
        size_t n = strlen(key);
        char *k = kvg_malloc(n + 1);
        if (!k) {
            kvg_json_free(v);
            return NULL;
        }
        memcpy(k, key, n + 1);
        kvg_free(v->key);
        v->key = k;
        v->key_len = n;
    }
    /* the hint, then on to the end (children linked by hand past it are kept) */
    kvg_json *t = container->last ? container->last : container->child;
    while (t && t->next) t = t->next;
    if (t) t->next = v;
    else container->child = v;
    container->last = v;
    container->n++;
    return v;
}

/* ---- the writer ------------------------------------------------------------------------------ */

static int put(kvg_buf *b, const char *s, size_t n) { return kvg_buf_add(b, s, n) ? 0 : -1; }

int kvg_json_write_string(kvg_buf *b, const char *s, size_t len) {
    if (put(b, "\"", 1)) return -1;
    size_t run = 0; /* bytes written as they are, from i - run */
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r"
                        : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (!e && c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            e = esc;
        }
        if (!e) {
            run++;
            continue;
        }
        if (put(b, s + i - run, run) || put(b, e, strlen(e))) return -1;
        run = 0;
    }
    if (put(b, s + len - run, run)) return -1;
    return put(b, "\"", 1);
}

int kvg_json_write_number(kvg_buf *b, double v) {
    char t[40];
    if (!isfinite(v)) return put(b, "null", 4);
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(t, sizeof t, "%.0f", v);
    } else {
        /* a normal double's shortest text that reads back has at most 15 digits when %.15g's
         * does (it rounds to that text padded with zeros, which %g drops); a subnormal one has
         * fewer digits of its own, so every precision is tried */
        for (int prec = fabs(v) >= DBL_MIN ? 15 : 1; prec <= 17; prec++) {
            snprintf(t, sizeof t, "%.*g", prec, v);
            if (strtod(t, NULL) == v) break;
        }
        char point = locale_point();
        if (point != '.') {
            char *p = strchr(t, point);
            if (p) *p = '.';
        }
    }
    return put(b, t, strlen(t));
}

int kvg_json_write(kvg_buf *b, const kvg_json *v) {
    if (!v) return put(b, "null", 4);
    switch (v->type) {
    case KVG_JSON_NULL: return put(b, "null", 4);
    case KVG_JSON_FALSE: return put(b, "false", 5);
    case KVG_JSON_TRUE: return put(b, "true", 4);
    case KVG_JSON_NUMBER: return v->str ? put(b, v->str, v->len) : kvg_json_write_number(b, v->number);
    case KVG_JSON_STRING: return kvg_json_write_string(b, v->str ? v->str : "", v->str ? v->len : 0);
    case KVG_JSON_ARRAY:
    case KVG_JSON_OBJECT: {
        bool obj = v->type == KVG_JSON_OBJECT;
        if (put(b, obj ? "{" : "[", 1)) return -1;
        for (const kvg_json *c = v->child; c; c = c->next) {
            if (c != v->child && put(b, ",", 1)) return -1;
            if (obj && (kvg_json_write_string(b, c->key ? c->key : "", c->key ? c->key_len : 0) || put(b, ":", 1)))
                return -1;
            if (kvg_json_write(b, c)) return -1;
        }
        return put(b, obj ? "}" : "]", 1);
    }
    }
    return put(b, "null", 4);
}

char *kvg_json_print(const kvg_json *v, size_t *len) {
    kvg_buf b = {0};
    if (kvg_json_write(&b, v) || !b.p) {
        kvg_free(b.p);
        return NULL;
    }
    if (len) *len = b.n;
    return b.p;
}
