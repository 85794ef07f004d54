/* kvg_vk_backend.h: what the files of the Vulkan backend share (private to them): the model
 * and session structs, the step walker's state, and each file's entry points. Calls go down:
 * vk_backend.c -> vk_encode.c (an encoder's forward pass) -> vk_walk.c -> vk_lora.c, vk_kv.c ->
 * vk_weights.c -> vk_device.c (vk_hooks.c, the test hooks, beside vk_backend.c).
 *
 * Folder core/vulkan/ owns the Vulkan backend: the device layer (vk_device.c, kvg_vk.h, the
 * pipeline cache vk_pcache.c, device selection vk_select.c) and the forward pass on it; the
 * shaders it dispatches are in shaders/. */
#ifndef KVG_VK_BACKEND_H
#define KVG_VK_BACKEND_H
#include <string.h>
#include "kvg_backend.h"
#include "kvg_vk.h"
#include "kvg_vk_select.h"

/* the mat-mul epilogues (MODE in shaders/epilogue.glsl, matvec.comp, gemm.comp) and their flags */
enum { EPI_STORE = 0, EPI_ADD = 1, EPI_QKV = 2, EPI_SWIGLU = 3, EPI_GEGLU = 4, EPI_GELU = 5 };
enum { EPI_F_BIAS = 1, EPI_F_RAW_QK = 2, EPI_F_LORA = 4 };
/* the modes of shaders/rms_norm.comp */
enum { NORM_POST = 0, NORM_HEADS = 1, NORM_FINAL = 2 };

/* the most one-token sequences a batched decode step takes as its columns (a model's own limit,
 * vk_model.batch_cols, may be lower: its scratch's tokens per step, the device's binding range);
 * the columns' (position, table entry) pairs follow the token ids in params from this index */
#define VK_BATCH_MAX 64
#define VK_BATCH_AT VK_BATCH_MAX

/* distinct (RoPE base, position scale) pairs among a model's layers, one cos/sin table each */
#define VK_ROPE_VARIANTS 4
/* RoPE tables per variant: table k covers 2^(k+8) positions */
#define VK_ROPE_SIZES 13

/* A matrix part: rows [row0, row0 + rows) of its matrix in one buffer, one binding and one
 * dispatch, in its own weight type (a group's members keep theirs; vk_weights.c) */
typedef struct vk_part {
    kvg_vk_buffer buf;
    uint32_t rows, row0, scale_off;
    uint32_t type;          /* as uploaded: the member's own (an interleaved mixed group: Q8_0 or F32) */
    const kvg_vk_wtype *wt; /* its row of the weight-type table */
} vk_part;

typedef struct vk_matrix {
    uint32_t rows, k, nb;
    int n_parts;
    vk_part *parts;
} vk_matrix;

/* A layer's weights and facts (kvg_layer). Optional buffers have no .buf when the layer lacks
 * them; that alone decides whether its ops run (the walker has no per-architecture branches). */
typedef struct vk_layer {
    vk_matrix qkv, wo, gateup, down;
    kvg_vk_buffer attn_norm, ffn_norm;
    kvg_vk_buffer bias;      /* [nq + 2 nk] f32 Q|K|V biases (zeros where the file has one of them only) */
    kvg_vk_buffer qk_norm;   /* [2 hd] f32: q_norm then k_norm (ones where absent); set: the heads op runs */
    uint32_t qk_flags;       /* rms_norm.comp: 1 Q heads normed, 2 K heads normed */
    kvg_vk_buffer attn_post, ffn_post; /* post-attention / post-FFN norms (gemma) */
    int rope;                /* its RoPE table variant (vk_model.rope_base / rope_scale) */
    uint32_t window;         /* sliding-window layer: the window (hp.n_swa); 0: global */
} vk_layer;

typedef struct vk_lora vk_lora; /* vk_lora.c */
typedef struct vk_encoder vk_encoder; /* vk_encode.c */

typedef struct vk_model {
    kvg_vk_ctx *ctx;
    kvg_hparams hp;
    vk_matrix embd, output;
    bool tied;
    kvg_vk_buffer out_norm;
    vk_layer *layers;
    int ffn_epi;                 /* the gate/up epilogue: the model's activation (EPI_SWIGLU, EPI_GEGLU) */
    /* NEOX RoPE: every Q and K head's first n_rot rows are permuted at upload (device element
     * 2i is element i, 2i+1 is i + n_rot/2), so rotation pairs are adjacent on the device as for
     * llama: the epilogue, the heads op and kv_copy rotate adjacent pairs; Q.K is unchanged by a
     * permutation of both; kv_read / kv_write translate K back to the file's order */
    bool neox;
    /* K/V pages of a block type (model kv_type): its bytes per 32 elements (q8_0 34, q4_0 18) and
     * type; 0: f16 / f32 elements (ctx->kv_f16) */
    uint32_t kv_block, kv_qtype;
    float embd_scale;            /* embeddings times it (1: none) */
    float attn_softcap, final_softcap; /* 0: none */
    /* RoPE table variants: theta_i = pos * scale * base^(-2i/n_rot) / factor_i */
    int n_rope;
    float rope_base[VK_ROPE_VARIANTS], rope_scale[VK_ROPE_VARIANTS];
    float *rope_factors;         /* [n_rot/2] rope_freqs, or NULL */
    /* scratch shared by the sessions: steps are serialised by ctx->lock */
    uint32_t chunk;              /* tokens per step */
    uint32_t ld_x, ld_q, ld_h;   /* activation strides (multiples of 32, zero padding) */
    uint32_t nsplit;             /* decode attention splits over the cache length */
    uint32_t mv_wg, mv_rows;     /* matvec workgroup size and rows per workgroup */
    uint32_t lane_rows;          /* lane layout: rows per invocation (even) */
    bool lane_ubo;               /* lane layout: inputs through uniform windows where they fit */
    bool mv_lane;                /* matvec: one row pair per invocation (CPU devices) */
    bool subgroup;               /* the cooperative matvec and attention reduce by subgroup arithmetic
                                  * (matvec_sg_<type>, attn_sg) */
    bool attn_lane;              /* attention: attn_lane.comp, one invocation per (token, KV head, split) */
    bool act8_dot;               /* the integer types' decode mat-vecs and GEMMs by 8-bit integer
                                  * dot products: matvec_dot_<type> (needs subgroup and !mv_lane),
                                  * gemm_dot_<type> */
    bool gemm_half;              /* the prefill GEMM's tiles as f16 in double-buffered shared
                                  * memory (gemm_h_<type>; GPUs) */
    bool gemm_coop;              /* the prefill GEMM on cooperative matrices (gemm_cm_<type>;
                                  * GPUs that offer them, kvg_vk_ctx.coopmat) */
    kvg_vk_mirror params;        /* the step's token ids, positions and tables' places */
    kvg_vk_buffer x, q, att, h, logits;
    /* logits in device memory the host cannot map (a GPU): the host buffer rows are copied
     * through when the host reads them (vk_backend.c, read_logits); unused where logits is
     * mapped */
    kvg_vk_buffer logits_host;
    kvg_vk_buffer qk;            /* Q|K heads before their norms (ld_qk per token), when a layer has them */
    kvg_vk_buffer f;             /* Wo / down output before its post norm (ld_x per token), when a layer has one */
    uint32_t ld_qk;
    /* block pages: token t's new K heads (RoPE applied) then V heads, f32, at float kv_raw + t * 2 *
     * n_kv * hd of `q` (after the step's Q), for kv_store.comp to quantize into the pool */
    uint32_t kv_raw;
    /* device argmax / top-k over the kept logits (one selection row per batched column);
     * row_owner[r]: the session whose kept logits (KVG_OUT_KEEP) are row r of `logits`, set
     * aside before another step writes that row */
    kvg_vk_select sel;
    kvg_backend_session *row_owner[VK_BATCH_MAX];
    /* KVGEN_VK_PROFILE=1: timestamps after each op, summed per op kind, printed at unload */
    VkQueryPool prof_pool;
    int prof_n;
    int prof_kind[512];
    double prof_ms[8];
    int prof_steps;
    bool prof_prefill; /* KVGEN_VK_PROFILE=2: prefill steps instead of decode steps */

    /* The KV pool every session's K/V live in (set by kvg_vk_kv_pool_init, before any session
     * or step; page_size 0 until then): n_pages pages of page_size tokens,
     * page_elems units each ([L][K,V][Hkv][P][row]: a row is hd elements, or hd / 32 q8_0 blocks
     * of 34 bytes, the unit then being the byte; kvg_vk_kv_row_units), split over nslab buffers ("slabs") of pps
     * pages so that each stays within maxStorageBufferRange. A slab is created when the pool
     * first hands out one of its pages; kv_gen counts slab creations so that descriptor sets
     * written before one are rewritten (once, off the per-token path). */
    int page_size;
    int32_t n_pages;
    uint32_t pps, nslab, page_elems;
    size_t page_bytes;
    kvg_vk_buffer slabs[KVG_VK_KV_SLABS]; /* written under ctx->lock */
    /* Layer groups (kvg_model.h; kv_groups 0 or 1: one group, the above). With two, the global
     * layers' pages are device pages [0, n_pages) in slabs [0, nslab0) as above, and the local
     * layers' pool page q is device page kv_base1 + q (slabs nslab0.., whole slabs of pps pages
     * of page_elems1 elements: [Lw][K,V][Hkv][P][hd]); a layer is at its slot in its group's
     * page, and the local table sits at entry s->tab1 of a session's page-table buffer. */
    int kv_groups;
    const int *kv_group, *kv_slot; /* per layer (the model's layout); NULL: group 0, slot = layer */
    uint32_t nslab0, page_elems1;
    int32_t kv_base1;
    size_t page_bytes1;
    unsigned kv_gen;                       /* atomic */
    /* kv_copy: host-visible tables + rope cos/sin, its descriptor set and command buffer */
    kvg_vk_buffer ops;
    VkDescriptorPool ops_pool;
    VkDescriptorSet ops_set;
    unsigned ops_gen;
    VkCommandBuffer ops_cb;
    /* RoPE cos/sin tables shared by the sessions: ropes[v][k] is variant v's for 2^(k+8)
     * positions, built the first time a session needs that many (forks and NPC sessions share
     * them) */
    kvg_mutex rope_mu;
    bool rope_mu_init;
    kvg_vk_buffer ropes[VK_ROPE_VARIANTS][VK_ROPE_SIZES];
    /* forward_batch: a session whose page table holds the batched sessions' tables one after
     * another and whose partials have room for bat_cols tokens' decode splits; created for
     * the longest context seen, held under bat_mu (taken before ctx->lock). batch_cols: the
     * columns a batched step may take with this model's scratch (<= VK_BATCH_MAX, <= chunk;
     * the batch session's n_cols may be fewer) */
    kvg_mutex bat_mu;
    bool bat_mu_init;
    kvg_backend_session *bat;
    uint32_t bat_entries; /* page-table entries per batched session */
    uint32_t batch_cols;
    /* LoRA adapters (vk_lora.c), made the first time a step runs one (under ctx->lock): the
     * per-token delta the mat-mul sets bind (a dummy until then; made, it bumps kv_gen so the
     * sets are rewritten) */
    vk_lora *lora;
    kvg_vk_buffer lora_d;
    /* an encoder (kvg_arch.encoder: bert; vk_encode.c): its weights and submissions' state; NULL
     * for a decoder. An encoder has no decoder steps: its scratch is params, x, q (Q|K|V), att,
     * h and logits (the last block's states), sized for its submissions, and layers is NULL. */
    vk_encoder *enc;
} vk_model;

struct kvg_backend_session {
    int n_ctx;
    kvg_vk_mirror ptab;   /* the page table (written by the host before each step); with two layer
                             groups the local one follows at entry tab1 */
    uint32_t tab1;
    unsigned kv_gen;      /* the model's kv_gen when the descriptor sets were written */
    /* the model's tables for >= n_ctx positions, per RoPE variant: (pos, n_rot/2) cos, sin */
    const kvg_vk_buffer *rope[VK_ROPE_VARIANTS];
    kvg_vk_buffer part;   /* attention partial results: (chunk, n_head, nsplit, 2 + head_dim) */
    uint32_t nsplit_dec;  /* decode attention splits: covers n_ctx in splits of <= 4096 positions */
    uint32_t n_cols;      /* the page tables and decode partials it holds room for: 1, or the batch
                             session's columns per step (vm->batch_cols, fewer where its partials
                             or tables would pass the device's maxStorageBufferRange) */
    VkDescriptorPool pool;
    VkDescriptorSet *sets;
    int n_sets;
    VkCommandBuffer cb_decode, cb_step;
    bool decode_recorded;
    uint32_t decode_ncols; /* the batch session: the columns cb_decode was recorded for */
    int decode_select; /* the selection cb_decode was recorded with (0 none, 1 argmax, 2 top-k) */
    VkFence fence;
    /* KVG_OUT_KEEP: the selection made with the kept logits, and where they go when another
     * session's step needs their row of the model's logits buffer (n_vocab floats) */
    int32_t sel_ids[KVG_VK_TOPK];
    float sel_vals[KVG_VK_TOPK];
    int sel_n;
    float *saved;
    bool saved_valid;
};

static inline uint32_t round_up(uint32_t x, uint32_t m) { return (x + m - 1) / m * m; }

/* NEOX RoPE on the device: element j of a Q or K head (j < n_rot) holds the file's element
 * kvg_vk_neox_src(j), so the rotation pairs (i, i + n_rot/2) become the adjacent (2i, 2i + 1) */
static inline uint32_t kvg_vk_neox_src(uint32_t j, uint32_t n_rot) {
    if (j >= n_rot) return j;
    return (j & 1u) ? n_rot / 2 + j / 2 : j / 2;
}

/* the step walker's state (vk_walk.c): what one walk of a step does, and where it is */
typedef enum { WALK_PIPELINES, WALK_COUNT, WALK_SETS, WALK_RECORD } walk_mode;

typedef struct walk {
    walk_mode mode;
    vk_model *vm;
    kvg_backend_session *s; /* NULL in WALK_PIPELINES */
    VkCommandBuffer cb;
    int cursor;     /* descriptor-set index */
    uint32_t n;     /* tokens in the step */
    uint32_t max_len; /* prefill: pos0 + n, the longest attention span of the step */
    int logits;     /* 0: none, 1: last token's, 2: every token's, 3: every token's hidden state */
    bool batch;     /* a batched decode: every token of another session (vm->bat) */
    bool lazy;      /* WALK_RECORD makes the pipelines it does not find (the test hooks: only the
                       variant a case records is compiled, not every one a load would make) */
    kvgen_error *err;
} walk;

static inline void spec_init(uint32_t spec[KVG_SPEC_COUNT]) {
    memset(spec, 0, KVG_SPEC_COUNT * sizeof *spec);
}

typedef struct matmul_args {
    const vk_matrix *m;
    int epi;
    const kvg_vk_buffer *norm; /* NULL: no RMSNorm */
    const kvg_vk_buffer *in, *out;
    uint32_t ldx, ldo, x_off, ncols;
    int layer; /* for EPI_QKV: the K/V cache layer */
    const kvg_vk_buffer *bias; /* NULL: none (EPI_F_BIAS) */
    uint32_t flags;            /* EPI_F_* besides EPI_F_BIAS */
    float cap;                 /* EPI_STORE: soft-capping (0: none) */
    uint32_t ldd;              /* EPI_F_LORA: the delta's stride per token */
} matmul_args;

/* ---- vk_weights.c: the weight-type table, repacking and upload ---- */

/* the backend's weight_types: the table's types in table order */
size_t kvg_vk_weight_types(uint32_t *types, size_t max);
/* the largest buffer one binding may cover (ctx->max_part; KVGEN_VK_MAX_PART: tests force splitting) */
size_t kvg_vk_max_part_bytes(const kvg_vk_ctx *ctx);
/* Uploads the rows of `n_src` tensors (same row length) as one matrix: concatenated (each run
 * of members of one type in parts of that type), or, with interleave (two tensors of equal
 * rows), alternating a row of each (in one type: Q8_0 or F32 when theirs differ). */
kvgen_status kvg_vk_upload_matrix(vk_model *vm, const char *what, const kvg_tensor *const *srcs, int n_src,
                                  bool interleave, vk_matrix *out, kvgen_error *err);
void kvg_vk_free_matrix(kvg_vk_ctx *ctx, vk_matrix *m);
/* a norm weight as f32, padded to 32 and to a whole uniform window */
kvgen_status kvg_vk_upload_norm(vk_model *vm, const kvg_tensor *t, kvg_vk_buffer *out, kvgen_error *err);

/* ---- vk_kv.c: KV layout, the paged pool, page reads and writes, kv_copy ---- */

/* the KV layout constants of shaders/kv.glsl */
void kvg_vk_kv_spec(const vk_model *vm, uint32_t spec[KVG_SPEC_COUNT]);
/* units of one K or V row in the pool (elements; bytes of q8_0 blocks) */
uint32_t kvg_vk_kv_row_units(const vk_model *vm);
/* push-constant fields of the paged layout for one layer of session s (NULL: no table yet) */
void kvg_vk_kv_pc(const vk_model *vm, const kvg_backend_session *s, int layer, uint32_t *kv_layer, uint32_t *kv_page,
                  uint32_t *kv_v, uint32_t *pt_base);
/* the layer group of a layer, and the device page of group g's pool page q (-1 stays -1) */
int kvg_vk_kv_group(const vk_model *vm, int layer);
int32_t kvg_vk_kv_device_page(const vk_model *vm, int g, int32_t q);
/* binds the KV storage of a layer: the pool's slabs and the session's page table */
void kvg_vk_kv_bind(const vk_model *vm, const kvg_backend_session *s, kvg_vk_binding b[KVG_VK_BINDINGS]);
/* every entry of group g's table names a page of its pool that has storage; the local group's
 * released entries (-1: below its window, never read) are skipped */
kvgen_status kvg_vk_check_pages(const vk_model *vm, int g, const int32_t *pages, size_t n_entries, kvgen_error *err);
/* the pool's layout and kv_copy's resources; the pipelines are created after it (vk_backend.c) */
kvgen_status kvg_vk_kv_pool_init(kvgen_model *m, int page_size, int32_t n_pages, kvgen_error *err);
/* kvg_backend_ops entries */
size_t kvg_vk_cache_bytes_per_token(const kvgen_model *m);
size_t kvg_vk_default_pool_bytes(const kvgen_model *m);
kvgen_status kvg_vk_kv_page_commit(kvgen_model *m, int group, int32_t page, kvgen_error *err);
kvgen_status kvg_vk_kv_read(kvgen_model *m, const int32_t *pages, int layer, int which, int pos0, int n,
                            float *out, kvgen_error *err);
kvgen_status kvg_vk_kv_write(kvgen_model *m, const int32_t *pages, int layer, int which, int pos0, int n,
                             const float *in, kvgen_error *err);
kvgen_status kvg_vk_kv_copy(kvgen_model *m, int group, const int32_t *src_pages, int src_pos,
                            const int32_t *dst_pages, int dst_pos, int n, int rope_delta, kvgen_error *err);

/* ---- vk_walk.c: the step walker ---- */

/* walks one step's dispatches in w->mode (pipelines, set count, sets, commands) */
kvgen_status kvg_vk_walk_step(walk *w);
/* A session's descriptor sets for the op list walk_ops walks (kvg_vk_walk_step; an encoder's),
 * with w's vm, s, n and logits: a WALK_COUNT walk counts them, w->s's sets and pool are made for
 * that many, a WALK_SETS walk writes them, under ctx->lock with s->kv_gen read there (the KV
 * pool may gain a slab meanwhile from another thread's session). What was made before an error
 * is the session's to free. */
kvgen_status kvg_vk_walk_sets(walk *w, kvgen_status (*walk_ops)(walk *w));
/* The mat-vec's workgroup size: 32 in the lane layout (every invocation computes rows of its own),
 * else 64; with one_subgroup (subgroup reductions) the device's subgroup size, at most 64, so
 * that one subgroupAdd is a whole reduction (matvec.comp checks gl_NumSubgroups, so a driver
 * that splits the workgroup after all still gets the right sums) */
uint32_t kvg_vk_matvec_wg(const kvg_vk_ctx *ctx, bool lane, bool one_subgroup);
/* gemm_cm.comp's specialization (workgroup, matrix shape) for the device, and whether it fits
 * the device's limits (workgroup size, shared memory; lowered by KVGEN_VK_MAX_*) */
void kvg_vk_gemm_cm_spec(const kvg_vk_ctx *ctx, uint32_t spec[KVG_SPEC_COUNT]);
bool kvg_vk_gemm_cm_fits(const kvg_vk_ctx *ctx);
/* An op's pipeline for w->mode: created at load (WALK_PIPELINES), else found (one that was not
 * created is KVGEN_E_INTERNAL, naming the shader), or made there for a lazy walk. */
kvgen_status kvg_vk_walk_pipeline(walk *w, const char *shader, const uint32_t spec[KVG_SPEC_COUNT], VkPipeline *out);
/* the ops the walk is made of (the test hooks run them alone) */
kvgen_status kvg_vk_op_matmul(walk *w, const matmul_args *a);
kvgen_status kvg_vk_op_attention(walk *w, int layer);
/* The cooperative attention kernel's (attn.comp) splits of a token's positions, for `groups`
 * workgroups per split (KV heads x columns): where the device reports its compute units
 * (kvgen_device_info.compute_units), enough splits that they make twice as many workgroups as
 * units; elsewhere 8. Clamped to [lo, hi]: a decode token takes 8 to 64, a batched step no more
 * than its columns' decode count (kvg_vk_op_attention). */
uint32_t kvg_vk_attn_splits(const kvg_vk_ctx *ctx, uint64_t groups, uint32_t lo, uint32_t hi);
/* the fewest positions such a split covers: 64 (one tile) where the units are known, else 256 */
uint32_t kvg_vk_attn_split_min(const kvg_vk_ctx *ctx);
/* the fewest splits of `positions` positions that keep each split within lavapipe's loop limit:
 * no split covers more than 4096 positions (attn.comp); at least 1 */
uint32_t kvg_vk_attn_loop_splits(uint64_t positions);
/* the token rows of the step's ids (params) into vm->x (embed.comp, times vm->embd_scale) */
kvgen_status kvg_vk_op_embed(walk *w);
/* Records a step of n tokens into cb (logits as walk.logits; select 1 argmax, 2 top-k, after
 * it: of the last token's logits (logits 1) or of every column's (a batched step, logits 2)). */
kvgen_status kvg_vk_record(vk_model *vm, kvg_backend_session *s, VkCommandBuffer cb, bool one_time, uint32_t n,
                           uint32_t max_len, int logits, int select, kvgen_error *err);
/* Rewrites a session's descriptor sets when the pool gained a slab since they were written
 * (caller holds ctx->lock). */
kvgen_status kvg_vk_refresh_sets(vk_model *vm, kvg_backend_session *s, kvgen_error *err);
/* KVGEN_VK_PROFILE: adds the last recorded step's timestamps to the per-kind totals */
void kvg_vk_prof_collect(vk_model *vm);

/* ---- vk_encode.c: an encoder's forward pass (kvg_backend_ops.encode) ---- */

/* model_init's part for an encoder (vm->ctx made, the knobs set): its weights, scratch and
 * descriptor sets */
kvgen_status kvg_vk_encoder_init(kvgen_model *m, kvgen_error *err);
/* every pipeline an encoder's submission uses (the load's pipeline stage) */
kvgen_status kvg_vk_encoder_pipelines(vk_model *vm, kvgen_error *err);
void kvg_vk_encoder_free(vk_model *vm);
kvgen_status kvg_vk_encode(kvgen_model *m, const kvg_encode_batch *b, kvgen_error *err);

/* ---- vk_lora.c: LoRA adapters on the device (shaders/lora.comp) ---- */

/* One matrix of a mat-mul's output that adapters may change: its pairs' shape, and where its
 * output o lands among the mat-mul's rows (row0 + stride * o: Q/K/V concatenated, gate/up
 * interleaved). */
typedef struct kvg_vk_lora_part {
    kvg_lora_target target;
    uint32_t n_in, n_out, row0, stride;
} kvg_vk_lora_part;

/* the words of an adapter packed for lora.comp, and the packing (each pair's A then B^T, by
 * (layer, target); neox_hd > 0: Q's and K's outputs permuted per head as the device's rows are,
 * kvg_vk_neox_src) */
size_t kvg_vk_lora_words(const kvgen_adapter *a, int n_layer);
void kvg_vk_lora_pack(const kvgen_adapter *a, int n_layer, uint32_t neox_hd, uint32_t n_rot, float *dst);
/* Writes lora.comp's table for one mat-mul of n tokens at tab: token c runs the pairs of
 * sets[c] (NULL: none) for `parts`, adapter i of its set packed at word bases[c][i] of the
 * pairs buffer. Returns the words written (at most kvg_vk_lora_table_words) and, in *ranks, the
 * widest token's sum of ranks (the rank scratch's row). */
uint32_t kvg_vk_lora_table(uint32_t *tab, const kvg_lora_set *const *sets, uint32_t n, int layer,
                           const kvg_vk_lora_part *parts, int n_parts, const uint64_t *const *bases,
                           uint32_t *ranks);
uint32_t kvg_vk_lora_table_words(const kvg_lora_set *const *sets, uint32_t n, int n_parts);

/* one mat-mul's two dispatches: down (set `down`: 1 pairs, 2 input x, 3 rank scratch, 4 norm
 * weight, 7 table) then up (set `up`: 2 rank scratch, 3 delta), barriers after each */
typedef struct kvg_vk_lora_args {
    uint32_t ncols, ldx, ldt, ldd; /* tokens; strides of the input, rank scratch and delta */
    uint32_t n_in, nrows;          /* the input's elements; the mat-mul's output rows */
    uint32_t tab_off;              /* the table's first word */
    bool norm;                     /* RMSNorm of the input first (the mat-mul's prologue) */
    float eps;
} kvg_vk_lora_args;
kvgen_status kvg_vk_lora_pipelines(kvg_vk_ctx *ctx, kvgen_error *err);
kvgen_status kvg_vk_lora_record(kvg_vk_ctx *ctx, VkCommandBuffer cb, VkDescriptorSet down, VkDescriptorSet up,
                                const kvg_vk_lora_args *a, kvgen_error *err);

/* A model's adapters on the device. prepare (caller holds ctx->lock, before
 * kvg_vk_refresh_sets): packs the adapters of `sets` no step has run yet, sizes the scratch for
 * steps of up to max_tok tokens. step: the next recorded step runs tok_sets[c] for its token c
 * (NULL: none) until end. op (WALK_RECORD): layer's mat-mul op (0 QKV, 1 Wo, 2 gate/up, 3 down)
 * gets its LoRA dispatches recorded and EPI_F_LORA set in m when some token's set adapts it.
 * forget: an adapter being freed (kvg_backend_ops.adapter_free). */
kvgen_status kvg_vk_lora_prepare(vk_model *vm, const kvg_lora_set *const *sets, int n_sets, uint32_t max_tok,
                                 kvgen_error *err);
void kvg_vk_lora_step(vk_model *vm, const kvg_lora_set *const *tok_sets, uint32_t n);
void kvg_vk_lora_step_seq(vk_model *vm, const kvg_lora_set *set, uint32_t n); /* n tokens of one set */
void kvg_vk_lora_end(vk_model *vm);
kvgen_status kvg_vk_lora_op(walk *w, int layer, int op, matmul_args *m);
void kvg_vk_lora_forget(vk_model *vm, const kvgen_adapter *a);
void kvg_vk_lora_free(vk_model *vm);

/* test hook: delta (n x nrows) = what the two dispatches give for layer `layer`'s parts of the
 * n tokens x (n x in_dim; norm: RMSNorm with that weight first), sets[c] token c's adapters */
kvgen_status kvg_vk_test_lora(kvg_vk_ctx *ctx, const kvg_lora_set *const *sets, uint32_t n, int n_layer, int layer,
                              const kvg_vk_lora_part *parts, int n_parts, const float *x, uint32_t in_dim,
                              const float *norm, float eps, uint32_t nrows, float *delta, kvgen_error *err);

#endif
