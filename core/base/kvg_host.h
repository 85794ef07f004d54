/* kvg_host.h: the host's hooks (private side of kvgen_set_logger and kvgen_set_allocator):
 * logging and the allocation functions the library's layers above the backends use. */
#ifndef KVG_HOST_H
#define KVG_HOST_H
#include <stddef.h>
#include "kvgen.h"

/* One message to the logger (formatted; no trailing newline needed). */
void kvg_log(kvgen_log_level level, const char *fmt, ...)
#if defined(__GNUC__) && !defined(__MINGW32__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The host's allocator, else the C library's. kvg_calloc checks n * size for overflow. Memory
 * from these goes back through kvg_free, never free(). */
void *kvg_malloc(size_t size);
void *kvg_calloc(size_t n, size_t size);
void *kvg_realloc(void *ptr, size_t size);
void kvg_free(void *ptr);

/* Loaded models, counted so that kvgen_set_allocator can refuse to switch under them. */
void kvg_host_model_count(int delta);

#endif
