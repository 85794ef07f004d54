/* bench_peer.c: llama.cpp's own benchmarks run on the same file in the same invocation, once
 * before kvgen's measurements and once after, so kvgen/peer ratios come from one stretch of a
 * shared machine: llama-bench (--peer: prompts and decode at depths), llama-batched-bench
 * (--peer-batched: sessions at once), and the running of any such program (no shell;
 * --peer-remote's client too) and the reading of its output. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if !defined(_WIN32)
#include <sys/wait.h>
#endif
#include "bench_internal.h"

/* llama-bench's JSON objects are flat apart from arrays of numbers, so a key search bounded by
 * the object is enough: where the value of key starts, NULL where the object has no such key */
static const char *peer_value(const char *obj, const char *end, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    size_t pl = strlen(pat);
    for (const char *p = obj; p + pl < end; p++) {
        if (memcmp(p, pat, pl) != 0) continue;
        p += pl;
        while (p < end && (*p == ' ' || *p == ':' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
        return p;
    }
    return NULL;
}

double bench_peer_field(const char *obj, const char *end, const char *key) {
    const char *p = peer_value(obj, end, key);
    if (!p) return -1;
    char *stop;
    double v = strtod(p, &stop);
    return stop > p && stop <= end ? v : -1;
}

/* A string field ("key": "value") of one JSON object of the peer's output, into out (cut at
 * size; a backslash escape gives the character after the backslash); 0 where it is absent */
static int peer_string(const char *obj, const char *end, const char *key, char *out, size_t size) {
    const char *p = peer_value(obj, end, key);
    if (!p || p >= end || *p != '"') return 0;
    size_t n = 0;
    for (p++; p < end && *p != '"' && n + 1 < size; p++) {
        if (*p == '\\' && p + 1 < end) p++;
        out[n++] = *p;
    }
    out[n] = 0;
    return 1;
}

/* Reads llama-bench's `-o json` output: one object per test, with n_prompt, n_gen, n_depth
 * and avg_ts (prompts at depth 0, decodes at each depth). Returns the number of tests understood. */
static int peer_parse(const char *text, const bench_opts *o, bench_peer *pr) {
    int found = 0;
    const char *p = text;
    while ((p = strchr(p, '{')) != NULL) {
        const char *end = strchr(p, '}');
        if (!end) break;
        double n_prompt = bench_peer_field(p, end, "n_prompt"), n_gen = bench_peer_field(p, end, "n_gen");
        double n_depth = bench_peer_field(p, end, "n_depth"), ts = bench_peer_field(p, end, "avg_ts");
        if (n_depth < 0) n_depth = 0; /* older llama-bench: no depths */
        if (!pr->backends[0]) { /* what it ran on: its backends, and the GPU's name where it used one */
            peer_string(p, end, "backends", pr->backends, sizeof pr->backends);
            peer_string(p, end, "gpu_info", pr->device, sizeof pr->device);
        }
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

/* Its standard error goes to a temporary file, whose last line is quoted when it fails. */
int bench_peer_run_program(const bench_opts *o, const char *prog, char *const argv[], bench_peer_parse_fn parse,
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
    double t0 = bench_now_s();
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
    *seconds += bench_now_s() - t0;
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
/* --peer-kv-type T: the peer's K and V caches of type T, with flash attention on (llama.cpp
 * quantizes the V cache only with it), appended to argv (room for 6 more) at its end */
static void add_kv_type(const bench_opts *o, char **argv, const char *fa) {
    if (!o->peer_kv_type) return;
    int n = 0;
    while (argv[n]) n++;
    char *extra[] = {"-ctk", (char *)o->peer_kv_type, "-ctv", (char *)o->peer_kv_type, "-fa", (char *)fa, NULL};
    memcpy(argv + n, extra, sizeof extra);
}

void bench_peer_run(const bench_opts *o, bench_peer *pr) {
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
    long nt = o->threads ? o->threads : bench_online_cpus();
    snprintf(steps, sizeof steps, "%d", o->steps);
    snprintf(reps, sizeof reps, "%d", o->reps);
    snprintf(threads, sizeof threads, "%ld", nt > 0 ? nt : 1);
    char *argv[20] = {(char *)o->peer, "-m", (char *)o->model, "-p", prompts, "-n", steps, "-r", reps,
                      "-t", threads, "-o", "json", NULL};
    add_kv_type(o, argv, "1");
    if (bench_peer_run_program(o, o->peer, argv, peer_parse, pr, pr->error, sizeof pr->error, &pr->seconds) != 0) return;
    if (depths[0]) {
        char *dargv[22] = {(char *)o->peer, "-m", (char *)o->model, "-p", "0", "-n", steps, "-d", depths, "-r", reps,
                           "-t", threads, "-o", "json", NULL};
        add_kv_type(o, dargv, "1");
        if (bench_peer_run_program(o, o->peer, dargv, peer_parse, pr, pr->error, sizeof pr->error, &pr->seconds) != 0) return;
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
        double pl = bench_peer_field(p, end, "pl"), tg = bench_peer_field(p, end, "speed_tg");
        for (int i = 0; i < o->n_sessions; i++)
            if (tg > 0 && (double)o->sessions[i] == pl) pr->sessions[i] = tg, found++;
        p = end + 1;
    }
    return found;
}

/* `PATH -m MODEL -c CTX -b 2048 -ub 512 -npp 1 -ntg TOKENS -npl SESSIONS -t THREADS --output-format
 * jsonl`: that many sequences, each a 1-token prompt then TOKENS decoded together, as --sessions */
void bench_peer_run_batched(const bench_opts *o, bench_peer *pr) {
    char npl[160] = "", ntg[16], ctx[24], threads[24];
    int most = 1;
    for (int i = 0; i < o->n_sessions; i++) {
        size_t l = strlen(npl);
        snprintf(npl + l, sizeof npl - l, "%s%d", i ? "," : "", o->sessions[i]);
        if (o->sessions[i] > most) most = o->sessions[i];
    }
    long nt = o->threads ? o->threads : bench_online_cpus();
    snprintf(ntg, sizeof ntg, "%d", o->session_tokens);
    snprintf(ctx, sizeof ctx, "%d", most * (o->session_tokens + 1) + 16);
    snprintf(threads, sizeof threads, "%ld", nt > 0 ? nt : 1);
    char *argv[28] = {(char *)o->peer_batched, "-m", (char *)o->model, "-c", ctx, "-b", "2048", "-ub", "512", "-npp", "1",
                      "-ntg", ntg, "-npl", npl, "-t", threads, "--output-format", "jsonl", NULL};
    add_kv_type(o, argv, "on");
    if (bench_peer_run_program(o, o->peer_batched, argv, batched_parse, pr, pr->batched_error, sizeof pr->batched_error,
                      &pr->batched_seconds) == 0)
        pr->batched_ran = 1;
}

/* each figure of the two runs: their mean where both reported it, else not reported */
static void bracket(double *mean, double run[2][BENCH_MAX_SIZES], const double *after, int n) {
    for (int i = 0; i < n; i++) {
        run[0][i] = mean[i];
        run[1][i] = after[i];
        mean[i] = mean[i] > 0 && after[i] > 0 ? 0.5 * (mean[i] + after[i]) : 0.0;
    }
}

void bench_peer_bracket(bench_peer *pr, const bench_peer *after) {
    if (pr->ran) {
        if (after->ran) {
            bracket(pr->prompt, pr->prompt_run, after->prompt, BENCH_MAX_SIZES);
            bracket(pr->decode, pr->decode_run, after->decode, BENCH_MAX_SIZES);
            pr->runs = 2;
        } else {
            pr->ran = 0;
            snprintf(pr->error, sizeof pr->error, "its run after kvgen's: %.400s", after->error);
        }
        pr->seconds += after->seconds;
    }
    if (pr->batched_ran) {
        if (after->batched_ran) {
            bracket(pr->sessions, pr->sessions_run, after->sessions, BENCH_MAX_SIZES);
            pr->batched_runs = 2;
        } else {
            pr->batched_ran = 0;
            snprintf(pr->batched_error, sizeof pr->batched_error, "its run after kvgen's: %.400s", after->batched_error);
        }
        pr->batched_seconds += after->batched_seconds;
    }
}
