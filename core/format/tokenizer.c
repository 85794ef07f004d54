/* tokenizer.c: byte-level BPE (tokenizer.ggml.model = gpt2), SentencePiece-style BPE
 * (tokenizer.ggml.model = llama) and the vocabulary side of BERT's WordPiece (bert; the
 * algorithm is wordpiece.c's) built from GGUF metadata. (Over 1,000 lines: the algorithms share
 * the vocabulary, merges and special-token tables they are built from.)
 *
 * Semantics follow llama.cpp's reading of the same GGUF keys (so that token ids match the
 * reference tokenizer the vocabulary files were tested with); docs/tokenizer.md lists the
 * few places where kvgen deliberately differs. The tokenizer is immutable after load, so
 * any number of threads may tokenize with it at once: every call allocates its own scratch. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_error.h"
#include "kvg_host.h"
#include "kvg_tokenizer.h"

enum { TT_UNDEFINED = 0, TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

#define MAX_REGEX 5
#define MAX_EOG 16
/* U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's visible space */
#define SPM_SPACE "\xE2\x96\x81"

typedef struct merge_slot {
    int32_t left, right; /* -1: empty */
    int32_t rank, result;
} merge_slot;

struct kvg_tokenizer {
    kvgen_tokenizer_kind kind;
    char *pre;
    int32_t n_vocab;
    char *pool;          /* every token's text, NUL-terminated, back to back */
    uint32_t *text_off;  /* n_vocab */
    uint32_t *text_len;  /* n_vocab */
    uint8_t *type;       /* n_vocab, TT_* */
    float *scores;       /* n_vocab (SPM only; zeros when the file has none) */
    int32_t *text_hash;  /* open addressing: token ids, -1 empty */
    uint32_t text_hash_mask;
    merge_slot *merges;  /* BPE: (left id, right id) -> rank, merged id */
    uint32_t merge_mask;
    int32_t byte_tok[256]; /* BPE: id of the byte's GPT-2 character; SPM: id of <0xNN> (or the byte itself) */
    uint16_t cp_to_byte[324]; /* BPE: GPT-2 character -> byte + 1 (0: not a byte character) */
    int32_t *special;    /* ids matched by KVGEN_TOKENIZE_SPECIAL, longest text first */
    int n_special;
    int n_user;          /* of those, user-defined ones (TT_USER): matched in any text */
    int32_t bos, eos, eot, eom, unk;
    int32_t eog[MAX_EOG];
    int n_eog;
    bool add_bos, add_space_prefix, ignore_merges;
    bool add_sep;        /* WordPiece: [SEP] closes what [CLS] opened (KVGEN_TOKENIZE_ADD_BOS) */
    kvg_wordpiece wpm;   /* WordPiece: how this vocabulary spells its pieces */
    pcre2_code *re[MAX_REGEX];
    int n_re;
    /* PCRE2's memory comes from the host's allocator through these (JIT code excepted: PCRE2
     * maps executable pages itself) */
    pcre2_general_context *re_mem;
    pcre2_compile_context *re_compile;
    kvg_token_bytes *bytes; /* every token's bytes (token_bytes.c): NULL until first asked, then set once (atomic) */
};

/* ---- small helpers ------------------------------------------------------------------- */

void kvg_utf8_scan(const unsigned char *s, size_t n, size_t *len, size_t *ok) {
    unsigned char c = s[0], lo = 0x80, hi = 0xBF;
    size_t want;
    if (c < 0x80) { *len = *ok = 1; return; }
    if (c >= 0xC2 && c <= 0xDF) want = 2;
    else if (c >= 0xE0 && c <= 0xEF) { want = 3; if (c == 0xE0) lo = 0xA0; else if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { want = 4; if (c == 0xF0) lo = 0x90; else if (c == 0xF4) hi = 0x8F; }
    else { *len = 1; *ok = 0; return; }
    size_t k = 1;
    for (; k < want && k < n; k++) {
        unsigned char b = s[k];
        if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) break;
    }
    *len = want;
    *ok = k;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_pair(int32_t a, int32_t b) {
    uint64_t h = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 31);
}

static const char *tok_text(const kvg_tokenizer *t, int32_t id) { return t->pool + t->text_off[id]; }

static int32_t find_text(const kvg_tokenizer *t, const char *s, size_t n) {
    for (uint64_t i = hash_bytes(s, n) & t->text_hash_mask;; i = (i + 1) & t->text_hash_mask) {
        int32_t id = t->text_hash[i];
        if (id < 0) return -1;
        if (t->text_len[id] == n && memcmp(tok_text(t, id), s, n) == 0) return id;
    }
}

static const merge_slot *find_merge(const kvg_tokenizer *t, int32_t a, int32_t b) {
    for (uint64_t i = hash_pair(a, b) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        const merge_slot *m = &t->merges[i];
        if (m->left < 0) return NULL;
        if (m->left == a && m->right == b) return m;
    }
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static size_t utf8_put(char *dst, uint32_t cp) {
    if (cp < 0x80) { dst[0] = (char)cp; return 1; }
    if (cp < 0x800) { dst[0] = (char)(0xC0 | cp >> 6); dst[1] = (char)(0x80 | (cp & 63)); return 2; }
    dst[0] = (char)(0xE0 | cp >> 12); dst[1] = (char)(0x80 | ((cp >> 6) & 63)); dst[2] = (char)(0x80 | (cp & 63));
    return 3;
}

/* GPT-2's reversible byte -> character map: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes are moved to U+0100.. in byte order. */
static uint32_t gpt2_byte_cp(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) n++;
    return 256 + n;
}

/* ---- pre-tokenizers -------------------------------------------------------------------- */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                                   \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}" \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                    \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"      \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct pre_def {
    const char *names[8];
    const char *regex[MAX_REGEX];
    bool ignore_merges, add_bos;
} pre_def;

/* Each regex splits every piece the previous one produced (matches and the gaps between
 * them both become pieces), as llama.cpp and Hugging Face's Sequence pre-tokenizer do. */
static const pre_def k_pre_defs[] = {
    {{"default"},
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, false, false},
    {{"gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jina-es", "jina-de"}, {RE_GPT2}, false, false},
    {{"starcoder", "smollm", "refact", "codeshell"}, {"\\p{N}", RE_GPT2}, false, false},
    {{"llama3", "llama-v3", "llama-bpe", "falcon3"}, {RE_LLAMA3}, true, true},
    {{"qwen2", "deepseek-r1-qwen"}, {RE_QWEN2}, false, false},
    /* the Split sequence of DeepSeek-Coder's tokenizer.json: newlines, letters and punctuation
     * with an optional leading space, runs of CJK (U+4E00-9FA5, U+0800-4E00, U+AC00-D7FF),
     * single digits */
    {{"deepseek-coder"},
     {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\\x{4e00}-\\x{9fa5}\\x{0800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+",
      "\\p{N}"},
     false, false},
    /* Falcon's: punctuation runs (with the backtick), the GPT-2 regex, then groups of 3 digits */
    {{"falcon"}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, false, false},
};

static const pre_def *find_pre(const char *name) {
    for (size_t i = 0; i < sizeof k_pre_defs / sizeof k_pre_defs[0]; i++)
        for (int j = 0; j < 8 && k_pre_defs[i].names[j]; j++)
            if (strcmp(k_pre_defs[i].names[j], name) == 0) return &k_pre_defs[i];
    return NULL;
}

/* ---- loading --------------------------------------------------------------------------- */

static bool read_int_array(const kvg_gguf *g, const char *key, uint64_t i, int64_t *out) {
    kvg_gguf_vtype et;
    uint64_t n;
    if (!kvg_gguf_get_arr(g, key, &et, &n) || i >= n) return false;
    const unsigned char *p = kvg_gguf_arr_data(g, key);
    if (!p) return false;
    switch (et) {
    case KVG_GGUF_INT8: { int8_t v; memcpy(&v, p + i, 1); *out = v; return true; }
    case KVG_GGUF_UINT8: { uint8_t v; memcpy(&v, p + i, 1); *out = v; return true; }
    case KVG_GGUF_INT16: { int16_t v; memcpy(&v, p + 2 * i, 2); *out = v; return true; }
    case KVG_GGUF_UINT16: { uint16_t v; memcpy(&v, p + 2 * i, 2); *out = v; return true; }
    case KVG_GGUF_INT32: { int32_t v; memcpy(&v, p + 4 * i, 4); *out = v; return true; }
    case KVG_GGUF_UINT32: { uint32_t v; memcpy(&v, p + 4 * i, 4); *out = v; return true; }
    default: return false;
    }
}

static bool is_int_type(kvg_gguf_vtype t) {
    return t == KVG_GGUF_INT8 || t == KVG_GGUF_UINT8 || t == KVG_GGUF_INT16 || t == KVG_GGUF_UINT16 ||
           t == KVG_GGUF_INT32 || t == KVG_GGUF_UINT32;
}

/* An optional token id key: absent leaves *out at -1; present must be an in-range integer. */
static kvgen_status read_id(const kvg_gguf *g, const char *key, int32_t n_vocab, int32_t *out, kvgen_error *err) {
    *out = -1;
    if (kvg_gguf_find_key(g, key) < 0) return KVGEN_OK;
    int64_t v;
    if (!kvg_gguf_get_i64(g, key, &v))
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s is not an integer", kvg_gguf_path(g), key);
    if (v < 0 || v >= n_vocab)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s = %lld is out of range (the vocabulary has %d tokens)",
                        kvg_gguf_path(g), key, (long long)v, (int)n_vocab);
    *out = (int32_t)v;
    return KVGEN_OK;
}

static kvgen_status read_bool(const kvg_gguf *g, const char *key, bool *inout, kvgen_error *err) {
    if (kvg_gguf_find_key(g, key) < 0) return KVGEN_OK;
    if (!kvg_gguf_get_bool(g, key, inout))
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s is not a boolean", kvg_gguf_path(g), key);
    return KVGEN_OK;
}

static kvgen_status load_tokens(kvg_tokenizer *t, const kvg_gguf *g, kvgen_error *err) {
    const char *path = kvg_gguf_path(g);
    const char *key = "tokenizer.ggml.tokens";
    kvg_gguf_vtype et;
    uint64_t n;
    if (!kvg_gguf_get_arr(g, key, &et, &n))
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s is missing or not an array", path, key);
    if (et != KVG_GGUF_STRING) return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s is not an array of strings", path, key);
    if (n == 0 || n > (uint64_t)INT32_MAX / 2)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s has %llu tokens", path, key, (unsigned long long)n);
    t->n_vocab = (int32_t)n;
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        kvg_str s = kvg_gguf_arr_str(g, key, i);
        if (!s.ptr && s.len) return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s[%llu] is unreadable", path, key,
                                            (unsigned long long)i);
        total += s.len + 1;
        if (total > UINT32_MAX)
            return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s holds more than 4 GiB of text", path, key);
    }
    t->pool = kvg_malloc(total);
    t->text_off = kvg_malloc(n * sizeof *t->text_off);
    t->text_len = kvg_malloc(n * sizeof *t->text_len);
    t->type = kvg_malloc(n);
    t->scores = kvg_calloc(n, sizeof *t->scores);
    uint32_t cap = pow2_at_least(2 * n);
    t->text_hash = kvg_malloc((size_t)cap * sizeof *t->text_hash);
    if (!t->pool || !t->text_off || !t->text_len || !t->type || !t->scores || !t->text_hash)
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for %llu tokens", path, (unsigned long long)n);
    t->text_hash_mask = cap - 1;
    memset(t->text_hash, 0xff, (size_t)cap * sizeof *t->text_hash);
    uint32_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        kvg_str s = kvg_gguf_arr_str(g, key, i);
        if (s.len) memcpy(t->pool + off, s.ptr, s.len);
        t->pool[off + s.len] = 0;
        t->text_off[i] = off;
        t->text_len[i] = (uint32_t)s.len;
        off += (uint32_t)s.len + 1;
        /* a text that appears twice maps to its last id, as in llama.cpp */
        for (uint64_t h = hash_bytes(s.ptr, s.len) & t->text_hash_mask;; h = (h + 1) & t->text_hash_mask) {
            int32_t id = t->text_hash[h];
            if (id < 0 || (t->text_len[id] == s.len && memcmp(tok_text(t, id), s.ptr, s.len) == 0)) {
                t->text_hash[h] = (int32_t)i;
                break;
            }
        }
    }

    key = "tokenizer.ggml.token_type";
    memset(t->type, TT_NORMAL, n);
    if (kvg_gguf_find_key(g, key) >= 0) {
        uint64_t m;
        if (!kvg_gguf_get_arr(g, key, &et, &m) || !is_int_type(et))
            return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s is not an array of integers", path, key);
        if (m != n)
            return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s has %llu entries but there are %llu tokens", path, key,
                            (unsigned long long)m, (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) {
            int64_t v = -1;
            if (!read_int_array(g, key, i, &v) || v < TT_UNDEFINED || v > TT_BYTE)
                return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s[%llu] = %lld is not a token type (0..6)", path, key,
                                (unsigned long long)i, (long long)v);
            t->type[i] = (uint8_t)v;
        }
    }

    key = "tokenizer.ggml.scores";
    if (kvg_gguf_find_key(g, key) >= 0) {
        uint64_t m;
        const unsigned char *p = NULL;
        if (kvg_gguf_get_arr(g, key, &et, &m) && et == KVG_GGUF_FLOAT32) p = kvg_gguf_arr_data(g, key);
        if (!p) return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s is not an array of float32", path, key);
        if (m != n)
            return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s has %llu entries but there are %llu tokens", path, key,
                            (unsigned long long)m, (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) {
            memcpy(&t->scores[i], p + 4 * i, 4);
            if (isnan(t->scores[i]))
                return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s[%llu] is NaN", path, key, (unsigned long long)i);
        }
    }
    return KVGEN_OK;
}

static kvgen_status load_merges(kvg_tokenizer *t, const kvg_gguf *g, kvgen_error *err) {
    const char *path = kvg_gguf_path(g);
    const char *key = "tokenizer.ggml.merges";
    kvg_gguf_vtype et;
    uint64_t n;
    if (!kvg_gguf_get_arr(g, key, &et, &n))
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s is missing (a gpt2 tokenizer needs its merges)", path, key);
    if (et != KVG_GGUF_STRING) return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s is not an array of strings", path, key);
    if (n > (uint64_t)INT32_MAX / 4)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: %s has %llu entries", path, key, (unsigned long long)n);
    uint32_t cap = pow2_at_least(2 * n + 1);
    t->merges = kvg_malloc((size_t)cap * sizeof *t->merges);
    if (!t->merges) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for %s", path, key);
    t->merge_mask = cap - 1;
    for (uint32_t i = 0; i < cap; i++) t->merges[i].left = -1;
    char *joined = NULL;
    size_t joined_cap = 0;
    kvgen_status st = KVGEN_OK;
    for (uint64_t i = 0; i < n && st == KVGEN_OK; i++) {
        kvg_str s = kvg_gguf_arr_str(g, key, i);
        int show = s.len > 64 ? 64 : (int)s.len;
        /* the separator is the first space after the first byte, so "  x" splits as " " + "x" */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp || (uint64_t)(sp - s.ptr) + 1 >= s.len) {
            st = kvg_fail(err, KVGEN_E_FORMAT, "%s: %s[%llu] '%.*s' is not two tokens separated by a space", path,
                          key, (unsigned long long)i, show, s.ptr ? s.ptr : "");
            break;
        }
        size_t la = (size_t)(sp - s.ptr), lb = s.len - la - 1;
        int32_t a = find_text(t, s.ptr, la), b = find_text(t, sp + 1, lb);
        if (joined_cap < la + lb) {
            kvg_free(joined);
            joined_cap = 2 * (la + lb);
            joined = kvg_malloc(joined_cap);
            if (!joined) { st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", path); break; }
        }
        memcpy(joined, s.ptr, la);
        memcpy(joined + la, sp + 1, lb);
        int32_t r = find_text(t, joined, la + lb);
        if (a < 0 || b < 0 || r < 0) {
            st = kvg_fail(err, KVGEN_E_FORMAT, "%s: %s[%llu] '%.*s': %s is not in the vocabulary", path, key,
                          (unsigned long long)i, show, s.ptr,
                          a < 0 ? "its first part" : b < 0 ? "its second part" : "the merged token");
            break;
        }
        /* a pair listed twice keeps its first (best) rank */
        for (uint64_t h = hash_pair(a, b) & t->merge_mask;; h = (h + 1) & t->merge_mask) {
            merge_slot *m = &t->merges[h];
            if (m->left < 0) {
                *m = (merge_slot){a, b, (int32_t)i, r};
                break;
            }
            if (m->left == a && m->right == b) break;
        }
    }
    kvg_free(joined);
    return st;
}

/* longest text first, then lowest id: the order in which special texts are matched */
static bool special_before(const kvg_tokenizer *t, int32_t a, int32_t b) {
    if (t->text_len[a] != t->text_len[b]) return t->text_len[a] > t->text_len[b];
    return a < b;
}

static void sort_specials(kvg_tokenizer *t) {
    /* insertion sort would be quadratic for vocabularies with thousands of added tokens */
    int n = t->n_special;
    int32_t *a = t->special, *tmp = kvg_malloc((size_t)n * sizeof *tmp);
    if (!tmp) return; /* unsorted only loses longest-first on allocation failure; still correct ids */
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = special_before(t, a[j], a[i]) ? a[j++] : a[i++];
            while (i < mid) tmp[k++] = a[i++];
            while (j < hi) tmp[k++] = a[j++];
        }
        memcpy(a, tmp, (size_t)n * sizeof *a);
    }
    kvg_free(tmp);
}

static const char *const k_eog_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                          "<|endoftext|>", "</s>", "<|end_of_text|>", "<|eom_id|>"};

static void add_eog(kvg_tokenizer *t, int32_t id) {
    if (id < 0 || t->n_eog >= MAX_EOG) return;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return;
    t->eog[t->n_eog++] = id;
}

static void *re_alloc(PCRE2_SIZE size, void *user) {
    (void)user;
    return kvg_malloc(size);
}

static void re_release(void *ptr, void *user) {
    (void)user;
    kvg_free(ptr);
}

static kvgen_status compile_regexes(kvg_tokenizer *t, const pre_def *d, const char *path, kvgen_error *err) {
    if (d->regex[0]) {
        t->re_mem = pcre2_general_context_create(re_alloc, re_release, NULL);
        t->re_compile = t->re_mem ? pcre2_compile_context_create(t->re_mem) : NULL;
        if (!t->re_compile) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for the pre-tokenizer", path);
    }
    for (int i = 0; i < MAX_REGEX && d->regex[i]; i++) {
        int ec;
        PCRE2_SIZE eo;
        t->re[i] = pcre2_compile((PCRE2_SPTR)d->regex[i], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo,
                                 t->re_compile);
        if (!t->re[i]) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(ec, msg, sizeof msg);
            return kvg_fail(err, KVGEN_E_INTERNAL, "%s: pre-tokenizer regex %d does not compile: %s", path, i,
                            (const char *)msg);
        }
        /* JIT is an optimisation only: without it (or if it fails) the interpreter runs */
        (void)pcre2_jit_compile(t->re[i], PCRE2_JIT_COMPLETE);
        t->n_re = i + 1;
    }
    return KVGEN_OK;
}

/* ---- WordPiece's vocabulary ---- */

static int32_t wpm_find(const void *ctx, const char *s, size_t n) { return find_text(ctx, s, n); }

/* How the vocabulary spells pieces: llama.cpp's converter marks word starts with U+2581 and
 * leaves continuations bare; Hugging Face's files mark continuations with "##". An uncased
 * vocabulary (no upper-case ASCII letter in any ordinary piece) asks for lower-cased text. */
static kvgen_status wordpiece_setup(kvg_tokenizer *t, const kvg_gguf *g, kvgen_error *err) {
    (void)g;
    (void)err;
    bool upper = false, phantom = false;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->type[i] != TT_NORMAL) continue;
        const char *s = tok_text(t, i);
        uint32_t n = t->text_len[i];
        if (n >= 3 && memcmp(s, SPM_SPACE, 3) == 0) phantom = true;
        for (uint32_t k = 0; k < n && !upper; k++) upper = s[k] >= 'A' && s[k] <= 'Z';
    }
    t->wpm = (kvg_wordpiece){.lowercase = !upper, .phantom = phantom, .unk = -1, .find = wpm_find, .ctx = t};
    t->add_bos = true; /* [CLS] ... [SEP], as BERT was trained */
    t->add_sep = true;
    return KVGEN_OK;
}

/* [CLS], [SEP] and [UNK]: the file's ids (cls_token_id, seperator_token_id as llama.cpp spells
 * it, unknown_token_id), else the pieces of those names */
static kvgen_status wordpiece_ids(kvg_tokenizer *t, const kvg_gguf *g, kvgen_error *err) {
    const char *path = kvg_gguf_path(g);
    kvgen_status st;
    int32_t cls = -1, sep = -1;
    if ((st = read_id(g, "tokenizer.ggml.cls_token_id", t->n_vocab, &cls, err)) != KVGEN_OK ||
        (st = read_id(g, "tokenizer.ggml.seperator_token_id", t->n_vocab, &sep, err)) != KVGEN_OK)
        return st;
    if (cls < 0) cls = t->bos >= 0 ? t->bos : find_text(t, "[CLS]", 5);
    if (sep < 0) sep = t->eos >= 0 ? t->eos : find_text(t, "[SEP]", 5);
    if (t->unk < 0) t->unk = find_text(t, "[UNK]", 5);
    if (t->unk < 0)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: a WordPiece vocabulary needs an unknown token "
                        "(tokenizer.ggml.unknown_token_id or a piece [UNK])", path);
    t->bos = cls;
    t->eos = sep;
    t->wpm.unk = t->unk;
    if (cls < 0 || sep < 0) t->add_sep = false;
    return KVGEN_OK;
}

kvgen_status kvg_tokenizer_load(const kvg_gguf *g, kvg_tokenizer **out, kvgen_error *err) {
    *out = NULL;
    const char *path = kvg_gguf_path(g);
    kvg_str model;
    if (kvg_gguf_find_key(g, "tokenizer.ggml.model") < 0)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: tokenizer.ggml.model is missing (the file has no tokenizer)", path);
    if (!kvg_gguf_get_str(g, "tokenizer.ggml.model", &model))
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: tokenizer.ggml.model is not a string", path);
    /* the tokenizer table: tokenizer.ggml.model -> the algorithm */
    static const struct { const char *name; kvgen_tokenizer_kind kind; } models[] = {
        {"gpt2", KVGEN_TOKENIZER_BPE}, {"llama", KVGEN_TOKENIZER_SPM}, {"bert", KVGEN_TOKENIZER_WPM}};
    kvgen_tokenizer_kind kind = 0;
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        if (model.len == strlen(models[i].name) && memcmp(model.ptr, models[i].name, model.len) == 0)
            kind = models[i].kind;
    if (!kind)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: tokenizer model '%.*s' is not supported (kvgen reads 'gpt2', "
                        "'llama' and 'bert')", path, model.len > 64 ? 64 : (int)model.len, model.ptr);

    kvg_str pre = {"default", 7};
    if (kvg_gguf_find_key(g, "tokenizer.ggml.pre") >= 0 && !kvg_gguf_get_str(g, "tokenizer.ggml.pre", &pre))
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: tokenizer.ggml.pre is not a string", path);

    kvg_tokenizer *t = kvg_calloc(1, sizeof *t);
    if (!t) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", path);
    t->kind = kind;
    t->pre = kvg_malloc(pre.len + 1);
    kvgen_status st = KVGEN_OK;
    if (!t->pre) { st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", path); goto fail; }
    memcpy(t->pre, pre.ptr, pre.len);
    t->pre[pre.len] = 0;

    if ((st = load_tokens(t, g, err)) != KVGEN_OK) goto fail;
    for (int b = 0; b < 256; b++) t->byte_tok[b] = -1;

    if (kind == KVGEN_TOKENIZER_BPE) {
        const pre_def *d = strlen(t->pre) == pre.len ? find_pre(t->pre) : NULL;
        if (!d) {
            st = kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: pre-tokenizer '%s' (tokenizer.ggml.pre) is not supported",
                          path, t->pre);
            goto fail;
        }
        t->ignore_merges = d->ignore_merges;
        t->add_bos = d->add_bos;
        if ((st = compile_regexes(t, d, path, err)) != KVGEN_OK) goto fail;
        if ((st = load_merges(t, g, err)) != KVGEN_OK) goto fail;
        for (unsigned b = 0; b < 256; b++) {
            char u[4];
            uint32_t cp = gpt2_byte_cp(b);
            t->byte_tok[b] = find_text(t, u, utf8_put(u, cp));
            t->cp_to_byte[cp] = (uint16_t)(b + 1);
        }
    } else if (kind == KVGEN_TOKENIZER_WPM) {
        if ((st = wordpiece_setup(t, g, err)) != KVGEN_OK) goto fail;
    } else {
        t->add_bos = true;
        t->add_space_prefix = true;
        for (unsigned b = 0; b < 256; b++) {
            char name[8];
            static const char hex[] = "0123456789ABCDEF";
            memcpy(name, "<0x", 3);
            name[3] = hex[b >> 4];
            name[4] = hex[b & 15];
            name[5] = '>';
            t->byte_tok[b] = find_text(t, name, 6);
            if (t->byte_tok[b] < 0) {
                char c = (char)b;
                t->byte_tok[b] = find_text(t, &c, 1);
            }
        }
    }
    if ((st = read_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err)) != KVGEN_OK) goto fail;
    if ((st = read_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err)) != KVGEN_OK) goto fail;
    if ((st = read_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos, err)) != KVGEN_OK) goto fail;
    if ((st = read_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos, err)) != KVGEN_OK) goto fail;
    if ((st = read_id(g, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot, err)) != KVGEN_OK) goto fail;
    if ((st = read_id(g, "tokenizer.ggml.eom_token_id", t->n_vocab, &t->eom, err)) != KVGEN_OK) goto fail;
    if ((st = read_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk, err)) != KVGEN_OK) goto fail;
    if (kind == KVGEN_TOKENIZER_WPM && (st = wordpiece_ids(t, g, err)) != KVGEN_OK) goto fail;
    if (t->add_bos && t->bos < 0) t->add_bos = false;

    /* control-token texts that end a turn; also names the EOT token when the file does not */
    const size_t n_eog_texts = sizeof k_eog_texts / sizeof k_eog_texts[0];
    for (size_t k = 0; k < n_eog_texts; k++) {
        int32_t id = find_text(t, k_eog_texts[k], strlen(k_eog_texts[k]));
        if (id < 0 || t->type[id] != TT_CONTROL) continue;
        add_eog(t, id);
        if (t->eot < 0 && strcmp(k_eog_texts[k], "</s>") != 0 && strcmp(k_eog_texts[k], "<|eom_id|>") != 0)
            t->eot = id;
    }
    add_eog(t, t->eos);
    add_eog(t, t->eot);
    add_eog(t, t->eom);

    for (int32_t i = 0; i < t->n_vocab; i++)
        if ((t->type[i] == TT_CONTROL || t->type[i] == TT_USER || t->type[i] == TT_UNKNOWN) && t->text_len[i] > 0)
            t->n_special++;
    if (t->n_special) {
        t->special = kvg_malloc((size_t)t->n_special * sizeof *t->special);
        if (!t->special) { st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", path); goto fail; }
        int k = 0;
        for (int32_t i = 0; i < t->n_vocab; i++)
            if ((t->type[i] == TT_CONTROL || t->type[i] == TT_USER || t->type[i] == TT_UNKNOWN) && t->text_len[i] > 0) {
                t->special[k++] = i;
                t->n_user += t->type[i] == TT_USER;
            }
        sort_specials(t);
    }
    *out = t;
    return KVGEN_OK;
fail:
    kvg_tokenizer_free(t);
    return st;
}

void kvg_tokenizer_free(kvg_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    pcre2_compile_context_free(t->re_compile);
    pcre2_general_context_free(t->re_mem);
    kvg_free(t->pre);
    kvg_free(t->pool);
    kvg_free(t->text_off);
    kvg_free(t->text_len);
    kvg_free(t->type);
    kvg_free(t->scores);
    kvg_free(t->text_hash);
    kvg_free(t->merges);
    kvg_free(t->special);
    kvg_token_bytes_free(t->bytes);
    kvg_free(t);
}

/* the table of every token's bytes is token_bytes.c's; the tokenizer keeps and frees it */
kvg_token_bytes **kvg_tokenizer_bytes_slot(const kvg_tokenizer *t) { return &((kvg_tokenizer *)t)->bytes; }

void kvg_token_bytes_free(kvg_token_bytes *b) {
    if (!b) return;
    kvg_free(b->off);
    kvg_free(b->bytes);
    kvg_free(b);
}

kvgen_tokenizer_kind kvg_tokenizer_kind(const kvg_tokenizer *t) { return t->kind; }
const char *kvg_tokenizer_pre(const kvg_tokenizer *t) { return t->pre; }
int32_t kvg_tokenizer_n_vocab(const kvg_tokenizer *t) { return t->n_vocab; }
int32_t kvg_tokenizer_bos(const kvg_tokenizer *t) { return t->bos; }
int32_t kvg_tokenizer_eos(const kvg_tokenizer *t) { return t->eos; }
int32_t kvg_tokenizer_eot(const kvg_tokenizer *t) { return t->eot; }
int kvg_tokenizer_add_bos(const kvg_tokenizer *t) { return t->add_bos; }
int kvg_tokenizer_strips_leading_space(const kvg_tokenizer *t) {
    return (t->kind == KVGEN_TOKENIZER_SPM && t->add_space_prefix) || t->kind == KVGEN_TOKENIZER_WPM;
}

int kvg_token_is_eog(const kvg_tokenizer *t, int32_t token) {
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == token) return 1;
    return 0;
}

int kvg_token_is_control(const kvg_tokenizer *t, int32_t token) {
    return token >= 0 && token < t->n_vocab && t->type[token] == TT_CONTROL;
}

int32_t kvg_token_find(const kvg_tokenizer *t, const char *text) { return text ? find_text(t, text, strlen(text)) : -1; }

/* ---- pieces ---------------------------------------------------------------------------- */

static size_t put_bytes(char *buf, size_t size, size_t at, const char *src, size_t n) {
    if (at < size) memcpy(buf + at, src, n < size - at ? n : size - at);
    return at + n;
}

size_t kvg_token_piece(const kvg_tokenizer *t, int32_t token, unsigned flags, char *buf, size_t size) {
    if (token < 0 || token >= t->n_vocab) return 0;
    const char *s = tok_text(t, token);
    size_t n = t->text_len[token], len = 0;
    switch (t->type[token]) {
    case TT_CONTROL:
    case TT_UNKNOWN:
        if (flags & KVGEN_TOKENIZE_SPECIAL) len = put_bytes(buf, size, 0, s, n);
        break;
    case TT_USER: len = put_bytes(buf, size, 0, s, n); break;
    case TT_NORMAL:
    case TT_BYTE:
        if (t->kind == KVGEN_TOKENIZER_SPM && t->type[token] == TT_BYTE) {
            unsigned v = 0;
            bool ok = n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>';
            for (size_t i = 3; ok && i < 5; i++) {
                char c = s[i];
                unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                           : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                           : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10) : 16u;
                ok = d < 16;
                v = v * 16 + d;
            }
            if (ok) {
                char c = (char)v;
                len = put_bytes(buf, size, 0, &c, 1);
            } else {
                len = put_bytes(buf, size, 0, s, n);
            }
        } else if (t->kind == KVGEN_TOKENIZER_WPM && !t->wpm.phantom) {
            /* Hugging Face's spelling: a continuation joins its word, a start begins a new one */
            if (n >= 2 && memcmp(s, "##", 2) == 0) len = put_bytes(buf, size, 0, s + 2, n - 2);
            else len = put_bytes(buf, size, put_bytes(buf, size, 0, " ", 1), s, n);
        } else if (t->kind == KVGEN_TOKENIZER_SPM || t->kind == KVGEN_TOKENIZER_WPM) {
            for (size_t i = 0; i < n;) {
                if (n - i >= 3 && memcmp(s + i, SPM_SPACE, 3) == 0) {
                    len = put_bytes(buf, size, len, " ", 1);
                    i += 3;
                } else {
                    len = put_bytes(buf, size, len, s + i, 1);
                    i++;
                }
            }
        } else {
            /* byte-level BPE: every character stands for one byte; others pass through as is */
            for (size_t i = 0; i < n;) {
                size_t cl, ok;
                kvg_utf8_scan((const unsigned char *)s + i, n - i, &cl, &ok);
                uint32_t cp = 0;
                if (ok == cl && cl <= 2) {
                    cp = cl == 1 ? (unsigned char)s[i]
                                 : ((uint32_t)((unsigned char)s[i] & 0x1F) << 6) | ((unsigned char)s[i + 1] & 0x3F);
                }
                if (ok == cl && cp < sizeof t->cp_to_byte / sizeof t->cp_to_byte[0] && t->cp_to_byte[cp]) {
                    char c = (char)(t->cp_to_byte[cp] - 1);
                    len = put_bytes(buf, size, len, &c, 1);
                    i += cl;
                } else {
                    size_t step = ok == cl ? cl : 1;
                    len = put_bytes(buf, size, len, s + i, step);
                    i += step;
                }
            }
        }
        break;
    default: break; /* unused and undefined tokens have no text */
    }
    if (len < size) buf[len] = 0;
    return len;
}

/* ---- encoding -------------------------------------------------------------------------- */

typedef struct enc {
    const kvg_tokenizer *t;
    int32_t *out;
    size_t cap, n;
    pcre2_match_data *md;
    kvgen_status st;
    kvgen_error *err;
    /* scratch reused across words */
    struct sym { int32_t id; int32_t prev, next; uint32_t off, len; } *syms;
    size_t syms_cap;
    struct bigram { float score; int32_t rank; int32_t left, right; int32_t a, b; uint32_t size; } *heap;
    size_t heap_n, heap_cap;
    char *buf;
    size_t buf_cap;
} enc;

static void emit(enc *e, int32_t id) {
    if (e->n < e->cap) e->out[e->n] = id;
    e->n++;
}

static void wpm_emit(void *e, int32_t id) { emit(e, id); }

static bool enc_reserve(enc *e, size_t n_syms, size_t n_buf) {
    if (n_syms > e->syms_cap) {
        kvg_free(e->syms);
        kvg_free(e->heap);
        e->syms_cap = n_syms;
        e->heap_cap = 4 * n_syms + 8; /* each merge pushes at most two bigrams */
        e->syms = kvg_malloc(e->syms_cap * sizeof *e->syms);
        e->heap = kvg_malloc(e->heap_cap * sizeof *e->heap);
        if (!e->syms || !e->heap) {
            e->syms_cap = e->heap_cap = 0;
            return false;
        }
    }
    if (n_buf > e->buf_cap) {
        kvg_free(e->buf);
        e->buf_cap = n_buf;
        e->buf = kvg_malloc(n_buf);
        if (!e->buf) {
            e->buf_cap = 0;
            return false;
        }
    }
    return true;
}

/* BPE pops the lowest rank, SPM the highest score; both break ties by the leftmost pair. */
static bool bigram_before(const enc *e, const struct bigram *x, const struct bigram *y) {
    if (e->t->kind == KVGEN_TOKENIZER_BPE) {
        if (x->rank != y->rank) return x->rank < y->rank;
    } else if (x->score != y->score) {
        return x->score > y->score;
    }
    return x->left < y->left;
}

static void heap_push(enc *e, struct bigram b) {
    if (e->heap_n == e->heap_cap) {
        size_t nc = 2 * e->heap_cap + 8;
        struct bigram *nh = kvg_realloc(e->heap, nc * sizeof *nh);
        if (!nh) {
            e->st = KVGEN_E_NO_MEMORY;
            return;
        }
        e->heap = nh;
        e->heap_cap = nc;
    }
    size_t i = e->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_before(e, &b, &e->heap[p])) break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = b;
}

static struct bigram heap_pop(enc *e) {
    struct bigram top = e->heap[0], last = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bigram_before(e, &e->heap[c + 1], &e->heap[c])) c++;
        if (!bigram_before(e, &e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n) e->heap[i] = last;
    return top;
}

static void bpe_try_pair(enc *e, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const merge_slot *m = e->syms[l].id >= 0 && e->syms[r].id >= 0 ? find_merge(e->t, e->syms[l].id, e->syms[r].id)
                                                                  : NULL;
    if (!m) return;
    heap_push(e, (struct bigram){0.0f, m->rank, l, r, e->syms[l].id, e->syms[r].id, 0});
}

/* One pre-tokenized word: bytes -> GPT-2 characters -> merges applied lowest rank first. */
static void bpe_word(enc *e, const char *w, size_t n) {
    const kvg_tokenizer *t = e->t;
    if (n == 0) return;
    if (!enc_reserve(e, n, 2 * n)) {
        e->st = KVGEN_E_NO_MEMORY;
        return;
    }
    if (t->ignore_merges) {
        size_t bl = 0;
        for (size_t i = 0; i < n; i++) bl += utf8_put(e->buf + bl, gpt2_byte_cp((unsigned char)w[i]));
        int32_t id = find_text(t, e->buf, bl);
        if (id >= 0) {
            emit(e, id);
            return;
        }
    }
    for (size_t i = 0; i < n; i++)
        e->syms[i] = (struct sym){t->byte_tok[(unsigned char)w[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1,
                                  (uint32_t)i, 1};
    e->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++) bpe_try_pair(e, (int32_t)i, (int32_t)i + 1);
    while (e->heap_n && e->st == KVGEN_OK) {
        struct bigram b = heap_pop(e);
        struct sym *l = &e->syms[b.left], *r = &e->syms[b.right];
        if (l->len == 0 || r->len == 0 || l->next != b.right || l->id != b.a || r->id != b.b) continue;
        l->id = find_merge(t, b.a, b.b)->result;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) e->syms[r->next].prev = b.left;
        bpe_try_pair(e, l->prev, b.left);
        bpe_try_pair(e, b.left, l->next);
    }
    for (int32_t i = 0; i >= 0; i = e->syms[i].next) {
        const struct sym *s = &e->syms[i];
        if (s->id >= 0) {
            emit(e, s->id);
            continue;
        }
        /* a byte whose character is not in the vocabulary: try its UTF-8 bytes as one-byte
         * tokens, as llama.cpp does, and drop what has no token */
        char u[4];
        size_t ul = utf8_put(u, gpt2_byte_cp((unsigned char)w[s->off]));
        for (size_t k = 0; k < ul; k++) {
            int32_t id = find_text(t, &u[k], 1);
            if (id >= 0) emit(e, id);
        }
    }
}

static void split_regex(enc *e, int stage, const char *s, size_t n);

static void split_piece(enc *e, int stage, const char *s, size_t n) {
    if (stage + 1 < e->t->n_re) split_regex(e, stage + 1, s, n);
    else bpe_word(e, s, n);
}

static void split_regex(enc *e, int stage, const char *s, size_t n) {
    size_t at = 0;
    while (at < n && e->st == KVGEN_OK) {
        int rc = pcre2_match(e->t->re[stage], (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, e->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(e->t->re[stage], (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            e->st = kvg_fail(e->err, KVGEN_E_INTERNAL, "tokenizer: pre-tokenizer regex failed: %s", (const char *)msg);
            return;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* cannot happen with kvgen's patterns; step one character to stay finite */
            size_t cl, ok;
            kvg_utf8_scan((const unsigned char *)s + at, n - at, &cl, &ok);
            me = at + (ok ? ok : 1);
            ms = at;
        }
        if (ms > at) split_piece(e, stage, s + at, ms - at);
        split_piece(e, stage, s + ms, me - ms);
        at = me;
    }
    if (at < n && e->st == KVGEN_OK) split_piece(e, stage, s + at, n - at);
}

/* Text that is not valid UTF-8 cannot go through the UTF regexes: every invalid byte becomes
 * a word of its own, so any byte string still encodes (and decodes back) exactly. */
static void bpe_fragment(enc *e, const char *s, size_t n) {
    size_t run = 0, i = 0;
    while (i < n && e->st == KVGEN_OK) {
        size_t cl, ok;
        kvg_utf8_scan((const unsigned char *)s + i, n - i, &cl, &ok);
        if (ok == cl) {
            i += cl;
            continue;
        }
        if (i > run) split_regex(e, 0, s + run, i - run);
        bpe_word(e, s + i, 1);
        run = ++i;
    }
    if (n > run && e->st == KVGEN_OK) split_regex(e, 0, s + run, n - run);
}

static void spm_try_pair(enc *e, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    uint32_t size = e->syms[l].len + e->syms[r].len;
    int32_t id = find_text(e->t, e->buf + e->syms[l].off, size);
    if (id < 0) return;
    heap_push(e, (struct bigram){e->t->scores[id], 0, l, r, 0, 0, size});
}

/* One stretch of raw text: spaces become U+2581, then adjacent pieces merge while their
 * concatenation is a token, highest score first; leftovers fall back to byte tokens. */
static void spm_fragment(enc *e, const char *s, size_t n, bool prefix) {
    const kvg_tokenizer *t = e->t;
    size_t cap = 3 * n + 3;
    if (!enc_reserve(e, cap, cap)) {
        e->st = KVGEN_E_NO_MEMORY;
        return;
    }
    size_t bl = 0;
    if (prefix) { memcpy(e->buf, SPM_SPACE, 3); bl = 3; }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') { memcpy(e->buf + bl, SPM_SPACE, 3); bl += 3; }
        else e->buf[bl++] = s[i];
    }
    if (bl == 0) return;
    /* symbols are UTF-8 characters by their lead byte, clipped at the end; stray bytes stand alone */
    int32_t ns = 0;
    for (size_t off = 0; off < bl; ns++) {
        unsigned char c = (unsigned char)e->buf[off];
        size_t len = c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (len > bl - off) len = bl - off;
        e->syms[ns] = (struct sym){-1, ns - 1, -1, (uint32_t)off, (uint32_t)len};
        off += len;
        if (off < bl) e->syms[ns].next = ns + 1;
    }
    e->heap_n = 0;
    for (int32_t i = 1; i < ns; i++) spm_try_pair(e, i - 1, i);
    while (e->heap_n && e->st == KVGEN_OK) {
        struct bigram b = heap_pop(e);
        struct sym *l = &e->syms[b.left], *r = &e->syms[b.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != b.size) continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) e->syms[r->next].prev = b.left;
        spm_try_pair(e, l->prev, b.left);
        spm_try_pair(e, b.left, l->next);
    }
    for (int32_t i = 0; i >= 0 && e->st == KVGEN_OK; i = e->syms[i].next) {
        const struct sym *sy = &e->syms[i];
        int32_t id = find_text(t, e->buf + sy->off, sy->len);
        if (id >= 0) {
            emit(e, id);
            continue;
        }
        for (uint32_t k = 0; k < sy->len; k++) {
            unsigned char c = (unsigned char)e->buf[sy->off + k];
            int32_t bt = t->byte_tok[c] >= 0 ? t->byte_tok[c] : t->unk;
            if (bt < 0) {
                e->st = kvg_fail(e->err, KVGEN_E_UNSUPPORTED,
                                 "tokenizer: byte 0x%02X has no <0x%02X> token and the vocabulary has no unknown token",
                                 c, c);
                return;
            }
            emit(e, bt);
        }
    }
}

typedef struct frag { size_t off, len; int32_t token; } frag; /* token -1: raw text */

/* Splits the text around special-token texts, longest token first over the whole text (so
 * a longer token wins wherever it occurs), the way llama.cpp partitions its input. User-defined
 * tokens (runs of spaces or newlines, tool tags: added tokens the vocabulary marks TT_USER) are
 * always matched, as Hugging Face's added tokens are; control and unknown tokens only with
 * `control` (KVGEN_TOKENIZE_SPECIAL), so text from a player can never produce one, and never
 * over a byte that `content` (NULL: none) flags. */
static bool any_flag(const unsigned char *flags, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (flags[i]) return true;
    return false;
}

static kvgen_status partition_special(const kvg_tokenizer *t, const char *text, size_t len, bool control,
                                      const unsigned char *content, frag **out, size_t *n_out) {
    size_t n = 1, cap = 16;
    frag *f = kvg_malloc(cap * sizeof *f);
    if (!f) return KVGEN_E_NO_MEMORY;
    f[0] = (frag){0, len, -1};
    for (int k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        if (!control && t->type[id] != TT_USER) continue;
        const char *st = tok_text(t, id);
        size_t sl = t->text_len[id];
        bool guarded = content && t->type[id] != TT_USER;
        for (size_t i = 0; i < n; i++) {
            if (f[i].token >= 0 || f[i].len < sl) continue;
            const char *base = text + f[i].off;
            size_t fl = f[i].len, pos = 0;
            const char *hit = NULL;
            for (; pos + sl <= fl; pos++) {
                if (base[pos] == st[0] && memcmp(base + pos, st, sl) == 0 &&
                    !(guarded && any_flag(content + f[i].off + pos, sl))) {
                    hit = base + pos;
                    break;
                }
            }
            if (!hit) continue;
            /* fragment i becomes: [before] token [after]; `after` is scanned next iteration */
            if (n + 2 > cap) {
                cap *= 2;
                frag *nf = kvg_realloc(f, cap * sizeof *nf);
                if (!nf) { kvg_free(f); return KVGEN_E_NO_MEMORY; }
                f = nf;
            }
            size_t before = pos, after = fl - pos - sl, off = f[i].off;
            size_t add = (before ? 1 : 0) + (after ? 1 : 0);
            memmove(&f[i + 1 + add], &f[i + 1], (n - i - 1) * sizeof *f);
            size_t j = i;
            if (before) f[j++] = (frag){off, before, -1};
            f[j++] = (frag){off + pos, sl, id};
            if (after) f[j] = (frag){off + pos + sl, after, -1};
            n += add;
            i = j - 1; /* the loop's i++ lands on `after` */
        }
    }
    *out = f;
    *n_out = n;
    return KVGEN_OK;
}

kvgen_status kvg_tokenize(const kvg_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t *out,
                          size_t cap, size_t *n_tokens, kvgen_error *err) {
    return kvg_tokenize_marked(t, text, len, flags, NULL, out, cap, n_tokens, err);
}

kvgen_status kvg_tokenize_marked(const kvg_tokenizer *t, const char *text, size_t len, unsigned flags,
                                 const unsigned char *content, int32_t *out, size_t cap, size_t *n_tokens,
                                 kvgen_error *err) {
    enc e = {0};
    e.t = t;
    e.out = out;
    e.cap = out ? cap : 0;
    e.err = err;
    if (n_tokens) *n_tokens = 0;
    if ((flags & KVGEN_TOKENIZE_ADD_BOS) && t->add_bos && t->bos >= 0) emit(&e, t->bos);
    frag one = {0, len, -1}, *frags = &one;
    size_t n_frags = len ? 1 : 0;
    if (len && ((flags & KVGEN_TOKENIZE_SPECIAL) ? t->n_special : t->n_user)) {
        if (partition_special(t, text, len, (flags & KVGEN_TOKENIZE_SPECIAL) != 0, content, &frags, &n_frags) != KVGEN_OK)
            return kvg_fail(err, KVGEN_E_NO_MEMORY, "tokenizer: out of memory");
    }
    if (t->kind == KVGEN_TOKENIZER_BPE && n_frags) {
        e.md = pcre2_match_data_create(1, t->re_mem);
        if (!e.md) e.st = KVGEN_E_NO_MEMORY;
    }
    bool prev_special = true; /* SentencePiece prefixes a space at the start and after special tokens */
    for (size_t i = 0; i < n_frags && e.st == KVGEN_OK; i++) {
        if (frags[i].token >= 0) {
            emit(&e, frags[i].token);
            prev_special = true;
        } else if (t->kind == KVGEN_TOKENIZER_BPE) {
            bpe_fragment(&e, text + frags[i].off, frags[i].len);
        } else if (t->kind == KVGEN_TOKENIZER_WPM) {
            if (!kvg_wordpiece_encode(&t->wpm, text + frags[i].off, frags[i].len, wpm_emit, &e))
                e.st = KVGEN_E_NO_MEMORY;
        } else {
            spm_fragment(&e, text + frags[i].off, frags[i].len, t->add_space_prefix && prev_special);
            prev_special = false;
        }
    }
    if ((flags & KVGEN_TOKENIZE_ADD_BOS) && t->add_bos && t->add_sep && t->eos >= 0) emit(&e, t->eos);
    if (frags != &one) kvg_free(frags);
    pcre2_match_data_free(e.md);
    kvg_free(e.syms);
    kvg_free(e.heap);
    kvg_free(e.buf);
    if (e.st == KVGEN_E_NO_MEMORY) return kvg_fail(err, KVGEN_E_NO_MEMORY, "tokenizer: out of memory");
    if (e.st != KVGEN_OK) return e.st;
    if (n_tokens) *n_tokens = e.n;
    if (e.n > cap || (!out && e.n > 0))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "tokenize: %zu tokens do not fit in a buffer of %zu", e.n,
                        cap);
    return KVGEN_OK;
}
