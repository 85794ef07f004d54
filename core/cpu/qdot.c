/* qdot.c: dot products of packed weight rows with quantized activation rows, and the
 * activations' quantization (kvg_qdot.h), for every type of quant.c's traits table.
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
 * are used as the file stores them, but on the avx512vnni path, which packs the 32-element
 * types and Q4_K, Q5_K, Q6_K into groups of 16 rows (below).
 *
 * Inner loops per instruction set: portable C (the levels decoded to arrays); AVX2 (a 32-element
 * block or K group as two registers of 16 int16; the 32-element types reduce the 8 lanes of 8
 * consecutive blocks with one tree of vphaddd and scale them with one vector of the 8 blocks'
 * scales, the last nb % 8 blocks one by one; the K types scale once per 256); AVX-512 (a
 * 32-element block per register, vpdpwssd where the CPU has VNNI; the K types run the AVX2
 * loops). One kernel serves up to KVG_QDOT_TILE activation rows, each weight block decoded once
 * for all of them; each row's sums are formed in the same order whatever their number. */
#include <math.h>
#include <string.h>
#include "kvg_qdot.h"
#include "kvg_quant.h"

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

#define INL static inline __attribute__((always_inline))

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static float rdf32(const uint8_t *p) {
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
    case B_Q4_0: return 18;
    case B_Q4_1: return 20;
    case B_Q5_0: return 22;
    case B_Q5_1: return 24;
    case B_Q8_0: return 34;
    default: return 18; /* IQ4_NL */
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

INL void b32_portable(b32_kind k, const uint8_t *w, const kvg_qact *a, int t, int nt, float *out, size_t os) {
    const int n = a->n, nb = n / KVG_QB;
    const b32_row r = b32_row_of(k, w, nb);
    float acc[KVG_QDOT_TILE] = {0}, mins[KVG_QDOT_TILE] = {0};
    int v[32];
    for (int b = 0; b < nb; b++) {
        float dw = kvg_f16_to_f32(rd16(r.d + 2 * (size_t)b));
        float m = b32_has_min(k) ? kvg_f16_to_f32(rd16(r.m + 2 * (size_t)b)) : 0.0f;
        b32_levels(k, &r, b, v);
        for (int i = 0; i < nt; i++) {
            size_t row = (size_t)(t + i);
            const int16_t *q = a->qb + row * (size_t)n + (size_t)KVG_QB * b;
            int32_t isum = 0;
            for (int e = 0; e < 32; e++) isum += v[e] * q[e];
            acc[i] += dw * a->db[row * nb + b] * (float)isum;
            if (b32_has_min(k)) mins[i] += m * a->sb[row * nb + b];
        }
    }
    for (int i = 0; i < nt; i++) out[i * os] = acc[i] + mins[i];
}

/* ---- the K types ---------------------------------------------------------------------------- */

typedef enum kq_kind { K_Q2, K_Q3, K_Q4, K_Q5, K_Q6, K_IQ4XS, K_Q8 } kq_kind;

INL size_t kq_bytes(kq_kind k) {
    static const size_t bytes[] = {84, 110, 144, 176, 210, 136, 292};
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

INL void kq_portable(kq_kind k, const uint8_t *w, const kvg_qact *a, int t, int nt, float *out, size_t os) {
    const int n = a->n, nb = n / KVG_QK;
    float acc[KVG_QDOT_TILE] = {0}, mins[KVG_QDOT_TILE] = {0};
    int v[KVG_QK], sc[16], mn[16];
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + kq_bytes(k) * (size_t)b;
        uint16_t dh, mh;
        kq_header(k, blk, &dh, &mh, sc, mn);
        float d = k == K_Q8 ? kq_d32(blk) : kvg_f16_to_f32(dh), dmin = kvg_f16_to_f32(mh);
        kq_levels(k, blk, v);
        for (int i = 0; i < nt; i++) {
            size_t row = (size_t)(t + i);
            const int16_t *q = a->qk + row * (size_t)n + (size_t)KVG_QK * b;
            const int32_t *bs = a->bk + row * (size_t)(n / 16) + 16 * (size_t)b;
            int64_t isum = 0;
            int32_t msum = 0;
            for (int j = 0; j < 16; j++) {
                int32_t s = 0;
                for (int e = 0; e < 16; e++) s += v[16 * j + e] * q[16 * j + e];
                isum += (int64_t)sc[j] * s;
                msum += mn[j] * bs[j];
            }
            float da = a->dk[row * nb + b];
            acc[i] += d * da * (float)isum;
            if (kq_has_min(k)) mins[i] += dmin * da * (float)msum;
        }
    }
    for (int i = 0; i < nt; i++) out[i * os] = acc[i] - mins[i];
}

/* ---- f32, f16 and bf16 weights: f32 activations ---------------------------------------------- */

typedef enum fl_kind { F_F32, F_F16, F_BF16 } fl_kind;

INL float fl_at(fl_kind k, const uint8_t *w, int i) {
    if (k == F_F32) return rdf32(w + 4 * (size_t)i);
    uint16_t h = rd16(w + 2 * (size_t)i);
    return k == F_F16 ? kvg_f16_to_f32(h) : kvg_bf16_to_f32(h);
}

#define FL_LANES 8
INL void fl_portable(fl_kind k, const uint8_t *w, const kvg_qact *a, int t, int nt, float *out, size_t os) {
    const int n = a->n;
    float acc[KVG_QDOT_TILE][FL_LANES] = {{0}};
    float wv[FL_LANES];
    int i = 0;
    for (; i + FL_LANES <= n; i += FL_LANES) {
        for (int l = 0; l < FL_LANES; l++) wv[l] = fl_at(k, w, i + l);
        for (int r = 0; r < nt; r++) {
            const float *x = a->x + (size_t)(t + r) * n + i;
            for (int l = 0; l < FL_LANES; l++) acc[r][l] += wv[l] * x[l];
        }
    }
    for (int r = 0; r < nt; r++) {
        const float *x = a->x + (size_t)(t + r) * n;
        float s = 0.0f;
        for (int l = 0; l < FL_LANES; l++) s += acc[r][l];
        for (int e = i; e < n; e++) s += fl_at(k, w, e) * x[e];
        out[r * os] = s;
    }
}

#define PORTABLE_KERNEL(name, body, kind)                                                               \
    static void name(const uint8_t *w, const kvg_qact *a, int t, int nt, float *out, size_t os) {       \
        body(kind, w, a, t, nt, out, os);                                                               \
    }
PORTABLE_KERNEL(p_q4_0, b32_portable, B_Q4_0)
PORTABLE_KERNEL(p_q4_1, b32_portable, B_Q4_1)
PORTABLE_KERNEL(p_q5_0, b32_portable, B_Q5_0)
PORTABLE_KERNEL(p_q5_1, b32_portable, B_Q5_1)
PORTABLE_KERNEL(p_q8_0, b32_portable, B_Q8_0)
PORTABLE_KERNEL(p_iq4_nl, b32_portable, B_IQ4_NL)
PORTABLE_KERNEL(p_q2_k, kq_portable, K_Q2)
PORTABLE_KERNEL(p_q3_k, kq_portable, K_Q3)
PORTABLE_KERNEL(p_q4_k, kq_portable, K_Q4)
PORTABLE_KERNEL(p_q5_k, kq_portable, K_Q5)
PORTABLE_KERNEL(p_q6_k, kq_portable, K_Q6)
PORTABLE_KERNEL(p_iq4_xs, kq_portable, K_IQ4XS)
PORTABLE_KERNEL(p_q8_k, kq_portable, K_Q8)
PORTABLE_KERNEL(p_f32, fl_portable, F_F32)
PORTABLE_KERNEL(p_f16, fl_portable, F_F16)
PORTABLE_KERNEL(p_bf16, fl_portable, F_BF16)

/* ---- activation quantization ------------------------------------------------------------------- */

/* q = x * (L / amax) rounded to nearest (ties to even, as the vector conversions do) and clamped
 * to [-L, L], so the activations are the same bytes on every path */
static int16_t q16_of(float v, float lim) {
    v = nearbyintf(v);
    v = fmaxf(v, -lim); /* also NaN */
    v = fminf(v, lim);
    return (int16_t)(int)v;
}

/* a block of len values with one scale; returns sum(q) */
static int32_t q16_block_portable(const float *x, int len, int levels, int16_t *q, float *d) {
    float amax = 0.0f;
    for (int i = 0; i < len; i++) amax = fmaxf(amax, fabsf(x[i]));
    float id = amax > 0.0f ? (float)levels / amax : 0.0f;
    *d = amax / (float)levels;
    int32_t sum = 0;
    for (int i = 0; i < len; i++) {
        q[i] = q16_of(x[i] * id, (float)levels);
        sum += q[i];
    }
    return sum;
}

static void quant_qb_portable(const float *x, int n, int16_t *q, float *d, float *s) {
    for (int b = 0; b < n / KVG_QB; b++) {
        int32_t sum = q16_block_portable(x + KVG_QB * b, KVG_QB, KVG_QB_LEVELS, q + KVG_QB * b, &d[b]);
        s[b] = d[b] * (float)sum;
    }
}

static void quant_qk_portable(const float *x, int n, int16_t *q, float *d, int32_t *bsum) {
    for (int b = 0; b < n / KVG_QK; b++) {
        int16_t *qb = q + KVG_QK * b;
        q16_block_portable(x + KVG_QK * b, KVG_QK, KVG_QK_LEVELS, qb, &d[b]);
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int i = 0; i < 16; i++) s += qb[16 * j + i];
            bsum[16 * b + j] = s;
        }
    }
}

/* ---- 8-bit activations and row groups (the avx512vnni path's 32-element types) --------------------
 * With int8 activations a block's products are those of unsigned weight levels u in [0, 255]
 * with signed bytes (the operands of VNNI's vpdpbusd): x = dw * u + m', where Q4_0 u = nibble,
 * m' = -8 dw; Q4_1 u = nibble, m' = its min; Q5_0 u = 5 bits, m' = -16 dw; Q5_1 u = 5 bits, m' =
 * its min; Q8_0 u = q + 128, m' = -128 dw; IQ4_NL u = its level + 128, m' = -128 dw. Per block,
 * in this order (fused multiply-adds, as the vector loop):
 *   acc = fma((float)sum(u q), dw * da, acc); acc = fma(m', s, acc)   with s = da * sum(q)
 * so the group kernel (one row per lane) gives these bits exactly. */

/* a * b + c rounded once, as the vector loops' fused multiply-add, without the C library's fmaf
 * (some libraries compute it with two roundings): the product is exact in double; the sum is
 * rounded to odd (Boldo and Melquiond: nearest, then the last bit set where inexact) so that its
 * rounding to float is the correctly rounded result. Finite operands. */
static float fma_exact(float a, float b, float c) {
    double p = (double)a * (double)b, cd = (double)c;
    double sum = p + cd, bv = sum - p;
    double err = (p - (sum - bv)) + (cd - bv); /* p + c = sum + err exactly */
    if (err != 0.0) {
        uint64_t bits;
        memcpy(&bits, &sum, sizeof bits);
        if ((bits & 1) == 0) bits += (err > 0) == (sum > 0) ? 1 : (uint64_t)-1; /* toward the exact value */
        memcpy(&sum, &bits, sizeof bits);
    }
    return (float)sum;
}

INL int b32_uoffset(b32_kind k) {
    return k == B_Q4_0 ? 8 : k == B_Q5_0 ? 16 : (k == B_Q8_0 || k == B_IQ4_NL) ? 128 : 0;
}

/* the unsigned levels u[32] of block b of a repacked row */
INL void b32_ulevels(b32_kind k, const b32_row *r, int b, int *u) {
    int v[32];
    b32_levels(k, r, b, v);
    for (int i = 0; i < 32; i++) u[i] = v[i] + b32_uoffset(k); /* v = u - the offset */
}

INL float b32_mprime(b32_kind k, float dw, float m) {
    return b32_has_min(k) ? m : dw * (float)-b32_uoffset(k);
}

/* one repacked row against Q8 activations, or QS ones (split: q = 256 hi + lo), used where a
 * matrix's rows do not fill groups */
INL void b32_q8_portable(b32_kind k, bool split, const uint8_t *w, const kvg_qact *a, int t, int nt, float *out,
                         size_t os) {
    const int n = a->n, nb = n / KVG_QB;
    const b32_row r = b32_row_of(k, w, nb);
    const int8_t *lo = a->q8;
    const float *da = a->d8, *sa = a->s8;
    float acc[KVG_QDOT_TILE] = {0};
    int u[32];
    for (int b = 0; b < nb; b++) {
        float dw = kvg_f16_to_f32(rd16(r.d + 2 * (size_t)b));
        float m = b32_mprime(k, dw, b32_has_min(k) ? kvg_f16_to_f32(rd16(r.m + 2 * (size_t)b)) : 0.0f);
        b32_ulevels(k, &r, b, u);
        for (int i = 0; i < nt; i++) {
            size_t row = (size_t)(t + i), at = row * (size_t)n + (size_t)KVG_QB * b;
            int32_t isum = 0;
            for (int e = 0; e < 32; e++) isum += u[e] * (lo[at + e] + (split ? 256 * a->q8h[at + e] : 0));
            acc[i] = fma_exact((float)isum, dw * da[row * nb + b], acc[i]);
            acc[i] = fma_exact(m, sa[row * nb + b], acc[i]);
        }
    }
    for (int i = 0; i < nt; i++) out[i * os] = acc[i];
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

INL void b32_group_pack(b32_kind k, const uint8_t *src, size_t row_bytes, uint8_t *dst, int n) {
    const int nb = n / KVG_QB, G = KVG_QDOT_GROUP;
    const size_t qbytes = k == B_Q8_0 ? 512 : b32_has_qh(k) ? 320 : 256;
    for (int b = 0; b < nb; b++) {
        uint8_t *blk = dst + b32_group_block(k) * (size_t)b;
        memset(blk, 0, b32_group_block(k));
        for (int i = 0; i < G; i++) {
            const uint8_t *fb = src + row_bytes * (size_t)i + b32_bytes(k) * (size_t)b; /* the file's block */
            const uint8_t *qs = fb + b32_file_qs(k);
            uint32_t qh = b32_has_qh(k) ? rd32(fb + b32_file_qs(k) - 4) : 0;
            for (int e = 0; e < 32; e++) {
                int j = e / 4, c = e % 4, byte = 4 * i + c;
                if (k == B_Q8_0) {
                    blk[64 * j + byte] = (uint8_t)((int)(int8_t)qs[e] + 128);
                    continue;
                }
                int nib = e < 16 ? qs[e] & 15 : qs[e - 16] >> 4;
                blk[64 * (j % 4) + byte] |= (uint8_t)(nib << (j < 4 ? 0 : 4));
                if (b32_has_qh(k)) blk[256 + byte] |= (uint8_t)(((qh >> e) & 1) << j);
            }
            memcpy(blk + qbytes + 2 * (size_t)i, fb, 2); /* dw */
            if (b32_has_min(k)) memcpy(blk + qbytes + 32 + 2 * (size_t)i, fb + 2, 2);
        }
    }
}

/* Q8 (hi == NULL): q in [-127, 127]; QS: q in [-16383, 16383], stored as lo = q's low byte
 * (signed) and hi = (q - lo) / 256 */
static void quant_q8_portable(const float *x, int n, int8_t *lo, int8_t *hi, float *d, float *s) {
    const int levels = hi ? KVG_QS_LEVELS : KVG_Q8_LEVELS;
    for (int b = 0; b < n / KVG_QB; b++) {
        const float *xb = x + KVG_QB * b;
        float amax = 0.0f;
        for (int i = 0; i < KVG_QB; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float id = amax > 0.0f ? (float)levels / amax : 0.0f;
        d[b] = amax / (float)levels;
        int32_t sum = 0;
        for (int i = 0; i < KVG_QB; i++) {
            int q = q16_of(xb[i] * id, (float)levels);
            int l = (int)(int8_t)(uint8_t)(q & 255);
            lo[KVG_QB * b + i] = (int8_t)l;
            if (hi) hi[KVG_QB * b + i] = (int8_t)((q - l) / 256);
            sum += q;
        }
        s[b] = d[b] * (float)sum;
    }
}

/* the tables of the paths with group kernels use these (x86-64 only, so far) */
#define PORTABLE_KERNEL8(name, kind, split)                                                             \
    __attribute__((unused)) static void name(const uint8_t *w, const kvg_qact *a, int t, int nt, float *out, size_t os) {       \
        b32_q8_portable(kind, split, w, a, t, nt, out, os);                                             \
    }
PORTABLE_KERNEL8(p8_q4_0, B_Q4_0, false)
PORTABLE_KERNEL8(p8_q4_1, B_Q4_1, false)
PORTABLE_KERNEL8(p8_q5_0, B_Q5_0, false)
PORTABLE_KERNEL8(p8_q5_1, B_Q5_1, false)
PORTABLE_KERNEL8(p8_q8_0, B_Q8_0, false)
PORTABLE_KERNEL8(p8_iq4_nl, B_IQ4_NL, false)
PORTABLE_KERNEL8(ps_q4_0, B_Q4_0, true)
PORTABLE_KERNEL8(ps_q4_1, B_Q4_1, true)
PORTABLE_KERNEL8(ps_q5_0, B_Q5_0, true)
PORTABLE_KERNEL8(ps_q5_1, B_Q5_1, true)
PORTABLE_KERNEL8(ps_q8_0, B_Q8_0, true)
PORTABLE_KERNEL8(ps_iq4_nl, B_IQ4_NL, true)

#define GROUP_PACK(name, bytes_name, kind)                                                       \
    __attribute__((unused)) static void name(const uint8_t *src, size_t row_bytes, uint8_t *dst, int n) { \
        b32_group_pack(kind, src, row_bytes, dst, n);                                            \
    }                                                                                            \
    __attribute__((unused)) static size_t bytes_name(int n) { return b32_group_block(kind) * (size_t)(n / KVG_QB); }
GROUP_PACK(g_q4_0, gb_q4_0, B_Q4_0)
GROUP_PACK(g_q4_1, gb_q4_1, B_Q4_1)
GROUP_PACK(g_q5_0, gb_q5_0, B_Q5_0)
GROUP_PACK(g_q5_1, gb_q5_1, B_Q5_1)
GROUP_PACK(g_q8_0, gb_q8_0, B_Q8_0)
GROUP_PACK(g_iq4_nl, gb_iq4_nl, B_IQ4_NL)

/* ---- K types in row groups (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) ---------------------------------
 * Against the byte activations of the 32-element groups (Q8 or split QS blocks of 32: d, s = d *
 * sum(q)), a K block is 8 blocks of 32 with per-row f32 scales formed from its integer ones
 * (levels v as kq_levels, scales sc and mins mn as kq_header):
 *   Q4_K, Q5_K, IQ4_XS (a scale per 32; a min for Q4_K and Q5_K): per block of 32, in this order,
 *     acc = fma((float)sum(v q), (d * sc) * da, acc); acc = fma(-(dmin * mn), s, acc)
 *   Q2_K, Q3_K, Q6_K (a scale per 16; a min for Q2_K): per half h of the block,
 *     acc = fma((float)sum_h(v q), (d * sc_h) * da, acc);
 *     acc = fma(-(dmin * mn_h), da * (float)sum_h(q), acc)
 * (d * sc and dmin * mn are exact in f32: an f16 times an integer of at most 8 bits). The group
 * kernels multiply unsigned levels u = v + offset (Q3_K 4, Q6_K 32, IQ4_XS 128) with vpdpbusd
 * and subtract offset * sum(q) per 32 or 16; integer sums are exact in every order, so the group
 * kernel (one row per lane) gives the bits of the row kernel below, which reads the file's rows
 * (matrices whose rows do not fill groups). With QS activations the blocks of 32 keep 15 bits
 * (finer than one scale per 256); with Q8 ones the arithmetic is that of ggml's 8-bit products,
 * with scales per 32. */
INL bool kg_per16(kq_kind k) { return k == K_Q2 || k == K_Q3 || k == K_Q6; }
INL int kg_uoffset(kq_kind k) { return k == K_Q3 ? 4 : k == K_Q6 ? 32 : k == K_IQ4XS ? 128 : 0; }

INL void kq_q8_portable(kq_kind k, bool split, const uint8_t *w, const kvg_qact *a, int t, int nt, float *out,
                        size_t os) {
    const int n = a->n, nb = n / KVG_QK, n32 = n / KVG_QB;
    float acc[KVG_QDOT_TILE] = {0};
    int v[KVG_QK], sc[16], mn[16];
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + kq_bytes(k) * (size_t)b;
        uint16_t dh, mh;
        kq_header(k, blk, &dh, &mh, sc, mn);
        float d = kvg_f16_to_f32(dh), dmin = kvg_f16_to_f32(mh);
        kq_levels(k, blk, v);
        for (int j = 0; j < 8; j++) {
            for (int i = 0; i < nt; i++) {
                size_t row = (size_t)(t + i), at = row * (size_t)n + (size_t)KVG_QK * b + 32 * (size_t)j;
                size_t bi = row * (size_t)n32 + 8 * (size_t)b + (size_t)j;
                float da = a->d8[bi];
                int32_t half[2] = {0, 0}, qsum[2] = {0, 0};
                for (int e = 0; e < 32; e++) {
                    int q = a->q8[at + e] + (split ? 256 * a->q8h[at + e] : 0);
                    half[e / 16] += v[32 * j + e] * q;
                    qsum[e / 16] += q;
                }
                if (kg_per16(k)) {
                    for (int h = 0; h < 2; h++) {
                        acc[i] = fma_exact((float)half[h], (d * (float)sc[2 * j + h]) * da, acc[i]);
                        if (kq_has_min(k))
                            acc[i] = fma_exact(-(dmin * (float)mn[2 * j + h]), da * (float)qsum[h], acc[i]);
                    }
                } else {
                    acc[i] = fma_exact((float)(half[0] + half[1]), (d * (float)sc[2 * j]) * da, acc[i]);
                    if (kq_has_min(k)) acc[i] = fma_exact(-(dmin * (float)mn[2 * j]), a->s8[bi], acc[i]);
                }
            }
        }
    }
    for (int i = 0; i < nt; i++) out[i * os] = acc[i];
}

/* A group of KVG_QDOT_GROUP rows, K block by K block, the same size as the rows. K block b holds
 * its 8 blocks of 32, each as (element 4j + e of row i is in byte 4i + e of a chunk of 64):
 *   4-bit levels (Q4_K, Q5_K, Q6_K's low 4 bits, IQ4_XS's table index) as a 32-element group
 *     block holds them (b32_group_pack: chunk j % 4, low nibble for j < 4, else high), then
 *     Q5_K's 64 bytes of fifth bits (bit j), or Q6_K's two chunks of high pairs (chunk j / 4,
 *     bits 2(j % 4)..+1);
 *   2-bit levels (Q2_K, Q3_K's low 2 bits): chunk j / 4, bits 2(j % 4)..+1; then Q3_K's 64
 *     bytes of third bits (bit j);
 * then the 16 rows' scales, row i at byte i of each run of 16, and their f16 d (and dmin):
 *   Q4_K, Q5_K: the scales' low 4 bits [4][16] (block 2p in the low nibble of byte 16p + i,
 *     2p + 1 in the high one), the mins' the same, a dword per row of the high 2 bits (scale of
 *     block j at bit 2j, min at 16 + 2j), d, dmin;
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

INL void put16(uint8_t *p, unsigned v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

INL void kq_group_pack(kq_kind k, const uint8_t *src, size_t row_bytes, uint8_t *dst, int n) {
    const int nb = n / KVG_QK;
    int v[KVG_QK], sc[16], mn[16];
    for (int b = 0; b < nb; b++) {
        uint8_t *sb = dst + kg_block(k) * (size_t)b, *hdr = sb + 8 * kg_qblock(k);
        memset(sb, 0, kg_block(k));
        for (int i = 0; i < KVG_QDOT_GROUP; i++) {
            const uint8_t *fb = src + row_bytes * (size_t)i + kq_bytes(k) * (size_t)b;
            uint16_t dh, mh;
            kq_header(k, fb, &dh, &mh, sc, mn);
            kq_levels(k, fb, v);
            for (int e = 0; e < KVG_QK; e++) {
                int j = (e % 32) / 4, byte = 4 * i + e % 4, u = v[e] + kg_uoffset(k);
                uint8_t *qb = sb + kg_qblock(k) * (size_t)(e / 32);
                if (k == K_IQ4XS)
                    for (u = 0; u < 15 && IQ4_LEVELS[u] != v[e]; u++) continue; /* the table index */
                if (kg_2bit(k)) {
                    qb[64 * (j / 4) + byte] |= (uint8_t)((u & 3) << (2 * (j % 4)));
                    if (k == K_Q3) qb[128 + byte] |= (uint8_t)(((u >> 2) & 1) << j);
                    continue;
                }
                qb[64 * (j % 4) + byte] |= (uint8_t)((u & 15) << (j < 4 ? 0 : 4));
                if (k == K_Q5) qb[256 + byte] |= (uint8_t)(((u >> 4) & 1) << j);
                if (k == K_Q6) qb[256 + 64 * (j / 4) + byte] |= (uint8_t)(((u >> 4) & 3) << (2 * (j % 4)));
            }
            uint32_t high = 0;
            switch (k) {
            case K_Q2:
                for (int s = 0; s < 16; s++) hdr[16 * s + i] = (uint8_t)(sc[s] | mn[s] << 4);
                put16(hdr + 256 + 2 * i, dh);
                put16(hdr + 288 + 2 * i, mh);
                break;
            case K_Q3:
                for (int s = 0; s < 16; s++) {
                    hdr[16 * (s / 2) + i] |= (uint8_t)(((sc[s] + 32) & 15) << (4 * (s % 2)));
                    high |= (uint32_t)((sc[s] + 32) >> 4) << (2 * s);
                }
                for (int c = 0; c < 4; c++) hdr[128 + 4 * i + c] = (uint8_t)(high >> (8 * c));
                put16(hdr + 192 + 2 * i, dh);
                break;
            case K_Q6:
                for (int s = 0; s < 16; s++) hdr[16 * s + i] = (uint8_t)sc[s];
                put16(hdr + 256 + 2 * i, dh);
                break;
            case K_IQ4XS:
                for (int j = 0; j < 8; j++) {
                    hdr[16 * (j / 2) + i] |= (uint8_t)(((sc[2 * j] + 32) & 15) << (4 * (j % 2)));
                    high |= (uint32_t)((sc[2 * j] + 32) >> 4) << (2 * j);
                }
                put16(hdr + 64 + 2 * i, high);
                put16(hdr + 96 + 2 * i, dh);
                break;
            default: /* Q4_K, Q5_K */
                for (int j = 0; j < 8; j++) {
                    int s = sc[2 * j], m = mn[2 * j];
                    hdr[16 * (j / 2) + i] |= (uint8_t)((s & 15) << (4 * (j % 2)));
                    hdr[64 + 16 * (j / 2) + i] |= (uint8_t)((m & 15) << (4 * (j % 2)));
                    high |= (uint32_t)(s >> 4) << (2 * j) | (uint32_t)(m >> 4) << (16 + 2 * j);
                }
                for (int c = 0; c < 4; c++) hdr[128 + 4 * i + c] = (uint8_t)(high >> (8 * c));
                put16(hdr + 192 + 2 * i, dh);
                put16(hdr + 224 + 2 * i, mh);
                break;
            }
        }
    }
}

#define K_GROUP_ROWS(t, kind)                                                                                 \
    __attribute__((unused)) static void p8_##t(const uint8_t *w, const kvg_qact *a, int t0, int nt, float *out, \
                                               size_t os) {                                                   \
        kq_q8_portable(kind, false, w, a, t0, nt, out, os);                                                   \
    }                                                                                                         \
    __attribute__((unused)) static void ps_##t(const uint8_t *w, const kvg_qact *a, int t0, int nt, float *out, \
                                               size_t os) {                                                   \
        kq_q8_portable(kind, true, w, a, t0, nt, out, os);                                                    \
    }                                                                                                         \
    __attribute__((unused)) static void g_##t(const uint8_t *src, size_t row_bytes, uint8_t *dst, int n) {      \
        kq_group_pack(kind, src, row_bytes, dst, n);                                                          \
    }                                                                                                         \
    __attribute__((unused)) static size_t gb_##t(int n) { return kg_block(kind) * (size_t)(n / KVG_QK); }
K_GROUP_ROWS(q2_k, K_Q2)
K_GROUP_ROWS(q3_k, K_Q3)
K_GROUP_ROWS(q4_k, K_Q4)
K_GROUP_ROWS(q5_k, K_Q5)
K_GROUP_ROWS(q6_k, K_Q6)
K_GROUP_ROWS(iq4_xs, K_IQ4XS)

/* ================================================================================================
 * x86-64: AVX2 + FMA + F16C
 * ================================================================================================ */
#ifdef KVG_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 INL float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
AVX2 INL int32_t hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}
AVX2 INL __m256i ld16(const void *p) { return _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)); }
AVX2 INL __m256i ld16s(const void *p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p)); }
AVX2 INL __m256i srl16(__m256i x, int n) { return _mm256_srl_epi16(x, _mm_cvtsi32_si128(n)); }
/* 32 bytes: byte i is 0xff where bit i of v is set, else 0 */
AVX2 INL __m256i bits32(uint32_t v) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                            3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i x = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)v), spread), bit);
    return _mm256_cmpeq_epi8(x, bit);
}
/* table lookup of 16 nibbles (the low 4 bits of each byte of x) to IQ4 levels, as int16 */
AVX2 INL __m256i iq4_16(__m128i nib) {
    __m128i t = _mm_loadu_si128((const __m128i *)IQ4_LEVELS);
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(t, _mm_and_si128(nib, _mm_set1_epi8(15))));
}

/* block b's levels as int16: elements 0..15 in *lo, 16..31 in *hi */
AVX2 INL void b32_w16_avx2(b32_kind k, const b32_row *r, int b, __m256i *lo, __m256i *hi) {
    const uint8_t *qs = r->qs + b32_qbytes(k) * (size_t)b;
    if (k == B_Q8_0) {
        *lo = ld16s(qs);
        *hi = ld16s(qs + 16);
        return;
    }
    if (k == B_IQ4_NL) {
        __m128i x = _mm_loadu_si128((const __m128i *)qs);
        *lo = iq4_16(x);
        *hi = iq4_16(_mm_srli_epi16(x, 4));
        return;
    }
    if (b32_has_qh(k)) { /* as bytes, element order: the nibbles, the 5th bits, then widened */
        __m128i x = _mm_loadu_si128((const __m128i *)qs);
        __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), _mm256_set1_epi8(15));
        __m256i set = bits32(rd32(r->qh + 4 * (size_t)b));
        if (k == B_Q5_0) /* nibble + 16 * bit - 16 = nibble - 16 where the bit is clear */
            v = _mm256_sub_epi8(v, _mm256_andnot_si256(set, _mm256_set1_epi8(16)));
        else
            v = _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(16)));
        *lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
        *hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
        return;
    }
    __m256i x = ld16(qs);
    __m256i l = _mm256_and_si256(x, _mm256_set1_epi16(15)), h = _mm256_srli_epi16(x, 4);
    if (b32_offset(k)) {
        __m256i off = _mm256_set1_epi16((short)b32_offset(k));
        l = _mm256_sub_epi16(l, off);
        h = _mm256_sub_epi16(h, off);
    }
    *lo = l;
    *hi = h;
}

/* the products of block b with row t + i of the activations: 8 int32 lanes */
AVX2 INL __m256i b32_prod(const kvg_qact *a, size_t row, int b, __m256i lo, __m256i hi) {
    const int16_t *q = a->qb + row * (size_t)a->n + (size_t)KVG_QB * b;
    return _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)q)),
                            _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)(q + 16))));
}

/* Blocks b0..b0+3 (those below nb; the rest count as zero) against nt rows: for each row, the
 * lanes of each block's products folded so that lane j (and j + 4) sums to block b0 + j. */
/* Blocks b0..b0+3 against nt rows: for each row, the lanes of each block's products folded so
 * that lane j (and j + 4) sums to block b0 + j. */
AVX2 INL void b32_quad_avx2(b32_kind k, const b32_row *r, const kvg_qact *a, int t, const int nt, int b0,
                            __m256i *quad) {
    __m256i v[4][KVG_QDOT_TILE];
    for (int j = 0; j < 4; j++) {
        __m256i lo, hi;
        b32_w16_avx2(k, r, b0 + j, &lo, &hi);
        for (int i = 0; i < nt; i++) v[j][i] = b32_prod(a, (size_t)(t + i), b0 + j, lo, hi);
    }
    for (int i = 0; i < nt; i++)
        quad[i] = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0][i], v[1][i]), _mm256_hadd_epi32(v[2][i], v[3][i]));
}

/* Groups of 8 blocks: their sums reduced to one vector (lane j: block b0 + j), scaled by the
 * 8 blocks' dw (one 16-byte load of the repacked row) times the activations' d, plus m * s;
 * the last nb % 8 blocks one by one, each with its scale broadcast. */
AVX2 INL void b32_avx2(b32_kind k, const uint8_t *w, const kvg_qact *a, int t, const int nt, float *out, size_t os) {
    const int nb = a->n / KVG_QB;
    const b32_row r = b32_row_of(k, w, nb);
    __m256 acc[KVG_QDOT_TILE];
    float mins[KVG_QDOT_TILE];
    for (int i = 0; i < nt; i++) {
        acc[i] = _mm256_setzero_ps();
        mins[i] = 0.0f;
    }
    int b0 = 0;
    for (; b0 + 8 <= nb; b0 += 8) {
        __m256i q0[KVG_QDOT_TILE], q1[KVG_QDOT_TILE];
        b32_quad_avx2(k, &r, a, t, nt, b0, q0);
        b32_quad_avx2(k, &r, a, t, nt, b0 + 4, q1);
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r.d + 2 * (size_t)b0)));
        __m256 mw = b32_has_min(k) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r.m + 2 * (size_t)b0)))
                                   : _mm256_setzero_ps();
        for (int i = 0; i < nt; i++) {
            size_t row = (size_t)(t + i);
            __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(q0[i], q1[i], 0x20),
                                            _mm256_permute2x128_si256(q0[i], q1[i], 0x31));
            __m256 scale = _mm256_mul_ps(dw, _mm256_loadu_ps(a->db + row * nb + b0));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[i]);
            if (b32_has_min(k)) acc[i] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(a->sb + row * nb + b0), acc[i]);
        }
    }
    for (int b = b0; b < nb; b++) {
        __m256i lo, hi;
        b32_w16_avx2(k, &r, b, &lo, &hi);
        float dw = _cvtsh_ss(rd16(r.d + 2 * (size_t)b));
        float m = b32_has_min(k) ? _cvtsh_ss(rd16(r.m + 2 * (size_t)b)) : 0.0f;
        for (int i = 0; i < nt; i++) {
            size_t row = (size_t)(t + i);
            __m256 p = _mm256_cvtepi32_ps(b32_prod(a, row, b, lo, hi));
            acc[i] = _mm256_fmadd_ps(p, _mm256_set1_ps(dw * a->db[row * nb + b]), acc[i]);
            if (b32_has_min(k)) mins[i] += m * a->sb[row * nb + b];
        }
    }
    for (int i = 0; i < nt; i++) out[i * os] = hsum8(acc[i]) + mins[i];
}

/* group g (elements 32g..32g+31) of a K block as int16 levels: *lo 0..15, *hi 16..31 */
AVX2 INL void kq_w16_avx2(kq_kind k, const uint8_t *b, int g, __m256i *lo, __m256i *hi) {
    const __m256i m1 = _mm256_set1_epi16(1), m2 = _mm256_set1_epi16(3), m4 = _mm256_set1_epi16(15);
    int h = g / 4, s = g % 4;
    __m256i l, u;
    switch (k) {
    case K_Q2:
        l = _mm256_and_si256(srl16(ld16(b + 16 + 32 * h), 2 * s), m2);
        u = _mm256_and_si256(srl16(ld16(b + 32 + 32 * h), 2 * s), m2);
        break;
    case K_Q3: {
        const __m256i four = _mm256_set1_epi16(4);
        l = _mm256_and_si256(srl16(ld16(b + 32 + 32 * h), 2 * s), m2);
        u = _mm256_and_si256(srl16(ld16(b + 48 + 32 * h), 2 * s), m2);
        l = _mm256_or_si256(l, _mm256_slli_epi16(_mm256_and_si256(srl16(ld16(b), g), m1), 2));
        u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(srl16(ld16(b + 16), g), m1), 2));
        l = _mm256_sub_epi16(l, four);
        u = _mm256_sub_epi16(u, four);
        break;
    }
    case K_Q4:
    case K_Q5: {
        const uint8_t *q = b + (k == K_Q4 ? 16 : 48) + 32 * (g / 2);
        l = _mm256_and_si256(srl16(ld16(q), 4 * (g % 2)), m4);
        u = _mm256_and_si256(srl16(ld16(q + 16), 4 * (g % 2)), m4);
        if (k == K_Q5) {
            l = _mm256_or_si256(l, _mm256_slli_epi16(_mm256_and_si256(srl16(ld16(b + 16), g), m1), 4));
            u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(srl16(ld16(b + 32), g), m1), 4));
        }
        break;
    }
    case K_Q6: {
        const __m256i off = _mm256_set1_epi16(32);
        const uint8_t *ql = b + 64 * h + 32 * (s % 2), *qh = b + 128 + 32 * h;
        l = _mm256_and_si256(srl16(ld16(ql), 4 * (s / 2)), m4);
        u = _mm256_and_si256(srl16(ld16(ql + 16), 4 * (s / 2)), m4);
        l = _mm256_or_si256(l, _mm256_slli_epi16(_mm256_and_si256(srl16(ld16(qh), 2 * s), m2), 4));
        u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(srl16(ld16(qh + 16), 2 * s), m2), 4));
        l = _mm256_sub_epi16(l, off);
        u = _mm256_sub_epi16(u, off);
        break;
    }
    case K_IQ4XS: {
        __m128i x = _mm_loadu_si128((const __m128i *)(b + 8 + 16 * g));
        l = iq4_16(x);
        u = iq4_16(_mm_srli_epi16(x, 4));
        break;
    }
    default: /* Q8_K */
        l = ld16s(b + 4 + 32 * g);
        u = ld16s(b + 20 + 32 * g);
        break;
    }
    *lo = l;
    *hi = u;
}

AVX2 INL void kq_avx2(kq_kind k, const uint8_t *w, const kvg_qact *a, int t, const int nt, float *out, size_t os) {
    const int n = a->n, nb = n / KVG_QK;
    __m256 acc[KVG_QDOT_TILE];
    float mins[KVG_QDOT_TILE];
    for (int i = 0; i < nt; i++) {
        acc[i] = _mm256_setzero_ps();
        mins[i] = 0.0f;
    }
    int sc[16], mn[16];
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + kq_bytes(k) * (size_t)b;
        uint16_t dh, mh;
        kq_header(k, blk, &dh, &mh, sc, mn);
        float d = k == K_Q8 ? kq_d32(blk) : _cvtsh_ss(dh), dmin = _cvtsh_ss(mh);
        __m256i isum[KVG_QDOT_TILE];
        for (int i = 0; i < nt; i++) isum[i] = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            __m256i lo, hi;
            kq_w16_avx2(k, blk, g, &lo, &hi);
            lo = _mm256_mullo_epi16(lo, _mm256_set1_epi16((short)sc[2 * g]));
            hi = _mm256_mullo_epi16(hi, _mm256_set1_epi16((short)sc[2 * g + 1]));
            for (int i = 0; i < nt; i++) {
                const int16_t *q = a->qk + (size_t)(t + i) * (size_t)n + (size_t)KVG_QK * b + 32 * (size_t)g;
                __m256i p = _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)q)),
                                             _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)(q + 16))));
                isum[i] = _mm256_add_epi32(isum[i], p);
            }
        }
        for (int i = 0; i < nt; i++) {
            size_t row = (size_t)(t + i);
            float da = a->dk[row * nb + b];
            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * da), _mm256_cvtepi32_ps(isum[i]), acc[i]);
            if (kq_has_min(k)) {
                const int32_t *bs = a->bk + row * (size_t)(n / 16) + 16 * (size_t)b;
                int32_t msum = 0;
                for (int j = 0; j < 16; j++) msum += mn[j] * bs[j];
                mins[i] += dmin * da * (float)msum;
            }
        }
    }
    for (int i = 0; i < nt; i++) out[i * os] = hsum8(acc[i]) - mins[i];
}

AVX2 INL __m256 fl_load_avx2(fl_kind k, const uint8_t *w, int i) {
    if (k == F_F32) return _mm256_loadu_ps((const float *)(const void *)(w + 4 * (size_t)i));
    __m128i h = _mm_loadu_si128((const __m128i *)(w + 2 * (size_t)i));
    if (k == F_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
AVX2 INL float fl_scalar_avx2(fl_kind k, const uint8_t *w, int i) {
    if (k == F_F16) return _cvtsh_ss(rd16(w + 2 * (size_t)i));
    return fl_at(k, w, i);
}

AVX2 INL void fl_avx2(fl_kind k, const uint8_t *w, const kvg_qact *a, int t, const int nt, float *out, size_t os) {
    const int n = a->n;
    __m256 acc0[KVG_QDOT_TILE], acc1[KVG_QDOT_TILE];
    for (int r = 0; r < nt; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = fl_load_avx2(k, w, i), w1 = fl_load_avx2(k, w, i + 8);
        for (int r = 0; r < nt; r++) {
            const float *x = a->x + (size_t)(t + r) * n + i;
            acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), acc0[r]);
            acc1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), acc1[r]);
        }
    }
    if (i + 8 <= n) {
        __m256 w0 = fl_load_avx2(k, w, i);
        for (int r = 0; r < nt; r++)
            acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a->x + (size_t)(t + r) * n + i), acc0[r]);
        i += 8;
    }
    for (int r = 0; r < nt; r++) {
        const float *x = a->x + (size_t)(t + r) * n;
        float s = hsum8(_mm256_add_ps(acc0[r], acc1[r]));
        for (int e = i; e < n; e++) s += fl_scalar_avx2(k, w, e) * x[e];
        out[r * os] = s;
    }
}

/* the kernels with nt a constant, so each tile width compiles to its own unrolled loop */
#define TILED_KERNEL(name, target, body, kind)                                                        \
    target static void name(const uint8_t *w, const kvg_qact *a, int t, int nt, float *out, size_t os) { \
        switch (nt) {                                                                                 \
        case 1: body(kind, w, a, t, 1, out, os); break;                                               \
        case 2: body(kind, w, a, t, 2, out, os); break;                                               \
        case 3: body(kind, w, a, t, 3, out, os); break;                                               \
        default: body(kind, w, a, t, 4, out, os); break;                                              \
        }                                                                                             \
    }
TILED_KERNEL(x2_q4_0, AVX2, b32_avx2, B_Q4_0)
TILED_KERNEL(x2_q4_1, AVX2, b32_avx2, B_Q4_1)
TILED_KERNEL(x2_q5_0, AVX2, b32_avx2, B_Q5_0)
TILED_KERNEL(x2_q5_1, AVX2, b32_avx2, B_Q5_1)
TILED_KERNEL(x2_q8_0, AVX2, b32_avx2, B_Q8_0)
TILED_KERNEL(x2_iq4_nl, AVX2, b32_avx2, B_IQ4_NL)
TILED_KERNEL(x2_q2_k, AVX2, kq_avx2, K_Q2)
TILED_KERNEL(x2_q3_k, AVX2, kq_avx2, K_Q3)
TILED_KERNEL(x2_q4_k, AVX2, kq_avx2, K_Q4)
TILED_KERNEL(x2_q5_k, AVX2, kq_avx2, K_Q5)
TILED_KERNEL(x2_q6_k, AVX2, kq_avx2, K_Q6)
TILED_KERNEL(x2_iq4_xs, AVX2, kq_avx2, K_IQ4XS)
TILED_KERNEL(x2_q8_k, AVX2, kq_avx2, K_Q8)
TILED_KERNEL(x2_f32, AVX2, fl_avx2, F_F32)
TILED_KERNEL(x2_f16, AVX2, fl_avx2, F_F16)
TILED_KERNEL(x2_bf16, AVX2, fl_avx2, F_BF16)

/* 16 floats times id to int16 (the same values as q16_of); returns their sum */
AVX2 INL int32_t q16x16_avx2(const float *x, __m256 vid, __m256i lim, int16_t *q) {
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), vid));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), vid));
    /* clamp as q16_of does (reached by rounding right at the limit, or by NaN/inf input) */
    __m256i nlim = _mm256_sub_epi32(_mm256_setzero_si256(), lim);
    i0 = _mm256_min_epi32(_mm256_max_epi32(i0, nlim), lim);
    i1 = _mm256_min_epi32(_mm256_max_epi32(i1, nlim), lim);
    __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xd8);
    _mm256_storeu_si256((__m256i *)q, p);
    return hsum8i(_mm256_add_epi32(i0, i1));
}
AVX2 INL float amax_avx2(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static void quant_qb_avx2(const float *x, int n, int16_t *q, float *d, float *s) {
    const __m256i lim = _mm256_set1_epi32(KVG_QB_LEVELS);
    for (int b = 0; b < n / KVG_QB; b++) {
        const float *xb = x + KVG_QB * b;
        float amax = amax_avx2(xb, KVG_QB);
        float id = amax > 0.0f ? (float)KVG_QB_LEVELS / amax : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        d[b] = amax / (float)KVG_QB_LEVELS;
        int32_t sum = q16x16_avx2(xb, vid, lim, q + KVG_QB * b) + q16x16_avx2(xb + 16, vid, lim, q + KVG_QB * b + 16);
        s[b] = d[b] * (float)sum;
    }
}

AVX2 static void quant_qk_avx2(const float *x, int n, int16_t *q, float *d, int32_t *bsum) {
    const __m256i lim = _mm256_set1_epi32(KVG_QK_LEVELS);
    for (int b = 0; b < n / KVG_QK; b++) {
        const float *xb = x + KVG_QK * b;
        float amax = amax_avx2(xb, KVG_QK);
        float id = amax > 0.0f ? (float)KVG_QK_LEVELS / amax : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        d[b] = amax / (float)KVG_QK_LEVELS;
        for (int j = 0; j < 16; j++) bsum[16 * b + j] = q16x16_avx2(xb + 16 * j, vid, lim, q + KVG_QK * b + 16 * j);
    }
}

/* ================================================================================================
 * x86-64: AVX-512 (F, BW, VL, DQ; vpdpwssd with VNNI)
 * ================================================================================================ */
#define AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))

/* the pair products of w and q (int16) summed into 16 int32. vpdpwssd is written as assembly so
 * this file builds with compilers or flags that lack the VNNI intrinsics; it runs only where the
 * CPU has VNNI (the vnni argument is a constant of each kernel). */
AVX512 INL __m512i madd512(bool vnni, __m512i w, __m512i q) {
    if (vnni) {
        __m512i acc = _mm512_setzero_si512();
        __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(q));
        return acc;
    }
    return _mm512_madd_epi16(w, q);
}

AVX512 INL void b32_avx512(b32_kind k, bool vnni, const uint8_t *w, const kvg_qact *a, int t, const int nt,
                           float *out, size_t os) {
    const int n = a->n, nb = n / KVG_QB;
    const b32_row r = b32_row_of(k, w, nb);
    __m512 acc[KVG_QDOT_TILE];
    float mins[KVG_QDOT_TILE];
    for (int i = 0; i < nt; i++) {
        acc[i] = _mm512_setzero_ps();
        mins[i] = 0.0f;
    }
    for (int b = 0; b < nb; b++) {
        __m256i lo, hi;
        b32_w16_avx2(k, &r, b, &lo, &hi);
        __m512i w16 = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        float dw = _cvtsh_ss(rd16(r.d + 2 * (size_t)b));
        float m = b32_has_min(k) ? _cvtsh_ss(rd16(r.m + 2 * (size_t)b)) : 0.0f;
        for (int i = 0; i < nt; i++) {
            size_t row = (size_t)(t + i);
            __m512i q = _mm512_loadu_si512((const void *)(a->qb + row * (size_t)n + (size_t)KVG_QB * b));
            __m512 p = _mm512_cvtepi32_ps(madd512(vnni, w16, q));
            acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(dw * a->db[row * nb + b]), p, acc[i]);
            if (b32_has_min(k)) mins[i] += m * a->sb[row * nb + b];
        }
    }
    for (int i = 0; i < nt; i++) out[i * os] = _mm512_reduce_add_ps(acc[i]) + mins[i];
}

AVX512 INL __m512 fl_load512(fl_kind k, const uint8_t *w, int i) {
    if (k == F_F32) return _mm512_loadu_ps((const void *)(w + 4 * (size_t)i));
    __m256i h = _mm256_loadu_si256((const __m256i *)(w + 2 * (size_t)i));
    if (k == F_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AVX512 INL void fl_avx512(fl_kind k, const uint8_t *w, const kvg_qact *a, int t, const int nt, float *out, size_t os) {
    const int n = a->n;
    __m512 acc[KVG_QDOT_TILE];
    for (int r = 0; r < nt; r++) acc[r] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 wv = fl_load512(k, w, i);
        for (int r = 0; r < nt; r++)
            acc[r] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(a->x + (size_t)(t + r) * n + i), acc[r]);
    }
    for (int r = 0; r < nt; r++) {
        const float *x = a->x + (size_t)(t + r) * n;
        float s = _mm512_reduce_add_ps(acc[r]);
        for (int e = i; e < n; e++) s += fl_scalar_avx2(k, w, e) * x[e];
        out[r * os] = s;
    }
}

#define TILED_KERNEL512(name, body, kind, vnni)                                                        \
    AVX512 static void name(const uint8_t *w, const kvg_qact *a, int t, int nt, float *out, size_t os) { \
        switch (nt) {                                                                                  \
        case 1: body(kind, vnni, w, a, t, 1, out, os); break;                                          \
        case 2: body(kind, vnni, w, a, t, 2, out, os); break;                                          \
        case 3: body(kind, vnni, w, a, t, 3, out, os); break;                                          \
        default: body(kind, vnni, w, a, t, 4, out, os); break;                                         \
        }                                                                                              \
    }
#define FL512(kind, vnni, w, a, t, nt, out, os) fl_avx512(kind, w, a, t, nt, out, os)
TILED_KERNEL512(x5_q4_0, b32_avx512, B_Q4_0, false)
TILED_KERNEL512(x5_q4_1, b32_avx512, B_Q4_1, false)
TILED_KERNEL512(x5_q5_0, b32_avx512, B_Q5_0, false)
TILED_KERNEL512(x5_q5_1, b32_avx512, B_Q5_1, false)
TILED_KERNEL512(x5_q8_0, b32_avx512, B_Q8_0, false)
TILED_KERNEL512(x5_iq4_nl, b32_avx512, B_IQ4_NL, false)
TILED_KERNEL512(xv_q4_0, b32_avx512, B_Q4_0, true)
TILED_KERNEL512(xv_q4_1, b32_avx512, B_Q4_1, true)
TILED_KERNEL512(xv_q5_0, b32_avx512, B_Q5_0, true)
TILED_KERNEL512(xv_q5_1, b32_avx512, B_Q5_1, true)
TILED_KERNEL512(xv_q8_0, b32_avx512, B_Q8_0, true)
TILED_KERNEL512(xv_iq4_nl, b32_avx512, B_IQ4_NL, true)
TILED_KERNEL512(x5_f32, FL512, F_F32, false)
TILED_KERNEL512(x5_f16, FL512, F_F16, false)
TILED_KERNEL512(x5_bf16, FL512, F_BF16, false)
/* ---- avx512vnni: row groups against 8-bit activations ----------------------------------------
 * One block of a group (see b32_group_pack) is 8 vectors of unsigned levels, vector j holding
 * elements 4j..4j+3 of each of the 16 rows in its lanes; vpdpbusd multiplies them with the
 * token's 4 activation bytes broadcast to every lane, so after 8 of them lane i holds row i's
 * integer sum of the block: no horizontal sums, and the scales apply to 16 rows per
 * instruction. A block's weights are decoded once for the tile of tokens. */
/* bytes ahead of the block being decoded that the group kernels ask the cache for: decode
 * waits on memory (measured, 1B shape Q4_0, 2 threads: 39.5 tok/s without, ~49 with 2-8 KiB) */
#define KVG_GROUP_PREFETCH 4096
#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

VNNI INL void b32_group_vnni(b32_kind k, bool split, const uint8_t *g, const kvg_qact *a, int t, const int nt,
                             float *out, size_t os) {
    const int n = a->n, nb = n / KVG_QB;
    const size_t qbytes = k == B_Q8_0 ? 512 : b32_has_qh(k) ? 320 : 256;
    const __m512i m4 = _mm512_set1_epi8(15), bit4 = _mm512_set1_epi8(16);
    int8_t lv[16];
    for (int i = 0; i < 16; i++) lv[i] = (int8_t)(IQ4_LEVELS[i] + 128);
    const __m512i iq4 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lv));
    __m512 acc[KVG_GROUP_TILE];
    for (int i = 0; i < nt; i++) acc[i] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = g + b32_group_block(k) * (size_t)b;
        for (size_t off = 0; off < b32_group_block(k); off += 64) /* a few blocks ahead: decode waits on memory */
            _mm_prefetch((const char *)(blk + KVG_GROUP_PREFETCH + off), _MM_HINT_T0);
        __m512i w[8];
        if (k == B_Q8_0) {
            for (int j = 0; j < 8; j++) w[j] = _mm512_loadu_si512((const void *)(blk + 64 * j));
        } else {
            for (int c = 0; c < 4; c++) {
                __m512i x = _mm512_loadu_si512((const void *)(blk + 64 * c));
                w[c] = _mm512_and_si512(x, m4);
                w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
            }
            if (k == B_IQ4_NL)
                for (int j = 0; j < 8; j++) w[j] = _mm512_shuffle_epi8(iq4, w[j]);
            if (b32_has_qh(k)) {
                __m512i h = _mm512_loadu_si512((const void *)(blk + 256));
                w[0] = _mm512_or_si512(w[0], _mm512_and_si512(_mm512_slli_epi16(h, 4), bit4));
                w[1] = _mm512_or_si512(w[1], _mm512_and_si512(_mm512_slli_epi16(h, 3), bit4));
                w[2] = _mm512_or_si512(w[2], _mm512_and_si512(_mm512_slli_epi16(h, 2), bit4));
                w[3] = _mm512_or_si512(w[3], _mm512_and_si512(_mm512_slli_epi16(h, 1), bit4));
                w[4] = _mm512_or_si512(w[4], _mm512_and_si512(h, bit4));
                w[5] = _mm512_or_si512(w[5], _mm512_and_si512(_mm512_srli_epi16(h, 1), bit4));
                w[6] = _mm512_or_si512(w[6], _mm512_and_si512(_mm512_srli_epi16(h, 2), bit4));
                w[7] = _mm512_or_si512(w[7], _mm512_and_si512(_mm512_srli_epi16(h, 3), bit4));
            }
        }
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + qbytes)));
        __m512 mw = b32_has_min(k) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + qbytes + 32)))
                                   : _mm512_mul_ps(dw, _mm512_set1_ps((float)-b32_uoffset(k)));
        for (int i = 0; i < nt; i++) {
            size_t row = (size_t)(t + i), at = row * (size_t)n + (size_t)KVG_QB * b;
            const int8_t *qv = a->q8 + at; /* 4 bytes broadcast from memory per product */
            __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
            for (int j = 0; j < 8; j += 2) {
                s0 = _mm512_dpbusd_epi32(s0, w[j], _mm512_broadcastd_epi32(_mm_loadu_si32(qv + 4 * j)));
                s1 = _mm512_dpbusd_epi32(s1, w[j + 1], _mm512_broadcastd_epi32(_mm_loadu_si32(qv + 4 * j + 4)));
            }
            __m512i isum = _mm512_add_epi32(s0, s1);
            if (split) { /* sum(u q) = 256 sum(u hi) + sum(u lo) */
                const int8_t *hv = a->q8h + at;
                __m512i h0 = _mm512_setzero_si512(), h1 = _mm512_setzero_si512();
                for (int j = 0; j < 8; j += 2) {
                    h0 = _mm512_dpbusd_epi32(h0, w[j], _mm512_broadcastd_epi32(_mm_loadu_si32(hv + 4 * j)));
                    h1 = _mm512_dpbusd_epi32(h1, w[j + 1], _mm512_broadcastd_epi32(_mm_loadu_si32(hv + 4 * j + 4)));
                }
                isum = _mm512_add_epi32(isum, _mm512_slli_epi32(_mm512_add_epi32(h0, h1), 8));
            }
            const float *da = a->d8, *sa = a->s8;
            __m512 f = _mm512_cvtepi32_ps(isum);
            acc[i] = _mm512_fmadd_ps(f, _mm512_mul_ps(dw, _mm512_set1_ps(da[row * nb + b])), acc[i]);
            acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sa[row * nb + b]), acc[i]);
        }
    }
    for (int i = 0; i < nt; i++) _mm512_storeu_ps(out + (size_t)i * os, acc[i]);
}

/* quant_q8_portable's bytes: the same max (NaN ignored, as fmaxf), the same scalar scale, the
 * same product rounded to nearest even and clamped (a NaN product clamps to -levels) */
VNNI static void quant_q8_avx512(const float *x, int n, int8_t *lo, int8_t *hi, float *d, float *s) {
    const int levels = hi ? KVG_QS_LEVELS : KVG_Q8_LEVELS;
    const __m512 sign = _mm512_set1_ps(-0.0f);
    const __m512i lim = _mm512_set1_epi32(levels), nlim = _mm512_set1_epi32(-levels);
    for (int b = 0; b < n / KVG_QB; b++) {
        const float *xb = x + KVG_QB * b;
        __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
        /* max(|x|, m) keeps m where x is NaN */
        __m512 m = _mm512_max_ps(_mm512_andnot_ps(sign, x0), _mm512_setzero_ps());
        m = _mm512_max_ps(_mm512_andnot_ps(sign, x1), m);
        float amax = _mm512_reduce_max_ps(m);
        float id = amax > 0.0f ? (float)levels / amax : 0.0f;
        d[b] = amax / (float)levels;
        __m512 vid = _mm512_set1_ps(id);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, vid)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, vid));
        q0 = _mm512_min_epi32(_mm512_max_epi32(q0, nlim), lim);
        q1 = _mm512_min_epi32(_mm512_max_epi32(q1, nlim), lim);
        s[b] = d[b] * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        _mm_storeu_si128((__m128i *)(lo + KVG_QB * b), _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(lo + KVG_QB * b + 16), _mm512_cvtepi32_epi8(q1));
        if (hi) { /* hi = (q - lo) / 256, lo the sign-extended low byte */
            __m512i l0 = _mm512_srai_epi32(_mm512_slli_epi32(q0, 24), 24), l1 = _mm512_srai_epi32(_mm512_slli_epi32(q1, 24), 24);
            _mm_storeu_si128((__m128i *)(hi + KVG_QB * b), _mm512_cvtepi32_epi8(_mm512_srai_epi32(_mm512_sub_epi32(q0, l0), 8)));
            _mm_storeu_si128((__m128i *)(hi + KVG_QB * b + 16),
                             _mm512_cvtepi32_epi8(_mm512_srai_epi32(_mm512_sub_epi32(q1, l1), 8)));
        }
    }
}

/* one kernel per type and activation form: the tile width nt made a constant for each case, so
   the kernel body's loops over tokens unroll */
#define TILE_KERNEL(name, body, kind, split)                                                           \
    VNNI static void name(const uint8_t *g, const kvg_qact *a, int t, int nt, float *out, size_t os) { \
        switch (nt) {                                                                                  \
        case 1: body(kind, split, g, a, t, 1, out, os); break;                                        \
        case 2: body(kind, split, g, a, t, 2, out, os); break;                                        \
        case 3: body(kind, split, g, a, t, 3, out, os); break;                                        \
        case 4: body(kind, split, g, a, t, 4, out, os); break;                                        \
        case 5: body(kind, split, g, a, t, 5, out, os); break;                                        \
        case 6: body(kind, split, g, a, t, 6, out, os); break;                                        \
        case 7: body(kind, split, g, a, t, 7, out, os); break;                                        \
        default: body(kind, split, g, a, t, 8, out, os); break;                                       \
        }                                                                                              \
    }
#define GROUP_KERNEL(name, kind, split) TILE_KERNEL(name, b32_group_vnni, kind, split)
GROUP_KERNEL(gv_q4_0, B_Q4_0, false)
GROUP_KERNEL(gv_q4_1, B_Q4_1, false)
GROUP_KERNEL(gv_q5_0, B_Q5_0, false)
GROUP_KERNEL(gv_q5_1, B_Q5_1, false)
GROUP_KERNEL(gv_q8_0, B_Q8_0, false)
GROUP_KERNEL(gv_iq4_nl, B_IQ4_NL, false)
GROUP_KERNEL(gs_q4_0, B_Q4_0, true)
GROUP_KERNEL(gs_q4_1, B_Q4_1, true)
GROUP_KERNEL(gs_q5_0, B_Q5_0, true)
GROUP_KERNEL(gs_q5_1, B_Q5_1, true)
GROUP_KERNEL(gs_q8_0, B_Q8_0, true)
GROUP_KERNEL(gs_iq4_nl, B_IQ4_NL, true)

/* sum of 16 signed bytes */
VNNI INL int32_t sum16_i8(const int8_t *p) {
    __m128i x = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_set1_epi8(-128));
    __m128i s = _mm_sad_epu8(x, _mm_setzero_si128());
    return _mm_cvtsi128_si32(s) + _mm_extract_epi16(s, 4) - 16 * 128;
}
/* (x >> n) & mask per dword lane */
VNNI INL __m512i field32(__m512i x, int n, int mask) {
    return _mm512_and_si512(_mm512_srl_epi32(x, _mm_cvtsi32_si128(n)), _mm512_set1_epi32(mask));
}
VNNI INL __m512i bytes32(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
VNNI INL __m512 f16x16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
/* bit `from` of each byte of h moved to bit `to` (0 elsewhere), by 16-bit shifts: the bits that
 * cross into a byte from its neighbour are masked off */
VNNI INL __m512i move_bit(__m512i h, int from, int to, int width) {
    __m512i m = _mm512_set1_epi8((char)(((1 << width) - 1) << to));
    __m512i x = from > to ? _mm512_srl_epi16(h, _mm_cvtsi32_si128(from - to))
                          : _mm512_sll_epi16(h, _mm_cvtsi32_si128(to - from));
    return _mm512_and_si512(x, m);
}

/* the unsigned levels of block j of K block sb (kq_group_pack): w[c] holds elements 4c..4c+3 of
 * each row */
VNNI INL void kq_group_levels(kq_kind k, const uint8_t *blk, __m512i iq4, __m512i *w) {
    if (kg_2bit(k)) {
        for (int p = 0; p < 2; p++) {
            __m512i x = _mm512_loadu_si512((const void *)(blk + 64 * p));
            for (int c = 0; c < 4; c++) w[4 * p + c] = move_bit(x, 2 * c, 0, 2);
        }
        if (k == K_Q3) {
            __m512i h = _mm512_loadu_si512((const void *)(blk + 128));
            for (int j = 0; j < 8; j++) w[j] = _mm512_or_si512(w[j], move_bit(h, j, 2, 1));
        }
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(15);
    for (int c = 0; c < 4; c++) {
        __m512i x = _mm512_loadu_si512((const void *)(blk + 64 * c));
        w[c] = _mm512_and_si512(x, m4);
        w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
    }
    if (k == K_IQ4XS)
        for (int j = 0; j < 8; j++) w[j] = _mm512_shuffle_epi8(iq4, w[j]);
    if (k == K_Q5) {
        __m512i h = _mm512_loadu_si512((const void *)(blk + 256));
        for (int j = 0; j < 8; j++) w[j] = _mm512_or_si512(w[j], move_bit(h, j, 4, 1));
    }
    if (k == K_Q6)
        for (int p = 0; p < 2; p++) {
            __m512i h = _mm512_loadu_si512((const void *)(blk + 256 + 64 * p));
            for (int c = 0; c < 4; c++) w[4 * p + c] = _mm512_or_si512(w[4 * p + c], move_bit(h, 2 * c, 4, 2));
        }
}

/* K blocks of a group (kq_group_pack) against a tile of tokens: per block of 32 the levels are
 * decoded once and the 16 rows' scales formed from their integer fields, then each token's sums
 * of 32 (or two of 16) scale them in the order of kq_q8_portable. */
VNNI INL void kq_group_vnni(kq_kind k, bool split, const uint8_t *g, const kvg_qact *a, int t, const int nt,
                            float *out, size_t os) {
    const int n = a->n, nb = n / KVG_QK, n32 = n / KVG_QB, off = kg_uoffset(k);
    const bool per16 = kg_per16(k), has_min = kq_has_min(k);
    int8_t lv[16];
    for (int i = 0; i < 16; i++) lv[i] = (int8_t)(IQ4_LEVELS[i] + 128);
    const __m512i iq4 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lv));
    __m512 acc[KVG_GROUP_TILE];
    for (int i = 0; i < nt; i++) acc[i] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *sb = g + kg_block(k) * (size_t)b, *hdr = sb + 8 * kg_qblock(k);
        __m512 d, dmin = _mm512_setzero_ps();
        __m512i high = _mm512_setzero_si512();
        switch (k) {
        case K_Q2: d = f16x16(hdr + 256), dmin = f16x16(hdr + 288); break;
        case K_Q3: d = f16x16(hdr + 192), high = _mm512_loadu_si512((const void *)(hdr + 128)); break;
        case K_Q6: d = f16x16(hdr + 256); break;
        case K_IQ4XS:
            d = f16x16(hdr + 96);
            high = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(hdr + 64)));
            break;
        default:
            d = f16x16(hdr + 192), dmin = f16x16(hdr + 224);
            high = _mm512_loadu_si512((const void *)(hdr + 128));
            break;
        }
        for (int j = 0; j < 8; j++) {
            const uint8_t *blk = sb + kg_qblock(k) * (size_t)j;
            for (size_t o = 0; o < kg_qblock(k); o += 64)
                _mm_prefetch((const char *)(blk + KVG_GROUP_PREFETCH + o), _MM_HINT_T0);
            __m512i w[8];
            kq_group_levels(k, blk, iq4, w);
            /* per 16 (dw[h], mw[h] for half h) or per 32 (dw[0], mw[0]) */
            __m512i sc[2], mn[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
            switch (k) {
            case K_Q2:
                for (int h = 0; h < 2; h++) {
                    __m512i x = bytes32(hdr + 16 * (2 * j + h));
                    sc[h] = _mm512_and_si512(x, _mm512_set1_epi32(15));
                    mn[h] = _mm512_srli_epi32(x, 4);
                }
                break;
            case K_Q3:
                for (int h = 0; h < 2; h++) {
                    __m512i lo = field32(bytes32(hdr + 16 * j), 4 * h, 15);
                    sc[h] = _mm512_or_si512(lo, _mm512_slli_epi32(field32(high, 2 * (2 * j + h), 3), 4));
                    sc[h] = _mm512_sub_epi32(sc[h], _mm512_set1_epi32(32));
                }
                break;
            case K_Q6:
                for (int h = 0; h < 2; h++)
                    sc[h] = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(hdr + 16 * (2 * j + h))));
                break;
            case K_IQ4XS:
                sc[0] = field32(bytes32(hdr + 16 * (j / 2)), 4 * (j % 2), 15);
                sc[0] = _mm512_or_si512(sc[0], _mm512_slli_epi32(field32(high, 2 * j, 3), 4));
                sc[0] = _mm512_sub_epi32(sc[0], _mm512_set1_epi32(32));
                break;
            default:
                sc[0] = field32(bytes32(hdr + 16 * (j / 2)), 4 * (j % 2), 15);
                mn[0] = field32(bytes32(hdr + 64 + 16 * (j / 2)), 4 * (j % 2), 15);
                sc[0] = _mm512_or_si512(sc[0], _mm512_slli_epi32(field32(high, 2 * j, 3), 4));
                mn[0] = _mm512_or_si512(mn[0], _mm512_slli_epi32(field32(high, 16 + 2 * j, 3), 4));
                break;
            }
            __m512 dw[2], mw[2];
            for (int h = 0; h < (per16 ? 2 : 1); h++) {
                dw[h] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc[h]));
                mw[h] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn[h]));
            }
            for (int i = 0; i < nt; i++) {
                size_t row = (size_t)(t + i), at = row * (size_t)n + (size_t)KVG_QK * b + 32 * (size_t)j;
                size_t bi = row * (size_t)n32 + 8 * (size_t)b + (size_t)j;
                const int8_t *qv = a->q8 + at;
                __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
                for (int c = 0; c < 4; c++) {
                    s0 = _mm512_dpbusd_epi32(s0, w[c], _mm512_broadcastd_epi32(_mm_loadu_si32(qv + 4 * c)));
                    s1 = _mm512_dpbusd_epi32(s1, w[c + 4], _mm512_broadcastd_epi32(_mm_loadu_si32(qv + 16 + 4 * c)));
                }
                if (split) { /* sum(u q) = 256 sum(u hi) + sum(u lo) */
                    const int8_t *hv = a->q8h + at;
                    __m512i h0 = _mm512_setzero_si512(), h1 = _mm512_setzero_si512();
                    for (int c = 0; c < 4; c++) {
                        h0 = _mm512_dpbusd_epi32(h0, w[c], _mm512_broadcastd_epi32(_mm_loadu_si32(hv + 4 * c)));
                        h1 = _mm512_dpbusd_epi32(h1, w[c + 4], _mm512_broadcastd_epi32(_mm_loadu_si32(hv + 16 + 4 * c)));
                    }
                    s0 = _mm512_add_epi32(s0, _mm512_slli_epi32(h0, 8));
                    s1 = _mm512_add_epi32(s1, _mm512_slli_epi32(h1, 8));
                }
                int32_t q0 = 0, q1 = 0; /* the halves' sums of q, where an offset or a min needs them */
                if (off || (has_min && per16)) {
                    q0 = sum16_i8(qv);
                    q1 = sum16_i8(qv + 16);
                    if (split) {
                        q0 += 256 * sum16_i8(a->q8h + at);
                        q1 += 256 * sum16_i8(a->q8h + at + 16);
                    }
                }
                float daf = a->d8[bi];
                __m512 da = _mm512_set1_ps(daf);
                if (per16) { /* sum(v q) = sum(u q) - offset sum(q), per half */
                    s0 = _mm512_sub_epi32(s0, _mm512_set1_epi32(off * q0));
                    s1 = _mm512_sub_epi32(s1, _mm512_set1_epi32(off * q1));
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(dw[0], da), acc[i]);
                    if (has_min) acc[i] = _mm512_fnmadd_ps(mw[0], _mm512_set1_ps(daf * (float)q0), acc[i]);
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(dw[1], da), acc[i]);
                    if (has_min) acc[i] = _mm512_fnmadd_ps(mw[1], _mm512_set1_ps(daf * (float)q1), acc[i]);
                } else {
                    __m512i s = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(off * (q0 + q1)));
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[0], da), acc[i]);
                    if (has_min) acc[i] = _mm512_fnmadd_ps(mw[0], _mm512_set1_ps(a->s8[bi]), acc[i]);
                }
            }
        }
    }
    for (int i = 0; i < nt; i++) _mm512_storeu_ps(out + (size_t)i * os, acc[i]);
}

#define K_GROUP_KERNEL(name, kind, split) TILE_KERNEL(name, kq_group_vnni, kind, split)
K_GROUP_KERNEL(gv_q2_k, K_Q2, false)
K_GROUP_KERNEL(gv_q3_k, K_Q3, false)
K_GROUP_KERNEL(gv_q4_k, K_Q4, false)
K_GROUP_KERNEL(gv_q5_k, K_Q5, false)
K_GROUP_KERNEL(gv_q6_k, K_Q6, false)
K_GROUP_KERNEL(gv_iq4_xs, K_IQ4XS, false)
K_GROUP_KERNEL(gs_q2_k, K_Q2, true)
K_GROUP_KERNEL(gs_q3_k, K_Q3, true)
K_GROUP_KERNEL(gs_q4_k, K_Q4, true)
K_GROUP_KERNEL(gs_q5_k, K_Q5, true)
K_GROUP_KERNEL(gs_q6_k, K_Q6, true)
K_GROUP_KERNEL(gs_iq4_xs, K_IQ4XS, true)
#endif /* KVG_X86 */

/* ================================================================================================
 * AArch64: Advanced SIMD (neon) and the ARMv8.2 dot product (dotprod)
 * ================================================================================================
 * Every weight group of 16 is decoded to 16 int8 levels (every type's levels fit: Q6_K's 6 bits
 * - 32, IQ4's table, Q8's bytes); a group's products with the int16 activations are summed into
 * 4 int32 lanes, with widening multiply-adds (neon) or SDOT (dotprod: q = 256 hi + lo, hi the
 * signed high byte, so w.q = 256 w.hi + w.(lo - 128) + 128 sum(w), three SDOTs on bytes). The
 * integer sums are exact, so a block's sum is the portable path's, and the scaling is the
 * portable path's f32 arithmetic in the same order: these paths give the portable path's bits.
 * The K types scale each group's lanes by its sub-block scale in int32 (a lane sums 64 products
 * of a block, < 2^31 as on x86). */
#ifdef KVG_ARM

/* 16 bytes: byte i is 0xff where bit i of v is set, else 0 */
INL uint8x16_t bits16(uint32_t v) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t x = vcombine_u8(vdup_n_u8((uint8_t)v), vdup_n_u8((uint8_t)(v >> 8)));
    return vtstq_u8(x, vld1q_u8(bit));
}
INL uint8x16_t shr8(uint8x16_t x, int n) { return vshlq_u8(x, vdupq_n_s8((int8_t)-n)); }
INL int8x16_t s8(uint8x16_t x) { return vreinterpretq_s8_u8(x); }

/* block b's levels: elements 0..15 in *lo, 16..31 in *hi */
INL void b32_w8_neon(b32_kind k, const b32_row *r, int b, int8x16_t *lo, int8x16_t *hi) {
    const uint8_t *qs = r->qs + b32_qbytes(k) * (size_t)b;
    if (k == B_Q8_0) {
        *lo = vld1q_s8((const int8_t *)qs);
        *hi = vld1q_s8((const int8_t *)qs + 16);
        return;
    }
    uint8x16_t x = vld1q_u8(qs);
    uint8x16_t l = vandq_u8(x, vdupq_n_u8(15)), h = vshrq_n_u8(x, 4);
    if (k == B_IQ4_NL) {
        int8x16_t t = vld1q_s8(IQ4_LEVELS);
        *lo = vqtbl1q_s8(t, l);
        *hi = vqtbl1q_s8(t, h);
        return;
    }
    if (b32_has_qh(k)) {
        uint32_t qh = rd32(r->qh + 4 * (size_t)b);
        l = vorrq_u8(l, vandq_u8(bits16(qh), vdupq_n_u8(16)));
        h = vorrq_u8(h, vandq_u8(bits16(qh >> 16), vdupq_n_u8(16)));
    }
    *lo = vsubq_s8(s8(l), vdupq_n_s8((int8_t)b32_offset(k)));
    *hi = vsubq_s8(s8(h), vdupq_n_s8((int8_t)b32_offset(k)));
}

/* elements 16j..16j+15 of a K block as levels (kq_levels) */
INL int8x16_t kq_w8_neon(kq_kind k, const uint8_t *b, int j) {
    const int h = j / 8, s = (j / 2) % 4, g = j / 2, half = 16 * (j % 2);
    const uint8x16_t m1 = vdupq_n_u8(1), m2 = vdupq_n_u8(3), m4 = vdupq_n_u8(15);
    uint8x16_t x;
    switch (k) {
    case K_Q2: return s8(vandq_u8(shr8(vld1q_u8(b + 16 + 32 * h + half), 2 * s), m2));
    case K_Q3:
        x = vandq_u8(shr8(vld1q_u8(b + 32 + 32 * h + half), 2 * s), m2);
        x = vorrq_u8(x, vshlq_n_u8(vandq_u8(shr8(vld1q_u8(b + half), g), m1), 2));
        return vsubq_s8(s8(x), vdupq_n_s8(4));
    case K_Q4: return s8(vandq_u8(shr8(vld1q_u8(b + 16 + 32 * (g / 2) + half), 4 * (g % 2)), m4));
    case K_Q5:
        x = vandq_u8(shr8(vld1q_u8(b + 48 + 32 * (g / 2) + half), 4 * (g % 2)), m4);
        return s8(vorrq_u8(x, vshlq_n_u8(vandq_u8(shr8(vld1q_u8(b + 16 + half), g), m1), 4)));
    case K_Q6:
        x = vandq_u8(shr8(vld1q_u8(b + 64 * h + 16 * (j % 4)), 4 * ((j % 8) / 4)), m4);
        x = vorrq_u8(x, vshlq_n_u8(vandq_u8(shr8(vld1q_u8(b + 128 + 32 * h + half), 2 * s), m2), 4));
        return vsubq_s8(s8(x), vdupq_n_s8(32));
    case K_IQ4XS:
        x = vld1q_u8(b + 8 + 16 * g);
        return vqtbl1q_s8(vld1q_s8(IQ4_LEVELS), j % 2 ? vshrq_n_u8(x, 4) : vandq_u8(x, m4));
    default: return vld1q_s8((const int8_t *)b + 4 + 16 * j); /* Q8_K */
    }
}

/* SDOT as assembly, like vpdpwssd above: the file needs no -march, and the instruction is only
 * reached in the dotprod kernels (which carry the target too) */
#ifdef __clang__
#define SDOT_ASM "sdot %0.4s, %1.16b, %2.16b" /* clang assembles it under the function's target */
#else
#define SDOT_ASM ".arch_extension dotprod\n\tsdot %0.4s, %1.16b, %2.16b"
#endif
INL int32x4_t sdot(int32x4_t acc, int8x16_t a, int8x16_t b) {
    __asm__(SDOT_ASM : "+w"(acc) : "w"(a), "w"(b));
    return acc;
}
/* dotprod: sum(w) per lane of 4, shifted for dot16's 128 sum(w); neon: unused */
INL int32x4_t wsum16(bool dp, int8x16_t w) {
    return dp ? vshlq_n_s32(sdot(vdupq_n_s32(0), w, vdupq_n_s8(1)), 7) : vdupq_n_s32(0);
}
/* the 16 products of levels w with the int16 activations q, in 4 int32 lanes */
INL int32x4_t dot16(bool dp, int8x16_t w, int32x4_t ws, const int16_t *q) {
    int16x8_t q0 = vld1q_s16(q), q1 = vld1q_s16(q + 8);
    if (dp) {
        int8x16_t b0 = vreinterpretq_s8_s16(q0), b1 = vreinterpretq_s8_s16(q1);
        int8x16_t hi = vuzp2q_s8(b0, b1), lo = veorq_s8(vuzp1q_s8(b0, b1), vdupq_n_s8(-128));
        int32x4_t h = sdot(vdupq_n_s32(0), w, hi);
        return vaddq_s32(vshlq_n_s32(h, 8), sdot(ws, w, lo));
    }
    int16x8_t w0 = vmovl_s8(vget_low_s8(w)), w1 = vmovl_high_s8(w);
    int32x4_t acc = vmull_s16(vget_low_s16(w0), vget_low_s16(q0));
    acc = vmlal_high_s16(acc, w0, q0);
    acc = vmlal_s16(acc, vget_low_s16(w1), vget_low_s16(q1));
    return vmlal_high_s16(acc, w1, q1);
}

INL void b32_arm(b32_kind k, bool dp, const uint8_t *w, const kvg_qact *a, int t, const int nt, float *out,
                 size_t os) {
    const int n = a->n, nb = n / KVG_QB;
    const b32_row r = b32_row_of(k, w, nb);
    float acc[KVG_QDOT_TILE] = {0}, mins[KVG_QDOT_TILE] = {0};
    for (int b = 0; b < nb; b++) {
        int8x16_t lo, hi;
        b32_w8_neon(k, &r, b, &lo, &hi);
        int32x4_t slo = wsum16(dp, lo), shi = wsum16(dp, hi);
        float dw = kvg_f16_to_f32(rd16(r.d + 2 * (size_t)b));
        float m = b32_has_min(k) ? kvg_f16_to_f32(rd16(r.m + 2 * (size_t)b)) : 0.0f;
        for (int i = 0; i < nt; i++) {
            size_t row = (size_t)(t + i);
            const int16_t *q = a->qb + row * (size_t)n + (size_t)KVG_QB * b;
            int32_t isum = vaddvq_s32(vaddq_s32(dot16(dp, lo, slo, q), dot16(dp, hi, shi, q + 16)));
            acc[i] += dw * a->db[row * nb + b] * (float)isum;
            if (b32_has_min(k)) mins[i] += m * a->sb[row * nb + b];
        }
    }
    for (int i = 0; i < nt; i++) out[i * os] = acc[i] + mins[i];
}

INL void kq_arm(kq_kind k, bool dp, const uint8_t *w, const kvg_qact *a, int t, const int nt, float *out, size_t os) {
    const int n = a->n, nb = n / KVG_QK;
    float acc[KVG_QDOT_TILE] = {0}, mins[KVG_QDOT_TILE] = {0};
    int sc[16], mn[16];
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + kq_bytes(k) * (size_t)b;
        uint16_t dh, mh;
        kq_header(k, blk, &dh, &mh, sc, mn);
        float d = k == K_Q8 ? kq_d32(blk) : kvg_f16_to_f32(dh), dmin = kvg_f16_to_f32(mh);
        int32x4_t isum[KVG_QDOT_TILE];
        for (int i = 0; i < nt; i++) isum[i] = vdupq_n_s32(0);
        for (int j = 0; j < 16; j++) {
            int8x16_t v = kq_w8_neon(k, blk, j);
            int32x4_t ws = wsum16(dp, v);
            for (int i = 0; i < nt; i++) {
                const int16_t *q = a->qk + (size_t)(t + i) * (size_t)n + (size_t)KVG_QK * b + 16 * (size_t)j;
                isum[i] = vmlaq_n_s32(isum[i], dot16(dp, v, ws, q), sc[j]);
            }
        }
        for (int i = 0; i < nt; i++) {
            size_t row = (size_t)(t + i);
            const int32_t *bs = a->bk + row * (size_t)(n / 16) + 16 * (size_t)b;
            int64_t is = vaddlvq_s32(isum[i]);
            int32_t msum = 0;
            for (int j = 0; j < 16; j++) msum += mn[j] * bs[j];
            float da = a->dk[row * nb + b];
            acc[i] += d * da * (float)is;
            if (kq_has_min(k)) mins[i] += dmin * da * (float)msum;
        }
    }
    for (int i = 0; i < nt; i++) out[i * os] = acc[i] - mins[i];
}

INL float32x4_t fl_load_neon(fl_kind k, const uint8_t *w, int i) {
    if (k == F_F32) return vreinterpretq_f32_u8(vld1q_u8(w + 4 * (size_t)i));
    uint16x4_t h = vreinterpret_u16_u8(vld1_u8(w + 2 * (size_t)i));
    if (k == F_F16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

/* the portable loop's 8 lanes as two vectors, multiplied and added as it does (no fused
 * multiply-add), the lanes summed in its order: the portable path's bits */
INL void fl_arm(fl_kind k, const uint8_t *w, const kvg_qact *a, int t, const int nt, float *out, size_t os) {
    const int n = a->n;
    float32x4_t acc0[KVG_QDOT_TILE], acc1[KVG_QDOT_TILE];
    for (int r = 0; r < nt; r++) acc0[r] = acc1[r] = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + FL_LANES <= n; i += FL_LANES) {
        float32x4_t w0 = fl_load_neon(k, w, i), w1 = fl_load_neon(k, w, i + 4);
        for (int r = 0; r < nt; r++) {
            const float *x = a->x + (size_t)(t + r) * n + i;
            acc0[r] = vaddq_f32(acc0[r], vmulq_f32(w0, vld1q_f32(x)));
            acc1[r] = vaddq_f32(acc1[r], vmulq_f32(w1, vld1q_f32(x + 4)));
        }
    }
    for (int r = 0; r < nt; r++) {
        const float *x = a->x + (size_t)(t + r) * n;
        float l[FL_LANES], s = 0.0f;
        vst1q_f32(l, acc0[r]);
        vst1q_f32(l + 4, acc1[r]);
        for (int e = 0; e < FL_LANES; e++) s += l[e];
        for (int e = i; e < n; e++) s += fl_at(k, w, e) * x[e];
        out[r * os] = s;
    }
}

#define ARM_KERNEL(name, target, body, kind, dp)                                                       \
    target static void name(const uint8_t *w, const kvg_qact *a, int t, int nt, float *out, size_t os) { \
        switch (nt) {                                                                                  \
        case 1: body(kind, dp, w, a, t, 1, out, os); break;                                            \
        case 2: body(kind, dp, w, a, t, 2, out, os); break;                                            \
        case 3: body(kind, dp, w, a, t, 3, out, os); break;                                            \
        default: body(kind, dp, w, a, t, 4, out, os); break;                                           \
        }                                                                                              \
    }
#define NEON_TARGET /* the AArch64 baseline */
#define FLARM(kind, dp, w, a, t, nt, out, os) fl_arm(kind, w, a, t, nt, out, os)
ARM_KERNEL(n_q4_0, NEON_TARGET, b32_arm, B_Q4_0, false)
ARM_KERNEL(n_q4_1, NEON_TARGET, b32_arm, B_Q4_1, false)
ARM_KERNEL(n_q5_0, NEON_TARGET, b32_arm, B_Q5_0, false)
ARM_KERNEL(n_q5_1, NEON_TARGET, b32_arm, B_Q5_1, false)
ARM_KERNEL(n_q8_0, NEON_TARGET, b32_arm, B_Q8_0, false)
ARM_KERNEL(n_iq4_nl, NEON_TARGET, b32_arm, B_IQ4_NL, false)
ARM_KERNEL(n_q2_k, NEON_TARGET, kq_arm, K_Q2, false)
ARM_KERNEL(n_q3_k, NEON_TARGET, kq_arm, K_Q3, false)
ARM_KERNEL(n_q4_k, NEON_TARGET, kq_arm, K_Q4, false)
ARM_KERNEL(n_q5_k, NEON_TARGET, kq_arm, K_Q5, false)
ARM_KERNEL(n_q6_k, NEON_TARGET, kq_arm, K_Q6, false)
ARM_KERNEL(n_iq4_xs, NEON_TARGET, kq_arm, K_IQ4XS, false)
ARM_KERNEL(n_q8_k, NEON_TARGET, kq_arm, K_Q8, false)
ARM_KERNEL(n_f32, NEON_TARGET, FLARM, F_F32, false)
ARM_KERNEL(n_f16, NEON_TARGET, FLARM, F_F16, false)
ARM_KERNEL(n_bf16, NEON_TARGET, FLARM, F_BF16, false)
ARM_KERNEL(d_q4_0, DOTPROD, b32_arm, B_Q4_0, true)
ARM_KERNEL(d_q4_1, DOTPROD, b32_arm, B_Q4_1, true)
ARM_KERNEL(d_q5_0, DOTPROD, b32_arm, B_Q5_0, true)
ARM_KERNEL(d_q5_1, DOTPROD, b32_arm, B_Q5_1, true)
ARM_KERNEL(d_q8_0, DOTPROD, b32_arm, B_Q8_0, true)
ARM_KERNEL(d_iq4_nl, DOTPROD, b32_arm, B_IQ4_NL, true)
ARM_KERNEL(d_q2_k, DOTPROD, kq_arm, K_Q2, true)
ARM_KERNEL(d_q3_k, DOTPROD, kq_arm, K_Q3, true)
ARM_KERNEL(d_q4_k, DOTPROD, kq_arm, K_Q4, true)
ARM_KERNEL(d_q5_k, DOTPROD, kq_arm, K_Q5, true)
ARM_KERNEL(d_q6_k, DOTPROD, kq_arm, K_Q6, true)
ARM_KERNEL(d_iq4_xs, DOTPROD, kq_arm, K_IQ4XS, true)
ARM_KERNEL(d_q8_k, DOTPROD, kq_arm, K_Q8, true)

INL float amax_neon(const float *x, int n) {
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int i = 0; i < n; i += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + i)));
    return vmaxnmvq_f32(m);
}
/* 16 floats times id to int16 (q16_of's values: clamped first, which is the same for an integer
 * bound, NaN to -lim as fmaxf gives; then rounded to nearest even); returns their sum */
INL int32_t q16x16_neon(const float *x, float id, float lim, int16_t *q) {
    const float32x4_t hi = vdupq_n_f32(lim), lo = vdupq_n_f32(-lim);
    int32x4_t v[4];
    for (int k = 0; k < 4; k++)
        v[k] = vcvtnq_s32_f32(vminnmq_f32(vmaxnmq_f32(vmulq_n_f32(vld1q_f32(x + 4 * k), id), lo), hi));
    vst1q_s16(q, vcombine_s16(vmovn_s32(v[0]), vmovn_s32(v[1])));
    vst1q_s16(q + 8, vcombine_s16(vmovn_s32(v[2]), vmovn_s32(v[3])));
    return vaddvq_s32(vaddq_s32(vaddq_s32(v[0], v[1]), vaddq_s32(v[2], v[3])));
}

static void quant_qb_neon(const float *x, int n, int16_t *q, float *d, float *s) {
    for (int b = 0; b < n / KVG_QB; b++) {
        const float *xb = x + KVG_QB * b;
        float amax = amax_neon(xb, KVG_QB);
        float id = amax > 0.0f ? (float)KVG_QB_LEVELS / amax : 0.0f;
        d[b] = amax / (float)KVG_QB_LEVELS;
        int32_t sum = q16x16_neon(xb, id, (float)KVG_QB_LEVELS, q + KVG_QB * b) +
                      q16x16_neon(xb + 16, id, (float)KVG_QB_LEVELS, q + KVG_QB * b + 16);
        s[b] = d[b] * (float)sum;
    }
}

static void quant_qk_neon(const float *x, int n, int16_t *q, float *d, int32_t *bsum) {
    for (int b = 0; b < n / KVG_QK; b++) {
        const float *xb = x + KVG_QK * b;
        float amax = amax_neon(xb, KVG_QK);
        float id = amax > 0.0f ? (float)KVG_QK_LEVELS / amax : 0.0f;
        d[b] = amax / (float)KVG_QK_LEVELS;
        for (int j = 0; j < 16; j++)
            bsum[16 * b + j] = q16x16_neon(xb + 16 * j, id, (float)KVG_QK_LEVELS, q + KVG_QK * b + 16 * j);
    }
}
#endif /* KVG_ARM */

#define REPACK(name, kind) \
    static void name(const uint8_t *src, uint8_t *dst, int n) { b32_repack(kind, src, dst, n); }
REPACK(r_q4_0, B_Q4_0)
REPACK(r_q4_1, B_Q4_1)
REPACK(r_q5_0, B_Q5_0)
REPACK(r_q5_1, B_Q5_1)
REPACK(r_q8_0, B_Q8_0)
REPACK(r_iq4_nl, B_IQ4_NL)

/* ---- the kernel tables ------------------------------------------------------------------------ */

enum { N_KERNELS = 16 };
/* a row of the tables of the kernels without row groups */
#define K(t, a, d, r) {.type = t, .act = a, .dot = d, .repack = r}

static const kvg_qdot_kernel PORTABLE[N_KERNELS] = {
    K(KVG_TYPE_F32, KVG_ACT_F32, p_f32, NULL),       K(KVG_TYPE_F16, KVG_ACT_F32, p_f16, NULL),
    K(KVG_TYPE_BF16, KVG_ACT_F32, p_bf16, NULL),     K(KVG_TYPE_Q8_0, KVG_ACT_QB, p_q8_0, r_q8_0),
    K(KVG_TYPE_Q4_0, KVG_ACT_QB, p_q4_0, r_q4_0),      K(KVG_TYPE_Q4_1, KVG_ACT_QB, p_q4_1, r_q4_1),
    K(KVG_TYPE_Q5_0, KVG_ACT_QB, p_q5_0, r_q5_0),      K(KVG_TYPE_Q5_1, KVG_ACT_QB, p_q5_1, r_q5_1),
    K(KVG_TYPE_IQ4_NL, KVG_ACT_QB, p_iq4_nl, r_iq4_nl),  K(KVG_TYPE_Q2_K, KVG_ACT_QK, p_q2_k, NULL),
    K(KVG_TYPE_Q3_K, KVG_ACT_QK, p_q3_k, NULL),      K(KVG_TYPE_Q4_K, KVG_ACT_QK, p_q4_k, NULL),
    K(KVG_TYPE_Q5_K, KVG_ACT_QK, p_q5_k, NULL),      K(KVG_TYPE_Q6_K, KVG_ACT_QK, p_q6_k, NULL),
    K(KVG_TYPE_Q8_K, KVG_ACT_QK, p_q8_k, NULL),      K(KVG_TYPE_IQ4_XS, KVG_ACT_QK, p_iq4_xs, NULL),
};

#ifdef KVG_X86
static const kvg_qdot_kernel AVX2_TABLE[N_KERNELS] = {
    K(KVG_TYPE_F32, KVG_ACT_F32, x2_f32, NULL),      K(KVG_TYPE_F16, KVG_ACT_F32, x2_f16, NULL),
    K(KVG_TYPE_BF16, KVG_ACT_F32, x2_bf16, NULL),    K(KVG_TYPE_Q8_0, KVG_ACT_QB, x2_q8_0, r_q8_0),
    K(KVG_TYPE_Q4_0, KVG_ACT_QB, x2_q4_0, r_q4_0),     K(KVG_TYPE_Q4_1, KVG_ACT_QB, x2_q4_1, r_q4_1),
    K(KVG_TYPE_Q5_0, KVG_ACT_QB, x2_q5_0, r_q5_0),     K(KVG_TYPE_Q5_1, KVG_ACT_QB, x2_q5_1, r_q5_1),
    K(KVG_TYPE_IQ4_NL, KVG_ACT_QB, x2_iq4_nl, r_iq4_nl), K(KVG_TYPE_Q2_K, KVG_ACT_QK, x2_q2_k, NULL),
    K(KVG_TYPE_Q3_K, KVG_ACT_QK, x2_q3_k, NULL),     K(KVG_TYPE_Q4_K, KVG_ACT_QK, x2_q4_k, NULL),
    K(KVG_TYPE_Q5_K, KVG_ACT_QK, x2_q5_k, NULL),     K(KVG_TYPE_Q6_K, KVG_ACT_QK, x2_q6_k, NULL),
    K(KVG_TYPE_Q8_K, KVG_ACT_QK, x2_q8_k, NULL),     K(KVG_TYPE_IQ4_XS, KVG_ACT_QK, x2_iq4_xs, NULL),
};
/* the K types keep their AVX2 loops (see the top) */
static const kvg_qdot_kernel AVX512_TABLE[N_KERNELS] = {
    K(KVG_TYPE_F32, KVG_ACT_F32, x5_f32, NULL),      K(KVG_TYPE_F16, KVG_ACT_F32, x5_f16, NULL),
    K(KVG_TYPE_BF16, KVG_ACT_F32, x5_bf16, NULL),    K(KVG_TYPE_Q8_0, KVG_ACT_QB, x5_q8_0, r_q8_0),
    K(KVG_TYPE_Q4_0, KVG_ACT_QB, x5_q4_0, r_q4_0),     K(KVG_TYPE_Q4_1, KVG_ACT_QB, x5_q4_1, r_q4_1),
    K(KVG_TYPE_Q5_0, KVG_ACT_QB, x5_q5_0, r_q5_0),     K(KVG_TYPE_Q5_1, KVG_ACT_QB, x5_q5_1, r_q5_1),
    K(KVG_TYPE_IQ4_NL, KVG_ACT_QB, x5_iq4_nl, r_iq4_nl), K(KVG_TYPE_Q2_K, KVG_ACT_QK, x2_q2_k, NULL),
    K(KVG_TYPE_Q3_K, KVG_ACT_QK, x2_q3_k, NULL),     K(KVG_TYPE_Q4_K, KVG_ACT_QK, x2_q4_k, NULL),
    K(KVG_TYPE_Q5_K, KVG_ACT_QK, x2_q5_k, NULL),     K(KVG_TYPE_Q6_K, KVG_ACT_QK, x2_q6_k, NULL),
    K(KVG_TYPE_Q8_K, KVG_ACT_QK, x2_q8_k, NULL),     K(KVG_TYPE_IQ4_XS, KVG_ACT_QK, x2_iq4_xs, NULL),
};
static const kvg_qdot_kernel AVX512_VNNI_TABLE[N_KERNELS] = {
    K(KVG_TYPE_F32, KVG_ACT_F32, x5_f32, NULL),      K(KVG_TYPE_F16, KVG_ACT_F32, x5_f16, NULL),
    K(KVG_TYPE_BF16, KVG_ACT_F32, x5_bf16, NULL),    K(KVG_TYPE_Q8_0, KVG_ACT_QB, xv_q8_0, r_q8_0),
    K(KVG_TYPE_Q4_0, KVG_ACT_QB, xv_q4_0, r_q4_0),     K(KVG_TYPE_Q4_1, KVG_ACT_QB, xv_q4_1, r_q4_1),
    K(KVG_TYPE_Q5_0, KVG_ACT_QB, xv_q5_0, r_q5_0),     K(KVG_TYPE_Q5_1, KVG_ACT_QB, xv_q5_1, r_q5_1),
    K(KVG_TYPE_IQ4_NL, KVG_ACT_QB, xv_iq4_nl, r_iq4_nl), K(KVG_TYPE_Q2_K, KVG_ACT_QK, x2_q2_k, NULL),
    K(KVG_TYPE_Q3_K, KVG_ACT_QK, x2_q3_k, NULL),     K(KVG_TYPE_Q4_K, KVG_ACT_QK, x2_q4_k, NULL),
    K(KVG_TYPE_Q5_K, KVG_ACT_QK, x2_q5_k, NULL),     K(KVG_TYPE_Q6_K, KVG_ACT_QK, x2_q6_k, NULL),
    K(KVG_TYPE_Q8_K, KVG_ACT_QK, x2_q8_k, NULL),     K(KVG_TYPE_IQ4_XS, KVG_ACT_QK, x2_iq4_xs, NULL),
};
/* avx512vnni: the 32-element types in row groups, against split 16-bit activations (GROUPS_QS)
 * or 8-bit ones (GROUPS_Q8, kvg_qdot_kernel_fast); every other type as the avx512 path on a
 * VNNI CPU */
#define GROUP_ROW(type, t, act, p, g) {type, act, p##_##t, r_##t, g##_##t, g_##t, gb_##t}
/* the K types' rows read the file's layout (no repack) */
#define K_GROUP_ROW(type, t, act, p, g) {type, act, p##_##t, NULL, g##_##t, g_##t, gb_##t}
#define GROUP_TABLE(act, p, g)                                                                  \
    {GROUP_ROW(KVG_TYPE_Q8_0, q8_0, act, p, g), GROUP_ROW(KVG_TYPE_Q4_0, q4_0, act, p, g),      \
     GROUP_ROW(KVG_TYPE_Q4_1, q4_1, act, p, g), GROUP_ROW(KVG_TYPE_Q5_0, q5_0, act, p, g),      \
     GROUP_ROW(KVG_TYPE_Q5_1, q5_1, act, p, g), GROUP_ROW(KVG_TYPE_IQ4_NL, iq4_nl, act, p, g),  \
     K_GROUP_ROW(KVG_TYPE_Q2_K, q2_k, act, p, g), K_GROUP_ROW(KVG_TYPE_Q3_K, q3_k, act, p, g),  \
     K_GROUP_ROW(KVG_TYPE_Q4_K, q4_k, act, p, g), K_GROUP_ROW(KVG_TYPE_Q5_K, q5_k, act, p, g),  \
     K_GROUP_ROW(KVG_TYPE_Q6_K, q6_k, act, p, g), K_GROUP_ROW(KVG_TYPE_IQ4_XS, iq4_xs, act, p, g)}
enum { N_GROUP_KERNELS = 12 };
static const kvg_qdot_kernel GROUPS_QS[N_GROUP_KERNELS] = GROUP_TABLE(KVG_ACT_QS, ps, gs);
static const kvg_qdot_kernel GROUPS_Q8[N_GROUP_KERNELS] = GROUP_TABLE(KVG_ACT_Q8, p8, gv);
#endif

#ifdef KVG_ARM
static const kvg_qdot_kernel NEON_TABLE[N_KERNELS] = {
    K(KVG_TYPE_F32, KVG_ACT_F32, n_f32, NULL),       K(KVG_TYPE_F16, KVG_ACT_F32, n_f16, NULL),
    K(KVG_TYPE_BF16, KVG_ACT_F32, n_bf16, NULL),     K(KVG_TYPE_Q8_0, KVG_ACT_QB, n_q8_0, r_q8_0),
    K(KVG_TYPE_Q4_0, KVG_ACT_QB, n_q4_0, r_q4_0),      K(KVG_TYPE_Q4_1, KVG_ACT_QB, n_q4_1, r_q4_1),
    K(KVG_TYPE_Q5_0, KVG_ACT_QB, n_q5_0, r_q5_0),      K(KVG_TYPE_Q5_1, KVG_ACT_QB, n_q5_1, r_q5_1),
    K(KVG_TYPE_IQ4_NL, KVG_ACT_QB, n_iq4_nl, r_iq4_nl),  K(KVG_TYPE_Q2_K, KVG_ACT_QK, n_q2_k, NULL),
    K(KVG_TYPE_Q3_K, KVG_ACT_QK, n_q3_k, NULL),      K(KVG_TYPE_Q4_K, KVG_ACT_QK, n_q4_k, NULL),
    K(KVG_TYPE_Q5_K, KVG_ACT_QK, n_q5_k, NULL),      K(KVG_TYPE_Q6_K, KVG_ACT_QK, n_q6_k, NULL),
    K(KVG_TYPE_Q8_K, KVG_ACT_QK, n_q8_k, NULL),      K(KVG_TYPE_IQ4_XS, KVG_ACT_QK, n_iq4_xs, NULL),
};
/* the float types keep the neon loops (no integer products to dot) */
static const kvg_qdot_kernel DOTPROD_TABLE[N_KERNELS] = {
    K(KVG_TYPE_F32, KVG_ACT_F32, n_f32, NULL),       K(KVG_TYPE_F16, KVG_ACT_F32, n_f16, NULL),
    K(KVG_TYPE_BF16, KVG_ACT_F32, n_bf16, NULL),     K(KVG_TYPE_Q8_0, KVG_ACT_QB, d_q8_0, r_q8_0),
    K(KVG_TYPE_Q4_0, KVG_ACT_QB, d_q4_0, r_q4_0),      K(KVG_TYPE_Q4_1, KVG_ACT_QB, d_q4_1, r_q4_1),
    K(KVG_TYPE_Q5_0, KVG_ACT_QB, d_q5_0, r_q5_0),      K(KVG_TYPE_Q5_1, KVG_ACT_QB, d_q5_1, r_q5_1),
    K(KVG_TYPE_IQ4_NL, KVG_ACT_QB, d_iq4_nl, r_iq4_nl),  K(KVG_TYPE_Q2_K, KVG_ACT_QK, d_q2_k, NULL),
    K(KVG_TYPE_Q3_K, KVG_ACT_QK, d_q3_k, NULL),      K(KVG_TYPE_Q4_K, KVG_ACT_QK, d_q4_k, NULL),
    K(KVG_TYPE_Q5_K, KVG_ACT_QK, d_q5_k, NULL),      K(KVG_TYPE_Q6_K, KVG_ACT_QK, d_q6_k, NULL),
    K(KVG_TYPE_Q8_K, KVG_ACT_QK, d_q8_k, NULL),      K(KVG_TYPE_IQ4_XS, KVG_ACT_QK, d_iq4_xs, NULL),
};
#endif

static const kvg_qdot_kernel *table_of(kvg_cpu_isa isa) {
#ifdef KVG_X86
    if (isa == KVG_ISA_AVX512VNNI) return AVX512_VNNI_TABLE; /* the types without groups */
    if (isa == KVG_ISA_AVX512) return kvg_cpu_features_get()->avx512vnni ? AVX512_VNNI_TABLE : AVX512_TABLE;
    if (isa == KVG_ISA_AVX2) return AVX2_TABLE;
#endif
#ifdef KVG_ARM
    if (isa == KVG_ISA_DOTPROD) return DOTPROD_TABLE;
    if (isa == KVG_ISA_NEON) return NEON_TABLE;
#endif
    (void)isa;
    return PORTABLE;
}

static const kvg_qdot_kernel *find(const kvg_qdot_kernel *t, int n, uint32_t type) {
    for (int i = 0; i < n; i++)
        if (t[i].type == type) return &t[i];
    return NULL;
}

const kvg_qdot_kernel *kvg_qdot_kernel_of(kvg_cpu_isa isa, uint32_t type) {
#ifdef KVG_X86
    const kvg_qdot_kernel *g = isa == KVG_ISA_AVX512VNNI ? find(GROUPS_QS, N_GROUP_KERNELS, type) : NULL;
    if (g) return g;
#endif
    return find(table_of(isa), N_KERNELS, type);
}

const kvg_qdot_kernel *kvg_qdot_kernel_fast(kvg_cpu_isa isa, uint32_t type) {
#ifdef KVG_X86
    const kvg_qdot_kernel *g = isa == KVG_ISA_AVX512VNNI ? find(GROUPS_Q8, N_GROUP_KERNELS, type) : NULL;
    if (g) return g;
#endif
    return kvg_qdot_kernel_of(isa, type);
}

void kvg_qdot_quantize_qb(kvg_cpu_isa isa, const float *x, int n, int16_t *q, float *d, float *s) {
#ifdef KVG_X86
    if (isa == KVG_ISA_AVX2 || isa == KVG_ISA_AVX512 || isa == KVG_ISA_AVX512VNNI) {
        quant_qb_avx2(x, n, q, d, s);
        return;
    }
#endif
#ifdef KVG_ARM
    if (isa == KVG_ISA_NEON || isa == KVG_ISA_DOTPROD) {
        quant_qb_neon(x, n, q, d, s);
        return;
    }
#endif
    quant_qb_portable(x, n, q, d, s);
}

void kvg_qdot_quantize_qk(kvg_cpu_isa isa, const float *x, int n, int16_t *q, float *d, int32_t *bsum) {
#ifdef KVG_X86
    if (isa == KVG_ISA_AVX2 || isa == KVG_ISA_AVX512 || isa == KVG_ISA_AVX512VNNI) {
        quant_qk_avx2(x, n, q, d, bsum);
        return;
    }
#endif
#ifdef KVG_ARM
    if (isa == KVG_ISA_NEON || isa == KVG_ISA_DOTPROD) {
        quant_qk_neon(x, n, q, d, bsum);
        return;
    }
#endif
    quant_qk_portable(x, n, q, d, bsum);
}

void kvg_qdot_quantize_q8(kvg_cpu_isa isa, const float *x, int n, int8_t *lo, int8_t *hi, float *d, float *s) {
#ifdef KVG_X86
    if (isa == KVG_ISA_AVX512VNNI) {
        quant_q8_avx512(x, n, lo, hi, d, s);
        return;
    }
#endif
    (void)isa;
    quant_q8_portable(x, n, lo, hi, d, s);
}
