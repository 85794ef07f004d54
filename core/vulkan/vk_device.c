/* vk_device.c: Vulkan instance and device set-up, feature detection, buffers, pipelines and
 * submission for the Vulkan backend. Nothing here runs before the host calls kvgen: a context
 * is created per loaded model (or a device list query) and destroyed with it. (About 1,000
 * lines: the device's limits are read here once and every later step checks against them, so
 * set-up, the limit table and the pipelines that obey it stay together.) */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_shaders.h"
#include "kvg_vk.h"

kvgen_status kvg_vk_check(VkResult r, kvgen_error *err, const char *what) {
    if (r == VK_SUCCESS) return KVGEN_OK;
    return kvg_fail(err, KVGEN_E_DEVICE, "vulkan: %s failed: %s (%d)", what, kvg_vk_result_name(r), (int)r);
}

#define VKCHECK(call, what)                                                                         \
    do {                                                                                            \
        kvgen_status st_ = kvg_vk_check((call), err, (what));                                       \
        if (st_ != KVGEN_OK) return st_;                                                            \
    } while (0)

static bool env_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* ---- instance ---- */

static VKAPI_ATTR VkBool32 VKAPI_CALL debug_callback(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                     VkDebugUtilsMessageTypeFlagsEXT types,
                                                     const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
    (void)types;
    kvg_vk_ctx *ctx = user;
    if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
        if (ctx) atomic_fetch_add(&ctx->validation_messages, 1);
        kvg_log(KVGEN_LOG_WARNING, "vulkan validation: %s", data && data->pMessage ? data->pMessage : "(no message)");
    }
    return VK_FALSE;
}

static bool has_layer(const char *name) {
    uint32_t n = 0;
    if (vkEnumerateInstanceLayerProperties(&n, NULL) != VK_SUCCESS || n == 0) return false;
    VkLayerProperties *p = kvg_calloc(n, sizeof *p);
    if (!p) return false;
    bool found = false;
    if (vkEnumerateInstanceLayerProperties(&n, p) == VK_SUCCESS)
        for (uint32_t i = 0; i < n; i++)
            if (strcmp(p[i].layerName, name) == 0) found = true;
    kvg_free(p);
    return found;
}

/* layer: NULL for the loader's and drivers' extensions, else that layer's */
static bool has_instance_ext(const char *layer, const char *name) {
    uint32_t n = 0;
    if (vkEnumerateInstanceExtensionProperties(layer, &n, NULL) != VK_SUCCESS || n == 0) return false;
    VkExtensionProperties *p = kvg_calloc(n, sizeof *p);
    if (!p) return false;
    bool found = false;
    if (vkEnumerateInstanceExtensionProperties(layer, &n, p) == VK_SUCCESS)
        for (uint32_t i = 0; i < n; i++)
            if (strcmp(p[i].extensionName, name) == 0) found = true;
    kvg_free(p);
    return found;
}

/* ctx may be NULL (device listing): then validation is not set up. */
/* gipa: the host's vkGetInstanceProcAddr, NULL: kvgen's own loader */
static kvgen_status create_instance(kvg_vk_ctx *ctx, bool validate, PFN_vkGetInstanceProcAddr gipa, VkInstance *out,
                                    kvgen_error *err) {
    kvgen_status st = kvg_vk_load(gipa, err);
    if (st != KVGEN_OK) return st;
    uint32_t api = VK_API_VERSION_1_1;
    PFN_vkEnumerateInstanceVersion ev =
        (PFN_vkEnumerateInstanceVersion)vkGetInstanceProcAddr(NULL, "vkEnumerateInstanceVersion");
    if (!ev || ev(&api) != VK_SUCCESS || api < VK_API_VERSION_1_1)
        return kvg_fail(err, KVGEN_E_DEVICE, "vulkan: the Vulkan loader supports only 1.0; kvgen needs 1.1");
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                             .pApplicationName = "kvgen",
                             .pEngineName = "kvgen",
                             .engineVersion = VK_MAKE_API_VERSION(0, KVGEN_VERSION_MAJOR, KVGEN_VERSION_MINOR,
                                                                  KVGEN_VERSION_PATCH),
                             .apiVersion = api >= VK_API_VERSION_1_2 ? VK_API_VERSION_1_2 : VK_API_VERSION_1_1};
    const char *layers[1], *exts[3];
    uint32_t n_layers = 0, n_exts = 0;
    bool portability = has_instance_ext(NULL, "VK_KHR_portability_enumeration");
    if (portability) exts[n_exts++] = "VK_KHR_portability_enumeration";
    if (validate) {
        if (!has_layer("VK_LAYER_KHRONOS_validation"))
            return kvg_fail(err, KVGEN_E_DEVICE,
                            "vulkan: KVGEN_VALIDATE=1 but VK_LAYER_KHRONOS_validation is not installed "
                            "(apt install vulkan-validationlayers)");
        layers[n_layers++] = "VK_LAYER_KHRONOS_validation";
        exts[n_exts++] = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
        if (!has_instance_ext("VK_LAYER_KHRONOS_validation", VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME))
            return kvg_fail(err, KVGEN_E_DEVICE,
                            "vulkan: KVGEN_VALIDATE=1 but the validation layer lacks %s (needed for "
                            "synchronization validation)",
                            VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME);
        exts[n_exts++] = VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME;
    }
    /* validation also checks synchronization: every read after a write (and write after a read
     * or write) of a buffer needs a barrier between them */
    VkValidationFeatureEnableEXT features[] = {VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
    VkValidationFeaturesEXT vf = {.sType = VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT,
                                  .enabledValidationFeatureCount = 1,
                                  .pEnabledValidationFeatures = features};
    VkDebugUtilsMessengerCreateInfoEXT dbg = {
        .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
        .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
        .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
        .pfnUserCallback = debug_callback,
        .pUserData = ctx};
    dbg.pNext = validate ? &vf : NULL;
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                               .pNext = validate ? &dbg : NULL,
                               .flags = portability ? VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR : 0,
                               .pApplicationInfo = &app,
                               .enabledLayerCount = n_layers,
                               .ppEnabledLayerNames = layers,
                               .enabledExtensionCount = n_exts,
                               .ppEnabledExtensionNames = exts};
    VkResult r = vkCreateInstance(&ci, NULL, out);
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER)
        return kvg_fail(err, KVGEN_E_DEVICE, "vulkan: no Vulkan driver is installed (vkCreateInstance: %s)",
                        kvg_vk_result_name(r));
    VKCHECK(r, "vkCreateInstance");
    st = kvg_vk_load_instance(*out, err);
    if (st != KVGEN_OK) return st;
    if (validate && ctx) {
        PFN_vkCreateDebugUtilsMessengerEXT create =
            (PFN_vkCreateDebugUtilsMessengerEXT)vkGetInstanceProcAddr(*out, "vkCreateDebugUtilsMessengerEXT");
        if (!create) return kvg_fail(err, KVGEN_E_DEVICE, "vulkan: vkCreateDebugUtilsMessengerEXT is missing");
        dbg.pNext = NULL; /* the validation features belong to the instance only */
        VKCHECK(create(*out, &dbg, NULL, &ctx->messenger), "vkCreateDebugUtilsMessengerEXT");
    }
    return KVGEN_OK;
}

/* ---- devices ---- */

static const char *type_name(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
    }
}

static int type_rank(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 4;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 3;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 1;
    default: return 0;
    }
}

static bool has_device_ext(VkPhysicalDevice pd, const char *name) {
    uint32_t n = 0;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || n == 0) return false;
    VkExtensionProperties *p = kvg_calloc(n, sizeof *p);
    if (!p) return false;
    bool found = false;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, p) == VK_SUCCESS)
        for (uint32_t i = 0; i < n; i++)
            if (strcmp(p[i].extensionName, name) == 0) found = true;
    kvg_free(p);
    return found;
}

static bool coopmat_offered(VkInstance inst, VkPhysicalDevice pd, uint32_t subgroup_size, uint32_t shape[3]);
#define INT_DOT_EXT "VK_KHR_shader_integer_dot_product"
static bool int_dot_offered(VkPhysicalDevice pd, bool *fast);

static void describe_device(VkInstance inst, VkPhysicalDevice pd, int index, kvgen_device_info *info) {
    memset(info, 0, sizeof *info);
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(pd, &props);
    VkPhysicalDeviceSubgroupProperties sub = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceMaintenance3Properties m3 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES,
                                                 .pNext = &sub};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &m3};
    /* the compute-unit count, from the vendor extensions that report it */
    VkPhysicalDeviceShaderSMBuiltinsPropertiesNV nv = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV};
    VkPhysicalDeviceShaderCorePropertiesAMD amd = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_AMD};
    if (has_device_ext(pd, "VK_NV_shader_sm_builtins")) {
        nv.pNext = p2.pNext;
        p2.pNext = &nv;
    }
    if (has_device_ext(pd, "VK_AMD_shader_core_properties")) {
        amd.pNext = p2.pNext;
        p2.pNext = &amd;
    }
    vkGetPhysicalDeviceProperties2(pd, &p2);

    VkPhysicalDevice16BitStorageFeatures s16 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
    VkPhysicalDevice8BitStorageFeatures s8 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES};
    VkPhysicalDeviceShaderFloat16Int8Features f16 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
    /* 1.2 structures are chained only where the device knows them */
    bool v12 = props.apiVersion >= VK_API_VERSION_1_2;
    if (v12 || has_device_ext(pd, "VK_KHR_8bit_storage")) {
        s8.pNext = s16.pNext;
        s16.pNext = &s8;
    }
    if (v12 || has_device_ext(pd, "VK_KHR_shader_float16_int8")) {
        f16.pNext = s16.pNext;
        s16.pNext = &f16;
    }
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &s16};
    vkGetPhysicalDeviceFeatures2(pd, &f2);

    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(pd, &mp);

    info->index = index;
    snprintf(info->name, sizeof info->name, "%s", props.deviceName);
    info->type = type_name(props.deviceType);
    info->vendor_id = props.vendorID;
    info->device_id = props.deviceID;
    info->api_version = props.apiVersion;
    for (uint32_t h = 0; h < mp.memoryHeapCount; h++)
        if ((mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) &&
            mp.memoryHeaps[h].size > info->device_local_bytes)
            info->device_local_bytes = mp.memoryHeaps[h].size;
    for (uint32_t t = 0; t < mp.memoryTypeCount; t++) {
        VkMemoryPropertyFlags f = mp.memoryTypes[t].propertyFlags;
        VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
        /* a small BAR window (256 MiB) is not enough to hold weights in place */
        if ((f & want) == want && mp.memoryHeaps[mp.memoryTypes[t].heapIndex].size >= (1ull << 30))
            info->host_visible_device_local = 1;
    }
    info->shader_float16 = f16.shaderFloat16 ? 1 : 0;
    info->storage_16bit = s16.storageBuffer16BitAccess ? 1 : 0;
    info->storage_8bit = s8.storageBuffer8BitAccess ? 1 : 0;
    info->subgroup_size = sub.subgroupSize;
    info->subgroup_arithmetic = (sub.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) &&
                                (sub.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT);
    info->max_shared_memory = props.limits.maxComputeSharedMemorySize;
    info->max_storage_buffer_range = props.limits.maxStorageBufferRange;
    info->max_allocation_size = m3.maxMemoryAllocationSize;
    if (nv.shaderSMCount) info->compute_units = nv.shaderSMCount;
    else
        info->compute_units = amd.shaderEngineCount * amd.shaderArraysPerEngineCount * amd.computeUnitsPerShaderArray;
    uint32_t shape[3];
    coopmat_offered(inst, pd, info->subgroup_size, shape);
    info->coopmat_m = shape[0];
    info->coopmat_n = shape[1];
    info->coopmat_k = shape[2];
    bool dot_fast;
    info->int_dot = int_dot_offered(pd, &dot_fast);
    info->int_dot_fast = dot_fast;
}

static bool has_compute_queue(VkPhysicalDevice pd, uint32_t *family) {
    uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, NULL);
    if (n == 0) return false;
    VkQueueFamilyProperties *q = kvg_calloc(n, sizeof *q);
    if (!q) return false;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, q);
    bool found = false;
    /* a compute-only family first (often an async queue that a game's rendering does not use) */
    for (int pass = 0; pass < 2 && !found; pass++)
        for (uint32_t i = 0; i < n && !found; i++) {
            bool compute = (q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && q[i].queueCount > 0;
            bool graphics = (q[i].queueFlags & VK_QUEUE_GRAPHICS_BIT) != 0;
            if (compute && (pass == 1 || !graphics)) {
                *family = i;
                found = true;
            }
        }
    kvg_free(q);
    return found;
}

static kvgen_status enumerate(VkInstance inst, VkPhysicalDevice **pds, uint32_t *n, kvgen_error *err) {
    *pds = NULL;
    *n = 0;
    VKCHECK(vkEnumeratePhysicalDevices(inst, n, NULL), "vkEnumeratePhysicalDevices");
    if (*n == 0) return KVGEN_OK;
    *pds = kvg_calloc(*n, sizeof **pds);
    if (!*pds) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory listing devices");
    VkResult r = vkEnumeratePhysicalDevices(inst, n, *pds);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) {
        kvg_free(*pds);
        *pds = NULL;
        return kvg_vk_check(r, err, "vkEnumeratePhysicalDevices");
    }
    return KVGEN_OK;
}

static int default_device(VkPhysicalDevice *pds, uint32_t n) {
    int best = -1, best_rank = -1;
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(pds[i], &p);
        uint32_t fam;
        if (p.apiVersion < VK_API_VERSION_1_1 || !has_compute_queue(pds[i], &fam)) continue;
        if (type_rank(p.deviceType) > best_rank) {
            best_rank = type_rank(p.deviceType);
            best = (int)i;
        }
    }
    return best;
}

static bool contains_nocase(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i])) i++;
        if (i == n) return true;
    }
    return n == 0;
}

/* desc->device, else KVGEN_DEVICE, else the best: an index or a name substring */
static kvgen_status choose_device(VkPhysicalDevice *pds, uint32_t n, const char *want, int *out, kvgen_error *err) {
    if (n == 0) return kvg_fail(err, KVGEN_E_DEVICE, "vulkan: no Vulkan device found");
    if (!want || !*want) {
        *out = default_device(pds, n);
        if (*out < 0) return kvg_fail(err, KVGEN_E_DEVICE, "vulkan: no device supports Vulkan 1.1 compute");
        return KVGEN_OK;
    }
    char *end = NULL;
    long idx = strtol(want, &end, 10);
    if (end && end != want && *end == '\0') {
        if (idx < 0 || idx >= (long)n)
            return kvg_fail(err, KVGEN_E_DEVICE, "vulkan: device index %ld is out of range (%u devices)", idx, n);
        *out = (int)idx;
        return KVGEN_OK;
    }
    char names[400] = "";
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(pds[i], &p);
        if (contains_nocase(p.deviceName, want)) {
            *out = (int)i;
            return KVGEN_OK;
        }
        size_t len = strlen(names);
        snprintf(names + len, sizeof names - len, "%s%u: %s", i ? ", " : "", i, p.deviceName);
    }
    return kvg_fail(err, KVGEN_E_DEVICE, "vulkan: no device matches \"%s\" (devices: %s)", want, names);
}

kvgen_status kvgen_devices(kvgen_device_info *out, int cap, int *count, kvgen_error *err) {
    if (count) *count = 0;
    if (!count) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_devices: count is NULL");
    if (cap < 0 || (cap > 0 && !out))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_devices: out is NULL or cap %d is negative", cap);
    VkInstance inst = VK_NULL_HANDLE;
    kvgen_error ierr = {0};
    if (create_instance(NULL, false, NULL, &inst, &ierr) != KVGEN_OK) return KVGEN_OK; /* no driver: no devices */
    VkPhysicalDevice *pds = NULL;
    uint32_t n = 0;
    kvgen_status st = enumerate(inst, &pds, &n, err);
    if (st == KVGEN_OK) {
        int def = default_device(pds, n);
        for (uint32_t i = 0; i < n && (int)i < cap; i++) {
            describe_device(inst, pds[i], (int)i, &out[i]);
            out[i].is_default = (int)i == def;
        }
        *count = (int)n;
    }
    kvg_free(pds);
    vkDestroyInstance(inst, NULL);
    return st;
}

/* ---- context ---- */

/* VK_KHR_cooperative_matrix's structures and query, declared here in the specification's
 * layout (the Vulkan headers of older distributions lack them) */
typedef struct {
    VkStructureType sType;
    void *pNext;
    VkBool32 cooperativeMatrix, cooperativeMatrixRobustBufferAccess;
} kvg_cm_features;
typedef struct {
    VkStructureType sType;
    void *pNext;
    uint32_t MSize, NSize, KSize;
    uint32_t AType, BType, CType, ResultType; /* VkComponentTypeKHR */
    VkBool32 saturatingAccumulation;
    uint32_t scope; /* VkScopeKHR */
} kvg_cm_props;
typedef VkResult(VKAPI_PTR *kvg_cm_props_fn)(VkPhysicalDevice, uint32_t *, kvg_cm_props *);
#define KVG_ST_CM_FEATURES ((VkStructureType)1000506000)
#define KVG_ST_CM_PROPS ((VkStructureType)1000506001)
enum { KVG_CM_FLOAT16 = 0, KVG_CM_FLOAT32 = 1, KVG_CM_SCOPE_SUBGROUP = 3 };

/* the version kvgen's instance and a device both have (the instance asks for 1.2 where the
 * loader has it, create_instance) */
static uint32_t common_api(VkPhysicalDevice pd) {
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(pd, &p);
    uint32_t api = 0;
    PFN_vkEnumerateInstanceVersion ev =
        (PFN_vkEnumerateInstanceVersion)vkGetInstanceProcAddr(NULL, "vkEnumerateInstanceVersion");
    if (!ev || ev(&api) != VK_SUCCESS) return VK_API_VERSION_1_0;
    api = api >= VK_API_VERSION_1_2 ? VK_API_VERSION_1_2 : VK_API_VERSION_1_1;
    return p.apiVersion < api ? p.apiVersion : api;
}

/* whether the device offers compute subgroups of a required size, whole (the cooperative-matrix
 * GEMM and the one-subgroup mat-vecs ask for them), and the sizes it can require */
static bool full_subgroups(VkPhysicalDevice pd, uint32_t *min, uint32_t *max) {
    *min = *max = 0;
    if (!has_device_ext(pd, "VK_EXT_subgroup_size_control")) return false;
    VkPhysicalDeviceSubgroupSizeControlFeaturesEXT f = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT};
    VkPhysicalDeviceSubgroupSizeControlPropertiesEXT p = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES_EXT};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f};
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &p};
    vkGetPhysicalDeviceProperties2(pd, &p2);
    if (!f.subgroupSizeControl || !f.computeFullSubgroups ||
        !(p.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT) || p.minSubgroupSize == 0)
        return false;
    *min = p.minSubgroupSize;
    *max = p.maxSubgroupSize;
    return true;
}

/* Offers of cooperative matrices known not to hold: one row per driver, its test given the
 * device's subgroup size and the rows of the shape chosen; where it is true, they are declined. */
static bool lvp_lanes_not_rows(uint32_t subgroup_size, uint32_t m) {
    /* lavapipe's emulation keeps one matrix row per lane: it needs as many lanes as the 8 rows
     * it lists, yet it lists them at subgroups of 16 too (LP_NATIVE_VECTOR_WIDTH=512), where its
     * compiler crashes on the first shader that uses them (Mesa 26.1) */
    return subgroup_size != m;
}
static const struct {
    VkDriverId driver;
    bool (*broken)(uint32_t subgroup_size, uint32_t m);
} coopmat_quirks[] = {
    {VK_DRIVER_ID_MESA_LLVMPIPE, lvp_lanes_not_rows},
};

static bool coopmat_known_broken(VkPhysicalDevice pd, uint32_t subgroup_size, uint32_t m) {
    VkPhysicalDeviceDriverProperties drv = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &drv};
    vkGetPhysicalDeviceProperties2(pd, &p2);
    for (size_t i = 0; i < sizeof coopmat_quirks / sizeof coopmat_quirks[0]; i++)
        if (drv.driverID == coopmat_quirks[i].driver && coopmat_quirks[i].broken(subgroup_size, m)) return true;
    return false;
}

/* whether this build's cooperative-matrix GEMM (gemm_cm_<type>) can run on the device: the
 * build has the kernel; the device has Vulkan 1.2 with kvgen's instance, whole subgroups of a
 * required size, the extension and its feature, products of f16 A and B into f32 at subgroup
 * scope with M, N and K of 8 or 16 (shape: the largest), shaderFloat16 and the Vulkan memory
 * model with device scope (once the memory model is enabled, the atomics of the other shaders,
 * at device scope, need the latter); and no row of coopmat_quirks says its offer is broken */
static bool coopmat_offered(VkInstance inst, VkPhysicalDevice pd, uint32_t subgroup_size, uint32_t shape[3]) {
    shape[0] = shape[1] = shape[2] = 0;
    uint32_t sg_min, sg_max;
    if (!kvg_shader_find("gemm_cm_f32") || common_api(pd) < VK_API_VERSION_1_2 ||
        !full_subgroups(pd, &sg_min, &sg_max) ||
        !has_device_ext(pd, "VK_KHR_cooperative_matrix"))
        return false;
    kvg_cm_features cmf = {.sType = KVG_ST_CM_FEATURES};
    VkPhysicalDeviceShaderFloat16Int8Features f16 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES, .pNext = &cmf};
    VkPhysicalDeviceVulkanMemoryModelFeatures mm = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES, .pNext = &f16};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &mm};
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    if (!cmf.cooperativeMatrix || !f16.shaderFloat16 || !mm.vulkanMemoryModel || !mm.vulkanMemoryModelDeviceScope)
        return false;
    kvg_cm_props_fn get =
        (kvg_cm_props_fn)vkGetInstanceProcAddr(inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR");
    uint32_t n = 0;
    if (!get || get(pd, &n, NULL) != VK_SUCCESS || n == 0) return false;
    kvg_cm_props *p = kvg_calloc(n, sizeof *p);
    if (!p) return false;
    for (uint32_t i = 0; i < n; i++) p[i].sType = KVG_ST_CM_PROPS;
    uint32_t best = 0, m = 0, nn = 0, k = 0;
    if (get(pd, &n, p) == VK_SUCCESS)
        for (uint32_t i = 0; i < n; i++) {
            bool dims = (p[i].MSize == 8 || p[i].MSize == 16) && (p[i].NSize == 8 || p[i].NSize == 16) &&
                        (p[i].KSize == 8 || p[i].KSize == 16);
            uint32_t size = p[i].MSize * p[i].NSize * p[i].KSize;
            if (dims && p[i].AType == KVG_CM_FLOAT16 && p[i].BType == KVG_CM_FLOAT16 &&
                p[i].CType == KVG_CM_FLOAT32 && p[i].ResultType == KVG_CM_FLOAT32 &&
                p[i].scope == KVG_CM_SCOPE_SUBGROUP && size > best) {
                best = size;
                m = p[i].MSize;
                nn = p[i].NSize;
                k = p[i].KSize;
            }
        }
    kvg_free(p);
    if (best == 0 || coopmat_known_broken(pd, subgroup_size, m)) return false;
    shape[0] = m;
    shape[1] = nn;
    shape[2] = k;
    return true;
}

/* Whether the device offers 8-bit integer dot products (VK_KHR_shader_integer_dot_product with
 * its feature), and in *fast whether it reports the 4x8-bit packed signed form as accelerated */
static bool int_dot_offered(VkPhysicalDevice pd, bool *fast) {
    *fast = false;
    if (!has_device_ext(pd, INT_DOT_EXT)) return false;
    VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR dotf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &dotf};
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    if (!dotf.shaderIntegerDotProduct) return false;
    VkPhysicalDeviceShaderIntegerDotProductPropertiesKHR dotp = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES_KHR};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &dotp};
    vkGetPhysicalDeviceProperties2(pd, &p2);
    *fast = dotp.integerDotProduct4x8BitPackedSignedAccelerated;
    return true;
}

static kvgen_status create_device(kvg_vk_ctx *ctx, kvgen_error *err) {
    float prio = 1.0f;
    VkDeviceQueueCreateInfo q = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                 .queueFamilyIndex = ctx->queue_family,
                                 .queueCount = 1,
                                 .pQueuePriorities = &prio};
    /* kvgen's shaders need no optional feature: f16 is packed into 32-bit words (see weights.glsl);
     * the integer-dot variants are made only where the feature below is enabled.
     * Subgroup size control is enabled where offered for compute, so that a mat-vec workgroup of
     * the subgroup's size is one subgroup by requirement rather than by the driver's choice. */
    VkPhysicalDeviceSubgroupSizeControlFeaturesEXT sgf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT,
        .subgroupSizeControl = VK_TRUE,
        .computeFullSubgroups = VK_TRUE};
    const char *ext = "VK_EXT_subgroup_size_control";
    uint32_t sg_min = 0, sg_max = 0;
    bool sg = full_subgroups(ctx->phys, &sg_min, &sg_max);
    /* 4x8-bit packed integer dot products (8-bit activations: matvec_dot_<type>, gemm_dot_<type>):
     * the extension is enabled (the instance asks for Vulkan 1.2 at most), with its feature */
    bool dot_fast = false;
    bool dot = int_dot_offered(ctx->phys, &dot_fast);
    VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR dotf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR,
        .shaderIntegerDotProduct = VK_TRUE};
    /* cooperative matrices (gemm_cm_<type>), where the build has those variants;
     * KVGEN_VK_COOPMAT=0 leaves them off the device altogether */
    const char *cm_env = getenv("KVGEN_VK_COOPMAT");
    uint32_t shape[3];
    bool cm = sg && !(cm_env && atoi(cm_env) == 0) &&
              coopmat_offered(ctx->instance, ctx->phys, ctx->info.subgroup_size, shape);
    if (cm) {
        ctx->cm_m = shape[0];
        ctx->cm_n = shape[1];
        ctx->cm_k = shape[2];
    }
    VkPhysicalDeviceShaderFloat16Int8Features cmf16 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES, .shaderFloat16 = VK_TRUE};
    VkPhysicalDeviceVulkanMemoryModelFeatures cmmm = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES,
        .vulkanMemoryModel = VK_TRUE,
        .vulkanMemoryModelDeviceScope = VK_TRUE}; /* the other shaders' atomics are at device scope */
    kvg_cm_features cmf = {.sType = KVG_ST_CM_FEATURES, .cooperativeMatrix = VK_TRUE};
    const char *exts[3];
    uint32_t n_exts = 0;
    VkDeviceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1,
                             .pQueueCreateInfos = &q};
    const void *chain = NULL;
    if (sg) {
        sgf.pNext = NULL;
        chain = &sgf;
        exts[n_exts++] = ext;
    }
    if (dot) {
        dotf.pNext = (void *)chain;
        chain = &dotf;
        exts[n_exts++] = INT_DOT_EXT;
    }
    if (cm) {
        cmmm.pNext = (void *)chain;
        cmf16.pNext = &cmmm;
        cmf.pNext = &cmf16;
        chain = &cmf;
        exts[n_exts++] = "VK_KHR_cooperative_matrix";
    }
    ci.pNext = chain;
    ci.enabledExtensionCount = n_exts;
    ci.ppEnabledExtensionNames = n_exts ? exts : NULL;
    VKCHECK(vkCreateDevice(ctx->phys, &ci, NULL, &ctx->dev), "vkCreateDevice");
    ctx->int_dot = dot;
    ctx->int_dot_fast = dot && dot_fast;
    ctx->coopmat = cm;
    ctx->sg_size_control = sg;
    ctx->sg_min = sg ? sg_min : 0;
    ctx->sg_max = sg ? sg_max : 0;
    ctx->own_device = true;
    vkGetDeviceQueue(ctx->dev, ctx->queue_family, 0, &ctx->queue);
    return KVGEN_OK;
}

static VkDescriptorType binding_type(uint32_t i) {
    return i == KVG_VK_UBO_X      ? VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER_DYNAMIC
           : i == KVG_VK_UBO_NORM ? VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER
                                  : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
}

/* slot of a kvg_vk_binding array -> (binding, array element); see kvg_vk.h */
static void slot_binding(uint32_t slot, uint32_t *binding, uint32_t *element) {
    *binding = slot < KVG_VK_LAYOUT_BINDINGS ? slot : 5;
    *element = slot < KVG_VK_LAYOUT_BINDINGS ? 0 : slot - KVG_VK_LAYOUT_BINDINGS + 1;
}

/* The compute limits kvgen's dispatches and pipelines are checked against (ctx->props.limits),
 * lowered by the environment so that tests run the small-limit paths on any device:
 * KVGEN_VK_MAX_GROUP_COUNT (maxComputeWorkGroupCount, every dimension), KVGEN_VK_MAX_SHARED
 * (maxComputeSharedMemorySize, bytes) and KVGEN_VK_MAX_INVOCATIONS
 * (maxComputeWorkGroupInvocations and every dimension of maxComputeWorkGroupSize), and
 * KVGEN_VK_MAX_PART (ctx->max_part: the bytes one buffer binding covers). A value can
 * only lower a limit; one that is not a positive integer is an error. */
static kvgen_status env_limit(const char *name, uint32_t *limit, kvgen_error *err) {
    const char *v = getenv(name);
    if (!v || !*v) return KVGEN_OK;
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || x == 0 || x > UINT32_MAX || v[0] == '-')
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "vulkan: %s=\"%s\" is not a positive integer below 2^32",
                        name, v);
    if (x < *limit) *limit = (uint32_t)x;
    return KVGEN_OK;
}

static kvgen_status lower_limits(kvg_vk_ctx *ctx, kvgen_error *err) {
    VkPhysicalDeviceLimits *l = &ctx->props.limits;
    kvgen_status st = KVGEN_OK;
    for (int i = 0; i < 3 && st == KVGEN_OK; i++)
        st = env_limit("KVGEN_VK_MAX_GROUP_COUNT", &l->maxComputeWorkGroupCount[i], err);
    if (st == KVGEN_OK) st = env_limit("KVGEN_VK_MAX_SHARED", &l->maxComputeSharedMemorySize, err);
    if (st == KVGEN_OK) st = env_limit("KVGEN_VK_MAX_INVOCATIONS", &l->maxComputeWorkGroupInvocations, err);
    for (int i = 0; i < 3 && st == KVGEN_OK; i++)
        st = env_limit("KVGEN_VK_MAX_INVOCATIONS", &l->maxComputeWorkGroupSize[i], err);
    ctx->info.max_shared_memory = l->maxComputeSharedMemorySize;
    /* the most one buffer binding covers: maxStorageBufferRange within maxMemoryAllocationSize,
     * lowered by KVGEN_VK_MAX_PART (bytes) so tests split matrices, KV slabs and batches */
    uint32_t part = l->maxStorageBufferRange;
    if (ctx->info.max_allocation_size && ctx->info.max_allocation_size < part)
        part = (uint32_t)ctx->info.max_allocation_size;
    if (st == KVGEN_OK) st = env_limit("KVGEN_VK_MAX_PART", &part, err);
    ctx->max_part = part;
    /* KVGEN_VK_COMPUTE_UNITS: the compute units kvgen plans for, as if the driver reported them
     * (tests run a GPU's attention splits on lavapipe) */
    uint32_t cu = UINT32_MAX;
    if (st == KVGEN_OK) st = env_limit("KVGEN_VK_COMPUTE_UNITS", &cu, err);
    if (st == KVGEN_OK && cu != UINT32_MAX) ctx->info.compute_units = cu;
    return st;
}

static kvgen_status create_common(kvg_vk_ctx *ctx, kvgen_error *err) {
    ctx->ubo_window = ctx->props.limits.maxUniformBufferRange < 65536 ? ctx->props.limits.maxUniformBufferRange : 65536;
    ctx->ubo_window &= ~15u;
    if (ctx->props.limits.maxPerStageDescriptorStorageBuffers < KVG_VK_SSBO_DESCRIPTORS ||
        ctx->props.limits.maxDescriptorSetStorageBuffers < KVG_VK_SSBO_DESCRIPTORS)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "vulkan: device %s binds at most %u storage buffers per stage; kvgen needs %d",
                        ctx->info.name, ctx->props.limits.maxPerStageDescriptorStorageBuffers,
                        KVG_VK_SSBO_DESCRIPTORS);
    VkDescriptorSetLayoutBinding b[KVG_VK_LAYOUT_BINDINGS];
    for (uint32_t i = 0; i < KVG_VK_LAYOUT_BINDINGS; i++)
        b[i] = (VkDescriptorSetLayoutBinding){.binding = i,
                                              .descriptorType = binding_type(i),
                                              .descriptorCount = i == 5 ? KVG_VK_KV_SLABS : 1,
                                              .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    VkDescriptorSetLayoutCreateInfo lci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                           .bindingCount = KVG_VK_LAYOUT_BINDINGS,
                                           .pBindings = b};
    VKCHECK(vkCreateDescriptorSetLayout(ctx->dev, &lci, NULL, &ctx->set_layout), "vkCreateDescriptorSetLayout");
    VkPushConstantRange pcr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = KVG_VK_PUSH_BYTES};
    VkPipelineLayoutCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                      .setLayoutCount = 1,
                                      .pSetLayouts = &ctx->set_layout,
                                      .pushConstantRangeCount = 1,
                                      .pPushConstantRanges = &pcr};
    VKCHECK(vkCreatePipelineLayout(ctx->dev, &pci, NULL, &ctx->pipe_layout), "vkCreatePipelineLayout");
    VkCommandPoolCreateInfo cpi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                   .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = ctx->queue_family};
    VKCHECK(vkCreateCommandPool(ctx->dev, &cpi, NULL, &ctx->cmd_pool), "vkCreateCommandPool");
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VKCHECK(vkCreateFence(ctx->dev, &fci, NULL, &ctx->fence), "vkCreateFence");
    return kvg_vk_buffer_create(ctx, ctx->ubo_window, KVG_VK_MEM_DEVICE, &ctx->dummy, err);
}

static kvgen_status check_host_queue(kvg_vk_ctx *ctx, kvgen_error *err) {
    uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(ctx->phys, &n, NULL);
    VkQueueFamilyProperties *q = n ? kvg_calloc(n, sizeof *q) : NULL;
    if (n && !q) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    if (q) vkGetPhysicalDeviceQueueFamilyProperties(ctx->phys, &n, q);
    bool compute = ctx->queue_family < n && (q[ctx->queue_family].queueFlags & VK_QUEUE_COMPUTE_BIT);
    kvg_free(q);
    if (ctx->queue_family >= n)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "vulkan: vk_queue_family %u is out of range (device %s has %u queue families)",
                        ctx->queue_family, ctx->info.name, n);
    if (!compute)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "vulkan: vk_queue_family %u of device %s does not support compute",
                        ctx->queue_family, ctx->info.name);
    return KVGEN_OK;
}

kvgen_status kvg_vk_ctx_create(const kvg_vk_ctx_desc *desc, kvg_vk_ctx **out, kvgen_error *err) {
    *out = NULL;
    kvg_vk_ctx *ctx = kvg_calloc(1, sizeof *ctx);
    if (!ctx) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory");
    atomic_init(&ctx->validation_messages, 0);
    if (kvg_mutex_init(&ctx->lock) != 0) {
        kvg_free(ctx);
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: kvg_mutex_init failed");
    }
    ctx->force_staging = env_flag("KVGEN_VK_STAGING");
    ctx->kv_f16 = !(desc->force_f32 || env_flag("KVGEN_FORCE_F32"));
    kvgen_status st = KVGEN_OK;
    int n_ext = (desc->vk_instance != NULL) + (desc->vk_physical_device != NULL) + (desc->vk_device != NULL) +
                (desc->vk_queue != NULL);
    if (n_ext != 0 && n_ext != 4) {
        st = kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                      "vulkan: give all of vk_instance, vk_physical_device, vk_device and vk_queue, or none");
        goto fail;
    }
    PFN_vkGetInstanceProcAddr gipa = NULL;
    if (desc->vk_get_instance_proc_addr) memcpy(&gipa, &desc->vk_get_instance_proc_addr, sizeof gipa);
    if (n_ext == 4) {
        st = kvg_vk_load(gipa, err);
        if (st == KVGEN_OK) st = kvg_vk_load_instance((VkInstance)desc->vk_instance, err);
        if (st != KVGEN_OK) goto fail;
        ctx->instance = (VkInstance)desc->vk_instance;
        ctx->phys = (VkPhysicalDevice)desc->vk_physical_device;
        ctx->dev = (VkDevice)desc->vk_device;
        ctx->queue = (VkQueue)desc->vk_queue;
        ctx->queue_family = desc->vk_queue_family;
        describe_device(ctx->instance, ctx->phys, 0, &ctx->info);
        /* the host made the device: only what it enabled runs, and kvgen uses neither cooperative
         * matrices nor integer dot products there */
        ctx->info.coopmat_m = ctx->info.coopmat_n = ctx->info.coopmat_k = 0;
        ctx->info.int_dot = ctx->info.int_dot_fast = 0;
        if (ctx->info.api_version < VK_API_VERSION_1_1) {
            st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: the host's device supports only Vulkan 1.0; kvgen needs 1.1");
            goto fail;
        }
        /* a wrong family would only show later, as undefined behaviour in vkCreateCommandPool */
        st = check_host_queue(ctx, err);
        if (st != KVGEN_OK) goto fail;
    } else {
        st = create_instance(ctx, env_flag("KVGEN_VALIDATE"), gipa, &ctx->instance, err);
        if (st != KVGEN_OK) goto fail;
        ctx->own_instance = true;
        VkPhysicalDevice *pds = NULL;
        uint32_t n = 0;
        st = enumerate(ctx->instance, &pds, &n, err);
        int idx = -1;
        const char *want = desc->device && *desc->device ? desc->device : getenv("KVGEN_DEVICE");
        if (st == KVGEN_OK) st = choose_device(pds, n, want, &idx, err);
        if (st == KVGEN_OK) {
            ctx->phys = pds[idx];
            describe_device(ctx->instance, ctx->phys, idx, &ctx->info);
            ctx->info.is_default = idx == default_device(pds, n);
        }
        kvg_free(pds);
        if (st != KVGEN_OK) goto fail;
        if (ctx->info.api_version < VK_API_VERSION_1_1) {
            st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: device %s supports only Vulkan 1.0; kvgen needs 1.1",
                          ctx->info.name);
            goto fail;
        }
        if (!has_compute_queue(ctx->phys, &ctx->queue_family)) {
            st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: device %s has no compute queue", ctx->info.name);
            goto fail;
        }
        st = create_device(ctx, err);
        if (st != KVGEN_OK) goto fail;
    }
    vkGetPhysicalDeviceProperties(ctx->phys, &ctx->props);
    vkGetPhysicalDeviceMemoryProperties(ctx->phys, &ctx->mem_props);
    st = lower_limits(ctx, err);
    if (st == KVGEN_OK) st = create_common(ctx, err);
    if (st != KVGEN_OK) goto fail;
    kvg_vk_pcache_open(ctx, desc->pipeline_cache_path); /* never fails: no usable file = empty cache */
    *out = ctx;
    return KVGEN_OK;
fail:
    kvg_vk_ctx_destroy(ctx);
    return st;
}

void kvg_vk_ctx_destroy(kvg_vk_ctx *ctx) {
    if (!ctx) return;
    if (ctx->dev) {
        vkDeviceWaitIdle(ctx->dev);
        kvg_vk_pcache_close(ctx); /* writes back pipelines created since the last save */
        for (int i = 0; i < ctx->n_pipes; i++) vkDestroyPipeline(ctx->dev, ctx->pipes[i].pipe, NULL);
        kvg_vk_buffer_destroy(ctx, &ctx->dummy);
        if (ctx->fence) vkDestroyFence(ctx->dev, ctx->fence, NULL);
        if (ctx->cmd_pool) vkDestroyCommandPool(ctx->dev, ctx->cmd_pool, NULL);
        if (ctx->pipe_layout) vkDestroyPipelineLayout(ctx->dev, ctx->pipe_layout, NULL);
        if (ctx->set_layout) vkDestroyDescriptorSetLayout(ctx->dev, ctx->set_layout, NULL);
        if (ctx->own_device) vkDestroyDevice(ctx->dev, NULL);
    }
    kvg_free(ctx->pipes);
    if (ctx->own_instance && ctx->instance) {
        if (ctx->messenger) {
            PFN_vkDestroyDebugUtilsMessengerEXT destroy = (PFN_vkDestroyDebugUtilsMessengerEXT)vkGetInstanceProcAddr(
                ctx->instance, "vkDestroyDebugUtilsMessengerEXT");
            if (destroy) destroy(ctx->instance, ctx->messenger, NULL);
        }
        vkDestroyInstance(ctx->instance, NULL);
    }
    kvg_mutex_destroy(&ctx->lock);
    kvg_free(ctx);
}

int kvg_vk_validation_count(const kvg_vk_ctx *ctx) {
    return ctx ? atomic_load(&((kvg_vk_ctx *)ctx)->validation_messages) : 0;
}

/* one-off recordings for kvg_vk_run_once: a zero fill of a whole buffer, a copy */
static kvgen_status record_fill(VkCommandBuffer cb, void *arg) {
    vkCmdFillBuffer(cb, ((kvg_vk_buffer *)arg)->buf, 0, VK_WHOLE_SIZE, 0);
    kvg_vk_cmd_barrier(cb);
    return KVGEN_OK;
}

typedef struct copy_args {
    VkBuffer src, dst;
    VkBufferCopy region;
} copy_args;

static kvgen_status record_copy(VkCommandBuffer cb, void *arg) {
    const copy_args *a = arg;
    kvg_vk_cmd_transfer_barrier(cb);
    vkCmdCopyBuffer(cb, a->src, a->dst, 1, &a->region);
    kvg_vk_cmd_barrier(cb);
    return KVGEN_OK;
}

/* ---- buffers ---- */

static int find_memory(const kvg_vk_ctx *ctx, uint32_t bits, VkMemoryPropertyFlags want, VkMemoryPropertyFlags avoid) {
    for (uint32_t i = 0; i < ctx->mem_props.memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = ctx->mem_props.memoryTypes[i].propertyFlags;
        if ((bits & (1u << i)) && (f & want) == want && (f & avoid) == 0) return (int)i;
    }
    return -1;
}

static kvgen_status alloc_bind(kvg_vk_ctx *ctx, kvg_vk_buffer *b, int type, bool may_map, kvgen_error *err) {
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(ctx->dev, b->buf, &req);
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                               .allocationSize = req.size,
                               .memoryTypeIndex = (uint32_t)type};
    VkResult r = vkAllocateMemory(ctx->dev, &ai, NULL, &b->mem);
    if (r != VK_SUCCESS) {
        b->mem = VK_NULL_HANDLE;
        return kvg_fail(err, KVGEN_E_DEVICE, "vulkan: allocating %llu bytes of device memory failed: %s",
                        (unsigned long long)req.size, kvg_vk_result_name(r));
    }
    VKCHECK(vkBindBufferMemory(ctx->dev, b->buf, b->mem, 0), "vkBindBufferMemory");
    VkMemoryPropertyFlags f = ctx->mem_props.memoryTypes[type].propertyFlags;
    /* only coherent memory is mapped, so no flush/invalidate is ever needed; other memory is staged */
    if (may_map && (f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) && (f & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT))
        VKCHECK(vkMapMemory(ctx->dev, b->mem, 0, VK_WHOLE_SIZE, 0, &b->map), "vkMapMemory");
    return KVGEN_OK;
}

kvgen_status kvg_vk_buffer_create(kvg_vk_ctx *ctx, VkDeviceSize size, int kind, kvg_vk_buffer *out,
                                  kvgen_error *err) {
    memset(out, 0, sizeof *out);
    size = (size + 255) & ~(VkDeviceSize)255;
    if (size == 0) size = 256;
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                             .size = size,
                             .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_UNIFORM_BUFFER_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VKCHECK(vkCreateBuffer(ctx->dev, &bi, NULL, &out->buf), "vkCreateBuffer");
    out->size = size;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(ctx->dev, out->buf, &req);
    const VkMemoryPropertyFlags DL = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT,
                                HV = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                HC = VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
    int candidates[3] = {-1, -1, -1};
    if (kind == KVG_VK_MEM_HOST) {
        candidates[0] = find_memory(ctx, req.memoryTypeBits, HV | HC, 0);
        candidates[1] = find_memory(ctx, req.memoryTypeBits, HV, 0);
    } else if (kind == KVG_VK_MEM_UPLOAD && !ctx->force_staging && ctx->info.host_visible_device_local) {
        candidates[0] = find_memory(ctx, req.memoryTypeBits, DL | HV, 0);
        candidates[1] = find_memory(ctx, req.memoryTypeBits, DL, 0);
    } else {
        /* device-local memory that is not host-visible where it exists: that is where a GPU is fastest */
        candidates[0] = find_memory(ctx, req.memoryTypeBits, DL, ctx->force_staging ? HV : 0);
        candidates[1] = find_memory(ctx, req.memoryTypeBits, DL, 0);
        candidates[2] = find_memory(ctx, req.memoryTypeBits, 0, 0);
    }
    kvgen_status st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: no memory type for a %llu-byte buffer",
                               (unsigned long long)size);
    for (int i = 0; i < 3; i++) {
        if (candidates[i] < 0) continue;
        /* forced staging leaves device buffers unmapped even where all memory is host-visible
         * (lavapipe), so the staged upload, download and zero-fill paths run there too */
        st = alloc_bind(ctx, out, candidates[i], kind == KVG_VK_MEM_HOST || !ctx->force_staging, err);
        if (st == KVGEN_OK) break;
        if (out->mem) vkFreeMemory(ctx->dev, out->mem, NULL);
        out->mem = VK_NULL_HANDLE;
        out->map = NULL;
    }
    if (st != KVGEN_OK) {
        kvg_vk_buffer_destroy(ctx, out);
        return st;
    }
    if (out->map) {
        memset(out->map, 0, (size_t)size);
        return KVGEN_OK;
    }
    /* zero-fill so padding that kernels read (rows padded to 32) is 0 */
    st = kvg_vk_run_once(ctx, record_fill, out, err);
    if (st != KVGEN_OK) kvg_vk_buffer_destroy(ctx, out);
    return st;
}

void kvg_vk_buffer_destroy(kvg_vk_ctx *ctx, kvg_vk_buffer *b) {
    if (!ctx || !ctx->dev || !b) return;
    if (b->buf) vkDestroyBuffer(ctx->dev, b->buf, NULL);
    if (b->mem) vkFreeMemory(ctx->dev, b->mem, NULL);
    memset(b, 0, sizeof *b);
}

kvgen_status kvg_vk_mirror_create(kvg_vk_ctx *ctx, VkDeviceSize size, kvg_vk_mirror *out, kvgen_error *err) {
    *out = (kvg_vk_mirror){0};
    kvgen_status st;
    if (!ctx->force_staging && ctx->info.host_visible_device_local) {
        st = kvg_vk_buffer_create(ctx, size, KVG_VK_MEM_UPLOAD, &out->host, err);
        if (st != KVGEN_OK || out->host.map) return st;
        kvg_vk_buffer_destroy(ctx, &out->host); /* not mapped after all: the two-buffer form */
    }
    st = kvg_vk_buffer_create(ctx, size, KVG_VK_MEM_HOST, &out->host, err);
    if (st == KVGEN_OK && !out->host.map)
        st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: no host-visible memory for a %llu-byte buffer",
                      (unsigned long long)size);
    if (st == KVGEN_OK) st = kvg_vk_buffer_create(ctx, size, KVG_VK_MEM_DEVICE, &out->dev, err);
    if (st != KVGEN_OK) kvg_vk_mirror_destroy(ctx, out);
    return st;
}

void kvg_vk_mirror_destroy(kvg_vk_ctx *ctx, kvg_vk_mirror *m) {
    kvg_vk_buffer_destroy(ctx, &m->host);
    kvg_vk_buffer_destroy(ctx, &m->dev);
}

void kvg_vk_cmd_mirror(VkCommandBuffer cb, const kvg_vk_mirror *m) {
    if (!m->dev.buf) return;
    VkBufferCopy region = {.size = m->host.size};
    kvg_vk_cmd_transfer_barrier(cb);
    vkCmdCopyBuffer(cb, m->host.buf, m->dev.buf, 1, &region);
    kvg_vk_cmd_barrier(cb);
}

static kvgen_status staged_copy(kvg_vk_ctx *ctx, const kvg_vk_buffer *b, VkDeviceSize offset, void *host, size_t size,
                                bool to_device, kvgen_error *err) {
    kvg_vk_buffer staging;
    kvgen_status st = kvg_vk_buffer_create(ctx, size, KVG_VK_MEM_HOST, &staging, err);
    if (st != KVGEN_OK) return st;
    if (!staging.map) {
        kvg_vk_buffer_destroy(ctx, &staging);
        return kvg_fail(err, KVGEN_E_DEVICE, "vulkan: the staging buffer is not host-visible");
    }
    if (to_device) memcpy(staging.map, host, size);
    copy_args a = {.src = to_device ? staging.buf : b->buf,
                   .dst = to_device ? b->buf : staging.buf,
                   .region = {.srcOffset = to_device ? 0 : offset, .dstOffset = to_device ? offset : 0, .size = size}};
    st = kvg_vk_run_once(ctx, record_copy, &a, err);
    if (st == KVGEN_OK && !to_device) memcpy(host, staging.map, size);
    kvg_vk_buffer_destroy(ctx, &staging);
    return st;
}

kvgen_status kvg_vk_upload(kvg_vk_ctx *ctx, kvg_vk_buffer *b, VkDeviceSize offset, const void *data, size_t size,
                           kvgen_error *err) {
    if (offset + size > b->size)
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: upload of %zu bytes at %llu overflows a %llu-byte buffer",
                        size, (unsigned long long)offset, (unsigned long long)b->size);
    if (size == 0) return KVGEN_OK;
    if (b->map) {
        memcpy((char *)b->map + offset, data, size);
        return KVGEN_OK;
    }
    return staged_copy(ctx, b, offset, (void *)data, size, true, err);
}

kvgen_status kvg_vk_download(kvg_vk_ctx *ctx, const kvg_vk_buffer *b, VkDeviceSize offset, void *data, size_t size,
                             kvgen_error *err) {
    if (offset + size > b->size)
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: download of %zu bytes at %llu overflows a %llu-byte buffer",
                        size, (unsigned long long)offset, (unsigned long long)b->size);
    if (size == 0) return KVGEN_OK;
    if (b->map) {
        memcpy(data, (const char *)b->map + offset, size);
        return KVGEN_OK;
    }
    return staged_copy(ctx, b, offset, data, size, false, err);
}

/* ---- pipelines and descriptor sets ---- */

VkPipeline kvg_vk_pipeline_find(const kvg_vk_ctx *ctx, const char *shader, const uint32_t spec[KVG_SPEC_COUNT]) {
    for (int i = 0; i < ctx->n_pipes; i++)
        if (strcmp(ctx->pipes[i].name, shader) == 0 && memcmp(ctx->pipes[i].spec, spec, sizeof ctx->pipes[i].spec) == 0)
            return ctx->pipes[i].pipe;
    return VK_NULL_HANDLE;
}

/* What each shader asks of the device, mirroring its declarations (shaders/NAME.comp): the
 * workgroup size (fixed, or 0: the WG specialization constant) and the shared memory, in bytes:
 * base + per_wg * WG + per_wg_gq * WG * GQ * TQ + per_wg_rc * WG * ROWS * NCOLS
 * + per_gq_hd * GQ * TQ * HD + per_rows * ROWS + per_cols * NCOLS (GQ * TQ: attention's query
 * rows, TQ 0 counting as 1; ROWS x NCOLS: the gemm's tile).
 * A name ending in '_' stands for every weight type's variant (matvec_q4_0, ...). */
static const struct shader_needs {
    const char *name;
    uint32_t wg, base, per_wg, per_wg_gq, per_wg_rc, per_gq_hd, per_rows, per_cols;
} shader_needs[] = {
    {"argmax", 0, 0, 8, 0, 0, 0, 0, 0},                      /* best_k, best_i[WG] */
    {"topk", 0, 0, 64 * 8 + 4, 0, 0, 0, 0, 0},               /* lk, li[WG * K], lcount[WG]; K = 64 */
    {"attn", 0, 0, 8, 8, 0, 4, 0, 0},                        /* sc, pr[rows * WG], v_slab, v_elem[WG], qs[rows * HD] */
    {"attn_sg", 0, 0, 8, 12, 0, 4, 0, 0},                    /* sg_max, sg_sum, pr[rows * WG], v_slab, v_elem[WG], qs */
    {"attn_lane", 0, 0, 0, 0, 0, 0, 0, 0},                   /* none */
    {"attn_reduce", 64, 0, 0, 0, 0, 0, 0, 0},                /* none */
    {"kv_copy", 64, 0, 0, 0, 0, 0, 0, 0},                    /* none */
    {"kv_store", 64, 0, 0, 0, 0, 0, 0, 0},                   /* none */
    {"rms_norm", 0, 0, 4, 0, 0, 0, 0, 0},                    /* red[WG] */
    {"layer_norm", 0, 0, 4, 0, 0, 0, 0, 0},                  /* red[WG] */
    {"enc_attn", 0, 0, 0, 0, 0, 0, 0, 0},                    /* none */
    {"lora", 0, 0, 4, 0, 0, 0, 0, 0},                        /* red[WG] */
    {"embed_", 0, 0, 0, 0, 0, 0, 0, 0},                      /* none */
    {"matvec_", 0, 0, 0, 0, 4, 0, 0, 0},                     /* red[WG * ROWS * NCOLS] */
    {"gemm_dot_", 128, 128 * 4, 0, 0, 0, 0, 48, 52},         /* ssum[128]; wsq[8][ROWS], wdm; xsq[8][NCOLS], xsd, tscale */
    {"gemm_cm_", 0, 4096, 4, 0, 0, 0, 320, 352},             /* cout <= 4 x 16 x 16; ssum; wa[4 M][40]; xb[4 N][40] */
    {"gemm_h_", 128, 128 * 4, 0, 0, 0, 0, 128, 128 + 4},     /* ssum[128]; wh[2][32][ROWS / 2]; xh[2][32][NCOLS / 2], tscale */
    {"gemm_", 128, 128 * 4, 0, 0, 0, 0, 32 * 4, 32 * 4 + 4}, /* ssum[128]; ws[32][ROWS]; xs[32][NCOLS], tscale */
    {"probe_read", 64, 64 * 4, 0, 0, 0, 0, 0, 0},            /* red[64] */
    {"probe_empty", 1, 0, 0, 0, 0, 0, 0, 0},
};

kvgen_status kvg_vk_shader_limits(const char *shader, const uint32_t spec[KVG_SPEC_COUNT], uint32_t *invocations,
                                  uint64_t *shared, kvgen_error *err) {
    for (size_t i = 0; i < sizeof shader_needs / sizeof shader_needs[0]; i++) {
        const struct shader_needs *n = &shader_needs[i];
        size_t len = strlen(n->name);
        bool family = n->name[len - 1] == '_';
        if (family ? strncmp(shader, n->name, len) != 0 : strcmp(shader, n->name) != 0) continue;
        uint64_t wg = n->wg ? n->wg : spec[KVG_SPEC_WG];
        uint64_t rows_q = (uint64_t)spec[KVG_SPEC_GQ] * (spec[KVG_SPEC_TQ] ? spec[KVG_SPEC_TQ] : 1);
        *invocations = (uint32_t)wg;
        *shared = n->base + wg * n->per_wg + wg * rows_q * n->per_wg_gq +
                  wg * (uint64_t)spec[KVG_SPEC_ROWS] * spec[KVG_SPEC_NCOLS] * n->per_wg_rc +
                  rows_q * spec[KVG_SPEC_HD] * n->per_gq_hd + (uint64_t)spec[KVG_SPEC_ROWS] * n->per_rows +
                  (uint64_t)spec[KVG_SPEC_NCOLS] * n->per_cols;
        return KVGEN_OK;
    }
    return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: shader %s has no entry in the shader limits table", shader);
}

kvgen_status kvg_vk_shader_fits(const kvg_vk_ctx *ctx, const char *shader, const uint32_t spec[KVG_SPEC_COUNT],
                                kvgen_error *err) {
    uint32_t inv = 0;
    uint64_t shared = 0;
    kvgen_status st = kvg_vk_shader_limits(shader, spec, &inv, &shared, err);
    if (st != KVGEN_OK) return st;
    const VkPhysicalDeviceLimits *l = &ctx->props.limits;
    if (inv == 0 || inv > l->maxComputeWorkGroupInvocations || inv > l->maxComputeWorkGroupSize[0])
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "vulkan: shader %s needs workgroups of %u invocations; device %s allows %u "
                        "(maxComputeWorkGroupInvocations), %u in x (maxComputeWorkGroupSize)",
                        shader, inv, ctx->info.name, l->maxComputeWorkGroupInvocations,
                        l->maxComputeWorkGroupSize[0]);
    if (shared > l->maxComputeSharedMemorySize)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "vulkan: shader %s (workgroup size %u) needs %llu bytes of shared memory; device %s allows %u "
                        "(maxComputeSharedMemorySize)",
                        shader, inv, (unsigned long long)shared, ctx->info.name, l->maxComputeSharedMemorySize);
    return KVGEN_OK;
}

bool kvg_vk_fit_wg(const kvg_vk_ctx *ctx, const char *shader, uint32_t spec[KVG_SPEC_COUNT], uint32_t min_wg) {
    for (;;) {
        if (kvg_vk_shader_fits(ctx, shader, spec, NULL) == KVGEN_OK) return true;
        if (spec[KVG_SPEC_WG] / 2 < min_wg || spec[KVG_SPEC_WG] < 2) return false;
        spec[KVG_SPEC_WG] /= 2;
    }
}

bool kvg_vk_one_subgroup(const kvg_vk_ctx *ctx, const char *shader, const uint32_t spec[KVG_SPEC_COUNT]) {
    uint32_t wg = spec[KVG_SPEC_WG];
    bool one_sg_kernel = strncmp(shader, "matvec_sg_", 10) == 0 || strncmp(shader, "matvec_dot_", 11) == 0;
    return ctx->sg_size_control && one_sg_kernel && wg == ctx->info.subgroup_size && wg >= ctx->sg_min &&
           wg <= ctx->sg_max && (wg & (wg - 1)) == 0;
}

kvgen_status kvg_vk_pipeline_get(kvg_vk_ctx *ctx, const char *shader, const uint32_t spec[KVG_SPEC_COUNT],
                                 VkPipeline *out, kvgen_error *err) {
    *out = kvg_vk_pipeline_find(ctx, shader, spec);
    if (*out) return KVGEN_OK;
    bool matrix = strncmp(shader, "gemm_cm_", 8) == 0;
    if (matrix && !ctx->coopmat)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "vulkan: shader %s needs cooperative matrices (VK_KHR_cooperative_matrix), not enabled on "
                        "device %s",
                        shader, ctx->info.name);
    if (strstr(shader, "_dot_") && !ctx->int_dot)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "vulkan: shader %s needs integer dot products (shaderIntegerDotProduct), not enabled on "
                        "device %s",
                        shader, ctx->info.name);
    kvgen_status fit = kvg_vk_shader_fits(ctx, shader, spec, err);
    if (fit != KVGEN_OK) return fit;
    const kvg_shader_blob *blob = kvg_shader_find(shader);
    if (!blob) return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: shader %s is not embedded", shader);
    if (strlen(shader) >= sizeof ctx->pipes[0].name)
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: shader name %s is too long", shader);
    if (ctx->n_pipes == ctx->cap_pipes) {
        int cap = ctx->cap_pipes ? ctx->cap_pipes * 2 : 32;
        kvg_vk_pipeline *p = kvg_realloc(ctx->pipes, (size_t)cap * sizeof *p);
        if (!p) return kvg_fail(err, KVGEN_E_NO_MEMORY, "vulkan: out of memory for pipelines");
        ctx->pipes = p;
        ctx->cap_pipes = cap;
    }
    VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                   .codeSize = blob->size,
                                   .pCode = blob->code};
    VkShaderModule mod;
    VKCHECK(vkCreateShaderModule(ctx->dev, &mi, NULL, &mod), "vkCreateShaderModule");
    VkSpecializationMapEntry entries[KVG_SPEC_COUNT];
    for (uint32_t i = 0; i < KVG_SPEC_COUNT; i++)
        entries[i] = (VkSpecializationMapEntry){.constantID = i, .offset = i * 4, .size = 4};
    VkSpecializationInfo si = {.mapEntryCount = KVG_SPEC_COUNT,
                               .pMapEntries = entries,
                               .dataSize = KVG_SPEC_COUNT * 4,
                               .pData = spec};
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .flags = VK_PIPELINE_CREATE_DISPATCH_BASE_BIT, /* large dispatches are split (kvg_vk_cmd_dispatch_at) */
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = mod,
                  .pName = "main",
                  .pSpecializationInfo = &si},
        .layout = ctx->pipe_layout};
    VkPipelineShaderStageRequiredSubgroupSizeCreateInfoEXT rs = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO_EXT,
        .requiredSubgroupSize = spec[KVG_SPEC_WG]};
    if (matrix) rs.requiredSubgroupSize = ctx->info.subgroup_size; /* four full subgroups */
    if (matrix || kvg_vk_one_subgroup(ctx, shader, spec)) {
        ci.stage.pNext = &rs;
        ci.stage.flags = VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT_EXT;
    }
    VkPipeline pipe;
    VkResult r = vkCreateComputePipelines(ctx->dev, ctx->pcache.cache, 1, &ci, NULL, &pipe);
    vkDestroyShaderModule(ctx->dev, mod, NULL);
    if (r != VK_SUCCESS)
        return kvg_fail(err, KVGEN_E_DEVICE, "vulkan: creating the %s pipeline failed: %s", shader,
                        kvg_vk_result_name(r));
    ctx->pcache.created++;
    kvg_vk_pipeline *p = &ctx->pipes[ctx->n_pipes++];
    snprintf(p->name, sizeof p->name, "%s", shader);
    memcpy(p->spec, spec, sizeof p->spec);
    p->pipe = pipe;
    *out = pipe;
    return ctx->on_pipeline ? ctx->on_pipeline(ctx->on_pipeline_user, ctx->n_pipes, err) : KVGEN_OK;
}

kvgen_status kvg_vk_pool_create(kvg_vk_ctx *ctx, uint32_t max_sets, VkDescriptorPool *out, kvgen_error *err) {
    VkDescriptorPoolSize size[3] = {
        {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = max_sets * KVG_VK_SSBO_DESCRIPTORS},
        {.type = VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER_DYNAMIC, .descriptorCount = max_sets},
        {.type = VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER, .descriptorCount = max_sets}};
    VkDescriptorPoolCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                     .maxSets = max_sets,
                                     .poolSizeCount = 3,
                                     .pPoolSizes = size};
    VKCHECK(vkCreateDescriptorPool(ctx->dev, &ci, NULL, out), "vkCreateDescriptorPool");
    return KVGEN_OK;
}

kvgen_status kvg_vk_set_create(kvg_vk_ctx *ctx, VkDescriptorPool pool, const kvg_vk_binding b[KVG_VK_BINDINGS],
                               VkDescriptorSet *out, kvgen_error *err) {
    VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                      .descriptorPool = pool,
                                      .descriptorSetCount = 1,
                                      .pSetLayouts = &ctx->set_layout};
    VKCHECK(vkAllocateDescriptorSets(ctx->dev, &ai, out), "vkAllocateDescriptorSets");
    VkDescriptorBufferInfo bi[KVG_VK_BINDINGS];
    VkWriteDescriptorSet w[KVG_VK_BINDINGS];
    VkDeviceSize max_range = ctx->props.limits.maxStorageBufferRange;
    for (uint32_t i = 0; i < KVG_VK_BINDINGS; i++) {
        const kvg_vk_buffer *buf = b[i].buf ? b[i].buf : &ctx->dummy;
        VkDeviceSize off = b[i].buf ? b[i].offset : 0;
        VkDeviceSize range = b[i].buf && b[i].range ? b[i].range : buf->size - off;
        if (range > max_range) range = max_range;
        /* uniform windows: callers size these buffers so a full window fits after any offset */
        if (i == KVG_VK_UBO_X || i == KVG_VK_UBO_NORM) range = range < ctx->ubo_window ? range : ctx->ubo_window;
        uint32_t binding, element;
        slot_binding(i, &binding, &element);
        bi[i] = (VkDescriptorBufferInfo){.buffer = buf->buf, .offset = off, .range = range};
        w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                      .dstSet = *out,
                                      .dstBinding = binding,
                                      .dstArrayElement = element,
                                      .descriptorCount = 1,
                                      .descriptorType = binding_type(binding),
                                      .pBufferInfo = &bi[i]};
    }
    vkUpdateDescriptorSets(ctx->dev, KVG_VK_BINDINGS, w, 0, NULL);
    return KVGEN_OK;
}

/* ---- commands ---- */

kvgen_status kvg_vk_cmd_alloc(kvg_vk_ctx *ctx, VkCommandBuffer *out, kvgen_error *err) {
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                      .commandPool = ctx->cmd_pool,
                                      .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                      .commandBufferCount = 1};
    VKCHECK(vkAllocateCommandBuffers(ctx->dev, &ai, out), "vkAllocateCommandBuffers");
    return KVGEN_OK;
}

kvgen_status kvg_vk_cmd_begin(VkCommandBuffer cb, bool one_time, kvgen_error *err) {
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = one_time ? VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT : 0};
    VKCHECK(vkBeginCommandBuffer(cb, &bi), "vkBeginCommandBuffer");
    return KVGEN_OK;
}

kvgen_status kvg_vk_cmd_end(VkCommandBuffer cb, kvgen_error *err) {
    VKCHECK(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
    return KVGEN_OK;
}

/* the contexts this thread holds the lock of, and how many times (a thread holds one or two) */
#define HELD_MAX 4
static _Thread_local struct {
    const kvg_vk_ctx *ctx;
    int depth;
} held[HELD_MAX];

void kvg_vk_lock(kvg_vk_ctx *ctx) {
    int free_slot = -1;
    for (int i = 0; i < HELD_MAX; i++) {
        if (held[i].ctx == ctx) {
            held[i].depth++;
            return;
        }
        if (!held[i].ctx && free_slot < 0) free_slot = i;
    }
    kvg_mutex_lock(&ctx->lock);
    if (free_slot >= 0) { /* more contexts at once than slots: the lock is taken, just not re-entrant */
        held[free_slot].ctx = ctx;
        held[free_slot].depth = 1;
    }
}

void kvg_vk_unlock(kvg_vk_ctx *ctx) {
    for (int i = 0; i < HELD_MAX; i++)
        if (held[i].ctx == ctx) {
            if (--held[i].depth > 0) return;
            held[i].ctx = NULL;
            break;
        }
    kvg_mutex_unlock(&ctx->lock);
}

kvgen_status kvg_vk_run_once(kvg_vk_ctx *ctx, kvgen_status (*record)(VkCommandBuffer cb, void *arg), void *arg,
                             kvgen_error *err) {
    kvg_vk_lock(ctx);
    VkCommandBuffer cb;
    kvgen_status st = kvg_vk_cmd_alloc(ctx, &cb, err);
    if (st == KVGEN_OK) {
        st = kvg_vk_cmd_begin(cb, true, err);
        if (st == KVGEN_OK) {
            kvgen_status rec = record(cb, arg);
            kvg_vk_cmd_host_barrier(cb);
            st = kvg_vk_cmd_end(cb, err);
            if (rec != KVGEN_OK) st = rec;
            else if (st == KVGEN_OK) st = kvg_vk_submit_wait(ctx, cb, ctx->fence, err);
        }
        vkFreeCommandBuffers(ctx->dev, ctx->cmd_pool, 1, &cb);
    }
    kvg_vk_unlock(ctx);
    return st;
}

kvgen_status kvg_vk_copy(kvg_vk_ctx *ctx, const kvg_vk_buffer *src, const kvg_vk_buffer *dst, VkDeviceSize offset,
                         VkDeviceSize size, kvgen_error *err) {
    if (offset + size > src->size || offset + size > dst->size)
        return kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: a copy of %llu bytes at %llu overflows its buffers",
                        (unsigned long long)size, (unsigned long long)offset);
    copy_args a = {.src = src->buf, .dst = dst->buf, .region = {.srcOffset = offset, .dstOffset = offset, .size = size}};
    return kvg_vk_run_once(ctx, record_copy, &a, err);
}

void kvg_vk_cmd_dispatch(kvg_vk_ctx *ctx, VkCommandBuffer cb, VkPipeline pipe, VkDescriptorSet set, const void *pc,
                         uint32_t pc_size, uint32_t gx, uint32_t gy, uint32_t gz) {
    kvg_vk_cmd_dispatch_at(ctx, cb, pipe, set, pc, pc_size, 0, gx, gy, gz);
}

void kvg_vk_cmd_dispatch_at(kvg_vk_ctx *ctx, VkCommandBuffer cb, VkPipeline pipe, VkDescriptorSet set, const void *pc,
                            uint32_t pc_size, uint32_t ubo_offset, uint32_t gx, uint32_t gy, uint32_t gz) {
    vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, ctx->pipe_layout, 0, 1, &set, 1, &ubo_offset);
    if (pc_size) vkCmdPushConstants(cb, ctx->pipe_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, pc_size, pc);
    const uint32_t *max = ctx->props.limits.maxComputeWorkGroupCount;
    if (gx <= max[0] && gy <= max[1] && gz <= max[2]) {
        vkCmdDispatch(cb, gx, gy, gz);
        return;
    }
    /* past maxComputeWorkGroupCount: pieces of at most the limit in each dimension, each starting
     * at its base group, so gl_WorkGroupID is the same as in one dispatch (no shader reads
     * gl_NumWorkGroups); a barrier between pieces orders their writes to the same buffers */
    atomic_fetch_add(&ctx->split_dispatches, 1);
    bool first = true;
    for (uint32_t z = 0; z < gz; z += max[2])
        for (uint32_t y = 0; y < gy; y += max[1])
            for (uint32_t x = 0; x < gx; x += max[0]) {
                if (!first) kvg_vk_cmd_barrier(cb);
                first = false;
                vkCmdDispatchBase(cb, x, y, z, gx - x < max[0] ? gx - x : max[0], gy - y < max[1] ? gy - y : max[1],
                                  gz - z < max[2] ? gz - z : max[2]);
            }
}

void kvg_vk_cmd_barrier(VkCommandBuffer cb) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
}

void kvg_vk_cmd_transfer_barrier(VkCommandBuffer cb) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT};
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
}

void kvg_vk_cmd_host_barrier(VkCommandBuffer cb) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
}

kvgen_status kvg_vk_submit_wait(kvg_vk_ctx *ctx, VkCommandBuffer cb, VkFence fence, kvgen_error *err) {
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cb};
    VKCHECK(vkQueueSubmit(ctx->queue, 1, &si, fence), "vkQueueSubmit");
    VKCHECK(vkWaitForFences(ctx->dev, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
    VKCHECK(vkResetFences(ctx->dev, 1, &fence), "vkResetFences");
    return KVGEN_OK;
}
