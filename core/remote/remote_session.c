/* remote_session.c: the remote kind of session (kvg_session_kind.h): a session of a model
 * served over HTTP is its history (history.c), which each request sends; the server holds the
 * tokens, logits and K/V, samples the replies (remote.c streams them) and renders chats with
 * its own template. What needs token ids of its own is refused here, with the messages users
 * see; everything else the layers above ask of a session is answered from the history. */
#include <stdio.h>
#include <string.h>
#include "kvg_remote.h"
#include "kvg_session.h"
#include "kvg_str.h"

static kvg_remote *remote_of(const kvgen_model *m) { return kvg_session_kind_state(m); }
static kvg_rhist *hist_of(const kvgen_session *s) { return s->kind_state; }

static kvgen_status refuse(const kvgen_model *m, const kvgen_session *s, kvg_session_cap cap, const char *fn,
                           kvgen_error *err) {
    switch (cap) {
    case KVG_CAN_TOKENS:
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "%s: session %p is on the remote model '%s': its token ids, logits and cache are the server's "
                        "(generate from text or chat instead; docs/remote.md)",
                        fn, (const void *)s, m->name);
    case KVG_CAN_TOKEN_JOBS:
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "%s: the remote model '%s' takes text, not token ids (its tokenizer is the server's)", fn,
                        m->name);
    case KVG_CAN_BIAS:
        if (!s)
            return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: sampler.bias on the remote model '%s': token ids are the server's",
                            fn, m->name);
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "%s: session %p is on the remote model '%s': a logit bias names token ids, which are the "
                        "server's",
                        fn, (const void *)s, m->name);
    case KVG_CAN_CHAT_TEMPLATE:
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "%s: session %p is on the remote model '%s', whose server renders chats with its own template",
                        fn, (const void *)s, m->name);
    }
    return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: not on the remote model '%s'", fn, m->name);
}

/* ---- the model ---- */

static void model_free(void *state) { kvg_remote_close(state); }

static void model_info(const kvgen_model *m, kvgen_model_info *info) {
    info->architecture = "remote";
    info->backend = "remote";
    info->device = kvg_remote_url(remote_of(m));
    info->bos = info->eos = info->eot = -1;
}

static size_t describe(const kvgen_model *m, char *buf, size_t size) {
    int n = snprintf(buf, size, "server:          %s (OpenAI-compatible; at most %d requests at once)\n",
                     kvg_remote_url(remote_of(m)), kvg_remote_max_requests(remote_of(m)));
    return n > 0 ? (size_t)n : 0;
}

/* ---- sessions: the history ---- */

static kvgen_status init(kvgen_session *s, kvgen_error *err) {
    if (!(s->kind_state = kvg_rhist_new())) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_create: out of memory");
    return KVGEN_OK;
}

static void session_free(kvgen_session *s) { kvg_rhist_free(hist_of(s)); }
static size_t length(const kvgen_session *s) { return kvg_rhist_length(hist_of(s)); }
static void reset(kvgen_session *s) { kvg_rhist_reset(hist_of(s)); }

static kvgen_status rewind_(kvgen_session *s, size_t n, kvgen_error *err) {
    return kvg_rhist_rewind(hist_of(s), n, "kvgen_session_rewind", err);
}

/* the history and the sampler; the server's prefix cache shares the rest */
static kvgen_status fork_(kvgen_session *s, kvgen_session **child, kvgen_error *err) {
    kvgen_session *c;
    kvgen_status st = kvg_session_new_like(s, &c, err);
    if (st != KVGEN_OK) return st;
    kvg_rhist *h = kvg_rhist_clone(hist_of(s));
    if (!h) {
        kvgen_session_close(c);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_fork: out of memory");
    }
    kvg_rhist_free(hist_of(c));
    c->kind_state = h;
    *child = c;
    return KVGEN_OK;
}

static void cache_info(const kvgen_session *s, kvgen_cache_info *info) {
    info->length = kvg_rhist_length(hist_of(s));
    info->capacity = (size_t)s->n_ctx;
}

/* ---- the layers above ---- */

/* session files: the history and the sampler settings as JSON */
static char *save(const kvgen_session *s, size_t *n) {
    kvgen_sampler_desc sp;
    kvgen_session_get_sampler(s, &sp);
    return kvg_rhist_to_json(hist_of(s), &sp, s->model->name, n);
}

static kvgen_status restore(kvgen_model *m, const char *bytes, size_t n, const char *who, kvgen_session **out,
                            kvgen_error *err) {
    kvg_rhist *h = NULL;
    kvgen_sampler_desc sp;
    kvgen_status st = kvg_rhist_from_json(bytes, n, &h, &sp, NULL, who, err);
    kvgen_session *s = NULL;
    kvgen_session_desc d = {.sampler = &sp};
    if (st == KVGEN_OK) st = kvg_session_new(m, &d, NULL, &s, err);
    if (st != KVGEN_OK) {
        kvg_rhist_free(h);
        return st;
    }
    kvg_rhist_free(hist_of(s));
    s->kind_state = h;
    *out = s;
    return KVGEN_OK;
}

/* choices: from the log-probabilities the server echoes for each candidate */
static kvgen_status score(kvgen_session *s, const char *const *cands, size_t n, double *logprob, int *n_tokens,
                          const char *who, kvgen_error *err) {
    return kvg_remote_score(remote_of(s->model), hist_of(s), cands, n, logprob, n_tokens, who, err);
}

/* a message of the history; the server renders the chat with its template */
static kvgen_status chat_turn(kvgen_session *s, const char *role, const char *text, const char *fn,
                              kvgen_error *err) {
    kvg_rhist *h = hist_of(s);
    if (role) return kvg_rhist_add_message(h, role, text, strlen(text), fn, err);
    if (kvg_rhist_mode(h) != KVG_RMODE_CHAT)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "%s: this remote session holds no chat to reply to (give a message, or generate from text)",
                        fn);
    return KVGEN_OK;
}

/* the chat read back from the history, and its last messages taken out */
static const char *chat_message(const kvgen_session *s, size_t i, const char **content) {
    return kvg_rhist_message(hist_of(s), i, content);
}

static void chat_undo(kvgen_session *s, size_t n) { kvg_rhist_drop(hist_of(s), n); }

static kvgen_status add_text(kvgen_session *s, const char *text, size_t len, bool check_only, const char *who,
                             kvgen_error *err) {
    kvg_rhist *h = hist_of(s);
    if (check_only && !(len > 0 && kvg_rhist_mode(h) == KVG_RMODE_CHAT)) return KVGEN_OK;
    return kvg_rhist_add_text(h, text, len, who, err); /* in a chat: refused, naming it */
}

static kvgen_status reply_start(kvgen_session *s, const kvg_reply_request *q, void **stream, const char *who,
                                kvgen_error *err) {
    kvg_rrequest rq = {.hist = hist_of(s), .sampler = q->sampler, .ignore_eog = q->ignore_eog,
                       .grammar = q->grammar, .max_tokens = q->max_tokens};
    kvg_rstream *rs = NULL;
    kvgen_status st = kvg_rstream_start(remote_of(s->model), &rq, q->worker, &rs, who, err);
    *stream = rs;
    return st;
}

static kvgen_status reply_pump(void *stream, int wait_ms, kvg_buf *text, kvg_buf *ends, int *pieces,
                               kvgen_finish *finish, kvgen_error *err) {
    return kvg_rstream_pump(stream, wait_ms, text, ends, pieces, finish, err);
}

static void reply_free(void *stream) { kvg_rstream_free(stream); }

/* a chat's assistant message (what was emitted), or text (what was emitted and a stop string
 * that ended it, as a local session keeps its tokens) */
static kvgen_status reply_commit(kvgen_session *s, const char *text, size_t len, const char *stop, size_t stop_len,
                                 kvgen_error *err) {
    kvg_rhist *h = hist_of(s);
    if (kvg_rhist_mode(h) == KVG_RMODE_CHAT) return kvg_rhist_add_message(h, "assistant", text, len, "generate", err);
    kvgen_status st = kvg_rhist_add_text(h, text, len, "generate", err);
    if (st == KVGEN_OK && stop_len) st = kvg_rhist_add_text(h, stop, stop_len, "generate", err);
    return st;
}

static int max_requests(const kvgen_model *m) { return kvg_remote_max_requests(remote_of(m)); }
static void drive(const kvgen_model *m, int wait_ms) { kvg_remote_drive(remote_of(m), wait_ms); }
static void wakeup(const kvgen_model *m) { kvg_remote_wakeup(remote_of(m)); }
static bool has_freed(const kvgen_model *m) { return kvg_remote_has_freed(remote_of(m)); }

static const kvg_session_kind remote_kind = {
    .name = "remote",
    .caps = 0,
    .refuse = refuse,
    .model_free = model_free,
    .model_info = model_info,
    .describe = describe,
    .init = init,
    .free = session_free,
    .length = length,
    .reset = reset,
    .rewind = rewind_,
    .fork = fork_,
    .cache_info = cache_info,
    .save = save,
    .restore = restore,
    .score = score,
    .chat_turn = chat_turn,
    .chat_template_name = "server",
    .chat_message = chat_message,
    .chat_undo = chat_undo,
    .add_text = add_text,
    .reply_start = reply_start,
    .reply_pump = reply_pump,
    .reply_free = reply_free,
    .reply_commit = reply_commit,
    .max_requests = max_requests,
    .drive = drive,
    .wakeup = wakeup,
    .has_freed = has_freed,
};

kvgen_status kvg_remote_load(kvgen_model *m, const kvgen_model_desc *desc, kvgen_error *err) {
    kvg_remote *r = NULL;
    kvgen_status st = kvg_remote_open(desc, &r, err);
    if (st != KVGEN_OK) return st;
    if (!(m->name = kvg_strdup(kvg_remote_model_name(r)))) {
        kvg_remote_close(r);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", desc->path);
    }
    return kvg_session_kind_attach(m, &remote_kind, r, desc->path, err);
}
