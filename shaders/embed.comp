#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// embed.comp: x[t] = dequantized row tokens[t] of the embedding matrix.
// Dispatch: (ncols, 1, 1), one workgroup per token; a part covering rows [row0, row0+nrows)
// writes only the tokens that fall in it (big embeddings are split over several parts).
// Bindings: 0 params (token ids), 1 weights part, 3 out (token t at t*ldo).
layout(constant_id = 0) const uint WG = 64;
layout(local_size_x_id = 0) in;

#include "common.glsl"
#include "weights.glsl"

layout(std430, set = 0, binding = 3) writeonly buffer Out { float yout[]; };

void main() {
    uint t = gl_WorkGroupID.x;
    int tok = params.tokens[t];
    if (tok < int(pc.row0) || uint(tok) >= pc.row0 + pc.nrows) return;
    uint row = uint(tok) - pc.row0;
    for (uint q = gl_LocalInvocationID.x; q < pc.nb * 4u; q += WG) {
        uint b = q >> 2, j = q & 3u;
        vec4 lo, hi;
        dequant8(row * pc.nb + b, j, lo, hi);
        uint o = t * pc.ldo + b * 32u;
        for (uint e = 0u; e < 4u; e++) {
            yout[o + lo_off(j) + e] = lo[e];
            yout[o + hi_off(j) + e] = hi[e];
        }
    }
}
