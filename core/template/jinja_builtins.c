/* jinja_builtins.c: the filters, tests, methods and global functions templates call, each kind
 * a table of rows {name, function, mode} looked up by name: a builtin is one row and one small
 * function (a mode tells apart the rows that share one, such as lower/upper/title). The
 * string helpers behind them (strip, case, replace, split) and tojson live here too. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "jinja_internal.h"
#include "kvg_json.h"

/* json.dumps(ensure_ascii=False), as transformers' tojson filter. Numbers are written here, not
 * by kvg_json_write_number: Python prints an integral float as 1.0 (the codec: 1), non-finite
 * ones as NaN and Infinity (the codec: null), and a 64-bit integer exactly (the codec takes a
 * double). */
static void tojson(jx *x, sbuf *b, const jv *v, int indent, int level, size_t pos) {
    char num[64];
    if (level > MAX_DEPTH) kvg_jx_fail(x, pos, "tojson: value nested too deeply");
    switch (v->t) {
    case V_UNDEF: kvg_jx_fail(x, pos, "tojson: value is undefined");
    case V_NONE: kvg_sb_c(x, b, "null"); break;
    case V_BOOL: kvg_sb_c(x, b, v->b ? "true" : "false"); break;
    case V_INT: snprintf(num, sizeof num, "%lld", (long long)v->i); kvg_sb_c(x, b, num); break;
    case V_FLOAT:
        kvg_jv_fmt_float(num, sizeof num, v->f);
        kvg_sb_c(x, b, strcmp(num, "nan") == 0 ? "NaN" : strcmp(num, "inf") == 0 ? "Infinity"
                       : strcmp(num, "-inf") == 0 ? "-Infinity" : num);
        break;
    case V_STR: {
        /* kvg_json_write_string's escapes are json.dumps's: a run of equally flagged bytes at a
         * time, so each piece of output keeps the flag of the bytes it stands for */
        const jstr *s = v->s;
        kvg_sb_c(x, b, "\"");
        for (size_t i = 0, k; i < s->n; i = k) {
            int flag = s->u ? s->u[i] : 0;
            k = i + 1;
            while (k < s->n && (s->u ? s->u[k] : 0) == flag) k++;
            x->scratch.n = 0;
            if (kvg_json_write_string(&x->scratch, s->p + i, k - i)) kvg_jx_fail(x, x->at, "out of memory");
            kvg_sb_add(x, b, x->scratch.p + 1, x->scratch.n - 2, NULL, flag); /* without its quotes */
        }
        kvg_sb_c(x, b, "\"");
        break;
    }
    case V_LIST:
    case V_DICT: {
        int is_list = v->t == V_LIST;
        size_t n = is_list ? v->l->n : v->d->n;
        kvg_sb_c(x, b, is_list ? "[" : "{");
        for (size_t i = 0; i < n; i++) {
            if (i) kvg_sb_c(x, b, indent >= 0 ? "," : ", ");
            if (indent >= 0) {
                kvg_sb_c(x, b, "\n");
                for (int k = 0; k < indent * (level + 1); k++) kvg_sb_c(x, b, " ");
            }
            if (!is_list) {
                /* json.dumps writes other keys as the strings of their JSON text */
                const jv *key = &v->d->k[i];
                jv k = key->t == V_STR    ? *key
                       : key->t == V_NONE ? mk_str(kvg_jstr_c(x, "null"))
                       : key->t == V_BOOL ? mk_str(kvg_jstr_c(x, key->b ? "true" : "false"))
                                          : mk_str(kvg_jv_str(x, key));
                tojson(x, b, &k, indent, level + 1, pos);
                kvg_sb_c(x, b, ": ");
            }
            tojson(x, b, is_list ? &v->l->v[i] : &v->d->v[i], indent, level + 1, pos);
        }
        if (indent >= 0 && n) {
            kvg_sb_c(x, b, "\n");
            for (int k = 0; k < indent * level; k++) kvg_sb_c(x, b, " ");
        }
        kvg_sb_c(x, b, is_list ? "]" : "}");
        break;
    }
    default: kvg_jx_fail(x, pos, "tojson: a %s is not serializable", kvg_jv_type_name(v));
    }
}

static int64_t f_to_i_checked(jx *x, double f, const char *what, size_t pos) {
    if (isnan(f) || f >= 9223372036854775808.0 || f < -9223372036854775808.0)
        kvg_jx_fail(x, pos, "%s: %g is outside the 64-bit integer range", what, f);
    return (int64_t)f;
}

static const jstr *arg_str(jx *x, const args *a, int i, const char *kw, const char *what, size_t pos) {
    jv v = arg(a, i, kw);
    if (v.t != V_STR) kvg_jx_fail(x, pos, "%s: argument %d must be a string, got a %s", what, i, kvg_jv_type_name(&v));
    return v.s;
}

static int is_space_c(char c, const jstr *chars) {
    if (!chars) return is_ws(c);
    return memchr(chars->p, c, chars->n) != NULL;
}
static jv strip(jx *x, const jstr *s, const jstr *chars, int left, int right) {
    size_t a = 0, b = s->n;
    if (left)
        while (a < b && is_space_c(s->p[a], chars)) a++;
    if (right)
        while (b > a && is_space_c(s->p[b - 1], chars)) b--;
    return mk_str(kvg_jstr_sub(x, s, a, b));
}

static jv str_case(jx *x, const jstr *s, int mode) { /* 0 lower, 1 upper, 2 title, 3 capitalize */
    jstr *d = kvg_jstr_new(x, s->p, s->n, s->u);
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

static jv str_replace(jx *x, const jstr *s, const jstr *old, const jstr *rep, int64_t count) {
    sbuf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (old->n == 0) {
        for (; i <= s->n && (count < 0 || done < count); i++, done++) {
            kvg_sb_str(x, &b, rep);
            if (i < s->n) kvg_sb_add(x, &b, s->p + i, 1, s->u ? s->u + i : NULL, 0);
        }
        if (i < s->n) kvg_sb_add(x, &b, s->p + i, s->n - i, s->u ? s->u + i : NULL, 0);
        return mk_str(kvg_sb_done(x, &b));
    }
    while (i < s->n) {
        kvg_jx_charge(x, old->n);
        if ((count < 0 || done < count) && i + old->n <= s->n && memcmp(s->p + i, old->p, old->n) == 0) {
            kvg_sb_str(x, &b, rep);
            i += old->n;
            done++;
        } else {
            kvg_sb_add(x, &b, s->p + i, 1, s->u ? s->u + i : NULL, 0);
            i++;
        }
    }
    return mk_str(kvg_sb_done(x, &b));
}

static jv str_split(jx *x, const jstr *s, const jstr *sep, int64_t maxsplit, size_t pos) {
    jlist *l = kvg_jlist_new(x);
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
            kvg_jlist_push(x, l, mk_str(kvg_jstr_sub(x, s, i, e)));
            done++;
            i = k;
        }
        return (jv){.t = V_LIST, .l = l};
    }
    if (sep->n == 0) kvg_jx_fail(x, pos, "split: empty separator");
    size_t start = 0, i = 0;
    int64_t done = 0;
    while (i + sep->n <= s->n) {
        kvg_jx_charge(x, sep->n);
        if ((maxsplit < 0 || done < maxsplit) && memcmp(s->p + i, sep->p, sep->n) == 0) {
            kvg_jlist_push(x, l, mk_str(kvg_jstr_sub(x, s, start, i)));
            i += sep->n;
            start = i;
            done++;
        } else {
            i++;
        }
    }
    kvg_jlist_push(x, l, mk_str(kvg_jstr_sub(x, s, start, s->n)));
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


static jv join(jx *x, const jlist *l, const jstr *sep, const char *attribute, size_t pos) {
    sbuf b = {0};
    for (size_t i = 0; i < l->n; i++) {
        if (i && sep) kvg_sb_str(x, &b, sep);
        jv v = attribute ? kvg_jv_attr(x, &l->v[i], attribute, pos) : l->v[i];
        kvg_sb_str(x, &b, kvg_jv_str(x, &v));
    }
    return mk_str(kvg_sb_done(x, &b));
}

static int64_t length(jx *x, const jv *v, size_t pos) {
    if (v->t == V_STR) {
        int64_t k = 0;
        for (size_t i = 0; i < v->s->n; i++) k += ((unsigned char)v->s->p[i] & 0xC0) != 0x80;
        return k;
    }
    if (v->t == V_LIST) return (int64_t)v->l->n;
    if (v->t == V_DICT) return (int64_t)v->d->n;
    if (v->t == V_UNDEF) return 0;
    kvg_jx_fail(x, pos, "a %s has no length", kvg_jv_type_name(v));
}

/* ---- methods: obj.name(...) on a string or a dict ---------------------------------------- */

typedef struct jmethod {
    const char *name;
    int type; /* V_STR or V_DICT */
    jv (*fn)(jx *x, const jv *obj, const args *a, size_t pos, int mode);
    int mode;
} jmethod;

enum { STRIP_LEFT = 1, STRIP_RIGHT = 2 };
enum { CASE_LOWER, CASE_UPPER, CASE_TITLE, CASE_CAPITALIZE };

/* the characters a strip() takes off: its first argument when a string, else whitespace */
static const jstr *strip_chars(const args *a) {
    jv c0 = arg(a, 0, NULL);
    return c0.t == V_STR ? c0.s : NULL;
}

static jv m_strip(jx *x, const jv *obj, const args *a, size_t pos, int mode) {
    (void)pos;
    return strip(x, obj->s, strip_chars(a), mode & STRIP_LEFT, mode & STRIP_RIGHT);
}
static jv m_case(jx *x, const jv *obj, const args *a, size_t pos, int mode) {
    (void)a, (void)pos;
    return str_case(x, obj->s, mode);
}
static jv m_affix(jx *x, const jv *obj, const args *a, size_t pos, int end) {
    (void)x, (void)pos;
    jv c0 = arg(a, 0, NULL);
    return mk_bool(affix(obj->s, &c0, end));
}
static jv m_split(jx *x, const jv *obj, const args *a, size_t pos, int mode) {
    (void)mode;
    jv m = arg(a, 1, "maxsplit");
    return str_split(x, obj->s, strip_chars(a), m.t == V_INT ? m.i : -1, pos);
}
static jv m_replace(jx *x, const jv *obj, const args *a, size_t pos, int mode) {
    (void)mode;
    jv cnt = arg(a, 2, "count");
    return str_replace(x, obj->s, arg_str(x, a, 0, NULL, "replace", pos), arg_str(x, a, 1, NULL, "replace", pos),
                       cnt.t == V_INT ? cnt.i : -1);
}
static jv m_find(jx *x, const jv *obj, const args *a, size_t pos, int mode) {
    (void)mode;
    const jstr *s = obj->s, *n = arg_str(x, a, 0, NULL, "find", pos);
    for (size_t i = 0; i + n->n <= s->n; i++) {
        kvg_jx_charge(x, n->n + 1);
        if (memcmp(s->p + i, n->p, n->n) == 0) return mk_int((int64_t)i);
    }
    return mk_int(-1);
}
static jv m_count(jx *x, const jv *obj, const args *a, size_t pos, int mode) {
    (void)mode;
    const jstr *s = obj->s, *n = arg_str(x, a, 0, NULL, "count", pos);
    int64_t k = 0;
    if (!n->n) return mk_int((int64_t)s->n + 1);
    for (size_t i = 0; i + n->n <= s->n;)
        if (kvg_jx_charge(x, n->n), memcmp(s->p + i, n->p, n->n) == 0) {
            k++;
            i += n->n;
        } else {
            i++;
        }
    return mk_int(k);
}

enum { DICT_ITEMS, DICT_KEYS, DICT_VALUES };

/* items() as (key, value) tuples, keys() or values(), in insertion order */
static jv m_dict_list(jx *x, const jv *obj, const args *a, size_t pos, int mode) {
    (void)a, (void)pos;
    jlist *l = kvg_jlist_new(x);
    for (size_t i = 0; i < obj->d->n; i++) {
        jv k = obj->d->k[i];
        if (mode == DICT_ITEMS) {
            jlist *pair = kvg_jlist_new(x);
            pair->tuple = 1;
            kvg_jlist_push(x, pair, k);
            kvg_jlist_push(x, pair, obj->d->v[i]);
            kvg_jlist_push(x, l, mk_list(pair));
        } else {
            kvg_jlist_push(x, l, mode == DICT_KEYS ? k : obj->d->v[i]);
        }
    }
    return mk_list(l);
}
/* Python's str.format: "{}" (the next positional argument), "{0}", "{name}" (a keyword
 * argument), each optionally followed by .attribute or [index] lookups and !s; "{{" and "}}"
 * are braces. Values are written as str() writes them. Format specifications (":>5") and !r
 * are refused, as is mixing "{}" with "{0}". */
static jv m_format(jx *x, const jv *obj, const args *a, size_t pos, int mode) {
    (void)mode;
    const jstr *f = obj->s;
    sbuf b = {0};
    int next = 0, manual = -1; /* -1: not known yet, 0: "{}" seen, 1: "{0}" seen */
    for (size_t i = 0; i < f->n;) {
        char c = f->p[i];
        if (c == '}') {
            if (i + 1 < f->n && f->p[i + 1] == '}') {
                kvg_sb_add(x, &b, "}", 1, NULL, 0);
                i += 2;
                continue;
            }
            kvg_jx_fail(x, pos, "format: single '}' in the format string");
        }
        if (c != '{') {
            size_t k = i;
            while (k < f->n && f->p[k] != '{' && f->p[k] != '}') k++;
            kvg_sb_add(x, &b, f->p + i, k - i, f->u ? f->u + i : NULL, 0);
            i = k;
            continue;
        }
        if (i + 1 < f->n && f->p[i + 1] == '{') {
            kvg_sb_add(x, &b, "{", 1, NULL, 0);
            i += 2;
            continue;
        }
        size_t k = ++i;
        while (k < f->n && f->p[k] != '}' && f->p[k] != '{') k++;
        if (k >= f->n || f->p[k] != '}') kvg_jx_fail(x, pos, "format: single '{' in the format string");
        /* the field: name, then lookups, then !conversion / :spec */
        size_t e = i;
        while (e < k && f->p[e] != '.' && f->p[e] != '[' && f->p[e] != '!' && f->p[e] != ':') e++;
        jv v = UNDEF;
        if (e == i) {
            if (manual == 1) kvg_jx_fail(x, pos, "format: cannot switch from numbered fields to automatic numbering");
            manual = 0;
            if (next >= a->n) kvg_jx_fail(x, pos, "format: no positional argument %d", next);
            v = a->v[next++];
        } else if (f->p[i] >= '0' && f->p[i] <= '9') {
            if (manual == 0) kvg_jx_fail(x, pos, "format: cannot switch from automatic numbering to numbered fields");
            manual = 1;
            int64_t n = 0;
            for (size_t d = i; d < e; d++) {
                if (f->p[d] < '0' || f->p[d] > '9' || n > 1000000)
                    kvg_jx_fail(x, pos, "format: bad field \"%.*s\"", (int)(k - i), f->p + i);
                n = n * 10 + (f->p[d] - '0');
            }
            if (n >= a->n) kvg_jx_fail(x, pos, "format: no positional argument %lld", (long long)n);
            v = a->v[n];
        } else {
            const char *name = kvg_jx_cstr(x, f->p + i, e - i);
            int found = 0;
            for (int q = 0; q < a->nkw; q++)
                if (strcmp(a->kwn[q], name) == 0) {
                    v = a->kwv[q];
                    found = 1;
                }
            if (!found) kvg_jx_fail(x, pos, "format: no keyword argument '%s'", name);
        }
        while (e < k && (f->p[e] == '.' || f->p[e] == '[')) {
            if (f->p[e] == '.') {
                size_t s0 = ++e;
                while (e < k && f->p[e] != '.' && f->p[e] != '[' && f->p[e] != '!' && f->p[e] != ':') e++;
                v = kvg_jv_attr(x, &v, kvg_jx_cstr(x, f->p + s0, e - s0), pos);
            } else {
                size_t s0 = ++e;
                while (e < k && f->p[e] != ']') e++;
                if (e >= k) kvg_jx_fail(x, pos, "format: missing ']' in the format string");
                int digits = e > s0;
                int64_t n = 0;
                for (size_t d = s0; d < e && digits; d++) {
                    if (f->p[d] < '0' || f->p[d] > '9' || n > 1000000) digits = 0;
                    else n = n * 10 + (f->p[d] - '0');
                }
                jv key = digits ? mk_int(n) : mk_str(kvg_jstr_new(x, f->p + s0, e - s0, NULL));
                v = kvg_jv_item(x, &v, &key, pos);
                e++;
            }
            if (v.t == V_UNDEF) kvg_jx_fail(x, pos, "format: \"%.*s\" is not there", (int)(k - i), f->p + i);
        }
        if (e + 2 == k && f->p[e] == '!' && f->p[e + 1] == 's') e = k;
        if (e != k)
            kvg_jx_fail(x, pos, "format: \"%.*s\": conversions and format specifications are not supported",
                        (int)(k - i), f->p + i);
        kvg_sb_str(x, &b, kvg_jv_str(x, &v));
        i = k + 1;
    }
    return mk_str(kvg_sb_done(x, &b));
}
static jv m_get(jx *x, const jv *obj, const args *a, size_t pos, int mode) {
    (void)mode;
    jv k = arg(a, 0, NULL);
    jv v = kvg_jv_item(x, obj, &k, pos);
    if (v.t == V_UNDEF) {
        jv d = arg(a, 1, "default");
        return d.t == V_UNDEF ? NONE : d;
    }
    return v;
}

static const jmethod methods[] = {
    {"strip", V_STR, m_strip, STRIP_LEFT | STRIP_RIGHT},
    {"lstrip", V_STR, m_strip, STRIP_LEFT},
    {"rstrip", V_STR, m_strip, STRIP_RIGHT},
    {"lower", V_STR, m_case, CASE_LOWER},
    {"upper", V_STR, m_case, CASE_UPPER},
    {"title", V_STR, m_case, CASE_TITLE},
    {"capitalize", V_STR, m_case, CASE_CAPITALIZE},
    {"startswith", V_STR, m_affix, 0},
    {"endswith", V_STR, m_affix, 1},
    {"split", V_STR, m_split, 0},
    {"replace", V_STR, m_replace, 0},
    {"find", V_STR, m_find, 0},
    {"count", V_STR, m_count, 0},
    {"format", V_STR, m_format, 0},
    {"items", V_DICT, m_dict_list, DICT_ITEMS},
    {"keys", V_DICT, m_dict_list, DICT_KEYS},
    {"values", V_DICT, m_dict_list, DICT_VALUES},
    {"get", V_DICT, m_get, 0},
};

jv kvg_jinja_method(jx *x, const jv *obj, const char *name, const args *a, size_t pos, int *found) {
    for (size_t i = 0; i < sizeof methods / sizeof *methods; i++)
        if (methods[i].type == obj->t && strcmp(methods[i].name, name) == 0) {
            *found = 1;
            return methods[i].fn(x, obj, a, pos, methods[i].mode);
        }
    *found = 0;
    return UNDEF;
}

/* ---- tests: v is name(o) ------------------------------------------------------------------ */

typedef struct jtest jtest;
struct jtest {
    const char *name;
    int (*fn)(jx *x, const jv *v, const jv *o, size_t pos, const jtest *self);
    int mode;
};

#define TYPES(t) (1 << (t))

/* the value's type is one of the mask's */
static int t_type(jx *x, const jv *v, const jv *o, size_t pos, const jtest *self) {
    (void)x, (void)o, (void)pos;
    return (self->mode & TYPES(v->t)) != 0;
}
static int t_bool(jx *x, const jv *v, const jv *o, size_t pos, const jtest *self) {
    (void)x, (void)o, (void)pos;
    return v->t == V_BOOL && !v->b == !self->mode;
}
static int t_even(jx *x, const jv *v, const jv *o, size_t pos, const jtest *self) {
    (void)o;
    if (v->t != V_INT) kvg_jx_fail(x, pos, "test '%s' needs an integer, got a %s", self->name, kvg_jv_type_name(v));
    return (v->i % 2 == 0) == self->mode;
}
static int t_divisibleby(jx *x, const jv *v, const jv *o, size_t pos, const jtest *self) {
    (void)self;
    if (!num(v) || !num(o) || as_i(o) == 0) kvg_jx_fail(x, pos, "test 'divisibleby' needs non-zero integers");
    int64_t d = as_i(o);
    return d == -1 || as_i(v) % d == 0; /* INT64_MIN % -1 overflows in C */
}

enum { EQ_EQUAL, EQ_NOT_EQUAL, EQ_SAME };

static int t_equal(jx *x, const jv *v, const jv *o, size_t pos, const jtest *self) {
    (void)pos;
    switch (self->mode) {
    case EQ_EQUAL: return kvg_jv_equal(x, v, o);
    case EQ_NOT_EQUAL: return !kvg_jv_equal(x, v, o);
    default: return kvg_jv_equal(x, v, o) && v->t == o->t;
    }
}
static int t_in(jx *x, const jv *v, const jv *o, size_t pos, const jtest *self) {
    (void)self;
    return kvg_jv_contains(x, o, v, pos);
}

enum { CMP_LT, CMP_LE, CMP_GT, CMP_GE };

static int t_compare(jx *x, const jv *v, const jv *o, size_t pos, const jtest *self) {
    int c = kvg_jv_compare(x, v, o, pos);
    switch (self->mode) {
    case CMP_LT: return c < 0;
    case CMP_LE: return c <= 0;
    case CMP_GT: return c > 0;
    default: return c >= 0;
    }
}
/* a string that lower() or upper() leaves as it is */
static int t_case(jx *x, const jv *v, const jv *o, size_t pos, const jtest *self) {
    (void)o, (void)pos;
    return v->t == V_STR && kvg_jstr_eq(str_case(x, v->s, self->mode).s, v->s->p, v->s->n);
}

static const jtest tests[] = {
    {"defined", t_type, ~TYPES(V_UNDEF)},
    {"undefined", t_type, TYPES(V_UNDEF)},
    {"none", t_type, TYPES(V_NONE)},
    {"string", t_type, TYPES(V_STR)},
    {"number", t_type, TYPES(V_INT) | TYPES(V_FLOAT)},
    {"integer", t_type, TYPES(V_INT)},
    {"float", t_type, TYPES(V_FLOAT)},
    {"boolean", t_type, TYPES(V_BOOL)},
    {"true", t_bool, 1},
    {"false", t_bool, 0},
    {"mapping", t_type, TYPES(V_DICT)},
    {"sequence", t_type, TYPES(V_LIST) | TYPES(V_STR) | TYPES(V_DICT)},
    {"iterable", t_type, TYPES(V_LIST) | TYPES(V_STR) | TYPES(V_DICT)},
    {"callable", t_type, TYPES(V_MACRO) | TYPES(V_FUNC)},
    {"even", t_even, 1},
    {"odd", t_even, 0},
    {"divisibleby", t_divisibleby, 0},
    {"eq", t_equal, EQ_EQUAL},
    {"equalto", t_equal, EQ_EQUAL},
    {"==", t_equal, EQ_EQUAL},
    {"ne", t_equal, EQ_NOT_EQUAL},
    {"!=", t_equal, EQ_NOT_EQUAL},
    {"sameas", t_equal, EQ_SAME},
    {"in", t_in, 0},
    {"lt", t_compare, CMP_LT},
    {"<", t_compare, CMP_LT},
    {"le", t_compare, CMP_LE},
    {"<=", t_compare, CMP_LE},
    {"gt", t_compare, CMP_GT},
    {">", t_compare, CMP_GT},
    {"ge", t_compare, CMP_GE},
    {">=", t_compare, CMP_GE},
    {"lower", t_case, CASE_LOWER},
    {"upper", t_case, CASE_UPPER},
};

int kvg_jinja_test(jx *x, const char *name, const jv *v, const args *a, size_t pos) {
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++)
        if (strcmp(tests[i].name, name) == 0) {
            jv o = arg(a, 0, NULL);
            return tests[i].fn(x, v, &o, pos, &tests[i]);
        }
    kvg_jx_fail(x, pos, "unknown test '%s'", name);
}

/* ---- filters: v | name(...) --------------------------------------------------------------- */

typedef struct jfilter jfilter;
struct jfilter {
    const char *name;
    jv (*fn)(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self);
    int mode;
};

static jv f_trim(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)pos, (void)self;
    if (v->t != V_STR) return strip(x, kvg_jv_str(x, v), NULL, 1, 1);
    jv c = arg(a, 0, "chars");
    return strip(x, v->s, c.t == V_STR ? c.s : NULL, 1, 1);
}
static jv f_length(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)a, (void)self;
    return mk_int(length(x, v, pos));
}
static jv f_string(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)a, (void)pos, (void)self;
    return mk_str(kvg_jv_str(x, v));
}
static jv f_case(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)a, (void)pos;
    return str_case(x, kvg_jv_str(x, v), self->mode);
}
static jv f_default(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)pos, (void)self;
    jv b = arg(a, 1, "boolean");
    if (v->t == V_UNDEF || (kvg_jv_truthy(&b) && !kvg_jv_truthy(v))) {
        jv d = arg(a, 0, "default_value");
        return d.t == V_UNDEF ? mk_str(kvg_jstr_c(x, "")) : d;
    }
    return *v;
}
static jv f_tojson(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)self;
    jv ind = arg(a, 0, "indent");
    sbuf b = {0};
    tojson(x, &b, v, ind.t == V_INT ? (int)ind.i : -1, 0, pos);
    return mk_str(kvg_sb_done(x, &b));
}
static jv f_join(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)self;
    jv sep = arg(a, 0, "d");
    jv at = arg(a, 1, "attribute");
    if (sep.t != V_STR && sep.t != V_UNDEF) kvg_jx_fail(x, pos, "join: separator must be a string");
    const char *atn = at.t == V_STR ? kvg_jx_cstr(x, at.s->p, at.s->n) : NULL;
    return join(x, kvg_jv_items(x, v, pos), sep.t == V_STR ? sep.s : NULL, atn, pos);
}
/* mode 0: first, 1: last */
static jv f_first(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)a;
    jlist *l = kvg_jv_items(x, v, pos);
    if (!l->n) return UNDEF;
    return self->mode == 0 ? l->v[0] : l->v[l->n - 1];
}
static jv f_list(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)a, (void)self;
    return mk_list(kvg_jv_items(x, v, pos));
}
static jv f_reverse(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)a, (void)self;
    jv none = UNDEF, step = mk_int(-1);
    if (v->t == V_DICT) {
        jv l = mk_list(kvg_jv_items(x, v, pos));
        return kvg_jv_slice(x, &l, &none, &none, &step, pos);
    }
    return kvg_jv_slice(x, v, &none, &none, &step, pos);
}
static jv f_replace(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)self;
    jv cnt = arg(a, 2, "count");
    return str_replace(x, kvg_jv_str(x, v), arg_str(x, a, 0, "old", "replace", pos),
                       arg_str(x, a, 1, "new", "replace", pos), cnt.t == V_INT ? cnt.i : -1);
}

/* strtod over the first 63 bytes of s; *rest: where it stopped in buf */
static double leading_number(const jstr *s, char buf[64], char **rest) {
    size_t n = s->n < 63 ? s->n : 63;
    memcpy(buf, s->p, n);
    buf[n] = 0;
    return strtod(buf, rest);
}
static jv f_int(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)self;
    if (v->t == V_INT) return *v;
    if (v->t == V_FLOAT) return mk_int(f_to_i_checked(x, v->f, "int", pos));
    if (num(v)) return mk_int(as_i(v));
    if (v->t == V_STR) {
        char buf[64], *end;
        double f = leading_number(v->s, buf, &end);
        while (*end && is_ws(*end)) end++;
        if (end != buf && !*end) return mk_int(f_to_i_checked(x, f, "int", pos));
    }
    jv d = arg(a, 0, "default");
    return d.t == V_UNDEF ? mk_int(0) : d;
}
static jv f_float(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)x, (void)a, (void)pos, (void)self;
    if (num(v)) return mk_float(as_f(v));
    if (v->t == V_STR) {
        char buf[64], *end;
        double f = leading_number(v->s, buf, &end);
        if (end != buf) return mk_float(f);
    }
    return mk_float(0);
}
static jv f_abs(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)a, (void)self;
    if (v->t == V_INT) return mk_int(v->i < 0 ? (int64_t)(0 - (uint64_t)v->i) : v->i); /* abs(min) wraps */
    if (num(v)) return mk_float(fabs(as_f(v)));
    kvg_jx_fail(x, pos, "abs: a %s is not a number", kvg_jv_type_name(v));
}
static jv f_items(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)self;
    if (v->t == V_UNDEF) return mk_list(kvg_jlist_new(x));
    if (v->t != V_DICT) kvg_jx_fail(x, pos, "items: a %s is not a dict", kvg_jv_type_name(v));
    return m_dict_list(x, v, a, pos, DICT_ITEMS);
}

enum { SELECT_ON_ATTR = 1, SELECT_KEEP = 2 };

/* select, reject (by a test of each item, or its truth) and selectattr, rejectattr (of an attribute) */
static jv f_select(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    const char *name = self->name;
    int on_attr = (self->mode & SELECT_ON_ATTR) != 0, keep = (self->mode & SELECT_KEEP) != 0;
    if (v->t == V_NONE || v->t == V_UNDEF) return mk_list(kvg_jlist_new(x)); /* as jinja2: nothing to select */
    jlist *in = kvg_jv_items(x, v, pos), *outl = kvg_jlist_new(x);
    int base = on_attr ? 1 : 0;
    jv tn = arg(a, base, NULL);
    if (on_attr && arg(a, 0, NULL).t != V_STR) kvg_jx_fail(x, pos, "%s: the attribute must be a string", name);
    if (tn.t != V_UNDEF && tn.t != V_STR) kvg_jx_fail(x, pos, "%s: the test name must be a string", name);
    const char *tname = tn.t == V_STR ? kvg_jx_cstr(x, tn.s->p, tn.s->n) : NULL;
    args ta = {0};
    for (int i = base + 1; i < a->n && ta.n < 16; i++) ta.v[ta.n++] = a->v[i];
    const char *an = on_attr ? kvg_jx_cstr(x, a->v[0].s->p, a->v[0].s->n) : NULL;
    for (size_t i = 0; i < in->n; i++) {
        jv e = on_attr ? kvg_jv_attr(x, &in->v[i], an, pos) : in->v[i];
        int ok = tname ? kvg_jinja_test(x, tname, &e, &ta, pos) : kvg_jv_truthy(&e);
        if (ok == keep) kvg_jlist_push(x, outl, in->v[i]);
    }
    return mk_list(outl);
}
static jv f_map(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)self;
    jv at = arg(a, -1, "attribute");
    if (v->t == V_NONE || v->t == V_UNDEF) return mk_list(kvg_jlist_new(x)); /* as jinja2: nothing to map */
    jlist *in = kvg_jv_items(x, v, pos), *outl = kvg_jlist_new(x);
    if (at.t == V_STR) {
        const char *an = kvg_jx_cstr(x, at.s->p, at.s->n);
        jv d = arg(a, -1, "default");
        for (size_t i = 0; i < in->n; i++) {
            jv e = kvg_jv_attr(x, &in->v[i], an, pos);
            kvg_jlist_push(x, outl, e.t == V_UNDEF && d.t != V_UNDEF ? d : e);
        }
        return mk_list(outl);
    }
    jv fn = arg(a, 0, NULL);
    if (fn.t != V_STR) kvg_jx_fail(x, pos, "map: give a filter name or attribute=");
    const char *fname = kvg_jx_cstr(x, fn.s->p, fn.s->n);
    args fa = {0};
    for (int i = 1; i < a->n && fa.n < 16; i++) fa.v[fa.n++] = a->v[i];
    for (size_t i = 0; i < in->n; i++) kvg_jlist_push(x, outl, kvg_jinja_filter(x, fname, &in->v[i], &fa, pos));
    return mk_list(outl);
}
static jv f_dictsort(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)self;
    if (v->t != V_DICT) kvg_jx_fail(x, pos, "dictsort: a %s is not a dict", kvg_jv_type_name(v));
    jv items = m_dict_list(x, v, a, pos, DICT_ITEMS);
    jlist *l = items.l;
    for (size_t i = 1; i < l->n; i++) /* insertion sort by key: dicts in templates are small */
        for (size_t k = i; k > 0 && kvg_jv_compare(x, &l->v[k - 1].l->v[0], &l->v[k].l->v[0], pos) > 0; k--) {
            jv t = l->v[k];
            l->v[k] = l->v[k - 1];
            l->v[k - 1] = t;
        }
    return items;
}
static jv f_indent(jx *x, const jv *v, const args *a, size_t pos, const jfilter *self) {
    (void)pos, (void)self;
    jv w = arg(a, 0, "width");
    jv f = arg(a, 1, "first");
    int64_t width = w.t == V_INT ? w.i : 4;
    const jstr *s = kvg_jv_str(x, v);
    sbuf b = {0};
    char pad[64];
    int np = width < 0 ? 0 : width > 63 ? 63 : (int)width;
    memset(pad, ' ', (size_t)np);
    if (kvg_jv_truthy(&f)) kvg_sb_add(x, &b, pad, (size_t)np, NULL, 0);
    for (size_t i = 0; i < s->n; i++) {
        kvg_sb_add(x, &b, s->p + i, 1, s->u ? s->u + i : NULL, 0);
        if (s->p[i] == '\n' && i + 1 < s->n && s->p[i + 1] != '\n') kvg_sb_add(x, &b, pad, (size_t)np, NULL, 0);
    }
    return mk_str(kvg_sb_done(x, &b));
}

static const jfilter filters[] = {
    {"trim", f_trim, 0},
    {"length", f_length, 0},
    {"count", f_length, 0},
    {"string", f_string, 0},
    {"upper", f_case, CASE_UPPER},
    {"lower", f_case, CASE_LOWER},
    {"title", f_case, CASE_TITLE},
    {"capitalize", f_case, CASE_CAPITALIZE},
    {"default", f_default, 0},
    {"d", f_default, 0},
    {"tojson", f_tojson, 0},
    {"join", f_join, 0},
    {"first", f_first, 0},
    {"last", f_first, 1},
    {"list", f_list, 0},
    {"reverse", f_reverse, 0},
    {"replace", f_replace, 0},
    {"int", f_int, 0},
    {"float", f_float, 0},
    {"abs", f_abs, 0},
    {"items", f_items, 0},
    {"selectattr", f_select, SELECT_ON_ATTR | SELECT_KEEP},
    {"rejectattr", f_select, SELECT_ON_ATTR},
    {"select", f_select, SELECT_KEEP},
    {"reject", f_select, 0},
    {"map", f_map, 0},
    {"dictsort", f_dictsort, 0},
    {"indent", f_indent, 0},
};

jv kvg_jinja_filter(jx *x, const char *name, const jv *v, const args *a, size_t pos) {
    for (size_t i = 0; i < sizeof filters / sizeof *filters; i++)
        if (strcmp(filters[i].name, name) == 0) return filters[i].fn(x, v, a, pos, &filters[i]);
    kvg_jx_fail(x, pos, "unknown filter '%s'", name);
}

/* ---- global functions --------------------------------------------------------------------- */

static jv g_range(jx *x, const args *a, size_t pos, int mode) {
    (void)mode;
    jv a0 = arg(a, 0, NULL), a1 = arg(a, 1, NULL), a2 = arg(a, 2, NULL);
    if (!num(&a0) || (a1.t != V_UNDEF && !num(&a1)) || (a2.t != V_UNDEF && !num(&a2)))
        kvg_jx_fail(x, pos, "range: arguments must be integers");
    int64_t lo = a1.t == V_UNDEF ? 0 : as_i(&a0), hi = a1.t == V_UNDEF ? as_i(&a0) : as_i(&a1);
    int64_t step = a2.t == V_UNDEF ? 1 : as_i(&a2);
    if (step == 0) kvg_jx_fail(x, pos, "range: step cannot be zero");
    /* the count first (in uint64: no step overflows), then one array of that size */
    uint64_t count = 0;
    if (step > 0 && lo < hi) count = ((uint64_t)hi - (uint64_t)lo - 1) / (uint64_t)step + 1;
    if (step < 0 && lo > hi) count = ((uint64_t)lo - (uint64_t)hi - 1) / (0 - (uint64_t)step) + 1;
    if (count > MAX_ITERATIONS) kvg_jx_fail(x, pos, "range: more than %d items", MAX_ITERATIONS);
    jlist *l = kvg_jlist_new(x);
    if (count) {
        l->v = kvg_jx_alloc(x, (size_t)count * sizeof *l->v);
        l->cap = (size_t)count;
    }
    for (uint64_t k = 0; k < count; k++)
        l->v[l->n++] = mk_int((int64_t)((uint64_t)lo + k * (uint64_t)step));
    return mk_list(l);
}
/* dict(...) and namespace(...) (mode 1: its attributes may be set) */
static jv g_dict(jx *x, const args *a, size_t pos, int ns) {
    (void)pos;
    jdict *d = kvg_jdict_new(x);
    d->ns = ns;
    jv init = arg(a, 0, NULL);
    if (init.t == V_DICT)
        for (size_t i = 0; i < init.d->n; i++) kvg_jdict_put(x, d, init.d->k[i], init.d->v[i], pos);
    for (int i = 0; i < a->nkw; i++) kvg_jdict_setc(x, d, a->kwn[i], a->kwv[i]);
    return (jv){.t = V_DICT, .d = d};
}
static jv g_raise(jx *x, const args *a, size_t pos, int mode) {
    (void)mode;
    jv m = arg(a, 0, NULL);
    const jstr *s = kvg_jv_str(x, &m);
    kvg_jx_fail(x, pos, "raise_exception: %.*s", (int)s->n, s->p);
}
static jv g_strftime_now(jx *x, const args *a, size_t pos, int mode) {
    (void)mode;
    jv f = arg(a, 0, NULL);
    if (f.t != V_STR) kvg_jx_fail(x, pos, "strftime_now: the format must be a string");
    char fmtc[256], buf[512];
    size_t n = f.s->n < sizeof fmtc - 1 ? f.s->n : sizeof fmtc - 1;
    memcpy(fmtc, f.s->p, n);
    fmtc[n] = 0;
    time_t now = time(NULL);
    struct tm tmv, *tp = localtime(&now);
    if (tp) tmv = *tp;
    else memset(&tmv, 0, sizeof tmv);
    size_t k = strftime(buf, sizeof buf, fmtc, &tmv);
    return mk_str(kvg_jstr_new(x, buf, k, NULL));
}

const jglobal kvg_jinja_globals[] = {
    {"range", g_range, 0},
    {"namespace", g_dict, 1},
    {"dict", g_dict, 0},
    {"raise_exception", g_raise, 0},
    {"strftime_now", g_strftime_now, 0},
};
const size_t kvg_jinja_n_globals = sizeof kvg_jinja_globals / sizeof *kvg_jinja_globals;
