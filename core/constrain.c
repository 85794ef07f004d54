/* constrain.c: constrained output (see kvg_constrain.h and docs/generation.md). A constraint
 * compiles to segments; the JSON object {"a":"..","b":1} becomes
 *   LIT {"a":"  STR  LIT ","b":  NUM  LIT }
 * and a token is allowed when the matcher accepts every one of its bytes. */
#include "kvg_constrain.h"
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"

#define MAX_CHOICES 4096
#define MAX_CHOICE_LEN 4096
#define MAX_FIELDS 64
#define DEFAULT_STR_LEN 64
#define MAX_STR_LEN 4096
#define MAX_NUM_LEN 16

typedef enum seg_kind { SEG_LIT, SEG_STR, SEG_NUM, SEG_CHOICE } seg_kind;

typedef struct seg {
    seg_kind kind;
    char *lit; /* SEG_LIT */
    int lit_len;
    int max_len;    /* SEG_STR */
    char **choices; /* SEG_CHOICE: sorted, unique, so a common prefix is a contiguous range */
    int *choice_len;
    int n_choices;
} seg;

struct kvg_cons {
    seg *segs;
    int n, cap;
};

void kvg_cons_free(kvg_cons *k) {
    if (!k) return;
    for (int i = 0; i < k->n; i++) {
        free(k->segs[i].lit);
        for (int j = 0; j < k->segs[i].n_choices; j++) free(k->segs[i].choices[j]);
        free(k->segs[i].choices);
        free(k->segs[i].choice_len);
    }
    free(k->segs);
    free(k);
}

static seg *push_seg(kvg_cons *k, seg_kind kind) {
    if (k->n == k->cap) {
        int cap = k->cap ? k->cap * 2 : 8;
        seg *s = realloc(k->segs, (size_t)cap * sizeof *s);
        if (!s) return NULL;
        k->segs = s;
        k->cap = cap;
    }
    seg *s = &k->segs[k->n++];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    return s;
}

/* appends literal text, merging with a literal just before */
static bool push_lit(kvg_cons *k, const char *text) {
    size_t n = strlen(text);
    seg *s = k->n > 0 && k->segs[k->n - 1].kind == SEG_LIT ? &k->segs[k->n - 1] : push_seg(k, SEG_LIT);
    if (!s) return false;
    char *lit = realloc(s->lit, (size_t)s->lit_len + n + 1);
    if (!lit) return false;
    memcpy(lit + s->lit_len, text, n + 1);
    s->lit = lit;
    s->lit_len += (int)n;
    return true;
}

static int str_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool push_choice(kvg_cons *k, const char *const *values, int n) {
    seg *s = push_seg(k, SEG_CHOICE);
    if (!s) return false;
    s->choices = calloc((size_t)n, sizeof *s->choices);
    s->choice_len = calloc((size_t)n, sizeof *s->choice_len);
    if (!s->choices || !s->choice_len) return false;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(values[i]);
        if (!(s->choices[i] = malloc(len + 1))) return false;
        memcpy(s->choices[i], values[i], len + 1);
        s->n_choices++;
    }
    qsort(s->choices, (size_t)n, sizeof *s->choices, str_cmp);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m > 0 && strcmp(s->choices[m - 1], s->choices[i]) == 0) {
            free(s->choices[i]);
            continue;
        }
        s->choices[m] = s->choices[i];
        s->choice_len[m] = (int)strlen(s->choices[i]);
        m++;
    }
    s->n_choices = m;
    return true;
}

/* a string that a JSON string may hold verbatim (no escapes needed) */
static bool json_plain(const char *v) {
    for (const unsigned char *p = (const unsigned char *)v; *p; p++)
        if (*p < 0x20 || *p == '"' || *p == '\\') return false;
    return true;
}

static kvgen_status check_strings(const char *const *v, int n, const char *what, bool json, kvgen_error *err) {
    if (n < 1 || n > MAX_CHOICES || !v)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "constraint: %s needs 1..%d strings, got %d", what, MAX_CHOICES,
                        n);
    for (int i = 0; i < n; i++) {
        if (!v[i] || !v[i][0] || strlen(v[i]) > MAX_CHOICE_LEN)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "constraint: %s[%d] is NULL, empty or over %d bytes", what,
                            i, MAX_CHOICE_LEN);
        if (json && !json_plain(v[i]))
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                            "constraint: %s[%d] \"%s\" holds a quote, backslash or control character (unsupported)",
                            what, i, v[i]);
    }
    return KVGEN_OK;
}

static kvgen_status build_json(kvg_cons *k, const kvgen_constraint *c, kvgen_error *err) {
    if (c->n_fields < 1 || c->n_fields > MAX_FIELDS || !c->fields)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "constraint: a JSON object needs 1..%d fields, got %d",
                        MAX_FIELDS, c->n_fields);
    for (int i = 0; i < c->n_fields; i++) {
        const kvgen_json_field *f = &c->fields[i];
        if (!f->key || !f->key[0] || strlen(f->key) > 256)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "constraint: field %d has no key (or one over 256 bytes)", i);
        for (const char *p = f->key; *p; p++)
            if (*p < 0x20 || *p > 0x7e || *p == '"' || *p == '\\')
                return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                                "constraint: key \"%s\": only printable ASCII without quote or backslash", f->key);
        for (int j = 0; j < i; j++)
            if (strcmp(c->fields[j].key, f->key) == 0)
                return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "constraint: key \"%s\" appears twice", f->key);
        kvgen_status st;
        switch (f->type) {
        case KVGEN_JSON_STRING:
            if (f->max_len < 0 || f->max_len > MAX_STR_LEN)
                return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "constraint: key \"%s\": max_len %d outside [0, %d]",
                                f->key, f->max_len, MAX_STR_LEN);
            break;
        case KVGEN_JSON_NUMBER: break;
        case KVGEN_JSON_ENUM:
            st = check_strings(f->values, f->n_values, f->key, true, err);
            if (st != KVGEN_OK) return st;
            break;
        default:
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                            "constraint: key \"%s\": type %d (string, number or enum; nested values are unsupported)",
                            f->key, (int)f->type);
        }
    }
    for (int i = 0; i < c->n_fields; i++) {
        const kvgen_json_field *f = &c->fields[i];
        bool ok = push_lit(k, i == 0 ? "{\"" : ",\"") && push_lit(k, f->key) && push_lit(k, "\":");
        if (ok && f->type == KVGEN_JSON_STRING) {
            seg *s = NULL;
            ok = push_lit(k, "\"") && (s = push_seg(k, SEG_STR)) != NULL && push_lit(k, "\"");
            if (s) s->max_len = f->max_len ? f->max_len : DEFAULT_STR_LEN;
        } else if (ok && f->type == KVGEN_JSON_NUMBER) {
            ok = push_seg(k, SEG_NUM) != NULL;
        } else if (ok) {
            ok = push_lit(k, "\"") && push_choice(k, f->values, f->n_values) && push_lit(k, "\"");
        }
        if (!ok) return kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory");
    }
    if (!push_lit(k, "}")) return kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory");
    return KVGEN_OK;
}

kvgen_status kvg_cons_build(const kvgen_constraint *c, kvg_cons **out, kvgen_error *err) {
    *out = NULL;
    if (!c || c->kind == KVGEN_CONSTRAIN_NONE) return KVGEN_OK;
    if (c->kind != KVGEN_CONSTRAIN_CHOICE && c->kind != KVGEN_CONSTRAIN_JSON)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "constraint: kind %d (choice or json)", (int)c->kind);
    kvg_cons *k = calloc(1, sizeof *k);
    if (!k) return kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory");
    kvgen_status st;
    if (c->kind == KVGEN_CONSTRAIN_CHOICE) {
        st = check_strings(c->choices, c->n_choices, "choices", false, err);
        if (st == KVGEN_OK && !push_choice(k, c->choices, c->n_choices))
            st = kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory");
    } else {
        st = build_json(k, c, err);
    }
    if (st != KVGEN_OK) {
        kvg_cons_free(k);
        return st;
    }
    *out = k;
    return KVGEN_OK;
}

static void enter(const kvg_cons *k, kvg_cons_state *st, int seg_index) {
    st->seg = seg_index;
    st->a = st->b = st->c = 0;
    if (seg_index < k->n && k->segs[seg_index].kind == SEG_CHOICE) st->b = k->segs[seg_index].n_choices;
}

void kvg_cons_start(const kvg_cons *k, kvg_cons_state *st) { enter(k, st, 0); }

/* JSON number automaton: 0 start, 1 '-', 2 '0', 3 integer digits, 4 '.', 5 fraction digits */
static int num_next(int state, unsigned char ch) {
    bool digit = ch >= '0' && ch <= '9';
    switch (state) {
    case 0: return ch == '-' ? 1 : ch == '0' ? 2 : digit ? 3 : -1;
    case 1: return ch == '0' ? 2 : digit ? 3 : -1;
    case 2: return ch == '.' ? 4 : -1;
    case 3: return digit ? 3 : ch == '.' ? 4 : -1;
    case 4:
    case 5: return digit ? 5 : -1;
    }
    return -1;
}
static bool num_accepting(int state) { return state == 2 || state == 3 || state == 5; }

static int utf8_len(unsigned char lead) {
    if (lead >= 0xc2 && lead < 0xe0) return 2;
    if (lead >= 0xe0 && lead < 0xf0) return 3;
    if (lead >= 0xf0 && lead < 0xf5) return 4;
    return 0;
}

bool kvg_cons_feed(const kvg_cons *k, kvg_cons_state *st, unsigned char ch) {
    while (st->seg < k->n) {
        const seg *s = &k->segs[st->seg];
        switch (s->kind) {
        case SEG_LIT:
            if ((unsigned char)s->lit[st->a] != ch) return false;
            if (++st->a == s->lit_len) enter(k, st, st->seg + 1);
            return true;
        case SEG_STR: /* a = bytes so far, b = continuation bytes the current character still needs */
            if (st->b > 0) {
                if ((ch & 0xc0) != 0x80) return false;
                st->b--;
                st->a++;
                return true;
            }
            if (ch == '"') {
                enter(k, st, st->seg + 1); /* the closing quote belongs to the literal after */
                continue;
            }
            if (ch < 0x20 || ch == '\\') return false;
            int need = ch < 0x80 ? 1 : utf8_len(ch);
            if (need == 0 || st->a + need > s->max_len) return false;
            st->a++;
            st->b = need - 1;
            return true;
        case SEG_NUM: { /* a = automaton state, b = characters */
            int next = num_next(st->a, ch);
            if (next >= 0 && st->b < MAX_NUM_LEN) {
                st->a = next;
                st->b++;
                return true;
            }
            if (!num_accepting(st->a)) return false;
            enter(k, st, st->seg + 1);
            continue;
        }
        case SEG_CHOICE: { /* [a, b) = choices with the prefix so far, c = its length */
            int lo = st->a, hi = st->b, d = st->c;
            while (lo < hi && !(s->choice_len[lo] > d && (unsigned char)s->choices[lo][d] == ch)) lo++;
            int end = lo;
            while (end < hi && s->choice_len[end] > d && (unsigned char)s->choices[end][d] == ch) end++;
            if (lo < end) {
                st->a = lo;
                st->b = end;
                st->c = d + 1;
                if (end - lo == 1 && s->choice_len[lo] == d + 1) enter(k, st, st->seg + 1);
                return true;
            }
            if (s->choice_len[st->a] != d) return false; /* no choice is complete here */
            enter(k, st, st->seg + 1);
            continue;
        }
        }
    }
    return false;
}

bool kvg_cons_done(const kvg_cons *k, const kvg_cons_state *st) { return st->seg >= k->n; }

bool kvg_cons_can_end(const kvg_cons *k, const kvg_cons_state *st) {
    if (st->seg >= k->n) return true;
    if (st->seg != k->n - 1) return false;
    const seg *s = &k->segs[st->seg];
    if (s->kind == SEG_CHOICE) return s->choice_len[st->a] == st->c;
    if (s->kind == SEG_NUM) return num_accepting(st->a);
    return false;
}

void kvg_pieces_free(kvg_pieces *p) {
    if (!p) return;
    free(p->off);
    free(p->bytes);
    free(p);
}

kvgen_status kvg_pieces_get(kvgen_session *s, const kvg_pieces **out, kvgen_error *err) {
    kvg_sampler *sm = kvg_session_sampler(s);
    if (sm->pieces) {
        *out = sm->pieces;
        return KVGEN_OK;
    }
    const kvgen_model *m = kvg_session_model(s);
    int n = sm->n_vocab;
    kvg_pieces *p = calloc(1, sizeof *p);
    if (p) p->off = malloc(((size_t)n + 1) * sizeof *p->off);
    if (!p || !p->off) {
        kvg_pieces_free(p);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory for the token table");
    }
    size_t total = 0;
    for (int t = 0; t < n; t++) {
        p->off[t] = (uint32_t)total;
        total += kvgen_token_piece(m, t, 0, NULL, 0);
    }
    p->off[n] = (uint32_t)total;
    p->bytes = malloc(total + 1);
    if (!p->bytes || total > UINT32_MAX) {
        kvg_pieces_free(p);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory for the token table");
    }
    for (int t = 0; t < n; t++) {
        size_t len = p->off[t + 1] - p->off[t];
        if (len) {
            char *tmp = malloc(len + 1);
            if (!tmp) {
                kvg_pieces_free(p);
                return kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory for the token table");
            }
            kvgen_token_piece(m, t, 0, tmp, len + 1);
            memcpy(p->bytes + p->off[t], tmp, len);
            free(tmp);
        }
    }
    p->n = n;
    sm->pieces = p;
    *out = p;
    return KVGEN_OK;
}

int kvg_cons_mask(const kvg_cons *k, const kvg_cons_state *st, const kvg_pieces *p, const kvgen_model *m,
                  uint8_t *allowed) {
    bool can_end = kvg_cons_can_end(k, st);
    int count = 0;
    for (int t = 0; t < p->n; t++) {
        uint8_t ok = 0;
        uint32_t len = p->off[t + 1] - p->off[t];
        if (kvgen_token_is_eog(m, t)) {
            ok = can_end;
        } else if (len > 0) {
            kvg_cons_state s = *st;
            const unsigned char *b = p->bytes + p->off[t];
            ok = 1;
            for (uint32_t i = 0; i < len && ok; i++) ok = kvg_cons_feed(k, &s, b[i]);
        }
        allowed[t] = ok;
        count += ok;
    }
    return count;
}
