#version 450
#extension GL_GOOGLE_include_directive : require
// layer_norm.comp: an encoder's LayerNorm with bias, in place over the residual stream:
//   x[t] = (x[t] + a - mean) / sqrt(var + eps) * w + b        over n = n_embd elements
// where a is nothing (MODE 0: after a projection whose epilogue added its output to x) or
// (MODE 1: the embeddings) row p(t) of the position table at binding 2 (position + token-type
// rows, summed at upload; n floats a row), p(t) = t - the first token of t's text, which the
// host writes at params.tokens[pc.seg + 2t]. The mean and the variance are two passes over the
// row (the variance of the deviations, as the reference computes it).
// Bindings: 0 params, 2 position table (MODE 1), 3 x (token t at t*ldx), 4 weight, 6 bias,
// 7 out: with pc.out_ld > 0 the result is also written there, token t at t*out_ld (the last
// block's states, host-visible, read back by the host).
// Dispatch (1, ncols, 1), WG invocations (a power of two) sharing the sums through shared memory.
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 3) const uint MODE = 0;
layout(local_size_x_id = 0) in;

#define KVG_OWN_PC
#include "common.glsl"

layout(push_constant) uniform PC {
    uint n;      // elements of a row
    uint ldx;    // x's stride per token
    uint ncols;  // tokens
    float eps;
    uint seg;    // MODE 1: index in params.tokens of token 0's (first token of its text, its length)
    uint out_ld; // > 0: the result also goes to binding 7 at t * out_ld
} pc;

layout(std430, set = 0, binding = 2) readonly buffer Pos { float pos[]; };
layout(std430, set = 0, binding = 3) buffer X { float x[]; };
layout(std430, set = 0, binding = 4) readonly buffer W { float wn[]; };
layout(std430, set = 0, binding = 6) readonly buffer B { float bn[]; };
layout(std430, set = 0, binding = 7) writeonly buffer Out { float yout[]; };

shared float red[WG];

float reduce_sum(uint tid, float v) {
    red[tid] = v;
    for (uint s = WG >> 1; s > 0u; s >>= 1) {
        barrier();
        if (tid < s) red[tid] += red[tid + s];
    }
    barrier();
    float r = red[0];
    barrier(); // red is reused by the next sum
    return r;
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint t = gl_WorkGroupID.y;
    uint base = t * pc.ldx;
    uint pbase = 0u;
    if (MODE == 1u) pbase = (t - uint(params.tokens[pc.seg + 2u * t])) * pc.n;
    // each invocation adds the position row to its own elements, then reads only those
    float s = 0.0;
    for (uint i = tid; i < pc.n; i += WG) {
        float v = x[base + i];
        if (MODE == 1u) {
            v += pos[pbase + i];
            x[base + i] = v;
        }
        s += v;
    }
    float mean = reduce_sum(tid, s) / float(pc.n);
    float ss = 0.0;
    for (uint i = tid; i < pc.n; i += WG) {
        float d = x[base + i] - mean;
        ss += d * d;
    }
    float scale = inversesqrt(reduce_sum(tid, ss) / float(pc.n) + pc.eps);
    for (uint i = tid; i < pc.n; i += WG) {
        float v = (x[base + i] - mean) * scale * wn[i] + bn[i];
        x[base + i] = v;
        if (pc.out_ld > 0u) yout[t * pc.out_ld + i] = v;
    }
}
