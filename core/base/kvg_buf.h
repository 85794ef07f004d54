/* kvg_buf.h: a growable byte buffer (private).
 * (Folder core/base/: kvg_error.h.) */
#ifndef KVG_BUF_H
#define KVG_BUF_H
#include <stdbool.h>
#include <stddef.h>
#include "kvg_host.h"

/* A growable byte buffer, always NUL-terminated once anything (even "") was added. */
typedef struct kvg_buf {
    char *p;
    size_t n, cap;
} kvg_buf;

bool kvg_buf_add(kvg_buf *b, const char *s, size_t n);

#endif
