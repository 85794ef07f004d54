/* vk_weights.c: the Vulkan backend's weights (private to the backend). It owns the weight-type
 * table (one row per type the shaders run: kvg_vk_wtype_*, the backend's weight_types list),
 * the repack functions, and the upload: every matrix is repacked as its type's row says (a quant
 * region and a scale region per part; kvg_vk.h, shaders/weights.glsl) and uploaded once; a
 * matrix bigger than the device's buffer range is split into row parts, one binding and one
 * dispatch each. Q/K/V concatenated and gate/up interleaved row by row are groups of tensors
 * uploaded as one matrix (vk_backend.c names the groups); every part has its own weight type, so
 * a group whose members differ in type (Q4_K_M files: a Q6_K attn_v beside Q4_K attn_q/attn_k)
 * keeps each member packed. Calls only vk_device.c and quant.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_quant.h"
#include "kvg_vk_backend.h"

/* ---- the weight types ----
 * One row per type the shaders run; everything below reads the row (kvg_vk.h: layout and how to
 * add a type). A repacked block holds exactly the GGUF block's bytes: its header (the scales,
 * mins and, for Q5_0/Q5_1, the high bits) goes to the scale region in GGUF order, the rest to the
 * quant region, for the 256-element types regrouped per 32-element sub-block so that each
 * sub-block's quants are one or two aligned loads (shaders/weights.glsl: N16, B2, B1):
 *   float types: the row as it is (F32 32 words per 32 elements, F16/BF16 16: two halves a word)
 *   Q8_0 8 words of int8 + d; Q4_0, IQ4_NL 4 words of nibbles + d; Q4_1 4 words + (d, m);
 *   Q5_0 4 words + (d, qh); Q5_1 4 words + (d, m, qh): scales first in GGUF, so a plain split
 *   IQ4_XS 32 words of nibbles + (d, scales_h, scales_l): GGUF's sub-blocks are already N16
 *   Q4_K N16 x 8 + (d, dmin, scales[12]); Q5_K B1 x 8, N16 x 8 + (d, dmin, scales[12]);
 *   Q6_K N16 x 8, B2 x 8 + (scales[16], d); Q2_K B2 x 8 + (scales[16], d, dmin);
 *   Q3_K B2 x 8, B1 x 8 + (scales[12], d) */

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

/* The K types' fields of element e (0..255) of a GGUF super-block (bit planes: quant.c's top
 * comment): a 4-bit nibble, a 2-bit field, a 1-bit field. */
static unsigned k_nib(uint32_t type, const uint8_t *b, unsigned e) {
    if (type == KVG_TYPE_Q6_K) return (b[64 * (e / 128) + e % 64] >> (4 * ((e % 128) / 64))) & 15;
    const uint8_t *qs = b + (type == KVG_TYPE_Q5_K ? 48 : 16); /* Q4_K, Q5_K */
    return (qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 15;
}
static unsigned k_bits2(uint32_t type, const uint8_t *b, unsigned e) {
    const uint8_t *q = b + (type == KVG_TYPE_Q6_K ? 128 : type == KVG_TYPE_Q2_K ? 16 : 32); /* Q3_K: 32 */
    return (q[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
}
static unsigned k_bit1(uint32_t type, const uint8_t *b, unsigned e) {
    const uint8_t *q = b + (type == KVG_TYPE_Q5_K ? 16 : 0); /* Q3_K's hmask: 0 */
    return (q[e % 32] >> (e / 32)) & 1;
}

/* Per K type: the header's GGUF byte ranges (offset, length; in scale-region order) and the
 * quant region's fields in order, 8 sub-blocks each: 'n' N16 (4 words), '2' B2 (2), '1' B1 (1). */
typedef struct k_layout {
    uint32_t type;
    uint8_t hdr[2][2];
    const char *fields;
} k_layout;
static const k_layout K_LAYOUTS[] = {
    {KVG_TYPE_Q4_K, {{0, 16}, {0, 0}}, "n"},     {KVG_TYPE_Q5_K, {{0, 16}, {0, 0}}, "1n"},
    {KVG_TYPE_Q6_K, {{192, 18}, {0, 0}}, "n2"},  {KVG_TYPE_Q2_K, {{0, 16}, {80, 4}}, "2"},
    {KVG_TYPE_Q3_K, {{96, 14}, {0, 0}}, "21"},
};

static void repack_k(const kvg_vk_wtype *t, const uint8_t *src, uint32_t K, uint32_t *q, uint8_t *scales) {
    const k_layout *L = NULL;
    for (size_t i = 0; i < sizeof K_LAYOUTS / sizeof K_LAYOUTS[0]; i++)
        if (K_LAYOUTS[i].type == t->type) L = &K_LAYOUTS[i];
    if (!L) return; /* every row naming repack_k has a layout (test_vk_types runs them all) */
    size_t bb = kvg_row_bytes(t->type, 256), sb = (size_t)t->scale_halves * 2;
    for (uint32_t blk = 0; blk < K / 256; blk++) {
        const uint8_t *b = src + blk * bb;
        uint8_t *sd = scales + blk * sb;
        for (int h = 0; h < 2; h++) {
            memcpy(sd, b + L->hdr[h][0], L->hdr[h][1]);
            sd += L->hdr[h][1];
        }
        uint32_t *qd = q + (size_t)blk * t->qwords;
        for (const char *f = L->fields; *f; f++)
            for (unsigned s = 0; s < 8; s++) {
                unsigned e0 = 32 * s;
                if (*f == 'n') { /* word k: bytes 4k..4k+3; byte i: element i low, i + 16 high */
                    for (unsigned k = 0; k < 4; k++) {
                        uint32_t w = 0;
                        for (unsigned c = 0; c < 4; c++) {
                            unsigned i = 4 * k + c;
                            w |= (uint32_t)(k_nib(t->type, b, e0 + i) | k_nib(t->type, b, e0 + i + 16) << 4) << (8 * c);
                        }
                        *qd++ = w;
                    }
                } else if (*f == '2') { /* word k: elements 16k..16k+15, 2 bits each */
                    for (unsigned k = 0; k < 2; k++) {
                        uint32_t w = 0;
                        for (unsigned l = 0; l < 16; l++) w |= (uint32_t)k_bits2(t->type, b, e0 + 16 * k + l) << (2 * l);
                        *qd++ = w;
                    }
                } else { /* '1': bit l is element l */
                    uint32_t w = 0;
                    for (unsigned l = 0; l < 32; l++) w |= (uint32_t)k_bit1(t->type, b, e0 + l) << l;
                    *qd++ = w;
                }
            }
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
    {KVG_TYPE_Q5_0, "q5_0", "WTYPE_Q5_0=1", 32, 4, 3, false, repack_scales_first},
    {KVG_TYPE_Q5_1, "q5_1", "WTYPE_Q5_1=1", 32, 4, 4, false, repack_scales_first},
    {KVG_TYPE_IQ4_NL, "iq4_nl", "WTYPE_IQ4_NL=1", 32, 4, 1, false, repack_scales_first},
    {KVG_TYPE_Q4_K, "q4_k", "WTYPE_Q4_K=1", 256, 32, 8, false, repack_k},
    {KVG_TYPE_Q5_K, "q5_k", "WTYPE_Q5_K=1", 256, 40, 8, false, repack_k},
    {KVG_TYPE_Q6_K, "q6_k", "WTYPE_Q6_K=1", 256, 48, 9, false, repack_k},
    {KVG_TYPE_Q2_K, "q2_k", "WTYPE_Q2_K=1", 256, 16, 10, false, repack_k},
    {KVG_TYPE_Q3_K, "q3_k", "WTYPE_Q3_K=1", 256, 24, 7, false, repack_k},
    {KVG_TYPE_IQ4_XS, "iq4_xs", "WTYPE_IQ4_XS=1", 256, 32, 4, false, repack_scales_first},
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

/* Q4_0 and Q5_0 rows are Q8_0 rows exactly: the same f16 d per 32 elements and int8 levels q - 8
 * (q - 16), so d * level is the same product. An interleaved group (gate/up) mixing only these
 * three is uploaded as Q8_0 instead of F32 (concatenated groups keep each member's type). */
static bool q8_0_exact(uint32_t type) {
    return type == KVG_TYPE_Q8_0 || type == KVG_TYPE_Q5_0 || type == KVG_TYPE_Q4_0;
}
static void row_to_q8_0(uint32_t type, const uint8_t *src, uint8_t *dst, uint32_t K) {
    size_t sb = kvg_row_bytes(type, 32);
    for (uint32_t b = 0; b < K / 32; b++, src += sb, dst += 34) {
        memcpy(dst, src, 2); /* d */
        if (type == KVG_TYPE_Q8_0) {
            memcpy(dst + 2, src + 2, 32);
            continue;
        }
        const uint8_t *qs = src + (type == KVG_TYPE_Q5_0 ? 6 : 2);
        uint32_t qh = type == KVG_TYPE_Q5_0 ? (uint32_t)src[2] | (uint32_t)src[3] << 8 | (uint32_t)src[4] << 16 |
                                                  (uint32_t)src[5] << 24
                                            : 0;
        int bias = type == KVG_TYPE_Q5_0 ? 16 : 8;
        for (int i = 0; i < 16; i++) {
            int lo = (qs[i] & 15) | (int)((qh >> i) & 1) << 4, hi = (qs[i] >> 4) | (int)((qh >> (i + 16)) & 1) << 4;
            dst[2 + i] = (uint8_t)(int8_t)(lo - bias);
            dst[2 + 16 + i] = (uint8_t)(int8_t)(hi - bias);
        }
    }
}

size_t kvg_vk_max_part_bytes(const kvg_vk_ctx *ctx) { return ctx->max_part; }

/* Rows of one part of type wt: as many as one buffer binding may cover, whole gemm tiles (64
 * rows) where that leaves at least one, else an even count (row pairs stay together for the
 * epilogue); 0 when not even two rows fit. */
static size_t rows_per_part(const kvg_vk_wtype *wt, uint32_t K, size_t lim, size_t *row_bytes) {
    size_t row_blocks = (K + wt->block_elems - 1) / wt->block_elems;
    *row_bytes = row_blocks * wt->qwords * 4 + (row_blocks * wt->scale_halves + 1) / 2 * 4 + 4;
    size_t per_part = lim / *row_bytes;
    if (per_part >= 64) return per_part / 64 * 64;
    per_part &= ~(size_t)1;
    return per_part >= 2 ? per_part : 0;
}

/* the type member i of a group is uploaded as: its own (common NO_COMMON), or common for every member */
#define NO_COMMON UINT32_MAX
static uint32_t member_type(const kvg_tensor *const *srcs, int i, uint32_t common) {
    return common != NO_COMMON ? common : srcs[i]->type;
}

/* Uploads the rows of `n_src` tensors (same row length) as one matrix: concatenated, or, with
 * interleave (two tensors of equal rows), alternating a row of each. A concatenated group keeps
 * each member's type: consecutive members of one type share parts, a member of another type
 * starts a part of its own (Q4_K attn_q/attn_k with a Q6_K attn_v: two parts, two dispatches).
 * An interleaved group's row pairs need one type: one of mixed types is uploaded as Q8_0 where
 * that is exact for every member (q8_0_exact), else as F32 (every table has it). */
kvgen_status kvg_vk_upload_matrix(vk_model *vm, const char *what, const kvg_tensor *const *srcs, int n_src,
                                  bool interleave, vk_matrix *out, kvgen_error *err) {
    memset(out, 0, sizeof *out);
    uint32_t K = (uint32_t)srcs[0]->ne[0];
    uint64_t rows = 0;
    bool mixed = false;
    for (int i = 0; i < n_src; i++) {
        if (!kvg_vk_wtype_of(srcs[i]->type)) return refuse_type(srcs[i], what, err);
        if (srcs[i]->ne[0] != K)
            return kvg_fail(err, KVGEN_E_FORMAT, "vulkan: %s: tensor %s has rows of %llu, expected %u", what,
                            srcs[i]->name, (unsigned long long)srcs[i]->ne[0], K);
        mixed |= srcs[i]->type != srcs[0]->type;
        rows += srcs[i]->n_elements / K;
    }
    if (interleave && (n_src != 2 || srcs[0]->n_elements != srcs[1]->n_elements))
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: %s: interleaved tensors differ in shape", what);
    if (rows > UINT32_MAX / 2 || K == 0)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: %s: %llu rows of %u are too many", what,
                        (unsigned long long)rows, K);
    uint32_t common = NO_COMMON;
    if (interleave && mixed) {
        bool to_q8 = K % 32 == 0;
        for (int i = 0; i < n_src; i++) to_q8 = to_q8 && q8_0_exact(srcs[i]->type);
        common = to_q8 ? KVG_TYPE_Q8_0 : KVG_TYPE_F32;
    }
    size_t lim = kvg_vk_max_part_bytes(vm->ctx);
    for (int i = 0; i < n_src; i++) {
        const kvg_vk_wtype *wt = kvg_vk_wtype_of(member_type(srcs, i, common));
        size_t row_bytes;
        if (!wt->pad && K % wt->block_elems != 0)
            return kvg_fail(err, KVGEN_E_FORMAT, "vulkan: %s: tensor %s: rows of %u are not whole %u-element blocks",
                            what, srcs[i]->name, K, wt->block_elems);
        if (!rows_per_part(wt, K, lim, &row_bytes))
            return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: %s: one row of tensor %s (%zu bytes) exceeds the "
                            "device's buffer range (%zu bytes)", what, srcs[i]->name, row_bytes, lim);
    }
    out->rows = (uint32_t)rows;
    out->k = K;
    out->nb = (K + 31) / 32; /* the shaders' 32-element blocks */

    /* the parts: each run of consecutive members of one type, cut at the buffer range; counted,
     * then laid out */
    for (int pass = 0; pass < 2; pass++) {
        int np = 0;
        uint64_t row0 = 0;
        for (int i = 0; i < n_src;) {
            uint32_t type = member_type(srcs, i, common);
            uint64_t run = 0;
            int j = i;
            for (; j < n_src && member_type(srcs, j, common) == type; j++) run += srcs[j]->n_elements / K;
            const kvg_vk_wtype *wt = kvg_vk_wtype_of(type);
            size_t row_bytes, per_part = rows_per_part(wt, K, lim, &row_bytes);
            for (uint64_t a = 0; a < run; a += per_part, np++) {
                if (pass == 0) continue;
                vk_part *part = &out->parts[np];
                part->type = type;
                part->wt = wt;
                part->row0 = (uint32_t)(row0 + a);
                part->rows = (uint32_t)(run - a < per_part ? run - a : per_part);
            }
            row0 += run;
            i = j;
        }
        if (pass == 0) {
            out->n_parts = np;
            out->parts = kvg_calloc((size_t)np, sizeof *out->parts);
            if (!out->parts) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory uploading %s", what);
        }
    }

    float *tmp = kvg_malloc((size_t)out->nb * 32 * sizeof(float));
    uint32_t *stage = NULL;
    if (!tmp) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory uploading %s", what);
    kvgen_status st = KVGEN_OK;
    for (int p = 0; p < out->n_parts && st == KVGEN_OK; p++) {
        vk_part *part = &out->parts[p];
        const kvg_vk_wtype *wt = part->wt;
        /* per row: row_words quant words, row_halves scale halves (layout: kvg_vk.h) */
        size_t row_blocks = (K + wt->block_elems - 1) / wt->block_elems;
        size_t row_words = row_blocks * wt->qwords, row_halves = row_blocks * wt->scale_halves;
        size_t qw = (size_t)part->rows * row_words;
        size_t total_words = qw + ((size_t)part->rows * row_halves + 1) / 2;
        part->scale_off = (uint32_t)qw;
        st = kvg_vk_buffer_create(vm->ctx, total_words * 4, KVG_VK_MEM_UPLOAD, &part->buf, err);
        if (st != KVGEN_OK) break;
        /* straight into mapped memory where possible, else through a host copy */
        uint32_t *dst = part->buf.map;
        if (!dst) {
            kvg_free(stage);
            stage = kvg_calloc(total_words, 4);
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
            if (t->type != part->type) { /* an interleaved group of mixed types: the same values as Q8_0, or f32 */
                if (part->type == KVG_TYPE_Q8_0) row_to_q8_0(t->type, src, (uint8_t *)tmp, K);
                else kvg_dequantize_row(t->type, src, tmp, K);
                src = (const uint8_t *)tmp;
            }
            wt->repack(wt, src, K, dst + r * row_words, (uint8_t *)(dst + part->scale_off) + r * row_halves * 2);
        }
        if (!part->buf.map) st = kvg_vk_upload(vm->ctx, &part->buf, 0, stage, total_words * 4, err);
    }
    kvg_free(stage);
    kvg_free(tmp);
    return st;
}

void kvg_vk_free_matrix(kvg_vk_ctx *ctx, vk_matrix *m) {
    for (int i = 0; i < m->n_parts; i++) kvg_vk_buffer_destroy(ctx, &m->parts[i].buf);
    kvg_free(m->parts);
    memset(m, 0, sizeof *m);
}

kvgen_status kvg_vk_upload_norm(vk_model *vm, const kvg_tensor *t, kvg_vk_buffer *out, kvgen_error *err) {
    uint32_t n = (uint32_t)t->n_elements;
    uint32_t padded = round_up(n, 32);
    float *v = kvg_calloc(padded, sizeof *v);
    if (!v) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory uploading %s", t->name);
    kvg_dequantize_row(t->type, t->data, v, n);
    /* a whole uniform window is bound (matvec.comp reads the norm weight through one) */
    size_t bytes = (size_t)padded * 4 > vm->ctx->ubo_window ? (size_t)padded * 4 : vm->ctx->ubo_window;
    kvgen_status st = kvg_vk_buffer_create(vm->ctx, bytes, KVG_VK_MEM_UPLOAD, out, err);
    if (st == KVGEN_OK) st = kvg_vk_upload(vm->ctx, out, 0, v, (size_t)padded * 4, err);
    kvg_free(v);
    return st;
}
