/* quant.c: ggml tensor types: sizes and names, f16/bf16 conversion, quantize, dequantize, dot.
 *
 * Block layouts (little-endian, packed, as ggml stores them):
 *   Q8_0: f16 d, int8 q[32]                 x[i] = q[i] * d
 *   Q4_0: f16 d, uint8 qs[16]               x[i] = (nib[i] - 8) * d
 *   Q4_1: f16 d, f16 m, uint8 qs[16]        x[i] = nib[i] * d + m
 * where nib[i] is the low nibble of qs[i] for i < 16 and the high nibble of qs[i-16] for i >= 16. */
#include "kvg_quant.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct type_info {
    const char *name;
    uint32_t block_elems; /* 0: a retired type number that no longer has a layout */
    uint32_t block_bytes;
} type_info;

/* Every ggml type number, so a reader can name (and size) what it cannot run. */
static const type_info TYPES[] = {
    [0] = {"F32", 1, 4},         [1] = {"F16", 1, 2},         [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},      [4] = {"Q4_2", 0, 0},        [5] = {"Q4_3", 0, 0},
    [6] = {"Q5_0", 32, 22},      [7] = {"Q5_1", 32, 24},      [8] = {"Q8_0", 32, 34},
    [9] = {"Q8_1", 32, 36},      [10] = {"Q2_K", 256, 84},    [11] = {"Q3_K", 256, 110},
    [12] = {"Q4_K", 256, 144},   [13] = {"Q5_K", 256, 176},   [14] = {"Q6_K", 256, 210},
    [15] = {"Q8_K", 256, 292},   [16] = {"IQ2_XXS", 256, 66}, [17] = {"IQ2_XS", 256, 74},
    [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},   [20] = {"IQ4_NL", 32, 18},
    [21] = {"IQ3_S", 256, 110},  [22] = {"IQ2_S", 256, 82},   [23] = {"IQ4_XS", 256, 136},
    [24] = {"I8", 1, 1},         [25] = {"I16", 1, 2},        [26] = {"I32", 1, 4},
    [27] = {"I64", 1, 8},        [28] = {"F64", 1, 8},        [29] = {"IQ1_M", 256, 56},
    [30] = {"BF16", 1, 2},       [31] = {"Q4_0_4_4", 0, 0},   [32] = {"Q4_0_4_8", 0, 0},
    [33] = {"Q4_0_8_8", 0, 0},   [34] = {"TQ1_0", 256, 54},   [35] = {"TQ2_0", 256, 66},
    [36] = {"IQ4_NL_4_4", 0, 0}, [37] = {"IQ4_NL_4_8", 0, 0}, [38] = {"IQ4_NL_8_8", 0, 0},
    [39] = {"MXFP4", 32, 17},    [40] = {"NVFP4", 64, 36},    [41] = {"Q1_0", 128, 18},
    [42] = {"Q2_0", 64, 18},
};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

/* Names for the numbers ggml has never used, so kvg_type_name needs no buffer. */
static const char *const UNKNOWN_NAMES[] = {
    "type 43", "type 44", "type 45", "type 46", "type 47", "type 48", "type 49", "type 50",
    "type 51", "type 52", "type 53", "type 54", "type 55", "type 56", "type 57", "type 58",
    "type 59", "type 60", "type 61", "type 62", "type 63",
};

bool kvg_type_known(uint32_t type) { return type < N_TYPES && TYPES[type].block_elems != 0; }

const char *kvg_type_name(uint32_t type) {
    if (type < N_TYPES) return TYPES[type].name;
    if (type - N_TYPES < sizeof UNKNOWN_NAMES / sizeof UNKNOWN_NAMES[0]) return UNKNOWN_NAMES[type - N_TYPES];
    return "unknown type";
}

uint32_t kvg_type_block_elems(uint32_t type) { return type < N_TYPES ? TYPES[type].block_elems : 0; }
uint32_t kvg_type_block_bytes(uint32_t type) { return type < N_TYPES ? TYPES[type].block_bytes : 0; }

size_t kvg_row_bytes(uint32_t type, uint64_t n) {
    uint32_t be = kvg_type_block_elems(type);
    if (be == 0) return 0;
    return (size_t)(n / be) * kvg_type_block_bytes(type);
}

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
    for (uint64_t b = 0; b < n / 32; b++) quantize_q8_0(src + 32 * b, dst + 34 * b);
}
static void from_float_q4_0(const float *src, uint8_t *dst, uint64_t n) {
    for (uint64_t b = 0; b < n / 32; b++) quantize_q4_0(src + 32 * b, dst + 18 * b);
}
static void from_float_q4_1(const float *src, uint8_t *dst, uint64_t n) {
    for (uint64_t b = 0; b < n / 32; b++) quantize_q4_1(src + 32 * b, dst + 20 * b);
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
        const uint8_t *blk = src + 34 * b;
        float d = kvg_f16_to_f32(rd16(blk));
        const int8_t *q = (const int8_t *)(blk + 2);
        for (int i = 0; i < 32; i++) dst[32 * b + i] = (float)q[i] * d;
    }
}
static void to_float_q4_0(const uint8_t *src, float *dst, uint64_t n) {
    for (uint64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = src + 18 * b;
        float d = kvg_f16_to_f32(rd16(blk));
        for (int i = 0; i < 16; i++) {
            dst[32 * b + i] = (float)((blk[2 + i] & 0x0f) - 8) * d;
            dst[32 * b + i + 16] = (float)((blk[2 + i] >> 4) - 8) * d;
        }
    }
}
static void to_float_q4_1(const uint8_t *src, float *dst, uint64_t n) {
    for (uint64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = src + 20 * b;
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
        const uint8_t *blk = row + 34 * b;
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
        const uint8_t *blk = row + 18 * b;
        unpack_nibbles(blk + 2, v, 8);
        total += f16_to_f32(rd16(blk)) * dot32(v, x + 32 * b);
    }
    return total;
}

static float dot_q4_1(const uint8_t *row, const float *x, uint64_t n) {
    float total = 0.0f, v[32];
    for (uint64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = row + 20 * b;
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
