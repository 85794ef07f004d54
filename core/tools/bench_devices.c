/* bench_devices.c: `kvgen devices`, the Vulkan devices kvgen can run on and what each offers. */
#include <stdlib.h>
#include <string.h>
#include "bench_internal.h"
#include "bench.h"

int kvgen_cli_devices(int argc, char **argv) {
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: kvgen devices   lists the Vulkan devices kvgen can run on\n");
            return 0;
        }
        fprintf(stderr, "kvgen devices: unexpected argument '%s'\nusage: kvgen devices\n", argv[i]);
        return 2;
    }
    kvgen_error err = {0};
    int count = 0;
    if (kvgen_devices(NULL, 0, &count, &err) != KVGEN_OK) {
        fprintf(stderr, "kvgen devices: %s\n", err.message);
        return 1;
    }
    kvgen_device_info *dev = count > 0 ? calloc((size_t)count, sizeof *dev) : NULL;
    if (count > 0 && !dev) {
        fprintf(stderr, "kvgen devices: out of memory\n");
        return 1;
    }
    int cap = count;
    if (count > 0 && kvgen_devices(dev, cap, &count, &err) != KVGEN_OK) {
        fprintf(stderr, "kvgen devices: %s\n", err.message);
        free(dev);
        return 1;
    }
    if (count > cap) count = cap; /* a device appeared between the two calls */
    if (count == 0) {
        int device_backend = 0; /* this kvgen has a backend that runs on a Vulkan device */
        const kvgen_backend_info *known;
        int n_known = bench_backends(&known);
        for (int i = 0; i < n_known; i++) device_backend |= known[i].available && known[i].uses_device;
        if (device_backend) printf("no Vulkan devices (no driver, or none with Vulkan 1.1 and a compute queue)\n");
        else printf("no Vulkan devices: this kvgen was built without the Vulkan backend\n");
    }
    for (int i = 0; i < count; i++) {
        const kvgen_device_info *d = &dev[i];
        printf("%d: %s%s\n", d->index, d->name, d->is_default ? "  [default]" : "");
        printf("   type %s, Vulkan %u.%u.%u, vendor 0x%04x, device 0x%04x\n", d->type ? d->type : "other",
               (unsigned)((d->api_version >> 22) & 0x7f), (unsigned)((d->api_version >> 12) & 0x3ff),
               (unsigned)(d->api_version & 0xfff), (unsigned)d->vendor_id, (unsigned)d->device_id);
        printf("   memory: %.1f GiB device-local%s, max allocation %.1f GiB, max storage buffer range %.0f MiB\n",
               (double)d->device_local_bytes / (1 << 30), d->host_visible_device_local ? " (host-visible)" : "",
               (double)d->max_allocation_size / (1 << 30), (double)d->max_storage_buffer_range / (1 << 20));
        printf("   features: fp16 arithmetic %s, 16-bit storage %s, 8-bit storage %s, subgroup size %u%s, "
               "shared memory %u KiB\n",
               d->shader_float16 ? "yes" : "no", d->storage_16bit ? "yes" : "no", d->storage_8bit ? "yes" : "no",
               (unsigned)d->subgroup_size, d->subgroup_arithmetic ? " (arithmetic)" : "",
               (unsigned)(d->max_shared_memory / 1024));
        if (d->compute_units) printf("   compute units: %u\n", (unsigned)d->compute_units);
        else printf("   compute units: not reported by the driver\n");
        if (d->coopmat_m)
            printf("   cooperative matrices: %ux%ux%u (usable by the prefill GEMM)\n", (unsigned)d->coopmat_m,
                   (unsigned)d->coopmat_n, (unsigned)d->coopmat_k);
        else printf("   cooperative matrices: none kvgen can use\n");
        printf("   8-bit integer dot products: %s\n",
               !d->int_dot        ? "no"
               : d->int_dot_fast ? "yes, reported fast (activation_bits 8 takes them)"
                                 : "yes, not reported fast (activation_bits 8 keeps f32 activations; KVGEN_VK_DOT=1)");
    }
    free(dev);
    return 0;
}
