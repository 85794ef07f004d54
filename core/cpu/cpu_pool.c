/* cpu_pool.c: the persistent thread pool of the CPU backends (kvg_cpu.h).
 *
 * Workers sleep on a condition variable between jobs; a job is published under the mutex with
 * a new generation number, the items are handed out in chunks through one atomic counter, and
 * the caller works on the job too, then waits for the workers to finish theirs. Which thread
 * takes an item varies from run to run; every item is taken exactly once. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>
#include "kvg_cpu.h"

struct kvg_cpu_pool {
    int n_threads; /* workers + the calling thread */
    pthread_t *workers;
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t start_cv, done_cv;
    uint64_t generation; /* bumped per job: wakes the workers */
    int n_busy;          /* workers still inside the current job */
    bool quit;
    /* the current job */
    kvg_cpu_job_fn fn;
    void *ctx;
    int n_items, chunk;
    atomic_int next;
    /* Serialises jobs: several sessions of one model may run forwards on different threads. */
    pthread_mutex_t dispatch;
};

typedef struct worker_arg {
    kvg_cpu_pool *pool;
    int tid;
} worker_arg;

int kvg_cpu_threads(int requested) {
    int n = requested;
    if (n <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n = cores > 0 ? (cores < KVG_CPU_MAX_THREADS ? (int)cores : KVG_CPU_MAX_THREADS) : 1;
    }
    return n > KVG_CPU_MAX_THREADS ? KVG_CPU_MAX_THREADS : n;
}

static void pool_work(kvg_cpu_pool *p, int tid) {
    for (;;) {
        int begin = atomic_fetch_add(&p->next, p->chunk);
        if (begin >= p->n_items) break;
        int end = begin + p->chunk < p->n_items ? begin + p->chunk : p->n_items;
        p->fn(p->ctx, begin, end, tid);
    }
}

static void *pool_main(void *arg) {
    worker_arg a = *(worker_arg *)arg;
    free(arg);
    kvg_cpu_pool *p = a.pool;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->generation == seen && !p->quit) pthread_cond_wait(&p->start_cv, &p->mu);
        if (p->quit) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);

        pool_work(p, a.tid);

        pthread_mutex_lock(&p->mu);
        if (--p->n_busy == 0) pthread_cond_signal(&p->done_cv);
        pthread_mutex_unlock(&p->mu);
    }
}

void kvg_cpu_pool_destroy(kvg_cpu_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i], NULL);
    free(p->workers);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->dispatch);
    free(p);
}

kvgen_status kvg_cpu_pool_create(int n_threads, const char *who, kvg_cpu_pool **out, kvgen_error *err) {
    *out = NULL;
    if (!who) who = "thread pool";
    n_threads = kvg_cpu_threads(n_threads);
    kvg_cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for a thread pool", who);
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    pthread_mutex_init(&p->dispatch, NULL);
    atomic_init(&p->next, 0);
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->workers) {
            kvg_cpu_pool_destroy(p);
            return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for %d threads", who, n_threads);
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (a) *a = (worker_arg){p, i};
        if (!a || pthread_create(&p->workers[i - 1], NULL, pool_main, a) != 0) {
            free(a);
            kvg_cpu_pool_destroy(p);
            return kvg_fail(err, KVGEN_E_INTERNAL, "%s: cannot start thread %d of %d", who, i, n_threads);
        }
        p->n_started++;
    }
    *out = p;
    return KVGEN_OK;
}

int kvg_cpu_pool_threads(const kvg_cpu_pool *p) { return p ? p->n_threads : 0; }

void kvg_cpu_pool_run(kvg_cpu_pool *p, int n_items, kvg_cpu_job_fn fn, void *ctx) {
    if (n_items <= 0) return;
    if (p->n_threads <= 1 || n_items == 1) {
        fn(ctx, 0, n_items, 0);
        return;
    }
    pthread_mutex_lock(&p->dispatch);
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n_items;
    /* several chunks per thread so a thread slowed by other work does not hold up the rest */
    p->chunk = n_items / (p->n_threads * 8);
    if (p->chunk < 1) p->chunk = 1;
    atomic_store(&p->next, 0);
    p->n_busy = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);

    pool_work(p, 0);

    pthread_mutex_lock(&p->mu);
    while (p->n_busy > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->dispatch);
}
