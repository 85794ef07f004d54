/* test_vk_embed.c: the encoder (bert) on the Vulkan backend (vk_encode.c) against the reference.
 * Random encoders from kvgen-mkmodel (2 layers, n_embd 64, 4 heads, context 128) in F32, F16 and
 * Q8_0:
 * - the backend's encode op on one batch of texts of different lengths back to back (1 token,
 *   the empty text's [CLS] [SEP], a few words, and texts of 75 and 128 tokens: longer than a
 *   mat-mul tile, an attention workgroup and a lane column): every token's last hidden state
 *   within HIDDEN_TOL of the reference's (LayerNormed states of magnitude about 1), which would
 *   fail were one text to see another (a text run alone gives the same states within it);
 * - kvgen_embed of the same texts (pooled, unit vectors) within EMBED_TOL of the reference;
 * - a batch over several submissions (KVGEN_VK_CHUNK=128: whole texts each) with every matrix
 *   split into 8 KiB parts (KVGEN_VK_MAX_PART), states within HIDDEN_TOL;
 * - refusals: a text longer than the context, a token outside the vocabulary;
 * - the batch under lowered device limits (3 workgroups a dispatch dimension, 128 invocations a
 *   workgroup, the least Vulkan allows), on the lane layout and on the GEMM, every dispatch split as it must be.
 * all-MiniLM-L6-v2 (models/all-MiniLM-L6-v2.gguf; skipped when absent): every text of
 * fixtures/minilm_embed.txt on Vulkan has cosine >= 0.999 with sentence-transformers' embedding,
 * as test_embed_real checks for the host backends.
 * A decoder's hidden states and kvgen_embed on Vulkan against the reference (check_decoder).
 * With KVGEN_VALIDATE=1 the validation layer must stay silent. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_backend.h"
#include "kvg_model.h"
#include "kvg_session.h"
#include "kvg_vk.h"
#include "testutil.h"

/* worst |vulkan - reference| allowed: states and unit vectors (measured on lavapipe, F32, F16 and
 * Q8_0 weights alike: states <= 1.5e-6, vectors <= 1e-7; the device dequantizes each weight as
 * the reference does, and the tolerances leave room for a GPU's other order of sums) */
#define HIDDEN_TOL 1e-4
#define EMBED_TOL 1e-5

static kvgen_model *load(const char *path, kvgen_backend backend) {
    kvgen_model_desc d = {.path = path, .backend = backend, .n_threads = 2};
    return tu_load(&d);
}

static double worst_hidden, worst_embed;

static const char *const TEXTS[] = {
    "",
    "hello world",
    "The blacksmith sells a sword at the shop.",
    "playing with the cat and the dog",
    "x",
};
#define N_TEXTS (sizeof TEXTS / sizeof TEXTS[0])

/* the batch: texts of n_tok[i] tokens back to back (ids in t) */
typedef struct batch {
    int32_t t[1024];
    int n_tok[16];
    int n_seq, total;
} batch;

static void add_ids(batch *b, const int32_t *ids, int n) {
    memcpy(b->t + b->total, ids, (size_t)n * sizeof *ids);
    b->n_tok[b->n_seq++] = n;
    b->total += n;
}

static void add_text(batch *b, kvgen_model *m, const char *text) {
    int32_t ids[512];
    size_t n = 0;
    CHECK_OK(kvgen_tokenize(m, text, strlen(text), KVGEN_TOKENIZE_ADD_BOS, ids, 512, &n, NULL));
    add_ids(b, ids, (int)n);
}

static float *encode(kvgen_model *m, const batch *b, kvgen_status *st, kvgen_error *err) {
    float *h = calloc((size_t)b->total * (size_t)m->w.hp.n_embd + 1, sizeof *h);
    kvg_encode_batch eb = {.tokens = b->t, .n_tokens = b->n_tok, .n_seq = b->n_seq, .hidden = h};
    *st = m->ops->encode(m, &eb, err);
    return h;
}

/* one batch: 1 token, the empty text, words, 75 and n_ctx_train pseudo-random tokens */
static void make_batch(batch *b, kvgen_model *m) {
    int32_t ids[512];
    int V = m->w.hp.n_vocab, ctx = m->w.hp.n_ctx_train;
    ids[0] = 1;
    add_ids(b, ids, 1);
    for (size_t i = 0; i < N_TEXTS; i++) add_text(b, m, TEXTS[i]);
    tu_fill_tokens(ids, 75, 5, V);
    add_ids(b, ids, 75);
    tu_fill_tokens(ids, (size_t)ctx, 6, V);
    add_ids(b, ids, ctx);
}

static void check_model(const char *name, const char *args) {
    char file[64];
    snprintf(file, sizeof file, "vk-embed-%s.gguf", name);
    char *path = tu_make_model(file, args);
    CHECK(path != NULL);
    if (!path) return;
    kvgen_model *mr = load(path, KVGEN_BACKEND_REFERENCE), *mv = load(path, KVGEN_BACKEND_VULKAN);
    CHECK(mr && mv);
    if (!mr || !mv) goto done;
    int D = mr->w.hp.n_embd, V = mr->w.hp.n_vocab, ctx = mr->w.hp.n_ctx_train;
    CHECKF(strcmp(mv->ops->name, "vulkan") == 0, "%s: loaded on %s", name, mv->ops->name);

    batch b = {0};
    int32_t ids[512];
    make_batch(&b, mr);
    kvgen_error err = {0};
    kvgen_status st;
    float *hr = encode(mr, &b, &st, &err);
    CHECKF(st == KVGEN_OK, "%s: reference: %s", name, err.message);
    float *hv = encode(mv, &b, &st, &err);
    CHECKF(st == KVGEN_OK, "%s: vulkan: %s", name, err.message);
    double d = tu_max_diff(hv, hr, b.total * D);
    CHECKF(d <= HIDDEN_TOL, "%s: hidden states differ from the reference by %g (tolerance %g)", name, d, HIDDEN_TOL);
    if (!(d <= worst_hidden)) worst_hidden = d;
    printf("%s: %d texts, %d tokens in one batch: max |hidden - reference| %.3g\n", name, b.n_seq, b.total, d);

    /* the 75-token text alone: the states it has in the batch */
    batch one = {0};
    int at = 0;
    for (int i = 0; i < b.n_seq - 2; i++) at += b.n_tok[i];
    add_ids(&one, b.t + at, 75);
    float *h1 = encode(mv, &one, &st, &err);
    CHECKF(st == KVGEN_OK, "%s: vulkan alone: %s", name, err.message);
    d = tu_max_diff(h1, hv + (size_t)at * D, 75 * D);
    CHECKF(d <= HIDDEN_TOL, "%s: a text alone differs from itself in the batch by %g", name, d);
    free(h1);

    /* refusals */
    batch bad = {0};
    tu_fill_tokens(ids, (size_t)ctx + 1, 7, V);
    add_ids(&bad, ids, ctx + 1);
    free(encode(mv, &bad, &st, &err));
    CHECKF(st == KVGEN_E_INVALID_ARGUMENT, "%s: a text of %d tokens: %d", name, ctx + 1, (int)st);
    batch oov = {0};
    ids[0] = V;
    add_ids(&oov, ids, 1);
    free(encode(mv, &oov, &st, &err));
    CHECKF(st == KVGEN_E_INVALID_ARGUMENT, "%s: token %d: %d", name, V, (int)st);
    free(hr);
    free(hv);

    /* kvgen_embed: pooled unit vectors, a long text among them (cut to the context) */
    char longtext[2048] = "";
    for (int i = 0; i < 40; i++) strcat(longtext, "the blacksmith sells a sword ");
    const char *texts[N_TEXTS + 1];
    for (size_t i = 0; i < N_TEXTS; i++) texts[i] = TEXTS[i];
    texts[N_TEXTS] = longtext;
    size_t n = N_TEXTS + 1;
    float *er = calloc(n * (size_t)D, sizeof *er), *ev = calloc(n * (size_t)D, sizeof *ev);
    CHECK_OK(kvgen_embed(mr, texts, NULL, n, NULL, er, n * (size_t)D, &err));
    CHECK_OK(kvgen_embed(mv, texts, NULL, n, NULL, ev, n * (size_t)D, &err));
    d = tu_max_diff(ev, er, (int)n * D);
    CHECKF(d <= EMBED_TOL, "%s: embeddings differ from the reference by %g (tolerance %g)", name, d, EMBED_TOL);
    if (!(d <= worst_embed)) worst_embed = d;
    printf("%s: kvgen_embed of %zu texts: max |vulkan - reference| %.3g\n", name, n, d);
    free(ev);
    free(er);
    CHECKF(kvg_vk_validation_count(kvg_vk_model_ctx(mv)) == 0, "%s: validation messages", name);
done:
    kvgen_model_unload(mr);
    kvgen_model_unload(mv);
    free(path);
}

/* the batch over several submissions: KVGEN_VK_CHUNK caps one at the context (128 tokens); and
 * every matrix in parts of at most 8 KiB (KVGEN_VK_MAX_PART: biases by global row, the embedding
 * lookup over parts) */
static void check_split(void) {
    char *path = tu_make_model("vk-embed-split.gguf", "--arch bert --layers 2 --embd 64 --ff 128 --heads 4 --ctx 128 "
                                                      "--seed 84");
    CHECK(path != NULL);
    if (!path) return;
    setenv("KVGEN_VK_CHUNK", "128", 1);
    setenv("KVGEN_VK_MAX_PART", "8192", 1);
    kvgen_model *mr = load(path, KVGEN_BACKEND_REFERENCE), *mv = load(path, KVGEN_BACKEND_VULKAN);
    unsetenv("KVGEN_VK_CHUNK");
    unsetenv("KVGEN_VK_MAX_PART");
    CHECK(mr && mv);
    if (mr && mv) {
        int D = mr->w.hp.n_embd, V = mr->w.hp.n_vocab;
        batch b = {0};
        int32_t ids[128];
        int lens[] = {100, 3, 60, 128, 2, 70, 1};
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
            tu_fill_tokens(ids, (size_t)lens[i], 20 + (unsigned)i, V);
            add_ids(&b, ids, lens[i]);
        }
        kvgen_error err = {0};
        kvgen_status st;
        float *hr = encode(mr, &b, &st, &err);
        CHECK(st == KVGEN_OK);
        float *hv = encode(mv, &b, &st, &err);
        CHECKF(st == KVGEN_OK, "split: %s", err.message);
        double d = tu_max_diff(hv, hr, b.total * D);
        CHECKF(d <= HIDDEN_TOL, "split: hidden states differ from the reference by %g", d);
        if (!(d <= worst_hidden)) worst_hidden = d;
        printf("split: %d tokens over submissions of <= 128, matrices in 8 KiB parts: max |hidden - reference| %.3g\n",
               b.total, d);
        free(hr);
        free(hv);
        kvg_vk_part_info parts[64];
        int n_parts = kvg_vk_model_parts(mv, 0, "token_embd", parts, 64);
        CHECKF(n_parts > 1, "split: the embedding in %d parts", n_parts);
        CHECK(kvg_vk_validation_count(kvg_vk_model_ctx(mv)) == 0);
    }
    kvgen_model_unload(mr);
    kvgen_model_unload(mv);
    free(path);
}

/* The device's compute limits lowered (KVGEN_VK_MAX_*, docs/vulkan.md): at most 3 workgroups
 * per dispatch dimension (every dispatch of more is split into pieces), 128 invocations a
 * workgroup, 16 KiB of shared memory; on the lane layout lavapipe chooses, then on the GEMM
 * and the cooperative mat-vec (KVGEN_VK_LANE=0). */
static void check_limits(void) {
    char *path = tu_make_model("vk-embed-limits.gguf", "--arch bert --layers 2 --embd 64 --ff 128 --heads 4 "
                                                       "--ctx 128 --seed 85");
    CHECK(path != NULL);
    if (!path) return;
    kvgen_model *mr = load(path, KVGEN_BACKEND_REFERENCE);
    setenv("KVGEN_VK_MAX_GROUP_COUNT", "3", 1);
    setenv("KVGEN_VK_MAX_SHARED", "16384", 1);
    setenv("KVGEN_VK_MAX_INVOCATIONS", "128", 1);
    for (int lane = 1; lane >= 0 && mr; lane--) {
        if (!lane) setenv("KVGEN_VK_LANE", "0", 1);
        kvgen_model *mv = load(path, KVGEN_BACKEND_VULKAN);
        kvg_vk_ctx *ctx = kvg_vk_model_ctx(mv);
        CHECK(ctx != NULL);
        if (ctx) {
            batch b = {0};
            make_batch(&b, mr);
            kvgen_error err = {0};
            kvgen_status st;
            float *hr = encode(mr, &b, &st, &err);
            float *hv = encode(mv, &b, &st, &err);
            CHECKF(st == KVGEN_OK, "limits: %s", err.message);
            double d = tu_max_diff(hv, hr, b.total * mr->w.hp.n_embd);
            CHECKF(d <= HIDDEN_TOL, "limits, lane %d: hidden states differ from the reference by %g", lane, d);
            if (!(d <= worst_hidden)) worst_hidden = d;
            CHECKF(atomic_load(&ctx->split_dispatches) > 0, "limits, lane %d: no dispatch was split", lane);
            int gemm = 0;
            for (int p = 0; p < ctx->n_pipes; p++) gemm += strncmp(ctx->pipes[p].name, "gemm_", 5) == 0;
            CHECKF(lane || gemm > 0, "limits: the GEMM was not used");
            printf("limits (3 groups a dimension, 128 invocations), %s: max |hidden - reference| %.3g\n",
                   lane ? "lane layout" : "GEMM", d);
            CHECK(kvg_vk_validation_count(ctx) == 0);
            free(hr);
            free(hv);
        }
        kvgen_model_unload(mv);
    }
    unsetenv("KVGEN_VK_MAX_GROUP_COUNT");
    unsetenv("KVGEN_VK_MAX_SHARED");
    unsetenv("KVGEN_VK_MAX_INVOCATIONS");
    unsetenv("KVGEN_VK_LANE");
    kvgen_model_unload(mr);
    free(path);
}

/* ---- all-MiniLM-L6-v2 against sentence-transformers (fixtures/minilm_embed.txt) ---- */

#define MAX_CASES 512

static void minilm(void) {
    char *path = tu_model_file("all-MiniLM-L6-v2.gguf");
    if (!path) {
        printf("all-MiniLM-L6-v2: skipped (models/all-MiniLM-L6-v2.gguf absent)\n");
        return;
    }
    kvgen_model *m = load(path, KVGEN_BACKEND_VULKAN);
    free(path);
    if (!m) return;
    static char *text[MAX_CASES], *data[MAX_CASES];
    static size_t len[MAX_CASES];
    int n = 0;
    FILE *in = tu_open_fixture("minilm_embed.txt");
    size_t cap = 1 << 20;
    char *line = malloc(cap);
    while (in && fgets(line, (int)cap, in) && n < MAX_CASES) {
        line[strcspn(line, "\n")] = 0;
        if (line[0] == 'T' && line[1] == ' ') { /* hex bytes */
            size_t k = strlen(line + 2) / 2;
            text[n] = malloc(k + 1);
            for (size_t i = 0; i < k; i++) {
                unsigned v = 0;
                sscanf(line + 2 + 2 * i, "%2x", &v);
                text[n][i] = (char)v;
            }
            text[n][k] = 0;
            len[n] = k;
        } else if (line[0] == 'E' && line[1] == ' ') {
            data[n++] = strdup(line + 2);
        }
    }
    if (in) fclose(in);
    free(line);
    CHECK(n >= 50);
    int D = m->w.hp.n_embd;
    float *v = calloc((size_t)n * (size_t)D, sizeof *v);
    kvgen_error err = {0};
    CHECK_OK(kvgen_embed(m, (const char *const *)text, len, (size_t)n, NULL, v, (size_t)n * (size_t)D, &err));
    double worst = 1.0;
    int at = -1;
    for (int i = 0; i < n; i++) {
        double ab = 0, aa = 0, bb = 0;
        char *p = data[i];
        for (int k = 0; k < D; k++) {
            double o = strtod(p, &p), x = v[(size_t)i * D + k];
            ab += o * x;
            aa += o * o;
            bb += x * x;
        }
        double c = ab / sqrt(aa * bb);
        if (!(c >= worst)) worst = c, at = i;
    }
    CHECKF(worst >= 0.999, "all-MiniLM-L6-v2 on vulkan: text %d has cosine %.6f with the oracle", at, worst);
    printf("all-MiniLM-L6-v2 on vulkan: %d texts, worst cosine with sentence-transformers %.8f (1 - %.2g, text %d)\n",
           n, worst, 1.0 - worst, at);
    CHECK(kvg_vk_validation_count(kvg_vk_model_ctx(m)) == 0);
    for (int i = 0; i < n; i++) free(text[i]), free(data[i]);
    free(v);
    kvgen_model_unload(m);
}

/* A decoder's hidden states (kvg_session_hidden, kvgen_embed's path for decoders): every token's
 * output-normed state on Vulkan (rms_norm.comp's final norm, through the logits buffer) within
 * DECODER_TOL x (1 + max |state|) of the reference's, over several prefill steps (chunks of 16),
 * and the pooled vectors of kvgen_embed within cosine 0.9999. The decoders: llama, gemma3 (head
 * norms, post norms, a sliding window, the embedding scale) and a vocabulary smaller than n_embd
 * (273 < 512: the logits buffer holds fewer tokens' states than a chunk, so steps of 8). */
#define DECODER_TOL 1e-3 /* measured on lavapipe: up to 0.49 of it, the f16 K/V cache rounded after other sums */
static double worst_decoder;
static void check_decoder(const char *name, const char *args) {
    char file[64];
    snprintf(file, sizeof file, "vk-embed-%s.gguf", name);
    char *path = tu_make_model(file, args);
    CHECK(path != NULL);
    if (!path) return;
    setenv("KVGEN_VK_CHUNK", "16", 1);
    kvgen_model *ref = load(path, KVGEN_BACKEND_REFERENCE), *vk = load(path, KVGEN_BACKEND_VULKAN);
    unsetenv("KVGEN_VK_CHUNK");
    CHECK(ref && vk);
    if (ref && vk) {
        kvgen_model_info info;
        kvgen_model_get_info(ref, &info);
        enum { N = 40 };
        size_t D = (size_t)info.n_embd;
        int32_t ids[N];
        tu_fill_tokens(ids, N, 5u, info.n_vocab);
        float *h[2] = {malloc(N * D * sizeof(float)), malloc(N * D * sizeof(float))};
        kvgen_model *ms[2] = {ref, vk};
        kvgen_error err = {0};
        for (int i = 0; i < 2; i++) {
            kvgen_session_desc sd = {.n_ctx = 64};
            kvgen_session *s = NULL;
            CHECK_OK(kvgen_session_create(ms[i], &sd, &s, &err));
            if (s && h[i]) CHECK_OK(kvg_session_hidden(s, ids, N, h[i], &err));
            kvgen_session_close(s);
        }
        double big = 0, diff = 0;
        for (size_t k = 0; h[0] && h[1] && k < N * D; k++) {
            big = fmax(big, fabs(h[0][k]));
            diff = fmax(diff, fabs((double)h[0][k] - h[1][k]));
        }
        double e = diff / (DECODER_TOL * (1 + big));
        CHECKF(e <= 1 && big > 0, "%s: hidden states differ by %g (max |state| %g: %.3g x the tolerance)", name, diff,
               big, e);
        worst_decoder = fmax(worst_decoder, e);
        /* the pooled vectors */
        const char *texts[] = {"the world", "hello there, the end"};
        float v[2][2 * 512];
        CHECK(D <= 512);
        if (D <= 512) {
            CHECK_OK(kvgen_embed(ref, texts, NULL, 2, NULL, v[0], 2 * D, &err));
            CHECK_OK(kvgen_embed(vk, texts, NULL, 2, NULL, v[1], 2 * D, &err));
            for (int t = 0; t < 2; t++) {
                double dot = 0;
                for (size_t k = 0; k < D; k++) dot += (double)v[0][t * D + k] * v[1][t * D + k];
                CHECKF(dot >= 0.9999, "%s: text %d: cosine %g to the reference", name, t, dot);
            }
        }
        printf("decoder %s: hidden states %.3g x the tolerance\n", name, e);
        free(h[0]);
        free(h[1]);
        CHECKF(kvg_vk_validation_count(kvg_vk_model_ctx(vk)) == 0, "%s: validation messages", name);
    }
    kvgen_model_unload(ref);
    kvgen_model_unload(vk);
    free(path);
}

int main(void) {
    int n_dev = 0;
    kvgen_error err = {0};
    if (kvgen_devices(NULL, 0, &n_dev, &err) != KVGEN_OK || n_dev == 0) tu_skip("no Vulkan device");
    const char *base = "--arch bert --layers 2 --embd 64 --ff 128 --heads 4 --ctx 128";
    const char *types[][2] = {{"f32", "--type F32 --seed 81"}, {"f16", "--type F16 --seed 82"},
                              {"q8_0", "--type Q8_0 --seed 83"}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char args[256];
        snprintf(args, sizeof args, "%s %s", base, types[i][1]);
        check_model(types[i][0], args);
    }
    check_split();
    check_limits();
    minilm();
    check_decoder("llama", "--layers 2 --seed 91");
    check_decoder("gemma3", "--arch gemma3 --qk-norm --post-norms --swa 8 --layers 3 --embd 64 --heads 4 "
                            "--kv-heads 1 --head-dim 32 --ff 96 --seed 92");
    check_decoder("small-vocab", "--layers 2 --embd 512 --heads 8 --ff 512 --vocab-size 273 --seed 93");
    printf("worst: hidden states %.3g (tolerance %g), embeddings %.3g (tolerance %g)\n", worst_hidden, HIDDEN_TOL,
           worst_embed, EMBED_TOL);
    return tu_finish("test_vk_embed");
}
