/* api.c: the public model calls of kvgen.h: argument checks, the backend registry (backend
 * choice, kvgen_backends, kvgen_device_probe), the KV page pool's creation and reference
 * counting. Sessions live in session.c, the tokenizer calls in
 * tokenizer.c / detok.c. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_backend.h"
#include "kvg_pool.h"
#include "kvg_quant.h"
#include "kvg_remote.h"
#include "kvg_sampler.h"
#include "kvg_session.h"
#include "kvg_str.h"
#include "kvg_vk_bench.h"

/* ---- models ----------------------------------------------------------------------------- */

static void model_free(kvgen_model *m) {
    if (!m) return;
    if (m->on_unload) m->on_unload(m); /* first: the worker may still be between steps */
    kvg_model_detach_all(m);             /* then what the layers above hung on the model */
    kvg_model_pools_free(m);
    if (m->ops && m->backend) m->ops->model_free(m);
    kvg_tokenizer_free(m->tok);
    kvg_weights_free(&m->w);
    kvg_gguf_close(m->gguf);
    kvg_free(m->name);
    kvg_free(m);
}

/* m->destroy: the last reference went (kvg_model_release) */
static void model_destroy(kvgen_model *m) {
    model_free(m);
    kvg_host_model_count(-1);
}

static char *model_name(const kvg_gguf *g, const char *path) {
    kvg_str s;
    if (kvg_gguf_get_str(g, "general.name", &s) && s.len > 0 && s.len < 4096) return kvg_memdup0(s.ptr, (size_t)s.len);
    const char *base = strrchr(path, '/');
    return kvg_memdup0(base ? base + 1 : path, strlen(base ? base + 1 : path));
}

/* ---- the backend registry ----------------------------------------------------------------
 * Every backend kvgen knows is one row, in the order a default load tries them (KVGEN_BACKEND
 * unset): the first one that starts wins, a row may pass itself over for a later one (Vulkan
 * when its device is the CPU itself). A row whose backend this build lacks keeps its name
 * (so KVGEN_BACKEND=vulkan in a CPU-only build says what is missing instead of "unknown") but
 * has no ops. Backend choice, kvgen_backends and kvgen_device_probe know backends only
 * through this table: a new backend is a new row. */
typedef struct backend_row {
    kvgen_backend id;
    const char *name;           /* KVGEN_BACKEND, kvgen_model_info.backend (== ops->name), --backend */
    const char *label;          /* in messages: "the Vulkan backend" */
    const kvg_backend_ops *ops; /* NULL: not in this build */
    const char *absent;         /* why a build lacks it */
    bool uses_device, uses_threads;
    /* kvgen_device_probe on this backend's device; NULL: none */
    kvgen_status (*probe)(const kvgen_probe_desc *desc, kvgen_probe_result *out, kvgen_error *err);
    /* true: a default load skips this row (the rows after it run everything it would); NULL:
     * never */
    bool (*pass_over)(const kvgen_model_desc *desc);
} backend_row;

#ifdef KVGEN_HAVE_VULKAN
#define VULKAN_OPS (&kvg_vulkan_backend)
#define VULKAN_PROBE kvg_vk_probe_run
/* The device a default load would run on is the CPU itself (lavapipe: VkPhysicalDeviceType
 * CPU): the cpu backend computes on the same cores without emulating a GPU. A device the load
 * names (desc.device, KVGEN_DEVICE, a host's own VkDevice) is Vulkan's whatever its type. */
static bool vulkan_device_is_host(const kvgen_model_desc *desc) {
    const char *env = getenv("KVGEN_DEVICE");
    if ((desc->device && *desc->device) || desc->vk_device || (env && *env)) return false;
    kvgen_device_info devs[16];
    int n = 0;
    if (kvgen_devices(devs, 16, &n, NULL) != KVGEN_OK) return false;
    for (int i = 0; i < n && i < 16; i++)
        if (devs[i].is_default) return devs[i].type && strcmp(devs[i].type, "cpu") == 0;
    return false;
}
#define VULKAN_PASS_OVER vulkan_device_is_host
#else
#define VULKAN_OPS NULL
#define VULKAN_PROBE NULL
#define VULKAN_PASS_OVER NULL
#endif

static const backend_row backend_table[] = {
    {KVGEN_BACKEND_VULKAN, "vulkan", "Vulkan", VULKAN_OPS, "KVGEN_VULKAN=OFF or no Vulkan SDK", true, false,
     VULKAN_PROBE, VULKAN_PASS_OVER},
    {KVGEN_BACKEND_CPU, "cpu", "cpu", &kvg_cpu_backend, NULL, false, true, NULL, NULL},
    {KVGEN_BACKEND_REFERENCE, "reference", "reference", &kvg_reference_backend, NULL, false, true, NULL, NULL},
};
enum { N_BACKENDS = (int)(sizeof backend_table / sizeof backend_table[0]) };

static const backend_row *backend_by_id(kvgen_backend id) {
    for (int i = 0; i < N_BACKENDS; i++)
        if (backend_table[i].id == id) return &backend_table[i];
    return NULL;
}

int kvgen_backends(kvgen_backend_info *out, int cap) {
    for (int i = 0; out && i < N_BACKENDS && i < cap; i++) {
        const backend_row *r = &backend_table[i];
        out[i] = (kvgen_backend_info){.backend = r->id, .name = r->name, .available = r->ops != NULL,
                                      .missing = r->ops ? NULL : r->absent, .uses_device = r->uses_device,
                                      .uses_threads = r->uses_threads};
    }
    return N_BACKENDS;
}

kvgen_status kvgen_device_probe(const kvgen_probe_desc *desc, kvgen_probe_result *out, kvgen_error *err) {
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_device_probe: out is NULL");
    memset(out, 0, sizeof *out);
    kvgen_probe_desc d = desc ? *desc : (kvgen_probe_desc){0};
    if (d.read_mib < 0 || d.reps < 0 || d.dispatches < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_device_probe: desc.%s %d is negative",
                        d.read_mib < 0 ? "read_mib" : d.reps < 0 ? "reps" : "dispatches",
                        d.read_mib < 0 ? d.read_mib : d.reps < 0 ? d.reps : d.dispatches);
    const backend_row *missing = NULL;
    for (int i = 0; i < N_BACKENDS; i++) {
        const backend_row *r = &backend_table[i];
        if (r->ops && r->probe) return r->probe(&d, out, err);
        if (!r->ops && r->uses_device && !missing) missing = r;
    }
    if (missing)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "kvgen_device_probe: this kvgen was built without the %s backend (%s)",
                        missing->label, missing->absent);
    return kvg_fail(err, KVGEN_E_UNSUPPORTED, "kvgen_device_probe: this kvgen has no backend that runs on a device");
}

/* Which backend a load asks for: the desc, else $KVGEN_BACKEND, else "whatever works". */
static kvgen_status choose_backend(const kvgen_model_desc *desc, kvgen_backend *out, kvgen_error *err) {
    *out = desc->backend;
    if (*out != KVGEN_BACKEND_DEFAULT) return KVGEN_OK;
    const char *env = getenv("KVGEN_BACKEND");
    if (!env || !*env) return KVGEN_OK;
    char names[256] = "";
    size_t len = 0;
    for (int i = 0; i < N_BACKENDS; i++) {
        if (strcmp(env, backend_table[i].name) == 0) {
            *out = backend_table[i].id;
            return KVGEN_OK;
        }
        const char *sep = i == 0 ? "" : i + 1 == N_BACKENDS ? " or " : ", ";
        int n = snprintf(names + len, sizeof names - len, "%s\"%s\"", sep, backend_table[i].name);
        if (n > 0) len = len + (size_t)n < sizeof names ? len + (size_t)n : sizeof names - 1;
    }
    return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "KVGEN_BACKEND=%s: expected %s", env, names);
}

static kvgen_status start_backend(kvgen_model *m, const backend_row *r, const kvgen_model_desc *desc,
                                  kvgen_error *err) {
    m->ops = r->ops;
    m->progress_stage = 0; /* a backend tried after another one reports its stages afresh */
    kvgen_status st = kvg_model_kv_type_choose(m, desc->kv_type, err);
    if (st == KVGEN_OK) st = m->ops->model_init(m, desc, err);
    if (st != KVGEN_OK) {
        m->ops = NULL;
        m->backend = NULL;
    }
    return st;
}

static kvgen_status init_backend(kvgen_model *m, const kvgen_model_desc *desc, kvgen_error *err) {
    kvgen_backend want;
    kvgen_status st = choose_backend(desc, &want, err);
    if (st != KVGEN_OK) return st;
    if (want != KVGEN_BACKEND_DEFAULT) {
        const backend_row *r = backend_by_id(want);
        if (!r) /* kvgen_model_load checked desc.backend: only a bug gets here */
            return kvg_fail(err, KVGEN_E_INTERNAL, "%s: backend %d is not in the registry", desc->path, (int)want);
        if (!r->ops)
            return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: the %s backend was asked for, but this kvgen was built "
                            "without %s (%s)", desc->path, r->label, r->label, r->absent);
        return start_backend(m, r, desc, err);
    }
    /* KVGEN_VALIDATE=1 asks for the device backends to be checked: falling back to the CPU
     * would make a validated run pass without validating anything */
    const char *validate = getenv("KVGEN_VALIDATE");
    bool fall_back = !(validate && strcmp(validate, "1") == 0);
    int last = -1;
    for (int i = 0; i < N_BACKENDS; i++)
        if (backend_table[i].ops) last = i;
    if (last < 0) return kvg_fail(err, KVGEN_E_INTERNAL, "%s: this kvgen was built without any backend", desc->path);
    /* a row may pass itself over for the next ones (not in a validated run, which is there to
     * check the device backend) */
    bool skip[N_BACKENDS] = {false};
    for (int i = 0; i < last; i++) {
        const backend_row *r = &backend_table[i];
        skip[i] = !r->ops || (fall_back && r->pass_over && r->pass_over(desc));
    }
    for (int i = 0; i <= last; i++) {
        if (skip[i]) continue;
        /* a row that fails quietly gives way to the next (e.g. no usable Vulkan device: the
         * host backends still run everything); the last row's error is the load's */
        kvgen_error row_err = {0};
        st = start_backend(m, &backend_table[i], desc, &row_err);
        if (st == KVGEN_OK || st == KVGEN_E_CANCELLED || !fall_back || i == last) {
            if (st != KVGEN_OK && err) *err = row_err;
            return st;
        }
        int next = i + 1;
        while (next < last && skip[next]) next++;
        kvg_log(KVGEN_LOG_WARNING, "%s; the %s backend did not start, running on the %s backend instead",
                row_err.message, backend_table[i].label, backend_table[next].label);
    }
    return st;
}

/* Phi-3's LongRoPE: the model's context (desc.n_ctx) above the original one takes the long
 * factors as the frequencies' divisors on every backend and lifts the session limit; the choice
 * is the model's, as every session shares its K/V pages (forks, the prefix cache). */
static void choose_rope_factors(kvg_weights *w, int n_ctx) {
    if (!w->rope_factors_long || w->hp.n_ctx_rope <= 0 || n_ctx <= w->hp.n_ctx_rope) return;
    w->rope_freqs = w->rope_factors_long;
    w->hp.n_ctx_rope = n_ctx;
}

kvgen_status kvgen_model_load(const kvgen_model_desc *desc, kvgen_model **out, kvgen_error *err) {
    if (out) *out = NULL;
    if (!desc) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_model_load: desc is NULL");
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_model_load: out is NULL");
    if (!desc->path || !*desc->path)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_model_load: desc.path is empty");
    if (desc->backend != KVGEN_BACKEND_DEFAULT && !backend_by_id(desc->backend))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_model_load: desc.backend %d is not a kvgen_backend",
                        (int)desc->backend);
    if (desc->n_threads < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_model_load: desc.n_threads %d is negative",
                        desc->n_threads);
    if (desc->n_ctx < 0 || desc->n_ctx > KVG_MAX_CTX)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_model_load: desc.n_ctx %d is outside [0, %d]",
                        desc->n_ctx, KVG_MAX_CTX);
    if (desc->kv_type && *desc->kv_type && !kvg_kv_type_named(desc->kv_type)) {
        char list[128];
        kvg_kv_type_names(NULL, 0, list, sizeof list);
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_model_load: desc.kv_type \"%s\" is not a KV type (%s)",
                        desc->kv_type, list);
    }
    if (desc->activation_bits != 0 && desc->activation_bits != 8 && desc->activation_bits != 16)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_model_load: desc.activation_bits %d is not 0, 8 or 16",
                        desc->activation_bits);

    kvgen_model *m = kvg_calloc(1, sizeof *m);
    if (!m) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", desc->path);
    kvg_host_model_count(1);
    m->refcount = 1;
    m->destroy = model_destroy;
    if (kvg_remote_is_url(desc->path)) { /* a server's model: no file, backend or pages here */
        kvgen_status st = kvg_remote_load(m, desc, err);
        if (st != KVGEN_OK) {
            model_free(m);
            kvg_host_model_count(-1);
            return st;
        }
        *out = m;
        return KVGEN_OK;
    }
    m->n_threads = desc->n_threads;
    m->progress = desc->progress;
    m->progress_user = desc->progress_user;
    kvgen_status st = kvg_gguf_open(desc->path, &m->gguf, err);
    if (st == KVGEN_OK) st = kvg_weights_describe(m->gguf, &m->w, err);
    if (st == KVGEN_OK) choose_rope_factors(&m->w, desc->n_ctx);
    if (st == KVGEN_OK) st = kvg_weights_read(m, err);
    if (st == KVGEN_OK) st = kvg_tokenizer_load(m->gguf, &m->tok, err);
    if (st == KVGEN_OK) {
        m->name = model_name(m->gguf, desc->path);
        if (!m->name) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", desc->path);
    }
    if (st == KVGEN_OK) st = init_backend(m, desc, err);
    if (st == KVGEN_OK) st = kvg_model_pool_init(m, desc, err);
    m->progress = NULL; /* the callback is the load's only */
    if (st != KVGEN_OK) {
        model_free(m);
        kvg_host_model_count(-1);
        return st;
    }
    *out = m;
    return KVGEN_OK;
}

void kvgen_model_unload(kvgen_model *model) { kvg_model_release(model); }

void kvgen_model_retain(kvgen_model *model) {
    if (model) __atomic_add_fetch(&model->refcount, 1, __ATOMIC_RELAXED);
}

void kvgen_model_get_info(const kvgen_model *m, kvgen_model_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    if (!m) return;
    const kvg_hparams *hp = &m->w.hp;
    info->name = m->name;
    const kvg_session_kind *kind = kvg_session_kind_of(m);
    if (kind->model_info) { /* a kind of its own (a remote model): no file, backend or vocabulary here */
        kind->model_info(m, info);
        return;
    }
    info->architecture = m->w.arch ? m->w.arch->name : "unknown";
    info->backend = m->ops->name;
    info->device = m->device_name;
    info->kv_type = kvg_kv_type_name(m->kv_type);
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

#if defined(__GNUC__) && !defined(__MINGW32__)
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
    const kvg_session_kind *kind = kvg_session_kind_of(m);
    if (kind->describe) {
        size_t n = kind->describe(m, NULL, 0);
        char *line = kvg_malloc(n + 1);
        if (line) kind->describe(m, line, n + 1);
        tb_printf(&tb, "%s", line ? line : "");
        kvg_free(line);
        return tb.len;
    }
    tb_printf(&tb, "file:            %s (%.2f MiB, GGUF v%u)\n", kvg_gguf_path(m->gguf),
              (double)kvg_gguf_file_size(m->gguf) / (1024.0 * 1024.0), (unsigned)kvg_gguf_version(m->gguf));
    tb_printf(&tb, "architecture:    %s\n", info.architecture);
    tb_printf(&tb, "backend:         %s (device %s", info.backend, info.device);
    for (int i = 0; i < N_BACKENDS; i++)
        if (backend_table[i].ops == m->ops && backend_table[i].uses_threads)
            tb_printf(&tb, ", %d threads", m->n_threads);
    tb_printf(&tb, ")\n");
    tb_printf(&tb, "K/V pages:       %s (%zu bytes a token)\n", info.kv_type, m->ops->cache_bytes_per_token(m));
    tb_printf(&tb, "layers:          %d\n", hp->n_layer);
    tb_printf(&tb, "n_embd:          %d\n", hp->n_embd);
    tb_printf(&tb, "n_ff:            %d\n", hp->n_ff);
    bool encoder = m->w.arch && m->w.arch->encoder;
    if (encoder) {
        static const char *const pooling[] = {"none (kvgen_embed: mean)", "mean", "cls", "last"};
        tb_printf(&tb, "heads:           %d (head_dim %d)\n", hp->n_head, hp->head_dim);
        tb_printf(&tb, "context_length:  %d (texts are cut there)\n", hp->n_ctx_train);
        tb_printf(&tb, "vocab:           %d\n", hp->n_vocab);
        tb_printf(&tb, "encoder:         bidirectional, learned positions, layer_norm_eps %g, pooling %s\n",
                  (double)hp->layer_norm_eps, pooling[hp->pooling >= 0 && hp->pooling <= 3 ? hp->pooling : 0]);
    } else {
        tb_printf(&tb, "heads:           %d (kv heads %d, head_dim %d, rope dims %d)\n", hp->n_head, hp->n_head_kv,
                  hp->head_dim, hp->n_rot);
        tb_printf(&tb, "context_length:  %d\n", hp->n_ctx_train);
        tb_printf(&tb, "vocab:           %d\n", hp->n_vocab);
        tb_printf(&tb, "rope_freq_base:  %g\n", (double)hp->rope_freq_base);
        if (m->w.rope_freqs || hp->rope_attn_factor != 1.0f) {
            tb_printf(&tb, "rope factors:    %s, attn_factor %g", m->w.rope_freqs ? m->w.rope_freqs->name : "none",
                      (double)hp->rope_attn_factor);
            if (hp->n_ctx_rope > 0) tb_printf(&tb, " (sessions up to %d positions)", hp->n_ctx_rope);
            tb_printf(&tb, "\n");
        }
        tb_printf(&tb, "rms_norm_eps:    %g\n", (double)hp->rms_norm_eps);
        tb_printf(&tb, "embeddings:      %s\n", m->w.tied ? "tied (logits use token_embd)" : "separate output.weight");
    }

    /* tensor types, in ggml numbering order, and which backend runs each (their own tables) */
    enum { N_TYPES = 64 };
    int counts[N_TYPES] = {0}, other = 0;
    int n_tensors = kvg_gguf_n_tensors(m->gguf);
    for (int i = 0; i < n_tensors; i++) {
        uint32_t t = kvg_gguf_tensor(m->gguf, i)->type;
        if (t < N_TYPES) counts[t]++;
        else other++;
    }
    tb_printf(&tb, "tensors:         %d\n", n_tensors);
    for (int t = 0; t < N_TYPES; t++) {
        if (!counts[t]) continue;
        char label[24];
        snprintf(label, sizeof label, "%s:", kvg_type_name((uint32_t)t));
        tb_printf(&tb, "  %-15s%d tensor%s (", label, counts[t], counts[t] == 1 ? "" : "s");
        const char *sep = "";
        for (int b = 0; b < N_BACKENDS; b++) { /* the backends this build carries, in the registry's order */
            if (!backend_table[b].ops) continue;
            tb_printf(&tb, "%s%s: %s", sep, backend_table[b].name,
                      kvg_backend_runs_type(backend_table[b].ops, (uint32_t)t) ? "yes" : "no");
            sep = ", ";
        }
        tb_printf(&tb, ")\n");
    }
    if (other) tb_printf(&tb, "  %-15s%d tensor%s\n", "other:", other, other == 1 ? "" : "s");

    tb_printf(&tb, "tokenizer:       %s (pre %s, %d tokens%s)\n",
              info.tokenizer == KVGEN_TOKENIZER_SPM ? "spm" : info.tokenizer == KVGEN_TOKENIZER_WPM ? "wpm" : "bpe", info.tokenizer_pre ? info.tokenizer_pre : "?",
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
