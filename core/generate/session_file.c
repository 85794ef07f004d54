/* session_file.c: kvgen_session_save / kvgen_session_restore.
 *
 * File layout, version 1, every integer little-endian, floats as their IEEE-754 bits:
 *
 *   header (HEADER_BYTES)
 *     magic "KVGSESS\0"        8
 *     version u32, flags u32   8   flags: 1 has logits, 2 no_cache, 4 prefix reuse
 *     model identity u64       8   kvg_model_identity
 *     n_layer n_head_kv head_dim n_vocab            u32 x 4
 *     n_ctx on_full keep reserved                   u32 x 4
 *     n_tokens clean_len shifts tokens_reused       u64 x 4   (clean_len: UINT64_MAX = all)
 *     sampler_bytes file_bytes                      u64 x 2
 *   sampler state (sampler_bytes in all: kvg_sampler_state_save, then u32 n and n bytes of
 *     the conversation: kvg_chat_save; n is 0 without one)
 *   token ids                      n_tokens x i32
 *   logits (when flags & 1)        n_vocab x f32
 *   K/V, for each layer: K then V, (n_head_kv, n_tokens, head_dim) f32: the used positions only
 *   checksum u64 over every byte before it
 *
 * Save writes a temporary file in the folder of the target (a symbolic link is followed: the
 * file it points to is replaced, the link stays), syncs it and renames it over the target, then
 * syncs the folder: the target is always either the previous file or the whole new one, and a
 * failed save removes only its temporary file. A target that exists and is not a regular file
 * (device, FIFO, folder) is refused and left alone.
 *
 * Restore opens regular files only (a device or FIFO would never end or block), reads the
 * fixed-size header and checks, in this order, so each refusal names its real cause: magic,
 * version (newer files are refused, not misread), the file's real size against file_bytes
 * (truncation), checksum (corruption), model identity, shapes. Nothing is read past the header
 * before its size matches the file's, and nothing sized by the header is allocated before its
 * shapes match the model; a header that does not is told apart from corruption by streaming
 * the checksum through a small buffer. The whole file is read and checked before a session
 * exists. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_generate.h"
#include "kvg_hash.h"
#include "kvg_platform.h"
#include "kvg_session.h"
#include "kvg_str.h"

#define FILE_MAGIC "KVGSESS"
/* a session of a kind that saves itself (kvg_session_kind.save; the remote kind's: JSON of the
 * history and sampler settings): "KVGREMOT", u32 version, u32 0, u64 n, n bytes of the kind's,
 * u64 checksum of everything before it */
#define REMOTE_MAGIC "KVGREMOT"
#define REMOTE_HEADER 24
#define FILE_VERSION 1u
#define HEADER_BYTES 112
enum { FLAG_LOGITS = 1, FLAG_NO_CACHE = 2, FLAG_PREFIX_REUSE = 4 };

/* ---- hashing: kvg_hash.h ---------------------------------------------------------------- */

/* Identifies a model's weights without reading all of them: the hyperparameters, every
 * tensor's name, type and shape, and 64 bytes from the start, middle and end of its data.
 * Two random-weight models of one shape differ in those samples. */
uint64_t kvg_model_identity(const kvgen_model *m) {
    kvg_hash64 st = KVG_HASH64_INIT;
    const kvg_hparams *hp = &m->w.hp;
    int ints[] = {hp->n_layer, hp->n_embd, hp->n_ff, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_rot, hp->n_vocab};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) kvg_hash64_add_u64(&st, (uint64_t)(uint32_t)ints[i]);
    uint32_t fb, fe;
    memcpy(&fb, &hp->rope_freq_base, 4);
    memcpy(&fe, &hp->rms_norm_eps, 4);
    kvg_hash64_add_u64(&st, fb);
    kvg_hash64_add_u64(&st, fe);
    int n = kvg_gguf_n_tensors(m->gguf);
    for (int i = 0; i < n; i++) {
        const kvg_tensor *t = kvg_gguf_tensor(m->gguf, i);
        kvg_hash64_add(&st, t->name, strlen(t->name) + 1);
        kvg_hash64_add_u64(&st, t->type);
        for (int d = 0; d < 4; d++) kvg_hash64_add_u64(&st, t->ne[d]);
        size_t sample = t->nbytes < 64 ? t->nbytes : 64;
        const unsigned char *data = t->data;
        if (!data || sample == 0) continue;
        kvg_hash64_add(&st, data, sample);
        kvg_hash64_add(&st, data + (t->nbytes - sample) / 2, sample);
        kvg_hash64_add(&st, data + t->nbytes - sample, sample);
    }
    return kvg_hash64_final(&st);
}

/* ---- little-endian helpers ------------------------------------------------------------------- */

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* 32-bit values (ids, float bits) in place to little-endian and back; a no-op on LE hosts */
static void le32_array(void *data, size_t n) {
    unsigned char *p = data;
    for (size_t i = 0; i < n; i++, p += 4) {
        uint32_t v;
        memcpy(&v, p, 4);
        put_u32(p, v);
    }
}
static void from_le32_array(void *data, size_t n) {
    unsigned char *p = data;
    for (size_t i = 0; i < n; i++, p += 4) {
        uint32_t v = get_u32(p);
        memcpy(p, &v, 4);
    }
}

/* ---- files ------------------------------------------------------------------------------------ */

/* what a path that is not a regular file is, for messages */
static const char *file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    return "an unknown kind of file";
}

/* the length of the folder part of `path`, its last '/' included; 0 when it has none */
static size_t dir_len(const char *path) {
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

/* pread of n bytes at off, retried until all came; returns the bytes read (fewer at the end
 * of the file) and sets *error to the errno of a failure */
static size_t read_at(int fd, uint64_t off, void *buf, size_t n, int *error) {
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

/* ---- save --------------------------------------------------------------------------------------- */

typedef struct file_writer {
    int fd;
    kvg_hash64 sum;
    int error; /* errno of the first failed write, 0 while none failed */
} file_writer;

static void fw_write(file_writer *w, const void *data, size_t n) {
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
static kvgen_status resolve_target(const char *path, char **out, kvg_stat_t *sb, kvgen_error *err) {
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
            kvgen_status st = kvg_fail(err, KVGEN_E_IO, "kvgen_session_save: %s: cannot look up %s: %s", path, cur,
                                       strerror(e));
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
            kvgen_status st = kvg_fail(err, KVGEN_E_IO, "kvgen_session_save: %s: cannot follow the link %s: %s", path,
                                       cur, strerror(e));
            kvg_free(cur);
            return st;
        }
        char *next = link;
        size_t dl = dir_len(cur);
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
    return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_save: %s: out of memory", path);
}

/* Creates an empty file in the folder of `target` under a hidden name, for the save to be
 * renamed over `target`. Returns its descriptor and its malloc'd name, or -1 with errno set. */
static int create_temp(const char *target, char **name_out) {
    static atomic_uint counter;
    size_t dl = dir_len(target);
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
    size_t dl = dir_len(target);
    char *dir = dl ? kvg_strndup(target, dl) : kvg_strdup(".");
    if (!dir) return ENOMEM;
    int e = kvg_sync_folder(dir);
    kvg_free(dir);
    return e;
}

/* The two ends of an atomic save (kvgen_session_save): a temporary file next to the target,
 * with the permissions of a file it replaces; then the checksum, sync, close and rename over
 * the target (or removal on any failure, `st` included), and the folder's sync. */
static kvgen_status temp_open(const char *target, const kvg_stat_t *sb, const char *path, const char *arrow,
                              const char *shown, file_writer *w, char **tmp, kvgen_error *err) {
    int fd = create_temp(target, tmp);
    if (fd < 0)
        return kvg_fail(err, KVGEN_E_IO, "kvgen_session_save: %s%s%s: cannot create a temporary file next to it: %s",
                        path, arrow, shown, strerror(errno));
    if (sb->st_mode != 0) kvg_keep_mode(fd, sb); /* replacing a file: keep its permissions and owner */
    *w = (file_writer){fd, KVG_HASH64_INIT, 0};
    return KVGEN_OK;
}

static kvgen_status temp_commit(file_writer *w, kvgen_status st, char *tmp, const char *target, const char *path,
                                const char *arrow, const char *shown, kvgen_error *err) {
    unsigned char sum[8];
    put_u64(sum, kvg_hash64_final(&w->sum));
    fw_write(w, sum, 8);
    if (!w->error && kvg_fsync(w->fd) != 0) w->error = errno;
    if (close(w->fd) != 0 && !w->error) w->error = errno;
    if (st == KVGEN_OK && w->error)
        st = kvg_fail(err, KVGEN_E_IO, "kvgen_session_save: %s%s%s: write failed: %s", path, arrow, shown,
                      strerror(w->error));
    if (st == KVGEN_OK && kvg_rename_replace(tmp, target) != 0)
        st = kvg_fail(err, KVGEN_E_IO, "kvgen_session_save: %s%s%s: cannot replace it: %s", path, arrow, shown,
                      strerror(errno));
    if (st != KVGEN_OK) {
        kvg_remove(tmp); /* the target is as it was */
    } else {
        int e = sync_folder(target);
        if (e)
            st = kvg_fail(err, KVGEN_E_IO, "kvgen_session_save: %s%s%s: written, but syncing its folder failed: %s",
                          path, arrow, shown, strerror(e));
    }
    kvg_free(tmp);
    return st;
}

/* The file of a session whose kind saves itself: the header and the kind's bytes, saved as
 * atomically. */
static kvgen_status save_kind(const kvgen_session *s, const char *path, const char *target, const kvg_stat_t *sb,
                              const char *arrow, const char *shown, kvgen_error *err) {
    size_t n = 0;
    char *json = s->kind->save(s, &n);
    if (!json) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_save: %s: out of memory saving the session", path);
    unsigned char header[REMOTE_HEADER] = {0};
    memcpy(header, REMOTE_MAGIC, 8);
    put_u32(header + 8, 1);
    put_u64(header + 16, n);
    file_writer w = {-1, KVG_HASH64_INIT, 0};
    char *tmp = NULL;
    kvgen_status st = temp_open(target, sb, path, arrow, shown, &w, &tmp, err);
    if (st == KVGEN_OK) {
        fw_write(&w, header, sizeof header);
        fw_write(&w, json, n);
        st = temp_commit(&w, KVGEN_OK, tmp, target, path, arrow, shown, err);
    }
    kvg_free(json);
    return st;
}

/* Writes the session to a temporary file next to the target, syncs it and renames it over the
 * target, so that the target is at every moment either the previous file or the complete new
 * one; a failure removes only the temporary file. */
kvgen_status kvgen_session_save(const kvgen_session *s, const char *path, kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_save: session is NULL");
    kvgen_status busy_ = kvg_session_check_host(s, "kvgen_session_save", err);
    if (busy_ != KVGEN_OK) return busy_;
    if (!path || !*path) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_save: path is empty");
    char *target = NULL;
    kvg_stat_t sb;
    kvgen_status st = resolve_target(path, &target, &sb, err);
    if (st != KVGEN_OK) return st;
    bool linked = strcmp(target, path) != 0;
    const char *arrow = linked ? " -> " : "", *shown = linked ? target : "";
    if (sb.st_mode != 0 && !S_ISREG(sb.st_mode)) {
        st = kvg_fail(err, KVGEN_E_IO, "kvgen_session_save: %s%s%s is not a regular file (%s); left as it is", path,
                      arrow, shown, file_kind(sb.st_mode));
        kvg_free(target);
        return st;
    }
    if (sb.st_mode != 0 && kvg_access_write(target) != 0) {
        st = kvg_fail(err, KVGEN_E_IO, "kvgen_session_save: %s%s%s: cannot write: %s", path, arrow, shown,
                      strerror(errno));
        kvg_free(target);
        return st;
    }

    if (s->kind->save) {
        st = save_kind(s, path, target, &sb, arrow, shown, err);
        kvg_free(target);
        return st;
    }
    const kvgen_model *m = s->model;
    const kvg_hparams *hp = &m->w.hp;
    size_t n = s->n_tokens, V = (size_t)hp->n_vocab;
    size_t per = (size_t)hp->n_head_kv * n * (size_t)hp->head_dim; /* floats per layer per K or V */
    size_t chat_bytes = kvg_chat_saved_size(s), sampler_bytes = kvg_sampler_state_size(&s->sampler) + 4 + chat_bytes;
    const float *logits = kvgen_session_logits(s); /* fetched when the device kept them */
    uint64_t file_bytes = HEADER_BYTES + sampler_bytes + n * 4 + (logits ? V * 4 : 0) +
                          (uint64_t)hp->n_layer * 2 * per * 4 + 8;

    unsigned char header[HEADER_BYTES] = {0};
    memcpy(header, FILE_MAGIC, 8);
    put_u32(header + 8, FILE_VERSION);
    put_u32(header + 12, (logits ? FLAG_LOGITS : 0) | (s->no_cache ? FLAG_NO_CACHE : 0) |
                             (s->prefix_reuse ? FLAG_PREFIX_REUSE : 0));
    put_u64(header + 16, kvg_model_identity(m));
    put_u32(header + 24, (uint32_t)hp->n_layer);
    put_u32(header + 28, (uint32_t)hp->n_head_kv);
    put_u32(header + 32, (uint32_t)hp->head_dim);
    put_u32(header + 36, (uint32_t)hp->n_vocab);
    put_u32(header + 40, (uint32_t)s->n_ctx);
    put_u32(header + 44, (uint32_t)s->on_full);
    put_u32(header + 48, (uint32_t)s->keep);
    put_u64(header + 56, n);
    put_u64(header + 64, s->clean_len == KVG_CLEAN_ALL ? UINT64_MAX : (uint64_t)s->clean_len);
    put_u64(header + 72, s->shifts);
    put_u64(header + 80, s->tokens_reused);
    put_u64(header + 88, sampler_bytes);
    put_u64(header + 96, file_bytes);

    unsigned char *sampler = kvg_malloc(sampler_bytes ? sampler_bytes : 1);
    size_t scratch_n = per > V ? per : V;
    if (scratch_n < n) scratch_n = n;
    float *scratch = kvg_malloc((scratch_n ? scratch_n : 1) * sizeof(float));
    if (!sampler || !scratch) {
        kvg_free(sampler);
        kvg_free(scratch);
        kvg_free(target);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_save: %s: out of memory saving the session", path);
    }
    kvg_sampler_state_save(&s->sampler, sampler);
    put_u32(sampler + sampler_bytes - 4 - chat_bytes, (uint32_t)chat_bytes);
    kvg_chat_save(s, sampler + sampler_bytes - chat_bytes);

    char *tmp = NULL;
    file_writer w = {-1, KVG_HASH64_INIT, 0};
    st = temp_open(target, &sb, path, arrow, shown, &w, &tmp, err);
    if (st != KVGEN_OK) {
        kvg_free(sampler);
        kvg_free(scratch);
        kvg_free(target);
        return st;
    }
    fw_write(&w, header, sizeof header);
    fw_write(&w, sampler, sampler_bytes);
    memcpy(scratch, s->tokens, n * 4);
    le32_array(scratch, n);
    fw_write(&w, scratch, n * 4);
    if (logits) {
        memcpy(scratch, logits, V * 4);
        le32_array(scratch, V);
        fw_write(&w, scratch, V * 4);
    }
    for (int l = 0; st == KVGEN_OK && !w.error && l < hp->n_layer && per > 0; l++)
        for (int which = 0; st == KVGEN_OK && which < 2; which++) {
            st = kvgen_session_read_cache(s, l, which, scratch, per, err);
            if (st != KVGEN_OK) break;
            le32_array(scratch, per);
            fw_write(&w, scratch, per * 4);
        }
    kvg_free(sampler);
    kvg_free(scratch);
    st = temp_commit(&w, st, tmp, target, path, arrow, shown, err);
    kvg_free(target);
    return st;
}

/* ---- restore ------------------------------------------------------------------------------------- */

typedef struct file_reader {
    int fd;
    uint64_t off;
    kvg_hash64 sum;
    int error;  /* errno of a failed read */
    bool short_read; /* the file ended early: it changed since it was measured */
} file_reader;

static void fr_read(file_reader *r, void *buf, size_t n) {
    if (r->error || r->short_read || n == 0) return;
    size_t got = read_at(r->fd, r->off, buf, n, &r->error);
    if (!r->error && got < n) r->short_read = true;
    kvg_hash64_add(&r->sum, buf, got);
    r->off += got;
}

/* streams the checksum of the file's first `n` bytes (bounded memory); false on a read failure */
static bool hash_file(file_reader *r, uint64_t n) {
    size_t cap = 1 << 16;
    unsigned char *buf = kvg_malloc(cap);
    if (!buf) {
        r->error = ENOMEM;
        return false;
    }
    while (r->off < n && !r->error && !r->short_read) fr_read(r, buf, n - r->off < cap ? (size_t)(n - r->off) : cap);
    kvg_free(buf);
    return !r->error && !r->short_read;
}

/* Opens `path` for reading when it is a regular file, and measures it. Anything else (a
 * device, FIFO, directory, socket) is refused before it is opened: /dev/zero never ends, a
 * FIFO would block. */
static kvgen_status open_regular(const char *path, int *fd_out, uint64_t *size, kvgen_error *err) {
    *fd_out = -1;
    kvg_stat_t sb;
    if (kvg_stat(path, &sb) != 0)
        return kvg_fail(err, KVGEN_E_IO, "kvgen_session_restore: %s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return kvg_fail(err, KVGEN_E_IO, "kvgen_session_restore: %s is not a regular file (%s)", path,
                        file_kind(sb.st_mode));
    /* O_NONBLOCK: should the path have become a FIFO since, the open does not wait for a writer */
    int fd = kvg_open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0);
    if (fd < 0) return kvg_fail(err, KVGEN_E_IO, "kvgen_session_restore: %s: cannot open: %s", path, strerror(errno));
    if (kvg_fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        kvgen_status st = S_ISREG(sb.st_mode)
                              ? kvg_fail(err, KVGEN_E_IO, "kvgen_session_restore: %s: cannot stat: %s", path,
                                         strerror(errno))
                              : kvg_fail(err, KVGEN_E_IO, "kvgen_session_restore: %s is not a regular file (%s)",
                                         path, file_kind(sb.st_mode));
        close(fd);
        return st;
    }
    *fd_out = fd;
    *size = (uint64_t)sb.st_size;
    return KVGEN_OK;
}

/* The header's model, shapes, options and section sizes against `model`: what restore checks
 * once the checksum matched. Passing it bounds every allocation restore makes by the model's
 * shapes and the file's real size. */
static kvgen_status check_header(const kvgen_model *model, const unsigned char *h, const char *path,
                                 kvgen_error *err) {
    const kvg_hparams *hp = &model->w.hp;
    if (get_u64(h + 16) != kvg_model_identity(model))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "kvgen_session_restore: %s: saved from another model than '%s' (model hash %016llx, this one "
                        "%016llx)",
                        path, model->name, (unsigned long long)get_u64(h + 16),
                        (unsigned long long)kvg_model_identity(model));
    /* the checksum matched, so what follows was written by a kvgen; the checks guard against a
     * file crafted to match its checksum */
    uint32_t flags = get_u32(h + 12);
    if (get_u32(h + 24) != (uint32_t)hp->n_layer || get_u32(h + 28) != (uint32_t)hp->n_head_kv ||
        get_u32(h + 32) != (uint32_t)hp->head_dim || get_u32(h + 36) != (uint32_t)hp->n_vocab)
        return kvg_fail(err, KVGEN_E_FORMAT, "kvgen_session_restore: %s: cache shape does not match the model", path);
    uint32_t n_ctx = get_u32(h + 40), on_full = get_u32(h + 44), keep = get_u32(h + 48);
    uint64_t n = get_u64(h + 56), sampler_bytes = get_u64(h + 88), file_bytes = get_u64(h + 96);
    if (n_ctx == 0 || n_ctx > KVG_MAX_CTX || n > n_ctx || on_full > KVGEN_ON_FULL_SHIFT || keep > KVG_MAX_CTX)
        return kvg_fail(err, KVGEN_E_FORMAT, "kvgen_session_restore: %s: bad session options (n_ctx %u, %llu tokens)",
                        path, (unsigned)n_ctx, (unsigned long long)n);
    uint64_t V = (uint64_t)hp->n_vocab, per = (uint64_t)hp->n_head_kv * n * (uint64_t)hp->head_dim;
    uint64_t body = n * 4 + ((flags & FLAG_LOGITS) ? V * 4 : 0) + (uint64_t)hp->n_layer * 2 * per * 4;
    if (sampler_bytes > file_bytes || HEADER_BYTES + sampler_bytes + body + 8 != file_bytes)
        return kvg_fail(err, KVGEN_E_FORMAT, "kvgen_session_restore: %s: section sizes do not add up to the file size",
                        path);
    return KVGEN_OK;
}

/* The file of a session whose kind saves itself: checked whole (checksum, sizes, then the kind
 * checks its bytes) before the session exists. */
static kvgen_status restore_kind(kvgen_model *model, int fd, uint64_t size, const char *path, kvgen_session **out,
                                 kvgen_error *err) {
    *out = NULL;
    if (size < REMOTE_HEADER + 8 || size > ((uint64_t)1 << 31))
        return kvg_fail(err, KVGEN_E_FORMAT, "kvgen_session_restore: %s: a remote session of %llu bytes is truncated "
                        "or too large", path, (unsigned long long)size);
    unsigned char *buf = kvg_malloc((size_t)size);
    if (!buf) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_restore: %s: out of memory", path);
    file_reader r = {fd, 0, KVG_HASH64_INIT, 0, false};
    if (lseek(fd, 0, SEEK_SET) != 0) r.error = errno;
    if (!r.error) fr_read(&r, buf, (size_t)size);
    kvgen_status st = KVGEN_OK;
    if (r.error || r.short_read) {
        st = kvg_fail(err, KVGEN_E_IO, "kvgen_session_restore: %s: read error: %s", path,
                      r.error ? strerror(r.error) : "the file changed while it was read");
    } else if (get_u32(buf + 8) > 1) {
        st = kvg_fail(err, KVGEN_E_UNSUPPORTED, "kvgen_session_restore: %s: remote session version %u is newer than "
                      "this kvgen reads (1)", path, (unsigned)get_u32(buf + 8));
    } else if (get_u64(buf + 16) != size - REMOTE_HEADER - 8) {
        st = kvg_fail(err, KVGEN_E_FORMAT, "kvgen_session_restore: %s: truncated or corrupted: %llu bytes where the "
                      "header says %llu", path, (unsigned long long)size,
                      (unsigned long long)(get_u64(buf + 16) + REMOTE_HEADER + 8));
    } else {
        kvg_hash64 hs = KVG_HASH64_INIT;
        kvg_hash64_add(&hs, buf, (size_t)size - 8);
        if (kvg_hash64_final(&hs) != get_u64(buf + size - 8))
            st = kvg_fail(err, KVGEN_E_FORMAT, "kvgen_session_restore: %s: corrupted (checksum mismatch)", path);
    }
    char who[300];
    snprintf(who, sizeof who, "kvgen_session_restore: %s", path);
    if (st == KVGEN_OK)
        st = kvg_session_kind_of(model)->restore(model, (const char *)buf + REMOTE_HEADER,
                                                 (size_t)(size - REMOTE_HEADER - 8), who, out, err);
    kvg_free(buf);
    return st;
}

kvgen_status kvgen_session_restore(kvgen_model *model, const char *path, kvgen_session **out, kvgen_error *err) {
    if (out) *out = NULL;
    if (!model) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_restore: model is NULL");
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_restore: out is NULL");
    if (!path || !*path) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_restore: path is empty");
    int fd = -1;
    uint64_t size = 0;
    kvgen_status st = open_regular(path, &fd, &size, err);
    if (st != KVGEN_OK) return st;
    const kvg_hparams *hp = &model->w.hp;

#define REFUSE(status, ...)                                                                                            \
    do {                                                                                                               \
        st = kvg_fail(err, status, __VA_ARGS__);                                                                       \
        goto done;                                                                                                     \
    } while (0)
#define READ_FAILED(r)                                                                                                 \
    do {                                                                                                               \
        if ((r).error) REFUSE(KVGEN_E_IO, "kvgen_session_restore: %s: read error: %s", path, strerror((r).error));    \
        REFUSE(KVGEN_E_IO, "kvgen_session_restore: %s: the file changed while it was read", path);                    \
    } while (0)

    kvgen_session *s = NULL;
    unsigned char *sampler = NULL;
    int32_t *tokens = NULL;
    float *kv = NULL, *logits = NULL;
    /* the header first, and nothing past it until its sizes agree with the file's */
    unsigned char h[HEADER_BYTES] = {0};
    file_reader r = {fd, 0, KVG_HASH64_INIT, 0, false};
    size_t head = size < HEADER_BYTES ? (size_t)size : HEADER_BYTES;
    fr_read(&r, h, head);
    if (r.error || r.short_read) READ_FAILED(r);
    if (size >= 8 && memcmp(h, REMOTE_MAGIC, 8) == 0) {
        if (!kvg_session_kind_of(model)->restore)
            REFUSE(KVGEN_E_INVALID_ARGUMENT,
                   "kvgen_session_restore: %s: saved from a remote model's session; restore it on a model loaded from "
                   "its server's URL",
                   path);
        st = restore_kind(model, fd, size, path, &s, err);
        goto done;
    }
    if (size < 8 || memcmp(h, FILE_MAGIC, 8) != 0)
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: not a kvgen session file (no KVGSESS magic)", path);
    if (kvg_session_kind_of(model)->restore)
        REFUSE(KVGEN_E_INVALID_ARGUMENT,
               "kvgen_session_restore: %s: a local session (its cache); restore it on the GGUF model it was saved "
               "from, not the remote model '%s'",
               path, model->name);
    if (size < 12)
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: truncated: %llu bytes, no format version", path,
               (unsigned long long)size);
    uint32_t version = get_u32(h + 8);
    if (version > FILE_VERSION)
        REFUSE(KVGEN_E_UNSUPPORTED,
               "kvgen_session_restore: %s: session format version %u is newer than this kvgen reads (%u); upgrade "
               "kvgen",
               path, (unsigned)version, FILE_VERSION);
    if (version == 0)
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: session format version 0 does not exist", path);
    if (size < HEADER_BYTES + 8)
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: truncated: %llu bytes, shorter than the %d-byte header",
               path, (unsigned long long)size, HEADER_BYTES + 8);
    uint64_t file_bytes = get_u64(h + 96);
    if (size < file_bytes)
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: truncated: %llu of %llu bytes", path,
               (unsigned long long)size, (unsigned long long)file_bytes);
    if (size > file_bytes)
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: corrupted: %llu bytes where the header says %llu", path,
               (unsigned long long)size, (unsigned long long)file_bytes);

    /* A header that does not fit the model is, in a file whose checksum fails, corruption (a
     * flipped bit in a size must not read as a shape mismatch): the checksum is then streamed
     * through a small buffer to tell which, and nothing sized by the header is allocated. */
    kvgen_error why = {0};
    if (check_header(model, h, path, &why) != KVGEN_OK) {
        unsigned char stored[8];
        if (!hash_file(&r, file_bytes - 8)) READ_FAILED(r);
        kvg_hash64 body_sum = r.sum;
        fr_read(&r, stored, 8);
        if (r.error || r.short_read) READ_FAILED(r);
        if (kvg_hash64_final(&body_sum) != get_u64(stored))
            REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: corrupted: checksum mismatch", path);
        REFUSE(why.status, "%s", why.message);
    }

    /* every size below is now bounded by the model's shapes and the file's size */
    uint32_t flags = get_u32(h + 12);
    uint64_t n = get_u64(h + 56), clean_len = get_u64(h + 64), sampler_bytes = get_u64(h + 88);
    size_t V = (size_t)hp->n_vocab, per = (size_t)hp->n_head_kv * (size_t)n * (size_t)hp->head_dim;
    size_t n_kv = (size_t)hp->n_layer * 2 * per;
    sampler = kvg_malloc(sampler_bytes ? (size_t)sampler_bytes : 1);
    tokens = kvg_malloc((size_t)(n ? n : 1) * 4);
    logits = kvg_malloc((flags & FLAG_LOGITS) ? V * 4 : 1);
    kv = kvg_malloc((n_kv + 1) * sizeof(float));
    if (!sampler || !tokens || !logits || !kv)
        REFUSE(KVGEN_E_NO_MEMORY, "kvgen_session_restore: %s: out of memory restoring %llu tokens", path,
               (unsigned long long)n);
    fr_read(&r, sampler, (size_t)sampler_bytes);
    fr_read(&r, tokens, (size_t)n * 4);
    if (flags & FLAG_LOGITS) fr_read(&r, logits, V * 4);
    fr_read(&r, kv, n_kv * 4);
    unsigned char stored[8];
    kvg_hash64 body_sum = r.sum;
    fr_read(&r, stored, 8);
    if (r.error || r.short_read) READ_FAILED(r);
    if (kvg_hash64_final(&body_sum) != get_u64(stored))
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: corrupted: checksum mismatch", path);
    close(fd);
    fd = -1;

    from_le32_array(tokens, (size_t)n);
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: token %zu: id %d is outside the vocabulary", path, i,
                   (int)tokens[i]);
    from_le32_array(kv, n_kv);
    kvgen_session_desc d = {.n_ctx = (int)get_u32(h + 40), .no_cache = (flags & FLAG_NO_CACHE) != 0,
                            .on_full = (kvgen_on_full)get_u32(h + 44), .keep = (int)get_u32(h + 48),
                            .no_prefix_reuse = (flags & FLAG_PREFIX_REUSE) == 0};
    st = kvg_session_new(model, &d, NULL, &s, err);
    if (st != KVGEN_OK) goto done;
    size_t used = 0;
    st = kvg_sampler_state_load(&s->sampler, sampler, (size_t)sampler_bytes, &used, &why);
    if (st != KVGEN_OK) REFUSE(st, "kvgen_session_restore: %s: %s", path, why.message);
    if (sampler_bytes - used < 4 || get_u32(sampler + used) != sampler_bytes - used - 4)
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: the conversation after the sampler state is malformed",
               path);
    st = kvg_chat_load(s, sampler + used + 4, (size_t)sampler_bytes - used - 4, &why);
    if (st != KVGEN_OK) REFUSE(st, "kvgen_session_restore: %s: %s", path, why.message);
    s->clean_len = clean_len == UINT64_MAX || clean_len > n ? KVG_CLEAN_ALL : (size_t)clean_len;
    st = kvg_session_load_kv(s, tokens, (size_t)n, kv, err);
    if (st != KVGEN_OK) goto done;
    /* the saved logits, not a recomputation: a contiguous model recomputed them on the way */
    if (flags & FLAG_LOGITS) {
        memcpy(s->logits, logits, V * 4);
        from_le32_array(s->logits, V);
    }
    s->has_logits = (flags & FLAG_LOGITS) != 0;
    s->shifts = (size_t)get_u64(h + 72);
    s->tokens_reused = (size_t)get_u64(h + 80);
#undef READ_FAILED
#undef REFUSE
done:
    if (fd >= 0) close(fd);
    kvg_free(sampler);
    kvg_free(tokens);
    kvg_free(logits);
    kvg_free(kv);
    if (st != KVGEN_OK) {
        kvgen_session_close(s);
        return st;
    }
    *out = s;
    return KVGEN_OK;
}
