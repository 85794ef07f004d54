/* tu_posix.h: the few POSIX calls the C tests use, for Windows (included ahead of every test
 * source there by core/CMakeLists.txt; the tests themselves stay as on Linux). */
#ifndef KVGEN_TESTS_WIN_TU_POSIX_H
#define KVGEN_TESTS_WIN_TU_POSIX_H
#include <direct.h>
#include <io.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline int tu_setenv(const char *name, const char *value, int overwrite) {
    if (!overwrite && getenv(name)) return 0;
    return _putenv_s(name, value);
}
static inline int tu_unsetenv(const char *name) { return _putenv_s(name, ""); }

/* The tests' command lines are written for sh; cmd.exe reads 'single quotes' as "double" ones
 * and /dev/null as NUL. Returns a malloc'd copy (NULL when out of memory). */
static inline char *tu_cmd_line(const char *cmd) {
    size_t n = strlen(cmd);
    char *out = malloc(n + 1), *o = out;
    if (!out) return NULL;
    for (const char *c = cmd; *c;) {
        if (strncmp(c, "/dev/null", 9) == 0) {
            memcpy(o, "NUL", 3), o += 3, c += 9;
        } else {
            *o++ = *c == '\'' ? '"' : *c;
            c++;
        }
    }
    *o = 0;
    return out;
}
/* Wine's cmd.exe, starting programs from tests that run side by side, now and then reports a
 * program that is there as unknown (exit code 9009) without running it. The program never ran,
 * so starting it again repeats the same request: it is no second chance for a failing tool. */
static inline int tu_system(const char *cmd) {
    char *c = tu_cmd_line(cmd);
    int rc = c ? system(c) : -1;
    for (int again = 0; c && rc == 9009 && again < 5; again++) {
        fprintf(stderr, "cmd.exe did not start the program (9009), starting it again: %s\n", c);
        int ms = 200 << again;
        struct timespec pause = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&pause, NULL);
        rc = system(c);
    }
    free(c);
    return rc;
}
static inline FILE *tu_popen(const char *cmd, const char *mode) {
    char *c = tu_cmd_line(cmd);
    FILE *f = c ? _popen(c, mode) : NULL;
    free(c);
    return f;
}
/* a Windows sleep shorter than the timer's tick may return at once: at least 1 ms, so that a
 * test's polling loop bounded by a count of sleeps waits as long as it does elsewhere */
static inline int tu_nanosleep(const struct timespec *req, struct timespec *rem) {
    struct timespec r = *req;
    if (r.tv_sec == 0 && r.tv_nsec < 1000000) r.tv_nsec = 1000000;
    return nanosleep(&r, rem);
}

#undef popen
#undef pclose
#define setenv tu_setenv
#define unsetenv tu_unsetenv
#define system tu_system
#define popen tu_popen
#define pclose _pclose
#define nanosleep tu_nanosleep
#define mkdir(path, mode) _mkdir(path)
#endif
