/* bench_embed.c: `kvgen bench MODEL --embed`: sentence embeddings per second (kvgen_embed) on a
 * fixed set of texts, in calls of --batch texts each, and, with --peer-embedding, llama.cpp's
 * llama-embedding on the same file and texts in the same invocation, with the kvgen/peer ratio.
 *
 * kvgen: the model is loaded once; each repetition embeds all the texts, --batch texts per
 * kvgen_embed call, and counts texts / wall seconds of those calls.
 *
 * llama-embedding loads its model on every run, so its figure is a difference of two runs:
 * one with every text and one with the first text alone, both timed by the wall clock; texts/s
 * is (texts - 1) / (seconds of the first - seconds of the second), which leaves out the load,
 * the context's creation and the process's start and exit. Its batch size is its context and
 * batch size (-c, -b, -ub, all the same for an encoder): the most tokens of --batch consecutive
 * texts (tokenized by kvgen with the same vocabulary, plus 2 per text) rounded up to a multiple
 * of 256, so each of its batches holds at least --batch texts (no -np: llama-embedding then
 * shares one context among all the sequences, so any text may use the whole -c). */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "bench_internal.h"

#define EMBED_TEXTS 64
#define EMBED_SENTENCES 16

/* sentences of similar length; text i joins two of them, so every text is 20 to 40 tokens */
static const char *const embed_sentences[EMBED_SENTENCES] = {
    "The lighthouse keeper climbed the spiral stairs every evening at dusk.",
    "Fishing boats returned to the harbour with their lanterns swaying over grey water.",
    "The village lights came on one by one along the narrow coastal road.",
    "He wrote the weather in the log: wind from the north-west and a falling glass.",
    "Fog was likely before midnight, so he trimmed the wick of the great lamp.",
    "The clockwork that turned the lens needed winding twice during the night.",
    "A cup of tea kept him company while the gulls settled on the rocks below.",
    "The train to the city leaves from platform four at a quarter past seven.",
    "Fresh bread and strong coffee are served in the station cafe every morning.",
    "Researchers measured the speed of the new memory chips under heavy load.",
    "The library keeps its oldest maps in a cool room without any windows.",
    "Children ran across the park chasing a red kite in the afternoon wind.",
    "The recipe calls for two eggs, a cup of flour and a pinch of salt.",
    "Heavy rain flooded the market square and closed the bridge for a day.",
    "The orchestra tuned their instruments while the audience found their seats.",
    "A small cat slept on the warm stones of the garden wall all afternoon.",
};

static void embed_text(int i, char *buf, size_t size) {
    snprintf(buf, size, "%s %s", embed_sentences[i % EMBED_SENTENCES],
             embed_sentences[(i * 7 + 3 + i / EMBED_SENTENCES) % EMBED_SENTENCES]);
}

/* llama-embedding's `--embd-output-format json`: one object per text, each with "embedding" */
static int embed_peer_parse(const char *text, const bench_opts *o, bench_peer *pr) {
    (void)o;
    (void)pr;
    int found = 0;
    for (const char *p = text; (p = strstr(p, "\"embedding\":")) != NULL; p++) found++;
    return found;
}

/* one run of llama-embedding on the first n texts (in file, one a line) with context/batch ctx */
static int embed_peer_once(const bench_opts *o, const char *file, int ctx, char *error, size_t size,
                           double *seconds) {
    char cs[24], threads[24];
    long nt = o->threads ? o->threads : bench_online_cpus();
    snprintf(cs, sizeof cs, "%d", ctx);
    snprintf(threads, sizeof threads, "%ld", nt > 0 ? nt : 1);
    char *argv[] = {(char *)o->peer_embedding, "-m", (char *)o->model, "-f", (char *)file, "-c", cs, "-b", cs,
                    "-ub", cs, "-fit", "off", "-t", threads, "--pooling", "mean", "--embd-normalize", "2",
                    "--embd-output-format", "json", NULL};
    bench_peer pr;
    memset(&pr, 0, sizeof pr);
    return bench_peer_run_program(o, o->peer_embedding, argv, embed_peer_parse, &pr, error, size, seconds);
}

static int write_texts(const char *path, int n) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    char t[256];
    for (int i = 0; i < n; i++) {
        embed_text(i, t, sizeof t);
        fprintf(f, "%s\n", t);
    }
    return fclose(f) == 0 ? 0 : -1;
}

int bench_embed_run(const bench_opts *o) {
    kvgen_error err = {0};
    kvgen_model *m = NULL;
    kvgen_backend backend = KVGEN_BACKEND_CPU;
    if (o->n_backends > 0) backend = o->backends[0];
    for (int i = 0; i < o->n_backends; i++)
        if (o->backends[i] == KVGEN_BACKEND_CPU) backend = KVGEN_BACKEND_CPU;
    const kvgen_backend_info *bi = bench_backend_info(backend);
    const char *bname = bi ? bi->name : "?";
    double load0 = bench_load_average();
    kvgen_model_desc md = {.path = o->model, .backend = backend, .device = o->device, .n_threads = o->threads,
                           .activation_bits = o->activation_bits};
    double t_load = bench_now_s();
    if (kvgen_model_load(&md, &m, &err) != KVGEN_OK) {
        fprintf(stderr, "kvgen bench: %s\n", err.message);
        return 1;
    }
    double load_s = bench_now_s() - t_load;
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    int n = EMBED_TEXTS, rc = 0;
    char texts_buf[EMBED_TEXTS][256];
    const char *texts[EMBED_TEXTS];
    int tokens[EMBED_TEXTS];
    for (int i = 0; i < n; i++) {
        embed_text(i, texts_buf[i], sizeof texts_buf[i]);
        texts[i] = texts_buf[i];
        int32_t ids[256];
        size_t got = 0;
        tokens[i] = kvgen_tokenize(m, texts[i], strlen(texts[i]), KVGEN_TOKENIZE_ADD_BOS, ids, 256, &got, &err) ==
                            KVGEN_OK
                        ? (int)got + 2
                        : 64;
    }
    float *out = malloc((size_t)n * (size_t)info.n_embd * sizeof *out);
    if (!out) {
        fprintf(stderr, "kvgen bench: out of memory for %d embeddings\n", n);
        kvgen_model_unload(m);
        return 1;
    }
    bench_stats ks[BENCH_MAX_SIZES];
    memset(ks, 0, sizeof ks);
    /* warm-up: one call of the largest batch */
    if (kvgen_embed(m, texts, NULL, (size_t)n, NULL, out, (size_t)n * (size_t)info.n_embd, &err) != KVGEN_OK) {
        fprintf(stderr, "kvgen bench: kvgen_embed: %s\n", err.message);
        free(out);
        kvgen_model_unload(m);
        return 1;
    }
    for (int b = 0; b < o->n_batches && rc == 0; b++) {
        int bs = o->batches[b];
        for (int r = 0; r < o->reps && rc == 0; r++) {
            double t0 = bench_now_s();
            for (int i = 0; i < n && rc == 0; i += bs) {
                size_t k = (size_t)(n - i < bs ? n - i : bs);
                if (kvgen_embed(m, texts + i, NULL, k, NULL, out + (size_t)i * (size_t)info.n_embd,
                                k * (size_t)info.n_embd, &err) != KVGEN_OK) {
                    fprintf(stderr, "kvgen bench: kvgen_embed: %s\n", err.message);
                    rc = 1;
                }
            }
            bench_stats_add(&ks[b], n, bench_now_s() - t0);
        }
        bench_stats_finish(&ks[b]);
    }
    free(out);
    kvgen_model_unload(m);
    if (rc) return rc;

    /* the peer, after kvgen, on the same file and texts */
    double peer_ts[BENCH_MAX_SIZES] = {0};
    char peer_error[512] = "";
    if (o->peer_embedding) {
        char all[] = "/tmp/kvgen-embed-all-XXXXXX", one[] = "/tmp/kvgen-embed-one-XXXXXX";
        int fa = mkstemp(all), fo = mkstemp(one);
        if (fa >= 0) close(fa);
        if (fo >= 0) close(fo);
        if (fa < 0 || fo < 0 || write_texts(all, n) != 0 || write_texts(one, 1) != 0) {
            snprintf(peer_error, sizeof peer_error, "cannot write the texts' file in /tmp");
        } else if (access(o->peer_embedding, X_OK) != 0) {
            snprintf(peer_error, sizeof peer_error, "%s: not found or not executable (--peer-embedding wants the path "
                     "of llama.cpp's llama-embedding)", o->peer_embedding);
        } else {
            for (int b = 0; b < o->n_batches && !peer_error[0]; b++) {
                int bs = o->batches[b], ctx = 0;
                for (int i = 0; i < n; i += bs) {
                    int sum = 0;
                    for (int j = i; j < n && j < i + bs; j++) sum += tokens[j];
                    if (sum > ctx) ctx = sum;
                }
                /* the llama-embedding at hand aborts on a context that is not a multiple of 256; with
                 * 256 its batches of short texts hold several (see docs/c-api.md) */
                ctx = (ctx + 255) / 256 * 256;
                double samples[BENCH_MAX_REPS];
                for (int r = 0; r < o->reps && !peer_error[0]; r++) {
                    double t_all = 0, t_one = 0;
                    if (embed_peer_once(o, all, ctx, peer_error, sizeof peer_error, &t_all) != 0 ||
                        embed_peer_once(o, one, ctx, peer_error, sizeof peer_error, &t_one) != 0)
                        break;
                    samples[r] = t_all > t_one ? (n - 1) / (t_all - t_one) : 0;
                }
                if (!peer_error[0]) {
                    qsort(samples, (size_t)o->reps, sizeof samples[0], bench_cmp_double);
                    peer_ts[b] = samples[o->reps / 2];
                }
            }
        }
        if (fa >= 0) remove(all);
        if (fo >= 0) remove(one);
        if (peer_error[0]) rc = 1;
    }

    int tmin = tokens[0], tmax = tokens[0];
    for (int i = 1; i < n; i++) {
        if (tokens[i] < tmin) tmin = tokens[i];
        if (tokens[i] > tmax) tmax = tokens[i];
    }
    double load1 = bench_load_average();
    printf("kvgen bench --embed: %s, %d texts (%d to %d tokens), %s backend, %d threads, %d reps, load %.2fs\n",
           o->model, n, tmin - 2, tmax - 2, bname,
           o->threads ? o->threads : (int)bench_online_cpus(), o->reps, load_s);
    printf("%-12s %14s %10s %10s", "texts/call", "kvgen texts/s", "min", "max");
    if (o->peer_embedding) printf(" %18s %12s", "llama-embedding", "kvgen/peer");
    printf("\n");
    for (int b = 0; b < o->n_batches; b++) {
        printf("%-12d %14.1f %10.1f %10.1f", o->batches[b], ks[b].median, ks[b].min, ks[b].max);
        if (o->peer_embedding) {
            if (peer_ts[b] > 0) printf(" %18.1f %11.2fx", peer_ts[b], ks[b].median / peer_ts[b]);
            else printf(" %18s %12s", "-", "-");
        }
        printf("\n");
    }
    if (peer_error[0]) printf("peer llama-embedding: %s\n", peer_error);
    if (load0 >= 0 && load1 >= 0) printf("load average %.2f before, %.2f after\n", load0, load1);
    return rc;
}
