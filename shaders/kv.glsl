// kv.glsl: where the K/V of (layer, kv head, position) live. The one place that knows the KV
// cache layout; the QKV epilogue writes and attention and kv_copy read through it.
// Every session's K/V live in the model's page pool. Page q lives in slab q / PPS (binding 5
// [q / PPS], NSLAB slabs, each a buffer within maxStorageBufferRange), at page q % PPS; a page
// holds per layer K then V as [kv_heads][PAGE][head_dim]. Position p of a session is at slot
// p % PAGE of page table[tab + p / PAGE], the table being the session's, in binding 10.
// Elements are f16 pairs packed in a uint (KV_F16, declared by the includer) or f32 bits, or
// blocks of 32 elements of a row (KV_BLOCK: their bytes), each an f16 scale d then q8_0's 32
// int8 q (x = q * d, 34 bytes) or q4_0's 16 bytes of nibbles (byte i: element i low, i + 16
// high; x = (n - 8) * d, 18 bytes), GGUF's layouts; a row of hd elements is hd / 32 blocks, the
// pool's unit is then the byte, not the element (the host gives layer, V and page offsets in
// bytes), and rows start at even bytes. A kv_ref names a (K or V row's) slab and the unit index
// of its d = 0.
#ifndef KVG_KV_GLSL
#define KVG_KV_GLSL

layout(constant_id = 11) const uint PAGE = 32;
layout(constant_id = 12) const uint PPS = 1;   // pages per slab
layout(constant_id = 13) const uint NSLAB = 1; // slabs the pool spans (<= 8)
layout(constant_id = 14) const uint KV_BLOCK = 0; // 34: q8_0 blocks, 18: q4_0 blocks, 0: elements
const uint KV_QB = KV_BLOCK != 0u ? 1u : 0u;      // a block type
const uint KV_Q8 = KV_BLOCK == 34u ? 1u : 0u;
const uint KV_Q4 = KV_BLOCK == 18u ? 1u : 0u;
const uint KV_HW = KV_BLOCK / 2u;                 // a block's half-words (17 or 9)

#ifndef KVG_KV_WIDE
layout(std430, set = 0, binding = 5) buffer KVSlab { uint w[]; } kvs[8];
#endif
layout(std430, set = 0, binding = 10) readonly buffer PageTable { int ptab[]; };

struct kv_ref {
    uint slab;
    uint e;
};

// units of a row of hd elements
uint kv_row_units(uint hd) { return KV_QB != 0u ? hd / 32u * KV_BLOCK : hd; }

// tab: first page-table entry of the session; layer_off: pc.kv_layer of the layer;
// stride_v: offset of V after K inside a page's layer; page_elems: units per page; hd: head dim
kv_ref kv_locate(uint tab, uint layer_off, uint stride_v, uint page_elems, uint hd, bool is_k, uint h, uint pos) {
    kv_ref r;
    uint page = uint(ptab[tab + pos / PAGE]);
    r.slab = NSLAB == 1u ? 0u : page / PPS;
    r.e = (page % PPS) * page_elems + layer_off + (is_k ? 0u : stride_v) + (h * PAGE + pos % PAGE) * kv_row_units(hd);
    return r;
}

#ifndef KVG_KV_WIDE
uint kv_word(uint slab, uint i) {
    if (NSLAB == 1u) return kvs[0].w[i];
    switch (slab) {
    case 0u: return kvs[0].w[i];
    case 1u: return kvs[1].w[i];
    case 2u: return kvs[2].w[i];
    case 3u: return kvs[3].w[i];
    case 4u: return kvs[4].w[i];
    case 5u: return kvs[5].w[i];
    case 6u: return kvs[6].w[i];
    default: return kvs[7].w[i];
    }
}

void kv_set_word(uint slab, uint i, uint v) {
    if (NSLAB == 1u) {
        kvs[0].w[i] = v;
        return;
    }
    switch (slab) {
    case 0u: kvs[0].w[i] = v; break;
    case 1u: kvs[1].w[i] = v; break;
    case 2u: kvs[2].w[i] = v; break;
    case 3u: kvs[3].w[i] = v; break;
    case 4u: kvs[4].w[i] = v; break;
    case 5u: kvs[5].w[i] = v; break;
    case 6u: kvs[6].w[i] = v; break;
    default: kvs[7].w[i] = v; break;
    }
}

// a block type: the f16 scale of the block holding element d, and the byte of its q (q8_0) or
// of its nibble (q4_0: high nibble from element 16 of the block on)
float kv_blk_scale(kv_ref r, uint d, out uint qbyte) {
    uint b = r.e + (d >> 5) * KV_BLOCK;
    qbyte = b + 2u + (KV_Q8 != 0u ? d & 31u : d & 15u);
    return unpackHalf2x16(kv_word(r.slab, b >> 2) >> ((b & 2u) * 8u)).x;
}

// elements d, d + 1 (d even)
vec2 kv_load2(kv_ref r, uint d) {
    if (KV_QB != 0u) {
        uint x;
        float s = kv_blk_scale(r, d, x);
        uint w = kv_word(r.slab, x >> 2), sh = (x & 2u) * 8u;
        if (KV_Q4 != 0u) {
            uint n = (d & 16u) != 0u ? 4u : 0u;
            return (vec2(bitfieldExtract(w, int(sh + n), 4), bitfieldExtract(w, int(sh + 8u + n), 4)) - 8.0) * s;
        }
        return vec2(float(bitfieldExtract(int(w), int(sh), 8)), float(bitfieldExtract(int(w), int(sh) + 8, 8))) * s;
    }
    uint i = r.e + d;
    if (KV_F16 != 0u) return unpackHalf2x16(kv_word(r.slab, i >> 1));
    return vec2(uintBitsToFloat(kv_word(r.slab, i)), uintBitsToFloat(kv_word(r.slab, i + 1u)));
}

float kv_load1(kv_ref r, uint d) {
    if (KV_QB != 0u) {
        uint x;
        float s = kv_blk_scale(r, d, x);
        if (KV_Q4 != 0u)
            return (float(bitfieldExtract(kv_word(r.slab, x >> 2), int((x & 3u) * 8u + ((d & 16u) != 0u ? 4u : 0u)), 4)) -
                    8.0) * s;
        return float(bitfieldExtract(int(kv_word(r.slab, x >> 2)), int((x & 3u) * 8u), 8)) * s;
    }
    uint i = r.e + d;
    if (KV_F16 != 0u) {
        vec2 p = unpackHalf2x16(kv_word(r.slab, i >> 1));
        return (i & 1u) != 0u ? p.y : p.x;
    }
    return uintBitsToFloat(kv_word(r.slab, i));
}

// A block as KV_HW half-words (the scale, then the q bytes in pairs) at byte b (even), b = r.e +
// blk * KV_BLOCK of a row (arrays of 17, q8_0's count). Writes: the words a block holds whole
// are stored plainly; the one it shares with a neighbouring block (or row) gets its half through
// two atomics on disjoint bits, so blocks stored by concurrent invocations never lose each
// other's bytes.
void kv_blk_get(uint slab, uint b, out uint hw[17]) {
    uint w0 = b >> 2, nw = (KV_HW - 1u) / 2u; // whole words
    if ((b & 2u) == 0u) {
        for (uint k = 0u; k < nw; k++) {
            uint x = kv_word(slab, w0 + k);
            hw[2u * k] = x & 0xffffu;
            hw[2u * k + 1u] = x >> 16;
        }
        hw[KV_HW - 1u] = kv_word(slab, w0 + nw) & 0xffffu;
    } else {
        hw[0] = kv_word(slab, w0) >> 16;
        for (uint k = 0u; k < nw; k++) {
            uint x = kv_word(slab, w0 + 1u + k);
            hw[1u + 2u * k] = x & 0xffffu;
            hw[2u + 2u * k] = x >> 16;
        }
    }
}

void kv_set_half(uint slab, uint i, bool high, uint v) {
    uint keep = high ? 0xffffu : 0xffff0000u, bits = high ? v << 16 : v;
    if (NSLAB == 1u) {
        atomicAnd(kvs[0].w[i], keep);
        atomicOr(kvs[0].w[i], bits);
        return;
    }
    switch (slab) {
    case 0u: atomicAnd(kvs[0].w[i], keep); atomicOr(kvs[0].w[i], bits); break;
    case 1u: atomicAnd(kvs[1].w[i], keep); atomicOr(kvs[1].w[i], bits); break;
    case 2u: atomicAnd(kvs[2].w[i], keep); atomicOr(kvs[2].w[i], bits); break;
    case 3u: atomicAnd(kvs[3].w[i], keep); atomicOr(kvs[3].w[i], bits); break;
    case 4u: atomicAnd(kvs[4].w[i], keep); atomicOr(kvs[4].w[i], bits); break;
    case 5u: atomicAnd(kvs[5].w[i], keep); atomicOr(kvs[5].w[i], bits); break;
    case 6u: atomicAnd(kvs[6].w[i], keep); atomicOr(kvs[6].w[i], bits); break;
    default: atomicAnd(kvs[7].w[i], keep); atomicOr(kvs[7].w[i], bits); break;
    }
}

void kv_blk_put(uint slab, uint b, uint hw[17]) {
    uint w0 = b >> 2, nw = (KV_HW - 1u) / 2u;
    if ((b & 2u) == 0u) {
        for (uint k = 0u; k < nw; k++) kv_set_word(slab, w0 + k, hw[2u * k] | (hw[2u * k + 1u] << 16));
        kv_set_half(slab, w0 + nw, false, hw[KV_HW - 1u]);
    } else {
        kv_set_half(slab, w0, true, hw[0]);
        for (uint k = 0u; k < nw; k++) kv_set_word(slab, w0 + 1u + k, hw[1u + 2u * k] | (hw[2u + 2u * k] << 16));
    }
}

// block blk of the row at r as 32 floats
void kv_blk_load(kv_ref r, uint blk, out float x[32]) {
    uint hw[17];
    kv_blk_get(r.slab, r.e + blk * KV_BLOCK, hw);
    float d = unpackHalf2x16(hw[0]).x;
    if (KV_Q4 != 0u) {
        [[unroll]] for (uint k = 0u; k < 8u; k++) {
            uint p = hw[1u + k];
            x[2u * k] = (float(p & 15u) - 8.0) * d;
            x[2u * k + 16u] = (float((p >> 4) & 15u) - 8.0) * d;
            x[2u * k + 1u] = (float((p >> 8) & 15u) - 8.0) * d;
            x[2u * k + 17u] = (float(p >> 12) - 8.0) * d;
        }
        return;
    }
    [[unroll]] for (uint k = 0u; k < 16u; k++) {
        int p = int(hw[1u + k]);
        x[2u * k] = float(bitfieldExtract(p, 0, 8)) * d;
        x[2u * k + 1u] = float(bitfieldExtract(p, 8, 8)) * d;
    }
}

// quantizes 32 floats into block blk of the row at r as GGUF's types (and the host, quant.c):
// q8_0 d = amax / 127, q = round(x / d) half away from zero; q4_0 d = -(the signed extreme) / 8,
// n = min(15, trunc(x / d + 8.5))
void kv_blk_store(kv_ref r, uint blk, float x[32]) {
    float amax = 0.0, ext = 0.0;
    [[unroll]] for (uint k = 0u; k < 32u; k++) {
        if (abs(x[k]) > amax) {
            amax = abs(x[k]);
            ext = x[k];
        }
    }
    uint hw[17];
    if (KV_Q4 != 0u) {
        float d = ext / -8.0, id = d != 0.0 ? 1.0 / d : 0.0;
        hw[0] = packHalf2x16(vec2(d, 0.0));
        [[unroll]] for (uint k = 0u; k < 8u; k++) {
            vec4 v = vec4(x[2u * k], x[2u * k + 16u], x[2u * k + 1u], x[2u * k + 17u]) * id + 8.5;
            uvec4 n = uvec4(clamp(v, 0.0, 15.0)); // (the host: NaN and below 0 -> 0, 15 and up -> 15)
            hw[1u + k] = n.x | (n.y << 4) | (n.z << 8) | (n.w << 12);
        }
    } else {
        float d = amax / 127.0, id = d != 0.0 ? 1.0 / d : 0.0;
        hw[0] = packHalf2x16(vec2(d, 0.0));
        [[unroll]] for (uint k = 0u; k < 16u; k++) {
            vec2 v = vec2(x[2u * k], x[2u * k + 1u]) * id;
            ivec2 q = ivec2(clamp(sign(v) * floor(abs(v) + 0.5), -127.0, 127.0));
            hw[1u + k] = (uint(q.x) & 0xffu) | ((uint(q.y) & 0xffu) << 8);
        }
    }
    kv_blk_put(r.slab, r.e + blk * KV_BLOCK, hw);
}

// f16 / f32 only: a block is quantized whole (its scale comes from all 32 values)
void kv_store2(kv_ref r, uint d, vec2 v) {
    if (KV_QB != 0u) return;
    uint i = r.e + d;
    if (KV_F16 != 0u) {
        kv_set_word(r.slab, i >> 1, packHalf2x16(v));
    } else {
        kv_set_word(r.slab, i, floatBitsToUint(v.x));
        kv_set_word(r.slab, i + 1u, floatBitsToUint(v.y));
    }
}
#endif

#ifdef KVG_KV_WIDE
// Whole-row reads for CPU devices (attn_lane.comp), where every storage-buffer load is a loop
// over the SIMD lanes and its cost is per load, not per byte: the includer defines KVG_KV_WIDE
// (the array's capacity, a constant) and KVG_KV_WIDE_N (the row's uvec4 count: head_dim / 8
// f16 or head_dim / 4 f32; r.e a multiple of 8 f16 / 4 f32 elements; block types: the uvec4s from the
// 16-byte boundary at or below the row's first byte on, the includer re-aligns them; the slabs
// have room past their last page for that). The slab is chosen once
// per row, not per load: lavapipe runs every case of a divergent switch, masked. With
// KVG_KV_WIDE the slabs are declared as uvec4 arrays instead of uint (no second declaration
// of the same binding), so kv_word / kv_load* / kv_store2 above are left out.
layout(std430, set = 0, binding = 5) readonly buffer KVSlab4 { uvec4 w4[]; } kvs4[8];

// KVG_LOAD_ROW4(r, o): o[0 .. KVG_KV_WIDE_N) = the row at kv_ref r, uvec4 words (a macro, not
// a function: glslang mishandles arrays sized by specialization constants as parameters).
#define KVG_ROW4_(B, o, i) [[unroll]] for (uint kvg_j = 0u; kvg_j < KVG_KV_WIDE_N; kvg_j++) o[kvg_j] = B.w4[i + kvg_j];
#define KVG_LOAD_ROW4(r, o) { \
    uint kvg_i = KV_QB != 0u ? (r).e >> 4 : KV_F16 != 0u ? (r).e >> 3 : (r).e >> 2; \
    if (NSLAB == 1u) { \
        KVG_ROW4_(kvs4[0], o, kvg_i) \
    } else { \
        switch ((r).slab) { \
        case 0u: KVG_ROW4_(kvs4[0], o, kvg_i) break; \
        case 1u: KVG_ROW4_(kvs4[1], o, kvg_i) break; \
        case 2u: KVG_ROW4_(kvs4[2], o, kvg_i) break; \
        case 3u: KVG_ROW4_(kvs4[3], o, kvg_i) break; \
        case 4u: KVG_ROW4_(kvs4[4], o, kvg_i) break; \
        case 5u: KVG_ROW4_(kvs4[5], o, kvg_i) break; \
        case 6u: KVG_ROW4_(kvs4[6], o, kvg_i) break; \
        default: KVG_ROW4_(kvs4[7], o, kvg_i) break; \
        } \
    } }

// the V row of the position whose K row is k (same slot, same slab)
kv_ref kv_v_of(kv_ref k, uint stride_v) {
    kv_ref r = k;
    r.e += stride_v;
    return r;
}
#endif

#endif
