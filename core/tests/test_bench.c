/* test_bench.c: `kvgen bench --quick` on a random model writes a table and a JSON file whose
 * every figure is present and positive (no timing is asserted: the machine is shared), for the
 * reference backend and, where a Vulkan device exists, for both backends with the probe;
 * `kvgen devices` lists what kvgen_devices reports; usage and load errors give exit 2 and 1; the
 * optional sections (--sessions, --forks) write their keys; --embed (sentence embeddings on a
 * random bert model) prints a row per --batch, and its peer's arguments, its ratio and a missing
 * peer's message are checked with a stand-in for llama-embedding. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "testutil.h"

static char bin[1024];

/* Mesa's lavapipe (22.3) leaves a few bytes from a pthread_once initialiser in its driver
 * library, which the Vulkan loader unloads at vkDestroyInstance; LeakSanitizer
 * (KVGEN_SANITIZE=ON) then reports them in every process that touched Vulkan, with a stack it
 * cannot unwind into the unloaded driver (so no suppression matches, and the slow unwinder
 * deadlocks in the driver's threads). So the runs that touch Vulkan run without leak
 * detection (the same code paths run leak-checked with the reference backend), and this
 * process asks for the device count in a child that leaves with _exit. */
#define NO_LEAK_CHECK "LSAN_OPTIONS=detect_leaks=0 "

/* kvgen_devices' count, from a child process; -1 on failure */
static int device_count(void) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        close(fd[0]);
        int count = -1;
        kvgen_error err = {0};
        if (kvgen_devices(NULL, 0, &count, &err) != KVGEN_OK) count = -1;
        ssize_t w = write(fd[1], &count, sizeof count);
        _exit(w == (ssize_t)sizeof count ? 0 : 1);
    }
    close(fd[1]);
    int count = -1;
    if (read(fd[0], &count, sizeof count) != (ssize_t)sizeof count) count = -1;
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? count : -1;
}

/* Runs `kvgen ARGS`; returns its exit status, and its stdout (malloc'd) when out is not NULL. */
static int run(const char *args, char **out) {
    size_t n = strlen(bin) + strlen(args) + 32;
    char *cmd = malloc(n);
    /* an environment assignment at the start of args goes before the program */
    const char *env = "";
    size_t env_len = 0;
    if (strncmp(args, NO_LEAK_CHECK, strlen(NO_LEAK_CHECK)) == 0) {
        env = NO_LEAK_CHECK;
        env_len = strlen(NO_LEAK_CHECK);
    }
    snprintf(cmd, n, "%s%s %s 2>/dev/null", env, bin, args + env_len);
    FILE *p = popen(cmd, "r");
    size_t cap = 1 << 16, len = 0;
    char *buf = calloc(1, cap);
    if (p) {
        size_t got;
        while (len + 1 < cap && (got = fread(buf + len, 1, cap - 1 - len, p)) > 0) len += got;
    }
    int status = p ? pclose(p) : -1;
    free(cmd);
    if (out) *out = buf;
    else free(buf);
    return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* ---- a small JSON reader: flattens a document into (path, value) leaves such as
 * "backends[0].prompt[1].tok_s.median" = 41162.7 ---- */

enum { J_NUM, J_STR, J_BOOL, J_NULL };

typedef struct leaf {
    char path[160];
    int type;
    double num;
    char str[160];
} leaf;

typedef struct jreader {
    const char *s;
    size_t i, n;
    int ok;
    leaf *leaves;
    int count, cap;
} jreader;

static void skip_ws(jreader *r) {
    while (r->i < r->n && isspace((unsigned char)r->s[r->i])) r->i++;
}

static leaf *add_leaf(jreader *r, const char *path, int type) {
    if (r->count == r->cap) {
        int cap = r->cap ? r->cap * 2 : 64;
        leaf *bigger = realloc(r->leaves, (size_t)cap * sizeof *bigger);
        if (!bigger) {
            r->ok = 0;
            return NULL;
        }
        r->leaves = bigger;
        r->cap = cap;
    }
    leaf *l = &r->leaves[r->count++];
    memset(l, 0, sizeof *l);
    snprintf(l->path, sizeof l->path, "%s", path);
    l->type = type;
    return l;
}

/* a string with JSON's escapes (a \u escape reads as '?') */
static int read_string(jreader *r, char *out, size_t size) {
    if (r->i >= r->n || r->s[r->i] != '"') return 0;
    r->i++;
    size_t k = 0;
    while (r->i < r->n && r->s[r->i] != '"') {
        char c = r->s[r->i++];
        if (c == '\\') {
            if (r->i >= r->n) return 0;
            c = r->s[r->i++];
            if (c == 'u') {
                if (r->i + 4 > r->n) return 0;
                r->i += 4;
                c = '?';
            } else if (c == 'n' || c == 't' || c == 'r' || c == 'b' || c == 'f') {
                c = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == 'b' ? '\b' : '\f';
            } else if (c != '"' && c != '\\' && c != '/') {
                return 0;
            }
        }
        if (k + 1 < size) out[k++] = c;
    }
    if (r->i >= r->n) return 0;
    r->i++;
    out[k] = 0;
    return 1;
}

static void read_value(jreader *r, const char *path, int depth) {
    skip_ws(r);
    if (!r->ok || r->i >= r->n || depth > 32) {
        r->ok = 0;
        return;
    }
    char c = r->s[r->i];
    char sub[160];
    if (c == '{' || c == '[') {
        r->i++;
        skip_ws(r);
        char close = c == '{' ? '}' : ']';
        if (r->i < r->n && r->s[r->i] == close) {
            r->i++;
            return;
        }
        for (int idx = 0; r->ok; idx++) {
            skip_ws(r);
            if (c == '{') {
                char key[96];
                if (!read_string(r, key, sizeof key)) {
                    r->ok = 0;
                    return;
                }
                skip_ws(r);
                if (r->i >= r->n || r->s[r->i] != ':') {
                    r->ok = 0;
                    return;
                }
                r->i++;
                int len = snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", key);
                if (len < 0 || (size_t)len >= sizeof sub) r->ok = 0;
            } else {
                int len = snprintf(sub, sizeof sub, "%s[%d]", path, idx);
                if (len < 0 || (size_t)len >= sizeof sub) r->ok = 0;
            }
            read_value(r, sub, depth + 1);
            skip_ws(r);
            if (r->i < r->n && r->s[r->i] == ',') {
                r->i++;
                continue;
            }
            if (r->i < r->n && r->s[r->i] == close) {
                r->i++;
                return;
            }
            r->ok = 0;
        }
    } else if (c == '"') {
        leaf *l = add_leaf(r, path, J_STR);
        if (!l || !read_string(r, l->str, sizeof l->str)) r->ok = 0;
    } else if (strncmp(r->s + r->i, "true", 4) == 0 || strncmp(r->s + r->i, "false", 5) == 0) {
        leaf *l = add_leaf(r, path, J_BOOL);
        if (l) l->num = c == 't';
        r->i += c == 't' ? 4 : 5;
    } else if (strncmp(r->s + r->i, "null", 4) == 0) {
        add_leaf(r, path, J_NULL);
        r->i += 4;
    } else {
        char *end;
        double v = strtod(r->s + r->i, &end);
        if (end == r->s + r->i) {
            r->ok = 0;
            return;
        }
        r->i = (size_t)(end - r->s);
        leaf *l = add_leaf(r, path, J_NUM);
        if (l) l->num = v;
    }
}

/* parses the whole text; 0 when it is not one well-formed JSON value */
static int json_read(const char *text, jreader *r) {
    memset(r, 0, sizeof *r);
    r->s = text;
    r->n = strlen(text);
    r->ok = 1;
    read_value(r, "", 0);
    skip_ws(r);
    return r->ok && r->i == r->n;
}

static const leaf *get(const jreader *r, const char *path) {
    for (int i = 0; i < r->count; i++)
        if (strcmp(r->leaves[i].path, path) == 0) return &r->leaves[i];
    return NULL;
}

/* the leaf at the printf-formatted path must be a number > 0 */
static double positive(const jreader *r, const char *fmt, ...)
#if defined(__GNUC__) && !defined(__MINGW32__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static double positive(const jreader *r, const char *fmt, ...) {
    char path[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(path, sizeof path, fmt, ap);
    va_end(ap);
    const leaf *l = get(r, path);
    CHECKF(l && l->type == J_NUM && l->num > 0, "%s: %s", path, !l ? "missing" : l->type != J_NUM ? "not a number" : "not > 0");
    return l && l->type == J_NUM ? l->num : 0;
}

static void expect_str(const jreader *r, const char *path, const char *want) {
    const leaf *l = get(r, path);
    CHECKF(l && l->type == J_STR && strcmp(l->str, want) == 0, "%s: want \"%s\", got %s", path, want,
           l && l->type == J_STR ? l->str : "(missing or not a string)");
}

static void expect_true(const jreader *r, const char *path) {
    const leaf *l = get(r, path);
    CHECKF(l && l->type == J_BOOL && l->num == 1, "%s: want true", path);
}

/* checks one backend's entry of a --quick run (prompts 8,32; depths 0,32,64; no-cache at 16) */
static void check_backend(const jreader *r, int b, const char *name) {
    char path[160];
    snprintf(path, sizeof path, "backends[%d].backend", b);
    expect_str(r, path, name);
    snprintf(path, sizeof path, "backends[%d].ok", b);
    expect_true(r, path);
    snprintf(path, sizeof path, "backends[%d].device", b);
    CHECKF(get(r, path) && get(r, path)->type == J_STR, "%s missing", path);
    const int prompts[] = {8, 32}, depths[] = {0, 32, 64};
    for (int k = 0; k < 2; k++) {
        CHECK(positive(r, "backends[%d].prompt[%d].tokens", b, k) == prompts[k]);
        double lo = positive(r, "backends[%d].prompt[%d].tok_s.min", b, k);
        double med = positive(r, "backends[%d].prompt[%d].tok_s.median", b, k);
        double hi = positive(r, "backends[%d].prompt[%d].tok_s.max", b, k);
        CHECKF(lo <= med && med <= hi, "%s prompt %d: min %g median %g max %g", name, prompts[k], lo, med, hi);
        positive(r, "backends[%d].prompt[%d].tok_s.samples[1]", b, k); /* --quick: 2 repetitions */
        snprintf(path, sizeof path, "backends[%d].prompt[%d].tok_s.samples[2]", b, k);
        CHECKF(get(r, path) == NULL, "%s: more samples than repetitions", path);
        snprintf(path, sizeof path, "backends[%d].prompt[%d].tok_s.stddev", b, k);
        CHECKF(get(r, path) && get(r, path)->type == J_NUM && get(r, path)->num >= 0, "%s", path);
    }
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "backends[%d].decode[%d].depth", b, k);
        CHECKF(get(r, path) && get(r, path)->num == depths[k], "%s: want %d", path, depths[k]);
        CHECK(positive(r, "backends[%d].decode[%d].steps", b, k) == 4);
        positive(r, "backends[%d].decode[%d].tok_s.median", b, k);
        positive(r, "backends[%d].decode[%d].tok_s.min", b, k);
    }
    CHECK(positive(r, "backends[%d].no_cache.depth", b) == 16);
    positive(r, "backends[%d].no_cache.tok_s.median", b);
    positive(r, "backends[%d].no_cache.cached_tok_s.median", b);
    positive(r, "backends[%d].no_cache.cached_over_no_cache", b);
    positive(r, "backends[%d].seconds", b);
}

/* the optional sections of a --quick run with --sessions 2 --forks (sessions 1 added) */
static void check_sections(const jreader *r, int b, const char *name) {
    CHECK(positive(r, "backends[%d].sessions[0].sessions", b) == 1);
    CHECK(positive(r, "backends[%d].sessions[1].sessions", b) == 2);
    CHECK(positive(r, "backends[%d].sessions[1].tokens_each", b) == 4);
    positive(r, "backends[%d].sessions[0].tok_s.median", b);
    positive(r, "backends[%d].sessions[1].tok_s.samples[1]", b);
    CHECKF(positive(r, "backends[%d].sessions[0].ratio_to_1", b) == 1, "%s: one session's ratio to itself", name);
    positive(r, "backends[%d].sessions[1].ratio_to_1", b);
    CHECK(positive(r, "backends[%d].forks.sessions", b) == 4);
    CHECK(positive(r, "backends[%d].forks.prompt_tokens", b) == 32);
    positive(r, "backends[%d].forks.fork_s", b);
    positive(r, "backends[%d].forks.pages_used", b);
    double one = positive(r, "backends[%d].forks.scratch_one_s", b);
    double est = positive(r, "backends[%d].forks.scratch_s_estimated", b);
    CHECKF(fabs(est - 4 * one) <= 1e-3 * est, "%s: the scratch estimate is one prefill x 4: %g vs %g", name, est, one);
    positive(r, "backends[%d].forks.scratch_over_fork", b);
}

static void check_common(const jreader *r) {
    positive(r, "model.weight_bytes");
    positive(r, "model.n_params");
    CHECK(positive(r, "model.n_layer") == 2);
    CHECK(positive(r, "settings.reps") == 2);
    CHECK(positive(r, "settings.decode_steps") == 4);
    expect_true(r, "settings.quick");
    CHECK(get(r, "peer") == NULL); /* a peer appears only when one was run */
}

/* --embed: its options, its table, and its peer (a stand-in for llama-embedding that takes longer
 * for more texts, so the difference of its two runs is positive) */
static void test_embed_mode(void) {
    char *bert = tu_make_model("bench-bert.gguf", "--arch bert --layers 1 --embd 32 --ff 64 --heads 2 --ctx 64");
    CHECK(bert != NULL);
    if (!bert) return;
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "bench %s --batch 4", bert);
    CHECK(run(args, NULL) == 2); /* --batch without --embed */
    snprintf(args, sizeof args, "bench %s --embed --batch 0", bert);
    CHECK(run(args, NULL) == 2);
    snprintf(args, sizeof args, "bench %s --embed --batch 1,65", bert);
    CHECK(run(args, NULL) == 2);
    snprintf(args, sizeof args, "bench %s --embed --reps 1 --threads 1", bert);
    int rc = run(args, &out);
    CHECKF(rc == 0, "kvgen %s: exit %d", args, rc);
    CHECKF(out && strstr(out, "texts/call") && strstr(out, "kvgen texts/s") && strstr(out, "\n1 ") &&
               strstr(out, "\n64 ") && !strstr(out, "llama-embedding"),
           "embed table:\n%s", out ? out : "");
    free(out);
    /* a peer that is not there: a clear message, exit 1, kvgen's figures still printed */
    snprintf(args, sizeof args, "bench %s --embed --reps 1 --batch 8 --peer-embedding /nonexistent/llama-embedding",
             bert);
    rc = run(args, &out);
    CHECKF(rc == 1, "kvgen %s: exit %d", args, rc);
    CHECKF(out && strstr(out, "not found or not executable") && strstr(out, "\n8 "), "missing peer:\n%s",
           out ? out : "");
    free(out);
    char *peer = tu_tmpfile("peer-embedding.sh"), *peer_args = tu_tmpfile("peer-embedding-args.txt");
    FILE *pf = fopen(peer, "w");
    CHECK(pf != NULL);
    if (pf) {
        fprintf(pf, "#!/bin/sh\necho \"$@\" >> '%s'\nn=$(wc -l < \"$4\")\n[ \"$n\" -gt 1 ] && sleep 0.2\n"
                    "i=0\nwhile [ $i -lt $n ]; do echo '{\"object\": \"embedding\", \"embedding\": [0.5,0.5]}'; "
                    "i=$((i+1)); done\n",
                peer_args);
        fclose(pf);
        chmod(peer, 0755);
    }
    remove(peer_args);
    snprintf(args, sizeof args, "bench %s --embed --reps 1 --threads 1 --batch 1,64 --peer-embedding %s", bert, peer);
    rc = run(args, &out);
    CHECKF(rc == 0, "kvgen %s: exit %d", args, rc);
    CHECKF(out && strstr(out, "llama-embedding") && strstr(out, "kvgen/peer") && strstr(out, "x\n"), "peer table:\n%s",
           out ? out : "");
    free(out);
    char *given = tu_read_file(peer_args, NULL);
    char want[2048];
    snprintf(want, sizeof want, "-m %s -f ", bert);
    CHECKF(given && strstr(given, want) && strstr(given, "-t 1 --pooling mean --embd-normalize 2"),
           "peer arguments: %s", given ? given : "(none)");
    free(given);
    free(peer);
    free(peer_args);
    free(bert);
}

int main(void) {
    const char *dir = getenv("KVGEN_BIN");
    snprintf(bin, sizeof bin, "%s/kvgen", dir && *dir ? dir : ".");
    char *model = tu_make_model("bench.gguf", "--seed 5 --layers 2 --embd 64 --heads 4 --kv-heads 2 --type Q8_0");
    CHECK(model != NULL);
    if (!model) return tu_finish("test_bench");
    char *json = tu_tmpfile("bench.json");
    char args[4096];

    /* usage errors exit 2, kvgen errors 1 */
    CHECK(run("bench", NULL) == 2);
    snprintf(args, sizeof args, "bench %s --reps 0", model);
    CHECK(run(args, NULL) == 2);
    snprintf(args, sizeof args, "bench %s --backend tpu", model);
    CHECK(run(args, NULL) == 2);
    snprintf(args, sizeof args, "bench %s --depths 0,x", model);
    CHECK(run(args, NULL) == 2);
    CHECK(run("bench /nonexistent/model.gguf --quick --backend reference", NULL) == 1);
    CHECK(run("devices --bogus", NULL) == 2);

    /* reference backend: table on stdout, every JSON figure present and positive */
    remove(json);
    char *out = NULL;
    snprintf(args, sizeof args, "bench %s --quick --backend reference --json %s", model, json);
    int rc = run(args, &out);
    CHECKF(rc == 0, "kvgen %s: exit %d", args, rc);
    CHECKF(strstr(out, "prompt 32 tokens") && strstr(out, "decode at depth 64") && strstr(out, "no cache"),
           "table:\n%s", out);
    CHECKF(!strstr(out, "peer llama-bench"), "a peer figure without --peer:\n%s", out);
    CHECKF(strstr(out, "reference: load "), "no load time:\n%s", out);
#if defined(__linux__)
    CHECKF(strstr(out, "resident memory"), "no resident memory after the load:\n%s", out);
#endif
    free(out);
    char *text = tu_read_file(json, NULL);
    CHECKF(text != NULL, "%s was not written", json);
    jreader r;
    if (text) {
        CHECKF(json_read(text, &r), "%s is not well-formed JSON:\n%s", json, text);
        check_common(&r);
        check_backend(&r, 0, "reference");
        CHECK(get(&r, "backends[1].backend") == NULL);
        positive(&r, "backends[0].load_seconds");
#if defined(__linux__)
        positive(&r, "backends[0].resident_bytes_after_load");
#endif
        /* a host backend's probe reads host memory: a bandwidth and a ceiling, no dispatch time */
        positive(&r, "backends[0].probe.read_gbps");
        positive(&r, "backends[0].probe.decode_ceiling_tok_s");
        CHECK(get(&r, "backends[0].probe.dispatch_us") == NULL);
        const leaf *pd = get(&r, "backends[0].probe.device");
        CHECKF(pd && strstr(pd->str, "host memory"), "probe device: %s", pd ? pd->str : "none");
        free(r.leaves);
        free(text);
    }

    /* --peer runs the named llama-bench on the same file, before kvgen's measurements and
     * again after, and reads its JSON. A stand-in that prints llama-bench's output format checks
     * the reading and the ratios (to the two runs' mean); the arguments it was given are checked
     * too (same file, prompt sizes, steps, repetitions) */
    char *peer = tu_tmpfile("peer-llama-bench.sh"), *peer_args = tu_tmpfile("peer-args.txt");
    FILE *pf = fopen(peer, "w");
    CHECK(pf != NULL);
    if (pf) {
        /* the decodes at depth come from a second run with -d (llama-bench's depth option); the
         * runs after kvgen's (the third and fourth calls) report a faster prompt of 8 and decode */
        fprintf(pf, "#!/bin/sh\necho \"$@\" >> '%s'\np8=100.5; d0=50.0\n[ $(wc -l < '%s') -gt 2 ] && p8=110.5 && d0=60.0\n"
                    "case \" $* \" in *\" -d \"*) cat <<'EOF'\n[\n"
                    "  {\"build_commit\": \"x\", \"n_prompt\": 0, \"n_gen\": 4, \"n_depth\": 32, \"avg_ts\": 40.0},\n"
                    "  {\"build_commit\": \"x\", \"n_prompt\": 0, \"n_gen\": 4, \"n_depth\": 64, \"avg_ts\": 30.0}\n]\n"
                    "EOF\n;; *) cat <<EOF\n[\n"
                    "  {\"build_commit\": \"x\", \"backends\": \"Vulkan\", \"gpu_info\": \"Stand-in GPU\","
                    " \"n_prompt\": 8, \"n_gen\": 0, \"n_depth\": 0, \"avg_ts\": $p8, \"samples_ts\": [100.0, 101.0]},\n"
                    "  {\"build_commit\": \"x\", \"n_prompt\": 32, \"n_gen\": 0, \"avg_ts\": 200.0},\n"
                    "  {\"build_commit\": \"x\", \"n_prompt\": 0, \"n_gen\": 4, \"avg_ts\": $d0}\n]\nEOF\n;; esac\n",
                peer_args, peer_args);
        fclose(pf);
        chmod(peer, 0755);
    }
    remove(json);
    remove(peer_args);
    snprintf(args, sizeof args, "bench %s --quick --backend reference --threads 1 --peer %s --json %s", model, peer,
             json);
    rc = run(args, &out);
    CHECKF(rc == 0, "kvgen %s: exit %d", args, rc);
    CHECKF(strstr(out, "peer llama-bench") && strstr(out, "reference/peer") && strstr(out, "100.5 / 110.5") &&
               strstr(out, "a run before kvgen's and one after") &&
               strstr(out, "peer's backends: Vulkan, on Stand-in GPU\n"),
           "peer table:\n%s", out);
    free(out);
    char *given = tu_read_file(peer_args, NULL);
    char want[2048], want_d[2048];
    snprintf(want, sizeof want, "-m %s -p 8,32 -n 4 -r 2 -t 1 -o json", model);
    snprintf(want_d, sizeof want_d, "-m %s -p 0 -n 4 -d 32,64 -r 2 -t 1 -o json", model);
    CHECKF(given && strstr(given, want), "peer arguments: %s (want %s)", given ? given : "(none)", want);
    CHECKF(given && strstr(given, want_d), "peer arguments: %s (want %s)", given ? given : "(none)", want_d);
    CHECKF(given && strstr(given, want) && strstr(strstr(given, want) + 1, want) &&
               strstr(strstr(given, want_d) + 1, want_d),
           "peer: not run twice: %s", given ? given : "(none)");
    free(given);
    text = tu_read_file(json, NULL);
    CHECKF(text != NULL, "%s was not written", json);
    if (text) {
        CHECKF(json_read(text, &r), "%s is not well-formed JSON:\n%s", json, text);
        expect_true(&r, "peer.ran");
        CHECKF(strstr(text, "\"backends\": \"Vulkan\", \"device\": \"Stand-in GPU\""), "peer's device:\n%s", text);
        CHECK(positive(&r, "peer.prompt_8_tok_s") == 105.5); /* (100.5 + 110.5) / 2 */
        CHECK(positive(&r, "peer.prompt_8_runs[0]") == 100.5 && positive(&r, "peer.prompt_8_runs[1]") == 110.5);
        CHECK(positive(&r, "peer.prompt_32_tok_s") == 200.0);
        CHECK(positive(&r, "peer.decode_0_tok_s") == 55.0);
        CHECK(positive(&r, "peer.decode_0_runs[0]") == 50.0 && positive(&r, "peer.decode_0_runs[1]") == 60.0);
        CHECK(positive(&r, "peer.decode_32_tok_s") == 40.0);
        CHECK(positive(&r, "peer.decode_64_tok_s") == 30.0);
        double r64 = positive(&r, "peer.ratio_reference_over_peer.decode_64");
        double m64 = positive(&r, "backends[0].decode[2].tok_s.median");
        CHECKF(fabs(r64 - m64 / 30.0) < 1e-3 * r64, "decode ratio at depth 64 %g, kvgen %g tok/s", r64, m64);
        double ratio = positive(&r, "peer.ratio_reference_over_peer.decode_0");
        double mine = positive(&r, "backends[0].decode[0].tok_s.median");
        CHECKF(fabs(ratio - mine / 55.0) < 1e-3 * ratio, "decode ratio %g, kvgen %g tok/s", ratio, mine);
        free(r.leaves);
        free(text);
    }
    /* --peer-batched runs llama-batched-bench with the --sessions counts and reads its jsonl */
    char *peerb = tu_tmpfile("peer-batched.sh"), *peerb_args = tu_tmpfile("peer-batched-args.txt");
    pf = fopen(peerb, "w");
    CHECK(pf != NULL);
    if (pf) {
        fprintf(pf, "#!/bin/sh\necho \"$@\" > '%s'\necho 'main: loading'\n"
                    "echo '{\"n_kv_max\": 64, \"pp\": 1, \"tg\": 4, \"pl\": 1, \"speed_pp\": 9.0, \"speed_tg\": 20.0}'\n"
                    "echo '{\"n_kv_max\": 64, \"pp\": 1, \"tg\": 4, \"pl\": 2, \"speed_pp\": 9.0, \"speed_tg\": 35.0}'\n",
                peerb_args);
        fclose(pf);
        chmod(peerb, 0755);
    }
    remove(json);
    snprintf(args, sizeof args, "bench %s --quick --backend reference --threads 1 --sessions 1,2 --peer-batched %s --json %s",
             model, peerb, json);
    rc = run(args, &out);
    CHECKF(rc == 0, "kvgen %s: exit %d", args, rc);
    CHECKF(out && strstr(out, "peer llama-batched-bench") && strstr(out, "2 sessions at once"), "batched table:\n%s",
           out ? out : "");
    free(out);
    given = tu_read_file(peerb_args, NULL);
    snprintf(want, sizeof want, "-m %s -c %d -b 2048 -ub 512 -npp 1 -ntg 4 -npl 1,2 -t 1 --output-format jsonl", model,
             2 * 5 + 16);
    CHECKF(given && strstr(given, want), "batched peer arguments: %s (want %s)", given ? given : "(none)", want);
    free(given);
    text = tu_read_file(json, NULL);
    if (text && json_read(text, &r)) {
        expect_true(&r, "peer_batched.ran");
        CHECK(positive(&r, "peer_batched.sessions_2_tok_s") == 35.0);
        CHECK(positive(&r, "peer_batched.sessions_2_runs[0]") == 35.0 && positive(&r, "peer_batched.sessions_2_runs[1]") == 35.0);
        double ratio = positive(&r, "peer_batched.ratio_reference_over_peer.sessions_2");
        double mine = positive(&r, "backends[0].sessions[1].tok_s.median");
        CHECKF(fabs(ratio - mine / 35.0) < 1e-3 * ratio, "sessions ratio %g, kvgen %g tok/s", ratio, mine);
        free(r.leaves);
    } else {
        CHECKF(0, "%s: not written or not JSON", json);
    }
    free(text);
    free(peerb);
    free(peerb_args);

    /* a peer that cannot run fails the bench and says why */
    snprintf(args, sizeof args, "bench %s --quick --backend reference --peer /nonexistent/llama-bench", model);
    rc = run(args, &out);
    CHECKF(rc == 1 && out && strstr(out, "/nonexistent/llama-bench exited with status 127"), "exit %d:\n%s", rc,
           out ? out : "");
    free(out);
    free(peer);
    free(peer_args);

    /* the optional sections: concurrent sessions, forks vs scratch */
    remove(json);
    snprintf(args, sizeof args, "bench %s --quick --backend reference --sessions 2 --forks --json %s", model,
             json);
    rc = run(args, &out);
    CHECKF(rc == 0, "kvgen %s: exit %d", args, rc);
    CHECKF(strstr(out, "2 sessions at once") && strstr(out, "ratio to 1 session") &&
               strstr(out, "ESTIMATED"),
           "table:\n%s", out);
    free(out);
    text = tu_read_file(json, NULL);
    CHECKF(text != NULL, "%s was not written", json);
    if (text) {
        CHECKF(json_read(text, &r), "%s is not well-formed JSON:\n%s", json, text);
        check_backend(&r, 0, "reference");
        check_sections(&r, 0, "reference");
        free(r.leaves);
        free(text);
    }
    snprintf(args, sizeof args, "bench %s --sessions 0", model);
    CHECK(run(args, NULL) == 2);

    /* no cache at several depths (given unsorted): the first is the table's ratio and "no_cache",
     * every one is in "no_cache_curve", ascending, with and without the cache */
    remove(json);
    snprintf(args, sizeof args, "bench %s --quick --backend reference --no-cache-depth 24,8 --json %s", model, json);
    rc = run(args, &out);
    CHECKF(rc == 0, "kvgen %s: exit %d", args, rc);
    CHECKF(strstr(out, "decode at 8, no cache") && strstr(out, "decode at 24, no cache"), "table:\n%s", out);
    free(out);
    text = tu_read_file(json, NULL);
    CHECKF(text != NULL, "%s was not written", json);
    if (text) {
        CHECKF(json_read(text, &r), "%s is not well-formed JSON:\n%s", json, text);
        CHECK(positive(&r, "backends[0].no_cache.depth") == 8);
        CHECK(positive(&r, "backends[0].no_cache_curve[0].depth") == 8);
        CHECK(positive(&r, "backends[0].no_cache_curve[1].depth") == 24);
        CHECK(get(&r, "backends[0].no_cache_curve[2].depth") == NULL);
        for (int k = 0; k < 2; k++) {
            positive(&r, "backends[0].no_cache_curve[%d].tok_s.median", k);
            positive(&r, "backends[0].no_cache_curve[%d].cached_tok_s.median", k);
        }
        free(r.leaves);
        free(text);
    }
    snprintf(args, sizeof args, "bench %s --no-cache-depth 8,8", model);
    CHECK(run(args, NULL) == 2);

    /* --kv-type: the reference once (its f32 pages), the cpu backend once per type, each later
     * type with its ratio to the first, in the table and the JSON (head_dim 32: whole blocks) */
    char *kvm = tu_make_model("bench-kv.gguf", "--seed 6 --layers 2 --embd 128 --heads 4 --kv-heads 2 --type Q8_0");
    CHECK(kvm != NULL);
    if (kvm) {
        remove(json);
        snprintf(args, sizeof args, "bench %s --quick --backend reference,cpu --threads 2 --kv-type f16,q8_0 --json %s",
                 kvm, json);
        rc = run(args, &out);
        CHECKF(rc == 0, "kvgen %s: exit %d", args, rc);
        CHECKF(strstr(out, "cpu:f16/reference") && strstr(out, "cpu:q8_0/reference") &&
                   strstr(out, "cpu:q8_0/cpu:f16"),
               "table:\n%s", out);
        free(out);
        text = tu_read_file(json, NULL);
        CHECKF(text != NULL, "%s was not written", json);
        if (text) {
            CHECKF(json_read(text, &r), "%s is not well-formed JSON:\n%s", json, text);
            check_backend(&r, 0, "reference");
            CHECK(get(&r, "backends[0].kv_type") == NULL);
            check_backend(&r, 1, "cpu:f16");
            expect_str(&r, "backends[1].kv_type", "f16");
            check_backend(&r, 2, "cpu:q8_0");
            expect_str(&r, "backends[2].kv_type", "q8_0");
            positive(&r, "ratio_cpu:q8_0_over_cpu:f16.decode_64");
            positive(&r, "ratio_cpu:q8_0_over_reference.decode_64");
            free(r.leaves);
            free(text);
        }
        snprintf(args, sizeof args, "bench %s --quick --backend cpu --kv-type f16,,q8_0", kvm);
        CHECK(run(args, NULL) == 2);
        /* a type the backend does not store: that run fails, naming it */
        snprintf(args, sizeof args, "bench %s --quick --backend cpu --kv-type q5_1", kvm);
        CHECK(run(args, NULL) == 1);
        free(kvm);
    }
    snprintf(args, sizeof args, "bench %s --no-cache-depth 0,8", model);
    CHECK(run(args, NULL) == 2);

    /* an unwritable JSON path is an error, after the table */
    snprintf(args, sizeof args, "bench %s --quick --backend reference --json /nonexistent/dir/bench.json", model);
    CHECK(run(args, NULL) == 1);

    /* kvgen devices prints one entry per device kvgen_devices reports */
    int n_dev = device_count();
    CHECK(n_dev >= 0);
    rc = run(NO_LEAK_CHECK "devices", &out);
    CHECKF(rc == 0, "kvgen devices: exit %d", rc);
    int listed = 0;
    for (const char *line = out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        char *end;
        long idx = strtol(line, &end, 10);
        if (end != line && *end == ':' && idx == listed) listed++;
    }
    CHECKF(listed == n_dev, "kvgen devices listed %d devices, kvgen_devices reports %d:\n%s", listed, n_dev, out);
    if (n_dev == 0) CHECKF(strstr(out, "no Vulkan devices") != NULL, "%s", out);
    else CHECKF(strstr(out, "features:") && strstr(out, "memory:"), "%s", out);
    free(out);

    /* both backends in one run, with the probe and the ratio, where Vulkan can run */
    if (n_dev > 0) {
        remove(json);
        snprintf(args, sizeof args, NO_LEAK_CHECK "bench %s --quick --backend reference,vulkan --sessions 2 --forks "
                 "--json %s", model, json);
        rc = run(args, &out);
        CHECKF(rc == 0, "kvgen %s: exit %d", args, rc);
        CHECKF(strstr(out, "vulkan/reference") && strstr(out, "streaming read"), "table:\n%s", out);
        free(out);
        text = tu_read_file(json, NULL);
        CHECKF(text != NULL, "%s was not written", json);
        if (text) {
            CHECKF(json_read(text, &r), "%s is not well-formed JSON:\n%s", json, text);
            check_common(&r);
            expect_true(&r, "settings.vulkan_built");
            check_backend(&r, 0, "reference");
            check_backend(&r, 1, "vulkan");
            check_sections(&r, 1, "vulkan");
            /* the deepest depth (64) is past the largest prompt: vulkan restores the reference's cache */
            expect_true(&r, "backends[1].deepest_cache_restored");
            positive(&r, "backends[1].probe.read_gbps");
            positive(&r, "backends[1].probe.read_gbps_runs[1]");
            positive(&r, "backends[1].probe.dispatch_us");
            positive(&r, "backends[1].probe.bytes");
            positive(&r, "backends[1].probe.decode_ceiling_tok_s");
            positive(&r, "backends[1].probe.decode_pct_of_ceiling[2].pct");
            positive(&r, "ratio_vulkan_over_reference.prompt_8");
            positive(&r, "ratio_vulkan_over_reference.decode_64");
            positive(&r, "ratio_vulkan_over_reference.decode_no_cache_16");
            free(r.leaves);
            free(text);
        }
    }
    test_embed_mode();
    free(json);
    free(model);
    return tu_finish("test_bench");
}
