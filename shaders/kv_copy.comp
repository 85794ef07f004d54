#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// kv_copy.comp: copies the K/V of n positions of one page table to another (or the same one,
// towards the start: the host splits an overlapping move into rounds that never read a slot an
// earlier round of the same dispatch wrote), re-rotating K by a position change (context shift:
// RoPE rotations add, so rotating a cached key by delta gives the key at pos + delta).
// Dispatch: (ceil(n * hd/2 / 64), 1, 1) x 64. Invocation: one (position i, element pair d) of
// every layer and KV head (n_layer * n_kv loop iterations). Block pages (KV_BLOCK, q8_0 / q4_0):
// (ceil(n * hd/32 / 64), 1, 1) x 64, one (position, block) each: a block moves as its bytes, or, K rotated,
// is dequantized, rotated in f32 and quantized again with a fresh scale (as the cpu backend).
// Bindings: 5 the paged pool's slabs, 10 the tables (source at src_tab, destination at dst_tab)
// and, from cs_off, cos/sin of delta * theta_i as float bits, n_rot / 2 pairs per layer (each
// layer's own RoPE base, scale and frequency factors). Keys are rotated as adjacent pairs: NEOX
// models keep their K heads permuted on the device so that pairs (i, i + n_rot/2) are adjacent
// (core/vulkan/vk_backend.c).
layout(local_size_x = 64) in;
layout(constant_id = 5) const uint KV_F16 = 1;

layout(push_constant) uniform PC {
    uint n, hd, n_layer, n_kv;
    uint src_tab, dst_tab, src_pos, dst_pos; // positions relative to the tables' first entries
    uint kv_page, kv_v, n_rot, cs_off, rope; // rope: 0 plain copy
} pc;

#include "kv.glsl"

void copy_blocks() {
    uint nb = pc.hd / 32u;
    uint gid = gl_GlobalInvocationID.x;
    uint i = gid / nb, blk = gid % nb;
    if (i >= pc.n) return;
    bool rot = pc.rope != 0u && blk * 32u < pc.n_rot;
    for (uint l = 0u; l < pc.n_layer; l++) {
        uint layer_off = l * 2u * pc.kv_v;
        for (uint h = 0u; h < pc.n_kv; h++) {
            for (uint kv = 0u; kv < 2u; kv++) {
                kv_ref s = kv_locate(pc.src_tab, layer_off, pc.kv_v, pc.kv_page, pc.hd, kv == 0u, h, pc.src_pos + i);
                kv_ref t = kv_locate(pc.dst_tab, layer_off, pc.kv_v, pc.kv_page, pc.hd, kv == 0u, h, pc.dst_pos + i);
                if (kv == 0u && rot) {
                    float x[32];
                    kv_blk_load(s, blk, x);
                    [[unroll]] for (uint k = 0u; k < 16u; k++) {
                        uint d = blk * 32u + 2u * k;
                        if (d < pc.n_rot) {
                            uint c = pc.cs_off + l * pc.n_rot + d;
                            vec2 cs = vec2(intBitsToFloat(ptab[c]), intBitsToFloat(ptab[c + 1u]));
                            float a = x[2u * k], b = x[2u * k + 1u];
                            x[2u * k] = a * cs.x - b * cs.y;
                            x[2u * k + 1u] = a * cs.y + b * cs.x;
                        }
                    }
                    kv_blk_store(t, blk, x);
                } else {
                    uint hw[17];
                    kv_blk_get(s.slab, s.e + blk * KV_BLOCK, hw);
                    kv_blk_put(t.slab, t.e + blk * KV_BLOCK, hw);
                }
            }
        }
    }
}

void main() {
    if (KV_QB != 0u) {
        copy_blocks();
        return;
    }
    uint pairs = pc.hd / 2u;
    uint gid = gl_GlobalInvocationID.x;
    uint i = gid / pairs, d = (gid % pairs) * 2u;
    if (i >= pc.n) return;
    bool rot = pc.rope != 0u && d < pc.n_rot;
    for (uint l = 0u; l < pc.n_layer; l++) {
        uint layer_off = l * 2u * pc.kv_v;
        vec2 cs = vec2(1.0, 0.0);
        if (rot) {
            uint c = pc.cs_off + l * pc.n_rot + d;
            cs = vec2(intBitsToFloat(ptab[c]), intBitsToFloat(ptab[c + 1u]));
        }
        for (uint h = 0u; h < pc.n_kv; h++) {
            kv_ref s = kv_locate(pc.src_tab, layer_off, pc.kv_v, pc.kv_page, pc.hd, true, h, pc.src_pos + i);
            kv_ref t = kv_locate(pc.dst_tab, layer_off, pc.kv_v, pc.kv_page, pc.hd, true, h, pc.dst_pos + i);
            vec2 k = kv_load2(s, d);
            kv_store2(t, d, vec2(k.x * cs.x - k.y * cs.y, k.x * cs.y + k.y * cs.x));
            s = kv_locate(pc.src_tab, layer_off, pc.kv_v, pc.kv_page, pc.hd, false, h, pc.src_pos + i);
            t = kv_locate(pc.dst_tab, layer_off, pc.kv_v, pc.kv_page, pc.hd, false, h, pc.dst_pos + i);
            kv_store2(t, d, kv_load2(s, d));
        }
    }
}
