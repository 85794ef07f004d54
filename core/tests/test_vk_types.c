/* test_vk_types.c: the Vulkan backend's weight-type table. Every row is a type of quant.c's traits
 * table (the backend dequantizes through it for mixed-type groups), its repacked block holds
 * exactly the GGUF block's bytes, its three shaders were built (shaders/CMakeLists.txt) with the
 * row's define, and every weight-type shader variant belongs to a row; the backend's
 * weight_types list is the table; the types of real files (Q5_0, the K types, IQ4) are rows. A
 * model with a tensor of a type the table lacks (Q8_K: a row of the traits table, which the
 * reference backend runs) is refused at the start of the backend's model_init, before any device
 * work, with a message listing the table's types, and so is loading it with KVGEN_BACKEND_VULKAN
 * (a type absent from the traits table too, IQ2_XXS, already when the model is described); the
 * upload path refuses such a type on its own too. The repack of every quantized row is checked
 * to keep each GGUF block's bytes: the repacked block's bits are a permutation of the GGUF
 * block's (same count of set bits, and a random block's every bit found by flipping it). A
 * concatenated group of tensors of different types (Q/K/V) keeps each member's type, one part
 * per run of one type (also when the buffer range cuts a run); an interleaved one (gate/up) of
 * different types is uploaded as Q8_0 where that is exact (Q4_0, Q5_0, Q8_0), else as F32. The
 * device-limits table has an entry for every embedded shader, agreeing with its workgroup size. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_backend.h"
#include "kvg_quant.h"
#include "../../shaders/kvg_shaders.h" /* the embedded SPIR-V table (not on the tests' include path) */
#include "kvg_vk.h"
#include "kvg_vk_backend.h" /* kvg_vk_upload_matrix */
#include "testutil.h"

/* the kernels compiled once per weight type, and what each adds to the type's define;
 * ints: only for the integer types (rows without pad); opt: only in a build whose shader
 * compiler supports the kernel (gemm_cm: GL_KHR_cooperative_matrix), then for every type */
static const struct {
    const char *name, *extra;
    bool ints, opt;
} kernels[] = {{"embed", "", false, false},
               {"matvec", "", false, false},
               {"gemm", "", false, false},
               {"gemm_h", ",HALF=1", false, false},
               {"gemm_cm", "", false, true},
               {"matvec_sg", ",SUBGROUP=1", false, false},
               {"matvec_dot", ",SUBGROUP=1,DOT=1", true, false},
               {"gemm_dot", ",DOT=1", true, false}};
#define N_KERNELS (sizeof kernels / sizeof kernels[0])

/* whether this build has the kernel (an optional one: its F32 variant) */
static bool kernel_built(size_t k) {
    char shader[64];
    snprintf(shader, sizeof shader, "%s_f32", kernels[k].name);
    return !kernels[k].opt || kvg_shader_find(shader) != NULL;
}

static void vk_list(char *buf, size_t size) {
    uint32_t types[64];
    size_t n = kvg_vulkan_backend.weight_types(types, 64);
    kvg_types_list(types, n < 64 ? n : 64, buf, size);
}

static void test_table(void) {
    size_t n = kvg_vk_wtype_count();
    CHECK(n > 0 && kvg_vk_wtype_at(n) == NULL);
    CHECK(kvg_vulkan_backend.weight_types != NULL);
    uint32_t listed[64];
    size_t nl = kvg_vulkan_backend.weight_types(listed, 64);
    CHECKF(nl == n, "weight_types gives %zu types, the table has %zu rows", nl, n);
    CHECK(kvg_vk_wtype_of(KVG_TYPE_F32) != NULL); /* interleaved mixed-type groups may be uploaded as F32 */
    for (size_t i = 0; i < n; i++) {
        const kvg_vk_wtype *r = kvg_vk_wtype_at(i);
        const char *name = kvg_type_name(r->type);
        CHECKF(i < nl && listed[i] == r->type, "row %zu (%s) is not weight_types[%zu]", i, name, i);
        CHECK(kvg_vk_wtype_of(r->type) == r);
        CHECK(kvg_backend_runs_type(&kvg_vulkan_backend, r->type));
        /* the traits table has the type: the two tables agree */
        CHECKF(kvg_type_traits_of(r->type) != NULL, "%s is in the Vulkan table but not in the traits table", name);
        CHECKF(kvg_backend_runs_type(&kvg_reference_backend, r->type), "%s: the reference backend lacks it", name);
        /* layout: whole shader blocks, and a repacked block is the GGUF block's bytes rearranged */
        uint32_t be = kvg_type_block_elems(r->type);
        CHECKF(be && r->block_elems % 32 == 0 && r->block_elems % be == 0, "%s: %u-element blocks", name,
               r->block_elems);
        CHECKF((size_t)r->qwords * 4 + (size_t)r->scale_halves * 2 == kvg_row_bytes(r->type, r->block_elems),
               "%s: %u quant words + %u scale halves per block, GGUF %zu bytes", name, r->qwords, r->scale_halves,
               kvg_row_bytes(r->type, r->block_elems));
        CHECKF(!r->pad || be == 1, "%s: only element-wise types may end a row in a partial block", name);
        CHECK(r->repack != NULL && r->suffix && r->define);
        char define[64];
        snprintf(define, sizeof define, "WTYPE_%s=1", name);
        CHECKF(strcmp(r->define, define) == 0, "%s: define %s", name, r->define);
        for (size_t k = 0; k < N_KERNELS; k++) {
            char shader[64], defines[96];
            snprintf(shader, sizeof shader, "%s_%s", kernels[k].name, r->suffix);
            snprintf(defines, sizeof defines, "%s%s", r->define, kernels[k].extra);
            const kvg_shader_blob *b = kvg_shader_find(shader);
            if (!kernel_built(k)) {
                CHECKF(b == NULL, "%s: %s without its F32 variant", name, shader);
                continue;
            }
            if (kernels[k].ints && r->pad) {
                CHECKF(b == NULL, "%s: a float type has the integer variant %s", name, shader);
                continue;
            }
            CHECKF(b != NULL, "%s: no shader %s (KVGEN_WEIGHT_TYPES in shaders/CMakeLists.txt)", name, shader);
            CHECKF(b && strcmp(b->defines, defines) == 0, "%s was compiled with '%s', the table says '%s'", shader,
                   b ? b->defines : "?", defines);
        }
    }
    /* the other way: every weight-type variant the build embedded has its row */
    int variants = 0, expected = 0;
    for (size_t j = 0; j < n; j++)
        for (size_t k = 0; k < N_KERNELS; k++)
            expected += kernel_built(k) && !(kernels[k].ints && kvg_vk_wtype_at(j)->pad);
    for (size_t i = 0; kvg_shader_at(i); i++) {
        const kvg_shader_blob *b = kvg_shader_at(i);
        if (!strstr(b->defines, "WTYPE_")) continue;
        variants++;
        bool found = false;
        for (size_t j = 0; j < n && !found; j++) {
            const kvg_vk_wtype *r = kvg_vk_wtype_at(j);
            for (size_t k = 0; k < N_KERNELS && !found; k++) {
                if ((kernels[k].ints && r->pad) || !kernel_built(k)) continue;
                char shader[64], defines[96];
                snprintf(shader, sizeof shader, "%s_%s", kernels[k].name, r->suffix);
                snprintf(defines, sizeof defines, "%s%s", r->define, kernels[k].extra);
                found = strcmp(shader, b->name) == 0 && strcmp(b->defines, defines) == 0;
            }
        }
        CHECKF(found, "shader %s (%s) has no row in the Vulkan weight-type table", b->name, b->defines);
    }
    CHECKF(variants == expected, "%d weight-type shader variants for %zu rows, %d expected", variants, n, expected);
    CHECK(kvg_shader_count() > (size_t)variants);
    static const uint32_t real_types[] = {KVG_TYPE_Q5_0, KVG_TYPE_Q5_1, KVG_TYPE_Q4_K, KVG_TYPE_Q5_K, KVG_TYPE_Q6_K,
                                          KVG_TYPE_Q2_K, KVG_TYPE_Q3_K, KVG_TYPE_IQ4_NL, KVG_TYPE_IQ4_XS};
    for (size_t i = 0; i < sizeof real_types / sizeof real_types[0]; i++)
        CHECKF(kvg_vk_wtype_of(real_types[i]) != NULL, "%s has no Vulkan row", kvg_type_name(real_types[i]));
    CHECK(kvg_vk_wtype_of(KVG_TYPE_Q8_K) == NULL && kvg_vk_wtype_of(16) == NULL && kvg_vk_wtype_of(1000) == NULL);
}

static int popcount8(uint8_t v) {
    int n = 0;
    for (; v; v &= (uint8_t)(v - 1)) n++;
    return n;
}

/* one row's repack into (quant, scale) regions of a one-row part */
static void repack_row(const kvg_vk_wtype *r, const uint8_t *src, uint32_t K, uint8_t *q, uint8_t *sc) {
    size_t nb = K / r->block_elems;
    memset(q, 0, nb * r->qwords * 4);
    memset(sc, 0, nb * r->scale_halves * 2);
    r->repack(r, src, K, (uint32_t *)(void *)q, sc);
}

/* Every quantized row's repack moves bits, never loses or invents one: for two blocks of
 * random bytes, flipping any single GGUF bit flips exactly one repacked bit, each GGUF bit a
 * different one (a bijection, so a repacked block is exactly the GGUF block's bytes). */
static void test_repack_bijective(void) {
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < kvg_vk_wtype_count(); i++) {
        const kvg_vk_wtype *r = kvg_vk_wtype_at(i);
        if (r->pad) continue;
        uint32_t K = 2 * r->block_elems;
        size_t gb = kvg_row_bytes(r->type, K), qb = (size_t)2 * r->qwords * 4, sb = (size_t)2 * r->scale_halves * 2;
        uint8_t *src = malloc(gb), *q0 = malloc(qb), *s0 = malloc(sb + 1), *q1 = malloc(qb), *s1 = malloc(sb + 1);
        uint8_t *hit = calloc(qb + sb, 1);
        for (size_t k = 0; k < gb; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            src[k] = (uint8_t)(rng >> 56);
        }
        repack_row(r, src, K, q0, s0);
        int set_src = 0, set_dst = 0;
        for (size_t k = 0; k < gb; k++) set_src += popcount8(src[k]);
        for (size_t k = 0; k < qb; k++) set_dst += popcount8(q0[k]);
        for (size_t k = 0; k < sb; k++) set_dst += popcount8(s0[k]);
        CHECKF(set_src == set_dst, "%s: %d set bits in the GGUF blocks, %d repacked", kvg_type_name(r->type), set_src,
               set_dst);
        int bad = 0;
        for (size_t bit = 0; bit < gb * 8 && bad < 3; bit++) {
            src[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            repack_row(r, src, K, q1, s1);
            src[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            int flipped = 0;
            size_t where = 0;
            for (size_t k = 0; k < qb + sb; k++) {
                uint8_t d = k < qb ? (uint8_t)(q0[k] ^ q1[k]) : (uint8_t)(s0[k - qb] ^ s1[k - qb]);
                for (int b = 0; b < 8; b++)
                    if (d >> b & 1) {
                        flipped++;
                        where = k * 8 + (size_t)b;
                    }
            }
            bool ok = flipped == 1 && !(hit[where / 8] >> (where % 8) & 1);
            if (ok) hit[where / 8] |= (uint8_t)(1u << (where % 8));
            if (!ok) bad++;
            CHECKF(ok, "%s: GGUF bit %zu flips %d repacked bits (or one already taken)", kvg_type_name(r->type), bit,
                   flipped);
        }
        free(src); free(q0); free(s0); free(q1); free(s1); free(hit);
    }
}

/* kvg_vulkan_backend.model_init on `good`'s description with tensor `which` taken from `bad`
 * (kvg_weights_describe itself refuses a type outside the traits table, so the model is put
 * together by hand): refused with the table's list, and no device was touched */
static void expect_refusal(const char *good, const char *bad, const char *which, uint32_t type) {
    kvgen_model m;
    memset(&m, 0, sizeof m);
    kvg_gguf *g = NULL;
    kvgen_error err = {0};
    bool ok = kvg_gguf_open(good, &g, &err) == KVGEN_OK && kvg_weights_describe(g, &m.w, &err) == KVGEN_OK &&
              kvg_gguf_open(bad, &m.gguf, &err) == KVGEN_OK;
    CHECKF(ok, "%s", err.message);
    const kvg_tensor *t = ok ? kvg_gguf_find_tensor(m.gguf, which) : NULL;
    CHECK(t && t->type == type);
    if (t) {
        for (int l = 0; l < m.w.hp.n_layer; l++) {
            kvg_layer *L = &m.w.layers[l];
            const kvg_tensor **ls[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
            for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
                if (strcmp((*ls[i])->name, which) == 0) *ls[i] = t;
        }
        if (strcmp(m.w.tok_embd->name, which) == 0) m.w.tok_embd = m.w.output = t;
        kvgen_model_desc desc = {.path = bad};
        kvgen_status st = kvg_vulkan_backend.model_init(&m, &desc, &err);
        char list[512], want[1024];
        vk_list(list, sizeof list);
        snprintf(want, sizeof want, "%s: tensor %s has type %s, which the vulkan backend does not run (vulkan runs: %s)",
                 bad, which, kvg_type_name(type), list);
        CHECKF(st == KVGEN_E_UNSUPPORTED, "%s: status %s (%s)", which, kvgen_status_name(st), err.message);
        CHECKF(strcmp(err.message, want) == 0, "message\n  %s\nwant\n  %s", err.message, want);
        CHECK(m.backend == NULL && m.device_name[0] == 0);
        if (st == KVGEN_OK) kvg_vulkan_backend.model_free(&m);
    }
    kvg_weights_free(&m.w);
    kvg_gguf_close(m.gguf);
    kvg_gguf_close(g);
}

static void test_refusals(void) {
    char *good = tu_make_model("vt-src.gguf", "--layers 2 --embd 256 --heads 4 --kv-heads 2 --ff 256 --type Q4_1");
    CHECK(good != NULL);
    if (!good) return;
    char *q6k = tu_retype(good, "vt-q8k.gguf", "blk.1.attn_v.weight", KVG_TYPE_Q8_K);
    char *q50 = tu_retype(good, "vt-q8ke.gguf", "token_embd.weight", KVG_TYPE_Q8_K);
    char *iq2 = tu_retype(good, "vt-iq2xxs.gguf", "blk.0.ffn_up.weight", 16);
    CHECK(q6k && q50 && iq2);
    CHECK(kvg_type_supported(KVG_TYPE_Q8_K) && !kvg_type_supported(16));
    if (q6k) expect_refusal(good, q6k, "blk.1.attn_v.weight", KVG_TYPE_Q8_K);
    if (q50) expect_refusal(good, q50, "token_embd.weight", KVG_TYPE_Q8_K);
    if (iq2) expect_refusal(good, iq2, "blk.0.ffn_up.weight", 16);
    /* a load asking for Vulkan refuses the file as well, naming the tensor and its type */
    const char *files[] = {q6k, q50, iq2};
    const char *what[][2] = {{"Q8_K", "blk.1.attn_v.weight"}, {"Q8_K", "token_embd.weight"},
                             {"IQ2_XXS", "blk.0.ffn_up.weight"}};
    for (int i = 0; i < 3; i++) {
        if (!files[i]) continue;
        kvgen_model_desc d = {.path = files[i], .backend = KVGEN_BACKEND_VULKAN};
        kvgen_model *m = NULL;
        kvgen_error err = {0};
        CHECKF(kvgen_model_load(&d, &m, &err) == KVGEN_E_UNSUPPORTED && !m && strstr(err.message, files[i]) &&
                   strstr(err.message, what[i][0]) && strstr(err.message, what[i][1]),
               "%s", err.message);
        kvgen_model_unload(m);
    }
    free(q6k);
    free(q50);
    free(iq2);
    free(good);
}

/* the upload path's own refusal: kvg_vk_test_matmul with a type the table lacks */
static void test_upload_refusal(void) {
    int n_dev = 0;
    kvgen_error err = {0};
    if (kvgen_devices(NULL, 0, &n_dev, &err) != KVGEN_OK || n_dev == 0) {
        printf("no Vulkan device: skipping the upload refusal\n");
        return;
    }
    kvg_vk_ctx_desc d = {0};
    kvg_vk_ctx *ctx = NULL;
    kvgen_status st = kvg_vk_ctx_create(&d, &ctx, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    if (st != KVGEN_OK) return;
    uint32_t K = 256, rows = 2;
    uint8_t *w = calloc(rows, kvg_row_bytes(KVG_TYPE_Q8_K, K));
    float x[256] = {0}, y[2] = {0};
    st = kvg_vk_test_matmul(ctx, KVG_TYPE_Q8_K, w, rows, K, x, 1, NULL, 1e-5f, 0, KVG_VK_LAYOUT_DEVICE, y, &err);
    char list[512];
    vk_list(list, sizeof list);
    CHECKF(st == KVGEN_E_UNSUPPORTED && strstr(err.message, "tensor test has type Q8_K, which the vulkan backend "
                                                            "does not run") &&
               strstr(err.message, list),
           "%s: %s", kvgen_status_name(st), err.message);
    free(w);
    /* groups: a concatenated one (Q/K/V) keeps every member's type, a part per run of one type
     * (cut at the buffer range); an interleaved one (gate/up) of mixed types is one type, Q8_0
     * where exact (Q4_0/Q5_0/Q8_0 only), else F32 */
    struct {
        uint32_t a, b, c; /* member types (c: 0 for a two-member group) */
        bool interleave;
        const char *max_part; /* the binding limit (KVGEN_VK_MAX_PART's bytes), or NULL */
        int n_parts;
        uint32_t want[4][3]; /* per part: type, row0, rows */
    } groups[] = {
        {KVG_TYPE_Q5_0, KVG_TYPE_Q8_0, 0, false, NULL, 2, {{KVG_TYPE_Q5_0, 0, 64}, {KVG_TYPE_Q8_0, 64, 32}}},
        {KVG_TYPE_Q8_0, KVG_TYPE_Q4_0, 0, false, NULL, 2, {{KVG_TYPE_Q8_0, 0, 64}, {KVG_TYPE_Q4_0, 64, 32}}},
        {KVG_TYPE_Q5_0, KVG_TYPE_Q5_0, 0, false, NULL, 1, {{KVG_TYPE_Q5_0, 0, 96}}},
        {KVG_TYPE_Q4_1, KVG_TYPE_Q8_0, 0, false, NULL, 2, {{KVG_TYPE_Q4_1, 0, 64}, {KVG_TYPE_Q8_0, 64, 32}}},
        {KVG_TYPE_F32, KVG_TYPE_Q8_0, 0, false, NULL, 2, {{KVG_TYPE_F32, 0, 64}, {KVG_TYPE_Q8_0, 64, 32}}},
        /* llama.cpp's Q4_K_M: Q4_K attn_q, attn_k with a Q6_K attn_v */
        {KVG_TYPE_Q4_K, KVG_TYPE_Q4_K, KVG_TYPE_Q6_K, false, NULL, 2, {{KVG_TYPE_Q4_K, 0, 128}, {KVG_TYPE_Q6_K, 128, 32}}},
        {KVG_TYPE_Q6_K, KVG_TYPE_Q4_K, KVG_TYPE_Q6_K, false, NULL, 3,
         {{KVG_TYPE_Q6_K, 0, 64}, {KVG_TYPE_Q4_K, 64, 64}, {KVG_TYPE_Q6_K, 128, 32}}},
        /* 9472 bytes: 64 Q4_K rows of 256 (148 bytes each with slack), 42 Q6_K rows (216) */
        {KVG_TYPE_Q4_K, KVG_TYPE_Q4_K, KVG_TYPE_Q6_K, false, "9472", 3,
         {{KVG_TYPE_Q4_K, 0, 64}, {KVG_TYPE_Q4_K, 64, 64}, {KVG_TYPE_Q6_K, 128, 32}}},
        {KVG_TYPE_Q5_0, KVG_TYPE_Q8_0, 0, true, NULL, 1, {{KVG_TYPE_Q8_0, 0, 128}}},
        {KVG_TYPE_Q4_K, KVG_TYPE_Q6_K, 0, true, NULL, 1, {{KVG_TYPE_F32, 0, 128}}},
        {KVG_TYPE_Q4_K, KVG_TYPE_Q4_K, 0, true, NULL, 1, {{KVG_TYPE_Q4_K, 0, 128}}},
    };
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
        uint32_t K = 256, types[3] = {groups[i].a, groups[i].b, groups[i].c};
        uint64_t nrows[3] = {64, groups[i].interleave ? 64 : 32, 32};
        int n = groups[i].c ? 3 : 2;
        if (n == 3) nrows[1] = 64;
        void *data[3] = {NULL, NULL, NULL};
        kvg_tensor t[3];
        const kvg_tensor *ts[3];
        for (int k = 0; k < n; k++) {
            data[k] = calloc(nrows[k], kvg_row_bytes(types[k], K));
            t[k] = (kvg_tensor){.name = "member", .type = types[k], .n_dims = 2, .ne = {K, nrows[k], 1, 1},
                                .n_elements = nrows[k] * K, .data = data[k]};
            ts[k] = &t[k];
        }
        /* the context's binding limit, as KVGEN_VK_MAX_PART would have set it at its creation */
        size_t max_part = ctx->max_part;
        if (groups[i].max_part) ctx->max_part = (size_t)atol(groups[i].max_part);
        vk_model vm = {0};
        vm.ctx = ctx;
        vk_matrix m;
        st = kvg_vk_upload_matrix(&vm, "group", ts, n, groups[i].interleave, &m, &err);
        ctx->max_part = max_part;
        CHECKF(st == KVGEN_OK && m.n_parts == groups[i].n_parts, "group %zu: %s, %d parts, want %d", i, err.message,
               st == KVGEN_OK ? m.n_parts : -1, groups[i].n_parts);
        for (int p = 0; st == KVGEN_OK && p < m.n_parts && p < groups[i].n_parts; p++) {
            const vk_part *part = &m.parts[p];
            const uint32_t *want = groups[i].want[p];
            CHECKF(part->type == want[0] && part->wt == kvg_vk_wtype_of(want[0]) && part->row0 == want[1] &&
                       part->rows == want[2],
                   "group %zu (%s + %s%s%s) part %d: %s rows %u + %u, want %s rows %u + %u", i,
                   kvg_type_name(types[0]), kvg_type_name(types[1]), n == 3 ? " + " : "",
                   n == 3 ? kvg_type_name(types[2]) : "", p, kvg_type_name(part->type), part->row0, part->rows,
                   kvg_type_name(want[0]), want[1], want[2]);
        }
        if (st == KVGEN_OK) {
            CHECK(m.rows == (uint32_t)(nrows[0] + nrows[1] + (n == 3 ? nrows[2] : 0)) && m.k == K);
            kvg_vk_free_matrix(ctx, &m);
        }
        for (int k = 0; k < n; k++) free(data[k]);
    }
    CHECKF(kvg_vk_validation_count(ctx) == 0, "%d validation messages", kvg_vk_validation_count(ctx));
    kvg_vk_ctx_destroy(ctx);
}

/* The device-limits table (kvg_vk_shader_limits, vk_device.c) against the embedded SPIR-V: every
 * shader has an entry; one the table gives a fixed workgroup size has that LocalSize in x, one it
 * sizes by the WG specialization constant decorates a constant with SpecId 0. */
static void test_shader_limits(void) {
    for (size_t i = 0; i < kvg_shader_count(); i++) {
        const kvg_shader_blob *b = kvg_shader_at(i);
        uint32_t spec[KVG_SPEC_COUNT] = {0}, inv = 0;
        uint64_t shared = 0;
        spec[KVG_SPEC_WG] = 12345; /* a size no shader fixes */
        spec[KVG_SPEC_GQ] = spec[KVG_SPEC_ROWS] = spec[KVG_SPEC_NCOLS] = 1;
        kvgen_error err = {0};
        CHECKF(kvg_vk_shader_limits(b->name, spec, &inv, &shared, &err) == KVGEN_OK, "%s", err.message);
        uint32_t local_x = 0;
        bool spec_wg = false;
        size_t n = b->size / 4;
        for (size_t w = 5; w < n;) {
            uint32_t len = b->code[w] >> 16, op = b->code[w] & 0xffffu;
            if (len == 0 || w + len > n) break;
            if (op == 16 && len >= 4 && b->code[w + 2] == 17) local_x = b->code[w + 3]; /* ExecutionMode LocalSize */
            if (op == 71 && len >= 4 && b->code[w + 2] == 1 && b->code[w + 3] == KVG_SPEC_WG) /* Decorate SpecId */
                spec_wg = true;
            w += len;
        }
        if (inv == 12345)
            CHECKF(spec_wg, "%s: the limits table sizes it by WG, but it has no specialization constant 0", b->name);
        else
            CHECKF(inv == local_x, "%s: the limits table says %u invocations, the SPIR-V LocalSize %u", b->name, inv,
                   local_x);
    }
    kvgen_error err = {0};
    uint32_t spec[KVG_SPEC_COUNT] = {0}, inv;
    uint64_t shared;
    CHECK(kvg_vk_shader_limits("no_such_shader", spec, &inv, &shared, &err) == KVGEN_E_INTERNAL &&
          strstr(err.message, "no_such_shader"));
}

int main(void) {
    test_shader_limits();
    test_table();
    test_repack_bijective();
    test_refusals();
    test_upload_refusal();
    return tu_finish("test_vk_types");
}
