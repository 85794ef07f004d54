/* api.c: the public model calls of kvgen.h: argument checks, backend choice, the KV page
 * pool's creation and reference counting. Sessions live in session.c, the tokenizer calls in
 * tokenizer.c / detok.c. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_quant.h"
#include "kvg_sampler.h"
#include "kvg_session.h"

/* ---- models ----------------------------------------------------------------------------- */

static void model_free(kvgen_model *m) {
    if (!m) return;
    kvg_worker_destroy(m); /* first: the worker may still be between steps */
    kvg_pool_destroy(m->pool);
    if (m->ops && m->backend) m->ops->model_free(m);
    kvg_tokenizer_free(m->tok);
    kvg_weights_free(&m->w);
    kvg_gguf_close(m->gguf);
    free(m->name);
    free(m);
}

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
        /* KVGEN_VALIDATE=1 asks for Vulkan to be checked: falling back to the CPU would make a
         * validated run pass without validating anything */
        const char *validate = getenv("KVGEN_VALIDATE");
        if (want == KVGEN_BACKEND_VULKAN || (validate && strcmp(validate, "1") == 0)) {
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
    if (st == KVGEN_OK) st = kvg_model_pool_init(m, desc, err);
    if (st != KVGEN_OK) {
        model_free(m);
        return st;
    }
    *out = m;
    return KVGEN_OK;
}

void kvgen_model_unload(kvgen_model *model) { model_release(model); }

void kvgen_model_retain(kvgen_model *model) {
    if (model) __atomic_add_fetch(&model->refcount, 1, __ATOMIC_RELAXED);
}

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
