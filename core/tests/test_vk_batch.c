/* test_vk_batch.c: the Vulkan backend's batched decode (forward_batch): one token each of
 * several sessions in one step, each with its own page table and position, the mat-vecs reading
 * each weight once for all of them. On a random model, paged (pages of 16 so tables differ in
 * length, forks so they share pages) and contiguous (which decodes one by one):
 * - 11 sessions (a group of 8 and one of 3, prompts 1..100 tokens) decode 4 tokens batched, and
 *   their twins decode the same tokens one at a time: logits within 0.002 * (2 + max|logit|)
 *   (the f16 cache is written by the same kernels, only the column count of the mat-vec differs);
 * - a batch of one equals a separate decode the same way;
 * - greedy generation through the jobs worker (batched) gives the tokens kvgen_generate gives
 *   one session at a time, and the worker did batch.
 * With KVGEN_VALIDATE=1 the validation layer must stay silent. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kvg_model.h"
#include "kvg_session.h"
#include "kvg_vk.h"
#include "testutil.h"

static int n_vocab;

static kvgen_model *load(const char *path, int contiguous) {
    kvgen_model_desc d = {.path = path, .backend = KVGEN_BACKEND_VULKAN, .n_threads = 2, .kv_page_size = 16,
                          .kv_contiguous = contiguous};
    return tu_load(&d);
}

/* worst |a - b| in units of 0.002 * (2 + max|b|) (<= 1 passes; NaN fails) */
static double excess(const float *a, const float *b) {
    if (!a || !b) return INFINITY;
    double mx = 0, worst = 0;
    for (int i = 0; i < n_vocab; i++) mx = fmax(mx, fabs((double)b[i]));
    double tol = 0.002 * (2 + mx);
    for (int i = 0; i < n_vocab; i++) {
        double d = fabs((double)a[i] - b[i]) / tol;
        if (!(d <= worst)) worst = d;
    }
    return worst;
}

/* batched (a) vs one by one (b): n sessions, each twin pair with the same prompt */
static void test_logits(kvgen_model *m, const char *what) {
    enum { N = 11, STEPS = 4 };
    static const size_t lens[N] = {1, 5, 17, 33, 40, 64, 70, 3, 100, 16, 31};
    kvgen_session *a[N] = {0}, *b[N] = {0};
    kvgen_error err = {0};
    int32_t prompt[128];
    float *scratch = malloc((size_t)N * (size_t)n_vocab * sizeof *scratch);
    CHECK(scratch != NULL);
    if (!scratch) return;
    for (int i = 0; i < N; i++) {
        kvgen_session_desc sd = {.n_ctx = 256, .no_prefix_reuse = 1};
        if (i >= 7) { /* forks: their tables share the parent's full pages */
            CHECK_OK(kvgen_session_fork(a[i - 7], &a[i], &err));
            CHECK_OK(kvgen_session_fork(b[i - 7], &b[i], &err));
            if (!a[i] || !b[i]) continue;
        } else {
            CHECK_OK(kvgen_session_create(m, &sd, &a[i], &err));
            CHECK_OK(kvgen_session_create(m, &sd, &b[i], &err));
        }
        tu_fill_tokens(prompt, lens[i], 100u + (unsigned)i, n_vocab);
        CHECK_OK(kvgen_session_prefill(a[i], prompt, lens[i], NULL, &err));
        CHECK_OK(kvgen_session_prefill(b[i], prompt, lens[i], NULL, &err));
        a[i]->defer_decode = true;
    }
    double worst = 0;
    for (int step = 0; step < STEPS; step++) {
        int32_t toks[N];
        tu_fill_tokens(toks, N, 7u + (unsigned)step, n_vocab);
        for (int i = 0; i < N; i++) {
            CHECK_OK(kvgen_session_decode(a[i], toks[i], &err));
            CHECK_OK(kvgen_session_decode(b[i], toks[i], &err));
        }
        kvgen_status st = kvg_session_decode_batch(a, N, scratch, &err);
        CHECKF(st == KVGEN_OK, "%s: batch step %d: %s", what, step, err.message);
        for (int i = 0; i < N; i++) {
            CHECK(kvgen_session_length(a[i]) == kvgen_session_length(b[i]));
            double e = excess(kvgen_session_logits(a[i]), kvgen_session_logits(b[i]));
            CHECKF(e <= 1, "%s: step %d session %d: batched logits differ by %.3g x the tolerance", what, step, i, e);
            if (e > worst) worst = e;
        }
    }
    /* a batch of one */
    CHECK_OK(kvgen_session_decode(a[3], 42, &err));
    CHECK_OK(kvgen_session_decode(b[3], 42, &err));
    CHECK_OK(kvg_session_decode_batch(&a[3], 1, scratch, &err));
    double e1 = excess(kvgen_session_logits(a[3]), kvgen_session_logits(b[3]));
    CHECKF(e1 <= 1, "%s: a batch of one differs by %.3g x the tolerance", what, e1);
    printf("%s: batched vs separate decodes: worst %.3g x the tolerance (batch of one: %.3g)\n", what, worst, e1);
    for (int i = N - 1; i >= 0; i--) {
        kvgen_session_close(a[i]);
        kvgen_session_close(b[i]);
    }
    free(scratch);
}

static void pause_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static bool wait_final(kvgen_job *j) {
    for (long i = 0; i < 1200000; i++) {
        kvgen_job_state st = kvgen_job_poll(j, NULL, NULL);
        if (st == KVGEN_JOB_DONE || st == KVGEN_JOB_CANCELLED || st == KVGEN_JOB_FAILED) return true;
        pause_us(100);
    }
    return false;
}

/* greedy tokens: jobs (batched by the worker) vs kvgen_generate one session at a time */
static void test_greedy(kvgen_model *m, const char *what) {
    enum { N = 5, GEN = 10 };
    static const size_t lens[N] = {2, 9, 30, 50, 17};
    kvgen_session *a[N] = {0}, *b[N] = {0};
    kvgen_job *jobs[N] = {0};
    kvgen_error err = {0};
    int32_t prompt[64];
    for (int i = 0; i < N; i++) {
        kvgen_session_desc sd = {.n_ctx = 128, .no_prefix_reuse = 1};
        CHECK_OK(kvgen_session_create(m, &sd, &a[i], &err));
        CHECK_OK(kvgen_session_create(m, &sd, &b[i], &err));
        tu_fill_tokens(prompt, lens[i], 300u + (unsigned)i, n_vocab);
        kvgen_job_desc d = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = prompt, .n_tokens = lens[i],
                            .gen = {.max_tokens = GEN, .ignore_eog = 1}};
        CHECK_OK(kvgen_job_submit(a[i], &d, &jobs[i], &err));
        CHECK_OK(kvgen_session_prefill(b[i], prompt, lens[i], NULL, &err));
    }
    for (int i = 0; i < N; i++) CHECK(jobs[i] && wait_final(jobs[i]));
    for (int i = 0; i < N; i++) {
        char text[4096];
        size_t len = 0;
        kvgen_finish fin;
        kvgen_generate_desc gd = {.max_tokens = GEN, .ignore_eog = 1};
        CHECK_OK(kvgen_generate(b[i], &gd, text, sizeof text, &len, &fin, &err));
        size_t n = kvgen_session_length(a[i]);
        CHECKF(n == lens[i] + GEN && n == kvgen_session_length(b[i]) &&
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
}

int main(void) {
    int n_dev = 0;
    kvgen_error derr = {0};
    if (kvgen_devices(NULL, 0, &n_dev, &derr) != KVGEN_OK || n_dev == 0) tu_skip("no Vulkan device");
    char *path = tu_make_model("vk_batch.gguf", "--type Q8_0 --seed 23 --embd 96 --heads 6 --kv-heads 2 --ff 160 "
                                                "--layers 3");
    CHECK(path != NULL);
    if (!path) return tu_finish("test_vk_batch");
    for (int contiguous = 0; contiguous < 2; contiguous++) {
        const char *what = contiguous ? "contiguous" : "paged";
        kvgen_model *m = load(path, contiguous);
        if (!m) continue;
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        n_vocab = info.n_vocab;
        CHECK(m->ops->forward_batch != NULL);
        test_logits(m, what);
        test_greedy(m, what);
        CHECKF(kvg_vk_validation_count(kvg_vk_model_ctx(m)) == 0, "%s: validation messages", what);
        kvgen_model_unload(m);
    }
    free(path);
    return tu_finish("test_vk_batch");
}
