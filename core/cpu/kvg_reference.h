/* kvg_reference.h: the CPU reference's small math helpers, exposed so tests can check them
 * by hand and device backends can reuse them as the oracle (private). */
#ifndef KVG_REFERENCE_H
#define KVG_REFERENCE_H
#include <stdbool.h>
#include <stddef.h>

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]; out may alias x. */
void kvg_ref_rmsnorm(float *out, const float *x, const float *w, int n, float eps);

/* llama.cpp's "normal" RoPE on one head vector: rotates the adjacent pairs (v[2i], v[2i+1])
 * by theta = pos * base^(-2i/n_rot) for i < n_rot/2; elements past n_rot are left alone. */
void kvg_ref_rope(float *v, int n_rot, int pos, float base);

/* RoPE as a layer of a model applies it: pairs (2i, 2i+1) (neox false) or (i, i + n_rot/2)
 * (neox true, GPT-NeoX style), theta_i = pos * scale * base^(-2i/n_rot) / factors[i]
 * (factors NULL: 1), cos and sin multiplied by attn_factor (0: 1; ggml's mscale, so the
 * rotated dimensions are scaled by it). Angles in double, as kvg_ref_rope. */
typedef struct kvg_ref_rope_params {
    int n_rot;
    bool neox;
    float base, scale;
    const float *factors; /* n_rot/2, or NULL */
    float attn_factor;
} kvg_ref_rope_params;
void kvg_ref_rope_apply(const kvg_ref_rope_params *r, float *v, int pos);

/* gelu with the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
float kvg_ref_gelu_tanh(float x);

/* In-place softmax over x[0..n), computed in f32 after subtracting the maximum. */
void kvg_ref_softmax(float *x, int n);

/* silu(x) = x * sigmoid(x) */
float kvg_ref_silu(float x);

#endif
