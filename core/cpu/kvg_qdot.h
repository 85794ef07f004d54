/* kvg_qdot.h: the cpu backend's kernels (private): run-time ISA detection (cpu_features.c),
 * dot products of packed weight rows with quantized activations (qdot_*.c, tables in qdot_tables.c) and the f32 vector
 * operations of the forward pass (cpu_vec.c).
 *
 * Every kernel exists once per operation, with an inner loop per instruction set: portable C,
 * x86-64 AVX2+FMA+F16C, AVX-512 (F/BW/VL/DQ, VNNI's vpdpwssd where the CPU has it), AArch64
 * Advanced SIMD (neon) and its ARMv8.2 dot product (dotprod: SDOT), compiled with per-function
 * target attributes so the library itself needs no -m or -march flag. The path is chosen once
 * per model (kvg_cpu_isa_choose); other hosts run the portable C. Per path:
 *   portable  every type in C; libm's exp and tanh
 *   avx2      every type; the activations' bytes of the portable path, sums in other orders;
 *             Q2_K, Q3_K, Q4_K, Q5_K, Q6_K in groups of 16 rows against the byte activations
 *             of the avx512vnni groups (vpmaddubsw, qdot_x86.c), the bits of their portable
 *             row kernels
 *   avx512    the 32-element and float types; the float types also in groups of 16 rows
 *             (4 rows by 4 tokens of FMAs, the bits of their row kernels; avx512vnni too); the
 *             K types (avx2's groups and loops) and the vector ops run avx2's code
 *   avxvnni   avx2's, but the K types' groups (IQ4_XS's too) multiply with AVX-VNNI's 256-bit
 *             vpdpbusd
 *   neon      every type (levels as int8, widening multiply-adds) and the vector ops: the
 *             portable path's bits (exact integer sums, then its f32 operations in its order)
 *             but for exp (softmax, SiLU, GELU: avx2's polynomial); the 32-element types and
 *             the K types but Q8_K in the avx512vnni path's groups of 16 rows against the same
 *             byte activations (qdot_arm.c), the bits of their portable row kernels
 *   dotprod   every integer type with SDOT (the groups too, by element); the float types and
 *             the vector ops run neon's; the portable path's bits as neon
 *   avx512vnni the 32-element types and the K types but Q8_K in groups of 16 rows (one row per
 *             lane, vpdpbusd) against 15-bit activations split into two bytes (KVG_ACT_QS), or
 *             8-bit ones (KVG_ACT_Q8, kvg_qdot_kernel_fast), in blocks of 32 (the K types' scales
 *             applied per block of 32 or 16, qdot_x86.c); the group kernels give the bits of their
 *             portable row kernels; the rest runs avx512's and avx2's loops
 *
 * Activations are quantized per block to 16-bit integers, so that a block's products with the
 * weights' integer levels are summed exactly in integers and the scales are applied in f32 (the
 * scheme of ggml's CPU dot products, whose int8 activations move the logits of a 30-layer model
 * by ~2-3% of their range and flip ~4% of the near-tied top-1 choices; 16 bits keep within
 * ~0.3% and flip almost none): rows dotted with weights of the 32-element types (Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0, IQ4_NL) take blocks of 32 int16 in [-32767, 32767] with an f32 scale d and
 * s = d * sum(q) (for the types' minimums); rows for the 256-element K types (Q2_K..Q6_K,
 * Q8_K, IQ4_XS) take blocks of 256 in [-4095, 4095] (so a block's sums cannot overflow int32)
 * with an f32 scale and the 16 sums of 16. F32, F16 and BF16 weights are dotted with the f32
 * activations. The group types take bytes (VNNI, vpmaddubsw and SDOT multiply bytes):
 * 15-bit activations as two byte rows by default, 8-bit ones (ggml's own scheme, faster and
 * coarser) where the model asks for them. */
#ifndef KVG_QDOT_H
#define KVG_QDOT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvg_model.h"
#include "kvg_quant.h"

/* ---- instruction sets (cpu_features.c) ------------------------------------------------- */

/* later rows are preferred where the CPU has them (kvg_cpu_isa_best) */
typedef enum kvg_cpu_isa {
    KVG_ISA_PORTABLE,
    KVG_ISA_AVX2,
    KVG_ISA_AVX512,
    KVG_ISA_AVXVNNI,
    KVG_ISA_NEON,
    KVG_ISA_DOTPROD,
    KVG_ISA_AVX512VNNI,
    KVG_ISA_COUNT
} kvg_cpu_isa;

typedef struct kvg_cpu_features {
    bool avx2, fma, f16c;
    bool avx512f, avx512dq, avx512bw, avx512vl, avx512vnni;
    bool avxvnni; /* AVX-VNNI: vpdpbusd on ymm registers (VEX) */
    bool asimd, asimddp; /* AArch64 Advanced SIMD; its SDOT/UDOT (ARMv8.2 dot product) */
} kvg_cpu_features;

/* what cpuid and the OS (x86-64) or the kernel's HWCAP bits (AArch64 Linux) say, read once */
const kvg_cpu_features *kvg_cpu_features_get(void);
/* "avx2 fma f16c" (the features above this CPU has) into buf, like snprintf */
size_t kvg_cpu_features_describe(char *buf, size_t size);
/* the path needs: avx2 = AVX2+FMA+F16C; avx512 = that and AVX-512 F/BW/VL/DQ; avx512vnni = that
 * and AVX-512 VNNI; avxvnni = avx2's and AVX-VNNI; neon = AArch64 Advanced SIMD; dotprod = that
 * and the dot product instructions */
bool kvg_cpu_isa_supported(kvg_cpu_isa isa);
kvg_cpu_isa kvg_cpu_isa_best(void);
/* "portable", "avx2", "avx512", "avxvnni", "neon", "dotprod", "avx512vnni" */
const char *kvg_cpu_isa_name(kvg_cpu_isa isa);
/* The path a model runs: KVGEN_CPU_ISA (one of those names) when set, refused with
 * KVGEN_E_UNSUPPORTED when this CPU lacks it, else the best the CPU has. */
kvgen_status kvg_cpu_isa_choose(const char *who, kvg_cpu_isa *out, kvgen_error *err);

/* ---- quantized activations -------------------------------------------------------------- */

#define KVG_QK KVG_QK_BLOCK /* elements of a K-type block */
#define KVG_QB KVG_QB_BLOCK /* elements of a 32-element block */
#define KVG_QDOT_TILE 4 /* activation rows one kernel call dots a weight row with, at most */
#define KVG_GROUP_TILE 8 /* activation rows one group kernel call takes, at most */
#define KVG_QB_LEVELS 32767 /* |q| bound of 32-element blocks */
#define KVG_QK_LEVELS 4095  /* |q| bound of K blocks */
#define KVG_Q8_LEVELS 127   /* |q| bound of the 8-bit blocks */
#define KVG_QS_LEVELS 16383 /* |q| bound of the split 16-bit blocks */
#define KVG_QDOT_GROUP 16   /* weight rows a group kernel computes together */

typedef enum kvg_act_kind {
    KVG_ACT_F32, /* f32 rows as they are (F32, F16, BF16 weights) */
    KVG_ACT_QB,  /* blocks of 32: int16 q, f32 d, f32 s = d * sum(q) */
    KVG_ACT_QK,  /* blocks of 256: int16 q, f32 d, int32 sums of each 16 */
    KVG_ACT_Q8,  /* blocks of 32: int8 q, f32 d, f32 s = d * sum(q) */
    KVG_ACT_QS   /* blocks of 32 of 15-bit q = 256 hi + lo, as two int8 rows (lo in [-128, 127],
                  * hi in [-64, 64]), f32 d, f32 s = d * sum(q): 16-bit accuracy with 8-bit products */
} kvg_act_kind;

/* The activation rows of one block of tokens in every form some weight of a job needs; row t
 * of each array starts at t times its row length (n, n/32, n/256, n/16). */
typedef struct kvg_qact {
    int n;              /* elements per row */
    const float *x;     /* [nt][n] */
    const int16_t *qb;  /* KVG_ACT_QB: [nt][n] */
    const float *db;    /* [nt][n/32] */
    const float *sb;    /* [nt][n/32] */
    const int16_t *qk;  /* KVG_ACT_QK: [nt][n] */
    const float *dk;    /* [nt][n/256] */
    const int32_t *bk;  /* [nt][n/16] */
    /* KVG_ACT_Q8 and KVG_ACT_QS (a model's matrices take one of the two, never both) */
    const int8_t *q8;   /* Q8: q; QS: lo; [nt][n] */
    const int8_t *q8h;  /* QS: hi, [nt][n] */
    const float *d8;    /* [nt][n/32] */
    const float *s8;    /* [nt][n/32] */
    const int32_t *b8;  /* [nt][n/16]: the sums of each 16 of q (QS: 256 hi + lo), for the K types'
                         * offsets and minimums per 16 */
} kvg_qact;

/* out[i * out_stride] = dot(weight row w, activation row t + i) for i < nt <= KVG_QDOT_TILE; w
 * in the kernel's layout (kvg_qdot_kernel.repack).
 * Each output is computed by the same sequence of operations whatever nt is, so a token's
 * results do not depend on the tile (or the batch) it came in. */
typedef void (*kvg_qdot_fn)(const uint8_t *w, const kvg_qact *a, int t, int nt, float *out, size_t out_stride);

/* One row of n elements from the file's layout into the one `dot` reads (the same size). */
typedef void (*kvg_qdot_repack_fn)(const uint8_t *src, uint8_t *dst, int n);

/* out[i * out_stride + r] = dot(row r of a group of KVG_QDOT_GROUP weight rows, activation row
 * t + i) for r < KVG_QDOT_GROUP, i < nt <= KVG_GROUP_TILE; g: the group in the layout of
 * kvg_qdot_kernel.group_pack. Each output is the same bits whatever nt is. */
typedef void (*kvg_qdot_group_fn)(const uint8_t *g, const kvg_qact *a, int t, int nt, float *out, size_t out_stride);
/* KVG_QDOT_GROUP rows of n elements, each row_bytes apart in the file's layout, into one group
 * of group_bytes(n) bytes */
typedef void (*kvg_qdot_group_pack_fn)(const uint8_t *src, size_t row_bytes, uint8_t *dst, int n);
typedef size_t (*kvg_qdot_group_bytes_fn)(int n);

typedef struct kvg_qdot_kernel {
    uint32_t type;      /* the weight type (kvg_quant.h) */
    kvg_act_kind act;   /* the activations it takes */
    kvg_qdot_fn dot;
    /* NULL: dot reads rows as the file stores them; else rows must be repacked first (the
     * 32-element types: their scales grouped, see qdot_internal.h). The same on every path. */
    kvg_qdot_repack_fn repack;
    /* NULL, or the kernel of KVG_QDOT_GROUP rows at once (rows interleaved so that each vector
     * lane is one row: no horizontal sums), for a matrix whose row count is a multiple of
     * KVG_QDOT_GROUP; it gives the bits of `dot` */
    kvg_qdot_group_fn group;
    kvg_qdot_group_pack_fn group_pack;
    kvg_qdot_group_bytes_fn group_bytes;
} kvg_qdot_kernel;

/* The kernel of `type` on path isa; NULL for a type not in quant.c's traits table. Every
 * traits type has one on every path. */
const kvg_qdot_kernel *kvg_qdot_kernel_of(kvg_cpu_isa isa, uint32_t type);
/* The kernel with 8-bit activations (KVG_ACT_Q8: faster, ~30x coarser) where the path has one
 * for the type, else kvg_qdot_kernel_of's. */
const kvg_qdot_kernel *kvg_qdot_kernel_fast(kvg_cpu_isa isa, uint32_t type);
/* one row of n floats into QB blocks (n a multiple of 32) or QK blocks (of 256); the same
 * bytes on every path */
void kvg_qdot_quantize_qb(kvg_cpu_isa isa, const float *x, int n, int16_t *q, float *d, float *s);
void kvg_qdot_quantize_qk(kvg_cpu_isa isa, const float *x, int n, int16_t *q, float *d, int32_t *bsum);
/* one row into Q8 blocks of 32 (int8 in [-127, 127], d, s = d * sum(q)), or with hi != NULL
 * into QS blocks (q in [-16383, 16383] as lo and hi bytes), and the sums of each 16 of q into
 * b16 (n/16 of them); the same bytes on every path */
void kvg_qdot_quantize_q8(kvg_cpu_isa isa, const float *x, int n, int8_t *lo, int8_t *hi, float *d, float *s,
                          int32_t *b16);

/* ---- f32 vector operations (cpu_vec.c) ---------------------------------------------------- */

typedef struct kvg_vec_ops {
    float (*dot)(const float *a, const float *b, int n);
    void (*axpy)(float *y, float a, const float *x, int n);   /* y += a x */
    /* attention over a run of keys or values, rows `stride` floats apart:
     * out[r] = dot(q, k + r stride); y += sum_r a[r] (x + r stride) */
    void (*dot_rows)(const float *q, const float *k, size_t stride, int rows, int n, float *out);
    void (*axpy_rows)(float *y, const float *a, const float *x, size_t stride, int rows, int n);
    /* the same over rows of IEEE halves (f16 KV pages, as their bits): the bits of dot_rows and
     * axpy_rows on the rows converted to f32 */
    void (*dot_rows_f16)(const float *q, const uint16_t *k, size_t stride, int rows, int n, float *out);
    void (*axpy_rows_f16)(float *y, const float *a, const uint16_t *x, size_t stride, int rows, int n);
    void (*scale)(float *y, float a, int n);                  /* y *= a */
    /* x[i] = exp(x[i] - max), returns their sum (the softmax's denominator) */
    float (*exp_sum)(float *x, int n, float max);
    float (*max)(const float *x, int n);
    /* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]; out may alias x */
    void (*rmsnorm)(float *out, const float *x, const float *w, int n, float eps);
    /* g[i] = act(g[i]) * u[i] for SiLU and GELU (tanh approximation) */
    void (*silu_mul)(float *g, const float *u, int n);
    void (*gelu_mul)(float *g, const float *u, int n);
    void (*add)(float *y, const float *x, int n);             /* y += x */
    /* x[i] = gelu(x[i] + b[i]) (b NULL: x[i] alone) with the exact GELU, 0.5 x (1 + erf(x /
     * sqrt 2)): libm's erff on the portable path, a polynomial within ~3e-7 of 1 + erf on the
     * vector paths (an encoder's feed-forward) */
    void (*gelu_erf)(float *x, const float *b, int n);
} kvg_vec_ops;

const kvg_vec_ops *kvg_vec_ops_of(kvg_cpu_isa isa);

/* Attention over a run of `rows` rows of KV pages of one type (kvg_cpu.h), row_bytes apart, each
 * of n elements (whole blocks for a block type): out[r] = dot(q, row r); y += sum_r a[r] row r.
 * One row per type in each path's table; a block type's kernels read the pages as they are,
 * never into a copy of the run: the values' kernel widens one block to floats in registers
 * and scales each row's weight by the block's d; the keys' kernel (AVX2) rounds q to 8 bits
 * per block of 32 once per call and dots each key block in integers, scaled once by both
 * blocks' d (portable: in f32, the block's products summed and then scaled). */
typedef struct kvg_vec_kv {
    uint32_t type; /* KVG_TYPE_* */
    void (*dot_rows)(const float *q, const void *k, size_t row_bytes, int rows, int n, float *out);
    void (*axpy_rows)(float *y, const float *a, const void *x, size_t row_bytes, int rows, int n);
    /* The same for `heads` query heads that share the run (grouped-query attention): head h's
     * query at q + h * q_stride, its dots at out + h * out_stride; its output at y + h * y_stride,
     * its weights at a + h * a_stride. Each head gets the bits of dot_rows and axpy_rows alone;
     * where a path has a kernel for several heads (AVX2: f32 and f16), a row is loaded and
     * widened once for up to 4 heads rather than once per head. */
    void (*dot_heads)(const float *q, size_t q_stride, int heads, const void *k, size_t row_bytes, int rows, int n,
                      float *out, size_t out_stride);
    void (*axpy_heads)(float *y, size_t y_stride, int heads, const float *a, size_t a_stride, const void *x,
                       size_t row_bytes, int rows, int n);
} kvg_vec_kv;
/* the path's row for KV type `type`; NULL when it has none */
const kvg_vec_kv *kvg_vec_kv_of(kvg_cpu_isa isa, uint32_t type);

#endif
