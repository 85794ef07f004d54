// epilogue.glsl: where a weight kernel (matvec, gemm) puts its results. Results come in row
// pairs (r even, r + 1) so RoPE (adjacent pairs) and SwiGLU (gate/up rows interleaved at upload)
// can be fused here. MODE (specialization constant 3):
//   0 store   out[t*ldo + o_off + r] = v
//   1 add     out[...] += v                      (residual add fused into the projection)
//   2 qkv     rows [0,nq): Q with RoPE -> out; [nq,nq+nk): K with RoPE -> the KV pool (binding 5);
//             [nq+nk, nq+2nk): V -> the KV pool, at position kvg_pos(t) of the token's page table
//             (binding 10; addressing: kv.glsl)
//   3 swiglu  out[t*ldo + r/2] = silu(v_r) * v_{r+1}
#ifndef KVG_EPILOGUE_GLSL
#define KVG_EPILOGUE_GLSL

layout(std430, set = 0, binding = 3) buffer Out { float yout[]; };
layout(std430, set = 0, binding = 7) readonly buffer Rope { vec2 rope_cs[]; };

#include "kv.glsl"

// r: global even row; has1: row r + 1 exists
void store_pair(uint r, uint t, float v0, float v1, bool has1) {
    uint o = t * pc.ldo + pc.o_off;
    if (MODE == 0u) {
        yout[o + r] = v0;
        if (has1) yout[o + r + 1u] = v1;
    } else if (MODE == 1u) {
        yout[o + r] += v0;
        if (has1) yout[o + r + 1u] += v1;
    } else if (MODE == 3u) {
        yout[o + (r >> 1)] = v0 / (1.0 + exp(-v0)) * v1;
    } else {
        uint pos = kvg_pos(t);
        uint nqk = pc.nq + pc.nk;
        if (r < nqk) {
            uint d = (r < pc.nq ? r : r - pc.nq) % pc.hd;
            if (d < pc.n_rot) {
                vec2 cs = rope_cs[pos * (pc.n_rot >> 1) + (d >> 1)];
                float a = v0 * cs.x - v1 * cs.y;
                float b = v0 * cs.y + v1 * cs.x;
                v0 = a;
                v1 = b;
            }
        }
        if (r < pc.nq) {
            yout[o + r] = v0;
            yout[o + r + 1u] = v1;
        } else {
            bool is_k = r < nqk;
            uint i = is_k ? r - pc.nq : r - nqk;
            uint h = i / pc.hd, d = i % pc.hd;
            kv_ref kr = kv_locate(kvg_tab(t, pc.pt_base), pc.kv_layer, pc.kv_v, pc.kv_page, pc.hd, is_k, h, pos);
            kv_store2(kr, d, vec2(v0, v1));
        }
    }
}

#endif
