/* hash.c: the 64-bit checksum of kvg_hash.h. */
#include "kvg_hash.h"

void kvg_hash64_add(kvg_hash64 *st, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        st->word |= (uint64_t)p[i] << (8 * st->n);
        if (++st->n == 8) {
            st->h = (st->h ^ st->word) * 0x100000001b3ull;
            st->h ^= st->h >> 29;
            st->word = 0;
            st->n = 0;
        }
    }
}

void kvg_hash64_add_u64(kvg_hash64 *st, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    kvg_hash64_add(st, b, 8);
}

uint64_t kvg_hash64_final(const kvg_hash64 *st) {
    uint64_t h = (st->h ^ st->word ^ ((uint64_t)st->n << 59)) * 0x100000001b3ull;
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

uint64_t kvg_hash64_of(const void *data, size_t n) {
    kvg_hash64 st = KVG_HASH64_INIT;
    kvg_hash64_add(&st, data, n);
    return kvg_hash64_final(&st);
}
