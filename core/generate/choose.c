/* choose.c: choice scoring. The context's K/V are computed once (the session as it is) and
 * every candidate continues from a fork of it, which shares the context's pages
 * copy-on-write, so a candidate costs only its own tokens. The candidates advance together:
 * step j decodes token j-1 of every candidate that has a token j as one batch
 * (kvg_session_decode_batch), so each weight is read once per step for all of them;
 * candidates drop out as they finish. One that would not fit without a context shift runs
 * as one prefill instead.
 * Candidates are spelled as their exact bytes (kvg_spell), as choice-constrained generation
 * spells them, which picks by these same scores (kvg_score_sequences). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_constrain.h"
#include "kvg_model.h"
#include "kvg_sampler.h"
#include "kvg_session.h"

/* forks alive at once: bounds the scratch and the pages held */
enum { CHOOSE_GROUP = 16 };

/* log softmax(logits)[token], in double so long sums stay exact enough to compare */
static double log_prob(const float *logits, int n, int32_t token) {
    float max = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > max) max = logits[i];
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - (double)max);
    return (double)logits[token] - (double)max - log(sum);
}

typedef struct choice_run {
    const int32_t *toks;
    size_t nt;
    double lp;
} choice_run;

/* One candidate as one prefill of all but its last token on a fork; `all` is scratch of
 * (nt - 1) * V floats. */
static kvgen_status score_prefill(kvgen_session *s, choice_run *c, int V, float *all, kvgen_error *err) {
    kvgen_session *child = NULL;
    kvgen_status st = kvgen_session_fork(s, &child, err);
    if (st == KVGEN_OK) st = kvgen_session_prefill(child, c->toks, c->nt - 1, all, err);
    kvgen_session_close(child);
    for (size_t j = 1; j < c->nt && st == KVGEN_OK; j++) c->lp += log_prob(all + (j - 1) * (size_t)V, V, c->toks[j]);
    return st;
}

/* Candidates g[0..k) (each with nt > 1, fitting the context without a shift) advanced
 * together, one batched decode per step. Each session's logits in a batch equal a decode of
 * it alone (the backend's forward contract), so the scores are those of decoding every
 * candidate on its own. */
static kvgen_status score_batched(kvgen_session *s, choice_run *const *g, int k, int V, kvgen_error *err) {
    kvgen_session *child[CHOOSE_GROUP] = {0}, *active[CHOOSE_GROUP];
    int32_t tokens[CHOOSE_GROUP];
    kvgen_status status[CHOOSE_GROUP];
    kvgen_error errs[CHOOSE_GROUP];
    int which[CHOOSE_GROUP];
    kvgen_status st = KVGEN_OK;
    size_t longest = 0;
    for (int i = 0; i < k && st == KVGEN_OK; i++) {
        st = kvgen_session_fork(s, &child[i], err);
        if (g[i]->nt > longest) longest = g[i]->nt;
    }
    for (size_t j = 1; j < longest && st == KVGEN_OK; j++) {
        int na = 0;
        for (int i = 0; i < k; i++) {
            if (g[i]->nt <= j) continue;
            active[na] = child[i];
            tokens[na] = g[i]->toks[j - 1];
            which[na++] = i;
        }
        st = kvg_session_decode_batch(active, tokens, na, true, status, errs);
        for (int a = 0; a < na && st != KVGEN_OK; a++)
            if (status[a] != KVGEN_OK) {
                if (err) *err = errs[a];
                break;
            }
        for (int a = 0; a < na && st == KVGEN_OK; a++) {
            choice_run *c = g[which[a]];
            c->lp += log_prob(active[a]->logits, V, c->toks[j]);
        }
    }
    for (int i = 0; i < k; i++) kvgen_session_close(child[i]);
    return st;
}

/* Scores runs[0..n) (tokens set, lp 0) from the session's current logits. */
static kvgen_status score_runs(kvgen_session *s, choice_run *runs, size_t n, kvgen_error *err) {
    const float *ctx_logits = kvgen_session_logits(s);
    if (!ctx_logits)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "kvgen_session_choose: the session has no logits: prefill the context first");
    const kvgen_model *m = kvg_session_model(s);
    int V = m->w.hp.n_vocab;
    kvgen_status st = KVGEN_OK;
    size_t max_nt = 0;
    for (size_t i = 0; i < n; i++) {
        runs[i].lp = log_prob(ctx_logits, V, runs[i].toks[0]);
        if (runs[i].nt > max_nt) max_nt = runs[i].nt;
    }

    /* batched decodes need a cache and must not shift the context, which a prefill of the
     * whole candidate would do differently; such candidates run as prefills */
    bool batch = !s->no_cache;
    size_t room = (size_t)s->n_ctx - s->n_tokens;
    float *logits = NULL;
    if (max_nt > 1) {
        logits = kvg_malloc(max_nt * (size_t)V * sizeof *logits);
        if (!logits) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_choose: out of memory for logits");
    }
    choice_run *group[CHOOSE_GROUP];
    int k = 0;
    for (size_t i = 0; i < n && st == KVGEN_OK; i++) {
        choice_run *c = &runs[i];
        if (c->nt < 2) continue;
        if (!batch || c->nt - 1 > room) {
            st = score_prefill(s, c, V, logits, err);
            continue;
        }
        group[k++] = c;
        if (k == CHOOSE_GROUP) {
            st = score_batched(s, group, k, V, err);
            k = 0;
        }
    }
    if (st == KVGEN_OK && k > 0) st = score_batched(s, group, k, V, err);
    kvg_free(logits);
    return st;
}

kvgen_status kvg_score_sequences(kvgen_session *s, const int32_t *const *toks, const size_t *n_toks, size_t n,
                                 double *logprob, kvgen_error *err) {
    if (n == 0) return KVGEN_OK;
    choice_run *runs = kvg_calloc(n, sizeof *runs);
    if (!runs) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_choose: out of memory for %zu candidates", n);
    for (size_t i = 0; i < n; i++) {
        runs[i].toks = toks[i];
        runs[i].nt = n_toks[i];
    }
    kvgen_status st = score_runs(s, runs, n, err);
    for (size_t i = 0; st == KVGEN_OK && i < n; i++) logprob[i] = runs[i].lp;
    kvg_free(runs);
    return st;
}

kvgen_status kvgen_session_choose(kvgen_session *s, const char *const *candidates, size_t n, kvgen_choice *results,
                                  kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_choose: session is NULL");
    kvgen_status busy_ = kvg_session_check_host(s, "kvgen_session_choose", err);
    if (busy_ != KVGEN_OK) return busy_;
    if (n == 0) return KVGEN_OK;
    if (!candidates || !results)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_choose: candidates or results is NULL");
    for (size_t i = 0; i < n; i++)
        if (!candidates[i] || !candidates[i][0])
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_choose: candidate %zu is NULL or empty", i);
    if (s->kind->score) { /* the kind's own scores (a remote session: its server's log-probabilities) */
        double *lp = kvg_calloc(n, sizeof *lp);
        int *nt = kvg_calloc(n, sizeof *nt);
        kvgen_status st = lp && nt ? s->kind->score(s, candidates, n, lp, nt, "kvgen_session_choose", err)
                                   : kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_choose: out of memory");
        for (size_t i = 0; st == KVGEN_OK && i < n; i++) {
            results[i].logprob = lp[i];
            results[i].n_tokens = nt[i];
            results[i].logprob_mean = nt[i] > 0 ? lp[i] / nt[i] : 0;
        }
        kvg_free(lp);
        kvg_free(nt);
        return st;
    }
    if (!kvgen_session_logits(s))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "kvgen_session_choose: the session has no logits: prefill the context first");
    memset(results, 0, n * sizeof *results);

    choice_run *runs = kvg_calloc(n, sizeof *runs);
    int32_t **spelled = kvg_calloc(n, sizeof *spelled);
    kvgen_status st = runs && spelled ? KVGEN_OK
                                      : kvg_fail(err, KVGEN_E_NO_MEMORY,
                                                 "kvgen_session_choose: out of memory for %zu candidates", n);
    /* each candidate as the exact bytes given (the spelling choice generation emits) */
    kvg_speller sp;
    kvg_speller_init(&sp, kvg_session_model(s));
    for (size_t i = 0; i < n && st == KVGEN_OK; i++) {
        kvgen_error e = {0};
        st = kvg_spell(&sp, candidates[i], &spelled[i], &runs[i].nt, &e);
        if (st == KVGEN_E_INVALID_ARGUMENT)
            kvg_fail(err, st, "kvgen_session_choose: candidate %zu: %s", i, e.message);
        else if (st != KVGEN_OK && err)
            *err = e;
        runs[i].toks = spelled[i];
    }
    kvg_speller_free(&sp);
    if (st == KVGEN_OK) st = score_runs(s, runs, n, err);
    for (size_t i = 0; i < n; i++) {
        if (st == KVGEN_OK) {
            results[i].logprob = runs[i].lp;
            results[i].n_tokens = (int)runs[i].nt;
            results[i].logprob_mean = runs[i].lp / (double)runs[i].nt;
        }
        if (spelled) kvg_free(spelled[i]);
    }
    kvg_free(spelled);
    kvg_free(runs);
    return st;
}
