// weights.glsl: reading a repacked weight matrix part (binding 1) for one WTYPE_* define: all the
// per-type shader code. Each type is a row of the host's table (core/vulkan/vk_weights.c; layout in
// core/vulkan/kvg_vk.h) and an entry of KVGEN_WEIGHT_TYPES (shaders/CMakeLists.txt); QWORDS,
// SCALE_HALVES and GROUP below must equal the row's qwords, scale_halves and block_elems / 32.
//
// A part is a quant region (QWORDS words per stored block, rows one after another) then, at word
// scale_off, a scale region (SCALE_HALVES 16-bit values per stored block, two per word, packed over
// the whole part), so shaders need neither 8- nor 16-bit storage. The scale region holds each GGUF
// block's header bytes (scales, mins, high bits of the 32-element types) in GGUF order; the quant
// region the rest, regrouped per 32-element sub-block so that a sub-block's quants are one or two
// aligned loads:
//   N16  16 bytes (a uvec4): byte i holds element i in the low nibble, element i+16 in the high
//   B2    8 bytes (a uvec2): the 2-bit field of element l at bits 2(l%16) of word l/16
//   B1    1 word: bit l is the 1-bit field of element l
// Stored blocks (GROUP 32-element sub-blocks each; elements 4i..4i+3 of a sub-block are "q[i]"):
//   F32   32 words per block                                 GROUP 1
//   F16   16 words per block (two halves per word), BF16 likewise
//   Q8_0  8 words of int8; scale d
//   Q4_0  N16; d                       IQ4_NL  N16 (indices into the IQ4 levels); d
//   Q4_1  N16; d, m                    Q5_0    N16; d, qh      Q5_1  N16; d, m, qh
//   Q4_K  N16 x 8; d, dmin, scales[12]                       GROUP 8 (256-element super-blocks)
//   Q5_K  B1 x 8 (bit 4), N16 x 8; as Q4_K
//   Q6_K  N16 x 8 (low 4 bits), B2 x 8 (bits 4-5); int8 scales[16], d
//   Q2_K  B2 x 8; scales[16] (scale | min << 4), d, dmin
//   Q3_K  B2 x 8, B1 x 8 (the hmask); scales[12] (packed 6-bit), d
//   IQ4_XS N16 x 8; d, scales_h, scales_l[4]
// A 32-element block is read whole (block_raw: the lane mat-vec; its super-block's header
// is loaded once per row by wt_head and kept in registers over the GROUP sub-blocks), in
// quarters (dequant8, j = 0..3: 8 values as two vec4s at elements lo_off(j), hi_off(j)), or
// whole as int8 words (block_int: the DOT variants, for integer dot products).
#ifndef KVG_WEIGHTS_GLSL
#define KVG_WEIGHTS_GLSL

layout(std430, set = 0, binding = 1) readonly buffer Weights { uint wdata[]; };
layout(std430, set = 0, binding = 1) readonly buffer Weights2 { uvec2 wdata2[]; };
layout(std430, set = 0, binding = 1) readonly buffer Weights4 { uvec4 wdata4[]; };

// WT_NIB: q[i] of a block is elements 4i..4i+3 with quarter j = q[j] and q[j + 4] (N16 order).
// WT_GROUPED: GROUP > 1 (a stored block is a 256-element super-block of 8 sub-blocks).
// WT_SPLIT: 16-element sub-blocks with their own scale (and min): block_raw's dm has one pair per
// half (elements 0-15: dm.xy, 16-31: dm.zw).
#if defined(WTYPE_F32)
#define QWORDS 32u
#define SCALE_HALVES 0u
#define GROUP 1u
#elif defined(WTYPE_F16) || defined(WTYPE_BF16)
#define QWORDS 16u
#define SCALE_HALVES 0u
#define GROUP 1u
#elif defined(WTYPE_Q8_0)
#define QWORDS 8u
#define SCALE_HALVES 1u
#define GROUP 1u
#elif defined(WTYPE_Q4_0) || defined(WTYPE_IQ4_NL)
#define QWORDS 4u
#define SCALE_HALVES 1u
#define GROUP 1u
#define WT_NIB 1
#elif defined(WTYPE_Q4_1)
#define QWORDS 4u
#define SCALE_HALVES 2u
#define GROUP 1u
#define WT_NIB 1
#elif defined(WTYPE_Q5_0)
#define QWORDS 4u
#define SCALE_HALVES 3u
#define GROUP 1u
#define WT_NIB 1
#elif defined(WTYPE_Q5_1)
#define QWORDS 4u
#define SCALE_HALVES 4u
#define GROUP 1u
#define WT_NIB 1
#elif defined(WTYPE_Q4_K)
#define QWORDS 32u
#define SCALE_HALVES 8u
#define GROUP 8u
#define WT_GROUPED 1
#define WT_NIB 1
#elif defined(WTYPE_Q5_K)
#define QWORDS 40u
#define SCALE_HALVES 8u
#define GROUP 8u
#define WT_GROUPED 1
#define WT_NIB 1
#elif defined(WTYPE_Q6_K)
#define QWORDS 48u
#define SCALE_HALVES 9u
#define GROUP 8u
#define WT_GROUPED 1
#define WT_NIB 1
#define WT_SPLIT 1
#elif defined(WTYPE_Q2_K)
#define QWORDS 16u
#define SCALE_HALVES 10u
#define GROUP 8u
#define WT_GROUPED 1
#define WT_NIB 1
#define WT_SPLIT 1
#elif defined(WTYPE_Q3_K)
#define QWORDS 24u
#define SCALE_HALVES 7u
#define GROUP 8u
#define WT_GROUPED 1
#define WT_NIB 1
#define WT_SPLIT 1
#elif defined(WTYPE_IQ4_XS)
#define QWORDS 32u
#define SCALE_HALVES 4u
#define GROUP 8u
#define WT_GROUPED 1
#define WT_NIB 1
#else
#error "define one WTYPE_*"
#endif

uint lo_off(uint j) {
#ifdef WT_NIB
    return 4u * j;
#else
    return 8u * j;
#endif
}
uint hi_off(uint j) {
#ifdef WT_NIB
    return 16u + 4u * j;
#else
    return 8u * j + 4u;
#endif
}

vec4 unpack_s8(uint w) {
    return vec4(int(w << 24) >> 24, int(w << 16) >> 24, int(w << 8) >> 24, int(w) >> 24);
}
vec2 unpack_bf16(uint w) { return vec2(uintBitsToFloat(w << 16), uintBitsToFloat(w & 0xffff0000u)); }

// the 4 low / high nibbles of the bytes of w
uvec4 nib_lo(uint w) { return uvec4(w, w >> 8, w >> 16, w >> 24) & 0xfu; }
uvec4 nib_hi(uint w) { return uvec4(w >> 4, w >> 12, w >> 20, w >> 28) & 0xfu; }
// 4 consecutive 2-bit fields from bit 8k of w (B2: elements 4k.. of word w's 16)
uvec4 bits2_at(uint w, uint k) {
    uint b = w >> (8u * k);
    return uvec4(b, b >> 2, b >> 4, b >> 6) & 3u;
}
// 4 consecutive 1-bit fields from bit 4k of w (B1 and qh: elements 4k..4k+3)
uvec4 bits1_at(uint w, uint k) { return (uvec4(w >> (4u * k)) >> uvec4(0u, 1u, 2u, 3u)) & 1u; }
// byte k of a word sequence held in a uvec4 (k < 16)
uint byte_at(uvec4 a, uint k) { return (a[k >> 2] >> ((k & 3u) << 3)) & 0xffu; }

#if defined(WTYPE_IQ4_NL) || defined(WTYPE_IQ4_XS)
// the IQ4 levels {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113} as
// int8 bytes, four per word; looked up with selects (no memory access)
const uint IQ4_W0 = 0xbfad9881u, IQ4_W1 = 0xf6eaddcfu, IQ4_W2 = 0x26190d01u, IQ4_W3 = 0x71594535u;
vec4 iq4_levels(uvec4 n) {
    uvec4 hi = n >> 2;
    uvec4 w = mix(mix(uvec4(IQ4_W0), uvec4(IQ4_W1), equal(hi, uvec4(1u))),
                  mix(uvec4(IQ4_W2), uvec4(IQ4_W3), equal(hi, uvec4(3u))), greaterThan(hi, uvec4(1u)));
    return vec4(ivec4(w << (24u - 8u * (n & 3u))) >> 24);
}
#endif

// ---- a stored block's header (its scale-region values), loaded once per row and block ----
struct WHead {
    uvec4 a; // the header's bytes from its first, in order (types whose header is not word-aligned
    uint b;  // are shifted so that a.x starts at the header's first half); b: bytes 16-19
};

// word k of the half sequence starting at half h0 of the scale region, for headers whose start
// is not word-aligned (SCALE_HALVES odd)
uint scale_word(uint base, bool odd, uint k) {
    uint w = wdata[base + k];
    return odd ? (w >> 16) | (wdata[base + k + 1u] << 16) : w;
}

// g: the stored block (row * blocks per row + block)
WHead wt_head(uint g) {
    WHead h;
    h.a = uvec4(0u);
    h.b = 0u;
#if defined(WTYPE_Q8_0) || defined(WTYPE_Q4_0) || defined(WTYPE_IQ4_NL)
    h.a.x = wdata[pc.scale_off + (g >> 1)] >> ((g & 1u) << 4);
#elif defined(WTYPE_Q4_1)
    h.a.x = wdata[pc.scale_off + g];
#elif defined(WTYPE_Q5_0)
    uint h0 = 3u * g, base = pc.scale_off + (h0 >> 1);
    uint w0 = wdata[base], w1 = wdata[base + 1u];
    bool odd = (h0 & 1u) != 0u;
    h.a.x = odd ? w0 >> 16 : w0;
    h.a.y = odd ? w1 : (w0 >> 16) | (w1 << 16);
#elif defined(WTYPE_Q5_1) || defined(WTYPE_IQ4_XS)
    h.a.xy = wdata2[(pc.scale_off >> 1) + g];
#elif defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
    h.a = wdata4[(pc.scale_off >> 2) + g];
#elif defined(WTYPE_Q6_K) || defined(WTYPE_Q3_K)
    uint h0 = SCALE_HALVES * g, base = pc.scale_off + (h0 >> 1);
    bool odd = (h0 & 1u) != 0u;
    // the header's halves lie in words base .. base + SCALE_HALVES / 2 (never past the region)
    uint w[SCALE_HALVES / 2u + 1u];
    [[unroll]] for (uint k = 0u; k <= SCALE_HALVES / 2u; k++) w[k] = wdata[base + k];
    uint v[SCALE_HALVES / 2u + 1u];
    [[unroll]] for (uint k = 0u; k < SCALE_HALVES / 2u; k++) v[k] = odd ? (w[k] >> 16) | (w[k + 1u] << 16) : w[k];
    v[SCALE_HALVES / 2u] = odd ? w[SCALE_HALVES / 2u] >> 16 : w[SCALE_HALVES / 2u];
    h.a = uvec4(v[0], v[1], v[2], v[3]);
#if defined(WTYPE_Q6_K)
    h.b = v[4];
#endif
#elif defined(WTYPE_Q2_K)
    uint base = pc.scale_off + 5u * g;
    h.a = uvec4(wdata[base], wdata[base + 1u], wdata[base + 2u], wdata[base + 3u]);
    h.b = wdata[base + 4u];
#endif
    return h;
}

// ---- per-type scales of sub-block `sub` (constant in unrolled loops, uniform otherwise) ----
#if defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
// (d * sc, dmin * mn) of sub-block j: the 6-bit scale and min from the 12 packed bytes (a.yzw)
vec2 k_dm(WHead h, uint j) {
    uvec4 s = uvec4(h.a.yzw, 0u);
    uint sc, mn;
    if (j < 4u) {
        sc = byte_at(s, j) & 63u;
        mn = byte_at(s, j + 4u) & 63u;
    } else {
        uint hi = byte_at(s, j + 4u);
        sc = (hi & 15u) | ((byte_at(s, j - 4u) >> 6) << 4);
        mn = (hi >> 4) | ((byte_at(s, j) >> 6) << 4);
    }
    vec2 dd = unpackHalf2x16(h.a.x);
    return vec2(dd.x * float(sc), dd.y * float(mn));
}
#endif
#if defined(WTYPE_Q6_K)
// d * scale of 16-element sub-block j (int8 scales in a, d in b)
float q6_d(WHead h, uint j) { return unpackHalf2x16(h.b).x * float(int(byte_at(h.a, j) << 24) >> 24); }
#endif
#if defined(WTYPE_Q2_K)
// (d * scale, dmin * min) of 16-element sub-block j
vec2 q2_dm(WHead h, uint j) {
    uint s = byte_at(h.a, j);
    vec2 dd = unpackHalf2x16(h.b);
    return vec2(dd.x * float(s & 15u), dd.y * float(s >> 4));
}
#endif
#if defined(WTYPE_Q3_K)
// d * (scale - 32) of 16-element sub-block j: 4 low bits from byte j % 8 (nibble j / 8), 2 high
// bits from byte 8 + j % 4 (bits 2 (j / 4))
float q3_d(WHead h, uint j) {
    uint lo = (byte_at(h.a, j & 7u) >> ((j >> 3) << 2)) & 15u;
    uint hi = (byte_at(h.a, 8u + (j & 3u)) >> ((j >> 2) << 1)) & 3u;
    return unpackHalf2x16(h.a.w).x * float(int(lo | (hi << 4)) - 32);
}
#endif
#if defined(WTYPE_IQ4_XS)
float iq4xs_d(WHead h, uint j) {
    uint u = ((h.a.y >> (4u * j)) & 15u) | (((h.a.x >> (16u + 2u * j)) & 3u) << 4);
    return unpackHalf2x16(h.a.x).x * float(int(u) - 32);
}
#endif

// ---- quarter j of 32-element block blk (= row * nb + block): 8 values ----
void dequant8(uint blk, uint j, out vec4 lo, out vec4 hi) {
    uint g = blk / GROUP, sub = blk % GROUP;
    uint base = blk * QWORDS;
#if defined(WTYPE_F32)
    uint o = base + 8u * j;
    lo = vec4(uintBitsToFloat(wdata[o]), uintBitsToFloat(wdata[o + 1u]), uintBitsToFloat(wdata[o + 2u]),
              uintBitsToFloat(wdata[o + 3u]));
    hi = vec4(uintBitsToFloat(wdata[o + 4u]), uintBitsToFloat(wdata[o + 5u]), uintBitsToFloat(wdata[o + 6u]),
              uintBitsToFloat(wdata[o + 7u]));
#elif defined(WTYPE_F16)
    uint o = base + 4u * j;
    lo = vec4(unpackHalf2x16(wdata[o]), unpackHalf2x16(wdata[o + 1u]));
    hi = vec4(unpackHalf2x16(wdata[o + 2u]), unpackHalf2x16(wdata[o + 3u]));
#elif defined(WTYPE_BF16)
    uint o = base + 4u * j;
    lo = vec4(unpack_bf16(wdata[o]), unpack_bf16(wdata[o + 1u]));
    hi = vec4(unpack_bf16(wdata[o + 2u]), unpack_bf16(wdata[o + 3u]));
#else
    WHead h = wt_head(g);
#if defined(WTYPE_Q8_0)
    float d = unpackHalf2x16(h.a.x).x;
    lo = unpack_s8(wdata[base + 2u * j]) * d;
    hi = unpack_s8(wdata[base + 2u * j + 1u]) * d;
#elif defined(WTYPE_Q4_0)
    float d = unpackHalf2x16(h.a.x).x;
    uint w = wdata[base + j];
    lo = (vec4(nib_lo(w)) - 8.0) * d;
    hi = (vec4(nib_hi(w)) - 8.0) * d;
#elif defined(WTYPE_Q4_1)
    vec2 dm = unpackHalf2x16(h.a.x);
    uint w = wdata[base + j];
    lo = vec4(nib_lo(w)) * dm.x + dm.y;
    hi = vec4(nib_hi(w)) * dm.x + dm.y;
#elif defined(WTYPE_IQ4_NL)
    float d = unpackHalf2x16(h.a.x).x;
    uint w = wdata[base + j];
    lo = iq4_levels(nib_lo(w)) * d;
    hi = iq4_levels(nib_hi(w)) * d;
#elif defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1)
    uint w = wdata[base + j], qh = h.a.y;
    vec4 ql = vec4(nib_lo(w) | (bits1_at(qh, j) << 4)), qv = vec4(nib_hi(w) | (bits1_at(qh, 4u + j) << 4));
#if defined(WTYPE_Q5_0)
    float d = unpackHalf2x16(h.a.x).x;
    lo = (ql - 16.0) * d;
    hi = (qv - 16.0) * d;
#else
    vec2 dm = unpackHalf2x16(h.a.x);
    lo = ql * dm.x + dm.y;
    hi = qv * dm.x + dm.y;
#endif
#elif defined(WTYPE_Q4_K)
    uint w = wdata[g * QWORDS + 4u * sub + j];
    vec2 dm = k_dm(h, sub);
    lo = vec4(nib_lo(w)) * dm.x - dm.y;
    hi = vec4(nib_hi(w)) * dm.x - dm.y;
#elif defined(WTYPE_Q5_K)
    uint qh = wdata[g * QWORDS + sub], w = wdata[g * QWORDS + 8u + 4u * sub + j];
    vec2 dm = k_dm(h, sub);
    lo = vec4(nib_lo(w) | (bits1_at(qh, j) << 4)) * dm.x - dm.y;
    hi = vec4(nib_hi(w) | (bits1_at(qh, 4u + j) << 4)) * dm.x - dm.y;
#elif defined(WTYPE_Q6_K)
    uint w = wdata[g * QWORDS + 4u * sub + j];
    uvec2 b2 = wdata2[(g * QWORDS + 32u) / 2u + sub];
    lo = vec4(ivec4(nib_lo(w) | (bits2_at(b2.x, j) << 4)) - 32) * q6_d(h, 2u * sub);
    hi = vec4(ivec4(nib_hi(w) | (bits2_at(b2.y, j) << 4)) - 32) * q6_d(h, 2u * sub + 1u);
#elif defined(WTYPE_Q2_K)
    uvec2 b2 = wdata2[g * (QWORDS / 2u) + sub];
    vec2 dl = q2_dm(h, 2u * sub), dh = q2_dm(h, 2u * sub + 1u);
    lo = vec4(bits2_at(b2.x, j)) * dl.x - dl.y;
    hi = vec4(bits2_at(b2.y, j)) * dh.x - dh.y;
#elif defined(WTYPE_Q3_K)
    uvec2 b2 = wdata2[g * (QWORDS / 2u) + sub];
    uint hm = wdata[g * QWORDS + 16u + sub];
    // q3 = q2 - 4 where the hmask bit is clear
    lo = vec4(ivec4(bits2_at(b2.x, j)) - 4 * ivec4(1u - bits1_at(hm, j))) * q3_d(h, 2u * sub);
    hi = vec4(ivec4(bits2_at(b2.y, j)) - 4 * ivec4(1u - bits1_at(hm, 4u + j))) * q3_d(h, 2u * sub + 1u);
#elif defined(WTYPE_IQ4_XS)
    uint w = wdata[g * QWORDS + 4u * sub + j];
    float d = iq4xs_d(h, sub);
    lo = iq4_levels(nib_lo(w)) * d;
    hi = iq4_levels(nib_hi(w)) * d;
#else
#error "dequant8: no branch for this WTYPE_*"
#endif
#endif
}

#if defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1) || defined(WTYPE_Q4_K)
// (scale, min) of the 4-bit unsigned types' sub-block `sub`: w = q * dm.x + dm.y, q = 0..15
vec2 nib_dm(WHead h, uint sub) {
#if defined(WTYPE_Q4_0)
    float d = unpackHalf2x16(h.a.x).x;
    return vec2(d, -8.0 * d);
#elif defined(WTYPE_Q4_1)
    return unpackHalf2x16(h.a.x);
#else
    vec2 k = k_dm(h, sub);
    return vec2(k.x, -k.y);
#endif
}
#endif

// ---- a whole 32-element block: sub-block `sub` of stored block g, whose header is h ----
// Raw values q (elements 4i..4i+3 in q[i]) and scales dm with w = q * dm.x + dm.y (WT_SPLIT:
// elements 0-15 q * dm.x + dm.y, 16-31 q * dm.z + dm.w), so a dot product with x is
// dm.x * dot(q, x) + dm.y * sum(x): the scale is applied once per block (or half) and sum(x) is
// shared by every row. The quant words are read as 16- or 8-byte loads (lavapipe runs each load
// component as a scalar per lane, so fewer, wider loads cost less).
void block_raw(WHead h, uint g, uint sub, out vec4 q[8], out vec4 dm) {
    uint blk = g * GROUP + sub;
    dm = vec4(1.0, 0.0, 1.0, 0.0);
#if defined(WTYPE_F32)
    [[unroll]] for (uint i = 0u; i < 8u; i++) q[i] = uintBitsToFloat(wdata4[blk * 8u + i]);
#elif defined(WTYPE_F16)
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        uvec4 w = wdata4[blk * 4u + i];
        q[2u * i] = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
        q[2u * i + 1u] = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
    }
#elif defined(WTYPE_BF16)
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        uvec4 w = wdata4[blk * 4u + i];
        q[2u * i] = vec4(unpack_bf16(w.x), unpack_bf16(w.y));
        q[2u * i + 1u] = vec4(unpack_bf16(w.z), unpack_bf16(w.w));
    }
#elif defined(WTYPE_Q8_0)
    [[unroll]] for (uint i = 0u; i < 2u; i++) {
        uvec4 w = wdata4[blk * 2u + i];
        [[unroll]] for (uint e = 0u; e < 4u; e++) q[4u * i + e] = unpack_s8(w[e]);
    }
    dm.xy = vec2(unpackHalf2x16(h.a.x).x, 0.0);
#elif defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1) || defined(WTYPE_IQ4_NL) || defined(WTYPE_Q4_K) || \
    defined(WTYPE_IQ4_XS)
    uvec4 w = wdata4[blk];
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
#if defined(WTYPE_IQ4_NL) || defined(WTYPE_IQ4_XS)
        q[i] = iq4_levels(nib_lo(w[i]));
        q[4u + i] = iq4_levels(nib_hi(w[i]));
#else
        q[i] = vec4(nib_lo(w[i]));
        q[4u + i] = vec4(nib_hi(w[i]));
#endif
    }
#if defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1) || defined(WTYPE_Q4_K)
    dm.xy = nib_dm(h, sub);
#elif defined(WTYPE_IQ4_NL)
    dm.xy = vec2(unpackHalf2x16(h.a.x).x, 0.0);
#else
    dm.xy = vec2(iq4xs_d(h, sub), 0.0);
#endif
#elif defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1) || defined(WTYPE_Q5_K)
#if defined(WTYPE_Q5_K)
    uint qh = wdata[g * QWORDS + sub];
    uvec4 w = wdata4[(g * QWORDS + 8u) / 4u + sub];
#else
    uint qh = h.a.y;
    uvec4 w = wdata4[blk];
#endif
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        q[i] = vec4(nib_lo(w[i]) | (bits1_at(qh, i) << 4));
        q[4u + i] = vec4(nib_hi(w[i]) | (bits1_at(qh, 4u + i) << 4));
    }
#if defined(WTYPE_Q5_0)
    float d = unpackHalf2x16(h.a.x).x;
    dm.xy = vec2(d, -16.0 * d);
#elif defined(WTYPE_Q5_1)
    dm.xy = unpackHalf2x16(h.a.x);
#else
    vec2 k = k_dm(h, sub);
    dm.xy = vec2(k.x, -k.y);
#endif
#elif defined(WTYPE_Q6_K)
    uvec4 w = wdata4[g * (QWORDS / 4u) + sub];
    uvec2 b2 = wdata2[(g * QWORDS + 32u) / 2u + sub];
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        q[i] = vec4(ivec4(nib_lo(w[i]) | (bits2_at(b2.x, i) << 4)) - 32);
        q[4u + i] = vec4(ivec4(nib_hi(w[i]) | (bits2_at(b2.y, i) << 4)) - 32);
    }
    dm = vec4(q6_d(h, 2u * sub), 0.0, q6_d(h, 2u * sub + 1u), 0.0);
#elif defined(WTYPE_Q2_K)
    uvec2 b2 = wdata2[g * (QWORDS / 2u) + sub];
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        q[i] = vec4(bits2_at(b2.x, i));
        q[4u + i] = vec4(bits2_at(b2.y, i));
    }
    vec2 dl = q2_dm(h, 2u * sub), dh = q2_dm(h, 2u * sub + 1u);
    dm = vec4(dl.x, -dl.y, dh.x, -dh.y);
#elif defined(WTYPE_Q3_K)
    uvec2 b2 = wdata2[g * (QWORDS / 2u) + sub];
    uint hm = wdata[g * QWORDS + 16u + sub];
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        q[i] = vec4(ivec4(bits2_at(b2.x, i)) - 4 * ivec4(1u - bits1_at(hm, i)));
        q[4u + i] = vec4(ivec4(bits2_at(b2.y, i)) - 4 * ivec4(1u - bits1_at(hm, 4u + i)));
    }
    dm = vec4(q3_d(h, 2u * sub), 0.0, q3_d(h, 2u * sub + 1u), 0.0);
#else
#error "block_raw: no branch for this WTYPE_*"
#endif
}

#ifdef DOT
// ---- 8-bit activations by integer dot products (the DOT variants of matvec.comp, gemm.comp) ----
// OpSDot (4450) of two words of four int8 each (PackedVectorFormat4x8Bit: fmt 0)
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4(uint a, uint b, spirv_literal uint fmt);
// four integers in [-128, 127] as the bytes of a word, the first lowest
uint pack_s8(ivec4 v) {
    uvec4 u = uvec4(v) & 0xffu;
    return u.x | (u.y << 8) | (u.z << 16) | (u.w << 24);
}
// four 2-bit fields of byte b to bits 0-1 of four bytes
uint spread2(uint b) { return (b & 3u) | ((b & 0xcu) << 6) | ((b & 0x30u) << 12) | ((b & 0xc0u) << 18); }

// block_raw's block as int8 bytes: wq[i] holds elements 4i..4i+3 (every type's values fit a
// signed byte), with block_raw's scales dm. The nibble types, Q6_K and Q8_0 take their words
// apart with masks (Q6_K's -32 moves to dm's min terms); the others convert block_raw's values.
void block_int(WHead h, uint g, uint sub, out uint wq[8], out vec4 dm) {
#if defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1) || defined(WTYPE_Q4_K)
    uvec4 w = wdata4[g * GROUP + sub];
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        wq[i] = w[i] & 0x0f0f0f0fu;
        wq[4u + i] = (w[i] >> 4) & 0x0f0f0f0fu;
    }
    dm = vec4(nib_dm(h, sub), 1.0, 0.0);
#elif defined(WTYPE_Q8_0)
    [[unroll]] for (uint i = 0u; i < 2u; i++) {
        uvec4 w = wdata4[(g * GROUP + sub) * 2u + i];
        [[unroll]] for (uint e = 0u; e < 4u; e++) wq[4u * i + e] = w[e];
    }
    dm = vec4(unpackHalf2x16(h.a.x).x, 0.0, 1.0, 0.0);
#elif defined(WTYPE_Q6_K)
    uvec4 w = wdata4[g * (QWORDS / 4u) + sub];
    uvec2 b2 = wdata2[(g * QWORDS + 32u) / 2u + sub];
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        wq[i] = (w[i] & 0x0f0f0f0fu) | (spread2((b2.x >> (8u * i)) & 0xffu) << 4);
        wq[4u + i] = ((w[i] >> 4) & 0x0f0f0f0fu) | (spread2((b2.y >> (8u * i)) & 0xffu) << 4);
    }
    float d0 = q6_d(h, 2u * sub), d1 = q6_d(h, 2u * sub + 1u);
    dm = vec4(d0, -32.0 * d0, d1, -32.0 * d1);
#else
    vec4 q[8];
    block_raw(h, g, sub, q, dm);
    [[unroll]] for (uint i = 0u; i < 8u; i++) wq[i] = pack_s8(ivec4(q[i]));
#endif
}
#endif

#endif
