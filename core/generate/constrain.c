/* constrain.c: constrained output (see kvg_constrain.h and docs/generation.md). A constraint
 * compiles to segments; the JSON object {"a":"..","b":1} becomes
 *   LIT {"a":"  STR  LIT ","b":  NUM  LIT }
 * and a token is allowed when the matcher accepts every one of its bytes. A choice constraint
 * is one CHOICE segment that is not matched token by token: kvg_cons_select picks the choice
 * by the score kvgen_session_choose gives it, and the mask then allows exactly the tokens of
 * that choice's spelling, one after the other. */
#include "kvg_constrain.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_grammar.h"
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
    int *first;     /* SEG_CHOICE: each choice's first position in the caller's list */
    int n_choices;
} seg;

struct kvg_cons {
    seg *segs;
    int n, cap;
    /* KVGEN_CONSTRAIN_CHOICE (segs[0] is the only segment) */
    bool choice;
    int32_t **toks; /* each sorted choice's spelling (kvg_cons_spell) */
    size_t *n_toks;
    bool picked;    /* kvg_cons_select ran: the state's range holds exactly one choice */
    /* KVGEN_CONSTRAIN_GRAMMAR and _SCHEMA: no segments; the grammar's matcher holds the state
     * (one matcher per constraint, i.e. per generation) */
    kvg_gram *gram;
    kvg_gram_match *gm;
};

void kvg_cons_free(kvg_cons *k) {
    if (!k) return;
    for (int i = 0; i < k->n; i++) {
        kvg_free(k->segs[i].lit);
        for (int j = 0; j < k->segs[i].n_choices; j++) kvg_free(k->segs[i].choices[j]);
        kvg_free(k->segs[i].choices);
        kvg_free(k->segs[i].choice_len);
        kvg_free(k->segs[i].first);
    }
    for (int i = 0; k->toks && i < k->segs[0].n_choices; i++) kvg_free(k->toks[i]);
    kvg_free(k->toks);
    kvg_free(k->n_toks);
    kvg_free(k->segs);
    kvg_gram_match_free(k->gm);
    kvg_gram_free(k->gram);
    kvg_free(k);
}

static seg *push_seg(kvg_cons *k, seg_kind kind) {
    if (k->n == k->cap) {
        int cap = k->cap ? k->cap * 2 : 8;
        seg *s = kvg_realloc(k->segs, (size_t)cap * sizeof *s);
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
    char *lit = kvg_realloc(s->lit, (size_t)s->lit_len + n + 1);
    if (!lit) return false;
    memcpy(lit + s->lit_len, text, n + 1);
    s->lit = lit;
    s->lit_len += (int)n;
    return true;
}

/* sorting by text, then by position in the caller's list: the first of equal texts is the
 * earliest one */
typedef struct choice_ref {
    const char *text;
    int index;
} choice_ref;

static int ref_cmp(const void *a, const void *b) {
    const choice_ref *x = a, *y = b;
    int c = strcmp(x->text, y->text);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

static bool push_choice(kvg_cons *k, const char *const *values, int n) {
    seg *s = push_seg(k, SEG_CHOICE);
    if (!s) return false;
    s->choices = kvg_calloc((size_t)n, sizeof *s->choices);
    s->choice_len = kvg_calloc((size_t)n, sizeof *s->choice_len);
    s->first = kvg_calloc((size_t)n, sizeof *s->first);
    choice_ref *refs = kvg_calloc((size_t)n, sizeof *refs);
    bool ok = s->choices && s->choice_len && s->first && refs;
    for (int i = 0; ok && i < n; i++) refs[i] = (choice_ref){values[i], i};
    if (ok) qsort(refs, (size_t)n, sizeof *refs, ref_cmp);
    for (int i = 0; ok && i < n; i++) {
        if (s->n_choices > 0 && strcmp(s->choices[s->n_choices - 1], refs[i].text) == 0) continue;
        size_t len = strlen(refs[i].text);
        char *c = kvg_malloc(len + 1);
        if (!(ok = c != NULL)) break;
        memcpy(c, refs[i].text, len + 1);
        s->choices[s->n_choices] = c;
        s->choice_len[s->n_choices] = (int)len;
        s->first[s->n_choices] = refs[i].index;
        s->n_choices++;
    }
    kvg_free(refs);
    return ok;
}

/* a string that a JSON string may hold verbatim (no escapes needed) */
static bool json_plain(const char *v) {
    for (const unsigned char *p = (const unsigned char *)v; *p; p++)
        if (*p < 0x20 || *p == '"' || *p == '\\') return false;
    return true;
}

static bool valid_utf8(const char *v) {
    const unsigned char *p = (const unsigned char *)v;
    size_t n = strlen(v);
    for (size_t i = 0; i < n;) {
        size_t cl, ok;
        kvg_utf8_scan(p + i, n - i, &cl, &ok);
        if (ok != cl) return false;
        i += cl;
    }
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
        if (json && !valid_utf8(v[i])) /* JSON text is UTF-8 */
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "constraint: %s[%d] is not valid UTF-8", what, i);
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

static kvgen_status build_grammar(kvg_cons *k, const kvgen_constraint *c, kvgen_error *err) {
    bool schema = c->kind == KVGEN_CONSTRAIN_SCHEMA;
    const char *text = schema ? c->schema : c->grammar;
    if (!text)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "constraint: %s is NULL", schema ? "schema" : "grammar");
    char *gbnf = NULL;
    kvgen_status st = schema ? kvg_schema_to_gbnf(text, &gbnf, err) : KVGEN_OK;
    if (st == KVGEN_OK) st = kvg_gram_parse(schema ? gbnf : text, &k->gram, err);
    kvg_free(gbnf);
    if (st == KVGEN_OK) st = kvg_gram_match_new(k->gram, &k->gm, err);
    return st;
}

kvgen_status kvg_cons_build(const kvgen_constraint *c, kvg_cons **out, kvgen_error *err) {
    *out = NULL;
    if (!c || c->kind == KVGEN_CONSTRAIN_NONE) return KVGEN_OK;
    if (c->kind != KVGEN_CONSTRAIN_CHOICE && c->kind != KVGEN_CONSTRAIN_JSON && c->kind != KVGEN_CONSTRAIN_GRAMMAR &&
        c->kind != KVGEN_CONSTRAIN_SCHEMA)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "constraint: kind %d (choice, json, grammar or schema)",
                        (int)c->kind);
    kvg_cons *k = kvg_calloc(1, sizeof *k);
    if (!k) return kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory");
    kvgen_status st;
    if (c->kind == KVGEN_CONSTRAIN_CHOICE) {
        st = check_strings(c->choices, c->n_choices, "choices", false, err);
        if (st == KVGEN_OK && !push_choice(k, c->choices, c->n_choices))
            st = kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory");
        k->choice = true;
    } else if (c->kind == KVGEN_CONSTRAIN_GRAMMAR || c->kind == KVGEN_CONSTRAIN_SCHEMA) {
        st = build_grammar(k, c, err);
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

void kvg_cons_start(const kvg_cons *k, kvg_cons_state *st) {
    enter(k, st, 0);
    if (k->gm) kvg_gram_match_reset(k->gm);
}

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
    if (k->gm) return kvg_gram_feed(k->gm, &ch, 1);
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

bool kvg_cons_done(const kvg_cons *k, const kvg_cons_state *st) {
    return k->gm ? kvg_gram_done(k->gm) : st->seg >= k->n;
}

bool kvg_cons_can_end(const kvg_cons *k, const kvg_cons_state *st) {
    if (k->gm) return kvg_gram_can_end(k->gm);
    if (st->seg >= k->n) return true;
    if (st->seg != k->n - 1) return false;
    const seg *s = &k->segs[st->seg];
    if (s->kind == SEG_CHOICE) return s->choice_len[st->a] == st->c;
    if (s->kind == SEG_NUM) return num_accepting(st->a);
    return false;
}

/* ---- choices ------------------------------------------------------------------------------ */

kvgen_status kvg_cons_spell(kvg_cons *k, kvg_speller *sp, bool keep_spelling, kvgen_error *err) {
    for (int i = 0; i < k->n; i++) {
        seg *s = &k->segs[i];
        if (s->kind != SEG_CHOICE) continue;
        bool keep = keep_spelling && k->choice && !k->toks;
        if (keep) {
            k->toks = kvg_calloc((size_t)s->n_choices, sizeof *k->toks);
            k->n_toks = kvg_calloc((size_t)s->n_choices, sizeof *k->n_toks);
            if (!k->toks || !k->n_toks) return kvg_fail(err, KVGEN_E_NO_MEMORY, "constraint: out of memory");
        }
        for (int c = 0; c < s->n_choices; c++) {
            int32_t *toks;
            size_t n;
            kvgen_error e = {0};
            kvgen_status st = kvg_spell(sp, s->choices[c], &toks, &n, &e);
            if (st == KVGEN_E_INVALID_ARGUMENT)
                return kvg_fail(err, st, "constraint: %s[%d]: %s", k->choice ? "choices" : "values", s->first[c],
                                e.message);
            if (st != KVGEN_OK) {
                if (err) *err = e;
                return st;
            }
            if (keep) {
                k->toks[c] = toks;
                k->n_toks[c] = n;
            } else {
                kvg_free(toks);
            }
        }
    }
    return KVGEN_OK;
}

kvgen_status kvg_cons_check(const kvgen_constraint *c, const kvgen_model *m, kvgen_error *err) {
    kvg_cons *k = NULL;
    kvgen_status st = kvg_cons_build(c, &k, err);
    if (st != KVGEN_OK || !k) return st;
    kvg_speller sp;
    kvg_speller_init(&sp, m);
    st = kvg_cons_spell(k, &sp, false, err);
    kvg_speller_free(&sp);
    kvg_cons_free(k);
    return st;
}

static bool banned(const kvg_sampler *sm, const int32_t *toks, size_t n) {
    for (int b = 0; b < sm->params.n_bias; b++)
        if (isinf(sm->params.bias[b].bias) && sm->params.bias[b].bias < 0)
            for (size_t i = 0; i < n; i++)
                if (toks[i] == sm->params.bias[b].token) return true;
    return false;
}

kvgen_status kvg_cons_select(kvg_cons *k, kvg_cons_state *st, kvgen_session *s, kvgen_error *err) {
    if (!k->choice || k->picked) return KVGEN_OK;
    kvgen_status rc = KVGEN_OK;
    if (!k->toks) {
        kvg_speller sp;
        kvg_speller_init(&sp, kvg_session_model(s));
        rc = kvg_cons_spell(k, &sp, true, err);
        kvg_speller_free(&sp);
        if (rc != KVGEN_OK) return rc;
    }
    const seg *sg = &k->segs[0];
    int n = sg->n_choices;
    kvg_sampler *sm = kvg_session_sampler(s);
    /* the choices in the caller's order (first occurrences), scored as kvgen_session_choose
     * scores that list */
    int *order = kvg_malloc((size_t)n * sizeof *order);
    const int32_t **toks = kvg_malloc((size_t)n * sizeof *toks);
    size_t *nt = kvg_malloc((size_t)n * sizeof *nt);
    double *lp = kvg_calloc((size_t)n, sizeof *lp);
    if (!order || !toks || !nt || !lp) rc = kvg_fail(err, KVGEN_E_NO_MEMORY, "generate: out of memory for the choices");
    for (int i = 0; rc == KVGEN_OK && i < n; i++) {
        int at = i; /* insertion by first position (n is small next to the scoring) */
        while (at > 0 && sg->first[order[at - 1]] > sg->first[i]) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = i;
    }
    for (int i = 0; rc == KVGEN_OK && i < n; i++) {
        toks[i] = k->toks[order[i]];
        nt[i] = k->n_toks[order[i]];
    }
    if (rc == KVGEN_OK && n > 1) rc = kvg_score_sequences(s, toks, nt, (size_t)n, lp, err);
    int pick = -1;
    if (rc == KVGEN_OK) {
        double max = -INFINITY;
        for (int i = 0; i < n; i++) {
            if (banned(sm, toks[i], nt[i])) lp[i] = NAN;
            else if (pick < 0 || lp[i] > max) {
                max = lp[i];
                pick = i; /* the first of equal scores, as s:choose's best */
            }
        }
        if (pick < 0)
            rc = kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "generate: the logit bias bans a token of every choice");
        float temp = sm->params.temperature;
        if (rc == KVGEN_OK && temp > 0 && n > 1) {
            /* p(choice) ~ exp(logprob / T): at T = 1 the sequence probabilities, renormalised */
            double total = 0.0;
            for (int i = 0; i < n; i++)
                if (!isnan(lp[i]) && isfinite(max)) total += exp((lp[i] - max) / temp);
            if (total > 0) {
                double r = kvg_rng_uniform(&sm->rng) * total, cum = 0.0;
                for (int i = 0; i < n; i++) {
                    if (isnan(lp[i])) continue;
                    cum += exp((lp[i] - max) / temp);
                    pick = i;
                    if (r < cum) break;
                }
            }
        }
    }
    if (rc == KVGEN_OK) {
        int c = order[pick];
        st->seg = 0;
        st->a = c;
        st->b = c + 1;
        st->c = 0;
        k->picked = true;
    }
    kvg_free(order);
    kvg_free(toks);
    kvg_free(nt);
    kvg_free(lp);
    return rc;
}

kvgen_status kvg_cons_mask(const kvg_cons *k, const kvg_cons_state *st, const kvg_token_bytes *p, const kvgen_model *m,
                           uint8_t *allowed, int *n_allowed, kvgen_error *err) {
    *n_allowed = 0;
    if (k->gm) { /* the grammar's matcher walks the vocabulary's trie */
        const kvg_vocab_trie *trie;
        kvgen_status rc = kvg_vocab_trie_get(m, &trie, err);
        if (rc != KVGEN_OK) return rc;
        int n = kvg_gram_mask(k->gm, trie, allowed, err);
        if (n < 0) return kvg_gram_match_failure(k->gm)->status;
        *n_allowed = n;
        return KVGEN_OK;
    }
    if (k->picked) { /* the picked choice's next token, and nothing else */
        memset(allowed, 0, (size_t)p->n);
        if (st->seg != 0) return KVGEN_OK;
        size_t at = 0;
        for (size_t j = 0; j < k->n_toks[st->a]; j++) {
            int32_t t = k->toks[st->a][j];
            if (at == (size_t)st->c) {
                allowed[t] = 1;
                *n_allowed = 1;
                return KVGEN_OK;
            }
            at += p->off[t + 1] - p->off[t];
        }
        return KVGEN_OK;
    }
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
    *n_allowed = count;
    return KVGEN_OK;
}
