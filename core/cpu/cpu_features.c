/* cpu_features.c: which vector instruction sets the host runs (kvg_qdot.h), read once: on
 * x86-64 with cpuid and xgetbv (the OS must save the wider registers too), on AArch64 Linux
 * from the kernel's hardware capabilities (getauxval(AT_HWCAP): HWCAP_ASIMD, HWCAP_ASIMDDP),
 * elsewhere on AArch64 Advanced SIMD alone (it is part of the baseline); and the choice of the
 * cpu backend's kernels: the best path the CPU has, or the one KVGEN_CPU_ISA names. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_qdot.h"
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

static const char *const ISA_NAMES[KVG_ISA_COUNT] = {"portable", "avx2",    "avx512",    "avxvnni",
                                                     "neon",     "dotprod", "avx512vnni"};

const char *kvg_cpu_isa_name(kvg_cpu_isa isa) {
    return isa >= 0 && isa < KVG_ISA_COUNT ? ISA_NAMES[isa] : "unknown";
}

#if defined(__x86_64__) || defined(__i386__)
static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static kvg_cpu_features detect(void) {
    kvg_cpu_features f = {0};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    bool fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return f;
    uint64_t xcr0 = read_xcr0();
    bool ymm = (xcr0 & 0x6) == 0x6;    /* SSE and AVX state */
    bool zmm = (xcr0 & 0xe6) == 0xe6;  /* plus opmask, upper ZMM0-15, ZMM16-31 */
    if (!ymm || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
    f.avx2 = (b >> 5) & 1;
    f.fma = fma;
    f.f16c = f16c;
    if (zmm) {
        f.avx512f = (b >> 16) & 1;
        f.avx512dq = (b >> 17) & 1;
        f.avx512bw = (b >> 30) & 1;
        f.avx512vl = (b >> 31) & 1;
        f.avx512vnni = (c >> 11) & 1;
    }
    unsigned max7 = a; /* leaf 7's highest subleaf */
    if (max7 >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avxvnni = (a >> 4) & 1;
#if KVG_AVXVNNI_EVEX
    /* a test build's avxvnni path issues vpdpbusd in its EVEX encoding (qdot_x86.c, dpbusd256):
     * it needs AVX-512 VNNI and VL, not AVX-VNNI */
    f.avxvnni = f.avx512vnni && f.avx512vl;
#endif
    return f;
}
#elif defined(__aarch64__)
#if defined(__linux__)
/* the kernel's bits (asm/hwcap.h), spelled out for C libraries whose headers lack them */
#define KVG_HWCAP_ASIMD (1ul << 1)
#define KVG_HWCAP_ASIMDDP (1ul << 20)
static kvg_cpu_features detect(void) {
    unsigned long hw = getauxval(AT_HWCAP);
    kvg_cpu_features f = {0};
    f.asimd = (hw & KVG_HWCAP_ASIMD) != 0;
    f.asimddp = f.asimd && (hw & KVG_HWCAP_ASIMDDP) != 0;
    return f;
}
#else
/* no portable way to ask for the dot product: Advanced SIMD only */
static kvg_cpu_features detect(void) { return (kvg_cpu_features){.asimd = true}; }
#endif
#else
static kvg_cpu_features detect(void) { return (kvg_cpu_features){0}; }
#endif

const kvg_cpu_features *kvg_cpu_features_get(void) {
    /* cpuid answers the same every time: racing first calls store the same value */
    static kvg_cpu_features cached;
    static int done; /* atomic */
    if (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {
        kvg_cpu_features f = detect();
        cached = f;
        __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    }
    return &cached;
}

bool kvg_cpu_isa_supported(kvg_cpu_isa isa) {
    const kvg_cpu_features *f = kvg_cpu_features_get();
    bool avx2 = f->avx2 && f->fma && f->f16c;
    switch (isa) {
    case KVG_ISA_PORTABLE: return true;
    case KVG_ISA_AVX2: return avx2;
    case KVG_ISA_AVX512: return avx2 && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq;
    case KVG_ISA_AVX512VNNI: return avx2 && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->avx512vnni;
    case KVG_ISA_AVXVNNI: return avx2 && f->avxvnni;
    case KVG_ISA_NEON: return f->asimd;
    case KVG_ISA_DOTPROD: return f->asimd && f->asimddp;
    default: return false;
    }
}

kvg_cpu_isa kvg_cpu_isa_best(void) {
    for (int i = KVG_ISA_COUNT - 1; i > 0; i--)
        if (kvg_cpu_isa_supported((kvg_cpu_isa)i)) return (kvg_cpu_isa)i;
    return KVG_ISA_PORTABLE;
}

#if KVG_AVXVNNI_EVEX
#define AVXVNNI_NAME "avxvnni(evex)" /* the test build's stand-in (detect) */
#else
#define AVXVNNI_NAME "avxvnni"
#endif
size_t kvg_cpu_features_describe(char *buf, size_t size) {
    const kvg_cpu_features *f = kvg_cpu_features_get();
    const char *names[] = {"avx2",     "fma",      "f16c",       "avx512f", "avx512dq", "avx512bw",
                           "avx512vl", "avx512vnni", AVXVNNI_NAME, "asimd",   "asimddp"};
    bool has[] = {f->avx2,       f->fma,        f->f16c,    f->avx512f, f->avx512dq, f->avx512bw,
                  f->avx512vl, f->avx512vnni, f->avxvnni, f->asimd,   f->asimddp};
    size_t len = 0;
    if (size) buf[0] = 0;
    for (size_t i = 0; i < sizeof has / sizeof has[0]; i++) {
        if (!has[i]) continue;
        size_t n = strlen(names[i]) + (len ? 1 : 0);
        if (len + n < size) {
            if (len) buf[len] = ' ';
            memcpy(buf + len + (len ? 1 : 0), names[i], strlen(names[i]) + 1);
        }
        len += n;
    }
    if (len == 0 && size > 4) {
        memcpy(buf, "none", 5);
        len = 4;
    }
    return len;
}

kvgen_status kvg_cpu_isa_choose(const char *who, kvg_cpu_isa *out, kvgen_error *err) {
    *out = kvg_cpu_isa_best();
    const char *env = getenv("KVGEN_CPU_ISA");
    if (!env || !*env) return KVGEN_OK;
    for (int i = 0; i < KVG_ISA_COUNT; i++) {
        if (strcmp(env, ISA_NAMES[i]) != 0) continue;
        if (!kvg_cpu_isa_supported((kvg_cpu_isa)i)) {
            char have[160];
            kvg_cpu_features_describe(have, sizeof have);
            return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: KVGEN_CPU_ISA=%s, but this CPU lacks it (it has: %s)", who,
                            env, have);
        }
        *out = (kvg_cpu_isa)i;
        return KVGEN_OK;
    }
    char names[128];
    size_t len = 0;
    names[0] = 0;
    for (int i = 0; i < KVG_ISA_COUNT && len < sizeof names; i++)
        len += (size_t)snprintf(names + len, sizeof names - len, "%s\"%s\"", i == 0 ? "" : i + 1 == KVG_ISA_COUNT ? " or " : ", ",
                                ISA_NAMES[i]);
    return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: KVGEN_CPU_ISA=%s: expected %s", who, env, names);
}
