/* grammar_check.c: the checks that refuse a grammar that cannot complete: every rule defined,
 * root present, no rule that never completes, no left recursion; alternatives that can never
 * complete are dropped, so that every text the matcher accepts can be completed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar_internal.h"

static const char *rule_desc(const parser *P, int r, char *buf, size_t size) {
    const prule *u = &P->rules[P->rules[r].owner];
    snprintf(buf, size, "rule '%s' (line %d column %d)", u->name, u->line, u->col);
    return buf;
}

static bool alt_all(const palt *A, const bool *ok) {
    for (int i = 0; i < A->n; i++)
        if (A->e[i].kind == E_REF && !ok[A->e[i].arg]) return false;
    return true;
}

/* flag[r] for each rule with an alternative whose references all have the flag: productive
 * (the rule matches some complete text) or, bytes_fail, nullable (it matches the empty text:
 * an alternative with a byte class never does). Settled from a list of the rules just flagged,
 * not in rounds, so a chain of rules costs one pass. False when out of memory. */
static bool settle(const parser *P, bool *flag, bool bytes_fail) {
    size_t n_alt = 0, n_ref = 0;
    for (int r = 0; r < P->n_rules; r++) {
        n_alt += (size_t)P->rules[r].n_alts;
        for (int a = 0; a < P->rules[r].n_alts; a++)
            for (int i = 0; i < P->rules[r].alts[a].n; i++) n_ref += P->rules[r].alts[a].e[i].kind == E_REF;
    }
    int *left = kvg_malloc((n_alt + 1) * sizeof *left);       /* an alternative's references not flagged */
    int *alt_rule = kvg_malloc((n_alt + 1) * sizeof *alt_rule);
    int *use_at = kvg_calloc((size_t)P->n_rules + 2, sizeof *use_at); /* the alternatives using rule t: */
    int *uses = kvg_malloc((n_ref + 1) * sizeof *uses);              /* uses[use_at[t] .. use_at[t + 1]) */
    int *queue = kvg_malloc(((size_t)P->n_rules + 1) * sizeof *queue);
    bool ok = left && alt_rule && use_at && uses && queue;
    int n_queue = 0;
    if (ok) {
        size_t id = 0;
        for (int r = 0; r < P->n_rules; r++)
            for (int a = 0; a < P->rules[r].n_alts; a++, id++) {
                const palt *A = &P->rules[r].alts[a];
                alt_rule[id] = r;
                left[id] = 0;
                for (int i = 0; i < A->n; i++) {
                    if (A->e[i].kind == E_REF) {
                        left[id]++;
                        use_at[A->e[i].arg + 2]++;
                    } else if (bytes_fail) {
                        left[id] = -1 - A->n; /* never reaches 0 */
                        break;
                    }
                }
                if (left[id] == 0 && !flag[r]) flag[r] = true, queue[n_queue++] = r;
            }
        for (int t = 0; t < P->n_rules; t++) use_at[t + 2] += use_at[t + 1];
        id = 0;
        for (int r = 0; r < P->n_rules; r++)
            for (int a = 0; a < P->rules[r].n_alts; a++, id++) {
                const palt *A = &P->rules[r].alts[a];
                for (int i = 0; i < A->n; i++)
                    if (A->e[i].kind == E_REF) uses[use_at[A->e[i].arg + 1]++] = (int)id;
            }
        /* use_at[t + 1] is now the end of t's uses, use_at[t] their start */
        while (n_queue > 0) {
            int t = queue[--n_queue];
            for (int u = use_at[t]; u < use_at[t + 1]; u++) {
                int al = uses[u];
                if (--left[al] == 0 && !flag[alt_rule[al]]) {
                    flag[alt_rule[al]] = true;
                    queue[n_queue++] = alt_rule[al];
                }
            }
        }
    }
    kvg_free(left);
    kvg_free(alt_rule);
    kvg_free(use_at);
    kvg_free(uses);
    kvg_free(queue);
    return ok;
}

/* Depth first from rule `from` over references, with an explicit stack (frames: room for
 * every rule; a grammar may chain rules deeper than the C stack goes). left: the references an
 * alternative can start with (flag: the rule can match the empty text); otherwise the
 * references to rules that never complete (flag: the rule is productive). Returns the rule
 * where a cycle closes, -1 when there is none. */
typedef struct dfs_frame {
    int r, a, i;
} dfs_frame;

static int find_cycle(const parser *P, int from, const bool *flag, bool left, uint8_t *color, dfs_frame *fr) {
    int top = 0;
    fr[0] = (dfs_frame){from, 0, 0};
    color[from] = 1;
    while (top >= 0) {
        dfs_frame *f = &fr[top];
        const prule *R = &P->rules[f->r];
        if (f->a >= R->n_alts) {
            color[f->r] = 2;
            top--;
            continue;
        }
        const palt *A = &R->alts[f->a];
        if (f->i >= A->n || (left && A->e[f->i].kind != E_REF)) {
            f->a++;
            f->i = 0;
            continue;
        }
        const gel *e = &A->e[f->i];
        if (!left && (e->kind != E_REF || flag[e->arg])) {
            f->i++;
            continue;
        }
        int t = e->arg;
        f->i = left && !flag[t] ? A->n : f->i + 1; /* left: what follows t comes after a byte */
        if (color[t] == 1) return t;
        if (color[t] == 0) {
            color[t] = 1;
            fr[++top] = (dfs_frame){t, 0, 0};
        }
    }
    return -1;
}

void kvg_gram_check(parser *P, int root) {
    char d[160];
    for (int r = 0; r < P->n_rules && P->st == KVGEN_OK; r++)
        if (!P->rules[r].defined) {
            P->st = kvg_fail(P->err, KVGEN_E_INVALID_ARGUMENT,
                             "grammar: rule '%s' is used (line %d column %d) but never defined", P->rules[r].name,
                             P->rules[r].line, P->rules[r].col);
            return;
        }
    if (root < 0) {
        P->st = kvg_fail(P->err, KVGEN_E_INVALID_ARGUMENT, "grammar: no rule 'root' (the rule the text must match)");
        return;
    }
    size_t n = (size_t)P->n_rules;
    bool *flag = kvg_calloc(n, sizeof *flag);
    uint8_t *color = kvg_calloc(n, 1);
    dfs_frame *frames = kvg_malloc(n * sizeof *frames);
    if (!flag || !color || !frames) {
        kvg_free(flag);
        kvg_free(color);
        kvg_free(frames);
        kvg_gram_parse_oom(P);
        return;
    }
    if (!settle(P, flag, false)) {
        kvg_free(flag);
        kvg_free(color);
        kvg_free(frames);
        kvg_gram_parse_oom(P);
        return;
    }
    if (!flag[root]) {
        int c = find_cycle(P, root, flag, false, color, frames);
        P->st = kvg_fail(P->err, KVGEN_E_INVALID_ARGUMENT,
                         "grammar: %s never completes: every way through it needs itself again (the grammar matches "
                         "no text)",
                         rule_desc(P, c >= 0 ? c : root, d, sizeof d));
    }
    /* alternatives that can never complete are dropped: every text the matcher accepts can
     * then be completed */
    for (int r = 0; P->st == KVGEN_OK && r < P->n_rules; r++) {
        prule *R = &P->rules[r];
        int k = 0;
        for (int a = 0; a < R->n_alts; a++) {
            if (alt_all(&R->alts[a], flag)) R->alts[k++] = R->alts[a];
            else kvg_free(R->alts[a].e);
        }
        R->n_alts = k;
    }
    if (P->st == KVGEN_OK) {
        memset(flag, 0, n * sizeof *flag);
        if (!settle(P, flag, true)) kvg_gram_parse_oom(P);
        for (int r = 0; r < P->n_rules && P->st == KVGEN_OK; r++) {
            if (color[r]) continue;
            int c = find_cycle(P, r, flag, true, color, frames);
            if (c >= 0) {
                const char *what = P->rules[c].what;
                P->st = kvg_fail(P->err, KVGEN_E_INVALID_ARGUMENT,
                                 "grammar: %s is left-recursive: it can reach itself without reading a byte%s%s%s",
                                 rule_desc(P, c, d, sizeof d), what ? " (in " : "", what ? what : "",
                                 what ? " of text that can be empty)" : "");
            }
        }
    }
    kvg_free(flag);
    kvg_free(color);
    kvg_free(frames);
}

