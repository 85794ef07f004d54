/* choose.c: choice scoring. The context's K/V are computed once (the session as it is); each
 * candidate runs as one batched prefill on a fork, which shares the context's pages
 * copy-on-write, so a candidate costs only its own tokens. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_sampler.h"

/* log softmax(logits)[token], in double so long sums stay exact enough to compare */
static double log_prob(const float *logits, int n, int32_t token) {
    float max = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > max) max = logits[i];
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - (double)max);
    return (double)logits[token] - (double)max - log(sum);
}

static kvgen_status tokenize_all(const kvgen_model *m, const char *text, int32_t **out, size_t *n, kvgen_error *err) {
    size_t len = strlen(text), cap = len + 8;
    *out = NULL;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_choose: out of memory");
    kvgen_status st = kvgen_tokenize(m, text, len, 0, v, cap, n, err);
    if (st == KVGEN_E_INVALID_ARGUMENT && *n > cap) {
        int32_t *w = realloc(v, *n * sizeof *v);
        if (!w) {
            free(v);
            return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_choose: out of memory");
        }
        v = w;
        cap = *n;
        st = kvgen_tokenize(m, text, len, 0, v, cap, n, err);
    }
    if (st != KVGEN_OK) {
        free(v);
        return st;
    }
    *out = v;
    return KVGEN_OK;
}

kvgen_status kvgen_session_choose(kvgen_session *s, const char *const *candidates, size_t n, kvgen_choice *results,
                                  kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_choose: session is NULL");
    if (n == 0) return KVGEN_OK;
    if (!candidates || !results)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_choose: candidates or results is NULL");
    for (size_t i = 0; i < n; i++)
        if (!candidates[i] || !candidates[i][0])
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_choose: candidate %zu is NULL or empty", i);
    const float *ctx_logits = kvgen_session_logits(s);
    if (!ctx_logits)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "kvgen_session_choose: the session has no logits: prefill the context first");
    const kvgen_model *m = kvg_session_model(s);
    int V = m->w.hp.n_vocab;
    memset(results, 0, n * sizeof *results);

    kvgen_status st = KVGEN_OK;
    float *all = NULL;
    size_t all_cap = 0;
    for (size_t i = 0; i < n && st == KVGEN_OK; i++) {
        int32_t *toks;
        size_t nt;
        st = tokenize_all(m, candidates[i], &toks, &nt, err);
        if (st != KVGEN_OK) break;
        if (nt == 0) {
            free(toks);
            st = kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_choose: candidate %zu has no tokens", i);
            break;
        }
        double lp = log_prob(ctx_logits, V, toks[0]);
        if (nt > 1) {
            /* the last token's own successor is not needed: prefill all but it */
            size_t need = (nt - 1) * (size_t)V;
            if (need > all_cap) {
                float *a = realloc(all, need * sizeof *a);
                if (!a) {
                    free(toks);
                    st = kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_choose: out of memory for logits");
                    break;
                }
                all = a;
                all_cap = need;
            }
            kvgen_session *child = NULL;
            st = kvgen_session_fork(s, &child, err);
            if (st == KVGEN_OK) st = kvgen_session_prefill(child, toks, nt - 1, all, err);
            kvgen_session_close(child);
            for (size_t j = 1; j < nt && st == KVGEN_OK; j++) lp += log_prob(all + (j - 1) * (size_t)V, V, toks[j]);
        }
        free(toks);
        results[i].logprob = lp;
        results[i].n_tokens = (int)nt;
        results[i].logprob_mean = lp / (double)nt;
    }
    free(all);
    return st;
}
