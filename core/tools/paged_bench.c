/* paged_bench.c: the paged KV cache's costs, measured side by side in one process (issue 4's
 * benchmark figures; `kvgen bench` measures the rest).
 *
 *   kvgen-paged-bench MODEL [--backend reference|vulkan] [--depth 2048] [--steps 8] [--reps 3]
 *                           [--prompt 512] [--forks 64] [--reuse 4]
 *
 * 1. Decode tokens/s at cache depth D, paged (page table) vs contiguous (kv_contiguous): one
 *    model of each kind, the decodes of the two interleaved rep by rep. The depth is reached by
 *    running the backend at position D directly over an untouched (zero) cache: attention's
 *    cost does not depend on the cached values, and prefilling 2048 tokens on lavapipe takes
 *    minutes.
 * 2. Creating N sessions that hold one P-token prompt: N forks of a prefilled parent vs N
 *    sessions prefilled from scratch (the parent's own prefill is one of those, timed, times
 *    N), and the time per session of sessions prefilled with prefix reuse (all pages but the
 *    last one taken from the pool; --reuse of them). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kvg_session.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int fail(const char *what, const kvgen_error *err) {
    fprintf(stderr, "kvgen-paged-bench: %s: %s\n", what, err->message);
    return 1;
}

static kvgen_status load(const char *path, kvgen_backend b, int contiguous, kvgen_model **m, kvgen_error *err) {
    kvgen_model_desc d = {.path = path, .backend = b, .kv_contiguous = contiguous, .kv_pool_tokens = 4096};
    return kvgen_model_load(&d, m, err);
}

int main(int argc, char **argv) {
    const char *path = NULL;
    kvgen_backend backend = KVGEN_BACKEND_VULKAN;
    int depth = 2048, steps = 8, reps = 3, prompt = 512, forks = 64, n_reuse = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--backend") == 0 && v) {
            backend = strcmp(v, "reference") == 0 ? KVGEN_BACKEND_REFERENCE : KVGEN_BACKEND_VULKAN;
            i++;
        } else if (strcmp(a, "--depth") == 0 && v) {
            depth = atoi(argv[++i]);
        } else if (strcmp(a, "--steps") == 0 && v) {
            steps = atoi(argv[++i]);
        } else if (strcmp(a, "--reps") == 0 && v) {
            reps = atoi(argv[++i]);
        } else if (strcmp(a, "--prompt") == 0 && v) {
            prompt = atoi(argv[++i]);
        } else if (strcmp(a, "--reuse") == 0 && v) {
            n_reuse = atoi(argv[++i]);
        } else if (strcmp(a, "--forks") == 0 && v) {
            forks = atoi(argv[++i]);
        } else if (a[0] != '-' && !path) {
            path = a;
        } else {
            fprintf(stderr, "usage: kvgen-paged-bench MODEL [--backend reference|vulkan] [--depth N] [--steps N] "
                            "[--reps N] [--prompt N] [--forks N] [--reuse N]\n");
            return 2;
        }
    }
    if (!path || depth < 0 || steps < 1 || reps < 1 || prompt < 1 || forks < 1 || n_reuse < 1 || n_reuse > forks ||
        depth + steps > 8000 ||
        reps > 64) {
        fprintf(stderr, "kvgen-paged-bench: a model path and sane sizes are needed (depth + steps <= 8000)\n");
        return 2;
    }
    kvgen_error err = {0};
    kvgen_model *mp = NULL, *mc = NULL;
    if (load(path, backend, 0, &mp, &err) != KVGEN_OK) return fail("load (paged)", &err);
    if (load(path, backend, 1, &mc, &err) != KVGEN_OK) return fail("load (contiguous)", &err);
    kvgen_pool_info pool;
    kvgen_model_pool_info(mp, &pool);
    printf("%s on %s (%s), pool of %zu pages of %zu tokens\n", path, mp->ops->name, mp->device_name,
           pool.pages_total, pool.page_size);
    int V = mp->w.hp.n_vocab;
    float *logits = malloc((size_t)V * sizeof *logits);
    kvgen_session_desc sd = {.n_ctx = 8192, .no_prefix_reuse = 1};
    kvgen_session *sp = NULL, *sc = NULL;
    if (!logits) return 1;
    if (kvgen_session_create(mp, &sd, &sp, &err) != KVGEN_OK) return fail("session (paged)", &err);
    if (kvgen_session_create(mc, &sd, &sc, &err) != KVGEN_OK) return fail("session (contiguous)", &err);

    /* 1. decode at depth: the paged session's table gets the pages for [0, depth + steps) */
    size_t P = (size_t)kvg_pool_page_size(mp->pool), n_tab = ((size_t)depth + (size_t)steps + P - 1) / P;
    int32_t *table = malloc(n_tab * sizeof *table);
    if (!table) return 1;
    for (size_t i = 0; i < n_tab; i++)
        if (kvg_pool_alloc(mp->pool, &table[i], &err) != KVGEN_OK) return fail("pool", &err);
    double tp[64], tc[64];
    for (int r = 0; r < reps; r++) {
        for (int kind = 0; kind < 2; kind++) {
            double t0 = now_s();
            for (int i = 0; i < steps; i++) {
                int32_t tok = (int32_t)((i * 7919 + r) % V);
                kvgen_status st = kind == 0 ? mp->ops->forward_paged(mp, sp->bs, table, &tok, 1, depth + i, logits,
                                                                    false, &err)
                                            : mc->ops->forward(mc, sc->bs, &tok, 1, depth + i, logits, false, &err);
                if (st != KVGEN_OK) return fail("decode", &err);
            }
            (kind == 0 ? tp : tc)[r] = (double)steps / (now_s() - t0);
        }
    }
    qsort(tp, (size_t)reps, sizeof *tp, cmp_double);
    qsort(tc, (size_t)reps, sizeof *tc, cmp_double);
    printf("decode at depth %d (%d steps x %d reps, tokens/s median [min, max]): paged %.2f [%.2f, %.2f], "
           "contiguous %.2f [%.2f, %.2f], paged/contiguous %.3f\n",
           depth, steps, reps, tp[reps / 2], tp[0], tp[reps - 1], tc[reps / 2], tc[0], tc[reps - 1],
           tp[reps / 2] / tc[reps / 2]);
    for (size_t i = 0; i < n_tab; i++) kvg_pool_release(mp->pool, table[i]);
    free(table);
    kvgen_session_close(sc);
    kvgen_model_unload(mc);

    /* 2. N sessions holding one prompt */
    int32_t *toks = malloc((size_t)prompt * sizeof *toks);
    kvgen_session **ss = calloc((size_t)forks, sizeof *ss);
    if (!toks || !ss) return 1;
    for (int i = 0; i < prompt; i++) toks[i] = (int32_t)((i * 104729 + 17) % V);
    /* warm-up: a device's first prefill of a shape may compile its kernels */
    kvgen_session_reset(sp);
    size_t warm = prompt - 1 < 130 ? (size_t)prompt - 1 : 130;
    if (warm && kvgen_session_prefill(sp, toks + 1, warm, NULL, &err) != KVGEN_OK) return fail("prefill", &err);
    kvgen_session_reset(sp);
    sp->prefix_reuse = true; /* publish the parent's pages for the prefix-reuse run */
    double t0 = now_s();
    if (kvgen_session_prefill(sp, toks, (size_t)prompt, NULL, &err) != KVGEN_OK) return fail("prefill", &err);
    double t_scratch = now_s() - t0;
    t0 = now_s();
    for (int i = 0; i < forks; i++)
        if (kvgen_session_fork(sp, &ss[i], &err) != KVGEN_OK) return fail("fork", &err);
    double t_fork = now_s() - t0;
    kvgen_pool_info pi;
    kvgen_model_pool_info(mp, &pi);
    size_t used_forks = pi.pages_used;
    for (int i = 0; i < forks; i++) kvgen_session_close(ss[i]);
    kvgen_session_desc rd = {.n_ctx = 8192};
    t0 = now_s();
    size_t reused = 0;
    for (int i = 0; i < n_reuse; i++) {
        if (kvgen_session_create(mp, &rd, &ss[i], &err) != KVGEN_OK ||
            kvgen_session_prefill(ss[i], toks, (size_t)prompt, NULL, &err) != KVGEN_OK)
            return fail("prefill with prefix reuse", &err);
        kvgen_cache_info ci;
        kvgen_session_cache_info(ss[i], &ci);
        reused += ci.tokens_reused;
    }
    double t_reuse = now_s() - t0;
    for (int i = 0; i < n_reuse; i++) kvgen_session_close(ss[i]);
    printf("%d sessions holding a %d-token prompt: forks %.4f s (%.3f ms each; %zu pages in use with the parent), "
           "from scratch %.2f s (one prefill %.3f s, x %d); prefix reuse %.3f s per session (%zu of %zu tokens "
           "reused over %d sessions); scratch/fork %.0fx\n",
           forks, prompt, t_fork, t_fork * 1e3 / forks, used_forks, t_scratch * forks, t_scratch, forks,
           t_reuse / n_reuse, reused, (size_t)n_reuse * (size_t)prompt, n_reuse, t_scratch * forks / t_fork);
    free(toks);
    free(ss);
    free(logits);
    kvgen_session_close(sp);
    kvgen_model_unload(mp);
    return 0;
}
