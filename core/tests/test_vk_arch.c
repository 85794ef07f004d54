/* test_vk_arch.c: every architecture of the table on the Vulkan backend against the reference.
 * The tiny random models of test_arch_parity (llama with rope_freqs, qwen2 biases, qwen3 Q/K head
 * norms with heads wider than n_embd, gemma2 post norms + soft-capping + sliding window + GELU +
 * embedding scale, gemma3 Q/K norms + post norms + sliding window with the local RoPE base, 7
 * layers so a global layer sits between local ones; phi3's fused matrices with partial rotary, and
 * with LongRoPE factors and an attention factor), in F32 and Q8_0, on both the f16 and the
 * forced-f32 KV cache:
 * (and gemma2 with caps small enough to matter on this model's scores and logits):
 * - a 40-token prefill (longer than the 8-token windows; every position's logits) and 16 greedy
 *   decodes within test_vk_model's tolerance of the reference: |vulkan - reference| <=
 *   0.01 * (2 + max|logit|) with the f16 cache, 5x tighter with force_f32; the K/V cache as read
 *   back (NEOX keys are held permuted on the device) within half of it;
 * - fork, rewind and context shift (keys re-rotated with each layer's own RoPE on the device)
 *   on a Vulkan session and a reference session doing the same, every step within tolerance,
 *   the shifted cache as read back too;
 * - a batched decode of 3 sessions (one step, each its own position and table) equal to separate
 *   decodes within 0.002 * (2 + max|logit|), as test_vk_batch;
 * the same in prefill chunks of 16 tokens with every matrix split into several buffers (qwen2,
 * gemma3); and the attention kernels alone (both of them, through the backend's own hook) with a sliding
 * window and soft-capping over contexts long enough to be split, against a CPU computation on
 * the same rounded K/V within 2e-4, as test_vk_kernels. With KVGEN_VALIDATE=1 the validation
 * layer must stay silent. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_quant.h"
#include "kvg_session.h"
#include "kvg_vk.h"
#include "testutil.h"

#define N_TOK 40
#define N_DEC 16

static const int32_t IDS[N_TOK] = {1,   17, 42,  99, 3,   250, 7,   130, 64,  5,  77,  201, 12, 180,
                                   33,  9,  144, 60, 2,   222, 18,  95,  41,  170, 8,  66,  133, 27,
                                   240, 50, 11,  190, 73, 36,  155, 4,   210, 88,  29, 120};

static const struct {
    const char *name, *arch, *args;
} CONFIGS[] = {
    {"llama_rope_freqs", "llama",
     "--arch llama --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --rope-freqs --seed 71"},
    {"qwen2", "qwen2",
     "--arch qwen2 --qkv-bias --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --rope-base 1000000 --seed 72"},
    {"qwen3", "qwen3",
     "--arch qwen3 --qk-norm --layers 2 --embd 64 --heads 4 --kv-heads 2 --head-dim 32 --ff 96 --rope-base 1000000 "
     "--seed 73"},
    {"gemma2", "gemma2",
     "--arch gemma2 --post-norms --swa 8 --softcap 50,30 --layers 3 --embd 64 --heads 4 --kv-heads 2 --ff 96 "
     "--seed 74"},
    /* the parity file's caps (50, 30) hardly touch this model's scores and logits: small ones do */
    {"gemma2_caps", "gemma2",
     "--arch gemma2 --post-norms --swa 8 --softcap 0.5,2 --layers 3 --embd 64 --heads 4 --kv-heads 2 --ff 96 "
     "--seed 76"},
    {"gemma3", "gemma3",
     "--arch gemma3 --qk-norm --post-norms --swa 8 --layers 7 --embd 64 --heads 4 --kv-heads 1 --head-dim 32 "
     "--ff 96 --rope-base 1000000 --seed 75"},
    {"phi3", "phi3", "--arch phi3 --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --rope-dim 12 --untied --seed 76"},
    {"phi3_longrope", "phi3",
     "--arch phi3 --layers 2 --embd 64 --heads 4 --ff 96 --ctx 4096 --orig-ctx 512 --rope-factors --seed 77"},
};

static int n_vocab;
static double worst_attn;
static double rel_tol;
static double worst_seen[2]; /* [force_f32]: the worst excess over every comparison */
static double worst_abs[2];  /* ... and the largest |vulkan - reference| logit difference */

static kvgen_model *load(const char *path, kvgen_backend backend, int force_f32) {
    kvgen_model_desc d = {.path = path, .backend = backend, .force_f32 = force_f32, .n_threads = 2};
    return tu_load(&d);
}

/* worst |a - b| over n values in units of rel * (2 + max|b|) (<= 1 passes; NaN fails) */
static double excess_n(const float *a, const float *b, size_t n, double rel, double *abs_out) {
    if (!a || !b) return INFINITY;
    double mx = 0, worst = 0, wa = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs((double)b[i]));
    double tol = rel * (2 + mx);
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= wa)) wa = d;
        if (!(d / tol <= worst)) worst = d / tol;
    }
    if (abs_out) *abs_out = wa;
    return worst;
}

/* one comparison of Vulkan logits against the reference's, recorded in the worst figures */
static double compare(const float *v, const float *r, size_t n, int f32) {
    double a = 0, e = excess_n(v, r, n, rel_tol, &a);
    if (!(e <= worst_seen[f32])) worst_seen[f32] = e;
    if (!(a <= worst_abs[f32])) worst_abs[f32] = a;
    return e;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* a Vulkan session and its reference twin */
typedef struct pair {
    kvgen_session *v, *r;
} pair;

static int cur_f32;

static void check_pair(const pair *p, const char *what) {
    size_t n = kvgen_session_length(p->v);
    CHECKF(n == kvgen_session_length(p->r), "%s: lengths %zu vs %zu", what, n, kvgen_session_length(p->r));
    double e = compare(kvgen_session_logits(p->v), kvgen_session_logits(p->r), (size_t)n_vocab, cur_f32);
    CHECKF(e <= 1, "%s: logits differ from the reference by %.3g x the tolerance", what, e);
}

static void pair_decode(pair *p, int32_t t, const char *what) {
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_decode(p->v, t, &err));
    CHECK_OK(kvgen_session_decode(p->r, t, &err));
    check_pair(p, what);
}

static void pair_close(pair *p) {
    kvgen_session_close(p->v);
    kvgen_session_close(p->r);
    p->v = p->r = NULL;
}

/* one layer's K (which 0) or V of both sessions as read back, within half the tolerance */
static void check_cache(const pair *p, int layer, int which, const char *what) {
    kvgen_cache_info ci;
    kvgen_session_cache_info(p->v, &ci);
    size_t nf = (size_t)ci.n_head_kv * ci.length * (size_t)ci.head_dim;
    float *a = malloc(nf * sizeof *a), *b = malloc(nf * sizeof *b);
    kvgen_error err = {0};
    if (a && b) {
        CHECK_OK(kvgen_session_read_cache(p->v, layer, which, a, nf, &err));
        CHECK_OK(kvgen_session_read_cache(p->r, layer, which, b, nf, &err));
        /* a sliding-window layer's released positions read as zeros, and the two models' page
         * sizes may release different ones: rows only one side still holds are not compared */
        /* the window of either side (a device that cannot bind the split pool keeps one group) */
        kvgen_cache_info cr;
        kvgen_session_cache_info(p->r, &cr);
        if (cr.window > ci.window) ci.window = cr.window;
        size_t hd = (size_t)ci.head_dim, held = 0;
        for (size_t r = 0; ci.window > 0 && r < nf / hd; r++) {
            bool za = true, zb = true;
            for (size_t d = 0; d < hd; d++) {
                za = za && a[r * hd + d] == 0.0f;
                zb = zb && b[r * hd + d] == 0.0f;
            }
            if (za != zb) {
                memset(a + r * hd, 0, hd * sizeof *a);
                memset(b + r * hd, 0, hd * sizeof *b);
            }
            held += !za && !zb && r % ci.length + ci.window > ci.length; /* what the next query sees */
        }
        size_t last = ci.length < ci.window ? ci.length : ci.window - 1;
        CHECKF(ci.window == 0 || held == (size_t)ci.n_head_kv * last, "%s: layer %d: %zu of the last window's rows "
               "held on both sides", what, layer, held);
        double e = excess_n(a, b, nf, rel_tol * 0.5, NULL);
        CHECKF(e <= 1, "%s: layer %d %s read back differs by %.3g x the tolerance", what, layer, which ? "V" : "K", e);
    }
    free(a);
    free(b);
}

/* prefill (every position), greedy decodes, the cache read back */
static void check_forward(kvgen_model *mr, kvgen_model *mv, const char *what, int n_layer) {
    kvgen_session_desc sd = {.n_ctx = 128};
    pair p = {0};
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_create(mv, &sd, &p.v, &err));
    CHECK_OK(kvgen_session_create(mr, &sd, &p.r, &err));
    size_t nl = (size_t)N_TOK * (size_t)n_vocab;
    float *lv = malloc(nl * sizeof *lv), *lr = malloc(nl * sizeof *lr);
    if (p.v && p.r && lv && lr) {
        CHECK_OK(kvgen_session_prefill(p.v, IDS, N_TOK, lv, &err));
        CHECK_OK(kvgen_session_prefill(p.r, IDS, N_TOK, lr, &err));
        double e = 0;
        for (int t = 0; t < N_TOK; t++)
            e = fmax(e, compare(lv + (size_t)t * n_vocab, lr + (size_t)t * n_vocab, (size_t)n_vocab, cur_f32));
        CHECKF(e <= 1, "%s: prefill logits off by %.3g x the tolerance", what, e);
        for (int i = 0; i < N_DEC; i++) pair_decode(&p, argmax(kvgen_session_logits(p.r), n_vocab), what);
        for (int which = 0; which < 2; which++) {
            check_cache(&p, 0, which, what);
            check_cache(&p, n_layer - 1, which, what);
        }
    }
    free(lv);
    free(lr);
    pair_close(&p);
}

/* fork (the child diverges), rewind, and context shifts past the full context */
static void check_session_ops(kvgen_model *mr, kvgen_model *mv, const char *what, int n_layer) {
    kvgen_error err = {0};
    char msg[160];
    kvgen_session_desc sd = {.n_ctx = 128};
    pair p = {0}, c = {0};
    CHECK_OK(kvgen_session_create(mv, &sd, &p.v, &err));
    CHECK_OK(kvgen_session_create(mr, &sd, &p.r, &err));
    if (!p.v || !p.r) return;
    CHECK_OK(kvgen_session_prefill(p.v, IDS, N_TOK - 3, NULL, &err));
    CHECK_OK(kvgen_session_prefill(p.r, IDS, N_TOK - 3, NULL, &err));
    CHECK_OK(kvgen_session_fork(p.v, &c.v, &err));
    CHECK_OK(kvgen_session_fork(p.r, &c.r, &err));
    snprintf(msg, sizeof msg, "%s: fork", what);
    for (int i = 0; c.v && c.r && i < 6; i++) {
        pair_decode(&p, IDS[i], msg);
        pair_decode(&c, IDS[N_TOK - 1 - i], msg);
    }
    pair_close(&c);
    snprintf(msg, sizeof msg, "%s: rewind", what);
    CHECK_OK(kvgen_session_rewind(p.v, 12, &err));
    CHECK_OK(kvgen_session_rewind(p.r, 12, &err));
    check_pair(&p, msg);
    for (int i = 0; i < 4; i++) pair_decode(&p, IDS[3 * i + 1], msg);
    pair_close(&p);

    /* keep 4 of 48: each shift drops 22, the kept keys re-rotated by each layer's RoPE */
    kvgen_session_desc shd = {.n_ctx = 48, .on_full = KVGEN_ON_FULL_SHIFT, .keep = 4};
    pair s = {0};
    CHECK_OK(kvgen_session_create(mv, &shd, &s.v, &err));
    CHECK_OK(kvgen_session_create(mr, &shd, &s.r, &err));
    if (!s.v || !s.r) return;
    snprintf(msg, sizeof msg, "%s: context shift", what);
    CHECK_OK(kvgen_session_prefill(s.v, IDS, N_TOK, NULL, &err));
    CHECK_OK(kvgen_session_prefill(s.r, IDS, N_TOK, NULL, &err));
    for (int i = 0; i < 40; i++) pair_decode(&s, IDS[(7 * i + 3) % N_TOK], msg);
    kvgen_cache_info ci;
    kvgen_session_cache_info(s.v, &ci);
    CHECKF(ci.shifts >= 2, "%s: %zu shifts", msg, ci.shifts);
    for (int l = 0; l < n_layer; l += n_layer > 1 ? n_layer - 1 : 1) check_cache(&s, l, 0, msg);
    pair_close(&s);
}

/* 3 sessions decoding one step together against their twins decoding alone (all Vulkan) */
static void check_batch(kvgen_model *mv, const char *what) {
    enum { N = 3, STEPS = 3 };
    static const size_t lens[N] = {12, 40, 25};
    kvgen_session *a[N] = {0}, *b[N] = {0};
    kvgen_error err = {0};
    kvgen_session_desc sd = {.n_ctx = 128, .no_prefix_reuse = 1};
    for (int i = 0; i < N; i++) {
        CHECK_OK(kvgen_session_create(mv, &sd, &a[i], &err));
        CHECK_OK(kvgen_session_create(mv, &sd, &b[i], &err));
        if (!a[i] || !b[i]) goto out;
        CHECK_OK(kvgen_session_prefill(a[i], IDS + i, lens[i] - (size_t)i, NULL, &err));
        CHECK_OK(kvgen_session_prefill(b[i], IDS + i, lens[i] - (size_t)i, NULL, &err));
    }
    double worst = 0;
    for (int step = 0; step < STEPS; step++) {
        int32_t toks[N] = {IDS[step + 5], IDS[step + 11], IDS[step + 23]};
        for (int i = 0; i < N; i++) CHECK_OK(kvgen_session_decode(b[i], toks[i], &err));
        kvgen_status status[N];
        kvgen_error errs[N];
        kvgen_status st = kvg_session_decode_batch(a, toks, N, true, status, errs);
        CHECKF(st == KVGEN_OK, "%s: batch step %d: %s", what, step, errs[0].message);
        for (int i = 0; i < N; i++) {
            double e = excess_n(kvgen_session_logits(a[i]), kvgen_session_logits(b[i]), (size_t)n_vocab, 0.002, NULL);
            CHECKF(e <= 1, "%s: batch step %d session %d: batched logits differ by %.3g x the tolerance", what, step,
                   i, e);
            if (e > worst) worst = e;
        }
    }
    printf("%s: batched vs separate decodes: worst %.3g x the tolerance\n", what, worst);
out:
    for (int i = 0; i < N; i++) {
        kvgen_session_close(a[i]);
        kvgen_session_close(b[i]);
    }
}

/* ---- the attention kernels alone: sliding window and soft-capping ---- */

static uint64_t rng = 0x9e3779b9ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static float round_kv(const kvg_vk_ctx *ctx, float v) { return ctx->kv_f16 ? kvg_f16_to_f32(kvg_f32_to_f16(v)) : v; }

/* ncols queries at pos0.. over a window of `window` positions (0: all), scores soft-capped at
 * `cap` (0: none), against double on the CPU over the same rounded K/V (queries scaled up so that
 * the cap matters) */
static void check_window(kvg_vk_ctx *ctx, int n_head, int n_kv, int hd, int pos0, int ncols, int nsplit,
                         kvg_vk_layout layout, int window, float cap) {
    int n_ctx = pos0 + ncols + 3, page = 16;
    size_t nkv = (size_t)n_kv * n_ctx * hd, nq = (size_t)ncols * n_head * hd;
    float *k = malloc(nkv * 4), *v = malloc(nkv * 4), *q = malloc(nq * 4), *out = malloc(nq * 4);
    double *sc = malloc(sizeof(double) * (size_t)(pos0 + ncols));
    for (size_t i = 0; i < nkv; i++) {
        k[i] = frand();
        v[i] = frand();
    }
    for (size_t i = 0; i < nq; i++) q[i] = frand() * 6.0f;
    kvgen_error err = {0};
    kvgen_status st = kvg_vk_test_attention_layer(ctx, n_head, n_kv, hd, n_ctx, pos0, ncols, nsplit, layout, page, true,
                                                  0, window, cap, q, k, v, out, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    int bad = 0, G = n_head / n_kv;
    double worst = 0;
    for (int t = 0; t < ncols && st == KVGEN_OK; t++) {
        int pos = pos0 + t, first = window > 0 && pos >= window ? pos - window + 1 : 0;
        for (int h = 0; h < n_head; h++) {
            const float *qh = q + ((size_t)t * n_head + h) * hd;
            int kvh = h / G;
            double mx = -1e300, sum = 0;
            for (int p = first; p <= pos; p++) {
                const float *kp = k + ((size_t)kvh * n_ctx + p) * hd;
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)qh[e] * round_kv(ctx, kp[e]);
                d /= sqrt((double)hd);
                if (cap > 0) d = cap * tanh(d / cap);
                sc[p] = d;
                if (d > mx) mx = d;
            }
            for (int p = first; p <= pos; p++) sum += (sc[p] = exp(sc[p] - mx));
            for (int e = 0; e < hd; e++) {
                double o = 0;
                for (int p = first; p <= pos; p++) o += sc[p] * round_kv(ctx, v[((size_t)kvh * n_ctx + p) * hd + e]);
                o /= sum;
                double got = out[((size_t)t * n_head + h) * hd + e], diff = fabs(got - o);
                if (!(diff <= worst)) worst = diff;
                if (!(diff <= 2e-4) && bad++ < 3)
                    fprintf(stderr, "  attn t %d h %d e %d: got %g want %g\n", t, h, e, got, o);
            }
        }
    }
    CHECKF(bad == 0, "attention heads %d/%d hd %d pos0 %d ncols %d nsplit %d %s window %d cap %g kv_f16 %d: %d "
           "wrong (worst %g)", n_head, n_kv, hd, pos0, ncols, nsplit, kvg_vk_layout_name(layout), window, cap,
           ctx->kv_f16, bad, worst);
    if (worst > worst_attn) worst_attn = worst;
    free(sc); free(k); free(v); free(q); free(out);
}

static void check_kernels(void) {
    for (int force = 0; force <= 1; force++) {
        kvg_vk_ctx_desc d = {.force_f32 = force};
        kvg_vk_ctx *ctx = NULL;
        kvgen_error err = {0};
        kvgen_status st = kvg_vk_ctx_create(&d, &ctx, &err);
        CHECKF(st == KVGEN_OK, "%s", err.message);
        if (st != KVGEN_OK) return;
        /* attn.comp (COOP), attn_lane.comp (LANE), attn.comp's subgroup variant (SUBGROUP) */
        kvg_vk_layout last = ctx->info.subgroup_arithmetic ? KVG_VK_LAYOUT_SUBGROUP : KVG_VK_LAYOUT_LANE;
        for (kvg_vk_layout l = KVG_VK_LAYOUT_COOP; l <= last; l++) {
            check_window(ctx, 4, 2, 32, 0, 40, 1, l, 8, 50.0f);     /* prefill from empty, past the window */
            check_window(ctx, 4, 2, 32, 30, 9, 1, l, 8, 0.0f);      /* prefill after a cached prefix */
            check_window(ctx, 4, 1, 32, 39, 1, 16, l, 8, 0.0f);     /* decode, splits */
            check_window(ctx, 6, 2, 64, 2999, 1, 16, l, 1000, 20.0f); /* splits over the window only */
            check_window(ctx, 6, 2, 64, 2999, 1, 1, l, 1000, 0.0f);
            check_window(ctx, 6, 2, 64, 4999, 1, 8, l, 4500, 0.0f);  /* window past 4096: still split */
            check_window(ctx, 6, 2, 64, 5000, 3, 1, l, 4500, 30.0f); /* prefill past 4096 */
            check_window(ctx, 6, 2, 64, 600, 20, 1, l, 64, 5.0f);   /* a strong cap */
            check_window(ctx, 6, 2, 64, 600, 1, 16, l, 0, 5.0f);    /* cap without a window */
        }
        CHECKF(kvg_vk_validation_count(ctx) == 0, "%d validation messages", kvg_vk_validation_count(ctx));
        kvg_vk_ctx_destroy(ctx);
    }
    printf("attention with windows and soft-capping: worst |vulkan - double| %.3g (tolerance 2e-4)\n", worst_attn);
}

static void check_arch(int ci, const char *type, int force_f32, bool session_ops, const char *note) {
    char file[64], args[512], what[96];
    snprintf(file, sizeof file, "vka-%s-%s.gguf", CONFIGS[ci].name, type);
    snprintf(args, sizeof args, "%s --type %s", CONFIGS[ci].args, type);
    snprintf(what, sizeof what, "%s %s %s%s", CONFIGS[ci].name, type, force_f32 ? "f32 cache" : "f16 cache", note);
    char *path = tu_make_model(file, args);
    CHECK(path != NULL);
    if (!path) return;
    kvgen_model *mr = load(path, KVGEN_BACKEND_REFERENCE, 0), *mv = load(path, KVGEN_BACKEND_VULKAN, force_f32);
    if (mr && mv) {
        kvgen_model_info info;
        kvgen_model_get_info(mv, &info);
        CHECKF(strcmp(info.backend, "vulkan") == 0 && strcmp(info.architecture, CONFIGS[ci].arch) == 0,
               "%s: backend %s, architecture %s", what, info.backend, info.architecture);
        n_vocab = info.n_vocab;
        rel_tol = force_f32 ? 0.002 : 0.01;
        cur_f32 = force_f32;
        double before = worst_seen[force_f32];
        worst_seen[force_f32] = 0;
        check_forward(mr, mv, what, info.n_layer);
        if (session_ops) {
            check_session_ops(mr, mv, what, info.n_layer);
            check_batch(mv, what);
        }
        printf("%s: worst %.3g x the tolerance\n", what, worst_seen[force_f32]);
        worst_seen[force_f32] = fmax(before, worst_seen[force_f32]);
        CHECKF(kvg_vk_validation_count(kvg_vk_model_ctx(mv)) == 0, "%s: validation messages", what);
    }
    kvgen_model_unload(mr);
    kvgen_model_unload(mv);
    free(path);
}

int main(void) {
    int n_dev = 0;
    kvgen_error err = {0};
    if (kvgen_devices(NULL, 0, &n_dev, &err) != KVGEN_OK || n_dev == 0) tu_skip("no Vulkan device");
    check_kernels();
    for (int i = 0; i < (int)(sizeof CONFIGS / sizeof CONFIGS[0]); i++) {
        check_arch(i, "F32", 0, true, "");
        check_arch(i, "Q8_0", 0, false, "");
        check_arch(i, "Q8_0", 1, true, "");
    }
    /* prefill chunks of 16 (windows reaching back across chunks) and every matrix split into
     * parts of 64 rows (biases and RoPE by global row) */
    setenv("KVGEN_VK_CHUNK", "16", 1);
    for (int i = 0; i < (int)(sizeof CONFIGS / sizeof CONFIGS[0]); i++) {
        /* qwen2's QKV has 128 rows of 256 bytes, gemma3's 192 (and a 28 KiB KV page) */
        const char *part = strcmp(CONFIGS[i].name, "qwen2") == 0 ? "8192" : "32768";
        if (strcmp(CONFIGS[i].name, "qwen2") && strcmp(CONFIGS[i].name, "gemma3")) continue;
        setenv("KVGEN_VK_MAX_PART", part, 1);
        check_arch(i, "F32", 0, false, ", chunks of 16, split matrices");
    }
    unsetenv("KVGEN_VK_CHUNK");
    unsetenv("KVGEN_VK_MAX_PART");
    printf("worst over every comparison: f16 cache %.3g x the tolerance (|d| up to %.3g), f32 cache %.3g x (|d| up "
           "to %.3g)\n",
           worst_seen[0], worst_abs[0], worst_seen[1], worst_abs[1]);
    return tu_finish("test_vk_arch");
}
