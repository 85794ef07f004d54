#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// gemm.comp: Y = W X for a prefill chunk, tiled through shared memory: each workgroup computes a
// 64-row x 32-token tile; per 32-element block step the weights are dequantized while they are
// loaded into shared memory (so each weight is read once per 32 tokens) and the tokens' inputs
// (RMS-normalised when NORM) are loaded beside them; each invocation owns a 4x4 micro-tile.
// Dispatch: (ceil(nrows / 64), ceil(ncols / 32), 1) with 128 invocations.
// Bindings as matvec.comp: 0 params, 1 weights part, 2 x, 3 out, 4 norm weight, 5/6/7 epilogue.
// Trip counts: 5 per block step (the step, and the k loop's 4 rounds of 8 unrolled products);
// lavapipe's 65,535 limit counts all loop iterations of an invocation together, so rows stay
// below 400K elements. The k loop is not unrolled whole on purpose: the barriers make lavapipe
// (Mesa 25) compile the shader as an LLVM coroutine, whose frame analysis grows with the square
// of the basic blocks, and each shared-memory access there is several (the whole unroll compiled
// 4-6x slower than Mesa 22.3 did; this way about 1.5-2x).
layout(constant_id = 3) const uint MODE = 0;
layout(constant_id = 4) const uint NORM = 0;
layout(constant_id = 5) const uint KV_F16 = 1;
layout(local_size_x = 128) in;

#include "common.glsl"
#include "weights.glsl"
#include "epilogue.glsl"

layout(std430, set = 0, binding = 2) readonly buffer X { vec4 xin[]; };
layout(std430, set = 0, binding = 4) readonly buffer G { vec4 gnorm[]; };

const uint TM = 64u, TN = 32u, WGS = 128u;
shared vec4 ws[32][TM / 4u]; // [k][rows/4]
shared vec4 xs[32][TN / 4u]; // [k][tokens/4]
shared float ssum[WGS];
shared float tscale[TN];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint r0 = gl_WorkGroupID.x * TM;
    uint c0 = gl_WorkGroupID.y * TN;
    uint tx = tid % 16u, ty = tid / 16u; // rows tx*4.., tokens ty*4..

    if (NORM != 0u) {
        // 4 invocations per token
        uint tt = tid / 4u, part = tid % 4u;
        float ss = 0.0;
        if (c0 + tt < pc.ncols) {
            uint base = (pc.x_off + (c0 + tt) * pc.ldx) >> 2;
            for (uint k4 = part; k4 < pc.nb * 8u; k4 += 4u) {
                vec4 v = xin[base + k4];
                ss += dot(v, v);
            }
        }
        ssum[tid] = ss;
        barrier();
        if (part == 0u)
            tscale[tt] = inversesqrt((ssum[tid] + ssum[tid + 1u] + ssum[tid + 2u] + ssum[tid + 3u]) /
                                         float(pc.kreal) + pc.eps);
        barrier();
    }

    vec4 acc[4]; // acc[i]: row tx*4+i for the 4 tokens ty*4..
    [[unroll]] for (uint i = 0u; i < 4u; i++) acc[i] = vec4(0.0);

    for (uint b = 0u; b < pc.nb; b++) {
        // weights: 64 rows x 4 quarters = 256 quarter-blocks, two per invocation
        [[unroll]] for (uint h = 0u; h < 2u; h++) {
            uint qi = tid + h * WGS;
            uint row = qi / 4u, j = qi % 4u;
            vec4 lo = vec4(0.0), hi = vec4(0.0);
            if (r0 + row < pc.nrows) dequant8((r0 + row) * pc.nb + b, j, lo, hi);
            uint kl = lo_off(j), kh = hi_off(j);
            [[unroll]] for (uint e = 0u; e < 4u; e++) {
                ws[kl + e][row / 4u][row % 4u] = lo[e];
                ws[kh + e][row / 4u][row % 4u] = hi[e];
            }
        }
        // inputs: 32 tokens x 8 vec4, two per invocation
        [[unroll]] for (uint h = 0u; h < 2u; h++) {
            uint xi = tid + h * WGS;
            uint tt = xi / 8u, k4 = xi % 8u;
            vec4 v = vec4(0.0);
            if (c0 + tt < pc.ncols) {
                v = xin[((pc.x_off + (c0 + tt) * pc.ldx) >> 2) + b * 8u + k4];
                if (NORM != 0u) v *= gnorm[b * 8u + k4] * tscale[tt];
            }
            [[unroll]] for (uint e = 0u; e < 4u; e++) xs[k4 * 4u + e][tt / 4u][tt % 4u] = v[e];
        }
        barrier();
        for (uint k0 = 0u; k0 < 32u; k0 += 8u)
            [[unroll]] for (uint k = k0; k < k0 + 8u; k++) {
                vec4 a = ws[k][tx];
                vec4 x = xs[k][ty];
                [[unroll]] for (uint i = 0u; i < 4u; i++) acc[i] += a[i] * x;
            }
        barrier();
    }
    [[unroll]] for (uint i = 0u; i < 4u; i += 2u) {
        uint r = r0 + tx * 4u + i;
        if (r >= pc.nrows) continue;
        [[unroll]] for (uint c = 0u; c < 4u; c++) {
            uint t = c0 + ty * 4u + c;
            if (t < pc.ncols) store_pair(pc.row0 + r, t, acc[i][c], acc[i + 1u][c], r + 1u < pc.nrows);
        }
    }
}
