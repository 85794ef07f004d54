/* toolcall.c: tool calls in the model's own format (kvg_toolcall.h).
 *
 * One row per format: the template text that asks for it, where a call starts in a reply,
 * how calls are laid out, and the name of the arguments member. Detection, parsing and the
 * forcing grammar read the row; nothing else in kvgen asks which format it holds.
 *
 * A tool's arguments are checked by its schema's grammar (kvg_schema_to_gbnf) over their
 * compact JSON text; the forcing grammar joins the tools' grammars with each one's rules
 * renamed (prefix "t<i>-"), so that their rules cannot collide.
 *
 * A row also says how the template takes the tools (its `tools` variable, or a field of the
 * system message) and whether it renders an assistant's tool_calls or needs them as text.
 *
 * The think tags of reasoning models are a second, smaller table at the end. */
#include <stdio.h>
#include <string.h>
#include "kvg_error.h"
#include "kvg_grammar.h"
#include "kvg_json.h"
#include "kvg_str.h"
#include "kvg_toolcall.h"

typedef enum layout {
    LAYOUT_WRAPPED, /* each call between call_open and call_close */
    LAYOUT_ARRAY,   /* one JSON array of calls after the opener */
    LAYOUT_SINGLE   /* one JSON object (after an optional opener) */
} layout;

typedef struct tool_format {
    const char *name;
    const char *marks[2];    /* the template's text holds all of them (NULL: unused) */
    const char *openers[2];  /* where calls start in a reply: markup skipped when parsed */
    const char *starts[2];   /* ... or JSON that starts them (kept: it is the call); in the
                                wrapped layout, a call without its markup that begins the
                                reply (small models drop the tags) */
    layout layout;
    const char *call_open;   /* LAYOUT_WRAPPED: before each call */
    const char *call_close;  /* LAYOUT_WRAPPED: after each call; LAYOUT_ARRAY: after the list,
                                where the reply may leave it out (a control token) */
    const char *args_key;    /* the arguments member as the format writes it */
    const char *forced_open, *forced_close; /* around the one call a forcing grammar writes */
    /* tool_choice auto: once `openers[0]` appears in the reply's text, the rest is constrained
     * by this rule (GBNF over `call` and `ws`); NULL: the reply is only read at its end */
    const char *lazy_rest;
    /* a template that reads the tools from the system message's field of this name (JSON
     * text of a list of the functions), not from its `tools` variable; NULL: the variable */
    const char *system_field;
    /* a template that renders no tool_calls: an assistant message's calls go back in its
     * content, written between these (a JSON list of {"name", "arguments"}); NULL: as fields */
    const char *text_open, *text_close;
    bool short_ids; /* calls' ids of nine letters and digits (Mistral's templates refuse others) */
} tool_format;

static const tool_format FORMATS[] = {
    {"hermes", {"<tool_call>", NULL}, {"<tool_call>", NULL}, {"{\"name\"", NULL}, LAYOUT_WRAPPED, "<tool_call>",
     "</tool_call>", "arguments", "<tool_call>\n", "\n</tool_call>",
     "ws call ws \"</tool_call>\" (ws \"<tool_call>\" ws call ws \"</tool_call>\")*", NULL, NULL, NULL, false},
    {"mistral", {"[TOOL_CALLS]", NULL}, {"[TOOL_CALLS]", NULL}, {"[{\"name\"", NULL}, LAYOUT_ARRAY, NULL, NULL,
     "arguments", "[", "]", NULL, NULL, NULL, NULL, true},
    {"llama3", {"<|start_header_id|>", "\"parameters\""}, {"<|python_tag|>", NULL}, {"{\"name\"", NULL},
     LAYOUT_SINGLE, NULL, NULL, "parameters", "", "", NULL, NULL, NULL, NULL, false},
    /* Phi-4-mini: the tools between <|tool|> and <|/tool|> in the system message (its "tools"
     * field), the calls a list between <|tool_call|> and <|/tool_call|> (control tokens,
     * which a reply's text may leave out: its [{"name" starts the calls too) */
    {"phi4", {"<|tool|>", NULL}, {"<|tool_call|>", NULL}, {"[{\"name\"", NULL}, LAYOUT_ARRAY, NULL,
     "<|/tool_call|>", "arguments", "[", "]",
     "ws \"[\" ws call (ws \",\" ws call)* ws \"]\" (ws \"<|/tool_call|>\")?", "tools", "<|tool_call|>",
     "<|/tool_call|>", false},
};
#define N_FORMATS ((int)(sizeof FORMATS / sizeof FORMATS[0]))

static bool holds(const char *hay, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(hay + i, needle, k) == 0) return true;
    return false;
}

static const tool_format *detect(const char *tpl, size_t len) {
    for (int f = 0; f < N_FORMATS; f++) {
        bool all = true;
        for (int i = 0; i < 2 && FORMATS[f].marks[i]; i++) all = all && holds(tpl, len, FORMATS[f].marks[i]);
        if (all) return &FORMATS[f];
    }
    return NULL;
}

kvgen_status kvg_tools_check(const kvgen_tools_desc *desc, const char *who, kvgen_error *err) {
    kvg_tools *t = NULL;
    /* the first format's: what is checked (names, schemas, the choice) is the same in every one */
    kvgen_status st = kvg_tools_build(desc, FORMATS[0].marks[0], strlen(FORMATS[0].marks[0]), who, &t, err);
    kvg_tools_free(t);
    return st;
}

const char *kvg_tool_format_detect(const char *tpl, size_t len) {
    const tool_format *f = tpl ? detect(tpl, len) : NULL;
    return f ? f->name : NULL;
}

const char *kvg_tool_system_field(const char *tpl, size_t len) {
    const tool_format *f = tpl ? detect(tpl, len) : NULL;
    return f ? f->system_field : NULL;
}

/* v as JSON text with Python's json.dumps spacing (", " and ": "), as models were shown it */
static bool write_spaced(kvg_buf *b, const kvg_json *v) {
    if (v->type != KVG_JSON_ARRAY && v->type != KVG_JSON_OBJECT) return kvg_json_write(b, v) == 0;
    bool obj = v->type == KVG_JSON_OBJECT, ok = kvg_buf_add(b, obj ? "{" : "[", 1);
    for (const kvg_json *c = v->child; c && ok; c = c->next) {
        if (c != v->child) ok = kvg_buf_add(b, ", ", 2);
        if (ok && obj) ok = kvg_json_write_string(b, c->key, c->key_len) == 0 && kvg_buf_add(b, ": ", 2);
        ok = ok && write_spaced(b, c);
    }
    return ok && kvg_buf_add(b, obj ? "}" : "]", 1);
}

bool kvg_tool_calls_as_text(const char *tpl, size_t len) {
    const tool_format *f = tpl ? detect(tpl, len) : NULL;
    return f && f->text_open;
}

char *kvg_tool_calls_text(const char *tpl, size_t len, const char *calls_json) {
    const tool_format *f = tpl ? detect(tpl, len) : NULL;
    if (!f || !f->text_open || !calls_json) return NULL;
    kvg_json *calls = kvg_json_parse(calls_json, strlen(calls_json), 64, NULL, NULL, 0);
    kvg_buf b = {0};
    bool ok = calls && calls->type == KVG_JSON_ARRAY && kvg_buf_add(&b, f->text_open, strlen(f->text_open)) &&
              kvg_buf_add(&b, "[", 1);
    int i = 0;
    for (const kvg_json *c = ok ? calls->child : NULL; c && ok; c = c->next, i++) {
        const kvg_json *fn = kvg_json_get(c, "function");
        const char *name = kvg_json_get_string(fn, "name", NULL);
        const kvg_json *args = kvg_json_get(fn, "arguments");
        kvg_json *parsed = NULL;
        if (args && args->type == KVG_JSON_STRING) /* arguments as JSON text */
            args = parsed = kvg_json_parse(args->str, args->len, 64, NULL, NULL, 0);
        ok = name && args && (i == 0 || kvg_buf_add(&b, ", ", 2)) && kvg_buf_add(&b, "{\"name\": ", 9) &&
             kvg_json_write_string(&b, name, strlen(name)) == 0 && kvg_buf_add(&b, ", \"", 3) &&
             kvg_buf_add(&b, f->args_key, strlen(f->args_key)) && kvg_buf_add(&b, "\": ", 3) &&
             write_spaced(&b, args) && kvg_buf_add(&b, "}", 1);
        kvg_json_free(parsed);
    }
    ok = ok && kvg_buf_add(&b, "]", 1) && kvg_buf_add(&b, f->text_close, strlen(f->text_close));
    kvg_json_free(calls);
    if (!ok) {
        kvg_free(b.p);
        return NULL;
    }
    return b.p;
}

typedef struct tool {
    char *name;
    kvg_gram *gram; /* the arguments' grammar */
} tool;

typedef struct call {
    char *id, *name, *args;
} call;

struct kvg_tools {
    const tool_format *fmt;
    kvgen_tool_choice choice;
    tool *tools;
    int n_tools;
    char *forced; /* GBNF, or NULL */
    char *lazy;   /* GBNF of what follows the opener under tool_choice auto, or NULL */
    char *json;   /* the template's "tools" */
    call *calls;
    kvgen_tool_call *pub;
    int n_calls;
    char *calls_json;
};

static void drop_calls(kvg_tools *t) {
    for (int i = 0; i < t->n_calls; i++) {
        kvg_free(t->calls[i].id);
        kvg_free(t->calls[i].name);
        kvg_free(t->calls[i].args);
    }
    kvg_free(t->calls);
    kvg_free(t->pub);
    kvg_free(t->calls_json);
    t->calls = NULL;
    t->pub = NULL;
    t->calls_json = NULL;
    t->n_calls = 0;
}

void kvg_tools_free(kvg_tools *t) {
    if (!t) return;
    for (int i = 0; i < t->n_tools; i++) {
        kvg_free(t->tools[i].name);
        kvg_gram_free(t->tools[i].gram);
    }
    kvg_free(t->tools);
    kvg_free(t->forced);
    kvg_free(t->lazy);
    kvg_free(t->json);
    drop_calls(t);
    kvg_free(t);
}

const char *kvg_tools_format(const kvg_tools *t) { return t->fmt->name; }
const char *kvg_tools_forced_grammar(const kvg_tools *t) { return t->forced; }
const char *kvg_tools_json(const kvg_tools *t) { return t->json; }
const char *kvg_tools_lazy_grammar(const kvg_tools *t, const char **opener) {
    if (opener) *opener = t->lazy ? t->fmt->openers[0] : NULL;
    return t->lazy;
}

int kvg_tools_call_marks(const kvg_tools *t, const char *marks[4]) {
    int n = 0;
    if (t->choice != KVGEN_TOOL_AUTO) return 0;
    for (int i = 0; i < 2; i++) {
        if (t->fmt->openers[i]) marks[n++] = t->fmt->openers[i];
        if (t->fmt->starts[i]) marks[n++] = t->fmt->starts[i];
    }
    return n;
}

static bool name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_' || s[i] == '-' || s[i] == '.'))
            return false;
    return true;
}

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* GBNF text with every rule name prefixed: names outside string literals and classes */
static bool add_renamed(kvg_buf *b, const char *g, const char *prefix) {
    size_t pn = strlen(prefix);
    for (const char *p = g; *p;) {
        if (*p == '"' || *p == '[') {
            char end = *p == '"' ? '"' : ']';
            const char *q = p + 1;
            while (*q && *q != end) q += q[0] == '\\' && q[1] ? 2 : 1;
            if (*q) q++;
            if (!kvg_buf_add(b, p, (size_t)(q - p))) return false;
            p = q;
        } else if (*p == '#') {
            const char *q = p;
            while (*q && *q != '\n') q++;
            p = q;
        } else if (is_name_char(*p)) {
            const char *q = p;
            while (is_name_char(*q)) q++;
            bool count = q > p && (p[0] >= '0' && p[0] <= '9'); /* {m,n} counts are not names */
            if (!count && !kvg_buf_add(b, prefix, pn)) return false;
            if (!kvg_buf_add(b, p, (size_t)(q - p))) return false;
            p = q;
        } else {
            if (!kvg_buf_add(b, p, 1)) return false;
            p++;
        }
    }
    return true;
}

/* GBNF's string literal of s */
static bool add_literal(kvg_buf *b, const char *s) {
    if (!kvg_buf_add(b, "\"", 1)) return false;
    for (; *s; s++) {
        char e[8];
        int n;
        if (*s == '"' || *s == '\\') n = snprintf(e, sizeof e, "\\%c", *s);
        else if (*s == '\n') n = snprintf(e, sizeof e, "\\n");
        else n = snprintf(e, sizeof e, "%c", *s);
        if (!kvg_buf_add(b, e, (size_t)n)) return false;
    }
    return kvg_buf_add(b, "\"", 1);
}

static kvgen_status oom(const char *who, kvgen_error *err) {
    return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
}

kvgen_status kvg_tools_build(const kvgen_tools_desc *d, const char *tpl, size_t tpl_len, const char *who,
                             kvg_tools **out, kvgen_error *err) {
    *out = NULL;
    if (d->n_tools < 1 || d->n_tools > KVGEN_MAX_TOOLS || !d->tools)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: tools: n_tools %d (1..%d, with a tools array)", who,
                        d->n_tools, KVGEN_MAX_TOOLS);
    if (d->choice < KVGEN_TOOL_AUTO || d->choice > KVGEN_TOOL_NAMED)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: tools: choice %d (auto, none, required or named)", who,
                        (int)d->choice);
    const tool_format *fmt = tpl ? detect(tpl, tpl_len) : NULL;
    if (!fmt)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "%s: tools: the chat template writes tool calls in no format kvgen knows (Hermes "
                        "<tool_call>, Llama 3 JSON, Mistral [TOOL_CALLS], Phi-4-mini <|tool_call|>)",
                        who);
    kvg_tools *t = kvg_calloc(1, sizeof *t);
    if (!t || !(t->tools = kvg_calloc((size_t)d->n_tools, sizeof *t->tools))) {
        kvg_free(t);
        return oom(who, err);
    }
    t->fmt = fmt;
    t->choice = d->choice;
    kvgen_status st = KVGEN_OK;
    kvg_buf grammar = {0}, calls = {0};
    kvg_json *list = kvg_json_new(KVG_JSON_ARRAY);
    if (!list) st = oom(who, err);
    int named = -1;
    for (int i = 0; i < d->n_tools && st == KVGEN_OK; i++) {
        const kvgen_tool *k = &d->tools[i];
        if (!k->name || !name_ok(k->name)) {
            st = kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: tools[%d].name '%s' (1 to 64 of A-Z a-z 0-9 _ . -)",
                          who, i, k->name ? k->name : "(null)");
            break;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(t->tools[j].name, k->name) == 0)
                st = kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: tools[%d].name '%s' is given twice", who, i,
                              k->name);
        if (st != KVGEN_OK) break;
        const char *params = k->parameters ? k->parameters : "{\"type\":\"object\"}";
        char *gbnf = NULL;
        kvgen_error sub = {0};
        st = kvg_schema_to_gbnf(params, &gbnf, &sub);
        kvg_json *pj = NULL;
        if (st == KVGEN_OK) {
            pj = kvg_json_parse(params, strlen(params), 64, NULL, NULL, 0);
            if (!pj || pj->type != KVG_JSON_OBJECT)
                st = kvg_fail(&sub, KVGEN_E_INVALID_ARGUMENT, "schema: not a JSON object");
        }
        if (st == KVGEN_OK) st = kvg_gram_parse(gbnf, &t->tools[i].gram, &sub);
        if (st != KVGEN_OK) {
            kvg_fail(err, st, "%s: tools[%d].parameters ('%s'): %s", who, i, k->name, sub.message);
            kvg_free(gbnf);
            kvg_json_free(pj);
            break;
        }
        if (!(t->tools[i].name = kvg_strdup(k->name))) st = oom(who, err);
        t->n_tools = i + 1;
        /* {"type": "function", "function": {"name", "description", "parameters"}} */
        kvg_json *fn = kvg_json_new(KVG_JSON_OBJECT), *wrap = kvg_json_new(KVG_JSON_OBJECT);
        bool ok = fn && wrap && kvg_json_add(fn, "name", kvg_json_new_string(k->name, strlen(k->name)));
        if (ok && k->description)
            ok = kvg_json_add(fn, "description", kvg_json_new_string(k->description, strlen(k->description)));
        if (ok) {
            ok = kvg_json_add(fn, "parameters", pj) != NULL;
            pj = NULL;
        }
        if (ok) ok = kvg_json_add(wrap, "type", kvg_json_new_string("function", 8)) != NULL;
        if (ok) {
            ok = kvg_json_add(wrap, "function", fn) != NULL;
            fn = NULL;
        }
        if (ok) {
            ok = kvg_json_add(list, NULL, wrap) != NULL;
            wrap = NULL;
        }
        kvg_json_free(pj);
        kvg_json_free(fn);
        kvg_json_free(wrap);
        if (!ok && st == KVGEN_OK) st = oom(who, err);
        /* this tool's call in the forcing grammar */
        if (d->choice == KVGEN_TOOL_NAMED && d->name && strcmp(d->name, k->name) == 0) named = i;
        bool in_forced = d->choice == KVGEN_TOOL_REQUIRED || d->choice == KVGEN_TOOL_AUTO ||
                         (d->choice == KVGEN_TOOL_NAMED && named == i);
        if (st == KVGEN_OK && in_forced) {
            char prefix[16], head[160];
            snprintf(prefix, sizeof prefix, "t%d-", i);
            snprintf(head, sizeof head, "{\"name\":\"%s\",\"%s\":", k->name, fmt->args_key);
            ok = (calls.n == 0 || kvg_buf_add(&calls, " | ", 3)) && add_literal(&calls, head) &&
                 kvg_buf_add(&calls, " ", 1) && kvg_buf_add(&calls, prefix, strlen(prefix)) &&
                 kvg_buf_add(&calls, "root \"}\"", 8) && add_renamed(&grammar, gbnf, prefix);
            if (!ok) st = oom(who, err);
        }
        kvg_free(gbnf);
    }
    if (st == KVGEN_OK && d->choice == KVGEN_TOOL_NAMED && named < 0)
        st = kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: tools: name '%s' is none of the tools given", who,
                      d->name ? d->name : "(null)");
    if (st == KVGEN_OK && !(t->json = kvg_json_print(list, NULL))) st = oom(who, err);
    bool lazy = d->choice == KVGEN_TOOL_AUTO;
    if (st == KVGEN_OK && calls.n && (!lazy || fmt->lazy_rest)) {
        kvg_buf root = {0};
        bool ok = kvg_buf_add(&root, "root ::= ", 9);
        if (lazy)
            ok = ok && kvg_buf_add(&root, fmt->lazy_rest, strlen(fmt->lazy_rest)) &&
                 kvg_buf_add(&root, "\nws ::= [ \\n]{0,2}", 18);
        else
            ok = ok && add_literal(&root, fmt->forced_open) && kvg_buf_add(&root, " call ", 6) &&
                 add_literal(&root, fmt->forced_close);
        ok = ok && kvg_buf_add(&root, "\ncall ::= ", 10) && kvg_buf_add(&root, calls.p, calls.n) &&
             kvg_buf_add(&root, "\n", 1) && kvg_buf_add(&root, grammar.p, grammar.n);
        if (ok && lazy) t->lazy = root.p;
        else if (ok) t->forced = root.p;
        else {
            kvg_free(root.p);
            st = oom(who, err);
        }
    }
    kvg_json_free(list);
    kvg_free(grammar.p);
    kvg_free(calls.p);
    if (st != KVGEN_OK) {
        kvg_tools_free(t);
        return st;
    }
    *out = t;
    return KVGEN_OK;
}

static const char *find(const char *hay, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(hay + i, needle, k) == 0) return hay + i;
    return NULL;
}

static const char *skip_space(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

static bool skip_text(const char **p, const char *end, const char *s) {
    size_t k = s ? strlen(s) : 0;
    if (k == 0 || (size_t)(end - *p) < k || memcmp(*p, s, k) != 0) return false;
    *p += k;
    return true;
}

/* whether the arguments' compact text is accepted by the tool's grammar */
static bool args_valid(const tool *k, const char *args, size_t n) {
    kvg_gram_match *mt = NULL;
    kvgen_error e = {0};
    if (kvg_gram_match_new(k->gram, &mt, &e) != KVGEN_OK) return false;
    bool ok = kvg_gram_feed(mt, (const unsigned char *)args, n) && kvg_gram_can_end(mt);
    kvg_gram_match_free(mt);
    return ok;
}

/* One call object: a known name and arguments its schema accepts. 1 kept, 0 bad, -1 OOM. */
static int take_call(kvg_tools *t, const kvg_json *o, size_t id_base) {
    if (!o || o->type != KVG_JSON_OBJECT) return 0;
    const char *name = kvg_json_get_string(o, "name", NULL);
    const kvg_json *args = kvg_json_get(o, t->fmt->args_key);
    if (!args) args = kvg_json_get(o, "arguments");
    if (!args) args = kvg_json_get(o, "parameters");
    if (!name || !args) return 0;
    int k = -1;
    for (int i = 0; i < t->n_tools; i++)
        if (strcmp(t->tools[i].name, name) == 0) k = i;
    if (k < 0) return 0;
    kvg_json *parsed = NULL;
    if (args->type == KVG_JSON_STRING) /* arguments as JSON text, as OpenAI writes them */
        args = parsed = kvg_json_parse(args->str, args->len, 64, NULL, NULL, 0);
    if (!args || args->type != KVG_JSON_OBJECT) {
        kvg_json_free(parsed);
        return 0;
    }
    size_t n = 0;
    char *text = kvg_json_print(args, &n);
    kvg_json_free(parsed);
    if (!text) return -1;
    if (!args_valid(&t->tools[k], text, n)) {
        kvg_free(text);
        return 0;
    }
    call *grown = kvg_realloc(t->calls, (size_t)(t->n_calls + 1) * sizeof *grown);
    if (!grown) {
        kvg_free(text);
        return -1;
    }
    t->calls = grown;
    char id[48];
    if (t->fmt->short_ids) { /* id_base * 1000 + i in base 36, nine digits */
        unsigned long long v = (unsigned long long)id_base * 1000u + (unsigned)t->n_calls;
        for (int i = 8; i >= 0; i--, v /= 36) id[i] = "0123456789abcdefghijklmnopqrstuvwxyz"[v % 36];
        id[9] = '\0';
    } else {
        snprintf(id, sizeof id, "call_%zu_%d", id_base, t->n_calls);
    }
    call *c = &t->calls[t->n_calls++];
    *c = (call){kvg_strdup(id), kvg_strdup(name), text};
    return c->id && c->name ? 1 : -1;
}

/* Parses a JSON value at *p; NULL when there is none. */
static kvg_json *read_value(const char **p, const char *end) {
    size_t used = 0;
    kvg_json *v = kvg_json_parse_ex(*p, (size_t)(end - *p), 64, 0, &used, NULL, NULL, 0);
    if (v) *p += used;
    return v;
}

/* whether the JSON object at p has a "name" member naming one of the tools */
static bool names_tool(const kvg_tools *t, const char *p, const char *end) {
    kvg_json *v = read_value(&p, end);
    const char *name = v && v->type == KVG_JSON_OBJECT ? kvg_json_get_string(v, "name", NULL) : NULL;
    bool known = false;
    for (int i = 0; name && i < t->n_tools; i++) known = known || strcmp(t->tools[i].name, name) == 0;
    kvg_json_free(v);
    return known;
}

static kvgen_status publish(kvg_tools *t, kvgen_error *err) {
    if (!(t->pub = kvg_calloc((size_t)t->n_calls, sizeof *t->pub))) return oom("kvgen_gen_next", err);
    kvg_buf b = {0};
    bool ok = kvg_buf_add(&b, "[", 1);
    for (int i = 0; i < t->n_calls && ok; i++) {
        t->pub[i] = (kvgen_tool_call){t->calls[i].id, t->calls[i].name, t->calls[i].args};
        ok = (i == 0 || kvg_buf_add(&b, ",", 1)) && kvg_buf_add(&b, "{\"id\":", 6) &&
             kvg_json_write_string(&b, t->calls[i].id, strlen(t->calls[i].id)) == 0 &&
             kvg_buf_add(&b, ",\"type\":\"function\",\"function\":{\"name\":", 38) &&
             kvg_json_write_string(&b, t->calls[i].name, strlen(t->calls[i].name)) == 0 &&
             kvg_buf_add(&b, ",\"arguments\":", 13) &&
             kvg_buf_add(&b, t->calls[i].args, strlen(t->calls[i].args)) && kvg_buf_add(&b, "}}", 2);
    }
    if (!ok || !kvg_buf_add(&b, "]", 1)) {
        kvg_free(b.p);
        return oom("kvgen_gen_next", err);
    }
    t->calls_json = b.p;
    return KVGEN_OK;
}

kvgen_status kvg_tools_parse(kvg_tools *t, const char *text, size_t len, size_t id_base, kvgen_finish *finish,
                             size_t *content_len, kvgen_error *err) {
    drop_calls(t);
    const tool_format *f = t->fmt;
    const char *end = text + len, *at = NULL;
    bool opener = false;
    for (int i = 0; i < 2; i++) {
        const char *o = f->openers[i] ? find(text, len, f->openers[i]) : NULL;
        if (o && (!at || o < at)) at = o, opener = true;
        const char *s = f->starts[i] ? find(text, len, f->starts[i]) : NULL;
        if (s && (!at || s < at)) at = s, opener = false;
    }
    /* the wrapped layout's bare calls count only where they begin the reply, and only when the
     * first names a tool: anywhere else, JSON with a "name" is the reply's own */
    bool bare = at && !opener && f->layout == LAYOUT_WRAPPED;
    if (bare && (skip_space(text, end) != at || !names_tool(t, at, end))) at = NULL;
    *finish = KVGEN_FINISH_NONE;
    *content_len = at ? (size_t)(at - text) : len;
    if (!at) return KVGEN_OK;
    /* trailing spaces before the calls are not the reply's */
    while (*content_len > 0 && strchr(" \n\r\t", text[*content_len - 1])) (*content_len)--;
    *finish = KVGEN_FINISH_BAD_TOOL_CALL;
    if (t->choice == KVGEN_TOOL_NONE) return KVGEN_OK;
    const char *p = at;
    int r = 1;
    if (bare) {
        while (r == 1 && p < end && *p == '{') {
            kvg_json *v = read_value(&p, end);
            r = take_call(t, v, id_base);
            kvg_json_free(v);
            p = skip_space(p, end);
        }
    } else if (f->layout == LAYOUT_WRAPPED) {
        while (r == 1 && skip_text(&p, end, f->call_open)) {
            p = skip_space(p, end);
            kvg_json *v = read_value(&p, end);
            r = take_call(t, v, id_base);
            kvg_json_free(v);
            p = skip_space(p, end);
            if (r == 1 && !skip_text(&p, end, f->call_close)) r = 0;
            p = skip_space(p, end);
        }
    } else {
        if (opener) {
            for (int i = 0; i < 2; i++)
                if (skip_text(&p, end, f->openers[i])) break;
            p = skip_space(p, end);
        }
        kvg_json *v = read_value(&p, end);
        if (f->layout == LAYOUT_ARRAY) {
            r = v && v->type == KVG_JSON_ARRAY && v->n > 0;
            for (const kvg_json *c = r == 1 ? v->child : NULL; c && r == 1; c = c->next) r = take_call(t, c, id_base);
        } else {
            r = take_call(t, v, id_base);
        }
        kvg_json_free(v);
        p = skip_space(p, end);
        if (r == 1 && f->layout == LAYOUT_ARRAY && skip_text(&p, end, f->call_close)) p = skip_space(p, end);
    }
    if (r < 0) {
        drop_calls(t);
        return oom("kvgen_gen_next", err);
    }
    if (r == 0 || p != end || t->n_calls == 0) {
        drop_calls(t);
        return KVGEN_OK;
    }
    kvgen_status st = publish(t, err);
    if (st != KVGEN_OK) {
        drop_calls(t);
        return st;
    }
    *finish = KVGEN_FINISH_TOOL_CALLS;
    return KVGEN_OK;
}

int kvg_tools_calls(const kvg_tools *t, const kvgen_tool_call **calls) {
    if (calls) *calls = t ? t->pub : NULL;
    return t ? t->n_calls : 0;
}

const char *kvg_tools_calls_json(const kvg_tools *t) { return t->calls_json; }

/* ---- reasoning: one row per pair of think tags ------------------------------------------- */

static const struct {
    const char *open, *close;
} THINK_TAGS[] = {
    {"<think>", "</think>"},
};

bool kvg_think_detect(const char *tpl, size_t len, const char **open, const char **close) {
    *open = *close = NULL;
    for (size_t i = 0; tpl && i < sizeof THINK_TAGS / sizeof THINK_TAGS[0]; i++)
        if (holds(tpl, len, THINK_TAGS[i].close)) {
            *open = THINK_TAGS[i].open;
            *close = THINK_TAGS[i].close;
            return true;
        }
    return false;
}
