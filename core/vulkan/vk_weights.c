/* vk_weights.c: the Vulkan backend's weights (private to the backend). It owns the weight-type
 * table (one row per type the shaders run: kvg_vk_wtype_*, the backend's weight_types list),
 * the repack functions, and the upload: every matrix is repacked as its type's row says (a quant
 * region and a scale region per part; kvg_vk.h, shaders/weights.glsl) and uploaded once; a
 * matrix bigger than the device's buffer range is split into row parts, one binding and one
 * dispatch each. Q/K/V concatenated and gate/up interleaved row by row are groups of tensors
 * uploaded as one matrix (vk_backend.c names the groups). Calls only vk_device.c and quant.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_quant.h"
#include "kvg_vk_backend.h"

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

size_t kvg_vk_weight_types(uint32_t *types, size_t max) {
    for (size_t i = 0; i < N_WTYPES && i < max; i++) types[i] = WTYPES[i].type;
    return N_WTYPES;
}

/* "vulkan: tensor T has type X, which the vulkan backend does not run (vulkan runs: ...)" */
static kvgen_status refuse_type(const kvg_tensor *t, const char *what, kvgen_error *err) {
    uint32_t types[N_WTYPES];
    size_t n = kvg_vk_weight_types(types, N_WTYPES);
    char list[256];
    kvg_types_list(types, n, list, sizeof list);
    return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: %s: tensor %s has type %s, which the vulkan backend does not "
                    "run (vulkan runs: %s)", what, t->name, kvg_type_name(t->type), list);
}

/* ---- weight upload ---- */

size_t kvg_vk_max_part_bytes(const kvg_vk_ctx *ctx) {
    size_t lim = ctx->props.limits.maxStorageBufferRange;
    if (ctx->info.max_allocation_size && ctx->info.max_allocation_size < lim) lim = ctx->info.max_allocation_size;
    const char *env = getenv("KVGEN_VK_MAX_PART"); /* tests: force splitting */
    if (env && atol(env) > 0 && (size_t)atol(env) < lim) lim = (size_t)atol(env);
    return lim;
}

/* Uploads the rows of `n_src` tensors (same row length) as one matrix: concatenated, or, with
 * interleave (two tensors of equal rows), alternating a row of each. */
kvgen_status kvg_vk_upload_matrix(vk_model *vm, const char *what, const kvg_tensor *const *srcs, int n_src,
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
    size_t lim = kvg_vk_max_part_bytes(vm->ctx);
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

void kvg_vk_free_matrix(kvg_vk_ctx *ctx, vk_matrix *m) {
    for (int i = 0; i < m->n_parts; i++) kvg_vk_buffer_destroy(ctx, &m->parts[i].buf);
    free(m->parts);
    memset(m, 0, sizeof *m);
}

kvgen_status kvg_vk_upload_norm(vk_model *vm, const kvg_tensor *t, kvg_vk_buffer *out, kvgen_error *err) {
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
