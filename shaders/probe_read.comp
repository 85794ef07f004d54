#version 450
// probe_read.comp: streaming read of a large buffer, to measure the device's read bandwidth
// (the ceiling a bandwidth-bound decode step can reach). Each workgroup reads a contiguous slab
// of `per_group` vec4s, invocations interleaved so consecutive invocations read consecutive data.
// Dispatch: (groups, 1, 1), 64 invocations. Bindings: 2 data, 3 out (one float per workgroup,
// so the reads cannot be optimised away). Trip count: per_group / 64 (kept below 65,535).
layout(local_size_x = 64) in;
layout(push_constant) uniform PC { uint per_group; } pc;
layout(std430, set = 0, binding = 2) readonly buffer X { vec4 data[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { float result[]; };
shared float red[64];
void main() {
    uint tid = gl_LocalInvocationID.x;
    uint base = gl_WorkGroupID.x * pc.per_group;
    vec4 s = vec4(0.0);
    for (uint i = tid; i < pc.per_group; i += 64u) s += data[base + i];
    red[tid] = s.x + s.y + s.z + s.w;
    barrier();
    if (tid == 0u) {
        float t = 0.0;
        for (uint i = 0u; i < 64u; i++) t += red[i];
        result[gl_WorkGroupID.x] = t;
    }
}
