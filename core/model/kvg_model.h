/* kvg_model.h: the model description shared by every backend (private).
 *
 * Folder core/model/ owns what a loaded model is, independent of where it runs: the
 * architecture table (arch.c, kvg_arch.h), the tensor type-traits table (quant.c, kvg_quant.h),
 * the model description read from a GGUF (model.c) and the backend interface below (the
 * batch a forward pass runs, the ops every backend implements). Backends sit under it. */
#ifndef KVG_MODEL_H
#define KVG_MODEL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvg_arch.h"
#include "kvg_gguf.h"
#include "kvg_tokenizer.h"
#include "kvgen.h"

typedef struct kvg_hparams {
    int n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_rot;
    int n_ctx_train, n_vocab;
    float rope_freq_base, rms_norm_eps;
    float rope_freq_scale;             /* position scale of linear RoPE scaling (1: none) */
    float rope_attn_factor;            /* rope.scaling.attn_factor: cos and sin are multiplied by it (1: none) */
    int n_ctx_orig;                    /* rope.scaling.original_context_length (0: absent) */
    int n_ctx_rope;                    /* sessions longer than this are refused (0: no limit): the original
                                          context while the short LongRoPE factors run, else the
                                          model's kvgen_model_desc.n_ctx */
    /* attention variants, 0 when the architecture or the file has none */
    float attn_softcap, final_softcap; /* <prefix>.attn_logit_softcapping, final_logit_softcapping */
    int n_swa;                         /* <prefix>.attention.sliding_window (0: none) */
} kvg_hparams;

/* Weights of one transformer block; shapes as GGUF stores them (ne[0] = input width). */
typedef struct kvg_layer {
    const kvg_tensor *attn_norm; /* [n_embd] f32 */
    const kvg_tensor *wq;        /* [n_embd] -> [n_head*head_dim] */
    const kvg_tensor *wk;        /* [n_embd] -> [n_head_kv*head_dim] */
    const kvg_tensor *wv;        /* [n_embd] -> [n_head_kv*head_dim] */
    const kvg_tensor *wo;        /* [n_head*head_dim] -> [n_embd] */
    const kvg_tensor *ffn_norm;  /* [n_embd] f32 */
    const kvg_tensor *w_gate;    /* [n_embd] -> [n_ff] */
    const kvg_tensor *w_up;      /* [n_embd] -> [n_ff] */
    const kvg_tensor *w_down;    /* [n_ff] -> [n_embd] */
    /* optional, as the architecture row and the file have them; NULL when absent */
    const kvg_tensor *bq, *bk, *bv;     /* [n_head*head_dim], [n_head_kv*head_dim] f32 */
    const kvg_tensor *q_norm, *k_norm;  /* [head_dim] f32 */
    const kvg_tensor *attn_post_norm;   /* [n_embd] f32 */
    const kvg_tensor *ffn_post_norm;    /* [n_embd] f32 */
    /* the layer's attention facts (from the row and the file) */
    bool swa;                           /* sliding-window layer: attends to the last n_swa positions */
    float rope_base, rope_scale;        /* its RoPE base and position scale */
} kvg_layer;

/* Describes the weights of a GGUF of an architecture in the table (kvg_arch.h): hyperparameters
 * read under the row's metadata prefix, tensor lookup with shapes and types checked, and the
 * facts of the forward pass the backends read. Refuses unknown architectures, missing tensors
 * and tensors the row does not use that would change the math, clearly. */
typedef struct kvg_weights {
    kvg_hparams hp;
    const kvg_arch *arch;          /* the table row */
    kvg_rope_style rope;
    kvg_activation act;
    float embd_scale;              /* embeddings are multiplied by it (1: not scaled) */
    uint32_t features;             /* KVG_F_* this model needs beyond the plain llama forward pass */
    const kvg_tensor *rope_freqs;  /* [n_rot/2] f32, NULL when absent */
    const kvg_tensor *tok_embd;    /* [n_embd] x n_vocab */
    const kvg_tensor *output_norm; /* [n_embd] f32 */
    const kvg_tensor *output;      /* [n_embd] x n_vocab; == tok_embd when tied */
    bool tied;
    const kvg_tensor *rope_factors_long; /* [n_rot/2] f32: Phi-3's factors past n_ctx_orig (rope_freqs when the model's n_ctx is longer) */
    kvg_layer *layers;             /* n_layer */
    struct kvg_tensor_view *views; /* the parts of fused matrices (kvg_arch.h), owned; the layers point in */
    int n_views;
} kvg_weights;

/* A row range of a file's tensor, seen as a tensor of its own (same bytes). */
typedef struct kvg_tensor_view {
    kvg_tensor t;             /* t.data, t.offset: the first row of the range */
    const kvg_tensor *whole;  /* the file's tensor */
    char name[80];            /* "blk.3.attn_qkv.weight (attn_k rows)" */
} kvg_tensor_view;

kvgen_status kvg_weights_describe(const kvg_gguf *g, kvg_weights *w, kvgen_error *err);
void kvg_weights_free(kvg_weights *w);

/* ---- backends ---- */
typedef struct kvg_backend_session kvg_backend_session; /* a backend's per-session state (scratch, recorded steps) */

/* What a sequence of a batch wants back from the forward pass. */
typedef enum kvg_batch_out {
    KVG_OUT_NONE, /* nothing: its K/V only (a prefill chunk that is not the last) */
    KVG_OUT_LAST, /* the last token's n_vocab logits into `logits` */
    KVG_OUT_ALL,  /* every token's logits into `logits`, n * n_vocab floats */
    KVG_OUT_KEEP  /* the last token's logits stay on the device (ops->fetch_logits, ops->topk) */
} kvg_batch_out;

/* K/V pages by layer group (kvgen_model.kv, set when the pool is made): one group of every
 * layer, or, for a model with sliding-window layers on a backend that keeps groups
 * (ops->kv_groups), group 0 the global layers and group 1 the local ones. Each group has its
 * own page pool and each session its own page table per group; a group with a window only
 * ever reads the last `window` positions, so its pages below that are released (entries -1). */
#define KVG_KV_GROUPS 2
typedef struct kvg_kv_layout {
    int n_groups;
    int window[KVG_KV_GROUPS];   /* 0: the group's layers see every position; else the last window */
    int n_layers[KVG_KV_GROUPS]; /* layers stored in a group's pages */
    int *group;                  /* [n_layer] each layer's group */
    int *slot;                   /* [n_layer] its index among its group's layers */
    int *layers[KVG_KV_GROUPS];  /* [n_layers[g]] a group's layers, by slot */
} kvg_kv_layout;

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
} kvg_batch_seq;

/* The unit of work of every backend: prefill, decode, many sessions' decodes, choice scoring
 * and chunked prefill are all batches, built by session.c. Sequences belong to distinct
 * sessions of one model. */
typedef struct kvg_batch {
    const kvg_batch_seq *seq;
    int n_seq;
} kvg_batch;

typedef struct kvg_backend_ops {
    const char *name;
    /* The KVG_F_* features (kvg_arch.h) this backend's forward pass runs; model_init refuses a
     * model needing any other (kvg_arch_check_backend). */
    uint32_t features;
    /* true: K/V pages split by layer group (kvg_kv_layout), so sliding-window layers release
     * what they no longer see; false: one group of every layer */
    bool kv_groups;
    /* The weight tensor types this backend runs, from its own table (the reference backend's is
     * quant.c's traits table): fills up to max, returns how many there are. model_init refuses a
     * model holding any other (kvg_weights_check_types). */
    size_t (*weight_types)(uint32_t *types, size_t max);
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

/* ---- state of the layers above, hung on the model ----
 * A layer above the model (the jobs' worker, the grammar's vocabulary trie, a remote model's
 * connection) keeps its per-model state under a key of its own, a static it defines, instead of
 * in a field of struct kvgen_model. */
typedef struct kvg_attach_key {
    const char *name;
    void (*free_value)(void *value); /* at model free; NULL: nothing to free */
} kvg_attach_key;
/* The value hung under key (compared by address), or NULL. Thread-safe. */
void *kvg_model_attached(const struct kvgen_model *m, const kvg_attach_key *key);
/* Hangs value under key if nothing is there yet; returns what is there afterwards: value, or
 * the other thread's value if it won the race (the caller then frees its own), or NULL when
 * memory runs out (value not hung; the caller frees it). Thread-safe. Values are freed by
 * key->free_value at model free, last attached first, after the model's on_unload hook and
 * before anything of the model itself is freed. */
void *kvg_model_attach(struct kvgen_model *m, const kvg_attach_key *key, void *value);
/* Drops a reference to m (a session's, the jobs worker's, the host's); the last one frees it
 * through m->destroy, which the load set. NULL is ignored. */
void kvg_model_release(struct kvgen_model *m);
/* model free: frees every value, last attached first, and forgets them */
void kvg_model_detach_all(struct kvgen_model *m);

struct kvgen_model {
    int refcount;
    /* frees the model when its last reference goes (kvg_model_release); set by the load */
    void (*destroy)(kvgen_model *m);
    kvg_gguf *gguf;
    kvg_weights w;
    kvg_tokenizer *tok;
    const kvg_backend_ops *ops;
    void *backend;       /* the backend's per-model state */
    char *name;
    char device_name[256];
    int n_threads;
    kvg_kv_layout kv;      /* K/V pages by layer group */
    struct kvg_pool *pools[KVG_KV_GROUPS]; /* per group, the KV page pool every session's K/V live in */
    int n_sessions;        /* open sessions (atomic) */
    /* set by a layer above the model that must let go of it first (the jobs' worker, when it
     * starts); model_free calls it before freeing anything */
    void (*on_unload)(kvgen_model *m);
    /* likewise for a session of the model: kvgen_session_close calls it before freeing it */
    void (*on_session_close)(kvgen_session *s);
    /* what the layers above hang on the model (kvg_model_attach), newest first (atomic) */
    struct kvg_attached *attached;
    /* the load's progress callback (kvgen_model_desc.progress); cleared when the load returns */
    kvgen_load_progress_fn progress;
    void *progress_user;
    int progress_stage;       /* the stage of the last report (0: none yet) */
    uint64_t progress_last, progress_total; /* its done and total */
};

/* Reports `done` of `total` bytes (or pipelines) of `stage` to the load's callback: always the
 * stage's first call and the one where done == total, else only once done has grown by a MiB
 * (for byte stages) since the last report. KVGEN_E_CANCELLED (naming the stage) when the
 * callback asks to stop; KVGEN_OK without a callback. */
kvgen_status kvg_load_progress(kvgen_model *m, kvgen_load_stage stage, uint64_t done, uint64_t total,
                               kvgen_error *err);
/* KVGEN_LOAD_READ: reads every tensor's bytes once, in file order (a callback is set) */
kvgen_status kvg_weights_read(kvgen_model *m, kvgen_error *err);

#include "kvg_host.h"

/* error helper: formats into err (when not NULL) and returns status */
kvgen_status kvg_fail(kvgen_error *err, kvgen_status status, const char *fmt, ...)
#if defined(__GNUC__) && !defined(__MINGW32__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif
