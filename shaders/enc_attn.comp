#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// enc_attn.comp: an encoder's attention: bidirectional, no cache, each token over every token of
// its own text (the texts of a batch lie back to back and never see each other), online softmax.
// The QKV projection left token t's Q heads, then its K heads, then its V heads in one row of
// binding 2 (t*ldq; K at nq, V at nq + nq: an encoder has one K/V head per query head).
// Invocation (t, h) = (gl_GlobalInvocationID.x, .y) keeps query head h of token t, its running
// max and sum and its output row in registers and walks the K and V rows of its text once, a
// vec4 at a time: on a CPU device (lavapipe) a workgroup's lanes are consecutive tokens reading
// the same rows; on a GPU it is plain and correct, the encoder's attention being a small part of
// its work next to the mat-muls.
// Text of token t: it starts at token params.tokens[pc.seg + 2t] and has params.tokens[pc.seg +
// 2t + 1] tokens.
// Dispatch: (ceil(ncols / WG), n_head, 1). Bindings: 0 params, 2 Q|K|V, 3 out (t*ldo + h*hd).
// head_dim HD a multiple of 4; ldq, ldo multiples of 4. One loop trip per position of the text
// (the head_dim loops unrolled): lavapipe's 65,535-iteration limit is far above a text's length
// (the host refuses models whose context is not).
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 9) const uint HD = 64;
layout(local_size_x_id = 0) in;

#define KVG_OWN_PC
#include "common.glsl"

layout(push_constant) uniform PC {
    uint n_head, ldq, ldo, ncols;
    float scale;
    uint nq;  // Q's floats per token (n_head * head_dim): K's offset in a row, V's is 2 nq
    uint seg; // index in params.tokens of token 0's (first token of its text, its length)
} pc;

layout(std430, set = 0, binding = 2) readonly buffer QKV { vec4 qkv4[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { vec4 yout4[]; };

const uint NV = HD / 4u;

void main() {
    uint t = gl_GlobalInvocationID.x, h = gl_GlobalInvocationID.y;
    if (t >= pc.ncols) return;
    uint first = uint(params.tokens[pc.seg + 2u * t]), len = uint(params.tokens[pc.seg + 2u * t + 1u]);
    uint qb = (t * pc.ldq + h * HD) / 4u;
    vec4 q[NV], acc[NV];
    [[unroll]] for (uint e = 0u; e < NV; e++) {
        q[e] = qkv4[qb + e] * pc.scale;
        acc[e] = vec4(0.0);
    }
    float m = -1e30, l = 0.0;
    uint kb = (first * pc.ldq + pc.nq + h * HD) / 4u, vb = kb + pc.nq / 4u, step = pc.ldq / 4u;
    for (uint u = 0u; u < len; u++) {
        vec4 d4 = vec4(0.0);
        [[unroll]] for (uint e = 0u; e < NV; e++) d4 += q[e] * qkv4[kb + e];
        float sc = d4.x + d4.y + d4.z + d4.w;
        float mnew = max(m, sc);
        float corr = exp(m - mnew), pw = exp(sc - mnew);
        m = mnew;
        l = l * corr + pw;
        [[unroll]] for (uint e = 0u; e < NV; e++) acc[e] = acc[e] * corr + pw * qkv4[vb + e];
        kb += step;
        vb += step;
    }
    float inv = l > 0.0 ? 1.0 / l : 0.0;
    uint ob = (t * pc.ldo + h * HD) / 4u;
    [[unroll]] for (uint e = 0u; e < NV; e++) yout4[ob + e] = acc[e] * inv;
}
