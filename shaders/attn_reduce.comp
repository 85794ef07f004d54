#version 450
#extension GL_GOOGLE_include_directive : require
// attn_reduce.comp: merges attn.comp's per-split partial results (m, l, acc) into the output.
// Dispatch: (n_head, ncols, 1), 64 invocations over head_dim.
// Bindings: 3 out (t*ldo + h*hd), 7 partials.
layout(local_size_x = 64) in;

#define KVG_OWN_PC
#include "common.glsl"

layout(push_constant) uniform PC {
    uint n_head, n_kv, hd, ldq, ldo, n_ctx, nsplit, ncols;
    float scale;
} pc;

layout(std430, set = 0, binding = 3) writeonly buffer Out { float yout[]; };
layout(std430, set = 0, binding = 7) readonly buffer Part { float part[]; };

void main() {
    uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    uint stride = pc.hd + 2u;
    uint pb = (t * pc.n_head + h) * pc.nsplit * stride;
    float mx = -1e30;
    for (uint s = 0u; s < pc.nsplit; s++) mx = max(mx, part[pb + s * stride]);
    float lsum = 0.0;
    for (uint s = 0u; s < pc.nsplit; s++) lsum += exp(part[pb + s * stride] - mx) * part[pb + s * stride + 1u];
    float inv = lsum > 0.0 ? 1.0 / lsum : 0.0;
    for (uint d = gl_LocalInvocationID.x; d < pc.hd; d += 64u) {
        float o = 0.0;
        for (uint s = 0u; s < pc.nsplit; s++)
            o += exp(part[pb + s * stride] - mx) * part[pb + s * stride + 2u + d];
        yout[t * pc.ldo + h * pc.hd + d] = o * inv;
    }
}
