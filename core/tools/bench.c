/* bench.c: `kvgen bench` and `kvgen devices`.
 *
 * The benchmark measures what a host sees through the public API (kvgen.h): prompt
 * processing (one prefill of P tokens), decode (one-token steps on a cache already holding
 * `depth` tokens), and decode without a cache (every step recomputes the whole sequence) next
 * to cached decode at the same depth, so the O(N^2) vs O(N) gap is a ratio measured side by
 * side. Several backends run in one invocation so their ratio comes from one moment of a
 * shared, noisy machine. For a backend that runs on a device (Vulkan) it also runs the probe
 * shaders (kvgen_device_probe) and reports decode as a percentage of "weight bytes /
 * streaming-read bandwidth", a ceiling that means the same on lavapipe and on a GPU; for a
 * host backend (cpu, reference) the bandwidth is a streaming read of host memory by as many
 * threads as the backend runs (host_probe), the same ceiling for the host's cores. Like any
 * host, it uses kvgen.h only: backends are named through kvgen_backends.
 *
 * Timing order per backend, chosen so the long prefills are paid once: warm-up, prompts in
 * ascending size (the last repetition leaves the largest prompt in the cache), then decode
 * depths in descending order: the first fills the cache up to the deepest depth, each next one
 * only rewinds (kvgen_session_rewind recomputes one token). Sessions never take pages from the
 * prefix cache, or a repeated prompt would be served from it and time nothing.
 *
 * The deepest cache is filled once, by the first backend (the reference: backends always run
 * reference first), and saved with kvgen_session_save; the next backend restores it
 * (kvgen_session_restore writes the K/V into its own cache) instead of prefilling 2,048 tokens
 * again at its own prompt speed. How the cache was filled does not change a decode step.
 *
 * Optional sections, each measured per backend after the above:
 *   --sessions 1,2,4,8,16  aggregate decode tokens/s of that many sessions generating at once
 *       through the jobs worker (kvgen_job_submit: batched decode, each weight read once per
 *       step for up to 8 sessions), and the ratio to one session;
 *   --forks  N (64) sessions holding one P-token (512) prompt: N forks of a prefilled parent vs
 *       N prefilled from scratch, the latter estimated as the parent's own timed prefill x N. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#if defined(_WIN32)
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#else
#include <sys/wait.h>
#endif
#include "kvgen.h"
#include "bench.h"

#define BENCH_MAX_REPS 64
#define BENCH_MAX_SIZES 8
#define BENCH_MAX_BACKENDS 8 /* backends kvgen knows (kvgen_backends), at most */

/* a fixed paragraph: its tokens, repeated, are every prompt, fill and decode input */
static const char bench_text[] =
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting the steps as his "
    "father had before him. From the lamp room he could see the fishing boats returning to the harbour, "
    "their lanterns swaying over the grey water, and the lights of the village coming on one by one. "
    "He wrote the weather in the log: wind from the north-west, a falling glass, fog likely before "
    "midnight. Then he trimmed the wick, wound the clockwork that turned the lens, and sat down with "
    "a cup of tea to wait for the long night, listening to the gulls and the slow breathing of the sea.";

typedef struct bench_stats {
    int n;
    double median, min, max, mean, stddev;
    double samples[BENCH_MAX_REPS]; /* tokens per second, one per repetition */
} bench_stats;

typedef struct bench_opts {
    const char *model, *json, *device;
    kvgen_backend backends[BENCH_MAX_BACKENDS];
    int n_backends;
    int reps, steps, quick, threads;
    int activation_bits; /* kvgen_model_desc.activation_bits of the cpu backend (0: default) */
    int prompts[BENCH_MAX_SIZES], n_prompts;
    int depths[BENCH_MAX_SIZES], n_depths;
    int nc_depth, nc_steps; /* no-cache comparison; nc_depth 0: skipped */
    int nc_depths[BENCH_MAX_SIZES], n_nc; /* every no-cache depth, ascending; nc_depth is the first */
    int sessions[BENCH_MAX_SIZES], n_sessions; /* concurrent sessions; n_sessions 0: skipped */
    int session_tokens;                         /* tokens each of them generates */
    int forks, n_forks, fork_prompt;            /* forks vs scratch */
    const char *peer;                           /* llama-bench to run on the same file; NULL: none */
    const char *peer_batched;                   /* llama-batched-bench for --sessions; NULL: none */
    const char *peer_remote;                    /* a remote model's plain client (--peer-remote) */
} bench_opts;

typedef struct bench_result {
    kvgen_backend backend;
    const char *name;
    int uses_device; /* probed with kvgen_device_probe */
    int ok;
    char error[KVGEN_ERROR_MESSAGE_SIZE];
    char device[256];
    bench_stats prompt[BENCH_MAX_SIZES];
    bench_stats decode[BENCH_MAX_SIZES];  /* in opts.depths order */
    bench_stats nc, nc_cached;            /* decode at nc_depth without / with the cache */
    bench_stats nc_curve[BENCH_MAX_SIZES], nc_curve_cached[BENCH_MAX_SIZES]; /* at every nc_depths entry */
    bench_stats sessions[BENCH_MAX_SIZES]; /* aggregate tokens/s, in opts.sessions order */
    double fork_s, scratch_one_s;          /* N forks; one prefill of the prompt */
    size_t fork_pages;                     /* pages in use with the parent and its forks */
    int filled_by_restore; /* the deepest cache came from the reference backend's saved session */
    int have_probe, n_probe_runs;
    double probe_gbps_runs[2];
    char probe_note[KVGEN_ERROR_MESSAGE_SIZE]; /* why there is no probe */
    char probe_device[256];
    double probe_gbps, probe_us;
    unsigned long long probe_bytes;
    double seconds; /* wall time of this backend's whole run */
} bench_result;

/* the deepest filled session, saved by one backend for the next */
typedef struct bench_fill {
    char path[512];
    int depth; /* 0: none saved */
} bench_fill;

typedef struct bench_model {
    char name[256];
    uint64_t weight_bytes, n_params;
    int n_layer, n_embd, n_vocab;
} bench_model;

/* A peer engine's figures, measured by running it on the same file in the same invocation. */
typedef struct bench_peer {
    int ran;                            /* its output was read */
    char error[512];                    /* why not */
    double prompt[BENCH_MAX_SIZES];     /* tokens/s in opts.prompts order; 0: not reported */
    double decode[BENCH_MAX_SIZES];     /* tokens/s generating --steps tokens, in opts.depths order */
    double seconds;                     /* wall time of its runs */
    /* llama-batched-bench (--peer-batched) */
    int batched_ran;
    char batched_error[512];
    double sessions[BENCH_MAX_SIZES];   /* aggregate decode tokens/s, in opts.sessions order */
    double batched_seconds;
} bench_peer;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* the 1-minute load average, or -1 where /proc/loadavg is absent: worth printing on a shared machine */
static double load_average(void) {
    FILE *f = fopen("/proc/loadavg", "r");
    double v = -1;
    if (f) {
        if (fscanf(f, "%lf", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

/* kvgen's own counterpart of an error: formats into err and returns status */
#if defined(__GNUC__) && !defined(__MINGW32__)
__attribute__((format(printf, 3, 4)))
#endif
static kvgen_status bench_fail(kvgen_error *err, kvgen_status status, const char *fmt, ...) {
    err->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return status;
}

/* The backends kvgen knows (kvgen_backends), in its order. */
static kvgen_backend_info known_backends[BENCH_MAX_BACKENDS];
static int n_known_backends;

static void list_backends(void) {
    if (n_known_backends) return;
    int n = kvgen_backends(known_backends, BENCH_MAX_BACKENDS);
    n_known_backends = n < BENCH_MAX_BACKENDS ? n : BENCH_MAX_BACKENDS;
}

static const kvgen_backend_info *backend_info(kvgen_backend b) {
    list_backends();
    for (int i = 0; i < n_known_backends; i++)
        if (known_backends[i].backend == b) return &known_backends[i];
    return NULL;
}

/* "vulkan, reference" (sep ", ") into buf */
static void backend_names(char *buf, size_t size, const char *sep) {
    list_backends();
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n_known_backends && len < size; i++) {
        int n = snprintf(buf + len, size - len, "%s%s", i ? sep : "", known_backends[i].name);
        if (n < 0) break;
        len += (size_t)n;
    }
}

static void bench_usage(FILE *f) {
    char names[128];
    backend_names(names, sizeof names, ",");
    fprintf(f,
            "usage: kvgen bench MODEL [options]\n"
            "  --backend LIST       some of %s (default: every one this kvgen has, reference first)\n"
            "  --json FILE          also write the results as JSON\n"
            "  --reps N             repetitions of every measurement (default 3; median and min/max/stddev)\n"
            "  --steps N            decode steps timed per repetition (default 16)\n"
            "  --prompts LIST       prompt sizes in tokens (default 64,512)\n"
            "  --depths LIST        decode cache depths in tokens (default 0,512,2048)\n"
            "  --no-cache           measure decode without a cache, next to cached decode at the same\n"
            "                       depth (on by default; the O(N^2) vs O(N) gap)\n"
            "  --no-cache-depth LIST  depths of that comparison (default 32; 0: skip it); the first is the\n"
            "                       table's ratio, all are in the JSON's no_cache_curve\n"
            "  --quick              a small run for tests: reps 2, steps 4, prompts 8,32, depths 0,32,64,\n"
            "                       no-cache depth 16, a short probe\n"
            "  --device D           Vulkan device index or name substring\n"
            "  --threads N          cpu and reference backend threads (default: all cores)\n"
            "  --activation-bits B  cpu backend: 16 (default) or 8 (as llama.cpp's CPU backend)\n"
            "  --sessions LIST      also: aggregate decode tokens/s of that many sessions at once through the\n"
            "                       jobs worker (batched decode), e.g. 1,2,4,8,16; ratio to 1 session\n"
            "  --session-tokens N   tokens each of those sessions generates (default: --steps)\n"
            "  --forks              also: time to create --fork-sessions forks of a --fork-prompt token\n"
            "                       prompt vs as many prefilled from scratch (estimated: one prefill x N)\n"
            "  --fork-sessions N    (default 64; --quick 4)   --fork-prompt N (default 512; --quick 32)\n"
            "  --peer PATH          also run llama.cpp's llama-bench (PATH) on the same file with the same\n"
            "                       prompt sizes, decode depths, steps, repetitions and threads, and print\n"
            "                       kvgen/peer ratios\n"
            "  --peer-batched PATH  with --sessions: also run llama.cpp's llama-batched-bench (PATH) with that\n"
            "                       many parallel sequences (1-token prompts, --session-tokens generated)\n"
            "                       and print the aggregate decode ratios\n"
            "A MODEL that is a server's URL (http://127.0.0.1:8080/v1) measures remote sessions: for each\n"
            "--sessions count (default 1,8,32), that many jobs at once, each --session-tokens long, their\n"
            "aggregate tokens/s and kvgen's time on the host thread per token; with\n"
            "  --peer-remote PATH   the same requests from a plain client (PATH URL MODEL SESSIONS TOKENS,\n"
            "                       printing {\"tokens\": T, \"seconds\": S}; scripts/openai_load.py) and the ratios\n"
            "usage: kvgen devices   lists the Vulkan devices kvgen can run on\n",
            names);
}

static int bench_usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "kvgen bench: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    bench_usage(stderr);
    return 2;
}

static int parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

/* "64,512" -> {64, 512}; 0 on a bad or empty list */
static int parse_int_list(const char *s, long lo, int *out, int *n) {
    char buf[256];
    if (strlen(s) >= sizeof buf) return 0;
    snprintf(buf, sizeof buf, "%s", s);
    *n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == BENCH_MAX_SIZES || !parse_int(tok, lo, 1 << 20, &out[*n])) return 0;
        (*n)++;
    }
    return *n > 0;
}

static int parse_backends(const char *s, bench_opts *o) {
    char buf[64];
    if (strlen(s) >= sizeof buf) return 0;
    snprintf(buf, sizeof buf, "%s", s);
    o->n_backends = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const kvgen_backend_info *info = NULL;
        list_backends();
        for (int i = 0; i < n_known_backends && !info; i++)
            if (strcmp(tok, known_backends[i].name) == 0) info = &known_backends[i];
        if (!info) return 0;
        kvgen_backend b = info->backend;
        for (int i = 0; i < o->n_backends; i++)
            if (o->backends[i] == b) return 0;
        if (o->n_backends == BENCH_MAX_BACKENDS) return 0;
        o->backends[o->n_backends++] = b;
    }
    return o->n_backends > 0;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Returns 0, 2 after a usage error, or -1 after printing the help (exit 0). */
static int parse_bench_options(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){.reps = 3, .steps = 16, .prompts = {64, 512}, .n_prompts = 2, .depths = {0, 512, 2048},
                      .n_depths = 3, .nc_depth = 32, .nc_steps = 4, .n_forks = 64,
                      .fork_prompt = 512};
    /* every backend this kvgen has; run order is settled in kvgen_cli_bench */
    list_backends();
    for (int i = 0; i < n_known_backends; i++)
        if (known_backends[i].available) o->backends[o->n_backends++] = known_backends[i].backend;
    /* --quick sets defaults that explicit options then override, whatever their order */
    const bench_opts given = *o;
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--quick") == 0) {
            *o = (bench_opts){.reps = 2, .steps = 4, .prompts = {8, 32}, .n_prompts = 2, .depths = {0, 32, 64},
                              .n_depths = 3, .nc_depth = 16, .nc_steps = 3, .quick = 1,
                              .n_forks = 4, .fork_prompt = 32, .n_backends = o->n_backends};
            memcpy(o->backends, given.backends, sizeof o->backends);
        }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int takes_value = strcmp(a, "--backend") == 0 || strcmp(a, "--json") == 0 || strcmp(a, "--reps") == 0 ||
                          strcmp(a, "--steps") == 0 || strcmp(a, "--prompts") == 0 || strcmp(a, "--depths") == 0 ||
                          strcmp(a, "--no-cache-depth") == 0 || strcmp(a, "--device") == 0 ||
                          strcmp(a, "--threads") == 0 || strcmp(a, "-t") == 0 || strcmp(a, "--sessions") == 0 ||
                          strcmp(a, "--session-tokens") == 0 ||
                          strcmp(a, "--fork-sessions") == 0 || strcmp(a, "--fork-prompt") == 0 ||
                          strcmp(a, "--peer") == 0 || strcmp(a, "--activation-bits") == 0 ||
                          strcmp(a, "--peer-batched") == 0 || strcmp(a, "--peer-remote") == 0;
        if (takes_value) {
            if (!val) return bench_usage_error("option %s needs a value", a);
            i++;
        }
        if (strcmp(a, "--quick") == 0 || strcmp(a, "--no-cache") == 0) {
            /* --quick was applied above; --no-cache is the default */
        } else if (strcmp(a, "--backend") == 0) {
            if (!parse_backends(val, o)) {
                char names[128], msg[384];
                backend_names(names, sizeof names, ", ");
                snprintf(msg, sizeof msg, "--backend: expected a comma-separated list of %s, got '%.200s'", names, val);
                return bench_usage_error("%s", msg);
            }
        } else if (strcmp(a, "--json") == 0) {
            o->json = val;
        } else if (strcmp(a, "--reps") == 0) {
            if (!parse_int(val, 1, BENCH_MAX_REPS, &o->reps)) return bench_usage_error("--reps: expected 1..64, got '%s'", val);
        } else if (strcmp(a, "--steps") == 0) {
            if (!parse_int(val, 1, 1 << 16, &o->steps)) return bench_usage_error("--steps: bad step count '%s'", val);
        } else if (strcmp(a, "--prompts") == 0) {
            if (!parse_int_list(val, 1, o->prompts, &o->n_prompts))
                return bench_usage_error("--prompts: expected up to 8 comma-separated sizes >= 1, got '%s'", val);
        } else if (strcmp(a, "--depths") == 0) {
            if (!parse_int_list(val, 0, o->depths, &o->n_depths))
                return bench_usage_error("--depths: expected up to 8 comma-separated depths >= 0, got '%s'", val);
        } else if (strcmp(a, "--no-cache-depth") == 0) {
            if (strcmp(val, "0") == 0) {
                o->nc_depth = 0;
                o->n_nc = 0;
            } else if (!parse_int_list(val, 1, o->nc_depths, &o->n_nc)) {
                return bench_usage_error("--no-cache-depth: expected 0 or up to 8 comma-separated depths >= 1, got '%s'",
                                         val);
            } else {
                o->nc_depth = -1; /* set from the list below */
            }
        } else if (strcmp(a, "--device") == 0) {
            o->device = val;
        } else if (strcmp(a, "--sessions") == 0) {
            if (!parse_int_list(val, 1, o->sessions, &o->n_sessions))
                return bench_usage_error("--sessions: expected up to 8 comma-separated counts >= 1, got '%s'", val);
        } else if (strcmp(a, "--session-tokens") == 0) {
            if (!parse_int(val, 1, 1 << 16, &o->session_tokens))
                return bench_usage_error("--session-tokens: bad token count '%s'", val);
        } else if (strcmp(a, "--forks") == 0) {
            o->forks = 1;
        } else if (strcmp(a, "--fork-sessions") == 0) {
            if (!parse_int(val, 1, 4096, &o->n_forks)) return bench_usage_error("--fork-sessions: bad count '%s'", val);
        } else if (strcmp(a, "--fork-prompt") == 0) {
            if (!parse_int(val, 1, 1 << 16, &o->fork_prompt)) return bench_usage_error("--fork-prompt: bad size '%s'", val);
        } else if (strcmp(a, "--peer") == 0) {
            if (!*val) return bench_usage_error("--peer: expected the path of llama-bench, got '%s'", val);
            o->peer = val;
        } else if (strcmp(a, "--peer-batched") == 0) {
            if (!*val) return bench_usage_error("--peer-batched: expected the path of llama-batched-bench, got '%s'", val);
            o->peer_batched = val;
        } else if (strcmp(a, "--peer-remote") == 0) {
            if (!*val) return bench_usage_error("--peer-remote: expected the path of a client program, got '%s'", val);
            o->peer_remote = val;
        } else if (strcmp(a, "--threads") == 0 || strcmp(a, "-t") == 0) {
            if (!parse_int(val, 1, 1024, &o->threads)) return bench_usage_error("--threads: bad thread count '%s'", val);
        } else if (strcmp(a, "--activation-bits") == 0) {
            if (!parse_int(val, 8, 16, &o->activation_bits) || (o->activation_bits != 8 && o->activation_bits != 16))
                return bench_usage_error("--activation-bits: expected 8 or 16, got '%s'", val);
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            bench_usage(stdout);
            return -1;
        } else if (a[0] == '-' && a[1] != 0) {
            return bench_usage_error("unknown option %s", a);
        } else if (!o->model) {
            o->model = a;
        } else {
            return bench_usage_error("unexpected argument '%s'", a);
        }
    }
    if (!o->model) return bench_usage_error("%s", "MODEL is required");
    qsort(o->prompts, (size_t)o->n_prompts, sizeof(int), cmp_int);
    qsort(o->depths, (size_t)o->n_depths, sizeof(int), cmp_int);
    for (int i = 1; i < o->n_prompts; i++)
        if (o->prompts[i] == o->prompts[i - 1]) return bench_usage_error("--prompts: %s", "sizes repeat");
    for (int i = 1; i < o->n_depths; i++)
        if (o->depths[i] == o->depths[i - 1]) return bench_usage_error("--depths: %s", "depths repeat");
    if (o->nc_depth > 0 && o->n_nc == 0) o->nc_depths[o->n_nc++] = o->nc_depth; /* the default's one depth */
    qsort(o->nc_depths, (size_t)o->n_nc, sizeof(int), cmp_int);
    for (int i = 1; i < o->n_nc; i++)
        if (o->nc_depths[i] == o->nc_depths[i - 1]) return bench_usage_error("--no-cache-depth: %s", "depths repeat");
    if (o->n_nc) o->nc_depth = o->nc_depths[0];
    if (o->n_nc && o->nc_depths[o->n_nc - 1] > (1 << 16))
        return bench_usage_error("--no-cache-depth: %s", "a depth is over 65536");
    if (o->n_sessions) { /* the ratio's base, one session, is always measured */
        int has_one = 0;
        for (int i = 0; i < o->n_sessions; i++) has_one |= o->sessions[i] == 1;
        if (!has_one && o->n_sessions == BENCH_MAX_SIZES) return bench_usage_error("--sessions: %s", "too many counts");
        if (!has_one) o->sessions[o->n_sessions++] = 1;
        qsort(o->sessions, (size_t)o->n_sessions, sizeof(int), cmp_int);
        for (int i = 1; i < o->n_sessions; i++)
            if (o->sessions[i] == o->sessions[i - 1]) return bench_usage_error("--sessions: %s", "counts repeat");
    }
    if (!o->session_tokens) o->session_tokens = o->steps;
    return 0;
}

/* ---- peer: llama.cpp's llama-bench on the same file ---- */

/* The number after "key": inside [obj, end), or -1. llama-bench's JSON objects are flat apart
 * from arrays of numbers, so a key search bounded by the object is enough. */
static double peer_field(const char *obj, const char *end, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    size_t pl = strlen(pat);
    for (const char *p = obj; p + pl < end; p++) {
        if (memcmp(p, pat, pl) != 0) continue;
        p += pl;
        while (p < end && (*p == ' ' || *p == ':' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
        char *stop;
        double v = strtod(p, &stop);
        return stop > p && stop <= end ? v : -1;
    }
    return -1;
}

/* Reads llama-bench's `-o json` output: one object per test, with n_prompt, n_gen, n_depth
 * and avg_ts (prompts at depth 0, decodes at each depth). Returns the number of tests understood. */
static int peer_parse(const char *text, const bench_opts *o, bench_peer *pr) {
    int found = 0;
    const char *p = text;
    while ((p = strchr(p, '{')) != NULL) {
        const char *end = strchr(p, '}');
        if (!end) break;
        double n_prompt = peer_field(p, end, "n_prompt"), n_gen = peer_field(p, end, "n_gen");
        double n_depth = peer_field(p, end, "n_depth"), ts = peer_field(p, end, "avg_ts");
        if (n_depth < 0) n_depth = 0; /* older llama-bench: no depths */
        if (ts > 0 && n_gen == 0 && n_prompt > 0 && n_depth == 0) {
            for (int i = 0; i < o->n_prompts; i++)
                if ((double)o->prompts[i] == n_prompt) pr->prompt[i] = ts, found++;
        } else if (ts > 0 && n_prompt == 0 && n_gen > 0) {
            for (int i = 0; i < o->n_depths; i++)
                if ((double)o->depths[i] == n_depth) pr->decode[i] = ts, found++;
        }
        p = end + 1;
    }
    return found;
}

/* Runs `PATH -m MODEL -p PROMPTS -n STEPS -r REPS -t THREADS -o json` (no shell), reads its
 * standard output; its standard error goes to a temporary file, quoted when it fails. */
static long online_cpus(void) {
#if defined(_WIN32)
    return (long)GetActiveProcessorCount(ALL_PROCESSOR_GROUPS);
#else
    return sysconf(_SC_NPROCESSORS_ONLN);
#endif
}

/* Runs the peer with argv (no shell) and reads its JSON into pr; returns 0, or -1 with
 * pr->error set. */
typedef int (*peer_parse_fn)(const char *text, const bench_opts *o, bench_peer *pr);

static int run_peer_once(const bench_opts *o, const char *prog, char *const argv[], peer_parse_fn parse,
                         bench_peer *pr, char *error, size_t error_size, double *seconds) {
#if defined(_WIN32)
    (void)o;
    (void)argv;
    (void)parse;
    (void)pr;
    (void)seconds;
    /* the peer runs with fork and exec; Windows has neither */
    snprintf(error, error_size, "%s: running a peer program needs fork(), which Windows lacks", prog);
    return -1;
#else
    int out[2];
    FILE *errf = tmpfile();
    if (pipe(out) != 0) {
        snprintf(error, error_size, "pipe: %s", strerror(errno));
        if (errf) fclose(errf);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    double t0 = now_s();
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out[1], 1);
        if (errf) dup2(fileno(errf), 2);
        close(out[0]);
        close(out[1]);
        execv(prog, argv);
        fprintf(stderr, "cannot run %s: %s\n", prog, strerror(errno));
        _exit(127);
    }
    close(out[1]);
    if (pid < 0) {
        snprintf(error, error_size, "fork: %s", strerror(errno));
        close(out[0]);
        if (errf) fclose(errf);
        return -1;
    }
    size_t len = 0, cap = 1 << 16;
    char *text = malloc(cap + 1);
    ssize_t got;
    while (text && (got = read(out[0], text + len, cap - len)) > 0) {
        len += (size_t)got;
        if (len == cap) {
            char *t = cap < (64u << 20) ? realloc(text, 2 * cap + 1) : NULL;
            if (!t) break;
            text = t;
            cap *= 2;
        }
    }
    close(out[0]);
    int status = 0, rc = -1;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    *seconds += now_s() - t0;
    if (text) text[len] = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char last[256] = "";
        if (errf) { /* the last line it wrote to stderr says why */
            rewind(errf);
            char line[256];
            while (fgets(line, sizeof line, errf))
                if (line[0] != '\n') snprintf(last, sizeof last, "%s", line);
            size_t l = strlen(last);
            if (l && last[l - 1] == '\n') last[l - 1] = 0;
        }
        if (WIFEXITED(status))
            snprintf(error, error_size, "%s exited with status %d%s%s", prog, WEXITSTATUS(status),
                     last[0] ? ": " : "", last);
        else
            snprintf(error, error_size, "%s was killed by signal %d", prog, WTERMSIG(status));
    } else if (!text || parse(text, o, pr) == 0) {
        snprintf(error, error_size, "%s: no test results in its output", prog);
    } else {
        rc = 0;
    }
    free(text);
    if (errf) fclose(errf);
    return rc;
#endif
}

/* `PATH -m MODEL -p PROMPTS -n STEPS -r REPS -t THREADS -o json` (prompts, and decode from an
 * empty cache), then, for the depths above 0, `... -p 0 -n STEPS -d DEPTHS` (decode after a
 * cache of that many tokens, as kvgen's decode at depth). */
static void run_peer(const bench_opts *o, bench_peer *pr) {
    memset(pr, 0, sizeof *pr);
    char prompts[160] = "", depths[160] = "", steps[16], reps[16], threads[24];
    for (int i = 0; i < o->n_prompts; i++) {
        size_t l = strlen(prompts);
        snprintf(prompts + l, sizeof prompts - l, "%s%d", i ? "," : "", o->prompts[i]);
    }
    for (int i = 0; i < o->n_depths; i++) {
        size_t l = strlen(depths);
        if (o->depths[i] > 0) snprintf(depths + l, sizeof depths - l, "%s%d", l ? "," : "", o->depths[i]);
    }
    long nt = o->threads ? o->threads : online_cpus();
    snprintf(steps, sizeof steps, "%d", o->steps);
    snprintf(reps, sizeof reps, "%d", o->reps);
    snprintf(threads, sizeof threads, "%ld", nt > 0 ? nt : 1);
    char *argv[] = {(char *)o->peer, "-m", (char *)o->model, "-p", prompts, "-n", steps, "-r", reps,
                    "-t", threads, "-o", "json", NULL};
    if (run_peer_once(o, o->peer, argv, peer_parse, pr, pr->error, sizeof pr->error, &pr->seconds) != 0) return;
    if (depths[0]) {
        char *dargv[] = {(char *)o->peer, "-m", (char *)o->model, "-p", "0", "-n", steps, "-d", depths, "-r", reps,
                         "-t", threads, "-o", "json", NULL};
        if (run_peer_once(o, o->peer, dargv, peer_parse, pr, pr->error, sizeof pr->error, &pr->seconds) != 0) return;
    }
    pr->ran = 1;
}

/* Reads llama-batched-bench's `--output-format jsonl`: a line per parallel-sequence count with
 * "pl" and "speed_tg" (decode tokens/s over all sequences). Returns the lines understood. */
static int batched_parse(const char *text, const bench_opts *o, bench_peer *pr) {
    int found = 0;
    const char *p = text;
    while ((p = strchr(p, '{')) != NULL) {
        const char *end = strchr(p, '}');
        if (!end) break;
        double pl = peer_field(p, end, "pl"), tg = peer_field(p, end, "speed_tg");
        for (int i = 0; i < o->n_sessions; i++)
            if (tg > 0 && (double)o->sessions[i] == pl) pr->sessions[i] = tg, found++;
        p = end + 1;
    }
    return found;
}

/* `PATH -m MODEL -c CTX -b 2048 -ub 512 -npp 1 -ntg TOKENS -npl SESSIONS -t THREADS --output-format
 * jsonl`: that many sequences, each a 1-token prompt then TOKENS decoded together, as --sessions */
static void run_peer_batched(const bench_opts *o, bench_peer *pr) {
    char npl[160] = "", ntg[16], ctx[24], threads[24];
    int most = 1;
    for (int i = 0; i < o->n_sessions; i++) {
        size_t l = strlen(npl);
        snprintf(npl + l, sizeof npl - l, "%s%d", i ? "," : "", o->sessions[i]);
        if (o->sessions[i] > most) most = o->sessions[i];
    }
    long nt = o->threads ? o->threads : online_cpus();
    snprintf(ntg, sizeof ntg, "%d", o->session_tokens);
    snprintf(ctx, sizeof ctx, "%d", most * (o->session_tokens + 1) + 16);
    snprintf(threads, sizeof threads, "%ld", nt > 0 ? nt : 1);
    char *argv[] = {(char *)o->peer_batched, "-m", (char *)o->model, "-c", ctx, "-b", "2048", "-ub", "512", "-npp", "1",
                    "-ntg", ntg, "-npl", npl, "-t", threads, "--output-format", "jsonl", NULL};
    if (run_peer_once(o, o->peer_batched, argv, batched_parse, pr, pr->batched_error, sizeof pr->batched_error,
                      &pr->batched_seconds) == 0)
        pr->batched_ran = 1;
}

/* ---- statistics ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void stats_finish(bench_stats *s) {
    if (s->n == 0) return;
    double sorted[BENCH_MAX_REPS], sum = 0;
    memcpy(sorted, s->samples, (size_t)s->n * sizeof(double));
    qsort(sorted, (size_t)s->n, sizeof(double), cmp_double);
    for (int i = 0; i < s->n; i++) sum += sorted[i];
    s->min = sorted[0];
    s->max = sorted[s->n - 1];
    s->median = s->n % 2 ? sorted[s->n / 2] : 0.5 * (sorted[s->n / 2 - 1] + sorted[s->n / 2]);
    s->mean = sum / s->n;
    double var = 0;
    for (int i = 0; i < s->n; i++) var += (sorted[i] - s->mean) * (sorted[i] - s->mean);
    s->stddev = s->n > 1 ? sqrt(var / (s->n - 1)) : 0;
}

static void stats_add(bench_stats *s, double tokens, double seconds) {
    if (s->n < BENCH_MAX_REPS) s->samples[s->n++] = tokens / (seconds > 1e-9 ? seconds : 1e-9);
}

/* ---- measurements ---- */

/* The benchmark's input: (BOS when the model adds one) + the paragraph's tokens repeated to `n`. */
static int32_t *make_tokens(kvgen_model *m, size_t n, kvgen_error *err) {
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    size_t len = strlen(bench_text), cap = len + 16, n_first = 0, n_para = 0;
    int32_t *first = malloc(cap * sizeof *first), *para = malloc(cap * sizeof *para);
    int32_t *seq = malloc((n > 0 ? n : 1) * sizeof *seq);
    int32_t *result = NULL;
    if (!first || !para || !seq) {
        snprintf(err->message, sizeof err->message, "out of memory for %zu benchmark tokens", n);
        goto done;
    }
    if (kvgen_tokenize(m, bench_text, len, KVGEN_TOKENIZE_ADD_BOS, first, cap, &n_first, err) != KVGEN_OK ||
        kvgen_tokenize(m, bench_text, len, 0, para, cap, &n_para, err) != KVGEN_OK)
        goto done;
    size_t i = 0;
    for (; i < n && i < n_first; i++) seq[i] = first[i];
    for (size_t k = 0; i < n; i++, k++)
        /* a vocabulary that cannot spell the paragraph still gets valid, varied ids */
        seq[i] = n_para > 0 ? para[k % n_para] : (int32_t)((k * 7919u + 13u) % (size_t)info.n_vocab);
    result = seq;
    seq = NULL;
done:
    free(first);
    free(para);
    free(seq);
    return result;
}

/* Brings the session to exactly the first `depth` tokens of seq: rewinds (one token's work) or
 * prefills the missing ones. */
static kvgen_status fill_to(kvgen_session *s, const int32_t *seq, int depth, kvgen_error *err) {
    size_t len = kvgen_session_length(s), d = (size_t)depth;
    if (len > d) {
        if (d == 0) {
            kvgen_session_reset(s);
            return KVGEN_OK;
        }
        return kvgen_session_rewind(s, len - d, err);
    }
    if (len < d) return kvgen_session_prefill(s, seq + len, d - len, NULL, err);
    return KVGEN_OK;
}

/* `reps` timings of `steps` decode steps starting at `depth`, rewinding between them */
static kvgen_status time_decode(kvgen_session *s, const int32_t *seq, int depth, int steps, int reps,
                                bench_stats *out, kvgen_error *err) {
    kvgen_status st = fill_to(s, seq, depth, err);
    for (int r = 0; r < reps && st == KVGEN_OK; r++) {
        double t0 = now_s();
        for (int k = 0; k < steps && st == KVGEN_OK; k++) st = kvgen_session_decode(s, seq[depth + k], err);
        double t = now_s() - t0;
        if (st != KVGEN_OK) break;
        stats_add(out, steps, t);
        if (r + 1 < reps) st = kvgen_session_rewind(s, (size_t)steps, err);
    }
    stats_finish(out);
    return st;
}

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
    long nt = o->threads ? o->threads : online_cpus();
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
        double t0 = now_s();
        for (long i = 0; i < nt; i++) {
            sl[i] = (host_slice){.p = buf + (size_t)i * per, .n = per};
            if (i > 0 && pthread_create(&th[i], NULL, host_read, &sl[i]) != 0) sl[i].n = 0;
        }
        host_read(&sl[0]);
        for (long i = 1; i < nt; i++)
            if (sl[i].n) pthread_join(th[i], NULL);
        double t = now_s() - t0;
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

static int job_is_final(kvgen_job_state st) {
    return st == KVGEN_JOB_DONE || st == KVGEN_JOB_CANCELLED || st == KVGEN_JOB_FAILED;
}

/* Aggregate decode throughput with n_sessions generating at once through the jobs worker: each
 * gets a fresh session, the same one-token prompt (BOS, or token 1) and n_tokens greedy tokens
 * with end-of-generation ignored. *tokens_per_s = all generated tokens / (last job's end -
 * first job's first token), so prefill is mostly outside the window. */
static kvgen_status jobs_tok_s(kvgen_model *m, int n_sessions, int n_tokens, double *tokens_per_s, kvgen_error *err) {
    *tokens_per_s = 0;
    kvgen_session **ss = calloc((size_t)n_sessions, sizeof *ss);
    kvgen_job **jobs = calloc((size_t)n_sessions, sizeof *jobs);
    kvgen_status st = ss && jobs ? KVGEN_OK : bench_fail(err, KVGEN_E_NO_MEMORY, "out of memory for %d sessions", n_sessions);
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    int32_t prompt = info.bos >= 0 ? info.bos : 1;
    kvgen_session_desc sd = {.n_ctx = n_tokens + 16, .no_prefix_reuse = 1};
    for (int i = 0; st == KVGEN_OK && i < n_sessions; i++) st = kvgen_session_create(m, &sd, &ss[i], err);
    for (int i = 0; st == KVGEN_OK && i < n_sessions; i++) {
        kvgen_job_desc d = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = &prompt, .n_tokens = 1,
                            .gen = {.max_tokens = n_tokens, .ignore_eog = 1}, .owner = jobs};
        st = kvgen_job_submit(ss[i], &d, &jobs[i], err);
    }
    double first = -1, last = -1, total = 0;
    for (int i = 0; st == KVGEN_OK && i < n_sessions; i++) {
        kvgen_job_info ji;
        for (;;) {
            kvgen_job_get_info(jobs[i], &ji);
            if (job_is_final(ji.state)) break;
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        if (ji.state != KVGEN_JOB_DONE) {
            *err = ji.error;
            st = ji.error.status != KVGEN_OK ? ji.error.status : KVGEN_E_INTERNAL;
            if (!err->message[0]) bench_fail(err, st, "a benchmark job ended %s", kvgen_job_state_name(ji.state));
            break;
        }
        if (first < 0 || ji.first_token_ms < first) first = ji.first_token_ms;
        if (ji.total_ms > last) last = ji.total_ms;
        total += ji.n_tokens;
    }
    if (st == KVGEN_OK && last > first) *tokens_per_s = total / ((last - first) / 1e3);
    for (int i = 0; jobs && i < n_sessions; i++) kvgen_job_release(jobs[i]);
    for (int i = 0; ss && i < n_sessions; i++) kvgen_session_close(ss[i]);
    free(jobs);
    free(ss);
    return st;
}

/* --sessions: jobs_tok_s for each count, reps times */
static kvgen_status bench_sessions(const bench_opts *o, bench_result *r, kvgen_model *m, kvgen_error *err) {
    kvgen_status st = KVGEN_OK;
    for (int i = 0; i < o->n_sessions && st == KVGEN_OK; i++) {
        fprintf(stderr, "kvgen bench: %s: %d sessions at once, %d tokens each x %d\n", r->name, o->sessions[i],
                o->session_tokens, o->reps);
        for (int rep = 0; rep < o->reps && st == KVGEN_OK; rep++) {
            double tok_s = 0;
            st = jobs_tok_s(m, o->sessions[i], o->session_tokens, &tok_s, err);
            if (st == KVGEN_OK && r->sessions[i].n < BENCH_MAX_REPS) r->sessions[i].samples[r->sessions[i].n++] = tok_s;
        }
        stats_finish(&r->sessions[i]);
    }
    return st;
}

/* --forks: n_forks forks of a session prefilled with fork_prompt tokens vs that prefill x n_forks */
static kvgen_status bench_forks(const bench_opts *o, bench_result *r, kvgen_model *m, const int32_t *seq,
                                kvgen_error *err) {
    fprintf(stderr, "kvgen bench: %s: %d forks of a %d-token prompt vs prefilling it\n", r->name, o->n_forks,
            o->fork_prompt);
    int N = o->n_forks;
    kvgen_session **ss = calloc((size_t)N, sizeof *ss);
    kvgen_session *parent = NULL;
    kvgen_session_desc sd = {.n_ctx = o->fork_prompt + 64, .no_prefix_reuse = 1};
    kvgen_status st = ss ? KVGEN_OK : bench_fail(err, KVGEN_E_NO_MEMORY, "out of memory");
    if (st == KVGEN_OK) st = kvgen_session_create(m, &sd, &parent, err);
    double t0 = now_s();
    if (st == KVGEN_OK) st = kvgen_session_prefill(parent, seq, (size_t)o->fork_prompt, NULL, err);
    r->scratch_one_s = now_s() - t0;
    t0 = now_s();
    for (int i = 0; i < N && st == KVGEN_OK; i++) st = kvgen_session_fork(parent, &ss[i], err);
    r->fork_s = now_s() - t0;
    kvgen_pool_info pi;
    kvgen_model_pool_info(m, &pi);
    r->fork_pages = pi.pages_used;
    for (int i = 0; ss && i < N; i++) kvgen_session_close(ss[i]);
    kvgen_session_close(parent);
    free(ss);
    return st;
}

/* Runs every measurement on one backend. Fills r->error and returns 1 on failure. */
static int run_backend(const bench_opts *o, bench_result *r, bench_model *bm, bench_fill *fill, int last) {
    double t_start = now_s();
    kvgen_error err = {0};
    kvgen_model *m = NULL;
    kvgen_session *s = NULL, *nc = NULL;
    int32_t *seq = NULL;
    kvgen_status st;
    const kvgen_backend_info *bi = backend_info(r->backend);
    r->name = bi ? bi->name : "?";
    r->uses_device = bi && bi->uses_device;
    fprintf(stderr, "kvgen bench: %s: loading %s\n", r->name, o->model);
    kvgen_model_desc md = {.path = o->model, .backend = r->backend, .device = o->device, .n_threads = o->threads,
                           .activation_bits = o->activation_bits, .progress = kvgen_cli_progress()};
    st = kvgen_model_load(&md, &m, &err);
    kvgen_cli_progress_end();
    if (st != KVGEN_OK) goto done;
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    snprintf(r->device, sizeof r->device, "%s", info.device ? info.device : "?");
    snprintf(bm->name, sizeof bm->name, "%s", info.name ? info.name : "?");
    bm->weight_bytes = info.weight_bytes;
    bm->n_params = info.n_params;
    bm->n_layer = info.n_layer;
    bm->n_embd = info.n_embd;
    bm->n_vocab = info.n_vocab;

    int need = o->prompts[o->n_prompts - 1];
    if (o->depths[o->n_depths - 1] + o->steps > need) need = o->depths[o->n_depths - 1] + o->steps;
    if (o->n_nc && o->nc_depths[o->n_nc - 1] + o->nc_steps > need) need = o->nc_depths[o->n_nc - 1] + o->nc_steps;
    if (o->forks && o->fork_prompt > need) need = o->fork_prompt;
    need += 1;
    seq = make_tokens(m, (size_t)need, &err);
    if (!seq) {
        st = KVGEN_E_NO_MEMORY;
        goto done;
    }
    kvgen_session_desc sd = {.n_ctx = need, .no_prefix_reuse = 1};
    st = kvgen_session_create(m, &sd, &s, &err);
    if (st != KVGEN_OK) goto done;

    fprintf(stderr, "kvgen bench: %s: probe\n", r->name);
    if (r->uses_device) run_probe(o, r);
    else run_host_probe(o, r);

    /* warm-up: first-use costs (a decode command buffer recorded on first use, page commits) */
    int warm = need > 9 ? 8 : need - 1;
    st = kvgen_session_prefill(s, seq, (size_t)warm, NULL, &err);
    for (int k = 0; k < 2 && st == KVGEN_OK && warm + k < need; k++) st = kvgen_session_decode(s, seq[warm + k], &err);
    if (st != KVGEN_OK) goto done;

    for (int i = 0; i < o->n_prompts; i++) {
        fprintf(stderr, "kvgen bench: %s: prompt %d x %d\n", r->name, o->prompts[i], o->reps);
        for (int rep = 0; rep < o->reps; rep++) {
            kvgen_session_reset(s);
            double t0 = now_s();
            st = kvgen_session_prefill(s, seq, (size_t)o->prompts[i], NULL, &err);
            double t = now_s() - t0;
            if (st != KVGEN_OK) goto done;
            stats_add(&r->prompt[i], o->prompts[i], t);
        }
        stats_finish(&r->prompt[i]);
    }
    for (int i = o->n_depths - 1; i >= 0; i--) {
        int d = o->depths[i];
        if (i == o->n_depths - 1 && d > (int)kvgen_session_length(s) && fill->depth == d) {
            kvgen_session *restored = NULL;
            kvgen_error rerr = {0};
            if (kvgen_session_restore(m, fill->path, &restored, &rerr) == KVGEN_OK) {
                kvgen_session_close(s);
                s = restored;
                r->filled_by_restore = 1;
            } else {
                fprintf(stderr, "kvgen bench: %s: restoring the filled cache failed (%s): prefilling instead\n",
                        r->name, rerr.message);
            }
        } else if (i == o->n_depths - 1 && d > o->prompts[o->n_prompts - 1] && !last && !fill->depth) {
            st = fill_to(s, seq, d, &err);
            if (st != KVGEN_OK) goto done;
            const char *dir = getenv("TMPDIR");
            snprintf(fill->path, sizeof fill->path, "%s/kvgen-bench-XXXXXX", dir && *dir ? dir : "/tmp");
            int fd = mkstemp(fill->path);
            kvgen_error serr = {0};
            if (fd >= 0) {
                close(fd);
                if (kvgen_session_save(s, fill->path, &serr) == KVGEN_OK) fill->depth = d;
                else remove(fill->path);
            }
            if (!fill->depth) fill->path[0] = 0;
        }
        fprintf(stderr, "kvgen bench: %s: decode at depth %d, %d steps x %d%s\n", r->name, d, o->steps, o->reps,
                r->filled_by_restore && i == o->n_depths - 1 ? " (cache restored from the saved session)" : "");
        st = time_decode(s, seq, o->depths[i], o->steps, o->reps, &r->decode[i], &err);
        if (st != KVGEN_OK) goto done;
    }
    for (int i = 0; i < o->n_nc; i++) {
        int d = o->nc_depths[i];
        fprintf(stderr, "kvgen bench: %s: decode at depth %d with and without the cache, %d steps x %d\n", r->name, d,
                o->nc_steps, o->reps);
        st = time_decode(s, seq, d, o->nc_steps, o->reps, &r->nc_curve_cached[i], &err);
        if (st != KVGEN_OK) goto done;
        if (!nc) {
            kvgen_session_desc nd = {.n_ctx = need, .no_cache = 1, .no_prefix_reuse = 1};
            st = kvgen_session_create(m, &nd, &nc, &err);
        }
        if (st == KVGEN_OK) st = time_decode(nc, seq, d, o->nc_steps, o->reps, &r->nc_curve[i], &err);
        if (st != KVGEN_OK) goto done;
    }
    if (o->n_nc) {
        r->nc = r->nc_curve[0];
        r->nc_cached = r->nc_curve_cached[0];
    }
    if (o->n_sessions) {
        st = bench_sessions(o, r, m, &err);
        if (st != KVGEN_OK) goto done;
    }
    if (o->forks) {
        st = bench_forks(o, r, m, seq, &err);
        if (st != KVGEN_OK) goto done;
    }
    if (r->uses_device) run_probe(o, r);
    else run_host_probe(o, r);
    r->ok = 1;
done:
    if (st != KVGEN_OK) {
        snprintf(r->error, sizeof r->error, "%s", err.message[0] ? err.message : kvgen_status_name(st));
        fprintf(stderr, "kvgen bench: %s: %s\n", r->name, r->error);
    }
    free(seq);
    kvgen_session_close(nc);
    kvgen_session_close(s);
    kvgen_model_unload(m);
    r->seconds = now_s() - t_start;
    return r->ok ? 0 : 1;
}

/* ---- report ---- */

static const bench_result *find(const bench_result *res, int n, kvgen_backend b) {
    for (int i = 0; i < n; i++)
        if (res[i].backend == b && res[i].ok) return &res[i];
    return NULL;
}

/* b gets a "<name>/reference" ratio column: it and the reference both ran */
static int ratio_column(const bench_result *res, int n, const bench_result *b) {
    return b->ok && b->backend != KVGEN_BACKEND_REFERENCE && find(res, n, KVGEN_BACKEND_REFERENCE) != NULL;
}

static double ceiling_tok_s(const bench_result *r, const bench_model *bm) {
    return r->have_probe && bm->weight_bytes > 0 ? r->probe_gbps * 1e9 / (double)bm->weight_bytes : 0;
}

/* three significant figures or so: 0.752, 12.3, 4210 */
static void fmt_rate(char *buf, size_t size, double v) {
    snprintf(buf, size, v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : "%.2f", v);
}

static void print_cell(const bench_stats *s) {
    char buf[96], a[24], b[24], c[24];
    if (s->n == 0) {
        snprintf(buf, sizeof buf, "-");
    } else {
        fmt_rate(a, sizeof a, s->median);
        fmt_rate(b, sizeof b, s->min);
        fmt_rate(c, sizeof c, s->max);
        snprintf(buf, sizeof buf, "%s [%s-%s]", a, b, c);
    }
    printf("  %-24s", buf);
}

static void print_row(const char *label, const bench_result *res, int n, const bench_stats *(*pick)(const bench_result *,
                      const void *), const void *arg) {
    printf("%-28s", label);
    for (int i = 0; i < n; i++) print_cell(pick(&res[i], arg));
    /* each other backend over the reference (see ratio_column) */
    const bench_result *ref = find(res, n, KVGEN_BACKEND_REFERENCE);
    for (int i = 0; i < n; i++) {
        const bench_result *b = &res[i];
        if (!ratio_column(res, n, b)) continue;
        if (pick(ref, arg)->n && pick(b, arg)->n && pick(ref, arg)->median > 0)
            printf("  %.2fx", pick(b, arg)->median / pick(ref, arg)->median);
        else
            printf("  -");
    }
    printf("\n");
}

static const bench_stats *pick_prompt(const bench_result *r, const void *arg) { return &r->prompt[*(const int *)arg]; }
static const bench_stats *pick_decode(const bench_result *r, const void *arg) { return &r->decode[*(const int *)arg]; }
static const bench_stats *pick_nc(const bench_result *r, const void *arg) {
    (void)arg;
    return &r->nc;
}
static const bench_stats *pick_nc_cached(const bench_result *r, const void *arg) {
    (void)arg;
    return &r->nc_cached;
}
static const bench_stats *pick_nc_curve(const bench_result *r, const void *arg) {
    return &r->nc_curve[*(const int *)arg];
}
static const bench_stats *pick_nc_curve_cached(const bench_result *r, const void *arg) {
    return &r->nc_curve_cached[*(const int *)arg];
}

static const bench_stats *pick_sessions(const bench_result *r, const void *arg) {
    return &r->sessions[*(const int *)arg];
}
/* one session's aggregate tokens/s (the --sessions ratio's base; the list always holds 1) */
static double session_base(const bench_opts *o, const bench_result *r) {
    for (int k = 0; k < o->n_sessions; k++)
        if (o->sessions[k] == 1) return r->sessions[k].median;
    return 0;
}

/* the peer tables: a header naming the peer's column and each backend's ratio column */
static void peer_header(const char *column, const bench_result *res, int n) {
    printf("%-28s  %-12s", "test", column);
    for (int i = 0; i < n; i++)
        if (res[i].ok) printf("  %s/peer", res[i].name);
    printf("\n");
}

/* a row: the label (a format with one number), the peer's tokens/s, and each backend's median
 * (its stats at index k of the array at offset `field` of bench_result) over it */
static void peer_row(const char *fmt, int value, double peer, const bench_result *res, int n, size_t field, int k) {
    char label[64];
    snprintf(label, sizeof label, fmt, value);
    printf("%-28s  %-12.1f", label, peer);
    for (int i = 0; i < n; i++) {
        if (!res[i].ok) continue;
        const bench_stats *st = (const bench_stats *)((const char *)&res[i] + field) + k;
        printf("  %*.2fx", (int)strlen(res[i].name) + 4, peer > 0 ? st->median / peer : 0.0);
    }
    printf("\n");
}

static void print_peer_batched(const bench_opts *o, const bench_result *res, int n, const bench_peer *peer) {
    if (!o->peer_batched || o->n_sessions == 0) return;
    if (!peer->batched_ran) {
        printf("\npeer llama-batched-bench: not measured: %s\n", peer->batched_error);
        return;
    }
    printf("\npeer llama-batched-bench (%s), same file, this run (%.1f s): aggregate decode tokens/s\n",
           o->peer_batched, peer->batched_seconds);
    peer_header("batched", res, n);
    for (int k = 0; k < o->n_sessions; k++)
        peer_row("%d sessions at once", o->sessions[k], peer->sessions[k], res, n, offsetof(bench_result, sessions), k);
}

static void print_report(const bench_opts *o, const bench_result *res, int n, const bench_model *bm,
                         const bench_peer *peer, double load0, double load1) {
    printf("\nkvgen bench: %s (%s): %d layers, n_embd %d, %.1fM parameters, %.1f MB of weights\n", bm->name, o->model,
           bm->n_layer, bm->n_embd, (double)bm->n_params / 1e6, (double)bm->weight_bytes / 1e6);
    printf("tokens/s, median [min-max] of %d repetitions; decode: %d steps per repetition; load average %.2f -> %.2f\n\n",
           o->reps, o->steps, load0, load1);
    printf("%-28s", "test");
    for (int i = 0; i < n; i++) {
        char head[64];
        snprintf(head, sizeof head, "%s%s", res[i].name, res[i].ok ? "" : " (failed)");
        printf("  %-24s", head);
    }
    for (int i = 0; i < n; i++)
        if (ratio_column(res, n, &res[i])) printf("  %s/reference", res[i].name);
    printf("\n");
    char label[64];
    for (int i = 0; i < o->n_prompts; i++) {
        snprintf(label, sizeof label, "prompt %d tokens", o->prompts[i]);
        print_row(label, res, n, pick_prompt, &i);
    }
    for (int i = 0; i < o->n_depths; i++) {
        snprintf(label, sizeof label, "decode at depth %d", o->depths[i]);
        print_row(label, res, n, pick_decode, &i);
    }
    if (o->nc_depth > 0) {
        snprintf(label, sizeof label, "decode at %d, cached (%d st)", o->nc_depth, o->nc_steps);
        print_row(label, res, n, pick_nc_cached, NULL);
        snprintf(label, sizeof label, "decode at %d, no cache", o->nc_depth);
        print_row(label, res, n, pick_nc, NULL);
        printf("%-28s", "  cached / no-cache");
        for (int i = 0; i < n; i++) {
            char buf[32] = "-";
            if (res[i].ok && res[i].nc.median > 0) snprintf(buf, sizeof buf, "%.1fx", res[i].nc_cached.median / res[i].nc.median);
            printf("  %-24s", buf);
        }
        printf("\n");
    }
    for (int k = 1; k < o->n_nc; k++) { /* the further no-cache depths */
        snprintf(label, sizeof label, "decode at %d, cached (%d st)", o->nc_depths[k], o->nc_steps);
        print_row(label, res, n, pick_nc_curve_cached, &k);
        snprintf(label, sizeof label, "decode at %d, no cache", o->nc_depths[k]);
        print_row(label, res, n, pick_nc_curve, &k);
    }
    for (int k = 0; k < o->n_sessions; k++) {
        snprintf(label, sizeof label, "%d sessions at once", o->sessions[k]);
        print_row(label, res, n, pick_sessions, &k);
        if (o->sessions[k] == 1) continue;
        printf("%-28s", "  ratio to 1 session");
        for (int i = 0; i < n; i++) {
            char buf[32] = "-";
            double one = session_base(o, &res[i]);
            if (res[i].ok && one > 0) snprintf(buf, sizeof buf, "%.2fx", res[i].sessions[k].median / one);
            printf("  %-24s", buf);
        }
        printf("\n");
    }
    printf("\n");
    if (o->forks)
        for (int i = 0; i < n; i++) {
            const bench_result *r = &res[i];
            if (!r->ok) continue;
            printf("%s: %d sessions holding a %d-token prompt: forks %.4f s (%.3f ms each, %zu pages in use), from "
                   "scratch %.2f s (ESTIMATED: one prefill %.3f s x %d); scratch / forks %.0fx\n",
                   r->name, o->n_forks, o->fork_prompt, r->fork_s, r->fork_s * 1e3 / o->n_forks, r->fork_pages,
                   r->scratch_one_s * o->n_forks, r->scratch_one_s, o->n_forks,
                   r->fork_s > 0 ? r->scratch_one_s * o->n_forks / r->fork_s : 0.0);
        }
    for (int i = 0; i < n; i++)
        printf("%s: %s%s (%.1f s)%s\n", res[i].name, res[i].ok ? "device " : "error: ",
               res[i].ok ? res[i].device : res[i].error, res[i].seconds,
               res[i].filled_by_restore ? "; deepest cache restored from the reference backend's saved session" : "");

    for (int i = 0; i < n; i++) {
        const bench_result *r = &res[i];
        if (!r->have_probe) {
            printf("probe: %s\n", r->probe_note[0] ? r->probe_note : "not run");
            continue;
        }
        double ceil = ceiling_tok_s(r, bm);
        printf("probe on %s: streaming read %.2f GB/s (%.0f MiB; runs before / after the model: %.2f / %.2f)",
               r->probe_device, r->probe_gbps, (double)r->probe_bytes / (1 << 20), r->probe_gbps_runs[0],
               r->n_probe_runs > 1 ? r->probe_gbps_runs[1] : 0.0);
        if (r->uses_device) printf(", empty dispatch %.1f us", r->probe_us);
        printf("\n");
        printf("decode ceiling = %.1f MB of weights / %.2f GB/s = %.1f tokens/s", (double)bm->weight_bytes / 1e6,
               r->probe_gbps, ceil);
        if (r->ok && ceil > 0) {
            printf("; %s decode reaches", r->name);
            for (int d = 0; d < o->n_depths; d++)
                printf("%s %.0f%% at depth %d", d ? "," : "", 100.0 * r->decode[d].median / ceil, o->depths[d]);
        }
        printf("\n");
    }
    list_backends();
    for (int i = 0; i < n_known_backends; i++)
        if (!known_backends[i].available)
            printf("%s: this kvgen was built without the %s backend (%s)\n", known_backends[i].name,
                   known_backends[i].name, known_backends[i].missing ? known_backends[i].missing : "?");

    print_peer_batched(o, res, n, peer);
    if (!o->peer) return;
    if (!peer->ran) {
        printf("\npeer llama-bench: not measured: %s\n", peer->error);
        return;
    }
    printf("\npeer llama-bench (%s), same file, this run (%.1f s): threads as kvgen's host backends\n",
           o->peer, peer->seconds);
    peer_header("llama-bench", res, n);
    for (int k = 0; k < o->n_prompts; k++)
        peer_row("prompt %d tokens", o->prompts[k], peer->prompt[k], res, n, offsetof(bench_result, prompt), k);
    for (int k = 0; k < o->n_depths; k++)
        peer_row("decode at depth %d", o->depths[k], peer->decode[k], res, n, offsetof(bench_result, decode), k);
}

/* ---- JSON ---- */

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* JSON has no NaN or infinity */
static void json_number(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.6g", v);
    else fputs("null", f);
}

static void json_stats(FILE *f, const bench_stats *s) {
    fprintf(f, "{\"median\": ");
    json_number(f, s->median);
    fprintf(f, ", \"min\": ");
    json_number(f, s->min);
    fprintf(f, ", \"max\": ");
    json_number(f, s->max);
    fprintf(f, ", \"mean\": ");
    json_number(f, s->mean);
    fprintf(f, ", \"stddev\": ");
    json_number(f, s->stddev);
    fprintf(f, ", \"samples\": [");
    for (int i = 0; i < s->n; i++) {
        if (i) fputs(", ", f);
        json_number(f, s->samples[i]);
    }
    fprintf(f, "]}");
}

static int write_json(const bench_opts *o, const bench_result *res, int n, const bench_model *bm,
                      const bench_peer *peer, double load0, double load1) {
    FILE *f = fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, "kvgen bench: %s: cannot open for writing: %s\n", o->json, strerror(errno));
        return 1;
    }
    fprintf(f, "{\n  \"kvgen_version\": ");
    json_string(f, kvgen_version());
    fprintf(f, ",\n  \"model\": {\"path\": ");
    json_string(f, o->model);
    fprintf(f, ", \"name\": ");
    json_string(f, bm->name);
    fprintf(f, ", \"n_params\": %llu, \"weight_bytes\": %llu, \"n_layer\": %d, \"n_embd\": %d, \"n_vocab\": %d},\n",
            (unsigned long long)bm->n_params, (unsigned long long)bm->weight_bytes, bm->n_layer, bm->n_embd, bm->n_vocab);
    fprintf(f, "  \"settings\": {\"reps\": %d, \"decode_steps\": %d, \"no_cache_depth\": %d, \"no_cache_steps\": %d, "
            "\"quick\": %s, \"vulkan_built\": %s},\n",
            o->reps, o->steps, o->nc_depth, o->nc_steps, o->quick ? "true" : "false",
            backend_info(KVGEN_BACKEND_VULKAN) && backend_info(KVGEN_BACKEND_VULKAN)->available ? "true" : "false");
    fprintf(f, "  \"load_average\": {\"start\": ");
    json_number(f, load0);
    fprintf(f, ", \"end\": ");
    json_number(f, load1);
    fprintf(f, "},\n  \"backends\": [");
    for (int i = 0; i < n; i++) {
        const bench_result *r = &res[i];
        fprintf(f, "%s\n    {\"backend\": \"%s\", \"ok\": %s, \"seconds\": ", i ? "," : "", r->name, r->ok ? "true" : "false");
        json_number(f, r->seconds);
        if (!r->ok) {
            fprintf(f, ", \"error\": ");
            json_string(f, r->error);
            fprintf(f, "}");
            continue;
        }
        fprintf(f, ", \"device\": ");
        json_string(f, r->device);
        fprintf(f, ", \"deepest_cache_restored\": %s", r->filled_by_restore ? "true" : "false");
        fprintf(f, ",\n     \"prompt\": [");
        for (int k = 0; k < o->n_prompts; k++) {
            fprintf(f, "%s\n       {\"tokens\": %d, \"tok_s\": ", k ? "," : "", o->prompts[k]);
            json_stats(f, &r->prompt[k]);
            fprintf(f, "}");
        }
        fprintf(f, "],\n     \"decode\": [");
        for (int k = 0; k < o->n_depths; k++) {
            fprintf(f, "%s\n       {\"depth\": %d, \"steps\": %d, \"tok_s\": ", k ? "," : "", o->depths[k], o->steps);
            json_stats(f, &r->decode[k]);
            fprintf(f, "}");
        }
        fprintf(f, "]");
        if (o->nc_depth > 0) {
            fprintf(f, ",\n     \"no_cache\": {\"depth\": %d, \"steps\": %d, \"tok_s\": ", o->nc_depth, o->nc_steps);
            json_stats(f, &r->nc);
            fprintf(f, ", \"cached_tok_s\": ");
            json_stats(f, &r->nc_cached);
            fprintf(f, ", \"cached_over_no_cache\": ");
            json_number(f, r->nc.median > 0 ? r->nc_cached.median / r->nc.median : 0);
            fprintf(f, "}");
            /* every depth: per-token cost with and without the cache against context length */
            fprintf(f, ",\n     \"no_cache_curve\": [");
            for (int k = 0; k < o->n_nc; k++) {
                fprintf(f, "%s\n       {\"depth\": %d, \"steps\": %d, \"tok_s\": ", k ? "," : "", o->nc_depths[k],
                        o->nc_steps);
                json_stats(f, &r->nc_curve[k]);
                fprintf(f, ", \"cached_tok_s\": ");
                json_stats(f, &r->nc_curve_cached[k]);
                fprintf(f, "}");
            }
            fprintf(f, "]");
        }
        if (o->n_sessions) {
            double one = session_base(o, r);
            fprintf(f, ",\n     \"sessions\": [");
            for (int k = 0; k < o->n_sessions; k++) {
                fprintf(f, "%s\n       {\"sessions\": %d, \"tokens_each\": %d, \"tok_s\": ", k ? "," : "",
                        o->sessions[k], o->session_tokens);
                json_stats(f, &r->sessions[k]);
                fprintf(f, ", \"ratio_to_1\": ");
                json_number(f, one > 0 ? r->sessions[k].median / one : 0);
                fprintf(f, "}");
            }
            fprintf(f, "]");
        }
        if (o->forks) {
            fprintf(f, ",\n     \"forks\": {\"sessions\": %d, \"prompt_tokens\": %d, \"fork_s\": ", o->n_forks,
                    o->fork_prompt);
            json_number(f, r->fork_s);
            fprintf(f, ", \"pages_used\": %zu, \"scratch_one_s\": ", r->fork_pages);
            json_number(f, r->scratch_one_s);
            fprintf(f, ", \"scratch_s_estimated\": ");
            json_number(f, r->scratch_one_s * o->n_forks);
            fprintf(f, ", \"scratch_over_fork\": ");
            json_number(f, r->fork_s > 0 ? r->scratch_one_s * o->n_forks / r->fork_s : 0);
            fprintf(f, "}");
        }
        {
            fprintf(f, ",\n     \"probe\": ");
            if (r->have_probe) {
                double ceil = ceiling_tok_s(r, bm);
                fprintf(f, "{\"device\": ");
                json_string(f, r->probe_device);
                fprintf(f, ", \"read_gbps\": ");
                json_number(f, r->probe_gbps);
                fprintf(f, ", \"read_gbps_runs\": [");
                for (int k = 0; k < r->n_probe_runs; k++) {
                    if (k) fputs(", ", f);
                    json_number(f, r->probe_gbps_runs[k]);
                }
                fprintf(f, "]");
                if (r->uses_device) {
                    fprintf(f, ", \"dispatch_us\": ");
                    json_number(f, r->probe_us);
                }
                fprintf(f, ", \"bytes\": %llu, \"decode_ceiling_tok_s\": ", r->probe_bytes);
                json_number(f, ceil);
                fprintf(f, ", \"decode_pct_of_ceiling\": [");
                for (int k = 0; k < o->n_depths; k++) {
                    fprintf(f, "%s{\"depth\": %d, \"pct\": ", k ? ", " : "", o->depths[k]);
                    json_number(f, ceil > 0 ? 100.0 * r->decode[k].median / ceil : 0);
                    fprintf(f, "}");
                }
                fprintf(f, "]}");
            } else {
                fprintf(f, "{\"error\": ");
                json_string(f, r->probe_note);
                fprintf(f, "}");
            }
        }
        fprintf(f, "}");
    }
    fprintf(f, "\n  ]");
    const bench_result *ref = find(res, n, KVGEN_BACKEND_REFERENCE);
    for (int i = 0; i < n; i++) {
        const bench_result *vk = &res[i]; /* each other backend over the reference */
        if (!ratio_column(res, n, vk)) continue;
        fprintf(f, ",\n  \"ratio_%s_over_reference\": {", vk->name);
        for (int k = 0; k < o->n_prompts; k++) {
            fprintf(f, "%s\"prompt_%d\": ", k ? ", " : "", o->prompts[k]);
            json_number(f, ref->prompt[k].median > 0 ? vk->prompt[k].median / ref->prompt[k].median : 0);
        }
        for (int k = 0; k < o->n_depths; k++) {
            fprintf(f, ", \"decode_%d\": ", o->depths[k]);
            json_number(f, ref->decode[k].median > 0 ? vk->decode[k].median / ref->decode[k].median : 0);
        }
        if (o->nc_depth > 0) {
            fprintf(f, ", \"decode_no_cache_%d\": ", o->nc_depth);
            json_number(f, ref->nc.median > 0 ? vk->nc.median / ref->nc.median : 0);
        }
        fprintf(f, "}");
    }
    if (o->peer) {
        fprintf(f, ",\n  \"peer\": {\"name\": \"llama-bench\", \"path\": ");
        json_string(f, o->peer);
        fprintf(f, ", \"ran\": %s", peer->ran ? "true" : "false");
        if (!peer->ran) {
            fprintf(f, ", \"error\": ");
            json_string(f, peer->error);
        } else {
            fprintf(f, ", \"seconds\": ");
            json_number(f, peer->seconds);
            for (int k = 0; k < o->n_prompts; k++) {
                fprintf(f, ", \"prompt_%d_tok_s\": ", o->prompts[k]);
                json_number(f, peer->prompt[k]);
            }
            for (int k = 0; k < o->n_depths; k++) {
                fprintf(f, ", \"decode_%d_tok_s\": ", o->depths[k]);
                json_number(f, peer->decode[k]);
            }
            for (int i = 0; i < n; i++) {
                if (!res[i].ok) continue;
                fprintf(f, ", \"ratio_%s_over_peer\": {", res[i].name);
                for (int k = 0; k < o->n_prompts; k++) {
                    fprintf(f, "%s\"prompt_%d\": ", k ? ", " : "", o->prompts[k]);
                    json_number(f, peer->prompt[k] > 0 ? res[i].prompt[k].median / peer->prompt[k] : 0);
                }
                for (int k = 0; k < o->n_depths; k++) {
                    fprintf(f, ", \"decode_%d\": ", o->depths[k]);
                    json_number(f, peer->decode[k] > 0 ? res[i].decode[k].median / peer->decode[k] : 0);
                }
                fprintf(f, "}");
            }
        }
        fprintf(f, "}");
    }
    if (o->peer_batched && o->n_sessions > 0) {
        fprintf(f, ",\n  \"peer_batched\": {\"name\": \"llama-batched-bench\", \"path\": ");
        json_string(f, o->peer_batched);
        fprintf(f, ", \"ran\": %s", peer->batched_ran ? "true" : "false");
        if (!peer->batched_ran) {
            fprintf(f, ", \"error\": ");
            json_string(f, peer->batched_error);
        } else {
            fprintf(f, ", \"seconds\": ");
            json_number(f, peer->batched_seconds);
            for (int k = 0; k < o->n_sessions; k++) {
                fprintf(f, ", \"sessions_%d_tok_s\": ", o->sessions[k]);
                json_number(f, peer->sessions[k]);
            }
            for (int i = 0; i < n; i++) {
                if (!res[i].ok) continue;
                fprintf(f, ", \"ratio_%s_over_peer\": {", res[i].name);
                for (int k = 0; k < o->n_sessions; k++) {
                    fprintf(f, "%s\"sessions_%d\": ", k ? ", " : "", o->sessions[k]);
                    json_number(f, peer->sessions[k] > 0 ? res[i].sessions[k].median / peer->sessions[k] : 0);
                }
                fprintf(f, "}");
            }
        }
        fprintf(f, "}");
    }
    fprintf(f, "\n}\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "kvgen bench: %s: write failed\n", o->json);
        return 1;
    }
    return 0;
}

static int bench_remote(bench_opts *o);

int kvgen_cli_bench(int argc, char **argv) {
    bench_opts o;
    int rc = parse_bench_options(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if (strncmp(o.model, "http://", 7) == 0 || strncmp(o.model, "https://", 8) == 0) return bench_remote(&o);
    bench_result res[BENCH_MAX_BACKENDS];
    memset(res, 0, sizeof res);
    bench_model bm;
    memset(&bm, 0, sizeof bm);
    double load0 = load_average();
    int failed = 0;
    bench_fill fill = {{0}, 0};
    /* the reference backend first: it fills the deepest cache fastest (see the top); the
     * others keep their order */
    for (int i = 1; i < o.n_backends; i++)
        if (o.backends[i] == KVGEN_BACKEND_REFERENCE) {
            memmove(&o.backends[1], &o.backends[0], (size_t)i * sizeof o.backends[0]);
            o.backends[0] = KVGEN_BACKEND_REFERENCE;
        }
    for (int i = 0; i < o.n_backends; i++) {
        res[i].backend = o.backends[i];
        failed |= run_backend(&o, &res[i], &bm, &fill, i == o.n_backends - 1);
    }
    if (fill.depth) remove(fill.path);
    bench_peer peer;
    memset(&peer, 0, sizeof peer);
    if (o.peer) { /* after kvgen, so both run on the same warmed page cache */
        run_peer(&o, &peer);
        if (!peer.ran) failed = 1;
    }
    if (o.peer_batched && o.n_sessions > 0) {
        run_peer_batched(&o, &peer);
        if (!peer.batched_ran) failed = 1;
    }
    double load1 = load_average();
    print_report(&o, res, o.n_backends, &bm, &peer, load0, load1);
    if (o.json) failed |= write_json(&o, res, o.n_backends, &bm, &peer, load0, load1);
    return failed ? 1 : 0;
}

/* ---- remote models ---- */

static int remote_peer_parse(const char *text, const bench_opts *o, bench_peer *pr) {
    (void)o;
    const char *end = text + strlen(text);
    pr->sessions[0] = peer_field(text, end, "tokens");
    pr->sessions[1] = peer_field(text, end, "seconds");
    return pr->sessions[0] > 0 && pr->sessions[1] > 0;
}

/* n jobs at once on fresh sessions of a remote model, the same text prompt each: the tokens
 * (reply events) they produced, the wall time from the first submit to the last end, and the
 * time the host thread spent inside kvgen's calls (submit and poll). */
static kvgen_status remote_round(kvgen_model *m, int n, int tokens, double *out_tokens, double *seconds,
                                 double *host_s, kvgen_error *err) {
    kvgen_session **ss = calloc((size_t)n, sizeof *ss);
    kvgen_job **jobs = calloc((size_t)n, sizeof *jobs);
    kvgen_status st = ss && jobs ? KVGEN_OK : bench_fail(err, KVGEN_E_NO_MEMORY, "out of memory for %d sessions", n);
    double host = 0, t0 = now_s();
    for (int i = 0; st == KVGEN_OK && i < n; i++) st = kvgen_session_create(m, NULL, &ss[i], err);
    for (int i = 0; st == KVGEN_OK && i < n; i++) {
        kvgen_job_desc d = {.prompt = KVGEN_PROMPT_TEXT, .text = "Once upon a time",
                            .gen = {.max_tokens = tokens, .ignore_eog = 1}};
        double a = now_s();
        st = kvgen_job_submit(ss[i], &d, &jobs[i], err);
        host += now_s() - a;
    }
    int left = st == KVGEN_OK ? n : 0;
    while (left > 0) { /* a frame loop: poll every job, then sleep a millisecond */
        left = 0;
        for (int i = 0; i < n; i++) {
            const char *text;
            size_t len;
            double a = now_s();
            kvgen_job_state js = kvgen_job_poll(jobs[i], &text, &len);
            host += now_s() - a;
            if (!job_is_final(js)) left++;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    *seconds = now_s() - t0;
    *out_tokens = 0;
    for (int i = 0; st == KVGEN_OK && i < n; i++) {
        kvgen_job_info ji;
        kvgen_job_get_info(jobs[i], &ji);
        if (ji.state != KVGEN_JOB_DONE) {
            *err = ji.error;
            st = ji.error.status != KVGEN_OK ? ji.error.status : KVGEN_E_INTERNAL;
        }
        *out_tokens += ji.n_tokens;
    }
    *host_s = host;
    for (int i = 0; jobs && i < n; i++) kvgen_job_release(jobs[i]);
    for (int i = 0; ss && i < n; i++) kvgen_session_close(ss[i]);
    free(jobs);
    free(ss);
    return st;
}

static int bench_remote(bench_opts *o) {
    if (o->n_sessions == 0) {
        static const int dflt[] = {1, 8, 32};
        memcpy(o->sessions, dflt, sizeof dflt);
        o->n_sessions = 3;
    }
    int tokens = o->session_tokens;
    kvgen_model_desc md = {.path = o->model};
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    if (kvgen_model_load(&md, &m, &err) != KVGEN_OK) {
        fprintf(stderr, "kvgen bench: %s\n", err.message);
        return 1;
    }
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    printf("kvgen %s bench: remote model '%s' at %s, %d tokens per session (\"Once upon a time\"), "
           "median of %d rounds\n",
           kvgen_version(), info.name, info.device, tokens, o->reps);
    { /* one short request first: the server's first evaluation of the prompt is not in any row */
        double t, sec, h;
        if (remote_round(m, 1, 4, &t, &sec, &h, &err) != KVGEN_OK) {
            fprintf(stderr, "kvgen bench: %s\n", err.message);
            kvgen_model_unload(m);
            return 1;
        }
    }
    printf("%-9s %12s %12s %16s", "sessions", "kvgen tok/s", "tokens", "host us/token");
    if (o->peer_remote) printf(" %12s %8s", "peer tok/s", "ratio");
    printf("\n");
    int failed = 0;
    FILE *jf = o->json ? fopen(o->json, "w") : NULL;
    if (jf) {
        fprintf(jf, "{\"remote\": ");
        json_string(jf, info.device);
        fprintf(jf, ", \"model\": ");
        json_string(jf, info.name);
        fprintf(jf, ", \"tokens_per_session\": %d, \"rows\": [", tokens);
    }
    for (int k = 0; k < o->n_sessions; k++) {
        int n = o->sessions[k];
        /* --reps rounds, kvgen and the peer taking turns to go first (the server's load drifts);
         * the medians are reported */
        double rates[16], peer_rates[16], toks = 0, host_sum = 0, tok_sum = 0;
        int reps = o->reps < 16 ? o->reps : 16, got = 0, peer_got = 0;
        char peer_error[512] = "";
        for (int rep = 0; rep < reps; rep++) {
            for (int turn = 0; turn < 2; turn++) {
                int kv = (turn == 0) == (rep % 2 == 0);
                if (kv) {
                    double secs = 0, host = 0;
                    if (remote_round(m, n, tokens, &toks, &secs, &host, &err) != KVGEN_OK) continue;
                    rates[got++] = toks / secs;
                    host_sum += host;
                    tok_sum += toks;
                } else if (o->peer_remote) {
                    char ns[16], ts[16];
                    snprintf(ns, sizeof ns, "%d", n);
                    snprintf(ts, sizeof ts, "%d", tokens);
                    char *argv[] = {(char *)o->peer_remote, (char *)o->model, (char *)info.name, ns, ts, NULL};
                    bench_peer pr;
                    memset(&pr, 0, sizeof pr);
                    double ps = 0;
                    if (run_peer_once(o, o->peer_remote, argv, remote_peer_parse, &pr, peer_error, sizeof peer_error,
                                      &ps) == 0)
                        peer_rates[peer_got++] = pr.sessions[0] / pr.sessions[1];
                }
            }
        }
        if (got < reps) {
            printf("%-9d failed: %s\n", n, err.message);
            failed = 1;
            continue;
        }
        qsort(rates, (size_t)got, sizeof *rates, cmp_double);
        double rate = rates[got / 2], us = tok_sum > 0 ? host_sum * 1e6 / tok_sum : 0, peer_rate = 0;
        printf("%-9d %12.1f %12.0f %16.2f", n, rate, toks, us);
        if (o->peer_remote && peer_got == reps) {
            qsort(peer_rates, (size_t)peer_got, sizeof *peer_rates, cmp_double);
            peer_rate = peer_rates[peer_got / 2];
            printf(" %12.1f %7.2fx", peer_rate, rate / peer_rate);
        } else if (o->peer_remote) {
            printf(" failed: %s", peer_error);
            failed = 1;
        }
        printf("\n");
        if (jf)
            fprintf(jf, "%s{\"sessions\": %d, \"tokens\": %.0f, \"tok_s\": %.3f, \"host_us_per_token\": %.3f, "
                        "\"peer_tok_s\": %.3f}",
                    k ? ", " : "", n, toks, rate, us, peer_rate);
        fflush(stdout);
    }
    if (jf) {
        fprintf(jf, "]}\n");
        fclose(jf);
    }
    kvgen_model_unload(m);
    return failed;
}

/* ---- devices ---- */

int kvgen_cli_devices(int argc, char **argv) {
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: kvgen devices   lists the Vulkan devices kvgen can run on\n");
            return 0;
        }
        fprintf(stderr, "kvgen devices: unexpected argument '%s'\nusage: kvgen devices\n", argv[i]);
        return 2;
    }
    kvgen_error err = {0};
    int count = 0;
    if (kvgen_devices(NULL, 0, &count, &err) != KVGEN_OK) {
        fprintf(stderr, "kvgen devices: %s\n", err.message);
        return 1;
    }
    kvgen_device_info *dev = count > 0 ? calloc((size_t)count, sizeof *dev) : NULL;
    if (count > 0 && !dev) {
        fprintf(stderr, "kvgen devices: out of memory\n");
        return 1;
    }
    int cap = count;
    if (count > 0 && kvgen_devices(dev, cap, &count, &err) != KVGEN_OK) {
        fprintf(stderr, "kvgen devices: %s\n", err.message);
        free(dev);
        return 1;
    }
    if (count > cap) count = cap; /* a device appeared between the two calls */
    if (count == 0) {
        int device_backend = 0; /* this kvgen has a backend that runs on a Vulkan device */
        list_backends();
        for (int i = 0; i < n_known_backends; i++) device_backend |= known_backends[i].available && known_backends[i].uses_device;
        if (device_backend) printf("no Vulkan devices (no driver, or none with Vulkan 1.1 and a compute queue)\n");
        else printf("no Vulkan devices: this kvgen was built without the Vulkan backend\n");
    }
    for (int i = 0; i < count; i++) {
        const kvgen_device_info *d = &dev[i];
        printf("%d: %s%s\n", d->index, d->name, d->is_default ? "  [default]" : "");
        printf("   type %s, Vulkan %u.%u.%u, vendor 0x%04x, device 0x%04x\n", d->type ? d->type : "other",
               (unsigned)((d->api_version >> 22) & 0x7f), (unsigned)((d->api_version >> 12) & 0x3ff),
               (unsigned)(d->api_version & 0xfff), (unsigned)d->vendor_id, (unsigned)d->device_id);
        printf("   memory: %.1f GiB device-local%s, max allocation %.1f GiB, max storage buffer range %.0f MiB\n",
               (double)d->device_local_bytes / (1 << 30), d->host_visible_device_local ? " (host-visible)" : "",
               (double)d->max_allocation_size / (1 << 30), (double)d->max_storage_buffer_range / (1 << 20));
        printf("   features: fp16 arithmetic %s, 16-bit storage %s, 8-bit storage %s, subgroup size %u%s, "
               "shared memory %u KiB\n",
               d->shader_float16 ? "yes" : "no", d->storage_16bit ? "yes" : "no", d->storage_8bit ? "yes" : "no",
               (unsigned)d->subgroup_size, d->subgroup_arithmetic ? " (arithmetic)" : "",
               (unsigned)(d->max_shared_memory / 1024));
    }
    free(dev);
    return 0;
}
