#version 450
#extension GL_GOOGLE_include_directive : require
// argmax.comp: index of the largest of n floats (the lowest index on ties), for greedy decoding
// so that only one integer is read back.
// Dispatch: (1, 1, 1), 256 invocations, each scanning n/256 values.
// Bindings: 2 values (at x_off), 3 out (word 0 receives the index).
layout(local_size_x = 256) in;

#define KVG_OWN_PC
#include "common.glsl"

layout(push_constant) uniform PC { uint n, x_off; } pc;
layout(std430, set = 0, binding = 2) readonly buffer X { float xin[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { uint result[]; };

shared float best_v[256];
shared uint best_i[256];

void main() {
    uint tid = gl_LocalInvocationID.x;
    float bv = -1.0 / 0.0;
    uint bi = 0xffffffffu;
    for (uint i = tid; i < pc.n; i += 256u) {
        float v = xin[pc.x_off + i];
        if (v > bv || bi == 0xffffffffu) {
            bv = v;
            bi = i;
        }
    }
    best_v[tid] = bv;
    best_i[tid] = bi;
    for (uint s = 128u; s > 0u; s >>= 1) {
        barrier();
        if (tid < s) {
            float ov = best_v[tid + s];
            uint oi = best_i[tid + s];
            if (oi != 0xffffffffu && (best_i[tid] == 0xffffffffu || ov > best_v[tid] ||
                                      (ov == best_v[tid] && oi < best_i[tid]))) {
                best_v[tid] = ov;
                best_i[tid] = oi;
            }
        }
    }
    barrier();
    if (tid == 0u) result[0] = best_i[0];
}
