/* kvg_arch.h: the architecture table (private). One row per GGUF general.architecture kvgen
 * knows: where its metadata lives, which tensors it has, and the facts of its forward pass
 * (RoPE style, activation, norms, attention variants), read by model.c to describe a file and
 * by every backend instead of hard-coding one architecture. */
#ifndef KVG_ARCH_H
#define KVG_ARCH_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Tensor roles. Per-layer names are printf patterns taking the layer index. */
typedef enum kvg_tensor_role {
    KVG_T_TOKEN_EMBD,
    KVG_T_OUTPUT_NORM,
    KVG_T_OUTPUT,
    KVG_T_ROPE_FREQS,
    KVG_T_ROPE_FACTORS_LONG,
    KVG_T_ROPE_FACTORS_SHORT,
    KVG_T_POS_EMBD,             /* learned absolute positions (bert) */
    KVG_T_TOKEN_TYPES,          /* token-type (segment) embeddings (bert) */
    KVG_T_TOKEN_EMBD_NORM,      /* LayerNorm of the summed embeddings (bert) */
    KVG_T_TOKEN_EMBD_NORM_BIAS,
    KVG_T_ATTN_NORM,
    KVG_T_ATTN_Q,
    KVG_T_ATTN_K,
    KVG_T_ATTN_V,
    KVG_T_ATTN_QKV,
    KVG_T_ATTN_OUT,
    KVG_T_ATTN_Q_BIAS,
    KVG_T_ATTN_K_BIAS,
    KVG_T_ATTN_V_BIAS,
    KVG_T_ATTN_Q_NORM,
    KVG_T_ATTN_K_NORM,
    KVG_T_ATTN_POST_NORM,
    KVG_T_FFN_NORM,
    KVG_T_FFN_GATE,
    KVG_T_FFN_UP,
    KVG_T_FFN_DOWN,
    KVG_T_FFN_POST_NORM,
    KVG_T_ATTN_OUT_BIAS,        /* the post-norm encoder block (bert): biases of attn_output, */
    KVG_T_ATTN_OUT_NORM,        /* LayerNorm of x + attention, */
    KVG_T_ATTN_OUT_NORM_BIAS,
    KVG_T_FFN_UP_BIAS,          /* biases of the ungated feed-forward, */
    KVG_T_FFN_DOWN_BIAS,
    KVG_T_LAYER_OUT_NORM,       /* LayerNorm of x + feed-forward */
    KVG_T_LAYER_OUT_NORM_BIAS,
    KVG_T_COUNT
} kvg_tensor_role;

#define KVG_T_BIT(role) ((uint64_t)1 << (role)) /* KVG_T_COUNT is above 32 */
#define KVG_T_FIRST_LAYER_ROLE KVG_T_ATTN_NORM /* roles from here on are per layer */

/* the GGUF name pattern of a role ("blk.%d.attn_q.weight"), the same for every architecture
 * (GGUF's convention); its short form for messages ("attn_q.bias") */
const char *kvg_tensor_pattern(kvg_tensor_role role);
const char *kvg_tensor_short(kvg_tensor_role role);

typedef enum kvg_rope_style {
    KVG_ROPE_ADJACENT = 0, /* rotates pairs (2i, 2i+1): llama, ggml's rope mode 0 */
    KVG_ROPE_NEOX          /* rotates pairs (i, i + n_rot/2): GPT-NeoX, qwen, gemma, phi3 */
} kvg_rope_style;

typedef enum kvg_activation {
    KVG_ACT_SILU_GATED = 0, /* silu(gate) * up (SwiGLU) */
    KVG_ACT_GELU_TANH_GATED, /* gelu_tanh(gate) * up (GeGLU) */
    KVG_ACT_GELU             /* gelu(up), the exact (erf) GELU, no gate: bert */
} kvg_activation;

/* Features of a forward pass beyond the plain llama one. A model's set (kvg_weights.features)
 * comes from its row and its file; a backend lists those it runs (kvg_backend_ops.features)
 * and a load on a backend lacking one is refused (kvg_arch_check_backend). */
enum {
    KVG_F_ATTN_BIAS = 1u << 0,      /* Q/K/V projection biases */
    KVG_F_QK_NORM = 1u << 1,        /* RMS norms of each Q and K head before RoPE */
    KVG_F_POST_NORMS = 1u << 2,     /* norms of the attention and FFN outputs before the residual add */
    KVG_F_ROPE_NEOX = 1u << 3,      /* half-split RoPE */
    KVG_F_ROPE_FREQS = 1u << 4,     /* per-dimension RoPE frequency factors (rope_freqs) */
    KVG_F_GELU = 1u << 5,           /* GELU-tanh gated FFN */
    KVG_F_EMBD_SCALE = 1u << 6,     /* embeddings scaled by sqrt(n_embd) */
    KVG_F_SOFTCAP = 1u << 7,        /* attention / final logit soft-capping */
    KVG_F_SLIDING_WINDOW = 1u << 8, /* sliding-window attention on some layers */
    KVG_F_WIDE_HEADS = 1u << 9,     /* n_head * head_dim != n_embd */
    KVG_F_ROPE_ATTN_FACTOR = 1u << 10, /* the rotated dimensions scaled by rope.scaling.attn_factor */
    KVG_F_ENCODER = 1u << 11,       /* a bidirectional encoder without a cache (kvg_arch.encoder) */
};
#define KVG_F_COUNT 12

/* A fused matrix: one tensor of the file whose rows are those of several roles, one after
 * another (ne[0] the same). The description presents each part as a view (a row range of the
 * same bytes), so backends only ever see the parts. */
typedef enum kvg_fused_kind {
    KVG_FUSED_QKV = 1u << 0,     /* attn_qkv: the rows of attn_q, then attn_k, then attn_v */
    KVG_FUSED_GATE_UP = 1u << 1, /* ffn_up: the rows of ffn_gate, then ffn_up (2 x n_ff) */
} kvg_fused_kind;
#define KVG_FUSED_COUNT 2
#define KVG_FUSED_MAX_PARTS 3

typedef struct kvg_fused {
    kvg_tensor_role whole;                     /* the file's tensor */
    int n_parts;
    kvg_tensor_role parts[KVG_FUSED_MAX_PARTS]; /* the roles its row ranges stand for, in order */
} kvg_fused;

/* the layout of one kind (KVG_FUSED_QKV, ...), NULL for another value */
const kvg_fused *kvg_fused_layout(uint32_t kind);

/* what a feature is, for messages: "attention biases (attn_q.bias)" */
const char *kvg_feature_name(uint32_t feature);

typedef struct kvg_arch {
    const char *name;    /* general.architecture */
    const char *prefix;  /* metadata keys are "<prefix>.block_count", ... */
    uint64_t required;   /* KVG_T_BIT of the tensors every file of it has */
    uint64_t optional;   /* ... and of those it may have (output: untied; biases; ...) */
    kvg_rope_style rope;
    kvg_activation act;
    bool embd_scale;     /* x = embedding * sqrt(n_embd) */
    bool softcap;        /* reads <prefix>.attn_logit_softcapping / final_logit_softcapping */
    bool sliding_window; /* reads <prefix>.attention.sliding_window */
    int swa_pattern;     /* with a window: layer i is local when i % p < p - 1 (0: every layer) */
    float rope_base_swa; /* RoPE base of the local layers (0: the global one), unless the file has
                            <prefix>.rope.freq_base_swa */
    uint32_t fused;      /* KVG_FUSED_* bits: matrices the file stores fused (parts as views) */
    bool rope_factors;   /* reads rope_factors_long/short, rope.scaling.attn_factor and
                            rope.scaling.original_context_length (Phi-3's LongRoPE) */
    /* An encoder (bert): learned positions and token types summed into the embedding and
     * LayerNormed, then post-LayerNorm blocks (x = LN(x + attention), x = LN(x + FFN)) with
     * biases everywhere, an ungated GELU feed-forward, attention over the whole text both
     * ways, no cache, no logits: it only embeds (kvg_backend_ops.encode). */
    bool encoder;
    bool complete;       /* kvgen runs it: its facts are all implemented by some backend */
} kvg_arch;

/* the row for general.architecture = name[0..len), NULL when there is none */
const kvg_arch *kvg_arch_find(const char *name, size_t len);
/* the rows, in table order */
const kvg_arch *kvg_arch_rows(size_t *n);
/* "llama" (complete rows) or "qwen2, qwen3, ..." (the others) joined into buf */
void kvg_arch_list(bool complete, char *buf, size_t size);

#endif
