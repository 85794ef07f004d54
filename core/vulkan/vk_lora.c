/* vk_lora.c: LoRA adapters on the device (private to the backend): an adapter's pairs packed as
 * f32 for shaders/lora.comp, and the per-step table that tells each token of a mat-mul which
 * pairs it runs (its sequence's set; kvg_adapter.h). The product is two dispatches per mat-mul:
 * "down" (t = s A x, every pair of the token into its row of a small rank scratch) and "up"
 * (the per-token delta B t at the mat-mul's output rows, which the mat-mul's epilogue adds).
 * Calls vk_device.c. */
#include <stdio.h>
#include <string.h>
#include "kvg_vk_backend.h"

/* ---- packing ---------------------------------------------------------------------------------- */

/* An adapter as lora.comp reads it: for each (layer, target) with a pair, in that order, A
 * (rank rows of n_in) then B transposed (rank rows of n_out). */
size_t kvg_vk_lora_words(const kvgen_adapter *a, int n_layer) {
    size_t n = 0;
    for (int l = 0; l < n_layer; l++)
        for (int t = 0; t < KVG_LORA_TARGETS; t++) {
            const kvg_lora_pair *p = kvg_adapter_pair(a, l, (kvg_lora_target)t);
            if (p) n += (size_t)p->rank * ((size_t)p->n_in + (size_t)p->n_out);
        }
    return n;
}

void kvg_vk_lora_pack(const kvgen_adapter *a, int n_layer, uint32_t neox_hd, uint32_t n_rot, float *dst) {
    for (int l = 0; l < n_layer; l++)
        for (int t = 0; t < KVG_LORA_TARGETS; t++) {
            const kvg_lora_pair *p = kvg_adapter_pair(a, l, (kvg_lora_target)t);
            if (!p) continue;
            size_t na = (size_t)p->rank * p->n_in, nb = (size_t)p->rank * p->n_out;
            memcpy(dst, p->a, na * sizeof *dst);
            if (neox_hd && (t == KVG_LORA_Q || t == KVG_LORA_K)) /* B's outputs in the device's row order */
                for (size_t r = 0; r < (size_t)p->rank; r++)
                    for (uint32_t o = 0; o < (uint32_t)p->n_out; o++)
                        dst[na + r * p->n_out + o] =
                            p->b[r * p->n_out + (o / neox_hd) * neox_hd + kvg_vk_neox_src(o % neox_hd, n_rot)];
            else
                memcpy(dst + na, p->b, nb * sizeof *dst);
            dst += na + nb;
        }
}

/* where the pair of (layer, target) starts in the packed adapter (words), or -1 */
static int64_t pair_offset(const kvgen_adapter *a, int layer, kvg_lora_target target) {
    size_t n = 0;
    for (int i = 0; i < layer * KVG_LORA_TARGETS + (int)target; i++) {
        const kvg_lora_pair *p = kvg_adapter_pair(a, i / KVG_LORA_TARGETS, (kvg_lora_target)(i % KVG_LORA_TARGETS));
        if (p) n += (size_t)p->rank * ((size_t)p->n_in + (size_t)p->n_out);
    }
    return kvg_adapter_pair(a, layer, target) ? (int64_t)n : -1;
}

/* ---- the step's table --------------------------------------------------------------------------- */

uint32_t kvg_vk_lora_table(uint32_t *tab, const kvg_lora_set *const *sets, uint32_t n, int layer,
                           const kvg_vk_lora_part *parts, int n_parts, const uint64_t *const *bases,
                           uint32_t *ranks) {
    uint32_t w = 2 * n, widest = 0;
    for (uint32_t c = 0; c < n; c++) {
        const kvg_lora_set *set = sets ? sets[c] : NULL;
        if (c > 0 && sets && set == sets[c - 1]) { /* a sequence's tokens share entries */
            tab[2 * c] = tab[2 * c - 2];
            tab[2 * c + 1] = tab[2 * c - 1];
            continue;
        }
        tab[2 * c] = w;
        uint32_t t_off = 0;
        for (int i = 0; set && i < set->n; i++) {
            const kvgen_adapter *a = set->adapter[i];
            for (int j = 0; j < n_parts; j++) {
                const kvg_lora_pair *p = kvg_adapter_pair(a, layer, parts[j].target);
                if (!p || p->n_in != (int)parts[j].n_in || p->n_out != (int)parts[j].n_out) continue;
                float s = a->alpha != 0.0f ? set->scale[i] * a->alpha / (float)p->rank : set->scale[i];
                uint64_t at = bases[c][i] + (uint64_t)pair_offset(a, layer, parts[j].target);
                uint32_t sbits;
                memcpy(&sbits, &s, sizeof sbits);
                uint32_t e[8] = {(uint32_t)at, (uint32_t)(at + (uint64_t)p->rank * p->n_in), (uint32_t)p->rank,
                                 (uint32_t)p->n_out, t_off, sbits, parts[j].row0, parts[j].stride};
                memcpy(tab + w, e, sizeof e);
                w += 8;
                t_off += (uint32_t)p->rank;
            }
        }
        tab[2 * c + 1] = w;
        if (t_off > widest) widest = t_off;
    }
    if (ranks) *ranks = widest;
    return w;
}

uint32_t kvg_vk_lora_table_words(const kvg_lora_set *const *sets, uint32_t n, int n_parts) {
    uint32_t w = 2 * n;
    for (uint32_t c = 0; c < n; c++)
        if (c == 0 || !sets || sets[c] != sets[c - 1])
            w += 8u * (uint32_t)n_parts * (uint32_t)(sets && sets[c] ? sets[c]->n : 0);
    return w;
}

/* ---- recording ----------------------------------------------------------------------------------- */

typedef struct pc_lora { /* matches PC in shaders/lora.comp */
    uint32_t ncols, ldx, ldo, n_in, nrows, tab_off;
    float eps;
} pc_lora;

static void lora_spec(uint32_t spec[KVG_SPEC_COUNT], int mode, bool norm) {
    spec_init(spec);
    spec[KVG_SPEC_WG] = 64;
    spec[KVG_SPEC_MODE] = (uint32_t)mode;
    spec[KVG_SPEC_NORM] = norm;
}

kvgen_status kvg_vk_lora_pipelines(kvg_vk_ctx *ctx, kvgen_error *err) {
    uint32_t spec[KVG_SPEC_COUNT];
    VkPipeline p;
    kvgen_status st = KVGEN_OK;
    for (int mode = 0; mode <= 1 && st == KVGEN_OK; mode++)
        for (int norm = 0; norm <= (mode == 0) && st == KVGEN_OK; norm++) {
            lora_spec(spec, mode, norm);
            st = kvg_vk_pipeline_get(ctx, "lora", spec, &p, err);
        }
    return st;
}

kvgen_status kvg_vk_lora_record(kvg_vk_ctx *ctx, VkCommandBuffer cb, VkDescriptorSet down, VkDescriptorSet up,
                                const kvg_vk_lora_args *a, kvgen_error *err) {
    uint32_t spec[KVG_SPEC_COUNT];
    lora_spec(spec, 0, a->norm);
    VkPipeline pd = kvg_vk_pipeline_find(ctx, "lora", spec);
    lora_spec(spec, 1, false);
    VkPipeline pu = kvg_vk_pipeline_find(ctx, "lora", spec);
    if (!pd || !pu) return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: the lora pipelines were not created");
    pc_lora pc = {.ncols = a->ncols, .ldx = a->ldx, .ldo = a->ldt, .n_in = a->n_in, .tab_off = a->tab_off,
                  .eps = a->eps};
    kvg_vk_cmd_dispatch(ctx, cb, pd, down, &pc, sizeof pc, a->ncols, 1, 1);
    kvg_vk_cmd_barrier(cb);
    pc = (pc_lora){.ncols = a->ncols, .ldx = a->ldt, .ldo = a->ldd, .nrows = a->nrows, .tab_off = a->tab_off};
    kvg_vk_cmd_dispatch(ctx, cb, pu, up, &pc, sizeof pc, (a->nrows + 63) / 64, a->ncols, 1);
    kvg_vk_cmd_barrier(cb);
    return KVGEN_OK;
}

/* ---- test hook ----------------------------------------------------------------------------------- */

typedef struct test_args {
    kvg_vk_ctx *ctx;
    const VkDescriptorSet *sets;
    kvg_vk_lora_args a;
    kvgen_error *err;
} test_args;

static kvgen_status record_test(VkCommandBuffer cb, void *arg) {
    const test_args *t = arg;
    return kvg_vk_lora_record(t->ctx, cb, t->sets[0], t->sets[1], &t->a, t->err);
}

kvgen_status kvg_vk_test_lora(kvg_vk_ctx *ctx, const kvg_lora_set *const *sets, uint32_t n, int n_layer, int layer,
                              const kvg_vk_lora_part *parts, int n_parts, const float *x, uint32_t in_dim,
                              const float *norm, float eps, uint32_t nrows, float *delta, kvgen_error *err) {
    /* every adapter of the sets packed once, back to back, in order of first use */
    const kvgen_adapter *held[64];
    uint64_t held_base[64], words = 0;
    int n_held = 0;
    uint64_t base_rows[64][KVGEN_MAX_ADAPTERS];
    const uint64_t *bases[64];
    if (n > 64) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvg_vk_test_lora: at most 64 tokens");
    for (uint32_t c = 0; c < n; c++) {
        bases[c] = base_rows[c];
        for (int i = 0; sets[c] && i < sets[c]->n; i++) {
            int k = 0;
            while (k < n_held && held[k] != sets[c]->adapter[i]) k++;
            if (k == n_held) {
                if (n_held == 64) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvg_vk_test_lora: too many adapters");
                held[n_held] = sets[c]->adapter[i];
                held_base[n_held++] = words;
                words += kvg_vk_lora_words(sets[c]->adapter[i], n_layer);
            }
            base_rows[c][i] = held_base[k];
        }
    }
    uint32_t tab_words = kvg_vk_lora_table_words(sets, n, n_parts), ranks = 0;
    uint32_t ldx = round_up(in_dim, 4);
    float *packed = kvg_calloc(words + 1, sizeof *packed);
    uint32_t *tab = kvg_calloc(tab_words, sizeof *tab);
    float *xp = kvg_calloc((size_t)n * ldx + 4, sizeof *xp);
    kvg_vk_buffer pb = {0}, tb = {0}, xb = {0}, nb = {0}, rb = {0}, db = {0};
    VkDescriptorPool pool = VK_NULL_HANDLE;
    VkDescriptorSet sets_vk[2];
    kvgen_status st = packed && tab && xp ? KVGEN_OK : kvg_fail(err, KVGEN_E_NO_MEMORY, "out of memory");
    if (st == KVGEN_OK) {
        for (int k = 0; k < n_held; k++) kvg_vk_lora_pack(held[k], n_layer, 0, 0, packed + held_base[k]);
        kvg_vk_lora_table(tab, sets, n, layer, parts, n_parts, bases, &ranks);
        for (uint32_t c = 0; c < n; c++) memcpy(xp + (size_t)c * ldx, x + (size_t)c * in_dim, in_dim * sizeof *xp);
    }
    uint32_t ldt = ranks ? ranks : 1;
    if (st == KVGEN_OK) st = kvg_vk_lora_pipelines(ctx, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (words + 1) * 4, KVG_VK_MEM_DEVICE, &pb, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)tab_words * 4, KVG_VK_MEM_DEVICE, &tb, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, ((size_t)n * ldx + 4) * 4, KVG_VK_MEM_DEVICE, &xb, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, ((size_t)ldx + 4) * 4, KVG_VK_MEM_DEVICE, &nb, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)n * ldt * 4, KVG_VK_MEM_DEVICE, &rb, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)n * nrows * 4, KVG_VK_MEM_DEVICE, &db, err);
    if (st == KVGEN_OK) st = kvg_vk_upload(ctx, &pb, 0, packed, (words + 1) * 4, err);
    if (st == KVGEN_OK) st = kvg_vk_upload(ctx, &tb, 0, tab, (size_t)tab_words * 4, err);
    if (st == KVGEN_OK) st = kvg_vk_upload(ctx, &xb, 0, xp, ((size_t)n * ldx + 4) * 4, err);
    if (st == KVGEN_OK && norm) {
        memset(xp, 0, ((size_t)ldx + 4) * 4);
        memcpy(xp, norm, in_dim * sizeof *xp);
        st = kvg_vk_upload(ctx, &nb, 0, xp, ((size_t)ldx + 4) * 4, err);
    }
    if (st == KVGEN_OK) st = kvg_vk_pool_create(ctx, 2, &pool, err);
    for (int i = 0; i < 2 && st == KVGEN_OK; i++) {
        kvg_vk_binding b[KVG_VK_BINDINGS] = {{0}};
        b[1].buf = &pb;
        b[2].buf = i == 0 ? &xb : &rb;
        b[3].buf = i == 0 ? &rb : &db;
        b[4].buf = &nb;
        b[7].buf = &tb;
        st = kvg_vk_set_create(ctx, pool, b, &sets_vk[i], err);
    }
    if (st == KVGEN_OK) {
        test_args t = {ctx, sets_vk,
                       {.ncols = n, .ldx = ldx, .ldt = ldt, .ldd = nrows, .n_in = in_dim, .nrows = nrows,
                        .norm = norm != NULL, .eps = eps},
                       err};
        st = kvg_vk_run_once(ctx, record_test, &t, err);
    }
    if (st == KVGEN_OK) st = kvg_vk_download(ctx, &db, 0, delta, (size_t)n * nrows * 4, err);
    if (pool) vkDestroyDescriptorPool(ctx->dev, pool, NULL);
    kvg_vk_buffer *bufs[] = {&pb, &tb, &xb, &nb, &rb, &db};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kvg_vk_buffer_destroy(ctx, bufs[i]);
    kvg_free(packed);
    kvg_free(tab);
    kvg_free(xp);
    return st;
}

/* ---- a model's adapters on the device -------------------------------------------------------------- */

/* The adapters a model's steps have run, packed back to back in one buffer (one binding for any
 * mix of them), and the scratch and descriptor sets of the LoRA dispatches. An adapter is packed
 * the first time a step runs it and forgotten when it is freed (kvg_vk_lora_forget: its words
 * stay a hole until the buffer next grows, when the live adapters are packed again). */
typedef struct vk_lora_held {
    const kvgen_adapter *a;
    uint64_t base; /* its first word in pairs */
} vk_lora_held;

typedef enum { LOP_QKV, LOP_WO, LOP_GATEUP, LOP_DOWN, LOP_COUNT } vk_lora_op;

struct vk_lora {
    vk_lora_held *held;
    int n_held, cap_held;
    kvg_vk_buffer pairs;          /* f32 words: the packed adapters */
    uint64_t pairs_cap, pairs_used;
    kvg_vk_buffer t;              /* the rank scratch: steps' tokens x ldt floats */
    uint32_t ldt;
    kvg_vk_buffer tab;            /* host-visible: the step's tables, one per mat-mul that runs pairs */
    uint32_t tab_cap;             /* words */
    VkDescriptorPool pool;
    VkDescriptorSet *down;        /* [n_layer][LOP_COUNT] */
    VkDescriptorSet up;
    bool sets_ok;
    /* the step being recorded: each token's set, the bases of their adapters, the table's fill */
    const kvg_lora_set **tok_sets;
    const uint64_t **tok_bases;
    uint64_t (*set_bases)[KVGEN_MAX_ADAPTERS];
    uint32_t cap_tok, n_tok, tab_used;
};

void kvg_vk_lora_free(vk_model *vm) {
    vk_lora *L = vm->lora;
    if (!L) return;
    kvg_vk_ctx *ctx = vm->ctx;
    if (L->pool) vkDestroyDescriptorPool(ctx->dev, L->pool, NULL);
    kvg_vk_buffer_destroy(ctx, &L->pairs);
    kvg_vk_buffer_destroy(ctx, &L->t);
    kvg_vk_buffer_destroy(ctx, &L->tab);
    kvg_vk_buffer_destroy(ctx, &vm->lora_d);
    kvg_free(L->held);
    kvg_free(L->down);
    kvg_free(L->tok_sets);
    kvg_free(L->tok_bases);
    kvg_free(L->set_bases);
    kvg_free(L);
    vm->lora = NULL;
}

void kvg_vk_lora_forget(vk_model *vm, const kvgen_adapter *a) {
    kvg_vk_lock(vm->ctx);
    vk_lora *L = vm->lora;
    for (int i = 0; L && i < L->n_held; i++)
        if (L->held[i].a == a) {
            L->held[i] = L->held[--L->n_held];
            break;
        }
    kvg_vk_unlock(vm->ctx);
}

static int64_t held_base(const vk_lora *L, const kvgen_adapter *a) {
    for (int i = 0; i < L->n_held; i++)
        if (L->held[i].a == a) return (int64_t)L->held[i].base;
    return -1;
}

/* packs the held adapters and `add` (not yet held) into a new pairs buffer of cap words */
static kvgen_status repack(vk_model *vm, const kvgen_adapter *const *add, int n_add, uint64_t cap, kvgen_error *err) {
    vk_lora *L = vm->lora;
    const int n_layer = vm->hp.n_layer;
    uint32_t hd = vm->neox ? (uint32_t)vm->hp.head_dim : 0;
    if (L->n_held + n_add > L->cap_held) {
        int nc = (L->n_held + n_add) * 2;
        vk_lora_held *h = kvg_realloc(L->held, (size_t)nc * sizeof *h);
        if (!h) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory for LoRA adapters");
        L->held = h;
        L->cap_held = nc;
    }
    uint64_t range = vm->ctx->props.limits.maxStorageBufferRange;
    if (cap * 4 > range) {
        uint64_t live = 0;
        for (int i = 0; i < L->n_held; i++) live += kvg_vk_lora_words(L->held[i].a, n_layer);
        for (int i = 0; i < n_add; i++) live += kvg_vk_lora_words(add[i], n_layer);
        if (live * 4 > range)
            return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                            "vulkan: the LoRA adapters run on this model need %llu bytes of device memory in one "
                            "buffer; device %s binds at most %llu (maxStorageBufferRange): free adapters no "
                            "session runs", (unsigned long long)live * 4, vm->ctx->info.name,
                            (unsigned long long)range);
        cap = range / 4;
    }
    for (int i = 0; i < n_add; i++) L->held[L->n_held++] = (vk_lora_held){add[i], 0};
    float *host = kvg_malloc((size_t)cap * sizeof *host);
    if (!host) {
        L->n_held -= n_add;
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory packing LoRA adapters");
    }
    uint64_t used = 0;
    for (int i = 0; i < L->n_held; i++) {
        L->held[i].base = used;
        kvg_vk_lora_pack(L->held[i].a, n_layer, hd, (uint32_t)vm->hp.n_rot, host + used);
        used += kvg_vk_lora_words(L->held[i].a, n_layer);
    }
    kvg_vk_buffer nb = {0};
    kvgen_status st = kvg_vk_buffer_create(vm->ctx, cap * 4, KVG_VK_MEM_DEVICE, &nb, err);
    if (st == KVGEN_OK && used) st = kvg_vk_upload(vm->ctx, &nb, 0, host, used * 4, err);
    kvg_free(host);
    if (st != KVGEN_OK) {
        kvg_vk_buffer_destroy(vm->ctx, &nb);
        L->n_held -= n_add;
        return st;
    }
    kvg_vk_buffer_destroy(vm->ctx, &L->pairs);
    L->pairs = nb;
    L->pairs_cap = cap;
    L->pairs_used = used;
    L->sets_ok = false;
    return KVGEN_OK;
}

/* a scratch buffer of at least bytes (its content is not kept) */
static kvgen_status ensure(vk_model *vm, kvg_vk_buffer *b, size_t bytes, int kind, bool *grown, kvgen_error *err) {
    if (b->buf && b->size >= bytes) return KVGEN_OK;
    kvg_vk_buffer_destroy(vm->ctx, b);
    *grown = true;
    return kvg_vk_buffer_create(vm->ctx, bytes, kind, b, err);
}

/* the input, norm weight and output rows of each LoRA'd mat-mul */
static void op_shape(const vk_model *vm, int layer, vk_lora_op op, const kvg_vk_buffer **in, const kvg_vk_buffer **norm,
                     kvg_vk_lora_part *parts, int *n_parts, uint32_t *n_in, uint32_t *ldx, uint32_t *nrows) {
    const kvg_hparams *hp = &vm->hp;
    const vk_layer *L = &vm->layers[layer];
    uint32_t E = (uint32_t)hp->n_embd, nq = (uint32_t)(hp->n_head * hp->head_dim);
    uint32_t nk = (uint32_t)(hp->n_head_kv * hp->head_dim), F = (uint32_t)hp->n_ff;
    switch (op) {
    case LOP_QKV:
        *in = &vm->x, *norm = &L->attn_norm, *n_in = E, *ldx = vm->ld_x, *nrows = nq + 2 * nk, *n_parts = 3;
        parts[0] = (kvg_vk_lora_part){KVG_LORA_Q, E, nq, 0, 1};
        parts[1] = (kvg_vk_lora_part){KVG_LORA_K, E, nk, nq, 1};
        parts[2] = (kvg_vk_lora_part){KVG_LORA_V, E, nk, nq + nk, 1};
        break;
    case LOP_WO:
        *in = &vm->att, *norm = NULL, *n_in = nq, *ldx = vm->ld_q, *nrows = E, *n_parts = 1;
        parts[0] = (kvg_vk_lora_part){KVG_LORA_O, nq, E, 0, 1};
        break;
    case LOP_GATEUP: /* gate and up rows interleaved (kvg_vk_upload_matrix) */
        *in = &vm->x, *norm = &L->ffn_norm, *n_in = E, *ldx = vm->ld_x, *nrows = 2 * F, *n_parts = 2;
        parts[0] = (kvg_vk_lora_part){KVG_LORA_GATE, E, F, 0, 2};
        parts[1] = (kvg_vk_lora_part){KVG_LORA_UP, E, F, 1, 2};
        break;
    default:
        *in = &vm->h, *norm = NULL, *n_in = F, *ldx = vm->ld_h, *nrows = E, *n_parts = 1;
        parts[0] = (kvg_vk_lora_part){KVG_LORA_DOWN, F, E, 0, 1};
        break;
    }
}

static kvgen_status make_sets(vk_model *vm, kvgen_error *err) {
    vk_lora *L = vm->lora;
    kvg_vk_ctx *ctx = vm->ctx;
    int n = vm->hp.n_layer * LOP_COUNT;
    if (L->pool) vkDestroyDescriptorPool(ctx->dev, L->pool, NULL);
    L->pool = VK_NULL_HANDLE;
    kvgen_status st = kvg_vk_pool_create(ctx, (uint32_t)n + 1, &L->pool, err);
    for (int i = 0; i < n && st == KVGEN_OK; i++) {
        kvg_vk_lora_part parts[3];
        int n_parts;
        uint32_t n_in, ldx, nrows;
        kvg_vk_binding b[KVG_VK_BINDINGS] = {{0}};
        op_shape(vm, i / LOP_COUNT, (vk_lora_op)(i % LOP_COUNT), &b[2].buf, &b[4].buf, parts, &n_parts, &n_in, &ldx,
                 &nrows);
        b[1].buf = &L->pairs;
        b[3].buf = &L->t;
        b[7].buf = &L->tab;
        st = kvg_vk_set_create(ctx, L->pool, b, &L->down[i], err);
    }
    if (st == KVGEN_OK) {
        kvg_vk_binding b[KVG_VK_BINDINGS] = {{0}};
        b[1].buf = &L->pairs;
        b[2].buf = &L->t;
        b[3].buf = &vm->lora_d;
        b[7].buf = &L->tab;
        st = kvg_vk_set_create(ctx, L->pool, b, &L->up, err);
    }
    L->sets_ok = st == KVGEN_OK;
    return st;
}

kvgen_status kvg_vk_lora_prepare(vk_model *vm, const kvg_lora_set *const *sets, int n_sets, uint32_t max_tok,
                                 kvgen_error *err) {
    const kvg_hparams *hp = &vm->hp;
    if (!vm->lora) {
        vm->lora = kvg_calloc(1, sizeof *vm->lora);
        if (vm->lora) vm->lora->down = kvg_calloc((size_t)hp->n_layer * LOP_COUNT, sizeof *vm->lora->down);
        if (!vm->lora || !vm->lora->down) {
            kvg_free(vm->lora);
            vm->lora = NULL;
            return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory for LoRA adapters");
        }
    }
    vk_lora *L = vm->lora;
    kvgen_status st = kvg_vk_lora_pipelines(vm->ctx, err);
    if (st != KVGEN_OK) return st;
    /* the adapters no step has run yet */
    const kvgen_adapter *add[KVGEN_MAX_ADAPTERS * 64];
    int n_add = 0;
    uint64_t add_words = 0;
    uint32_t ldt = 1, entries = 0;
    for (int s = 0; s < n_sets; s++) {
        uint32_t ranks = 0;
        for (int i = 0; i < sets[s]->n; i++) {
            const kvgen_adapter *a = sets[s]->adapter[i];
            ranks += 3u * (uint32_t)a->max_rank;
            bool known = held_base(L, a) >= 0;
            for (int j = 0; j < n_add && !known; j++) known = add[j] == a;
            if (known || n_add == (int)(sizeof add / sizeof add[0])) continue;
            add[n_add++] = a;
            add_words += kvg_vk_lora_words(a, hp->n_layer);
        }
        if (ranks > ldt) ldt = ranks;
        entries += 3u * (uint32_t)sets[s]->n;
    }
    if (n_add > 0 && L->pairs_used + add_words <= L->pairs_cap && L->n_held + n_add <= L->cap_held) {
        uint32_t hd = vm->neox ? (uint32_t)hp->head_dim : 0;
        float *host = kvg_malloc((size_t)add_words * sizeof *host + 4);
        if (!host) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory packing LoRA adapters");
        uint64_t at = 0;
        for (int i = 0; i < n_add; i++) {
            L->held[L->n_held++] = (vk_lora_held){add[i], L->pairs_used + at};
            kvg_vk_lora_pack(add[i], hp->n_layer, hd, (uint32_t)hp->n_rot, host + at);
            at += kvg_vk_lora_words(add[i], hp->n_layer);
        }
        st = kvg_vk_upload(vm->ctx, &L->pairs, L->pairs_used * 4, host, add_words * 4, err);
        kvg_free(host);
        if (st != KVGEN_OK) {
            L->n_held -= n_add;
            return st;
        }
        L->pairs_used += add_words;
    } else if (n_add > 0) {
        uint64_t live = add_words;
        for (int i = 0; i < L->n_held; i++) live += kvg_vk_lora_words(L->held[i].a, hp->n_layer);
        st = repack(vm, add, n_add, live * 2 + 1, err);
        if (st != KVGEN_OK) return st;
    }
    /* scratch: the delta (the mat-mul sets bind it: a new one has them rewritten through kv_gen),
     * the rank scratch, the tables (each mat-mul's of one step) */
    bool grown = false, d_grown = false;
    uint32_t E = (uint32_t)hp->n_embd, rows = (uint32_t)((hp->n_head + 2 * hp->n_head_kv) * hp->head_dim);
    if (2u * (uint32_t)hp->n_ff > rows) rows = 2u * (uint32_t)hp->n_ff;
    if (E > rows) rows = E;
    size_t tok = vm->chunk > 8 ? vm->chunk : 8;
    if (tok * rows * 4 > vm->ctx->props.limits.maxStorageBufferRange)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: LoRA adapters need a delta of %zu bytes for steps of %zu "
                        "tokens; device %s binds at most %u (maxStorageBufferRange)", tok * rows * 4, tok,
                        vm->ctx->info.name, vm->ctx->props.limits.maxStorageBufferRange);
    st = ensure(vm, &vm->lora_d, tok * rows * 4, KVG_VK_MEM_DEVICE, &d_grown, err);
    if (st == KVGEN_OK && d_grown) __atomic_add_fetch(&vm->kv_gen, 1, __ATOMIC_ACQ_REL);
    if (st == KVGEN_OK) st = ensure(vm, &L->t, tok * ldt * 4, KVG_VK_MEM_DEVICE, &grown, err);
    if (st == KVGEN_OK && ldt > L->ldt) L->ldt = ldt;
    if (st == KVGEN_OK && L->t.size / 4 / tok < L->ldt) L->ldt = (uint32_t)(L->t.size / 4 / tok);
    uint32_t tab_words = (uint32_t)hp->n_layer * LOP_COUNT * (2u * max_tok + 8u * entries);
    if (st == KVGEN_OK && tab_words > L->tab_cap) {
        st = ensure(vm, &L->tab, (size_t)tab_words * 4, KVG_VK_MEM_HOST, &grown, err);
        if (st == KVGEN_OK && !L->tab.map)
            st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: device %s offers no host-visible coherent memory",
                          vm->ctx->info.name);
        if (st == KVGEN_OK) L->tab_cap = tab_words;
    }
    if (st == KVGEN_OK && max_tok > L->cap_tok) {
        kvg_free(L->tok_sets);
        kvg_free(L->tok_bases);
        kvg_free(L->set_bases);
        L->tok_sets = kvg_calloc(max_tok, sizeof *L->tok_sets);
        L->tok_bases = kvg_calloc(max_tok, sizeof *L->tok_bases);
        L->set_bases = kvg_calloc(max_tok, sizeof *L->set_bases);
        L->cap_tok = L->tok_sets && L->tok_bases && L->set_bases ? max_tok : 0;
        if (!L->cap_tok) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory for LoRA adapters");
    }
    if (st == KVGEN_OK && (grown || d_grown || !L->sets_ok)) st = make_sets(vm, err);
    return st;
}

void kvg_vk_lora_step(vk_model *vm, const kvg_lora_set *const *tok_sets, uint32_t n) {
    vk_lora *L = vm->lora;
    L->n_tok = n;
    L->tab_used = 0;
    for (uint32_t c = 0; c < n; c++) {
        L->tok_sets[c] = tok_sets[c];
        L->tok_bases[c] = L->set_bases[c];
        for (int i = 0; tok_sets[c] && i < tok_sets[c]->n; i++)
            L->set_bases[c][i] = (uint64_t)held_base(L, tok_sets[c]->adapter[i]);
    }
}

void kvg_vk_lora_step_seq(vk_model *vm, const kvg_lora_set *set, uint32_t n) {
    vk_lora *L = vm->lora;
    L->n_tok = n;
    L->tab_used = 0;
    for (int i = 0; i < set->n; i++) L->set_bases[0][i] = (uint64_t)held_base(L, set->adapter[i]);
    for (uint32_t c = 0; c < n; c++) {
        L->tok_sets[c] = set;
        L->tok_bases[c] = L->set_bases[0];
    }
}

void kvg_vk_lora_end(vk_model *vm) {
    if (vm->lora) vm->lora->n_tok = 0;
}

kvgen_status kvg_vk_lora_op(walk *w, int layer, int op, matmul_args *m) {
    vk_model *vm = w->vm;
    vk_lora *L = vm->lora;
    if (w->mode != WALK_RECORD || !L || L->n_tok == 0) return KVGEN_OK;
    kvg_vk_lora_part parts[3];
    int n_parts;
    uint32_t n_in, ldx, nrows;
    const kvg_vk_buffer *in, *norm;
    op_shape(vm, layer, (vk_lora_op)op, &in, &norm, parts, &n_parts, &n_in, &ldx, &nrows);
    if (L->tab_used + kvg_vk_lora_table_words(L->tok_sets, w->n, n_parts) > L->tab_cap)
        return kvg_fail(w->err, KVGEN_E_INTERNAL, "vulkan: the step's LoRA tables outgrew their buffer (%u words)",
                        L->tab_cap);
    uint32_t *tab = (uint32_t *)L->tab.map + L->tab_used;
    uint32_t ranks = 0;
    uint32_t words = kvg_vk_lora_table(tab, L->tok_sets, w->n, layer, parts, n_parts,
                                       (const uint64_t *const *)L->tok_bases, &ranks);
    if (ranks == 0) return KVGEN_OK; /* no token's set adapts this mat-mul */
    if (ranks > L->ldt)
        return kvg_fail(w->err, KVGEN_E_INTERNAL, "vulkan: LoRA ranks %u over the scratch's %u", ranks, L->ldt);
    kvg_vk_lora_args a = {.ncols = w->n, .ldx = ldx, .ldt = L->ldt, .ldd = nrows, .n_in = n_in, .nrows = nrows,
                          .tab_off = L->tab_used, .norm = norm != NULL, .eps = vm->hp.rms_norm_eps};
    L->tab_used += words;
    kvgen_status st = kvg_vk_lora_record(vm->ctx, w->cb, L->down[layer * LOP_COUNT + op], L->up, &a, w->err);
    m->flags |= EPI_F_LORA;
    m->ldd = nrows;
    return st;
}
