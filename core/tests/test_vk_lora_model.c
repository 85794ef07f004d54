/* test_vk_lora_model.c: LoRA adapters on the Vulkan backend against the CPU reference, on
 * random models of three architectures (llama; qwen2 with Q/K/V biases and NEOX RoPE; gemma3
 * with Q/K head norms, post norms, GeGLU and sliding windows) and random adapters (rank 8 on all
 * seven matrices, alpha set; rank 4 on q, v and down only):
 * - a session running both adapters at once (scales 0.8 and -0.5): the logits of a prefill
 *   (every position) and of 4 decode steps within |vulkan - reference| <= 0.02 + 0.01 * max|logit|
 *   (test_vk_model's tolerance: the KV cache is f16 and sums run in another order), 5x tighter
 *   with force_f32; the adapters move the logits by more than 10x that difference;
 * - a mixed batched decode: 10 sessions with different adapters, the same adapter at another
 *   scale and none, one token each in one batch (one step: more columns than the mat-vec's 8,
 *   through the GEMM on a GPU's layouts, run too), against their twins decoding one at a time:
 *   within 0.002 * (2 + max|logit|) (test_vk_batch's: only the mat-vec's column count differs);
 *   the session without adapters equals the base model's decode exactly;
 * - the same on a GPU's layouts (KVGEN_VK_LANE=0, KVGEN_VK_ATTN_LANE=0: the prefill through the
 *   GEMM) and with prefill chunks of 7 tokens (KVGEN_VK_CHUNK=7);
 * - adapters freed while the model stays, and a new one loaded and run after (its device copy
 *   packed again).
 * With KVGEN_VALIDATE=1 the validation layer must stay silent. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_backend.h"
#include "kvg_session.h"
#include "kvg_vk.h"
#include "testutil.h"

enum { PROMPT = 19, DECODE = 4 };

static kvgen_model *load(const char *path, kvgen_backend backend, int force_f32) {
    kvgen_model_desc d = {.path = path, .backend = backend, .force_f32 = force_f32, .n_threads = 2,
                          .kv_page_size = 16};
    return tu_load(&d);
}

static kvgen_adapter *adapter(kvgen_model *m, const char *path) {
    kvgen_adapter *a = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvgen_adapter_load(m, path, &a, &err);
    CHECKF(st == KVGEN_OK, "%s: %s", path, err.message);
    return a;
}

static kvgen_session *session(kvgen_model *m, kvgen_adapter *const *ads, const float *scales, size_t n) {
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    kvgen_session_desc sd = {.n_ctx = 128, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    if (s && n) CHECK_OK(kvgen_session_set_adapters(s, (const kvgen_adapter *const *)ads, scales, n, &err));
    return s;
}

/* worst |a - b| over n logits in units of (abs + rel * max|b|) */
static double excess(const float *a, const float *b, int n, double abs, double rel) {
    if (!a || !b) return INFINITY;
    double mx = 0, worst = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, fabs((double)b[i]));
    double tol = abs + rel * mx;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / tol;
        if (!(d <= worst)) worst = d;
    }
    return worst;
}

/* prefill + decode logits of the session running both adapters, on the reference and on Vulkan */
static void parity(const char *what, const char *model, const char *ad1, const char *ad2, int force_f32) {
    kvgen_model *ref = load(model, KVGEN_BACKEND_REFERENCE, 0), *vk = load(model, KVGEN_BACKEND_VULKAN, force_f32);
    if (!ref || !vk) {
        kvgen_model_unload(ref);
        kvgen_model_unload(vk);
        return;
    }
    int V = ref->w.hp.n_vocab;
    kvgen_adapter *ar[2] = {adapter(ref, ad1), adapter(ref, ad2)}, *av[2] = {adapter(vk, ad1), adapter(vk, ad2)};
    const float scales[2] = {0.8f, -0.5f};
    kvgen_session *sr = session(ref, ar, scales, 2), *sv = session(vk, av, scales, 2);
    kvgen_session *base = session(ref, NULL, NULL, 0);
    int32_t prompt[PROMPT];
    tu_fill_tokens(prompt, PROMPT, 5u, V);
    float *lr = malloc((size_t)PROMPT * V * sizeof *lr), *lv = malloc((size_t)PROMPT * V * sizeof *lv);
    float *lb = malloc((size_t)PROMPT * V * sizeof *lb);
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_prefill(sr, prompt, PROMPT, lr, &err));
    CHECK_OK(kvgen_session_prefill(sv, prompt, PROMPT, lv, &err));
    CHECK_OK(kvgen_session_prefill(base, prompt, PROMPT, lb, &err));
    double rel = force_f32 ? 0.002 : 0.01, abs = force_f32 ? 0.004 : 0.02;
    double worst = 0, moved = 0;
    for (int p = 0; p < PROMPT; p++) {
        double e = excess(lv + (size_t)p * V, lr + (size_t)p * V, V, abs, rel);
        CHECKF(e <= 1, "%s: prefill position %d: %.3g x the tolerance", what, p, e);
        worst = fmax(worst, e);
        moved = fmax(moved, excess(lb + (size_t)p * V, lr + (size_t)p * V, V, abs, rel));
    }
    for (int i = 0; i < DECODE; i++) {
        int32_t t = (int32_t)((7 + 13 * i) % V);
        CHECK_OK(kvgen_session_decode(sr, t, &err));
        CHECK_OK(kvgen_session_decode(sv, t, &err));
        double e = excess(kvgen_session_logits(sv), kvgen_session_logits(sr), V, abs, rel);
        CHECKF(e <= 1, "%s: decode step %d: %.3g x the tolerance", what, i, e);
        worst = fmax(worst, e);
    }
    CHECKF(moved > 10, "%s: the adapters moved the logits by only %.3g x the tolerance", what, moved);
    printf("%s: vulkan vs reference with 2 adapters: worst %.3g x the tolerance (the adapters: %.3g x)\n", what, worst,
           moved);
    free(lr);
    free(lv);
    free(lb);
    kvgen_session_close(sr);
    kvgen_session_close(sv);
    kvgen_session_close(base);
    for (int i = 0; i < 2; i++) {
        kvgen_adapter_free(ar[i]);
        kvgen_adapter_free(av[i]);
    }
    kvgen_model_unload(ref);
    kvgen_model_unload(vk);
}

/* batched decodes of sessions with different adapters (and none) against their twins */
static void mixed_batch(const char *what, const char *model, const char *ad1, const char *ad2, const char *ad3) {
    enum { K = 5, N = 2 * K, STEPS = 3 };
    kvgen_model *m = load(model, KVGEN_BACKEND_VULKAN, 0);
    if (!m) return;
    int V = m->w.hp.n_vocab;
    kvgen_adapter *a1 = adapter(m, ad1), *a2 = adapter(m, ad2);
    /* session i runs kind i % K */
    kvgen_adapter *sets[K][2] = {{a1}, {a2}, {NULL}, {a1, a2}, {a1}};
    const float scales[K][2] = {{1.0f}, {0.6f}, {0}, {1.0f, 1.0f}, {0.3f}};
    const size_t n_set[K] = {1, 1, 0, 2, 1};
    kvgen_session *a[N], *b[N];
    kvgen_error err = {0};
    int32_t prompt[PROMPT];
    for (int i = 0; i < N; i++) {
        a[i] = session(m, sets[i % K], scales[i % K], n_set[i % K]);
        b[i] = session(m, sets[i % K], scales[i % K], n_set[i % K]);
        tu_fill_tokens(prompt, PROMPT - (size_t)i, 30u + (unsigned)i, V);
        CHECK_OK(kvgen_session_prefill(a[i], prompt, PROMPT - (size_t)i, NULL, &err));
        CHECK_OK(kvgen_session_prefill(b[i], prompt, PROMPT - (size_t)i, NULL, &err));
    }
    double worst = 0;
    for (int step = 0; step < STEPS; step++) {
        int32_t toks[N];
        tu_fill_tokens(toks, N, 70u + (unsigned)step, V);
        for (int i = 0; i < N; i++) CHECK_OK(kvgen_session_decode(b[i], toks[i], &err));
        kvgen_status status[N];
        kvgen_error errs[N];
        kvgen_status st = kvg_session_decode_batch(a, toks, N, true, status, errs);
        CHECKF(st == KVGEN_OK, "%s: batch step %d: %s", what, step, errs[0].message);
        for (int i = 0; i < N; i++) {
            double e = excess(kvgen_session_logits(a[i]), kvgen_session_logits(b[i]), V, 0.004, 0.002);
            CHECKF(e <= 1, "%s: step %d session %d: batched logits differ by %.3g x the tolerance", what, step, i, e);
            worst = fmax(worst, e);
        }
    }
    /* the adapters made a difference between sessions fed the same tokens */
    double differ = excess(kvgen_session_logits(a[0]), kvgen_session_logits(a[4]), V, 0.004, 0.002);
    CHECKF(differ > 1, "%s: scales 1 and 0.3 of one adapter gave the same logits", what);
    printf("%s: mixed batch vs separate decodes: worst %.3g x the tolerance\n", what, worst);
    for (int i = 0; i < N; i++) {
        kvgen_session_close(a[i]);
        kvgen_session_close(b[i]);
    }
    /* freed adapters leave the device; a new one is packed again and runs */
    kvgen_adapter_free(a1);
    kvgen_adapter_free(a2);
    kvgen_adapter *a3 = adapter(m, ad3);
    kvgen_session *s3 = session(m, &a3, NULL, 1), *base = session(m, NULL, NULL, 0);
    CHECK_OK(kvgen_session_prefill(s3, prompt, PROMPT, NULL, &err));
    CHECK_OK(kvgen_session_prefill(base, prompt, PROMPT, NULL, &err));
    double e3 = excess(kvgen_session_logits(s3), kvgen_session_logits(base), V, 0.004, 0.002);
    CHECKF(e3 > 1, "%s: an adapter loaded after others were freed changed nothing", what);
    kvgen_session_close(s3);
    kvgen_session_close(base);
    kvgen_adapter_free(a3);
    kvgen_model_unload(m);
}

static void body(void *arg) {
    (void)arg;
    static const struct {
        const char *name, *args;
    } archs[] = {
        {"llama", "--layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 128"},
        {"qwen2", "--arch qwen2 --qkv-bias --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96"},
        {"gemma3", "--arch gemma3 --qk-norm --post-norms --swa 8 --layers 2 --embd 64 --heads 4 --kv-heads 1 "
                   "--head-dim 32 --ff 96"},
    };
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        char name[64], args[256];
        snprintf(name, sizeof name, "vk-lora-%s.gguf", archs[i].name);
        char *model = tu_make_model(name, archs[i].args);
        snprintf(name, sizeof name, "vk-lora-%s-a1.gguf", archs[i].name);
        snprintf(args, sizeof args, "%s --lora --lora-alpha 16", archs[i].args);
        char *ad1 = tu_make_model(name, args);
        snprintf(name, sizeof name, "vk-lora-%s-a2.gguf", archs[i].name);
        snprintf(args, sizeof args, "%s --lora --seed 7 --lora-rank 4 --lora-targets q,v,down", archs[i].args);
        char *ad2 = tu_make_model(name, args);
        snprintf(name, sizeof name, "vk-lora-%s-a3.gguf", archs[i].name);
        snprintf(args, sizeof args, "%s --lora --seed 9 --lora-rank 2", archs[i].args);
        char *ad3 = tu_make_model(name, args);
        CHECKF(model && ad1 && ad2 && ad3, "%s: kvgen-mkmodel failed", archs[i].name);
        if (model && ad1 && ad2 && ad3) {
            parity(archs[i].name, model, ad1, ad2, 0);
            if (i == 0) {
                parity("llama f32", model, ad1, ad2, 1);
                /* a GPU's layouts (cooperative mat-vec, the GEMM for the 19-token prefill, attn.comp) and
                 * prefill chunks of 7 tokens, on this CPU device */
                setenv("KVGEN_VK_LANE", "0", 1);
                setenv("KVGEN_VK_ATTN_LANE", "0", 1);
                parity("llama, GPU layouts", model, ad1, ad2, 1);
                mixed_batch("llama, GPU layouts", model, ad1, ad2, ad3);
                unsetenv("KVGEN_VK_LANE");
                unsetenv("KVGEN_VK_ATTN_LANE");
                setenv("KVGEN_VK_CHUNK", "7", 1);
                parity("llama, chunks of 7", model, ad1, ad2, 0);
                unsetenv("KVGEN_VK_CHUNK");
            }
            mixed_batch(archs[i].name, model, ad1, ad2, ad3);
        }
        free(model);
        free(ad1);
        free(ad2);
        free(ad3);
    }
}

int main(void) {
    tu_vulkan_child("LoRA adapters on the Vulkan backend", body, NULL);
    return tu_finish("test_vk_lora_model");
}
