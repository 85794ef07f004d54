/* quant.c: ggml tensor types: sizes and names, f16/bf16 conversion, quantize, dequantize, dot.
 *
 * Block layouts (little-endian, packed, as ggml stores them; "f16" is an IEEE half):
 *   Q8_0 (34 B / 32):  f16 d, int8 q[32]                  x[i] = q[i] * d
 *   Q4_0 (18 B / 32):  f16 d, uint8 qs[16]                x[i] = (nib[i] - 8) * d
 *   Q4_1 (20 B / 32):  f16 d, f16 m, uint8 qs[16]         x[i] = nib[i] * d + m
 *   Q5_0 (22 B / 32):  f16 d, uint32 qh, uint8 qs[16]     x[i] = (q5[i] - 16) * d
 *   Q5_1 (24 B / 32):  f16 d, f16 m, uint32 qh, qs[16]    x[i] = q5[i] * d + m
 *   IQ4_NL (18 B / 32): f16 d, uint8 qs[16]               x[i] = KV[nib[i]] * d
 * where nib[i] is the low nibble of qs[i] for i < 16 and the high nibble of qs[i-16] for i >= 16,
 * q5[i] = nib[i] | (bit i of qh) << 4, and KV is the fixed non-linear table of IQ4_NL
 * {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}.
 *
 * The K types have 256-element super-blocks of 16 or 32-element sub-blocks, each with its own
 * small integer scale (and min) multiplied by the super-block's f16 d (and dmin). In every
 * "bit-plane" field below, element e = 128*h + 32*s + l (h = e / 128) of a 2-bit field sits in
 * bits 2s..2s+1 of byte 32*h + l, and a 1-bit field (hmask, qh of Q5_K) holds element 32*s + l in
 * bit s of byte l.
 *   Q2_K (84 B):  uint8 scales[16], qs[64], f16 d, f16 dmin; 16 sub-blocks j of 16
 *                 x[e] = (d * (scales[j] & 15)) * q2[e] - dmin * (scales[j] >> 4)
 *   Q3_K (110 B): uint8 hmask[32], qs[64], scales[12], f16 d; 16 sub-blocks j of 16
 *                 x[e] = (d * (u[j] - 32)) * (q2[e] - (hmask bit of e ? 0 : 4)), where the 6-bit
 *                 u[j] = low nibble of scales[j] (j < 8) or high nibble of scales[j-8] (j >= 8),
 *                 | bits 2(j/4)..2(j/4)+1 of scales[8 + j%4], << 4
 *   Q4_K (144 B): f16 d, f16 dmin, uint8 scales[12], qs[128]; 8 sub-blocks j of 32
 *                 x[e] = (d * sc[j]) * q4[e] - dmin * mn[j], q4[e] = nibble (e/32)%2 of
 *                 qs[32*(e/64) + e%32]; the 6-bit sc and mn: for j < 4 sc[j] = scales[j] & 63,
 *                 mn[j] = scales[j+4] & 63; for j >= 4 sc[j] = (scales[j+4] & 15) | (scales[j-4] >> 6) << 4,
 *                 mn[j] = (scales[j+4] >> 4) | (scales[j] >> 6) << 4
 *   Q5_K (176 B): f16 d, f16 dmin, uint8 scales[12], qh[32], qs[128]; as Q4_K with
 *                 q5[e] = q4[e] | (qh bit of e) << 4
 *   Q6_K (210 B): uint8 ql[128], qh[64], int8 scales[16], f16 d; 16 sub-blocks j of 16
 *                 x[e] = (d * scales[j]) * ((lo4 | q2[e] << 4) - 32), lo4 = nibble (e%128)/64 of
 *                 ql[64*(e/128) + e%64], q2 from qh as above
 *   Q8_K (292 B): f32 d, int8 q[256], int16 bsums[16]     x[e] = d * q[e]; bsums[j] is the sum of
 *                 q[16j..16j+15] (ggml's K dot products use it; dequantizing does not)
 *   IQ4_XS (136 B): f16 d, uint16 scales_h, uint8 scales_l[4], qs[128]; 8 sub-blocks j of 32
 *                 x[32j + i] = (d * (u[j] - 32)) * KV[nibble of qs[16j + i%16], low for i < 16],
 *                 u[j] = nibble j%2 of scales_l[j/2] | bits 2j..2j+1 of scales_h << 4
 *
 * Dequantization follows the formulas in exactly this order of f32 operations (the products in
 * parentheses first; no fused multiply-add: core/CMakeLists.txt compiles this file with
 * -ffp-contract=off), so it is bit-identical with gguf-py's numpy code (core/tests/fixtures/quant).
 * Quantizing Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 gives gguf-py's bytes; the K and IQ4 quantizers are
 * kvgen's own (per block: a few trial scales, each refitted by least squares to its levels). */
#include "kvg_quant.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- half precision ---- */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Branch-free so the dot product's conversion loop vectorises: the half's exponent and mantissa,
 * placed in an f32's bit positions, read 2^112 too small (subnormal halves land on f32 subnormals),
 * so one multiply fixes the scale; inf and NaN (exponent all ones) take the all-ones f32 exponent. */
static inline float f16_to_f32(uint16_t h) {
    uint32_t em = (uint32_t)(h & 0x7fffu) << 13;
    float scaled = bits_f32(em) * 0x1p112f;
    uint32_t special = 0u - (uint32_t)((h & 0x7c00u) == 0x7c00u); /* all ones for inf and NaN */
    uint32_t u = (f32_bits(scaled) & ~special) | ((em | 0x7f800000u) & special);
    return bits_f32(u | ((uint32_t)(h & 0x8000u) << 16));
}

float kvg_f16_to_f32(uint16_t h) { return f16_to_f32(h); }

uint16_t kvg_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u) {
        if (abs == 0x7f800000u) return sign | 0x7c00u;
        /* NaN: keep the top payload bits and force quiet so it cannot become inf */
        return (uint16_t)(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
    }
    if (abs >= 0x477ff000u) return sign | 0x7c00u; /* rounds past 65504 */
    if (abs >= 0x38800000u) {                      /* normal half (>= 2^-14) */
        uint32_t mant = abs & 0x7fffffu;
        uint32_t exp = (abs >> 23) - 112;
        uint32_t h = (exp << 10) | (mant >> 13);
        uint32_t rest = mant & 0x1fffu;
        /* round to nearest, ties to even; a carry into the exponent is still correct */
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    if (abs < 0x33000000u) return sign; /* below half the smallest subnormal (2^-25): zero */
    /* subnormal half: value = m * 2^-24 with the implicit bit made explicit */
    uint32_t exp = abs >> 23;           /* 102..112 */
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;         /* 14..24 */
    uint32_t h = mant >> shift;
    uint32_t rest = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

float kvg_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t kvg_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even; overflow correctly reaches inf */
    return (uint16_t)(u >> 16);
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static void wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

/* ---- quantize ---- */

static void quantize_q8_0(const float *x, uint8_t *blk) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    wr16(blk, kvg_f32_to_f16(d));
    int8_t *q = (int8_t *)(blk + 2);
    for (int i = 0; i < 32; i++) {
        float v = roundf(x[i] * id);
        q[i] = (int8_t)(v >= -127.0f && v <= 127.0f ? (int)v : v > 0.0f ? 127 : v < 0.0f ? -127 : 0);
    }
}

/* float to nibble without the undefined behaviour of converting NaN or huge values to int */
static int to_nibble(float v) {
    if (!(v >= 0.0f)) return 0;
    if (v >= 15.0f) return 15;
    return (int)v;
}

static void quantize_q4_0(const float *x, uint8_t *blk) {
    /* the signed extreme maps to -8 so the full range [-8, 7] is used */
    float amax = 0.0f, extreme = 0.0f;
    for (int i = 0; i < 32; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            extreme = x[i];
        }
    }
    float d = extreme / -8.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    wr16(blk, kvg_f32_to_f16(d));
    uint8_t *qs = blk + 2;
    for (int i = 0; i < 16; i++) {
        int lo = to_nibble(x[i] * id + 8.5f), hi = to_nibble(x[i + 16] * id + 8.5f);
        qs[i] = (uint8_t)(lo | (hi << 4));
    }
}

static void quantize_q4_1(const float *x, uint8_t *blk) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    float d = (hi - lo) / 15.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    wr16(blk, kvg_f32_to_f16(d));
    wr16(blk + 2, kvg_f32_to_f16(lo));
    uint8_t *qs = blk + 4;
    for (int i = 0; i < 16; i++) {
        int a = to_nibble((x[i] - lo) * id + 0.5f), b = to_nibble((x[i + 16] - lo) * id + 0.5f);
        qs[i] = (uint8_t)(a | (b << 4));
    }
}

static void from_float_f32(const float *src, uint8_t *dst, uint64_t n) { memcpy(dst, src, (size_t)n * 4); }
static void from_float_f16(const float *src, uint8_t *dst, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) wr16(dst + 2 * i, kvg_f32_to_f16(src[i]));
}
static void from_float_bf16(const float *src, uint8_t *dst, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) wr16(dst + 2 * i, kvg_f32_to_bf16(src[i]));
}
static void from_float_q8_0(const float *src, uint8_t *dst, uint64_t n) {
    for (uint64_t b = 0; b < n / 32; b++) quantize_q8_0(src + 32 * b, dst + KVG_Q8_0_BYTES * b);
}
static void from_float_q4_0(const float *src, uint8_t *dst, uint64_t n) {
    for (uint64_t b = 0; b < n / 32; b++) quantize_q4_0(src + 32 * b, dst + KVG_Q4_0_BYTES * b);
}
static void from_float_q4_1(const float *src, uint8_t *dst, uint64_t n) {
    for (uint64_t b = 0; b < n / 32; b++) quantize_q4_1(src + 32 * b, dst + KVG_Q4_1_BYTES * b);
}

/* ---- dequantize ---- */

static void to_float_f32(const uint8_t *src, float *dst, uint64_t n) { memcpy(dst, src, (size_t)n * 4); }
static void to_float_f16(const uint8_t *src, float *dst, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) dst[i] = kvg_f16_to_f32(rd16(src + 2 * i));
}
static void to_float_bf16(const uint8_t *src, float *dst, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) dst[i] = kvg_bf16_to_f32(rd16(src + 2 * i));
}
static void to_float_q8_0(const uint8_t *src, float *dst, uint64_t n) {
    for (uint64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = src + KVG_Q8_0_BYTES * b;
        float d = kvg_f16_to_f32(rd16(blk));
        const int8_t *q = (const int8_t *)(blk + 2);
        for (int i = 0; i < 32; i++) dst[32 * b + i] = (float)q[i] * d;
    }
}
static void to_float_q4_0(const uint8_t *src, float *dst, uint64_t n) {
    for (uint64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = src + KVG_Q4_0_BYTES * b;
        float d = kvg_f16_to_f32(rd16(blk));
        for (int i = 0; i < 16; i++) {
            dst[32 * b + i] = (float)((blk[2 + i] & 0x0f) - 8) * d;
            dst[32 * b + i + 16] = (float)((blk[2 + i] >> 4) - 8) * d;
        }
    }
}
static void to_float_q4_1(const uint8_t *src, float *dst, uint64_t n) {
    for (uint64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = src + KVG_Q4_1_BYTES * b;
        float d = kvg_f16_to_f32(rd16(blk)), m = kvg_f16_to_f32(rd16(blk + 2));
        for (int i = 0; i < 16; i++) {
            dst[32 * b + i] = (float)(blk[4 + i] & 0x0f) * d + m;
            dst[32 * b + i + 16] = (float)(blk[4 + i] >> 4) * d + m;
        }
    }
}

/* ---- dot products ----
 * Float addition is not associative, so gcc will not vectorise a single running sum without
 * -ffast-math. Each loop keeps LANES independent partial sums instead: that is exactly the shape
 * the vectoriser maps onto SIMD registers. */
#define LANES 8

static float hsum(const float *acc) {
    float s = 0.0f;
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

static float ld32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* rows are read through memcpy: a GGUF with alignment 1 or 2 may leave F32 data unaligned */
static float dot_f32(const uint8_t *a, const float *x, uint64_t n) {
    float acc[LANES] = {0};
    uint64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += ld32(a + 4 * (i + j)) * x[i + j];
    float s = hsum(acc);
    for (; i < n; i++) s += ld32(a + 4 * i) * x[i];
    return s;
}

static float dot_half(bool bf16, const uint8_t *row, const float *x, uint64_t n) {
    float acc[LANES] = {0};
    float tmp[LANES];
    uint64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        if (bf16)
            for (int j = 0; j < LANES; j++) tmp[j] = kvg_bf16_to_f32(rd16(row + 2 * (i + j)));
        else
            for (int j = 0; j < LANES; j++) tmp[j] = f16_to_f32(rd16(row + 2 * (i + j)));
        for (int j = 0; j < LANES; j++) acc[j] += tmp[j] * x[i + j];
    }
    float s = hsum(acc);
    for (; i < n; i++) {
        uint16_t h = rd16(row + 2 * i);
        s += (bf16 ? kvg_bf16_to_f32(h) : f16_to_f32(h)) * x[i];
    }
    return s;
}

/* 32 block values (before scaling) against 32 activations */
static float dot32(const float *v, const float *x) {
    float acc[LANES] = {0};
    for (int i = 0; i < 32; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += v[i + j] * x[i + j];
    return hsum(acc);
}

/* The blocks are unpacked to floats first: separate simple loops vectorise where one fused
 * integer-and-float loop does not. */
static float dot_q8_0(const uint8_t *row, const float *x, uint64_t n) {
    float total = 0.0f, v[32];
    for (uint64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = row + KVG_Q8_0_BYTES * b;
        const int8_t *q = (const int8_t *)(blk + 2);
        for (int i = 0; i < 32; i++) v[i] = (float)q[i];
        total += f16_to_f32(rd16(blk)) * dot32(v, x + 32 * b);
    }
    return total;
}

static void unpack_nibbles(const uint8_t *restrict qs, float *restrict v, int offset) {
    for (int i = 0; i < 16; i++) {
        v[i] = (float)((qs[i] & 0x0f) - offset);
        v[i + 16] = (float)((qs[i] >> 4) - offset);
    }
}

static float dot_q4_0(const uint8_t *row, const float *x, uint64_t n) {
    float total = 0.0f, v[32];
    for (uint64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = row + KVG_Q4_0_BYTES * b;
        unpack_nibbles(blk + 2, v, 8);
        total += f16_to_f32(rd16(blk)) * dot32(v, x + 32 * b);
    }
    return total;
}

static float dot_q4_1(const uint8_t *row, const float *x, uint64_t n) {
    float total = 0.0f, v[32];
    for (uint64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = row + KVG_Q4_1_BYTES * b;
        const float *xb = x + 32 * b;
        unpack_nibbles(blk + 4, v, 0);
        float xs[LANES] = {0};
        for (int i = 0; i < 32; i += LANES)
            for (int j = 0; j < LANES; j++) xs[j] += xb[i + j];
        /* sum((nib*d + m) * x) = d * sum(nib*x) + m * sum(x) */
        total += f16_to_f32(rd16(blk)) * dot32(v, xb) + f16_to_f32(rd16(blk + 2)) * hsum(xs);
    }
    return total;
}

static float dot_f16(const uint8_t *row, const float *x, uint64_t n) { return dot_half(false, row, x, n); }
static float dot_bf16(const uint8_t *row, const float *x, uint64_t n) { return dot_half(true, row, x, n); }

/* ---- 5-bit, K and IQ4 types ----
 * Each has a block decoder (one block to floats: the formula of the layout comment at the top,
 * in that order of f32 operations), a block encoder, and row functions that loop over blocks. */

#define QK_K 256

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static float rdh(const uint8_t *p) { return f16_to_f32(rd16(p)); }

/* IQ4_NL's (and IQ4_XS's) 16 levels */
static const int8_t KV_IQ4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* the 2-bit field of element e (bit planes, see the top) and the 1-bit one */
static int bits2(const uint8_t *q, int e) { return (q[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3; }
static int bit1(const uint8_t *q, int e) { return (q[e % 32] >> (e / 32)) & 1; }
static void put_bits2(uint8_t *q, int e, int v) {
    q[32 * (e / 128) + e % 32] |= (uint8_t)((v & 3) << (2 * ((e / 32) % 4)));
}
static void put_bit1(uint8_t *q, int e, int v) { q[e % 32] |= (uint8_t)((v & 1) << (e / 32)); }

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j */
static void k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}
static void k_put_scale_min(uint8_t *s, const int *sc, const int *mn) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)((mn[j] & 63) | (mn[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
}
/* Q3_K: the 6-bit (biased by 32) scale of sub-block j */
static int q3k_scale(const uint8_t *s, int j) {
    int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
    return lo | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4;
}
/* IQ4_XS: the 6-bit (biased by 32) scale of sub-block j */
static int iq4xs_scale(const uint8_t *b, int j) {
    return ((b[4 + j / 2] >> (4 * (j % 2))) & 15) | ((rd16(b + 2) >> (2 * j)) & 3) << 4;
}

static void dec_q5_0(const uint8_t *b, float *y) {
    float d = rdh(b);
    uint32_t qh = rd32(b + 2);
    for (int i = 0; i < 16; i++) {
        int lo = (b[6 + i] & 15) | (int)((qh >> i) & 1) << 4, hi = (b[6 + i] >> 4) | (int)((qh >> (i + 16)) & 1) << 4;
        y[i] = d * (float)(lo - 16);
        y[i + 16] = d * (float)(hi - 16);
    }
}
static void dec_q5_1(const uint8_t *b, float *y) {
    float d = rdh(b), m = rdh(b + 2);
    uint32_t qh = rd32(b + 4);
    for (int i = 0; i < 16; i++) {
        int lo = (b[8 + i] & 15) | (int)((qh >> i) & 1) << 4, hi = (b[8 + i] >> 4) | (int)((qh >> (i + 16)) & 1) << 4;
        y[i] = d * (float)lo + m;
        y[i + 16] = d * (float)hi + m;
    }
}
static void dec_iq4_nl(const uint8_t *b, float *y) {
    float d = rdh(b);
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)KV_IQ4[b[2 + i] & 15];
        y[i + 16] = d * (float)KV_IQ4[b[2 + i] >> 4];
    }
}
static void dec_q2_k(const uint8_t *b, float *y) {
    float d = rdh(b + 80), dmin = rdh(b + 82);
    for (int j = 0; j < 16; j++) {
        float dl = d * (float)(b[j] & 15), ml = dmin * (float)(b[j] >> 4);
        for (int e = 16 * j; e < 16 * j + 16; e++) y[e] = dl * (float)bits2(b + 16, e) - ml;
    }
}
static void dec_q3_k(const uint8_t *b, float *y) {
    float d = rdh(b + 108);
    for (int j = 0; j < 16; j++) {
        float dl = d * (float)(q3k_scale(b + 96, j) - 32);
        for (int e = 16 * j; e < 16 * j + 16; e++)
            y[e] = dl * (float)(bits2(b + 32, e) - (bit1(b, e) ? 0 : 4));
    }
}
static void dec_q4_k(const uint8_t *b, float *y) {
    float d = rdh(b), dmin = rdh(b + 2);
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        k_scale_min(b + 4, j, &sc, &mn);
        float dl = d * (float)sc, ml = dmin * (float)mn;
        const uint8_t *qs = b + 16 + 32 * (j / 2);
        for (int l = 0; l < 32; l++) y[32 * j + l] = dl * (float)((qs[l] >> (4 * (j % 2))) & 15) - ml;
    }
}
static void dec_q5_k(const uint8_t *b, float *y) {
    float d = rdh(b), dmin = rdh(b + 2);
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        k_scale_min(b + 4, j, &sc, &mn);
        float dl = d * (float)sc, ml = dmin * (float)mn;
        const uint8_t *qs = b + 48 + 32 * (j / 2);
        for (int l = 0; l < 32; l++) {
            int q = ((qs[l] >> (4 * (j % 2))) & 15) | bit1(b + 16, 32 * j + l) << 4;
            y[32 * j + l] = dl * (float)q - ml;
        }
    }
}
static void dec_q6_k(const uint8_t *b, float *y) {
    float d = rdh(b + 208);
    for (int j = 0; j < 16; j++) {
        float dl = d * (float)(int8_t)b[192 + j];
        for (int e = 16 * j; e < 16 * j + 16; e++) {
            int lo = (b[64 * (e / 128) + e % 64] >> (4 * ((e % 128) / 64))) & 15;
            y[e] = dl * (float)((lo | bits2(b + 128, e) << 4) - 32);
        }
    }
}
static void dec_q8_k(const uint8_t *b, float *y) {
    float d = ld32(b);
    for (int e = 0; e < QK_K; e++) y[e] = d * (float)(int8_t)b[4 + e];
}
static void dec_iq4_xs(const uint8_t *b, float *y) {
    float d = rdh(b);
    for (int j = 0; j < 8; j++) {
        float dl = d * (float)(iq4xs_scale(b, j) - 32);
        const uint8_t *qs = b + 8 + 16 * j;
        for (int i = 0; i < 16; i++) {
            y[32 * j + i] = dl * (float)KV_IQ4[qs[i] & 15];
            y[32 * j + 16 + i] = dl * (float)KV_IQ4[qs[i] >> 4];
        }
    }
}

/* -- quantizing: Q5_0 and Q5_1 as gguf-py (byte for byte); the others fit scales per block -- */

/* float to an integer in [0, hi] the way gguf-py does (truncation after its +0.5 or +16.5
 * offset), without the undefined behaviour of converting NaN or huge values to int */
static int trunc_clamp(float v, int hi) {
    if (!(v >= 0.0f)) return 0;
    if (v >= (float)hi) return hi;
    return (int)v;
}
/* nearest integer (ties away from zero) clamped to [lo, hi]; NaN gives lo */
static int round_clamp(float v, int lo, int hi) {
    if (!(v > (float)lo)) return lo;
    if (v >= (float)hi) return hi;
    return (int)roundf(v);
}

static void pack_q5(const int *q, uint8_t *qh4, uint8_t *qs) {
    uint32_t qh = 0;
    for (int i = 0; i < 16; i++) qs[i] = (uint8_t)((q[i] & 15) | (q[i + 16] & 15) << 4);
    for (int i = 0; i < 32; i++) qh |= (uint32_t)((q[i] >> 4) & 1) << i;
    wr32(qh4, qh);
}

static void enc_q5_0(const float *x, uint8_t *b) {
    float amax = 0.0f, extreme = 0.0f;
    for (int i = 0; i < 32; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            extreme = x[i];
        }
    float d = extreme / -16.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[32];
    for (int i = 0; i < 32; i++) q[i] = trunc_clamp(x[i] * id + 16.5f, 31);
    wr16(b, kvg_f32_to_f16(d));
    pack_q5(q, b + 2, b + 6);
}
static void enc_q5_1(const float *x, uint8_t *b) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    float d = (hi - lo) / 31.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[32];
    for (int i = 0; i < 32; i++) q[i] = trunc_clamp((x[i] - lo) * id + 0.5f, 31);
    wr16(b, kvg_f32_to_f16(d));
    wr16(b + 2, kvg_f32_to_f16(lo));
    pack_q5(q, b + 4, b + 8);
}

/* a scale as an f16, saturating instead of overflowing to infinity; returned as stored */
static float store_f16(uint8_t *p, float v) {
    if (v > 65504.0f) v = 65504.0f;
    if (v < -65504.0f) v = -65504.0f;
    wr16(p, kvg_f32_to_f16(v));
    return rdh(p);
}

/* Affine sub-blocks (Q2_K, Q4_K, Q5_K): x ~ s * q - m with q in [0, nmax], s >= 0 and m >= 0
 * (ggml's convention: the min is at most 0). The idea of ggml's reference quantizer: try a few
 * scales around (max - min) / nmax, give each element its nearest level, fit s and m to those
 * levels by least squares, and keep the fit with the smallest squared error (for its levels). */
static void fit_affine(const float *x, int n, int nmax, float *s_out, float *m_out) {
    float lo = x[0], hi = x[0];
    double sx = 0, sxx = 0;
    for (int i = 0; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
        sx += x[i];
        sxx += (double)x[i] * x[i];
    }
    if (lo > 0.0f) lo = 0.0f;
    *s_out = 0.0f;
    *m_out = -lo;
    if (!(hi > lo)) return; /* constant (or NaN) block: the min alone */
    *s_out = (hi - lo) / (float)nmax;
    double best = INFINITY;
    for (int k = -10; k <= 10; k++) {
        float is = ((float)nmax + 0.1f * (float)k) / (hi - lo);
        if (!(is > 0.0f)) continue;
        double sq = 0, sqq = 0, sxq = 0;
        for (int i = 0; i < n; i++) {
            float v = (x[i] - lo) * is + 0.5f; /* >= 0.5: truncation rounds */
            int q = v < (float)nmax ? (int)v : nmax;
            sq += q;
            sqq += (double)q * q;
            sxq += (double)x[i] * q;
        }
        double den = n * sqq - sq * sq;
        if (!(den > 0)) continue;
        double a = (n * sxq - sq * sx) / den, c = (sx - a * sq) / n; /* x ~ a q + c */
        if (c > 0) { /* the offset may only lower the levels */
            c = 0;
            a = sxq / sqq;
        }
        if (!(a > 0)) continue;
        /* sum (a q + c - x)^2, expanded */
        double err = a * a * sqq + n * c * c + sxx + 2 * a * c * sq - 2 * a * sxq - 2 * c * sx;
        if (err < best) {
            best = err;
            *s_out = (float)a;
            *m_out = (float)-c;
        }
    }
}

/* the level q in [0, nmax] whose value dl * q - ml (as dequantizing computes it) is nearest x */
static int nearest_affine(float x, float dl, float ml, int nmax) {
    int q0 = dl > 0.0f ? round_clamp((x + ml) / dl, 0, nmax) : 0, best = q0;
    float err = fabsf(dl * (float)q0 - ml - x);
    for (int q = q0 - 1; q <= q0 + 1; q += 2) {
        if (q < 0 || q > nmax) continue;
        float e = fabsf(dl * (float)q - ml - x);
        if (e < err) {
            err = e;
            best = q;
        }
    }
    return best;
}

/* Fits nsub sub-blocks of `len` elements (levels 0..nmax), then the super-block's d and dmin so
 * that the sub-block scales and mins are integers in [0, smax]; writes d and dmin at pd, pdmin
 * and returns the integer scales, mins and levels. */
static void quantize_affine_k(const float *x, int nsub, int len, int nmax, int smax, uint8_t *pd, uint8_t *pdmin,
                              int *sc, int *mn, int *q) {
    float s[16], m[16], smx = 0.0f, mmx = 0.0f;
    for (int j = 0; j < nsub; j++) {
        fit_affine(x + len * j, len, nmax, &s[j], &m[j]);
        smx = fmaxf(smx, s[j]);
        mmx = fmaxf(mmx, m[j]);
    }
    float d = store_f16(pd, smx / (float)smax), dmin = store_f16(pdmin, mmx / (float)smax);
    for (int j = 0; j < nsub; j++) {
        sc[j] = d > 0.0f ? round_clamp(s[j] / d, 0, smax) : 0;
        mn[j] = dmin > 0.0f ? round_clamp(m[j] / dmin, 0, smax) : 0;
        float dl = d * (float)sc[j], ml = dmin * (float)mn[j];
        for (int i = len * j; i < len * j + len; i++) q[i] = nearest_affine(x[i], dl, ml, nmax);
    }
}

/* Symmetric sub-blocks (Q3_K, Q6_K, IQ4_NL, IQ4_XS): x ~ s * g with g one of `ng` ascending
 * levels, grid[0] negative and the largest in magnitude. The index of the level nearest t: */
static int nearest_level(float t, const int8_t *grid, int ng) {
    if (!(t > (float)grid[0])) return 0; /* also NaN */
    if (t >= (float)grid[ng - 1]) return ng - 1;
    if (grid[ng - 1] - grid[0] == ng - 1) return (int)(t - (float)grid[0] + 0.5f); /* consecutive integers */
    int k = 0; /* the midpoints below t, counted without branches */
    for (int i = 0; i + 1 < ng; i++) k += t > 0.5f * (float)(grid[i] + grid[i + 1]);
    return k;
}

/* trial scales that map the extreme value to grid[0] * (1 + 0.03k), each refitted by least
 * squares to its levels; the scale with the smallest squared error for its levels */
static float fit_symmetric(const float *x, int n, const int8_t *grid, int ng) {
    float amax = 0.0f, extreme = 0.0f;
    double sxx = 0;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            extreme = x[i];
        }
        sxx += (double)x[i] * x[i];
    }
    if (!(amax > 0.0f)) return 0.0f;
    float best_s = extreme / (float)grid[0];
    double best = INFINITY;
    for (int k = -10; k <= 10; k++) {
        float is = (float)grid[0] * (1.0f + 0.03f * (float)k) / extreme;
        double sxg = 0, sgg = 0;
        for (int i = 0; i < n; i++) {
            int g = grid[nearest_level(x[i] * is, grid, ng)];
            sxg += (double)x[i] * g;
            sgg += (double)g * g;
        }
        if (!(sgg > 0) || sxg == 0) continue;
        double err = sxx - sxg * sxg / sgg; /* sum (s g - x)^2 at s = sxg / sgg */
        if (err < best) {
            best = err;
            best_s = (float)(sxg / sgg);
        }
    }
    return best_s;
}

/* the level index whose value dl * grid[k] (as dequantizing computes it) is nearest x */
static int nearest_sym(float x, float dl, const int8_t *grid, int ng) {
    if (dl == 0.0f) return nearest_level(0.0f, grid, ng);
    int k0 = nearest_level(x / dl, grid, ng), best = k0;
    float err = fabsf(dl * (float)grid[k0] - x);
    for (int k = k0 - 1; k <= k0 + 1; k += 2) {
        if (k < 0 || k >= ng) continue;
        float e = fabsf(dl * (float)grid[k] - x);
        if (e < err) {
            err = e;
            best = k;
        }
    }
    return best;
}

/* Fits nsub sub-blocks of `len` elements, then the super-block's d so that the sub-block scales
 * are integers in [smin, smax] (smin < 0: the largest sub-block scale maps to smin); writes d at
 * pd and returns the integer scales and level indices. */
static void quantize_sym_k(const float *x, int nsub, int len, const int8_t *grid, int ng, int smin, int smax,
                           uint8_t *pd, int *sc, int *k) {
    float s[16], smx = 0.0f, sext = 0.0f;
    for (int j = 0; j < nsub; j++) {
        s[j] = fit_symmetric(x + len * j, len, grid, ng);
        if (fabsf(s[j]) > smx) {
            smx = fabsf(s[j]);
            sext = s[j];
        }
    }
    float d = store_f16(pd, sext / (float)smin);
    for (int j = 0; j < nsub; j++) {
        sc[j] = d != 0.0f ? round_clamp(s[j] / d, smin, smax) : 0;
        float dl = d * (float)sc[j];
        for (int i = len * j; i < len * j + len; i++) k[i] = nearest_sym(x[i], dl, grid, ng);
    }
}

/* the uniform levels of Q3_K (-4..3) and Q6_K (-32..31) */
static const int8_t GRID_Q3[8] = {-4, -3, -2, -1, 0, 1, 2, 3};
static const int8_t GRID_Q6[64] = {
    -32, -31, -30, -29, -28, -27, -26, -25, -24, -23, -22, -21, -20, -19, -18, -17,
    -16, -15, -14, -13, -12, -11, -10, -9, -8, -7, -6, -5, -4, -3, -2, -1,
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
};

static void enc_iq4_nl(const float *x, uint8_t *b) {
    float s = fit_symmetric(x, 32, KV_IQ4, 16);
    float d = store_f16(b, s);
    for (int i = 0; i < 16; i++)
        b[2 + i] = (uint8_t)(nearest_sym(x[i], d, KV_IQ4, 16) | nearest_sym(x[i + 16], d, KV_IQ4, 16) << 4);
}

static void enc_q2_k(const float *x, uint8_t *b) {
    int sc[16], mn[16], q[QK_K];
    memset(b, 0, KVG_Q2_K_BYTES);
    quantize_affine_k(x, 16, 16, 3, 15, b + 80, b + 82, sc, mn, q);
    for (int j = 0; j < 16; j++) b[j] = (uint8_t)(sc[j] | mn[j] << 4);
    for (int e = 0; e < QK_K; e++) put_bits2(b + 16, e, q[e]);
}
static void enc_q3_k(const float *x, uint8_t *b) {
    int sc[16], k[QK_K];
    memset(b, 0, KVG_Q3_K_BYTES);
    quantize_sym_k(x, 16, 16, GRID_Q3, 8, -32, 31, b + 108, sc, k);
    for (int j = 0; j < 16; j++) {
        int u = sc[j] + 32;
        b[96 + j % 8] |= (uint8_t)((u & 15) << (4 * (j / 8)));
        b[96 + 8 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
    }
    for (int e = 0; e < QK_K; e++) { /* level k is q = k - 4 = low 2 bits - (high bit ? 0 : 4) */
        put_bits2(b + 32, e, k[e] & 3);
        put_bit1(b, e, k[e] >> 2);
    }
}
static void enc_q4_k(const float *x, uint8_t *b) {
    int sc[8], mn[8], q[QK_K];
    memset(b, 0, KVG_Q4_K_BYTES);
    quantize_affine_k(x, 8, 32, 15, 63, b, b + 2, sc, mn, q);
    k_put_scale_min(b + 4, sc, mn);
    for (int e = 0; e < QK_K; e++) b[16 + 32 * (e / 64) + e % 32] |= (uint8_t)(q[e] << (4 * ((e / 32) % 2)));
}
static void enc_q5_k(const float *x, uint8_t *b) {
    int sc[8], mn[8], q[QK_K];
    memset(b, 0, KVG_Q5_K_BYTES);
    quantize_affine_k(x, 8, 32, 31, 63, b, b + 2, sc, mn, q);
    k_put_scale_min(b + 4, sc, mn);
    for (int e = 0; e < QK_K; e++) {
        b[48 + 32 * (e / 64) + e % 32] |= (uint8_t)((q[e] & 15) << (4 * ((e / 32) % 2)));
        put_bit1(b + 16, e, q[e] >> 4);
    }
}
static void enc_q6_k(const float *x, uint8_t *b) {
    int sc[16], k[QK_K];
    memset(b, 0, KVG_Q6_K_BYTES);
    quantize_sym_k(x, 16, 16, GRID_Q6, 64, -128, 127, b + 208, sc, k);
    for (int j = 0; j < 16; j++) b[192 + j] = (uint8_t)(int8_t)sc[j];
    for (int e = 0; e < QK_K; e++) { /* level k is q = k - 32 */
        b[64 * (e / 128) + e % 64] |= (uint8_t)((k[e] & 15) << (4 * ((e % 128) / 64)));
        put_bits2(b + 128, e, k[e] >> 4);
    }
}
static void enc_q8_k(const float *x, uint8_t *b) {
    float amax = 0.0f;
    for (int e = 0; e < QK_K; e++) amax = fmaxf(amax, fabsf(x[e]));
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    memcpy(b, &d, 4);
    for (int j = 0; j < 16; j++) {
        int sum = 0;
        for (int e = 16 * j; e < 16 * j + 16; e++) {
            int q = round_clamp(x[e] * id, -127, 127);
            b[4 + e] = (uint8_t)(int8_t)q;
            sum += q;
        }
        wr16(b + 260 + 2 * j, (uint16_t)(int16_t)sum);
    }
}
static void enc_iq4_xs(const float *x, uint8_t *b) {
    int sc[8], k[QK_K];
    memset(b, 0, KVG_IQ4_XS_BYTES);
    quantize_sym_k(x, 8, 32, KV_IQ4, 16, -32, 31, b, sc, k);
    uint16_t sh = 0;
    for (int j = 0; j < 8; j++) {
        int u = sc[j] + 32;
        b[4 + j / 2] |= (uint8_t)((u & 15) << (4 * (j % 2)));
        sh |= (uint16_t)((u >> 4) << (2 * j));
    }
    wr16(b + 2, sh);
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 16; i++) b[8 + 16 * j + i] = (uint8_t)(k[32 * j + i] | k[32 * j + 16 + i] << 4);
}

/* block-by-block row functions; the dot product decodes a block and dots it in LANES partial
 * sums, so it equals dequantize-then-dot up to the order of the additions */
typedef void (*block_dec)(const uint8_t *blk, float *y);

static float dot_blocks(block_dec dec, uint32_t be, uint32_t bb, const uint8_t *row, const float *x, uint64_t n) {
    float total = 0.0f, v[QK_K];
    for (uint64_t b = 0; b < n / be; b++) {
        dec(row + (size_t)bb * b, v);
        const float *xb = x + (size_t)be * b;
        float acc[LANES] = {0};
        for (uint32_t i = 0; i < be; i += LANES)
            for (int j = 0; j < LANES; j++) acc[j] += v[i + j] * xb[i + j];
        total += hsum(acc);
    }
    return total;
}

#define BLOCK_ROWS(name, be, bb)                                                                  \
    static void to_float_##name(const uint8_t *src, float *dst, uint64_t n) {                     \
        for (uint64_t b = 0; b < n / (be); b++) dec_##name(src + (size_t)(bb) * b, dst + (size_t)(be) * b); \
    }                                                                                             \
    static void from_float_##name(const float *src, uint8_t *dst, uint64_t n) {                   \
        for (uint64_t b = 0; b < n / (be); b++) enc_##name(src + (size_t)(be) * b, dst + (size_t)(bb) * b); \
    }                                                                                             \
    static float dot_##name(const uint8_t *row, const float *x, uint64_t n) {                     \
        return dot_blocks(dec_##name, be, bb, row, x, n);                                         \
    }

BLOCK_ROWS(q5_0, 32, KVG_Q5_0_BYTES)
BLOCK_ROWS(q5_1, 32, KVG_Q5_1_BYTES)
BLOCK_ROWS(iq4_nl, 32, KVG_IQ4_NL_BYTES)
BLOCK_ROWS(q2_k, QK_K, KVG_Q2_K_BYTES)
BLOCK_ROWS(q3_k, QK_K, KVG_Q3_K_BYTES)
BLOCK_ROWS(q4_k, QK_K, KVG_Q4_K_BYTES)
BLOCK_ROWS(q5_k, QK_K, KVG_Q5_K_BYTES)
BLOCK_ROWS(q6_k, QK_K, KVG_Q6_K_BYTES)
BLOCK_ROWS(q8_k, QK_K, KVG_Q8_K_BYTES)
BLOCK_ROWS(iq4_xs, QK_K, KVG_IQ4_XS_BYTES)

/* ---- the type-traits table ----
 * One row per type that kvgen computes with: to add a type, write its three row functions and
 * add its row here; the sizes come from TYPES above. Backends list the types they run in their
 * own tables (kvg_backend_ops.weight_types). */
static const kvg_type_traits TRAITS[] = {
    {KVG_TYPE_F32, to_float_f32, from_float_f32, dot_f32, KVG_TYPE_F32},
    {KVG_TYPE_F16, to_float_f16, from_float_f16, dot_f16, KVG_TYPE_F32},
    {KVG_TYPE_BF16, to_float_bf16, from_float_bf16, dot_bf16, KVG_TYPE_F32},
    {KVG_TYPE_Q8_0, to_float_q8_0, from_float_q8_0, dot_q8_0, KVG_TYPE_F32},
    {KVG_TYPE_Q4_0, to_float_q4_0, from_float_q4_0, dot_q4_0, KVG_TYPE_F32},
    {KVG_TYPE_Q4_1, to_float_q4_1, from_float_q4_1, dot_q4_1, KVG_TYPE_F32},
    {KVG_TYPE_Q5_0, to_float_q5_0, from_float_q5_0, dot_q5_0, KVG_TYPE_F32},
    {KVG_TYPE_Q5_1, to_float_q5_1, from_float_q5_1, dot_q5_1, KVG_TYPE_F32},
    {KVG_TYPE_Q2_K, to_float_q2_k, from_float_q2_k, dot_q2_k, KVG_TYPE_F32},
    {KVG_TYPE_Q3_K, to_float_q3_k, from_float_q3_k, dot_q3_k, KVG_TYPE_F32},
    {KVG_TYPE_Q4_K, to_float_q4_k, from_float_q4_k, dot_q4_k, KVG_TYPE_F32},
    {KVG_TYPE_Q5_K, to_float_q5_k, from_float_q5_k, dot_q5_k, KVG_TYPE_F32},
    {KVG_TYPE_Q6_K, to_float_q6_k, from_float_q6_k, dot_q6_k, KVG_TYPE_F32},
    {KVG_TYPE_Q8_K, to_float_q8_k, from_float_q8_k, dot_q8_k, KVG_TYPE_F32},
    {KVG_TYPE_IQ4_NL, to_float_iq4_nl, from_float_iq4_nl, dot_iq4_nl, KVG_TYPE_F32},
    {KVG_TYPE_IQ4_XS, to_float_iq4_xs, from_float_iq4_xs, dot_iq4_xs, KVG_TYPE_F32},
};
#define N_TRAITS (sizeof TRAITS / sizeof TRAITS[0])

const kvg_type_traits *kvg_type_traits_of(uint32_t type) {
    for (size_t i = 0; i < N_TRAITS; i++)
        if (TRAITS[i].type == type) return &TRAITS[i];
    return NULL;
}

bool kvg_type_supported(uint32_t type) { return kvg_type_traits_of(type) != NULL; }

size_t kvg_traits_types(uint32_t *types, size_t max) {
    for (size_t i = 0; i < N_TRAITS && i < max; i++) types[i] = TRAITS[i].type;
    return N_TRAITS;
}

size_t kvg_types_list(const uint32_t *types, size_t n, char *buf, size_t size) {
    size_t len = 0;
    if (size) buf[0] = 0;
    for (size_t i = 0; i < n; i++) {
        int w = snprintf(len < size ? buf + len : NULL, len < size ? size - len : 0, "%s%s", i ? ", " : "",
                         kvg_type_name(types[i]));
        if (w > 0) len += (size_t)w;
    }
    return len;
}

void kvg_quantize_row(uint32_t type, const float *src, void *dst, uint64_t n) {
    const kvg_type_traits *t = kvg_type_traits_of(type);
    if (t) t->from_float(src, dst, n);
}

void kvg_dequantize_row(uint32_t type, const void *src, float *dst, uint64_t n) {
    const kvg_type_traits *t = kvg_type_traits_of(type);
    if (t) t->to_float(src, dst, n);
}

float kvg_dot_row(uint32_t type, const void *row, const float *x, uint64_t n) {
    const kvg_type_traits *t = kvg_type_traits_of(type);
    return t ? t->dot(row, x, n) : 0.0f;
}
