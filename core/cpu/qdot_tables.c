/* qdot_tables.c: the kernel tables, one per path (which kernel dots each weight type, with which
 * activations), the row-group tables (avx512vnni: GROUPS_QS, GROUPS_Q8; avx2, and avx512's K
 * types: GROUPS_*_AVX2; avx512 and avx512vnni: GROUPS_FL_AVX512, the float types; avxvnni:
 * GROUPS_*_AVXVNNI; neon, dotprod: GROUPS_*_NEON, GROUPS_*_DOTPROD), and the choice of a
 * path's kernels and quantizers (kvg_qdot.h). */
#include "qdot_internal.h"

enum { N_KERNELS = 16 };
/* a row of the tables of the kernels without row groups */
#define K(t, a, d, r) {.type = t, .act = a, .dot = kvg_qdot_##d, .repack = r}

static const kvg_qdot_kernel PORTABLE[N_KERNELS] = {
    K(KVG_TYPE_F32, KVG_ACT_F32, p_f32, NULL),       K(KVG_TYPE_F16, KVG_ACT_F32, p_f16, NULL),
    K(KVG_TYPE_BF16, KVG_ACT_F32, p_bf16, NULL),     K(KVG_TYPE_Q8_0, KVG_ACT_QB, p_q8_0, kvg_qdot_r_q8_0),
    K(KVG_TYPE_Q4_0, KVG_ACT_QB, p_q4_0, kvg_qdot_r_q4_0),      K(KVG_TYPE_Q4_1, KVG_ACT_QB, p_q4_1, kvg_qdot_r_q4_1),
    K(KVG_TYPE_Q5_0, KVG_ACT_QB, p_q5_0, kvg_qdot_r_q5_0),      K(KVG_TYPE_Q5_1, KVG_ACT_QB, p_q5_1, kvg_qdot_r_q5_1),
    K(KVG_TYPE_IQ4_NL, KVG_ACT_QB, p_iq4_nl, kvg_qdot_r_iq4_nl),  K(KVG_TYPE_Q2_K, KVG_ACT_QK, p_q2_k, NULL),
    K(KVG_TYPE_Q3_K, KVG_ACT_QK, p_q3_k, NULL),      K(KVG_TYPE_Q4_K, KVG_ACT_QK, p_q4_k, NULL),
    K(KVG_TYPE_Q5_K, KVG_ACT_QK, p_q5_k, NULL),      K(KVG_TYPE_Q6_K, KVG_ACT_QK, p_q6_k, NULL),
    K(KVG_TYPE_Q8_K, KVG_ACT_QK, p_q8_k, NULL),      K(KVG_TYPE_IQ4_XS, KVG_ACT_QK, p_iq4_xs, NULL),
};

#if defined(KVG_X86) || defined(KVG_ARM)
/* a row of the group tables: the row kernel (for a matrix whose rows do not fill groups), its
 * repacking, the group kernel, its packing and size */
#define GROUP_ROW(type, t, act, p, g) {type, act, kvg_qdot_##p##_##t, kvg_qdot_r_##t, kvg_qdot_##g##_##t, kvg_qdot_g_##t, kvg_qdot_gb_##t}
/* the K types' rows read the file's layout (no repack) */
#define K_GROUP_ROW(type, t, act, p, g) {type, act, kvg_qdot_##p##_##t, NULL, kvg_qdot_##g##_##t, kvg_qdot_g_##t, kvg_qdot_gb_##t}
/* the 32-element types and the K types but Q8_K */
#define GROUP_TABLE(act, p, g)                                                                  \
    {GROUP_ROW(KVG_TYPE_Q8_0, q8_0, act, p, g), GROUP_ROW(KVG_TYPE_Q4_0, q4_0, act, p, g),      \
     GROUP_ROW(KVG_TYPE_Q4_1, q4_1, act, p, g), GROUP_ROW(KVG_TYPE_Q5_0, q5_0, act, p, g),      \
     GROUP_ROW(KVG_TYPE_Q5_1, q5_1, act, p, g), GROUP_ROW(KVG_TYPE_IQ4_NL, iq4_nl, act, p, g),  \
     K_GROUP_ROW(KVG_TYPE_Q2_K, q2_k, act, p, g), K_GROUP_ROW(KVG_TYPE_Q3_K, q3_k, act, p, g),  \
     K_GROUP_ROW(KVG_TYPE_Q4_K, q4_k, act, p, g), K_GROUP_ROW(KVG_TYPE_Q5_K, q5_k, act, p, g),  \
     K_GROUP_ROW(KVG_TYPE_Q6_K, q6_k, act, p, g), K_GROUP_ROW(KVG_TYPE_IQ4_XS, iq4_xs, act, p, g)}
enum { N_GROUP_KERNELS = 12 };
#endif

#ifdef KVG_X86
static const kvg_qdot_kernel AVX2_TABLE[N_KERNELS] = {
    K(KVG_TYPE_F32, KVG_ACT_F32, x2_f32, NULL),      K(KVG_TYPE_F16, KVG_ACT_F32, x2_f16, NULL),
    K(KVG_TYPE_BF16, KVG_ACT_F32, x2_bf16, NULL),    K(KVG_TYPE_Q8_0, KVG_ACT_QB, x2_q8_0, kvg_qdot_r_q8_0),
    K(KVG_TYPE_Q4_0, KVG_ACT_QB, x2_q4_0, kvg_qdot_r_q4_0),     K(KVG_TYPE_Q4_1, KVG_ACT_QB, x2_q4_1, kvg_qdot_r_q4_1),
    K(KVG_TYPE_Q5_0, KVG_ACT_QB, x2_q5_0, kvg_qdot_r_q5_0),     K(KVG_TYPE_Q5_1, KVG_ACT_QB, x2_q5_1, kvg_qdot_r_q5_1),
    K(KVG_TYPE_IQ4_NL, KVG_ACT_QB, x2_iq4_nl, kvg_qdot_r_iq4_nl), K(KVG_TYPE_Q2_K, KVG_ACT_QK, x2_q2_k, NULL),
    K(KVG_TYPE_Q3_K, KVG_ACT_QK, x2_q3_k, NULL),     K(KVG_TYPE_Q4_K, KVG_ACT_QK, x2_q4_k, NULL),
    K(KVG_TYPE_Q5_K, KVG_ACT_QK, x2_q5_k, NULL),     K(KVG_TYPE_Q6_K, KVG_ACT_QK, x2_q6_k, NULL),
    K(KVG_TYPE_Q8_K, KVG_ACT_QK, x2_q8_k, NULL),     K(KVG_TYPE_IQ4_XS, KVG_ACT_QK, x2_iq4_xs, NULL),
};
/* the K types keep their AVX2 loops (and the AVX2 groups, group_of) */
static const kvg_qdot_kernel AVX512_TABLE[N_KERNELS] = {
    K(KVG_TYPE_F32, KVG_ACT_F32, x5_f32, NULL),      K(KVG_TYPE_F16, KVG_ACT_F32, x5_f16, NULL),
    K(KVG_TYPE_BF16, KVG_ACT_F32, x5_bf16, NULL),    K(KVG_TYPE_Q8_0, KVG_ACT_QB, x5_q8_0, kvg_qdot_r_q8_0),
    K(KVG_TYPE_Q4_0, KVG_ACT_QB, x5_q4_0, kvg_qdot_r_q4_0),     K(KVG_TYPE_Q4_1, KVG_ACT_QB, x5_q4_1, kvg_qdot_r_q4_1),
    K(KVG_TYPE_Q5_0, KVG_ACT_QB, x5_q5_0, kvg_qdot_r_q5_0),     K(KVG_TYPE_Q5_1, KVG_ACT_QB, x5_q5_1, kvg_qdot_r_q5_1),
    K(KVG_TYPE_IQ4_NL, KVG_ACT_QB, x5_iq4_nl, kvg_qdot_r_iq4_nl), K(KVG_TYPE_Q2_K, KVG_ACT_QK, x2_q2_k, NULL),
    K(KVG_TYPE_Q3_K, KVG_ACT_QK, x2_q3_k, NULL),     K(KVG_TYPE_Q4_K, KVG_ACT_QK, x2_q4_k, NULL),
    K(KVG_TYPE_Q5_K, KVG_ACT_QK, x2_q5_k, NULL),     K(KVG_TYPE_Q6_K, KVG_ACT_QK, x2_q6_k, NULL),
    K(KVG_TYPE_Q8_K, KVG_ACT_QK, x2_q8_k, NULL),     K(KVG_TYPE_IQ4_XS, KVG_ACT_QK, x2_iq4_xs, NULL),
};
static const kvg_qdot_kernel AVX512_VNNI_TABLE[N_KERNELS] = {
    K(KVG_TYPE_F32, KVG_ACT_F32, x5_f32, NULL),      K(KVG_TYPE_F16, KVG_ACT_F32, x5_f16, NULL),
    K(KVG_TYPE_BF16, KVG_ACT_F32, x5_bf16, NULL),    K(KVG_TYPE_Q8_0, KVG_ACT_QB, xv_q8_0, kvg_qdot_r_q8_0),
    K(KVG_TYPE_Q4_0, KVG_ACT_QB, xv_q4_0, kvg_qdot_r_q4_0),     K(KVG_TYPE_Q4_1, KVG_ACT_QB, xv_q4_1, kvg_qdot_r_q4_1),
    K(KVG_TYPE_Q5_0, KVG_ACT_QB, xv_q5_0, kvg_qdot_r_q5_0),     K(KVG_TYPE_Q5_1, KVG_ACT_QB, xv_q5_1, kvg_qdot_r_q5_1),
    K(KVG_TYPE_IQ4_NL, KVG_ACT_QB, xv_iq4_nl, kvg_qdot_r_iq4_nl), K(KVG_TYPE_Q2_K, KVG_ACT_QK, x2_q2_k, NULL),
    K(KVG_TYPE_Q3_K, KVG_ACT_QK, x2_q3_k, NULL),     K(KVG_TYPE_Q4_K, KVG_ACT_QK, x2_q4_k, NULL),
    K(KVG_TYPE_Q5_K, KVG_ACT_QK, x2_q5_k, NULL),     K(KVG_TYPE_Q6_K, KVG_ACT_QK, x2_q6_k, NULL),
    K(KVG_TYPE_Q8_K, KVG_ACT_QK, x2_q8_k, NULL),     K(KVG_TYPE_IQ4_XS, KVG_ACT_QK, x2_iq4_xs, NULL),
};
/* avx512vnni: the 32-element and K types in row groups, against split 16-bit activations (GROUPS_QS)
 * or 8-bit ones (GROUPS_Q8, kvg_qdot_kernel_fast); every other type as the avx512 path on a
 * VNNI CPU */
static const kvg_qdot_kernel GROUPS_QS[N_GROUP_KERNELS] = GROUP_TABLE(KVG_ACT_QS, ps, gs);
static const kvg_qdot_kernel GROUPS_Q8[N_GROUP_KERNELS] = GROUP_TABLE(KVG_ACT_Q8, p8, gv);
/* avx2: the 32-element and K types in row groups of AVX2 (vpmaddubsw), against the same
 * activations; avx512 takes the K types' rows of these (its own rows for the 32-element types).
 * Against split activations only the narrow types: Q8_0's, IQ4_NL's and IQ4_XS's levels take
 * two nibbles there (qdot_x86.c), four vpmaddubsw per 4 products, slower on prompts than their
 * rows' vpmaddwd on 16-bit activations (docs/architecture.md) */
static const kvg_qdot_kernel GROUPS_Q8_AVX2[N_GROUP_KERNELS] = GROUP_TABLE(KVG_ACT_Q8, p8, av);
enum { N_GROUP_KERNELS_QS_AVX2 = 9 };
static const kvg_qdot_kernel GROUPS_QS_AVX2[N_GROUP_KERNELS_QS_AVX2] = {
    GROUP_ROW(KVG_TYPE_Q4_0, q4_0, KVG_ACT_QS, ps, as),   GROUP_ROW(KVG_TYPE_Q4_1, q4_1, KVG_ACT_QS, ps, as),
    GROUP_ROW(KVG_TYPE_Q5_0, q5_0, KVG_ACT_QS, ps, as),   GROUP_ROW(KVG_TYPE_Q5_1, q5_1, KVG_ACT_QS, ps, as),
    K_GROUP_ROW(KVG_TYPE_Q2_K, q2_k, KVG_ACT_QS, ps, as), K_GROUP_ROW(KVG_TYPE_Q3_K, q3_k, KVG_ACT_QS, ps, as),
    K_GROUP_ROW(KVG_TYPE_Q4_K, q4_k, KVG_ACT_QS, ps, as), K_GROUP_ROW(KVG_TYPE_Q5_K, q5_k, KVG_ACT_QS, ps, as),
    K_GROUP_ROW(KVG_TYPE_Q6_K, q6_k, KVG_ACT_QS, ps, as)};
/* avx512 and avx512vnni: the float types in row groups (their 16 rows one after another, 4 rows
 * by 4 tokens at a time), with the f32 activations at both precisions */
#define FL_GROUP_ROW(type, t) {type, KVG_ACT_F32, kvg_qdot_x5_##t, NULL, kvg_qdot_g5_##t, kvg_qdot_g_##t, kvg_qdot_gb_##t}
enum { N_FL_GROUP_KERNELS = 3 };
static const kvg_qdot_kernel GROUPS_FL_AVX512[N_FL_GROUP_KERNELS] = {
    FL_GROUP_ROW(KVG_TYPE_F32, f32), FL_GROUP_ROW(KVG_TYPE_F16, f16), FL_GROUP_ROW(KVG_TYPE_BF16, bf16)};
/* avxvnni: those groups with vpdpbusd, IQ4_XS's, Q8_0's and IQ4_NL's too (no int16 step to
 * saturate) */
static const kvg_qdot_kernel GROUPS_QS_AVXVNNI[N_GROUP_KERNELS] = GROUP_TABLE(KVG_ACT_QS, ps, ys);
static const kvg_qdot_kernel GROUPS_Q8_AVXVNNI[N_GROUP_KERNELS] = GROUP_TABLE(KVG_ACT_Q8, p8, yv);
#endif

#ifdef KVG_ARM
static const kvg_qdot_kernel NEON_TABLE[N_KERNELS] = {
    K(KVG_TYPE_F32, KVG_ACT_F32, n_f32, NULL),       K(KVG_TYPE_F16, KVG_ACT_F32, n_f16, NULL),
    K(KVG_TYPE_BF16, KVG_ACT_F32, n_bf16, NULL),     K(KVG_TYPE_Q8_0, KVG_ACT_QB, n_q8_0, kvg_qdot_r_q8_0),
    K(KVG_TYPE_Q4_0, KVG_ACT_QB, n_q4_0, kvg_qdot_r_q4_0),      K(KVG_TYPE_Q4_1, KVG_ACT_QB, n_q4_1, kvg_qdot_r_q4_1),
    K(KVG_TYPE_Q5_0, KVG_ACT_QB, n_q5_0, kvg_qdot_r_q5_0),      K(KVG_TYPE_Q5_1, KVG_ACT_QB, n_q5_1, kvg_qdot_r_q5_1),
    K(KVG_TYPE_IQ4_NL, KVG_ACT_QB, n_iq4_nl, kvg_qdot_r_iq4_nl),  K(KVG_TYPE_Q2_K, KVG_ACT_QK, n_q2_k, NULL),
    K(KVG_TYPE_Q3_K, KVG_ACT_QK, n_q3_k, NULL),      K(KVG_TYPE_Q4_K, KVG_ACT_QK, n_q4_k, NULL),
    K(KVG_TYPE_Q5_K, KVG_ACT_QK, n_q5_k, NULL),      K(KVG_TYPE_Q6_K, KVG_ACT_QK, n_q6_k, NULL),
    K(KVG_TYPE_Q8_K, KVG_ACT_QK, n_q8_k, NULL),      K(KVG_TYPE_IQ4_XS, KVG_ACT_QK, n_iq4_xs, NULL),
};
/* the float types keep the neon loops (no integer products to dot) */
static const kvg_qdot_kernel DOTPROD_TABLE[N_KERNELS] = {
    K(KVG_TYPE_F32, KVG_ACT_F32, n_f32, NULL),       K(KVG_TYPE_F16, KVG_ACT_F32, n_f16, NULL),
    K(KVG_TYPE_BF16, KVG_ACT_F32, n_bf16, NULL),     K(KVG_TYPE_Q8_0, KVG_ACT_QB, d_q8_0, kvg_qdot_r_q8_0),
    K(KVG_TYPE_Q4_0, KVG_ACT_QB, d_q4_0, kvg_qdot_r_q4_0),      K(KVG_TYPE_Q4_1, KVG_ACT_QB, d_q4_1, kvg_qdot_r_q4_1),
    K(KVG_TYPE_Q5_0, KVG_ACT_QB, d_q5_0, kvg_qdot_r_q5_0),      K(KVG_TYPE_Q5_1, KVG_ACT_QB, d_q5_1, kvg_qdot_r_q5_1),
    K(KVG_TYPE_IQ4_NL, KVG_ACT_QB, d_iq4_nl, kvg_qdot_r_iq4_nl),  K(KVG_TYPE_Q2_K, KVG_ACT_QK, d_q2_k, NULL),
    K(KVG_TYPE_Q3_K, KVG_ACT_QK, d_q3_k, NULL),      K(KVG_TYPE_Q4_K, KVG_ACT_QK, d_q4_k, NULL),
    K(KVG_TYPE_Q5_K, KVG_ACT_QK, d_q5_k, NULL),      K(KVG_TYPE_Q6_K, KVG_ACT_QK, d_q6_k, NULL),
    K(KVG_TYPE_Q8_K, KVG_ACT_QK, d_q8_k, NULL),      K(KVG_TYPE_IQ4_XS, KVG_ACT_QK, d_iq4_xs, NULL),
};
/* neon and dotprod: the 32-element types and the K types but Q8_K in row groups (widening
 * multiply-adds, SDOT), against the avx512vnni groups' activations; Q8_K and the float types
 * keep their kernels above */
static const kvg_qdot_kernel GROUPS_QS_NEON[N_GROUP_KERNELS] = GROUP_TABLE(KVG_ACT_QS, ps, ns);
static const kvg_qdot_kernel GROUPS_Q8_NEON[N_GROUP_KERNELS] = GROUP_TABLE(KVG_ACT_Q8, p8, nv);
static const kvg_qdot_kernel GROUPS_QS_DOTPROD[N_GROUP_KERNELS] = GROUP_TABLE(KVG_ACT_QS, ps, ds);
static const kvg_qdot_kernel GROUPS_Q8_DOTPROD[N_GROUP_KERNELS] = GROUP_TABLE(KVG_ACT_Q8, p8, dv);
#endif

static const kvg_qdot_kernel *table_of(kvg_cpu_isa isa) {
#ifdef KVG_X86
    if (isa == KVG_ISA_AVX512VNNI) return AVX512_VNNI_TABLE; /* the types without groups */
    if (isa == KVG_ISA_AVX512) return kvg_cpu_features_get()->avx512vnni ? AVX512_VNNI_TABLE : AVX512_TABLE;
    if (isa == KVG_ISA_AVX2 || isa == KVG_ISA_AVXVNNI) return AVX2_TABLE;
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

/* the row-group kernel of type on path isa (split or 8-bit activations), or NULL */
static const kvg_qdot_kernel *group_of(kvg_cpu_isa isa, uint32_t type, bool act8) {
#ifdef KVG_X86
    if ((isa == KVG_ISA_AVX512VNNI || isa == KVG_ISA_AVX512) && find(GROUPS_FL_AVX512, N_FL_GROUP_KERNELS, type))
        return find(GROUPS_FL_AVX512, N_FL_GROUP_KERNELS, type);
    if (isa == KVG_ISA_AVX512VNNI) return find(act8 ? GROUPS_Q8 : GROUPS_QS, N_GROUP_KERNELS, type);
    if (isa == KVG_ISA_AVX2 || (isa == KVG_ISA_AVX512 && kvg_type_block_elems(type) == KVG_QK))
        return act8 ? find(GROUPS_Q8_AVX2, N_GROUP_KERNELS, type) : find(GROUPS_QS_AVX2, N_GROUP_KERNELS_QS_AVX2, type);
    if (isa == KVG_ISA_AVXVNNI)
        return find(act8 ? GROUPS_Q8_AVXVNNI : GROUPS_QS_AVXVNNI, N_GROUP_KERNELS, type);
#endif
#ifdef KVG_ARM
    if (isa == KVG_ISA_NEON) return find(act8 ? GROUPS_Q8_NEON : GROUPS_QS_NEON, N_GROUP_KERNELS, type);
    if (isa == KVG_ISA_DOTPROD) return find(act8 ? GROUPS_Q8_DOTPROD : GROUPS_QS_DOTPROD, N_GROUP_KERNELS, type);
#endif
    (void)isa, (void)type, (void)act8;
    return NULL;
}

const kvg_qdot_kernel *kvg_qdot_kernel_of(kvg_cpu_isa isa, uint32_t type) {
    const kvg_qdot_kernel *g = group_of(isa, type, false);
    if (g) return g;
    return find(table_of(isa), N_KERNELS, type);
}

const kvg_qdot_kernel *kvg_qdot_kernel_fast(kvg_cpu_isa isa, uint32_t type) {
    const kvg_qdot_kernel *g = group_of(isa, type, true);
    if (g) return g;
    return kvg_qdot_kernel_of(isa, type);
}

void kvg_qdot_quantize_qb(kvg_cpu_isa isa, const float *x, int n, int16_t *q, float *d, float *s) {
#ifdef KVG_X86
    if (isa == KVG_ISA_AVX2 || isa == KVG_ISA_AVX512 || isa == KVG_ISA_AVXVNNI || isa == KVG_ISA_AVX512VNNI) {
        kvg_qdot_quant_qb_avx2(x, n, q, d, s);
        return;
    }
#endif
#ifdef KVG_ARM
    if (isa == KVG_ISA_NEON || isa == KVG_ISA_DOTPROD) {
        kvg_qdot_quant_qb_neon(x, n, q, d, s);
        return;
    }
#endif
    kvg_qdot_quant_qb_portable(x, n, q, d, s);
}

void kvg_qdot_quantize_qk(kvg_cpu_isa isa, const float *x, int n, int16_t *q, float *d, int32_t *bsum) {
#ifdef KVG_X86
    if (isa == KVG_ISA_AVX2 || isa == KVG_ISA_AVX512 || isa == KVG_ISA_AVXVNNI || isa == KVG_ISA_AVX512VNNI) {
        kvg_qdot_quant_qk_avx2(x, n, q, d, bsum);
        return;
    }
#endif
#ifdef KVG_ARM
    if (isa == KVG_ISA_NEON || isa == KVG_ISA_DOTPROD) {
        kvg_qdot_quant_qk_neon(x, n, q, d, bsum);
        return;
    }
#endif
    kvg_qdot_quant_qk_portable(x, n, q, d, bsum);
}

/* the sums of each 16 of q = 256 hi + lo (hi NULL: lo), exact in any order */
static void q8_sums16(const int8_t *lo, const int8_t *hi, int n, int32_t *b16) {
    for (int g = 0; g < n / 16; g++) {
        int32_t sum = 0;
        for (int i = 16 * g; i < 16 * g + 16; i++) sum += lo[i] + (hi ? 256 * hi[i] : 0);
        b16[g] = sum;
    }
}

void kvg_qdot_quantize_q8(kvg_cpu_isa isa, const float *x, int n, int8_t *lo, int8_t *hi, float *d, float *s,
                          int32_t *b16) {
#ifdef KVG_X86
    if (isa == KVG_ISA_AVX512VNNI) {
        kvg_qdot_quant_q8_avx512(x, n, lo, hi, d, s, b16);
        return;
    }
#endif
#ifdef KVG_ARM
    if (isa == KVG_ISA_NEON || isa == KVG_ISA_DOTPROD) {
        kvg_qdot_quant_q8_neon(x, n, lo, hi, d, s);
        q8_sums16(lo, hi, n, b16);
        return;
    }
#endif
    (void)isa;
    kvg_qdot_quant_q8_portable(x, n, lo, hi, d, s);
    q8_sums16(lo, hi, n, b16);
}
