/* test_lora.c: LoRA adapters (kvgen_adapter_load, kvgen_session_set_adapters) on a random F32
 * model and adapters from kvgen-mkmodel --lora:
 * - good adapters of every type the tool writes (F32, F16, BF16, Q8_0) and of rank 1 load, and
 *   get_info tells their facts;
 * - bad adapter files are refused with the status kvgen.h gives and a message naming the tensor
 *   or the key (another architecture, wrong shapes, a half without its other half, a truncated
 *   file, not an adapter, a tensor the model does not have or kvgen does not adapt);
 * - merged-weights parity on the reference and cpu backends: base + adapter at scale s gives the
 *   logits of a model whose matrices are W + s' B A (computed here in double, written as F32),
 *   over a prompt and a few decodes, for adapters of every type, with and without alpha, for
 *   phi3's fused matrices and for wide heads; scale 0 is the base model bit for bit; two
 *   adapters at once are the model merged with both;
 * - sessions with different adapters, and one without, run as jobs in one batch end exactly as
 *   each does alone; the prefix cache shares pages only under the same adapters and scales;
 * - a fork runs its parent's adapters; refused set_adapters calls leave the set as it was;
 * - on Q8_0 weights the cpu backend disagrees with the reference no more with an adapter than
 *   without (the product is f32 on both);
 * - kvgen-mkmodel --lora: the tensors it writes (fused ones as stored), flags refused by name. */
#define _POSIX_C_SOURCE 200809L
#include <sys/wait.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include "kvg_gguf.h"
#include "kvg_quant.h"
#include "testutil.h"

/* the model's shape; every adapter here is made with the same flags, so it fits */
#define SHAPE "--seed 11 --layers 2 --embd 64 --ff 96 --heads 4 --kv-heads 2 --vocab-size 300"
enum { N_LAYER = 2, N_EMBD = 64, N_FF = 96, KV_DIM = 32, N_TARGETS = 7 };

static char *g_base;     /* the model */
static char *g_lora;     /* F32, rank 8, alpha 8 (the default), every target */
static char *g_lora16;   /* F16, rank 8 */
static char *g_lora_bf;  /* BF16, rank 8 */
static char *g_lora_q8;  /* Q8_0, rank 32 (Q8_0 rows are blocks of 32) */
static char *g_lora2;    /* F32, rank 4, alpha 2, q, v and down only, another seed */
static char *g_lora_na;  /* F32, rank 8, no alpha (--lora-alpha 0: s' is the scale itself) */
static char *g_lora_r1;  /* F32, rank 1: lora_a written 1-D ([n_in]), as ggml's writer trims trailing 1s */
/* phi3: attn_qkv and a gate-and-up ffn_up stored fused, adapted through their parts */
#define PHI3 "--arch phi3 --seed 4 --layers 2 --embd 64 --ff 96 --heads 4 --kv-heads 2 --vocab-size 300"
static char *g_phi3, *g_phi3_lora, *g_phi3_lora_qup;
/* heads wider than n_embd / n_head: attn_output's input (heads x head size) is not n_embd */
#define WIDE "--seed 9 --layers 2 --embd 64 --ff 96 --heads 4 --kv-heads 2 --head-dim 32 --vocab-size 300"
static char *g_wide, *g_wide_lora;

static const kvgen_backend backends[] = {KVGEN_BACKEND_REFERENCE, KVGEN_BACKEND_CPU};
static const char *const backend_names[] = {"reference", "cpu"};

static kvgen_model *load_model(const char *path, kvgen_backend backend) {
    kvgen_model_desc md = {.path = path, .backend = backend, .n_threads = 2, .kv_pool_tokens = 8192};
    return tu_load(&md);
}

static kvgen_adapter *load_adapter(kvgen_model *m, const char *path) {
    kvgen_adapter *a = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvgen_adapter_load(m, path, &a, &err);
    CHECKF(st == KVGEN_OK && a, "adapter %s: %s", path, err.message);
    return a;
}

/* ---- good adapters ----------------------------------------------------------------------------- */

static void test_good_adapters(void) {
    kvgen_model *m = load_model(g_base, KVGEN_BACKEND_REFERENCE);
    if (!m) return;
    const struct {
        const char *path;
        float alpha;
        int rank, n_matrices;
    } good[] = {
        {g_lora, 8.0f, 8, N_LAYER * N_TARGETS},    {g_lora16, 8.0f, 8, N_LAYER * N_TARGETS},
        {g_lora_q8, 32.0f, 32, N_LAYER * N_TARGETS}, {g_lora2, 2.0f, 4, N_LAYER * 3},
        {g_lora_na, 0.0f, 8, N_LAYER * N_TARGETS}, {g_lora_r1, 1.0f, 1, N_LAYER * N_TARGETS},
        {g_lora_bf, 8.0f, 8, N_LAYER * N_TARGETS},
    };
    uint64_t hashes[7];
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        kvgen_adapter *a = load_adapter(m, good[i].path);
        if (!a) continue;
        kvgen_adapter_info info;
        kvgen_adapter_get_info(a, &info);
        CHECKF(info.name && strcmp(info.name, "kvgen-mkmodel random lora") == 0, "%s: name %s", good[i].path,
               info.name ? info.name : "(null)");
        CHECK(info.path && strcmp(info.path, good[i].path) == 0);
        CHECKF(info.alpha == good[i].alpha && info.max_rank == good[i].rank && info.n_matrices == good[i].n_matrices,
               "%s: alpha %g rank %d matrices %d", good[i].path, (double)info.alpha, info.max_rank, info.n_matrices);
        hashes[i] = info.hash;
        for (size_t k = 0; k < i; k++) CHECKF(hashes[k] != hashes[i], "adapters %zu and %zu hash alike", k, i);
        kvgen_adapter_free(a);
    }
    /* the same file twice: two handles, one content hash */
    kvgen_adapter *a = load_adapter(m, g_lora), *b = load_adapter(m, g_lora);
    kvgen_adapter_info ia, ib;
    kvgen_adapter_get_info(a, &ia);
    kvgen_adapter_get_info(b, &ib);
    CHECK(a != b && ia.hash == ib.hash && ia.hash == hashes[0]);
    kvgen_adapter_free(a);
    kvgen_adapter_free(b);
    kvgen_adapter_get_info(NULL, &ia); /* zeros */
    CHECK(ia.name == NULL && ia.n_matrices == 0);
    kvgen_adapter_free(NULL);
    kvgen_model_unload(m);
}

/* ---- bad adapters ------------------------------------------------------------------------------ */

/* A rewrite of an adapter file: one key set to another string (or dropped), one tensor reshaped
 * (zeros of F32), renamed or dropped, one extra F32 tensor of zeros. */
typedef struct adapter_edit {
    const char *key, *value;  /* key: replaced by value (NULL: dropped) */
    const char *tensor;       /* the tensor changed: */
    int drop;                 /* left out */
    uint64_t ne0, ne1;        /* reshaped (0: as it is) */
    const char *rename;       /* renamed */
    struct {
        const char *name;     /* added after the others (NULL: none) */
        uint64_t ne0, ne1;
    } extra[2];
} adapter_edit;

static void edit_keys(kvg_gguf_writer *w, const kvg_gguf *src, const void *ctx) {
    const adapter_edit *e = ctx;
    for (int i = 0; i < kvg_gguf_n_kv(src); i++) {
        const char *k = kvg_gguf_key(src, i);
        if (e->key && strcmp(k, e->key) == 0) continue;
        kvg_gguf_copy_kv(w, src, k);
    }
    if (e->key && e->value) kvg_gguf_set_str(w, e->key, e->value);
}

static void add_zeros(kvg_gguf_writer *w, const char *name, uint64_t ne0, uint64_t ne1) {
    uint64_t ne[2] = {ne0, ne1};
    float *z = calloc((size_t)(ne0 * ne1), sizeof *z);
    kvg_gguf_add_tensor(w, name, KVG_TYPE_F32, 2, ne, z, (size_t)(ne0 * ne1) * sizeof *z);
    free(z);
}

static void edit_tensor(kvg_gguf_writer *w, const kvg_tensor *t, const void *ctx) {
    const adapter_edit *e = ctx;
    if (!e->tensor || strcmp(t->name, e->tensor) != 0) {
        kvg_gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->nbytes);
        return;
    }
    if (e->drop) return;
    if (e->rename) kvg_gguf_add_tensor(w, e->rename, t->type, t->n_dims, t->ne, t->data, t->nbytes);
    else add_zeros(w, t->name, e->ne0 ? e->ne0 : t->ne[0], e->ne1 ? e->ne1 : t->ne[1]);
}

static void edit_finish(kvg_gguf_writer *w, const kvg_gguf *src, const void *ctx) {
    (void)src;
    const adapter_edit *e = ctx;
    for (int i = 0; i < 2; i++)
        if (e->extra[i].name) add_zeros(w, e->extra[i].name, e->extra[i].ne0, e->extra[i].ne1);
}

static char *edited(const char *name, const adapter_edit *e) {
    tu_gguf_edit ed = {.keys = edit_keys, .tensor = edit_tensor, .finish = edit_finish, .ctx = e};
    char *p = tu_gguf_rewrite(g_lora, name, &ed);
    CHECKF(p != NULL, "could not write %s", name);
    return p;
}

/* path is refused with `want`, its message naming the file and holding `needle` (and `needle2`) */
static void refused(kvgen_model *m, const char *path, kvgen_status want, const char *needle, const char *needle2) {
    if (!path) return;
    kvgen_adapter *a = (kvgen_adapter *)&a; /* set to NULL by the refusal */
    kvgen_error err = {0};
    kvgen_status st = kvgen_adapter_load(m, path, &a, &err);
    CHECKF(st == want && err.status == want, "%s: %s, want %s (%s)", path, kvgen_status_name(st),
           kvgen_status_name(want), err.message);
    CHECKF(a == NULL, "%s: refused, yet out is set", path);
    CHECKF(strstr(err.message, path) != NULL, "the message does not name the file: %s", err.message);
    CHECKF(strstr(err.message, needle) != NULL, "the message lacks '%s': %s", needle, err.message);
    if (needle2) CHECKF(strstr(err.message, needle2) != NULL, "the message lacks '%s': %s", needle2, err.message);
    if (st == KVGEN_OK) kvgen_adapter_free(a);
}

static void test_bad_adapters(void) {
    kvgen_model *m = load_model(g_base, KVGEN_BACKEND_REFERENCE);
    if (!m) return;
    char *p;

    p = edited("lora_arch.gguf", &(adapter_edit){.key = "general.architecture", .value = "qwen2"});
    refused(m, p, KVGEN_E_INVALID_ARGUMENT, "qwen2", "llama");
    free(p);
    p = edited("lora_noarch.gguf", &(adapter_edit){.key = "general.architecture"});
    refused(m, p, KVGEN_E_FORMAT, "general.architecture", NULL);
    free(p);
    p = edited("lora_type.gguf", &(adapter_edit){.key = "general.type", .value = "model"});
    refused(m, p, KVGEN_E_FORMAT, "general.type", "model");
    free(p);
    p = edited("lora_notype.gguf", &(adapter_edit){.key = "general.type"});
    refused(m, p, KVGEN_E_FORMAT, "general.type", NULL);
    free(p);
    p = edited("lora_atype.gguf", &(adapter_edit){.key = "adapter.type", .value = "prompt_tuning"});
    refused(m, p, KVGEN_E_UNSUPPORTED, "adapter.type", "prompt_tuning");
    free(p);
    p = edited("lora_alpha.gguf", &(adapter_edit){.key = "adapter.lora.alpha", .value = "eight"});
    refused(m, p, KVGEN_E_FORMAT, "adapter.lora.alpha", NULL);
    free(p);
    /* a model file is not an adapter */
    refused(m, g_base, KVGEN_E_FORMAT, "general.type", NULL);

    /* shapes: lora_a's n_in, lora_b's n_out, the rank of a against b's */
    p = edited("lora_n_in.gguf", &(adapter_edit){.tensor = "blk.1.attn_k.weight.lora_a", .ne0 = N_EMBD + 32});
    refused(m, p, KVGEN_E_INVALID_ARGUMENT, "blk.1.attn_k.weight", "[96, 8]");
    free(p);
    p = edited("lora_n_out.gguf", &(adapter_edit){.tensor = "blk.0.ffn_down.weight.lora_b", .ne1 = N_EMBD * 2});
    refused(m, p, KVGEN_E_INVALID_ARGUMENT, "blk.0.ffn_down.weight", "[8, 128]");
    free(p);
    p = edited("lora_n_kv.gguf", &(adapter_edit){.tensor = "blk.0.attn_v.weight.lora_b", .ne1 = N_EMBD});
    refused(m, p, KVGEN_E_INVALID_ARGUMENT, "blk.0.attn_v.weight", "[64, 32]");
    free(p);
    p = edited("lora_rank.gguf", &(adapter_edit){.tensor = "blk.1.ffn_up.weight.lora_b", .ne0 = 4});
    refused(m, p, KVGEN_E_INVALID_ARGUMENT, "blk.1.ffn_up.weight", "[4, 96]");
    free(p);

    /* a half without its other half: the message names the one missing */
    p = edited("lora_no_b.gguf", &(adapter_edit){.tensor = "blk.0.attn_q.weight.lora_b", .drop = 1});
    refused(m, p, KVGEN_E_FORMAT, "blk.0.attn_q.weight.lora_b", NULL);
    free(p);
    p = edited("lora_no_a.gguf", &(adapter_edit){.tensor = "blk.1.ffn_gate.weight.lora_a", .drop = 1});
    refused(m, p, KVGEN_E_FORMAT, "blk.1.ffn_gate.weight.lora_a", NULL);
    free(p);

    /* a tensor the model does not have (a third layer); matrices kvgen does not adapt (the
     * embeddings, a norm); a half of those alone is refused for the missing half first */
    p = edited("lora_blk2.gguf", &(adapter_edit){.extra = {{"blk.2.attn_q.weight.lora_a", N_EMBD, 8},
                                                           {"blk.2.attn_q.weight.lora_b", 8, N_EMBD}}});
    refused(m, p, KVGEN_E_INVALID_ARGUMENT, "blk.2.attn_q.weight", NULL);
    free(p);
    p = edited("lora_embd.gguf", &(adapter_edit){.extra = {{"token_embd.weight.lora_a", N_EMBD, 8},
                                                           {"token_embd.weight.lora_b", 8, 300}}});
    refused(m, p, KVGEN_E_UNSUPPORTED, "token_embd.weight", NULL);
    free(p);
    p = edited("lora_norm.gguf", &(adapter_edit){.extra = {{"blk.0.attn_norm.weight.lora_a", N_EMBD, 8},
                                                           {"blk.0.attn_norm.weight.lora_b", 8, 1}}});
    refused(m, p, KVGEN_E_UNSUPPORTED, "blk.0.attn_norm.weight", NULL);
    free(p);
    p = edited("lora_embd_a.gguf", &(adapter_edit){.extra = {{"token_embd.weight.lora_a", N_EMBD, 8}}});
    refused(m, p, KVGEN_E_FORMAT, "token_embd.weight.lora_b", NULL);
    free(p);
    p = edited("lora_rename.gguf", &(adapter_edit){.tensor = "blk.0.attn_q.weight.lora_a",
                                                   .rename = "blk.0.attn_qq.weight.lora_a"});
    refused(m, p, KVGEN_E_FORMAT, "blk.0.attn_qq.weight.lora_b", NULL); /* the first of the two lone halves */
    free(p);

    /* no LoRA tensors at all */
    {
        kvg_gguf_writer *w = kvg_gguf_writer_new();
        kvg_gguf_set_str(w, "general.architecture", "llama");
        kvg_gguf_set_str(w, "general.type", "adapter");
        kvg_gguf_set_str(w, "adapter.type", "lora");
        add_zeros(w, "blk.0.attn_q.weight.not_lora", N_EMBD, 8);
        p = tu_tmpfile("lora_empty.gguf");
        kvgen_error err = {0};
        CHECK_OK(kvg_gguf_writer_save(w, p, &err));
        kvg_gguf_writer_free(w);
        refused(m, p, KVGEN_E_FORMAT, "lora_a", NULL);
        free(p);
    }

    /* truncated: the header promises tensor data the file no longer has */
    {
        size_t size = 0;
        char *bytes = tu_read_file(g_lora, &size);
        CHECK(bytes && size > 4096);
        p = tu_tmpfile("lora_truncated.gguf");
        FILE *f = fopen(p, "wb");
        CHECK(f != NULL);
        if (f && bytes) {
            fwrite(bytes, 1, size - size / 4, f);
            fclose(f);
        }
        refused(m, p, KVGEN_E_FORMAT, "", NULL);
        free(bytes);
        free(p);
    }
    /* missing file */
    p = tu_tmpfile("lora_missing.gguf");
    remove(p);
    refused(m, p, KVGEN_E_IO, "", NULL);
    free(p);

    /* an adapter of another shape names the tensor and both shapes */
    p = tu_make_model("lora_wide.gguf", "--lora --seed 11 --layers 2 --embd 96 --ff 96 --heads 4 --kv-heads 2");
    refused(m, p, KVGEN_E_INVALID_ARGUMENT, "blk.0.attn_q.weight", "[64, 64]");
    free(p);

    /* arguments */
    kvgen_adapter *a = NULL;
    kvgen_error err = {0};
    CHECK(kvgen_adapter_load(NULL, g_lora, &a, &err) == KVGEN_E_INVALID_ARGUMENT && a == NULL);
    CHECK(kvgen_adapter_load(m, NULL, &a, &err) == KVGEN_E_INVALID_ARGUMENT && a == NULL);
    CHECK(kvgen_adapter_load(m, "", &a, &err) == KVGEN_E_INVALID_ARGUMENT && a == NULL);
    CHECK(kvgen_adapter_load(m, g_lora, NULL, &err) == KVGEN_E_INVALID_ARGUMENT);
    kvgen_model_unload(m);
}

/* ---- merged-weights parity -------------------------------------------------------------------- */

/* an adapter file and the scale s' its products run at: the session's scale times alpha / rank
 * (alpha from the file; the rank of each pair, read at merge time) */
typedef struct merge_part {
    kvg_gguf *g;
    float scale;
} merge_part;

typedef struct merge_ctx {
    merge_part part[2];
    int n;
} merge_ctx;

/* a tensor's rows as f32 */
static float *rows_f32(const kvg_tensor *t) {
    float *out = malloc((size_t)t->n_elements * sizeof *out);
    size_t row = kvg_row_bytes(t->type, t->ne[0]);
    for (uint64_t r = 0; r < t->n_elements / t->ne[0]; r++)
        kvg_dequantize_row(t->type, (const unsigned char *)t->data + r * row, out + r * t->ne[0], t->ne[0]);
    return out;
}

/* W' = W + sum over the adapters of s' B A, in double, written as F32 */
static void merge_tensor(kvg_gguf_writer *w, const kvg_tensor *t, const void *ctx) {
    const merge_ctx *mc = ctx;
    char name[160];
    float *wf = NULL;
    for (int i = 0; i < mc->n; i++) {
        snprintf(name, sizeof name, "%s.lora_a", t->name);
        const kvg_tensor *ta = kvg_gguf_find_tensor(mc->part[i].g, name);
        snprintf(name, sizeof name, "%s.lora_b", t->name);
        const kvg_tensor *tb = kvg_gguf_find_tensor(mc->part[i].g, name);
        if (!ta || !tb) continue;
        CHECK(t->type == KVG_TYPE_F32 && ta->ne[0] == t->ne[0] && tb->ne[1] == t->ne[1] && ta->ne[1] == tb->ne[0]);
        if (!wf) wf = rows_f32(t);
        float *a = rows_f32(ta), *b = rows_f32(tb);
        float alpha = 0.0f;
        kvg_gguf_get_f32(mc->part[i].g, "adapter.lora.alpha", &alpha);
        int n_in = (int)t->ne[0], n_out = (int)t->ne[1], rank = (int)ta->ne[1];
        double s = alpha != 0.0f ? (double)mc->part[i].scale * alpha / rank : (double)mc->part[i].scale;
        for (int o = 0; o < n_out; o++)
            for (int j = 0; j < n_in; j++) {
                double acc = 0.0;
                for (int r = 0; r < rank; r++) acc += (double)b[(size_t)o * rank + r] * a[(size_t)r * n_in + j];
                wf[(size_t)o * n_in + j] = (float)(wf[(size_t)o * n_in + j] + s * acc);
            }
        free(a);
        free(b);
    }
    if (wf) kvg_gguf_add_tensor(w, t->name, KVG_TYPE_F32, t->n_dims, t->ne, wf, t->nbytes);
    else kvg_gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->nbytes);
    free(wf);
}

/* the base model merged with adapters paths[i] at scales[i]; malloc'd path */
static char *merged_model(const char *base_path, const char *out_name, const char *const *paths, const float *scales,
                          int n) {
    merge_ctx mc = {.n = n};
    kvgen_error err = {0};
    for (int i = 0; i < n; i++) {
        CHECK_OK(kvg_gguf_open(paths[i], &mc.part[i].g, &err));
        mc.part[i].scale = scales[i];
    }
    char *p = tu_gguf_rewrite(base_path, out_name, &(tu_gguf_edit){.tensor = merge_tensor, .ctx = &mc});
    CHECKF(p != NULL, "could not write %s", out_name);
    for (int i = 0; i < n; i++) kvg_gguf_close(mc.part[i].g);
    return p;
}

enum { PROMPT = 7, STEPS = 4, MAX_VOCAB = 512 };

/* The logits of a prompt and STEPS decodes (each of the token `tokens` gives, or when its
 * entry is -1 the argmax of the logits before, which it then records): (1 + STEPS) rows of
 * n_vocab. */
static void run(kvgen_model *m, const kvgen_adapter *const *ads, const float *scales, size_t n_ads,
                const int32_t *prompt, int32_t *tokens, float *out, int n_vocab) {
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    kvgen_session_desc sd = {.n_ctx = 64, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    if (!s) return;
    if (n_ads) CHECK_OK(kvgen_session_set_adapters(s, ads, scales, n_ads, &err));
    CHECK_OK(kvgen_session_prefill(s, prompt, PROMPT, NULL, &err));
    for (int k = 0; k <= STEPS; k++) {
        const float *l = kvgen_session_logits(s);
        CHECK(l != NULL);
        if (!l) break;
        memcpy(out + (size_t)k * n_vocab, l, (size_t)n_vocab * sizeof *out);
        if (k == STEPS) break;
        if (tokens[k] < 0) {
            int best = 0;
            for (int i = 1; i < n_vocab; i++) best = l[i] > l[best] ? i : best;
            tokens[k] = best;
        }
        CHECK_OK(kvgen_session_decode(s, tokens[k], &err));
    }
    kvgen_session_close(s);
}

static double max_abs(const float *a, int n) {
    double m = 0.0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
    return m;
}

/* Tolerances of base + adapter against the merged model, relative to the largest |logit|:
 * - reference: every product in f32 in both runs; they differ only in the order of f32 sums
 *   (W x + s' B (A x) against (W + s' B A) x, the merged weights rounded once to f32), each
 *   worth a few ulp of the sums' magnitudes: 1e-5 of the range, with margin (measured: 3e-7);
 * - cpu: F32 weights are dotted with f32 activations (kvg_qdot.h: only the quantized types get
 *   int16 activations), so the products differ as the reference's do; but its K/V pages hold
 *   f16, and a key or value that rounds to the neighbouring f16 in one run moves the attention
 *   by up to 2^-11 of it: 1e-3 of the range (measured: 2e-7, no rounding flipped here).
 * The adapter moves the logits by far more than either (checked: the comparison says something). */
static const double parity_tol[] = {1e-5, 1e-3};

/* The model at base_path (loaded as `base`) with adapters ads (the files `paths`) at `scales`
 * against the model merged with them, over a prompt and STEPS greedy decodes: within the
 * backend's tolerance, while the adapters move the logits far more. Returns the difference
 * relative to the logits' range. */
static double against_merged(int bi, const char *base_path, kvgen_model *base, const kvgen_adapter *const *ads,
                             const char *const *paths, const float *scales, int n, const char *label) {
    kvgen_model_info info;
    kvgen_model_get_info(base, &info);
    int nv = info.n_vocab;
    size_t rows = (size_t)(1 + STEPS) * (size_t)nv;
    float *lb = malloc(rows * sizeof *lb), *la = malloc(rows * sizeof *la), *lm = malloc(rows * sizeof *lm);
    int32_t prompt[PROMPT], toks[STEPS] = {-1, -1, -1, -1};
    tu_fill_tokens(prompt, PROMPT, 3, nv);
    run(base, ads, scales, (size_t)n, prompt, toks, la, nv); /* chooses the decoded tokens */
    run(base, NULL, NULL, 0, prompt, toks, lb, nv);
    double rel = INFINITY;
    char *mp = merged_model(base_path, "lora_merged.gguf", paths, scales, n);
    kvgen_model *merged = mp ? load_model(mp, backends[bi]) : NULL;
    if (merged) {
        run(merged, NULL, NULL, 0, prompt, toks, lm, nv);
        double range = max_abs(la, (int)rows), d = tu_max_diff(la, lm, (int)rows);
        double moved = tu_max_diff(la, lb, (int)rows);
        rel = d / range;
        CHECKF(d <= parity_tol[bi] * range, "%s %s: adapters vs merged differ by %.3g (range %.3g)",
               backend_names[bi], label, d, range);
        CHECKF(moved > 100.0 * parity_tol[bi] * range, "%s %s: the adapters moved the logits by only %.3g",
               backend_names[bi], label, moved);
        kvgen_model_unload(merged);
    }
    free(mp);
    free(lb);
    free(la);
    free(lm);
    return rel;
}

static void test_merged_parity(int bi) {
    const char *what = backend_names[bi];
    kvgen_model *base = load_model(g_base, backends[bi]);
    if (!base) return;
    kvgen_model_info info;
    kvgen_model_get_info(base, &info);
    int nv = info.n_vocab;
    CHECK(nv > 0 && nv <= MAX_VOCAB && strcmp(info.backend, what) == 0);
    size_t rows = (size_t)(1 + STEPS) * (size_t)nv;
    float *lb = malloc(rows * sizeof *lb), *la = malloc(rows * sizeof *la), *lm = malloc(rows * sizeof *lm);
    int32_t prompt[PROMPT];
    tu_fill_tokens(prompt, PROMPT, 3, nv);
    kvgen_adapter *a1 = load_adapter(base, g_lora), *a2 = load_adapter(base, g_lora2);
    kvgen_adapter *a16 = load_adapter(base, g_lora16), *ana = load_adapter(base, g_lora_na);
    kvgen_adapter *ar1 = load_adapter(base, g_lora_r1), *abf = load_adapter(base, g_lora_bf);
    kvgen_adapter *aq8 = load_adapter(base, g_lora_q8);

    /* one adapter at a scale, every type and alpha: base + adapter == merged */
    const struct {
        const kvgen_adapter *a;
        const char *path;
        float scale;
    } one[] = {{a1, g_lora, 0.8f}, {a16, g_lora16, 1.0f}, {ana, g_lora_na, 0.3f}, {a2, g_lora2, -1.5f},
                 {ar1, g_lora_r1, 2.0f}, {abf, g_lora_bf, 1.0f}, {aq8, g_lora_q8, 0.5f}};
    double worst = 0.0;
    for (size_t c = 0; c < sizeof one / sizeof one[0]; c++) {
        if (!one[c].a) continue;
        char label[300];
        snprintf(label, sizeof label, "%s at %g", one[c].path, (double)one[c].scale);
        worst = fmax(worst, against_merged(bi, g_base, base, &one[c].a, &one[c].path, &one[c].scale, 1, label));
    }
    /* two adapters at once == merged with both */
    if (a1 && a2) {
        const kvgen_adapter *both[2] = {a1, a2};
        const char *paths[2] = {g_lora, g_lora2};
        float sc[2] = {0.6f, 1.2f};
        worst = fmax(worst, against_merged(bi, g_base, base, both, paths, sc, 2, "two adapters"));
    }
    printf("%s: adapters vs merged, worst difference %.3g of the logits' range\n", what, worst);

    /* scale 0 is the base model, bit for bit; so is the empty set after one */
    if (a1) {
        int32_t toks[STEPS] = {-1, -1, -1, -1};
        run(base, NULL, NULL, 0, prompt, toks, lb, nv);
        float zero = 0.0f;
        run(base, (const kvgen_adapter *const *)&a1, &zero, 1, prompt, toks, la, nv);
        CHECKF(memcmp(la, lb, rows * sizeof *la) == 0, "%s: scale 0 is not the base model", what);
        kvgen_session *s = NULL;
        kvgen_error err = {0};
        CHECK_OK(kvgen_session_create(base, NULL, &s, &err));
        CHECK_OK(kvgen_session_set_adapters(s, (const kvgen_adapter *const *)&a1, NULL, 1, &err));
        CHECK_OK(kvgen_session_set_adapters(s, NULL, NULL, 0, &err));
        CHECK(kvgen_session_adapters(s, NULL, NULL, 0) == 0);
        CHECK_OK(kvgen_session_prefill(s, prompt, PROMPT, NULL, &err));
        CHECKF(memcmp(kvgen_session_logits(s), lb, (size_t)nv * sizeof *lb) == 0,
               "%s: no adapters after one is not the base model", what);
        kvgen_session_close(s);
    }
    kvgen_adapter_free(a1);
    kvgen_adapter_free(a2);
    kvgen_adapter_free(a16);
    kvgen_adapter_free(ana);
    kvgen_adapter_free(ar1);
    kvgen_adapter_free(abf);
    kvgen_adapter_free(aq8);
    free(lb);
    free(la);
    free(lm);
    kvgen_model_unload(base);
}

/* A fused matrix is adapted through its parts (adapter.c: each part gets A whole and its own
 * rows of B): the adapter's pairs count per part, and the model with it equals the model
 * merged with it, whole matrices and some of them. So does a model whose heads are wider than
 * n_embd / n_head. */
static void test_shape_parity(int bi) {
    kvgen_model *m = load_model(g_phi3, backends[bi]);
    if (!m) return;
    kvgen_adapter *a = load_adapter(m, g_phi3_lora), *q = load_adapter(m, g_phi3_lora_qup);
    kvgen_adapter_info info;
    kvgen_adapter_get_info(a, &info);
    CHECKF(info.n_matrices == N_LAYER * N_TARGETS, "phi3: %d matrices adapted", info.n_matrices);
    kvgen_adapter_get_info(q, &info);
    CHECKF(info.n_matrices == N_LAYER * (3 + 2), "phi3 q,up: %d matrices adapted", info.n_matrices);
    double worst = 0.0;
    float s1 = 1.0f, s2 = 0.7f;
    if (a) worst = fmax(worst, against_merged(bi, g_phi3, m, (const kvgen_adapter *const *)&a,
                                              (const char *const *)&g_phi3_lora, &s1, 1, "phi3"));
    if (q) worst = fmax(worst, against_merged(bi, g_phi3, m, (const kvgen_adapter *const *)&q,
                                              (const char *const *)&g_phi3_lora_qup, &s2, 1, "phi3 q,up"));
    printf("%s: phi3 (fused) adapters vs merged, worst difference %.3g of the logits' range\n", backend_names[bi],
           worst);
    kvgen_adapter_free(a);
    kvgen_adapter_free(q);
    kvgen_model_unload(m);

    /* wide heads: the pairs of attn_q/k/v out and attn_output in are heads x head size wide */
    m = load_model(g_wide, backends[bi]);
    if (!m) return;
    a = load_adapter(m, g_wide_lora);
    if (a) {
        double d = against_merged(bi, g_wide, m, (const kvgen_adapter *const *)&a, (const char *const *)&g_wide_lora,
                                  &s2, 1, "wide heads");
        printf("%s: wide-head adapter vs merged, difference %.3g of the logits' range\n", backend_names[bi], d);
    }
    kvgen_adapter_free(a);
    kvgen_model_unload(m);
}

/* ---- across backends ------------------------------------------------------------------------------ */

/* On quantized weights the cpu backend dots int16 activations (kvg_qdot.h), the reference f32
 * ones: they differ by that rounding. The low-rank product is f32 on both, from the activations
 * each backend has, so an adapter adds no error of its own: with it the two disagree about as
 * much as without it (bound: 3x the base model's disagreement; measured ratio printed). */
static void test_cpu_vs_reference_quantized(void) {
    char *q8 = tu_make_model("lora_q8_base.gguf", "--type Q8_0 " SHAPE);
    if (!q8) return;
    kvgen_model *ref = load_model(q8, KVGEN_BACKEND_REFERENCE), *cpu = load_model(q8, KVGEN_BACKEND_CPU);
    kvgen_adapter *ar = ref ? load_adapter(ref, g_lora) : NULL, *ac = cpu ? load_adapter(cpu, g_lora) : NULL;
    if (ar && ac) {
        kvgen_model_info info;
        kvgen_model_get_info(ref, &info);
        int nv = info.n_vocab;
        size_t rows = (size_t)(1 + STEPS) * (size_t)nv;
        float *r0 = malloc(rows * sizeof *r0), *c0 = malloc(rows * sizeof *c0);
        float *r1 = malloc(rows * sizeof *r1), *c1 = malloc(rows * sizeof *c1);
        int32_t prompt[PROMPT], toks[STEPS] = {-1, -1, -1, -1};
        tu_fill_tokens(prompt, PROMPT, 13, nv);
        float sc = 1.0f;
        run(ref, (const kvgen_adapter *const *)&ar, &sc, 1, prompt, toks, r1, nv);
        run(cpu, (const kvgen_adapter *const *)&ac, &sc, 1, prompt, toks, c1, nv);
        run(ref, NULL, NULL, 0, prompt, toks, r0, nv);
        run(cpu, NULL, NULL, 0, prompt, toks, c0, nv);
        double base = tu_max_diff(r0, c0, (int)rows), with = tu_max_diff(r1, c1, (int)rows);
        double range = max_abs(r1, (int)rows);
        printf("Q8_0 model, cpu vs reference: %.3g without the adapter, %.3g with it (range %.3g)\n", base, with,
               range);
        CHECKF(with <= 3.0 * base + 1e-5 * range, "cpu vs reference on Q8_0 weights: %.3g with the adapter, %.3g "
               "without", with, base);
        CHECK(tu_max_diff(r0, r1, (int)rows) > 10.0 * with); /* the adapter did something */
        free(r0);
        free(c0);
        free(r1);
        free(c1);
    }
    kvgen_adapter_free(ar);
    kvgen_adapter_free(ac);
    kvgen_model_unload(ref);
    kvgen_model_unload(cpu);
    free(q8);
}

/* ---- the prefix cache ---------------------------------------------------------------------------- */

/* Pages are shared only between sessions with the same adapters at the same scales: a session
 * with an adapter takes nothing of the base model's pages; one whose set changed after it
 * filled pages under another never hands those out under its new set; one with the same set
 * takes them, and every session gets the logits of a session that shares nothing. */
static void test_prefix_cache(int bi) {
    enum { LONG = 80, MORE = 20 }; /* pages of 16: the switched session fills a page under its new set */
    const char *what = backend_names[bi];
    kvgen_model_desc md = {.path = g_base, .backend = backends[bi], .n_threads = 2, .kv_pool_tokens = 8192,
                           .kv_page_size = 16};
    kvgen_model *m = tu_load(&md);
    if (!m) return;
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    size_t nv = (size_t)info.n_vocab;
    kvgen_adapter *a = load_adapter(m, g_lora);
    int32_t p[LONG + MORE];
    tu_fill_tokens(p, LONG + MORE, 21, info.n_vocab);
    kvgen_error err = {0};
    kvgen_session *base = NULL, *switched = NULL, *with = NULL, *alone = NULL, *same = NULL, *base2 = NULL;
    kvgen_session_desc sd = {.n_ctx = 256}, lone = {.n_ctx = 256, .no_prefix_reuse = 1};
    float *want = malloc(nv * sizeof *want), *want_base = malloc(nv * sizeof *want_base);
    if (!a || !want || !want_base) goto done;
    const kvgen_adapter *set[1] = {a};
    /* the answer: the adapter's session sharing nothing */
    CHECK_OK(kvgen_session_create(m, &lone, &alone, &err));
    CHECK_OK(kvgen_session_set_adapters(alone, set, NULL, 1, &err));
    CHECK_OK(kvgen_session_prefill(alone, p, LONG + MORE, NULL, &err));
    memcpy(want, kvgen_session_logits(alone), nv * sizeof *want);
    CHECK_OK(kvgen_session_set_adapters(alone, NULL, NULL, 0, &err));
    kvgen_session_reset(alone);
    CHECK_OK(kvgen_session_prefill(alone, p, LONG + MORE, NULL, &err));
    memcpy(want_base, kvgen_session_logits(alone), nv * sizeof *want_base);

    /* the base model's pages of the prompt, and a session that filled pages under the base model,
     * then switched to the adapter and went on (its pages mix both) */
    CHECK_OK(kvgen_session_create(m, &sd, &base, &err));
    CHECK_OK(kvgen_session_prefill(base, p, LONG, NULL, &err));
    CHECK_OK(kvgen_session_create(m, &sd, &switched, &err));
    CHECK_OK(kvgen_session_prefill(switched, p, LONG, NULL, &err));
    CHECK_OK(kvgen_session_set_adapters(switched, set, NULL, 1, &err));
    CHECK_OK(kvgen_session_prefill(switched, p + LONG, MORE, NULL, &err));
    kvgen_session_close(switched);
    switched = NULL;

    kvgen_cache_info ci;
    CHECK_OK(kvgen_session_create(m, &sd, &with, &err));
    CHECK_OK(kvgen_session_set_adapters(with, set, NULL, 1, &err));
    CHECK_OK(kvgen_session_prefill(with, p, LONG + MORE, NULL, &err));
    kvgen_session_cache_info(with, &ci);
    CHECKF(ci.tokens_reused == 0, "%s: a session with an adapter reused %zu tokens of others' pages", what,
           ci.tokens_reused);
    CHECKF(memcmp(kvgen_session_logits(with), want, nv * sizeof *want) == 0, "%s: the adapter's session differs",
           what);
    /* the same adapter at the same scale shares them */
    CHECK_OK(kvgen_session_create(m, &sd, &same, &err));
    CHECK_OK(kvgen_session_set_adapters(same, set, NULL, 1, &err));
    CHECK_OK(kvgen_session_prefill(same, p, LONG + MORE, NULL, &err));
    kvgen_session_cache_info(same, &ci);
    CHECKF(ci.tokens_reused >= 64, "%s: a session with the same adapter reused only %zu tokens", what,
           ci.tokens_reused);
    CHECKF(memcmp(kvgen_session_logits(same), want, nv * sizeof *want) == 0,
           "%s: the session sharing the adapter's pages differs", what);
    /* the base model takes its own pages of the prompt, never the switched session's last ones */
    CHECK_OK(kvgen_session_create(m, &sd, &base2, &err));
    CHECK_OK(kvgen_session_prefill(base2, p, LONG + MORE, NULL, &err));
    kvgen_session_cache_info(base2, &ci);
    CHECKF(ci.tokens_reused >= LONG, "%s: the base model reused only %zu tokens of its own pages", what,
           ci.tokens_reused);
    CHECKF(memcmp(kvgen_session_logits(base2), want_base, nv * sizeof *want_base) == 0,
           "%s: a base session took pages computed under an adapter", what);
done:
    kvgen_session_close(base);
    kvgen_session_close(switched);
    kvgen_session_close(with);
    kvgen_session_close(alone);
    kvgen_session_close(same);
    kvgen_session_close(base2);
    kvgen_adapter_free(a);
    free(want);
    free(want_base);
    kvgen_model_unload(m);
}

/* ---- many sessions' adapters in one batch ------------------------------------------------------- */

/* Sessions with different adapters, one with two and one with none, generate as jobs of the
 * worker, their decodes batched (with an endless job without adapters holding every step's
 * batch open); each ends with the tokens and bit-identical logits of a session alone. */
static void test_mixed_batch(int bi) {
    enum { N = 4, GEN = 8 };
    const char *what = backend_names[bi];
    kvgen_model *m = load_model(g_base, backends[bi]);
    if (!m) return;
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    kvgen_adapter *a1 = load_adapter(m, g_lora), *a2 = load_adapter(m, g_lora2);
    if (!a1 || !a2) goto done;
    const kvgen_adapter *sets[N][2] = {{a1, NULL}, {a2, NULL}, {NULL, NULL}, {a1, a2}};
    const float scales[N][2] = {{1.0f, 0}, {0.6f, 0}, {0, 0}, {0.5f, 2.0f}};
    const size_t n_set[N] = {1, 1, 0, 2};
    kvgen_error err = {0};
    kvgen_session *gate = NULL, *a[N] = {0}, *b[N] = {0};
    kvgen_job *gate_job = NULL, *jobs[N] = {0};
    kvgen_session_desc gsd = {.n_ctx = 64, .on_full = KVGEN_ON_FULL_SHIFT, .keep = 4, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(m, &gsd, &gate, &err));
    int32_t one = 1;
    kvgen_job_desc endless = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = &one, .n_tokens = 1,
                              .gen = {.max_tokens = INT_MAX, .ignore_eog = 1}};
    if (gate) CHECK_OK(kvgen_job_submit(gate, &endless, &gate_job, &err));
    int32_t prompt[PROMPT];
    tu_fill_tokens(prompt, PROMPT, 9, info.n_vocab);
    for (int i = 0; i < N; i++) {
        kvgen_session_desc sd = {.n_ctx = 64, .no_prefix_reuse = 1};
        CHECK_OK(kvgen_session_create(m, &sd, &a[i], &err));
        CHECK_OK(kvgen_session_create(m, &sd, &b[i], &err));
        if (!a[i] || !b[i]) continue;
        CHECK_OK(kvgen_session_set_adapters(a[i], sets[i], scales[i], n_set[i], &err));
        CHECK_OK(kvgen_session_set_adapters(b[i], sets[i], scales[i], n_set[i], &err));
        kvgen_job_desc d = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = prompt, .n_tokens = PROMPT,
                            .gen = {.max_tokens = GEN, .ignore_eog = 1}};
        CHECK_OK(kvgen_job_submit(a[i], &d, &jobs[i], &err));
    }
    for (int i = 0; i < N; i++)
        if (jobs[i]) CHECK(tu_job_wait(jobs[i]));
    kvgen_job_cancel(gate_job);
    if (gate_job) CHECK(tu_job_wait(gate_job));
    for (int i = 0; i < N; i++) {
        if (!a[i] || !b[i]) continue;
        kvgen_job_info ji;
        kvgen_job_get_info(jobs[i], &ji);
        CHECKF(ji.state == KVGEN_JOB_DONE && ji.n_tokens == GEN, "%s job %d: %s (%s)", what, i,
               kvgen_job_state_name(ji.state), ji.error.message);
        CHECK_OK(kvgen_session_prefill(b[i], prompt, PROMPT, NULL, &err));
        kvgen_generate_desc gd = {.max_tokens = GEN, .ignore_eog = 1};
        char text[1024];
        size_t len = 0;
        kvgen_finish fin;
        CHECK_OK(kvgen_generate(b[i], &gd, text, sizeof text, &len, &fin, &err));
        size_t n = kvgen_session_length(a[i]);
        CHECKF(n == PROMPT + GEN && n == kvgen_session_length(b[i]) &&
                   memcmp(kvgen_session_tokens(a[i]), kvgen_session_tokens(b[i]), n * sizeof(int32_t)) == 0,
               "%s session %d: the batched tokens differ from the session's alone", what, i);
        const float *la = kvgen_session_logits(a[i]), *lb = kvgen_session_logits(b[i]);
        CHECKF(la && lb && memcmp(la, lb, (size_t)info.n_vocab * sizeof *la) == 0,
               "%s session %d: the batched logits are not those of the session alone", what, i);
    }
    /* the adapters made a difference, or the comparison says little */
    if (a[0] && a[2])
        CHECKF(memcmp(kvgen_session_logits(a[0]), kvgen_session_logits(a[2]), (size_t)info.n_vocab * sizeof(float)),
               "%s: the adapter changed nothing", what);
    kvgen_jobs_stats st;
    kvgen_jobs_get_stats(m, &st);
    CHECKF(st.max_batch_seen >= N, "%s: the decodes were never batched together (max batch %d)", what,
           st.max_batch_seen);
    kvgen_job_release(gate_job);
    kvgen_session_close(gate);
    for (int i = 0; i < N; i++) {
        kvgen_job_release(jobs[i]);
        kvgen_session_close(a[i]);
        kvgen_session_close(b[i]);
    }
done:
    kvgen_adapter_free(a1);
    kvgen_adapter_free(a2);
    kvgen_model_unload(m);
}

/* ---- forks, refusals, lifetimes ----------------------------------------------------------------- */

static void same_set(kvgen_session *s, const kvgen_adapter *const *want, const float *scales, size_t n,
                     const char *after) {
    const kvgen_adapter *got[KVGEN_MAX_ADAPTERS];
    float sc[KVGEN_MAX_ADAPTERS];
    size_t k = kvgen_session_adapters(s, got, sc, KVGEN_MAX_ADAPTERS);
    bool same = k == n;
    for (size_t i = 0; same && i < n; i++) same = got[i] == want[i] && sc[i] == scales[i];
    CHECKF(same, "after %s: the session runs %zu adapters, not its %zu", after, k, n);
}

static void test_fork_and_refusals(int bi) {
    const char *what = backend_names[bi];
    kvgen_model *m = load_model(g_base, backends[bi]), *other = load_model(g_base, backends[bi]);
    if (!m || !other) goto done_models;
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    kvgen_adapter *a1 = load_adapter(m, g_lora), *a2 = load_adapter(m, g_lora2);
    kvgen_adapter *theirs = load_adapter(other, g_lora);
    kvgen_error err = {0};
    int32_t prompt[PROMPT];
    tu_fill_tokens(prompt, PROMPT, 5, info.n_vocab);
    kvgen_session *s = NULL, *child = NULL, *fresh = NULL;
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    if (!s || !a1 || !a2 || !theirs) goto done;
    const kvgen_adapter *set[2] = {a1, a2};
    const float sc[2] = {0.7f, 0.3f};
    CHECK_OK(kvgen_session_set_adapters(s, set, sc, 2, &err));
    same_set(s, set, sc, 2, "set_adapters");

    /* a fork runs its parent's adapters: the same set, the same logits after the same token */
    CHECK_OK(kvgen_session_prefill(s, prompt, PROMPT, NULL, &err));
    CHECK_OK(kvgen_session_fork(s, &child, &err));
    if (child) {
        same_set(child, set, sc, 2, "fork");
        CHECK_OK(kvgen_session_decode(s, 11, &err));
        CHECK_OK(kvgen_session_decode(child, 11, &err));
        CHECKF(memcmp(kvgen_session_logits(s), kvgen_session_logits(child), (size_t)info.n_vocab * sizeof(float)) ==
                   0, "%s: the fork's logits differ from its parent's", what);
        /* the child's set is its own: changing it leaves the parent's */
        CHECK_OK(kvgen_session_set_adapters(child, NULL, NULL, 0, &err));
        same_set(s, set, sc, 2, "the fork's set_adapters");
    }

    /* refusals change nothing */
    const kvgen_adapter *bad[KVGEN_MAX_ADAPTERS + 1];
    for (int i = 0; i <= KVGEN_MAX_ADAPTERS; i++) bad[i] = a1;
    kvgen_status st = kvgen_session_set_adapters(s, bad, NULL, KVGEN_MAX_ADAPTERS + 1, &err);
    CHECKF(st == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "KVGEN_MAX_ADAPTERS"), "%s: too many: %s", what,
           err.message);
    same_set(s, set, sc, 2, "too many adapters");
    const kvgen_adapter *mixed[2] = {a1, theirs};
    st = kvgen_session_set_adapters(s, mixed, NULL, 2, &err);
    CHECKF(st == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "adapters[1]") && strstr(err.message, "another model"),
           "%s: another model's adapter: %s", what, err.message);
    same_set(s, set, sc, 2, "another model's adapter");
    const float nan_sc[2] = {1.0f, NAN}, inf_sc[2] = {INFINITY, 1.0f};
    st = kvgen_session_set_adapters(s, set, nan_sc, 2, &err);
    CHECKF(st == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "scales[1]"), "%s: NaN scale: %s", what,
           err.message);
    same_set(s, set, sc, 2, "a NaN scale");
    st = kvgen_session_set_adapters(s, set, inf_sc, 2, &err);
    CHECKF(st == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "scales[0]"), "%s: infinite scale: %s", what,
           err.message);
    same_set(s, set, sc, 2, "an infinite scale");
    const kvgen_adapter *holes[2] = {a1, NULL};
    st = kvgen_session_set_adapters(s, holes, NULL, 2, &err);
    CHECKF(st == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "adapters[1]"), "%s: NULL adapter: %s", what,
           err.message);
    same_set(s, set, sc, 2, "a NULL adapter");
    CHECK(kvgen_session_set_adapters(s, NULL, NULL, 1, &err) == KVGEN_E_INVALID_ARGUMENT);
    same_set(s, set, sc, 2, "a NULL list");
    CHECK(kvgen_session_set_adapters(NULL, set, sc, 2, &err) == KVGEN_E_INVALID_ARGUMENT);
    /* and the set still computes what it did: the same logits as a fresh session with it */
    CHECK_OK(kvgen_session_create(m, NULL, &fresh, &err));
    if (fresh) {
        CHECK_OK(kvgen_session_set_adapters(fresh, set, sc, 2, &err));
        CHECK_OK(kvgen_session_prefill(fresh, prompt, PROMPT, NULL, &err));
        CHECK_OK(kvgen_session_decode(fresh, 11, &err));
        CHECKF(memcmp(kvgen_session_logits(s), kvgen_session_logits(fresh), (size_t)info.n_vocab * sizeof(float)) ==
                   0, "%s: after the refusals the session computes otherwise", what);
    }

    /* the session keeps its adapters alive: the handles freed, the model unloaded, it still runs */
    kvgen_adapter_free(a1);
    kvgen_adapter_free(a2);
    a1 = a2 = NULL;
    kvgen_model_unload(m);
    m = NULL;
    CHECK_OK(kvgen_session_decode(s, 12, &err));
    CHECK_OK(kvgen_session_decode(fresh, 12, &err));
    CHECKF(memcmp(kvgen_session_logits(s), kvgen_session_logits(fresh), (size_t)info.n_vocab * sizeof(float)) == 0,
           "%s: with the handles freed the session computes otherwise", what);
done:
    kvgen_session_close(child);
    kvgen_session_close(fresh);
    kvgen_session_close(s);
    kvgen_adapter_free(a1);
    kvgen_adapter_free(a2);
    kvgen_adapter_free(theirs);
done_models:
    kvgen_model_unload(m);
    kvgen_model_unload(other);
}

/* The Vulkan backend runs adapters too (test_vk_lora_model checks its logits against the
 * reference): set_adapters takes them, and a prefill under them runs. */
static void vulkan_body(void *arg) {
    (void)arg;
    kvgen_model *m = load_model(g_base, KVGEN_BACKEND_VULKAN);
    if (!m) return;
    kvgen_adapter *a = load_adapter(m, g_lora);
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    if (s && a) {
        const kvgen_adapter *set[1] = {a};
        CHECK_OK(kvgen_session_set_adapters(s, set, NULL, 1, &err));
        CHECK(kvgen_session_adapters(s, NULL, NULL, 0) == 1);
        const int32_t ids[3] = {1, 2, 3};
        CHECK_OK(kvgen_session_prefill(s, ids, 3, NULL, &err));
        CHECK_OK(kvgen_session_set_adapters(s, NULL, NULL, 0, &err)); /* the base model again */
        CHECK(kvgen_session_adapters(s, NULL, NULL, 0) == 0);
    }
    kvgen_session_close(s);
    kvgen_adapter_free(a);
    kvgen_model_unload(m);
}

/* ---- kvgen-mkmodel --lora ------------------------------------------------------------------------ */

/* the shape of tensor `name` in the file at path is [ne0, ne1]; ne0 0: the file has no such tensor */
static void shape_is(const char *path, const char *name, uint64_t ne0, uint64_t ne1) {
    kvg_gguf *g = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvg_gguf_open(path, &g, &err));
    if (!g) return;
    const kvg_tensor *t = kvg_gguf_find_tensor(g, name);
    if (ne0 == 0) CHECKF(t == NULL, "%s: has %s", path, name);
    else
        CHECKF(t && t->ne[0] == ne0 && t->ne[1] == ne1, "%s: %s is [%llu, %llu], want [%llu, %llu]", path, name,
               t ? (unsigned long long)t->ne[0] : 0ull, t ? (unsigned long long)t->ne[1] : 0ull,
               (unsigned long long)ne0, (unsigned long long)ne1);
    kvg_gguf_close(g);
}

static void test_mkmodel_lora(void) {
    /* the pairs of each target, A [n_in, rank] and B [rank, n_out] */
    shape_is(g_lora, "blk.1.attn_q.weight.lora_a", N_EMBD, 8);
    shape_is(g_lora, "blk.1.attn_k.weight.lora_b", 8, KV_DIM);
    shape_is(g_lora, "blk.0.attn_output.weight.lora_a", N_EMBD, 8);
    shape_is(g_lora, "blk.0.ffn_gate.weight.lora_b", 8, N_FF);
    shape_is(g_lora, "blk.0.ffn_down.weight.lora_a", N_FF, 8);
    shape_is(g_lora2, "blk.0.attn_v.weight.lora_b", 4, KV_DIM);
    shape_is(g_lora2, "blk.0.attn_k.weight.lora_a", 0, 0); /* not a target */
    shape_is(g_lora2, "blk.1.ffn_up.weight.lora_a", 0, 0);
    /* phi3's fused matrices as stored: attn_qkv [D -> D + 2 kv], ffn_up [D -> 2 F] */
    shape_is(g_phi3_lora, "blk.0.attn_qkv.weight.lora_b", 8, N_EMBD + 2 * KV_DIM);
    shape_is(g_phi3_lora, "blk.1.ffn_up.weight.lora_b", 8, 2 * N_FF);
    shape_is(g_phi3_lora, "blk.0.attn_q.weight.lora_a", 0, 0);
    shape_is(g_phi3_lora, "blk.0.ffn_gate.weight.lora_a", 0, 0);
    kvg_gguf *g = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvg_gguf_open(g_lora_na, &g, &err));
    if (g) {
        kvg_str v;
        float alpha = -1.0f;
        CHECK(kvg_gguf_get_str(g, "general.type", &v) && v.len == 7 && memcmp(v.ptr, "adapter", 7) == 0);
        CHECK(kvg_gguf_get_str(g, "adapter.type", &v) && v.len == 4 && memcmp(v.ptr, "lora", 4) == 0);
        CHECK(kvg_gguf_get_str(g, "general.architecture", &v) && v.len == 5 && memcmp(v.ptr, "llama", 5) == 0);
        CHECK(kvg_gguf_get_f32(g, "adapter.lora.alpha", &alpha) && alpha == 0.0f);
        kvg_gguf_close(g);
    }

    /* refusals name the flag and the value */
    char out[4096];
    const struct {
        const char *args, *want;
    } bad[] = {
        {"--lora --lora-rank 0", "--lora-rank needs a positive integer, got '0'"},
        {"--lora --lora-alpha -1", "--lora-alpha needs a number >= 0 (0: no alpha), got '-1'"},
        {"--lora --lora-alpha nan", "--lora-alpha needs a number >= 0"},
        {"--lora --lora-targets q,x", "--lora-targets q,x: 'x' is not one of q,k,v,o,gate,up,down"},
        {"--lora --lora-targets ,", "--lora-targets ,: '' is not one of"},
        {"--lora --lora-type Q4_K", "--lora-type Q4_K: adapters are written as F32, F16, BF16 or Q8_0"},
        {"--lora --lora-type Q9", "--lora-type Q9 is not a type"},
        {"--lora --lora-type Q8_0", "(--lora-rank 8)"}, /* Q8_0 rows are blocks of 32 */
        {"--lora --arch bert", "--lora writes adapters for decoders"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = tu_run_mkmodel("lora-refused.gguf", bad[i].args, out, sizeof out);
        CHECKF(rc != 0 && strstr(out, bad[i].want), "kvgen-mkmodel %s: exit %d, output: %s", bad[i].args, rc, out);
    }
    CHECK(tu_run_mkmodel("lora-refused.gguf", "--help", out, sizeof out) != 0 && strstr(out, "--lora-targets"));
}

int main(void) {
    g_base = tu_make_model("lora_base.gguf", SHAPE);
    g_lora = tu_make_model("lora_f32.gguf", "--lora " SHAPE);
    g_lora16 = tu_make_model("lora_f16.gguf", "--lora --lora-type F16 " SHAPE);
    g_lora_q8 = tu_make_model("lora_q8.gguf", "--lora --lora-type Q8_0 --lora-rank 32 " SHAPE);
    g_lora2 = tu_make_model("lora_2.gguf", "--lora --lora-rank 4 --lora-alpha 2 --lora-targets q,v,down " SHAPE
                            " --seed 23");
    g_lora_na = tu_make_model("lora_na.gguf", "--lora --lora-alpha 0 " SHAPE " --seed 5");
    g_phi3 = tu_make_model("lora_phi3.gguf", PHI3);
    g_phi3_lora = tu_make_model("lora_phi3_a.gguf", "--lora " PHI3);
    g_phi3_lora_qup = tu_make_model("lora_phi3_q.gguf", "--lora --lora-targets q,up " PHI3);
    g_lora_bf = tu_make_model("lora_bf16.gguf", "--lora --lora-type BF16 " SHAPE " --seed 8");
    g_lora_r1 = tu_make_model("lora_r1.gguf", "--lora --lora-rank 1 " SHAPE " --seed 6");
    CHECK(g_base && g_lora && g_lora16 && g_lora_q8 && g_lora2 && g_lora_na && g_lora_r1 && g_lora_bf);
    g_wide = tu_make_model("lora_wide_base.gguf", WIDE);
    g_wide_lora = tu_make_model("lora_wide_a.gguf", "--lora " WIDE);
    CHECK(g_phi3 && g_phi3_lora && g_phi3_lora_qup && g_wide && g_wide_lora);
    if (g_base && g_lora && g_lora16 && g_lora_q8 && g_lora2 && g_lora_na && g_lora_r1 && g_lora_bf) {
        test_good_adapters();
        if (g_phi3_lora) test_mkmodel_lora();
        test_bad_adapters();
        for (int bi = 0; bi < 2; bi++) {
            test_merged_parity(bi);
            if (g_phi3 && g_phi3_lora && g_phi3_lora_qup && g_wide && g_wide_lora) test_shape_parity(bi);
            test_mixed_batch(bi);
            test_prefix_cache(bi);
            test_fork_and_refusals(bi);
        }
        test_cpu_vs_reference_quantized();
        tu_vulkan_child("LoRA adapters", vulkan_body, NULL);
    }
    free(g_base);
    free(g_lora);
    free(g_lora16);
    free(g_lora_q8);
    free(g_lora2);
    free(g_lora_na);
    free(g_lora_r1);
    free(g_lora_bf);
    free(g_phi3);
    free(g_phi3_lora);
    free(g_phi3_lora_qup);
    free(g_wide);
    free(g_wide_lora);
    return tu_finish("test_lora");
}
