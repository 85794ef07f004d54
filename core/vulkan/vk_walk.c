/* vk_walk.c: the Vulkan backend's step walker (private to the backend). A step (a prefill chunk
 * of up to `chunk` tokens, or one decode token, or a batched decode of one token per session)
 * is one command buffer:
 *   embed (x embedding scale) -> per layer [QKV (+RMSNorm, biases, RoPE, K/V cache write)
 *   -> attention (sliding window, soft-cap; -> split reduce) -> Wo (+residual) -> gate/up
 *   (+RMSNorm, SwiGLU or GeGLU) -> down (+residual)] -> logits (+final norm, soft-cap)
 * A layer's optional parts (vk_layer) change the op list as data, the same for every
 * architecture: Q/K head norms make the QKV epilogue leave Q and K raw for rms_norm.comp
 * (norm, RoPE, K to the cache); a post norm makes Wo / down store their output for rms_norm.comp
 * (norm, then the residual add).
 * One function, kvg_vk_walk_step, walks those dispatches in order for every purpose (creating
 * the pipelines at load, counting and writing a session's descriptor sets, recording the
 * commands), so the three can never disagree. It owns the ops (mat-mul, embed, attention, norms),
 * the course every walk shares (an op's pipeline created or found, a session's sets counted and
 * written: for an encoder's walk too, vk_encode.c), recording a step (with the on-device
 * selection after it), rewriting a session's sets when the KV pool gained a slab, and the
 * KVGEN_VK_PROFILE timestamps. Calls vk_kv.c (KV layout),
 * vk_select.c, vk_device.c. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "kvg_vk_backend.h"

typedef struct pc_weights { /* matches PC in shaders/common.glsl */
    uint32_t nrows, nb, scale_off, ncols, ldx, ldo, row0, x_off, kreal;
    float eps;
    uint32_t nq, nk, hd, n_rot, n_ctx, o_off, c0;
    uint32_t kv_layer, kv_page, kv_v, pt_base; /* paged KV (shaders/kv.glsl) */
    uint32_t flags; /* EPI_F_* */
    float cap;      /* store mode: soft-capping */
    uint32_t ldd;   /* EPI_F_LORA: the delta's stride */
    uint32_t kv_raw; /* block pages: the raw K|V's offset in the output (vk_model.kv_raw) */
} pc_weights;

typedef struct pc_attn { /* matches PC in shaders/attn.comp, attn_lane.comp */
    uint32_t n_head, n_kv, hd, ldq, ldo, n_ctx, nsplit, ncols;
    float scale;
    uint32_t kv_layer, kv_page, kv_v, pt_base;
    uint32_t window;    /* sliding window (0: every position) */
    float softcap;      /* score soft-capping (0: none) */
    uint32_t split_min; /* attn.comp: the fewest positions a split covers (attn_lane.comp has its own) */
} pc_attn;

typedef struct pc_norm { /* matches PC in shaders/rms_norm.comp */
    uint32_t n, ldi, ldo, ncols;
    float eps;
    uint32_t n_head, n_rot, flags;
    uint32_t kv_layer, kv_page, kv_v, pt_base;
    uint32_t kv_raw; /* block pages: K and V heads go to the output at kv_raw (kv_store.comp) */
    uint32_t n_kv;
} pc_norm;

typedef struct pc_kv_store { /* matches PC in shaders/kv_store.comp */
    uint32_t n_kv, hd, ncols, kv_raw;
    uint32_t kv_layer, kv_page, kv_v, pt_base;
} pc_kv_store;

/* Whether the lane mat-vec reads this input (ldx floats per token) and the norm weight through
 * the uniform windows: a workgroup's tokens and the norm weight must fit one window, and every
 * token's offset must be a valid dynamic offset. */
static bool lane_ubo(const vk_model *vm, const vk_matrix *m, uint32_t ldx, uint32_t ncols) {
    const kvg_vk_ctx *ctx = vm->ctx;
    uint32_t per_group = ncols == 1 ? 1 : 8;
    VkDeviceSize align = ctx->props.limits.minUniformBufferOffsetAlignment;
    return vm->mv_lane && vm->lane_ubo && (size_t)per_group * ldx * 4 <= ctx->ubo_window &&
           (size_t)m->nb * 128 <= ctx->ubo_window && align && ((size_t)ldx * 4) % align == 0;
}

kvgen_status kvg_vk_walk_pipeline(walk *w, const char *shader, const uint32_t spec[KVG_SPEC_COUNT], VkPipeline *out) {
    if (w->mode == WALK_PIPELINES || (w->lazy && w->mode == WALK_RECORD))
        return kvg_vk_pipeline_get(w->vm->ctx, shader, spec, out, w->err);
    *out = kvg_vk_pipeline_find(w->vm->ctx, shader, spec);
    if (!*out) return kvg_fail(w->err, KVGEN_E_INTERNAL, "vulkan: pipeline %s was not created at load", shader);
    return KVGEN_OK;
}

kvgen_status kvg_vk_walk_sets(walk *w, kvgen_status (*walk_ops)(walk *w)) {
    kvg_backend_session *s = w->s;
    kvg_vk_ctx *ctx = w->vm->ctx;
    w->mode = WALK_COUNT;
    w->cursor = 0;
    kvgen_status st = walk_ops(w);
    if (st != KVGEN_OK) return st;
    s->n_sets = w->cursor;
    s->sets = kvg_calloc((size_t)s->n_sets, sizeof *s->sets);
    if (!s->sets) return kvg_fail(w->err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    st = kvg_vk_pool_create(ctx, (uint32_t)s->n_sets, &s->pool, w->err);
    if (st != KVGEN_OK) return st;
    /* the lock: the pool's slabs may be created meanwhile by another thread's session */
    kvg_vk_lock(ctx);
    s->kv_gen = __atomic_load_n(&w->vm->kv_gen, __ATOMIC_ACQUIRE);
    w->mode = WALK_SETS;
    w->cursor = 0;
    st = walk_ops(w);
    kvg_vk_unlock(ctx);
    return st;
}

uint32_t kvg_vk_matvec_wg(const kvg_vk_ctx *ctx, bool lane, bool one_subgroup) {
    if (lane) return 32;
    uint32_t sg = ctx->info.subgroup_size;
    if (one_subgroup && sg > 0) return sg < 64 ? sg : 64;
    return 64;
}

/* gemm.comp's tile (rows x tokens): 128 x 64 where the device's shared memory holds it (24.8
 * KiB), else 64 x 32 (12.6 KiB, within the 16 KiB every device has) */
static void gemm_tile(const kvg_vk_ctx *ctx, uint32_t *rows, uint32_t *cols) {
    uint32_t spec[KVG_SPEC_COUNT] = {0};
    spec[KVG_SPEC_ROWS] = 128;
    spec[KVG_SPEC_NCOLS] = 64;
    bool wide = kvg_vk_shader_fits(ctx, "gemm_", spec, NULL) == KVGEN_OK;
    *rows = wide ? 128 : 64;
    *cols = wide ? 64 : 32;
}

void kvg_vk_gemm_cm_spec(const kvg_vk_ctx *ctx, uint32_t spec[KVG_SPEC_COUNT]) {
    spec[KVG_SPEC_WG] = 4 * ctx->info.subgroup_size; /* four full subgroups */
    spec[KVG_SPEC_ROWS] = ctx->cm_m;                  /* gemm_cm.comp's CM, CN, CK */
    spec[KVG_SPEC_NCOLS] = ctx->cm_n;
    spec[KVG_SPEC_HD] = ctx->cm_k;
}

bool kvg_vk_gemm_cm_fits(const kvg_vk_ctx *ctx) {
    uint32_t spec[KVG_SPEC_COUNT] = {0};
    kvg_vk_gemm_cm_spec(ctx, spec);
    return ctx->coopmat && kvg_vk_shader_fits(ctx, "gemm_cm_", spec, NULL) == KVGEN_OK;
}

/* the prefill GEMM a part runs (gemm.comp's variants or gemm_cm.comp), as the load chose
 * (vk_backend.c), and its tile (rows x tokens) */
static const char *gemm_kind(const vk_model *vm, const vk_part *part) {
    if (vm->act8_dot && !part->wt->pad) return "gemm_dot";
    return vm->gemm_coop ? "gemm_cm" : vm->gemm_half ? "gemm_h" : "gemm";
}

static void gemm_dims(const vk_model *vm, const char *kind, uint32_t *rows, uint32_t *cols) {
    if (strcmp(kind, "gemm_cm") == 0) { /* four subgroups of 2 x 2 matrices */
        *rows = 4 * vm->ctx->cm_m;
        *cols = 4 * vm->ctx->cm_n;
        return;
    }
    gemm_tile(vm->ctx, rows, cols);
}

/* the mat-mul pipeline of one part (its weight type) for ncols tokens, created or found as
 * w->mode asks (kvg_vk_walk_pipeline) */
static kvgen_status matmul_pipeline(walk *w, const vk_matrix *m, const vk_part *part, int epi, bool norm,
                                    uint32_t ncols, uint32_t ldx, VkPipeline *out) {
    vk_model *vm = w->vm;
    char name[32];
    uint32_t spec[KVG_SPEC_COUNT];
    spec_init(spec);
    spec[KVG_SPEC_MODE] = (uint32_t)epi;
    spec[KVG_SPEC_NORM] = norm;
    spec[KVG_SPEC_KV_F16] = vm->ctx->kv_f16;
    if (epi == EPI_QKV) kvg_vk_kv_spec(vm, spec);
    if (ncols <= 8 || vm->mv_lane) {
        bool dot = vm->act8_dot && !part->wt->pad;
        snprintf(name, sizeof name, "%s_%s", dot ? "matvec_dot" : vm->subgroup ? "matvec_sg" : "matvec",
                 part->wt->suffix);
        spec[KVG_SPEC_WG] = vm->mv_wg;
        spec[KVG_SPEC_NCOLS] = ncols == 1 ? 1 : 8;
        spec[KVG_SPEC_ROWS] = vm->mv_lane ? vm->lane_rows : vm->mv_rows;
        spec[KVG_SPEC_LANE] = vm->mv_lane;
        spec[KVG_SPEC_UBO] = lane_ubo(vm, m, ldx, ncols) ? vm->ctx->ubo_window / 16 : 0;
    } else {
        const char *kind = gemm_kind(vm, part);
        snprintf(name, sizeof name, "%s_%s", kind, part->wt->suffix);
        if (strcmp(kind, "gemm_cm") == 0) {
            kvg_vk_gemm_cm_spec(vm->ctx, spec);
        } else {
            gemm_dims(vm, kind, &spec[KVG_SPEC_ROWS], &spec[KVG_SPEC_NCOLS]);
        }
    }
    return kvg_vk_walk_pipeline(w, name, spec, out);
}

kvgen_status kvg_vk_op_matmul(walk *w, const matmul_args *a) {
    vk_model *vm = w->vm;
    const kvg_hparams *hp = &vm->hp;
    kvgen_status st = KVGEN_OK;
    if (w->mode == WALK_PIPELINES) { /* every part's type (pipelines already made are found) */
        static const uint32_t variants[] = {1, 8, 9};
        VkPipeline p;
        for (int pi = 0; pi < a->m->n_parts; pi++)
            for (int i = 0; i < 3 && st == KVGEN_OK; i++)
                st = matmul_pipeline(w, a->m, &a->m->parts[pi], a->epi, a->norm, variants[i], a->ldx, &p);
        return st;
    }
    /* the dispatches of one op (parts, input windows) write one output buffer, each its own rows
     * or columns; a barrier between them still orders the writes, as the synchronization rules
     * (and validation) see the whole bound range */
    int dispatched = 0;
    for (int pi = 0; pi < a->m->n_parts; pi++) {
        const vk_part *part = &a->m->parts[pi];
        int idx = w->cursor++;
        if (w->mode == WALK_SETS) {
            kvg_vk_binding b[KVG_VK_BINDINGS] = {{0}};
            b[0].buf = kvg_vk_mirror_bound(&vm->params);
            b[1].buf = &part->buf;
            b[2].buf = a->in;
            b[3].buf = a->out;
            b[4].buf = a->norm;
            b[KVG_VK_UBO_X].buf = a->in;
            b[KVG_VK_UBO_NORM].buf = a->norm;
            b[6].buf = a->bias;
            b[KVG_VK_LORA].buf = vm->lora_d.buf ? &vm->lora_d : NULL;
            if (a->epi == EPI_QKV) {
                kvg_vk_kv_bind(vm, w->s, b);
                b[7].buf = w->s->rope[vm->layers ? vm->layers[a->layer].rope : 0];
            }
            st = kvg_vk_set_create(vm->ctx, w->s->pool, b, &w->s->sets[idx], w->err);
            if (st != KVGEN_OK) return st;
        } else if (w->mode == WALK_RECORD) {
            VkPipeline pipe;
            st = matmul_pipeline(w, a->m, part, a->epi, a->norm, a->ncols, a->ldx, &pipe);
            if (st != KVGEN_OK) return st;
            pc_weights pc = {.nrows = part->rows,
                             .nb = a->m->nb,
                             .scale_off = part->scale_off,
                             .ncols = a->ncols,
                             .ldx = a->ldx,
                             .ldo = a->ldo,
                             .row0 = part->row0,
                             .x_off = a->x_off,
                             .kreal = a->m->k,
                             .eps = hp->rms_norm_eps,
                             .nq = (uint32_t)(hp->n_head * hp->head_dim),
                             .nk = (uint32_t)(hp->n_head_kv * hp->head_dim),
                             .hd = (uint32_t)hp->head_dim,
                             .n_rot = (uint32_t)hp->n_rot,
                             .n_ctx = (uint32_t)w->s->n_ctx,
                             .o_off = 0,
                             .flags = a->flags | (a->bias ? EPI_F_BIAS : 0u),
                             .cap = a->cap,
                             .ldd = a->ldd,
                             .kv_raw = vm->kv_raw};
            if (a->epi == EPI_QKV) kvg_vk_kv_pc(vm, w->s, a->layer, &pc.kv_layer, &pc.kv_page, &pc.kv_v, &pc.pt_base);
            uint32_t gx, gy = 1;
            if (vm->mv_lane) { /* lane layout: lane_rows rows per invocation, 8 tokens per workgroup column */
                uint32_t per_wg = vm->lane_rows * vm->mv_wg;
                gx = (part->rows + per_wg - 1) / per_wg;
                gy = a->ncols == 1 ? 1 : (a->ncols + 7) / 8;
            } else if (a->ncols <= 8) {
                gx = (part->rows + vm->mv_rows - 1) / vm->mv_rows;
            } else {
                uint32_t tm, tn;
                gemm_dims(vm, gemm_kind(vm, part), &tm, &tn);
                gx = (part->rows + tm - 1) / tm;
                gy = (a->ncols + tn - 1) / tn;
            }
            if (lane_ubo(vm, a->m, a->ldx, a->ncols)) {
                /* one dispatch per workgroup column, its input window bound at its first token */
                for (uint32_t g = 0; g < gy; g++) {
                    pc.c0 = g * 8;
                    uint32_t off = (a->x_off + pc.c0 * a->ldx) * 4;
                    if (dispatched++) kvg_vk_cmd_barrier(w->cb);
                    kvg_vk_cmd_dispatch_at(vm->ctx, w->cb, pipe, w->s->sets[idx], &pc, sizeof pc, off, gx, 1, 1);
                }
            } else {
                if (dispatched++) kvg_vk_cmd_barrier(w->cb);
                kvg_vk_cmd_dispatch(vm->ctx, w->cb, pipe, w->s->sets[idx], &pc, sizeof pc, gx, gy, 1);
            }
        }
    }
    if (w->mode == WALK_RECORD) kvg_vk_cmd_barrier(w->cb);
    return KVGEN_OK;
}

kvgen_status kvg_vk_op_embed(walk *w) {
    vk_model *vm = w->vm;
    kvgen_status st = KVGEN_OK;
    char name[32];
    uint32_t spec[KVG_SPEC_COUNT];
    spec_init(spec);
    spec[KVG_SPEC_WG] = 64;
    for (int pi = 0; pi < vm->embd.n_parts; pi++) {
        const vk_part *part = &vm->embd.parts[pi];
        snprintf(name, sizeof name, "embed_%s", part->wt->suffix);
        VkPipeline pipe;
        if (w->mode == WALK_PIPELINES) {
            st = kvg_vk_walk_pipeline(w, name, spec, &pipe);
            if (st != KVGEN_OK) return st;
            continue;
        }
        int idx = w->cursor++;
        if (w->mode == WALK_SETS) {
            kvg_vk_binding b[KVG_VK_BINDINGS] = {{0}};
            b[0].buf = kvg_vk_mirror_bound(&vm->params);
            b[1].buf = &part->buf;
            b[3].buf = &vm->x;
            st = kvg_vk_set_create(vm->ctx, w->s->pool, b, &w->s->sets[idx], w->err);
            if (st != KVGEN_OK) return st;
        } else if (w->mode == WALK_RECORD) {
            st = kvg_vk_walk_pipeline(w, name, spec, &pipe);
            if (st != KVGEN_OK) return st;
            /* embed.comp reads word 9 (eps) as the embedding scale (gemma: sqrt(n_embd)) */
            pc_weights pc = {.nrows = part->rows, .nb = vm->embd.nb, .scale_off = part->scale_off, .ncols = w->n,
                             .ldo = vm->ld_x, .row0 = part->row0, .eps = vm->embd_scale};
            if (pi > 0) kvg_vk_cmd_barrier(w->cb); /* the parts write one buffer (op_matmul) */
            kvg_vk_cmd_dispatch(vm->ctx, w->cb, pipe, w->s->sets[idx], &pc, sizeof pc, w->n, 1, 1);
        }
    }
    if (w->mode == WALK_RECORD) kvg_vk_cmd_barrier(w->cb);
    return KVGEN_OK;
}

uint32_t kvg_vk_attn_split_min(const kvg_vk_ctx *ctx) { return ctx->info.compute_units ? 64 : 256; }

uint32_t kvg_vk_attn_loop_splits(uint64_t positions) {
    return positions > 4096 ? (uint32_t)((positions + 4095) / 4096) : 1;
}

uint32_t kvg_vk_attn_splits(const kvg_vk_ctx *ctx, uint64_t groups, uint32_t lo, uint32_t hi) {
    uint32_t cu = ctx->info.compute_units;
    if (!cu || !groups) return 8 < lo ? lo : 8 > hi ? hi : 8;
    uint64_t want = (2 * (uint64_t)cu + groups - 1) / groups;
    return want < lo ? lo : want > hi ? hi : (uint32_t)want;
}

/* tokens per workgroup of a prefill step's attention (attn.comp's query tiles): the most, a
 * power of two, that keep GQ * TQ <= 8 query rows and fit the device's shared memory; 1 for
 * attn_lane, which parallelises tokens over its lanes instead */
static uint32_t attn_tile_tokens(const vk_model *vm, const char *attn, const uint32_t spec[KVG_SPEC_COUNT]) {
    if (vm->attn_lane) return 1;
    uint32_t tile[KVG_SPEC_COUNT], tq = 1;
    memcpy(tile, spec, sizeof tile);
    while (tq * 2 * spec[KVG_SPEC_GQ] <= 8) tq *= 2;
    for (; tq > 1; tq /= 2) {
        tile[KVG_SPEC_TQ] = tq;
        if (kvg_vk_shader_fits(vm->ctx, attn, tile, NULL) == KVGEN_OK) break;
    }
    return tq;
}

kvgen_status kvg_vk_op_attention(walk *w, int layer) {
    vk_model *vm = w->vm;
    const kvg_hparams *hp = &vm->hp;
    uint32_t spec_direct[KVG_SPEC_COUNT], spec_split[KVG_SPEC_COUNT], spec_reduce[KVG_SPEC_COUNT];
    /* CPU devices: one SIMD group of 8 lanes per workgroup, each lane its own split or token */
    const char *attn = vm->attn_lane ? "attn_lane" : vm->subgroup ? "attn_sg" : "attn";
    uint32_t lane_wg = 8;
    spec_init(spec_direct);
    spec_direct[KVG_SPEC_WG] = vm->attn_lane ? lane_wg : 64;
    kvg_vk_kv_spec(vm, spec_direct);
    spec_direct[KVG_SPEC_GQ] = (uint32_t)(hp->n_head / hp->n_head_kv);
    spec_direct[KVG_SPEC_HD] = (uint32_t)hp->head_dim;
    spec_direct[KVG_SPEC_TQ] = 1;
    memcpy(spec_split, spec_direct, sizeof spec_split);
    spec_direct[KVG_SPEC_DIRECT] = 1;
    spec_split[KVG_SPEC_DIRECT] = 0;
    spec_init(spec_reduce);
    /* the tiled variants (TQ > 1) for prefill steps, whose tokens share the session's table; a
     * decode or batched step's are the untiled ones */
    bool prefill = !(w->n == 1 || w->batch);
    uint32_t tq = prefill || w->mode == WALK_PIPELINES ? attn_tile_tokens(vm, attn, spec_direct) : 1;
    uint32_t tile_direct[KVG_SPEC_COUNT], tile_split[KVG_SPEC_COUNT];
    memcpy(tile_direct, spec_direct, sizeof tile_direct);
    memcpy(tile_split, spec_split, sizeof tile_split);
    tile_direct[KVG_SPEC_TQ] = tile_split[KVG_SPEC_TQ] = tq;
    VkPipeline pa, pr;
    if (w->mode == WALK_PIPELINES) {
        kvgen_status st = kvg_vk_walk_pipeline(w, attn, spec_direct, &pa);
        if (st == KVGEN_OK) st = kvg_vk_walk_pipeline(w, attn, spec_split, &pa);
        if (st == KVGEN_OK && tq > 1) st = kvg_vk_walk_pipeline(w, attn, tile_direct, &pa);
        if (st == KVGEN_OK && tq > 1) st = kvg_vk_walk_pipeline(w, attn, tile_split, &pa);
        if (st == KVGEN_OK) st = kvg_vk_walk_pipeline(w, "attn_reduce", spec_reduce, &pr);
        return st;
    }
    int idx = w->cursor++;
    if (w->mode == WALK_SETS) {
        kvg_vk_binding b[KVG_VK_BINDINGS] = {{0}};
        b[0].buf = kvg_vk_mirror_bound(&vm->params);
        b[2].buf = &vm->q;
        b[3].buf = &vm->att;
        kvg_vk_kv_bind(vm, w->s, b);
        b[7].buf = &w->s->part;
        return kvg_vk_set_create(vm->ctx, w->s->pool, b, &w->s->sets[idx], w->err);
    }
    if (w->mode != WALK_RECORD) return KVGEN_OK;
    uint32_t nsplit = prefill ? kvg_vk_attn_loop_splits(w->max_len) : w->s->nsplit_dec;
    if (w->batch && w->n > 1 && vm->ctx->info.compute_units && !vm->attn_lane) {
        /* a batch's columns are workgroups too: fewer splits, down to the loop limit's */
        uint32_t lim = kvg_vk_attn_loop_splits((uint64_t)w->s->n_ctx);
        if (lim < nsplit) nsplit = kvg_vk_attn_splits(vm->ctx, (uint64_t)hp->n_head_kv * w->n, lim, nsplit);
    }
    bool split = nsplit > 1;
    pc_attn pc = {.n_head = (uint32_t)hp->n_head,
                  .n_kv = (uint32_t)hp->n_head_kv,
                  .hd = (uint32_t)hp->head_dim,
                  .ldq = vm->ld_q,
                  .ldo = vm->ld_q,
                  .n_ctx = (uint32_t)w->s->n_ctx,
                  .nsplit = nsplit,
                  .ncols = w->n,
                  .scale = 1.0f / sqrtf((float)hp->head_dim),
                  .window = vm->layers ? vm->layers[layer].window : 0,
                  .softcap = vm->attn_softcap,
                  .split_min = kvg_vk_attn_split_min(vm->ctx)};
    kvg_vk_kv_pc(vm, w->s, layer, &pc.kv_layer, &pc.kv_page, &pc.kv_v, &pc.pt_base);
    kvgen_status st = kvg_vk_walk_pipeline(w, attn, split ? tile_split : tile_direct, &pa);
    if (st == KVGEN_OK) st = kvg_vk_walk_pipeline(w, "attn_reduce", spec_reduce, &pr);
    if (st != KVGEN_OK) return st;
    if (vm->attn_lane)
        kvg_vk_cmd_dispatch(vm->ctx, w->cb, pa, w->s->sets[idx], &pc, sizeof pc,
                            (w->n * pc.nsplit + lane_wg - 1) / lane_wg, (uint32_t)hp->n_head_kv, 1);
    else
        kvg_vk_cmd_dispatch(vm->ctx, w->cb, pa, w->s->sets[idx], &pc, sizeof pc, (uint32_t)hp->n_head_kv,
                            (w->n + tq - 1) / tq, pc.nsplit);
    kvg_vk_cmd_barrier(w->cb);
    if (split) {
        kvg_vk_cmd_dispatch(vm->ctx, w->cb, pr, w->s->sets[idx], &pc, sizeof pc, (uint32_t)hp->n_head, w->n, 1);
        kvg_vk_cmd_barrier(w->cb);
    }
    return KVGEN_OK;
}

/* rms_norm.comp over the step's tokens: a post norm (NORM_POST: x += rmsnorm(f) * weight),
 * layer `layer`'s Q/K head norms (NORM_HEADS: the raw heads in vm->qk normed with weight, rotated
 * with the layer's RoPE table, Q to vm->q, K to the KV pool) or the final norm (NORM_FINAL: each
 * token's hidden state rmsnorm(x) * weight to vm->logits, rows of n_embd; layer unused) */
static kvgen_status op_norm(walk *w, int mode, int layer, const kvg_vk_buffer *weight) {
    vk_model *vm = w->vm;
    const kvg_hparams *hp = &vm->hp;
    const vk_layer *L = mode == NORM_FINAL ? NULL : &vm->layers[layer];
    uint32_t spec[KVG_SPEC_COUNT];
    spec_init(spec);
    if (mode == NORM_HEADS) kvg_vk_kv_spec(vm, spec);
    spec[KVG_SPEC_WG] = 64;
    spec[KVG_SPEC_MODE] = (uint32_t)mode;
    VkPipeline pipe;
    if (w->mode == WALK_PIPELINES) return kvg_vk_walk_pipeline(w, "rms_norm", spec, &pipe);
    int idx = w->cursor++;
    if (w->mode == WALK_SETS) {
        kvg_vk_binding b[KVG_VK_BINDINGS] = {{0}};
        b[0].buf = kvg_vk_mirror_bound(&vm->params);
        b[4].buf = weight;
        if (mode == NORM_POST) {
            b[2].buf = &vm->f;
            b[3].buf = &vm->x;
        } else if (mode == NORM_FINAL) {
            b[2].buf = &vm->x;
            b[3].buf = &vm->logits;
        } else {
            b[2].buf = &vm->qk;
            b[3].buf = &vm->q;
            kvg_vk_kv_bind(vm, w->s, b);
            b[7].buf = w->s->rope[L->rope];
        }
        return kvg_vk_set_create(vm->ctx, w->s->pool, b, &w->s->sets[idx], w->err);
    }
    if (w->mode != WALK_RECORD) return KVGEN_OK;
    kvgen_status st = kvg_vk_walk_pipeline(w, "rms_norm", spec, &pipe);
    if (st != KVGEN_OK) return st;
    bool heads = mode == NORM_HEADS;
    pc_norm pc = {.n = (uint32_t)(heads ? hp->head_dim : hp->n_embd),
                  .ldi = heads ? vm->ld_qk : vm->ld_x,
                  .ldo = heads ? vm->ld_q : mode == NORM_FINAL ? (uint32_t)hp->n_embd : vm->ld_x,
                  .ncols = w->n,
                  .eps = hp->rms_norm_eps,
                  .n_head = (uint32_t)hp->n_head,
                  .n_rot = (uint32_t)hp->n_rot,
                  .flags = L ? L->qk_flags : 0,
                  .kv_raw = vm->kv_raw,
                  .n_kv = (uint32_t)hp->n_head_kv};
    if (heads) kvg_vk_kv_pc(vm, w->s, layer, &pc.kv_layer, &pc.kv_page, &pc.kv_v, &pc.pt_base);
    /* block pages: the V heads are moved to the raw K|V too */
    uint32_t gx = heads ? (uint32_t)(hp->n_head + (vm->kv_block ? 2 : 1) * hp->n_head_kv) : 1;
    kvg_vk_cmd_dispatch(vm->ctx, w->cb, pipe, w->s->sets[idx], &pc, sizeof pc, gx, w->n, 1);
    kvg_vk_cmd_barrier(w->cb);
    return KVGEN_OK;
}

/* kv_store.comp: quantizes the step's new K and V (left at vm->kv_raw of vm->q by the QKV
 * epilogue or the heads op) into layer `layer`'s block pages (q8_0, q4_0) */
static kvgen_status op_kv_store(walk *w, int layer) {
    vk_model *vm = w->vm;
    const kvg_hparams *hp = &vm->hp;
    uint32_t spec[KVG_SPEC_COUNT];
    spec_init(spec);
    kvg_vk_kv_spec(vm, spec);
    VkPipeline pipe;
    if (w->mode == WALK_PIPELINES) return kvg_vk_walk_pipeline(w, "kv_store", spec, &pipe);
    int idx = w->cursor++;
    if (w->mode == WALK_SETS) {
        kvg_vk_binding b[KVG_VK_BINDINGS] = {{0}};
        b[0].buf = kvg_vk_mirror_bound(&vm->params);
        b[2].buf = &vm->q;
        kvg_vk_kv_bind(vm, w->s, b);
        return kvg_vk_set_create(vm->ctx, w->s->pool, b, &w->s->sets[idx], w->err);
    }
    if (w->mode != WALK_RECORD) return KVGEN_OK;
    kvgen_status st = kvg_vk_walk_pipeline(w, "kv_store", spec, &pipe);
    if (st != KVGEN_OK) return st;
    pc_kv_store pc = {.n_kv = (uint32_t)hp->n_head_kv, .hd = (uint32_t)hp->head_dim, .ncols = w->n,
                      .kv_raw = vm->kv_raw};
    kvg_vk_kv_pc(vm, w->s, layer, &pc.kv_layer, &pc.kv_page, &pc.kv_v, &pc.pt_base);
    uint32_t blocks = 2u * (uint32_t)hp->n_head_kv * (uint32_t)hp->head_dim / 32u;
    kvg_vk_cmd_dispatch(vm->ctx, w->cb, pipe, w->s->sets[idx], &pc, sizeof pc, (blocks + 63) / 64, w->n, 1);
    kvg_vk_cmd_barrier(w->cb);
    return KVGEN_OK;
}

static void prof_mark(walk *w, int kind) {
    vk_model *vm = w->vm;
    if (w->mode != WALK_RECORD || !vm->prof_pool || vm->prof_n >= 511) return;
    vm->prof_kind[vm->prof_n] = kind;
    vkCmdWriteTimestamp(w->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, vm->prof_pool, (uint32_t)vm->prof_n++);
}

kvgen_status kvg_vk_walk_step(walk *w) {
    vk_model *vm = w->vm;
    if (w->mode == WALK_RECORD && vm->prof_pool) {
        vm->prof_n = 0;
        vkCmdResetQueryPool(w->cb, vm->prof_pool, 0, 512);
        prof_mark(w, 7);
    }
    kvgen_status st = kvg_vk_op_embed(w);
    prof_mark(w, 0);
    for (int l = 0; l < vm->hp.n_layer && st == KVGEN_OK; l++) {
        vk_layer *L = &vm->layers[l];
        /* the layer's optional parts are data: a bias buffer, head norms (the QKV epilogue then
         * leaves Q/K raw for the heads op), post norms (the projection then stores its output
         * for the norm op to add) */
        bool heads = L->qk_norm.buf != VK_NULL_HANDLE;
        bool post_attn = L->attn_post.buf != VK_NULL_HANDLE, post_ffn = L->ffn_post.buf != VK_NULL_HANDLE;
        matmul_args qkv = {.m = &L->qkv, .epi = EPI_QKV, .norm = &L->attn_norm, .in = &vm->x,
                           .out = heads ? &vm->qk : &vm->q, .ldx = vm->ld_x, .ldo = heads ? vm->ld_qk : vm->ld_q,
                           .ncols = w->n, .layer = l, .bias = L->bias.buf ? &L->bias : NULL,
                           .flags = heads ? EPI_F_RAW_QK : 0u};
        /* a step's LoRA adapters: their dispatches before each mat-mul they adapt (vk_lora.c) */
        st = kvg_vk_lora_op(w, l, 0, &qkv);
        if (st == KVGEN_OK) st = kvg_vk_op_matmul(w, &qkv);
        if (st == KVGEN_OK && heads) st = op_norm(w, NORM_HEADS, l, &L->qk_norm);
        if (st == KVGEN_OK && vm->kv_block) st = op_kv_store(w, l);
        prof_mark(w, 1);
        if (st == KVGEN_OK) st = kvg_vk_op_attention(w, l);
        prof_mark(w, 2);
        matmul_args wo = {.m = &L->wo, .epi = post_attn ? EPI_STORE : EPI_ADD, .in = &vm->att,
                          .out = post_attn ? &vm->f : &vm->x, .ldx = vm->ld_q, .ldo = vm->ld_x, .ncols = w->n};
        if (st == KVGEN_OK) st = kvg_vk_lora_op(w, l, 1, &wo);
        if (st == KVGEN_OK) st = kvg_vk_op_matmul(w, &wo);
        if (st == KVGEN_OK && post_attn) st = op_norm(w, NORM_POST, l, &L->attn_post);
        prof_mark(w, 3);
        matmul_args gu = {.m = &L->gateup, .epi = vm->ffn_epi, .norm = &L->ffn_norm, .in = &vm->x, .out = &vm->h,
                          .ldx = vm->ld_x, .ldo = vm->ld_h, .ncols = w->n};
        if (st == KVGEN_OK) st = kvg_vk_lora_op(w, l, 2, &gu);
        if (st == KVGEN_OK) st = kvg_vk_op_matmul(w, &gu);
        prof_mark(w, 4);
        matmul_args down = {.m = &L->down, .epi = post_ffn ? EPI_STORE : EPI_ADD, .in = &vm->h,
                            .out = post_ffn ? &vm->f : &vm->x, .ldx = vm->ld_h, .ldo = vm->ld_x, .ncols = w->n};
        if (st == KVGEN_OK) st = kvg_vk_lora_op(w, l, 3, &down);
        if (st == KVGEN_OK) st = kvg_vk_op_matmul(w, &down);
        if (st == KVGEN_OK && post_ffn) st = op_norm(w, NORM_POST, l, &L->ffn_post);
        prof_mark(w, 5);
    }
    if (st != KVGEN_OK) return st;
    /* logits: sets exist for the "every token" shape and are reused for the last token only;
     * then the hidden states (logits 3: every token's final norm instead of its logits), whose
     * set every session has */
    matmul_args out = {.m = &vm->output, .epi = EPI_STORE, .norm = &vm->out_norm, .in = &vm->x, .out = &vm->logits,
                       .ldx = vm->ld_x, .ldo = (uint32_t)vm->hp.n_vocab, .cap = vm->final_softcap};
    bool hidden = w->logits == 3;
    if (w->mode == WALK_RECORD && (w->logits == 0 || hidden)) {
        w->cursor += vm->output.n_parts;
    } else {
        if (w->logits == 1) {
            out.ncols = 1;
            out.x_off = (w->n - 1) * vm->ld_x;
        } else {
            out.ncols = w->n;
        }
        st = kvg_vk_op_matmul(w, &out);
        prof_mark(w, 6);
    }
    if (st != KVGEN_OK) return st;
    if (w->mode == WALK_RECORD && !hidden) {
        w->cursor++;
        return KVGEN_OK;
    }
    return op_norm(w, NORM_FINAL, 0, &vm->out_norm);
}

void kvg_vk_prof_collect(vk_model *vm) {
    if (!vm->prof_pool || vm->prof_n < 2) return;
    uint64_t ts[512];
    if (vkGetQueryPoolResults(vm->ctx->dev, vm->prof_pool, 0, (uint32_t)vm->prof_n, sizeof ts, ts, 8,
                              VK_QUERY_RESULT_64_BIT) != VK_SUCCESS)
        return;
    double ns = vm->ctx->props.limits.timestampPeriod;
    for (int i = 1; i < vm->prof_n; i++) vm->prof_ms[vm->prof_kind[i]] += (double)(ts[i] - ts[i - 1]) * ns * 1e-6;
    vm->prof_steps++;
}

kvgen_status kvg_vk_record(vk_model *vm, kvg_backend_session *s, VkCommandBuffer cb, bool one_time, uint32_t n,
                           uint32_t max_len, int logits, int select, kvgen_error *err) {
    kvgen_status st = kvg_vk_cmd_begin(cb, one_time, err);
    if (st != KVGEN_OK) return st;
    /* the step's parameters and page table into device memory where the kernels do not read
     * the host's (a discrete GPU) */
    kvg_vk_cmd_mirror(cb, &vm->params);
    kvg_vk_cmd_mirror(cb, &s->ptab);
    walk rw = {.mode = WALK_RECORD, .vm = vm, .s = s, .cb = cb, .n = n, .max_len = max_len, .logits = logits,
               .batch = s == vm->bat, .err = err};
    st = kvg_vk_walk_step(&rw);
    if (st != KVGEN_OK) {
        vkEndCommandBuffer(cb);
        return st;
    }
    /* the last token's logits are row 0 of vm->logits (kvg_vk_walk_step, logits 1); a batched
     * step's columns are rows 0..n-1 (logits 2) */
    if (select && (logits == 1 || rw.batch))
        kvg_vk_select_record(vm->ctx, cb, &vm->sel, select == 1 ? 1 : KVG_VK_TOPK, 0, logits == 1 ? 1 : n);
    kvg_vk_cmd_host_barrier(cb);
    return kvg_vk_cmd_end(cb, err);
}

/* Rewrites a session's descriptor sets when the pool gained a slab since they were written
 * (caller holds ctx->lock; at most KVG_VK_KV_SLABS times per session). */
kvgen_status kvg_vk_refresh_sets(vk_model *vm, kvg_backend_session *s, kvgen_error *err) {
    unsigned gen = __atomic_load_n(&vm->kv_gen, __ATOMIC_ACQUIRE);
    if (s->kv_gen == gen) return KVGEN_OK;
    kvgen_status st = kvg_vk_check(vkResetDescriptorPool(vm->ctx->dev, s->pool, 0), err, "vkResetDescriptorPool");
    if (st != KVGEN_OK) return st;
    walk sw = {.mode = WALK_SETS, .vm = vm, .s = s, .n = 1, .logits = 2, .err = err};
    st = kvg_vk_walk_step(&sw);
    s->decode_recorded = false; /* it names the old sets */
    if (st == KVGEN_OK) s->kv_gen = gen;
    return st;
}
