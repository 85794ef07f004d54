/* kvg_remote.h: models served by an OpenAI-compatible HTTP server (private; docs/remote.md).
 *
 * Folder core/remote/ owns everything that talks to the server: the connection (libcurl),
 * the requests (JSON through the codec, kvg_json.h), the streamed replies (server-sent
 * events, parsed as the bytes arrive) and a remote session's history (its text, or its chat
 * messages), which is what each request sends so that the server's prefix cache finds the
 * part it has seen.
 * Layers above (session/, generate/, jobs/) call down into it; it calls nothing above.
 *
 * Builds without libcurl compile stubs: kvg_remote_open refuses with KVGEN_E_UNSUPPORTED,
 * and no remote model can exist, so nothing else is reached. */
#ifndef KVG_REMOTE_H
#define KVG_REMOTE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvg_buf.h"
#include "kvgen.h"

typedef struct kvg_remote kvg_remote;   /* a server and model: the jobs' connection pool */
typedef struct kvg_rhist kvg_rhist;     /* one session's history */
typedef struct kvg_rstream kvg_rstream; /* one streamed generation request */

/* remote_session.c: a model served at desc->path: connects (kvg_remote_open), takes the
 * server's model name and makes the model's sessions the remote kind (kvg_session_kind.h). */
kvgen_status kvg_remote_load(kvgen_model *m, const kvgen_model_desc *desc, kvgen_error *err);
/* true when the path names a server (http:// or https://) */
bool kvg_remote_is_url(const char *path);
/* A copy of url (kvg_malloc'd; NULL when out of memory) to show in messages and logs: the
 * password of its userinfo ("http://user:pw@host") as "***". */
char *kvg_remote_redact_url(const char *url);
/* Connects (GET <base>/models), checks or picks the model name, all within remote_timeout_ms
 * (retries included). Errors name the URL (without its password). */
kvgen_status kvg_remote_open(const kvgen_model_desc *desc, kvg_remote **out, kvgen_error *err);
void kvg_remote_close(kvg_remote *r);
const char *kvg_remote_model_name(const kvg_remote *r);
const char *kvg_remote_url(const kvg_remote *r); /* as shown: without its password */
int kvg_remote_max_requests(const kvg_remote *r);

/* ---- history: text (completions) or chat messages (chat completions), never both.
 * Its length counts bytes: a text's bytes, or per message its content's bytes + 1. ---- */
typedef enum kvg_rmode { KVG_RMODE_EMPTY, KVG_RMODE_TEXT, KVG_RMODE_CHAT } kvg_rmode;

kvg_rhist *kvg_rhist_new(void);
void kvg_rhist_free(kvg_rhist *h);
kvg_rhist *kvg_rhist_clone(const kvg_rhist *h); /* NULL when out of memory */
kvg_rmode kvg_rhist_mode(const kvg_rhist *h);
size_t kvg_rhist_length(const kvg_rhist *h);
void kvg_rhist_reset(kvg_rhist *h);
/* Appends text (mode TEXT); refused in a chat. */
kvgen_status kvg_rhist_add_text(kvg_rhist *h, const char *text, size_t len, const char *who, kvgen_error *err);
/* Appends a message (mode CHAT); refused after text. role: "system", "user" or "assistant". */
kvgen_status kvg_rhist_add_message(kvg_rhist *h, const char *role, const char *text, size_t len, const char *who,
                                   kvgen_error *err);
/* Removes the last n units (bytes of text; in a chat only whole messages: n must end on a
 * message boundary, else KVGEN_E_INVALID_ARGUMENT naming the lengths). */
kvgen_status kvg_rhist_rewind(kvg_rhist *h, size_t n, const char *who, kvgen_error *err);
size_t kvg_rhist_n_messages(const kvg_rhist *h);
/* Message i's role (NULL past the last) and its content. */
const char *kvg_rhist_message(const kvg_rhist *h, size_t i, const char **content);
/* Removes the last n messages (n at most their count). */
void kvg_rhist_drop(kvg_rhist *h, size_t n);
/* The whole history as JSON text (malloc'd by kvg_malloc), and back. */
char *kvg_rhist_to_json(const kvg_rhist *h, const kvgen_sampler_desc *sampler, const char *model, size_t *len);
kvgen_status kvg_rhist_from_json(const char *json, size_t len, kvg_rhist **out, kvgen_sampler_desc *sampler,
                                 kvgen_logit_bias **bias, const char *who, kvgen_error *err);

/* ---- generation requests ---- */
typedef struct kvg_rrequest {
    const kvg_rhist *hist;            /* text: /completions; chat: /chat/completions */
    const kvgen_sampler_desc *sampler;
    int max_tokens;                   /* < 0: no limit */
    bool ignore_eog;
    const char *grammar;              /* GBNF sent as "grammar"; NULL: none */
} kvg_rrequest;

/* Starts a streamed request. worker: the transfer joins the model's shared pool, driven by
 * kvg_remote_drive on the jobs' worker thread; else it has its own and kvg_rstream_pump drives
 * it. Nothing is sent before the first drive or pump. */
kvgen_status kvg_rstream_start(kvg_remote *r, const kvg_rrequest *q, bool worker, kvg_rstream **out,
                               const char *who, kvgen_error *err);
/* Takes what arrived (waiting up to wait_ms for something when the stream has its own
 * transfer): new text is appended to `text`, *pieces counts its events, and `ends` (NULL: not
 * wanted) gets where each event's text ends, as size_t offsets from the start of what was
 * appended; once the reply is over *finish is set (STOP, LENGTH, or ERROR with the error
 * returned). Messages show the URL without its password, and never the API key. */
kvgen_status kvg_rstream_pump(kvg_rstream *st, int wait_ms, kvg_buf *text, kvg_buf *ends, int *pieces,
                              kvgen_finish *finish, kvgen_error *err);
/* Closes the transfer (a cancel: the server sees the connection close): at once on the thread
 * that drives its pool, else at that thread's next kvg_remote_drive. NULL is ignored. */
void kvg_rstream_free(kvg_rstream *st);
/* The jobs' worker: runs the shared pool's transfers, waiting up to wait_ms for news. */
void kvg_remote_drive(kvg_remote *r, int wait_ms);
/* Any thread: whether streams freed off the worker wait for its kvg_remote_drive to close them. */
bool kvg_remote_has_freed(kvg_remote *r);
/* Any thread: ends a kvg_remote_drive wait now (new work for the worker). */
void kvg_remote_wakeup(kvg_remote *r);
/* Streams of the shared pool that are sending or waiting to retry. */
int kvg_remote_active(const kvg_remote *r);

/* Total log-probability of each candidate as a continuation of a text history, from the
 * prompt log-probabilities the server echoes (/completions, echo, logprobs). A server that
 * returns none: KVGEN_E_UNSUPPORTED. */
kvgen_status kvg_remote_score(kvg_remote *r, const kvg_rhist *h, const char *const *cands, size_t n, double *logprob,
                              int *n_tokens, const char *who, kvgen_error *err);

#endif
