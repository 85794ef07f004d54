/* test_embed_real.c: all-MiniLM-L6-v2 (models/all-MiniLM-L6-v2.gguf, F16, and
 * all-MiniLM-L6-v2-f32.gguf, made by scripts/fetch_model.sh --minilm / --minilm-f32; skipped
 * when neither is there) against its oracles
 * (scripts/oracle/minilm_fixture.py): the WordPiece ids of every string of
 * fixtures/minilm_wordpiece.txt equal Hugging Face's, and on every backend that loads it the
 * embedding of every text of fixtures/minilm_embed.txt (the empty text and texts past the
 * 256-token truncation among them) has cosine >= 0.999 with the oracle's. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvgen.h"
#include "testutil.h"

#define MAX_CASES 512

typedef struct fixture {
    char *text[MAX_CASES];
    size_t len[MAX_CASES];
    char *data[MAX_CASES]; /* the line after "I " or "E " */
    int n;
} fixture;

static void unhex(const char *h, char **out, size_t *len) {
    size_t n = strlen(h) / 2;
    char *s = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v = 0;
        sscanf(h + 2 * i, "%2x", &v);
        s[i] = (char)v;
    }
    s[n] = 0;
    *out = s;
    *len = n;
}

static void read_fixture(const char *name, fixture *f) {
    memset(f, 0, sizeof *f);
    FILE *in = tu_open_fixture(name);
    size_t cap = 1 << 20;
    char *line = malloc(cap);
    while (in && fgets(line, (int)cap, in) && f->n < MAX_CASES) {
        line[strcspn(line, "\n")] = 0;
        if (line[0] == 'T' && line[1] == ' ') unhex(line + 2, &f->text[f->n], &f->len[f->n]);
        else if ((line[0] == 'I' || line[0] == 'E') && line[1] == ' ') f->data[f->n++] = strdup(line + 2);
    }
    if (in) fclose(in);
    free(line);
}

static void free_fixture(fixture *f) {
    for (int i = 0; i < f->n; i++) free(f->text[i]), free(f->data[i]);
}

static void test_wordpiece(kvgen_model *m) {
    fixture f;
    read_fixture("minilm_wordpiece.txt", &f);
    CHECK(f.n >= 300);
    int bad = 0;
    int32_t *ids = malloc(65536 * sizeof *ids);
    for (int i = 0; i < f.n; i++) {
        size_t n = 0;
        kvgen_status st = kvgen_tokenize(m, f.text[i], f.len[i], KVGEN_TOKENIZE_ADD_BOS, ids, 65536, &n, NULL);
        char got[65536 / 4];
        size_t at = 0;
        got[0] = 0;
        for (size_t k = 0; st == KVGEN_OK && k < n && at + 16 < sizeof got; k++)
            at += (size_t)snprintf(got + at, sizeof got - at, k ? " %d" : "%d", ids[k]);
        if (st != KVGEN_OK || strcmp(got, f.data[i]) != 0) {
            if (bad++ < 5) fprintf(stderr, "case %d '%.60s': got %.200s\n   want %.200s\n", i, f.text[i], got, f.data[i]);
        }
    }
    CHECKF(bad == 0, "%d of %d strings tokenized differently from Hugging Face's", bad, f.n);
    printf("wordpiece: %d of %d strings as Hugging Face's tokenizers\n", f.n - bad, f.n);
    free(ids);
    free_fixture(&f);
}

static void test_embeddings(const char *path, kvgen_backend backend, const char *name) {
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    kvgen_model_desc d = {.path = path, .backend = backend};
    if (kvgen_model_load(&d, &m, &err) != KVGEN_OK) {
        printf("%s backend: not run (%s)\n", name, err.message);
        return;
    }
    fixture f;
    read_fixture("minilm_embed.txt", &f);
    CHECK(f.n >= 50);
    const char *texts[MAX_CASES];
    for (int i = 0; i < f.n; i++) texts[i] = f.text[i];
    int D = 384;
    float *v = calloc((size_t)f.n * D, sizeof *v);
    CHECK_OK(kvgen_embed(m, texts, f.len, (size_t)f.n, NULL, v, (size_t)f.n * D, &err));
    double worst = 1.0;
    int at = -1;
    for (int i = 0; i < f.n; i++) {
        double ab = 0, aa = 0, bb = 0;
        char *p = f.data[i];
        for (int k = 0; k < D; k++) {
            double o = strtod(p, &p);
            ab += o * v[(size_t)i * D + k];
            aa += o * o;
            bb += (double)v[(size_t)i * D + k] * v[(size_t)i * D + k];
        }
        double c = ab / sqrt(aa * bb);
        if (c < worst) worst = c, at = i;
    }
    CHECKF(worst >= 0.999, "%s backend: text %d has cosine %.6f with the oracle", name, at, worst);
    printf("%s backend: %d texts, worst cosine with the oracle %.8f (1 - %.2g, text %d)\n", name, f.n, worst, 1.0 - worst, at);
    free(v);
    free_fixture(&f);
    kvgen_model_unload(m);
}

int main(void) {
    char *path = tu_model_file("all-MiniLM-L6-v2.gguf"), *f32 = tu_model_file("all-MiniLM-L6-v2-f32.gguf");
    if (!path && !f32) tu_skip("models/all-MiniLM-L6-v2.gguf absent (scripts/fetch_model.sh --minilm)");
    const char *files[] = {path, f32};
    for (int i = 0; i < 2; i++) {
        if (!files[i]) continue;
        printf("%s\n", files[i]);
        kvgen_model *m = NULL;
        kvgen_model_desc d = {.path = files[i], .backend = KVGEN_BACKEND_REFERENCE};
        CHECK_OK(kvgen_model_load(&d, &m, NULL));
        if (m) test_wordpiece(m);
        kvgen_model_unload(m);
        test_embeddings(files[i], KVGEN_BACKEND_REFERENCE, "reference");
        test_embeddings(files[i], KVGEN_BACKEND_CPU, "cpu");
        test_embeddings(files[i], KVGEN_BACKEND_VULKAN, "vulkan");
    }
    free(path);
    free(f32);
    return tu_finish("test_embed_real");
}
