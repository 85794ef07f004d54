/* kvg_vk_select.h: the k best logits selected on the device (shaders/argmax.comp,
 * shaders/topk.comp), recorded after a step's logits so that sampling reads back one id (greedy)
 * or KVG_VK_TOPK candidates instead of the vocabulary (private; recorded by vk_walk.c). */
#ifndef KVG_VK_SELECT_H
#define KVG_VK_SELECT_H
#include "kvg_vk.h"

#define KVG_VK_TOPK 64 /* topk.comp's K */

typedef struct kvg_vk_select {
    uint32_t n;          /* values per selection (a row) */
    uint32_t rows;       /* rows one submission may select over */
    kvg_vk_buffer part;  /* pass 0, per row: KVG_VK_TOPK (key, id) pairs per chunk of values (topk), or
                          * one (argmax) */
    kvg_vk_buffer out;   /* host-visible, per row: the argmax id, or KVG_VK_TOPK (key, id) pairs */
    VkDescriptorPool pool;
    VkDescriptorSet set; /* 2 the values, 3 out, 7 part */
    VkPipeline argmax_part, argmax_merge; /* argmax_merge: none where n fits one chunk */
    VkPipeline topk_part, topk_merge;
} kvg_vk_select;

/* Pipelines, buffers and the descriptor set for selections over up to `rows` rows of n floats
 * of `values` (at load, never on the per-token path). */
kvgen_status kvg_vk_select_init(kvg_vk_ctx *ctx, const kvg_vk_buffer *values, uint32_t n, uint32_t rows,
                                kvg_vk_select *sel, kvgen_error *err);
void kvg_vk_select_free(kvg_vk_ctx *ctx, kvg_vk_select *sel);
/* Records, after a barrier on the values, the selection of the best one (k == 1: argmax) or
 * of KVG_VK_TOPK (k > 1) of each of `rows` rows, row r being values[x_off + r*n, .. + n), and a
 * host barrier. */
void kvg_vk_select_record(kvg_vk_ctx *ctx, VkCommandBuffer cb, const kvg_vk_select *sel, int k, uint32_t x_off,
                          uint32_t rows);
/* After that submission completed: row `row`'s selected ids (best first) and, for k > 1, their
 * values (NaN came back as -inf); returns how many (k == 1: 1; else min(n, KVG_VK_TOPK)). */
int kvg_vk_select_read(const kvg_vk_select *sel, int k, uint32_t row, int32_t *ids, float *vals);

/* test hook: the selection over `rows` rows of n host floats (x: rows * n) through the same code
 * (k 1: argmax; else topk, whose min(n, KVG_VK_TOPK) results per row are returned in *n_out;
 * ids and vals hold rows * KVG_VK_TOPK entries, row r's from r * KVG_VK_TOPK). */
kvgen_status kvg_vk_test_select(kvg_vk_ctx *ctx, const float *x, uint32_t n, uint32_t rows, int k, int32_t *ids,
                                float *vals, int *n_out, kvgen_error *err);

#endif
