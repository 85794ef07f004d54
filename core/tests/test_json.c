/* test_json.c: the JSON codec (base/kvg_json.h): parse and write round trips, key order,
 * escapes (surrogate pairs, lone surrogates and bytes that are not UTF-8 refused), NUL bytes in
 * strings and keys, the depth bound, numbers (integers exact, shortest doubles, -0, not
 * finite), errors naming the byte offset, the builders, and every allocation failing in turn
 * through kvgen_set_allocator with nothing leaked. */
#include <math.h>
#include <string.h>
#include "kvg_json.h"
#include "testutil.h"

static kvg_json *parse(const char *text) {
    char err[128] = "";
    size_t at = 0;
    kvg_json *v = kvg_json_parse(text, strlen(text), 64, &at, err, sizeof err);
    CHECKF(v != NULL, "'%s': %s", text, err);
    return v;
}

/* text parses and writes back as want (compact) */
static void round_trip(const char *text, const char *want) {
    kvg_json *v = parse(text);
    if (!v) return;
    size_t n = 0;
    char *out = kvg_json_print(v, &n);
    CHECKF(out && n == strlen(want) && memcmp(out, want, n) == 0, "'%s' wrote '%s', want '%s'", text,
           out ? out : "(null)", want);
    /* and what it wrote reads back to the same text */
    kvg_json *w = out ? kvg_json_parse(out, n, 64, NULL, NULL, 0) : NULL;
    char *again = w ? kvg_json_print(w, NULL) : NULL;
    CHECKF(again && out && strcmp(again, out) == 0, "'%s' wrote '%s' the second time", out ? out : "",
           again ? again : "(null)");
    kvg_free(again);
    kvg_json_free(w);
    kvg_free(out);
    kvg_json_free(v);
}

/* text (n bytes) is refused at byte `at` with message `what` */
static void refused_n(const char *text, size_t n, int max_depth, size_t at, const char *what) {
    char err[160] = "", want[160];
    size_t got = 12345;
    kvg_json *v = kvg_json_parse(text, n, max_depth, &got, err, sizeof err);
    snprintf(want, sizeof want, "not valid JSON at byte %zu: %s", at, what);
    CHECKF(!v && got == at && strcmp(err, want) == 0, "'%.*s': offset %zu, '%s'; want '%s'", (int)n, text, got, err,
           want);
    kvg_json_free(v);
}
static void refused(const char *text, size_t at, const char *what) { refused_n(text, strlen(text), 64, at, what); }

static void check_round_trips(void) {
    round_trip(" { \"b\" : 1 , \"a\" : [ true , false , null , \"x\" , { } , [ ] ] } ", "{\"b\":1,\"a\":[true,false,null,\"x\",{},[]]}");
    round_trip("[]", "[]");
    round_trip("\"\"", "\"\"");
    round_trip("null", "null");
    round_trip("\t\r\n 7 \n", "7");
    /* key order is the text's, duplicates kept (get finds the first) */
    round_trip("{\"z\":1,\"a\":2,\"m\":3,\"a\":4}", "{\"z\":1,\"a\":2,\"m\":3,\"a\":4}");
    kvg_json *v = parse("{\"z\":1,\"a\":2,\"m\":{\"k\":\"v\"},\"a\":4}");
    if (v) {
        CHECK(v->type == KVG_JSON_OBJECT && v->n == 4);
        CHECK(kvg_json_get(v, "a") && kvg_json_get(v, "a")->number == 2 && !kvg_json_get(v, "q"));
        CHECK(kvg_json_item(v, 2) && strcmp(kvg_json_item(v, 2)->key, "m") == 0 && !kvg_json_item(v, 4));
        size_t n = 0;
        const char *s = kvg_json_get_string(kvg_json_get(v, "m"), "k", &n);
        CHECK(s && n == 1 && strcmp(s, "v") == 0 && !kvg_json_get_string(v, "z", NULL));
        CHECK(!kvg_json_get(NULL, "a") && !kvg_json_get(kvg_json_get(v, "z"), "a") && !kvg_json_item(NULL, 0));
        /* offsets of the values in the text */
        CHECK(kvg_json_get(v, "z")->offset == 5 && kvg_json_get(v, "m")->offset == 17 &&
              kvg_json_get(kvg_json_get(v, "m"), "k")->offset == 22);
        kvg_json_free(v);
    }
}

static void check_strings(void) {
    /* escapes in, the short forms and \u00XX out; '/' and UTF-8 are written as they are */
    round_trip("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u0001\\u001F\\u007f\"", "\"\\\"\\\\/\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\"");
    round_trip("\"\\u00e9\\u20AC\\ud83d\\ude00\"", "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"");
    round_trip("\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\"", "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\"");
    kvg_json *v = parse("\"\\ud83d\\ude00\"");
    if (v) {
        CHECK(v->len == 4 && memcmp(v->str, "\xf0\x9f\x98\x80", 5) == 0);
        kvg_json_free(v);
    }
    /* NUL bytes: in strings and keys, with their lengths */
    round_trip("{\"a\\u0000b\":\"x\\u0000y\"}", "{\"a\\u0000b\":\"x\\u0000y\"}");
    if ((v = parse("{\"a\\u0000b\":\"x\\u0000yz\"}"))) {
        const kvg_json *m = v->child;
        CHECK(m && m->key_len == 3 && memcmp(m->key, "a\0b", 4) == 0 && m->len == 4 && memcmp(m->str, "x\0yz", 5) == 0);
        CHECK(!kvg_json_get(v, "a")); /* "a" is not "a\0b" */
        kvg_json_free(v);
    }
    /* surrogates: a pair only; a lone one or a reversed pair is refused after its digits */
    refused("\"\\ud800\"", 7, "a lone UTF-16 surrogate");
    refused("\"\\udc00\\ud800\"", 7, "a lone UTF-16 surrogate");
    refused("\"\\ud800\\u0041\"", 7, "a lone UTF-16 surrogate");
    refused("\"ab\\ud83dx\"", 9, "a lone UTF-16 surrogate");
    refused("\"\\u12G4\"", 3, "\\u needs 4 hexadecimal digits");
    refused("\"\\u12\"", 3, "\\u needs 4 hexadecimal digits");
    refused("\"\\q\"", 3, "unknown escape in a string");
    refused("\"\\", 2, "unknown escape in a string");
    /* bytes that are not UTF-8: refused at the byte where the sequence starts */
    refused("\"x\xff\"", 2, "a string that is not valid UTF-8");
    refused("[\"ok\",\"\xc3\"]", 7, "a string that is not valid UTF-8");       /* cut short */
    refused("\"\xc0\xaf\"", 1, "a string that is not valid UTF-8");            /* overlong */
    refused("\"\xe0\x80\xaf\"", 1, "a string that is not valid UTF-8");        /* overlong */
    refused("\"ab\xed\xa0\x80\"", 3, "a string that is not valid UTF-8");      /* a surrogate */
    refused("\"\xf4\x90\x80\x80\"", 1, "a string that is not valid UTF-8");    /* over U+10FFFF */
    refused("{\"k\xe2\x82\":1}", 3, "a string that is not valid UTF-8");       /* in a key */
    refused("\"\xf0\x9f\x98\"", 1, "a string that is not valid UTF-8");
    /* ... unless the caller asked for bytes */
    const char *raw = "[\"x\xff\",\"\xed\xa0\x80\"]";
    v = kvg_json_parse_ex(raw, strlen(raw), 64, KVG_JSON_ANY_BYTES, NULL, NULL, NULL, 0);
    CHECK(v && v->n == 2 && strcmp(v->child->str, "x\xff") == 0 && v->child->next->len == 3);
    char *out = v ? kvg_json_print(v, NULL) : NULL;
    CHECKF(out && strcmp(out, raw) == 0, "%s", out ? out : "(null)"); /* bytes written as they are */
    kvg_free(out);
    kvg_json_free(v);
    /* control characters and a raw NUL byte are no string bytes; an unterminated string */
    refused("\"a\tb\"", 2, "unterminated string or control character in a string");
    refused_n("\"a\0b\"", 5, 64, 2, "unterminated string or control character in a string");
    refused("\"abc", 4, "unterminated string or control character in a string");
    /* the writer: every control character escaped, NUL included */
    kvg_buf b = {0};
    CHECK(kvg_json_write_string(&b, "a\0\x1f\"\\\n\xc3\xa9/", 9) == 0);
    CHECKF(b.p && strcmp(b.p, "\"a\\u0000\\u001f\\\"\\\\\\n\xc3\xa9/\"") == 0, "%s", b.p ? b.p : "(null)");
    kvg_free(b.p);
}

static void check_errors(void) {
    refused("{\"type\":\"object\"", 16, "expected ',' or '}'");
    refused("[1,]", 3, "expected a value");
    refused("[1 2]", 3, "expected ',' or ']'");
    refused("{\"a\" 1}", 5, "expected ':'");
    refused("{\"a\":1,}", 7, "expected a string key");
    refused("{1:2}", 1, "expected a string key");
    refused("", 0, "expected a value");
    refused("   ", 3, "expected a value");
    refused("tru", 0, "expected a value");
    refused("nul", 0, "expected a value");
    refused("[1] x", 4, "text after the value");
    refused("truex", 4, "text after the value");
    refused("01", 1, "text after the value");
    refused("-", 1, "expected a value");
    refused("-a", 1, "expected a value");
    refused("+1", 0, "expected a value");
    refused(".5", 0, "expected a value");
    refused("1.", 2, "expected a digit after '.'");
    refused("1.e5", 2, "expected a digit after '.'");
    refused("1e", 2, "expected a digit in the exponent");
    refused("[1e+]", 4, "expected a digit in the exponent");
    refused("NaN", 0, "expected a value");
    refused("'a'", 0, "expected a value");
    /* the length bounds the text: what follows is not read */
    refused_n("[1]", 2, 64, 2, "expected ',' or ']'");
    refused_n("true", 3, 64, 0, "expected a value");
    kvg_json *v = kvg_json_parse("[1]xyz", 3, 64, NULL, NULL, 0);
    CHECK(v && v->n == 1);
    kvg_json_free(v);
    /* a small message buffer is cut, never overrun; no buffer at all is fine */
    char small[12];
    memset(small, 'x', sizeof small);
    CHECK(!kvg_json_parse("[", 1, 64, NULL, small, 8) && strlen(small) == 7 && small[8] == 'x');
    CHECK(!kvg_json_parse("[", 1, 64, NULL, NULL, 0));
    CHECK(!kvg_json_parse(NULL, 0, 64, NULL, NULL, 0));
    /* one value, the rest left to the caller */
    size_t end = 0;
    v = kvg_json_parse_ex("{\"a\":[1]}  tail", 15, 64, 0, &end, NULL, NULL, 0);
    CHECK(v && end == 9);
    kvg_json_free(v);
}

static void check_depth(void) {
    /* the top value is at depth 0: depth 3 holds [[[1]]]'s 1 */
    kvg_json *v = kvg_json_parse("[[[1]]]", 7, 3, NULL, NULL, 0);
    CHECK(v != NULL);
    kvg_json_free(v);
    v = kvg_json_parse("[[[[]]]]", 8, 3, NULL, NULL, 0); /* an empty container holds nothing deeper */
    CHECK(v != NULL);
    kvg_json_free(v);
    refused_n("[[[[1]]]]", 9, 3, 4, "nested too deeply");
    refused_n("{\"a\":{\"b\": {\"c\":1}}}", 20, 2, 16, "nested too deeply");
    /* far too deep: refused at the bound, without recursing through the whole text */
    size_t n = 1000000;
    char *deep = malloc(n);
    if (deep) {
        memset(deep, '[', n);
        refused_n(deep, n, 64, 65, "nested too deeply");
        free(deep);
    }
}

static void number_is(double x, const char *want) {
    kvg_buf b = {0};
    CHECK(kvg_json_write_number(&b, x) == 0);
    CHECKF(b.p && strcmp(b.p, want) == 0, "%.17g wrote '%s', want '%s'", x, b.p ? b.p : "(null)", want);
    if (b.p && isfinite(x)) CHECKF(strtod(b.p, NULL) == x, "'%s' does not read back as %.17g", b.p, x);
    kvg_free(b.p);
}

static void check_numbers(void) {
    number_is(0, "0");
    number_is(-0.0, "-0");
    number_is(7, "7");
    number_is(-42, "-42");
    number_is(4294967296.0, "4294967296");
    number_is(999999999999999.0, "999999999999999");
    number_is(1e15, "1e+15");
    number_is(9007199254740992.0, "9007199254740992");
    number_is(0.1, "0.1");
    number_is(0.5, "0.5");
    number_is(-2.5e-7, "-2.5e-07");
    number_is(1e300, "1e+300");
    number_is(1.7976931348623157e308, "1.7976931348623157e+308");
    number_is(5e-324, "5e-324");
    number_is(1.5e-310, "1.5e-310");
    number_is(1.0 / 3, "0.3333333333333333");
    number_is(0.30000000000000004, "0.30000000000000004");
    number_is((double)0.7f, "0.699999988079071");  /* 15 digits read back */
    number_is((double)0.9f, "0.8999999761581421"); /* 16 */
    number_is((double)0.1f, "0.10000000149011612"); /* 17 */
    number_is(INFINITY, "null");
    number_is(-INFINITY, "null");
    number_is(NAN, "null");
    /* parsed numbers: integers exact, the nearest double otherwise, and written back */
    round_trip("[0,-0,1,-1,123456789012,0.1,1e300,-2.5E-7,1.5e+2,1E2,0.30000000000000004]",
               "[0,-0,1,-1,123456789012,0.1,1e+300,-2.5e-07,150,100,0.30000000000000004]");
    kvg_json *v = parse("[9007199254740993, 1e400, -1e400, 1e-400, 123.456]");
    if (v) {
        CHECK(v->child->number == 9007199254740992.0);
        CHECK(isinf(v->child->next->number) && v->child->next->number > 0);
        CHECK(isinf(kvg_json_item(v, 2)->number) && kvg_json_item(v, 2)->number < 0);
        CHECK(kvg_json_item(v, 3)->number == 0 && kvg_json_item(v, 4)->number == 123.456);
        kvg_free(kvg_json_print(v, NULL));
        kvg_json_free(v);
    }
    /* numbers as written, under KVG_JSON_NUMBER_TEXT */
    const char *as_written = "[1.0,-0.50,2E+3,1e400]";
    v = kvg_json_parse_ex(as_written, strlen(as_written), 64, KVG_JSON_NUMBER_TEXT, NULL, NULL, NULL, 0);
    CHECK(v && v->child->number == 1 && v->child->len == 3 && strcmp(v->child->str, "1.0") == 0);
    char *t = v ? kvg_json_print(v, NULL) : NULL;
    CHECKF(t && strcmp(t, as_written) == 0, "%s", t ? t : "(null)");
    kvg_free(t);
    kvg_json_free(v);
    v = parse("-0");
    CHECK(v && v->type == KVG_JSON_NUMBER && v->number == 0 && signbit(v->number));
    kvg_json_free(v);
}

/* a built tree: {"name":"Mira","n":3,"ok":true,"tags":["a",null,false],"inner":{}} */
static kvg_json *build(void) {
    kvg_json *o = kvg_json_new(KVG_JSON_OBJECT);
    if (!o) return NULL;
    kvg_json *tags = kvg_json_new(KVG_JSON_ARRAY);
    bool ok = kvg_json_add(o, "name", kvg_json_new_string("Mira", 4)) && kvg_json_add(o, "n", kvg_json_new_number(3)) &&
              kvg_json_add(o, "ok", kvg_json_new_bool(true)) && (tags = kvg_json_add(o, "tags", tags)) &&
              kvg_json_add(tags, NULL, kvg_json_new_string("a", 1)) && kvg_json_add(tags, NULL, kvg_json_new(KVG_JSON_NULL)) &&
              kvg_json_add(tags, NULL, kvg_json_new_bool(false)) && kvg_json_add(o, "inner", kvg_json_new(KVG_JSON_OBJECT));
    if (!ok) {
        kvg_json_free(o);
        return NULL;
    }
    return o;
}

static const char built_text[] = "{\"name\":\"Mira\",\"n\":3,\"ok\":true,\"tags\":[\"a\",null,false],\"inner\":{}}";

static void check_building(void) {
    kvg_json *o = build();
    CHECK(o != NULL);
    char *t = o ? kvg_json_print(o, NULL) : NULL;
    CHECKF(t && strcmp(t, built_text) == 0, "%s", t ? t : "(null)");
    kvg_free(t);
    if (o) {
        CHECK(o->n == 5 && kvg_json_get(o, "tags")->n == 3 && o->offset == 0);
        /* a member without a key, or a keyed element, or a non-container: refused, the value freed */
        CHECK(!kvg_json_add(o, NULL, kvg_json_new_number(1)));
        CHECK(!kvg_json_add(kvg_json_get(o, "tags"), "k", kvg_json_new_number(1)));
        CHECK(!kvg_json_add(kvg_json_get(o, "n"), NULL, kvg_json_new_number(1)));
        CHECK(!kvg_json_add(o, "x", NULL));
        CHECK(o->n == 5);
        /* removing members: every one of the name, the last one too, and appending after it */
        CHECK(kvg_json_add(o, "ok", kvg_json_new_number(2)) && o->n == 6);
        CHECK(kvg_json_remove(o, "ok") == 2 && o->n == 4 && !kvg_json_get(o, "ok"));
        CHECK(kvg_json_remove(o, "inner") == 1 && kvg_json_remove(o, "missing") == 0 && o->n == 3);
        CHECK(kvg_json_remove(kvg_json_get(o, "tags"), "a") == 0 && kvg_json_remove(NULL, "a") == 0);
        CHECK(kvg_json_add(o, "ok", kvg_json_new_bool(true)) && kvg_json_add(o, "inner", kvg_json_new(KVG_JSON_OBJECT)));
        t = kvg_json_print(o, NULL);
        CHECKF(t && strcmp(t, "{\"name\":\"Mira\",\"n\":3,\"tags\":[\"a\",null,false],\"ok\":true,\"inner\":{}}") == 0,
               "%s", t ? t : "(null)");
        kvg_free(t);
        CHECK(o->n == 5);
        /* strings with NUL bytes, written whole */
        kvg_json *s = kvg_json_add(o, "z", kvg_json_new_string("a\0b", 3));
        CHECK(s && s->len == 3 && s->str[3] == 0);
        kvg_buf b = {0};
        CHECK(kvg_json_write(&b, s) == 0 && b.p && strcmp(b.p, "\"a\\u0000b\"") == 0);
        kvg_free(b.p);
    }
    kvg_json_free(o);
    kvg_json *e = kvg_json_new_string(NULL, 0);
    CHECK(e && e->len == 0 && e->str && e->str[0] == 0);
    kvg_json_free(e);
    kvg_json_free(NULL);
    /* writing appends to what the buffer holds */
    kvg_buf b = {0};
    CHECK(kvg_buf_add(&b, "x=", 2) && kvg_json_write_number(&b, 2.5) == 0 && strcmp(b.p, "x=2.5") == 0);
    kvg_free(b.p);
}

/* ---- every allocation failing in turn ---- */
static long g_fail_at = -1, g_allocs, g_live;
static void *fail_malloc(void *u, size_t n) {
    (void)u;
    if (g_allocs++ == g_fail_at) return NULL;
    void *p = malloc(n);
    if (p) g_live++;
    return p;
}
static void *fail_realloc(void *u, void *p, size_t n) {
    (void)u;
    if (g_allocs++ == g_fail_at) return NULL;
    void *q = realloc(p, n);
    if (q && !p) g_live++;
    return q;
}
static void fail_free(void *u, void *p) {
    (void)u;
    if (p) g_live--;
    free(p);
}

static void check_out_of_memory(void) {
    static const kvgen_allocator failing = {fail_malloc, fail_realloc, fail_free, NULL};
    CHECK_OK(kvgen_set_allocator(&failing, &tu_err_));
    const char *text = "{\"name\":\"Mira \\u00e9\\ud83d\\ude00 and a longer string that grows its buffer past 64 "
                       "bytes\",\"list\":[1,2.5,-0,1e300,\"x\",null,true,{\"a\\u0000\":[[]]}],"
                       "\"n\":1234567890123456789012345678901234567890123456789012345678901234567890.5}";
    int parse_ok = 0, build_ok = 0;
    for (long k = 0; k < 800 && (!parse_ok || !build_ok); k++) {
        g_fail_at = k;
        g_allocs = g_live = 0;
        int parsed = 0;
        for (unsigned flags = 0; flags <= KVG_JSON_NUMBER_TEXT; flags += KVG_JSON_NUMBER_TEXT) {
            char err[64] = "";
            size_t at = 0;
            kvg_json *v = kvg_json_parse_ex(text, strlen(text), 64, flags, NULL, &at, err, sizeof err);
            if (v) {
                parsed++;
                char *t = kvg_json_print(v, NULL);
                kvg_free(t);
                kvg_json_free(v);
            } else {
                CHECKF(at == KVG_JSON_NO_MEMORY && strcmp(err, "out of memory") == 0, "allocation %ld failing: %zu '%s'",
                       k, at, err);
            }
        }
        parse_ok |= parsed == 2;
        kvg_json *o = build();
        if (o) {
            build_ok = 1;
            char *t = kvg_json_print(o, NULL);
            CHECK(!t || strcmp(t, built_text) == 0);
            kvg_free(t);
            kvg_json_free(o);
        }
        CHECKF(g_live == 0, "allocation %ld failing: %ld blocks left", k, g_live);
    }
    CHECK(parse_ok && build_ok);
    g_fail_at = -1;
    CHECK_OK(kvgen_set_allocator(NULL, &tu_err_));
}

int main(void) {
    check_round_trips();
    check_strings();
    check_errors();
    check_depth();
    check_numbers();
    check_building();
    check_out_of_memory();
    return tu_finish("test_json");
}
