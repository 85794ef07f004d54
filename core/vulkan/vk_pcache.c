/* vk_pcache.c: kvgen's own VkPipelineCache, persisted to a file the host names
 * (kvgen_model_desc.pipeline_cache_path), so that a later load does not compile the shaders
 * again on drivers whose pipeline cache holds compiled code.
 *
 * File: the driver's vkGetPipelineCacheData bytes as they are (they begin with a
 * VkPipelineCacheHeaderVersionOne), then a 24-byte trailer: "kvgenPC1", the driver data's
 * size and its FNV-1a 64 hash (both u64, little-endian). At load the file is handed to
 * vkCreatePipelineCache only when it is a regular file of at most KVG_VK_PCACHE_MAX bytes, the
 * trailer matches (so a truncated or damaged file is never given to the driver) and the header
 * names this device (header size 32, version one, vendorID, deviceID, pipelineCacheUUID).
 * Anything else is ignored with a one-line warning to the logger and the cache starts empty: a cache
 * never makes a load fail. The file is written back (temp file in the same folder, fsync,
 * rename) when pipelines were created and the driver's data differs from what the file holds;
 * write failures are only reported to the logger. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_platform.h"
#include "kvg_vk.h"

#define TRAILER_BYTES 24
#define HEADER_BYTES 32
static const char trailer_magic[8] = {'k', 'v', 'g', 'e', 'n', 'P', 'C', '1'};

#if defined(__GNUC__) && !defined(__MINGW32__)
__attribute__((format(printf, 2, 3)))
#endif
static void note(const kvg_vk_ctx *ctx, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kvg_log(KVGEN_LOG_WARNING, "vulkan pipeline cache %s: %s", ctx->pcache.path ? ctx->pcache.path : "?", msg);
}

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const unsigned char *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* NULL when the driver data's header (VkPipelineCacheHeaderVersionOne, least significant byte
 * first whatever the host's order) is this device's, else why not */
static const char *header_mismatch(const kvg_vk_ctx *ctx, const unsigned char *d, size_t n) {
    if (n < HEADER_BYTES) return "shorter than a pipeline cache header";
    if (get_u32(d) != HEADER_BYTES) return "header length is not 32";
    if (get_u32(d + 4) != VK_PIPELINE_CACHE_HEADER_VERSION_ONE) return "header version is not one";
    if (get_u32(d + 8) != ctx->props.vendorID || get_u32(d + 12) != ctx->props.deviceID)
        return "made for another device (vendorID/deviceID)";
    if (memcmp(d + 16, ctx->props.pipelineCacheUUID, VK_UUID_SIZE) != 0)
        return "made by another driver version (pipelineCacheUUID)";
    return NULL;
}

/* "{device}" -> vendorID-deviceID in hex, so one path serves several devices */
static char *expand_path(const char *path, const VkPhysicalDeviceProperties *p) {
    static const char key[] = "{device}";
    char dev[32];
    snprintf(dev, sizeof dev, "%04x-%04x", (unsigned)p->vendorID, (unsigned)p->deviceID);
    size_t n = 0, klen = sizeof key - 1, dlen = strlen(dev);
    for (const char *s = strstr(path, key); s; s = strstr(s + klen, key)) n++;
    size_t len = strlen(path) + n * dlen + 1;
    char *out = kvg_malloc(len), *o = out;
    if (!out) return NULL;
    for (const char *s = path;;) {
        const char *k = strstr(s, key);
        size_t run = k ? (size_t)(k - s) : strlen(s);
        memcpy(o, s, run);
        o += run;
        if (!k) break;
        memcpy(o, dev, dlen);
        o += dlen;
        s = k + klen;
    }
    *o = '\0';
    return out;
}

/* The file's driver data (malloc'd) when it may be given to vkCreatePipelineCache; NULL with
 * *why set when it may not (why NULL: there is no file). */
static unsigned char *read_file(const kvg_vk_ctx *ctx, size_t *size, const char **why) {
    *why = NULL;
    *size = 0;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; fstat refuses it just after */
    int fd = kvg_open(ctx->pcache.path, O_RDONLY | O_NONBLOCK, 0);
    if (fd < 0) {
        if (errno != ENOENT) *why = strerror(errno);
        return NULL;
    }
    kvg_stat_t st;
    unsigned char *buf = NULL;
    if (kvg_fstat(fd, &st) != 0) *why = strerror(errno);
    else if (!S_ISREG(st.st_mode)) *why = "not a regular file";
    else if (st.st_size < HEADER_BYTES + TRAILER_BYTES) *why = "too short";
    else if ((uint64_t)st.st_size > KVG_VK_PCACHE_MAX) *why = "larger than the 64 MiB kvgen reads";
    else if (!(buf = kvg_malloc((size_t)st.st_size))) *why = "out of memory";
    size_t want = buf ? (size_t)st.st_size : 0, got = 0;
    while (got < want) {
        ssize_t r = read(fd, buf + got, want - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (!buf) return NULL;
    const unsigned char *t = buf + want - TRAILER_BYTES;
    size_t n = want - TRAILER_BYTES;
    if (got != want) *why = "short read";
    else if (memcmp(t, trailer_magic, sizeof trailer_magic) != 0) *why = "not a kvgen pipeline cache (no trailer)";
    else if (get_u64(t + 8) != n) *why = "truncated or extended (size in the trailer differs)";
    else if (get_u64(t + 16) != fnv1a(buf, n)) *why = "damaged (checksum differs)";
    else *why = header_mismatch(ctx, buf, n);
    if (*why) {
        kvg_free(buf);
        return NULL;
    }
    *size = n;
    return buf;
}

void kvg_vk_pcache_open(kvg_vk_ctx *ctx, const char *path) {
    ctx->pcache.state = KVG_VK_PCACHE_OFF;
    if (!path || !*path) return;
    ctx->pcache.path = expand_path(path, &ctx->props);
    if (!ctx->pcache.path) return;
    const char *why = NULL;
    size_t n = 0;
    unsigned char *data = read_file(ctx, &n, &why);
    VkPipelineCacheCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO,
                                    .initialDataSize = n,
                                    .pInitialData = data};
    VkResult r = VK_ERROR_UNKNOWN;
    if (data) {
        r = vkCreatePipelineCache(ctx->dev, &ci, NULL, &ctx->pcache.cache);
        if (r == VK_SUCCESS) {
            ctx->pcache.state = KVG_VK_PCACHE_LOADED;
            ctx->pcache.loaded_bytes = n;
            ctx->pcache.file_bytes = n;
            ctx->pcache.file_hash = fnv1a(data, n);
        } else {
            why = "the driver refused its data";
        }
    }
    kvg_free(data);
    if (r != VK_SUCCESS) {
        ctx->pcache.cache = VK_NULL_HANDLE;
        ctx->pcache.state = why ? KVG_VK_PCACHE_IGNORED : KVG_VK_PCACHE_ABSENT;
        if (why) {
            snprintf(ctx->pcache.why, sizeof ctx->pcache.why, "%s", why);
            note(ctx, "ignored (%s); starting with an empty cache", why);
        }
        ci.initialDataSize = 0;
        ci.pInitialData = NULL;
        r = vkCreatePipelineCache(ctx->dev, &ci, NULL, &ctx->pcache.cache);
        if (r != VK_SUCCESS) {
            ctx->pcache.cache = VK_NULL_HANDLE;
            note(ctx, "vkCreatePipelineCache failed (%s); running without one", kvg_vk_result_name(r));
        }
    }
}

/* mkdir -p of the folder holding path (0700, as the XDG base directory spec asks) */
static int make_parent(char *path) {
    char *slash = (char *)kvg_path_last_sep(path);
    if (!slash || slash == path) return 0;
    char sep = *slash;
    *slash = '\0';
    kvg_stat_t st;
    int rc = 0;
    if (kvg_stat(path, &st) != 0) {
        rc = make_parent(path);
        if (rc == 0 && kvg_mkdir(path, 0700) != 0 && errno != EEXIST) rc = -1;
    } else if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        rc = -1;
    }
    *slash = sep;
    return rc;
}

static int write_all(int fd, const unsigned char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* temp file next to the target, fsync, rename over it, fsync the folder; NULL or why not
 * (*eno: the errno behind it, 0 for none) */
static const char *write_atomic(const kvg_vk_ctx *ctx, const unsigned char *data, size_t n, int *eno) {
    const char *path = ctx->pcache.path;
    kvg_stat_t st;
    *eno = 0;
    if (kvg_stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return "it exists and is not a regular file";
    size_t len = strlen(path);
    char *tmp = kvg_malloc(len + 16);
    if (!tmp) return "out of memory";
    memcpy(tmp, path, len);
    memcpy(tmp + len, ".tmp-XXXXXX", 12);
    if (make_parent(tmp) != 0) {
        *eno = errno;
        kvg_free(tmp);
        return "cannot create its folder";
    }
    int fd = kvg_mkstemp(tmp);
    if (fd < 0) {
        *eno = errno;
        kvg_free(tmp);
        return "cannot create a temporary file in its folder";
    }
    unsigned char trailer[TRAILER_BYTES];
    memcpy(trailer, trailer_magic, sizeof trailer_magic);
    put_u64(trailer + 8, n);
    put_u64(trailer + 16, fnv1a(data, n));
    const char *why = NULL;
    if (write_all(fd, data, n) != 0 || write_all(fd, trailer, sizeof trailer) != 0) why = "write failed";
    else if (kvg_fsync(fd) != 0) why = "fsync failed";
    if (why) *eno = errno;
    if (close(fd) != 0 && !why) {
        why = "close failed";
        *eno = errno;
    }
    if (!why && kvg_rename_replace(tmp, path) != 0) {
        why = "rename failed";
        *eno = errno;
    }
    if (why) {
        kvg_remove(tmp);
    } else {
        char *slash = (char *)kvg_path_last_sep(tmp);
        if (slash) slash[slash == tmp] = '\0';
        (void)kvg_sync_folder(slash ? tmp : "."); /* makes the rename itself durable; best effort */
    }
    kvg_free(tmp);
    return why;
}

void kvg_vk_pcache_save(kvg_vk_ctx *ctx) {
    if (!ctx->pcache.cache || !ctx->pcache.path || ctx->pcache.created == 0) return;
    ctx->pcache.created = 0; /* tried once: a failing folder is not tried again at unload */
    unsigned char *data = NULL;
    size_t n = 0;
    const char *why = NULL;
    VkResult r = VK_INCOMPLETE;
    for (int tries = 0; tries < 4 && r == VK_INCOMPLETE; tries++) { /* VK_INCOMPLETE: it grew meanwhile */
        kvg_free(data);
        data = NULL;
        r = vkGetPipelineCacheData(ctx->dev, ctx->pcache.cache, &n, NULL);
        if (r != VK_SUCCESS) break;
        if (n > KVG_VK_PCACHE_MAX - TRAILER_BYTES) {
            why = "the driver's data is larger than 64 MiB";
            break;
        }
        if (!(data = kvg_malloc(n ? n : 1))) {
            why = "out of memory";
            break;
        }
        r = vkGetPipelineCacheData(ctx->dev, ctx->pcache.cache, &n, data);
    }
    if (!why && r != VK_SUCCESS) why = kvg_vk_result_name(r);
    if (!why) why = header_mismatch(ctx, data, n);
    int eno = 0;
    if (why) {
        note(ctx, "not written (%s)", why);
    } else if (n == ctx->pcache.file_bytes && fnv1a(data, n) == ctx->pcache.file_hash) {
        /* the file already holds exactly this: nothing was compiled that it lacked */
    } else if ((why = write_atomic(ctx, data, n, &eno)) != NULL) {
        note(ctx, "not written (%s%s%s)", why, eno ? ": " : "", eno ? strerror(eno) : "");
    } else {
        ctx->pcache.file_bytes = n;
        ctx->pcache.file_hash = fnv1a(data, n);
        ctx->pcache.writes++;
    }
    kvg_free(data);
}

void kvg_vk_pcache_close(kvg_vk_ctx *ctx) {
    if (ctx->dev && ctx->pcache.cache) {
        kvg_vk_pcache_save(ctx);
        vkDestroyPipelineCache(ctx->dev, ctx->pcache.cache, NULL);
    }
    ctx->pcache.cache = VK_NULL_HANDLE;
    kvg_free(ctx->pcache.path);
    ctx->pcache.path = NULL;
}
