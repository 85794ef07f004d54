/* test_vk_batch.c: the Vulkan backend's batched decode (one forward over a batch of one-token
 * sequences): one token each of several sessions in one step, each with its own page table and
 * position, the mat-vecs reading each weight once for all of them. On a random model (pages of
 * 16 so tables differ in length, forks so they share pages):
 * - batches of 9, 11, 16, 33 and VK_BATCH_MAX + 1 sessions (prompts 1..100 tokens; the last
 *   needs two steps, one of every column a step takes and one of a single column) decode 6
 *   tokens batched, and their twins decode the same tokens one at a time: logits within
 *   0.002 * (2 + max|logit|) (the f16 cache is written by the same kernels, only the column
 *   count of the mat-vec differs: past 8 columns, groups of 8 in one submission), and a batch
 *   ran as one step of all its columns (the last: one of VK_BATCH_MAX, one alone);
 *   every other step keeps the logits on the device, where each column's argmax (greedy
 *   sessions) or top-k (top-k sessions, in the same batch) is selected: the selection equals the
 *   CPU's over that session's own logits (fetched afterwards from its row), exactly;
 * - a batch of one equals a separate decode the same way;
 * - greedy generation of 17 jobs through the jobs worker (batched) gives the tokens
 *   kvgen_generate gives one session at a time, and the worker did batch;
 * - the same on a model of head_dim 32 with q8_0 K/V pages, and with q4_0 pages (batches of 11
 *   and 33);
 * - batches of 16 and 33 on a GPU's layouts (KVGEN_VK_LANE=0, KVGEN_VK_ATTN_LANE=0: a step of
 *   more than 8 columns through the GEMM, as prefill, against the cooperative mat-vec of the
 *   separate decodes);
 * - a buffer range (KVGEN_VK_MAX_PART) too small for 64 columns' decode partials: the batch
 *   session holds 12, and a batch of 20 runs as steps of 12 and 8.
 * With KVGEN_VALIDATE=1 the validation layer must stay silent. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kvg_backend.h"
#include "kvg_session.h"
#include "kvg_vk.h"
#include "kvg_vk_backend.h"
#include "testutil.h"

static int n_vocab;
static uint32_t want_cols = VK_BATCH_MAX; /* the columns the batch session should hold */

static kvgen_model *load(const char *path, const char *kv_type) {
    kvgen_model_desc d = {.path = path, .backend = KVGEN_BACKEND_VULKAN, .n_threads = 2, .kv_page_size = 16,
                          .kv_type = kv_type};
    return tu_load(&d);
}

/* the k best of x in the sampler's order (higher first, lower id on ties) */
static void cpu_best(const float *x, int k, int32_t *ids) {
    for (int j = 0; j < k; j++) {
        int32_t best = -1;
        for (int i = 0; i < n_vocab; i++) {
            bool taken = false;
            for (int t = 0; t < j && !taken; t++) taken = ids[t] == i;
            if (!taken && (best < 0 || x[i] > x[best])) best = i;
        }
        ids[j] = best;
    }
}

/* a kept session's device selection against its own logits (fetched from its row) */
static void check_kept(kvgen_model *m, kvgen_session *s, int k, const char *what, int step, int i) {
    int32_t dev[64], cpu[64];
    kvgen_error err = {0};
    kvgen_status st = m->ops->topk(m, s->bs, k, dev, NULL, &err);
    CHECKF(st == KVGEN_OK, "%s: step %d session %d: no device selection of %d (%s)", what, step, i, k, err.message);
    const float *l = kvgen_session_logits(s);
    CHECK(l != NULL);
    if (st != KVGEN_OK || !l) return;
    cpu_best(l, k, cpu);
    CHECKF(memcmp(dev, cpu, (size_t)k * sizeof *dev) == 0, "%s: step %d session %d: device top-%d differs from the CPU's",
           what, step, i, k);
}

/* worst |a - b| in units of 0.002 * (2 + max|b|) (<= 1 passes; NaN fails) */
/* the reference backend's model of the run's file (f32 pages), or NULL: the batched columns'
 * logits are also compared with it, so the batched and the one-by-one paths cannot agree on
 * something wrong */
static kvgen_model *ref_model;
enum { REF_SESSIONS = 2 };

static double excess_tol(const float *a, const float *b, double rel) {
    if (!a || !b) return INFINITY;
    double mx = 0, worst = 0;
    for (int i = 0; i < n_vocab; i++) mx = fmax(mx, fabs((double)b[i]));
    double tol = rel * (2 + mx);
    for (int i = 0; i < n_vocab; i++) {
        double d = fabs((double)a[i] - b[i]) / tol;
        if (!(d <= worst)) worst = d;
    }
    return worst;
}

static double excess(const float *a, const float *b) { return excess_tol(a, b, 0.002); }

/* batched (a) vs one by one (b): N sessions, each twin pair with the same prompt */
static void test_logits(kvgen_model *m, const char *what, int N) {
    enum { MAX = VK_BATCH_MAX + 1, STEPS = 6 };
    static const size_t lens[11] = {1, 5, 17, 33, 40, 64, 70, 3, 100, 16, 31};
    kvgen_session *a[MAX] = {0}, *b[MAX] = {0}, *r[REF_SESSIONS] = {0};
    kvgen_error err = {0};
    int32_t prompt[128];
    if (N > MAX) N = MAX;
    for (int i = 0; i < N; i++) {
        /* odd sessions sample top-k (21 selected), even ones greedily (argmax) */
        kvgen_session_desc sd = {.n_ctx = 256, .no_prefix_reuse = 1};
        if (i % 2) {
            sd.temperature = 0.8f;
            sd.top_k = 20;
        }
        if (i % 11 >= 7) { /* forks: their tables share the parent's full pages */
            CHECK_OK(kvgen_session_fork(a[i - 7], &a[i], &err));
            CHECK_OK(kvgen_session_fork(b[i - 7], &b[i], &err));
            if (!a[i] || !b[i]) continue;
        } else {
            CHECK_OK(kvgen_session_create(m, &sd, &a[i], &err));
            CHECK_OK(kvgen_session_create(m, &sd, &b[i], &err));
        }
        size_t len = lens[i % 11] + (size_t)(i / 11);
        tu_fill_tokens(prompt, len, 100u + (unsigned)i, n_vocab);
        CHECK_OK(kvgen_session_prefill(a[i], prompt, len, NULL, &err));
        CHECK_OK(kvgen_session_prefill(b[i], prompt, len, NULL, &err));
        if (ref_model && i < REF_SESSIONS) {
            CHECK_OK(kvgen_session_create(ref_model, &sd, &r[i], &err));
            if (r[i]) CHECK_OK(kvgen_session_prefill(r[i], prompt, len, NULL, &err));
        }
    }
    double worst = 0;
    for (int step = 0; step < STEPS; step++) {
        int32_t toks[MAX];
        tu_fill_tokens(toks, (size_t)N, 7u + (unsigned)step, n_vocab);
        for (int i = 0; i < N; i++) CHECK_OK(kvgen_session_decode(b[i], toks[i], &err));
        bool keep = step % 2 == 1;
        kvgen_status status[MAX];
        kvgen_error errs[MAX];
        kvgen_status st = kvg_session_decode_batch(a, toks, (size_t)N, !keep, status, errs);
        CHECKF(st == KVGEN_OK, "%s: batch step %d: %s", what, step, errs[0].message);
        for (int i = 0; keep && st == KVGEN_OK && i < N; i++) {
            CHECKF(a[i]->logits_on_device, "%s: step %d session %d: logits not kept", what, step, i);
            check_kept(m, a[i], i % 2 ? 21 : 1, what, step, i);
        }
        for (int i = 0; i < N; i++) {
            CHECK(kvgen_session_length(a[i]) == kvgen_session_length(b[i]));
            double e = excess(kvgen_session_logits(a[i]), kvgen_session_logits(b[i]));
            CHECKF(e <= 1, "%s: step %d session %d: batched logits differ by %.3g x the tolerance", what, step, i, e);
            if (e > worst) worst = e;
        }
        for (int i = 0; i < REF_SESSIONS && i < N; i++) {
            if (!r[i]) continue;
            CHECK_OK(kvgen_session_decode(r[i], toks[i], &err));
            /* f16 pages against the reference's f32 (test_vk_session's tolerance) */
            double e = excess_tol(kvgen_session_logits(a[i]), kvgen_session_logits(r[i]), 0.01);
            CHECKF(e <= 1, "%s: step %d session %d: batched logits differ from the reference by %.3g x the tolerance",
                   what, step, i, e);
        }
    }
    /* a batch ran as one step of all its columns (VK_BATCH_MAX + 1: one of every column the
     * batch session holds, VK_BATCH_MAX on this model, whose scratch holds 128 tokens; the one
     * left decoded on its own session), or, past the columns a smaller limit leaves, in steps
     * of all of them and one of the rest */
    const vk_model *vm = m->backend;
    if (vm->bat) {
        CHECKF(vm->bat->n_cols == want_cols, "%s: the batch session holds %u columns, not %u", what, vm->bat->n_cols,
               want_cols);
        uint32_t n = N < VK_BATCH_MAX ? (uint32_t)N : VK_BATCH_MAX, nc = vm->bat->n_cols;
        uint32_t last = n <= nc ? n : n % nc ? n % nc : nc;
        CHECKF(vm->bat->decode_ncols == last, "%s: a batch of %d ended with a step of %u columns, not %u", what, N,
               vm->bat->decode_ncols, last);
    }
    CHECK(vm->bat != NULL);
    /* a batch of one */
    int32_t t42 = 42;
    kvgen_status st1;
    kvgen_error e1s;
    CHECK_OK(kvgen_session_decode(b[3], 42, &err));
    CHECK(kvg_session_decode_batch(&a[3], &t42, 1, true, &st1, &e1s) == KVGEN_OK);
    double e1 = excess(kvgen_session_logits(a[3]), kvgen_session_logits(b[3]));
    CHECKF(e1 <= 1, "%s: a batch of one differs by %.3g x the tolerance", what, e1);
    printf("%s: batch of %d vs separate decodes: worst %.3g x the tolerance (batch of one: %.3g)\n", what, N, worst,
           e1);
    for (int i = 0; i < REF_SESSIONS; i++) kvgen_session_close(r[i]);
    for (int i = N - 1; i >= 0; i--) {
        kvgen_session_close(a[i]);
        kvgen_session_close(b[i]);
    }
}

/* greedy tokens: jobs (batched by the worker) vs kvgen_generate one session at a time. A job
 * that generates without end (its context shifts) until cancelled at the end runs beside them,
 * so every decode of theirs shares a batch with it, however fast the host submits. */
static void test_greedy(kvgen_model *m, const char *what) {
    enum { N = 17, GEN = 10 };
    static const size_t lens[5] = {2, 9, 30, 50, 17};
    kvgen_session *a[N] = {0}, *b[N] = {0}, *gate = NULL;
    kvgen_job *jobs[N] = {0}, *gate_job = NULL;
    kvgen_error err = {0};
    int32_t prompt[64];
    kvgen_session_desc gd0 = {.n_ctx = 64, .on_full = KVGEN_ON_FULL_SHIFT, .keep = 4, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(m, &gd0, &gate, &err));
    tu_fill_tokens(prompt, 3, 299u, n_vocab);
    kvgen_job_desc endless = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = prompt, .n_tokens = 3,
                              .gen = {.max_tokens = INT_MAX, .ignore_eog = 1}};
    if (gate) CHECK_OK(kvgen_job_submit(gate, &endless, &gate_job, &err));
    for (int i = 0; i < N; i++) {
        kvgen_session_desc sd = {.n_ctx = 128, .no_prefix_reuse = 1};
        CHECK_OK(kvgen_session_create(m, &sd, &a[i], &err));
        CHECK_OK(kvgen_session_create(m, &sd, &b[i], &err));
        size_t len = lens[i % 5] + (size_t)(i / 5);
        tu_fill_tokens(prompt, len, 300u + (unsigned)i, n_vocab);
        kvgen_job_desc d = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = prompt, .n_tokens = len,
                            .gen = {.max_tokens = GEN, .ignore_eog = 1}};
        CHECK_OK(kvgen_job_submit(a[i], &d, &jobs[i], &err));
        CHECK_OK(kvgen_session_prefill(b[i], prompt, len, NULL, &err));
    }
    for (int i = 0; i < N; i++) CHECK(jobs[i] && tu_job_wait(jobs[i]));
    if (gate_job) {
        kvgen_job_info gi;
        kvgen_job_get_info(gate_job, &gi);
        CHECKF(gi.state == KVGEN_JOB_GENERATING, "%s: the endless job is %s", what, kvgen_job_state_name(gi.state));
        kvgen_job_cancel(gate_job);
        CHECK(tu_job_wait(gate_job));
        kvgen_job_release(gate_job);
    }
    kvgen_session_close(gate);
    for (int i = 0; i < N; i++) {
        char text[4096];
        size_t len = 0;
        kvgen_finish fin;
        kvgen_generate_desc gd = {.max_tokens = GEN, .ignore_eog = 1};
        CHECK_OK(kvgen_generate(b[i], &gd, text, sizeof text, &len, &fin, &err));
        size_t n = kvgen_session_length(a[i]);
        CHECKF(n == lens[i % 5] + (size_t)(i / 5) + GEN && n == kvgen_session_length(b[i]) &&
                   memcmp(kvgen_session_tokens(a[i]), kvgen_session_tokens(b[i]), n * sizeof(int32_t)) == 0,
               "%s session %d: batched greedy tokens differ from sequential", what, i);
        kvgen_job_release(jobs[i]);
        kvgen_session_close(a[i]);
        kvgen_session_close(b[i]);
    }
    kvgen_jobs_stats st;
    kvgen_jobs_get_stats(m, &st);
    CHECKF(st.max_batch_seen > 1 && st.batches > 0, "%s: decodes were never batched (max batch %d)", what,
           st.max_batch_seen);
    printf("%s: %d jobs through the worker: largest batch %d\n", what, N, st.max_batch_seen);
}

int main(void) {
    int n_dev = 0;
    kvgen_error derr = {0};
    if (kvgen_devices(NULL, 0, &n_dev, &derr) != KVGEN_OK || n_dev == 0) tu_skip("no Vulkan device");
    char *path = tu_make_model("vk_batch.gguf", "--type Q8_0 --seed 23 --embd 96 --heads 6 --kv-heads 2 --ff 160 "
                                                "--layers 3");
    /* head_dim 32, K/V pages of q8_0 and q4_0: a batch's K/V quantized by kv_store.comp per column */
    char *path32 = tu_make_model("vk_batch32.gguf", "--type Q8_0 --seed 29 --embd 96 --heads 3 --kv-heads 1 --ff 160 "
                                                    "--layers 3");
    CHECK(path != NULL && path32 != NULL);
    if (!path || !path32) return tu_finish("test_vk_batch");
    static const char *const KV[5] = {NULL, "q8_0", "q4_0", NULL, "q4_0"};
    static const char *const WHAT[5] = {"vulkan", "vulkan q8_0 pages", "vulkan q4_0 pages", "vulkan GPU layouts",
                                        "vulkan, 12 columns a step"};
    /* batch sizes per run (0 ends): around the mat-vec's 8 columns, and one past a step's most */
    static const int SIZES[5][6] = {{9, 11, 16, 33, VK_BATCH_MAX + 1}, {11, 33}, {11, 33}, {16, 33}, {20, 12}};
    /* the last run: a buffer range (KVGEN_VK_MAX_PART) that holds the decode partials of 12.5
     * columns, measured on the run before it (the same model and pages), cuts the batch session
     * to 12 columns: a batch of 20 takes a step of 12 and one of 8 */
    char part[32] = "";
    for (int run = 0; run < 5; run++) {
        const char *what = WHAT[run];
        if (run == 3) {
            setenv("KVGEN_VK_LANE", "0", 1);
            setenv("KVGEN_VK_ATTN_LANE", "0", 1);
            /* a GPU of 8 compute units: one decode takes 8 splits of >= 64 positions, a batch of
             * 16 or 33 columns (32 or 66 workgroups without splits) none */
            setenv("KVGEN_VK_COMPUTE_UNITS", "8", 1);
        }
        if (run == 4) {
            CHECK(part[0] != 0);
            setenv("KVGEN_VK_MAX_PART", part, 1);
            want_cols = 12;
        }
        kvgen_model *m = load(run == 1 || run == 2 || run == 4 ? path32 : path, KV[run]);
        unsetenv("KVGEN_VK_LANE");
        unsetenv("KVGEN_VK_ATTN_LANE");
        unsetenv("KVGEN_VK_COMPUTE_UNITS");
        unsetenv("KVGEN_VK_MAX_PART");
        if (!m) return tu_finish("test_vk_batch");
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        n_vocab = info.n_vocab;
        CHECK(m->ops->topk != NULL);
        if (!KV[run]) {
            kvgen_model_desc rd = {.path = path, .backend = KVGEN_BACKEND_REFERENCE};
            ref_model = tu_load(&rd);
        }
        for (int i = 0; SIZES[run][i]; i++) test_logits(m, what, SIZES[run][i]);
        kvgen_model_unload(ref_model);
        ref_model = NULL;
        if (run < 3) test_greedy(m, what);
        const vk_model *vm = m->backend;
        if (run == 2 && vm->bat) {
            size_t col = (size_t)vm->bat->nsplit_dec * (size_t)vm->hp.n_head * (size_t)(vm->hp.head_dim + 2) * 4;
            snprintf(part, sizeof part, "%zu", col * 25 / 2);
        }
        CHECKF(kvg_vk_validation_count(kvg_vk_model_ctx(m)) == 0, "%s: validation messages", what);
        kvgen_model_unload(m);
    }
    free(path);
    free(path32);
    return tu_finish("test_vk_batch");
}
