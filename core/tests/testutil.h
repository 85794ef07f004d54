/* testutil.h: a tiny test harness for kvgen's C tests (one ctest per file). */
#ifndef KVGEN_TESTUTIL_H
#define KVGEN_TESTUTIL_H
#include <stdio.h>
#include <stdlib.h>
#include "kvgen.h"

extern int tu_failures;
extern int tu_checks;

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        tu_checks++;                                                                         \
        if (!(cond)) {                                                                       \
            tu_failures++;                                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);         \
        }                                                                                    \
    } while (0)

#define CHECKF(cond, ...)                                                                    \
    do {                                                                                     \
        tu_checks++;                                                                         \
        if (!(cond)) {                                                                       \
            tu_failures++;                                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);         \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fputc('\n', stderr);                                                             \
        }                                                                                    \
    } while (0)

/* a kvgen call that must succeed; prints the error message otherwise */
#define CHECK_OK(call)                                                                       \
    do {                                                                                     \
        kvgen_error tu_err_ = {0};                                                           \
        (void)tu_err_;                                                                       \
        kvgen_status tu_st_ = (call);                                                        \
        tu_checks++;                                                                         \
        if (tu_st_ != KVGEN_OK) {                                                            \
            tu_failures++;                                                                   \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,             \
                    kvgen_status_name(tu_st_));                                              \
        }                                                                                    \
    } while (0)

/* exit code: 0 when every check passed, 1 otherwise; prints a summary */
int tu_finish(const char *name);
/* exits 77 (ctest: skipped) with a reason */
_Noreturn void tu_skip(const char *why);

/* paths: the default model (KVGEN_MODEL, else KVGEN_DEFAULT_MODEL), NULL when the file is absent */
const char *tu_model_path(void);
/* $KVGEN_TESTDATA/<rel> (static buffer per call site is not needed: returns malloc'd, caller frees) */
char *tu_testdata(const char *rel);
/* a scratch directory for this test (created); returns malloc'd "<dir>/<name>" */
char *tu_tmpfile(const char *name);
/* builds a random-weight model by running kvgen-mkmodel with `args`; returns malloc'd path or NULL */
char *tu_make_model(const char *name, const char *args);
/* loads a model (CHECK fails with kvgen's message when it cannot); NULL on failure */
kvgen_model *tu_load(const kvgen_model_desc *desc);
/* n deterministic pseudo-random token ids in [0, n_vocab) for a seed */
void tu_fill_tokens(int32_t *t, size_t n, unsigned seed, int n_vocab);
/* largest |a[i] - b[i]| over n floats; INFINITY when exactly one is NULL, 0 when both are */
double tu_max_diff(const float *a, const float *b, int n);
/* reads a whole file; NULL on failure */
char *tu_read_file(const char *path, size_t *size);
/* Runs body(arg) in a child process when a Vulkan device is present (else prints that `what`
 * was not checked there) and checks the child's checks all passed. The child leaves with
 * _exit: lavapipe leaves a few bytes at unload that LeakSanitizer cannot attribute, and the
 * test's own process stays leak-checked. */
void tu_vulkan_child(const char *what, void (*body)(void *arg), void *arg);
#endif
