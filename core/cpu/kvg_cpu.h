/* kvg_cpu.h: helpers any backend that computes on the host's cores can share (private):
 * a persistent thread pool (cpu_pool.c) and KV pages kept in host memory (cpu_pages.c).
 * The reference backend (reference.c) and the cpu backend (fast.c) are built on them, and on
 * what they share around their forward passes (cpu_common.c).
 *
 * Folder core/cpu/ owns the backends that run on the host's cores: the reference backend
 * (reference.c, the readable f32 oracle) and these shared helpers. */
#ifndef KVG_CPU_H
#define KVG_CPU_H
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvg_backend.h"
#include "kvg_types.h" /* the KVG_TYPE_* numbers of the pages' types */

/* ---- thread pool ----------------------------------------------------------------------- */

/* Ceiling on threads, so a strange sysconf answer cannot make a pool spawn thousands. */
#define KVG_CPU_MAX_THREADS 64

/* A job covers the independent items [0, n_items): fn handles [begin, end) on thread tid, with
 * 0 <= tid < kvg_cpu_pool_threads (the calling thread is tid 0). tid only says which thread is
 * running, for per-thread scratch: what an item computes must not depend on it, so results
 * are the same whatever the thread count. */
typedef void (*kvg_cpu_job_fn)(void *ctx, int begin, int end, int tid);

typedef struct kvg_cpu_pool kvg_cpu_pool;

/* The thread count a pool asked for `requested` threads gets: requested itself when > 0,
 * else the online cores; at most KVG_CPU_MAX_THREADS. */
int kvg_cpu_threads(int requested);
/* Starts kvg_cpu_threads(n_threads) - 1 workers (the caller of kvg_cpu_pool_run is the last
 * one). `who` names the owner in error messages ("reference backend"). */
kvgen_status kvg_cpu_pool_create(int n_threads, const char *who, kvg_cpu_pool **out, kvgen_error *err);
/* Stops and joins the workers. NULL is ignored. */
void kvg_cpu_pool_destroy(kvg_cpu_pool *p);
int kvg_cpu_pool_threads(const kvg_cpu_pool *p);
/* Lets the workers poll for a next job, and the caller for the workers' end, for up to spin_us
 * microseconds before they sleep (0, the default: sleep at once). For a backend that runs many
 * short jobs per token: it trades idle cycles on its cores for no wake-up latency. */
void kvg_cpu_pool_set_spin(kvg_cpu_pool *p, int spin_us);
/* Runs fn over [0, n_items) on every thread and returns when all items are done. Items are
 * handed out in chunks (several per thread, so one thread slowed by other work does not hold
 * up the rest); each item is handled exactly once, by one thread. Jobs from several threads
 * (sessions of one model on different threads) are run one after another. */
void kvg_cpu_pool_run(kvg_cpu_pool *p, int n_items, kvg_cpu_job_fn fn, void *ctx);

/* ---- KV pages in host memory ------------------------------------------------------------ */

/* The element type of host KV pages: a KVG_TYPE_* of the model's KV type table (kvg_pool.h),
 * m->kv_type, chosen at load: f32 for the reference backend (the oracle keeps K/V as it computed
 * them), IEEE f16 by default for the cpu backend (half the memory, and half the bytes a decode at
 * depth reads, which is what bounds it there), or blocks of 32 with an f16 scale (q8_0, q4_0).
 * cpu_pages.c's table converts each type to and from f32; cpu_vec.c's tables run attention on
 * it (kvg_vec_kv_of). */
typedef uint32_t kvg_cpu_kv_type;

/* bytes of a page row of n elements of `type` (n whole blocks) */
size_t kvg_cpu_kv_row_bytes(kvg_cpu_kv_type type, size_t n);
/* whether cpu_pages.c's table converts `type` */
bool kvg_cpu_kv_type_known(kvg_cpu_kv_type type);

/* The storage of one layer group's KV page pool (kvg_pool.h does the bookkeeping, kvg_model.h
 * the groups): page i holds, for every layer of the group, K then V as elements of `type`
 * [Hkv][page_size][head_dim], i.e. [Lg][2][Hkv][P][hd] with layers at their slot in the group;
 * a row of hd elements is row_bytes (quantized types: hd / 32 blocks).
 * Storage is allocated when the pool first hands a page out (kvg_cpu_pages_commit) and kept
 * until free. A page table `pages` (a session's, of this group) maps position p to page
 * pages[p / page_size]. */
typedef struct kvg_cpu_pages {
    kvg_hparams hp; /* the model's geometry: n_head_kv, head_dim, and RoPE for kv_copy; n_layer:
                       the layers of the group */
    const struct kvg_ref_rope_params *rope; /* per model layer, the RoPE kv_copy re-rotates K with
                                               (NULL: the adjacent-pair RoPE of hp) */
    const int *slot;   /* per model layer, its slot in the group (the model's layout) */
    const int *layers; /* per slot, the model layer */
    int page_size;
    int32_t n_pages;
    kvg_cpu_kv_type type; /* the elements' type */
    size_t row_bytes;     /* one head's row of head_dim elements of `type` */
    unsigned char **data; /* n_pages entries, NULL until committed */
    const char *who;      /* the owner, in error messages */
} kvg_cpu_pages;

/* K+V bytes of one position with elements of `type`, all layers */
size_t kvg_cpu_kv_bytes_per_token(const kvg_hparams *hp, kvg_cpu_kv_type type);
/* A pool size when the load asked for none: 16 sessions of min(context_length, 8192) tokens
 * (with elements of `type`), at most a quarter of physical RAM (room for the weights, the host
 * and other processes). */
size_t kvg_cpu_default_pool_bytes(const kvg_hparams *hp, kvg_cpu_kv_type type);

/* Reserves the table of n_pages pages of group `group` of the layout kv (no storage yet), with
 * elements of `type`; rope: the layers' RoPE (the caller's, outliving p), or NULL. */
kvgen_status kvg_cpu_pages_init(kvg_cpu_pages *p, const kvg_hparams *hp, const struct kvg_ref_rope_params *rope,
                                const kvg_kv_layout *kv, int group, int page_size, int32_t n_pages,
                                kvg_cpu_kv_type type, const char *who, kvgen_error *err);
/* Frees every committed page and the table; p may be zero-initialised (never inited). */
void kvg_cpu_pages_free(kvg_cpu_pages *p);
/* Gives page `page` its storage (no-op when it has some). */
kvgen_status kvg_cpu_pages_commit(kvg_cpu_pages *p, int32_t page, kvgen_error *err);

/* The head_dim elements of model layer `layer`'s K (which = 0) or V (which = 1), kv head h, at
 * position pos of the table `pages`; the layer is of p's group and the page committed. The
 * typed forms below say which type the caller expects. */
static inline void *kvg_cpu_pages_at(const kvg_cpu_pages *p, const int32_t *pages, int layer, int which, int h,
                                     int pos) {
    size_t P = (size_t)p->page_size, Hkv = (size_t)p->hp.n_head_kv;
    unsigned char *page = p->data[pages[pos / p->page_size]];
    size_t slot = (size_t)p->slot[layer];
    size_t row = ((slot * 2 + (size_t)which) * Hkv + (size_t)h) * P + (size_t)(pos % p->page_size);
    return page + row * p->row_bytes;
}
/* kvg_cpu_pages_at of f32 pages */
static inline float *kvg_cpu_pages_f32(const kvg_cpu_pages *p, const int32_t *pages, int layer, int which, int h,
                                       int pos) {
    return (float *)kvg_cpu_pages_at(p, pages, layer, which, h, pos);
}

/* f32 into a page's f16: rounded to nearest, ties to even; finite values beyond the half range
 * saturate to +-65504 (a key or value that large is already wrong, but an infinity would make
 * the softmax NaN for every later token); infinities and NaN stay what they are. */
uint16_t kvg_cpu_f32_to_kv_f16(float f);
/* n elements of `type` at src as f32 (exact), or f32 into n elements at dst (f16: as above;
 * q8_0, q4_0: each block of 32 quantized with its own scale, kvg_quant.h) */
void kvg_cpu_kv_to_f32(kvg_cpu_kv_type type, const void *src, float *dst, size_t n);
void kvg_cpu_kv_from_f32(kvg_cpu_kv_type type, const float *src, void *dst, size_t n);

/* The paged ops of kvg_backend_ops over host pages (see there): copies K/V of positions
 * [src_pos, src_pos+n) of one table to [dst_pos, ..) of another (or the same, dst_pos <=
 * src_pos), re-rotating K by rope_delta positions with the reference's RoPE (0: plain copy, the
 * bytes as they are): in f32, the result stored back in the pages' type. */
kvgen_status kvg_cpu_pages_copy(const kvg_cpu_pages *p, const int32_t *src_pages, int src_pos,
                                const int32_t *dst_pages, int dst_pos, int n, int rope_delta, kvgen_error *err);
/* One layer's K (which = 0) or V of positions [pos0, pos0+n) as f32 (kv_heads, n, head_dim);
 * write stores f32 in the pages' type (kvg_cpu_kv_from_f32), read converts back exactly (what
 * the pages hold: a quantized type's write then read is its rounding of the input). */
kvgen_status kvg_cpu_pages_read(const kvg_cpu_pages *p, const int32_t *pages, int layer, int which, int pos0, int n,
                                float *out, kvgen_error *err);
kvgen_status kvg_cpu_pages_write(const kvg_cpu_pages *p, const int32_t *pages, int layer, int which, int pos0, int n,
                                 const float *in, kvgen_error *err);

/* ---- what the reference and cpu backends share (cpu_common.c) -------------------------------- */

/* a small tensor (bias, norm, factors) as n floats in *out, or NULL for none; false: out of memory */
bool kvg_cpu_tensor_f32(const kvg_tensor *t, size_t n, float **out);

/* A layer's small tensors in f32, NULL where the model has none. */
typedef struct kvg_cpu_layer_tensors {
    float *attn_norm, *ffn_norm; /* [D] the sublayers' input norms */
    float *bq, *bk, *bv;         /* [H*hd], [Hkv*hd], [Hkv*hd] */
    float *q_norm, *k_norm;      /* [hd] */
    float *attn_post, *ffn_post; /* [D] */
    /* an encoder's post-norm block (bert) */
    float *bo;                   /* [D] attn_output bias */
    float *ln1_w, *ln1_b;        /* [D] attn_output_norm */
    float *b_up, *b_down;        /* [F], [D] */
    float *ln2_w, *ln2_b;        /* [D] layer_output_norm */
} kvg_cpu_layer_tensors;

/* An encoder call's activations kept with the model between calls (kvg_cpu_encode): a call that
 * finds them free (busy: false, swapped to true) uses and then returns them, growing them up to
 * KVG_CPU_KEEP_MAX bytes; a call that finds them busy (another thread's call on the same model)
 * or needs more allocates its own, as every call did before. Zero-initialised: free, empty. */
#define KVG_CPU_KEEP_MAX ((size_t)8 << 20)
typedef struct kvg_cpu_keep {
    atomic_bool busy;
    void *buf;
    size_t bytes;
} kvg_cpu_keep;

/* What a host backend keeps per model besides its weights: the first member of its model
 * (m->backend), so the page ops below find it there. */
typedef struct kvg_cpu_host {
    kvg_cpu_kv_type kv_type;       /* the pages' elements */
    const char *who;               /* the backend, in messages ("cpu backend") */
    kvg_cpu_layer_tensors *layers; /* [n_layer] */
    struct kvg_ref_rope_params *ropes; /* [n_layer]: the layers' RoPE, also for kv_copy's re-rotation */
    float *rope_factors;           /* [n_rot/2] rope_freqs in f32, or NULL */
    float *out_norm;               /* [D] the final norm, before the logits */
    float *embd_norm, *embd_norm_b; /* [D] an encoder's embedding LayerNorm */
    kvg_cpu_pages pages[KVG_KV_GROUPS]; /* the page pools' storage, per layer group (kvg_model.h) */
    kvg_cpu_keep encode_keep;      /* an encoder's activations between kvg_cpu_encode calls */
} kvg_cpu_host;

/* the layers' small tensors and RoPE, and pages of m->kv_type; kvg_cpu_host_free frees them (and
 * the pages) also after a failure; h zero-initialised before */
kvgen_status kvg_cpu_host_init(kvg_cpu_host *h, const kvgen_model *m, const char *who, kvgen_error *err);
void kvg_cpu_host_free(kvg_cpu_host *h, const kvgen_model *m);

/* A session's scratch for the activations of one block of tokens: the first member of a host
 * backend's session (kvg_batch_seq.bs), so kvg_cpu_check_seq finds n_ctx there. */
typedef struct kvg_cpu_scratch {
    int n_ctx;     /* C: positions the session may reach */
    int n_threads; /* the model's pool's */
    float *x;      /* [n][D] residual stream */
    float *xb;     /* [n][D] a sublayer's normed input (the cpu backend: then its output) */
    float *q;      /* [n][H*hd] */
    float *k;      /* [n][Hkv*hd] */
    float *v;      /* [n][Hkv*hd] */
    float *att;    /* [n][H*hd] attention output, heads concatenated */
    float *hb;     /* [n][F] gate, then act(gate) * up */
    float *hb2;    /* [n][F] up */
} kvg_cpu_scratch;
/* KVGEN_E_NO_MEMORY when a buffer could not be had (kvg_cpu_scratch_free frees the rest) */
kvgen_status kvg_cpu_scratch_init(kvg_cpu_scratch *s, const kvg_hparams *hp, int block, int n_ctx, int n_threads);
void kvg_cpu_scratch_free(kvg_cpu_scratch *s);

/* batch sequence i checked before a forward: its session, page tables and tokens, and room */
kvgen_status kvg_cpu_check_seq(const kvgen_model *m, const kvg_batch_seq *q, int i, const char *who, kvgen_error *err);
/* The next block of at most max tokens of the batch in order, from token *ti of sequence *si
 * (both advanced): token t of the block is tokens[t], token tok_of[t] of sequence seq_of[t].
 * Returns the block's size, 0 at the batch's end. */
int kvg_cpu_batch_block(const kvg_batch *b, int *si, int *ti, int max, int32_t *tokens, int *seq_of, int *tok_of);

/* ---- an encoder's forward pass (cpu_encode.c) ----
 * The reference and cpu backends run an encoder (kvg_arch.encoder: bert) through this one
 * graph and differ in their matrix products (and vec below): mm computes out[t] = in[t] W for
 * n <= block rows of in, W the matrix of `role` in layer `layer`. Every sequence of the batch is
 * run at once, layer by layer (a weight row is read once per block of tokens of all the texts),
 * attention within each sequence, both ways, without a cache; the work between the products
 * runs over the pool one token per item (its results do not depend on the threads). */
typedef void (*kvg_cpu_matmul_fn)(void *ctx, int layer, int role, const float *in, int in_dim, int n, float *out);
/* One product of a kvg_cpu_products_fn: out[t] = in[t] W for the matrix of `role`, then
 * out[t][i] += bias[i] (bias not NULL), then, where gelu, the exact GELU of vec->gelu_erf. */
typedef struct kvg_cpu_product {
    int role;
    float *out;        /* [n][out_dim] */
    int out_dim;       /* the rows of W */
    const float *bias; /* [out_dim], or NULL */
    bool gelu;
} kvg_cpu_product;
/* Up to 3 products of the same input rows in[0..n) (each in_dim wide), every token of the batch
 * at once, in one job of the pool: the threads meet once for all of them, and the bias and GELU
 * are applied by whichever thread computed the outputs, while they are in cache. Each output
 * must be the bits mm and the graph's own per-token bias and GELU would give (vec->gelu_erf is
 * element by element, so it gives the same bits over any slice of a row). */
typedef void (*kvg_cpu_products_fn)(void *ctx, int layer, const float *in, int in_dim, int n,
                                    const kvg_cpu_product *p, int n_products);
typedef struct kvg_cpu_encoder {
    const kvgen_model *m;
    const kvg_cpu_host *host;
    kvg_cpu_pool *pool;
    int block;                /* rows per call of mm */
    kvg_cpu_matmul_fn mm;     /* used where products is NULL */
    kvg_cpu_products_fn products; /* or NULL: each product through mm, then bias and GELU as jobs */
    void *mm_ctx;             /* mm's and products' */
    /* NULL: attention and GELU in scalar loops (the reference's arithmetic); else the backend's
     * vector operations (kvg_qdot.h) for attention's scores, softmax and weighted values and
     * for the feed-forward's GELU */
    const struct kvg_vec_ops *vec;
    kvg_cpu_keep *keep;       /* activations kept between calls, or NULL: allocated per call */
} kvg_cpu_encoder;
kvgen_status kvg_cpu_encode(const kvg_cpu_encoder *e, const kvg_encode_batch *b, kvgen_error *err);
/* out = (x - mean) / sqrt(var + eps) * w + b over n elements (out may alias x) */
void kvg_cpu_layernorm(float *out, const float *x, const float *w, const float *b, int n, float eps);
/* the exact GELU, 0.5 x (1 + erf(x / sqrt 2)) */
float kvg_cpu_gelu(float x);

/* kvg_backend_ops' page ops over m->backend's kvg_cpu_host */
size_t kvg_cpu_host_cache_bytes_per_token(const kvgen_model *m);
size_t kvg_cpu_host_default_pool_bytes(const kvgen_model *m);
kvgen_status kvg_cpu_host_pages_init(kvgen_model *m, int group, int page_size, int32_t n_pages, kvgen_error *err);
kvgen_status kvg_cpu_host_page_commit(kvgen_model *m, int group, int32_t page, kvgen_error *err);
kvgen_status kvg_cpu_host_kv_copy(kvgen_model *m, int group, const int32_t *src_pages, int src_pos,
                                  const int32_t *dst_pages, int dst_pos, int n, int rope_delta, kvgen_error *err);
kvgen_status kvg_cpu_host_kv_read(kvgen_model *m, const int32_t *pages, int layer, int which, int pos0, int n,
                                  float *out, kvgen_error *err);
kvgen_status kvg_cpu_host_kv_write(kvgen_model *m, const int32_t *pages, int layer, int which, int pos0, int n,
                                   const float *in, kvgen_error *err);
/* those ops as the designated initializers of a kvg_backend_ops */
#define KVG_CPU_HOST_PAGE_OPS                                                                                \
    .cache_bytes_per_token = kvg_cpu_host_cache_bytes_per_token,                                            \
    .kv_default_pool_bytes = kvg_cpu_host_default_pool_bytes, .kv_pages_init = kvg_cpu_host_pages_init,     \
    .kv_page_commit = kvg_cpu_host_page_commit, .kv_copy = kvg_cpu_host_kv_copy,                            \
    .kv_read = kvg_cpu_host_kv_read, .kv_write = kvg_cpu_host_kv_write

#endif
