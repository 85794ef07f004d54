/* chat_tools.c: a chat reply that may call tools (kvgen_chat_gen_begin with desc->tools).
 *
 * The tools go to the template as its "tools" variable, the template's text picks the call
 * format (toolcall.c), tool_choice required or a name constrains the reply to one call from
 * its first token, and a reply that called tools is put back into the conversation as the
 * assistant message with its tool_calls, so that the next rendering shows it as the template
 * writes calls. Under a template with think tags every chat reply (tools or not) has its
 * reasoning read apart and kept as the message's reasoning_content. */
#include <string.h>
#include "kvg_error.h"
#include "kvg_generate.h"
#include "kvg_json.h"
#include "kvg_session.h"
#include "kvg_str.h"
#include "kvg_toolcall.h"

/* the chat's variables with "tools" replaced (tools NULL: taken out), a new compact JSON object */
static char *vars_with_tools(const char *vars, const char *tools) {
    kvg_json *v = vars ? kvg_json_parse(vars, strlen(vars), 64, NULL, NULL, 0) : kvg_json_new(KVG_JSON_OBJECT);
    kvg_json *t = tools ? kvg_json_parse(tools, strlen(tools), 64, NULL, NULL, 0) : NULL;
    char *out = NULL;
    if (v && (t || !tools) && v->type == KVG_JSON_OBJECT) {
        kvg_json *m = v->child;
        kvg_json *kept = kvg_json_new(KVG_JSON_OBJECT);
        for (; kept && m; m = m->next) { /* every member but tools, in order */
            if (m->key_len == 5 && memcmp(m->key, "tools", 5) == 0) continue;
            char *text = kvg_json_print(m, NULL);
            kvg_json *copy = text ? kvg_json_parse(text, strlen(text), 64, NULL, NULL, 0) : NULL;
            kvg_free(text);
            if (!copy || !kvg_json_add(kept, m->key, copy)) {
                kvg_json_free(kept);
                kept = NULL;
            }
        }
        if (kept && (!t || kvg_json_add(kept, "tools", t))) {
            t = NULL;
            out = kvg_json_print(kept, NULL);
        }
        kvg_json_free(kept);
    }
    kvg_json_free(v);
    kvg_json_free(t);
    return out;
}

/* A reply that called tools or thought, put in the conversation as the assistant message with
 * its tool_calls and reasoning_content in place of the reply as generated (the cache
 * re-rendered from where it differs). */
static kvgen_status reply_message(kvgen_session *s, const char *content, const char *reasoning, const char *calls_json,
                                  kvgen_error *err) {
    kvgen_status st = kvgen_chat_undo(s, 1, err); /* the reply as generated */
    /* the text before the calls, "" when there is none (not none: Qwen3's published templates
     * test `in` on an assistant's content) */
    kvgen_chat_message m = {.role = "assistant", .content = content, .tool_calls = calls_json,
                            .reasoning_content = reasoning};
    if (st == KVGEN_OK) st = kvgen_chat_add_message(s, &m, err);
    return st;
}

/* whether the session's text ends with the think tag `open` (and spaces): the generation
 * prompt opened the reasoning (DeepSeek-R1's template, Qwen3's with thinking forced) */
static bool prompt_opened(kvgen_session *s, const char *open) {
    size_t len = kvgen_session_length(s), k = len < 8 ? len : 8;
    char tail[256];
    if (!open || k == 0) return false;
    size_t n = kvgen_detokenize(kvg_session_model(s), kvgen_session_tokens(s) + len - k, k, KVGEN_TOKENIZE_SPECIAL,
                                tail, sizeof tail);
    if (n >= sizeof tail) return false;
    while (n > 0 && (tail[n - 1] == ' ' || tail[n - 1] == '\n')) n--;
    size_t on = strlen(open);
    return n >= on && memcmp(tail + n - on, open, on) == 0;
}

/* The template's think tags, when it writes them (open, close NULL otherwise). */
static void think_tags(kvgen_session *s, const char **open, const char **close) {
    const char *tpl = NULL;
    size_t len = 0;
    *open = *close = NULL;
    if (kvg_chat_jinja_source(s, "kvgen_chat_gen_begin", &tpl, &len, NULL) == KVGEN_OK)
        kvg_think_detect(tpl, len, open, close);
}

/* A reply's generator, built before its turn goes in: desc without its tools, a forced call's
 * grammar as its constraint. */
static kvgen_status reply_gen_create(kvgen_session *s, const kvgen_generate_desc *desc, const kvg_tools *t,
                                     const char *who, kvgen_gen **out, kvgen_error *err) {
    kvgen_generate_desc d = {0};
    if (desc) d = *desc;
    d.tools = NULL;
    kvgen_constraint forced = {.kind = KVGEN_CONSTRAIN_GRAMMAR, .grammar = t ? kvg_tools_forced_grammar(t) : NULL};
    if (forced.grammar) d.constraint = &forced;
    return kvg_gen_create(s, &d, out, who, err);
}

/* Once the turn is in: the reply is read at its end (its reasoning under a template with think
 * tags, its calls with tools t, taken). */
static void reply_attach(kvgen_session *s, kvgen_gen *g, kvg_tools *t) {
    const char *open = NULL, *close = NULL;
    think_tags(s, &open, &close);
    if (t || close) kvg_gen_attach_reply(g, t, open, close, open && prompt_opened(s, open), reply_message);
}

kvgen_status kvg_chat_offer_tools(kvgen_session *s, const kvgen_tools_desc *td, const char *who,
                                  struct kvg_tools **out, kvgen_error *err) {
    *out = NULL;
    const char *tpl = NULL;
    size_t tpl_len = 0;
    kvgen_status st = kvg_chat_jinja_source(s, who, &tpl, &tpl_len, err);
    if (st != KVGEN_OK) return st;
    kvg_tools *tools = NULL;
    st = kvg_tools_build(td, tpl, tpl_len, who, &tools, err);
    if (st != KVGEN_OK) return st;
    const char *old = kvgen_chat_vars(s);
    /* tool_choice none: the template is not shown the tools, so the model answers in words */
    char *vars = vars_with_tools(old, td->choice == KVGEN_TOOL_NONE ? NULL : kvg_tools_json(tools));
    st = vars ? kvgen_chat_set_vars(s, vars, err) : kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    kvg_free(vars);
    if (st != KVGEN_OK) {
        kvg_tools_free(tools);
        return st;
    }
    *out = tools;
    return KVGEN_OK;
}

kvgen_status kvg_chat_reply_gen(kvgen_session *s, const kvgen_generate_desc *desc, struct kvg_tools *t,
                                const char *who, kvgen_gen **out, kvgen_error *err) {
    *out = NULL;
    kvgen_status st = reply_gen_create(s, desc, t, who, out, err);
    if (st != KVGEN_OK) {
        kvg_tools_free(t);
        return st;
    }
    reply_attach(s, *out, t);
    return KVGEN_OK;
}

kvgen_status kvgen_chat_gen_begin(kvgen_session *s, const char *role, const char *text,
                                  const kvgen_generate_desc *desc, kvgen_gen **out, kvgen_error *err) {
    const char *fn = "kvgen_chat_gen_begin";
    if (!desc || !desc->tools || !s || !out) {
        kvgen_status st = kvg_chat_gen_begin(s, role, text, desc, out, err);
        if (st == KVGEN_OK) reply_attach(s, *out, NULL); /* a template with think tags: reasoning apart */
        return st;
    }
    *out = NULL;
    kvgen_status busy = kvg_session_check_host(s, fn, err);
    if (busy != KVGEN_OK) return busy;
    if (desc->constraint || desc->soft_max_tokens > 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: tools with a constraint or soft_max_tokens (a reply "
                        "that may call tools is constrained by the tools' grammar)", fn);
    char *old = NULL;
    if (kvgen_chat_vars(s) && !(old = kvg_strdup(kvgen_chat_vars(s))))
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
    kvg_tools *tools = NULL;
    kvgen_gen *g = NULL;
    kvgen_status st = kvg_chat_offer_tools(s, desc->tools, fn, &tools, err);
    if (st == KVGEN_OK) st = reply_gen_create(s, desc, tools, fn, &g, err);
    if (st == KVGEN_OK) st = kvgen_chat_begin(s, role, text, err); /* all or nothing */
    if (st != KVGEN_OK) {
        if (tools) kvgen_chat_set_vars(s, old, NULL); /* as they were */
        kvg_free(old);
        kvgen_gen_end(g);
        kvg_tools_free(tools);
        return st;
    }
    kvg_free(old);
    reply_attach(s, g, tools);
    *out = g;
    return KVGEN_OK;
}

const char *kvgen_chat_tool_format(kvgen_session *s) {
    const char *tpl = NULL;
    size_t len = 0;
    if (!s || kvg_chat_jinja_source(s, "kvgen_chat_tool_format", &tpl, &len, NULL) != KVGEN_OK) return NULL;
    return kvg_tool_format_detect(tpl, len);
}
