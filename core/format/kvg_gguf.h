/* kvg_gguf.h: GGUF v2/v3 reader (mmap, every size checked) and writer (private).
 *
 * Folder core/format/ owns the bytes of model files and of text: the GGUF reader and writer
 * (gguf.c), the tokenizer (tokenizer.c, kvg_tokenizer.h) and detokenization (detok.c). It knows
 * nothing of models, backends or sessions. */
#ifndef KVG_GGUF_H
#define KVG_GGUF_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvgen.h"

/* Metadata value types, as numbered in the GGUF spec. */
typedef enum kvg_gguf_vtype {
    KVG_GGUF_UINT8 = 0, KVG_GGUF_INT8 = 1, KVG_GGUF_UINT16 = 2, KVG_GGUF_INT16 = 3,
    KVG_GGUF_UINT32 = 4, KVG_GGUF_INT32 = 5, KVG_GGUF_FLOAT32 = 6, KVG_GGUF_BOOL = 7,
    KVG_GGUF_STRING = 8, KVG_GGUF_ARRAY = 9, KVG_GGUF_UINT64 = 10, KVG_GGUF_INT64 = 11,
    KVG_GGUF_FLOAT64 = 12, KVG_GGUF_VTYPE_COUNT
} kvg_gguf_vtype;

typedef struct kvg_str { const char *ptr; uint64_t len; } kvg_str; /* points into the mapping, not NUL-terminated */

typedef struct kvg_tensor {
    const char *name;     /* NUL-terminated copy */
    uint32_t type;        /* kvg_type (ggml numbering) */
    int n_dims;
    uint64_t ne[4];       /* ne[0] is the row length (contiguous dimension) */
    uint64_t n_elements;
    uint64_t offset;      /* from the start of the data section */
    size_t nbytes;
    const void *data;     /* inside the mapping */
} kvg_tensor;

typedef struct kvg_gguf kvg_gguf;

kvgen_status kvg_gguf_open(const char *path, kvg_gguf **out, kvgen_error *err);
void kvg_gguf_close(kvg_gguf *g);
const char *kvg_gguf_path(const kvg_gguf *g);
uint32_t kvg_gguf_version(const kvg_gguf *g);
size_t kvg_gguf_file_size(const kvg_gguf *g);
/* The caller keeps its own copy of the n bytes at p (tensor data): where they lie in the file's
 * mapping, its whole pages there leave resident memory (read again from the file if touched). */
void kvg_gguf_drop_bytes(const kvg_gguf *g, const void *p, size_t n);

/* metadata */
int kvg_gguf_n_kv(const kvg_gguf *g);
int kvg_gguf_find_key(const kvg_gguf *g, const char *key); /* -1 when absent */
const char *kvg_gguf_key(const kvg_gguf *g, int i);
kvg_gguf_vtype kvg_gguf_kv_type(const kvg_gguf *g, int i);
/* Scalar getters accept any numeric type that converts without loss of meaning; false when
 * the key is absent or of an incompatible type. */
bool kvg_gguf_get_u32(const kvg_gguf *g, const char *key, uint32_t *out);
bool kvg_gguf_get_i64(const kvg_gguf *g, const char *key, int64_t *out);
bool kvg_gguf_get_f32(const kvg_gguf *g, const char *key, float *out);
bool kvg_gguf_get_bool(const kvg_gguf *g, const char *key, bool *out);
bool kvg_gguf_get_str(const kvg_gguf *g, const char *key, kvg_str *out);
/* Arrays: element type and count; numeric arrays give a pointer to their (little-endian, possibly
 * unaligned) data; string arrays are read element by element; nested arrays are walked with kvg_gguf_arr_arr. */
bool kvg_gguf_get_arr(const kvg_gguf *g, const char *key, kvg_gguf_vtype *elem_type, uint64_t *count);
const void *kvg_gguf_arr_data(const kvg_gguf *g, const char *key);
kvg_str kvg_gguf_arr_str(const kvg_gguf *g, const char *key, uint64_t i);
/* element i of an array of arrays: its element type, count and encoded elements (numeric: the data) */
bool kvg_gguf_arr_arr(const kvg_gguf *g, const char *key, uint64_t i, kvg_gguf_vtype *elem_type, uint64_t *count,
                      const void **data);

/* tensors */
int kvg_gguf_n_tensors(const kvg_gguf *g);
const kvg_tensor *kvg_gguf_tensor(const kvg_gguf *g, int i);
const kvg_tensor *kvg_gguf_find_tensor(const kvg_gguf *g, const char *name);
uint64_t kvg_gguf_alignment(const kvg_gguf *g);
const void *kvg_gguf_data_base(const kvg_gguf *g);

/* writer: builds a GGUF v3 in memory, then writes it. Used by the model generator and by
 * the tests that make malformed files. */
typedef struct kvg_gguf_writer kvg_gguf_writer;
kvg_gguf_writer *kvg_gguf_writer_new(void);
void kvg_gguf_writer_free(kvg_gguf_writer *w);
void kvg_gguf_set_u32(kvg_gguf_writer *w, const char *key, uint32_t v);
void kvg_gguf_set_i32(kvg_gguf_writer *w, const char *key, int32_t v);
void kvg_gguf_set_f32(kvg_gguf_writer *w, const char *key, float v);
void kvg_gguf_set_bool(kvg_gguf_writer *w, const char *key, bool v);
void kvg_gguf_set_str(kvg_gguf_writer *w, const char *key, const char *v);
void kvg_gguf_set_arr_str(kvg_gguf_writer *w, const char *key, const kvg_str *v, uint64_t n);
void kvg_gguf_set_arr_num(kvg_gguf_writer *w, const char *key, kvg_gguf_vtype elem, const void *data, uint64_t n);
/* a value of any type given as its encoded bytes (everything after the type field): for the types
 * without a setter, nested arrays, and tests that write malformed values */
void kvg_gguf_set_raw(kvg_gguf_writer *w, const char *key, kvg_gguf_vtype type, const void *value, size_t nbytes);
/* copies one key (any type, arrays included) from a reader */
bool kvg_gguf_copy_kv(kvg_gguf_writer *w, const kvg_gguf *src, const char *key);
/* adds a tensor; data (nbytes, must equal the size its type and shape give) is copied */
void kvg_gguf_add_tensor(kvg_gguf_writer *w, const char *name, uint32_t type, int n_dims, const uint64_t *ne,
                         const void *data, size_t nbytes);
kvgen_status kvg_gguf_writer_save(kvg_gguf_writer *w, const char *path, kvgen_error *err);
/* the bytes as they would be written (for tests that corrupt them); caller frees */
unsigned char *kvg_gguf_writer_bytes(kvg_gguf_writer *w, size_t *size);

#endif
