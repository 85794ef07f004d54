/* test_cpu_backend.c: the cpu backend (fast.c, its kernels qdot_*.c and cpu_vec.c) against the
 * reference backend. (Over 1,000 lines: one table of types times instruction-set paths.)
 * - Kernels, for every type of the traits table on every instruction-set path this CPU has: a
 *   weight row (quantized by quant.c) dotted with quantized activation rows equals the double
 *   dot of the row dequantized by quant.c with the activations dequantized (to f32 rounding:
 *   within 1e-5 of sum |w a|), so each type's integer decoding is checked against quant.c's;
 *   tiles of 1..4 activation rows give the same bits; the activations quantize to the same bytes
 *   on every path. The vector operations (exp, RMSNorm, SiLU, GELU and the exact GELU,
 *   attention's runs of keys) are checked against libm and the reference's helpers; a run of
 *   keys gives the same bits however it is split; the f16 forms of the runs (the cpu backend's KV
 *   pages are f16) give the f32 forms' bits on the rows converted to f32, on every path. Group
 *   kernels (avx512vnni, avx2, avxvnni, neon, dotprod: the 32-element and K types, on avx2 with
 *   15-bit activations not Q8_0, IQ4_NL and IQ4_XS; avx512: the K types, the same way; avx512
 *   and avx512vnni: the float types, also on
 *   rows with a tail past their vectors) give their row kernels' bits on every tile, also on
 *   rows of 3 K blocks (an odd number for the K types) and on levels and activation bytes at
 *   the ends of their ranges; each of those paths has them in its tables at both activation precisions; Q4_K_M
 *   models' logits (also with rows of 3 K blocks, an output matrix that does not fill groups,
 *   and 8-bit activations), and a Q5_1 model's, are the same bits on every x86 path with
 *   those groups.
 * - Models, against the reference: random models of every traits type, and of the
 *   architecture features (qwen2 biases, qwen3 Q/K norms and wide heads, gemma2 post norms,
 *   soft-capping, sliding window, llama rope_freqs): all prefill logits and the decodes after,
 *   within TOL_REL of the reference's logit range (activations are quantized to 16 bits, 13
 *   for the K types, and K/V kept in f16, so the cpu backend is not exact; the measured figures
 *   are printed), and the same top-1 at all positions but at most one.
 * - Exactness within the cpu backend: 1, 2 and 3 threads give the same bits; a prefill's logits
 *   equal token-by-token decodes; a batch of several sessions' decodes (kvg_session_decode_batch)
 *   equals each decoded alone; a fork continues as a fresh session of the same text; a session
 *   saved and restored continues as the original; a context shift matches the reference's
 *   within the tolerance.
 * - Each instruction-set path against the best one and the portable one (within TOL_REL, with
 *   8-bit activations TOL_REL_8; the x86 paths sum in different orders); the AArch64 paths
 *   (neon, dotprod) give the portable path's bits in every row kernel (their groups those of the
 *   portable row kernels of the byte activations), in dot, axpy and RMSNorm, and each other's
 *   bits in the models' logits (they share the vector ops, whose exp is not libm's);
 *   KVGEN_CPU_ISA refuses a bad name and a path this CPU lacks (set for the run, it puts the
 *   models on that path, and their checks expect that path's kernels). KVGEN_TEST_EXPECT_ISA, when
 *   set, is the path the run-time detection must pick (the AArch64 stage runs under qemu with
 *   and without the dot product); KVGEN_TEST_EXPECT_PATHS, paths that must be on offer (the
 *   sanitizer build's avxvnni stand-in, KVGEN_TEST_AVXVNNI_EVEX, on an AVX-512 VNNI CPU).
 * - The default model (when present): top-1 agreement with the reference at >= 99% of the
 *   positions of a ~256-token teacher-forced text; against llama.cpp on the same weights in f32
 *   (test_parity's fixture: the reference's bounds, top-1 everywhere and logits within 0.1),
 *   and, for the record, against llama.cpp's own 8-bit-activation run (its native fixture). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_qdot.h"
#include "kvg_quant.h"
#include "kvg_reference.h"
#include "kvg_session.h"
#include "testutil.h"

/* max |cpu - reference| / (max - min of the reference's logits), per position. Measured (AVX2
 * and portable paths, the cpu backend's f16 K/V against the reference's f32): random models of
 * every type 0.0001-0.0005 (the K types' 13-bit activations the most; with f32 K/V the
 * 32-element and float types were 0.0000), the default model 0.0007 over 249 tokens (0.0003
 * with f32 K/V); the bound has a 7x margin. */
#define TOL_REL 0.005
/* the same with 8-bit activations (kvgen_model_desc.activation_bits = 8, llama.cpp's arithmetic).
 * Measured (avx512vnni): random models of the 32-element types up to 0.0093, the default model
 * 0.0375 over 249 tokens (its top-1 then changes at 8 of them). */
#define TOL_REL_8 0.06
#define N_PROMPT 24
#define N_DEC 6

static uint32_t rng_state = 12345;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)((rng_state >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

/* ---- kernels ---- */

static char isa_env_saved[64]; /* KVGEN_CPU_ISA as the test found it */

/* the paths that compute the portable path's integer sums and f32 operations in its order */
static bool same_bits_as_portable(int isa) { return isa == KVG_ISA_NEON || isa == KVG_ISA_DOTPROD; }

/* A group kernel (KVG_QDOT_GROUP rows at once, one per lane) gives, for every row and every
 * tile, the bits of the kernel's row-by-row dot on the same rows: random rows, or the
 * KVG_QDOT_GROUP rows `given` (in the file's layout). */
static void check_group_kernel(int isa, uint32_t type, const kvg_qdot_kernel *k, const kvg_qact *a, int n, int nt,
                               const uint8_t *given) {
    enum { G = KVG_QDOT_GROUP };
    size_t rb = kvg_row_bytes(type, (uint64_t)n);
    float *wf = malloc((size_t)n * sizeof(float));
    uint8_t *rows = malloc(rb * G), *row = malloc(rb), *group = malloc(k->group_bytes(n));
    float *by_row = malloc((size_t)nt * G * sizeof(float)), *by_group = malloc((size_t)nt * G * sizeof(float));
    CHECK(k->group_bytes(n) == rb * G);
    for (int r = 0; r < G; r++) {
        float amp = r % 3 == 0 ? 0.05f : r % 3 == 1 ? 1.0f : 20.0f;
        for (int i = 0; i < n; i++) wf[i] = frand() * amp + (r % 4 == 3 ? 0.3f * amp : 0.0f);
        kvg_quantize_row(type, wf, rows + rb * (size_t)r, (uint64_t)n);
    }
    if (given) memcpy(rows, given, rb * G);
    k->group_pack(rows, rb, group, n);
    for (int r = 0; r < G; r++) {
        memcpy(row, rows + rb * (size_t)r, rb);
        if (k->repack) k->repack(rows + rb * (size_t)r, row, n);
        for (int t = 0; t < nt; t++) k->dot(row, a, t, 1, &by_row[(size_t)t * G + r], 1);
    }
    int bad = -1; /* the first output whose bits differ */
    for (int t0 = 0; t0 < 2 && t0 < nt; t0++) { /* tiles from token 0 and from token 1 */
        memset(by_group, 0, (size_t)nt * G * sizeof(float));
        for (int t = t0; t < nt; t += KVG_GROUP_TILE)
            k->group(group, a, t, nt - t < KVG_GROUP_TILE ? nt - t : KVG_GROUP_TILE, by_group + (size_t)t * G, G);
        for (int i = t0 * G; bad < 0 && i < nt * G; i++)
            if (memcmp(&by_group[i], &by_row[i], sizeof(float)) != 0) bad = i;
        if (bad >= 0) break;
    }
    CHECKF(bad < 0, "%s %s: the group kernel's bits differ from its rows' at token %d row %d (%.9g vs %.9g)",
           kvg_type_name(type), kvg_cpu_isa_name((kvg_cpu_isa)isa), bad / G, bad % G, bad >= 0 ? by_group[bad] : 0.0,
           bad >= 0 ? by_row[bad] : 0.0);
    free(wf);
    free(rows);
    free(row);
    free(group);
    free(by_row);
    free(by_group);
}

static void test_kernels(void) {
    uint32_t types[32];
    size_t n_types = kvg_traits_types(types, 32);
    enum { N = 512, NT = 9 }; /* activation rows: more than one tile of each kind */
    float *wf = malloc(N * sizeof(float)), *xf = malloc(NT * N * sizeof(float)), *deq = malloc(N * sizeof(float));
    uint8_t *w = malloc(kvg_row_bytes(KVG_TYPE_F32, N)), *packed = malloc(kvg_row_bytes(KVG_TYPE_F32, N));
    size_t qbytes = NT * N * sizeof(int16_t);
    int16_t *qb = malloc(qbytes), *qk = malloc(qbytes), *qb0 = malloc(qbytes), *qk0 = malloc(qbytes);
    float db[NT * N / 32], sb[NT * N / 32], dk[NT * N / 256], db0[NT * N / 32], dk0[NT * N / 256];
    int32_t bk[NT * N / 16], bk0[NT * N / 16];
    int8_t q8[NT * N], q80[NT * N], qs[NT * N], qsh[NT * N], qs0[NT * N], qsh0[NT * N];
    int32_t b8[NT * N / 16], bs[NT * N / 16];
    float d8[NT * N / 32], s8[NT * N / 32], d80[NT * N / 32], s80[NT * N / 32];
    float ds[NT * N / 32], ss[NT * N / 32], ds0[NT * N / 32], ss0[NT * N / 32];
    static float portable_out[32][3][NT]; /* the portable path's results per type and trial */
    for (int i = 0; i < NT * N; i++) xf[i] = frand() * (i % 7 == 0 ? 3.0f : 1.0f);
    for (int i = 96; i < 128; i++) xf[i] = i == 100 ? -0.0f : 0.0f; /* a block of zeros quantizes to zeros */
    for (int isa = 0; isa < KVG_ISA_COUNT; isa++) {
        if (!kvg_cpu_isa_supported((kvg_cpu_isa)isa)) {
            printf("kernels: %s path: not on this CPU\n", kvg_cpu_isa_name((kvg_cpu_isa)isa));
            continue;
        }
        for (int t = 0; t < NT; t++) {
            kvg_qdot_quantize_qb((kvg_cpu_isa)isa, xf + t * N, N, qb + t * N, db + t * (N / 32), sb + t * (N / 32));
            kvg_qdot_quantize_qk((kvg_cpu_isa)isa, xf + t * N, N, qk + t * N, dk + t * (N / 256), bk + t * (N / 16));
            kvg_qdot_quantize_q8((kvg_cpu_isa)isa, xf + t * N, N, q8 + t * N, NULL, d8 + t * (N / 32), s8 + t * (N / 32),
                                 b8 + t * (N / 16));
            kvg_qdot_quantize_q8((kvg_cpu_isa)isa, xf + t * N, N, qs + t * N, qsh + t * N, ds + t * (N / 32),
                                 ss + t * (N / 32), bs + t * (N / 16));
        }
        for (int g = 0; g < NT * N / 16; g++) { /* the sums of 16 on every path */
            int sum8 = 0, sums = 0;
            for (int i = 16 * g; i < 16 * g + 16; i++) sum8 += q8[i], sums += 256 * qsh[i] + qs[i];
            CHECKF(b8[g] == sum8 && bs[g] == sums, "%s: sums of 16 at %d: %d %d vs %d %d",
                   kvg_cpu_isa_name((kvg_cpu_isa)isa), g, b8[g], bs[g], sum8, sums);
        }
        if (isa == KVG_ISA_PORTABLE) {
            memcpy(qb0, qb, qbytes);
            memcpy(qk0, qk, qbytes);
            memcpy(db0, db, sizeof db);
            memcpy(dk0, dk, sizeof dk);
            memcpy(bk0, bk, sizeof bk);
            memcpy(q80, q8, sizeof q8);
            memcpy(d80, d8, sizeof d8);
            memcpy(s80, s8, sizeof s8);
            memcpy(qs0, qs, sizeof qs);
            memcpy(qsh0, qsh, sizeof qsh);
            memcpy(ds0, ds, sizeof ds);
            memcpy(ss0, ss, sizeof ss);
        } else {
            CHECKF(memcmp(qs0, qs, sizeof qs) == 0 && memcmp(qsh0, qsh, sizeof qsh) == 0 &&
                       memcmp(ds0, ds, sizeof ds) == 0 && memcmp(ss0, ss, sizeof ss) == 0,
                   "%s: QS activations differ from the portable path's", kvg_cpu_isa_name((kvg_cpu_isa)isa));
            CHECKF(memcmp(q80, q8, sizeof q8) == 0 && memcmp(d80, d8, sizeof d8) == 0 && memcmp(s80, s8, sizeof s8) == 0,
                   "%s: Q8 activations differ from the portable path's", kvg_cpu_isa_name((kvg_cpu_isa)isa));
            CHECKF(memcmp(qb0, qb, qbytes) == 0 && memcmp(db0, db, sizeof db) == 0,
                   "%s: QB activations differ from the portable path's", kvg_cpu_isa_name((kvg_cpu_isa)isa));
            CHECKF(memcmp(qk0, qk, qbytes) == 0 && memcmp(dk0, dk, sizeof dk) == 0 && memcmp(bk0, bk, sizeof bk) == 0,
                   "%s: QK activations differ from the portable path's", kvg_cpu_isa_name((kvg_cpu_isa)isa));
        }
        /* the sums of 16 and the block sums are what they say */
        for (int j = 0; j < NT * N / 16; j++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += qk[16 * j + i];
            CHECK(s == bk[j]);
        }
        for (int b = 0; b < NT * N / 32; b++) {
            int s = 0;
            for (int i = 0; i < 32; i++) s += qb[32 * b + i];
            CHECK(fabsf(sb[b] - db[b] * (float)s) <= 1e-6f * fabsf(sb[b]) + 1e-30f);
            int s8sum = 0, amax = 0;
            for (int i = 0; i < 32; i++) {
                s8sum += q8[32 * b + i];
                amax = abs(q8[32 * b + i]) > amax ? abs(q8[32 * b + i]) : amax;
            }
            CHECK(s8[b] == d8[b] * (float)s8sum && amax == (d8[b] > 0 ? KVG_Q8_LEVELS : 0));
            int qssum = 0, qsmax = 0; /* the split form: q = 256 hi + lo, lo a signed byte, |hi| <= 64 */
            bool parts_ok = true;
            for (int i = 0; i < 32; i++) {
                int q = 256 * qsh[32 * b + i] + qs[32 * b + i];
                qssum += q;
                qsmax = abs(q) > qsmax ? abs(q) : qsmax;
                parts_ok = parts_ok && abs(qsh[32 * b + i]) <= 64;
            }
            CHECK(ss[b] == ds[b] * (float)qssum && qsmax == (ds[b] > 0 ? KVG_QS_LEVELS : 0) && parts_ok);
        }
        kvg_qact a = {.n = N, .x = xf, .qb = qb, .db = db, .sb = sb, .qk = qk, .dk = dk, .bk = bk,
                      .q8 = q8, .d8 = d8, .s8 = s8, .b8 = b8};
        kvg_qact as = a; /* the split form's bytes for the QS kernels */
        as.q8 = qs;
        as.q8h = qsh;
        as.d8 = ds;
        as.s8 = ss;
        as.b8 = bs;
        int n_group = 0;
        double worst = 0;
        int n_fast = 0;
        for (size_t tv = 0; tv < 2 * n_types; tv++) { /* every type's kernel, then its 8-bit one */
            size_t ti = tv % n_types;
            bool fast = tv >= n_types;
            uint32_t type = types[ti];
            const kvg_qdot_kernel *k = kvg_qdot_kernel_of((kvg_cpu_isa)isa, type);
            CHECKF(k != NULL, "%s has no %s kernel", kvg_type_name(type), kvg_cpu_isa_name((kvg_cpu_isa)isa));
            if (!k) continue;
            if (fast) {
                const kvg_qdot_kernel *kf = kvg_qdot_kernel_fast((kvg_cpu_isa)isa, type);
                if (kf == k) continue;
                CHECKF(kf && kf->act == KVG_ACT_Q8, "%s %s: 8-bit kernel", kvg_type_name(type), kvg_cpu_isa_name((kvg_cpu_isa)isa));
                if (!kf) continue;
                k = kf;
                n_fast++;
            }
            const kvg_qact *ka = k->act == KVG_ACT_QS ? &as : &a; /* the activations k takes */
            for (int trial = 0; trial < 3; trial++) {
                float amp = trial == 0 ? 0.05f : trial == 1 ? 1.0f : 20.0f;
                rng_state = 1000u + 7u * (uint32_t)ti + (uint32_t)trial; /* the same weights on every path */
                for (int i = 0; i < N; i++) wf[i] = frand() * amp + (trial == 2 ? 0.3f * amp : 0.0f);
                kvg_quantize_row(type, wf, w, N);
                kvg_dequantize_row(type, w, deq, N);
                if (k->repack) { /* the kernel's own layout, the same size */
                    memcpy(packed, w, kvg_row_bytes(type, N));
                    k->repack(packed, w, N);
                }
                /* every row alone, and tiles of KVG_QDOT_TILE rows from rows 0 and 1 */
                float tiled[NT], single[NT], shifted[NT];
                for (int t = 0; t < NT; t++) k->dot(w, ka, t, 1, &single[t], 1);
                for (int t = 0; t < NT; t += KVG_QDOT_TILE)
                    k->dot(w, ka, t, NT - t < KVG_QDOT_TILE ? NT - t : KVG_QDOT_TILE, tiled + t, 1);
                shifted[0] = single[0];
                for (int t = 1; t < NT; t += KVG_QDOT_TILE)
                    k->dot(w, ka, t, NT - t < KVG_QDOT_TILE ? NT - t : KVG_QDOT_TILE, shifted + t, 1);
                CHECKF(memcmp(tiled, single, sizeof tiled) == 0 && memcmp(shifted, single, sizeof tiled) == 0,
                       "%s %s: tiles change the results", kvg_type_name(type), kvg_cpu_isa_name((kvg_cpu_isa)isa));
                if (fast) {
                } else if (isa == KVG_ISA_PORTABLE) memcpy(portable_out[ti][trial], tiled, sizeof tiled);
                else if (same_bits_as_portable(isa) && k->act == kvg_qdot_kernel_of(KVG_ISA_PORTABLE, type)->act)
                    CHECKF(memcmp(portable_out[ti][trial], tiled, sizeof tiled) == 0,
                           "%s %s trial %d: %.9g, the portable path %.9g", kvg_type_name(type),
                           kvg_cpu_isa_name((kvg_cpu_isa)isa), trial, tiled[0], portable_out[ti][trial][0]);
                for (int t = 0; t < NT; t++) {
                    double exact = 0, mag = 0;
                    for (int i = 0; i < N; i++) {
                        double av;
                        if (k->act == KVG_ACT_F32) av = xf[t * N + i];
                        else if (k->act == KVG_ACT_QB) av = (double)qb[t * N + i] * db[t * (N / 32) + i / 32];
                        else if (k->act == KVG_ACT_Q8) av = (double)q8[t * N + i] * d8[t * (N / 32) + i / 32];
                        else if (k->act == KVG_ACT_QS)
                            av = (double)(256 * qsh[t * N + i] + qs[t * N + i]) * ds[t * (N / 32) + i / 32];
                        else av = (double)qk[t * N + i] * dk[t * (N / 256) + i / 256];
                        exact += (double)deq[i] * av;
                        mag += fabs((double)deq[i] * av);
                    }
                    double err = fabs(tiled[t] - exact) / (mag > 0 ? mag : 1);
                    if (err > worst) worst = err;
                    CHECKF(err <= 1e-5, "%s %s trial %d row %d: %.7g vs %.7g (relative to sum|wa| %.3g)",
                           kvg_type_name(type), kvg_cpu_isa_name((kvg_cpu_isa)isa), trial, t, tiled[t], exact, err);
                }
            }
            if (k->group) {
                check_group_kernel(isa, type, k, ka, N, NT, NULL);
                n_group++;
                if (k->act == KVG_ACT_F32) { /* rows of a length with a tail past the vectors */
                    kvg_qact tail = *ka;
                    tail.n = N - 23;
                    check_group_kernel(isa, type, k, &tail, tail.n, NT, NULL);
                }
            }
        }
        printf("kernels: %s path: %zu types (and %d with 8-bit activations), worst |dot - exact| / sum|w a| %.2e; %d "
               "group kernels equal their rows\n",
               kvg_cpu_isa_name((kvg_cpu_isa)isa), n_types, n_fast, worst, n_group);
    }
    free(wf);
    free(xf);
    free(deq);
    free(w);
    free(packed);
    free(qb);
    free(qk);
    free(qb0);
    free(qk0);
}

/* whether path isa runs the matrices of a 32-element or K type in row groups (kvg_qdot.h), with
 * 8-bit activations (act8) or split 16-bit ones */
static bool expect_group(int isa, uint32_t type, bool act8) {
    if ((isa == KVG_ISA_AVX2 || isa == KVG_ISA_AVX512) && !act8 &&
        (type == KVG_TYPE_Q8_0 || type == KVG_TYPE_IQ4_NL || type == KVG_TYPE_IQ4_XS))
        return false; /* their rows: vpmaddwd on 16-bit activations */
    if (kvg_type_block_elems(type) == KVG_QB) /* avx512 keeps its own rows */
        return isa == KVG_ISA_AVX512VNNI || isa == KVG_ISA_AVX2 || isa == KVG_ISA_AVXVNNI || isa == KVG_ISA_NEON ||
               isa == KVG_ISA_DOTPROD;
    switch (isa) {
    case KVG_ISA_AVX2:
    case KVG_ISA_AVX512:
    case KVG_ISA_AVXVNNI:
    case KVG_ISA_AVX512VNNI:
    case KVG_ISA_NEON:
    case KVG_ISA_DOTPROD: return true;
    default: return false;
    }
}

/* KVG_QDOT_GROUP rows of n elements of a 32-element or K type whose levels are all alike: the
 * block filled with one byte, then d and dmin (or the min) 1, Q6_K's scales 1. Fills 0x00, 0xff
 * and 0x80 reach the ends of the types' ranges: Q2_K 3, Q3_K -4, Q4_K and Q4 15, Q5_K and Q5
 * 31, Q6_K -32, IQ4_XS and IQ4_NL -127, Q8_0 -128 and -1: the bounds of the kernels' narrow
 * intermediate sums (int16 on AVX2 and neon) */
static void extreme_rows(uint32_t type, int n, uint8_t fill, uint8_t *rows) {
    uint32_t be = kvg_type_block_elems(type);
    size_t bb = kvg_row_bytes(type, be), nb = (size_t)n / be;
    memset(rows, fill, bb * nb * KVG_QDOT_GROUP);
    for (size_t b = 0; b < nb * KVG_QDOT_GROUP; b++) {
        uint8_t *blk = rows + bb * b;
        size_t d = 0, dmin = SIZE_MAX; /* where the type keeps its f16 d and dmin */
        switch (type) {
        case KVG_TYPE_Q4_1:
        case KVG_TYPE_Q5_1: dmin = 2; break;
        case KVG_TYPE_Q2_K: d = 80, dmin = 82; break;
        case KVG_TYPE_Q3_K: d = 108; break;
        case KVG_TYPE_Q4_K:
        case KVG_TYPE_Q5_K: d = 0, dmin = 2; break;
        case KVG_TYPE_Q6_K:
            d = 208;
            memset(blk + 192, 1, 16);
            break;
        default: break; /* IQ4_XS and the 32-element types: d first */
        }
        blk[d] = 0x00, blk[d + 1] = 0x3c;
        if (dmin != SIZE_MAX) blk[dmin] = 0x00, blk[dmin + 1] = 0x3c;
    }
}

/* The group kernels on a row of 3 K blocks (an odd count for the K types; the 32-element types
 * also on rows of 21 blocks) and 1..8-token tiles (as check_group_kernel: every tile from
 * tokens 0 and 1, 9 tokens), against their row kernels' bits, at both activation precisions,
 * and each row kernel against the exact dot product of the dequantized row with the
 * dequantized activations (within 1e-5 of sum |w a|: f32 rounding). Also rows of extreme
 * levels against activation bytes at their ends, and every path that should run a type in
 * groups (expect_group) has them in its tables. */
static void test_group_shapes(void) {
    enum { N = 768, NT = 9 };
    static const uint32_t types[] = {KVG_TYPE_Q2_K,  KVG_TYPE_Q3_K, KVG_TYPE_Q4_K, KVG_TYPE_Q5_K, KVG_TYPE_Q6_K,
                                     KVG_TYPE_IQ4_XS, KVG_TYPE_Q4_0, KVG_TYPE_Q4_1, KVG_TYPE_Q5_0, KVG_TYPE_Q5_1,
                                     KVG_TYPE_Q8_0,  KVG_TYPE_IQ4_NL};
    float *xf = malloc(NT * N * sizeof(float)), *wf = malloc(N * sizeof(float)), *deq = malloc(N * sizeof(float));
    int8_t *q8 = malloc(NT * N), *qs = malloc(NT * N), *qsh = malloc(NT * N);
    float d8[NT * N / 32], s8[NT * N / 32], ds[NT * N / 32], ss[NT * N / 32];
    int32_t b8[NT * N / 16], bs[NT * N / 16];
    uint8_t *w = malloc(kvg_row_bytes(KVG_TYPE_F32, N)), *packed = malloc(kvg_row_bytes(KVG_TYPE_F32, N));
    uint8_t *xrows = malloc(kvg_row_bytes(KVG_TYPE_F32, N) * KVG_QDOT_GROUP); /* more than any quantized type's */
    for (int i = 0; i < NT * N; i++) xf[i] = frand() * (i % 5 == 0 ? 4.0f : 1.0f);
    /* activation bytes at the ends of their ranges, by token: Q8 -127 or 127; QS lo -128 or 127
     * with hi -63 or 63 (q = 256 hi + lo within +-16383) */
    int8_t *e8 = malloc(NT * N), *el = malloc(NT * N), *eh = malloc(NT * N);
    float ed[NT * N / 32], es8[NT * N / 32], ess[NT * N / 32];
    int32_t eb8[NT * N / 16], ebs[NT * N / 16];
    for (int t = 0; t < NT; t++)
        for (int i = 0; i < N; i++) {
            bool neg = (t + i / 64) % 2 == 0;
            e8[t * N + i] = (int8_t)(neg ? -127 : 127);
            el[t * N + i] = (int8_t)(neg ? -128 : 127);
            eh[t * N + i] = (int8_t)(neg ? -63 : 63);
        }
    for (int b = 0; b < NT * N / 32; b++) {
        int s8sum = 0, sssum = 0;
        for (int i = 0; i < 32; i++) {
            s8sum += e8[32 * b + i];
            sssum += 256 * eh[32 * b + i] + el[32 * b + i];
        }
        ed[b] = 0.001f * (float)(1 + b % 7);
        es8[b] = ed[b] * (float)s8sum;
        ess[b] = ed[b] * (float)sssum;
    }
    for (int g = 0; g < NT * N / 16; g++) {
        eb8[g] = ebs[g] = 0;
        for (int i = 16 * g; i < 16 * g + 16; i++) eb8[g] += e8[i], ebs[g] += 256 * eh[i] + el[i];
    }
    kvg_qact x8 = {.n = N, .x = xf, .q8 = e8, .d8 = ed, .s8 = es8, .b8 = eb8};
    kvg_qact xs = {.n = N, .x = xf, .q8 = el, .q8h = eh, .d8 = ed, .s8 = ess, .b8 = ebs};
    int checked = 0;
    for (int isa = 0; isa < KVG_ISA_COUNT; isa++) {
        if (!kvg_cpu_isa_supported((kvg_cpu_isa)isa)) continue;
        for (int t = 0; t < NT; t++) {
            kvg_qdot_quantize_q8((kvg_cpu_isa)isa, xf + t * N, N, q8 + t * N, NULL, d8 + t * (N / 32), s8 + t * (N / 32),
                                 b8 + t * (N / 16));
            kvg_qdot_quantize_q8((kvg_cpu_isa)isa, xf + t * N, N, qs + t * N, qsh + t * N, ds + t * (N / 32),
                                 ss + t * (N / 32), bs + t * (N / 16));
        }
        kvg_qact a8 = {.n = N, .x = xf, .q8 = q8, .d8 = d8, .s8 = s8, .b8 = b8};
        kvg_qact as = {.n = N, .x = xf, .q8 = qs, .q8h = qsh, .d8 = ds, .s8 = ss, .b8 = bs};
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
            for (int fast = 0; fast < 2; fast++) {
                const kvg_qdot_kernel *k = fast ? kvg_qdot_kernel_fast((kvg_cpu_isa)isa, types[ti])
                                                : kvg_qdot_kernel_of((kvg_cpu_isa)isa, types[ti]);
                bool want = expect_group(isa, types[ti], fast);
                CHECKF(k && (k->group != NULL) == want && (!want || k->act == (fast ? KVG_ACT_Q8 : KVG_ACT_QS)),
                       "%s %s (%s activations): %s row groups", kvg_type_name(types[ti]),
                       kvg_cpu_isa_name((kvg_cpu_isa)isa), fast ? "8-bit" : "15-bit",
                       want ? "no" : "unexpected");
                if (!k || !k->group) continue;
                const kvg_qact *ka = k->act == KVG_ACT_QS ? &as : &a8;
                check_group_kernel(isa, types[ti], k, ka, N, NT, NULL);
                if (kvg_type_block_elems(types[ti]) == KVG_QB) { /* 21 blocks: not a multiple of 8 either */
                    kvg_qact odd = *ka;
                    odd.n = N - 3 * KVG_QB;
                    check_group_kernel(isa, types[ti], k, &odd, odd.n, NT, NULL);
                }
                static const uint8_t fills[] = {0x00, 0xff, 0x80};
                for (int f = 0; f < 3; f++) { /* extreme levels against extreme bytes */
                    extreme_rows(types[ti], N, fills[f], xrows);
                    check_group_kernel(isa, types[ti], k, fast ? &x8 : &xs, N, NT, xrows);
                }
                rng_state = 77u + (uint32_t)ti;
                for (int i = 0; i < N; i++) wf[i] = frand() * 0.5f + 0.1f;
                kvg_quantize_row(types[ti], wf, w, N);
                kvg_dequantize_row(types[ti], w, deq, N);
                if (k->repack) { /* the row kernel's own layout */
                    memcpy(packed, w, kvg_row_bytes(types[ti], N));
                    k->repack(packed, w, N);
                }
                for (int t = 0; t < NT; t++) {
                    float got;
                    k->dot(w, ka, t, 1, &got, 1);
                    double exact = 0, mag = 0;
                    for (int i = 0; i < N; i++) {
                        int q = ka->q8[t * N + i] + (ka->q8h ? 256 * ka->q8h[t * N + i] : 0);
                        double av = (double)q * ka->d8[t * (N / 32) + i / 32];
                        exact += (double)deq[i] * av;
                        mag += fabs((double)deq[i] * av);
                    }
                    CHECKF(fabs(got - exact) <= 1e-5 * mag, "%s %s token %d: %.9g vs exact %.9g",
                           kvg_type_name(types[ti]), kvg_cpu_isa_name((kvg_cpu_isa)isa), t, got, exact);
                }
                checked++;
            }
    }
    printf("kernels: groups on rows of 3 K blocks (random and extreme levels): %d kernels equal their rows\n", checked);
    free(packed);
    free(xrows);
    free(e8);
    free(el);
    free(eh);
    free(xf);
    free(wf);
    free(deq);
    free(q8);
    free(qs);
    free(qsh);
    free(w);
}

static void test_vec_kv(kvg_cpu_isa isa);

static void test_vec_ops(void) {
    for (int isa = 0; isa < KVG_ISA_COUNT; isa++) {
        if (!kvg_cpu_isa_supported((kvg_cpu_isa)isa)) continue;
        const kvg_vec_ops *v = kvg_vec_ops_of((kvg_cpu_isa)isa);
        enum { N = 203 };
        float x[N], y[N], w[N], r[N], g[N], u[N];
        for (int i = 0; i < N; i++) {
            x[i] = -90.0f + 90.0f * (float)i / (N - 1); /* down to below the exp clamp */
            w[i] = 1.0f + 0.5f * frand();
            g[i] = 12.0f * frand();
            u[i] = frand();
        }
        memcpy(y, x, sizeof x);
        float sum = v->exp_sum(y, N, 0.0f), ref_sum = 0;
        double worst = 0;
        for (int i = 0; i < N; i++) {
            float e = expf(x[i]);
            ref_sum += e;
            if (x[i] > -80.0f) worst = fmax(worst, fabs(y[i] - e) / e);
            else CHECK(y[i] >= 0.0f && y[i] < 1e-30f);
        }
        CHECKF(worst < 5e-7, "%s exp: relative error %.3g", kvg_cpu_isa_name((kvg_cpu_isa)isa), worst);
        CHECK(fabsf(sum - ref_sum) <= 1e-5f * ref_sum);
        CHECK(v->max(x, N) == 0.0f && v->max(x, 5) == x[4]);
        kvg_ref_rmsnorm(r, g, w, N, 1e-5f);
        v->rmsnorm(y, g, w, N, 1e-5f);
        for (int i = 0; i < N; i++) CHECK(fabsf(y[i] - r[i]) <= 1e-5f * (fabsf(r[i]) + 1.0f));
        memcpy(y, g, sizeof g);
        v->silu_mul(y, u, N);
        for (int i = 0; i < N; i++) CHECK(fabsf(y[i] - kvg_ref_silu(g[i]) * u[i]) <= 2e-6f * (fabsf(g[i]) + 1.0f));
        memcpy(y, g, sizeof g);
        v->gelu_mul(y, u, N);
        for (int i = 0; i < N; i++) CHECK(fabsf(y[i] - kvg_ref_gelu_tanh(g[i]) * u[i]) <= 2e-6f * (fabsf(g[i]) + 1.0f));
        memcpy(y, g, sizeof g); /* the exact GELU, with and without a bias */
        v->gelu_erf(y, u, N);
        for (int i = 0; i < N; i++) {
            float a = g[i] + u[i], e = 0.5f * a * (1.0f + erff(a * 0.70710678118654752f));
            CHECKF(fabsf(y[i] - e) <= 5e-7f * (fabsf(a) + 1.0f), "%s gelu_erf(%g): %.9g, libm's %.9g",
                   kvg_cpu_isa_name((kvg_cpu_isa)isa), a, y[i], e);
        }
        memcpy(y, g, sizeof g);
        v->gelu_erf(y, NULL, N);
        for (int i = 0; i < N; i++) {
            float e = 0.5f * g[i] * (1.0f + erff(g[i] * 0.70710678118654752f));
            CHECK(fabsf(y[i] - e) <= 5e-7f * (fabsf(g[i]) + 1.0f));
        }
        float d = v->dot(g, u, N), dr = 0;
        for (int i = 0; i < N; i++) dr += g[i] * u[i];
        CHECK(fabsf(d - dr) <= 1e-4f);
        if (same_bits_as_portable(isa)) {
            const kvg_vec_ops *p = kvg_vec_ops_of(KVG_ISA_PORTABLE);
            float y2[N], pn[N], vn[N];
            for (int len = 1; len <= N; len += 17) CHECKF(v->dot(g, u, len) == p->dot(g, u, len), "dot of %d", len);
            memcpy(y, x, sizeof x);
            memcpy(y2, x, sizeof x);
            v->axpy(y, 0.37f, g, N);
            p->axpy(y2, 0.37f, g, N);
            CHECK(memcmp(y, y2, sizeof y) == 0);
            v->rmsnorm(vn, g, w, N, 1e-5f);
            p->rmsnorm(pn, g, w, N, 1e-5f);
            CHECKF(memcmp(vn, pn, sizeof vn) == 0, "%s rmsnorm: not the portable bits", kvg_cpu_isa_name((kvg_cpu_isa)isa));
        }
        /* attention's runs of keys: the same bits however a run is split (page boundaries) */
        enum { HD = 72, ROWS = 11 };
        float keys[ROWS * HD], qv[HD], one[ROWS], split[ROWS], o1[HD] = {0}, o2[HD] = {0};
        for (int i = 0; i < ROWS * HD; i++) keys[i] = frand();
        for (int i = 0; i < HD; i++) qv[i] = frand();
        v->dot_rows(qv, keys, HD, ROWS, HD, one);
        v->dot_rows(qv, keys, HD, 3, HD, split);
        v->dot_rows(qv, keys + 3 * HD, HD, ROWS - 3, HD, split + 3);
        CHECK(memcmp(one, split, sizeof one) == 0);
        for (int r = 0; r < ROWS; r++) CHECK(fabsf(one[r] - v->dot(qv, keys + r * HD, HD)) <= 1e-5f);
        v->axpy_rows(o1, one, keys, HD, ROWS, HD);
        v->axpy_rows(o2, one, keys, HD, 5, HD);
        v->axpy_rows(o2, one + 5, keys + 5 * HD, HD, ROWS - 5, HD);
        CHECK(memcmp(o1, o2, sizeof o1) == 0);
        for (int i = 0; i < HD; i++) {
            float e = 0;
            for (int r = 0; r < ROWS; r++) e += one[r] * keys[r * HD + i];
            CHECK(fabsf(o1[i] - e) <= 1e-4f);
        }
        /* the f16 forms (the cpu backend's KV pages): the f32 forms' bits on the rows converted
         * to f32, for whole vectors and a tail (n < stride), split or not; on neon and dotprod
         * also the portable path's f16 bits */
        const char *name = kvg_cpu_isa_name((kvg_cpu_isa)isa);
        uint16_t keys16[ROWS * HD];
        float keysh[ROWS * HD];
        for (int i = 0; i < ROWS * HD; i++) {
            keys16[i] = kvg_f32_to_f16(keys[i] * 3.0f);
            keysh[i] = kvg_f16_to_f32(keys16[i]);
        }
        const int lens[2] = {HD, HD - 3};
        for (int li = 0; li < 2; li++) {
            int len = lens[li];
            float h16[ROWS], h32[ROWS], hs[ROWS], y16[HD], y32[HD], ys[HD];
            v->dot_rows_f16(qv, keys16, HD, ROWS, len, h16);
            v->dot_rows(qv, keysh, HD, ROWS, len, h32);
            CHECKF(memcmp(h16, h32, sizeof h16) == 0, "%s dot_rows_f16 (n %d): not dot_rows' bits", name, len);
            v->dot_rows_f16(qv, keys16, HD, 3, len, hs);
            v->dot_rows_f16(qv, keys16 + 3 * HD, HD, ROWS - 3, len, hs + 3);
            CHECKF(memcmp(h16, hs, sizeof h16) == 0, "%s dot_rows_f16 (n %d): split", name, len);
            for (int i = 0; i < HD; i++) y16[i] = y32[i] = ys[i] = qv[i];
            v->axpy_rows_f16(y16, one, keys16, HD, ROWS, len);
            v->axpy_rows(y32, one, keysh, HD, ROWS, len);
            CHECKF(memcmp(y16, y32, sizeof y16) == 0, "%s axpy_rows_f16 (n %d): not axpy_rows' bits", name, len);
            v->axpy_rows_f16(ys, one, keys16, HD, 5, len);
            v->axpy_rows_f16(ys, one + 5, keys16 + 5 * HD, HD, ROWS - 5, len);
            CHECKF(memcmp(y16, ys, sizeof y16) == 0, "%s axpy_rows_f16 (n %d): split", name, len);
            for (int i = len; i < HD; i++) CHECK(y16[i] == qv[i]); /* past n: untouched */
            for (int r = 0; r < ROWS; r++) {
                double e = 0;
                for (int i = 0; i < len; i++) e += (double)qv[i] * keysh[r * HD + i];
                CHECK(fabs(h16[r] - e) <= 1e-4);
            }
            if (same_bits_as_portable(isa)) {
                const kvg_vec_ops *p = kvg_vec_ops_of(KVG_ISA_PORTABLE);
                float hp[ROWS], yp[HD];
                p->dot_rows_f16(qv, keys16, HD, ROWS, len, hp);
                CHECKF(memcmp(h16, hp, sizeof h16) == 0, "%s dot_rows_f16: not the portable bits", name);
                for (int i = 0; i < HD; i++) yp[i] = qv[i];
                p->axpy_rows_f16(yp, one, keys16, HD, ROWS, len);
                CHECKF(memcmp(y16, yp, sizeof y16) == 0, "%s axpy_rows_f16: not the portable bits", name);
            }
        }
        test_vec_kv((kvg_cpu_isa)isa);
    }
}

/* The KV tables (kvg_vec_kv_of): every type pages may hold has its row on every path, and its
 * kernels, reading rows as the pages store them (row_bytes apart), give the dots and weighted
 * sums of the rows' f32 values (kvg_dequantize_row) within f32 rounding, the same bits however
 * a run is split. A block type's dot may round q to 8 bits per block of 32 first (the AVX2
 * path dots in integers): then within half a step of q's block scale (amax / 127) times the
 * key's absolute sum. */
/* dot_heads and axpy_heads of a KV row: each of `heads` heads gets the bits of dot_rows and
 * axpy_rows alone, on a run of `rows` rows of n elements (heads, queries, outputs and weights at
 * strides other than n, as attention lays them out) */
static void test_kv_heads(kvg_cpu_isa isa, const kvg_vec_kv *kv, int n, int rows) {
    enum { MAXH = 9, MAXN = 96, MAXR = 37, QS = MAXN + 8, OS = MAXR + 3 };
    const char *name = kvg_cpu_isa_name(isa), *tn = kvg_type_name(kv->type);
    static float src[MAXR * MAXN], q[MAXH * QS], a[MAXH * OS], dot[MAXH * OS], one[MAXR], y[MAXH * QS], y1[MAXN];
    static unsigned char run[MAXR * MAXN * 4];
    size_t rb = kvg_row_bytes(kv->type, n);
    for (int i = 0; i < rows * n; i++) src[i] = frand() * 2.0f;
    for (int r = 0; r < rows; r++) kvg_quantize_row(kv->type, src + r * n, run + (size_t)r * rb, n);
    for (int i = 0; i < MAXH * QS; i++) q[i] = frand();
    for (int i = 0; i < MAXH * OS; i++) a[i] = frand();
    for (int heads = 1; heads <= MAXH; heads++) {
        memset(dot, 0, sizeof dot);
        kv->dot_heads(q, QS, heads, run, rb, rows, n, dot, OS);
        int same = 1;
        for (int h = 0; h < heads; h++) {
            kv->dot_rows(q + h * QS, run, rb, rows, n, one);
            same &= memcmp(one, dot + h * OS, (size_t)rows * sizeof(float)) == 0;
        }
        CHECKF(same, "%s %s dot_heads (%d heads, n %d, %d rows): not dot_rows' bits", name, tn, heads, n, rows);
        for (int i = 0; i < MAXH * QS; i++) y[i] = q[i];
        kv->axpy_heads(y, QS, heads, a, OS, run, rb, rows, n);
        same = 1;
        for (int h = 0; h < heads; h++) {
            memcpy(y1, q + h * QS, (size_t)n * sizeof(float));
            kv->axpy_rows(y1, a + h * OS, run, rb, rows, n);
            same &= memcmp(y1, y + h * QS, (size_t)n * sizeof(float)) == 0;
        }
        CHECKF(same, "%s %s axpy_heads (%d heads, n %d, %d rows): not axpy_rows' bits", name, tn, heads, n, rows);
        CHECKF(memcmp(y + heads * QS, q + heads * QS, (size_t)(MAXH - heads) * QS * sizeof(float)) == 0,
               "%s %s axpy_heads (%d heads): wrote past its heads", name, tn, heads);
    }
}

static void test_vec_kv(kvg_cpu_isa isa) {
    enum { KHD = 96, KROWS = 7 }; /* three blocks a row; an odd number of rows */
    static const uint32_t types[4] = {KVG_TYPE_F32, KVG_TYPE_F16, KVG_TYPE_Q8_0, KVG_TYPE_Q4_0};
    const char *name = kvg_cpu_isa_name(isa);
    float src[KROWS * KHD], deq[KROWS * KHD], qv[KHD], a[KROWS];
    unsigned char rows[KROWS * KHD * 4];
    for (int i = 0; i < KROWS * KHD; i++) src[i] = frand() * 2.0f;
    for (int i = 0; i < KHD; i++) qv[i] = frand();
    for (int r = 0; r < KROWS; r++) a[r] = frand();
    CHECK(kvg_vec_kv_of(isa, KVG_TYPE_Q4_1) == NULL);
    for (int ti = 0; ti < 4; ti++) {
        uint32_t type = types[ti];
        const kvg_vec_kv *kv = kvg_vec_kv_of(isa, type), *pk = kvg_vec_kv_of(KVG_ISA_PORTABLE, type);
        CHECKF(kv && pk && kv->type == type, "%s: no KV row for %s", name, kvg_type_name(type));
        if (!kv || !pk) continue;
        size_t rb = kvg_row_bytes(type, KHD);
        for (int r = 0; r < KROWS; r++) {
            kvg_quantize_row(type, src + r * KHD, rows + (size_t)r * rb, KHD);
            kvg_dequantize_row(type, rows + (size_t)r * rb, deq + r * KHD, KHD);
        }
        float dot[KROWS], split[KROWS], pdot[KROWS], y[KHD], ys[KHD], py[KHD];
        kv->dot_rows(qv, rows, rb, KROWS, KHD, dot);
        kv->dot_rows(qv, rows, rb, 3, KHD, split);
        kv->dot_rows(qv, rows + 3 * rb, rb, KROWS - 3, KHD, split + 3);
        CHECKF(memcmp(dot, split, sizeof dot) == 0, "%s %s dot_rows: split", name, kvg_type_name(type));
        pk->dot_rows(qv, rows, rb, KROWS, KHD, pdot);
        int blocks = type == KVG_TYPE_Q8_0 || type == KVG_TYPE_Q4_0;
        for (int r = 0; r < KROWS; r++) {
            double e = 0.0, mag = 0.0, q8 = 0.0;
            for (int i = 0; i < KHD; i++) {
                e += (double)qv[i] * deq[r * KHD + i];
                mag += fabs((double)qv[i] * deq[r * KHD + i]);
                float amax = 0.0f;
                for (int j = i / 32 * 32; j < i / 32 * 32 + 32; j++) amax = fmaxf(amax, fabsf(qv[j]));
                q8 += fabs((double)deq[r * KHD + i]) * amax / 127.0 / 2.0;
            }
            double tol = 1e-5 * mag + 1e-6 + (blocks ? q8 : 0.0);
            CHECKF(fabs(dot[r] - e) <= tol, "%s %s dot_rows row %d: %g, want %g", name, kvg_type_name(type), r,
                   (double)dot[r], e);
            CHECKF(fabs(dot[r] - pdot[r]) <= tol, "%s %s dot_rows: %g, portable %g", name, kvg_type_name(type),
                   (double)dot[r], (double)pdot[r]);
            CHECKF(!blocks || fabs(dot[r] - e) <= 0.05 * mag, "%s %s dot_rows row %d: %g, want %g (%g)", name,
                   kvg_type_name(type), r, (double)dot[r], e, mag);
        }
        for (int i = 0; i < KHD; i++) y[i] = ys[i] = py[i] = qv[i];
        kv->axpy_rows(y, a, rows, rb, KROWS, KHD);
        kv->axpy_rows(ys, a, rows, rb, 2, KHD);
        kv->axpy_rows(ys, a + 2, rows + 2 * rb, rb, KROWS - 2, KHD);
        pk->axpy_rows(py, a, rows, rb, KROWS, KHD);
        for (int i = 0; i < KHD; i++) {
            double e = qv[i], mag = fabs(qv[i]);
            for (int r = 0; r < KROWS; r++) {
                e += (double)a[r] * deq[r * KHD + i];
                mag += fabs((double)a[r] * deq[r * KHD + i]);
            }
            CHECKF(fabs(y[i] - e) <= 1e-5 * mag + 1e-6, "%s %s axpy_rows [%d]: %g, want %g", name, kvg_type_name(type),
                   i, (double)y[i], e);
            CHECKF(fabs(y[i] - ys[i]) <= 1e-5 * mag + 1e-6 && fabs(y[i] - py[i]) <= 1e-5 * mag + 1e-6,
                   "%s %s axpy_rows [%d]: split or portable differ", name, kvg_type_name(type), i);
        }
        /* several heads: runs of 1, an odd count and a page's 32 plus some (past the kernels'
         * look-ahead); n of whole blocks, and for the element types also n of a tail of 8 and
         * of no multiple of 8 */
        static const int runs[] = {1, 2, 7, 37};
        for (int ri = 0; ri < 4; ri++) {
            test_kv_heads(isa, kv, KHD, runs[ri]);
            test_kv_heads(isa, kv, 64, runs[ri]);
            if (!blocks) {
                test_kv_heads(isa, kv, 40, runs[ri]);
                test_kv_heads(isa, kv, 20, runs[ri]);
            }
        }
    }
}

/* ---- models ---- */

typedef struct run {
    int n_vocab;
    float *prefill; /* N_PROMPT x n_vocab: every prompt position */
    float *decode;  /* N_DEC x n_vocab: after each decoded token */
} run;

static void run_free(run *r) {
    free(r->prefill);
    free(r->decode);
    memset(r, 0, sizeof *r);
}

static kvgen_model *load(const char *path, kvgen_backend b, int threads) {
    kvgen_model_desc md = {.path = path, .backend = b, .n_threads = threads};
    return tu_load(&md);
}

/* prefill N_PROMPT tokens (all logits), then N_DEC decodes */
static bool run_model(kvgen_model *m, const int32_t *tokens, run *out) {
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    out->n_vocab = info.n_vocab;
    size_t V = (size_t)info.n_vocab;
    out->prefill = malloc(N_PROMPT * V * sizeof(float));
    out->decode = malloc(N_DEC * V * sizeof(float));
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    kvgen_session_desc sd = {.n_ctx = 256};
    bool ok = kvgen_session_create(m, &sd, &s, &err) == KVGEN_OK &&
              kvgen_session_prefill(s, tokens, N_PROMPT, out->prefill, &err) == KVGEN_OK;
    for (int i = 0; ok && i < N_DEC; i++) {
        ok = kvgen_session_decode(s, tokens[N_PROMPT + i], &err) == KVGEN_OK;
        if (ok) memcpy(out->decode + i * V, kvgen_session_logits(s), V * sizeof(float));
    }
    CHECKF(ok, "run: %s", err.message);
    kvgen_session_close(s);
    return ok;
}

typedef struct diff {
    double rel;  /* worst max|a - b| / range(reference) over the positions */
    int top1, n; /* positions with the same top-1, out of n */
} diff;

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void diff_rows(const float *ref, const float *got, int rows, int V, diff *d) {
    for (int r = 0; r < rows; r++) {
        const float *a = ref + (size_t)r * V, *b = got + (size_t)r * V;
        float lo = a[0], hi = a[0];
        double md = 0;
        for (int i = 0; i < V; i++) {
            lo = fminf(lo, a[i]);
            hi = fmaxf(hi, a[i]);
            md = fmax(md, fabs((double)a[i] - b[i]));
            if (!isfinite(b[i])) md = INFINITY;
        }
        double rel = md / (hi > lo ? hi - lo : 1.0);
        if (rel > d->rel) d->rel = rel;
        d->top1 += argmax(a, V) == argmax(b, V);
        d->n++;
    }
}

static diff compare_runs(const run *ref, const run *got) {
    diff d = {0};
    diff_rows(ref->prefill, got->prefill, N_PROMPT, ref->n_vocab, &d);
    diff_rows(ref->decode, got->decode, N_DEC, ref->n_vocab, &d);
    return d;
}

static bool same_run(const run *a, const run *b) {
    size_t V = (size_t)a->n_vocab;
    return a->n_vocab == b->n_vocab && memcmp(a->prefill, b->prefill, N_PROMPT * V * sizeof(float)) == 0 &&
           memcmp(a->decode, b->decode, N_DEC * V * sizeof(float)) == 0;
}

/* a random model against the reference; returns the worst relative difference */
static double check_model(const char *label, const char *args, bool threads_too) {
    char file[96];
    snprintf(file, sizeof file, "cpu-%s.gguf", label);
    char *path = tu_make_model(file, args);
    CHECKF(path != NULL, "%s: kvgen-mkmodel %s", label, args);
    if (!path) return INFINITY;
    int32_t tokens[N_PROMPT + N_DEC];
    kvgen_model *ref = load(path, KVGEN_BACKEND_REFERENCE, 2), *cpu = load(path, KVGEN_BACKEND_CPU, 2);
    double rel = INFINITY;
    if (ref && cpu) {
        kvgen_model_info info;
        kvgen_model_get_info(cpu, &info);
        CHECK(strcmp(info.backend, "cpu") == 0);
        tu_fill_tokens(tokens, N_PROMPT + N_DEC, 99, info.n_vocab);
        run a = {0}, b = {0};
        if (run_model(ref, tokens, &a) && run_model(cpu, tokens, &b)) {
            diff d = compare_runs(&a, &b);
            rel = d.rel;
            printf("  %-12s max |cpu - reference| / range %.4f, top-1 same at %d/%d\n", label, d.rel, d.top1, d.n);
            CHECKF(d.rel <= TOL_REL, "%s: cpu vs reference %.4f of the logit range", label, d.rel);
            CHECKF(d.top1 >= d.n - 1, "%s: top-1 differs at %d of %d positions", label, d.n - d.top1, d.n);
            /* decode == prefill, bit for bit: the last prefill row is what a decode of the same
             * position would give; checked through a second session decoding token by token */
            kvgen_session *s = NULL;
            kvgen_error err = {0};
            CHECK_OK(kvgen_session_create(cpu, NULL, &s, &err));
            bool same = s != NULL;
            for (int i = 0; same && i < N_PROMPT; i++) {
                same = kvgen_session_prefill(s, tokens + i, 1, NULL, &err) == KVGEN_OK &&
                       memcmp(kvgen_session_logits(s), b.prefill + (size_t)i * info.n_vocab,
                              (size_t)info.n_vocab * sizeof(float)) == 0;
            }
            CHECKF(same, "%s: token-by-token logits differ from the prefill's", label);
            kvgen_session_close(s);
            if (threads_too)
                for (int th = 1; th <= 3; th += 2) {
                    kvgen_model *mt = load(path, KVGEN_BACKEND_CPU, th);
                    run c = {0};
                    if (mt && run_model(mt, tokens, &c))
                        CHECKF(same_run(&b, &c), "%s: %d threads differ from 2", label, th);
                    run_free(&c);
                    kvgen_model_unload(mt);
                }
        }
        run_free(&a);
        run_free(&b);
    }
    kvgen_model_unload(ref);
    kvgen_model_unload(cpu);
    free(path);
    return rel;
}

/* The 32-element types with 8-bit activations against the reference, within TOL_REL_8; where
 * the CPU has no 8-bit kernels the option changes nothing (the same bits as 16-bit). */
/* the path the models run: the best one, or the one KVGEN_CPU_ISA forces */
static kvg_cpu_isa models_isa(void) {
    kvg_cpu_isa isa;
    kvgen_error err = {0};
    return kvg_cpu_isa_choose("test_cpu_backend", &isa, &err) == KVGEN_OK ? isa : kvg_cpu_isa_best();
}

static void test_act8(void) {
    /* an output matrix of 1000 rows, not a multiple of the groups' 16 (its rows run the row
     * kernel of the group types); the K types with 3 K blocks in a row of w_down, and the Q4_K_M
     * mix (Q4_K, Q6_K and their groups in one product) */
    static const char *const types[] = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "Q4_0",
                                        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "Q4_K", "q4_k_m"};
    static const uint32_t ids[] = {KVG_TYPE_Q4_0, KVG_TYPE_Q4_1, KVG_TYPE_Q5_0, KVG_TYPE_Q5_1, KVG_TYPE_Q8_0,
                                   KVG_TYPE_IQ4_NL, KVG_TYPE_Q4_0, KVG_TYPE_Q2_K, KVG_TYPE_Q3_K, KVG_TYPE_Q4_K,
                                   KVG_TYPE_Q5_K, KVG_TYPE_Q6_K, KVG_TYPE_IQ4_XS, KVG_TYPE_Q4_K, KVG_TYPE_Q4_K};
    static const char *const extra[] = {"", "", "", "", "", "", " --vocab-size 1000", "", "", "", "", "", "",
                                        " --vocab-size 1000", ""};
    printf("8-bit activations (activation_bits = 8):\n");
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char args[200], file[64];
        bool k = kvg_type_block_elems(ids[i]) == 256;
        snprintf(args, sizeof args, "--seed %d --layers 2 %s %s %s%s", 70 + (int)i,
                 strcmp(types[i], "q4_k_m") == 0 ? "--mix" : "--type", types[i],
                 k ? "--embd 256 --ff 768 --heads 4 --kv-heads 2" : "--embd 64 --ff 96 --heads 4 --kv-heads 2", extra[i]);
        snprintf(file, sizeof file, "cpu8-%s-%zu.gguf", types[i], i);
        char *path = tu_make_model(file, args);
        CHECKF(path != NULL, "%s: kvgen-mkmodel %s", types[i], args);
        if (!path) continue;
        kvgen_model_desc d8 = {.path = path, .backend = KVGEN_BACKEND_CPU, .n_threads = 2, .activation_bits = 8};
        kvgen_model *ref = load(path, KVGEN_BACKEND_REFERENCE, 2), *cpu = load(path, KVGEN_BACKEND_CPU, 2);
        kvgen_model *cpu8 = tu_load(&d8);
        if (ref && cpu && cpu8) {
            kvgen_model_info info;
            kvgen_model_get_info(cpu8, &info);
            int32_t tokens[N_PROMPT + N_DEC];
            tu_fill_tokens(tokens, N_PROMPT + N_DEC, 99, info.n_vocab);
            run a = {0}, b = {0}, c = {0};
            if (run_model(ref, tokens, &a) && run_model(cpu, tokens, &b) && run_model(cpu8, tokens, &c)) {
                diff d16 = compare_runs(&a, &b);
                CHECKF(d16.rel <= TOL_REL, "%s%s 16-bit: cpu vs reference %.4f", types[i], extra[i], d16.rel);
                diff d = compare_runs(&a, &c);
                bool has8 = kvg_qdot_kernel_fast(models_isa(), ids[i])->act == KVG_ACT_Q8;
                printf("  %-12s max |cpu - reference| / range %.4f, top-1 same at %d/%d (%s)%s\n", types[i], d.rel,
                       d.top1, d.n, has8 ? "8-bit kernels" : "none on this path: 16-bit",
                       *extra[i] ? ", 1000 output rows" : "");
                CHECKF(d.rel <= TOL_REL_8, "%s 8-bit: cpu vs reference %.4f of the logit range", types[i], d.rel);
                CHECKF(d.top1 >= d.n - 1, "%s 8-bit: top-1 differs at %d of %d positions", types[i], d.n - d.top1, d.n);
                CHECKF(has8 != same_run(&b, &c), "%s: 8-bit logits %s the 16-bit ones", types[i],
                       has8 ? "equal" : "differ from");
            }
            run_free(&a);
            run_free(&b);
            run_free(&c);
        }
        kvgen_model_unload(ref);
        kvgen_model_unload(cpu);
        kvgen_model_unload(cpu8);
        free(path);
    }
}

static void test_types(void) {
    uint32_t types[32];
    size_t n = kvg_traits_types(types, 32);
    printf("every type of the traits table, prefill %d + %d decodes:\n", N_PROMPT, N_DEC);
    for (size_t i = 0; i < n; i++) {
        uint32_t be = kvg_type_block_elems(types[i]);
        char args[256], label[32];
        snprintf(args, sizeof args, "--seed %u --layers 2 --type %s %s", 40 + (unsigned)i, kvg_type_name(types[i]),
                 be == 256 ? "--embd 256 --ff 512 --heads 4 --kv-heads 2" : "--embd 64 --ff 96 --heads 4 --kv-heads 2");
        snprintf(label, sizeof label, "%s", kvg_type_name(types[i]));
        check_model(label, args, types[i] == KVG_TYPE_Q4_1 || types[i] == KVG_TYPE_Q4_K);
    }
    check_model("q4_k_m", "--seed 60 --layers 2 --mix q4_k_m --embd 256 --ff 512 --heads 4 --kv-heads 2", false);
}

static void test_features(void) {
    printf("architecture features:\n");
    check_model("llama-freqs", "--arch llama --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --rope-freqs --seed 71 "
                "--type Q8_0", false);
    check_model("qwen2", "--arch qwen2 --qkv-bias --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 "
                "--rope-base 1000000 --seed 72 --type Q4_0", false);
    check_model("qwen3", "--arch qwen3 --qk-norm --layers 2 --embd 64 --heads 4 --kv-heads 2 --head-dim 32 --ff 96 "
                "--rope-base 1000000 --seed 73 --type Q5_0", false);
    check_model("gemma2", "--arch gemma2 --post-norms --swa 8 --softcap 50,30 --layers 3 --embd 64 --heads 4 "
                "--kv-heads 2 --ff 96 --seed 74 --type F16", false);
    check_model("gemma3", "--arch gemma3 --qk-norm --post-norms --swa 8 --layers 7 --embd 256 --heads 4 --kv-heads 1 "
                "--head-dim 64 --ff 512 --rope-base 1000000 --seed 75 --type Q6_K", false);
    check_model("phi3", "--arch phi3 --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --rope-dim 12 --untied "
                "--ctx 4096 --orig-ctx 512 --rope-factors --seed 77 --type Q4_1", false);
}

/* sessions' decodes as one batch equal each alone; forks and restores continue exactly */
static void test_sessions(void) {
    char *path = tu_make_model("cpu-sessions.gguf", "--seed 5 --layers 2 --embd 64 --ff 96 --heads 4 --kv-heads 2 "
                               "--type Q4_1");
    if (!path) return;
    kvgen_model *m = load(path, KVGEN_BACKEND_CPU, 2), *ref = load(path, KVGEN_BACKEND_REFERENCE, 2);
    if (!m || !ref) goto done;
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    size_t V = (size_t)info.n_vocab;
    enum { NS = 5, STEPS = 4 };
    kvgen_session *ss[NS] = {0}, *solo[NS] = {0};
    int32_t prompt[NS][16], next[STEPS][NS];
    kvgen_error err = {0};
    kvgen_session_desc sd = {.n_ctx = 128, .no_prefix_reuse = 1};
    for (int i = 0; i < NS; i++) {
        tu_fill_tokens(prompt[i], 16, 200 + (unsigned)i, info.n_vocab);
        CHECK_OK(kvgen_session_create(m, &sd, &ss[i], &err));
        CHECK_OK(kvgen_session_create(m, &sd, &solo[i], &err));
        CHECK_OK(kvgen_session_prefill(ss[i], prompt[i], 3 + (size_t)i * 3, NULL, &err)); /* different depths */
        CHECK_OK(kvgen_session_prefill(solo[i], prompt[i], 3 + (size_t)i * 3, NULL, &err));
    }
    for (int st = 0; st < STEPS; st++) tu_fill_tokens(next[st], NS, 300 + (unsigned)st, info.n_vocab);
    bool same = true;
    for (int st = 0; st < STEPS; st++) {
        kvgen_status status[NS];
        kvgen_error errs[NS];
        CHECK(kvg_session_decode_batch(ss, next[st], NS, true, status, errs) == KVGEN_OK);
        for (int i = 0; i < NS; i++) {
            CHECK_OK(kvgen_session_decode(solo[i], next[st][i], &err));
            same &= memcmp(kvgen_session_logits(ss[i]), kvgen_session_logits(solo[i]), V * sizeof(float)) == 0;
        }
    }
    CHECKF(same, "a batch of %d sessions' decodes differs from each decoded alone", NS);

    /* a fork continues as a fresh session prefilled with the same tokens */
    kvgen_session *child = NULL, *fresh = NULL;
    CHECK_OK(kvgen_session_fork(ss[2], &child, &err));
    int32_t seq[32];
    size_t len = 3 + 2 * 3;
    memcpy(seq, prompt[2], len * sizeof(int32_t));
    for (int st = 0; st < STEPS; st++) seq[len++] = next[st][2];
    CHECK_OK(kvgen_session_create(m, &sd, &fresh, &err));
    CHECK_OK(kvgen_session_prefill(fresh, seq, len, NULL, &err));
    if (child && fresh) {
        CHECK(memcmp(kvgen_session_logits(child), kvgen_session_logits(fresh), V * sizeof(float)) == 0);
        CHECK_OK(kvgen_session_decode(child, 7, &err));
        CHECK_OK(kvgen_session_decode(fresh, 7, &err));
        CHECK(memcmp(kvgen_session_logits(child), kvgen_session_logits(fresh), V * sizeof(float)) == 0);
    }

    /* save and restore: on the cpu backend it continues exactly; on the reference within the
     * tolerance (its cache came from the cpu backend) */
    char *file = tu_tmpfile("cpu-session.kvs");
    CHECK_OK(kvgen_session_save(ss[4], file, &err));
    kvgen_session *back = NULL, *on_ref = NULL;
    CHECK_OK(kvgen_session_restore(m, file, &back, &err));
    CHECK_OK(kvgen_session_restore(ref, file, &on_ref, &err));
    if (back && on_ref) {
        CHECK_OK(kvgen_session_decode(ss[4], 9, &err));
        CHECK_OK(kvgen_session_decode(back, 9, &err));
        CHECK_OK(kvgen_session_decode(on_ref, 9, &err));
        CHECK(memcmp(kvgen_session_logits(ss[4]), kvgen_session_logits(back), V * sizeof(float)) == 0);
        diff d = {0};
        diff_rows(kvgen_session_logits(on_ref), kvgen_session_logits(back), 1, (int)V, &d);
        CHECKF(d.rel <= TOL_REL, "restored on the reference: %.4f", d.rel);
    }
    kvgen_session_close(back);
    kvgen_session_close(on_ref);
    free(file);
    kvgen_session_close(child);
    kvgen_session_close(fresh);
    for (int i = 0; i < NS; i++) {
        kvgen_session_close(ss[i]);
        kvgen_session_close(solo[i]);
    }

    /* context shift: both backends shift the same way; the logits after it stay within the
     * tolerance of the reference's */
    kvgen_session_desc shift = {.n_ctx = 40, .on_full = KVGEN_ON_FULL_SHIFT, .keep = 4, .no_prefix_reuse = 1};
    kvgen_session *a = NULL, *b = NULL;
    CHECK_OK(kvgen_session_create(ref, &shift, &a, &err));
    CHECK_OK(kvgen_session_create(m, &shift, &b, &err));
    int32_t toks[100];
    tu_fill_tokens(toks, 100, 77, info.n_vocab);
    diff d = {0};
    CHECK_OK(kvgen_session_prefill(a, toks, 30, NULL, &err));
    CHECK_OK(kvgen_session_prefill(b, toks, 30, NULL, &err));
    for (int i = 30; a && b && i < 100; i++) {
        CHECK_OK(kvgen_session_decode(a, toks[i], &err));
        CHECK_OK(kvgen_session_decode(b, toks[i], &err));
        diff_rows(kvgen_session_logits(a), kvgen_session_logits(b), 1, (int)V, &d);
    }
    CHECK(a && b && kvgen_session_length(a) == kvgen_session_length(b) && kvgen_session_length(b) <= 40);
    printf("context shift (70 decodes in a 40-token window): max |cpu - reference| / range %.4f, top-1 same %d/%d\n",
           d.rel, d.top1, d.n);
    CHECKF(d.rel <= TOL_REL, "after shifts: %.4f", d.rel);
    kvgen_session_close(a);
    kvgen_session_close(b);
done:
    kvgen_model_unload(m);
    kvgen_model_unload(ref);
    free(path);
}

/* each path this CPU has against the best and the portable one; KVGEN_CPU_ISA's refusals */
static int isa_threads = 2; /* the paths' models: 2 threads, or KVGEN_TEST_THREADS */
static void test_isa_paths(void) {
    const char *th = getenv("KVGEN_TEST_THREADS");
    if (th && atoi(th) > 0) isa_threads = atoi(th);
    char *path = tu_make_model("cpu-isa.gguf", "--seed 8 --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 "
                               "--mix q4_k_m");
    char *path32 = tu_make_model("cpu-isa32.gguf", "--seed 9 --layers 2 --embd 96 --ff 160 --heads 3 --kv-heads 1 "
                                 "--type Q5_1");
    /* the K types' groups on rows of 3 and 5 K blocks, and an output matrix of 1000 rows (not a
     * multiple of the groups' 16: the row kernels), at both activation precisions (and the
     * 32-element types' groups at 8 bits, on the paths that have them) */
    char *pathk = tu_make_model("cpu-isa-k.gguf", "--seed 10 --layers 2 --embd 768 --ff 1280 --heads 6 --kv-heads 2 "
                                "--mix q4_k_m --vocab-size 1000");
    static const struct {
        const char *label;
        int file, act_bits; /* file: path, path32, pathk */
        bool kgroups;       /* K types: the paths with K-type groups give each other's bits */
    } models[] = {{"q4_k_m", 0, 0, true},
                  {"Q5_1", 1, 0, false},
                  {"Q5_1 8-bit", 1, 8, false},
                  {"q4_k_m 768x1000", 2, 0, true},
                  {"q4_k_m 768x1000 8-bit", 2, 8, true}};
    const char *paths[3] = {path, path32, pathk};
    kvgen_error err = {0};
    for (size_t p = 0; p < sizeof models / sizeof models[0]; p++) {
        const char *label = models[p].label;
        if (!paths[models[p].file]) continue;
        run runs[KVG_ISA_COUNT] = {{0}};
        int32_t tokens[N_PROMPT + N_DEC];
        for (int isa = 0; isa < KVG_ISA_COUNT; isa++) {
            if (!kvg_cpu_isa_supported((kvg_cpu_isa)isa)) continue;
            setenv("KVGEN_CPU_ISA", kvg_cpu_isa_name((kvg_cpu_isa)isa), 1);
            kvgen_model_desc md = {.path = paths[models[p].file], .backend = KVGEN_BACKEND_CPU,
                                   .n_threads = isa_threads, .activation_bits = models[p].act_bits};
            kvgen_model *m = tu_load(&md);
            if (!m) continue;
            kvgen_model_info info;
            kvgen_model_get_info(m, &info);
            CHECKF(strstr(info.device, kvg_cpu_isa_name((kvg_cpu_isa)isa)) != NULL, "device %s", info.device);
            tu_fill_tokens(tokens, N_PROMPT + N_DEC, 5, info.n_vocab);
            run_model(m, tokens, &runs[isa]);
            kvgen_model_unload(m);
        }
        unsetenv("KVGEN_CPU_ISA");
        kvg_cpu_isa best = kvg_cpu_isa_best();
        /* 8-bit activations: the portable path has no 8-bit kernels (its 16-bit logits) */
        double tol = models[p].act_bits == 8 ? TOL_REL_8 : TOL_REL;
        for (int isa = 0; isa < KVG_ISA_COUNT; isa++) {
            if (!runs[isa].prefill || isa == (int)best) continue;
            diff d = compare_runs(&runs[best], &runs[isa]);
            diff dp = compare_runs(&runs[KVG_ISA_PORTABLE], &runs[isa]);
            printf("  %s: %s path vs %s: max diff / range %.2e (vs portable %.2e), top-1 same %d/%d\n", label,
                   kvg_cpu_isa_name((kvg_cpu_isa)isa), kvg_cpu_isa_name(best), d.rel, dp.rel, d.top1, d.n);
            CHECKF(d.rel <= tol && dp.rel <= tol, "%s: %s path: %.4f", label, kvg_cpu_isa_name((kvg_cpu_isa)isa), d.rel);
        }
        /* neon and dotprod share the vector ops, and their kernels give the same bits */
        if (runs[KVG_ISA_NEON].prefill && runs[KVG_ISA_DOTPROD].prefill) {
            CHECKF(same_run(&runs[KVG_ISA_NEON], &runs[KVG_ISA_DOTPROD]),
                   "%s: the dotprod path's logits are not the neon path's bits", label);
            printf("  %s: dotprod path: the neon path's bits\n", label);
        }
        /* the x86 paths run the K types' matrices in groups that give their portable row
         * kernels' bits, with the same vector ops: the same logits */
        static const kvg_cpu_isa kgroup_paths[] = {KVG_ISA_AVX2, KVG_ISA_AVX512, KVG_ISA_AVXVNNI, KVG_ISA_AVX512VNNI};
        const run *first = NULL;
        for (size_t i = 0; models[p].kgroups && i < sizeof kgroup_paths / sizeof kgroup_paths[0]; i++) {
            const run *r = &runs[kgroup_paths[i]];
            if (!r->prefill) continue;
            if (!first) {
                first = r;
                continue;
            }
            CHECKF(same_run(first, r), "%s: the %s path's logits are not the bits of the other x86 paths' K-type groups",
                   label, kvg_cpu_isa_name(kgroup_paths[i]));
            printf("  %s: %s path: the bits of the first x86 path's K-type groups\n", label,
                   kvg_cpu_isa_name(kgroup_paths[i]));
        }
        for (int isa = 0; isa < KVG_ISA_COUNT; isa++) run_free(&runs[isa]);
    }
    /* a bad name and a path this CPU lacks are refused, naming the variable */
    if (path) {
        kvgen_model *m = NULL;
        kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_CPU};
        setenv("KVGEN_CPU_ISA", "sse9", 1);
        CHECK(kvgen_model_load(&md, &m, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "KVGEN_CPU_ISA=sse9"));
        for (int isa = 1; isa < KVG_ISA_COUNT; isa++) {
            if (kvg_cpu_isa_supported((kvg_cpu_isa)isa)) continue;
            setenv("KVGEN_CPU_ISA", kvg_cpu_isa_name((kvg_cpu_isa)isa), 1);
            CHECKF(kvgen_model_load(&md, &m, &err) == KVGEN_E_UNSUPPORTED && strstr(err.message, "lacks"),
                   "KVGEN_CPU_ISA=%s on a CPU without it", kvg_cpu_isa_name((kvg_cpu_isa)isa));
        }
        unsetenv("KVGEN_CPU_ISA");
    }
    if (*isa_env_saved) setenv("KVGEN_CPU_ISA", isa_env_saved, 1);
    free(path);
    free(path32);
    free(pathk);
}

/* ---- the default model ---- */

static const char *LONG_TEXT =
    "<|im_start|>system\nYou are Mira, the blacksmith of Oakvale. Answer briefly.<|im_end|>\n"
    "<|im_start|>user\nCan you repair my sword before the festival tomorrow? It cost me 125 gold.<|im_end|>\n"
    "<|im_start|>assistant\nOf course! Bring it to my forge at dawn and it will be sharp by noon.<|im_end|>\n"
    "<|im_start|>user\nThank you. Do you also sell shields? The road to the northern pass is dangerous, and "
    "the guards say wolves have been seen near the old mill.<|im_end|>\n"
    "<|im_start|>assistant\nI have two oak shields bound with iron, forty gold each, and a smaller buckler for "
    "twenty-five. For wolves I would take the oak: it is heavy, but it will hold. Stay on the road, travel "
    "with the merchants' caravan if you can, and light a fire when you camp.<|im_end|>\n"
    "<|im_start|>user\nWhat about armour? I have only a leather jerkin and it is worn at the shoulders.<|im_end|>\n"
    "<|im_start|>assistant\nLeather can be patched. Leave it with me tonight and I will stitch a new shoulder "
    "piece and rivet two plates over the weak spots. It will cost you ten gold and a story about where you "
    "got that scar.<|im_end|>\n";

/* test_parity's fixtures (tu_oracle_load): 65 tokens and llama.cpp's top-20 logits at each
 * position */
#define FX_TOK 65
#define FX_TOP 20

/* top-1 agreements with the fixture, and the largest |diff| over its top-20 */
static int against_fixture(const tu_oracle *fx, const float *logits, int V, double *max_diff) {
    tu_oracle_cmp c = tu_oracle_compare(fx, logits, V, FX_TOK, FX_TOP, 0, NULL);
    *max_diff = c.max_diff;
    return c.top1;
}

/* positions where the top-1 differs from the f32 fixture's */
static int flips(const tu_oracle *f32, const float *logits, int V) {
    int n = 0;
    for (int p = 0; p < FX_TOK; p++) n += argmax(logits + (size_t)p * V, V) != f32->top_id[p][0];
    return n;
}

static void test_llama_cpp(kvgen_model *cpu, kvgen_model *cpu8) {
    static tu_oracle f32, native;
    if (!tu_oracle_load("smollm2_oracle_logits.txt", FX_TOP, &f32) ||
        !tu_oracle_load("smollm2_oracle_logits_native.txt", FX_TOP, &native))
        return;
    CHECKF(f32.n_tok == FX_TOK && f32.n_pos == FX_TOK && native.n_tok == FX_TOK && native.n_pos == FX_TOK,
           "llama.cpp fixtures: %d and %d tokens, %d and %d positions", f32.n_tok, native.n_tok, f32.n_pos, native.n_pos);
    if (f32.n_pos != FX_TOK || native.n_pos != FX_TOK) return;
    kvgen_model_info info;
    kvgen_model_get_info(cpu, &info);
    float *logits = malloc((size_t)FX_TOK * info.n_vocab * sizeof(float));
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    kvgen_session_desc sd = {.no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(cpu, &sd, &s, &err));
    if (s && kvgen_session_prefill(s, f32.tokens, FX_TOK, logits, &err) == KVGEN_OK) {
        double d32, dnat;
        int t32 = against_fixture(&f32, logits, info.n_vocab, &d32);
        int tnat = against_fixture(&native, logits, info.n_vocab, &dnat);
        printf("cpu backend vs llama.cpp on f32 weights: top-1 %d/%d, max |diff| %.4f; vs llama.cpp's 8-bit "
               "activations: top-1 %d/%d, max |diff| %.4f\n", t32, FX_TOK, d32, tnat, FX_TOK, dnat);
        CHECKF(t32 == FX_TOK && d32 < 0.1, "vs llama.cpp f32: top-1 %d/%d, max %.4f", t32, FX_TOK, d32);
        /* how often 8-bit activations flip the top-1 of the same weights in f32: kvgen's and llama.cpp's */
        int native_flips = 0;
        for (int p = 0; p < FX_TOK; p++) native_flips += native.top_id[p][0] != f32.top_id[p][0];
        kvgen_session *s8 = NULL;
        if (cpu8 && kvgen_session_create(cpu8, &sd, &s8, &err) == KVGEN_OK &&
            kvgen_session_prefill(s8, f32.tokens, FX_TOK, logits, &err) == KVGEN_OK) {
            int f8 = flips(&f32, logits, info.n_vocab);
            printf("top-1 flips against llama.cpp on f32 weights over %d positions: kvgen 16-bit %d, kvgen 8-bit %d, "
                   "llama.cpp's own 8-bit run %d\n", FX_TOK, FX_TOK - t32, f8, native_flips);
            CHECKF(f8 <= native_flips + 2, "8-bit activations flip %d tokens, llama.cpp's %d", f8, native_flips);
        }
        kvgen_session_close(s8);
    }
    kvgen_session_close(s);
    free(logits);
}

static void test_default_model(void) {
    const char *path = tu_model_path();
    if (!path) {
        printf("default model absent: its parity not checked\n");
        return;
    }
    kvgen_model *ref = load(path, KVGEN_BACKEND_REFERENCE, 2), *cpu = load(path, KVGEN_BACKEND_CPU, 2);
    if (!ref || !cpu) {
        kvgen_model_unload(ref);
        kvgen_model_unload(cpu);
        return;
    }
    kvgen_error err = {0};
    int32_t tokens[512];
    size_t n = 0;
    CHECK_OK(kvgen_tokenize(ref, LONG_TEXT, strlen(LONG_TEXT), KVGEN_TOKENIZE_SPECIAL, tokens, 512, &n, &err));
    kvgen_model_info info;
    kvgen_model_get_info(ref, &info);
    size_t V = (size_t)info.n_vocab;
    float *a = malloc(n * V * sizeof(float)), *b = malloc(n * V * sizeof(float));
    kvgen_session *sa = NULL, *sb = NULL;
    kvgen_session_desc sd = {.n_ctx = 1024, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(ref, &sd, &sa, &err));
    CHECK_OK(kvgen_session_create(cpu, &sd, &sb, &err));
    CHECK_OK(kvgen_session_prefill(sa, tokens, n, a, &err));
    CHECK_OK(kvgen_session_prefill(sb, tokens, n, b, &err));
    diff d = {0};
    diff_rows(a, b, (int)n, (int)V, &d);
    double mean = 0;
    for (size_t p = 0; p < n; p++) {
        double md = 0;
        for (size_t i = 0; i < V; i++) md = fmax(md, fabs((double)a[p * V + i] - b[p * V + i]));
        mean += md / (double)n;
    }
    printf("default model, %zu teacher-forced tokens: top-1 same as the reference at %d/%d (%.1f%%), max |diff| / "
           "range %.4f, mean over positions of max |diff| %.3f\n",
           n, d.top1, d.n, 100.0 * d.top1 / d.n, d.rel, mean);
    CHECKF(n >= 240, "the text is %zu tokens", n);
    CHECKF(d.top1 >= 0.99 * d.n, "top-1 agreement %d/%d", d.top1, d.n);
    CHECKF(d.rel <= TOL_REL, "%.4f of the logit range", d.rel);
    kvgen_session_close(sa);
    kvgen_session_close(sb);
    /* 8-bit activations: a looser bound, measured and reported */
    kvgen_model_desc d8 = {.path = path, .backend = KVGEN_BACKEND_CPU, .n_threads = 2, .activation_bits = 8};
    kvgen_model *cpu8 = tu_load(&d8);
    kvgen_session *s8 = NULL;
    if (cpu8 && kvgen_session_create(cpu8, &sd, &s8, &err) == KVGEN_OK &&
        kvgen_session_prefill(s8, tokens, n, b, &err) == KVGEN_OK) {
        diff d8r = {0};
        diff_rows(a, b, (int)n, (int)V, &d8r);
        printf("default model, 8-bit activations: top-1 same as the reference at %d/%d (%.1f%%), max |diff| / range "
               "%.4f\n", d8r.top1, d8r.n, 100.0 * d8r.top1 / d8r.n, d8r.rel);
        CHECKF(d8r.top1 >= 0.95 * d8r.n, "8-bit: top-1 agreement %d/%d", d8r.top1, d8r.n);
        CHECKF(d8r.rel <= TOL_REL_8, "8-bit: %.4f of the logit range", d8r.rel);
    }
    kvgen_session_close(s8);
    free(a);
    free(b);
    test_llama_cpp(cpu, cpu8);
    kvgen_model_unload(cpu8);
    kvgen_model_unload(ref);
    kvgen_model_unload(cpu);
}

int main(void) {
    const char *isa = getenv("KVGEN_CPU_ISA");
    snprintf(isa_env_saved, sizeof isa_env_saved, "%s", isa ? isa : "");
    char have[160];
    kvg_cpu_features_describe(have, sizeof have);
    printf("CPU features: %s; best path: %s\n", have, kvg_cpu_isa_name(kvg_cpu_isa_best()));
    const char *want = getenv("KVGEN_TEST_EXPECT_ISA");
    if (want && *want)
        CHECKF(strcmp(want, kvg_cpu_isa_name(kvg_cpu_isa_best())) == 0, "detected path %s, expected %s (features: %s)",
               kvg_cpu_isa_name(kvg_cpu_isa_best()), want, have);
    /* KVGEN_TEST_EXPECT_PATHS: paths that must be on offer, comma-separated (a build with
     * KVGEN_TEST_AVXVNNI_EVEX on an AVX-512 VNNI CPU must offer avxvnni, or it tests nothing) */
    const char *paths = getenv("KVGEN_TEST_EXPECT_PATHS");
    for (const char *p = paths; p && *p;) {
        size_t n = strcspn(p, ",");
        bool found = false;
        for (int i = 0; i < KVG_ISA_COUNT; i++) {
            const char *name = kvg_cpu_isa_name((kvg_cpu_isa)i);
            if (strlen(name) == n && strncmp(name, p, n) == 0) found = kvg_cpu_isa_supported((kvg_cpu_isa)i);
        }
        CHECKF(found, "KVGEN_TEST_EXPECT_PATHS: the %.*s path is not on offer (features: %s)", (int)n, p, have);
        p += n + (p[n] == ',');
    }
    test_kernels();
    test_group_shapes();
    test_vec_ops();
    /* KVGEN_TEST_ISA_ONLY=1: the kernels and the paths against each other only (the emulated
     * AArch64 stage: the rest checks code that is the same on every path) */
    const char *isa_only = getenv("KVGEN_TEST_ISA_ONLY");
    bool all = !isa_only || strcmp(isa_only, "1") != 0;
    if (all) {
        test_types();
        test_act8();
        test_features();
        test_sessions();
    }
    test_isa_paths();
    if (all) test_default_model();
    return tu_finish("test_cpu_backend");
}
