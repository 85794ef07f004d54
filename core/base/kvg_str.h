/* kvg_str.h: copies of strings and byte ranges in the host's allocator (kvg_host.h): free
 * them with kvg_free. NULL when memory runs out. */
#ifndef KVG_STR_H
#define KVG_STR_H
#include <stddef.h>

char *kvg_strdup(const char *s);
/* at most n bytes of s, up to its first NUL */
char *kvg_strndup(const char *s, size_t n);
/* exactly the n bytes at s (NUL bytes among them kept), then a NUL */
char *kvg_memdup0(const void *s, size_t n);

#endif
