/* cpu_encode.c: an encoder's forward pass (kvg_arch.encoder: bert) on the host's cores, shared
 * by the reference and cpu backends, which pass their own matrix products and, for the cpu
 * backend, its vector operations for attention and GELU (kvg_cpu.h).
 *
 * Per token t at position p of its text (shapes: N = tokens of all texts, D = n_embd,
 * F = n_ff, H = n_head, hd = head_dim):
 *   x = LN(tok_embd[t] + token_types[0] + position_embd[p]) * w + b        x: [N][D]
 *   per block:
 *     q, k, v = x Wq + bq, x Wk + bk, x Wv + bv                         [N][H*hd]
 *     a = softmax(q k^T / sqrt(hd)) v over every token of the same text  [N][H*hd]
 *     x = LN(x + a Wo + bo) * attn_output_norm                           [N][D]
 *     x = LN(x + gelu(x Wup + bup) Wdown + bdown) * layer_output_norm    [N][D]
 * The last x is what the batch returns; pooling is the caller's (kvgen_embed).
 * Activations for the whole batch are allocated per call: an embedding call is not a token
 * loop, and its texts are bounded by the model's n_ctx_train. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "kvg_cpu.h"
#include "kvg_qdot.h"
#include "kvg_quant.h"

void kvg_cpu_layernorm(float *out, const float *x, const float *w, const float *b, int n, float eps) {
    double sum = 0.0, sq = 0.0; /* double: the oracle should not lose bits over hundreds of elements */
    for (int i = 0; i < n; i++) sum += x[i];
    double mean = sum / n;
    for (int i = 0; i < n; i++) sq += ((double)x[i] - mean) * ((double)x[i] - mean);
    float scale = (float)(1.0 / sqrt(sq / n + eps));
    for (int i = 0; i < n; i++) out[i] = (float)((x[i] - mean) * scale) * w[i] + (b ? b[i] : 0.0f);
}

/* softmax over x[0..n) in place (the reference's form; here too, so this file depends on no backend) */
static void softmax(float *x, int n) {
    float max = x[0], sum = 0.0f;
    for (int i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    for (int i = 0; i < n; i++) sum += x[i] = expf(x[i] - max);
    for (int i = 0; i < n; i++) x[i] /= sum;
}

float kvg_cpu_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

typedef struct enc_attention {
    const kvg_hparams *hp;
    const float *q, *k, *v; /* [N][H*hd] */
    float *att;             /* [N][H*hd] */
    const int *seq_start;   /* [N] the first token of each token's text */
    const int *seq_len;     /* [N] that text's length */
    float *scores;          /* [threads][max_len] */
    int max_len;
    const kvg_vec_ops *vec; /* or NULL: scalar loops */
} enc_attention;

/* one (token, head) per item: softmax over every token of its text, then the weighted values;
 * with the backend's vector operations (vec) where it passes them, else in scalar loops */
static void attention_items(void *ctx, int begin, int end, int tid) {
    const enc_attention *j = ctx;
    int H = j->hp->n_head, hd = j->hp->head_dim, W = H * hd;
    float scale = 1.0f / sqrtf((float)hd);
    float *scores = j->scores + (size_t)tid * (size_t)j->max_len;
    const kvg_vec_ops *vec = j->vec;
    for (int item = begin; item < end; item++) {
        int t = item / H, h = item % H, s0 = j->seq_start[t], n = j->seq_len[t];
        const float *q = j->q + (size_t)t * W + (size_t)h * hd;
        const float *k0 = j->k + (size_t)s0 * W + (size_t)h * hd, *v0 = j->v + (size_t)s0 * W + (size_t)h * hd;
        float *o = j->att + (size_t)t * W + (size_t)h * hd;
        if (vec) {
            vec->dot_rows(q, k0, (size_t)W, n, hd, scores);
            vec->scale(scores, scale, n);
            float sum = vec->exp_sum(scores, n, vec->max(scores, n));
            vec->scale(scores, 1.0f / sum, n);
            memset(o, 0, (size_t)hd * sizeof *o);
            vec->axpy_rows(o, scores, v0, (size_t)W, n, hd);
            continue;
        }
        for (int u = 0; u < n; u++) {
            const float *k = k0 + (size_t)u * W;
            float dot = 0.0f;
            for (int i = 0; i < hd; i++) dot += q[i] * k[i];
            scores[u] = dot * scale;
        }
        softmax(scores, n);
        for (int i = 0; i < hd; i++) o[i] = 0.0f;
        for (int u = 0; u < n; u++) {
            const float *v = v0 + (size_t)u * W;
            for (int i = 0; i < hd; i++) o[i] += scores[u] * v[i];
        }
    }
}

/* the per-token work between the products, one token per item: the same operations on each
 * element whatever thread runs it */
typedef struct enc_tokens {
    float *y;          /* [N][width] */
    const float *f;    /* add_norm: [N][width] added before the norm */
    const float *bias; /* [width], or NULL */
    const float *w, *b; /* add_norm: the norm's weight and bias */
    int width;
    float eps;
    const kvg_vec_ops *vec; /* or NULL */
} enc_tokens;

/* y[t] += bias */
static void bias_items(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const enc_tokens *j = ctx;
    for (int t = begin; t < end; t++) {
        float *y = j->y + (size_t)t * j->width;
        for (int i = 0; i < j->width; i++) y[i] += j->bias[i];
    }
}

/* y[t] = gelu(y[t] + bias): the backend's vector form where it passes one, else kvg_cpu_gelu */
static void bias_gelu_items(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const enc_tokens *j = ctx;
    for (int t = begin; t < end; t++) {
        float *y = j->y + (size_t)t * j->width;
        if (j->vec) j->vec->gelu_erf(y, j->bias, j->width);
        else
            for (int i = 0; i < j->width; i++) y[i] = kvg_cpu_gelu(j->bias ? y[i] + j->bias[i] : y[i]);
    }
}

/* y[t] = LN(y[t] + f[t]) * w + b */
static void add_norm_items(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const enc_tokens *j = ctx;
    for (int t = begin; t < end; t++) {
        float *y = j->y + (size_t)t * j->width;
        const float *f = j->f + (size_t)t * j->width;
        for (int i = 0; i < j->width; i++) y[i] += f[i];
        kvg_cpu_layernorm(y, y, j->w, j->b, j->width, j->eps);
    }
}

/* out[t] = in[t] W (+ bias, then GELU where gelu) for every token, block rows per call of the
 * backend's product */
static void matmul_all(const kvg_cpu_encoder *e, int layer, int role, const float *in, int in_dim, int N, float *out,
                       int out_dim, const float *bias, bool gelu) {
    for (int t0 = 0; t0 < N; t0 += e->block) {
        int n = N - t0 < e->block ? N - t0 : e->block;
        e->mm(e->mm_ctx, layer, role, in + (size_t)t0 * in_dim, in_dim, n, out + (size_t)t0 * out_dim);
    }
    enc_tokens j = {.y = out, .bias = bias, .width = out_dim, .vec = e->vec};
    if (gelu) kvg_cpu_pool_run(e->pool, N, bias_gelu_items, &j);
    else if (bias) kvg_cpu_pool_run(e->pool, N, bias_items, &j);
}

/* x[t] = LN(x[t] + f[t]) * w + b */
static void add_norm(const kvg_cpu_encoder *e, float *x, const float *f, const float *w, const float *b, int N, int D,
                     float eps) {
    enc_tokens j = {.y = x, .f = f, .w = w, .b = b, .width = D, .eps = eps};
    kvg_cpu_pool_run(e->pool, N, add_norm_items, &j);
}

/* the embeddings of the batch's tokens, one token per item: token + type 0 + position, LayerNormed */
typedef struct enc_embed {
    const kvgen_model *m;
    const kvg_cpu_host *host;
    const int32_t *tokens;
    const int *seq_start;
    float *x;   /* [N][D] */
    float *row; /* [threads][D] */
} enc_embed;

static void embed_items(void *ctx, int begin, int end, int tid) {
    const enc_embed *j = ctx;
    const kvg_hparams *hp = &j->m->w.hp;
    const kvg_tensor *te = j->m->w.tok_embd, *pe = j->m->w.pos_embd, *ty = j->m->w.tok_types;
    int D = hp->n_embd;
    float *row = j->row + (size_t)tid * D;
    for (int t = begin; t < end; t++) {
        int p = t - j->seq_start[t];
        float *xt = j->x + (size_t)t * D;
        kvg_dequantize_row(te->type, (const unsigned char *)te->data + (size_t)j->tokens[t] *
                           kvg_row_bytes(te->type, te->ne[0]), xt, (uint64_t)D);
        kvg_dequantize_row(pe->type, (const unsigned char *)pe->data + (size_t)p * kvg_row_bytes(pe->type, pe->ne[0]),
                           row, (uint64_t)D);
        for (int d = 0; d < D; d++) xt[d] += row[d];
        if (ty) { /* every token is of type 0: a single text, no second segment */
            kvg_dequantize_row(ty->type, ty->data, row, (uint64_t)D);
            for (int d = 0; d < D; d++) xt[d] += row[d];
        }
        kvg_cpu_layernorm(xt, xt, j->host->embd_norm, j->host->embd_norm_b, D, hp->layer_norm_eps);
    }
}

kvgen_status kvg_cpu_encode(const kvg_cpu_encoder *e, const kvg_encode_batch *b, kvgen_error *err) {
    const kvgen_model *m = e->m;
    const kvg_hparams *hp = &m->w.hp;
    const kvg_cpu_host *host = e->host;
    int D = hp->n_embd, F = hp->n_ff, W = hp->n_head * hp->head_dim;
    int N = 0, max_len = 0;
    for (int i = 0; i < b->n_seq; i++) {
        int n = b->n_tokens[i];
        if (n < 1 || n > hp->n_ctx_train)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: text %d has %d tokens (1 to %d)", host->who, i, n,
                            hp->n_ctx_train);
        N += n;
        if (n > max_len) max_len = n;
    }
    for (int t = 0; t < N; t++)
        if (b->tokens[t] < 0 || b->tokens[t] >= hp->n_vocab)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: token %d is outside the vocabulary (0 to %d)",
                            host->who, b->tokens[t], hp->n_vocab - 1);
    if (N == 0) return KVGEN_OK;
    int threads = kvg_cpu_pool_threads(e->pool);
    size_t ND = (size_t)N * D, NW = (size_t)N * W;
    float *x = b->hidden;
    float *q = kvg_malloc(NW * sizeof(float)), *k = kvg_malloc(NW * sizeof(float));
    float *v = kvg_malloc(NW * sizeof(float)), *att = kvg_malloc(NW * sizeof(float));
    float *tmp = kvg_malloc(ND * sizeof(float)), *ff = kvg_malloc((size_t)N * F * sizeof(float));
    float *row = kvg_malloc((size_t)threads * (size_t)D * sizeof(float));
    float *scores = kvg_malloc((size_t)threads * (size_t)max_len * sizeof(float));
    int *seq_start = kvg_malloc((size_t)N * sizeof(int)), *seq_len = kvg_malloc((size_t)N * sizeof(int));
    kvgen_status st = KVGEN_OK;
    if (!q || !k || !v || !att || !tmp || !ff || !row || !scores || !seq_start || !seq_len) {
        st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for a %d-token encoder batch", host->who, N);
        goto done;
    }

    /* embeddings: token + type 0 + position, LayerNormed                        x: [N][D] */
    for (int i = 0, t = 0; i < b->n_seq; i++)
        for (int p = 0; p < b->n_tokens[i]; p++, t++) {
            seq_start[t] = t - p;
            seq_len[t] = b->n_tokens[i];
        }
    enc_embed ej = {.m = m, .host = host, .tokens = b->tokens, .seq_start = seq_start, .x = x, .row = row};
    kvg_cpu_pool_run(e->pool, N, embed_items, &ej);

    for (int l = 0; l < hp->n_layer; l++) {
        const kvg_cpu_layer_tensors *R = &host->layers[l];
        matmul_all(e, l, KVG_T_ATTN_Q, x, D, N, q, W, R->bq, false);
        matmul_all(e, l, KVG_T_ATTN_K, x, D, N, k, W, R->bk, false);
        matmul_all(e, l, KVG_T_ATTN_V, x, D, N, v, W, R->bv, false);
        enc_attention aj = {.hp = hp, .q = q, .k = k, .v = v, .att = att, .seq_start = seq_start,
                            .seq_len = seq_len, .scores = scores, .max_len = max_len, .vec = e->vec};
        kvg_cpu_pool_run(e->pool, N * hp->n_head, attention_items, &aj);
        matmul_all(e, l, KVG_T_ATTN_OUT, att, W, N, tmp, D, R->bo, false);
        add_norm(e, x, tmp, R->ln1_w, R->ln1_b, N, D, hp->layer_norm_eps);
        matmul_all(e, l, KVG_T_FFN_UP, x, D, N, ff, F, R->b_up, true);
        matmul_all(e, l, KVG_T_FFN_DOWN, ff, F, N, tmp, D, R->b_down, false);
        add_norm(e, x, tmp, R->ln2_w, R->ln2_b, N, D, hp->layer_norm_eps);
    }
done:
    kvg_free(q);
    kvg_free(k);
    kvg_free(v);
    kvg_free(att);
    kvg_free(tmp);
    kvg_free(ff);
    kvg_free(row);
    kvg_free(scores);
    kvg_free(seq_start);
    kvg_free(seq_len);
    return st;
}
