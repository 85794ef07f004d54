/* adapter.c: LoRA adapters (kvg_adapter.h): loading llama.cpp's GGUF adapter format, checked
 * against the model before anything is kept; the model's registry of loaded adapters (session
 * files name adapters by content hash); the low-rank product the backends add per sequence.
 *
 * The pairs are dequantized to f32 at load: a pair is rank x (n_in + n_out) values, small next
 * to the matrix it changes, and the product t = A x, y += s B t then reads plain floats. A
 * fused matrix of the file (attn_qkv, a gate-and-up ffn_up) is adapted through its parts: each
 * part gets A whole and the rows of B that are its own, so the backends, which only ever see
 * the parts, need no case of their own. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_adapter.h"
#include "kvg_backend.h"
#include "kvg_hash.h"
#include "kvg_platform.h"
#include "kvg_pool.h"
#include "kvg_quant.h"
#include "kvg_str.h"

#define LORA_MAX_RANK 1024 /* kvg_lora_add's stack buffer */

/* ---- the model's registry -------------------------------------------------------------------- */

typedef struct adapter_registry {
    kvg_mutex lock;
    kvgen_adapter *head;
} adapter_registry;

static void registry_free(void *value) {
    adapter_registry *r = value;
    kvg_mutex_destroy(&r->lock);
    kvg_free(r);
}

static const kvg_attach_key registry_key = {"lora adapters", registry_free};

static adapter_registry *registry_of(kvgen_model *m) {
    adapter_registry *r = kvg_model_attached(m, &registry_key);
    if (r) return r;
    r = kvg_calloc(1, sizeof *r);
    if (!r) return NULL;
    if (kvg_mutex_init(&r->lock) != 0) {
        kvg_free(r);
        return NULL;
    }
    adapter_registry *there = kvg_model_attach(m, &registry_key, r);
    if (there != r) registry_free(r);
    return there;
}

kvgen_adapter *kvg_adapter_find(kvgen_model *m, uint64_t hash) {
    adapter_registry *r = kvg_model_attached(m, &registry_key);
    if (!r) return NULL;
    kvgen_adapter *found = NULL;
    kvg_mutex_lock(&r->lock);
    for (kvgen_adapter *a = r->head; a && !found; a = a->next)
        if (a->hash == hash && __atomic_load_n(&a->refcount, __ATOMIC_ACQUIRE) > 0) found = a;
    if (found) kvg_adapter_retain(found);
    kvg_mutex_unlock(&r->lock);
    return found;
}

void kvg_adapter_retain(kvgen_adapter *a) { __atomic_add_fetch(&a->refcount, 1, __ATOMIC_RELAXED); }
void kvgen_adapter_retain(kvgen_adapter *a) {
    if (a) kvg_adapter_retain(a);
}

static void adapter_destroy(kvgen_adapter *a) {
    if (a->model->ops && a->model->ops->adapter_free && a->model->backend) a->model->ops->adapter_free(a->model, a);
    if (a->pairs)
        for (int i = 0; i < a->model->w.hp.n_layer * KVG_LORA_TARGETS; i++) {
            kvg_free(a->pairs[i].a);
            kvg_free(a->pairs[i].b);
        }
    kvg_free(a->pairs);
    kvg_free(a->path);
    kvg_free(a->name);
    kvgen_model *m = a->model;
    kvg_free(a);
    kvg_model_release(m);
}

void kvgen_adapter_free(kvgen_adapter *a) {
    if (!a) return;
    adapter_registry *r = kvg_model_attached(a->model, &registry_key);
    /* under the lock, so kvg_adapter_find never retains one on its way out */
    kvg_mutex_lock(&r->lock);
    bool last = __atomic_sub_fetch(&a->refcount, 1, __ATOMIC_ACQ_REL) == 0;
    if (last)
        for (kvgen_adapter **p = &r->head; *p; p = &(*p)->next)
            if (*p == a) {
                *p = a->next;
                break;
            }
    kvg_mutex_unlock(&r->lock);
    if (last) adapter_destroy(a);
}

void kvgen_adapter_get_info(const kvgen_adapter *a, kvgen_adapter_info *info) {
    if (!info) return;
    *info = (kvgen_adapter_info){0};
    if (!a) return;
    *info = (kvgen_adapter_info){.name = a->name, .path = a->path, .alpha = a->alpha, .max_rank = a->max_rank,
                                 .n_matrices = a->n_pairs, .hash = a->hash};
}

const kvg_lora_pair *kvg_adapter_pair(const kvgen_adapter *a, int layer, kvg_lora_target target) {
    const kvg_lora_pair *p = &a->pairs[layer * KVG_LORA_TARGETS + target];
    return p->rank > 0 ? p : NULL;
}

/* ---- loading ---------------------------------------------------------------------------------- */

/* the layer matrix of a target */
static const kvg_tensor *target_tensor(const kvg_layer *L, kvg_lora_target t) {
    const kvg_tensor *ts[KVG_LORA_TARGETS] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
    return ts[t];
}

static const char *const target_names[KVG_LORA_TARGETS] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                           "ffn_gate", "ffn_up", "ffn_down"};

/* The parts of the model that the file's tensor `whole` is: each (layer, target) whose matrix
 * is `whole` itself (row0 0) or a view of its rows (row0 its first row). Returns how many. */
typedef struct target_part {
    int layer;
    kvg_lora_target target;
    int row0, rows;
} target_part;

static int parts_of(const kvgen_model *m, const kvg_tensor *whole, target_part *out, int max) {
    int n = 0;
    for (int l = 0; l < m->w.hp.n_layer; l++)
        for (int t = 0; t < KVG_LORA_TARGETS; t++) {
            const kvg_tensor *x = target_tensor(&m->w.layers[l], (kvg_lora_target)t);
            if (!x || n == max) continue;
            if (x == whole) {
                out[n++] = (target_part){l, (kvg_lora_target)t, 0, (int)whole->ne[1]};
                continue;
            }
            for (int v = 0; v < m->w.n_views; v++)
                if (&m->w.views[v].t == x && m->w.views[v].whole == whole) {
                    size_t row = kvg_row_bytes(whole->type, whole->ne[0]);
                    int row0 = (int)(((const char *)x->data - (const char *)whole->data) / row);
                    out[n++] = (target_part){l, (kvg_lora_target)t, row0, (int)x->ne[1]};
                }
        }
    return n;
}

static bool ends_with(const char *s, const char *suffix, size_t *stem) {
    size_t n = strlen(s), k = strlen(suffix);
    if (n <= k || strcmp(s + n - k, suffix) != 0) return false;
    *stem = n - k;
    return true;
}

/* a tensor as f32 rows: ne[1] rows of ne[0] */
static float *dequantize(const kvg_tensor *t) {
    float *out = kvg_malloc((size_t)t->ne[0] * (size_t)t->ne[1] * sizeof *out);
    if (!out) return NULL;
    size_t row = kvg_row_bytes(t->type, t->ne[0]);
    for (uint64_t r = 0; r < t->ne[1]; r++)
        kvg_dequantize_row(t->type, (const unsigned char *)t->data + r * row, out + r * t->ne[0], t->ne[0]);
    return out;
}

static bool str_is(kvg_str s, const char *want) { return s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0; }

/* Checks one pair of the file against the model and, with a non-NULL adapter, keeps it. */
static kvgen_status load_pair(kvgen_model *m, const kvg_gguf *g, const kvg_tensor *ta, const char *base,
                              kvgen_adapter *a, const char *path, kvgen_error *err) {
    char bname[176]; /* base is below 160 bytes (walk_pairs) */
    snprintf(bname, sizeof bname, "%.159s.lora_b", base);
    const kvg_tensor *tb = kvg_gguf_find_tensor(g, bname);
    if (!tb)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: tensor %s.lora_a has no %s (a LoRA pair needs both halves)", path,
                        base, bname);
    const kvg_tensor *w = kvg_gguf_find_tensor(m->gguf, base);
    if (!w)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: tensor %s.lora_a adapts %s, which model %s does not have",
                        path, base, base, m->name ? m->name : "");
    target_part parts[KVG_FUSED_MAX_PARTS];
    int n_parts = parts_of(m, w, parts, KVG_FUSED_MAX_PARTS);
    if (n_parts == 0)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: tensor %s.lora_a adapts %s; kvgen adapts only the attention "
                        "(attn_q, attn_k, attn_v, attn_qkv, attn_output) and feed-forward (ffn_gate, ffn_up, "
                        "ffn_down) matrices of the layers", path, base, base);
    const kvg_tensor *halves[2] = {ta, tb};
    for (int h = 0; h < 2; h++)
        if (!kvg_type_traits_of(halves[h]->type))
            return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: tensor %s has type %s, which kvgen does not dequantize",
                            path, halves[h]->name, kvg_type_name(halves[h]->type));
    /* 1-D is [n, 1]: ggml's writer drops trailing dimensions of 1 (a rank-1 lora_a) */
    if (ta->n_dims > 2 || tb->n_dims > 2 || ta->ne[0] != w->ne[0] || tb->ne[1] != w->ne[1] ||
        ta->ne[1] != tb->ne[0] || ta->ne[1] == 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "%s: tensor %s: lora_a is [%llu, %llu] and lora_b [%llu, %llu], but %s is [%llu, %llu] "
                        "(lora_a must be [n_in, rank] = [%llu, r], lora_b [r, n_out] = [r, %llu])", path, base,
                        (unsigned long long)ta->ne[0], (unsigned long long)ta->ne[1], (unsigned long long)tb->ne[0],
                        (unsigned long long)tb->ne[1], base, (unsigned long long)w->ne[0],
                        (unsigned long long)w->ne[1], (unsigned long long)w->ne[0], (unsigned long long)w->ne[1]);
    int rank = (int)ta->ne[1];
    if (rank > LORA_MAX_RANK)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: tensor %s.lora_a has rank %d; kvgen runs ranks up to %d", path,
                        base, rank, LORA_MAX_RANK);
    if (!a) return KVGEN_OK;
    float *fa = dequantize(ta), *fb = dequantize(tb);
    kvgen_status st = fa && fb ? KVGEN_OK : kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", path);
    for (int i = 0; st == KVGEN_OK && i < n_parts; i++) {
        kvg_lora_pair *p = &a->pairs[parts[i].layer * KVG_LORA_TARGETS + parts[i].target];
        if (p->rank > 0) {
            st = kvg_fail(err, KVGEN_E_FORMAT, "%s: tensor %s.lora_a: blk.%d.%s is adapted twice", path, base,
                          parts[i].layer, target_names[parts[i].target]);
            break;
        }
        size_t na = (size_t)rank * w->ne[0], nb = (size_t)parts[i].rows * rank;
        p->a = kvg_malloc(na * sizeof(float));
        p->b = kvg_malloc(nb * sizeof(float));
        if (!p->a || !p->b) {
            st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", path);
            break;
        }
        memcpy(p->a, fa, na * sizeof(float));
        /* B transposed: rank rows of n_out, so y += B t is a run of contiguous axpys */
        for (int o = 0; o < parts[i].rows; o++)
            for (int r = 0; r < rank; r++)
                p->b[(size_t)r * parts[i].rows + o] = fb[(size_t)(parts[i].row0 + o) * rank + r];
        *p = (kvg_lora_pair){.rank = rank, .n_in = (int)w->ne[0], .n_out = parts[i].rows, .a = p->a, .b = p->b};
        a->n_pairs++;
        if (rank > a->max_rank) a->max_rank = rank;
    }
    kvg_free(fa);
    kvg_free(fb);
    return st;
}

/* The file's metadata: an adapter of the model's architecture. */
static kvgen_status check_header(const kvgen_model *m, const kvg_gguf *g, const char *path, float *alpha,
                                 kvgen_error *err) {
    kvg_str type, atype, arch, march;
    if (!kvg_gguf_get_str(g, "general.type", &type) || !str_is(type, "adapter"))
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: not an adapter (general.type is %.*s, not \"adapter\")", path,
                        kvg_gguf_get_str(g, "general.type", &type) ? (int)type.len : 9,
                        kvg_gguf_get_str(g, "general.type", &type) ? type.ptr : "not there");
    if (!kvg_gguf_get_str(g, "adapter.type", &atype) || !str_is(atype, "lora"))
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: not a LoRA adapter (adapter.type is %.*s, not \"lora\")", path,
                        kvg_gguf_get_str(g, "adapter.type", &atype) ? (int)atype.len : 9,
                        kvg_gguf_get_str(g, "adapter.type", &atype) ? atype.ptr : "not there");
    if (!kvg_gguf_get_str(g, "general.architecture", &arch))
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: missing metadata key general.architecture", path);
    if (!kvg_gguf_get_str(m->gguf, "general.architecture", &march) || march.len != arch.len ||
        memcmp(march.ptr, arch.ptr, arch.len) != 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: an adapter for architecture %.*s, but the model is %.*s",
                        path, (int)arch.len, arch.ptr, (int)march.len, march.ptr);
    *alpha = 0.0f;
    if (kvg_gguf_find_key(g, "adapter.lora.alpha") >= 0 && !kvg_gguf_get_f32(g, "adapter.lora.alpha", alpha))
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: adapter.lora.alpha is not a float32", path);
    if (!isfinite(*alpha)) return kvg_fail(err, KVGEN_E_FORMAT, "%s: adapter.lora.alpha is not finite", path);
    return KVGEN_OK;
}

/* Every pair of the file: checked (a NULL) or kept. */
static kvgen_status walk_pairs(kvgen_model *m, const kvg_gguf *g, kvgen_adapter *a, const char *path, int *n_pairs,
                               kvgen_error *err) {
    *n_pairs = 0;
    for (int i = 0; i < kvg_gguf_n_tensors(g); i++) {
        const kvg_tensor *t = kvg_gguf_tensor(g, i);
        size_t stem;
        char base[160];
        if (ends_with(t->name, ".lora_b", &stem)) { /* a lone B: its A is what is missing */
            char a_name[176];
            snprintf(a_name, sizeof a_name, "%.*s.lora_a", stem < 159 ? (int)stem : 159, t->name);
            if (!kvg_gguf_find_tensor(g, a_name))
                return kvg_fail(err, KVGEN_E_FORMAT, "%s: tensor %s has no %s (a LoRA pair needs both halves)", path,
                                t->name, a_name);
            continue;
        }
        if (!ends_with(t->name, ".lora_a", &stem)) continue; /* not a pair's: left alone, as llama.cpp does */
        if (stem >= sizeof base)
            return kvg_fail(err, KVGEN_E_FORMAT, "%s: tensor name %s is too long", path, t->name);
        memcpy(base, t->name, stem);
        base[stem] = '\0';
        kvgen_status st = load_pair(m, g, t, base, a, path, err);
        if (st != KVGEN_OK) return st;
        (*n_pairs)++;
    }
    if (*n_pairs == 0) return kvg_fail(err, KVGEN_E_FORMAT, "%s: an adapter without LoRA tensors (*.lora_a)", path);
    return KVGEN_OK;
}

static uint64_t content_hash(const kvg_gguf *g, float alpha) {
    kvg_hash64 h = KVG_HASH64_INIT;
    kvg_hash64_add(&h, &alpha, sizeof alpha);
    for (int i = 0; i < kvg_gguf_n_tensors(g); i++) {
        const kvg_tensor *t = kvg_gguf_tensor(g, i);
        size_t stem;
        if (!ends_with(t->name, ".lora_a", &stem) && !ends_with(t->name, ".lora_b", &stem)) continue;
        kvg_hash64_add(&h, t->name, strlen(t->name) + 1);
        kvg_hash64_add_u64(&h, t->type);
        for (int d = 0; d < 2; d++) kvg_hash64_add_u64(&h, t->ne[d]);
        kvg_hash64_add(&h, t->data, t->nbytes);
    }
    return kvg_hash64_final(&h);
}

kvgen_status kvgen_adapter_load(kvgen_model *m, const char *path, kvgen_adapter **out, kvgen_error *err) {
    if (out) *out = NULL;
    if (!m) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_adapter_load: model is NULL");
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_adapter_load: out is NULL");
    if (!path || !*path) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_adapter_load: path is empty");
    if (!m->gguf || !m->w.layers || (m->w.arch && m->w.arch->encoder))
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "kvgen_adapter_load: %s: model %s runs no adapters (%s)", path,
                        m->name ? m->name : "", m->gguf ? "an encoder" : "not a local model");
    adapter_registry *reg = registry_of(m);
    if (!reg) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_adapter_load: out of memory");
    kvg_gguf *g;
    kvgen_status st = kvg_gguf_open(path, &g, err);
    if (st != KVGEN_OK) return st;
    float alpha;
    int n_pairs;
    st = check_header(m, g, path, &alpha, err);
    if (st == KVGEN_OK) st = walk_pairs(m, g, NULL, path, &n_pairs, err); /* every check before any copy */
    kvgen_adapter *a = NULL;
    if (st == KVGEN_OK) {
        a = kvg_calloc(1, sizeof *a);
        if (a) a->pairs = kvg_calloc((size_t)m->w.hp.n_layer * KVG_LORA_TARGETS, sizeof *a->pairs);
        if (a) a->path = kvg_strdup(path);
        kvg_str name;
        const char *slash = strrchr(path, '/');
        if (a) a->name = kvg_gguf_get_str(g, "general.name", &name) ? kvg_memdup0(name.ptr, name.len)
                                                                     : kvg_strdup(slash ? slash + 1 : path);
        if (!a || !a->pairs || !a->path || !a->name) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", path);
    }
    if (st == KVGEN_OK) {
        a->model = m;
        a->alpha = alpha;
        a->hash = content_hash(g, alpha);
        st = walk_pairs(m, g, a, path, &n_pairs, err);
    }
    kvg_gguf_close(g);
    if (st != KVGEN_OK) {
        if (a) {
            __atomic_add_fetch(&m->refcount, 1, __ATOMIC_RELAXED); /* adapter_destroy releases it */
            a->model = m;
            adapter_destroy(a);
        }
        return st;
    }
    a->refcount = 1;
    __atomic_add_fetch(&m->refcount, 1, __ATOMIC_RELAXED);
    kvg_mutex_lock(&reg->lock);
    a->next = reg->head;
    reg->head = a;
    kvg_mutex_unlock(&reg->lock);
    *out = a;
    return KVGEN_OK;
}

/* ---- sets and the product --------------------------------------------------------------------- */

uint64_t kvg_lora_set_key(const kvg_lora_set *set) {
    if (!set || set->n == 0) return 0;
    kvg_hash64 h = KVG_HASH64_INIT;
    kvg_hash64_add_u64(&h, KVG_PAGE_HASH_ROOT);
    for (int i = 0; i < set->n; i++) {
        kvg_hash64_add_u64(&h, set->adapter[i]->hash);
        kvg_hash64_add(&h, &set->scale[i], sizeof set->scale[i]);
    }
    uint64_t k = kvg_hash64_final(&h);
    return k ? k : 1;
}

void kvg_lora_set_clear(kvg_lora_set *set) {
    int n = set->n;
    kvgen_adapter *held[KVGEN_MAX_ADAPTERS];
    memcpy(held, set->adapter, sizeof held);
    *set = (kvg_lora_set){0};
    for (int i = 0; i < n; i++) kvgen_adapter_free(held[i]);
}

void kvg_lora_set_copy(kvg_lora_set *dst, const kvg_lora_set *src) {
    kvg_lora_set old = *dst;
    *dst = *src;
    for (int i = 0; i < dst->n; i++) kvg_adapter_retain(dst->adapter[i]);
    kvg_lora_set_clear(&old); /* after: dst and src may hold the same adapters */
}

/* sum of a[j] * b[j] in eight interleaved partial sums, added in a fixed order: the compiler
 * may keep the lanes in one vector register, and the result is the same on every machine */
enum { LORA_OUT_BLOCK = 256 }; /* outputs summed in registers and L1 at once */

static float dot_f32(const float *a, const float *b, int n) {
    float lane[8] = {0};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) lane[l] += a[j + l] * b[j + l];
    for (; j < n; j++) lane[j & 7] += a[j] * b[j];
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

void kvg_lora_add(const kvg_lora_set *const *sets, int layer, kvg_lora_target target, const float *x, int in_dim,
                  int n, float *y, int out_dim) {
    if (!sets) return;
    float t[LORA_MAX_RANK];
    for (int k = 0; k < n; k++) {
        const kvg_lora_set *set = sets[k];
        for (int i = 0; set && i < set->n; i++) {
            const kvgen_adapter *a = set->adapter[i];
            const kvg_lora_pair *p = kvg_adapter_pair(a, layer, target);
            if (!p || p->n_in != in_dim || p->n_out != out_dim) continue;
            float s = a->alpha != 0.0f ? set->scale[i] * a->alpha / (float)p->rank : set->scale[i];
            const float *xk = x + (size_t)k * in_dim;
            float *yk = y + (size_t)k * out_dim;
            for (int r = 0; r < p->rank; r++) { /* t = s * A x                                [rank] */
                t[r] = s * dot_f32(p->a + (size_t)r * in_dim, xk, in_dim);
            }
            /* y += B t, a block of outputs at a time: each output sums its rank terms in order */
            for (int o0 = 0; o0 < out_dim; o0 += LORA_OUT_BLOCK) {
                int no = out_dim - o0 < LORA_OUT_BLOCK ? out_dim - o0 : LORA_OUT_BLOCK;
                float acc[LORA_OUT_BLOCK];
                for (int o = 0; o < no; o++) acc[o] = 0.0f;
                for (int r = 0; r < p->rank; r++) {
                    const float *br = p->b + (size_t)r * out_dim + o0, tr = t[r];
                    for (int o = 0; o < no; o++) acc[o] += tr * br[o];
                }
                for (int o = 0; o < no; o++) yk[o0 + o] += acc[o];
            }
        }
    }
}
