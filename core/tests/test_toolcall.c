/* test_toolcall.c: tool calls in the template's format (toolcall.c). The format recognised
 * from real templates (the fixtures' Qwen2.5-Coder and Qwen3 templates write <tool_call>, the
 * others none; the publishers' Llama 3.1/3.2, Mistral Nemo, Hermes 3, Qwen2.5, Qwen3 and
 * Phi-4-mini templates their own, Gemma 3's none) and from Llama 3.1 and Mistral snippets; on
 * each publisher's template a forced call, its result and the next turn through the public
 * calls (Mistral's ids of nine letters and digits); Phi-4-mini's calls written back as text;
 * finished replies parsed per format
 * (calls kept with compact arguments, markup out of the text; an unknown tool, arguments of a
 * wrong type, a missing required argument or a call under tool_choice none reported as a bad
 * call); the forcing grammar, which joins the tools' schema grammars, accepts valid calls and
 * refuses an unknown name or a bad argument type, and so does the lazy grammar of tool_choice
 * auto (what follows Hermes' <tool_call>); bad tools refused by name. Through the public API on
 * a random-weight model: a forced call finishes with KVGEN_FINISH_TOOL_CALLS, its arguments
 * valid, the conversation holding it and then the tool's result; tools refused outside
 * kvgen_chat_gen_begin, under a built-in family, and with a constraint, the session unchanged.
 * Think tags found in Qwen3's template; a reply's reasoning apart from its text and kept as the
 * message's reasoning_content. Streaming: the steps' text never holds reasoning, tags (split
 * across tokens) or call markup, their reasoning adds up to kvgen_gen_reasoning (a reply ending
 * on its own, at max_tokens, at a stop string, opened by the prompt, with a thinking budget);
 * a call cut by max_tokens, a stop string or a cancel is none and the conversation keeps none;
 * Llama 3's JSON call under tool_choice auto streams nothing of itself. Chat jobs: tools,
 * reasoning, a thinking budget, a cut call, and a failed or cancelled job with tools leaving
 * the session as it was. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kvg_generate.h"
#include "kvg_grammar.h"
#include "kvg_toolcall.h"
#include "testutil.h"

static const kvgen_tool TOOLS[] = {
    {"open_gate", "Opens a gate.",
     "{\"type\":\"object\",\"properties\":{\"gate\":{\"type\":\"string\",\"enum\":[\"north\",\"south\"]},"
     "\"count\":{\"type\":\"integer\"}},\"required\":[\"gate\",\"count\"]}"},
    {"ring_bell", NULL, "{\"type\":\"object\",\"properties\":{\"times\":{\"type\":\"integer\"}},\"required\":[\"times\"]}"},
};

static const char HERMES[] = "{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>\n{\"name\": ...}\n</tool_call>";
static const char HERMES_FULL[] =
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n{{ c.function | tojson }}\n</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
static const char LLAMA31[] =
    "<|start_header_id|>system<|end_header_id|>\n\nGiven the following functions, respond with a JSON for a "
    "function call with its proper arguments.\nRespond in the format {\"name\": function name, \"parameters\": "
    "dictionary of argument name and its value}.{%- if m.tool_calls %}<|python_tag|>{% endif %}";
static const char MISTRAL[] = "[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{% if m.tool_calls %}"
                              "[TOOL_CALLS] [{% for c in m.tool_calls %}{{ c | tojson }}{% endfor %}]{% endif %}";
/* Phi-4-mini-instruct's template (tokenizer_config.json) */
static const char PHI4[] =
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] is "
    "not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' "
    "+ '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}";

/* the template `name` of the fixture file `file`, malloc'd, or NULL */
static char *fixture_template_in(const char *file, const char *name, size_t *len) {
    const char *dir = getenv("KVGEN_FIXTURES");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "core/tests/fixtures", file);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char head[256];
    char *found = NULL;
    while (!found && fgets(head, sizeof head, f)) {
        char tname[128];
        size_t n = 0;
        if (sscanf(head, "template %127s %zu", tname, &n) != 2) break;
        char *body = malloc(n + 1);
        if (!body || fread(body, 1, n, f) != n) {
            free(body);
            break;
        }
        body[n] = '\0';
        fgetc(f); /* the newline after the body */
        if (strcmp(tname, name) == 0) {
            found = body;
            *len = n;
        } else {
            free(body);
        }
    }
    fclose(f);
    return found;
}

static char *fixture_template(const char *name, size_t *len) {
    return fixture_template_in("chat_templates.txt", name, len);
}

static void check_detect(void) {
    static const struct { const char *name, *want; } cases[] = {
        {"qwen25_coder", "hermes"}, {"qwen3", "hermes"}, {"smollm2", NULL}, {"llama3", NULL}, {"mistral", NULL},
        {"gemma3", NULL}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = 0;
        char *t = fixture_template(cases[i].name, &len);
        CHECKF(t != NULL, "fixture template %s", cases[i].name);
        if (!t) continue;
        const char *got = kvg_tool_format_detect(t, len);
        CHECKF(cases[i].want ? got && strcmp(got, cases[i].want) == 0 : got == NULL, "%s: %s", cases[i].name,
               got ? got : "(none)");
        free(t);
    }
    /* think tags: Qwen3's template writes them, SmolLM2's does not */
    const char *open = NULL, *close = NULL;
    size_t qlen = 0, slen = 0;
    char *q3 = fixture_template("qwen3", &qlen), *sm = fixture_template("smollm2", &slen);
    CHECK(q3 && kvg_think_detect(q3, qlen, &open, &close) && strcmp(open, "<think>") == 0 &&
          strcmp(close, "</think>") == 0);
    CHECK(sm && !kvg_think_detect(sm, slen, &open, &close) && !open && !close);
    free(q3);
    free(sm);
    const char *got = kvg_tool_format_detect(LLAMA31, strlen(LLAMA31));
    CHECKF(got && strcmp(got, "llama3") == 0, "%s", got ? got : "(none)");
    got = kvg_tool_format_detect(MISTRAL, strlen(MISTRAL));
    CHECKF(got && strcmp(got, "mistral") == 0, "%s", got ? got : "(none)");
    got = kvg_tool_format_detect(HERMES, strlen(HERMES));
    CHECKF(got && strcmp(got, "hermes") == 0, "%s", got ? got : "(none)");
    /* the publishers' own templates (chat_tools.txt, scripts/oracle/templates/) */
    static const struct { const char *name, *want; } real[] = {
        {"llama31", "llama3"}, {"llama32", "llama3"}, {"mistral_nemo", "mistral"}, {"hermes3", "hermes"},
        {"qwen25", "hermes"}, {"qwen3_06b", "hermes"}, {"phi4_mini", "phi4"}, {"gemma3", NULL}};
    for (size_t i = 0; i < sizeof real / sizeof real[0]; i++) {
        size_t len = 0;
        char *t = fixture_template_in("chat_tools.txt", real[i].name, &len);
        CHECKF(t != NULL, "chat_tools.txt template %s", real[i].name);
        if (!t) continue;
        got = kvg_tool_format_detect(t, len);
        CHECKF(real[i].want ? got && strcmp(got, real[i].want) == 0 : got == NULL, "%s: %s", real[i].name,
               got ? got : "(none)");
        /* Phi-4-mini's alone reads the tools from the system message */
        const char *field = kvg_tool_system_field(t, len);
        CHECKF(strcmp(real[i].name, "phi4_mini") == 0 ? field && strcmp(field, "tools") == 0 : field == NULL, "%s: %s",
               real[i].name, field ? field : "(none)");
        free(t);
    }
    /* the calls written back into a Phi-4-mini message's content; other formats render fields */
    const char *calls = "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"ring_bell\", "
                        "\"arguments\": {\"times\": 2}}}, {\"id\": \"c2\", \"type\": \"function\", \"function\": "
                        "{\"name\": \"open_gate\", \"arguments\": \"{\\\"gate\\\": \\\"north\\\"}\"}}]";
    char *text = kvg_tool_calls_text(PHI4, strlen(PHI4), calls);
    CHECKF(text && strcmp(text, "<|tool_call|>[{\"name\": \"ring_bell\", \"arguments\": {\"times\": 2}}, "
                                "{\"name\": \"open_gate\", \"arguments\": {\"gate\": \"north\"}}]<|/tool_call|>") == 0,
           "%s", text ? text : "(null)");
    kvg_free(text);
    CHECK(!kvg_tool_calls_text(HERMES, strlen(HERMES), calls));
    CHECK(!kvg_tool_calls_text(PHI4, strlen(PHI4), "[{\"function\": {}}]"));
}

static kvg_tools *build(const char *tpl, kvgen_tool_choice choice, const char *name) {
    kvgen_tools_desc d = {TOOLS, 2, choice, name};
    kvg_tools *t = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvg_tools_build(&d, tpl, strlen(tpl), "test", &t, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    return t;
}

typedef struct parse_case {
    const char *tpl;
    kvgen_tool_choice choice;
    const char *reply;
    kvgen_finish want;
    const char *content;                   /* the text before the calls */
    const char *name0, *args0, *name1;     /* the calls kept */
} parse_case;

static void check_parse(void) {
    static const parse_case cases[] = {
        {HERMES, KVGEN_TOOL_AUTO,
         "Sure.\n<tool_call>\n{\"name\": \"open_gate\", \"arguments\": {\"gate\": \"north\", \"count\": 2}}\n</tool_call>",
         KVGEN_FINISH_TOOL_CALLS, "Sure.", "open_gate", "{\"gate\":\"north\",\"count\":2}", NULL},
        {HERMES, KVGEN_TOOL_AUTO,
         "<tool_call>\n{\"name\": \"ring_bell\", \"arguments\": {\"times\": 3}}\n</tool_call>\n<tool_call>\n"
         "{\"name\": \"open_gate\", \"arguments\": \"{\\\"gate\\\": \\\"south\\\", \\\"count\\\": 1}\"}\n</tool_call>\n",
         KVGEN_FINISH_TOOL_CALLS, "", "ring_bell", "{\"times\":3}", "open_gate"},
        {HERMES, KVGEN_TOOL_AUTO, "Just words.", KVGEN_FINISH_NONE, "Just words.", NULL, NULL, NULL},
        {HERMES, KVGEN_TOOL_AUTO, "x<tool_call>\n{\"name\": \"fly\", \"arguments\": {}}\n</tool_call>",
         KVGEN_FINISH_BAD_TOOL_CALL, "x", NULL, NULL, NULL},
        {HERMES, KVGEN_TOOL_AUTO,
         "<tool_call>\n{\"name\": \"open_gate\", \"arguments\": {\"gate\": \"north\", \"count\": \"two\"}}\n</tool_call>",
         KVGEN_FINISH_BAD_TOOL_CALL, "", NULL, NULL, NULL},
        {HERMES, KVGEN_TOOL_AUTO, "<tool_call>\n{\"name\": \"open_gate\", \"arguments\": {\"gate\": \"west\", \"count\": 1}}",
         KVGEN_FINISH_BAD_TOOL_CALL, "", NULL, NULL, NULL}, /* not in the enum, and unclosed */
        {HERMES, KVGEN_TOOL_AUTO, "<tool_call>\n{\"name\": \"ring_bell\", \"arguments\": {}}\n</tool_call>",
         KVGEN_FINISH_BAD_TOOL_CALL, "", NULL, NULL, NULL}, /* a required argument missing */
        {HERMES, KVGEN_TOOL_NONE, "<tool_call>\n{\"name\": \"ring_bell\", \"arguments\": {\"times\": 1}}\n</tool_call>",
         KVGEN_FINISH_BAD_TOOL_CALL, "", NULL, NULL, NULL},
        /* Hermes calls without their tags (small models drop them): read where they begin the
         * reply and name a tool; JSON elsewhere, or naming no tool, is the reply's */
        {HERMES, KVGEN_TOOL_AUTO, " {\"name\": \"ring_bell\", \"arguments\": {\"times\": 2}}\n",
         KVGEN_FINISH_TOOL_CALLS, "", "ring_bell", "{\"times\":2}", NULL},
        {HERMES, KVGEN_TOOL_AUTO,
         "{\"name\": \"ring_bell\", \"arguments\": {\"times\": 2}}\n{\"name\": \"open_gate\", \"arguments\": "
         "{\"gate\": \"north\", \"count\": 1}}",
         KVGEN_FINISH_TOOL_CALLS, "", "ring_bell", "{\"times\":2}", "open_gate"},
        {HERMES, KVGEN_TOOL_AUTO, "{\"name\": \"Bob\", \"age\": 30}", KVGEN_FINISH_NONE,
         "{\"name\": \"Bob\", \"age\": 30}", NULL, NULL, NULL},
        {HERMES, KVGEN_TOOL_AUTO, "Here: {\"name\": \"ring_bell\", \"arguments\": {\"times\": 2}}", KVGEN_FINISH_NONE,
         "Here: {\"name\": \"ring_bell\", \"arguments\": {\"times\": 2}}", NULL, NULL, NULL},
        {HERMES, KVGEN_TOOL_AUTO, "{\"name\": \"ring_bell\", \"arguments\": {\"times\": 2}}\n{\"times\": 3}",
         KVGEN_FINISH_BAD_TOOL_CALL, "", NULL, NULL, NULL}, /* a call, then JSON that is none */
        {LLAMA31, KVGEN_TOOL_AUTO, "<|python_tag|>{\"name\": \"ring_bell\", \"parameters\": {\"times\": 5}}",
         KVGEN_FINISH_TOOL_CALLS, "", "ring_bell", "{\"times\":5}", NULL},
        {LLAMA31, KVGEN_TOOL_AUTO, "{\"name\": \"open_gate\", \"parameters\": {\"gate\": \"south\", \"count\": 0}}",
         KVGEN_FINISH_TOOL_CALLS, "", "open_gate", "{\"gate\":\"south\",\"count\":0}", NULL},
        {LLAMA31, KVGEN_TOOL_AUTO, "{\"name\": \"open_gate\", \"parameters\": {\"gate\": 1, \"count\": 0}}",
         KVGEN_FINISH_BAD_TOOL_CALL, "", NULL, NULL, NULL},
        {MISTRAL, KVGEN_TOOL_AUTO,
         "[TOOL_CALLS] [{\"name\": \"open_gate\", \"arguments\": {\"gate\": \"north\", \"count\": 4}}, "
         "{\"name\": \"ring_bell\", \"arguments\": {\"times\": 2}}]",
         KVGEN_FINISH_TOOL_CALLS, "", "open_gate", "{\"gate\":\"north\",\"count\":4}", "ring_bell"},
        {MISTRAL, KVGEN_TOOL_AUTO, "Ok [{\"name\": \"ring_bell\", \"arguments\": {\"times\": 2}}]",
         KVGEN_FINISH_TOOL_CALLS, "Ok", "ring_bell", "{\"times\":2}", NULL},
        {MISTRAL, KVGEN_TOOL_AUTO, "[TOOL_CALLS] []", KVGEN_FINISH_BAD_TOOL_CALL, "", NULL, NULL, NULL},
        /* Phi-4-mini: a list between <|tool_call|> and <|/tool_call|>, either marker possibly
         * left out of the text (control tokens) */
        {PHI4, KVGEN_TOOL_AUTO,
         "<|tool_call|>[{\"name\": \"open_gate\", \"arguments\": {\"gate\": \"north\", \"count\": 2}}]<|/tool_call|>",
         KVGEN_FINISH_TOOL_CALLS, "", "open_gate", "{\"gate\":\"north\",\"count\":2}", NULL},
        {PHI4, KVGEN_TOOL_AUTO,
         "Let me.\n<|tool_call|>[{\"name\": \"ring_bell\", \"arguments\": {\"times\": 3}}, {\"name\": \"open_gate\", "
         "\"arguments\": \"{\\\"gate\\\": \\\"south\\\", \\\"count\\\": 1}\"}]<|/tool_call|>\n",
         KVGEN_FINISH_TOOL_CALLS, "Let me.", "ring_bell", "{\"times\":3}", "open_gate"},
        {PHI4, KVGEN_TOOL_AUTO, "[{\"name\": \"ring_bell\", \"arguments\": {\"times\": 1}}]", KVGEN_FINISH_TOOL_CALLS, "",
         "ring_bell", "{\"times\":1}", NULL},
        {PHI4, KVGEN_TOOL_AUTO, "<|tool_call|>[{\"name\": \"ring_bell\", \"arguments\": {\"times\": 1}}]",
         KVGEN_FINISH_TOOL_CALLS, "", "ring_bell", "{\"times\":1}", NULL},
        {PHI4, KVGEN_TOOL_AUTO, "No call: the gate is open.", KVGEN_FINISH_NONE, "No call: the gate is open.", NULL, NULL,
         NULL},
        /* malformed: an unclosed list, an unknown tool, a bad argument, text after the calls, an
         * empty list, a call not in a list: a bad call, none of the calls kept */
        {PHI4, KVGEN_TOOL_AUTO, "<|tool_call|>[{\"name\": \"ring_bell\", \"arguments\": {\"times\": 1}}",
         KVGEN_FINISH_BAD_TOOL_CALL, "", NULL, NULL, NULL},
        {PHI4, KVGEN_TOOL_AUTO,
         "<|tool_call|>[{\"name\": \"ring_bell\", \"arguments\": {\"times\": 1}}, {\"name\": \"fly\", \"arguments\": "
         "{}}]<|/tool_call|>",
         KVGEN_FINISH_BAD_TOOL_CALL, "", NULL, NULL, NULL},
        {PHI4, KVGEN_TOOL_AUTO, "<|tool_call|>[{\"name\": \"ring_bell\", \"arguments\": {\"times\": \"1\"}}]<|/tool_call|>",
         KVGEN_FINISH_BAD_TOOL_CALL, "", NULL, NULL, NULL},
        {PHI4, KVGEN_TOOL_AUTO,
         "<|tool_call|>[{\"name\": \"ring_bell\", \"arguments\": {\"times\": 1}}]<|/tool_call|> and more", 
         KVGEN_FINISH_BAD_TOOL_CALL, "", NULL, NULL, NULL},
        {PHI4, KVGEN_TOOL_AUTO, "<|tool_call|>[]<|/tool_call|>", KVGEN_FINISH_BAD_TOOL_CALL, "", NULL, NULL, NULL},
        {PHI4, KVGEN_TOOL_AUTO, "<|tool_call|>{\"name\": \"ring_bell\", \"arguments\": {\"times\": 1}}<|/tool_call|>",
         KVGEN_FINISH_BAD_TOOL_CALL, "", NULL, NULL, NULL},
        {PHI4, KVGEN_TOOL_NONE, "<|tool_call|>[{\"name\": \"ring_bell\", \"arguments\": {\"times\": 1}}]<|/tool_call|>",
         KVGEN_FINISH_BAD_TOOL_CALL, "", NULL, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const parse_case *c = &cases[i];
        kvg_tools *t = build(c->tpl, c->choice, NULL);
        if (!t) continue;
        kvgen_finish fin = KVGEN_FINISH_ERROR;
        size_t content = 99;
        kvgen_error err = {0};
        CHECK(kvg_tools_parse(t, c->reply, strlen(c->reply), 7, &fin, &content, &err) == KVGEN_OK);
        CHECKF(fin == c->want, "case %zu: %s", i, kvgen_finish_name(fin));
        CHECKF(content == strlen(c->content) && memcmp(c->reply, c->content, content) == 0, "case %zu: %zu", i, content);
        const kvgen_tool_call *calls = NULL;
        int n = kvg_tools_calls(t, &calls);
        int want_n = c->name1 ? 2 : c->name0 ? 1 : 0;
        CHECKF(n == want_n, "case %zu: %d calls", i, n);
        if (n >= 1 && want_n >= 1) {
            CHECKF(strcmp(calls[0].name, c->name0) == 0 && strcmp(calls[0].arguments, c->args0) == 0,
                   "case %zu: %s %s", i, calls[0].name, calls[0].arguments);
            /* Mistral's ids: nine base-36 digits of 7 * 1000 + i */
            CHECK(strcmp(calls[0].id, c->tpl == MISTRAL ? "0000005eg" : "call_7_0") == 0);
            CHECK(kvg_tools_calls_json(t) && strstr(kvg_tools_calls_json(t), "\"type\":\"function\""));
        }
        if (n == 2 && want_n == 2) {
            CHECKF(strcmp(calls[1].name, c->name1) == 0, "case %zu: %s", i, calls[1].name);
            CHECK(strcmp(calls[1].id, c->tpl == MISTRAL ? "0000005eh" : "call_7_1") == 0);
        }
        kvg_tools_free(t);
    }
}

static bool accepts(const kvg_gram *g, const char *text) {
    kvg_gram_match *mt = NULL;
    kvgen_error err = {0};
    if (kvg_gram_match_new(g, &mt, &err) != KVGEN_OK) return false;
    bool ok = kvg_gram_feed(mt, (const unsigned char *)text, strlen(text)) && kvg_gram_can_end(mt);
    kvg_gram_match_free(mt);
    return ok;
}

static void check_grammar(void) {
    static const char *const good_gate = "<tool_call>\n{\"name\":\"open_gate\",\"arguments\":{\"gate\":\"north\",\"count\":12}}\n</tool_call>";
    static const char *const good_bell = "<tool_call>\n{\"name\":\"ring_bell\",\"arguments\":{\"times\":-3}}\n</tool_call>";
    kvg_tools *t = build(HERMES, KVGEN_TOOL_REQUIRED, NULL);
    CHECK(t && kvg_tools_forced_grammar(t));
    kvg_gram *g = NULL;
    kvgen_error err = {0};
    if (t && kvg_tools_forced_grammar(t)) {
        CHECKF(kvg_gram_parse(kvg_tools_forced_grammar(t), &g, &err) == KVGEN_OK, "%s", err.message);
    }
    if (g) {
        CHECK(accepts(g, good_gate));
        CHECK(accepts(g, good_bell));
        CHECK(!accepts(g, "<tool_call>\n{\"name\":\"fly\",\"arguments\":{}}\n</tool_call>"));
        CHECK(!accepts(g, "<tool_call>\n{\"name\":\"open_gate\",\"arguments\":{\"gate\":\"north\",\"count\":\"2\"}}\n</tool_call>"));
        CHECK(!accepts(g, "<tool_call>\n{\"name\":\"open_gate\",\"arguments\":{\"gate\":\"east\",\"count\":2}}\n</tool_call>"));
        CHECK(!accepts(g, "<tool_call>\n{\"name\":\"ring_bell\",\"arguments\":{\"times\":1.5}}\n</tool_call>"));
        CHECK(!accepts(g, "Hello"));
        kvg_gram_free(g);
        g = NULL;
    }
    kvg_tools_free(t);
    /* a name: that tool alone */
    t = build(HERMES, KVGEN_TOOL_NAMED, "ring_bell");
    if (t && kvg_gram_parse(kvg_tools_forced_grammar(t), &g, &err) == KVGEN_OK) {
        CHECK(accepts(g, good_bell));
        CHECK(!accepts(g, good_gate));
        kvg_gram_free(g);
        g = NULL;
    } else {
        CHECKF(0, "%s", err.message);
    }
    kvg_tools_free(t);
    /* auto forces nothing: the lazy grammar takes over past the opener, every tool allowed */
    t = build(HERMES, KVGEN_TOOL_AUTO, NULL);
    CHECK(t && !kvg_tools_forced_grammar(t));
    const char *opener = NULL, *lazy = t ? kvg_tools_lazy_grammar(t, &opener) : NULL;
    CHECK(lazy && opener && strcmp(opener, "<tool_call>") == 0);
    if (lazy && kvg_gram_parse(lazy, &g, &err) == KVGEN_OK) {
        CHECK(accepts(g, "\n{\"name\":\"ring_bell\",\"arguments\":{\"times\":2}}\n</tool_call>"));
        CHECK(accepts(g, "{\"name\":\"ring_bell\",\"arguments\":{\"times\":2}}</tool_call>\n<tool_call>\n"
                         "{\"name\":\"open_gate\",\"arguments\":{\"gate\":\"south\",\"count\":1}}\n</tool_call>"));
        CHECK(!accepts(g, "\n{\"name\":\"fly\",\"arguments\":{}}\n</tool_call>"));
        CHECK(!accepts(g, "\n{\"name\":\"ring_bell\",\"arguments\":{\"times\":\"2\"}}\n</tool_call>"));
        kvg_gram_free(g);
        g = NULL;
    } else {
        CHECKF(0, "%s", err.message);
    }
    CHECK(t && strncmp(kvg_tools_json(t), "[{\"type\":\"function\",\"function\":{\"name\":\"open_gate\","
                       "\"description\":\"Opens a gate.\",\"parameters\":{", 82) == 0);
    kvg_tools_free(t);
    t = build(HERMES, KVGEN_TOOL_NONE, NULL); /* none: nothing constrains, calls are refused at the end */
    CHECK(t && !kvg_tools_forced_grammar(t) && !kvg_tools_lazy_grammar(t, NULL));
    kvg_tools_free(t);
    t = build(LLAMA31, KVGEN_TOOL_AUTO, NULL); /* its opener is a control token: read at the end */
    CHECK(t && !kvg_tools_lazy_grammar(t, NULL));
    kvg_tools_free(t);
    /* Llama 3 and Mistral write their own arguments key and brackets */
    t = build(LLAMA31, KVGEN_TOOL_NAMED, "ring_bell");
    if (t && kvg_gram_parse(kvg_tools_forced_grammar(t), &g, &err) == KVGEN_OK) {
        CHECK(accepts(g, "{\"name\":\"ring_bell\",\"parameters\":{\"times\":2}}"));
        CHECK(!accepts(g, "{\"name\":\"ring_bell\",\"arguments\":{\"times\":2}}"));
        kvg_gram_free(g);
        g = NULL;
    }
    kvg_tools_free(t);
    t = build(MISTRAL, KVGEN_TOOL_REQUIRED, NULL);
    if (t && kvg_gram_parse(kvg_tools_forced_grammar(t), &g, &err) == KVGEN_OK) {
        CHECK(accepts(g, "[{\"name\":\"ring_bell\",\"arguments\":{\"times\":2}}]"));
        kvg_gram_free(g);
        g = NULL;
    }
    kvg_tools_free(t);
    /* Phi-4-mini: a forced call is the list alone (its markers are control tokens); under auto,
     * past <|tool_call|> the list of calls the schemas accept, then maybe <|/tool_call|> */
    t = build(PHI4, KVGEN_TOOL_REQUIRED, NULL);
    if (t && kvg_gram_parse(kvg_tools_forced_grammar(t), &g, &err) == KVGEN_OK) {
        CHECK(accepts(g, "[{\"name\":\"ring_bell\",\"arguments\":{\"times\":2}}]"));
        CHECK(!accepts(g, "[{\"name\":\"ring_bell\",\"arguments\":{\"times\":\"2\"}}]"));
        kvg_gram_free(g);
        g = NULL;
    } else {
        CHECKF(0, "%s", err.message);
    }
    kvg_tools_free(t);
    t = build(PHI4, KVGEN_TOOL_AUTO, NULL);
    opener = NULL;
    lazy = t ? kvg_tools_lazy_grammar(t, &opener) : NULL;
    CHECK(t && !kvg_tools_forced_grammar(t) && lazy && opener && strcmp(opener, "<|tool_call|>") == 0);
    if (lazy && kvg_gram_parse(lazy, &g, &err) == KVGEN_OK) {
        CHECK(accepts(g, "[{\"name\":\"ring_bell\",\"arguments\":{\"times\":2}}]<|/tool_call|>"));
        CHECK(accepts(g, "[{\"name\":\"ring_bell\",\"arguments\":{\"times\":2}}, "
                         "{\"name\":\"open_gate\",\"arguments\":{\"gate\":\"south\",\"count\":1}}]"));
        CHECK(!accepts(g, "[{\"name\":\"fly\",\"arguments\":{}}]<|/tool_call|>"));
        CHECK(!accepts(g, "[{\"name\":\"open_gate\",\"arguments\":{\"gate\":\"east\",\"count\":1}}]"));
        CHECK(!accepts(g, "[]<|/tool_call|>"));
        kvg_gram_free(g);
    } else {
        CHECKF(0, "%s", err.message);
    }
    kvg_tools_free(t);
}

static void expect_refused(const kvgen_tool *tools, int n, kvgen_tool_choice choice, const char *name,
                           const char *tpl, kvgen_status want, const char *msg) {
    kvgen_tools_desc d = {tools, n, choice, name};
    kvg_tools *t = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvg_tools_build(&d, tpl, strlen(tpl), "test", &t, &err);
    CHECKF(st == want && !t && strstr(err.message, msg), "%s (want '%s')", err.message, msg);
    kvg_tools_free(t);
}

static void check_refused(void) {
    kvgen_tool bad_name[] = {{"open gate", NULL, NULL}};
    expect_refused(bad_name, 1, KVGEN_TOOL_AUTO, NULL, HERMES, KVGEN_E_INVALID_ARGUMENT,
                   "test: tools[0].name 'open gate'");
    kvgen_tool twice[] = {{"a", NULL, NULL}, {"a", NULL, NULL}};
    expect_refused(twice, 2, KVGEN_TOOL_AUTO, NULL, HERMES, KVGEN_E_INVALID_ARGUMENT, "tools[1].name 'a' is given twice");
    kvgen_tool pattern[] = {{"a", NULL, "{\"type\":\"string\",\"pattern\":\"x+\"}"}};
    expect_refused(pattern, 1, KVGEN_TOOL_AUTO, NULL, HERMES, KVGEN_E_INVALID_ARGUMENT, "tools[0].parameters ('a'): schema");
    kvgen_tool not_json[] = {{"a", NULL, "{"}};
    expect_refused(not_json, 1, KVGEN_TOOL_AUTO, NULL, HERMES, KVGEN_E_INVALID_ARGUMENT, "tools[0].parameters ('a')");
    expect_refused(TOOLS, 2, KVGEN_TOOL_NAMED, "fly", HERMES, KVGEN_E_INVALID_ARGUMENT, "name 'fly' is none of the tools");
    expect_refused(TOOLS, 0, KVGEN_TOOL_AUTO, NULL, HERMES, KVGEN_E_INVALID_ARGUMENT, "n_tools 0");
    expect_refused(TOOLS, 2, KVGEN_TOOL_AUTO, NULL, "{{ messages }}", KVGEN_E_UNSUPPORTED, "no format kvgen knows");
}

/* the small random model these checks chat with (reference backend) and a session of 4,096
 * positions on it; false, with nothing left open, where either could not be made */
static bool open_session(kvgen_model **m, kvgen_session **s) {
    *m = NULL;
    *s = NULL;
    char *path = tu_make_model("toolcall.gguf", "--seed 5 --layers 1 --embd 32 --ff 64 --heads 2 --kv-heads 1");
    if (!path) return false;
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 1};
    kvgen_error err = {0};
    CHECK_OK(kvgen_model_load(&md, m, &err));
    kvgen_session_desc sd = {.n_ctx = 4096};
    if (*m) CHECK_OK(kvgen_session_create(*m, &sd, s, &err));
    free(path);
    if (!*s) {
        kvgen_model_unload(*m);
        *m = NULL;
        return false;
    }
    return true;
}

static void check_session(void) {
    kvgen_model *m = NULL;
    kvgen_session *s = NULL;
    if (!open_session(&m, &s)) return;
    kvgen_error err = {0};
    kvgen_chat_template tpl = {.jinja = HERMES_FULL};
    CHECK_OK(kvgen_chat_set_template(s, &tpl, &err));
    CHECK(kvgen_chat_tool_format(s) && strcmp(kvgen_chat_tool_format(s), "hermes") == 0);
    kvgen_tools_desc td = {TOOLS, 2, KVGEN_TOOL_NAMED, "open_gate"};
    kvgen_generate_desc d = {.tools = &td};
    kvgen_gen *g = NULL;
    /* refused where tools cannot be read, changing nothing */
    CHECK(kvgen_gen_begin_text(s, "x", 1, &d, &g, &err) == KVGEN_E_UNSUPPORTED && strstr(err.message, "tools"));
    kvgen_job_desc jd = {.prompt = KVGEN_PROMPT_TEXT, .text = "x", .gen = d};
    kvgen_job *job = NULL;
    CHECKF(kvgen_job_submit(s, &jd, &job, &err) == KVGEN_E_INVALID_ARGUMENT && !job &&
               strstr(err.message, "kvgen_job_submit: gen.tools: only a chat job"),
           "%s", err.message);
    kvgen_constraint k = {.kind = KVGEN_CONSTRAIN_GRAMMAR, .grammar = "root ::= \"a\""};
    kvgen_generate_desc with_k = {.tools = &td, .constraint = &k};
    CHECK(kvgen_chat_gen_begin(s, "user", "x", &with_k, &g, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_session_length(s) == 0 && kvgen_chat_vars(s) == NULL);

    CHECK_OK(kvgen_chat_gen_begin(s, "user", "Open the gate", &d, &g, &err));
    kvgen_status st = KVGEN_OK;
    while (g && st == KVGEN_OK && kvgen_gen_finish(g) == KVGEN_FINISH_NONE) st = kvgen_gen_next(g, NULL, &err);
    CHECKF(g && kvgen_gen_finish(g) == KVGEN_FINISH_TOOL_CALLS, "%s %s", kvgen_finish_name(kvgen_gen_finish(g)),
           err.message);
    const kvgen_tool_call *calls = NULL;
    int n = kvgen_gen_tool_calls(g, &calls);
    CHECK(n == 1);
    char id[64] = "";
    if (n == 1) {
        CHECK(strcmp(calls[0].name, "open_gate") == 0);
        CHECKF(strncmp(calls[0].arguments, "{\"gate\":\"north\",\"count\":", 24) == 0 ||
                   strncmp(calls[0].arguments, "{\"gate\":\"south\",\"count\":", 24) == 0,
               "%s", calls[0].arguments);
        snprintf(id, sizeof id, "%s", calls[0].id);
    }
    size_t len = 0;
    CHECK(kvgen_gen_text(g, &len) && len == 0);
    kvgen_gen_end(g);
    CHECK(kvgen_chat_vars(s) && strstr(kvgen_chat_vars(s), "\"tools\":[{\"type\":\"function\""));
    kvgen_chat_message result = {.role = "tool", .content = "{\"opened\":true}", .tool_call_id = id};
    CHECK_OK(kvgen_chat_add_message(s, &result, &err));
    kvgen_chat_message *msgs = NULL;
    size_t nm = 0;
    CHECK_OK(kvgen_chat_messages(s, &msgs, &nm, &err));
    CHECK(nm == 3);
    if (nm == 3) {
        CHECK(strcmp(msgs[1].role, "assistant") == 0 && msgs[1].tool_calls && strstr(msgs[1].tool_calls, id));
        CHECK(strcmp(msgs[2].role, "tool") == 0 && strcmp(msgs[2].tool_call_id, id) == 0);
    }
    kvgen_chat_messages_free(msgs);
    /* the next reply, tools still offered but not callable */
    td.choice = KVGEN_TOOL_NONE;
    kvgen_generate_desc next = {.tools = &td, .max_tokens = 4};
    CHECK_OK(kvgen_chat_gen_begin(s, NULL, NULL, &next, &g, &err));
    while (g && kvgen_gen_finish(g) == KVGEN_FINISH_NONE && kvgen_gen_next(g, NULL, &err) == KVGEN_OK) {}
    CHECK(g && kvgen_gen_tool_calls(g, NULL) == 0);
    kvgen_gen_end(g);
    /* a built-in family has no place for tools */
    /* a template with think tags: the reasoning apart, kept as reasoning_content */
    kvgen_chat_template think = {.jinja = "{% for m in messages %}{{ m.role }}: {% if m.reasoning_content %}<think>"
                                          "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}\n{% endfor %}"
                                          "{% if add_generation_prompt %}assistant: {% endif %}"};
    CHECK_OK(kvgen_chat_set_template(s, &think, &err));
    kvgen_constraint says = {.kind = KVGEN_CONSTRAIN_GRAMMAR, .grammar = "root ::= \"<think>\\nHmm.\\n</think>\\n\\nNo.\""};
    kvgen_generate_desc said = {.constraint = &says};
    CHECK_OK(kvgen_chat_gen_begin(s, "user", "Why?", &said, &g, &err));
    while (g && kvgen_gen_finish(g) == KVGEN_FINISH_NONE && kvgen_gen_next(g, NULL, &err) == KVGEN_OK) {}
    size_t rlen = 0;
    const char *r = g ? kvgen_gen_reasoning(g, &rlen) : NULL;
    CHECKF(r && rlen == 4 && strcmp(r, "Hmm.") == 0, "%s", r ? r : "(none)");
    CHECK(g && strcmp(kvgen_gen_text(g, NULL), "No.") == 0 && kvgen_gen_finish(g) == KVGEN_FINISH_STOP);
    kvgen_gen_end(g);
    CHECK_OK(kvgen_chat_messages(s, &msgs, &nm, &err));
    CHECK(nm >= 2 && msgs[nm - 1].reasoning_content && strcmp(msgs[nm - 1].reasoning_content, "Hmm.") == 0 &&
          strcmp(msgs[nm - 1].content, "No.") == 0);
    kvgen_chat_messages_free(msgs);
    kvgen_chat_template family = {.name = "chatml"};
    CHECK_OK(kvgen_chat_set_template(s, &family, &err));
    size_t before = kvgen_session_length(s);
    CHECK(kvgen_chat_gen_begin(s, "user", "x", &d, &g, &err) == KVGEN_E_UNSUPPORTED &&
          strstr(err.message, "Jinja"));
    CHECK(kvgen_session_length(s) == before && kvgen_chat_tool_format(s) == NULL);
    kvgen_session_close(s);
    kvgen_model_unload(m);
}

/* A generation run step by step: the steps' text and reasoning pieces joined; *tagged counts
 * pieces (of either) that show a think tag, tool-call markup or a brace. */
typedef struct streamed {
    char text[512], reasoning[512];
    int tagged, steps, reasoning_steps, split_tag;
} streamed;

static kvgen_finish run_streamed(kvgen_gen *g, const kvgen_model *m, streamed *out) {
    memset(out, 0, sizeof *out);
    kvgen_error err = {0};
    kvgen_gen_step step;
    while (g && kvgen_gen_finish(g) == KVGEN_FINISH_NONE && kvgen_gen_next(g, &step, &err) == KVGEN_OK) {
        out->steps++;
        const char *parts[2] = {step.text, step.reasoning};
        for (int i = 0; i < 2; i++)
            if (!parts[i] || strchr(parts[i], '<') || strchr(parts[i], '{') || strstr(parts[i], "think") ||
                strstr(parts[i], "tool_call"))
                out->tagged++;
        strncat(out->text, step.text, sizeof out->text - strlen(out->text) - 1);
        if (step.reasoning) strncat(out->reasoning, step.reasoning, sizeof out->reasoning - strlen(out->reasoning) - 1);
        if (step.reasoning_len > 0) out->reasoning_steps++;
        char piece[64];
        size_t n = step.token >= 0 ? kvgen_token_piece(m, step.token, 0, piece, sizeof piece - 1) : 0;
        piece[n < sizeof piece ? n : 0] = 0;
        /* a token that holds part of a tag, not all of it: the tag came split */
        if (n > 0 && strpbrk(piece, "<>") && !strstr(piece, "<think>") && !strstr(piece, "</think>")) out->split_tag++;
    }
    return g ? kvgen_gen_finish(g) : KVGEN_FINISH_ERROR;
}

/* the generator's results agree with what its steps gave */
static void check_agrees(kvgen_gen *g, const streamed *st, const char *text, const char *reasoning) {
    size_t rlen = 0;
    const char *r = g ? kvgen_gen_reasoning(g, &rlen) : NULL;
    CHECKF(g && strcmp(kvgen_gen_text(g, NULL), st->text) == 0 && strcmp(st->text, text) == 0,
           "text '%s', streamed '%s', expected '%s'", g ? kvgen_gen_text(g, NULL) : "", st->text, text);
    CHECKF(strcmp(r ? r : "", st->reasoning) == 0 && strcmp(st->reasoning, reasoning) == 0,
           "reasoning '%s', streamed '%s', expected '%s'", r ? r : "(none)", st->reasoning, reasoning);
    CHECKF(st->tagged == 0, "%d pieces showed markup", st->tagged);
}

static const char THINK_TPL[] = "{% for m in messages %}{{ m.role }}: {% if m.reasoning_content %}<think>"
                                "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}\n{% endfor %}"
                                "{% if add_generation_prompt %}assistant: {% endif %}";
static const char THINK_OPENED_TPL[] = "{% for m in messages %}{{ m.role }}: {% if m.reasoning_content %}<think>"
                                       "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}\n{% endfor %}"
                                       "{% if add_generation_prompt %}assistant: <think>\n{% endif %}";

/* Steps never give reasoning or its tags as text, nor call markup: the reasoning comes apart,
 * its pieces adding up to kvgen_gen_reasoning, whether the reply ends on its own, at
 * max_tokens or at a stop string, and when the prompt opened the reasoning. A forced call
 * streams no markup; one cut short by max_tokens or a stop string is no call, and the
 * conversation keeps no broken call. */
static void check_stream(void) {
    kvgen_model *m = NULL;
    kvgen_session *s = NULL;
    if (!open_session(&m, &s)) return;
    kvgen_error err = {0};
    kvgen_chat_template think = {.jinja = THINK_TPL};
    CHECK_OK(kvgen_chat_set_template(s, &think, &err));
    kvgen_constraint says = {.kind = KVGEN_CONSTRAIN_GRAMMAR,
                             .grammar = "root ::= \"<think>\\nHmm, the gate.\\n</think>\\n\\nNo, it stays shut.\""};
    streamed st;
    kvgen_gen *g = NULL;
    kvgen_generate_desc whole = {.constraint = &says};
    CHECK_OK(kvgen_chat_gen_begin(s, "user", "Open it?", &whole, &g, &err));
    CHECK(run_streamed(g, m, &st) == KVGEN_FINISH_STOP);
    check_agrees(g, &st, "No, it stays shut.", "Hmm, the gate.");
    CHECKF(st.reasoning_steps >= 2 && st.split_tag > 0, "%d steps of reasoning, %d tokens with part of a tag",
           st.reasoning_steps, st.split_tag);
    kvgen_gen_end(g);

    /* cut inside the reasoning by max_tokens, and by a stop string */
    kvgen_generate_desc cut = {.constraint = &says, .max_tokens = 12};
    CHECK_OK(kvgen_chat_gen_begin(s, "user", "Again?", &cut, &g, &err));
    CHECK(run_streamed(g, m, &st) == KVGEN_FINISH_LENGTH);
    check_agrees(g, &st, "", kvgen_gen_reasoning(g, NULL) ? kvgen_gen_reasoning(g, NULL) : "");
    CHECK(strlen(st.reasoning) > 0 && strncmp("Hmm, the gate.", st.reasoning, strlen(st.reasoning)) == 0);
    kvgen_gen_end(g);
    const char *stop[] = {"gate"};
    kvgen_generate_desc stopped = {.constraint = &says, .stop = stop, .n_stop = 1};
    CHECK_OK(kvgen_chat_gen_begin(s, "user", "And now?", &stopped, &g, &err));
    CHECK(run_streamed(g, m, &st) == KVGEN_FINISH_STOP_STRING);
    check_agrees(g, &st, "", "Hmm, the");
    kvgen_gen_end(g);

    /* the prompt opened the reasoning; then a thinking budget forces the closing tag */
    kvgen_chat_template opened = {.jinja = THINK_OPENED_TPL};
    CHECK_OK(kvgen_chat_set_template(s, &opened, &err));
    kvgen_constraint rest = {.kind = KVGEN_CONSTRAIN_GRAMMAR, .grammar = "root ::= \"  Maybe.\\n</think>\\n\\nYes.\""};
    kvgen_generate_desc after = {.constraint = &rest};
    CHECK_OK(kvgen_chat_gen_begin(s, "user", "Sure?", &after, &g, &err));
    CHECK(run_streamed(g, m, &st) == KVGEN_FINISH_STOP);
    check_agrees(g, &st, "Yes.", "Maybe.");
    kvgen_gen_end(g);
    kvgen_generate_desc budget = {.thinking_budget = 3, .max_tokens = 16, .ignore_eog = 1};
    CHECK_OK(kvgen_chat_gen_begin(s, "user", "Think briefly.", &budget, &g, &err));
    CHECK(run_streamed(g, m, &st) == KVGEN_FINISH_LENGTH);
    size_t rlen = 0;
    const char *r = g ? kvgen_gen_reasoning(g, &rlen) : NULL;
    CHECKF(r && strcmp(r, st.reasoning) == 0 && strcmp(kvgen_gen_text(g, NULL), st.text) == 0 &&
               !strstr(st.text, "think>") && !strstr(st.reasoning, "think>"),
           "reasoning '%s' streamed '%s', text '%s' streamed '%s'", r ? r : "(none)", st.reasoning,
           g ? kvgen_gen_text(g, NULL) : "", st.text);
    kvgen_gen_end(g);

    /* a forced call: nothing of its markup streams; cut short, it is no call */
    kvgen_session_reset(s);
    kvgen_chat_template hermes = {.jinja = HERMES_FULL};
    CHECK_OK(kvgen_chat_set_template(s, &hermes, &err));
    kvgen_tools_desc td = {TOOLS, 2, KVGEN_TOOL_NAMED, "open_gate"};
    kvgen_generate_desc call = {.tools = &td};
    CHECK_OK(kvgen_chat_gen_begin(s, "user", "Open the gate", &call, &g, &err));
    CHECK(run_streamed(g, m, &st) == KVGEN_FINISH_TOOL_CALLS);
    CHECK(st.steps > 3 && st.text[0] == 0 && st.tagged == 0 && kvgen_gen_tool_calls(g, NULL) == 1);
    kvgen_gen_end(g);
    kvgen_chat_message *msgs = NULL;
    size_t nm = 0;
    const char *cut_stop[] = {"count"};
    kvgen_generate_desc cuts[2] = {{.tools = &td, .max_tokens = 6}, {.tools = &td, .stop = cut_stop, .n_stop = 1}};
    kvgen_finish want[2] = {KVGEN_FINISH_LENGTH, KVGEN_FINISH_STOP_STRING};
    for (int i = 0; i < 2; i++) {
        kvgen_session_reset(s);
        CHECK_OK(kvgen_chat_set_template(s, &hermes, &err));
        CHECK_OK(kvgen_chat_gen_begin(s, "user", "Open the gate", &cuts[i], &g, &err));
        CHECK(run_streamed(g, m, &st) == want[i]);
        CHECK(st.text[0] == 0 && st.tagged == 0 && kvgen_gen_tool_calls(g, NULL) == 0);
        CHECK(g && strcmp(kvgen_gen_text(g, NULL), "") == 0);
        kvgen_gen_end(g);
        CHECK_OK(kvgen_chat_messages(s, &msgs, &nm, &err));
        CHECKF(nm == 2 && strcmp(msgs[1].role, "assistant") == 0 && !msgs[1].tool_calls &&
                   !strstr(msgs[1].content ? msgs[1].content : "", "tool_call") &&
                   !strstr(msgs[1].content ? msgs[1].content : "", "{"),
               "%zu messages, the last '%s'", nm, nm ? (msgs[nm - 1].content ? msgs[nm - 1].content : "(null)") : "");
        kvgen_chat_messages_free(msgs);
        /* the conversation goes on from there */
        kvgen_generate_desc next = {.max_tokens = 2};
        CHECK_OK(kvgen_chat_gen_begin(s, "user", "Well?", &next, &g, &err));
        kvgen_gen_end(g);
    }
    /* cancelled half-way through the call: the same */
    kvgen_session_reset(s);
    CHECK_OK(kvgen_chat_set_template(s, &hermes, &err));
    CHECK_OK(kvgen_chat_gen_begin(s, "user", "Open the gate", &call, &g, &err));
    kvgen_gen_step step;
    for (int i = 0; i < 5 && g; i++) CHECK_OK(kvgen_gen_next(g, &step, &err));
    CHECK(g && kvgen_gen_finish(g) == KVGEN_FINISH_NONE);
    kvgen_gen_cancel(g);
    CHECK(run_streamed(g, m, &st) == KVGEN_FINISH_CANCELLED);
    CHECK(st.text[0] == 0 && st.tagged == 0 && kvgen_gen_tool_calls(g, NULL) == 0);
    kvgen_gen_end(g);
    CHECK_OK(kvgen_chat_messages(s, &msgs, &nm, &err));
    CHECK(nm == 2 && !msgs[1].tool_calls && !strstr(msgs[1].content ? msgs[1].content : "", "tool_call"));
    kvgen_chat_messages_free(msgs);
    kvgen_session_close(s);
    kvgen_model_unload(m);
}

static void pause_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* polls a job to its end, joining its text; false after a generous bound (a hang) */
static bool job_run(kvgen_job *j, char *text, size_t cap, int *tagged) {
    text[0] = 0;
    for (long i = 0; i < 600000; i++) {
        const char *piece = NULL;
        kvgen_job_state st = kvgen_job_poll(j, &piece, NULL);
        if (piece && (strchr(piece, '<') || strchr(piece, '{'))) (*tagged)++;
        if (piece) strncat(text, piece, cap - strlen(text) - 1);
        if (st == KVGEN_JOB_DONE || st == KVGEN_JOB_CANCELLED || st == KVGEN_JOB_FAILED) return true;
        pause_ms(1);
    }
    return false;
}

/* A chat job takes tools and thinking as kvgen_chat_gen_begin does: a forced call finishes
 * "tool_calls" with its calls and the conversation holding them, no markup in the job's text;
 * the reasoning comes apart from the text and is kept; a call cut by max_tokens is none; tools
 * under a template without a call format fail the job and, as a cancel before the first token,
 * leave the session as it was (the tools variable too). */
static void check_jobs(void) {
    kvgen_model *m = NULL;
    kvgen_session *s = NULL;
    if (!open_session(&m, &s)) return;
    kvgen_error err = {0};
    kvgen_chat_template hermes = {.jinja = HERMES_FULL};
    CHECK_OK(kvgen_chat_set_template(s, &hermes, &err));
    kvgen_tools_desc td = {TOOLS, 2, KVGEN_TOOL_NAMED, "open_gate"};
    kvgen_job_desc jd = {.prompt = KVGEN_PROMPT_CHAT, .role = "user", .text = "Open the gate", .gen = {.tools = &td}};
    kvgen_job *job = NULL;
    char text[512];
    int tagged = 0;
    /* bad tools are refused at submit, naming them */
    kvgen_tools_desc bad = {TOOLS, 2, KVGEN_TOOL_NAMED, "fly"};
    kvgen_job_desc jbad = jd;
    jbad.gen.tools = &bad;
    CHECKF(kvgen_job_submit(s, &jbad, &job, &err) == KVGEN_E_INVALID_ARGUMENT && !job && strstr(err.message, "fly"),
           "%s", err.message);
    CHECK_OK(kvgen_job_submit(s, &jd, &job, &err));
    CHECK(job && job_run(job, text, sizeof text, &tagged));
    kvgen_job_info info;
    kvgen_job_get_info(job, &info);
    CHECKF(info.state == KVGEN_JOB_DONE && info.finish == KVGEN_FINISH_TOOL_CALLS, "%s %s",
           kvgen_job_state_name(info.state), info.error.message);
    const kvgen_tool_call *calls = NULL;
    CHECK(kvgen_job_tool_calls(job, &calls) == 1 && calls && strcmp(calls[0].name, "open_gate") == 0 &&
          strncmp(calls[0].arguments, "{\"gate\":", 8) == 0);
    CHECK(text[0] == 0 && tagged == 0);
    char id[64] = "";
    if (calls) snprintf(id, sizeof id, "%s", calls[0].id);
    kvgen_job_release(job);
    kvgen_chat_message *msgs = NULL;
    size_t nm = 0;
    CHECK_OK(kvgen_chat_messages(s, &msgs, &nm, &err));
    CHECK(nm == 2 && msgs[1].tool_calls && id[0] && strstr(msgs[1].tool_calls, id));
    kvgen_chat_messages_free(msgs);

    /* cut by max_tokens inside the call: no call, none kept */
    kvgen_session_reset(s);
    CHECK_OK(kvgen_chat_set_template(s, &hermes, &err));
    kvgen_job_desc jcut = jd;
    jcut.gen.max_tokens = 6;
    CHECK_OK(kvgen_job_submit(s, &jcut, &job, &err));
    CHECK(job && job_run(job, text, sizeof text, &tagged));
    kvgen_job_get_info(job, &info);
    CHECK(info.state == KVGEN_JOB_DONE && info.finish == KVGEN_FINISH_LENGTH && kvgen_job_tool_calls(job, NULL) == 0);
    CHECK(text[0] == 0 && tagged == 0);
    kvgen_job_release(job);
    CHECK_OK(kvgen_chat_messages(s, &msgs, &nm, &err));
    CHECK(nm == 2 && !msgs[1].tool_calls && !strstr(msgs[1].content ? msgs[1].content : "", "tool_call"));
    kvgen_chat_messages_free(msgs);

    /* reasoning apart */
    kvgen_chat_template think = {.jinja = THINK_TPL};
    CHECK_OK(kvgen_chat_set_template(s, &think, &err));
    kvgen_constraint says = {.kind = KVGEN_CONSTRAIN_GRAMMAR,
                             .grammar = "root ::= \"<think>\\nHmm, the gate.\\n</think>\\n\\nNo, it stays shut.\""};
    kvgen_job_desc jthink = {.prompt = KVGEN_PROMPT_CHAT, .role = "user", .text = "Open it?",
                             .gen = {.constraint = &says}};
    CHECK_OK(kvgen_job_submit(s, &jthink, &job, &err));
    CHECK(job && job_run(job, text, sizeof text, &tagged));
    size_t rlen = 0;
    const char *r = kvgen_job_reasoning(job, &rlen);
    CHECKF(strcmp(text, "No, it stays shut.") == 0 && tagged == 0, "'%s'", text);
    CHECKF(r && rlen == 14 && strcmp(r, "Hmm, the gate.") == 0, "'%s'", r ? r : "(null)");
    CHECK(strcmp(kvgen_job_text(job, NULL), "No, it stays shut.") == 0 && kvgen_job_tool_calls(job, NULL) == 0);
    kvgen_job_release(job);
    CHECK_OK(kvgen_chat_messages(s, &msgs, &nm, &err));
    CHECK(nm >= 1 && msgs[nm - 1].reasoning_content && strcmp(msgs[nm - 1].reasoning_content, "Hmm, the gate.") == 0 &&
          strcmp(msgs[nm - 1].content, "No, it stays shut.") == 0);
    kvgen_chat_messages_free(msgs);

    /* a thinking budget: the closing tag forced, the job's text after it */
    kvgen_chat_template opened = {.jinja = THINK_OPENED_TPL};
    CHECK_OK(kvgen_chat_set_template(s, &opened, &err));
    kvgen_job_desc jbudget = {.prompt = KVGEN_PROMPT_CHAT, .role = "user", .text = "Think briefly.",
                              .gen = {.thinking_budget = 3, .max_tokens = 12, .ignore_eog = 1}};
    kvgen_sampler_desc varied = {.temperature = 1.0f, .seed = 7}; /* greedy writes only newlines here */
    CHECK_OK(kvgen_session_set_sampler(s, &varied, &err));
    CHECK_OK(kvgen_job_submit(s, &jbudget, &job, &err));
    CHECK(job && job_run(job, text, sizeof text, &tagged));
    r = kvgen_job_reasoning(job, &rlen);
    kvgen_job_get_info(job, &info);
    CHECKF(info.finish == KVGEN_FINISH_LENGTH && r && rlen > 0 && !strstr(r, "think>") && !strstr(text, "think>") &&
               strcmp(kvgen_job_text(job, NULL), text) == 0,
           "%s: '%s' / '%s'", kvgen_finish_name(info.finish), r ? r : "(null)", text);
    kvgen_job_release(job);
    CHECK_OK(kvgen_session_set_sampler(s, NULL, &err));
    CHECK_OK(kvgen_chat_set_template(s, &think, &err));

    /* tools under a template that writes no calls: the job fails, the session as it was */
    size_t len0 = kvgen_session_length(s);
    const char *vars0 = kvgen_chat_vars(s);
    char vars_before[1024];
    snprintf(vars_before, sizeof vars_before, "%s", vars0 ? vars0 : "(none)");
    CHECK_OK(kvgen_job_submit(s, &jd, &job, &err));
    CHECK(job && job_run(job, text, sizeof text, &tagged));
    kvgen_job_get_info(job, &info);
    CHECKF(info.state == KVGEN_JOB_FAILED && info.error.status == KVGEN_E_UNSUPPORTED &&
               strstr(info.error.message, "tools"),
           "%s: %s", kvgen_job_state_name(info.state), info.error.message);
    kvgen_job_release(job);
    CHECK(kvgen_session_length(s) == len0);
    vars0 = kvgen_chat_vars(s);
    CHECK(strcmp(vars0 ? vars0 : "(none)", vars_before) == 0);

    /* cancelled while its prompt is prefilled: the turn and the tools taken back */
    CHECK_OK(kvgen_chat_set_template(s, &hermes, &err));
    CHECK_OK(kvgen_chat_set_vars(s, NULL, &err));
    len0 = kvgen_session_length(s);
    CHECK_OK(kvgen_chat_messages(s, &msgs, &nm, &err));
    size_t nm0 = nm;
    kvgen_chat_messages_free(msgs);
    char long_text[3000];
    for (size_t i = 0; i < sizeof long_text - 1; i++) long_text[i] = "abc defg hij "[i % 13];
    long_text[sizeof long_text - 1] = 0;
    kvgen_jobs_desc slow = {.prefill_chunk = 2};
    CHECK_OK(kvgen_jobs_configure(m, &slow, &err));
    kvgen_job_desc jlong = jd;
    jlong.text = long_text;
    CHECK_OK(kvgen_job_submit(s, &jlong, &job, &err));
    for (long i = 0; i < 600000; i++) {
        kvgen_job_get_info(job, &info);
        if (info.state != KVGEN_JOB_QUEUED) break;
        pause_ms(1);
    }
    kvgen_job_cancel(job);
    CHECK(job_run(job, text, sizeof text, &tagged));
    kvgen_job_get_info(job, &info);
    CHECK(info.state == KVGEN_JOB_CANCELLED && info.finish == KVGEN_FINISH_CANCELLED);
    if (info.n_tokens == 0) {
        CHECK(kvgen_session_length(s) == len0 && kvgen_chat_vars(s) == NULL);
        CHECK_OK(kvgen_chat_messages(s, &msgs, &nm, &err));
        CHECK(nm == nm0);
        kvgen_chat_messages_free(msgs);
    } else {
        printf("note: the job made %d tokens before its cancel was seen; rollback not checked this run\n",
               info.n_tokens);
    }
    kvgen_job_release(job);
    kvgen_session_close(s);
    kvgen_model_unload(m);
}

/* A template that shows its variables: enable_thinking false writes an empty think block, npc
 * names the assistant. */
static const char VARS_TPL[] = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant{{ npc | default('') }}: "
                               "{% if enable_thinking is false %}<think></think>{% endif %}{% endif %}";

/* the session's tokens as text, control tokens spelled */
static const char *session_text(const kvgen_model *m, kvgen_session *s, char *buf, size_t size) {
    kvgen_detokenize(m, kvgen_session_tokens(s), kvgen_session_length(s), KVGEN_TOKENIZE_SPECIAL, buf, size);
    return buf;
}

/* the session's chat variables, "(none)" when none */
static const char *vars_of(kvgen_session *s) { return kvgen_chat_vars(s) ? kvgen_chat_vars(s) : "(none)"; }

/* A chat job's chat_vars: taken on a busy session (queued behind another job of it), set when the
 * job starts and in force for its turn and after it; bad ones refused at submit naming
 * chat_vars; a job that fails or is cancelled before its first token puts the session's
 * variables back. */
static void check_job_vars(void) {
    char *path = tu_make_model("toolcall_vars.gguf", "--seed 5 --layers 1 --embd 32 --ff 64 --heads 2 --kv-heads 1");
    if (!path) return;
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 1};
    kvgen_model *m = NULL;
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    kvgen_session_desc sd = {.n_ctx = 4096};
    if (m) CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    free(path);
    if (!s) {
        kvgen_model_unload(m);
        return;
    }
    kvgen_chat_template vt = {.jinja = VARS_TPL};
    CHECK_OK(kvgen_chat_set_template(s, &vt, &err));
    static char all[16384];
    char text[512];
    int tagged = 0;
    kvgen_job_info info;

    /* two turns queued back to back: the second's variables reach its turn on the busy session */
    kvgen_job_desc first = {.prompt = KVGEN_PROMPT_CHAT, .role = "user", .text = "Hello there",
                            .gen = {.max_tokens = 4, .ignore_eog = 1}};
    kvgen_job_desc second = {.prompt = KVGEN_PROMPT_CHAT, .role = "user", .text = "Quiet now",
                             .chat_vars = "{\"enable_thinking\": false, \"npc\": \"[Guard]\"}",
                             .gen = {.max_tokens = 1, .ignore_eog = 1}};
    kvgen_job *j1 = NULL, *j2 = NULL;
    CHECK_OK(kvgen_job_submit(s, &first, &j1, &err));
    CHECK_OK(kvgen_job_submit(s, &second, &j2, &err));
    CHECK(j1 && j2 && job_run(j1, text, sizeof text, &tagged) && job_run(j2, text, sizeof text, &tagged));
    kvgen_job_get_info(j2, &info);
    CHECKF(info.state == KVGEN_JOB_DONE, "%s: %s", kvgen_job_state_name(info.state), info.error.message);
    kvgen_job_release(j1);
    kvgen_job_release(j2);
    session_text(m, s, all, sizeof all);
    CHECKF(strstr(all, "user: Hello there\nassistant: ") && !strstr(all, "Hello there\nassistant[Guard]") &&
               strstr(all, "user: Quiet now\nassistant[Guard]: <think></think>"),
           "%s", all);
    /* in force after the turn, as after kvgen_chat_set_vars */
    CHECKF(strcmp(vars_of(s), "{\"enable_thinking\":false,\"npc\":\"[Guard]\"}") == 0, "%s", vars_of(s));
    /* "{}" removes them for the next turn */
    kvgen_job_desc plain = {.prompt = KVGEN_PROMPT_CHAT, .role = "user", .text = "Speak", .chat_vars = "{}",
                            .gen = {.max_tokens = 1, .ignore_eog = 1}};
    CHECK_OK(kvgen_job_submit(s, &plain, &j1, &err));
    CHECK(j1 && job_run(j1, text, sizeof text, &tagged));
    kvgen_job_release(j1);
    session_text(m, s, all, sizeof all);
    CHECKF(strstr(all, "user: Speak\nassistant: ") && !strstr(all, "Speak\nassistant: <think>"), "%s", all);
    CHECK(kvgen_chat_vars(s) == NULL);

    /* refused at submit as kvgen_chat_set_vars refuses them, naming chat_vars */
    static const char *const bad[] = {"[1]", "{\"messages\": []}", "{\"npc\": ", "{\"add_generation_prompt\": 1}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kvgen_job_desc jb = plain;
        jb.chat_vars = bad[i];
        kvgen_job *none = NULL;
        CHECKF(kvgen_job_submit(s, &jb, &none, &err) == KVGEN_E_INVALID_ARGUMENT && !none &&
                   strstr(err.message, "kvgen_job_submit: chat_vars: "),
               "%s: %s", bad[i], err.message);
    }
    kvgen_job_desc jtext = {.prompt = KVGEN_PROMPT_TEXT, .text = "x", .chat_vars = "{}"};
    CHECKF(kvgen_job_submit(s, &jtext, &j1, &err) == KVGEN_E_INVALID_ARGUMENT && !j1 &&
               strstr(err.message, "chat_vars"),
           "%s", err.message);

    /* a job failed before its first token (tools under a template that writes no calls): the
     * session's variables back */
    CHECK_OK(kvgen_chat_set_vars(s, "{\"npc\": \"[Old]\"}", &err));
    size_t len0 = kvgen_session_length(s);
    kvgen_tools_desc td = {TOOLS, 2, KVGEN_TOOL_NAMED, "open_gate"};
    kvgen_job_desc jfail = {.prompt = KVGEN_PROMPT_CHAT, .role = "user", .text = "Open",
                            .chat_vars = "{\"npc\": \"[New]\"}", .gen = {.tools = &td}};
    CHECK_OK(kvgen_job_submit(s, &jfail, &j1, &err));
    CHECK(j1 && job_run(j1, text, sizeof text, &tagged));
    kvgen_job_get_info(j1, &info);
    CHECKF(info.state == KVGEN_JOB_FAILED && info.error.status == KVGEN_E_UNSUPPORTED, "%s: %s",
           kvgen_job_state_name(info.state), info.error.message);
    kvgen_job_release(j1);
    CHECK(kvgen_session_length(s) == len0);
    CHECKF(strcmp(vars_of(s), "{\"npc\":\"[Old]\"}") == 0, "%s", vars_of(s));

    /* cancelled while its prompt is prefilled: the turn and the variables taken back */
    char long_text[3000];
    for (size_t i = 0; i < sizeof long_text - 1; i++) long_text[i] = "abc defg hij "[i % 13];
    long_text[sizeof long_text - 1] = 0;
    kvgen_jobs_desc slow = {.prefill_chunk = 2};
    CHECK_OK(kvgen_jobs_configure(m, &slow, &err));
    kvgen_job_desc jlong = {.prompt = KVGEN_PROMPT_CHAT, .role = "user", .text = long_text,
                            .chat_vars = "{\"enable_thinking\": false}", .gen = {.max_tokens = 4}};
    CHECK_OK(kvgen_job_submit(s, &jlong, &j1, &err));
    for (long i = 0; i < 600000; i++) {
        kvgen_job_get_info(j1, &info);
        if (info.state != KVGEN_JOB_QUEUED) break;
        pause_ms(1);
    }
    kvgen_job_cancel(j1);
    CHECK(job_run(j1, text, sizeof text, &tagged));
    kvgen_job_get_info(j1, &info);
    CHECK(info.state == KVGEN_JOB_CANCELLED);
    if (info.n_tokens == 0) {
        CHECK(kvgen_session_length(s) == len0);
        CHECKF(strcmp(vars_of(s), "{\"npc\":\"[Old]\"}") == 0, "%s", vars_of(s));
    } else {
        printf("note: the job made %d tokens before its cancel was seen; rollback not checked this run\n",
               info.n_tokens);
    }
    kvgen_job_release(j1);
    kvgen_session_close(s);
    kvgen_model_unload(m);
}

/* what the reply callback was given (a stand-in for the chat's) */
static char g_reply_content[256], g_reply_calls[256];
static int g_replies;
static kvgen_status record_reply(kvgen_session *s, const char *content, const char *reasoning, const char *calls_json,
                                 kvgen_error *err) {
    (void)s, (void)reasoning, (void)err;
    g_replies++;
    snprintf(g_reply_content, sizeof g_reply_content, "%s", content);
    snprintf(g_reply_calls, sizeof g_reply_calls, "%s", calls_json ? calls_json : "(none)");
    return KVGEN_OK;
}

/* tool_choice auto in a format read at the end (Llama 3's JSON call) and in Phi-4-mini's (its
 * <|tool_call|> list, the markers split over tokens): a scripted reply (a grammar under the
 * tools, which the public calls do not combine) streams the text before the call and nothing
 * of the call; cut inside the call, it is no call and the text before it is what the
 * conversation gets. */
static void check_stream_auto(void) {
    kvgen_model *m = NULL;
    kvgen_session *s = NULL;
    if (!open_session(&m, &s)) return;
    kvgen_error err = {0};
    kvgen_chat_template plain = {.jinja = THINK_TPL};
    CHECK_OK(kvgen_chat_set_template(s, &plain, &err));
    kvgen_constraint says = {.kind = KVGEN_CONSTRAIN_GRAMMAR,
                             .grammar = "root ::= \"Sure. {\\\"name\\\": \\\"ring_bell\\\", \\\"parameters\\\": "
                                        "{\\\"times\\\": 2}}\""};
    /* Phi-4-mini's list, its markers as text split over several tokens, two calls */
    kvgen_constraint phi = {.kind = KVGEN_CONSTRAIN_GRAMMAR,
                            .grammar = "root ::= \"Sure. <|tool_call|>[{\\\"name\\\": \\\"ring_bell\\\", "
                                       "\\\"arguments\\\": {\\\"times\\\": 2}}, {\\\"name\\\": \\\"ring_bell\\\", "
                                       "\\\"arguments\\\": {\\\"times\\\": 1}}]<|/tool_call|>\""};
    int limits[6] = {0, 9, 14, 0, 9, 30};
    for (int i = 0; i < 6; i++) {
        bool phi4 = i >= 3;
        CHECK_OK(kvgen_chat_begin(s, "user", "Ring it", &err));
        kvgen_generate_desc d = {.constraint = phi4 ? &phi : &says, .max_tokens = limits[i]};
        kvgen_gen *g = NULL;
        CHECK_OK(kvg_gen_create(s, &d, &g, "test", &err));
        kvgen_tools_desc td = {TOOLS, 2, KVGEN_TOOL_AUTO, NULL};
        kvg_tools *t = NULL;
        const char *tpl = phi4 ? PHI4 : LLAMA31;
        CHECK_OK(kvg_tools_build(&td, tpl, strlen(tpl), "test", &t, &err));
        if (!g || !t) {
            kvgen_gen_end(g);
            kvg_tools_free(t);
            continue;
        }
        kvg_gen_attach_reply(g, t, NULL, NULL, false, record_reply);
        g_replies = 0;
        streamed st;
        kvgen_finish f = run_streamed(g, m, &st);
        CHECKF(st.tagged == 0 && strcmp(st.text, "Sure.") == 0 && strcmp(kvgen_gen_text(g, NULL), "Sure.") == 0,
               "streamed '%s', text '%s'", st.text, kvgen_gen_text(g, NULL));
        if (limits[i] == 0) {
            CHECK(f == KVGEN_FINISH_TOOL_CALLS && kvgen_gen_tool_calls(g, NULL) == (phi4 ? 2 : 1));
            CHECKF(g_replies == 1 && strstr(g_reply_calls, "ring_bell"), "%s", g_reply_calls);
            if (phi4) CHECKF(st.split_tag > 1, "%d tokens held part of a marker", st.split_tag);
        } else {
            CHECK(f == KVGEN_FINISH_LENGTH && kvgen_gen_tool_calls(g, NULL) == 0);
            CHECKF(g_replies == 1 && strcmp(g_reply_content, "Sure.") == 0 && strcmp(g_reply_calls, "(none)") == 0,
                   "%d '%s' %s", g_replies, g_reply_content, g_reply_calls);
        }
        kvgen_gen_end(g);
        kvgen_chat_undo(s, 2, NULL);
    }
    kvgen_session_close(s);
    kvgen_model_unload(m);
}

/* The publishers' templates through the public calls: a forced call, its result, and the
 * next turn renders (the call in the template's own way: as fields, or as Phi-4-mini's text),
 * Mistral's ids of nine letters and digits as its template requires. */
static void check_published(void) {
    char *path = tu_make_model("toolcall.gguf", "--seed 5 --layers 1 --embd 32 --ff 64 --heads 2 --kv-heads 1");
    if (!path) return;
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 1};
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    free(path);
    static const struct { const char *name, *shown; } real[] = {
        {"qwen3_06b", "<tool_call>\n{\"name\": \"open_gate\""}, {"qwen25", "<tool_call>\n{\"name\": \"open_gate\""},
        {"hermes3", "<tool_call>\n{\"name\": \"open_gate\""}, {"llama31", "{\"name\": \"open_gate\", \"parameters\""},
        {"llama32", "{\"name\": \"open_gate\", \"parameters\""}, {"mistral_nemo", "[TOOL_CALLS][{\"name\": \"open_gate\""},
        {"phi4_mini", "<|tool_call|>[{\"name\": \"open_gate\""}};
    for (size_t i = 0; m && i < sizeof real / sizeof real[0]; i++) {
        size_t len = 0;
        char *src = fixture_template_in("chat_tools.txt", real[i].name, &len);
        kvgen_session *s = NULL;
        kvgen_session_desc sd = {.n_ctx = 4096};
        CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
        kvgen_chat_template tpl = {.jinja = src};
        if (!src || !s || kvgen_chat_set_template(s, &tpl, &err) != KVGEN_OK) {
            CHECKF(0, "%s: %s", real[i].name, err.message);
            kvgen_session_close(s);
            free(src);
            continue;
        }
        CHECK_OK(kvgen_chat_set_vars(s, "{\"date_string\": \"05 Dec 2026\"}", &err));
        /* (Hermes' template writes every tool's description: these have one) */
        kvgen_tool described[2] = {TOOLS[0], TOOLS[1]};
        described[1].description = "Rings the bell.";
        kvgen_tools_desc td = {described, 2, KVGEN_TOOL_NAMED, "open_gate"};
        kvgen_generate_desc d = {.tools = &td};
        kvgen_gen *g = NULL;
        CHECKF(kvgen_chat_gen_begin(s, "user", "Open the gate", &d, &g, &err) == KVGEN_OK, "%s: %s", real[i].name,
               err.message);
        kvgen_status st = KVGEN_OK;
        while (g && st == KVGEN_OK && kvgen_gen_finish(g) == KVGEN_FINISH_NONE) st = kvgen_gen_next(g, NULL, &err);
        const kvgen_tool_call *calls = NULL;
        int n = g ? kvgen_gen_tool_calls(g, &calls) : 0;
        CHECKF(g && kvgen_gen_finish(g) == KVGEN_FINISH_TOOL_CALLS && n == 1, "%s: %s %s", real[i].name,
               g ? kvgen_finish_name(kvgen_gen_finish(g)) : "", err.message);
        char id[64] = "";
        if (n == 1) snprintf(id, sizeof id, "%s", calls[0].id);
        kvgen_gen_end(g);
        if (strcmp(real[i].name, "mistral_nemo") == 0) {
            bool alnum = strlen(id) == 9;
            for (const char *p = id; *p; p++)
                alnum = alnum && ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9'));
            CHECKF(alnum, "mistral_nemo: id '%s'", id);
        }
        kvgen_chat_message result = {.role = "tool", .content = "{\"opened\": true}", .tool_call_id = id};
        CHECKF(kvgen_chat_add_message(s, &result, &err) == KVGEN_OK, "%s: %s", real[i].name, err.message);
        CHECKF(kvgen_chat_begin(s, NULL, NULL, &err) == KVGEN_OK, "%s: %s", real[i].name, err.message);
        char text[16384];
        size_t tn = kvgen_detokenize(m, kvgen_session_tokens(s), kvgen_session_length(s), KVGEN_TOKENIZE_SPECIAL, text,
                                     sizeof text);
        CHECKF(tn < sizeof text && strstr(text, real[i].shown) && strstr(text, "opened"), "%s: %s",
               real[i].name, text);
        kvgen_session_close(s);
        free(src);
    }
    kvgen_model_unload(m);
}

int main(void) {
    check_detect();
    check_parse();
    check_grammar();
    check_refused();
    check_session();
    check_published();
    check_stream();
    check_stream_auto();
    check_jobs();
    check_job_vars();
    CHECK(strcmp(kvgen_finish_name(KVGEN_FINISH_TOOL_CALLS), "tool_calls") == 0);
    CHECK(strcmp(kvgen_finish_name(KVGEN_FINISH_BAD_TOOL_CALL), "bad_tool_call") == 0);
    return tu_finish("test_toolcall");
}
