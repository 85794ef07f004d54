/* test_reference.c: the CPU reference forward pass on random-weight models of several shapes:
 * its math helpers by hand, one token through a hand-written single-layer forward, the KV
 * cache against full recomputation, batched prefill against token-by-token decode, and
 * thread-count independence. */
#include <math.h>
#include <string.h>
#include "kvg_gguf.h"
#include "kvg_model.h"
#include "kvg_quant.h"
#include "kvg_reference.h"
#include "testutil.h"

#define N_PROMPT 5
#define N_GEN 64
#define N_SEQ (N_PROMPT + N_GEN)
#define TOL 1e-4

static int near(double a, double b, double tol) { return fabs(a - b) <= tol; }

static void test_math(void) {
    /* RMSNorm: mean(x^2) = (1 + 4 + 9 + 16) / 4 = 7.5 */
    float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 2, 0.5f}, out[4];
    kvg_ref_rmsnorm(out, x, w, 4, 0.0f);
    double s = 1.0 / sqrt(7.5);
    CHECK(near(out[0], 1 * s, 1e-6) && near(out[1], 2 * s, 1e-6) && near(out[2], 6 * s, 1e-6) &&
          near(out[3], 2 * s, 1e-6));
    kvg_ref_rmsnorm(out, x, w, 4, 0.5f); /* eps adds inside the root */
    CHECK(near(out[0], 1.0 / sqrt(8.0), 1e-6));

    /* RoPE: adjacent pairs; pair i turns by pos * base^(-2i/n_rot); dims past n_rot untouched */
    float v[6] = {1, 0, 0, 2, 5, 7};
    kvg_ref_rope(v, 4, 0, 10000.0f);
    CHECK(v[0] == 1 && v[1] == 0 && v[2] == 0 && v[3] == 2 && v[4] == 5 && v[5] == 7);
    kvg_ref_rope(v, 4, 3, 10000.0f);
    /* pair 0: theta = 3 */
    CHECK(near(v[0], cos(3.0), 1e-6) && near(v[1], sin(3.0), 1e-6));
    /* pair 1: theta = 3 * 10000^(-1/2) = 0.03; (0, 2) turns to (-2 sin, 2 cos) */
    CHECK(near(v[2], -2 * sin(0.03), 1e-6) && near(v[3], 2 * cos(0.03), 1e-6));
    CHECK(v[4] == 5 && v[5] == 7);
    /* rotating by pos a then b equals rotating by a + b */
    float a[4] = {0.3f, -1.2f, 2.0f, 0.7f}, b[4];
    memcpy(b, a, sizeof a);
    kvg_ref_rope(a, 4, 5, 100.0f);
    kvg_ref_rope(a, 4, 7, 100.0f);
    kvg_ref_rope(b, 4, 12, 100.0f);
    for (int i = 0; i < 4; i++) CHECKF(near(a[i], b[i], 1e-5), "rope composition at %d: %g vs %g", i, a[i], b[i]);

    float sm[3] = {0.0f, logf(3.0f), -INFINITY};
    kvg_ref_softmax(sm, 3);
    CHECK(near(sm[0], 0.25, 1e-6) && near(sm[1], 0.75, 1e-6) && sm[2] == 0.0f);
    float big[2] = {1000.0f, 1000.0f}; /* the max is subtracted: no overflow */
    kvg_ref_softmax(big, 2);
    CHECK(near(big[0], 0.5, 1e-6));

    CHECK(kvg_ref_silu(0.0f) == 0.0f && near(kvg_ref_silu(2.0f), 2.0 / (1.0 + exp(-2.0)), 1e-6));
}

static float *tensor_f32(const kvg_tensor *t) {
    float *f = malloc(t->n_elements * sizeof(float));
    size_t row = kvg_row_bytes(t->type, t->ne[0]);
    for (uint64_t r = 0; r < t->n_elements / t->ne[0]; r++)
        kvg_dequantize_row(t->type, (const unsigned char *)t->data + r * row, f + r * t->ne[0], t->ne[0]);
    return f;
}

/* y[out] = W x, W stored [ne0 = in, ne1 = out] */
static void naive_matvec(const float *W, const float *x, int in, int out, float *y) {
    for (int r = 0; r < out; r++) {
        double acc = 0;
        for (int i = 0; i < in; i++) acc += (double)W[(size_t)r * in + i] * x[i];
        y[r] = (float)acc;
    }
}

static void naive_rmsnorm(const float *x, const float *w, int n, float eps, float *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = (float)(x[i] * s * w[i]);
}

/* An independent single-layer forward of one token at position 0, where attention over one
 * position is just V (RoPE at position 0 is the identity): checks the wiring (which matrix
 * feeds which, gate vs up, tied output) rather than the helpers. */
static void test_first_token(const char *path) {
    kvgen_error err = {0};
    kvg_gguf *g = NULL;
    kvg_weights w = {0};
    CHECK_OK(kvg_gguf_open(path, &g, &err));
    if (!g) return;
    CHECK_OK(kvg_weights_describe(g, &w, &err));
    const kvg_hparams *hp = &w.hp;
    int D = hp->n_embd, F = hp->n_ff, qd = hp->n_head * hp->head_dim, kvd = hp->n_head_kv * hp->head_dim;
    int group = hp->n_head / hp->n_head_kv, V = hp->n_vocab, tok = 3 % V;

    float *x = calloc((size_t)D, sizeof(float)), *xb = calloc((size_t)D, sizeof(float));
    float *v = calloc((size_t)kvd, sizeof(float)), *att = calloc((size_t)qd, sizeof(float));
    float *tmp = calloc((size_t)(D > F ? D : F), sizeof(float));
    float *gate = calloc((size_t)F, sizeof(float)), *up = calloc((size_t)F, sizeof(float));
    float *logits = calloc((size_t)V, sizeof(float));
    float *emb = tensor_f32(w.tok_embd);
    memcpy(x, emb + (size_t)tok * D, (size_t)D * sizeof(float));
    for (int l = 0; l < hp->n_layer; l++) {
        const kvg_layer *L = &w.layers[l];
        float *an = tensor_f32(L->attn_norm), *fn = tensor_f32(L->ffn_norm);
        float *wv = tensor_f32(L->wv), *wo = tensor_f32(L->wo);
        float *wg = tensor_f32(L->w_gate), *wu = tensor_f32(L->w_up), *wd = tensor_f32(L->w_down);
        naive_rmsnorm(x, an, D, hp->rms_norm_eps, xb);
        naive_matvec(wv, xb, D, kvd, v);
        for (int h = 0; h < hp->n_head; h++) /* softmax over one position is 1: output = V of its kv head */
            memcpy(att + (size_t)h * hp->head_dim, v + (size_t)(h / group) * hp->head_dim,
                   (size_t)hp->head_dim * sizeof(float));
        naive_matvec(wo, att, qd, D, tmp);
        for (int i = 0; i < D; i++) x[i] += tmp[i];
        naive_rmsnorm(x, fn, D, hp->rms_norm_eps, xb);
        naive_matvec(wg, xb, D, F, gate);
        naive_matvec(wu, xb, D, F, up);
        for (int i = 0; i < F; i++) gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
        naive_matvec(wd, gate, F, D, tmp);
        for (int i = 0; i < D; i++) x[i] += tmp[i];
        free(an), free(fn), free(wv), free(wo), free(wg), free(wu), free(wd);
    }
    float *on = tensor_f32(w.output_norm), *out = tensor_f32(w.output);
    naive_rmsnorm(x, on, D, hp->rms_norm_eps, xb);
    naive_matvec(out, xb, D, V, logits);

    kvgen_model *m = NULL;
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 2};
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    kvgen_session *s = NULL;
    if (m) CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    int32_t t = tok;
    if (s) CHECK_OK(kvgen_session_prefill(s, &t, 1, NULL, &err));
    const float *ref = s ? kvgen_session_logits(s) : NULL;
    CHECK(ref != NULL);
    double max_diff = 0, max_abs = 0;
    for (int i = 0; ref && i < V; i++) {
        double d = fabs((double)ref[i] - logits[i]);
        if (d > max_diff) max_diff = d;
        if (fabs(logits[i]) > max_abs) max_abs = fabs(logits[i]);
    }
    CHECKF(max_diff < 1e-3 * (1 + max_abs), "%s: first-token logits differ from the naive forward by %g", path,
           max_diff);
    CHECKF(max_abs > 0, "%s: naive logits are all zero", path);

    kvgen_session_close(s);
    kvgen_model_unload(m);
    free(on), free(out), free(emb), free(x), free(xb), free(v), free(att), free(tmp), free(gate), free(up);
    free(logits);
    kvg_weights_free(&w);
    kvg_gguf_close(g);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN propagates as a failure */
    }
    return m;
}

static kvgen_model *load(const char *path, int threads) {
    kvgen_error err = {0};
    kvgen_model *m = NULL;
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = threads};
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    if (!m) fprintf(stderr, "%s: %s\n", path, err.message);
    return m;
}

static kvgen_session *open_session(kvgen_model *m, int no_cache) {
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {.n_ctx = 128, .no_cache = no_cache};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    return s;
}

static void test_shape(const char *name, const char *args) {
    char *path = tu_make_model(name, args);
    CHECKF(path != NULL, "kvgen-mkmodel %s", args);
    if (!path) return;
    printf("model %s: %s\n", name, args);
    test_first_token(path);

    kvgen_model *m2 = load(path, 2);
    if (!m2) {
        free(path);
        return;
    }
    kvgen_model_info info;
    kvgen_model_get_info(m2, &info);
    CHECK(strcmp(info.backend, "reference") == 0);
    size_t V = (size_t)info.n_vocab;
    kvgen_error err = {0};

    /* 1. KV cache vs full recomputation, at every step of a greedy generation */
    int32_t seq[N_SEQ];
    for (int i = 0; i < N_PROMPT; i++) seq[i] = (int32_t)((i * 7919 + 11) % info.n_vocab);
    kvgen_session *cached = open_session(m2, 0), *uncached = open_session(m2, 1);
    float *step_logits = malloc((size_t)N_SEQ * V * sizeof(float)); /* row p: logits after seq[0..p] */
    if (cached && uncached) {
        CHECK_OK(kvgen_session_prefill(cached, seq, N_PROMPT, NULL, &err));
        CHECK_OK(kvgen_session_prefill(uncached, seq, N_PROMPT, NULL, &err));
        double worst = 0;
        for (int p = N_PROMPT - 1; p < N_SEQ; p++) {
            const float *a = kvgen_session_logits(cached), *b = kvgen_session_logits(uncached);
            if (!a || !b) {
                CHECK(a && b);
                break;
            }
            memcpy(step_logits + (size_t)p * V, a, V * sizeof(float));
            double d = max_abs_diff(a, b, V);
            if (!(d <= worst)) worst = d;
            if (p + 1 == N_SEQ) break;
            seq[p + 1] = kvgen_session_sample(cached);
            CHECK(seq[p + 1] >= 0 && seq[p + 1] < info.n_vocab);
            CHECK_OK(kvgen_session_decode(cached, seq[p + 1], &err));
            CHECK_OK(kvgen_session_decode(uncached, seq[p + 1], &err));
        }
        CHECKF(worst < TOL, "%s: cached vs uncached logits differ by %g", name, worst);
        CHECK(kvgen_session_length(cached) == N_SEQ && kvgen_session_length(uncached) == N_SEQ);
        double mag = 0;
        for (size_t i = 0; i < V; i++) mag += fabs(step_logits[(size_t)(N_SEQ - 1) * V + i]);
        CHECKF(mag > 0 && isfinite(mag), "%s: logits are zero or not finite", name);
    }

    /* 2. one all-logits prefill of the whole sequence (two blocks) vs token-by-token decode */
    float *all = malloc((size_t)N_SEQ * V * sizeof(float));
    kvgen_session *batch = open_session(m2, 0), *steps = open_session(m2, 0);
    if (batch && steps) {
        CHECK_OK(kvgen_session_prefill(batch, seq, N_SEQ, all, &err));
        double worst = 0;
        for (int p = 0; p < N_SEQ; p++) {
            CHECK_OK(kvgen_session_decode(steps, seq[p], &err));
            const float *l = kvgen_session_logits(steps);
            if (!l) break;
            double d = max_abs_diff(all + (size_t)p * V, l, V);
            if (!(d <= worst)) worst = d;
            if (p >= N_PROMPT - 1) {
                d = max_abs_diff(l, step_logits + (size_t)p * V, V);
                if (!(d <= worst)) worst = d;
            }
        }
        CHECKF(worst < TOL, "%s: all-logits prefill vs decode differ by %g", name, worst);
        CHECK(max_abs_diff(kvgen_session_logits(batch), all + (size_t)(N_SEQ - 1) * V, V) == 0);
    }

    /* 3. the uncached session's all-logits prefill agrees too (it recomputes from position 0) */
    kvgen_session *nc = open_session(m2, 1);
    if (nc) {
        float *tail = malloc((size_t)(N_SEQ - 10) * V * sizeof(float));
        CHECK_OK(kvgen_session_prefill(nc, seq, 10, NULL, &err));
        CHECK_OK(kvgen_session_prefill(nc, seq + 10, N_SEQ - 10, tail, &err));
        double d = max_abs_diff(tail, all + 10 * V, (size_t)(N_SEQ - 10) * V);
        CHECKF(d < TOL, "%s: no-cache all-logits prefill differs by %g", name, d);
        free(tail);
    }

    /* 4. thread count does not change a single bit */
    int thread_counts[2] = {1, 3};
    for (int i = 0; i < 2; i++) {
        kvgen_model *mt = load(path, thread_counts[i]);
        kvgen_session *st = mt ? open_session(mt, 0) : NULL;
        if (st) {
            float *other = malloc((size_t)N_SEQ * V * sizeof(float));
            CHECK_OK(kvgen_session_prefill(st, seq, N_SEQ, other, &err));
            CHECKF(memcmp(other, all, (size_t)N_SEQ * V * sizeof(float)) == 0,
                   "%s: %d threads vs 2 threads: logits differ", name, thread_counts[i]);
            free(other);
        }
        kvgen_session_close(st);
        kvgen_model_unload(mt);
    }

    free(all);
    free(step_logits);
    kvgen_session_close(nc);
    kvgen_session_close(batch);
    kvgen_session_close(steps);
    kvgen_session_close(cached);
    kvgen_session_close(uncached);
    kvgen_model_unload(m2);
    free(path);
}

int main(void) {
    test_math();
    test_shape("ref_gqa_q4_1.gguf", "--seed 1 --layers 2 --embd 64 --ff 96 --heads 4 --kv-heads 2 --type Q4_1");
    test_shape("ref_mha_q8_0.gguf", "--seed 2 --layers 2 --embd 64 --ff 160 --heads 4 --kv-heads 4 --type Q8_0");
    test_shape("ref_mqa_q4_0.gguf",
               "--seed 3 --layers 3 --embd 96 --ff 64 --heads 3 --kv-heads 1 --type Q4_0 --untied");
    test_shape("ref_odd_f32.gguf", "--seed 4 --layers 2 --embd 60 --ff 100 --heads 5 --kv-heads 5 --type F32");
    test_shape("ref_f16.gguf", "--seed 5 --layers 1 --embd 64 --ff 128 --heads 2 --kv-heads 1 --type F16 --untied");
    return tu_finish("test_reference");
}
