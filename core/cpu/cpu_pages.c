/* cpu_pages.c: KV pages in host memory for the CPU backends (kvg_cpu.h). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_platform.h"
#include "kvg_cpu.h"
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

size_t kvg_cpu_kv_bytes_per_token(const kvg_hparams *hp) {
    return 2 * (size_t)hp->n_layer * (size_t)hp->n_head_kv * (size_t)hp->head_dim * sizeof(float);
}

size_t kvg_cpu_default_pool_bytes(const kvg_hparams *hp) {
    size_t ctx = hp->n_ctx_train > 0 && hp->n_ctx_train < 8192 ? (size_t)hp->n_ctx_train : 8192;
    size_t want = 16 * ctx * kvg_cpu_kv_bytes_per_token(hp);
    uint64_t mem = kvg_physical_memory();
    if (mem > 0) {
        size_t quarter = mem / 4 > SIZE_MAX ? SIZE_MAX : (size_t)(mem / 4);
        if (want > quarter) want = quarter;
    }
    return want;
}

kvgen_status kvg_cpu_pages_init(kvg_cpu_pages *p, const kvg_hparams *hp, const kvg_ref_rope_params *rope,
                                const kvg_kv_layout *kv, int group, int page_size, int32_t n_pages, const char *who,
                                kvgen_error *err) {
    memset(p, 0, sizeof *p);
    p->who = who ? who : "host KV pages";
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
    return KVGEN_OK;
}

void kvg_cpu_pages_free(kvg_cpu_pages *p) {
    for (int32_t i = 0; p->data && i < p->n_pages; i++) kvg_free(p->data[i]);
    kvg_free(p->data);
    p->data = NULL;
    p->n_pages = 0;
}

kvgen_status kvg_cpu_pages_commit(kvg_cpu_pages *p, int32_t page, kvgen_error *err) {
    size_t bytes = (size_t)p->page_size * kvg_cpu_kv_bytes_per_token(&p->hp);
    if (page < 0 || page >= p->n_pages)
        return kvg_fail(err, KVGEN_E_INTERNAL, "%s: page %d outside the pool", p->who, (int)page);
    if (!p->data[page]) p->data[page] = kvg_malloc(bytes ? bytes : 1); /* a group may hold no layer */
    if (!p->data[page])
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of host memory for a KV page (%zu bytes)", p->who, bytes);
    return KVGEN_OK;
}

/* Moves token slots ascending, so a move towards the start of one table never reads a slot it
 * has already overwritten. Re-rotating K by delta is RoPE's addition law: rotating by pos then
 * by delta is rotating by pos + delta, up to rounding. */
kvgen_status kvg_cpu_pages_copy(const kvg_cpu_pages *p, const int32_t *src_pages, int src_pos,
                                const int32_t *dst_pages, int dst_pos, int n, int rope_delta, kvgen_error *err) {
    (void)err;
    const kvg_hparams *hp = &p->hp;
    size_t bytes = (size_t)hp->head_dim * sizeof(float);
    for (int sl = 0; sl < hp->n_layer; sl++) {
        int l = p->layers[sl];
        for (int h = 0; h < hp->n_head_kv; h++)
            for (int i = 0; i < n; i++) {
                float *k = kvg_cpu_pages_at(p, dst_pages, l, 0, h, dst_pos + i);
                memmove(k, kvg_cpu_pages_at(p, src_pages, l, 0, h, src_pos + i), bytes);
                memmove(kvg_cpu_pages_at(p, dst_pages, l, 1, h, dst_pos + i),
                        kvg_cpu_pages_at(p, src_pages, l, 1, h, src_pos + i), bytes);
                if (rope_delta != 0) {
                    /* a pure rotation: the attention factor is in the key already */
                    kvg_ref_rope_params r = p->rope ? p->rope[l] : (kvg_ref_rope_params){0};
                    r.attn_factor = 0.0f;
                    if (p->rope) kvg_ref_rope_apply(&r, k, rope_delta);
                    else kvg_ref_rope(k, hp->n_rot, rope_delta, hp->rope_freq_base);
                }
            }
    }
    return KVGEN_OK;
}

kvgen_status kvg_cpu_pages_read(const kvg_cpu_pages *p, const int32_t *pages, int layer, int which, int pos0, int n,
                                float *out, kvgen_error *err) {
    (void)err;
    size_t hd = (size_t)p->hp.head_dim;
    for (int h = 0; h < p->hp.n_head_kv; h++)
        for (int i = 0; i < n; i++)
            memcpy(out + ((size_t)h * n + i) * hd, kvg_cpu_pages_at(p, pages, layer, which, h, pos0 + i),
                   hd * sizeof(float));
    return KVGEN_OK;
}

kvgen_status kvg_cpu_pages_write(const kvg_cpu_pages *p, const int32_t *pages, int layer, int which, int pos0, int n,
                                 const float *in, kvgen_error *err) {
    (void)err;
    size_t hd = (size_t)p->hp.head_dim;
    for (int h = 0; h < p->hp.n_head_kv; h++)
        for (int i = 0; i < n; i++)
            memcpy(kvg_cpu_pages_at(p, pages, layer, which, h, pos0 + i), in + ((size_t)h * n + i) * hd,
                   hd * sizeof(float));
    return KVGEN_OK;
}
