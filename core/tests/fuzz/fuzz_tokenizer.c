/* fuzz_tokenizer: kvgen_tokenize over arbitrary bytes (with and without control-token text and
 * BOS), then the pieces back: kvgen_detokenize, kvgen_token_piece and the streaming
 * kvgen_detok. The vocabulary is the default model's (a byte-level BPE with merges and control
 * tokens: $KVGEN_FUZZ_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf), or, without it,
 * kvgen-mkmodel's synthetic one. Without control tokens, text that is valid UTF-8 must come back
 * byte for byte (a byte-level vocabulary covers every byte it has a token for; the few it lacks
 * are dropped, docs/tokenizer.md, and texts holding them are not checked), and the streaming
 * detokenizer must
 * give what the whole one gives where that is valid UTF-8; a difference aborts. The first
 * byte of an input holds the flags. Seeds: corpus/tokenizer/. */
#include "fuzz_util.h"

static kvgen_model *g_model;
static int g_exact;            /* the vocabulary is the real model's: UTF-8 text round-trips */
static unsigned char g_lost[256]; /* bytes with no token (dropped, docs/tokenizer.md): not checked */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *path = getenv("KVGEN_FUZZ_MODEL");
    if (!path || !*path) path = KVGEN_FUZZ_DEFAULT_MODEL;
    if (access(path, R_OK) == 0) {
        kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 1, .kv_pool_tokens = 64};
        kvgen_error err = {0};
        if (kvgen_model_load(&md, &g_model, &err) != KVGEN_OK) {
            fprintf(stderr, "fuzz_tokenizer: %s\n", err.message);
            exit(1);
        }
        g_exact = 1;
        /* a byte whose GPT-2 character the vocabulary lacks (SmolLM2: 21 of them, such as 0x16)
         * is dropped; texts holding one are left out of the round-trip check */
        int n_lost = 0;
        for (int b = 0; b < 256; b++) {
            char c = (char)b, back[16];
            int32_t id[8];
            size_t n = 0;
            if (kvgen_tokenize(g_model, &c, 1, 0, id, 8, &n, &err) != KVGEN_OK ||
                kvgen_detokenize(g_model, id, n, 0, back, sizeof back) != 1 || back[0] != c)
                g_lost[b] = 1, n_lost++;
        }
        fprintf(stderr, "fuzz_tokenizer: the vocabulary of %s (%d bytes without a token)\n", path, n_lost);
    } else {
        g_model = fuzz_random_model(NULL);
        fprintf(stderr, "fuzz_tokenizer: %s not found; kvgen-mkmodel's synthetic vocabulary\n", path);
    }
    return 0;
}

static int valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n) return 0;
        uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        i += len;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 4096) return 0;
    unsigned flags = data[0] & (KVGEN_TOKENIZE_SPECIAL | KVGEN_TOKENIZE_ADD_BOS);
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    kvgen_error err = {0};
    size_t n = 0;
    kvgen_status st = kvgen_tokenize(g_model, text, len, flags, NULL, 0, &n, &err);
    if (st != KVGEN_OK && st != KVGEN_E_INVALID_ARGUMENT) return 0;
    int32_t *toks = malloc((n ? n : 1) * sizeof *toks);
    size_t n2 = 0;
    if (kvgen_tokenize(g_model, text, len, flags, toks, n, &n2, &err) != KVGEN_OK || n2 != n) {
        fprintf(stderr, "fuzz_tokenizer: %zu tokens counted, then %zu (%s)\n", n, n2, err.message);
        abort();
    }
    size_t need = kvgen_detokenize(g_model, toks, n, flags & KVGEN_TOKENIZE_SPECIAL, NULL, 0);
    char *back = malloc(need + 1);
    size_t got = kvgen_detokenize(g_model, toks, n, flags & KVGEN_TOKENIZE_SPECIAL, back, need + 1);
    if (got != need) abort();
    /* the streaming detokenizer gives the same bytes */
    char *streamed = malloc(need + 64);
    size_t sn = 0;
    kvgen_detok d;
    kvgen_detok_init(&d);
    for (size_t i = 0; i < n; i++) {
        char piece[512];
        size_t k = kvgen_detok_push(g_model, &d, toks[i], flags & KVGEN_TOKENIZE_SPECIAL, piece, sizeof piece);
        if (k <= sizeof piece && sn + k <= need + 63) memcpy(streamed + sn, piece, k);
        sn += k;
        (void)kvgen_token_piece(g_model, toks[i], flags, piece, sizeof piece);
    }
    char tail[64];
    size_t k = kvgen_detok_flush(&d, tail, sizeof tail);
    if (k <= sizeof tail && sn + k <= need + 63) memcpy(streamed + sn, tail, k);
    sn += k;
    if (g_exact && valid_utf8((const uint8_t *)back, need) && (sn != need || memcmp(streamed, back, need) != 0)) {
        fprintf(stderr, "fuzz_tokenizer: streamed detokenization (%zu bytes) differs from the whole (%zu)\n", sn, need);
        abort();
    }
    int lost = 0;
    for (size_t i = 0; i < len; i++) lost |= g_lost[data[1 + i]];
    if (g_exact && !lost && !(flags & KVGEN_TOKENIZE_SPECIAL) && !(flags & KVGEN_TOKENIZE_ADD_BOS) &&
        valid_utf8(data + 1, len) && (need != len || memcmp(back, text, len) != 0)) {
        fprintf(stderr, "fuzz_tokenizer: %zu bytes of UTF-8 came back as %zu different bytes\n", len, need);
        abort();
    }
    free(streamed);
    free(back);
    free(toks);
    return 0;
}
