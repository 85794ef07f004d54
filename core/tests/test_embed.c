/* test_embed.c: the bert architecture and kvgen_embed on random encoders from kvgen-mkmodel:
 * the WordPiece tokenizer on the synthetic vocabulary, the cpu backend against the reference
 * (F32 weights: max |difference| of unit vectors <= 1e-4, the products being f32 on both; Q8_0:
 * cosine >= 0.999, the cpu backend quantizing activations), a text alone against the same text
 * in a batch (the same bits on the reference), pooling and normalization, truncation, NUL
 * bytes, a file without pooling metadata, every refusal (bad arguments, a session on an
 * encoder), calls on one model from several threads at once (the bits of the same calls one
 * after another: one call at a time uses the activations kept with the model, the others their
 * own), a batch too large for the kept activations (a buffer of its own, against the reference),
 * and a decoder's embedding (its last hidden state is what its logits are made of). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_gguf.h"
#include "kvg_platform.h"
#include "kvg_types.h"
#include "kvgen.h"
#include "testutil.h"

static kvgen_model *load(const char *path, kvgen_backend backend) {
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    kvgen_model_desc d = {.path = path, .backend = backend, .n_threads = 2};
    if (kvgen_model_load(&d, &m, &err) != KVGEN_OK) fprintf(stderr, "load %s: %s\n", path, err.message);
    return m;
}

static double cosine(const float *a, const float *b, int n) {
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    return ab / sqrt(aa * bb);
}

static double norm(const float *a, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * a[i];
    return sqrt(s);
}

/* the tokens of text, as piece texts joined by '|' (control tokens by name) */
static void pieces(kvgen_model *m, const char *text, char *out, size_t size) {
    int32_t ids[256];
    size_t n = 0;
    out[0] = 0;
    if (kvgen_tokenize(m, text, strlen(text), KVGEN_TOKENIZE_ADD_BOS, ids, 256, &n, NULL) != KVGEN_OK) {
        snprintf(out, size, "(error)");
        return;
    }
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        char p[64];
        size_t k = kvgen_token_piece(m, ids[i], KVGEN_TOKENIZE_SPECIAL, p, sizeof p);
        if (k >= sizeof p) k = sizeof p - 1;
        p[k] = 0;
        len += (size_t)snprintf(out + len, len < size ? size - len : 0, "%s%s", i ? "|" : "", p);
    }
}

static void test_wordpiece(kvgen_model *m) {
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    CHECK(info.tokenizer == KVGEN_TOKENIZER_WPM && strcmp(info.architecture, "bert") == 0);
    char desc[4096];
    kvgen_model_describe(m, desc, sizeof desc);
    CHECKF(strstr(desc, "encoder:         bidirectional") && strstr(desc, "pooling mean") && !strstr(desc, "rope_freq_base"),
           "%s", desc);
    struct { const char *text, *want; } cases[] = {
        {"", "[CLS]|[SEP]"},
        {"Hello, world!", "[CLS]| hello| ,| world| !|[SEP]"},
        {"H\xC3\xA9llo  WORLD", "[CLS]| hello| world|[SEP]"},      /* accents stripped, lower-cased */
        {"playing swords", "[CLS]| play|ing| sword|s|[SEP]"},      /* longest piece first, continuations */
        {"xyz", "[CLS]| x|y|z|[SEP]"},
        {"a\xE4\xB8\xAD" "b", "[CLS]| a|[UNK]| b|[SEP]"},           /* a CJK ideograph is a word of its own */
        {"tab\there\nnew\x01line", "[CLS]| t|a|b| h|er|e| n|e|w|l|i|n|e|[SEP]"}, /* control dropped */
        {"snow\xE2\x98\x83man", "[CLS]|[UNK]|[SEP]"},                /* a word with a piece-less part */
        {"3.14", "[CLS]| 3| .| 1|4|[SEP]"},
    };
    char got[1024];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pieces(m, cases[i].text, got, sizeof got);
        CHECKF(strcmp(got, cases[i].want) == 0, "%s: got %s, want %s", cases[i].text, got, cases[i].want);
    }
    /* a word of more than 100 characters is [UNK] */
    char longword[130];
    memset(longword, 'a', 101);
    longword[101] = 0;
    pieces(m, longword, got, sizeof got);
    CHECKF(strcmp(got, "[CLS]|[UNK]|[SEP]") == 0, "%s", got);
}

/* every text alone and all in one batch; returns the batch's vectors (n x D, malloc'd) */
static float *embed_all(kvgen_model *m, const char *const *texts, size_t n, const kvgen_embed_desc *d, int D) {
    float *v = calloc(n * (size_t)D, sizeof *v);
    kvgen_error err = {0};
    kvgen_status st = kvgen_embed(m, texts, NULL, n, d, v, n * (size_t)D, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    return v;
}

static const char *const TEXTS[] = {
    "",
    "hello world",
    "The blacksmith sells a sword at the shop.",
    "playing with the cat and the dog",
    "memory of the world, 1234!",
    "x",
};
#define N_TEXTS (sizeof TEXTS / sizeof TEXTS[0])

static void test_backends(const char *path, double tol, bool by_cosine) {
    kvgen_model *ref = load(path, KVGEN_BACKEND_REFERENCE), *cpu = load(path, KVGEN_BACKEND_CPU);
    CHECK(ref && cpu);
    if (!ref || !cpu) {
        kvgen_model_unload(ref);
        kvgen_model_unload(cpu);
        return;
    }
    kvgen_model_info info;
    kvgen_model_get_info(ref, &info);
    int D = info.n_embd;
    float *a = embed_all(ref, TEXTS, N_TEXTS, NULL, D), *b = embed_all(cpu, TEXTS, N_TEXTS, NULL, D);
    double worst = by_cosine ? 1.0 : 0.0;
    for (size_t i = 0; i < N_TEXTS; i++) {
        const float *x = a + i * D, *y = b + i * D;
        CHECKF(fabs(norm(x, D) - 1.0) < 1e-5, "text %zu: norm %g", i, norm(x, D));
        if (by_cosine) {
            double c = cosine(x, y, D);
            if (c < worst) worst = c;
        } else {
            for (int k = 0; k < D; k++)
                if (fabs(x[k] - y[k]) > worst) worst = fabs(x[k] - y[k]);
        }
    }
    CHECKF(by_cosine ? worst >= tol : worst <= tol, "%s: cpu against reference: %s %g (tolerance %g)", path,
           by_cosine ? "worst cosine" : "max |difference|", worst, tol);
    printf("%s: cpu against reference, %s %.7g\n", path, by_cosine ? "worst cosine" : "max |difference|", worst);
    /* each text alone gives the bits it gives in the batch (the reference) */
    for (size_t i = 0; i < N_TEXTS; i++) {
        float *one = embed_all(ref, &TEXTS[i], 1, NULL, D);
        CHECKF(memcmp(one, a + i * D, (size_t)D * sizeof(float)) == 0, "text %zu alone differs from in the batch", i);
        free(one);
    }
    /* different texts, different vectors */
    CHECK(cosine(a + 1 * D, a + 2 * D, D) < 0.9999);
    free(a);
    free(b);
    kvgen_model_unload(ref);
    kvgen_model_unload(cpu);
}

/* A batch whose activations pass what the cpu backend keeps with the model (8 MiB): the call
 * takes a buffer of its own. 96 texts cut to the model's 64 tokens on a model of width 256
 * (feed-forward 1024): forwards of up to 2,048 tokens of (4 x 256 + 256 + 1024) floats each,
 * about 18 MiB.
 * Its vectors match the reference, the same call twice gives the same bits, and a small call
 * after it still gives its earlier bits (the kept buffer). */
#define BIG_TEXTS 96
static void test_large_batch(const char *path, double tol) {
    kvgen_model *ref = load(path, KVGEN_BACKEND_REFERENCE), *cpu = load(path, KVGEN_BACKEND_CPU);
    CHECK(ref && cpu);
    char *buf = malloc(BIG_TEXTS * 400);
    const char *texts[BIG_TEXTS];
    if (ref && cpu && buf) {
        for (int i = 0; i < BIG_TEXTS; i++) {
            char *t = buf + (size_t)i * 400;
            int n = snprintf(t, 400, "%c%c %c ", 'a' + i % 26, 'a' + i / 26 % 26, 'z' - i % 7);
            for (; n < 399; n++) t[n] = "ab c"[n % 4];
            t[399] = 0;
            texts[i] = t;
        }
        kvgen_model_info info;
        kvgen_model_get_info(ref, &info);
        int D = info.n_embd;
        float *small0 = embed_all(cpu, TEXTS, N_TEXTS, NULL, D);
        float *a = embed_all(ref, texts, BIG_TEXTS, NULL, D), *b = embed_all(cpu, texts, BIG_TEXTS, NULL, D);
        float *b2 = embed_all(cpu, texts, BIG_TEXTS, NULL, D), *small1 = embed_all(cpu, TEXTS, N_TEXTS, NULL, D);
        double worst = 0;
        for (size_t k = 0; k < (size_t)BIG_TEXTS * D; k++)
            if (fabs(a[k] - b[k]) > worst) worst = fabs(a[k] - b[k]);
        CHECKF(worst <= tol, "%s: a %d-text batch, cpu against reference: max |difference| %g (tolerance %g)", path,
               BIG_TEXTS, worst, tol);
        CHECK(memcmp(b, b2, (size_t)BIG_TEXTS * D * sizeof *b) == 0);
        CHECK(memcmp(small0, small1, N_TEXTS * (size_t)D * sizeof *b) == 0);
        CHECK(cosine(b, b + D, D) < 0.9999); /* the texts differ, and so do their vectors */
        printf("%s: a %d-text batch on the cpu backend, max |difference| to the reference %.3g\n", path, BIG_TEXTS,
               worst);
        free(small0);
        free(small1);
        free(a);
        free(b);
        free(b2);
    }
    free(buf);
    kvgen_model_unload(ref);
    kvgen_model_unload(cpu);
}

/* ---- calls from several threads on one model ---- */

#define CONCURRENT_THREADS 4
#define CONCURRENT_ROUNDS 40

typedef struct concurrent_arg {
    kvgen_model *m;
    int D, id;
    const float *alone; /* [N_TEXTS][D]: each text in a call of its own */
    const float *all;   /* [N_TEXTS][D]: every text in one call */
    int failures;
} concurrent_arg;

static void *concurrent_main(void *p) {
    concurrent_arg *c = p;
    size_t D = (size_t)c->D;
    float *v = malloc(N_TEXTS * D * sizeof *v);
    for (int r = 0; v && r < CONCURRENT_ROUNDS; r++) {
        size_t i = (size_t)(r + c->id) % N_TEXTS;
        bool batch = (r + c->id) % 3 == 0; /* calls of different sizes: the kept buffer grows while others use theirs */
        kvgen_error err = {0};
        kvgen_status st = batch ? kvgen_embed(c->m, TEXTS, NULL, N_TEXTS, NULL, v, N_TEXTS * D, &err)
                                : kvgen_embed(c->m, &TEXTS[i], NULL, 1, NULL, v, D, &err);
        if (st != KVGEN_OK ||
            memcmp(v, batch ? c->all : c->alone + i * D, (batch ? N_TEXTS : 1) * D * sizeof *v) != 0)
            c->failures++;
    }
    if (!v) c->failures++;
    free(v);
    return NULL;
}

static void test_concurrent(const char *path, kvgen_backend backend) {
    kvgen_model *m = load(path, backend);
    CHECK(m != NULL);
    if (!m) return;
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    int D = info.n_embd;
    float *all = embed_all(m, TEXTS, N_TEXTS, NULL, D), *alone = calloc(N_TEXTS * (size_t)D, sizeof *alone);
    for (size_t i = 0; alone && i < N_TEXTS; i++) {
        float *one = embed_all(m, &TEXTS[i], 1, NULL, D);
        memcpy(alone + i * (size_t)D, one, (size_t)D * sizeof *one);
        free(one);
    }
    kvg_thread th[CONCURRENT_THREADS];
    concurrent_arg args[CONCURRENT_THREADS];
    int started = 0;
    for (int t = 0; alone && t < CONCURRENT_THREADS; t++) {
        args[t] = (concurrent_arg){.m = m, .D = D, .id = t, .alone = alone, .all = all};
        if (kvg_thread_create(&th[t], concurrent_main, &args[t]) == 0) started++;
        else break;
    }
    CHECK(started == CONCURRENT_THREADS);
    int failures = 0;
    for (int t = 0; t < started; t++) {
        kvg_thread_join(&th[t]);
        failures += args[t].failures;
    }
    CHECKF(failures == 0, "%s (%s backend): %d of %d calls from %d threads at once differ from the same calls in turn",
           path, backend == KVGEN_BACKEND_CPU ? "cpu" : "reference", failures, started * CONCURRENT_ROUNDS, started);
    free(all);
    free(alone);
    kvgen_model_unload(m);
}

static void test_inputs(const char *path, const char *nopool_path) {
    kvgen_model *m = load(path, KVGEN_BACKEND_REFERENCE);
    CHECK(m != NULL);
    if (!m) return;
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    int D = info.n_embd;
    kvgen_error err = {0};
    float *v = calloc(4 * (size_t)D, sizeof *v), *w = calloc(4 * (size_t)D, sizeof *w);

    /* NUL bytes are dropped as control characters: "ca\0t" is "cat" */
    const char *nul[] = {"ca\0t", "cat"};
    size_t lens[] = {4, 3};
    CHECK_OK(kvgen_embed(m, nul, lens, 2, NULL, v, 2 * (size_t)D, &err));
    CHECK(memcmp(v, v + D, (size_t)D * sizeof(float)) == 0);

    /* a 100,000-character text is cut to the model's length: the same vector as any other text
     * whose first n_ctx_train - 1 tokens are the same */
    size_t big = 100000;
    char *t1 = malloc(big + 1), *t2 = malloc(big + 1);
    for (size_t i = 0; i < big; i++) t1[i] = "ab c"[i % 4];
    t1[big] = 0;
    memcpy(t2, t1, big + 1);
    memcpy(t2 + big - 10, " zzz zzz z", 10); /* differs far past the cut */
    const char *bigs[] = {t1, t2};
    CHECK_OK(kvgen_embed(m, bigs, NULL, 2, NULL, v, 2 * (size_t)D, &err));
    CHECK(memcmp(v, v + D, (size_t)D * sizeof(float)) == 0 && isfinite(v[0]));
    /* max_tokens cuts shorter: two texts equal on their first 3 tokens ([CLS] a b) then differ */
    const char *pre[] = {"a b c d", "a b x y"};
    kvgen_embed_desc cut = {.max_tokens = 4};
    CHECK_OK(kvgen_embed(m, pre, NULL, 2, &cut, v, 2 * (size_t)D, &err));
    CHECK(memcmp(v, v + D, (size_t)D * sizeof(float)) == 0);
    CHECK_OK(kvgen_embed(m, pre, NULL, 2, NULL, v, 2 * (size_t)D, &err));
    CHECK(memcmp(v, v + D, (size_t)D * sizeof(float)) != 0);
    free(t1);
    free(t2);

    /* pooling: the file says mean; cls and last differ from it; no_normalize keeps the direction */
    const char *one[] = {"hello world"};
    kvgen_embed_desc mean = {.pooling = KVGEN_POOLING_MEAN}, cls = {.pooling = KVGEN_POOLING_CLS},
                     raw = {.no_normalize = 1};
    CHECK_OK(kvgen_embed(m, one, NULL, 1, NULL, v, (size_t)D, &err));
    CHECK_OK(kvgen_embed(m, one, NULL, 1, &mean, w, (size_t)D, &err));
    CHECK(memcmp(v, w, (size_t)D * sizeof(float)) == 0);
    CHECK_OK(kvgen_embed(m, one, NULL, 1, &cls, w, (size_t)D, &err));
    CHECK(cosine(v, w, D) < 0.9999);
    CHECK_OK(kvgen_embed(m, one, NULL, 1, &raw, w, (size_t)D, &err));
    CHECKF(fabs(norm(w, D) - 1.0) > 1e-3 && cosine(v, w, D) > 0.99999, "raw norm %g", norm(w, D));

    /* refusals, each naming what is wrong */
    CHECK(kvgen_embed(NULL, one, NULL, 1, NULL, v, (size_t)D, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_embed(m, NULL, NULL, 1, NULL, v, (size_t)D, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "texts is NULL"));
    CHECK(kvgen_embed(m, one, NULL, 1, NULL, v, (size_t)D - 1, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "out holds"));
    kvgen_embed_desc bad = {.pooling = (kvgen_pooling)7};
    CHECK(kvgen_embed(m, one, NULL, 1, &bad, v, (size_t)D, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "pooling 7"));
    const char *null_text[] = {"a", NULL};
    CHECK(kvgen_embed(m, null_text, NULL, 2, NULL, v, 2 * (size_t)D, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "text 1 is NULL"));
    CHECK_OK(kvgen_embed(m, one, NULL, 0, NULL, NULL, 0, &err)); /* nothing to do */
    kvgen_session *s = NULL;
    CHECK(kvgen_session_create(m, NULL, &s, &err) == KVGEN_E_UNSUPPORTED && strstr(err.message, "encoder") && !s);
    kvgen_model_unload(m);

    /* no pooling_type in the file: mean, the encoder's default */
    kvgen_model *np = load(nopool_path, KVGEN_BACKEND_REFERENCE), *p = load(path, KVGEN_BACKEND_REFERENCE);
    CHECK(np && p);
    if (np && p) {
        CHECK_OK(kvgen_embed(np, one, NULL, 1, NULL, v, (size_t)D, &err));
        CHECK_OK(kvgen_embed(p, one, NULL, 1, &mean, w, (size_t)D, &err));
        CHECK(memcmp(v, w, (size_t)D * sizeof(float)) == 0);
    }
    kvgen_model_unload(np);
    kvgen_model_unload(p);
    free(v);
    free(w);
}

/* A decoder: each text's final hidden states (after the output norm) pooled. Unnormalized with
 * last-token pooling, the vector is what the logits are made from: logits[v] = token_embd[v] . h
 * (tied, F32), against a session's prefill; cpu against reference; default pooling is last;
 * an empty text without BOS is refused by index. */
static void test_decoder(void) {
    char *path = tu_make_model("e-llama.gguf", "--layers 2");
    kvgen_model *ref = path ? load(path, KVGEN_BACKEND_REFERENCE) : NULL, *cpu = path ? load(path, KVGEN_BACKEND_CPU) : NULL;
    CHECK(ref && cpu);
    if (ref && cpu) {
        kvgen_model_info info;
        kvgen_model_get_info(ref, &info);
        int D = info.n_embd, V = info.n_vocab;
        kvgen_error err = {0};
        const char *texts[] = {"the world", "hello there, the end"};
        float h[2 * 64], c[2 * 64], lastn[2 * 64];
        kvgen_embed_desc raw = {.pooling = KVGEN_POOLING_LAST, .no_normalize = 1}, last = {.pooling = KVGEN_POOLING_LAST};
        CHECK(D == 64);
        CHECK_OK(kvgen_embed(ref, texts, NULL, 2, &raw, h, 128, &err));
        /* the prefill's last logits against token_embd . h */
        int32_t ids[64];
        size_t n = 0;
        CHECK_OK(kvgen_tokenize(ref, texts[1], strlen(texts[1]), KVGEN_TOKENIZE_ADD_BOS, ids, 64, &n, NULL));
        kvgen_session *s = NULL;
        float *logits = malloc((size_t)V * n * sizeof *logits);
        CHECK_OK(kvgen_session_create(ref, NULL, &s, NULL));
        if (s) CHECK_OK(kvgen_session_prefill(s, ids, n, logits, NULL));
        kvgen_session_close(s);
        kvg_gguf *g = NULL;
        CHECK_OK(kvg_gguf_open(path, &g, NULL));
        const kvg_tensor *te = g ? kvg_gguf_find_tensor(g, "token_embd.weight") : NULL;
        CHECK(te && te->type == KVG_TYPE_F32);
        double worst = 0;
        for (int v = 0; te && v < V; v++) {
            const float *row = (const float *)te->data + (size_t)v * D;
            double dot = 0;
            for (int k = 0; k < D; k++) dot += (double)row[k] * h[D + k];
            worst = fmax(worst, fabs(dot - logits[(n - 1) * (size_t)V + v]));
        }
        CHECKF(worst < 1e-3, "token_embd . h differs from the logits by %g", worst);
        printf("decoder: last hidden state against the logits, max |difference| %.3g\n", worst);
        kvg_gguf_close(g);
        free(logits);
        /* the default is last-token pooling, normalized; cpu agrees with the reference */
        CHECK_OK(kvgen_embed(ref, texts, NULL, 2, NULL, lastn, 128, &err));
        CHECK_OK(kvgen_embed(ref, texts, NULL, 2, &last, c, 128, &err));
        CHECK(memcmp(lastn, c, sizeof c) == 0 && fabs(norm(lastn, D) - 1.0) < 1e-5);
        CHECK_OK(kvgen_embed(cpu, texts, NULL, 2, NULL, c, 128, &err));
        for (int i = 0; i < 2; i++)
            CHECKF(cosine(lastn + i * D, c + i * D, D) > 0.999, "text %d: cpu cosine %g", i,
                   cosine(lastn + i * D, c + i * D, D));
        kvgen_embed_desc mean = {.pooling = KVGEN_POOLING_MEAN};
        CHECK_OK(kvgen_embed(ref, texts, NULL, 2, &mean, c, 128, &err));
        CHECK(cosine(lastn, c, D) < 0.9999);
        const char *empty[] = {"a", ""};
        kvgen_status st = kvgen_embed(ref, empty, NULL, 2, NULL, c, 128, &err);
        CHECKF(st == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "text 1 has no tokens"), "%s", err.message);
    }
    kvgen_model_unload(ref);
    kvgen_model_unload(cpu);
    free(path);
}

int main(void) {
    char *f32 = tu_make_model("e-bert-f32.gguf", "--arch bert --layers 2 --embd 64 --ff 128 --heads 4 --ctx 64");
    char *q8 = tu_make_model("e-bert-q8.gguf", "--arch bert --layers 2 --embd 64 --ff 128 --heads 4 --ctx 64 "
                                               "--type Q8_0 --embd-type F32");
    char *nopool = tu_make_model("e-bert-nopool.gguf", "--arch bert --layers 2 --embd 64 --ff 128 --heads 4 "
                                                       "--ctx 64 --pooling none");
    char *wide = tu_make_model("e-bert-wide.gguf", "--arch bert --layers 2 --embd 256 --ff 1024 --heads 4 --ctx 64");
    CHECK(f32 && q8 && nopool && wide);
    if (f32 && q8 && nopool && wide) {
        kvgen_model *m = load(f32, KVGEN_BACKEND_REFERENCE);
        CHECK(m != NULL);
        if (m) test_wordpiece(m);
        kvgen_model_unload(m);
        test_backends(f32, 1e-4, false);
        test_backends(q8, 0.999, true);
        test_large_batch(wide, 1e-4);
        test_inputs(f32, nopool);
        test_concurrent(f32, KVGEN_BACKEND_CPU);
        test_concurrent(q8, KVGEN_BACKEND_CPU);
        test_concurrent(f32, KVGEN_BACKEND_REFERENCE);
    }
    test_decoder();
    free(f32);
    free(q8);
    free(nopool);
    free(wide);
    return tu_finish("test_embed");
}
