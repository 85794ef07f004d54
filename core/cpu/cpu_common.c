/* cpu_common.c: what the reference (reference.c) and cpu (fast.c) backends share around their
 * forward passes (kvg_cpu.h): the layers' small tensors in f32 and their RoPE, the checks of a
 * batch's sequences, the batch cut into blocks of tokens, a session's activations of a block, and the
 * backend ops over the host pages (cpu_pages.c). */
#include <string.h>
#include "kvg_cpu.h"
#include "kvg_quant.h"
#include "kvg_reference.h"

bool kvg_cpu_tensor_f32(const kvg_tensor *t, size_t n, float **out) {
    *out = NULL;
    if (!t) return true;
    *out = kvg_malloc(n * sizeof(float));
    if (!*out) return false;
    kvg_dequantize_row(t->type, t->data, *out, n);
    return true;
}

kvgen_status kvg_cpu_host_init(kvg_cpu_host *h, const kvgen_model *m, const char *who, kvgen_error *err) {
    const kvg_hparams *hp = &m->w.hp;
    size_t L = (size_t)hp->n_layer, hd = (size_t)hp->head_dim, D = (size_t)hp->n_embd;
    size_t qd = (size_t)hp->n_head * hd, kvd = (size_t)hp->n_head_kv * hd;
    h->kv_type = m->kv_type;
    h->who = who;
    h->layers = kvg_calloc(L, sizeof *h->layers);
    h->ropes = kvg_calloc(L, sizeof *h->ropes);
    bool ok = h->layers && h->ropes && kvg_cpu_tensor_f32(m->w.rope_freqs, (size_t)hp->n_rot / 2, &h->rope_factors) &&
              kvg_cpu_tensor_f32(m->w.output_norm, D, &h->out_norm) &&
              kvg_cpu_tensor_f32(m->w.embd_norm, D, &h->embd_norm) && kvg_cpu_tensor_f32(m->w.embd_norm_b, D, &h->embd_norm_b);
    size_t F = (size_t)hp->n_ff;
    for (size_t l = 0; ok && l < L; l++) {
        const kvg_layer *w = &m->w.layers[l];
        kvg_cpu_layer_tensors *t = &h->layers[l];
        ok = kvg_cpu_tensor_f32(w->attn_norm, D, &t->attn_norm) && kvg_cpu_tensor_f32(w->ffn_norm, D, &t->ffn_norm) &&
             kvg_cpu_tensor_f32(w->bq, qd, &t->bq) && kvg_cpu_tensor_f32(w->bk, kvd, &t->bk) &&
             kvg_cpu_tensor_f32(w->bv, kvd, &t->bv) && kvg_cpu_tensor_f32(w->q_norm, hd, &t->q_norm) &&
             kvg_cpu_tensor_f32(w->k_norm, hd, &t->k_norm) && kvg_cpu_tensor_f32(w->attn_post_norm, D, &t->attn_post) &&
             kvg_cpu_tensor_f32(w->ffn_post_norm, D, &t->ffn_post) && kvg_cpu_tensor_f32(w->bo, D, &t->bo) &&
             kvg_cpu_tensor_f32(w->attn_out_norm, D, &t->ln1_w) && kvg_cpu_tensor_f32(w->attn_out_norm_b, D, &t->ln1_b) &&
             kvg_cpu_tensor_f32(w->b_up, F, &t->b_up) && kvg_cpu_tensor_f32(w->b_down, D, &t->b_down) &&
             kvg_cpu_tensor_f32(w->out_norm, D, &t->ln2_w) && kvg_cpu_tensor_f32(w->out_norm_b, D, &t->ln2_b);
        h->ropes[l] = (kvg_ref_rope_params){.n_rot = hp->n_rot, .neox = m->w.rope == KVG_ROPE_NEOX,
                                            .base = w->rope_base > 0.0f ? w->rope_base : hp->rope_freq_base,
                                            .scale = w->rope_scale > 0.0f ? w->rope_scale : 1.0f,
                                            .factors = h->rope_factors, .attn_factor = hp->rope_attn_factor};
    }
    if (!ok) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for the model's small tensors", who);
    return KVGEN_OK;
}

void kvg_cpu_host_free(kvg_cpu_host *h, const kvgen_model *m) {
    for (int g = 0; g < KVG_KV_GROUPS; g++) kvg_cpu_pages_free(&h->pages[g]);
    for (int l = 0; h->layers && l < m->w.hp.n_layer; l++) {
        kvg_cpu_layer_tensors *t = &h->layers[l];
        float *ps[] = {t->attn_norm, t->ffn_norm, t->bq,    t->bk,    t->bv,   t->q_norm, t->k_norm, t->attn_post,
                       t->ffn_post,  t->bo,       t->ln1_w, t->ln1_b, t->b_up, t->b_down, t->ln2_w,  t->ln2_b};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) kvg_free(ps[i]);
    }
    kvg_free(h->layers);
    kvg_free(h->ropes);
    kvg_free(h->rope_factors);
    kvg_free(h->out_norm);
    kvg_free(h->embd_norm);
    kvg_free(h->embd_norm_b);
    kvg_free(h->encode_keep.buf);
}

kvgen_status kvg_cpu_scratch_init(kvg_cpu_scratch *a, const kvg_hparams *hp, int block, int n_ctx, int n_threads) {
    a->n_ctx = n_ctx;
    a->n_threads = n_threads;
    size_t B = (size_t)block, D = (size_t)hp->n_embd, F = (size_t)hp->n_ff;
    size_t qd = (size_t)hp->n_head * hp->head_dim, kvd = (size_t)hp->n_head_kv * hp->head_dim;
    a->x = kvg_malloc(B * D * sizeof(float));
    a->xb = kvg_malloc(B * D * sizeof(float));
    a->q = kvg_malloc(B * qd * sizeof(float));
    a->k = kvg_malloc(B * kvd * sizeof(float));
    a->v = kvg_malloc(B * kvd * sizeof(float));
    a->att = kvg_malloc(B * qd * sizeof(float));
    a->hb = kvg_malloc(B * F * sizeof(float));
    a->hb2 = kvg_malloc(B * F * sizeof(float));
    bool ok = a->x && a->xb && a->q && a->k && a->v && a->att && a->hb && a->hb2;
    return ok ? KVGEN_OK : KVGEN_E_NO_MEMORY;
}

void kvg_cpu_scratch_free(kvg_cpu_scratch *a) {
    float *ps[] = {a->x, a->xb, a->q, a->k, a->v, a->att, a->hb, a->hb2};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) kvg_free(ps[i]);
}

kvgen_status kvg_cpu_check_seq(const kvgen_model *m, const kvg_batch_seq *q, int i, const char *who, kvgen_error *err) {
    const kvg_hparams *hp = &m->w.hp;
    if (!q->bs || !q->pages[0] || (m->kv.n_groups > 1 && !q->pages[1]) || !q->tokens)
        return kvg_fail(err, KVGEN_E_INTERNAL, "%s: batch sequence %d lacks its session, page table or tokens", who, i);
    int n_ctx = ((const kvg_cpu_scratch *)q->bs)->n_ctx; /* the session's first member */
    if (q->n <= 0 || q->pos0 < 0 || q->n > n_ctx - q->pos0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %d tokens at position %d do not fit %d", who, q->n, q->pos0,
                        n_ctx);
    if ((q->out == KVG_OUT_LAST || q->out == KVG_OUT_ALL || q->out == KVG_OUT_HIDDEN) && !q->logits)
        return kvg_fail(err, KVGEN_E_INTERNAL, "%s: batch sequence %d wants logits but has no buffer", who, i);
    if (q->out == KVG_OUT_KEEP) return kvg_fail(err, KVGEN_E_INTERNAL, "%s: logits are host memory, none are kept", who);
    for (int t = 0; t < q->n; t++)
        if (q->tokens[t] < 0 || q->tokens[t] >= hp->n_vocab)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: token id %d out of range [0, %d)", who, q->tokens[t],
                            hp->n_vocab);
    return KVGEN_OK;
}

int kvg_cpu_batch_block(const kvg_batch *b, int *si, int *ti, int max, int32_t *tokens, int *seq_of, int *tok_of) {
    int nb = 0;
    for (; *si < b->n_seq && nb < max; nb++) {
        const kvg_batch_seq *q = &b->seq[*si];
        tokens[nb] = q->tokens[*ti];
        seq_of[nb] = *si;
        tok_of[nb] = *ti;
        if (++*ti == q->n) {
            ++*si;
            *ti = 0;
        }
    }
    return nb;
}

/* ---- the page pool's storage: host pages ------------------------------------------------- */

static kvg_cpu_host *host_of(const kvgen_model *m) { return (kvg_cpu_host *)m->backend; }

size_t kvg_cpu_host_cache_bytes_per_token(const kvgen_model *m) {
    return kvg_cpu_kv_bytes_per_token(&m->w.hp, host_of(m)->kv_type);
}

size_t kvg_cpu_host_default_pool_bytes(const kvgen_model *m) {
    return kvg_cpu_default_pool_bytes(&m->w.hp, host_of(m)->kv_type);
}

kvgen_status kvg_cpu_host_pages_init(kvgen_model *m, int group, int page_size, int32_t n_pages, kvgen_error *err) {
    kvg_cpu_host *h = host_of(m);
    return kvg_cpu_pages_init(&h->pages[group], &m->w.hp, h->ropes, &m->kv, group, page_size, n_pages, h->kv_type,
                              h->who, err);
}

kvgen_status kvg_cpu_host_page_commit(kvgen_model *m, int group, int32_t page, kvgen_error *err) {
    return kvg_cpu_pages_commit(&host_of(m)->pages[group], page, err);
}

kvgen_status kvg_cpu_host_kv_copy(kvgen_model *m, int group, const int32_t *src_pages, int src_pos,
                                  const int32_t *dst_pages, int dst_pos, int n, int rope_delta, kvgen_error *err) {
    return kvg_cpu_pages_copy(&host_of(m)->pages[group], src_pages, src_pos, dst_pages, dst_pos, n, rope_delta, err);
}

kvgen_status kvg_cpu_host_kv_read(kvgen_model *m, const int32_t *pages, int layer, int which, int pos0, int n,
                                  float *out, kvgen_error *err) {
    return kvg_cpu_pages_read(&host_of(m)->pages[m->kv.group[layer]], pages, layer, which, pos0, n, out, err);
}

kvgen_status kvg_cpu_host_kv_write(kvgen_model *m, const int32_t *pages, int layer, int which, int pos0, int n,
                                   const float *in, kvgen_error *err) {
    return kvg_cpu_pages_write(&host_of(m)->pages[m->kv.group[layer]], pages, layer, which, pos0, n, in, err);
}
