/* vk_kv.c: the Vulkan backend's KV storage (private to the backend). Every session's K/V live
 * in the model's paged pool; this file owns the layout the shaders see (shaders/kv.glsl:
 * specialization constants, push-constant fields and bindings of a layer, for the step walker)
 * and the pool itself: its layout over slabs, slab creation on first use (kv_page_commit),
 * page-table checks, reads and writes of pages from the host, and kv_copy
 * (shaders/kv_copy.comp). Creating the pipelines the pool's layout needs is the backend's
 * (vk_backend.c, kv_pages_init), which walks the step after kvg_vk_kv_pool_init: no pipeline
 * that touches the KV exists before the layout does. Calls vk_weights.c (the buffer range),
 * vk_device.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_quant.h"
#include "kvg_vk_backend.h"

typedef struct pc_kv_copy { /* matches PC in shaders/kv_copy.comp */
    uint32_t n, hd, n_layer, n_kv, src_tab, dst_tab, src_pos, dst_pos, kv_page, kv_v, n_rot, cs_off, rope;
} pc_kv_copy;

/* kv_copy moves at most this many pages' worth of positions per submission (its tables live in
 * a fixed host-visible buffer) */
#define KV_OPS_PAGES 1024

/* the KV layout constants of shaders/kv.glsl */
void kvg_vk_kv_spec(const vk_model *vm, uint32_t spec[KVG_SPEC_COUNT]) {
    spec[KVG_SPEC_KV_F16] = vm->ctx->kv_f16;
    spec[KVG_SPEC_PAGE] = (uint32_t)vm->page_size;
    spec[KVG_SPEC_PPS] = vm->pps;
    spec[KVG_SPEC_NSLAB] = vm->nslab;
    spec[KVG_SPEC_KV_BLOCK] = vm->kv_block;
}

/* The pool's unit: the element of f16 / f32 pages, the byte of block pages (a row of hd elements
 * is hd / 32 blocks of kv_block bytes: an f16 scale, then 32 int8 (q8_0) or 32 nibbles (q4_0);
 * head_dim % 32 == 0 is checked at load).
 * Offsets the shaders get (kv_layer, kv_v, kv_page) are in units. */
static size_t unit_bytes(const vk_model *vm) { return vm->kv_block ? 1 : vm->ctx->kv_f16 ? 2 : 4; }
uint32_t kvg_vk_kv_row_units(const vk_model *vm) {
    uint32_t hd = (uint32_t)vm->hp.head_dim;
    return vm->kv_block ? hd / 32u * vm->kv_block : hd;
}
/* bytes a slab has past its last page: attn_lane.comp reads a block row as the 16-byte words
 * around it */
static size_t slab_tail(const vk_model *vm) { return vm->kv_block ? 64 : 0; }

int kvg_vk_kv_group(const vk_model *vm, int layer) { return vm->kv_group ? vm->kv_group[layer] : 0; }

static int kv_slot(const vk_model *vm, int layer) { return vm->kv_slot ? vm->kv_slot[layer] : layer; }
static uint32_t kv_elems(const vk_model *vm, int g) { return g ? vm->page_elems1 : vm->page_elems; }
static size_t kv_bytes(const vk_model *vm, int g) { return g ? vm->page_bytes1 : vm->page_bytes; }

int32_t kvg_vk_kv_device_page(const vk_model *vm, int g, int32_t q) { return g && q >= 0 ? vm->kv_base1 + q : q; }

/* whether device page d of group g has storage */
static bool page_ok(const vk_model *vm, int g, int32_t d) {
    int32_t base = g ? vm->kv_base1 : 0;
    return d >= base && d < base + vm->n_pages && vm->slabs[(uint32_t)d / vm->pps].buf;
}

/* push-constant fields of the paged layout for one layer: its offset in its group's page, the
 * group's page size and the first entry of its table in the session's table buffer */
void kvg_vk_kv_pc(const vk_model *vm, const kvg_backend_session *s, int layer, uint32_t *kv_layer, uint32_t *kv_page,
                  uint32_t *kv_v, uint32_t *pt_base) {
    const kvg_hparams *hp = &vm->hp;
    uint32_t v = (uint32_t)(hp->n_head_kv * vm->page_size) * kvg_vk_kv_row_units(vm);
    int g = kvg_vk_kv_group(vm, layer);
    *kv_v = v;
    *kv_layer = (uint32_t)kv_slot(vm, layer) * 2u * v;
    *kv_page = kv_elems(vm, g);
    *pt_base = g && s ? s->tab1 : 0u;
}

/* binds the KV storage of a layer: the pool's slabs (those created so far; the others stay the
 * dummy buffer, no page of theirs is in any table) and the session's page table */
void kvg_vk_kv_bind(const vk_model *vm, const kvg_backend_session *s, kvg_vk_binding b[KVG_VK_BINDINGS]) {
    for (uint32_t j = 0; j < vm->nslab; j++)
        if (vm->slabs[j].buf) b[KVG_VK_SLAB_SLOT(j)].buf = &vm->slabs[j];
    b[KVG_VK_PTAB].buf = kvg_vk_mirror_bound(&s->ptab);
}

size_t kvg_vk_cache_bytes_per_token(const kvgen_model *m) {
    const vk_model *vm = m->backend;
    const kvg_hparams *hp = &m->w.hp;
    if (!vm || !vm->ctx) return (size_t)hp->n_layer * 2 * (size_t)hp->n_head_kv * (size_t)hp->head_dim * 2;
    return (size_t)hp->n_layer * 2 * (size_t)hp->n_head_kv * kvg_vk_kv_row_units(vm) * unit_bytes(vm);
}

/* ---- the paged KV pool ---- */

kvgen_status kvg_vk_check_pages(const vk_model *vm, int g, const int32_t *pages, size_t n_entries, kvgen_error *err) {
    for (size_t i = 0; i < n_entries; i++) {
        if (g && pages[i] < 0) continue; /* released below the window */
        if (pages[i] < 0 || pages[i] >= vm->n_pages || !page_ok(vm, g, kvg_vk_kv_device_page(vm, g, pages[i])))
            return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: page table %d entry %zu names page %d, which has no "
                            "storage", g, i, (int)pages[i]);
    }
    return KVGEN_OK;
}

/* A share of the device-local heap for K/V (a quarter, leaving room for the weights, the
 * scratch, other models and the game's own resources), no more than 16 sessions of
 * min(context_length, 8192) tokens, and no more than the 8 slabs can bind (with room for
 * rounding to whole pages). Memory is taken one slab (1/8 of the pool) at a time. */
size_t kvg_vk_default_pool_bytes(const kvgen_model *m) {
    const vk_model *vm = m->backend;
    const kvg_hparams *hp = &m->w.hp;
    size_t ctx_tokens = hp->n_ctx_train > 0 && hp->n_ctx_train < 8192 ? (size_t)hp->n_ctx_train : 8192;
    size_t want = 16 * ctx_tokens * kvg_vk_cache_bytes_per_token(m);
    size_t heap = (size_t)vm->ctx->info.device_local_bytes / 4;
    if (heap && want > heap) want = heap;
    size_t bindable = kvg_vk_max_part_bytes(vm->ctx) / 4 * 3 * KVG_VK_KV_SLABS;
    return want < bindable ? want : bindable;
}

/* The paged pool's layout (page_size tokens a page, n_pages pages over slabs) and kv_copy's
 * buffer, descriptor pool and command buffer; the pipelines come after (vk_backend.c). */
kvgen_status kvg_vk_kv_pool_init(kvgen_model *m, int page_size, int32_t n_pages, kvgen_error *err) {
    vk_model *vm = m->backend;
    kvg_vk_ctx *ctx = vm->ctx;
    const kvg_hparams *hp = &vm->hp;
    /* the layer groups: the global layers' pages as before, the local ones' in slabs of their own */
    int G = m->kv.n_groups > 1 ? 2 : 1;
    uint64_t per_layer = 2 * (uint64_t)hp->n_head_kv * (uint64_t)page_size * kvg_vk_kv_row_units(vm);
    uint64_t elems = per_layer * (uint64_t)(G > 1 ? m->kv.n_layers[0] : hp->n_layer);
    uint64_t elems1 = G > 1 ? per_layer * (uint64_t)m->kv.n_layers[1] : 0;
    if (elems == 0) elems = 2; /* a group without layers: pages of one unused element pair */
    uint64_t big = elems > elems1 ? elems : elems1;
    size_t elem = unit_bytes(vm), limit = kvg_vk_max_part_bytes(ctx) - slab_tail(vm);
    uint64_t per_slab = limit / (big * elem);
    if (per_slab == 0)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: one KV page of %d tokens (%llu bytes) exceeds the device's "
                        "storage buffer range (%zu bytes); use a smaller kv_page_size", page_size,
                        (unsigned long long)(elems * elem), limit);
    uint64_t slabs_per_group = KVG_VK_KV_SLABS / (uint64_t)G;
    if ((uint64_t)n_pages > per_slab * slabs_per_group)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: a KV pool of %d pages (%llu bytes) exceeds what the device "
                        "can bind: %d buffers of %zu bytes (maxStorageBufferRange); use a smaller kv_pool_bytes",
                        (int)n_pages, (unsigned long long)((uint64_t)n_pages * (elems + elems1) * elem),
                        (int)slabs_per_group, limit);
    /* As few slabs as the range allows: with one, the shaders' slab switch compiles away (on
     * lavapipe, 8 slabs cost 20-30% of decode at depth 2048). KVGEN_VK_LAZY_SLABS=1 spreads the
     * pool over 8 slabs instead, so memory is taken an eighth of the pool at a time. */
    uint64_t pps = per_slab;
    if (getenv("KVGEN_VK_LAZY_SLABS") && atoi(getenv("KVGEN_VK_LAZY_SLABS")) > 0) {
        pps = ((uint64_t)n_pages + slabs_per_group - 1) / slabs_per_group;
        if (pps > per_slab) pps = per_slab;
    }
    vm->page_size = page_size;
    vm->n_pages = n_pages;
    vm->page_elems = (uint32_t)elems;
    vm->page_bytes = (size_t)(elems * elem);
    vm->pps = (uint32_t)pps;
    vm->nslab = (uint32_t)(((uint64_t)n_pages + pps - 1) / pps);
    vm->kv_groups = G;
    vm->nslab0 = vm->nslab;
    vm->kv_group = vm->kv_slot = NULL;
    vm->page_elems1 = 0;
    vm->page_bytes1 = 0;
    vm->kv_base1 = 0;
    if (G > 1) {
        vm->kv_group = m->kv.group;
        vm->kv_slot = m->kv.slot;
        vm->page_elems1 = (uint32_t)elems1;
        vm->page_bytes1 = (size_t)(elems1 * elem);
        vm->kv_base1 = (int32_t)(vm->nslab0 * pps);
        vm->nslab = 2 * vm->nslab0;
    }
    kvgen_status st = kvg_vk_buffer_create(ctx, (2 * KV_OPS_PAGES + (size_t)hp->n_layer * (size_t)hp->n_rot + 4) * 4,
                                           KVG_VK_MEM_HOST, &vm->ops, err);
    if (st == KVGEN_OK && !vm->ops.map) st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: no host-visible memory");
    if (st == KVGEN_OK) st = kvg_vk_pool_create(ctx, 1, &vm->ops_pool, err);
    if (st == KVGEN_OK) {
        kvg_vk_lock(ctx);
        st = kvg_vk_cmd_alloc(ctx, &vm->ops_cb, err);
        kvg_vk_unlock(ctx);
    }
    vm->ops_gen = ~0u;
    return st;
}

kvgen_status kvg_vk_kv_page_commit(kvgen_model *m, int group, int32_t page, kvgen_error *err) {
    vk_model *vm = m->backend;
    kvg_vk_ctx *ctx = vm->ctx;
    if (!vm->pps)
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: the model's K/V pool has no layout (an encoder keeps no K/V)");
    if (page < 0 || page >= vm->n_pages || group < 0 || group >= (vm->kv_groups > 1 ? 2 : 1))
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: page %d of layer group %d outside the pool of %d", (int)page,
                        group, (int)vm->n_pages);
    /* slab j of the group, holding its pages from first on */
    uint32_t j = (uint32_t)kvg_vk_kv_device_page(vm, group, page) / vm->pps;
    if (vm->slabs[j].buf) return KVGEN_OK;
    uint32_t first = (j - (group ? vm->nslab0 : 0)) * vm->pps;
    uint32_t pages = (uint32_t)vm->n_pages - first < vm->pps ? (uint32_t)vm->n_pages - first : vm->pps;
    size_t bytes = (size_t)pages * kv_bytes(vm, group) + slab_tail(vm);
    kvg_vk_buffer b;
    kvgen_status st = kvg_vk_buffer_create(ctx, bytes, KVG_VK_MEM_UPLOAD, &b, err);
    if (st != KVGEN_OK)
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: no device memory for KV pages %u..%u of layer group %d (%zu "
                        "bytes): %s", first, first + pages - 1, group, bytes, err ? err->message : "");
    kvg_vk_lock(ctx);
    vm->slabs[j] = b;
    __atomic_add_fetch(&vm->kv_gen, 1, __ATOMIC_RELEASE);
    kvg_vk_unlock(ctx);
    return KVGEN_OK;
}

/* byte offset of (layer, which) of `page` inside its slab, after checking the page */
static kvgen_status page_region(const vk_model *vm, int32_t page, int layer, int which, const kvg_vk_buffer **slab,
                                size_t *off, kvgen_error *err) {
    int g = kvg_vk_kv_group(vm, layer);
    int32_t d = kvg_vk_kv_device_page(vm, g, page);
    if (page < 0 || page >= vm->n_pages || !page_ok(vm, g, d))
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: page %d of layer group %d has no storage", (int)page, g);
    const kvg_hparams *hp = &vm->hp;
    size_t v = (size_t)hp->n_head_kv * (size_t)vm->page_size * kvg_vk_kv_row_units(vm);
    size_t elem = unit_bytes(vm);
    *slab = &vm->slabs[(uint32_t)d / vm->pps];
    *off = ((size_t)((uint32_t)d % vm->pps) * kv_elems(vm, g) + ((size_t)kv_slot(vm, layer) * 2 + (size_t)which) * v) *
           elem;
    return KVGEN_OK;
}

/* Reads (write = false) or writes one layer's K or V of positions [pos0, pos0+n) as f32
 * (kv_heads, n, head_dim), a page's (layer, which) region at a time: a mapped copy where the
 * pool is host-visible (lavapipe, UMA, ReBAR), else a staging transfer. */
static kvgen_status kv_transfer(kvgen_model *m, const int32_t *pages, int layer, int which, int pos0, int n,
                                float *io, bool write, kvgen_error *err) {
    vk_model *vm = m->backend;
    const kvg_hparams *hp = &vm->hp;
    if (vm->page_size <= 0 || layer < 0 || layer >= hp->n_layer || which < 0 || which > 1 || pos0 < 0 || n < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: KV %s of layer %d, which %d, [%d, +%d) out of range",
                        write ? "write" : "read", layer, which, pos0, n);
    size_t P = (size_t)vm->page_size, hd = (size_t)hp->head_dim, H = (size_t)hp->n_head_kv;
    size_t unit = unit_bytes(vm), row = kvg_vk_kv_row_units(vm) * unit, region = H * P * row;
    uint32_t type = vm->kv_block ? vm->kv_qtype : unit == 2 ? KVG_TYPE_F16 : KVG_TYPE_F32;
    uint8_t *tmp = kvg_malloc(region);
    if (!tmp) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory for a KV transfer");
    /* a NEOX model's keys are held with each head's rotation pairs adjacent (vk_model.neox):
     * device element j is element src[j] of the file's order */
    uint32_t src[256];
    float dev[256]; /* one row in the device's element order */
    bool perm = which == 0 && vm->neox;
    for (uint32_t j = 0; perm && j < hd; j++) {
        uint32_t n_rot = (uint32_t)hp->n_rot;
        src[j] = j >= n_rot ? j : (j & 1u) ? n_rot / 2 + j / 2 : j / 2;
    }
    kvgen_status st = KVGEN_OK;
    for (size_t p = (size_t)pos0; p < (size_t)pos0 + (size_t)n && st == KVGEN_OK;) {
        size_t slot0 = p % P, cnt = P - slot0;
        if (cnt > (size_t)pos0 + (size_t)n - p) cnt = (size_t)pos0 + (size_t)n - p;
        const kvg_vk_buffer *slab = NULL;
        size_t off = 0;
        st = page_region(vm, pages[p / P], layer, which, &slab, &off, err);
        if (st == KVGEN_OK) st = kvg_vk_download(vm->ctx, slab, off, tmp, region, err);
        for (size_t h = 0; h < H && st == KVGEN_OK; h++)
            for (size_t i = 0; i < cnt; i++) {
                uint8_t *r = tmp + (h * P + slot0 + i) * row;
                float *f = io + (h * (size_t)n + (p - (size_t)pos0) + i) * hd;
                /* f16 rounds to nearest (saturating finite values), q8_0 / q4_0 quantize each block of
                 * 32 with its own scale, as the cpu backend's pages */
                if (write) {
                    for (size_t d = 0; d < hd; d++) dev[d] = f[perm ? src[d] : d];
                    kvg_quantize_row(type, dev, r, hd);
                } else {
                    kvg_dequantize_row(type, r, dev, hd);
                    for (size_t d = 0; d < hd; d++) f[perm ? src[d] : d] = dev[d];
                }
            }
        /* the slab is written only through its own region, the one page the caller holds alone */
        if (st == KVGEN_OK && write) st = kvg_vk_upload(vm->ctx, (kvg_vk_buffer *)slab, off, tmp, region, err);
        p += cnt;
    }
    kvg_free(tmp);
    return st;
}

kvgen_status kvg_vk_kv_read(kvgen_model *m, const int32_t *pages, int layer, int which, int pos0, int n,
                            float *out, kvgen_error *err) {
    return kv_transfer(m, pages, layer, which, pos0, n, out, false, err);
}

kvgen_status kvg_vk_kv_write(kvgen_model *m, const int32_t *pages, int layer, int which, int pos0, int n,
                             const float *in, kvgen_error *err) {
    return kv_transfer(m, pages, layer, which, pos0, n, (float *)in, true, err);
}

/* kv_copy.comp over [src_pos, +n) -> [dst_pos, +n). A move towards the start of one table that
 * overlaps itself runs in rounds of (src_pos - dst_pos) positions, one submission each, so no
 * dispatch reads a slot that it also writes. */
kvgen_status kvg_vk_kv_copy(kvgen_model *m, int group, const int32_t *src_pages, int src_pos,
                            const int32_t *dst_pages, int dst_pos, int n, int rope_delta, kvgen_error *err) {
    vk_model *vm = m->backend;
    kvg_vk_ctx *ctx = vm->ctx;
    const kvg_hparams *hp = &vm->hp;
    if (vm->page_size <= 0 || src_pos < 0 || dst_pos < 0 || n < 0 || group < 0 || group >= (vm->kv_groups > 1 ? 2 : 1))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: kv_copy [%d, +%d) -> %d of layer group %d out of range",
                        src_pos, n, dst_pos, group);
    /* with layer groups the sessions move K/V only as plain copies (a shift runs again instead):
     * the RoPE tables below are per model layer, a group's pages per slot */
    if (vm->kv_groups > 1 && rope_delta != 0)
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: kv_copy re-rotating by %d positions with layer groups",
                        rope_delta);
    if (n == 0) return KVGEN_OK;
    int P = vm->page_size;
    int piece_max = (KV_OPS_PAGES - 1) * P;
    if (src_pages == dst_pages && dst_pos < src_pos && src_pos - dst_pos < piece_max) piece_max = src_pos - dst_pos;
    uint32_t spec[KVG_SPEC_COUNT];
    spec_init(spec);
    kvg_vk_kv_spec(vm, spec);
    VkPipeline pipe = kvg_vk_pipeline_find(ctx, "kv_copy", spec);
    if (!pipe) return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: the kv_copy pipeline was not created");
    int32_t *ops = vm->ops.map;
    /* cos/sin of the position change for every layer with its own RoPE (base, scale, factors),
     * in double as the reference computes RoPE */
    for (int l = 0; l < hp->n_layer; l++) {
        const vk_layer *L = &vm->layers[l];
        for (int i = 0; i < hp->n_rot / 2; i++) {
            double theta = (double)rope_delta * (double)vm->rope_scale[L->rope] *
                           pow(vm->rope_base[L->rope], -2.0 * i / hp->n_rot);
            if (vm->rope_factors) theta /= (double)vm->rope_factors[i];
            float cs[2] = {(float)cos(theta), (float)sin(theta)};
            memcpy(ops + 2 * KV_OPS_PAGES + (size_t)l * (size_t)hp->n_rot + 2 * i, cs, sizeof cs);
        }
    }
    kvg_vk_lock(ctx);
    kvgen_status st = KVGEN_OK;
    unsigned gen = __atomic_load_n(&vm->kv_gen, __ATOMIC_ACQUIRE);
    if (vm->ops_gen != gen) {
        st = kvg_vk_check(vkResetDescriptorPool(ctx->dev, vm->ops_pool, 0), err, "vkResetDescriptorPool");
        kvg_vk_binding b[KVG_VK_BINDINGS] = {{0}};
        for (uint32_t j = 0; j < vm->nslab; j++)
            if (vm->slabs[j].buf) b[KVG_VK_SLAB_SLOT(j)].buf = &vm->slabs[j];
        b[KVG_VK_PTAB].buf = &vm->ops;
        if (st == KVGEN_OK) st = kvg_vk_set_create(ctx, vm->ops_pool, b, &vm->ops_set, err);
        if (st == KVGEN_OK) vm->ops_gen = gen;
    }
    for (int done = 0; done < n && st == KVGEN_OK;) {
        int c = n - done < piece_max ? n - done : piece_max;
        int s0 = src_pos + done, d0 = dst_pos + done;
        int ns = (s0 + c - 1) / P - s0 / P + 1, nd = (d0 + c - 1) / P - d0 / P + 1;
        for (int i = 0; i < ns; i++) {
            int32_t q = src_pages[s0 / P + i];
            ops[i] = kvg_vk_kv_device_page(vm, group, q);
            if (q < 0 || q >= vm->n_pages || !page_ok(vm, group, ops[i]))
                st = kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: kv_copy from page %d, which has no storage", (int)q);
        }
        for (int i = 0; i < nd; i++) {
            int32_t q = dst_pages[d0 / P + i];
            ops[KV_OPS_PAGES + i] = kvg_vk_kv_device_page(vm, group, q);
            if (q < 0 || q >= vm->n_pages || !page_ok(vm, group, ops[KV_OPS_PAGES + i]))
                st = kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: kv_copy to page %d, which has no storage", (int)q);
        }
        int n_layer = vm->kv_groups > 1 ? m->kv.n_layers[group] : hp->n_layer;
        pc_kv_copy pc = {.n = (uint32_t)c,
                         .hd = (uint32_t)hp->head_dim,
                         .n_layer = (uint32_t)n_layer,
                         .n_kv = (uint32_t)hp->n_head_kv,
                         .src_tab = 0,
                         .dst_tab = KV_OPS_PAGES,
                         .src_pos = (uint32_t)(s0 % P),
                         .dst_pos = (uint32_t)(d0 % P),
                         .kv_page = kv_elems(vm, group),
                         .kv_v = (uint32_t)(hp->n_head_kv * P) * kvg_vk_kv_row_units(vm),
                         .n_rot = (uint32_t)hp->n_rot,
                         .cs_off = 2 * KV_OPS_PAGES,
                         .rope = rope_delta != 0};
        if (st == KVGEN_OK) st = kvg_vk_check(vkResetCommandBuffer(vm->ops_cb, 0), err, "vkResetCommandBuffer");
        if (st == KVGEN_OK) st = kvg_vk_cmd_begin(vm->ops_cb, true, err);
        if (st == KVGEN_OK) {
            /* an invocation per (position, element pair), or per (position, block) of block pages */
            size_t per_pos = (size_t)hp->head_dim / (vm->kv_block ? 32 : 2);
            uint32_t groups = (uint32_t)(((size_t)c * per_pos + 63) / 64);
            kvg_vk_cmd_dispatch(ctx, vm->ops_cb, pipe, vm->ops_set, &pc, sizeof pc, groups, 1, 1);
            kvg_vk_cmd_barrier(vm->ops_cb);
            kvg_vk_cmd_host_barrier(vm->ops_cb);
            st = kvg_vk_cmd_end(vm->ops_cb, err);
            if (st == KVGEN_OK) st = kvg_vk_submit_wait(ctx, vm->ops_cb, ctx->fence, err);
        }
        done += c;
    }
    kvg_vk_unlock(ctx);
    return st;
}
