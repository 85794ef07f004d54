/* test_grammar.c: GBNF grammars and JSON schemas as constrained output. The parser (good
 * grammars, bad ones with their exact messages; over 1,000 lines of tables of cases), the byte matcher (UTF-8 cut inside a token,
 * can-end and done), integer ranges of the schema compiler checked number by number, the trie
 * mask against the token-by-token reference on a small vocabulary and on the default model's,
 * and generation with temperature (random text forced through the grammar) on a random-weight
 * model (reference and cpu backends, jobs, Vulkan when a device is present) and on the default
 * model: every text is accepted by the grammar, and every schema output is validated by
 * python3-jsonschema (core/tests/validate_json.py). On the default model it prints the mask's
 * share of a decode step and decode time with and without the NPC schema (ratios of one run). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include "kvg_grammar.h"
#include "kvg_host.h"
#include "kvg_sampler.h"
#include "kvg_str.h"
#include "testutil.h"

static const char g_npc[] =
    "{\"type\":\"object\",\"properties\":{\"line\":{\"type\":\"string\"},\"mood\":{\"enum\":[\"angry\",\"calm\"]},"
    "\"action\":{\"type\":\"object\",\"properties\":{\"type\":{\"const\":\"give\"},\"item\":{\"type\":\"string\"},"
    "\"count\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":5}},\"required\":[\"type\",\"item\",\"count\"]}},"
    "\"required\":[\"line\",\"mood\",\"action\"]}";

static const char g_mixed[] =
    "{\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\",\"minimum\":-2.5,"
    "\"maximum\":3},\"y\":{\"type\":\"integer\",\"minimum\":-20,\"maximum\":300}},\"required\":[\"x\"]}},"
    "\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":8},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"enum\":[\"a\",\"b\",\"c\\\"q\"]},\"minItems\":1,"
    "\"maxItems\":3},\"pts\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/pt\"},\"maxItems\":2},"
    "\"ok\":{\"type\":\"boolean\"},\"none\":{\"type\":\"null\"},\"v\":{\"anyOf\":[{\"type\":\"integer\","
    "\"minimum\":0,\"maximum\":9},{\"type\":\"string\",\"maxLength\":3}]},\"t\":{\"type\":[\"integer\",\"null\"],"
    "\"minimum\":-10,\"maximum\":10}},\"required\":[\"name\",\"tags\"]}";

static const char g_array[] = "{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":-1000,"
                              "\"maximum\":1000000},\"minItems\":2,\"maxItems\":5}";

static const char *const g_schemas[] = {g_npc, g_mixed, g_array};

static const char g_list[] = "# a list of one to four items\n"
                             "root ::= item (\",\" item){0,3}   # trailing comment\n"
                             "item ::= [a-c]+ | \"\\x41\" | \"\\u00e9\" | \"\xe2\x82\xac\" | num\n"
                             "num  ::= \"-\"? [1-9] [0-9]?\n";
static const char g_dots[] = "root ::= \"<\" . . \">\" ( \"!\"* | [^<>a-z]? )";
static const char g_nest[] = "root ::= value\n"
                             "value ::= \"[\" ( value (\",\" value)* )? \"]\"\n"
                             "        | \"1\"\n";
/* docs/generation.md's example */
static const char g_doc[] = "# an NPC's answer\n"
                            "root   ::= \"{\" \"\\\"line\\\":\" string \",\\\"mood\\\":\" mood \"}\"\n"
                            "mood   ::= \"\\\"angry\\\"\" | \"\\\"calm\\\"\"\n"
                            "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\nt] ){0,64} \"\\\"\"\n";
static const char *const g_grammars[] = {g_list, g_dots, g_nest, g_doc};

static kvg_gram *parse(const char *text) {
    kvg_gram *g = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvg_gram_parse(text, &g, &err);
    CHECKF(st == KVGEN_OK, "%s: %s", text, err.message);
    return g;
}

static void bad_grammar(const char *text, const char *message) {
    kvg_gram *g = NULL;
    kvgen_error err = {0};
    char *copy = kvg_strdup(text); /* exactly its size: a read past the end is a sanitizer error */
    kvgen_status st = copy ? kvg_gram_parse(copy, &g, &err) : KVGEN_E_NO_MEMORY;
    kvg_free(copy);
    CHECKF(st == KVGEN_E_INVALID_ARGUMENT && !g && strcmp(err.message, message) == 0, "%s:\n  got  %s\n  want %s",
           text, err.message, message);
    kvg_gram_free(g);
}

static void bad_schema(const char *schema, const char *message) {
    kvgen_constraint c = {.kind = KVGEN_CONSTRAIN_SCHEMA, .schema = schema};
    kvgen_generate_desc d = {.constraint = &c};
    kvgen_error err = {0};
    kvgen_status st = kvgen_generate_check(&d, &err);
    CHECKF(st == KVGEN_E_INVALID_ARGUMENT && strcmp(err.message, message) == 0, "%s:\n  got  %s\n  want %s", schema,
           err.message, message);
}

typedef struct refusal {
    const char *text, *message; /* a grammar or schema, and the exact message that refuses it */
} refusal;
#define COUNT(a) (sizeof (a) / sizeof (a)[0])

static void bad_grammars(const refusal *r, size_t n) {
    for (size_t i = 0; i < n; i++) bad_grammar(r[i].text, r[i].message);
}

static void bad_schemas(const refusal *r, size_t n) {
    for (size_t i = 0; i < n; i++) bad_schema(r[i].text, r[i].message);
}

/* whether the grammar accepts text as a whole (complete == true) or as a prefix */
static bool accepts(kvg_gram *g, const char *text, bool complete) {
    kvg_gram_match *mt = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvg_gram_match_new(g, &mt, &err));
    if (!mt) return false;
    bool ok = kvg_gram_feed(mt, (const unsigned char *)text, strlen(text));
    if (ok && complete) ok = kvg_gram_can_end(mt);
    kvg_gram_match_free(mt);
    return ok;
}

static kvg_gram *schema_gram(const char *schema) {
    char *gbnf = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvg_schema_to_gbnf(schema, &gbnf, &err);
    CHECKF(st == KVGEN_OK, "%s: %s", schema, err.message);
    kvg_gram *g = gbnf ? parse(gbnf) : NULL;
    kvg_free(gbnf);
    return g;
}

enum { PREFIX = 0, WHOLE = 1 };
typedef struct judged {
    const char *text;
    bool complete; /* WHOLE: accepted as a complete text; PREFIX: as a prefix */
    bool want;
} judged;

/* the grammar (or the schema's) judges each text as the table says */
static void check_judged(const char *grammar, bool schema, const judged *j, size_t n) {
    kvg_gram *g = schema ? schema_gram(grammar) : parse(grammar);
    for (size_t i = 0; g && i < n; i++)
        CHECKF(accepts(g, j[i].text, j[i].complete) == j[i].want, "%s:\n  \"%s\" %s: want %s", grammar, j[i].text,
               j[i].complete ? "whole" : "as a prefix", j[i].want ? "accepted" : "refused");
    kvg_gram_free(g);
}

static void check_parser(void) {
    static const refusal refused[] = {
        {"root ::= foo", "grammar: rule 'foo' is used (line 1 column 10) but never defined"},
        {"a ::= \"x\"", "grammar: no rule 'root' (the rule the text must match)"},
        {"root ::= \"x\" root", "grammar: rule 'root' (line 1 column 1) never completes: every way through it needs "
                                "itself again (the grammar matches no text)"},
        {"root ::= \"a\" b\nb ::= \"x\" b | \"y\" c\nc ::= b",
         "grammar: rule 'b' (line 2 column 1) never completes: every way through it needs itself again (the grammar "
         "matches no text)"},
        {"root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"",
         "grammar: rule 'expr' (line 2 column 1) is left-recursive: it can reach itself without reading a byte"},
        {"root ::= (\"a\"?)*", "grammar: rule 'root' (line 1 column 1) is left-recursive: it can reach itself without "
                               "reading a byte (in a repetition of text that can be empty)"},
        {"root ::= \"abc", "grammar: line 1 column 10: string literal is not closed with '\"'"},
        {"root ::= [a-", "grammar: line 1 column 10: character class is not closed with ']'"},
        {"root ::= \"x\"{3,1}", "grammar: line 1 column 13: repetition {3,1}: the maximum is below the minimum"},
        {"root ::= \"a\"\nroot ::= \"b\"",
         "grammar: line 2 column 1: rule 'root' is defined twice (first at line 1 column 1)"},
        {"root ::= * \"a\"", "grammar: line 1 column 10: '*' follows nothing it could repeat"},
        {"root ::= \"\\q\"", "grammar: line 1 column 11: unknown escape \\q"},
        {"root ::= []", "grammar: line 1 column 10: empty character class"},
        {"root ::= (\"a\"", "grammar: line 1 column 10: group is not closed with ')'"},
        {"root = \"a\"", "grammar: line 1 column 6: expected '::=' after rule name 'root'"},
        {"root ::= [^\xc3\xa9]", "grammar: line 1 column 10: a negated class may exclude only ASCII characters "
                                 "(U+00E9)"},
    };
    bad_grammars(refused, COUNT(refused));

    static const char g_abc[] = "root ::= \"a\" [0-9]+ (\"x\" | \"yz\")? \"!\"";
    static const judged abc[] = {
        {"a1!", WHOLE, true},  {"a12x!", WHOLE, true}, {"a3yz!", WHOLE, true}, {"a!", PREFIX, false},
        {"ax!", PREFIX, false}, {"a1y!", PREFIX, false}, {"a1y", PREFIX, true}, {"a1y", WHOLE, false},
        {"a1!!", PREFIX, false},
    };
    check_judged(g_abc, false, abc, COUNT(abc));
    kvg_gram *g = parse(g_abc);
    if (g) {
        kvg_gram_match *mt = NULL;
        kvgen_error err = {0};
        CHECK_OK(kvg_gram_match_new(g, &mt, &err));
        CHECK(kvg_gram_feed(mt, (const unsigned char *)"a1", 2) && !kvg_gram_can_end(mt) && !kvg_gram_done(mt));
        CHECK(!kvg_gram_feed(mt, (const unsigned char *)"?", 1)); /* refused: state unchanged */
        CHECK(kvg_gram_feed(mt, (const unsigned char *)"!", 1) && kvg_gram_can_end(mt) && kvg_gram_done(mt));
        kvg_gram_match_free(mt);
        kvg_gram_free(g);
    }
    static const judged list[] = {
        {"a", WHOLE, true},         {"abc,A,\xc3\xa9,-42", WHOLE, true}, {"\xe2\x82\xac,7", WHOLE, true},
        {"a,b,c,a,b", PREFIX, false}, {"d", PREFIX, false},                {"01", PREFIX, false},
        {"a,\xe2\x82", PREFIX, true}, {"a,\xe2\x82", WHOLE, false}, /* a character cut in two */
    };
    check_judged(g_list, false, list, COUNT(list));
    static const judged dots[] = {
        {"<ab>", WHOLE, true},
        {"<\xc3\xa9\xe2\x82\xac>!!", WHOLE, true},
        {"<a\x01>A", WHOLE, true},
        {"<a>", WHOLE, false},
        {"<\xff\xfe>", PREFIX, false},
        {"<\xc3\x28", PREFIX, false},
        {"<ab>a", PREFIX, false},
        {"<ab>\xed\xa0\x80", PREFIX, false}, /* a surrogate is no character */
        {"<ab>\xf0\x9f\x98\x80", WHOLE, true},
        {"<ab>\xf4\x90\x80\x80", PREFIX, false},
    };
    check_judged(g_dots, false, dots, COUNT(dots));
    static const judged nest[] = {{"[1,[1,[]],[[1]]]", WHOLE, true}, {"[1,]", PREFIX, false}, {"[1", WHOLE, false}};
    check_judged(g_nest, false, nest, COUNT(nest));
}

static void check_schema(void) {
    static const refusal refused[] = {
        {"{\"type\":\"string\",\"pattern\":\"a+\"}", "schema: #: keyword 'pattern' is not supported"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"email\"}}}",
         "schema: #/properties/a: keyword 'format' is not supported"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"b\"]}",
         "schema: #: keyword 'required' names 'b', which is not in 'properties'"},
        {"{\"$ref\":\"#/components/x\"}",
         "schema: #: keyword '$ref' \"#/components/x\": only #/$defs/NAME (or #/definitions/NAME) of this schema"},
        {"{\"type\":\"object\"", "schema: not valid JSON at byte 16: expected ',' or '}'"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":2}",
         "schema: #: keywords 'minimum'/'maximum' leave no integer in 5..2"},
        {"{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"date\"}]}}",
         "schema: #/items/anyOf/1: type 'date' is not supported (object, array, string, integer, number, boolean, "
         "null)"},
        {"{\"enum\":[1,2],\"minimum\":0}", "schema: #: keyword 'minimum' beside 'enum' is not supported"},
        {"{\"type\":\"string\",\"enum\":[\"a\",2]}",
         "schema: #: keyword 'enum' holds a value that is not of the schema's 'type'"},
        /* an error after a rule's body was begun frees the body (LeakSanitizer), nested or not */
        {"{\"type\":[\"string\",1]}", "schema: #: keyword 'type' lists a value that is not a string"},
        {"{\"type\":[\"string\",{}]}", "schema: #: keyword 'type' lists a value that is not a string"},
        {"{\"type\":[\"integer\",\"date\"]}",
         "schema: #: type 'date' is not supported (object, array, string, integer, number, boolean, null)"},
        {"{\"anyOf\":[{\"type\":\"null\"},{\"type\":[\"null\",\"boolean\",[]]}]}",
         "schema: #/anyOf/1: keyword 'type' lists a value that is not a string"},
        {"{\"type\":\"array\",\"items\":{\"type\":[\"array\",true],\"items\":{\"type\":\"null\"}}}",
         "schema: #/items: keyword 'type' lists a value that is not a string"},
        /* strings that are not UTF-8 (JSON text is): refused by the compiler, naming the path */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"const\":\"x\xff\"}}}",
         "schema: #/properties/a: keyword 'const' holds a string that is not valid UTF-8"},
        {"{\"const\":{\"k\":[\"\xc3\"]}}", "schema: #: keyword 'const' holds a string that is not valid UTF-8"},
        {"{\"enum\":[\"ok\",\"\xed\xa0\x80\"]}",
         "schema: #: keyword 'enum' value 1 holds a string that is not valid UTF-8"},
        {"{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"object\",\"properties\":{\"ok\":true,"
         "\"\xc0\xaf\":true}}}}",
         "schema: #/properties/b: keyword 'properties': property name 1 is not valid UTF-8"},
    };
    bad_schemas(refused, COUNT(refused));

    static const judged npc[] = {
        {"{\"line\":\"Take it.\",\"mood\":\"calm\",\"action\":{\"type\":\"give\",\"item\":\"sword\","
         "\"count\":3}}",
         WHOLE, true},
        {"{\"line\":\"\\\"\xc3\xa9\\n\",\"mood\":\"angry\",\"action\":{\"type\":\"give\",\"item\":\"\",\"count\":5}}",
         WHOLE, true},
        {"{\"line\":\"x\",\"mood\":\"happy\"", PREFIX, false},
        {"{\"line\":\"x\",\"mood\":\"calm\",\"action\":{\"type\":\"give\",\"item\":\"a\",\"count\":6", PREFIX, false},
        {"{\"mood\":", PREFIX, false},
        {"{ \"line\"", PREFIX, false},
    };
    check_judged(g_npc, true, npc, COUNT(npc));
    static const judged mixed[] = {
        {"{\"name\":\"ab\",\"tags\":[\"a\"]}", WHOLE, true},
        {"{\"name\":\"ab\",\"tags\":[\"a\",\"c\\\"q\"],\"ok\":true,\"t\":null}", WHOLE, true},
        {"{\"name\":\"ab\",\"tags\":[\"b\"],\"pts\":[{\"x\":-1.5,\"y\":300},{\"x\":2.999}],\"v\":\"x\"}", WHOLE, true},
        {"{\"name\":\"a\",", PREFIX, false},
        {"{\"name\":\"ab\",\"tags\":[]", PREFIX, false},
        {"{\"name\":\"ab\",\"tags\":[\"a\"],\"pts\":[{\"x\":3.5", PREFIX, false},
        {"{\"name\":\"ab\",\"tags\":[\"a\"],\"pts\":[{\"x\":-2.1", PREFIX, false},
        {"{\"name\":\"ab\",\"tags\":[\"a\"],\"ok\":true,\"pts\"", PREFIX, false}, /* schema order */
    };
    check_judged(g_mixed, true, mixed, COUNT(mixed));
    kvg_gram *g;
    /* integer ranges: every number near the bounds, as text */
    static const long long ranges[][2] = {{1, 5},     {0, 0},         {-12, 7},   {15, 1234},   {-1000, -37},
                                          {99, 100},  {-5, -5},       {7, 80000}, {-99999, 99}, {100, 999}};
    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
        char schema[160];
        long long lo = ranges[r][0], hi = ranges[r][1];
        snprintf(schema, sizeof schema, "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}", lo, hi);
        if (!(g = schema_gram(schema))) continue;
        int wrong = 0;
        for (long long v = lo - 1200; v <= hi + 1200; v++) {
            if (v > lo + 1200 && v < hi - 1200) v = hi - 1200;
            char t[32];
            snprintf(t, sizeof t, "%lld", v);
            wrong += accepts(g, t, true) != (v >= lo && v <= hi);
        }
        wrong += accepts(g, "-0", true) + accepts(g, "007", true);
        CHECKF(wrong == 0, "integer range %lld..%lld: %d numbers misjudged", lo, hi, wrong);
        kvg_gram_free(g);
    }
}

/* The parser's and the matcher's bounds: deep nesting, nested repetitions, ambiguity and
 * costly masks are refused or end with a message naming the bound; nothing overflows the C
 * stack or reads past the text. Work is counted in matcher steps, never timed. */
static char *repeated(const char *head, const char *open, const char *mid, const char *close, int n) {
    size_t len = strlen(head) + (strlen(open) + strlen(close)) * (size_t)n + strlen(mid) + 1;
    char *t = kvg_malloc(len), *q = t;
    if (!t) return NULL;
    q += sprintf(q, "%s", head);
    for (int i = 0; i < n; i++) q += sprintf(q, "%s", open);
    q += sprintf(q, "%s", mid);
    for (int i = 0; i < n; i++) q += sprintf(q, "%s", close);
    return t;
}

/* feeds text a byte at a time: how many bytes were accepted before the first refusal */
static size_t feed_bytes(kvg_gram_match *mt, const char *text, size_t n) {
    size_t i = 0;
    while (i < n && kvg_gram_feed(mt, (const unsigned char *)text + i, 1)) i++;
    return i;
}

static bool contains(const char *s, const char *part) { return s && strstr(s, part) != NULL; }

static void check_bounds(void) {
    kvgen_error err = {0};
    /* groups nested 100,000 deep: refused at the 257th, naming the bound and the byte */
    char *deep = repeated("root ::= ", "(", "\"a\"", ")", 100000);
    if (deep) bad_grammar(deep, "grammar: line 1 column 266: groups nested over 256 deep (byte 265)");
    kvg_free(deep);
    char *ok = repeated("root ::= ", "(", "\"a\"", ")", 256);
    kvg_gram *g = ok ? parse(ok) : NULL;
    if (g) CHECK(accepts(g, "a", true));
    kvg_gram_free(g);
    kvg_free(ok);
    /* nested bounded repetitions multiply: refused where the product passes the bound */
    bad_grammar("root ::= ((\"a\"{0,4096}){0,4096}){0,4096}",
                "grammar: line 1 column 24: the repetition expands to 16777216 elements, over the limit of 1048576 "
                "(byte 23)");
    bad_grammar("root ::= x x\nx ::= (\"ab\"{1024}){512}",
                "grammar: line 2 column 1: the grammar expands to over 1048576 elements with its repetitions "
                "written out (rule 'x', byte 13)");
    /* a chain of rules deeper than the C stack: the checks walk it with a list of their own */
    {
        enum { N = 100000 };
        char *chain = kvg_malloc((size_t)N * 24 + 64), *q = chain;
        if (chain) {
            q += sprintf(q, "root ::= r0\n");
            for (int i = 0; i < N - 1; i++) q += sprintf(q, "r%d ::= r%d\n", i, i + 1);
            q += sprintf(q, "r%d ::= \"z\"\n", N - 1);
            if ((g = parse(chain))) CHECK(accepts(g, "z", true) && !accepts(g, "zz", false));
            kvg_gram_free(g);
            q = chain + sprintf(chain, "root ::= r0\n");
            for (int i = 0; i < N - 1; i++) q += sprintf(q, "r%d ::= r%d \"z\"\n", i, i + 1);
            q += sprintf(q, "r%d ::= r0 | \"z\"\n", N - 1);
            bad_grammar(chain, "grammar: rule 'r0' (line 2 column 1) is left-recursive: it can reach itself without "
                               "reading a byte");
            q = chain + sprintf(chain, "root ::= r0\n");
            for (int i = 0; i < N - 1; i++) q += sprintf(q, "r%d ::= \"z\" r%d\n", i, i + 1);
            q += sprintf(q, "r%d ::= r0\n", N - 1);
            bad_grammar(chain, "grammar: rule 'r0' (line 2 column 1) never completes: every way through it needs "
                               "itself again (the grammar matches no text)");
            kvg_free(chain);
        }
    }
    /* an escape cut by the end of the text (bad_grammar's copy is exactly the text's size) */
    static const refusal cut[] = {
        {"root ::= \"abc\\", "grammar: line 1 column 14: '\\' at the end of the grammar (byte 13)"},
        {"root ::= [\\", "grammar: line 1 column 11: '\\' at the end of the grammar (byte 10)"},
        {"root ::= [a-\\", "grammar: line 1 column 13: '\\' at the end of the grammar (byte 12)"},
        {"root ::= \"\\x4", "grammar: line 1 column 11: \\x needs 2 hexadecimal digits"},
        {"root ::= \"\\", "grammar: line 1 column 11: '\\' at the end of the grammar (byte 10)"},
    };
    bad_grammars(cut, COUNT(cut));

    /* nested repetitions of text that can be empty: the closure follows them with a list */
    if ((g = parse("root ::= ((\"a\"?){0,300}){0,300}"))) {
        kvg_gram_match *mt = NULL;
        CHECK_OK(kvg_gram_match_new(g, &mt, &err));
        if (mt) {
            CHECK(kvg_gram_can_end(mt));
            size_t n = feed_bytes(mt, "aaaaaaaa", 8);
            const kvgen_error *f = kvg_gram_match_failure(mt);
            printf("test_grammar: ((\"a\"?){0,300}){0,300}: %zu bytes of 8 matched%s%s\n", n, f ? ": " : "",
                   f ? f->message : "");
            CHECKF(n == 8 ? kvg_gram_can_end(mt) : f && contains(f->message, "matcher steps"), "%zu bytes", n);
            CHECK(!kvg_gram_feed(mt, (const unsigned char *)"b", 1));
        }
        kvg_gram_match_free(mt);
        kvg_gram_free(g);
    }
    /* empty iterations are not followed and stacks that others dominate are dropped, and that
     * changes no text: the same language as the repetition written with non-empty pieces, and
     * as that one written with nested groups (no repetition at all), checked on every text over
     * a, b, c up to 8 bytes (whole and as a prefix) */
    kvg_gram *g1 = parse("root ::= ((\"a\"? \"b\"?){0,3}){0,2} \"c\"? (x \"c\")?\nx ::= (\"b\"?){2,3}");
    kvg_gram *g2 = parse("root ::= (\"a\" | \"b\" | \"ab\"){0,6} \"c\"? (\"b\"{0,3} \"c\")?");
    kvg_gram *g3 = parse("root ::= (p (p (p (p (p p?)?)?)?)?)? \"c\"? ((\"b\" (\"b\" \"b\"?)?)? \"c\")?\n"
                         "p ::= \"a\" | \"b\" | \"ab\"");
    int differ = 0, texts = 0;
    for (int len = 0; g1 && g2 && g3 && len <= 8; len++) {
        int total = 1;
        for (int i = 0; i < len; i++) total *= 3;
        for (int v = 0; v < total; v++, texts++) {
            char t[9];
            for (int i = 0, x = v; i < len; i++, x /= 3) t[i] = (char)('a' + x % 3);
            t[len] = 0;
            for (int whole = 0; whole < 2; whole++) {
                bool want = accepts(g3, t, whole);
                differ += accepts(g1, t, whole) != want;
                differ += accepts(g2, t, whole) != want;
            }
        }
    }
    CHECKF(differ == 0, "%d of %d texts judged differently", differ, texts);
    kvg_gram_free(g1);
    kvg_gram_free(g2);
    kvg_gram_free(g3);
    /* copies that must all be passed (not a chain): a million stacks at the start, refused when
     * the matcher is made (a generation is refused when it begins) */
    if ((g = parse("root ::= ((\"a\"?){1000}){1000}"))) {
        kvg_gram_match *mt = NULL;
        CHECK(kvg_gram_match_new(g, &mt, &err) == KVGEN_E_UNSUPPORTED && !mt);
        CHECKF(contains(err.message, "grammar: its start needs over 2097152 matcher steps"), "%s", err.message);
        kvg_gram_free(g);
    }
    /* the same with named rules (not multiplied by the parser's bound): a long text in one call,
     * a few states of a few stacks each (the stacks of other splits of the a's are dominated) */
    if ((g = parse("root ::= x{0,1000} \"!\"\nx ::= (\"a\"?){0,1000}"))) {
        kvg_gram_match *mt = NULL;
        CHECK_OK(kvg_gram_match_new(g, &mt, &err)); /* a million stacks at its start, were empty x followed */
        CHECK(mt && kvg_gram_can_end(mt) == false && kvg_gram_feed(mt, (const unsigned char *)"aaa!", 4) &&
              kvg_gram_done(mt));
        kvg_gram_match_free(mt);
        kvg_gram_free(g);
    }
    if ((g = parse("root ::= x{0,100} \"!\"\nx ::= (\"a\"?){0,100}"))) {
        kvg_gram_match *mt = NULL;
        CHECK_OK(kvg_gram_match_new(g, &mt, &err));
        char *a = kvg_malloc(10001);
        if (mt && a) { /* at most 100 * 100 a's */
            memset(a, 'a', 10000);
            a[10000] = 0;
            CHECK(kvg_gram_feed(mt, (const unsigned char *)a, 10000) && !kvg_gram_match_failure(mt));
            CHECK(!kvg_gram_feed(mt, (const unsigned char *)"a", 1) && !kvg_gram_match_failure(mt));
            CHECK(kvg_gram_feed(mt, (const unsigned char *)"!", 1) && kvg_gram_done(mt));
        }
        kvg_free(a);
        kvg_gram_match_free(mt);
        kvg_gram_free(g);
    }
    /* an ambiguous recursive grammar: equal stacks are shared, and when the text's stacks still
     * outgrow the step bound the feed fails with a message (it is not refused silently) */
    if ((g = parse("root ::= (\"b\" root \"b\"?)+ \"!\" | \"\""))) {
        kvg_gram_match *mt = NULL;
        CHECK_OK(kvg_gram_match_new(g, &mt, &err));
        if (mt) {
            static const char bs[] = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
            size_t n = feed_bytes(mt, bs, 64);
            const kvgen_error *f = kvg_gram_match_failure(mt);
            printf("test_grammar: ambiguous grammar: %zu bytes of 64 matched%s%s\n", n, f ? ": " : "",
                   f ? f->message : "");
            CHECKF(n == 64 || (f && f->status == KVGEN_E_UNSUPPORTED && contains(f->message, "matcher steps")),
                   "refused at byte %zu without a message", n);
            if (f) CHECK(!kvg_gram_feed(mt, (const unsigned char *)"!", 1)); /* failed until a reset */
            kvg_gram_match_reset(mt);
            CHECK(!kvg_gram_match_failure(mt));
            CHECK(kvg_gram_feed(mt, (const unsigned char *)"bb!b!", 5) && kvg_gram_can_end(mt));
        }
        kvg_gram_match_free(mt);
        kvg_gram_free(g);
    }
}

/* A trie of a vocabulary of its own: token i's bytes are pieces[i] (into off and bytes, which
 * have room for n + 1 offsets and every piece), token 0 is end-of-generation. */
static kvg_vocab_trie *small_trie(const char *const *pieces, int n, uint32_t *off, unsigned char *bytes) {
    uint8_t *eog = kvg_calloc((size_t)n, 1);
    if (!eog) return NULL;
    eog[0] = 1;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        off[i] = (uint32_t)at;
        memcpy(bytes + at, pieces[i], strlen(pieces[i]));
        at += strlen(pieces[i]);
    }
    off[n] = (uint32_t)at;
    kvg_vocab_trie *trie = kvg_vocab_trie_build(n, off, bytes, eog);
    kvg_free(eog);
    return trie;
}

/* A costly mask on a small vocabulary: every token's mask stays within the step bound, or the
 * mask fails (-1) with the bound's message; a matcher given a small bound fails the same way
 * at once, and the same text always ends at the same token (no clock involved). */
static void check_costly_mask(void) {
    static const char *const pieces[] = {"</s>", "a", "b", "ab", "abc", "q", "zz", "x", "-", " ", "hello", "qrs",
                                         "\xc3\xa9", "aaaa", "abcdefgh", "y"};
    enum { N = sizeof pieces / sizeof pieces[0] };
    uint32_t off[N + 1];
    unsigned char bytes[256];
    kvg_vocab_trie *trie = small_trie(pieces, N, off, bytes);
    CHECK(trie != NULL);
    kvg_gram *g = parse("root ::= ([^x]{0,64} [a-z]{0,64}){0,64}");
    int ended[2] = {-1, -1};
    for (int run = 0; trie && g && run < 2; run++) {
        kvg_gram_match *mt = NULL;
        kvgen_error err = {0};
        CHECK_OK(kvg_gram_match_new(g, &mt, &err));
        for (int k = 0; mt && k < 40; k++) {
            uint8_t allowed[N];
            err = (kvgen_error){0};
            int count = kvg_gram_mask(mt, trie, allowed, &err);
            if (count < 0) {
                CHECKF(err.status == KVGEN_E_UNSUPPORTED && contains(err.message, "matcher steps"), "%s",
                       err.message);
                int zero = 0;
                for (int t = 0; t < N; t++) zero += allowed[t] == 0;
                CHECK(zero == N);
                ended[run] = k;
                break;
            }
            int pick = -1; /* the longest allowed token that is not end-of-generation */
            for (int t = 1; t < N; t++)
                if (allowed[t] && (pick < 0 || off[t + 1] - off[t] > off[pick + 1] - off[pick])) pick = t;
            if (pick < 0) break;
            CHECK(kvg_gram_feed(mt, bytes + off[pick], off[pick + 1] - off[pick]));
        }
        kvg_gram_match_free(mt);
    }
    printf("test_grammar: costly grammar, small vocabulary: %s at token %d\n", ended[0] < 0 ? "completed" : "ended",
           ended[0]);
    CHECK(ended[0] == ended[1]);
    /* a small bound: the first mask fails, naming it */
    kvg_gram_match *mt = NULL;
    kvgen_error err = {0};
    if (g) CHECK_OK(kvg_gram_match_new(g, &mt, &err));
    if (mt && trie) {
        kvg_gram_match_set_max_steps(mt, 1000);
        uint8_t allowed[N];
        CHECK(kvg_gram_mask(mt, trie, allowed, &err) == -1);
        CHECKF(err.status == KVGEN_E_UNSUPPORTED && contains(err.message, "over 1000 matcher steps"), "%s",
               err.message);
        CHECK(kvg_gram_mask(mt, trie, allowed, &err) == -1); /* still failed */
        kvg_gram_match_set_max_steps(mt, 0);
        kvg_gram_match_reset(mt);
        CHECK(kvg_gram_mask(mt, trie, allowed, &err) > 0);
    }
    kvg_gram_match_free(mt);
    kvg_gram_free(g);
    kvg_vocab_trie_free(trie);
}

/* Generates from the prompt ids until the generation ends: its finish (error when it could not
 * begin), how many steps gave a token before it, and the last call's status (message in err). */
static kvgen_finish gen_to_end(kvgen_session *s, const int32_t *ids, size_t n, const kvgen_generate_desc *gd,
                               int *tokens, kvgen_status *rc, kvgen_error *err) {
    kvgen_gen *g = NULL;
    *tokens = 0;
    *rc = KVGEN_OK;
    if (s) CHECK_OK(kvgen_gen_begin_prompt(s, ids, n, gd, &g, err));
    kvgen_gen_step st = {0};
    while (g && (*rc = kvgen_gen_next(g, &st, err)) == KVGEN_OK && st.finish == KVGEN_FINISH_NONE) (*tokens)++;
    kvgen_finish fin = g ? kvgen_gen_finish(g) : KVGEN_FINISH_ERROR;
    kvgen_gen_end(g);
    return fin;
}

/* Polls the jobs until each is done, cancelled or failed (max_spins polls a millisecond apart:
 * a hang guard, not a timing). */
static void wait_jobs(kvgen_job *const *jobs, int n, long max_spins) {
    for (long spin = 0; spin < max_spins; spin++) {
        int ended = 0;
        for (int i = 0; i < n; i++) ended += kvgen_job_poll(jobs[i], NULL, NULL) >= KVGEN_JOB_DONE;
        if (ended == n) return;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* Costly grammars on a model: each generation of 20 tokens ends with its text or with an
 * error naming the matcher's bound, never a silent refusal (a dead end); told apart by
 * behaviour, never by time. */
static void check_costly_generation(kvgen_model *m, const char *what) {
    static const char *const grammars[] = {"root ::= ([^x]{0,64} [a-z]{0,64}){0,64}",
                                           "root ::= ((\"a\"?){0,300}){0,300}",
                                           "root ::= (\"b\" root \"b\"?)+ \"!\" | \"\""};
    for (size_t i = 0; i < sizeof grammars / sizeof grammars[0]; i++) {
        kvgen_session_desc sd = {.n_ctx = 256, .seed = 7, .temperature = 1.0f};
        kvgen_session *s = NULL;
        kvgen_error err = {0};
        CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
        kvgen_constraint c = {.kind = KVGEN_CONSTRAIN_GRAMMAR, .grammar = grammars[i]};
        kvgen_generate_desc gd = {.constraint = &c, .max_tokens = 20};
        int32_t ids[64];
        size_t n = 0;
        CHECK_OK(kvgen_tokenize(m, "x", 1, 0, ids, 64, &n, &err));
        kvgen_status rc;
        int tokens;
        kvgen_finish fin = gen_to_end(s, ids, n, &gd, &tokens, &rc, &err);
        printf("test_grammar: %s: %s: %s after %d tokens%s%s\n", what, grammars[i], kvgen_finish_name(fin), tokens,
               rc != KVGEN_OK ? ": " : "", rc != KVGEN_OK ? err.message : "");
        CHECKF(fin == KVGEN_FINISH_STOP || fin == KVGEN_FINISH_LENGTH ||
                   (fin == KVGEN_FINISH_ERROR && rc == KVGEN_E_UNSUPPORTED && contains(err.message, "matcher steps")),
               "%s: %s: %s (%s)", what, grammars[i], kvgen_finish_name(fin), err.message);
        kvgen_session_close(s);
    }
}

/* An ambiguous grammar whose text is held to runs of b (a logit bias bans every other token
 * and end-of-generation): the generation ends with error at the matcher's step bound and a
 * message naming it, as a direct generation and as a job, while another session's plain job
 * on the same worker finishes its 20 tokens. Asserted on what happens, never on time. */
static void check_bound_generation(kvgen_model *m, const char *what) {
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    kvgen_logit_bias *bans = kvg_malloc((size_t)info.n_vocab * sizeof *bans);
    int n_bans = 0, n_b = 0;
    for (int t = 0; bans && t < info.n_vocab; t++) {
        char piece[256];
        size_t len = kvgen_token_piece(m, t, 0, piece, sizeof piece);
        bool only_b = len > 0 && len < sizeof piece && !kvgen_token_is_eog(m, t);
        for (size_t i = 0; only_b && i < len; i++) only_b = piece[i] == 'b';
        if (only_b) n_b++;
        else bans[n_bans++] = (kvgen_logit_bias){.token = t, .bias = -INFINITY};
    }
    if (!bans || n_b == 0) {
        printf("test_grammar: %s: no token of only b: the bound is not reached in a generation\n", what);
        kvg_free(bans);
        return;
    }
    kvgen_sampler_desc smp = {.seed = 3, .temperature = 1.0f, .bias = bans, .n_bias = n_bans};
    kvgen_session_desc sd = {.n_ctx = 512, .sampler = &smp};
    kvgen_constraint c = {.kind = KVGEN_CONSTRAIN_GRAMMAR, .grammar = "root ::= (\"b\" root \"b\"?)+ \"!\" | \"\""};
    kvgen_generate_desc gd = {.constraint = &c, .max_tokens = 400};
    int32_t ids[64];
    size_t n = 0;
    kvgen_error err = {0};
    CHECK_OK(kvgen_tokenize(m, "x", 1, 0, ids, 64, &n, &err));
    kvgen_session *s = NULL, *s2 = NULL;
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    kvgen_status rc;
    int tokens;
    kvgen_finish fin = gen_to_end(s, ids, n, &gd, &tokens, &rc, &err);
    printf("test_grammar: %s: runs of b: %s after %d tokens: %s\n", what, kvgen_finish_name(fin), tokens, err.message);
    CHECKF(fin == KVGEN_FINISH_ERROR && rc == KVGEN_E_UNSUPPORTED &&
               contains(err.message, "over 2097152 matcher steps") && tokens > 0,
           "%s: %s after %d tokens (%s)", what, kvgen_finish_name(fin), tokens, err.message);
    /* the same as a job, beside a plain one */
    kvgen_session_desc sd2 = {.n_ctx = 512, .seed = 4};
    CHECK_OK(kvgen_session_create(m, &sd2, &s2, &err));
    kvgen_job_desc jd = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = ids, .n_tokens = n, .gen = gd};
    kvgen_job_desc plain = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = ids, .n_tokens = n,
                            .gen = {.max_tokens = 20, .ignore_eog = 1}};
    kvgen_job *j = NULL, *j2 = NULL;
    if (s && s2) {
        CHECK_OK(kvgen_job_submit(s, &jd, &j, &err));
        CHECK_OK(kvgen_job_submit(s2, &plain, &j2, &err));
    }
    kvgen_job_info a = {0}, b = {0};
    if (j && j2) {
        kvgen_job *const both[] = {j, j2};
        wait_jobs(both, 2, 600000L); /* minutes */
        kvgen_job_get_info(j, &a);
        kvgen_job_get_info(j2, &b);
        CHECKF(a.state == KVGEN_JOB_FAILED && a.finish == KVGEN_FINISH_ERROR &&
                   contains(a.error.message, "over 2097152 matcher steps"),
               "%s: grammar job %d (%s)", what, (int)a.state, a.error.message);
        CHECKF(b.state == KVGEN_JOB_DONE && b.finish == KVGEN_FINISH_LENGTH, "%s: plain job %d (%s)", what,
               (int)b.state, b.error.message);
    }
    kvgen_job_release(j);
    kvgen_job_release(j2);
    kvgen_session_close(s);
    kvgen_session_close(s2);
    kvg_free(bans);
}

/* A reset after a failed call rebuilds the caches under the step bound then in force: where the
 * start state needs more than that bound, the matcher is left with no state at all, and every
 * call refuses (naming the bound) instead of reading a state that is not there, until a reset
 * under a larger bound. */
static void check_reset_under_bound(void) {
    kvg_gram *g = parse("root ::= (|||||||||||||||||||.||||||||\"ab\" | \"c\"){321} x?\nx ::= \"x\"{5,232} [a-cy]*");
    kvg_gram_match *mt = NULL;
    kvgen_error err = {0};
    if (g) CHECK_OK(kvg_gram_match_new(g, &mt, &err));
    if (mt) {
        CHECK(kvg_gram_feed(mt, (const unsigned char *)"ab", 2) && kvg_gram_can_end(mt));
        kvg_gram_match_set_max_steps(mt, 1000);
        CHECK(!kvg_gram_feed(mt, (const unsigned char *)"term", 4) && kvg_gram_match_failure(mt));
        for (int round = 0; round < 2; round++) {
            kvg_gram_match_reset(mt); /* the start state needs over 1000 steps */
            const kvgen_error *f = kvg_gram_match_failure(mt);
            CHECKF(f && f->status == KVGEN_E_UNSUPPORTED && contains(f->message, "start needs over 1000 matcher steps"),
                   "%s", f ? f->message : "no failure");
            CHECK(!kvg_gram_can_end(mt) && !kvg_gram_done(mt));
            CHECK(!kvg_gram_feed(mt, (const unsigned char *)"c", 1) && !kvg_gram_can_end(mt));
        }
        kvg_gram_match_set_max_steps(mt, 0);
        kvg_gram_match_reset(mt);
        CHECK(!kvg_gram_match_failure(mt) && kvg_gram_can_end(mt));
        CHECK(kvg_gram_feed(mt, (const unsigned char *)"c.ab", 4) && kvg_gram_can_end(mt));
    }
    kvg_gram_match_free(mt);
    kvg_gram_free(g);
}

/* A long generation's caches are forgotten between tokens past the soft bounds: the text goes
 * on matching (a counter in the grammar makes every byte a new state). */
static void check_rebuild(void) {
    kvg_gram *g = parse("root ::= ([a-c] [0-9]{0,4096} \";\"){0,64}");
    kvg_gram_match *mt = NULL;
    kvgen_error err = {0};
    if (g) CHECK_OK(kvg_gram_match_new(g, &mt, &err));
    char chunk[64];
    int fed = 0;
    for (int i = 0; mt && i < 70000; i++) { /* 70000 states: past the hard bound without a rebuild */
        snprintf(chunk, sizeof chunk, "%s%d", i % 4000 == 0 ? (i ? ";a" : "a") : "", i % 10);
        if (!kvg_gram_feed(mt, (const unsigned char *)chunk, strlen(chunk))) break;
        fed++;
    }
    CHECKF(fed == 70000 && !kvg_gram_match_failure(mt), "fed %d of 70000: %s", fed,
           kvg_gram_match_failure(mt) ? kvg_gram_match_failure(mt)->message : "");
    CHECK(mt && kvg_gram_feed(mt, (const unsigned char *)";", 1) && kvg_gram_can_end(mt));
    kvg_gram_match_free(mt);
    kvg_gram_free(g);
}

/* the trie walk against the token-by-token reference, from the states after each prefix */
static void check_mask(kvgen_model *m, kvg_gram *g, const char *const *prefixes, int n, const char *what) {
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    const kvg_vocab_trie *trie = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvg_vocab_trie_get(m, &trie, &err));
    const kvg_vocab_trie *again = NULL;
    CHECK_OK(kvg_vocab_trie_get(m, &again, &err));
    CHECK(trie && again == trie); /* built once, kept on the model */
    uint8_t *a = kvg_malloc((size_t)info.n_vocab), *b = kvg_malloc((size_t)info.n_vocab);
    kvg_gram_match *mt = NULL;
    CHECK_OK(kvg_gram_match_new(g, &mt, &err));
    for (int i = 0; trie && a && b && mt && i < n; i++) {
        kvg_gram_match_reset(mt);
        CHECKF(kvg_gram_feed(mt, (const unsigned char *)prefixes[i], strlen(prefixes[i])), "%s: prefix %s", what,
               prefixes[i]);
        int na = kvg_gram_mask(mt, trie, a, &err), nb = kvg_gram_mask_brute(mt, m, b);
        CHECKF(na == nb && memcmp(a, b, (size_t)info.n_vocab) == 0, "%s: after \"%s\": trie %d tokens, reference %d",
               what, prefixes[i], na, nb);
        CHECKF(na > 0, "%s: after \"%s\": no token", what, prefixes[i]);
    }
    kvg_gram_match_free(mt);
    kvg_free(a);
    kvg_free(b);
}

/* Generates with a constraint; the text must be complete for the grammar. Returns the text
 * (malloc'd). */
static char *generate(kvgen_model *m, const kvgen_constraint *c, uint64_t seed, const char *prompt, bool job,
                      kvgen_finish *fin) {
    kvgen_session_desc sd = {.n_ctx = 512, .seed = seed, .temperature = 1.0f};
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    if (!s) return NULL;
    int32_t ids[256];
    size_t n = 0;
    CHECK_OK(kvgen_tokenize(m, prompt, strlen(prompt), 0, ids, 256, &n, &err));
    kvgen_generate_desc gd = {.constraint = c, .max_tokens = 400};
    char *out = kvg_malloc(8192);
    *fin = KVGEN_FINISH_ERROR;
    if (!job) {
        kvgen_gen *g = NULL;
        CHECK_OK(kvgen_gen_begin_prompt(s, ids, n, &gd, &g, &err));
        kvgen_gen_step st = {0};
        while (g && kvgen_gen_next(g, &st, &err) == KVGEN_OK && st.finish == KVGEN_FINISH_NONE) {
        }
        size_t len;
        const char *t = g ? kvgen_gen_text(g, &len) : "";
        snprintf(out, 8192, "%s", t);
        *fin = kvgen_gen_finish(g);
        kvgen_gen_end(g);
    } else {
        kvgen_job_desc jd = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = ids, .n_tokens = n, .gen = gd};
        kvgen_job *j = NULL;
        CHECK_OK(kvgen_job_submit(s, &jd, &j, &err));
        kvgen_job_info info = {0};
        if (j) {
            wait_jobs(&j, 1, 2000000000L);
            kvgen_job_get_info(j, &info);
            CHECKF(info.state == KVGEN_JOB_DONE, "job: %s", info.error.message);
            snprintf(out, 8192, "%s", kvgen_job_text(j, NULL));
            *fin = info.finish;
        }
        kvgen_job_release(j);
    }
    kvgen_session_close(s);
    return out;
}

/* Runs /usr/bin/python3 core/tests/validate_json.py on the outputs (one a line). */
static void validate(const char *schema, char **texts, int n, const char *what) {
#ifdef _WIN32
    /* the Windows build's tests run under Wine, which cannot start the host's python3: the
     * outputs were matched against their grammar above, and the Linux build validates them */
    (void)schema;
    (void)texts;
    printf("%s: %d outputs not given to python3-jsonschema (Windows build)\n", what, n);
    return;
#endif
    char *sp = tu_tmpfile("schema.json"), *op = tu_tmpfile("outputs.txt");
    FILE *f = fopen(sp, "w");
    if (f) {
        fputs(schema, f);
        fclose(f);
    }
    f = fopen(op, "w");
    for (int i = 0; f && i < n; i++) fprintf(f, "%s\n", texts[i] ? texts[i] : "");
    if (f) fclose(f);
    const char *fx = getenv("KVGEN_FIXTURES");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/../validate_json.py %s < %s", fx ? fx : "core/tests/fixtures", sp, op);
    int rc = system(cmd);
    CHECKF(rc == 0, "%s: python3-jsonschema refused an output (or is missing: apt-get install python3-jsonschema)",
           what);
    free(sp);
    free(op);
}

/* Every grammar and schema, several seeds, on one backend; the schema outputs validated. */
static void check_generation(kvgen_model *m, const char *what, int seeds, bool jobs) {
    for (size_t i = 0; i < sizeof g_grammars / sizeof g_grammars[0]; i++) {
        kvg_gram *g = parse(g_grammars[i]);
        kvgen_constraint c = {.kind = KVGEN_CONSTRAIN_GRAMMAR, .grammar = g_grammars[i]};
        for (int s = 1; g && s <= seeds; s++) {
            kvgen_finish fin;
            char *t = generate(m, &c, (uint64_t)s * 7919u, "once upon", jobs && s % 2 == 0, &fin);
            CHECKF(t && fin == KVGEN_FINISH_STOP && accepts(g, t, true), "%s: grammar %zu seed %d: %s (%s)", what, i,
                   s, t ? t : "", kvgen_finish_name(fin));
            kvg_free(t);
        }
        kvg_gram_free(g);
    }
    for (size_t i = 0; i < sizeof g_schemas / sizeof g_schemas[0]; i++) {
        kvgen_constraint c = {.kind = KVGEN_CONSTRAIN_SCHEMA, .schema = g_schemas[i]};
        char *texts[32] = {0};
        for (int s = 1; s <= seeds && s <= 32; s++) {
            kvgen_finish fin;
            texts[s - 1] = generate(m, &c, (uint64_t)s * 104729u, "json:", jobs && s % 2 == 1, &fin);
            CHECKF(fin == KVGEN_FINISH_STOP, "%s: schema %zu seed %d: %s (%s)", what, i, s,
                   texts[s - 1] ? texts[s - 1] : "", kvgen_finish_name(fin));
        }
        validate(g_schemas[i], texts, seeds, what);
        for (int s = 0; s < 32; s++) kvg_free(texts[s]);
    }
}

/* A vocabulary of its own (token 0 is end-of-generation; some tokens share bytes, some cut
 * a character): the trie mask equals the token-by-token one along random paths through each
 * grammar, and a byte no token spells is a dead end (no token allowed). */
static void check_small_vocab(void) {
    static const char *const pieces[] = {"</s>", "a", "b", "ab", "abc", "c", "<", ">", "\xc3\xa9", "\xc3", "\xa9",
                                         "1", "[", "]", ",", "[1", "1]", ",[", "!", "!!", "A", "-4", "2", "ab",
                                         "\xe2\x82", "\xac", "\xe2\x82\xac,", "{\"", "\":", "line", "\"", "x"};
    enum { N = sizeof pieces / sizeof pieces[0] };
    uint32_t off[N + 1];
    unsigned char bytes[256];
    kvg_vocab_trie *trie = small_trie(pieces, N, off, bytes);
    CHECK(trie != NULL);
    const char *grammars[] = {g_list, g_dots, g_nest, "root ::= \"a\" \"\\x01\" \"b\""};
    uint32_t rng = 12345;
    int dead = 0;
    for (int gi = 0; trie && gi < 4; gi++) {
        kvg_gram *g = parse(grammars[gi]);
        kvg_gram_match *mt = NULL;
        kvgen_error err = {0};
        if (g) CHECK_OK(kvg_gram_match_new(g, &mt, &err));
        for (int path = 0; mt && path < 40; path++) {
            char text[512];
            size_t tl = 0;
            kvg_gram_match_reset(mt);
            for (int step = 0; step < 30; step++) {
                uint8_t allowed[N], want[N];
                int count = kvg_gram_mask(mt, trie, allowed, &err), wc = 0;
                for (int t = 0; t < N; t++) { /* the reference: a fresh matcher fed the text and the token */
                    kvg_gram_match *probe = NULL;
                    CHECK_OK(kvg_gram_match_new(g, &probe, &err));
                    bool ok = probe && kvg_gram_feed(probe, (const unsigned char *)text, tl);
                    if (t == 0) ok = ok && kvg_gram_can_end(probe);
                    else ok = ok && kvg_gram_feed(probe, bytes + off[t], off[t + 1] - off[t]);
                    want[t] = ok;
                    wc += ok;
                    kvg_gram_match_free(probe);
                }
                CHECKF(count == wc && memcmp(allowed, want, N) == 0, "grammar %d path %d step %d: trie %d, reference %d",
                       gi, path, step, count, wc);
                if (count == 0) {
                    dead++;
                    break;
                }
                int pick = -1; /* a random allowed token other than the end */
                for (int tries = 0; tries < 200 && pick < 0; tries++) {
                    rng = rng * 1103515245u + 12345u;
                    int t = 1 + (int)((rng >> 8) % (N - 1));
                    if (allowed[t]) pick = t;
                }
                if (pick < 0 || tl + (off[pick + 1] - off[pick]) >= sizeof text) break;
                CHECK(kvg_gram_feed(mt, bytes + off[pick], off[pick + 1] - off[pick]));
                memcpy(text + tl, bytes + off[pick], off[pick + 1] - off[pick]);
                tl += off[pick + 1] - off[pick];
            }
        }
        kvg_gram_match_free(mt);
        kvg_gram_free(g);
    }
    CHECKF(dead == 40, "%d dead ends (the last grammar needs a byte no token has: 40)", dead);
    kvg_vocab_trie_free(trie);
}

typedef struct trie_race {
    kvgen_model *m;
    const kvg_vocab_trie *got;
} trie_race;

static void *get_trie(void *arg) {
    trie_race *r = arg;
    kvgen_error err = {0};
    if (kvg_vocab_trie_get(r->m, &r->got, &err) != KVGEN_OK) r->got = NULL;
    return NULL;
}

/* Threads asking a fresh model for its trie at once all get the one the model keeps. */
static void check_trie_threads(kvgen_model *m) {
    enum { T = 4 };
    pthread_t th[T];
    trie_race r[T];
    int started = 0;
    for (int i = 0; i < T; i++) {
        r[i] = (trie_race){m, NULL};
        if (pthread_create(&th[i], NULL, get_trie, &r[i]) == 0) started++;
        else break;
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    const kvg_vocab_trie *kept = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvg_vocab_trie_get(m, &kept, &err));
    CHECK(started == T);
    for (int i = 0; i < started; i++) CHECK(r[i].got != NULL && r[i].got == kept);
}

static kvgen_model *load(const char *path, kvgen_backend backend) {
    kvgen_model_desc md = {.path = path, .backend = backend, .n_threads = 1};
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    return m;
}

static const char *const g_npc_prefixes[] = {"", "{\"line\":\"", "{\"line\":\"Hello there, trav",
                                             "{\"line\":\"\xc3", "{\"line\":\"ok\",\"mood\":\"",
                                             ("{\"line\":\"ok\",\"mood\":\"calm\",\"action\":{\"type\":\"give\","
                                              "\"item\":\"axe\",\"count\":")};

static void vulkan_body(void *arg) {
    kvgen_model *m = load(arg, KVGEN_BACKEND_VULKAN);
    if (m) check_generation(m, "vulkan", 3, true);
    kvgen_model_unload(m);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Decode with and without the NPC schema, and the mask's own time, in one run. */
static void bench(kvgen_model *m, const char *what) {
    kvgen_session_desc sd = {.n_ctx = 512, .seed = 3, .temperature = 0.8f};
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    if (!s) return;
    int32_t ids[64];
    size_t n = 0;
    const char *prompt = "The guard says:";
    CHECK_OK(kvgen_tokenize(m, prompt, strlen(prompt), 0, ids, 64, &n, &err));
    size_t base = n;
    /* free text: 40 decode steps */
    CHECK_OK(kvgen_session_prefill(s, ids, n, NULL, &err));
    double t0 = now();
    int free_steps = 0;
    for (; free_steps < 40; free_steps++) {
        int32_t t = kvgen_session_sample(s);
        if (t < 0 || kvgen_session_decode(s, t, &err) != KVGEN_OK) break;
    }
    double free_time = now() - t0;
    /* the NPC schema: the same steps with the mask timed on its own */
    CHECK_OK(kvgen_session_rewind(s, base, &err));
    kvg_gram *g = schema_gram(g_npc);
    kvg_gram_match *mt = NULL;
    const kvg_vocab_trie *trie = NULL;
    if (g) CHECK_OK(kvg_gram_match_new(g, &mt, &err));
    CHECK_OK(kvg_vocab_trie_get(m, &trie, &err));
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    uint8_t *allowed = kvg_malloc((size_t)info.n_vocab);
    double mask_time = 0, total = 0;
    int steps = 0;
    t0 = now();
    for (int k = 0; mt && trie && allowed && k < 40 && !kvg_gram_done(mt); k++) {
        double a = now();
        CHECKF(kvg_gram_mask(mt, trie, allowed, &err) >= 0, "%s", err.message);
        mask_time += now() - a;
        int32_t t = kvg_session_sample_masked(s, allowed);
        if (t < 0 || kvgen_token_is_eog(m, t)) break;
        char piece[256];
        size_t len = kvgen_token_piece(m, t, 0, piece, sizeof piece);
        CHECK(kvg_gram_feed(mt, (const unsigned char *)piece, len));
        if (kvgen_session_decode(s, t, &err) != KVGEN_OK) break;
        steps++;
    }
    total = now() - t0;
    if (steps > 0 && free_steps > 0)
        printf("bench %s: NPC schema: mask %.1f%% of a constrained decode step; constrained step / free step %.2f "
               "(%d and %d steps)\n",
               what, 100.0 * mask_time / total, (total / steps) / (free_time / free_steps), steps, free_steps);
    CHECKF(steps > 5, "%s: %d constrained steps", what, steps);
    kvg_free(allowed);
    kvg_gram_match_free(mt);
    kvg_gram_free(g);
    kvgen_session_close(s);
}

/* Mutated grammars and schemas (bytes replaced, dropped, cut): each is parsed or refused with
 * a message, never crashes; an accepted one gives a matcher whose start can be masked. */
static void check_mutations(void) {
    const char *seeds[] = {g_list, g_dots, g_nest, g_doc, g_npc, g_mixed, g_array};
    static const char alphabet[] = "\"\\[]()|*+?{},.-^#:=\n 09azx";
    uint32_t rng = 777;
    int parsed = 0, refused = 0;
    for (int round = 0; round < 3000; round++) {
        const char *src = seeds[round % 7];
        size_t n = strlen(src);
        char buf[2048];
        if (n >= sizeof buf) continue;
        memcpy(buf, src, n + 1);
        for (int k = 0; k < 1 + round % 4; k++) {
            rng = rng * 1103515245u + 12345u;
            size_t at = (rng >> 8) % n;
            int op = (int)((rng >> 4) % 3);
            if (op == 0) buf[at] = alphabet[(rng >> 16) % (sizeof alphabet - 1)];
            else if (op == 1) memmove(buf + at, buf + at + 1, n - at), n--;
            else buf[at] = 0, n = at;
            if (n == 0) break;
        }
        kvgen_error err = {0};
        kvg_gram *g = NULL;
        char *gbnf = NULL;
        kvgen_status st = round % 7 >= 4 ? kvg_schema_to_gbnf(buf, &gbnf, &err) : KVGEN_OK;
        if (st == KVGEN_OK) st = kvg_gram_parse(gbnf ? gbnf : buf, &g, &err);
        CHECKF(st == KVGEN_OK || (st == KVGEN_E_INVALID_ARGUMENT && err.message[0]), "%s: status %d", buf, (int)st);
        if (st == KVGEN_OK) {
            kvg_gram_match *mt = NULL;
            CHECK_OK(kvg_gram_match_new(g, &mt, &err));
            kvg_gram_match_free(mt);
            parsed++;
        } else {
            refused++;
        }
        kvg_gram_free(g);
        kvg_free(gbnf);
    }
    CHECKF(parsed > 100 && refused > 100, "%d parsed, %d refused", parsed, refused);
}

int main(void) {
    check_bounds();
    check_costly_mask();
    check_rebuild();
    check_reset_under_bound();
    check_mutations();
    check_parser();
    check_schema();
    check_small_vocab();
    char *path = tu_make_model("grammar.gguf", "--seed 61 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2");
    if (!path) return tu_finish("test_grammar");
    kvgen_model *m = load(path, KVGEN_BACKEND_REFERENCE);
    if (m) check_trie_threads(m);
    if (m) {
        for (size_t i = 0; i < sizeof g_grammars / sizeof g_grammars[0]; i++) {
            kvg_gram *g = parse(g_grammars[i]);
            static const char *const pre[] = {"", "<", "a", "[1,[", "<\xc3", "abc,"};
            const char *ok[6];
            int n = 0;
            for (int p = 0; g && p < 6; p++)
                if (accepts(g, pre[p], false)) ok[n++] = pre[p];
            if (g) check_mask(m, g, ok, n, "random vocabulary");
            kvg_gram_free(g);
        }
        kvg_gram *g = schema_gram(g_npc);
        if (g) check_mask(m, g, g_npc_prefixes, 6, "random vocabulary, NPC schema");
        kvg_gram_free(g);
        check_generation(m, "reference", 8, true);
        check_costly_generation(m, "random model");
        check_bound_generation(m, "random model");
    }
    kvgen_model_unload(m);
    if ((m = load(path, KVGEN_BACKEND_CPU))) check_generation(m, "cpu", 4, false);
    kvgen_model_unload(m);
    tu_vulkan_child("grammar generation", vulkan_body, path);
    free(path);

    const char *real = tu_model_path();
    if (!real) {
        printf("test_grammar: default model absent: its vocabulary and generation are not checked\n");
        return tu_finish("test_grammar");
    }
    if ((m = load(real, KVGEN_BACKEND_CPU))) {
        kvg_gram *g = schema_gram(g_npc);
        if (g) check_mask(m, g, g_npc_prefixes, 6, "default model, NPC schema");
        kvg_gram_free(g);
        kvgen_constraint c = {.kind = KVGEN_CONSTRAIN_SCHEMA, .schema = g_npc};
        char *texts[6] = {0};
        for (int s = 0; s < 6; s++) {
            kvgen_finish fin;
            texts[s] = generate(m, &c, 1000u + (uint64_t)s, "An NPC answers the player, as JSON:", s == 5, &fin);
            CHECKF(fin == KVGEN_FINISH_STOP, "default model seed %d: %s (%s)", s, texts[s] ? texts[s] : "",
                   kvgen_finish_name(fin));
            printf("default model: %s\n", texts[s] ? texts[s] : "");
        }
        validate(g_npc, texts, 6, "default model, NPC schema");
        check_costly_generation(m, "default model");
        check_bound_generation(m, "default model");
        for (int s = 0; s < 6; s++) kvg_free(texts[s]);
        bench(m, "cpu");
    }
    kvgen_model_unload(m);
    if (getenv("KVGEN_TEST_BENCH_VULKAN")) {
        if ((m = load(real, KVGEN_BACKEND_VULKAN))) bench(m, "vulkan");
        kvgen_model_unload(m);
    }
    return tu_finish("test_grammar");
}
