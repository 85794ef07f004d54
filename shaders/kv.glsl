// kv.glsl: where the K/V of (layer, kv head, position) live. The one place that knows the KV
// cache layout; the QKV epilogue writes and attention and kv_copy read through it.
//   Contiguous (PAGED == 0): binding 5 [0] is the layer's K cache (kv_heads, n_ctx, head_dim),
//     binding 6 its V cache.
//   Paged: the model's page pool. Page q lives in slab q / PPS (binding 5 [q / PPS], NSLAB slabs,
//     each a buffer within maxStorageBufferRange), at page q % PPS; a page holds per layer K then
//     V as [kv_heads][PAGE][head_dim]. Position p of a session is at slot p % PAGE of page
//     table[tab + p / PAGE], the table being the session's, in binding 10.
// Elements are f16 pairs packed in a uint (KV_F16, declared by the includer) or f32 bits. A
// kv_ref names a (K or V row's) slab and the element index of its d = 0.
#ifndef KVG_KV_GLSL
#define KVG_KV_GLSL

layout(constant_id = 11) const uint PAGED = 0;
layout(constant_id = 12) const uint PAGE = 32;
layout(constant_id = 13) const uint PPS = 1;   // pages per slab
layout(constant_id = 14) const uint NSLAB = 1; // slabs the pool spans (<= 8)

layout(std430, set = 0, binding = 5) buffer KVSlab { uint w[]; } kvs[8];
layout(std430, set = 0, binding = 6) buffer KVVCache { uint w[]; } kvv;
layout(std430, set = 0, binding = 10) readonly buffer PageTable { int ptab[]; };

struct kv_ref {
    uint slab; // contiguous: 0 K, 8 V
    uint e;
};

// tab: first page-table entry of the session; layer_off: pc.kv_layer of the layer (paged);
// stride_v: offset of V after K (paged) ; hd, n_ctx: head dim and contiguous capacity
kv_ref kv_locate(uint tab, uint layer_off, uint stride_v, uint page_elems, uint hd, uint n_ctx, bool is_k, uint h,
                 uint pos) {
    kv_ref r;
    if (PAGED == 0u) {
        r.slab = is_k ? 0u : 8u;
        r.e = (h * n_ctx + pos) * hd;
        return r;
    }
    uint page = uint(ptab[tab + pos / PAGE]);
    r.slab = NSLAB == 1u ? 0u : page / PPS;
    r.e = (page % PPS) * page_elems + layer_off + (is_k ? 0u : stride_v) + (h * PAGE + pos % PAGE) * hd;
    return r;
}

uint kv_word(uint slab, uint i) {
    if (PAGED == 0u) return slab == 0u ? kvs[0].w[i] : kvv.w[i];
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
    if (PAGED == 0u) {
        if (slab == 0u) kvs[0].w[i] = v;
        else kvv.w[i] = v;
        return;
    }
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

// elements d, d + 1 (d even)
vec2 kv_load2(kv_ref r, uint d) {
    uint i = r.e + d;
    if (KV_F16 != 0u) return unpackHalf2x16(kv_word(r.slab, i >> 1));
    return vec2(uintBitsToFloat(kv_word(r.slab, i)), uintBitsToFloat(kv_word(r.slab, i + 1u)));
}

float kv_load1(kv_ref r, uint d) {
    uint i = r.e + d;
    if (KV_F16 != 0u) {
        vec2 p = unpackHalf2x16(kv_word(r.slab, i >> 1));
        return (i & 1u) != 0u ? p.y : p.x;
    }
    return uintBitsToFloat(kv_word(r.slab, i));
}

void kv_store2(kv_ref r, uint d, vec2 v) {
    uint i = r.e + d;
    if (KV_F16 != 0u) {
        kv_set_word(r.slab, i >> 1, packHalf2x16(v));
    } else {
        kv_set_word(r.slab, i, floatBitsToUint(v.x));
        kv_set_word(r.slab, i + 1u, floatBitsToUint(v.y));
    }
}

#endif
