/* bench_core.c: `kvgen bench`: its options, and the timing loop over the backends.
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
 * threads as the backend runs, the same ceiling for the host's cores (bench_probe.c). Like any
 * host, it measures through kvgen.h only: backends are named through kvgen_backends (the JSON
 * files alone are written with kvgen's internal JSON writer, kvg_json.h). The table and the JSON
 * file are bench_report.c's, llama.cpp's figures beside kvgen's bench_peer.c's, and a MODEL
 * that is a server's URL goes to bench_remote.c.
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
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "bench_internal.h"
#include "bench.h"
#include "progress.h"

/* the deepest filled session, saved by one backend for the next */
typedef struct bench_fill {
    char path[512];
    int depth; /* 0: none saved */
} bench_fill;

/* a fixed paragraph: its tokens, repeated, are every prompt, fill and decode input */
static const char bench_text[] =
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting the steps as his "
    "father had before him. From the lamp room he could see the fishing boats returning to the harbour, "
    "their lanterns swaying over the grey water, and the lights of the village coming on one by one. "
    "He wrote the weather in the log: wind from the north-west, a falling glass, fog likely before "
    "midnight. Then he trimmed the wick, wound the clockwork that turned the lens, and sat down with "
    "a cup of tea to wait for the long night, listening to the gulls and the slow breathing of the sea.";
static void bench_usage(FILE *f) {
    char names[128];
    bench_backend_names(names, sizeof names, ",");
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
            "  --activation-bits B  16 (default) or 8: cpu, as llama.cpp's CPU backend; vulkan, integer dot products\n"
            "  --kv-type LIST       what K/V pages hold: some of f16,q8_0,q4_0 (q8_0, q4_0: cpu, Vulkan);\n"
            "                       each backend but the reference (which keeps f32) runs once per type,\n"
            "                       and each type after the first gets a ratio to the first\n"
            "  --sessions LIST      also: aggregate decode tokens/s of that many sessions at once through the\n"
            "                       jobs worker (batched decode), e.g. 1,2,4,8,16; ratio to 1 session\n"
            "  --session-tokens N   tokens each of those sessions generates (default: --steps)\n"
            "  --adapters LIST      with --sessions: LoRA adapter files (comma-separated, up to 8); each count\n"
            "                       also runs with session i running adapter i %% n, and a ratio to none\n"
            "  --forks              also: time to create --fork-sessions forks of a --fork-prompt token\n"
            "                       prompt vs as many prefilled from scratch (estimated: one prefill x N)\n"
            "  --fork-sessions N    (default 64; --quick 4)   --fork-prompt N (default 512; --quick 32)\n"
            "  --peer PATH          also run llama.cpp's llama-bench (PATH) on the same file with the same\n"
            "                       prompt sizes, decode depths, steps, repetitions and threads, before\n"
            "                       kvgen's measurements and after, and print kvgen/peer ratios to the\n"
            "                       mean of the two runs (each run's figures beside them)\n"
            "  --peer-kv-type T     the peers' K/V cache type (llama.cpp's -ctk T -ctv T, with flash attention\n"
            "                       on, which its quantized V cache needs): f16, q8_0 or q4_0\n"
            "  --peer-batched PATH  with --sessions: also run llama.cpp's llama-batched-bench (PATH) with that\n"
            "                       many parallel sequences (1-token prompts, --session-tokens generated)\n"
            "                       and print the aggregate decode ratios (also run before and after)\n"
            "  --embed              sentence embeddings instead: texts/s of kvgen_embed on 64 fixed texts\n"
            "                       (cpu backend where it is in --backend), --reps times\n"
            "  --batch LIST         with --embed: texts per kvgen_embed call, up to 64 (default 1,64)\n"
            "  --peer-embedding PATH  with --embed: also run llama.cpp's llama-embedding (PATH) on the same\n"
            "                       file and texts, as many per batch and threads, and print kvgen/peer\n"
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
        const kvgen_backend_info *known;
        int n_known = bench_backends(&known);
        for (int i = 0; i < n_known && !info; i++)
            if (strcmp(tok, known[i].name) == 0) info = &known[i];
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
    const kvgen_backend_info *known;
    int n_known = bench_backends(&known);
    for (int i = 0; i < n_known; i++)
        if (known[i].available) o->backends[o->n_backends++] = known[i].backend;
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
                          strcmp(a, "--kv-type") == 0 || strcmp(a, "--adapters") == 0 ||
                          strcmp(a, "--peer-kv-type") == 0 ||
                          strcmp(a, "--peer-batched") == 0 || strcmp(a, "--peer-remote") == 0 ||
                          strcmp(a, "--batch") == 0 || strcmp(a, "--peer-embedding") == 0;
        if (takes_value) {
            if (!val) return bench_usage_error("option %s needs a value", a);
            i++;
        }
        if (strcmp(a, "--quick") == 0 || strcmp(a, "--no-cache") == 0) {
            /* --quick was applied above; --no-cache is the default */
        } else if (strcmp(a, "--backend") == 0) {
            if (!parse_backends(val, o)) {
                char names[128], msg[384];
                bench_backend_names(names, sizeof names, ", ");
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
        } else if (strcmp(a, "--embed") == 0) {
            o->embed = 1;
        } else if (strcmp(a, "--batch") == 0) {
            if (!parse_int_list(val, 1, o->batches, &o->n_batches))
                return bench_usage_error("--batch: expected up to 8 comma-separated counts >= 1, got '%s'", val);
            for (int k = 0; k < o->n_batches; k++)
                if (o->batches[k] > 64) return bench_usage_error("--batch: a count is over 64, got '%s'", val);
        } else if (strcmp(a, "--peer-embedding") == 0) {
            if (!*val) return bench_usage_error("--peer-embedding: expected the path of llama-embedding, got '%s'", val);
            o->peer_embedding = val;
        } else if (strcmp(a, "--threads") == 0 || strcmp(a, "-t") == 0) {
            if (!parse_int(val, 1, 1024, &o->threads)) return bench_usage_error("--threads: bad thread count '%s'", val);
        } else if (strcmp(a, "--kv-type") == 0) {
            if (strlen(val) >= sizeof o->kv_list) return bench_usage_error("--kv-type: list too long '%s'", val);
            memcpy(o->kv_list, val, strlen(val) + 1);
            o->n_kv_types = 0;
            for (char *p = o->kv_list, *end; p; p = end) {
                end = strchr(p, ',');
                if (end) *end++ = 0;
                if (!*p || o->n_kv_types == (int)(sizeof o->kv_types / sizeof o->kv_types[0]))
                    return bench_usage_error("--kv-type: expected up to 4 names (f16,q8_0,...), got '%s'", val);
                o->kv_types[o->n_kv_types++] = p;
            }
        } else if (strcmp(a, "--peer-kv-type") == 0) {
            if (strcmp(val, "f16") != 0 && strcmp(val, "q8_0") != 0 && strcmp(val, "q4_0") != 0)
                return bench_usage_error("--peer-kv-type: expected f16, q8_0 or q4_0, got '%s'", val);
            o->peer_kv_type = val;
        } else if (strcmp(a, "--adapters") == 0) {
            if (strlen(val) >= sizeof o->adapter_list) return bench_usage_error("--adapters: list too long '%s'", val);
            memcpy(o->adapter_list, val, strlen(val) + 1);
            o->n_adapters = 0;
            for (char *p = o->adapter_list, *end; p; p = end) {
                end = strchr(p, ',');
                if (end) *end++ = 0;
                if (!*p || o->n_adapters == (int)(sizeof o->adapters / sizeof o->adapters[0]))
                    return bench_usage_error("--adapters: expected up to 8 comma-separated files, got '%s'", val);
                o->adapters[o->n_adapters++] = p;
            }
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
    if ((o->n_batches || o->peer_embedding) && !o->embed)
        return bench_usage_error("%s", "--batch and --peer-embedding go with --embed");
    if (o->embed && !o->n_batches) {
        o->batches[0] = 1;
        o->batches[1] = 64;
        o->n_batches = 2;
    }
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
        double t0 = bench_now_s();
        for (int k = 0; k < steps && st == KVGEN_OK; k++) st = kvgen_session_decode(s, seq[depth + k], err);
        double t = bench_now_s() - t0;
        if (st != KVGEN_OK) break;
        bench_stats_add(out, steps, t);
        if (r + 1 < reps) st = kvgen_session_rewind(s, (size_t)steps, err);
    }
    bench_stats_finish(out);
    return st;
}
/* Aggregate decode throughput with n_sessions generating at once through the jobs worker: each
 * gets a fresh session, the same one-token prompt (BOS, or token 1) and n_tokens greedy tokens
 * with end-of-generation ignored. *tokens_per_s = the tokens of the decode steps / (last job's
 * end - first job's first token): a job's first token comes from its prefill, before or at the
 * start of the window, so it is not counted (as llama-batched-bench counts its generation steps). */
static kvgen_status jobs_tok_s(kvgen_model *m, int n_sessions, int n_tokens, kvgen_adapter *const *adapters,
                               int n_adapters, double *tokens_per_s, kvgen_error *err) {
    *tokens_per_s = 0;
    kvgen_session **ss = calloc((size_t)n_sessions, sizeof *ss);
    kvgen_job **jobs = calloc((size_t)n_sessions, sizeof *jobs);
    kvgen_status st = ss && jobs ? KVGEN_OK : bench_fail(err, KVGEN_E_NO_MEMORY, "out of memory for %d sessions", n_sessions);
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    int32_t prompt = info.bos >= 0 ? info.bos : 1;
    kvgen_session_desc sd = {.n_ctx = n_tokens + 16, .no_prefix_reuse = 1};
    for (int i = 0; st == KVGEN_OK && i < n_sessions; i++) {
        st = kvgen_session_create(m, &sd, &ss[i], err);
        const kvgen_adapter *a = n_adapters ? adapters[i % n_adapters] : NULL;
        if (st == KVGEN_OK && a) st = kvgen_session_set_adapters(ss[i], &a, NULL, 1, err);
    }
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
            if (bench_job_is_final(ji.state)) break;
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
        total += ji.n_tokens > 0 ? ji.n_tokens - 1 : 0;
    }
    if (st == KVGEN_OK && last > first) *tokens_per_s = total / ((last - first) / 1e3);
    for (int i = 0; jobs && i < n_sessions; i++) kvgen_job_release(jobs[i]);
    for (int i = 0; ss && i < n_sessions; i++) kvgen_session_close(ss[i]);
    free(jobs);
    free(ss);
    return st;
}

/* --sessions: jobs_tok_s for each count, reps times; with --adapters, each repetition also with
 * the adapters (interleaved, so both see the same machine) */
static kvgen_status bench_sessions(const bench_opts *o, bench_result *r, kvgen_model *m, kvgen_error *err) {
    kvgen_status st = KVGEN_OK;
    kvgen_adapter *adapters[8] = {0};
    int n_adapters = 0;
    for (int i = 0; i < o->n_adapters; i++) {
        kvgen_error aerr = {0};
        if (kvgen_adapter_load(m, o->adapters[i], &adapters[n_adapters], &aerr) != KVGEN_OK) {
            snprintf(r->lora_note, sizeof r->lora_note, "%s", aerr.message);
            fprintf(stderr, "kvgen bench: %s: no adapter figures: %s\n", r->name, aerr.message);
            break;
        }
        n_adapters++;
    }
    if (n_adapters < o->n_adapters) {
        for (int i = 0; i < n_adapters; i++) kvgen_adapter_free(adapters[i]);
        n_adapters = 0;
    }
    for (int i = 0; i < o->n_sessions && st == KVGEN_OK; i++) {
        fprintf(stderr, "kvgen bench: %s: %d sessions at once, %d tokens each x %d%s\n", r->name, o->sessions[i],
                o->session_tokens, o->reps, n_adapters ? ", without and with the adapters" : "");
        for (int rep = 0; rep < o->reps && st == KVGEN_OK; rep++) {
            double tok_s = 0;
            st = jobs_tok_s(m, o->sessions[i], o->session_tokens, NULL, 0, &tok_s, err);
            if (st == KVGEN_OK && r->sessions[i].n < BENCH_MAX_REPS) r->sessions[i].samples[r->sessions[i].n++] = tok_s;
            if (st != KVGEN_OK || !n_adapters) continue;
            kvgen_error lerr = {0};
            if (jobs_tok_s(m, o->sessions[i], o->session_tokens, adapters, n_adapters, &tok_s, &lerr) != KVGEN_OK) {
                snprintf(r->lora_note, sizeof r->lora_note, "%s", lerr.message);
                fprintf(stderr, "kvgen bench: %s: no adapter figures: %s\n", r->name, lerr.message);
                for (int k = 0; k < n_adapters; k++) kvgen_adapter_free(adapters[k]);
                n_adapters = 0;
                continue;
            }
            bench_stats *l = &r->sessions_lora[i];
            if (l->n < BENCH_MAX_REPS) l->samples[l->n++] = tok_s;
        }
        bench_stats_finish(&r->sessions[i]);
        bench_stats_finish(&r->sessions_lora[i]);
    }
    for (int i = 0; i < n_adapters; i++) kvgen_adapter_free(adapters[i]);
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
    double t0 = bench_now_s();
    if (st == KVGEN_OK) st = kvgen_session_prefill(parent, seq, (size_t)o->fork_prompt, NULL, err);
    r->scratch_one_s = bench_now_s() - t0;
    t0 = bench_now_s();
    for (int i = 0; i < N && st == KVGEN_OK; i++) st = kvgen_session_fork(parent, &ss[i], err);
    r->fork_s = bench_now_s() - t0;
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
    double t_start = bench_now_s();
    kvgen_error err = {0};
    kvgen_model *m = NULL;
    kvgen_session *s = NULL, *nc = NULL;
    int32_t *seq = NULL;
    kvgen_status st;
    const kvgen_backend_info *bi = bench_backend_info(r->backend);
    r->name = bi ? bi->name : "?";
    if (r->kv_type) {
        snprintf(r->label, sizeof r->label, "%s:%s", r->name, r->kv_type);
        r->name = r->label;
    }
    r->uses_device = bi && bi->uses_device;
    fprintf(stderr, "kvgen bench: %s: loading %s\n", r->name, o->model);
    kvgen_model_desc md = {.path = o->model, .backend = r->backend, .device = o->device, .n_threads = o->threads,
                           .activation_bits = o->activation_bits, .kv_type = r->kv_type,
                           .progress = kvgen_cli_progress()};
    r->rss_before = bench_resident_bytes();
    double t_load = bench_now_s();
    st = kvgen_model_load(&md, &m, &err);
    r->load_s = bench_now_s() - t_load;
    r->rss_after = bench_resident_bytes();
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
    bench_probe(o, r);

    /* warm-up: first-use costs (a decode command buffer recorded on first use, page commits) */
    int warm = need > 9 ? 8 : need - 1;
    st = kvgen_session_prefill(s, seq, (size_t)warm, NULL, &err);
    for (int k = 0; k < 2 && st == KVGEN_OK && warm + k < need; k++) st = kvgen_session_decode(s, seq[warm + k], &err);
    if (st != KVGEN_OK) goto done;

    for (int i = 0; i < o->n_prompts; i++) {
        fprintf(stderr, "kvgen bench: %s: prompt %d x %d\n", r->name, o->prompts[i], o->reps);
        for (int rep = 0; rep < o->reps; rep++) {
            kvgen_session_reset(s);
            double t0 = bench_now_s();
            st = kvgen_session_prefill(s, seq, (size_t)o->prompts[i], NULL, &err);
            double t = bench_now_s() - t0;
            if (st != KVGEN_OK) goto done;
            bench_stats_add(&r->prompt[i], o->prompts[i], t);
        }
        bench_stats_finish(&r->prompt[i]);
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
    bench_probe(o, r);
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
    r->seconds = bench_now_s() - t_start;
    return r->ok ? 0 : 1;
}
int kvgen_cli_bench(int argc, char **argv) {
    bench_opts o;
    int rc = parse_bench_options(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if (o.embed) return bench_embed_run(&o);
    if (strncmp(o.model, "http://", 7) == 0 || strncmp(o.model, "https://", 8) == 0) return bench_remote_run(&o);
    bench_result res[BENCH_MAX_BACKENDS];
    memset(res, 0, sizeof res);
    bench_model bm;
    memset(&bm, 0, sizeof bm);
    double load0 = bench_load_average();
    int failed = 0;
    bench_fill fill = {{0}, 0};
    /* the reference backend first: it fills the deepest cache fastest (see the top); the
     * others keep their order */
    for (int i = 1; i < o.n_backends; i++)
        if (o.backends[i] == KVGEN_BACKEND_REFERENCE) {
            memmove(&o.backends[1], &o.backends[0], (size_t)i * sizeof o.backends[0]);
            o.backends[0] = KVGEN_BACKEND_REFERENCE;
        }
    /* a run per backend, and per --kv-type but on the reference (its f32 pages are the oracle
     * the others are measured by) */
    int n = 0;
    for (int i = 0; i < o.n_backends; i++) {
        int types = o.backends[i] == KVGEN_BACKEND_REFERENCE || o.n_kv_types == 0 ? 1 : o.n_kv_types;
        for (int k = 0; k < types; k++) {
            if (n == BENCH_MAX_BACKENDS) {
                char max[16];
                snprintf(max, sizeof max, "%d", BENCH_MAX_BACKENDS);
                return bench_usage_error("--kv-type: more runs of backends and types than %s", max);
            }
            res[n].backend = o.backends[i];
            res[n].kv_type = types > 1 || (o.n_kv_types > 0 && o.backends[i] != KVGEN_BACKEND_REFERENCE)
                                 ? o.kv_types[k]
                                 : NULL;
            res[n].kv_base = k > 0 ? n - k : -1;
            n++;
        }
    }
    /* the peers before kvgen and again after (bench_internal.h: bench_peer_bracket) */
    bench_peer peer, after;
    memset(&peer, 0, sizeof peer);
    memset(&after, 0, sizeof after);
    int batched = o.peer_batched && o.n_sessions > 0;
    if (o.peer) bench_peer_run(&o, &peer);
    if (batched) bench_peer_run_batched(&o, &peer);
    for (int i = 0; i < n; i++) failed |= run_backend(&o, &res[i], &bm, &fill, i == n - 1);
    if (fill.depth) remove(fill.path);
    if (o.peer && peer.ran) bench_peer_run(&o, &after);
    if (batched && peer.batched_ran) bench_peer_run_batched(&o, &after);
    bench_peer_bracket(&peer, &after);
    if ((o.peer && !peer.ran) || (batched && !peer.batched_ran)) failed = 1;
    double load1 = bench_load_average();
    bench_report_print(&o, res, n, &bm, &peer, load0, load1);
    if (o.json) failed |= bench_report_write_json(&o, res, n, &bm, &peer, load0, load1);
    return failed ? 1 : 0;
}
