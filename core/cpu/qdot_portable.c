/* qdot_portable.c: the portable C kernels of every type (the reference of every other path's
 * bits), the 8-bit and split row kernels and the packing of the row groups (every path's with
 * groups), the 32-element types' repacking, and the activations' quantization in portable C
 * (layouts: qdot_internal.h). */
#include <math.h>
#include <string.h>
#include "qdot_internal.h"

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
    void kvg_qdot_##name(const uint8_t *w, const kvg_qact *a, int t, int nt, float *out, size_t os) {       \
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

void kvg_qdot_quant_qb_portable(const float *x, int n, int16_t *q, float *d, float *s) {
    for (int b = 0; b < n / KVG_QB; b++) {
        int32_t sum = q16_block_portable(x + KVG_QB * b, KVG_QB, KVG_QB_LEVELS, q + KVG_QB * b, &d[b]);
        s[b] = d[b] * (float)sum;
    }
}

void kvg_qdot_quant_qk_portable(const float *x, int n, int16_t *q, float *d, int32_t *bsum) {
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

/* ---- 8-bit activations and row groups (the 32-element types: avx512vnni, neon, dotprod) ----------
 * With int8 activations a block's products are those of unsigned weight levels u in [0, 255]
 * with signed bytes (the operands of VNNI's vpdpbusd): x = dw * u + m', where Q4_0 u = nibble,
 * m' = -8 dw; Q4_1 u = nibble, m' = its min; Q5_0 u = 5 bits, m' = -16 dw; Q5_1 u = 5 bits, m' =
 * its min; Q8_0 u = q + 128, m' = -128 dw; IQ4_NL u = its level + 128, m' = -128 dw. Per block,
 * in this order (fused multiply-adds, as the vector loop):
 *   acc = fma((float)sum(u q), dw * da, acc); acc = fma(m', s, acc)   with s = da * sum(q)
 * so the group kernel (one row per lane) gives these bits exactly (AArch64's multiplies Q8_0's
 * and IQ4_NL's u - 128 and adds 128 sum(q): the same integer). */

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
void kvg_qdot_quant_q8_portable(const float *x, int n, int8_t *lo, int8_t *hi, float *d, float *s) {
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

/* the tables of the paths with group kernels use these (x86-64 and AArch64) */
#define PORTABLE_KERNEL8(name, kind, split)                                                             \
    void kvg_qdot_##name(const uint8_t *w, const kvg_qact *a, int t, int nt, float *out, size_t os) {       \
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
    void kvg_qdot_##name(const uint8_t *src, size_t row_bytes, uint8_t *dst, int n) { \
        b32_group_pack(kind, src, row_bytes, dst, n);                                            \
    }                                                                                            \
    size_t kvg_qdot_##bytes_name(int n) { return b32_group_block(kind) * (size_t)(n / KVG_QB); }
GROUP_PACK(g_q4_0, gb_q4_0, B_Q4_0)
GROUP_PACK(g_q4_1, gb_q4_1, B_Q4_1)
GROUP_PACK(g_q5_0, gb_q5_0, B_Q5_0)
GROUP_PACK(g_q5_1, gb_q5_1, B_Q5_1)
GROUP_PACK(g_q8_0, gb_q8_0, B_Q8_0)
GROUP_PACK(g_iq4_nl, gb_iq4_nl, B_IQ4_NL)



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
                    hdr[16 * j + i] = (uint8_t)(s | (m >> 4) << 6);
                    hdr[128 + 16 * (j / 2) + i] |= (uint8_t)((m & 15) << (4 * (j % 2)));
                }
                put16(hdr + 192 + 2 * i, dh);
                put16(hdr + 224 + 2 * i, mh);
                break;
            }
        }
    }
}

#define K_GROUP_ROWS(t, kind)                                                                                 \
    void kvg_qdot_p8_##t(const uint8_t *w, const kvg_qact *a, int t0, int nt, float *out, \
                                               size_t os) {                                                   \
        kq_q8_portable(kind, false, w, a, t0, nt, out, os);                                                   \
    }                                                                                                         \
    void kvg_qdot_ps_##t(const uint8_t *w, const kvg_qact *a, int t0, int nt, float *out, \
                                               size_t os) {                                                   \
        kq_q8_portable(kind, true, w, a, t0, nt, out, os);                                                    \
    }                                                                                                         \
    void kvg_qdot_g_##t(const uint8_t *src, size_t row_bytes, uint8_t *dst, int n) {      \
        kq_group_pack(kind, src, row_bytes, dst, n);                                                          \
    }                                                                                                         \
    size_t kvg_qdot_gb_##t(int n) { return kg_block(kind) * (size_t)(n / KVG_QK); }
K_GROUP_ROWS(q2_k, K_Q2)
K_GROUP_ROWS(q3_k, K_Q3)
K_GROUP_ROWS(q4_k, K_Q4)
K_GROUP_ROWS(q5_k, K_Q5)
K_GROUP_ROWS(q6_k, K_Q6)
K_GROUP_ROWS(iq4_xs, K_IQ4XS)

#define REPACK(name, kind) \
    void kvg_qdot_##name(const uint8_t *src, uint8_t *dst, int n) { b32_repack(kind, src, dst, n); }
REPACK(r_q4_0, B_Q4_0)
REPACK(r_q4_1, B_Q4_1)
REPACK(r_q5_0, B_Q5_0)
REPACK(r_q5_1, B_Q5_1)
REPACK(r_q8_0, B_Q8_0)
REPACK(r_iq4_nl, B_IQ4_NL)
