/* cpu_pool.c: the persistent thread pool of the CPU backends (kvg_cpu.h).
 *
 * A job is published as a new generation in one atomic word that also holds the index of the
 * next unclaimed item, (generation << 32) | next; threads claim chunks of items by
 * compare-and-swap on that word, so a claim made for an older job fails. The caller works on
 * the job too and returns once every item is *done* (a count of finished items), not once
 * every worker has looked: a worker the OS has not scheduled, or one still asleep, never holds
 * up a job it took no items of. Jobs alternate between two slots, so the slot of the current
 * generation is never rewritten while a thread that read it can still claim from it (the
 * next-but-one job is written only after the next one has been published). Which thread takes
 * an item varies from run to run; every item is taken exactly once.
 *
 * Idle workers sleep on a condition variable. With a spin time (kvg_cpu_pool_set_spin) a
 * worker first polls the word for that long, and the caller polls the done count before it
 * sleeps: a backend running a few hundred short jobs per token then pays no sleep/wake-up
 * latency between them. */
#define _POSIX_C_SOURCE 200809L
#include "kvg_platform.h"
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include "kvg_cpu.h"

typedef struct pool_job {
    kvg_cpu_job_fn fn;
    void *ctx;
    int n_items, chunk;
} pool_job;

struct kvg_cpu_pool {
    int n_threads; /* workers + the calling thread */
    kvg_thread *workers;
    int n_started;
    kvg_mutex mu;
    kvg_cond start_cv, done_cv;
    _Atomic uint64_t state; /* (generation << 32) | next item; a new generation is stored under mu */
    atomic_int done;        /* items of the current job finished */
    atomic_bool quit;
    atomic_int spin_us;     /* polling time before sleeping (0: none) */
    uint32_t generation;    /* the caller's copy (under dispatch) */
    pool_job jobs[2];       /* job g lives in jobs[g % 2] */
    /* Serialises jobs: several sessions of one model may run forwards on different threads. */
    kvg_mutex dispatch;
};

typedef struct worker_arg {
    kvg_cpu_pool *pool;
    int tid;
} worker_arg;

int kvg_cpu_threads(int requested) {
    int n = requested;
    if (n <= 0) {
        int cores = kvg_cpu_count();
        n = cores < KVG_CPU_MAX_THREADS ? cores : KVG_CPU_MAX_THREADS;
    }
    return n > KVG_CPU_MAX_THREADS ? KVG_CPU_MAX_THREADS : n;
}

static uint32_t gen_of(uint64_t state) { return (uint32_t)(state >> 32); }

/* Claims and runs chunks of job g until none is left or g is no longer the current job. The
 * job's fields are read after g was seen current (they were written before it was published)
 * and used only once a claim in g succeeded. */
static void pool_work(kvg_cpu_pool *p, uint32_t g, int tid) {
    const pool_job *j = &p->jobs[g % 2];
    kvg_cpu_job_fn fn = j->fn;
    void *ctx = j->ctx;
    int n = j->n_items, chunk = j->chunk;
    uint64_t st = atomic_load_explicit(&p->state, memory_order_acquire);
    for (;;) {
        if (gen_of(st) != g) return;
        int begin = (int)(uint32_t)st;
        if (begin >= n) return;
        int end = begin + chunk < n ? begin + chunk : n;
        uint64_t claimed = ((uint64_t)g << 32) | (uint32_t)end;
        if (!atomic_compare_exchange_weak_explicit(&p->state, &st, claimed, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* st now holds the word as it is */
        fn(ctx, begin, end, tid);
        if (atomic_fetch_add_explicit(&p->done, end - begin, memory_order_acq_rel) + (end - begin) == n) {
            kvg_mutex_lock(&p->mu);
            kvg_cond_signal(&p->done_cv);
            kvg_mutex_unlock(&p->mu);
        }
        st = atomic_load_explicit(&p->state, memory_order_acquire);
    }
}

static double now_us(void) {
    return (double)kvg_time_ns() * 1e-3;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Polls until ready(p, arg) or spin_us have passed; returns ready's last answer. */
static bool spin_until(kvg_cpu_pool *p, bool (*ready)(kvg_cpu_pool *, uint64_t), uint64_t arg) {
    int us = atomic_load_explicit(&p->spin_us, memory_order_relaxed);
    if (us <= 0) return ready(p, arg);
    double deadline = now_us() + us;
    for (unsigned i = 1;; i++) {
        if (ready(p, arg)) return true;
        cpu_relax();
        if (i % 256 == 0 && now_us() > deadline) return ready(p, arg);
    }
}

static bool new_job(kvg_cpu_pool *p, uint64_t seen) {
    return gen_of(atomic_load_explicit(&p->state, memory_order_acquire)) != (uint32_t)seen ||
           atomic_load_explicit(&p->quit, memory_order_acquire);
}

static bool job_done(kvg_cpu_pool *p, uint64_t n_items) {
    return (uint64_t)atomic_load_explicit(&p->done, memory_order_acquire) == n_items;
}

static void *pool_main(void *arg) {
    worker_arg a = *(worker_arg *)arg;
    kvg_free(arg);
    kvg_cpu_pool *p = a.pool;
    uint32_t seen = 0;
    for (;;) {
        if (!spin_until(p, new_job, seen)) {
            kvg_mutex_lock(&p->mu);
            while (!new_job(p, seen)) kvg_cond_wait(&p->start_cv, &p->mu);
            kvg_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) return NULL;
        seen = gen_of(atomic_load_explicit(&p->state, memory_order_acquire));
        pool_work(p, seen, a.tid);
    }
}

void kvg_cpu_pool_destroy(kvg_cpu_pool *p) {
    if (!p) return;
    kvg_mutex_lock(&p->mu);
    atomic_store(&p->quit, true);
    kvg_cond_broadcast(&p->start_cv);
    kvg_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) kvg_thread_join(&p->workers[i]);
    kvg_free(p->workers);
    kvg_mutex_destroy(&p->mu);
    kvg_cond_destroy(&p->start_cv);
    kvg_cond_destroy(&p->done_cv);
    kvg_mutex_destroy(&p->dispatch);
    kvg_free(p);
}

kvgen_status kvg_cpu_pool_create(int n_threads, const char *who, kvg_cpu_pool **out, kvgen_error *err) {
    *out = NULL;
    if (!who) who = "thread pool";
    n_threads = kvg_cpu_threads(n_threads);
    kvg_cpu_pool *p = kvg_calloc(1, sizeof *p);
    if (!p) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for a thread pool", who);
    p->n_threads = n_threads;
    kvg_mutex_init(&p->mu);
    kvg_cond_init(&p->start_cv);
    kvg_cond_init(&p->done_cv);
    kvg_mutex_init(&p->dispatch);
    atomic_init(&p->state, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->quit, false);
    atomic_init(&p->spin_us, 0);
    if (n_threads > 1) {
        p->workers = kvg_calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->workers) {
            kvg_cpu_pool_destroy(p);
            return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for %d threads", who, n_threads);
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = kvg_malloc(sizeof *a);
        if (a) *a = (worker_arg){p, i};
        if (!a || kvg_thread_create(&p->workers[i - 1], pool_main, a) != 0) {
            kvg_free(a);
            kvg_cpu_pool_destroy(p);
            return kvg_fail(err, KVGEN_E_INTERNAL, "%s: cannot start thread %d of %d", who, i, n_threads);
        }
        p->n_started++;
    }
    *out = p;
    return KVGEN_OK;
}

int kvg_cpu_pool_threads(const kvg_cpu_pool *p) { return p ? p->n_threads : 0; }

void kvg_cpu_pool_set_spin(kvg_cpu_pool *p, int spin_us) {
    if (p) atomic_store(&p->spin_us, spin_us > 0 ? spin_us : 0);
}

void kvg_cpu_pool_run(kvg_cpu_pool *p, int n_items, kvg_cpu_job_fn fn, void *ctx) {
    if (n_items <= 0) return;
    if (p->n_threads <= 1 || n_items == 1) {
        fn(ctx, 0, n_items, 0);
        return;
    }
    kvg_mutex_lock(&p->dispatch);
    uint32_t g = ++p->generation;
    /* several chunks per thread so a thread slowed by other work does not hold up the rest */
    int chunk = n_items / (p->n_threads * 8);
    p->jobs[g % 2] = (pool_job){.fn = fn, .ctx = ctx, .n_items = n_items, .chunk = chunk < 1 ? 1 : chunk};
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    kvg_mutex_lock(&p->mu);
    atomic_store_explicit(&p->state, (uint64_t)g << 32, memory_order_release);
    kvg_cond_broadcast(&p->start_cv);
    kvg_mutex_unlock(&p->mu);

    pool_work(p, g, 0);

    if (!spin_until(p, job_done, (uint64_t)n_items)) {
        kvg_mutex_lock(&p->mu);
        while (!job_done(p, (uint64_t)n_items)) kvg_cond_wait(&p->done_cv, &p->mu);
        kvg_mutex_unlock(&p->mu);
    }
    kvg_mutex_unlock(&p->dispatch);
}
