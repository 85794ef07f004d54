/* test_gguf.c: GGUF writer/reader round trip of every value type, a catalogue of malformed files
 * (each must fail cleanly, naming the file), a seeded byte-flipping fuzz, and the default model. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <string.h>
#include "kvg_gguf.h"
#include "kvg_quant.h"
#include "testutil.h"

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p) { return get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

static bool write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

/* ---- round trip ---- */

static void test_round_trip(void) {
    kvg_gguf_writer *w = kvg_gguf_writer_new();
    uint8_t u8 = 200, i8 = (uint8_t)-100, u16[2] = {0x34, 0x12}, i16[2] = {0x18, 0xfc}; /* 0x1234, -1000 */
    uint8_t u64[8], i64[8], f64[8];
    put_u64(u64, 0xfedcba9876543210ull);
    put_u64(i64, (uint64_t)-5000000000ll);
    double d = -2.5e-300;
    memcpy(f64, &d, 8);
    kvg_gguf_set_raw(w, "t.u8", KVG_GGUF_UINT8, &u8, 1);
    kvg_gguf_set_raw(w, "t.i8", KVG_GGUF_INT8, &i8, 1);
    kvg_gguf_set_raw(w, "t.u16", KVG_GGUF_UINT16, u16, 2);
    kvg_gguf_set_raw(w, "t.i16", KVG_GGUF_INT16, i16, 2);
    kvg_gguf_set_u32(w, "t.u32", 4000000000u);
    kvg_gguf_set_i32(w, "t.i32", -123456);
    kvg_gguf_set_f32(w, "t.f32", 0.15625f);
    kvg_gguf_set_bool(w, "t.bool", true);
    kvg_gguf_set_str(w, "t.str", "h\xc3\xa9llo");
    kvg_gguf_set_raw(w, "t.u64", KVG_GGUF_UINT64, u64, 8);
    kvg_gguf_set_raw(w, "t.i64", KVG_GGUF_INT64, i64, 8);
    kvg_gguf_set_raw(w, "t.f64", KVG_GGUF_FLOAT64, f64, 8);
    kvg_gguf_set_f32(w, "t.whole", 7.0f);
    kvg_gguf_set_u32(w, "t.replaced", 1);
    kvg_gguf_set_str(w, "t.replaced", "second"); /* a later set replaces the value and type */
    const int32_t ints[5] = {1, -2, 3, -4, 5};
    const float floats[3] = {0.5f, -1.0f, 1e30f};
    const uint8_t bools[3] = {1, 0, 1};
    const int64_t i64s[2] = {-1, INT64_MAX};
    kvg_gguf_set_arr_num(w, "a.i32", KVG_GGUF_INT32, ints, 5);
    kvg_gguf_set_arr_num(w, "a.f32", KVG_GGUF_FLOAT32, floats, 3);
    kvg_gguf_set_arr_num(w, "a.bool", KVG_GGUF_BOOL, bools, 3);
    kvg_gguf_set_arr_num(w, "a.i64", KVG_GGUF_INT64, i64s, 2);
    kvg_gguf_set_arr_num(w, "a.empty", KVG_GGUF_UINT8, NULL, 0);
    const kvg_str strs[3] = {{"one", 3}, {"", 0}, {"thr\0e", 5}};
    kvg_gguf_set_arr_str(w, "a.str", strs, 3);
    /* array of arrays: [[7, 8], [], [9]] of uint16, then [["x"], ["yy", "zzz"]] */
    uint8_t nested[4 + 8 + (12 + 4) + 12 + (12 + 2)], *p = nested;
    put_u32(p, KVG_GGUF_ARRAY), put_u64(p + 4, 3), p += 12;
    put_u32(p, KVG_GGUF_UINT16), put_u64(p + 4, 2), p[12] = 7, p[13] = 0, p[14] = 8, p[15] = 0, p += 16;
    put_u32(p, KVG_GGUF_UINT16), put_u64(p + 4, 0), p += 12;
    put_u32(p, KVG_GGUF_UINT16), put_u64(p + 4, 1), p[12] = 9, p[13] = 0, p += 14;
    CHECK((size_t)(p - nested) == sizeof nested);
    kvg_gguf_set_raw(w, "a.nested", KVG_GGUF_ARRAY, nested, sizeof nested);
    uint8_t nested_s[12 + 12 + 9 + 12 + 10 + 11], *q = nested_s;
    put_u32(q, KVG_GGUF_ARRAY), put_u64(q + 4, 2), q += 12;
    put_u32(q, KVG_GGUF_STRING), put_u64(q + 4, 1), put_u64(q + 12, 1), q[20] = 'x', q += 21;
    put_u32(q, KVG_GGUF_STRING), put_u64(q + 4, 2), q += 12;
    put_u64(q, 2), memcpy(q + 8, "yy", 2), q += 10;
    put_u64(q, 3), memcpy(q + 8, "zzz", 3), q += 11;
    CHECK((size_t)(q - nested_s) == sizeof nested_s);
    kvg_gguf_set_raw(w, "a.nested_str", KVG_GGUF_ARRAY, nested_s, sizeof nested_s);

    float t0[5 * 3];
    for (int i = 0; i < 15; i++) t0[i] = (float)i - 7.5f;
    uint8_t t1[2 * 34];
    float src[64];
    for (int i = 0; i < 64; i++) src[i] = sinf((float)i);
    kvg_quantize_row(KVG_TYPE_Q8_0, src, t1, 64);
    uint16_t t2[7];
    for (int i = 0; i < 7; i++) t2[i] = kvg_f32_to_f16((float)i);
    uint8_t t3[4 * 20 * 2 * 1];
    memset(t3, 0x5a, sizeof t3);
    const uint64_t ne0[2] = {5, 3}, ne1[2] = {32, 2}, ne2[1] = {7}, ne3[4] = {32, 2, 1, 4};
    kvg_gguf_add_tensor(w, "t0.weight", KVG_TYPE_F32, 2, ne0, t0, sizeof t0);
    kvg_gguf_add_tensor(w, "t1.weight", KVG_TYPE_Q8_0, 2, ne1, t1, sizeof t1);
    kvg_gguf_add_tensor(w, "t2", KVG_TYPE_F16, 1, ne2, t2, sizeof t2);
    kvg_gguf_add_tensor(w, "t3.four_dims", KVG_TYPE_Q4_1, 4, ne3, t3, sizeof t3);

    char *path = tu_tmpfile("roundtrip.gguf");
    kvgen_error err = {0};
    CHECK_OK(kvg_gguf_writer_save(w, path, &err));
    kvg_gguf *g = NULL;
    kvgen_status st = kvg_gguf_open(path, &g, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    if (st != KVGEN_OK) {
        kvg_gguf_writer_free(w);
        free(path);
        return;
    }
    CHECK(kvg_gguf_version(g) == 3 && kvg_gguf_alignment(g) == 32);
    CHECK(kvg_gguf_n_kv(g) == 22 && kvg_gguf_n_tensors(g) == 4);
    CHECK(strcmp(kvg_gguf_path(g), path) == 0);

    uint32_t v32;
    int64_t v64;
    float f;
    bool b;
    kvg_str s;
    CHECK(kvg_gguf_get_u32(g, "t.u8", &v32) && v32 == 200);
    CHECK(kvg_gguf_get_i64(g, "t.i8", &v64) && v64 == -100);
    CHECK(!kvg_gguf_get_u32(g, "t.i8", &v32)); /* negative does not fit */
    CHECK(kvg_gguf_get_u32(g, "t.u16", &v32) && v32 == 0x1234);
    CHECK(kvg_gguf_get_i64(g, "t.i16", &v64) && v64 == -1000);
    CHECK(kvg_gguf_get_u32(g, "t.u32", &v32) && v32 == 4000000000u);
    CHECK(kvg_gguf_get_i64(g, "t.i32", &v64) && v64 == -123456);
    CHECK(kvg_gguf_get_f32(g, "t.f32", &f) && f == 0.15625f);
    CHECK(kvg_gguf_get_f32(g, "t.i32", &f) && f == -123456.0f);
    CHECK(!kvg_gguf_get_i64(g, "t.f32", &v64)); /* 0.15625 is not a whole number */
    CHECK(kvg_gguf_get_u32(g, "t.whole", &v32) && v32 == 7);
    CHECK(kvg_gguf_get_bool(g, "t.bool", &b) && b);
    CHECK(!kvg_gguf_get_bool(g, "t.u8", &b));
    CHECK(kvg_gguf_get_str(g, "t.str", &s) && s.len == 6 && memcmp(s.ptr, "h\xc3\xa9llo", 6) == 0);
    CHECK(!kvg_gguf_get_str(g, "t.u32", &s) && !kvg_gguf_get_u32(g, "t.str", &v32));
    CHECK(!kvg_gguf_get_i64(g, "t.u64", &v64)); /* above INT64_MAX */
    CHECK(kvg_gguf_get_f32(g, "t.u64", &f) && fabsf(f - 1.8364758e19f) < 1e13f);
    CHECK(kvg_gguf_get_i64(g, "t.i64", &v64) && v64 == -5000000000ll);
    CHECK(!kvg_gguf_get_u32(g, "t.i64", &v32));
    CHECK(kvg_gguf_get_f32(g, "t.f64", &f) && f == (float)-2.5e-300);
    CHECK(kvg_gguf_get_str(g, "t.replaced", &s) && s.len == 6 && memcmp(s.ptr, "second", 6) == 0);
    CHECK(!kvg_gguf_get_u32(g, "no.such.key", &v32) && kvg_gguf_find_key(g, "no.such.key") == -1);
    int ki = kvg_gguf_find_key(g, "t.f64");
    CHECK(ki >= 0 && strcmp(kvg_gguf_key(g, ki), "t.f64") == 0 && kvg_gguf_kv_type(g, ki) == KVG_GGUF_FLOAT64);
    CHECK(kvg_gguf_key(g, -1) == NULL && kvg_gguf_key(g, 999) == NULL);

    kvg_gguf_vtype et;
    uint64_t n;
    CHECK(kvg_gguf_get_arr(g, "a.i32", &et, &n) && et == KVG_GGUF_INT32 && n == 5);
    const uint8_t *ad = kvg_gguf_arr_data(g, "a.i32");
    CHECK(ad && (int32_t)get_u32(ad + 4) == -2 && (int32_t)get_u32(ad + 16) == 5);
    CHECK(kvg_gguf_get_arr(g, "a.f32", &et, &n) && et == KVG_GGUF_FLOAT32 && n == 3);
    ad = kvg_gguf_arr_data(g, "a.f32");
    CHECK(ad && memcmp(ad, floats, sizeof floats) == 0);
    CHECK(kvg_gguf_get_arr(g, "a.bool", &et, &n) && et == KVG_GGUF_BOOL && n == 3);
    ad = kvg_gguf_arr_data(g, "a.bool");
    CHECK(ad && ad[0] == 1 && ad[1] == 0 && ad[2] == 1);
    ad = kvg_gguf_arr_data(g, "a.i64");
    CHECK(ad && (int64_t)get_u64(ad) == -1 && get_u64(ad + 8) == (uint64_t)INT64_MAX);
    CHECK(kvg_gguf_get_arr(g, "a.empty", &et, &n) && et == KVG_GGUF_UINT8 && n == 0);
    CHECK(kvg_gguf_get_arr(g, "a.str", &et, &n) && et == KVG_GGUF_STRING && n == 3);
    CHECK(kvg_gguf_arr_data(g, "a.str") == NULL);
    s = kvg_gguf_arr_str(g, "a.str", 0);
    CHECK(s.len == 3 && memcmp(s.ptr, "one", 3) == 0);
    s = kvg_gguf_arr_str(g, "a.str", 1);
    CHECK(s.len == 0 && s.ptr != NULL);
    s = kvg_gguf_arr_str(g, "a.str", 2);
    CHECK(s.len == 5 && memcmp(s.ptr, "thr\0e", 5) == 0);
    s = kvg_gguf_arr_str(g, "a.str", 3);
    CHECK(s.ptr == NULL && s.len == 0);
    CHECK(!kvg_gguf_get_arr(g, "t.u32", &et, &n));

    CHECK(kvg_gguf_get_arr(g, "a.nested", &et, &n) && et == KVG_GGUF_ARRAY && n == 3);
    const void *data = NULL;
    CHECK(kvg_gguf_arr_arr(g, "a.nested", 0, &et, &n, &data) && et == KVG_GGUF_UINT16 && n == 2);
    CHECK(data && ((const uint8_t *)data)[0] == 7 && ((const uint8_t *)data)[2] == 8);
    CHECK(kvg_gguf_arr_arr(g, "a.nested", 1, &et, &n, &data) && et == KVG_GGUF_UINT16 && n == 0);
    CHECK(kvg_gguf_arr_arr(g, "a.nested", 2, &et, &n, &data) && n == 1 && ((const uint8_t *)data)[0] == 9);
    CHECK(!kvg_gguf_arr_arr(g, "a.nested", 3, &et, &n, &data));
    CHECK(kvg_gguf_arr_arr(g, "a.nested_str", 1, &et, &n, &data) && et == KVG_GGUF_STRING && n == 2);
    CHECK(data && get_u64(data) == 2 && memcmp((const uint8_t *)data + 8, "yy", 2) == 0);

    const kvg_tensor *t = kvg_gguf_find_tensor(g, "t0.weight");
    CHECK(t && t->type == KVG_TYPE_F32 && t->n_dims == 2 && t->ne[0] == 5 && t->ne[1] == 3 && t->ne[2] == 1);
    CHECK(t && t->n_elements == 15 && t->nbytes == sizeof t0 && memcmp(t->data, t0, sizeof t0) == 0);
    t = kvg_gguf_find_tensor(g, "t1.weight");
    CHECK(t && t->type == KVG_TYPE_Q8_0 && t->nbytes == sizeof t1 && memcmp(t->data, t1, sizeof t1) == 0);
    CHECK(t && t->offset % 32 == 0);
    t = kvg_gguf_find_tensor(g, "t2");
    CHECK(t && t->type == KVG_TYPE_F16 && t->n_dims == 1 && t->ne[0] == 7 && memcmp(t->data, t2, sizeof t2) == 0);
    t = kvg_gguf_find_tensor(g, "t3.four_dims");
    CHECK(t && t->n_dims == 4 && t->ne[3] == 4 && t->n_elements == 256 && t->nbytes == sizeof t3);
    CHECK(kvg_gguf_tensor(g, 1) == kvg_gguf_find_tensor(g, "t1.weight") && kvg_gguf_tensor(g, 4) == NULL);
    CHECK(kvg_gguf_find_tensor(g, "t0") == NULL);
    for (int i = 0; i < kvg_gguf_n_tensors(g); i++) {
        const kvg_tensor *ti = kvg_gguf_tensor(g, i);
        CHECK((const uint8_t *)ti->data == (const uint8_t *)kvg_gguf_data_base(g) + ti->offset);
        CHECK(((const uint8_t *)ti->data - (const uint8_t *)kvg_gguf_data_base(g)) % 32 == 0);
    }

    /* copying every key and tensor through a second writer reproduces the file byte for byte */
    kvg_gguf_writer *w2 = kvg_gguf_writer_new();
    for (int i = 0; i < kvg_gguf_n_kv(g); i++) CHECK(kvg_gguf_copy_kv(w2, g, kvg_gguf_key(g, i)));
    CHECK(!kvg_gguf_copy_kv(w2, g, "absent"));
    for (int i = 0; i < kvg_gguf_n_tensors(g); i++) {
        const kvg_tensor *ti = kvg_gguf_tensor(g, i);
        kvg_gguf_add_tensor(w2, ti->name, ti->type, ti->n_dims, ti->ne, ti->data, ti->nbytes);
    }
    size_t n1 = 0, n2 = 0;
    unsigned char *b1 = kvg_gguf_writer_bytes(w, &n1), *b2 = kvg_gguf_writer_bytes(w2, &n2);
    CHECK(b1 && b2 && n1 == n2 && n1 == kvg_gguf_file_size(g) && memcmp(b1, b2, n1) == 0);
    free(b1);
    free(b2);
    kvg_gguf_writer_free(w2);

    /* a tensor whose data does not match its shape is refused at save time */
    kvg_gguf_add_tensor(w, "bad", KVG_TYPE_F32, 1, ne2, t0, 3);
    st = kvg_gguf_writer_save(w, path, &err);
    CHECK(st != KVGEN_OK && strstr(err.message, "bad") != NULL);
    kvg_gguf_close(g);
    kvg_gguf_writer_free(w);
    free(path);
}

/* ---- malformed files ---- */

/* Offsets inside the base file, found by walking it (it is valid, so the walk can be simple). */
typedef struct layout {
    size_t kv[8], kv_type[8], kv_val[8];
    size_t ti[4], ti_ndims[4], ti_ne[4], ti_type[4], ti_off[4];
    size_t n_kv, n_ti;
} layout;

static size_t skip_val(const uint8_t *b, size_t p, uint32_t t) {
    switch (t) {
    case KVG_GGUF_UINT32: return p + 4;
    case KVG_GGUF_STRING: return p + 8 + (size_t)get_u64(b + p);
    case KVG_GGUF_ARRAY: {
        uint32_t et = get_u32(b + p);
        uint64_t n = get_u64(b + p + 4);
        p += 12;
        for (uint64_t i = 0; i < n; i++) p = skip_val(b, p, et);
        return p;
    }
    default: return p; /* the base file uses no other types */
    }
}

static layout walk(const uint8_t *b) {
    layout L = {0};
    L.n_ti = (size_t)get_u64(b + 8);
    L.n_kv = (size_t)get_u64(b + 16);
    size_t p = 24;
    for (size_t i = 0; i < L.n_kv; i++) {
        L.kv[i] = p;
        p += 8 + (size_t)get_u64(b + p);
        L.kv_type[i] = p;
        L.kv_val[i] = p + 4;
        p = skip_val(b, p + 4, get_u32(b + p));
    }
    for (size_t i = 0; i < L.n_ti; i++) {
        L.ti[i] = p;
        p += 8 + (size_t)get_u64(b + p);
        L.ti_ndims[i] = p;
        uint32_t nd = get_u32(b + p);
        L.ti_ne[i] = p + 4;
        p += 4 + 8 * (size_t)nd;
        L.ti_type[i] = p;
        L.ti_off[i] = p + 4;
        p += 12;
    }
    return L;
}

static uint8_t *base_file(size_t *size) {
    kvg_gguf_writer *w = kvg_gguf_writer_new();
    kvg_gguf_set_str(w, "general.architecture", "llama");
    kvg_gguf_set_u32(w, "test.key_a", 5);
    kvg_gguf_set_u32(w, "test.key_b", 6);
    const kvg_str toks[3] = {{"a", 1}, {"bc", 2}, {"def", 3}};
    kvg_gguf_set_arr_str(w, "test.tokens", toks, 3);
    float f[16];
    for (int i = 0; i < 16; i++) f[i] = (float)i;
    uint8_t q[34] = {0};
    const uint64_t ne_a[2] = {8, 2}, ne_b[1] = {32};
    kvg_gguf_add_tensor(w, "tensor_a", KVG_TYPE_F32, 2, ne_a, f, sizeof f);
    kvg_gguf_add_tensor(w, "tensor_b", KVG_TYPE_Q8_0, 1, ne_b, q, sizeof q);
    uint8_t *b = kvg_gguf_writer_bytes(w, size);
    kvg_gguf_writer_free(w);
    return b;
}

/* writes the bytes, opens them and checks the failure: status, file name, and a phrase */
static void expect_fail(const char *label, const uint8_t *bytes, size_t n, kvgen_status want, const char *phrase) {
    char name[96];
    snprintf(name, sizeof name, "bad-%s.gguf", label);
    char *path = tu_tmpfile(name);
    CHECK(write_bytes(path, bytes, n));
    kvg_gguf *g = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvg_gguf_open(path, &g, &err);
    CHECKF(st == want, "%s: status %s, want %s (%s)", label, kvgen_status_name(st), kvgen_status_name(want),
           err.message);
    CHECKF(st == KVGEN_OK || g == NULL, "%s: a handle came back with an error", label);
    CHECKF(st == KVGEN_OK || strstr(err.message, path) != NULL, "%s: message does not name the file: %s", label,
           err.message);
    CHECKF(!phrase || strstr(err.message, phrase) != NULL, "%s: message lacks '%s': %s", label, phrase, err.message);
    if (g) kvg_gguf_close(g);
    free(path);
}

typedef void (*corrupt_fn)(uint8_t *b, const layout *L);

static void c_magic(uint8_t *b, const layout *L) { (void)L, b[3] = 'G'; }
static void c_v1(uint8_t *b, const layout *L) { (void)L, put_u32(b + 4, 1); }
static void c_v4(uint8_t *b, const layout *L) { (void)L, put_u32(b + 4, 4); }
static void c_big_endian(uint8_t *b, const layout *L) { (void)L, put_u32(b + 4, 0x03000000u); }
static void c_n_tensors(uint8_t *b, const layout *L) { (void)L, put_u64(b + 8, 1ull << 60); }
static void c_n_kv(uint8_t *b, const layout *L) { (void)L, put_u64(b + 16, 1ull << 60); }
static void c_n_kv_max(uint8_t *b, const layout *L) { (void)L, put_u64(b + 16, UINT64_MAX); }
static void c_n_kv_plus(uint8_t *b, const layout *L) { (void)L, put_u64(b + 16, 5); }
static void c_key_len(uint8_t *b, const layout *L) { put_u64(b + L->kv[1], 1ull << 63); }
static void c_key_len_eof(uint8_t *b, const layout *L) { put_u64(b + L->kv[3], 100000); }
static void c_str_len(uint8_t *b, const layout *L) { put_u64(b + L->kv_val[0], UINT64_MAX); }
static void c_arr_count(uint8_t *b, const layout *L) { put_u64(b + L->kv_val[3] + 4, 1ull << 62); }
static void c_arr_str_len(uint8_t *b, const layout *L) { put_u64(b + L->kv_val[3] + 12, UINT64_MAX - 3); }
static void c_vtype(uint8_t *b, const layout *L) { put_u32(b + L->kv_type[1], 13); }
static void c_vtype_huge(uint8_t *b, const layout *L) { put_u32(b + L->kv_type[1], 0xffffffffu); }
static void c_elem_type(uint8_t *b, const layout *L) { put_u32(b + L->kv_val[3], 99); }
static void c_dup_key(uint8_t *b, const layout *L) { b[L->kv[2] + 8 + 9] = 'a'; } /* test.key_b -> test.key_a */
static void c_key_nul(uint8_t *b, const layout *L) { b[L->kv[1] + 8 + 2] = 0; }
static void c_ttype(uint8_t *b, const layout *L) { put_u32(b + L->ti_type[1], 99); }
static void c_ttype_retired(uint8_t *b, const layout *L) { put_u32(b + L->ti_type[1], 4); }
static void c_ndims0(uint8_t *b, const layout *L) { put_u32(b + L->ti_ndims[0], 0); }
static void c_ndims5(uint8_t *b, const layout *L) { put_u32(b + L->ti_ndims[0], 5); }
static void c_ne_zero(uint8_t *b, const layout *L) { put_u64(b + L->ti_ne[0] + 8, 0); }
static void c_ne_overflow(uint8_t *b, const layout *L) {
    put_u64(b + L->ti_ne[0], 1ull << 32);
    put_u64(b + L->ti_ne[0] + 8, 1ull << 32);
}
static void c_ne_huge(uint8_t *b, const layout *L) { put_u64(b + L->ti_ne[0], UINT64_MAX); }
static void c_past_eof(uint8_t *b, const layout *L) { put_u64(b + L->ti_off[1], 1ull << 40); }
static void c_offset_wrap(uint8_t *b, const layout *L) { put_u64(b + L->ti_off[1], UINT64_MAX - 31); }
static void c_past_eof_by_one_block(uint8_t *b, const layout *L) { put_u64(b + L->ti_off[1], get_u64(b + L->ti_off[1]) + 32); }
static void c_misaligned(uint8_t *b, const layout *L) { put_u64(b + L->ti_off[1], get_u64(b + L->ti_off[1]) + 4); }
static void c_overlap(uint8_t *b, const layout *L) { put_u64(b + L->ti_off[1], 32); }
static void c_dup_tensor(uint8_t *b, const layout *L) { b[L->ti[1] + 8 + 7] = 'a'; } /* tensor_b -> tensor_a */

static void test_malformed(void) {
    size_t n = 0;
    uint8_t *base = base_file(&n);
    CHECK(base != NULL);
    if (!base) return;
    layout L = walk(base);
    CHECK(L.n_kv == 4 && L.n_ti == 2);
    expect_fail("valid", base, n, KVGEN_OK, NULL);

    /* every truncation fails: the file ends exactly where the last tensor does */
    int truncation_failures = 0;
    for (size_t cut = 0; cut < n; cut++) {
        char *path = tu_tmpfile("bad-truncated.gguf");
        write_bytes(path, base, cut);
        kvg_gguf *g = NULL;
        kvgen_error err = {0};
        kvgen_status st = kvg_gguf_open(path, &g, &err);
        if (st != KVGEN_E_FORMAT || g || !strstr(err.message, path)) {
            if (!truncation_failures)
                fprintf(stderr, "truncated at %zu: %s: %s\n", cut, kvgen_status_name(st), err.message);
            truncation_failures++;
        }
        if (g) kvg_gguf_close(g);
        free(path);
    }
    CHECKF(truncation_failures == 0, "%d of %zu truncations misbehaved", truncation_failures, n);

    const struct {
        const char *label;
        corrupt_fn fn;
        kvgen_status want;
        const char *phrase;
    } cases[] = {
        {"magic", c_magic, KVGEN_E_FORMAT, "not a GGUF file"},
        {"version1", c_v1, KVGEN_E_FORMAT, "version 1"},
        {"version4", c_v4, KVGEN_E_FORMAT, "version 4"},
        {"big-endian", c_big_endian, KVGEN_E_FORMAT, "big-endian"},
        {"n-tensors", c_n_tensors, KVGEN_E_FORMAT, "tensor count"},
        {"n-kv", c_n_kv, KVGEN_E_FORMAT, "metadata count"},
        {"n-kv-max", c_n_kv_max, KVGEN_E_FORMAT, "metadata count"},
        {"n-kv-plus-one", c_n_kv_plus, KVGEN_E_FORMAT, NULL},
        {"key-length", c_key_len, KVGEN_E_FORMAT, "past end of file"},
        {"key-length-eof", c_key_len_eof, KVGEN_E_FORMAT, "past end of file"},
        {"string-length", c_str_len, KVGEN_E_FORMAT, "general.architecture"},
        {"array-count", c_arr_count, KVGEN_E_FORMAT, "test.tokens"},
        {"array-string-length", c_arr_str_len, KVGEN_E_FORMAT, "past end of file"},
        {"value-type", c_vtype, KVGEN_E_FORMAT, "unknown value type 13"},
        {"value-type-huge", c_vtype_huge, KVGEN_E_FORMAT, "unknown value type"},
        {"element-type", c_elem_type, KVGEN_E_FORMAT, "unknown element type 99"},
        {"duplicate-key", c_dup_key, KVGEN_E_FORMAT, "duplicate key 'test.key_a'"},
        {"key-nul", c_key_nul, KVGEN_E_FORMAT, "NUL"},
        {"tensor-type", c_ttype, KVGEN_E_FORMAT, "tensor_b has unknown type 99"},
        {"tensor-type-retired", c_ttype_retired, KVGEN_E_FORMAT, "Q4_2"},
        {"n-dims-0", c_ndims0, KVGEN_E_FORMAT, "0 dimensions"},
        {"n-dims-5", c_ndims5, KVGEN_E_FORMAT, "5 dimensions"},
        {"ne-zero", c_ne_zero, KVGEN_E_FORMAT, "empty dimension"},
        {"ne-overflow", c_ne_overflow, KVGEN_E_FORMAT, "overflow"},
        {"ne-huge", c_ne_huge, KVGEN_E_FORMAT, "overflow"},
        {"past-eof", c_past_eof, KVGEN_E_FORMAT, "tensor_b extends past end of file"},
        {"offset-wrap", c_offset_wrap, KVGEN_E_FORMAT, "tensor_b extends past end of file"},
        {"past-eof-one-block", c_past_eof_by_one_block, KVGEN_E_FORMAT, "extends past end of file"},
        {"misaligned", c_misaligned, KVGEN_E_FORMAT, "not a multiple of the alignment 32"},
        {"overlap", c_overlap, KVGEN_E_FORMAT, "overlap"},
        {"duplicate-tensor", c_dup_tensor, KVGEN_E_FORMAT, "duplicate tensor name tensor_a"},
    };
    uint8_t *b = malloc(n);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(b, base, n);
        cases[i].fn(b, &L);
        expect_fail(cases[i].label, b, n, cases[i].want, cases[i].phrase);
    }

    /* rows that are not whole blocks: rebuild tensor_b's info as [16, 2] (one more dimension) */
    {
        size_t extra = 8, m = n + extra;
        uint8_t *r = malloc(m);
        size_t nd = L.ti_ndims[1];
        memcpy(r, base, nd);
        put_u32(r + nd, 2);
        put_u64(r + nd + 4, 16);
        put_u64(r + nd + 12, 2);
        memcpy(r + nd + 20, base + nd + 12, n - (nd + 12));
        /* the header grew by 8 bytes; the data section start is re-aligned so tensors keep their offsets */
        size_t hdr_end = L.ti_off[1] + 8, data = (hdr_end + 31) / 32 * 32, data2 = (hdr_end + extra + 31) / 32 * 32;
        uint8_t *r2 = calloc(1, data2 + (n - data));
        memcpy(r2, r, hdr_end + extra);
        memcpy(r2 + data2, base + data, n - data);
        expect_fail("row-length", r2, data2 + (n - data), KVGEN_E_FORMAT, "row length 16 is not a multiple");
        free(r);
        free(r2);
    }

    /* general.alignment: must be a uint32 power of two */
    const struct {
        const char *label;
        uint32_t type;
        uint32_t value;
        const char *phrase;
    } aligns[] = {
        {"align-0", KVG_GGUF_UINT32, 0, "power of two"},
        {"align-24", KVG_GGUF_UINT32, 24, "power of two"},
        {"align-type", KVG_GGUF_INT32, 32, "expected uint32"},
    };
    for (size_t i = 0; i < 3; i++) {
        kvg_gguf_writer *w = kvg_gguf_writer_new();
        uint8_t v[4];
        put_u32(v, aligns[i].value);
        kvg_gguf_set_raw(w, "general.alignment", (kvg_gguf_vtype)aligns[i].type, v, 4);
        size_t m;
        uint8_t *bytes = kvg_gguf_writer_bytes(w, &m);
        expect_fail(aligns[i].label, bytes, m, KVGEN_E_FORMAT, aligns[i].phrase);
        free(bytes);
        kvg_gguf_writer_free(w);
    }

    /* arrays nested deeper than the reader allows, and a bool scalar cut short at EOF */
    {
        uint8_t deep[12 * 10 + 12];
        for (int i = 0; i < 10; i++) put_u32(deep + 12 * i, KVG_GGUF_ARRAY), put_u64(deep + 12 * i + 4, 1);
        put_u32(deep + 120, KVG_GGUF_UINT8), put_u64(deep + 124, 0);
        kvg_gguf_writer *w = kvg_gguf_writer_new();
        kvg_gguf_set_raw(w, "deep", KVG_GGUF_ARRAY, deep, sizeof deep);
        size_t m;
        uint8_t *bytes = kvg_gguf_writer_bytes(w, &m);
        expect_fail("nesting", bytes, m, KVGEN_E_FORMAT, "nested");
        free(bytes);
        kvg_gguf_writer_free(w);
    }
    {
        /* a file with metadata only (no tensors) is valid even without a data section */
        kvg_gguf_writer *w = kvg_gguf_writer_new();
        kvg_gguf_set_bool(w, "flag", true);
        size_t m;
        uint8_t *bytes = kvg_gguf_writer_bytes(w, &m);
        expect_fail("metadata-only", bytes, m, KVGEN_OK, NULL);
        expect_fail("empty", bytes, 0, KVGEN_E_FORMAT, "empty");
        free(bytes);
        kvg_gguf_writer_free(w);
    }
    {
        /* version 2 files have the same layout as version 3 */
        memcpy(b, base, n);
        put_u32(b + 4, 2);
        expect_fail("version2", b, n, KVGEN_OK, NULL);
    }
    kvgen_error err = {0};
    kvg_gguf *g = NULL;
    CHECK(kvg_gguf_open("/nonexistent/dir/x.gguf", &g, &err) == KVGEN_E_IO && strstr(err.message, "x.gguf"));
    char *dir = tu_tmpfile("");
    CHECK(kvg_gguf_open(dir, &g, &err) == KVGEN_E_IO && g == NULL);
    free(dir);

    /* fuzz: flip bytes of the header and metadata (seeded, so a failure reproduces) */
    uint64_t s = 0x9e3779b97f4a7c15ull;
    size_t header_end = L.ti_off[1] + 8;
    int fuzz_bad = 0, opened = 0;
    char *path = tu_tmpfile("fuzz.gguf");
    for (int it = 0; it < 1500; it++) {
        memcpy(b, base, n);
        int flips = 1 + it % 4;
        for (int k = 0; k < flips; k++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            size_t at = (size_t)(s % header_end);
            uint8_t v = (uint8_t)(s >> 32);
            b[at] = (it & 1) ? v : (uint8_t)(b[at] ^ (1u << (v & 7)));
        }
        write_bytes(path, b, n);
        kvgen_error e = {0};
        kvgen_status st = kvg_gguf_open(path, &g, &e);
        if (st == KVGEN_OK) {
            opened++;
            /* whatever opened must be internally consistent */
            for (int i = 0; i < kvg_gguf_n_tensors(g); i++) {
                const kvg_tensor *t = kvg_gguf_tensor(g, i);
                if (t->offset + t->nbytes > n || t->nbytes != kvg_row_bytes(t->type, t->n_elements)) fuzz_bad++;
            }
            for (int i = 0; i < kvg_gguf_n_kv(g); i++) {
                const char *key = kvg_gguf_key(g, i);
                kvg_gguf_vtype et;
                uint64_t cnt;
                if (kvg_gguf_get_arr(g, key, &et, &cnt) && et == KVG_GGUF_STRING)
                    for (uint64_t j = 0; j < cnt; j++) (void)kvg_gguf_arr_str(g, key, j);
            }
            kvg_gguf_close(g);
        } else if ((st != KVGEN_E_FORMAT && st != KVGEN_E_UNSUPPORTED) || !strstr(e.message, path)) {
            if (!fuzz_bad) fprintf(stderr, "fuzz %d: %s: %s\n", it, kvgen_status_name(st), e.message);
            fuzz_bad++;
        }
    }
    CHECKF(fuzz_bad == 0, "fuzz: %d bad outcomes", fuzz_bad);
    printf("fuzz: %d of 1500 corrupted files still opened (flipped bytes in values)\n", opened);
    free(path);
    free(b);
    free(base);
}

static void test_default_model(void) {
    const char *path = tu_model_path();
    if (!path) {
        printf("default model absent: skipping its checks\n");
        return;
    }
    kvg_gguf *g = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvg_gguf_open(path, &g, &err);
    CHECKF(st == KVGEN_OK, "%s", err.message);
    if (st) return;
    CHECK(kvg_gguf_version(g) == 3);
    CHECK(kvg_gguf_n_tensors(g) == 272);
    CHECK(kvg_gguf_alignment(g) == 32);
    kvg_str s;
    CHECK(kvg_gguf_get_str(g, "general.architecture", &s) && s.len == 5 && memcmp(s.ptr, "llama", 5) == 0);
    CHECK(kvg_gguf_get_str(g, "tokenizer.ggml.pre", &s) && s.len == 6 && memcmp(s.ptr, "smollm", 6) == 0);
    uint32_t v;
    CHECK(kvg_gguf_get_u32(g, "llama.block_count", &v) && v == 30);
    kvg_gguf_vtype et;
    uint64_t n;
    CHECK(kvg_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) && et == KVG_GGUF_STRING && n == 49152);
    s = kvg_gguf_arr_str(g, "tokenizer.ggml.tokens", 0);
    CHECK(s.len == 13 && memcmp(s.ptr, "<|endoftext|>", 13) == 0);
    const kvg_tensor *t = kvg_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->type == KVG_TYPE_Q8_0 && t->ne[0] == 576 && t->ne[1] == 49152);
    CHECK(t && t->nbytes == (size_t)576 / 32 * 34 * 49152);
    t = kvg_gguf_find_tensor(g, "blk.29.ffn_down.weight");
    CHECK(t && t->type == KVG_TYPE_Q4_1 && t->ne[0] == 1536 && t->ne[1] == 576);
    t = kvg_gguf_find_tensor(g, "output_norm.weight");
    CHECK(t && t->type == KVG_TYPE_F32 && t->n_dims == 1 && t->ne[0] == 576);
    CHECK(kvg_gguf_find_tensor(g, "output.weight") == NULL);
    kvg_gguf_close(g);
}

int main(void) {
    test_round_trip();
    test_malformed();
    test_default_model();
    return tu_finish("test_gguf");
}
