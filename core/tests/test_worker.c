/* test_worker.c: the jobs API (kvgen_job_*, kvgen_poll) on a random model and the reference
 * backend: batched decodes and chunked prefill give exactly the sequential results, poll
 * structure (a job queued behind a long prefill reports nothing), cancel/rollback, priority
 * order, a seeded random submit/cancel/release/close storm while the worker runs, and
 * shutdown with work in flight. No wall-clock asserts: only orders and equalities. */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "testutil.h"

static kvgen_model *g_model;
static int g_vocab;

/* waits (bounded) until `cond(arg)` holds; false after a generous bound (a hang) */
static bool wait_for(bool (*cond)(void *), void *arg) {
    for (long i = 0; i < 6000000; i++) {
        if (cond(arg)) return true;
        tu_pause_us(100);
    }
    return false;
}

static bool job_generating(void *j) {
    kvgen_job_info ji;
    kvgen_job_get_info(j, &ji);
    return ji.state == KVGEN_JOB_GENERATING;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int32_t *random_tokens(uint64_t *rng, size_t n) {
    int32_t *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++) t[i] = (int32_t)(rng_next(rng) % (uint64_t)g_vocab);
    return t;
}

static kvgen_model *load(const char *path) {
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 1,
                           .kv_pool_tokens = 64 * 1024};
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    return m;
}

/* b, a fresh session like a, prefilled with the prompt and generating gen tokens alone, ends
 * as a did through the worker: the same tokens, bit-identical logits, and (with a job) the
 * job's text. */
static void same_as_alone(kvgen_session *a, kvgen_session *b, const int32_t *prompt, size_t n_prompt, int gen,
                          kvgen_job *job, const char *what, int i) {
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_prefill(b, prompt, n_prompt, NULL, &err));
    char text[4096];
    size_t len = 0;
    kvgen_finish fin;
    kvgen_generate_desc gd = {.max_tokens = gen, .ignore_eog = 1};
    CHECK_OK(kvgen_generate(b, &gd, text, sizeof text, &len, &fin, &err));
    size_t n = kvgen_session_length(a);
    CHECKF(n == n_prompt + (size_t)gen && n == kvgen_session_length(b) &&
               memcmp(kvgen_session_tokens(a), kvgen_session_tokens(b), n * sizeof(int32_t)) == 0,
           "%s session %d: tokens differ from a session alone", what, i);
    const float *la = kvgen_session_logits(a), *lb = kvgen_session_logits(b);
    CHECKF(la && lb && memcmp(la, lb, (size_t)g_vocab * sizeof(float)) == 0,
           "%s session %d: logits are not bit-identical to a session alone", what, i);
    if (job) {
        size_t tl;
        const char *jt = kvgen_job_text(job, &tl);
        CHECKF(tl == len && memcmp(jt, text, len) == 0, "%s session %d: job text differs", what, i);
    }
}

/* Several sessions through the worker (batched decodes, chunked prompts) against the same
 * prompts prefilled in one call and generated sequentially: identical tokens and logits. */
static void test_batched_equals_sequential(kvgen_model *m, const char *what) {
    enum { N = 6 };
    uint64_t rng = 0x1234;
    size_t lens[N] = {1, 5, 40, 77, 3, 130};
    int32_t *prompts[N];
    kvgen_session *a[N], *b[N];
    kvgen_job *jobs[N];
    kvgen_error err = {0};
    kvgen_jobs_desc jd = {.prefill_chunk = 16};
    CHECK_OK(kvgen_jobs_configure(m, &jd, &err));
    kvgen_jobs_stats before;
    kvgen_jobs_get_stats(m, &before);
    /* a job that generates without end (its context shifts) until cancelled below: every decode
     * of the others shares a batch with it, however the host and the worker interleave */
    kvgen_session *gate = NULL;
    kvgen_job *gate_job = NULL;
    kvgen_session_desc gsd = {.n_ctx = 64, .on_full = KVGEN_ON_FULL_SHIFT, .keep = 4, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(m, &gsd, &gate, &err));
    int32_t one = 1;
    kvgen_job_desc endless = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = &one, .n_tokens = 1,
                              .gen = {.max_tokens = INT_MAX, .ignore_eog = 1}};
    if (gate) CHECK_OK(kvgen_job_submit(gate, &endless, &gate_job, &err));
    for (int i = 0; i < N; i++) {
        prompts[i] = random_tokens(&rng, lens[i]);
        kvgen_session_desc sd = {.n_ctx = 256, .no_prefix_reuse = 1};
        CHECK_OK(kvgen_session_create(m, &sd, &a[i], &err));
        CHECK_OK(kvgen_session_create(m, &sd, &b[i], &err));
        kvgen_job_desc d = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = prompts[i], .n_tokens = lens[i],
                            .gen = {.max_tokens = 12 + i, .ignore_eog = 1}};
        CHECK_OK(kvgen_job_submit(a[i], &d, &jobs[i], &err));
    }
    for (int i = 0; i < N; i++) CHECK(tu_job_wait(jobs[i]));
    if (gate_job) {
        kvgen_job_cancel(gate_job);
        CHECK(tu_job_wait(gate_job));
        kvgen_job_release(gate_job);
    }
    kvgen_session_close(gate);
    for (int i = 0; i < N; i++) {
        kvgen_job_info ji;
        kvgen_job_get_info(jobs[i], &ji);
        CHECKF(ji.state == KVGEN_JOB_DONE && ji.finish == KVGEN_FINISH_LENGTH, "%s job %d: %s %s (%s)", what, i,
               kvgen_job_state_name(ji.state), kvgen_finish_name(ji.finish), ji.error.message);
        CHECK(ji.n_tokens == 12 + i && ji.prompt_tokens == lens[i] && ji.prompt_done == lens[i]);
        CHECK(ji.queue_ms >= 0 && ji.first_token_ms >= ji.queue_ms && ji.total_ms >= ji.first_token_ms);

        same_as_alone(a[i], b[i], prompts[i], lens[i], 12 + i, jobs[i], what, i);
        kvgen_job_release(jobs[i]);
        kvgen_session_close(a[i]);
        kvgen_session_close(b[i]);
        free(prompts[i]);
    }
    kvgen_jobs_stats st;
    kvgen_jobs_get_stats(m, &st);
    CHECKF(st.max_batch_seen > 1, "%s: decodes were never batched (max batch %d)", what, st.max_batch_seen);
    CHECK(st.prefill_chunks - before.prefill_chunks >= 130 / 16);
    /* the prompts of 1, 5 and 3 tokens, the last pieces of the others and the endless job's
     * one-token prompt fit a step's budget */
    CHECKF(st.prompts_batched - before.prompts_batched == N + 1, "%s: %llu prompts ran with the decodes", what,
           (unsigned long long)(st.prompts_batched - before.prompts_batched));
    CHECK(st.worker_running && st.jobs_active == 0);
}

/* Many sessions' one-token prompts (a crowd asked at once): each runs in a batch with the
 * others' decodes, never a forward pass of its own, and every session ends as if it had been
 * prefilled and generated alone. */
static void test_short_prompts_batched(kvgen_model *m, const char *what) {
    enum { N = 12, GEN = 6 };
    kvgen_session *a[N], *b[N];
    kvgen_job *jobs[N];
    kvgen_error err = {0};
    kvgen_jobs_desc jd = {0};
    CHECK_OK(kvgen_jobs_configure(m, &jd, &err));
    kvgen_jobs_stats before, st;
    kvgen_jobs_get_stats(m, &before);
    for (int i = 0; i < N; i++) {
        kvgen_session_desc sd = {.n_ctx = 64, .no_prefix_reuse = 1, .seed = (uint64_t)i + 1, .temperature = 0.8f};
        CHECK_OK(kvgen_session_create(m, &sd, &a[i], &err));
        CHECK_OK(kvgen_session_create(m, &sd, &b[i], &err));
        int32_t tok = (int32_t)(3 + i);
        kvgen_job_desc d = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = &tok, .n_tokens = 1,
                            .gen = {.max_tokens = GEN, .ignore_eog = 1}};
        CHECK_OK(kvgen_job_submit(a[i], &d, &jobs[i], &err));
    }
    for (int i = 0; i < N; i++) CHECK(tu_job_wait(jobs[i]));
    kvgen_jobs_get_stats(m, &st);
    CHECKF(st.prompts_batched - before.prompts_batched == N && st.prefill_chunks - before.prefill_chunks == N,
           "%s: %llu of %d prompts ran with the decodes (%llu pieces)", what,
           (unsigned long long)(st.prompts_batched - before.prompts_batched), N,
           (unsigned long long)(st.prefill_chunks - before.prefill_chunks));
    for (int i = 0; i < N; i++) {
        int32_t tok = (int32_t)(3 + i);
        same_as_alone(a[i], b[i], &tok, 1, GEN, jobs[i], what, i);
        kvgen_job_release(jobs[i]);
        kvgen_session_close(a[i]);
        kvgen_session_close(b[i]);
    }
}

/* A long prompt prefilled in chunks of 8 equals one prefill call: K/V and logits bit for bit. */
static void test_chunked_prefill(void) {
    kvgen_error err = {0};
    uint64_t rng = 99;
    size_t n = 300;
    int32_t *p = random_tokens(&rng, n);
    kvgen_jobs_desc jd = {.prefill_chunk = 8};
    CHECK_OK(kvgen_jobs_configure(g_model, &jd, &err));
    kvgen_session *a, *b;
    kvgen_session_desc sd = {.n_ctx = 512, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(g_model, &sd, &a, &err));
    CHECK_OK(kvgen_session_create(g_model, &sd, &b, &err));
    kvgen_job *j;
    kvgen_job_desc d = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = p, .n_tokens = n, .gen = {.max_tokens = 1}};
    CHECK_OK(kvgen_job_submit(a, &d, &j, &err));
    CHECK(tu_job_wait(j));
    CHECK_OK(kvgen_session_prefill(b, p, n, NULL, &err));
    int32_t tok = kvgen_session_sample(b);
    CHECK_OK(kvgen_session_decode(b, tok, &err));
    CHECK(kvgen_session_length(a) == n + 1 && kvgen_session_length(b) == n + 1);
    CHECK(kvgen_session_tokens(a)[n] == tok);
    kvgen_model_info info;
    kvgen_model_get_info(g_model, &info);
    size_t floats = (size_t)info.n_head_kv * (n + 1) * (size_t)info.head_dim;
    float *ka = malloc(floats * sizeof *ka), *kb = malloc(floats * sizeof *kb);
    for (int layer = 0; layer < info.n_layer; layer++)
        for (int which = 0; which < 2; which++) {
            CHECK_OK(kvgen_session_read_cache(a, layer, which, ka, floats, &err));
            CHECK_OK(kvgen_session_read_cache(b, layer, which, kb, floats, &err));
            CHECKF(memcmp(ka, kb, floats * sizeof *ka) == 0, "layer %d %s: chunked prefill differs", layer,
                   which ? "V" : "K");
        }
    CHECK(memcmp(kvgen_session_logits(a), kvgen_session_logits(b), (size_t)g_vocab * sizeof(float)) == 0);
    free(ka);
    free(kb);
    kvgen_job_release(j);
    kvgen_session_close(a);
    kvgen_session_close(b);
    free(p);
}

/* A job queued behind a long prefill on its session reports nothing and stays queued, while a
 * job on another session streams through that prefill. Nothing depends on how fast the worker
 * runs beside the host: the job in front generates without end after its prompt (until
 * cancelled), so the one behind it stays queued; the streaming job, endless too, is generating
 * before the long prompt is submitted, so every worker step that prefilled a chunk of that prompt
 * also decoded one of its tokens. */
static void test_poll_structure(void) {
    kvgen_error err = {0};
    uint64_t rng = 7;
    enum { CHUNK = 8 };
    size_t n = 2000;
    int32_t *p = random_tokens(&rng, n);
    kvgen_jobs_desc jd = {.prefill_chunk = CHUNK};
    CHECK_OK(kvgen_jobs_configure(g_model, &jd, &err));
    kvgen_session *a, *c;
    kvgen_session_desc sa = {.n_ctx = 2100, .on_full = KVGEN_ON_FULL_SHIFT, .no_prefix_reuse = 1};
    kvgen_session_desc sc = {.n_ctx = 64, .on_full = KVGEN_ON_FULL_SHIFT, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(g_model, &sa, &a, &err));
    CHECK_OK(kvgen_session_create(g_model, &sc, &c, &err));
    int owner_b, owner_c;
    kvgen_job *ja, *jb, *jc;
    kvgen_job_desc dc = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = p, .n_tokens = 3,
                         .gen = {.max_tokens = INT_MAX, .ignore_eog = 1}, .owner = &owner_c};
    kvgen_job_desc da = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = p, .n_tokens = n,
                         .gen = {.max_tokens = INT_MAX, .ignore_eog = 1}};
    kvgen_job_desc db = {.prompt = KVGEN_PROMPT_TEXT, .text = "more", .gen = {.max_tokens = 3, .ignore_eog = 1},
                         .owner = &owner_b};
    CHECK_OK(kvgen_job_submit(c, &dc, &jc, &err));
    CHECK(wait_for(job_generating, jc));
    kvgen_job_info ic0, ic1, ia;
    kvgen_job_get_info(jc, &ic0);
    CHECK_OK(kvgen_job_submit(a, &da, &ja, &err));
    CHECK_OK(kvgen_job_submit(a, &db, &jb, &err));
    kvgen_event ev[4];
    const char *t = NULL;
    size_t tl = 1;
    CHECK(kvgen_job_poll(jb, &t, &tl) == KVGEN_JOB_QUEUED && tl == 0 && t && t[0] == 0);
    CHECK(kvgen_poll(g_model, &owner_b, ev, 4) == 0);
    /* a's prompt is in: n / CHUNK steps prefilled it, and c decoded a token in each of them */
    CHECK(wait_for(job_generating, ja));
    kvgen_job_get_info(jc, &ic1);
    kvgen_job_get_info(ja, &ia);
    CHECK(ia.prompt_done == n);
    CHECKF(ic1.state == KVGEN_JOB_GENERATING && ic1.n_tokens - ic0.n_tokens >= (int)(n / CHUNK) - 1,
           "c decoded %d tokens while %zu prompt tokens were prefilled in chunks of %d", ic1.n_tokens - ic0.n_tokens,
           n, CHUNK);
    CHECK(kvgen_job_poll(jb, NULL, NULL) == KVGEN_JOB_QUEUED);
    CHECK(kvgen_poll(g_model, &owner_b, ev, 4) == 0);
    kvgen_job_cancel(jc);
    kvgen_job_cancel(ja); /* b runs next */
    /* b's events: text then exactly one finished event */
    int finished = 0;
    size_t got = 0;
    for (long i = 0; i < 600000 && !finished; i++) {
        int k = kvgen_poll(g_model, &owner_b, ev, 4);
        for (int e = 0; e < k; e++) {
            CHECK(ev[e].job == jb);
            got += ev[e].len;
            finished += ev[e].finished;
        }
        if (!finished) tu_pause_us(100);
    }
    CHECK(finished == 1 && kvgen_poll(g_model, &owner_b, ev, 4) == 0);
    size_t all;
    kvgen_job_text(jb, &all);
    CHECK(got == all);
    kvgen_job_info ib;
    kvgen_job_get_info(jb, &ib);
    CHECK(ib.state == KVGEN_JOB_DONE && ib.n_tokens == 3);
    CHECK(kvgen_job_poll(ja, NULL, NULL) == KVGEN_JOB_CANCELLED);
    CHECK(tu_job_wait(jc) && kvgen_job_poll(jc, NULL, NULL) == KVGEN_JOB_CANCELLED);
    kvgen_job_release(ja);
    kvgen_job_release(jb);
    kvgen_job_release(jc);
    kvgen_session_close(a);
    kvgen_session_close(c);
    free(p);
}

static void chatml_smith(kvgen_session *s) {
    kvgen_error err = {0};
    kvgen_chat_template chatml = {.name = "chatml"};
    CHECK_OK(kvgen_chat_set_template(s, &chatml, &err));
    CHECK_OK(kvgen_chat_add(s, "system", "You are a smith.", &err));
}

/* `s` takes a chat turn as a job, `ref` the same turn blocking: the same tokens and text */
static void same_turn(kvgen_session *s, kvgen_session *ref, const char *what) {
    kvgen_error err = {0};
    kvgen_job *j;
    kvgen_job_desc d = {.prompt = KVGEN_PROMPT_CHAT, .role = "user", .text = "Hello there",
                        .gen = {.max_tokens = 6, .ignore_eog = 1}};
    CHECK_OK(kvgen_job_submit(s, &d, &j, &err));
    CHECK(tu_job_wait(j));
    CHECK_OK(kvgen_chat_begin(ref, "user", "Hello there", &err));
    kvgen_generate_desc gd = {.max_tokens = 6, .ignore_eog = 1};
    char text[512];
    CHECK_OK(kvgen_generate(ref, &gd, text, sizeof text, NULL, NULL, &err));
    size_t n = kvgen_session_length(s);
    CHECKF(n == kvgen_session_length(ref) &&
               memcmp(kvgen_session_tokens(s), kvgen_session_tokens(ref), n * sizeof(int32_t)) == 0,
           "%s: the turn after the cancelled job differs from one on a session without it", what);
    CHECKF(strcmp(kvgen_job_text(j, NULL), text) == 0, "%s: job text '%s', blocking '%s'", what,
           kvgen_job_text(j, NULL), text);
    kvgen_job_release(j);
}

/* A cancelled job that made no token gives the session back as it was (tokens and chat state).
 * Cancelled while queued (behind a job of its session that never ends by itself): always so.
 * Cancelled right after submit, on a free session, it is usually still queued or prefilling its
 * long prompt; the rare run where it already made a token (a slow host) checks that the token
 * stays, since the outcome depends on the timing. */
static void test_cancel_rollback(void) {
    kvgen_error err = {0};
    char long_text[3000];
    for (size_t i = 0; i < sizeof long_text - 1; i++) long_text[i] = "abc defg hij "[i % 13];
    long_text[sizeof long_text - 1] = 0;
    kvgen_jobs_desc jd = {.prefill_chunk = 4};
    CHECK_OK(kvgen_jobs_configure(g_model, &jd, &err));

    /* queued */
    kvgen_session *a, *ref;
    kvgen_session_desc sd = {.n_ctx = 1024, .on_full = KVGEN_ON_FULL_SHIFT, .keep = 16, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(g_model, &sd, &a, &err));
    chatml_smith(a);
    kvgen_job *j0, *j1;
    kvgen_job_desc d0 = {.gen = {.max_tokens = INT_MAX, .ignore_eog = 1}};
    kvgen_job_desc d1 = {.prompt = KVGEN_PROMPT_CHAT, .role = "user", .text = long_text};
    CHECK_OK(kvgen_job_submit(a, &d0, &j0, &err));
    CHECK_OK(kvgen_job_submit(a, &d1, &j1, &err));
    kvgen_job_cancel(j1);
    kvgen_job_info i1;
    kvgen_job_get_info(j1, &i1);
    CHECK(i1.state == KVGEN_JOB_CANCELLED && i1.finish == KVGEN_FINISH_CANCELLED && i1.n_tokens == 0);
    kvgen_job_cancel(j0);
    CHECK(tu_job_wait(j0) && tu_job_wait(j1));
    CHECK(kvgen_job_poll(j0, NULL, NULL) == KVGEN_JOB_CANCELLED);
    CHECK_OK(kvgen_session_fork(a, &ref, &err)); /* a as j0 left it */
    same_turn(a, ref, "cancelled while queued");
    kvgen_job_release(j0);
    kvgen_job_release(j1);
    kvgen_session_close(a);
    kvgen_session_close(ref);

    /* right after submit */
    kvgen_session_desc sd2 = {.n_ctx = 1024, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(g_model, &sd2, &a, &err));
    CHECK_OK(kvgen_session_create(g_model, &sd2, &ref, &err));
    chatml_smith(a);
    chatml_smith(ref);
    size_t len0 = kvgen_session_length(a);
    CHECK_OK(kvgen_job_submit(a, &d1, &j1, &err));
    kvgen_job_cancel(j1);
    CHECK(tu_job_wait(j1));
    kvgen_job_get_info(j1, &i1);
    CHECK(i1.state == KVGEN_JOB_CANCELLED && i1.finish == KVGEN_FINISH_CANCELLED);
    if (i1.n_tokens == 0) {
        CHECK(kvgen_session_length(a) == len0);
        same_turn(a, ref, "cancelled before its first token");
    } else {
        CHECK(kvgen_session_length(a) > len0); /* what it generated stays */
        printf("note: the job made %d tokens before its cancel was seen; rollback not checked this run\n",
               i1.n_tokens);
    }
    /* cancelling a final job changes nothing */
    kvgen_job_cancel(j1);
    CHECK(kvgen_job_poll(j1, NULL, NULL) == KVGEN_JOB_CANCELLED);
    kvgen_job_release(j1);
    kvgen_session_close(a);
    kvgen_session_close(ref);
}

/* The higher-priority prompt is prefilled first when both wait behind a long prefill. The host
 * reads how far the lower one got once the higher one is submitted; from then on it gets at most
 * the chunk of a step already under way, so when more than that was left, its first token comes
 * after the higher one's (first_token_ms counts from each submit, and it was submitted first).
 * On a host so slow that the lower one was (nearly) prefilled before the higher one was
 * submitted, there is nothing to compare, and the run says so. */
static void test_priority(void) {
    kvgen_error err = {0};
    uint64_t rng = 5;
    enum { CHUNK = 8 };
    int32_t *big = random_tokens(&rng, 1500), *p = random_tokens(&rng, 300);
    kvgen_jobs_desc jd = {.prefill_chunk = CHUNK};
    CHECK_OK(kvgen_jobs_configure(g_model, &jd, &err));
    kvgen_session *x, *lo, *hi;
    kvgen_session_desc sd = {.n_ctx = 1600, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(g_model, &sd, &x, &err));
    CHECK_OK(kvgen_session_create(g_model, &sd, &lo, &err));
    CHECK_OK(kvgen_session_create(g_model, &sd, &hi, &err));
    kvgen_job *jx, *jl, *jh;
    kvgen_job_desc d = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = big, .n_tokens = 1500, .gen = {.max_tokens = 1}};
    CHECK_OK(kvgen_job_submit(x, &d, &jx, &err));
    d.tokens = p;
    d.n_tokens = 300;
    CHECK_OK(kvgen_job_submit(lo, &d, &jl, &err));
    d.priority = 5;
    CHECK_OK(kvgen_job_submit(hi, &d, &jh, &err));
    kvgen_job_info il0, il, ih;
    kvgen_job_get_info(jl, &il0);
    CHECK(tu_job_wait(jx) && tu_job_wait(jl) && tu_job_wait(jh));
    kvgen_job_get_info(jl, &il);
    kvgen_job_get_info(jh, &ih);
    CHECK(ih.priority == 5 && il.priority == 0);
    bool behind = il0.prompt_tokens == 0 || il0.prompt_tokens - il0.prompt_done > CHUNK;
    if (behind)
        CHECKF(ih.first_token_ms < il.first_token_ms, "priority 5 first token at %.1f ms, priority 0 at %.1f ms",
               ih.first_token_ms, il.first_token_ms);
    else
        printf("note: the priority 0 prompt was prefilled (%zu of %zu) before the priority 5 one was submitted\n",
               il0.prompt_done, il0.prompt_tokens);
    kvgen_job_release(jx);
    kvgen_job_release(jl);
    kvgen_job_release(jh);
    kvgen_session_close(x);
    kvgen_session_close(lo);
    kvgen_session_close(hi);
    free(big);
    free(p);
}

/* Arguments are checked at submit; the stop strings and constraint are copies. */
static void test_arguments_and_copies(void) {
    kvgen_error err = {0};
    kvgen_session *s, *ref;
    CHECK_OK(kvgen_session_create(g_model, NULL, &s, &err));
    CHECK_OK(kvgen_session_create(g_model, NULL, &ref, &err));
    kvgen_job *j = (kvgen_job *)&err;
    CHECK(kvgen_job_submit(NULL, NULL, &j, &err) == KVGEN_E_INVALID_ARGUMENT && j == NULL);
    kvgen_job_desc bad = {.prompt = KVGEN_PROMPT_CHAT, .role = "narrator", .text = "x"};
    CHECK(kvgen_job_submit(s, &bad, &j, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "narrator"));
    const char *empty_stop[] = {""};
    kvgen_job_desc bad2 = {.prompt = KVGEN_PROMPT_TEXT, .text = "x", .gen = {.stop = empty_stop, .n_stop = 1}};
    CHECK(kvgen_job_submit(s, &bad2, &j, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "stop[0]"));
    int32_t oob = g_vocab;
    kvgen_job_desc bad3 = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = &oob, .n_tokens = 1};
    CHECK(kvgen_job_submit(s, &bad3, &j, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "vocabulary"));
    kvgen_job_desc bad4 = {.prompt = (kvgen_prompt_kind)42};
    CHECK(kvgen_job_submit(s, &bad4, &j, &err) == KVGEN_E_INVALID_ARGUMENT);
    /* no prompt and no logits: the job fails on the worker with gen_begin's message */
    CHECK_OK(kvgen_job_submit(s, NULL, &j, &err));
    CHECK(tu_job_wait(j));
    kvgen_job_info ji;
    kvgen_job_get_info(j, &ji);
    CHECK(ji.state == KVGEN_JOB_FAILED && ji.error.status == KVGEN_E_INVALID_ARGUMENT &&
          strstr(ji.error.message, "no logits"));
    kvgen_job_release(j);

    /* a JSON constraint built in a buffer that is overwritten right after submit */
    char keys[2][8] = {"mood", "n"}, vals[2][8] = {"calm", "angry"};
    const char *values[2] = {vals[0], vals[1]};
    kvgen_json_field fields[2] = {{.key = keys[0], .type = KVGEN_JSON_ENUM, .values = values, .n_values = 2},
                                  {.key = keys[1], .type = KVGEN_JSON_NUMBER}};
    kvgen_constraint c = {.kind = KVGEN_CONSTRAIN_JSON, .fields = fields, .n_fields = 2};
    char stop_buf[8] = "zzz";
    const char *stops[1] = {stop_buf};
    kvgen_job_desc d = {.prompt = KVGEN_PROMPT_TEXT, .text = "State:", .gen = {.constraint = &c, .stop = stops,
                                                                              .n_stop = 1, .max_tokens = 64}};
    CHECK_OK(kvgen_job_submit(s, &d, &j, &err));
    memset(keys, 'X', sizeof keys);
    memset(vals, 'Y', sizeof vals);
    memset(stop_buf, 'Q', sizeof stop_buf - 1);
    values[0] = values[1] = NULL;
    CHECK(tu_job_wait(j));
    char keys2[2][8] = {"mood", "n"}, vals2[2][8] = {"calm", "angry"};
    const char *values2[2] = {vals2[0], vals2[1]};
    kvgen_json_field fields2[2] = {{.key = keys2[0], .type = KVGEN_JSON_ENUM, .values = values2, .n_values = 2},
                                   {.key = keys2[1], .type = KVGEN_JSON_NUMBER}};
    kvgen_constraint c2 = {.kind = KVGEN_CONSTRAIN_JSON, .fields = fields2, .n_fields = 2};
    const char *stops2[1] = {"zzz"};
    size_t n = 0;
    kvgen_tokenize(g_model, "State:", 6, 0, NULL, 0, &n, &err);
    int32_t *t = malloc(n * sizeof *t);
    CHECK_OK(kvgen_tokenize(g_model, "State:", 6, 0, t, n, &n, &err));
    CHECK_OK(kvgen_session_prefill(ref, t, n, NULL, &err));
    kvgen_generate_desc gd = {.constraint = &c2, .stop = stops2, .n_stop = 1, .max_tokens = 64};
    char text[512];
    CHECK_OK(kvgen_generate(ref, &gd, text, sizeof text, NULL, NULL, &err));
    CHECKF(strcmp(kvgen_job_text(j, NULL), text) == 0, "job '%s' vs direct '%s'", kvgen_job_text(j, NULL), text);
    CHECK(strncmp(text, "{\"mood\":\"", 9) == 0);
    kvgen_job_release(j);
    free(t);
    kvgen_session_close(s);
    kvgen_session_close(ref);
}

/* Seeded storm from the host thread while the worker runs; every event stream is consistent. */
static void test_random_storm(void) {
    enum { NS = 10, NJ = 64, ROUNDS = 1500 };
    kvgen_error err = {0};
    kvgen_jobs_desc jd = {.prefill_chunk = 16, .max_batch = 6};
    CHECK_OK(kvgen_jobs_configure(g_model, &jd, &err));
    uint64_t rng = 0xdecafbad;
    kvgen_session *ss[NS] = {0};
    kvgen_job *jobs[NJ] = {0};
    size_t seen[NJ] = {0};
    int finished[NJ] = {0};
    int owner;
    kvgen_session_desc sd = {.n_ctx = 512, .on_full = KVGEN_ON_FULL_SHIFT, .keep = 4};
    kvgen_chat_template chatml = {.name = "chatml"};
    for (int i = 0; i < NS; i++) {
        CHECK_OK(kvgen_session_create(g_model, &sd, &ss[i], &err));
        CHECK_OK(kvgen_chat_set_template(ss[i], &chatml, &err));
    }
    int submitted = 0, bad = 0;
    for (int round = 0; round < ROUNDS; round++) {
        uint64_t r = rng_next(&rng);
        int op = (int)(r % 10), si = (int)((r >> 8) % NS), ji = (int)((r >> 16) % NJ);
        if (op <= 3 && !jobs[ji]) {
            size_t n = 1 + (size_t)((r >> 24) % 70);
            int32_t *p = random_tokens(&rng, n);
            kvgen_job_desc d = {.prompt = (kvgen_prompt_kind)((r >> 40) % 4), .text = "hi there", .role = "user",
                                .tokens = p, .n_tokens = n, .priority = (int)((r >> 44) % 3), .owner = &owner,
                                .user_data = &jobs[ji], .gen = {.max_tokens = 1 + (int)((r >> 48) % 20)}};
            if (d.prompt == KVGEN_PROMPT_NONE && !kvgen_session_logits(ss[si])) d.prompt = KVGEN_PROMPT_TOKENS;
            kvgen_status st = kvgen_job_submit(ss[si], &d, &jobs[ji], &err);
            CHECK(st == KVGEN_OK);
            submitted++;
            seen[ji] = 0;
            finished[ji] = 0;
            free(p);
        } else if (op == 4 && jobs[ji]) {
            kvgen_job_cancel(jobs[ji]);
        } else if (op == 5 && jobs[ji]) {
            kvgen_job_release(jobs[ji]);
            jobs[ji] = NULL;
        } else if (op == 6 && (r >> 56) % 4 == 0) {
            /* close a session with jobs in flight, open a fresh one in its place */
            kvgen_session_close(ss[si]);
            CHECK_OK(kvgen_session_create(g_model, &sd, &ss[si], &err));
            CHECK_OK(kvgen_chat_set_template(ss[si], &chatml, &err));
        } else if (op == 7 && jobs[ji]) {
            kvgen_job_set_priority(jobs[ji], (int)((r >> 20) % 5));
        } else {
            kvgen_event ev[8];
            int k = kvgen_poll(g_model, &owner, ev, 8);
            for (int e = 0; e < k; e++) {
                int idx = (int)((kvgen_job **)ev[e].user_data - jobs);
                if (idx < 0 || idx >= NJ || jobs[idx] != ev[e].job) {
                    bad++;
                    continue;
                }
                seen[idx] += ev[e].len;
                finished[idx] += ev[e].finished;
            }
        }
        if (round % 50 == 0) tu_pause_us(500);
    }
    CHECK(bad == 0 && submitted > 50);
    /* drain: every live job ends, its finished event comes once and the texts add up */
    for (int i = 0; i < NJ; i++)
        if (jobs[i]) CHECK(tu_job_wait(jobs[i]));
    kvgen_event ev[8];
    int k;
    while ((k = kvgen_poll(g_model, &owner, ev, 8)) > 0)
        for (int e = 0; e < k; e++) {
            int idx = (int)((kvgen_job **)ev[e].user_data - jobs);
            seen[idx] += ev[e].len;
            finished[idx] += ev[e].finished;
        }
    for (int i = 0; i < NJ; i++) {
        if (!jobs[i]) continue;
        size_t n;
        kvgen_job_text(jobs[i], &n);
        kvgen_job_info ji;
        kvgen_job_get_info(jobs[i], &ji);
        /* wait_final's job_poll may have taken the last text; what the events gave is a prefix */
        CHECK(seen[i] <= n && finished[i] <= 1);
        CHECKF(ji.state != KVGEN_JOB_FAILED, "job %d failed: %s", i, ji.error.message);
    }
    kvgen_jobs_stats st;
    kvgen_jobs_get_stats(g_model, &st);
    CHECK(st.jobs_active == 0);
    for (int i = 0; i < NJ; i++) kvgen_job_release(jobs[i]);
    for (int i = 0; i < NS; i++) kvgen_session_close(ss[i]);
}

/* Shutdown with work in flight, in two orders; ASan/LSan see any leak or use after free. */
static void test_shutdown(const char *path) {
    for (int order = 0; order < 3; order++) {
        kvgen_model *m = load(path);
        if (!m) return;
        kvgen_error err = {0};
        kvgen_session *ss[4];
        kvgen_job *jobs[8];
        uint64_t rng = 77 + (uint64_t)order;
        int32_t *p = random_tokens(&rng, 200);
        for (int i = 0; i < 4; i++) CHECK_OK(kvgen_session_create(m, NULL, &ss[i], &err));
        for (int i = 0; i < 8; i++) {
            kvgen_job_desc d = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = p, .n_tokens = 20 + (size_t)i * 20,
                                .gen = {.max_tokens = -1, .ignore_eog = 1}};
            CHECK_OK(kvgen_job_submit(ss[i % 4], &d, &jobs[i], &err));
        }
        tu_pause_us(2000);
        kvgen_model_unload(m); /* the handle goes first: sessions and jobs keep the model */
        if (order == 0) {
            for (int i = 0; i < 4; i++) kvgen_session_close(ss[i]); /* cancels the jobs */
            for (int i = 0; i < 8; i++) {
                CHECK(kvgen_job_poll(jobs[i], NULL, NULL) == KVGEN_JOB_CANCELLED ||
                      kvgen_job_poll(jobs[i], NULL, NULL) == KVGEN_JOB_DONE);
                kvgen_job_release(jobs[i]);
            }
        } else if (order == 1) {
            for (int i = 0; i < 8; i++) kvgen_job_release(jobs[i]); /* released while running */
            for (int i = 0; i < 4; i++) kvgen_session_close(ss[i]); /* the last one frees the model */
        } else {
            for (int i = 0; i < 4; i++) kvgen_session_close(ss[i]);
            for (int i = 7; i >= 0; i--) kvgen_job_release(jobs[i]); /* the last release frees the model */
        }
        free(p);
    }
}

static bool final_state(kvgen_job_state st) {
    return st == KVGEN_JOB_DONE || st == KVGEN_JOB_CANCELLED || st == KVGEN_JOB_FAILED;
}

/* A final state is never observable before the final text: n_jobs short sampled jobs, each
 * against the same generation run blocking with the same seed. The host spins on a poll (every
 * other job kvgen_poll, else kvgen_job_poll) and, after every poll, on kvgen_job_get_info; the
 * first time the state reads final, kvgen_job_text must already be the whole text, although the
 * poll that delivers its last piece may still be to come. At the end the delivered pieces add
 * up to the same text. The host never sleeps, so the worker commits between a poll and the
 * state read as often as the timing allows. */
static void hammer_final_text(kvgen_model *m, const char *what, int n_jobs) {
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    int owner;
    int early = 0, pieces_bad = 0, text_bad = 0, hung = 0;
    for (int i = 0; i < n_jobs; i++) {
        kvgen_sampler_desc sd = {.temperature = 0.9f, .seed = 7000 + (uint64_t)i};
        kvgen_session_desc d = {.n_ctx = 64, .sampler = &sd, .no_prefix_reuse = 1};
        int32_t prompt[3];
        size_t np = 1 + (size_t)(i % 3);
        tu_fill_tokens(prompt, np, 300 + (unsigned)i, info.n_vocab);
        kvgen_generate_desc gd = {.max_tokens = 1 + i % 6, .ignore_eog = 1};
        kvgen_error err = {0};
        kvgen_session *r = NULL, *s = NULL;
        char want[2048];
        size_t wlen = 0;
        kvgen_finish fin;
        CHECK_OK(kvgen_session_create(m, &d, &r, &err));
        CHECK_OK(kvgen_session_create(m, &d, &s, &err));
        if (!r || !s) break;
        CHECK_OK(kvgen_session_prefill(r, prompt, np, NULL, &err));
        CHECK_OK(kvgen_generate(r, &gd, want, sizeof want, &wlen, &fin, &err));
        kvgen_job_desc jd = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = prompt, .n_tokens = np, .gen = gd,
                             .owner = &owner};
        kvgen_job *j = NULL;
        CHECK_OK(kvgen_job_submit(s, &jd, &j, &err));
        char got[2048];
        size_t glen = 0;
        bool finished = false, checked = false;
        for (long long spin = 0; !finished; spin++) {
            if (spin > 4000000000LL) { /* a hang (minutes of spinning), not a timing limit */
                hung++;
                break;
            }
            if (i % 2) {
                const char *t;
                size_t l;
                kvgen_job_state st = kvgen_job_poll(j, &t, &l);
                if (glen + l < sizeof got) memcpy(got + glen, t, l);
                glen += l;
                finished = final_state(st);
            } else {
                kvgen_event ev[4];
                int k = kvgen_poll(m, &owner, ev, 4);
                for (int e = 0; e < k; e++) {
                    if (glen + ev[e].len < sizeof got) memcpy(got + glen, ev[e].text, ev[e].len);
                    glen += ev[e].len;
                    finished |= ev[e].finished != 0;
                }
            }
            kvgen_job_info ji;
            kvgen_job_get_info(j, &ji);
            if (final_state(ji.state) && !checked) {
                checked = true;
                size_t tl;
                const char *t = kvgen_job_text(j, &tl);
                if (tl != wlen || memcmp(t, want, wlen) != 0) early++;
            }
        }
        size_t tl;
        const char *t = kvgen_job_text(j, &tl);
        if (glen != wlen || memcmp(got, want, wlen) != 0) pieces_bad++;
        if (tl != wlen || memcmp(t, want, wlen) != 0) text_bad++;
        kvgen_job_release(j);
        kvgen_session_close(s);
        kvgen_session_close(r);
    }
    CHECKF(early == 0, "%s: %d of %d jobs read final before their text was complete", what, early, n_jobs);
    CHECKF(pieces_bad == 0 && text_bad == 0 && hung == 0, "%s: pieces differ %d, text differs %d, hung %d of %d",
           what, pieces_bad, text_bad, hung, n_jobs);
}

static void final_text_vulkan_body(void *arg) {
    kvgen_error err = {0};
    kvgen_model_desc md = {.path = arg, .backend = KVGEN_BACKEND_VULKAN, .n_threads = 1};
    kvgen_model *m = NULL;
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    if (m) hammer_final_text(m, "vulkan", 60);
    kvgen_model_unload(m);
}

/* the same on the Vulkan backend when a device is present (tu_vulkan_child) */
static void hammer_final_text_vulkan(const char *path) {
    tu_vulkan_child("final text", final_text_vulkan_body, (void *)path);
}

static bool session_free(void *s) { return !kvgen_session_busy(s); }

/* the host's calls on a busy session, from another thread than the test's */
static void *busy_from_thread(void *arg) {
    kvgen_session *s = arg;
    kvgen_error err = {0};
    int32_t t = 1;
    bool refused = kvgen_session_busy(s) && kvgen_session_prefill(s, &t, 1, NULL, &err) == KVGEN_E_INVALID_ARGUMENT &&
                   strstr(err.message, "kvgen_session_prefill") && strstr(err.message, "busy");
    return refused ? s : NULL;
}

/* kvgen_session_busy and the refusal of a busy session: from submit until its jobs are final
 * the session is the worker's, and the calls that would use it fail (naming the function and
 * the session) and change nothing, from any thread but the worker's, while the worker's own
 * calls go on; other sessions are not affected; a job released while running keeps its
 * session busy until the worker has let go of it; close is always allowed. */
static void test_busy_session(const char *path) {
    kvgen_error err = {0};
    CHECK(kvgen_session_busy(NULL) == 0);
    /* a model that never had a job: not busy, and the query starts no worker */
    kvgen_model *fresh = load(path);
    if (!fresh) return;
    kvgen_session *f;
    CHECK_OK(kvgen_session_create(fresh, NULL, &f, &err));
    CHECK(kvgen_session_busy(f) == 0);
    kvgen_jobs_stats st;
    kvgen_jobs_get_stats(fresh, &st);
    CHECK(!st.worker_running);
    int32_t one = 1;
    CHECK_OK(kvgen_session_prefill(f, &one, 1, NULL, &err));
    kvgen_session_close(f);
    kvgen_model_unload(fresh);

    kvgen_session *a, *b;
    kvgen_session_desc sd = {.n_ctx = 64, .on_full = KVGEN_ON_FULL_SHIFT, .keep = 4, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(g_model, &sd, &a, &err));
    CHECK_OK(kvgen_session_create(g_model, &sd, &b, &err));
    uint64_t rng = 4242;
    int32_t *p = random_tokens(&rng, 5);
    CHECK_OK(kvgen_session_prefill(a, p, 5, NULL, &err));
    CHECK(kvgen_session_busy(a) == 0);
    /* never ends by itself in this test's time (the context shifts, and max_tokens is explicit:
     * -1 would stop after one context of tokens): cancelled below */
    kvgen_job_desc endless = {.gen = {.max_tokens = INT_MAX, .ignore_eog = 1}};
    kvgen_job *j, *queued;
    CHECK_OK(kvgen_job_submit(a, &endless, &j, &err));
    CHECK(kvgen_session_busy(a) == 1 && kvgen_session_busy(b) == 0);
    CHECK(wait_for(job_generating, j));
    kvgen_job_desc more = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = p, .n_tokens = 2, .gen = {.max_tokens = 2}};
    CHECK_OK(kvgen_job_submit(a, &more, &queued, &err)); /* queuing behind it is allowed */

    char who[64];
    snprintf(who, sizeof who, "session %p is busy", (void *)a);
#define REFUSED(call, fn)                                                                                              \
    do {                                                                                                               \
        err = (kvgen_error){0};                                                                                        \
        kvgen_status rs_ = (call);                                                                                     \
        CHECKF(rs_ == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, fn ": ") && strstr(err.message, who),         \
               "%s: %s (%s)", #call, kvgen_status_name(rs_), err.message);                                          \
    } while (0)
    REFUSED(kvgen_session_prefill(a, p, 5, NULL, &err), "kvgen_session_prefill");
    REFUSED(kvgen_session_decode(a, p[0], &err), "kvgen_session_decode");
    REFUSED(kvgen_session_rewind(a, 1, &err), "kvgen_session_rewind");
    kvgen_session *child = (kvgen_session *)&err;
    REFUSED(kvgen_session_fork(a, &child, &err), "kvgen_session_fork");
    CHECK(child == NULL);
    float cache[64];
    REFUSED(kvgen_session_read_cache(a, 0, 0, cache, 64, &err), "kvgen_session_read_cache");
    /* the generation, chat, choice and save calls: refused before they touch the session */
    kvgen_gen *g = (kvgen_gen *)&err;
    kvgen_generate_desc gd = {.max_tokens = 2};
    REFUSED(kvgen_gen_begin_prompt(a, p, 5, &gd, &g, &err), "kvgen_gen_begin_prompt");
    CHECK(g == NULL);
    g = (kvgen_gen *)&err;
    REFUSED(kvgen_gen_begin(a, &gd, &g, &err), "kvgen_gen_begin");
    CHECK(g == NULL);
    g = (kvgen_gen *)&err;
    REFUSED(kvgen_chat_gen_begin(a, "user", "hi", &gd, &g, &err), "kvgen_chat_gen_begin");
    CHECK(g == NULL);
    REFUSED(kvgen_chat_add(a, "user", "hi", &err), "kvgen_chat_add");
    REFUSED(kvgen_chat_begin(a, "user", "hi", &err), "kvgen_chat_begin");
    kvgen_chat_template tpl = {.name = "chatml"};
    REFUSED(kvgen_chat_set_template(a, &tpl, &err), "kvgen_chat_set_template");
    kvgen_sampler_desc sampler_before, sampler_after, greedy = {.temperature = 0};
    kvgen_session_get_sampler(a, &sampler_before);
    greedy.seed = sampler_before.seed + 1;
    REFUSED(kvgen_session_set_sampler(a, &greedy, &err), "kvgen_session_set_sampler");
    kvgen_session_get_sampler(a, &sampler_after);
    CHECK(sampler_after.seed == sampler_before.seed);
    const char *cands[] = {"a", "b"};
    kvgen_choice results[2];
    REFUSED(kvgen_session_choose(a, cands, 2, results, &err), "kvgen_session_choose");
    char saved[512];
    snprintf(saved, sizeof saved, "%s/busy_session.kvs", getenv("KVGEN_TEST_TMP") ? getenv("KVGEN_TEST_TMP") : ".");
    remove(saved);
    REFUSED(kvgen_session_save(a, saved, &err), "kvgen_session_save");
    FILE *written = fopen(saved, "rb");
    CHECK(written == NULL); /* nothing was written */
    if (written) fclose(written);
#undef REFUSED
    CHECK(kvgen_session_sample(a) == -1);
    kvgen_session_reset(a); /* left alone: checked below, the prompt is still there */
    pthread_t th;
    void *res = NULL;
    CHECK(pthread_create(&th, NULL, busy_from_thread, a) == 0 && pthread_join(th, &res) == 0 && res == a);
    /* another session of the model is the host's */
    CHECK_OK(kvgen_session_prefill(b, p, 5, NULL, &err));
    CHECK(kvgen_session_sample(b) >= 0);

    kvgen_job_cancel(j);
    CHECK(tu_job_wait(j) && tu_job_wait(queued));
    CHECK(kvgen_session_busy(a) == 0);
    kvgen_job_info ji;
    kvgen_job_get_info(queued, &ji);
    CHECKF(ji.state == KVGEN_JOB_DONE, "the queued job: %s (%s)", kvgen_job_state_name(ji.state), ji.error.message);
    /* nothing of the refused calls happened: the worker's tokens follow the prompt */
    size_t n = kvgen_session_length(a);
    CHECK(n > 5 + 2 && memcmp(kvgen_session_tokens(a), p, 4 * sizeof *p) == 0); /* (keep = 4 survive shifts) */
    CHECK_OK(kvgen_session_prefill(a, p + 4, 1, NULL, &err)); /* the host's again (it may shift) */
    CHECK(kvgen_session_tokens(a)[kvgen_session_length(a) - 1] == p[4]);
    kvgen_job_release(j);
    kvgen_job_release(queued);

    /* released while running: busy until the worker lets go of it (its next step) */
    CHECK_OK(kvgen_job_submit(a, &endless, &j, &err));
    CHECK(wait_for(job_generating, j));
    kvgen_job_release(j);
    CHECK(wait_for(session_free, a));
    CHECK_OK(kvgen_session_decode(a, p[3], &err));
    CHECK(kvgen_session_tokens(a)[kvgen_session_length(a) - 1] == p[3]);

    /* close is always allowed, busy or not */
    CHECK_OK(kvgen_job_submit(a, &endless, &j, &err));
    kvgen_session_close(a);
    CHECK(kvgen_job_poll(j, NULL, NULL) == KVGEN_JOB_CANCELLED);
    kvgen_job_release(j);
    kvgen_session_close(b);
    free(p);
}

int main(void) {
    char *path = tu_make_model("worker.gguf", "--seed 41 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2 "
                                              "--type Q8_0 --ctx 4096");
    if (!path) return tu_finish("test_worker");
    g_model = load(path);
    if (!g_model) return tu_finish("test_worker");
    kvgen_model_info info;
    kvgen_model_get_info(g_model, &info);
    g_vocab = info.n_vocab;
    kvgen_jobs_stats st;
    kvgen_jobs_get_stats(g_model, &st);
    CHECK(!st.worker_running && st.steps == 0); /* nothing starts before the first submit */
    CHECK(strcmp(kvgen_job_state_name(KVGEN_JOB_PREFILLING), "prefilling") == 0);

    test_batched_equals_sequential(g_model, "paged");
    test_short_prompts_batched(g_model, "reference");
    test_chunked_prefill();
    test_poll_structure();
    test_cancel_rollback();
    test_priority();
    test_arguments_and_copies();
    test_random_storm();
    test_busy_session(path);
    hammer_final_text(g_model, "reference", 200);
    kvgen_model_unload(g_model);
    kvgen_model_desc cd = {.path = path, .backend = KVGEN_BACKEND_CPU, .n_threads = 2, .kv_pool_tokens = 64 * 1024};
    kvgen_model *cm = NULL;
    kvgen_error cerr = {0};
    CHECK_OK(kvgen_model_load(&cd, &cm, &cerr));
    if (cm) {
        test_batched_equals_sequential(cm, "cpu");
        test_short_prompts_batched(cm, "cpu");
        kvgen_model_unload(cm);
    }
    hammer_final_text_vulkan(path);

    test_shutdown(path);
    free(path);
    return tu_finish("test_worker");
}
