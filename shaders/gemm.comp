#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#ifdef DOT
#extension GL_EXT_spirv_intrinsics : require
#endif
// gemm.comp: Y = W X for a prefill chunk, tiled through shared memory: each workgroup computes a
// TM-row x TN-token tile; per 32-element block step the weights are dequantized while they are
// loaded into shared memory (so each weight is read once per TN tokens) and the tokens' inputs
// (RMS-normalised when NORM) are loaded beside them; the 128 invocations are a 16 x 8 grid, each
// owning a micro-tile of MR = TM / 16 rows x MC = TN / 8 tokens in registers. Two shapes (the
// host's choice, core/vulkan/vk_walk.c): 64 x 32 (4x4 micro-tiles, 12.6 KiB of shared memory, the
// fallback for devices with 16 KiB) and 128 x 64 (8x8: each value read from shared memory feeds 8
// products instead of 4, each weight read once per 64 tokens; 24.8 KiB).
// gemm_dot_<type> (DOT; the integer types, 8-bit activations as matvec_dot_<type>): per block
// step each row's block goes to shared memory as int8 words with its scales (block_int), each
// token's 32 inputs quantized to int8 with one scale, and a micro-tile's products are 8 integer
// dot products of four bytes (OpSDot) per (row, token) instead of 32 f32 products.
// gemm_h_<type> (HALF; chosen on GPUs, core/vulkan/vk_backend.c): the same tiles with the
// weights and inputs in shared memory as f16 pairs (packHalf2x16: core GLSL, no device feature),
// double-buffered: while a block step is multiplied from one buffer, the next step's weights and
// inputs are read into registers and then put in the other, one barrier per step instead of two
// (the footprint of the f32 tiles: 25,344 or 12,928 bytes). Products and sums stay f32; the
// rounding of both operands to f16 bounds the error by about 2^-10 of sum |w x|.
// Dispatch: (ceil(nrows / TM), ceil(ncols / TN), 1) with 128 invocations.
// Bindings as matvec.comp: 0 params, 1 weights part, 2 x, 3 out, 4 norm weight, 5/6/7 epilogue.
// Trip counts: the k loop is 4 rounds of 8 products per block step; lavapipe's 65,535 limit
// counts every loop iteration of an invocation together, and there the GEMMs measured correct up
// to 1,300 block steps (41,600 elements per row) and wrong from 1,600 (tested: 38,400; rows that
// long are an FFN of 40K or more, and lavapipe's own prefill is the lane mat-vec). The k loop is
// not unrolled whole on purpose: the barriers make lavapipe (Mesa 25) compile the shader as an
// LLVM coroutine, whose frame analysis grows with the square of the basic blocks, and each
// shared-memory access there is several (the whole unroll compiled 4-6x slower than Mesa 22.3
// did; this way about 1.5-2x).
layout(constant_id = 1) const uint TN = 32; // tokens per tile (32 or 64)
layout(constant_id = 2) const uint TM = 64; // rows per tile (64 or 128)
layout(constant_id = 3) const uint MODE = 0;
layout(constant_id = 4) const uint NORM = 0;
layout(constant_id = 5) const uint KV_F16 = 1;
layout(local_size_x = 128) in;

#include "common.glsl"
#include "weights.glsl"
#include "epilogue.glsl"

layout(std430, set = 0, binding = 2) readonly buffer X { vec4 xin[]; };
layout(std430, set = 0, binding = 4) readonly buffer G { vec4 gnorm[]; };

const uint WGS = 128u, MR = TM / 16u, MC = TN / 8u, NP = WGS / TN; // NP: invocations per token (norm)
#ifdef DOT
shared uint wsq[8][TM]; // [word k][row]: the row's block as int8, elements 4k..4k+3
shared vec4 wdm[TM];    // the row's block scales: (d, m) of elements 0-15, (d, m) of 16-31
shared uint xsq[8][TN]; // [word k][token]: the token's quantized inputs
shared vec4 xsd[TN];    // the token's scale dx (times its norm's 1/rms), dx * sum(q) of each half
#elif defined(HALF)
shared uvec2 wh[2][32][TM / 4u]; // [buffer][k][rows/4]: 4 rows' weights as f16
shared uvec2 xh[2][32][TN / 4u]; // [buffer][k][tokens/4]: 4 tokens' inputs times XS as f16
#else
shared vec4 ws[32][TM / 4u]; // [k][rows/4]
shared vec4 xs[32][TN / 4u]; // [k][tokens/4]
#endif
shared float ssum[WGS];
shared float tscale[TN];

#ifndef HALF
const float XS = 1.0; // the f32 tiles hold the inputs as they are
#else
// The inputs go to f16 times XS = 1/16 (a power of two: undone exactly on the sums), so inputs
// up to 16 x 65,504 stay finite; an f16 normal then holds inputs down to 16 x 2^-14 = 0.001 to
// 11 bits, smaller ones to an absolute 2^-20 at worst.
const float XS = 1.0 / 16.0;
// One block step's weights and inputs in registers (fetch: global reads, dequantized and packed
// to f16 pairs), then in shared buffer buf (put). Weights: TM / 2 row pairs x 4 quarters, TM / 64
// of them per invocation (the 4 quarters of a pair on neighbouring invocations: one row's block
// read by 4 neighbours); inputs: TN / 2 token pairs x 8 vec4, TN / 32 per invocation.
uint wreg[2][8], xreg[2][4];

void fetch(uint b) {
    uint tid = gl_LocalInvocationID.x, r0 = gl_WorkGroupID.x * TM, c0 = gl_WorkGroupID.y * TN;
    [[unroll]] for (uint h = 0u; h < TM / 64u; h++) {
        uint qi = tid + h * WGS, p = qi / 4u, j = qi % 4u;
        vec4 lo0 = vec4(0.0), hi0 = vec4(0.0), lo1 = vec4(0.0), hi1 = vec4(0.0);
        if (r0 + 2u * p < pc.nrows) dequant8((r0 + 2u * p) * pc.nb + b, j, lo0, hi0);
        if (r0 + 2u * p + 1u < pc.nrows) dequant8((r0 + 2u * p + 1u) * pc.nb + b, j, lo1, hi1);
        [[unroll]] for (uint e = 0u; e < 4u; e++) {
            wreg[h][e] = packHalf2x16(vec2(lo0[e], lo1[e]));
            wreg[h][4u + e] = packHalf2x16(vec2(hi0[e], hi1[e]));
        }
    }
    [[unroll]] for (uint h = 0u; h < TN / 32u; h++) {
        uint xi = tid + h * WGS, tp = xi / 8u, k4 = xi % 8u;
        vec4 v0 = vec4(0.0), v1 = vec4(0.0);
        uint t0 = 2u * tp, t1 = t0 + 1u;
        if (c0 + t0 < pc.ncols) v0 = xin[((pc.x_off + (c0 + t0) * pc.ldx) >> 2) + b * 8u + k4];
        if (c0 + t1 < pc.ncols) v1 = xin[((pc.x_off + (c0 + t1) * pc.ldx) >> 2) + b * 8u + k4];
        if (NORM != 0u) {
            vec4 g = gnorm[b * 8u + k4];
            v0 *= g * tscale[t0];
            v1 *= g * tscale[t1];
        }
        [[unroll]] for (uint e = 0u; e < 4u; e++) xreg[h][e] = packHalf2x16(vec2(v0[e], v1[e]) * XS);
    }
}

void put(uint buf) {
    uint tid = gl_LocalInvocationID.x;
    [[unroll]] for (uint h = 0u; h < TM / 64u; h++) {
        uint qi = tid + h * WGS, p = qi / 4u, j = qi % 4u;
        uint kl = lo_off(j), kh = hi_off(j);
        [[unroll]] for (uint e = 0u; e < 4u; e++) {
            wh[buf][kl + e][p / 2u][p % 2u] = wreg[h][e];
            wh[buf][kh + e][p / 2u][p % 2u] = wreg[h][4u + e];
        }
    }
    [[unroll]] for (uint h = 0u; h < TN / 32u; h++) {
        uint xi = tid + h * WGS, tp = xi / 8u, k4 = xi % 8u;
        [[unroll]] for (uint e = 0u; e < 4u; e++) xh[buf][k4 * 4u + e][tp / 2u][tp % 2u] = xreg[h][e];
    }
}
#endif

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint r0 = gl_WorkGroupID.x * TM;
    uint c0 = gl_WorkGroupID.y * TN;
    uint tx = tid % 16u, ty = tid / 16u; // rows tx*MR.., tokens ty*MC..

    if (NORM != 0u) {
        // NP invocations per token
        uint tt = tid / NP, part = tid % NP;
        float ss = 0.0;
        if (c0 + tt < pc.ncols) {
            uint base = (pc.x_off + (c0 + tt) * pc.ldx) >> 2;
            for (uint k4 = part; k4 < pc.nb * 8u; k4 += NP) {
                vec4 v = xin[base + k4];
                ss += dot(v, v);
            }
        }
        ssum[tid] = ss;
        barrier();
        if (part == 0u) {
            float tot = 0.0;
            [[unroll]] for (uint i = 0u; i < NP; i++) tot += ssum[tid + i];
            tscale[tt] = inversesqrt(tot / float(pc.kreal) + pc.eps);
        }
        barrier();
    }

#ifdef DOT
    float acc[MR * MC]; // acc[i * MC + c]: row tx*MR+i, token ty*MC+c
    [[unroll]] for (uint i = 0u; i < MR * MC; i++) acc[i] = 0.0;
    uint ng = pc.nb / GROUP; // stored blocks per row
    for (uint b = 0u; b < pc.nb; b++) {
        uint gi = b / GROUP, sub = b % GROUP;
        if (tid < TM) { // one row per invocation
            uint wq[8];
            vec4 dm = vec4(0.0);
            [[unroll]] for (uint k = 0u; k < 8u; k++) wq[k] = 0u;
            if (r0 + tid < pc.nrows) {
                uint g = (r0 + tid) * ng + gi;
                block_int(wt_head(g), g, sub, wq, dm);
#ifndef WT_SPLIT
                dm.zw = dm.xy;
#endif
            }
            [[unroll]] for (uint k = 0u; k < 8u; k++) wsq[k][tid] = wq[k];
            wdm[tid] = dm;
        }
        if (tid < TN) { // one token per invocation: its block quantized as matvec_dot's
            vec4 xb[8];
            float amax = 0.0;
            [[unroll]] for (uint i = 0u; i < 8u; i++) {
                vec4 v = vec4(0.0);
                if (c0 + tid < pc.ncols) {
                    v = xin[((pc.x_off + (c0 + tid) * pc.ldx) >> 2) + b * 8u + i];
                    if (NORM != 0u) v *= gnorm[b * 8u + i];
                }
                xb[i] = v;
                vec4 a = abs(v);
                amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
            }
            float ix = amax > 0.0 ? 127.0 / amax : 0.0, dx = amax / 127.0;
            if (NORM != 0u) dx *= tscale[tid];
            int s0 = 0, s1 = 0;
            [[unroll]] for (uint i = 0u; i < 8u; i++) {
                ivec4 q = ivec4(roundEven(xb[i] * ix));
                xsq[i][tid] = pack_s8(q);
                if (i < 4u) s0 += q.x + q.y + q.z + q.w;
                else s1 += q.x + q.y + q.z + q.w;
            }
            xsd[tid] = vec4(dx, dx * float(s0), dx * float(s1), 0.0);
        }
        barrier();
        [[unroll]] for (uint h = 0u; h < 2u; h++) { // the block's halves: elements 0-15, 16-31
            int id[MR * MC];
            [[unroll]] for (uint i = 0u; i < MR * MC; i++) id[i] = 0;
            [[unroll]] for (uint k = 4u * h; k < 4u * h + 4u; k++) {
                uint a[MR], x[MC];
                [[unroll]] for (uint i = 0u; i < MR; i++) a[i] = wsq[k][tx * MR + i];
                [[unroll]] for (uint c = 0u; c < MC; c++) x[c] = xsq[k][ty * MC + c];
                [[unroll]] for (uint i = 0u; i < MR; i++)
                    [[unroll]] for (uint c = 0u; c < MC; c++) id[i * MC + c] += sdot4(a[i], x[c], 0u);
            }
            [[unroll]] for (uint i = 0u; i < MR; i++) {
                vec4 dm = wdm[tx * MR + i];
                vec2 w = h == 0u ? dm.xy : dm.zw;
                [[unroll]] for (uint c = 0u; c < MC; c++) {
                    vec4 xd = xsd[ty * MC + c];
                    acc[i * MC + c] += w.x * xd.x * float(id[i * MC + c]) + w.y * (h == 0u ? xd.y : xd.z);
                }
            }
        }
        barrier();
    }
    [[unroll]] for (uint i = 0u; i < MR; i += 2u) {
        uint r = r0 + tx * MR + i;
        if (r >= pc.nrows) continue;
        [[unroll]] for (uint c = 0u; c < MC; c++) {
            uint t = c0 + ty * MC + c;
            if (t < pc.ncols) store_pair(pc.row0 + r, t, acc[i * MC + c], acc[(i + 1u) * MC + c], r + 1u < pc.nrows);
        }
    }
#else
    vec4 acc[MR * MC / 4u]; // acc[i * MC / 4 + j]: row tx*MR+i for the tokens ty*MC+4j.. (times XS: HALF)
    [[unroll]] for (uint i = 0u; i < MR * MC / 4u; i++) acc[i] = vec4(0.0);
#ifdef HALF
    fetch(0u);
    put(0u);
    barrier();
    for (uint b = 0u; b < pc.nb; b++) {
        uint cur = b & 1u;
        bool more = b + 1u < pc.nb;
        if (more) fetch(b + 1u); // the next step's global reads, in flight while this one computes
        for (uint k0 = 0u; k0 < 32u; k0 += 8u)
            [[unroll]] for (uint k = k0; k < k0 + 8u; k++) {
                vec4 a[MR / 4u], x[MC / 4u];
                [[unroll]] for (uint i = 0u; i < MR / 4u; i++) {
                    uvec2 u = wh[cur][k][tx * (MR / 4u) + i];
                    a[i] = vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y));
                }
                [[unroll]] for (uint j = 0u; j < MC / 4u; j++) {
                    uvec2 u = xh[cur][k][ty * (MC / 4u) + j];
                    x[j] = vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y));
                }
                [[unroll]] for (uint i = 0u; i < MR; i++)
                    [[unroll]] for (uint j = 0u; j < MC / 4u; j++) acc[i * (MC / 4u) + j] += a[i / 4u][i % 4u] * x[j];
            }
        if (more) put(cur ^ 1u); // the other buffer: its last readers passed the previous barrier
        barrier();
    }
#else
    for (uint b = 0u; b < pc.nb; b++) {
        // weights: TM rows x 4 quarters, TM / 32 quarter-blocks per invocation
        [[unroll]] for (uint h = 0u; h < TM / 32u; h++) {
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
        // inputs: TN tokens x 8 vec4, TN / 16 per invocation
        [[unroll]] for (uint h = 0u; h < TN / 16u; h++) {
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
                vec4 a[MR / 4u], x[MC / 4u];
                [[unroll]] for (uint i = 0u; i < MR / 4u; i++) a[i] = ws[k][tx * (MR / 4u) + i];
                [[unroll]] for (uint j = 0u; j < MC / 4u; j++) x[j] = xs[k][ty * (MC / 4u) + j];
                [[unroll]] for (uint i = 0u; i < MR; i++)
                    [[unroll]] for (uint j = 0u; j < MC / 4u; j++) acc[i * (MC / 4u) + j] += a[i / 4u][i % 4u] * x[j];
            }
        barrier();
    }
#endif
    [[unroll]] for (uint i = 0u; i < MR; i += 2u) {
        uint r = r0 + tx * MR + i;
        if (r >= pc.nrows) continue;
        [[unroll]] for (uint c = 0u; c < MC; c++) {
            uint t = c0 + ty * MC + c, a0 = i * (MC / 4u) + c / 4u, a1 = a0 + MC / 4u; // rows i, i + 1
            if (t < pc.ncols)
                store_pair(pc.row0 + r, t, acc[a0][c % 4u] / XS, acc[a1][c % 4u] / XS, r + 1u < pc.nrows);
        }
    }
#endif
}
