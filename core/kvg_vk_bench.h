/* kvg_vk_bench.h: the Vulkan device's own ceiling, measured with probe shaders (private; for
 * `kvgen bench`). */
#ifndef KVG_VK_BENCH_H
#define KVG_VK_BENCH_H
#include "kvgen.h"

typedef struct kvg_vk_probe {
    char device[256];
    double read_gbps;         /* streaming read bandwidth, GB/s (1e9 bytes) */
    double dispatch_us;       /* cost of one empty dispatch plus barrier, microseconds */
    unsigned long long bytes; /* bytes read per repetition */
} kvg_vk_probe;

/* Runs the probes on the device `device` names (NULL: KVGEN_DEVICE or the default). Reads a
 * buffer of `mib` MiB (0: 64) `reps` times (0: 5) and times `dispatches` empty dispatches
 * (0: 1000) in one command buffer; reports the best repetition of each. */
kvgen_status kvg_vk_probe_run(const char *device, int mib, int reps, int dispatches, kvg_vk_probe *out,
                              kvgen_error *err);
#endif
