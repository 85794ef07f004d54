/* session.c: the public session calls of kvgen.h: argument checks and the session's
 * bookkeeping (tokens, logits, context limit, sampler, page table) around a backend's forward
 * pass.
 *
 * A session's K/V live in the model's page pool (kvg_pool.h): the session holds a page table,
 * full pages may be shared copy-on-write with forks and with other sessions through the
 * prefix cache, and only the last page is ever partly filled. Every forward pass is a batch
 * (kvg_model.h) built here: one sequence for a prefill, decode or rewind, one per session for
 * kvg_session_decode_batch (the jobs' worker, choice scoring). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_session.h"

static size_t page_size(const kvgen_session *s) { return (size_t)kvg_pool_page_size(s->model->pools[0]); }
static kvg_pool *pool_of(const kvgen_session *s, int g) { return s->model->pools[g]; }
static size_t window_of(const kvgen_session *s, int g) { return (size_t)s->model->kv.window[g]; }
static size_t pages_for(const kvgen_session *s, size_t len) { return (len + page_size(s) - 1) / page_size(s); }

/* ---- session kinds (kvg_session_kind.h) --------------------------------------------------- */

static const kvg_session_kind local_kind;

typedef struct model_kind {
    const kvg_session_kind *kind;
    void *state;
} model_kind;

static void model_kind_free(void *value) {
    model_kind *mk = value;
    if (mk->kind->model_free) mk->kind->model_free(mk->state);
    kvg_free(mk);
}

static const kvg_attach_key model_kind_key = {"session kind", model_kind_free};

const kvg_session_kind *kvg_session_kind_of(const kvgen_model *m) {
    const model_kind *mk = kvg_model_attached(m, &model_kind_key);
    return mk ? mk->kind : &local_kind;
}

void *kvg_session_kind_state(const kvgen_model *m) {
    const model_kind *mk = kvg_model_attached(m, &model_kind_key);
    return mk ? mk->state : NULL;
}

kvgen_status kvg_session_kind_attach(kvgen_model *m, const kvg_session_kind *kind, void *state, const char *who,
                                     kvgen_error *err) {
    model_kind *mk = kvg_malloc(sizeof *mk);
    if (!mk) {
        if (kind->model_free) kind->model_free(state);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    }
    *mk = (model_kind){kind, state};
    void *there = kvg_model_attach(m, &model_kind_key, mk);
    if (there == mk) return KVGEN_OK;
    model_kind_free(mk);
    if (!there) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    return KVGEN_OK; /* not reached: a kind is attached once, at load */
}

kvgen_status kvg_session_can(const kvgen_model *m, const kvgen_session *s, kvg_session_cap cap, const char *fn,
                             kvgen_error *err) {
    const kvg_session_kind *k = s ? s->kind : kvg_session_kind_of(m);
    if (k->caps & cap) return KVGEN_OK;
    return k->refuse(m, s, cap, fn, err);
}

bool kvg_session_kind_replies(const kvg_session_kind *k) { return k->reply_start != NULL; }

kvgen_status kvg_session_local_only(const kvgen_session *s, const char *fn, kvgen_error *err) {
    return kvg_session_can(s->model, s, KVG_CAN_TOKENS, fn, err);
}

void kvgen_model_pool_info(const kvgen_model *m, kvgen_pool_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    if (!m) return;
    info->bytes_per_token = m->ops->cache_bytes_per_token(m);
    info->sessions = (size_t)__atomic_load_n(&m->n_sessions, __ATOMIC_RELAXED);
    if (!m->pools[0]) return;
    /* the pages_* of the global layers' pool; bytes_* over every group's pool */
    for (int g = 0; g < m->kv.n_groups; g++) {
        kvg_pool_stats st;
        kvg_pool_get_stats(m->pools[g], &st);
        size_t bpp = kvg_pool_bytes_per_page(m->pools[g]);
        if (g == 0) {
            info->page_size = (size_t)kvg_pool_page_size(m->pools[g]);
            info->bytes_per_page = bpp;
            info->pages_total = (size_t)st.total;
            info->pages_used = (size_t)st.used;
            info->pages_free = (size_t)st.free;
            info->pages_cached = (size_t)st.cached;
        } else {
            info->window = (size_t)m->kv.window[g];
            info->window_bytes_per_page = bpp;
            info->window_pages_used = (size_t)st.used;
            info->window_pages_cached = (size_t)st.cached;
        }
        info->bytes_total += (size_t)st.total * bpp;
        info->bytes_used += (size_t)st.used * bpp;
        info->bytes_committed += (size_t)st.committed * bpp;
    }
}

/* ---- page table ------------------------------------------------------------------------------ */

/* Releases the pages at table entries [keep, n_pages) of every group. */
static void drop_pages(kvgen_session *s, size_t keep) {
    while (s->n_pages > keep) {
        s->n_pages--;
        for (int g = 0; g < s->n_groups; g++) {
            kvg_pool_release(pool_of(s, g), s->pages[g][s->n_pages]); /* -1 (released) is a no-op */
            s->pages[g][s->n_pages] = -1;
        }
    }
    for (int g = 0; g < s->n_groups; g++)
        if (s->lo[g] > s->n_pages) s->lo[g] = s->n_pages;
}

/* Releases the pages of groups with a window that no query from position n_tokens on can see:
 * a query at q sees [q - window + 1, q], so page i goes once (i + 1) * P <= n_tokens + 1 - window. */
static void trim_windows(kvgen_session *s) {
    size_t P = page_size(s);
    for (int g = 0; g < s->n_groups; g++) {
        size_t w = window_of(s, g);
        if (w == 0 || s->n_tokens + 1 <= w) continue;
        size_t limit = (s->n_tokens + 1 - w) / P;
        if (limit > s->n_pages) limit = s->n_pages;
        for (; s->lo[g] < limit; s->lo[g]++) {
            kvg_pool_release(pool_of(s, g), s->pages[g][s->lo[g]]);
            s->pages[g][s->lo[g]] = -1;
        }
    }
}

/* Whether every group still holds what a query at position q sees (positions [0, q) of a
 * group without a window, the last `window` below q of one with). */
static bool sees_back_to(const kvgen_session *s, size_t q) {
    size_t P = page_size(s);
    for (int g = 0; g < s->n_groups; g++) {
        size_t w = window_of(s, g), from = w > 0 && q + 1 > w ? q + 1 - w : 0;
        if (from / P < s->lo[g]) return false;
    }
    return true;
}

/* Copies the first n slots of group g's page `from` into a fresh page. */
static kvgen_status copy_page(kvgen_session *s, int g, int32_t from, size_t n, int32_t *to, kvgen_error *err) {
    kvgen_model *m = s->model;
    kvgen_status st = kvg_pool_alloc(pool_of(s, g), to, err);
    if (st == KVGEN_OK && n > 0) st = m->ops->kv_copy(m, g, &from, 0, to, 0, (int)n, 0, err);
    if (st != KVGEN_OK && *to >= 0) {
        kvg_pool_release(pool_of(s, g), *to);
        *to = -1;
    }
    return st;
}

/* Makes entry i of group g's table writable: in place when the session holds the page alone,
 * else (copy-on-write) replaced by a copy of its slots below `valid`; a released entry gets a
 * fresh page (what it held is out of every window). */
static kvgen_status own_page(kvgen_session *s, int g, size_t i, size_t valid, kvgen_error *err) {
    int32_t page = s->pages[g][i];
    if (page < 0) {
        kvgen_status st = kvg_pool_alloc(pool_of(s, g), &s->pages[g][i], err);
        if (st == KVGEN_OK && i < s->lo[g]) s->lo[g] = i;
        return st;
    }
    if (kvg_pool_claim(pool_of(s, g), page)) return KVGEN_OK;
    size_t P = page_size(s), first = i * P;
    size_t n = valid > first ? (valid - first < P ? valid - first : P) : 0;
    int32_t copy;
    kvgen_status st = copy_page(s, g, page, n, &copy, err);
    if (st != KVGEN_OK) return st;
    kvg_pool_release(pool_of(s, g), page);
    s->pages[g][i] = copy;
    return KVGEN_OK;
}

/* Gives the session writable pages in every group for positions [pos0, end); positions below
 * n_tokens keep their K/V. On failure the tables are back to what they held for n_tokens
 * (less pages out of a window). */
static kvgen_status reserve(kvgen_session *s, size_t pos0, size_t end, kvgen_error *err) {
    size_t P = page_size(s), held = s->n_pages;
    kvgen_status st = KVGEN_OK;
    for (size_t i = pos0 / P; st == KVGEN_OK && i < (end + P - 1) / P; i++) {
        if (i < s->n_pages) {
            for (int g = 0; st == KVGEN_OK && g < s->n_groups; g++) st = own_page(s, g, i, s->n_tokens, err);
        } else {
            for (int g = 0; st == KVGEN_OK && g < s->n_groups; g++)
                st = kvg_pool_alloc(pool_of(s, g), &s->pages[g][i], err);
            s->n_pages = i + 1; /* drop_pages releases what this entry got */
        }
    }
    if (st != KVGEN_OK) {
        drop_pages(s, held);
        trim_windows(s);
    }
    return st;
}

uint64_t kvg_session_hash_root(const kvgen_session *s) {
    uint64_t key = kvg_lora_set_key(&s->lora);
    return key ? key : KVG_PAGE_HASH_ROOT;
}

static uint64_t parent_hash(const kvgen_session *s, size_t page) {
    return page == 0 ? kvg_session_hash_root(s) : s->page_hash[page - 1];
}

/* Keys the pages that became full in [from, n_tokens) and offers them (each group's that is
 * held) to other sessions. */
static void publish_full_pages(kvgen_session *s, size_t from) {
    size_t P = page_size(s);
    for (size_t i = from / P; (i + 1) * P <= s->n_tokens; i++) {
        if ((i + 1) * P > s->clean_len) break;
        s->page_hash[i] = kvg_page_hash(parent_hash(s, i), s->tokens + i * P, (int)P);
        for (int g = 0; s->prefix_reuse && g < s->n_groups; g++)
            if (s->pages[g][i] >= 0)
                kvg_pool_publish(pool_of(s, g), s->pages[g][i], s->page_hash[i], parent_hash(s, i), s->tokens + i * P);
    }
}

/* After the session's tokens grew to n_tokens: full pages offered, pages out of every window released. */
static void settle(kvgen_session *s, size_t from) {
    publish_full_pages(s, from);
    trim_windows(s);
}

/* ---- create / close ---------------------------------------------------------------------------- */

static kvgen_status check_desc(const kvgen_model *model, const kvgen_session_desc *d, kvgen_error *err) {
    if (d->n_ctx < 0 || d->n_ctx > KVG_MAX_CTX)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_create: n_ctx %d is outside [0, %d]", d->n_ctx,
                        KVG_MAX_CTX);
    int rope_max = model->w.hp.n_ctx_rope;
    if (rope_max > 0 && d->n_ctx > rope_max && model->w.rope_factors_long &&
        model->w.rope_freqs == model->w.rope_factors_long)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "kvgen_session_create: n_ctx %d is over the model's %d positions "
                        "(kvgen_model_desc.n_ctx, for which it runs its long RoPE factors)", d->n_ctx, rope_max);
    if (rope_max > 0 && d->n_ctx > rope_max)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "kvgen_session_create: n_ctx %d is over the model's %d positions "
                        "(rope.scaling.original_context_length): kvgen runs its short RoPE factors "
                        "(rope_factors_short); a longer kvgen_model_desc.n_ctx runs the long ones "
                        "(rope_factors_long)", d->n_ctx, rope_max);
    if (d->top_k < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_create: top_k %d is negative (0 turns it off)",
                        d->top_k);
    if (isnan(d->temperature) || isnan(d->top_p) || d->top_p < 0.0f)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "kvgen_session_create: temperature %g / top_p %g must be numbers, top_p >= 0",
                        (double)d->temperature, (double)d->top_p);
    if (d->on_full != KVGEN_ON_FULL_ERROR && d->on_full != KVGEN_ON_FULL_SHIFT)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_create: on_full %d is not a kvgen_on_full",
                        (int)d->on_full);
    if (d->keep < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_create: keep %d is negative", d->keep);
    if (d->sampler && d->sampler->n_bias > 0) return kvg_session_can(model, NULL, KVG_CAN_BIAS, "kvgen_session_create", err);
    return KVGEN_OK;
}

/* the local kind's storage: tokens, logits, page tables and the backend's session */
static void local_free(kvgen_session *s) {
    drop_pages(s, 0);
    if (s->bs) s->model->ops->session_free(s->model, s->bs);
    kvg_free(s->tokens);
    kvg_free(s->logits);
    for (int g = 0; g < KVG_KV_GROUPS; g++) kvg_free(s->pages[g]);
    kvg_free(s->page_hash);
}

static kvgen_status local_init(kvgen_session *s, kvgen_error *err) {
    kvgen_model *model = s->model;
    s->tokens = kvg_malloc((size_t)s->n_ctx * sizeof *s->tokens);
    s->logits = kvg_malloc((size_t)model->w.hp.n_vocab * sizeof *s->logits);
    if (!s->tokens || !s->logits) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_create: out of memory");
    size_t P = (size_t)kvg_pool_page_size(model->pools[0]), n = ((size_t)s->n_ctx + P - 1) / P;
    s->n_groups = model->kv.n_groups;
    bool ok = true;
    for (int g = 0; g < s->n_groups; g++) {
        s->pages[g] = kvg_malloc(n * sizeof *s->pages[g]);
        ok = ok && s->pages[g];
        for (size_t i = 0; s->pages[g] && i < n; i++) s->pages[g][i] = -1;
    }
    s->page_hash = kvg_calloc(n, sizeof *s->page_hash);
    if (!ok || !s->page_hash) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_create: out of memory");
    return model->ops->session_init(model, s->n_ctx, &s->bs, err);
}

static void session_free(kvgen_session *s) {
    s->kind->free(s);
    kvg_session_ext_free_all(s);
    kvg_lora_set_clear(&s->lora);
    kvg_sampler_free(&s->sampler);
    kvg_free(s);
}

kvgen_status kvg_session_new(kvgen_model *model, const kvgen_session_desc *desc, const kvgen_session *like,
                             kvgen_session **out, kvgen_error *err) {
    *out = NULL;
    const kvg_hparams *hp = &model->w.hp;
    if (model->w.arch && model->w.arch->encoder)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "kvgen_session_create: %s is an encoder (%s): it embeds text "
                        "(kvgen_embed) and has no session to generate with", model->name ? model->name : "the model",
                        model->w.arch->name);
    int n_ctx = desc->n_ctx;
    if (n_ctx == 0) n_ctx = hp->n_ctx_train > 0 && hp->n_ctx_train < KVG_DEFAULT_CTX ? hp->n_ctx_train : KVG_DEFAULT_CTX;
    if (desc->n_ctx == 0 && hp->n_ctx_rope > 0 && n_ctx > hp->n_ctx_rope) n_ctx = hp->n_ctx_rope;

    kvgen_session *s = kvg_calloc(1, sizeof *s);
    if (!s) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_create: out of memory");
    s->model = model;
    s->n_ctx = n_ctx;
    s->no_cache = desc->no_cache != 0;
    s->on_full = desc->on_full;
    s->keep = desc->keep;
    s->prefix_reuse = !desc->no_prefix_reuse && !s->no_cache;
    s->clean_len = KVG_CLEAN_ALL;
    const char *full = getenv("KVGEN_FULL_LOGITS");
    s->full_logits = full && atoi(full) != 0;
    s->kind = kvg_session_kind_of(model);
    kvgen_status st = s->kind->init(s, err);
    if (st == KVGEN_OK) {
        if (like) {
            st = kvg_sampler_clone(&s->sampler, &like->sampler, err);
            if (st == KVGEN_OK) st = kvg_session_ext_clone_all(s, like, err);
            if (st == KVGEN_OK) kvg_lora_set_copy(&s->lora, &like->lora); /* forks run the parent's adapters */
        } else {
            kvg_sampler_params sp = {.seed = desc->seed, .temperature = desc->temperature, .top_k = desc->top_k,
                                     .top_p = desc->top_p};
            /* a kind without token ids of its own: a vocabulary of one, no bias */
            st = kvg_sampler_init(&s->sampler, &sp, s->kind->caps & KVG_CAN_TOKENS ? hp->n_vocab : 1, err);
            if (st == KVGEN_OK && desc->sampler) st = kvg_sampler_set(&s->sampler, desc->sampler, true, err);
        }
    }
    if (st != KVGEN_OK) {
        session_free(s);
        return st;
    }
    __atomic_add_fetch(&model->refcount, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&model->n_sessions, 1, __ATOMIC_RELAXED);
    *out = s;
    return KVGEN_OK;
}

kvgen_status kvgen_session_create(kvgen_model *model, const kvgen_session_desc *desc, kvgen_session **out,
                                  kvgen_error *err) {
    if (out) *out = NULL;
    if (!model) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_create: model is NULL");
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_create: out is NULL");
    kvgen_session_desc d = {0};
    if (desc) d = *desc;
    kvgen_status st = check_desc(model, &d, err);
    if (st != KVGEN_OK) return st;
    return kvg_session_new(model, &d, NULL, out, err);
}

void kvgen_session_close(kvgen_session *s) {
    if (!s) return;
    kvgen_model *m = s->model;
    void (*closing)(kvgen_session *) = __atomic_load_n(&m->on_session_close, __ATOMIC_ACQUIRE);
    if (closing) closing(s); /* the worker cancels the session's jobs and lets go of it */
    session_free(s);
    __atomic_sub_fetch(&m->n_sessions, 1, __ATOMIC_RELAXED);
    kvg_model_release(m); /* drops the session's reference */
}

/* ---- running the model ------------------------------------------------------------------------ */

/* How the session wants its last token's logits: kept on the device with the sampler's bounded
 * set selected in the same submission where the backend can (kvgen_session_sample then reads
 * back only that), else in s->logits. */
static kvg_batch_out last_out(const kvgen_session *s, int *select_k) {
    int k = s->model->ops->topk && !s->full_logits ? kvg_sampler_top_needed(&s->sampler, 1, false) : 0;
    *select_k = k;
    return k > 0 ? KVG_OUT_KEEP : KVG_OUT_LAST;
}

/* the adapters a batch sequence of s runs with: none for a backend without them */
static const kvg_lora_set *seq_lora(const kvgen_session *s) {
    return s->lora.n > 0 && s->model->ops->lora ? &s->lora : NULL;
}

/* One sequence of n tokens at pos0 through the session's page table. */
static kvgen_status run_one(kvgen_session *s, const int32_t *tokens, size_t n, size_t pos0, kvg_batch_out out,
                            float *logits, kvgen_error *err) {
    kvg_batch_seq q = {.bs = s->bs, .pages = {s->pages[0], s->pages[1]}, .tokens = tokens, .n = (int)n,
                       .pos0 = (int)pos0,
                       .out = out, .logits = logits, .lora = seq_lora(s)};
    if (out == KVG_OUT_KEEP || out == KVG_OUT_LAST) q.out = last_out(s, &q.select_k);
    if (q.out == KVG_OUT_LAST) q.logits = s->logits;
    kvg_batch b = {.seq = &q, .n_seq = 1};
    s->logits_on_device = false;
    kvgen_status st = s->model->ops->forward(s->model, &b, err);
    if (st == KVGEN_OK) s->logits_on_device = q.out == KVG_OUT_KEEP;
    else s->has_logits = false; /* a failed pass may have overwritten them */
    return st;
}

kvgen_status kvg_session_hidden(kvgen_session *s, const int32_t *tokens, size_t n, float *hidden, kvgen_error *err) {
    kvgen_model *m = s->model;
    if (!m->ops->hidden_out)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "the %s backend does not return hidden states (the reference, cpu and "
                        "vulkan backends do)", m->ops->name);
    if (s->n_tokens != 0 || n == 0 || n > (size_t)s->n_ctx)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "hidden states of %zu tokens need a fresh session of room "
                        "for them (it holds %zu of %d)", n, s->n_tokens, s->n_ctx);
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->w.hp.n_vocab)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "token %zu: id %d is outside the vocabulary [0, %d)", i,
                            (int)tokens[i], m->w.hp.n_vocab);
    kvgen_status st = reserve(s, 0, n, err);
    if (st == KVGEN_OK) st = run_one(s, tokens, n, 0, KVG_OUT_HIDDEN, hidden, err);
    s->has_logits = false;
    return st;
}

kvgen_status kvg_session_host_logits(kvgen_session *s, kvgen_error *err) {
    if (!s->has_logits) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "the session has no logits");
    if (!s->logits_on_device) return KVGEN_OK;
    kvgen_status st = s->model->ops->fetch_logits(s->model, s->bs, s->logits, err);
    s->logits_on_device = false;
    if (st != KVGEN_OK) s->has_logits = false;
    return st;
}

/* Makes the session hold exactly the K/V a fresh prefill of tokens[0, n) computes, with the
 * last token's logits: a new session runs them (prefix reuse on, so published pages are taken
 * back), then its tables, tokens and logits replace the session's. The fallback where pages a
 * window needs were released; on failure the session is as it was. */
static kvgen_status refill(kvgen_session *s, const int32_t *tokens, size_t n, kvgen_error *err) {
    kvgen_session_desc d = {.n_ctx = s->n_ctx, .no_cache = s->no_cache, .on_full = KVGEN_ON_FULL_ERROR,
                            .no_prefix_reuse = !s->prefix_reuse};
    kvgen_session *c;
    kvgen_status st = kvg_session_new(s->model, &d, s, &c, err);
    if (st != KVGEN_OK) return st;
    c->full_logits = true; /* the logits come back to the host: they move to s */
    if (n > 0) st = kvgen_session_prefill(c, tokens, n, NULL, err);
    if (st == KVGEN_OK && n > 0) st = kvg_session_host_logits(c, err);
    if (st == KVGEN_OK) {
#define SWAP(a, b, T) do { T t_ = (a); (a) = (b); (b) = t_; } while (0)
        for (int g = 0; g < KVG_KV_GROUPS; g++) {
            SWAP(s->pages[g], c->pages[g], int32_t *);
            SWAP(s->lo[g], c->lo[g], size_t);
        }
        SWAP(s->n_pages, c->n_pages, size_t);
        SWAP(s->page_hash, c->page_hash, uint64_t *);
        SWAP(s->tokens, c->tokens, int32_t *);
        SWAP(s->logits, c->logits, float *);
#undef SWAP
        s->n_tokens = n;
        c->n_tokens = 0;
        s->has_logits = n > 0;
        s->logits_on_device = false;
        s->clean_len = KVG_CLEAN_ALL;
        s->tokens_reused += c->tokens_reused;
    }
    kvgen_session_close(c); /* with the session's old pages, when they were swapped */
    return st;
}

/* Context shift: keeps tokens [0, keep), drops `drop` tokens after them and moves the rest
 * down, re-rotating their keys by -drop positions: the K/V move, nothing runs. With a window
 * group the kept tokens run again instead (refill): the moved tokens' window would reach into
 * released pages. */
static kvgen_status shift(kvgen_session *s, size_t keep, size_t drop, kvgen_error *err) {
    kvgen_model *m = s->model;
    size_t len = s->n_tokens, moved = len - keep - drop;
    kvgen_status st = KVGEN_OK;
    size_t P = page_size(s);
    if (s->n_groups > 1) {
        int32_t *kept = kvg_malloc((keep + moved + 1) * sizeof *kept);
        if (!kept) return kvg_fail(err, KVGEN_E_NO_MEMORY, "context shift: out of memory for %zu tokens", keep + moved);
        memcpy(kept, s->tokens, keep * sizeof *kept);
        memcpy(kept + keep, s->tokens + keep + drop, moved * sizeof *kept);
        st = refill(s, kept, keep + moved, err); /* fresh K/V: clean */
        kvg_free(kept);
        if (st != KVGEN_OK) return st;
        s->shifts++;
        return st;
    }
    /* the slots [keep, keep + moved) are overwritten: own their pages first */
    for (size_t i = keep / P; moved > 0 && st == KVGEN_OK && i <= (keep + moved - 1) / P; i++)
        st = own_page(s, 0, i, len, err);
    if (st == KVGEN_OK && moved > 0)
        st = m->ops->kv_copy(m, 0, s->pages[0], (int)(keep + drop), s->pages[0], (int)keep, (int)moved, -(int)drop,
                             err);
    if (st != KVGEN_OK) return st;
    memmove(s->tokens + keep, s->tokens + keep + drop, moved * sizeof *s->tokens);
    s->n_tokens = keep + moved;
    drop_pages(s, pages_for(s, s->n_tokens));
    if (s->clean_len > keep) s->clean_len = keep;
    s->shifts++;
    return st;
}

/* Makes room for n more tokens: KVGEN_E_CONTEXT_FULL, or a shift when the session allows it. */
static kvgen_status make_room(kvgen_session *s, size_t n, kvgen_error *err) {
    if (n <= (size_t)s->n_ctx - s->n_tokens) return KVGEN_OK;
    size_t keep = (size_t)s->keep < s->n_tokens ? (size_t)s->keep : s->n_tokens;
    if (s->on_full != KVGEN_ON_FULL_SHIFT || s->no_cache || n > (size_t)s->n_ctx - keep)
        return kvg_fail(err, KVGEN_E_CONTEXT_FULL, "context full (%zu/%d): cannot append %zu more tokens%s",
                        s->n_tokens, s->n_ctx, n,
                        s->on_full == KVGEN_ON_FULL_SHIFT ? " even after shifting out all but the kept ones" : "");
    /* drop at least half of what may go, so shifts stay rare, and enough for the append */
    size_t need = s->n_tokens + n - (size_t)s->n_ctx, drop = (s->n_tokens - keep) / 2;
    if (drop < need) drop = need;
    kvgen_status st = shift(s, keep, drop, err);
    for (int i = 0; st == KVGEN_OK && i < KVG_SESSION_EXTS; i++)
        if (s->ext[i].ops && s->ext[i].ops->shifted) s->ext[i].ops->shifted(s->ext[i].state, keep, drop);
    return st;
}

static kvgen_status prefill_run(kvgen_session *s, const int32_t *tokens, size_t n, float *all_logits,
                                kvgen_error *err);

/* With a window group, a long append runs in pieces of the window (rounded up to whole pages,
 * at least 4 pages: each piece's last page runs even when the prefix cache has it) so the pages
 * it releases are back in the pool before the next piece takes new ones: the peak stays the
 * window plus a piece, not the whole append. 0: one piece. */
static size_t prefill_piece(const kvgen_session *s) {
    size_t P = page_size(s), piece = 0;
    for (int g = 0; g < s->n_groups; g++)
        if (window_of(s, g) > 0) piece = (window_of(s, g) + P - 1) / P * P;
    if (piece > 0 && piece < 4 * P) piece = 4 * P;
    return s->no_cache ? 0 : piece;
}

kvgen_status kvgen_session_prefill(kvgen_session *s, const int32_t *tokens, size_t n, float *all_logits,
                                   kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_prefill: session is NULL");
    kvgen_status busy = kvg_session_check_host(s, "kvgen_session_prefill", err);
    if (busy != KVGEN_OK) return busy;
    kvgen_status can = kvg_session_local_only(s, "kvgen_session_prefill", err);
    if (can != KVGEN_OK) return can;
    if (n == 0) return KVGEN_OK;
    if (!tokens) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_prefill: tokens is NULL");
    size_t piece = prefill_piece(s);
    if (piece == 0 || n <= piece) return prefill_run(s, tokens, n, all_logits, err);
    for (size_t i = 0; i < n; i++) /* all checked before any piece runs */
        if (tokens[i] < 0 || tokens[i] >= s->model->w.hp.n_vocab)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "token %zu: id %d is outside the vocabulary [0, %d)", i,
                            (int)tokens[i], s->model->w.hp.n_vocab);
    size_t len0 = s->n_tokens, shifts0 = s->shifts, V = (size_t)s->model->w.hp.n_vocab;
    kvgen_status st = KVGEN_OK;
    for (size_t done = 0; done < n && st == KVGEN_OK;) {
        size_t c = n - done < piece ? n - done : piece;
        st = prefill_run(s, tokens + done, c, all_logits ? all_logits + done * V : NULL, err);
        done += c;
    }
    /* a failed piece leaves the session as it was: the earlier pieces are rewound (unless a
     * context shift moved what was there) */
    if (st != KVGEN_OK && s->shifts == shifts0 && s->n_tokens > len0) {
        kvgen_error ignored = {0};
        kvgen_session_rewind(s, s->n_tokens - len0, &ignored);
    }
    return st;
}

/* Appends tokens (one piece): with the cache, only the new ones run (at positions length..); in
 * no_cache mode the whole sequence runs again from position 0, as a model without
 * past_key_values would. */
static kvgen_status prefill_run(kvgen_session *s, const int32_t *tokens, size_t n, float *all_logits,
                                kvgen_error *err) {
    kvgen_model *m = s->model;
    int n_vocab = m->w.hp.n_vocab;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "token %zu: id %d is outside the vocabulary [0, %d)", i,
                            (int)tokens[i], n_vocab);
    kvgen_status st = make_room(s, n, err);
    if (st != KVGEN_OK) return st;

    size_t len = s->n_tokens, V = (size_t)n_vocab;
    /* the new ids go after the cached ones, but count only once the forward pass succeeds */
    memcpy(s->tokens + len, tokens, n * sizeof *tokens);

    /* Prefix reuse: while the session stands on a page boundary of clean K/V and a whole page
     * of the new tokens is published by someone, take that page. The page holding the last
     * token always runs, since its logits are needed (all of them with all_logits). */
    size_t P = page_size(s), done = 0, held = s->n_pages, reused = 0;
    if (s->prefix_reuse && !all_logits && s->clean_len == KVG_CLEAN_ALL) {
        while ((len + done) % P == 0 && n - done > P) {
            size_t i = (len + done) / P;
            uint64_t parent = parent_hash(s, i), h = kvg_page_hash(parent, tokens + done, (int)P);
            int32_t page[KVG_KV_GROUPS];
            bool all = true; /* every group's page, or none */
            for (int g = 0; g < s->n_groups; g++) {
                page[g] = all ? kvg_pool_lookup(m->pools[g], h, parent, tokens + done) : -1;
                all = all && page[g] >= 0;
            }
            if (!all) {
                for (int g = 0; g < s->n_groups; g++) kvg_pool_release(m->pools[g], page[g]);
                break;
            }
            for (int g = 0; g < s->n_groups; g++) s->pages[g][i] = page[g];
            s->page_hash[i] = h;
            s->n_pages = i + 1;
            done += P;
            reused += P;
        }
    }
    size_t pos0 = s->no_cache ? 0 : len + done;
    size_t saved_len = s->n_tokens;
    s->n_tokens = len + done; /* reserve keeps the K/V below this */
    st = reserve(s, pos0, len + n, err);
    s->n_tokens = saved_len;
    if (st == KVGEN_OK) {
        const int32_t *run = s->no_cache ? s->tokens : tokens + done;
        size_t n_run = len + n - pos0;
        if (all_logits && s->no_cache) {
            float *every = kvg_malloc(n_run * V * sizeof(float));
            if (!every) {
                st = kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_prefill: out of memory for logits");
            } else {
                st = run_one(s, run, n_run, pos0, KVG_OUT_ALL, every, err);
                if (st == KVGEN_OK) memcpy(all_logits, every + len * V, n * V * sizeof(float));
                kvg_free(every);
            }
        } else if (all_logits) {
            st = run_one(s, run, n_run, pos0, KVG_OUT_ALL, all_logits, err);
        } else {
            st = run_one(s, run, n_run, pos0, KVG_OUT_KEEP, NULL, err);
        }
        if (st == KVGEN_OK && all_logits) memcpy(s->logits, all_logits + (n - 1) * V, V * sizeof(float));
        if (all_logits) s->logits_on_device = false;
    }
    if (st != KVGEN_OK) {
        drop_pages(s, held); /* reused and new pages go back; the session is as it was */
        if (st != KVGEN_E_POOL_FULL && st != KVGEN_E_NO_MEMORY) s->has_logits = false;
        return st;
    }
    s->n_tokens = len + n;
    s->has_logits = true;
    s->tokens_reused += reused;
    settle(s, len + done);
    return KVGEN_OK;
}

kvgen_status kvgen_session_decode(kvgen_session *s, int32_t token, kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_decode: session is NULL");
    kvgen_status busy = kvg_session_check_host(s, "kvgen_session_decode", err);
    if (busy != KVGEN_OK) return busy;
    return kvgen_session_prefill(s, &token, 1, NULL, err);
}

/* One sequence's checks, room and pages (kvg_session_run_batch): afterwards positions
 * [n_tokens, n_tokens + n) have writable pages and hold the tokens; *held is the page count to
 * go back to. */
static kvgen_status batch_prepare(kvgen_session *s, const int32_t *tokens, int n, size_t *held, kvgen_error *err) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= s->model->w.hp.n_vocab)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "token %d: id %d is outside the vocabulary [0, %d)", i,
                            (int)tokens[i], s->model->w.hp.n_vocab);
    kvgen_status st = make_room(s, (size_t)n, err);
    if (st != KVGEN_OK) return st;
    *held = s->n_pages;
    st = reserve(s, s->n_tokens, s->n_tokens + (size_t)n, err);
    if (st != KVGEN_OK) return st;
    memcpy(s->tokens + s->n_tokens, tokens, (size_t)n * sizeof *tokens);
    return KVGEN_OK;
}

kvgen_status kvg_session_run_batch(kvgen_session *const *ss, const int32_t *const *tokens, const int *counts, int n,
                                   bool host_logits, kvgen_status *status, kvgen_error *errs) {
    enum { GROUP = 64 };
    kvgen_status all = KVGEN_OK;
    for (int done = 0; done < n; done += GROUP) {
        int k = n - done < GROUP ? n - done : GROUP;
        kvg_batch_seq seq[GROUP];
        int which[GROUP];
        size_t held[GROUP];
        int nq = 0;
        for (int i = done; i < done + k; i++) {
            kvgen_session *s = ss[i];
            kvgen_error *e = &errs[i];
            *e = (kvgen_error){0};
            if (counts[i] <= 0) {
                status[i] = kvg_fail(e, KVGEN_E_INTERNAL, "a batch sequence of %d tokens", counts[i]);
                continue;
            }
            if (s->no_cache || (size_t)counts[i] > page_size(s)) {
                /* the whole sequence runs again, or the prefix cache may serve a page: alone */
                status[i] = kvgen_session_prefill(s, tokens[i], (size_t)counts[i], NULL, e);
                continue;
            }
            status[i] = batch_prepare(s, tokens[i], counts[i], &held[nq], e);
            if (status[i] != KVGEN_OK) continue;
            kvg_batch_seq *q = &seq[nq];
            *q = (kvg_batch_seq){.bs = s->bs, .pages = {s->pages[0], s->pages[1]}, .tokens = &s->tokens[s->n_tokens],
                                 .n = counts[i],
                                 .pos0 = (int)s->n_tokens, .lora = seq_lora(s)};
            q->out = host_logits ? KVG_OUT_LAST : last_out(s, &q->select_k);
            if (q->out == KVG_OUT_LAST) q->logits = s->logits;
            s->logits_on_device = false;
            which[nq++] = i;
        }
        kvgen_error ferr = {0};
        kvg_batch b = {.seq = seq, .n_seq = nq};
        kvgen_status st = nq > 0 ? ss[done]->model->ops->forward(ss[done]->model, &b, &ferr) : KVGEN_OK;
        for (int a = 0; a < nq; a++) {
            kvgen_session *s = ss[which[a]];
            if (st != KVGEN_OK) {
                drop_pages(s, held[a]); /* the reserved pages go back */
                s->has_logits = false;
                status[which[a]] = st;
                errs[which[a]] = ferr;
                continue;
            }
            size_t from = s->n_tokens;
            s->n_tokens += (size_t)seq[a].n;
            s->has_logits = true;
            s->logits_on_device = seq[a].out == KVG_OUT_KEEP;
            settle(s, from);
        }
        for (int i = done; i < done + k; i++)
            if (status[i] != KVGEN_OK && all == KVGEN_OK) all = status[i];
    }
    return all;
}

kvgen_status kvg_session_decode_batch(kvgen_session *const *ss, const int32_t *tokens, int n, bool host_logits,
                                      kvgen_status *status, kvgen_error *errs) {
    enum { GROUP = 64 };
    const int32_t *toks[GROUP];
    int ones[GROUP];
    kvgen_status all = KVGEN_OK;
    for (int done = 0; done < n; done += GROUP) {
        int k = n - done < GROUP ? n - done : GROUP;
        for (int i = 0; i < k; i++) {
            toks[i] = &tokens[done + i];
            ones[i] = 1;
        }
        kvgen_status st = kvg_session_run_batch(ss + done, toks, ones, k, host_logits, status + done, errs + done);
        if (st != KVGEN_OK && all == KVGEN_OK) all = st;
    }
    return all;
}

const float *kvgen_session_logits(const kvgen_session *s) {
    if (!s || !s->has_logits) return NULL;
    /* a lazy copy: the session object is the caller's, not const memory */
    if (s->logits_on_device && kvg_session_host_logits((kvgen_session *)s, NULL) != KVGEN_OK) return NULL;
    return s->logits;
}

bool kvg_session_has_logits(const kvgen_session *s) { return s && s->has_logits; }

int32_t kvg_session_sample_masked(kvgen_session *s, const uint8_t *allowed) {
    if (!s || !s->has_logits) return -1;
    kvg_sampler *sm = &s->sampler;
    int need = s->logits_on_device ? kvg_sampler_top_needed(sm, s->n_tokens, allowed != NULL) : 0;
    if (need > 0) {
        int32_t ids[KVG_SAMPLER_MAX_TOP];
        float vals[KVG_SAMPLER_MAX_TOP];
        if (s->model->ops->topk(s->model, s->bs, need, ids, vals, NULL) == KVGEN_OK) {
            int32_t tok = kvg_sampler_sample_top(sm, ids, vals, need);
            if (tok != KVG_SAMPLE_NEED_ALL) return tok;
        }
    }
    if (kvg_session_host_logits(s, NULL) != KVGEN_OK) return -1;
    return kvg_sampler_sample_ctx(sm, s->logits, s->tokens, s->n_tokens, allowed);
}

int32_t kvgen_session_sample(kvgen_session *s) {
    if (s && kvg_session_check_host(s, "kvgen_session_sample", NULL) != KVGEN_OK) return -1; /* busy */
    return kvg_session_sample_masked(s, NULL);
}

size_t kvgen_session_length(const kvgen_session *s) { return s ? s->kind->length(s) : 0; }

static size_t local_length(const kvgen_session *s) { return s->n_tokens; }

const int32_t *kvgen_session_tokens(const kvgen_session *s) {
    return s && (s->kind->caps & KVG_CAN_TOKENS) ? s->tokens : NULL;
}

void kvgen_session_reset(kvgen_session *s) {
    if (!s || kvg_session_check_host(s, "kvgen_session_reset", NULL) != KVGEN_OK) return; /* busy: left alone */
    s->kind->reset(s);
    kvg_sampler_reset(&s->sampler);
    kvg_session_ext_free_all(s); /* an empty session has no conversation to continue */
}

static void local_reset(kvgen_session *s) {
    drop_pages(s, 0);
    for (int g = 0; g < KVG_KV_GROUPS; g++) s->lo[g] = 0;
    s->n_tokens = 0;
    s->has_logits = false;
    s->logits_on_device = false;
    s->clean_len = KVG_CLEAN_ALL;
    s->tokens_reused = 0;
    s->shifts = 0;
}

/* ---- rewind and fork -------------------------------------------------------------------------- */

kvgen_status kvgen_session_rewind(kvgen_session *s, size_t n, kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_rewind: session is NULL");
    kvgen_status busy = kvg_session_check_host(s, "kvgen_session_rewind", err);
    if (busy != KVGEN_OK) return busy;
    return s->kind->rewind(s, n, err);
}

static kvgen_status local_rewind(kvgen_session *s, size_t n, kvgen_error *err) {
    if (n > s->n_tokens)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_rewind: cannot drop %zu tokens of %zu", n,
                        s->n_tokens);
    if (n == 0) return KVGEN_OK;
    size_t len = s->n_tokens - n;
    if (len > 0 && !sees_back_to(s, len - 1)) {
        /* the window of the new last token reaches into released pages: run the kept tokens
         * again (published pages are taken back through the prefix cache) */
        return refill(s, s->tokens, len, err);
    }
    if (len <= s->clean_len) s->clean_len = KVG_CLEAN_ALL; /* what is left was computed fresh */
    s->has_logits = false;
    s->logits_on_device = false;
    if (len == 0) {
        drop_pages(s, 0);
        s->n_tokens = 0;
        return KVGEN_OK;
    }
    /* the logits of the new last token were never kept: run that one token again at its
     * position (it rewrites the same K/V) instead of asking the caller to */
    s->n_tokens = len - 1;
    drop_pages(s, pages_for(s, len));
    int32_t last = s->tokens[len - 1];
    bool reuse = s->prefix_reuse;
    s->prefix_reuse = false; /* one token: nothing to look up, and its page is not full news */
    kvgen_status st = kvgen_session_prefill(s, &last, 1, NULL, err);
    s->prefix_reuse = reuse;
    if (st != KVGEN_OK) s->n_tokens = len; /* its K/V were not touched: only the logits are missing */
    return st;
}

kvgen_status kvgen_session_fork(kvgen_session *s, kvgen_session **child, kvgen_error *err) {
    if (child) *child = NULL;
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_fork: session is NULL");
    if (!child) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_fork: child is NULL");
    kvgen_status busy = kvg_session_check_host(s, "kvgen_session_fork", err);
    if (busy != KVGEN_OK) return busy;
    return s->kind->fork(s, child, err);
}

kvgen_status kvg_session_new_like(kvgen_session *s, kvgen_session **child, kvgen_error *err) {
    kvgen_session_desc d = {.n_ctx = s->n_ctx, .no_cache = s->no_cache, .on_full = s->on_full, .keep = s->keep,
                            .no_prefix_reuse = !s->prefix_reuse};
    return kvg_session_new(s->model, &d, s, child, err);
}

static kvgen_status local_fork(kvgen_session *s, kvgen_session **child, kvgen_error *err) {
    kvgen_model *m = s->model;
    kvgen_session *c;
    /* the child gets a host copy: device-kept logits are the parent's backend session's */
    kvgen_status st = s->has_logits ? kvg_session_host_logits(s, err) : KVGEN_OK;
    if (st != KVGEN_OK) return st;
    st = kvg_session_new_like(s, &c, err);
    if (st != KVGEN_OK) return st;
    c->prefix_reuse = s->prefix_reuse;
    size_t len = s->n_tokens;
    memcpy(c->tokens, s->tokens, len * sizeof *s->tokens);
    {
        size_t P = page_size(s), full = len / P;
        for (size_t i = 0; i < full; i++) {
            for (int g = 0; g < s->n_groups; g++)
                if (s->pages[g][i] >= 0) {
                    kvg_pool_retain(m->pools[g], s->pages[g][i]);
                    c->pages[g][i] = s->pages[g][i];
                }
            c->page_hash[i] = s->page_hash[i];
            c->n_pages = i + 1;
        }
        for (int g = 0; g < s->n_groups; g++) c->lo[g] = s->lo[g];
        if (len % P) {
            c->n_pages = full + 1;
            for (int g = 0; st == KVGEN_OK && g < s->n_groups; g++)
                st = copy_page(s, g, s->pages[g][full], len % P, &c->pages[g][full], err);
        }
    }
    c->full_logits = s->full_logits;
    if (st != KVGEN_OK) {
        kvgen_session_close(c);
        return st;
    }
    c->n_tokens = len;
    c->clean_len = s->clean_len;
    c->shifts = s->shifts;
    c->has_logits = s->has_logits;
    if (s->has_logits) memcpy(c->logits, s->logits, (size_t)m->w.hp.n_vocab * sizeof(float));
    *child = c;
    return KVGEN_OK;
}

kvgen_status kvg_session_load_kv(kvgen_session *s, const int32_t *tokens, size_t n, const float *kv,
                                 kvgen_error *err) {
    kvgen_model *m = s->model;
    const kvg_hparams *hp = &m->w.hp;
    size_t len = s->n_tokens;
    if (n > (size_t)s->n_ctx - len)
        return kvg_fail(err, KVGEN_E_CONTEXT_FULL, "context full (%zu/%d): cannot load %zu tokens", len, s->n_ctx, n);
    memcpy(s->tokens + len, tokens, n * sizeof *tokens);
    size_t held = s->n_pages, P = page_size(s);
    kvgen_status st = reserve(s, len, len + n, err);
    if (st != KVGEN_OK) return st;
    /* pages out of a window go before anything is written: they are never read, nor offered */
    s->n_tokens = len + n;
    trim_windows(s);
    size_t hd = (size_t)hp->head_dim, per = (size_t)hp->n_head_kv * n * hd;
    float *part = NULL;
    for (int l = 0; st == KVGEN_OK && l < hp->n_layer; l++) {
        int g = m->kv.group[l];
        size_t from = s->lo[g] * P > len ? s->lo[g] * P - len : 0; /* of the n: the first one held */
        if (from >= n) continue;
        size_t cnt = n - from;
        if (from > 0 && !part) {
            part = kvg_malloc((size_t)hp->n_head_kv * cnt * hd * sizeof *part);
            if (!part) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "session restore: out of memory for %zu positions", cnt);
        }
        for (int which = 0; st == KVGEN_OK && which < 2; which++) {
            const float *src = kv + ((size_t)l * 2 + which) * per;
            if (from > 0) { /* the held positions of each head, packed (kv_write's layout) */
                for (int h = 0; h < hp->n_head_kv; h++)
                    memcpy(part + (size_t)h * cnt * hd, src + ((size_t)h * n + from) * hd, cnt * hd * sizeof *part);
                src = part;
            }
            st = m->ops->kv_write(m, s->pages[g], l, which, (int)(len + from), (int)cnt, src, err);
        }
    }
    kvg_free(part);
    if (st != KVGEN_OK) {
        s->n_tokens = len;
        drop_pages(s, held);
        return st;
    }
    s->logits_on_device = false; /* the caller writes s->logits (restore) */
    publish_full_pages(s, len);
    return KVGEN_OK;
}

/* ---- introspection ------------------------------------------------------------------------------ */

void kvgen_session_cache_info(const kvgen_session *s, kvgen_cache_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    if (s) s->kind->cache_info(s, info);
}

static void local_cache_info(const kvgen_session *s, kvgen_cache_info *info) {
    const kvg_hparams *hp = &s->model->w.hp;
    info->n_layer = hp->n_layer;
    info->n_head_kv = hp->n_head_kv;
    info->head_dim = hp->head_dim;
    info->length = s->n_tokens;
    info->capacity = (size_t)s->n_ctx;
    info->bytes_per_token = s->model->ops->cache_bytes_per_token(s->model);
    info->bytes = info->length * info->bytes_per_token;
    info->tokens_reused = s->tokens_reused;
    info->shifts = s->shifts;
    info->page_size = page_size(s);
    info->pages = s->n_pages;
    for (size_t i = 0; i < s->n_pages; i++)
        if (kvg_pool_refcount(pool_of(s, 0), s->pages[0][i]) > 1) info->pages_shared++;
    info->bytes_held = s->n_pages * kvg_pool_bytes_per_page(pool_of(s, 0));
    for (int g = 1; g < s->n_groups; g++) { /* the window group: its held entries */
        info->window = window_of(s, g);
        info->window_pages = s->n_pages - s->lo[g];
        info->bytes_held += info->window_pages * kvg_pool_bytes_per_page(pool_of(s, g));
    }
}

kvgen_status kvgen_session_read_cache(const kvgen_session *s, int layer, int which, float *out, size_t n_floats,
                                      kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_read_cache: session is NULL");
    kvgen_status busy = kvg_session_check_host(s, "kvgen_session_read_cache", err);
    if (busy != KVGEN_OK) return busy;
    kvgen_status can = kvg_session_local_only(s, "kvgen_session_read_cache", err);
    if (can != KVGEN_OK) return can;
    const kvg_hparams *hp = &s->model->w.hp;
    if (layer < 0 || layer >= hp->n_layer)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_read_cache: layer %d is outside [0, %d)", layer,
                        hp->n_layer);
    if (which != 0 && which != 1)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_read_cache: which %d must be 0 (K) or 1 (V)",
                        which);
    size_t need = (size_t)hp->n_head_kv * s->n_tokens * (size_t)hp->head_dim;
    if (n_floats < need)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "kvgen_session_read_cache: out holds %zu floats, the cache needs %zu (%d x %zu x %d)",
                        n_floats, need, hp->n_head_kv, s->n_tokens, hp->head_dim);
    if (need == 0) return KVGEN_OK;
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_read_cache: out is NULL");
    /* a window layer's released positions read as zeros */
    int g = s->model->kv.group[layer];
    size_t from = s->lo[g] * page_size(s), hd = (size_t)hp->head_dim, n = s->n_tokens;
    if (from == 0) return s->model->ops->kv_read(s->model, s->pages[g], layer, which, 0, (int)n, out, err);
    memset(out, 0, need * sizeof *out);
    if (from >= n) return KVGEN_OK;
    float *part = kvg_malloc((size_t)hp->n_head_kv * (n - from) * hd * sizeof *part);
    if (!part) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_read_cache: out of memory");
    kvgen_status st =
        s->model->ops->kv_read(s->model, s->pages[g], layer, which, (int)from, (int)(n - from), part, err);
    for (int h = 0; st == KVGEN_OK && h < hp->n_head_kv; h++)
        memcpy(out + ((size_t)h * n + from) * hd, part + (size_t)h * (n - from) * hd, (n - from) * hd * sizeof *out);
    kvg_free(part);
    return st;
}

/* private accessors for generate.c / chat.c (kvg_sampler.h) */
kvg_sampler *kvg_session_sampler(kvgen_session *s) { return &s->sampler; }
kvgen_model *kvg_session_model(const kvgen_session *s) { return s->model; }

/* The local paged kind: everything is here, so it refuses nothing. */
static const kvg_session_kind local_kind = {
    .name = "local",
    .caps = KVG_CAN_TOKENS | KVG_CAN_TOKEN_JOBS | KVG_CAN_BIAS | KVG_CAN_CHAT_TEMPLATE,
    .init = local_init,
    .free = local_free,
    .length = local_length,
    .reset = local_reset,
    .rewind = local_rewind,
    .fork = local_fork,
    .cache_info = local_cache_info,
};
