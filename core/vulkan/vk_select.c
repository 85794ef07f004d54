/* vk_select.c: device argmax and top-k over a step's logits (see kvg_vk_select.h). */
#include "kvg_vk_select.h"
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"

#define ARGMAX_CHUNK 4096u /* argmax.comp's CHUNK */
#define TOPK_CHUNK 8192u   /* topk.comp's CHUNK */

/* pass 0's workgroups per row (at most 4,096 for 2^24 values: under Vulkan's guaranteed 65,535
 * workgroups per dimension; kvg_vk_cmd_dispatch splits a grid past a lowered limit) */
static uint32_t argmax_chunks(uint32_t n) { return (n + ARGMAX_CHUNK - 1) / ARGMAX_CHUNK; }
static uint32_t topk_chunks(uint32_t n) { return (n + TOPK_CHUNK - 1) / TOPK_CHUNK; }

kvgen_status kvg_vk_select_init(kvg_vk_ctx *ctx, const kvg_vk_buffer *values, uint32_t n, uint32_t rows,
                                kvg_vk_select *sel, kvgen_error *err) {
    memset(sel, 0, sizeof *sel);
    if (n == 0 || n > (1u << 24) || rows == 0 || rows > 256)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: selection over %u rows of %u values", rows, n);
    sel->n = n;
    sel->rows = rows;
    /* the largest workgroups the device's limits allow (argmax: 256, topk: 32); pipeline_get
     * reports a device that cannot run even the smallest */
    uint32_t spec[KVG_SPEC_COUNT] = {0};
    spec[KVG_SPEC_WG] = 256;
    kvg_vk_fit_wg(ctx, "argmax", spec, 32);
    kvgen_status st = kvg_vk_pipeline_get(ctx, "argmax", spec, &sel->argmax_part, err);
    spec[KVG_SPEC_MODE] = 1;
    if (st == KVGEN_OK && argmax_chunks(n) > 1) st = kvg_vk_pipeline_get(ctx, "argmax", spec, &sel->argmax_merge, err);
    spec[KVG_SPEC_MODE] = 0;
    spec[KVG_SPEC_WG] = 32;
    kvg_vk_fit_wg(ctx, "topk", spec, 1);
    if (st == KVGEN_OK) st = kvg_vk_pipeline_get(ctx, "topk", spec, &sel->topk_part, err);
    spec[KVG_SPEC_MODE] = 1;
    if (st == KVGEN_OK) st = kvg_vk_pipeline_get(ctx, "topk", spec, &sel->topk_merge, err);
    /* the pairs of topk's pass 0, which outnumber argmax's (64 per 8,192 values vs 1 per 4,096) */
    if (st == KVGEN_OK)
        st = kvg_vk_buffer_create(ctx, (size_t)rows * topk_chunks(n) * KVG_VK_TOPK * 8, KVG_VK_MEM_DEVICE, &sel->part,
                                  err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, (size_t)rows * KVG_VK_TOPK * 8, KVG_VK_MEM_HOST, &sel->out, err);
    if (st == KVGEN_OK && !sel->out.map)
        st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: the selection's result buffer is not host-visible");
    if (st == KVGEN_OK) st = kvg_vk_pool_create(ctx, 1, &sel->pool, err);
    if (st == KVGEN_OK) {
        kvg_vk_binding b[KVG_VK_BINDINGS] = {{0}};
        b[2].buf = values;
        b[3].buf = &sel->out;
        b[7].buf = &sel->part;
        st = kvg_vk_set_create(ctx, sel->pool, b, &sel->set, err);
    }
    if (st != KVGEN_OK) kvg_vk_select_free(ctx, sel);
    return st;
}

void kvg_vk_select_free(kvg_vk_ctx *ctx, kvg_vk_select *sel) {
    if (sel->pool) vkDestroyDescriptorPool(ctx->dev, sel->pool, NULL);
    kvg_vk_buffer_destroy(ctx, &sel->part);
    kvg_vk_buffer_destroy(ctx, &sel->out);
    memset(sel, 0, sizeof *sel);
}

void kvg_vk_select_record(kvg_vk_ctx *ctx, VkCommandBuffer cb, const kvg_vk_select *sel, int k, uint32_t x_off,
                          uint32_t rows) {
    uint32_t pc[2] = {sel->n, x_off};
    if (rows > sel->rows) rows = sel->rows;
    kvg_vk_cmd_barrier(cb);
    if (k == 1) {
        uint32_t g = argmax_chunks(sel->n);
        kvg_vk_cmd_dispatch(ctx, cb, sel->argmax_part, sel->set, pc, sizeof pc, g, rows, 1);
        if (g > 1) { /* one chunk wrote its row's index itself */
            kvg_vk_cmd_barrier(cb);
            uint32_t pm[2] = {g, 0};
            kvg_vk_cmd_dispatch(ctx, cb, sel->argmax_merge, sel->set, pm, sizeof pm, 1, rows, 1);
        }
    } else {
        kvg_vk_cmd_dispatch(ctx, cb, sel->topk_part, sel->set, pc, sizeof pc, topk_chunks(sel->n), rows, 1);
        kvg_vk_cmd_barrier(cb);
        uint32_t pm[2] = {topk_chunks(sel->n) * KVG_VK_TOPK, 0};
        kvg_vk_cmd_dispatch(ctx, cb, sel->topk_merge, sel->set, pm, sizeof pm, 1, rows, 1);
    }
    kvg_vk_cmd_host_barrier(cb);
}

/* the float a topk.comp key stands for (select.glsl's kvg_key, inverted) */
static float key_value(uint32_t key) {
    uint32_t bits = (key & 0x80000000u) ? key & 0x7fffffffu : ~key;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

int kvg_vk_select_read(const kvg_vk_select *sel, int k, uint32_t row, int32_t *ids, float *vals) {
    const uint32_t *out = sel->out.map;
    if (k == 1) {
        ids[0] = (int32_t)out[row];
        return 1;
    }
    out += (size_t)row * KVG_VK_TOPK * 2;
    int m = sel->n < KVG_VK_TOPK ? (int)sel->n : KVG_VK_TOPK;
    for (int i = 0; i < m; i++) {
        ids[i] = (int32_t)out[2 * i + 1];
        if (vals) vals[i] = key_value(out[2 * i]);
    }
    return m;
}

kvgen_status kvg_vk_test_select(kvg_vk_ctx *ctx, const float *x, uint32_t n, uint32_t rows, int k, int32_t *ids,
                                float *vals, int *n_out, kvgen_error *err) {
    kvg_vk_buffer xb = {0};
    kvg_vk_select sel;
    memset(&sel, 0, sizeof sel);
    VkCommandBuffer cb = VK_NULL_HANDLE;
    /* a few floats of offset, as the backend's last-token row may sit past others */
    uint32_t off = 3;
    size_t total = (size_t)n * rows;
    kvgen_status st = kvg_vk_buffer_create(ctx, (total + off) * 4, KVG_VK_MEM_HOST, &xb, err);
    if (st == KVGEN_OK) st = kvg_vk_upload(ctx, &xb, (size_t)off * 4, x, total * 4, err);
    if (st == KVGEN_OK) st = kvg_vk_select_init(ctx, &xb, n, rows, &sel, err);
    kvg_vk_lock(ctx);
    if (st == KVGEN_OK) st = kvg_vk_cmd_alloc(ctx, &cb, err);
    if (st == KVGEN_OK) st = kvg_vk_cmd_begin(cb, true, err);
    if (st == KVGEN_OK) {
        kvg_vk_select_record(ctx, cb, &sel, k, off, rows);
        st = kvg_vk_cmd_end(cb, err);
    }
    if (st == KVGEN_OK) st = kvg_vk_submit_wait(ctx, cb, ctx->fence, err);
    for (uint32_t r = 0; st == KVGEN_OK && r < rows; r++)
        *n_out = kvg_vk_select_read(&sel, k, r, ids + (size_t)r * KVG_VK_TOPK, vals ? vals + (size_t)r * KVG_VK_TOPK : NULL);
    if (cb) vkFreeCommandBuffers(ctx->dev, ctx->cmd_pool, 1, &cb);
    kvg_vk_unlock(ctx);
    kvg_vk_select_free(ctx, &sel);
    kvg_vk_buffer_destroy(ctx, &xb);
    return st;
}
