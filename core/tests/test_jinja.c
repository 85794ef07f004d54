/* test_jinja.c: the chat-template interpreter against jinja2 (fixtures from
 * scripts/oracle/chat_templates.py: the model files' templates, published templates of other
 * families, one-feature templates, malformed ones; from scripts/oracle/chat_tools.py: tools, tool
 * calls, results, reasoning and extra variables as JSON inputs, on the publishers' own templates
 * of Llama 3.1/3.2, Mistral Nemo, Hermes 3, Qwen2.5, Qwen3, Phi-4-mini and Gemma 3 too), the content flags that keep message text
 * away from special-token parsing, and the limits on hostile templates. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <string.h>
#include <time.h>
#include "kvg_jinja.h"
#include "testutil.h"

enum { MAX_T = 64 };
static char *tnames[MAX_T];
static kvg_jinja *tpls[MAX_T];
static char terr[MAX_T][256];
static int nt;

static int find_tpl(const char *name) {
    for (int i = 0; i < nt; i++)
        if (strcmp(tnames[i], name) == 0) return i;
    return -1;
}

static void fixtures(void) {
    FILE *f = tu_open_fixture("chat_templates.txt");
    if (!f) return;
    tu_record r;
    int cases = 0, errors = 0;
    while (tu_read_record(f, &r)) {
        if (strncmp(r.head, "template ", 9) == 0 && nt < MAX_T) {
            tnames[nt] = strdup(r.head + 9);
            if (!kvg_jinja_parse(r.body, r.len, &tpls[nt], terr[nt], sizeof terr[nt])) tpls[nt] = NULL;
            nt++;
            free(r.body);
            continue;
        }
        if (strncmp(r.head, "case ", 5) != 0) {
            free(r.body);
            continue;
        }
        char cname[128], tname[64];
        int agp = 0, nmsg = 0;
        CHECK(sscanf(r.head + 5, "%127s %63s %d %d", cname, tname, &agp, &nmsg) == 4);
        tu_record bos, eos, m;
        tu_read_record(f, &bos);
        tu_read_record(f, &eos);
        kvg_jinja_msg msgs[16] = {{0}};
        char *bodies[16];
        size_t content_bytes = 0;
        for (int i = 0; i < nmsg && i < 16; i++) {
            tu_read_record(f, &m);
            msgs[i].role = strdup(m.head + 4);
            msgs[i].content = bodies[i] = m.body;
            content_bytes += m.len;
        }
        tu_record ex;
        tu_read_record(f, &ex);
        int ti = find_tpl(tname);
        CHECKF(ti >= 0, "%s: no template %s", cname, tname);
        kvg_jinja_output out = {0};
        char msg[256] = "";
        bool ok = ti >= 0 && tpls[ti];
        if (ti >= 0 && !tpls[ti]) snprintf(msg, sizeof msg, "%s", terr[ti]);
        kvg_jinja_input in = {msgs, (size_t)nmsg, agp != 0, bos.body, eos.body, NULL};
        if (ok) ok = kvg_jinja_render(tpls[ti], &in, &out, msg, sizeof msg);
        if (!ex.body) {
            CHECKF(!ok, "%s: jinja2 fails, kvgen rendered \"%s\"", cname, out.text);
            CHECKF(strncmp(msg, "line ", 5) == 0, "%s: error without a position: %s", cname, msg);
            errors++;
        } else {
            CHECKF(ok, "%s: %s", cname, msg);
            CHECKF(ok && out.len == ex.len && memcmp(out.text, ex.body, ex.len) == 0,
                   "%s:\n--- jinja2\n%s\n--- kvgen\n%s\n---", cname, ex.body, ok ? out.text : "");
            if (ok && strncmp(tname, "feat_", 5) != 0) {
                /* every flagged byte is message content, and no template text is flagged */
                size_t flagged = 0;
                for (size_t i = 0; i < out.len; i++) flagged += out.user[i];
                CHECKF(flagged <= content_bytes, "%s: %zu bytes flagged, %zu of content", cname, flagged,
                       content_bytes);
                if (strstr(cname, "/inject/")) {
                    const char *p = strstr(out.text, "obey");
                    CHECKF(p && out.user[p - out.text - 1] == 1 && out.user[p - out.text] == 1,
                           "%s: injected text not flagged", cname);
                }
            }
        }
        cases++;
        free(out.text);
        free(out.user);
        free(ex.body);
        free(bos.body);
        free(eos.body);
        for (int i = 0; i < nmsg && i < 16; i++) {
            free((char *)msgs[i].role);
            free(bodies[i]);
        }
    }
    fclose(f);
    CHECKF(cases >= 100 && errors > 0, "%d cases, %d errors", cases, errors);
}

/* chat_tools.txt (scripts/oracle/chat_tools.py): tools, tool calls and results, reasoning and
 * extra variables as JSON inputs, and the interpreter's Python details, against jinja2 */
static void tool_fixtures(void) {
    FILE *f = tu_open_fixture("chat_tools.txt");
    if (!f) return;
    enum { N = 32 };
    char *names[N];
    kvg_jinja *tp[N];
    int n = 0, cases = 0, errors = 0, with_fields = 0;
    tu_record r;
    while (tu_read_record(f, &r)) {
        if (strncmp(r.head, "template ", 9) == 0) {
            CHECK(n < N);
            if (n < N) {
                char msg[256];
                names[n] = strdup(r.head + 9);
                if (!kvg_jinja_parse(r.body, r.len, &tp[n], msg, sizeof msg)) tp[n] = NULL;
                n++;
            }
            free(r.body);
            continue;
        }
        if (strncmp(r.head, "ids ", 4) == 0) { /* Hugging Face's token ids: test_chat_tokens' */
            free(r.body);
            continue;
        }
        CHECKF(strncmp(r.head, "case ", 5) == 0, "unexpected record %s", r.head);
        char cname[128], tname[64];
        int agp = 0, nmsg = 0;
        CHECK(sscanf(r.head + 5, "%127s %63s %d %d", cname, tname, &agp, &nmsg) == 4 && nmsg <= 8);
        free(r.body);
        tu_record bos, eos, body[8], fields[8], vars, ex;
        kvg_jinja_msg msgs[8] = {{0}};
        tu_read_record(f, &bos);
        tu_read_record(f, &eos);
        for (int i = 0; i < nmsg && i < 8; i++) {
            tu_read_record(f, &body[i]);
            tu_read_record(f, &fields[i]);
            msgs[i].role = body[i].head + 4;
            msgs[i].content = body[i].body;
            msgs[i].fields = strcmp(fields[i].body, "null") ? fields[i].body : NULL;
            with_fields += msgs[i].fields != NULL;
        }
        tu_read_record(f, &vars);
        tu_read_record(f, &ex);
        int ti = -1;
        for (int i = 0; i < n; i++)
            if (strcmp(names[i], tname) == 0) ti = i;
        CHECKF(ti >= 0, "%s: no template %s", cname, tname);
        char msg[256] = "";
        kvg_jinja_output out = {0};
        kvg_jinja_input in = {msgs, (size_t)nmsg, agp != 0, bos.body, eos.body,
                              strcmp(vars.body, "null") ? vars.body : NULL};
        bool ok = ti >= 0 && tp[ti] && kvg_jinja_render(tp[ti], &in, &out, msg, sizeof msg);
        if (!ex.body) {
            CHECKF(!ok, "%s: jinja2 fails, kvgen rendered \"%s\"", cname, out.text);
            CHECKF(strncmp(msg, "line ", 5) == 0, "%s: error without a position: %s", cname, msg);
            errors++;
        } else {
            CHECKF(ok, "%s: %s", cname, msg);
            CHECKF(ok && out.len == ex.len && memcmp(out.text, ex.body, ex.len) == 0,
                   "%s:\n--- jinja2\n%s\n--- kvgen\n%s\n---", cname, ex.body, ok ? out.text : "");
        }
        if (ok && strncmp(tname, "qwen", 4) == 0 && in.vars && strstr(in.vars, "\"tools\"")) {
            /* the tool descriptions are the caller's data: flagged, never control tokens */
            const char *p = strstr(out.text, "\"get_price\"");
            CHECKF(p && out.user[p + 1 - out.text] == 1, "%s: a tool's name is not flagged as content", cname);
            const char *im = strstr(out.text, "<|im_start|>");
            CHECKF(im && out.user[im - out.text] == 0, "%s: template text flagged", cname);
        }
        cases++;
        free(out.text);
        free(out.user);
        free(bos.body);
        free(eos.body);
        free(vars.body);
        free(ex.body);
        for (int i = 0; i < nmsg && i < 8; i++) {
            free(body[i].body);
            free(fields[i].body);
        }
    }
    fclose(f);
    /* the publishers' templates are all there, and Llama 3.2's without a date_string takes
     * today's from strftime_now (the fixtures give it one: jinja2 ran on another day) */
    static const char *const published[] = {"llama31", "llama32", "mistral_nemo", "hermes3", "qwen25",
                                            "qwen3_06b", "phi4_mini", "gemma3"};
    for (size_t k = 0; k < sizeof published / sizeof published[0]; k++) {
        int ti = -1;
        for (int i = 0; i < n; i++)
            if (strcmp(names[i], published[k]) == 0) ti = i;
        CHECKF(ti >= 0 && tp[ti], "published template %s: missing or not parsed", published[k]);
        if (ti < 0 || !tp[ti] || strcmp(published[k], "llama32") != 0) continue;
        kvg_jinja_msg m[1] = {{"user", "hi", NULL}};
        kvg_jinja_input in = {m, 1, true, "<|begin_of_text|>", "<|eot_id|>", NULL};
        kvg_jinja_output out = {0};
        char msg[256] = "", today[64], want[96];
        time_t now = time(NULL);
        strftime(today, sizeof today, "%d %b %Y", localtime(&now)); /* as strftime_now reads the clock */
        snprintf(want, sizeof want, "Today Date: %s\n", today);
        bool ok = kvg_jinja_render(tp[ti], &in, &out, msg, sizeof msg);
        CHECKF(ok && strstr(out.text, want), "llama32 today: %s", ok ? out.text : msg);
        free(out.text);
        free(out.user);
    }
    for (int i = 0; i < n; i++) {
        kvg_jinja_free(tp[i]);
        free(names[i]);
    }
    CHECKF(cases >= 150 && errors >= 30 && with_fields > 0, "%d cases, %d errors", cases, errors);

    /* malformed JSON inputs: an error naming the input, nothing rendered */
    kvg_jinja *t = NULL;
    char msg[256];
    CHECK(kvg_jinja_parse("{{ tools }}", 11, &t, msg, sizeof msg));
    if (!t) return;
    kvg_jinja_msg m[1] = {{"user", "hi", "{\"tool_calls\": [1,"}};
    kvg_jinja_input in = {m, 1, false, "", "", NULL};
    kvg_jinja_output out;
    CHECK(!kvg_jinja_render(t, &in, &out, msg, sizeof msg) && out.text == NULL);
    CHECKF(strstr(msg, "message 1's fields: not valid JSON at byte"), "%s", msg);
    m[0].fields = "[]";
    CHECK(!kvg_jinja_render(t, &in, &out, msg, sizeof msg));
    CHECKF(strstr(msg, "message 1's fields: not a JSON object"), "%s", msg);
    m[0].fields = NULL;
    in.vars = "{\"tools\": }";
    CHECK(!kvg_jinja_render(t, &in, &out, msg, sizeof msg));
    CHECKF(strstr(msg, "template variables: not valid JSON"), "%s", msg);
    /* the conversation's own variables stay the caller's */
    in.vars = "{\"tools\": [1], \"messages\": 5, \"bos_token\": \"X\"}";
    kvg_jinja_free(t);
    const char *src = "{{ tools }} {{ messages | length }}{{ bos_token }}";
    CHECK(kvg_jinja_parse(src, strlen(src), &t, msg, sizeof msg));
    CHECK(t && kvg_jinja_render(t, &in, &out, msg, sizeof msg));
    CHECKF(out.text && strcmp(out.text, "[1] 1") == 0, "%s", out.text ? out.text : msg);
    free(out.text);
    free(out.user);
    kvg_jinja_free(t);
}

static void free_templates(void) {
    for (int i = 0; i < nt; i++) {
        kvg_jinja_free(tpls[i]);
        free(tnames[i]);
    }
}

static void mutations(void);
static void fixtures_and_mutations(void) {
    fixtures();
    mutations();
    free_templates();
}

static bool render(const char *src, char *msg, size_t n, char **text) {
    kvg_jinja *t = NULL;
    *text = NULL;
    if (!kvg_jinja_parse(src, strlen(src), &t, msg, n)) return false;
    kvg_jinja_msg m[1] = {{"user", "hi", NULL}};
    kvg_jinja_input in = {m, 1, true, "<s>", "</s>", NULL};
    kvg_jinja_output out;
    bool ok = kvg_jinja_render(t, &in, &out, msg, n);
    kvg_jinja_free(t);
    *text = out.text;
    free(out.user);
    return ok;
}

/* a template's output, or its error message */
static const char *run(const char *src, char *msg, size_t n) {
    static char *last;
    free(last);
    last = NULL;
    if (!render(src, msg, n, &last)) return NULL;
    return last;
}

/* A template rendered for one user turn "hi" ends with `out` as its text, or, when out is NULL,
 * fails with `err` in its message. */
typedef struct bound_case {
    const char *what, *src, *out, *err;
} bound_case;

/* Memory counts what is live, so the documented limits are reachable (a million iterations,
 * strings built a piece at a time); work (bytes compared, searched, copied) is bounded too;
 * floats outside the int64 range never convert with undefined behaviour. */
static const bound_case BOUNDS[] = {
    {"700x700 empty loops", "{% for i in range(700) %}{% for j in range(700) %}{% endfor %}{% endfor %}ok", "ok", NULL},
    {"a million iterations", "{% for i in range(1000000) %}{% endfor %}ok", "ok", NULL},
    {"range(600000)", "{% set x = range(600000) %}{{ x | length }}", "600000", NULL},
    {"a string built one character at a time",
     "{% set ns = namespace(s='') %}{% for i in range(20000) %}{% set ns.s = ns.s ~ 'x' %}{% endfor %}"
     "{{ ns.s | length }}",
     "20000", NULL},
    {"content built one character at a time",
     "{% set ns = namespace(s='') %}{% for i in range(20000) %}{% set ns.s = ns.s + messages[0].content[0] %}"
     "{% endfor %}{{ ns.s | length }}",
     "20000", NULL},
    {"in-place appends never change a string already made",
     "{% set a = 'ab' ~ 'c' %}{% set b = a ~ 'd' %}{% set c = a ~ 'e' %}{{ a }} {{ b }} {{ c }} {{ b ~ c }}",
     "abc abcd abce abcdabce", NULL},
    {"a hard bound remains: what is really live past 64 MiB is refused",
     "{% set a = 'x' * 4000000 %}{% set ns = namespace(l=[]) %}{% for i in range(40) %}"
     "{% set ns.l = ns.l + [a ~ i] %}{% endfor %}{{ ns.l | length }}",
     NULL, "MiB of memory"},
    {"work: comparisons of long strings inside the allowed iterations",
     "{% set a = 'x' * 4000000 %}{% set b = 'x' * 4000000 %}{% for i in range(1000000) %}{% if a == b %}{% endif %}"
     "{% endfor %}",
     NULL, "too much work"},
    {"work: a search of a long string", "{% set a = 'x' * 4000000 %}{{ ('x' * 3000 ~ 'y') in a }}", NULL,
     "too much work"},
    {"work: orderings of long strings",
     "{% set a = 'x' * 4000000 %}{% for i in range(1000000) %}{% if a < a %}{% endif %}{% endfor %}", NULL,
     "too much work"},
    {"an empty string repeated", "{{ ('' * 9000000000000000000) | length }}", "0", NULL},
    {"in, find, count", "{{ ('ab' in 'xxab') ~ ('xxab'.find('ab')) ~ ('abab'.count('ab')) }}", "True22", NULL},
    /* floats beyond int64: defined (UBSan would report the conversions) */
    {"float arithmetic beyond int64", "{{ 1e19 + 1 }} {{ -1e19 - 1 }} {{ 1e19 * 2 }}", "1e+19 -1e+19 2e+19", NULL},
    {"int of 1e19", "{{ 1e19 | int }}", NULL, "int: 1e+19 is outside the 64-bit integer range"},
    {"int of '1e300'", "{{ '1e300' | int }}", NULL, "outside the 64-bit integer range"},
    {"int of nan", "{{ (1e300 * 1e300 - 1e300 * 1e300) | int }}", NULL, "outside the 64-bit integer range"},
    {"int of halves", "{{ 2.5 | int }} {{ -2.5 | int }}", "2 -2", NULL},
    {"range(1e19)", "{% for i in range(1e19) %}{% endfor %}", NULL, "range: more than"},
    {"ranges at the int64 edges",
     "{{ range(-1e19, 3, 1e19) | list }} {{ range(0, 10, 9223372036854775807) | list }} "
     "{{ range(5, -9223372036854775807, -9223372036854775807) | list }}",
     "[-9223372036854775808, -1] [0] [5, -9223372036854775802]", NULL},
    {"slices at the int64 edges",
     "{{ 'abcdef'[1e19:] }}|{{ 'abcdef'[-1e19:2] }}|{{ 'abcdef'[1::1e19] }}|{{ 'abcdef'[::-1e19] }}|"
     "{{ [1, 2, 3][1::9223372036854775807] }}|{{ 'abc'[1e19] }}|{{ 'abcdef'[::-2] }}",
     "|ab|b|f|[2]||fdb", NULL},
    {"abs and divisibleby of INT64_MIN",
     "{{ (-9223372036854775807 - 1) | abs }} {{ (-9223372036854775807 - 1) is divisibleby(-1) }}",
     "-9223372036854775808 True", NULL},
    /* unbounded output and recursion end with an error */
    {"macro recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, "macro calls nested"},
    {"a namespace holding itself, printed", "{% set ns = namespace(n=0) %}{% set ns.n = ns %}{{ ns }}", NULL,
     "holding itself"},
    {"a namespace holding itself, compared", "{% set ns = namespace(n=0) %}{% set ns.n = ns %}{{ ns == ns }}", NULL,
     "holding themselves"},
    {"a namespace holding itself, as JSON", "{% set ns = namespace(n=0) %}{% set ns.n = ns %}{{ ns | tojson }}", NULL,
     "nested too deeply"},
    {"a list nested past the bound, printed",
     "{% set ns = namespace(l=[]) %}{% for i in range(300) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}", NULL,
     "nested more than"},
    {"a string repeated past the output bound", "{% set s = 'xxxxxxxxxxxxxxxx' %}{{ s * 100000000 }}", NULL, ""},
};

/* src rendered for one user turn of `content` gives `want`, each byte flagged as in flags */
static void check_flags(const char *src, const char *content, const char *want, const unsigned char *flags) {
    char msg[256];
    kvg_jinja *t = NULL;
    CHECK(kvg_jinja_parse(src, strlen(src), &t, msg, sizeof msg));
    kvg_jinja_msg m[1] = {{"user", content, NULL}};
    kvg_jinja_input in = {m, 1, true, "", "", NULL};
    kvg_jinja_output out = {0};
    CHECK(t && kvg_jinja_render(t, &in, &out, msg, sizeof msg));
    CHECKF(out.text && strcmp(out.text, want) == 0, "%s", out.text ? out.text : msg);
    CHECKF(out.user && memcmp(out.user, flags, strlen(want)) == 0, "%s: content flags", src);
    free(out.text);
    free(out.user);
    kvg_jinja_free(t);
}

static void bounds(void) {
    char msg[256];
    for (size_t i = 0; i < sizeof BOUNDS / sizeof *BOUNDS; i++) {
        const bound_case *c = &BOUNDS[i];
        const char *o = run(c->src, msg, sizeof msg);
        if (c->out) CHECKF(o && strcmp(o, c->out) == 0, "%s: %s", c->what, o ? o : msg);
        else CHECKF(!o && strstr(msg, c->err), "%s: %s", c->what, o ? o : msg);
    }
    /* the content flags follow appended pieces */
    check_flags("{% set s = 'a' ~ messages[0].content %}{% set s = s ~ 'b' %}{{ s ~ messages[0].content }}", "hi",
                "ahibhi", (const unsigned char *)"\0\1\1\0\1\1");
    /* tojson escapes as json.dumps(ensure_ascii=False) (DEL as it is, other control bytes as
     * \u00XX), and every byte of an escape keeps its content flag */
    check_flags("{{ messages[0].content | tojson }}", "a\x7f\x01\"", "\"a\x7f\\u0001\\\"\"",
                (const unsigned char *)"\0\1\1\1\1\1\1\1\1\1\1\0");
    run("", msg, sizeof msg); /* frees the last output */
}

static void limits(void) {
    char msg[256], *text;
    /* unbounded loops end with an error */
    CHECK(!render("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", msg,
                  sizeof msg, &text));
    CHECKF(strstr(msg, "iterations") || strstr(msg, "output") || strstr(msg, "memory"), "%s", msg);
    char deep[4096];
    size_t k = 0;
    k += (size_t)sprintf(deep + k, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 1000; i++) deep[k++] = ')';
    strcpy(deep + k, " }}");
    CHECK(!render(deep, msg, sizeof msg, &text));
    CHECKF(strstr(msg, "nested too deeply"), "%s", msg);
    /* errors say where */
    CHECK(!render("line one\n{{ messages[0].content.nope() }}", msg, sizeof msg, &text));
    CHECKF(strncmp(msg, "line 2 column", 13) == 0 && strstr(msg, "nope"), "%s", msg);
    CHECK(!render("{% if %}", msg, sizeof msg, &text));
    CHECKF(strncmp(msg, "line 1 column 7", 15) == 0, "%s", msg);
    /* truncated templates never crash */
    const char *src = "{%- for m in messages %}{{ '<' + m['role'] ~ '>' }}{{ m.content | trim }}{% if loop.last %}"
                      "{# c #}{{ {'a': [1, 2][::-1]} | tojson }}{% endif %}{%- endfor %}";
    for (size_t n = 0; n < strlen(src); n++) {
        char cut[512];
        memcpy(cut, src, n);
        cut[n] = 0;
        if (render(cut, msg, sizeof msg, &text)) free(text);
        else CHECKF(strncmp(msg, "line ", 5) == 0, "cut at %zu: %s", n, msg);
    }
    CHECK(render(src, msg, sizeof msg, &text));
    CHECKF(text && strcmp(text, "<user>hi{\"a\": [2, 1]}") == 0, "%s", text ? text : msg);
    free(text);
}

/* random byte edits of a real template: each parses or fails with a position, never crashes */
static void mutations(void) {
    int ti = find_tpl("qwen3");
    CHECK(ti >= 0);
    if (ti < 0) return;
    FILE *f = tu_open_fixture("chat_templates.txt");
    tu_record r;
    char *src = NULL;
    size_t len = 0;
    while (f && tu_read_record(f, &r)) {
        if (strcmp(r.head, "template qwen3") == 0) {
            src = r.body;
            len = r.len;
            break;
        }
        free(r.body);
    }
    if (f) fclose(f);
    CHECK(src != NULL);
    if (!src) return;
    static const char alphabet[] = "{}%#-+()[]'\".:|~ \nxif";
    uint32_t seed = 12345;
    int parsed = 0;
    for (int round = 0; round < 2000; round++) {
        char *m = malloc(len + 1);
        memcpy(m, src, len + 1);
        for (int e = 0; e < 3; e++) {
            seed = seed * 1664525u + 1013904223u;
            size_t at = (seed >> 8) % len;
            seed = seed * 1664525u + 1013904223u;
            m[at] = alphabet[(seed >> 8) % (sizeof alphabet - 1)];
        }
        kvg_jinja *t = NULL;
        char msg[256];
        if (kvg_jinja_parse(m, len, &t, msg, sizeof msg)) {
            parsed++;
            kvg_jinja_msg msgs[3] = {{"system", "s", NULL}, {"user", "u", NULL}, {"assistant", "a", NULL}};
            kvg_jinja_input in = {msgs, 3, true, "", "", NULL};
            kvg_jinja_output out;
            if (kvg_jinja_render(t, &in, &out, msg, sizeof msg)) {
                free(out.text);
                free(out.user);
            } else {
                CHECKF(strncmp(msg, "line ", 5) == 0, "%s", msg);
            }
            kvg_jinja_free(t);
        } else {
            CHECKF(strncmp(msg, "line ", 5) == 0, "%s", msg);
        }
        free(m);
    }
    CHECKF(parsed > 0 && parsed < 2000, "%d of 2000 edits parsed", parsed);
    free(src);
}

int main(void) {
    fixtures_and_mutations();
    tool_fixtures();
    limits();
    bounds();
    return tu_finish("test_jinja");
}
