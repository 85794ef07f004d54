/* model.c: describes the weights of a GGUF whose architecture has a row in the table
 * (arch.c): hyperparameters, tensors, shapes and types, refusing what kvgen cannot run with a
 * message that says why. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_backend.h"
#include "kvg_quant.h"

#define MAX_DIM (1 << 20) /* far above any real model; keeps products of dimensions inside int */

typedef struct ctx {
    const kvg_gguf *g;
    const char *path;
    const kvg_arch *arch;
    kvgen_error *err;
    char key[128]; /* the last key built by K() */
} ctx;

/* "<prefix>.<suffix>": the row's metadata key */
static const char *K(ctx *c, const char *suffix) {
    snprintf(c->key, sizeof c->key, "%s.%s", c->arch->prefix, suffix);
    return c->key;
}

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

/* Metadata that changes the forward pass: a file carrying one its row does not read (a gemma2
 * file labelled llama, an ALiBi or clamped-QKV model) is refused, never run wrong. A zero says
 * "none" and passes. */
static kvgen_status check_unread_keys(ctx *c) {
    static const char *const keys[] = {"attn_logit_softcapping", "final_logit_softcapping", "attention.clamp_kqv",
                                       "attention.max_alibi_bias"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        bool read = strstr(keys[i], "softcapping") && c->arch->softcap;
        if (read || kvg_gguf_find_key(c->g, K(c, keys[i])) < 0) continue;
        float v = 0.0f;
        int64_t iv = 0;
        if ((kvg_gguf_get_f32(c->g, K(c, keys[i]), &v) && v == 0.0f) ||
            (kvg_gguf_get_i64(c->g, K(c, keys[i]), &iv) && iv == 0))
            continue;
        return kvg_fail(c->err, KVGEN_E_UNSUPPORTED, "%s: metadata %s would change the %s forward pass, which kvgen "
                        "does not apply to this architecture (the file is mislabelled or needs a feature kvgen lacks)",
                        c->path, K(c, keys[i]), c->arch->name);
    }
    return KVGEN_OK;
}

static kvgen_status read_hparams(ctx *c, kvg_hparams *hp, uint32_t *features) {
    memset(hp, 0, sizeof *hp);
    hp->rope_freq_base = 10000.0f;
    hp->rms_norm_eps = 1e-5f;
    kvgen_status st;
    if ((st = get_dim(c, K(c, "block_count"), true, &hp->n_layer)) ||
        (st = get_dim(c, K(c, "embedding_length"), true, &hp->n_embd)) ||
        (st = get_dim(c, K(c, "feed_forward_length"), true, &hp->n_ff)) ||
        (st = get_dim(c, K(c, "attention.head_count"), true, &hp->n_head)))
        return st;
    hp->n_head_kv = hp->n_head;
    if ((st = get_dim(c, K(c, "attention.head_count_kv"), false, &hp->n_head_kv))) return st;
    if (hp->n_embd % hp->n_head != 0 && kvg_gguf_find_key(c->g, K(c, "attention.key_length")) < 0)
        return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: embedding_length %d is not a multiple of head_count %d", c->path,
                        hp->n_embd, hp->n_head);
    hp->head_dim = hp->n_embd / hp->n_head;
    if ((st = get_dim(c, K(c, "attention.key_length"), false, &hp->head_dim))) return st;
    int value_length = hp->head_dim;
    if ((st = get_dim(c, K(c, "attention.value_length"), false, &value_length))) return st;
    hp->n_rot = hp->head_dim;
    if ((st = get_dim(c, K(c, "rope.dimension_count"), false, &hp->n_rot))) return st;
    hp->n_ctx_train = 2048;
    /* training contexts run to millions of tokens; the value only bounds what sessions may ask for */
    if ((st = get_int(c, K(c, "context_length"), false, INT32_MAX, &hp->n_ctx_train))) return st;
    if ((st = get_float(c, K(c, "rope.freq_base"), &hp->rope_freq_base)) ||
        (st = get_float(c, K(c, "attention.layer_norm_rms_epsilon"), &hp->rms_norm_eps)))
        return st;
    if (c->arch->softcap && ((st = get_float(c, K(c, "attn_logit_softcapping"), &hp->attn_softcap)) ||
                             (st = get_float(c, K(c, "final_logit_softcapping"), &hp->final_softcap))))
        return st;
    if (c->arch->sliding_window && (st = get_int(c, K(c, "attention.sliding_window"), false, INT32_MAX, &hp->n_swa)))
        return st;
    /* RoPE scaling: linear (positions scaled) runs; a kind kvgen does not run is refused */
    hp->rope_freq_scale = 1.0f;
    kvg_str scaling;
    if (kvg_gguf_find_key(c->g, K(c, "rope.scaling.type")) >= 0) {
        if (!kvg_gguf_get_str(c->g, K(c, "rope.scaling.type"), &scaling))
            return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: %s is not a string", c->path, K(c, "rope.scaling.type"));
        bool none = scaling.len == 4 && memcmp(scaling.ptr, "none", 4) == 0;
        bool linear = scaling.len == 6 && memcmp(scaling.ptr, "linear", 6) == 0;
        if (!none && !linear)
            return kvg_fail(c->err, KVGEN_E_UNSUPPORTED, "%s: RoPE scaling '%.*s' (%s) is not supported (kvgen runs "
                            "none and linear)", c->path, (int)(scaling.len > 32 ? 32 : scaling.len), scaling.ptr,
                            K(c, "rope.scaling.type"));
        float factor = 1.0f;
        if (linear && (st = get_float(c, K(c, "rope.scaling.factor"), &factor))) return st;
        if (linear) hp->rope_freq_scale = 1.0f / factor;
    }
    /* read for every row, as llama.cpp does: it multiplies cos and sin (the rotated dimensions of Q
     * and K) */
    hp->rope_attn_factor = 1.0f;
    if ((st = get_float(c, K(c, "rope.scaling.attn_factor"), &hp->rope_attn_factor))) return st;
    if (hp->rope_attn_factor != 1.0f) *features |= KVG_F_ROPE_ATTN_FACTOR;
    if (c->arch->rope_factors &&
        (st = get_int(c, K(c, "rope.scaling.original_context_length"), false, INT32_MAX, &hp->n_ctx_orig)))
        return st;
    if ((st = get_dim(c, K(c, "vocab_size"), false, &hp->n_vocab))) return st;
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
        return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: cannot tell the vocabulary size (no %s, "
                        "tokenizer.ggml.tokens or token_embd.weight)", c->path, K(c, "vocab_size"));

    /* the forward pass relies on these relations */
    if (hp->n_head % hp->n_head_kv != 0)
        return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: head_count %d is not a multiple of head_count_kv %d", c->path,
                        hp->n_head, hp->n_head_kv);
    /* allowed here; a backend that cannot run it refuses (kvg_arch_check_backend) */
    if ((int64_t)hp->n_head * hp->head_dim != hp->n_embd) *features |= KVG_F_WIDE_HEADS;
    if (value_length != hp->head_dim)
        return kvg_fail(c->err, KVGEN_E_UNSUPPORTED, "%s: attention.value_length %d differs from key_length %d",
                        c->path, value_length, hp->head_dim);
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: rope.dimension_count %d must be even and at most the head size %d",
                        c->path, hp->n_rot, hp->head_dim);
    if (hp->attn_softcap > 0.0f || hp->final_softcap > 0.0f) *features |= KVG_F_SOFTCAP;
    if (hp->n_swa > 0) *features |= KVG_F_SLIDING_WINDOW;
    if (c->arch->encoder) {
        hp->layer_norm_eps = 1e-12f;
        if ((st = get_float(c, K(c, "attention.layer_norm_epsilon"), &hp->layer_norm_eps))) return st;
        int64_t pooling = 0;
        if (kvg_gguf_find_key(c->g, K(c, "pooling_type")) >= 0 &&
            (!kvg_gguf_get_i64(c->g, K(c, "pooling_type"), &pooling) || pooling < 0 || pooling > KVG_POOLING_LAST))
            return kvg_fail(c->err, KVGEN_E_UNSUPPORTED, "%s: %s must be 0 (none), 1 (mean), 2 (cls) or 3 (last)",
                            c->path, K(c, "pooling_type"));
        hp->pooling = (int)pooling;
        bool causal = false;
        if (kvg_gguf_find_key(c->g, K(c, "attention.causal")) >= 0 &&
            (!kvg_gguf_get_bool(c->g, K(c, "attention.causal"), &causal) || causal))
            return kvg_fail(c->err, KVGEN_E_UNSUPPORTED, "%s: %s must be false: kvgen runs %s as a bidirectional "
                            "encoder", c->path, K(c, "attention.causal"), c->arch->name);
        if (hp->n_head_kv != hp->n_head)
            return kvg_fail(c->err, KVGEN_E_FORMAT, "%s: %s = %d differs from head_count %d (an encoder has one K/V "
                            "head per query head)", c->path, K(c, "attention.head_count_kv"), hp->n_head_kv, hp->n_head);
        *features |= KVG_F_ENCODER;
    }
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

/* a 2-D tensor of rows ne0 wide, however many (token_types: one row per type) */
static kvgen_status get_tensor_rows(ctx *c, const char *name, uint64_t ne0, bool optional, const kvg_tensor **out) {
    const kvg_tensor *t = kvg_gguf_find_tensor(c->g, name);
    uint64_t rows = t && t->n_dims == 2 && t->ne[1] > 0 && t->ne[1] <= MAX_DIM ? t->ne[1] : 1;
    return get_tensor(c, name, ne0, rows, false, optional, out);
}

/* ---- tensors the row does not use ---- */

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)*(const void *const *)a, y = (uintptr_t)*(const void *const *)b;
    return x < y ? -1 : x > y;
}

/* whether an unused tensor would change the math were it meant to be applied: biases, norms,
 * RoPE factors, or any tensor name of the table */
static bool changes_math(const char *name) {
    size_t n = strlen(name);
    if (n >= 5 && strcmp(name + n - 5, ".bias") == 0) return true;
    if (strstr(name, "norm") || strncmp(name, "rope_", 5) == 0) return true;
    const char *base = name;
    if (strncmp(name, "blk.", 4) == 0) {
        base = name + 4;
        while (*base >= '0' && *base <= '9') base++;
        if (*base == '.') base++;
    }
    for (int r = 0; r < KVG_T_COUNT; r++) {
        const char *p = kvg_tensor_pattern((kvg_tensor_role)r);
        if (strncmp(p, "blk.%d.", 7) == 0) p += 7;
        if (strcmp(p, base) == 0) return true;
    }
    return false;
}

/* appends name to a ", "-separated list of at most 6 names, counting the rest */
static void list_add(char *buf, size_t size, int *count, const char *name) {
    if (*count < 6) {
        size_t len = strlen(buf);
        snprintf(buf + len, size - len, "%s%s", len ? ", " : "", name);
    }
    (*count)++;
}

/* Every tensor of the file is one the description uses; else an error listing those that
 * would change the math, or one warning (the logger) listing the others. */
static kvgen_status check_unused(ctx *c, const kvg_weights *w) {
    int n_t = kvg_gguf_n_tensors(c->g);
    size_t n_used = 0, cap = 9 + (size_t)w->hp.n_layer * KVG_T_COUNT + (size_t)w->n_views;
    const void **used = kvg_malloc(cap * sizeof *used);
    if (!used) return kvg_fail(c->err, KVGEN_E_NO_MEMORY, "%s: out of memory", c->path);
    const kvg_tensor *top[] = {w->tok_embd,  w->output_norm, w->output,      w->rope_freqs, w->rope_factors_long,
                               w->pos_embd,  w->tok_types,   w->embd_norm,   w->embd_norm_b};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (top[i]) used[n_used++] = top[i];
    for (int i = 0; i < w->n_views; i++) used[n_used++] = w->views[i].whole;
    for (int l = 0; l < w->hp.n_layer; l++) {
        const kvg_layer *L = &w->layers[l];
        const kvg_tensor *ts[] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->ffn_norm, L->w_gate, L->w_up,
                                  L->w_down, L->bq, L->bk, L->bv, L->q_norm, L->k_norm, L->attn_post_norm,
                                  L->ffn_post_norm, L->bo, L->attn_out_norm, L->attn_out_norm_b, L->b_up,
                                  L->b_down, L->out_norm, L->out_norm_b};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            if (ts[i] && n_used < cap) used[n_used++] = ts[i];
    }
    qsort(used, n_used, sizeof *used, cmp_ptr);
    char math[512] = "", other[512] = "";
    int n_math = 0, n_other = 0;
    for (int i = 0; i < n_t; i++) {
        const kvg_tensor *t = kvg_gguf_tensor(c->g, i);
        const void *key = t;
        if (bsearch(&key, used, n_used, sizeof *used, cmp_ptr)) continue;
        if (changes_math(t->name)) list_add(math, sizeof math, &n_math, t->name);
        else list_add(other, sizeof other, &n_other, t->name);
    }
    kvg_free(used);
    if (n_math)
        return kvg_fail(c->err, KVGEN_E_UNSUPPORTED, "%s: %d tensor%s that the %s architecture does not use would "
                        "change its math: %s%s (the file is mislabelled or of an architecture kvgen does not run)",
                        c->path, n_math, n_math == 1 ? "" : "s", c->arch->name, math, n_math > 6 ? ", ..." : "");
    if (n_other)
        kvg_log(KVGEN_LOG_WARNING, "%s: ignoring %d tensor%s the %s architecture does not use: %s%s", c->path, n_other,
                n_other == 1 ? "" : "s", c->arch->name, other, n_other > 6 ? ", ..." : "");
    return KVGEN_OK;
}

/* ---- fused matrices ---- */

/* the field of a layer that a per-layer role fills (NULL for a role without one: attn_qkv) */
static const kvg_tensor **layer_field(kvg_layer *l, kvg_tensor_role role) {
    switch (role) {
    case KVG_T_ATTN_Q: return &l->wq;
    case KVG_T_ATTN_K: return &l->wk;
    case KVG_T_ATTN_V: return &l->wv;
    case KVG_T_FFN_GATE: return &l->w_gate;
    case KVG_T_FFN_UP: return &l->w_up;
    default: return NULL;
    }
}

/* the output rows of a role that can be part of a fused matrix */
static uint64_t part_rows(const kvg_hparams *hp, kvg_tensor_role role) {
    switch (role) {
    case KVG_T_ATTN_Q: return (uint64_t)hp->n_head * (uint64_t)hp->head_dim;
    case KVG_T_ATTN_K:
    case KVG_T_ATTN_V: return (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim;
    case KVG_T_FFN_GATE:
    case KVG_T_FFN_UP: return (uint64_t)hp->n_ff;
    default: return 0;
    }
}

/* Finds layer i's fused tensor of layout f, checks its shape ([n_embd, the parts' rows summed]),
 * and points the layer's fields of the parts at views of its row ranges, in order. */
static kvgen_status describe_fused(ctx *c, kvg_weights *w, int i, const kvg_fused *f) {
    char name[64];
    snprintf(name, sizeof name, kvg_tensor_pattern(f->whole), i);
    uint64_t rows = 0;
    for (int p = 0; p < f->n_parts; p++) rows += part_rows(&w->hp, f->parts[p]);
    const kvg_tensor *t;
    kvgen_status st = get_tensor(c, name, (uint64_t)w->hp.n_embd, rows, false, false, &t);
    if (st) return st;
    size_t row_bytes = kvg_row_bytes(t->type, t->ne[0]);
    uint64_t r0 = 0;
    for (int p = 0; p < f->n_parts; p++) {
        uint64_t n = part_rows(&w->hp, f->parts[p]);
        kvg_tensor_view *v = &w->views[w->n_views++];
        v->whole = t;
        snprintf(v->name, sizeof v->name, "%s (%s rows)", name, kvg_tensor_short(f->parts[p]));
        v->t = *t;
        v->t.name = v->name;
        v->t.ne[1] = n;
        v->t.n_elements = t->ne[0] * n;
        v->t.offset = t->offset + r0 * row_bytes;
        v->t.nbytes = (size_t)n * row_bytes;
        v->t.data = (const unsigned char *)t->data + r0 * row_bytes;
        *layer_field(&w->layers[i], f->parts[p]) = &v->t;
        r0 += n;
    }
    return KVGEN_OK;
}

/* ---- the description ---- */

kvgen_status kvg_weights_describe(const kvg_gguf *g, kvg_weights *w, kvgen_error *err) {
    memset(w, 0, sizeof *w);
    ctx c = {.g = g, .path = kvg_gguf_path(g), .err = err};
    kvg_str name;
    if (!kvg_gguf_get_str(g, "general.architecture", &name))
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: missing metadata key general.architecture", c.path);
    const kvg_arch *arch = kvg_arch_find(name.ptr, name.len);
    if (!arch) {
        char runs[256], known[256];
        kvg_arch_list(true, runs, sizeof runs);
        kvg_arch_list(false, known, sizeof known);
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: architecture '%.*s' is not supported (kvgen runs: %s)%s%s",
                        c.path, (int)(name.len > 64 ? 64 : name.len), name.ptr, runs,
                        known[0] ? "; known, not run yet: " : "", known);
    }
    c.arch = arch;
    w->arch = arch;
    w->rope = arch->rope;
    w->act = arch->act;
    w->embd_scale = 1.0f;
    uint32_t features = 0;
    if (arch->rope == KVG_ROPE_NEOX) features |= KVG_F_ROPE_NEOX;
    if (arch->act == KVG_ACT_GELU_TANH_GATED) features |= KVG_F_GELU;
    kvgen_status st = read_hparams(&c, &w->hp, &features);
    if (!st) st = check_unread_keys(&c);
    if (st) return st;
    const kvg_hparams *hp = &w->hp;
    if (arch->embd_scale) {
        w->embd_scale = sqrtf((float)hp->n_embd);
        features |= KVG_F_EMBD_SCALE;
    }
    uint64_t embd = (uint64_t)hp->n_embd, vocab = (uint64_t)hp->n_vocab, ff = (uint64_t)hp->n_ff;
    uint64_t q_dim = (uint64_t)hp->n_head * (uint64_t)hp->head_dim;
    uint64_t kv_dim = (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim;
    uint64_t hd = (uint64_t)hp->head_dim;
    uint64_t want = arch->required | arch->optional;
#define HAS(role) (want & KVG_T_BIT(KVG_T_##role))
#define OPT(role) ((arch->required & KVG_T_BIT(KVG_T_##role)) == 0)
    if ((st = get_tensor(&c, "token_embd.weight", embd, vocab, false, false, &w->tok_embd)) ||
        (HAS(OUTPUT_NORM) && (st = get_tensor(&c, "output_norm.weight", embd, 0, true, false, &w->output_norm))) ||
        (HAS(POS_EMBD) && (st = get_tensor_rows(&c, "position_embd.weight", embd, OPT(POS_EMBD), &w->pos_embd))) ||
        (HAS(TOKEN_TYPES) && (st = get_tensor_rows(&c, "token_types.weight", embd, OPT(TOKEN_TYPES), &w->tok_types))) ||
        (HAS(TOKEN_EMBD_NORM) &&
         (st = get_tensor(&c, "token_embd_norm.weight", embd, 0, true, OPT(TOKEN_EMBD_NORM), &w->embd_norm))) ||
        (HAS(TOKEN_EMBD_NORM_BIAS) &&
         (st = get_tensor(&c, "token_embd_norm.bias", embd, 0, true, OPT(TOKEN_EMBD_NORM_BIAS), &w->embd_norm_b))) ||
        (HAS(OUTPUT) && (st = get_tensor(&c, "output.weight", embd, vocab, false, OPT(OUTPUT), &w->output))) ||
        (HAS(ROPE_FREQS) && (st = get_tensor(&c, "rope_freqs.weight", (uint64_t)hp->n_rot / 2, 0, true,
                                             OPT(ROPE_FREQS), &w->rope_freqs))))
        return st;
    /* Phi-3's LongRoPE factors: llama.cpp takes the short ones for contexts up to
     * original_context_length and the long ones past it. kvgen runs the short ones as rope_freqs
     * and limits sessions to that length when the file has long ones. */
    if (arch->rope_factors &&
        ((st = get_tensor(&c, "rope_factors_short.weight", (uint64_t)hp->n_rot / 2, 0, true, true, &w->rope_freqs)) ||
         (st = get_tensor(&c, "rope_factors_long.weight", (uint64_t)hp->n_rot / 2, 0, true, true,
                          &w->rope_factors_long))))
        return st;
    /* an encoder's positions: at least its context (a file may hold more, the context being what it
     * was trained to embed) */
    if (w->pos_embd && w->pos_embd->ne[1] < (uint64_t)hp->n_ctx_train)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: position_embd.weight has %" PRIu64 " positions, fewer than %s = %d",
                        c.path, w->pos_embd->ne[1], K(&c, "context_length"), hp->n_ctx_train);
    if (w->rope_factors_long) w->hp.n_ctx_rope = hp->n_ctx_orig > 0 ? hp->n_ctx_orig : hp->n_ctx_train;
    if (w->rope_freqs) features |= KVG_F_ROPE_FREQS;
    w->tied = w->output == NULL;
    if (w->tied) w->output = w->tok_embd;
    w->layers = kvg_calloc((size_t)hp->n_layer, sizeof *w->layers);
    if (!w->layers) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", c.path);
    uint64_t fused_parts = 0; /* roles the views of fused matrices fill */
    int views_per_layer = 0;
    for (uint32_t k = 1; k && k <= arch->fused; k <<= 1) {
        const kvg_fused *f = (arch->fused & k) ? kvg_fused_layout(k) : NULL;
        for (int p = 0; f && p < f->n_parts; p++) fused_parts |= KVG_T_BIT(f->parts[p]);
        if (f) views_per_layer += f->n_parts;
    }
    if (views_per_layer) {
        w->views = kvg_calloc((size_t)hp->n_layer * (size_t)views_per_layer, sizeof *w->views);
        if (!w->views) {
            kvg_weights_free(w);
            return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", c.path);
        }
    }
    for (int i = 0; i < hp->n_layer && !st; i++) {
        kvg_layer *l = &w->layers[i];
        char tname[64];
        for (uint32_t k = 1; k && k <= arch->fused && !st; k <<= 1)
            if (arch->fused & k) st = describe_fused(&c, w, i, kvg_fused_layout(k));
#define LAYER_TENSOR(field, role, ne0, ne1, f32)                                                     \
    if (!st && HAS(role) && !(fused_parts & KVG_T_BIT(KVG_T_##role))) {                              \
        snprintf(tname, sizeof tname, kvg_tensor_pattern(KVG_T_##role), i);                          \
        st = get_tensor(&c, tname, ne0, ne1, f32, OPT(role), &l->field);                             \
    }
        LAYER_TENSOR(attn_norm, ATTN_NORM, embd, 0, true)
        LAYER_TENSOR(wq, ATTN_Q, embd, q_dim, false)
        LAYER_TENSOR(wk, ATTN_K, embd, kv_dim, false)
        LAYER_TENSOR(wv, ATTN_V, embd, kv_dim, false)
        LAYER_TENSOR(bq, ATTN_Q_BIAS, q_dim, 0, true)
        LAYER_TENSOR(bk, ATTN_K_BIAS, kv_dim, 0, true)
        LAYER_TENSOR(bv, ATTN_V_BIAS, kv_dim, 0, true)
        LAYER_TENSOR(q_norm, ATTN_Q_NORM, hd, 0, true)
        LAYER_TENSOR(k_norm, ATTN_K_NORM, hd, 0, true)
        LAYER_TENSOR(wo, ATTN_OUT, q_dim, embd, false)
        LAYER_TENSOR(attn_post_norm, ATTN_POST_NORM, embd, 0, true)
        LAYER_TENSOR(ffn_norm, FFN_NORM, embd, 0, true)
        LAYER_TENSOR(w_gate, FFN_GATE, embd, ff, false)
        LAYER_TENSOR(w_up, FFN_UP, embd, ff, false)
        LAYER_TENSOR(w_down, FFN_DOWN, ff, embd, false)
        LAYER_TENSOR(ffn_post_norm, FFN_POST_NORM, embd, 0, true)
        LAYER_TENSOR(bo, ATTN_OUT_BIAS, embd, 0, true)
        LAYER_TENSOR(attn_out_norm, ATTN_OUT_NORM, embd, 0, true)
        LAYER_TENSOR(attn_out_norm_b, ATTN_OUT_NORM_BIAS, embd, 0, true)
        LAYER_TENSOR(b_up, FFN_UP_BIAS, ff, 0, true)
        LAYER_TENSOR(b_down, FFN_DOWN_BIAS, embd, 0, true)
        LAYER_TENSOR(out_norm, LAYER_OUT_NORM, embd, 0, true)
        LAYER_TENSOR(out_norm_b, LAYER_OUT_NORM_BIAS, embd, 0, true)
#undef LAYER_TENSOR
        /* attention facts: local (sliding-window) layers by the row's pattern, with their own RoPE
         * base (the file's <prefix>.rope.freq_base_swa, else the row's) and no position scaling */
        int p = arch->swa_pattern;
        l->swa = hp->n_swa > 0 && (p == 0 || i % p < p - 1);
        l->rope_base = hp->rope_freq_base;
        l->rope_scale = hp->rope_freq_scale;
        if (l->swa) {
            l->rope_scale = 1.0f;
            if (arch->rope_base_swa > 0.0f) l->rope_base = arch->rope_base_swa;
            if (!st && kvg_gguf_find_key(g, K(&c, "rope.freq_base_swa")) >= 0)
                st = get_float(&c, K(&c, "rope.freq_base_swa"), &l->rope_base);
        }
        if (l->bq || l->bk || l->bv) features |= KVG_F_ATTN_BIAS;
        if (l->q_norm || l->k_norm) features |= KVG_F_QK_NORM;
        if (l->attn_post_norm || l->ffn_post_norm) features |= KVG_F_POST_NORMS;
    }
#undef HAS
#undef OPT
    if (!st) st = check_unused(&c, w);
    w->features = features;
    if (st) kvg_weights_free(w);
    return st;
}

void kvg_weights_free(kvg_weights *w) {
    if (!w) return;
    kvg_free(w->layers);
    w->layers = NULL;
    kvg_free(w->views);
    w->views = NULL;
    w->n_views = 0;
}

/* ---- load progress ---- */

#define PROGRESS_STEP ((uint64_t)1 << 20) /* bytes between two reports of a byte stage */

static const char *stage_name(kvgen_load_stage stage) {
    switch (stage) {
    case KVGEN_LOAD_READ: return "reading the weights";
    case KVGEN_LOAD_UPLOAD: return "preparing the weights";
    case KVGEN_LOAD_PIPELINES: return "building pipelines";
    }
    return "loading";
}

kvgen_status kvg_load_progress(kvgen_model *m, kvgen_load_stage stage, uint64_t done, uint64_t total,
                               kvgen_error *err) {
    if (!m->progress) return KVGEN_OK;
    bool first = m->progress_stage != (int)stage;
    bool bytes = stage != KVGEN_LOAD_PIPELINES;
    if (!first && ((done == m->progress_last && total == m->progress_total) ||
                   (done != total && bytes && done - m->progress_last < PROGRESS_STEP)))
        return KVGEN_OK; /* nothing new, or less than a step of it */
    m->progress_stage = (int)stage;
    m->progress_last = done;
    m->progress_total = total;
    if (m->progress(m->progress_user, stage, done, total)) return KVGEN_OK;
    const char *path = m->gguf ? kvg_gguf_path(m->gguf) : "model";
    return kvg_fail(err, KVGEN_E_CANCELLED,
                    "kvgen_model_load: %s: cancelled by the progress callback while %s (%" PRIu64 " of %" PRIu64 ")",
                    path, stage_name(stage), done, total);
}

/* One byte of every page, so the mapping's pages are read from the file now, in order; a
 * volatile sink keeps the reads. */
kvgen_status kvg_weights_read(kvgen_model *m, kvgen_error *err) {
    if (!m->progress) return KVGEN_OK;
    const int n = kvg_gguf_n_tensors(m->gguf);
    uint64_t total = 0, done = 0;
    for (int i = 0; i < n; i++) total += kvg_gguf_tensor(m->gguf, i)->nbytes;
    if (total == 0) return kvg_load_progress(m, KVGEN_LOAD_READ, 0, 0, err);
    volatile unsigned char sink = 0;
    for (int i = 0; i < n; i++) {
        const kvg_tensor *t = kvg_gguf_tensor(m->gguf, i);
        const unsigned char *p = t->data;
        for (size_t at = 0; at < t->nbytes; at += 4096) sink ^= p[at];
        done += t->nbytes;
        kvgen_status st = kvg_load_progress(m, KVGEN_LOAD_READ, done, total, err);
        if (st != KVGEN_OK) return st;
    }
    (void)sink;
    return KVGEN_OK;
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
    const kvg_tensor *top[] = {w->tok_embd, w->output, w->output_norm, w->pos_embd, w->tok_types, w->embd_norm,
                               w->embd_norm_b};
    for (size_t i = 0; i < sizeof top / sizeof top[0] && st == KVGEN_OK; i++)
        st = check_tensor_type(path, top[i], ops, types, n, err);
    for (int l = 0; w->layers && l < w->hp.n_layer && st == KVGEN_OK; l++) {
        const kvg_layer *L = &w->layers[l];
        const kvg_tensor *ts[] = {L->attn_norm, L->wq,     L->wk, L->wv, L->wo,     L->ffn_norm,       L->w_gate,
                                  L->w_up,      L->w_down, L->bq, L->bk, L->bv,     L->q_norm,         L->k_norm,
                                  L->attn_post_norm, L->ffn_post_norm, L->bo, L->attn_out_norm,
                                  L->attn_out_norm_b, L->b_up, L->b_down, L->out_norm, L->out_norm_b};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0] && st == KVGEN_OK; i++)
            st = check_tensor_type(path, ts[i], ops, types, n, err);
    }
    if (st == KVGEN_OK) st = check_tensor_type(path, w->rope_freqs, ops, types, n, err);
    return st;
}

kvgen_status kvg_arch_check_backend(const kvgen_model *m, const kvg_backend_ops *ops, kvgen_error *err) {
    const char *path = m->gguf ? kvg_gguf_path(m->gguf) : "model";
    uint32_t missing = m->w.features & ~ops->features;
    if (!missing) return KVGEN_OK;
    uint32_t first = missing & (~missing + 1u);
    return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: %s needs %s, which the %s backend does not run yet", path,
                    m->w.arch ? m->w.arch->name : "the model", kvg_feature_name(first), ops->name);
}
