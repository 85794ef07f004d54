/* vk_hooks.c: the Vulkan backend's test hooks (kvg_vk.h): one mat-mul, embedding lookup or attention run
 * through the backend's own upload and step-walker ops on a throwaway model, for the kernel
 * tests; attention reads a one-layer paged KV pool filled through the pool's own page writes;
 * and what a loaded model's matrices were uploaded as (their parts and weight types).
 * Calls vk_walk.c, vk_kv.c, vk_weights.c, vk_device.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_quant.h"
#include "kvg_vk_backend.h"

typedef struct one_off_args {
    walk *w;
    kvgen_status (*op)(walk *, const void *);
    const void *arg;
} one_off_args;

static kvgen_status record_one_off(VkCommandBuffer cb, void *arg) {
    one_off_args *a = arg;
    a->w->cb = cb;
    a->w->mode = WALK_RECORD;
    a->w->cursor = 0;
    return a->op(a->w, a->arg);
}

static kvgen_status run_one_off(kvg_vk_ctx *ctx, walk *w, kvgen_status (*op)(walk *, const void *), const void *arg,
                                kvgen_error *err) {
    one_off_args a = {w, op, arg};
    return kvg_vk_run_once(ctx, record_one_off, &a, err);
}

const char *kvg_vk_layout_name(kvg_vk_layout layout) {
    switch (layout) {
    case KVG_VK_LAYOUT_DEVICE: return "device";
    case KVG_VK_LAYOUT_COOP: return "coop";
    case KVG_VK_LAYOUT_LANE: return "lane";
    case KVG_VK_LAYOUT_SUBGROUP: return "subgroup";
    case KVG_VK_LAYOUT_SUBGROUP_ONE: return "subgroup1";
    case KVG_VK_LAYOUT_DOT: return "dot";
    case KVG_VK_LAYOUT_HALF: return "half";
    case KVG_VK_LAYOUT_MATRIX: return "matrix";
    }
    return "?";
}

/* KVG_VK_LAYOUT_DEVICE: the lane kernels on CPU devices and subgroup reductions where the device
 * has subgroup arithmetic, as a model's load chooses them (vk_backend.c) */
static bool device_lane(const kvg_vk_ctx *ctx) { return ctx->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU; }

static kvgen_status op_matmul_v(walk *w, const void *a) { return kvg_vk_op_matmul(w, a); }
static kvgen_status op_attention_v(walk *w, const void *a) { return kvg_vk_op_attention(w, 0 * (a != NULL)); }

kvgen_status kvg_vk_test_matmul(kvg_vk_ctx *ctx, uint32_t type, const void *wdata, uint32_t rows, uint32_t K,
                                const float *x, uint32_t ncols, const float *norm, float eps, int epi,
                                kvg_vk_layout layout, float *y, kvgen_error *err) {
    if (epi != EPI_STORE && epi != EPI_ADD && epi != EPI_SWIGLU)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvg_vk_test_matmul: epilogue %d", epi);
    vk_model vm = {0};
    vm.ctx = ctx;
    vm.hp.rms_norm_eps = eps;
    vm.hp.head_dim = 2;
    bool dev = layout == KVG_VK_LAYOUT_DEVICE;
    vm.mv_lane = dev ? device_lane(ctx) : layout == KVG_VK_LAYOUT_LANE;
    vm.subgroup = dev ? ctx->info.subgroup_arithmetic
                      : layout == KVG_VK_LAYOUT_SUBGROUP || layout == KVG_VK_LAYOUT_SUBGROUP_ONE ||
                            layout == KVG_VK_LAYOUT_DOT || layout == KVG_VK_LAYOUT_MATRIX;
    if (vm.subgroup && !ctx->info.subgroup_arithmetic)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "kvg_vk_test_matmul: device %s has no subgroup arithmetic",
                        ctx->info.name);
    vm.act8_dot = layout == KVG_VK_LAYOUT_DOT;
    vm.gemm_half = dev ? !device_lane(ctx) : layout == KVG_VK_LAYOUT_HALF;
    vm.gemm_coop = dev ? !device_lane(ctx) && ctx->coopmat : layout == KVG_VK_LAYOUT_MATRIX;
    if (vm.gemm_coop && !ctx->coopmat)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "kvg_vk_test_matmul: device %s has no cooperative matrices",
                        ctx->info.name);
    if (vm.act8_dot && !ctx->int_dot)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "kvg_vk_test_matmul: device %s has no integer dot products",
                        ctx->info.name);
    vm.mv_wg = kvg_vk_matvec_wg(ctx, vm.mv_lane, vm.subgroup && layout != KVG_VK_LAYOUT_SUBGROUP);
    vm.mv_rows = 4;
    vm.lane_rows = 8;
    vm.lane_ubo = true;
    kvg_tensor t = {.name = "test", .type = type, .n_dims = 2, .ne = {K, rows, 1, 1},
                    .n_elements = (uint64_t)K * rows, .data = wdata};
    const kvg_tensor *tp = &t;
    vk_matrix m = {0};
    kvg_backend_session s = {.n_ctx = 1};
    kvg_vk_buffer xb = {0}, yb = {0}, nb = {0};
    uint32_t ldx = round_up(K, 32), ldo = epi == EPI_SWIGLU ? rows / 2 : rows;
    float *xp = kvg_calloc((size_t)ncols * ldx + 32, sizeof *xp);
    kvgen_status st = xp ? KVGEN_OK : kvg_fail(err, KVGEN_E_NO_MEMORY, "out of memory");
    if (st == KVGEN_OK) st = kvg_vk_upload_matrix(&vm, "test", &tp, 1, false, &m, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, 16 + 16, KVG_VK_MEM_HOST, &vm.params.host, err);
    size_t win = ctx->ubo_window;
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)ncols * ldx * 4 + win, KVG_VK_MEM_DEVICE, &xb, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)ncols * ldo * 4, KVG_VK_MEM_DEVICE, &yb, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)ldx * 4 + win, KVG_VK_MEM_DEVICE, &nb, err);
    if (st == KVGEN_OK) {
        for (uint32_t c = 0; c < ncols; c++) memcpy(xp + (size_t)c * ldx, x + (size_t)c * K, (size_t)K * 4);
        st = kvg_vk_upload(ctx, &xb, 0, xp, (size_t)ncols * ldx * 4, err);
    }
    if (st == KVGEN_OK && epi == EPI_ADD) st = kvg_vk_upload(ctx, &yb, 0, y, (size_t)ncols * ldo * 4, err);
    if (st == KVGEN_OK && norm) {
        memset(xp, 0, (size_t)ldx * 4);
        memcpy(xp, norm, (size_t)K * 4);
        st = kvg_vk_upload(ctx, &nb, 0, xp, (size_t)ldx * 4, err);
    }
    matmul_args a = {.m = &m, .epi = epi, .norm = norm ? &nb : NULL, .in = &xb, .out = &yb, .ldx = ldx, .ldo = ldo,
                     .ncols = ncols};
    walk w = {.mode = WALK_PIPELINES, .vm = &vm, .s = &s, .n = ncols, .err = err};
    if (st == KVGEN_OK) st = kvg_vk_op_matmul(&w, &a);
    if (st == KVGEN_OK) {
        s.sets = kvg_calloc((size_t)m.n_parts, sizeof *s.sets);
        if (!s.sets) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "out of memory");
    }
    if (st == KVGEN_OK) st = kvg_vk_pool_create(ctx, (uint32_t)m.n_parts, &s.pool, err);
    if (st == KVGEN_OK) {
        w.mode = WALK_SETS;
        st = kvg_vk_op_matmul(&w, &a);
    }
    if (st == KVGEN_OK) st = run_one_off(ctx, &w, op_matmul_v, &a, err);
    if (st == KVGEN_OK) st = kvg_vk_download(ctx, &yb, 0, y, (size_t)ncols * ldo * 4, err);
    if (s.pool) vkDestroyDescriptorPool(ctx->dev, s.pool, NULL);
    kvg_free(s.sets);
    kvg_free(xp);
    kvg_vk_free_matrix(ctx, &m);
    kvg_vk_buffer_destroy(ctx, &vm.params.host);
    kvg_vk_buffer_destroy(ctx, &xb);
    kvg_vk_buffer_destroy(ctx, &yb);
    kvg_vk_buffer_destroy(ctx, &nb);
    return st;
}

/* The embedding lookup as kvg_vk_op_embed (vk_walk.c) records it: embed_<type>, one workgroup of 64
 * per token, one dispatch per part of the matrix, push constants in the weight kernels' layout
 * with word 9 the scale (embed.comp). */
typedef struct pc_embed { /* matches PC in shaders/embed.comp */
    uint32_t nrows, nb, scale_off, ncols, ldx, ldo, row0, x_off, kreal;
    float embd_scale;
} pc_embed;

typedef struct embed_args {
    kvg_vk_ctx *ctx;
    const vk_matrix *m;
    VkPipeline pipe;
    const VkDescriptorSet *sets;
    uint32_t n, ldo;
    float scale;
} embed_args;

static kvgen_status record_embed(VkCommandBuffer cb, void *arg) {
    const embed_args *a = arg;
    for (int i = 0; i < a->m->n_parts; i++) {
        pc_embed pc = {.nrows = a->m->parts[i].rows, .nb = a->m->nb, .scale_off = a->m->parts[i].scale_off,
                       .ncols = a->n, .ldo = a->ldo, .row0 = a->m->parts[i].row0, .embd_scale = a->scale};
        if (i > 0) kvg_vk_cmd_barrier(cb); /* the parts write one buffer */
        kvg_vk_cmd_dispatch(a->ctx, cb, a->pipe, a->sets[i], &pc, sizeof pc, a->n, 1, 1);
    }
    return KVGEN_OK;
}

kvgen_status kvg_vk_test_embed(kvg_vk_ctx *ctx, uint32_t type, const void *wdata, uint32_t rows, uint32_t K,
                               const int32_t *tokens, uint32_t n, float scale, float *out, kvgen_error *err) {
    if (n == 0 || rows == 0 || K == 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvg_vk_test_embed: bad shape");
    vk_model vm = {0};
    vm.ctx = ctx;
    kvg_tensor t = {.name = "test", .type = type, .n_dims = 2, .ne = {K, rows, 1, 1},
                    .n_elements = (uint64_t)K * rows, .data = wdata};
    const kvg_tensor *tp = &t;
    vk_matrix m = {0};
    kvg_vk_buffer params = {0}, yb = {0};
    VkDescriptorPool pool = VK_NULL_HANDLE;
    VkDescriptorSet *sets = NULL;
    uint32_t ldo = round_up(K, 32);
    char name[32];
    uint32_t spec[KVG_SPEC_COUNT];
    spec_init(spec);
    spec[KVG_SPEC_WG] = 64;
    VkPipeline pipe = VK_NULL_HANDLE;
    kvgen_status st = kvg_vk_upload_matrix(&vm, "test", &tp, 1, false, &m, err);
    if (st == KVGEN_OK) {
        snprintf(name, sizeof name, "embed_%s", m.parts[0].wt->suffix); /* one tensor: one type */
        st = kvg_vk_pipeline_get(ctx, name, spec, &pipe, err);
    }
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, 16 + (size_t)n * 4, KVG_VK_MEM_HOST, &params, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)n * ldo * 4, KVG_VK_MEM_DEVICE, &yb, err);
    if (st == KVGEN_OK) {
        uint32_t *p = params.map;
        memset(p, 0, 16);
        memcpy(p + 4, tokens, (size_t)n * 4);
        sets = kvg_calloc((size_t)m.n_parts, sizeof *sets);
        if (!sets) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "out of memory");
    }
    if (st == KVGEN_OK) st = kvg_vk_pool_create(ctx, (uint32_t)m.n_parts, &pool, err);
    for (int i = 0; i < m.n_parts && st == KVGEN_OK; i++) {
        kvg_vk_binding b[KVG_VK_BINDINGS] = {{0}};
        b[0].buf = &params;
        b[1].buf = &m.parts[i].buf;
        b[3].buf = &yb;
        st = kvg_vk_set_create(ctx, pool, b, &sets[i], err);
    }
    if (st == KVGEN_OK) {
        embed_args a = {ctx, &m, pipe, sets, n, ldo, scale};
        st = kvg_vk_run_once(ctx, record_embed, &a, err);
    }
    float *tmp = st == KVGEN_OK ? kvg_malloc((size_t)n * ldo * 4) : NULL;
    if (st == KVGEN_OK && !tmp) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "out of memory");
    if (st == KVGEN_OK) st = kvg_vk_download(ctx, &yb, 0, tmp, (size_t)n * ldo * 4, err);
    if (st == KVGEN_OK)
        for (uint32_t i = 0; i < n; i++) memcpy(out + (size_t)i * K, tmp + (size_t)i * ldo, (size_t)K * 4);
    kvg_free(tmp);
    if (pool) vkDestroyDescriptorPool(ctx->dev, pool, NULL);
    kvg_free(sets);
    kvg_vk_free_matrix(ctx, &m);
    kvg_vk_buffer_destroy(ctx, &params);
    kvg_vk_buffer_destroy(ctx, &yb);
    return st;
}

/* The attention hook's page order: the pool's n_pages pages in order, or shuffled (a fixed
 * pseudo-random permutation); the session's table is the first entries. */
static void hook_page_order(int32_t *order, int32_t n_pages, bool shuffle) {
    for (int32_t i = 0; i < n_pages; i++) order[i] = i;
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int32_t i = n_pages - 1; shuffle && i > 0; i--) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int32_t j = (int32_t)((r >> 33) % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

kvgen_status kvg_vk_test_attention(kvg_vk_ctx *ctx, int n_head, int n_kv, int hd, int n_ctx, int pos0, int ncols,
                                   int nsplit, kvg_vk_layout layout, int page_size, bool shuffle, uint32_t kv_type,
                                   const float *q, const float *k, const float *v, float *out, kvgen_error *err) {
    return kvg_vk_test_attention_layer(ctx, n_head, n_kv, hd, n_ctx, pos0, ncols, nsplit, layout, page_size, shuffle,
                                       kv_type, 0, 0.0f, q, k, v, out, err);
}

kvgen_status kvg_vk_test_attention_layer(kvg_vk_ctx *ctx, int n_head, int n_kv, int hd, int n_ctx, int pos0,
                                         int ncols, int nsplit, kvg_vk_layout layout, int page_size, bool shuffle,
                                         uint32_t kv_type, int window, float softcap, const float *q, const float *k,
                                         const float *v, float *out, kvgen_error *err) {
    if (n_head <= 0 || n_kv <= 0 || n_head % n_kv || n_head / n_kv > 8 || hd <= 0 || hd > 256 || hd % 2 ||
        ncols <= 0 || pos0 < 0 || pos0 + ncols > n_ctx || nsplit <= 0 || page_size <= 0 || page_size > 256 ||
        window < 0 || !(softcap >= 0.0f) ||
        (kv_type && (hd % 32 || (kv_type != KVG_TYPE_Q8_0 && kv_type != KVG_TYPE_Q4_0))))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvg_vk_test_attention: bad shape");
    vk_model vm = {0};
    vk_layer layer = {.window = (uint32_t)window}; /* the layer's attention facts */
    vm.layers = &layer;
    vm.attn_softcap = softcap;
    kvgen_model model = {.backend = &vm}; /* what the pool's page ops take */
    vm.ctx = ctx;
    vm.hp.n_layer = 1;
    vm.hp.n_head = n_head;
    vm.hp.n_head_kv = n_kv;
    vm.hp.head_dim = hd;
    vm.kv_qtype = kv_type;
    vm.kv_block = kv_type == KVG_TYPE_Q8_0 ? 34u : kv_type == KVG_TYPE_Q4_0 ? 18u : 0u;
    vm.ld_q = (uint32_t)(n_head * hd);
    bool dev = layout == KVG_VK_LAYOUT_DEVICE;
    vm.attn_lane = (dev ? device_lane(ctx) : layout == KVG_VK_LAYOUT_LANE) && hd % 8 == 0;
    vm.subgroup = dev ? ctx->info.subgroup_arithmetic : layout >= KVG_VK_LAYOUT_SUBGROUP;
    if (vm.subgroup && !ctx->info.subgroup_arithmetic)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "kvg_vk_test_attention: device %s has no subgroup arithmetic",
                        ctx->info.name);
    /* a one-layer pool in one slab, as kvg_vk_kv_pool_init lays it out: page q at q * page_elems,
     * K then V as [n_kv][P][row]; shuffled, half as many pages again as the session uses */
    size_t elem = kv_type ? 1 : ctx->kv_f16 ? 2 : 4;
    int32_t used = (int32_t)((n_ctx + page_size - 1) / page_size);
    int32_t n_pages = shuffle ? used + used / 2 + 1 : used;
    vm.page_size = page_size;
    vm.n_pages = n_pages;
    vm.page_elems = (uint32_t)(2 * (size_t)n_kv * (size_t)page_size * kvg_vk_kv_row_units(&vm));
    vm.page_bytes = (size_t)vm.page_elems * elem;
    vm.pps = (uint32_t)n_pages;
    vm.nslab = 1;
    if ((size_t)n_pages * vm.page_bytes > kvg_vk_max_part_bytes(ctx))
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "kvg_vk_test_attention: %d pages of %zu bytes exceed one slab",
                        (int)n_pages, vm.page_bytes);
    kvg_backend_session s = {.n_ctx = n_ctx, .nsplit_dec = (uint32_t)nsplit};
    uint32_t split_min = kvg_vk_attn_loop_splits((uint64_t)n_ctx);
    if (s.nsplit_dec < split_min) s.nsplit_dec = split_min;
    size_t nq = (size_t)ncols * vm.ld_q;
    int32_t *tab = kvg_malloc((size_t)n_pages * sizeof *tab);
    void *fill = kvg_malloc(vm.page_bytes);
    kvgen_status st = tab && fill ? KVGEN_OK : kvg_fail(err, KVGEN_E_NO_MEMORY, "out of memory");
    if (st == KVGEN_OK) st = kvg_vk_kv_page_commit(&model, 0, 0, err);
    /* every slot NaN first: one the kernel reads but should not (another page, a slot past the
     * session's positions) spoils its output (block pages: every scale, at an even byte, is NaN) */
    if (st == KVGEN_OK) {
        if (elem == 1)
            for (size_t i = 0; i < vm.page_elems / 2; i++) ((uint16_t *)fill)[i] = 0x7e00;
        else if (elem == 2)
            for (size_t i = 0; i < vm.page_elems; i++) ((uint16_t *)fill)[i] = 0x7e00;
        else
            for (size_t i = 0; i < vm.page_elems; i++) ((uint32_t *)fill)[i] = 0x7fc00000u;
    }
    for (int32_t p = 0; p < n_pages && st == KVGEN_OK; p++)
        st = kvg_vk_upload(ctx, &vm.slabs[0], (VkDeviceSize)p * vm.page_bytes, fill, vm.page_bytes, err);
    if (st == KVGEN_OK) {
        hook_page_order(tab, n_pages, shuffle);
        st = kvg_vk_kv_write(&model, tab, 0, 0, 0, n_ctx, k, err);
    }
    if (st == KVGEN_OK) st = kvg_vk_kv_write(&model, tab, 0, 1, 0, n_ctx, v, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)used * sizeof *tab, KVG_VK_MEM_HOST, &s.ptab.host, err);
    if (st == KVGEN_OK) st = kvg_vk_upload(ctx, &s.ptab.host, 0, tab, (size_t)used * sizeof *tab, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, 16 + 16, KVG_VK_MEM_HOST, &vm.params.host, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, nq * 4, KVG_VK_MEM_DEVICE, &vm.q, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, nq * 4, KVG_VK_MEM_DEVICE, &vm.att, err);
    if (st == KVGEN_OK)
        st = kvg_vk_buffer_create(ctx, (size_t)ncols * s.nsplit_dec * (size_t)n_head * (size_t)(hd + 2) * 4,
                                  KVG_VK_MEM_DEVICE, &s.part, err);
    if (st == KVGEN_OK) st = kvg_vk_upload(ctx, &vm.q, 0, q, nq * 4, err);
    if (st == KVGEN_OK) {
        ((uint32_t *)vm.params.host.map)[0] = (uint32_t)pos0;
        ((uint32_t *)vm.params.host.map)[1] = 0;
    }
    /* lazy: the record compiles the one attention variant (plain or tiled, direct or split) the
     * case runs; a load builds all four, which on some drivers (Mesa 25's lavapipe compiles a
     * shader with barriers as a coroutine) takes minutes each */
    walk w = {.mode = WALK_SETS, .vm = &vm, .s = &s, .n = (uint32_t)ncols, .max_len = (uint32_t)(pos0 + ncols),
              .lazy = true, .err = err};
    VkDescriptorSet set = VK_NULL_HANDLE;
    s.sets = &set;
    if (st == KVGEN_OK) st = kvg_vk_pool_create(ctx, 1, &s.pool, err);
    if (st == KVGEN_OK) st = kvg_vk_op_attention(&w, 0);
    if (st == KVGEN_OK) st = run_one_off(ctx, &w, op_attention_v, NULL, err);
    if (st == KVGEN_OK) st = kvg_vk_download(ctx, &vm.att, 0, out, nq * 4, err);
    if (s.pool) vkDestroyDescriptorPool(ctx->dev, s.pool, NULL);
    kvg_free(tab);
    kvg_free(fill);
    kvg_vk_buffer *bufs[] = {&vm.params.host, &vm.q, &vm.att, &s.part, &s.ptab.host, &vm.slabs[0]};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kvg_vk_buffer_destroy(ctx, bufs[i]);
    return st;
}

/* the model's matrix named `which` (layer l for the per-layer ones), NULL when none is */
static const vk_matrix *model_matrix(const vk_model *vm, int l, const char *which) {
    if (strcmp(which, "token_embd") == 0) return &vm->embd;
    if (strcmp(which, "output") == 0) return &vm->output;
    if (l < 0 || l >= vm->hp.n_layer || !vm->layers) return NULL; /* (an encoder's layers are vk_encode.c's) */
    const vk_layer *L = &vm->layers[l];
    static const char *const names[] = {"attn_qkv", "attn_output", "ffn_gate_up", "ffn_down"};
    const vk_matrix *mats[] = {&L->qkv, &L->wo, &L->gateup, &L->down};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(which, names[i]) == 0) return mats[i];
    return NULL;
}

int kvg_vk_model_parts(const kvgen_model *m, int layer, const char *which, kvg_vk_part_info *out, int max) {
    if (!kvg_vk_model_ctx(m) || !which) return -1;
    const vk_matrix *mat = model_matrix(m->backend, layer, which);
    if (!mat) return -1;
    for (int i = 0; i < mat->n_parts && i < max; i++) {
        const vk_part *p = &mat->parts[i];
        out[i] = (kvg_vk_part_info){.type = p->type, .row0 = p->row0, .rows = p->rows, .bytes = p->buf.size};
    }
    return mat->n_parts;
}
