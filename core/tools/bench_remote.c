/* bench_remote.c: `kvgen bench URL`, a model served over HTTP by an OpenAI-compatible server:
 * for each --sessions count, that many jobs at once, their aggregate tokens/s and kvgen's time on
 * the host thread per token; with --peer-remote, the same requests from a plain client taking
 * turns with kvgen (the server's load drifts), and the ratios. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_internal.h"

static int remote_peer_parse(const char *text, const bench_opts *o, bench_peer *pr) {
    (void)o;
    const char *end = text + strlen(text);
    pr->sessions[0] = bench_peer_field(text, end, "tokens");
    pr->sessions[1] = bench_peer_field(text, end, "seconds");
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
    double host = 0, t0 = bench_now_s();
    for (int i = 0; st == KVGEN_OK && i < n; i++) st = kvgen_session_create(m, NULL, &ss[i], err);
    for (int i = 0; st == KVGEN_OK && i < n; i++) {
        kvgen_job_desc d = {.prompt = KVGEN_PROMPT_TEXT, .text = "Once upon a time",
                            .gen = {.max_tokens = tokens, .ignore_eog = 1}};
        double a = bench_now_s();
        st = kvgen_job_submit(ss[i], &d, &jobs[i], err);
        host += bench_now_s() - a;
    }
    int left = st == KVGEN_OK ? n : 0;
    while (left > 0) { /* a frame loop: poll every job, then sleep a millisecond */
        left = 0;
        for (int i = 0; i < n; i++) {
            const char *text;
            size_t len;
            double a = bench_now_s();
            kvgen_job_state js = kvgen_job_poll(jobs[i], &text, &len);
            host += bench_now_s() - a;
            if (!bench_job_is_final(js)) left++;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    *seconds = bench_now_s() - t0;
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

int bench_remote_run(bench_opts *o) {
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
    bench_json json = {{0}, 0}, *jf = o->json ? &json : NULL;
    if (jf) {
        bench_json_text(jf, "{\"remote\": ");
        bench_json_string(jf, info.device);
        bench_json_text(jf, ", \"model\": ");
        bench_json_string(jf, info.name);
        bench_json_text(jf, ", \"tokens_per_session\": %d, \"rows\": [", tokens);
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
                    if (bench_peer_run_program(o, o->peer_remote, argv, remote_peer_parse, &pr, peer_error, sizeof peer_error,
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
        qsort(rates, (size_t)got, sizeof *rates, bench_cmp_double);
        double rate = rates[got / 2], us = tok_sum > 0 ? host_sum * 1e6 / tok_sum : 0, peer_rate = 0;
        printf("%-9d %12.1f %12.0f %16.2f", n, rate, toks, us);
        if (o->peer_remote && peer_got == reps) {
            qsort(peer_rates, (size_t)peer_got, sizeof *peer_rates, bench_cmp_double);
            peer_rate = peer_rates[peer_got / 2];
            printf(" %12.1f %7.2fx", peer_rate, rate / peer_rate);
        } else if (o->peer_remote) {
            printf(" failed: %s", peer_error);
            failed = 1;
        }
        printf("\n");
        if (jf) {
            bench_json_text(jf, "%s{\"sessions\": %d, \"tokens\": ", k ? ", " : "", n);
            bench_json_number(jf, toks);
            bench_json_text(jf, ", \"tok_s\": ");
            bench_json_number(jf, rate);
            bench_json_text(jf, ", \"host_us_per_token\": ");
            bench_json_number(jf, us);
            bench_json_text(jf, ", \"peer_tok_s\": ");
            bench_json_number(jf, peer_rate);
            bench_json_text(jf, "}");
        }
        fflush(stdout);
    }
    if (jf) {
        bench_json_text(jf, "]}\n");
        failed |= bench_json_save(jf, o->json);
    }
    kvgen_model_unload(m);
    return failed;
}
