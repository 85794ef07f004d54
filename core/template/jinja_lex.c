/* jinja_lex.c: template source to tokens. Text between tags becomes T_TEXT after Jinja's
 * whitespace rules as Hugging Face's apply_chat_template sets them (trim_blocks: the newline
 * after a block tag goes; lstrip_blocks: blanks before a block tag on its own line go; '-' and
 * '+' inside a tag strip or keep); inside a tag, names, numbers, strings and operators. */
#include <ctype.h>
#include <stdlib.h>
#include "jinja_internal.h"

static void push_tok(lexer *L, tok t) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        tok *nv = kvg_jx_alloc(L->x, cap * sizeof *nv);
        if (L->n) memcpy(nv, L->v, L->n * sizeof *nv);
        kvg_jx_release(L->x, L->v, L->cap * sizeof *nv);
        L->v = nv;
        L->cap = cap;
    }
    L->v[L->n++] = t;
}

static size_t lex_tag(lexer *L, size_t pos, int var, int *strip_after, int *ate_newline) {
    jx *x = L->x;
    const char *s = x->src;
    size_t n = x->src_len;
    int depth = 0;
    for (;;) {
        while (pos < n && is_ws(s[pos])) pos++;
        if (pos >= n) kvg_jx_fail(x, pos, "unclosed %s tag", var ? "{{" : "{%");
        const char *end = var ? "}}" : "%}";
        if (depth == 0) {
            /* the source is NUL-terminated: strncmp stops there */
            int sign = (s[pos] == '-' || s[pos] == '+') && strncmp(s + pos + 1, end, 2) == 0;
            if (sign || strncmp(s + pos, end, 2) == 0) {
                size_t at = pos;
                char c = sign ? s[pos] : 0;
                pos += sign ? 3 : 2;
                push_tok(L, (tok){.k = var ? T_VEND : T_BEND, .pos = at});
                *strip_after = c == '-';
                *ate_newline = 0;
                if (c == '-') {
                    size_t p0 = pos;
                    while (pos < n && is_ws(s[pos])) pos++;
                    *ate_newline = pos > p0 && s[pos - 1] == '\n';
                } else if (!var && c != '+' && pos < n && s[pos] == '\n') { /* trim_blocks */
                    pos++;
                    *ate_newline = 1;
                }
                return pos;
            }
        }
        char c = s[pos];
        size_t start = pos;
        if (isalpha((unsigned char)c) || c == '_') {
            while (pos < n && (isalnum((unsigned char)s[pos]) || s[pos] == '_')) pos++;
            push_tok(L, (tok){.k = T_NAME, .pos = start, .p = s + start, .n = pos - start});
        } else if (isdigit((unsigned char)c)) {
            int is_float = 0;
            char num[64];
            size_t k = 0;
            while (pos < n && (isdigit((unsigned char)s[pos]) || s[pos] == '_' ||
                               (s[pos] == '.' && !is_float && pos + 1 < n && isdigit((unsigned char)s[pos + 1])) ||
                               ((s[pos] == 'e' || s[pos] == 'E') && pos + 1 < n &&
                                (isdigit((unsigned char)s[pos + 1]) || s[pos + 1] == '-' || s[pos + 1] == '+')))) {
                if (s[pos] == '.') is_float = 1;
                if (s[pos] == 'e' || s[pos] == 'E') {
                    is_float = 1;
                    if (k < sizeof num - 1) num[k++] = s[pos];
                    pos++;
                }
                if (s[pos] != '_' && k < sizeof num - 1) num[k++] = s[pos];
                pos++;
            }
            num[k] = 0;
            tok t = {.k = is_float ? T_FLOAT : T_INT, .pos = start};
            if (is_float) t.f = strtod(num, NULL);
            else t.i = (int64_t)strtoll(num, NULL, 10);
            push_tok(L, t);
        } else if (c == '\'' || c == '"') {
            sbuf b = {0};
            pos++;
            for (;;) {
                if (pos >= n) kvg_jx_fail(x, start, "unterminated string");
                char d = s[pos];
                if (d == c) {
                    pos++;
                    break;
                }
                if (d == '\\' && pos + 1 < n) {
                    char e = s[pos + 1], o = 0;
                    pos += 2;
                    switch (e) {
                    case 'n': o = '\n'; break;
                    case 't': o = '\t'; break;
                    case 'r': o = '\r'; break;
                    case '\\': o = '\\'; break;
                    case '\'': o = '\''; break;
                    case '"': o = '"'; break;
                    case '0': o = 0; kvg_sb_add(x, &b, &o, 1, NULL, 0); continue;
                    case '\n': continue;
                    default: kvg_sb_add(x, &b, s + pos - 2, 2, NULL, 0); continue; /* kept as written */
                    }
                    kvg_sb_add(x, &b, &o, 1, NULL, 0);
                    continue;
                }
                kvg_sb_add(x, &b, &d, 1, NULL, 0);
                pos++;
            }
            jstr *js = kvg_sb_done(x, &b);
            push_tok(L, (tok){.k = T_STR, .pos = start, .p = js->p, .n = js->n});
        } else {
            static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
            size_t len = 0;
            for (int i = 0; ops2[i]; i++)
                if (pos + 2 <= n && strncmp(s + pos, ops2[i], 2) == 0) len = 2;
            if (!len) {
                if (!strchr("+-*/%~<>=()[]{}.,:|", c) || c == 0) kvg_jx_fail(x, pos, "unexpected character '%c'", c);
                len = 1;
                if (c == '(' || c == '[' || c == '{') depth++;
                if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            }
            push_tok(L, (tok){.k = T_OP, .pos = start, .p = s + start, .n = len});
            pos += len;
        }
    }
}

void kvg_jinja_lex(lexer *L) {
    jx *x = L->x;
    const char *s = x->src;
    size_t n = x->src_len, pos = 0;
    int strip_next = 0, line_starting = 1; /* strip_next: the last tag ended with '-' */
    while (pos < n) {
        /* the next tag opener */
        size_t t = pos;
        int kind = 0; /* 1 {{, 2 {%, 3 {# */
        for (; t + 1 < n; t++)
            if (s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#')) {
                kind = s[t + 1] == '{' ? 1 : s[t + 1] == '%' ? 2 : 3;
                break;
            }
        if (!kind) t = n;
        size_t a = pos, b = t;
        if (strip_next)
            while (a < b && is_ws(s[a])) a++;
        char sign = kind && t + 2 < n ? s[t + 2] : 0;
        if (kind && sign == '-') {
            while (b > a && is_ws(s[b - 1])) b--;
        } else if (kind >= 2 && sign != '+') { /* lstrip_blocks: only blanks between line start and tag */
            size_t l = b;
            while (l > a && (s[l - 1] == ' ' || s[l - 1] == '\t' || s[l - 1] == '\r' || s[l - 1] == '\f' ||
                             s[l - 1] == '\v'))
                l--;
            if ((l > a && s[l - 1] == '\n') || (l == a && line_starting)) b = l;
        }
        if (b > a) push_tok(L, (tok){.k = T_TEXT, .pos = a, .p = s + a, .n = b - a});
        if (!kind) break;
        pos = t + 2 + (sign == '-' || sign == '+');
        int ate = 0;
        strip_next = 0;
        if (kind == 3) {
            const char *e = NULL;
            for (size_t k = pos; k + 1 < n; k++)
                if (s[k] == '#' && s[k + 1] == '}') {
                    e = s + k;
                    break;
                }
            if (!e) kvg_jx_fail(x, t, "unclosed comment");
            size_t q = (size_t)(e - s);
            char c = q > pos && (s[q - 1] == '-' || s[q - 1] == '+') ? s[q - 1] : 0;
            pos = q + 2;
            if (c == '-') {
                size_t p0 = pos;
                while (pos < n && is_ws(s[pos])) pos++;
                ate = pos > p0 && s[pos - 1] == '\n';
                strip_next = 0;
            } else if (c != '+' && pos < n && s[pos] == '\n') {
                pos++;
                ate = 1;
            }
        } else {
            push_tok(L, (tok){.k = kind == 1 ? T_VBEGIN : T_BBEGIN, .pos = t});
            pos = lex_tag(L, pos, kind == 1, &strip_next, &ate);
            strip_next = 0; /* the tag already consumed the whitespace it strips */
        }
        line_starting = ate;
    }
    push_tok(L, (tok){.k = T_EOF, .pos = n});
}
