/* qdot_internal.h: what the cpu backend's dot-product files share (private to qdot_*.c): the
 * weight types' block layouts decoded to integer levels, the layouts of the row groups, and the
 * kernels each file defines for the tables of qdot_tables.c. Kernels: qdot_portable.c (portable
 * C, the 8-bit row kernels, repacking and group packing, the activations' quantization),
 * qdot_x86.c (AVX2, AVX-512, VNNI), qdot_arm.c (neon, dotprod), qdot_tables.c (the tables and
 * the choice of a kernel per path), for every type of quant.c's traits table.
 *
 * Each weight type is decoded per block into small signed integer levels with integer
 * (sub-)block scales, so that a block's dot product with the int16 activations is an exact
 * integer sum, scaled once in f32:
 *   32-element types: x[i] = dw * v[i] + m, dot(x, a) = dw * da * sum(v q) + m * s with
 *     s = da * sum(q): Q4_0 v = nibble - 8; Q4_1 v = nibble, m = its min; Q5_0 v = 5 bits - 16;
 *     Q5_1 v = 5 bits, m = its min; Q8_0 v = q; IQ4_NL v = its table value (m = 0 but for Q4_1
 *     and Q5_1).
 *   K types: x[e] = d * sc[j] * v[e] - dmin * mn[j] for sub-block j of 16 elements (types with
 *     sub-blocks of 32 repeat their scale), dot = d * dA * sum_j sc[j] sum(v q) - dmin * dA *
 *     sum_j mn[j] bsum[j]: Q2_K v = 2 bits; Q3_K v = 2 bits + 4 * high bit - 4; Q4_K, Q5_K 4
 *     and 5 bits; Q6_K v = 6 bits - 32; IQ4_XS v = table value; Q8_K v = q (mn = 0 but for
 *     Q2_K, Q4_K, Q5_K).
 * The weights' levels times their sub-block scales fit int16 (|v sc| <= 4096), so the x86
 * loops multiply int16 pairs with vpmaddwd: a lane sums at most 32 products of a K block
 * (< 2^31 with |q| <= 4095), or the 32 of one 32-element block.
 *
 * Rows of the 32-element types are regrouped once at load (kvg_qdot_kernel.repack, same size):
 * every block's quants first, then Q5's high bits, then the f16 scales, then the f16 mins, so
 * that the scales of 8 consecutive blocks are one 16-byte load. The K types and the float types
 * are used as the file stores them, but on the paths with row groups, which pack a matrix of a
 * multiple of 16 rows into groups of 16 rows (below, the same layout on every path): the
 * avx512vnni, neon and dotprod paths the 32-element types and the K types but Q8_K; the avx2,
 * avx512 and avxvnni paths the K types but Q8_K (and, but on avxvnni, IQ4_XS).
 *
 * Inner loops per instruction set: portable C (the levels decoded to arrays); AVX2 (a 32-element
 * block or K group as two registers of 16 int16; the 32-element types reduce the 8 lanes of 8
 * consecutive blocks with one tree of vphaddd and scale them with one vector of the 8 blocks'
 * scales, the last nb % 8 blocks one by one; the K types scale once per 256); AVX-512 (a
 * 32-element block per register, vpdpwssd where the CPU has VNNI; the K types run the AVX2
 * loops); neon and dotprod (levels as int8, widening multiply-adds or SDOT, qdot_arm.c). One
 * kernel serves up to KVG_QDOT_TILE activation rows, each weight block decoded once for all of
 * them; each row's sums are formed in the same order whatever their number. The group kernels
 * (one row per vector lane: vpdpbusd, vpmaddubsw, SDOT by element, widening multiplies) serve up
 * to KVG_GROUP_TILE rows of the byte activations and give the bits of the portable row kernels
 * of the same activations (qdot_portable.c), on every path. */
#ifndef KVG_QDOT_INTERNAL_H
#define KVG_QDOT_INTERNAL_H
#include <math.h>
#include <string.h>
#include "kvg_qdot.h"
#include "kvg_quant.h"

#define INL static inline __attribute__((always_inline))

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVG_X86 1
#include <immintrin.h>
#endif
#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define KVG_ARM 1
#include <arm_neon.h>
/* a function's own target: the library is built for the AArch64 baseline */
#ifdef __clang__
#define DOTPROD __attribute__((target("dotprod")))
#else
#define DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#endif

INL uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
INL uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
INL float rdf32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* IQ4_NL's and IQ4_XS's 16 levels */
static const int8_t IQ4_LEVELS[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* ---- the 32-element types ----------------------------------------------------------------- */

typedef enum b32_kind { B_Q4_0, B_Q4_1, B_Q5_0, B_Q5_1, B_Q8_0, B_IQ4_NL } b32_kind;

INL size_t b32_bytes(b32_kind k) {
    switch (k) {
    case B_Q4_0: return KVG_Q4_0_BYTES;
    case B_Q4_1: return KVG_Q4_1_BYTES;
    case B_Q5_0: return KVG_Q5_0_BYTES;
    case B_Q5_1: return KVG_Q5_1_BYTES;
    case B_Q8_0: return KVG_Q8_0_BYTES;
    default: return KVG_IQ4_NL_BYTES;
    }
}
INL bool b32_has_min(b32_kind k) { return k == B_Q4_1 || k == B_Q5_1; }
INL bool b32_has_qh(b32_kind k) { return k == B_Q5_0 || k == B_Q5_1; }
/* the quant bytes of a block: 16 bytes of nibbles, Q8_0's 32 int8 */
INL size_t b32_qbytes(b32_kind k) { return k == B_Q8_0 ? 32 : 16; }
/* where the file's block keeps its fields: the quants, the 32 high bits, the min (d is at 0) */
INL size_t b32_file_qs(b32_kind k) { return k == B_Q4_1 ? 4 : k == B_Q5_0 ? 6 : k == B_Q5_1 ? 8 : 2; }

/* A row of nb blocks as the kernels keep it (see the top): quants, high bits, d, m. */
typedef struct b32_row {
    const uint8_t *qs, *qh, *d, *m;
} b32_row;

INL b32_row b32_row_of(b32_kind k, const uint8_t *w, int nb) {
    b32_row r;
    r.qs = w;
    r.qh = w + b32_qbytes(k) * (size_t)nb;
    r.d = r.qh + (b32_has_qh(k) ? 4 * (size_t)nb : 0);
    r.m = r.d + 2 * (size_t)nb;
    return r;
}

/* the file's row (n elements) into the kernels' layout */
INL void b32_repack(b32_kind k, const uint8_t *src, uint8_t *dst, int n) {
    int nb = n / KVG_QB;
    size_t bb = b32_bytes(k), qb = b32_qbytes(k), fq = b32_file_qs(k);
    b32_row r = b32_row_of(k, dst, nb);
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = src + bb * (size_t)b;
        memcpy((uint8_t *)r.qs + qb * (size_t)b, blk + fq, qb);
        if (b32_has_qh(k)) memcpy((uint8_t *)r.qh + 4 * (size_t)b, blk + fq - 4, 4);
        memcpy((uint8_t *)r.d + 2 * (size_t)b, blk, 2);
        if (b32_has_min(k)) memcpy((uint8_t *)r.m + 2 * (size_t)b, blk + 2, 2);
    }
}
/* what the types subtract from their unsigned levels */
INL int b32_offset(b32_kind k) { return k == B_Q4_0 ? 8 : k == B_Q5_0 ? 16 : 0; }

/* portable: the levels v[32] of block b (see the top) */
INL void b32_levels(b32_kind k, const b32_row *r, int b, int *v) {
    const uint8_t *qs = r->qs + b32_qbytes(k) * (size_t)b;
    if (k == B_Q8_0) {
        for (int i = 0; i < 32; i++) v[i] = (int8_t)qs[i];
        return;
    }
    uint32_t qh = b32_has_qh(k) ? rd32(r->qh + 4 * (size_t)b) : 0;
    for (int i = 0; i < 16; i++) {
        int lo = qs[i] & 15, hi = qs[i] >> 4;
        if (k == B_IQ4_NL) {
            v[i] = IQ4_LEVELS[lo];
            v[i + 16] = IQ4_LEVELS[hi];
        } else {
            v[i] = (lo | (int)((qh >> i) & 1) << 4) - b32_offset(k);
            v[i + 16] = (hi | (int)((qh >> (i + 16)) & 1) << 4) - b32_offset(k);
        }
    }
}


INL int b32_uoffset(b32_kind k) {
    return k == B_Q4_0 ? 8 : k == B_Q5_0 ? 16 : (k == B_Q8_0 || k == B_IQ4_NL) ? 128 : 0;
}


/* A group of KVG_QDOT_GROUP rows, block by block; block b of the group holds:
 *   4-bit types (Q4_0, Q4_1, IQ4_NL, and Q5's low bits): 4 chunks of 64 bytes; byte 4i + e of
 *     chunk c holds, of row i, element 4c + e of the block in its low nibble and element
 *     4(c + 4) + e in its high nibble (the raw nibble; IQ4_NL's is its table index);
 *   Q5_0, Q5_1: then 64 bytes of fifth bits: bit j of byte 4i + e is that of element 4j + e of row i;
 *   Q8_0: 8 chunks of 64 bytes, byte 4i + e of chunk j is u of element 4j + e of row i;
 *   then the rows' 16 f16 dw, then (Q4_1, Q5_1) their 16 f16 mins.
 * A lane (4 bytes) of chunk j is thus the 4 consecutive elements of one row that one vpdpbusd
 * lane multiplies with 4 activation bytes broadcast to every lane. Same size as the rows. */
INL size_t b32_group_block(b32_kind k) { return KVG_QDOT_GROUP * b32_bytes(k); }

/* ---- the K types ---------------------------------------------------------------------------- */

typedef enum kq_kind { K_Q2, K_Q3, K_Q4, K_Q5, K_Q6, K_IQ4XS, K_Q8 } kq_kind;

INL size_t kq_bytes(kq_kind k) {
    static const size_t bytes[] = {KVG_Q2_K_BYTES, KVG_Q3_K_BYTES, KVG_Q4_K_BYTES, KVG_Q5_K_BYTES,
                                   KVG_Q6_K_BYTES, KVG_IQ4_XS_BYTES, KVG_Q8_K_BYTES};
    return bytes[k];
}
INL bool kq_has_min(kq_kind k) { return k == K_Q2 || k == K_Q4 || k == K_Q5; }

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j of 32 */
INL void k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* A K block's d and dmin as f16 bits (Q8_K's f32 d: kq_d32), and its per-16 integer scales
 * and mins (see the top). */
INL void kq_header(kq_kind k, const uint8_t *b, uint16_t *dh, uint16_t *mh, int *sc, int *mn) {
    *dh = *mh = 0;
    for (int j = 0; j < 16; j++) mn[j] = 0;
    switch (k) {
    case K_Q2:
        *dh = rd16(b + 80);
        *mh = rd16(b + 82);
        for (int j = 0; j < 16; j++) {
            sc[j] = b[j] & 15;
            mn[j] = b[j] >> 4;
        }
        break;
    case K_Q3: {
        *dh = rd16(b + 108);
        const uint8_t *s = b + 96;
        for (int j = 0; j < 16; j++) {
            int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
            sc[j] = (lo | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
        }
        break;
    }
    case K_Q4:
    case K_Q5:
        *dh = rd16(b);
        *mh = rd16(b + 2);
        for (int j = 0; j < 8; j++) {
            k_scale_min(b + 4, j, &sc[2 * j], &mn[2 * j]);
            sc[2 * j + 1] = sc[2 * j];
            mn[2 * j + 1] = mn[2 * j];
        }
        break;
    case K_Q6:
        *dh = rd16(b + 208);
        for (int j = 0; j < 16; j++) sc[j] = (int8_t)b[192 + j];
        break;
    case K_IQ4XS:
        *dh = rd16(b);
        for (int j = 0; j < 8; j++) {
            int u = ((b[4 + j / 2] >> (4 * (j % 2))) & 15) | ((rd16(b + 2) >> (2 * j)) & 3) << 4;
            sc[2 * j] = sc[2 * j + 1] = u - 32;
        }
        break;
    case K_Q8:
        for (int j = 0; j < 16; j++) sc[j] = 1;
        break;
    }
}
INL float kq_d32(const uint8_t *b) { return rdf32(b); } /* Q8_K's d */

/* portable: the 256 levels of a K block, in element order */
INL void kq_levels(kq_kind k, const uint8_t *b, int *v) {
    for (int e = 0; e < KVG_QK; e++) {
        int h = e / 128, s = (e / 32) % 4, l = e % 32, g = e / 32;
        int x;
        switch (k) {
        case K_Q2: x = (b[16 + 32 * h + l] >> (2 * s)) & 3; break;
        case K_Q3: x = (((b[32 + 32 * h + l] >> (2 * s)) & 3) | ((b[l] >> g) & 1) << 2) - 4; break;
        case K_Q4: x = (b[16 + 32 * (g / 2) + l] >> (4 * (g % 2))) & 15; break;
        case K_Q5: x = ((b[48 + 32 * (g / 2) + l] >> (4 * (g % 2))) & 15) | ((b[16 + l] >> g) & 1) << 4; break;
        case K_Q6: {
            int lo = (b[64 * h + e % 64] >> (4 * ((e % 128) / 64))) & 15;
            x = (lo | ((b[128 + 32 * h + l] >> (2 * s)) & 3) << 4) - 32;
            break;
        }
        case K_IQ4XS: {
            uint8_t q = b[8 + 16 * g + l % 16];
            x = IQ4_LEVELS[l < 16 ? q & 15 : q >> 4];
            break;
        }
        default: x = (int8_t)b[4 + e]; break; /* Q8_K */
        }
        v[e] = x;
    }
}

/* ---- f32, f16 and bf16 weights: f32 activations ---------------------------------------------- */

typedef enum fl_kind { F_F32, F_F16, F_BF16 } fl_kind;

INL float fl_at(fl_kind k, const uint8_t *w, int i) {
    if (k == F_F32) return rdf32(w + 4 * (size_t)i);
    uint16_t h = rd16(w + 2 * (size_t)i);
    return k == F_F16 ? kvg_f16_to_f32(h) : kvg_bf16_to_f32(h);
}

#define FL_LANES 8

/* ---- K types in row groups (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) ---------------------------------
 * Against the byte activations of the 32-element groups (Q8 or split QS blocks of 32: d, s = d *
 * sum(q)), a K block is 8 blocks of 32 with per-row f32 scales formed from its integer ones
 * (levels v as kq_levels, scales sc and mins mn as kq_header):
 *   Q4_K, Q5_K, IQ4_XS (a scale per 32; a min for Q4_K and Q5_K): per block of 32, in this order,
 *     acc = fma((float)sum(v q), (d * sc) * da, acc); acc = fma(-(dmin * mn), s, acc)
 *   Q2_K, Q3_K, Q6_K (a scale per 16; a min for Q2_K): per half h of the block,
 *     acc = fma((float)sum_h(v q), (d * sc_h) * da, acc);
 *     acc = fma(-(dmin * mn_h), da * (float)sum_h(q), acc)
 * (d * sc and dmin * mn are exact in f32: an f16 times an integer of at most 8 bits). The x86
 * group kernels multiply unsigned levels u = v + offset (Q3_K 4, Q6_K 32, IQ4_XS 128) with
 * vpdpbusd and subtract offset * sum(q) per 32 or 16, the AArch64 ones multiply the signed
 * levels v; integer sums are exact in every order, so the group kernel (one row per lane) gives
 * the bits of the row kernel below, which reads the file's rows (matrices whose rows do not fill
 * groups). With QS activations the blocks of 32 keep 15 bits
 * (finer than one scale per 256); with Q8 ones the arithmetic is that of ggml's 8-bit products,
 * with scales per 32. */
INL bool kg_per16(kq_kind k) { return k == K_Q2 || k == K_Q3 || k == K_Q6; }
INL int kg_uoffset(kq_kind k) { return k == K_Q3 ? 4 : k == K_Q6 ? 32 : k == K_IQ4XS ? 128 : 0; }

/* A group of KVG_QDOT_GROUP rows, K block by K block, the same size as the rows. K block b holds
 * its 8 blocks of 32, each as (element 4j + e of row i is in byte 4i + e of a chunk of 64):
 *   4-bit levels (Q4_K, Q5_K, Q6_K's low 4 bits, IQ4_XS's table index) as a 32-element group
 *     block holds them (b32_group_pack: chunk j % 4, low nibble for j < 4, else high), then
 *     Q5_K's 64 bytes of fifth bits (bit j), or Q6_K's two chunks of high pairs (chunk j / 4,
 *     bits 2(j % 4)..+1);
 *   2-bit levels (Q2_K, Q3_K's low 2 bits): chunk j / 4, bits 2(j % 4)..+1; then Q3_K's 64
 *     bytes of third bits (bit j);
 * then the 16 rows' scales, row i at byte i of each run of 16, and their f16 d (and dmin):
 *   Q4_K, Q5_K: a byte per block and row [8][16], the scale (6 bits) with the min's high 2 bits
 *     above it, so that a kernel forms a block's scales with a mask and a shift; the mins' low
 *     4 bits [4][16] (block 2p in the low nibble of byte 16p + i, 2p + 1 in the high one); d,
 *     dmin;
 *   IQ4_XS: the scales + 32 as Q4_K's (low 4 bits [4][16], a 16-bit word of high pairs per
 *     row), d;
 *   Q3_K: the scales + 32 per 16, low 4 bits [8][16] (sub-block 2p, 2p + 1 in byte 16p + i),
 *     a dword of high pairs per row (sub-block s at bit 2s), d;
 *   Q2_K: the file's scale bytes [16][16] (scale low, min high), d, dmin;
 *   Q6_K: the scales [16][16] int8, d. */
INL size_t kg_qblock(kq_kind k) {
    switch (k) {
    case K_Q2: return 128;
    case K_Q3: return 192;
    case K_Q5: return 320;
    case K_Q6: return 384;
    default: return 256;
    }
}
INL size_t kg_block(kq_kind k) { return KVG_QDOT_GROUP * kq_bytes(k); }
INL bool kg_2bit(kq_kind k) { return k == K_Q2 || k == K_Q3; }

/* ---- the kernels of the tables (qdot_tables.c) ------------------------------------------------
 * kvg_qdot_<path>_<type>: p portable; p8, ps the 8-bit and split 16-bit row kernels; x2 avx2; x5
 * avx512; xv avx512 with vpdpwssd; gv, gs the avx512vnni group kernels (8-bit, split); av, as the
 * avx2 group kernels (8-bit, split: the narrow types), yv, ys those of avxvnni; n neon; d dotprod;
 * nv, ns and dv, ds the neon and dotprod group kernels (8-bit, split); g5 the avx512 group
 * kernels of the float types. r: a 32-element type's
 * repacking; g, gb: a group's packing and its size. */
#define KVG_QDOT_DOT(name) void kvg_qdot_##name(const uint8_t *w, const kvg_qact *a, int t, int nt, float *out, size_t os);
#define KVG_QDOT_REPACK(name) void kvg_qdot_##name(const uint8_t *src, uint8_t *dst, int n);
#define KVG_QDOT_GROUP_PACK(name) void kvg_qdot_##name(const uint8_t *src, size_t row_bytes, uint8_t *dst, int n);
#define KVG_QDOT_GROUP_BYTES(name) size_t kvg_qdot_##name(int n);
/* X(p_type) for the types of each family */
#define KVG_QDOT_B32(X, p) X(p##_q4_0) X(p##_q4_1) X(p##_q5_0) X(p##_q5_1) X(p##_q8_0) X(p##_iq4_nl)
#define KVG_QDOT_KG(X, p) X(p##_q2_k) X(p##_q3_k) X(p##_q4_k) X(p##_q5_k) X(p##_q6_k) X(p##_iq4_xs)
#define KVG_QDOT_KQ(X, p) KVG_QDOT_KG(X, p) X(p##_q8_k)
/* the types whose levels vpmaddubsw takes whole (up to 63; not Q8_0, IQ4_NL, IQ4_XS): AVX2's
 * groups against split 16-bit activations */
#define KVG_QDOT_NARROW(X, p)                                                                          \
    X(p##_q4_0) X(p##_q4_1) X(p##_q5_0) X(p##_q5_1) X(p##_q2_k) X(p##_q3_k) X(p##_q4_k) X(p##_q5_k) X(p##_q6_k)
#define KVG_QDOT_FL(X, p) X(p##_f32) X(p##_f16) X(p##_bf16)
#define KVG_QDOT_GROUPED(X, p) KVG_QDOT_B32(X, p) KVG_QDOT_KG(X, p) /* the types with row groups */

KVG_QDOT_B32(KVG_QDOT_DOT, p) KVG_QDOT_KQ(KVG_QDOT_DOT, p) KVG_QDOT_FL(KVG_QDOT_DOT, p)
KVG_QDOT_B32(KVG_QDOT_REPACK, r)
KVG_QDOT_GROUPED(KVG_QDOT_DOT, p8) KVG_QDOT_GROUPED(KVG_QDOT_DOT, ps)
KVG_QDOT_GROUPED(KVG_QDOT_GROUP_PACK, g) KVG_QDOT_GROUPED(KVG_QDOT_GROUP_BYTES, gb)
void kvg_qdot_quant_qb_portable(const float *x, int n, int16_t *q, float *d, float *s);
void kvg_qdot_quant_qk_portable(const float *x, int n, int16_t *q, float *d, int32_t *bsum);
void kvg_qdot_quant_q8_portable(const float *x, int n, int8_t *lo, int8_t *hi, float *d, float *s);
#ifdef KVG_X86
KVG_QDOT_B32(KVG_QDOT_DOT, x2) KVG_QDOT_KQ(KVG_QDOT_DOT, x2) KVG_QDOT_FL(KVG_QDOT_DOT, x2)
KVG_QDOT_B32(KVG_QDOT_DOT, x5) KVG_QDOT_FL(KVG_QDOT_DOT, x5) KVG_QDOT_B32(KVG_QDOT_DOT, xv)
KVG_QDOT_FL(KVG_QDOT_DOT, g5) KVG_QDOT_FL(KVG_QDOT_GROUP_PACK, g) KVG_QDOT_FL(KVG_QDOT_GROUP_BYTES, gb)
KVG_QDOT_GROUPED(KVG_QDOT_DOT, gv) KVG_QDOT_GROUPED(KVG_QDOT_DOT, gs)
KVG_QDOT_GROUPED(KVG_QDOT_DOT, av) KVG_QDOT_NARROW(KVG_QDOT_DOT, as)
KVG_QDOT_GROUPED(KVG_QDOT_DOT, yv) KVG_QDOT_GROUPED(KVG_QDOT_DOT, ys)
void kvg_qdot_quant_qb_avx2(const float *x, int n, int16_t *q, float *d, float *s);
void kvg_qdot_quant_qk_avx2(const float *x, int n, int16_t *q, float *d, int32_t *bsum);
void kvg_qdot_quant_q8_avx512(const float *x, int n, int8_t *lo, int8_t *hi, float *d, float *s, int32_t *b16);
#endif
#ifdef KVG_ARM
KVG_QDOT_B32(KVG_QDOT_DOT, n) KVG_QDOT_KQ(KVG_QDOT_DOT, n) KVG_QDOT_FL(KVG_QDOT_DOT, n)
KVG_QDOT_B32(KVG_QDOT_DOT, d) KVG_QDOT_KQ(KVG_QDOT_DOT, d)
KVG_QDOT_GROUPED(KVG_QDOT_DOT, nv) KVG_QDOT_GROUPED(KVG_QDOT_DOT, ns)
KVG_QDOT_GROUPED(KVG_QDOT_DOT, dv) KVG_QDOT_GROUPED(KVG_QDOT_DOT, ds)
void kvg_qdot_quant_qb_neon(const float *x, int n, int16_t *q, float *d, float *s);
void kvg_qdot_quant_qk_neon(const float *x, int n, int16_t *q, float *d, int32_t *bsum);
void kvg_qdot_quant_q8_neon(const float *x, int n, int8_t *lo, int8_t *hi, float *d, float *s);
#endif

#endif
