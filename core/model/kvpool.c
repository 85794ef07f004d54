/* kvpool.c: bookkeeping of the KV page pool (see kvg_pool.h). */
#define _POSIX_C_SOURCE 200809L
#include "kvg_backend.h"
#include "kvg_platform.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_pool.h"
#include "kvg_types.h"

enum { PAGE_UNTOUCHED = 0, PAGE_FREE, PAGE_USED, PAGE_CACHED };

struct kvg_pool {
    kvg_mutex mu;
    int page_size;
    int32_t n_pages;
    size_t bytes_per_page;
    kvg_page_commit_fn commit;
    void *commit_ctx;

    /* per page */
    uint8_t *state;
    int32_t *refcount;
    bool *published;
    uint64_t *hash, *parent; /* published pages: key and the parent hash it was computed under */
    int32_t *tokens;         /* published pages: [n_pages][page_size] */
    int32_t *next_in_bucket; /* hash chain */
    int32_t *lru_prev, *lru_next; /* cached pages, oldest at lru_head */

    int32_t *free_stack; /* committed pages held by nobody and not published */
    int32_t n_free;
    int32_t n_touched; /* pages [0, n_touched) have storage; the rest are handed out in order */
    int32_t n_used, n_cached;
    int32_t lru_head, lru_tail;

    int32_t *buckets; /* n_buckets heads, -1 = empty */
    uint32_t n_buckets; /* a power of two */
};

static void *alloc_array(size_t n, size_t size) { return kvg_calloc(n ? n : 1, size); }

kvgen_status kvg_pool_create(int page_size, int32_t n_pages, size_t bytes_per_page, kvg_page_commit_fn commit,
                             void *commit_ctx, kvg_pool **out, kvgen_error *err) {
    *out = NULL;
    if (page_size <= 0 || n_pages <= 0 || !commit)
        return kvg_fail(err, KVGEN_E_INTERNAL, "kv pool: bad geometry (%d tokens x %d pages)", page_size, (int)n_pages);
    kvg_pool *p = kvg_calloc(1, sizeof *p);
    if (!p) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kv pool: out of memory");
    p->page_size = page_size;
    p->n_pages = n_pages;
    p->bytes_per_page = bytes_per_page;
    p->commit = commit;
    p->commit_ctx = commit_ctx;
    size_t n = (size_t)n_pages;
    p->n_buckets = 16;
    while (p->n_buckets < 2 * n && p->n_buckets < (1u << 30)) p->n_buckets <<= 1;
    p->state = alloc_array(n, sizeof *p->state);
    p->refcount = alloc_array(n, sizeof *p->refcount);
    p->published = alloc_array(n, sizeof *p->published);
    p->hash = alloc_array(n, sizeof *p->hash);
    p->parent = alloc_array(n, sizeof *p->parent);
    p->tokens = alloc_array(n * (size_t)page_size, sizeof *p->tokens);
    p->next_in_bucket = alloc_array(n, sizeof *p->next_in_bucket);
    p->lru_prev = alloc_array(n, sizeof *p->lru_prev);
    p->lru_next = alloc_array(n, sizeof *p->lru_next);
    p->free_stack = alloc_array(n, sizeof *p->free_stack);
    p->buckets = alloc_array(p->n_buckets, sizeof *p->buckets);
    if (!p->state || !p->refcount || !p->published || !p->hash || !p->parent || !p->tokens || !p->next_in_bucket ||
        !p->lru_prev || !p->lru_next || !p->free_stack || !p->buckets) {
        kvg_pool_destroy(p);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "kv pool: out of memory for %d pages", (int)n_pages);
    }
    for (uint32_t i = 0; i < p->n_buckets; i++) p->buckets[i] = -1;
    p->lru_head = p->lru_tail = -1;
    kvg_mutex_init(&p->mu);
    *out = p;
    return KVGEN_OK;
}

void kvg_pool_destroy(kvg_pool *p) {
    if (!p) return;
    if (p->state) kvg_mutex_destroy(&p->mu);
    kvg_free(p->state);
    kvg_free(p->refcount);
    kvg_free(p->published);
    kvg_free(p->hash);
    kvg_free(p->parent);
    kvg_free(p->tokens);
    kvg_free(p->next_in_bucket);
    kvg_free(p->lru_prev);
    kvg_free(p->lru_next);
    kvg_free(p->free_stack);
    kvg_free(p->buckets);
    kvg_free(p);
}

int kvg_pool_page_size(const kvg_pool *p) { return p->page_size; }
size_t kvg_pool_bytes_per_page(const kvg_pool *p) { return p->bytes_per_page; }

/* ---- prefix-cache index (callers hold the lock) ---------------------------------------- */

static uint32_t bucket_of(const kvg_pool *p, uint64_t hash) { return (uint32_t)(hash ^ (hash >> 32)) & (p->n_buckets - 1); }

static void index_remove(kvg_pool *p, int32_t page) {
    int32_t *link = &p->buckets[bucket_of(p, p->hash[page])];
    while (*link != -1 && *link != page) link = &p->next_in_bucket[*link];
    if (*link == page) *link = p->next_in_bucket[page];
    p->published[page] = false;
}

static void lru_unlink(kvg_pool *p, int32_t page) {
    int32_t a = p->lru_prev[page], b = p->lru_next[page];
    if (a >= 0) p->lru_next[a] = b;
    else p->lru_head = b;
    if (b >= 0) p->lru_prev[b] = a;
    else p->lru_tail = a;
}

static void lru_push(kvg_pool *p, int32_t page) {
    p->lru_prev[page] = p->lru_tail;
    p->lru_next[page] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = page;
    else p->lru_head = page;
    p->lru_tail = page;
}

static int32_t find_locked(const kvg_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    for (int32_t q = p->buckets[bucket_of(p, hash)]; q != -1; q = p->next_in_bucket[q])
        if (p->hash[q] == hash && p->parent[q] == parent &&
            memcmp(p->tokens + (size_t)q * p->page_size, tokens, (size_t)p->page_size * sizeof *tokens) == 0)
            return q;
    return -1;
}

/* ---- pages ------------------------------------------------------------------------------ */

static void take(kvg_pool *p, int32_t page) {
    p->state[page] = PAGE_USED;
    p->refcount[page] = 1;
    p->n_used++;
}

kvgen_status kvg_pool_alloc(kvg_pool *p, int32_t *page, kvgen_error *err) {
    *page = -1;
    kvgen_status st = KVGEN_OK;
    kvg_mutex_lock(&p->mu);
    if (p->n_free > 0) {
        *page = p->free_stack[--p->n_free];
    } else if (p->n_touched < p->n_pages) {
        int32_t q = p->n_touched;
        st = p->commit(p->commit_ctx, q, err);
        if (st == KVGEN_OK) {
            p->n_touched++;
            *page = q;
        }
    } else if (p->lru_head >= 0) {
        /* every page has been used: reclaim the cached page released longest ago */
        int32_t q = p->lru_head;
        lru_unlink(p, q);
        index_remove(p, q);
        p->n_cached--;
        *page = q;
    } else {
        st = kvg_fail(err, KVGEN_E_POOL_FULL,
                      "KV pool full: all %d pages (%d tokens each) are held by sessions; close or rewind sessions, "
                      "or load the model with a larger kv_pool_bytes",
                      (int)p->n_pages, p->page_size);
    }
    if (*page >= 0) take(p, *page);
    kvg_mutex_unlock(&p->mu);
    return st;
}

void kvg_pool_retain(kvg_pool *p, int32_t page) {
    kvg_mutex_lock(&p->mu);
    p->refcount[page]++;
    kvg_mutex_unlock(&p->mu);
}

void kvg_pool_release(kvg_pool *p, int32_t page) {
    if (page < 0) return;
    kvg_mutex_lock(&p->mu);
    if (--p->refcount[page] == 0) {
        p->n_used--;
        if (p->published[page]) {
            p->state[page] = PAGE_CACHED;
            lru_push(p, page);
            p->n_cached++;
        } else {
            p->state[page] = PAGE_FREE;
            p->free_stack[p->n_free++] = page;
        }
    }
    kvg_mutex_unlock(&p->mu);
}

int kvg_pool_refcount(kvg_pool *p, int32_t page) {
    kvg_mutex_lock(&p->mu);
    int r = p->refcount[page];
    kvg_mutex_unlock(&p->mu);
    return r;
}

bool kvg_pool_claim(kvg_pool *p, int32_t page) {
    kvg_mutex_lock(&p->mu);
    bool alone = p->refcount[page] == 1;
    if (alone && p->published[page]) index_remove(p, page);
    kvg_mutex_unlock(&p->mu);
    return alone;
}

/* ---- prefix cache ------------------------------------------------------------------------- */

/* FNV-1a over the little-endian bytes of the parent hash and the token ids, then a
 * splitmix64 finaliser so nearby chains spread over the buckets. Pages are verified token
 * by token on lookup, so a collision can cost a miss, never a wrong page. */
uint64_t kvg_page_hash(uint64_t parent, const int32_t *tokens, int n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < 8; i++) h = (h ^ ((parent >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    for (int t = 0; t < n; t++) {
        uint32_t v = (uint32_t)tokens[t];
        for (int i = 0; i < 4; i++) h = (h ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    }
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

int32_t kvg_pool_lookup(kvg_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    kvg_mutex_lock(&p->mu);
    int32_t q = find_locked(p, hash, parent, tokens);
    if (q >= 0) {
        if (p->state[q] == PAGE_CACHED) {
            lru_unlink(p, q);
            p->n_cached--;
            take(p, q);
        } else {
            p->refcount[q]++;
        }
    }
    kvg_mutex_unlock(&p->mu);
    return q;
}

void kvg_pool_publish(kvg_pool *p, int32_t page, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    kvg_mutex_lock(&p->mu);
    if (!p->published[page] && find_locked(p, hash, parent, tokens) < 0) {
        p->published[page] = true;
        p->hash[page] = hash;
        p->parent[page] = parent;
        memcpy(p->tokens + (size_t)page * p->page_size, tokens, (size_t)p->page_size * sizeof *tokens);
        uint32_t b = bucket_of(p, hash);
        p->next_in_bucket[page] = p->buckets[b];
        p->buckets[b] = page;
    }
    kvg_mutex_unlock(&p->mu);
}

void kvg_pool_get_stats(kvg_pool *p, kvg_pool_stats *st) {
    kvg_mutex_lock(&p->mu);
    st->total = p->n_pages;
    st->used = p->n_used;
    st->cached = p->n_cached;
    st->free = p->n_pages - p->n_used;
    st->committed = p->n_touched;
    kvg_mutex_unlock(&p->mu);
}

/* ---- what pages hold ------------------------------------------------------------------------ */

/* f32 is the reference backend's (the oracle keeps K/V as it computed them); f16 halves the
 * bytes a decode at depth reads; q8_0 and q4_0 store each run of 32 elements of a head's row
 * with one f16 scale (34 and 18 bytes per 32: 0.53x and 0.28x of f16). */
static const kvg_kv_type_row kv_type_rows[] = {
    {"f16", KVG_TYPE_F16},
    {"q8_0", KVG_TYPE_Q8_0},
    {"q4_0", KVG_TYPE_Q4_0},
    {"f32", KVG_TYPE_F32},
};
#define N_KV_TYPE_ROWS (sizeof kv_type_rows / sizeof kv_type_rows[0])

const kvg_kv_type_row *kvg_kv_type_named(const char *name) {
    for (size_t i = 0; name && i < N_KV_TYPE_ROWS; i++)
        if (strcmp(kv_type_rows[i].name, name) == 0) return &kv_type_rows[i];
    return NULL;
}

const char *kvg_kv_type_name(uint32_t type) {
    for (size_t i = 0; i < N_KV_TYPE_ROWS; i++)
        if (kv_type_rows[i].type == type) return kv_type_rows[i].name;
    return "?";
}

void kvg_kv_type_names(const uint32_t *types, size_t n, char *buf, size_t size) {
    if (!types) n = N_KV_TYPE_ROWS;
    size_t len = 0;
    if (size) buf[0] = 0;
    for (size_t i = 0; i < n && len < size; i++) {
        int w = snprintf(buf + len, size - len, "%s%s", i ? ", " : "",
                         types ? kvg_kv_type_name(types[i]) : kv_type_rows[i].name);
        if (w < 0) break;
        len += (size_t)w;
    }
}

kvgen_status kvg_model_kv_type_choose(kvgen_model *m, const char *name, kvgen_error *err) {
    const kvg_backend_ops *ops = m->ops;
    char list[128];
    if (!ops->kv_types || ops->n_kv_types == 0)
        return kvg_fail(err, KVGEN_E_INTERNAL, "kvgen_model_load: backend %s lists no KV page type", ops->name);
    if (!name || !*name) {
        m->kv_type = ops->kv_types[0];
        return KVGEN_OK;
    }
    const kvg_kv_type_row *row = kvg_kv_type_named(name);
    if (!row) {
        kvg_kv_type_names(NULL, 0, list, sizeof list);
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_model_load: desc.kv_type \"%s\" is not a KV type (%s)",
                        name, list);
    }
    bool stored = false;
    for (size_t i = 0; i < ops->n_kv_types; i++) stored |= ops->kv_types[i] == row->type;
    if (!stored) {
        kvg_kv_type_names(ops->kv_types, ops->n_kv_types, list, sizeof list);
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "kvgen_model_load: desc.kv_type \"%s\": the %s backend stores K/V pages as %s only", name,
                        ops->name, list);
    }
    uint32_t block = kvg_type_block_elems(row->type);
    if (m->w.hp.head_dim % (int)block != 0)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "kvgen_model_load: desc.kv_type \"%s\" stores blocks of %u elements; head_dim %d of %s is not "
                        "a multiple", name, block, m->w.hp.head_dim, m->name ? m->name : "the model");
    m->kv_type = row->type;
    return KVGEN_OK;
}

/* ---- a model's pool ----------------------------------------------------------------------- */

/* the commit callbacks of the groups' pools */
static kvgen_status commit_group(kvgen_model *m, int group, int32_t page, kvgen_error *err) {
    return m->ops->kv_page_commit(m, group, page, err);
}
static kvgen_status commit_page0(void *ctx, int32_t page, kvgen_error *err) { return commit_group(ctx, 0, page, err); }
static kvgen_status commit_page1(void *ctx, int32_t page, kvgen_error *err) { return commit_group(ctx, 1, page, err); }
static const kvg_page_commit_fn commit_fns[KVG_KV_GROUPS] = {commit_page0, commit_page1};

/* The layer groups of m->kv: with a window on some layers and a backend that keeps groups,
 * group 0 holds the global layers, group 1 the local ones (window n_swa); else one group. */
static kvgen_status layout_init(kvgen_model *m, bool split, kvgen_error *err) {
    kvg_kv_layout *kv = &m->kv;
    int L = m->w.hp.n_layer;
    memset(kv, 0, sizeof *kv);
    int *a = kvg_calloc((size_t)(L > 0 ? L : 1) * 4, sizeof *a);
    if (!a) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_model_load: out of memory for the KV layout");
    kv->group = a;
    kv->slot = a + L;
    for (int l = 0; l < L; l++) kv->group[l] = split && m->w.layers[l].swa ? 1 : 0;
    kv->n_groups = 1;
    for (int l = 0; l < L; l++)
        if (kv->group[l] == 1) kv->n_groups = 2;
    if (kv->n_groups == 2) kv->window[1] = m->w.hp.n_swa;
    kv->layers[0] = a + 2 * L;
    kv->layers[1] = a + 3 * L;
    for (int l = 0; l < L; l++) {
        int g = kv->group[l];
        kv->slot[l] = kv->n_layers[g];
        kv->layers[g][kv->n_layers[g]++] = l;
    }
    return KVGEN_OK;
}

void kvg_model_pools_free(kvgen_model *m) {
    for (int g = 0; g < KVG_KV_GROUPS; g++) {
        kvg_pool_destroy(m->pools[g]);
        m->pools[g] = NULL;
    }
    kvg_free(m->kv.group);
    memset(&m->kv, 0, sizeof m->kv);
}

size_t kvg_model_group_bytes_per_token(const kvgen_model *m, int group) {
    int L = m->w.hp.n_layer;
    return L > 0 ? m->ops->cache_bytes_per_token(m) / (size_t)L * (size_t)m->kv.n_layers[group] : 0;
}

/* Page size default, by measurement (docs/architecture.md, "KV cache and sessions"): 32 keeps
 * the waste of the one partly filled page per session small (64 forked NPCs waste at most
 * 2048 tokens) while the page-table walk costs nothing measurable on the reference backend
 * (decode at depth 2048 within noise from 16 to 256), and 32 keys are one tile of the
 * attention shader's inner loop. */
#define KVG_DEFAULT_PAGE 32
#define KVG_MIN_PAGE 16
#define KVG_MAX_PAGE 256
#define KVG_MAX_PAGES (1 << 24)

kvgen_status kvg_model_pool_init(kvgen_model *m, const kvgen_model_desc *desc, kvgen_error *err) {
    const kvg_backend_ops *ops = m->ops;
    int P = desc->kv_page_size ? desc->kv_page_size : KVG_DEFAULT_PAGE;
    if (P < KVG_MIN_PAGE || P > KVG_MAX_PAGE || (P & (P - 1)) != 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "kvgen_model_load: kv_page_size %d must be a power of two in [%d, %d] (0: %d)",
                        desc->kv_page_size, KVG_MIN_PAGE, KVG_MAX_PAGE, KVG_DEFAULT_PAGE);
    if (!ops->kv_default_pool_bytes || !ops->kv_pages_init || !ops->kv_page_commit || !ops->kv_copy ||
        !ops->kv_read || !ops->kv_write)
        return kvg_fail(err, KVGEN_E_INTERNAL, "kvgen_model_load: backend %s lacks the KV page operations", ops->name);
    /* the page count is sized as if every layer shared a page; each group's pool gets that many
     * pages of its own layers, so the byte budget is the same and a session past the window of
     * the local layers fits many more tokens */
    size_t per_page = (size_t)P * ops->cache_bytes_per_token(m);
    size_t n_pages;
    if (desc->kv_pool_bytes) {
        n_pages = desc->kv_pool_bytes / per_page;
        if (n_pages == 0)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                            "kvgen_model_load: kv_pool_bytes %zu is less than one KV page (%d tokens = %zu bytes)",
                            desc->kv_pool_bytes, P, per_page);
    } else if (desc->kv_pool_tokens) {
        n_pages = desc->kv_pool_tokens / (size_t)P + (desc->kv_pool_tokens % (size_t)P != 0);
    } else {
        n_pages = ops->kv_default_pool_bytes(m) / per_page;
        if (n_pages == 0) n_pages = 1;
    }
    if (n_pages > KVG_MAX_PAGES)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_model_load: a KV pool of %zu pages is more than %d",
                        n_pages, KVG_MAX_PAGES);
    /* a backend that cannot lay the split pool out (a Vulkan device binding too few bytes for
     * both groups' slabs) keeps one group: every layer in every page, as without windows */
    kvgen_status st = KVGEN_E_UNSUPPORTED;
    for (int attempt = 0; attempt < 2 && st == KVGEN_E_UNSUPPORTED; attempt++) {
        bool split = attempt == 0 && ops->kv_groups && m->w.hp.n_swa > 0;
        if (attempt == 1 && !(ops->kv_groups && m->w.hp.n_swa > 0)) break;
        kvgen_error e = {0};
        kvg_model_pools_free(m);
        st = layout_init(m, split, &e);
        for (int g = 0; st == KVGEN_OK && g < m->kv.n_groups; g++) {
            st = ops->kv_pages_init(m, g, P, (int32_t)n_pages, &e);
            if (st == KVGEN_OK)
                st = kvg_pool_create(P, (int32_t)n_pages, (size_t)P * kvg_model_group_bytes_per_token(m, g),
                                     commit_fns[g], m, &m->pools[g], &e);
        }
        if (st == KVGEN_E_UNSUPPORTED && split && m->kv.n_groups > 1)
            kvg_log(KVGEN_LOG_INFO, "%s; sliding-window layers keep their pages with the others", e.message);
        else if (st != KVGEN_OK && err)
            *err = e;
    }
    return st;
}
