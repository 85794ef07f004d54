/* test_backends.c: the backend registry as the public API shows it. kvgen_backends lists every
 * backend kvgen knows with the reference among them; its names and order are what
 * KVGEN_BACKEND accepts and what a bad value lists; each available backend loads under its
 * own name; a default load falls back from a device backend that cannot start to the next row,
 * but not under KVGEN_VALIDATE=1, and passes over Vulkan for the cpu backend when Vulkan's
 * device is the CPU itself (lavapipe); kvgen_device_probe checks its arguments and measures
 * something positive where a device backend runs (else says it is not built). */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include "testutil.h"

static int contains(const char *s, const char *what) { return s && strstr(s, what) != NULL; }

/* the registry as listed */
static kvgen_backend_info backends[16];
static int n_backends;

static const kvgen_backend_info *find_backend(kvgen_backend b) {
    for (int i = 0; i < n_backends; i++)
        if (backends[i].backend == b) return &backends[i];
    return NULL;
}

static void test_list(void) {
    n_backends = kvgen_backends(NULL, 0);
    CHECKF(n_backends >= 1 && n_backends <= 16, "%d backends", n_backends);
    if (n_backends < 1 || n_backends > 16) {
        n_backends = 0;
        return;
    }
    kvgen_backend_info one[1];
    CHECK(kvgen_backends(one, 1) == n_backends); /* a short buffer still gets the count */
    CHECK(kvgen_backends(backends, 16) == n_backends);
    CHECK(one[0].backend == backends[0].backend && strcmp(one[0].name, backends[0].name) == 0);
    for (int i = 0; i < n_backends; i++) {
        const kvgen_backend_info *b = &backends[i];
        CHECKF(b->name && *b->name, "backend %d has no name", i);
        CHECKF(b->backend != KVGEN_BACKEND_DEFAULT, "%s: the default is not a backend", b->name);
        CHECKF(b->available ? b->missing == NULL : b->missing && *b->missing, "%s: available %d, missing %s", b->name,
               b->available, b->missing ? b->missing : "(null)");
        for (int k = 0; k < i; k++)
            CHECKF(backends[k].backend != b->backend && strcmp(backends[k].name, b->name) != 0,
                   "%s is listed twice", b->name);
        printf("backend %d: %s%s%s%s\n", i, b->name, b->available ? "" : " (not built)",
               b->uses_device ? ", device" : "", b->uses_threads ? ", threads" : "");
    }
    const kvgen_backend_info *ref = find_backend(KVGEN_BACKEND_REFERENCE);
    CHECK(ref && ref->available && strcmp(ref->name, "reference") == 0 && ref->uses_threads && !ref->uses_device);
    const kvgen_backend_info *vk = find_backend(KVGEN_BACKEND_VULKAN);
    CHECK(vk && strcmp(vk->name, "vulkan") == 0 && vk->uses_device);
    /* the order: Vulkan, then the host backends, the cpu one before the reference, which runs
     * everything and is the last resort of a default load */
    CHECK(n_backends == 3 && backends[0].backend == KVGEN_BACKEND_VULKAN && backends[1].backend == KVGEN_BACKEND_CPU &&
          backends[2].backend == KVGEN_BACKEND_REFERENCE);
}

/* KVGEN_BACKEND accepts exactly the registry's names; a bad one lists them all, in order */
static void test_env_parsing(const char *path) {
    kvgen_error err = {0};
    kvgen_model *m = NULL;
    kvgen_model_desc dflt = {.path = path, .n_threads = 1};
    setenv("KVGEN_BACKEND", "quantum", 1);
    CHECK(kvgen_model_load(&dflt, &m, &err) == KVGEN_E_INVALID_ARGUMENT && m == NULL);
    CHECKF(contains(err.message, "KVGEN_BACKEND=quantum"), "%s", err.message);
    const char *at = err.message;
    for (int i = 0; i < n_backends; i++) {
        char quoted[64];
        snprintf(quoted, sizeof quoted, "\"%s\"", backends[i].name);
        const char *hit = strstr(at, quoted);
        CHECKF(hit != NULL, "the message does not list %s after position %d: %s", quoted, (int)(at - err.message),
               err.message);
        if (hit) at = hit + strlen(quoted);
    }
    /* a name is matched whole, not as a prefix */
    setenv("KVGEN_BACKEND", "ref", 1);
    CHECK(kvgen_model_load(&dflt, &m, &err) == KVGEN_E_INVALID_ARGUMENT && m == NULL);
    setenv("KVGEN_BACKEND", "reference ", 1);
    CHECK(kvgen_model_load(&dflt, &m, &err) == KVGEN_E_INVALID_ARGUMENT && m == NULL);

    /* every listed name is accepted: available ones load as themselves; one this build lacks
     * is refused as unsupported, naming what is missing */
    for (int i = 0; i < n_backends; i++) {
        const kvgen_backend_info *b = &backends[i];
        if (b->uses_device && b->available) continue; /* loaded below, where a device may be absent */
        setenv("KVGEN_BACKEND", b->name, 1);
        kvgen_status st = kvgen_model_load(&dflt, &m, &err);
        if (b->available) {
            CHECKF(st == KVGEN_OK, "KVGEN_BACKEND=%s: %s", b->name, err.message);
            kvgen_model_info info;
            kvgen_model_get_info(m, &info);
            CHECKF(m && strcmp(info.backend, b->name) == 0, "KVGEN_BACKEND=%s loaded %s", b->name,
                   m ? info.backend : "nothing");
        } else {
            CHECKF(st == KVGEN_E_UNSUPPORTED && contains(err.message, b->missing), "KVGEN_BACKEND=%s: %s: %s", b->name,
                   kvgen_status_name(st), err.message);
            /* and so is asking for it through the desc */
            kvgen_model_desc md = {.path = path, .backend = b->backend};
            CHECK(kvgen_model_load(&md, &m, &err) == KVGEN_E_UNSUPPORTED && m == NULL);
        }
        kvgen_model_unload(m);
        m = NULL;
    }
    unsetenv("KVGEN_BACKEND");
    /* the desc wins over the environment, which is then not even parsed */
    setenv("KVGEN_BACKEND", "quantum", 1);
    kvgen_model_desc ref = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 1};
    CHECK_OK(kvgen_model_load(&ref, &m, &err));
    kvgen_model_unload(m);
    m = NULL;
    unsetenv("KVGEN_BACKEND");
    /* a value outside the enum is refused before anything is opened */
    kvgen_model_desc bad = {.path = path, .backend = (kvgen_backend)99};
    CHECK(kvgen_model_load(&bad, &m, &err) == KVGEN_E_INVALID_ARGUMENT && contains(err.message, "desc.backend 99"));
}

/* A default load whose device backend cannot start (no such device) takes the next row; with
 * KVGEN_VALIDATE=1 it fails instead of passing a validated run on the CPU. */
static void test_fallback(const char *path) {
    const kvgen_backend_info *first = n_backends ? &backends[0] : NULL;
    if (!first || !first->available || !first->uses_device) {
        printf("no device backend first in this build: fallback not exercised\n");
        return;
    }
    /* the message names the device only where a driver lists devices to match against */
    int n_dev = 0;
    kvgen_error derr = {0};
    if (kvgen_devices(NULL, 0, &n_dev, &derr) != KVGEN_OK) n_dev = 0;
    const char *named_dev = n_dev > 0 ? "no-such-device-kvgen-test" : "";
    const char *validate = getenv("KVGEN_VALIDATE");
    char *saved = validate ? strdup(validate) : NULL;
    kvgen_error err = {0};
    kvgen_model *m = NULL;
    kvgen_model_desc md = {.path = path, .device = "no-such-device-kvgen-test", .n_threads = 1};
    unsetenv("KVGEN_VALIDATE");
    CHECKF(kvgen_model_load(&md, &m, &err) == KVGEN_OK, "fallback: %s", err.message);
    if (m) {
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        CHECKF(strcmp(info.backend, backends[1].name) == 0, "fell back to %s, not %s", info.backend, backends[1].name);
        kvgen_model_unload(m);
        m = NULL;
    }
    /* asked for by name: its own error, no fallback */
    kvgen_model_desc named = md;
    named.backend = first->backend;
    kvgen_status st = kvgen_model_load(&named, &m, &err);
    CHECKF(st != KVGEN_OK && m == NULL && contains(err.message, named_dev), "%s: %s", kvgen_status_name(st),
           err.message);
    setenv("KVGEN_VALIDATE", "1", 1);
    st = kvgen_model_load(&md, &m, &err);
    CHECKF(st != KVGEN_OK && m == NULL && contains(err.message, named_dev), "KVGEN_VALIDATE=1: %s: %s",
           kvgen_status_name(st), err.message);
    kvgen_model_unload(m);
    if (saved) setenv("KVGEN_VALIDATE", saved, 1);
    else unsetenv("KVGEN_VALIDATE");
    free(saved);
}

/* The default order: a default load (no device named) runs on Vulkan unless the device it would
 * use is the CPU itself (lavapipe), where the cpu backend computes on the same cores without the
 * emulation; naming the device, or KVGEN_VALIDATE=1 (a run checking the device backend), keeps
 * Vulkan. Without a device the default is the cpu backend. */
static void expect_default(const char *path, const char *device, const char *want, const char *why) {
    kvgen_model_desc md = {.path = path, .device = device, .n_threads = 1};
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvgen_model_load(&md, &m, &err);
    CHECKF(st == KVGEN_OK, "%s: %s", why, err.message);
    if (m) {
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        CHECKF(strcmp(info.backend, want) == 0, "%s: loaded on %s, not %s", why, info.backend, want);
        printf("default load, %s: %s (%s)\n", why, info.backend, info.device);
    }
    kvgen_model_unload(m);
}

static void test_default_choice(const char *path) {
    const kvgen_backend_info *vk = find_backend(KVGEN_BACKEND_VULKAN), *cpu = find_backend(KVGEN_BACKEND_CPU);
    CHECK(cpu && cpu->available && cpu->uses_threads && !cpu->uses_device && strcmp(cpu->name, "cpu") == 0);
    const char *env_dev = getenv("KVGEN_DEVICE");
    if (env_dev && *env_dev) {
        printf("KVGEN_DEVICE is set: the default order not checked\n");
        return;
    }
    const char *validate = getenv("KVGEN_VALIDATE");
    char *saved = validate ? strdup(validate) : NULL;
    unsetenv("KVGEN_VALIDATE");
    kvgen_device_info devs[16];
    int n_dev = 0;
    kvgen_error err = {0};
    if (!vk || !vk->available || kvgen_devices(devs, 16, &n_dev, &err) != KVGEN_OK) n_dev = 0;
    const kvgen_device_info *def = NULL;
    for (int i = 0; i < n_dev && i < 16; i++)
        if (devs[i].is_default) def = &devs[i];
    if (!def) {
        expect_default(path, NULL, "cpu", "no Vulkan device");
    } else if (strcmp(def->type, "cpu") == 0) {
        expect_default(path, NULL, "cpu", "the default Vulkan device is the CPU");
        char index[16];
        snprintf(index, sizeof index, "%d", def->index);
        expect_default(path, index, "vulkan", "that device named");
        setenv("KVGEN_VALIDATE", "1", 1);
        expect_default(path, NULL, "vulkan", "KVGEN_VALIDATE=1");
        unsetenv("KVGEN_VALIDATE");
    } else {
        expect_default(path, NULL, "vulkan", "a GPU");
    }
    if (saved) setenv("KVGEN_VALIDATE", saved, 1);
    free(saved);
}

static void test_probe(void) {
    kvgen_error err = {0};
    kvgen_probe_result r;
    CHECK(kvgen_device_probe(NULL, NULL, &err) == KVGEN_E_INVALID_ARGUMENT && contains(err.message, "out"));
    kvgen_probe_desc neg = {.reps = -1};
    memset(&r, 0x55, sizeof r);
    CHECK(kvgen_device_probe(&neg, &r, &err) == KVGEN_E_INVALID_ARGUMENT && contains(err.message, "reps"));
    CHECK(r.read_gbps == 0 && r.bytes == 0 && r.device[0] == 0); /* zeroed first */
    int device_backend = 0;
    for (int i = 0; i < n_backends; i++) device_backend |= backends[i].available && backends[i].uses_device;
    int n_dev = 0;
    CHECK_OK(kvgen_devices(NULL, 0, &n_dev, &err));
    kvgen_probe_desc small = {.read_mib = 1, .reps = 1, .dispatches = 10};
    kvgen_status st = kvgen_device_probe(&small, &r, &err);
    if (!device_backend) {
        CHECKF(st == KVGEN_E_UNSUPPORTED && contains(err.message, "built without"), "%s: %s", kvgen_status_name(st),
               err.message);
    } else if (n_dev == 0) {
        CHECKF(st == KVGEN_E_DEVICE, "no device, yet: %s (%s)", kvgen_status_name(st), err.message);
    } else {
        CHECKF(st == KVGEN_OK, "probe: %s", err.message);
        CHECKF(r.read_gbps > 0 && r.dispatch_us > 0 && r.bytes > 0 && r.bytes <= (1u << 20) && r.device[0],
               "probe on %s: %g GB/s, %g us, %llu bytes", r.device, r.read_gbps, r.dispatch_us,
               (unsigned long long)r.bytes);
        printf("probe on %s: %.2f GB/s, %.1f us per dispatch, %llu bytes\n", r.device, r.read_gbps, r.dispatch_us,
               (unsigned long long)r.bytes);
        kvgen_probe_desc nowhere = {.device = "no-such-device-kvgen-test", .read_mib = 1, .reps = 1, .dispatches = 1};
        st = kvgen_device_probe(&nowhere, &r, &err);
        CHECKF(st == KVGEN_E_DEVICE && contains(err.message, "no-such-device-kvgen-test"), "%s: %s",
               kvgen_status_name(st), err.message);
    }
}

int main(void) {
    char *path = tu_make_model("backends.gguf", "--seed 3 --layers 1 --embd 32 --heads 2 --kv-heads 1 --type Q8_0");
    CHECK(path != NULL);
    if (!path) return tu_finish("test_backends");
    unsetenv("KVGEN_BACKEND");
    test_list();
    test_env_parsing(path);
    test_fallback(path);
    test_default_choice(path);
    test_probe();
    free(path);
    return tu_finish("test_backends");
}
