/* str.c: copies of strings and byte ranges in the host's allocator (kvg_str.h). */
#include <stdint.h>
#include <string.h>
#include "kvg_host.h"
#include "kvg_str.h"

char *kvg_memdup0(const void *s, size_t n) {
    char *d = kvg_malloc(n + 1);
    if (d) {
        if (n) memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

char *kvg_strndup(const char *s, size_t n) {
    size_t len = 0;
    while (len < n && s[len]) len++;
    return kvg_memdup0(s, len);
}

char *kvg_strdup(const char *s) { return kvg_strndup(s, SIZE_MAX); }
