/* kvg_reference.h: the CPU reference's small math helpers, exposed so tests can check them
 * by hand and device backends can reuse them as the oracle (private). */
#ifndef KVG_REFERENCE_H
#define KVG_REFERENCE_H
#include <stddef.h>

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]; out may alias x. */
void kvg_ref_rmsnorm(float *out, const float *x, const float *w, int n, float eps);

/* llama.cpp's "normal" RoPE on one head vector: rotates the adjacent pairs (v[2i], v[2i+1])
 * by theta = pos * base^(-2i/n_rot) for i < n_rot/2; elements past n_rot are left alone. */
void kvg_ref_rope(float *v, int n_rot, int pos, float base);

/* In-place softmax over x[0..n), computed in f32 after subtracting the maximum. */
void kvg_ref_softmax(float *x, int n);

/* silu(x) = x * sigmoid(x) */
float kvg_ref_silu(float x);

#endif
