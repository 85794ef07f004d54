/* kvg_hash.h: a 64-bit checksum of bytes (session files' integrity and model identity): FNV-1a
 * folded 8 bytes at a time, with a splitmix finaliser. Fast enough to checksum a few hundred
 * MiB of K/V, and any flipped bit changes the result; not cryptographic. Bytes are gathered
 * into words across calls, so the result does not depend on how the data was split into
 * calls (a save writes in sections, a restore hashes the file in one go). */
#ifndef KVG_HASH_H
#define KVG_HASH_H
#include <stddef.h>
#include <stdint.h>

typedef struct kvg_hash64 {
    uint64_t h, word;
    int n; /* bytes in word */
} kvg_hash64;

#define KVG_HASH64_INIT {0xcbf29ce484222325ull, 0, 0}

void kvg_hash64_add(kvg_hash64 *st, const void *data, size_t n);
void kvg_hash64_add_u64(kvg_hash64 *st, uint64_t v); /* its 8 bytes, little-endian */
uint64_t kvg_hash64_final(const kvg_hash64 *st);
/* the checksum of n bytes in one call */
uint64_t kvg_hash64_of(const void *data, size_t n);

#endif
