/* jinja_value.c: the template interpreter's memory and values: the arena of a parse or a
 * render (its bound on live memory and on work, and the failure path that unwinds to the entry
 * point), strings with their content flags, lists and dicts, and what Python does with values:
 * str(), ==, ordering, `in`, iteration, indexing, slicing and attributes. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "jinja_internal.h"
#include "kvg_host.h"

/* ---- arena and failure ------------------------------------------------------------------ */

_Noreturn void kvg_jx_fail(jx *x, size_t pos, const char *fmt, ...) {
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

_Noreturn void kvg_jx_too_big(jx *x) {
    kvg_jx_fail(x, x->at, "template needs more than %d MiB of memory", MAX_MEMORY >> 20);
}

void *kvg_jx_alloc(jx *x, size_t n) {
    if (n > MAX_MEMORY) kvg_jx_too_big(x);
    n = (n + 15) & ~(size_t)15;
    if (n >= BIG_ALLOC) {
        if (x->total + n > MAX_MEMORY) kvg_jx_too_big(x);
        block *b = kvg_malloc(sizeof *b + n);
        if (!b) kvg_jx_fail(x, x->at, "out of memory");
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
        if (x->total + cap > MAX_MEMORY) kvg_jx_too_big(x);
        b = kvg_malloc(sizeof *b + cap);
        if (!b) kvg_jx_fail(x, x->at, "out of memory");
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

void kvg_jx_release(jx *x, void *p, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!p || n < BIG_ALLOC) return;
    block *b = (block *)(void *)((unsigned char *)p - offsetof(block, data));
    if (b->prev) b->prev->next = b->next;
    else x->bigs = b->next;
    if (b->next) b->next->prev = b->prev;
    x->total -= b->cap;
    kvg_free(b);
}

void kvg_jx_charge(jx *x, uint64_t n) {
    x->work += n;
    if (x->work > MAX_WORK)
        kvg_jx_fail(x, x->at, "template does too much work (more than %llu MiB of bytes compared, searched or copied)",
                    (unsigned long long)(MAX_WORK >> 20));
}

void kvg_jx_free_all(block *b) {
    while (b) {
        block *n = b->next;
        kvg_free(b);
        b = n;
    }
}

void kvg_jx_free(jx *x) {
    kvg_jx_free_all(x->blocks);
    kvg_jx_free_all(x->bigs);
    kvg_free(x->scratch.p);
    x->blocks = x->bigs = NULL;
    x->scratch = (kvg_buf){0};
}

/* ---- strings, lists, dicts ---------------------------------------------------------------- */

jstr *kvg_jstr_new(jx *x, const char *p, size_t n, const unsigned char *u) {
    kvg_jx_charge(x, n);
    jstr *s = kvg_jx_alloc(x, sizeof *s);
    char *d = kvg_jx_alloc(x, n + 1);
    if (n) memcpy(d, p, n);
    s->p = d;
    s->n = n;
    if (u) {
        unsigned char *du = kvg_jx_alloc(x, n + 1);
        int any = 0;
        for (size_t i = 0; i < n; i++) any |= (du[i] = u[i]);
        s->u = any ? du : NULL;
    }
    return s;
}
jstr *kvg_jstr_c(jx *x, const char *c) { return kvg_jstr_new(x, c, strlen(c), NULL); }
jstr *kvg_jstr_sub(jx *x, const jstr *s, size_t a, size_t b) {
    return kvg_jstr_new(x, s->p + a, b - a, s->u ? s->u + a : NULL);
}

/* a string under construction, with its content flags */

static void sb_grow(jx *x, sbuf *b, size_t more) {
    if (b->n + more <= b->cap) return;
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->n + more) cap *= 2;
    char *p = kvg_jx_alloc(x, cap);
    unsigned char *u = kvg_jx_alloc(x, cap);
    if (b->n) {
        memcpy(p, b->p, b->n);
        memcpy(u, b->u, b->n);
    }
    kvg_jx_release(x, b->p, b->cap);
    kvg_jx_release(x, b->u, b->cap);
    b->p = p;
    b->u = u;
    b->cap = cap;
}
void kvg_sb_add(jx *x, sbuf *b, const char *p, size_t n, const unsigned char *u, int flag) {
    if (n == 0) return;
    kvg_jx_charge(x, n);
    sb_grow(x, b, n);
    memcpy(b->p + b->n, p, n);
    for (size_t i = 0; i < n; i++) b->any |= (b->u[b->n + i] = (unsigned char)(u ? u[i] : flag));
    b->n += n;
}
void kvg_sb_str(jx *x, sbuf *b, const jstr *s) { kvg_sb_add(x, b, s->p, s->n, s->u, 0); }
void kvg_sb_c(jx *x, sbuf *b, const char *c) { kvg_sb_add(x, b, c, strlen(c), NULL, 0); }
jstr *kvg_sb_done(jx *x, sbuf *b) {
    jstr *s = kvg_jx_alloc(x, sizeof *s);
    char *p = kvg_jx_alloc(x, b->n + 1);
    if (b->n) memcpy(p, b->p, b->n);
    s->p = p;
    s->n = b->n;
    s->u = b->any ? b->u : NULL; /* the builder is done with: its flags are the string's */
    kvg_jx_release(x, b->p, b->cap);
    if (!b->any) kvg_jx_release(x, b->u, b->cap);
    *b = (sbuf){0};
    return s;
}
jstr *kvg_jstr_cat(jx *x, const jstr *a, const jstr *b) {
    if (a->n > MAX_MEMORY || b->n > MAX_MEMORY) kvg_jx_too_big(x);
    size_t n = a->n + b->n;
    growbuf *g = a->g;
    if (!g || a->p + a->n != g->p + g->used || g->cap - g->used < b->n) {
        g = kvg_jx_alloc(x, sizeof *g);
        g->cap = n + n / 2 + 16;
        g->p = kvg_jx_alloc(x, g->cap);
        if (a->u) g->u = kvg_jx_alloc(x, g->cap);
        kvg_jx_charge(x, a->n);
        if (a->n) memcpy(g->p, a->p, a->n);
        if (a->u) memcpy(g->u, a->u, a->n);
        g->used = a->n;
    }
    kvg_jx_charge(x, b->n);
    if (b->u && !g->u) g->u = kvg_jx_alloc(x, g->cap); /* zeros: no byte so far came from content */
    if (b->n) memcpy(g->p + g->used, b->p, b->n);
    if (b->u) memcpy(g->u + g->used, b->u, b->n);
    jstr *s = kvg_jx_alloc(x, sizeof *s);
    s->p = g->p + (a->g == g ? a->p - g->p : 0);
    s->n = n;
    s->u = a->u || b->u ? g->u + (s->p - g->p) : NULL;
    s->g = g;
    g->used += b->n;
    return s;
}

jlist *kvg_jlist_new(jx *x) { return kvg_jx_alloc(x, sizeof(jlist)); }
void kvg_jlist_push(jx *x, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        jv *nv = kvg_jx_alloc(x, cap * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        kvg_jx_release(x, l->v, l->cap * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

int kvg_jstr_eq(const jstr *a, const char *p, size_t n) { return a->n == n && memcmp(a->p, p, n) == 0; }

jdict *kvg_jdict_new(jx *x) { return kvg_jx_alloc(x, sizeof(jdict)); }
jv *kvg_jdict_find(const jdict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == V_STR && kvg_jstr_eq(d->k[i].s, k, n)) return &d->v[i];
    return NULL;
}
jv *kvg_jdict_lookup(jx *x, const jdict *d, const jv *k) {
    if (k->t == V_STR) return kvg_jdict_find(d, k->s->p, k->s->n);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t != V_STR && kvg_jv_equal(x, &d->k[i], k)) return &d->v[i];
    return NULL;
}
static void dict_append(jx *x, jdict *d, jv k, jv v) {
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        jv *nk = kvg_jx_alloc(x, cap * sizeof *nk);
        jv *nv = kvg_jx_alloc(x, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        kvg_jx_release(x, d->k, d->cap * sizeof *nk);
        kvg_jx_release(x, d->v, d->cap * sizeof *nv);
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}
void kvg_jdict_set(jx *x, jdict *d, const jstr *k, jv v) {
    jv *have = kvg_jdict_find(d, k->p, k->n);
    if (have) *have = v;
    else dict_append(x, d, mk_str(k), v);
}
void kvg_jdict_put(jx *x, jdict *d, jv k, jv v, size_t pos) {
    if (k.t != V_STR && k.t != V_INT && k.t != V_FLOAT && k.t != V_BOOL && k.t != V_NONE)
        kvg_jx_fail(x, pos, "a %s cannot be a dict key", kvg_jv_type_name(&k));
    jv *have = kvg_jdict_lookup(x, d, &k);
    if (have) *have = v;
    else dict_append(x, d, k, v);
}
void kvg_jdict_setc(jx *x, jdict *d, const char *k, jv v) {
    size_t n = strlen(k);
    jv *have = kvg_jdict_find(d, k, n);
    if (have) {
        *have = v;
        return;
    }
    /* a slot emptied by a reset (a loop's scope, every iteration) still holds its key */
    const jstr *key = d->n < d->cap && d->k[d->n].t == V_STR && kvg_jstr_eq(d->k[d->n].s, k, n) ? d->k[d->n].s
                                                                                                : kvg_jstr_c(x, k);
    kvg_jdict_set(x, d, key, v);
}

const char *kvg_jx_cstr(jx *x, const char *p, size_t n) {
    char *d = kvg_jx_alloc(x, n + 1);
    memcpy(d, p, n);
    return d;
}

/* ---- what Python does with values --------------------------------------------------------- */

const char *kvg_jv_type_name(const jv *v) {
    static const char *const names[] = {"undefined", "none", "boolean", "integer", "float",
                                        "string",    "list", "dict",    "macro",   "function"};
    return names[v->t];
}

int kvg_jv_truthy(const jv *v) {
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

void kvg_jv_fmt_float(char *buf, size_t size, double f) {
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

static void repr(jx *x, sbuf *b, const jv *v, int top, int level);

const jstr *kvg_jv_str(jx *x, const jv *v) {
    if (v->t == V_STR) return v->s;
    sbuf b = {0};
    repr(x, &b, v, 1, 0);
    return kvg_sb_done(x, &b);
}

/* A list or dict may hold itself (a namespace attribute set to the namespace): every walk over
 * a value's members stops at MAX_DEPTH levels with an error instead of recursing forever. */
static void repr(jx *x, sbuf *b, const jv *v, int top, int level) {
    char num[64];
    if (level > MAX_DEPTH) kvg_jx_fail(x, x->at, "value nested more than %d deep (or holding itself) cannot be printed", MAX_DEPTH);
    switch (v->t) {
    case V_UNDEF: break;
    case V_NONE: kvg_sb_c(x, b, "None"); break;
    case V_BOOL: kvg_sb_c(x, b, v->b ? "True" : "False"); break;
    case V_INT: snprintf(num, sizeof num, "%lld", (long long)v->i); kvg_sb_c(x, b, num); break;
    case V_FLOAT: kvg_jv_fmt_float(num, sizeof num, v->f); kvg_sb_c(x, b, num); break;
    case V_STR:
        if (top) kvg_sb_str(x, b, v->s);
        else {
            int dq = memchr(v->s->p, '\'', v->s->n) && !memchr(v->s->p, '"', v->s->n);
            kvg_sb_c(x, b, dq ? "\"" : "'");
            for (size_t i = 0; i < v->s->n; i++) {
                char c = v->s->p[i];
                int flag = v->s->u ? v->s->u[i] : 0;
                const char *e = c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r"
                                : (c == '\'' && !dq) ? "\\'" : NULL;
                if (e) kvg_sb_add(x, b, e, strlen(e), NULL, flag);
                else kvg_sb_add(x, b, &c, 1, NULL, flag);
            }
            kvg_sb_c(x, b, dq ? "\"" : "'");
        }
        break;
    case V_LIST:
        kvg_sb_c(x, b, v->l->tuple ? "(" : "[");
        for (size_t i = 0; i < v->l->n; i++) {
            if (i) kvg_sb_c(x, b, ", ");
            repr(x, b, &v->l->v[i], 0, level + 1);
        }
        kvg_sb_c(x, b, v->l->tuple ? (v->l->n == 1 ? ",)" : ")") : "]");
        break;
    case V_DICT:
        kvg_sb_c(x, b, "{");
        for (size_t i = 0; i < v->d->n; i++) {
            if (i) kvg_sb_c(x, b, ", ");
            repr(x, b, &v->d->k[i], 0, level + 1);
            kvg_sb_c(x, b, ": ");
            repr(x, b, &v->d->v[i], 0, level + 1);
        }
        kvg_sb_c(x, b, "}");
        break;
    default: kvg_sb_c(x, b, v->t == V_MACRO ? "<macro>" : "<function>"); break;
    }
}


static int equal(jx *x, const jv *a, const jv *b, int level) {
    kvg_jx_charge(x, 1);
    if (level > MAX_DEPTH) kvg_jx_fail(x, x->at, "values nested more than %d deep (or holding themselves) cannot be compared", MAX_DEPTH);
    if (num(a) && num(b)) {
        if (a->t == V_FLOAT || b->t == V_FLOAT) return as_f(a) == as_f(b);
        return as_i(a) == as_i(b);
    }
    if (a->t != b->t) return 0;
    switch (a->t) {
    case V_UNDEF:
    case V_NONE: return 1;
    case V_STR:
        if (a->s->n == b->s->n) kvg_jx_charge(x, a->s->n);
        return kvg_jstr_eq(a->s, b->s->p, b->s->n);
    case V_LIST:
        if (a->l->n != b->l->n) return 0;
        for (size_t i = 0; i < a->l->n; i++)
            if (!equal(x, &a->l->v[i], &b->l->v[i], level + 1)) return 0;
        return 1;
    case V_DICT:
        if (a->d->n != b->d->n) return 0;
        for (size_t i = 0; i < a->d->n; i++) {
            jv *o = kvg_jdict_lookup(x, b->d, &a->d->k[i]);
            if (!o || !equal(x, &a->d->v[i], o, level + 1)) return 0;
        }
        return 1;
    case V_MACRO: return a->m == b->m;
    case V_FUNC: return a->fn == b->fn;
    default: return 0;
    }
}

int kvg_jv_equal(jx *x, const jv *a, const jv *b) { return equal(x, a, b, 0); }

int kvg_jv_compare(jx *x, const jv *a, const jv *b, size_t pos) {
    if (num(a) && num(b)) {
        double x = as_f(a), y = as_f(b);
        return x < y ? -1 : x > y;
    }
    if (a->t == V_STR && b->t == V_STR) {
        size_t n = a->s->n < b->s->n ? a->s->n : b->s->n;
        kvg_jx_charge(x, n + 1);
        int c = memcmp(a->s->p, b->s->p, n);
        if (c) return c < 0 ? -1 : 1;
        return a->s->n < b->s->n ? -1 : a->s->n > b->s->n;
    }
    kvg_jx_fail(x, pos, "cannot compare a %s with a %s", kvg_jv_type_name(a), kvg_jv_type_name(b));
}

int kvg_jv_contains(jx *x, const jv *hay, const jv *needle, size_t pos) {
    if (hay->t == V_STR) {
        if (needle->t != V_STR) kvg_jx_fail(x, pos, "'in <string>' needs a string, got a %s", kvg_jv_type_name(needle));
        const jstr *h = hay->s, *n = needle->s;
        if (n->n == 0) return 1;
        for (size_t i = 0; i + n->n <= h->n; i++) {
            kvg_jx_charge(x, n->n); /* at most this many bytes compared at each place */
            if (memcmp(h->p + i, n->p, n->n) == 0) return 1;
        }
        return 0;
    }
    if (hay->t == V_LIST) {
        for (size_t i = 0; i < hay->l->n; i++)
            if (kvg_jv_equal(x, &hay->l->v[i], needle)) return 1;
        return 0;
    }
    if (hay->t == V_DICT) return kvg_jdict_lookup(x, hay->d, needle) != NULL;
    if (hay->t == V_UNDEF) return 0; /* jinja2's Undefined is an empty container */
    kvg_jx_fail(x, pos, "'in' needs a string, list or dict on its right, got a %s", kvg_jv_type_name(hay));
}

jlist *kvg_jv_items(jx *x, const jv *v, size_t pos) {
    if (v->t == V_LIST) return v->l;
    jlist *l = kvg_jlist_new(x);
    if (v->t == V_DICT) {
        for (size_t i = 0; i < v->d->n; i++) kvg_jlist_push(x, l, v->d->k[i]);
    } else if (v->t == V_STR) {
        for (size_t i = 0; i < v->s->n;) {
            size_t k = i + 1;
            while (k < v->s->n && ((unsigned char)v->s->p[k] & 0xC0) == 0x80) k++;
            kvg_jlist_push(x, l, mk_str(kvg_jstr_sub(x, v->s, i, k)));
            i = k;
        }
    } else if (v->t != V_UNDEF && v->t != V_NONE) {
        kvg_jx_fail(x, pos, "a %s is not iterable", kvg_jv_type_name(v));
    } else if (v->t == V_NONE) {
        kvg_jx_fail(x, pos, "none is not iterable");
    }
    return l;
}

jv kvg_jv_item(jx *x, const jv *obj, const jv *key, size_t pos) {
    if (obj->t == V_DICT) {
        jv *v = kvg_jdict_lookup(x, obj->d, key);
        return v ? *v : UNDEF;
    }
    if ((obj->t == V_LIST || obj->t == V_STR) && (key->t == V_INT || key->t == V_BOOL)) {
        int64_t n = obj->t == V_LIST ? (int64_t)obj->l->n : (int64_t)obj->s->n, i = as_i(key);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return UNDEF;
        if (obj->t == V_LIST) return obj->l->v[i];
        return mk_str(kvg_jstr_sub(x, obj->s, (size_t)i, (size_t)i + 1));
    }
    if (obj->t == V_UNDEF) kvg_jx_fail(x, pos, "subscript of an undefined value");
    return UNDEF;
}

static int64_t clamp_index(int64_t i, int64_t n, int64_t step, int is_start) {
    if (i < 0) i += n;
    if (step > 0) return i < 0 ? 0 : i > n ? n : i;
    (void)is_start;
    return i < -1 ? -1 : i > n - 1 ? n - 1 : i;
}

jv kvg_jv_slice(jx *x, const jv *obj, const jv *a, const jv *b, const jv *c, size_t pos) {
    if (obj->t != V_LIST && obj->t != V_STR) kvg_jx_fail(x, pos, "cannot slice a %s", kvg_jv_type_name(obj));
    int64_t n = obj->t == V_LIST ? (int64_t)obj->l->n : (int64_t)obj->s->n;
    int64_t step = c->t == V_UNDEF || c->t == V_NONE ? 1 : as_i(c);
    if (step == 0) kvg_jx_fail(x, pos, "slice step cannot be zero");
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
        jlist *l = kvg_jlist_new(x);
        for (uint64_t k = 0; k < count; k++)
            kvg_jlist_push(x, l, obj->l->v[(int64_t)((uint64_t)lo + k * (uint64_t)step)]);
        return (jv){.t = V_LIST, .l = l};
    }
    sbuf sb = {0};
    for (uint64_t k = 0; k < count; k++) {
        int64_t i = (int64_t)((uint64_t)lo + k * (uint64_t)step);
        kvg_sb_add(x, &sb, obj->s->p + i, 1, obj->s->u ? obj->s->u + i : NULL, 0);
    }
    return mk_str(kvg_sb_done(x, &sb));
}


jv kvg_jv_attr(jx *x, const jv *obj, const char *name, size_t pos) {
    if (obj->t == V_DICT) {
        jv *v = kvg_jdict_find(obj->d, name, strlen(name));
        return v ? *v : UNDEF;
    }
    if (obj->t == V_UNDEF) kvg_jx_fail(x, pos, "'%s' of an undefined value", name);
    if (obj->t == V_NONE) kvg_jx_fail(x, pos, "'%s' of none", name);
    return UNDEF;
}
