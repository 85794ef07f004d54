/* test_arch_parity.c: every architecture the reference backend runs, against llama.cpp on the
 * same file. Tiny random-weight F32 models of each row (kvgen-mkmodel with the row's tensors:
 * llama with rope_freqs, qwen2 biases, qwen3 Q/K head norms with heads wider than n_embd,
 * gemma2 post norms + soft-capping + sliding window, gemma3 Q/K norms + post norms + sliding
 * window with the local RoPE base, 7 layers so a global layer sits between local ones; phi3
 * with its fused attn_qkv and gate/up, partial rotary and GQA, and with LongRoPE factors and an
 * attention factor, the short factors being those llama.cpp's 512-token context takes, and the
 * long ones under an original context of 256, loaded with n_ctx 512 as llama.cpp runs it) run a
 * fixed 40-token sequence, longer than the 8-token windows; llama.cpp's top-8 logits at every
 * position are the fixtures (scripts/oracle/arch_fixtures.sh, with scripts/oracle/dump_logits.cpp).
 * Same f32 math, different summation order: top-1 identical wherever llama.cpp's top-2 margin
 * is at least 0.01, logits within 5e-3 (measured: up to 3.3e-3). Decoding the sequence one
 * token at a time through the paged cache gives the prefill's logits exactly; after a context
 * shift, the keys re-rotated with each layer's own RoPE equal a fresh run's (layer 0). */
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include "testutil.h"

#define N_TOK TU_SEQ40_N
#define IDS tu_seq40
#define TOPK 8

static const struct {
    const char *name, *args;
    int model_ctx; /* kvgen_model_desc.n_ctx: llama.cpp's context (512) where it matters */
} CONFIGS[] = {
    {"llama_rope_freqs", "--arch llama --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --rope-freqs --seed 71", 0},
    {"qwen2", "--arch qwen2 --qkv-bias --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --rope-base 1000000 "
              "--seed 72", 0},
    {"qwen3", "--arch qwen3 --qk-norm --layers 2 --embd 64 --heads 4 --kv-heads 2 --head-dim 32 --ff 96 --rope-base "
              "1000000 --seed 73", 0},
    {"gemma2", "--arch gemma2 --post-norms --swa 8 --softcap 50,30 --layers 3 --embd 64 --heads 4 --kv-heads 2 --ff 96 "
               "--seed 74", 0},
    {"gemma3", "--arch gemma3 --qk-norm --post-norms --swa 8 --layers 7 --embd 64 --heads 4 --kv-heads 1 --head-dim 32 "
               "--ff 96 --rope-base 1000000 --seed 75", 0},
    {"phi3", "--arch phi3 --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --rope-dim 12 --untied --seed 76", 0},
    {"phi3_longrope", "--arch phi3 --layers 2 --embd 64 --heads 4 --ff 96 --ctx 4096 --orig-ctx 512 --rope-factors "
                      "--seed 77", 0},
    /* an original context of 256 under llama.cpp's 512: the long factors */
    {"phi3_longrope_long", "--arch phi3 --layers 2 --embd 64 --heads 4 --ff 96 --ctx 4096 --orig-ctx 256 "
                           "--rope-factors --seed 78", 512},
};

/* llama.cpp's logits for configuration `name`: the sequence IDS and a row at each position */
static bool load_fixture(const char *name, tu_oracle *fx) {
    char file[96];
    snprintf(file, sizeof file, "arch_%s_logits.txt", name);
    return tu_oracle_load_ids(file, TOPK, IDS, N_TOK, fx);
}

static void check_config(const char *name, const char *args, int model_ctx) {
    char file[64];
    snprintf(file, sizeof file, "ap-%s.gguf", name);
    char *path = tu_make_model(file, args);
    CHECK(path != NULL);
    static tu_oracle fx;
    if (!path || !load_fixture(name, &fx)) {
        free(path);
        return;
    }
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 2, .n_ctx = model_ctx};
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    if (!m) {
        free(path);
        return;
    }
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    int V = info.n_vocab;
    float *all = malloc((size_t)N_TOK * (size_t)V * sizeof *all);
    kvgen_session *s = NULL, *d = NULL;
    kvgen_session_desc sd = {.n_ctx = 64, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    CHECK_OK(kvgen_session_prefill(s, IDS, N_TOK, all, &err));
    tu_oracle_cmp c = tu_oracle_compare(&fx, all, V, N_TOK, TOPK, 0.01f, name);
    int top1 = N_TOK - (c.clear - c.clear_top1); /* near-ties aside */
    double worst = c.max_diff;
    printf("%s (%s): top-1 as llama.cpp's at %d/%d positions (near-ties aside), max |logit diff| over its top-%d %.2g\n", name,
           info.architecture, top1, N_TOK, TOPK, worst);
    CHECKF(top1 == N_TOK, "%s: top-1 differs from llama.cpp at %d positions", name, N_TOK - top1);
    CHECKF(worst < 5e-3, "%s: logits differ from llama.cpp's by %g", name, worst);

    /* the cache path: one token at a time gives the prefill's logits */
    CHECK_OK(kvgen_session_create(m, &sd, &d, &err));
    double dec = 0;
    for (int i = 0; d && i < N_TOK; i++) {
        CHECK_OK(kvgen_session_decode(d, IDS[i], &err));
        double e = tu_max_diff(kvgen_session_logits(d), all + (size_t)i * (size_t)V, V);
        if (e > dec) dec = e;
    }
    CHECKF(dec == 0, "%s: decoding one by one differs from the prefill by %g", name, dec);
    kvgen_session_close(d);

    /* a context shift (keep 4, drop 18): the moved keys are re-rotated with each layer's own
     * RoPE. Layer 0's keys depend only on the token and its position, so they must equal the keys
     * a fresh run of the kept sequence computes (up to RoPE rounding). */
    kvgen_session_desc shd = {.n_ctx = N_TOK, .on_full = KVGEN_ON_FULL_SHIFT, .keep = 4, .no_prefix_reuse = 1};
    kvgen_session *sh = NULL, *fresh = NULL;
    CHECK_OK(kvgen_session_create(m, &shd, &sh, &err));
    CHECK_OK(kvgen_session_prefill(sh, IDS, N_TOK, NULL, &err));
    CHECK_OK(kvgen_session_decode(sh, 7, &err)); /* full: shifts */
    kvgen_cache_info ci;
    kvgen_session_cache_info(sh, &ci);
    CHECK(ci.shifts == 1 && ci.length == N_TOK - 18 + 1);
    CHECK_OK(kvgen_session_create(m, &sd, &fresh, &err));
    CHECK_OK(kvgen_session_prefill(fresh, kvgen_session_tokens(sh), kvgen_session_length(sh), NULL, &err));
    size_t nf = (size_t)ci.n_head_kv * ci.length * (size_t)ci.head_dim;
    float *ka = malloc(nf * sizeof *ka), *kb = malloc(nf * sizeof *kb);
    CHECK_OK(kvgen_session_read_cache(sh, 0, 0, ka, nf, &err));
    CHECK_OK(kvgen_session_read_cache(fresh, 0, 0, kb, nf, &err));
    double kd = 0, kmax = 0;
    for (size_t i = 0; i < nf; i++) {
        kd = fmax(kd, fabs((double)ka[i] - kb[i]));
        kmax = fmax(kmax, fabs((double)kb[i]));
    }
    printf("%s: after a context shift, layer 0's re-rotated keys within %.2g of a fresh run's (|k| up to %.2g)\n",
           name, kd, kmax);
    CHECKF(kd < 1e-5 * (1 + kmax), "%s: shifted keys differ from a fresh run's by %g", name, kd);
    free(ka);
    free(kb);
    kvgen_session_close(fresh);
    kvgen_session_close(sh);
    kvgen_session_close(s);
    free(all);
    kvgen_model_unload(m);
    free(path);
}

int main(void) {
    for (size_t i = 0; i < sizeof CONFIGS / sizeof CONFIGS[0]; i++)
        check_config(CONFIGS[i].name, CONFIGS[i].args, CONFIGS[i].model_ctx);
    return tu_finish("test_arch_parity");
}
