/* memory.c: the memory store (kvgen.h, "memory store"): texts with string fields and unit
 * embedding vectors, searched exactly by cosine.
 *
 * Why here: the store needs base/ (files, checksum) and cpu/ (the SIMD dot products of
 * kvg_vec_ops, picked by the cpu backend's instruction-set choice); generate/ is the layer above
 * both that already owns kvgen's other saved format (session files), so the store adds no
 * layer and no upward use.
 *
 * Layout: rows packed contiguously (`dim` elements each, f32 or IEEE f16) in slot order, with
 * the id and the record (text, fields) of each slot; an open-addressing map id -> slot; removal
 * moves the last row into the freed slot. Field strings are interned (u32 ids), so a search's
 * filter compares integers (the first three fields' ids sit in the packed records themselves).
 * A search dots the unit query with blocks of rows (dot_rows / dot_rows_f16) and keeps the k
 * best in a bounded heap (worst at the root; ties: the higher id is worse), sorted at the end:
 * O(n dim + n log k), no full sort.
 *
 * File layout, version 1, integers little-endian, floats as their IEEE bits:
 *   header (HEADER_BYTES)
 *     magic "KVGMEMO\0" 8; version u32, storage u32 (0 f32, 1 f16); dim u32, reserved u32;
 *     embedding_id u64; count u64; next_id u64; records_bytes u64; file_bytes u64
 *   ids            count x u64, strictly increasing, each < next_id
 *   vectors        count x dim x (4 or 2 bytes), in the ids' order
 *   records        per memory: u32 text length, text, u32 n_fields, per field: u32 key length,
 *                  key, u32 value length, value
 *   checksum u64 over every byte before it (kvg_hash.h)
 * Saved atomically (kvg_file.h). Load checks magic, version, the sizes against the file's real
 * size (truncation) before it allocates anything, then reads everything and checks the checksum
 * (corruption), then the caller's dim and embedding identity, then the contents. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_file.h"
#include "kvg_host.h"
#include "kvg_qdot.h"
#include "kvg_quant.h"
#include "kvg_str.h"

#define MAGIC "KVGMEMO"
#define VERSION 1u
#define HEADER_BYTES 64
#define MAX_DIM 65536
#define MAX_TEXT ((size_t)1 << 24)
#define MAX_STRING ((size_t)1 << 16)
#define MAX_FIELDS 64
#define BLOCK 256 /* rows dotted per call */
#define NEAR_FIELDS 3

typedef struct mem_rec {
    char *text;                 /* one allocation: the fields array, the field ids, the strings */
    kvgen_memory_field *fields;
    uint32_t *fid;              /* per field: interned key, interned value */
    uint32_t n_fields;
    uint32_t near[2 * NEAR_FIELDS]; /* the first fields' ids again, in the packed array of records:
                                       a filter reads them without touching the allocation */
} mem_rec;

struct kvgen_memory {
    int dim;
    kvgen_memory_storage storage;
    size_t es; /* bytes per element */
    uint64_t embedding_id, next_id;
    size_t n, cap;
    unsigned char *vecs;
    uint64_t *ids;
    mem_rec *recs;
    uint64_t *map_keys; /* id (0: empty) */
    size_t *map_slot;
    size_t map_cap;     /* power of two, > 2 n */
    char **strs;        /* interned strings by id */
    uint32_t n_strs, strs_cap;
    uint32_t *str_map;  /* id + 1, 0: empty */
    size_t str_map_cap;
    kvg_cpu_isa isa;
    const kvg_vec_ops *ops;
};

/* ---- id map ------------------------------------------------------------------------------- */

static size_t id_hash(uint64_t id, size_t cap) { return (size_t)((id * 0x9e3779b97f4a7c15ull) >> 17) & (cap - 1); }

static bool map_grow(kvgen_memory *m, size_t need) {
    if (need * 2 < m->map_cap) return true;
    size_t cap = m->map_cap ? m->map_cap : 64;
    while (need * 2 >= cap) cap *= 2;
    uint64_t *keys = kvg_calloc(cap, sizeof *keys);
    size_t *slots = kvg_calloc(cap, sizeof *slots);
    if (!keys || !slots) {
        kvg_free(keys);
        kvg_free(slots);
        return false;
    }
    for (size_t i = 0; i < m->map_cap; i++) {
        if (!m->map_keys[i]) continue;
        size_t h = id_hash(m->map_keys[i], cap);
        while (keys[h]) h = (h + 1) & (cap - 1);
        keys[h] = m->map_keys[i];
        slots[h] = m->map_slot[i];
    }
    kvg_free(m->map_keys);
    kvg_free(m->map_slot);
    m->map_keys = keys;
    m->map_slot = slots;
    m->map_cap = cap;
    return true;
}

/* the map position of id, or SIZE_MAX */
static size_t map_find(const kvgen_memory *m, uint64_t id) {
    if (!m->map_cap || id == 0) return SIZE_MAX;
    for (size_t h = id_hash(id, m->map_cap);; h = (h + 1) & (m->map_cap - 1)) {
        if (m->map_keys[h] == id) return h;
        if (!m->map_keys[h]) return SIZE_MAX;
    }
}

static void map_put(kvgen_memory *m, uint64_t id, size_t slot) { /* room made by map_grow */
    size_t h = id_hash(id, m->map_cap);
    while (m->map_keys[h] && m->map_keys[h] != id) h = (h + 1) & (m->map_cap - 1);
    m->map_keys[h] = id;
    m->map_slot[h] = slot;
}

/* removal by backward shift: no tombstones */
static void map_del(kvgen_memory *m, size_t h) {
    size_t mask = m->map_cap - 1;
    m->map_keys[h] = 0;
    for (size_t j = (h + 1) & mask; m->map_keys[j]; j = (j + 1) & mask) {
        size_t home = id_hash(m->map_keys[j], m->map_cap);
        /* j's entry may move to h when h lies cyclically in [home, j) */
        if (((j - home) & mask) >= ((j - h) & mask)) {
            m->map_keys[h] = m->map_keys[j];
            m->map_slot[h] = m->map_slot[j];
            m->map_keys[j] = 0;
            h = j;
        }
    }
}

/* ---- interned strings --------------------------------------------------------------------- */

static size_t str_hash(const char *s, size_t cap) { return (size_t)kvg_hash64_of(s, strlen(s)) & (cap - 1); }

/* the id of s, UINT32_MAX when absent */
static uint32_t str_find(const kvgen_memory *m, const char *s) {
    if (!m->str_map_cap) return UINT32_MAX;
    for (size_t h = str_hash(s, m->str_map_cap);; h = (h + 1) & (m->str_map_cap - 1)) {
        uint32_t v = m->str_map[h];
        if (!v) return UINT32_MAX;
        if (strcmp(m->strs[v - 1], s) == 0) return v - 1;
    }
}

/* the id of s, interned when new; UINT32_MAX when out of memory */
static uint32_t str_intern(kvgen_memory *m, const char *s) {
    uint32_t id = str_find(m, s);
    if (id != UINT32_MAX) return id;
    if ((size_t)(m->n_strs + 1) * 2 >= m->str_map_cap) {
        size_t cap = m->str_map_cap ? m->str_map_cap * 2 : 64;
        uint32_t *map = kvg_calloc(cap, sizeof *map);
        if (!map) return UINT32_MAX;
        for (uint32_t i = 0; i < m->n_strs; i++) {
            size_t h = str_hash(m->strs[i], cap);
            while (map[h]) h = (h + 1) & (cap - 1);
            map[h] = i + 1;
        }
        kvg_free(m->str_map);
        m->str_map = map;
        m->str_map_cap = cap;
    }
    if (m->n_strs == m->strs_cap) {
        uint32_t cap = m->strs_cap ? m->strs_cap * 2 : 32;
        char **strs = kvg_realloc(m->strs, (size_t)cap * sizeof *strs);
        if (!strs) return UINT32_MAX;
        m->strs = strs;
        m->strs_cap = cap;
    }
    char *copy = kvg_strdup(s);
    if (!copy) return UINT32_MAX;
    size_t h = str_hash(s, m->str_map_cap);
    while (m->str_map[h]) h = (h + 1) & (m->str_map_cap - 1);
    m->strs[m->n_strs] = copy;
    m->str_map[h] = ++m->n_strs;
    return m->n_strs - 1;
}

/* the start of a record's one allocation */
static void *rec_block(const mem_rec *r) { return r->n_fields ? (void *)r->fields : (void *)r->text; }

/* ---- store -------------------------------------------------------------------------------- */

static kvgen_status new_store(const char *who, int dim, kvgen_memory_storage storage, uint64_t embedding_id,
                              kvgen_memory **out, kvgen_error *err) {
    kvg_cpu_isa isa;
    kvgen_status st = kvg_cpu_isa_choose(who, &isa, err);
    if (st != KVGEN_OK) return st;
    kvgen_memory *m = kvg_calloc(1, sizeof *m);
    if (!m) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    m->dim = dim;
    m->storage = storage;
    m->es = storage == KVGEN_MEMORY_F16 ? 2 : 4;
    m->embedding_id = embedding_id;
    m->next_id = 1;
    m->isa = isa;
    m->ops = kvg_vec_ops_of(isa);
    *out = m;
    return KVGEN_OK;
}

static bool reserve(kvgen_memory *m, size_t need) {
    if (!map_grow(m, need)) return false;
    if (need <= m->cap) return true;
    size_t cap = m->cap ? m->cap : 16;
    while (cap < need) cap += cap / 2 + 16;
    unsigned char *vecs = kvg_realloc(m->vecs, cap * (size_t)m->dim * m->es);
    if (!vecs) return false;
    m->vecs = vecs;
    uint64_t *ids = kvg_realloc(m->ids, cap * sizeof *ids);
    if (!ids) return false;
    m->ids = ids;
    mem_rec *recs = kvg_realloc(m->recs, cap * sizeof *recs);
    if (!recs) return false;
    m->recs = recs;
    m->cap = cap;
    return true;
}

kvgen_status kvgen_memory_create(const kvgen_memory_desc *desc, kvgen_memory **out, kvgen_error *err) {
    if (out) *out = NULL;
    if (!desc) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_memory_create: desc is NULL");
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_memory_create: out is NULL");
    if (desc->dim < 1 || desc->dim > MAX_DIM)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_memory_create: dim %d is out of range [1, %d]", desc->dim,
                        MAX_DIM);
    if (desc->storage != KVGEN_MEMORY_F32 && desc->storage != KVGEN_MEMORY_F16)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "kvgen_memory_create: storage %d is not KVGEN_MEMORY_F32 (0) or KVGEN_MEMORY_F16 (1)",
                        (int)desc->storage);
    return new_store("kvgen_memory_create", desc->dim, desc->storage, desc->embedding_id, out, err);
}

void kvgen_memory_free(kvgen_memory *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n; i++) kvg_free(rec_block(&m->recs[i]));
    for (uint32_t i = 0; i < m->n_strs; i++) kvg_free(m->strs[i]);
    kvg_free(m->strs);
    kvg_free(m->str_map);
    kvg_free(m->vecs);
    kvg_free(m->ids);
    kvg_free(m->recs);
    kvg_free(m->map_keys);
    kvg_free(m->map_slot);
    kvg_free(m);
}

void kvgen_memory_get_info(const kvgen_memory *m, kvgen_memory_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    if (!m) return;
    info->dim = m->dim;
    info->storage = m->storage;
    info->embedding_id = m->embedding_id;
    info->count = m->n;
    info->next_id = m->next_id;
    info->vector_bytes = m->n * (size_t)m->dim * m->es;
    info->isa = kvg_cpu_isa_name(m->isa);
}

size_t kvgen_memory_count(const kvgen_memory *m) { return m ? m->n : 0; }

/* checks a vector argument and writes its unit vector into unit (dim floats) */
static kvgen_status unit_vector(const char *who, const char *name, const kvgen_memory *m, const float *v, size_t dim,
                                float *unit, kvgen_error *err) {
    if (!v) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %s is NULL", who, name);
    if (dim != (size_t)m->dim)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %s has %zu elements, the store's dim is %d", who, name, dim,
                        m->dim);
    double ss = 0;
    for (size_t i = 0; i < dim; i++) {
        if (!isfinite(v[i]))
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %s[%zu] is %s: elements must be finite", who, name, i,
                            isnan(v[i]) ? "nan" : v[i] > 0 ? "inf" : "-inf");
        ss += (double)v[i] * v[i];
    }
    if (ss == 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %s is the zero vector, which has no direction", who, name);
    double inv = 1.0 / sqrt(ss);
    for (size_t i = 0; i < dim; i++) unit[i] = (float)(v[i] * inv);
    return KVGEN_OK;
}

/* the record of one memory in one allocation; NULL when out of memory */
static bool make_rec(kvgen_memory *m, const char *text, size_t tlen, const kvgen_memory_field *f, size_t nf,
                     mem_rec *r) {
    size_t bytes = nf * (sizeof *r->fields + 2 * sizeof *r->fid) + tlen + 1;
    for (size_t i = 0; i < nf; i++) bytes += strlen(f[i].key) + strlen(f[i].value) + 2;
    unsigned char *b = kvg_malloc(bytes);
    if (!b) return false;
    kvgen_memory_field *fields = (kvgen_memory_field *)b;
    uint32_t *fid = (uint32_t *)(b + nf * sizeof *fields);
    char *p = (char *)(fid + 2 * nf);
    char *t = p;
    memcpy(p, text, tlen);
    p[tlen] = 0;
    p += tlen + 1;
    for (size_t i = 0; i < nf; i++) {
        size_t kl = strlen(f[i].key), vl = strlen(f[i].value);
        memcpy(p, f[i].key, kl + 1);
        fields[i].key = p;
        p += kl + 1;
        memcpy(p, f[i].value, vl + 1);
        fields[i].value = p;
        p += vl + 1;
        fid[2 * i] = str_intern(m, f[i].key);
        fid[2 * i + 1] = str_intern(m, f[i].value);
        if (fid[2 * i] == UINT32_MAX || fid[2 * i + 1] == UINT32_MAX) {
            kvg_free(b);
            return false;
        }
    }
    /* the allocation starts at the fields when there are any: text points inside it; free
     * goes through the block's start, kept as `text` when there are no fields */
    r->text = t;
    r->fields = nf ? fields : NULL;
    r->fid = fid;
    r->n_fields = (uint32_t)nf;
    for (size_t i = 0; i < nf && i < NEAR_FIELDS; i++) {
        r->near[2 * i] = fid[2 * i];
        r->near[2 * i + 1] = fid[2 * i + 1];
    }
    return true;
}


static void store_row(kvgen_memory *m, size_t slot, const float *unit) {
    unsigned char *dst = m->vecs + slot * (size_t)m->dim * m->es;
    if (m->storage == KVGEN_MEMORY_F32) {
        memcpy(dst, unit, (size_t)m->dim * 4);
    } else {
        uint16_t *h = (uint16_t *)dst;
        for (int i = 0; i < m->dim; i++) h[i] = kvg_f32_to_f16(unit[i]);
    }
}

kvgen_status kvgen_memory_add(kvgen_memory *m, const char *text, const kvgen_memory_field *fields, size_t n_fields,
                              const float *vec, size_t dim, uint64_t *id, kvgen_error *err) {
    static const char who[] = "kvgen_memory_add";
    if (id) *id = 0;
    if (!m) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: mem is NULL", who);
    if (!text) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: text is NULL", who);
    size_t tlen = strlen(text);
    if (tlen > MAX_TEXT)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: text of %zu bytes is longer than %zu", who, tlen, MAX_TEXT);
    if (n_fields && !fields)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: fields is NULL with n_fields %zu", who, n_fields);
    if (n_fields > MAX_FIELDS)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: n_fields %zu is more than %d", who, n_fields, MAX_FIELDS);
    for (size_t i = 0; i < n_fields; i++) {
        if (!fields[i].key || !*fields[i].key)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: fields[%zu].key is %s", who, i,
                            fields[i].key ? "empty" : "NULL");
        if (!fields[i].value)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: fields[%zu].value (key '%s') is NULL", who, i,
                            fields[i].key);
        if (strlen(fields[i].key) > MAX_STRING || strlen(fields[i].value) > MAX_STRING)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: fields[%zu] (key '%.64s'): longer than %zu bytes", who,
                            i, fields[i].key, MAX_STRING);
        for (size_t j = 0; j < i; j++)
            if (strcmp(fields[j].key, fields[i].key) == 0)
                return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: fields[%zu].key '%s' repeats fields[%zu].key", who,
                                i, fields[i].key, j);
    }
    float *unit = kvg_malloc((size_t)m->dim * sizeof *unit);
    if (!unit) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    kvgen_status st = unit_vector(who, "vec", m, vec, dim, unit, err);
    mem_rec r;
    if (st == KVGEN_OK && (!reserve(m, m->n + 1) || !make_rec(m, text, tlen, fields, n_fields, &r)))
        st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory adding memory %zu", who, m->n + 1);
    if (st == KVGEN_OK) {
        size_t slot = m->n++;
        store_row(m, slot, unit);
        m->ids[slot] = m->next_id;
        m->recs[slot] = r;
        map_put(m, m->next_id, slot);
        if (id) *id = m->next_id;
        m->next_id++;
    }
    kvg_free(unit);
    return st;
}

kvgen_status kvgen_memory_remove(kvgen_memory *m, uint64_t id, kvgen_error *err) {
    if (!m) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_memory_remove: mem is NULL");
    size_t h = map_find(m, id);
    if (h == SIZE_MAX)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_memory_remove: id %llu: no such memory in the store",
                        (unsigned long long)id);
    size_t slot = m->map_slot[h], last = m->n - 1;
    map_del(m, h);
    kvg_free(rec_block(&m->recs[slot]));
    if (slot != last) {
        size_t row = (size_t)m->dim * m->es;
        memcpy(m->vecs + slot * row, m->vecs + last * row, row);
        m->ids[slot] = m->ids[last];
        m->recs[slot] = m->recs[last];
        m->map_slot[map_find(m, m->ids[slot])] = slot;
    }
    m->n--;
    return KVGEN_OK;
}

kvgen_status kvgen_memory_get(const kvgen_memory *m, uint64_t id, kvgen_memory_entry *out, float *vec, size_t dim,
                              kvgen_error *err) {
    if (out) memset(out, 0, sizeof *out);
    if (!m) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_memory_get: mem is NULL");
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_memory_get: out is NULL");
    if (vec && dim != (size_t)m->dim)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_memory_get: vec has %zu elements, the store's dim is %d",
                        dim, m->dim);
    size_t h = map_find(m, id);
    if (h == SIZE_MAX)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_memory_get: id %llu: no such memory in the store",
                        (unsigned long long)id);
    size_t slot = m->map_slot[h];
    const mem_rec *r = &m->recs[slot];
    out->id = id;
    out->text = r->text;
    out->fields = r->fields;
    out->n_fields = r->n_fields;
    if (vec) {
        const unsigned char *row = m->vecs + slot * (size_t)m->dim * m->es;
        if (m->storage == KVGEN_MEMORY_F32)
            memcpy(vec, row, (size_t)m->dim * 4);
        else
            for (int i = 0; i < m->dim; i++) vec[i] = kvg_f16_to_f32(((const uint16_t *)row)[i]);
    }
    return KVGEN_OK;
}

/* ---- search ------------------------------------------------------------------------------- */

/* a is worse than b: a lower score, or the same score and a higher id */
static inline bool worse(const kvgen_memory_hit *a, const kvgen_memory_hit *b) {
    return a->score < b->score || (a->score == b->score && a->id > b->id);
}

static void sift_down(kvgen_memory_hit *h, size_t n, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, w = i;
        if (l < n && worse(&h[l], &h[w])) w = l;
        if (l + 1 < n && worse(&h[l + 1], &h[w])) w = l + 1;
        if (w == i) return;
        kvgen_memory_hit t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* the bounded heap (worst at the root) of the k best so far */
typedef struct topk {
    kvgen_memory_hit *h;
    size_t n, k;
} topk;

static inline void topk_offer(topk *t, uint64_t id, float score) {
    kvgen_memory_hit c = {id, score};
    if (t->n < t->k) {
        size_t i = t->n++;
        t->h[i] = c;
        while (i > 0) { /* sift up */
            size_t p = (i - 1) / 2;
            if (!worse(&t->h[i], &t->h[p])) break;
            kvgen_memory_hit x = t->h[i];
            t->h[i] = t->h[p];
            t->h[p] = x;
            i = p;
        }
    } else if (worse(&t->h[0], &c)) {
        t->h[0] = c;
        sift_down(t->h, t->n, 0);
    }
}

static void dot_block(const kvgen_memory *m, const float *q, size_t slot, int rows, float *out) {
    const unsigned char *k = m->vecs + slot * (size_t)m->dim * m->es;
    if (m->storage == KVGEN_MEMORY_F32)
        m->ops->dot_rows(q, (const float *)k, (size_t)m->dim, rows, m->dim, out);
    else
        m->ops->dot_rows_f16(q, (const uint16_t *)k, (size_t)m->dim, rows, m->dim, out);
}

static bool rec_matches(const mem_rec *r, uint32_t key, uint32_t value) {
    for (uint32_t i = 0; i < r->n_fields && i < NEAR_FIELDS; i++)
        if (r->near[2 * i] == key) return r->near[2 * i + 1] == value;
    for (uint32_t i = NEAR_FIELDS; i < r->n_fields; i++)
        if (r->fid[2 * i] == key) return r->fid[2 * i + 1] == value;
    return false;
}

kvgen_status kvgen_memory_search(const kvgen_memory *m, const float *query, size_t dim, size_t k,
                                 const kvgen_memory_field *where, kvgen_memory_hit *out, size_t *n_out,
                                 kvgen_error *err) {
    static const char who[] = "kvgen_memory_search";
    if (n_out) *n_out = 0;
    if (!m) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: mem is NULL", who);
    if (!n_out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: n_out is NULL", who);
    if (k > 0 && !out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: out is NULL with k %zu", who, k);
    if (where && (!where->key || !where->value))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: where->%s is NULL", who, where->key ? "value" : "key");
    float qbuf[512];
    float *q = m->dim <= 512 ? qbuf : kvg_malloc((size_t)m->dim * sizeof *q);
    if (!q) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    kvgen_status st = unit_vector(who, "query", m, query, dim, q, err);
    if (st != KVGEN_OK || k == 0 || m->n == 0) {
        if (q != qbuf) kvg_free(q);
        return st;
    }
    topk t = {out, 0, k};
    float scores[BLOCK];
    if (!where) {
        for (size_t s = 0; s < m->n; s += BLOCK) {
            int rows = m->n - s < BLOCK ? (int)(m->n - s) : BLOCK;
            dot_block(m, q, s, rows, scores);
            for (int r = 0; r < rows; r++) topk_offer(&t, m->ids[s + (size_t)r], scores[r]);
        }
    } else {
        uint32_t key = str_find(m, where->key), value = str_find(m, where->value);
        /* per block: the matching rows one by one (only their bytes are read: a large store is
         * bound by memory bandwidth), or the whole block in one call when most of it matches */
        unsigned short match[BLOCK];
        for (size_t s = 0; key != UINT32_MAX && value != UINT32_MAX && s < m->n; s += BLOCK) {
            int rows = m->n - s < BLOCK ? (int)(m->n - s) : BLOCK, nm = 0;
            for (int r = 0; r < rows; r++)
                if (rec_matches(&m->recs[s + (size_t)r], key, value)) match[nm++] = (unsigned short)r;
            if (nm * 3 >= rows * 2) {
                dot_block(m, q, s, rows, scores);
                for (int i = 0; i < nm; i++) topk_offer(&t, m->ids[s + match[i]], scores[match[i]]);
            } else {
                for (int i = 0; i < nm; i++) {
                    dot_block(m, q, s + match[i], 1, scores);
                    topk_offer(&t, m->ids[s + match[i]], scores[0]);
                }
            }
        }
    }
    if (q != qbuf) kvg_free(q);
    /* best first: pop the worst to the back */
    for (size_t n = t.n; n > 1; n--) {
        kvgen_memory_hit x = out[0];
        out[0] = out[n - 1];
        out[n - 1] = x;
        sift_down(out, n - 1, 0);
    }
    *n_out = t.n;
    return KVGEN_OK;
}

/* ---- save --------------------------------------------------------------------------------- */

typedef struct bufw {
    kvg_file_writer *w;
    unsigned char buf[1 << 16];
    size_t n;
} bufw;

static void bw_flush(bufw *b) {
    kvg_fw_write(b->w, b->buf, b->n);
    b->n = 0;
}

static void bw_put(bufw *b, const void *data, size_t n) {
    const unsigned char *p = data;
    while (n > 0) {
        if (b->n == sizeof b->buf) bw_flush(b);
        size_t c = sizeof b->buf - b->n < n ? sizeof b->buf - b->n : n;
        memcpy(b->buf + b->n, p, c);
        b->n += c;
        p += c;
        n -= c;
    }
}

static void bw_u32(bufw *b, uint32_t v) {
    unsigned char x[4];
    kvg_put_u32(x, v);
    bw_put(b, x, 4);
}

static void bw_str(bufw *b, const char *s) {
    size_t n = strlen(s);
    bw_u32(b, (uint32_t)n);
    bw_put(b, s, n);
}

static int by_id(const void *a, const void *b, void *ids_) {
    const uint64_t *ids = ids_;
    uint64_t x = ids[*(const size_t *)a], y = ids[*(const size_t *)b];
    return x < y ? -1 : x > y;
}

/* the slots in the order of their ids */
static void sort_slots(const kvgen_memory *m, size_t *order) {
    for (size_t i = 0; i < m->n; i++) order[i] = i;
    /* a plain merge sort keeps this portable (qsort has no context argument in C11) */
    size_t *tmp = order + m->n;
    for (size_t w = 1; w < m->n; w *= 2)
        for (size_t lo = 0; lo < m->n; lo += 2 * w) {
            size_t mid = lo + w < m->n ? lo + w : m->n, hi = lo + 2 * w < m->n ? lo + 2 * w : m->n;
            size_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) tmp[o++] = by_id(&order[j], &order[i], m->ids) < 0 ? order[j++] : order[i++];
            while (i < mid) tmp[o++] = order[i++];
            while (j < hi) tmp[o++] = order[j++];
            memcpy(order + lo, tmp + lo, (hi - lo) * sizeof *order);
        }
}

kvgen_status kvgen_memory_save(const kvgen_memory *m, const char *path, kvgen_error *err) {
    static const char who[] = "kvgen_memory_save";
    if (!m) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: mem is NULL", who);
    if (!path || !*path) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: path is empty", who);
    kvg_save sv;
    kvgen_status st = kvg_save_prepare(&sv, who, path, err);
    if (st != KVGEN_OK) return st;
    size_t *order = kvg_malloc((2 * m->n + 1) * sizeof *order);
    bufw *b = kvg_malloc(sizeof *b);
    if (!order || !b) {
        kvg_free(order);
        kvg_free(b);
        kvg_save_done(&sv);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: %s: out of memory", who, path);
    }
    sort_slots(m, order);
    uint64_t records = 0;
    for (size_t i = 0; i < m->n; i++) {
        const mem_rec *r = &m->recs[i];
        records += 8 + strlen(r->text);
        for (uint32_t f = 0; f < r->n_fields; f++)
            records += 8 + strlen(r->fields[f].key) + strlen(r->fields[f].value);
    }
    size_t row = (size_t)m->dim * m->es;
    uint64_t file_bytes = HEADER_BYTES + (uint64_t)m->n * (8 + row) + records + 8;
    unsigned char h[HEADER_BYTES] = {0};
    memcpy(h, MAGIC, 8);
    kvg_put_u32(h + 8, VERSION);
    kvg_put_u32(h + 12, (uint32_t)m->storage);
    kvg_put_u32(h + 16, (uint32_t)m->dim);
    kvg_put_u64(h + 24, m->embedding_id);
    kvg_put_u64(h + 32, m->n);
    kvg_put_u64(h + 40, m->next_id);
    kvg_put_u64(h + 48, records);
    kvg_put_u64(h + 56, file_bytes);
    st = kvg_save_open(&sv, err);
    if (st != KVGEN_OK) {
        kvg_free(order);
        kvg_free(b);
        kvg_save_done(&sv);
        return st;
    }
    b->w = &sv.w;
    b->n = 0;
    bw_put(b, h, sizeof h);
    for (size_t i = 0; i < m->n; i++) {
        unsigned char x[8];
        kvg_put_u64(x, m->ids[order[i]]);
        bw_put(b, x, 8);
    }
    for (size_t i = 0; i < m->n; i++) {
        const unsigned char *src = m->vecs + order[i] * row;
        for (int e = 0; e < m->dim; e++) {
            unsigned char x[4];
            if (m->es == 4) {
                uint32_t v;
                memcpy(&v, src + 4 * (size_t)e, 4);
                kvg_put_u32(x, v);
            } else {
                uint16_t v;
                memcpy(&v, src + 2 * (size_t)e, 2);
                x[0] = (unsigned char)v;
                x[1] = (unsigned char)(v >> 8);
            }
            bw_put(b, x, m->es);
        }
    }
    for (size_t i = 0; i < m->n; i++) {
        const mem_rec *r = &m->recs[order[i]];
        bw_str(b, r->text);
        bw_u32(b, r->n_fields);
        for (uint32_t f = 0; f < r->n_fields; f++) {
            bw_str(b, r->fields[f].key);
            bw_str(b, r->fields[f].value);
        }
    }
    bw_flush(b);
    kvg_free(order);
    kvg_free(b);
    return kvg_save_commit(&sv, KVGEN_OK, err);
}

/* ---- load --------------------------------------------------------------------------------- */

/* one string of the records section at *p (end e) into a fresh copy; NULL when malformed */
static bool read_str(const unsigned char **p, const unsigned char *e, size_t max, const char **s, size_t *len) {
    if (e - *p < 4) return false;
    size_t n = kvg_get_u32(*p);
    *p += 4;
    if (n > max || (size_t)(e - *p) < n || memchr(*p, 0, n)) return false;
    *s = (const char *)*p;
    *len = n;
    *p += n;
    return true;
}

/* Reads the checksum that ends the file and compares it with the sum of what was read before it:
 * 1 they match, 0 they differ, -1 the read failed (r->error or r->short_read says how). */
static int checksum_matches(kvg_file_reader *r) {
    kvg_hash64 sum = r->sum;
    unsigned char stored[8];
    kvg_fr_read(r, stored, 8);
    if (r->error || r->short_read) return -1;
    return kvg_hash64_final(&sum) == kvg_get_u64(stored);
}

kvgen_status kvgen_memory_load(const char *path, const kvgen_memory_desc *expect, kvgen_memory **out,
                               kvgen_error *err) {
    static const char who[] = "kvgen_memory_load";
    if (out) *out = NULL;
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: out is NULL", who);
    if (!path || !*path) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: path is empty", who);
    if (expect && (expect->dim < 0 || expect->dim > MAX_DIM))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: expect->dim %d is out of range [0, %d]", who, expect->dim,
                        MAX_DIM);
    int fd = -1;
    uint64_t size = 0;
    kvgen_status st = kvg_file_open_regular(who, path, &fd, &size, err);
    if (st != KVGEN_OK) return st;
    kvgen_memory *m = NULL;
    unsigned char *records = NULL, *idbuf = NULL;
    unsigned char h[HEADER_BYTES] = {0};
    kvg_file_reader r = {fd, 0, KVG_HASH64_INIT, 0, false};
#define REFUSE(status, ...)                                                                                            \
    do {                                                                                                               \
        st = kvg_fail(err, status, __VA_ARGS__);                                                                       \
        goto done;                                                                                                     \
    } while (0)
#define READ_FAILED()                                                                                                  \
    REFUSE(KVGEN_E_IO, "%s: %s: %s", who, path, r.error ? strerror(r.error) : "the file changed while it was read")
    kvg_fr_read(&r, h, size < HEADER_BYTES ? (size_t)size : HEADER_BYTES);
    if (r.error || r.short_read) READ_FAILED();
    if (size < 8 || memcmp(h, MAGIC, 8) != 0)
        REFUSE(KVGEN_E_FORMAT, "%s: %s: not a kvgen memory file (no KVGMEMO magic)", who, path);
    if (size < 12) REFUSE(KVGEN_E_FORMAT, "%s: %s: truncated: %llu bytes, no format version", who, path,
                          (unsigned long long)size);
    uint32_t version = kvg_get_u32(h + 8);
    if (version > VERSION)
        REFUSE(KVGEN_E_UNSUPPORTED, "%s: %s: memory format version %u is newer than this kvgen reads (%u)", who, path,
               (unsigned)version, VERSION);
    if (version == 0) REFUSE(KVGEN_E_FORMAT, "%s: %s: memory format version 0 does not exist", who, path);
    if (size < HEADER_BYTES + 8)
        REFUSE(KVGEN_E_FORMAT, "%s: %s: truncated: %llu bytes, shorter than the %d-byte header", who, path,
               (unsigned long long)size, HEADER_BYTES + 8);
    uint64_t file_bytes = kvg_get_u64(h + 56);
    if (size < file_bytes)
        REFUSE(KVGEN_E_FORMAT, "%s: %s: truncated: %llu of %llu bytes", who, path, (unsigned long long)size,
               (unsigned long long)file_bytes);
    if (size > file_bytes)
        REFUSE(KVGEN_E_FORMAT, "%s: %s: corrupted: %llu bytes where the header says %llu", who, path,
               (unsigned long long)size, (unsigned long long)file_bytes);
    uint32_t storage = kvg_get_u32(h + 12), dim = kvg_get_u32(h + 16);
    uint64_t count = kvg_get_u64(h + 32), next_id = kvg_get_u64(h + 40), rec_bytes = kvg_get_u64(h + 48);
    uint64_t eid = kvg_get_u64(h + 24);
    size_t es = storage == 1 ? 2 : 4;
    /* sizes that do not add up, or a header this kvgen cannot hold, is corruption: told apart
     * from a well-formed file by the checksum, streamed, before anything sized by it is made */
    bool sane = storage <= 1 && dim >= 1 && dim <= MAX_DIM && count < file_bytes && rec_bytes < file_bytes &&
                HEADER_BYTES + count * (8 + (uint64_t)dim * es) + rec_bytes + 8 == file_bytes && count < next_id;
    const char *mismatch = NULL;
    if (sane && expect && expect->dim && (uint32_t)expect->dim != dim) mismatch = "dim";
    if (sane && !mismatch && expect && expect->embedding_id && expect->embedding_id != eid) mismatch = "identity";
    if (!sane || mismatch) {
        if (!kvg_fr_hash_to(&r, file_bytes - 8)) READ_FAILED();
        int sum_ok = checksum_matches(&r);
        if (sum_ok < 0) READ_FAILED();
        if (!sum_ok) REFUSE(KVGEN_E_FORMAT, "%s: %s: corrupted: checksum mismatch", who, path);
        if (!sane) REFUSE(KVGEN_E_FORMAT, "%s: %s: malformed header (storage %u, dim %u, %llu memories)", who, path,
                          (unsigned)storage, (unsigned)dim, (unsigned long long)count);
        if (mismatch[0] == 'd')
            REFUSE(KVGEN_E_INVALID_ARGUMENT, "%s: %s: vectors of dim %u, expected %d", who, path, (unsigned)dim,
                   expect->dim);
        REFUSE(KVGEN_E_INVALID_ARGUMENT,
               "%s: %s: made with another embedding model (embedding identity %016llx, expected %016llx)", who, path,
               (unsigned long long)eid, (unsigned long long)expect->embedding_id);
    }
    st = new_store(who, (int)dim, (kvgen_memory_storage)storage, eid, &m, err);
    if (st != KVGEN_OK) goto done;
    size_t n = (size_t)count, row = (size_t)dim * es;
    if (!reserve(m, n ? n : 1) || !(records = kvg_malloc(rec_bytes ? (size_t)rec_bytes : 1)) ||
        !(idbuf = kvg_malloc(n ? n * 8 : 1)))
        REFUSE(KVGEN_E_NO_MEMORY, "%s: %s: out of memory loading %llu memories", who, path, (unsigned long long)count);
    kvg_fr_read(&r, idbuf, n * 8);
    kvg_fr_read(&r, m->vecs, n * row);
    kvg_fr_read(&r, records, (size_t)rec_bytes);
    int sum_ok = checksum_matches(&r);
    if (sum_ok < 0) READ_FAILED();
    if (!sum_ok) REFUSE(KVGEN_E_FORMAT, "%s: %s: corrupted: checksum mismatch", who, path);
    /* the checksum matched: what follows guards against a file crafted to match it */
    for (size_t i = 0; i < n; i++) {
        uint64_t id = kvg_get_u64(idbuf + 8 * i);
        if (id == 0 || id >= next_id || (i > 0 && id <= m->ids[i - 1]))
            REFUSE(KVGEN_E_FORMAT, "%s: %s: memory %zu: id %llu is out of order or range", who, path, i,
                   (unsigned long long)id);
        m->ids[i] = id;
    }
    for (size_t i = 0; i < n * dim; i++) {
        unsigned char *p = m->vecs + i * es;
        bool finite;
        if (es == 4) {
            uint32_t v = kvg_get_u32(p);
            memcpy(p, &v, 4);
            finite = ((v >> 23) & 0xff) != 0xff;
        } else {
            uint16_t v = (uint16_t)(p[0] | p[1] << 8);
            memcpy(p, &v, 2);
            finite = ((v >> 10) & 0x1f) != 0x1f;
        }
        if (!finite)
            REFUSE(KVGEN_E_FORMAT, "%s: %s: memory %zu: element %zu is not finite", who, path, i / dim, i % dim);
    }
    const unsigned char *p = records, *e = records + rec_bytes;
    for (size_t i = 0; i < n; i++) {
        const char *text;
        size_t tlen;
        kvgen_memory_field f[MAX_FIELDS];
        char *copies[2 * MAX_FIELDS];
        uint32_t nf = 0;
        bool ok = read_str(&p, e, MAX_TEXT, &text, &tlen) && e - p >= 4 && (nf = kvg_get_u32(p)) <= MAX_FIELDS;
        if (ok) p += 4;
        size_t nc = 0;
        for (uint32_t j = 0; ok && j < nf; j++) {
            const char *s[2];
            size_t l[2];
            ok = read_str(&p, e, MAX_STRING, &s[0], &l[0]) && l[0] > 0 && read_str(&p, e, MAX_STRING, &s[1], &l[1]);
            for (int c = 0; ok && c < 2; c++) {
                copies[nc] = kvg_strndup(s[c], l[c]);
                ok = copies[nc++] != NULL;
            }
            if (ok) {
                f[j].key = copies[nc - 2];
                f[j].value = copies[nc - 1];
            }
        }
        char *tcopy = ok ? kvg_strndup(text, tlen) : NULL;
        ok = ok && tcopy && make_rec(m, tcopy, tlen, f, nf, &m->recs[i]);
        kvg_free(tcopy);
        for (size_t c = 0; c < nc; c++) kvg_free(copies[c]);
        if (!ok) REFUSE(KVGEN_E_FORMAT, "%s: %s: memory %zu (id %llu): malformed record", who, path, i,
                        (unsigned long long)m->ids[i]);
        map_put(m, m->ids[i], i);
        m->n = i + 1;
    }
    if (p != e) REFUSE(KVGEN_E_FORMAT, "%s: %s: %zu bytes after the last record", who, path, (size_t)(e - p));
    m->next_id = next_id;
#undef READ_FAILED
#undef REFUSE
done:
    if (fd >= 0) close(fd);
    kvg_free(records);
    kvg_free(idbuf);
    if (st != KVGEN_OK) {
        kvgen_memory_free(m);
        return st;
    }
    *out = m;
    return KVGEN_OK;
}
