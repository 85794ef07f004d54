#define _POSIX_C_SOURCE 200809L
#include "testutil.h"
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

int tu_failures = 0;
int tu_checks = 0;

int tu_finish(const char *name) {
    printf("%s: %d checks, %d failed\n", name, tu_checks, tu_failures);
    return tu_failures ? 1 : 0;
}

_Noreturn void tu_skip(const char *why) {
    printf("SKIP: %s\n", why);
    exit(77);
}

const char *tu_model_path(void) {
    const char *p = getenv("KVGEN_MODEL");
    if (!p || !*p) p = getenv("KVGEN_DEFAULT_MODEL");
    if (!p || access(p, R_OK) != 0) return NULL;
    return p;
}

static char *join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s/%s", a, b);
    return s;
}

char *tu_testdata(const char *rel) {
    const char *d = getenv("KVGEN_TESTDATA");
    if (!d || !*d) d = getenv("KVGEN_FIXTURES");
    return join(d && *d ? d : "core/tests/fixtures", rel);
}

char *tu_tmpfile(const char *name) {
    const char *d = getenv("KVGEN_TEST_TMP");
    if (!d || !*d) d = "/tmp";
    mkdir(d, 0777);
    return join(d, name);
}

char *tu_make_model(const char *name, const char *args) {
    const char *bin = getenv("KVGEN_BIN");
    char *path = tu_tmpfile(name);
    size_t n = strlen(path) + strlen(args) + (bin ? strlen(bin) : 1) + 64;
    char *cmd = malloc(n);
    snprintf(cmd, n, "%s/kvgen-mkmodel -o %s %s", bin ? bin : ".", path, args);
    int rc = system(cmd);
    if (rc != 0) {
        fprintf(stderr, "model generation failed (%d): %s\n", rc, cmd);
        free(cmd);
        free(path);
        return NULL;
    }
    free(cmd);
    return path;
}

char *tu_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (size) *size = (size_t)n;
    }
    return buf;
}

int tu_run_mkmodel(const char *name, const char *args, char *out, size_t size) {
    const char *bin = getenv("KVGEN_BIN");
    char *path = tu_tmpfile(name);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/kvgen-mkmodel -o %s %s 2>&1", bin && *bin ? bin : ".", path ? path : name, args);
    free(path);
    FILE *p = popen(cmd, "r");
    size_t len = 0, got;
    if (size) out[0] = 0;
    while (p && len + 1 < size && (got = fread(out + len, 1, size - 1 - len, p)) > 0) len += got;
    if (size) out[len] = 0;
    int status = p ? pclose(p) : -1;
    return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void tu_pause_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

bool tu_job_wait(kvgen_job *j) {
    for (long i = 0; i < 6000000; i++) { /* 10 minutes */
        kvgen_job_state st = kvgen_job_poll(j, NULL, NULL);
        if (st == KVGEN_JOB_DONE || st == KVGEN_JOB_CANCELLED || st == KVGEN_JOB_FAILED) return true;
        tu_pause_us(100);
    }
    return false;
}

kvgen_model *tu_load(const kvgen_model_desc *desc) {
    kvgen_error err = {0};
    kvgen_model *m = NULL;
    kvgen_status st = kvgen_model_load(desc, &m, &err);
    CHECKF(st == KVGEN_OK, "load %s: %s", desc->path ? desc->path : "(null)", err.message);
    return m;
}

kvgen_model *tu_load_kv(const char *path, const char *kv_type, kvgen_backend backend) {
    kvgen_model_desc md = {.path = path, .backend = backend, .n_threads = 2, .kv_type = kv_type,
                           .kv_pool_tokens = 4096};
    return tu_load(&md);
}

kvgen_session *tu_open_session(kvgen_model *m, const kvgen_session_desc *desc) {
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {.n_ctx = 512};
    if (desc) sd = *desc;
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    if (!s) fprintf(stderr, "session: %s\n", err.message);
    return s;
}

bool tu_cache_sizes(kvgen_model *m, int n, kvgen_pool_info *pi, kvgen_cache_info *ci) {
    memset(ci, 0, sizeof *ci);
    kvgen_model_pool_info(m, pi);
    kvgen_session *s = tu_open_session(m, NULL);
    int32_t *t = malloc((size_t)n * sizeof *t);
    CHECK(t != NULL);
    if (!s || !t) {
        free(t);
        kvgen_session_close(s);
        return false;
    }
    tu_fill_tokens(t, (size_t)n, 3, tu_vocab(m));
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_prefill(s, t, n, NULL, &err));
    kvgen_session_cache_info(s, ci);
    CHECKF(ci->bytes_per_token == pi->bytes_per_token && ci->bytes == (size_t)n * ci->bytes_per_token,
           "cache: %zu bytes a token (pool %zu), %zu bytes for %d tokens", ci->bytes_per_token, pi->bytes_per_token,
           ci->bytes, n);
    CHECKF(ci->bytes_held == ci->pages * pi->bytes_per_page, "cache: %zu bytes held in %zu pages of %zu",
           ci->bytes_held, ci->pages, pi->bytes_per_page);
    free(t);
    kvgen_session_close(s);
    return true;
}

int tu_vocab(const kvgen_model *m) {
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    return info.n_vocab;
}

double tu_rel_diff(const float *a, const float *b, size_t n) {
    if (!a || !b) return INFINITY;
    float lo = b[0], hi = b[0];
    double d = 0.0;
    for (size_t i = 0; i < n; i++) {
        lo = fminf(lo, b[i]);
        hi = fmaxf(hi, b[i]);
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
    }
    return hi > lo ? d / (double)(hi - lo) : d;
}

double tu_diff_to_fresh(kvgen_model *m, const kvgen_session *s, const char *what, double tol) {
    kvgen_error err = {0};
    kvgen_session_desc sd = {.n_ctx = 512, .no_prefix_reuse = 1};
    kvgen_session *o = tu_open_session(m, &sd);
    if (!o) return INFINITY;
    CHECK_OK(kvgen_session_prefill(o, kvgen_session_tokens(s), kvgen_session_length(s), NULL, &err));
    double d = tu_rel_diff(kvgen_session_logits(s), kvgen_session_logits(o), (size_t)tu_vocab(m));
    printf("%s: logits within %.3g of a recomputation\n", what, d);
    CHECKF(d <= tol, "%s: logits %.3g of the range from a recomputation of its %zu tokens", what, d,
           kvgen_session_length(s));
    kvgen_session_close(o);
    return d;
}

bool tu_two_page_slabs(const kvgen_model_desc *d) {
    kvgen_model *probe = tu_load(d);
    if (!probe) return false;
    kvgen_pool_info pi;
    kvgen_model_pool_info(probe, &pi);
    kvgen_model_unload(probe);
    char lim[32];
    snprintf(lim, sizeof lim, "%zu", 2 * pi.bytes_per_page + pi.bytes_per_page / 2);
    setenv("KVGEN_VK_MAX_PART", lim, 1);
    return true;
}

void tu_fill_tokens(int32_t *t, size_t n, unsigned seed, int n_vocab) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        t[i] = (int32_t)((x >> 8) % (uint32_t)n_vocab);
    }
}

double tu_max_diff(const float *a, const float *b, int n) {
    if (!a || !b) return (a || b) ? INFINITY : 0.0;
    double d = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

FILE *tu_open_fixture(const char *name) {
    const char *dir = getenv("KVGEN_FIXTURES");
    if (!dir) tu_skip("KVGEN_FIXTURES not set");
    char *path = join(dir, name);
    FILE *f = path ? fopen(path, "rb") : NULL;
    CHECKF(f != NULL, "%s", path ? path : name);
    free(path);
    return f;
}

int tu_read_record(FILE *f, tu_record *r) {
    if (!fgets(r->head, sizeof r->head, f)) return 0;
    r->head[strcspn(r->head, "\n")] = 0;
    r->body = NULL;
    r->len = 0;
    char *sp = strrchr(r->head, ' ');
    if (strncmp(r->head, "case ", 5) == 0 || !sp || strcmp(sp + 1, "error") == 0) return 1;
    r->len = (size_t)strtoul(sp + 1, NULL, 10);
    *sp = 0;
    r->body = malloc(r->len + 1);
    if (!r->body || fread(r->body, 1, r->len, f) != r->len) return 0;
    r->body[r->len] = 0;
    fgetc(f);
    return 1;
}

bool tu_oracle_load(const char *name, int topk, tu_oracle *o) {
    char *path = tu_testdata(name);
    FILE *f = fopen(path, "r");
    CHECKF(f != NULL, "cannot open %s", path);
    free(path);
    if (!f) return false;
    static char line[16384];
    memset(o, 0, sizeof *o);
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        char *p = line;
        int off = 0, pos, k;
        if (sscanf(p, "tokens %d%n", &o->n_tok, &off) == 1) {
            p += off;
            for (int i = 0; i < o->n_tok && i < TU_ORACLE_MAX_TOK; i++) {
                sscanf(p, "%d%n", &o->tokens[i], &off);
                p += off;
            }
        } else if (sscanf(p, "pos %d %d%n", &pos, &k, &off) == 2 && pos >= 0 && pos < TU_ORACLE_MAX_TOK &&
                   k == topk && k <= TU_ORACLE_MAX_TOPK) {
            p += off;
            for (int j = 0; j < k; j++) {
                sscanf(p, " %d:%f%n", &o->top_id[pos][j], &o->top_val[pos][j], &off);
                p += off;
            }
            if (pos + 1 > o->n_pos) o->n_pos = pos + 1;
        }
    }
    fclose(f);
    return true;
}

bool tu_oracle_load_ids(const char *name, int topk, const int32_t *ids, int n, tu_oracle *o) {
    if (!tu_oracle_load(name, topk, o)) return false;
    bool ok = o->n_tok == n && o->n_pos == n && n <= TU_ORACLE_MAX_TOK;
    for (int i = 0; ok && i < n; i++) ok = o->tokens[i] == ids[i];
    CHECKF(ok, "%s: the fixture's tokens or positions do not match (%d tokens, %d positions)", name, o->n_tok,
           o->n_pos);
    return ok;
}

const int32_t tu_seq40[TU_SEQ40_N] = {1,   17, 42,  99, 3,   250, 7,   130, 64,  5,  77,  201, 12, 180,
                                      33,  9,  144, 60, 2,   222, 18,  95,  41,  170, 8,  66,  133, 27,
                                      240, 50, 11,  190, 73, 36,  155, 4,   210, 88,  29, 120};

tu_oracle_cmp tu_oracle_compare(const tu_oracle *o, const float *logits, int n_vocab, int n_pos, int topk,
                                float margin, const char *label) {
    tu_oracle_cmp r = {0};
    double sum = 0;
    for (int p = 0; p < n_pos; p++) {
        const float *l = logits + (size_t)p * (size_t)n_vocab;
        int best = 0;
        for (int v = 1; v < n_vocab; v++)
            if (l[v] > l[best]) best = v;
        float gap = o->top_val[p][0] - o->top_val[p][1];
        bool clear = gap >= margin, same = best == o->top_id[p][0];
        r.top1 += same;
        r.clear += clear;
        r.clear_top1 += clear && same;
        if (!same && label)
            fprintf(stderr, "  %s position %d: top-1 %d (%.4f) vs oracle %d (%.4f, ours %.4f; oracle margin %.4f)\n",
                    label, p, best, l[best], o->top_id[p][0], o->top_val[p][0], l[o->top_id[p][0]], gap);
        for (int j = 0; j < topk; j++) {
            double d = fabs((double)l[o->top_id[p][j]] - (double)o->top_val[p][j]);
            if (d > r.max_diff) r.max_diff = d;
            sum += d;
        }
    }
    r.mean_diff = n_pos > 0 && topk > 0 ? sum / ((double)n_pos * topk) : 0;
    return r;
}

#if defined(_WIN32)
/* no fork: the body runs in the test's own process */
void tu_vulkan_child(const char *what, void (*body)(void *arg), void *arg) {
    int n_dev = 0;
    kvgen_error err = {0};
    if (kvgen_devices(NULL, 0, &n_dev, &err) != KVGEN_OK || n_dev == 0) {
        printf("vulkan: no device, %s not checked there\n", what);
        return;
    }
    body(arg);
}
#else
void tu_vulkan_child(const char *what, void (*body)(void *arg), void *arg) {
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid < 0) return;
    if (pid == 0) {
        int n_dev = 0;
        kvgen_error err = {0};
        if (kvgen_devices(NULL, 0, &n_dev, &err) != KVGEN_OK || n_dev == 0) {
            printf("vulkan: no device, %s not checked there\n", what);
            fflush(stdout);
            _exit(0);
        }
        body(arg);
        fflush(stdout);
        _exit(tu_failures ? 1 : 0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "vulkan %s child: status %d", what, status);
}
#endif

char *tu_model_file(const char *name) {
    const char *def = getenv("KVGEN_DEFAULT_MODEL");
    char *p = malloc(2048);
    if (def && strrchr(def, '/')) snprintf(p, 2048, "%.*s/%s", (int)(strrchr(def, '/') - def), def, name);
    else snprintf(p, 2048, "models/%s", name);
    FILE *f = fopen(p, "rb");
    if (!f) {
        free(p);
        return NULL;
    }
    fclose(f);
    return p;
}
