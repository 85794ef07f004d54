#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
// gemm_cm.comp: Y = W X for a prefill chunk on the device's matrix units (VK_KHR_cooperative_matrix:
// products of f16 matrices summed in f32 at subgroup scope, M x K times K x N, of the shape the
// device offers: 16 x 16 x 16 on most GPUs, 8 x 8 x 8 on lavapipe). Each workgroup is four
// subgroups (WG = 4 x the subgroup size, full subgroups required) and computes a 4M-row x
// 4N-token tile; subgroup s owns the 2M x 2N quarter at rows 2M (s % 2), tokens 2N (s / 2): 2 x 2
// accumulator matrices. Per 32-element block step the weights are dequantized into shared memory
// as f16 (row-major, a row's 32 values then 8 of padding), the tokens' inputs (RMS-normalised when
// NORM) beside them (token-major: the B operand read column-major), then each subgroup multiplies
// the step's 32 / K slices. Inputs are stored times XS = 1/16, undone exactly on the sums, as
// gemm_h's. The results pass through shared memory one M x N matrix at a time, so that the
// epilogue (epilogue.glsl: store, residual add, SwiGLU, QKV with RoPE and the K/V write) sees row
// pairs as in the other GEMMs. Built only where the compiler knows GL_KHR_cooperative_matrix, made
// only on a device that offers such a shape (core/vulkan/vk_device.c).
// Dispatch: (ceil(nrows / 4M), ceil(ncols / 4N), 1) with WG invocations.
// Bindings as gemm.comp: 0 params, 1 weights part, 2 x, 3 out, 4 norm weight, 5/6/7 epilogue.
layout(constant_id = 0) const uint WG = 128; // 4 subgroups
layout(constant_id = 1) const uint CN = 16;  // the matrices' shape: M x K times K x N
layout(constant_id = 2) const uint CM = 16;
layout(constant_id = 9) const uint CK = 16;
layout(constant_id = 3) const uint MODE = 0;
layout(constant_id = 4) const uint NORM = 0;
layout(constant_id = 5) const uint KV_F16 = 1;
layout(local_size_x_id = 0) in;

#include "common.glsl"
#include "weights.glsl"
#include "epilogue.glsl"

layout(std430, set = 0, binding = 2) readonly buffer X { vec4 xin[]; };
layout(std430, set = 0, binding = 4) readonly buffer G { vec4 gnorm[]; };

const uint TM = 4u * CM, TN = 4u * CN, LD = 40u; // LD: a row's (token's) stride in halves (80 bytes)
const uint NP = WG > TN ? WG / TN : 1u;  // invocations per token (norm)
const uint NSS = NP * TN;
const float XS = 1.0 / 16.0;

shared float16_t wa[TM * LD]; // [row][k]
shared float16_t xb[TN * LD]; // [token][k], times XS
shared float ssum[NSS];
shared float tscale[TN];
shared float cout[4u * CM * CN]; // one M x N result per subgroup, row-major

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint r0 = gl_WorkGroupID.x * TM;
    uint c0 = gl_WorkGroupID.y * TN;
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID, sgn = gl_SubgroupSize;
    uint rs = 2u * CM * (sg % 2u), cs = 2u * CN * (sg / 2u); // this subgroup's quarter

    if (NORM != 0u) {
        for (uint u = tid; u < NSS; u += WG) {
            uint tt = u / NP, part = u % NP;
            float ss = 0.0;
            if (c0 + tt < pc.ncols) {
                uint base = (pc.x_off + (c0 + tt) * pc.ldx) >> 2;
                for (uint k4 = part; k4 < pc.nb * 8u; k4 += NP) {
                    vec4 v = xin[base + k4];
                    ss += dot(v, v);
                }
            }
            ssum[u] = ss;
        }
        barrier();
        for (uint tt = tid; tt < TN; tt += WG) {
            float tot = 0.0;
            for (uint i = 0u; i < NP; i++) tot += ssum[tt * NP + i];
            tscale[tt] = inversesqrt(tot / float(pc.kreal) + pc.eps);
        }
        barrier();
    }

    coopmat<float, gl_ScopeSubgroup, CM, CN, gl_MatrixUseAccumulator> acc[2][2];
    [[unroll]] for (uint i = 0u; i < 2u; i++)
        [[unroll]] for (uint j = 0u; j < 2u; j++)
            acc[i][j] = coopmat<float, gl_ScopeSubgroup, CM, CN, gl_MatrixUseAccumulator>(0.0);

    for (uint b = 0u; b < pc.nb; b++) {
        // weights: 64 rows x 4 quarters (8 values each)
        for (uint qi = tid; qi < TM * 4u; qi += WG) {
            uint row = qi / 4u, j = qi % 4u;
            vec4 lo = vec4(0.0), hi = vec4(0.0);
            if (r0 + row < pc.nrows) dequant8((r0 + row) * pc.nb + b, j, lo, hi);
            uint kl = lo_off(j), kh = hi_off(j);
            [[unroll]] for (uint e = 0u; e < 4u; e++) {
                wa[row * LD + kl + e] = float16_t(lo[e]);
                wa[row * LD + kh + e] = float16_t(hi[e]);
            }
        }
        // inputs: 64 tokens x 8 vec4
        for (uint xi = tid; xi < TN * 8u; xi += WG) {
            uint tt = xi / 8u, k4 = xi % 8u;
            vec4 v = vec4(0.0);
            if (c0 + tt < pc.ncols) {
                v = xin[((pc.x_off + (c0 + tt) * pc.ldx) >> 2) + b * 8u + k4];
                if (NORM != 0u) v *= gnorm[b * 8u + k4] * tscale[tt];
            }
            [[unroll]] for (uint e = 0u; e < 4u; e++) xb[tt * LD + k4 * 4u + e] = float16_t(v[e] * XS);
        }
        barrier();
        [[unroll]] for (uint kk = 0u; kk < 32u; kk += CK) {
            coopmat<float16_t, gl_ScopeSubgroup, CM, CK, gl_MatrixUseA> a[2];
            coopmat<float16_t, gl_ScopeSubgroup, CK, CN, gl_MatrixUseB> x[2];
            [[unroll]] for (uint i = 0u; i < 2u; i++)
                coopMatLoad(a[i], wa, (rs + CM * i) * LD + kk, LD, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint j = 0u; j < 2u; j++)
                coopMatLoad(x[j], xb, (cs + CN * j) * LD + kk, LD, gl_CooperativeMatrixLayoutColumnMajor);
            [[unroll]] for (uint i = 0u; i < 2u; i++)
                [[unroll]] for (uint j = 0u; j < 2u; j++) acc[i][j] = coopMatMulAdd(a[i], x[j], acc[i][j]);
        }
        barrier();
    }

    // each result matrix through this subgroup's M x N of shared memory, then the epilogue on
    // (row pair, token) entries
    uint co = sg * CM * CN;
    [[unroll]] for (uint i = 0u; i < 2u; i++)
        [[unroll]] for (uint j = 0u; j < 2u; j++) {
            coopMatStore(acc[i][j], cout, co, CN, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            for (uint u = lane; u < CM * CN / 2u; u += sgn) {
                uint p = u / CN, c = u % CN; // rows 2p, 2p + 1 of the matrix, token c
                uint r = r0 + rs + CM * i + 2u * p, t = c0 + cs + CN * j + c;
                if (r < pc.nrows && t < pc.ncols)
                    store_pair(pc.row0 + r, t, cout[co + 2u * p * CN + c] / XS, cout[co + (2u * p + 1u) * CN + c] / XS,
                               r + 1u < pc.nrows);
            }
            subgroupBarrier(); // the next matrix overwrites these values
        }
}
