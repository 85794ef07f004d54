/* qdot_arm.c: the AArch64 kernels: Advanced SIMD (neon, the AArch64 baseline) and the ARMv8.2
 * dot product (dotprod, its own function target): the row kernels of every type, the row groups
 * of the 32-element and K types (the x86 paths' groups), and the activations' quantization with
 * neon (layouts: qdot_internal.h). Empty on other machines. */
#include <string.h>
#include "qdot_internal.h"

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
 * of a block, < 2^31 as on x86). Q8_K and the float types run these row kernels; the other
 * types run in row groups (below) against the byte activations, or, in a matrix whose rows do
 * not fill groups of 16, the portable row kernels of the groups' arithmetic (qdot_tables.c:
 * their row kernels here stay in the paths' tables, as the avx512vnni path's do). */
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
    target void kvg_qdot_##name(const uint8_t *w, const kvg_qact *a, int t, int nt, float *out, size_t os) { \
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

/* ---- row groups of the K types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) ---------------------------
 * The groups of kq_group_pack (the x86 paths' layout) against the byte activations of the x86
 * groups (8-bit, or 15-bit split into two bytes: sum(v q) = sum(v lo) + 256 sum(v hi)). A chunk
 * of 64 bytes (elements 4c..4c+3 of a block of 32, for the 16 rows) is 4 registers of 4 rows;
 * the kernel runs each K block a quarter of the rows at a time (rows 4r..4r+3: bytes
 * 16r..16r+15 of every chunk), so that a vector's 4 lanes are the quarter's rows and a tile of
 * 8 tokens keeps the quarter's accumulators in registers through the K block. The levels are decoded signed (kq_levels' v:
 * Q3_K's and Q6_K's offsets subtracted in bytes, IQ4_XS's table values), so no offset times
 * sum(q) is subtracted after. dotprod: SDOT by element multiplies each lane's 4 levels with 4
 * activation bytes (one 32-bit lane of the activations' register). neon: widening multiplies
 * (int8 by int8 to int16, |v q| <= 127 * 128), the products of kg_run_neon chunks added in int16,
 * which cannot overflow, then pairwise into int32 (vpadal) and each row's two pairs added
 * (vpadd). The integer sums are exact, and each row's f32 scaling is kq_q8_portable's
 * arithmetic in its order (fused multiply-adds, as its fma_exact), so every lane gives the bits
 * of the portable row kernel (used where a matrix's rows do not fill groups), as on x86. */

/* SDOT by element: acc + per lane the 4 products of w's bytes with bytes 4l..4l+3 of q (the
 * lane a constant of each instruction) */
#ifdef __clang__
#define SDOT_LANE_ASM(l) "sdot %0.4s, %1.16b, %2.4b[" #l "]"
#else
#define SDOT_LANE_ASM(l) ".arch_extension dotprod\n\tsdot %0.4s, %1.16b, %2.4b[" #l "]"
#endif
INL int32x4_t sdot_lane(int32x4_t acc, int8x16_t w, int8x16_t q, int l) {
    switch (l) {
    case 0: __asm__(SDOT_LANE_ASM(0) : "+w"(acc) : "w"(w), "w"(q)); break;
    case 1: __asm__(SDOT_LANE_ASM(1) : "+w"(acc) : "w"(w), "w"(q)); break;
    case 2: __asm__(SDOT_LANE_ASM(2) : "+w"(acc) : "w"(w), "w"(q)); break;
    default: __asm__(SDOT_LANE_ASM(3) : "+w"(acc) : "w"(w), "w"(q)); break;
    }
    return acc;
}
/* 32-bit lane l of q in every lane */
INL int8x16_t lane4(int8x16_t q, int l) {
    int32x4_t x = vreinterpretq_s32_s8(q);
    switch (l) {
    case 0: return vreinterpretq_s8_s32(vdupq_laneq_s32(x, 0));
    case 1: return vreinterpretq_s8_s32(vdupq_laneq_s32(x, 1));
    case 2: return vreinterpretq_s8_s32(vdupq_laneq_s32(x, 2));
    default: return vreinterpretq_s8_s32(vdupq_laneq_s32(x, 3));
    }
}

/* neon: chunks whose int16 products add up without overflow, 32767 / (128 max|v|) (Q2_K 3,
 * Q3_K 4, Q4_K 15, Q5_K 31, Q6_K 32, IQ4_XS 127) */
INL int kg_run_neon(kq_kind k) { return k == K_IQ4XS ? 2 : k == K_Q6 ? 4 : 8; }

/* per lane (row of the quarter), sum over chunks c < nc (4 or 8) of w[c]'s 4 levels times the
 * activation bytes q + 4c */
INL int32x4_t kg_dot_arm(bool dp, const int8x16_t *w, const int8_t *q, int nc, int run) {
    const int8x16_t qv[2] = {vld1q_s8(q), nc > 4 ? vld1q_s8(q + 16) : vdupq_n_s8(0)};
    if (dp) { /* two chains of SDOTs */
        int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0);
        for (int c = 0; c < nc; c += 2) {
            s0 = sdot_lane(s0, w[c], qv[c / 4], c % 4);
            s1 = sdot_lane(s1, w[c + 1], qv[c / 4], c % 4 + 1);
        }
        return vaddq_s32(s0, s1);
    }
    int32x4_t lo = vdupq_n_s32(0), hi = vdupq_n_s32(0); /* rows 0, 1 and rows 2, 3: pairs of products */
    int16x8_t pl = vdupq_n_s16(0), ph = vdupq_n_s16(0);
    for (int c = 0; c < nc; c++) {
        int8x16_t b = lane4(qv[c / 4], c % 4);
        if (c % run == 0) {
            pl = vmull_s8(vget_low_s8(w[c]), vget_low_s8(b));
            ph = vmull_high_s8(w[c], b);
        } else {
            pl = vmlal_s8(pl, vget_low_s8(w[c]), vget_low_s8(b));
            ph = vmlal_high_s8(ph, w[c], b);
        }
        if (c % run == run - 1 || c == nc - 1) {
            lo = vpadalq_s16(lo, pl);
            hi = vpadalq_s16(hi, ph);
        }
    }
    return vpaddq_s32(lo, hi);
}
/* the same for the 8-bit or split activations at q (hi: the split form's high bytes, or NULL) */
INL int32x4_t kg_dot_act_arm(bool dp, const int8x16_t *w, const int8_t *q, const int8_t *hi, int nc, int run) {
    int32x4_t s = kg_dot_arm(dp, w, q, nc, run);
    if (hi) s = vaddq_s32(s, vshlq_n_s32(kg_dot_arm(dp, w, hi, nc, run), 8)); /* 256 sum(v hi) */
    return s;
}

/* the signed levels of a quarter of a block of 32 (p: the block + 16 r): w[c] holds elements
 * 4c..4c+3 of each of its 4 rows (kq_group_pack's fields, kq_levels' values) */
INL void kg_levels_arm(kq_kind k, const uint8_t *p, int8x16_t *w) {
    const uint8x16_t m1 = vdupq_n_u8(1), m2 = vdupq_n_u8(3), m4 = vdupq_n_u8(15);
    uint8x16_t u[8];
    if (kg_2bit(k)) {
        for (int q = 0; q < 2; q++) {
            uint8x16_t x = vld1q_u8(p + 64 * q);
            for (int c = 0; c < 4; c++) u[4 * q + c] = vandq_u8(shr8(x, 2 * c), m2);
        }
        if (k == K_Q3) {
            uint8x16_t h = vld1q_u8(p + 128);
            for (int c = 0; c < 8; c++) u[c] = vorrq_u8(u[c], vshlq_n_u8(vandq_u8(shr8(h, c), m1), 2));
        }
    } else {
        for (int c = 0; c < 4; c++) {
            uint8x16_t x = vld1q_u8(p + 64 * c);
            u[c] = vandq_u8(x, m4);
            u[c + 4] = vshrq_n_u8(x, 4);
        }
        if (k == K_IQ4XS) {
            const int8x16_t t = vld1q_s8(IQ4_LEVELS);
            for (int c = 0; c < 8; c++) w[c] = vqtbl1q_s8(t, u[c]);
            return;
        }
        if (k == K_Q5) {
            uint8x16_t h = vld1q_u8(p + 256);
            for (int c = 0; c < 8; c++) u[c] = vorrq_u8(u[c], vshlq_n_u8(vandq_u8(shr8(h, c), m1), 4));
        }
        if (k == K_Q6)
            for (int q = 0; q < 2; q++) {
                uint8x16_t h = vld1q_u8(p + 256 + 64 * q);
                for (int c = 0; c < 4; c++)
                    u[4 * q + c] = vorrq_u8(u[4 * q + c], vshlq_n_u8(vandq_u8(shr8(h, 2 * c), m2), 4));
            }
    }
    for (int c = 0; c < 8; c++) w[c] = vsubq_s8(s8(u[c]), vdupq_n_s8((int8_t)kg_uoffset(k)));
}

/* the 4 bytes at p as lanes; (x >> n) & mask per lane; 4 f16 at p as f32 */
INL uint32x4_t bytes4(const uint8_t *p) {
    uint32_t x;
    memcpy(&x, p, 4);
    return vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(x)))));
}
INL uint32x4_t field4(uint32x4_t x, int n, unsigned mask) {
    return vandq_u32(vshlq_u32(x, vdupq_n_s32(-n)), vdupq_n_u32(mask));
}
INL float32x4_t f16x4(const uint8_t *p) { return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p))); }
INL int32x4_t s32(uint32x4_t x) { return vreinterpretq_s32_u32(x); }

/* K blocks of a group against a tile of tokens, each a quarter of the rows at a time: per block
 * of 32 the quarter's levels decoded once and its 4 rows' scales formed from their integer
 * fields (kq_group_pack's header), then each token's sums of 32 (or two of 16) scale them in the
 * order of kq_q8_portable. */
INL void kq_group_arm(kq_kind k, bool dp, bool split, const uint8_t *g, const kvg_qact *a, int t, const int nt,
                      float *out, size_t os) {
    const int n = a->n, nb = n / KVG_QK, n32 = n / KVG_QB, run = kg_run_neon(k);
    const bool per16 = kg_per16(k), has_min = kq_has_min(k);
    float32x4_t acc[4][KVG_GROUP_TILE]; /* quarter r, token i */
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < nt; i++) acc[r][i] = vdupq_n_f32(0.0f);
    for (int b = 0; b < nb; b++) {
        const uint8_t *sb = g + kg_block(k) * (size_t)b, *hdr = sb + 8 * kg_qblock(k);
        for (int r = 0; r < 4; r++) {
            float32x4_t ac[KVG_GROUP_TILE]; /* the quarter's accumulators, in registers for the K block */
            for (int i = 0; i < nt; i++) ac[i] = acc[r][i];
            float32x4_t d, dmin = vdupq_n_f32(0.0f);
            uint32x4_t high = vdupq_n_u32(0); /* a word per row of the scales' (and mins') high bits */
            switch (k) {
            case K_Q2: d = f16x4(hdr + 256 + 8 * r), dmin = f16x4(hdr + 288 + 8 * r); break;
            case K_Q3:
                d = f16x4(hdr + 192 + 8 * r);
                high = vreinterpretq_u32_u8(vld1q_u8(hdr + 128 + 16 * r));
                break;
            case K_Q6: d = f16x4(hdr + 256 + 8 * r); break;
            case K_IQ4XS:
                d = f16x4(hdr + 96 + 8 * r);
                high = vmovl_u16(vreinterpret_u16_u8(vld1_u8(hdr + 64 + 8 * r)));
                break;
            default: d = f16x4(hdr + 192 + 8 * r), dmin = f16x4(hdr + 224 + 8 * r); break; /* Q4_K, Q5_K */
            }
            for (int j = 0; j < 8; j++) {
                int8x16_t w[8];
                kg_levels_arm(k, sb + kg_qblock(k) * (size_t)j + 16 * (size_t)r, w);
                /* per 16 (sc[h], mn[h] for half h) or per 32 (sc[0], mn[0]) */
                int32x4_t sc[2], mn[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
                switch (k) {
                case K_Q2:
                    for (int h = 0; h < 2; h++) {
                        uint32x4_t x = bytes4(hdr + 16 * (2 * j + h) + 4 * r);
                        sc[h] = s32(field4(x, 0, 15));
                        mn[h] = s32(field4(x, 4, 15));
                    }
                    break;
                case K_Q3:
                    for (int h = 0; h < 2; h++) {
                        uint32x4_t lo = field4(bytes4(hdr + 16 * j + 4 * r), 4 * h, 15);
                        sc[h] = s32(vorrq_u32(lo, vshlq_n_u32(field4(high, 2 * (2 * j + h), 3), 4)));
                        sc[h] = vsubq_s32(sc[h], vdupq_n_s32(32));
                    }
                    break;
                case K_Q6:
                    for (int h = 0; h < 2; h++) {
                        int32_t x;
                        memcpy(&x, hdr + 16 * (2 * j + h) + 4 * r, 4);
                        sc[h] = vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(x)))));
                    }
                    break;
                case K_IQ4XS: {
                    uint32x4_t lo = field4(bytes4(hdr + 16 * (j / 2) + 4 * r), 4 * (j % 2), 15);
                    sc[0] = vsubq_s32(s32(vorrq_u32(lo, vshlq_n_u32(field4(high, 2 * j, 3), 4))), vdupq_n_s32(32));
                    break;
                }
                default: {
                    uint32x4_t x = bytes4(hdr + 16 * j + 4 * r); /* the scale, the min's high bits above it */
                    uint32x4_t lm = field4(bytes4(hdr + 128 + 16 * (j / 2) + 4 * r), 4 * (j % 2), 15);
                    sc[0] = s32(vandq_u32(x, vdupq_n_u32(63)));
                    mn[0] = s32(vorrq_u32(lm, vshlq_n_u32(field4(x, 6, 3), 4)));
                    break;
                }
                }
                float32x4_t dw[2], mw[2];
                for (int h = 0; h < (per16 ? 2 : 1); h++) {
                    dw[h] = vmulq_f32(d, vcvtq_f32_s32(sc[h]));
                    mw[h] = vmulq_f32(dmin, vcvtq_f32_s32(mn[h]));
                }
                for (int i = 0; i < nt; i++) {
                    size_t row = (size_t)(t + i), at = row * (size_t)n + (size_t)KVG_QK * b + 32 * (size_t)j;
                    size_t bi = row * (size_t)n32 + 8 * (size_t)b + (size_t)j;
                    const int8_t *qv = a->q8 + at, *hv = split ? a->q8h + at : NULL;
                    float daf = a->d8[bi];
                    float32x4_t da = vdupq_n_f32(daf);
                    if (per16) {
                        int32x4_t s0 = kg_dot_act_arm(dp, w, qv, hv, 4, run);
                        int32x4_t s1 = kg_dot_act_arm(dp, w + 4, qv + 16, hv ? hv + 16 : NULL, 4, run);
                        int32_t q0 = 0, q1 = 0; /* the halves' sums of q, for the mins */
                        if (has_min) {
                            q0 = vaddlvq_s8(vld1q_s8(qv));
                            q1 = vaddlvq_s8(vld1q_s8(qv + 16));
                            if (split) {
                                q0 += 256 * vaddlvq_s8(vld1q_s8(hv));
                                q1 += 256 * vaddlvq_s8(vld1q_s8(hv + 16));
                            }
                        }
                        ac[i] = vfmaq_f32(ac[i], vcvtq_f32_s32(s0), vmulq_f32(dw[0], da));
                        if (has_min) ac[i] = vfmsq_f32(ac[i], mw[0], vdupq_n_f32(daf * (float)q0));
                        ac[i] = vfmaq_f32(ac[i], vcvtq_f32_s32(s1), vmulq_f32(dw[1], da));
                        if (has_min) ac[i] = vfmsq_f32(ac[i], mw[1], vdupq_n_f32(daf * (float)q1));
                    } else {
                        int32x4_t s = kg_dot_act_arm(dp, w, qv, hv, 8, run);
                        ac[i] = vfmaq_f32(ac[i], vcvtq_f32_s32(s), vmulq_f32(dw[0], da));
                        if (has_min) ac[i] = vfmsq_f32(ac[i], mw[0], vdupq_n_f32(a->s8[bi]));
                    }
                }
            }
            for (int i = 0; i < nt; i++) acc[r][i] = ac[i];
        }
    }
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < nt; i++) vst1q_f32(out + (size_t)i * os + 4 * (size_t)r, acc[r][i]);
}

/* ---- row groups of the 32-element types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) -----------------
 * The groups of b32_group_pack against the same byte activations, a quarter of the rows at a
 * time as the K types' (runs of 8 blocks, 256 elements, as a K block). b32_q8_portable scales sum(u q) of the unsigned levels u: Q4 and Q5's
 * fit a signed byte as they are; Q8_0's (q + 128) and IQ4_NL's (level + 128) are multiplied as
 * v = u - 128 (Q8_0's q, IQ4_NL's level) and sum(u q) = sum(v q) + 128 sum(q), exact. neon adds
 * kg_run_b32 chunks of products in int16: 32767 / (128 max|v|) (Q4 15, Q5 31; IQ4_NL 127: 2;
 * Q8_0 up to 128: 1). */
INL int kg_run_b32(b32_kind k) { return k == B_Q8_0 ? 1 : k == B_IQ4_NL ? 2 : 8; }

/* the levels of a quarter of group block blk (p: blk + 16 r) as multiplied (above): w[c] holds
 * elements 4c..4c+3 of each of its 4 rows */
INL void b32_group_levels_arm(b32_kind k, const uint8_t *p, int8x16_t *w) {
    if (k == B_Q8_0) {
        for (int c = 0; c < 8; c++) w[c] = s8(veorq_u8(vld1q_u8(p + 64 * c), vdupq_n_u8(128)));
        return;
    }
    const uint8x16_t m1 = vdupq_n_u8(1), m4 = vdupq_n_u8(15);
    uint8x16_t u[8];
    for (int c = 0; c < 4; c++) {
        uint8x16_t x = vld1q_u8(p + 64 * c);
        u[c] = vandq_u8(x, m4);
        u[c + 4] = vshrq_n_u8(x, 4);
    }
    if (k == B_IQ4_NL) {
        const int8x16_t t = vld1q_s8(IQ4_LEVELS);
        for (int c = 0; c < 8; c++) w[c] = vqtbl1q_s8(t, u[c]);
        return;
    }
    if (b32_has_qh(k)) {
        uint8x16_t h = vld1q_u8(p + 256);
        for (int c = 0; c < 8; c++) u[c] = vorrq_u8(u[c], vshlq_n_u8(vandq_u8(shr8(h, c), m1), 4));
    }
    for (int c = 0; c < 8; c++) w[c] = s8(u[c]);
}

/* blocks of a group (b32_group_pack) against a tile of tokens, in the order of b32_q8_portable
 * per row: acc = fma(sum(u q), dw * da, acc), then fma(m', s, acc) */
INL void b32_group_arm(b32_kind k, bool dp, bool split, const uint8_t *g, const kvg_qact *a, int t, const int nt,
                       float *out, size_t os) {
    const int n = a->n, nb = n / KVG_QB, run = kg_run_b32(k);
    const size_t qbytes = k == B_Q8_0 ? 512 : b32_has_qh(k) ? 320 : 256;
    const bool signed128 = k == B_Q8_0 || k == B_IQ4_NL; /* v = u - 128 multiplied */
    float32x4_t acc[4][KVG_GROUP_TILE]; /* quarter r, token i */
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < nt; i++) acc[r][i] = vdupq_n_f32(0.0f);
    for (int b0 = 0; b0 < nb; b0 += 8) /* runs of 8 blocks, a quarter at a time */
        for (int r = 0; r < 4; r++) {
            float32x4_t ac[KVG_GROUP_TILE]; /* the quarter's accumulators, in registers for the run */
            for (int i = 0; i < nt; i++) ac[i] = acc[r][i];
            for (int b = b0; b < nb && b < b0 + 8; b++) {
                const uint8_t *blk = g + b32_group_block(k) * (size_t)b;
                int8x16_t w[8];
                b32_group_levels_arm(k, blk + 16 * (size_t)r, w);
                float32x4_t dw = f16x4(blk + qbytes + 8 * (size_t)r);
                float32x4_t mw = b32_has_min(k) ? f16x4(blk + qbytes + 32 + 8 * (size_t)r)
                                                : vmulq_f32(dw, vdupq_n_f32((float)-b32_uoffset(k)));
                for (int i = 0; i < nt; i++) {
                    size_t row = (size_t)(t + i), at = row * (size_t)n + (size_t)KVG_QB * b;
                    const int8_t *qv = a->q8 + at, *hv = split ? a->q8h + at : NULL;
                    int32x4_t isum = kg_dot_act_arm(dp, w, qv, hv, 8, run);
                    if (signed128) { /* + 128 sum(q) */
                        int32_t qs = vaddlvq_s8(vld1q_s8(qv)) + vaddlvq_s8(vld1q_s8(qv + 16));
                        if (split) qs += 256 * (vaddlvq_s8(vld1q_s8(hv)) + vaddlvq_s8(vld1q_s8(hv + 16)));
                        isum = vaddq_s32(isum, vdupq_n_s32(128 * qs));
                    }
                    ac[i] = vfmaq_f32(ac[i], vcvtq_f32_s32(isum), vmulq_f32(dw, vdupq_n_f32(a->d8[row * nb + b])));
                    ac[i] = vfmaq_f32(ac[i], mw, vdupq_n_f32(a->s8[row * nb + b]));
                }
            }
            for (int i = 0; i < nt; i++) acc[r][i] = ac[i];
        }
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < nt; i++) vst1q_f32(out + (size_t)i * os + 4 * (size_t)r, acc[r][i]);
}

/* one group kernel per type, path and activation form: the tile width nt made a constant for
 * each case, so the loops over tokens unroll */
#define ARM_GROUP_KERNEL(name, target, body, kind, dp, split)                                           \
    target void kvg_qdot_##name(const uint8_t *g, const kvg_qact *a, int t, int nt, float *out, size_t os) { \
        switch (nt) {                                                                                  \
        case 1: body(kind, dp, split, g, a, t, 1, out, os); break;                                     \
        case 2: body(kind, dp, split, g, a, t, 2, out, os); break;                                     \
        case 3: body(kind, dp, split, g, a, t, 3, out, os); break;                                     \
        case 4: body(kind, dp, split, g, a, t, 4, out, os); break;                                     \
        case 5: body(kind, dp, split, g, a, t, 5, out, os); break;                                     \
        case 6: body(kind, dp, split, g, a, t, 6, out, os); break;                                     \
        case 7: body(kind, dp, split, g, a, t, 7, out, os); break;                                     \
        default: body(kind, dp, split, g, a, t, 8, out, os); break;                                    \
        }                                                                                              \
    }
/* nv, ns: neon (8-bit, split activations); dv, ds: dotprod */
#define ARM_GROUP_KERNELS(t, body, kind)                                 \
    ARM_GROUP_KERNEL(nv_##t, NEON_TARGET, body, kind, false, false)      \
    ARM_GROUP_KERNEL(ns_##t, NEON_TARGET, body, kind, false, true)       \
    ARM_GROUP_KERNEL(dv_##t, DOTPROD, body, kind, true, false)           \
    ARM_GROUP_KERNEL(ds_##t, DOTPROD, body, kind, true, true)
ARM_GROUP_KERNELS(q4_0, b32_group_arm, B_Q4_0)
ARM_GROUP_KERNELS(q4_1, b32_group_arm, B_Q4_1)
ARM_GROUP_KERNELS(q5_0, b32_group_arm, B_Q5_0)
ARM_GROUP_KERNELS(q5_1, b32_group_arm, B_Q5_1)
ARM_GROUP_KERNELS(q8_0, b32_group_arm, B_Q8_0)
ARM_GROUP_KERNELS(iq4_nl, b32_group_arm, B_IQ4_NL)
ARM_GROUP_KERNELS(q2_k, kq_group_arm, K_Q2)
ARM_GROUP_KERNELS(q3_k, kq_group_arm, K_Q3)
ARM_GROUP_KERNELS(q4_k, kq_group_arm, K_Q4)
ARM_GROUP_KERNELS(q5_k, kq_group_arm, K_Q5)
ARM_GROUP_KERNELS(q6_k, kq_group_arm, K_Q6)
ARM_GROUP_KERNELS(iq4_xs, kq_group_arm, K_IQ4XS)

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

void kvg_qdot_quant_qb_neon(const float *x, int n, int16_t *q, float *d, float *s) {
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

void kvg_qdot_quant_qk_neon(const float *x, int n, int16_t *q, float *d, int32_t *bsum) {
    for (int b = 0; b < n / KVG_QK; b++) {
        const float *xb = x + KVG_QK * b;
        float amax = amax_neon(xb, KVG_QK);
        float id = amax > 0.0f ? (float)KVG_QK_LEVELS / amax : 0.0f;
        d[b] = amax / (float)KVG_QK_LEVELS;
        for (int j = 0; j < 16; j++)
            bsum[16 * b + j] = q16x16_neon(xb + 16 * j, id, (float)KVG_QK_LEVELS, q + KVG_QK * b + 16 * j);
    }
}

/* quant_q8_portable's bytes: q as q16x16_neon's (the same bound), lo its low byte (signed), hi
 * (q - lo) / 256 */
void kvg_qdot_quant_q8_neon(const float *x, int n, int8_t *lo, int8_t *hi, float *d, float *s) {
    const int levels = hi ? KVG_QS_LEVELS : KVG_Q8_LEVELS;
    for (int b = 0; b < n / KVG_QB; b++) {
        const float *xb = x + KVG_QB * b;
        float amax = amax_neon(xb, KVG_QB);
        float id = amax > 0.0f ? (float)levels / amax : 0.0f;
        d[b] = amax / (float)levels;
        int16_t q[KVG_QB];
        int32_t sum = q16x16_neon(xb, id, (float)levels, q) + q16x16_neon(xb + 16, id, (float)levels, q + 16);
        s[b] = d[b] * (float)sum;
        for (int h = 0; h < KVG_QB; h += 8) {
            int16x8_t v = vld1q_s16(q + h);
            int8x8_t l = vmovn_s16(v);
            vst1_s8(lo + KVG_QB * b + h, l);
            if (hi) vst1_s8(hi + KVG_QB * b + h, vmovn_s16(vshrq_n_s16(vsubq_s16(v, vmovl_s8(l)), 8)));
        }
    }
}
#endif /* KVG_ARM */
