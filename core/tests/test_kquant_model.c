/* test_kquant_model.c: random models in K types, end to end. kvgen-mkmodel writes a model with
 * --type Q4_K and one with --mix q4_k_m (llama.cpp's Q4_K_M mix: the test checks which tensor
 * got which type) and refuses rows that are not whole 256-element blocks, naming the tensor.
 * Both models run prefill and a few decodes on the reference backend through kvgen.h; their
 * logits are finite and close to those of the same seed's F32 model; on the Vulkan backend (when
 * it is built and has a device) each step is within test_vk_model's tolerance of the reference,
 * and every layer's Q/K/V group runs packed in its members' own types (the mix's Q6_K attn_v
 * layer as a Q4_K part and a Q6_K part, kvg_vk_model_parts), never dequantized to F32. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <string.h>
#include <sys/wait.h>
#include "kvg_gguf.h"
#include "kvg_model.h"
#include "kvg_quant.h"
#include "kvg_vk.h"
#include "testutil.h"

#define SHAPE "--seed 7 --embd 256 --ff 512 --heads 4 --kv-heads 2"
enum { N_PROMPT = 7, N_DECODE = 3, N_STEPS = 1 + N_DECODE };

/* the logits after the prompt and after each decode, N_STEPS x n_vocab; NULL on failure */
static float *run_model_on(const char *path, kvgen_backend backend, const int32_t *tokens, int *n_vocab) {
    kvgen_model_desc d = {.path = path, .backend = backend, .n_threads = 2};
    kvgen_model *m = tu_load(&d);
    if (!m) return NULL;
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    CHECK(strcmp(info.backend, backend == KVGEN_BACKEND_VULKAN ? "vulkan" : "reference") == 0);
    *n_vocab = info.n_vocab;
#ifdef KVGEN_TEST_HAVE_VULKAN
    if (backend == KVGEN_BACKEND_VULKAN) {
        /* Q/K/V as uploaded: one part per run of one type, each in its members' type */
        for (int l = 0; l < m->w.hp.n_layer; l++) {
            const kvg_layer *L = &m->w.layers[l];
            kvg_vk_part_info p[4];
            int np = kvg_vk_model_parts(m, l, "attn_qkv", p, 4), want = L->wv->type != L->wk->type ? 2 : 1;
            CHECKF(np == want && p[0].type == L->wq->type && p[np - 1].type == L->wv->type &&
                       p[np - 1].row0 + p[np - 1].rows == (L->wq->n_elements + 2 * L->wv->n_elements) / L->wq->ne[0],
                   "%s: layer %d: Q/K/V (%s, %s, %s) uploaded as %d parts, the first %s, the last %s", path, l,
                   kvg_type_name(L->wq->type), kvg_type_name(L->wk->type), kvg_type_name(L->wv->type), np,
                   np > 0 ? kvg_type_name(p[0].type) : "-", np > 0 ? kvg_type_name(p[np - 1].type) : "-");
            if (np == 2) printf("%s: layer %d: Q/K/V uploaded as %s rows 0-%u and %s rows %u-%u\n", path, l,
                                kvg_type_name(p[0].type), p[0].rows - 1, kvg_type_name(p[1].type), p[1].row0,
                                p[1].row0 + p[1].rows - 1);
        }
    }
#endif
    float *out = malloc((size_t)N_STEPS * (size_t)info.n_vocab * sizeof *out);
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    bool ok = s != NULL;
    if (ok) {
        kvgen_status st = kvgen_session_prefill(s, tokens, N_PROMPT, NULL, &err);
        CHECKF(st == KVGEN_OK, "%s: prefill: %s", path, err.message);
        ok = st == KVGEN_OK;
    }
    for (int step = 0; ok && step < N_STEPS; step++) {
        if (step > 0) {
            kvgen_status st = kvgen_session_decode(s, tokens[N_PROMPT + step - 1], &err);
            CHECKF(st == KVGEN_OK, "%s: decode %d: %s", path, step, err.message);
            if (st != KVGEN_OK) {
                ok = false;
                break;
            }
        }
        const float *l = kvgen_session_logits(s);
        CHECK(l != NULL);
        if (!l) {
            ok = false;
            break;
        }
        memcpy(out + (size_t)step * info.n_vocab, l, (size_t)info.n_vocab * sizeof *l);
    }
    kvgen_session_close(s);
    kvgen_model_unload(m);
    if (!ok) {
        free(out);
        return NULL;
    }
    return out;
}

static float *run_model(const char *path, const int32_t *tokens, int *n_vocab) {
    return run_model_on(path, KVGEN_BACKEND_REFERENCE, tokens, n_vocab);
}

/* Quantized against F32 logits of the same weights. The weights are random (std 0.02 to 0.08),
 * so Q4_K's ~7% relative weight error moves logits more than in a trained model. Measured for
 * these models over the 4 steps: rms(diff) / rms(F32 logits) 0.165 to 0.176 (Q4_K) and 0.148 to
 * 0.157 (q4_k_m), max |diff| / max |F32 logit| at most 0.19 and 0.15; for comparison, the same
 * seed in Q4_1 gives 0.18 / 0.19, Q6_K 0.04, Q8_0 0.013. The loose bounds: 0.30 and 0.35. */
static void compare(const char *what, const float *q, const float *f, int n_vocab) {
    for (int step = 0; step < N_STEPS; step++) {
        const float *a = q + (size_t)step * n_vocab, *b = f + (size_t)step * n_vocab;
        double se = 0, sb = 0, dmax = 0, bmax = 0;
        int finite = 1;
        for (int i = 0; i < n_vocab; i++) {
            finite &= isfinite(a[i]) != 0;
            double d = (double)a[i] - b[i];
            se += d * d;
            sb += (double)b[i] * b[i];
            dmax = fmax(dmax, fabs(d));
            bmax = fmax(bmax, fabs(b[i]));
        }
        double rel_rms = sqrt(se / sb), rel_max = dmax / bmax;
        printf("%s step %d: rms(diff)/rms(F32) %.4f, max|diff|/max|F32| %.4f\n", what, step, rel_rms, rel_max);
        CHECKF(finite, "%s step %d: non-finite logits", what, step);
        CHECKF(rel_rms <= 0.30 && rel_max <= 0.35, "%s step %d: logits too far from F32 (%.4f, %.4f)", what, step,
               rel_rms, rel_max);
    }
}

/* the Vulkan backend runs a K-type model: each step's logits within test_vk_model's tolerance
 * of the reference backend's (`ref`); a default load succeeds */
static void check_backends(const char *path, const float *ref, const int32_t *tokens, int n_vocab) {
    kvgen_backend_info b[8];
    int n = kvgen_backends(b, 8), vk_built = 0;
    for (int i = 0; i < n && i < 8; i++)
        if (b[i].backend == KVGEN_BACKEND_VULKAN) vk_built = b[i].available;
    int n_dev = 0;
    kvgen_error err = {0};
    if (!vk_built || kvgen_devices(NULL, 0, &n_dev, &err) != KVGEN_OK || n_dev == 0) {
        printf("no Vulkan backend or device: %s not run on it\n", path);
        return;
    }
    int nv = 0;
    float *lv = run_model_on(path, KVGEN_BACKEND_VULKAN, tokens, &nv);
    CHECK(lv && nv == n_vocab);
    for (int step = 0; lv && step < N_STEPS; step++) {
        const float *a = lv + (size_t)step * n_vocab, *r = ref + (size_t)step * n_vocab;
        double mx = 0, worst = 0;
        for (int i = 0; i < n_vocab; i++) mx = fmax(mx, fabs(r[i]));
        for (int i = 0; i < n_vocab; i++) {
            double d = fabs((double)a[i] - r[i]);
            if (!(d <= worst)) worst = d;
        }
        double tol = 0.01 * (2.0 + mx);
        printf("%s step %d: vulkan vs reference max |diff| %.3g (tolerance %.3g)\n", path, step, worst, tol);
        CHECKF(worst <= tol, "%s step %d: vulkan logits off by %g (tolerance %g)", path, step, worst, tol);
    }
    free(lv);
    const char *backend = getenv("KVGEN_BACKEND");
    if (backend && *backend) return;
    kvgen_model_desc dd = {.path = path, .n_threads = 2};
    kvgen_model *m = tu_load(&dd);
    if (m) {
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        printf("%s: default backend %s\n", path, info.backend); /* the registry's choice, any that runs it */
        kvgen_model_unload(m);
    }
}

static uint32_t tensor_type(const kvg_gguf *g, const char *name) {
    const kvg_tensor *t = kvg_gguf_find_tensor(g, name);
    return t ? t->type : UINT32_MAX;
}

/* which tensor got which type: `expect` is {name, type} pairs; every other tensor is
 * `otherwise` (matrices) or F32 (norms) */
static void check_types(const char *path, const char *const (*expect)[2], size_t n, uint32_t otherwise) {
    kvg_gguf *g = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvg_gguf_open(path, &g, &err));
    if (!g) return;
    for (int i = 0; i < kvg_gguf_n_tensors(g); i++) {
        const kvg_tensor *t = kvg_gguf_tensor(g, i);
        uint32_t want = strstr(t->name, "norm") ? KVG_TYPE_F32 : otherwise;
        for (size_t k = 0; k < n; k++)
            if (strcmp(t->name, expect[k][0]) == 0) {
                for (uint32_t ty = 0; ty < 64; ty++)
                    if (strcmp(kvg_type_name(ty), expect[k][1]) == 0) want = ty;
            }
        CHECKF(t->type == want, "%s: %s is %s, want %s", path, t->name, kvg_type_name(t->type), kvg_type_name(want));
    }
    for (size_t k = 0; k < n; k++)
        CHECKF(tensor_type(g, expect[k][0]) != UINT32_MAX, "%s: no tensor %s", path, expect[k][0]);
    kvg_gguf_close(g);
}

/* kvgen-mkmodel's output and exit status */
static int refused(const char *args, char *out, size_t size) {
    return tu_run_mkmodel("kq-refused.gguf", args, out, size);
}

static void test_refused_widths(void) {
    char out[4096];
    CHECK(refused("--type Q4_K --embd 128 --heads 2", out, sizeof out) != 0);
    CHECKF(strstr(out, "tensor token_embd.weight has type Q4_K, whose rows must be a multiple of 256 elements") &&
               strstr(out, "128 wide (--embd 128)"),
           "%s", out);
    CHECK(refused("--mix q4_k_m --embd 256 --ff 320", out, sizeof out) != 0);
    CHECKF(strstr(out, "tensor blk.0.ffn_down.weight has type Q4_K") && strstr(out, "320 wide (--ff 320)"), "%s", out);
    /* wide heads: attn_output's rows are heads x head size */
    CHECK(refused("--type Q6_K --embd 256 --heads 4 --head-dim 80", out, sizeof out) != 0);
    CHECKF(strstr(out, "tensor blk.0.attn_output.weight has type Q6_K") && strstr(out, "(heads x head size 320)"),
           "%s", out);
    CHECK(refused("--mix q4_k_m --type Q4_K", out, sizeof out) != 0 && strstr(out, "exclude each other"));
    CHECK(refused("--mix q5_k_m", out, sizeof out) != 0 && strstr(out, "--mix q5_k_m is not a mix"));
}

int main(void) {
    test_refused_widths();

    char *f32 = tu_make_model("kq-f32.gguf", SHAPE " --layers 3 --untied --type F32");
    char *q4k = tu_make_model("kq-q4k.gguf", SHAPE " --layers 3 --untied --type Q4_K");
    char *mix = tu_make_model("kq-mix.gguf", SHAPE " --layers 3 --untied --mix q4_k_m");
    char *mix_tied = tu_make_model("kq-mix-tied.gguf", SHAPE " --layers 2 --mix q4_k_m --embd-type F32");
    char *mix_tied6 = tu_make_model("kq-mix-tied6.gguf", SHAPE " --layers 2 --mix q4_k_m");
    CHECK(f32 && q4k && mix && mix_tied && mix_tied6);
    if (!f32 || !q4k || !mix || !mix_tied || !mix_tied6) goto out;

    /* the mix: 3 layers get more bits where l < 0, l >= 2 or l % 3 == 2: layer 2 only */
    static const char *const mix_types[][2] = {
        {"token_embd.weight", "Q4_K"}, {"output.weight", "Q6_K"},        {"blk.2.attn_v.weight", "Q6_K"},
        {"blk.2.ffn_down.weight", "Q6_K"},
    };
    check_types(mix, mix_types, 4, KVG_TYPE_Q4_K);
    /* tied embeddings are the output matrix: Q6_K; --embd-type overrides; 2 layers: layer 1 */
    static const char *const tied_types[][2] = {
        {"token_embd.weight", "F32"}, {"blk.1.attn_v.weight", "Q6_K"}, {"blk.1.ffn_down.weight", "Q6_K"}};
    check_types(mix_tied, tied_types, 3, KVG_TYPE_Q4_K);
    static const char *const tied6_types[][2] = {
        {"token_embd.weight", "Q6_K"}, {"blk.1.attn_v.weight", "Q6_K"}, {"blk.1.ffn_down.weight", "Q6_K"}};
    check_types(mix_tied6, tied6_types, 3, KVG_TYPE_Q4_K);
    static const char *const q4k_types[][2] = {{"output.weight", "Q4_K"}};
    check_types(q4k, q4k_types, 1, KVG_TYPE_Q4_K);

    int n_vocab = 0, nv = 0;
    int32_t tokens[N_PROMPT + N_DECODE];
    {
        kvgen_model_desc d = {.path = f32, .backend = KVGEN_BACKEND_REFERENCE};
        kvgen_model *m = tu_load(&d);
        if (!m) goto out;
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        n_vocab = info.n_vocab;
        kvgen_model_unload(m);
    }
    tu_fill_tokens(tokens, N_PROMPT + N_DECODE, 11, n_vocab);
    float *lf = run_model(f32, tokens, &nv);
    CHECK(lf && nv == n_vocab);
    const char *files[] = {q4k, mix};
    for (int i = 0; i < 2 && lf; i++) {
        float *lq = run_model(files[i], tokens, &nv);
        CHECK(lq && nv == n_vocab);
        if (lq) compare(i ? "q4_k_m" : "Q4_K", lq, lf, n_vocab);
        if (lq) check_backends(files[i], lq, tokens, n_vocab);
        free(lq);
    }
    free(lf);

    /* kvgen info's type lines (kvgen_model_describe): counts, and the reference and Vulkan
     * backends run each */
    kvgen_model_desc d = {.path = mix, .backend = KVGEN_BACKEND_REFERENCE};
    kvgen_model *m = tu_load(&d);
    if (m) {
        char desc[4096];
        kvgen_model_describe(m, desc, sizeof desc);
        const char *lines[] = {"\n  F32:           7 tensors (", "\n  Q4_K:          20 tensors (",
                               "\n  Q6_K:          3 tensors ("};
        for (int i = 0; i < 3; i++) {
            const char *l = strstr(desc, lines[i]);
            const char *end = l ? strchr(l + 1, '\n') : NULL;
            const char *ref = l ? strstr(l + 1, "reference: yes") : NULL;
            CHECKF(l && end && ref && ref < end, "describe lacks '%s' run by the reference backend:\n%s", lines[i] + 3,
                   desc);
            const char *vk = l ? strstr(l + 1, "vulkan: ") : NULL;
            if (vk && end && vk < end) CHECKF(strncmp(vk, "vulkan: yes", 11) == 0, "%s", desc);
        }
        kvgen_model_unload(m);
    }
out:
    free(f32);
    free(q4k);
    free(mix);
    free(mix_tied);
    free(mix_tied6);
    return tu_finish("test_kquant_model");
}
