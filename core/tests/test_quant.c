/* test_quant.c: tensor types: sizes, f16/bf16 conversion, hand-computed dequantization,
 * quantization round trips and the dot product against dequantize-then-dot. The 5-bit, K and
 * IQ4 rows against gguf-py's fixtures: test_quant_kquant. */
#include <math.h>
#include <string.h>
#include "kvg_quant.h"
#include "testutil.h"

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_type_table(void) {
    CHECK(kvg_type_supported(KVG_TYPE_F32) && kvg_type_supported(KVG_TYPE_Q4_1) && kvg_type_supported(KVG_TYPE_BF16));
    CHECK(kvg_type_supported(KVG_TYPE_Q6_K) && kvg_type_supported(KVG_TYPE_Q4_K) && kvg_type_supported(KVG_TYPE_Q5_0));
    CHECK(!kvg_type_supported(16) && kvg_type_known(16)); /* IQ2_XXS: sized, not computed with */
    CHECK(strcmp(kvg_type_name(16), "IQ2_XXS") == 0 && kvg_type_block_bytes(16) == 66);
    CHECK(strcmp(kvg_type_name(14), "Q6_K") == 0);
    CHECK(kvg_type_block_elems(14) == 256 && kvg_type_block_bytes(14) == 210);
    CHECK(kvg_type_block_elems(12) == 256 && kvg_type_block_bytes(12) == 144); /* Q4_K */
    CHECK(strcmp(kvg_type_name(KVG_TYPE_Q8_0), "Q8_0") == 0 && strcmp(kvg_type_name(KVG_TYPE_BF16), "BF16") == 0);
    CHECK(!kvg_type_known(4) && strcmp(kvg_type_name(4), "Q4_2") == 0); /* retired: named but not sized */
    CHECK(!kvg_type_known(99) && !kvg_type_known(UINT32_MAX));
    CHECK(kvg_type_name(99) != NULL && kvg_type_name(UINT32_MAX) != NULL);
    CHECK(strcmp(kvg_type_name(50), "type 50") == 0);
    CHECK(kvg_type_block_bytes(KVG_TYPE_Q8_0) == 34 && kvg_type_block_bytes(KVG_TYPE_Q4_0) == 18 &&
          kvg_type_block_bytes(KVG_TYPE_Q4_1) == 20);
    CHECK(kvg_row_bytes(KVG_TYPE_F32, 7) == 28 && kvg_row_bytes(KVG_TYPE_F16, 7) == 14);
    CHECK(kvg_row_bytes(KVG_TYPE_Q8_0, 64) == 68 && kvg_row_bytes(KVG_TYPE_Q4_1, 96) == 60);
}

static void test_f16(void) {
    struct { uint16_t h; float f; } cases[] = {
        {0x3c00, 1.0f},          {0xc000, -2.0f},          {0x7bff, 65504.0f},       {0x3555, 0.33325195f},
        {0x0001, 5.9604645e-8f}, {0x03ff, 6.0975552e-5f},  {0x0400, 6.1035156e-5f},  {0x8001, -5.9604645e-8f},
        {0x0000, 0.0f},          {0x3800, 0.5f},           {0xfbff, -65504.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECKF(kvg_f16_to_f32(cases[i].h) == cases[i].f, "%04x -> %g", cases[i].h, kvg_f16_to_f32(cases[i].h));
        CHECKF(kvg_f32_to_f16(cases[i].f) == cases[i].h, "%g -> %04x", cases[i].f, kvg_f32_to_f16(cases[i].f));
    }
    CHECK(f32_bits(kvg_f16_to_f32(0x8000)) == 0x80000000u); /* -0 keeps its sign */
    CHECK(kvg_f32_to_f16(-0.0f) == 0x8000);
    CHECK(isinf(kvg_f16_to_f32(0x7c00)) && kvg_f16_to_f32(0x7c00) > 0);
    CHECK(isinf(kvg_f16_to_f32(0xfc00)) && kvg_f16_to_f32(0xfc00) < 0);
    CHECK(isnan(kvg_f16_to_f32(0x7e00)) && isnan(kvg_f16_to_f32(0x7c01)) && isnan(kvg_f16_to_f32(0xffff)));
    CHECK(kvg_f32_to_f16(INFINITY) == 0x7c00 && kvg_f32_to_f16(-INFINITY) == 0xfc00);
    uint16_t hn = kvg_f32_to_f16(NAN);
    CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0);
    /* a NaN whose payload lives only in the low bits must not turn into inf */
    uint16_t hn2 = kvg_f32_to_f16(bits_f32(0x7f800001u));
    CHECK((hn2 & 0x7c00) == 0x7c00 && (hn2 & 0x3ff) != 0);
    /* rounding: 65519 rounds down to 65504, 65520 (a tie) rounds to even: infinity */
    CHECK(kvg_f32_to_f16(65519.0f) == 0x7bff);
    CHECK(kvg_f32_to_f16(65520.0f) == 0x7c00);
    CHECK(kvg_f32_to_f16(1e10f) == 0x7c00);
    /* 1 + 2^-11 is a tie between 1 and 1+2^-10: to even (1); 1 + 3*2^-11: up */
    CHECK(kvg_f32_to_f16(1.0f + 0.00048828125f) == 0x3c00);
    CHECK(kvg_f32_to_f16(1.0f + 3 * 0.00048828125f) == 0x3c02);
    /* subnormal rounding: 2^-25 is a tie between 0 and the smallest subnormal (even: 0) */
    CHECK(kvg_f32_to_f16(2.9802322e-8f) == 0x0000);
    CHECK(kvg_f32_to_f16(2.9802326e-8f) == 0x0001);
    CHECK(kvg_f32_to_f16(1e-8f) == 0x0000);
    CHECK(kvg_f32_to_f16(8.940697e-8f) == 0x0002); /* 1.5 * 2^-24: tie, to even (2) */
    /* every half survives f16 -> f32 -> f16 */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kvg_f16_to_f32((uint16_t)h);
        uint16_t back = kvg_f32_to_f16(f);
        bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (nan ? !isnan(kvg_f16_to_f32(back)) : back != h) bad++;
    }
    CHECKF(bad == 0, "%d halves do not round-trip", bad);
}

static void test_bf16(void) {
    CHECK(kvg_bf16_to_f32(0x3f80) == 1.0f && kvg_bf16_to_f32(0xc040) == -3.0f);
    CHECK(kvg_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(kvg_f32_to_bf16(bits_f32(0x3f808000u)) == 0x3f80); /* tie to even: down */
    CHECK(kvg_f32_to_bf16(bits_f32(0x3f818000u)) == 0x3f82); /* tie to even: up */
    CHECK(kvg_f32_to_bf16(bits_f32(0x3f808001u)) == 0x3f81);
    CHECK(kvg_f32_to_bf16(INFINITY) == 0x7f80 && kvg_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(kvg_f32_to_bf16(3.4028235e38f) == 0x7f80); /* FLT_MAX rounds past the largest bf16 */
    CHECK(isnan(kvg_bf16_to_f32(kvg_f32_to_bf16(NAN))));
    CHECK(isnan(kvg_bf16_to_f32(kvg_f32_to_bf16(bits_f32(0x7f800001u))))); /* low-payload NaN stays NaN */
    CHECK(kvg_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(kvg_bf16_to_f32(0x0001) == bits_f32(0x00010000u)); /* subnormal */
}

static void check_row(const char *what, const float *got, const float *want, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (got[i] != want[i]) {
            if (!bad) fprintf(stderr, "%s: element %d: got %g, want %g\n", what, i, got[i], want[i]);
            bad++;
        }
    CHECKF(bad == 0, "%s: %d elements differ", what, bad);
}

static void test_dequant_by_hand(void) {
    float out[64];
    /* F32, F16, BF16 rows */
    const float f32row[3] = {1.5f, -2.25f, 1e-3f};
    kvg_dequantize_row(KVG_TYPE_F32, f32row, out, 3);
    check_row("F32", out, f32row, 3);
    const uint8_t f16row[6] = {0x00, 0x3c, 0x00, 0xc1, 0x00, 0x7c}; /* 1, -2.5, inf */
    kvg_dequantize_row(KVG_TYPE_F16, f16row, out, 3);
    CHECK(out[0] == 1.0f && out[1] == -2.5f && isinf(out[2]));
    const uint8_t bf16row[4] = {0x80, 0x3f, 0x20, 0xc1}; /* 1, -10 */
    kvg_dequantize_row(KVG_TYPE_BF16, bf16row, out, 2);
    CHECK(out[0] == 1.0f && out[1] == -10.0f);

    /* Q8_0: d = 0.5 (f16 0x3800), q[i] = i - 16 */
    uint8_t q8[34] = {0x00, 0x38};
    for (int i = 0; i < 32; i++) q8[2 + i] = (uint8_t)(int8_t)(i - 16);
    const float q8_want[32] = {-8.0f, -7.5f, -7.0f, -6.5f, -6.0f, -5.5f, -5.0f, -4.5f, -4.0f, -3.5f, -3.0f,
                               -2.5f, -2.0f, -1.5f, -1.0f, -0.5f, 0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  2.5f,
                               3.0f,  3.5f,  4.0f,  4.5f,  5.0f,  5.5f,  6.0f,  6.5f,  7.0f,  7.5f};
    kvg_dequantize_row(KVG_TYPE_Q8_0, q8, out, 32);
    check_row("Q8_0", out, q8_want, 32);

    /* Q4_0: d = 2 (f16 0x4000); qs[i] = i | (15 - i) << 4: elements 0..15 are the low nibbles 0..15,
     * elements 16..31 the high nibbles 15..0; value = (nibble - 8) * 2 */
    uint8_t q4[18] = {0x00, 0x40};
    for (int i = 0; i < 16; i++) q4[2 + i] = (uint8_t)(i | ((15 - i) << 4));
    const float q4_want[32] = {-16, -14, -12, -10, -8, -6, -4, -2, 0,  2,  4,  6,  8,   10,  12,  14,
                               14,  12,  10,  8,   6,  4,  2,  0,  -2, -4, -6, -8, -10, -12, -14, -16};
    kvg_dequantize_row(KVG_TYPE_Q4_0, q4, out, 32);
    check_row("Q4_0", out, q4_want, 32);

    /* Q4_1: d = 0.5 (0x3800), m = -1 (0xbc00); same nibbles; value = nibble * 0.5 - 1 */
    uint8_t q41[20] = {0x00, 0x38, 0x00, 0xbc};
    for (int i = 0; i < 16; i++) q41[4 + i] = (uint8_t)(i | ((15 - i) << 4));
    const float q41_want[32] = {-1.0f, -0.5f, 0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  2.5f,  3.0f,  3.5f,  4.0f,
                                4.5f,  5.0f,  5.5f,  6.0f,  6.5f,  6.5f,  6.0f,  5.5f,  5.0f,  4.5f,  4.0f,
                                3.5f,  3.0f,  2.5f,  2.0f,  1.5f,  1.0f,  0.5f,  0.0f,  -0.5f, -1.0f};
    kvg_dequantize_row(KVG_TYPE_Q4_1, q41, out, 32);
    check_row("Q4_1", out, q41_want, 32);

    /* quantizing those exact values reproduces the blocks byte for byte */
    uint8_t again[34];
    kvg_quantize_row(KVG_TYPE_Q4_1, q41_want, again, 32);
    CHECK(memcmp(again, q41, 20) == 0);
    float q4_exact[32];
    for (int i = 0; i < 32; i++) q4_exact[i] = q4_want[i] / 8.0f; /* extreme -2: d = 0.25 */
    kvg_quantize_row(KVG_TYPE_Q4_0, q4_exact, again, 32);
    CHECK(again[0] == 0x00 && again[1] == 0x34 && memcmp(again + 2, q4 + 2, 16) == 0);
    float q8_exact[32];
    for (int i = 0; i < 32; i++) q8_exact[i] = (float)(i == 0 ? -127 : i * 4 - 64) / 16.0f; /* d = 1/16 */
    kvg_quantize_row(KVG_TYPE_Q8_0, q8_exact, again, 32);
    CHECK(again[0] == 0x00 && again[1] == 0x2c); /* f16 0.0625 */
    CHECK((int8_t)again[2] == -127 && (int8_t)again[3] == -60 && (int8_t)again[33] == 60);

    /* an all-zero block quantizes to d = 0 and dequantizes to zeros, never NaN */
    float zeros[32] = {0};
    const uint32_t qtypes[] = {KVG_TYPE_Q8_0, KVG_TYPE_Q4_0, KVG_TYPE_Q4_1};
    for (int t = 0; t < 3; t++) {
        kvg_quantize_row(qtypes[t], zeros, again, 32);
        kvg_dequantize_row(qtypes[t], again, out, 32);
        check_row("zero block", out, zeros, 32);
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

static void test_round_trip(void) {
    enum { N = 32 * 16 };
    float x[N], y[N];
    uint8_t q[N * 4];
    rng r = {0x1234567};
    for (int i = 0; i < N; i++) x[i] = rnd(&r) * (i < 256 ? 1.0f : 40.0f) + (i >= 448 ? 3.0f : 0.0f);
    const uint32_t types[] = {KVG_TYPE_F32, KVG_TYPE_F16, KVG_TYPE_BF16, KVG_TYPE_Q8_0, KVG_TYPE_Q4_0, KVG_TYPE_Q4_1};
    for (int t = 0; t < 6; t++) {
        uint32_t type = types[t];
        kvg_quantize_row(type, x, q, N);
        kvg_dequantize_row(type, q, y, N);
        int bad = 0;
        for (int b = 0; b < N / 32; b++) {
            float amax = 0, lo = x[32 * b], hi = x[32 * b];
            for (int i = 0; i < 32; i++) {
                amax = fmaxf(amax, fabsf(x[32 * b + i]));
                lo = fminf(lo, x[32 * b + i]);
                hi = fmaxf(hi, x[32 * b + i]);
            }
            for (int i = 32 * b; i < 32 * b + 32; i++) {
                float tol;
                switch (type) {
                case KVG_TYPE_F32: tol = 0; break;
                case KVG_TYPE_F16: tol = fabsf(x[i]) * 4.9e-4f + 3e-8f; break; /* 2^-11 relative; subnormals */
                case KVG_TYPE_BF16: tol = fabsf(x[i]) * 3.91e-3f; break; /* 2^-8 relative */
                case KVG_TYPE_Q8_0: tol = amax / 127.0f * 0.57f; break;  /* half a step + f16 scale error */
                case KVG_TYPE_Q4_0: tol = amax / 8.0f * 1.01f; break;    /* +8 clamps to 7: one full step */
                default: tol = (hi - lo) / 15.0f * 0.57f + fabsf(lo) * 1e-3f; break;
                }
                if (fabsf(y[i] - x[i]) > tol) {
                    if (!bad) fprintf(stderr, "%s: element %d: %g -> %g (tol %g)\n", kvg_type_name(type), i, x[i], y[i], tol);
                    bad++;
                }
            }
        }
        CHECKF(bad == 0, "%s round trip: %d elements out of bounds", kvg_type_name(type), bad);
    }
}

static void test_dot(void) {
    enum { N = 32 * 9 };
    float w[N], x[N], deq[N];
    uint8_t q[N * 4];
    rng r = {99};
    for (int i = 0; i < N; i++) {
        w[i] = rnd(&r) * 0.1f;
        x[i] = rnd(&r) * 2.0f;
    }
    const uint32_t types[] = {KVG_TYPE_F32, KVG_TYPE_F16, KVG_TYPE_BF16, KVG_TYPE_Q8_0, KVG_TYPE_Q4_0, KVG_TYPE_Q4_1};
    /* block types need whole blocks; the others also get lengths that are not a multiple of 8 */
    const int lengths[] = {N, 32, 37, 7, 1};
    for (int t = 0; t < 6; t++) {
        for (int li = 0; li < 5; li++) {
            int n = lengths[li];
            if (kvg_type_block_elems(types[t]) > 1 && n % 32) continue;
            kvg_quantize_row(types[t], w, q, (uint64_t)n);
            kvg_dequantize_row(types[t], q, deq, (uint64_t)n);
            double want = 0, mag = 0;
            for (int i = 0; i < n; i++) {
                want += (double)deq[i] * x[i];
                mag += fabs((double)deq[i] * x[i]);
            }
            float got = kvg_dot_row(types[t], q, x, (uint64_t)n);
            CHECKF(fabs(got - want) <= 1e-5 * mag + 1e-7, "%s n=%d: dot %g, dequantize+dot %g",
                   kvg_type_name(types[t]), n, got, want);
        }
    }
    /* an F32 row that is not 4-byte aligned (a GGUF with alignment 1 can hold one) */
    uint8_t raw[4 * 17 + 1];
    memcpy(raw + 1, w, 4 * 17);
    double want = 0;
    for (int i = 0; i < 17; i++) want += (double)w[i] * x[i];
    CHECK(fabs(kvg_dot_row(KVG_TYPE_F32, raw + 1, x, 17) - want) < 1e-5);
}

int main(void) {
    test_type_table();
    test_f16();
    test_bf16();
    test_dequant_by_hand();
    test_round_trip();
    test_dot();
    return tu_finish("test_quant");
}
