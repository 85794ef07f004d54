/* cpu_pages.c: KV pages in host memory for the CPU backends (kvg_cpu.h). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_platform.h"
#include "kvg_cpu.h"
#include "kvg_quant.h"
#include "kvg_reference.h"

/* RoPE (kvg_reference.h) lives here, below the reference backend, because moving K between
 * pages re-rotates it too (kvg_cpu_pages_copy). */
void kvg_ref_rope(float *v, int n_rot, int pos, float base) {
    kvg_ref_rope_params r = {.n_rot = n_rot, .base = base, .scale = 1.0f};
    kvg_ref_rope_apply(&r, v, pos);
}

void kvg_ref_rope_apply(const kvg_ref_rope_params *r, float *v, int pos) {
    int half = r->n_rot / 2;
    for (int i = 0; i < half; i++) {
        double theta = (double)pos * (double)r->scale * pow(r->base, -2.0 * i / r->n_rot);
        if (r->factors) theta /= (double)r->factors[i];
        float c = (float)cos(theta), s = (float)sin(theta);
        if (r->attn_factor > 0.0f) {
            c *= r->attn_factor;
            s *= r->attn_factor;
        }
        int i0 = r->neox ? i : 2 * i, i1 = r->neox ? i + half : 2 * i + 1;
        float a = v[i0], b = v[i1];
        v[i0] = a * c - b * s;
        v[i1] = a * s + b * c;
    }
}

uint16_t kvg_cpu_f32_to_kv_f16(float f) {
    if (f > 65504.0f && f < INFINITY) f = 65504.0f; /* saturate; inf and NaN fail both tests */
    else if (f < -65504.0f && f > -INFINITY) f = -65504.0f;
    return kvg_f32_to_f16(f);
}

/* ---- what host pages hold: one row per type (kvg_cpu.h) ---------------------------------- */

static void f32_to_f32(const void *src, float *dst, size_t n) { memmove(dst, src, n * sizeof(float)); }
static void f32_from_f32(const float *src, void *dst, size_t n) { memmove(dst, src, n * sizeof(float)); }
static void f16_to_f32(const void *src, float *dst, size_t n) {
    const uint16_t *h = src;
    for (size_t i = 0; i < n; i++) dst[i] = kvg_f16_to_f32(h[i]);
}
static void f16_from_f32(const float *src, void *dst, size_t n) {
    uint16_t *h = dst;
    for (size_t i = 0; i < n; i++) h[i] = kvg_cpu_f32_to_kv_f16(src[i]);
}
/* the block types: kvg_quant.h's quantizer and dequantizer (blocks of 32, the scale in f16) */
static void blocks_to_f32(kvg_cpu_kv_type type, const void *src, float *dst, size_t n) {
    kvg_dequantize_row(type, src, dst, (uint64_t)n);
}
static void blocks_from_f32(kvg_cpu_kv_type type, const float *src, void *dst, size_t n) {
    kvg_quantize_row(type, src, dst, (uint64_t)n);
}
static void q8_0_to_f32(const void *src, float *dst, size_t n) { blocks_to_f32(KVG_TYPE_Q8_0, src, dst, n); }
static void q8_0_from_f32(const float *src, void *dst, size_t n) { blocks_from_f32(KVG_TYPE_Q8_0, src, dst, n); }
static void q4_0_to_f32(const void *src, float *dst, size_t n) { blocks_to_f32(KVG_TYPE_Q4_0, src, dst, n); }
static void q4_0_from_f32(const float *src, void *dst, size_t n) { blocks_from_f32(KVG_TYPE_Q4_0, src, dst, n); }

typedef struct kv_row {
    kvg_cpu_kv_type type;
    void (*to_f32)(const void *src, float *dst, size_t n);
    void (*from_f32)(const float *src, void *dst, size_t n);
} kv_row;

static const kv_row kv_rows[] = {
    {KVG_TYPE_F32, f32_to_f32, f32_from_f32},
    {KVG_TYPE_F16, f16_to_f32, f16_from_f32},
    {KVG_TYPE_Q8_0, q8_0_to_f32, q8_0_from_f32},
    {KVG_TYPE_Q4_0, q4_0_to_f32, q4_0_from_f32},
};

static const kv_row *kv_row_of(kvg_cpu_kv_type type) {
    for (size_t i = 0; i < sizeof kv_rows / sizeof kv_rows[0]; i++)
        if (kv_rows[i].type == type) return &kv_rows[i];
    return NULL;
}

bool kvg_cpu_kv_type_known(kvg_cpu_kv_type type) { return kv_row_of(type) != NULL; }

size_t kvg_cpu_kv_row_bytes(kvg_cpu_kv_type type, size_t n) { return kvg_row_bytes(type, (uint64_t)n); }

/* the callers made the pages of a type of the table (kvg_cpu_pages_init checks it) */
void kvg_cpu_kv_to_f32(kvg_cpu_kv_type type, const void *src, float *dst, size_t n) { kv_row_of(type)->to_f32(src, dst, n); }

void kvg_cpu_kv_from_f32(kvg_cpu_kv_type type, const float *src, void *dst, size_t n) {
    kv_row_of(type)->from_f32(src, dst, n);
}

size_t kvg_cpu_kv_bytes_per_token(const kvg_hparams *hp, kvg_cpu_kv_type type) {
    return 2 * (size_t)hp->n_layer * (size_t)hp->n_head_kv * kvg_cpu_kv_row_bytes(type, (size_t)hp->head_dim);
}

size_t kvg_cpu_default_pool_bytes(const kvg_hparams *hp, kvg_cpu_kv_type type) {
    size_t ctx = hp->n_ctx_train > 0 && hp->n_ctx_train < 8192 ? (size_t)hp->n_ctx_train : 8192;
    size_t want = 16 * ctx * kvg_cpu_kv_bytes_per_token(hp, type);
    uint64_t mem = kvg_physical_memory();
    if (mem > 0) {
        size_t quarter = mem / 4 > SIZE_MAX ? SIZE_MAX : (size_t)(mem / 4);
        if (want > quarter) want = quarter;
    }
    return want;
}

kvgen_status kvg_cpu_pages_init(kvg_cpu_pages *p, const kvg_hparams *hp, const kvg_ref_rope_params *rope,
                                const kvg_kv_layout *kv, int group, int page_size, int32_t n_pages,
                                kvg_cpu_kv_type type, const char *who, kvgen_error *err) {
    memset(p, 0, sizeof *p);
    p->who = who ? who : "host KV pages";
    if (!kvg_cpu_kv_type_known(type) || hp->head_dim % (int)kvg_type_block_elems(type) != 0)
        return kvg_fail(err, KVGEN_E_INTERNAL, "%s: no pages of %s for head_dim %d", p->who, kvg_type_name(type),
                        hp->head_dim);
    if (page_size <= 0 || n_pages <= 0)
        return kvg_fail(err, KVGEN_E_INTERNAL, "%s: %d pages of %d tokens", p->who, (int)n_pages, page_size);
    p->data = kvg_calloc((size_t)n_pages, sizeof *p->data);
    if (!p->data) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for %d pages", p->who, (int)n_pages);
    p->hp = *hp;
    p->hp.n_layer = kv->n_layers[group];
    p->slot = kv->slot;
    p->layers = kv->layers[group];
    p->rope = rope;
    p->page_size = page_size;
    p->n_pages = n_pages;
    p->type = type;
    p->row_bytes = kvg_cpu_kv_row_bytes(type, (size_t)hp->head_dim);
    return KVGEN_OK;
}

void kvg_cpu_pages_free(kvg_cpu_pages *p) {
    for (int32_t i = 0; p->data && i < p->n_pages; i++) kvg_free(p->data[i]);
    kvg_free(p->data);
    p->data = NULL;
    p->n_pages = 0;
}

kvgen_status kvg_cpu_pages_commit(kvg_cpu_pages *p, int32_t page, kvgen_error *err) {
    size_t bytes = (size_t)p->page_size * kvg_cpu_kv_bytes_per_token(&p->hp, p->type);
    if (page < 0 || page >= p->n_pages)
        return kvg_fail(err, KVGEN_E_INTERNAL, "%s: page %d outside the pool", p->who, (int)page);
    if (!p->data[page]) p->data[page] = kvg_malloc(bytes ? bytes : 1); /* a group may hold no layer */
    if (!p->data[page])
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of host memory for a KV page (%zu bytes)", p->who, bytes);
    return KVGEN_OK;
}

/* Moves token slots ascending, so a move towards the start of one table never reads a slot it
 * has already overwritten. Re-rotating K by delta is RoPE's addition law: rotating by pos then
 * by delta is rotating by pos + delta, up to rounding; it is done on the key in f32 (exact from
 * every type) and stored back in the pages' type, so f16 pages round once per shift, and
 * quantized ones requantize each block with a fresh scale (dequantize, rotate, quantize). */
kvgen_status kvg_cpu_pages_copy(const kvg_cpu_pages *p, const int32_t *src_pages, int src_pos,
                                const int32_t *dst_pages, int dst_pos, int n, int rope_delta, kvgen_error *err) {
    const kvg_hparams *hp = &p->hp;
    size_t hd = (size_t)hp->head_dim, bytes = p->row_bytes;
    float *key = NULL; /* one key in f32 while it is re-rotated */
    if (rope_delta != 0 && !(key = kvg_malloc(hd * sizeof(float))))
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory re-rotating keys", p->who);
    for (int sl = 0; sl < hp->n_layer; sl++) {
        int l = p->layers[sl];
        for (int h = 0; h < hp->n_head_kv; h++)
            for (int i = 0; i < n; i++) {
                void *k = kvg_cpu_pages_at(p, dst_pages, l, 0, h, dst_pos + i);
                memmove(k, kvg_cpu_pages_at(p, src_pages, l, 0, h, src_pos + i), bytes);
                memmove(kvg_cpu_pages_at(p, dst_pages, l, 1, h, dst_pos + i),
                        kvg_cpu_pages_at(p, src_pages, l, 1, h, src_pos + i), bytes);
                if (rope_delta != 0) {
                    /* a pure rotation: the attention factor is in the key already */
                    kvg_ref_rope_params r = p->rope ? p->rope[l] : (kvg_ref_rope_params){0};
                    r.attn_factor = 0.0f;
                    kvg_cpu_kv_to_f32(p->type, k, key, hd);
                    if (p->rope) kvg_ref_rope_apply(&r, key, rope_delta);
                    else kvg_ref_rope(key, hp->n_rot, rope_delta, hp->rope_freq_base);
                    kvg_cpu_kv_from_f32(p->type, key, k, hd);
                }
            }
    }
    kvg_free(key);
    return KVGEN_OK;
}

kvgen_status kvg_cpu_pages_read(const kvg_cpu_pages *p, const int32_t *pages, int layer, int which, int pos0, int n,
                                float *out, kvgen_error *err) {
    (void)err;
    size_t hd = (size_t)p->hp.head_dim;
    for (int h = 0; h < p->hp.n_head_kv; h++)
        for (int i = 0; i < n; i++)
            kvg_cpu_kv_to_f32(p->type, kvg_cpu_pages_at(p, pages, layer, which, h, pos0 + i),
                              out + ((size_t)h * n + i) * hd, hd);
    return KVGEN_OK;
}

kvgen_status kvg_cpu_pages_write(const kvg_cpu_pages *p, const int32_t *pages, int layer, int which, int pos0, int n,
                                 const float *in, kvgen_error *err) {
    (void)err;
    size_t hd = (size_t)p->hp.head_dim;
    for (int h = 0; h < p->hp.n_head_kv; h++)
        for (int i = 0; i < n; i++)
            kvg_cpu_kv_from_f32(p->type, in + ((size_t)h * n + i) * hd,
                                kvg_cpu_pages_at(p, pages, layer, which, h, pos0 + i), hd);
    return KVGEN_OK;
}
