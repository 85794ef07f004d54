/* kvg_adapter.h: LoRA adapters of a model (private; adapter.c). An adapter is a GGUF of
 * general.type "adapter" holding, for some of the model's matrices W ([n_in] -> [n_out]), a
 * low-rank pair A ([n_in] -> [r]) and B ([r] -> [n_out]) stored as "<W's name>.lora_a" and
 * "<W's name>.lora_b". A session runs with a set of adapters and scales (kvg_lora_set); the
 * backends that run them (kvg_backend_ops.lora) add, after each matrix product y = W x of a
 * sequence whose set has a pair for that matrix, s * B (A x) in f32 (kvg_lora_add), where
 * s = scale * alpha / r when the file's alpha is not 0, else scale. */
#ifndef KVG_ADAPTER_H
#define KVG_ADAPTER_H
#include <stdint.h>
#include "kvg_model.h"

/* The matrices of a layer an adapter may change, in the order of kvg_layer's fields. */
typedef enum kvg_lora_target {
    KVG_LORA_Q, KVG_LORA_K, KVG_LORA_V, KVG_LORA_O, KVG_LORA_GATE, KVG_LORA_UP, KVG_LORA_DOWN,
    KVG_LORA_TARGETS
} kvg_lora_target;

/* One matrix's pair, as f32 (dequantized at load): t = A x (rank values), y += s * B t. */
typedef struct kvg_lora_pair {
    int rank, n_in, n_out;  /* rank 0: the adapter leaves this matrix alone */
    float *a;               /* [rank][n_in] */
    float *b;               /* B transposed: [rank][n_out] */
} kvg_lora_pair;

struct kvgen_adapter {
    int refcount;            /* the caller's, and one per session set holding it (atomic) */
    kvgen_model *model;      /* holds one reference */
    char *path, *name;       /* name: general.name, else the file's base name */
    uint64_t hash;           /* the content hash (session files name adapters by it) */
    float alpha;             /* adapter.lora.alpha (0: absent) */
    int max_rank, n_pairs;
    kvg_lora_pair *pairs;    /* [n_layer][KVG_LORA_TARGETS] */
    struct kvgen_adapter *next; /* the model's other adapters (adapter.c's registry) */
};

/* The adapters a session runs with: up to KVGEN_MAX_ADAPTERS, each with the caller's scale. */
typedef struct kvg_lora_set {
    int n;
    kvgen_adapter *adapter[KVGEN_MAX_ADAPTERS];
    float scale[KVGEN_MAX_ADAPTERS];
} kvg_lora_set;

/* the pair of (layer, target) in a, or NULL when a leaves that matrix alone */
const kvg_lora_pair *kvg_adapter_pair(const kvgen_adapter *a, int layer, kvg_lora_target target);

/* y[t] += sum over the adapters of sets[t]: s * B (A x[t]), for the n tokens of a block (x[t]:
 * in_dim floats at x + t * in_dim, y[t]: out_dim floats at y + t * out_dim). sets[t] NULL or
 * empty: token t is left alone; sets NULL: every token is. Computed in f32 on the caller's
 * thread, in the same order whatever the block around a token holds. */
void kvg_lora_add(const kvg_lora_set *const *sets, int layer, kvg_lora_target target, const float *x, int in_dim,
                  int n, float *y, int out_dim);

/* A hash of the set (its adapters' hashes and scales, in order); KVG_PAGE_HASH_ROOT's
 * replacement as the prefix cache's root, so pages computed under different sets never meet.
 * 0 for an empty set. */
uint64_t kvg_lora_set_key(const kvg_lora_set *set);

/* Copies src into dst (dst's own adapters released first), taking a reference on each. */
void kvg_lora_set_copy(kvg_lora_set *dst, const kvg_lora_set *src);
/* Releases the set's adapters and empties it. */
void kvg_lora_set_clear(kvg_lora_set *set);

/* A loaded adapter of m whose content hash is `hash`, with a reference taken (the caller
 * releases it with kvgen_adapter_free), or NULL. Thread-safe. */
kvgen_adapter *kvg_adapter_find(kvgen_model *m, uint64_t hash);
void kvg_adapter_retain(kvgen_adapter *a);

#endif
