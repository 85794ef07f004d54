/* test_quant_kquant.c: the 5-bit, K and IQ4 rows of the type-traits table (and the older block
 * types where gguf-py has the same data) against gguf-py's fixtures in fixtures/quant (made by
 * scripts/oracle/quant_fixture.py):
 * - dequantizing the fixture's blocks gives gguf-py's floats exactly (bit for bit);
 * - where gguf-py quantizes the type (the fixture holds its inputs and output), kvgen's
 *   quantization is byte-identical;
 * - the dot product equals dequantize-then-dot (in double) within 1e-5 of sum |w_i x_i|;
 * - kvgen's own quantizers (the K types, IQ4_NL, IQ4_XS: gguf-py has none) round-trip random
 *   weights within the error bounds below (measured values in the comments). */
#include <math.h>
#include <string.h>
#include "kvg_quant.h"
#include "testutil.h"

static const uint32_t TYPES[] = {KVG_TYPE_Q8_0, KVG_TYPE_Q4_0, KVG_TYPE_Q4_1, KVG_TYPE_Q5_0, KVG_TYPE_Q5_1,
                                 KVG_TYPE_Q2_K, KVG_TYPE_Q3_K, KVG_TYPE_Q4_K, KVG_TYPE_Q5_K, KVG_TYPE_Q6_K,
                                 KVG_TYPE_Q8_K, KVG_TYPE_IQ4_NL, KVG_TYPE_IQ4_XS};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

typedef struct fixture {
    char *data;
    uint32_t type, be, bb, n_blocks, n_quant;
    const uint8_t *blocks, *quantized;
    float *deq, *qin; /* copied out: the file's floats need not be aligned */
} fixture;

static uint32_t rd32(const char *p) {
    const unsigned char *u = (const unsigned char *)p;
    return (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
}

static bool load_fixture(uint32_t type, fixture *f) {
    memset(f, 0, sizeof *f);
    const char *dir = getenv("KVGEN_FIXTURES");
    char path[1024];
    snprintf(path, sizeof path, "%s/quant/%s.bin", dir && *dir ? dir : "core/tests/fixtures", kvg_type_name(type));
    size_t size = 0;
    f->data = tu_read_file(path, &size);
    CHECKF(f->data != NULL, "cannot read %s", path);
    if (!f->data) return false;
    bool ok = size >= 32 && memcmp(f->data, "KVQF", 4) == 0 && rd32(f->data + 4) == 1;
    CHECKF(ok, "%s: not a version-1 fixture", path);
    if (!ok) return false;
    f->type = rd32(f->data + 8);
    f->be = rd32(f->data + 12);
    f->bb = rd32(f->data + 16);
    f->n_blocks = rd32(f->data + 20);
    f->n_quant = rd32(f->data + 24);
    ok = f->type == type && f->be == kvg_type_block_elems(type) && f->bb == kvg_type_block_bytes(type) &&
         f->n_blocks > 0 && f->n_blocks < 4096 && f->n_quant < 4096 &&
         size == 32 + (size_t)(f->n_blocks + f->n_quant) * (f->bb + 4 * (size_t)f->be);
    CHECKF(ok, "%s: header (type %u, %u elements, %u bytes, %u + %u blocks) or size %zu does not fit", path, f->type,
           f->be, f->bb, f->n_blocks, f->n_quant, size);
    if (!ok) return false;
    const char *p = f->data + 32;
    f->blocks = (const uint8_t *)p;
    p += (size_t)f->n_blocks * f->bb;
    f->deq = malloc((size_t)f->n_blocks * f->be * 4);
    memcpy(f->deq, p, (size_t)f->n_blocks * f->be * 4);
    p += (size_t)f->n_blocks * f->be * 4;
    f->qin = malloc((size_t)f->n_quant * f->be * 4 + 4);
    memcpy(f->qin, p, (size_t)f->n_quant * f->be * 4);
    p += (size_t)f->n_quant * f->be * 4;
    f->quantized = (const uint8_t *)p;
    return true;
}

static void free_fixture(fixture *f) {
    free(f->data);
    free(f->deq);
    free(f->qin);
}

static uint32_t bits(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

/* the traits rows: every function, f32 activations */
static void test_rows(void) {
    for (size_t t = 0; t < N_TYPES; t++) {
        const kvg_type_traits *tr = kvg_type_traits_of(TYPES[t]);
        CHECKF(tr && tr->to_float && tr->from_float && tr->dot && tr->vec_dot_type == KVG_TYPE_F32, "%s",
               kvg_type_name(TYPES[t]));
        CHECK(kvg_type_supported(TYPES[t]) && kvg_type_known(TYPES[t]));
    }
    /* ggml's block sizes */
    const struct { uint32_t type, be, bb; } sizes[] = {
        {KVG_TYPE_Q5_0, 32, 22},   {KVG_TYPE_Q5_1, 32, 24},   {KVG_TYPE_Q2_K, 256, 84},    {KVG_TYPE_Q3_K, 256, 110},
        {KVG_TYPE_Q4_K, 256, 144}, {KVG_TYPE_Q5_K, 256, 176}, {KVG_TYPE_Q6_K, 256, 210},   {KVG_TYPE_Q8_K, 256, 292},
        {KVG_TYPE_IQ4_NL, 32, 18}, {KVG_TYPE_IQ4_XS, 256, 136},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        CHECKF(kvg_type_block_elems(sizes[i].type) == sizes[i].be && kvg_type_block_bytes(sizes[i].type) == sizes[i].bb,
               "%s", kvg_type_name(sizes[i].type));
    CHECK(strcmp(kvg_type_name(KVG_TYPE_Q4_K), "Q4_K") == 0 && strcmp(kvg_type_name(KVG_TYPE_IQ4_XS), "IQ4_XS") == 0);
}

/* dequantization bit for bit, quantization byte for byte */
static void test_fixtures(void) {
    for (size_t t = 0; t < N_TYPES; t++) {
        fixture f;
        const char *name = kvg_type_name(TYPES[t]);
        if (!load_fixture(TYPES[t], &f)) {
            free_fixture(&f);
            continue;
        }
        size_t n = (size_t)f.n_blocks * f.be;
        float *out = malloc(n * 4);
        kvg_dequantize_row(f.type, f.blocks, out, n);
        int bad = 0;
        for (size_t i = 0; i < n; i++)
            if (bits(out[i]) != bits(f.deq[i])) {
                if (bad++ < 3)
                    fprintf(stderr, "%s: block %zu element %zu: %.9g (%08x), gguf-py %.9g (%08x)\n", name, i / f.be,
                            i % f.be, out[i], bits(out[i]), f.deq[i], bits(f.deq[i]));
            }
        CHECKF(bad == 0, "%s: %d of %zu dequantized values differ from gguf-py's", name, bad, n);
        /* one block at a time gives the same */
        for (uint32_t b = 0; b < f.n_blocks; b++) {
            kvg_dequantize_row(f.type, f.blocks + (size_t)b * f.bb, out, f.be);
            CHECKF(memcmp(out, f.deq + (size_t)b * f.be, (size_t)f.be * 4) == 0, "%s block %u alone", name, b);
        }
        free(out);
        if (f.n_quant) {
            uint8_t *q = malloc((size_t)f.n_quant * f.bb);
            kvg_quantize_row(f.type, f.qin, q, (uint64_t)f.n_quant * f.be);
            int bad_blocks = 0;
            for (uint32_t b = 0; b < f.n_quant; b++)
                if (memcmp(q + (size_t)b * f.bb, f.quantized + (size_t)b * f.bb, f.bb) != 0) {
                    if (bad_blocks++ < 3) {
                        fprintf(stderr, "%s: quantized block %u differs from gguf-py's:\n  kvgen  ", name, b);
                        for (uint32_t i = 0; i < f.bb; i++) fprintf(stderr, "%02x", q[(size_t)b * f.bb + i]);
                        fprintf(stderr, "\n  gguf-py ");
                        for (uint32_t i = 0; i < f.bb; i++) fprintf(stderr, "%02x", f.quantized[(size_t)b * f.bb + i]);
                        fputc('\n', stderr);
                    }
                }
            CHECKF(bad_blocks == 0, "%s: %d of %u quantized blocks differ from gguf-py's", name, bad_blocks, f.n_quant);
            free(q);
        }
        printf("%-7s %3u blocks dequantized as gguf-py, %2u quantized as gguf-py\n", name, f.n_blocks, f.n_quant);
        free_fixture(&f);
    }
}

typedef struct rng {
    uint64_t s;
} rng;
static float rnd(rng *r) { /* uniform in [-1, 1) */
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (float)(r->s >> 40) / 8388608.0f - 1.0f;
}
static float rnd_normal(rng *r) { /* Irwin-Hall, unit variance */
    return (rnd(r) + rnd(r) + rnd(r) + rnd(r)) * 0.8660254f;
}

/* kvg_dot_row against dequantize-then-dot in double: within 1e-5 of sum |w_i x_i| (float
 * rounding of a sum of a few thousand products; the order of the additions differs) */
static void check_dot(const char *what, uint32_t type, const uint8_t *row, const float *x, size_t n) {
    float *w = malloc(n * 4);
    kvg_dequantize_row(type, row, w, n);
    double want = 0, mag = 0;
    for (size_t i = 0; i < n; i++) {
        want += (double)w[i] * x[i];
        mag += fabs((double)w[i] * x[i]);
    }
    float got = kvg_dot_row(type, row, x, n);
    CHECKF(fabs(got - want) <= 1e-5 * mag + 1e-30, "%s %s n=%zu: dot %.9g, dequantize+dot %.9g (sum |w x| %g)",
           kvg_type_name(type), what, n, got, want, mag);
    free(w);
}

static void test_dot(void) {
    rng r = {0x9e3779b97f4a7c15ull};
    enum { MAXN = 256 * 12 };
    static float x[MAXN], w[MAXN];
    static uint8_t q[MAXN * 2];
    for (int i = 0; i < MAXN; i++) x[i] = rnd(&r) * 2.0f;
    for (size_t t = 0; t < N_TYPES; t++) {
        uint32_t type = TYPES[t], be = kvg_type_block_elems(type);
        /* the fixture's blocks as one row (scales from 1e-4 to the largest half) */
        fixture f;
        if (load_fixture(type, &f)) check_dot("fixture row", type, f.blocks, x, (size_t)f.n_blocks * f.be);
        free_fixture(&f);
        /* kvgen's quantization of random weights, rows of 1, 3 and 12 blocks of 256 */
        const size_t lengths[] = {be, 3 * 256, MAXN};
        for (size_t li = 0; li < 3; li++) {
            size_t n = lengths[li];
            for (size_t i = 0; i < n; i++) w[i] = rnd_normal(&r) * 0.05f;
            kvg_quantize_row(type, w, q, n);
            check_dot("random row", type, q, x, n);
        }
    }
}

/* Round trips of kvgen's quantizers: 6 kinds of input of 16 blocks of 256 values each (normal
 * weights at scales 0.02 and 1, uniform in [-3, 3], normal around +2 and around -1, normal with
 * a 20x outlier every 97 values). Measured: the root-mean-square error over the root-mean-square
 * input (worst kind; the kind is the outliers unless noted) and the largest error in a block
 * over that block's range (worst block: one offset from zero, where the K types' mins, which may
 * only lower the levels, leave the low levels unused). The bounds are about 25% above what was
 * measured (in the comments: rms of the normal weights / worst rms / worst max). Q5_0 and Q5_1
 * quantize as gguf-py does; the others are kvgen's own (scales fitted per block). */
typedef struct bound {
    uint32_t type;
    double rms, max; /* relative rms error, largest error / block range */
} bound;

static const bound BOUNDS[] = {
    {KVG_TYPE_Q2_K, 0.33, 0.49},    /* 0.260 / 0.260 (normal) / 0.392 */
    {KVG_TYPE_Q3_K, 0.20, 0.38},    /* 0.140 / 0.157 / 0.305 */
    {KVG_TYPE_Q4_K, 0.125, 0.12},   /* 0.069 / 0.099 / 0.095 */
    {KVG_TYPE_Q5_K, 0.062, 0.066},  /* 0.035 / 0.049 / 0.052 */
    {KVG_TYPE_Q6_K, 0.038, 0.057},  /* 0.016 / 0.030 / 0.045 */
    {KVG_TYPE_Q8_K, 0.034, 0.0105}, /* 0.0062 / 0.027 / 0.0084 */
    {KVG_TYPE_IQ4_NL, 0.155, 0.31}, /* 0.072 / 0.124 / 0.248 */
    {KVG_TYPE_IQ4_XS, 0.165, 0.27}, /* 0.072 / 0.132 / 0.215 */
    {KVG_TYPE_Q5_0, 0.112, 0.078},  /* 0.041 / 0.089 / 0.062 */
    {KVG_TYPE_Q5_1, 0.065, 0.0205}, /* 0.036 / 0.052 / 0.016 */
};

enum { KINDS = 6, BLOCKS_PER_KIND = 16, RT_N = 256 * BLOCKS_PER_KIND };

static void make_input(int kind, rng *r, float *x) {
    for (int i = 0; i < RT_N; i++) {
        switch (kind) {
        case 0: x[i] = rnd_normal(r) * 0.02f; break;
        case 1: x[i] = rnd_normal(r); break;
        case 2: x[i] = rnd(r) * 3.0f; break;
        case 3: x[i] = 2.0f + rnd_normal(r) * 0.3f; break;
        case 4: x[i] = -1.0f + rnd_normal(r) * 0.2f; break;
        default: x[i] = rnd_normal(r) * 0.05f * (i % 97 == 3 ? 20.0f : 1.0f); break;
        }
    }
}

static void test_round_trip(void) {
    static float x[RT_N], y[RT_N];
    static uint8_t q[RT_N * 2];
    for (size_t bi = 0; bi < sizeof BOUNDS / sizeof BOUNDS[0]; bi++) {
        uint32_t type = BOUNDS[bi].type;
        rng r = {0x1234567ull + bi};
        double worst_rms = 0, worst_max = 0;
        for (int kind = 0; kind < KINDS; kind++) {
            make_input(kind, &r, x);
            kvg_quantize_row(type, x, q, RT_N);
            kvg_dequantize_row(type, q, y, RT_N);
            double se = 0, sx = 0;
            for (int b = 0; b < RT_N / 256; b++) {
                float lo = x[256 * b], hi = x[256 * b], emax = 0;
                for (int i = 256 * b; i < 256 * b + 256; i++) {
                    lo = fminf(lo, x[i]);
                    hi = fmaxf(hi, x[i]);
                    emax = fmaxf(emax, fabsf(y[i] - x[i]));
                    se += (double)(y[i] - x[i]) * (y[i] - x[i]);
                    sx += (double)x[i] * x[i];
                }
                double rel_max = emax / (hi - lo);
                if (rel_max > worst_max) worst_max = rel_max;
            }
            double rel_rms = sqrt(se / sx);
            if (rel_rms > worst_rms) worst_rms = rel_rms;
            CHECKF(isfinite(rel_rms), "%s kind %d", kvg_type_name(type), kind);
        }
        printf("%-7s round trip: rms error / rms %.4f (bound %.4f), max error / block range %.4f (bound %.4f)\n",
               kvg_type_name(type), worst_rms, BOUNDS[bi].rms, worst_max, BOUNDS[bi].max);
        CHECKF(worst_rms <= BOUNDS[bi].rms && worst_max <= BOUNDS[bi].max, "%s round trip out of bounds",
               kvg_type_name(type));
    }
    /* zeros stay exactly zero (and never NaN) */
    memset(x, 0, sizeof x);
    for (size_t t = 0; t < N_TYPES; t++) {
        kvg_quantize_row(TYPES[t], x, q, 256);
        kvg_dequantize_row(TYPES[t], q, y, 256);
        int bad = 0;
        for (int i = 0; i < 256; i++) bad += y[i] != 0.0f;
        CHECKF(bad == 0, "%s: %d of 256 zeros do not come back as zeros", kvg_type_name(TYPES[t]), bad);
    }
}

int main(void) {
    test_rows();
    test_fixtures();
    test_dot();
    test_round_trip();
    return tu_finish("test_quant_kquant");
}
