/* test_session_file.c: kvgen_session_save / kvgen_session_restore: identical next-token
 * logits and samples after a restore, and clear refusals of foreign, truncated, corrupted and
 * newer files; restore of devices, FIFOs and oversized headers refused without reading or
 * allocating what they claim; saves that fail half-way, go through symbolic links or name
 * something that is not a regular file leave what was there intact. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>
#include "kvg_file.h"
#include "kvg_hash.h"
#include "testutil.h"

static int n_vocab;

static kvgen_model *load(const char *path) {
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 2};
    return tu_load(&md);
}

static bool write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static void expect_refusal(kvgen_model *m, const char *path, kvgen_status want, const char *phrase, const char *what) {
    kvgen_error err = {0};
    kvgen_session *s = (kvgen_session *)&err; /* must be reset to NULL */
    kvgen_status st = kvgen_session_restore(m, path, &s, &err);
    CHECKF(st == want && s == NULL, "%s: status %s, want %s", what, kvgen_status_name(st), kvgen_status_name(want));
    CHECKF(strstr(err.message, phrase) != NULL && strstr(err.message, path) != NULL &&
               strstr(err.message, "kvgen_session_restore") != NULL,
           "%s: message '%s' lacks '%s', the path or the function", what, err.message, phrase);
    printf("%s: %s\n", what, err.message);
}

/* save, restore, then both continue the same way: same logits, same samples */
static void round_trip(kvgen_model *saver, kvgen_model *loader, bool shift, const char *what) {
    kvgen_error err = {0};
    kvgen_session *s = NULL, *r = NULL;
    kvgen_session_desc sd = {.n_ctx = 96, .temperature = 0.8f, .top_k = 20, .seed = 5};
    if (shift) {
        sd.on_full = KVGEN_ON_FULL_SHIFT;
        sd.keep = 4;
    }
    CHECK_OK(kvgen_session_create(saver, &sd, &s, &err));
    int32_t t[150];
    tu_fill_tokens(t, 150, 9, n_vocab);
    CHECK_OK(kvgen_session_prefill(s, t, shift ? 96 : 70, NULL, &err));
    if (shift) CHECK_OK(kvgen_session_decode(s, t[100], &err));
    kvgen_session_sample(s); /* advance the RNG: the restored one must continue from here */
    char *file = tu_tmpfile("session.kvs");
    CHECK_OK(kvgen_session_save(s, file, &err));
    CHECK_OK(kvgen_session_restore(loader, file, &r, &err));
    if (r) {
        CHECK(kvgen_session_length(r) == kvgen_session_length(s));
        CHECK(memcmp(kvgen_session_tokens(r), kvgen_session_tokens(s), kvgen_session_length(s) * 4) == 0);
        const float *a = kvgen_session_logits(s), *b = kvgen_session_logits(r);
        CHECKF(a && b && memcmp(a, b, (size_t)n_vocab * 4) == 0, "%s: restored logits differ", what);
        kvgen_cache_info ca, cb;
        kvgen_session_cache_info(s, &ca);
        kvgen_session_cache_info(r, &cb);
        CHECK(ca.capacity == cb.capacity && ca.shifts == cb.shifts);
        size_t nf = (size_t)ca.n_head_kv * ca.length * ca.head_dim;
        float *ka = malloc(nf * 4), *kb = malloc(nf * 4);
        CHECK_OK(kvgen_session_read_cache(s, 1, 0, ka, nf, &err));
        CHECK_OK(kvgen_session_read_cache(r, 1, 0, kb, nf, &err));
        double d = 0;
        for (size_t i = 0; i < nf; i++) d = fmax(d, fabs((double)ka[i] - kb[i]));
        /* the loader writes the saved K/V into its pages: exactly, shifted or not */
        CHECKF(d == 0, "%s: restored K differs by %g", what, d);
        free(ka);
        free(kb);
        int n_draws = 12;
        for (int i = 0; i < n_draws; i++) {
            int32_t x = kvgen_session_sample(s), y = kvgen_session_sample(r);
            CHECKF(x == y, "%s: sample %d differs (%d vs %d)", what, i, (int)x, (int)y);
            CHECK_OK(kvgen_session_decode(s, x, &err));
            CHECK_OK(kvgen_session_decode(r, y, &err));
            CHECKF(memcmp(kvgen_session_logits(s), kvgen_session_logits(r), (size_t)n_vocab * 4) == 0,
                       "%s: logits differ %d tokens after the restore", what, i + 1);
        }
    }
    kvgen_session_close(r);
    kvgen_session_close(s);
    free(file);
}

static void test_refusals(kvgen_model *m, kvgen_model *other) {
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {.n_ctx = 64};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    int32_t t[40];
    tu_fill_tokens(t, 40, 3, n_vocab);
    CHECK_OK(kvgen_session_prefill(s, t, 40, NULL, &err));
    char *file = tu_tmpfile("good.kvs"), *bad = tu_tmpfile("bad.kvs");
    CHECK_OK(kvgen_session_save(s, file, &err));
    kvgen_session_close(s);
    size_t size = 0;
    char *bytes = tu_read_file(file, &size);
    CHECK(bytes && size > 200);
    if (!bytes) return;

    expect_refusal(other, file, KVGEN_E_INVALID_ARGUMENT, "another model", "other model");
    char *missing = tu_tmpfile("missing.kvs");
    remove(missing);
    expect_refusal(m, missing, KVGEN_E_IO, "cannot open", "missing file");
    free(missing);

    write_file(bad, bytes, size / 2);
    expect_refusal(m, bad, KVGEN_E_FORMAT, "truncated", "truncated file");
    write_file(bad, bytes, 10);
    expect_refusal(m, bad, KVGEN_E_FORMAT, "truncated", "truncated header");
    write_file(bad, bytes, 0);
    expect_refusal(m, bad, KVGEN_E_FORMAT, "not a kvgen session", "empty file");

    /* one flipped bit anywhere past the magic and version: checksum */
    size_t spots[] = {20, 60, 130, size / 2, size - 20, size - 1};
    for (size_t i = 0; i < sizeof spots / sizeof spots[0]; i++) {
        bytes[spots[i]] ^= 0x10;
        write_file(bad, bytes, size);
        bytes[spots[i]] ^= 0x10;
        char what[64];
        snprintf(what, sizeof what, "bit flip at %zu", spots[i]);
        expect_refusal(m, bad, KVGEN_E_FORMAT, "corrupted", what);
    }
    /* extra bytes */
    char *longer = malloc(size + 3);
    memcpy(longer, bytes, size);
    memset(longer + size, 0, 3);
    write_file(bad, longer, size + 3);
    expect_refusal(m, bad, KVGEN_E_FORMAT, "corrupted", "trailing bytes");
    free(longer);

    /* a newer version: refused before anything else is read */
    bytes[8] = 3;
    write_file(bad, bytes, size);
    expect_refusal(m, bad, KVGEN_E_UNSUPPORTED, "newer", "version 3");
    /* version 1 (no adapters: its adapter count was a reserved 0) is still read, and a
     * version 1 header that claims adapters is refused */
    {
        unsigned char *v1 = malloc(size);
        memcpy(v1, bytes, size);
        v1[8] = 1;
        kvg_hash64 h = KVG_HASH64_INIT;
        kvg_hash64_add(&h, v1, size - 8);
        kvg_put_u64(v1 + size - 8, kvg_hash64_final(&h));
        write_file(bad, v1, size);
        CHECK_OK(kvgen_session_restore(m, bad, &s, &err));
        kvgen_session_close(s);
        v1[52] = 1;
        h = (kvg_hash64)KVG_HASH64_INIT;
        kvg_hash64_add(&h, v1, size - 8);
        kvg_put_u64(v1 + size - 8, kvg_hash64_final(&h));
        write_file(bad, v1, size);
        expect_refusal(m, bad, KVGEN_E_FORMAT, "adapter count", "version 1 with adapters");
        free(v1);
    }
    bytes[8] = 2;
    bytes[0] = 'X';
    write_file(bad, bytes, size);
    expect_refusal(m, bad, KVGEN_E_FORMAT, "not a kvgen session", "bad magic");
    bytes[0] = 'K';
    write_file(bad, bytes, size);
    CHECK_OK(kvgen_session_restore(m, bad, &s, &err)); /* the untouched bytes still load */
    kvgen_session_close(s);

    CHECK(kvgen_session_save(NULL, file, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_session_restore(m, NULL, &s, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    CHECK(kvgen_session_save(s, "/nonexistent-dir/x.kvs", &err) == KVGEN_E_IO);
    /* an empty session round-trips too */
    CHECK_OK(kvgen_session_save(s, file, &err));
    kvgen_session_close(s);
    s = NULL;
    CHECK_OK(kvgen_session_restore(m, file, &s, &err));
    CHECK(s && kvgen_session_length(s) == 0 && kvgen_session_logits(s) == NULL);
    kvgen_session_close(s);
    free(bytes);
    free(file);
    free(bad);
}

/* ---- files that are not what they claim, and saves that must not destroy ------------------- */

/* bytes this process has read with read(2)/pread(2) so far (/proc/self/io), -1 when unknown */
static long long bytes_read_so_far(void) {
    FILE *f = fopen("/proc/self/io", "r");
    if (!f) return -1;
    long long v = -1;
    char line[128];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "rchar: %lld", &v) == 1) break;
    fclose(f);
    return v;
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* removes `path` and, for a folder, what it holds (the tests make folders one level deep) */
static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char *p = join(path, e->d_name);
            remove_tree(p);
            free(p);
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* an empty scratch folder (malloc'd path) */
static char *fresh_dir(const char *name) {
    char *dir = tu_tmpfile(name);
    remove_tree(dir);
    CHECKF(mkdir(dir, 0777) == 0, "mkdir %s: %s", dir, strerror(errno));
    return dir;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* the names in a folder, sorted, joined by spaces, into buf: what a test expects to be left */
static const char *listing(const char *dir, char *buf, size_t cap) {
    char *names[32];
    int n = 0;
    DIR *d = opendir(dir);
    buf[0] = 0;
    if (!d) return "(unreadable)";
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 32)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_names);
    for (int i = 0; i < n; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, cap - used, "%s%s", i ? " " : "", names[i]);
        free(names[i]);
    }
    return buf;
}

#define CHECK_LISTING(dir, want)                                                                                       \
    do {                                                                                                               \
        char buf_[1024];                                                                                               \
        const char *got_ = listing(dir, buf_, sizeof buf_);                                                            \
        CHECKF(strcmp(got_, want) == 0, "%s holds '%s', want '%s'", dir, got_, want);                                 \
    } while (0)

static kvgen_session *filled(kvgen_model *m, int n_tokens, unsigned seed) {
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {.n_ctx = 128};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    if (s && n_tokens > 0) {
        int32_t t[128];
        tu_fill_tokens(t, (size_t)n_tokens, seed, n_vocab);
        CHECK_OK(kvgen_session_prefill(s, t, (size_t)n_tokens, NULL, &err));
    }
    return s;
}

/* the length of the session in a file, -1 when it does not restore */
static long restored_length(kvgen_model *m, const char *path) {
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    if (kvgen_session_restore(m, path, &s, &err) != KVGEN_OK) {
        printf("restore %s: %s\n", path, err.message);
        return -1;
    }
    long n = (long)kvgen_session_length(s);
    kvgen_session_close(s);
    return n;
}

static bool same_bytes(const char *path, const char *want, size_t want_size) {
    size_t size = 0;
    char *got = tu_read_file(path, &size);
    bool same = got && size == want_size && memcmp(got, want, size) == 0;
    free(got);
    return same;
}

/* a save that must be refused with `phrase` in a message naming the function and the path */
static void expect_save_refusal(const kvgen_session *s, const char *path, const char *phrase, const char *what) {
    kvgen_error err = {0};
    kvgen_status st = kvgen_session_save(s, path, &err);
    CHECKF(st == KVGEN_E_IO, "%s: status %s, want io", what, kvgen_status_name(st));
    CHECKF(strstr(err.message, "kvgen_session_save") && strstr(err.message, path) && strstr(err.message, phrase),
           "%s: message '%s' lacks '%s', the path or the function", what, err.message, phrase);
    printf("%s: %s\n", what, err.message);
}

/* /dev/zero never ends and a FIFO blocks: both, and folders, are refused before any read. The
 * alarm turns a hang into a failure. */
static void test_restore_special_files(kvgen_model *m) {
    alarm(60);
    char *dir = fresh_dir("sf-special");
    const char *devices[] = {"/dev/zero", "/dev/urandom"};
    for (int i = 0; i < 2; i++) {
        if (access(devices[i], R_OK) != 0) continue;
        long long before = bytes_read_so_far();
        expect_refusal(m, devices[i], KVGEN_E_IO, "is not a regular file (a character device)", devices[i]);
        long long after = bytes_read_so_far();
        if (before >= 0 && after >= 0)
            CHECKF(after - before < (1 << 20), "%s: refused having read %lld bytes", devices[i], after - before);
    }
    char *fifo = join(dir, "pipe.kvs"), *link = join(dir, "zero.kvs");
    if (mkfifo(fifo, 0600) == 0)
        expect_refusal(m, fifo, KVGEN_E_IO, "is not a regular file (a FIFO)", "FIFO");
    else
        printf("mkfifo %s: %s; FIFO not checked\n", fifo, strerror(errno));
    expect_refusal(m, dir, KVGEN_E_IO, "is not a regular file (a directory)", "folder");
    CHECK(symlink("/dev/zero", link) == 0);
    expect_refusal(m, link, KVGEN_E_IO, "is not a regular file", "link to /dev/zero");
    alarm(0);
    remove_tree(dir);
    free(fifo);
    free(link);
    free(dir);
}

/* Restore reads the header, then nothing more until the header's size is the file's: a header
 * claiming more than the file holds, or a file far longer than its header says, is refused
 * having read about a header's worth and allocated nothing the header sized. */
static void test_restore_bounded(kvgen_model *m) {
    char *bad = tu_tmpfile("bounded.kvs");
    kvgen_error err = {0};
    kvgen_session *s = filled(m, 20, 4);
    CHECK_OK(kvgen_session_save(s, bad, &err));
    kvgen_session_close(s);
    size_t size = 0;
    char *bytes = tu_read_file(bad, &size);
    CHECK(bytes && size > 1000);
    if (!bytes) {
        free(bad);
        return;
    }
    uint64_t claims[] = {(uint64_t)1 << 40, (uint64_t)1 << 62, UINT64_MAX};
    for (int i = 0; i < 3; i++) {
        for (int b = 0; b < 8; b++) bytes[96 + b] = (char)(claims[i] >> (8 * b));
        write_file(bad, bytes, size);
        char what[64];
        snprintf(what, sizeof what, "header claiming %llu bytes", (unsigned long long)claims[i]);
        expect_refusal(m, bad, KVGEN_E_FORMAT, "truncated", what); /* not no_memory: nothing allocated */
    }
    for (int b = 0; b < 8; b++) bytes[96 + b] = (char)((uint64_t)size >> (8 * b));

    /* a 1 GiB file (sparse: no disk used) behind a good header, and one with no header at all */
    long long before = bytes_read_so_far();
    const off_t big = (off_t)1 << 30;
    write_file(bad, bytes, size);
    CHECK(truncate(bad, big) == 0);
    expect_refusal(m, bad, KVGEN_E_FORMAT, "where the header says", "1 GiB file with a small header");
    write_file(bad, "", 0);
    CHECK(truncate(bad, big) == 0);
    expect_refusal(m, bad, KVGEN_E_FORMAT, "not a kvgen session", "1 GiB of zeros");
    long long after = bytes_read_so_far();
    if (before >= 0 && after >= 0)
        CHECKF(after - before < (1 << 20), "refusing two 1 GiB files read %lld bytes", after - before);
    else
        printf("/proc/self/io unreadable: bytes read not checked\n");
    remove(bad);
    free(bad);
    free(bytes);
}

/* Saves `s` to `path` in a child whose file-size limit stops the write half-way (SIGXFSZ
 * ignored, so write fails with EFBIG); true when the save failed with a message naming the
 * function, the path and the cause. */
static bool save_past_limit(const kvgen_session *s, const char *path, rlim_t limit) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid < 0) return false;
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {limit, limit};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(3);
        kvgen_error err = {0};
        kvgen_status st = kvgen_session_save(s, path, &err);
        printf("save past a %llu-byte limit: %s: %s\n", (unsigned long long)limit, kvgen_status_name(st), err.message);
        bool ok = st == KVGEN_E_IO && strstr(err.message, "kvgen_session_save") && strstr(err.message, path) &&
                  strstr(err.message, strerror(EFBIG));
        fflush(stdout);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "save child: status %d", status);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* A save that fails half-way leaves the previous save byte-identical and restorable, a link
 * to it in place, no file where there was none, and no temporary file. */
static void test_failed_save(kvgen_model *m) {
    char *dir = fresh_dir("sf-fail");
    char *path = join(dir, "game.kvs"), *link = join(dir, "link.kvs"), *fresh = join(dir, "new.kvs");
    char *probe = tu_tmpfile("sf-probe.kvs");
    kvgen_error err = {0};
    kvgen_session *small = filled(m, 5, 1), *large = filled(m, 100, 2);
    CHECK_OK(kvgen_session_save(small, path, &err));
    CHECK_OK(kvgen_session_save(large, probe, &err));
    size_t size = 0, large_size = 0;
    char *good = tu_read_file(path, &size);
    struct stat sb;
    if (stat(probe, &sb) == 0) large_size = (size_t)sb.st_size;
    remove(probe);
    rlim_t limit = (rlim_t)(size + (large_size - size) / 2);
    CHECKF(good && large_size > size + 8192, "sizes %zu and %zu", size, large_size);
    CHECK(symlink("game.kvs", link) == 0);
    CHECK_LISTING(dir, "game.kvs link.kvs");
    if (good) {
        save_past_limit(large, path, limit);
        CHECKF(same_bytes(path, good, size), "the previous save changed");
        CHECK(restored_length(m, path) == 5);
        CHECK_LISTING(dir, "game.kvs link.kvs");

        save_past_limit(large, link, limit);
        CHECKF(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode), "the link is gone");
        CHECKF(same_bytes(path, good, size), "the previous save changed (through the link)");
        CHECK_LISTING(dir, "game.kvs link.kvs");

        save_past_limit(large, fresh, limit);
        CHECKF(access(fresh, F_OK) != 0, "a failed first save left a file");
        CHECK_LISTING(dir, "game.kvs link.kvs");

        /* the same saves without a limit succeed and replace */
        CHECK_OK(kvgen_session_save(large, link, &err));
        CHECK(restored_length(m, path) == 100);
        CHECK_LISTING(dir, "game.kvs link.kvs");
    }
    kvgen_session_close(small);
    kvgen_session_close(large);
    remove_tree(dir);
    free(good);
    free(path);
    free(link);
    free(fresh);
    free(probe);
    free(dir);
}

/* A save through a symbolic link (relative, absolute, a chain, dangling) updates the file the
 * link points to and keeps the link; a replaced file keeps its permissions, a new one gets
 * the umask's. */
static void test_save_links(kvgen_model *m) {
    char *dir = fresh_dir("sf-links");
    char *real = join(dir, "real.kvs"), *rel = join(dir, "rel.kvs"), *abs_link = join(dir, "abs.kvs");
    char *chain = join(dir, "chain.kvs"), *dangling = join(dir, "dangling.kvs"), *made = join(dir, "made.kvs");
    kvgen_error err = {0};
    kvgen_session *s[5];
    for (int i = 0; i < 5; i++) s[i] = filled(m, 3 + 2 * i, 10 + (unsigned)i);
    CHECK_OK(kvgen_session_save(s[0], real, &err));
    CHECK(chmod(real, 0640) == 0);
    CHECK(symlink("real.kvs", rel) == 0);
    CHECK(symlink(real, abs_link) == 0);
    CHECK(symlink("rel.kvs", chain) == 0);
    CHECK(symlink("made.kvs", dangling) == 0);
    const char *links[] = {rel, abs_link, chain};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(kvgen_session_save(s[i + 1], links[i], &err));
        CHECKF(restored_length(m, real) == 5 + 2 * i, "save through %s did not reach the file", links[i]);
        struct stat sb;
        CHECKF(lstat(links[i], &sb) == 0 && S_ISLNK(sb.st_mode), "%s is no longer a link", links[i]);
        CHECKF(stat(real, &sb) == 0 && (sb.st_mode & 07777) == 0640, "mode %o after a save through %s",
               (unsigned)(sb.st_mode & 07777), links[i]);
    }
    char target[64] = {0};
    CHECK(readlink(chain, target, sizeof target - 1) > 0 && strcmp(target, "rel.kvs") == 0);
    mode_t mask = umask(022);
    CHECK_OK(kvgen_session_save(s[4], dangling, &err));
    umask(mask);
    struct stat sb;
    CHECKF(lstat(made, &sb) == 0 && S_ISREG(sb.st_mode) && (sb.st_mode & 0777) == 0644,
           "a save through a dangling link: made.kvs mode %o", (unsigned)(sb.st_mode & 0777));
    CHECK(lstat(dangling, &sb) == 0 && S_ISLNK(sb.st_mode));
    CHECK(restored_length(m, made) == 11);
    CHECK(restored_length(m, dangling) == 11);
    CHECK_LISTING(dir, "abs.kvs chain.kvs dangling.kvs made.kvs real.kvs rel.kvs");
    for (int i = 0; i < 5; i++) kvgen_session_close(s[i]);
    remove_tree(dir);
    free(real);
    free(rel);
    free(abs_link);
    free(chain);
    free(dangling);
    free(made);
    free(dir);
}

/* A save onto something that is not a regular file (a device, directly or through a link, a
 * folder, a FIFO) is refused and leaves it as it was; so is a file the caller may not write. */
static void test_save_refusals(kvgen_model *m) {
    alarm(60); /* a FIFO would block an open for writing */
    char *dir = fresh_dir("sf-refuse");
    char *sub = join(dir, "sub"), *kept = join(dir, "sub/kept.txt"), *fifo = join(dir, "pipe.kvs");
    char *null_link = join(dir, "null.kvs"), *ro = join(dir, "readonly.kvs");
    kvgen_session *s = filled(m, 6, 3);
    struct stat before, after;
    bool have_null = stat("/dev/null", &before) == 0, have_fifo = false;
    if (have_null) {
        expect_save_refusal(s, "/dev/null", "is not a regular file (a character device)", "save onto /dev/null");
        CHECK(symlink("/dev/null", null_link) == 0);
        expect_save_refusal(s, null_link, "is not a regular file (a character device)",
                            "save through a link to /dev/null");
        CHECK(lstat(null_link, &after) == 0 && S_ISLNK(after.st_mode));
        CHECKF(stat("/dev/null", &after) == 0 && S_ISCHR(after.st_mode) && after.st_ino == before.st_ino &&
                   after.st_rdev == before.st_rdev && after.st_mode == before.st_mode,
               "/dev/null changed");
    }
    CHECK(mkdir(sub, 0777) == 0);
    CHECK(write_file(kept, "keep", 4));
    expect_save_refusal(s, sub, "is not a regular file (a directory)", "save onto a folder");
    char *slashed = join(sub, "");
    expect_save_refusal(s, slashed, "is not a regular file (a directory)", "save onto a folder/");
    free(slashed);
    CHECK(stat(sub, &after) == 0 && S_ISDIR(after.st_mode));
    CHECK(same_bytes(kept, "keep", 4));
    CHECK_LISTING(sub, "kept.txt");
    if (mkfifo(fifo, 0600) == 0) {
        have_fifo = true;
        expect_save_refusal(s, fifo, "is not a regular file (a FIFO)", "save onto a FIFO");
        CHECK(lstat(fifo, &after) == 0 && S_ISFIFO(after.st_mode));
    }
    CHECK(write_file(ro, "read only", 9));
    CHECK(chmod(ro, 0444) == 0);
    if (geteuid() != 0) {
        expect_save_refusal(s, ro, strerror(EACCES), "save onto a read-only file");
        CHECK(same_bytes(ro, "read only", 9));
    } else {
        printf("running as root: the read-only file is writable, not checked\n");
    }
    char want[128];
    snprintf(want, sizeof want, "%s%sreadonly.kvs sub", have_null ? "null.kvs " : "", have_fifo ? "pipe.kvs " : "");
    CHECK_LISTING(dir, want);
    alarm(0);
    kvgen_session_close(s);
    remove_tree(dir);
    free(sub);
    free(kept);
    free(fifo);
    free(null_link);
    free(ro);
    free(dir);
}

int main(void) {
    char *path = tu_make_model("session_file.gguf", "--seed 51 --layers 2 --embd 64 --ff 96 --heads 4 --kv-heads 2");
    char *path2 = tu_make_model("session_file2.gguf", "--seed 52 --layers 2 --embd 64 --ff 96 --heads 4 --kv-heads 2");
    CHECK(path && path2);
    if (!path || !path2) return tu_finish("test_session_file");
    kvgen_model *m = load(path), *again = load(path), *other = load(path2);
    if (m && again && other) {
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        n_vocab = info.n_vocab;
        round_trip(m, m, false, "same model handle");
        round_trip(m, again, false, "another load of the file");
        round_trip(m, again, true, "shifted session");
        round_trip(again, m, true, "shifted session, back");
        test_refusals(m, other);
        test_restore_special_files(m);
        test_restore_bounded(m);
        test_failed_save(m);
        test_save_links(m);
        test_save_refusals(m);
    }
    kvgen_model_unload(m);
    kvgen_model_unload(again);
    kvgen_model_unload(other);
    free(path);
    free(path2);
    return tu_finish("test_session_file");
}
