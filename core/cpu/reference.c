/* reference.c: the CPU reference backend, a plain-C f32 forward pass of a llama-family model.
 * The facts that differ between architectures (RoPE style, activation, ...) come from the
 * model description (kvg_weights, from the table in arch.c); model_init refuses a model that
 * needs a feature this file does not implement (kvg_arch_check_backend).
 *
 * Every architecture of the table runs here: biases, Q/K head norms, post norms, NEOX or
 * adjacent RoPE with per-layer base and frequency factors, GELU or SiLU gating, embedding
 * scale, soft-capping and sliding-window layers are data of the model description. An encoder
 * (bert) runs the graph of cpu_encode.c with this file's matrix products (ref_encode).
 *
 * This is the oracle every shader is tested against, so it favours being obviously right
 * over being fast: weights stay in their GGUF encoding, and each output element is one f32
 * dot product of a weight row (dequantized with kvg_dequantize_row) with an f32 input. Two
 * cheap things make it usable anyway:
 * - matrix-vector products are spread over a small persistent thread pool (cpu_pool.c), one
 *   output row per thread, so the result does not depend on the thread count;
 * - a prompt is processed in blocks of tokens, layer by layer, so every weight row is read
 *   and dequantized once per block instead of once per token.
 * Decode runs the very same code with a block of one, so a token's logits are bit-identical
 * whether it came through prefill, decode or a no-cache recomputation.
 *
 * The KV cache lives in the model's page pools, one per layer group (kvg_model.h): a session
 * holds a page table per group, and page p of a group's pool stores per layer of the group K
 * then V as [Hkv][page_size][hd], in host memory kept by cpu_pages.c, reached through kv_at().
 *
 * A batch (kvg_backend.h) is flattened into tokens, each with its own position and page table,
 * and run in blocks of up to REF_BLOCK tokens whatever sequence they belong to: a block of
 * many sessions' decode tokens reads every weight row once for all of them, exactly as a
 * prompt's block does.
 *
 * Shapes in comments: n = tokens in the current block, D = n_embd, F = n_ff, H = n_head,
 * Hkv = n_head_kv, hd = head_dim, V = n_vocab, C = the session's context capacity,
 * P = page size, L = n_layer.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_backend.h"
#include "kvg_cpu.h"
#include "kvg_quant.h"
#include "kvg_reference.h"

/* Tokens per block in prefill: large enough that a weight row is reused many times while
 * it sits in cache, small enough that the block's activations (n x F floats) stay cheap. */
#define REF_BLOCK 64

/* ---- math helpers (kvg_reference.h) --------------------------------------------------- */

void kvg_ref_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0.0; /* double: the oracle should not lose bits summing hundreds of squares */
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

/* kvg_ref_rope: cpu_pages.c (a page move re-rotates keys with it too) */

void kvg_ref_softmax(float *x, int n) {
    float max = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

float kvg_ref_silu(float x) { return x / (1.0f + expf(-x)); }

float kvg_ref_gelu_tanh(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

/* ---- per-model and per-session state ---------------------------------------------------- */

typedef struct ref_model {
    kvg_cpu_host host; /* first: the layers' small tensors and RoPE, the pages (cpu_common.c) */
    kvg_cpu_pool *pool;
    /* norm weights converted to f32 once, whatever type the file stores them in */
} ref_model;

/* Where a session's K/V live: per layer group, a page table into the model's pages. */
typedef struct ref_kv {
    const kvg_cpu_pages *store;            /* the model's pages, [KVG_KV_GROUPS] */
    const int32_t *pages[KVG_KV_GROUPS];   /* the session's page tables */
    const int *group;                      /* each layer's group (the model's layout) */
} ref_kv;

struct kvg_backend_session {
    kvg_cpu_scratch c; /* first: n_ctx, n_threads and the activations of one block of tokens */
    float *scores; /* [n_threads][C] attention weights, one row per thread */
    float *row_f32; /* [n_threads][row_stride] a dequantized weight row, one per thread */
    size_t row_stride;
};

/* The hd floats of layer `layer`'s K (which = 0) or V (which = 1) for kv head h at position pos. */
static float *kv_at(const ref_kv *kv, int layer, int which, int h, int pos) {
    int g = kv->group[layer];
    return kvg_cpu_pages_f32(&kv->store[g], kv->pages[g], layer, which, h, pos);
}

static void ref_model_free(kvgen_model *m);

static kvgen_status ref_model_init(kvgen_model *m, const kvgen_model_desc *desc, kvgen_error *err) {
    (void)desc;
    kvgen_status type_st = kvg_weights_check_types(m, &kvg_reference_backend, err);
    if (type_st == KVGEN_OK) type_st = kvg_arch_check_backend(m, &kvg_reference_backend, err);
    if (type_st != KVGEN_OK) return type_st;
    const kvg_hparams *hp = &m->w.hp;
    const char *path = m->gguf ? kvg_gguf_path(m->gguf) : "model";
    if (hp->n_layer <= 0 || hp->n_embd <= 0 || hp->n_ff <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->head_dim <= 0 || hp->n_vocab <= 0)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: hyperparameters must be positive", path);
    if (hp->n_head % hp->n_head_kv != 0)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: n_head %d is not a multiple of n_head_kv %d", path,
                        hp->n_head, hp->n_head_kv);
    if (hp->n_rot < 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: rope dimension %d must be even and at most head_dim %d", path,
                        hp->n_rot, hp->head_dim);

    if (m->w.tok_embd->ne[0] != (uint64_t)hp->n_embd || m->w.tok_embd->ne[1] < (uint64_t)hp->n_vocab ||
        m->w.output->ne[0] != (uint64_t)hp->n_embd || m->w.output->ne[1] != (uint64_t)hp->n_vocab)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: token_embd/output shapes do not match n_embd %d, n_vocab %d", path,
                        hp->n_embd, hp->n_vocab);

    int n_threads = kvg_cpu_threads(m->n_threads);
    m->n_threads = n_threads;

    ref_model *rm = kvg_calloc(1, sizeof *rm);
    if (!rm) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for the reference backend", path);
    m->backend = rm; /* from here on, ref_model_free cleans up */
    kvgen_status st = kvg_cpu_host_init(&rm->host, m, "reference backend", err);
    if (st == KVGEN_OK) st = kvg_cpu_pool_create(n_threads, "reference backend", &rm->pool, err);
    if (st != KVGEN_OK) {
        ref_model_free(m);
        return st;
    }
    m->backend = rm;
    snprintf(m->device_name, sizeof m->device_name, "cpu");
    return KVGEN_OK;
}

static void ref_model_free(kvgen_model *m) {
    ref_model *rm = m->backend;
    if (!rm) return;
    kvg_cpu_pool_destroy(rm->pool);
    kvg_cpu_host_free(&rm->host, m);
    kvg_free(rm);
    m->backend = NULL;
}

static void ref_session_free(kvgen_model *m, kvg_backend_session *s) {
    (void)m;
    if (!s) return;
    kvg_cpu_scratch_free(&s->c);
    kvg_free(s->scores);
    kvg_free(s->row_f32);
    kvg_free(s);
}

static kvgen_status ref_session_init(kvgen_model *m, int n_ctx, kvg_backend_session **out, kvgen_error *err) {
    const kvg_hparams *hp = &m->w.hp;
    ref_model *rm = m->backend;
    if (n_ctx <= 0) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "reference backend: n_ctx %d must be > 0", n_ctx);
    kvg_backend_session *s = kvg_calloc(1, sizeof *s);
    if (!s) return kvg_fail(err, KVGEN_E_NO_MEMORY, "reference backend: out of memory for a session");
    kvgen_status st = kvg_cpu_scratch_init(&s->c, hp, REF_BLOCK, n_ctx, kvg_cpu_pool_threads(rm->pool));
    size_t D = (size_t)hp->n_embd, F = (size_t)hp->n_ff, qd = (size_t)hp->n_head * hp->head_dim;
    s->scores = kvg_malloc((size_t)s->c.n_threads * (size_t)n_ctx * sizeof(float));
    s->row_stride = D > F ? D : F;
    if (qd > s->row_stride) s->row_stride = qd;
    s->row_f32 = kvg_malloc((size_t)s->c.n_threads * s->row_stride * sizeof(float));
    if (st != KVGEN_OK || !s->scores || !s->row_f32) {
        ref_session_free(m, s);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "reference backend: out of memory for a %d-token session's scratch",
                        n_ctx);
    }
    *out = s;
    return KVGEN_OK;
}

/* ---- jobs ------------------------------------------------------------------------------ */

/* out[t][r] = dot(W row r, in[t]) for every token t of the block: up to three weight matrices
 * that share one input are one job, so Q/K/V (and gate/up) cost a single dispatch. */
typedef struct matmul_part {
    const kvg_tensor *w; /* [in] -> [rows] */
    float *out;          /* [n][rows] */
} matmul_part;

typedef struct matmul_job {
    const float *in; /* [n][in_dim] */
    int in_dim, n;
    int n_parts;
    matmul_part parts[3];
    float *row_f32; /* [n_threads][row_stride]: one dequantized weight row per thread */
    size_t row_stride;
} matmul_job;

/* Independent partial sums: the shape compilers vectorise without -ffast-math. */
#define DOT_LANES 8
#define DOT_TILE 4

/* out[t] = dot(w, x[t]) for t < nt <= DOT_TILE: each w[i] is loaded once for the whole tile. Each
 * token's sum is formed in the same order whatever nt is, so tiling does not change results. */
static void dot_tile_f32(const float *w, const float *x, size_t x_stride, int nt, int n, float *out, size_t out_stride) {
    float acc[DOT_TILE][DOT_LANES] = {{0}};
    int i = 0;
    for (; i + DOT_LANES <= n; i += DOT_LANES)
        for (int t = 0; t < nt; t++)
            for (int l = 0; l < DOT_LANES; l++) acc[t][l] += w[i + l] * x[(size_t)t * x_stride + i + l];
    for (int t = 0; t < nt; t++) {
        float s = 0.0f;
        for (int l = 0; l < DOT_LANES; l++) s += acc[t][l];
        for (int k = i; k < n; k++) s += w[k] * x[(size_t)t * x_stride + k];
        out[(size_t)t * out_stride] = s;
    }
}

static void matmul_rows(void *ctx, int begin, int end, int tid) {
    const matmul_job *j = ctx;
    for (int item = begin; item < end; item++) {
        int r = item, p = 0;
        while (r >= (int)j->parts[p].w->ne[1]) r -= (int)j->parts[p++].w->ne[1];
        const kvg_tensor *w = j->parts[p].w;
        int rows = (int)w->ne[1];
        const unsigned char *row = (const unsigned char *)w->data + (size_t)r * kvg_row_bytes(w->type, w->ne[0]);
        float *out = j->parts[p].out + r;
        /* decode the row to f32 once, then plain f32 dots for every token of the block */
        float *wf = j->row_f32 + (size_t)tid * j->row_stride;
        kvg_dequantize_row(w->type, row, wf, (uint64_t)j->in_dim);
        for (int t = 0; t < j->n; t += DOT_TILE)
            dot_tile_f32(wf, j->in + (size_t)t * j->in_dim, (size_t)j->in_dim, j->n - t < DOT_TILE ? j->n - t : DOT_TILE,
                         j->in_dim, out + (size_t)t * rows, (size_t)rows);
    }
}

static void matmul(kvg_cpu_pool *pool, kvg_backend_session *s, const float *in, int in_dim, int n, int n_parts,
                   const matmul_part *parts) {
    matmul_job j = {.in = in, .in_dim = in_dim, .n = n, .n_parts = n_parts, .row_f32 = s->row_f32,
                    .row_stride = s->row_stride};
    int total = 0;
    for (int p = 0; p < n_parts; p++) {
        j.parts[p] = parts[p];
        total += (int)parts[p].w->ne[1];
    }
    kvg_cpu_pool_run(pool, total, matmul_rows, &j);
}

/* Where token t of a block belongs: a block holds consecutive tokens of the batch, which may
 * be one session's positions or tokens of several sessions (ref_forward). `owner` is the
 * session whose attention-score rows (sized to its context) the token uses. */
typedef struct ref_slot {
    const ref_kv *kv;
    kvg_backend_session *owner;
    int pos;
    const kvg_lora_set *lora; /* the token's sequence's adapters (kvg_batch_seq.lora) */
} ref_slot;

/* Causal grouped-query attention for one (token, head) per item. */
typedef struct attention_job {
    kvg_backend_session *s;
    const kvg_hparams *hp;
    const ref_slot *slots;
    int layer, n;
    int window;   /* > 0: a local layer's window, the positions [pos - window + 1, pos] */
    float softcap; /* > 0: scores become softcap * tanh(score / softcap) */
} attention_job;

static void attention_heads(void *ctx, int begin, int end, int tid) {
    const attention_job *j = ctx;
    const kvg_hparams *hp = j->hp;
    int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv, l = j->layer;
    float scale = 1.0f / sqrtf((float)hd);
    for (int item = begin; item < end; item++) {
        int t = item / hp->n_head, h = item % hp->n_head;
        const ref_slot *slot = &j->slots[t];
        const ref_kv *kv = slot->kv;
        float *scores = slot->owner->scores + (size_t)tid * slot->owner->c.n_ctx;
        int pos = slot->pos; /* attends to positions [first, pos] */
        int first = j->window > 0 && pos >= j->window ? pos - j->window + 1 : 0;
        int kvh = h / group;
        const float *q = j->s->c.q + ((size_t)t * hp->n_head + h) * hd;
        for (int p = first; p <= pos; p++) {
            const float *k = kv_at(kv, l, 0, kvh, p);
            float dot = 0.0f;
            for (int i = 0; i < hd; i++) dot += q[i] * k[i];
            float sc = dot * scale;
            if (j->softcap > 0.0f) sc = j->softcap * tanhf(sc / j->softcap);
            scores[p - first] = sc;
        }
        kvg_ref_softmax(scores, pos - first + 1);
        float *o = j->s->c.att + ((size_t)t * hp->n_head + h) * hd;
        for (int i = 0; i < hd; i++) o[i] = 0.0f;
        for (int p = first; p <= pos; p++) {
            const float *v = kv_at(kv, l, 1, kvh, p);
            float a = scores[p - first];
            for (int i = 0; i < hd; i++) o[i] += a * v[i];
        }
    }
}

/* ---- the forward pass ------------------------------------------------------------------ */

/* hb = act(gate) * up, the gated feed-forward's activation */
static void ffn_activation(const kvg_weights *w, float *hb, const float *hb2, size_t n) {
    switch (w->act) {
    case KVG_ACT_GELU_TANH_GATED:
        for (size_t i = 0; i < n; i++) hb[i] = kvg_ref_gelu_tanh(hb[i]) * hb2[i];
        break;
    case KVG_ACT_SILU_GATED:
    default:
        for (size_t i = 0; i < n; i++) hb[i] = kvg_ref_silu(hb[i]) * hb2[i];
        break;
    }
}

/* x[t] += f[t] for the block's n rows, first normed by `post` when the layer has that norm */
static void residual_add(float *x, float *f, const float *post, int n, int D, float eps) {
    for (int t = 0; t < n; t++) {
        float *ft = f + (size_t)t * D;
        if (post) kvg_ref_rmsnorm(ft, ft, post, D, eps);
        float *xt = x + (size_t)t * D;
        for (int i = 0; i < D; i++) xt[i] += ft[i];
    }
}

static void add_bias(float *y, const float *b, int n, int width) {
    if (!b) return;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < width; i++) y[(size_t)t * width + i] += b[i];
}

/* Runs one block of n <= REF_BLOCK tokens through every layer, token t at slots[t] (its
 * position and cache), leaving the final residual stream in s->c.x and their K/V in the caches. */
static void forward_block(kvgen_model *m, kvg_backend_session *s, const ref_slot *slots, const int32_t *tokens,
                          int n) {
    const kvg_hparams *hp = &m->w.hp;
    ref_model *rm = m->backend;
    int D = hp->n_embd, F = hp->n_ff, hd = hp->head_dim;
    int qd = hp->n_head * hd, kvd = hp->n_head_kv * hd;
    /* each token's adapters: y += s B (A x) after each matrix they adapt (NULL: none in the block) */
    const kvg_lora_set *lora_of[REF_BLOCK], *const *lora = NULL;
    for (int t = 0; t < n; t++)
        if ((lora_of[t] = slots[t].lora) && slots[t].lora->n > 0) lora = lora_of;

    /* embedding: x[t] = row tokens[t] of tok_embd, dequantized          x: [n][D] */
    const kvg_tensor *emb = m->w.tok_embd;
    size_t emb_row = kvg_row_bytes(emb->type, emb->ne[0]);
    for (int t = 0; t < n; t++)
        kvg_dequantize_row(emb->type, (const unsigned char *)emb->data + (size_t)tokens[t] * emb_row,
                           s->c.x + (size_t)t * D, (uint64_t)D);
    if (m->w.embd_scale != 1.0f) /* gemma: x * sqrt(n_embd) */
        for (size_t i = 0; i < (size_t)n * D; i++) s->c.x[i] *= m->w.embd_scale;

    for (int l = 0; l < hp->n_layer; l++) {
        const kvg_layer *L = &m->w.layers[l];
        const kvg_cpu_layer_tensors *R = &rm->host.layers[l];

        /* attention sublayer: xb = rmsnorm(x) * attn_norm                xb: [n][D] */
        for (int t = 0; t < n; t++)
            kvg_ref_rmsnorm(s->c.xb + (size_t)t * D, s->c.x + (size_t)t * D, rm->host.layers[l].attn_norm, D,
                            hp->rms_norm_eps);

        /* q = xb Wq: [n][H*hd], k = xb Wk: [n][Hkv*hd], v = xb Wv: [n][Hkv*hd] */
        matmul_part qkv[3] = {{L->wq, s->c.q}, {L->wk, s->c.k}, {L->wv, s->c.v}};
        matmul(rm->pool, s, s->c.xb, D, n, 3, qkv);
        kvg_lora_add(lora, l, KVG_LORA_Q, s->c.xb, D, n, s->c.q, qd);
        kvg_lora_add(lora, l, KVG_LORA_K, s->c.xb, D, n, s->c.k, kvd);
        kvg_lora_add(lora, l, KVG_LORA_V, s->c.xb, D, n, s->c.v, kvd);
        add_bias(s->c.q, R->bq, n, qd); /* qwen2 */
        add_bias(s->c.k, R->bk, n, kvd);
        add_bias(s->c.v, R->bv, n, kvd);

        /* per-head RMSNorm of q and k (qwen3, gemma3), RoPE on every head of q and k at the
         * token's position, then append k, v to the cache */
        for (int t = 0; t < n; t++) {
            int pos = slots[t].pos;
            const ref_kv *kv = slots[t].kv;
            for (int h = 0; h < hp->n_head; h++) {
                float *q = s->c.q + (size_t)t * qd + (size_t)h * hd;
                if (R->q_norm) kvg_ref_rmsnorm(q, q, R->q_norm, hd, hp->rms_norm_eps);
                kvg_ref_rope_apply(&rm->host.ropes[l], q, pos);
            }
            for (int h = 0; h < hp->n_head_kv; h++) {
                float *k = s->c.k + (size_t)t * kvd + (size_t)h * hd;
                if (R->k_norm) kvg_ref_rmsnorm(k, k, R->k_norm, hd, hp->rms_norm_eps);
                kvg_ref_rope_apply(&rm->host.ropes[l], k, pos);
                memcpy(kv_at(kv, l, 0, h, pos), k, (size_t)hd * sizeof(float));
                memcpy(kv_at(kv, l, 1, h, pos), s->c.v + (size_t)t * kvd + (size_t)h * hd, (size_t)hd * sizeof(float));
            }
        }

        /* att[t][h] = softmax(q k^T / sqrt(hd)) v over positions [0, pos_t] (a local layer's
         * last n_swa of them; scores soft-capped where the model says)       att: [n][H*hd] */
        attention_job aj = {.s = s, .hp = hp, .slots = slots, .layer = l, .n = n, .window = L->swa ? hp->n_swa : 0,
                            .softcap = hp->attn_softcap};
        kvg_cpu_pool_run(rm->pool, n * hp->n_head, attention_heads, &aj);

        /* x += att Wo                                                      xb: [n][D] */
        matmul_part o[1] = {{L->wo, s->c.xb}};
        matmul(rm->pool, s, s->c.att, qd, n, 1, o);
        kvg_lora_add(lora, l, KVG_LORA_O, s->c.att, qd, n, s->c.xb, D);
        residual_add(s->c.x, s->c.xb, R->attn_post, n, D, hp->rms_norm_eps); /* gemma: normed first */

        /* feed-forward sublayer: xb = rmsnorm(x) * ffn_norm */
        for (int t = 0; t < n; t++)
            kvg_ref_rmsnorm(s->c.xb + (size_t)t * D, s->c.x + (size_t)t * D, rm->host.layers[l].ffn_norm, D,
                            hp->rms_norm_eps);

        /* hb = xb Wgate, hb2 = xb Wup: [n][F]; hb = act(hb) * hb2 (SwiGLU for SiLU) */
        matmul_part gu[2] = {{L->w_gate, s->c.hb}, {L->w_up, s->c.hb2}};
        matmul(rm->pool, s, s->c.xb, D, n, 2, gu);
        kvg_lora_add(lora, l, KVG_LORA_GATE, s->c.xb, D, n, s->c.hb, F);
        kvg_lora_add(lora, l, KVG_LORA_UP, s->c.xb, D, n, s->c.hb2, F);
        ffn_activation(&m->w, s->c.hb, s->c.hb2, (size_t)n * F);

        /* x += hb Wdown                                                    xb: [n][D] */
        matmul_part dn[1] = {{L->w_down, s->c.xb}};
        matmul(rm->pool, s, s->c.hb, F, n, 1, dn);
        kvg_lora_add(lora, l, KVG_LORA_DOWN, s->c.hb, F, n, s->c.xb, D);
        residual_add(s->c.x, s->c.xb, R->ffn_post, n, D, hp->rms_norm_eps);
    }
}

/* logits[t] = rmsnorm(x[first + t]) * out_norm, times output (or tied tok_embd)    [count][V] */
static void compute_logits(kvgen_model *m, kvg_backend_session *s, int first, int count, float *logits) {
    const kvg_hparams *hp = &m->w.hp;
    ref_model *rm = m->backend;
    int D = hp->n_embd;
    for (int t = 0; t < count; t++)
        kvg_ref_rmsnorm(s->c.xb + (size_t)t * D, s->c.x + (size_t)(first + t) * D, rm->host.out_norm, D, hp->rms_norm_eps);
    matmul_part out[1] = {{m->w.output, logits}};
    matmul(rm->pool, s, s->c.xb, D, count, 1, out);
    float cap = hp->final_softcap; /* gemma2: cap * tanh(logit / cap) */
    if (cap > 0.0f)
        for (size_t i = 0; i < (size_t)count * hp->n_vocab; i++) logits[i] = cap * tanhf(logits[i] / cap);
}

/* The batch's tokens in order, REF_BLOCK at a time: a block's activations live in the scratch
 * of its first token's session, each token attends through its own page table, and the
 * logits a sequence wants are computed from the block that holds those tokens. Every output
 * element is computed exactly as in a batch of one token (see dot_tile_f32), so a token's
 * logits are bit-identical however the batch around it was made up. */
static kvgen_status ref_forward(kvgen_model *m, const kvg_batch *b, kvgen_error *err) {
    const kvg_hparams *hp = &m->w.hp;
    const ref_model *rm = m->backend;
    size_t V = (size_t)hp->n_vocab;
    for (int i = 0; i < b->n_seq; i++) {
        kvgen_status st = kvg_cpu_check_seq(m, &b->seq[i], i, "reference backend", err);
        if (st != KVGEN_OK) return st;
    }
    ref_kv kv[REF_BLOCK];
    ref_slot slots[REF_BLOCK];
    int32_t tokens[REF_BLOCK];
    int seq_of[REF_BLOCK], tok_of[REF_BLOCK];
    int si = 0, ti = 0; /* the next token to place: b->seq[si].tokens[ti] */
    for (int nb; (nb = kvg_cpu_batch_block(b, &si, &ti, REF_BLOCK, tokens, seq_of, tok_of)) > 0;) {
        for (int t = 0; t < nb; t++) {
            const kvg_batch_seq *q = &b->seq[seq_of[t]];
            kv[t] = (ref_kv){.store = rm->host.pages, .pages = {q->pages[0], q->pages[1]}, .group = m->kv.group};
            slots[t] = (ref_slot){.kv = &kv[t], .owner = q->bs, .pos = q->pos0 + tok_of[t], .lora = q->lora};
        }
        kvg_backend_session *scratch = slots[0].owner;
        forward_block(m, scratch, slots, tokens, nb);
        for (int t = 0; t < nb;) { /* runs of one sequence's tokens in this block */
            const kvg_batch_seq *q = &b->seq[seq_of[t]];
            int run = 1;
            while (t + run < nb && seq_of[t + run] == seq_of[t]) run++;
            int last = tok_of[t + run - 1];
            if (q->out == KVG_OUT_HIDDEN) /* rmsnorm(x) * out_norm, the logits' input       [run][D] */
                for (int r = 0; r < run; r++)
                    kvg_ref_rmsnorm(q->logits + (size_t)(tok_of[t] + r) * hp->n_embd,
                                    scratch->c.x + (size_t)(t + r) * hp->n_embd, rm->host.out_norm, hp->n_embd,
                                    hp->rms_norm_eps);
            else if (q->out == KVG_OUT_ALL)
                compute_logits(m, scratch, t, run, q->logits + (size_t)tok_of[t] * V);
            else if (q->out == KVG_OUT_LAST && last == q->n - 1)
                compute_logits(m, scratch, t + run - 1, 1, q->logits);
            t += run;
        }
    }
    return KVGEN_OK;
}

/* ---- an encoder ----------------------------------------------------------------------- */

/* the weight of `role` in layer l of an encoder (cpu_encode.c asks by role) */
static const kvg_tensor *encoder_matrix(const kvg_layer *L, int role) {
    switch (role) {
    case KVG_T_ATTN_Q: return L->wq;
    case KVG_T_ATTN_K: return L->wk;
    case KVG_T_ATTN_V: return L->wv;
    case KVG_T_ATTN_OUT: return L->wo;
    case KVG_T_FFN_UP: return L->w_up;
    default: return L->w_down;
    }
}

typedef struct ref_encode_ctx {
    kvgen_model *m;
    kvg_backend_session *s;
} ref_encode_ctx;

static void ref_encode_mm(void *ctx, int layer, int role, const float *in, int in_dim, int n, float *out) {
    ref_encode_ctx *c = ctx;
    ref_model *rm = c->m->backend;
    matmul_part p[1] = {{encoder_matrix(&c->m->w.layers[layer], role), out}};
    matmul(rm->pool, c->s, in, in_dim, n, 1, p);
}

/* The shared encoder graph (cpu_encode.c) with this file's products: each row dequantized to
 * f32 and dotted in f32. A session's scratch (one block) holds the dequantized rows. */
static kvgen_status ref_encode(kvgen_model *m, const kvg_encode_batch *b, kvgen_error *err) {
    ref_model *rm = m->backend;
    kvg_backend_session *s = NULL;
    kvgen_status st = ref_session_init(m, 1, &s, err);
    if (st != KVGEN_OK) return st;
    ref_encode_ctx c = {m, s};
    kvg_cpu_encoder e = {.m = m, .host = &rm->host, .pool = rm->pool, .block = REF_BLOCK, .mm = ref_encode_mm,
                         .mm_ctx = &c, .keep = &rm->host.encode_keep};
    st = kvg_cpu_encode(&e, b, err);
    ref_session_free(m, s);
    return st;
}

const kvg_backend_ops kvg_reference_backend = {
    .name = "reference",
    .kv_groups = true,
    .hidden_out = true,
    .lora = true,
    /* every feature of the architecture table; Q and the attention output are n_head*head_dim
     * wide throughout, whatever n_embd is */
    .features = KVG_F_WIDE_HEADS | KVG_F_ATTN_BIAS | KVG_F_QK_NORM | KVG_F_POST_NORMS | KVG_F_ROPE_NEOX |
                KVG_F_ROPE_FREQS | KVG_F_ROPE_ATTN_FACTOR | KVG_F_GELU | KVG_F_EMBD_SCALE | KVG_F_SOFTCAP |
                KVG_F_SLIDING_WINDOW | KVG_F_ENCODER,
    .weight_types = kvg_traits_types, /* every type quant.c can dequantize: rows are dotted in f32 */
    /* the oracle keeps K/V as it computed them: the other types are the device backends'
     * approximations, which the tests measure against these pages */
    .kv_types = (const uint32_t[]){KVG_TYPE_F32},
    .n_kv_types = 1,
    .model_init = ref_model_init,
    .model_free = ref_model_free,
    .session_init = ref_session_init,
    .session_free = ref_session_free,
    .forward = ref_forward,
    .encode = ref_encode,
    KVG_CPU_HOST_PAGE_OPS, /* cpu_common.c */
};
