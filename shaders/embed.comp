#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// embed.comp: x[t] = embd_scale * dequantized row tokens[t] of the embedding matrix.
// Dispatch: (ncols, 1, 1), one workgroup per token; a part covering rows [row0, row0+nrows)
// writes only the tokens that fall in it (big embeddings are split over several parts).
// Bindings: 0 params (token ids), 1 weights part, 3 out (token t at t*ldo).
// Push constants: the weight kernels' layout (common.glsl) up to word 9, which is the
// embedding scale here (the host's pc_weights.eps; Gemma multiplies by sqrt(n_embd)): 0, what
// a host that does not set it passes, means 1.
// Trip counts: nb * 4 / WG quarter blocks per invocation.
layout(constant_id = 0) const uint WG = 64;
layout(local_size_x_id = 0) in;

#define KVG_OWN_PC 1
#include "common.glsl"
layout(push_constant) uniform PC {
    uint nrows;       // rows in this weight part
    uint nb;          // 32-element blocks per row
    uint scale_off;   // word offset of the scales inside the part
    uint ncols;       // tokens in this step
    uint ldx;         // unused
    uint ldo;         // output stride per token (floats)
    uint row0;        // global row of the part's first row
    uint x_off;       // unused
    uint kreal;       // unused
    float embd_scale; // every looked-up value is multiplied by it (0: by 1)
} pc;
#include "weights.glsl"

layout(std430, set = 0, binding = 3) writeonly buffer Out { float yout[]; };

void main() {
    uint t = gl_WorkGroupID.x;
    int tok = params.tokens[t];
    if (tok < int(pc.row0) || uint(tok) >= pc.row0 + pc.nrows) return;
    uint row = uint(tok) - pc.row0;
    float s = pc.embd_scale == 0.0 ? 1.0 : pc.embd_scale;
    for (uint q = gl_LocalInvocationID.x; q < pc.nb * 4u; q += WG) {
        uint b = q >> 2, j = q & 3u;
        vec4 lo, hi;
        dequant8(row * pc.nb + b, j, lo, hi);
        uint o = t * pc.ldo + b * 32u;
        [[unroll]] for (uint e = 0u; e < 4u; e++) {
            yout[o + lo_off(j) + e] = lo[e] * s;
            yout[o + hi_off(j) + e] = hi[e] * s;
        }
    }
}
