/* fuzz_wordpiece: BERT's WordPiece (tokenizer.ggml.model = bert) over arbitrary bytes, then an
 * embedding of the same text. The vocabulary is all-MiniLM-L6-v2's ($KVGEN_FUZZ_BERT_MODEL, else
 * models/all-MiniLM-L6-v2.gguf from scripts/fetch_model.sh --minilm), or, without it,
 * kvgen-mkmodel's synthetic bert. Checked, else the target aborts: every id is in the
 * vocabulary; with BOS the ids open with [CLS] and close with [SEP]; an uncased vocabulary gives
 * the same ids for the text with its ASCII letters upper-cased; when the flags byte has its high
 * bit set, kvgen_embed of the text (cut to 8 tokens) is a finite unit vector (the embedding is
 * what makes a run slow: half a second on the real model under the sanitizers, so only such
 * inputs pay for it). The first byte of an input holds the flags. Seeds: corpus/wordpiece/. */
#include <math.h>
#include "fuzz_util.h"

static kvgen_model *g_model;
static kvgen_model_info g_info;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *path = getenv("KVGEN_FUZZ_BERT_MODEL");
    if (!path || !*path) path = KVGEN_FUZZ_BERT_MODEL;
    if (access(path, R_OK) == 0) {
        kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 1};
        kvgen_error err = {0};
        if (kvgen_model_load(&md, &g_model, &err) != KVGEN_OK) {
            fprintf(stderr, "fuzz_wordpiece: %s\n", err.message);
            exit(1);
        }
        fprintf(stderr, "fuzz_wordpiece: the vocabulary of %s\n", path);
    } else {
        g_model = fuzz_random_model("--arch bert");
        fprintf(stderr, "fuzz_wordpiece: %s not found; kvgen-mkmodel's synthetic bert\n", path);
    }
    kvgen_model_get_info(g_model, &g_info);
    return 0;
}

/* the ids of text, malloc'd (*n of them); aborts when the two counting calls disagree */
static int32_t *ids_of(const char *text, size_t len, unsigned flags, size_t *n) {
    kvgen_error err = {0};
    *n = 0;
    kvgen_status st = kvgen_tokenize(g_model, text, len, flags, NULL, 0, n, &err);
    if (st != KVGEN_OK && st != KVGEN_E_INVALID_ARGUMENT) abort(); /* text never fails a tokenizer */
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    size_t n2 = 0;
    if (kvgen_tokenize(g_model, text, len, flags, ids, *n, &n2, &err) != KVGEN_OK || n2 != *n) abort();
    for (size_t i = 0; i < *n; i++)
        if (ids[i] < 0 || ids[i] >= g_info.n_vocab) abort();
    return ids;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 4096) return 0;
    unsigned flags = data[0] & (KVGEN_TOKENIZE_SPECIAL | KVGEN_TOKENIZE_ADD_BOS);
    const char *text = (const char *)data + 1;
    size_t len = size - 1, n = 0;
    int32_t *ids = ids_of(text, len, flags, &n);
    if ((flags & KVGEN_TOKENIZE_ADD_BOS) && (n < 2 || ids[0] != g_info.bos || ids[n - 1] != g_info.eos)) abort();
    char piece[512];
    for (size_t i = 0; i < n; i++) (void)kvgen_token_piece(g_model, ids[i], flags, piece, sizeof piece);
    size_t need = kvgen_detokenize(g_model, ids, n, flags & KVGEN_TOKENIZE_SPECIAL, NULL, 0);
    char *back = malloc(need + 1);
    if (kvgen_detokenize(g_model, ids, n, flags & KVGEN_TOKENIZE_SPECIAL, back, need + 1) != need) abort();
    /* an uncased vocabulary lower-cases first: upper-case ASCII gives the same ids (a control
     * token's name, matched with KVGEN_TOKENIZE_SPECIAL before lower-casing, is the exception) */
    if (!(flags & KVGEN_TOKENIZE_SPECIAL) && kvgen_token_find(g_model, "\xE2\x96\x81" "a") >= 0 &&
        kvgen_token_find(g_model, "\xE2\x96\x81" "A") < 0) {
        char *upper = malloc(len ? len : 1);
        for (size_t i = 0; i < len; i++) upper[i] = text[i] >= 'a' && text[i] <= 'z' ? (char)(text[i] - 32) : text[i];
        size_t n2 = 0;
        int32_t *ids2 = ids_of(upper, len, flags, &n2);
        if (n2 != n || (n && memcmp(ids, ids2, n * sizeof *ids) != 0)) {
            fprintf(stderr, "fuzz_wordpiece: upper-cased ASCII changed the ids (%zu, then %zu)\n", n, n2);
            abort();
        }
        free(ids2);
        free(upper);
    }
    free(back);
    free(ids);
    if (!(data[0] & 0x80)) return 0;
    /* the embedding of the text: finite, of unit length */
    float *v = malloc((size_t)g_info.n_embd * sizeof *v);
    kvgen_embed_desc d = {.max_tokens = 8};
    kvgen_error err = {0};
    const char *texts[1] = {text};
    size_t lens[1] = {len};
    if (kvgen_embed(g_model, texts, lens, 1, &d, v, (size_t)g_info.n_embd, &err) != KVGEN_OK) {
        fprintf(stderr, "fuzz_wordpiece: kvgen_embed: %s\n", err.message);
        abort();
    }
    double ss = 0;
    for (int i = 0; i < g_info.n_embd; i++) {
        if (!isfinite(v[i])) abort();
        ss += (double)v[i] * v[i];
    }
    if (fabs(ss - 1.0) > 1e-3) abort();
    free(v);
    return 0;
}
