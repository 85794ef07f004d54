#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// kv_store.comp: stores a step's new K and V into q8_0 / q4_0 pages (KV_BLOCK), quantizing each block of
// 32 elements with its own scale as the host does (kv.glsl, kv_blk_store). The QKV epilogue
// (or, with head norms, rms_norm.comp) leaves token t's K heads (RoPE applied) then V heads as
// f32 at binding 2, kv_raw + t * 2 * n_kv * hd: a block's scale needs all 32 elements, which
// no single invocation of the mat-mul holds.
// Dispatch: (ceil(2 * n_kv * hd / 32 / 64), ncols, 1) x 64. Invocation: one block of one K or V
// head of token t (blockIdx.y), written at position kvg_pos(t) of the token's page table.
// Bindings: 0 params, 2 the raw K|V, 5/10 the KV pool and page tables (kv.glsl).
layout(local_size_x = 64) in;
layout(constant_id = 5) const uint KV_F16 = 1;

#define KVG_OWN_PC
#include "common.glsl"

layout(push_constant) uniform PC {
    uint n_kv, hd, ncols, kv_raw;
    uint kv_layer, kv_page, kv_v, pt_base; // paged KV (kv.glsl)
} pc;

layout(std430, set = 0, binding = 2) readonly buffer In { float xin[]; };
#include "kv.glsl"

void main() {
    uint nb = pc.hd / 32u, nk = pc.n_kv * pc.hd;
    uint g = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
    if (g >= 2u * pc.n_kv * nb) return;
    bool is_k = g < pc.n_kv * nb;
    uint i = is_k ? g : g - pc.n_kv * nb;
    uint h = i / nb, blk = i % nb;
    uint src = pc.kv_raw + t * 2u * nk + (is_k ? 0u : nk) + h * pc.hd + blk * 32u;
    float x[32];
    [[unroll]] for (uint k = 0u; k < 32u; k++) x[k] = xin[src + k];
    kv_ref r = kv_locate(kvg_tab(t, pc.pt_base), pc.kv_layer, pc.kv_v, pc.kv_page, pc.hd, is_k, h, kvg_pos(t));
    kv_blk_store(r, blk, x);
}
