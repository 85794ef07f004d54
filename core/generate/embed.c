/* embed.c: kvgen_embed, a vector per text (kvgen.h, "embeddings").
 *
 * An encoder (kvg_arch.encoder: bert) runs through its backend's encode op: texts are
 * tokenized ([CLS] text [SEP]), cut to the model's length, and sent in batches of up to
 * EMBED_BATCH_TOKENS tokens, so a weight row is read once for many texts. The per-token hidden
 * states come back and are pooled here (mean, first or last token), then L2-normalized.
 *
 * A decoder (llama, qwen, ...) runs each text through a fresh session of its own, sized to the
 * text, whose forward pass returns every token's final hidden state (after the output norm, the
 * logits' input: kvg_session_hidden) instead of logits; those are pooled the same way. Causal
 * attention makes the last token the one that has read the whole text, hence its default.
 *
 * Why here: pooling needs the tokenizer (format/), a forward pass (model/'s backend ops) and, for
 * a decoder, sessions (session/); generate/ is the layer above them that already turns forward
 * passes into answers for callers. */
#include <math.h>
#include <string.h>
#include "kvg_backend.h"
#include "kvg_generate.h"
#include "kvg_session.h"

/* tokens per encode call: bounds one batch's activations, about EMBED_BATCH_TOKENS x (6 n_embd +
 * n_ff) floats (30 MiB for all-MiniLM-L6-v2), while a weight row is still read for 8 full texts */
#define EMBED_BATCH_TOKENS 2048
#define WHO "kvgen_embed"

/* the pooling the caller asked for, else the file's, else the architecture's natural one */
static kvgen_pooling pooling_of(const kvgen_model *m, const kvgen_embed_desc *d) {
    if (d->pooling != KVGEN_POOLING_DEFAULT) return d->pooling;
    switch (m->w.hp.pooling) {
    case KVG_POOLING_MEAN: return KVGEN_POOLING_MEAN;
    case KVG_POOLING_CLS: return KVGEN_POOLING_CLS;
    case KVG_POOLING_LAST: return KVGEN_POOLING_LAST;
    default: return m->w.arch && m->w.arch->encoder ? KVGEN_POOLING_MEAN : KVGEN_POOLING_LAST;
    }
}

/* text i's tokens into *buf (grown as needed), cut to max; *n gets the count */
static kvgen_status tokenize_text(const kvgen_model *m, const char *text, size_t len, size_t i, int max, int32_t **buf,
                                  size_t *cap, size_t *n, kvgen_error *err) {
    kvgen_error scratch;
    kvgen_status st = kvg_tokenize(m->tok, text, len, KVGEN_TOKENIZE_ADD_BOS, *buf, *cap, n, &scratch);
    if (st == KVGEN_E_INVALID_ARGUMENT && *n > *cap) {
        int32_t *nb = kvg_realloc(*buf, *n * sizeof **buf);
        if (!nb) return kvg_fail(err, KVGEN_E_NO_MEMORY, WHO ": out of memory for text %zu's %zu tokens", i, *n);
        *buf = nb;
        *cap = *n;
        st = kvg_tokenize(m->tok, text, len, KVGEN_TOKENIZE_ADD_BOS, *buf, *cap, n, &scratch);
    }
    if (st != KVGEN_OK) return kvg_fail(err, st, WHO ": text %zu: %s", i, scratch.message);
    if (*n == 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, WHO ": text %zu has no tokens (empty, and the model adds no "
                        "BOS or [CLS] to embed)", i);
    if (*n > (size_t)max) {
        bool sep = m->w.arch && m->w.arch->encoder && kvg_tokenizer_eos(m->tok) >= 0 &&
                   (*buf)[*n - 1] == kvg_tokenizer_eos(m->tok);
        if (sep) (*buf)[max - 1] = (*buf)[*n - 1]; /* [CLS] ... [SEP], as BERT's truncation keeps them */
        *n = (size_t)max;
    }
    return KVGEN_OK;
}

/* out[0..D) = pooled hidden[0..n) (rows of D), normalized unless asked not to */
static void pool(const float *hidden, int n, int D, kvgen_pooling how, bool normalize, float *out) {
    if (how == KVGEN_POOLING_CLS) memcpy(out, hidden, (size_t)D * sizeof(float));
    else if (how == KVGEN_POOLING_LAST) memcpy(out, hidden + (size_t)(n - 1) * D, (size_t)D * sizeof(float));
    else {
        for (int d = 0; d < D; d++) {
            double s = 0.0;
            for (int t = 0; t < n; t++) s += hidden[(size_t)t * D + d];
            out[d] = (float)(s / n);
        }
    }
    if (!normalize) return;
    double ss = 0.0;
    for (int d = 0; d < D; d++) ss += (double)out[d] * out[d];
    if (ss > 0.0) {
        float inv = (float)(1.0 / sqrt(ss));
        for (int d = 0; d < D; d++) out[d] *= inv;
    }
}

/* runs texts [first, first + count) (their tokens back to back in tokens, counts in n_tok) and
 * pools each into out */
static kvgen_status run_batch(kvgen_model *m, const int32_t *tokens, const int *n_tok, int count, size_t total,
                              kvgen_pooling how, bool normalize, float *out, kvgen_error *err) {
    int D = m->w.hp.n_embd;
    float *hidden = kvg_malloc(total * (size_t)D * sizeof(float));
    if (!hidden) return kvg_fail(err, KVGEN_E_NO_MEMORY, WHO ": out of memory for %zu tokens' states", total);
    kvg_encode_batch b = {.tokens = tokens, .n_tokens = n_tok, .n_seq = count, .hidden = hidden};
    kvgen_status st = m->ops->encode(m, &b, err);
    for (int i = 0, at = 0; st == KVGEN_OK && i < count; at += n_tok[i], i++)
        pool(hidden + (size_t)at * D, n_tok[i], D, how, normalize, out + (size_t)i * D);
    kvg_free(hidden);
    return st;
}

/* a decoder: each text through a session of its own (kvg_session_hidden) */
static kvgen_status embed_decoder(kvgen_model *m, const char *const *texts, const size_t *lens, size_t n, int max,
                                  kvgen_pooling how, bool normalize, float *out, kvgen_error *err) {
    size_t D = (size_t)m->w.hp.n_embd, cap = 0;
    int32_t *tokens = NULL;
    float *hidden = NULL;
    kvgen_status st = KVGEN_OK;
    for (size_t i = 0; st == KVGEN_OK && i < n; i++) {
        size_t nt = 0;
        st = tokenize_text(m, texts[i], lens ? lens[i] : strlen(texts[i]), i, max, &tokens, &cap, &nt, err);
        if (st != KVGEN_OK) break;
        float *h = kvg_realloc(hidden, nt * D * sizeof *h);
        if (!h) {
            st = kvg_fail(err, KVGEN_E_NO_MEMORY, WHO ": out of memory for text %zu's %zu hidden states", i, nt);
            break;
        }
        hidden = h;
        kvgen_session *s = NULL;
        kvgen_session_desc sd = {.n_ctx = (int)nt};
        kvgen_error e = {0};
        st = kvgen_session_create(m, &sd, &s, &e);
        if (st == KVGEN_OK) st = kvg_session_hidden(s, tokens, nt, hidden, &e);
        kvgen_session_close(s);
        if (st != KVGEN_OK) st = kvg_fail(err, st, WHO ": text %zu: %s", i, e.message);
        else pool(hidden, (int)nt, (int)D, how, normalize, out + i * D);
    }
    kvg_free(tokens);
    kvg_free(hidden);
    return st;
}

kvgen_status kvgen_embed(kvgen_model *model, const char *const *texts, const size_t *lens, size_t n,
                         const kvgen_embed_desc *desc, float *out, size_t out_floats, kvgen_error *err) {
    if (!model) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, WHO ": model is NULL");
    if (n > 0 && (!texts || !out)) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, WHO ": %s is NULL", texts ? "out" : "texts");
    if (!model->tok || !model->w.arch)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, WHO ": %s has no local weights and tokenizer to embed with",
                        model->name ? model->name : "the model");
    kvgen_embed_desc d = {0};
    if (desc) d = *desc;
    if (d.pooling < KVGEN_POOLING_DEFAULT || d.pooling > KVGEN_POOLING_LAST)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, WHO ": pooling %d is not a kvgen_pooling (0 to 3)", (int)d.pooling);
    if (d.max_tokens < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, WHO ": max_tokens %d must be >= 0", d.max_tokens);
    const kvg_hparams *hp = &model->w.hp;
    size_t D = (size_t)hp->n_embd;
    if (out_floats / D < n)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, WHO ": out holds %zu floats, %zu texts need %zu (%zu each)",
                        out_floats, n, n * D, D);
    for (size_t i = 0; i < n; i++)
        if (!texts[i]) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, WHO ": text %zu is NULL", i);
    bool encoder = model->w.arch->encoder;
    if ((encoder && !model->ops->encode) || (!encoder && !model->ops->hidden_out))
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, WHO ": the %s backend does not embed with %s (%s); the reference, "
                        "cpu and vulkan backends do", model->ops->name, model->name ? model->name : "the model",
                        model->w.arch->name);
    int max = hp->n_ctx_rope > 0 && hp->n_ctx_rope < hp->n_ctx_train ? hp->n_ctx_rope : hp->n_ctx_train;
    if (d.max_tokens > 0 && d.max_tokens < max) max = d.max_tokens;
    if (max < 2) max = 2; /* room for [CLS] and [SEP] */
    kvgen_pooling how = pooling_of(model, &d);
    bool normalize = !d.no_normalize;
    if (!encoder) return embed_decoder(model, texts, lens, n, max, how, normalize, out, err);

    int32_t *one = NULL, *batch = kvg_malloc((size_t)(EMBED_BATCH_TOKENS + max) * sizeof *batch);
    int *n_tok = kvg_malloc((n ? n : 1) * sizeof *n_tok);
    size_t one_cap = 0;
    kvgen_status st = KVGEN_OK;
    if (!batch || !n_tok) st = kvg_fail(err, KVGEN_E_NO_MEMORY, WHO ": out of memory");
    size_t first = 0, total = 0;
    for (size_t i = 0; st == KVGEN_OK && i < n; i++) {
        size_t nt = 0;
        st = tokenize_text(model, texts[i], lens ? lens[i] : strlen(texts[i]), i, max, &one, &one_cap, &nt, err);
        if (st != KVGEN_OK) break;
        if (total + nt > EMBED_BATCH_TOKENS && i > first) { /* the batch is full: run it */
            st = run_batch(model, batch, n_tok + first, (int)(i - first), total, how, normalize, out + first * D, err);
            first = i;
            total = 0;
            if (st != KVGEN_OK) break;
        }
        memcpy(batch + total, one, nt * sizeof *batch);
        n_tok[i] = (int)nt;
        total += nt;
    }
    if (st == KVGEN_OK && n > first)
        st = run_batch(model, batch, n_tok + first, (int)(n - first), total, how, normalize, out + first * D, err);
    kvg_free(one);
    kvg_free(batch);
    kvg_free(n_tok);
    return st;
}
