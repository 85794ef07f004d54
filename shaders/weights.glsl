// weights.glsl: reading a repacked weight matrix part (binding 1) for one WTYPE_* define: all the
// per-type shader code. Each type is a row of the host's table (core/vulkan/vk_weights.c; layout in
// core/vulkan/kvg_vk.h) and an entry of KVGEN_WEIGHT_TYPES (shaders/CMakeLists.txt); QWORDS and
// SCALE_HALVES below must equal the row's qwords and scale_halves.
//
// A part is a quant region (QWORDS words per block, rows one after another) then, at word
// scale_off, a scale region (SCALE_HALVES 16-bit values per block, two per word, packed over the
// whole part), so shaders need neither 8- nor 16-bit storage. Every current type has 32-element
// blocks (float rows zero-padded to a multiple of 32):
//   F32   32 words per block
//   F16   16 words per block (two halves per word), BF16 likewise
//   Q8_0  8 words of int8 per block; one f16 scale d
//   Q4_0  4 words of nibbles per block (byte i: element i low, element i+16 high); d
//   Q4_1  as Q4_0, two scales (d, m)
// A block is read in quarters (j = 0..3): 8 values as two vec4s at elements lo_off(j), hi_off(j).
#ifndef KVG_WEIGHTS_GLSL
#define KVG_WEIGHTS_GLSL

layout(std430, set = 0, binding = 1) readonly buffer Weights { uint wdata[]; };

#if defined(WTYPE_F32)
#define QWORDS 32u
#define SCALE_HALVES 0u
#elif defined(WTYPE_F16) || defined(WTYPE_BF16)
#define QWORDS 16u
#define SCALE_HALVES 0u
#elif defined(WTYPE_Q8_0)
#define QWORDS 8u
#define SCALE_HALVES 1u
#elif defined(WTYPE_Q4_0)
#define QWORDS 4u
#define SCALE_HALVES 1u
#define WTYPE_Q4 1
#elif defined(WTYPE_Q4_1)
#define QWORDS 4u
#define SCALE_HALVES 2u
#define WTYPE_Q4 1
#else
#error "define one WTYPE_*"
#endif

uint lo_off(uint j) {
#ifdef WTYPE_Q4
    return 4u * j;
#else
    return 8u * j;
#endif
}
uint hi_off(uint j) {
#ifdef WTYPE_Q4
    return 16u + 4u * j;
#else
    return 8u * j + 4u;
#endif
}

vec4 unpack_s8(uint w) {
    return vec4(int(w << 24) >> 24, int(w << 16) >> 24, int(w << 8) >> 24, int(w) >> 24);
}
vec2 unpack_bf16(uint w) { return vec2(uintBitsToFloat(w << 16), uintBitsToFloat(w & 0xffff0000u)); }

// scale value i of block blk
float scale_half(uint blk, uint i) {
    uint h = blk * SCALE_HALVES + i;
    vec2 s = unpackHalf2x16(wdata[pc.scale_off + (h >> 1u)]);
    return (h & 1u) != 0u ? s.y : s.x;
}
// scale values 2i and 2i+1 of block blk (SCALE_HALVES even: a block's scales start on a word)
vec2 scale_pair(uint blk, uint i) { return unpackHalf2x16(wdata[pc.scale_off + blk * (SCALE_HALVES / 2u) + i]); }

// blk = row * nb + block
void dequant8(uint blk, uint j, out vec4 lo, out vec4 hi) {
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
#elif defined(WTYPE_Q8_0)
    float d = scale_half(blk, 0u);
    lo = unpack_s8(wdata[base + 2u * j]) * d;
    hi = unpack_s8(wdata[base + 2u * j + 1u]) * d;
#elif defined(WTYPE_Q4_0)
    float d = scale_half(blk, 0u);
    uint w = wdata[base + j];
    lo = (vec4(uvec4(w, w >> 8, w >> 16, w >> 24) & 0xfu) - 8.0) * d;
    hi = (vec4(uvec4(w >> 4, w >> 12, w >> 20, w >> 28) & 0xfu) - 8.0) * d;
#elif defined(WTYPE_Q4_1)
    vec2 dm = scale_pair(blk, 0u);
    uint w = wdata[base + j];
    lo = vec4(uvec4(w, w >> 8, w >> 16, w >> 24) & 0xfu) * dm.x + dm.y;
    hi = vec4(uvec4(w >> 4, w >> 12, w >> 20, w >> 28) & 0xfu) * dm.x + dm.y;
#else
#error "dequant8: no branch for this WTYPE_*"
#endif
}

// A whole block as raw values q (elements 4i..4i+3 in q[i]) and (d, m) with w = q * d + m, so a
// dot product with x is d * dot(q, x) + m * sum(x): the scale is applied once per block and
// sum(x) is shared by every row. The quant words are read as 16-byte loads (lavapipe runs each
// load component as a scalar per lane, so fewer, wider loads cost less).
layout(std430, set = 0, binding = 1) readonly buffer Weights4 { uvec4 wdata4[]; };

void block_raw(uint blk, out vec4 q[8], out vec2 dm) {
#if defined(WTYPE_F32)
    [[unroll]] for (uint i = 0u; i < 8u; i++) q[i] = uintBitsToFloat(wdata4[blk * 8u + i]);
    dm = vec2(1.0, 0.0);
#elif defined(WTYPE_F16)
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        uvec4 w = wdata4[blk * 4u + i];
        q[2u * i] = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
        q[2u * i + 1u] = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
    }
    dm = vec2(1.0, 0.0);
#elif defined(WTYPE_BF16)
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        uvec4 w = wdata4[blk * 4u + i];
        q[2u * i] = vec4(unpack_bf16(w.x), unpack_bf16(w.y));
        q[2u * i + 1u] = vec4(unpack_bf16(w.z), unpack_bf16(w.w));
    }
    dm = vec2(1.0, 0.0);
#elif defined(WTYPE_Q8_0)
    [[unroll]] for (uint i = 0u; i < 2u; i++) {
        uvec4 w = wdata4[blk * 2u + i];
        [[unroll]] for (uint e = 0u; e < 4u; e++) q[4u * i + e] = unpack_s8(w[e]);
    }
    dm = vec2(scale_half(blk, 0u), 0.0);
#elif defined(WTYPE_Q4)
    uvec4 w = wdata4[blk];
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        q[i] = vec4(uvec4(w[i], w[i] >> 8, w[i] >> 16, w[i] >> 24) & 0xfu);
        q[4u + i] = vec4(uvec4(w[i] >> 4, w[i] >> 12, w[i] >> 20, w[i] >> 28) & 0xfu);
    }
#if defined(WTYPE_Q4_0)
    float d = scale_half(blk, 0u);
    dm = vec2(d, -8.0 * d);
#else
    dm = scale_pair(blk, 0u);
#endif
#else
#error "block_raw: no branch for this WTYPE_*"
#endif
}

#endif
