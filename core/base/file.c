/* file.c: kvgen's own files written atomically and read back checked (kvg_file.h): what session
 * files and memory stores share. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_file.h"
#include "kvg_host.h"
#include "kvg_str.h"

void kvg_le32_array(void *data, size_t n) {
    unsigned char *p = data;
    for (size_t i = 0; i < n; i++, p += 4) {
        uint32_t v;
        memcpy(&v, p, 4);
        kvg_put_u32(p, v);
    }
}

void kvg_from_le32_array(void *data, size_t n) {
    unsigned char *p = data;
    for (size_t i = 0; i < n; i++, p += 4) {
        uint32_t v = kvg_get_u32(p);
        memcpy(p, &v, 4);
    }
}

const char *kvg_file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    return "an unknown kind of file";
}

size_t kvg_dir_len(const char *path) {
    const char *slash = kvg_path_last_sep(path);
    return slash ? (size_t)(slash - path) + 1 : 0;
}

/* the target of a symbolic link, malloc'd; NULL with errno set */
static char *read_link(const char *path) {
    for (size_t cap = 256; cap <= ((size_t)1 << 20); cap *= 2) {
        char *buf = kvg_malloc(cap);
        if (!buf) {
            errno = ENOMEM;
            return NULL;
        }
        long long n = kvg_readlink(path, buf, cap);
        if (n < 0) {
            int e = errno;
            kvg_free(buf);
            errno = e;
            return NULL;
        }
        if ((size_t)n < cap) {
            buf[n] = 0;
            return buf;
        }
        kvg_free(buf);
    }
    errno = ENAMETOOLONG;
    return NULL;
}

size_t kvg_read_at(int fd, uint64_t off, void *buf, size_t n, int *error) {
    unsigned char *p = buf;
    size_t got = 0;
    while (got < n) {
        size_t want = n - got < ((size_t)1 << 30) ? n - got : ((size_t)1 << 30);
        long long k = kvg_pread(fd, p + got, want, off + got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            *error = errno;
            break;
        }
        if (k == 0) break;
        got += (size_t)k;
    }
    return got;
}

/* ---- reading -------------------------------------------------------------------------------- */

kvgen_status kvg_file_open_regular(const char *who, const char *path, int *fd_out, uint64_t *size, kvgen_error *err) {
    *fd_out = -1;
    kvg_stat_t sb;
    if (kvg_stat(path, &sb) != 0) return kvg_fail(err, KVGEN_E_IO, "%s: %s: cannot open: %s", who, path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return kvg_fail(err, KVGEN_E_IO, "%s: %s is not a regular file (%s)", who, path, kvg_file_kind(sb.st_mode));
    /* O_NONBLOCK: should the path have become a FIFO since, the open does not wait for a writer */
    int fd = kvg_open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0);
    if (fd < 0) return kvg_fail(err, KVGEN_E_IO, "%s: %s: cannot open: %s", who, path, strerror(errno));
    if (kvg_fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        kvgen_status st = S_ISREG(sb.st_mode)
                              ? kvg_fail(err, KVGEN_E_IO, "%s: %s: cannot stat: %s", who, path, strerror(errno))
                              : kvg_fail(err, KVGEN_E_IO, "%s: %s is not a regular file (%s)", who, path,
                                         kvg_file_kind(sb.st_mode));
        close(fd);
        return st;
    }
    *fd_out = fd;
    *size = (uint64_t)sb.st_size;
    return KVGEN_OK;
}

void kvg_fr_read(kvg_file_reader *r, void *buf, size_t n) {
    if (r->error || r->short_read || n == 0) return;
    size_t got = kvg_read_at(r->fd, r->off, buf, n, &r->error);
    if (!r->error && got < n) r->short_read = true;
    kvg_hash64_add(&r->sum, buf, got);
    r->off += got;
}

bool kvg_fr_hash_to(kvg_file_reader *r, uint64_t n) {
    size_t cap = 1 << 16;
    unsigned char *buf = kvg_malloc(cap);
    if (!buf) {
        r->error = ENOMEM;
        return false;
    }
    while (r->off < n && !r->error && !r->short_read) kvg_fr_read(r, buf, n - r->off < cap ? (size_t)(n - r->off) : cap);
    kvg_free(buf);
    return !r->error && !r->short_read;
}

/* ---- saving ------------------------------------------------------------------------------------- */

void kvg_fw_write(kvg_file_writer *w, const void *data, size_t n) {
    if (w->error || n == 0) return;
    kvg_hash64_add(&w->sum, data, n);
    const unsigned char *p = data;
    while (n > 0) {
        ssize_t k = write(w->fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            w->error = k < 0 ? errno : EIO;
            return;
        }
        p += k;
        n -= (size_t)k;
    }
}

/* The file a save to `path` replaces: `path` with its symbolic links followed, so that a save
 * through a link updates the file the link points to and the link stays (a dangling link gets
 * its file created). *sb is that file's lstat, all zero when it does not exist yet. */
static kvgen_status resolve_target(const char *who, const char *path, char **out, kvg_stat_t *sb, kvgen_error *err) {
    *out = NULL;
    char *cur = kvg_strdup(path);
    for (int hops = 0; cur; hops++) {
        if (kvg_lstat(cur, sb) != 0) {
            int e = errno;
            if (e == ENOENT) {
                memset(sb, 0, sizeof *sb);
                *out = cur;
                return KVGEN_OK;
            }
            kvgen_status st = kvg_fail(err, KVGEN_E_IO, "%s: %s: cannot look up %s: %s", who, path, cur, strerror(e));
            kvg_free(cur);
            return st;
        }
        if (!S_ISLNK(sb->st_mode)) {
            *out = cur;
            return KVGEN_OK;
        }
        char *link = hops < 40 ? read_link(cur) : NULL;
        if (!link) {
            int e = hops < 40 ? errno : ELOOP;
            kvgen_status st =
                kvg_fail(err, KVGEN_E_IO, "%s: %s: cannot follow the link %s: %s", who, path, cur, strerror(e));
            kvg_free(cur);
            return st;
        }
        char *next = link;
        size_t dl = kvg_dir_len(cur);
        if (link[0] != '/' && dl > 0) { /* relative to the folder holding the link */
            next = kvg_malloc(dl + strlen(link) + 1);
            if (next) {
                memcpy(next, cur, dl);
                strcpy(next + dl, link);
            }
            kvg_free(link);
        }
        kvg_free(cur);
        cur = next;
    }
    return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: %s: out of memory", who, path);
}

/* Creates an empty file in the folder of `target` under a hidden name, for the save to be
 * renamed over `target`. Returns its descriptor and its malloc'd name, or -1 with errno set. */
static int create_temp(const char *target, char **name_out) {
    static atomic_uint counter;
    size_t dl = kvg_dir_len(target);
    const char *base = target + dl;
    int base_len = strlen(base) > 200 ? 200 : (int)strlen(base); /* room for the suffix in NAME_MAX */
    size_t cap = dl + (size_t)base_len + 64;
    char *name = kvg_malloc(cap);
    if (!name) {
        errno = ENOMEM;
        return -1;
    }
    for (int attempt = 0; attempt < 100; attempt++) {
        snprintf(name, cap, "%.*s.%.*s.%ld-%u-%lx.tmp", (int)dl, target, base_len, base, kvg_process_id(),
                 atomic_fetch_add(&counter, 1u), (unsigned long)(kvg_wall_time_ns() % 1000000000u));
        int fd = kvg_open(name, O_WRONLY | O_CREAT | O_EXCL, 0666);
        if (fd >= 0) {
            *name_out = name;
            return fd;
        }
        if (errno != EEXIST) break;
    }
    int e = errno;
    kvg_free(name);
    errno = e;
    return -1;
}

/* fsync of the folder holding `target`, so that the rename into it is durable; 0 or the errno
 * (file systems that cannot sync a folder say EINVAL: nothing to do there) */
static int sync_folder(const char *target) {
    size_t dl = kvg_dir_len(target);
    char *dir = dl ? kvg_strndup(target, dl) : kvg_strdup(".");
    if (!dir) return ENOMEM;
    int e = kvg_sync_folder(dir);
    kvg_free(dir);
    return e;
}

kvgen_status kvg_save_prepare(kvg_save *s, const char *who, const char *path, kvgen_error *err) {
    memset(s, 0, sizeof *s);
    s->who = who;
    s->path = path;
    s->w.fd = -1;
    s->arrow = s->shown = "";
    kvgen_status st = resolve_target(who, path, &s->target, &s->sb, err);
    if (st != KVGEN_OK) return st;
    if (strcmp(s->target, path) != 0) {
        s->arrow = " -> ";
        s->shown = s->target;
    }
    if (s->sb.st_mode != 0 && !S_ISREG(s->sb.st_mode))
        st = kvg_fail(err, KVGEN_E_IO, "%s: %s%s%s is not a regular file (%s); left as it is", who, path, s->arrow,
                      s->shown, kvg_file_kind(s->sb.st_mode));
    else if (s->sb.st_mode != 0 && kvg_access_write(s->target) != 0)
        st = kvg_fail(err, KVGEN_E_IO, "%s: %s%s%s: cannot write: %s", who, path, s->arrow, s->shown, strerror(errno));
    if (st != KVGEN_OK) kvg_save_done(s);
    return st;
}

kvgen_status kvg_save_open(kvg_save *s, kvgen_error *err) {
    int fd = create_temp(s->target, &s->tmp);
    if (fd < 0)
        return kvg_fail(err, KVGEN_E_IO, "%s: %s%s%s: cannot create a temporary file next to it: %s", s->who, s->path,
                        s->arrow, s->shown, strerror(errno));
    if (s->sb.st_mode != 0) kvg_keep_mode(fd, &s->sb); /* replacing a file: keep its permissions and owner */
    s->w = (kvg_file_writer){fd, KVG_HASH64_INIT, 0};
    return KVGEN_OK;
}

kvgen_status kvg_save_commit(kvg_save *s, kvgen_status st, kvgen_error *err) {
    kvg_file_writer *w = &s->w;
    unsigned char sum[8];
    kvg_put_u64(sum, kvg_hash64_final(&w->sum));
    kvg_fw_write(w, sum, 8);
    if (!w->error && kvg_fsync(w->fd) != 0) w->error = errno;
    if (close(w->fd) != 0 && !w->error) w->error = errno;
    w->fd = -1;
    if (st == KVGEN_OK && w->error)
        st = kvg_fail(err, KVGEN_E_IO, "%s: %s%s%s: write failed: %s", s->who, s->path, s->arrow, s->shown,
                      strerror(w->error));
    if (st == KVGEN_OK && kvg_rename_replace(s->tmp, s->target) != 0)
        st = kvg_fail(err, KVGEN_E_IO, "%s: %s%s%s: cannot replace it: %s", s->who, s->path, s->arrow, s->shown,
                      strerror(errno));
    if (st != KVGEN_OK) {
        kvg_remove(s->tmp); /* the target is as it was */
    } else {
        int e = sync_folder(s->target);
        if (e)
            st = kvg_fail(err, KVGEN_E_IO, "%s: %s%s%s: written, but syncing its folder failed: %s", s->who, s->path,
                          s->arrow, s->shown, strerror(e));
    }
    kvg_save_done(s);
    return st;
}

void kvg_save_done(kvg_save *s) {
    kvg_free(s->tmp);
    kvg_free(s->target);
    s->tmp = s->target = NULL;
    s->arrow = s->shown = "";
}
