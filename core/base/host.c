/* host.c: the host's hooks: the logger (default: stderr, warnings and errors) and the
 * allocator (default: the C library's). */
#include "kvg_platform.h"
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_error.h"
#include "kvg_host.h"

/* ---- logger ---- */

static kvg_mutex log_lock = KVG_MUTEX_INIT;
static kvgen_log_fn log_fn;
static void *log_user;

const char *kvgen_log_level_name(kvgen_log_level level) {
    switch (level) {
    case KVGEN_LOG_ERROR: return "error";
    case KVGEN_LOG_WARNING: return "warning";
    case KVGEN_LOG_INFO: return "info";
    case KVGEN_LOG_DEBUG: return "debug";
    }
    return "unknown";
}

void kvgen_set_logger(kvgen_log_fn fn, void *user) {
    kvg_mutex_lock(&log_lock);
    log_fn = fn;
    log_user = fn ? user : NULL;
    kvg_mutex_unlock(&log_lock);
}

static kvgen_log_level default_threshold(void) {
    const char *v = getenv("KVGEN_LOG_LEVEL");
    if (v)
        for (int l = KVGEN_LOG_ERROR; l <= KVGEN_LOG_DEBUG; l++)
            if (strcmp(v, kvgen_log_level_name((kvgen_log_level)l)) == 0) return (kvgen_log_level)l;
    return KVGEN_LOG_WARNING;
}

void kvg_log(kvgen_log_level level, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    /* the logger runs under the lock: once kvgen_set_logger returns, the previous one is not
     * running and will not be called again (its user data may go) */
    kvg_mutex_lock(&log_lock);
    if (log_fn) log_fn(log_user, level, msg);
    else if (level <= default_threshold()) fprintf(stderr, "kvgen: %s\n", msg);
    kvg_mutex_unlock(&log_lock);
}

/* ---- allocator ---- */

static kvgen_allocator host_alloc; /* all NULL: the C library's */
static int models_loaded;          /* atomic */

void kvg_host_model_count(int delta) { __atomic_add_fetch(&models_loaded, delta, __ATOMIC_ACQ_REL); }

kvgen_status kvgen_set_allocator(const kvgen_allocator *a, kvgen_error *err) {
    if (a && (!a->malloc || !a->realloc || !a->free))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_set_allocator: allocator->%s is NULL",
                        !a->malloc ? "malloc" : !a->realloc ? "realloc" : "free");
    int n = __atomic_load_n(&models_loaded, __ATOMIC_ACQUIRE);
    if (n != 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "kvgen_set_allocator: %d model%s still loaded; set the allocator before the first load", n,
                        n == 1 ? " is" : "s are");
    host_alloc = a ? *a : (kvgen_allocator){0};
    return KVGEN_OK;
}

void *kvg_malloc(size_t size) {
    if (host_alloc.malloc) return host_alloc.malloc(host_alloc.user, size ? size : 1);
    return malloc(size ? size : 1);
}

void *kvg_calloc(size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) return NULL;
    if (!host_alloc.malloc) return calloc(n ? n : 1, size ? size : 1);
    size_t bytes = n * size;
    void *p = host_alloc.malloc(host_alloc.user, bytes ? bytes : 1);
    if (p) memset(p, 0, bytes);
    return p;
}

void *kvg_realloc(void *ptr, size_t size) {
    if (host_alloc.realloc) return host_alloc.realloc(host_alloc.user, ptr, size ? size : 1);
    return realloc(ptr, size ? size : 1);
}

void kvg_free(void *ptr) {
    if (!ptr) return;
    if (host_alloc.free) host_alloc.free(host_alloc.user, ptr);
    else free(ptr);
}
