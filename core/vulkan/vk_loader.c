/* vk_loader.c: kvgen's Vulkan loader (kvg_vk_loader.h). The library is opened once per process
 * and never closed: the entry points it hands out stay valid for every later model. */
#define _POSIX_C_SOURCE 200809L
#include "kvg_platform.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_vk_loader.h"

#define KVG_VK_DEFINE(name) PFN_##name kvg_##name;
PFN_vkGetInstanceProcAddr kvg_vkGetInstanceProcAddr;
KVG_VK_GLOBAL_FUNCS(KVG_VK_DEFINE)
KVG_VK_INSTANCE_FUNCS(KVG_VK_DEFINE)
#undef KVG_VK_DEFINE

/* ---- the platform part: one shared library, one symbol ---- */

#if defined(_WIN32)
#define KVG_VK_LIBRARY "vulkan-1.dll"
#elif defined(__APPLE__)
#define KVG_VK_LIBRARY "libvulkan.1.dylib"
#else
#define KVG_VK_LIBRARY "libvulkan.so.1"
#endif

void *kvg_vk_lib_open(const char *name, char *why, size_t why_size) { return kvg_dl_open(name, why, why_size); }

PFN_vkGetInstanceProcAddr kvg_vk_lib_gipa(void *lib) {
    return (PFN_vkGetInstanceProcAddr)kvg_dl_sym(lib, "vkGetInstanceProcAddr");
}

/* ---- loading ---- */

static kvg_mutex load_lock = KVG_MUTEX_INIT;
static void *loader_lib;                /* the opened library; NULL with a host's vkGetInstanceProcAddr */
static bool global_done, instance_done;

static kvgen_status resolve_global(kvgen_error *err) {
#define KVG_VK_RESOLVE(name)                                                                         \
    kvg_##name = (PFN_##name)kvg_vkGetInstanceProcAddr(NULL, #name);                                \
    if (!kvg_##name)                                                                                 \
        return kvg_fail(err, KVGEN_E_DEVICE, "vulkan: the Vulkan loader lacks %s", #name);
    KVG_VK_GLOBAL_FUNCS(KVG_VK_RESOLVE)
#undef KVG_VK_RESOLVE
    return KVGEN_OK;
}

kvgen_status kvg_vk_load(PFN_vkGetInstanceProcAddr host_gipa, kvgen_error *err) {
    kvg_mutex_lock(&load_lock);
    kvgen_status st = KVGEN_OK;
    if (global_done) {
        if (host_gipa && host_gipa != kvg_vkGetInstanceProcAddr) {
            void *p = NULL;
            memcpy(&p, &host_gipa, sizeof p < sizeof host_gipa ? sizeof p : sizeof host_gipa);
            st = kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                          "kvgen_model_load: desc.vk_get_instance_proc_addr %p differs from the vkGetInstanceProcAddr "
                          "kvgen already uses in this process (one Vulkan loader per process)", p);
        }
        kvg_mutex_unlock(&load_lock);
        return st;
    }
    if (host_gipa) {
        kvg_vkGetInstanceProcAddr = host_gipa;
    } else {
        const char *name = getenv("KVGEN_VULKAN_LOADER");
        if (name && strcmp(name, "none") == 0) {
            st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: no Vulkan loader (KVGEN_VULKAN_LOADER=none hides it)");
            goto done;
        }
        if (!name || !*name) name = KVG_VK_LIBRARY;
        char why[256] = "";
        void *h = kvg_vk_lib_open(name, why, sizeof why);
        if (!h) {
            st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: no Vulkan loader: %s", why);
            goto done;
        }
        PFN_vkGetInstanceProcAddr gipa = kvg_vk_lib_gipa(h);
        if (!gipa) {
            st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: %s has no vkGetInstanceProcAddr", name);
            goto done; /* the library stays open: closing it could unload what a host still uses */
        }
        loader_lib = h;
        kvg_vkGetInstanceProcAddr = gipa;
    }
    st = resolve_global(err);
    if (st == KVGEN_OK) global_done = true;
    else kvg_vkGetInstanceProcAddr = NULL;
done:
    kvg_mutex_unlock(&load_lock);
    return st;
}

kvgen_status kvg_vk_load_instance(VkInstance instance, kvgen_error *err) {
    kvg_mutex_lock(&load_lock);
    kvgen_status st = KVGEN_OK;
    if (!global_done) {
        st = kvg_fail(err, KVGEN_E_INTERNAL, "vulkan: kvg_vk_load_instance before kvg_vk_load");
    } else if (!instance_done) {
#define KVG_VK_RESOLVE(name)                                                                         \
    if (st == KVGEN_OK) {                                                                            \
        kvg_##name = (PFN_##name)kvg_vkGetInstanceProcAddr(instance, #name);                        \
        if (!kvg_##name) st = kvg_fail(err, KVGEN_E_DEVICE, "vulkan: the Vulkan loader lacks %s", #name); \
    }
        KVG_VK_INSTANCE_FUNCS(KVG_VK_RESOLVE)
#undef KVG_VK_RESOLVE
        instance_done = st == KVGEN_OK;
    }
    kvg_mutex_unlock(&load_lock);
    return st;
}
