/* vk_backend.c: the llama forward pass as Vulkan compute shaders (kvg_vulkan_backend).
 *
 * Load: every weight matrix is repacked as its type's row of the weight-type table says (a
 * quant region and a scale region per part; kvg_vk.h, shaders/weights.glsl) and uploaded once;
 * Q/K/V are concatenated into one matrix and gate/up interleaved row by row so
 * one dispatch computes each group; a matrix bigger than maxStorageBufferRange is split into
 * row parts, one binding and one dispatch each. Pipelines are all created at load.
 *
 * A step (a prefill chunk of up to `chunk` tokens, or one decode token) is one command buffer:
 *   embed -> per layer [QKV (+RMSNorm, RoPE, K/V cache write) -> attention (-> split reduce)
 *   -> Wo (+residual) -> gate/up (+RMSNorm, SwiGLU) -> down (+residual)] -> logits (+final norm)
 * Per-step values (position, token ids) live in a small host-visible buffer, so the decode
 * command buffer of a session is recorded once and replayed; descriptor sets are written when
 * the session is created. Nothing is allocated on the per-token path.
 *
 * Files: vk_backend.c (this one) model and session set-up, the environment knobs, running steps
 * and the forward entry points, the ops table; below it vk_walk.c (the step walker: the op list
 * of one step), vk_kv.c (KV layout, paged pool, kv_copy), vk_weights.c (weight-type table,
 * repack, upload), vk_hooks.c (test hooks), all on vk_device.c; shared structs in
 * kvg_vk_backend.h.
 *
 * The architecture's facts come from the model description (kvg_weights): the FFN epilogue
 * follows its activation; model_init refuses a model needing a feature the shaders do not
 * implement yet (kvg_arch_check_backend, `.features` below), e.g. NEOX RoPE, as the QKV
 * epilogue rotates adjacent pairs only.
 *
 * A batched decode (forward_batch, paged pool) runs one token each of up to BATCH_MAX sessions
 * as the columns of one step, so the mat-vecs read each weight once for all of them: params
 * give every column its own position and page table (shaders/common.glsl, kvg_pos/kvg_tab),
 * the tables concatenated in the model's batch session (vm->bat), whose sets and recorded
 * command buffer are reused from step to step.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_vk_backend.h"

/* a batched decode's columns per step (the lane mat-vec's tokens per weight read); its
 * (position, table entry) pairs follow the token ids in params, from index BATCH_AT */
enum { BATCH_MAX = 8, BATCH_AT = BATCH_MAX };

static const char *const prof_names[8] = {"embed", "qkv", "attn", "wo", "gateup", "down", "logits", "?"};

/* ---- backend ops ---- */

kvg_vk_ctx *kvg_vk_model_ctx(const kvgen_model *m) {
    if (!m || m->ops != &kvg_vulkan_backend || !m->backend) return NULL;
    return ((const vk_model *)m->backend)->ctx;
}

static void vk_session_free(kvgen_model *m, kvg_backend_session *s);

static void vk_model_free(kvgen_model *m) {
    vk_model *vm = m->backend;
    if (!vm) return;
    kvg_vk_ctx *ctx = vm->ctx;
    if (ctx) {
        vk_session_free(m, vm->bat);
        vm->bat = NULL;
        vkDeviceWaitIdle(ctx->dev);
        if (vm->prof_pool) {
            fprintf(stderr, "kvgen vulkan profile over %d steps (ms per step):", vm->prof_steps);
            for (int i = 0; i < 7; i++) fprintf(stderr, " %s %.2f", prof_names[i], vm->prof_ms[i] / (vm->prof_steps ? vm->prof_steps : 1));
            fprintf(stderr, "\n");
            vkDestroyQueryPool(ctx->dev, vm->prof_pool, NULL);
        }
        kvg_vk_free_matrix(ctx, &vm->embd);
        if (!vm->tied) kvg_vk_free_matrix(ctx, &vm->output);
        kvg_vk_buffer_destroy(ctx, &vm->out_norm);
        if (vm->layers)
            for (int l = 0; l < vm->hp.n_layer; l++) {
                vk_layer *L = &vm->layers[l];
                kvg_vk_free_matrix(ctx, &L->qkv);
                kvg_vk_free_matrix(ctx, &L->wo);
                kvg_vk_free_matrix(ctx, &L->gateup);
                kvg_vk_free_matrix(ctx, &L->down);
                kvg_vk_buffer_destroy(ctx, &L->attn_norm);
                kvg_vk_buffer_destroy(ctx, &L->ffn_norm);
            }
        for (int j = 0; j < KVG_VK_KV_SLABS; j++) kvg_vk_buffer_destroy(ctx, &vm->slabs[j]);
        for (int k = 0; k < 13; k++) kvg_vk_buffer_destroy(ctx, &vm->ropes[k]);
        if (vm->ops_pool) vkDestroyDescriptorPool(ctx->dev, vm->ops_pool, NULL);
        if (vm->ops_cb) vkFreeCommandBuffers(ctx->dev, ctx->cmd_pool, 1, &vm->ops_cb);
        kvg_vk_select_free(ctx, &vm->sel);
        kvg_vk_buffer *scratch[] = {&vm->params, &vm->x, &vm->q, &vm->att, &vm->h, &vm->logits, &vm->ops};
        for (size_t i = 0; i < sizeof scratch / sizeof scratch[0]; i++) kvg_vk_buffer_destroy(ctx, scratch[i]);
        kvg_vk_ctx_destroy(ctx);
    }
    if (vm->rope_mu_init) pthread_mutex_destroy(&vm->rope_mu);
    if (vm->bat_mu_init) pthread_mutex_destroy(&vm->bat_mu);
    free(vm->layers);
    free(vm);
    m->backend = NULL;
}

static kvgen_status vk_model_init(kvgen_model *m, const kvgen_model_desc *desc, kvgen_error *err) {
    kvgen_status type_st = kvg_weights_check_types(m, &kvg_vulkan_backend, err); /* before any device work */
    if (type_st == KVGEN_OK) type_st = kvg_arch_check_backend(m, &kvg_vulkan_backend, err);
    if (type_st != KVGEN_OK) return type_st;
    const kvg_hparams *hp = &m->w.hp;
    const char *path = desc->path ? desc->path : "model";
    if (hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv != 0)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: vulkan: %d heads over %d KV heads", path, hp->n_head,
                        hp->n_head_kv);
    if (hp->n_head / hp->n_head_kv > 8 || hp->head_dim > 256 || hp->head_dim % 2 != 0 || hp->n_rot % 2 != 0 ||
        hp->n_rot > hp->head_dim)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "%s: vulkan: attention shape (%d query heads per KV head, head_dim %d, n_rot %d) is "
                        "outside what the shaders handle (<= 8 per KV head, head_dim even and <= 256)",
                        path, hp->n_head / hp->n_head_kv, hp->head_dim, hp->n_rot);
    vk_model *vm = calloc(1, sizeof *vm);
    if (!vm) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    m->backend = vm;
    vm->hp = *hp;
    /* the step's ops from the description: only what kvg_arch_check_backend let through */
    switch (m->w.act) {
    case KVG_ACT_SILU_GATED:
    default:
        vm->ffn_epi = EPI_SWIGLU;
        break;
    }
    pthread_mutex_init(&vm->rope_mu, NULL);
    vm->rope_mu_init = true;
    pthread_mutex_init(&vm->bat_mu, NULL);
    vm->bat_mu_init = true;
    kvg_vk_ctx_desc cd = {.device = desc->device,
                          .force_f32 = desc->force_f32,
                          .vk_instance = desc->vk_instance,
                          .vk_physical_device = desc->vk_physical_device,
                          .vk_device = desc->vk_device,
                          .vk_queue = desc->vk_queue,
                          .vk_queue_family = desc->vk_queue_family,
                          .pipeline_cache_path = desc->pipeline_cache_path};
    kvgen_status st = kvg_vk_ctx_create(&cd, &vm->ctx, err);
    if (st != KVGEN_OK) goto fail;
    kvg_vk_ctx *ctx = vm->ctx;
    snprintf(m->device_name, sizeof m->device_name, "%s", ctx->info.name);

    /* a CPU device runs a workgroup on one core: no cooperation inside workgroups there */
    vm->mv_lane = ctx->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    vm->mv_wg = vm->mv_lane ? 32 : 64;
    vm->mv_rows = 4;
    vm->lane_rows = 8;
    vm->lane_ubo = true;
    /* splits buy parallelism on a GPU; on a CPU device the KV heads already fill the cores and
     * each split's fixed cost (and the reduce) dominates: split there only for the loop limit */
    vm->nsplit = vm->mv_lane ? 1 : 8;
    if (getenv("KVGEN_VK_LANE")) vm->mv_lane = atoi(getenv("KVGEN_VK_LANE")) != 0;
    if (getenv("KVGEN_VK_WG")) vm->mv_wg = (uint32_t)atoi(getenv("KVGEN_VK_WG"));
    if (getenv("KVGEN_VK_ROWS")) vm->mv_rows = (uint32_t)atoi(getenv("KVGEN_VK_ROWS"));
    if (getenv("KVGEN_VK_LANE_ROWS")) vm->lane_rows = (uint32_t)atoi(getenv("KVGEN_VK_LANE_ROWS")) & ~1u;
    if (vm->lane_rows < 2) vm->lane_rows = 2;
    if (getenv("KVGEN_VK_UBO")) vm->lane_ubo = atoi(getenv("KVGEN_VK_UBO")) != 0;
    /* attn_lane.comp: splits are its parallelism (8 lanes per workgroup) and cost little when
     * empty (short contexts fill the first ones, >= 32 positions each) */
    vm->attn_lane = vm->mv_lane && hp->head_dim % 8 == 0;
    if (getenv("KVGEN_VK_ATTN_LANE")) vm->attn_lane = atoi(getenv("KVGEN_VK_ATTN_LANE")) != 0 && hp->head_dim % 8 == 0;
    vm->nsplit = vm->attn_lane ? 16 : vm->mv_lane ? 1 : 8;
    if (getenv("KVGEN_VK_NSPLIT")) vm->nsplit = (uint32_t)atoi(getenv("KVGEN_VK_NSPLIT"));
    vm->ld_x = round_up((uint32_t)hp->n_embd, 32);
    vm->ld_q = round_up((uint32_t)(hp->n_head * hp->head_dim), 32);
    vm->ld_h = round_up((uint32_t)hp->n_ff, 32);
    size_t range = ctx->props.limits.maxStorageBufferRange;
    uint32_t chunk = 128;
    while (chunk > 1 && (size_t)chunk * (size_t)hp->n_vocab * 4 > range) chunk /= 2;
    const char *env_chunk = getenv("KVGEN_VK_CHUNK"); /* tests: force small prefill chunks */
    if (env_chunk && atoi(env_chunk) > 0 && (uint32_t)atoi(env_chunk) < chunk) chunk = (uint32_t)atoi(env_chunk);
    vm->chunk = chunk;

    /* weights */
    const kvg_weights *w = &m->w;
    vm->tied = w->tied || w->output == w->tok_embd;
    st = kvg_vk_upload_matrix(vm, "token_embd", &w->tok_embd, 1, false, &vm->embd, err);
    if (st == KVGEN_OK && !vm->tied) st = kvg_vk_upload_matrix(vm, "output", &w->output, 1, false, &vm->output, err);
    if (st == KVGEN_OK && vm->tied) vm->output = vm->embd;
    if (st == KVGEN_OK) st = kvg_vk_upload_norm(vm, w->output_norm, &vm->out_norm, err);
    vm->layers = calloc((size_t)hp->n_layer, sizeof *vm->layers);
    if (st == KVGEN_OK && !vm->layers) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    for (int l = 0; l < hp->n_layer && st == KVGEN_OK; l++) {
        const kvg_layer *src = &w->layers[l];
        vk_layer *L = &vm->layers[l];
        const kvg_tensor *qkv[3] = {src->wq, src->wk, src->wv};
        const kvg_tensor *gu[2] = {src->w_gate, src->w_up};
        char what[48];
        snprintf(what, sizeof what, "blk.%d.attn_qkv", l);
        st = kvg_vk_upload_matrix(vm, what, qkv, 3, false, &L->qkv, err);
        snprintf(what, sizeof what, "blk.%d.attn_output", l);
        if (st == KVGEN_OK) st = kvg_vk_upload_matrix(vm, what, &src->wo, 1, false, &L->wo, err);
        snprintf(what, sizeof what, "blk.%d.ffn_gate_up", l);
        if (st == KVGEN_OK) st = kvg_vk_upload_matrix(vm, what, gu, 2, true, &L->gateup, err);
        snprintf(what, sizeof what, "blk.%d.ffn_down", l);
        if (st == KVGEN_OK) st = kvg_vk_upload_matrix(vm, what, &src->w_down, 1, false, &L->down, err);
        if (st == KVGEN_OK) st = kvg_vk_upload_norm(vm, src->attn_norm, &L->attn_norm, err);
        if (st == KVGEN_OK) st = kvg_vk_upload_norm(vm, src->ffn_norm, &L->ffn_norm, err);
    }
    if (st != KVGEN_OK) goto fail;

    /* scratch */
    uint32_t C = vm->chunk;
    /* token ids, or a batched decode's ids and (position, table) pairs from BATCH_AT */
    st = kvg_vk_buffer_create(ctx, 16 + (size_t)(C > 3 * BATCH_MAX ? C : 3 * BATCH_MAX) * 4, KVG_VK_MEM_HOST,
                              &vm->params, err);
    /* mat-vec inputs get a uniform window of slack: a window bound at any token stays inside */
    size_t win = ctx->ubo_window;
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)C * vm->ld_x * 4 + win, KVG_VK_MEM_DEVICE, &vm->x, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)C * vm->ld_q * 4, KVG_VK_MEM_DEVICE, &vm->q, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)C * vm->ld_q * 4 + win, KVG_VK_MEM_DEVICE, &vm->att, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)C * vm->ld_h * 4 + win, KVG_VK_MEM_DEVICE, &vm->h, err);
    if (st == KVGEN_OK)
        st = kvg_vk_buffer_create(ctx, (size_t)C * (size_t)hp->n_vocab * 4, KVG_VK_MEM_HOST, &vm->logits, err);
    if (st == KVGEN_OK && (!vm->params.map || !vm->logits.map))
        st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: device %s offers no host-visible coherent memory", ctx->info.name);
    if (st == KVGEN_OK) st = kvg_vk_select_init(ctx, &vm->logits, (uint32_t)hp->n_vocab, &vm->sel, err);
    if (st != KVGEN_OK) goto fail;

    if (getenv("KVGEN_VK_PROFILE") && atoi(getenv("KVGEN_VK_PROFILE")) > 0) {
        vm->prof_prefill = atoi(getenv("KVGEN_VK_PROFILE")) == 2;
        VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                    .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = 512};
        st = kvg_vk_check(vkCreateQueryPool(ctx->dev, &qi, NULL, &vm->prof_pool), err, "vkCreateQueryPool");
        if (st != KVGEN_OK) goto fail;
    }
    /* every pipeline a step can use, now rather than on the per-token path; a paged model's
     * depend on the pool's layout and are created by kv_pages_init */
    vm->paged = !desc->kv_contiguous;
    if (!vm->paged) {
        walk pw = {.mode = WALK_PIPELINES, .vm = vm, .n = 1, .logits = 2, .err = err};
        st = kvg_vk_walk_step(&pw);
        if (st != KVGEN_OK) goto fail;
        kvg_vk_pcache_save(ctx); /* every pipeline exists now */
    }
    return KVGEN_OK;
fail:
    if (err && err->status != KVGEN_OK && !strstr(err->message, path)) {
        char msg[KVGEN_ERROR_MESSAGE_SIZE];
        size_t lp = strlen(path), lm = strlen(err->message);
        if (lp > 200) lp = 200;
        if (lm > sizeof msg - lp - 3) lm = sizeof msg - lp - 3;
        memcpy(msg, path, lp);
        memcpy(msg + lp, ": ", 2);
        memcpy(msg + lp + 2, err->message, lm);
        msg[lp + 2 + lm] = '\0';
        memcpy(err->message, msg, sizeof msg);
    }
    vk_model_free(m);
    return st;
}

/* The shared RoPE table for at least n_ctx positions, angles in double on the host as the
 * reference computes them. */
static kvgen_status rope_table(vk_model *vm, int n_ctx, const kvg_vk_buffer **out, kvgen_error *err) {
    const kvg_hparams *hp = &vm->hp;
    int k = 0;
    while (k < 12 && ((size_t)256 << k) < (size_t)n_ctx) k++;
    size_t n_pos = (size_t)256 << k, half = (size_t)(hp->n_rot / 2);
    kvgen_status st = KVGEN_OK;
    pthread_mutex_lock(&vm->rope_mu);
    if (!vm->ropes[k].buf) {
        size_t n = n_pos * (half ? half : 1) * 2;
        float *cs = malloc(n * sizeof *cs);
        if (!cs) {
            st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
        } else {
            for (size_t p = 0; p < n_pos; p++)
                for (size_t i = 0; i < half; i++) {
                    double theta = (double)p * pow(hp->rope_freq_base, -2.0 * (double)i / hp->n_rot);
                    cs[(p * half + i) * 2] = (float)cos(theta);
                    cs[(p * half + i) * 2 + 1] = (float)sin(theta);
                }
            kvg_vk_buffer b;
            st = kvg_vk_buffer_create(vm->ctx, n * sizeof *cs, KVG_VK_MEM_UPLOAD, &b, err);
            if (st == KVGEN_OK) st = kvg_vk_upload(vm->ctx, &b, 0, cs, n * sizeof *cs, err);
            if (st == KVGEN_OK) vm->ropes[k] = b;
            else kvg_vk_buffer_destroy(vm->ctx, &b);
            free(cs);
        }
    }
    pthread_mutex_unlock(&vm->rope_mu);
    *out = &vm->ropes[k];
    return st;
}

static void vk_session_free(kvgen_model *m, kvg_backend_session *s) {
    if (!s) return;
    vk_model *vm = m->backend;
    kvg_vk_ctx *ctx = vm->ctx;
    pthread_mutex_lock(&ctx->lock);
    vkQueueWaitIdle(ctx->queue);
    if (vm->logits_owner == s) vm->logits_owner = NULL;
    if (s->cb_decode) vkFreeCommandBuffers(ctx->dev, ctx->cmd_pool, 1, &s->cb_decode);
    if (s->cb_step) vkFreeCommandBuffers(ctx->dev, ctx->cmd_pool, 1, &s->cb_step);
    pthread_mutex_unlock(&ctx->lock);
    if (s->fence) vkDestroyFence(ctx->dev, s->fence, NULL);
    if (s->pool) vkDestroyDescriptorPool(ctx->dev, s->pool, NULL);
    if (s->k)
        for (int l = 0; l < vm->hp.n_layer; l++) kvg_vk_buffer_destroy(ctx, &s->k[l]);
    if (s->v)
        for (int l = 0; l < vm->hp.n_layer; l++) kvg_vk_buffer_destroy(ctx, &s->v[l]);
    kvg_vk_buffer_destroy(ctx, &s->part);
    kvg_vk_buffer_destroy(ctx, &s->ptab);
    free(s->k);
    free(s->v);
    free(s->sets);
    free(s->saved);
    free(s);
}

/* batch: the model's batch session (vm->bat): a page table of BATCH_MAX tables and partials
 * for BATCH_MAX decode tokens */
static kvgen_status session_create(kvgen_model *m, int n_ctx, bool batch, kvg_backend_session **out,
                                   kvgen_error *err) {
    *out = NULL;
    vk_model *vm = m->backend;
    kvg_vk_ctx *ctx = vm->ctx;
    const kvg_hparams *hp = &vm->hp;
    if (n_ctx <= 0 || n_ctx > (256 << 12))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: session n_ctx %d is outside [1, %d]", n_ctx, 256 << 12);
    size_t elem = ctx->kv_f16 ? 2 : 4;
    size_t layer_bytes = (size_t)hp->n_head_kv * (size_t)n_ctx * (size_t)hp->head_dim * elem;
    if (vm->paged && !vm->page_size)
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: a paged model's session before its page pool");
    if (!vm->paged && layer_bytes > ctx->props.limits.maxStorageBufferRange)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "vulkan: a context of %d tokens needs %zu bytes of K per layer, more than the device's "
                        "storage buffer range (%u bytes); use a smaller n_ctx",
                        n_ctx, layer_bytes, ctx->props.limits.maxStorageBufferRange);
    kvg_backend_session *s = calloc(1, sizeof *s);
    if (!s) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    s->n_ctx = n_ctx;
    s->k = calloc((size_t)hp->n_layer, sizeof *s->k);
    s->v = calloc((size_t)hp->n_layer, sizeof *s->v);
    kvgen_status st = KVGEN_OK;
    s->saved = malloc((size_t)hp->n_vocab * sizeof *s->saved);
    if (!s->k || !s->v || !s->saved) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    if (vm->paged && st == KVGEN_OK)
        st = kvg_vk_buffer_create(ctx, ((size_t)n_ctx + (size_t)vm->page_size - 1) / (size_t)vm->page_size * 4 *
                                           (batch ? BATCH_MAX : 1),
                                  KVG_VK_MEM_HOST, &s->ptab, err);
    if (vm->paged && st == KVGEN_OK && !s->ptab.map)
        st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: the page table buffer is not host-visible");
    for (int l = 0; l < hp->n_layer && st == KVGEN_OK && !vm->paged; l++) {
        st = kvg_vk_buffer_create(ctx, layer_bytes, KVG_VK_MEM_DEVICE, &s->k[l], err);
        if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, layer_bytes, KVG_VK_MEM_DEVICE, &s->v[l], err);
    }
    uint32_t split_min = (uint32_t)((n_ctx + 4095) / 4096);
    s->nsplit_dec = vm->nsplit > split_min ? vm->nsplit : split_min;
    /* partials: a decode's nsplit_dec splits or a prefill chunk's split_min per token */
    size_t dec_rows = (size_t)s->nsplit_dec * (batch ? BATCH_MAX : 1);
    size_t part_rows = (size_t)vm->chunk * split_min > dec_rows ? (size_t)vm->chunk * split_min : dec_rows;
    if (st == KVGEN_OK)
        st = kvg_vk_buffer_create(ctx, part_rows * (size_t)hp->n_head * (size_t)(hp->head_dim + 2) * 4,
                                  KVG_VK_MEM_DEVICE, &s->part, err);
    if (st == KVGEN_OK) st = rope_table(vm, n_ctx, &s->rope, err);
    if (st == KVGEN_OK) {
        walk cw = {.mode = WALK_COUNT, .vm = vm, .s = s, .n = 1, .logits = 2, .err = err};
        st = kvg_vk_walk_step(&cw);
        s->n_sets = cw.cursor;
    }
    if (st == KVGEN_OK) {
        s->sets = calloc((size_t)s->n_sets, sizeof *s->sets);
        if (!s->sets) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    }
    if (st == KVGEN_OK) st = kvg_vk_pool_create(ctx, (uint32_t)s->n_sets, &s->pool, err);
    if (st == KVGEN_OK) {
        /* the lock: the pool's slabs may be created meanwhile by another thread's session */
        pthread_mutex_lock(&ctx->lock);
        s->kv_gen = __atomic_load_n(&vm->kv_gen, __ATOMIC_ACQUIRE);
        walk sw = {.mode = WALK_SETS, .vm = vm, .s = s, .n = 1, .logits = 2, .err = err};
        st = kvg_vk_walk_step(&sw);
        pthread_mutex_unlock(&ctx->lock);
    }
    if (st == KVGEN_OK) {
        VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        st = kvg_vk_check(vkCreateFence(ctx->dev, &fci, NULL, &s->fence), err, "vkCreateFence");
    }
    if (st == KVGEN_OK) {
        pthread_mutex_lock(&ctx->lock);
        st = kvg_vk_cmd_alloc(ctx, &s->cb_decode, err);
        if (st == KVGEN_OK) st = kvg_vk_cmd_alloc(ctx, &s->cb_step, err);
        pthread_mutex_unlock(&ctx->lock);
    }
    if (st != KVGEN_OK) {
        vk_session_free(m, s);
        return st;
    }
    *out = s;
    return KVGEN_OK;
}

static kvgen_status vk_session_init(kvgen_model *m, int n_ctx, kvg_backend_session **out, kvgen_error *err) {
    return session_create(m, n_ctx, false, out, err);
}

/* Moves the kept logits of the session that owns row 0 of vm->logits into its own memory
 * before a step overwrites them (caller holds ctx->lock). */
static void set_aside_logits(vk_model *vm, kvg_backend_session *s) {
    kvg_backend_session *o = vm->logits_owner;
    vm->logits_owner = NULL;
    if (!o || o == s) return; /* s's own are stale once it runs again */
    memcpy(o->saved, vm->logits.map, (size_t)vm->hp.n_vocab * sizeof(float));
    o->saved_valid = true;
}

/* Runs the step(s) of n tokens at pos0 (caller holds ctx->lock, arguments checked). keep: the
 * last token's logits stay on the device (logits NULL), with the best one (select 1) or
 * KVG_VK_TOPK (select > 1) selected in the same submission. */
static kvgen_status run_steps(vk_model *vm, kvg_backend_session *s, const int32_t *tokens, int n, int pos0,
                              float *logits, bool all_logits, bool keep, int select, kvgen_error *err) {
    kvg_vk_ctx *ctx = vm->ctx;
    const int V = vm->hp.n_vocab;
    kvgen_status st = KVGEN_OK;
    if (logits || keep) set_aside_logits(vm, s);
    s->sel_n = 0;
    s->saved_valid = false;
    if (select > 1) select = 2;
    for (int done = 0; done < n && st == KVGEN_OK;) {
        uint32_t c = (uint32_t)(n - done) < vm->chunk ? (uint32_t)(n - done) : vm->chunk;
        bool last = done + (int)c == n;
        int want = all_logits ? 2 : (last && (logits || keep) ? 1 : 0);
        int sel = last && keep ? select : 0;
        uint32_t *params = vm->params.map;
        params[0] = (uint32_t)(pos0 + done);
        params[1] = 0; /* not a batched decode */
        memcpy(params + 4, tokens + done, c * sizeof *tokens);
        VkCommandBuffer cb;
        if (c == 1 && want == 1) {
            if (!s->decode_recorded || s->decode_select != sel) {
                st = kvg_vk_record(vm, s, s->cb_decode, false, 1, 0, 1, sel, err);
                s->decode_recorded = st == KVGEN_OK;
                s->decode_select = sel;
            }
            cb = s->cb_decode;
        } else {
            st = kvg_vk_check(vkResetCommandBuffer(s->cb_step, 0), err, "vkResetCommandBuffer");
            if (st == KVGEN_OK) st = kvg_vk_record(vm, s, s->cb_step, true, c, (uint32_t)(pos0 + done) + c, want, sel, err);
            cb = s->cb_step;
        }
        if (st == KVGEN_OK) st = kvg_vk_submit_wait(ctx, cb, s->fence, err);
        if (st == KVGEN_OK && (vm->prof_prefill ? c > 1 : c == 1)) kvg_vk_prof_collect(vm);
        if (st == KVGEN_OK && want == 2)
            memcpy(logits + (size_t)done * (size_t)V, vm->logits.map, (size_t)c * (size_t)V * sizeof(float));
        else if (st == KVGEN_OK && want == 1 && !keep)
            memcpy(logits, vm->logits.map, (size_t)V * sizeof(float));
        if (st == KVGEN_OK && last && keep) {
            vm->logits_owner = s;
            if (sel) s->sel_n = kvg_vk_select_read(&vm->sel, sel == 1 ? 1 : KVG_VK_TOPK, s->sel_ids, s->sel_vals);
        }
        done += (int)c;
    }
    return st;
}

static kvgen_status check_step(const vk_model *vm, const kvg_backend_session *s, const int32_t *tokens, int n,
                               int pos0, kvgen_error *err) {
    const int V = vm->hp.n_vocab;
    if (n <= 0 || pos0 < 0 || n > s->n_ctx - pos0)
        return kvg_fail(err, KVGEN_E_CONTEXT_FULL, "vulkan: %d tokens at position %d exceed the context of %d", n,
                        pos0, s->n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: token %d: id %d is outside the vocabulary [0, %d)",
                            i, (int)tokens[i], V);
    return KVGEN_OK;
}

static kvgen_status vk_forward(kvgen_model *m, kvg_backend_session *s, const int32_t *tokens, int n, int pos0,
                               float *logits, bool all_logits, kvgen_error *err) {
    vk_model *vm = m->backend;
    if (vm->paged) return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: contiguous forward on a paged model");
    kvgen_status st = check_step(vm, s, tokens, n, pos0, err);
    if (st != KVGEN_OK) return st;
    pthread_mutex_lock(&vm->ctx->lock);
    st = run_steps(vm, s, tokens, n, pos0, logits, all_logits, false, 0, err);
    pthread_mutex_unlock(&vm->ctx->lock);
    return st;
}

static kvgen_status forward_paged(kvgen_model *m, kvg_backend_session *s, const int32_t *pages,
                                  const int32_t *tokens, int n, int pos0, float *logits, bool all_logits, bool keep,
                                  int select, kvgen_error *err) {
    vk_model *vm = m->backend;
    if (!vm->paged) return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: paged forward on a contiguous model");
    kvgen_status st = check_step(vm, s, tokens, n, pos0, err);
    if (st != KVGEN_OK) return st;
    size_t n_entries = ((size_t)pos0 + (size_t)n + (size_t)vm->page_size - 1) / (size_t)vm->page_size;
    st = kvg_vk_check_pages(vm, pages, n_entries, err);
    if (st != KVGEN_OK) return st;
    pthread_mutex_lock(&vm->ctx->lock);
    /* the table in a buffer the sets name once: a step only rewrites its entries */
    memcpy(s->ptab.map, pages, n_entries * sizeof *pages);
    st = kvg_vk_refresh_sets(vm, s, err);
    if (st == KVGEN_OK) st = run_steps(vm, s, tokens, n, pos0, logits, all_logits, keep, select, err);
    pthread_mutex_unlock(&vm->ctx->lock);
    return st;
}

static kvgen_status vk_forward_paged(kvgen_model *m, kvg_backend_session *s, const int32_t *pages,
                                     const int32_t *tokens, int n, int pos0, float *logits, bool all_logits,
                                     kvgen_error *err) {
    return forward_paged(m, s, pages, tokens, n, pos0, logits, all_logits, false, 0, err);
}

/* ---- batched decode (kvg_model.h, forward_batch) ---- */

/* Makes vm->bat cover contexts of n_ctx positions (caller holds bat_mu, not ctx->lock): a new
 * one only when a session with a longer context than any batched before joins a batch. */
static kvgen_status batch_session(kvgen_model *m, int n_ctx, kvgen_error *err) {
    vk_model *vm = m->backend;
    if (vm->bat && vm->bat->n_ctx >= n_ctx) return KVGEN_OK;
    vk_session_free(m, vm->bat);
    vm->bat = NULL;
    kvgen_status st = session_create(m, n_ctx, true, &vm->bat, err);
    if (st == KVGEN_OK) vm->bat_entries = (uint32_t)((n_ctx + vm->page_size - 1) / vm->page_size);
    return st;
}

/* One step of n <= BATCH_MAX tokens of different sessions (caller holds ctx->lock, arguments
 * checked): column i is tokens[i] at pos[i] of the session with table pages[i]. */
static kvgen_status batch_step(vk_model *vm, kvg_backend_session *const *s, const int32_t *const *pages,
                               const int32_t *tokens, const int *pos, int n, float *logits, kvgen_error *err) {
    kvg_backend_session *b = vm->bat;
    uint32_t *params = vm->params.map;
    int32_t *tab = b->ptab.map;
    params[0] = 0;
    params[1] = BATCH_AT;
    for (int i = 0; i < n; i++) {
        uint32_t base = (uint32_t)i * vm->bat_entries;
        memcpy(tab + base, pages[i], ((size_t)pos[i] / (size_t)vm->page_size + 1) * sizeof *tab);
        params[4 + i] = (uint32_t)tokens[i];
        params[4 + BATCH_AT + 2 * i] = (uint32_t)pos[i];
        params[4 + BATCH_AT + 2 * i + 1] = base;
        s[i]->sel_n = 0; /* what they kept is stale once they run again */
        s[i]->saved_valid = false;
        if (vm->logits_owner == s[i]) vm->logits_owner = NULL;
    }
    kvgen_status st = KVGEN_OK;
    /* params carry everything that changes from step to step: same width, same commands */
    if (!b->decode_recorded || b->decode_ncols != (uint32_t)n) {
        st = kvg_vk_record(vm, b, b->cb_decode, false, (uint32_t)n, 0, 2, 0, err);
        b->decode_recorded = st == KVGEN_OK;
        b->decode_ncols = (uint32_t)n;
    }
    if (st == KVGEN_OK) st = kvg_vk_submit_wait(vm->ctx, b->cb_decode, b->fence, err);
    if (st == KVGEN_OK) memcpy(logits, vm->logits.map, (size_t)n * (size_t)vm->hp.n_vocab * sizeof(float));
    return st;
}

/* Up to BATCH_MAX sessions' tokens per step (fewer when the scratch holds fewer columns). A
 * contiguous model's caches are one buffer per session, which one dispatch cannot index:
 * there the tokens run one by one. */
static kvgen_status vk_forward_batch(kvgen_model *m, kvg_backend_session *const *s, const int32_t *const *pages,
                                     const int32_t *tokens, const int *pos, int n, float *logits, kvgen_error *err) {
    vk_model *vm = m->backend;
    size_t V = (size_t)vm->hp.n_vocab;
    kvgen_status st = KVGEN_OK;
    if (!vm->paged) {
        for (int i = 0; i < n && st == KVGEN_OK; i++)
            st = vk_forward(m, s[i], &tokens[i], 1, pos[i], logits + (size_t)i * V, false, err);
        return st;
    }
    int n_ctx = 1;
    for (int i = 0; i < n && st == KVGEN_OK; i++) {
        if (!pages[i]) return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: batch token %d has no page table", i);
        st = check_step(vm, s[i], &tokens[i], 1, pos[i], err);
        if (st == KVGEN_OK) st = kvg_vk_check_pages(vm, pages[i], (size_t)pos[i] / (size_t)vm->page_size + 1, err);
        if (s[i]->n_ctx > n_ctx) n_ctx = s[i]->n_ctx;
    }
    if (st != KVGEN_OK) return st;
    int group = vm->chunk < BATCH_MAX ? (int)vm->chunk : BATCH_MAX;
    pthread_mutex_lock(&vm->bat_mu);
    st = batch_session(m, n_ctx, err);
    if (st == KVGEN_OK) {
        pthread_mutex_lock(&vm->ctx->lock);
        set_aside_logits(vm, vm->bat);
        st = kvg_vk_refresh_sets(vm, vm->bat, err);
        for (int done = 0; done < n && st == KVGEN_OK; done += group) {
            int k = n - done < group ? n - done : group;
            st = batch_step(vm, s + done, pages + done, tokens + done, pos + done, k, logits + (size_t)done * V, err);
        }
        pthread_mutex_unlock(&vm->ctx->lock);
    }
    pthread_mutex_unlock(&vm->bat_mu);
    return st;
}

/* ---- logits kept on the device (kvg_model.h, forward_keep) ---- */

static kvgen_status vk_forward_keep(kvgen_model *m, kvg_backend_session *s, const int32_t *pages,
                                    const int32_t *tokens, int n, int pos0, int select_k, kvgen_error *err) {
    vk_model *vm = m->backend;
    if (select_k < 0 || select_k > KVG_VK_TOPK)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: a selection of %d logits (at most %d)", select_k,
                        KVG_VK_TOPK);
    if (pages) return forward_paged(m, s, pages, tokens, n, pos0, NULL, false, true, select_k, err);
    if (vm->paged) return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: contiguous forward on a paged model");
    kvgen_status st = check_step(vm, s, tokens, n, pos0, err);
    if (st != KVGEN_OK) return st;
    pthread_mutex_lock(&vm->ctx->lock);
    st = run_steps(vm, s, tokens, n, pos0, NULL, false, true, select_k, err);
    pthread_mutex_unlock(&vm->ctx->lock);
    return st;
}

static kvgen_status vk_fetch_logits(kvgen_model *m, kvg_backend_session *s, float *out, kvgen_error *err) {
    vk_model *vm = m->backend;
    size_t bytes = (size_t)vm->hp.n_vocab * sizeof(float);
    kvgen_status st = KVGEN_OK;
    pthread_mutex_lock(&vm->ctx->lock);
    if (vm->logits_owner == s) memcpy(out, vm->logits.map, bytes);
    else if (s->saved_valid) memcpy(out, s->saved, bytes);
    else st = kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: the session has no logits kept on the device");
    pthread_mutex_unlock(&vm->ctx->lock);
    return st;
}

static kvgen_status vk_topk(kvgen_model *m, kvg_backend_session *s, int k, int32_t *ids, float *vals,
                            kvgen_error *err) {
    (void)m;
    if (k <= 0 || k > s->sel_n)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: %d best logits asked for, %d were selected", k,
                        s->sel_n);
    memcpy(ids, s->sel_ids, (size_t)k * sizeof *ids);
    if (vals) memcpy(vals, s->sel_vals, (size_t)k * sizeof *vals);
    return KVGEN_OK;
}

/* The pool's layout (vk_kv.c), then every pipeline a step over it uses and kv_copy's. */
static kvgen_status vk_kv_pages_init(kvgen_model *m, int page_size, int32_t n_pages, kvgen_error *err) {
    vk_model *vm = m->backend;
    kvg_vk_ctx *ctx = vm->ctx;
    kvgen_status st = kvg_vk_kv_pool_init(m, page_size, n_pages, err);
    if (st == KVGEN_OK) {
        walk pw = {.mode = WALK_PIPELINES, .vm = vm, .n = 1, .logits = 2, .err = err};
        st = kvg_vk_walk_step(&pw);
    }
    if (st == KVGEN_OK) {
        uint32_t spec[KVG_SPEC_COUNT];
        spec_init(spec);
        kvg_vk_kv_spec(vm, spec);
        VkPipeline p;
        st = kvg_vk_pipeline_get(ctx, "kv_copy", spec, &p, err);
    }
    if (st == KVGEN_OK) kvg_vk_pcache_save(ctx); /* the end of a paged load: every pipeline exists now */
    return st;
}

const kvg_backend_ops kvg_vulkan_backend = {
    .name = "vulkan",
    /* the plain llama pass (adjacent-pair RoPE in the QKV epilogue, SwiGLU, no biases or extra
     * norms); Q and the attention output have their own stride (ld_q), so heads x head_dim may
     * differ from n_embd */
    .features = KVG_F_WIDE_HEADS,
    .weight_types = kvg_vk_weight_types,
    .model_init = vk_model_init,
    .model_free = vk_model_free,
    .session_init = vk_session_init,
    .session_free = vk_session_free,
    .forward = vk_forward,
    .read_cache = kvg_vk_read_cache,
    .cache_bytes_per_token = kvg_vk_cache_bytes_per_token,
    .kv_default_pool_bytes = kvg_vk_default_pool_bytes,
    .kv_pages_init = vk_kv_pages_init,
    .kv_page_commit = kvg_vk_kv_page_commit,
    .forward_paged = vk_forward_paged,
    .kv_copy = kvg_vk_kv_copy,
    .kv_read = kvg_vk_kv_read,
    .kv_write = kvg_vk_kv_write,
    .forward_batch = vk_forward_batch,
    .forward_keep = vk_forward_keep,
    .fetch_logits = vk_fetch_logits,
    .topk = vk_topk,
};
