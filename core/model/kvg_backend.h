/* kvg_backend.h: the backend interface (private): the batch a forward pass runs and the ops
 * every backend implements (cpu/reference.c, cpu/fast.c, vulkan/vk_backend.c), over the model
 * description of kvg_model.h. */
#ifndef KVG_BACKEND_H
#define KVG_BACKEND_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvg_adapter.h"
#include "kvg_model.h"

typedef struct kvg_backend_session kvg_backend_session; /* a backend's per-session state (scratch, recorded steps) */

/* What a sequence of a batch wants back from the forward pass. */
typedef enum kvg_batch_out {
    KVG_OUT_NONE, /* nothing: its K/V only (a prefill chunk that is not the last) */
    KVG_OUT_LAST, /* the last token's n_vocab logits into `logits` */
    KVG_OUT_ALL,  /* every token's logits into `logits`, n * n_vocab floats */
    KVG_OUT_KEEP, /* the last token's logits stay on the device (ops->fetch_logits, ops->topk) */
    KVG_OUT_HIDDEN /* every token's final hidden state (after the output norm) into `logits`, n * n_embd
                      floats, and no logits: a decoder's embedding (backends with ops->hidden_out) */
} kvg_batch_out;

/* One sequence of a batch: n tokens of one session at positions pos0.., K/V read and written
 * through its page tables, one per layer group (position p of a layer of group g is slot
 * p % page_size of page pages[g][p / page_size]); every page of [pos0, pos0 + n) is held by
 * that session alone. A group's entries below its window are -1 and never read. */
typedef struct kvg_batch_seq {
    kvg_backend_session *bs;
    const int32_t *pages[KVG_KV_GROUPS];
    const int32_t *tokens;
    int n, pos0;
    kvg_batch_out out;
    float *logits;  /* KVG_OUT_LAST / KVG_OUT_ALL */
    int select_k;   /* KVG_OUT_KEEP: also select the select_k best (0 none, 1 argmax, <= KVG_SAMPLER_MAX_TOP) */
    /* the session's LoRA adapters (kvg_adapter.h), NULL or empty for none: after each matrix
     * product of the sequence's tokens that a pair adapts, the backend adds that pair's
     * low-rank product (kvg_lora_add); only set for a backend with ops->lora */
    const kvg_lora_set *lora;
} kvg_batch_seq;

/* The unit of work of every backend: prefill, decode, many sessions' decodes, choice scoring
 * and chunked prefill are all batches, built by session.c. Sequences belong to distinct
 * sessions of one model. */
typedef struct kvg_batch {
    const kvg_batch_seq *seq;
    int n_seq;
} kvg_batch;

/* An encoder's batch (kvg_arch.encoder): n_seq texts' tokens back to back, each text attended
 * over as a whole, both ways, without a cache. */
typedef struct kvg_encode_batch {
    const int32_t *tokens; /* sum of n_tokens ids */
    const int *n_tokens;   /* [n_seq] each text's count, 1 to the model's n_ctx_train */
    int n_seq;
    float *hidden;         /* [sum of n_tokens][n_embd]: each token's output of the last block */
} kvg_encode_batch;

typedef struct kvg_backend_ops {
    const char *name;
    /* The KVG_F_* features (kvg_arch.h) this backend's forward pass runs; model_init refuses a
     * model needing any other (kvg_arch_check_backend). */
    uint32_t features;
    /* true: K/V pages split by layer group (kvg_kv_layout), so sliding-window layers release
     * what they no longer see; false: one group of every layer */
    bool kv_groups;
    /* true: forward answers KVG_OUT_HIDDEN */
    bool hidden_out;
    /* true: forward runs each sequence's LoRA adapters (kvg_batch_seq.lora); false:
     * kvgen_session_set_adapters refuses sessions of this backend */
    bool lora;
    /* an adapter of m is being freed (optional): the backend drops what it keeps of it (a
     * device copy); called once, before its pairs are freed, with no step running it */
    void (*adapter_free)(kvgen_model *m, const kvgen_adapter *a);
    /* The weight tensor types this backend runs, from its own table (the reference backend's is
     * quant.c's traits table): fills up to max, returns how many there are. model_init refuses a
     * model holding any other (kvg_weights_check_types). */
    size_t (*weight_types)(uint32_t *types, size_t max);
    /* The types its K/V pages may hold (KVG_TYPE_* rows of kvg_pool.h's KV type table), the
     * default first; the load refuses any other kvgen_model_desc.kv_type and sets m->kv_type
     * (kvg_model_kv_type_choose) before model_init. */
    const uint32_t *kv_types;
    size_t n_kv_types;
    /* per-model state (device buffers, ...) */
    kvgen_status (*model_init)(kvgen_model *m, const kvgen_model_desc *desc, kvgen_error *err);
    void (*model_free)(kvgen_model *m);
    /* per-session state for sessions of up to n_ctx positions (never the K/V: those are pages) */
    kvgen_status (*session_init)(kvgen_model *m, int n_ctx, kvg_backend_session **out, kvgen_error *err);
    void (*session_free)(kvgen_model *m, kvg_backend_session *s);

    /* Runs every sequence of the batch, writing their K/V at their positions and returning
     * what each asked for. Each sequence's results equal what a batch of it alone gives (the
     * backend may group, reorder or split the work: several one-token sequences share each
     * weight read). On failure nothing is returned; K/V at the batch's positions are undefined. */
    kvgen_status (*forward)(kvgen_model *m, const kvg_batch *b, kvgen_error *err);

    /* An encoder's forward pass (optional: NULL for a backend that runs none; a backend that
     * lists KVG_F_ENCODER in features has it). */
    kvgen_status (*encode)(kvgen_model *m, const kvg_encode_batch *b, kvgen_error *err);

    /* ---- KV pages: K/V live in the model's page pools (kvg_pool.h), one per layer group
     * (m->kv); a page id is an index into its group's pool ---- */
    size_t (*cache_bytes_per_token)(const kvgen_model *m); /* all layers */
    /* pool size when the load asked for none (e.g. a share of free device memory) */
    size_t (*kv_default_pool_bytes)(const kvgen_model *m);
    /* reserves the page table of storage for n_pages pages of page_size tokens of a group's
     * layers (no storage yet); called once per group of m->kv */
    kvgen_status (*kv_pages_init)(kvgen_model *m, int group, int page_size, int32_t n_pages, kvgen_error *err);
    /* gives one page of a group its storage; called once per page, the first time its pool hands it out */
    kvgen_status (*kv_page_commit)(kvgen_model *m, int group, int32_t page, kvgen_error *err);
    /* copies the group's K/V of positions [src_pos, src_pos+n) of one of its tables to
     * [dst_pos, ..) of another (or the same, dst_pos <= src_pos), re-rotating K by rope_delta
     * positions (0: plain copy) */
    kvgen_status (*kv_copy)(kvgen_model *m, int group, const int32_t *src_pages, int src_pos,
                            const int32_t *dst_pages, int dst_pos, int n, int rope_delta, kvgen_error *err);
    /* one layer's K (which=0) or V of positions [pos0, pos0+n) as f32 (kv_heads, n, head_dim),
     * through `pages`, the table of the layer's group */
    kvgen_status (*kv_read)(kvgen_model *m, const int32_t *pages, int layer, int which, int pos0, int n, float *out,
                            kvgen_error *err);
    kvgen_status (*kv_write)(kvgen_model *m, const int32_t *pages, int layer, int which, int pos0, int n,
                             const float *in, kvgen_error *err);

    /* ---- logits kept on the device (optional: NULL for a backend whose logits are host memory,
     * which session.c then never asks for KVG_OUT_KEEP) ----
     * A KVG_OUT_KEEP sequence's logits stay on the device as its session's own (the backend sets
     * them aside should another step need the space) until that session runs again.
     * fetch_logits copies them (n_vocab floats); topk gives the k <= select_k best selected
     * with them (higher logit first, lower id on ties, NaN as -inf), or fails when fewer were. */
    kvgen_status (*fetch_logits)(kvgen_model *m, kvg_backend_session *s, float *out, kvgen_error *err);
    kvgen_status (*topk)(kvgen_model *m, kvg_backend_session *s, int k, int32_t *ids, float *vals, kvgen_error *err);
} kvg_backend_ops;

extern const kvg_backend_ops kvg_reference_backend;
extern const kvg_backend_ops kvg_cpu_backend;
extern const kvg_backend_ops kvg_vulkan_backend;

/* whether ops->weight_types lists `type` */
bool kvg_backend_runs_type(const kvg_backend_ops *ops, uint32_t type);
/* The check each backend's model_init makes first: every weight tensor of m->w (embeddings,
 * output, norms, each layer's matrices) has a type in ops->weight_types; else
 * KVGEN_E_UNSUPPORTED with a message naming the file, the tensor, its type and the backend,
 * and listing the types that backend runs. */
kvgen_status kvg_weights_check_types(const kvgen_model *m, const kvg_backend_ops *ops, kvgen_error *err);
/* The other check of model_init: every feature in m->w.features is in ops->features; else
 * KVGEN_E_UNSUPPORTED naming the file, the architecture, the feature and the backend. */
kvgen_status kvg_arch_check_backend(const kvgen_model *m, const kvg_backend_ops *ops, kvgen_error *err);

#endif
