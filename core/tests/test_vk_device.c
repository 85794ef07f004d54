/* test_vk_device.c: the Vulkan device corners. A host-owned instance/device/compute queue (a
 * game's) handed to kvgen: same logits as a kvgen-owned device, kvgen destroys neither, leaks no
 * child object on it (the host's own validation messenger sees vkDestroyDevice), and a bad queue
 * family or partial handles fail cleanly. Forced staging uploads (KVGEN_VK_STAGING=1) and the
 * forced-f32 KV cache (option and KVGEN_FORCE_F32=1) against the reference backend. Device
 * selection by index, name substring (option and KVGEN_DEVICE) and a name that matches nothing;
 * kvgen_devices' fields for lavapipe. Every kvgen context must report 0 validation messages
 * (KVGEN_VALIDATE=1), and so must the host's own messenger.
 * Tolerance as in test_vk_model: |vulkan - reference| <= rel * (2 + max|logit|), rel 0.01 with
 * the f16 cache, 0.002 with f32; the same device through host or kvgen handles: identical. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <vulkan/vulkan.h>
#include "kvg_vk.h"
#include "testutil.h"

enum { N_PROMPT = 21, N_DECODE = 8 };

typedef struct host_vk {
    VkInstance inst;
    VkDebugUtilsMessengerEXT messenger;
    VkPhysicalDevice pd;
    VkDevice dev;
    VkQueue queue;
    uint32_t family;
    int messages; /* warnings and errors the host's validation layer reported */
} host_vk;

static VKAPI_ATTR VkBool32 VKAPI_CALL host_callback(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                    VkDebugUtilsMessageTypeFlagsEXT types,
                                                    const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
    (void)types;
    if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
        ((host_vk *)user)->messages++;
        fprintf(stderr, "host validation: %s\n", data && data->pMessage ? data->pMessage : "(none)");
    }
    return VK_FALSE;
}

static bool env_on(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* What a game does: its own instance (with validation when the suite runs with it), lavapipe,
 * a device with a compute queue and none of the optional features (kvgen documents it needs none). */
static bool host_create(host_vk *h) {
    memset(h, 0, sizeof *h);
    bool validate = env_on("KVGEN_VALIDATE");
    VkDebugUtilsMessengerCreateInfoEXT dbg = {
        .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
        .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
        .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
        .pfnUserCallback = host_callback,
        .pUserData = h};
    /* with synchronization validation, as kvgen's own instance under KVGEN_VALIDATE=1 */
    VkValidationFeatureEnableEXT sync = VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT;
    VkValidationFeaturesEXT vf = {.sType = VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT,
                                  .enabledValidationFeatureCount = 1,
                                  .pEnabledValidationFeatures = &sync};
    dbg.pNext = &vf;
    const char *layers[] = {"VK_LAYER_KHRONOS_validation"};
    const char *exts[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME, VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME};
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                             .pApplicationName = "test_vk_device host",
                             .apiVersion = VK_API_VERSION_1_1};
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                               .pNext = validate ? &dbg : NULL,
                               .pApplicationInfo = &app,
                               .enabledLayerCount = validate ? 1 : 0,
                               .ppEnabledLayerNames = layers,
                               .enabledExtensionCount = validate ? 2 : 0,
                               .ppEnabledExtensionNames = exts};
    /* the host reaches Vulkan through kvgen's own run-time loader (libkvgen links no libvulkan)
     * and hands kvgen its vkGetInstanceProcAddr as a host with its own loader would */
    kvgen_error lerr = {0};
    CHECKF(kvg_vk_load(NULL, &lerr) == KVGEN_OK, "kvg_vk_load: %s", lerr.message);
    if (!vkGetInstanceProcAddr) return false;
    VkResult r = vkCreateInstance(&ci, NULL, &h->inst);
    CHECKF(r == VK_SUCCESS, "host vkCreateInstance: %d", (int)r);
    if (r != VK_SUCCESS) return false;
    CHECKF(kvg_vk_load_instance(h->inst, &lerr) == KVGEN_OK, "kvg_vk_load_instance: %s", lerr.message);
    if (validate) {
        PFN_vkCreateDebugUtilsMessengerEXT create =
            (PFN_vkCreateDebugUtilsMessengerEXT)vkGetInstanceProcAddr(h->inst, "vkCreateDebugUtilsMessengerEXT");
        CHECK(create != NULL);
        dbg.pNext = NULL; /* the validation features belong to the instance */
        if (create) CHECK(create(h->inst, &dbg, NULL, &h->messenger) == VK_SUCCESS);
    }
    uint32_t n = 0;
    vkEnumeratePhysicalDevices(h->inst, &n, NULL);
    VkPhysicalDevice pds[16];
    if (n > 16) n = 16;
    vkEnumeratePhysicalDevices(h->inst, &n, pds);
    for (uint32_t i = 0; i < n && !h->pd; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(pds[i], &p);
        if (p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU) h->pd = pds[i];
    }
    CHECKF(h->pd != NULL, "no CPU (lavapipe) device among %u", n);
    if (!h->pd) return false;
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(h->pd, &nq, NULL);
    VkQueueFamilyProperties qf[16];
    if (nq > 16) nq = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(h->pd, &nq, qf);
    h->family = UINT32_MAX;
    for (uint32_t i = 0; i < nq && h->family == UINT32_MAX; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) h->family = i;
    CHECK(h->family != UINT32_MAX);
    if (h->family == UINT32_MAX) return false;
    float prio = 1.0f;
    VkDeviceQueueCreateInfo q = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                 .queueFamilyIndex = h->family,
                                 .queueCount = 1,
                                 .pQueuePriorities = &prio};
    VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                             .queueCreateInfoCount = 1,
                             .pQueueCreateInfos = &q};
    r = vkCreateDevice(h->pd, &di, NULL, &h->dev);
    CHECKF(r == VK_SUCCESS, "host vkCreateDevice: %d", (int)r);
    if (r != VK_SUCCESS) return false;
    vkGetDeviceQueue(h->dev, h->family, 0, &h->queue);
    if (validate) {
        /* the messenger really counts: a zero-sized buffer is invalid usage (the layer blocks the call) */
        VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                                 .size = 0,
                                 .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                                 .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
        VkBuffer buf = VK_NULL_HANDLE;
        vkCreateBuffer(h->dev, &bi, NULL, &buf);
        CHECKF(h->messages >= 1, "the host's validation layer is not active");
        if (buf) vkDestroyBuffer(h->dev, buf, NULL);
        h->messages = 0;
    }
    return true;
}

/* The host still owns working handles after kvgen let go: a buffer with memory, and an empty
 * submission on the queue kvgen used. */
static void host_use(host_vk *h) {
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                             .size = 4096,
                             .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkBuffer buf = VK_NULL_HANDLE;
    CHECK(vkCreateBuffer(h->dev, &bi, NULL, &buf) == VK_SUCCESS);
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(h->dev, buf, &req);
    uint32_t type = 0;
    while (type < 32 && !(req.memoryTypeBits & (1u << type))) type++;
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                               .allocationSize = req.size,
                               .memoryTypeIndex = type};
    VkDeviceMemory mem = VK_NULL_HANDLE;
    CHECK(vkAllocateMemory(h->dev, &ai, NULL, &mem) == VK_SUCCESS);
    CHECK(vkBindBufferMemory(h->dev, buf, mem, 0) == VK_SUCCESS);
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO};
    CHECK(vkQueueSubmit(h->queue, 1, &si, VK_NULL_HANDLE) == VK_SUCCESS);
    CHECK(vkQueueWaitIdle(h->queue) == VK_SUCCESS);
    vkDestroyBuffer(h->dev, buf, NULL);
    vkFreeMemory(h->dev, mem, NULL);
}

static void host_destroy(host_vk *h) {
    if (h->dev) {
        CHECK(vkDeviceWaitIdle(h->dev) == VK_SUCCESS);
        vkDestroyDevice(h->dev, NULL); /* validation reports any object kvgen left on it */
    }
    if (h->messenger) {
        PFN_vkDestroyDebugUtilsMessengerEXT destroy =
            (PFN_vkDestroyDebugUtilsMessengerEXT)vkGetInstanceProcAddr(h->inst, "vkDestroyDebugUtilsMessengerEXT");
        if (destroy) destroy(h->inst, h->messenger, NULL);
    }
    if (h->inst) vkDestroyInstance(h->inst, NULL);
    CHECKF(h->messages == 0, "the host's validation layer reported %d messages", h->messages);
}

static kvgen_model *load(const kvgen_model_desc *base, kvgen_backend backend, kvgen_error *err) {
    kvgen_model_desc d = *base;
    d.backend = backend;
    kvgen_model *m = NULL;
    kvgen_status st = kvgen_model_load(&d, &m, err);
    if (st != KVGEN_OK) m = NULL;
    return m;
}

static kvgen_model *load_ok(const kvgen_model_desc *base, kvgen_backend backend, const char *what) {
    kvgen_error err = {0};
    kvgen_model *m = load(base, backend, &err);
    CHECKF(m != NULL, "%s: %s", what, err.message);
    return m;
}

/* the logits of a prefill (last position) and N_DECODE greedy-by-reference steps: (1 + N_DECODE) x V */
static float *run(kvgen_model *m, const int32_t *forced) {
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    size_t V = (size_t)info.n_vocab;
    float *out = calloc((N_DECODE + 1) * V, sizeof *out);
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {.n_ctx = 64};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &tu_err_));
    if (!s || !out) {
        free(out);
        return NULL;
    }
    int32_t toks[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) toks[i] = (int32_t)((i * 7919 + 5) % info.n_vocab);
    CHECK_OK(kvgen_session_prefill(s, toks, N_PROMPT, NULL, &tu_err_));
    const float *l = kvgen_session_logits(s);
    if (l) memcpy(out, l, V * sizeof *out);
    for (int k = 0; k < N_DECODE && l; k++) {
        CHECK_OK(kvgen_session_decode(s, forced[k], &tu_err_));
        l = kvgen_session_logits(s);
        if (l) memcpy(out + (size_t)(k + 1) * V, l, V * sizeof *out);
    }
    CHECK(l != NULL);
    kvgen_session_close(s);
    return out;
}

/* worst |a-b| relative to rel * (2 + max|b|): <= 1 passes (NaN fails) */
static double excess(const float *a, const float *b, size_t n, double rel) {
    double mx = 0, worst = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(b[i]) > mx) mx = fabs(b[i]);
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (rel * (2.0 + mx));
        if (!(d <= worst)) worst = d;
    }
    return worst;
}

static void check_validation(kvgen_model *m, const char *what) {
    int n = kvg_vk_validation_count(kvg_vk_model_ctx(m));
    CHECKF(n == 0, "%s: %d validation messages", what, n);
}

static bool device_is_lavapipe(kvgen_model *m) {
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    return strcmp(info.backend, "vulkan") == 0 && info.device && strstr(info.device, "llvmpipe") != NULL;
}

/* a model on the Vulkan backend compared with the reference's logits */
static void compare_vulkan(const kvgen_model_desc *d, const float *ref, const int32_t *forced, size_t n, double rel,
                           const char *what, float **keep) {
    kvgen_model *m = load_ok(d, KVGEN_BACKEND_VULKAN, what);
    if (!m) return;
    float *l = run(m, forced);
    if (l) {
        double e = excess(l, ref, n, rel);
        CHECKF(e <= 1.0, "%s: logits off by %.2f x tolerance", what, e);
    }
    check_validation(m, what);
    kvgen_model_unload(m);
    if (keep) *keep = l;
    else free(l);
}

static void host_device(const char *path, const float *owned, const float *ref, const int32_t *forced, size_t n) {
    host_vk h;
    if (!host_create(&h)) {
        host_destroy(&h);
        return;
    }
    kvgen_model_desc d = {.path = path,
                          .vk_instance = h.inst,
                          .vk_physical_device = h.pd,
                          .vk_device = h.dev,
                          .vk_queue = h.queue,
                          .vk_queue_family = h.family,
                          .vk_get_instance_proc_addr = (kvgen_vk_get_instance_proc_addr)vkGetInstanceProcAddr};
    kvgen_model *m = load_ok(&d, KVGEN_BACKEND_VULKAN, "host device");
    if (m) {
        CHECK(device_is_lavapipe(m));
        kvg_vk_ctx *ctx = kvg_vk_model_ctx(m);
        CHECK(ctx && !ctx->own_device && !ctx->own_instance && ctx->dev == h.dev);
        float *l = run(m, forced);
        if (l && owned) CHECKF(memcmp(l, owned, n * sizeof *l) == 0, "host device: logits differ from kvgen's device");
        if (l) CHECKF(excess(l, ref, n, 0.01) <= 1.0, "host device: logits off the reference");
        free(l);
        kvgen_model_unload(m);
    }
    /* a second model on the same host device while the first is gone: kvgen kept nothing global */
    m = load_ok(&d, KVGEN_BACKEND_VULKAN, "host device, second load");
    kvgen_model_unload(m);
    host_use(&h);

    /* a family that does not exist, and handles given in part: clean errors, nothing created */
    kvgen_error err = {0};
    kvgen_model_desc bad = d;
    bad.vk_queue_family = 97;
    CHECK(load(&bad, KVGEN_BACKEND_VULKAN, &err) == NULL);
    CHECKF(err.status == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "vk_queue_family 97"), "%s", err.message);
    bad = d;
    bad.vk_queue = NULL;
    err = (kvgen_error){0};
    CHECK(load(&bad, KVGEN_BACKEND_VULKAN, &err) == NULL);
    CHECKF(err.status == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "vk_queue"), "%s", err.message);
    host_use(&h);
    host_destroy(&h);
}

/* forced staging: device buffers are not mapped even on lavapipe, and the staged copies move bytes */
static void staging(const kvgen_model_desc *d, const float *owned, const float *ref, const int32_t *forced,
                    size_t n) {
    setenv("KVGEN_VK_STAGING", "1", 1);
    kvgen_model *m = load_ok(d, KVGEN_BACKEND_VULKAN, "staging");
    unsetenv("KVGEN_VK_STAGING");
    if (!m) return;
    kvg_vk_ctx *ctx = kvg_vk_model_ctx(m);
    CHECK(ctx && ctx->force_staging);
    kvg_vk_buffer b;
    kvgen_error err = {0};
    CHECK(kvg_vk_buffer_create(ctx, 1000, KVG_VK_MEM_UPLOAD, &b, &err) == KVGEN_OK);
    CHECK(b.map == NULL);
    uint32_t src[100], back[250];
    for (int i = 0; i < 100; i++) src[i] = 0x9e3779b9u * (uint32_t)(i + 1);
    CHECK(kvg_vk_upload(ctx, &b, 40, src, sizeof src, &err) == KVGEN_OK);
    CHECK(kvg_vk_download(ctx, &b, 0, back, sizeof back, &err) == KVGEN_OK);
    CHECK(memcmp(back + 10, src, sizeof src) == 0);
    bool zero = true; /* a new device buffer is zero-filled */
    for (int i = 0; i < 10; i++) zero = zero && back[i] == 0;
    for (int i = 110; i < 250; i++) zero = zero && back[i] == 0;
    CHECK(zero);
    CHECK(kvg_vk_upload(ctx, &b, b.size - 4, src, 8, &err) == KVGEN_E_INTERNAL); /* past the end */
    kvg_vk_buffer_destroy(ctx, &b);
    float *l = run(m, forced);
    if (l) {
        CHECKF(excess(l, ref, n, 0.01) <= 1.0, "staging: logits off the reference");
        if (owned) CHECKF(memcmp(l, owned, n * sizeof *l) == 0, "staging: logits differ from the mapped upload");
    }
    free(l);
    check_validation(m, "staging");
    kvgen_model_unload(m);
}

static void selection(const char *path) {
    const char *names[] = {"0", "llvmpipe", "LLVMpipe"};
    for (int i = 0; i < 3; i++) {
        kvgen_model_desc d = {.path = path, .device = names[i]};
        kvgen_model *m = load_ok(&d, KVGEN_BACKEND_VULKAN, names[i]);
        if (m) CHECKF(device_is_lavapipe(m), "device %s", names[i]);
        kvgen_model_unload(m);
        /* the same through the environment */
        setenv("KVGEN_DEVICE", names[i], 1);
        d.device = NULL;
        m = load_ok(&d, KVGEN_BACKEND_VULKAN, names[i]);
        if (m) CHECKF(device_is_lavapipe(m), "KVGEN_DEVICE=%s", names[i]);
        kvgen_model_unload(m);
        unsetenv("KVGEN_DEVICE");
    }
    /* no match: an error naming the devices; the option wins over the environment */
    kvgen_model_desc d = {.path = path, .device = "nosuchgpu"};
    setenv("KVGEN_DEVICE", "llvmpipe", 1);
    kvgen_error err = {0};
    CHECK(load(&d, KVGEN_BACKEND_VULKAN, &err) == NULL);
    unsetenv("KVGEN_DEVICE");
    CHECKF(err.status == KVGEN_E_DEVICE && strstr(err.message, "nosuchgpu") && strstr(err.message, "llvmpipe"), "%s",
           err.message);
    d.device = "99";
    err = (kvgen_error){0};
    CHECK(load(&d, KVGEN_BACKEND_VULKAN, &err) == NULL);
    CHECKF(err.status == KVGEN_E_DEVICE && strstr(err.message, "99"), "%s", err.message);
    /* the default backend falls back to the cpu backend when the named device is absent (api.c),
     * except under KVGEN_VALIDATE=1, where a fallback would skip the validation asked for */
    setenv("KVGEN_DEVICE", "nosuchgpu", 1);
    d.device = NULL;
    const char *validate = getenv("KVGEN_VALIDATE");
    if (validate && strcmp(validate, "1") == 0) {
        err = (kvgen_error){0};
        CHECK(load(&d, KVGEN_BACKEND_DEFAULT, &err) == NULL);
        CHECKF(err.status == KVGEN_E_DEVICE && strstr(err.message, "nosuchgpu"), "%s", err.message);
        unsetenv("KVGEN_DEVICE");
        return;
    }
    kvgen_model *m = load_ok(&d, KVGEN_BACKEND_DEFAULT, "default backend, no such device");
    unsetenv("KVGEN_DEVICE");
    if (m) {
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        CHECKF(strcmp(info.backend, "cpu") == 0, "backend %s", info.backend);
    }
    kvgen_model_unload(m);
}

static void devices(void) {
    int n = -1;
    CHECK_OK(kvgen_devices(NULL, 0, &n, &tu_err_));
    CHECK(n >= 1);
    kvgen_device_info devs[8];
    int n2 = -1;
    CHECK_OK(kvgen_devices(devs, 8, &n2, &tu_err_));
    CHECK(n2 == n);
    int lvp = -1, defaults = 0;
    for (int i = 0; i < n2 && i < 8; i++) {
        CHECK(devs[i].index == i);
        defaults += devs[i].is_default;
        if (strstr(devs[i].name, "llvmpipe")) lvp = i;
    }
    CHECK(defaults == 1);
    CHECKF(lvp >= 0, "lavapipe is not listed");
    if (lvp >= 0) {
        const kvgen_device_info *x = &devs[lvp];
        CHECK(x->type && strcmp(x->type, "cpu") == 0);
        CHECK(x->api_version >= VK_API_VERSION_1_1);
        CHECK(x->device_local_bytes > 0);
        CHECK(x->host_visible_device_local == 1);
        /* llvmpipe's subgroup is its vector width in 32-bit lanes: 256 bits unless
         * LP_NATIVE_VECTOR_WIDTH says otherwise (scripts/vk_drivers.sh runs 128 and 512) */
        const char *lpw = getenv("LP_NATIVE_VECTOR_WIDTH");
        uint32_t want_sg = lpw && atoi(lpw) > 0 ? (uint32_t)atoi(lpw) / 32u : 8u;
        CHECKF(x->subgroup_size == want_sg, "subgroup size %u, want %u", x->subgroup_size, want_sg);
        CHECK(x->storage_16bit == 1 && x->storage_8bit == 1 && x->shader_float16 == 1);
        CHECK(x->max_shared_memory >= 32768);
        CHECK(x->max_storage_buffer_range == 128u << 20);
        CHECK(x->max_allocation_size >= x->max_storage_buffer_range);
        CHECK(x->vendor_id != 0);
        /* cooperative matrices: 8 x 8 x 8 where lavapipe emulates them (Mesa 26) at subgroups of 8
         * in a build with the kernel, none elsewhere (at subgroups of 16 by kvgen's quirk table) */
        CHECKF((x->coopmat_m == 0 && x->coopmat_n == 0 && x->coopmat_k == 0) ||
                   (want_sg == 8 && x->coopmat_m == 8 && x->coopmat_n == 8 && x->coopmat_k == 8),
               "cooperative matrices %ux%ux%u at subgroups of %u", x->coopmat_m, x->coopmat_n, x->coopmat_k, want_sg);
        /* lavapipe offers 8-bit integer dot products, emulated: not reported fast */
        CHECKF(x->int_dot == 1 && x->int_dot_fast == 0, "integer dot products %d, fast %d", x->int_dot,
               x->int_dot_fast);
    }
    /* a short array: count still says how many exist */
    int n3 = -1;
    CHECK_OK(kvgen_devices(devs, 1, &n3, &tu_err_));
    CHECK(n3 == n);
    kvgen_error err = {0};
    CHECK(kvgen_devices(NULL, 2, &n3, &err) == KVGEN_E_INVALID_ARGUMENT);
}

int main(void) {
    char *path = tu_make_model("vk_device.gguf", "--type Q4_1 --seed 11 --embd 96 --heads 6 --kv-heads 2 --ff 160");
    CHECK(path != NULL);
    if (!path) return tu_finish("test_vk_device");
    kvgen_model_desc d = {.path = path};
    devices();
    kvgen_model *mr = load_ok(&d, KVGEN_BACKEND_REFERENCE, "reference");
    kvgen_model *mv = load_ok(&d, KVGEN_BACKEND_VULKAN, "vulkan");
    if (!mr || !mv || !device_is_lavapipe(mv)) {
        kvgen_model_unload(mr);
        kvgen_model_unload(mv);
        free(path);
        if (tu_failures) return tu_finish("test_vk_device");
        tu_skip("no lavapipe device");
    }
    /* the device reports the shape kvgen's own device enables (unless KVGEN_VK_COOPMAT=0) */
    const kvg_vk_ctx *ctx = kvg_vk_model_ctx(mv);
    const char *cm = getenv("KVGEN_VK_COOPMAT");
    bool cm_on = ctx->info.coopmat_m != 0 && !(cm && atoi(cm) == 0);
    CHECKF(ctx->coopmat == cm_on && (!cm_on || (ctx->cm_m == ctx->info.coopmat_m && ctx->cm_n == ctx->info.coopmat_n &&
                                                 ctx->cm_k == ctx->info.coopmat_k)),
           "cooperative matrices: device %d (%ux%ux%u), reported %ux%ux%u", ctx->coopmat, ctx->cm_m, ctx->cm_n,
           ctx->cm_k, ctx->info.coopmat_m, ctx->info.coopmat_n, ctx->info.coopmat_k);
    /* and the integer dot products its device enabled, as offered */
    CHECKF(ctx->int_dot == (ctx->info.int_dot != 0) && ctx->int_dot_fast == (ctx->info.int_dot_fast != 0),
           "integer dot products: device %d (fast %d), reported %d (fast %d)", ctx->int_dot, ctx->int_dot_fast,
           ctx->info.int_dot, ctx->info.int_dot_fast);
    kvgen_model_info info;
    kvgen_model_get_info(mr, &info);
    size_t n = (size_t)(N_DECODE + 1) * (size_t)info.n_vocab;
    int32_t forced[N_DECODE];
    for (int k = 0; k < N_DECODE; k++) forced[k] = (int32_t)((k * 131 + 3) % info.n_vocab);
    float *ref = run(mr, forced), *owned = run(mv, forced);
    CHECK(ref && owned);
    if (ref && owned) {
        CHECKF(excess(owned, ref, n, 0.01) <= 1.0, "kvgen's device: logits off the reference");
        check_validation(mv, "kvgen's device");
        /* KVGEN_VALIDATE=1: the layer was found (else the load fails) and kvgen's messenger is set up;
         * ctest also fails every test whose output holds "kvgen: vulkan validation:" (core/CMakeLists.txt),
         * which catches messages at unload, after the last count could be read */
        if (env_on("KVGEN_VALIDATE")) CHECK(kvg_vk_model_ctx(mv)->messenger != VK_NULL_HANDLE);
        kvgen_model_unload(mv);
        mv = NULL;
        host_device(path, owned, ref, forced, n);
        staging(&d, owned, ref, forced, n);
        /* f32 cache: tighter, by option and by environment */
        kvgen_model_desc f = d;
        f.force_f32 = 1;
        float *l32 = NULL;
        compare_vulkan(&f, ref, forced, n, 0.002, "force_f32", &l32);
        setenv("KVGEN_FORCE_F32", "1", 1);
        float *l32e = NULL;
        compare_vulkan(&d, ref, forced, n, 0.002, "KVGEN_FORCE_F32=1", &l32e);
        unsetenv("KVGEN_FORCE_F32");
        if (l32 && l32e) CHECK(memcmp(l32, l32e, n * sizeof *l32) == 0);
        if (l32) CHECK(memcmp(l32, owned, n * sizeof *l32) != 0); /* the cache format did change */
        free(l32);
        free(l32e);
        selection(path);
    }
    free(ref);
    free(owned);
    kvgen_model_unload(mv);
    kvgen_model_unload(mr);
    free(path);
    return tu_finish("test_vk_device");
}
