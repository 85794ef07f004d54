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
 * Activations for the whole batch are one buffer per call, kept with the model for the next call
 * where the backend passes a kvg_cpu_keep and the batch is small enough (kvg_cpu.h): a call of one
 * short text is then not mostly allocation; a bigger batch has its own, its texts bounded by the
 * model's n_ctx_train. */
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
    float *scores;          /* [threads][stride]: a thread's scores on cache lines of its own */
    int stride;
    const kvg_vec_ops *vec; /* or NULL: scalar loops */
} enc_attention;

/* one (token, head) per item: softmax over every token of its text, then the weighted values;
 * with the backend's vector operations (vec) where it passes them, else in scalar loops */
static void attention_items(void *ctx, int begin, int end, int tid) {
    const enc_attention *j = ctx;
    int H = j->hp->n_head, hd = j->hp->head_dim, W = H * hd;
    float scale = 1.0f / sqrtf((float)hd);
    float *scores = j->scores + (size_t)tid * (size_t)j->stride;
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
static void matmul_all(const kvg_cpu_encoder *e, int layer, const float *in, int in_dim, int N,
                       const kvg_cpu_product *p) {
    for (int t0 = 0; t0 < N; t0 += e->block) {
        int n = N - t0 < e->block ? N - t0 : e->block;
        e->mm(e->mm_ctx, layer, p->role, in + (size_t)t0 * in_dim, in_dim, n, p->out + (size_t)t0 * p->out_dim);
    }
    enc_tokens j = {.y = p->out, .bias = p->bias, .width = p->out_dim, .vec = e->vec};
    if (p->gelu) kvg_cpu_pool_run(e->pool, N, bias_gelu_items, &j);
    else if (p->bias) kvg_cpu_pool_run(e->pool, N, bias_items, &j);
}

/* the products of one input: in one job where the backend has kvg_cpu_products_fn, else one by one */
static void products(const kvg_cpu_encoder *e, int layer, const float *in, int in_dim, int N, const kvg_cpu_product *p,
                     int n_products) {
    if (e->products) {
        e->products(e->mm_ctx, layer, in, in_dim, N, p, n_products);
        return;
    }
    for (int i = 0; i < n_products; i++) matmul_all(e, layer, in, in_dim, N, &p[i]);
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
    float *row; /* [threads][row_stride] */
    int row_stride;
} enc_embed;

static void embed_items(void *ctx, int begin, int end, int tid) {
    const enc_embed *j = ctx;
    const kvg_hparams *hp = &j->m->w.hp;
    const kvg_tensor *te = j->m->w.tok_embd, *pe = j->m->w.pos_embd, *ty = j->m->w.tok_types;
    int D = hp->n_embd;
    float *row = j->row + (size_t)tid * (size_t)j->row_stride;
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

/* bytes for one call's activations: the kept buffer where it is free and big enough (or can be
 * made so, up to KVG_CPU_KEEP_MAX), else a buffer of the call's own (*kept false) */
static void *scratch_take(kvg_cpu_keep *keep, size_t bytes, bool *kept) {
    *kept = false;
    if (keep && bytes <= KVG_CPU_KEEP_MAX && !atomic_exchange_explicit(&keep->busy, true, memory_order_acquire)) {
        if (keep->bytes < bytes) {
            kvg_free(keep->buf);
            keep->buf = kvg_malloc(bytes);
            keep->bytes = keep->buf ? bytes : 0;
        }
        if (keep->buf) {
            *kept = true;
            return keep->buf;
        }
        atomic_store_explicit(&keep->busy, false, memory_order_release);
    }
    return kvg_malloc(bytes);
}

static void scratch_give(kvg_cpu_keep *keep, void *buf, bool kept) {
    if (kept) atomic_store_explicit(&keep->busy, false, memory_order_release);
    else kvg_free(buf);
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
    /* the activations, one buffer (kept with the model where it may be: kvg_cpu_keep), each part
     * on cache lines of its own (64 bytes, 16 floats), and so each thread's scratch rows: threads
     * writing one line make it travel between their cores at every write */
    size_t ND = (size_t)N * D, NW = (size_t)N * W;
    int stride = (max_len + 15) / 16 * 16, row_stride = (D + 15) / 16 * 16;
    size_t sizes[] = {NW, NW, NW, NW, ND, (size_t)N * F, (size_t)threads * row_stride, (size_t)threads * stride,
                      (size_t)N, (size_t)N};
    enum { Q, K, V, ATT, TMP, FF, ROW, SCORES, SEQ_START, SEQ_LEN, N_PARTS };
    size_t offs[N_PARTS], bytes = 0;
    for (int i = 0; i < N_PARTS; i++) {
        offs[i] = bytes;
        bytes += (sizes[i] + 15) / 16 * 16 * sizeof(float); /* a float and an int are both 4 bytes */
    }
    bool kept;
    unsigned char *raw = scratch_take(e->keep, bytes + 64, &kept); /* + room to start on a line */
    if (!raw) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for a %d-token encoder batch", host->who, N);
    unsigned char *buf = raw + (64 - (uintptr_t)raw % 64) % 64;
    float *x = b->hidden;
    float *q = (float *)(buf + offs[Q]), *k = (float *)(buf + offs[K]), *v = (float *)(buf + offs[V]);
    float *att = (float *)(buf + offs[ATT]), *tmp = (float *)(buf + offs[TMP]), *ff = (float *)(buf + offs[FF]);
    float *row = (float *)(buf + offs[ROW]), *scores = (float *)(buf + offs[SCORES]);
    int *seq_start = (int *)(buf + offs[SEQ_START]), *seq_len = (int *)(buf + offs[SEQ_LEN]);

    /* embeddings: token + type 0 + position, LayerNormed                        x: [N][D] */
    for (int i = 0, t = 0; i < b->n_seq; i++)
        for (int p = 0; p < b->n_tokens[i]; p++, t++) {
            seq_start[t] = t - p;
            seq_len[t] = b->n_tokens[i];
        }
    enc_embed ej = {.m = m, .host = host, .tokens = b->tokens, .seq_start = seq_start, .x = x, .row = row,
                   .row_stride = row_stride};
    kvg_cpu_pool_run(e->pool, N, embed_items, &ej);

    for (int l = 0; l < hp->n_layer; l++) {
        const kvg_cpu_layer_tensors *R = &host->layers[l];
        kvg_cpu_product qkv[3] = {{.role = KVG_T_ATTN_Q, .out = q, .out_dim = W, .bias = R->bq},
                                  {.role = KVG_T_ATTN_K, .out = k, .out_dim = W, .bias = R->bk},
                                  {.role = KVG_T_ATTN_V, .out = v, .out_dim = W, .bias = R->bv}};
        products(e, l, x, D, N, qkv, 3);
        enc_attention aj = {.hp = hp, .q = q, .k = k, .v = v, .att = att, .seq_start = seq_start,
                            .seq_len = seq_len, .scores = scores, .stride = stride, .vec = e->vec};
        kvg_cpu_pool_run(e->pool, N * hp->n_head, attention_items, &aj);
        kvg_cpu_product o = {.role = KVG_T_ATTN_OUT, .out = tmp, .out_dim = D, .bias = R->bo};
        products(e, l, att, W, N, &o, 1);
        add_norm(e, x, tmp, R->ln1_w, R->ln1_b, N, D, hp->layer_norm_eps);
        kvg_cpu_product up = {.role = KVG_T_FFN_UP, .out = ff, .out_dim = F, .bias = R->b_up, .gelu = true};
        products(e, l, x, D, N, &up, 1);
        kvg_cpu_product down = {.role = KVG_T_FFN_DOWN, .out = tmp, .out_dim = D, .bias = R->b_down};
        products(e, l, ff, F, N, &down, 1);
        add_norm(e, x, tmp, R->ln2_w, R->ln2_b, N, D, hp->layer_norm_eps);
    }
    scratch_give(e->keep, raw, kept);
    return KVGEN_OK;
}
