/* bench_probe.c: the bandwidth behind `kvgen bench`'s decode ceiling ("weight bytes /
 * streaming-read bandwidth"). For a backend that runs on a device (Vulkan) the probe shaders
 * (kvgen_device_probe), a ceiling that means the same on lavapipe and on a GPU; for a host
 * backend (cpu, reference) a streaming read of host memory by as many threads as the backend
 * runs, the same ceiling for the host's cores. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include "bench_internal.h"

static void run_probe(const bench_opts *o, bench_result *r) {
    kvgen_probe_result p;
    kvgen_error err = {0};
    kvgen_probe_desc pd = {.device = o->device};
    if (o->quick) pd = (kvgen_probe_desc){.device = o->device, .read_mib = 8, .reps = 2, .dispatches = 100};
    kvgen_status st = kvgen_device_probe(&pd, &p, &err);
    if (st != KVGEN_OK) {
        snprintf(r->probe_note, sizeof r->probe_note, "probe failed: %.480s", err.message);
        return;
    }
    /* run before and after the model's measurements: on a shared machine the best of the two
     * is the closer estimate of what the device can do */
    if (r->n_probe_runs < 2) r->probe_gbps_runs[r->n_probe_runs++] = p.read_gbps;
    snprintf(r->probe_device, sizeof r->probe_device, "%s", p.device);
    if (!r->have_probe || p.read_gbps > r->probe_gbps) r->probe_gbps = p.read_gbps;
    if (!r->have_probe || p.dispatch_us < r->probe_us) r->probe_us = p.dispatch_us;
    r->probe_bytes = (unsigned long long)p.bytes;
    r->have_probe = 1;
}

/* The host backends' probe: a streaming read of a buffer far larger than any cache by
 * `threads` threads (a slice each), best of a few runs, as GB/s. */
typedef struct host_slice {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} host_slice;

static void *host_read(void *arg) {
    host_slice *h = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= h->n; i += 4) {
        s0 += h->p[i];
        s1 += h->p[i + 1];
        s2 += h->p[i + 2];
        s3 += h->p[i + 3];
    }
    h->sum = s0 + s1 + s2 + s3;
    return NULL;
}

static void run_host_probe(const bench_opts *o, bench_result *r) {
    enum { MAX_T = 256 };
    long nt = o->threads ? o->threads : bench_online_cpus();
    if (nt < 1) nt = 1;
    if (nt > MAX_T) nt = MAX_T;
    size_t bytes = (size_t)(o->quick ? 8 : 512) << 20, words = bytes / 8;
    uint64_t *buf = malloc(bytes);
    if (!buf) {
        snprintf(r->probe_note, sizeof r->probe_note, "probe failed: no memory for a %zu MiB buffer", bytes >> 20);
        return;
    }
    for (size_t i = 0; i < words; i++) buf[i] = i;
    double best = 0;
    for (int rep = 0; rep < (o->quick ? 2 : 5); rep++) {
        host_slice sl[MAX_T];
        pthread_t th[MAX_T];
        size_t per = words / (size_t)nt;
        double t0 = bench_now_s();
        for (long i = 0; i < nt; i++) {
            sl[i] = (host_slice){.p = buf + (size_t)i * per, .n = per};
            if (i > 0 && pthread_create(&th[i], NULL, host_read, &sl[i]) != 0) sl[i].n = 0;
        }
        host_read(&sl[0]);
        for (long i = 1; i < nt; i++)
            if (sl[i].n) pthread_join(th[i], NULL);
        double t = bench_now_s() - t0;
        size_t read = 0;
        for (long i = 0; i < nt; i++) {
            read += sl[i].n * 8;
        }
        if (t > 0 && (double)read / t / 1e9 > best) best = (double)read / t / 1e9;
    }
    free(buf);
    if (r->n_probe_runs < 2) r->probe_gbps_runs[r->n_probe_runs++] = best;
    snprintf(r->probe_device, sizeof r->probe_device, "host memory (%ld threads)", nt);
    if (!r->have_probe || best > r->probe_gbps) r->probe_gbps = best;
    r->probe_us = 0;
    r->probe_bytes = (unsigned long long)bytes;
    r->have_probe = 1;
}

void bench_probe(const bench_opts *o, bench_result *r) {
    if (r->uses_device) run_probe(o, r);
    else run_host_probe(o, r);
}
