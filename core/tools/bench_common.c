/* bench_common.c: what every part of `kvgen bench` uses: the clock, the load average, the
 * host's core count, error formatting, the list of backends kvgen knows, and the statistics of
 * repeated timings. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(_WIN32)
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#endif
#include "bench_internal.h"

double bench_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The process's resident memory in bytes (Linux: /proc/self/statm), or 0 where it is not known. */
unsigned long long bench_resident_bytes(void) {
#if defined(__linux__)
    unsigned long long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    if (fscanf(f, "%llu %llu", &pages, &resident) != 2) resident = 0;
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? resident * (unsigned long long)page : 0;
#else
    return 0;
#endif
}

double bench_load_average(void) {
    FILE *f = fopen("/proc/loadavg", "r");
    double v = -1;
    if (f) {
        if (fscanf(f, "%lf", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

long bench_online_cpus(void) {
#if defined(_WIN32)
    return (long)GetActiveProcessorCount(ALL_PROCESSOR_GROUPS);
#else
    return sysconf(_SC_NPROCESSORS_ONLN);
#endif
}

kvgen_status bench_fail(kvgen_error *err, kvgen_status status, const char *fmt, ...) {
    err->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return status;
}

static kvgen_backend_info known_backends[BENCH_MAX_BACKENDS];
static int n_known_backends;

int bench_backends(const kvgen_backend_info **list) {
    if (!n_known_backends) {
        int n = kvgen_backends(known_backends, BENCH_MAX_BACKENDS);
        n_known_backends = n < BENCH_MAX_BACKENDS ? n : BENCH_MAX_BACKENDS;
    }
    *list = known_backends;
    return n_known_backends;
}

const kvgen_backend_info *bench_backend_info(kvgen_backend b) {
    const kvgen_backend_info *known;
    int n_known = bench_backends(&known);
    for (int i = 0; i < n_known; i++)
        if (known[i].backend == b) return &known[i];
    return NULL;
}

void bench_backend_names(char *buf, size_t size, const char *sep) {
    const kvgen_backend_info *known;
    int n_known = bench_backends(&known);
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n_known && len < size; i++) {
        int n = snprintf(buf + len, size - len, "%s%s", i ? sep : "", known[i].name);
        if (n < 0) break;
        len += (size_t)n;
    }
}

int bench_job_is_final(kvgen_job_state st) {
    return st == KVGEN_JOB_DONE || st == KVGEN_JOB_CANCELLED || st == KVGEN_JOB_FAILED;
}

/* ---- statistics ---- */

int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bench_stats_finish(bench_stats *s) {
    if (s->n == 0) return;
    double sorted[BENCH_MAX_REPS], sum = 0;
    memcpy(sorted, s->samples, (size_t)s->n * sizeof(double));
    qsort(sorted, (size_t)s->n, sizeof(double), bench_cmp_double);
    for (int i = 0; i < s->n; i++) sum += sorted[i];
    s->min = sorted[0];
    s->max = sorted[s->n - 1];
    s->median = s->n % 2 ? sorted[s->n / 2] : 0.5 * (sorted[s->n / 2 - 1] + sorted[s->n / 2]);
    s->mean = sum / s->n;
    double var = 0;
    for (int i = 0; i < s->n; i++) var += (sorted[i] - s->mean) * (sorted[i] - s->mean);
    s->stddev = s->n > 1 ? sqrt(var / (s->n - 1)) : 0;
}

void bench_stats_add(bench_stats *s, double tokens, double seconds) {
    if (s->n < BENCH_MAX_REPS) s->samples[s->n++] = tokens / (seconds > 1e-9 ? seconds : 1e-9);
}
