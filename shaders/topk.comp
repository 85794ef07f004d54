#version 450
#extension GL_GOOGLE_include_directive : require
// topk.comp: the K = 64 best of n floats, ranked as in select.glsl, best first, so that top-k
// sampling reads back 64 candidates instead of the vocabulary.
// Rows: workgroup y works on row y (a batch's logits, one row per sequence). Two passes
// (spec constant MODE):
//   0 (partial): workgroup (g, y) takes values [g*CHUNK, (g+1)*CHUNK) of row y, which starts
//     at x_off + y * n in binding 2 (float bits); writes its K best as (key, index) pairs to
//     binding 7 at (y * G + g) * K, G = ceil(n / CHUNK). Dispatch: (G, rows, 1).
//   1 (merge): workgroup y takes the n (key, index) pairs of row y from binding 7 at y * n and
//     writes the K best to binding 3 at y * K. Dispatch: (1, rows, 1).
// Each invocation keeps a sorted list of the best of its strided share (most values are
// rejected by one compare against its K-th); invocation 0 then merges the lists through
// shared memory. Missing entries are (0, 0xffffffff): key 0 ranks below every real value.
// Trip counts: CHUNK/WG values per invocation in pass 0 (256 at WG 32); n/WG pairs in pass 1.
// WG (spec constant 0): 32 invocations, using 16,512 bytes of shared memory; 16 or fewer where
// the device has less (16,384 is Vulkan's minimum).
layout(constant_id = 0) const uint WG = 32;
layout(local_size_x_id = 0) in;
layout(constant_id = 3) const uint MODE = 0;

#define KVG_OWN_PC
#include "common.glsl"
#include "select.glsl"

#define K 64u
#define CHUNK 8192u

layout(push_constant) uniform PC { uint n, x_off; } pc;
layout(std430, set = 0, binding = 2) readonly buffer X { uint xbits[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { uvec2 result[]; };
layout(std430, set = 0, binding = 7) buffer Part { uvec2 part[]; };

shared uint lk[WG * K];
shared uint li[WG * K];
shared uint lcount[WG];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint row = gl_WorkGroupID.y;
    uint x0 = pc.x_off + row * pc.n, p0 = row * pc.n; // pass 0: row's values; pass 1: row's pairs
    uint keys[K], ids[K];
    uint cnt = 0u;
    uint begin = MODE == 0u ? gl_WorkGroupID.x * CHUNK : 0u;
    uint end = MODE == 0u ? min(pc.n, begin + CHUNK) : pc.n;
    for (uint i = begin + tid; i < end; i += WG) {
        uint k, id;
        if (MODE == 0u) {
            k = kvg_key(xbits[x0 + i]);
            id = i;
        } else {
            k = part[p0 + i].x;
            id = part[p0 + i].y;
            if (id == 0xffffffffu) continue;
        }
        if (cnt == K && !kvg_before(k, id, keys[K - 1u], ids[K - 1u])) continue;
        uint j = cnt < K ? cnt : K - 1u; // insertion: shift the worse ones down
        while (j > 0u && kvg_before(k, id, keys[j - 1u], ids[j - 1u])) {
            keys[j] = keys[j - 1u];
            ids[j] = ids[j - 1u];
            j--;
        }
        keys[j] = k;
        ids[j] = id;
        if (cnt < K) cnt++;
    }
    for (uint j = 0u; j < cnt; j++) {
        lk[tid * K + j] = keys[j];
        li[tid * K + j] = ids[j];
    }
    lcount[tid] = cnt;
    barrier();
    if (tid != 0u) return;
    uint head[WG];
    for (uint t = 0u; t < WG; t++) head[t] = 0u;
    uint base = MODE == 0u ? (row * ((pc.n + CHUNK - 1u) / CHUNK) + gl_WorkGroupID.x) * K : row * K;
    for (uint r = 0u; r < K; r++) {
        uint bt = WG, bk = 0u, bid = 0xffffffffu;
        for (uint t = 0u; t < WG; t++) {
            if (head[t] >= lcount[t]) continue;
            uint k = lk[t * K + head[t]], id = li[t * K + head[t]];
            if (bt == WG || kvg_before(k, id, bk, bid)) {
                bt = t;
                bk = k;
                bid = id;
            }
        }
        if (bt < WG) head[bt]++;
        if (MODE == 0u) part[base + r] = uvec2(bk, bid);
        else result[base + r] = uvec2(bk, bid);
    }
}
