#version 450
#extension GL_GOOGLE_include_directive : require
// lora.comp: the low-rank products of LoRA adapters (core/model/kvg_adapter.h), y += s * B (A x)
// for each token's own adapters, in two dispatches per mat-mul. The pairs live as f32 in one
// buffer (binding 1): a pair's A is rank rows of n_in at word a_off, its B transposed, rank rows
// of n_out at word b_off.
//
// Binding 7 holds the step's table (uint words, floats as their bits), from word pc.tab_off:
//   [2 ncols] token t's entries: [tab[2t], tab[2t + 1]) (word offsets from tab_off; the tokens of
//             one sequence share theirs)
//   entries   8 words each: a_off, b_off, rank, n_out, t_off (the entry's ranks in token t's row
//             of the rank scratch), s (float: scale * alpha / rank, or scale), row0, stride
//             (its output o is the mat-mul's row row0 + stride * o: a fused matrix's part)
// MODE (specialization constant 3):
//   0 down:  t[c*ldo + t_off + r] = s * dot(A[r], xn[c]) for each entry and r < rank, where xn is
//            the token's input (binding 2, c*ldx; NORM: RMS-normed over n_in elements and scaled
//            by the norm weight, binding 4, as the mat-mul's prologue does). One workgroup per
//            token: dispatch (ncols, 1, 1).
//   1 up:    d[c*ldo + row] = sum over the token's entries whose part holds row: sum over r of
//            t[c*ldx + t_off + r] * Bt[r][o] (0 where none does), for rows [0, nrows); input the
//            rank scratch (binding 2), output the per-token delta the mat-mul's epilogue adds
//            (binding 3; epilogue.glsl). Dispatch (ceil(nrows / WG), ncols, 1).
// Each output sums its terms in a fixed order (entries in the set's order, ranks in order),
// whatever the batch around the token holds.
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 3) const uint MODE = 0;
layout(constant_id = 4) const uint NORM = 0;
layout(local_size_x_id = 0) in;

#define KVG_OWN_PC
#include "common.glsl"

layout(push_constant) uniform PC {
    uint ncols;   // tokens in this step
    uint ldx;     // input stride per token (floats)
    uint ldo;     // output stride per token (floats)
    uint n_in;    // down: input elements per token (the pairs' n_in)
    uint nrows;   // up: the mat-mul's output rows
    uint tab_off; // the table's first word for this mat-mul
    float eps;    // down with NORM: RMSNorm epsilon
} pc;

layout(std430, set = 0, binding = 1) readonly buffer Pairs { float pw[]; };
layout(std430, set = 0, binding = 2) readonly buffer In { float xin[]; };
layout(std430, set = 0, binding = 3) buffer Out { float yout[]; };
layout(std430, set = 0, binding = 4) readonly buffer W { float wn[]; };
layout(std430, set = 0, binding = 7) readonly buffer Tab { uint tab[]; };

shared float red[WG];

void down() {
    uint tid = gl_LocalInvocationID.x, c = gl_WorkGroupID.x;
    uint xb = c * pc.ldx;
    float scale = 1.0;
    if (NORM != 0u) {
        float ss = 0.0;
        for (uint i = tid; i < pc.n_in; i += WG) ss += xin[xb + i] * xin[xb + i];
        red[tid] = ss;
        for (uint s = WG >> 1; s > 0u; s >>= 1) {
            barrier();
            if (tid < s) red[tid] += red[tid + s];
        }
        barrier();
        scale = inversesqrt(red[0] / float(pc.n_in) + pc.eps);
    }
    uint e0 = tab[pc.tab_off + 2u * c], e1 = tab[pc.tab_off + 2u * c + 1u];
    for (uint e = e0; e < e1; e += 8u) {
        uint at = pc.tab_off + e;
        uint a_off = tab[at], rank = tab[at + 2u], t_off = tab[at + 4u];
        float s = uintBitsToFloat(tab[at + 5u]);
        for (uint r = tid; r < rank; r += WG) {
            uint ab = a_off + r * pc.n_in;
            float acc = 0.0;
            if (NORM != 0u)
                for (uint i = 0u; i < pc.n_in; i++) acc += pw[ab + i] * (xin[xb + i] * scale * wn[i]);
            else
                for (uint i = 0u; i < pc.n_in; i++) acc += pw[ab + i] * xin[xb + i];
            yout[c * pc.ldo + t_off + r] = s * acc;
        }
    }
}

void up() {
    uint row = gl_WorkGroupID.x * WG + gl_LocalInvocationID.x, c = gl_WorkGroupID.y;
    if (row >= pc.nrows) return;
    uint e0 = tab[pc.tab_off + 2u * c], e1 = tab[pc.tab_off + 2u * c + 1u];
    float d = 0.0;
    for (uint e = e0; e < e1; e += 8u) {
        uint at = pc.tab_off + e;
        uint b_off = tab[at + 1u], rank = tab[at + 2u], n_out = tab[at + 3u], t_off = tab[at + 4u];
        uint row0 = tab[at + 6u], stride = tab[at + 7u];
        if (row < row0 || (row - row0) % stride != 0u) continue;
        uint o = (row - row0) / stride;
        if (o >= n_out) continue;
        float acc = 0.0;
        for (uint r = 0u; r < rank; r++) acc += xin[c * pc.ldx + t_off + r] * pw[b_off + r * n_out + o];
        d += acc;
    }
    yout[c * pc.ldo + row] = d;
}

void main() {
    if (MODE == 0u) down();
    else up();
}
