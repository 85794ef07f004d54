#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#ifdef SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#ifdef DOT
#extension GL_EXT_spirv_intrinsics : require
#endif
// matvec.comp: y = W x for up to NCOLS tokens (decode), weights dequantized in registers so
// several tokens share one read of W.
// Dispatch: (ceil(nrows / ROWS), 1, 1); each workgroup computes ROWS rows (even, so row pairs
// stay together for the epilogue) for every token.
// Bindings: 0 params, 1 weights (part), 2 x (f32, token t at x_off + t*ldx), 3 out, 4 norm
// weight (NORM: x is RMS-normalised and scaled by it on the fly), 5/6/7 see epilogue.glsl.
// Each invocation walks whole 32-element blocks b = tid, tid + WG, ... for one or two tokens (at
// most nb/WG trips), quarter-blocks q = tid, tid + WG, ... for more (at most nb*4/WG trips).
// matvec_sg_<type> (SUBGROUP) on a GPU runs one subgroup per workgroup (WG = the subgroup size):
// its sums are subgroupAdds of registers, without shared memory or barriers.
//
// matvec_dot_<type> (DOT, built on SUBGROUP; the integer types only) is the decode mat-vec of a
// model loaded with 8-bit activations on a device with 4x8-bit packed integer dot products
// (VK_KHR_shader_integer_dot_product): each 32-element block of the token's input is quantized
// to int8 with one scale (the largest magnitude to 127, rounded to even), and each row's block is
// dotted with it four bytes at a time (OpSDot), the block's scales applied to the integer sums.
// The result is W times the quantized input: the mins (and Q4_0's -8, Q6_K's -32) multiply the
// quantized input's sums. A batch's tokens (NCOLS = 8) share each row's unpacked block.
//
// LANE (specialization constant 7) selects the layout for CPU-like devices (lavapipe), where a
// workgroup runs on one core and barriers and reductions are costly: each invocation computes
// ROWS rows on its own (ROWS*WG rows per workgroup, dispatch (ceil(nrows / (ROWS*WG)), token
// groups of NCOLS, 1)), the inputs are the same for all invocations, and no reduction is needed.
// It walks a row's stored blocks (weights.glsl: GROUP 32-element sub-blocks each), loading each
// row's block header once, then the block's sub-blocks one whole 32-element block at a time:
// nb / GROUP + nb trips. lavapipe's 65,535 limit counts every loop iteration of an invocation
// together, so loops with constant trip counts are unrolled and rows stay below 500K elements.
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint NCOLS = 1;
layout(constant_id = 2) const uint ROWS = 4;
layout(constant_id = 3) const uint MODE = 0;
layout(constant_id = 4) const uint NORM = 0;
layout(constant_id = 5) const uint KV_F16 = 1;
layout(constant_id = 7) const uint LANE = 0;
// UBO (lane layout only): vec4s in the uniform windows, 0: inputs come from the storage buffers.
// lavapipe compiles a storage-buffer load into a scalar load per lane in a loop, but a
// uniform-buffer load at a workgroup-uniform address into one scalar load and a broadcast; the
// inputs are the same for every lane here, so reading them through a uniform window makes the
// weights the only per-lane loads. The host binds the window at the dispatch's first token.
layout(constant_id = 10) const uint UBO = 0;
layout(local_size_x_id = 0) in;

#include "common.glsl"
#include "weights.glsl"
#include "epilogue.glsl"

#ifdef DOT
const bool INT_DOT = true;
#else
const bool INT_DOT = false;
#endif

layout(std430, set = 0, binding = 2) readonly buffer X { vec4 xin[]; };
layout(std430, set = 0, binding = 4) readonly buffer G { vec4 gnorm[]; };
const uint UBO_N = UBO + uint(UBO == 0u);
layout(std140, set = 0, binding = 8) uniform XU { vec4 xu[UBO_N]; };
layout(std140, set = 0, binding = 9) uniform GU { vec4 gu[UBO_N]; };

// lane layout: input vec4 k4 of token c of this workgroup (c0 + c overall)
vec4 lane_x(uint c0, uint c, uint k4) {
    if (UBO != 0u) return xu[((c * pc.ldx) >> 2) + k4];
    return xin[((pc.x_off + (c0 + c) * pc.ldx) >> 2) + k4];
}
vec4 lane_g(uint k4) { return UBO != 0u ? gu[k4] : gnorm[k4]; }

shared float red[WG * ROWS * NCOLS];

// red[i * WG + 0 .. WG) summed into red[i * WG] for every i < n (n <= ROWS * NCOLS, the same
// in every invocation).
#ifdef SUBGROUP
// The variant for devices with subgroup arithmetic (matvec_sg_<type>): each subgroup sums its
// invocations' values with subgroupAdd, its first invocation writes the subgroup's sums, and
// one invocation per value adds up the subgroups' sums: two barriers instead of log2(WG).
void reduce_all(uint tid, uint n) {
    float v[ROWS * NCOLS];
    [[unroll]] for (uint i = 0u; i < ROWS * NCOLS; i++)
        if (i < n) v[i] = subgroupAdd(red[i * WG + tid]);
    barrier();
    if (subgroupElect())
        [[unroll]] for (uint i = 0u; i < ROWS * NCOLS; i++)
            if (i < n) red[i * WG + gl_SubgroupID] = v[i];
    barrier();
    for (uint i = tid; i < n; i += WG) {
        float s = 0.0;
        for (uint g = 0u; g < gl_NumSubgroups; g++) s += red[i * WG + g];
        red[i * WG] = s;
    }
    barrier();
}
// One subgroup per workgroup (the host makes WG the device's subgroup size on the subgroup
// layout): every sum is a subgroupAdd of registers, with no shared memory and no barrier.
// gl_NumSubgroups is the same in the whole workgroup, so the test keeps the barriers of
// reduce_all in uniform control flow when a driver splits the workgroup after all.
bool one_subgroup() { return gl_NumSubgroups == 1u; }
#else
// A tree over WG, each level's n * s additions spread over the whole workgroup by a plain (not
// unrolled) loop. The code stays small on purpose: a shader with barriers is compiled by
// lavapipe (Mesa 25) as a coroutine, and LLVM's coroutine frame analysis grows with the square
// of the basic blocks, of which every shared-memory access there makes several (an unrolled 32
// x 6 tree took 30 s to compile).
void reduce_all(uint tid, uint n) {
    for (uint s = WG >> 1; s > 0u; s >>= 1) {
        barrier();
        for (uint k = tid; k < n * s; k += WG) {
            uint i = k / s, j = k % s;
            red[i * WG + j] += red[i * WG + j + s];
        }
    }
    barrier();
}
#endif

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint r0 = gl_WorkGroupID.x * ROWS;
    float scale[NCOLS];
    [[unroll]] for (uint c = 0u; c < NCOLS; c++) scale[c] = 1.0;
    if (NORM != 0u && LANE == 0u) {
        float ss[NCOLS];
        [[unroll]] for (uint c = 0u; c < NCOLS; c++) {
            ss[c] = 0.0;
            if (pc.c0 + gl_WorkGroupID.y * NCOLS + c < pc.ncols)
                for (uint k4 = tid; k4 < pc.nb * 8u; k4 += WG) {
                    vec4 v = xin[(pc.x_off + (pc.c0 + gl_WorkGroupID.y * NCOLS + c) * pc.ldx) / 4u + k4];
                    ss[c] += dot(v, v);
                }
        }
#ifdef SUBGROUP
        if (one_subgroup()) {
            [[unroll]] for (uint c = 0u; c < NCOLS; c++)
                scale[c] = inversesqrt(subgroupAdd(ss[c]) / float(pc.kreal) + pc.eps);
        } else
#endif
        {
            [[unroll]] for (uint c = 0u; c < NCOLS; c++) red[c * WG + tid] = ss[c];
            reduce_all(tid, NCOLS);
            [[unroll]] for (uint c = 0u; c < NCOLS; c++) scale[c] = inversesqrt(red[c * WG] / float(pc.kreal) + pc.eps);
            barrier();
        }
    }

    if (LANE != 0u) {
        // ROWS rows per invocation, tokens [c0, c0 + NCOLS) of this workgroup column; a whole
        // block per iteration: each token's 32 inputs are loaded once and serve every row.
        uint r0 = (gl_WorkGroupID.x * WG + tid) * ROWS;
        uint c0 = pc.c0 + gl_WorkGroupID.y * NCOLS;
        if (r0 >= pc.nrows) return;
        float acc[ROWS * NCOLS], ss[NCOLS]; // ss: each token's sum of squares (NORM)
        [[unroll]] for (uint i = 0u; i < ROWS * NCOLS; i++) acc[i] = 0.0;
        [[unroll]] for (uint c = 0u; c < NCOLS; c++) ss[c] = 0.0;
        uint ng = pc.nb / GROUP; // stored blocks per row
        for (uint gi = 0u; gi < ng; gi++) {
            // each row's block header (scales) once per stored block, kept over its GROUP
            // 32-element sub-blocks
            WHead hd[ROWS];
            [[unroll]] for (uint r = 0u; r < ROWS; r++) {
                hd[r].a = uvec4(0u);
                hd[r].b = 0u;
                if (r0 + r < pc.nrows) hd[r] = wt_head((r0 + r) * ng + gi);
            }
#ifndef WT_GROUPED
            [[unroll]]
#endif
            for (uint sub = 0u; sub < GROUP; sub++) {
                uint b = gi * GROUP + sub;
                vec4 xb[NCOLS * 8u];
                float xs[NCOLS], xs2[NCOLS]; // sums of the block's inputs: all (xs), or 0-15 / 16-31 (WT_SPLIT)
                vec4 g[8];
                [[unroll]] for (uint i = 0u; i < 8u; i++) g[i] = NORM != 0u ? lane_g(b * 8u + i) : vec4(1.0);
                [[unroll]] for (uint c = 0u; c < NCOLS; c++) {
                    xs[c] = 0.0;
                    xs2[c] = 0.0;
                    [[unroll]] for (uint i = 0u; i < 8u; i++) xb[c * 8u + i] = vec4(0.0);
                    if (c0 + c < pc.ncols) {
                        [[unroll]] for (uint i = 0u; i < 8u; i++) {
                            vec4 v = lane_x(c0, c, b * 8u + i);
                            if (NORM != 0u) {
                                ss[c] += dot(v, v);
                                v *= g[i];
                            }
                            xb[c * 8u + i] = v;
#ifdef WT_SPLIT
                            if (i < 4u) xs[c] += dot(v, vec4(1.0));
                            else xs2[c] += dot(v, vec4(1.0));
#else
                            xs[c] += dot(v, vec4(1.0));
#endif
                        }
                    }
                }
                [[unroll]] for (uint r = 0u; r < ROWS; r++) {
                    if (r0 + r < pc.nrows) {
                        vec4 q[8];
                        vec4 dm;
                        block_raw(hd[r], (r0 + r) * ng + gi, sub, q, dm);
                        [[unroll]] for (uint c = 0u; c < NCOLS; c++) {
#ifdef WT_SPLIT
                            float d0 = 0.0, d1 = 0.0;
                            [[unroll]] for (uint i = 0u; i < 4u; i++) {
                                d0 += dot(q[i], xb[c * 8u + i]);
                                d1 += dot(q[4u + i], xb[c * 8u + 4u + i]);
                            }
                            acc[r * NCOLS + c] += d0 * dm.x + xs[c] * dm.y + d1 * dm.z + xs2[c] * dm.w;
#else
                            float d = 0.0;
                            [[unroll]] for (uint i = 0u; i < 8u; i++) d += dot(q[i], xb[c * 8u + i]);
                            acc[r * NCOLS + c] += d * dm.x + xs[c] * dm.y;
#endif
                        }
                    }
                }
            }
        }
        if (NORM != 0u)
            [[unroll]] for (uint c = 0u; c < NCOLS; c++) scale[c] = inversesqrt(ss[c] / float(pc.kreal) + pc.eps);
        [[unroll]] for (uint r = 0u; r < ROWS; r += 2u) {
            uint r1 = r0 + r;
            if (r1 >= pc.nrows) continue;
            [[unroll]] for (uint c = 0u; c < NCOLS; c++)
                if (c0 + c < pc.ncols)
                    store_pair(pc.row0 + r1, c0 + c, acc[r * NCOLS + c] * scale[c], acc[(r + 1u) * NCOLS + c] * scale[c],
                               r1 + 1u < pc.nrows);
        }
        return;
    }

    float acc[ROWS * NCOLS];
    [[unroll]] for (uint i = 0u; i < ROWS * NCOLS; i++) acc[i] = 0.0;
    if (NCOLS <= 2u || INT_DOT) {
        // decode (one or two tokens): a whole 32-element block per invocation and trip, as the
        // lane layout reads it (block_raw: the quants in one or two 16- or 8-byte loads, the
        // block's scales once), each row's block dequantized once for its tokens, whose inputs
        // (with the norm's weight) are loaded once per block for every row. Wide loads and a
        // quarter of the quarter-block walk's trips; the norm's 1/rms scales the sums at the end.
        // (With more tokens the f32 inputs would not stay in registers: the quarter walk below.
        // The integer-dot variant keeps its tokens' inputs as int8, 8 words per token and block.)
        uint ng = pc.nb / GROUP; // stored blocks per row
#ifdef DOT
        // each token's 32 inputs of the block quantized (scale dx[c], xq[c * 8 + i] its elements
        // 4i..4i+3; s0, s1 the sums of the quantized halves), then an integer dot product per
        // row and token: the row's block is unpacked once for all the tokens
        for (uint b = tid; b < pc.nb; b += WG) {
            uint gi = b / GROUP, sub = b % GROUP;
            vec4 g[8];
            [[unroll]] for (uint i = 0u; i < 8u; i++) g[i] = NORM != 0u ? gnorm[b * 8u + i] : vec4(1.0);
            uint xq[NCOLS * 8u];
            float dx[NCOLS];
            int s0[NCOLS], s1[NCOLS];
            [[unroll]] for (uint c = 0u; c < NCOLS; c++) {
                vec4 xb[8];
                float amax = 0.0;
                [[unroll]] for (uint i = 0u; i < 8u; i++) {
                    xb[i] = c < pc.ncols ? xin[((pc.x_off + c * pc.ldx) >> 2) + b * 8u + i] * g[i] : vec4(0.0);
                    vec4 a = abs(xb[i]);
                    amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
                }
                float ix = amax > 0.0 ? 127.0 / amax : 0.0;
                dx[c] = amax / 127.0;
                s0[c] = 0;
                s1[c] = 0;
                [[unroll]] for (uint i = 0u; i < 8u; i++) {
                    ivec4 q = ivec4(roundEven(xb[i] * ix));
                    xq[c * 8u + i] = pack_s8(q);
                    if (i < 4u) s0[c] += q.x + q.y + q.z + q.w;
                    else s1[c] += q.x + q.y + q.z + q.w;
                }
            }
            [[unroll]] for (uint r = 0u; r < ROWS; r++) {
                if (r0 + r < pc.nrows) {
                    uint wq[8];
                    vec4 dm;
                    block_int(wt_head((r0 + r) * ng + gi), (r0 + r) * ng + gi, sub, wq, dm);
#ifndef WT_SPLIT
                    dm.zw = dm.xy;
#endif
                    [[unroll]] for (uint c = 0u; c < NCOLS; c++) {
                        int d0 = 0, d1 = 0;
                        [[unroll]] for (uint i = 0u; i < 4u; i++) {
                            d0 += sdot4(wq[i], xq[c * 8u + i], 0u);
                            d1 += sdot4(wq[4u + i], xq[c * 8u + 4u + i], 0u);
                        }
                        acc[r * NCOLS + c] +=
                            dx[c] * (float(d0) * dm.x + float(s0[c]) * dm.y + float(d1) * dm.z + float(s1[c]) * dm.w);
                    }
                }
            }
        }
#else
        for (uint b = tid; b < pc.nb; b += WG) {
            uint gi = b / GROUP, sub = b % GROUP;
            vec4 xb[NCOLS * 8u];
            [[unroll]] for (uint c = 0u; c < NCOLS; c++)
                [[unroll]] for (uint i = 0u; i < 8u; i++) {
                    vec4 v = c < pc.ncols ? xin[((pc.x_off + c * pc.ldx) >> 2) + b * 8u + i] : vec4(0.0);
                    xb[c * 8u + i] = NORM != 0u ? v * gnorm[b * 8u + i] : v;
                }
            [[unroll]] for (uint r = 0u; r < ROWS; r++) {
                if (r0 + r < pc.nrows) {
                    vec4 q[8], dm;
                    block_raw(wt_head((r0 + r) * ng + gi), (r0 + r) * ng + gi, sub, q, dm);
#ifndef WT_SPLIT
                    dm.zw = dm.xy; // one scale (and min) for the whole block
#endif
                    [[unroll]] for (uint c = 0u; c < NCOLS; c++) {
                        float d = 0.0;
                        [[unroll]] for (uint i = 0u; i < 8u; i++)
                            d += dot(q[i] * (i < 4u ? dm.x : dm.z) + (i < 4u ? dm.y : dm.w), xb[c * 8u + i]);
                        acc[r * NCOLS + c] += d;
                    }
                }
            }
        }
#endif
        [[unroll]] for (uint i = 0u; i < ROWS * NCOLS; i++) acc[i] *= scale[i % NCOLS];
    } else {
        // quarter blocks q = tid, tid + WG, ...: 8 values of each of the ROWS rows per trip
        for (uint q = tid; q < pc.nb * 4u; q += WG) {
            uint b = q >> 2, j = q & 3u;
            uint klo = (b * 32u + lo_off(j)) >> 2, khi = (b * 32u + hi_off(j)) >> 2;
            vec4 xl[NCOLS], xh[NCOLS];
            vec4 gl = vec4(1.0), gh = vec4(1.0);
            if (NORM != 0u) {
                gl = gnorm[klo];
                gh = gnorm[khi];
            }
            [[unroll]] for (uint c = 0u; c < NCOLS; c++) {
                if (c < pc.ncols) {
                    uint base = (pc.x_off + c * pc.ldx) >> 2;
                    xl[c] = xin[base + klo] * gl * scale[c];
                    xh[c] = xin[base + khi] * gh * scale[c];
                } else {
                    xl[c] = vec4(0.0);
                    xh[c] = vec4(0.0);
                }
            }
            [[unroll]] for (uint r = 0u; r < ROWS; r++) {
                if (r0 + r < pc.nrows) {
                    vec4 lo, hi;
                    dequant8((r0 + r) * pc.nb + b, j, lo, hi);
                    [[unroll]] for (uint c = 0u; c < NCOLS; c++) acc[r * NCOLS + c] += dot(lo, xl[c]) + dot(hi, xh[c]);
                }
            }
        }
    }
    // one invocation per (row pair, token)
    uint npairs = ROWS / 2u;
#ifdef SUBGROUP
    if (one_subgroup()) {
        [[unroll]] for (uint c = 0u; c < NCOLS; c++)
            [[unroll]] for (uint rp = 0u; rp < ROWS / 2u; rp++) {
                float a = subgroupAdd(acc[2u * rp * NCOLS + c]);
                float b = subgroupAdd(acc[(2u * rp + 1u) * NCOLS + c]);
                uint r = r0 + 2u * rp;
                if ((c * npairs + rp) % WG == tid && c < pc.ncols && r < pc.nrows)
                    store_pair(pc.row0 + r, c, a, b, r + 1u < pc.nrows);
            }
        return;
    }
#endif
    [[unroll]] for (uint i = 0u; i < ROWS * NCOLS; i++) red[i * WG + tid] = acc[i];
    reduce_all(tid, ROWS * NCOLS);
    for (uint p = tid; p < npairs * NCOLS; p += WG) {
        uint rp = p % npairs, c = p / npairs;
        uint r = r0 + 2u * rp;
        if (c < pc.ncols && r < pc.nrows)
            store_pair(pc.row0 + r, c, red[(2u * rp * NCOLS + c) * WG], red[((2u * rp + 1u) * NCOLS + c) * WG],
                       r + 1u < pc.nrows);
    }
}
