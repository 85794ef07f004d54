/* kvg_session.h: a session's state, shared by session.c (the public session calls), the
 * layers above (generation, chat, session files in generate/, the jobs' worker) (private).
 *
 * Folder core/session/ owns sessions over a loaded model, whose K/V live in the model's page
 * pool (model/kvpool.c, kvg_pool.h): the public session calls that turn appends, rewinds, forks and
 * shifts into page-table edits and batches for the backend (session.c), the state the layers
 * above hang on a session (session_ext.c) and the sampler (sampler.c). */
#ifndef KVG_SESSION_H
#define KVG_SESSION_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvg_adapter.h"
#include "kvg_backend.h"
#include "kvg_pool.h"
#include "kvg_sampler.h"
#include "kvg_session_kind.h"

/* Sessions beyond this many positions are refused: it keeps every size computation far
 * from overflow and catches a garbage n_ctx before it asks for terabytes. */
#define KVG_MAX_CTX (1 << 20)
#define KVG_DEFAULT_CTX 4096
/* "every position is a fresh computation" (see clean_len) */
#define KVG_CLEAN_ALL SIZE_MAX

/* State a layer above keeps per session (the chat layer's conversation), hung on the session
 * under its ops, which are the key: the session frees it (close, reset), clones it (fork) and
 * tells it of a context shift; the layer that owns it saves and restores it. */
typedef struct kvg_session_ext_ops {
    const char *name;
    void (*free)(void *state);
    kvgen_status (*clone)(void **dst, const void *src, kvgen_error *err);
    /* the context shifted: tokens [keep, keep + drop) are gone, the rest moved down by drop */
    void (*shifted)(void *state, size_t keep, size_t drop);
} kvg_session_ext_ops;
#define KVG_SESSION_EXTS 4 /* kinds of state the layers above may hang on one session */

/* a growable token list */
typedef struct kvg_tokens {
    int32_t *v;
    size_t n, cap;
} kvg_tokens;

struct kvgen_session {
    kvgen_model *model; /* holds one reference */
    kvg_backend_session *bs;
    int n_ctx;
    bool no_cache;
    kvgen_on_full on_full;
    int keep;          /* shift: tokens never dropped */
    bool prefix_reuse; /* take and offer pages through the pool's prefix cache */
    int32_t *tokens;   /* n_ctx entries; the first n_tokens are in the cache */
    size_t n_tokens;
    float *logits; /* n_vocab */
    bool has_logits;
    /* the backend kept them (KVG_OUT_KEEP): s->logits is filled on first use (kvg_session_host_logits) */
    bool logits_on_device;
    bool full_logits; /* KVGEN_FULL_LOGITS=1 at creation: always read the whole vector back (tests, bench) */
    kvg_sampler sampler;
    /* the layers' state (kvg_session_ext): slots with ops == NULL are free */
    struct {
        const kvg_session_ext_ops *ops;
        void *state;
    } ext[KVG_SESSION_EXTS];

    /* paged KV (the model's pools, one per layer group: m->kv) */
    int n_groups;                        /* m->kv.n_groups */
    int32_t *pages[KVG_KV_GROUPS];       /* page tables: ceil(n_ctx / page_size) entries each; the
                                            first n_pages in use */
    size_t n_pages;                      /* == ceil(n_tokens / page_size) between calls */
    /* entries [lo[g], n_pages) of table g are held; below lo[g] they are -1: released, since no
     * layer of a group with a window can see them any more (0 for a group without one) */
    size_t lo[KVG_KV_GROUPS];
    uint64_t *page_hash; /* prefix-cache key of each full page below clean_len */
    /* Positions [0, clean_len) hold exactly the K/V a fresh run of tokens[0..] computes; a
     * shift breaks that for the moved tokens (they saw the dropped ones), and such pages must
     * never be offered to other sessions as the K/V of their tokens. */
    size_t clean_len;
    size_t tokens_reused; /* prefix-cache hits, in tokens */
    /* the LoRA adapters the session runs with (session_lora.c); the prefix cache keys its
     * pages under the set (kvg_session_hash_root) */
    kvg_lora_set lora;
    size_t shifts;

    /* worker.c, under its lock: the session's jobs that are not final (read atomically); while
     * it is not 0 the session belongs to the model's worker (kvgen_session_busy) */
    int jobs_active;

    /* what the session is (kvg_session_kind.h): the local kind uses the fields above; another
     * kind keeps its own state here instead (no tokens, logits or pages) */
    const kvg_session_kind *kind;
    void *kind_state;
};

/* The model whose jobs worker this thread is, if it is one (worker.c sets it once): its calls
 * on that model's sessions are never refused as busy. */
extern _Thread_local const struct kvgen_model *kvg_session_worker_thread;

/* s->logits filled from the device when the backend kept them there; KVGEN_E_* when they
 * cannot be (the session then has no logits). */
kvgen_status kvg_session_host_logits(kvgen_session *s, kvgen_error *err);

/* One decode each of ss[0..n) (distinct sessions of one model; tokens[i] on ss[i]) as one batch
 * for the backend, so each weight is read once for all of them (the jobs' worker, choice
 * scoring). Each session's outcome is status[i] / errs[i], as kvgen_session_decode would give
 * it alone; a session whose decode failed is as it was (its logits aside). host_logits: every
 * session's logits come back to s->logits; else they may stay on the device with the sampler's
 * selection, as after a single decode. Returns the first failure, or KVGEN_OK. */
kvgen_status kvg_session_decode_batch(kvgen_session *const *ss, const int32_t *tokens, int n, bool host_logits,
                                      kvgen_status *status, kvgen_error *errs);
/* The same with counts[i] > 0 tokens for ss[i] (tokens[i][0..counts[i])): short prompts of many
 * sessions and their decodes as one batch. Each session ends as kvgen_session_prefill of its
 * tokens would leave it (a session without a cache, or a sequence longer than a page, which the
 * prefix cache may serve, runs on its own). */
kvgen_status kvg_session_run_batch(kvgen_session *const *ss, const int32_t *const *tokens, const int *counts, int n,
                                   bool host_logits, kvgen_status *status, kvgen_error *errs);
/* KVGEN_OK unless a job on the session is not final (kvgen_session_busy) and the caller is not
 * the model's worker thread; then KVGEN_E_INVALID_ARGUMENT naming `fn` and the session. The
 * public calls that use a session start with it. */
kvgen_status kvg_session_check_host(const kvgen_session *s, const char *fn, kvgen_error *err);

/* A new empty session with the given (validated) options; the sampler is initialised from
 * desc unless `like` is given, whose sampler and layers' state are cloned. Used by create,
 * fork and restore. */
kvgen_status kvg_session_new(kvgen_model *model, const kvgen_session_desc *desc, const kvgen_session *like,
                             kvgen_session **out, kvgen_error *err);
/* The state hung on s under `ops`, or NULL. */
void *kvg_session_ext(const kvgen_session *s, const kvg_session_ext_ops *ops);
/* Hangs `state` on s under `ops`, freeing what was there (state NULL: only frees it).
 * KVGEN_E_NO_MEMORY, with s as it was and `state` not taken, when every slot is held. */
kvgen_status kvg_session_set_ext(kvgen_session *s, const kvg_session_ext_ops *ops, void *state, kvgen_error *err);
/* Takes the state under `ops` off s without freeing it (the caller owns it now), or NULL. */
void *kvg_session_take_ext(kvgen_session *s, const kvg_session_ext_ops *ops);
/* for session.c: frees every state (close, reset); copies src's into an empty dst (fork) */
void kvg_session_ext_free_all(kvgen_session *s);
kvgen_status kvg_session_ext_clone_all(kvgen_session *dst, const kvgen_session *src, kvgen_error *err);
/* A new empty session with s's options and a copy of its sampler and layers' state (a fork's
 * child, before the kind copies what the session holds). */
/* Runs tokens[0, n) through a fresh session (nothing run yet) at positions 0.. and writes each
 * token's final hidden state after the output norm (n * n_embd floats) into hidden instead of
 * logits: a decoder's embedding (kvgen_embed). The session then has no logits; close it.
 * KVGEN_E_UNSUPPORTED on a backend without ops->hidden_out. */
kvgen_status kvg_session_hidden(kvgen_session *s, const int32_t *tokens, size_t n, float *hidden, kvgen_error *err);
kvgen_status kvg_session_new_like(kvgen_session *s, kvgen_session **child, kvgen_error *err);
/* Makes `n` positions [n_tokens, n_tokens+n) hold `tokens` with the K/V given per layer by
 * `kv` ([layer][K|V][Hkv][n][hd] f32), without running the model (restore): the pages are
 * written. */
kvgen_status kvg_session_load_kv(kvgen_session *s, const int32_t *tokens, size_t n, const float *kv,
                                 kvgen_error *err);

/* The parent hash of the session's first page in the prefix cache: KVG_PAGE_HASH_ROOT, or the
 * key of its adapter set (kvg_lora_set_key), so pages computed under different adapters never
 * meet. */
uint64_t kvg_session_hash_root(const kvgen_session *s);
/* Makes `set` the session's adapters (its references move to the session; the old set is
 * released). K/V computed under another set stop being offered through the prefix cache. The
 * caller has checked the set (kvgen_session_set_adapters, restore). */
void kvg_session_take_lora(kvgen_session *s, kvg_lora_set *set);
/* The backend-run checks of a set of n adapters for s: KVGEN_OK, or KVGEN_E_UNSUPPORTED naming
 * `fn` (a kind without a cache of its own, a backend without LoRA). */
kvgen_status kvg_session_can_lora(const kvgen_session *s, const char *fn, kvgen_error *err);

/* KVGEN_E_UNSUPPORTED naming `fn` when s's kind has no token ids, logits or cache of its own
 * (kvg_session_can, KVG_CAN_TOKENS); else KVGEN_OK. */
kvgen_status kvg_session_local_only(const kvgen_session *s, const char *fn, kvgen_error *err);

/* session_file.c: the identity hash of a model (session files): hyperparameters, tensor names/types/shapes and a
 * sample of every tensor's bytes. */
uint64_t kvg_model_identity(const kvgen_model *m);

#endif
