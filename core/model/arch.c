/* arch.c: the architecture table. A row holds what kvgen needs to know of one GGUF
 * general.architecture; only rows marked complete run, the others are there so that a load
 * says exactly which feature is missing instead of "unknown architecture". */
#include <stdio.h>
#include <string.h>
#include "kvg_arch.h"

static const struct {
    const char *pattern, *short_name;
} tensor_names[KVG_T_COUNT] = {
    [KVG_T_TOKEN_EMBD] = {"token_embd.weight", "token_embd"},
    [KVG_T_OUTPUT_NORM] = {"output_norm.weight", "output_norm"},
    [KVG_T_OUTPUT] = {"output.weight", "output"},
    [KVG_T_ROPE_FREQS] = {"rope_freqs.weight", "rope_freqs"},
    [KVG_T_ROPE_FACTORS_LONG] = {"rope_factors_long.weight", "rope_factors_long"},
    [KVG_T_ROPE_FACTORS_SHORT] = {"rope_factors_short.weight", "rope_factors_short"},
    [KVG_T_POS_EMBD] = {"position_embd.weight", "position_embd"},
    [KVG_T_TOKEN_TYPES] = {"token_types.weight", "token_types"},
    [KVG_T_TOKEN_EMBD_NORM] = {"token_embd_norm.weight", "token_embd_norm"},
    [KVG_T_TOKEN_EMBD_NORM_BIAS] = {"token_embd_norm.bias", "token_embd_norm.bias"},
    [KVG_T_ATTN_NORM] = {"blk.%d.attn_norm.weight", "attn_norm"},
    [KVG_T_ATTN_Q] = {"blk.%d.attn_q.weight", "attn_q"},
    [KVG_T_ATTN_K] = {"blk.%d.attn_k.weight", "attn_k"},
    [KVG_T_ATTN_V] = {"blk.%d.attn_v.weight", "attn_v"},
    [KVG_T_ATTN_QKV] = {"blk.%d.attn_qkv.weight", "attn_qkv"},
    [KVG_T_ATTN_OUT] = {"blk.%d.attn_output.weight", "attn_output"},
    [KVG_T_ATTN_Q_BIAS] = {"blk.%d.attn_q.bias", "attn_q.bias"},
    [KVG_T_ATTN_K_BIAS] = {"blk.%d.attn_k.bias", "attn_k.bias"},
    [KVG_T_ATTN_V_BIAS] = {"blk.%d.attn_v.bias", "attn_v.bias"},
    [KVG_T_ATTN_Q_NORM] = {"blk.%d.attn_q_norm.weight", "attn_q_norm"},
    [KVG_T_ATTN_K_NORM] = {"blk.%d.attn_k_norm.weight", "attn_k_norm"},
    [KVG_T_ATTN_POST_NORM] = {"blk.%d.post_attention_norm.weight", "post_attention_norm"},
    [KVG_T_FFN_NORM] = {"blk.%d.ffn_norm.weight", "ffn_norm"},
    [KVG_T_FFN_GATE] = {"blk.%d.ffn_gate.weight", "ffn_gate"},
    [KVG_T_FFN_UP] = {"blk.%d.ffn_up.weight", "ffn_up"},
    [KVG_T_FFN_DOWN] = {"blk.%d.ffn_down.weight", "ffn_down"},
    [KVG_T_FFN_POST_NORM] = {"blk.%d.post_ffw_norm.weight", "post_ffw_norm"},
    [KVG_T_ATTN_OUT_BIAS] = {"blk.%d.attn_output.bias", "attn_output.bias"},
    [KVG_T_ATTN_OUT_NORM] = {"blk.%d.attn_output_norm.weight", "attn_output_norm"},
    [KVG_T_ATTN_OUT_NORM_BIAS] = {"blk.%d.attn_output_norm.bias", "attn_output_norm.bias"},
    [KVG_T_FFN_UP_BIAS] = {"blk.%d.ffn_up.bias", "ffn_up.bias"},
    [KVG_T_FFN_DOWN_BIAS] = {"blk.%d.ffn_down.bias", "ffn_down.bias"},
    [KVG_T_LAYER_OUT_NORM] = {"blk.%d.layer_output_norm.weight", "layer_output_norm"},
    [KVG_T_LAYER_OUT_NORM_BIAS] = {"blk.%d.layer_output_norm.bias", "layer_output_norm.bias"},
};

const char *kvg_tensor_pattern(kvg_tensor_role role) {
    return role < KVG_T_COUNT ? tensor_names[role].pattern : "?";
}

const char *kvg_tensor_short(kvg_tensor_role role) {
    return role < KVG_T_COUNT ? tensor_names[role].short_name : "?";
}

static const char *const feature_names[KVG_F_COUNT] = {
    "attention biases (attn_q.bias, attn_k.bias, attn_v.bias)",
    "Q/K head norms (attn_q_norm, attn_k_norm)",
    "post-attention and post-FFN norms (post_attention_norm, post_ffw_norm)",
    "NEOX-style (half-split) RoPE",
    "RoPE frequency factors (rope_freqs)",
    "a GELU-tanh gated feed-forward",
    "embeddings scaled by sqrt(n_embd)",
    "logit soft-capping (attn_logit_softcapping, final_logit_softcapping)",
    "sliding-window attention (attention.sliding_window)",
    "head_count x head size different from embedding_length (attention.key_length)",
    "RoPE with an attention factor (rope.scaling.attn_factor)",
    "the encoder forward pass (bidirectional attention without a cache, post-LayerNorm blocks, learned positions)",
};

const char *kvg_feature_name(uint32_t feature) {
    for (int i = 0; i < KVG_F_COUNT; i++)
        if (feature == 1u << i) return feature_names[i];
    return "an unnamed feature";
}

static const kvg_fused fused_layouts[KVG_FUSED_COUNT] = {
    {KVG_T_ATTN_QKV, 3, {KVG_T_ATTN_Q, KVG_T_ATTN_K, KVG_T_ATTN_V}},
    {KVG_T_FFN_UP, 2, {KVG_T_FFN_GATE, KVG_T_FFN_UP}},
};

const kvg_fused *kvg_fused_layout(uint32_t kind) {
    for (int i = 0; i < KVG_FUSED_COUNT; i++)
        if (kind == 1u << i) return &fused_layouts[i];
    return NULL;
}

#define B(role) KVG_T_BIT(KVG_T_##role)
/* the tensors of a llama block and its ends */
#define LLAMA_TENSORS                                                                                          \
    (B(TOKEN_EMBD) | B(OUTPUT_NORM) | B(ATTN_NORM) | B(ATTN_Q) | B(ATTN_K) | B(ATTN_V) | B(ATTN_OUT) |         \
     B(FFN_NORM) | B(FFN_GATE) | B(FFN_UP) | B(FFN_DOWN))

/* Facts of the rows other than llama follow llama.cpp's loaders for those architectures. */
static const kvg_arch rows[] = {
    {.name = "llama", .prefix = "llama", .required = LLAMA_TENSORS, .optional = B(OUTPUT) | B(ROPE_FREQS),
     .rope = KVG_ROPE_ADJACENT, .act = KVG_ACT_SILU_GATED, .complete = true},
    {.name = "qwen2", .prefix = "qwen2",
     .required = LLAMA_TENSORS | B(ATTN_Q_BIAS) | B(ATTN_K_BIAS) | B(ATTN_V_BIAS), .optional = B(OUTPUT),
     .rope = KVG_ROPE_NEOX, .act = KVG_ACT_SILU_GATED, .complete = true},
    {.name = "qwen3", .prefix = "qwen3", .required = LLAMA_TENSORS | B(ATTN_Q_NORM) | B(ATTN_K_NORM),
     .optional = B(OUTPUT), .rope = KVG_ROPE_NEOX, .act = KVG_ACT_SILU_GATED, .complete = true},
    {.name = "gemma2", .prefix = "gemma2", .required = LLAMA_TENSORS | B(ATTN_POST_NORM) | B(FFN_POST_NORM),
     .optional = B(OUTPUT), .rope = KVG_ROPE_NEOX, .act = KVG_ACT_GELU_TANH_GATED, .embd_scale = true,
     .softcap = true, .sliding_window = true, .swa_pattern = 2, .complete = true},
    {.name = "gemma3", .prefix = "gemma3",
     .required = LLAMA_TENSORS | B(ATTN_Q_NORM) | B(ATTN_K_NORM) | B(ATTN_POST_NORM) | B(FFN_POST_NORM),
     .optional = B(OUTPUT), .rope = KVG_ROPE_NEOX, .act = KVG_ACT_GELU_TANH_GATED, .embd_scale = true,
     .sliding_window = true, .swa_pattern = 6, .rope_base_swa = 10000.0f, .complete = true},
    /* phi3: llama.cpp ignores the file's attention.sliding_window for this architecture (it runs
     * every layer global), and so does kvgen, to compute what it computes */
    {.name = "phi3", .prefix = "phi3",
     .required = B(TOKEN_EMBD) | B(OUTPUT_NORM) | B(ATTN_NORM) | B(ATTN_QKV) | B(ATTN_OUT) | B(FFN_NORM) |
                 B(FFN_UP) | B(FFN_DOWN),
     .optional = B(OUTPUT) | B(ROPE_FACTORS_LONG) | B(ROPE_FACTORS_SHORT), .rope = KVG_ROPE_NEOX,
     .act = KVG_ACT_SILU_GATED, .fused = KVG_FUSED_QKV | KVG_FUSED_GATE_UP, .rope_factors = true,
     .complete = true},
    /* bert, as llama.cpp's converter writes it: no output norm or logits (an encoder embeds);
     * bert.pooling_type says how its hidden states become one vector (kvgen_embed) */
    {.name = "bert", .prefix = "bert",
     .required = B(TOKEN_EMBD) | B(POS_EMBD) | B(TOKEN_EMBD_NORM) | B(TOKEN_EMBD_NORM_BIAS) | B(ATTN_Q) |
                 B(ATTN_K) | B(ATTN_V) | B(ATTN_Q_BIAS) | B(ATTN_K_BIAS) | B(ATTN_V_BIAS) | B(ATTN_OUT) |
                 B(ATTN_OUT_BIAS) | B(ATTN_OUT_NORM) | B(ATTN_OUT_NORM_BIAS) | B(FFN_UP) | B(FFN_UP_BIAS) |
                 B(FFN_DOWN) | B(FFN_DOWN_BIAS) | B(LAYER_OUT_NORM) | B(LAYER_OUT_NORM_BIAS),
     .optional = B(TOKEN_TYPES), .act = KVG_ACT_GELU, .encoder = true, .complete = true},
};
#undef B

const kvg_arch *kvg_arch_find(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (strlen(rows[i].name) == len && memcmp(rows[i].name, name, len) == 0) return &rows[i];
    return NULL;
}

const kvg_arch *kvg_arch_rows(size_t *n) {
    *n = sizeof rows / sizeof rows[0];
    return rows;
}

void kvg_arch_list(bool complete, char *buf, size_t size) {
    size_t len = 0;
    if (size) buf[0] = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (rows[i].complete != complete) continue;
        int w = snprintf(len < size ? buf + len : NULL, len < size ? size - len : 0, "%s%s", len ? ", " : "",
                         rows[i].name);
        if (w > 0) len += (size_t)w;
    }
}
