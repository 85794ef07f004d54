/* kvg_model.h: the model description shared by every backend (private).
 *
 * Folder core/model/ owns what a loaded model is, independent of where it runs: the
 * architecture table (arch.c, kvg_arch.h), the tensor type-traits table (quant.c, kvg_quant.h),
 * the model description read from a GGUF (model.c: hyperparameters, layers, weights), the
 * model's KV page pool (kvpool.c, kvg_pool.h), the state the layers above hang on the model
 * (attach.c), the public token calls over its tokenizer (tokens.c) and the backend interface
 * (kvg_backend.h: the batch a forward pass runs, the ops every backend implements). The
 * backends (cpu/, vulkan/) sit above it and implement that interface. */
#ifndef KVG_MODEL_H
#define KVG_MODEL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvg_arch.h"
#include "kvg_error.h"
#include "kvg_gguf.h"
#include "kvg_host.h"
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
    /* an encoder's (kvg_arch.encoder) */
    float layer_norm_eps;              /* <prefix>.attention.layer_norm_epsilon (1e-12 when absent) */
    int pooling;                       /* <prefix>.pooling_type as GGUF numbers it (KVG_POOLING_*); absent:
                                          KVG_POOLING_NONE (the caller's or kvgen_embed's default decides) */
} kvg_hparams;

/* pooling_type values, as llama.cpp's converter writes them */
enum { KVG_POOLING_NONE = 0, KVG_POOLING_MEAN = 1, KVG_POOLING_CLS = 2, KVG_POOLING_LAST = 3 };

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
    /* an encoder's post-norm block (bert); NULL for the others */
    const kvg_tensor *bo;                          /* [n_embd] f32 attn_output bias */
    const kvg_tensor *attn_out_norm, *attn_out_norm_b; /* [n_embd] LayerNorm of x + attention */
    const kvg_tensor *b_up, *b_down;               /* [n_ff], [n_embd] the feed-forward's biases */
    const kvg_tensor *out_norm, *out_norm_b;       /* [n_embd] LayerNorm of x + feed-forward */
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
    const kvg_tensor *output_norm; /* [n_embd] f32; NULL for an encoder */
    /* an encoder's embedding (bert): x = tok_embd[t] + token_types[0] + pos_embd[pos], LayerNormed */
    const kvg_tensor *pos_embd;    /* [n_embd] x n_ctx_train */
    const kvg_tensor *tok_types;   /* [n_embd] x types, NULL when absent */
    const kvg_tensor *embd_norm, *embd_norm_b; /* [n_embd] f32 */
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
    const struct kvg_backend_ops *ops; /* kvg_backend.h */
    void *backend;       /* the backend's per-model state */
    char *name;
    char device_name[256];
    int n_threads;
    uint32_t kv_type;      /* what K/V pages hold (kvg_pool.h's KV type table): KVG_TYPE_* */
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

#endif
