/* kvg_vk_bench.h: the Vulkan device's own ceiling, measured with probe shaders (private; the
 * public door is kvgen_device_probe in kvgen.h, which api.c routes here through the backend
 * registry). */
#ifndef KVG_VK_BENCH_H
#define KVG_VK_BENCH_H
#include "kvgen.h"

/* Runs the probes on the device desc->device names (NULL: KVGEN_DEVICE or the default). Reads
 * a buffer of desc->read_mib MiB (0: 64) desc->reps times (0: 5) and times desc->dispatches
 * empty dispatches (0: 1000) in one command buffer; reports the best repetition of each.
 * desc must not be NULL; negative fields are taken as 0. */
kvgen_status kvg_vk_probe_run(const kvgen_probe_desc *desc, kvgen_probe_result *out, kvgen_error *err);
#endif
