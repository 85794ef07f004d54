#define _POSIX_C_SOURCE 200809L
#include "testutil.h"
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
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

kvgen_model *tu_load(const kvgen_model_desc *desc) {
    kvgen_error err = {0};
    kvgen_model *m = NULL;
    kvgen_status st = kvgen_model_load(desc, &m, &err);
    CHECKF(st == KVGEN_OK, "load %s: %s", desc->path ? desc->path : "(null)", err.message);
    return m;
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
