/* vk_backend.c: the llama forward pass as Vulkan compute shaders (kvg_vulkan_backend).
 *
 * Load: every weight matrix is repacked as its type's row of the weight-type table says (a
 * quant region and a scale region per part; kvg_vk.h, shaders/weights.glsl) and uploaded once;
 * Q/K/V are concatenated into one matrix and gate/up interleaved row by row so
 * one dispatch computes each group; a matrix bigger than maxStorageBufferRange is split into
 * row parts, one binding and one dispatch each. Pipelines are all created at load.
 *
 * A step (a prefill chunk of up to `chunk` tokens, or one decode token) is one command buffer:
 *   embed -> per layer [QKV (+RMSNorm, biases, RoPE, K/V cache write; -> head norms) ->
 *   attention (-> split reduce) -> Wo (+residual; or -> post norm + residual) -> gate/up
 *   (+RMSNorm, SwiGLU/GeGLU) -> down (as Wo)] -> logits (+final norm, soft-cap)
 * Per-step values (position, token ids) live in a small host-visible buffer, so the decode
 * command buffer of a session is recorded once and replayed; descriptor sets are written when
 * the session is created. Nothing is allocated on the per-token path.
 *
 * Files: vk_backend.c (this one) model and session set-up, the environment knobs, running steps
 * and the forward entry points, the ops table; below it vk_encode.c (an encoder's forward pass,
 * the `encode` op: its own op list over the same mat-muls), vk_walk.c (the step walker: the op list
 * of one step), vk_lora.c (LoRA adapters: device copies, their dispatches), vk_kv.c (KV layout,
 * paged pool, kv_copy), vk_weights.c (weight-type table, repack, upload), vk_hooks.c (test
 * hooks), all on vk_device.c; shared structs in kvg_vk_backend.h.
 *
 * The architecture's facts come from the model description (kvg_weights, kvg_layer), never
 * its name, and become data of the one step walk: the FFN epilogue follows the activation
 * (SwiGLU, GeGLU); a layer's biases, Q/K head norms and post norms are buffers whose presence
 * adds their epilogue flag or op (vk_layer); NEOX RoPE is a permutation of each Q/K head's rows
 * at upload (vk_model.neox), so every kernel rotates adjacent pairs; each distinct (RoPE base,
 * scale) of the layers has its cos/sin tables (rope_freqs divided in); soft-capping and sliding
 * windows are push constants of the attention kernels and the logits' epilogue; the embedding
 * scale is embed.comp's. model_init still refuses a model needing a feature missing from
 * `.features` below (kvg_arch_check_backend).
 *
 * forward (one op over a batch, kvg_model.h) runs a sequence of several tokens as steps of its
 * own session, and one-token sequences of different sessions up to vm->batch_cols (64, fewer
 * where the scratch or the device's binding range holds fewer) at a time as the columns of one
 * step, whose products read each weight once per 32 columns (the GEMM, prefill's path, past 8
 * columns on a GPU; the cooperative mat-vec up to 8) or once per 8 columns (the lane mat-vec's
 * groups, a CPU device), all in one submission: params give
 * every column its own position and page table (shaders/common.glsl, kvg_pos/kvg_tab), the
 * tables concatenated in the model's batch session (vm->bat), whose sets and recorded command
 * buffer are reused from step to step. A column that keeps its logits gets its argmax or top-k
 * selected on the device in the same submission (one selection row per column), so a batch
 * reads back a few ids per session instead of n x n_vocab floats.
 *
 * Kept logits: row r of vm->logits holds the logits session row_owner[r] kept; before a step
 * overwrites rows, the owners that are not in it get theirs copied to their own memory.
 * The logits live in device memory, where the logits product writes and the selection reads
 * them at the device's speed; the host reads rows straight from a mapping where the memory is
 * host-visible (lavapipe, integrated GPUs), else through a copy into a host buffer
 * (read_logits), so only what a sampler needs crosses the bus.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_quant.h"
#include "kvg_vk_backend.h"

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
            char line[512];
            int len = snprintf(line, sizeof line, "vulkan profile over %d steps (ms per step):", vm->prof_steps);
            for (int i = 0; i < 7 && len > 0 && (size_t)len < sizeof line; i++)
                len += snprintf(line + len, sizeof line - (size_t)len, " %s %.2f", prof_names[i],
                                vm->prof_ms[i] / (vm->prof_steps ? vm->prof_steps : 1));
            kvg_log(KVGEN_LOG_INFO, "%s", line);
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
                kvg_vk_buffer *opt[] = {&L->bias, &L->qk_norm, &L->attn_post, &L->ffn_post};
                for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++) kvg_vk_buffer_destroy(ctx, opt[i]);
            }
        for (int j = 0; j < KVG_VK_KV_SLABS; j++) kvg_vk_buffer_destroy(ctx, &vm->slabs[j]);
        for (int v = 0; v < VK_ROPE_VARIANTS; v++)
            for (int k = 0; k < VK_ROPE_SIZES; k++) kvg_vk_buffer_destroy(ctx, &vm->ropes[v][k]);
        if (vm->ops_pool) vkDestroyDescriptorPool(ctx->dev, vm->ops_pool, NULL);
        if (vm->ops_cb) vkFreeCommandBuffers(ctx->dev, ctx->cmd_pool, 1, &vm->ops_cb);
        kvg_vk_select_free(ctx, &vm->sel);
        kvg_vk_lora_free(vm);
        kvg_vk_encoder_free(vm);
        kvg_vk_mirror_destroy(ctx, &vm->params);
        kvg_vk_buffer *scratch[] = {&vm->x, &vm->q, &vm->att, &vm->h, &vm->logits, &vm->ops,
                                    &vm->qk, &vm->f, &vm->logits_host};
        for (size_t i = 0; i < sizeof scratch / sizeof scratch[0]; i++) kvg_vk_buffer_destroy(ctx, scratch[i]);
        kvg_vk_ctx_destroy(ctx);
    }
    if (vm->rope_mu_init) kvg_mutex_destroy(&vm->rope_mu);
    if (vm->bat_mu_init) kvg_mutex_destroy(&vm->bat_mu);
    kvg_free(vm->layers);
    kvg_free(vm->rope_factors);
    kvg_free(vm);
    m->backend = NULL;
}

/* ---- the model's optional parts (kvg_layer) ---- */

/* t with its rows permuted per head of hd rows (kvg_vk_neox_src) into a copy (*buf, the caller frees) */
static kvgen_status neox_rows(const kvg_tensor *t, uint32_t hd, uint32_t n_rot, kvg_tensor *out, void **buf,
                              kvgen_error *err) {
    size_t rb = kvg_row_bytes(t->type, t->ne[0]);
    uint64_t rows = t->n_elements / t->ne[0];
    uint8_t *d = kvg_malloc((size_t)rows * rb);
    *buf = d;
    if (!d) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory permuting %s", t->name);
    for (uint64_t r = 0; r < rows; r++)
        memcpy(d + r * rb, (const uint8_t *)t->data + ((r / hd) * hd + kvg_vk_neox_src((uint32_t)(r % hd), n_rot)) * rb,
               rb);
    *out = *t;
    out->data = d;
    return KVGEN_OK;
}

/* n floats of a small tensor into dst (ones: `fill` when t is NULL), permuted per head of hd
 * when hd > 0 (a NEOX model's Q/K bias or head norm) */
static void small_f32(const kvg_tensor *t, float *dst, size_t n, float fill, uint32_t hd, uint32_t n_rot) {
    if (!t) {
        for (size_t i = 0; i < n; i++) dst[i] = fill;
        return;
    }
    kvg_dequantize_row(t->type, t->data, dst, n);
    if (!hd) return;
    float head[256];
    for (size_t h = 0; h + hd <= n; h += hd) {
        memcpy(head, dst + h, hd * sizeof *head);
        for (uint32_t j = 0; j < hd; j++) dst[h + j] = head[kvg_vk_neox_src(j, n_rot)];
    }
}

static kvgen_status upload_f32(vk_model *vm, const float *v, size_t n, kvg_vk_buffer *out, kvgen_error *err) {
    kvgen_status st = kvg_vk_buffer_create(vm->ctx, n * sizeof *v, KVG_VK_MEM_UPLOAD, out, err);
    if (st == KVGEN_OK) st = kvg_vk_upload(vm->ctx, out, 0, v, n * sizeof *v, err);
    return st;
}

/* A layer's QKV matrix (a NEOX model's Q and K rows permuted), its biases, head norms and post
 * norms, its RoPE variant and window. */
static kvgen_status upload_attention(kvgen_model *m, int l, kvgen_error *err) {
    vk_model *vm = m->backend;
    const kvg_hparams *hp = &vm->hp;
    const kvg_layer *src = &m->w.layers[l];
    vk_layer *L = &vm->layers[l];
    uint32_t hd = (uint32_t)hp->head_dim, n_rot = (uint32_t)hp->n_rot, ph = vm->neox ? hd : 0;
    size_t nq = (size_t)hp->n_head * hd, nk = (size_t)hp->n_head_kv * hd;
    kvg_tensor pq, pk;
    void *bq = NULL, *bk = NULL;
    const kvg_tensor *qkv[3] = {src->wq, src->wk, src->wv};
    kvgen_status st = KVGEN_OK;
    if (vm->neox) {
        st = neox_rows(src->wq, hd, n_rot, &pq, &bq, err);
        if (st == KVGEN_OK) st = neox_rows(src->wk, hd, n_rot, &pk, &bk, err);
        qkv[0] = &pq;
        qkv[1] = &pk;
    }
    char what[48];
    snprintf(what, sizeof what, "blk.%d.attn_qkv", l);
    if (st == KVGEN_OK) st = kvg_vk_upload_matrix(vm, what, qkv, 3, false, &L->qkv, err);
    kvg_free(bq);
    kvg_free(bk);
    float *tmp = st == KVGEN_OK ? kvg_malloc((nq + 2 * nk + 2 * hd) * sizeof *tmp) : NULL;
    if (st == KVGEN_OK && !tmp) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    if (st == KVGEN_OK && (src->bq || src->bk || src->bv)) {
        small_f32(src->bq, tmp, nq, 0.0f, ph, n_rot);
        small_f32(src->bk, tmp + nq, nk, 0.0f, ph, n_rot);
        small_f32(src->bv, tmp + nq + nk, nk, 0.0f, 0, n_rot);
        st = upload_f32(vm, tmp, nq + 2 * nk, &L->bias, err);
    }
    if (st == KVGEN_OK && (src->q_norm || src->k_norm)) {
        small_f32(src->q_norm, tmp, hd, 1.0f, ph, n_rot);
        small_f32(src->k_norm, tmp + hd, hd, 1.0f, ph, n_rot);
        L->qk_flags = (src->q_norm ? 1u : 0u) | (src->k_norm ? 2u : 0u);
        st = upload_f32(vm, tmp, 2 * hd, &L->qk_norm, err);
    }
    kvg_free(tmp);
    if (st == KVGEN_OK && src->attn_post_norm) st = kvg_vk_upload_norm(vm, src->attn_post_norm, &L->attn_post, err);
    if (st == KVGEN_OK && src->ffn_post_norm) st = kvg_vk_upload_norm(vm, src->ffn_post_norm, &L->ffn_post, err);
    if (st != KVGEN_OK) return st;
    L->window = src->swa ? (uint32_t)hp->n_swa : 0;
    float base = src->rope_base > 0.0f ? src->rope_base : hp->rope_freq_base;
    float scale = src->rope_scale > 0.0f ? src->rope_scale : 1.0f;
    int v = 0;
    while (v < vm->n_rope && !(vm->rope_base[v] == base && vm->rope_scale[v] == scale)) v++;
    if (v == vm->n_rope) {
        if (v == VK_ROPE_VARIANTS)
            return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: more than %d distinct RoPE bases and scales over the "
                            "layers", VK_ROPE_VARIANTS);
        vm->rope_base[v] = base;
        vm->rope_scale[v] = scale;
        vm->n_rope++;
    }
    L->rope = v;
    return KVGEN_OK;
}

/* the bytes of a layer's matrices as the file holds them (what the upload stage counts) */
static uint64_t layer_matrix_bytes(const kvg_layer *l) {
    return (uint64_t)l->wq->nbytes + l->wk->nbytes + l->wv->nbytes + l->wo->nbytes + l->w_gate->nbytes +
           l->w_up->nbytes + l->w_down->nbytes;
}

/* Tokens per prefill step: 512 on a GPU, where a step's GEMMs read each weight once for all of
 * its tokens and fewer, larger submissions keep the device busy; 128 on a CPU device (lavapipe),
 * whose cores a step of 128 already fills. Halved while the step's logits (tokens x n_vocab
 * floats, one binding) pass maxStorageBufferRange or its scratch (logits and activations) would
 * take more than a sixteenth of the largest device-local heap. KVGEN_VK_CHUNK sets it (tests:
 * small steps, or a GPU's on lavapipe), within the same bounds. */
static uint32_t prefill_chunk(const vk_model *vm) {
    const kvg_vk_ctx *ctx = vm->ctx;
    uint32_t chunk = ctx->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 128 : 512;
    const char *env = getenv("KVGEN_VK_CHUNK");
    if (env && atoi(env) > 0) chunk = (uint32_t)atoi(env);
    uint64_t logits = (uint64_t)vm->hp.n_vocab * 4, range = ctx->props.limits.maxStorageBufferRange;
    uint64_t per_token = logits + 4 * (3 * (uint64_t)vm->ld_x + 3 * (uint64_t)vm->ld_q + vm->ld_h);
    uint64_t budget = ctx->info.device_local_bytes / 16;
    while (chunk > 1 && (chunk * logits > range || (budget && chunk * per_token > budget))) chunk /= 2;
    return chunk;
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
    vk_model *vm = kvg_calloc(1, sizeof *vm);
    if (!vm) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    m->backend = vm;
    vm->hp = *hp;
    /* the step's ops from the description: only what kvg_arch_check_backend let through */
    switch (m->w.act) {
    case KVG_ACT_GELU_TANH_GATED:
        vm->ffn_epi = EPI_GEGLU;
        break;
    case KVG_ACT_SILU_GATED:
    default:
        vm->ffn_epi = EPI_SWIGLU;
        break;
    }
    vm->neox = m->w.rope == KVG_ROPE_NEOX;
    /* the block types' bytes per 32 elements (the layouts of quant.c) */
    vm->kv_qtype = m->kv_type == KVG_TYPE_Q8_0 || m->kv_type == KVG_TYPE_Q4_0 ? m->kv_type : 0u;
    vm->kv_block = vm->kv_qtype == KVG_TYPE_Q8_0 ? 34u : vm->kv_qtype == KVG_TYPE_Q4_0 ? 18u : 0u;
    vm->embd_scale = m->w.embd_scale;
    vm->attn_softcap = hp->attn_softcap;
    vm->final_softcap = hp->final_softcap;
    if (m->w.rope_freqs && hp->n_rot >= 2) {
        vm->rope_factors = kvg_malloc((size_t)(hp->n_rot / 2) * sizeof *vm->rope_factors);
        if (!vm->rope_factors) {
            kvg_free(vm);
            m->backend = NULL;
            return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
        }
        kvg_dequantize_row(m->w.rope_freqs->type, m->w.rope_freqs->data, vm->rope_factors, (uint64_t)(hp->n_rot / 2));
    }
    kvg_mutex_init(&vm->rope_mu);
    vm->rope_mu_init = true;
    kvg_mutex_init(&vm->bat_mu);
    vm->bat_mu_init = true;
    kvg_vk_ctx_desc cd = {.device = desc->device,
                          .force_f32 = desc->force_f32,
                          .vk_instance = desc->vk_instance,
                          .vk_physical_device = desc->vk_physical_device,
                          .vk_device = desc->vk_device,
                          .vk_queue = desc->vk_queue,
                          .vk_queue_family = desc->vk_queue_family,
                          .vk_get_instance_proc_addr = desc->vk_get_instance_proc_addr,
                          .pipeline_cache_path = desc->pipeline_cache_path};
    kvgen_status st = kvg_vk_ctx_create(&cd, &vm->ctx, err);
    if (st != KVGEN_OK) goto fail;
    kvg_vk_ctx *ctx = vm->ctx;
    snprintf(m->device_name, sizeof m->device_name, "%s", ctx->info.name);

    /* a CPU device runs a workgroup on one core: no cooperation inside workgroups there */
    vm->mv_lane = ctx->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    vm->mv_rows = 4;
    vm->lane_rows = 8;
    vm->lane_ubo = true;
    if (getenv("KVGEN_VK_LANE")) vm->mv_lane = atoi(getenv("KVGEN_VK_LANE")) != 0;
    if (getenv("KVGEN_VK_ROWS")) vm->mv_rows = (uint32_t)atoi(getenv("KVGEN_VK_ROWS"));
    if (getenv("KVGEN_VK_LANE_ROWS")) vm->lane_rows = (uint32_t)atoi(getenv("KVGEN_VK_LANE_ROWS")) & ~1u;
    if (vm->lane_rows < 2) vm->lane_rows = 2;
    if (getenv("KVGEN_VK_UBO")) vm->lane_ubo = atoi(getenv("KVGEN_VK_UBO")) != 0;
    /* the cooperative mat-vec and attention reduce with subgroup arithmetic where the device
     * offers it in compute shaders; KVGEN_VK_SUBGROUP=0 keeps the shared-memory paths */
    vm->subgroup = ctx->info.subgroup_arithmetic;
    if (getenv("KVGEN_VK_SUBGROUP") && atoi(getenv("KVGEN_VK_SUBGROUP")) == 0) vm->subgroup = false;
    /* with subgroup reductions a mat-vec workgroup is one subgroup: no shared memory, no barrier */
    vm->mv_wg = kvg_vk_matvec_wg(ctx, vm->mv_lane, vm->subgroup);
    if (getenv("KVGEN_VK_WG")) vm->mv_wg = (uint32_t)atoi(getenv("KVGEN_VK_WG"));
    /* 8-bit activations (kvgen_model_desc.activation_bits = 8): the integer types' decode
     * mat-vecs and prefill GEMMs by integer dot products where the device reports them
     * accelerated, on the cooperative layout with subgroup reductions; KVGEN_VK_DOT=1 takes
     * them wherever the device offers them at all (the tests on lavapipe), KVGEN_VK_DOT=0 never */
    vm->act8_dot = desc->activation_bits == 8 && ctx->int_dot && ctx->int_dot_fast;
    if (getenv("KVGEN_VK_DOT"))
        vm->act8_dot = desc->activation_bits == 8 && ctx->int_dot && atoi(getenv("KVGEN_VK_DOT")) != 0;
    if (vm->mv_lane || !vm->subgroup) vm->act8_dot = false;
    /* the prefill GEMM with f16 tiles in double-buffered shared memory on GPUs (half the
     * shared-memory traffic per product, one barrier per block step); a CPU device's prefill runs
     * the lane mat-vec (and KVGEN_VK_LANE=0 there the f32 tiles); KVGEN_VK_HALF=0 keeps the f32
     * tiles, =1 takes the f16 ones anywhere (the tests on lavapipe) */
    vm->gemm_half = ctx->props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU;
    if (getenv("KVGEN_VK_HALF")) vm->gemm_half = atoi(getenv("KVGEN_VK_HALF")) != 0;
    /* the prefill GEMM on the device's matrix units where it offers cooperative matrices (GPUs);
     * KVGEN_VK_COOPMAT=0 keeps the f16 tiles (and leaves the extension off the device), =1
     * takes them on any device that offers them (the tests on Mesa's lavapipe, which emulates
     * them) */
    vm->gemm_coop = ctx->coopmat && ctx->props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU;
    if (getenv("KVGEN_VK_COOPMAT")) vm->gemm_coop = ctx->coopmat && atoi(getenv("KVGEN_VK_COOPMAT")) != 0;
    if (vm->gemm_coop && !kvg_vk_gemm_cm_fits(ctx)) vm->gemm_coop = false; /* four subgroups over the limits */
    if (desc->activation_bits == 8) { /* what the user asked for, and what the device gives */
        const char *got;
        if (vm->act8_dot) got = "integer dot products in the integer types' mat-vecs and GEMMs";
        else if (!ctx->int_dot) got = "f32 activations (the device offers no integer dot products)";
        else if (vm->mv_lane) got = "f32 activations (a CPU device's lane kernels have no integer-dot variant)";
        else if (!vm->subgroup) got = "f32 activations (the integer-dot mat-vec needs subgroup arithmetic)";
        else if (!ctx->int_dot_fast) got = "f32 activations (integer dot products not reported fast; KVGEN_VK_DOT=1)";
        else got = "f32 activations (KVGEN_VK_DOT=0)";
        kvg_log(KVGEN_LOG_INFO, "vulkan: activation_bits 8 on %s: %s", ctx->info.name, got);
    }
    /* attn_lane.comp: splits are its parallelism (8 lanes per workgroup) and cost little when
     * empty (short contexts fill the first ones, >= 32 positions each) */
    vm->attn_lane = vm->mv_lane && hp->head_dim % 8 == 0;
    if (getenv("KVGEN_VK_ATTN_LANE")) vm->attn_lane = atoi(getenv("KVGEN_VK_ATTN_LANE")) != 0 && hp->head_dim % 8 == 0;
    /* splits buy parallelism on a GPU (as many as its compute units want); on a CPU device the
     * KV heads already fill the cores and each split's fixed cost (and the reduce) dominates:
     * split there only for the loop limit */
    vm->nsplit = kvg_vk_attn_splits(ctx, (uint64_t)hp->n_head_kv, 8, 64);
    if (vm->attn_lane) vm->nsplit = 16;
    else if (vm->mv_lane) vm->nsplit = 1;
    if (getenv("KVGEN_VK_NSPLIT")) vm->nsplit = (uint32_t)atoi(getenv("KVGEN_VK_NSPLIT"));
    vm->ld_x = round_up((uint32_t)hp->n_embd, 32);
    vm->ld_q = round_up((uint32_t)(hp->n_head * hp->head_dim), 32);
    vm->ld_h = round_up((uint32_t)hp->n_ff, 32);
    vm->chunk = prefill_chunk(vm);
    /* an encoder: its own weights, scratch and op list (vk_encode.c), no decoder steps */
    if (m->w.arch && m->w.arch->encoder) {
        st = kvg_vk_encoder_init(m, err);
        if (st != KVGEN_OK) goto fail;
        return KVGEN_OK;
    }

    /* weights; the load's KVGEN_LOAD_UPLOAD stage counts the matrices' bytes, one report per
     * layer */
    const kvg_weights *w = &m->w;
    vm->tied = w->tied || w->output == w->tok_embd;
    uint64_t up_total = w->tok_embd->nbytes + (vm->tied ? 0 : w->output->nbytes), up_done = up_total;
    for (int l = 0; l < hp->n_layer; l++) up_total += layer_matrix_bytes(&w->layers[l]);
    st = kvg_vk_upload_matrix(vm, "token_embd", &w->tok_embd, 1, false, &vm->embd, err);
    if (st == KVGEN_OK && !vm->tied) st = kvg_vk_upload_matrix(vm, "output", &w->output, 1, false, &vm->output, err);
    if (st == KVGEN_OK && vm->tied) vm->output = vm->embd;
    if (st == KVGEN_OK) st = kvg_vk_upload_norm(vm, w->output_norm, &vm->out_norm, err);
    if (st == KVGEN_OK) st = kvg_load_progress(m, KVGEN_LOAD_UPLOAD, up_done, up_total, err);
    vm->layers = kvg_calloc((size_t)hp->n_layer, sizeof *vm->layers);
    if (st == KVGEN_OK && !vm->layers) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    for (int l = 0; l < hp->n_layer && st == KVGEN_OK; l++) {
        const kvg_layer *src = &w->layers[l];
        vk_layer *L = &vm->layers[l];
        const kvg_tensor *gu[2] = {src->w_gate, src->w_up};
        char what[48];
        st = upload_attention(m, l, err);
        snprintf(what, sizeof what, "blk.%d.attn_output", l);
        if (st == KVGEN_OK) st = kvg_vk_upload_matrix(vm, what, &src->wo, 1, false, &L->wo, err);
        snprintf(what, sizeof what, "blk.%d.ffn_gate_up", l);
        if (st == KVGEN_OK) st = kvg_vk_upload_matrix(vm, what, gu, 2, true, &L->gateup, err);
        snprintf(what, sizeof what, "blk.%d.ffn_down", l);
        if (st == KVGEN_OK) st = kvg_vk_upload_matrix(vm, what, &src->w_down, 1, false, &L->down, err);
        if (st == KVGEN_OK) st = kvg_vk_upload_norm(vm, src->attn_norm, &L->attn_norm, err);
        if (st == KVGEN_OK) st = kvg_vk_upload_norm(vm, src->ffn_norm, &L->ffn_norm, err);
        up_done += layer_matrix_bytes(src);
        if (st == KVGEN_OK) st = kvg_load_progress(m, KVGEN_LOAD_UPLOAD, up_done, up_total, err);
    }
    if (st != KVGEN_OK) goto fail;
    /* the device holds the matrices now: the file's pages of them leave host memory */
    kvg_gguf_drop_bytes(m->gguf, w->tok_embd->data, w->tok_embd->nbytes);
    if (!vm->tied) kvg_gguf_drop_bytes(m->gguf, w->output->data, w->output->nbytes);
    for (int l = 0; l < hp->n_layer; l++) {
        const kvg_layer *src = &w->layers[l];
        const kvg_tensor *ts[] = {src->wq, src->wk, src->wv, src->wo, src->w_gate, src->w_up, src->w_down};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            if (ts[i]) kvg_gguf_drop_bytes(m->gguf, ts[i]->data, ts[i]->nbytes);
    }

    /* scratch */
    uint32_t C = vm->chunk;
    /* a batched step's columns are tokens of the scratch below (chunk rows each) */
    vm->batch_cols = C < VK_BATCH_MAX ? C : VK_BATCH_MAX;
    /* token ids, or a batched decode's ids and (position, table) pairs from VK_BATCH_AT */
    size_t param_words = VK_BATCH_AT + 2 * (size_t)vm->batch_cols;
    if (param_words < C) param_words = C;
    st = kvg_vk_mirror_create(ctx, 16 + param_words * 4, &vm->params, err);
    /* mat-vec inputs get a uniform window of slack: a window bound at any token stays inside */
    size_t win = ctx->ubo_window;
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)C * vm->ld_x * 4 + win, KVG_VK_MEM_DEVICE, &vm->x, err);
    /* block pages (q8_0, q4_0): the step's raw K|V after its Q (vk_model.kv_raw), for a chunk or
     * a batch (batch_cols <= C) */
    size_t raw = vm->kv_block ? (size_t)C * 2 * (size_t)hp->n_head_kv * (size_t)hp->head_dim : 0;
    vm->kv_raw = C * vm->ld_q;
    if (st == KVGEN_OK)
        st = kvg_vk_buffer_create(ctx, ((size_t)C * vm->ld_q + raw) * 4, KVG_VK_MEM_DEVICE, &vm->q, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)C * vm->ld_q * 4 + win, KVG_VK_MEM_DEVICE, &vm->att, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)C * vm->ld_h * 4 + win, KVG_VK_MEM_DEVICE, &vm->h, err);
    if (st == KVGEN_OK)
        st = kvg_vk_buffer_create(ctx, (size_t)C * (size_t)hp->n_vocab * 4, KVG_VK_MEM_DEVICE, &vm->logits, err);
    if (st == KVGEN_OK && !vm->logits.map)
        st = kvg_vk_buffer_create(ctx, vm->logits.size, KVG_VK_MEM_HOST, &vm->logits_host, err);
    /* the optional ops' scratch: raw Q|K heads for the heads op, a projection's output for a post norm */
    bool any_heads = false, any_post = false;
    for (int l = 0; l < hp->n_layer; l++) {
        any_heads |= vm->layers[l].qk_norm.buf != VK_NULL_HANDLE;
        any_post |= vm->layers[l].attn_post.buf != VK_NULL_HANDLE || vm->layers[l].ffn_post.buf != VK_NULL_HANDLE;
    }
    /* (block pages: V too, which the heads op moves to the raw K|V) */
    vm->ld_qk = round_up((uint32_t)((hp->n_head + (vm->kv_block ? 2 : 1) * hp->n_head_kv) * hp->head_dim), 32);
    if (st == KVGEN_OK && any_heads)
        st = kvg_vk_buffer_create(ctx, (size_t)C * vm->ld_qk * 4, KVG_VK_MEM_DEVICE, &vm->qk, err);
    if (st == KVGEN_OK && any_post)
        st = kvg_vk_buffer_create(ctx, (size_t)C * vm->ld_x * 4, KVG_VK_MEM_DEVICE, &vm->f, err);
    if (st == KVGEN_OK && (!vm->params.host.map || (!vm->logits.map && !vm->logits_host.map)))
        st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: device %s offers no host-visible coherent memory", ctx->info.name);
    if (st == KVGEN_OK)
        st = kvg_vk_select_init(ctx, &vm->logits, (uint32_t)hp->n_vocab, vm->batch_cols, &vm->sel, err);
    if (st != KVGEN_OK) goto fail;

    if (getenv("KVGEN_VK_PROFILE") && atoi(getenv("KVGEN_VK_PROFILE")) > 0) {
        vm->prof_prefill = atoi(getenv("KVGEN_VK_PROFILE")) == 2;
        VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                    .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = 512};
        st = kvg_vk_check(vkCreateQueryPool(ctx->dev, &qi, NULL, &vm->prof_pool), err, "vkCreateQueryPool");
        if (st != KVGEN_OK) goto fail;
    }
    /* every pipeline a step can use depends on the pool's layout: kv_pages_init creates them */
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

/* The shared RoPE table of variant v (vm->rope_base / rope_scale, rope_factors) for at least
 * n_ctx positions, angles in double on the host as the reference computes them. */
static kvgen_status rope_table(vk_model *vm, int v, int n_ctx, const kvg_vk_buffer **out, kvgen_error *err) {
    const kvg_hparams *hp = &vm->hp;
    int k = 0;
    while (k < VK_ROPE_SIZES - 1 && ((size_t)256 << k) < (size_t)n_ctx) k++;
    size_t n_pos = (size_t)256 << k, half = (size_t)(hp->n_rot / 2);
    double base = vm->rope_base[v], scale = vm->rope_scale[v];
    float af = hp->rope_attn_factor > 0.0f ? hp->rope_attn_factor : 1.0f; /* rope.scaling.attn_factor */
    kvgen_status st = KVGEN_OK;
    kvg_mutex_lock(&vm->rope_mu);
    if (!vm->ropes[v][k].buf) {
        size_t n = n_pos * (half ? half : 1) * 2;
        float *cs = kvg_malloc(n * sizeof *cs);
        if (!cs) {
            st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
        } else {
            for (size_t p = 0; p < n_pos; p++)
                for (size_t i = 0; i < half; i++) {
                    double theta = (double)p * scale * pow(base, -2.0 * (double)i / hp->n_rot);
                    if (vm->rope_factors) theta /= (double)vm->rope_factors[i];
                    cs[(p * half + i) * 2] = (float)cos(theta) * af;
                    cs[(p * half + i) * 2 + 1] = (float)sin(theta) * af;
                }
            kvg_vk_buffer b;
            st = kvg_vk_buffer_create(vm->ctx, n * sizeof *cs, KVG_VK_MEM_UPLOAD, &b, err);
            if (st == KVGEN_OK) st = kvg_vk_upload(vm->ctx, &b, 0, cs, n * sizeof *cs, err);
            if (st == KVGEN_OK) vm->ropes[v][k] = b;
            else kvg_vk_buffer_destroy(vm->ctx, &b);
            kvg_free(cs);
        }
    }
    kvg_mutex_unlock(&vm->rope_mu);
    *out = &vm->ropes[v][k];
    return st;
}

static void vk_session_free(kvgen_model *m, kvg_backend_session *s) {
    if (!s) return;
    vk_model *vm = m->backend;
    kvg_vk_ctx *ctx = vm->ctx;
    kvg_vk_lock(ctx);
    vkQueueWaitIdle(ctx->queue);
    for (int r = 0; r < VK_BATCH_MAX; r++)
        if (vm->row_owner[r] == s) vm->row_owner[r] = NULL;
    if (s->cb_decode) vkFreeCommandBuffers(ctx->dev, ctx->cmd_pool, 1, &s->cb_decode);
    if (s->cb_step) vkFreeCommandBuffers(ctx->dev, ctx->cmd_pool, 1, &s->cb_step);
    kvg_vk_unlock(ctx);
    if (s->fence) vkDestroyFence(ctx->dev, s->fence, NULL);
    if (s->pool) vkDestroyDescriptorPool(ctx->dev, s->pool, NULL);
    kvg_vk_buffer_destroy(ctx, &s->part);
    kvg_vk_mirror_destroy(ctx, &s->ptab);
    kvg_free(s->sets);
    kvg_free(s->saved);
    kvg_free(s);
}

/* batch: the model's batch session (vm->bat): page tables and decode partials for n_cols
 * columns (vm->batch_cols, fewer where either would pass what one binding covers:
 * kvg_vk_max_part_bytes, maxStorageBufferRange and maxMemoryAllocationSize) */
static kvgen_status session_create(kvgen_model *m, int n_ctx, bool batch, kvg_backend_session **out,
                                   kvgen_error *err) {
    *out = NULL;
    vk_model *vm = m->backend;
    kvg_vk_ctx *ctx = vm->ctx;
    const kvg_hparams *hp = &vm->hp;
    if (n_ctx <= 0 || n_ctx > (256 << 12))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: session n_ctx %d is outside [1, %d]", n_ctx, 256 << 12);
    if (!vm->page_size)
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: a session before the model's page pool");
    kvg_backend_session *s = kvg_calloc(1, sizeof *s);
    if (!s) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    s->n_ctx = n_ctx;
    kvgen_status st = KVGEN_OK;
    s->saved = kvg_malloc((size_t)hp->n_vocab * sizeof *s->saved);
    if (!s->saved) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    uint32_t split_min = kvg_vk_attn_loop_splits((uint64_t)n_ctx);
    s->nsplit_dec = vm->nsplit > split_min ? vm->nsplit : split_min;
    /* partials: a decode's nsplit_dec splits per column or a prefill chunk's split_min per
     * token; tables: one per column and layer group, the local ones (if any) after the global
     * ones. A batch session holds as many columns as one binding of each can. */
    size_t row_bytes = (size_t)hp->n_head * (size_t)(hp->head_dim + 2) * 4;
    size_t col_rows = (size_t)s->nsplit_dec, range = kvg_vk_max_part_bytes(ctx);
    size_t col_entries = ((size_t)n_ctx + (size_t)vm->page_size - 1) / (size_t)vm->page_size;
    size_t groups = vm->kv_groups > 1 ? 2 : 1;
    s->n_cols = 1;
    if (batch) {
        size_t fit = range / (col_rows * row_bytes), fit_tab = range / (col_entries * 4 * groups);
        if (fit_tab < fit) fit = fit_tab;
        s->n_cols = fit < vm->batch_cols ? (uint32_t)fit : vm->batch_cols;
        if (s->n_cols < 1) s->n_cols = 1;
    }
    size_t dec_rows = col_rows * s->n_cols;
    size_t part_rows = (size_t)vm->chunk * split_min > dec_rows ? (size_t)vm->chunk * split_min : dec_rows;
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, part_rows * row_bytes, KVG_VK_MEM_DEVICE, &s->part, err);
    size_t entries = col_entries * s->n_cols;
    s->tab1 = (uint32_t)entries;
    if (st == KVGEN_OK) st = kvg_vk_mirror_create(ctx, entries * 4 * groups, &s->ptab, err);
    for (int v = 0; v < vm->n_rope && st == KVGEN_OK; v++) st = rope_table(vm, v, n_ctx, &s->rope[v], err);
    if (st == KVGEN_OK) {
        walk sw = {.vm = vm, .s = s, .n = 1, .logits = 2, .err = err};
        st = kvg_vk_walk_sets(&sw, kvg_vk_walk_step);
    }
    if (st == KVGEN_OK) {
        VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        st = kvg_vk_check(vkCreateFence(ctx->dev, &fci, NULL, &s->fence), err, "vkCreateFence");
    }
    if (st == KVGEN_OK) {
        kvg_vk_lock(ctx);
        st = kvg_vk_cmd_alloc(ctx, &s->cb_decode, err);
        if (st == KVGEN_OK) st = kvg_vk_cmd_alloc(ctx, &s->cb_step, err);
        kvg_vk_unlock(ctx);
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

/* bytes at off of vm->logits into dst (caller holds ctx->lock): from the mapping, or copied on
 * the device into logits_host first. */
static kvgen_status read_out(vk_model *vm, size_t off, size_t bytes, float *dst, kvgen_error *err) {
    const kvg_vk_buffer *from = &vm->logits;
    if (!from->map) {
        kvgen_status st = kvg_vk_copy(vm->ctx, &vm->logits, &vm->logits_host, off, bytes, err);
        if (st != KVGEN_OK) return st;
        from = &vm->logits_host;
    }
    memcpy(dst, (const char *)from->map + off, bytes);
    return KVGEN_OK;
}

/* Rows [row0, row0 + rows) of vm->logits into dst (caller holds ctx->lock) */
static kvgen_status read_logits(vk_model *vm, uint32_t row0, uint32_t rows, float *dst, kvgen_error *err) {
    size_t row_bytes = (size_t)vm->hp.n_vocab * sizeof(float);
    return read_out(vm, row0 * row_bytes, rows * row_bytes, dst, err);
}

/* Before a step overwrites rows [0, rows) of vm->logits: the kept logits of an owner that is
 * not among the step's sessions run[0..n_run) go to its own memory (caller holds ctx->lock);
 * the running sessions' own kept logits and selections are stale from now on. A failed read
 * leaves that owner without kept logits (its next read of them fails by name). */
static kvgen_status set_aside_logits(vk_model *vm, uint32_t rows, kvg_backend_session *const *run, int n_run,
                                     kvgen_error *err) {
    kvgen_status st = KVGEN_OK;
    for (int i = 0; i < n_run; i++) {
        run[i]->sel_n = 0;
        run[i]->saved_valid = false;
    }
    for (uint32_t r = 0; r < rows && r < VK_BATCH_MAX; r++) {
        kvg_backend_session *o = vm->row_owner[r];
        vm->row_owner[r] = NULL;
        bool running = false;
        for (int i = 0; i < n_run; i++) running |= run[i] == o;
        if (!o || running) continue;
        kvgen_status rs = read_logits(vm, r, 1, o->saved, err);
        o->saved_valid = rs == KVGEN_OK;
        if (st == KVGEN_OK) st = rs;
    }
    return st;
}

/* Runs the step(s) of one sequence, n tokens at pos0 (caller holds ctx->lock, arguments and
 * table checked). out as the sequence's: KEEP leaves the last token's logits in row 0 with
 * the best one (select 1) or KVG_VK_TOPK (select > 1) selected in the same submission; HIDDEN
 * writes every token's final-normed state (n_embd floats) to logits instead, through the logits
 * buffer (steps of as many tokens as its chunk x n_vocab floats hold). */
static kvgen_status run_steps(vk_model *vm, kvg_backend_session *s, const int32_t *tokens, int n, int pos0,
                              kvg_batch_out out, float *logits, int select, const kvg_lora_set *lora,
                              kvgen_error *err) {
    kvg_vk_ctx *ctx = vm->ctx;
    const int V = vm->hp.n_vocab;
    bool keep = out == KVG_OUT_KEEP;
    kvgen_status st = set_aside_logits(vm, out == KVG_OUT_NONE ? 0 : vm->chunk, &s, 1, err);
    if (select > 1) select = 2;
    if (!keep) select = 0;
    const size_t E = (size_t)vm->hp.n_embd;
    uint32_t step = vm->chunk;
    if (out == KVG_OUT_HIDDEN && (size_t)step * E > (size_t)vm->chunk * (size_t)V)
        step = (uint32_t)((size_t)vm->chunk * (size_t)V / E);
    if (step == 0)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: a hidden state of %zu floats does not fit the logits "
                        "buffer (%u x %d floats)", E, vm->chunk, V);
    for (int done = 0; done < n && st == KVGEN_OK;) {
        uint32_t c = (uint32_t)(n - done) < step ? (uint32_t)(n - done) : step;
        bool last = done + (int)c == n;
        int want = out == KVG_OUT_HIDDEN ? 3 : out == KVG_OUT_ALL ? 2 : (last && out != KVG_OUT_NONE ? 1 : 0);
        int sel = last ? select : 0;
        uint32_t *params = vm->params.host.map;
        params[0] = (uint32_t)(pos0 + done);
        params[1] = 0; /* not a batched decode */
        memcpy(params + 4, tokens + done, c * sizeof *tokens);
        VkCommandBuffer cb;
        if (lora) kvg_vk_lora_step_seq(vm, lora, c); /* recorded for this step only */
        if (c == 1 && want == 1 && !lora) {
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
        kvg_vk_lora_end(vm);
        if (st == KVGEN_OK) st = kvg_vk_submit_wait(ctx, cb, s->fence, err);
        if (st == KVGEN_OK && (vm->prof_prefill ? c > 1 : c == 1)) kvg_vk_prof_collect(vm);
        if (st == KVGEN_OK && want == 3) st = read_out(vm, 0, c * E * sizeof(float), logits + (size_t)done * E, err);
        else if (st == KVGEN_OK && want == 2) st = read_logits(vm, 0, c, logits + (size_t)done * (size_t)V, err);
        else if (st == KVGEN_OK && want == 1 && !keep) st = read_logits(vm, 0, 1, logits, err);
        if (st == KVGEN_OK && last && keep) {
            vm->row_owner[0] = s;
            if (sel) s->sel_n = kvg_vk_select_read(&vm->sel, sel == 1 ? 1 : KVG_VK_TOPK, 0, s->sel_ids, s->sel_vals);
        }
        done += (int)c;
    }
    return st;
}

static kvgen_status check_seq(const vk_model *vm, const kvg_batch_seq *q, int i, kvgen_error *err) {
    const int V = vm->hp.n_vocab;
    const kvg_backend_session *s = q->bs;
    if (!s || !q->pages[0] || (vm->kv_groups > 1 && !q->pages[1]) || !q->tokens)
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: batch sequence %d lacks its session, page table or tokens", i);
    if (q->n <= 0 || q->pos0 < 0 || q->n > s->n_ctx - q->pos0)
        return kvg_fail(err, KVGEN_E_CONTEXT_FULL, "vulkan: %d tokens at position %d exceed the context of %d", q->n,
                        q->pos0, s->n_ctx);
    if ((q->out == KVG_OUT_LAST || q->out == KVG_OUT_ALL || q->out == KVG_OUT_HIDDEN) && !q->logits)
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: batch sequence %d wants logits but has no buffer", i);
    if (q->out == KVG_OUT_KEEP && (q->select_k < 0 || q->select_k > KVG_VK_TOPK))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: a selection of %d logits (at most %d)", q->select_k,
                        KVG_VK_TOPK);
    for (int t = 0; t < q->n; t++)
        if (q->tokens[t] < 0 || q->tokens[t] >= V)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: token %d: id %d is outside the vocabulary [0, %d)",
                            t, (int)q->tokens[t], V);
    size_t n_entries = ((size_t)q->pos0 + (size_t)q->n + (size_t)vm->page_size - 1) / (size_t)vm->page_size;
    kvgen_status st = KVGEN_OK;
    for (int g = 0; st == KVGEN_OK && g < (vm->kv_groups > 1 ? 2 : 1); g++)
        st = kvg_vk_check_pages(vm, g, q->pages[g], n_entries, err);
    return st;
}

/* the local layers' table entries as device pages (kvg_vk_kv_device_page), at tab */
static void put_local_table(const vk_model *vm, int32_t *tab, const int32_t *pages, size_t n_entries) {
    for (size_t i = 0; i < n_entries; i++) tab[i] = kvg_vk_kv_device_page(vm, 1, pages[i]);
}

/* the most tokens a step has (a prefill chunk; a batched decode's columns are no more) */
static uint32_t lora_tokens(const vk_model *vm) { return vm->chunk; }

/* One sequence through its own session's steps (its LoRA adapters' steps recorded each time,
 * never the session's replayed decode). */
static kvgen_status run_seq(vk_model *vm, const kvg_batch_seq *q, kvgen_error *err) {
    kvg_backend_session *s = q->bs;
    size_t n_entries = ((size_t)q->pos0 + (size_t)q->n + (size_t)vm->page_size - 1) / (size_t)vm->page_size;
    const kvg_lora_set *lora = q->lora && q->lora->n > 0 ? q->lora : NULL;
    kvg_vk_lock(vm->ctx);
    /* the table in a buffer the sets name once: a step only rewrites its entries */
    memcpy(s->ptab.host.map, q->pages[0], n_entries * sizeof *q->pages[0]);
    if (vm->kv_groups > 1) put_local_table(vm, (int32_t *)s->ptab.host.map + s->tab1, q->pages[1], n_entries);
    kvgen_status st = lora ? kvg_vk_lora_prepare(vm, &lora, 1, lora_tokens(vm), err) : KVGEN_OK;
    if (st == KVGEN_OK) st = kvg_vk_refresh_sets(vm, s, err);
    if (st == KVGEN_OK) st = run_steps(vm, s, q->tokens, q->n, q->pos0, q->out, q->logits, q->select_k, lora, err);
    kvg_vk_unlock(vm->ctx);
    return st;
}

/* ---- batched decode: one-token sequences of different sessions as one step's columns ---- */

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

/* One step of n <= vm->bat->n_cols one-token sequences (caller holds ctx->lock, arguments checked):
 * column i is q[i]'s token. The columns that keep their logits get them selected on the device
 * (argmax when every one of them wants only that, else top-k for all: its first entry is the
 * argmax), the others' rows are copied back. */
static kvgen_status batch_step(vk_model *vm, const kvg_batch_seq *const *q, int n, kvgen_error *err) {
    kvg_backend_session *b = vm->bat;
    uint32_t *params = vm->params.host.map;
    int32_t *tab = b->ptab.host.map;
    kvg_backend_session *run[VK_BATCH_MAX];
    const kvg_lora_set *lora[VK_BATCH_MAX];
    bool any_lora = false;
    int sel = 0;
    params[0] = 0;
    params[1] = VK_BATCH_AT;
    for (int i = 0; i < n; i++) {
        uint32_t base = (uint32_t)i * vm->bat_entries;
        size_t entries = (size_t)q[i]->pos0 / (size_t)vm->page_size + 1;
        memcpy(tab + base, q[i]->pages[0], entries * sizeof *tab);
        if (vm->kv_groups > 1) put_local_table(vm, tab + b->tab1 + base, q[i]->pages[1], entries);
        params[4 + i] = (uint32_t)q[i]->tokens[0];
        params[4 + VK_BATCH_AT + 2 * i] = (uint32_t)q[i]->pos0;
        params[4 + VK_BATCH_AT + 2 * i + 1] = base;
        run[i] = q[i]->bs;
        lora[i] = q[i]->lora && q[i]->lora->n > 0 ? q[i]->lora : NULL;
        any_lora |= lora[i] != NULL;
        if (q[i]->out == KVG_OUT_KEEP && q[i]->select_k > 0) {
            int want = q[i]->select_k == 1 ? 1 : 2;
            if (want > sel) sel = want;
        }
    }
    kvgen_status st = set_aside_logits(vm, (uint32_t)n, run, n, err);
    /* params carry everything that changes from step to step: same width, same commands; a
     * step with LoRA adapters is recorded for itself (its tables are the step's) */
    VkCommandBuffer cb = b->cb_decode;
    if (any_lora) {
        kvg_vk_lora_step(vm, lora, (uint32_t)n);
        st = kvg_vk_check(vkResetCommandBuffer(b->cb_step, 0), err, "vkResetCommandBuffer");
        if (st == KVGEN_OK) st = kvg_vk_record(vm, b, b->cb_step, true, (uint32_t)n, 0, 2, sel, err);
        kvg_vk_lora_end(vm);
        cb = b->cb_step;
    } else if (!b->decode_recorded || b->decode_ncols != (uint32_t)n || b->decode_select != sel) {
        st = kvg_vk_record(vm, b, b->cb_decode, false, (uint32_t)n, 0, 2, sel, err);
        b->decode_recorded = st == KVGEN_OK;
        b->decode_ncols = (uint32_t)n;
        b->decode_select = sel;
    }
    if (st == KVGEN_OK) st = kvg_vk_submit_wait(vm->ctx, cb, b->fence, err);
    for (int i = 0; i < n && st == KVGEN_OK; i++) {
        kvg_backend_session *s = q[i]->bs;
        if (q[i]->out == KVG_OUT_LAST || q[i]->out == KVG_OUT_ALL) {
            st = read_logits(vm, (uint32_t)i, 1, q[i]->logits, err);
        } else if (q[i]->out == KVG_OUT_KEEP) {
            vm->row_owner[i] = s;
            if (sel && q[i]->select_k > 0)
                s->sel_n = kvg_vk_select_read(&vm->sel, sel == 1 ? 1 : KVG_VK_TOPK, (uint32_t)i, s->sel_ids,
                                              s->sel_vals);
        }
    }
    return st;
}

/* The one-token sequences q[0..n) in steps of up to the batch session's n_cols columns (one
 * step for a whole batch of the jobs worker's default 64 where the device allows). */
static kvgen_status run_columns(kvgen_model *m, const kvg_batch_seq *const *q, int n, kvgen_error *err) {
    vk_model *vm = m->backend;
    int n_ctx = 1;
    for (int i = 0; i < n; i++)
        if (q[i]->bs->n_ctx > n_ctx) n_ctx = q[i]->bs->n_ctx;
    kvg_mutex_lock(&vm->bat_mu);
    kvgen_status st = batch_session(m, n_ctx, err);
    if (st == KVGEN_OK) {
        int group = (int)vm->bat->n_cols;
        kvg_vk_lock(vm->ctx);
        const kvg_lora_set *sets[VK_BATCH_MAX];
        int n_sets = 0;
        for (int i = 0; i < n && n_sets < VK_BATCH_MAX; i++)
            if (q[i]->lora && q[i]->lora->n > 0) sets[n_sets++] = q[i]->lora;
        if (n_sets > 0) st = kvg_vk_lora_prepare(vm, sets, n_sets, lora_tokens(vm), err);
        if (st == KVGEN_OK) st = kvg_vk_refresh_sets(vm, vm->bat, err);
        for (int done = 0; done < n && st == KVGEN_OK; done += group)
            st = batch_step(vm, q + done, n - done < group ? n - done : group, err);
        kvg_vk_unlock(vm->ctx);
    }
    kvg_mutex_unlock(&vm->bat_mu);
    return st;
}

/* The backend's forward: sequences of several tokens each through their own session's steps,
 * the one-token sequences together as batched columns. A lone one-token sequence runs on its
 * own session, whose decode command buffer is recorded once and replayed. */
static kvgen_status vk_forward(kvgen_model *m, const kvg_batch *b, kvgen_error *err) {
    enum { GROUP = VK_BATCH_MAX };
    vk_model *vm = m->backend;
    kvgen_status st = KVGEN_OK;
    for (int i = 0; i < b->n_seq && st == KVGEN_OK; i++) st = check_seq(vm, &b->seq[i], i, err);
    const kvg_batch_seq *cols[GROUP];
    int n_cols = 0, n_single = 0;
    for (int i = 0; i < b->n_seq; i++) n_single += b->seq[i].n == 1;
    for (int i = 0; i < b->n_seq && st == KVGEN_OK; i++) {
        const kvg_batch_seq *q = &b->seq[i];
        if (q->n > 1 || n_single == 1 || q->out == KVG_OUT_HIDDEN) {
            st = run_seq(vm, q, err);
            continue;
        }
        cols[n_cols++] = q;
        if (n_cols == GROUP) {
            st = run_columns(m, cols, n_cols, err);
            n_cols = 0;
        }
    }
    if (st == KVGEN_OK && n_cols > 0) st = run_columns(m, cols, n_cols, err);
    return st;
}

/* ---- logits kept on the device (kvg_model.h) ---- */

static kvgen_status vk_fetch_logits(kvgen_model *m, kvg_backend_session *s, float *out, kvgen_error *err) {
    vk_model *vm = m->backend;
    size_t bytes = (size_t)vm->hp.n_vocab * sizeof(float);
    kvgen_status st = KVGEN_OK;
    int row = -1;
    kvg_vk_lock(vm->ctx);
    for (int r = 0; r < VK_BATCH_MAX && row < 0; r++)
        if (vm->row_owner[r] == s) row = r;
    if (row >= 0) st = read_logits(vm, (uint32_t)row, 1, out, err);
    else if (s->saved_valid) memcpy(out, s->saved, bytes);
    else st = kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: the session has no logits kept on the device");
    kvg_vk_unlock(vm->ctx);
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

static kvgen_status pipeline_progress(void *user, int n_pipes, kvgen_error *err) {
    return kvg_load_progress(user, KVGEN_LOAD_PIPELINES, (uint64_t)n_pipes, 0, err);
}

/* The pool's layout (vk_kv.c), then every pipeline a step over it uses and kv_copy's (the
 * load's KVGEN_LOAD_PIPELINES stage: one report per pipeline built, the count unknown until the
 * end). The layout of every layer group is made with group 0's call (both pools have n_pages
 * pages). */
static kvgen_status vk_kv_pages_init(kvgen_model *m, int group, int page_size, int32_t n_pages, kvgen_error *err) {
    vk_model *vm = m->backend;
    if (group != 0)
        return page_size == vm->page_size && n_pages == vm->n_pages && group < vm->kv_groups
                   ? KVGEN_OK
                   : kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: kv_pages_init: layer group %d of %d pages of %d (the "
                              "layout has %d of %d)", group, (int)n_pages, page_size, (int)vm->n_pages, vm->page_size);
    kvg_vk_ctx *ctx = vm->ctx;
    kvgen_status st = KVGEN_OK;
    if (vm->enc) { /* an encoder keeps no K/V: the pool the load makes gets no layout, no storage */
        vm->page_size = page_size;
        vm->n_pages = n_pages;
        vm->kv_groups = 1;
    } else {
        st = kvg_vk_kv_pool_init(m, page_size, n_pages, err);
    }
    ctx->on_pipeline = pipeline_progress;
    ctx->on_pipeline_user = m;
    if (st == KVGEN_OK && vm->enc) { /* an encoder's: its submissions' pipelines; no step, no kv_copy */
        st = kvg_vk_encoder_pipelines(vm, err);
    } else if (st == KVGEN_OK) {
        walk pw = {.mode = WALK_PIPELINES, .vm = vm, .n = 1, .logits = 2, .err = err};
        st = kvg_vk_walk_step(&pw);
    }
    if (st == KVGEN_OK && !vm->enc) {
        uint32_t spec[KVG_SPEC_COUNT];
        spec_init(spec);
        kvg_vk_kv_spec(vm, spec);
        VkPipeline p;
        st = kvg_vk_pipeline_get(ctx, "kv_copy", spec, &p, err);
    }
    ctx->on_pipeline = NULL;
    ctx->on_pipeline_user = NULL;
    if (st == KVGEN_OK)
        st = kvg_load_progress(m, KVGEN_LOAD_PIPELINES, (uint64_t)ctx->n_pipes, (uint64_t)ctx->n_pipes, err);
    if (st == KVGEN_OK) kvg_vk_pcache_save(ctx); /* the end of a paged load: every pipeline exists now */
    return st;
}

static void vk_adapter_free(kvgen_model *m, const kvgen_adapter *a) { kvg_vk_lora_forget(m->backend, a); }

const kvg_backend_ops kvg_vulkan_backend = {
    .name = "vulkan",
    .kv_groups = true,
    /* LoRA: each sequence's adapters packed on the device the first time a step runs them;
     * lora.comp's two dispatches before each mat-mul they adapt, the delta added in its epilogue */
    .lora = true,
    .adapter_free = vk_adapter_free,
    /* f16 pages (f32 on a device without 16-bit storage, or with force_f32), or q8_0 / q4_0
     * blocks: kv_store.comp quantizes a step's K/V, the attention kernels read the blocks in place */
    .kv_types = (const uint32_t[]){KVG_TYPE_F16, KVG_TYPE_Q8_0, KVG_TYPE_Q4_0},
    .n_kv_types = 3,
    /* every feature of the architecture table, as data of the one step walk: Q and the attention
     * output have their own stride (ld_q), so heads x head_dim may differ from n_embd; biases in
     * the QKV epilogue (binding 6); Q/K head norms by rms_norm.comp after a raw QKV epilogue;
     * post norms by rms_norm.comp after a storing projection; NEOX RoPE by Q/K rows permuted at
     * upload; per-layer RoPE base / scale and rope_freqs in the layers' cos/sin tables (and
     * kv_copy's); GELU in the gate/up epilogue; the embedding scale in embed.comp; soft-capping
     * in the attention kernels and the logits' epilogue; sliding windows in the attention kernels;
     * an encoder by vk_encode.c (LayerNorms, bidirectional attention over each text, exact GELU
     * in the up mat-mul's epilogue) */
    .features = KVG_F_WIDE_HEADS | KVG_F_ATTN_BIAS | KVG_F_QK_NORM | KVG_F_POST_NORMS | KVG_F_ROPE_NEOX |
                KVG_F_ROPE_FREQS | KVG_F_ROPE_ATTN_FACTOR | KVG_F_GELU | KVG_F_EMBD_SCALE | KVG_F_SOFTCAP |
                KVG_F_SLIDING_WINDOW | KVG_F_ENCODER,
    .weight_types = kvg_vk_weight_types,
    .model_init = vk_model_init,
    .model_free = vk_model_free,
    .session_init = vk_session_init,
    .session_free = vk_session_free,
    .forward = vk_forward,
    /* an encoder (bert): its own op list over the same mat-muls (vk_encode.c) */
    .encode = kvg_vk_encode,
    .cache_bytes_per_token = kvg_vk_cache_bytes_per_token,
    .kv_default_pool_bytes = kvg_vk_default_pool_bytes,
    .kv_pages_init = vk_kv_pages_init,
    .kv_page_commit = kvg_vk_kv_page_commit,
    .kv_copy = kvg_vk_kv_copy,
    .kv_read = kvg_vk_kv_read,
    .kv_write = kvg_vk_kv_write,
    .fetch_logits = vk_fetch_logits,
    .topk = vk_topk,
    /* a decoder's hidden states (kvgen_embed): rms_norm.comp's final norm in place of the logits */
    .hidden_out = true,
};
