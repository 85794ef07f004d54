#version 450
#extension GL_GOOGLE_include_directive : require
// argmax.comp: index of the largest of n floats (ranked as in select.glsl: lowest index on
// ties, NaN never wins), for greedy decoding so that only one integer is read back.
// Dispatch: (1, rows, 1): workgroup y takes row y, the n values at x_off + y * n; WG (a power of
// two, spec constant 0: 256, fewer where the device allows less) invocations each scan n/WG
// values (lavapipe, whose 1,024 invocations always give WG = 256, stops a loop after 65,535
// trips: vocabularies up to ~16.7M).
// Bindings: 2 values (float bits), 3 out (word y receives row y's index).
layout(constant_id = 0) const uint WG = 256;
layout(local_size_x_id = 0) in;

#define KVG_OWN_PC
#include "common.glsl"
#include "select.glsl"

layout(push_constant) uniform PC { uint n, x_off; } pc;
layout(std430, set = 0, binding = 2) readonly buffer X { uint xbits[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { uint result[]; };

shared uint best_k[WG];
shared uint best_i[WG];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint row = gl_WorkGroupID.y, x0 = pc.x_off + row * pc.n;
    // key 0 is below every real key: an invocation without values never wins
    uint bk = 0u, bi = 0xffffffffu;
    for (uint i = tid; i < pc.n; i += WG) {
        uint k = kvg_key(xbits[x0 + i]);
        if (bi == 0xffffffffu || k > bk) { // ascending i: a tie keeps the lower index
            bk = k;
            bi = i;
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
    if (tid == 0u) result[row] = best_i[0];
}
