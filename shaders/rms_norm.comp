#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// rms_norm.comp: RMSNorm of row segments that no mat-mul prologue can fuse, because a segment's
// scale needs every element of a mat-mul's output first. MODE (specialization constant 3):
//   0 post norm (gemma2/3): x[t] += rmsnorm(f[t]) * w, n = n_embd elements: the attention or FFN
//     output f (binding 2, token t at t*ldi) normed with the layer's post norm (binding 4) and
//     added to the residual stream x (binding 3, t*ldo). Dispatch (1, ncols, 1).
//   1 Q/K head norms (qwen3, gemma3): the QKV mat-mul left token t's n_head Q heads then n_kv K
//     heads unrotated (biases added) at binding 2 (t*ldi + j*hd, EPI_F_RAW_QK in epilogue.glsl).
//     Workgroup (j, t) norms head j (flags 1: Q heads have a norm, 2: K heads; weights at binding
//     4, Q's hd then K's), rotates adjacent pairs d < n_rot with the layer's RoPE table (binding
//     7; NEOX heads arrive permuted, as everywhere on the device) and stores a Q head to binding
//     3 (t*ldo + j*hd), a K head to the KV pool (5, 10; kv.glsl) at position kvg_pos(t).
//     Dispatch (n_head + n_kv, ncols, 1). block pages (KV_BLOCK: q8_0, q4_0): a K head goes to binding 3 at
//     kv_raw + t*2*n_kv*hd + (j - n_head)*hd for kv_store.comp, and n_kv more workgroups copy
//     the V heads (left by the mat-mul after the K heads) after it: dispatch (n_head + 2 n_kv, ...).
//   2 final norm (a decoder's hidden states, KVG_OUT_HIDDEN): y[t] = rmsnorm(x[t]) * w, n = n_embd:
//     the residual stream (binding 2, t*ldi) normed with the output norm (binding 4) and stored
//     (binding 3, t*ldo), the input the logits' mat-vec would see. Dispatch (1, ncols, 1).
// WG invocations (a power of two) share the sum of squares through shared memory; each walks
// n / WG elements (MODES 0, 2) or hd / (2 WG) pairs (MODE 1).
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 3) const uint MODE = 0;
layout(constant_id = 5) const uint KV_F16 = 1;
layout(local_size_x_id = 0) in;

#define KVG_OWN_PC
#include "common.glsl"

layout(push_constant) uniform PC {
    uint n;        // elements per segment: n_embd (MODE 0) or head_dim (MODE 1)
    uint ldi, ldo, ncols;
    float eps;
    uint n_head, n_rot, flags;
    uint kv_layer, kv_page, kv_v, pt_base; // paged KV (kv.glsl)
    uint kv_raw;   // block pages (KV_BLOCK): K heads and V heads go to binding 3 at kv_raw + t * 2 n_kv hd
    uint n_kv;
} pc;

layout(std430, set = 0, binding = 2) readonly buffer In { float xin[]; };
layout(std430, set = 0, binding = 3) buffer Out { float yout[]; };
layout(std430, set = 0, binding = 4) readonly buffer W { float wn[]; };
layout(std430, set = 0, binding = 7) readonly buffer Rope { vec2 rope_cs[]; };
#include "kv.glsl"

shared float red[WG];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint j = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    uint base = t * pc.ldi + j * pc.n;
    bool is_q = j < pc.n_head;
    // block pages: head j >= n_head of the raw K|V (a K head, or a V head copied as it is)
    uint raw = pc.kv_raw + (t * 2u * pc.n_kv + j - pc.n_head) * pc.n;
    if (MODE == 1u && KV_QB != 0u && j >= pc.n_head + pc.n_kv) {
        for (uint i = tid; i < pc.n; i += WG) yout[raw + i] = xin[base + i];
        return;
    }
    bool normed = MODE != 1u || (pc.flags & (is_q ? 1u : 2u)) != 0u;
    float ss = 0.0;
    for (uint i = tid; i < pc.n; i += WG) {
        float v = xin[base + i];
        ss += v * v;
    }
    red[tid] = ss;
    for (uint s = WG >> 1; s > 0u; s >>= 1) {
        barrier();
        if (tid < s) red[tid] += red[tid + s];
    }
    barrier();
    float scale = normed ? inversesqrt(red[0] / float(pc.n) + pc.eps) : 1.0;
    if (MODE == 0u) {
        for (uint i = tid; i < pc.n; i += WG) yout[t * pc.ldo + i] += xin[base + i] * scale * wn[i];
        return;
    }
    if (MODE == 2u) {
        for (uint i = tid; i < pc.n; i += WG) yout[t * pc.ldo + i] = xin[base + i] * scale * wn[i];
        return;
    }
    uint pos = kvg_pos(t);
    uint woff = is_q ? 0u : pc.n;
    for (uint p = tid; p < pc.n / 2u; p += WG) {
        uint d = 2u * p;
        vec2 v = vec2(xin[base + d], xin[base + d + 1u]) * scale;
        if (normed) v *= vec2(wn[woff + d], wn[woff + d + 1u]);
        if (d < pc.n_rot) {
            vec2 cs = rope_cs[pos * (pc.n_rot >> 1) + p];
            v = vec2(v.x * cs.x - v.y * cs.y, v.x * cs.y + v.y * cs.x);
        }
        if (is_q) {
            yout[t * pc.ldo + j * pc.n + d] = v.x;
            yout[t * pc.ldo + j * pc.n + d + 1u] = v.y;
        } else if (KV_QB != 0u) {
            yout[raw + d] = v.x;
            yout[raw + d + 1u] = v.y;
        } else {
            kv_ref kr = kv_locate(kvg_tab(t, pc.pt_base), pc.kv_layer, pc.kv_v, pc.kv_page, pc.n, true, j - pc.n_head,
                                  pos);
            kv_store2(kr, d, v);
        }
    }
}
