/* test_lora_parity.c: LoRA adapters against llama.cpp on the same files. Tiny random-weight F32
 * models and random F32 adapters (kvgen-mkmodel, the adapter with --lora and the model's shape
 * flags): every target at rank 8 with the default alpha; rank 32 with alpha 5 on q, v and down
 * at scale 1.5; a qwen2 model (Q/K/V biases) with an adapter without alpha (the scale alone) on
 * k, o, gate and up. llama.cpp's top-8 logits at each of 40 teacher-forced positions, with the
 * adapter at the same scale, are the fixtures (scripts/oracle/lora_fixtures.sh with
 * scripts/oracle/dump_logits.cpp), so this checks kvgen reads the format as llama.cpp does
 * (which half is A, how alpha and the rank scale the product, which matrices the names adapt).
 * The reference backend: same f32 math, different summation order: top-1 identical wherever
 * llama.cpp's top-2 margin is at least 0.01, logits within 5e-3. The cpu backend multiplies the
 * base weights in its own kernels (its adapters' products stay f32): logits within 1e-2
 * and top-1 identical where the margin is at least 0.05. The same models without the adapter
 * differ from the fixtures by ten times the bound or more, or the check would say nothing
 * (measured: within 1.3e-3 to 1.8e-3 on both backends; without the adapters 0.16 to 0.81). */
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include "testutil.h"

#define N_TOK TU_SEQ40_N
#define IDS tu_seq40
#define TOPK 8

/* as scripts/oracle/lora_fixtures.sh makes them */
static const struct {
    const char *name, *model, *adapter;
    float scale;
} CONFIGS[] = {
    {"all_targets", "--layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --seed 81", "--lora-rank 8 --seed 82", 0.8f},
    {"alpha", "--layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --seed 81",
     "--lora-rank 32 --lora-alpha 5 --lora-targets q,v,down --seed 83", 1.5f},
    {"qwen2", "--arch qwen2 --qkv-bias --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --rope-base 1000000 --seed 84",
     "--lora-rank 4 --lora-alpha 0 --lora-targets k,o,gate,up --seed 85", 0.5f},
};

static bool load_fixture(const char *name, tu_oracle *fx) {
    char file[96];
    snprintf(file, sizeof file, "lora_%s_logits.txt", name);
    return tu_oracle_load_ids(file, TOPK, IDS, N_TOK, fx);
}

/* every position's logits of IDS on m, with `adapter` at `scale` (NULL: the base model) */
static float *run(kvgen_model *m, const kvgen_adapter *adapter, float scale, int V) {
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {.n_ctx = 64, .no_prefix_reuse = 1};
    float *all = malloc((size_t)N_TOK * (size_t)V * sizeof *all);
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    if (s && adapter) CHECK_OK(kvgen_session_set_adapters(s, &adapter, &scale, 1, &err));
    if (s) CHECK_OK(kvgen_session_prefill(s, IDS, N_TOK, all, &err));
    kvgen_session_close(s);
    return all;
}

/* the largest difference over the fixture's top-K, and the positions whose top-1 agrees (where
 * llama.cpp's margin is at least `margin`) */
static double compare(const float *all, int V, const tu_oracle *fx, float margin, int *top1) {
    tu_oracle_cmp c = tu_oracle_compare(fx, all, V, N_TOK, TOPK, margin, NULL);
    *top1 = N_TOK - (c.clear - c.clear_top1);
    return c.max_diff;
}

static void check_config(int c, kvgen_backend backend, double tol, float margin) {
    const char *name = CONFIGS[c].name, *bname = backend == KVGEN_BACKEND_CPU ? "cpu" : "reference";
    char file[96], args[320];
    snprintf(file, sizeof file, "lp-%s.gguf", name);
    char *path = tu_make_model(file, CONFIGS[c].model);
    snprintf(file, sizeof file, "lp-%s-lora.gguf", name);
    snprintf(args, sizeof args, "%s --lora %s", CONFIGS[c].model, CONFIGS[c].adapter);
    char *apath = tu_make_model(file, args);
    static tu_oracle fx;
    CHECK(path && apath);
    if (!path || !apath || !load_fixture(name, &fx)) {
        free(path);
        free(apath);
        return;
    }
    kvgen_error err = {0};
    kvgen_model_desc md = {.path = path, .backend = backend, .n_threads = 2};
    kvgen_model *m = tu_load(&md);
    kvgen_adapter *a = NULL;
    if (m) CHECK_OK(kvgen_adapter_load(m, apath, &a, &err));
    if (m && a) {
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        int V = info.n_vocab, top1 = 0, base_top1 = 0;
        float *with = run(m, a, CONFIGS[c].scale, V), *base = run(m, NULL, 0.0f, V);
        double d = compare(with, V, &fx, margin, &top1), db = compare(base, V, &fx, margin, &base_top1);
        printf("%s on %s: top-1 as llama.cpp's at %d/%d positions, max |logit diff| over its top-%d %.2g (the base "
               "model without the adapter: %.2g)\n", name, bname, top1, N_TOK, TOPK, d, db);
        CHECKF(top1 == N_TOK, "%s on %s: top-1 differs from llama.cpp at %d positions", name, bname, N_TOK - top1);
        CHECKF(d < tol, "%s on %s: logits differ from llama.cpp's by %g", name, bname, d);
        CHECKF(db > 10 * tol, "%s on %s: the adapter moves the logits by only %g", name, bname, db);
        free(with);
        free(base);
    }
    kvgen_adapter_free(a);
    kvgen_model_unload(m);
    free(path);
    free(apath);
}

int main(void) {
    for (int c = 0; c < (int)(sizeof CONFIGS / sizeof CONFIGS[0]); c++) {
        check_config(c, KVGEN_BACKEND_REFERENCE, 5e-3, 0.01f);
        check_config(c, KVGEN_BACKEND_CPU, 1e-2, 0.05f);
    }
    return tu_finish("test_lora_parity");
}
