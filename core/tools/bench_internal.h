/* bench_internal.h: what the files of `kvgen bench` share (private to core/tools/bench_*.c).
 *
 * Calls go down this list, never up: bench_core.c (the options and the timing loop over the
 * backends) > bench_remote.c (a remote model's bench), bench_embed.c
 * (sentence embeddings) > bench_peer.c (llama.cpp's programs on the
 * same file), bench_probe.c (the bandwidth ceiling's probes), bench_report.c (the table and the
 * JSON file) > bench_common.c (clock, statistics, the backend list). */
#ifndef KVGEN_BENCH_INTERNAL_H
#define KVGEN_BENCH_INTERNAL_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "kvgen.h"
#include "kvg_buf.h"

#define BENCH_MAX_REPS 64
#define BENCH_MAX_SIZES 8
#define BENCH_MAX_BACKENDS 8 /* backends kvgen knows (kvgen_backends), at most */

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
    /* --kv-type: kvgen_model_desc.kv_type of each of the non-reference backends' runs, one run
     * (one column) per type; none: one run with each backend's default */
    const char *kv_types[4];
    int n_kv_types;
    char kv_list[64]; /* the option's value, split in place */
    int prompts[BENCH_MAX_SIZES], n_prompts;
    int depths[BENCH_MAX_SIZES], n_depths;
    int nc_depth, nc_steps; /* no-cache comparison; nc_depth 0: skipped */
    int nc_depths[BENCH_MAX_SIZES], n_nc; /* every no-cache depth, ascending; nc_depth is the first */
    int sessions[BENCH_MAX_SIZES], n_sessions; /* concurrent sessions; n_sessions 0: skipped */
    int session_tokens;                         /* tokens each of them generates */
    /* --adapters: LoRA adapter files; with --sessions each count runs again with session i
     * running adapter i % n_adapters (scale 1) */
    const char *adapters[8];
    int n_adapters;
    char adapter_list[1024]; /* the option's value, split in place */
    int forks, n_forks, fork_prompt;            /* forks vs scratch */
    const char *peer;                           /* llama-bench to run on the same file; NULL: none */
    const char *peer_batched;                   /* llama-batched-bench for --sessions; NULL: none */
    const char *peer_kv_type;                   /* --peer-kv-type: the peers' -ctk/-ctv (with -fa); NULL: theirs */
    const char *peer_remote;                    /* a remote model's plain client (--peer-remote) */
    int embed;                                  /* --embed: sentence embeddings instead (bench_embed.c) */
    int batches[BENCH_MAX_SIZES], n_batches;    /* --batch: texts per kvgen_embed call */
    const char *peer_embedding;                 /* llama-embedding to run on the same file; NULL: none */
} bench_opts;

typedef struct bench_result {
    kvgen_backend backend;
    const char *name;
    const char *kv_type; /* what its K/V pages hold (--kv-type), NULL: the backend's default */
    int kv_base;         /* >= 0: the result of the same backend with the first --kv-type */
    char label[40];      /* "cpu:q8_0", the name of a run with a kv_type */
    int uses_device; /* probed with kvgen_device_probe */
    int ok;
    char error[KVGEN_ERROR_MESSAGE_SIZE];
    char device[256];
    bench_stats prompt[BENCH_MAX_SIZES];
    bench_stats decode[BENCH_MAX_SIZES];  /* in opts.depths order */
    bench_stats nc, nc_cached;            /* decode at nc_depth without / with the cache */
    bench_stats nc_curve[BENCH_MAX_SIZES], nc_curve_cached[BENCH_MAX_SIZES]; /* at every nc_depths entry */
    bench_stats sessions[BENCH_MAX_SIZES]; /* aggregate tokens/s, in opts.sessions order */
    bench_stats sessions_lora[BENCH_MAX_SIZES]; /* the same with --adapters (backends that run them) */
    char lora_note[KVGEN_ERROR_MESSAGE_SIZE];   /* why a backend has no adapter figures */
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
    double load_s;  /* kvgen_model_load's wall time */
    unsigned long long rss_before, rss_after; /* resident bytes around the load (0: not known) */
} bench_result;

typedef struct bench_model {
    char name[256];
    uint64_t weight_bytes, n_params;
    int n_layer, n_embd, n_vocab;
} bench_model;

/* A peer engine's figures, measured by running it on the same file in the same invocation. */
/* The peers run twice, before and after kvgen's measurements (bench_peer_bracket): a shared
 * machine's speed drifts over minutes, and the mean of a run on each side of kvgen's is nearer
 * kvgen's moment than either. The figures are that mean; each run's are kept for the report. */
typedef struct bench_peer {
    int ran;                            /* its output was read */
    char error[512];                    /* why not */
    double prompt[BENCH_MAX_SIZES];     /* tokens/s in opts.prompts order; 0: not reported */
    double decode[BENCH_MAX_SIZES];     /* tokens/s generating --steps tokens, in opts.depths order */
    double seconds;                     /* wall time of its runs */
    char backends[64], device[128];     /* what it ran on, as its output says ("Vulkan", the GPU's
                                           name; the device empty for its CPU backend) */
    int runs;                           /* 2 once bracketed: prompt_run and decode_run hold each run's */
    double prompt_run[2][BENCH_MAX_SIZES], decode_run[2][BENCH_MAX_SIZES];
    /* llama-batched-bench (--peer-batched) */
    int batched_ran;
    char batched_error[512];
    double sessions[BENCH_MAX_SIZES];   /* aggregate decode tokens/s, in opts.sessions order */
    double batched_seconds;
    int batched_runs;
    double sessions_run[2][BENCH_MAX_SIZES];
} bench_peer;

/* ---- bench_common.c ---- */
double bench_now_s(void); /* a monotonic clock, in seconds */
unsigned long long bench_resident_bytes(void); /* the process's resident memory; 0: not known */
/* the 1-minute load average, or -1 where /proc/loadavg is absent: worth printing on a shared machine */
double bench_load_average(void);
long bench_online_cpus(void);
/* kvgen's own counterpart of an error: formats into err and returns status */
#if defined(__GNUC__) && !defined(__MINGW32__)
__attribute__((format(printf, 3, 4)))
#endif
kvgen_status bench_fail(kvgen_error *err, kvgen_status status, const char *fmt, ...);
/* The backends kvgen knows (kvgen_backends), in its order: their count, the list in *list. */
int bench_backends(const kvgen_backend_info **list);
const kvgen_backend_info *bench_backend_info(kvgen_backend b); /* NULL: unknown */
void bench_backend_names(char *buf, size_t size, const char *sep); /* "vulkan, reference" (sep ", ") into buf */
int bench_cmp_double(const void *a, const void *b); /* qsort's comparison, ascending */
void bench_stats_add(bench_stats *s, double tokens, double seconds); /* one repetition's tokens/s */
void bench_stats_finish(bench_stats *s); /* median, min, max, mean, stddev of the samples */
int bench_job_is_final(kvgen_job_state st);

/* ---- bench_probe.c ---- */
/* The bandwidth of the decode ceiling: the device probe (kvgen_device_probe) for a backend that
 * runs on a device, a streaming read of host memory for a host backend. Run before and after
 * the model's measurements; r keeps the best. */
void bench_probe(const bench_opts *o, bench_result *r);

/* ---- bench_peer.c ---- */
/* Reads a peer program's output into pr; returns the number of results understood (0: none). */
typedef int (*bench_peer_parse_fn)(const char *text, const bench_opts *o, bench_peer *pr);
/* The number after "key": inside [obj, end), or -1 (flat JSON objects apart from arrays of numbers). */
double bench_peer_field(const char *obj, const char *end, const char *key);
/* Runs prog with argv (no shell) and parses its standard output; returns 0, or -1 with error
 * set (its standard error's last line quoted). Adds its wall time to *seconds. */
int bench_peer_run_program(const bench_opts *o, const char *prog, char *const argv[], bench_peer_parse_fn parse,
                           bench_peer *pr, char *error, size_t error_size, double *seconds);
void bench_peer_run(const bench_opts *o, bench_peer *pr);         /* --peer: llama-bench */
void bench_peer_run_batched(const bench_opts *o, bench_peer *pr); /* --peer-batched: llama-batched-bench */
/* pr (the runs before kvgen's) and after (those after): pr's figures become the two runs' mean */
void bench_peer_bracket(bench_peer *pr, const bench_peer *after);

/* ---- bench_report.c ---- */
void bench_report_print(const bench_opts *o, const bench_result *res, int n, const bench_model *bm,
                        const bench_peer *peer, double load0, double load1);
/* writes o->json; 0, or 1 after printing why not */
int bench_report_write_json(const bench_opts *o, const bench_result *res, int n, const bench_model *bm,
                            const bench_peer *peer, double load0, double load1);
/* A JSON file's text, built in memory (kvg_buf) and written at once; any failure on the way
 * (out of memory) is kept in `failed` and reported by bench_json_save. */
typedef struct bench_json {
    kvg_buf b;
    int failed;
} bench_json;
#if defined(__GNUC__) && !defined(__MINGW32__)
__attribute__((format(printf, 2, 3)))
#endif
void bench_json_text(bench_json *j, const char *fmt, ...); /* JSON text as it is (keys, punctuation) */
void bench_json_string(bench_json *j, const char *s);      /* s quoted and escaped (kvg_json_write_string) */
void bench_json_number(bench_json *j, double v);           /* kvg_json_write_number: not finite is null */
/* writes the text to path and frees it; 0, or 1 after printing why not */
int bench_json_save(bench_json *j, const char *path);

/* ---- bench_embed.c ---- */
/* --embed: texts/s of kvgen_embed at each --batch, and llama-embedding's (--peer-embedding); the exit status. */
int bench_embed_run(const bench_opts *o);

/* ---- bench_remote.c ---- */
/* A MODEL that is a server's URL: sessions at once against it (and --peer-remote); the exit status. */
int bench_remote_run(bench_opts *o);

#endif
