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

void kvg_vk_lora_pack(const kvgen_adapter *a, int n_layer, float *dst) {
    for (int l = 0; l < n_layer; l++)
        for (int t = 0; t < KVG_LORA_TARGETS; t++) {
            const kvg_lora_pair *p = kvg_adapter_pair(a, l, (kvg_lora_target)t);
            if (!p) continue;
            size_t na = (size_t)p->rank * p->n_in, nb = (size_t)p->rank * p->n_out;
            memcpy(dst, p->a, na * sizeof *dst);
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
    uint32_t w = n + 1, widest = 0;
    for (uint32_t c = 0; c < n; c++) {
        tab[c] = w;
        const kvg_lora_set *set = sets ? sets[c] : NULL;
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
        if (t_off > widest) widest = t_off;
    }
    tab[n] = w;
    if (ranks) *ranks = widest;
    return w;
}

uint32_t kvg_vk_lora_table_words(const kvg_lora_set *const *sets, uint32_t n, int n_parts) {
    uint32_t w = n + 1;
    for (uint32_t c = 0; c < n; c++) w += 8u * (uint32_t)n_parts * (uint32_t)(sets && sets[c] ? sets[c]->n : 0);
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
        for (int k = 0; k < n_held; k++) kvg_vk_lora_pack(held[k], n_layer, packed + held_base[k]);
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
        kvg_mutex_lock(&ctx->lock);
        VkCommandBuffer cb;
        st = kvg_vk_cmd_alloc(ctx, &cb, err);
        if (st == KVGEN_OK) {
            st = kvg_vk_cmd_begin(cb, true, err);
            kvg_vk_lora_args a = {.ncols = n, .ldx = ldx, .ldt = ldt, .ldd = nrows, .n_in = in_dim, .nrows = nrows,
                                  .norm = norm != NULL, .eps = eps};
            if (st == KVGEN_OK) st = kvg_vk_lora_record(ctx, cb, sets_vk[0], sets_vk[1], &a, err);
            kvg_vk_cmd_host_barrier(cb);
            kvgen_status st2 = kvg_vk_cmd_end(cb, err);
            if (st == KVGEN_OK) st = st2;
            if (st == KVGEN_OK) st = kvg_vk_submit_wait(ctx, cb, ctx->fence, err);
            vkFreeCommandBuffers(ctx->dev, ctx->cmd_pool, 1, &cb);
        }
        kvg_mutex_unlock(&ctx->lock);
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
