/* test_vk_pipeline_cache.c: kvgen's VkPipelineCache file (kvgen_model_desc.pipeline_cache_path,
 * core/vulkan/vk_pcache.c). A first load creates the folder and a file that begins with this device's
 * VkPipelineCacheHeaderVersionOne and ends with kvgen's trailer (size, FNV-1a hash); a second
 * load hands its data to vkCreatePipelineCache and does not rewrite it (nothing was compiled that
 * it lacked: same inode, mtime and bytes); "{device}" expands to vendor-device in hex. Truncated,
 * damaged, wrong-UUID, wrong-header, empty, oversized (sparse 65 MiB), non-regular (/dev/zero, a
 * FIFO, a folder) files are ignored: the load succeeds, the logits are identical to a load
 * without a cache, and a regular file is replaced by a valid one while /dev/zero, the FIFO and
 * the folder are left alone. An unwritable folder (its parent is a file; a read-only folder when
 * not root) does not fail the load. A host-owned device gets no
 * object left behind, and the reference backend ignores the field. No timings are asserted. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vulkan/vulkan.h>
#include "kvg_vk.h"
#include "testutil.h"

enum { N_PROMPT = 13, TRAILER = 24 };

static const char *g_model;
static float *g_ref; /* last-position logits of a Vulkan load without a cache */
static int g_vocab;

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

static kvgen_model *load(const char *cache, kvgen_backend backend) {
    kvgen_model_desc d = {.path = g_model, .backend = backend, .pipeline_cache_path = cache};
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvgen_model_load(&d, &m, &err);
    CHECKF(st == KVGEN_OK, "load with cache %s: %s", cache ? cache : "(none)", err.message);
    return st == KVGEN_OK ? m : NULL;
}

/* last-position logits of a fixed prompt (malloc'd) */
static float *run(kvgen_model *m) {
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    g_vocab = info.n_vocab;
    float *out = calloc((size_t)info.n_vocab, sizeof *out);
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {.n_ctx = 64};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &tu_err_));
    if (!s || !out) {
        free(out);
        return NULL;
    }
    int32_t toks[N_PROMPT];
    tu_fill_tokens(toks, N_PROMPT, 7, info.n_vocab);
    CHECK_OK(kvgen_session_prefill(s, toks, N_PROMPT, NULL, &tu_err_));
    const float *l = kvgen_session_logits(s);
    CHECK(l != NULL);
    if (l) memcpy(out, l, (size_t)info.n_vocab * sizeof *out);
    kvgen_session_close(s);
    return out;
}

static void check_logits(kvgen_model *m, const char *what) {
    float *l = run(m);
    CHECKF(l && g_ref && tu_max_diff(l, g_ref, g_vocab) == 0.0, "%s: logits differ from a load without a cache (%g)",
           what, l && g_ref ? tu_max_diff(l, g_ref, g_vocab) : -1.0);
    free(l);
    int n = kvg_vk_validation_count(kvg_vk_model_ctx(m));
    CHECKF(n == 0, "%s: %d validation messages", what, n);
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static void write_bytes(const char *path, const unsigned char *d, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECKF(f != NULL, "cannot write %s", path);
    if (!f) return;
    CHECK(fwrite(d, 1, n, f) == n);
    fclose(f);
}

/* a valid file for this device: header + trailer, what the first load wrote */
static bool file_valid(const kvg_vk_ctx *ctx, const char *path, const char *what) {
    size_t n = 0;
    unsigned char *d = (unsigned char *)tu_read_file(path, &n);
    bool ok = d && n >= 32 + TRAILER;
    CHECKF(ok, "%s: %s is missing or short (%zu bytes)", what, path, n);
    if (!ok) {
        free(d);
        return false;
    }
    size_t body = n - TRAILER;
    const unsigned char *t = d + body;
    CHECKF(get_u32(d) == 32, "%s: header length %u", what, get_u32(d));
    CHECKF(get_u32(d + 4) == VK_PIPELINE_CACHE_HEADER_VERSION_ONE, "%s: header version %u", what, get_u32(d + 4));
    CHECKF(get_u32(d + 8) == ctx->props.vendorID, "%s: vendorID %x, device %x", what, get_u32(d + 8),
           ctx->props.vendorID);
    CHECKF(get_u32(d + 12) == ctx->props.deviceID, "%s: deviceID %x, device %x", what, get_u32(d + 12),
           ctx->props.deviceID);
    CHECKF(memcmp(d + 16, ctx->props.pipelineCacheUUID, VK_UUID_SIZE) == 0, "%s: pipelineCacheUUID differs", what);
    CHECKF(memcmp(t, "kvgenPC1", 8) == 0, "%s: no trailer", what);
    CHECKF(get_u64(t + 8) == body, "%s: trailer size %llu, data %zu", what, (unsigned long long)get_u64(t + 8), body);
    CHECKF(get_u64(t + 16) == fnv1a(d, body), "%s: trailer hash differs", what);
    ok = get_u32(d) == 32 && get_u64(t + 8) == body && get_u64(t + 16) == fnv1a(d, body) &&
         memcmp(d + 16, ctx->props.pipelineCacheUUID, VK_UUID_SIZE) == 0;
    free(d);
    return ok;
}

typedef struct variant {
    const char *name;
    const char *why; /* expected in ctx->pcache.why, alternatives split by '|' (lavapipe's file is header +
                      * trailer only, so any cut is also "too short") */
    int kind;        /* 0 bytes below, 1 /dev/zero, 2 FIFO, 3 folder, 4 sparse 65 MiB */
} variant;

static bool why_matches(const char *why, const char *alternatives) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", alternatives);
    for (char *save = NULL, *a = strtok_r(buf, "|", &save); a; a = strtok_r(NULL, "|", &save))
        if (strstr(why, a)) return true;
    return false;
}

/* the good file's bytes, damaged one way */
static unsigned char *make_variant(const unsigned char *good, size_t n, const char *name, size_t *out_n) {
    unsigned char *d = malloc(n + 16);
    memcpy(d, good, n);
    size_t body = n - TRAILER;
    *out_n = n;
    if (strcmp(name, "truncated") == 0) *out_n = n - 10;
    else if (strcmp(name, "extended") == 0) {
        memcpy(d + n, "0123456789", 10);
        *out_n = n + 10;
    } else if (strcmp(name, "damaged") == 0) d[body - 1] ^= 0x40;
    else if (strcmp(name, "empty") == 0) *out_n = 0;
    else if (strcmp(name, "short") == 0) *out_n = 5;
    else if (strcmp(name, "wrong uuid") == 0 || strcmp(name, "wrong header") == 0 || strcmp(name, "wrong vendor") == 0) {
        if (strcmp(name, "wrong uuid") == 0) d[16 + 3] ^= 0x5a;
        else if (strcmp(name, "wrong header") == 0) d[0] = 31;
        else d[8] ^= 0x01;
        put_u64(d + body + 16, fnv1a(d, body)); /* a consistent trailer: only the header is wrong */
    } else if (strcmp(name, "no trailer") == 0) {
        *out_n = body; /* the raw driver data, as another program would store it */
    }
    return d;
}

static void ignored_files(const char *dir, const unsigned char *good, size_t good_n) {
    static const variant vs[] = {
        {"truncated", "trailer|too short", 0},
        {"extended", "trailer", 0},
        {"damaged", "checksum", 0},
        {"empty", "too short", 0},
        {"short", "too short", 0},
        {"wrong uuid", "pipelineCacheUUID", 0},
        {"wrong header", "header length", 0},
        {"wrong vendor", "another device", 0},
        {"no trailer", "trailer|too short", 0},
        {"/dev/zero", "not a regular file", 1},
        {"fifo", "not a regular file", 2},
        {"folder", "not a regular file", 3},
        {"oversized", "64 MiB", 4},
    };
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) {
        const variant *v = &vs[i];
#ifdef _WIN32
        if (v->kind == 1 || v->kind == 2) continue; /* no /dev/zero or FIFO there */
#endif
        char name[64];
        snprintf(name, sizeof name, "bad-%zu.bin", i);
        char *path = v->kind == 1 ? strdup("/dev/zero") : join(dir, name);
        size_t n = 0;
        if (v->kind == 0) {
            unsigned char *d = make_variant(good, good_n, v->name, &n);
            write_bytes(path, d, n);
            free(d);
#ifndef _WIN32
        } else if (v->kind == 2) {
            CHECKF(mkfifo(path, 0600) == 0, "mkfifo %s: %s", path, strerror(errno));
#endif
        } else if (v->kind == 3) {
            CHECKF(mkdir(path, 0700) == 0, "mkdir %s: %s", path, strerror(errno));
        } else if (v->kind == 4) {
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            CHECK(fd >= 0);
            if (fd >= 0) {
                CHECK(write(fd, good, 32) == 32); /* a plausible header, then a hole */
                CHECK(ftruncate(fd, (off_t)65 << 20) == 0);
                close(fd);
            }
        }
        kvgen_model *m = load(path, KVGEN_BACKEND_VULKAN);
        if (m) {
            const kvg_vk_ctx *ctx = kvg_vk_model_ctx(m);
            CHECKF(ctx->pcache.state == KVG_VK_PCACHE_IGNORED, "%s: state %d, expected ignored", v->name,
                   ctx->pcache.state);
            CHECKF(why_matches(ctx->pcache.why, v->why), "%s: why '%s', expected '%s'", v->name, ctx->pcache.why,
                   v->why);
            CHECKF(ctx->pcache.loaded_bytes == 0, "%s: %zu bytes handed to the driver", v->name,
                   ctx->pcache.loaded_bytes);
            CHECKF(ctx->pcache.cache != VK_NULL_HANDLE, "%s: no cache object (it should start empty)", v->name);
            /* regular files are replaced by a valid one; anything else is left alone */
            CHECKF(ctx->pcache.writes == (v->kind == 0 || v->kind == 4 ? 1 : 0), "%s: %d writes", v->name,
                   ctx->pcache.writes);
            check_logits(m, v->name);
            if (v->kind == 0 || v->kind == 4) file_valid(ctx, path, v->name);
            kvgen_model_unload(m);
        }
        struct stat st;
        if (v->kind == 1) CHECK(stat(path, &st) == 0 && S_ISCHR(st.st_mode));
        if (v->kind == 2) CHECK(stat(path, &st) == 0 && S_ISFIFO(st.st_mode));
        if (v->kind == 3) CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode));
        if (v->kind == 3) rmdir(path);
        else if (v->kind != 1) unlink(path);
        free(path);
    }
}

/* ---- a host-owned device: the cache object is destroyed with kvgen's other objects ---- */

static int g_host_messages;

static VKAPI_ATTR VkBool32 VKAPI_CALL host_callback(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                    VkDebugUtilsMessageTypeFlagsEXT types,
                                                    const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
    (void)types;
    (void)user;
    if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
        g_host_messages++;
        fprintf(stderr, "host validation: %s\n", data && data->pMessage ? data->pMessage : "(none)");
    }
    return VK_FALSE;
}

static void host_device(const char *cache) {
    const char *v = getenv("KVGEN_VALIDATE");
    bool validate = v && strcmp(v, "1") == 0;
    VkDebugUtilsMessengerCreateInfoEXT dbg = {
        .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
        .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
        .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT,
        .pfnUserCallback = host_callback};
    const char *layers[] = {"VK_LAYER_KHRONOS_validation"};
    const char *exts[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME};
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .apiVersion = VK_API_VERSION_1_1};
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                               .pNext = validate ? &dbg : NULL,
                               .pApplicationInfo = &app,
                               .enabledLayerCount = validate ? 1 : 0,
                               .ppEnabledLayerNames = layers,
                               .enabledExtensionCount = validate ? 1 : 0,
                               .ppEnabledExtensionNames = exts};
    VkInstance inst = VK_NULL_HANDLE;
    CHECK(kvg_vk_load(NULL, NULL) == KVGEN_OK); /* the host uses kvgen's run-time Vulkan loader */
    if (!vkGetInstanceProcAddr) return;
    CHECK(vkCreateInstance(&ci, NULL, &inst) == VK_SUCCESS);
    if (!inst) return;
    CHECK(kvg_vk_load_instance(inst, NULL) == KVGEN_OK);
    VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
    if (validate) {
        PFN_vkCreateDebugUtilsMessengerEXT create =
            (PFN_vkCreateDebugUtilsMessengerEXT)vkGetInstanceProcAddr(inst, "vkCreateDebugUtilsMessengerEXT");
        if (create) CHECK(create(inst, &dbg, NULL, &messenger) == VK_SUCCESS);
    }
    uint32_t n = 16;
    VkPhysicalDevice pds[16], pd = VK_NULL_HANDLE;
    vkEnumeratePhysicalDevices(inst, &n, pds);
    for (uint32_t i = 0; i < n && !pd; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(pds[i], &p);
        if (p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU) pd = pds[i];
    }
    CHECK(pd != VK_NULL_HANDLE);
    uint32_t nq = 16, family = UINT32_MAX;
    VkQueueFamilyProperties qf[16];
    if (pd) vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, qf);
    for (uint32_t i = 0; pd && i < nq && family == UINT32_MAX; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) family = i;
    float prio = 1.0f;
    VkDeviceQueueCreateInfo q = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                 .queueFamilyIndex = family,
                                 .queueCount = 1,
                                 .pQueuePriorities = &prio};
    VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1,
                             .pQueueCreateInfos = &q};
    VkDevice dev = VK_NULL_HANDLE;
    if (family != UINT32_MAX) CHECK(vkCreateDevice(pd, &di, NULL, &dev) == VK_SUCCESS);
    if (dev) {
        VkQueue queue;
        vkGetDeviceQueue(dev, family, 0, &queue);
        kvgen_model_desc d = {.path = g_model, .backend = KVGEN_BACKEND_VULKAN, .pipeline_cache_path = cache,
                              .vk_instance = inst, .vk_physical_device = pd, .vk_device = dev, .vk_queue = queue,
                              .vk_queue_family = family};
        kvgen_model *m = NULL;
        kvgen_error err = {0};
        CHECKF(kvgen_model_load(&d, &m, &err) == KVGEN_OK, "host device: %s", err.message);
        if (m) {
            const kvg_vk_ctx *ctx = kvg_vk_model_ctx(m);
            CHECKF(ctx->pcache.state == KVG_VK_PCACHE_LOADED, "host device: state %d", ctx->pcache.state);
            float *l = run(m);
            CHECKF(l && g_ref && tu_max_diff(l, g_ref, g_vocab) == 0.0, "host device: logits differ");
            free(l);
            kvgen_model_unload(m);
        }
        vkDeviceWaitIdle(dev);
        vkDestroyDevice(dev, NULL); /* validation reports a pipeline cache kvgen left on it */
    }
    if (messenger) {
        PFN_vkDestroyDebugUtilsMessengerEXT destroy =
            (PFN_vkDestroyDebugUtilsMessengerEXT)vkGetInstanceProcAddr(inst, "vkDestroyDebugUtilsMessengerEXT");
        if (destroy) destroy(inst, messenger, NULL);
    }
    vkDestroyInstance(inst, NULL);
    CHECKF(g_host_messages == 0, "host device: the host's validation layer reported %d messages", g_host_messages);
}

/* the same file, not written since: inode and time to the nanosecond; on Windows (no inode
 * numbers, times in whole seconds) size and time, so a rewrite within the second goes unseen
 * there, and the pcache.writes counters checked beside this one still tell */
static bool same_file(const struct stat *a, const struct stat *b) {
#ifdef _WIN32
    return a->st_size == b->st_size && a->st_mtime == b->st_mtime;
#else
    return a->st_ino == b->st_ino && a->st_size == b->st_size && a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
           a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
#endif
}

int main(void) {
    g_model = tu_make_model("pcache.gguf", "--seed 41 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2 --type Q4_1");
    if (!g_model) tu_skip("kvgen-mkmodel failed");
    char dir[512];
    char *base = tu_tmpfile("pcache");
    snprintf(dir, sizeof dir, "%s-%ld", base, (long)getpid());
    free(base);
    mkdir(dir, 0700);

    /* the oracle: no cache at all */
    kvgen_model *m = load(NULL, KVGEN_BACKEND_VULKAN);
    if (!m) return tu_finish("test_vk_pipeline_cache");
    const kvg_vk_ctx *ctx = kvg_vk_model_ctx(m);
    if (!ctx) {
        kvgen_model_unload(m);
        tu_skip("the model did not load on the Vulkan backend");
    }
    CHECK(ctx->pcache.state == KVG_VK_PCACHE_OFF && ctx->pcache.cache == VK_NULL_HANDLE && !ctx->pcache.path);
    g_ref = run(m);
    char devname[32];
    snprintf(devname, sizeof devname, "%04x-%04x", (unsigned)ctx->props.vendorID, (unsigned)ctx->props.deviceID);
    kvgen_model_unload(m);

    /* first load: two missing folder levels are created, {device} expands, the file is written at load */
    char *tmpl = join(dir, "new/sub/pipelines-{device}.bin");
    char fname[64];
    snprintf(fname, sizeof fname, "new/sub/pipelines-%s.bin", devname);
    char *path = join(dir, fname);
    m = load(tmpl, KVGEN_BACKEND_VULKAN);
    struct stat st1 = {0}, st2 = {0}, st3 = {0};
    if (m) {
        ctx = kvg_vk_model_ctx(m);
        CHECKF(ctx->pcache.state == KVG_VK_PCACHE_ABSENT, "first load: state %d", ctx->pcache.state);
        CHECKF(ctx->pcache.path && strcmp(ctx->pcache.path, path) == 0, "first load: path %s, expected %s",
               ctx->pcache.path ? ctx->pcache.path : "(null)", path);
        CHECKF(ctx->pcache.writes == 1, "first load: %d writes by the end of the load", ctx->pcache.writes);
        CHECK(file_valid(ctx, path, "first load"));
        CHECK(stat(path, &st1) == 0);
        check_logits(m, "first load");
        kvgen_model_unload(m);
        CHECK(stat(path, &st2) == 0);
        CHECKF(same_file(&st1, &st2), "first load: the file was written again at unload");
    }
    size_t good_n = 0;
    unsigned char *good = (unsigned char *)tu_read_file(path, &good_n);
    CHECK(good != NULL);

    /* second load: the file's data goes to the driver, and the file is not rewritten */
    m = load(tmpl, KVGEN_BACKEND_VULKAN);
    if (m) {
        ctx = kvg_vk_model_ctx(m);
        CHECKF(ctx->pcache.state == KVG_VK_PCACHE_LOADED, "second load: state %d (%s)", ctx->pcache.state,
               ctx->pcache.why);
        CHECKF(ctx->pcache.loaded_bytes + TRAILER == good_n, "second load: %zu bytes handed to the driver, file %zu",
               ctx->pcache.loaded_bytes, good_n);
        CHECKF(ctx->pcache.writes == 0, "second load: %d writes", ctx->pcache.writes);
        check_logits(m, "second load");
        kvgen_model_unload(m);
    }
    CHECK(stat(path, &st3) == 0);
    CHECKF(same_file(&st1, &st3), "second load: the file was rewritten although nothing new was compiled");
    size_t again_n = 0;
    char *again = tu_read_file(path, &again_n);
    CHECK(again && good && again_n == good_n && memcmp(again, good, good_n) == 0);
    free(again);

    if (good && good_n >= 32 + TRAILER) ignored_files(dir, good, good_n);

    /* unwritable: the folder's parent is a regular file; the load goes on without writing */
    char *file = join(dir, "plainfile");
    write_bytes(file, (const unsigned char *)"x", 1);
    char *under = join(file, "sub/pipelines.bin");
    m = load(under, KVGEN_BACKEND_VULKAN);
    if (m) {
        ctx = kvg_vk_model_ctx(m);
        CHECKF(ctx->pcache.writes == 0, "unwritable: %d writes", ctx->pcache.writes);
        CHECK(ctx->pcache.cache != VK_NULL_HANDLE);
        check_logits(m, "unwritable folder");
        kvgen_model_unload(m);
    }
    free(under);
#ifdef _WIN32
    if (0) { /* a folder's read-only attribute does not stop new files on Windows */
#else
    if (geteuid() != 0) { /* root writes anywhere: a read-only folder only stops others */
#endif
        char *ro = join(dir, "readonly");
        mkdir(ro, 0500);
        char *p = join(ro, "pipelines.bin");
        m = load(p, KVGEN_BACKEND_VULKAN);
        if (m) {
            CHECK(kvg_vk_model_ctx(m)->pcache.writes == 0);
            check_logits(m, "read-only folder");
            kvgen_model_unload(m);
        }
        CHECK(access(p, F_OK) != 0);
        free(p);
        rmdir(ro);
        free(ro);
    }

    /* a host-owned device reuses the file and is left with nothing of kvgen's */
    host_device(path);

    /* the reference backend ignores the field */
    char *rpath = join(dir, "ref/pipelines.bin");
    m = load(rpath, KVGEN_BACKEND_REFERENCE);
    if (m) {
        CHECK(kvg_vk_model_ctx(m) == NULL);
        kvgen_model_unload(m);
    }
    CHECKF(access(rpath, F_OK) != 0, "the reference backend wrote %s", rpath);

    unlink(path);
    unlink(file);
    char *d1 = join(dir, "new/sub"), *d2 = join(dir, "new");
    rmdir(d1);
    rmdir(d2);
    rmdir(dir);
    free(d1);
    free(d2);
    free(rpath);
    free(file);
    free(good);
    free(path);
    free(tmpl);
    free(g_ref);
    return tu_finish("test_vk_pipeline_cache");
}
