/* vk_encode.c: an encoder's forward pass (kvg_arch.encoder: bert) on the device, the backend's
 * `encode` op. The graph is cpu_encode.c's; per submission of up to `cap` tokens (whole texts,
 * back to back; N tokens, D = n_embd):
 *   embed (token rows, embed.comp) -> layer_norm MODE 1 (+ position and token-type row, LN)
 *   per block:
 *     QKV mat-mul (+ biases) -> Q|K|V rows                       (EPI_STORE)
 *     enc_attn: every token over every token of its own text      (no cache, no mask)
 *     Wo mat-mul (+ bias) added to x                              (EPI_ADD)
 *     layer_norm MODE 0 (x = LN(x) w + b)
 *     up mat-mul (+ bias, exact GELU) -> h                        (EPI_GELU)
 *     down mat-mul (+ bias) added to x                            (EPI_ADD)
 *     layer_norm MODE 0, the last block's also to the host-visible output
 * The mat-muls are the decoder's (vk_walk.c's op: the lane mat-vec on a CPU device, the GEMM
 * or the mat-vec on a GPU, every weight type of the table); the embedding lookup is its op too.
 * As in vk_walk.c, one walk of the op list serves every purpose: creating the pipelines at
 * load, counting and writing the descriptor sets (once, at load: the buffers never change),
 * recording a submission. Per-submission values live in params: the token ids, then each
 * token's (first token of its text, text length) from word `cap` of the ids on.
 * Pooling is the caller's (kvgen_embed): the last block's states go back as cpu_encode.c
 * returns them. Calls vk_walk.c (ops), vk_weights.c (uploads), vk_device.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_quant.h"
#include "kvg_vk_backend.h"

/* the layer_norm.comp modes */
enum { LN_PLAIN = 0, LN_EMBED = 1 };

typedef struct vk_enc_layer {
    vk_matrix qkv, wo, up, down;
    kvg_vk_buffer b_qkv, b_o, b_up, b_down; /* f32 biases, by output row */
    kvg_vk_buffer ln1_w, ln1_b, ln2_w, ln2_b;
} vk_enc_layer;

struct vk_encoder {
    kvg_vk_buffer pos;        /* [n_ctx_train][n_embd] f32: position rows + token type 0 */
    kvg_vk_buffer ln_w, ln_b; /* the embeddings' LayerNorm */
    vk_enc_layer *layers;
    uint32_t cap;             /* tokens per submission (>= n_ctx_train) */
    uint32_t ld_qkv;          /* Q|K|V floats per token */
    uint32_t ln_wg, attn_wg;  /* workgroup sizes (device limits) */
    /* the sets, command buffer and fence of the submissions (n_ctx: cap); never a decoder's
     * session, and only the fields the walk reads */
    kvg_backend_session s;
};

/* ---- the ops of the walk ---- */

/* layer_norm.comp over the submission's tokens: mode LN_EMBED adds the position table first;
 * out: the results also go to the host-visible output */
static kvgen_status op_layer_norm(walk *w, int mode, const kvg_vk_buffer *wt, const kvg_vk_buffer *b, bool out) {
    vk_model *vm = w->vm;
    vk_encoder *e = vm->enc;
    uint32_t spec[KVG_SPEC_COUNT];
    spec_init(spec);
    spec[KVG_SPEC_WG] = e->ln_wg;
    spec[KVG_SPEC_MODE] = (uint32_t)mode;
    VkPipeline pipe;
    if (w->mode == WALK_PIPELINES) return kvg_vk_walk_pipeline(w, "layer_norm", spec, &pipe);
    int idx = w->cursor++;
    if (w->mode == WALK_SETS) {
        kvg_vk_binding bs[KVG_VK_BINDINGS] = {{0}};
        bs[0].buf = kvg_vk_mirror_bound(&vm->params);
        bs[2].buf = mode == LN_EMBED ? &e->pos : NULL;
        bs[3].buf = &vm->x;
        bs[4].buf = wt;
        bs[6].buf = b;
        bs[7].buf = &vm->logits;
        return kvg_vk_set_create(vm->ctx, w->s->pool, bs, &w->s->sets[idx], w->err);
    }
    if (w->mode != WALK_RECORD) return KVGEN_OK;
    kvgen_status st = kvg_vk_walk_pipeline(w, "layer_norm", spec, &pipe);
    if (st != KVGEN_OK) return st;
    struct { /* matches PC in shaders/layer_norm.comp */
        uint32_t n, ldx, ncols;
        float eps;
        uint32_t seg, out_ld;
    } pc = {(uint32_t)vm->hp.n_embd, vm->ld_x, w->n, vm->hp.layer_norm_eps, e->cap, out ? (uint32_t)vm->hp.n_embd : 0};
    kvg_vk_cmd_dispatch(vm->ctx, w->cb, pipe, w->s->sets[idx], &pc, sizeof pc, 1, w->n, 1);
    kvg_vk_cmd_barrier(w->cb);
    return KVGEN_OK;
}

/* enc_attn.comp: each token's heads over its own text */
static kvgen_status op_attention(walk *w) {
    vk_model *vm = w->vm;
    vk_encoder *e = vm->enc;
    const kvg_hparams *hp = &vm->hp;
    uint32_t spec[KVG_SPEC_COUNT];
    spec_init(spec);
    spec[KVG_SPEC_WG] = e->attn_wg;
    spec[KVG_SPEC_HD] = (uint32_t)hp->head_dim;
    VkPipeline pipe;
    if (w->mode == WALK_PIPELINES) return kvg_vk_walk_pipeline(w, "enc_attn", spec, &pipe);
    int idx = w->cursor++;
    if (w->mode == WALK_SETS) {
        kvg_vk_binding bs[KVG_VK_BINDINGS] = {{0}};
        bs[0].buf = kvg_vk_mirror_bound(&vm->params);
        bs[2].buf = &vm->q;
        bs[3].buf = &vm->att;
        return kvg_vk_set_create(vm->ctx, w->s->pool, bs, &w->s->sets[idx], w->err);
    }
    if (w->mode != WALK_RECORD) return KVGEN_OK;
    kvgen_status st = kvg_vk_walk_pipeline(w, "enc_attn", spec, &pipe);
    if (st != KVGEN_OK) return st;
    struct { /* matches PC in shaders/enc_attn.comp */
        uint32_t n_head, ldq, ldo, ncols;
        float scale;
        uint32_t nq, seg;
    } pc = {(uint32_t)hp->n_head, e->ld_qkv, vm->ld_q, w->n, 1.0f / sqrtf((float)hp->head_dim),
            (uint32_t)(hp->n_head * hp->head_dim), e->cap};
    kvg_vk_cmd_dispatch(vm->ctx, w->cb, pipe, w->s->sets[idx], &pc, sizeof pc, (w->n + e->attn_wg - 1) / e->attn_wg,
                        (uint32_t)hp->n_head, 1);
    kvg_vk_cmd_barrier(w->cb);
    return KVGEN_OK;
}

/* the encoder's op list, walked for w->mode (as kvg_vk_walk_step for a decoder's step) */
static kvgen_status encode_walk(walk *w) {
    vk_model *vm = w->vm;
    vk_encoder *e = vm->enc;
    int n_layer = vm->hp.n_layer;
    kvgen_status st = kvg_vk_op_embed(w);
    if (st == KVGEN_OK) st = op_layer_norm(w, LN_EMBED, &e->ln_w, &e->ln_b, n_layer == 0);
    for (int l = 0; l < n_layer && st == KVGEN_OK; l++) {
        vk_enc_layer *L = &e->layers[l];
        matmul_args qkv = {.m = &L->qkv, .epi = EPI_STORE, .in = &vm->x, .out = &vm->q, .ldx = vm->ld_x,
                           .ldo = e->ld_qkv, .ncols = w->n, .bias = &L->b_qkv};
        st = kvg_vk_op_matmul(w, &qkv);
        if (st == KVGEN_OK) st = op_attention(w);
        matmul_args wo = {.m = &L->wo, .epi = EPI_ADD, .in = &vm->att, .out = &vm->x, .ldx = vm->ld_q,
                          .ldo = vm->ld_x, .ncols = w->n, .bias = &L->b_o};
        if (st == KVGEN_OK) st = kvg_vk_op_matmul(w, &wo);
        if (st == KVGEN_OK) st = op_layer_norm(w, LN_PLAIN, &L->ln1_w, &L->ln1_b, false);
        matmul_args up = {.m = &L->up, .epi = EPI_GELU, .in = &vm->x, .out = &vm->h, .ldx = vm->ld_x,
                          .ldo = vm->ld_h, .ncols = w->n, .bias = &L->b_up};
        if (st == KVGEN_OK) st = kvg_vk_op_matmul(w, &up);
        matmul_args down = {.m = &L->down, .epi = EPI_ADD, .in = &vm->h, .out = &vm->x, .ldx = vm->ld_h,
                            .ldo = vm->ld_x, .ncols = w->n, .bias = &L->b_down};
        if (st == KVGEN_OK) st = kvg_vk_op_matmul(w, &down);
        if (st == KVGEN_OK) st = op_layer_norm(w, LN_PLAIN, &L->ln2_w, &L->ln2_b, l == n_layer - 1);
    }
    return st;
}

/* ---- load ---- */

static kvgen_status upload_floats(vk_model *vm, const float *v, size_t n, kvg_vk_buffer *out, kvgen_error *err) {
    kvgen_status st = kvg_vk_buffer_create(vm->ctx, n * sizeof *v, KVG_VK_MEM_UPLOAD, out, err);
    if (st == KVGEN_OK) st = kvg_vk_upload(vm->ctx, out, 0, v, n * sizeof *v, err);
    return st;
}

/* the position table: row p = position_embd[p] + token_types[0] (every token is of type 0) */
static kvgen_status upload_positions(kvgen_model *m, kvgen_error *err) {
    vk_model *vm = m->backend;
    const kvg_weights *w = &m->w;
    size_t D = (size_t)vm->hp.n_embd, n = (size_t)vm->hp.n_ctx_train;
    float *tab = kvg_malloc(n * D * sizeof *tab), *type0 = kvg_calloc(D, sizeof *type0);
    kvgen_status st = KVGEN_OK;
    if (!tab || !type0) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory for the position table");
    if (st == KVGEN_OK && w->tok_types) kvg_dequantize_row(w->tok_types->type, w->tok_types->data, type0, D);
    for (size_t p = 0; st == KVGEN_OK && p < n; p++) {
        const kvg_tensor *pe = w->pos_embd;
        kvg_dequantize_row(pe->type, (const uint8_t *)pe->data + p * kvg_row_bytes(pe->type, pe->ne[0]), tab + p * D, D);
        for (size_t d = 0; d < D; d++) tab[p * D + d] += type0[d];
    }
    if (st == KVGEN_OK) st = upload_floats(vm, tab, n * D, &vm->enc->pos, err);
    kvg_free(tab);
    kvg_free(type0);
    return st;
}

/* layer l's matrices (Q, K, V concatenated, as the decoder's), biases and norms */
static kvgen_status upload_layer(kvgen_model *m, int l, kvgen_error *err) {
    vk_model *vm = m->backend;
    const kvg_layer *src = &m->w.layers[l];
    vk_enc_layer *L = &vm->enc->layers[l];
    const kvg_hparams *hp = &vm->hp;
    size_t nq = (size_t)hp->n_head * (size_t)hp->head_dim, nk = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    const kvg_tensor *qkv[3] = {src->wq, src->wk, src->wv};
    char what[48];
    snprintf(what, sizeof what, "blk.%d.attn_qkv", l);
    kvgen_status st = kvg_vk_upload_matrix(vm, what, qkv, 3, false, &L->qkv, err);
    snprintf(what, sizeof what, "blk.%d.attn_output", l);
    if (st == KVGEN_OK) st = kvg_vk_upload_matrix(vm, what, &src->wo, 1, false, &L->wo, err);
    snprintf(what, sizeof what, "blk.%d.ffn_up", l);
    if (st == KVGEN_OK) st = kvg_vk_upload_matrix(vm, what, &src->w_up, 1, false, &L->up, err);
    snprintf(what, sizeof what, "blk.%d.ffn_down", l);
    if (st == KVGEN_OK) st = kvg_vk_upload_matrix(vm, what, &src->w_down, 1, false, &L->down, err);
    float *b = st == KVGEN_OK ? kvg_calloc(nq + 2 * nk, sizeof *b) : NULL;
    if (st == KVGEN_OK && !b) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    if (st == KVGEN_OK) {
        const kvg_tensor *bt[3] = {src->bq, src->bk, src->bv};
        size_t at[3] = {0, nq, nq + nk}, len[3] = {nq, nk, nk};
        for (int i = 0; i < 3; i++)
            if (bt[i]) kvg_dequantize_row(bt[i]->type, bt[i]->data, b + at[i], len[i]);
        st = upload_floats(vm, b, nq + 2 * nk, &L->b_qkv, err);
    }
    kvg_free(b);
    const kvg_tensor *vecs[] = {src->bo, src->b_up, src->b_down, src->attn_out_norm, src->attn_out_norm_b,
                                src->out_norm, src->out_norm_b};
    kvg_vk_buffer *dst[] = {&L->b_o, &L->b_up, &L->b_down, &L->ln1_w, &L->ln1_b, &L->ln2_w, &L->ln2_b};
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0] && st == KVGEN_OK; i++)
        st = kvg_vk_upload_norm(vm, vecs[i], dst[i], err);
    return st;
}

static uint64_t layer_bytes(const kvg_layer *l) {
    return (uint64_t)l->wq->nbytes + l->wk->nbytes + l->wv->nbytes + l->wo->nbytes + l->w_up->nbytes +
           l->w_down->nbytes;
}

/* tokens per submission: room for the batches kvgen_embed sends (and at least one text of the
 * model's context), fewer where a scratch buffer would pass maxStorageBufferRange;
 * KVGEN_VK_CHUNK lowers it (tests: a batch over several submissions) */
static kvgen_status choose_cap(vk_model *vm, kvgen_error *err) {
    const kvg_hparams *hp = &vm->hp;
    vk_encoder *e = vm->enc;
    uint32_t ctx = (uint32_t)hp->n_ctx_train, cap = ctx > 2048 ? ctx : 2048;
    const char *env = getenv("KVGEN_VK_CHUNK");
    if (env && atoi(env) > 0 && (uint32_t)atoi(env) < cap) cap = (uint32_t)atoi(env) > ctx ? (uint32_t)atoi(env) : ctx;
    uint32_t widest = e->ld_qkv > vm->ld_h ? e->ld_qkv : vm->ld_h;
    if (vm->ld_q > widest) widest = vm->ld_q;
    if (vm->ld_x > widest) widest = vm->ld_x;
    size_t range = vm->ctx->props.limits.maxStorageBufferRange, win = vm->ctx->ubo_window;
    if ((size_t)ctx * (size_t)hp->n_embd * 4 > range)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: the position table of %u tokens (%zu bytes) exceeds what "
                        "device %s binds (%zu bytes, maxStorageBufferRange)", ctx, (size_t)ctx * (size_t)hp->n_embd * 4,
                        vm->ctx->info.name, range);
    while (cap > ctx && (size_t)cap * widest * 4 + win > range) cap /= 2;
    if (cap < ctx) cap = ctx;
    if ((size_t)cap * widest * 4 + win > range)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: a text of %u tokens needs %zu bytes of activations in one "
                        "buffer; device %s binds %zu (maxStorageBufferRange)", ctx, (size_t)cap * widest * 4 + win,
                        vm->ctx->info.name, range);
    e->cap = cap;
    return KVGEN_OK;
}

kvgen_status kvg_vk_encoder_init(kvgen_model *m, kvgen_error *err) {
    vk_model *vm = m->backend;
    kvg_vk_ctx *ctx = vm->ctx;
    const kvg_hparams *hp = &vm->hp;
    const kvg_weights *w = &m->w;
    if (hp->head_dim % 4 != 0 || hp->n_head_kv != hp->n_head)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: an encoder's attention needs head_dim a multiple of 4 (%d) "
                        "and one K/V head per query head (%d of %d)", hp->head_dim, hp->n_head_kv, hp->n_head);
    /* enc_attn.comp walks a text in one loop: lavapipe's 65,535 trips bound it */
    if (hp->n_ctx_train < 1 || hp->n_ctx_train > 32768)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: an encoder context of %d tokens (1 to 32768)",
                        hp->n_ctx_train);
    vk_encoder *e = kvg_calloc(1, sizeof *e);
    if (!e) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    vm->enc = e;
    vm->embd_scale = 1.0f; /* an encoder's embeddings are summed unscaled */
    e->ld_qkv = round_up((uint32_t)((hp->n_head + 2 * hp->n_head_kv) * hp->head_dim), 32);
    kvgen_status st = choose_cap(vm, err);
    if (st != KVGEN_OK) return st;

    /* weights; the upload stage counts the matrices' bytes, a report per layer */
    uint64_t total = w->tok_embd->nbytes, done = total;
    for (int l = 0; l < hp->n_layer; l++) total += layer_bytes(&w->layers[l]);
    st = kvg_vk_upload_matrix(vm, "token_embd", &w->tok_embd, 1, false, &vm->embd, err);
    if (st == KVGEN_OK) st = upload_positions(m, err);
    if (st == KVGEN_OK) st = kvg_vk_upload_norm(vm, w->embd_norm, &e->ln_w, err);
    if (st == KVGEN_OK) st = kvg_vk_upload_norm(vm, w->embd_norm_b, &e->ln_b, err);
    if (st == KVGEN_OK) st = kvg_load_progress(m, KVGEN_LOAD_UPLOAD, done, total, err);
    e->layers = kvg_calloc((size_t)(hp->n_layer > 0 ? hp->n_layer : 1), sizeof *e->layers);
    if (st == KVGEN_OK && !e->layers) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    for (int l = 0; l < hp->n_layer && st == KVGEN_OK; l++) {
        st = upload_layer(m, l, err);
        done += layer_bytes(&w->layers[l]);
        if (st == KVGEN_OK) st = kvg_load_progress(m, KVGEN_LOAD_UPLOAD, done, total, err);
    }
    if (st != KVGEN_OK) return st;
    /* the device holds the matrices now: the file's pages of them leave host memory */
    kvg_gguf_drop_bytes(m->gguf, w->tok_embd->data, w->tok_embd->nbytes);
    for (int l = 0; l < hp->n_layer; l++) {
        const kvg_layer *src = &w->layers[l];
        const kvg_tensor *ts[] = {src->wq, src->wk, src->wv, src->wo, src->w_up, src->w_down};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) kvg_gguf_drop_bytes(m->gguf, ts[i]->data, ts[i]->nbytes);
    }

    /* scratch (the decoder's fields, an encoder having no decoder steps): params (token ids,
     * then each token's text), x, Q|K|V (q), attention output, FFN activations (h), and the
     * last block's states for the host (logits); the mat-mul inputs with a uniform window of
     * slack (vk_backend.c) */
    size_t C = e->cap, win = ctx->ubo_window;
    st = kvg_vk_mirror_create(ctx, 16 + C * 3 * 4, &vm->params, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, C * vm->ld_x * 4 + win, KVG_VK_MEM_DEVICE, &vm->x, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, C * e->ld_qkv * 4, KVG_VK_MEM_DEVICE, &vm->q, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, C * vm->ld_q * 4 + win, KVG_VK_MEM_DEVICE, &vm->att, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, C * vm->ld_h * 4 + win, KVG_VK_MEM_DEVICE, &vm->h, err);
    if (st == KVGEN_OK)
        st = kvg_vk_buffer_create(ctx, C * (size_t)hp->n_embd * 4, KVG_VK_MEM_HOST, &vm->logits, err);
    if (st == KVGEN_OK && (!vm->params.host.map || !vm->logits.map))
        st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: device %s offers no host-visible coherent memory", ctx->info.name);
    if (st != KVGEN_OK) return st;

    /* workgroup sizes within the device's limits */
    uint32_t spec[KVG_SPEC_COUNT];
    spec_init(spec);
    spec[KVG_SPEC_WG] = 64;
    if (!kvg_vk_fit_wg(ctx, "layer_norm", spec, 1))
        return kvg_vk_shader_fits(ctx, "layer_norm", spec, err);
    e->ln_wg = spec[KVG_SPEC_WG];
    /* a CPU device: one SIMD group of 8 lanes, consecutive tokens (enc_attn.comp) */
    spec[KVG_SPEC_WG] = vm->mv_lane ? 8 : 64;
    if (!kvg_vk_fit_wg(ctx, "enc_attn", spec, 1))
        return kvg_vk_shader_fits(ctx, "enc_attn", spec, err);
    e->attn_wg = spec[KVG_SPEC_WG];

    /* the descriptor sets, written once; a command buffer and a fence */
    kvg_backend_session *s = &e->s;
    s->n_ctx = (int)e->cap;
    walk sw = {.vm = vm, .s = s, .n = 1, .err = err};
    st = kvg_vk_walk_sets(&sw, encode_walk);
    if (st == KVGEN_OK) {
        VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        st = kvg_vk_check(vkCreateFence(ctx->dev, &fci, NULL, &s->fence), err, "vkCreateFence");
    }
    if (st == KVGEN_OK) {
        kvg_vk_lock(ctx);
        st = kvg_vk_cmd_alloc(ctx, &s->cb_step, err);
        kvg_vk_unlock(ctx);
    }
    return st;
}

kvgen_status kvg_vk_encoder_pipelines(vk_model *vm, kvgen_error *err) {
    walk pw = {.mode = WALK_PIPELINES, .vm = vm, .n = 1, .err = err};
    return encode_walk(&pw);
}

void kvg_vk_encoder_free(vk_model *vm) {
    vk_encoder *e = vm->enc;
    if (!e) return;
    kvg_vk_ctx *ctx = vm->ctx;
    if (e->layers)
        for (int l = 0; l < vm->hp.n_layer; l++) {
            vk_enc_layer *L = &e->layers[l];
            vk_matrix *ms[] = {&L->qkv, &L->wo, &L->up, &L->down};
            for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) kvg_vk_free_matrix(ctx, ms[i]);
            kvg_vk_buffer *bs[] = {&L->b_qkv, &L->b_o, &L->b_up, &L->b_down, &L->ln1_w, &L->ln1_b, &L->ln2_w, &L->ln2_b};
            for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++) kvg_vk_buffer_destroy(ctx, bs[i]);
        }
    kvg_vk_buffer_destroy(ctx, &e->pos);
    kvg_vk_buffer_destroy(ctx, &e->ln_w);
    kvg_vk_buffer_destroy(ctx, &e->ln_b);
    if (e->s.cb_step) {
        kvg_vk_lock(ctx);
        vkFreeCommandBuffers(ctx->dev, ctx->cmd_pool, 1, &e->s.cb_step);
        kvg_vk_unlock(ctx);
    }
    if (e->s.fence) vkDestroyFence(ctx->dev, e->s.fence, NULL);
    if (e->s.pool) vkDestroyDescriptorPool(ctx->dev, e->s.pool, NULL);
    kvg_free(e->s.sets);
    kvg_free(e->layers);
    kvg_free(e);
    vm->enc = NULL;
}

/* ---- encode ---- */

/* texts [first, first + count) of b, n tokens from token `at` on, as one submission (caller
 * holds ctx->lock) */
static kvgen_status submit(vk_model *vm, const kvg_encode_batch *b, int first, int count, uint32_t at, uint32_t n,
                           kvgen_error *err) {
    vk_encoder *e = vm->enc;
    kvg_backend_session *s = &e->s;
    uint32_t *params = vm->params.host.map;
    params[0] = 0; /* pos0 */
    params[1] = 0; /* not a batched decode */
    memcpy(params + 4, b->tokens + at, n * sizeof *b->tokens);
    uint32_t *seg = params + 4 + e->cap;
    for (int i = 0, t = 0; i < count; i++)
        for (int p = 0; p < b->n_tokens[first + i]; p++, t++) {
            seg[2 * t] = (uint32_t)(t - p);
            seg[2 * t + 1] = (uint32_t)b->n_tokens[first + i];
        }
    kvgen_status st = kvg_vk_check(vkResetCommandBuffer(s->cb_step, 0), err, "vkResetCommandBuffer");
    if (st == KVGEN_OK) st = kvg_vk_cmd_begin(s->cb_step, true, err);
    if (st != KVGEN_OK) return st;
    kvg_vk_cmd_mirror(s->cb_step, &vm->params);
    walk rw = {.mode = WALK_RECORD, .vm = vm, .s = s, .cb = s->cb_step, .n = n, .err = err};
    st = encode_walk(&rw);
    if (st != KVGEN_OK) {
        vkEndCommandBuffer(s->cb_step);
        return st;
    }
    kvg_vk_cmd_host_barrier(s->cb_step);
    st = kvg_vk_cmd_end(s->cb_step, err);
    if (st == KVGEN_OK) st = kvg_vk_submit_wait(vm->ctx, s->cb_step, s->fence, err);
    if (st == KVGEN_OK)
        memcpy(b->hidden + (size_t)at * (size_t)vm->hp.n_embd, vm->logits.map,
               (size_t)n * (size_t)vm->hp.n_embd * sizeof(float));
    return st;
}

kvgen_status kvg_vk_encode(kvgen_model *m, const kvg_encode_batch *b, kvgen_error *err) {
    vk_model *vm = m->backend;
    const kvg_hparams *hp = &vm->hp;
    if (!vm->enc) return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: %s is not an encoder", m->name ? m->name : "the model");
    size_t N = 0;
    for (int i = 0; i < b->n_seq; i++) {
        int n = b->n_tokens[i];
        if (n < 1 || n > hp->n_ctx_train)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: text %d has %d tokens (1 to %d)", i, n,
                            hp->n_ctx_train);
        N += (size_t)n;
    }
    for (size_t t = 0; t < N; t++)
        if (b->tokens[t] < 0 || b->tokens[t] >= hp->n_vocab)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: token %d is outside the vocabulary (0 to %d)",
                            b->tokens[t], hp->n_vocab - 1);
    kvgen_status st = KVGEN_OK;
    kvg_vk_lock(vm->ctx);
    /* whole texts per submission, as many as the scratch holds */
    uint32_t at = 0;
    for (int first = 0; first < b->n_seq && st == KVGEN_OK;) {
        int count = 0;
        uint32_t n = 0;
        while (first + count < b->n_seq && n + (uint32_t)b->n_tokens[first + count] <= vm->enc->cap)
            n += (uint32_t)b->n_tokens[first + count++];
        st = submit(vm, b, first, count, at, n, err);
        first += count;
        at += n;
    }
    kvg_vk_unlock(vm->ctx);
    return st;
}
