/* fuzz_util.h: what kvgen's libFuzzer targets share (core/tests/fuzz/, docs/fuzzing.md): a
 * scratch file for the readers that take a path, and the small random model the targets that
 * need one make once with kvgen-mkmodel. Test code only. */
#ifndef KVGEN_FUZZ_UTIL_H
#define KVGEN_FUZZ_UTIL_H
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "kvgen.h"

/* a scratch folder: $TMPDIR, else /dev/shm where it exists (no disk writes), else /tmp */
static inline const char *fuzz_tmpdir(void) {
    const char *t = getenv("TMPDIR");
    if (t && *t) return t;
    return access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
}

/* "<tmp>/kvgen-fuzz-<pid>-<name>" in buf (one name per process, reused by every input) */
static inline const char *fuzz_path(char *buf, size_t size, const char *name) {
    snprintf(buf, size, "%s/kvgen-fuzz-%ld-%s", fuzz_tmpdir(), (long)getpid(), name);
    return buf;
}

/* writes data to path; 0 on failure */
static inline int fuzz_write(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(data, 1, size, f) == size;
    return fclose(f) == 0 && ok;
}

/* kvgen-mkmodel's small model (fixed seed: the same file, and the same model identity for
 * session files, every time); loaded on the reference backend, one thread. Exits when it
 * cannot be made: the target is of no use without it. */
static inline kvgen_model *fuzz_random_model(const char *extra) {
    static char path[512];
    fuzz_path(path, sizeof path, "model.gguf");
    char cmd[1536];
    snprintf(cmd, sizeof cmd, "'%s' -o '%s' --seed 1 --layers 1 --embd 32 --ff 64 --heads 2 --kv-heads 1 --ctx 256 %s",
             KVGEN_FUZZ_MKMODEL, path, extra ? extra : "");
    if (system(cmd) != 0) {
        fprintf(stderr, "fuzz: %s failed\n", cmd);
        exit(1);
    }
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 1, .kv_pool_tokens = 4096};
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    if (kvgen_model_load(&md, &m, &err) != KVGEN_OK) {
        fprintf(stderr, "fuzz: %s\n", err.message);
        exit(1);
    }
    remove(path);
    return m;
}

#endif
