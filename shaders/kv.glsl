// kv.glsl: where the K/V of (layer, kv head, position) live. The one place that knows the KV
// cache layout; the QKV epilogue writes and attention and kv_copy read through it.
// Every session's K/V live in the model's page pool. Page q lives in slab q / PPS (binding 5
// [q / PPS], NSLAB slabs, each a buffer within maxStorageBufferRange), at page q % PPS; a page
// holds per layer K then V as [kv_heads][PAGE][head_dim]. Position p of a session is at slot
// p % PAGE of page table[tab + p / PAGE], the table being the session's, in binding 10.
// Elements are f16 pairs packed in a uint (KV_F16, declared by the includer) or f32 bits, or
// (KV_Q8) q8_0 blocks: per 32 elements of a row an f16 scale d then 32 int8 q (x = q * d, 34
// bytes, GGUF's Q8_0), a row of hd elements hd / 32 blocks; the pool's unit is then the byte,
// not the element (the host gives layer, V and page offsets in bytes), and rows start at even
// bytes. A kv_ref names a (K or V row's) slab and the unit index of its d = 0.
#ifndef KVG_KV_GLSL
#define KVG_KV_GLSL

layout(constant_id = 11) const uint PAGE = 32;
layout(constant_id = 12) const uint PPS = 1;   // pages per slab
layout(constant_id = 13) const uint NSLAB = 1; // slabs the pool spans (<= 8)
layout(constant_id = 14) const uint KV_Q8 = 0; // 1: q8_0 blocks (above)

#ifndef KVG_KV_WIDE
layout(std430, set = 0, binding = 5) buffer KVSlab { uint w[]; } kvs[8];
#endif
layout(std430, set = 0, binding = 10) readonly buffer PageTable { int ptab[]; };

struct kv_ref {
    uint slab;
    uint e;
};

// units of a row of hd elements
uint kv_row_units(uint hd) { return KV_Q8 != 0u ? hd / 32u * 34u : hd; }

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

// q8_0: the f16 scale of the block holding element d, and the byte of its q
float kv_q8_scale(kv_ref r, uint d, out uint qbyte) {
    uint b = r.e + (d >> 5) * 34u;
    qbyte = b + 2u + (d & 31u);
    return unpackHalf2x16(kv_word(r.slab, b >> 2) >> ((b & 2u) * 8u)).x;
}

// elements d, d + 1 (d even)
vec2 kv_load2(kv_ref r, uint d) {
    if (KV_Q8 != 0u) {
        uint x;
        float s = kv_q8_scale(r, d, x);
        int w = int(kv_word(r.slab, x >> 2)), sh = int((x & 2u) * 8u);
        return vec2(float(bitfieldExtract(w, sh, 8)), float(bitfieldExtract(w, sh + 8, 8))) * s;
    }
    uint i = r.e + d;
    if (KV_F16 != 0u) return unpackHalf2x16(kv_word(r.slab, i >> 1));
    return vec2(uintBitsToFloat(kv_word(r.slab, i)), uintBitsToFloat(kv_word(r.slab, i + 1u)));
}

float kv_load1(kv_ref r, uint d) {
    if (KV_Q8 != 0u) {
        uint x;
        float s = kv_q8_scale(r, d, x);
        return float(bitfieldExtract(int(kv_word(r.slab, x >> 2)), int((x & 3u) * 8u), 8)) * s;
    }
    uint i = r.e + d;
    if (KV_F16 != 0u) {
        vec2 p = unpackHalf2x16(kv_word(r.slab, i >> 1));
        return (i & 1u) != 0u ? p.y : p.x;
    }
    return uintBitsToFloat(kv_word(r.slab, i));
}

// f16 / f32 only: a q8_0 block is quantized whole (its scale is the block's largest magnitude)
void kv_store2(kv_ref r, uint d, vec2 v) {
    if (KV_Q8 != 0u) return;
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
// f16 or head_dim / 4 f32; r.e a multiple of 8 f16 / 4 f32 elements; q8_0: the uvec4s from the
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
    uint kvg_i = KV_Q8 != 0u ? (r).e >> 4 : KV_F16 != 0u ? (r).e >> 3 : (r).e >> 2; \
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
