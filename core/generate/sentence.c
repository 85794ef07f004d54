/* sentence.c: whether a text ends a sentence (kvg_sentence.h), for soft_max_tokens. */
#include "kvg_sentence.h"
#include <string.h>

typedef struct mark {
    const char *s;
    unsigned char n;
} mark;

/* may follow a sentence's final mark */
static const mark closers[] = {
    {"\"", 1}, {"'", 1}, {")", 1}, {"]", 1}, {"}", 1}, {"*", 1}, {"_", 1},
    {"\xE2\x80\x9D", 3}, /* ” */
    {"\xE2\x80\x99", 3}, /* ’ */
    {"\xC2\xBB", 2},     /* » */
    {"\xE3\x80\x8D", 3}, /* 」 */
    {"\xE3\x80\x8F", 3}, /* 』 */
    {"\xEF\xBC\x89", 3}, /* ） */
};

/* end a sentence without a space after them */
static const mark wide_ends[] = {
    {"\xE3\x80\x82", 3}, /* 。 */
    {"\xEF\xBC\x81", 3}, /* ！ */
    {"\xEF\xBC\x9F", 3}, /* ？ */
};

/* end a sentence when whitespace follows */
static const mark ends[] = {
    {"!", 1}, {"?", 1},
    {"\xE2\x80\xA6", 3}, /* … */
    {".", 1},
};

/* a word before a single '.' that does not end a sentence (lower case, compared without case) */
static const char *const abbreviations[] = {
    "mr", "mrs", "ms", "mx", "dr", "prof", "sr", "jr", "st", "mt", "vs", "gen", "capt", "lt", "col", "sgt",
    "cmdr", "adm", "gov", "rev", "hon", "fr", "fig", "approx", "cf", "al",
};

static bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_alpha(unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }
static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* the length of the mark of `set` that text[0..k) ends with, or 0 */
static size_t ends_with(const char *text, size_t k, const mark *set, size_t n_set) {
    for (size_t i = 0; i < n_set; i++)
        if (set[i].n <= k && memcmp(text + k - set[i].n, set[i].s, set[i].n) == 0) return set[i].n;
    return 0;
}

/* the length of the mark of `set` that s[0..n) begins with, or 0 */
static size_t begins_with(const char *s, size_t n, const mark *set, size_t n_set) {
    for (size_t i = 0; i < n_set; i++)
        if (set[i].n <= n && memcmp(s, set[i].s, set[i].n) == 0) return set[i].n;
    return 0;
}

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* The word text[w..k) before a single '.' at text[k]: true when the '.' ends no sentence. */
static bool dot_is_inside(const char *text, size_t k) {
    size_t w = k;
    while (w > 0 && !is_space((unsigned char)text[w - 1])) w--;
    bool line_start = w == 0 || text[w - 1] == '\n';
    while (w < k && strchr("\"'([{*_", text[w])) w++; /* opening marks */
    size_t len = k - w;
    if (len == 0) return false;
    const char *word = text + w;
    bool digits = true, letters = true;
    for (size_t i = 0; i < len; i++) {
        digits = digits && is_digit((unsigned char)word[i]);
        letters = letters && is_alpha((unsigned char)word[i]);
    }
    if (digits) return line_start;          /* "2." beginning a line: a list's number */
    if (letters && len == 1) return true;   /* an initial */
    if (letters) {
        for (size_t a = 0; a < COUNT(abbreviations); a++) {
            const char *ab = abbreviations[a];
            if (strlen(ab) != len) continue;
            size_t i = 0;
            while (i < len && (char)(word[i] | 0x20) == ab[i]) i++;
            if (i == len) return true;
        }
        return false;
    }
    /* "e.g", "i.e", "U.S": single letters between dots */
    for (size_t i = 0; i < len; i++) {
        bool dot_here = word[i] == '.';
        if (i % 2 == 0 ? !is_alpha((unsigned char)word[i]) : !dot_here) return false;
    }
    return len % 2 == 1;
}

bool kvg_sentence_ends(const char *text, size_t n, const char *next, size_t next_n) {
    if (!text) return false;
    if (!next) next_n = 0;
    size_t e = n;
    bool ws_end = false, nl_end = false;
    while (e > 0 && is_space((unsigned char)text[e - 1])) {
        ws_end = true;
        nl_end = nl_end || text[e - 1] == '\n';
        e--;
    }
    if (e == 0) return false; /* nothing said yet */
    bool ws_next = next_n > 0 && is_space((unsigned char)next[0]);
    bool nl_next = next_n > 0 && (next[0] == '\n' || next[0] == '\r');
    bool spaced = ws_end || ws_next;

    size_t k = e, c;
    while ((c = ends_with(text, k, closers, COUNT(closers))) > 0) k -= c;
    if (ends_with(text, k, wide_ends, COUNT(wide_ends))) {
        /* no space is needed, but a closing mark or another full stop may still come */
        if (spaced || next_n == 0) return true;
        if (!begins_with(next, next_n, closers, COUNT(closers)) && !begins_with(next, next_n, wide_ends, COUNT(wide_ends)) &&
            !begins_with(next, next_n, ends, COUNT(ends)))
            return true;
    } else if (spaced && (c = ends_with(text, k, ends, COUNT(ends))) > 0) {
        bool single_dot = c == 1 && text[k - 1] == '.' && !(k >= 2 && text[k - 2] == '.');
        if (!single_dot || !dot_is_inside(text, k - 1)) return true;
    }
    /* a line that ends: not an empty one, nor one that announces more */
    return (nl_end || nl_next) && text[e - 1] != ':';
}
