/* fuzz_grammar: the GBNF parser, then the byte matcher and the token mask over it. An input is
 * the grammar text, a NUL byte, then text fed to the matcher in pieces (each byte below 8 ends
 * a piece, and after each piece the mask over a small vocabulary of its own is taken, with the
 * trie walk checked against the brute-force one). The matcher runs with a small step bound, so
 * a costly grammar fails (as it should) instead of slowing the fuzzer. Seeds: corpus/grammar/. */
#include "fuzz_util.h"
#include "kvg_grammar.h"

/* a vocabulary: single bytes, a few words and fragments of UTF-8, one end-of-generation token */
static const char *const VOCAB[] = {"a", "b", "c", "x", "y", "z", "0", "1", "9", " ", "\n", "\"", "{", "}", "[", "]",
                                    ":", ",", "-", ".", "true", "false", "null", "yes", "no", "ab", "abc", "\"a",
                                    "\xc3", "\xa9", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f", "\x98\x80", "<eog>"};
enum { N_VOCAB = sizeof VOCAB / sizeof VOCAB[0] };
static kvg_vocab_trie *g_trie;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    static uint32_t off[N_VOCAB + 1];
    static unsigned char bytes[512];
    static uint8_t eog[N_VOCAB];
    size_t at = 0;
    for (int i = 0; i < N_VOCAB; i++) {
        off[i] = (uint32_t)at;
        size_t n = i == N_VOCAB - 1 ? 0 : strlen(VOCAB[i]);
        memcpy(bytes + at, VOCAB[i], n);
        at += n;
        eog[i] = i == N_VOCAB - 1;
    }
    off[N_VOCAB] = (uint32_t)at;
    g_trie = kvg_vocab_trie_build(N_VOCAB, off, bytes, eog);
    if (!g_trie) exit(1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 8192) return 0;
    const uint8_t *nul = memchr(data, 0, size);
    size_t glen = nul ? (size_t)(nul - data) : size;
    char *text = malloc(glen + 1);
    memcpy(text, data, glen);
    text[glen] = 0;
    kvg_gram *g = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvg_gram_parse(text, &g, &err);
    free(text);
    if (st != KVGEN_OK) return 0;
    kvg_gram_match *mt = NULL;
    if (kvg_gram_match_new(g, &mt, &err) == KVGEN_OK) {
        kvg_gram_match_set_max_steps(mt, 20000);
        uint8_t allowed[N_VOCAB];
        (void)kvg_gram_mask(mt, g_trie, allowed, &err);
        const uint8_t *p = nul ? nul + 1 : data + size, *end = data + size;
        while (p < end) {
            const uint8_t *q = p;
            while (q < end && *q >= 8) q++;
            (void)kvg_gram_feed(mt, p, (size_t)(q - p));
            (void)kvg_gram_can_end(mt);
            (void)kvg_gram_done(mt);
            (void)kvg_gram_mask(mt, g_trie, allowed, &err);
            if (q < end && *q == 1) kvg_gram_match_reset(mt);
            p = q + 1;
        }
        kvg_gram_match_free(mt);
    }
    kvg_gram_free(g);
    return 0;
}
