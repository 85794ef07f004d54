/* vk_backend.c: the llama forward pass as Vulkan compute shaders (kvg_vulkan_backend).
 *
 * Load: every weight matrix is repacked as its type's row of the weight-type table says (a
 * quant region and a scale region per part; kvg_vk.h, shaders/weights.glsl) and uploaded once;
 * Q/K/V are concatenated into one matrix and gate/up interleaved row by row so
 * one dispatch computes each group; a matrix bigger than maxStorageBufferRange is split into
 * row parts, one binding and one dispatch each. Pipelines are all created at load.
 *
 * A step (a prefill chunk of up to `chunk` tokens, or one decode token) is one command buffer:
 *   embed -> per layer [QKV (+RMSNorm, RoPE, K/V cache write) -> attention (-> split reduce)
 *   -> Wo (+residual) -> gate/up (+RMSNorm, SwiGLU) -> down (+residual)] -> logits (+final norm)
 * Per-step values (position, token ids) live in a small host-visible buffer, so the decode
 * command buffer of a session is recorded once and replayed; descriptor sets are written when
 * the session is created. Nothing is allocated on the per-token path.
 *
 * The architecture's facts come from the model description (kvg_weights): the FFN epilogue
 * follows its activation; model_init refuses a model needing a feature the shaders do not
 * implement yet (kvg_arch_check_backend, `.features` below), e.g. NEOX RoPE, as the QKV
 * epilogue rotates adjacent pairs only.
 *
 * A batched decode (forward_batch, paged pool) runs one token each of up to BATCH_MAX sessions
 * as the columns of one step, so the mat-vecs read each weight once for all of them: params
 * give every column its own position and page table (shaders/common.glsl, kvg_pos/kvg_tab),
 * the tables concatenated in the model's batch session (vm->bat), whose sets and recorded
 * command buffer are reused from step to step.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_quant.h"
#include "kvg_vk.h"
#include "kvg_vk_select.h"

enum { EPI_STORE = 0, EPI_ADD = 1, EPI_QKV = 2, EPI_SWIGLU = 3 };

typedef struct pc_weights { /* matches PC in shaders/common.glsl */
    uint32_t nrows, nb, scale_off, ncols, ldx, ldo, row0, x_off, kreal;
    float eps;
    uint32_t nq, nk, hd, n_rot, n_ctx, o_off, c0;
    uint32_t kv_layer, kv_page, kv_v, pt_base; /* paged KV (shaders/kv.glsl) */
} pc_weights;

typedef struct pc_attn { /* matches PC in shaders/attn.comp */
    uint32_t n_head, n_kv, hd, ldq, ldo, n_ctx, nsplit, ncols;
    float scale;
    uint32_t kv_layer, kv_page, kv_v, pt_base;
} pc_attn;

typedef struct pc_kv_copy { /* matches PC in shaders/kv_copy.comp */
    uint32_t n, hd, n_layer, n_kv, src_tab, dst_tab, src_pos, dst_pos, kv_page, kv_v, n_rot, cs_off, rope;
} pc_kv_copy;

/* a batched decode's columns per step (the lane mat-vec's tokens per weight read); its
 * (position, table entry) pairs follow the token ids in params, from index BATCH_AT */
enum { BATCH_MAX = 8, BATCH_AT = BATCH_MAX };

/* kv_copy moves at most this many pages' worth of positions per submission (its tables live in
 * a fixed host-visible buffer) */
#define KV_OPS_PAGES 1024

typedef struct vk_part {
    kvg_vk_buffer buf;
    uint32_t rows, row0, scale_off;
} vk_part;

typedef struct vk_matrix {
    uint32_t type; /* as uploaded (mixed-type groups become F32) */
    const kvg_vk_wtype *wt; /* its row of the weight-type table */
    uint32_t rows, k, nb;
    int n_parts;
    vk_part *parts;
} vk_matrix;

typedef struct vk_layer {
    vk_matrix qkv, wo, gateup, down;
    kvg_vk_buffer attn_norm, ffn_norm;
} vk_layer;

typedef struct vk_model {
    kvg_vk_ctx *ctx;
    kvg_hparams hp;
    vk_matrix embd, output;
    bool tied;
    kvg_vk_buffer out_norm;
    vk_layer *layers;
    int ffn_epi;                 /* the gate/up epilogue: the model's activation (EPI_SWIGLU) */
    /* scratch shared by the sessions: steps are serialised by ctx->lock */
    uint32_t chunk;              /* tokens per step */
    uint32_t ld_x, ld_q, ld_h;   /* activation strides (multiples of 32, zero padding) */
    uint32_t nsplit;             /* decode attention splits over the cache length */
    uint32_t mv_wg, mv_rows;     /* matvec workgroup size and rows per workgroup */
    uint32_t lane_rows;          /* lane layout: rows per invocation (even) */
    bool lane_ubo;               /* lane layout: inputs through uniform windows where they fit */
    bool mv_lane;                /* matvec: one row pair per invocation (CPU devices) */
    bool attn_lane;              /* attention: attn_lane.comp, one invocation per (token, KV head, split) */
    kvg_vk_buffer params, x, q, att, h, logits;
    /* device argmax / top-k over the last token's logits; logits_owner: the session whose kept
     * logits (forward_keep) are in row 0 of `logits`, set aside before another step writes it */
    kvg_vk_select sel;
    kvg_backend_session *logits_owner;
    /* KVGEN_VK_PROFILE=1: timestamps after each op, summed per op kind, printed at unload */
    VkQueryPool prof_pool;
    int prof_n;
    int prof_kind[512];
    double prof_ms[8];
    int prof_steps;
    bool prof_prefill; /* KVGEN_VK_PROFILE=2: prefill steps instead of decode steps */

    /* Paged KV pool (unless loaded with kv_contiguous): n_pages pages of page_size tokens,
     * page_elems elements each ([L][K,V][Hkv][P][hd]), split over nslab buffers ("slabs") of pps
     * pages so that each stays within maxStorageBufferRange. A slab is created when the pool
     * first hands out one of its pages; kv_gen counts slab creations so that descriptor sets
     * written before one are rewritten (once, off the per-token path). */
    bool paged;
    int page_size;
    int32_t n_pages;
    uint32_t pps, nslab, page_elems;
    size_t page_bytes;
    kvg_vk_buffer slabs[KVG_VK_KV_SLABS]; /* written under ctx->lock */
    unsigned kv_gen;                       /* atomic */
    /* kv_copy: host-visible tables + rope cos/sin, its descriptor set and command buffer */
    kvg_vk_buffer ops;
    VkDescriptorPool ops_pool;
    VkDescriptorSet ops_set;
    unsigned ops_gen;
    VkCommandBuffer ops_cb;
    /* RoPE cos/sin tables shared by the sessions: table k covers 2^(k+8) positions and is
     * built the first time a session needs that many (forks and NPC sessions share one) */
    pthread_mutex_t rope_mu;
    bool rope_mu_init;
    kvg_vk_buffer ropes[13];
    /* forward_batch: a session whose page table holds the batched sessions' tables one after
     * another and whose partials have room for BATCH_MAX tokens' decode splits; created for
     * the longest context seen, held under bat_mu (taken before ctx->lock) */
    pthread_mutex_t bat_mu;
    bool bat_mu_init;
    kvg_backend_session *bat;
    uint32_t bat_entries; /* page-table entries per batched session */
} vk_model;

static const char *const prof_names[8] = {"embed", "qkv", "attn", "wo", "gateup", "down", "logits", "?"};

struct kvg_backend_session {
    int n_ctx;
    kvg_vk_buffer *k, *v; /* contiguous: per layer (n_kv, n_ctx, head_dim); paged: NULL */
    kvg_vk_buffer ptab;   /* paged: the page table (host-visible, written before each step) */
    unsigned kv_gen;      /* paged: the model's kv_gen when the descriptor sets were written */
    const kvg_vk_buffer *rope; /* the model's table for >= n_ctx positions: (pos, n_rot/2) cos, sin */
    kvg_vk_buffer part;   /* attention partial results: (chunk, n_head, nsplit, 2 + head_dim) */
    uint32_t nsplit_dec;  /* decode attention splits: covers n_ctx in splits of <= 4096 positions */
    VkDescriptorPool pool;
    VkDescriptorSet *sets;
    int n_sets;
    VkCommandBuffer cb_decode, cb_step;
    bool decode_recorded;
    uint32_t decode_ncols; /* the batch session: the columns cb_decode was recorded for */
    int decode_select; /* the selection cb_decode was recorded with (0 none, 1 argmax, 2 top-k) */
    VkFence fence;
    /* forward_keep: the selection made with the kept logits, and where they go when another
     * session's step needs the model's logits buffer (n_vocab floats) */
    int32_t sel_ids[KVG_VK_TOPK];
    float sel_vals[KVG_VK_TOPK];
    int sel_n;
    float *saved;
    bool saved_valid;
};

static uint32_t round_up(uint32_t x, uint32_t m) { return (x + m - 1) / m * m; }

/* ---- the weight types ----
 * One row per type the shaders run; everything below reads the row (kvg_vk.h: layout and how to
 * add a type). Every current type repacks 32-element blocks: the float types copy the row as it
 * is (F32 32 words per block, F16/BF16 16: two halves per word), and the quantized ones store
 * their scales first in a GGUF block, so the split is the same: Q8_0 8 words of int8 + one f16
 * d, Q4_0 4 words of nibbles + d, Q4_1 4 words + (d, m). Each block's repacked words hold exactly
 * the GGUF block's bytes. */

/* float types: the GGUF row as it is; a partial last block keeps the buffer's zeros */
static void repack_copy(const kvg_vk_wtype *t, const uint8_t *src, uint32_t K, uint32_t *q, uint8_t *scales) {
    (void)scales;
    memcpy(q, src, kvg_row_bytes(t->type, K));
}

/* blocks whose GGUF layout is [scales][quants]: scale_halves * 2 bytes of scales, then qwords words */
static void repack_scales_first(const kvg_vk_wtype *t, const uint8_t *src, uint32_t K, uint32_t *q,
                                uint8_t *scales) {
    size_t sb = (size_t)t->scale_halves * 2, qb = (size_t)t->qwords * 4, bb = kvg_row_bytes(t->type, t->block_elems);
    for (uint32_t b = 0; b < K / t->block_elems; b++) {
        memcpy(scales + b * sb, src + b * bb, sb);
        memcpy((uint8_t *)q + b * qb, src + b * bb + sb, qb);
    }
}

static const kvg_vk_wtype WTYPES[] = {
    /* type, shader suffix, define, elements per block, quant words, scale halves, pad, repack */
    {KVG_TYPE_F32, "f32", "WTYPE_F32=1", 32, 32, 0, true, repack_copy},
    {KVG_TYPE_F16, "f16", "WTYPE_F16=1", 32, 16, 0, true, repack_copy},
    {KVG_TYPE_BF16, "bf16", "WTYPE_BF16=1", 32, 16, 0, true, repack_copy},
    {KVG_TYPE_Q8_0, "q8_0", "WTYPE_Q8_0=1", 32, 8, 1, false, repack_scales_first},
    {KVG_TYPE_Q4_0, "q4_0", "WTYPE_Q4_0=1", 32, 4, 1, false, repack_scales_first},
    {KVG_TYPE_Q4_1, "q4_1", "WTYPE_Q4_1=1", 32, 4, 2, false, repack_scales_first},
};
#define N_WTYPES (sizeof WTYPES / sizeof WTYPES[0])

const kvg_vk_wtype *kvg_vk_wtype_of(uint32_t type) {
    for (size_t i = 0; i < N_WTYPES; i++)
        if (WTYPES[i].type == type) return &WTYPES[i];
    return NULL;
}

size_t kvg_vk_wtype_count(void) { return N_WTYPES; }
const kvg_vk_wtype *kvg_vk_wtype_at(size_t i) { return i < N_WTYPES ? &WTYPES[i] : NULL; }

static size_t vk_weight_types(uint32_t *types, size_t max) {
    for (size_t i = 0; i < N_WTYPES && i < max; i++) types[i] = WTYPES[i].type;
    return N_WTYPES;
}

/* "vulkan: tensor T has type X, which the vulkan backend does not run (vulkan runs: ...)" */
static kvgen_status refuse_type(const kvg_tensor *t, const char *what, kvgen_error *err) {
    uint32_t types[N_WTYPES];
    size_t n = vk_weight_types(types, N_WTYPES);
    char list[256];
    kvg_types_list(types, n, list, sizeof list);
    return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: %s: tensor %s has type %s, which the vulkan backend does not "
                    "run (vulkan runs: %s)", what, t->name, kvg_type_name(t->type), list);
}

/* ---- weight upload ---- */

static size_t max_part_bytes(const kvg_vk_ctx *ctx) {
    size_t lim = ctx->props.limits.maxStorageBufferRange;
    if (ctx->info.max_allocation_size && ctx->info.max_allocation_size < lim) lim = ctx->info.max_allocation_size;
    const char *env = getenv("KVGEN_VK_MAX_PART"); /* tests: force splitting */
    if (env && atol(env) > 0 && (size_t)atol(env) < lim) lim = (size_t)atol(env);
    return lim;
}

/* Uploads the rows of `n_src` tensors (same row length) as one matrix: concatenated, or, with
 * interleave (two tensors of equal rows), alternating a row of each. */
static kvgen_status upload_matrix(vk_model *vm, const char *what, const kvg_tensor *const *srcs, int n_src,
                                  bool interleave, vk_matrix *out, kvgen_error *err) {
    memset(out, 0, sizeof *out);
    uint32_t K = (uint32_t)srcs[0]->ne[0];
    uint32_t type = srcs[0]->type;
    uint64_t rows = 0;
    for (int i = 0; i < n_src; i++) {
        if (!kvg_vk_wtype_of(srcs[i]->type)) return refuse_type(srcs[i], what, err);
        if (srcs[i]->ne[0] != K)
            return kvg_fail(err, KVGEN_E_FORMAT, "vulkan: %s: tensor %s has rows of %llu, expected %u", what,
                            srcs[i]->name, (unsigned long long)srcs[i]->ne[0], K);
        if (srcs[i]->type != type) type = KVG_TYPE_F32;
        rows += srcs[i]->n_elements / K;
    }
    if (interleave && (n_src != 2 || srcs[0]->n_elements != srcs[1]->n_elements))
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: %s: interleaved tensors differ in shape", what);
    if (rows > UINT32_MAX / 2 || K == 0)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: %s: %llu rows of %u are too many", what,
                        (unsigned long long)rows, K);
    /* a mixed-type group is uploaded as F32, which every table has */
    const kvg_vk_wtype *wt = kvg_vk_wtype_of(type);
    if (!wt) return refuse_type(srcs[0], what, err);
    uint32_t nb = (K + 31) / 32; /* the shaders' 32-element blocks */
    if (!wt->pad && K % wt->block_elems != 0)
        return kvg_fail(err, KVGEN_E_FORMAT, "vulkan: %s: rows of %u are not whole %u-element blocks", what, K,
                        wt->block_elems);
    out->type = type;
    out->wt = wt;
    out->rows = (uint32_t)rows;
    out->k = K;
    out->nb = nb;

    /* per row: row_words quant words, row_halves scale halves (layout: kvg_vk.h) */
    size_t row_blocks = (K + wt->block_elems - 1) / wt->block_elems;
    size_t row_words = row_blocks * wt->qwords, row_halves = row_blocks * wt->scale_halves;
    size_t row_bytes_est = row_words * 4 + (row_halves + 1) / 2 * 4 + 4;
    size_t lim = max_part_bytes(vm->ctx);
    size_t per_part = lim / row_bytes_est;
    if (per_part >= 64) per_part = per_part / 64 * 64; /* whole gemm tiles, row pairs kept */
    else per_part &= ~(size_t)1;
    if (per_part < 2)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: %s: one row (%zu bytes) exceeds the device's buffer "
                        "range (%zu bytes)", what, row_bytes_est, lim);
    out->n_parts = (int)((rows + per_part - 1) / per_part);
    out->parts = calloc((size_t)out->n_parts, sizeof *out->parts);
    float *tmp = malloc((size_t)nb * 32 * sizeof(float));
    uint32_t *stage = NULL;
    if (!out->parts || !tmp) {
        free(tmp);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory uploading %s", what);
    }
    kvgen_status st = KVGEN_OK;
    for (int p = 0; p < out->n_parts && st == KVGEN_OK; p++) {
        vk_part *part = &out->parts[p];
        part->row0 = (uint32_t)(p * per_part);
        part->rows = (uint32_t)((rows - part->row0) < per_part ? rows - part->row0 : per_part);
        size_t qw = (size_t)part->rows * row_words;
        size_t total_words = qw + ((size_t)part->rows * row_halves + 1) / 2;
        part->scale_off = (uint32_t)qw;
        st = kvg_vk_buffer_create(vm->ctx, total_words * 4, KVG_VK_MEM_UPLOAD, &part->buf, err);
        if (st != KVGEN_OK) break;
        /* straight into mapped memory where possible, else through a host copy */
        uint32_t *dst = part->buf.map;
        if (!dst) {
            free(stage);
            stage = calloc(total_words, 4);
            if (!stage) {
                st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory uploading %s", what);
                break;
            }
            dst = stage;
        }
        for (uint32_t r = 0; r < part->rows; r++) {
            uint64_t gr = part->row0 + r;
            const kvg_tensor *t;
            uint64_t tr;
            if (interleave) {
                t = srcs[gr & 1];
                tr = gr >> 1;
            } else {
                int i = 0;
                tr = gr;
                while (tr >= srcs[i]->n_elements / K) tr -= srcs[i++]->n_elements / K;
                t = srcs[i];
            }
            const uint8_t *src = (const uint8_t *)t->data + tr * kvg_row_bytes(t->type, K);
            if (t->type != type) { /* mixed-type group: the exact f32 values */
                kvg_dequantize_row(t->type, src, tmp, K);
                src = (const uint8_t *)tmp;
            }
            wt->repack(wt, src, K, dst + r * row_words, (uint8_t *)(dst + part->scale_off) + r * row_halves * 2);
        }
        if (!part->buf.map) st = kvg_vk_upload(vm->ctx, &part->buf, 0, stage, total_words * 4, err);
    }
    free(stage);
    free(tmp);
    return st;
}

static void free_matrix(kvg_vk_ctx *ctx, vk_matrix *m) {
    for (int i = 0; i < m->n_parts; i++) kvg_vk_buffer_destroy(ctx, &m->parts[i].buf);
    free(m->parts);
    memset(m, 0, sizeof *m);
}

static kvgen_status upload_norm(vk_model *vm, const kvg_tensor *t, kvg_vk_buffer *out, kvgen_error *err) {
    uint32_t n = (uint32_t)t->n_elements;
    uint32_t padded = round_up(n, 32);
    float *v = calloc(padded, sizeof *v);
    if (!v) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory uploading %s", t->name);
    kvg_dequantize_row(t->type, t->data, v, n);
    /* a whole uniform window is bound (matvec.comp reads the norm weight through one) */
    size_t bytes = (size_t)padded * 4 > vm->ctx->ubo_window ? (size_t)padded * 4 : vm->ctx->ubo_window;
    kvgen_status st = kvg_vk_buffer_create(vm->ctx, bytes, KVG_VK_MEM_UPLOAD, out, err);
    if (st == KVGEN_OK) st = kvg_vk_upload(vm->ctx, out, 0, v, (size_t)padded * 4, err);
    free(v);
    return st;
}

/* ---- the step walk ----
 * One function walks a step's dispatches in order for every purpose, so the pipelines created
 * at load, the descriptor sets written per session and the commands recorded per step can never
 * disagree. */

typedef enum { WALK_PIPELINES, WALK_COUNT, WALK_SETS, WALK_RECORD } walk_mode;

typedef struct walk {
    walk_mode mode;
    vk_model *vm;
    kvg_backend_session *s; /* NULL in WALK_PIPELINES */
    VkCommandBuffer cb;
    int cursor;     /* descriptor-set index */
    uint32_t n;     /* tokens in the step */
    uint32_t max_len; /* prefill: pos0 + n, the longest attention span of the step */
    int logits;     /* 0: none, 1: last token's, 2: every token's */
    bool batch;     /* a batched decode: every token of another session (vm->bat) */
    kvgen_error *err;
} walk;

static void spec_init(uint32_t spec[KVG_SPEC_COUNT]) {
    memset(spec, 0, KVG_SPEC_COUNT * sizeof *spec);
}

/* the KV layout constants of shaders/kv.glsl */
static void kv_spec(const vk_model *vm, uint32_t spec[KVG_SPEC_COUNT]) {
    spec[KVG_SPEC_KV_F16] = vm->ctx->kv_f16;
    spec[KVG_SPEC_PAGED] = vm->paged;
    spec[KVG_SPEC_PAGE] = vm->paged ? (uint32_t)vm->page_size : 32;
    spec[KVG_SPEC_PPS] = vm->paged ? vm->pps : 1;
    spec[KVG_SPEC_NSLAB] = vm->paged ? vm->nslab : 1;
}

/* push-constant fields of the paged layout for one layer */
static void kv_pc(const vk_model *vm, int layer, uint32_t *kv_layer, uint32_t *kv_page, uint32_t *kv_v) {
    const kvg_hparams *hp = &vm->hp;
    uint32_t v = vm->paged ? (uint32_t)(hp->n_head_kv * vm->page_size * hp->head_dim) : 0;
    *kv_v = v;
    *kv_layer = (uint32_t)layer * 2u * v;
    *kv_page = vm->page_elems;
}

/* binds the KV storage of a layer: the pool's slabs and the session's page table, or the
 * session's contiguous K/V */
static void kv_bind(const vk_model *vm, const kvg_backend_session *s, int layer, kvg_vk_binding b[KVG_VK_BINDINGS]) {
    if (vm->paged) {
        for (uint32_t j = 0; j < vm->nslab; j++)
            if (vm->slabs[j].buf) b[KVG_VK_SLAB_SLOT(j)].buf = &vm->slabs[j];
        b[KVG_VK_PTAB].buf = &s->ptab;
    } else {
        b[5].buf = &s->k[layer];
        b[6].buf = &s->v[layer];
    }
}

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

static kvgen_status matmul_pipeline(walk *w, const vk_matrix *m, int epi, bool norm, uint32_t ncols, uint32_t ldx,
                                    bool create, VkPipeline *out) {
    vk_model *vm = w->vm;
    char name[32];
    uint32_t spec[KVG_SPEC_COUNT];
    spec_init(spec);
    spec[KVG_SPEC_MODE] = (uint32_t)epi;
    spec[KVG_SPEC_NORM] = norm;
    spec[KVG_SPEC_KV_F16] = vm->ctx->kv_f16;
    if (epi == EPI_QKV) kv_spec(vm, spec);
    if (ncols <= 8 || vm->mv_lane) {
        snprintf(name, sizeof name, "matvec_%s", m->wt->suffix);
        spec[KVG_SPEC_WG] = vm->mv_wg;
        spec[KVG_SPEC_NCOLS] = ncols == 1 ? 1 : 8;
        spec[KVG_SPEC_ROWS] = vm->mv_lane ? vm->lane_rows : vm->mv_rows;
        spec[KVG_SPEC_LANE] = vm->mv_lane;
        spec[KVG_SPEC_UBO] = lane_ubo(vm, m, ldx, ncols) ? vm->ctx->ubo_window / 16 : 0;
    } else {
        snprintf(name, sizeof name, "gemm_%s", m->wt->suffix);
    }
    if (create) return kvg_vk_pipeline_get(vm->ctx, name, spec, out, w->err);
    *out = kvg_vk_pipeline_find(vm->ctx, name, spec);
    if (!*out) return kvg_fail(w->err, KVGEN_E_INTERNAL, "vulkan: pipeline %s was not created at load", name);
    return KVGEN_OK;
}

typedef struct matmul_args {
    const vk_matrix *m;
    int epi;
    const kvg_vk_buffer *norm; /* NULL: no RMSNorm */
    const kvg_vk_buffer *in, *out;
    uint32_t ldx, ldo, x_off, ncols;
    int layer; /* for EPI_QKV: the K/V cache layer */
} matmul_args;

static kvgen_status op_matmul(walk *w, const matmul_args *a) {
    vk_model *vm = w->vm;
    const kvg_hparams *hp = &vm->hp;
    kvgen_status st = KVGEN_OK;
    if (w->mode == WALK_PIPELINES) {
        static const uint32_t variants[] = {1, 8, 9};
        VkPipeline p;
        for (int i = 0; i < 3 && st == KVGEN_OK; i++)
            st = matmul_pipeline(w, a->m, a->epi, a->norm, variants[i], a->ldx, true, &p);
        return st;
    }
    for (int pi = 0; pi < a->m->n_parts; pi++) {
        const vk_part *part = &a->m->parts[pi];
        int idx = w->cursor++;
        if (w->mode == WALK_SETS) {
            kvg_vk_binding b[KVG_VK_BINDINGS] = {{0}};
            b[0].buf = &vm->params;
            b[1].buf = &part->buf;
            b[2].buf = a->in;
            b[3].buf = a->out;
            b[4].buf = a->norm;
            b[KVG_VK_UBO_X].buf = a->in;
            b[KVG_VK_UBO_NORM].buf = a->norm;
            if (a->epi == EPI_QKV) {
                kv_bind(vm, w->s, a->layer, b);
                b[7].buf = w->s->rope;
            }
            st = kvg_vk_set_create(vm->ctx, w->s->pool, b, &w->s->sets[idx], w->err);
            if (st != KVGEN_OK) return st;
        } else if (w->mode == WALK_RECORD) {
            VkPipeline pipe;
            st = matmul_pipeline(w, a->m, a->epi, a->norm, a->ncols, a->ldx, false, &pipe);
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
                             .o_off = 0};
            if (a->epi == EPI_QKV) kv_pc(vm, a->layer, &pc.kv_layer, &pc.kv_page, &pc.kv_v);
            uint32_t gx, gy = 1;
            if (vm->mv_lane) { /* lane layout: lane_rows rows per invocation, 8 tokens per workgroup column */
                uint32_t per_wg = vm->lane_rows * vm->mv_wg;
                gx = (part->rows + per_wg - 1) / per_wg;
                gy = a->ncols == 1 ? 1 : (a->ncols + 7) / 8;
            } else if (a->ncols <= 8) {
                gx = (part->rows + vm->mv_rows - 1) / vm->mv_rows;
            } else {
                gx = (part->rows + 63) / 64;
                gy = (a->ncols + 31) / 32;
            }
            if (lane_ubo(vm, a->m, a->ldx, a->ncols)) {
                /* one dispatch per workgroup column, its input window bound at its first token */
                for (uint32_t g = 0; g < gy; g++) {
                    pc.c0 = g * 8;
                    uint32_t off = (a->x_off + pc.c0 * a->ldx) * 4;
                    kvg_vk_cmd_dispatch_at(vm->ctx, w->cb, pipe, w->s->sets[idx], &pc, sizeof pc, off, gx, 1, 1);
                }
            } else {
                kvg_vk_cmd_dispatch(vm->ctx, w->cb, pipe, w->s->sets[idx], &pc, sizeof pc, gx, gy, 1);
            }
        }
    }
    if (w->mode == WALK_RECORD) kvg_vk_cmd_barrier(w->cb);
    return KVGEN_OK;
}

static kvgen_status op_embed(walk *w) {
    vk_model *vm = w->vm;
    kvgen_status st = KVGEN_OK;
    char name[32];
    snprintf(name, sizeof name, "embed_%s", vm->embd.wt->suffix);
    uint32_t spec[KVG_SPEC_COUNT];
    spec_init(spec);
    spec[KVG_SPEC_WG] = 64;
    if (w->mode == WALK_PIPELINES) {
        VkPipeline p;
        return kvg_vk_pipeline_get(vm->ctx, name, spec, &p, w->err);
    }
    for (int pi = 0; pi < vm->embd.n_parts; pi++) {
        const vk_part *part = &vm->embd.parts[pi];
        int idx = w->cursor++;
        if (w->mode == WALK_SETS) {
            kvg_vk_binding b[KVG_VK_BINDINGS] = {{0}};
            b[0].buf = &vm->params;
            b[1].buf = &part->buf;
            b[3].buf = &vm->x;
            st = kvg_vk_set_create(vm->ctx, w->s->pool, b, &w->s->sets[idx], w->err);
            if (st != KVGEN_OK) return st;
        } else if (w->mode == WALK_RECORD) {
            VkPipeline pipe = kvg_vk_pipeline_find(vm->ctx, name, spec);
            if (!pipe) return kvg_fail(w->err, KVGEN_E_INTERNAL, "vulkan: pipeline %s was not created", name);
            pc_weights pc = {.nrows = part->rows, .nb = vm->embd.nb, .scale_off = part->scale_off, .ncols = w->n,
                             .ldo = vm->ld_x, .row0 = part->row0};
            kvg_vk_cmd_dispatch(vm->ctx, w->cb, pipe, w->s->sets[idx], &pc, sizeof pc, w->n, 1, 1);
        }
    }
    if (w->mode == WALK_RECORD) kvg_vk_cmd_barrier(w->cb);
    return KVGEN_OK;
}

static kvgen_status op_attention(walk *w, int layer) {
    vk_model *vm = w->vm;
    const kvg_hparams *hp = &vm->hp;
    uint32_t spec_direct[KVG_SPEC_COUNT], spec_split[KVG_SPEC_COUNT], spec_reduce[KVG_SPEC_COUNT];
    /* CPU devices: one SIMD group of 8 lanes per workgroup, each lane its own split or token */
    const char *attn = vm->attn_lane ? "attn_lane" : "attn";
    uint32_t lane_wg = 8;
    spec_init(spec_direct);
    spec_direct[KVG_SPEC_WG] = vm->attn_lane ? lane_wg : 64;
    kv_spec(vm, spec_direct);
    spec_direct[KVG_SPEC_GQ] = (uint32_t)(hp->n_head / hp->n_head_kv);
    spec_direct[KVG_SPEC_HD] = (uint32_t)hp->head_dim;
    memcpy(spec_split, spec_direct, sizeof spec_split);
    spec_direct[KVG_SPEC_DIRECT] = 1;
    spec_split[KVG_SPEC_DIRECT] = 0;
    spec_init(spec_reduce);
    if (w->mode == WALK_PIPELINES) {
        VkPipeline p;
        kvgen_status st = kvg_vk_pipeline_get(vm->ctx, attn, spec_direct, &p, w->err);
        if (st == KVGEN_OK) st = kvg_vk_pipeline_get(vm->ctx, attn, spec_split, &p, w->err);
        if (st == KVGEN_OK) st = kvg_vk_pipeline_get(vm->ctx, "attn_reduce", spec_reduce, &p, w->err);
        return st;
    }
    int idx = w->cursor++;
    if (w->mode == WALK_SETS) {
        kvg_vk_binding b[KVG_VK_BINDINGS] = {{0}};
        b[0].buf = &vm->params;
        b[2].buf = &vm->q;
        b[3].buf = &vm->att;
        kv_bind(vm, w->s, layer, b);
        b[7].buf = &w->s->part;
        return kvg_vk_set_create(vm->ctx, w->s->pool, b, &w->s->sets[idx], w->err);
    }
    if (w->mode != WALK_RECORD) return KVGEN_OK;
    /* lavapipe's loop limit: a split covers at most 4096 positions (see attn.comp) */
    uint32_t nsplit = w->n == 1 || w->batch ? w->s->nsplit_dec : (w->max_len + 4095) / 4096;
    bool split = nsplit > 1;
    pc_attn pc = {.n_head = (uint32_t)hp->n_head,
                  .n_kv = (uint32_t)hp->n_head_kv,
                  .hd = (uint32_t)hp->head_dim,
                  .ldq = vm->ld_q,
                  .ldo = vm->ld_q,
                  .n_ctx = (uint32_t)w->s->n_ctx,
                  .nsplit = nsplit,
                  .ncols = w->n,
                  .scale = 1.0f / sqrtf((float)hp->head_dim)};
    kv_pc(vm, layer, &pc.kv_layer, &pc.kv_page, &pc.kv_v);
    VkPipeline pa = kvg_vk_pipeline_find(vm->ctx, attn, split ? spec_split : spec_direct);
    VkPipeline pr = kvg_vk_pipeline_find(vm->ctx, "attn_reduce", spec_reduce);
    if (!pa || !pr) return kvg_fail(w->err, KVGEN_E_INTERNAL, "vulkan: attention pipelines were not created");
    if (vm->attn_lane)
        kvg_vk_cmd_dispatch(vm->ctx, w->cb, pa, w->s->sets[idx], &pc, sizeof pc,
                            (w->n * pc.nsplit + lane_wg - 1) / lane_wg, (uint32_t)hp->n_head_kv, 1);
    else
        kvg_vk_cmd_dispatch(vm->ctx, w->cb, pa, w->s->sets[idx], &pc, sizeof pc, (uint32_t)hp->n_head_kv, w->n,
                            pc.nsplit);
    kvg_vk_cmd_barrier(w->cb);
    if (split) {
        kvg_vk_cmd_dispatch(vm->ctx, w->cb, pr, w->s->sets[idx], &pc, sizeof pc, (uint32_t)hp->n_head, w->n, 1);
        kvg_vk_cmd_barrier(w->cb);
    }
    return KVGEN_OK;
}

static void prof_mark(walk *w, int kind) {
    vk_model *vm = w->vm;
    if (w->mode != WALK_RECORD || !vm->prof_pool || vm->prof_n >= 511) return;
    vm->prof_kind[vm->prof_n] = kind;
    vkCmdWriteTimestamp(w->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, vm->prof_pool, (uint32_t)vm->prof_n++);
}

static kvgen_status walk_step(walk *w) {
    vk_model *vm = w->vm;
    if (w->mode == WALK_RECORD && vm->prof_pool) {
        vm->prof_n = 0;
        vkCmdResetQueryPool(w->cb, vm->prof_pool, 0, 512);
        prof_mark(w, 7);
    }
    kvgen_status st = op_embed(w);
    prof_mark(w, 0);
    for (int l = 0; l < vm->hp.n_layer && st == KVGEN_OK; l++) {
        vk_layer *L = &vm->layers[l];
        matmul_args qkv = {.m = &L->qkv, .epi = EPI_QKV, .norm = &L->attn_norm, .in = &vm->x, .out = &vm->q,
                           .ldx = vm->ld_x, .ldo = vm->ld_q, .ncols = w->n, .layer = l};
        st = op_matmul(w, &qkv);
        prof_mark(w, 1);
        if (st == KVGEN_OK) st = op_attention(w, l);
        prof_mark(w, 2);
        matmul_args wo = {.m = &L->wo, .epi = EPI_ADD, .in = &vm->att, .out = &vm->x, .ldx = vm->ld_q,
                          .ldo = vm->ld_x, .ncols = w->n};
        if (st == KVGEN_OK) st = op_matmul(w, &wo);
        prof_mark(w, 3);
        matmul_args gu = {.m = &L->gateup, .epi = vm->ffn_epi, .norm = &L->ffn_norm, .in = &vm->x, .out = &vm->h,
                          .ldx = vm->ld_x, .ldo = vm->ld_h, .ncols = w->n};
        if (st == KVGEN_OK) st = op_matmul(w, &gu);
        prof_mark(w, 4);
        matmul_args down = {.m = &L->down, .epi = EPI_ADD, .in = &vm->h, .out = &vm->x, .ldx = vm->ld_h,
                            .ldo = vm->ld_x, .ncols = w->n};
        if (st == KVGEN_OK) st = op_matmul(w, &down);
        prof_mark(w, 5);
    }
    if (st != KVGEN_OK) return st;
    /* logits: sets exist for the "every token" shape and are reused for the last token only */
    matmul_args out = {.m = &vm->output, .epi = EPI_STORE, .norm = &vm->out_norm, .in = &vm->x, .out = &vm->logits,
                       .ldx = vm->ld_x, .ldo = (uint32_t)vm->hp.n_vocab};
    if (w->mode == WALK_RECORD && w->logits == 0) {
        w->cursor += vm->output.n_parts;
        return KVGEN_OK;
    }
    if (w->logits == 1) {
        out.ncols = 1;
        out.x_off = (w->n - 1) * vm->ld_x;
    } else {
        out.ncols = w->n;
    }
    st = op_matmul(w, &out);
    prof_mark(w, 6);
    return st;
}

static void prof_collect(vk_model *vm) {
    if (!vm->prof_pool || vm->prof_n < 2) return;
    uint64_t ts[512];
    if (vkGetQueryPoolResults(vm->ctx->dev, vm->prof_pool, 0, (uint32_t)vm->prof_n, sizeof ts, ts, 8,
                              VK_QUERY_RESULT_64_BIT) != VK_SUCCESS)
        return;
    double ns = vm->ctx->props.limits.timestampPeriod;
    for (int i = 1; i < vm->prof_n; i++) vm->prof_ms[vm->prof_kind[i]] += (double)(ts[i] - ts[i - 1]) * ns * 1e-6;
    vm->prof_steps++;
}

/* ---- backend ops ---- */

kvg_vk_ctx *kvg_vk_model_ctx(const kvgen_model *m) {
    if (!m || m->ops != &kvg_vulkan_backend || !m->backend) return NULL;
    return ((const vk_model *)m->backend)->ctx;
}

static void vk_session_free(kvgen_model *m, kvg_backend_session *s);

static void vk_model_free(kvgen_model *m) {
    vk_model *vm = m->backend;
    if (!vm) return;
    kvg_vk_ctx *ctx = vm->ctx;
    if (ctx) {
        vk_session_free(m, vm->bat);
        vm->bat = NULL;
        vkDeviceWaitIdle(ctx->dev);
        if (vm->prof_pool) {
            fprintf(stderr, "kvgen vulkan profile over %d steps (ms per step):", vm->prof_steps);
            for (int i = 0; i < 7; i++) fprintf(stderr, " %s %.2f", prof_names[i], vm->prof_ms[i] / (vm->prof_steps ? vm->prof_steps : 1));
            fprintf(stderr, "\n");
            vkDestroyQueryPool(ctx->dev, vm->prof_pool, NULL);
        }
        free_matrix(ctx, &vm->embd);
        if (!vm->tied) free_matrix(ctx, &vm->output);
        kvg_vk_buffer_destroy(ctx, &vm->out_norm);
        if (vm->layers)
            for (int l = 0; l < vm->hp.n_layer; l++) {
                vk_layer *L = &vm->layers[l];
                free_matrix(ctx, &L->qkv);
                free_matrix(ctx, &L->wo);
                free_matrix(ctx, &L->gateup);
                free_matrix(ctx, &L->down);
                kvg_vk_buffer_destroy(ctx, &L->attn_norm);
                kvg_vk_buffer_destroy(ctx, &L->ffn_norm);
            }
        for (int j = 0; j < KVG_VK_KV_SLABS; j++) kvg_vk_buffer_destroy(ctx, &vm->slabs[j]);
        for (int k = 0; k < 13; k++) kvg_vk_buffer_destroy(ctx, &vm->ropes[k]);
        if (vm->ops_pool) vkDestroyDescriptorPool(ctx->dev, vm->ops_pool, NULL);
        if (vm->ops_cb) vkFreeCommandBuffers(ctx->dev, ctx->cmd_pool, 1, &vm->ops_cb);
        kvg_vk_select_free(ctx, &vm->sel);
        kvg_vk_buffer *scratch[] = {&vm->params, &vm->x, &vm->q, &vm->att, &vm->h, &vm->logits, &vm->ops};
        for (size_t i = 0; i < sizeof scratch / sizeof scratch[0]; i++) kvg_vk_buffer_destroy(ctx, scratch[i]);
        kvg_vk_ctx_destroy(ctx);
    }
    if (vm->rope_mu_init) pthread_mutex_destroy(&vm->rope_mu);
    if (vm->bat_mu_init) pthread_mutex_destroy(&vm->bat_mu);
    free(vm->layers);
    free(vm);
    m->backend = NULL;
}

static kvgen_status vk_model_init(kvgen_model *m, const kvgen_model_desc *desc, kvgen_error *err) {
    kvgen_status type_st = kvg_weights_check_types(m, &kvg_vulkan_backend, err); /* before any device work */
    if (type_st == KVGEN_OK) type_st = kvg_arch_check_backend(m, &kvg_vulkan_backend, err);
    if (type_st != KVGEN_OK) return type_st;
    const kvg_hparams *hp = &m->w.hp;
    const char *path = desc->path ? desc->path : "model";
    if (hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv != 0)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: vulkan: %d heads over %d KV heads", path, hp->n_head,
                        hp->n_head_kv);
    if (hp->n_head / hp->n_head_kv > 8 || hp->head_dim > 256 || hp->head_dim % 2 != 0 || hp->n_rot % 2 != 0 ||
        hp->n_rot > hp->head_dim)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "%s: vulkan: attention shape (%d query heads per KV head, head_dim %d, n_rot %d) is "
                        "outside what the shaders handle (<= 8 per KV head, head_dim even and <= 256)",
                        path, hp->n_head / hp->n_head_kv, hp->head_dim, hp->n_rot);
    vk_model *vm = calloc(1, sizeof *vm);
    if (!vm) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    m->backend = vm;
    vm->hp = *hp;
    /* the step's ops from the description: only what kvg_arch_check_backend let through */
    switch (m->w.act) {
    case KVG_ACT_SILU_GATED:
    default:
        vm->ffn_epi = EPI_SWIGLU;
        break;
    }
    pthread_mutex_init(&vm->rope_mu, NULL);
    vm->rope_mu_init = true;
    pthread_mutex_init(&vm->bat_mu, NULL);
    vm->bat_mu_init = true;
    kvg_vk_ctx_desc cd = {.device = desc->device,
                          .force_f32 = desc->force_f32,
                          .vk_instance = desc->vk_instance,
                          .vk_physical_device = desc->vk_physical_device,
                          .vk_device = desc->vk_device,
                          .vk_queue = desc->vk_queue,
                          .vk_queue_family = desc->vk_queue_family,
                          .pipeline_cache_path = desc->pipeline_cache_path};
    kvgen_status st = kvg_vk_ctx_create(&cd, &vm->ctx, err);
    if (st != KVGEN_OK) goto fail;
    kvg_vk_ctx *ctx = vm->ctx;
    snprintf(m->device_name, sizeof m->device_name, "%s", ctx->info.name);

    /* a CPU device runs a workgroup on one core: no cooperation inside workgroups there */
    vm->mv_lane = ctx->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    vm->mv_wg = vm->mv_lane ? 32 : 64;
    vm->mv_rows = 4;
    vm->lane_rows = 8;
    vm->lane_ubo = true;
    /* splits buy parallelism on a GPU; on a CPU device the KV heads already fill the cores and
     * each split's fixed cost (and the reduce) dominates: split there only for the loop limit */
    vm->nsplit = vm->mv_lane ? 1 : 8;
    if (getenv("KVGEN_VK_LANE")) vm->mv_lane = atoi(getenv("KVGEN_VK_LANE")) != 0;
    if (getenv("KVGEN_VK_WG")) vm->mv_wg = (uint32_t)atoi(getenv("KVGEN_VK_WG"));
    if (getenv("KVGEN_VK_ROWS")) vm->mv_rows = (uint32_t)atoi(getenv("KVGEN_VK_ROWS"));
    if (getenv("KVGEN_VK_LANE_ROWS")) vm->lane_rows = (uint32_t)atoi(getenv("KVGEN_VK_LANE_ROWS")) & ~1u;
    if (vm->lane_rows < 2) vm->lane_rows = 2;
    if (getenv("KVGEN_VK_UBO")) vm->lane_ubo = atoi(getenv("KVGEN_VK_UBO")) != 0;
    /* attn_lane.comp: splits are its parallelism (8 lanes per workgroup) and cost little when
     * empty (short contexts fill the first ones, >= 32 positions each) */
    vm->attn_lane = vm->mv_lane && hp->head_dim % 8 == 0;
    if (getenv("KVGEN_VK_ATTN_LANE")) vm->attn_lane = atoi(getenv("KVGEN_VK_ATTN_LANE")) != 0 && hp->head_dim % 8 == 0;
    vm->nsplit = vm->attn_lane ? 16 : vm->mv_lane ? 1 : 8;
    if (getenv("KVGEN_VK_NSPLIT")) vm->nsplit = (uint32_t)atoi(getenv("KVGEN_VK_NSPLIT"));
    vm->ld_x = round_up((uint32_t)hp->n_embd, 32);
    vm->ld_q = round_up((uint32_t)(hp->n_head * hp->head_dim), 32);
    vm->ld_h = round_up((uint32_t)hp->n_ff, 32);
    size_t range = ctx->props.limits.maxStorageBufferRange;
    uint32_t chunk = 128;
    while (chunk > 1 && (size_t)chunk * (size_t)hp->n_vocab * 4 > range) chunk /= 2;
    const char *env_chunk = getenv("KVGEN_VK_CHUNK"); /* tests: force small prefill chunks */
    if (env_chunk && atoi(env_chunk) > 0 && (uint32_t)atoi(env_chunk) < chunk) chunk = (uint32_t)atoi(env_chunk);
    vm->chunk = chunk;

    /* weights */
    const kvg_weights *w = &m->w;
    vm->tied = w->tied || w->output == w->tok_embd;
    st = upload_matrix(vm, "token_embd", &w->tok_embd, 1, false, &vm->embd, err);
    if (st == KVGEN_OK && !vm->tied) st = upload_matrix(vm, "output", &w->output, 1, false, &vm->output, err);
    if (st == KVGEN_OK && vm->tied) vm->output = vm->embd;
    if (st == KVGEN_OK) st = upload_norm(vm, w->output_norm, &vm->out_norm, err);
    vm->layers = calloc((size_t)hp->n_layer, sizeof *vm->layers);
    if (st == KVGEN_OK && !vm->layers) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    for (int l = 0; l < hp->n_layer && st == KVGEN_OK; l++) {
        const kvg_layer *src = &w->layers[l];
        vk_layer *L = &vm->layers[l];
        const kvg_tensor *qkv[3] = {src->wq, src->wk, src->wv};
        const kvg_tensor *gu[2] = {src->w_gate, src->w_up};
        char what[48];
        snprintf(what, sizeof what, "blk.%d.attn_qkv", l);
        st = upload_matrix(vm, what, qkv, 3, false, &L->qkv, err);
        snprintf(what, sizeof what, "blk.%d.attn_output", l);
        if (st == KVGEN_OK) st = upload_matrix(vm, what, &src->wo, 1, false, &L->wo, err);
        snprintf(what, sizeof what, "blk.%d.ffn_gate_up", l);
        if (st == KVGEN_OK) st = upload_matrix(vm, what, gu, 2, true, &L->gateup, err);
        snprintf(what, sizeof what, "blk.%d.ffn_down", l);
        if (st == KVGEN_OK) st = upload_matrix(vm, what, &src->w_down, 1, false, &L->down, err);
        if (st == KVGEN_OK) st = upload_norm(vm, src->attn_norm, &L->attn_norm, err);
        if (st == KVGEN_OK) st = upload_norm(vm, src->ffn_norm, &L->ffn_norm, err);
    }
    if (st != KVGEN_OK) goto fail;

    /* scratch */
    uint32_t C = vm->chunk;
    /* token ids, or a batched decode's ids and (position, table) pairs from BATCH_AT */
    st = kvg_vk_buffer_create(ctx, 16 + (size_t)(C > 3 * BATCH_MAX ? C : 3 * BATCH_MAX) * 4, KVG_VK_MEM_HOST,
                              &vm->params, err);
    /* mat-vec inputs get a uniform window of slack: a window bound at any token stays inside */
    size_t win = ctx->ubo_window;
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)C * vm->ld_x * 4 + win, KVG_VK_MEM_DEVICE, &vm->x, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)C * vm->ld_q * 4, KVG_VK_MEM_DEVICE, &vm->q, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)C * vm->ld_q * 4 + win, KVG_VK_MEM_DEVICE, &vm->att, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)C * vm->ld_h * 4 + win, KVG_VK_MEM_DEVICE, &vm->h, err);
    if (st == KVGEN_OK)
        st = kvg_vk_buffer_create(ctx, (size_t)C * (size_t)hp->n_vocab * 4, KVG_VK_MEM_HOST, &vm->logits, err);
    if (st == KVGEN_OK && (!vm->params.map || !vm->logits.map))
        st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: device %s offers no host-visible coherent memory", ctx->info.name);
    if (st == KVGEN_OK) st = kvg_vk_select_init(ctx, &vm->logits, (uint32_t)hp->n_vocab, &vm->sel, err);
    if (st != KVGEN_OK) goto fail;

    if (getenv("KVGEN_VK_PROFILE") && atoi(getenv("KVGEN_VK_PROFILE")) > 0) {
        vm->prof_prefill = atoi(getenv("KVGEN_VK_PROFILE")) == 2;
        VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                    .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = 512};
        st = kvg_vk_check(vkCreateQueryPool(ctx->dev, &qi, NULL, &vm->prof_pool), err, "vkCreateQueryPool");
        if (st != KVGEN_OK) goto fail;
    }
    /* every pipeline a step can use, now rather than on the per-token path; a paged model's
     * depend on the pool's layout and are created by kv_pages_init */
    vm->paged = !desc->kv_contiguous;
    if (!vm->paged) {
        walk pw = {.mode = WALK_PIPELINES, .vm = vm, .n = 1, .logits = 2, .err = err};
        st = walk_step(&pw);
        if (st != KVGEN_OK) goto fail;
        kvg_vk_pcache_save(ctx); /* every pipeline exists now */
    }
    return KVGEN_OK;
fail:
    if (err && err->status != KVGEN_OK && !strstr(err->message, path)) {
        char msg[KVGEN_ERROR_MESSAGE_SIZE];
        size_t lp = strlen(path), lm = strlen(err->message);
        if (lp > 200) lp = 200;
        if (lm > sizeof msg - lp - 3) lm = sizeof msg - lp - 3;
        memcpy(msg, path, lp);
        memcpy(msg + lp, ": ", 2);
        memcpy(msg + lp + 2, err->message, lm);
        msg[lp + 2 + lm] = '\0';
        memcpy(err->message, msg, sizeof msg);
    }
    vk_model_free(m);
    return st;
}

/* The shared RoPE table for at least n_ctx positions, angles in double on the host as the
 * reference computes them. */
static kvgen_status rope_table(vk_model *vm, int n_ctx, const kvg_vk_buffer **out, kvgen_error *err) {
    const kvg_hparams *hp = &vm->hp;
    int k = 0;
    while (k < 12 && ((size_t)256 << k) < (size_t)n_ctx) k++;
    size_t n_pos = (size_t)256 << k, half = (size_t)(hp->n_rot / 2);
    kvgen_status st = KVGEN_OK;
    pthread_mutex_lock(&vm->rope_mu);
    if (!vm->ropes[k].buf) {
        size_t n = n_pos * (half ? half : 1) * 2;
        float *cs = malloc(n * sizeof *cs);
        if (!cs) {
            st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
        } else {
            for (size_t p = 0; p < n_pos; p++)
                for (size_t i = 0; i < half; i++) {
                    double theta = (double)p * pow(hp->rope_freq_base, -2.0 * (double)i / hp->n_rot);
                    cs[(p * half + i) * 2] = (float)cos(theta);
                    cs[(p * half + i) * 2 + 1] = (float)sin(theta);
                }
            kvg_vk_buffer b;
            st = kvg_vk_buffer_create(vm->ctx, n * sizeof *cs, KVG_VK_MEM_UPLOAD, &b, err);
            if (st == KVGEN_OK) st = kvg_vk_upload(vm->ctx, &b, 0, cs, n * sizeof *cs, err);
            if (st == KVGEN_OK) vm->ropes[k] = b;
            else kvg_vk_buffer_destroy(vm->ctx, &b);
            free(cs);
        }
    }
    pthread_mutex_unlock(&vm->rope_mu);
    *out = &vm->ropes[k];
    return st;
}

static void vk_session_free(kvgen_model *m, kvg_backend_session *s) {
    if (!s) return;
    vk_model *vm = m->backend;
    kvg_vk_ctx *ctx = vm->ctx;
    pthread_mutex_lock(&ctx->lock);
    vkQueueWaitIdle(ctx->queue);
    if (vm->logits_owner == s) vm->logits_owner = NULL;
    if (s->cb_decode) vkFreeCommandBuffers(ctx->dev, ctx->cmd_pool, 1, &s->cb_decode);
    if (s->cb_step) vkFreeCommandBuffers(ctx->dev, ctx->cmd_pool, 1, &s->cb_step);
    pthread_mutex_unlock(&ctx->lock);
    if (s->fence) vkDestroyFence(ctx->dev, s->fence, NULL);
    if (s->pool) vkDestroyDescriptorPool(ctx->dev, s->pool, NULL);
    if (s->k)
        for (int l = 0; l < vm->hp.n_layer; l++) kvg_vk_buffer_destroy(ctx, &s->k[l]);
    if (s->v)
        for (int l = 0; l < vm->hp.n_layer; l++) kvg_vk_buffer_destroy(ctx, &s->v[l]);
    kvg_vk_buffer_destroy(ctx, &s->part);
    kvg_vk_buffer_destroy(ctx, &s->ptab);
    free(s->k);
    free(s->v);
    free(s->sets);
    free(s->saved);
    free(s);
}

/* batch: the model's batch session (vm->bat): a page table of BATCH_MAX tables and partials
 * for BATCH_MAX decode tokens */
static kvgen_status session_create(kvgen_model *m, int n_ctx, bool batch, kvg_backend_session **out,
                                   kvgen_error *err) {
    *out = NULL;
    vk_model *vm = m->backend;
    kvg_vk_ctx *ctx = vm->ctx;
    const kvg_hparams *hp = &vm->hp;
    if (n_ctx <= 0 || n_ctx > (256 << 12))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: session n_ctx %d is outside [1, %d]", n_ctx, 256 << 12);
    size_t elem = ctx->kv_f16 ? 2 : 4;
    size_t layer_bytes = (size_t)hp->n_head_kv * (size_t)n_ctx * (size_t)hp->head_dim * elem;
    if (vm->paged && !vm->page_size)
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: a paged model's session before its page pool");
    if (!vm->paged && layer_bytes > ctx->props.limits.maxStorageBufferRange)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "vulkan: a context of %d tokens needs %zu bytes of K per layer, more than the device's "
                        "storage buffer range (%u bytes); use a smaller n_ctx",
                        n_ctx, layer_bytes, ctx->props.limits.maxStorageBufferRange);
    kvg_backend_session *s = calloc(1, sizeof *s);
    if (!s) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    s->n_ctx = n_ctx;
    s->k = calloc((size_t)hp->n_layer, sizeof *s->k);
    s->v = calloc((size_t)hp->n_layer, sizeof *s->v);
    kvgen_status st = KVGEN_OK;
    s->saved = malloc((size_t)hp->n_vocab * sizeof *s->saved);
    if (!s->k || !s->v || !s->saved) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    if (vm->paged && st == KVGEN_OK)
        st = kvg_vk_buffer_create(ctx, ((size_t)n_ctx + (size_t)vm->page_size - 1) / (size_t)vm->page_size * 4 *
                                           (batch ? BATCH_MAX : 1),
                                  KVG_VK_MEM_HOST, &s->ptab, err);
    if (vm->paged && st == KVGEN_OK && !s->ptab.map)
        st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: the page table buffer is not host-visible");
    for (int l = 0; l < hp->n_layer && st == KVGEN_OK && !vm->paged; l++) {
        st = kvg_vk_buffer_create(ctx, layer_bytes, KVG_VK_MEM_DEVICE, &s->k[l], err);
        if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, layer_bytes, KVG_VK_MEM_DEVICE, &s->v[l], err);
    }
    uint32_t split_min = (uint32_t)((n_ctx + 4095) / 4096);
    s->nsplit_dec = vm->nsplit > split_min ? vm->nsplit : split_min;
    /* partials: a decode's nsplit_dec splits or a prefill chunk's split_min per token */
    size_t dec_rows = (size_t)s->nsplit_dec * (batch ? BATCH_MAX : 1);
    size_t part_rows = (size_t)vm->chunk * split_min > dec_rows ? (size_t)vm->chunk * split_min : dec_rows;
    if (st == KVGEN_OK)
        st = kvg_vk_buffer_create(ctx, part_rows * (size_t)hp->n_head * (size_t)(hp->head_dim + 2) * 4,
                                  KVG_VK_MEM_DEVICE, &s->part, err);
    if (st == KVGEN_OK) st = rope_table(vm, n_ctx, &s->rope, err);
    if (st == KVGEN_OK) {
        walk cw = {.mode = WALK_COUNT, .vm = vm, .s = s, .n = 1, .logits = 2, .err = err};
        st = walk_step(&cw);
        s->n_sets = cw.cursor;
    }
    if (st == KVGEN_OK) {
        s->sets = calloc((size_t)s->n_sets, sizeof *s->sets);
        if (!s->sets) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    }
    if (st == KVGEN_OK) st = kvg_vk_pool_create(ctx, (uint32_t)s->n_sets, &s->pool, err);
    if (st == KVGEN_OK) {
        /* the lock: the pool's slabs may be created meanwhile by another thread's session */
        pthread_mutex_lock(&ctx->lock);
        s->kv_gen = __atomic_load_n(&vm->kv_gen, __ATOMIC_ACQUIRE);
        walk sw = {.mode = WALK_SETS, .vm = vm, .s = s, .n = 1, .logits = 2, .err = err};
        st = walk_step(&sw);
        pthread_mutex_unlock(&ctx->lock);
    }
    if (st == KVGEN_OK) {
        VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        st = kvg_vk_check(vkCreateFence(ctx->dev, &fci, NULL, &s->fence), err, "vkCreateFence");
    }
    if (st == KVGEN_OK) {
        pthread_mutex_lock(&ctx->lock);
        st = kvg_vk_cmd_alloc(ctx, &s->cb_decode, err);
        if (st == KVGEN_OK) st = kvg_vk_cmd_alloc(ctx, &s->cb_step, err);
        pthread_mutex_unlock(&ctx->lock);
    }
    if (st != KVGEN_OK) {
        vk_session_free(m, s);
        return st;
    }
    *out = s;
    return KVGEN_OK;
}

static kvgen_status vk_session_init(kvgen_model *m, int n_ctx, kvg_backend_session **out, kvgen_error *err) {
    return session_create(m, n_ctx, false, out, err);
}

static kvgen_status record(vk_model *vm, kvg_backend_session *s, VkCommandBuffer cb, bool one_time, uint32_t n,
                           uint32_t max_len, int logits, int select, kvgen_error *err) {
    kvgen_status st = kvg_vk_cmd_begin(cb, one_time, err);
    if (st != KVGEN_OK) return st;
    walk rw = {.mode = WALK_RECORD, .vm = vm, .s = s, .cb = cb, .n = n, .max_len = max_len, .logits = logits,
               .batch = s == vm->bat, .err = err};
    st = walk_step(&rw);
    if (st != KVGEN_OK) {
        vkEndCommandBuffer(cb);
        return st;
    }
    /* the last token's logits are row 0 of vm->logits (walk_step, logits 1) */
    if (select && logits == 1) kvg_vk_select_record(vm->ctx, cb, &vm->sel, select == 1 ? 1 : KVG_VK_TOPK, 0);
    kvg_vk_cmd_host_barrier(cb);
    return kvg_vk_cmd_end(cb, err);
}

/* Moves the kept logits of the session that owns row 0 of vm->logits into its own memory
 * before a step overwrites them (caller holds ctx->lock). */
static void set_aside_logits(vk_model *vm, kvg_backend_session *s) {
    kvg_backend_session *o = vm->logits_owner;
    vm->logits_owner = NULL;
    if (!o || o == s) return; /* s's own are stale once it runs again */
    memcpy(o->saved, vm->logits.map, (size_t)vm->hp.n_vocab * sizeof(float));
    o->saved_valid = true;
}

/* Runs the step(s) of n tokens at pos0 (caller holds ctx->lock, arguments checked). keep: the
 * last token's logits stay on the device (logits NULL), with the best one (select 1) or
 * KVG_VK_TOPK (select > 1) selected in the same submission. */
static kvgen_status run_steps(vk_model *vm, kvg_backend_session *s, const int32_t *tokens, int n, int pos0,
                              float *logits, bool all_logits, bool keep, int select, kvgen_error *err) {
    kvg_vk_ctx *ctx = vm->ctx;
    const int V = vm->hp.n_vocab;
    kvgen_status st = KVGEN_OK;
    if (logits || keep) set_aside_logits(vm, s);
    s->sel_n = 0;
    s->saved_valid = false;
    if (select > 1) select = 2;
    for (int done = 0; done < n && st == KVGEN_OK;) {
        uint32_t c = (uint32_t)(n - done) < vm->chunk ? (uint32_t)(n - done) : vm->chunk;
        bool last = done + (int)c == n;
        int want = all_logits ? 2 : (last && (logits || keep) ? 1 : 0);
        int sel = last && keep ? select : 0;
        uint32_t *params = vm->params.map;
        params[0] = (uint32_t)(pos0 + done);
        params[1] = 0; /* not a batched decode */
        memcpy(params + 4, tokens + done, c * sizeof *tokens);
        VkCommandBuffer cb;
        if (c == 1 && want == 1) {
            if (!s->decode_recorded || s->decode_select != sel) {
                st = record(vm, s, s->cb_decode, false, 1, 0, 1, sel, err);
                s->decode_recorded = st == KVGEN_OK;
                s->decode_select = sel;
            }
            cb = s->cb_decode;
        } else {
            st = kvg_vk_check(vkResetCommandBuffer(s->cb_step, 0), err, "vkResetCommandBuffer");
            if (st == KVGEN_OK) st = record(vm, s, s->cb_step, true, c, (uint32_t)(pos0 + done) + c, want, sel, err);
            cb = s->cb_step;
        }
        if (st == KVGEN_OK) st = kvg_vk_submit_wait(ctx, cb, s->fence, err);
        if (st == KVGEN_OK && (vm->prof_prefill ? c > 1 : c == 1)) prof_collect(vm);
        if (st == KVGEN_OK && want == 2)
            memcpy(logits + (size_t)done * (size_t)V, vm->logits.map, (size_t)c * (size_t)V * sizeof(float));
        else if (st == KVGEN_OK && want == 1 && !keep)
            memcpy(logits, vm->logits.map, (size_t)V * sizeof(float));
        if (st == KVGEN_OK && last && keep) {
            vm->logits_owner = s;
            if (sel) s->sel_n = kvg_vk_select_read(&vm->sel, sel == 1 ? 1 : KVG_VK_TOPK, s->sel_ids, s->sel_vals);
        }
        done += (int)c;
    }
    return st;
}

static kvgen_status check_step(const vk_model *vm, const kvg_backend_session *s, const int32_t *tokens, int n,
                               int pos0, kvgen_error *err) {
    const int V = vm->hp.n_vocab;
    if (n <= 0 || pos0 < 0 || n > s->n_ctx - pos0)
        return kvg_fail(err, KVGEN_E_CONTEXT_FULL, "vulkan: %d tokens at position %d exceed the context of %d", n,
                        pos0, s->n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: token %d: id %d is outside the vocabulary [0, %d)",
                            i, (int)tokens[i], V);
    return KVGEN_OK;
}

static kvgen_status vk_forward(kvgen_model *m, kvg_backend_session *s, const int32_t *tokens, int n, int pos0,
                               float *logits, bool all_logits, kvgen_error *err) {
    vk_model *vm = m->backend;
    if (vm->paged) return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: contiguous forward on a paged model");
    kvgen_status st = check_step(vm, s, tokens, n, pos0, err);
    if (st != KVGEN_OK) return st;
    pthread_mutex_lock(&vm->ctx->lock);
    st = run_steps(vm, s, tokens, n, pos0, logits, all_logits, false, 0, err);
    pthread_mutex_unlock(&vm->ctx->lock);
    return st;
}

static kvgen_status vk_read_cache(kvgen_model *m, kvg_backend_session *s, int layer, int which, int len, float *out,
                                  kvgen_error *err) {
    vk_model *vm = m->backend;
    const kvg_hparams *hp = &vm->hp;
    if (layer < 0 || layer >= hp->n_layer || which < 0 || which > 1 || len < 0 || len > s->n_ctx)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: read_cache(layer %d, which %d, len %d) out of range",
                        layer, which, len);
    const kvg_vk_buffer *b = which ? &s->v[layer] : &s->k[layer];
    size_t elem = vm->ctx->kv_f16 ? 2 : 4;
    size_t row = (size_t)len * (size_t)hp->head_dim; /* one head's positions [0, len) */
    void *tmp = malloc(row * elem + 1);
    if (!tmp) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory reading the cache");
    kvgen_status st = KVGEN_OK;
    for (int h = 0; h < hp->n_head_kv && st == KVGEN_OK; h++) {
        size_t off = (size_t)h * (size_t)s->n_ctx * (size_t)hp->head_dim * elem;
        st = kvg_vk_download(vm->ctx, b, off, tmp, row * elem, err);
        float *dst = out + (size_t)h * row;
        if (st == KVGEN_OK) {
            if (elem == 4) memcpy(dst, tmp, row * 4);
            else
                for (size_t i = 0; i < row; i++) dst[i] = kvg_f16_to_f32(((const uint16_t *)tmp)[i]);
        }
    }
    free(tmp);
    return st;
}

static size_t vk_cache_bytes_per_token(const kvgen_model *m) {
    const vk_model *vm = m->backend;
    const kvg_hparams *hp = &m->w.hp;
    size_t elem = vm && vm->ctx && !vm->ctx->kv_f16 ? 4 : 2;
    return (size_t)hp->n_layer * 2 * (size_t)hp->n_head_kv * (size_t)hp->head_dim * elem;
}

/* ---- the paged KV pool ---- */

/* Rewrites a session's descriptor sets when the pool gained a slab since they were written
 * (caller holds ctx->lock; at most KVG_VK_KV_SLABS times per session). */
static kvgen_status refresh_sets(vk_model *vm, kvg_backend_session *s, kvgen_error *err) {
    unsigned gen = __atomic_load_n(&vm->kv_gen, __ATOMIC_ACQUIRE);
    if (s->kv_gen == gen) return KVGEN_OK;
    kvgen_status st = kvg_vk_check(vkResetDescriptorPool(vm->ctx->dev, s->pool, 0), err, "vkResetDescriptorPool");
    if (st != KVGEN_OK) return st;
    walk sw = {.mode = WALK_SETS, .vm = vm, .s = s, .n = 1, .logits = 2, .err = err};
    st = walk_step(&sw);
    s->decode_recorded = false; /* it names the old sets */
    if (st == KVGEN_OK) s->kv_gen = gen;
    return st;
}

static kvgen_status check_pages(const vk_model *vm, const int32_t *pages, size_t n_entries, kvgen_error *err) {
    for (size_t i = 0; i < n_entries; i++)
        if (pages[i] < 0 || pages[i] >= vm->n_pages || !vm->slabs[(uint32_t)pages[i] / vm->pps].buf)
            return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: page table entry %zu names page %d, which has no storage",
                            i, (int)pages[i]);
    return KVGEN_OK;
}

static kvgen_status forward_paged(kvgen_model *m, kvg_backend_session *s, const int32_t *pages,
                                  const int32_t *tokens, int n, int pos0, float *logits, bool all_logits, bool keep,
                                  int select, kvgen_error *err) {
    vk_model *vm = m->backend;
    if (!vm->paged) return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: paged forward on a contiguous model");
    kvgen_status st = check_step(vm, s, tokens, n, pos0, err);
    if (st != KVGEN_OK) return st;
    size_t n_entries = ((size_t)pos0 + (size_t)n + (size_t)vm->page_size - 1) / (size_t)vm->page_size;
    st = check_pages(vm, pages, n_entries, err);
    if (st != KVGEN_OK) return st;
    pthread_mutex_lock(&vm->ctx->lock);
    /* the table in a buffer the sets name once: a step only rewrites its entries */
    memcpy(s->ptab.map, pages, n_entries * sizeof *pages);
    st = refresh_sets(vm, s, err);
    if (st == KVGEN_OK) st = run_steps(vm, s, tokens, n, pos0, logits, all_logits, keep, select, err);
    pthread_mutex_unlock(&vm->ctx->lock);
    return st;
}

static kvgen_status vk_forward_paged(kvgen_model *m, kvg_backend_session *s, const int32_t *pages,
                                     const int32_t *tokens, int n, int pos0, float *logits, bool all_logits,
                                     kvgen_error *err) {
    return forward_paged(m, s, pages, tokens, n, pos0, logits, all_logits, false, 0, err);
}

/* ---- batched decode (kvg_model.h, forward_batch) ---- */

/* Makes vm->bat cover contexts of n_ctx positions (caller holds bat_mu, not ctx->lock): a new
 * one only when a session with a longer context than any batched before joins a batch. */
static kvgen_status batch_session(kvgen_model *m, int n_ctx, kvgen_error *err) {
    vk_model *vm = m->backend;
    if (vm->bat && vm->bat->n_ctx >= n_ctx) return KVGEN_OK;
    vk_session_free(m, vm->bat);
    vm->bat = NULL;
    kvgen_status st = session_create(m, n_ctx, true, &vm->bat, err);
    if (st == KVGEN_OK) vm->bat_entries = (uint32_t)((n_ctx + vm->page_size - 1) / vm->page_size);
    return st;
}

/* One step of n <= BATCH_MAX tokens of different sessions (caller holds ctx->lock, arguments
 * checked): column i is tokens[i] at pos[i] of the session with table pages[i]. */
static kvgen_status batch_step(vk_model *vm, kvg_backend_session *const *s, const int32_t *const *pages,
                               const int32_t *tokens, const int *pos, int n, float *logits, kvgen_error *err) {
    kvg_backend_session *b = vm->bat;
    uint32_t *params = vm->params.map;
    int32_t *tab = b->ptab.map;
    params[0] = 0;
    params[1] = BATCH_AT;
    for (int i = 0; i < n; i++) {
        uint32_t base = (uint32_t)i * vm->bat_entries;
        memcpy(tab + base, pages[i], ((size_t)pos[i] / (size_t)vm->page_size + 1) * sizeof *tab);
        params[4 + i] = (uint32_t)tokens[i];
        params[4 + BATCH_AT + 2 * i] = (uint32_t)pos[i];
        params[4 + BATCH_AT + 2 * i + 1] = base;
        s[i]->sel_n = 0; /* what they kept is stale once they run again */
        s[i]->saved_valid = false;
        if (vm->logits_owner == s[i]) vm->logits_owner = NULL;
    }
    kvgen_status st = KVGEN_OK;
    /* params carry everything that changes from step to step: same width, same commands */
    if (!b->decode_recorded || b->decode_ncols != (uint32_t)n) {
        st = record(vm, b, b->cb_decode, false, (uint32_t)n, 0, 2, 0, err);
        b->decode_recorded = st == KVGEN_OK;
        b->decode_ncols = (uint32_t)n;
    }
    if (st == KVGEN_OK) st = kvg_vk_submit_wait(vm->ctx, b->cb_decode, b->fence, err);
    if (st == KVGEN_OK) memcpy(logits, vm->logits.map, (size_t)n * (size_t)vm->hp.n_vocab * sizeof(float));
    return st;
}

/* Up to BATCH_MAX sessions' tokens per step (fewer when the scratch holds fewer columns). A
 * contiguous model's caches are one buffer per session, which one dispatch cannot index:
 * there the tokens run one by one. */
static kvgen_status vk_forward_batch(kvgen_model *m, kvg_backend_session *const *s, const int32_t *const *pages,
                                     const int32_t *tokens, const int *pos, int n, float *logits, kvgen_error *err) {
    vk_model *vm = m->backend;
    size_t V = (size_t)vm->hp.n_vocab;
    kvgen_status st = KVGEN_OK;
    if (!vm->paged) {
        for (int i = 0; i < n && st == KVGEN_OK; i++)
            st = vk_forward(m, s[i], &tokens[i], 1, pos[i], logits + (size_t)i * V, false, err);
        return st;
    }
    int n_ctx = 1;
    for (int i = 0; i < n && st == KVGEN_OK; i++) {
        if (!pages[i]) return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: batch token %d has no page table", i);
        st = check_step(vm, s[i], &tokens[i], 1, pos[i], err);
        if (st == KVGEN_OK) st = check_pages(vm, pages[i], (size_t)pos[i] / (size_t)vm->page_size + 1, err);
        if (s[i]->n_ctx > n_ctx) n_ctx = s[i]->n_ctx;
    }
    if (st != KVGEN_OK) return st;
    int group = vm->chunk < BATCH_MAX ? (int)vm->chunk : BATCH_MAX;
    pthread_mutex_lock(&vm->bat_mu);
    st = batch_session(m, n_ctx, err);
    if (st == KVGEN_OK) {
        pthread_mutex_lock(&vm->ctx->lock);
        set_aside_logits(vm, vm->bat);
        st = refresh_sets(vm, vm->bat, err);
        for (int done = 0; done < n && st == KVGEN_OK; done += group) {
            int k = n - done < group ? n - done : group;
            st = batch_step(vm, s + done, pages + done, tokens + done, pos + done, k, logits + (size_t)done * V, err);
        }
        pthread_mutex_unlock(&vm->ctx->lock);
    }
    pthread_mutex_unlock(&vm->bat_mu);
    return st;
}

/* ---- logits kept on the device (kvg_model.h, forward_keep) ---- */

static kvgen_status vk_forward_keep(kvgen_model *m, kvg_backend_session *s, const int32_t *pages,
                                    const int32_t *tokens, int n, int pos0, int select_k, kvgen_error *err) {
    vk_model *vm = m->backend;
    if (select_k < 0 || select_k > KVG_VK_TOPK)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: a selection of %d logits (at most %d)", select_k,
                        KVG_VK_TOPK);
    if (pages) return forward_paged(m, s, pages, tokens, n, pos0, NULL, false, true, select_k, err);
    if (vm->paged) return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: contiguous forward on a paged model");
    kvgen_status st = check_step(vm, s, tokens, n, pos0, err);
    if (st != KVGEN_OK) return st;
    pthread_mutex_lock(&vm->ctx->lock);
    st = run_steps(vm, s, tokens, n, pos0, NULL, false, true, select_k, err);
    pthread_mutex_unlock(&vm->ctx->lock);
    return st;
}

static kvgen_status vk_fetch_logits(kvgen_model *m, kvg_backend_session *s, float *out, kvgen_error *err) {
    vk_model *vm = m->backend;
    size_t bytes = (size_t)vm->hp.n_vocab * sizeof(float);
    kvgen_status st = KVGEN_OK;
    pthread_mutex_lock(&vm->ctx->lock);
    if (vm->logits_owner == s) memcpy(out, vm->logits.map, bytes);
    else if (s->saved_valid) memcpy(out, s->saved, bytes);
    else st = kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: the session has no logits kept on the device");
    pthread_mutex_unlock(&vm->ctx->lock);
    return st;
}

static kvgen_status vk_topk(kvgen_model *m, kvg_backend_session *s, int k, int32_t *ids, float *vals,
                            kvgen_error *err) {
    (void)m;
    if (k <= 0 || k > s->sel_n)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: %d best logits asked for, %d were selected", k,
                        s->sel_n);
    memcpy(ids, s->sel_ids, (size_t)k * sizeof *ids);
    if (vals) memcpy(vals, s->sel_vals, (size_t)k * sizeof *vals);
    return KVGEN_OK;
}

/* A share of the device-local heap for K/V (a quarter, leaving room for the weights, the
 * scratch, other models and the game's own resources), no more than 16 sessions of
 * min(context_length, 8192) tokens, and no more than the 8 slabs can bind (with room for
 * rounding to whole pages). Memory is taken one slab (1/8 of the pool) at a time. */
static size_t vk_default_pool_bytes(const kvgen_model *m) {
    const vk_model *vm = m->backend;
    const kvg_hparams *hp = &m->w.hp;
    size_t ctx_tokens = hp->n_ctx_train > 0 && hp->n_ctx_train < 8192 ? (size_t)hp->n_ctx_train : 8192;
    size_t want = 16 * ctx_tokens * vk_cache_bytes_per_token(m);
    size_t heap = (size_t)vm->ctx->info.device_local_bytes / 4;
    if (heap && want > heap) want = heap;
    size_t bindable = max_part_bytes(vm->ctx) / 4 * 3 * KVG_VK_KV_SLABS;
    return want < bindable ? want : bindable;
}

static kvgen_status vk_kv_pages_init(kvgen_model *m, int page_size, int32_t n_pages, kvgen_error *err) {
    vk_model *vm = m->backend;
    kvg_vk_ctx *ctx = vm->ctx;
    const kvg_hparams *hp = &vm->hp;
    uint64_t elems = (uint64_t)hp->n_layer * 2 * (uint64_t)hp->n_head_kv * (uint64_t)page_size * (uint64_t)hp->head_dim;
    size_t elem = ctx->kv_f16 ? 2 : 4, limit = max_part_bytes(ctx);
    uint64_t per_slab = limit / (elems * elem);
    if (per_slab == 0)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: one KV page of %d tokens (%llu bytes) exceeds the device's "
                        "storage buffer range (%zu bytes); use a smaller kv_page_size", page_size,
                        (unsigned long long)(elems * elem), limit);
    if ((uint64_t)n_pages > per_slab * KVG_VK_KV_SLABS)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: a KV pool of %d pages (%llu bytes) exceeds what the device "
                        "can bind: %d buffers of %zu bytes (maxStorageBufferRange); use a smaller kv_pool_bytes",
                        (int)n_pages, (unsigned long long)((uint64_t)n_pages * elems * elem), KVG_VK_KV_SLABS, limit);
    /* As few slabs as the range allows: with one, the shaders' slab switch compiles away (on
     * lavapipe, 8 slabs cost 20-30% of decode at depth 2048). KVGEN_VK_LAZY_SLABS=1 spreads the
     * pool over 8 slabs instead, so memory is taken an eighth of the pool at a time. */
    uint64_t pps = per_slab;
    if (getenv("KVGEN_VK_LAZY_SLABS") && atoi(getenv("KVGEN_VK_LAZY_SLABS")) > 0) {
        pps = ((uint64_t)n_pages + KVG_VK_KV_SLABS - 1) / KVG_VK_KV_SLABS;
        if (pps > per_slab) pps = per_slab;
    }
    vm->paged = true;
    vm->page_size = page_size;
    vm->n_pages = n_pages;
    vm->page_elems = (uint32_t)elems;
    vm->page_bytes = (size_t)(elems * elem);
    vm->pps = (uint32_t)pps;
    vm->nslab = (uint32_t)(((uint64_t)n_pages + pps - 1) / pps);
    kvgen_status st = kvg_vk_buffer_create(ctx, (size_t)(2 * KV_OPS_PAGES + hp->n_rot + 4) * 4, KVG_VK_MEM_HOST,
                                           &vm->ops, err);
    if (st == KVGEN_OK && !vm->ops.map) st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: no host-visible memory");
    if (st == KVGEN_OK) st = kvg_vk_pool_create(ctx, 1, &vm->ops_pool, err);
    if (st == KVGEN_OK) {
        pthread_mutex_lock(&ctx->lock);
        st = kvg_vk_cmd_alloc(ctx, &vm->ops_cb, err);
        pthread_mutex_unlock(&ctx->lock);
    }
    vm->ops_gen = ~0u;
    if (st == KVGEN_OK) {
        walk pw = {.mode = WALK_PIPELINES, .vm = vm, .n = 1, .logits = 2, .err = err};
        st = walk_step(&pw);
    }
    if (st == KVGEN_OK) {
        uint32_t spec[KVG_SPEC_COUNT];
        spec_init(spec);
        kv_spec(vm, spec);
        VkPipeline p;
        st = kvg_vk_pipeline_get(ctx, "kv_copy", spec, &p, err);
    }
    if (st == KVGEN_OK) kvg_vk_pcache_save(ctx); /* the end of a paged load: every pipeline exists now */
    return st;
}

static kvgen_status vk_kv_page_commit(kvgen_model *m, int32_t page, kvgen_error *err) {
    vk_model *vm = m->backend;
    kvg_vk_ctx *ctx = vm->ctx;
    if (page < 0 || page >= vm->n_pages)
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: page %d outside the pool of %d", (int)page, (int)vm->n_pages);
    uint32_t j = (uint32_t)page / vm->pps;
    if (vm->slabs[j].buf) return KVGEN_OK;
    uint32_t pages = (uint32_t)vm->n_pages - j * vm->pps < vm->pps ? (uint32_t)vm->n_pages - j * vm->pps : vm->pps;
    kvg_vk_buffer b;
    kvgen_status st = kvg_vk_buffer_create(ctx, (size_t)pages * vm->page_bytes, KVG_VK_MEM_UPLOAD, &b, err);
    if (st != KVGEN_OK)
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: no device memory for KV pages %u..%u (%zu bytes): %s",
                        j * vm->pps, j * vm->pps + pages - 1, (size_t)pages * vm->page_bytes,
                        err ? err->message : "");
    pthread_mutex_lock(&ctx->lock);
    vm->slabs[j] = b;
    __atomic_add_fetch(&vm->kv_gen, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&ctx->lock);
    return KVGEN_OK;
}

/* byte offset of (layer, which) of `page` inside its slab, after checking the page */
static kvgen_status page_region(const vk_model *vm, int32_t page, int layer, int which, const kvg_vk_buffer **slab,
                                size_t *off, kvgen_error *err) {
    if (page < 0 || page >= vm->n_pages || !vm->slabs[(uint32_t)page / vm->pps].buf)
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: page %d has no storage", (int)page);
    const kvg_hparams *hp = &vm->hp;
    size_t v = (size_t)hp->n_head_kv * (size_t)vm->page_size * (size_t)hp->head_dim;
    size_t elem = vm->ctx->kv_f16 ? 2 : 4;
    *slab = &vm->slabs[(uint32_t)page / vm->pps];
    *off = ((size_t)((uint32_t)page % vm->pps) * vm->page_elems + ((size_t)layer * 2 + (size_t)which) * v) * elem;
    return KVGEN_OK;
}

/* Reads (write = false) or writes one layer's K or V of positions [pos0, pos0+n) as f32
 * (kv_heads, n, head_dim), a page's (layer, which) region at a time: a mapped copy where the
 * pool is host-visible (lavapipe, UMA, ReBAR), else a staging transfer. */
static kvgen_status kv_transfer(kvgen_model *m, const int32_t *pages, int layer, int which, int pos0, int n,
                                float *io, bool write, kvgen_error *err) {
    vk_model *vm = m->backend;
    const kvg_hparams *hp = &vm->hp;
    if (!vm->paged || layer < 0 || layer >= hp->n_layer || which < 0 || which > 1 || pos0 < 0 || n < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: KV %s of layer %d, which %d, [%d, +%d) out of range",
                        write ? "write" : "read", layer, which, pos0, n);
    size_t P = (size_t)vm->page_size, hd = (size_t)hp->head_dim, H = (size_t)hp->n_head_kv;
    size_t elem = vm->ctx->kv_f16 ? 2 : 4, region = H * P * hd * elem;
    uint8_t *tmp = malloc(region);
    if (!tmp) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory for a KV transfer");
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
                size_t e = (h * P + slot0 + i) * hd;
                float *f = io + (h * (size_t)n + (p - (size_t)pos0) + i) * hd;
                if (elem == 4) {
                    if (write) memcpy(tmp + e * 4, f, hd * 4);
                    else memcpy(f, tmp + e * 4, hd * 4);
                } else {
                    uint16_t *hv = (uint16_t *)(void *)tmp + e;
                    for (size_t d = 0; d < hd; d++) {
                        if (write) hv[d] = kvg_f32_to_f16(f[d]);
                        else f[d] = kvg_f16_to_f32(hv[d]);
                    }
                }
            }
        /* the slab is written only through its own region, the one page the caller holds alone */
        if (st == KVGEN_OK && write) st = kvg_vk_upload(vm->ctx, (kvg_vk_buffer *)slab, off, tmp, region, err);
        p += cnt;
    }
    free(tmp);
    return st;
}

static kvgen_status vk_kv_read(kvgen_model *m, const int32_t *pages, int layer, int which, int pos0, int n,
                               float *out, kvgen_error *err) {
    return kv_transfer(m, pages, layer, which, pos0, n, out, false, err);
}

static kvgen_status vk_kv_write(kvgen_model *m, const int32_t *pages, int layer, int which, int pos0, int n,
                                const float *in, kvgen_error *err) {
    return kv_transfer(m, pages, layer, which, pos0, n, (float *)in, true, err);
}

/* kv_copy.comp over [src_pos, +n) -> [dst_pos, +n). A move towards the start of one table that
 * overlaps itself runs in rounds of (src_pos - dst_pos) positions, one submission each, so no
 * dispatch reads a slot that it also writes. */
static kvgen_status vk_kv_copy(kvgen_model *m, const int32_t *src_pages, int src_pos, const int32_t *dst_pages,
                               int dst_pos, int n, int rope_delta, kvgen_error *err) {
    vk_model *vm = m->backend;
    kvg_vk_ctx *ctx = vm->ctx;
    const kvg_hparams *hp = &vm->hp;
    if (!vm->paged || src_pos < 0 || dst_pos < 0 || n < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: kv_copy [%d, +%d) -> %d out of range", src_pos, n,
                        dst_pos);
    if (n == 0) return KVGEN_OK;
    int P = vm->page_size;
    int piece_max = (KV_OPS_PAGES - 1) * P;
    if (src_pages == dst_pages && dst_pos < src_pos && src_pos - dst_pos < piece_max) piece_max = src_pos - dst_pos;
    uint32_t spec[KVG_SPEC_COUNT];
    spec_init(spec);
    kv_spec(vm, spec);
    VkPipeline pipe = kvg_vk_pipeline_find(ctx, "kv_copy", spec);
    if (!pipe) return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: the kv_copy pipeline was not created");
    int32_t *ops = vm->ops.map;
    /* cos/sin of the position change, in double as the reference computes RoPE */
    for (int i = 0; i < hp->n_rot / 2; i++) {
        double theta = (double)rope_delta * pow(hp->rope_freq_base, -2.0 * i / hp->n_rot);
        float cs[2] = {(float)cos(theta), (float)sin(theta)};
        memcpy(ops + 2 * KV_OPS_PAGES + 2 * i, cs, sizeof cs);
    }
    pthread_mutex_lock(&ctx->lock);
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
        memcpy(ops, src_pages + s0 / P, (size_t)ns * sizeof *ops);
        memcpy(ops + KV_OPS_PAGES, dst_pages + d0 / P, (size_t)nd * sizeof *ops);
        for (int i = 0; i < ns; i++)
            if (ops[i] < 0 || ops[i] >= vm->n_pages || !vm->slabs[(uint32_t)ops[i] / vm->pps].buf)
                st = kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: kv_copy from page %d, which has no storage", (int)ops[i]);
        for (int i = 0; i < nd; i++)
            if (ops[KV_OPS_PAGES + i] < 0 || ops[KV_OPS_PAGES + i] >= vm->n_pages ||
                !vm->slabs[(uint32_t)ops[KV_OPS_PAGES + i] / vm->pps].buf)
                st = kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: kv_copy to page %d, which has no storage",
                              (int)ops[KV_OPS_PAGES + i]);
        pc_kv_copy pc = {.n = (uint32_t)c,
                         .hd = (uint32_t)hp->head_dim,
                         .n_layer = (uint32_t)hp->n_layer,
                         .n_kv = (uint32_t)hp->n_head_kv,
                         .src_tab = 0,
                         .dst_tab = KV_OPS_PAGES,
                         .src_pos = (uint32_t)(s0 % P),
                         .dst_pos = (uint32_t)(d0 % P),
                         .kv_page = vm->page_elems,
                         .kv_v = (uint32_t)(hp->n_head_kv * P * hp->head_dim),
                         .n_rot = (uint32_t)hp->n_rot,
                         .cs_off = 2 * KV_OPS_PAGES,
                         .rope = rope_delta != 0};
        if (st == KVGEN_OK) st = kvg_vk_check(vkResetCommandBuffer(vm->ops_cb, 0), err, "vkResetCommandBuffer");
        if (st == KVGEN_OK) st = kvg_vk_cmd_begin(vm->ops_cb, true, err);
        if (st == KVGEN_OK) {
            uint32_t groups = (uint32_t)(((size_t)c * (size_t)(hp->head_dim / 2) + 63) / 64);
            kvg_vk_cmd_dispatch(ctx, vm->ops_cb, pipe, vm->ops_set, &pc, sizeof pc, groups, 1, 1);
            kvg_vk_cmd_barrier(vm->ops_cb);
            kvg_vk_cmd_host_barrier(vm->ops_cb);
            st = kvg_vk_cmd_end(vm->ops_cb, err);
            if (st == KVGEN_OK) st = kvg_vk_submit_wait(ctx, vm->ops_cb, ctx->fence, err);
        }
        done += c;
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

const kvg_backend_ops kvg_vulkan_backend = {
    .name = "vulkan",
    /* the plain llama pass (adjacent-pair RoPE in the QKV epilogue, SwiGLU, no biases or extra
     * norms); Q and the attention output have their own stride (ld_q), so heads x head_dim may
     * differ from n_embd */
    .features = KVG_F_WIDE_HEADS,
    .weight_types = vk_weight_types,
    .model_init = vk_model_init,
    .model_free = vk_model_free,
    .session_init = vk_session_init,
    .session_free = vk_session_free,
    .forward = vk_forward,
    .read_cache = vk_read_cache,
    .cache_bytes_per_token = vk_cache_bytes_per_token,
    .kv_default_pool_bytes = vk_default_pool_bytes,
    .kv_pages_init = vk_kv_pages_init,
    .kv_page_commit = vk_kv_page_commit,
    .forward_paged = vk_forward_paged,
    .kv_copy = vk_kv_copy,
    .kv_read = vk_kv_read,
    .kv_write = vk_kv_write,
    .forward_batch = vk_forward_batch,
    .forward_keep = vk_forward_keep,
    .fetch_logits = vk_fetch_logits,
    .topk = vk_topk,
};

/* ---- test hooks ---- */

static kvgen_status run_one_off(kvg_vk_ctx *ctx, walk *w, kvgen_status (*op)(walk *, const void *), const void *arg,
                                kvgen_error *err) {
    pthread_mutex_lock(&ctx->lock);
    VkCommandBuffer cb;
    kvgen_status st = kvg_vk_cmd_alloc(ctx, &cb, err);
    if (st == KVGEN_OK) {
        st = kvg_vk_cmd_begin(cb, true, err);
        w->cb = cb;
        w->mode = WALK_RECORD;
        w->cursor = 0;
        if (st == KVGEN_OK) st = op(w, arg);
        kvg_vk_cmd_host_barrier(cb);
        kvgen_status st2 = kvg_vk_cmd_end(cb, err);
        if (st == KVGEN_OK) st = st2;
        if (st == KVGEN_OK) st = kvg_vk_submit_wait(ctx, cb, ctx->fence, err);
        vkFreeCommandBuffers(ctx->dev, ctx->cmd_pool, 1, &cb);
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

static kvgen_status op_matmul_v(walk *w, const void *a) { return op_matmul(w, a); }
static kvgen_status op_attention_v(walk *w, const void *a) { return op_attention(w, 0 * (a != NULL)); }

kvgen_status kvg_vk_test_matmul(kvg_vk_ctx *ctx, uint32_t type, const void *wdata, uint32_t rows, uint32_t K,
                                const float *x, uint32_t ncols, const float *norm, float eps, int epi, int lane,
                                float *y, kvgen_error *err) {
    if (epi != EPI_STORE && epi != EPI_ADD && epi != EPI_SWIGLU)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvg_vk_test_matmul: epilogue %d", epi);
    vk_model vm = {0};
    vm.ctx = ctx;
    vm.hp.rms_norm_eps = eps;
    vm.hp.head_dim = 2;
    vm.mv_lane = lane < 0 ? ctx->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU : lane != 0;
    vm.mv_wg = vm.mv_lane ? 32 : 64;
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
    float *xp = calloc((size_t)ncols * ldx + 32, sizeof *xp);
    kvgen_status st = xp ? KVGEN_OK : kvg_fail(err, KVGEN_E_NO_MEMORY, "out of memory");
    if (st == KVGEN_OK) st = upload_matrix(&vm, "test", &tp, 1, false, &m, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, 16 + 16, KVG_VK_MEM_HOST, &vm.params, err);
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
    if (st == KVGEN_OK) st = op_matmul(&w, &a);
    if (st == KVGEN_OK) {
        s.sets = calloc((size_t)m.n_parts, sizeof *s.sets);
        if (!s.sets) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "out of memory");
    }
    if (st == KVGEN_OK) st = kvg_vk_pool_create(ctx, (uint32_t)m.n_parts, &s.pool, err);
    if (st == KVGEN_OK) {
        w.mode = WALK_SETS;
        st = op_matmul(&w, &a);
    }
    if (st == KVGEN_OK) st = run_one_off(ctx, &w, op_matmul_v, &a, err);
    if (st == KVGEN_OK) st = kvg_vk_download(ctx, &yb, 0, y, (size_t)ncols * ldo * 4, err);
    if (s.pool) vkDestroyDescriptorPool(ctx->dev, s.pool, NULL);
    free(s.sets);
    free(xp);
    free_matrix(ctx, &m);
    kvg_vk_buffer_destroy(ctx, &vm.params);
    kvg_vk_buffer_destroy(ctx, &xb);
    kvg_vk_buffer_destroy(ctx, &yb);
    kvg_vk_buffer_destroy(ctx, &nb);
    return st;
}

kvgen_status kvg_vk_test_attention(kvg_vk_ctx *ctx, int n_head, int n_kv, int hd, int n_ctx, int pos0, int ncols,
                                   int nsplit, int lane, const float *q, const float *k, const float *v,
                                   float *out, kvgen_error *err) {
    if (n_head <= 0 || n_kv <= 0 || n_head % n_kv || n_head / n_kv > 8 || hd <= 0 || hd > 256 || hd % 2 ||
        ncols <= 0 || pos0 < 0 || pos0 + ncols > n_ctx || nsplit <= 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvg_vk_test_attention: bad shape");
    vk_model vm = {0};
    vm.ctx = ctx;
    vm.hp.n_head = n_head;
    vm.hp.n_head_kv = n_kv;
    vm.hp.head_dim = hd;
    vm.ld_q = (uint32_t)(n_head * hd);
    vm.attn_lane = (lane < 0 ? ctx->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU : lane != 0) && hd % 8 == 0;
    kvg_vk_buffer kb = {0}, vb = {0};
    kvg_backend_session s = {.n_ctx = n_ctx, .k = &kb, .v = &vb, .nsplit_dec = (uint32_t)nsplit};
    /* the backend's policy: no split covers more than 4096 positions */
    uint32_t split_min = (uint32_t)((n_ctx + 4095) / 4096);
    if (s.nsplit_dec < split_min) s.nsplit_dec = split_min;
    size_t nkv = (size_t)n_kv * (size_t)n_ctx * (size_t)hd, nq = (size_t)ncols * vm.ld_q;
    size_t elem = ctx->kv_f16 ? 2 : 4;
    void *tmp = malloc(nkv * elem);
    kvgen_status st = tmp ? KVGEN_OK : kvg_fail(err, KVGEN_E_NO_MEMORY, "out of memory");
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, 16 + 16, KVG_VK_MEM_HOST, &vm.params, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, nq * 4, KVG_VK_MEM_DEVICE, &vm.q, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, nq * 4, KVG_VK_MEM_DEVICE, &vm.att, err);
    if (st == KVGEN_OK)
        st = kvg_vk_buffer_create(ctx, (size_t)ncols * s.nsplit_dec * (size_t)n_head * (size_t)(hd + 2) * 4, KVG_VK_MEM_DEVICE,
                                  &s.part, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, nkv * elem, KVG_VK_MEM_DEVICE, &kb, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, nkv * elem, KVG_VK_MEM_DEVICE, &vb, err);
    for (int which = 0; which < 2 && st == KVGEN_OK; which++) {
        const float *src = which ? v : k;
        if (elem == 4) memcpy(tmp, src, nkv * 4);
        else
            for (size_t i = 0; i < nkv; i++) ((uint16_t *)tmp)[i] = kvg_f32_to_f16(src[i]);
        st = kvg_vk_upload(ctx, which ? &vb : &kb, 0, tmp, nkv * elem, err);
    }
    if (st == KVGEN_OK) st = kvg_vk_upload(ctx, &vm.q, 0, q, nq * 4, err);
    if (st == KVGEN_OK) {
        ((uint32_t *)vm.params.map)[0] = (uint32_t)pos0;
        ((uint32_t *)vm.params.map)[1] = 0;
    }
    walk w = {.mode = WALK_PIPELINES, .vm = &vm, .s = &s, .n = (uint32_t)ncols, .max_len = (uint32_t)(pos0 + ncols),
              .err = err};
    VkDescriptorSet set = VK_NULL_HANDLE;
    s.sets = &set;
    if (st == KVGEN_OK) st = op_attention(&w, 0);
    if (st == KVGEN_OK) st = kvg_vk_pool_create(ctx, 1, &s.pool, err);
    if (st == KVGEN_OK) {
        w.mode = WALK_SETS;
        st = op_attention(&w, 0);
    }
    if (st == KVGEN_OK) st = run_one_off(ctx, &w, op_attention_v, NULL, err);
    if (st == KVGEN_OK) st = kvg_vk_download(ctx, &vm.att, 0, out, nq * 4, err);
    if (s.pool) vkDestroyDescriptorPool(ctx->dev, s.pool, NULL);
    free(tmp);
    kvg_vk_buffer *bufs[] = {&vm.params, &vm.q, &vm.att, &s.part, &kb, &vb};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kvg_vk_buffer_destroy(ctx, bufs[i]);
    return st;
}
