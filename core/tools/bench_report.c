/* bench_report.c: what `kvgen bench` prints and writes once every backend has run: the table
 * (tokens/s, median [min-max]), each backend's ratio to the reference, the forks line, the probe
 * and decode-ceiling (roofline) lines, the peers' tables, and the JSON file that
 * scripts/plot_bench.py and test_bench read (docs/bench.json is an example). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include "bench_internal.h"
#include "kvg_json.h"

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
    /* each later --kv-type over the first, on the same backend */
    for (int i = 0; i < n; i++) {
        const bench_result *b = &res[i], *base = b->kv_base >= 0 ? &res[b->kv_base] : NULL;
        if (!base) continue;
        if (b->ok && base->ok && pick(b, arg)->n && pick(base, arg)->n && pick(base, arg)->median > 0)
            printf("  %.2fx", pick(b, arg)->median / pick(base, arg)->median);
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

static const bench_stats *pick_sessions_lora(const bench_result *r, const void *arg) {
    return &r->sessions_lora[*(const int *)arg];
}
/* one session's aggregate tokens/s (the --sessions ratio's base; the list always holds 1) */
static double session_base(const bench_opts *o, const bench_result *r) {
    for (int k = 0; k < o->n_sessions; k++)
        if (o->sessions[k] == 1) return r->sessions[k].median;
    return 0;
}

/* the peer tables: a header naming the peer's column, each backend's ratio column and, when the
 * peer ran on both sides of kvgen's measurements, its two runs */
static void peer_header(const char *column, const bench_result *res, int n, int runs) {
    printf("%-28s  %-12s", "test", column);
    for (int i = 0; i < n; i++)
        if (res[i].ok) printf("  %s/peer", res[i].name);
    if (runs == 2) printf("  peer's runs before / after kvgen's");
    printf("\n");
}

/* a row: the label (a format with one number), the peer's tokens/s (run: its two runs', or
 * NULL), and each backend's median (its stats at index k of the array at offset `field` of
 * bench_result) over it */
static void peer_row(const char *fmt, int value, double peer, const double run[2][BENCH_MAX_SIZES],
                     const bench_result *res, int n, size_t field, int k) {
    char label[64];
    snprintf(label, sizeof label, fmt, value);
    printf("%-28s  %-12.1f", label, peer);
    for (int i = 0; i < n; i++) {
        if (!res[i].ok) continue;
        const bench_stats *st = (const bench_stats *)((const char *)&res[i] + field) + k;
        printf("  %*.2fx", (int)strlen(res[i].name) + 4, peer > 0 ? st->median / peer : 0.0);
    }
    if (run) printf("  %.1f / %.1f", run[0][k], run[1][k]);
    printf("\n");
}

static void print_peer_batched(const bench_opts *o, const bench_result *res, int n, const bench_peer *peer) {
    if (!o->peer_batched || o->n_sessions == 0) return;
    if (!peer->batched_ran) {
        printf("\npeer llama-batched-bench: not measured: %s\n", peer->batched_error);
        return;
    }
    printf("\npeer llama-batched-bench (%s), same file, this invocation (%.1f s): aggregate decode tokens/s%s\n",
           o->peer_batched, peer->batched_seconds,
           peer->batched_runs == 2 ? ", the mean of a run before kvgen's and one after" : "");
    peer_header("batched", res, n, peer->batched_runs);
    for (int k = 0; k < o->n_sessions; k++)
        peer_row("%d sessions at once", o->sessions[k], peer->sessions[k],
                 peer->batched_runs == 2 ? peer->sessions_run : NULL, res, n, offsetof(bench_result, sessions), k);
}

void bench_report_print(const bench_opts *o, const bench_result *res, int n, const bench_model *bm,
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
    for (int i = 0; i < n; i++)
        if (res[i].kv_base >= 0) printf("  %s/%s", res[i].name, res[res[i].kv_base].name);
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
        if (o->n_adapters) {
            snprintf(label, sizeof label, "  with %d adapter%s", o->n_adapters, o->n_adapters > 1 ? "s" : "");
            print_row(label, res, n, pick_sessions_lora, &k);
            printf("%-28s", "  adapters / none");
            for (int i = 0; i < n; i++) {
                char buf[32] = "-";
                if (res[i].ok && res[i].sessions_lora[k].n && res[i].sessions[k].median > 0)
                    snprintf(buf, sizeof buf, "%.2fx", res[i].sessions_lora[k].median / res[i].sessions[k].median);
                printf("  %-24s", buf);
            }
            printf("\n");
        }
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
        if (!r->ok) continue;
        printf("%s: load %.2f s", r->name, r->load_s);
        if (r->rss_after > 0)
            printf("; resident memory %.1f MB after it (%+.1f MB; weights %.1f MB)", r->rss_after / 1e6,
                   ((double)r->rss_after - (double)r->rss_before) / 1e6, bm->weight_bytes / 1e6);
        printf("\n");
    }

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
    const kvgen_backend_info *known;
    int n_known = bench_backends(&known);
    for (int i = 0; i < n_known; i++)
        if (!known[i].available)
            printf("%s: this kvgen was built without the %s backend (%s)\n", known[i].name, known[i].name,
                   known[i].missing ? known[i].missing : "?");

    print_peer_batched(o, res, n, peer);
    if (!o->peer) return;
    if (!peer->ran) {
        printf("\npeer llama-bench: not measured: %s\n", peer->error);
        return;
    }
    printf("\npeer llama-bench (%s), same file, this invocation (%.1f s): threads as kvgen's host backends%s\n",
           o->peer, peer->seconds, peer->runs == 2 ? "; the mean of a run before kvgen's and one after" : "");
    if (peer->backends[0])
        printf("peer's backends: %s%s%s\n", peer->backends, peer->device[0] ? ", on " : "", peer->device);
    peer_header("llama-bench", res, n, peer->runs);
    const double(*pr)[BENCH_MAX_SIZES] = peer->runs == 2 ? peer->prompt_run : NULL;
    const double(*dr)[BENCH_MAX_SIZES] = peer->runs == 2 ? peer->decode_run : NULL;
    for (int k = 0; k < o->n_prompts; k++)
        peer_row("prompt %d tokens", o->prompts[k], peer->prompt[k], pr, res, n, offsetof(bench_result, prompt), k);
    for (int k = 0; k < o->n_depths; k++)
        peer_row("decode at depth %d", o->depths[k], peer->decode[k], dr, res, n, offsetof(bench_result, decode), k);
}

/* ---- JSON: the text goes into a buffer (kvg_json's writers quote strings and write numbers),
 * then into the file at once ---- */

void bench_json_text(bench_json *j, const char *fmt, ...) {
    char t[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof t || !kvg_buf_add(&j->b, t, (size_t)n)) j->failed = 1;
}

void bench_json_string(bench_json *j, const char *s) {
    if (kvg_json_write_string(&j->b, s, strlen(s)) != 0) j->failed = 1;
}

void bench_json_number(bench_json *j, double v) {
    if (kvg_json_write_number(&j->b, v) != 0) j->failed = 1;
}

int bench_json_save(bench_json *j, const char *path) {
    int rc = 0;
    FILE *f = j->failed ? NULL : fopen(path, "w");
    if (j->failed) {
        fprintf(stderr, "kvgen bench: %s: out of memory for the JSON text\n", path);
        rc = 1;
    } else if (!f) {
        fprintf(stderr, "kvgen bench: %s: cannot open for writing: %s\n", path, strerror(errno));
        rc = 1;
    } else {
        size_t n = j->b.n;
        int bad = n > 0 && fwrite(j->b.p, 1, n, f) != n;
        if (fclose(f) != 0 || bad) {
            fprintf(stderr, "kvgen bench: %s: write failed\n", path);
            rc = 1;
        }
    }
    kvg_free(j->b.p);
    *j = (bench_json){{0}, 0};
    return rc;
}

static void json_stats(bench_json *f, const bench_stats *s) {
    bench_json_text(f, "{\"median\": ");
    bench_json_number(f, s->median);
    bench_json_text(f, ", \"min\": ");
    bench_json_number(f, s->min);
    bench_json_text(f, ", \"max\": ");
    bench_json_number(f, s->max);
    bench_json_text(f, ", \"mean\": ");
    bench_json_number(f, s->mean);
    bench_json_text(f, ", \"stddev\": ");
    bench_json_number(f, s->stddev);
    bench_json_text(f, ", \"samples\": [");
    for (int i = 0; i < s->n; i++) {
        if (i) bench_json_text(f, ", ");
        bench_json_number(f, s->samples[i]);
    }
    bench_json_text(f, "]}");
}

/* a peer's two runs (before and after kvgen's) of each figure: "KIND_N_runs": [before, after] */
static void json_runs(bench_json *f, const char *kind, const int *sizes, int n_sizes, int runs,
                      const double run[2][BENCH_MAX_SIZES]) {
    if (runs != 2) return;
    for (int k = 0; k < n_sizes; k++) {
        bench_json_text(f, ", \"%s_%d_runs\": [", kind, sizes[k]);
        bench_json_number(f, run[0][k]);
        bench_json_text(f, ", ");
        bench_json_number(f, run[1][k]);
        bench_json_text(f, "]");
    }
}

int bench_report_write_json(const bench_opts *o, const bench_result *res, int n, const bench_model *bm,
                            const bench_peer *peer, double load0, double load1) {
    bench_json json = {{0}, 0}, *f = &json;
    bench_json_text(f, "{\n  \"kvgen_version\": ");
    bench_json_string(f, kvgen_version());
    bench_json_text(f, ",\n  \"model\": {\"path\": ");
    bench_json_string(f, o->model);
    bench_json_text(f, ", \"name\": ");
    bench_json_string(f, bm->name);
    bench_json_text(f, ", \"n_params\": %llu, \"weight_bytes\": %llu, \"n_layer\": %d, \"n_embd\": %d, \"n_vocab\": %d},\n",
            (unsigned long long)bm->n_params, (unsigned long long)bm->weight_bytes, bm->n_layer, bm->n_embd, bm->n_vocab);
    bench_json_text(f, "  \"settings\": {\"reps\": %d, \"decode_steps\": %d, \"no_cache_depth\": %d, \"no_cache_steps\": %d, "
            "\"quick\": %s, \"vulkan_built\": %s},\n",
            o->reps, o->steps, o->nc_depth, o->nc_steps, o->quick ? "true" : "false",
            bench_backend_info(KVGEN_BACKEND_VULKAN) && bench_backend_info(KVGEN_BACKEND_VULKAN)->available ? "true" : "false");
    bench_json_text(f, "  \"load_average\": {\"start\": ");
    bench_json_number(f, load0);
    bench_json_text(f, ", \"end\": ");
    bench_json_number(f, load1);
    bench_json_text(f, "},\n  \"backends\": [");
    for (int i = 0; i < n; i++) {
        const bench_result *r = &res[i];
        bench_json_text(f, "%s\n    {\"backend\": ", i ? "," : "");
        bench_json_string(f, r->name);
        if (r->kv_type) {
            bench_json_text(f, ", \"kv_type\": ");
            bench_json_string(f, r->kv_type);
        }
        bench_json_text(f, ", \"ok\": %s, \"seconds\": ", r->ok ? "true" : "false");
        bench_json_number(f, r->seconds);
        bench_json_text(f, ", \"load_seconds\": ");
        bench_json_number(f, r->load_s);
        bench_json_text(f, ", \"resident_bytes_after_load\": %llu, \"resident_bytes_before_load\": %llu", r->rss_after,
                        r->rss_before);
        if (!r->ok) {
            bench_json_text(f, ", \"error\": ");
            bench_json_string(f, r->error);
            bench_json_text(f, "}");
            continue;
        }
        bench_json_text(f, ", \"device\": ");
        bench_json_string(f, r->device);
        bench_json_text(f, ", \"deepest_cache_restored\": %s", r->filled_by_restore ? "true" : "false");
        bench_json_text(f, ",\n     \"prompt\": [");
        for (int k = 0; k < o->n_prompts; k++) {
            bench_json_text(f, "%s\n       {\"tokens\": %d, \"tok_s\": ", k ? "," : "", o->prompts[k]);
            json_stats(f, &r->prompt[k]);
            bench_json_text(f, "}");
        }
        bench_json_text(f, "],\n     \"decode\": [");
        for (int k = 0; k < o->n_depths; k++) {
            bench_json_text(f, "%s\n       {\"depth\": %d, \"steps\": %d, \"tok_s\": ", k ? "," : "", o->depths[k], o->steps);
            json_stats(f, &r->decode[k]);
            bench_json_text(f, "}");
        }
        bench_json_text(f, "]");
        if (o->nc_depth > 0) {
            bench_json_text(f, ",\n     \"no_cache\": {\"depth\": %d, \"steps\": %d, \"tok_s\": ", o->nc_depth, o->nc_steps);
            json_stats(f, &r->nc);
            bench_json_text(f, ", \"cached_tok_s\": ");
            json_stats(f, &r->nc_cached);
            bench_json_text(f, ", \"cached_over_no_cache\": ");
            bench_json_number(f, r->nc.median > 0 ? r->nc_cached.median / r->nc.median : 0);
            bench_json_text(f, "}");
            /* every depth: per-token cost with and without the cache against context length */
            bench_json_text(f, ",\n     \"no_cache_curve\": [");
            for (int k = 0; k < o->n_nc; k++) {
                bench_json_text(f, "%s\n       {\"depth\": %d, \"steps\": %d, \"tok_s\": ", k ? "," : "", o->nc_depths[k],
                        o->nc_steps);
                json_stats(f, &r->nc_curve[k]);
                bench_json_text(f, ", \"cached_tok_s\": ");
                json_stats(f, &r->nc_curve_cached[k]);
                bench_json_text(f, "}");
            }
            bench_json_text(f, "]");
        }
        if (o->n_sessions) {
            double one = session_base(o, r);
            bench_json_text(f, ",\n     \"sessions\": [");
            for (int k = 0; k < o->n_sessions; k++) {
                bench_json_text(f, "%s\n       {\"sessions\": %d, \"tokens_each\": %d, \"tok_s\": ", k ? "," : "",
                        o->sessions[k], o->session_tokens);
                json_stats(f, &r->sessions[k]);
                bench_json_text(f, ", \"ratio_to_1\": ");
                bench_json_number(f, one > 0 ? r->sessions[k].median / one : 0);
                if (r->sessions_lora[k].n) {
                    bench_json_text(f, ", \"adapters\": %d, \"with_adapters_tok_s\": ", o->n_adapters);
                    json_stats(f, &r->sessions_lora[k]);
                    bench_json_text(f, ", \"adapters_ratio\": ");
                    bench_json_number(f, r->sessions[k].median > 0 ? r->sessions_lora[k].median / r->sessions[k].median
                                                                   : 0);
                }
                bench_json_text(f, "}");
            }
            bench_json_text(f, "]");
        }
        if (o->forks) {
            bench_json_text(f, ",\n     \"forks\": {\"sessions\": %d, \"prompt_tokens\": %d, \"fork_s\": ", o->n_forks,
                    o->fork_prompt);
            bench_json_number(f, r->fork_s);
            bench_json_text(f, ", \"pages_used\": %zu, \"scratch_one_s\": ", r->fork_pages);
            bench_json_number(f, r->scratch_one_s);
            bench_json_text(f, ", \"scratch_s_estimated\": ");
            bench_json_number(f, r->scratch_one_s * o->n_forks);
            bench_json_text(f, ", \"scratch_over_fork\": ");
            bench_json_number(f, r->fork_s > 0 ? r->scratch_one_s * o->n_forks / r->fork_s : 0);
            bench_json_text(f, "}");
        }
        {
            bench_json_text(f, ",\n     \"probe\": ");
            if (r->have_probe) {
                double ceil = ceiling_tok_s(r, bm);
                bench_json_text(f, "{\"device\": ");
                bench_json_string(f, r->probe_device);
                bench_json_text(f, ", \"read_gbps\": ");
                bench_json_number(f, r->probe_gbps);
                bench_json_text(f, ", \"read_gbps_runs\": [");
                for (int k = 0; k < r->n_probe_runs; k++) {
                    if (k) bench_json_text(f, ", ");
                    bench_json_number(f, r->probe_gbps_runs[k]);
                }
                bench_json_text(f, "]");
                if (r->uses_device) {
                    bench_json_text(f, ", \"dispatch_us\": ");
                    bench_json_number(f, r->probe_us);
                }
                bench_json_text(f, ", \"bytes\": %llu, \"decode_ceiling_tok_s\": ", r->probe_bytes);
                bench_json_number(f, ceil);
                bench_json_text(f, ", \"decode_pct_of_ceiling\": [");
                for (int k = 0; k < o->n_depths; k++) {
                    bench_json_text(f, "%s{\"depth\": %d, \"pct\": ", k ? ", " : "", o->depths[k]);
                    bench_json_number(f, ceil > 0 ? 100.0 * r->decode[k].median / ceil : 0);
                    bench_json_text(f, "}");
                }
                bench_json_text(f, "]}");
            } else {
                bench_json_text(f, "{\"error\": ");
                bench_json_string(f, r->probe_note);
                bench_json_text(f, "}");
            }
        }
        bench_json_text(f, "}");
    }
    bench_json_text(f, "\n  ]");
    const bench_result *ref = find(res, n, KVGEN_BACKEND_REFERENCE);
    for (int i = 0; i < n; i++) {
        const bench_result *vk = &res[i]; /* each other backend over the reference */
        if (!ratio_column(res, n, vk)) continue;
        bench_json_text(f, ",\n  \"ratio_%s_over_reference\": {", vk->name);
        for (int k = 0; k < o->n_prompts; k++) {
            bench_json_text(f, "%s\"prompt_%d\": ", k ? ", " : "", o->prompts[k]);
            bench_json_number(f, ref->prompt[k].median > 0 ? vk->prompt[k].median / ref->prompt[k].median : 0);
        }
        for (int k = 0; k < o->n_depths; k++) {
            bench_json_text(f, ", \"decode_%d\": ", o->depths[k]);
            bench_json_number(f, ref->decode[k].median > 0 ? vk->decode[k].median / ref->decode[k].median : 0);
        }
        if (o->nc_depth > 0) {
            bench_json_text(f, ", \"decode_no_cache_%d\": ", o->nc_depth);
            bench_json_number(f, ref->nc.median > 0 ? vk->nc.median / ref->nc.median : 0);
        }
        bench_json_text(f, "}");
    }
    for (int i = 0; i < n; i++) { /* each later --kv-type over the first, on the same backend */
        const bench_result *r = &res[i], *base = r->kv_base >= 0 ? &res[r->kv_base] : NULL;
        if (!base || !r->ok || !base->ok) continue;
        bench_json_text(f, ",\n  \"ratio_%s_over_%s\": {", r->name, base->name);
        for (int k = 0; k < o->n_prompts; k++) {
            bench_json_text(f, "%s\"prompt_%d\": ", k ? ", " : "", o->prompts[k]);
            bench_json_number(f, base->prompt[k].median > 0 ? r->prompt[k].median / base->prompt[k].median : 0);
        }
        for (int k = 0; k < o->n_depths; k++) {
            bench_json_text(f, ", \"decode_%d\": ", o->depths[k]);
            bench_json_number(f, base->decode[k].median > 0 ? r->decode[k].median / base->decode[k].median : 0);
        }
        bench_json_text(f, "}");
    }
    if (o->peer) {
        bench_json_text(f, ",\n  \"peer\": {\"name\": \"llama-bench\", \"path\": ");
        bench_json_string(f, o->peer);
        bench_json_text(f, ", \"ran\": %s", peer->ran ? "true" : "false");
        if (!peer->ran) {
            bench_json_text(f, ", \"error\": ");
            bench_json_string(f, peer->error);
        } else {
            bench_json_text(f, ", \"seconds\": ");
            bench_json_number(f, peer->seconds);
            bench_json_text(f, ", \"backends\": ");
            bench_json_string(f, peer->backends);
            bench_json_text(f, ", \"device\": ");
            bench_json_string(f, peer->device);
            for (int k = 0; k < o->n_prompts; k++) {
                bench_json_text(f, ", \"prompt_%d_tok_s\": ", o->prompts[k]);
                bench_json_number(f, peer->prompt[k]);
            }
            for (int k = 0; k < o->n_depths; k++) {
                bench_json_text(f, ", \"decode_%d_tok_s\": ", o->depths[k]);
                bench_json_number(f, peer->decode[k]);
            }
            json_runs(f, "prompt", o->prompts, o->n_prompts, peer->runs, peer->prompt_run);
            json_runs(f, "decode", o->depths, o->n_depths, peer->runs, peer->decode_run);
            for (int i = 0; i < n; i++) {
                if (!res[i].ok) continue;
                bench_json_text(f, ", \"ratio_%s_over_peer\": {", res[i].name);
                for (int k = 0; k < o->n_prompts; k++) {
                    bench_json_text(f, "%s\"prompt_%d\": ", k ? ", " : "", o->prompts[k]);
                    bench_json_number(f, peer->prompt[k] > 0 ? res[i].prompt[k].median / peer->prompt[k] : 0);
                }
                for (int k = 0; k < o->n_depths; k++) {
                    bench_json_text(f, ", \"decode_%d\": ", o->depths[k]);
                    bench_json_number(f, peer->decode[k] > 0 ? res[i].decode[k].median / peer->decode[k] : 0);
                }
                bench_json_text(f, "}");
            }
        }
        bench_json_text(f, "}");
    }
    if (o->peer_batched && o->n_sessions > 0) {
        bench_json_text(f, ",\n  \"peer_batched\": {\"name\": \"llama-batched-bench\", \"path\": ");
        bench_json_string(f, o->peer_batched);
        bench_json_text(f, ", \"ran\": %s", peer->batched_ran ? "true" : "false");
        if (!peer->batched_ran) {
            bench_json_text(f, ", \"error\": ");
            bench_json_string(f, peer->batched_error);
        } else {
            bench_json_text(f, ", \"seconds\": ");
            bench_json_number(f, peer->batched_seconds);
            for (int k = 0; k < o->n_sessions; k++) {
                bench_json_text(f, ", \"sessions_%d_tok_s\": ", o->sessions[k]);
                bench_json_number(f, peer->sessions[k]);
            }
            json_runs(f, "sessions", o->sessions, o->n_sessions, peer->batched_runs, peer->sessions_run);
            for (int i = 0; i < n; i++) {
                if (!res[i].ok) continue;
                bench_json_text(f, ", \"ratio_%s_over_peer\": {", res[i].name);
                for (int k = 0; k < o->n_sessions; k++) {
                    bench_json_text(f, "%s\"sessions_%d\": ", k ? ", " : "", o->sessions[k]);
                    bench_json_number(f, peer->sessions[k] > 0 ? res[i].sessions[k].median / peer->sessions[k] : 0);
                }
                bench_json_text(f, "}");
            }
        }
        bench_json_text(f, "}");
    }
    bench_json_text(f, "\n}\n");
    return bench_json_save(f, o->json);
}
