/* cpu_vec.c: the f32 vector operations of the cpu backend's forward pass (kvg_qdot.h): dots and
 * axpy for attention, the softmax's exponentials, RMSNorm and the gated activations. Portable C
 * (libm's expf and tanhf, as the reference) and AVX2+FMA (exp by range reduction to
 * [-ln2/2, ln2/2] and a degree-6 polynomial; tanh from it); the AVX-512
 * path uses the AVX2 loops (these operations are a small share of a step); AArch64's neon and
 * dotprod paths share one Advanced SIMD set (the portable bits but for exp, see below).
 * Attention's runs of keys and values come as f32 rows or as rows of IEEE halves (the cpu
 * backend's f16 KV pages): each path has one loop for both, the halves converted exactly to f32
 * as they are loaded, so the f16 forms give the f32 forms' bits on the converted rows. Rows of
 * the block types (q8_0, q4_0 pages) are read in place, a block widened to floats in registers;
 * each path's KV table (kvg_vec_kv_of) holds the kernels of every type pages may hold. */
#include <stdbool.h>
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
#endif

/* ---- portable ---- */

#define LANES 8

static float p_dot(const float *a, const float *b, int n) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += a[i + l] * b[i + l];
    float s = 0.0f;
    for (int l = 0; l < LANES; l++) s += acc[l];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void p_axpy(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* Rows of attention's keys or values: f32, or IEEE halves (half = true, a constant where these
 * are inlined, so each form compiles to its own loop). */
static inline const void *row_at(const void *x, size_t i, bool half) {
    return half ? (const void *)((const uint16_t *)x + i) : (const void *)((const float *)x + i);
}
static inline float elem(const void *x, size_t i, bool half) {
    return half ? kvg_f16_to_f32(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

/* p_dot and p_axpy over a row of either type */
static inline float p_dot_row(const float *a, const void *b, int n, bool half) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += a[i + l] * elem(b, (size_t)(i + l), half);
    float s = 0.0f;
    for (int l = 0; l < LANES; l++) s += acc[l];
    for (; i < n; i++) s += a[i] * elem(b, (size_t)i, half);
    return s;
}

static inline void p_axpy_row(float *y, float a, const void *x, int n, bool half) {
    for (int i = 0; i < n; i++) y[i] += a * elem(x, (size_t)i, half);
}

static void p_dot_rows(const float *q, const float *k, size_t stride, int rows, int n, float *out) {
    for (int r = 0; r < rows; r++) out[r] = p_dot_row(q, k + (size_t)r * stride, n, false);
}

static void p_axpy_rows(float *y, const float *a, const float *x, size_t stride, int rows, int n) {
    for (int r = 0; r < rows; r++) p_axpy_row(y, a[r], x + (size_t)r * stride, n, false);
}

static void p_dot_rows_f16(const float *q, const uint16_t *k, size_t stride, int rows, int n, float *out) {
    for (int r = 0; r < rows; r++) out[r] = p_dot_row(q, k + (size_t)r * stride, n, true);
}

static void p_axpy_rows_f16(float *y, const float *a, const uint16_t *x, size_t stride, int rows, int n) {
    for (int r = 0; r < rows; r++) p_axpy_row(y, a[r], x + (size_t)r * stride, n, true);
}

static void p_scale(float *y, float a, int n) {
    for (int i = 0; i < n; i++) y[i] *= a;
}

static float p_max(const float *x, int n) {
    float m = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > m) m = x[i];
    return m;
}

static float p_exp_sum(float *x, int n, float max) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        s += x[i];
    }
    return s;
}

static void p_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += x[i + l] * x[i + l];
    float ss = 0.0f;
    for (int l = 0; l < LANES; l++) ss += acc[l];
    for (; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int k = 0; k < n; k++) out[k] = x[k] * scale * w[k];
}

static void p_silu_mul(float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void p_gelu_mul(float *g, const float *u, int n) {
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int i = 0; i < n; i++) {
        float x = g[i];
        g[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * u[i];
    }
}

static void p_add(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += x[i];
}

static void p_gelu_erf(float *x, const float *b, int n) {
    for (int i = 0; i < n; i++) {
        float v = b ? x[i] + b[i] : x[i];
        x[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
}

static const kvg_vec_ops PORTABLE = {p_dot, p_axpy, p_dot_rows, p_axpy_rows,
                                     p_dot_rows_f16, p_axpy_rows_f16,
                                     p_scale, p_exp_sum, p_max, p_rmsnorm,
                                     p_silu_mul, p_gelu_mul, p_add, p_gelu_erf};

/* ---- KV rows (kvg_vec_kv): f32 and f16 are the forms above with the stride in elements; the
 * block types (q8_0: f16 d, int8 q[32]; q4_0: f16 d, then byte i holds element i in its low
 * nibble and element i + 16 in its high one, each minus 8) sum a block's products of the
 * integers first and scale that sum by d once ---- */

#define KV_BLOCK 32

static inline float block_d(const unsigned char *blk) {
    uint16_t h;
    memcpy(&h, blk, sizeof h);
    return kvg_f16_to_f32(h);
}

/* element i (0..31) of a q4_0 block's 16 bytes of nibbles, minus 8 */
static inline int q4_elem(const unsigned char *qs, int i) { return i < 16 ? (qs[i] & 0x0f) - 8 : (qs[i - 16] >> 4) - 8; }

static float p_dot_q8_0_row(const float *q, const unsigned char *row, int n) {
    float s = 0.0f;
    for (int b = 0; b < n / KV_BLOCK; b++) {
        const unsigned char *blk = row + (size_t)b * KVG_Q8_0_BYTES;
        const int8_t *k = (const int8_t *)(blk + 2);
        const float *qb = q + b * KV_BLOCK;
        float bs = 0.0f;
        for (int i = 0; i < KV_BLOCK; i++) bs += qb[i] * (float)k[i];
        s += block_d(blk) * bs;
    }
    return s;
}

static float p_dot_q4_0_row(const float *q, const unsigned char *row, int n) {
    float s = 0.0f;
    for (int b = 0; b < n / KV_BLOCK; b++) {
        const unsigned char *blk = row + (size_t)b * KVG_Q4_0_BYTES;
        const float *qb = q + b * KV_BLOCK;
        float bs = 0.0f;
        for (int i = 0; i < KV_BLOCK; i++) bs += qb[i] * (float)q4_elem(blk + 2, i);
        s += block_d(blk) * bs;
    }
    return s;
}

static void p_kv_dot_f32(const float *q, const void *k, size_t row_bytes, int rows, int n, float *out) {
    p_dot_rows(q, k, row_bytes / sizeof(float), rows, n, out);
}
static void p_kv_axpy_f32(float *y, const float *a, const void *x, size_t row_bytes, int rows, int n) {
    p_axpy_rows(y, a, x, row_bytes / sizeof(float), rows, n);
}
static void p_kv_dot_f16(const float *q, const void *k, size_t row_bytes, int rows, int n, float *out) {
    p_dot_rows_f16(q, k, row_bytes / sizeof(uint16_t), rows, n, out);
}
static void p_kv_axpy_f16(float *y, const float *a, const void *x, size_t row_bytes, int rows, int n) {
    p_axpy_rows_f16(y, a, x, row_bytes / sizeof(uint16_t), rows, n);
}
static void p_kv_dot_q8_0(const float *q, const void *k, size_t row_bytes, int rows, int n, float *out) {
    for (int r = 0; r < rows; r++) out[r] = p_dot_q8_0_row(q, (const unsigned char *)k + (size_t)r * row_bytes, n);
}
static void p_kv_dot_q4_0(const float *q, const void *k, size_t row_bytes, int rows, int n, float *out) {
    for (int r = 0; r < rows; r++) out[r] = p_dot_q4_0_row(q, (const unsigned char *)k + (size_t)r * row_bytes, n);
}
static void p_kv_axpy_q8_0(float *y, const float *a, const void *x, size_t row_bytes, int rows, int n) {
    for (int r = 0; r < rows; r++) {
        const unsigned char *row = (const unsigned char *)x + (size_t)r * row_bytes;
        for (int b = 0; b < n / KV_BLOCK; b++) {
            const unsigned char *blk = row + (size_t)b * KVG_Q8_0_BYTES;
            const int8_t *k = (const int8_t *)(blk + 2);
            float c = a[r] * block_d(blk);
            for (int i = 0; i < KV_BLOCK; i++) y[b * KV_BLOCK + i] += c * (float)k[i];
        }
    }
}
static void p_kv_axpy_q4_0(float *y, const float *a, const void *x, size_t row_bytes, int rows, int n) {
    for (int r = 0; r < rows; r++) {
        const unsigned char *row = (const unsigned char *)x + (size_t)r * row_bytes;
        for (int b = 0; b < n / KV_BLOCK; b++) {
            const unsigned char *blk = row + (size_t)b * KVG_Q4_0_BYTES;
            float c = a[r] * block_d(blk);
            for (int i = 0; i < KV_BLOCK; i++) y[b * KV_BLOCK + i] += c * (float)q4_elem(blk + 2, i);
        }
    }
}

/* A table's kernels for several heads where a path has none of its own: each head through
 * the one-head kernel, so each head gets its bits by construction. */
#define KV_EACH_HEAD(dot, axpy)                                                                              \
    static void dot##_each(const float *q, size_t q_stride, int heads, const void *k, size_t row_bytes,     \
                           int rows, int n, float *out, size_t out_stride) {                                \
        for (int h = 0; h < heads; h++)                                                                     \
            dot(q + (size_t)h * q_stride, k, row_bytes, rows, n, out + (size_t)h * out_stride);            \
    }                                                                                                       \
    static void axpy##_each(float *y, size_t y_stride, int heads, const float *a, size_t a_stride,          \
                            const void *x, size_t row_bytes, int rows, int n) {                             \
        for (int h = 0; h < heads; h++) axpy(y + (size_t)h * y_stride, a + (size_t)h * a_stride, x, row_bytes, rows, n); \
    }
#define KV_ROW(type, dot, axpy) {type, dot, axpy, dot##_each, axpy##_each}

KV_EACH_HEAD(p_kv_dot_f32, p_kv_axpy_f32)
KV_EACH_HEAD(p_kv_dot_f16, p_kv_axpy_f16)
KV_EACH_HEAD(p_kv_dot_q8_0, p_kv_axpy_q8_0)
KV_EACH_HEAD(p_kv_dot_q4_0, p_kv_axpy_q4_0)

static const kvg_vec_kv PORTABLE_KV[] = {
    KV_ROW(KVG_TYPE_F32, p_kv_dot_f32, p_kv_axpy_f32),
    KV_ROW(KVG_TYPE_F16, p_kv_dot_f16, p_kv_axpy_f16),
    KV_ROW(KVG_TYPE_Q8_0, p_kv_dot_q8_0, p_kv_axpy_q8_0),
    KV_ROW(KVG_TYPE_Q4_0, p_kv_dot_q4_0, p_kv_axpy_q4_0),
};

/* ---- AVX2 + FMA ---- */
#ifdef KVG_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline))

AVX2 INL float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x: x = k ln2 + r with |r| <= ln2/2, e^r by its Taylor polynomial to r^6 (truncation error
 * below 1.3e-7 relative there), times 2^k put into the exponent bits. Inputs are clamped to
 * [-86, 88], where the result stays a normal float: exp of a very negative number gives
 * ~4e-38, not 0. */
AVX2 INL __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-86.0f)), _mm256_set1_ps(88.0f));
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* ln2 in two parts so k * ln2_hi is exact */
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(k), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}

AVX2 static float x_dot(const float *a, const float *b, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    if (i + 8 <= n) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        i += 8;
    }
    float s = hsum8(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

AVX2 static void x_axpy(float *y, float a, const float *x, int n) {
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* 8 elements of a row of either type as f32 (F16C converts halves exactly) */
AVX2 INL __m256 x_load8(const void *x, size_t i, bool half) {
    return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)x + i)))
                : _mm256_loadu_ps((const float *)x + i);
}

/* four rows at a time, one accumulator each, folded together at the end; a row's sum is
 * formed the same way whether it came in a group of four or alone */
/* the four rows' fold: lane j is row j's sum (the same operations as for a row alone) */
AVX2 INL void x_fold4(__m256 a0, __m256 a1, __m256 a2, __m256 a3, float *t) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    _mm_storeu_ps(t, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

AVX2 INL void x_dot_rows_of(const float *q, const void *k, size_t stride, int rows, int n, float *out, bool half) {
    int r = 0;
    /* eight rows at a time where n has no tail: eight independent chains of multiply-adds */
    for (; (n & 7) == 0 && r + 8 <= rows; r += 8) {
        const void *kr[8];
        for (int j = 0; j < 8; j++) kr[j] = row_at(k, (size_t)(r + j) * stride, half);
        __m256 a[8];
        for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
        for (int i = 0; i < n; i += 8) {
            __m256 qv = _mm256_loadu_ps(q + i);
            for (int j = 0; j < 8; j++) a[j] = _mm256_fmadd_ps(qv, x_load8(kr[j], (size_t)i, half), a[j]);
        }
        x_fold4(a[0], a[1], a[2], a[3], out + r);
        x_fold4(a[4], a[5], a[6], a[7], out + r + 4);
    }
    for (; r + 4 <= rows; r += 4) {
        const void *k0 = row_at(k, (size_t)r * stride, half), *k1 = row_at(k0, stride, half),
                   *k2 = row_at(k1, stride, half), *k3 = row_at(k2, stride, half);
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, x_load8(k0, (size_t)i, half), a0);
            a1 = _mm256_fmadd_ps(qv, x_load8(k1, (size_t)i, half), a1);
            a2 = _mm256_fmadd_ps(qv, x_load8(k2, (size_t)i, half), a2);
            a3 = _mm256_fmadd_ps(qv, x_load8(k3, (size_t)i, half), a3);
        }
        /* lane j of the fold: row r + j */
        __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        float t[4];
        _mm_storeu_ps(t, s);
        for (int j = 0; j < 4; j++) {
            const void *kj = row_at(k, (size_t)(r + j) * stride, half);
            for (int e = i; e < n; e++) t[j] += q[e] * elem(kj, (size_t)e, half);
            out[r + j] = t[j];
        }
    }
    for (; r < rows; r++) { /* the same sums as a row of a group of four */
        const void *kr = row_at(k, (size_t)r * stride, half);
        __m256 a0 = _mm256_setzero_ps();
        int i = 0;
        for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), x_load8(kr, (size_t)i, half), a0);
        __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a0), a0);
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        float t = _mm_cvtss_f32(s);
        for (; i < n; i++) t += q[i] * elem(kr, (size_t)i, half);
        out[r] = t;
    }
}

/* y is read and written once per 8 of its floats, whatever the number of rows; each element
 * sums its rows in row order, in chunks of 64 floats (8 independent chains) or of 8 */
AVX2 INL void x_axpy_rows_of(float *y, const float *a, const void *x, size_t stride, int rows, int n, bool half) {
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        __m256 acc[8];
        for (int c = 0; c < 8; c++) acc[c] = _mm256_loadu_ps(y + i + 8 * c);
        for (int r = 0; r < rows; r++) {
            __m256 ar = _mm256_broadcast_ss(a + r);
            for (int c = 0; c < 8; c++)
                acc[c] = _mm256_fmadd_ps(ar, x_load8(x, (size_t)r * stride + (size_t)(i + 8 * c), half), acc[c]);
        }
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(y + i + 8 * c, acc[c]);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 acc = _mm256_loadu_ps(y + i);
        for (int r = 0; r < rows; r++)
            acc = _mm256_fmadd_ps(_mm256_broadcast_ss(a + r), x_load8(x, (size_t)r * stride + (size_t)i, half), acc);
        _mm256_storeu_ps(y + i, acc);
    }
    for (; i < n; i++)
        for (int r = 0; r < rows; r++) y[i] += a[r] * elem(x, (size_t)r * stride + (size_t)i, half);
}

AVX2 static void x_dot_rows(const float *q, const float *k, size_t stride, int rows, int n, float *out) {
    x_dot_rows_of(q, k, stride, rows, n, out, false);
}
AVX2 static void x_axpy_rows(float *y, const float *a, const float *x, size_t stride, int rows, int n) {
    x_axpy_rows_of(y, a, x, stride, rows, n, false);
}
AVX2 static void x_dot_rows_f16(const float *q, const uint16_t *k, size_t stride, int rows, int n, float *out) {
    x_dot_rows_of(q, k, stride, rows, n, out, true);
}
AVX2 static void x_axpy_rows_f16(float *y, const float *a, const uint16_t *x, size_t stride, int rows, int n) {
    x_axpy_rows_of(y, a, x, stride, rows, n, true);
}

AVX2 static void x_scale(float *y, float a, int n) {
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] *= a;
}

AVX2 static float x_max(const float *x, int n) {
    float m = x[0];
    int i = 0;
    if (n >= 8) {
        __m256 v = _mm256_loadu_ps(x);
        for (i = 8; i + 8 <= n; i += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(x + i));
        __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        s = _mm_max_ss(s, _mm_movehdup_ps(s));
        m = _mm_cvtss_f32(s);
    }
    for (; i < n; i++)
        if (x[i] > m) m = x[i];
    return m;
}

AVX2 static float x_exp_sum(float *x, int n, float max) {
    __m256 vm = _mm256_set1_ps(max), acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float s = hsum8(acc);
    if (i < n) { /* the tail through the same exp, lanes past n zero */
        float buf[8] = {0};
        for (int k = i; k < n; k++) buf[k - i] = x[k] - max;
        float e[8];
        _mm256_storeu_ps(e, exp8(_mm256_loadu_ps(buf)));
        for (int k = i; k < n; k++) {
            x[k] = e[k - i];
            s += e[k - i];
        }
    }
    return s;
}

AVX2 static void x_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        acc0 = _mm256_fmadd_ps(a, a, acc0);
        acc1 = _mm256_fmadd_ps(b, b, acc1);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(x + i);
        acc0 = _mm256_fmadd_ps(a, a, acc0);
    }
    float ss = hsum8(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    __m256 vs = _mm256_set1_ps(scale);
    int k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + k), vs), _mm256_loadu_ps(w + k)));
    for (; k < n; k++) out[k] = x[k] * scale * w[k];
}

/* silu(g) * u over 8 lanes */
AVX2 INL __m256 silu8(__m256 g) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}
/* gelu(g) with tanh(y) = 1 - 2 / (e^(2y) + 1) */
AVX2 INL __m256 gelu8(__m256 g) {
    const __m256 c = _mm256_set1_ps(0.7978845608028654f), k = _mm256_set1_ps(0.044715f), one = _mm256_set1_ps(1.0f);
    __m256 y = _mm256_mul_ps(c, _mm256_fmadd_ps(_mm256_mul_ps(k, g), _mm256_mul_ps(g, g), g));
    __m256 e = exp8(_mm256_add_ps(y, y));
    __m256 th = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), g), _mm256_add_ps(one, th));
}

AVX2 static void x_silu_mul(float *g, const float *u, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
    for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

AVX2 static void x_gelu_mul(float *g, const float *u, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, _mm256_mul_ps(gelu8(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
    const float c = 0.7978845608028654f;
    for (; i < n; i++) {
        float x = g[i];
        g[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * u[i];
    }
}

AVX2 static void x_add(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] += x[i];
}

/* 1 + erf(x) for x >= 0 by Abramowitz and Stegun's 7.1.26: 2 - t (a1 + t (a2 + ... a5)) e^(-x^2),
 * t = 1 / (1 + p x), within 1.5e-7 of erf (exp8's error adds ~1e-7) */
AVX2 INL __m256 one_plus_erf8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), x, one));
    __m256 p = _mm256_set1_ps(1.061405429f);
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
    __m256 e = exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), x), x));
    return _mm256_fnmadd_ps(_mm256_mul_ps(p, t), e, _mm256_set1_ps(2.0f));
}

/* 0.5 v (1 + erf(v / sqrt 2)), erf odd: 1 + erf(-z) = 2 - (1 + erf(z)) */
AVX2 INL __m256 gelu_erf8(__m256 v) {
    __m256 z = _mm256_mul_ps(v, _mm256_set1_ps(0.70710678118654752f));
    __m256 az = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), z);
    __m256 pos = one_plus_erf8(az), neg = _mm256_sub_ps(_mm256_set1_ps(2.0f), pos);
    __m256 f = _mm256_blendv_ps(pos, neg, z); /* the sign bit of z picks */
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), v), f);
}

AVX2 static void x_gelu_erf(float *x, const float *b, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        if (b) v = _mm256_add_ps(v, _mm256_loadu_ps(b + i));
        _mm256_storeu_ps(x + i, gelu_erf8(v));
    }
    if (i < n) p_gelu_erf(x + i, b ? b + i : NULL, n - i);
}

static const kvg_vec_ops AVX2_OPS = {x_dot, x_axpy, x_dot_rows, x_axpy_rows,
                                     x_dot_rows_f16, x_axpy_rows_f16,
                                     x_scale, x_exp_sum, x_max, x_rmsnorm,
                                     x_silu_mul, x_gelu_mul, x_add, x_gelu_erf};

/* KV rows: a block's 32 integers widened to four vectors of 8 floats in registers */
AVX2 INL float x_block_d(const unsigned char *blk) {
    uint16_t h;
    memcpy(&h, blk, sizeof h);
    return _cvtsh_ss(h);
}

AVX2 INL __m256 x_i8x8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

/* a block's elements as four vectors of 8 floats (before the scale) */
AVX2 INL void x_q8_0_block(const unsigned char *blk, __m256 *e) {
    for (int j = 0; j < 4; j++) e[j] = x_i8x8(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * j)));
}

AVX2 INL void x_q4_0_block(const unsigned char *blk, __m256 *e) {
    __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 2)), mask = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    __m128i lo = _mm_sub_epi8(_mm_and_si128(qs, mask), eight);
    __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(qs, 4), mask), eight);
    e[0] = x_i8x8(lo);
    e[1] = x_i8x8(_mm_srli_si128(lo, 8));
    e[2] = x_i8x8(hi);
    e[3] = x_i8x8(_mm_srli_si128(hi, 8));
}

/* q·k in integers: q is quantized once per call to 8 bits per block of 32 (its own scale,
 * d = amax / 127, as a q8_0 block in f32), and each key block's 32 signed bytes are multiplied
 * with it by maddubs (|k| times q with k's sign: pairs of products of at most 2 * 127 * 127 fit
 * 16 bits), summed to 8 int32, and scaled once by d_q * d_k. The rounding of q adds at most
 * d_q / 2 per element to an f32 dot: well below what the pages' own quantization moved. */
#define KV_MAX_BLOCKS 16 /* head_dim up to 512 in integers; wider rows take the float loop */

AVX2 INL __m256i x_q8_0_ints(const unsigned char *blk) { return _mm256_loadu_si256((const __m256i *)(blk + 2)); }

AVX2 INL __m256i x_q4_0_ints(const unsigned char *blk) {
    __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 2)), mask = _mm_set1_epi8(0x0f);
    __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), mask), _mm_and_si128(qs, mask));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
}

/* q's n floats as 8-bit blocks: qq[b] the 32 int8 of block b, dq[b] its scale */
AVX2 INL void x_quantize_q(const float *q, int nb, __m256i *qq, float *dq) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < nb; b++) {
        __m256 v[4];
        for (int j = 0; j < 4; j++) v[j] = _mm256_loadu_ps(q + b * KV_BLOCK + 8 * j);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float amax = _mm_cvtss_f32(h);
        dq[b] = amax / 127.0f;
        __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i i[4];
        for (int j = 0; j < 4; j++) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id)); /* to nearest, even */
        /* packs work within 128-bit lanes: the permutation puts the 8 groups of 4 back in order */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        qq[b] = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    }
}

/* the 8 int32 partial sums of a key block's products with q's block */
AVX2 INL __m256 x_block_dot(__m256i k, __m256i qb) {
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(k, k), _mm256_sign_epi8(qb, k));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

AVX2 INL void x_kv_dot_blocks(const float *q, const void *k, size_t row_bytes, int rows, int n, float *out, bool q4) {
    size_t bb = q4 ? KVG_Q4_0_BYTES : KVG_Q8_0_BYTES;
    int nb = n / KV_BLOCK, r = 0;
    if (nb > KV_MAX_BLOCKS) {
        if (q4) p_kv_dot_q4_0(q, k, row_bytes, rows, n, out);
        else p_kv_dot_q8_0(q, k, row_bytes, rows, n, out);
        return;
    }
    __m256i qq[KV_MAX_BLOCKS];
    float dq[KV_MAX_BLOCKS];
    x_quantize_q(q, nb, qq, dq);
    for (; r + 2 <= rows; r += 2) {
        const unsigned char *r0 = (const unsigned char *)k + (size_t)r * row_bytes, *r1 = r0 + row_bytes;
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const unsigned char *b0 = r0 + (size_t)b * bb, *b1 = r1 + (size_t)b * bb;
            __m256 s0 = x_block_dot(q4 ? x_q4_0_ints(b0) : x_q8_0_ints(b0), qq[b]);
            __m256 s1 = x_block_dot(q4 ? x_q4_0_ints(b1) : x_q8_0_ints(b1), qq[b]);
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(x_block_d(b0) * dq[b]), s0, acc0);
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(x_block_d(b1) * dq[b]), s1, acc1);
        }
        out[r] = hsum8(acc0);
        out[r + 1] = hsum8(acc1);
    }
    for (; r < rows; r++) {
        const unsigned char *r0 = (const unsigned char *)k + (size_t)r * row_bytes;
        __m256 acc0 = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const unsigned char *b0 = r0 + (size_t)b * bb;
            __m256 s0 = x_block_dot(q4 ? x_q4_0_ints(b0) : x_q8_0_ints(b0), qq[b]);
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(x_block_d(b0) * dq[b]), s0, acc0);
        }
        out[r] = hsum8(acc0);
    }
}

/* y's block of 32 floats stays in registers over every row */
AVX2 INL void x_kv_axpy_blocks(float *y, const float *a, const void *x, size_t row_bytes, int rows, int n, bool q4) {
    size_t bb = q4 ? KVG_Q4_0_BYTES : KVG_Q8_0_BYTES;
    for (int b = 0; b < n / KV_BLOCK; b++) {
        float *yb = y + b * KV_BLOCK;
        __m256 acc[4] = {_mm256_loadu_ps(yb), _mm256_loadu_ps(yb + 8), _mm256_loadu_ps(yb + 16),
                         _mm256_loadu_ps(yb + 24)};
        const unsigned char *blk = (const unsigned char *)x + (size_t)b * bb;
        for (int r = 0; r < rows; r++, blk += row_bytes) {
            __m256 e[4];
            if (q4) x_q4_0_block(blk, e);
            else x_q8_0_block(blk, e);
            __m256 c = _mm256_set1_ps(a[r] * x_block_d(blk));
            for (int j = 0; j < 4; j++) acc[j] = _mm256_fmadd_ps(c, e[j], acc[j]);
        }
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(yb + 8 * j, acc[j]);
    }
}

AVX2 static void x_kv_dot_f32(const float *q, const void *k, size_t row_bytes, int rows, int n, float *out) {
    x_dot_rows_of(q, k, row_bytes / sizeof(float), rows, n, out, false);
}
AVX2 static void x_kv_axpy_f32(float *y, const float *a, const void *x, size_t row_bytes, int rows, int n) {
    x_axpy_rows_of(y, a, x, row_bytes / sizeof(float), rows, n, false);
}
AVX2 static void x_kv_dot_f16(const float *q, const void *k, size_t row_bytes, int rows, int n, float *out) {
    x_dot_rows_of(q, k, row_bytes / sizeof(uint16_t), rows, n, out, true);
}
AVX2 static void x_kv_axpy_f16(float *y, const float *a, const void *x, size_t row_bytes, int rows, int n) {
    x_axpy_rows_of(y, a, x, row_bytes / sizeof(uint16_t), rows, n, true);
}
AVX2 static void x_kv_dot_q8_0(const float *q, const void *k, size_t row_bytes, int rows, int n, float *out) {
    x_kv_dot_blocks(q, k, row_bytes, rows, n, out, false);
}
AVX2 static void x_kv_axpy_q8_0(float *y, const float *a, const void *x, size_t row_bytes, int rows, int n) {
    x_kv_axpy_blocks(y, a, x, row_bytes, rows, n, false);
}
AVX2 static void x_kv_dot_q4_0(const float *q, const void *k, size_t row_bytes, int rows, int n, float *out) {
    x_kv_dot_blocks(q, k, row_bytes, rows, n, out, true);
}
AVX2 static void x_kv_axpy_q4_0(float *y, const float *a, const void *x, size_t row_bytes, int rows, int n) {
    x_kv_axpy_blocks(y, a, x, row_bytes, rows, n, true);
}

/* Several heads against one run (grouped-query attention). The dots take four heads against
 * two rows at a time, eight chains as dot_rows' eight rows, each row loaded and widened once
 * for the four; the weighted sums take four heads over 16 of the n floats at a time. Every
 * (head, row) dot is the one chain of multiply-adds dot_rows forms, folded as x_fold4 folds it,
 * and every output element sums its rows in row order from y, as axpy_rows does: each head gets
 * the one-head kernels' bits. Rows KV_HEADS_AHEAD ahead in the run are asked for while a row is
 * computed (the caller asks for the next run's first ones). */
#define KV_HEADS_AHEAD 8

AVX2 INL void x_prefetch_row(const void *row, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64) _mm_prefetch((const char *)row + off, _MM_HINT_T0);
}

#define X_DOT2(qh, a, b)                                                                                    \
    do {                                                                                                    \
        __m256 v_ = _mm256_loadu_ps((qh) + i);                                                              \
        a = _mm256_fmadd_ps(v_, x0, a);                                                                     \
        b = _mm256_fmadd_ps(v_, x1, b);                                                                     \
    } while (0)

AVX2 INL void x_dot_heads_of(const float *q, size_t qs, int heads, const void *k, size_t stride, int rows, int n,
                             float *out, size_t os, bool half) {
    int h = 0;
    size_t esize = half ? sizeof(uint16_t) : sizeof(float), rbytes = (size_t)n * esize;
    for (; (n & 7) == 0 && h + 4 <= heads; h += 4) {
        const float *q0 = q + (size_t)h * qs, *q1 = q0 + qs, *q2 = q1 + qs, *q3 = q2 + qs;
        float *o0 = out + (size_t)h * os, *o1 = o0 + os, *o2 = o1 + os, *o3 = o2 + os;
        int r = 0;
        for (; r + 2 <= rows; r += 2) {
            const void *k0 = row_at(k, (size_t)r * stride, half), *k1 = row_at(k0, stride, half);
            if (h == 0 && r + KV_HEADS_AHEAD + 2 <= rows) {
                x_prefetch_row(row_at(k0, KV_HEADS_AHEAD * stride, half), rbytes);
                x_prefetch_row(row_at(k1, KV_HEADS_AHEAD * stride, half), rbytes);
            }
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            for (int i = 0; i < n; i += 8) {
                __m256 x0 = x_load8(k0, (size_t)i, half), x1 = x_load8(k1, (size_t)i, half);
                X_DOT2(q0, a0, a1);
                X_DOT2(q1, a2, a3);
                X_DOT2(q2, a4, a5);
                X_DOT2(q3, a6, a7);
            }
            float t[8];
            x_fold4(a0, a1, a2, a3, t);
            x_fold4(a4, a5, a6, a7, t + 4);
            o0[r] = t[0], o0[r + 1] = t[1], o1[r] = t[2], o1[r + 1] = t[3];
            o2[r] = t[4], o2[r + 1] = t[5], o3[r] = t[6], o3[r + 1] = t[7];
        }
        for (; r < rows; r++) {
            const void *k0 = row_at(k, (size_t)r * stride, half);
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int i = 0; i < n; i += 8) {
                __m256 x0 = x_load8(k0, (size_t)i, half);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i), x0, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + i), x0, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + i), x0, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + i), x0, a3);
            }
            float t[4];
            x_fold4(a0, a1, a2, a3, t);
            o0[r] = t[0], o1[r] = t[1], o2[r] = t[2], o3[r] = t[3];
        }
    }
    for (; h < heads; h++) x_dot_rows_of(q + (size_t)h * qs, k, stride, rows, n, out + (size_t)h * os, half);
}

#define X_AXPY2(ah, a, b)                                                                                   \
    do {                                                                                                    \
        __m256 w_ = _mm256_broadcast_ss((ah) + r);                                                          \
        a = _mm256_fmadd_ps(w_, x0, a);                                                                     \
        b = _mm256_fmadd_ps(w_, x1, b);                                                                     \
    } while (0)

AVX2 INL void x_axpy_heads_of(float *y, size_t ys, int heads, const float *a, size_t as, const void *x,
                              size_t stride, int rows, int n, bool half) {
    int h = 0;
    size_t esize = half ? sizeof(uint16_t) : sizeof(float), rbytes = (size_t)n * esize;
    for (; (n & 7) == 0 && h + 4 <= heads; h += 4) {
        float *y0 = y + (size_t)h * ys, *y1 = y0 + ys, *y2 = y1 + ys, *y3 = y2 + ys;
        const float *w0 = a + (size_t)h * as, *w1 = w0 + as, *w2 = w1 + as, *w3 = w2 + as;
        int i = 0;
        for (; i + 16 <= n; i += 16) {
            __m256 c0 = _mm256_loadu_ps(y0 + i), c1 = _mm256_loadu_ps(y0 + i + 8);
            __m256 c2 = _mm256_loadu_ps(y1 + i), c3 = _mm256_loadu_ps(y1 + i + 8);
            __m256 c4 = _mm256_loadu_ps(y2 + i), c5 = _mm256_loadu_ps(y2 + i + 8);
            __m256 c6 = _mm256_loadu_ps(y3 + i), c7 = _mm256_loadu_ps(y3 + i + 8);
            for (int r = 0; r < rows; r++) {
                const void *xr = row_at(x, (size_t)r * stride, half);
                if (h == 0 && i == 0 && r + KV_HEADS_AHEAD < rows)
                    x_prefetch_row(row_at(xr, KV_HEADS_AHEAD * stride, half), rbytes);
                __m256 x0 = x_load8(xr, (size_t)i, half), x1 = x_load8(xr, (size_t)i + 8, half);
                X_AXPY2(w0, c0, c1);
                X_AXPY2(w1, c2, c3);
                X_AXPY2(w2, c4, c5);
                X_AXPY2(w3, c6, c7);
            }
            _mm256_storeu_ps(y0 + i, c0), _mm256_storeu_ps(y0 + i + 8, c1);
            _mm256_storeu_ps(y1 + i, c2), _mm256_storeu_ps(y1 + i + 8, c3);
            _mm256_storeu_ps(y2 + i, c4), _mm256_storeu_ps(y2 + i + 8, c5);
            _mm256_storeu_ps(y3 + i, c6), _mm256_storeu_ps(y3 + i + 8, c7);
        }
        for (; i < n; i += 8) {
            __m256 c0 = _mm256_loadu_ps(y0 + i), c1 = _mm256_loadu_ps(y1 + i);
            __m256 c2 = _mm256_loadu_ps(y2 + i), c3 = _mm256_loadu_ps(y3 + i);
            for (int r = 0; r < rows; r++) {
                __m256 x0 = x_load8(x, (size_t)r * stride + (size_t)i, half);
                c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w0 + r), x0, c0);
                c1 = _mm256_fmadd_ps(_mm256_broadcast_ss(w1 + r), x0, c1);
                c2 = _mm256_fmadd_ps(_mm256_broadcast_ss(w2 + r), x0, c2);
                c3 = _mm256_fmadd_ps(_mm256_broadcast_ss(w3 + r), x0, c3);
            }
            _mm256_storeu_ps(y0 + i, c0), _mm256_storeu_ps(y1 + i, c1);
            _mm256_storeu_ps(y2 + i, c2), _mm256_storeu_ps(y3 + i, c3);
        }
    }
    for (; h < heads; h++) x_axpy_rows_of(y + (size_t)h * ys, a + (size_t)h * as, x, stride, rows, n, half);
}

AVX2 static void x_kv_dot_heads_f32(const float *q, size_t q_stride, int heads, const void *k, size_t row_bytes,
                                    int rows, int n, float *out, size_t out_stride) {
    x_dot_heads_of(q, q_stride, heads, k, row_bytes / sizeof(float), rows, n, out, out_stride, false);
}
AVX2 static void x_kv_axpy_heads_f32(float *y, size_t y_stride, int heads, const float *a, size_t a_stride,
                                     const void *x, size_t row_bytes, int rows, int n) {
    x_axpy_heads_of(y, y_stride, heads, a, a_stride, x, row_bytes / sizeof(float), rows, n, false);
}
AVX2 static void x_kv_dot_heads_f16(const float *q, size_t q_stride, int heads, const void *k, size_t row_bytes,
                                    int rows, int n, float *out, size_t out_stride) {
    x_dot_heads_of(q, q_stride, heads, k, row_bytes / sizeof(uint16_t), rows, n, out, out_stride, true);
}
AVX2 static void x_kv_axpy_heads_f16(float *y, size_t y_stride, int heads, const float *a, size_t a_stride,
                                     const void *x, size_t row_bytes, int rows, int n) {
    x_axpy_heads_of(y, y_stride, heads, a, a_stride, x, row_bytes / sizeof(uint16_t), rows, n, true);
}
KV_EACH_HEAD(x_kv_dot_q8_0, x_kv_axpy_q8_0)
KV_EACH_HEAD(x_kv_dot_q4_0, x_kv_axpy_q4_0)

static const kvg_vec_kv AVX2_KV[] = {
    {KVG_TYPE_F32, x_kv_dot_f32, x_kv_axpy_f32, x_kv_dot_heads_f32, x_kv_axpy_heads_f32},
    {KVG_TYPE_F16, x_kv_dot_f16, x_kv_axpy_f16, x_kv_dot_heads_f16, x_kv_axpy_heads_f16},
    KV_ROW(KVG_TYPE_Q8_0, x_kv_dot_q8_0, x_kv_axpy_q8_0),
    KV_ROW(KVG_TYPE_Q4_0, x_kv_dot_q4_0, x_kv_axpy_q4_0),
};
#endif


/* ---- AArch64 Advanced SIMD (the neon and dotprod paths) ----
 * dot, axpy, their runs, scale, add and RMSNorm compute the portable loops' operations in their
 * order (8 lanes as two vectors, multiply then add), so they give the portable path's bits; exp
 * (softmax, SiLU, GELU) is the AVX2 path's polynomial on 4 lanes. */
#ifdef KVG_ARM
#define INL_ARM static inline __attribute__((always_inline))

/* the portable lanes' order: lane l of the two accumulators summed from 0 to 7 */
INL_ARM float sum8_neon(float32x4_t a0, float32x4_t a1) {
    float l[LANES], s = 0.0f;
    vst1q_f32(l, a0);
    vst1q_f32(l + 4, a1);
    for (int i = 0; i < LANES; i++) s += l[i];
    return s;
}

/* 4 elements of a row of either type as f32 (halves converted exactly) */
INL_ARM float32x4_t n_load4(const void *x, size_t i, bool half) {
    return half ? vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)x + i)))
                : vld1q_f32((const float *)x + i);
}

/* dot and axpy over a row of either type */
INL_ARM float n_dot_row(const float *a, const void *b, int n, bool half) {
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0;
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        acc0 = vaddq_f32(acc0, vmulq_f32(vld1q_f32(a + i), n_load4(b, (size_t)i, half)));
        acc1 = vaddq_f32(acc1, vmulq_f32(vld1q_f32(a + i + 4), n_load4(b, (size_t)i + 4, half)));
    }
    float s = sum8_neon(acc0, acc1);
    for (; i < n; i++) s += a[i] * elem(b, (size_t)i, half);
    return s;
}

INL_ARM void n_axpy_row(float *y, float a, const void *x, int n, bool half) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_n_f32(n_load4(x, (size_t)i, half), a)));
    for (; i < n; i++) y[i] += a * elem(x, (size_t)i, half);
}

static float n_dot(const float *a, const float *b, int n) { return n_dot_row(a, b, n, false); }

static void n_axpy(float *y, float a, const float *x, int n) { n_axpy_row(y, a, x, n, false); }

static void n_dot_rows(const float *q, const float *k, size_t stride, int rows, int n, float *out) {
    for (int r = 0; r < rows; r++) out[r] = n_dot_row(q, k + (size_t)r * stride, n, false);
}

static void n_axpy_rows(float *y, const float *a, const float *x, size_t stride, int rows, int n) {
    for (int r = 0; r < rows; r++) n_axpy_row(y, a[r], x + (size_t)r * stride, n, false);
}

static void n_dot_rows_f16(const float *q, const uint16_t *k, size_t stride, int rows, int n, float *out) {
    for (int r = 0; r < rows; r++) out[r] = n_dot_row(q, k + (size_t)r * stride, n, true);
}

static void n_axpy_rows_f16(float *y, const float *a, const uint16_t *x, size_t stride, int rows, int n) {
    for (int r = 0; r < rows; r++) n_axpy_row(y, a[r], x + (size_t)r * stride, n, true);
}

static void n_scale(float *y, float a, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_n_f32(vld1q_f32(y + i), a));
    for (; i < n; i++) y[i] *= a;
}

static float n_max(const float *x, int n) {
    float m = x[0];
    int i = 0;
    if (n >= 4) {
        float32x4_t v = vld1q_f32(x);
        for (i = 4; i + 4 <= n; i += 4) v = vmaxq_f32(v, vld1q_f32(x + i));
        m = vmaxvq_f32(v);
    }
    for (; i < n; i++)
        if (x[i] > m) m = x[i];
    return m;
}

/* e^x as exp8 of the AVX2 path: k = round(x / ln2), r = x - k ln2 (ln2 in two parts), e^r by
 * its degree-6 Taylor polynomial, 2^k added into the exponent; x clamped to [-86, 88] */
INL_ARM float32x4_t exp4_neon(float32x4_t x) {
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-86.0f)), vdupq_n_f32(88.0f));
    float32x4_t k = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(0.693145751953125f));
    r = vfmsq_f32(r, k, vdupq_n_f32(1.428606765330187e-06f));
    float32x4_t p = vdupq_n_f32(1.0f / 720.0f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    int32x4_t e = vshlq_n_s32(vcvtq_s32_f32(k), 23);
    return vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(p), e));
}

static float n_exp_sum(float *x, int n, float max) {
    float32x4_t vm = vdupq_n_f32(max), acc = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t e = exp4_neon(vsubq_f32(vld1q_f32(x + i), vm));
        vst1q_f32(x + i, e);
        acc = vaddq_f32(acc, e);
    }
    float s = vaddvq_f32(acc);
    if (i < n) { /* the tail through the same exp */
        float buf[4] = {0}, e[4];
        for (int k = i; k < n; k++) buf[k - i] = x[k] - max;
        vst1q_f32(e, exp4_neon(vld1q_f32(buf)));
        for (int k = i; k < n; k++) {
            x[k] = e[k - i];
            s += e[k - i];
        }
    }
    return s;
}

static void n_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0;
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        float32x4_t a = vld1q_f32(x + i), b = vld1q_f32(x + i + 4);
        acc0 = vaddq_f32(acc0, vmulq_f32(a, a));
        acc1 = vaddq_f32(acc1, vmulq_f32(b, b));
    }
    float ss = sum8_neon(acc0, acc1);
    for (; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    int k = 0;
    for (; k + 4 <= n; k += 4) vst1q_f32(out + k, vmulq_f32(vmulq_n_f32(vld1q_f32(x + k), scale), vld1q_f32(w + k)));
    for (; k < n; k++) out[k] = x[k] * scale * w[k];
}

INL_ARM float32x4_t silu4_neon(float32x4_t g) {
    return vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), exp4_neon(vnegq_f32(g))));
}
/* gelu(g) with tanh(y) = 1 - 2 / (e^(2y) + 1) */
INL_ARM float32x4_t gelu4_neon(float32x4_t g) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    float32x4_t y = vmulq_n_f32(vfmaq_f32(g, vmulq_n_f32(g, 0.044715f), vmulq_f32(g, g)), 0.7978845608028654f);
    float32x4_t th = vsubq_f32(one, vdivq_f32(vdupq_n_f32(2.0f), vaddq_f32(exp4_neon(vaddq_f32(y, y)), one)));
    return vmulq_f32(vmulq_n_f32(g, 0.5f), vaddq_f32(one, th));
}

static void n_silu_mul(float *g, const float *u, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(g + i, vmulq_f32(silu4_neon(vld1q_f32(g + i)), vld1q_f32(u + i)));
    for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void n_gelu_mul(float *g, const float *u, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(g + i, vmulq_f32(gelu4_neon(vld1q_f32(g + i)), vld1q_f32(u + i)));
    const float c = 0.7978845608028654f;
    for (; i < n; i++) {
        float x = g[i];
        g[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * u[i];
    }
}

static void n_add(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vld1q_f32(x + i)));
    for (; i < n; i++) y[i] += x[i];
}

static const kvg_vec_ops NEON_OPS = {n_dot, n_axpy, n_dot_rows, n_axpy_rows,
                                     n_dot_rows_f16, n_axpy_rows_f16,
                                     n_scale, n_exp_sum, n_max, n_rmsnorm,
                                     n_silu_mul, n_gelu_mul, n_add, p_gelu_erf};

static void n_kv_dot_f32(const float *q, const void *k, size_t row_bytes, int rows, int n, float *out) {
    n_dot_rows(q, k, row_bytes / sizeof(float), rows, n, out);
}
static void n_kv_axpy_f32(float *y, const float *a, const void *x, size_t row_bytes, int rows, int n) {
    n_axpy_rows(y, a, x, row_bytes / sizeof(float), rows, n);
}
static void n_kv_dot_f16(const float *q, const void *k, size_t row_bytes, int rows, int n, float *out) {
    n_dot_rows_f16(q, k, row_bytes / sizeof(uint16_t), rows, n, out);
}
static void n_kv_axpy_f16(float *y, const float *a, const void *x, size_t row_bytes, int rows, int n) {
    n_axpy_rows_f16(y, a, x, row_bytes / sizeof(uint16_t), rows, n);
}

/* The block types, as the AVX2 path does them: keys dotted in integers with q rounded once per
 * run to 8 bits per block of 32 (d = amax / 127), each block's 32 products widened and summed
 * to 4 int32 (vmull_s8, vpadalq_s16) and scaled once by d_q * d_k; values widened to floats in
 * registers and added with each row's weight times its d. */
#define N_KV_MAX_BLOCKS 16 /* head_dim up to 512 in integers; wider rows take the portable loop */

/* a block's 32 elements as int8 (q4_0: nibbles unpacked, minus 8) */
INL_ARM void n_block_ints(const unsigned char *blk, bool q4, int8x16_t *lo, int8x16_t *hi) {
    if (q4) {
        uint8x16_t qs = vld1q_u8(blk + 2), mask = vdupq_n_u8(0x0f);
        int8x16_t eight = vdupq_n_s8(8);
        *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(qs, mask)), eight);
        *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(qs, 4)), eight);
    } else {
        *lo = vld1q_s8((const int8_t *)(blk + 2));
        *hi = vld1q_s8((const int8_t *)(blk + 18));
    }
}

/* q's nb blocks as int8 (rounded to nearest, ties to even, as the AVX2 path) and their scales */
INL_ARM void n_quantize_q(const float *q, int nb, int8x16_t (*qq)[2], float *dq) {
    for (int b = 0; b < nb; b++) {
        const float *qb = q + b * KV_BLOCK;
        float32x4_t v[8];
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int j = 0; j < 8; j++) {
            v[j] = vld1q_f32(qb + 4 * j);
            m = vmaxq_f32(m, vabsq_f32(v[j]));
        }
        float amax = vmaxvq_f32(m);
        dq[b] = amax / 127.0f;
        float32x4_t id = vdupq_n_f32(amax > 0.0f ? 127.0f / amax : 0.0f);
        int16x8_t h[4];
        for (int j = 0; j < 4; j++)
            h[j] = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_f32(v[2 * j], id))),
                                vqmovn_s32(vcvtnq_s32_f32(vmulq_f32(v[2 * j + 1], id))));
        qq[b][0] = vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1]));
        qq[b][1] = vcombine_s8(vqmovn_s16(h[2]), vqmovn_s16(h[3]));
    }
}

/* the 4 int32 partial sums of a key block's products with q's block, as floats */
INL_ARM float32x4_t n_block_dot(int8x16_t klo, int8x16_t khi, const int8x16_t *qb) {
    int32x4_t acc = vdupq_n_s32(0);
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(klo), vget_low_s8(qb[0])));
    acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(klo), vget_high_s8(qb[0])));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(khi), vget_low_s8(qb[1])));
    acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(khi), vget_high_s8(qb[1])));
    return vcvtq_f32_s32(acc);
}

static void n_kv_dot_blocks(const float *q, const void *k, size_t row_bytes, int rows, int n, float *out, bool q4) {
    size_t bb = q4 ? KVG_Q4_0_BYTES : KVG_Q8_0_BYTES;
    int nb = n / KV_BLOCK;
    if (nb > N_KV_MAX_BLOCKS) {
        if (q4) p_kv_dot_q4_0(q, k, row_bytes, rows, n, out);
        else p_kv_dot_q8_0(q, k, row_bytes, rows, n, out);
        return;
    }
    int8x16_t qq[N_KV_MAX_BLOCKS][2];
    float dq[N_KV_MAX_BLOCKS];
    n_quantize_q(q, nb, qq, dq);
    for (int r = 0; r < rows; r++) {
        const unsigned char *row = (const unsigned char *)k + (size_t)r * row_bytes;
        float32x4_t acc = vdupq_n_f32(0.0f);
        for (int b = 0; b < nb; b++) {
            const unsigned char *blk = row + (size_t)b * bb;
            int8x16_t lo, hi;
            n_block_ints(blk, q4, &lo, &hi);
            acc = vfmaq_n_f32(acc, n_block_dot(lo, hi, qq[b]), block_d(blk) * dq[b]);
        }
        out[r] = vaddvq_f32(acc);
    }
}

/* y's block of 32 floats stays in registers over every row */
static void n_kv_axpy_blocks(float *y, const float *a, const void *x, size_t row_bytes, int rows, int n, bool q4) {
    size_t bb = q4 ? KVG_Q4_0_BYTES : KVG_Q8_0_BYTES;
    for (int b = 0; b < n / KV_BLOCK; b++) {
        float *yb = y + b * KV_BLOCK;
        float32x4_t acc[8];
        for (int j = 0; j < 8; j++) acc[j] = vld1q_f32(yb + 4 * j);
        const unsigned char *blk = (const unsigned char *)x + (size_t)b * bb;
        for (int r = 0; r < rows; r++, blk += row_bytes) {
            int8x16_t half[2];
            n_block_ints(blk, q4, &half[0], &half[1]);
            float c = a[r] * block_d(blk);
            for (int h = 0; h < 2; h++) {
                int16x8_t w0 = vmovl_s8(vget_low_s8(half[h])), w1 = vmovl_s8(vget_high_s8(half[h]));
                int16x8_t w[2] = {w0, w1};
                for (int j = 0; j < 2; j++) {
                    float32x4_t e0 = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w[j])));
                    float32x4_t e1 = vcvtq_f32_s32(vmovl_s16(vget_high_s16(w[j])));
                    acc[4 * h + 2 * j] = vfmaq_n_f32(acc[4 * h + 2 * j], e0, c);
                    acc[4 * h + 2 * j + 1] = vfmaq_n_f32(acc[4 * h + 2 * j + 1], e1, c);
                }
            }
        }
        for (int j = 0; j < 8; j++) vst1q_f32(yb + 4 * j, acc[j]);
    }
}

static void n_kv_dot_q8_0(const float *q, const void *k, size_t row_bytes, int rows, int n, float *out) {
    n_kv_dot_blocks(q, k, row_bytes, rows, n, out, false);
}
static void n_kv_axpy_q8_0(float *y, const float *a, const void *x, size_t row_bytes, int rows, int n) {
    n_kv_axpy_blocks(y, a, x, row_bytes, rows, n, false);
}
static void n_kv_dot_q4_0(const float *q, const void *k, size_t row_bytes, int rows, int n, float *out) {
    n_kv_dot_blocks(q, k, row_bytes, rows, n, out, true);
}
static void n_kv_axpy_q4_0(float *y, const float *a, const void *x, size_t row_bytes, int rows, int n) {
    n_kv_axpy_blocks(y, a, x, row_bytes, rows, n, true);
}

KV_EACH_HEAD(n_kv_dot_f32, n_kv_axpy_f32)
KV_EACH_HEAD(n_kv_dot_f16, n_kv_axpy_f16)
KV_EACH_HEAD(n_kv_dot_q8_0, n_kv_axpy_q8_0)
KV_EACH_HEAD(n_kv_dot_q4_0, n_kv_axpy_q4_0)

static const kvg_vec_kv NEON_KV[] = {
    KV_ROW(KVG_TYPE_F32, n_kv_dot_f32, n_kv_axpy_f32),
    KV_ROW(KVG_TYPE_F16, n_kv_dot_f16, n_kv_axpy_f16),
    KV_ROW(KVG_TYPE_Q8_0, n_kv_dot_q8_0, n_kv_axpy_q8_0),
    KV_ROW(KVG_TYPE_Q4_0, n_kv_dot_q4_0, n_kv_axpy_q4_0),
};
#endif

const kvg_vec_ops *kvg_vec_ops_of(kvg_cpu_isa isa) {
#ifdef KVG_X86
    if (isa == KVG_ISA_AVX2 || isa == KVG_ISA_AVX512 || isa == KVG_ISA_AVXVNNI || isa == KVG_ISA_AVX512VNNI)
        return &AVX2_OPS;
#endif
#ifdef KVG_ARM
    if (isa == KVG_ISA_NEON || isa == KVG_ISA_DOTPROD) return &NEON_OPS;
#endif
    (void)isa;
    return &PORTABLE;
}

static const kvg_vec_kv *kv_row_in(const kvg_vec_kv *rows, size_t n, uint32_t type) {
    for (size_t i = 0; i < n; i++)
        if (rows[i].type == type) return &rows[i];
    return NULL;
}

const kvg_vec_kv *kvg_vec_kv_of(kvg_cpu_isa isa, uint32_t type) {
#define KV_ROWS(t) kv_row_in(t, sizeof t / sizeof t[0], type)
#ifdef KVG_X86
    if (isa == KVG_ISA_AVX2 || isa == KVG_ISA_AVX512 || isa == KVG_ISA_AVXVNNI || isa == KVG_ISA_AVX512VNNI)
        return KV_ROWS(AVX2_KV);
#endif
#ifdef KVG_ARM
    if (isa == KVG_ISA_NEON || isa == KVG_ISA_DOTPROD) return KV_ROWS(NEON_KV);
#endif
    (void)isa;
    return KV_ROWS(PORTABLE_KV);
#undef KV_ROWS
}
