/* kvg_pool.h: the model's pool of fixed-size KV pages (private).
 *
 * The pool only does bookkeeping; the K/V storage of a page belongs to the backend, which the
 * pool asks to commit a page the first time it is handed out. A page id is an index in
 * [0, n_pages). Every page is in exactly one state:
 *   untouched  never handed out, no storage yet;
 *   free       storage committed, held by nobody;
 *   used       held by refcount >= 1 session page tables (copy-on-write when > 1);
 *   cached     held by nobody but published in the prefix cache: its tokens and the hash chain
 *              of its parents are known, so a new session with the same prefix takes it back
 *              instead of recomputing. Cached pages are reclaimed least recently released first.
 * A published page is immutable: a session that wants to write into one it holds alone
 * claims it (kvg_pool_claim), which withdraws it from the prefix cache first.
 *
 * Thread safety: every call takes the pool's mutex, so sessions of one model may run on
 * different threads. Page contents are written only by the one session that holds the page
 * alone, so they need no lock. */
#ifndef KVG_POOL_H
#define KVG_POOL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvgen.h"

typedef struct kvg_pool kvg_pool;

/* Gives page `page` its storage; called under the pool's lock, once per page. */
typedef kvgen_status (*kvg_page_commit_fn)(void *ctx, int32_t page, kvgen_error *err);

kvgen_status kvg_pool_create(int page_size, int32_t n_pages, size_t bytes_per_page, kvg_page_commit_fn commit,
                             void *commit_ctx, kvg_pool **out, kvgen_error *err);
void kvg_pool_destroy(kvg_pool *p);

int kvg_pool_page_size(const kvg_pool *p);
size_t kvg_pool_bytes_per_page(const kvg_pool *p);

/* A page with refcount 1 (free first, then untouched, then the least recently cached one).
 * KVGEN_E_POOL_FULL when every page is used; KVGEN_E_NO_MEMORY when committing storage failed. */
kvgen_status kvg_pool_alloc(kvg_pool *p, int32_t *page, kvgen_error *err);
void kvg_pool_retain(kvg_pool *p, int32_t page);
/* Drops one reference; at zero the page becomes cached when published, else free. */
void kvg_pool_release(kvg_pool *p, int32_t page);
int kvg_pool_refcount(kvg_pool *p, int32_t page);
/* True when the caller, holding one reference, may write into the page in place: nobody else
 * holds it. It is withdrawn from the prefix cache in the same step, so no session can take it
 * between the check and the write. False: copy it to a fresh page first. */
bool kvg_pool_claim(kvg_pool *p, int32_t page);

/* Prefix cache, keyed vLLM style: hash(parent's hash, the page's tokens). The first page's
 * parent hash is KVG_PAGE_HASH_ROOT. */
#define KVG_PAGE_HASH_ROOT 0x6b76676e2d6b7631ull /* "kvgn-kv1" */
uint64_t kvg_page_hash(uint64_t parent, const int32_t *tokens, int n);
/* A full page with these exact tokens under this parent, with one more reference; -1: none. */
int32_t kvg_pool_lookup(kvg_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens);
/* Offers a full page the caller holds to other sessions. No-op when an equal page is already
 * published (two sessions computed the same prefix independently: the first one stays). */
void kvg_pool_publish(kvg_pool *p, int32_t page, uint64_t hash, uint64_t parent, const int32_t *tokens);

typedef struct kvg_pool_stats {
    int32_t total, used, free, cached, committed;
} kvg_pool_stats;
void kvg_pool_get_stats(kvg_pool *p, kvg_pool_stats *st);

/* ---- what K/V pages hold -------------------------------------------------------------------
 * One row per type a KV page may hold (kvpool.c's table): its name (kvgen_model_desc.kv_type)
 * and the tensor type of its elements, whose block layout, quantizer and dequantizer are
 * kvg_quant.h's. A page row of head_dim elements is whole blocks of that type. A backend lists
 * the types it stores (kvg_backend_ops.kv_types, its default first); nothing else switches on
 * a KV type outside the backends' own tables. */
typedef struct kvg_kv_type_row {
    const char *name; /* "f16", "q8_0", ... */
    uint32_t type;    /* KVG_TYPE_* */
} kvg_kv_type_row;
/* the row named `name`, NULL when there is none */
const kvg_kv_type_row *kvg_kv_type_named(const char *name);
/* the name of KV type `type` ("f16"), or "?" when no row holds it */
const char *kvg_kv_type_name(uint32_t type);
/* "f16, q8_0, q4_0" into buf: the names of n types, or of every row when types is NULL */
void kvg_kv_type_names(const uint32_t *types, size_t n, char *buf, size_t size);
/* The type m's pages hold, into m->kv_type, as the load asked (name; NULL or "": the backend's
 * default). KVGEN_E_INVALID_ARGUMENT for a name no row has; KVGEN_E_UNSUPPORTED for one the
 * backend does not store, or whose blocks do not tile head_dim: each names the function, the
 * argument and the value. Called by the load before the backend's model_init. */
kvgen_status kvg_model_kv_type_choose(kvgen_model *m, const char *name, kvgen_error *err);

/* Sets the model's layer groups (m->kv) and creates one page pool per group (m->pools);
 * called by kvgen_model_load after the backend started. */
kvgen_status kvg_model_pool_init(kvgen_model *m, const kvgen_model_desc *desc, kvgen_error *err);
/* Destroys the pools and the layout (model unload); safe on a model that has none. */
void kvg_model_pools_free(kvgen_model *m);
/* K+V bytes of one position of a group's layers */
size_t kvg_model_group_bytes_per_token(const kvgen_model *m, int group);

#endif
