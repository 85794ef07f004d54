/* model.c: describes the weights of a llama-architecture GGUF (hyperparameters, tensors,
 * shapes and types), refusing what kvgen cannot run with a message that says why. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_quant.h"

#define MAX_DIM (1 << 20) /* far above any real model; keeps products of dimensions inside int */

typedef struct ctx {
    const kvg_gguf *g;
    const char *path;
    kvgen_error *err;
} ctx;

/* a positive integer key (absent: *out unchanged unless required); an error when present but unusable */
static kvgen_status get_int(ctx *c, const char *key, bool required, int64_t max, int *out) {
    int64_t v;
    if (kvg_gguf_find_key(c->g, key) < 0) {
        if (!required) return KVGEN_OK;
        return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: missing metadata key %s", c->path, key);
    }
    if (!kvg_gguf_get_i64(c->g, key, &v))
        return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: metadata key %s is not an integer", c->path, key);
    if (v <= 0 || v > max)
        return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: %s = %" PRId64 " is out of range (1 to %" PRId64 ")", c->path,
                        key, v, max);
    *out = (int)v;
    return KVGEN_OK;
}

static kvgen_status get_dim(ctx *c, const char *key, bool required, int *out) {
    return get_int(c, key, required, MAX_DIM, out);
}

static kvgen_status get_float(ctx *c, const char *key, float *out) {
    if (kvg_gguf_find_key(c->g, key) < 0) return KVGEN_OK;
    float v;
    if (!kvg_gguf_get_f32(c->g, key, &v) || !isfinite(v) || v <= 0.0f)
        return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: metadata key %s must be a positive number", c->path, key);
    *out = v;
    return KVGEN_OK;
}

static kvgen_status read_hparams(ctx *c, kvg_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    hp->rope_freq_base = 10000.0f;
    hp->rms_norm_eps = 1e-5f;
    kvgen_status st;
    if ((st = get_dim(c, "llama.block_count", true, &hp->n_layer)) ||
        (st = get_dim(c, "llama.embedding_length", true, &hp->n_embd)) ||
        (st = get_dim(c, "llama.feed_forward_length", true, &hp->n_ff)) ||
        (st = get_dim(c, "llama.attention.head_count", true, &hp->n_head)))
        return st;
    hp->n_head_kv = hp->n_head;
    if ((st = get_dim(c, "llama.attention.head_count_kv", false, &hp->n_head_kv))) return st;
    if (hp->n_embd % hp->n_head != 0 && kvg_gguf_find_key(c->g, "llama.attention.key_length") < 0)
        return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: embedding_length %d is not a multiple of head_count %d", c->path,
                        hp->n_embd, hp->n_head);
    hp->head_dim = hp->n_embd / hp->n_head;
    if ((st = get_dim(c, "llama.attention.key_length", false, &hp->head_dim))) return st;
    int value_length = hp->head_dim;
    if ((st = get_dim(c, "llama.attention.value_length", false, &value_length))) return st;
    hp->n_rot = hp->head_dim;
    if ((st = get_dim(c, "llama.rope.dimension_count", false, &hp->n_rot))) return st;
    hp->n_ctx_train = 2048;
    /* training contexts run to millions of tokens; the value only bounds what sessions may ask for */
    if ((st = get_int(c, "llama.context_length", false, INT32_MAX, &hp->n_ctx_train))) return st;
    if ((st = get_float(c, "llama.rope.freq_base", &hp->rope_freq_base)) ||
        (st = get_float(c, "llama.attention.layer_norm_rms_epsilon", &hp->rms_norm_eps)))
        return st;
    if ((st = get_dim(c, "llama.vocab_size", false, &hp->n_vocab))) return st;
    if (hp->n_vocab == 0) {
        kvg_gguf_vtype et;
        uint64_t n;
        if (kvg_gguf_get_arr(c->g, "tokenizer.ggml.tokens", &et, &n) && n > 0 && n <= MAX_DIM) hp->n_vocab = (int)n;
    }
    if (hp->n_vocab == 0) {
        const kvg_tensor *t = kvg_gguf_find_tensor(c->g, "token_embd.weight");
        if (t && t->n_dims == 2 && t->ne[1] <= MAX_DIM) hp->n_vocab = (int)t->ne[1];
    }
    if (hp->n_vocab == 0)
        return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: cannot tell the vocabulary size (no llama.vocab_size, "
                        "tokenizer.ggml.tokens or token_embd.weight)", c->path);

    /* the forward pass relies on these relations */
    if (hp->n_head % hp->n_head_kv != 0)
        return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: head_count %d is not a multiple of head_count_kv %d", c->path,
                        hp->n_head, hp->n_head_kv);
    if (hp->n_head * hp->head_dim != hp->n_embd)
        return kvg_fail(c->err, KVGEN_E_UNSUPPORTED,
                        "%s: head_count %d x head size %d != embedding_length %d (kvgen needs them equal)", c->path,
                        hp->n_head, hp->head_dim, hp->n_embd);
    if (value_length != hp->head_dim)
        return kvg_fail(c->err, KVGEN_E_UNSUPPORTED, "%s: attention.value_length %d differs from key_length %d",
                        c->path, value_length, hp->head_dim);
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: rope.dimension_count %d must be even and at most the head size %d",
                        c->path, hp->n_rot, hp->head_dim);
    return KVGEN_OK;
}

/* finds a tensor and checks its type and shape (a 1-D shape when ne1 == 0) */
static kvgen_status get_tensor(ctx *c, const char *name, uint64_t ne0, uint64_t ne1, bool f32_only, bool optional,
                               const kvg_tensor **out) {
    const kvg_tensor *t = kvg_gguf_find_tensor(c->g, name);
    *out = t;
    if (!t) {
        if (optional) return KVGEN_OK;
        return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: missing tensor %s", c->path, name);
    }
    if (!kvg_type_supported(t->type)) {
        uint32_t types[64];
        char list[256];
        size_t nt = kvg_traits_types(types, 64);
        kvg_types_list(types, nt < 64 ? nt : 64, list, sizeof list);
        return kvg_fail(c->err, KVGEN_E_UNSUPPORTED, "%s: tensor %s has type %s, which kvgen does not support "
                        "(supported: %s)", c->path, name, kvg_type_name(t->type), list);
    }
    if (f32_only && t->type != KVG_TYPE_F32)
        return kvg_fail(c->err, KVGEN_E_UNSUPPORTED, "%s: tensor %s has type %s; kvgen needs F32 for norm weights",
                        c->path, name, kvg_type_name(t->type));
    bool ok = ne1 ? (t->n_dims == 2 && t->ne[0] == ne0 && t->ne[1] == ne1)
                  : (t->n_elements == ne0 && t->ne[0] == ne0);
    if (!ok) {
        char shape[96];
        int n = snprintf(shape, sizeof shape, "[%" PRIu64, t->ne[0]);
        for (int d = 1; d < t->n_dims && n > 0 && (size_t)n < sizeof shape; d++)
            n += snprintf(shape + n, sizeof shape - (size_t)n, ", %" PRIu64, t->ne[d]);
        if (n > 0 && (size_t)n < sizeof shape) snprintf(shape + n, sizeof shape - (size_t)n, "]");
        if (ne1)
            return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: tensor %s has shape %s, expected [%" PRIu64 ", %" PRIu64 "]",
                            c->path, name, shape, ne0, ne1);
        return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: tensor %s has shape %s, expected [%" PRIu64 "]", c->path, name,
                        shape, ne0);
    }
    return KVGEN_OK;
}

kvgen_status kvg_weights_describe(const kvg_gguf *g, kvg_weights *w, kvgen_error *err) {
    memset(w, 0, sizeof *w);
    ctx c = {g, kvg_gguf_path(g), err};
    kvg_str arch;
    if (!kvg_gguf_get_str(g, "general.architecture", &arch))
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: missing metadata key general.architecture", c.path);
    if (arch.len != 5 || memcmp(arch.ptr, "llama", 5) != 0)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: architecture '%.*s' is not supported (kvgen runs: llama)",
                        c.path, (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    kvgen_status st = read_hparams(&c, &w->hp);
    if (st) return st;
    const kvg_hparams *hp = &w->hp;
    uint64_t embd = (uint64_t)hp->n_embd, vocab = (uint64_t)hp->n_vocab, ff = (uint64_t)hp->n_ff;
    uint64_t q_dim = (uint64_t)hp->n_head * (uint64_t)hp->head_dim;
    uint64_t kv_dim = (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim;
    if ((st = get_tensor(&c, "token_embd.weight", embd, vocab, false, false, &w->tok_embd)) ||
        (st = get_tensor(&c, "output_norm.weight", embd, 0, true, false, &w->output_norm)) ||
        (st = get_tensor(&c, "output.weight", embd, vocab, false, true, &w->output)))
        return st;
    w->tied = w->output == NULL;
    if (w->tied) w->output = w->tok_embd;
    w->layers = calloc((size_t)hp->n_layer, sizeof *w->layers);
    if (!w->layers) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", c.path);
    for (int i = 0; i < hp->n_layer && !st; i++) {
        kvg_layer *l = &w->layers[i];
        char name[64];
#define LAYER_TENSOR(field, suffix, ne0, ne1, f32)                                                   \
    if (!st) {                                                                                       \
        snprintf(name, sizeof name, "blk.%d.%s.weight", i, suffix);                                  \
        st = get_tensor(&c, name, ne0, ne1, f32, false, &l->field);                                  \
    }
        LAYER_TENSOR(attn_norm, "attn_norm", embd, 0, true)
        LAYER_TENSOR(wq, "attn_q", embd, q_dim, false)
        LAYER_TENSOR(wk, "attn_k", embd, kv_dim, false)
        LAYER_TENSOR(wv, "attn_v", embd, kv_dim, false)
        LAYER_TENSOR(wo, "attn_output", q_dim, embd, false)
        LAYER_TENSOR(ffn_norm, "ffn_norm", embd, 0, true)
        LAYER_TENSOR(w_gate, "ffn_gate", embd, ff, false)
        LAYER_TENSOR(w_up, "ffn_up", embd, ff, false)
        LAYER_TENSOR(w_down, "ffn_down", ff, embd, false)
#undef LAYER_TENSOR
    }
    if (st) kvg_weights_free(w);
    return st;
}

void kvg_weights_free(kvg_weights *w) {
    if (!w) return;
    free(w->layers);
    w->layers = NULL;
}

/* ---- which backend runs which weight types ---- */

#define MAX_BACKEND_TYPES 64 /* more than ggml numbers */

bool kvg_backend_runs_type(const kvg_backend_ops *ops, uint32_t type) {
    if (!ops || !ops->weight_types) return false;
    uint32_t types[MAX_BACKEND_TYPES];
    size_t n = ops->weight_types(types, MAX_BACKEND_TYPES);
    for (size_t i = 0; i < n && i < MAX_BACKEND_TYPES; i++)
        if (types[i] == type) return true;
    return false;
}

static kvgen_status check_tensor_type(const char *path, const kvg_tensor *t, const kvg_backend_ops *ops,
                                      const uint32_t *types, size_t n, kvgen_error *err) {
    if (!t) return KVGEN_OK;
    for (size_t i = 0; i < n; i++)
        if (types[i] == t->type) return KVGEN_OK;
    char list[512];
    kvg_types_list(types, n, list, sizeof list);
    return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: tensor %s has type %s, which the %s backend does not run "
                    "(%s runs: %s)", path, t->name, kvg_type_name(t->type), ops->name, ops->name, n ? list : "none");
}

kvgen_status kvg_weights_check_types(const kvgen_model *m, const kvg_backend_ops *ops, kvgen_error *err) {
    const char *path = m->gguf ? kvg_gguf_path(m->gguf) : "model";
    if (!ops->weight_types)
        return kvg_fail(err, KVGEN_E_INTERNAL, "%s: the %s backend lists no weight types", path, ops->name);
    uint32_t types[MAX_BACKEND_TYPES];
    size_t n = ops->weight_types(types, MAX_BACKEND_TYPES);
    if (n > MAX_BACKEND_TYPES) n = MAX_BACKEND_TYPES;
    const kvg_weights *w = &m->w;
    kvgen_status st = KVGEN_OK;
    const kvg_tensor *top[] = {w->tok_embd, w->output, w->output_norm};
    for (size_t i = 0; i < sizeof top / sizeof top[0] && st == KVGEN_OK; i++)
        st = check_tensor_type(path, top[i], ops, types, n, err);
    for (int l = 0; w->layers && l < w->hp.n_layer && st == KVGEN_OK; l++) {
        const kvg_layer *L = &w->layers[l];
        const kvg_tensor *ts[] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->ffn_norm, L->w_gate, L->w_up, L->w_down};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0] && st == KVGEN_OK; i++)
            st = check_tensor_type(path, ts[i], ops, types, n, err);
    }
    return st;
}
