/* progress.c: the load-progress line of the kvgen command (kvgen_cli.c's loads and the bench's):
 * stderr only, and only a terminal (a log or a pipe keeps just the messages); rewritten in
 * place, cleared when the load returns. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#if defined(_WIN32)
#include <io.h>
#else
#include <unistd.h>
#endif
#include "progress.h"

static int progress_shown;

static int progress_line(void *user, kvgen_load_stage stage, uint64_t done, uint64_t total) {
    (void)user;
    static const char *const what[] = {"", "reading the weights", "preparing the weights", "building pipelines"};
    const char *w = stage >= KVGEN_LOAD_READ && stage <= KVGEN_LOAD_PIPELINES ? what[stage] : "loading";
    if (stage == KVGEN_LOAD_PIPELINES)
        fprintf(stderr, "\rkvgen: loading: %s: %llu\033[K", w, (unsigned long long)done);
    else
        fprintf(stderr, "\rkvgen: loading: %s: %3.0f%% (%.1f of %.1f MiB)\033[K", w,
                total ? 100.0 * (double)done / (double)total : 100.0, (double)done / 1048576.0,
                (double)total / 1048576.0);
    fflush(stderr);
    progress_shown = 1;
    return 1;
}

kvgen_load_progress_fn kvgen_cli_progress(void) { return isatty(STDERR_FILENO) ? progress_line : NULL; }

void kvgen_cli_progress_end(void) {
    if (progress_shown) fputs("\r\033[K", stderr);
    progress_shown = 0;
}
