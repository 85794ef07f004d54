/* kvg_session_kind.h: what a session is, as a table of operations (private).
 *
 * A model's sessions are of one kind: the local paged kind (session.c: tokens, logits and K/V
 * pages here) unless the model's load hung another kind on it (kvg_session_kind_attach), such
 * as the remote kind (core/remote/remote_session.c: a history that a server continues).
 * Callers go through the table; a kind that cannot do something lacks the capability, and
 * kvg_session_can refuses it with the kind's own message, in one place.
 *
 * Operations that the session layer runs (lifetime, length, reset, rewind, fork, cache info)
 * are in every kind's table. Operations that layers above run (saving, scoring choices, chat
 * turns, generation) are NULL in the local kind's table: those layers do them their own way
 * on local sessions (session_file.c, choose.c, chat.c, generate.c); a kind that sets them
 * does them itself. */
#ifndef KVG_SESSION_KIND_H
#define KVG_SESSION_KIND_H
#include <stdbool.h>
#include <stddef.h>
#include "kvg_buf.h"
#include "kvgen.h"

/* what a kind can do beyond the table's required operations */
typedef enum kvg_session_cap {
    KVG_CAN_TOKENS = 1,        /* token ids, logits and the cache: prefill, decode, read_cache, token prompts */
    KVG_CAN_TOKEN_JOBS = 2,    /* jobs whose prompt is token ids */
    KVG_CAN_BIAS = 4,          /* a sampler's logit bias (it names token ids) */
    KVG_CAN_CHAT_TEMPLATE = 8, /* chat templates set on the session */
} kvg_session_cap;

/* a reply a kind generates itself (kvg_session_kind.reply_start) */
typedef struct kvg_reply_request {
    const kvgen_sampler_desc *sampler;
    int max_tokens; /* < 0: no limit */
    bool ignore_eog;
    const char *grammar; /* GBNF the reply must follow; NULL: none */
    bool worker;         /* on the jobs' worker thread: the kind's drive runs the transfer */
} kvg_reply_request;

typedef struct kvg_session_kind {
    const char *name;
    unsigned caps; /* kvg_session_cap bits */
    /* The refusal of `cap` (one it lacks) by the public call fn, as KVGEN_E_*: on session s, or
     * at its creation on model m (s NULL). */
    kvgen_status (*refuse)(const kvgen_model *m, const kvgen_session *s, kvg_session_cap cap, const char *fn,
                           kvgen_error *err);

    /* ---- the model (state: kvg_session_kind_state) ---- */
    void (*model_free)(void *state);
    void (*model_info)(const kvgen_model *m, kvgen_model_info *info);
    /* the kind's lines of kvgen_model_describe (after "name:"), as snprintf writes them */
    size_t (*describe)(const kvgen_model *m, char *buf, size_t size);

    /* ---- sessions (state: kvgen_session.kind_state) ---- */
    kvgen_status (*init)(kvgen_session *s, kvgen_error *err); /* its state and storage, at creation */
    void (*free)(kvgen_session *s);
    size_t (*length)(const kvgen_session *s);
    void (*reset)(kvgen_session *s);
    kvgen_status (*rewind)(kvgen_session *s, size_t n, kvgen_error *err);
    kvgen_status (*fork)(kvgen_session *s, kvgen_session **child, kvgen_error *err);
    void (*cache_info)(const kvgen_session *s, kvgen_cache_info *info);

    /* ---- the layers above (NULL in the local kind) ---- */
    /* session files: the bytes saved after the kind's file header, and a session from them */
    char *(*save)(const kvgen_session *s, size_t *n); /* kvg_malloc'd; NULL when out of memory */
    kvgen_status (*restore)(kvgen_model *m, const char *bytes, size_t n, const char *who, kvgen_session **out,
                            kvgen_error *err);
    /* choices: each candidate's total log-probability and token count as a continuation */
    kvgen_status (*score)(kvgen_session *s, const char *const *cands, size_t n, double *logprob, int *n_tokens,
                          const char *who, kvgen_error *err);
    /* chat: a message joins the session (role NULL: a reply is to begin) */
    kvgen_status (*chat_turn)(kvgen_session *s, const char *role, const char *text, const char *fn,
                              kvgen_error *err);
    const char *chat_template_name;
    /* the chat read back: message i's role (NULL past the last) and content; and undone: the
     * last n messages (1 <= n <= their count) leave the session */
    const char *(*chat_message)(const kvgen_session *s, size_t i, const char **content);
    void (*chat_undo)(kvgen_session *s, size_t n);
    /* generation from text: the text joins the session (check_only: only the refusal, if any) */
    kvgen_status (*add_text)(kvgen_session *s, const char *text, size_t len, bool check_only, const char *who,
                             kvgen_error *err);
    /* replies the kind generates itself, streamed (see kvg_gen_reply_step) */
    kvgen_status (*reply_start)(kvgen_session *s, const kvg_reply_request *q, void **stream, const char *who,
                                kvgen_error *err);
    kvgen_status (*reply_pump)(void *stream, int wait_ms, kvg_buf *text, kvg_buf *ends, int *pieces,
                               kvgen_finish *finish, kvgen_error *err);
    void (*reply_free)(void *stream);
    /* the generated text joins the session (a stop string that ended it too, where it keeps one) */
    kvgen_status (*reply_commit)(kvgen_session *s, const char *text, size_t len, const char *stop, size_t stop_len,
                                 kvgen_error *err);
    /* the jobs' worker over such replies: requests at once, the transfers' pump, its wakeup,
     * and whether streams freed elsewhere wait for its pump to close them */
    int (*max_requests)(const kvgen_model *m);
    void (*drive)(const kvgen_model *m, int wait_ms);
    void (*wakeup)(const kvgen_model *m);
    bool (*has_freed)(const kvgen_model *m);
} kvg_session_kind;

/* The kind of a model's sessions: the one attached, else the local kind. */
const kvg_session_kind *kvg_session_kind_of(const kvgen_model *m);
/* The state the model's load gave with its kind (NULL for the local kind). */
void *kvg_session_kind_state(const kvgen_model *m);
/* Makes `kind` (with its model state, freed by kind->model_free at model free) the kind of m's
 * sessions. Once, at load, before any session exists. KVGEN_E_NO_MEMORY names `who`. */
kvgen_status kvg_session_kind_attach(kvgen_model *m, const kvg_session_kind *kind, void *state, const char *who,
                                     kvgen_error *err);
/* KVGEN_OK when the model's kind can do `cap`; else its refusal naming fn (s NULL: at creation). */
kvgen_status kvg_session_can(const kvgen_model *m, const kvgen_session *s, kvg_session_cap cap, const char *fn,
                             kvgen_error *err);
/* whether the kind generates its replies itself (reply_start) */
bool kvg_session_kind_replies(const kvg_session_kind *k);

#endif
