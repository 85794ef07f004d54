/* kvg_json.h: kvgen's JSON codec (private): a reader into a tree of values, builders, and a
 * compact writer into a kvg_buf. Every layer reads and writes JSON through it: schemas, remote
 * servers' requests and replies, session files of remote sessions, the Lua module, the bench's
 * reports and the chat templates' tojson.
 *
 * The reader takes RFC 8259 JSON: any value at the top, strings of UTF-8 (checked; \u escapes
 * with surrogate pairs, \u0000 too: strings and keys carry their length), objects in their
 * order with duplicate keys kept (kvg_json_get finds the first). Numbers read as doubles
 * (locale-independent). Memory comes from the host's allocator (kvg_host.h). */
#ifndef KVG_JSON_H
#define KVG_JSON_H
#include <stdbool.h>
#include <stddef.h>
#include "kvg_buf.h"

typedef enum {
    KVG_JSON_NULL,
    KVG_JSON_FALSE,
    KVG_JSON_TRUE,
    KVG_JSON_NUMBER,
    KVG_JSON_STRING,
    KVG_JSON_ARRAY,
    KVG_JSON_OBJECT
} kvg_json_type;

typedef struct kvg_json kvg_json;
struct kvg_json {
    kvg_json_type type;
    size_t offset;             /* byte offset of the value in the parsed text (0 for built values) */
    double number;             /* NUMBER */
    char *str;                 /* STRING: bytes, NUL-terminated, len without the NUL (may contain NUL bytes);
                                  NUMBER: its text as read under KVG_JSON_NUMBER_TEXT, or one a builder set
                                  (kvg_malloc'd), written as it is; else NULL */
    size_t len;
    char *key;                 /* set when this value is an object member (NUL-terminated, key_len bytes) */
    size_t key_len;
    kvg_json *child;           /* ARRAY/OBJECT: first element/member, in order */
    kvg_json *next;            /* next sibling */
    size_t n;                  /* ARRAY/OBJECT: number of children */
    kvg_json *last;            /* ARRAY/OBJECT: the last child as kvg_json_add left it (a hint for appending) */
};

/* err_offset after a parse that ran out of memory (err then says "out of memory") */
#define KVG_JSON_NO_MEMORY ((size_t)-1)

/* Parses len bytes (UTF-8 checked, depth at most max_depth: the top value is at depth 0, a
 * container's children one deeper). On error returns NULL and writes a message naming the byte
 * offset to err ("not valid JSON at byte 12: expected ',' or '}'"; err_size bytes at most, err
 * may be NULL) and the offset to *err_offset (KVG_JSON_NO_MEMORY when memory ran out). */
kvg_json *kvg_json_parse(const char *text, size_t len, int max_depth, size_t *err_offset, char *err, size_t err_size);

/* kvg_json_parse's flags */
enum {
    KVG_JSON_ANY_BYTES = 1,  /* strings may hold bytes that are not UTF-8 (the caller checks them) */
    KVG_JSON_NUMBER_TEXT = 2 /* numbers keep their text (str, len), which the writer writes back */
};
/* kvg_json_parse with flags; with end non-NULL, whatever follows the value (spaces included) is
 * left to the caller and *end gets the offset just after the value. */
kvg_json *kvg_json_parse_ex(const char *text, size_t len, int max_depth, unsigned flags, size_t *end,
                            size_t *err_offset, char *err, size_t err_size);

/* Frees v and its children (not v->next: a value still in a container stays linked there).
 * NULL is fine. */
void kvg_json_free(kvg_json *v);

/* reading */
kvg_json *kvg_json_get(const kvg_json *object, const char *key); /* first member named key, or NULL (also when object is NULL or no object) */
kvg_json *kvg_json_item(const kvg_json *array, size_t i);         /* child i of an array or object, or NULL */
/* the member's string (NUL-terminated; *len its length when len is non-NULL), or NULL when it is
 * absent or not a string */
const char *kvg_json_get_string(const kvg_json *object, const char *key, size_t *len);

/* building */
kvg_json *kvg_json_new(kvg_json_type type);
kvg_json *kvg_json_new_number(double v);
kvg_json *kvg_json_new_string(const char *s, size_t len);
kvg_json *kvg_json_new_bool(bool v);
/* Appends v to container (key NULL for arrays, copied for objects); returns v, NULL on OOM (v
 * freed) or when v is NULL (so a builder's NULL passes straight through). */
kvg_json *kvg_json_add(kvg_json *container, const char *key, kvg_json *v);
/* Takes every member named key out of object and frees it; returns how many (0 for NULL or
 * for a value that is not an object). */
size_t kvg_json_remove(kvg_json *object, const char *key);

/* writing into a kvg_buf (base/kvg_buf.h) */
int kvg_json_write(kvg_buf *b, const kvg_json *v);                /* compact; 0 ok, -1 out of memory */
int kvg_json_write_string(kvg_buf *b, const char *s, size_t len); /* a quoted, escaped JSON string */
/* integers (below 1e15 in magnitude) exactly as integers, else %.17g trimmed to the shortest
 * text that reads back the same; not finite: null */
int kvg_json_write_number(kvg_buf *b, double v);
/* v as compact JSON text in a new NUL-terminated string (kvg_free it; *len its length when len
 * is non-NULL), NULL on OOM */
char *kvg_json_print(const kvg_json *v, size_t *len);

#endif
