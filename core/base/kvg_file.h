/* kvg_file.h: kvgen's own files (session files, memory stores), written atomically and read
 * back with every size checked (private; file.c).
 *
 *   bytes     kvg_put_u32/_u64, kvg_get_u32/_u64: little-endian integers at p;
 *             kvg_le32_array / kvg_from_le32_array: n 32-bit values (ids, float bits) in place to
 *             little-endian and back (no-ops on little-endian hosts)
 *   reading   kvg_file_open_regular: a regular file opened for reading and measured (a device,
 *             FIFO or folder is refused before it is opened: /dev/zero never ends, a FIFO would
 *             block); kvg_file_reader / kvg_fr_read: sequential reads that hash what they read
 *             and note an early end; kvg_fr_hash_to: the checksum streamed through a small
 *             buffer
 *   saving    kvg_save_prepare resolves the target (symbolic links followed: the file a link
 *             points to is replaced and the link stays; a dangling link gets its file created)
 *             and refuses a target that is not a regular file or that the caller may not
 *             write; kvg_save_open creates the temporary file (hidden, in the target's folder,
 *             with the permissions of a file it replaces); kvg_fw_write writes and hashes;
 *             kvg_save_commit appends the checksum of everything written (u64, little-endian),
 *             syncs, closes and renames over the target, then syncs the folder, or, on any
 *             failure (the caller's status included), removes the temporary file: the target is
 *             always either the previous file or the whole new one. kvg_save_done frees what
 *             prepare made when the save ends before it was opened.
 *
 * Every message starts with the caller's `who` ("kvgen_session_save") and the path. */
#ifndef KVG_FILE_H
#define KVG_FILE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvg_error.h"
#include "kvg_hash.h"
#include "kvg_platform.h"

static inline void kvg_put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void kvg_put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t kvg_get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline uint64_t kvg_get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
void kvg_le32_array(void *data, size_t n);
void kvg_from_le32_array(void *data, size_t n);

/* what a path that is not a regular file is, for messages ("a directory", "a FIFO", ...) */
const char *kvg_file_kind(mode_t mode);
/* the length of the folder part of `path`, its last separator included; 0 when it has none */
size_t kvg_dir_len(const char *path);
/* pread of n bytes at off, retried until all came; returns the bytes read (fewer at the end of
 * the file) and sets *error to the errno of a failure */
size_t kvg_read_at(int fd, uint64_t off, void *buf, size_t n, int *error);

/* ---- reading ------------------------------------------------------------------------------ */

kvgen_status kvg_file_open_regular(const char *who, const char *path, int *fd_out, uint64_t *size, kvgen_error *err);

typedef struct kvg_file_reader {
    int fd;
    uint64_t off;
    kvg_hash64 sum;
    int error;       /* errno of a failed read */
    bool short_read; /* the file ended early: it changed since it was measured */
} kvg_file_reader;

void kvg_fr_read(kvg_file_reader *r, void *buf, size_t n);
/* reads (and hashes) up to offset n through a small buffer; false on a read failure */
bool kvg_fr_hash_to(kvg_file_reader *r, uint64_t n);

/* ---- saving -------------------------------------------------------------------------------- */

typedef struct kvg_file_writer {
    int fd;
    kvg_hash64 sum;
    int error; /* errno of the first failed write, 0 while none failed */
} kvg_file_writer;

void kvg_fw_write(kvg_file_writer *w, const void *data, size_t n);

typedef struct kvg_save {
    const char *who, *path;
    char *target;              /* path with its links followed */
    kvg_stat_t sb;             /* the target's lstat; st_mode 0 when it does not exist yet */
    const char *arrow, *shown; /* " -> " and target in messages when a link was followed */
    char *tmp;                 /* the temporary file, once open */
    kvg_file_writer w;
} kvg_save;

kvgen_status kvg_save_prepare(kvg_save *s, const char *who, const char *path, kvgen_error *err);
kvgen_status kvg_save_open(kvg_save *s, kvgen_error *err);
kvgen_status kvg_save_commit(kvg_save *s, kvgen_status st, kvgen_error *err);
void kvg_save_done(kvg_save *s);

#endif
