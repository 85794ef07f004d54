/* kvg_generate.h: pieces of the generation layer that the job worker shares (private).
 *
 * Folder core/generate/ owns turning logits into text: the sampler (sampler.c), generation
 * with stop strings and finish reasons (generate.c), chat templates and turns (chat.c),
 * constrained output (constrain.c), choice scoring (choose.c) and token pieces (spell.c). It
 * drives sessions and never reaches a backend directly. It also holds the memory store
 * (memory.c), which uses the cpu layer's vector kernels (kvg_vec_ops) and no session. Folder core/jobs/ (worker.c), above it,
 * runs generations as jobs on one worker thread per model, batching their sessions' steps. */
#ifndef KVG_GENERATE_H
#define KVG_GENERATE_H
#include <stdbool.h>
#include <stddef.h>
#include "kvg_buf.h"
#include "kvgen.h"

/* Checks a generation desc's stop strings and flags exactly as kvgen_gen_begin does, so a job
 * is refused at submit for the same reasons. Messages read "<who>: <field>n_stop ...". */
kvgen_status kvg_gen_check_desc(const kvgen_generate_desc *d, const char *who, const char *field, kvgen_error *err);

/* The chat layer's state of a session (chat.c; kvg_session_ext), for the layers that save,
 * restore or take back a turn:
 *   kvg_chat_saved_size / kvg_chat_save  its serialised form (0 bytes: no conversation)
 *   kvg_chat_load        replaces it by a serialised form (size 0: none); on error the
 *                        session's is as it was
 *   kvg_chat_mark        a copy of it as it is now (NULL: no conversation)
 *   kvg_chat_return_to   puts a mark back in its place (taking it), dropping the present one
 *   kvg_chat_mark_free   drops a mark not put back (NULL: nothing) */
typedef struct kvg_chat kvg_chat;
size_t kvg_chat_saved_size(const kvgen_session *s);
void kvg_chat_save(const kvgen_session *s, unsigned char *buf);
kvgen_status kvg_chat_load(kvgen_session *s, const unsigned char *buf, size_t size, kvgen_error *err);
kvgen_status kvg_chat_mark(const kvgen_session *s, kvg_chat **mark, kvgen_error *err);
void kvg_chat_return_to(kvgen_session *s, kvg_chat *mark);
void kvg_chat_mark_free(kvg_chat *mark);

/* Checks chat variables as kvgen_chat_set_vars does (JSON text of an object, none of the chat's
 * own names; messages read "<fn>: <what>: ..."); *out gets them as compact JSON text, NULL for
 * json NULL or an empty object (the caller frees it). */
kvgen_status kvg_chat_vars_check(const char *json, const char *fn, const char *what, char **out, kvgen_error *err);

/* kvgen_gen_begin without the logits check (chat.c): checks the desc and builds the generator
 * before the prompt goes in, so that nothing can fail once it is in. Messages name `who`. */
kvgen_status kvg_gen_create(kvgen_session *s, const kvgen_generate_desc *desc, kvgen_gen **out, const char *who,
                            kvgen_error *err);

/* The Jinja template that renders the session's chat (src, len: valid while the chat's
 * template stays), or KVGEN_E_UNSUPPORTED naming who: a built-in family or a remote session. */
kvgen_status kvg_chat_jinja_source(kvgen_session *s, const char *who, const char **src, size_t *len,
                                   kvgen_error *err);

/* kvgen_chat_gen_begin without tools (chat.c); chat_tools.c's kvgen_chat_gen_begin takes
 * them and calls it for a reply without. */
kvgen_status kvg_chat_gen_begin(kvgen_session *s, const char *role, const char *text, const kvgen_generate_desc *desc,
                                kvgen_gen **out, kvgen_error *err);
/* A chat reply the generator reads at its end (chat_tools.c attaches it): the reasoning between
 * think_open and think_close (NULL: none) taken out of the text, and with tools t (NULL: none;
 * taken) the calls read. When a reply that ended on its own had reasoning or called tools,
 * `reply` gets the session, the text left, the reasoning and the calls (JSON; NULL where none)
 * to put into the conversation (a callback, so that generate.c calls no chat code). thinking:
 * the prompt ended with think_open (the reply starts inside its reasoning). */
struct kvg_tools;
typedef kvgen_status (*kvg_reply_fn)(kvgen_session *s, const char *content, const char *reasoning,
                                     const char *calls_json, kvgen_error *err);
void kvg_gen_attach_reply(kvgen_gen *g, struct kvg_tools *t, const char *think_open, const char *think_close,
                          bool thinking, kvg_reply_fn reply);

/* A chat reply with tools in two steps, for the jobs' worker, which puts the turn in between:
 *   kvg_chat_offer_tools  the tools built for the session's template and made its "tools"
 *                         variable (errors name who; on failure nothing changed)
 *   kvg_chat_reply_gen    once the turn is in: the reply's generator (desc without its tools,
 *                         a forced call's grammar as its constraint), read at its end for its
 *                         reasoning under a template with think tags and for calls with t
 *                         (NULL: none; taken, also on failure) */
kvgen_status kvg_chat_offer_tools(kvgen_session *s, const kvgen_tools_desc *td, const char *who,
                                  struct kvg_tools **out, kvgen_error *err);
kvgen_status kvg_chat_reply_gen(kvgen_session *s, const kvgen_generate_desc *desc, struct kvg_tools *t,
                                const char *who, kvgen_gen **out, kvgen_error *err);

/* kvgen_chat_begin whose tokens are appended to *out instead of prefilled (the jobs' worker
 * prefills them in chunks); the chat state is advanced as if they were. */
struct kvg_tokens;
kvgen_status kvg_chat_begin_tokens(kvgen_session *s, const char *role, const char *text, struct kvg_tokens *out,
                                   kvgen_error *err);

/* kvgen_gen_next in two steps, so that the jobs' worker can decode many generations' tokens in
 * one batch (kvg_session_decode_batch) between them, and nothing needs to steer the session:
 *   kvg_gen_sample  everything before the decode: cancellation, constraint masks, sampling.
 *                   *token >= 0: decode it, then commit; -1: the step is over (step filled,
 *                   the return value is kvgen_gen_next's).
 *   kvg_gen_commit  everything after: `decoded` / derr are the decode's outcome (context full
 *                   ends the generation), then the token's text, stop strings, limits.
 * kvgen_gen_next is sample, kvgen_session_decode, commit. */
kvgen_status kvg_gen_sample(kvgen_gen *g, kvgen_gen_step *step, int32_t *token, kvgen_error *err);
kvgen_status kvg_gen_commit(kvgen_gen *g, kvgen_gen_step *step, int32_t token, kvgen_status decoded,
                            const kvgen_error *derr, kvgen_error *err);

/* A generation on a session whose kind generates its replies itself (kvg_session_kind.h; a
 * remote session: its server): takes what the reply's stream sent (waiting up to wait_ms for it
 * on a stream of the calling thread's own; the jobs' worker runs the kind's drive itself) and
 * emits it as kvgen_gen_next would, stop strings held back; *pieces is how many reply events
 * came in (tokens, as far as kvgen can tell). A step without news has empty text and token -1. */
kvgen_status kvg_gen_reply_step(kvgen_gen *g, int wait_ms, kvgen_gen_step *step, int *pieces, kvgen_error *err);

#endif
