// epilogue.glsl: where a weight kernel (matvec, gemm) puts its results. Results come in row
// pairs (r even, r + 1) so RoPE (adjacent pairs) and the gated activations (gate/up rows
// interleaved at upload) can be fused here. MODE (specialization constant 3):
//   0 store   out[t*ldo + o_off + r] = v         (pc.cap > 0: cap * tanh(v / cap), final logits)
//   1 add     out[...] += v                      (residual add fused into the projection)
//   2 qkv     rows [0,nq): Q with RoPE -> out; [nq,nq+nk): K with RoPE -> the KV pool (binding 5);
//             [nq+nk, nq+2nk): V -> the KV pool, at position kvg_pos(t) of the token's page table
//             (binding 10; addressing: kv.glsl). RoPE rotates adjacent pairs with the layer's
//             cos/sin table (binding 7); NEOX models' Q/K rows are permuted at upload so that
//             their pairs (i, i + n_rot/2) are adjacent rows (core/vulkan/vk_backend.c).
//   3 swiglu  out[t*ldo + r/2] = silu(v_r) * v_{r+1}
//   4 geglu   out[t*ldo + r/2] = gelu_tanh(v_r) * v_{r+1}
//   5 gelu    out[t*ldo + r] = gelu(v_r), the exact (erf) GELU, no gate (an encoder's FFN up)
// pc.flags (any mode):
//   EPI_F_LORA    v_r += d[t*ldd + r] first (binding 11: the LoRA delta of the step's tokens,
//                 by global row; lora.comp)
//   EPI_F_BIAS    v_r += bias[r] (binding 6: the projection's biases, by global row)
//   EPI_F_RAW_QK  (qkv mode) Q and K rows are stored as they are, at out[t*ldo + r], for the head
//                 norms op (rms_norm.comp) to norm, rotate and write to the KV pool; V as above
// block pages (KV_BLOCK: q8_0, q4_0): K (rotated) and V go to out[kv_raw + t*2nk + r - nq] (with EPI_F_RAW_QK,
// V to out[t*ldo + r] with Q and K) for kv_store.comp, which quantizes whole blocks
#ifndef KVG_EPILOGUE_GLSL
#define KVG_EPILOGUE_GLSL

layout(std430, set = 0, binding = 3) buffer Out { float yout[]; };
layout(std430, set = 0, binding = 6) readonly buffer Bias { float bias[]; };
layout(std430, set = 0, binding = 7) readonly buffer Rope { vec2 rope_cs[]; };
layout(std430, set = 0, binding = 11) readonly buffer LoraDelta { float lora_d[]; };

#include "kv.glsl"

const uint EPI_F_BIAS = 1u, EPI_F_RAW_QK = 2u, EPI_F_LORA = 4u;

// tanh with its argument bounded: beyond +-15 it is +-1 in f32 anyway, and an exp-based
// implementation cannot overflow into inf / inf
float kvg_tanh(float x) { return tanh(clamp(x, -15.0, 15.0)); }

// erf(x) by Abramowitz and Stegun's rational approximation 7.1.26 (absolute error <= 1.5e-7:
// GLSL has no erf), odd-symmetric
float kvg_erf(float x) {
    float a = abs(x);
    float k = 1.0 / (1.0 + 0.3275911 * a);
    float p = k * (0.254829592 + k * (-0.284496736 + k * (1.421413741 + k * (-1.453152027 + k * 1.061405429))));
    float y = 1.0 - p * exp(-a * a);
    return x < 0.0 ? -y : y;
}

// the exact GELU, x * Phi(x)
float kvg_gelu(float x) { return 0.5 * x * (1.0 + kvg_erf(x * 0.7071067811865476)); }

// r: global even row; has1: row r + 1 exists
void store_pair(uint r, uint t, float v0, float v1, bool has1) {
    uint o = t * pc.ldo + pc.o_off;
    if ((pc.flags & EPI_F_LORA) != 0u) {
        v0 += lora_d[t * pc.ldd + r];
        if (has1) v1 += lora_d[t * pc.ldd + r + 1u];
    }
    if ((pc.flags & EPI_F_BIAS) != 0u) {
        v0 += bias[r];
        if (has1) v1 += bias[r + 1u];
    }
    if (MODE == 0u) {
        if (pc.cap > 0.0) {
            v0 = pc.cap * kvg_tanh(v0 / pc.cap);
            v1 = pc.cap * kvg_tanh(v1 / pc.cap);
        }
        yout[o + r] = v0;
        if (has1) yout[o + r + 1u] = v1;
    } else if (MODE == 1u) {
        yout[o + r] += v0;
        if (has1) yout[o + r + 1u] += v1;
    } else if (MODE == 3u) {
        yout[o + (r >> 1)] = v0 / (1.0 + exp(-v0)) * v1;
    } else if (MODE == 4u) {
        float u = 0.7978845608028654 * (v0 + 0.044715 * v0 * v0 * v0); // sqrt(2 / pi) (x + 0.044715 x^3)
        yout[o + (r >> 1)] = 0.5 * v0 * (1.0 + kvg_tanh(u)) * v1;
    } else if (MODE == 5u) {
        yout[o + r] = kvg_gelu(v0);
        if (has1) yout[o + r + 1u] = kvg_gelu(v1);
    } else {
        uint pos = kvg_pos(t);
        uint nqk = pc.nq + pc.nk;
        if ((r < nqk || KV_QB != 0u) && (pc.flags & EPI_F_RAW_QK) != 0u) { // (block pages: V too)
            yout[o + r] = v0;
            yout[o + r + 1u] = v1;
            return;
        }
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
        } else if (KV_QB != 0u) {
            yout[pc.kv_raw + t * 2u * pc.nk + r - pc.nq] = v0;
            yout[pc.kv_raw + t * 2u * pc.nk + r - pc.nq + 1u] = v1;
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
