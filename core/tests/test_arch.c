/* test_arch.c: the architecture table (arch.c) and the model description built from it: the
 * llama row as before, metadata read through a row's prefix, every row running on the
 * reference backend and on Vulkan alike, phi3's fused matrices described as views of the file's
 * rows and its LongRoPE factors (the short ones run, sessions limited to the original context
 * when the file has long ones, unless the model's n_ctx is longer: then the long ones run on
 * every backend), architectures whose
 * features a backend does not run refused with a message naming file, architecture, feature
 * and backend (checked against a backend table that runs the llama pass only), unknown
 * architectures listing the known ones, tensors the row does not use refused (when they would
 * change the math) or warned about, and heads wider than n_embd / n_head run by both backends
 * alike. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <unistd.h>
#include "kvg_arch.h"
#include "kvg_backend.h"
#include "kvg_quant.h"
#include "testutil.h"

static bool has_vulkan;

/* describes a file into w (kept: the caller frees w and g); the status, message in err */
static kvgen_status open_describe(const char *path, kvg_gguf **g, kvg_weights *w, kvgen_error *err) {
    *g = NULL;
    memset(w, 0, sizeof *w);
    kvgen_status st = kvg_gguf_open(path, g, err);
    if (st) return st;
    return kvg_weights_describe(*g, w, err);
}

/* loads through the public API; the status, message in err, model in *out (NULL on failure) */
static kvgen_status load(const char *path, kvgen_backend backend, kvgen_model **out, kvgen_error *err) {
    kvgen_model_desc d = {.path = path, .backend = backend, .n_threads = 1};
    *out = NULL;
    return kvgen_model_load(&d, out, err);
}

/* A copy of src: general.architecture set to arch (NULL: kept); each of the n_extra tensors
 * extra[i] ("blk.%d.NAME" patterns get one per layer) added as F32 [ne0] near 1. */
typedef struct extra_tensor {
    const char *pattern;
    uint64_t ne0;
} extra_tensor;

typedef struct arch_edit {
    const char *arch; /* new general.architecture, or NULL */
    const extra_tensor *extra;
    int n_extra;
} arch_edit;

static void arch_keys(kvg_gguf_writer *w, const kvg_gguf *src, const void *ctx) {
    const arch_edit *e = ctx;
    for (int i = 0; i < kvg_gguf_n_kv(src); i++) kvg_gguf_copy_kv(w, src, kvg_gguf_key(src, i));
    if (e->arch) kvg_gguf_set_str(w, "general.architecture", e->arch);
}

/* the extra tensors, one per layer where the pattern has a %d */
static void arch_extra(kvg_gguf_writer *w, const kvg_gguf *src, const void *ctx) {
    const arch_edit *e = ctx;
    uint32_t n_layer = 0;
    kvg_str a;
    char key[96];
    if (kvg_gguf_get_str(src, "general.architecture", &a)) {
        snprintf(key, sizeof key, "%.*s.block_count", (int)a.len, a.ptr);
        kvg_gguf_get_u32(src, key, &n_layer);
    }
    for (int k = 0; k < e->n_extra; k++) {
        const extra_tensor *x = &e->extra[k];
        bool per_layer = strstr(x->pattern, "%d") != NULL;
        float *data = malloc(x->ne0 * sizeof *data);
        for (uint64_t j = 0; j < x->ne0; j++) data[j] = 1.0f + 0.01f * (float)(j % 7);
        for (uint32_t l = 0; l < (per_layer ? n_layer : 1); l++) {
            char tname[96];
            snprintf(tname, sizeof tname, x->pattern, (int)l);
            uint64_t ne[1] = {x->ne0};
            kvg_gguf_add_tensor(w, tname, KVG_TYPE_F32, 1, ne, data, x->ne0 * sizeof *data);
        }
        free(data);
    }
}

static char *rewrite(const char *src_path, const char *name, const char *arch, const extra_tensor *extra,
                     int n_extra) {
    arch_edit e = {arch, extra, n_extra};
    return tu_gguf_rewrite(src_path, name, &(tu_gguf_edit){.keys = arch_keys, .finish = arch_extra, .ctx = &e});
}

static void test_table(void) {
    size_t n = 0;
    const kvg_arch *rows = kvg_arch_rows(&n);
    CHECK(n >= 2);
    int complete = 0;
    for (size_t i = 0; i < n; i++) {
        CHECKF(rows[i].name && *rows[i].name && rows[i].prefix && *rows[i].prefix, "row %zu", i);
        CHECKF(kvg_arch_find(rows[i].name, strlen(rows[i].name)) == &rows[i], "%s: not found or twice", rows[i].name);
        CHECKF(rows[i].required & KVG_T_BIT(KVG_T_TOKEN_EMBD), "%s has no token_embd", rows[i].name);
        CHECKF((rows[i].required & rows[i].optional) == 0, "%s: a tensor both required and optional", rows[i].name);
        complete += rows[i].complete;
    }
    CHECK(complete == 7); /* llama, qwen2, qwen3, gemma2, gemma3, phi3, bert */
    const kvg_arch *l = kvg_arch_find("llama", 5);
    CHECK(l && l->complete && strcmp(l->prefix, "llama") == 0);
    if (l) {
        CHECK(l->rope == KVG_ROPE_ADJACENT && l->act == KVG_ACT_SILU_GATED && !l->embd_scale && !l->softcap &&
              !l->sliding_window);
        uint32_t want = KVG_T_BIT(KVG_T_ATTN_Q) | KVG_T_BIT(KVG_T_ATTN_K) | KVG_T_BIT(KVG_T_ATTN_V) |
                        KVG_T_BIT(KVG_T_FFN_GATE) | KVG_T_BIT(KVG_T_FFN_UP) | KVG_T_BIT(KVG_T_FFN_DOWN);
        CHECK((l->required & want) == want);
        CHECK(((l->required | l->optional) & (KVG_T_BIT(KVG_T_ATTN_Q_BIAS) | KVG_T_BIT(KVG_T_ATTN_Q_NORM))) == 0);
        CHECK(l->optional & KVG_T_BIT(KVG_T_OUTPUT));
    }
    const kvg_arch *q = kvg_arch_find("qwen2", 5);
    CHECK(q && q->complete && q->rope == KVG_ROPE_NEOX && (q->required & KVG_T_BIT(KVG_T_ATTN_Q_BIAS)));
    const kvg_arch *g3 = kvg_arch_find("gemma3", 6), *p3 = kvg_arch_find("phi3", 4);
    CHECK(g3 && g3->complete && g3->swa_pattern == 6 && g3->rope_base_swa == 10000.0f && p3 && p3->complete);
    CHECK(p3 && p3->fused == (KVG_FUSED_QKV | KVG_FUSED_GATE_UP) && p3->rope_factors && !p3->sliding_window);
    const kvg_fused *f = kvg_fused_layout(KVG_FUSED_GATE_UP);
    CHECK(f && f->whole == KVG_T_FFN_UP && f->n_parts == 2 && f->parts[0] == KVG_T_FFN_GATE &&
          f->parts[1] == KVG_T_FFN_UP && kvg_fused_layout(1u << 5) == NULL);
    CHECK(kvg_arch_find("llam", 4) == NULL && kvg_arch_find("llama2", 6) == NULL);
    CHECK(strcmp(kvg_tensor_pattern(KVG_T_ATTN_Q_BIAS), "blk.%d.attn_q.bias") == 0);
    CHECK(strcmp(kvg_tensor_short(KVG_T_FFN_POST_NORM), "post_ffw_norm") == 0);
    CHECK(strstr(kvg_feature_name(KVG_F_ATTN_BIAS), "attn_q.bias") != NULL);
    char list[256];
    kvg_arch_list(true, list, sizeof list);
    CHECKF(strcmp(list, "llama, qwen2, qwen3, gemma2, gemma3, phi3, bert") == 0, "%s", list);
}

/* the llama row describes and runs a llama file as it always did */
static void test_llama_row(const char *path) {
    kvg_gguf *g;
    kvg_weights w;
    kvgen_error err = {0};
    kvgen_status st = open_describe(path, &g, &w, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    if (st == KVGEN_OK) {
        CHECK(w.arch == kvg_arch_find("llama", 5));
        CHECK(w.features == 0 && w.rope == KVG_ROPE_ADJACENT && w.act == KVG_ACT_SILU_GATED && w.embd_scale == 1.0f);
        CHECK(w.rope_freqs == NULL && w.hp.attn_softcap == 0.0f && w.hp.final_softcap == 0.0f && w.hp.n_swa == 0);
        CHECK(w.hp.n_layer == 2 && w.hp.n_embd == 64 && w.hp.n_head == 4 && w.hp.n_head_kv == 2 && w.hp.head_dim == 16);
        for (int l = 0; l < w.hp.n_layer; l++) {
            const kvg_layer *L = &w.layers[l];
            CHECK(L->wq && L->wk && L->wv && L->wo && L->w_gate && L->w_up && L->w_down && L->attn_norm && L->ffn_norm);
            CHECK(!L->bq && !L->bk && !L->bv && !L->q_norm && !L->k_norm && !L->attn_post_norm && !L->ffn_post_norm);
        }
    }
    kvg_weights_free(&w);
    kvg_gguf_close(g);

    kvgen_backend backends[2] = {KVGEN_BACKEND_REFERENCE, KVGEN_BACKEND_VULKAN};
    for (int b = 0; b < (has_vulkan ? 2 : 1); b++) {
        kvgen_model *m;
        st = load(path, backends[b], &m, &err);
        CHECKF(st == KVGEN_OK, "%s", err.message);
        if (!m) continue;
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        CHECKF(strcmp(info.architecture, "llama") == 0, "%s", info.architecture);
        kvgen_model_unload(m);
    }
}

/* a row's metadata lives under its prefix: qwen2.block_count, not llama.block_count */
static void test_prefix(const char *llama_path) {
    char *q = tu_make_model("a-qwen2.gguf", "--arch qwen2 --qkv-bias --layers 3 --embd 64 --heads 4 --kv-heads 2 "
                                            "--ff 96 --ctx 300 --rope-base 1000000");
    CHECK(q != NULL);
    if (q) {
        kvg_gguf *g;
        kvg_weights w;
        kvgen_error err = {0};
        kvgen_status st = open_describe(q, &g, &w, &err);
        CHECKF(st == KVGEN_OK, "%s", err.message);
        if (st == KVGEN_OK) {
            CHECK(w.arch == kvg_arch_find("qwen2", 5) && w.rope == KVG_ROPE_NEOX);
            CHECK(w.hp.n_layer == 3 && w.hp.n_embd == 64 && w.hp.n_ff == 96 && w.hp.n_head == 4 && w.hp.n_head_kv == 2);
            CHECK(w.hp.n_ctx_train == 300 && w.hp.rope_freq_base == 1000000.0f);
            CHECK(w.layers[2].bq && w.layers[2].bq->ne[0] == 64 && w.layers[2].bk && w.layers[2].bk->ne[0] == 32);
            CHECK(strcmp(w.layers[1].bv->name, "blk.1.attn_v.bias") == 0);
            CHECK(w.features == (KVG_F_ATTN_BIAS | KVG_F_ROPE_NEOX));
        }
        kvg_weights_free(&w);
        kvg_gguf_close(g);
    }
    free(q);
    /* llama's keys under a qwen2 label are not read */
    char *p = rewrite(llama_path, "a-qwen2-llama-keys.gguf", "qwen2", NULL, 0);
    CHECK(p != NULL);
    if (p) {
        kvg_gguf *g;
        kvg_weights w;
        kvgen_error err = {0};
        kvgen_status st = open_describe(p, &g, &w, &err);
        CHECKF(st == KVGEN_E_FORMAT && strstr(err.message, "missing metadata key qwen2.block_count") &&
                   strstr(err.message, p),
               "%s", err.message);
        kvg_weights_free(&w);
        kvg_gguf_close(g);
    }
    free(p);
}

/* The reference backend and Vulkan both run the file (a prefill and a decode: finite logits,
 * Vulkan's within test_vk_model's tolerance of the reference's, f16 KV cache); a backend whose
 * table lacks `feature` (one that runs the plain llama pass only, as Vulkan once did) refuses it
 * with KVGEN_E_UNSUPPORTED and a message naming the file, the architecture, the feature and
 * the backend. */
static void expect_runs(const char *path, const char *arch, const char *feature) {
    static const kvg_backend_ops llama_only = {.name = "llama-only", .features = KVG_F_WIDE_HEADS};
    kvgen_backend backends[2] = {KVGEN_BACKEND_REFERENCE, KVGEN_BACKEND_VULKAN};
    const char *names[2] = {"reference", "vulkan"};
    float *logits[2] = {NULL, NULL};
    int n_vocab = 0;
    for (int b = 0; b < (has_vulkan ? 2 : 1); b++) {
        kvgen_model *m = NULL;
        kvgen_error err = {0};
        kvgen_status st = load(path, backends[b], &m, &err);
        CHECKF(st == KVGEN_OK, "%s on the %s backend: %s", path, names[b], err.message);
        if (!m) continue;
        kvgen_session *s = NULL;
        kvgen_session_desc sd = {.n_ctx = 64};
        int32_t t[5] = {1, 7, 3, 9, 2};
        CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
        CHECK_OK(kvgen_session_prefill(s, t, 4, NULL, &err));
        CHECK_OK(kvgen_session_decode(s, t[4], &err));
        const float *l = kvgen_session_logits(s);
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        n_vocab = info.n_vocab;
        int finite = 0;
        for (int i = 0; l && i < info.n_vocab; i++) finite += isfinite(l[i]) != 0;
        CHECKF(l && finite == info.n_vocab, "%s on %s: %d of %d logits finite", path, names[b], finite, info.n_vocab);
        CHECKF(strcmp(info.architecture, arch) == 0 && strcmp(info.backend, names[b]) == 0,
               "%s: architecture %s on %s", path, info.architecture, info.backend);
        logits[b] = l ? malloc((size_t)n_vocab * sizeof(float)) : NULL;
        if (logits[b]) memcpy(logits[b], l, (size_t)n_vocab * sizeof(float));
        if (b == 0) {
            st = kvg_arch_check_backend(m, &llama_only, &err);
            char want[256];
            snprintf(want, sizeof want, "%s needs %s, which the llama-only backend does not run yet", arch, feature);
            CHECKF(st == KVGEN_E_UNSUPPORTED && strstr(err.message, path) && strstr(err.message, want),
                   "want '%s' and the path, got: %s (%s)", want, err.message, kvgen_status_name(st));
        }
        kvgen_session_close(s);
        kvgen_model_unload(m);
    }
    if (logits[0] && logits[1]) {
        double max = 0;
        for (int i = 0; i < n_vocab; i++) max = fmax(max, fabs(logits[0][i]));
        double d = tu_max_diff(logits[0], logits[1], n_vocab);
        CHECKF(d <= 0.01 * (2.0 + max), "%s: vulkan vs reference: %g (max |logit| %g)", path, d, max);
    }
    free(logits[0]);
    free(logits[1]);
}

static void test_other_rows(const char *llama_path) {
    char *q = tu_make_model("a-qwen2-run.gguf", "--arch qwen2 --qkv-bias --layers 1");
    CHECK(q != NULL);
    if (q) expect_runs(q, "qwen2", "attention biases (attn_q.bias, attn_k.bias, attn_v.bias)");
    free(q);
    /* qwen2 without its biases: a missing tensor */
    char *nb = tu_make_model("a-qwen2-nobias.gguf", "--arch qwen2 --layers 1");
    if (nb) {
        kvg_gguf *g;
        kvg_weights w;
        kvgen_error err = {0};
        kvgen_status st = open_describe(nb, &g, &w, &err);
        CHECKF(st == KVGEN_E_FORMAT && strstr(err.message, "missing tensor blk.0.attn_q.bias"), "%s", err.message);
        kvg_weights_free(&w);
        kvg_gguf_close(g);
    }
    free(nb);
    /* qwen3: Q/K head norms (head_dim 16 wide) */
    char *q3src = tu_make_model("a-qwen3-src.gguf", "--arch qwen3 --layers 2");
    extra_tensor qk[2] = {{"blk.%d.attn_q_norm.weight", 16}, {"blk.%d.attn_k_norm.weight", 16}};
    char *q3 = q3src ? rewrite(q3src, "a-qwen3.gguf", NULL, qk, 2) : NULL;
    CHECK(q3 != NULL);
    if (q3) expect_runs(q3, "qwen3", "Q/K head norms (attn_q_norm, attn_k_norm)");
    free(q3src);
    free(q3);
    /* gemma2: post norms, GELU, ... the first named is the lowest feature bit */
    char *g2src = tu_make_model("a-gemma2-src.gguf", "--arch gemma2 --layers 1");
    extra_tensor post[2] = {{"blk.%d.post_attention_norm.weight", 64}, {"blk.%d.post_ffw_norm.weight", 64}};
    char *g2 = g2src ? rewrite(g2src, "a-gemma2.gguf", NULL, post, 2) : NULL;
    CHECK(g2 != NULL);
    if (g2) {
        expect_runs(g2, "gemma2",
                               "post-attention and post-FFN norms (post_attention_norm, post_ffw_norm)");
        kvg_gguf *g;
        kvg_weights w;
        kvgen_error err = {0};
        CHECK_OK(open_describe(g2, &g, &w, &err));
        CHECK(w.features == (KVG_F_POST_NORMS | KVG_F_ROPE_NEOX | KVG_F_GELU | KVG_F_EMBD_SCALE));
        CHECK(fabsf(w.embd_scale - 8.0f) < 1e-6f && w.act == KVG_ACT_GELU_TANH_GATED);
        CHECK(w.layers[0].attn_post_norm && w.layers[0].ffn_post_norm);
        kvg_weights_free(&w);
        kvg_gguf_close(g);
    }
    free(g2src);
    free(g2);
    /* a llama file labelled phi3: its separate Q/K/V are not what the row reads */
    char *p3 = rewrite(llama_path, "a-phi3-separate.gguf", "phi3", NULL, 0);
    if (p3) {
        kvg_gguf *g;
        kvg_weights w;
        kvgen_error err = {0};
        kvgen_status st = open_describe(p3, &g, &w, &err);
        CHECKF(st == KVGEN_E_FORMAT && strstr(err.message, p3) && strstr(err.message, "missing metadata key phi3."),
               "%s", err.message);
        kvg_weights_free(&w);
        kvg_gguf_close(g);
    }
    free(p3);
    /* a llama file with rope_freqs (llama 3.1 style): described and run by both backends */
    extra_tensor rf[1] = {{"rope_freqs.weight", 8}};
    char *r = rewrite(llama_path, "a-rope-freqs.gguf", NULL, rf, 1);
    CHECK(r != NULL);
    if (r) expect_runs(r, "llama", "RoPE frequency factors (rope_freqs)");
    free(r);
}

/* metadata that would change the math, on a row that does not read it: refused by name */
static void test_unread_metadata(void) {
    char *p = tu_make_model("a-llama-softcap.gguf", "--arch llama --softcap 50,30 --layers 1");
    CHECK(p != NULL);
    if (p) {
        kvg_gguf *g;
        kvg_weights w;
        kvgen_error err = {0};
        kvgen_status st = open_describe(p, &g, &w, &err);
        CHECKF(st == KVGEN_E_UNSUPPORTED && strstr(err.message, p) &&
                   strstr(err.message, "metadata llama.attn_logit_softcapping would change the llama forward pass"),
               "%s", err.message);
        kvg_weights_free(&w);
        kvg_gguf_close(g);
    }
    free(p);
}

static void test_unknown(const char *llama_path) {
    char *p = rewrite(llama_path, "a-gpt2.gguf", "gpt2", NULL, 0);
    CHECK(p != NULL);
    if (!p) return;
    kvg_gguf *g;
    kvg_weights w;
    kvgen_error err = {0};
    kvgen_status st = open_describe(p, &g, &w, &err);
    CHECKF(st == KVGEN_E_UNSUPPORTED && strstr(err.message, p) &&
               strstr(err.message, "architecture 'gpt2' is not supported (kvgen runs: llama, qwen2, qwen3, gemma2, "
                                   "gemma3, phi3, bert)"),
           "%s", err.message);
    size_t n = 0;
    const kvg_arch *rows = kvg_arch_rows(&n);
    for (size_t i = 0; i < n; i++)
        CHECKF(strstr(err.message, rows[i].name), "%s not listed: %s", rows[i].name, err.message);
    kvg_weights_free(&w);
    kvg_gguf_close(g);
    kvgen_model *m;
    st = load(p, KVGEN_BACKEND_REFERENCE, &m, &err);
    CHECK(st == KVGEN_E_UNSUPPORTED && m == NULL && strstr(err.message, "qwen2"));
    free(p);
}

/* runs describe with stderr captured into buf */
static kvgen_status describe_capturing(const char *path, char *buf, size_t size, kvgen_error *err) {
    char *cap = tu_tmpfile("a-stderr.txt");
    fflush(stderr);
    int saved = dup(2), fd = open(cap, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
    kvg_gguf *g;
    kvg_weights w;
    kvgen_status st = open_describe(path, &g, &w, err);
    kvg_weights_free(&w);
    kvg_gguf_close(g);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    size_t n = 0;
    char *text = tu_read_file(cap, &n);
    snprintf(buf, size, "%s", text ? text : "");
    free(text);
    free(cap);
    return st;
}

static void test_unused(const char *llama_path) {
    /* a llama-labelled file carrying Q/K/V biases: they would change the math, so refused */
    char *b = tu_make_model("a-llama-bias.gguf", "--qkv-bias --layers 2");
    CHECK(b != NULL);
    if (b) {
        char out[1024];
        kvgen_error err = {0};
        kvgen_status st = describe_capturing(b, out, sizeof out, &err);
        CHECKF(st == KVGEN_E_UNSUPPORTED && strstr(err.message, b) && strstr(err.message, "llama architecture") &&
                   strstr(err.message, "blk.0.attn_q.bias") && strstr(err.message, "blk.1.attn_v.bias") &&
                   strstr(err.message, "6 tensors"),
               "%s", err.message);
        kvgen_model *m;
        st = load(b, KVGEN_BACKEND_REFERENCE, &m, &err);
        CHECK(st == KVGEN_E_UNSUPPORTED && m == NULL);
    }
    free(b);
    /* an unused norm and a tensor of the table llama lacks are refused too */
    extra_tensor qn[1] = {{"blk.%d.attn_q_norm.weight", 16}};
    char *n = rewrite(llama_path, "a-llama-qnorm.gguf", NULL, qn, 1);
    if (n) {
        char out[1024];
        kvgen_error err = {0};
        CHECK(describe_capturing(n, out, sizeof out, &err) == KVGEN_E_UNSUPPORTED &&
              strstr(err.message, "blk.1.attn_q_norm.weight"));
    }
    free(n);
    /* a tensor that changes nothing kvgen computes: loads, with one warning line naming it */
    extra_tensor odd[1] = {{"training_stats.weight", 4}};
    char *o = rewrite(llama_path, "a-llama-extra.gguf", NULL, odd, 1);
    CHECK(o != NULL);
    if (o) {
        char out[1024];
        kvgen_error err = {0};
        kvgen_status st = describe_capturing(o, out, sizeof out, &err);
        CHECKF(st == KVGEN_OK, "%s", err.message);
        CHECKF(strstr(out, "training_stats.weight") && strstr(out, o) && strchr(out, '\n') == out + strlen(out) - 1,
               "stderr: %s", out);
    }
    free(o);
    /* the plain file warns about nothing */
    char out[1024];
    kvgen_error err = {0};
    CHECK(describe_capturing(llama_path, out, sizeof out, &err) == KVGEN_OK);
    CHECKF(out[0] == 0, "stderr: %s", out);
}

/* attention.key_length: heads x head_dim != n_embd, run by both backends alike */
static void test_wide_heads(void) {
    char *p = tu_make_model("a-wide.gguf", "--embd 64 --heads 4 --kv-heads 2 --head-dim 32 --ff 96 --layers 2");
    CHECK(p != NULL);
    if (!p) return;
    kvg_gguf *g;
    kvg_weights w;
    kvgen_error err = {0};
    kvgen_status st = open_describe(p, &g, &w, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    if (st == KVGEN_OK) {
        CHECK(w.hp.head_dim == 32 && w.hp.n_rot == 32 && w.features == KVG_F_WIDE_HEADS);
        CHECK(w.layers[0].wq->ne[1] == 128 && w.layers[0].wo->ne[0] == 128 && w.layers[0].wk->ne[1] == 64);
    }
    kvg_weights_free(&w);
    kvg_gguf_close(g);

    enum { N = 12 };
    int32_t tokens[N];
    float *logits[2] = {NULL, NULL};
    int n_vocab = 0;
    kvgen_backend backends[2] = {KVGEN_BACKEND_REFERENCE, KVGEN_BACKEND_VULKAN};
    for (int b = 0; b < (has_vulkan ? 2 : 1); b++) {
        kvgen_model *m;
        st = load(p, backends[b], &m, &err);
        CHECKF(st == KVGEN_OK, "%s", err.message);
        if (!m) continue;
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        CHECK(info.head_dim == 32 && info.n_embd == 64 && strcmp(info.architecture, "llama") == 0);
        n_vocab = info.n_vocab;
        tu_fill_tokens(tokens, N, 5, n_vocab);
        kvgen_session *s = NULL;
        kvgen_session_desc sd = {.n_ctx = 64};
        CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
        logits[b] = malloc((size_t)N * (size_t)n_vocab * sizeof(float));
        if (s) CHECK_OK(kvgen_session_prefill(s, tokens, N, logits[b], &err));
        for (int i = 0; s && i < N * n_vocab; i++)
            if (!isfinite(logits[b][i])) {
                CHECKF(0, "logit %d is not finite", i);
                break;
            }
        kvgen_session_close(s);
        kvgen_model_unload(m);
    }
    if (logits[0] && logits[1]) {
        double max = 0;
        for (int i = 0; i < N * n_vocab; i++) max = fmax(max, fabs(logits[0][i]));
        double d = tu_max_diff(logits[0], logits[1], N * n_vocab);
        /* test_vk_model's tolerance (f16 KV cache) */
        CHECKF(d <= 0.01 * (2.0 + max), "vulkan vs reference: %g (max |logit| %g)", d, max);
    }
    free(logits[0]);
    free(logits[1]);
    free(p);
}

/* phi3: attn_qkv and ffn_up seen as views of their rows (Q, K, V; gate, up), which run on both
 * backends alike; partial rotary; the LongRoPE factors: the short ones as rope_freqs, the
 * attention factor read, sessions limited to the original context when long ones exist. */

/* The logits after 6 tokens of a model loaded with context n_ctx_model on backend b (a session
 * of n_ctx_session), in a fresh array; NULL when it fails (reported). */
static float *long_logits(const char *path, kvgen_backend b, int n_ctx_model, int n_ctx_session, int *n_vocab) {
    kvgen_model_desc d = {.path = path, .backend = b, .n_threads = 1, .n_ctx = n_ctx_model};
    kvgen_model *m = NULL;
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvgen_model_load(&d, &m, &err);
    CHECKF(st == KVGEN_OK, "backend %d, n_ctx %d: %s", (int)b, n_ctx_model, err.message);
    if (!m) return NULL;
    kvgen_session_desc sd = {.n_ctx = n_ctx_session};
    int32_t t[6] = {1, 7, 3, 9, 2, 5};
    float *out = NULL;
    st = kvgen_session_create(m, &sd, &s, &err);
    if (st == KVGEN_OK) st = kvgen_session_prefill(s, t, 5, NULL, &err);
    if (st == KVGEN_OK) st = kvgen_session_decode(s, t[5], &err);
    CHECKF(st == KVGEN_OK, "backend %d, model n_ctx %d, session %d: %s", (int)b, n_ctx_model, n_ctx_session,
           err.message);
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    *n_vocab = info.n_vocab;
    const float *l = st == KVGEN_OK ? kvgen_session_logits(s) : NULL;
    if (l && (out = malloc((size_t)info.n_vocab * sizeof *out))) memcpy(out, l, (size_t)info.n_vocab * sizeof *out);
    kvgen_session_close(s);
    kvgen_model_unload(m);
    return out;
}

/* A model whose n_ctx is over the original context runs the long factors on every backend (the
 * logits move off the short-factor run's and agree across backends) and its sessions may be as
 * long as it; at or below the original context the short ones run, as with no n_ctx. */
static void test_long_factors(const char *p) {
    int nv = 0;
    float *none = long_logits(p, KVGEN_BACKEND_REFERENCE, 0, 64, &nv);
    float *at = long_logits(p, KVGEN_BACKEND_REFERENCE, 256, 64, &nv);
    float *lng = long_logits(p, KVGEN_BACKEND_REFERENCE, 1024, 64, &nv);
    float *big = long_logits(p, KVGEN_BACKEND_REFERENCE, 1024, 1024, &nv);
    CHECK(none && at && lng && big);
    if (none && at && lng && big) {
        double max = 0;
        for (int i = 0; i < nv; i++) max = fmax(max, fabs(none[i]));
        CHECKF(tu_max_diff(none, at, nv) == 0.0, "n_ctx 256 moved the logits by %g", tu_max_diff(none, at, nv));
        CHECKF(tu_max_diff(none, lng, nv) > 1e-3 * (2.0 + max), "long factors moved the logits by only %g",
               tu_max_diff(none, lng, nv));
        CHECKF(tu_max_diff(lng, big, nv) == 0.0, "the session's length moved the logits by %g",
               tu_max_diff(lng, big, nv));
        kvgen_backend others[2] = {KVGEN_BACKEND_CPU, KVGEN_BACKEND_VULKAN};
        const char *names[2] = {"cpu", "vulkan"};
        for (int b = 0; b < (has_vulkan ? 2 : 1); b++) {
            float *o = long_logits(p, others[b], 1024, 512, &nv);
            float *os = long_logits(p, others[b], 0, 64, &nv);
            CHECK(o && os);
            if (o && os) {
                double dl = tu_max_diff(o, lng, nv), ds = tu_max_diff(os, none, nv);
                CHECKF(dl <= 0.01 * (2.0 + max) && ds <= 0.01 * (2.0 + max) && dl < tu_max_diff(o, none, nv),
                       "%s vs reference: long %g, short %g, long vs short %g", names[b], dl, ds,
                       tu_max_diff(o, none, nv));
                printf("  phi3 long factors on %s: %g off the reference (short: %g), %g off the short run\n",
                       names[b], dl, ds, tu_max_diff(o, none, nv));
            }
            free(o);
            free(os);
        }
    }
    free(none);
    free(at);
    free(lng);
    free(big);
    /* the model's n_ctx is the sessions' limit and default; a bad one is refused at load */
    kvgen_model_desc d = {.path = p, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 1, .n_ctx = 1024};
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_model_load(&d, &m, &err));
    if (m) {
        kvgen_session *s = NULL;
        kvgen_session_desc sd = {.n_ctx = 2048};
        kvgen_status st = kvgen_session_create(m, &sd, &s, &err);
        CHECKF(st == KVGEN_E_UNSUPPORTED && !s && strstr(err.message, "n_ctx 2048") && strstr(err.message, "1024"),
               "%s (%s)", err.message, kvgen_status_name(st));
        sd.n_ctx = 0;
        CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
        kvgen_cache_info ci;
        if (s) kvgen_session_cache_info(s, &ci);
        CHECK(s && ci.capacity == 1024);
        kvgen_session_close(s);
        kvgen_model_unload(m);
    }
    d.n_ctx = -1;
    kvgen_status st = kvgen_model_load(&d, &m, &err);
    CHECKF(st == KVGEN_E_INVALID_ARGUMENT && !m && strstr(err.message, "desc.n_ctx -1"), "%s (%s)", err.message,
           kvgen_status_name(st));
}

static void test_phi3(void) {
    char *p = tu_make_model("a-phi3.gguf", "--arch phi3 --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 "
                                           "--rope-dim 12 --untied --type Q8_0");
    CHECK(p != NULL);
    if (!p) return;
    kvg_gguf *g;
    kvg_weights w;
    kvgen_error err = {0};
    kvgen_status st = open_describe(p, &g, &w, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    if (st == KVGEN_OK) {
        CHECK(w.hp.n_rot == 12 && w.hp.n_ctx_rope == 0 && !w.rope_freqs && w.features == KVG_F_ROPE_NEOX);
        for (int l = 0; l < 2; l++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", l);
            const kvg_tensor *qkv = kvg_gguf_find_tensor(g, name);
            snprintf(name, sizeof name, "blk.%d.ffn_up.weight", l);
            const kvg_tensor *up = kvg_gguf_find_tensor(g, name);
            const kvg_layer *L = &w.layers[l];
            size_t rb = kvg_row_bytes(KVG_TYPE_Q8_0, 64);
            const unsigned char *q0 = qkv ? qkv->data : NULL, *u0 = up ? up->data : NULL;
            CHECK(qkv && qkv->ne[1] == 64 + 2 * 32 && up && up->ne[1] == 2 * 96);
            if (!qkv || !up) continue;
            CHECK(L->wq->ne[1] == 64 && L->wk->ne[1] == 32 && L->wv->ne[1] == 32 && L->wq->type == KVG_TYPE_Q8_0);
            CHECK((const unsigned char *)L->wq->data == q0 && (const unsigned char *)L->wk->data == q0 + 64 * rb &&
                  (const unsigned char *)L->wv->data == q0 + 96 * rb && L->wv->nbytes == 32 * rb);
            CHECK(L->w_gate->ne[1] == 96 && L->w_up->ne[1] == 96 && (const unsigned char *)L->w_gate->data == u0 &&
                  (const unsigned char *)L->w_up->data == u0 + 96 * rb && L->wk->offset == qkv->offset + 64 * rb);
            CHECKF(strstr(L->wk->name, "attn_qkv") && strstr(L->wk->name, "attn_k"), "%s", L->wk->name);
        }
    }
    kvg_weights_free(&w);
    kvg_gguf_close(g);
    expect_runs(p, "phi3", "NEOX-style (half-split) RoPE");
    free(p);

    /* LongRoPE: ctx 1024 over an original 256 */
    p = tu_make_model("a-phi3-long.gguf", "--arch phi3 --layers 1 --embd 64 --heads 4 --ff 96 --ctx 1024 "
                                          "--orig-ctx 256 --rope-factors --seed 3");
    CHECK(p != NULL);
    if (!p) return;
    st = open_describe(p, &g, &w, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    if (st == KVGEN_OK) {
        float want = sqrtf(1.0f + logf(4.0f) / logf(256.0f));
        CHECK(w.rope_freqs && strcmp(w.rope_freqs->name, "rope_factors_short.weight") == 0 && w.rope_factors_long);
        CHECKF(fabsf(w.hp.rope_attn_factor - want) < 1e-6f && w.hp.n_ctx_orig == 256 && w.hp.n_ctx_rope == 256,
               "attn_factor %g, orig %d, limit %d", (double)w.hp.rope_attn_factor, w.hp.n_ctx_orig, w.hp.n_ctx_rope);
        CHECK(w.features == (KVG_F_ROPE_NEOX | KVG_F_ROPE_FREQS | KVG_F_ROPE_ATTN_FACTOR));
    }
    kvg_weights_free(&w);
    kvg_gguf_close(g);
    expect_runs(p, "phi3", "NEOX-style (half-split) RoPE");
    kvgen_model *m = NULL;
    CHECK_OK(load(p, KVGEN_BACKEND_REFERENCE, &m, &err));
    if (m) {
        kvgen_session *s = NULL;
        kvgen_session_desc sd = {.n_ctx = 512};
        st = kvgen_session_create(m, &sd, &s, &err);
        CHECKF(st == KVGEN_E_UNSUPPORTED && s == NULL && strstr(err.message, "kvgen_session_create: n_ctx 512") &&
                   strstr(err.message, "256") && strstr(err.message, "rope_factors_long"),
               "%s (%s)", err.message, kvgen_status_name(st));
        sd.n_ctx = 0; /* the default is the original context */
        CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
        kvgen_cache_info ci;
        if (s) kvgen_session_cache_info(s, &ci);
        CHECK(s && ci.capacity == 256);
        kvgen_session_close(s);
        kvgen_model_unload(m);
    }
    test_long_factors(p);
    free(p);

    /* a chat on Phi-3's vocabulary: its file's own template runs (the phi3 family where a file has
     * none), and <|end|> ends the reply */
    char *vocab = tu_testdata("tokenizer/ggml-vocab-phi-3.gguf");
    char args[512];
    snprintf(args, sizeof args, "--arch phi3 --layers 1 --embd 64 --heads 4 --ff 96 --untied --vocab %s", vocab);
    p = tu_make_model("a-phi3-chat.gguf", args);
    free(vocab);
    CHECK(p != NULL);
    if (!p) return;
    CHECK_OK(load(p, KVGEN_BACKEND_REFERENCE, &m, &err));
    if (m) {
        int32_t end = kvgen_token_find(m, "<|end|>");
        kvgen_logit_bias force = {end, 100.0f};
        kvgen_sampler_desc samp = {.bias = &force, .n_bias = 1};
        kvgen_session_desc sd = {.n_ctx = 128, .sampler = &samp};
        kvgen_session *s = NULL;
        CHECK(end >= 0);
        CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
        const char *family = s ? kvgen_chat_template_name(s, &err) : NULL;
        CHECKF(family && (strcmp(family, "jinja") == 0 || strcmp(family, "phi3") == 0), "family %s", family ? family : err.message);
        kvgen_gen *gen = NULL;
        kvgen_generate_desc gd = {.max_tokens = 8};
        CHECK_OK(s ? kvgen_chat_gen_begin(s, "user", "Hi", &gd, &gen, &err) : KVGEN_E_INTERNAL);
        kvgen_gen_step step = {0};
        while (gen && step.finish == KVGEN_FINISH_NONE && kvgen_gen_next(gen, &step, &err) == KVGEN_OK) {}
        CHECKF(gen && step.finish == KVGEN_FINISH_STOP && kvgen_gen_n_tokens(gen) == 1 && s &&
                   kvgen_session_tokens(s)[kvgen_session_length(s) - 1] == end,
               "finish %s after %d tokens", kvgen_finish_name(step.finish), gen ? kvgen_gen_n_tokens(gen) : -1);
        kvgen_gen_end(gen);
        kvgen_session_close(s);
        kvgen_model_unload(m);
    }
    free(p);
}

int main(void) {
    int n_dev = 0;
    kvgen_error err = {0};
    has_vulkan = kvgen_devices(NULL, 0, &n_dev, &err) == KVGEN_OK && n_dev > 0;
    if (!has_vulkan) printf("no Vulkan device: the Vulkan checks are skipped\n");
    test_table();
    char *llama = tu_make_model("a-llama.gguf", "--layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96");
    CHECK(llama != NULL);
    if (llama) {
        test_llama_row(llama);
        test_prefix(llama);
        test_other_rows(llama);
        test_unknown(llama);
        test_unread_metadata();
        test_unused(llama);
    }
    test_wide_heads();
    test_phi3();
    free(llama);
    return tu_finish("test_arch");
}
