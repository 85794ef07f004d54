/* vk_bench.c: probe shaders that measure what the device can do at best, so a benchmark can
 * report decode speed as a fraction of "model bytes / read bandwidth", a figure that means the
 * same on lavapipe and on a GPU. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_platform.h"
#include "kvg_vk.h"
#include "kvg_vk_bench.h"

static double now_s(void) {
    return (double)kvg_time_ns() * 1e-9;
}

/* records `fn`'s dispatches into a fresh command buffer, runs it and returns the seconds taken */
static kvgen_status timed_run(kvg_vk_ctx *ctx, VkPipeline pipe, VkDescriptorSet set, const uint32_t *pc, uint32_t groups,
                              int count, double *secs, kvgen_error *err) {
    kvg_vk_lock(ctx);
    VkCommandBuffer cb;
    kvgen_status st = kvg_vk_cmd_alloc(ctx, &cb, err);
    if (st == KVGEN_OK) {
        st = kvg_vk_cmd_begin(cb, true, err);
        for (int i = 0; i < count && st == KVGEN_OK; i++) {
            kvg_vk_cmd_dispatch(ctx, cb, pipe, set, pc, 4, groups, 1, 1);
            kvg_vk_cmd_barrier(cb);
        }
        if (st == KVGEN_OK) st = kvg_vk_cmd_end(cb, err);
        double t0 = now_s();
        if (st == KVGEN_OK) st = kvg_vk_submit_wait(ctx, cb, ctx->fence, err);
        *secs = now_s() - t0;
        vkFreeCommandBuffers(ctx->dev, ctx->cmd_pool, 1, &cb);
    }
    kvg_vk_unlock(ctx);
    return st;
}

kvgen_status kvg_vk_probe_run(const kvgen_probe_desc *desc, kvgen_probe_result *out, kvgen_error *err) {
    memset(out, 0, sizeof *out);
    int mib = desc->read_mib > 0 ? desc->read_mib : 64;
    int reps = desc->reps > 0 ? desc->reps : 5;
    int dispatches = desc->dispatches > 0 ? desc->dispatches : 1000;
    kvg_vk_ctx_desc cd = {.device = desc->device};
    kvg_vk_ctx *ctx = NULL;
    kvgen_status st = kvg_vk_ctx_create(&cd, &ctx, err);
    if (st != KVGEN_OK) return st;
    snprintf(out->device, sizeof out->device, "%s", ctx->info.name);
    size_t bytes = (size_t)mib << 20;
    if (bytes > ctx->props.limits.maxStorageBufferRange) bytes = ctx->props.limits.maxStorageBufferRange;
    /* 256 workgroups of 64 invocations, each reading bytes/256: trip count bytes/(256*64*16) */
    const uint32_t groups = 256;
    uint32_t per_group = (uint32_t)(bytes / 16 / groups);
    bytes = (size_t)per_group * groups * 16;
    out->bytes = (uint64_t)bytes;
    kvg_vk_buffer data = {0}, result = {0};
    VkDescriptorPool pool = VK_NULL_HANDLE;
    VkDescriptorSet set;
    VkPipeline pread, pempty;
    uint32_t spec[KVG_SPEC_COUNT] = {0};
    st = kvg_vk_buffer_create(ctx, bytes, KVG_VK_MEM_DEVICE, &data, err);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, groups * 4, KVG_VK_MEM_DEVICE, &result, err);
    if (st == KVGEN_OK) st = kvg_vk_pool_create(ctx, 1, &pool, err);
    if (st == KVGEN_OK) {
        kvg_vk_binding b[KVG_VK_BINDINGS] = {{0}};
        b[2].buf = &data;
        b[3].buf = &result;
        st = kvg_vk_set_create(ctx, pool, b, &set, err);
    }
    if (st == KVGEN_OK) st = kvg_vk_pipeline_get(ctx, "probe_read", spec, &pread, err);
    if (st == KVGEN_OK) st = kvg_vk_pipeline_get(ctx, "probe_empty", spec, &pempty, err);
    double best_read = 1e30, best_empty = 1e30;
    for (int r = 0; r < reps && st == KVGEN_OK; r++) {
        double t;
        st = timed_run(ctx, pread, set, &per_group, groups, 1, &t, err);
        if (st == KVGEN_OK && t < best_read) best_read = t;
        if (st == KVGEN_OK) st = timed_run(ctx, pempty, set, &per_group, 1, dispatches, &t, err);
        if (st == KVGEN_OK && t < best_empty) best_empty = t;
    }
    if (st == KVGEN_OK) {
        out->read_gbps = (double)bytes / best_read * 1e-9;
        out->dispatch_us = best_empty / dispatches * 1e6;
    }
    if (pool) vkDestroyDescriptorPool(ctx->dev, pool, NULL);
    kvg_vk_buffer_destroy(ctx, &data);
    kvg_vk_buffer_destroy(ctx, &result);
    kvg_vk_ctx_destroy(ctx);
    return st;
}
