/* memory_bench.c: kvgen-memory-bench, the memory store's search speed (kvgen.h's kvgen_memory_*)
 * against a naive scalar search in the same run: n random memories of dim floats (f32 and f16
 * storage), time per query for the k best, with and without a field filter; the baseline dots
 * every row in a plain scalar loop and sorts all n scores (qsort). Prints one line per case and
 * the ratio. KVGEN_CPU_ISA=portable runs the store's portable C path.
 *
 *   kvgen-memory-bench [--n 100000] [--dim 384] [--queries 50] [--k 5] */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kvgen.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2 - 1);
}

typedef struct scored {
    float s;
    size_t i;
} scored;

static int by_score(const void *a, const void *b) {
    const scored *x = a, *y = b;
    return x->s < y->s ? 1 : x->s > y->s ? -1 : (x->i > y->i) - (x->i < y->i);
}

/* the naive search: scalar dots over unit rows, a full sort */
static size_t naive(const float *rows, size_t n, int dim, const float *q, size_t k, scored *all) {
    double qq = 0;
    for (int j = 0; j < dim; j++) qq += (double)q[j] * q[j];
    float inv = (float)(1 / sqrt(qq));
    for (size_t i = 0; i < n; i++) {
        float s = 0;
        for (int j = 0; j < dim; j++) s += rows[i * (size_t)dim + (size_t)j] * q[j];
        all[i] = (scored){s * inv, i};
    }
    qsort(all, n, sizeof *all, by_score);
    return all[0].i + (k > 0 ? 0 : 1);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    size_t n = 100000, k = 5;
    int dim = 384, queries = 50;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--n")) n = (size_t)strtoull(argv[++i], NULL, 10);
        else if (i + 1 < argc && !strcmp(argv[i], "--dim")) dim = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--queries")) queries = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--k")) k = (size_t)strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: kvgen-memory-bench [--n N] [--dim D] [--queries Q] [--k K]\n");
            return 2;
        }
    }
    if (n == 0 || dim < 1 || queries < 1 || k < 1) {
        fprintf(stderr, "kvgen-memory-bench: --n, --dim, --queries and --k must be positive\n");
        return 2;
    }
    float *rows = malloc(n * (size_t)dim * sizeof *rows), *q = malloc((size_t)queries * (size_t)dim * sizeof *q);
    scored *all = malloc(n * sizeof *all);
    kvgen_memory_hit *hits = malloc(k * sizeof *hits);
    double *t = malloc((size_t)queries * sizeof *t);
    if (!rows || !q || !all || !hits || !t) {
        fprintf(stderr, "kvgen-memory-bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        double ss = 0;
        float *r = rows + i * (size_t)dim;
        for (int j = 0; j < dim; j++) {
            r[j] = frand();
            ss += (double)r[j] * r[j];
        }
        for (int j = 0; j < dim; j++) r[j] = (float)(r[j] / sqrt(ss)); /* the baseline's rows are unit too */
    }
    for (size_t i = 0; i < (size_t)queries * (size_t)dim; i++) q[i] = frand();

    /* the baseline: median time per query */
    volatile size_t sink = 0;
    for (int r = 0; r < queries; r++) {
        double t0 = now_ms();
        sink += naive(rows, n, dim, q + (size_t)r * (size_t)dim, k, all);
        t[r] = now_ms() - t0;
    }
    qsort(t, (size_t)queries, sizeof *t, cmp_double);
    double base = t[queries / 2];
    printf("memory store search, %zu memories x %d floats, k = %zu, median of %d queries\n", n, dim, k, queries);
    printf("%-34s %10.3f ms/query\n", "naive scalar (f32, full sort)", base);

    const char *names[] = {"f32", "f16"};
    for (int s = 0; s < 2; s++) {
        kvgen_memory *m = NULL;
        kvgen_error err = {0};
        kvgen_memory_desc d = {.dim = dim, .storage = (kvgen_memory_storage)s};
        if (kvgen_memory_create(&d, &m, &err) != KVGEN_OK) {
            fprintf(stderr, "kvgen-memory-bench: %s\n", err.message);
            return 1;
        }
        static const char *const towns[] = {"mill", "forge", "inn", "farm"};
        double t0 = now_ms();
        for (size_t i = 0; i < n; i++) {
            kvgen_memory_field f = {"town", towns[i % 4]};
            if (kvgen_memory_add(m, "a memory", &f, 1, rows + i * (size_t)dim, (size_t)dim, NULL, &err) != KVGEN_OK) {
                fprintf(stderr, "kvgen-memory-bench: %s\n", err.message);
                return 1;
            }
        }
        double add_ms = now_ms() - t0;
        kvgen_memory_info info;
        kvgen_memory_get_info(m, &info);
        for (int filtered = 0; filtered < 2; filtered++) {
            kvgen_memory_field where = {"town", "inn"};
            for (int r = 0; r < queries; r++) {
                size_t got = 0;
                double t1 = now_ms();
                if (kvgen_memory_search(m, q + (size_t)r * (size_t)dim, (size_t)dim, k, filtered ? &where : NULL, hits,
                                        &got, &err) != KVGEN_OK) {
                    fprintf(stderr, "kvgen-memory-bench: %s\n", err.message);
                    return 1;
                }
                t[r] = now_ms() - t1;
                sink += got;
            }
            qsort(t, (size_t)queries, sizeof *t, cmp_double);
            char label[80];
            snprintf(label, sizeof label, "kvgen %s (%s)%s", names[s], info.isa, filtered ? ", where town=inn" : "");
            printf("%-34s %10.3f ms/query  %6.1fx the naive one\n", label, t[queries / 2], base / t[queries / 2]);
        }
        printf("%-34s %10.3f us/add, %.1f MiB of vectors\n", "", add_ms * 1e3 / (double)n,
               (double)info.vector_bytes / 1048576.0);
        kvgen_memory_free(m);
    }
    free(rows);
    free(q);
    free(all);
    free(hits);
    free(t);
    return sink == (size_t)-1;
}
