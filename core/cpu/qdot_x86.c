/* qdot_x86.c: the x86-64 kernels: AVX2 + FMA + F16C, AVX-512 (F, BW, VL, DQ; vpdpwssd with
 * VNNI), the avx512vnni path's row groups, the K types' row groups of AVX2, and the
 * activations' quantization with AVX2 and AVX-512 (layouts: qdot_internal.h). Each function
 * carries its own target attribute, so the file needs no -m flag; it is empty on other machines.
 * (Over 1,000 lines: one instruction set family whose paths share their inline helpers; split by
 * path, each file would repeat them.) */
#include <string.h>
#include "qdot_internal.h"

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
    target void kvg_qdot_##name(const uint8_t *w, const kvg_qact *a, int t, int nt, float *out, size_t os) { \
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

AVX2 void kvg_qdot_quant_qb_avx2(const float *x, int n, int16_t *q, float *d, float *s) {
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

AVX2 void kvg_qdot_quant_qk_avx2(const float *x, int n, int16_t *q, float *d, int32_t *bsum) {
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

/* the sum of v's 16 lanes as _mm512_reduce_add_ps adds them (gcc's and clang's): lane j with
 * j + 8, then k with k + 4, then 0 with 2 and 1 with 3, then those two */
AVX512 INL float hsum512(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    __m128 p = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));
}

/* hsum512 of 16 vectors at once, the same tree for each: lane 4 (s % 4) + s / 4 of the result is
 * hsum512(v[s]) */
AVX512 INL __m512 hsum512x16(const __m512 *v) {
    __m512 u[8], z[4], y[2];
    for (int m = 0; m < 8; m++) /* lanes 0-7: v[2m]'s j + (j + 8); 8-15: v[2m + 1]'s */
        u[m] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], 0xee));
    for (int m = 0; m < 4; m++) /* 128-bit block c: v[4m + c]'s k + (k + 4) */
        z[m] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * m], u[2 * m + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * m], u[2 * m + 1], 0xdd));
    for (int m = 0; m < 2; m++) /* block c: v[8m + c]'s 0 + 2 and 1 + 3, then v[8m + 4 + c]'s */
        y[m] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * m], z[2 * m + 1], 0x44),
                             _mm512_shuffle_ps(z[2 * m], z[2 * m + 1], 0xee));
    return _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xdd));
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
        float s = hsum512(acc[r]);
        for (int e = i; e < n; e++) s += fl_scalar_avx2(k, w, e) * x[e];
        out[r * os] = s;
    }
}

/* ---- avx512: the float types in groups of 16 rows ----------------------------------------------
 * A group is its 16 rows one after another (fl_group_pack). The kernel takes them 4 rows by up
 * to 4 tokens at a time: each 16 elements, 4 rows' vectors times 4 tokens' into 16 accumulators
 * (4 weight and 4 activation loads for 16 FMAs, against 5 loads for 4 in the row kernel), and
 * the 16 accumulators are summed together (hsum512x16) instead of one by one. Each (row,
 * token) accumulator takes the row kernel's products in its order and is summed by its tree,
 * so a group gives fl_avx512's bits. Each weight row read asks the cache for the bytes
 * FL_GROUP_PREFETCH further on, where the next rows of the group and then the next group lie:
 * the rows are read 4 at a time, short streams the hardware's prefetchers hardly start on, and a
 * matrix used once per call (an encoder's product of a few dozen tokens) comes from memory. */
#define FL_GROUP_PREFETCH 8192
AVX512 INL void fl_group_block512(fl_kind k, const uint8_t *g, size_t rb, const kvg_qact *a, int t, const int T,
                                  float *out, size_t os) {
    const int n = a->n;
    __m512 acc[16]; /* acc[4 r + j]: row r, token j */
    for (int s = 0; s < 16; s++) acc[s] = _mm512_setzero_ps();
    const size_t esize = k == F_F32 ? 4 : 2;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x[4];
        for (int j = 0; j < T; j++) x[j] = _mm512_loadu_ps(a->x + (size_t)(t + j) * n + i);
        for (int r = 0; r < 4; r++) {
            _mm_prefetch((const char *)(g + (size_t)r * rb + esize * (size_t)i + FL_GROUP_PREFETCH), _MM_HINT_T0);
            __m512 wv = fl_load512(k, g + (size_t)r * rb, i);
            for (int j = 0; j < T; j++) acc[4 * r + j] = _mm512_fmadd_ps(wv, x[j], acc[4 * r + j]);
        }
    }
    float sums[16]; /* lane 4 j + r: row r, token j */
    _mm512_storeu_ps(sums, hsum512x16(acc));
    for (int j = 0; j < T; j++) {
        const float *x = a->x + (size_t)(t + j) * n;
        for (int r = 0; r < 4; r++) {
            float s = sums[4 * j + r];
            for (int e = i; e < n; e++) s += fl_scalar_avx2(k, g + (size_t)r * rb, e) * x[e];
            out[(size_t)j * os + (size_t)r] = s;
        }
    }
}

AVX512 INL void fl_group512(fl_kind k, const uint8_t *g, const kvg_qact *a, int t, int nt, float *out, size_t os) {
    size_t rb = (size_t)a->n * (k == F_F32 ? 4 : 2);
    for (int r0 = 0; r0 < KVG_QDOT_GROUP; r0 += 4)
        for (int j = 0; j < nt; j += 4) {
            const uint8_t *w = g + (size_t)r0 * rb;
            float *o = out + (size_t)j * os + (size_t)r0;
            switch (nt - j) {
            case 1: fl_group_block512(k, w, rb, a, t + j, 1, o, os); break;
            case 2: fl_group_block512(k, w, rb, a, t + j, 2, o, os); break;
            case 3: fl_group_block512(k, w, rb, a, t + j, 3, o, os); break;
            default: fl_group_block512(k, w, rb, a, t + j, 4, o, os); break;
            }
        }
}

/* 16 rows of n elements of esize bytes, row_bytes apart, one after another */
static void fl_group_pack(size_t esize, const uint8_t *src, size_t row_bytes, uint8_t *dst, int n) {
    for (int r = 0; r < KVG_QDOT_GROUP; r++)
        memcpy(dst + (size_t)r * esize * (size_t)n, src + (size_t)r * row_bytes, esize * (size_t)n);
}

#define FL_GROUP512(t, kind, esize)                                                                        \
    AVX512 void kvg_qdot_g5_##t(const uint8_t *g, const kvg_qact *a, int t0, int nt, float *out, size_t os) { \
        fl_group512(kind, g, a, t0, nt, out, os);                                                          \
    }                                                                                                      \
    void kvg_qdot_g_##t(const uint8_t *src, size_t row_bytes, uint8_t *dst, int n) {                        \
        fl_group_pack(esize, src, row_bytes, dst, n);                                                      \
    }                                                                                                      \
    size_t kvg_qdot_gb_##t(int n) { return (size_t)KVG_QDOT_GROUP * (esize) * (size_t)n; }
FL_GROUP512(f32, F_F32, 4)
FL_GROUP512(f16, F_F16, 2)
FL_GROUP512(bf16, F_BF16, 2)

#define TILED_KERNEL512(name, body, kind, vnni)                                                        \
    AVX512 void kvg_qdot_##name(const uint8_t *w, const kvg_qact *a, int t, int nt, float *out, size_t os) { \
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
/* the K groups' distance (1B shape, Q4_K_M mix, 2 threads, decode tok/s in three rounds, when
 * only the quants were asked for, before kg_prefetch below: 1 KiB 25-27, 4 KiB 32-34.5, 8 KiB
 * 34.2-35.1, 16 KiB 33.5-35.3) */
#define KVG_K_GROUP_PREFETCH 8192
/* the j-th eighth of K block sb's bytes, KVG_K_GROUP_PREFETCH ahead, so that every line of the
 * stream is asked for, the scales' with the quants'. Asking only for the quants left a gap of
 * 256-288 bytes per K block to wait on memory: the Q6_K group streamed 15 GB/s on one thread
 * (Q4_K 21), 25 with every line asked for, and the 1B Q4_K_M mix decodes ~25% faster. Always
 * inlined: as a plain static inline gcc 12 dropped its prefetches from the target kernels. */
INL void kg_prefetch(kq_kind k, const uint8_t *sb, int j) {
    const size_t bytes = kg_block(k);
    for (size_t o = bytes * (size_t)j / 8; o < bytes * (size_t)(j + 1) / 8; o += 64)
        _mm_prefetch((const char *)(sb + KVG_K_GROUP_PREFETCH + o), _MM_HINT_T0);
}
#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

/* vpdpbusd of w's unsigned bytes with the 4 signed activation bytes at p broadcast to every lane,
 * the broadcast folded into the instruction ({1to16}): one micro-fused instruction per product,
 * where gcc makes a vpbroadcastd and a vpdpbusd of the intrinsics (clang folds them itself) */
typedef struct {
    int8_t b[4];
} vnni_b4; /* 4 bytes at any alignment, for the asm's memory operand */
VNNI INL __m512i dpbusd_b4(__m512i acc, __m512i w, const int8_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const vnni_b4 *)p));
    return acc;
}

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
        /* unrolled, so that each token's accumulator stays in a register (gcc otherwise keeps
         * a tile of 8's on the stack) */
#pragma GCC unroll 8
        for (int i = 0; i < nt; i++) {
            size_t row = (size_t)(t + i), at = row * (size_t)n + (size_t)KVG_QB * b;
            const int8_t *qv = a->q8 + at; /* 4 bytes broadcast from memory per product */
            __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
            for (int j = 0; j < 8; j += 2) {
                s0 = dpbusd_b4(s0, w[j], qv + 4 * j);
                s1 = dpbusd_b4(s1, w[j + 1], qv + 4 * j + 4);
            }
            __m512i isum = _mm512_add_epi32(s0, s1);
            if (split) { /* sum(u q) = 256 sum(u hi) + sum(u lo) */
                const int8_t *hv = a->q8h + at;
                __m512i h0 = _mm512_setzero_si512(), h1 = _mm512_setzero_si512();
                for (int j = 0; j < 8; j += 2) {
                    h0 = dpbusd_b4(h0, w[j], hv + 4 * j);
                    h1 = dpbusd_b4(h1, w[j + 1], hv + 4 * j + 4);
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
VNNI void kvg_qdot_quant_q8_avx512(const float *x, int n, int8_t *lo, int8_t *hi, float *d, float *s, int32_t *b16) {
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
        b16[2 * b] = _mm512_reduce_add_epi32(q0);
        b16[2 * b + 1] = _mm512_reduce_add_epi32(q1);
        s[b] = d[b] * (float)(b16[2 * b] + b16[2 * b + 1]);
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
#define TILE_KERNEL(name, target, body, kind, split)                                                   \
    target void kvg_qdot_##name(const uint8_t *g, const kvg_qact *a, int t, int nt, float *out, size_t os) { \
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
#define GROUP_KERNEL(name, kind, split) TILE_KERNEL(name, VNNI, b32_group_vnni, kind, split)
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
        default: d = f16x16(hdr + 192), dmin = f16x16(hdr + 224); break;
        }
        for (int j = 0; j < 8; j++) {
            const uint8_t *blk = sb + kg_qblock(k) * (size_t)j;
            kg_prefetch(k, sb, j);
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
            default: {
                __m512i x = bytes32(hdr + 16 * j); /* the scale, the min's high bits above it */
                sc[0] = _mm512_and_si512(x, _mm512_set1_epi32(63));
                mn[0] = _mm512_or_si512(field32(bytes32(hdr + 128 + 16 * (j / 2)), 4 * (j % 2), 15),
                                        _mm512_and_si512(_mm512_srli_epi32(x, 2), _mm512_set1_epi32(48)));
                break;
            }
            }
            __m512 dw[2], mw[2];
            for (int h = 0; h < (per16 ? 2 : 1); h++) {
                dw[h] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc[h]));
                mw[h] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn[h]));
            }
            /* unrolled: each token's accumulator in a register (as b32_group_vnni) */
#pragma GCC unroll 8
            for (int i = 0; i < nt; i++) {
                size_t row = (size_t)(t + i), at = row * (size_t)n + (size_t)KVG_QK * b + 32 * (size_t)j;
                size_t bi = row * (size_t)n32 + 8 * (size_t)b + (size_t)j;
                const int8_t *qv = a->q8 + at;
                __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
                for (int c = 0; c < 4; c++) {
                    s0 = dpbusd_b4(s0, w[c], qv + 4 * c);
                    s1 = dpbusd_b4(s1, w[c + 4], qv + 16 + 4 * c);
                }
                if (split) { /* sum(u q) = 256 sum(u hi) + sum(u lo) */
                    const int8_t *hv = a->q8h + at;
                    __m512i h0 = _mm512_setzero_si512(), h1 = _mm512_setzero_si512();
                    for (int c = 0; c < 4; c++) {
                        h0 = dpbusd_b4(h0, w[c], hv + 4 * c);
                        h1 = dpbusd_b4(h1, w[c + 4], hv + 16 + 4 * c);
                    }
                    s0 = _mm512_add_epi32(s0, _mm512_slli_epi32(h0, 8));
                    s1 = _mm512_add_epi32(s1, _mm512_slli_epi32(h1, 8));
                }
                int32_t q0 = 0, q1 = 0; /* the halves' sums of q, where an offset or a min needs them */
                if (off || (has_min && per16)) q0 = a->b8[2 * bi], q1 = a->b8[2 * bi + 1];
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

#define K_GROUP_KERNEL(name, kind, split) TILE_KERNEL(name, VNNI, kq_group_vnni, kind, split)
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

/* ================================================================================================
 * AVX2 row groups of the K types (the avx2, avx512 and avxvnni paths): the groups of
 * kq_group_pack, each chunk of 64 bytes read as two halves of 8 rows (rows 8h..8h+7 in bytes
 * 32h..32h+31), against the byte activations of the avx512vnni groups. AVX2 has no vpdpbusd: vpmaddubsw multiplies the
 * unsigned levels with the 4 activation bytes broadcast to every lane and adds pairs into int16
 * (saturating), vpmaddwd by ones adds those into the lane's int32. A pair is at most 2 * 128 *
 * umax, umax the largest level (Q2_K 3, Q3_K 7, Q4_K 15, Q5_K 31, Q6_K 63), so that cannot
 * saturate, and the pairs of `run` chunks (kg_run16) are added in int16 first without leaving it;
 * the integer sums are exact, so each lane gets the bits of the avx512vnni group and of the
 * portable row kernel. IQ4_XS's levels + 128 reach 241 (a pair 61 696): there each level is
 * taken as two nibbles, 16 hi + lo, and each nibble dotted as Q4_K's levels (split_nibbles,
 * dot_levels_avx2), two products where the narrower types take one (the avx2 tables take that
 * with 8-bit activations only, qdot_tables.c). The avxvnni path
 * (AVX-VNNI, 256-bit) runs the same kernels with vpdpbusd in place of the two instructions (no
 * int16 step, whole levels).
 * ================================================================================================ */

/* chunks whose int16 pair sums add up without overflow: 32767 / (256 umax) (IQ4_XS: of its
 * nibbles) */
INL int kg_run16(kq_kind k) {
    switch (k) {
    case K_Q2:
    case K_Q3:
    case K_Q4:
    case K_IQ4XS: return 8;
    case K_Q5: return 4;
    default: return 2; /* Q6_K */
    }
}
/* bit `from` of each byte of h moved to bit `to` (as move_bit) */
AVX2 INL __m256i move_bit8(__m256i h, int from, int to, int width) {
    __m256i m = _mm256_set1_epi8((char)(((1 << width) - 1) << to));
    __m256i x = from > to ? _mm256_srl_epi16(h, _mm_cvtsi32_si128(from - to))
                          : _mm256_sll_epi16(h, _mm_cvtsi32_si128(to - from));
    return _mm256_and_si256(x, m);
}
AVX2 INL __m256i ld256(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
/* the 8 bytes at p as dwords */
AVX2 INL __m256i bytes8u(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
AVX2 INL __m256i field8(__m256i x, int n, int mask) {
    return _mm256_and_si256(_mm256_srl_epi32(x, _mm_cvtsi32_si128(n)), _mm256_set1_epi32(mask));
}
AVX2 INL __m256 f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* the unsigned levels of half h of a block of 32 (p: the block + 32 h), as kq_group_levels */
AVX2 INL void kq_group_levels_avx2(kq_kind k, const uint8_t *p, __m256i iq4, __m256i *w) {
    if (kg_2bit(k)) {
        for (int q = 0; q < 2; q++) {
            __m256i x = ld256(p + 64 * q);
            for (int c = 0; c < 4; c++) w[4 * q + c] = move_bit8(x, 2 * c, 0, 2);
        }
        if (k == K_Q3) {
            __m256i h = ld256(p + 128);
            for (int j = 0; j < 8; j++) w[j] = _mm256_or_si256(w[j], move_bit8(h, j, 2, 1));
        }
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int c = 0; c < 4; c++) {
        __m256i x = ld256(p + 64 * c);
        w[c] = _mm256_and_si256(x, m4);
        w[c + 4] = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
    }
    if (k == K_IQ4XS)
        for (int j = 0; j < 8; j++) w[j] = _mm256_shuffle_epi8(iq4, w[j]);
    if (k == K_Q5) {
        __m256i h = ld256(p + 256);
        for (int j = 0; j < 8; j++) w[j] = _mm256_or_si256(w[j], move_bit8(h, j, 4, 1));
    }
    if (k == K_Q6)
        for (int q = 0; q < 2; q++) {
            __m256i h = ld256(p + 256 + 64 * q);
            for (int c = 0; c < 4; c++) w[4 * q + c] = _mm256_or_si256(w[4 * q + c], move_bit8(h, 2 * c, 4, 2));
        }
}

/* AVX-VNNI's vpdpbusd on ymm registers (the VEX form): acc + per lane the sum of the 4 products
 * of u's unsigned bytes with s's signed ones. Written as an instruction so that one kernel body
 * serves the avx2 and avxvnni paths (an intrinsic would need the avxvnni target in the body).
 * A test build with KVG_AVXVNNI_EVEX (cmake -DKVGEN_TEST_AVXVNNI_EVEX=ON) issues the same
 * operation in AVX-512 VNNI's EVEX encoding on the same ymm registers, and cpu_features.c then
 * offers the path where AVX-512 VNNI and VL are, so that its kernels run on such CPUs too. */
AVX2 INL __m256i dpbusd256(__m256i acc, __m256i u, __m256i s) {
#if KVG_AVXVNNI_EVEX
    __asm__("%{evex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
#else
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
#endif
    return acc;
}
/* per lane, sum over chunks c < nc of w[c]'s 4 levels times the bytes q + 4c: vpdpbusd's sum
 * (vnni), else vpmaddubsw's int16 pairs added `run` chunks at a time and widened by vpmaddwd */
AVX2 INL __m256i kg_dot_avx2(bool vnni, const __m256i *w, const int8_t *q, int nc, int run) {
    const __m256i one = _mm256_set1_epi16(1);
    __m256i s = _mm256_setzero_si256(), p = _mm256_setzero_si256();
    for (int c = 0; c < nc; c++) {
        int32_t v;
        memcpy(&v, q + 4 * c, 4);
        if (vnni) {
            s = dpbusd256(s, w[c], _mm256_set1_epi32(v));
            continue;
        }
        __m256i x = _mm256_maddubs_epi16(w[c], _mm256_set1_epi32(v));
        p = c % run == 0 ? x : _mm256_add_epi16(p, x);
        if (c % run == run - 1 || c == nc - 1) s = _mm256_add_epi32(s, _mm256_madd_epi16(p, one));
    }
    return s;
}
/* the same for the 8-bit or split activations at q (hi: the split form's high bytes, or NULL) */
AVX2 INL __m256i kg_dot_act_avx2(bool vnni, const __m256i *w, const int8_t *q, const int8_t *hi, int nc, int run) {
    __m256i s = kg_dot_avx2(vnni, w, q, nc, run);
    if (hi) s = _mm256_add_epi32(s, _mm256_slli_epi32(kg_dot_avx2(vnni, w, hi, nc, run), 8)); /* 256 sum(u hi) */
    return s;
}
/* levels up to 255 for vpmaddubsw: w[j] keeps each byte's low nibble, wh[j] gets its high one
 * (the level is 16 wh + w) */
AVX2 INL void split_nibbles(__m256i *w, __m256i *wh) {
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int j = 0; j < 8; j++) {
        wh[j] = _mm256_and_si256(_mm256_srli_epi16(w[j], 4), m4);
        w[j] = _mm256_and_si256(w[j], m4);
    }
}
/* kg_dot_act_avx2 of whole levels (wh NULL), or of levels split by split_nibbles: the low
 * nibbles' sum plus 16 times the high ones', exact in int32 */
AVX2 INL __m256i dot_levels_avx2(bool vnni, const __m256i *w, const __m256i *wh, const int8_t *q, const int8_t *hi,
                                 int nc, int run) {
    __m256i s = kg_dot_act_avx2(vnni, w, q, hi, nc, run);
    if (wh) s = _mm256_add_epi32(s, _mm256_slli_epi32(kg_dot_act_avx2(vnni, wh, q, hi, nc, run), 4));
    return s;
}

/* K blocks of a group against a tile of tokens, in the order of kq_group_vnni per row: per block
 * of 32 and half of the group, the levels decoded once and the 8 rows' scales formed, then each
 * token's sums scale them. */
AVX2 INL void kq_group_avx2(bool vnni, kq_kind k, bool split, const uint8_t *g, const kvg_qact *a, int t,
                            const int nt, float *out, size_t os) {
    const int n = a->n, nb = n / KVG_QK, n32 = n / KVG_QB, off = kg_uoffset(k), run = kg_run16(k);
    const bool per16 = kg_per16(k), has_min = kq_has_min(k), wide = !vnni && k == K_IQ4XS;
    int8_t lv[16];
    for (int i = 0; i < 16; i++) lv[i] = (int8_t)(IQ4_LEVELS[i] + 128);
    const __m256i iq4 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lv));
    __m256 acc[KVG_GROUP_TILE][2];
    for (int i = 0; i < nt; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *sb = g + kg_block(k) * (size_t)b, *hdr = sb + 8 * kg_qblock(k);
        __m256 d[2], dmin[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        __m256i high[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int h = 0; h < 2; h++) switch (k) {
            case K_Q2: d[h] = f16x8(hdr + 256 + 16 * h), dmin[h] = f16x8(hdr + 288 + 16 * h); break;
            case K_Q3: d[h] = f16x8(hdr + 192 + 16 * h), high[h] = ld256(hdr + 128 + 32 * h); break;
            case K_Q6: d[h] = f16x8(hdr + 256 + 16 * h); break;
            case K_IQ4XS:
                d[h] = f16x8(hdr + 96 + 16 * h);
                high[h] = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(hdr + 64 + 16 * h)));
                break;
            default: d[h] = f16x8(hdr + 192 + 16 * h), dmin[h] = f16x8(hdr + 224 + 16 * h); break; /* Q4_K, Q5_K */
            }
        for (int j = 0; j < 8; j++) {
            const uint8_t *blk = sb + kg_qblock(k) * (size_t)j;
            kg_prefetch(k, sb, j);
            int32_t qs0[KVG_GROUP_TILE], qs1[KVG_GROUP_TILE]; /* the halves' sums of q, where needed */
            for (int i = 0; i < nt; i++) {
                qs0[i] = qs1[i] = 0;
                if (off || (has_min && per16)) {
                    size_t bi = (size_t)(t + i) * (size_t)n32 + 8 * (size_t)b + (size_t)j;
                    qs0[i] = a->b8[2 * bi];
                    qs1[i] = a->b8[2 * bi + 1];
                }
            }
            for (int h = 0; h < 2; h++) {
                __m256i w[8], wh[8], *whp = wide ? wh : NULL;
                kq_group_levels_avx2(k, blk + 32 * h, iq4, w);
                if (wide) split_nibbles(w, wh);
                __m256i sc[2], mn[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
                switch (k) {
                case K_Q2:
                    for (int e = 0; e < 2; e++) {
                        __m256i x = bytes8u(hdr + 16 * (2 * j + e) + 8 * h);
                        sc[e] = _mm256_and_si256(x, _mm256_set1_epi32(15));
                        mn[e] = _mm256_srli_epi32(x, 4);
                    }
                    break;
                case K_Q3:
                    for (int e = 0; e < 2; e++) {
                        __m256i lo = field8(bytes8u(hdr + 16 * j + 8 * h), 4 * e, 15);
                        sc[e] = _mm256_or_si256(lo, _mm256_slli_epi32(field8(high[h], 2 * (2 * j + e), 3), 4));
                        sc[e] = _mm256_sub_epi32(sc[e], _mm256_set1_epi32(32));
                    }
                    break;
                case K_Q6:
                    for (int e = 0; e < 2; e++)
                        sc[e] = _mm256_cvtepi8_epi32(
                            _mm_loadl_epi64((const __m128i *)(hdr + 16 * (2 * j + e) + 8 * h)));
                    break;
                case K_IQ4XS:
                    sc[0] = field8(bytes8u(hdr + 16 * (j / 2) + 8 * h), 4 * (j % 2), 15);
                    sc[0] = _mm256_or_si256(sc[0], _mm256_slli_epi32(field8(high[h], 2 * j, 3), 4));
                    sc[0] = _mm256_sub_epi32(sc[0], _mm256_set1_epi32(32));
                    break;
                default: {
                    __m256i x = bytes8u(hdr + 16 * j + 8 * h); /* the scale, the min's high bits above it */
                    sc[0] = _mm256_and_si256(x, _mm256_set1_epi32(63));
                    mn[0] = _mm256_or_si256(field8(bytes8u(hdr + 128 + 16 * (j / 2) + 8 * h), 4 * (j % 2), 15),
                                            _mm256_and_si256(_mm256_srli_epi32(x, 2), _mm256_set1_epi32(48)));
                    break;
                }
                }
                __m256 dw[2], mw[2];
                for (int e = 0; e < (per16 ? 2 : 1); e++) {
                    dw[e] = _mm256_mul_ps(d[h], _mm256_cvtepi32_ps(sc[e]));
                    mw[e] = _mm256_mul_ps(dmin[h], _mm256_cvtepi32_ps(mn[e]));
                }
                for (int i = 0; i < nt; i++) {
                    size_t row = (size_t)(t + i), at = row * (size_t)n + (size_t)KVG_QK * b + 32 * (size_t)j;
                    size_t bi = row * (size_t)n32 + 8 * (size_t)b + (size_t)j;
                    const int8_t *qv = a->q8 + at, *hv = split ? a->q8h + at : NULL;
                    float daf = a->d8[bi];
                    __m256 da = _mm256_set1_ps(daf), ac = acc[i][h];
                    if (per16) { /* sum(v q) = sum(u q) - offset sum(q), per half */
                        __m256i s0 = dot_levels_avx2(vnni, w, whp, qv, hv, 4, run);
                        __m256i s1 = dot_levels_avx2(vnni, w + 4, whp ? whp + 4 : NULL, qv + 16, hv ? hv + 16 : NULL, 4,
                                                     run);
                        s0 = _mm256_sub_epi32(s0, _mm256_set1_epi32(off * qs0[i]));
                        s1 = _mm256_sub_epi32(s1, _mm256_set1_epi32(off * qs1[i]));
                        ac = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_mul_ps(dw[0], da), ac);
                        if (has_min) ac = _mm256_fnmadd_ps(mw[0], _mm256_set1_ps(daf * (float)qs0[i]), ac);
                        ac = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_mul_ps(dw[1], da), ac);
                        if (has_min) ac = _mm256_fnmadd_ps(mw[1], _mm256_set1_ps(daf * (float)qs1[i]), ac);
                    } else {
                        __m256i s = dot_levels_avx2(vnni, w, whp, qv, hv, 8, run);
                        s = _mm256_sub_epi32(s, _mm256_set1_epi32(off * (qs0[i] + qs1[i])));
                        ac = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[0], da), ac);
                        if (has_min) ac = _mm256_fnmadd_ps(mw[0], _mm256_set1_ps(a->s8[bi]), ac);
                    }
                    acc[i][h] = ac;
                }
            }
        }
    }
    for (int i = 0; i < nt; i++) {
        _mm256_storeu_ps(out + (size_t)i * os, acc[i][0]);
        _mm256_storeu_ps(out + (size_t)i * os + 8, acc[i][1]);
    }
}

/* The 32-element types' groups (b32_group_pack) on the avx2 and avxvnni paths: each chunk of 64
 * bytes read as two halves of 8 rows, as the K groups above, against the same byte activations,
 * one scale (and minimum) per block, in the order of b32_group_vnni: each lane gets the bits of
 * the avx512vnni group and of the portable row kernel. With vpmaddubsw (avx2) the int16 pairs
 * cannot saturate: Q4_0 and Q4_1 (levels up to 15, 8 chunks added in int16), Q5_0 and Q5_1 (up
 * to 31, 4 chunks); Q8_0's and IQ4_NL's levels + 128 reach 255 and 241, so there each level is
 * taken as two nibbles (split_nibbles, as IQ4_XS above; 8-bit activations only, qdot_tables.c).
 * avxvnni (vpdpbusd) takes whole levels. */
INL int b32_run16(b32_kind k) { return b32_has_qh(k) ? 4 : 8; }
INL bool b32_wide(b32_kind k) { return k == B_Q8_0 || k == B_IQ4_NL; }

AVX2 INL void b32_group_avx2(bool vnni, b32_kind k, bool split, const uint8_t *g, const kvg_qact *a, int t,
                             const int nt, float *out, size_t os) {
    const int n = a->n, nb = n / KVG_QB, run = b32_run16(k);
    const bool wide = !vnni && b32_wide(k);
    const size_t qbytes = k == B_Q8_0 ? 512 : b32_has_qh(k) ? 320 : 256;
    const __m256i m4 = _mm256_set1_epi8(15);
    int8_t lv[16];
    for (int i = 0; i < 16; i++) lv[i] = (int8_t)(IQ4_LEVELS[i] + 128);
    const __m256i iq4 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lv));
    __m256 acc[KVG_GROUP_TILE][2];
    for (int i = 0; i < nt; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = g + b32_group_block(k) * (size_t)b;
        for (size_t off = 0; off < b32_group_block(k); off += 64) /* a few blocks ahead, as b32_group_vnni */
            _mm_prefetch((const char *)(blk + KVG_GROUP_PREFETCH + off), _MM_HINT_T0);
        for (int h = 0; h < 2; h++) { /* rows 8h..8h+7 */
            __m256i w[8], wh[8], *whp = wide ? wh : NULL;
            if (k == B_Q8_0) {
                for (int j = 0; j < 8; j++) w[j] = ld256(blk + 64 * j + 32 * h);
            } else {
                for (int c = 0; c < 4; c++) {
                    __m256i x = ld256(blk + 64 * c + 32 * h);
                    w[c] = _mm256_and_si256(x, m4);
                    w[c + 4] = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
                }
                if (k == B_IQ4_NL)
                    for (int j = 0; j < 8; j++) w[j] = _mm256_shuffle_epi8(iq4, w[j]);
                if (b32_has_qh(k)) { /* chunk j's fifth bits: bit j of each byte of qh */
                    __m256i qh = ld256(blk + 256 + 32 * h);
                    for (int j = 0; j < 8; j++) w[j] = _mm256_or_si256(w[j], move_bit8(qh, j, 4, 1));
                }
            }
            if (wide) split_nibbles(w, wh);
            __m256 dw = f16x8(blk + qbytes + 16 * h);
            __m256 mw = b32_has_min(k) ? f16x8(blk + qbytes + 32 + 16 * h)
                                       : _mm256_mul_ps(dw, _mm256_set1_ps((float)-b32_uoffset(k)));
            for (int i = 0; i < nt; i++) {
                size_t row = (size_t)(t + i), at = row * (size_t)n + (size_t)KVG_QB * b;
                __m256i isum = dot_levels_avx2(vnni, w, whp, a->q8 + at, split ? a->q8h + at : NULL, 8, run);
                __m256 f = _mm256_cvtepi32_ps(isum);
                acc[i][h] = _mm256_fmadd_ps(f, _mm256_mul_ps(dw, _mm256_set1_ps(a->d8[row * nb + b])), acc[i][h]);
                acc[i][h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a->s8[row * nb + b]), acc[i][h]);
            }
        }
    }
    for (int i = 0; i < nt; i++) {
        _mm256_storeu_ps(out + (size_t)i * os, acc[i][0]);
        _mm256_storeu_ps(out + (size_t)i * os + 8, acc[i][1]);
    }
}

#define KQ_GROUP_AVX2(kind, split, ...) kq_group_avx2(false, kind, split, __VA_ARGS__)
#define KQ_GROUP_AVXVNNI(kind, split, ...) kq_group_avx2(true, kind, split, __VA_ARGS__)
#define K_GROUP_KERNEL_AVX2(name, kind, split) TILE_KERNEL(name, AVX2, KQ_GROUP_AVX2, kind, split)
#define K_GROUP_KERNEL_AVXVNNI(name, kind, split) TILE_KERNEL(name, AVX2, KQ_GROUP_AVXVNNI, kind, split)
K_GROUP_KERNEL_AVX2(av_q2_k, K_Q2, false)
K_GROUP_KERNEL_AVX2(av_q3_k, K_Q3, false)
K_GROUP_KERNEL_AVX2(av_q4_k, K_Q4, false)
K_GROUP_KERNEL_AVX2(av_q5_k, K_Q5, false)
K_GROUP_KERNEL_AVX2(av_q6_k, K_Q6, false)
K_GROUP_KERNEL_AVX2(av_iq4_xs, K_IQ4XS, false)
K_GROUP_KERNEL_AVX2(as_q2_k, K_Q2, true)
K_GROUP_KERNEL_AVX2(as_q3_k, K_Q3, true)
K_GROUP_KERNEL_AVX2(as_q4_k, K_Q4, true)
K_GROUP_KERNEL_AVX2(as_q5_k, K_Q5, true)
K_GROUP_KERNEL_AVX2(as_q6_k, K_Q6, true)
K_GROUP_KERNEL_AVXVNNI(yv_q2_k, K_Q2, false)
K_GROUP_KERNEL_AVXVNNI(yv_q3_k, K_Q3, false)
K_GROUP_KERNEL_AVXVNNI(yv_q4_k, K_Q4, false)
K_GROUP_KERNEL_AVXVNNI(yv_q5_k, K_Q5, false)
K_GROUP_KERNEL_AVXVNNI(yv_q6_k, K_Q6, false)
K_GROUP_KERNEL_AVXVNNI(yv_iq4_xs, K_IQ4XS, false)
K_GROUP_KERNEL_AVXVNNI(ys_q2_k, K_Q2, true)
K_GROUP_KERNEL_AVXVNNI(ys_q3_k, K_Q3, true)
K_GROUP_KERNEL_AVXVNNI(ys_q4_k, K_Q4, true)
K_GROUP_KERNEL_AVXVNNI(ys_q5_k, K_Q5, true)
K_GROUP_KERNEL_AVXVNNI(ys_q6_k, K_Q6, true)
K_GROUP_KERNEL_AVXVNNI(ys_iq4_xs, K_IQ4XS, true)
#define B32_GROUP_AVX2(kind, split, ...) b32_group_avx2(false, kind, split, __VA_ARGS__)
#define B32_GROUP_AVXVNNI(kind, split, ...) b32_group_avx2(true, kind, split, __VA_ARGS__)
#define B32_GROUP_KERNEL_AVX2(name, kind, split) TILE_KERNEL(name, AVX2, B32_GROUP_AVX2, kind, split)
#define B32_GROUP_KERNEL_AVXVNNI(name, kind, split) TILE_KERNEL(name, AVX2, B32_GROUP_AVXVNNI, kind, split)
B32_GROUP_KERNEL_AVX2(av_q4_0, B_Q4_0, false)
B32_GROUP_KERNEL_AVX2(av_q4_1, B_Q4_1, false)
B32_GROUP_KERNEL_AVX2(av_q5_0, B_Q5_0, false)
B32_GROUP_KERNEL_AVX2(av_q5_1, B_Q5_1, false)
B32_GROUP_KERNEL_AVX2(av_q8_0, B_Q8_0, false)
B32_GROUP_KERNEL_AVX2(av_iq4_nl, B_IQ4_NL, false)
B32_GROUP_KERNEL_AVX2(as_q4_0, B_Q4_0, true)
B32_GROUP_KERNEL_AVX2(as_q4_1, B_Q4_1, true)
B32_GROUP_KERNEL_AVX2(as_q5_0, B_Q5_0, true)
B32_GROUP_KERNEL_AVX2(as_q5_1, B_Q5_1, true)
B32_GROUP_KERNEL_AVXVNNI(yv_q4_0, B_Q4_0, false)
B32_GROUP_KERNEL_AVXVNNI(yv_q4_1, B_Q4_1, false)
B32_GROUP_KERNEL_AVXVNNI(yv_q5_0, B_Q5_0, false)
B32_GROUP_KERNEL_AVXVNNI(yv_q5_1, B_Q5_1, false)
B32_GROUP_KERNEL_AVXVNNI(yv_q8_0, B_Q8_0, false)
B32_GROUP_KERNEL_AVXVNNI(yv_iq4_nl, B_IQ4_NL, false)
B32_GROUP_KERNEL_AVXVNNI(ys_q4_0, B_Q4_0, true)
B32_GROUP_KERNEL_AVXVNNI(ys_q4_1, B_Q4_1, true)
B32_GROUP_KERNEL_AVXVNNI(ys_q5_0, B_Q5_0, true)
B32_GROUP_KERNEL_AVXVNNI(ys_q5_1, B_Q5_1, true)
B32_GROUP_KERNEL_AVXVNNI(ys_q8_0, B_Q8_0, true)
B32_GROUP_KERNEL_AVXVNNI(ys_iq4_nl, B_IQ4_NL, true)
#endif /* KVG_X86 */
