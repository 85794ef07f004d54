/* gguf.c: GGUF v2/v3 reader (read-only mmap) and v3 writer.
 *
 * The reader trusts nothing in the file: every count, length and offset is checked against the
 * bytes that remain before it is used, with arithmetic that cannot overflow, so the memory it
 * allocates is bounded by a small multiple of the file size. On any problem it returns
 * KVGEN_E_FORMAT (KVGEN_E_UNSUPPORTED for a version or tensor type it knows but cannot use)
 * with a message that names the file and what is wrong. */
#define _POSIX_C_SOURCE 200809L
#include "kvg_gguf.h"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_error.h"
#include "kvg_host.h"
#include "kvg_platform.h"
#include "kvg_types.h"
#include "kvg_str.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_NESTING 8 /* arrays of arrays deeper than this are refused (bounds recursion) */

typedef struct kv_entry {
    char *key;
    kvg_gguf_vtype type;
    const uint8_t *val; /* encoded value, just after the type field */
    uint64_t val_size;
    /* arrays */
    kvg_gguf_vtype elem_type;
    uint64_t count;
    const uint8_t *elems;  /* first element */
    const uint8_t **items; /* string and array elements: where each starts (random access) */
} kv_entry;

/* open-addressing hash of names to indices; capacity is a power of two >= 2n */
typedef struct name_index {
    int32_t *slots; /* -1 empty */
    uint64_t mask;
} name_index;

struct kvg_gguf {
    char *path;
    const uint8_t *map;
    size_t size;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    int n_kv;
    kv_entry *kv;
    int n_tensors;
    kvg_tensor *tensors;
    name_index kv_index, tensor_index;
};

/* ---- small helpers ---- */

static uint16_t rd_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t rd_u64(const uint8_t *p) { return (uint64_t)rd_u32(p) | ((uint64_t)rd_u32(p + 4) << 32); }

static uint64_t name_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static bool index_init(name_index *ix, int n) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap <<= 1;
    ix->slots = kvg_malloc(cap * sizeof *ix->slots);
    if (!ix->slots) return false;
    memset(ix->slots, 0xff, cap * sizeof *ix->slots);
    ix->mask = cap - 1;
    return true;
}

typedef const char *(*name_of_fn)(const kvg_gguf *g, int i);
static const char *kv_name(const kvg_gguf *g, int i) { return g->kv[i].key; }
static const char *tensor_name(const kvg_gguf *g, int i) { return g->tensors[i].name; }

static int index_find(const kvg_gguf *g, const name_index *ix, name_of_fn name_of, const char *name) {
    if (!ix->slots || !name) return -1;
    for (uint64_t h = name_hash(name, strlen(name)) & ix->mask;; h = (h + 1) & ix->mask) {
        int32_t i = ix->slots[h];
        if (i < 0) return -1;
        if (strcmp(name_of(g, i), name) == 0) return i;
    }
}

/* inserts i; returns the index already holding the same name, or -1 */
static int index_add(const kvg_gguf *g, name_index *ix, name_of_fn name_of, int i) {
    const char *name = name_of(g, i);
    for (uint64_t h = name_hash(name, strlen(name)) & ix->mask;; h = (h + 1) & ix->mask) {
        int32_t j = ix->slots[h];
        if (j < 0) {
            ix->slots[h] = i;
            return -1;
        }
        if (strcmp(name_of(g, j), name) == 0) return j;
    }
}

static const char *vtype_name(uint32_t t) {
    static const char *const names[] = {"uint8", "int8",  "uint16", "int16", "uint32", "int32", "float32",
                                        "bool",  "string", "array", "uint64", "int64", "float64"};
    return t < KVG_GGUF_VTYPE_COUNT ? names[t] : "unknown";
}

/* size of one scalar of a fixed-size type; 0 for string, array and unknown */
static uint64_t vtype_size(uint32_t t) {
    switch (t) {
    case KVG_GGUF_UINT8: case KVG_GGUF_INT8: case KVG_GGUF_BOOL: return 1;
    case KVG_GGUF_UINT16: case KVG_GGUF_INT16: return 2;
    case KVG_GGUF_UINT32: case KVG_GGUF_INT32: case KVG_GGUF_FLOAT32: return 4;
    case KVG_GGUF_UINT64: case KVG_GGUF_INT64: case KVG_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* ---- parsing ---- */

typedef struct parser {
    const kvg_gguf *g;
    uint64_t pos;
    kvgen_error *err;
    char what[160]; /* what is being read, for messages */
} parser;

static uint64_t remaining(const parser *p) { return p->g->size - p->pos; }

static kvgen_status truncated(parser *p, uint64_t need) {
    return kvg_fail(p->err, KVGEN_E_FORMAT,
                    "%s: truncated file: %s extends past end of file (offset %" PRIu64 ", need %" PRIu64
                    " bytes, file %zu)",
                    p->g->path, p->what, p->pos, need, p->g->size);
}

static kvgen_status need(parser *p, uint64_t n) { return n <= remaining(p) ? KVGEN_OK : truncated(p, n); }

static kvgen_status read_u32(parser *p, uint32_t *v) {
    kvgen_status st = need(p, 4);
    if (st) return st;
    *v = rd_u32(p->g->map + p->pos);
    p->pos += 4;
    return KVGEN_OK;
}

static kvgen_status read_u64(parser *p, uint64_t *v) {
    kvgen_status st = need(p, 8);
    if (st) return st;
    *v = rd_u64(p->g->map + p->pos);
    p->pos += 8;
    return KVGEN_OK;
}

/* a length-prefixed string; *s points into the mapping */
static kvgen_status read_str(parser *p, const uint8_t **s, uint64_t *len) {
    kvgen_status st = read_u64(p, len);
    if (st) return st;
    if (*len > remaining(p)) {
        return kvg_fail(p->err, KVGEN_E_FORMAT,
                        "%s: %s: string length %" PRIu64 " extends past end of file (offset %" PRIu64
                        ", file %zu)",
                        p->g->path, p->what, *len, p->pos, p->g->size);
    }
    *s = p->g->map + p->pos;
    p->pos += *len;
    return KVGEN_OK;
}

static kvgen_status copy_name(parser *p, const uint8_t *s, uint64_t len, char **out) {
    if (memchr(s, 0, (size_t)len))
        return kvg_fail(p->err, KVGEN_E_FORMAT, "%s: %s contains a NUL byte", p->g->path, p->what);
    char *c = kvg_malloc((size_t)len + 1);
    if (!c) return kvg_fail(p->err, KVGEN_E_NO_MEMORY, "%s: out of memory", p->g->path);
    memcpy(c, s, (size_t)len);
    c[len] = 0;
    *out = c;
    return KVGEN_OK;
}

/* Skips over one value of type t, checking it lies inside the file. When `items` is not NULL
 * and the value is an array of strings or arrays, it records where each element starts. */
static kvgen_status skip_value(parser *p, uint32_t t, int depth, kv_entry *e) {
    uint64_t sz = vtype_size(t);
    if (sz) {
        kvgen_status st = need(p, sz);
        if (!st) p->pos += sz;
        return st;
    }
    if (t == KVG_GGUF_STRING) {
        const uint8_t *s = NULL;
        uint64_t len = 0;
        return read_str(p, &s, &len);
    }
    if (t != KVG_GGUF_ARRAY)
        return kvg_fail(p->err, KVGEN_E_FORMAT, "%s: %s has unknown value type %" PRIu32, p->g->path, p->what, t);
    if (depth >= GGUF_MAX_NESTING)
        return kvg_fail(p->err, KVGEN_E_FORMAT, "%s: %s: arrays nested deeper than %d", p->g->path, p->what,
                        GGUF_MAX_NESTING);
    uint32_t et;
    uint64_t count;
    kvgen_status st = read_u32(p, &et);
    if (!st) st = read_u64(p, &count);
    if (st) return st;
    uint64_t esz = vtype_size(et);
    uint64_t min_size = esz ? esz : et == KVG_GGUF_STRING ? 8 : et == KVG_GGUF_ARRAY ? 12 : 0;
    if (min_size == 0)
        return kvg_fail(p->err, KVGEN_E_FORMAT, "%s: %s: array has unknown element type %" PRIu32, p->g->path,
                        p->what, et);
    if (count > remaining(p) / min_size) {
        return kvg_fail(p->err, KVGEN_E_FORMAT,
                        "%s: %s: array of %" PRIu64 " %s elements extends past end of file (offset %" PRIu64
                        ", file %zu)",
                        p->g->path, p->what, count, vtype_name(et), p->pos, p->g->size);
    }
    if (e) {
        e->elem_type = (kvg_gguf_vtype)et;
        e->count = count;
        e->elems = p->g->map + p->pos;
    }
    if (esz) {
        p->pos += count * esz;
        return KVGEN_OK;
    }
    if (e && count) {
        /* count <= remaining/8, so this allocation is bounded by the file size */
        e->items = kvg_malloc((size_t)count * sizeof *e->items);
        if (!e->items) return kvg_fail(p->err, KVGEN_E_NO_MEMORY, "%s: out of memory", p->g->path);
    }
    for (uint64_t i = 0; i < count; i++) {
        if (e) e->items[i] = p->g->map + p->pos;
        st = skip_value(p, et, depth + 1, NULL);
        if (st) return st;
    }
    return KVGEN_OK;
}

static kvgen_status fail_kv_type(parser *p, const kv_entry *e, const char *want) {
    return kvg_fail(p->err, KVGEN_E_FORMAT, "%s: key '%s' has type %s, expected %s", p->g->path, e->key,
                    vtype_name(e->type), want);
}

static kvgen_status parse_kvs(parser *p, kvg_gguf *g) {
    for (int i = 0; i < g->n_kv; i++) {
        kv_entry *e = &g->kv[i];
        const uint8_t *s = NULL;
        uint64_t len = 0;
        snprintf(p->what, sizeof p->what, "key %d", i);
        kvgen_status st = read_str(p, &s, &len);
        if (!st) st = copy_name(p, s, len, &e->key);
        if (st) return st;
        snprintf(p->what, sizeof p->what, "key '%.100s'", e->key);
        uint32_t t;
        if ((st = read_u32(p, &t))) return st;
        if (t >= KVG_GGUF_VTYPE_COUNT)
            return kvg_fail(p->err, KVGEN_E_FORMAT, "%s: key '%s' has unknown value type %" PRIu32, g->path, e->key,
                            t);
        e->type = (kvg_gguf_vtype)t;
        e->val = g->map + p->pos;
        uint64_t start = p->pos;
        if ((st = skip_value(p, t, 0, e))) return st;
        e->val_size = p->pos - start;
        int dup = index_add(g, &g->kv_index, kv_name, i);
        if (dup >= 0)
            return kvg_fail(p->err, KVGEN_E_FORMAT, "%s: duplicate key '%s' (entries %d and %d)", g->path, e->key,
                            dup, i);
    }
    int ai = index_find(g, &g->kv_index, kv_name, "general.alignment");
    if (ai >= 0) {
        kv_entry *e = &g->kv[ai];
        if (e->type != KVG_GGUF_UINT32) return fail_kv_type(p, e, "uint32");
        uint32_t a = rd_u32(e->val);
        if (a == 0 || (a & (a - 1)) != 0)
            return kvg_fail(p->err, KVGEN_E_FORMAT, "%s: general.alignment %" PRIu32 " is not a power of two",
                            g->path, a);
        g->alignment = a;
    }
    return KVGEN_OK;
}

static int cmp_tensor_offset(const void *a, const void *b) {
    const kvg_tensor *x = *(const kvg_tensor *const *)a, *y = *(const kvg_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static kvgen_status parse_tensor_info(parser *p, kvg_gguf *g, int i) {
    kvg_tensor *t = &g->tensors[i];
    const uint8_t *s = NULL;
    uint64_t len = 0;
    snprintf(p->what, sizeof p->what, "tensor %d name", i);
    kvgen_status st = read_str(p, &s, &len);
    if (!st) st = copy_name(p, s, len, (char **)&t->name);
    if (st) return st;
    snprintf(p->what, sizeof p->what, "tensor %.100s info", t->name);
    uint32_t n_dims, type;
    if ((st = read_u32(p, &n_dims))) return st;
    if (n_dims == 0 || n_dims > 4)
        return kvg_fail(p->err, KVGEN_E_FORMAT, "%s: tensor %s has %" PRIu32 " dimensions (must be 1 to 4)", g->path,
                        t->name, n_dims);
    t->n_dims = (int)n_dims;
    uint64_t n = 1;
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if ((st = read_u64(p, &t->ne[d]))) return st;
        if (t->ne[d] == 0)
            return kvg_fail(p->err, KVGEN_E_FORMAT, "%s: tensor %s has an empty dimension (ne[%" PRIu32 "] = 0)",
                            g->path, t->name, d);
        if (t->ne[d] > (uint64_t)INT64_MAX / n)
            return kvg_fail(p->err, KVGEN_E_FORMAT, "%s: tensor %s: element count overflows (dimension %" PRIu32
                            " = %" PRIu64 ")", g->path, t->name, d, t->ne[d]);
        n *= t->ne[d];
    }
    t->n_elements = n;
    if ((st = read_u32(p, &type))) return st;
    t->type = type;
    if (!kvg_type_known(type)) {
        const char *tn = kvg_type_name(type);
        if (strncmp(tn, "type ", 5) == 0 || strcmp(tn, "unknown type") == 0)
            return kvg_fail(p->err, KVGEN_E_FORMAT, "%s: tensor %s has unknown type %" PRIu32, g->path, t->name,
                            type);
        return kvg_fail(p->err, KVGEN_E_FORMAT, "%s: tensor %s has type %s (%" PRIu32 "), which ggml no longer defines",
                        g->path, t->name, tn, type);
    }
    uint64_t be = kvg_type_block_elems(type), bb = kvg_type_block_bytes(type);
    if (t->ne[0] % be != 0)
        return kvg_fail(p->err, KVGEN_E_FORMAT,
                        "%s: tensor %s: row length %" PRIu64 " is not a multiple of the %s block size %" PRIu64,
                        g->path, t->name, t->ne[0], kvg_type_name(type), be);
    uint64_t blocks = n / be;
    if (blocks > (uint64_t)INT64_MAX / bb)
        return kvg_fail(p->err, KVGEN_E_FORMAT, "%s: tensor %s: size overflows", g->path, t->name);
    uint64_t nbytes = blocks * bb;
    if (nbytes > g->size)
        return kvg_fail(p->err, KVGEN_E_FORMAT, "%s: tensor %s is larger (%" PRIu64 " bytes) than the file (%zu)",
                        g->path, t->name, nbytes, g->size);
    t->nbytes = (size_t)nbytes;
    return read_u64(p, &t->offset);
}

static kvgen_status parse(kvg_gguf *g, kvgen_error *err) {
    parser p = {.g = g, .pos = 0, .err = err};
    snprintf(p.what, sizeof p.what, "header");
    kvgen_status st = need(&p, 4);
    if (st) return st;
    if (memcmp(g->map, "GGUF", 4) != 0)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: not a GGUF file (bad magic %02x %02x %02x %02x)", g->path,
                        g->map[0], g->map[1], g->map[2], g->map[3]);
    p.pos = 4;
    uint64_t n_tensors, n_kv;
    if ((st = read_u32(&p, &g->version))) return st;
    if (g->version == 1)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: GGUF version 1 is not supported (kvgen reads versions 2 and 3)",
                        g->path);
    if (g->version != 2 && g->version != 3) {
        const char *hint = (g->version & 0xffff) == 0 ? " (a big-endian file?)" : "";
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: unsupported GGUF version %" PRIu32 "%s (kvgen reads 2 and 3)",
                        g->path, g->version, hint);
    }
    if ((st = read_u64(&p, &n_tensors)) || (st = read_u64(&p, &n_kv))) return st;
    /* every key takes at least 13 bytes (length, type, a one-byte value), every tensor info 32 */
    if (n_kv > remaining(&p) / 13)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: metadata count %" PRIu64 " is impossible for a %zu-byte file",
                        g->path, n_kv, g->size);
    if (n_tensors > remaining(&p) / 32)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: tensor count %" PRIu64 " is impossible for a %zu-byte file",
                        g->path, n_tensors, g->size);
    if (n_kv > INT32_MAX / 4 || n_tensors > INT32_MAX / 4)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: too many entries (%" PRIu64 " keys, %" PRIu64 " tensors)", g->path,
                        n_kv, n_tensors);
    g->n_kv = (int)n_kv;
    g->n_tensors = (int)n_tensors;
    g->kv = kvg_calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = kvg_calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors || !index_init(&g->kv_index, g->n_kv) || !index_init(&g->tensor_index, g->n_tensors))
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", g->path);
    if ((st = parse_kvs(&p, g))) return st;
    for (int i = 0; i < g->n_tensors; i++) {
        if ((st = parse_tensor_info(&p, g, i))) return st;
        int dup = index_add(g, &g->tensor_index, tensor_name, i);
        if (dup >= 0)
            return kvg_fail(err, KVGEN_E_FORMAT, "%s: duplicate tensor name %s (tensors %d and %d)", g->path,
                            g->tensors[i].name, dup, i);
    }
    /* the data section starts at the next multiple of the alignment */
    uint64_t pad = (g->alignment - p.pos % g->alignment) % g->alignment;
    g->data_offset = p.pos + pad;
    if (g->n_tensors == 0) return KVGEN_OK;
    if (g->data_offset > g->size)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: truncated file: data section starts at %" PRIu64
                        " past end of file (file %zu)", g->path, g->data_offset, g->size);
    uint64_t data_size = g->size - g->data_offset;
    for (int i = 0; i < g->n_tensors; i++) {
        kvg_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment != 0)
            return kvg_fail(err, KVGEN_E_FORMAT, "%s: tensor %s offset %" PRIu64 " is not a multiple of the alignment %"
                            PRIu64, g->path, t->name, t->offset, g->alignment);
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            return kvg_fail(err, KVGEN_E_FORMAT, "%s: tensor %s extends past end of file (offset %" PRIu64
                            ", size %zu, file %zu)", g->path, t->name, g->data_offset + t->offset, t->nbytes, g->size);
        t->data = g->map + g->data_offset + t->offset;
    }
    size_t n_t = (uint32_t)g->n_tensors; /* 1 .. INT32_MAX/4 here */
    const kvg_tensor **order = kvg_malloc(n_t * sizeof *order);
    if (!order) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", g->path);
    for (size_t i = 0; i < n_t; i++) order[i] = &g->tensors[i];
    qsort(order, n_t, sizeof *order, cmp_tensor_offset);
    for (int i = 1; i < g->n_tensors; i++) {
        const kvg_tensor *a = order[i - 1], *b = order[i];
        if (a->offset + a->nbytes > b->offset) {
            st = kvg_fail(err, KVGEN_E_FORMAT, "%s: tensors %s and %s overlap (offsets %" PRIu64 " and %" PRIu64
                          ", size of the first %zu)", g->path, a->name, b->name, a->offset, b->offset, a->nbytes);
            break;
        }
    }
    kvg_free(order);
    return st;
}

kvgen_status kvg_gguf_open(const char *path, kvg_gguf **out, kvgen_error *err) {
    *out = NULL;
    if (!path) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "no model path given");
    kvg_gguf *g = kvg_calloc(1, sizeof *g);
    if (!g) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", path);
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    g->path = kvg_strdup(path);
    if (!g->path) {
        kvg_free(g);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", path);
    }
    int fd = kvg_open(path, O_RDONLY, 0);
    if (fd < 0) {
        kvgen_status st = kvg_fail(err, KVGEN_E_IO, "%s: cannot open: %s", path, strerror(errno));
        kvg_gguf_close(g);
        return st;
    }
    kvg_stat_t sb;
    kvgen_status st = KVGEN_OK;
    if (kvg_fstat(fd, &sb) != 0) {
        st = kvg_fail(err, KVGEN_E_IO, "%s: cannot stat: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        st = kvg_fail(err, KVGEN_E_IO, "%s: not a regular file", path);
    } else if (sb.st_size == 0) {
        st = kvg_fail(err, KVGEN_E_FORMAT, "%s: file is empty", path);
    } else if ((uint64_t)sb.st_size > SIZE_MAX) {
        st = kvg_fail(err, KVGEN_E_IO, "%s: file too large to map", path);
    } else {
        void *m = kvg_map_file(fd, (size_t)sb.st_size);
        if (!m) {
            st = kvg_fail(err, KVGEN_E_IO, "%s: cannot map: %s", path, strerror(errno));
        } else {
            g->map = m;
            g->size = (size_t)sb.st_size;
        }
    }
    close(fd);
    if (!st) st = parse(g, err);
    if (st) {
        kvg_gguf_close(g);
        return st;
    }
    *out = g;
    return KVGEN_OK;
}

void kvg_gguf_close(kvg_gguf *g) {
    if (!g) return;
    if (g->kv)
        for (int i = 0; i < g->n_kv; i++) {
            kvg_free(g->kv[i].key);
            kvg_free(g->kv[i].items);
        }
    if (g->tensors)
        for (int i = 0; i < g->n_tensors; i++) kvg_free((char *)g->tensors[i].name);
    kvg_free(g->kv);
    kvg_free(g->tensors);
    kvg_free(g->kv_index.slots);
    kvg_free(g->tensor_index.slots);
    if (g->map) kvg_unmap_file(g->map, g->size);
    kvg_free(g->path);
    kvg_free(g);
}

const char *kvg_gguf_path(const kvg_gguf *g) { return g->path; }
uint32_t kvg_gguf_version(const kvg_gguf *g) { return g->version; }
size_t kvg_gguf_file_size(const kvg_gguf *g) { return g->size; }
void kvg_gguf_drop_bytes(const kvg_gguf *g, const void *p, size_t n) {
    const unsigned char *b = p;
    if (g && g->map && b >= g->map && n <= g->size && (size_t)(b - g->map) <= g->size - n) kvg_map_drop(p, n);
}
uint64_t kvg_gguf_alignment(const kvg_gguf *g) { return g->alignment; }
const void *kvg_gguf_data_base(const kvg_gguf *g) {
    return g->data_offset <= g->size ? g->map + g->data_offset : NULL;
}

/* ---- metadata ---- */

int kvg_gguf_n_kv(const kvg_gguf *g) { return g->n_kv; }
int kvg_gguf_find_key(const kvg_gguf *g, const char *key) { return index_find(g, &g->kv_index, kv_name, key); }
const char *kvg_gguf_key(const kvg_gguf *g, int i) { return i >= 0 && i < g->n_kv ? g->kv[i].key : NULL; }
kvg_gguf_vtype kvg_gguf_kv_type(const kvg_gguf *g, int i) {
    return i >= 0 && i < g->n_kv ? g->kv[i].type : KVG_GGUF_VTYPE_COUNT;
}

static const kv_entry *find_kv(const kvg_gguf *g, const char *key) {
    int i = kvg_gguf_find_key(g, key);
    return i >= 0 ? &g->kv[i] : NULL;
}

/* A numeric value as either an integer or a double, whichever represents it exactly. */
typedef struct num {
    bool is_int, is_unsigned;
    int64_t i;
    uint64_t u;
    double f;
} num;

static bool get_num(const kv_entry *e, num *n) {
    const uint8_t *v = e->val;
    memset(n, 0, sizeof *n);
    n->is_int = true;
    switch (e->type) {
    case KVG_GGUF_UINT8: n->i = v[0]; break;
    case KVG_GGUF_INT8: n->i = (int8_t)v[0]; break;
    case KVG_GGUF_UINT16: n->i = rd_u16(v); break;
    case KVG_GGUF_INT16: n->i = (int16_t)rd_u16(v); break;
    case KVG_GGUF_UINT32: n->i = rd_u32(v); break;
    case KVG_GGUF_INT32: n->i = (int32_t)rd_u32(v); break;
    case KVG_GGUF_INT64: n->i = (int64_t)rd_u64(v); break;
    case KVG_GGUF_UINT64:
        n->u = rd_u64(v);
        n->is_unsigned = true;
        if (n->u <= INT64_MAX) {
            n->i = (int64_t)n->u;
            n->is_unsigned = false;
        }
        break;
    case KVG_GGUF_FLOAT32: {
        float f;
        uint32_t b = rd_u32(v);
        memcpy(&f, &b, 4);
        n->is_int = false;
        n->f = f;
        break;
    }
    case KVG_GGUF_FLOAT64: {
        uint64_t b = rd_u64(v);
        memcpy(&n->f, &b, 8);
        n->is_int = false;
        break;
    }
    default: return false;
    }
    if (n->is_int && !n->is_unsigned) n->f = (double)n->i;
    return true;
}

/* a float that is a whole number within range counts as an integer too */
static bool num_as_i64(const num *n, int64_t *out) {
    if (n->is_int) {
        if (n->is_unsigned) return false;
        *out = n->i;
        return true;
    }
    if (!(n->f >= -9.2e18 && n->f <= 9.2e18) || n->f != floor(n->f)) return false;
    *out = (int64_t)n->f;
    return true;
}

bool kvg_gguf_get_i64(const kvg_gguf *g, const char *key, int64_t *out) {
    const kv_entry *e = find_kv(g, key);
    num n;
    return e && get_num(e, &n) && num_as_i64(&n, out);
}

bool kvg_gguf_get_u32(const kvg_gguf *g, const char *key, uint32_t *out) {
    int64_t v;
    if (!kvg_gguf_get_i64(g, key, &v) || v < 0 || v > (int64_t)UINT32_MAX) return false;
    *out = (uint32_t)v;
    return true;
}

bool kvg_gguf_get_f32(const kvg_gguf *g, const char *key, float *out) {
    const kv_entry *e = find_kv(g, key);
    num n;
    if (!e || !get_num(e, &n)) return false;
    *out = n.is_unsigned ? (float)n.u : (float)n.f;
    return true;
}

bool kvg_gguf_get_bool(const kvg_gguf *g, const char *key, bool *out) {
    const kv_entry *e = find_kv(g, key);
    if (!e || e->type != KVG_GGUF_BOOL) return false;
    *out = e->val[0] != 0;
    return true;
}

bool kvg_gguf_get_str(const kvg_gguf *g, const char *key, kvg_str *out) {
    const kv_entry *e = find_kv(g, key);
    if (!e || e->type != KVG_GGUF_STRING) return false;
    out->len = rd_u64(e->val);
    out->ptr = (const char *)e->val + 8;
    return true;
}

bool kvg_gguf_get_arr(const kvg_gguf *g, const char *key, kvg_gguf_vtype *elem_type, uint64_t *count) {
    const kv_entry *e = find_kv(g, key);
    if (!e || e->type != KVG_GGUF_ARRAY) return false;
    if (elem_type) *elem_type = e->elem_type;
    if (count) *count = e->count;
    return true;
}

const void *kvg_gguf_arr_data(const kvg_gguf *g, const char *key) {
    const kv_entry *e = find_kv(g, key);
    if (!e || e->type != KVG_GGUF_ARRAY || !vtype_size(e->elem_type)) return NULL;
    return e->elems;
}

kvg_str kvg_gguf_arr_str(const kvg_gguf *g, const char *key, uint64_t i) {
    kvg_str s = {NULL, 0};
    const kv_entry *e = find_kv(g, key);
    if (!e || e->type != KVG_GGUF_ARRAY || e->elem_type != KVG_GGUF_STRING || i >= e->count) return s;
    s.len = rd_u64(e->items[i]);
    s.ptr = (const char *)e->items[i] + 8;
    return s;
}

bool kvg_gguf_arr_arr(const kvg_gguf *g, const char *key, uint64_t i, kvg_gguf_vtype *elem_type, uint64_t *count,
                      const void **data) {
    const kv_entry *e = find_kv(g, key);
    if (!e || e->type != KVG_GGUF_ARRAY || e->elem_type != KVG_GGUF_ARRAY || i >= e->count) return false;
    const uint8_t *a = e->items[i]; /* validated when the file was opened */
    if (elem_type) *elem_type = (kvg_gguf_vtype)rd_u32(a);
    if (count) *count = rd_u64(a + 4);
    if (data) *data = a + 12;
    return true;
}

/* ---- tensors ---- */

int kvg_gguf_n_tensors(const kvg_gguf *g) { return g->n_tensors; }
const kvg_tensor *kvg_gguf_tensor(const kvg_gguf *g, int i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}
const kvg_tensor *kvg_gguf_find_tensor(const kvg_gguf *g, const char *name) {
    int i = index_find(g, &g->tensor_index, tensor_name, name);
    return i >= 0 ? &g->tensors[i] : NULL;
}

/* ---- writer ----
 * Calls record their first failure (out of memory, a bad argument) and report it at save time,
 * so building a file needs no error checks per call. */

typedef struct buf {
    uint8_t *p;
    size_t len, cap;
    bool failed;
} buf;

static void buf_put(buf *b, const void *data, size_t n) {
    if (b->failed) return;
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n) {
            if (cap > SIZE_MAX / 2) {
                b->failed = true;
                return;
            }
            cap *= 2;
        }
        uint8_t *p = kvg_realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
}
static void buf_u32(buf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    buf_put(b, x, 4);
}
static void buf_u64(buf *b, uint64_t v) {
    buf_u32(b, (uint32_t)v);
    buf_u32(b, (uint32_t)(v >> 32));
}
static void buf_str(buf *b, const char *s, uint64_t n) {
    buf_u64(b, n);
    buf_put(b, s, (size_t)n);
}

typedef struct wkv {
    char *key;
    uint32_t type;
    buf val;
} wkv;

typedef struct wtensor {
    char *name;
    uint32_t type;
    int n_dims;
    uint64_t ne[4];
    uint8_t *data;
    size_t nbytes;
} wtensor;

struct kvg_gguf_writer {
    wkv *kv;
    int n_kv, cap_kv;
    wtensor *t;
    int n_t, cap_t;
    bool failed;
    char problem[200];
};

kvg_gguf_writer *kvg_gguf_writer_new(void) { return kvg_calloc(1, sizeof(kvg_gguf_writer)); }

void kvg_gguf_writer_free(kvg_gguf_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n_kv; i++) {
        kvg_free(w->kv[i].key);
        kvg_free(w->kv[i].val.p);
    }
    for (int i = 0; i < w->n_t; i++) {
        kvg_free(w->t[i].name);
        kvg_free(w->t[i].data);
    }
    kvg_free(w->kv);
    kvg_free(w->t);
    kvg_free(w);
}

static void writer_fail(kvg_gguf_writer *w, const char *what, const char *name) {
    if (w->failed) return;
    w->failed = true;
    snprintf(w->problem, sizeof w->problem, "%s%s%s", what, name ? ": " : "", name ? name : "");
}

/* the entry for key, replacing an earlier value of the same key */
static buf *writer_slot(kvg_gguf_writer *w, const char *key, uint32_t type) {
    if (w->failed) return NULL;
    for (int i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) {
            w->kv[i].type = type;
            w->kv[i].val.len = 0;
            return &w->kv[i].val;
        }
    if (w->n_kv == w->cap_kv) {
        int cap = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv *kv = kvg_realloc(w->kv, (size_t)cap * sizeof *kv);
        if (!kv) {
            writer_fail(w, "out of memory", NULL);
            return NULL;
        }
        w->kv = kv;
        w->cap_kv = cap;
    }
    wkv *e = &w->kv[w->n_kv];
    memset(e, 0, sizeof *e);
    e->key = kvg_strdup(key);
    if (!e->key) {
        writer_fail(w, "out of memory", NULL);
        return NULL;
    }
    e->type = type;
    w->n_kv++;
    return &e->val;
}

static void writer_check(kvg_gguf_writer *w, buf *b) {
    if (b && b->failed) writer_fail(w, "out of memory", NULL);
}

void kvg_gguf_set_u32(kvg_gguf_writer *w, const char *key, uint32_t v) {
    buf *b = writer_slot(w, key, KVG_GGUF_UINT32);
    if (b) buf_u32(b, v);
    writer_check(w, b);
}
void kvg_gguf_set_i32(kvg_gguf_writer *w, const char *key, int32_t v) {
    buf *b = writer_slot(w, key, KVG_GGUF_INT32);
    if (b) buf_u32(b, (uint32_t)v);
    writer_check(w, b);
}
void kvg_gguf_set_f32(kvg_gguf_writer *w, const char *key, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    buf *b = writer_slot(w, key, KVG_GGUF_FLOAT32);
    if (b) buf_u32(b, u);
    writer_check(w, b);
}
void kvg_gguf_set_bool(kvg_gguf_writer *w, const char *key, bool v) {
    uint8_t x = v ? 1 : 0;
    buf *b = writer_slot(w, key, KVG_GGUF_BOOL);
    if (b) buf_put(b, &x, 1);
    writer_check(w, b);
}
void kvg_gguf_set_str(kvg_gguf_writer *w, const char *key, const char *v) {
    buf *b = writer_slot(w, key, KVG_GGUF_STRING);
    if (b) buf_str(b, v, strlen(v));
    writer_check(w, b);
}
void kvg_gguf_set_arr_str(kvg_gguf_writer *w, const char *key, const kvg_str *v, uint64_t n) {
    buf *b = writer_slot(w, key, KVG_GGUF_ARRAY);
    if (!b) return;
    buf_u32(b, KVG_GGUF_STRING);
    buf_u64(b, n);
    for (uint64_t i = 0; i < n; i++) buf_str(b, v[i].ptr, v[i].len);
    writer_check(w, b);
}
void kvg_gguf_set_arr_num(kvg_gguf_writer *w, const char *key, kvg_gguf_vtype elem, const void *data, uint64_t n) {
    uint64_t esz = vtype_size(elem);
    if (!esz) {
        writer_fail(w, "array element type must be numeric or bool", key);
        return;
    }
    buf *b = writer_slot(w, key, KVG_GGUF_ARRAY);
    if (!b) return;
    buf_u32(b, elem);
    buf_u64(b, n);
    /* elements are written little-endian; the host is assumed little-endian like every GGUF */
    if (n > SIZE_MAX / esz) b->failed = true;
    else buf_put(b, data, (size_t)(n * esz));
    writer_check(w, b);
}
void kvg_gguf_set_raw(kvg_gguf_writer *w, const char *key, kvg_gguf_vtype type, const void *value, size_t nbytes) {
    buf *b = writer_slot(w, key, type);
    if (b) buf_put(b, value, nbytes);
    writer_check(w, b);
}

bool kvg_gguf_copy_kv(kvg_gguf_writer *w, const kvg_gguf *src, const char *key) {
    const kv_entry *e = find_kv(src, key);
    if (!e) return false;
    buf *b = writer_slot(w, key, e->type);
    if (!b) return false;
    buf_put(b, e->val, (size_t)e->val_size);
    writer_check(w, b);
    return !w->failed;
}

void kvg_gguf_add_tensor(kvg_gguf_writer *w, const char *name, uint32_t type, int n_dims, const uint64_t *ne,
                         const void *data, size_t nbytes) {
    if (w->failed) return;
    if (n_dims < 1 || n_dims > 4) {
        writer_fail(w, "tensor must have 1 to 4 dimensions", name);
        return;
    }
    uint64_t n = 1;
    for (int d = 0; d < n_dims; d++) n *= ne[d];
    uint32_t be = kvg_type_block_elems(type);
    if (!be || ne[0] % be != 0 || kvg_row_bytes(type, n) != nbytes) {
        writer_fail(w, "tensor data size does not match its type and shape", name);
        return;
    }
    if (w->n_t == w->cap_t) {
        int cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *t = kvg_realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) {
            writer_fail(w, "out of memory", NULL);
            return;
        }
        w->t = t;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = kvg_strdup(name);
    t->data = kvg_malloc(nbytes ? nbytes : 1);
    if (!t->name || !t->data) {
        kvg_free(t->name);
        kvg_free(t->data);
        writer_fail(w, "out of memory", NULL);
        return;
    }
    memcpy(t->data, data, nbytes);
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->nbytes = nbytes;
    w->n_t++;
}

#define WRITER_ALIGNMENT 32

static uint64_t align_up(uint64_t x) { return (x + WRITER_ALIGNMENT - 1) & ~(uint64_t)(WRITER_ALIGNMENT - 1); }

unsigned char *kvg_gguf_writer_bytes(kvg_gguf_writer *w, size_t *size) {
    if (w->failed) return NULL;
    buf b = {0};
    buf_put(&b, "GGUF", 4);
    buf_u32(&b, 3);
    buf_u64(&b, (uint64_t)w->n_t);
    buf_u64(&b, (uint64_t)w->n_kv);
    for (int i = 0; i < w->n_kv; i++) {
        buf_str(&b, w->kv[i].key, strlen(w->kv[i].key));
        buf_u32(&b, w->kv[i].type);
        buf_put(&b, w->kv[i].val.p, w->kv[i].val.len);
    }
    uint64_t off = 0;
    for (int i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        buf_str(&b, t->name, strlen(t->name));
        buf_u32(&b, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) buf_u64(&b, t->ne[d]);
        buf_u32(&b, t->type);
        buf_u64(&b, off);
        off = align_up(off + t->nbytes);
    }
    static const uint8_t zeros[WRITER_ALIGNMENT] = {0};
    buf_put(&b, zeros, (size_t)(align_up(b.len) - b.len));
    size_t base = b.len;
    for (int i = 0; i < w->n_t; i++) {
        buf_put(&b, w->t[i].data, w->t[i].nbytes);
        if (i + 1 < w->n_t) buf_put(&b, zeros, (size_t)(align_up(b.len - base) - (b.len - base)));
    }
    if (b.failed) {
        kvg_free(b.p);
        writer_fail(w, "out of memory", NULL);
        return NULL;
    }
    *size = b.len;
    return b.p;
}

kvgen_status kvg_gguf_writer_save(kvg_gguf_writer *w, const char *path, kvgen_error *err) {
    size_t n = 0;
    unsigned char *bytes = kvg_gguf_writer_bytes(w, &n);
    if (!bytes) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: cannot build GGUF: %s", path, w->problem);
    FILE *f = kvg_fopen(path, "wb");
    if (!f) {
        kvg_free(bytes);
        return kvg_fail(err, KVGEN_E_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    size_t wrote = fwrite(bytes, 1, n, f);
    int close_rc = fclose(f);
    kvg_free(bytes);
    if (wrote != n || close_rc != 0) return kvg_fail(err, KVGEN_E_IO, "%s: short write: %s", path, strerror(errno));
    return KVGEN_OK;
}
