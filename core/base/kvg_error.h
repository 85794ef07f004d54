/* kvg_error.h: the error helper every layer reports through (private side of kvgen_error).
 *
 * Folder core/base/ owns what every layer may use and that uses nothing of kvgen above it:
 * errors (error.c), byte buffers (buf.c, kvg_buf.h), the JSON codec (json.c, kvg_json.h), the
 * host's hooks, logger and allocator (host.c, kvg_host.h), string copies (str.c, kvg_str.h), the
 * platform layer (platform.c, kvg_platform.h) and kvgen's own files (file.c, kvg_file.h). */
#ifndef KVG_ERROR_H
#define KVG_ERROR_H
#include "kvgen.h"

/* Formats into err (when not NULL) and returns status. */
kvgen_status kvg_fail(kvgen_error *err, kvgen_status status, const char *fmt, ...)
#if defined(__GNUC__) && !defined(__MINGW32__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif
