/* wordpiece.c: BERT's WordPiece (tokenizer.ggml.model = bert), the tokenizer table's row that
 * tokenizer.c hands a fragment of text to.
 *
 * First BERT's basic tokenization: control characters, NUL and U+FFFD are dropped, whitespace
 * separates words, every punctuation character and every CJK ideograph is a word of its own;
 * an uncased vocabulary (one with no upper-case ASCII letter in its pieces) also has its text
 * lower-cased and its accents stripped (canonical decomposition, combining marks dropped).
 * Then each word is cut greedily, longest piece first: the first piece as a word start, the
 * others as continuations; a word with a part no piece matches, or longer than 100 characters,
 * is the unknown token.
 *
 * Two spellings of continuations exist in GGUF vocabularies: Hugging Face's ("##ing" continues,
 * "play" starts) and the one llama.cpp's converter writes ("ing" continues, "\u2581play" starts,
 * with U+2581 as a phantom space). The vocabulary tells which (kvg_wordpiece.phantom).
 *
 * Unicode coverage is what BERT vocabularies meet in practice, from small tables rather than
 * the full Unicode database: lower-casing of Latin-1, Latin Extended-A, Greek and Cyrillic;
 * accent stripping of those letters, of kana with sound marks, combining marks U+0300-U+036F
 * and Hangul syllables (decomposed into their jamo, as NFD does); docs/tokenizer.md says where
 * this stops. */
#include <string.h>
#include "kvg_host.h"
#include "kvg_tokenizer.h"

#define MAX_WORD_CHARS 100 /* BERT's max_input_chars_per_word */

static bool is_whitespace(uint32_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Cc and Cf (besides the whitespace above), NUL and the replacement character: dropped */
static bool is_dropped(uint32_t c) {
    return c == 0 || c == 0xFFFD || c < 0x20 || (c >= 0x7F && c <= 0x9F) || c == 0xAD || (c >= 0x200B && c <= 0x200F) ||
           (c >= 0x202A && c <= 0x202E) || (c >= 0x2060 && c <= 0x2064) || c == 0xFEFF;
}

/* BERT's punctuation: every non-alphanumeric ASCII character, and Unicode's P* categories */
static bool is_punct(uint32_t c) {
    if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
    return c == 0xA1 || c == 0xA7 || c == 0xAB || c == 0xB6 || c == 0xB7 || c == 0xBB || c == 0xBF || c == 0x37E ||
           c == 0x387 || (c >= 0x2010 && c <= 0x2027) || (c >= 0x2030 && c <= 0x205E) ||
           (c >= 0x3001 && c <= 0x3003) || (c >= 0x3008 && c <= 0x3011) || (c >= 0x3014 && c <= 0x301F) ||
           (c >= 0xFF01 && c <= 0xFF0F && c != 0xFF04 && c != 0xFF0B) || (c >= 0xFF1A && c <= 0xFF20 && c != 0xFF1C &&
           c != 0xFF1D && c != 0xFF1E) || c == 0xFF3B || c == 0xFF3C || c == 0xFF3D || c == 0xFF3F || c == 0xFF5B ||
           c == 0xFF5D || (c >= 0xFF5F && c <= 0xFF65);
}

/* BERT's "Chinese characters": the CJK Unified Ideographs blocks and their compatibility forms */
static bool is_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2CEAF) || (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static uint32_t to_lower(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
    if (c >= 0x100 && c <= 0x17F) {
        if (c == 0x130) return 'i'; /* dotted capital I: i with a dot above, stripped or not */
        if (c == 0x178) return 0xFF;
        bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
        if (c == 0x138 || c == 0x149 || c == 0x17F) return c;
        return odd_upper ? (c & 1 ? c + 1 : c) : (c & 1 ? c : c + 1);
    }
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 0x20;
    if (c == 0x386) return 0x3AC;
    if (c >= 0x388 && c <= 0x38A) return c + 0x25;
    if (c == 0x38C) return 0x3CC;
    if (c == 0x38E || c == 0x38F) return c + 0x3F;
    if (c >= 0x410 && c <= 0x42F) return c + 0x20;
    if (c >= 0x400 && c <= 0x40F) return c + 0x50;
    return c;
}

/* the base letter of a precomposed letter (its canonical decomposition's first code point), or
 * c itself; '.' in the tables: no canonical decomposition */
static uint32_t strip_accent(uint32_t c) {
    static const char latin1[] = "AAAAAA.CEEEEIIII.NOOOOO..UUUUY..aaaaaa.ceeeeiiii.nooooo..uuuuy.y";
    static const char latin_a[] = "AaAaAaCcCcCcCcDd..EeEeEeEeEeGgGgGgGgHh..IiIiIiIiI...JjKk.LlLlLl."
                                  "...NnNnNn...OoOoOo..RrRrRrSsSsSsSsTtTt..UuUuUuUuUuUuWwYyYZzZzZz.";
    if (c >= 0xC0 && c <= 0xFF) return latin1[c - 0xC0] == '.' ? c : (uint32_t)latin1[c - 0xC0];
    if (c >= 0x100 && c <= 0x17F) return latin_a[c - 0x100] == '.' ? c : (uint32_t)latin_a[c - 0x100];
    static const uint16_t greek[][2] = {{0x3AC, 0x3B1}, {0x3AD, 0x3B5}, {0x3AE, 0x3B7}, {0x3AF, 0x3B9},
                                        {0x3CA, 0x3B9}, {0x3CB, 0x3C5}, {0x3CC, 0x3BF}, {0x3CD, 0x3C5},
                                        {0x3CE, 0x3C9}, {0x450, 0x435}, {0x451, 0x435}, {0x453, 0x433},
                                        {0x457, 0x456}, {0x45C, 0x43A}, {0x45D, 0x438}, {0x45E, 0x443},
                                        {0x439, 0x438}};
    for (size_t i = 0; i < sizeof greek / sizeof greek[0]; i++)
        if (greek[i][0] == c) return greek[i][1];
    /* kana with a (semi-)voiced sound mark: the mark is a combining character after decomposition */
    if (c >= 0x3040 && c <= 0x30FF) {
        uint32_t off = c >= 0x30A0 ? 0x60 : 0, k = c - off;
        if (k >= 0x304C && k <= 0x3062 && (k - 0x304C) % 2 == 0) return c - 1;
        if (k == 0x3065 || k == 0x3067 || k == 0x3069) return c - 1;
        if (k >= 0x3070 && k <= 0x307D && (k - 0x3070) % 3 != 2) return c - 1 - (k - 0x3070) % 3;
        if (k == 0x3094) return 0x3046 + off;
        if (k == 0x309E) return c - 1;
        if (off && c >= 0x30F7 && c <= 0x30FA) return c - 8;
    }
    return c;
}

static size_t utf8_encode(uint32_t c, char *o) {
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | c >> 6); o[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | c >> 12); o[1] = (char)(0x80 | ((c >> 6) & 0x3F)); o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | c >> 18); o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F)); o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* the next code point of s[*i..n) (U+FFFD for bytes that are not valid UTF-8: overlong forms,
 * surrogates and cut sequences included, one byte at a time) */
static uint32_t next_cp(const unsigned char *s, size_t n, size_t *i) {
    unsigned b = s[*i];
    size_t len = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
    uint32_t c = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    bool ok = len > 0 && *i + len <= n;
    for (size_t k = 1; ok && k < len; k++) {
        ok = (s[*i + k] & 0xC0) == 0x80;
        c = c << 6 | (s[*i + k] & 0x3F);
    }
    static const uint32_t min_of[] = {0, 0, 0x80, 0x800, 0x10000};
    if (!ok || c < min_of[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
        (*i)++;
        return 0xFFFD;
    }
    *i += len;
    return c;
}

typedef struct wp_state {
    const kvg_wordpiece *wp;
    char *word;      /* the current word's UTF-8 */
    size_t *starts;  /* byte offset of each of its characters */
    size_t n_bytes, n_chars, cap;
    bool oom;
} wp_state;

static void word_add(wp_state *w, uint32_t c) {
    if (w->n_bytes + 4 > w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        char *nw = kvg_realloc(w->word, cap);
        size_t *ns = nw ? kvg_realloc(w->starts, (cap + 1) * sizeof *ns) : NULL;
        if (nw) w->word = nw;
        if (!ns) {
            w->oom = true;
            return;
        }
        w->starts = ns;
        w->cap = cap;
    }
    w->starts[w->n_chars++] = w->n_bytes;
    w->n_bytes += utf8_encode(c, w->word + w->n_bytes);
}

/* the id of the piece word[a..b) as a start (first) or a continuation, -1 when absent */
static int32_t piece(const wp_state *w, size_t a, size_t b, bool first) {
    const kvg_wordpiece *wp = w->wp;
    char buf[4 * MAX_WORD_CHARS + 8];
    size_t n = 0;
    if (wp->phantom && first) { memcpy(buf, "\xE2\x96\x81", 3); n = 3; }
    if (!wp->phantom && !first) { memcpy(buf, "##", 2); n = 2; }
    memcpy(buf + n, w->word + a, b - a);
    return wp->find(wp->ctx, buf, n + b - a);
}

/* greedy longest-match-first over the word's characters */
static void word_flush(wp_state *w, void (*emit)(void *, int32_t), void *ectx) {
    if (!w->n_chars || w->oom) {
        w->n_bytes = w->n_chars = 0;
        return;
    }
    int32_t ids[MAX_WORD_CHARS];
    int n_ids = 0;
    bool bad = w->n_chars > MAX_WORD_CHARS;
    w->starts[w->n_chars] = w->n_bytes;
    for (size_t start = 0; !bad && start < w->n_chars;) {
        size_t end = w->n_chars;
        int32_t id = -1;
        for (; end > start; end--)
            if ((id = piece(w, w->starts[start], w->starts[end], start == 0)) >= 0) break;
        if (id < 0) bad = true;
        else ids[n_ids++] = id;
        start = end;
    }
    if (bad) emit(ectx, w->wp->unk);
    else
        for (int i = 0; i < n_ids; i++) emit(ectx, ids[i]);
    w->n_bytes = w->n_chars = 0;
}

bool kvg_wordpiece_encode(const kvg_wordpiece *wp, const char *text, size_t len, void (*emit)(void *, int32_t),
                          void *ectx) {
    wp_state w = {.wp = wp};
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len && !w.oom;) {
        uint32_t c = next_cp(s, len, &i);
        if (is_dropped(c) && !is_whitespace(c)) continue;
        if (is_whitespace(c)) {
            word_flush(&w, emit, ectx);
            continue;
        }
        if (wp->lowercase) {
            c = to_lower(c);
            if ((c >= 0x300 && c <= 0x36F) || c == 0x3099 || c == 0x309A) continue; /* a combining mark */
            if (c >= 0xAC00 && c <= 0xD7A3) {      /* a Hangul syllable: its jamo */
                uint32_t k = c - 0xAC00;
                word_add(&w, 0x1100 + k / 588);
                word_add(&w, 0x1161 + (k % 588) / 28);
                if (k % 28) word_add(&w, 0x11A7 + k % 28);
                continue;
            }
            c = strip_accent(c);
        }
        if (is_punct(c) || is_cjk(c)) {
            word_flush(&w, emit, ectx);
            word_add(&w, c);
            word_flush(&w, emit, ectx);
            continue;
        }
        word_add(&w, c);
    }
    word_flush(&w, emit, ectx);
    kvg_free(w.word);
    kvg_free(w.starts);
    return !w.oom;
}
