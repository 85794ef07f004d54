#version 450
#extension GL_GOOGLE_include_directive : require
// argmax.comp: index of the largest of n floats (ranked as in select.glsl: lowest index on
// ties, NaN never wins), for greedy decoding so that only one integer is read back.
// Rows: workgroup y works on row y (a batch's logits, one row per sequence). Two passes, as in
// topk.comp (spec constant MODE), so that a large vocabulary is scanned by many workgroups:
//   0 (partial): workgroup (g, y) takes values [g*CHUNK, (g+1)*CHUNK) of row y, which starts
//     at x_off + y * n in binding 2 (float bits); writes its best as a (key, index) pair to
//     binding 7 at y * G + g, G = ceil(n / CHUNK). Where G is 1 it writes the index straight to
//     binding 3 at y instead, and there is no pass 1. Dispatch: (G, rows, 1).
//   1 (merge): workgroup y takes the n (key, index) pairs of row y from binding 7 at y * n (n is
//     pass 0's G) and writes the best one's index to binding 3 at y. Dispatch: (1, rows, 1).
// Every chunk holds at least one value, so every pair is a real one. Each invocation scans a
// strided share (CHUNK/WG values in pass 0, G/WG pairs in pass 1), then a tree over shared
// memory keeps the better of each two, lower index first on equal keys; a chunk's pairs thus
// carry its lowest best index and the merge picks the lowest over chunks.
// WG (a power of two, spec constant 0): 256, fewer where the device allows less.
// Bindings: 2 values (float bits), 3 out (word y receives row y's index), 7 partial pairs.
layout(constant_id = 0) const uint WG = 256;
layout(local_size_x_id = 0) in;
layout(constant_id = 3) const uint MODE = 0;

#define KVG_OWN_PC
#include "common.glsl"
#include "select.glsl"

#define CHUNK 4096u

layout(push_constant) uniform PC { uint n, x_off; } pc;
layout(std430, set = 0, binding = 2) readonly buffer X { uint xbits[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { uint result[]; };
layout(std430, set = 0, binding = 7) buffer Part { uvec2 part[]; };

shared uint best_k[WG];
shared uint best_i[WG];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint row = gl_WorkGroupID.y;
    uint chunks = (pc.n + CHUNK - 1u) / CHUNK; // pass 0's G
    uint begin = MODE == 0u ? gl_WorkGroupID.x * CHUNK : 0u;
    uint end = MODE == 0u ? min(pc.n, begin + CHUNK) : pc.n;
    uint x0 = pc.x_off + row * pc.n, p0 = row * pc.n; // pass 0: row's values; pass 1: row's pairs
    // key 0 is below every real key: an invocation without values never wins
    uint bk = 0u, bi = 0xffffffffu;
    for (uint i = begin + tid; i < end; i += WG) {
        uint k, id;
        if (MODE == 0u) {
            k = kvg_key(xbits[x0 + i]);
            id = i;
        } else {
            k = part[p0 + i].x;
            id = part[p0 + i].y;
        }
        if (kvg_before(k, id, bk, bi)) {
            bk = k;
            bi = id;
        }
    }
    best_k[tid] = bk;
    best_i[tid] = bi;
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        barrier();
        if (tid < s && kvg_before(best_k[tid + s], best_i[tid + s], best_k[tid], best_i[tid])) {
            best_k[tid] = best_k[tid + s];
            best_i[tid] = best_i[tid + s];
        }
    }
    barrier();
    if (tid != 0u) return;
    if (MODE == 0u && chunks > 1u) part[row * chunks + gl_WorkGroupID.x] = uvec2(best_k[0], best_i[0]);
    else result[row] = best_i[0];
}
