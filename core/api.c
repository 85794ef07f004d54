/* api.c: the public model and session calls of kvgen.h: argument checks, backend choice,
 * reference counting, and the session's bookkeeping (tokens, logits, context limit, sampler)
 * around a backend's forward pass. The tokenizer calls live in tokenizer.c / detok.c. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_quant.h"
#include "kvg_sampler.h"

/* Sessions beyond this many positions are refused: it keeps every size computation far
 * from overflow and catches a garbage n_ctx before it asks for terabytes. */
#define KVG_MAX_CTX (1 << 20)
#define KVG_DEFAULT_CTX 4096

struct kvgen_session {
    kvgen_model *model; /* holds one reference */
    kvg_backend_session *bs;
    int n_ctx;
    bool no_cache;
    int32_t *tokens; /* n_ctx entries; the first n_tokens are in the cache */
    size_t n_tokens;
    float *logits; /* n_vocab */
    bool has_logits;
    kvg_sampler sampler;
};

/* ---- models ----------------------------------------------------------------------------- */

static void model_free(kvgen_model *m) {
    if (!m) return;
    if (m->ops && m->backend) m->ops->model_free(m);
    kvg_tokenizer_free(m->tok);
    kvg_weights_free(&m->w);
    kvg_gguf_close(m->gguf);
    free(m->name);
    free(m);
}

static void model_retain(kvgen_model *m) { __atomic_add_fetch(&m->refcount, 1, __ATOMIC_RELAXED); }

static void model_release(kvgen_model *m) {
    if (m && __atomic_sub_fetch(&m->refcount, 1, __ATOMIC_ACQ_REL) == 0) model_free(m);
}

static char *dup_range(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static char *model_name(const kvg_gguf *g, const char *path) {
    kvg_str s;
    if (kvg_gguf_get_str(g, "general.name", &s) && s.len > 0 && s.len < 4096) return dup_range(s.ptr, (size_t)s.len);
    const char *base = strrchr(path, '/');
    return dup_range(base ? base + 1 : path, strlen(base ? base + 1 : path));
}

/* Which backend a load asks for: the desc, else $KVGEN_BACKEND, else "whatever works". */
static kvgen_status choose_backend(const kvgen_model_desc *desc, kvgen_backend *out, kvgen_error *err) {
    *out = desc->backend;
    if (*out != KVGEN_BACKEND_DEFAULT) return KVGEN_OK;
    const char *env = getenv("KVGEN_BACKEND");
    if (!env || !*env) return KVGEN_OK;
    if (strcmp(env, "reference") == 0) *out = KVGEN_BACKEND_REFERENCE;
    else if (strcmp(env, "vulkan") == 0) *out = KVGEN_BACKEND_VULKAN;
    else
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "KVGEN_BACKEND=%s: expected \"reference\" or \"vulkan\"", env);
    return KVGEN_OK;
}

static kvgen_status init_backend(kvgen_model *m, const kvgen_model_desc *desc, kvgen_error *err) {
    kvgen_backend want;
    kvgen_status st = choose_backend(desc, &want, err);
    if (st != KVGEN_OK) return st;
#ifdef KVGEN_HAVE_VULKAN
    if (want == KVGEN_BACKEND_VULKAN || want == KVGEN_BACKEND_DEFAULT) {
        kvgen_error vk_err = {0};
        m->ops = &kvg_vulkan_backend;
        st = m->ops->model_init(m, desc, &vk_err);
        if (st == KVGEN_OK) return KVGEN_OK;
        m->ops = NULL;
        m->backend = NULL;
        if (want == KVGEN_BACKEND_VULKAN) {
            if (err) *err = vk_err;
            return st;
        }
        /* no usable Vulkan device: the reference backend still runs everything */
    }
#else
    if (want == KVGEN_BACKEND_VULKAN)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: the Vulkan backend was asked for, but this kvgen was built "
                        "without Vulkan (KVGEN_VULKAN=OFF or no Vulkan SDK)", desc->path);
#endif
    m->ops = &kvg_reference_backend;
    st = m->ops->model_init(m, desc, err);
    if (st != KVGEN_OK) {
        m->ops = NULL;
        m->backend = NULL;
    }
    return st;
}

kvgen_status kvgen_model_load(const kvgen_model_desc *desc, kvgen_model **out, kvgen_error *err) {
    if (out) *out = NULL;
    if (!desc) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_model_load: desc is NULL");
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_model_load: out is NULL");
    if (!desc->path || !*desc->path)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_model_load: desc.path is empty");
    if (desc->backend < KVGEN_BACKEND_DEFAULT || desc->backend > KVGEN_BACKEND_VULKAN)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_model_load: desc.backend %d is not a kvgen_backend",
                        (int)desc->backend);
    if (desc->n_threads < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_model_load: desc.n_threads %d is negative",
                        desc->n_threads);

    kvgen_model *m = calloc(1, sizeof *m);
    if (!m) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", desc->path);
    m->refcount = 1;
    m->n_threads = desc->n_threads;
    kvgen_status st = kvg_gguf_open(desc->path, &m->gguf, err);
    if (st == KVGEN_OK) st = kvg_weights_describe(m->gguf, &m->w, err);
    if (st == KVGEN_OK) st = kvg_tokenizer_load(m->gguf, &m->tok, err);
    if (st == KVGEN_OK) {
        m->name = model_name(m->gguf, desc->path);
        if (!m->name) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", desc->path);
    }
    if (st == KVGEN_OK) st = init_backend(m, desc, err);
    if (st != KVGEN_OK) {
        model_free(m);
        return st;
    }
    *out = m;
    return KVGEN_OK;
}

void kvgen_model_unload(kvgen_model *model) { model_release(model); }

void kvgen_model_get_info(const kvgen_model *m, kvgen_model_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    if (!m) return;
    const kvg_hparams *hp = &m->w.hp;
    info->name = m->name;
    info->architecture = "llama";
    info->backend = m->ops->name;
    info->device = m->device_name;
    info->n_layer = hp->n_layer;
    info->n_embd = hp->n_embd;
    info->n_ff = hp->n_ff;
    info->n_head = hp->n_head;
    info->n_head_kv = hp->n_head_kv;
    info->head_dim = hp->head_dim;
    info->n_rot = hp->n_rot;
    info->n_ctx_train = hp->n_ctx_train;
    info->n_vocab = hp->n_vocab;
    info->rope_freq_base = hp->rope_freq_base;
    info->rms_norm_eps = hp->rms_norm_eps;
    info->tied_embeddings = m->w.tied;
    info->tokenizer = kvg_tokenizer_kind(m->tok);
    info->tokenizer_pre = kvg_tokenizer_pre(m->tok);
    info->bos = kvg_tokenizer_bos(m->tok);
    info->eos = kvg_tokenizer_eos(m->tok);
    info->eot = kvg_tokenizer_eot(m->tok);
    int n = kvg_gguf_n_tensors(m->gguf);
    for (int i = 0; i < n; i++) {
        const kvg_tensor *t = kvg_gguf_tensor(m->gguf, i);
        info->n_params += t->n_elements;
        info->weight_bytes += t->nbytes;
    }
}

/* snprintf that appends, tracking the length a full write needs */
typedef struct text_buf {
    char *buf;
    size_t size, len;
} text_buf;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void tb_printf(text_buf *tb, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *dst = tb->len < tb->size ? tb->buf + tb->len : NULL;
    int n = vsnprintf(dst, dst ? tb->size - tb->len : 0, fmt, ap);
    va_end(ap);
    if (n > 0) tb->len += (size_t)n;
}

static void tb_token(text_buf *tb, const kvgen_model *m, const char *what, int32_t id) {
    if (id < 0) {
        tb_printf(tb, " %s none", what);
        return;
    }
    char piece[64];
    size_t n = kvg_token_piece(m->tok, id, KVGEN_TOKENIZE_SPECIAL, piece, sizeof piece - 1);
    if (n >= sizeof piece) n = sizeof piece - 1;
    piece[n] = 0;
    for (size_t i = 0; i < n; i++) /* keep the description one line per field */
        if (piece[i] == '\n' || piece[i] == '\r') piece[i] = ' ';
    tb_printf(tb, " %s %d '%s'", what, (int)id, piece);
}

size_t kvgen_model_describe(const kvgen_model *m, char *buf, size_t size) {
    text_buf tb = {buf, size, 0};
    if (buf && size) buf[0] = 0;
    if (!m) return 0;
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    const kvg_hparams *hp = &m->w.hp;

    tb_printf(&tb, "name:            %s\n", info.name);
    tb_printf(&tb, "file:            %s (%.2f MiB, GGUF v%u)\n", kvg_gguf_path(m->gguf),
              (double)kvg_gguf_file_size(m->gguf) / (1024.0 * 1024.0), (unsigned)kvg_gguf_version(m->gguf));
    tb_printf(&tb, "architecture:    %s\n", info.architecture);
    tb_printf(&tb, "backend:         %s (device %s", info.backend, info.device);
    if (m->ops == &kvg_reference_backend) tb_printf(&tb, ", %d threads", m->n_threads);
    tb_printf(&tb, ")\n");
    tb_printf(&tb, "layers:          %d\n", hp->n_layer);
    tb_printf(&tb, "n_embd:          %d\n", hp->n_embd);
    tb_printf(&tb, "n_ff:            %d\n", hp->n_ff);
    tb_printf(&tb, "heads:           %d (kv heads %d, head_dim %d, rope dims %d)\n", hp->n_head, hp->n_head_kv,
              hp->head_dim, hp->n_rot);
    tb_printf(&tb, "context_length:  %d\n", hp->n_ctx_train);
    tb_printf(&tb, "vocab:           %d\n", hp->n_vocab);
    tb_printf(&tb, "rope_freq_base:  %g\n", (double)hp->rope_freq_base);
    tb_printf(&tb, "rms_norm_eps:    %g\n", (double)hp->rms_norm_eps);
    tb_printf(&tb, "embeddings:      %s\n", m->w.tied ? "tied (logits use token_embd)" : "separate output.weight");

    /* tensor types, in ggml numbering order */
    enum { N_TYPES = 64 };
    int counts[N_TYPES] = {0}, other = 0;
    int n_tensors = kvg_gguf_n_tensors(m->gguf);
    for (int i = 0; i < n_tensors; i++) {
        uint32_t t = kvg_gguf_tensor(m->gguf, i)->type;
        if (t < N_TYPES) counts[t]++;
        else other++;
    }
    tb_printf(&tb, "tensors:         %d (", n_tensors);
    const char *sep = "";
    for (int t = 0; t < N_TYPES; t++) {
        if (!counts[t]) continue;
        tb_printf(&tb, "%s%s %d", sep, kvg_type_name((uint32_t)t), counts[t]);
        sep = ", ";
    }
    if (other) tb_printf(&tb, "%sother %d", sep, other);
    tb_printf(&tb, ")\n");

    tb_printf(&tb, "tokenizer:       %s (pre %s, %d tokens%s)\n",
              info.tokenizer == KVGEN_TOKENIZER_SPM ? "spm" : "bpe", info.tokenizer_pre ? info.tokenizer_pre : "?",
              (int)kvg_tokenizer_n_vocab(m->tok), kvg_tokenizer_add_bos(m->tok) ? ", adds BOS" : "");
    tb_printf(&tb, "special tokens: ");
    tb_token(&tb, m, "bos", info.bos);
    tb_printf(&tb, ",");
    tb_token(&tb, m, "eos", info.eos);
    tb_printf(&tb, ",");
    tb_token(&tb, m, "eot", info.eot);
    tb_printf(&tb, "\n");
    tb_printf(&tb, "parameters:      %llu (%.1f M)\n", (unsigned long long)info.n_params, (double)info.n_params / 1e6);
    tb_printf(&tb, "weight bytes:    %llu (%.2f MiB)\n", (unsigned long long)info.weight_bytes,
              (double)info.weight_bytes / (1024.0 * 1024.0));
    return tb.len;
}

/* ---- sessions --------------------------------------------------------------------------- */

kvgen_status kvgen_session_create(kvgen_model *model, const kvgen_session_desc *desc, kvgen_session **out,
                                  kvgen_error *err) {
    if (out) *out = NULL;
    if (!model) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_create: model is NULL");
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_create: out is NULL");
    kvgen_session_desc d = {0};
    if (desc) d = *desc;
    const kvg_hparams *hp = &model->w.hp;
    if (d.n_ctx < 0 || d.n_ctx > KVG_MAX_CTX)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_create: n_ctx %d is outside [0, %d]", d.n_ctx,
                        KVG_MAX_CTX);
    if (d.top_k < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_create: top_k %d is negative (0 turns it off)",
                        d.top_k);
    if (isnan(d.temperature) || isnan(d.top_p) || d.top_p < 0.0f)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "kvgen_session_create: temperature %g / top_p %g must be numbers, top_p >= 0",
                        (double)d.temperature, (double)d.top_p);
    int n_ctx = d.n_ctx;
    if (n_ctx == 0) n_ctx = hp->n_ctx_train > 0 && hp->n_ctx_train < KVG_DEFAULT_CTX ? hp->n_ctx_train : KVG_DEFAULT_CTX;

    kvgen_session *s = calloc(1, sizeof *s);
    if (!s) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_create: out of memory");
    s->model = model;
    s->n_ctx = n_ctx;
    s->no_cache = d.no_cache != 0;
    s->tokens = malloc((size_t)n_ctx * sizeof *s->tokens);
    s->logits = malloc((size_t)hp->n_vocab * sizeof *s->logits);
    kvgen_status st = KVGEN_OK;
    if (!s->tokens || !s->logits) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_create: out of memory");
    kvg_sampler_params sp = {.seed = d.seed, .temperature = d.temperature, .top_k = d.top_k, .top_p = d.top_p};
    if (st == KVGEN_OK) st = kvg_sampler_init(&s->sampler, &sp, hp->n_vocab, err);
    if (st == KVGEN_OK) st = model->ops->session_init(model, n_ctx, &s->bs, err);
    if (st != KVGEN_OK) {
        kvg_sampler_free(&s->sampler);
        free(s->tokens);
        free(s->logits);
        free(s);
        return st;
    }
    model_retain(model);
    *out = s;
    return KVGEN_OK;
}

void kvgen_session_close(kvgen_session *s) {
    if (!s) return;
    s->model->ops->session_free(s->model, s->bs);
    kvg_sampler_free(&s->sampler);
    free(s->tokens);
    free(s->logits);
    kvgen_model *m = s->model;
    free(s);
    model_release(m);
}

/* Appends tokens: with the cache, only the new ones run (at positions length..); in no_cache
 * mode the whole sequence runs again from position 0, as a model without past_key_values would. */
kvgen_status kvgen_session_prefill(kvgen_session *s, const int32_t *tokens, size_t n, float *all_logits,
                                   kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_prefill: session is NULL");
    if (n == 0) return KVGEN_OK;
    if (!tokens) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_prefill: tokens is NULL");
    kvgen_model *m = s->model;
    int n_vocab = m->w.hp.n_vocab;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "token %zu: id %d is outside the vocabulary [0, %d)", i,
                            (int)tokens[i], n_vocab);
    if (n > (size_t)s->n_ctx - s->n_tokens)
        return kvg_fail(err, KVGEN_E_CONTEXT_FULL, "context full (%zu/%d): cannot append %zu more tokens",
                        s->n_tokens, s->n_ctx, n);

    size_t len = s->n_tokens;
    size_t V = (size_t)n_vocab;
    kvgen_status st;
    /* the new ids go after the cached ones, but count only once the forward pass succeeds */
    memcpy(s->tokens + len, tokens, n * sizeof *tokens);
    if (!s->no_cache) {
        st = m->ops->forward(m, s->bs, tokens, (int)n, (int)len, all_logits ? all_logits : s->logits,
                             all_logits != NULL, err);
        if (st == KVGEN_OK && all_logits) memcpy(s->logits, all_logits + (n - 1) * V, V * sizeof(float));
    } else if (!all_logits) {
        st = m->ops->forward(m, s->bs, s->tokens, (int)(len + n), 0, s->logits, false, err);
    } else {
        float *every = malloc((len + n) * V * sizeof(float));
        if (!every) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_prefill: out of memory for logits");
        st = m->ops->forward(m, s->bs, s->tokens, (int)(len + n), 0, every, true, err);
        if (st == KVGEN_OK) {
            memcpy(all_logits, every + len * V, n * V * sizeof(float));
            memcpy(s->logits, every + (len + n - 1) * V, V * sizeof(float));
        }
        free(every);
    }
    if (st != KVGEN_OK) {
        s->has_logits = false; /* a failed pass may have written part of them */
        return st;
    }
    s->n_tokens = len + n;
    s->has_logits = true;
    return KVGEN_OK;
}

kvgen_status kvgen_session_decode(kvgen_session *s, int32_t token, kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_decode: session is NULL");
    return kvgen_session_prefill(s, &token, 1, NULL, err);
}

const float *kvgen_session_logits(const kvgen_session *s) { return s && s->has_logits ? s->logits : NULL; }

int32_t kvgen_session_sample(kvgen_session *s) {
    if (!s || !s->has_logits) return -1;
    return kvg_sampler_sample(&s->sampler, s->logits);
}

size_t kvgen_session_length(const kvgen_session *s) { return s ? s->n_tokens : 0; }

const int32_t *kvgen_session_tokens(const kvgen_session *s) { return s ? s->tokens : NULL; }

void kvgen_session_reset(kvgen_session *s) {
    if (!s) return;
    /* the backend's cache needs no clearing: positions past the length are never read */
    s->n_tokens = 0;
    s->has_logits = false;
    kvg_sampler_reset(&s->sampler);
}

void kvgen_session_cache_info(const kvgen_session *s, kvgen_cache_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    if (!s) return;
    const kvg_hparams *hp = &s->model->w.hp;
    info->n_layer = hp->n_layer;
    info->n_head_kv = hp->n_head_kv;
    info->head_dim = hp->head_dim;
    info->length = s->n_tokens;
    info->capacity = (size_t)s->n_ctx;
    info->bytes_per_token = s->model->ops->cache_bytes_per_token(s->model);
    info->bytes = info->length * info->bytes_per_token;
}

kvgen_status kvgen_session_read_cache(const kvgen_session *s, int layer, int which, float *out, size_t n_floats,
                                      kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_read_cache: session is NULL");
    const kvg_hparams *hp = &s->model->w.hp;
    if (layer < 0 || layer >= hp->n_layer)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_read_cache: layer %d is outside [0, %d)", layer,
                        hp->n_layer);
    if (which != 0 && which != 1)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_read_cache: which %d must be 0 (K) or 1 (V)",
                        which);
    size_t need = (size_t)hp->n_head_kv * s->n_tokens * (size_t)hp->head_dim;
    if (n_floats < need)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "kvgen_session_read_cache: out holds %zu floats, the cache needs %zu (%d x %zu x %d)",
                        n_floats, need, hp->n_head_kv, s->n_tokens, hp->head_dim);
    if (need == 0) return KVGEN_OK;
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_read_cache: out is NULL");
    return s->model->ops->read_cache(s->model, s->bs, layer, which, (int)s->n_tokens, out, err);
}
