/* chat.c: chat templates and incremental turns.
 *
 * A Jinja template (the model's tokenizer.chat_template, or the caller's) is rendered by
 * template/ (kvg_jinja.h) for the whole conversation, which this state keeps (role, content, where
 * its tokens start); the rendering is tokenized and only the tokens past the part the cache
 * already holds are prefilled, so a turn whose rendered prefix is unchanged costs only its
 * own tokens, and one that changes the prefix rewinds to where they differ. Files without a
 * template, and templates the interpreter rejects, use a built-in family (prefix/suffix
 * strings per role, appended turn by turn); so do the caller's prefix/suffix strings.
 *
 * A Jinja rendering is tokenized as one text whose control tokens are matched only in template
 * text: "<|im_end|>" typed by a player stays plain text, never a control token, and the rest
 * tokenizes as the whole string does (the ids Hugging Face's apply_chat_template gives). The
 * built-in families tokenize their strings with KVGEN_TOKENIZE_SPECIAL and content without it,
 * each piece on its own.
 *
 * The conversation reads back as the messages still in the cache (and the reply generated since
 * the last turn), and an undo takes whole messages back by rewinding to where the first of them
 * starts, which is where the message before it ends.
 *
 * (About 1,300 lines: the rendering, the turns, the tool messages and the read-back all work on
 * one private conversation state whose invariants, a message's token span against the cache,
 * hold only while every edit of it stays in this file; chat_tools.c, which needs none of them,
 * builds a reply's tools on top.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_generate.h"
#include "kvg_jinja.h"
#include "kvg_json.h"
#include "kvg_model.h"
#include "kvg_session.h"
#include "kvg_sampler.h"
#include "kvg_str.h"
#include "kvg_toolcall.h"

enum { S_SYS_PRE, S_SYS_SUF, S_USER_PRE, S_USER_SUF, S_ASST_PRE, S_ASST_SUF, N_STR };
enum { ROLE_NONE, ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL };
enum { MODE_MODEL, MODE_BUILTIN, MODE_CUSTOM, MODE_JINJA };

typedef struct family {
    const char *name;
    const char *str[N_STR];
    int system_in_user;
} family;

/* Each family as its reference Jinja template renders it (content inserted verbatim). */
static const family FAMILIES[] = {
    {"chatml",
     {"<|im_start|>system\n", "<|im_end|>\n", "<|im_start|>user\n", "<|im_end|>\n", "<|im_start|>assistant\n",
      "<|im_end|>\n"},
     0},
    {"llama3",
     {"<|start_header_id|>system<|end_header_id|>\n\n", "<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\n",
      "<|eot_id|>", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"},
     0},
    /* the system prompt goes inside the first [INST] block */
    {"llama2", {"<s>[INST] <<SYS>>\n", "\n<</SYS>>\n\n", "<s>[INST] ", " [/INST]", "", "</s>"}, 1},
    {"zephyr", {"<|system|>\n", "</s>\n", "<|user|>\n", "</s>\n", "<|assistant|>\n", "</s>\n"}, 0},
    /* Gemma has no system role: the system text opens the first user turn */
    {"gemma",
     {"<start_of_turn>user\n", "\n\n", "<start_of_turn>user\n", "<end_of_turn>\n", "<start_of_turn>model\n",
      "<end_of_turn>\n"},
     1},
    {"phi3", {"<|system|>\n", "<|end|>\n", "<|user|>\n", "<|end|>\n", "<|assistant|>\n", "<|end|>\n"}, 0},
};
#define N_FAMILIES ((int)(sizeof FAMILIES / sizeof FAMILIES[0]))

typedef struct chat_msg {
    int role; /* ROLE_* */
    char *content;
    char *fields; /* NULL, or the message's further fields as a compact JSON object (tool_calls,
                   * tool_call_id, reasoning_content; "content": null for tool calls alone) */
    size_t end; /* the cache length once the turn was in: a rewind below it takes the turn back,
                 * a context shift moves it down with the tokens (kvg_chat_shifted) */
} chat_msg;

struct kvg_chat {
    int mode;   /* MODE_* */
    int family; /* MODE_BUILTIN */
    char *str[N_STR]; /* MODE_CUSTOM */
    int system_in_user;
    int open_reply; /* an assistant header was appended and its turn not closed yet */
    int last_role;  /* ROLE_* of the last complete turn */
    char *jinja;    /* MODE_JINJA: the caller's template */
    char *vars;     /* NULL, or the template's extra variables as a compact JSON object */
    chat_msg *msgs; /* the conversation so far (kept under every template: a Jinja template
                     * set later renders it) */
    size_t n_msgs;
    size_t reply_at; /* open_reply: where the reply's tokens start */
    int warned;      /* the model's template was rejected and the reason printed */
};

static const char *const ROLE_NAMES[] = {"", "system", "user", "assistant", "tool"};

static int find_family(const char *name) {
    for (int i = 0; i < N_FAMILIES; i++)
        if (strcmp(FAMILIES[i].name, name) == 0) return i;
    return -1;
}

static bool has(const char *hay, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(hay + i, needle, k) == 0) return true;
    return false;
}

/* Recognises a Jinja chat template by the control strings only its family uses. */
static int detect_family(const char *t, size_t n) {
    if (has(t, n, "<|im_start|>")) return find_family("chatml");
    if (has(t, n, "<|start_header_id|>")) return find_family("llama3");
    if (has(t, n, "<start_of_turn>")) return find_family("gemma");
    if (has(t, n, "<|end|>") && has(t, n, "<|assistant|>")) return find_family("phi3");
    if (has(t, n, "<|user|>") && has(t, n, "<|assistant|>")) return find_family("zephyr");
    if (has(t, n, "[INST]") && has(t, n, "<<SYS>>")) return find_family("llama2");
    return -1;
}

/* A file without a template: the family whose turn markers are single tokens of the vocabulary
 * (as they are in every model trained on that format). */
static int family_from_vocab(const kvg_tokenizer *tok) {
    if (kvg_token_find(tok, "<|im_start|>") >= 0 && kvg_token_find(tok, "<|im_end|>") >= 0)
        return find_family("chatml");
    if (kvg_token_find(tok, "<|start_header_id|>") >= 0 && kvg_token_find(tok, "<|eot_id|>") >= 0)
        return find_family("llama3");
    if (kvg_token_find(tok, "<start_of_turn>") >= 0 && kvg_token_find(tok, "<end_of_turn>") >= 0)
        return find_family("gemma");
    if (kvg_token_find(tok, "<|assistant|>") >= 0 && kvg_token_find(tok, "<|end|>") >= 0) return find_family("phi3");
    return -1;
}

static void free_msgs(chat_msg *m, size_t n) {
    for (size_t i = 0; i < n; i++) {
        kvg_free(m[i].content);
        kvg_free(m[i].fields);
    }
    kvg_free(m);
}

static void kvg_chat_free(kvg_chat *c) {
    if (!c) return;
    for (int i = 0; i < N_STR; i++) kvg_free(c->str[i]);
    kvg_free(c->jinja);
    kvg_free(c->vars);
    free_msgs(c->msgs, c->n_msgs);
    kvg_free(c);
}

static kvgen_status kvg_chat_clone(kvg_chat **dst, const kvg_chat *src, kvgen_error *err) {
    *dst = NULL;
    kvg_chat *c = kvg_calloc(1, sizeof *c);
    if (!c) return kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory");
    *c = *src;
    c->jinja = NULL;
    c->vars = NULL;
    c->msgs = NULL;
    c->n_msgs = 0;
    for (int i = 0; i < N_STR; i++) {
        c->str[i] = NULL;
        if (src->str[i] && !(c->str[i] = kvg_memdup0(src->str[i], strlen(src->str[i])))) goto oom;
    }
    if (src->jinja && !(c->jinja = kvg_memdup0(src->jinja, strlen(src->jinja)))) goto oom;
    if (src->vars && !(c->vars = kvg_memdup0(src->vars, strlen(src->vars)))) goto oom;
    if (src->n_msgs) {
        if (!(c->msgs = kvg_calloc(src->n_msgs, sizeof *c->msgs))) goto oom;
        for (; c->n_msgs < src->n_msgs; c->n_msgs++) {
            const chat_msg *m = &src->msgs[c->n_msgs];
            c->msgs[c->n_msgs] = *m;
            c->msgs[c->n_msgs].fields = NULL;
            if (!(c->msgs[c->n_msgs].content = kvg_memdup0(m->content, strlen(m->content)))) goto oom;
            if (m->fields && !(c->msgs[c->n_msgs].fields = kvg_memdup0(m->fields, strlen(m->fields)))) goto oom;
        }
    }
    *dst = c;
    return KVGEN_OK;
oom:
    kvg_chat_free(c);
    return kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory");
}

/* state: u8 mode, family, open_reply, last_role, system_in_user; then N_STR x (u32 len, bytes);
 * then (absent in states written before templates ran) u32 len + the Jinja template, u64
 * reply_at, u32 message count and per message u8 role, u64 end, u32 len, bytes; then (only
 * when the chat has template variables or a message has further fields, so that other states
 * keep their bytes) u32 len + the variables' JSON and per message u32 len + its fields' JSON
 * (0: none) */
static bool has_json(const kvg_chat *c) {
    bool any = c->vars != NULL;
    for (size_t i = 0; i < c->n_msgs; i++) any |= c->msgs[i].fields != NULL;
    return any;
}
static size_t kvg_chat_state_size(const kvg_chat *c) {
    size_t n = 5;
    for (int i = 0; i < N_STR; i++) n += 4 + (c->str[i] ? strlen(c->str[i]) : 0);
    n += 4 + (c->jinja ? strlen(c->jinja) : 0) + 8 + 4;
    for (size_t i = 0; i < c->n_msgs; i++) n += 1 + 8 + 4 + strlen(c->msgs[i].content);
    if (has_json(c)) {
        n += 4 + (c->vars ? strlen(c->vars) : 0);
        for (size_t i = 0; i < c->n_msgs; i++) n += 4 + (c->msgs[i].fields ? strlen(c->msgs[i].fields) : 0);
    }
    return n;
}

static unsigned char *put_u(unsigned char *b, uint64_t v, int bytes) {
    for (int k = 0; k < bytes; k++) *b++ = (unsigned char)(v >> (8 * k));
    return b;
}
static uint64_t get_u(const unsigned char *b, int bytes) {
    uint64_t v = 0;
    for (int k = 0; k < bytes; k++) v |= (uint64_t)b[k] << (8 * k);
    return v;
}
static unsigned char *put_str(unsigned char *b, const char *s) {
    uint32_t n = s ? (uint32_t)strlen(s) : 0;
    b = put_u(b, n, 4);
    if (n) memcpy(b, s, n);
    return b + n;
}

static void kvg_chat_state_save(const kvg_chat *c, unsigned char *b) {
    *b++ = (unsigned char)c->mode;
    *b++ = (unsigned char)c->family;
    *b++ = (unsigned char)c->open_reply;
    *b++ = (unsigned char)c->last_role;
    *b++ = (unsigned char)c->system_in_user;
    for (int i = 0; i < N_STR; i++) b = put_str(b, c->str[i]);
    b = put_str(b, c->jinja);
    b = put_u(b, c->reply_at, 8);
    b = put_u(b, c->n_msgs, 4);
    for (size_t i = 0; i < c->n_msgs; i++) {
        *b++ = (unsigned char)c->msgs[i].role;
        b = put_u(b, c->msgs[i].end, 8);
        b = put_str(b, c->msgs[i].content);
    }
    if (has_json(c)) {
        b = put_str(b, c->vars);
        for (size_t i = 0; i < c->n_msgs; i++) b = put_str(b, c->msgs[i].fields);
    }
}

/* a saved JSON object: NULL when empty; bad when it does not read as one */
static char *json_or_null(char *s, bool *bad) {
    if (s && !s[0]) {
        kvg_free(s);
        return NULL;
    }
    if (s) {
        kvg_json *j = kvg_json_parse(s, strlen(s), 64, NULL, NULL, 0);
        if (!j || j->type != KVG_JSON_OBJECT) *bad = true;
        kvg_json_free(j);
    }
    return s;
}

/* a length-prefixed string at b[*off..size); NULL with *bad set when it does not fit */
static char *load_str(const unsigned char *b, size_t size, size_t *off, bool keep, bool *bad, bool *oom) {
    if (size - *off < 4) {
        *bad = true;
        return NULL;
    }
    uint32_t n = (uint32_t)get_u(b + *off, 4);
    *off += 4;
    if (n > size - *off) {
        *bad = true;
        return NULL;
    }
    char *s = keep ? kvg_memdup0((const char *)b + *off, n) : NULL;
    if (keep && !s) *oom = true;
    *off += n;
    return s;
}

static kvgen_status kvg_chat_state_load(kvg_chat **out, const unsigned char *b, size_t size, kvgen_error *err) {
    *out = NULL;
    if (size < 5 || b[0] > MODE_JINJA || b[1] >= N_FAMILIES || b[2] > 1 || b[3] > ROLE_TOOL || b[4] > 1)
        return kvg_fail(err, KVGEN_E_FORMAT, "sampler state: malformed chat state");
    kvg_chat *c = kvg_calloc(1, sizeof *c);
    if (!c) return kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory");
    c->mode = b[0];
    c->family = b[1];
    c->open_reply = b[2];
    c->last_role = b[3];
    c->system_in_user = b[4];
    size_t off = 5;
    bool bad = false, oom = false;
    for (int i = 0; i < N_STR && !bad && !oom; i++) c->str[i] = load_str(b, size, &off, c->mode == MODE_CUSTOM, &bad, &oom);
    if (!bad && !oom && off < size) { /* the template's conversation */
        c->jinja = load_str(b, size, &off, true, &bad, &oom);
        if (c->jinja && !c->jinja[0] && c->mode != MODE_JINJA) {
            kvg_free(c->jinja);
            c->jinja = NULL;
        }
        if (!bad && !oom && size - off < 12) bad = true;
        if (!bad && !oom) {
            c->reply_at = (size_t)get_u(b + off, 8);
            uint64_t n = get_u(b + off + 8, 4);
            off += 12;
            if (n > (size - off) / 13) bad = true;
            else if (n && !(c->msgs = kvg_calloc((size_t)n, sizeof *c->msgs))) oom = true;
            for (; !bad && !oom && c->n_msgs < n; c->n_msgs++) {
                chat_msg *m = &c->msgs[c->n_msgs];
                if (size - off < 9 || b[off] < ROLE_SYSTEM || b[off] > ROLE_TOOL) {
                    bad = true;
                    break;
                }
                m->role = b[off];
                m->end = (size_t)get_u(b + off + 1, 8);
                off += 9;
                m->content = load_str(b, size, &off, true, &bad, &oom);
                if (!m->content) break;
            }
            if (!bad && !oom && off < size) { /* template variables and messages' fields */
                c->vars = json_or_null(load_str(b, size, &off, true, &bad, &oom), &bad);
                for (size_t i = 0; i < c->n_msgs && !bad && !oom; i++)
                    c->msgs[i].fields = json_or_null(load_str(b, size, &off, true, &bad, &oom), &bad);
            }
        }
    }
    if (c->mode == MODE_JINJA && !c->jinja) bad = true;
    if (oom) {
        kvg_chat_free(c);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory");
    }
    if (bad || off != size) {
        kvg_chat_free(c);
        return kvg_fail(err, KVGEN_E_FORMAT, "sampler state: malformed chat state");
    }
    *out = c;
    return KVGEN_OK;
}

/* The session shifted its context: tokens [keep, keep + drop) are gone and the rest moved down
 * by drop. A turn wholly before keep stays where it was, one wholly after the dropped tokens
 * moves down with them, and one that lost tokens leaves the conversation (the next turn renders
 * what the cache still holds). An open reply that lost its start keeps the rest, from keep. */
static void kvg_chat_shifted(kvg_chat *c, size_t keep, size_t drop) {
    size_t cut = keep + drop, begin = 0, n = 0;
    for (size_t i = 0; i < c->n_msgs; i++) {
        chat_msg m = c->msgs[i];
        size_t start = begin;
        begin = m.end;
        if (m.end <= keep) {
            c->msgs[n++] = m;
        } else if (start >= cut) {
            m.end -= drop;
            c->msgs[n++] = m;
        } else {
            kvg_free(m.content);
            kvg_free(m.fields);
        }
    }
    c->n_msgs = n;
    if (c->reply_at >= cut) c->reply_at -= drop;
    else if (c->reply_at > keep) c->reply_at = keep;
}

/* The conversation hangs on its session as the chat layer's state (kvg_session_ext). */
static void ext_free(void *c) { kvg_chat_free(c); }
static kvgen_status ext_clone(void **dst, const void *src, kvgen_error *err) {
    kvg_chat *c = NULL;
    kvgen_status st = kvg_chat_clone(&c, src, err);
    *dst = c;
    return st;
}
static void ext_shifted(void *c, size_t keep, size_t drop) { kvg_chat_shifted(c, keep, drop); }
static const kvg_session_ext_ops chat_ext = {"chat", ext_free, ext_clone, ext_shifted};

static kvgen_status get_chat(kvgen_session *s, kvg_chat **out, kvgen_error *err) {
    kvg_chat *c = kvg_session_ext(s, &chat_ext);
    if (!c) {
        if (!(c = kvg_calloc(1, sizeof *c))) return kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory");
        kvgen_status st = kvg_session_set_ext(s, &chat_ext, c, err);
        if (st != KVGEN_OK) {
            kvg_free(c);
            return st;
        }
    }
    *out = c;
    return KVGEN_OK;
}

size_t kvg_chat_saved_size(const kvgen_session *s) {
    const kvg_chat *c = kvg_session_ext(s, &chat_ext);
    return c ? kvg_chat_state_size(c) : 0;
}

void kvg_chat_save(const kvgen_session *s, unsigned char *buf) {
    const kvg_chat *c = kvg_session_ext(s, &chat_ext);
    if (c) kvg_chat_state_save(c, buf);
}

kvgen_status kvg_chat_load(kvgen_session *s, const unsigned char *buf, size_t size, kvgen_error *err) {
    kvg_chat *c = NULL;
    kvgen_status st = size ? kvg_chat_state_load(&c, buf, size, err) : KVGEN_OK;
    if (st == KVGEN_OK) st = kvg_session_set_ext(s, &chat_ext, c, err);
    if (st != KVGEN_OK) kvg_chat_free(c);
    return st;
}

kvgen_status kvg_chat_mark(const kvgen_session *s, kvg_chat **mark, kvgen_error *err) {
    const kvg_chat *c = kvg_session_ext(s, &chat_ext);
    *mark = NULL;
    return c ? kvg_chat_clone(mark, c, err) : KVGEN_OK;
}

void kvg_chat_return_to(kvgen_session *s, kvg_chat *mark) {
    kvg_chat_free(kvg_session_take_ext(s, &chat_ext));
    if (mark && kvg_session_set_ext(s, &chat_ext, mark, NULL) != KVGEN_OK) kvg_chat_free(mark);
}

void kvg_chat_mark_free(kvg_chat *mark) { kvg_chat_free(mark); }

/* What renders the chat: a Jinja template, or a family's (or the caller's) strings. */
typedef struct rules {
    const char *str[N_STR];
    int system_in_user;
    const char *name;
    const char *jinja; /* non-NULL: this template renders the whole conversation */
    size_t jinja_len;
} rules;

/* The model's template is used when it parses and renders a one-message conversation. */
static bool template_usable(const char *src, size_t len, char *why, size_t size) {
    kvg_jinja *t = NULL;
    if (!kvg_jinja_parse(src, len, &t, why, size)) return false;
    kvg_jinja_msg probe = {"user", "Hello", NULL};
    kvg_jinja_input in = {&probe, 1, true, "", "", NULL};
    kvg_jinja_output out;
    bool ok = kvg_jinja_render(t, &in, &out, why, size);
    kvg_jinja_free(t);
    kvg_free(out.text);
    kvg_free(out.user);
    return ok;
}

static void use_family(rules *ru, int f) {
    for (int i = 0; i < N_STR; i++) ru->str[i] = FAMILIES[f].str[i];
    ru->system_in_user = FAMILIES[f].system_in_user;
    ru->name = FAMILIES[f].name;
}

/* The rules in force: the caller's template or strings, a chosen family, or the model's
 * template (rendered; a family when the file has none or the interpreter rejects it). */
static kvgen_status resolve(kvgen_session *s, kvg_chat *c, rules *ru, kvgen_error *err) {
    memset(ru, 0, sizeof *ru);
    if (c->mode == MODE_JINJA) {
        ru->jinja = c->jinja;
        ru->jinja_len = strlen(c->jinja);
        ru->name = "jinja";
        return KVGEN_OK;
    }
    if (c->mode == MODE_CUSTOM) {
        for (int i = 0; i < N_STR; i++) ru->str[i] = c->str[i];
        ru->system_in_user = c->system_in_user;
        ru->name = "custom";
        return KVGEN_OK;
    }
    if (c->mode == MODE_BUILTIN) {
        use_family(ru, c->family);
        return KVGEN_OK;
    }
    const kvgen_model *m = kvg_session_model(s);
    kvg_str t;
    if (!kvg_gguf_get_str(m->gguf, "tokenizer.chat_template", &t)) {
        /* no template in the file (common in re-packed GGUFs): the family whose control
         * tokens the vocabulary holds */
        int f = family_from_vocab(m->tok);
        if (f < 0)
            return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                            "%s: the model has no tokenizer.chat_template and its vocabulary has no family's "
                            "control tokens; choose one with kvgen_chat_set_template (chatml, llama3, llama2, "
                            "zephyr, gemma, phi3, custom strings, or a Jinja template)",
                            kvg_gguf_path(m->gguf));
        use_family(ru, f);
        return KVGEN_OK;
    }
    char why[KVGEN_ERROR_MESSAGE_SIZE];
    if (template_usable(t.ptr, (size_t)t.len, why, sizeof why)) {
        ru->jinja = t.ptr;
        ru->jinja_len = (size_t)t.len;
        ru->name = "jinja";
        return KVGEN_OK;
    }
    int f = detect_family(t.ptr, (size_t)t.len);
    if (!c->warned) {
        kvg_log(KVGEN_LOG_WARNING, "%s: tokenizer.chat_template is not supported (%s); %s", kvg_gguf_path(m->gguf),
                why, f >= 0 ? "using the built-in family of its control strings" : "no built-in family matches");
        c->warned = 1;
    }
    if (f < 0)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "%s: tokenizer.chat_template cannot be run (%s) and is not a family kvgen knows (chatml, "
                        "llama3, llama2, zephyr, gemma, phi3); give one with kvgen_chat_set_template",
                        kvg_gguf_path(m->gguf), why);
    use_family(ru, f);
    return KVGEN_OK;
}

kvgen_status kvgen_chat_set_template(kvgen_session *s, const kvgen_chat_template *tpl, kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_chat_set_template: session is NULL");
    kvgen_status busy_ = kvg_session_check_host(s, "kvgen_chat_set_template", err);
    if (busy_ != KVGEN_OK) return busy_;
    busy_ = kvg_session_can(s->model, s, KVG_CAN_CHAT_TEMPLATE, "kvgen_chat_set_template", err);
    if (busy_ != KVGEN_OK) return busy_;
    kvg_chat next = {0};
    if (!tpl) {
        next.mode = MODE_MODEL;
    } else if (tpl->jinja && !tpl->name) {
        char why[KVGEN_ERROR_MESSAGE_SIZE - 64];
        kvg_jinja *t = NULL;
        if (!kvg_jinja_parse(tpl->jinja, strlen(tpl->jinja), &t, why, sizeof why))
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_chat_set_template: jinja: %s", why);
        kvg_jinja_free(t);
        next.mode = MODE_JINJA;
        if (!(next.jinja = kvg_memdup0(tpl->jinja, strlen(tpl->jinja))))
            return kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory");
    } else if (tpl->name) {
        next.family = find_family(tpl->name);
        if (next.family < 0)
            return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                            "kvgen_chat_set_template: unknown family \"%s\" (chatml, llama3, llama2, zephyr, gemma, "
                            "phi3; or name NULL with custom strings)",
                            tpl->name);
        next.mode = MODE_BUILTIN;
    } else {
        const char *in[N_STR] = {tpl->system_prefix, tpl->system_suffix, tpl->user_prefix,
                                 tpl->user_suffix,   tpl->assistant_prefix, tpl->assistant_suffix};
        next.mode = MODE_CUSTOM;
        next.system_in_user = tpl->system_in_user != 0;
        for (int i = 0; i < N_STR; i++) {
            const char *v = in[i] ? in[i] : "";
            if (!(next.str[i] = kvg_memdup0(v, strlen(v)))) {
                for (int k = 0; k < i; k++) kvg_free(next.str[k]);
                return kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory");
            }
        }
    }
    kvg_chat *c = NULL;
    kvgen_status st = get_chat(s, &c, err);
    if (st != KVGEN_OK) {
        for (int i = 0; i < N_STR; i++) kvg_free(next.str[i]);
        kvg_free(next.jinja);
        return st;
    }
    for (int i = 0; i < N_STR; i++) kvg_free(c->str[i]);
    kvg_free(c->jinja);
    /* the conversation and the open reply carry over: a template renders them from here on */
    next.open_reply = c->open_reply;
    next.last_role = c->last_role;
    next.msgs = c->msgs;
    next.n_msgs = c->n_msgs;
    next.vars = c->vars;
    next.reply_at = c->reply_at;
    next.warned = c->warned;
    *c = next;
    return KVGEN_OK;
}

const char *kvgen_chat_template_name(kvgen_session *s, kvgen_error *err) {
    if (!s) {
        kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_chat_template_name: session is NULL");
        return NULL;
    }
    if (s->kind->chat_template_name) return s->kind->chat_template_name; /* a remote session's: its server's */
    kvg_chat *c = NULL;
    if (get_chat(s, &c, err) != KVGEN_OK) return NULL;
    rules ru;
    return resolve(s, c, &ru, err) == KVGEN_OK ? ru.name : NULL;
}

kvgen_status kvg_chat_jinja_source(kvgen_session *s, const char *who, const char **src, size_t *len,
                                   kvgen_error *err) {
    kvgen_status st = kvg_session_can(s->model, s, KVG_CAN_CHAT_TEMPLATE, who, err);
    kvg_chat *c = NULL;
    if (st == KVGEN_OK) st = get_chat(s, &c, err);
    rules ru;
    if (st == KVGEN_OK) st = resolve(s, c, &ru, err);
    if (st != KVGEN_OK) return st;
    if (!ru.jinja)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "%s: tools need a Jinja chat template (the chat is rendered by the built-in '%s' strings)",
                        who, ru.name);
    *src = ru.jinja;
    *len = ru.jinja_len;
    return KVGEN_OK;
}

/* a growable token list */
typedef kvg_tokens toks;

/* A tokenizer call that asked for `got` places: room for them after t's tokens. */
static kvgen_status grow_for(toks *t, size_t got, kvgen_error *err) {
    size_t cap = t->n + got + 64;
    int32_t *v = kvg_realloc(t->v, cap * sizeof *v);
    if (!v) return kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory for %zu tokens", cap);
    t->v = v;
    t->cap = cap;
    return KVGEN_OK;
}

/* One piece of text to tokenize: plain text through kvgen_tokenize (flags as there), or a
 * rendered conversation (marked) through kvg_tokenize_marked, user flagging its content bytes */
typedef struct piece {
    const char *text;
    size_t len;
    unsigned flags;
    bool marked;
    const unsigned char *user;
} piece;

/* Appends the piece's tokens to t, growing t when the tokenizer reports how many it needs
 * (KVGEN_E_INVALID_ARGUMENT with got > room) */
static kvgen_status append_piece(toks *t, const kvgen_model *m, const piece *p, kvgen_error *err) {
    if (p->len == 0) return KVGEN_OK;
    for (;;) {
        size_t room = t->cap - t->n, got = 0;
        int32_t *out = t->v ? t->v + t->n : NULL;
        kvgen_error e2 = {0};
        kvgen_status st = p->marked ? kvg_tokenize_marked(m->tok, p->text, p->len, p->flags, p->user, out, room, &got, &e2)
                                  : kvgen_tokenize(m, p->text, p->len, p->flags, out, room, &got, &e2);
        if (st == KVGEN_OK) {
            t->n += got;
            return KVGEN_OK;
        }
        if (st != KVGEN_E_INVALID_ARGUMENT || got <= room) {
            if (err) *err = e2;
            return st;
        }
        st = grow_for(t, got, err);
        if (st != KVGEN_OK) return st;
    }
}

static kvgen_status append_text(toks *t, const kvgen_model *m, const char *text, unsigned flags, kvgen_error *err) {
    piece p = {.text = text, .len = strlen(text), .flags = flags};
    return append_piece(t, m, &p, err);
}

/* A rendered conversation as one text: control tokens only where the template wrote them,
 * everything between two of them (template text and content together) tokenized as one
 * piece, the way a tokenizer given the whole string splits it, so the ids are the ones the
 * model saw in training (Hugging Face's apply_chat_template), content never parsed. */
static kvgen_status append_rendered(toks *t, const kvgen_model *m, const kvg_jinja_output *ro, kvgen_error *err) {
    piece p = {.text = ro->text, .len = ro->len, .flags = KVGEN_TOKENIZE_SPECIAL, .marked = true, .user = ro->user};
    return append_piece(t, m, &p, err);
}

static int parse_role(const char *role) {
    if (!role) return ROLE_NONE;
    if (strcmp(role, "system") == 0) return ROLE_SYSTEM;
    if (strcmp(role, "user") == 0) return ROLE_USER;
    if (strcmp(role, "assistant") == 0) return ROLE_ASSISTANT;
    if (strcmp(role, "tool") == 0) return ROLE_TOOL;
    return -1;
}

/* Appends tokens to `out` (the jobs' prefill list) */
static kvgen_status append_out(kvg_tokens *out, const int32_t *v, size_t n, const char *fn, kvgen_error *err) {
    if (out->n + n > out->cap) {
        int32_t *nv = kvg_realloc(out->v, (out->n + n) * sizeof *nv);
        if (!nv) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for %zu tokens", fn, out->n + n);
        out->v = nv;
        out->cap = out->n + n;
    }
    if (n) memcpy(out->v + out->n, v, n * sizeof *v);
    out->n += n;
    return KVGEN_OK;
}

/* The text of a special token ("" when there is none). */
static void token_text(const kvgen_model *m, int32_t id, char *buf, size_t size) {
    buf[0] = 0;
    if (id < 0) return;
    size_t n = kvg_token_piece(m->tok, id, KVGEN_TOKENIZE_SPECIAL, buf, size - 1);
    buf[n < size - 1 ? n : size - 1] = 0;
}

/* The tools as a template that reads them from the system message takes them (Phi-4-mini's:
 * JSON text of a list of the functions, as Python's json.dumps writes it), from the chat's
 * variables; NULL when they hold no tools. *oom when it could not be made. */
static char *system_tools_text(const char *vars, bool *oom) {
    static const char LIST[] = "{% if tools %}[{% for t in tools %}{% if not loop.first %}, {% endif %}"
                               "{{ (t.function if t.function is defined else t) | tojson }}{% endfor %}]{% endif %}";
    kvg_jinja *t = NULL;
    kvg_jinja_output o = {0};
    char msg[128];
    *oom = false;
    if (!vars) return NULL;
    kvg_jinja_input in = {NULL, 0, false, "", "", vars};
    if (!kvg_jinja_parse(LIST, sizeof LIST - 1, &t, msg, sizeof msg) || !kvg_jinja_render(t, &in, &o, msg, sizeof msg))
        *oom = true; /* (a fixed template over checked variables fails for want of memory alone) */
    kvg_jinja_free(t);
    kvg_free(o.user);
    if (o.text && o.len == 0) {
        kvg_free(o.text);
        o.text = NULL;
    }
    return o.text;
}

/* msgs as the template's messages in jm (n + 1 of them at most). Under a template that takes
 * the tools in the system message (`field`, tools_text the tools; the first message when it
 * is a system one, else a system message of no text put first) or that renders no tool calls
 * (an assistant's calls then go to it as text after its content): the strings made for it in
 * owned (2n + 1 of them), n_owned counted. Returns the number of messages, 0 on OOM. */
static size_t jinja_messages(const chat_msg *msgs, size_t n, const char *tpl, size_t tpl_len, const char *field,
                             const char *tools_text, bool calls_text, kvg_jinja_msg *jm, char **owned,
                             size_t *n_owned) {
    size_t out = 0;
    *n_owned = 0;
    bool sys_first = n > 0 && msgs[0].role == ROLE_SYSTEM;
    if (field && tools_text && !sys_first) {
        kvg_json *f = kvg_json_new(KVG_JSON_OBJECT);
        char *printed = f && kvg_json_add(f, field, kvg_json_new_string(tools_text, strlen(tools_text)))
                            ? kvg_json_print(f, NULL)
                            : NULL;
        kvg_json_free(f);
        if (!printed) return 0;
        owned[(*n_owned)++] = printed;
        jm[out++] = (kvg_jinja_msg){ROLE_NAMES[ROLE_SYSTEM], "", printed};
    }
    for (size_t i = 0; i < n; i++) {
        kvg_jinja_msg *j = &jm[out++];
        *j = (kvg_jinja_msg){ROLE_NAMES[msgs[i].role], msgs[i].content, msgs[i].fields};
        bool sys = field && tools_text && j == &jm[0];
        bool calls = calls_text && msgs[i].role == ROLE_ASSISTANT && msgs[i].fields &&
                     strstr(msgs[i].fields, "\"tool_calls\"");
        if (!sys && !calls) continue;
        kvg_json *f = msgs[i].fields ? kvg_json_parse(msgs[i].fields, strlen(msgs[i].fields), 64, NULL, NULL, 0)
                                     : kvg_json_new(KVG_JSON_OBJECT);
        if (!f) return 0;
        if (sys) {
            kvg_json_remove(f, field);
            if (!kvg_json_add(f, field, kvg_json_new_string(tools_text, strlen(tools_text)))) {
                kvg_json_free(f);
                return 0;
            }
        }
        char *text = NULL;
        if (calls) {
            const kvg_json *tc = kvg_json_get(f, "tool_calls");
            char *cj = tc ? kvg_json_print(tc, NULL) : NULL;
            text = cj ? kvg_tool_calls_text(tpl, tpl_len, cj) : NULL;
            kvg_free(cj);
        }
        bool as_text = text != NULL;
        if (text) { /* the content as the template reads it: the text, then the calls */
            size_t cn = strlen(msgs[i].content), tn = strlen(text);
            char *both = kvg_malloc(cn + tn + 1);
            if (both) {
                memcpy(both, msgs[i].content, cn);
                memcpy(both + cn, text, tn + 1);
                kvg_json_remove(f, "content"); /* (none, for calls alone) */
                owned[(*n_owned)++] = both;
                j->content = both;
            }
            kvg_free(text);
            if (!both) {
                kvg_json_free(f);
                return 0;
            }
        }
        if (!sys && !as_text) { /* a template that renders the calls itself: the fields as they are */
            kvg_json_free(f);
            continue;
        }
        char *printed = kvg_json_print(f, NULL);
        kvg_json_free(f);
        if (!printed) return 0;
        owned[(*n_owned)++] = printed;
        j->fields = printed;
    }
    return out;
}

/* A turn under a Jinja template: the conversation (messages whose tokens are still in the
 * cache, the reply generated since the last turn, the new message) is rendered and tokenized,
 * template text with special tokens, content without; the cache keeps its longest common
 * prefix with that and the rest is prefilled (or handed to the jobs' worker in `out`). */
static kvgen_status template_turn(kvgen_session *s, kvg_chat *c, const rules *ru, int r, const char *text,
                                  const char *fields, bool begin_reply, const char *fn, kvg_tokens *out,
                                  kvgen_error *err) {
    const kvgen_model *m = kvg_session_model(s);
    size_t len = kvgen_session_length(s);
    const int32_t *have = kvgen_session_tokens(s);
    size_t keep = 0;
    while (keep < c->n_msgs && c->msgs[keep].end <= len) keep++; /* a rewind took the rest back */
    chat_msg *msgs = kvg_calloc(keep + 2, sizeof *msgs);
    kvg_jinja_msg *jm = kvg_calloc(keep + 3, sizeof *jm);
    char **owned = kvg_calloc(2 * (keep + 2) + 1, sizeof *owned); /* jm's strings made for the template */
    size_t n_owned = 0;
    char *tools_text = NULL;
    kvg_jinja *t = NULL;
    kvg_jinja_output ro = {0};
    toks tk = {0};
    char *reply = NULL;
    kvgen_status st = KVGEN_OK;
    size_t n = 0, k = 0, n_new = 0;
    chat_msg *new_msgs = NULL;
    int32_t *dropped = NULL; /* [len - k]: the cached tokens a changed prefix rewound */
    bool rewound = false;
    if (!msgs || !jm || !owned) {
        st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
        goto done;
    }
    for (; n < keep; n++) msgs[n] = c->msgs[n];
    /* a template that reads the tools from the system message (Phi-4-mini's) gets them there */
    const char *tools_field = kvg_tool_system_field(ru->jinja, ru->jinja_len);
    bool calls_text = kvg_tool_calls_as_text(ru->jinja, ru->jinja_len);
    bool tools_oom = false;
    if (tools_field) tools_text = system_tools_text(c->vars, &tools_oom);
    if (tools_oom) {
        st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
        goto done;
    }
    if (c->open_reply && c->reply_at < len) { /* the reply as generated, control tokens left out */
        size_t need = kvgen_detokenize(m, have + c->reply_at, len - c->reply_at, 0, NULL, 0);
        if (!(reply = kvg_malloc(need + 1))) {
            st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
            goto done;
        }
        kvgen_detokenize(m, have + c->reply_at, len - c->reply_at, 0, reply, need + 1);
        msgs[n++] = (chat_msg){ROLE_ASSISTANT, reply, NULL, len};
    }
    if (r != ROLE_NONE) msgs[n++] = (chat_msg){r, (char *)text, (char *)fields, 0};

    char why[KVGEN_ERROR_MESSAGE_SIZE - 96], bos[128], eos[128];
    token_text(m, kvg_tokenizer_bos(m->tok), bos, sizeof bos);
    token_text(m, kvg_tokenizer_eos(m->tok), eos, sizeof eos);
    const char *which = c->mode == MODE_JINJA ? "the session's chat template" : "tokenizer.chat_template";
    if (!kvg_jinja_parse(ru->jinja, ru->jinja_len, &t, why, sizeof why)) {
        st = kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: %s: %s", fn, which, why);
        goto done;
    }
    size_t n_system = 0; /* the leading system turns: never dropped to make room */
    bool thinned = false;
    while (n_system < n && msgs[n_system].role == ROLE_SYSTEM) n_system++;
    for (;;) {
        while (n_owned > 0) kvg_free(owned[--n_owned]);
        size_t n_jm = jinja_messages(msgs, n, ru->jinja, ru->jinja_len, tools_field, tools_text, calls_text, jm,
                                     owned, &n_owned);
        if (n_jm == 0 && n > 0) {
            st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
            goto done;
        }
        kvg_jinja_input in = {jm, n_jm, begin_reply, bos, eos, c->vars};
        if (!kvg_jinja_render(t, &in, &ro, why, sizeof why)) {
            st = kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: %s: %s", fn, which, why);
            goto done;
        }
        if (ro.len == 0) { /* nothing to generate from, and nothing of the cache to keep */
            st = kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: %s%s%s renders nothing for a conversation of %zu message%s",
                          fn, which, c->mode == MODE_JINJA ? "" : " of ",
                          c->mode == MODE_JINJA ? "" : kvg_gguf_path(m->gguf), n, n == 1 ? "" : "s");
            goto done;
        }
        /* the whole rendering at once, control tokens matched in template text only */
        st = append_rendered(&tk, m, &ro, err);
        if (st != KVGEN_OK) goto done;
        if (kvg_tokenizer_add_bos(m->tok)) {
            int32_t bos_id = kvg_tokenizer_bos(m->tok);
            if (bos_id >= 0 && (tk.n == 0 || tk.v[0] != bos_id)) {
                int32_t one = bos_id;
                toks with = {0};
                st = append_out(&with, &one, 1, fn, err);
                if (st == KVGEN_OK) st = append_out(&with, tk.v, tk.n, fn, err);
                kvg_free(tk.v);
                tk = with;
                if (st != KVGEN_OK) goto done;
            }
        }
        k = 0;
        while (k < len && k < tk.n && have[k] == tk.v[k]) k++;
        /* A session that shifts: when the tokens past the common prefix cannot go in even by
         * shifting (after a shift cut a turn, the turns after it run again), the oldest turns
         * after the system prompt leave the conversation until they can; the newest stays. */
        size_t kept = (size_t)s->keep < k ? (size_t)s->keep : k;
        if (s->on_full != KVGEN_ON_FULL_SHIFT || tk.n <= (size_t)s->n_ctx || tk.n - k <= (size_t)s->n_ctx - kept ||
            n_system + 1 >= n)
            break;
        memmove(msgs + n_system, msgs + n_system + 1, (n - n_system - 1) * sizeof *msgs);
        n--;
        thinned = true;
        if (n_system < keep) keep--;
        kvg_free(ro.text);
        kvg_free(ro.user);
        memset(&ro, 0, sizeof ro);
        tk.n = 0;
    }

    /* the new conversation, its positions those of the rendering */
    new_msgs = kvg_calloc(n ? n : 1, sizeof *new_msgs);
    if (!new_msgs) {
        st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
        goto done;
    }
    for (; n_new < n; n_new++) {
        const chat_msg *src = &msgs[n_new];
        new_msgs[n_new].role = src->role;
        new_msgs[n_new].end = n_new < keep || src->content == reply ? src->end : tk.n;
        /* after turns left, where an earlier one ends past the common prefix is not known: the
         * end of the rendering (a rewind into it takes the turn back) */
        if (thinned && new_msgs[n_new].end > k) new_msgs[n_new].end = tk.n;
        if (new_msgs[n_new].end > tk.n) new_msgs[n_new].end = tk.n;
        if (!(new_msgs[n_new].content = kvg_memdup0(src->content, strlen(src->content))) ||
            (src->fields && !(new_msgs[n_new].fields = kvg_memdup0(src->fields, strlen(src->fields))))) {
            n_new++; /* freed with the others */
            st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
            goto done;
        }
    }

    if (k < len) { /* the rendered prefix changed (or the reply tokenizes differently): reuse what matches */
        /* the tokens given up, so that a turn that fails after the rewind puts them back */
        if (!(dropped = kvg_malloc((len - k) * sizeof *dropped))) {
            st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
            goto done;
        }
        memcpy(dropped, have + k, (len - k) * sizeof *dropped);
        st = kvgen_session_rewind(s, len - k, err);
        if (st != KVGEN_OK) goto done;
        rewound = true;
    }
    /* the state is the new one before the tokens go in: a context shift while they do (here, or
     * in the jobs' worker) moves its positions with the cache */
    chat_msg *old_msgs = c->msgs;
    size_t n_old = c->n_msgs, old_reply_at = c->reply_at;
    int old_open = c->open_reply;
    c->msgs = new_msgs;
    c->n_msgs = n_new;
    c->reply_at = tk.n;
    c->open_reply = begin_reply;
    new_msgs = NULL;
    n_new = 0;
    if (out) st = append_out(out, tk.v + k, tk.n - k, fn, err);
    else if (tk.n > k) st = kvgen_session_prefill(s, tk.v + k, tk.n - k, NULL, err);
    if (st != KVGEN_OK) { /* back to the conversation as it was */
        new_msgs = c->msgs;
        n_new = c->n_msgs;
        c->msgs = old_msgs;
        c->n_msgs = n_old;
        c->reply_at = old_reply_at;
        c->open_reply = old_open;
        goto done;
    }
    free_msgs(old_msgs, n_old);
    if (r != ROLE_NONE) c->last_role = r;
done:
    if (st != KVGEN_OK && rewound) {
        /* the turn failed after the cache gave up its tail: back to the tokens it held (a failed
         * prefill leaves the session at k; one that succeeded before a later failure is undone) */
        kvgen_error ignored = {0};
        size_t now = kvgen_session_length(s);
        if (now > k) kvgen_session_rewind(s, now - k, &ignored);
        if (kvgen_session_length(s) == k) kvgen_session_prefill(s, dropped, len - k, NULL, &ignored);
        if (st == KVGEN_E_CONTEXT_FULL && kvgen_session_length(s) == len) /* the numbers of the session as it is */
            kvg_fail(err, st,
                     "context full (%zu/%d): cannot append this chat turn: the conversation renders to %zu tokens, "
                     "the cache holds the first %zu of them and the other %zu do not fit%s",
                     len, s->n_ctx, tk.n, k, tk.n - k,
                     s->on_full == KVGEN_ON_FULL_SHIFT ? " even after shifting out all but the kept ones" : "");
    }
    free_msgs(new_msgs, n_new);
    kvg_free(dropped);
    kvg_jinja_free(t);
    kvg_free(ro.text);
    kvg_free(ro.user);
    kvg_free(tk.v);
    kvg_free(reply);
    kvg_free(msgs);
    kvg_free(jm);
    while (owned && n_owned > 0) kvg_free(owned[--n_owned]);
    kvg_free(owned);
    kvg_free(tools_text);
    return st;
}

/* One turn: its tokens are prefilled, or with `out` appended there for the caller to prefill
 * (the jobs' worker, in chunks); the chat state changes only when that succeeded. */
static kvgen_status chat_turn(kvgen_session *s, const char *role, const char *text, const char *fields,
                              bool begin_reply, const char *fn, kvg_tokens *out, kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: session is NULL", fn);
    kvgen_status busy_ = kvg_session_check_host(s, fn, err);
    if (busy_ != KVGEN_OK) return busy_;
    int r = parse_role(role);
    if (r < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: role \"%s\" (system, user, assistant or tool)", fn, role);
    if (r != ROLE_NONE && !text) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: text is NULL", fn);
    if (r == ROLE_NONE && !begin_reply) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: role is NULL", fn);
    if (s->kind->chat_turn && (r == ROLE_TOOL || fields))
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: tool messages and tool calls are not supported on a remote session",
                        fn);
    if (s->kind->chat_turn) { /* the kind keeps the chat (a remote session: a message of its history) */
        if (out) out->n = 0;
        return s->kind->chat_turn(s, r != ROLE_NONE ? role : NULL, text, fn, err);
    }
    kvg_chat *c = NULL;
    bool had_chat = kvg_session_ext(s, &chat_ext) != NULL;
    kvgen_status st = get_chat(s, &c, err);
    if (st != KVGEN_OK) return st;
    rules ru;
    st = resolve(s, c, &ru, err);
    if (st != KVGEN_OK) goto fail;
    if (ru.jinja) {
        st = template_turn(s, c, &ru, r, text, fields, begin_reply, fn, out, err);
        if (st != KVGEN_OK) goto fail;
        return KVGEN_OK;
    }
    if (r == ROLE_TOOL || fields) {
        st = kvg_fail(err, KVGEN_E_UNSUPPORTED,
                      "%s: tool messages, tool calls and reasoning need a Jinja chat template; the session's chat "
                      "renders with the built-in strings of \"%s\"",
                      fn, ru.name);
        goto fail;
    }
    const char **str = ru.str;
    int system_in_user = ru.system_in_user;

    const kvgen_model *m = kvg_session_model(s);
    size_t len = kvgen_session_length(s);
    const int32_t *have = kvgen_session_tokens(s);
    toks t = {0};
    int last_role = c->last_role;
    /* the conversation as the template appends it: the reply being closed and the new message,
     * each with where its tokens end, so that a Jinja template set later renders them */
    chat_msg added[2] = {{0}};
    size_t n_added = 0;
    if (c->open_reply && c->reply_at < len) {
        size_t need = kvgen_detokenize(m, have + c->reply_at, len - c->reply_at, 0, NULL, 0);
        if (!(added[0].content = kvg_malloc(need + 1))) {
            st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
            goto fail;
        }
        kvgen_detokenize(m, have + c->reply_at, len - c->reply_at, 0, added[0].content, need + 1);
        added[0].role = ROLE_ASSISTANT;
        n_added = 1;
    }
    if (c->open_reply && len > 0) {
        /* close the reply; the end-of-turn token the model generated is already in the cache */
        st = append_text(&t, m, str[S_ASST_SUF], KVGEN_TOKENIZE_SPECIAL, err);
        size_t skip = 0;
        for (size_t k = t.n; k > 0 && st == KVGEN_OK; k--)
            if (k <= len && memcmp(have + len - k, t.v, k * sizeof *t.v) == 0) {
                skip = k;
                break;
            }
        memmove(t.v, t.v + skip, (t.n - skip) * sizeof *t.v);
        t.n -= skip;
        last_role = ROLE_ASSISTANT;
        if (n_added) added[0].end = t.n;
    }
    if (st == KVGEN_OK && r != ROLE_NONE) {
        int pre = r == ROLE_SYSTEM ? S_SYS_PRE : r == ROLE_USER ? S_USER_PRE : S_ASST_PRE;
        bool merged = r == ROLE_USER && system_in_user && last_role == ROLE_SYSTEM;
        if (!merged) st = append_text(&t, m, str[pre], KVGEN_TOKENIZE_SPECIAL, err);
        if (st == KVGEN_OK) st = append_text(&t, m, text, 0, err);
        if (st == KVGEN_OK) st = append_text(&t, m, str[pre + 1], KVGEN_TOKENIZE_SPECIAL, err);
        last_role = r;
        added[n_added].role = r;
        added[n_added].end = t.n;
        if (st == KVGEN_OK && !(added[n_added].content = kvg_memdup0(text, strlen(text))))
            st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
        n_added++;
    }
    if (st == KVGEN_OK && begin_reply) st = append_text(&t, m, str[S_ASST_PRE], KVGEN_TOKENIZE_SPECIAL, err);
    size_t bos_added = 0;
    if (st == KVGEN_OK && len == 0 && kvg_tokenizer_add_bos(m->tok)) {
        int32_t bos = kvg_tokenizer_bos(m->tok);
        if (bos >= 0 && (t.n == 0 || t.v[0] != bos)) {
            int32_t *v = kvg_realloc(t.v, (t.n + 1) * sizeof *v);
            if (!v) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory");
            else {
                memmove(v + 1, v, t.n * sizeof *v);
                v[0] = bos;
                t.v = v;
                t.n++;
                bos_added = 1;
            }
        }
    }
    /* room for the turns first: once the tokens are in, nothing is left that can fail */
    size_t n_keep = 0;
    while (n_keep < c->n_msgs && c->msgs[n_keep].end <= len) n_keep++; /* a rewind took the rest back */
    if (st == KVGEN_OK && n_added) {
        chat_msg *grown = kvg_realloc(c->msgs, (n_keep + n_added) * sizeof *grown);
        if (!grown) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
        else {
            for (size_t i = n_keep; i < c->n_msgs; i++) {
                kvg_free(c->msgs[i].content);
                kvg_free(c->msgs[i].fields);
            }
            c->msgs = grown;
            c->n_msgs = n_keep;
        }
    }
    /* the positions in the cache once the turn is in, before a shift its prefill may make moves
     * them (the state is updated before the prefill for that) */
    size_t reply_at_before = c->reply_at, n_before = c->n_msgs;
    if (st == KVGEN_OK) {
        for (size_t i = 0; i < n_added; i++) {
            added[i].end += len + bos_added;
            c->msgs[c->n_msgs++] = added[i];
            added[i].content = NULL;
        }
        c->reply_at = len + t.n;
    }
    if (st == KVGEN_OK && t.n > 0 && !out) st = kvgen_session_prefill(s, t.v, t.n, NULL, err);
    if (st == KVGEN_OK && t.n > 0 && out) {
        if (out->n + t.n > out->cap) {
            int32_t *v = kvg_realloc(out->v, (out->n + t.n) * sizeof *v);
            if (!v) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for %zu tokens", fn, out->n + t.n);
            else {
                out->v = v;
                out->cap = out->n + t.n;
            }
        }
        if (st == KVGEN_OK) {
            memcpy(out->v + out->n, t.v, t.n * sizeof *t.v);
            out->n += t.n;
        }
    }
    kvg_free(t.v);
    for (size_t i = 0; i < n_added; i++) kvg_free(added[i].content);
    if (st != KVGEN_OK) { /* nothing was appended: the chat state stays as it was */
        if (c->n_msgs > n_before) {
            for (size_t i = n_before; i < c->n_msgs; i++) kvg_free(c->msgs[i].content);
            c->n_msgs = n_before;
            c->reply_at = reply_at_before;
        }
        goto fail;
    }
    c->last_role = last_role;
    c->open_reply = begin_reply;
    return KVGEN_OK;
fail:
    if (!had_chat) { /* not even an empty chat state is left behind */
        kvg_session_set_ext(s, &chat_ext, NULL, NULL);
    }
    return st;
}

kvgen_status kvgen_chat_add(kvgen_session *s, const char *role, const char *text, kvgen_error *err) {
    return chat_turn(s, role, text, NULL, false, "kvgen_chat_add", NULL, err);
}

kvgen_status kvgen_chat_begin(kvgen_session *s, const char *role, const char *text, kvgen_error *err) {
    return chat_turn(s, role, text, NULL, true, "kvgen_chat_begin", NULL, err);
}

kvgen_status kvg_chat_begin_tokens(kvgen_session *s, const char *role, const char *text, kvg_tokens *out,
                                   kvgen_error *err) {
    return chat_turn(s, role, text, NULL, true, "kvgen_chat_begin", out, err);
}

kvgen_status kvg_chat_gen_begin(kvgen_session *s, const char *role, const char *text, const kvgen_generate_desc *desc,
                                kvgen_gen **out, kvgen_error *err) {
    if (out) *out = NULL;
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_chat_gen_begin: session is NULL");
    kvgen_status busy_ = kvg_session_check_host(s, "kvgen_chat_gen_begin", err);
    if (busy_ != KVGEN_OK) return busy_;
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_chat_gen_begin: out is NULL");
    /* the generator first: once the turn is in, nothing is left that can fail */
    kvgen_gen *g = NULL;
    kvgen_status st = kvg_gen_create(s, desc, &g, "kvgen_chat_gen_begin", err);
    if (st != KVGEN_OK) return st;
    st = chat_turn(s, role, text, NULL, true, "kvgen_chat_gen_begin", NULL, err); /* all or nothing */
    if (st != KVGEN_OK) {
        kvgen_gen_end(g);
        return st;
    }
    *out = g;
    return KVGEN_OK;
}

/* ---- tool use: messages with further fields, template variables ---------------------------- */

enum { JSON_DEPTH = 64 }; /* as deep as the template interpreter reads */

/* text as JSON (what names it in errors): the parsed tree, or NULL with *st set */
static kvg_json *read_json(const char *text, const char *fn, const char *what, kvgen_status *st, kvgen_error *err) {
    char why[128];
    size_t at = 0;
    kvg_json *j = kvg_json_parse_ex(text, strlen(text), JSON_DEPTH, KVG_JSON_NUMBER_TEXT, NULL, &at, why, sizeof why);
    if (!j)
        *st = at == KVG_JSON_NO_MEMORY ? kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn)
                                       : kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %s: %s", fn, what, why);
    return j;
}

/* A message's further fields as compact JSON text (NULL when it has none), checked: tool calls
 * an array of objects whose "function" has a string "name" (and "arguments"), on an assistant
 * message; tool_call_id on a tool message. */
static kvgen_status message_fields(const kvgen_chat_message *m, int r, const char *fn, char **out, kvgen_error *err) {
    *out = NULL;
    if (!m->tool_calls && !m->tool_call_id && !m->reasoning_content) return KVGEN_OK;
    if ((m->tool_calls || m->reasoning_content) && r != ROLE_ASSISTANT)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %s belongs to an assistant message, not to role \"%s\"",
                        fn, m->tool_calls ? "tool_calls" : "reasoning_content", m->role);
    if (m->tool_call_id && r != ROLE_TOOL)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: tool_call_id belongs to a tool message, not to role \"%s\"",
                        fn, m->role);
    kvgen_status st = KVGEN_OK;
    kvg_json *o = kvg_json_new(KVG_JSON_OBJECT);
    if (!o) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
    if (m->tool_calls) {
        kvg_json *calls = read_json(m->tool_calls, fn, "tool_calls", &st, err);
        if (!calls) goto done;
        size_t i = 0;
        for (const kvg_json *c = calls->type == KVG_JSON_ARRAY ? calls->child : NULL; c; c = c->next, i++) {
            const kvg_json *f = kvg_json_get(c, "function");
            const kvg_json *name = kvg_json_get(f, "name");
            if (!f || f->type != KVG_JSON_OBJECT || !name || name->type != KVG_JSON_STRING ||
                !kvg_json_get(f, "arguments")) {
                st = kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                              "%s: tool_calls[%zu]: not {\"id\": ..., \"type\": \"function\", \"function\": "
                              "{\"name\": string, \"arguments\": object or JSON text}}",
                              fn, i);
                break;
            }
        }
        if (st == KVGEN_OK && calls->type != KVG_JSON_ARRAY)
            st = kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: tool_calls: not a JSON array", fn);
        if (st != KVGEN_OK) {
            kvg_json_free(calls);
            goto done;
        }
        if (!m->content && !kvg_json_add(o, "content", kvg_json_new(KVG_JSON_NULL))) goto oom;
        if (!kvg_json_add(o, "tool_calls", calls)) goto oom;
    }
    if (m->tool_call_id && !kvg_json_add(o, "tool_call_id", kvg_json_new_string(m->tool_call_id, strlen(m->tool_call_id))))
        goto oom;
    if (m->reasoning_content &&
        !kvg_json_add(o, "reasoning_content", kvg_json_new_string(m->reasoning_content, strlen(m->reasoning_content))))
        goto oom;
    if (!(*out = kvg_json_print(o, NULL))) goto oom;
done:
    kvg_json_free(o);
    return st;
oom:
    kvg_json_free(o);
    return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
}

kvgen_status kvgen_chat_add_message(kvgen_session *s, const kvgen_chat_message *msg, kvgen_error *err) {
    const char *fn = "kvgen_chat_add_message";
    if (!msg) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: msg is NULL", fn);
    if (!msg->role) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: role is NULL", fn);
    int r = parse_role(msg->role);
    if (r < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: role \"%s\" (system, user, assistant or tool)", fn,
                        msg->role);
    char *fields = NULL;
    kvgen_status st = message_fields(msg, r, fn, &fields, err);
    if (st != KVGEN_OK) return st;
    st = chat_turn(s, msg->role, msg->content ? msg->content : "", fields, false, fn, NULL, err);
    kvg_free(fields);
    return st;
}

static bool reserved_var(const kvg_json *m) {
    static const char *const names[] = {"messages", "add_generation_prompt", "bos_token", "eos_token"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (m->key_len == strlen(names[i]) && memcmp(m->key, names[i], m->key_len) == 0) return true;
    return false;
}

kvgen_status kvg_chat_vars_check(const char *json, const char *fn, const char *what, char **out, kvgen_error *err) {
    *out = NULL;
    if (!json) return KVGEN_OK;
    kvgen_status st = KVGEN_OK;
    kvg_json *j = read_json(json, fn, what, &st, err);
    if (!j) return st;
    if (j->type != KVG_JSON_OBJECT)
        st = kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %s: not a JSON object: %.60s", fn, what, json);
    for (const kvg_json *m = j->type == KVG_JSON_OBJECT ? j->child : NULL; m && st == KVGEN_OK; m = m->next)
        if (reserved_var(m))
            st = kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %s: \"%s\" is the chat's own variable and cannot be set",
                          fn, what, m->key);
    if (st == KVGEN_OK && j->n && !(*out = kvg_json_print(j, NULL)))
        st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
    kvg_json_free(j);
    return st;
}

kvgen_status kvgen_chat_set_vars(kvgen_session *s, const char *json, kvgen_error *err) {
    const char *fn = "kvgen_chat_set_vars";
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: session is NULL", fn);
    kvgen_status st = kvg_session_check_host(s, fn, err);
    if (st != KVGEN_OK) return st;
    st = kvg_session_can(s->model, s, KVG_CAN_CHAT_TEMPLATE, fn, err);
    if (st != KVGEN_OK) return st;
    char *text = NULL;
    st = kvg_chat_vars_check(json, fn, "json", &text, err);
    if (st != KVGEN_OK) return st;
    if (!text && !kvg_session_ext(s, &chat_ext)) return KVGEN_OK; /* nothing to remove */
    kvg_chat *c = NULL;
    st = get_chat(s, &c, err);
    if (st != KVGEN_OK) {
        kvg_free(text);
        return st;
    }
    kvg_free(c->vars);
    c->vars = text;
    return KVGEN_OK;
}


const char *kvgen_chat_vars(kvgen_session *s) {
    const kvg_chat *c = s ? kvg_session_ext(s, &chat_ext) : NULL;
    return c ? c->vars : NULL;
}

/* ---- the conversation read back, and undone ------------------------------------------------ */

/* How many of c's complete messages the cache still holds (a rewind or a shift took the rest). */
static size_t held_msgs(const kvg_chat *c, size_t len) {
    size_t k = 0;
    while (k < c->n_msgs && c->msgs[k].end <= len) k++;
    return k;
}

/* whether a reply was generated since the last turn (it counts as the last message) */
static bool reply_held(const kvg_chat *c, size_t len) { return c->open_reply && c->reply_at < len; }

/* The messages a kind that keeps its own chat holds (role NULL past the last). */
static size_t kind_count(const kvgen_session *s) {
    size_t n = 0;
    const char *content = NULL;
    while (s->kind->chat_message(s, n, &content)) n++;
    return n;
}

enum { F_ROLE, F_CONTENT, F_CALLS, F_ID, F_REASONING, N_F };

/* One message's strings (NULL: absent), from its stored fields (parsed into *tree). */
static kvgen_status message_strings(const chat_msg *m, const char *content, const char **f, char **calls,
                                    kvg_json **tree, const char *fn, kvgen_error *err) {
    f[F_ROLE] = ROLE_NAMES[m->role];
    f[F_CONTENT] = content;
    if (!m->fields) return KVGEN_OK;
    kvgen_status st = KVGEN_OK;
    if (!(*tree = read_json(m->fields, fn, "stored fields", &st, err))) return st;
    const kvg_json *c = kvg_json_get(*tree, "content");
    if (c && c->type == KVG_JSON_NULL) f[F_CONTENT] = NULL; /* tool calls alone, as they were given */
    const kvg_json *tc = kvg_json_get(*tree, "tool_calls");
    if (tc && !(*calls = kvg_json_print(tc, NULL))) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
    f[F_CALLS] = *calls;
    f[F_ID] = kvg_json_get_string(*tree, "tool_call_id", NULL);
    f[F_REASONING] = kvg_json_get_string(*tree, "reasoning_content", NULL);
    return KVGEN_OK;
}

kvgen_status kvgen_chat_messages(kvgen_session *s, kvgen_chat_message **out, size_t *n, kvgen_error *err) {
    const char *fn = "kvgen_chat_messages";
    if (out) *out = NULL;
    if (n) *n = 0;
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: session is NULL", fn);
    if (!out || !n) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %s is NULL", fn, !out ? "out" : "n");
    kvgen_status st = kvg_session_check_host(s, fn, err);
    if (st != KVGEN_OK) return st;
    const kvg_chat *c = s->kind->chat_message ? NULL : kvg_session_ext(s, &chat_ext);
    size_t len = kvgen_session_length(s);
    size_t n_msgs = s->kind->chat_message ? kind_count(s) : c ? held_msgs(c, len) : 0;
    bool reply = c && reply_held(c, len);
    size_t count = n_msgs + reply;
    if (count == 0) return KVGEN_OK;
    /* each message's strings first (parsed fields, the reply's text), then one block for all */
    const char **f = kvg_calloc(count * N_F, sizeof *f);
    char **calls = kvg_calloc(count, sizeof *calls);
    kvg_json **trees = kvg_calloc(count, sizeof *trees);
    char *reply_text = NULL;
    if (!f || !calls || !trees) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
    for (size_t i = 0; st == KVGEN_OK && i < n_msgs; i++) {
        if (s->kind->chat_message) f[i * N_F + F_ROLE] = s->kind->chat_message(s, i, &f[i * N_F + F_CONTENT]);
        else st = message_strings(&c->msgs[i], c->msgs[i].content, f + i * N_F, &calls[i], &trees[i], fn, err);
    }
    if (st == KVGEN_OK && reply) { /* the reply as generated, control tokens left out */
        const kvgen_model *m = kvg_session_model(s);
        const int32_t *have = kvgen_session_tokens(s);
        size_t need = kvgen_detokenize(m, have + c->reply_at, len - c->reply_at, 0, NULL, 0);
        if (!(reply_text = kvg_malloc(need + 1))) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
        else {
            kvgen_detokenize(m, have + c->reply_at, len - c->reply_at, 0, reply_text, need + 1);
            f[n_msgs * N_F + F_ROLE] = ROLE_NAMES[ROLE_ASSISTANT];
            f[n_msgs * N_F + F_CONTENT] = reply_text;
        }
    }
    kvgen_chat_message *msgs = NULL;
    if (st == KVGEN_OK) {
        size_t bytes = count * sizeof *msgs;
        for (size_t i = 0; i < count * N_F; i++) bytes += f[i] ? strlen(f[i]) + 1 : 0;
        if (!(msgs = kvg_malloc(bytes))) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", fn);
    }
    if (st == KVGEN_OK) {
        char *p = (char *)(msgs + count);
        for (size_t i = 0; i < count; i++) {
            const char *copy[N_F];
            for (int k = 0; k < N_F; k++) {
                const char *v = f[i * N_F + k];
                copy[k] = NULL;
                if (!v) continue;
                size_t l = strlen(v) + 1;
                memcpy(p, v, l);
                copy[k] = p;
                p += l;
            }
            msgs[i] = (kvgen_chat_message){copy[F_ROLE], copy[F_CONTENT], copy[F_CALLS], copy[F_ID], copy[F_REASONING]};
        }
        *out = msgs;
        *n = count;
    }
    for (size_t i = 0; calls && trees && i < count; i++) {
        kvg_free(calls[i]);
        kvg_json_free(trees[i]);
    }
    kvg_free(f);
    kvg_free(calls);
    kvg_free(trees);
    kvg_free(reply_text);
    return st;
}

void kvgen_chat_messages_free(kvgen_chat_message *msgs) { kvg_free(msgs); }

kvgen_status kvgen_chat_undo(kvgen_session *s, int n, kvgen_error *err) {
    const char *fn = "kvgen_chat_undo";
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: session is NULL", fn);
    kvgen_status st = kvg_session_check_host(s, fn, err);
    if (st != KVGEN_OK) return st;
    kvg_chat *c = s->kind->chat_message ? NULL : kvg_session_ext(s, &chat_ext);
    size_t len = kvgen_session_length(s);
    size_t n_msgs = s->kind->chat_message ? kind_count(s) : c ? held_msgs(c, len) : 0;
    size_t count = n_msgs + (c && reply_held(c, len));
    if (n < 0 || (size_t)n > count)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "%s: n %d is out of range [0, %zu]: the session's chat holds %zu message%s", fn, n, count,
                        count, count == 1 ? "" : "s");
    if (n == 0) return KVGEN_OK;
    if (s->kind->chat_message) { /* the kind keeps the chat (a remote session: its history) */
        s->kind->chat_undo(s, (size_t)n);
        return KVGEN_OK;
    }
    size_t left = count - (size_t)n; /* the messages that stay: all complete ones (left <= n_msgs) */
    size_t to = left ? c->msgs[left - 1].end : 0;
    if (len > to) {
        st = kvgen_session_rewind(s, len - to, err);
        if (st != KVGEN_OK) return st;
    }
    for (size_t i = left; i < c->n_msgs; i++) {
        kvg_free(c->msgs[i].content);
        kvg_free(c->msgs[i].fields);
    }
    c->n_msgs = left;
    c->open_reply = 0;
    c->reply_at = to;
    c->last_role = left ? c->msgs[left - 1].role : ROLE_NONE;
    return KVGEN_OK;
}
