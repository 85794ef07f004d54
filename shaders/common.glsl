// common.glsl: declarations every kvgen kernel shares.
//
// All kernels use one pipeline layout: set 0 holds eight storage buffers (unused ones are bound
// to a small dummy buffer) and a 128-byte push-constant range. Binding roles:
//   0 params   per-step values written by the host (position, token ids; a batched decode's
//              per-token positions and page tables), so that a recorded decode command buffer
//              can be replayed unchanged
//   1 weights  a repacked weight matrix part (see weights.glsl)
//   2 input    activations, f32, one row per token (stride a multiple of 4)
//   3 output   activations, f32
//   4 norm     RMSNorm weight (f32, zero-padded)
//   5 KV pool  the paged KV pool's slabs (an array of up to 8 buffers; f16 pairs packed in
//              uint, f32 bits or q8_0 / q4_0 blocks; see kv.glsl)
//   6 bias     the QKV projection's biases (epilogue.glsl, flag EPI_F_BIAS), else unused (the
//              dummy buffer)
//   7 aux      RoPE cos/sin table (one per distinct RoPE base and scale of the layers), or
//              attention partial results
//   8 (uniform, dynamic offset) a window of the input activations; 9 (uniform) the RMSNorm
//              weight: the lane mat-vec reads these through uniform buffers (see matvec.comp)
//   10 page table  a session's KV page table (kv.glsl)
//   11 LoRA delta  what a step's LoRA adapters add to a mat-mul's outputs, per token
//              (epilogue.glsl, EPI_F_LORA; written by lora.comp)
#ifndef KVG_COMMON_GLSL
#define KVG_COMMON_GLSL

layout(std430, set = 0, binding = 0) readonly buffer Params {
    uint pos0;   // position of the first token of this step
    uint batch;  // 0, or a batched decode (one token each of several sessions): token t's
                 // position is tokens[batch + 2t] and its page table starts at entry
                 // tokens[batch + 2t + 1] of binding 10
    uint p_pad1, p_pad2;
    int tokens[];
} params;

// the position of token t of this step
uint kvg_pos(uint t) { return params.batch == 0u ? params.pos0 + t : uint(params.tokens[params.batch + 2u * t]); }
// the first page-table entry of token t's session for a layer whose group's table starts at
// entry tab of a session's tables (pc.pt_base: 0, or the local layers' table)
uint kvg_tab(uint t, uint tab) {
    return (params.batch == 0u ? 0u : uint(params.tokens[params.batch + 2u * t + 1u])) + tab;
}

// The push constants of the weight kernels (embed, matvec, gemm); others define their own.
#ifndef KVG_OWN_PC
layout(push_constant) uniform PC {
    uint nrows;     // rows in this weight part
    uint nb;        // 32-element blocks per row (row length padded to 32 with zeros)
    uint scale_off; // word offset of the scales inside the part
    uint ncols;     // tokens in this step
    uint ldx;       // input stride per token (floats)
    uint ldo;       // output stride per token (floats)
    uint row0;      // global row of the part's first row
    uint x_off;     // input offset in floats (multiple of 4)
    uint kreal;     // true row length (norm mean divisor)
    float eps;      // RMSNorm epsilon
    uint nq;        // qkv mode: rows of Q
    uint nk;        // qkv mode: rows of K (== rows of V)
    uint hd;        // head dim
    uint n_rot;     // rotated dims per head
    uint n_ctx;     // cache capacity in positions
    uint o_off;     // output offset in floats
    uint c0;        // first token of this dispatch (lane mat-vec with uniform windows)
    uint kv_layer;  // KV: element offset of this layer inside a page (kv.glsl)
    uint kv_page;   // KV: elements per page
    uint kv_v;      // KV: offset of V after K inside a page's layer
    uint pt_base;   // KV: first entry of the page table in binding 10
    uint flags;     // epilogue options (EPI_F_* in epilogue.glsl)
    float cap;      // store mode: soft-capping of the results, cap * tanh(v / cap) (0: none)
    uint ldd;       // EPI_F_LORA: the delta's stride per token (floats)
    uint kv_raw;    // qkv mode, block pages (KV_BLOCK): where token t's raw K|V go (kv_store.comp)
} pc;
#endif

#endif
