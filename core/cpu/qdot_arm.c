/* qdot_arm.c: the AArch64 kernels: Advanced SIMD (neon, the AArch64 baseline) and the ARMv8.2
 * dot product (dotprod, its own function target), and the activations' quantization with neon
 * (layouts: qdot_internal.h). Empty on other machines. */
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
#endif /* KVG_ARM */
