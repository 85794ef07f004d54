/* test_tokenizer.c: the tokenizers against llama.cpp's vocabulary test vectors and the
 * default model's fixture, special-token gating, streaming detokenization, refusal of
 * malformed tokenizer metadata and the table of every token's bytes. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_gguf.h"
#include "kvg_model.h"
#include "kvg_tokenizer.h"
#include "testutil.h"

typedef struct vocab {
    kvg_gguf *g;
    kvgen_model m; /* only .tok is set: enough for the public tokenizer calls */
} vocab;

static bool vocab_open(vocab *v, const char *path) {
    memset(v, 0, sizeof *v);
    kvgen_error err = {0};
    if (kvg_gguf_open(path, &v->g, &err) != KVGEN_OK || kvg_tokenizer_load(v->g, &v->m.tok, &err) != KVGEN_OK) {
        fprintf(stderr, "cannot load %s: %s\n", path, err.message);
        kvg_gguf_close(v->g);
        v->g = NULL;
        return false;
    }
    return true;
}

static void vocab_close(vocab *v) {
    kvg_tokenizer_free(v->m.tok);
    kvg_gguf_close(v->g);
}

/* tokenizes into a malloc'd array; NULL on failure */
static int32_t *tokenize(const vocab *v, const char *s, size_t len, unsigned flags, size_t *n) {
    kvgen_error err = {0};
    *n = 0;
    size_t need = 0;
    kvgen_status st = kvgen_tokenize(&v->m, s, len, flags, NULL, 0, &need, &err);
    if (st != KVGEN_OK && st != KVGEN_E_INVALID_ARGUMENT) return NULL;
    int32_t *ids = malloc((need + 1) * sizeof *ids);
    if (!ids || kvgen_tokenize(&v->m, s, len, flags, ids, need, n, &err) != KVGEN_OK) {
        fprintf(stderr, "tokenize failed: %s\n", err.message);
        free(ids);
        return NULL;
    }
    return ids;
}

static char *detokenize(const vocab *v, const int32_t *ids, size_t n, unsigned flags, size_t *len) {
    *len = kvgen_detokenize(&v->m, ids, n, flags, NULL, 0);
    char *s = malloc(*len + 1);
    if (s) kvgen_detokenize(&v->m, ids, n, flags, s, *len + 1);
    return s;
}

static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t len, ok;
        kvg_utf8_scan((const unsigned char *)s + i, n - i, &len, &ok);
        if (ok != len) return false;
        i += len;
    }
    return true;
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", label);
    for (size_t i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

/* ---- llama.cpp vocabulary vectors ------------------------------------------------------ */

static void check_vectors(const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf", name);
    char *gguf = tu_testdata(rel);
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf.inp", name);
    char *inp_path = tu_testdata(rel);
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf.out", name);
    char *out_path = tu_testdata(rel);
    size_t inp_size = 0, out_size = 0;
    char *inp = tu_read_file(inp_path, &inp_size), *out = tu_read_file(out_path, &out_size);
    vocab v;
    bool loaded = vocab_open(&v, gguf);
    CHECKF(loaded && inp && out, "%s: vocabulary or vectors missing", name);
    if (!loaded || !inp || !out) goto done;

    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sep_len = sizeof sep - 1;
    size_t pos = 0, opos = 0;
    int n_cases = 0, n_tok_ok = 0, n_rt_ok = 0, n_rt_ref = 0;
    while (pos < inp_size) {
        /* exactly as llama.cpp's reader: a separator ends a piece; the last piece runs to the end */
        const char *next = NULL;
        for (size_t i = pos; i + sep_len <= inp_size; i++)
            if (inp[i] == '\n' && memcmp(inp + i, sep, sep_len) == 0) { next = inp + i; break; }
        size_t plen = next ? (size_t)(next - inp) - pos : inp_size - pos;
        const char *piece = inp + pos;
        pos = next ? (size_t)(next - inp) + sep_len : inp_size;

        /* the matching .out line, spaces stripped */
        size_t lend = opos;
        while (lend < out_size && out[lend] != '\n') lend++;
        int32_t expect[1024];
        size_t ne = 0;
        for (size_t i = opos; i < lend && ne < 1024;) {
            while (i < lend && out[i] == ' ') i++;
            if (i >= lend) break;
            expect[ne++] = (int32_t)strtol(out + i, NULL, 10);
            while (i < lend && out[i] != ' ') i++;
        }
        CHECKF(opos < out_size, "%s: .out has fewer lines than .inp has tests", name);
        opos = lend < out_size ? lend + 1 : out_size;
        n_cases++;

        size_t n = 0;
        int32_t *ids = tokenize(&v, piece, plen, 0, &n);
        bool same = ids && n == ne && (ne == 0 || memcmp(ids, expect, ne * sizeof *ids) == 0);
        n_tok_ok += same;
        CHECKF(same, "%s: case %d ('%.*s') tokenizes differently", name, n_cases, (int)(plen > 60 ? 60 : plen),
               piece);
        if (!same && ids) {
            print_ids("expected", expect, ne);
            print_ids("kvgen   ", ids, n);
        }
        /* round trip: the reference's own ids detokenize to the input (SentencePiece's added
         * prefix space is removed again by the detokenizer) */
        size_t dl = 0;
        char *back = detokenize(&v, expect, ne, 0, &dl);
        bool rt = back && dl == plen && memcmp(back, piece, plen) == 0;
        n_rt_ref += rt;
        if (rt) {
            size_t dl2 = 0;
            char *back2 = ids ? detokenize(&v, ids, n, 0, &dl2) : NULL;
            bool rt2 = back2 && dl2 == plen && memcmp(back2, piece, plen) == 0;
            n_rt_ok += rt2;
            CHECKF(rt2, "%s: case %d does not round-trip", name, n_cases);
            free(back2);
        } else {
            fprintf(stderr, "  %s: case %d: the reference ids do not round-trip either ('%.*s' -> '%.*s')\n", name,
                    n_cases, (int)(plen > 40 ? 40 : plen), piece, (int)(dl > 40 ? 40 : dl), back ? back : "");
        }
        free(back);
        free(ids);
    }
    CHECKF(opos >= out_size || out[opos] == 0, "%s: .out has more lines than .inp has tests", name);
    CHECK(n_cases > 0);
    printf("%s: %d/%d vectors tokenize exactly; round trip %d/%d (the reference ids round-trip in %d)\n", name,
           n_tok_ok, n_cases, n_rt_ok, n_rt_ref, n_rt_ref);
    vocab_close(&v);
done:
    free(gguf);
    free(inp_path);
    free(out_path);
    free(inp);
    free(out);
}

/* ---- streaming detokenization ---------------------------------------------------------- */

static void check_stream(const vocab *v, const char *name, const char *text) {
    size_t n = 0, len = strlen(text);
    int32_t *ids = tokenize(v, text, len, 0, &n);
    CHECK(ids != NULL);
    if (!ids) return;
    char *all = malloc(4 * len + 64);
    size_t at = 0;
    int held = 0;
    kvgen_detok d;
    kvgen_detok_init(&d);
    for (size_t i = 0; i < n; i++) {
        char buf[512];
        size_t got = kvgen_detok_push(&v->m, &d, ids[i], 0, buf, sizeof buf);
        CHECK(got < sizeof buf && buf[got] == 0);
        CHECKF(valid_utf8(buf, got), "%s: piece %zu is not valid UTF-8", name, i);
        held += d.n_pending > 0;
        memcpy(all + at, buf, got);
        at += got;
    }
    char buf[64];
    size_t got = kvgen_detok_flush(&d, buf, sizeof buf);
    CHECKF(got == 0, "%s: something was left pending", name);
    CHECKF(at == len && memcmp(all, text, len) == 0, "%s: streamed text differs: '%.*s'", name, (int)at, all);
    CHECKF(held > 0, "%s: no character was split across tokens, the test proves nothing", name);
    free(all);
    free(ids);
}

static void check_streaming(const vocab *gpt2, const vocab *spm) {
    const char *text = "caf\xC3\xA9 \xE2\x82\xAC 5 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80\xF0\x9F\x91"
                       "\x8D\xF0\x9F\x8F\xBD \xF0\x9F\x90\x89 \xD0\x96\xD0\xB8\xD0\xB2 \xF0\x9D\x94\x98 end";
    check_stream(gpt2, "gpt-2 stream", text);
    check_stream(spm, "llama-spm stream", text);

    /* invalid bytes become U+FFFD, an unfinished character is flushed as U+FFFD */
    int32_t b80 = -1, be2 = -1;
    for (int32_t id = 0; id < kvg_tokenizer_n_vocab(spm->m.tok); id++) {
        char p[8];
        size_t pl = kvgen_token_piece(&spm->m, id, 0, p, sizeof p);
        if (pl == 1 && (unsigned char)p[0] == 0x80) b80 = id;
        if (pl == 1 && (unsigned char)p[0] == 0xE2) be2 = id;
    }
    CHECK(b80 >= 0 && be2 >= 0);
    kvgen_detok d;
    kvgen_detok_init(&d);
    char buf[64];
    size_t got = kvgen_detok_push(&spm->m, &d, b80, 0, buf, sizeof buf);
    CHECK(got == 3 && memcmp(buf, "\xEF\xBF\xBD", 3) == 0);
    got = kvgen_detok_push(&spm->m, &d, be2, 0, buf, sizeof buf);
    CHECK(got == 0 && d.n_pending == 1);
    got = kvgen_detok_flush(&d, buf, sizeof buf);
    CHECK(got == 3 && memcmp(buf, "\xEF\xBF\xBD", 3) == 0 && d.n_pending == 0);
    /* a small buffer truncates but still reports the full length and terminates */
    int32_t ids[4];
    size_t n = 0;
    CHECK_OK(kvgen_tokenize(&gpt2->m, "hello world", 11, 0, ids, 4, &n, NULL));
    char tiny[4];
    CHECK(kvgen_detokenize(&gpt2->m, ids, n, 0, tiny, sizeof tiny) == 11 && strcmp(tiny, "hel") == 0);
}

/* ---- special tokens -------------------------------------------------------------------- */

static void check_special(const vocab *sc, const vocab *spm) {
    /* starcoder: <fim_prefix> is control token 1 */
    const char *s = "<fim_prefix>def f(): pass";
    size_t n1 = 0, n0 = 0;
    int32_t *with = tokenize(sc, s, strlen(s), KVGEN_TOKENIZE_SPECIAL, &n1);
    int32_t *without = tokenize(sc, s, strlen(s), 0, &n0);
    CHECK(with && without);
    if (with && without) {
        CHECK(n1 >= 2 && with[0] == 1);
        bool has = false;
        for (size_t i = 0; i < n0; i++) has |= without[i] < 38;
        CHECKF(n0 > n1 && !has, "without KVGEN_TOKENIZE_SPECIAL the control text must stay plain text");
        size_t dl = 0;
        char *back = detokenize(sc, without, n0, 0, &dl);
        CHECK(back && dl == strlen(s) && memcmp(back, s, dl) == 0);
        free(back);
        back = detokenize(sc, with, n1, 0, &dl);
        CHECK(back && strcmp(back, "def f(): pass") == 0); /* control text hidden */
        free(back);
        back = detokenize(sc, with, n1, KVGEN_TOKENIZE_SPECIAL, &dl);
        CHECK(back && strcmp(back, s) == 0);
        free(back);
    }
    free(with);
    free(without);

    /* SentencePiece: BOS, and a special token in the middle resets the space prefix */
    const char *t = "<s>Hi</s> there";
    int32_t *a = tokenize(spm, t, strlen(t), KVGEN_TOKENIZE_SPECIAL | KVGEN_TOKENIZE_ADD_BOS, &n1);
    CHECK(a && n1 >= 5 && a[0] == 1 && a[1] == 1);
    if (a) {
        int eos_at = -1;
        for (size_t i = 0; i < n1; i++)
            if (a[i] == 2) eos_at = (int)i;
        CHECK(eos_at > 2 && kvgen_token_is_eog(&spm->m, 2) && !kvgen_token_is_eog(&spm->m, 1));
        size_t dl;
        char *back = detokenize(spm, a + 1, n1 - 1, KVGEN_TOKENIZE_SPECIAL, &dl);
        CHECKF(back && strcmp(back, "<s> Hi</s>  there") == 0, "got '%s'", back ? back : "");
        free(back);
    }
    free(a);
    a = tokenize(spm, "", 0, KVGEN_TOKENIZE_ADD_BOS, &n1);
    CHECK(a && n1 == 1 && a[0] == 1);
    free(a);
    a = tokenize(spm, "", 0, 0, &n1);
    CHECK(a && n1 == 0);
    free(a);
    CHECK(kvgen_token_is_control(&spm->m, 1) && !kvgen_token_is_control(&spm->m, 100));
    CHECK(kvgen_token_find(&spm->m, "</s>") == 2 && kvgen_token_find(&spm->m, "no such token text") == -1);
    char p[16];
    CHECK(kvgen_token_piece(&spm->m, 2, 0, p, sizeof p) == 0);
    CHECK(kvgen_token_piece(&spm->m, 2, KVGEN_TOKENIZE_SPECIAL, p, sizeof p) == 4 && memcmp(p, "</s>", 4) == 0);
    CHECK(kvgen_token_piece(&spm->m, 99999, KVGEN_TOKENIZE_SPECIAL, p, sizeof p) == 0);
}

/* ---- argument checks ------------------------------------------------------------------- */

static void check_arguments(const vocab *v) {
    kvgen_error err = {0};
    size_t n = 7;
    int32_t ids[2];
    CHECK(kvgen_tokenize(NULL, "x", 1, 0, ids, 2, &n, &err) == KVGEN_E_INVALID_ARGUMENT && n == 0);
    CHECK(strstr(err.message, "model") != NULL);
    CHECK(kvgen_tokenize(&v->m, NULL, 1, 0, ids, 2, &n, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_tokenize(&v->m, "x", 1, 0, NULL, 2, &n, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_tokenize(&v->m, "x", 1, 0, ids, 2, NULL, &err) == KVGEN_E_INVALID_ARGUMENT);
    const char *s = "one two three four five";
    CHECK(kvgen_tokenize(&v->m, s, strlen(s), 0, ids, 2, &n, &err) == KVGEN_E_INVALID_ARGUMENT && n == 5);
    CHECK(kvgen_token_piece(NULL, 1, 0, NULL, 0) == 0 && kvgen_token_find(NULL, "a") == -1);
    CHECK(kvgen_detokenize(NULL, ids, 1, 0, NULL, 0) == 0);
    /* arbitrary bytes, invalid UTF-8 included, survive byte-level BPE unchanged */
    const char bytes[] = "ok \xFF\xFE\x80 \xC3 \xE2\x82 x\xF0\x9F\x98";
    size_t blen = sizeof bytes - 1, nb = 0, dl = 0;
    int32_t *bi = tokenize(v, bytes, blen, 0, &nb);
    char *back = bi ? detokenize(v, bi, nb, 0, &dl) : NULL;
    CHECK(back && dl == blen && memcmp(back, bytes, blen) == 0);
    free(back);
    free(bi);
}

/* ---- malformed metadata ---------------------------------------------------------------- */

typedef enum {
    BAD_MODEL, NO_TOKENS, TOKENS_NOT_STRINGS, TYPE_COUNT, TYPE_VALUE, MERGE_NO_SPACE, MERGE_UNKNOWN_PART,
    BOS_RANGE, PRE_UNKNOWN, SCORES_TYPE, MODEL_NOT_STRING, N_BAD
} bad_kind;

static const struct { const char *what; kvgen_status st; const char *needle; } k_bad[N_BAD] = {
    {"unknown model", KVGEN_E_UNSUPPORTED, "tokenizer model 'xyz' is not supported"},
    {"no tokens", KVGEN_E_FORMAT, "tokenizer.ggml.tokens is missing"},
    {"tokens not strings", KVGEN_E_FORMAT, "tokenizer.ggml.tokens is not an array of strings"},
    {"token_type count", KVGEN_E_FORMAT, "tokenizer.ggml.token_type has 3 entries but there are 5 tokens"},
    {"token_type value", KVGEN_E_FORMAT, "tokenizer.ggml.token_type[2] = 9 is not a token type"},
    {"merge without space", KVGEN_E_FORMAT, "tokenizer.ggml.merges[1] 'ab' is not two tokens separated"},
    {"merge of unknown token", KVGEN_E_FORMAT, "tokenizer.ggml.merges[0] 'a q': its second part is not in"},
    {"bos out of range", KVGEN_E_FORMAT, "tokenizer.ggml.bos_token_id = 5 is out of range"},
    {"unknown pre", KVGEN_E_UNSUPPORTED, "pre-tokenizer 'klingon' (tokenizer.ggml.pre) is not supported"},
    {"scores not float", KVGEN_E_FORMAT, "tokenizer.ggml.scores is not an array of float32"},
    {"model not a string", KVGEN_E_FORMAT, "tokenizer.ggml.model is not a string"},
};

static void check_malformed(void) {
    for (int k = 0; k < N_BAD; k++) {
        kvg_gguf_writer *w = kvg_gguf_writer_new();
        CHECK(w != NULL);
        if (!w) return;
        kvg_gguf_set_str(w, "general.architecture", "llama");
        if (k == MODEL_NOT_STRING) kvg_gguf_set_u32(w, "tokenizer.ggml.model", 2);
        else kvg_gguf_set_str(w, "tokenizer.ggml.model", k == BAD_MODEL ? "xyz" : k == SCORES_TYPE ? "llama" : "gpt2");
        kvg_gguf_set_str(w, "tokenizer.ggml.pre", k == PRE_UNKNOWN ? "klingon" : "gpt2");
        kvg_str toks[5] = {{"a", 1}, {"b", 1}, {"ab", 2}, {"<s>", 3}, {"c", 1}};
        if (k == TOKENS_NOT_STRINGS) {
            int32_t bogus[5] = {1, 2, 3, 4, 5};
            kvg_gguf_set_arr_num(w, "tokenizer.ggml.tokens", KVG_GGUF_INT32, bogus, 5);
        } else if (k != NO_TOKENS) {
            kvg_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, 5);
        }
        int32_t types[5] = {1, 1, k == TYPE_VALUE ? 9 : 1, 3, 1};
        kvg_gguf_set_arr_num(w, "tokenizer.ggml.token_type", KVG_GGUF_INT32, types, k == TYPE_COUNT ? 3 : 5);
        kvg_str merges[2] = {{k == MERGE_UNKNOWN_PART ? "a q" : "a b", 3}, {k == MERGE_NO_SPACE ? "ab" : "ab c", k == MERGE_NO_SPACE ? 2 : 4}};
        kvg_gguf_set_arr_str(w, "tokenizer.ggml.merges", merges, k == MERGE_NO_SPACE ? 2 : 1);
        if (k == SCORES_TYPE) {
            int32_t sc[5] = {0};
            kvg_gguf_set_arr_num(w, "tokenizer.ggml.scores", KVG_GGUF_INT32, sc, 5);
        }
        kvg_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", k == BOS_RANGE ? 5 : 3);
        char name[64];
        snprintf(name, sizeof name, "badtok%d.gguf", k);
        char *path = tu_tmpfile(name);
        kvgen_error err = {0};
        CHECK_OK(kvg_gguf_writer_save(w, path, &err));
        kvg_gguf_writer_free(w);
        kvg_gguf *g = NULL;
        kvg_tokenizer *t = NULL;
        CHECK_OK(kvg_gguf_open(path, &g, &err));
        if (g) {
            kvgen_status st = kvg_tokenizer_load(g, &t, &err);
            CHECKF(st == k_bad[k].st, "%s: status %s", k_bad[k].what, kvgen_status_name(st));
            CHECKF(t == NULL, "%s: no tokenizer expected", k_bad[k].what);
            CHECKF(strstr(err.message, name) && strstr(err.message, k_bad[k].needle), "%s: message '%s'",
                   k_bad[k].what, err.message);
            kvg_tokenizer_free(t);
            kvg_gguf_close(g);
        }
        free(path);
    }
}

/* A well-formed toy BPE: merges apply by rank, not by position. */
static void check_toy_bpe(void) {
    kvg_gguf_writer *w = kvg_gguf_writer_new();
    kvg_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    kvg_gguf_set_str(w, "tokenizer.ggml.pre", "gpt2");
    kvg_str toks[6] = {{"a", 1}, {"b", 1}, {"c", 1}, {"bc", 2}, {"ab", 2}, {"abc", 3}};
    kvg_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, 6);
    kvg_str merges[3] = {{"b c", 3}, {"a bc", 4}, {"a b", 3}};
    kvg_gguf_set_arr_str(w, "tokenizer.ggml.merges", merges, 3);
    char *path = tu_tmpfile("toybpe.gguf");
    kvgen_error err = {0};
    CHECK_OK(kvg_gguf_writer_save(w, path, &err));
    kvg_gguf_writer_free(w);
    vocab v;
    if (vocab_open(&v, path)) {
        size_t n;
        int32_t *ids = tokenize(&v, "abcab", 5, 0, &n);
        /* "b c" (rank 0) beats "a b" (rank 2): abc stays whole, then ab */
        CHECK(ids && n == 2 && ids[0] == 5 && ids[1] == 4);
        free(ids);
        ids = tokenize(&v, "xab", 3, 0, &n); /* 'x' has no token: dropped as in llama.cpp */
        CHECK(ids && n == 1 && ids[0] == 4);
        free(ids);
        CHECK(kvg_tokenizer_bos(v.m.tok) == -1 && !kvg_tokenizer_add_bos(v.m.tok));
        vocab_close(&v);
    }
    free(path);
}

/* The other pre-tokenizers, on the GPT-2 vocabulary with tokenizer.ggml.pre rewritten; the
 * expected ids are llama-tokenize's for the same rewritten files. */
static void check_pre_variants(void) {
    static const char *const texts[3] = {"x 12345 $$ +", "I'VE  got\\r\\n\\n 1234567 apples!!  \\n",
                                         "Don't   stop 3.14159..."};
    static const struct { const char *pre; int32_t ids[3][32]; size_t n[3]; } cases[] = {
        {"default",
         {{87, 220, 10163, 2231, 220, 13702, 220, 10},
          {40, 6, 6089, 220, 1392, 59, 81, 59, 77, 59, 77, 220, 10163, 29228, 22, 22514, 3228, 220, 220, 59, 77},
          {3987, 6, 83, 220, 220, 2245, 220, 18, 13, 23756, 3270, 986}},
         {8, 21, 12}},
        {"llama-bpe",
         {{87, 220, 10163, 2231, 32382, 1343},
          {40, 6, 6089, 220, 1392, 59, 81, 59, 77, 59, 77, 220, 10163, 29228, 22, 22514, 3228, 220, 3467, 77},
          {3987, 470, 220, 220, 2245, 220, 18, 13, 23756, 3270, 986}},
         {6, 20, 11}},
        {"qwen2",
         {{87, 220, 16, 17, 18, 19, 20, 32382, 1343},
          {40, 6, 6089, 220, 1392, 59, 81, 59, 77, 59, 77, 220, 16, 17, 18, 19, 20, 21, 22, 22514, 3228, 220, 3467, 77},
          {3987, 470, 220, 220, 2245, 220, 18, 13, 16, 19, 16, 20, 24, 986}},
         {9, 24, 14}},
    };
    char *src = tu_testdata("tokenizer/ggml-vocab-gpt-2.gguf");
    kvg_gguf *g = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvg_gguf_open(src, &g, &err));
    for (size_t c = 0; g && c < sizeof cases / sizeof cases[0]; c++) {
        kvg_gguf_writer *w = kvg_gguf_writer_new();
        for (int i = 0; i < kvg_gguf_n_kv(g); i++)
            if (strcmp(kvg_gguf_key(g, i), "tokenizer.ggml.pre") != 0) CHECK(kvg_gguf_copy_kv(w, g, kvg_gguf_key(g, i)));
        kvg_gguf_set_str(w, "tokenizer.ggml.pre", cases[c].pre);
        char name[64];
        snprintf(name, sizeof name, "gpt2-pre-%s.gguf", cases[c].pre);
        char *path = tu_tmpfile(name);
        CHECK_OK(kvg_gguf_writer_save(w, path, &err));
        kvg_gguf_writer_free(w);
        vocab v;
        if (vocab_open(&v, path)) {
            for (int k = 0; k < 3; k++) {
                size_t n = 0;
                int32_t *ids = tokenize(&v, texts[k], strlen(texts[k]), 0, &n);
                bool same = ids && n == cases[c].n[k] && memcmp(ids, cases[c].ids[k], n * sizeof *ids) == 0;
                CHECKF(same, "pre %s: '%s' tokenizes differently", cases[c].pre, texts[k]);
                if (!same && ids) print_ids("kvgen", ids, n);
                free(ids);
            }
            vocab_close(&v);
        }
        free(path);
    }
    kvg_gguf_close(g);
    free(src);
}

/* ---- the default model ----------------------------------------------------------------- */

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static void check_default_model(void) {
    const char *mp = tu_model_path();
    if (!mp) {
        printf("default model absent: its checks are skipped\n");
        return;
    }
    vocab v;
    CHECK(vocab_open(&v, mp));
    if (!v.g) return;
    CHECK(kvg_tokenizer_kind(v.m.tok) == KVGEN_TOKENIZER_BPE && strcmp(kvg_tokenizer_pre(v.m.tok), "smollm") == 0);
    CHECK(kvg_tokenizer_bos(v.m.tok) == 1 && kvg_tokenizer_eos(v.m.tok) == 2 && kvg_tokenizer_eot(v.m.tok) == 2);
    CHECK(kvgen_token_is_eog(&v.m, 2) && kvgen_token_is_eog(&v.m, 0) && !kvgen_token_is_eog(&v.m, 1));
    CHECK(kvgen_token_is_control(&v.m, 1));

    const char *s = "<|im_start|>user\nHi<|im_end|>";
    size_t n1, n0;
    int32_t *with = tokenize(&v, s, strlen(s), KVGEN_TOKENIZE_SPECIAL | KVGEN_TOKENIZE_ADD_BOS, &n1);
    int32_t *without = tokenize(&v, s, strlen(s), 0, &n0);
    CHECK(with && without);
    if (with && without) {
        /* add_bos_token is false in this model: no BOS even when asked */
        CHECK(n1 >= 4 && with[0] == 1 && with[n1 - 1] == 2);
        bool leak = false;
        for (size_t i = 0; i < n0; i++) leak |= kvgen_token_is_control(&v.m, without[i]);
        CHECK(n0 > n1 + 4 && !leak);
        char p[32];
        CHECK(kvgen_token_piece(&v.m, 1, 0, p, sizeof p) == 0);
        CHECK(kvgen_token_piece(&v.m, 1, KVGEN_TOKENIZE_SPECIAL, p, sizeof p) == 12 && strcmp(p, "<|im_start|>") == 0);
    }
    free(with);
    free(without);

    char *fx_dir = getenv("KVGEN_FIXTURES");
    char fx[1024];
    snprintf(fx, sizeof fx, "%s/smollm2_tok.txt", fx_dir ? fx_dir : "core/tests/fixtures");
    size_t size = 0;
    char *data = tu_read_file(fx, &size);
    CHECKF(data != NULL, "cannot read %s", fx);
    int cases = 0, ok = 0, rt = 0;
    char *text = data ? malloc(size / 2 + 1) : NULL;
    size_t tl = 0;
    for (char *line = data, *next; line && text && line < data + size; line = next) {
        char *eol = memchr(line, '\n', (size_t)(data + size - line));
        next = eol ? eol + 1 : data + size;
        if (eol) *eol = 0;
        if (line[0] == 'T' && line[1] == ' ') {
            tl = 0;
            for (char *h = line + 2; hexval(h[0]) >= 0 && hexval(h[1]) >= 0; h += 2)
                text[tl++] = (char)(hexval(h[0]) * 16 + hexval(h[1]));
        } else if (line[0] == 'I') {
            int32_t expect[4096];
            size_t ne = 0;
            for (char *q = line + 1; *q && ne < 4096;) {
                char *end;
                long x = strtol(q, &end, 10);
                if (end == q) break;
                expect[ne++] = (int32_t)x;
                q = end;
            }
            size_t n;
            int32_t *ids = tokenize(&v, text, tl, 0, &n);
            bool same = ids && n == ne && (n == 0 || memcmp(ids, expect, n * sizeof *ids) == 0);
            cases++;
            ok += same;
            CHECKF(same, "smollm2 fixture case %d ('%.*s') differs", cases, (int)(tl > 60 ? 60 : tl), text);
            if (!same && ids) {
                print_ids("expected", expect, ne);
                print_ids("kvgen   ", ids, n);
            }
            size_t dl;
            char *back = ids ? detokenize(&v, ids, n, 0, &dl) : NULL;
            bool r = back && dl == tl && memcmp(back, text, tl) == 0;
            rt += r;
            CHECKF(r, "smollm2 fixture case %d does not round-trip", cases);
            free(back);
            free(ids);
        }
    }
    CHECK(cases >= 200);
    printf("smollm2 fixture: %d/%d strings tokenize exactly, %d round-trip\n", ok, cases, rt);
    free(text);
    free(data);
    vocab_close(&v);
}

typedef struct bytes_race {
    const kvg_tokenizer *t;
    int n_ids;
    const kvg_token_bytes *got;
} bytes_race;

static void *get_bytes(void *arg) {
    bytes_race *r = arg;
    r->got = kvg_token_bytes_get(r->t, r->n_ids);
    return NULL;
}

/* Every token's bytes in one table: each id's bytes are its piece (flags 0), ids past the
 * tokenizer's own are empty, the table is built once (threads asking at once all get the one
 * kept) and another id count is refused. */
static void check_token_bytes(const vocab *v, const char *name) {
    int n_tok = kvg_tokenizer_n_vocab(v->m.tok), n = n_tok + 3;
    enum { T = 4 };
    pthread_t th[T];
    bytes_race r[T];
    int started = 0;
    for (int i = 0; i < T; i++) {
        r[i] = (bytes_race){v->m.tok, n, NULL};
        if (pthread_create(&th[i], NULL, get_bytes, &r[i]) == 0) started++;
        else break;
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    const kvg_token_bytes *b = kvg_token_bytes_get(v->m.tok, n);
    CHECKF(b && b->n == n && started == T, "%s: no table of %d ids", name, n);
    for (int i = 0; i < started; i++) CHECKF(r[i].got == b, "%s: thread %d got another table", name, i);
    CHECK(kvg_token_bytes_get(v->m.tok, n_tok) == NULL);
    int wrong = 0;
    char piece[1024];
    for (int t = 0; b && t < n; t++) {
        size_t len = kvgen_token_piece(&v->m, t, 0, piece, sizeof piece);
        wrong += len >= sizeof piece || b->off[t + 1] - b->off[t] != len ||
                 memcmp(b->bytes + b->off[t], piece, len) != 0;
    }
    CHECKF(wrong == 0, "%s: %d of %d tokens' bytes differ from their pieces", name, wrong, n);
    CHECK(!b || b->off[n] == b->off[n_tok]); /* ids past the tokenizer's own */
}

int main(void) {
    check_vectors("gpt-2");
    check_vectors("starcoder");
    check_vectors("llama-spm");
    check_vectors("deepseek-coder");
    check_vectors("falcon");
    check_vectors("mpt");
    check_vectors("phi-3");

    char *p1 = tu_testdata("tokenizer/ggml-vocab-gpt-2.gguf"), *p2 = tu_testdata("tokenizer/ggml-vocab-llama-spm.gguf"),
         *p3 = tu_testdata("tokenizer/ggml-vocab-starcoder.gguf");
    vocab gpt2, spm, sc;
    bool a = vocab_open(&gpt2, p1), b = vocab_open(&spm, p2), c = vocab_open(&sc, p3);
    CHECK(a && b && c);
    if (a && b && c) {
        check_streaming(&gpt2, &spm);
        check_special(&sc, &spm);
        check_arguments(&gpt2);
        check_token_bytes(&gpt2, "gpt-2");
        check_token_bytes(&spm, "llama-spm");
    }
    if (a) vocab_close(&gpt2);
    if (b) vocab_close(&spm);
    if (c) vocab_close(&sc);
    free(p1);
    free(p2);
    free(p3);
    check_malformed();
    check_toy_bpe();
    check_pre_variants();
    check_default_model();
    return tu_finish("test_tokenizer");
}
