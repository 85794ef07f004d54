/* test_vk_model.c: the whole forward pass on the Vulkan backend against the CPU reference.
 * Random-weight models of several shapes and every tensor type the backend runs (the K types
 * and llama.cpp's Q4_K_M mix too, on three shapes): every matrix uploaded in its tensors' own
 * types (a mixed Q/K/V group as parts of each member's type, through kvg_vk_model_parts) and
 * exactly the file's bytes; logits of a prefill
 * (every position) and of 32 decode steps within tolerance of the reference; the K/V cache as
 * read back; cached decode equal to uncached recomputation on the device; prompts split into
 * several chunks and weight matrices split into several buffers. On the default model (skipped
 * when absent): top-1 agreement at >= 99% of a 256-token teacher-forced sequence and the same
 * greedy 64-token continuation of "The capital of France is".
 * Tolerance: |vulkan - reference| <= 0.02 + 0.01 * max|logit| per logit (the KV cache is f16 and
 * sums run in a different order); 5x tighter with force_f32. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_gguf.h"
#include "kvg_model.h"
#include "kvg_quant.h"
#include "kvg_session.h"
#include "kvg_vk.h"
#include "kvg_vk_backend.h"
#include "testutil.h"

static kvgen_model *load(const char *path, kvgen_backend backend, int force_f32) {
    kvgen_model_desc d = {.path = path, .backend = backend, .force_f32 = force_f32};
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvgen_model_load(&d, &m, &err);
    CHECKF(st == KVGEN_OK, "load %s: %s", path, err.message);
    return m;
}

static double max_abs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(a[i]) > m) m = fabs(a[i]);
    return m;
}

/* worst |a-b| relative to the tolerance: <= 1 passes */
static double excess(const float *a, const float *b, size_t n, double rel) {
    double tol = rel * (2.0 + max_abs(b, n)), worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / tol;
        if (!(d <= worst)) worst = d; /* NaN counts as a failure */
    }
    return worst;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* Groups seen whose members differ in type (check_parts), over the whole test */
static int mixed_groups;

/* one matrix's parts as uploaded: `n` members of `nrows` rows each (concatenated, or with
 * interleave alternating rows); every part lies in members of its own type, or for an
 * interleaved group of mixed types is Q8_0 / F32; the parts cover the rows in order. Adds the
 * uploaded and the file's bytes. */
static void check_matrix(kvgen_model *mv, const char *name, int l, const char *which, const kvg_tensor *const *mem,
                         int n, bool interleave, uint64_t *up_bytes, uint64_t *file_bytes) {
    kvg_vk_part_info parts[64];
    int np = kvg_vk_model_parts(mv, l, which, parts, 64);
    CHECKF(np > 0 && np <= 64, "%s: %s of layer %d: %d parts", name, which, l, np);
    if (np <= 0 || np > 64) return;
    uint64_t K = mem[0]->ne[0], next = 0;
    bool mixed = false;
    for (int i = 0; i < n; i++) {
        mixed |= mem[i]->type != mem[0]->type;
        *file_bytes += mem[i]->nbytes;
    }
    mixed_groups += mixed;
    for (int p = 0; p < np; p++) {
        *up_bytes += parts[p].bytes;
        CHECKF(parts[p].row0 == next, "%s: %s of layer %d: part %d starts at row %u, want %llu", name, which, l, p,
               parts[p].row0, (unsigned long long)next);
        next = (uint64_t)parts[p].row0 + parts[p].rows;
        uint32_t want = mem[0]->type;
        if (interleave && mixed) {
            bool q8 = K % 32 == 0;
            for (int i = 0; i < n; i++)
                q8 = q8 && (mem[i]->type == KVG_TYPE_Q8_0 || mem[i]->type == KVG_TYPE_Q5_0 ||
                            mem[i]->type == KVG_TYPE_Q4_0);
            want = q8 ? KVG_TYPE_Q8_0 : KVG_TYPE_F32;
        } else if (!interleave) { /* the member holding the part's first row; its last row's too */
            uint64_t r0 = parts[p].row0, r1 = r0 + parts[p].rows - 1, start = 0;
            int first = -1, last = -1;
            for (int i = 0; i < n; i++) {
                uint64_t rows = mem[i]->n_elements / K;
                if (r0 >= start && r0 < start + rows) first = i;
                if (r1 >= start && r1 < start + rows) last = i;
                start += rows;
            }
            CHECK(first >= 0 && last >= first);
            if (first < 0 || last < first) return;
            want = mem[first]->type;
            for (int i = first; i <= last; i++)
                CHECKF(mem[i]->type == want, "%s: %s of layer %d: part %d spans %s and %s rows", name, which, l, p,
                       kvg_type_name(want), kvg_type_name(mem[i]->type));
        }
        CHECKF(parts[p].type == want, "%s: %s of layer %d: part %d (rows %u + %u) uploaded as %s, want %s", name,
               which, l, p, parts[p].row0, parts[p].rows, kvg_type_name(parts[p].type), kvg_type_name(want));
    }
    uint64_t total = 0;
    for (int i = 0; i < n; i++) total += mem[i]->n_elements / K;
    CHECKF(next == total, "%s: %s of layer %d: parts cover %llu of %llu rows", name, which, l,
           (unsigned long long)next, (unsigned long long)total);
}

/* every matrix of a Vulkan model uploaded in its tensors' own types (check_matrix); returns
 * uploaded bytes / the file's bytes of those matrices */
static double check_parts(kvgen_model *mv, const char *name) {
    const kvg_weights *w = &mv->w;
    uint64_t up = 0, file = 0;
    check_matrix(mv, name, 0, "token_embd", &w->tok_embd, 1, false, &up, &file);
    if (w->output != w->tok_embd) check_matrix(mv, name, 0, "output", &w->output, 1, false, &up, &file);
    for (int l = 0; l < w->hp.n_layer; l++) {
        const kvg_layer *L = &w->layers[l];
        const kvg_tensor *qkv[3] = {L->wq, L->wk, L->wv}, *gu[2] = {L->w_gate, L->w_up};
        check_matrix(mv, name, l, "attn_qkv", qkv, 3, false, &up, &file);
        check_matrix(mv, name, l, "attn_output", &L->wo, 1, false, &up, &file);
        check_matrix(mv, name, l, "ffn_gate_up", gu, 2, true, &up, &file);
        check_matrix(mv, name, l, "ffn_down", &L->w_down, 1, false, &up, &file);
    }
    CHECK(kvg_vk_model_parts(mv, w->hp.n_layer, "attn_qkv", NULL, 0) == -1);
    CHECK(kvg_vk_model_parts(mv, 0, "attn_qkvx", NULL, 0) == -1);
    return file ? (double)up / (double)file : 0;
}

/* the file at `path` (taken: freed here) on both backends */
static void compare_file(const char *name, char *path, int force_f32, int n_prompt, int n_decode) {
    CHECK(path != NULL);
    if (!path) return;
    kvgen_model *mr = load(path, KVGEN_BACKEND_REFERENCE, 0), *mv = load(path, KVGEN_BACKEND_VULKAN, force_f32);
    if (!mr || !mv) goto done;
    kvgen_model_info info;
    kvgen_model_get_info(mv, &info);
    CHECK(strcmp(info.backend, "vulkan") == 0);
    int V = info.n_vocab;
    double rel = force_f32 ? 0.002 : 0.01;
    double up_ratio = check_parts(mv, name);
    printf("%s: weights uploaded in their own types, %.4f x the file's bytes\n", name, up_ratio);
    /* a repacked block is the GGUF block's bytes; buffers are rounded up to the device's
     * alignment (measured at most 1.02x, split matrices); F32 for a mixed group would be 4-8x,
     * Q8_0 for Q5_0 members 1.5x */
    CHECKF(up_ratio >= 1.0 && up_ratio <= 1.05, "%s: %.4f x the file's bytes uploaded", name, up_ratio);
    kvgen_session *sr = NULL, *sv = NULL, *su = NULL;
    int n_ctx = n_prompt + n_decode > 256 ? n_prompt + n_decode : 256;
    kvgen_session_desc sd = {.n_ctx = n_ctx};
    kvgen_session_desc ud = {.n_ctx = n_ctx, .no_cache = 1};
    CHECK_OK(kvgen_session_create(mr, &sd, &sr, &tu_err_));
    CHECK_OK(kvgen_session_create(mv, &sd, &sv, &tu_err_));
    CHECK_OK(kvgen_session_create(mv, &ud, &su, &tu_err_));
    if (!sr || !sv || !su) goto sessions;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n_prompt);
    for (int i = 0; i < n_prompt; i++) toks[i] = (int32_t)((i * 7919 + 13) % V);
    float *lr = malloc(sizeof(float) * (size_t)n_prompt * V), *lv = malloc(sizeof(float) * (size_t)n_prompt * V);
    CHECK_OK(kvgen_session_prefill(sr, toks, (size_t)n_prompt, lr, &tu_err_));
    CHECK_OK(kvgen_session_prefill(sv, toks, (size_t)n_prompt, lv, &tu_err_));
    CHECK_OK(kvgen_session_prefill(su, toks, (size_t)n_prompt, NULL, &tu_err_));
    double e = excess(lv, lr, (size_t)n_prompt * V, rel);
    CHECKF(e <= 1.0, "%s: prefill logits off by %.2f x tolerance", name, e);
    double worst_dec = 0, worst_unc = 0;
    for (int s = 0; s < n_decode; s++) {
        int32_t t = (int32_t)argmax(kvgen_session_logits(sr), V);
        CHECK_OK(kvgen_session_decode(sr, t, &tu_err_));
        CHECK_OK(kvgen_session_decode(sv, t, &tu_err_));
        CHECK_OK(kvgen_session_decode(su, t, &tu_err_));
        const float *a = kvgen_session_logits(sv), *b = kvgen_session_logits(sr), *u = kvgen_session_logits(su);
        if (!a || !b || !u) break;
        double d = excess(a, b, (size_t)V, rel);
        if (d > worst_dec) worst_dec = d;
        /* cached vs uncached on the device: the same f16 cache contents, only sum order differs */
        d = excess(a, u, (size_t)V, rel * 0.2);
        if (d > worst_unc) worst_unc = d;
    }
    printf("%s%s: worst |vulkan - reference| / tolerance: prefill %.3f, decode %.3f, cached vs uncached %.3f\n",
           name, force_f32 ? " (f32 KV)" : "", e, worst_dec, worst_unc);
    CHECKF(worst_dec <= 1.0, "%s: decode logits off by %.2f x tolerance", name, worst_dec);
    CHECKF(worst_unc <= 1.0, "%s: cached vs uncached decode differ by %.2f x tolerance", name, worst_unc);
    /* the cache as the seed sees past_key_values */
    kvgen_cache_info ci;
    kvgen_session_cache_info(sv, &ci);
    CHECK(ci.length == (size_t)(n_prompt + n_decode));
    size_t nf = (size_t)ci.n_head_kv * ci.length * ci.head_dim;
    float *kr = malloc(nf * sizeof(float)), *kv = malloc(nf * sizeof(float));
    for (int layer = 0; layer < ci.n_layer; layer += ci.n_layer - 1 > 0 ? ci.n_layer - 1 : 1)
        for (int which = 0; which < 2; which++) {
            CHECK_OK(kvgen_session_read_cache(sr, layer, which, kr, nf, &tu_err_));
            CHECK_OK(kvgen_session_read_cache(sv, layer, which, kv, nf, &tu_err_));
            double ce = excess(kv, kr, nf, rel * 0.5);
            CHECKF(ce <= 1.0, "%s: cache layer %d %s off by %.2f x tolerance", name, layer, which ? "V" : "K", ce);
        }
    free(kr);
    free(kv);
    free(toks);
    free(lr);
    free(lv);
sessions:
    kvgen_session_close(sr);
    kvgen_session_close(sv);
    kvgen_session_close(su);
    CHECKF(kvg_vk_validation_count(kvg_vk_model_ctx(mv)) == 0, "%s: validation messages", name);
done:
    kvgen_model_unload(mr);
    kvgen_model_unload(mv);
    free(path);
}

typedef struct requant_ctx {
    const char *suffix;
    uint32_t type;
} requant_ctx;

/* tensors with names ending in the suffix requantized to the type, the rest as they are */
static void requant_tensor(kvg_gguf_writer *w, const kvg_tensor *t, const void *ctx) {
    const requant_ctx *r = ctx;
    size_t n = strlen(t->name), ns = strlen(r->suffix);
    if (n < ns || strcmp(t->name + n - ns, r->suffix) != 0) {
        kvg_gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->nbytes);
        return;
    }
    float *f = malloc(t->n_elements * sizeof *f);
    size_t nb = kvg_row_bytes(r->type, t->n_elements);
    void *q = malloc(nb);
    kvg_dequantize_row(t->type, t->data, f, t->n_elements);
    kvg_quantize_row(r->type, f, q, t->n_elements);
    kvg_gguf_add_tensor(w, t->name, r->type, t->n_dims, t->ne, q, nb);
    free(f);
    free(q);
}

/* a copy of `src` whose tensors with names ending in `suffix` are requantized to `type` */
static char *requant(const char *src_path, const char *out_name, const char *suffix, uint32_t type) {
    requant_ctx r = {suffix, type};
    return tu_gguf_rewrite(src_path, out_name, &(tu_gguf_edit){.tensor = requant_tensor, .ctx = &r});
}

/* compare_file on a file made by requant() */
static void compare_requant(const char *name, const char *args, const char *suffix, uint32_t type) {
    char *src = tu_make_model("vk_rq_src.gguf", args);
    char *path = src ? requant(src, name, suffix, type) : NULL;
    CHECK(path != NULL);
    free(src);
    compare_file(name, path, 0, 23, 16);
}

static void compare_model(const char *name, const char *args, int force_f32, int n_prompt, int n_decode) {
    compare_file(name, tu_make_model(name, args), force_f32, n_prompt, n_decode);
}

/* A GPU's decode attention splits (kvg_vk_attn_splits) on lavapipe: the cooperative layouts with
 * KVGEN_VK_COMPUTE_UNITS planning for 132 units (an H100's SMs) and for 20. Two KV heads want 132
 * and 20 splits: 64 (the most) and 20, of at least 64 positions each, so a 200-token prompt's
 * decodes run 4 splits with work and the rest empty, merged by attn_reduce. Same tolerance. */
static void gpu_splits_model(void) {
    static const char *const units[] = {"132", "20"};
    static const uint32_t splits[] = {64, 20};
    const char *args = "--type Q8_0 --seed 5 --embd 96 --heads 6 --kv-heads 2 --ff 160 --vocab-size 1000";
    setenv("KVGEN_VK_LANE", "0", 1);
    setenv("KVGEN_VK_ATTN_LANE", "0", 1);
    for (int i = 0; i < 2; i++) {
        setenv("KVGEN_VK_COMPUTE_UNITS", units[i], 1);
        char name[32];
        snprintf(name, sizeof name, "vk_splits%d.gguf", i);
        compare_model(name, args, 0, 200, 12);
        char *path = tu_make_model(name, args);
        kvgen_model *mv = path ? load(path, KVGEN_BACKEND_VULKAN, 0) : NULL;
        const vk_model *vm = mv ? mv->backend : NULL;
        CHECKF(vm && vm->ctx->info.compute_units == (uint32_t)atoi(units[i]), "splits %s: compute units not set",
               units[i]);
        CHECKF(vm && vm->nsplit == splits[i] && kvg_vk_attn_split_min(vm->ctx) == 64,
               "splits %s: %u splits of >= %u positions", units[i], vm ? vm->nsplit : 0,
               vm ? kvg_vk_attn_split_min(vm->ctx) : 0);
        kvgen_model_unload(mv);
        free(path);
    }
    unsetenv("KVGEN_VK_COMPUTE_UNITS");
    unsetenv("KVGEN_VK_LANE");
    unsetenv("KVGEN_VK_ATTN_LANE");
}

/* A GPU's prefill steps on lavapipe: 512 tokens (prefill_chunk; KVGEN_VK_CHUNK=512, the
 * cooperative layouts), so a 600-token prompt is a step of 512 and one of 88, against the
 * reference. Without the variable a CPU device (lavapipe) steps 128 tokens, a GPU 512. Same
 * tolerance. */
static void gpu_steps_model(void) {
    const char *args = "--mix q4_k_m --seed 38 --embd 256 --heads 4 --kv-heads 2 --ff 512 --layers 2 --vocab-size 1000";
    char *path = tu_make_model("vk_steps.gguf", args);
    kvgen_model *mv = path ? load(path, KVGEN_BACKEND_VULKAN, 0) : NULL;
    const vk_model *vm = mv ? mv->backend : NULL;
    bool cpu = vm && vm->ctx->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    CHECKF(vm && vm->chunk == (cpu ? 128u : 512u), "a %s device's prefill step is %u tokens, want %u",
           cpu ? "CPU" : "GPU", vm ? vm->chunk : 0, cpu ? 128u : 512u);
    kvgen_model_unload(mv);
    setenv("KVGEN_VK_LANE", "0", 1);
    setenv("KVGEN_VK_ATTN_LANE", "0", 1);
    setenv("KVGEN_VK_CHUNK", "512", 1);
    mv = path ? load(path, KVGEN_BACKEND_VULKAN, 0) : NULL;
    vm = mv ? mv->backend : NULL;
    CHECKF(vm && vm->chunk == 512, "KVGEN_VK_CHUNK=512: prefill steps of %u tokens", vm ? vm->chunk : 0);
    /* lavapipe's 32 KiB of shared memory hold the GEMM's 128 x 64 tiles (a device with
     * cooperative matrices takes gemm_cm instead, whose tile follows the matrices' shape) */
    int wide = 0;
    for (int p = 0; vm && p < vm->ctx->n_pipes; p++)
        wide += strncmp(vm->ctx->pipes[p].name, "gemm_", 5) == 0 && vm->ctx->pipes[p].spec[KVG_SPEC_ROWS] == 128 &&
                vm->ctx->pipes[p].spec[KVG_SPEC_NCOLS] == 64;
    CHECKF(!vm || vm->gemm_coop || vm->ctx->info.max_shared_memory < 25344 || wide > 0, "no GEMM of 128 x 64 tiles");
    kvgen_model_unload(mv);
    compare_file("vk_steps.gguf", path, 0, 600, 8);
    unsetenv("KVGEN_VK_CHUNK");
    unsetenv("KVGEN_VK_LANE");
    unsetenv("KVGEN_VK_ATTN_LANE");
}

/* The tiled-GEMM cases' model: a Q4_K_M mix, the lane kernels off (the cooperative layouts,
 * where the prefill GEMMs are chosen); NULL where it could not be made */
static char *gemm_model(const char *name, int seed) {
    char args[200];
    snprintf(args, sizeof args,
             "--mix q4_k_m --seed %d --embd 256 --heads 4 --kv-heads 2 --ff 512 --layers 2 --vocab-size 1000", seed);
    setenv("KVGEN_VK_LANE", "0", 1);
    setenv("KVGEN_VK_ATTN_LANE", "0", 1);
    return tu_make_model(name, args);
}

/* A load's GEMM pipelines whose name starts with prefix (and whose tile has that many rows, where
 * rows is not 0); the other GEMM pipelines are counted in *other */
static int count_gemm(const vk_model *vm, const char *prefix, uint32_t rows, int *other) {
    int n = 0;
    *other = 0;
    for (int p = 0; vm && p < vm->ctx->n_pipes; p++) {
        const char *name = vm->ctx->pipes[p].name;
        if (strncmp(name, prefix, strlen(prefix)) == 0)
            n += !rows || vm->ctx->pipes[p].spec[KVG_SPEC_ROWS] == rows;
        else
            *other += strncmp(name, "gemm_", 5) == 0;
    }
    return n;
}

/* A GPU's prefill GEMM on lavapipe: f16 tiles in double-buffered shared memory (gemm_h_<type>,
 * KVGEN_VK_HALF=1 on the cooperative layouts) in both tile shapes (128 x 64; 64 x 32 under a
 * 16 KiB shared-memory limit), a Q4_K_M mix model against the reference: a 150-token prompt (a
 * step of 128 and one of 22) and decodes. Same tolerance. lavapipe, a CPU device, keeps the f32
 * tiles without the variable; a GPU takes the f16 ones. */
static void half_model(void) {
    char *path = gemm_model("vk_half.gguf", 41);
    kvgen_model *mv = path ? load(path, KVGEN_BACKEND_VULKAN, 0) : NULL;
    const vk_model *vm = mv ? mv->backend : NULL;
    bool cpu = vm && vm->ctx->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    CHECKF(vm && vm->gemm_half == !cpu, "gemm_half %d on a %s device", vm ? vm->gemm_half : -1, cpu ? "CPU" : "GPU");
    kvgen_model_unload(mv);
    setenv("KVGEN_VK_HALF", "1", 1);
    setenv("KVGEN_VK_COOPMAT", "0", 1); /* a GPU with cooperative matrices would take those first */
    for (int small = 0; small < 2; small++) {
        if (small) setenv("KVGEN_VK_MAX_SHARED", "16384", 1);
        mv = path ? load(path, KVGEN_BACKEND_VULKAN, 0) : NULL;
        vm = mv ? mv->backend : NULL;
        CHECKF(vm && vm->gemm_half, "KVGEN_VK_HALF=1: gemm_half off");
        int other, half = count_gemm(vm, "gemm_h_", small ? 64 : 128, &other);
        uint32_t want_rows = small ? 64 : 128;
        CHECKF(!vm || (half >= 2 && other == 0), "KVGEN_VK_HALF=1%s: %d gemm_h pipelines of %u rows, %d others",
               small ? " (16 KiB)" : "", half, want_rows, other);
        kvgen_model_unload(mv);
        char *copy = path ? strdup(path) : NULL;
        compare_file("vk_half.gguf", copy, 0, small ? 70 : 150, 4);
    }
    unsetenv("KVGEN_VK_MAX_SHARED");
    unsetenv("KVGEN_VK_HALF");
    unsetenv("KVGEN_VK_COOPMAT");
    unsetenv("KVGEN_VK_LANE");
    unsetenv("KVGEN_VK_ATTN_LANE");
    free(path);
}

/* the prefill GEMM on cooperative matrices (gemm_cm_<type>): a CPU device that offers them
 * (Mesa 26's lavapipe) keeps the lane mat-vec and does not choose them, a GPU does; with
 * KVGEN_VK_COOPMAT=1 and the cooperative kernels, a Q4_K_M mix model against the reference at
 * the usual tolerance. Where the device (or the build) has none, the load must say so by not
 * choosing them even when asked */
static void matrix_model(void) {
    char *path = gemm_model("vk_matrix.gguf", 43);
    kvgen_model *mv = path ? load(path, KVGEN_BACKEND_VULKAN, 0) : NULL;
    const vk_model *vm = mv ? mv->backend : NULL;
    bool offered = vm && vm->ctx->coopmat, cpu = vm && vm->ctx->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    CHECKF(vm && vm->gemm_coop == (offered && !cpu), "gemm_coop %d on a %s device that offers them: %d",
           vm ? vm->gemm_coop : -1, cpu ? "CPU" : "GPU", offered);
    kvgen_model_unload(mv);
    setenv("KVGEN_VK_COOPMAT", "1", 1);
    mv = path ? load(path, KVGEN_BACKEND_VULKAN, 0) : NULL;
    vm = mv ? mv->backend : NULL;
    CHECKF(vm && vm->gemm_coop == offered, "KVGEN_VK_COOPMAT=1: gemm_coop %d, device offers %d",
           vm ? vm->gemm_coop : -1, offered);
    int other, matrix = count_gemm(vm, "gemm_cm_", 0, &other);
    if (vm && offered) { /* four subgroups past the device's workgroup limit: the f16 tiles instead */
        uint32_t *inv = &vm->ctx->props.limits.maxComputeWorkGroupInvocations, saved = *inv;
        CHECK(kvg_vk_gemm_cm_fits(vm->ctx));
        *inv = 4 * vm->ctx->info.subgroup_size - 1;
        CHECK(!kvg_vk_gemm_cm_fits(vm->ctx));
        *inv = saved;
    }
    CHECKF(!vm || (offered ? matrix >= 2 && other == 0 : matrix == 0),
           "KVGEN_VK_COOPMAT=1: %d gemm_cm pipelines, %d others (device offers: %d)", matrix, other, offered);
    kvgen_model_unload(mv);
    if (offered) {
        char *copy = path ? strdup(path) : NULL;
        compare_file("vk_matrix.gguf", copy, 0, 150, 4);
    } else {
        printf("cooperative-matrix GEMM: not offered here; the model case is skipped\n");
    }
    unsetenv("KVGEN_VK_COOPMAT");
    unsetenv("KVGEN_VK_LANE");
    unsetenv("KVGEN_VK_ATTN_LANE");
    free(path);
}

/* 8-bit activations (activation_bits = 8): the one-token mat-vecs and the prefill GEMMs by
 * integer dot products (matvec_dot_<type>, gemm_dot_<type>) on the cooperative layouts.
 * lavapipe does not report them accelerated, so the load keeps the f32 kernels there unless
 * KVGEN_VK_DOT=1. Against the reference (exact activations), a 20-token prompt, 16 decodes and
 * 4 batched steps of 3 sessions of a Q4_K_M mix model: logits within 3% of (2 + the
 * reference's largest magnitude), the 8-bit input's rounding */
static void dot_model(void) {
    const char *args = "--mix q4_k_m --seed 39 --embd 256 --heads 4 --kv-heads 2 --ff 512 --layers 2 --vocab-size 1000";
    char *path = tu_make_model("vk_dot.gguf", args);
    if (!path) return;
    setenv("KVGEN_VK_LANE", "0", 1);
    setenv("KVGEN_VK_ATTN_LANE", "0", 1);
    kvgen_model_desc d = {.path = path, .backend = KVGEN_BACKEND_VULKAN, .activation_bits = 8};
    kvgen_model *mv = NULL, *mr = load(path, KVGEN_BACKEND_REFERENCE, 0);
    CHECK_OK(kvgen_model_load(&d, &mv, &tu_err_));
    const vk_model *vm = mv ? mv->backend : NULL;
    bool can = vm && vm->ctx->int_dot && vm->subgroup;
    CHECKF(!vm || vm->act8_dot == (can && vm->ctx->int_dot_fast),
           "activation_bits 8: act8_dot %d, device dot %d fast %d", vm ? vm->act8_dot : -1,
           vm ? vm->ctx->int_dot : -1, vm ? vm->ctx->int_dot_fast : -1);
    kvgen_model_unload(mv);
    mv = NULL;
    setenv("KVGEN_VK_DOT", "1", 1);
    CHECK_OK(kvgen_model_load(&d, &mv, &tu_err_));
    vm = mv ? mv->backend : NULL;
    CHECKF(!vm || vm->act8_dot == can, "KVGEN_VK_DOT=1: act8_dot %d, device dot %d", vm ? vm->act8_dot : -1,
           vm ? vm->ctx->int_dot : -1);
    int n_mv = 0, n_gemm = 0;
    for (int p = 0; vm && p < vm->ctx->n_pipes; p++) {
        n_mv += strncmp(vm->ctx->pipes[p].name, "matvec_dot_", 11) == 0;
        n_gemm += strncmp(vm->ctx->pipes[p].name, "gemm_dot_", 9) == 0;
    }
    CHECKF(!can || (n_mv >= 2 && n_gemm >= 2), "%d matvec_dot and %d gemm_dot pipelines (Q4_K and Q6_K expected)", n_mv,
           n_gemm);
    kvgen_session *sr = NULL, *sv = NULL;
    kvgen_session_desc sd = {.n_ctx = 64};
    if (mr && mv) {
        CHECK_OK(kvgen_session_create(mr, &sd, &sr, &tu_err_));
        CHECK_OK(kvgen_session_create(mv, &sd, &sv, &tu_err_));
    }
    if (sr && sv) {
        int32_t toks[20];
        for (int i = 0; i < 20; i++) toks[i] = (int32_t)((i * 7919 + 13) % 1000);
        CHECK_OK(kvgen_session_prefill(sr, toks, 20, NULL, &tu_err_));
        CHECK_OK(kvgen_session_prefill(sv, toks, 20, NULL, &tu_err_));
        /* the prompt's step of 20 tokens runs the GEMMs */
        double worst = kvgen_session_logits(sv) && kvgen_session_logits(sr)
                           ? excess(kvgen_session_logits(sv), kvgen_session_logits(sr), 1000, 0.03)
                           : 2.0;
        for (int s = 0; s < 16; s++) {
            int32_t t = (int32_t)argmax(kvgen_session_logits(sr), 1000);
            CHECK_OK(kvgen_session_decode(sr, t, &tu_err_));
            CHECK_OK(kvgen_session_decode(sv, t, &tu_err_));
            const float *a = kvgen_session_logits(sv), *b = kvgen_session_logits(sr);
            if (!a || !b) break;
            double e = excess(a, b, 1000, 0.03);
            if (e > worst) worst = e;
        }
        /* batched steps (the 8-column mat-vecs): this session and two forks of it, each given
         * its own token, against the reference's sessions decoded one by one */
        kvgen_session *bv[3] = {sv, NULL, NULL}, *br[3] = {sr, NULL, NULL};
        for (int i = 1; i < 3; i++) {
            CHECK_OK(kvgen_session_fork(sv, &bv[i], &tu_err_));
            CHECK_OK(kvgen_session_fork(sr, &br[i], &tu_err_));
        }
        for (int step = 0; step < 4 && bv[1] && bv[2] && br[1] && br[2]; step++) {
            int32_t toks[3];
            kvgen_status status[3];
            kvgen_error errs[3];
            for (int i = 0; i < 3; i++) {
                toks[i] = (int32_t)((step * 31 + i * 257 + 5) % 1000);
                CHECK_OK(kvgen_session_decode(br[i], toks[i], &tu_err_));
            }
            kvgen_status st = kvg_session_decode_batch(bv, toks, 3, true, status, errs);
            CHECKF(st == KVGEN_OK, "8-bit activations: batch step %d: %s", step, errs[0].message);
            for (int i = 0; st == KVGEN_OK && i < 3; i++) {
                double e = excess(kvgen_session_logits(bv[i]), kvgen_session_logits(br[i]), 1000, 0.03);
                if (e > worst) worst = e;
            }
        }
        for (int i = 1; i < 3; i++) {
            kvgen_session_close(bv[i]);
            kvgen_session_close(br[i]);
        }
        printf("vk_dot.gguf (8-bit activations, integer dot products %s): worst prefill, decode and batch |vulkan - "
               "reference| / tolerance %.3f\n",
               can ? "on" : "not offered", worst);
        CHECKF(worst <= 1.0, "8-bit activations: logits off by %.2f x tolerance", worst);
    }
    kvgen_session_close(sr);
    kvgen_session_close(sv);
    CHECKF(!mv || kvg_vk_validation_count(kvg_vk_model_ctx(mv)) == 0, "vk_dot.gguf: validation messages");
    kvgen_model_unload(mr);
    kvgen_model_unload(mv);
    unsetenv("KVGEN_VK_DOT");
    unsetenv("KVGEN_VK_LANE");
    unsetenv("KVGEN_VK_ATTN_LANE");
    free(path);
}

/* The device's compute limits lowered (KVGEN_VK_MAX_*, docs/vulkan.md): at most 3 workgroups
 * per dispatch dimension, so nearly every dispatch is split into pieces (the 1000-row logits
 * mat-vec, the prefill's token columns, attention's heads and tokens), 128 invocations and 16 KiB
 * of shared memory (argmax and topk in their smaller variants); on the lane layout lavapipe
 * chooses, then on the cooperative mat-vec, GEMM and shared-memory attention. Same tolerance
 * as above. */
static void limits_model(void) {
    static const char *const layouts[][2] = {{NULL, NULL}, {"0", "0"}};
    setenv("KVGEN_VK_MAX_GROUP_COUNT", "3", 1);
    setenv("KVGEN_VK_MAX_SHARED", "16384", 1);
    setenv("KVGEN_VK_MAX_INVOCATIONS", "128", 1);
    for (int i = 0; i < 2; i++) {
        if (layouts[i][0]) {
            setenv("KVGEN_VK_LANE", layouts[i][0], 1);
            setenv("KVGEN_VK_ATTN_LANE", layouts[i][1], 1);
        }
        char name[32];
        snprintf(name, sizeof name, "vk_limits%d.gguf", i);
        compare_model(name, "--type Q8_0 --seed 9 --embd 96 --heads 6 --kv-heads 2 --ff 160 --vocab-size 1000", 0, 40,
                      8);
        /* the pieces were really there: a model loaded under the same limits splits its steps */
        char *path = tu_make_model(name, "--type Q8_0 --seed 9 --embd 96 --heads 6 --kv-heads 2 --ff 160 "
                                         "--vocab-size 1000");
        kvgen_model *mv = path ? load(path, KVGEN_BACKEND_VULKAN, 0) : NULL;
        kvg_vk_ctx *ctx = kvg_vk_model_ctx(mv);
        kvgen_session *s = NULL;
        kvgen_session_desc sd = {.n_ctx = 64};
        if (mv) CHECK_OK(kvgen_session_create(mv, &sd, &s, &tu_err_));
        int32_t toks[3] = {1, 2, 3};
        if (s) CHECK_OK(kvgen_session_prefill(s, toks, 3, NULL, &tu_err_));
        CHECKF(ctx && atomic_load(&ctx->split_dispatches) > 0, "limits %d: no dispatch was split", i);
        int gemm = 0, attn = 0, wide = 0;
        for (int p = 0; ctx && p < ctx->n_pipes; p++) {
            /* a tile's rows: the ROWS constant, or four matrices' rows for gemm_cm (64 at 16) */
            bool cm = strncmp(ctx->pipes[p].name, "gemm_cm_", 8) == 0;
            uint32_t rows = ctx->pipes[p].spec[KVG_SPEC_ROWS] * (cm ? 4u : 1u);
            gemm += strncmp(ctx->pipes[p].name, "gemm_", 5) == 0;
            wide += strncmp(ctx->pipes[p].name, "gemm_", 5) == 0 && (cm ? rows > 64 : rows != 64);
            attn += strcmp(ctx->pipes[p].name, "attn") == 0 || strcmp(ctx->pipes[p].name, "attn_sg") == 0;
        }
        if (layouts[i][0]) CHECKF(gemm > 0 && attn > 0, "limits %d: the cooperative layout was not used", i);
        CHECKF(wide == 0, "limits %d: %d GEMMs of 128-row tiles in 16 KiB of shared memory", i, wide);
        CHECKF(ctx && ctx->props.limits.maxComputeWorkGroupCount[0] == 3 &&
                   ctx->props.limits.maxComputeSharedMemorySize <= 16384 &&
                   ctx->props.limits.maxComputeWorkGroupInvocations <= 128,
               "limits %d: the environment did not lower the limits", i);
        kvgen_session_close(s);
        kvgen_model_unload(mv);
        free(path);
    }
    unsetenv("KVGEN_VK_LANE");
    unsetenv("KVGEN_VK_ATTN_LANE");
    unsetenv("KVGEN_VK_MAX_GROUP_COUNT");
    unsetenv("KVGEN_VK_MAX_SHARED");
    unsetenv("KVGEN_VK_MAX_INVOCATIONS");
}

static void default_model(void) {
    const char *path = tu_model_path();
    if (!path) {
        fprintf(stderr, "default model absent: its checks are skipped\n");
        return;
    }
    kvgen_model *mr = load(path, KVGEN_BACKEND_REFERENCE, 0), *mv = load(path, KVGEN_BACKEND_VULKAN, 0);
    if (!mr || !mv) goto done;
    kvgen_model_info info;
    kvgen_model_get_info(mv, &info);
    int V2 = info.n_vocab;
    /* teacher forcing over 256 tokens of real text */
    const char *text =
        "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based inks and a wooden press adapted from those used for wine. Books became "
        "cheaper, literacy spread across Europe, and ideas travelled faster than ever before. Scholars could "
        "compare identical copies of a text, which changed how knowledge was checked and shared. Within fifty "
        "years, presses operated in more than two hundred cities, printing millions of volumes on law, medicine, "
        "religion and astronomy. Newspapers followed in the seventeenth century, and with them a public that "
        "expected to be informed. Today the same principle, many identical copies made cheaply, underlies the "
        "internet, where a page written once can be read by millions of people within minutes of its "
        "publication. Historians still debate which of these changes mattered most, and why they happened "
        "where they did. Meanwhile, in the kitchen of a small village inn, the cook was preparing a stew of "
        "beans, onions and smoked pork for the travellers who would arrive before nightfall. She had learned the "
        "recipe from her grandmother, who insisted that the secret was patience: the pot must never boil, only "
        "murmur, for three hours at least. Outside, the rain had stopped, and the innkeeper's son was leading "
        "two tired horses into the stable, talking to them softly about the road ahead and the mountains they "
        "would have to cross before the first snow closed the pass for the winter.";
    int32_t toks[512];
    size_t n = 0;
    CHECK_OK(kvgen_tokenize(mv, text, strlen(text), 0, toks, 512, &n, &tu_err_));
    if (n > 256) n = 256;
    CHECKF(n >= 200, "only %zu tokens", n);
    float *lr = malloc(sizeof(float) * n * (size_t)V2), *lv = malloc(sizeof(float) * n * (size_t)V2);
    kvgen_session *sr = NULL, *sv = NULL;
    kvgen_session_desc sd = {.n_ctx = 512};
    CHECK_OK(kvgen_session_create(mr, &sd, &sr, &tu_err_));
    CHECK_OK(kvgen_session_create(mv, &sd, &sv, &tu_err_));
    if (sr && sv) {
        CHECK_OK(kvgen_session_prefill(sr, toks, n, lr, &tu_err_));
        CHECK_OK(kvgen_session_prefill(sv, toks, n, lv, &tu_err_));
        size_t agree = 0;
        for (size_t i = 0; i < n; i++)
            agree += argmax(lr + i * V2, V2) == argmax(lv + i * V2, V2);
        fprintf(stderr, "default model: top-1 agreement %zu/%zu\n", agree, n);
        CHECKF(agree * 100 >= n * 99, "top-1 agreement %zu/%zu is below 99%%", agree, n);
        /* greedy continuation */
        kvgen_session_reset(sr);
        kvgen_session_reset(sv);
        const char *prompt = "The capital of France is";
        size_t np = 0;
        CHECK_OK(kvgen_tokenize(mv, prompt, strlen(prompt), KVGEN_TOKENIZE_ADD_BOS, toks, 512, &np, &tu_err_));
        CHECK_OK(kvgen_session_prefill(sr, toks, np, NULL, &tu_err_));
        CHECK_OK(kvgen_session_prefill(sv, toks, np, NULL, &tu_err_));
        int same = 0;
        for (int i = 0; i < 64; i++) {
            int a = argmax(kvgen_session_logits(sr), V2), b = argmax(kvgen_session_logits(sv), V2);
            if (a != b) break;
            same++;
            CHECK_OK(kvgen_session_decode(sr, a, &tu_err_));
            CHECK_OK(kvgen_session_decode(sv, b, &tu_err_));
        }
        CHECKF(same == 64, "greedy continuations diverge after %d tokens", same);
    }
    kvgen_session_close(sr);
    kvgen_session_close(sv);
    free(lr);
    free(lv);
    CHECKF(kvg_vk_validation_count(kvg_vk_model_ctx(mv)) == 0, "default model: validation messages");
done:
    kvgen_model_unload(mr);
    kvgen_model_unload(mv);
}

int main(void) {
    int n_dev = 0;
    kvgen_error err = {0};
    if (kvgen_devices(NULL, 0, &n_dev, &err) != KVGEN_OK || n_dev == 0) tu_skip("no Vulkan device");
    kvgen_device_info devs[8];
    CHECK_OK(kvgen_devices(devs, 8, &n_dev, &tu_err_));
    int n_default = 0;
    for (int i = 0; i < n_dev && i < 8; i++) {
        n_default += devs[i].is_default;
        CHECK(devs[i].name[0] != '\0' && devs[i].type != NULL && devs[i].max_storage_buffer_range > 0);
    }
    CHECK(n_default == 1);

    compare_model("vk_f32.gguf", "--type F32 --seed 1", 0, 40, 32);
    compare_model("vk_f16.gguf", "--type F16 --seed 2 --embd 96 --heads 6 --kv-heads 2 --ff 160 --untied", 0, 37, 32);
    compare_model("vk_bf16.gguf", "--type BF16 --seed 3 --embd 128 --heads 2 --kv-heads 1 --ff 96", 0, 9, 32);
    compare_model("vk_q8.gguf", "--type Q8_0 --seed 4 --embd 96 --heads 6 --kv-heads 2 --ff 160 --layers 3", 0, 40,
                  32);
    compare_model("vk_q40.gguf", "--type Q4_0 --seed 5 --embd 128 --heads 8 --kv-heads 1 --ff 224 --untied", 0, 5, 32);
    compare_model("vk_q41.gguf", "--type Q4_1 --seed 6 --embd 64 --heads 4 --kv-heads 4 --ff 192", 0, 40, 32);
    compare_model("vk_q41f.gguf", "--type Q4_1 --seed 7 --embd 96 --heads 6 --kv-heads 2 --ff 160", 1, 40, 32);
    /* the types of real files: Q5_0/Q5_1/IQ4_NL in 32-element blocks, the 256-element K types
     * and IQ4_XS (rows multiples of 256), llama.cpp's Q4_K_M mix (Q4_K with Q6_K for the
     * output and some attn_v / ffn_down: mixed QKV groups), tied and untied; prefill + 16 decodes */
    compare_model("vk_q50.gguf", "--type Q5_0 --seed 11 --embd 96 --heads 6 --kv-heads 2 --ff 160", 0, 23, 16);
    compare_model("vk_q51.gguf", "--type Q5_1 --seed 12 --embd 64 --heads 4 --ff 192 --untied", 0, 23, 16);
    compare_model("vk_iq4nl.gguf", "--type IQ4_NL --seed 13 --embd 128 --heads 4 --kv-heads 2 --ff 96", 0, 23, 16);
    static const char *const ktypes[] = {"Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_XS"};
    for (int i = 0; i < 6; i++) {
        char name[64], args[256];
        snprintf(name, sizeof name, "vk_%s.gguf", ktypes[i]);
        snprintf(args, sizeof args, "--type %s --seed %d --embd 256 --ff 512 --heads 4 --kv-heads 2 --layers 2%s",
                 ktypes[i], 20 + i, i % 2 ? " --untied" : "");
        compare_model(name, args, 0, 23, 16);
    }
    /* the Q4_K_M mix on three shapes (one NEOX with biases), prefill + 32 decodes, f16 and f32
     * KV: the QKV groups of the layers with a Q6_K attn_v run as a Q4_K part and a Q6_K part
     * (check_parts), none of them as F32 */
    int mixed_before = mixed_groups;
    compare_model("vk_q4km.gguf", "--mix q4_k_m --seed 30 --embd 256 --ff 768 --heads 4 --kv-heads 2 --layers 3 --untied",
                  0, 29, 32);
    compare_model("vk_q4km_tied.gguf", "--mix q4_k_m --seed 31 --embd 256 --ff 512 --heads 4 --layers 2", 0, 29, 32);
    compare_model("vk_q4km_qwen.gguf", "--mix q4_k_m --arch qwen2 --qkv-bias --seed 36 --embd 512 --ff 1024 --heads 8 "
                  "--kv-heads 2 --layers 4 --untied", 0, 33, 32);
    compare_model("vk_q4km_f.gguf", "--mix q4_k_m --seed 37 --embd 256 --ff 768 --heads 4 --kv-heads 2 --layers 3",
                  1, 29, 32);
    CHECKF(mixed_groups - mixed_before == 5, "the Q4_K_M models had %d mixed-type groups, want 1 + 1 + 2 + 1",
           mixed_groups - mixed_before);
    /* real files' mixed QKV groups: Q5_0 attn_q/attn_k with a Q8_0 attn_v (a Q5_0 and a Q8_0 part) */
    compare_requant("vk_q50v8.gguf", "--type Q5_0 --seed 35 --embd 128 --heads 4 --kv-heads 2 --ff 160 --layers 2",
                    "attn_v.weight", KVG_TYPE_Q8_0);
    compare_model("vk_q4kf.gguf", "--type Q4_K --seed 32 --embd 256 --ff 512 --heads 4 --kv-heads 2 --layers 2", 1,
                  23, 16);
    compare_model("vk_q6kf.gguf", "--type Q6_K --seed 33 --embd 256 --ff 512 --heads 4 --layers 2 --untied", 1, 23, 16);
    /* several prefill chunks and weights split over several buffers */
    setenv("KVGEN_VK_CHUNK", "16", 1);
    setenv("KVGEN_VK_MAX_PART", "8192", 1);
    compare_model("vk_split.gguf", "--type Q8_0 --seed 8 --embd 96 --heads 6 --kv-heads 2 --ff 160 --untied", 0, 40,
                  8);
    /* the K types' rows (148-292 bytes) in parts of 192 rows; KV pages of 32 positions still fit */
    setenv("KVGEN_VK_MAX_PART", "32768", 1);
    compare_model("vk_split_k.gguf",
                  "--mix q4_k_m --seed 34 --embd 256 --ff 512 --heads 4 --kv-heads 2 --layers 2 --untied", 0, 40, 8);
    unsetenv("KVGEN_VK_CHUNK");
    unsetenv("KVGEN_VK_MAX_PART");
    limits_model();
    gpu_splits_model();
    gpu_steps_model();
    half_model();
    matrix_model();
    dot_model();
    default_model();
    return tu_finish("test_vk_model");
}
