/* chat.c: chat templates (built-in families recognised from tokenizer.chat_template, or the
 * caller's prefix/suffix strings) and incremental turns: each call tokenizes and prefills only
 * the new turn; the conversation lives in the session's cache.
 *
 * Template text is tokenized with KVGEN_TOKENIZE_SPECIAL and the caller's text without it, each
 * piece on its own: "<|im_end|>" typed by a player stays plain text, never a control token. */
#include <stdlib.h>
#include <string.h>
#include "kvg_generate.h"
#include "kvg_model.h"
#include "kvg_session.h"
#include "kvg_sampler.h"

enum { S_SYS_PRE, S_SYS_SUF, S_USER_PRE, S_USER_SUF, S_ASST_PRE, S_ASST_SUF, N_STR };
enum { ROLE_NONE, ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };
enum { MODE_MODEL, MODE_BUILTIN, MODE_CUSTOM };

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

struct kvg_chat {
    int mode;   /* MODE_* */
    int family; /* MODE_BUILTIN */
    char *str[N_STR]; /* MODE_CUSTOM */
    int system_in_user;
    int open_reply; /* an assistant header was appended and its turn not closed yet */
    int last_role;  /* ROLE_* of the last complete turn */
};

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

static void kvg_chat_free(kvg_chat *c) {
    if (!c) return;
    for (int i = 0; i < N_STR; i++) kvg_free(c->str[i]);
    kvg_free(c);
}

static char *dup_str(const char *s, size_t n) {
    char *d = kvg_malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static kvgen_status kvg_chat_clone(kvg_chat **dst, const kvg_chat *src, kvgen_error *err) {
    *dst = NULL;
    kvg_chat *c = kvg_calloc(1, sizeof *c);
    if (!c) return kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory");
    *c = *src;
    for (int i = 0; i < N_STR; i++) {
        c->str[i] = NULL;
        if (src->str[i] && !(c->str[i] = dup_str(src->str[i], strlen(src->str[i])))) {
            kvg_chat_free(c);
            return kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory");
        }
    }
    *dst = c;
    return KVGEN_OK;
}

/* state: u8 mode, family, open_reply, last_role, system_in_user; then N_STR x (u32 len, bytes) */
static size_t kvg_chat_state_size(const kvg_chat *c) {
    size_t n = 5;
    for (int i = 0; i < N_STR; i++) n += 4 + (c->str[i] ? strlen(c->str[i]) : 0);
    return n;
}

static void kvg_chat_state_save(const kvg_chat *c, unsigned char *b) {
    *b++ = (unsigned char)c->mode;
    *b++ = (unsigned char)c->family;
    *b++ = (unsigned char)c->open_reply;
    *b++ = (unsigned char)c->last_role;
    *b++ = (unsigned char)c->system_in_user;
    for (int i = 0; i < N_STR; i++) {
        uint32_t n = c->str[i] ? (uint32_t)strlen(c->str[i]) : 0;
        for (int k = 0; k < 4; k++) *b++ = (unsigned char)(n >> (8 * k));
        if (n) memcpy(b, c->str[i], n);
        b += n;
    }
}

static kvgen_status kvg_chat_state_load(kvg_chat **out, const unsigned char *b, size_t size, kvgen_error *err) {
    *out = NULL;
    if (size < 5 || b[0] > MODE_CUSTOM || b[1] >= N_FAMILIES || b[2] > 1 || b[3] > ROLE_ASSISTANT || b[4] > 1)
        return kvg_fail(err, KVGEN_E_FORMAT, "sampler state: malformed chat state");
    kvg_chat *c = kvg_calloc(1, sizeof *c);
    if (!c) return kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory");
    c->mode = b[0];
    c->family = b[1];
    c->open_reply = b[2];
    c->last_role = b[3];
    c->system_in_user = b[4];
    size_t off = 5;
    for (int i = 0; i < N_STR; i++) {
        if (size - off < 4) goto bad;
        uint32_t n = (uint32_t)b[off] | (uint32_t)b[off + 1] << 8 | (uint32_t)b[off + 2] << 16 |
                     (uint32_t)b[off + 3] << 24;
        off += 4;
        if (n > size - off) goto bad;
        if (c->mode == MODE_CUSTOM && !(c->str[i] = dup_str((const char *)b + off, n))) {
            kvg_chat_free(c);
            return kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory");
        }
        off += n;
    }
    if (off != size) goto bad;
    *out = c;
    return KVGEN_OK;
bad:
    kvg_chat_free(c);
    return kvg_fail(err, KVGEN_E_FORMAT, "sampler state: malformed chat state");
}

const kvg_chat_ops kvg_chat_state_ops = {kvg_chat_free, kvg_chat_clone, kvg_chat_state_size, kvg_chat_state_save,
                                         kvg_chat_state_load};

static kvgen_status get_chat(kvgen_session *s, kvg_chat **out, kvgen_error *err) {
    kvg_sampler *sm = kvg_session_sampler(s);
    if (!sm->chat && !(sm->chat = kvg_calloc(1, sizeof *sm->chat)))
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory");
    sm->chat_ops = &kvg_chat_state_ops;
    *out = sm->chat;
    return KVGEN_OK;
}

/* The strings in force: the caller's, a chosen family's, or the model's detected family. */
static kvgen_status resolve(kvgen_session *s, const kvg_chat *c, const char *str[N_STR], int *system_in_user,
                            const char **name, kvgen_error *err) {
    if (c->mode == MODE_CUSTOM) {
        for (int i = 0; i < N_STR; i++) str[i] = c->str[i];
        *system_in_user = c->system_in_user;
        *name = "custom";
        return KVGEN_OK;
    }
    int f = c->family;
    if (c->mode == MODE_MODEL) {
        const kvgen_model *m = kvg_session_model(s);
        kvg_str t;
        if (!kvg_gguf_get_str(m->gguf, "tokenizer.chat_template", &t)) {
            /* no template in the file (common in re-packed GGUFs): the family whose control
             * tokens the vocabulary holds */
            f = family_from_vocab(m->tok);
            if (f < 0)
                return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                                "%s: the model has no tokenizer.chat_template and its vocabulary has no family's "
                                "control tokens; choose one with kvgen_chat_set_template (chatml, llama3, llama2, "
                                "zephyr, gemma, phi3, or custom strings)",
                                kvg_gguf_path(m->gguf));
            for (int i = 0; i < N_STR; i++) str[i] = FAMILIES[f].str[i];
            *system_in_user = FAMILIES[f].system_in_user;
            *name = FAMILIES[f].name;
            return KVGEN_OK;
        }
        f = detect_family(t.ptr, (size_t)t.len);
        if (f < 0)
            return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                            "%s: tokenizer.chat_template is not a family kvgen knows (chatml, llama3, llama2, "
                            "zephyr, gemma, phi3); give one with kvgen_chat_set_template",
                            kvg_gguf_path(m->gguf));
    }
    for (int i = 0; i < N_STR; i++) str[i] = FAMILIES[f].str[i];
    *system_in_user = FAMILIES[f].system_in_user;
    *name = FAMILIES[f].name;
    return KVGEN_OK;
}

kvgen_status kvgen_chat_set_template(kvgen_session *s, const kvgen_chat_template *tpl, kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_chat_set_template: session is NULL");
    kvgen_status busy_ = kvg_session_check_host(s, "kvgen_chat_set_template", err);
    if (busy_ != KVGEN_OK) return busy_;
    kvg_chat next = {0};
    if (!tpl) {
        next.mode = MODE_MODEL;
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
            if (!(next.str[i] = dup_str(v, strlen(v)))) {
                for (int k = 0; k < i; k++) kvg_free(next.str[k]);
                return kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory");
            }
        }
    }
    kvg_chat *c = NULL;
    kvgen_status st = get_chat(s, &c, err);
    if (st != KVGEN_OK) {
        for (int i = 0; i < N_STR; i++) kvg_free(next.str[i]);
        return st;
    }
    for (int i = 0; i < N_STR; i++) kvg_free(c->str[i]);
    next.open_reply = c->open_reply;
    next.last_role = c->last_role;
    *c = next;
    return KVGEN_OK;
}

const char *kvgen_chat_template_name(kvgen_session *s, kvgen_error *err) {
    if (!s) {
        kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_chat_template_name: session is NULL");
        return NULL;
    }
    kvg_chat *c = NULL;
    if (get_chat(s, &c, err) != KVGEN_OK) return NULL;
    const char *str[N_STR], *name;
    int siu;
    return resolve(s, c, str, &siu, &name, err) == KVGEN_OK ? name : NULL;
}

/* a growable token list */
typedef struct toks {
    int32_t *v;
    size_t n, cap;
} toks;

static kvgen_status append_text(toks *t, const kvgen_model *m, const char *text, unsigned flags, kvgen_error *err) {
    size_t len = strlen(text);
    if (len == 0) return KVGEN_OK;
    for (;;) {
        size_t room = t->cap - t->n, got = 0;
        kvgen_error e2 = {0};
        kvgen_status st = kvgen_tokenize(m, text, len, flags, t->v ? t->v + t->n : NULL, room, &got, &e2);
        if (st == KVGEN_OK) {
            t->n += got;
            return KVGEN_OK;
        }
        if (st != KVGEN_E_INVALID_ARGUMENT || got <= room) {
            if (err) *err = e2;
            return st;
        }
        size_t cap = t->n + got + 64;
        int32_t *v = kvg_realloc(t->v, cap * sizeof *v);
        if (!v) return kvg_fail(err, KVGEN_E_NO_MEMORY, "chat: out of memory for %zu tokens", cap);
        t->v = v;
        t->cap = cap;
    }
}

static int parse_role(const char *role) {
    if (!role) return ROLE_NONE;
    if (strcmp(role, "system") == 0) return ROLE_SYSTEM;
    if (strcmp(role, "user") == 0) return ROLE_USER;
    if (strcmp(role, "assistant") == 0) return ROLE_ASSISTANT;
    return -1;
}

/* One turn: its tokens are prefilled, or with `out` appended there for the caller to prefill
 * (the jobs' worker, in chunks); the chat state changes only when that succeeded. */
static kvgen_status chat_turn(kvgen_session *s, const char *role, const char *text, bool begin_reply,
                              const char *fn, kvg_tokens *out, kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: session is NULL", fn);
    kvgen_status busy_ = kvg_session_check_host(s, fn, err);
    if (busy_ != KVGEN_OK) return busy_;
    int r = parse_role(role);
    if (r < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: role \"%s\" (system, user or assistant)", fn, role);
    if (r != ROLE_NONE && !text) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: text is NULL", fn);
    if (r == ROLE_NONE && !begin_reply) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: role is NULL", fn);
    kvg_chat *c = NULL;
    kvg_sampler *sm = kvg_session_sampler(s);
    bool had_chat = sm->chat != NULL;
    kvgen_status st = get_chat(s, &c, err);
    if (st != KVGEN_OK) return st;
    const char *str[N_STR], *name;
    int system_in_user;
    st = resolve(s, c, str, &system_in_user, &name, err);
    if (st != KVGEN_OK) goto fail;

    const kvgen_model *m = kvg_session_model(s);
    size_t len = kvgen_session_length(s);
    const int32_t *have = kvgen_session_tokens(s);
    toks t = {0};
    int last_role = c->last_role;
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
    }
    if (st == KVGEN_OK && r != ROLE_NONE) {
        int pre = r == ROLE_SYSTEM ? S_SYS_PRE : r == ROLE_USER ? S_USER_PRE : S_ASST_PRE;
        bool merged = r == ROLE_USER && system_in_user && last_role == ROLE_SYSTEM;
        if (!merged) st = append_text(&t, m, str[pre], KVGEN_TOKENIZE_SPECIAL, err);
        if (st == KVGEN_OK) st = append_text(&t, m, text, 0, err);
        if (st == KVGEN_OK) st = append_text(&t, m, str[pre + 1], KVGEN_TOKENIZE_SPECIAL, err);
        last_role = r;
    }
    if (st == KVGEN_OK && begin_reply) st = append_text(&t, m, str[S_ASST_PRE], KVGEN_TOKENIZE_SPECIAL, err);
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
            }
        }
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
    if (st != KVGEN_OK) goto fail; /* nothing was appended: the chat state stays as it was */
    c->last_role = last_role;
    c->open_reply = begin_reply;
    return KVGEN_OK;
fail:
    if (!had_chat) { /* not even an empty chat state is left behind */
        kvg_chat_free(sm->chat);
        sm->chat = NULL;
    }
    return st;
}

kvgen_status kvgen_chat_add(kvgen_session *s, const char *role, const char *text, kvgen_error *err) {
    return chat_turn(s, role, text, false, "kvgen_chat_add", NULL, err);
}

kvgen_status kvgen_chat_begin(kvgen_session *s, const char *role, const char *text, kvgen_error *err) {
    return chat_turn(s, role, text, true, "kvgen_chat_begin", NULL, err);
}

kvgen_status kvg_chat_begin_tokens(kvgen_session *s, const char *role, const char *text, kvg_tokens *out,
                                   kvgen_error *err) {
    return chat_turn(s, role, text, true, "kvgen_chat_begin", out, err);
}

kvgen_status kvgen_chat_gen_begin(kvgen_session *s, const char *role, const char *text,
                                  const kvgen_generate_desc *desc, kvgen_gen **out, kvgen_error *err) {
    if (out) *out = NULL;
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_chat_gen_begin: session is NULL");
    kvgen_status busy_ = kvg_session_check_host(s, "kvgen_chat_gen_begin", err);
    if (busy_ != KVGEN_OK) return busy_;
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_chat_gen_begin: out is NULL");
    /* the generator first: once the turn is in, nothing is left that can fail */
    kvgen_gen *g = NULL;
    kvgen_status st = kvg_gen_create(s, desc, &g, "kvgen_chat_gen_begin", err);
    if (st != KVGEN_OK) return st;
    st = chat_turn(s, role, text, true, "kvgen_chat_gen_begin", NULL, err); /* all or nothing */
    if (st != KVGEN_OK) {
        kvgen_gen_end(g);
        return st;
    }
    *out = g;
    return KVGEN_OK;
}
