/* devices_stub.c: kvgen_devices in builds without the Vulkan backend (KVGEN_VULKAN=OFF or no
 * Vulkan SDK), so hosts and the CLI can call it unconditionally. Such a build can see no
 * device, which is the same answer as "no Vulkan driver": count 0 and KVGEN_OK, not an error
 * (kvgen.h). The Vulkan build's version lives in vk_device.c. */
#include "kvg_model.h"

#ifndef KVGEN_HAVE_VULKAN
kvgen_status kvgen_devices(kvgen_device_info *out, int cap, int *count, kvgen_error *err) {
    if (!count) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_devices: count is NULL");
    *count = 0;
    if (cap < 0 || (cap > 0 && !out))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_devices: out is NULL or cap %d is negative", cap);
    return KVGEN_OK;
}
#else
/* ISO C wants at least one declaration in a translation unit */
typedef int kvg_devices_stub_unused;
#endif
