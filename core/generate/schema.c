/* schema.c: a JSON schema subset compiled to GBNF (kvg_grammar.h; docs/generation.md,
 * "JSON schemas"). The JSON codec (kvg_json.h) reads the schema text into values; each schema node
 * becomes one rule, and the output is compact JSON (no whitespace) with an object's
 * properties in the schema's order. Anything the compiler cannot guarantee is refused with
 * the schema path and the keyword. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_buf.h"
#include "kvg_json.h"
#include "kvg_grammar.h"
#include "kvg_model.h"

#define MAX_DEPTH 64
#define DEFAULT_MAX_LENGTH 64 /* a string without maxLength: at most this many characters */
#define MAX_LENGTH 4096
#define INT_LIMIT 999999999999999LL /* integers without a bound: at most 15 digits */

/* ---- the compiler ---------------------------------------------------------------------------- */

typedef struct comp {
    kvg_buf out; /* the grammar */
    int n_rules;
    const kvg_json *root;
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

/* a value as compact JSON text (numbers as the schema wrote them) */
static void to_json(comp *C, kvg_buf *b, const kvg_json *v) {
    if (C->st == KVGEN_OK && kvg_json_write(b, v) != 0) C->st = kvg_fail(C->err, KVGEN_E_NO_MEMORY, "schema: out of memory");
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
static bool utf8_value(const kvg_json *v) {
    if (v->type == KVG_JSON_STRING) return utf8_text(v->str, v->len);
    for (const kvg_json *c = v->child; c; c = c->next)
        if ((c->key && !utf8_text(c->key, c->key_len)) || !utf8_value(c)) return false;
    return true;
}

static void json_lit(comp *C, kvg_buf *b, const kvg_json *v) {
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

/* the member's key is in list */
static bool in(const char *const *list, const kvg_json *m) {
    for (int i = 0; list[i]; i++)
        if (strlen(list[i]) == m->key_len && memcmp(list[i], m->key, m->key_len) == 0) return true;
    return false;
}

/* the schema's name of a value's type */
static const char *type_name(const kvg_json *v) {
    switch (v->type) {
    case KVG_JSON_NULL: return "null";
    case KVG_JSON_FALSE:
    case KVG_JSON_TRUE: return "boolean";
    case KVG_JSON_NUMBER: return "number";
    case KVG_JSON_STRING: return "string";
    case KVG_JSON_ARRAY: return "array";
    case KVG_JSON_OBJECT: return "object";
    }
    return "";
}

static int gen(comp *C, const kvg_json *s, const char *path, int depth);

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

static bool number_kw(comp *C, const kvg_json *s, const char *kw, const char *path, double *v) {
    const kvg_json *k = kvg_json_get(s, kw);
    if (!k) return false;
    if (k->type != KVG_JSON_NUMBER) {
        cerr(C, path, "keyword '%s' must be a number", kw);
        return false;
    }
    *v = k->number;
    return true;
}

static long long count_kw(comp *C, const kvg_json *s, const char *kw, const char *path, long long dflt, long long max) {
    const kvg_json *k = kvg_json_get(s, kw);
    if (!k) return dflt;
    if (k->type != KVG_JSON_NUMBER || k->number < 0 || k->number != floor(k->number) || k->number > (double)max) {
        cerr(C, path, "keyword '%s' must be a whole number in 0..%lld", kw, max);
        return -1;
    }
    return (long long)k->number;
}

/* integer bounds: ceil(minimum), floor(maximum), exclusive ones one further in */
static bool int_bounds(comp *C, const kvg_json *s, const char *path, long long *lo, long long *hi) {
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

static void gen_object(comp *C, const kvg_json *s, const char *path, int depth, kvg_buf *b) {
    const kvg_json *props = kvg_json_get(s, "properties"), *req = kvg_json_get(s, "required");
    if (props && props->type != KVG_JSON_OBJECT) {
        cerr(C, path, "keyword 'properties' must be an object");
        return;
    }
    if (req && req->type != KVG_JSON_ARRAY) {
        cerr(C, path, "keyword 'required' must be an array of property names");
        return;
    }
    int n = props ? (int)props->n : 0;
    bool *required = kvg_calloc((size_t)n + 1, sizeof *required);
    int *rule = kvg_calloc((size_t)n + 1, sizeof *rule);
    if (!required || !rule) {
        kvg_free(required);
        kvg_free(rule);
        C->st = kvg_fail(C->err, KVGEN_E_NO_MEMORY, "schema: out of memory");
        return;
    }
    const kvg_json *prop = props ? props->child : NULL;
    for (int p = 0; p < n && C->st == KVGEN_OK; p++, prop = prop->next)
        if (!utf8_text(prop->key, prop->key_len))
            cerr(C, path, "keyword 'properties': property name %d is not valid UTF-8", p);
    for (const kvg_json *k = req ? req->child : NULL; k && C->st == KVGEN_OK; k = k->next) {
        bool str = k->type == KVG_JSON_STRING;
        int at = -1;
        prop = props ? props->child : NULL;
        for (int p = 0; str && p < n; p++, prop = prop->next)
            if (prop->key_len == k->len && memcmp(prop->key, k->str, k->len) == 0) at = p;
        if (at < 0)
            cerr(C, path, "keyword 'required' names %s%s%s, which is not in 'properties'", str ? "'" : "",
                 str ? k->str : "a value that is not a string", str ? "'" : "");
        else
            required[at] = true;
    }
    /* each property: "key":value */
    prop = props ? props->child : NULL;
    for (int p = 0; p < n && C->st == KVGEN_OK; p++, prop = prop->next) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/properties/%s", path, prop->key);
        int v = gen(C, prop, sub, depth + 1);
        if (v < 0) break;
        kvg_buf body = {0};
        kvg_buf k = {0};
        if (C->st == KVGEN_OK && kvg_json_write_string(&k, prop->key, prop->key_len) != 0)
            C->st = kvg_fail(C->err, KVGEN_E_NO_MEMORY, "schema: out of memory");
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

static void gen_typed(comp *C, const kvg_json *s, const char *type, const char *path, int depth, kvg_buf *b) {
    if (strcmp(type, "object") == 0) {
        gen_object(C, s, path, depth, b);
    } else if (strcmp(type, "array") == 0) {
        const kvg_json *items = kvg_json_get(s, "items");
        if (items && items->type == KVG_JSON_ARRAY) {
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
        bool bounded = kvg_json_get(s, "minimum") || kvg_json_get(s, "maximum");
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
    const kvg_json *def = name ? kvg_json_get(kvg_json_get(C->root, where), name) : NULL;
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
static int gen_into(comp *C, const kvg_json *s, const char *path, int depth, kvg_buf *bp) {
    if (s->type == KVG_JSON_TRUE || s->type == KVG_JSON_FALSE) {
        if (s->type == KVG_JSON_FALSE) return cerr(C, path, "the schema false accepts nothing");
        add(C, bp, "jvalue");
        return emit_rule(C, bp);
    }
    if (s->type != KVG_JSON_OBJECT) return cerr(C, path, "a schema must be an object or a boolean");
    for (const kvg_json *m = s->child; m; m = m->next)
        if (!in(known_keys, m)) return cerr(C, path, "keyword '%s' is not supported", m->key);
    const kvg_json *ref = kvg_json_get(s, "$ref"), *cnst = kvg_json_get(s, "const"), *en = kvg_json_get(s, "enum");
    const kvg_json *any = kvg_json_get(s, "anyOf") ? kvg_json_get(s, "anyOf") : kvg_json_get(s, "oneOf");
    const char *any_kw = kvg_json_get(s, "anyOf") ? "anyOf" : "oneOf";
    const kvg_json *type = kvg_json_get(s, "type");
    if (kvg_json_get(s, "anyOf") && kvg_json_get(s, "oneOf")) return cerr(C, path, "keywords 'anyOf' and 'oneOf' together are not supported");
    const char *shape = ref ? "$ref" : cnst ? "const" : en ? "enum" : any ? any_kw : NULL;
    if (shape) { /* these stand alone (const and enum may have a type beside them) */
        for (const kvg_json *m = s->child; m; m = m->next) {
            const char *k = m->key;
            if (in(annotation_keys, m) || strcmp(k, shape) == 0) continue;
            if (strcmp(k, "type") == 0 && (cnst || en)) continue;
            return cerr(C, path, "keyword '%s' beside '%s' is not supported", k, shape);
        }
    }
    if ((cnst || en) && type) { /* every value must be of the type */
        const kvg_json *v = cnst ? cnst : en->type == KVG_JSON_ARRAY ? en->child : NULL;
        for (; v; v = cnst ? NULL : v->next) {
            bool fits = false;
            bool list = type->type == KVG_JSON_ARRAY;
            for (const kvg_json *tv = list ? type->child : type; tv; tv = list ? tv->next : NULL) {
                if (tv->type != KVG_JSON_STRING) return cerr(C, path, "keyword 'type' must be a string or an array of strings");
                fits |= strcmp(tv->str, type_name(v)) == 0 ||
                        (v->type == KVG_JSON_NUMBER && strcmp(tv->str, "integer") == 0 && v->number == floor(v->number));
            }
            if (!fits) return cerr(C, path, "keyword '%s' holds a value that is not of the schema's 'type'", shape);
        }
    }
    if (ref) {
        if (ref->type != KVG_JSON_STRING) return cerr(C, path, "keyword '$ref' must be a string");
        return gen_ref(C, ref->str, path, depth);
    }
    if (cnst) {
        if (!utf8_value(cnst)) return cerr(C, path, "keyword 'const' holds a string that is not valid UTF-8");
        json_lit(C, bp, cnst);
        return emit_rule(C, bp);
    }
    if (en) {
        if (en->type != KVG_JSON_ARRAY || en->n == 0) return cerr(C, path, "keyword 'enum' must be a non-empty array");
        add(C, bp, "(");
        int i = 0;
        for (const kvg_json *v = en->child; v; v = v->next, i++) {
            if (!utf8_value(v)) return cerr(C, path, "keyword 'enum' value %d holds a string that is not valid UTF-8", i);
            if (i) add(C, bp, " | ");
            json_lit(C, bp, v);
        }
        add(C, bp, ")");
        return emit_rule(C, bp);
    }
    if (any) {
        if (any->type != KVG_JSON_ARRAY || any->n == 0) return cerr(C, path, "keyword '%s' must be a non-empty array", any_kw);
        int n = (int)any->n;
        int *alts = kvg_malloc((size_t)n * sizeof *alts);
        if (!alts) {
            C->st = kvg_fail(C->err, KVGEN_E_NO_MEMORY, "schema: out of memory");
            return -1;
        }
        const kvg_json *alt = any->child;
        for (int i = 0; i < n && C->st == KVGEN_OK; i++, alt = alt->next) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/%s/%d", path, any_kw, i);
            alts[i] = gen(C, alt, sub, depth + 1);
        }
        for (int i = 0; i < n && C->st == KVGEN_OK; i++) addf(C, bp, "%sr%d", i ? " | " : "", alts[i]);
        kvg_free(alts);
        return C->st == KVGEN_OK ? emit_rule(C, bp) : -1;
    }
    if (!type) { /* no type: an object or array by their keywords, else any value */
        if (kvg_json_get(s, "properties") || kvg_json_get(s, "required")) gen_typed(C, s, "object", path, depth, bp);
        else if (kvg_json_get(s, "items")) gen_typed(C, s, "array", path, depth, bp);
        else add(C, bp, "jvalue");
    } else if (type->type == KVG_JSON_STRING) {
        gen_typed(C, s, type->str, path, depth, bp);
    } else if (type->type == KVG_JSON_ARRAY && type->n > 0) {
        add(C, bp, "(");
        for (const kvg_json *t = type->child; t && C->st == KVGEN_OK; t = t->next) {
            if (t->type != KVG_JSON_STRING) return cerr(C, path, "keyword 'type' lists a value that is not a string");
            if (t != type->child) add(C, bp, " | ");
            gen_typed(C, s, t->str, path, depth, bp);
        }
        add(C, bp, ")");
    } else {
        return cerr(C, path, "keyword 'type' must be a string or a non-empty array of strings");
    }
    if (C->st != KVGEN_OK) return -1;
    return emit_rule(C, bp);
}

static int gen(comp *C, const kvg_json *s, const char *path, int depth) {
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
    /* strings of any bytes: the compiler refuses those that are not UTF-8 naming the schema path */
    size_t len = strlen(text), end = 0, at = 0;
    char msg[160];
    kvg_json *root = kvg_json_parse_ex(text, len, MAX_DEPTH, KVG_JSON_ANY_BYTES | KVG_JSON_NUMBER_TEXT, &end, &at, msg,
                                       sizeof msg);
    if (!root && at == KVG_JSON_NO_MEMORY) return kvg_fail(err, KVGEN_E_NO_MEMORY, "schema: out of memory");
    if (!root) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "schema: %s", msg);
    end += strspn(text + end, " \t\n\r");
    if (end < len) {
        kvg_json_free(root);
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "schema: not valid JSON at byte %zu: text after the schema", end);
    }
    comp C = {.root = root, .err = err, .st = KVGEN_OK};
    add(&C, &C.out, common_rules);
    int top = gen(&C, root, "#", 0);
    if (top >= 0) addf(&C, &C.out, "root ::= r%d\n", top);
    kvg_json_free(root);
    if (C.st != KVGEN_OK) {
        kvg_free(C.out.p);
        return C.st;
    }
    *gbnf = C.out.p;
    return KVGEN_OK;
}
