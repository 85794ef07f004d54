/* test_memory.c: the memory store (kvgen_memory_*): searches equal a brute-force double
 * reference over the stored vectors (several dims, f32 and f16, filters, removes), get, save and
 * load round trips, and every refusal (bad arguments, zero and non-finite vectors, wrong dim,
 * truncated and corrupted files, another embedding identity, a save into a missing folder that
 * leaves the old file as it was). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvgen.h"
#include "testutil.h"

static uint64_t rng = 0x1234567;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static const char *const TOWNS[] = {"mill", "forge", "inn"};

/* checks one search against the reference: every stored vector (kvgen_memory_get) dotted in
 * double with the normalized query, the filter applied, the k best by (score desc, id asc) */
static void check_search_by(kvgen_memory *m, const float *q, int dim, size_t k, const char *key, const char *town,
                            const char *what) {
    kvgen_memory_info info;
    kvgen_memory_get_info(m, &info);
    double qn = 0;
    for (int i = 0; i < dim; i++) qn += (double)q[i] * q[i];
    qn = sqrt(qn);
    /* the reference over every id up to next_id */
    size_t n = 0;
    uint64_t *ids = malloc((info.next_id + 1) * sizeof *ids);
    double *sc = malloc((info.next_id + 1) * sizeof *sc);
    float *v = malloc((size_t)dim * sizeof *v);
    for (uint64_t id = 1; id < info.next_id; id++) {
        kvgen_memory_entry e;
        if (kvgen_memory_get(m, id, &e, v, (size_t)dim, NULL) != KVGEN_OK) continue;
        if (town) {
            bool match = false;
            for (size_t f = 0; f < e.n_fields; f++)
                if (!strcmp(e.fields[f].key, key)) match = !strcmp(e.fields[f].value, town);
            if (!match) continue;
        }
        double s = 0;
        for (int i = 0; i < dim; i++) s += (double)v[i] * q[i];
        ids[n] = id;
        sc[n++] = s / qn;
    }
    /* selection sort of the k best, the reference's order */
    size_t want = n < k ? n : k;
    for (size_t i = 0; i < want; i++) {
        size_t b = i;
        for (size_t j = i + 1; j < n; j++)
            if (sc[j] > sc[b] || (sc[j] == sc[b] && ids[j] < ids[b])) b = j;
        double ts = sc[i];
        sc[i] = sc[b];
        sc[b] = ts;
        uint64_t ti = ids[i];
        ids[i] = ids[b];
        ids[b] = ti;
    }
    kvgen_memory_hit *hits = malloc((k ? k : 1) * sizeof *hits);
    size_t got = 99;
    kvgen_memory_field where = {key, town};
    kvgen_error err = {0};
    kvgen_status st = kvgen_memory_search(m, q, (size_t)dim, k, town ? &where : NULL, hits, &got, &err);
    CHECKF(st == KVGEN_OK, "%s: %s", what, err.message);
    CHECKF(got == want, "%s: %zu hits, expected %zu", what, got, want);
    const double tol = 2e-5;
    for (size_t i = 0; i < got && i < want; i++) {
        CHECKF(fabs(hits[i].score - sc[i]) < tol, "%s: rank %zu: score %.7f, reference %.7f", what, i,
               (double)hits[i].score, sc[i]);
        if (i > 0)
            CHECKF(hits[i].score < hits[i - 1].score ||
                       (hits[i].score == hits[i - 1].score && hits[i].id > hits[i - 1].id),
                   "%s: rank %zu out of order", what, i);
        /* the hit's own reference score: exact ids where no near-tie makes the order a matter of
         * rounding */
        bool near_tie = (i + 1 < n && fabs(sc[i] - sc[i + 1]) < tol) || (i > 0 && fabs(sc[i] - sc[i - 1]) < tol);
        if (!near_tie) CHECKF(hits[i].id == ids[i], "%s: rank %zu: id %llu, reference %llu", what, i,
                              (unsigned long long)hits[i].id, (unsigned long long)ids[i]);
        double own = NAN;
        for (size_t j = 0; j < n; j++)
            if (ids[j] == hits[i].id) own = sc[j];
        CHECKF(fabs(own - hits[i].score) < tol, "%s: id %llu: score %.7f, its reference %.7f", what,
               (unsigned long long)hits[i].id, (double)hits[i].score, own);
    }
    free(ids);
    free(sc);
    free(v);
    free(hits);
}

static void check_search(kvgen_memory *m, const float *q, int dim, size_t k, const char *town, const char *what) {
    check_search_by(m, q, dim, k, "town", town, what);
}

static void random_vec(float *v, int dim) {
    for (int i = 0; i < dim; i++) v[i] = (float)(urand() * 2 - 1);
}

static void test_search(int dim, kvgen_memory_storage storage) {
    char what[64];
    snprintf(what, sizeof what, "dim %d %s", dim, storage ? "f16" : "f32");
    kvgen_memory *m = NULL;
    kvgen_memory_desc d = {.dim = dim, .storage = storage, .embedding_id = 42};
    CHECK_OK(kvgen_memory_create(&d, &m, NULL));
    if (!m) return;
    float *v = malloc((size_t)dim * sizeof *v);
    const int N = 700;
    for (int i = 0; i < N; i++) {
        random_vec(v, dim);
        if (i % 50 == 7 && i > 7) { /* duplicates: exact ties, broken by id */
            kvgen_memory_entry e;
            kvgen_memory_get(m, (uint64_t)i - 6, &e, v, (size_t)dim, NULL);
        }
        char text[32];
        snprintf(text, sizeof text, "memory %d", i);
        kvgen_memory_field f[3] = {{"town", TOWNS[i % 3]}, {"mood", i % 2 ? "calm" : "angry"}, {"kind", "said"}};
        uint64_t id = 0;
        CHECK_OK(kvgen_memory_add(m, text, f, (size_t)(i % 4 == 3 ? 0 : i % 16 == 1 ? 2 : 3), v, (size_t)dim, &id, NULL));
        CHECK(id == (uint64_t)i + 1);
    }
    CHECK(kvgen_memory_count(m) == (size_t)N);
    for (int t = 0; t < 3; t++) {
        random_vec(v, dim);
        check_search(m, v, dim, 10, NULL, what);
        check_search(m, v, dim, 1, NULL, what);
        check_search(m, v, dim, 5, TOWNS[t], what);
        check_search_by(m, v, dim, 9, "kind", "said", what); /* most rows match: whole blocks */
        check_search_by(m, v, dim, 4, "mood", "calm", what);
        check_search(m, v, dim, 2000, NULL, what); /* k past the count: everything, sorted */
    }
    /* the query equal to a stored vector finds it first (score 1) */
    kvgen_memory_entry e;
    CHECK_OK(kvgen_memory_get(m, 102, &e, v, (size_t)dim, NULL));
    CHECK(!strcmp(e.text, "memory 101") && e.n_fields == 3 && !strcmp(e.fields[0].value, TOWNS[101 % 3]) &&
          !strcmp(e.fields[1].key, "mood") && !strcmp(e.fields[1].value, "calm"));
    CHECK_OK(kvgen_memory_get(m, 100, &e, NULL, 0, NULL));
    CHECK(!strcmp(e.text, "memory 99") && e.n_fields == 0 && e.fields == NULL);
    kvgen_memory_hit hit;
    size_t got = 0;
    CHECK_OK(kvgen_memory_search(m, v, (size_t)dim, 1, NULL, &hit, &got, NULL));
    if (dim >= 8) CHECK(got == 1 && hit.id == 102 && fabsf(hit.score - 1) < (storage ? 2e-3f : 1e-5f));
    /* removes (first, middle, last), then the reference again */
    for (uint64_t id = 1; id <= (uint64_t)N; id += 4) CHECK_OK(kvgen_memory_remove(m, id, NULL));
    CHECK_OK(kvgen_memory_remove(m, (uint64_t)N - 1, NULL));
    kvgen_error err = {0};
    CHECK(kvgen_memory_remove(m, 1, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "id 1"));
    CHECK(kvgen_memory_get(m, 5, &e, NULL, 0, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "id 5"));
    for (int t = 0; t < 3; t++) {
        random_vec(v, dim);
        check_search(m, v, dim, 7, NULL, what);
        check_search(m, v, dim, 7, TOWNS[t], what);
    }
    /* adds after removes get fresh ids */
    uint64_t id = 0;
    CHECK_OK(kvgen_memory_add(m, "late", NULL, 0, v, (size_t)dim, &id, NULL));
    CHECK(id == (uint64_t)N + 1);
    check_search(m, v, dim, 3, NULL, what);
    /* save and load: the same results, bit for bit */
    char *file = tu_tmpfile("store.kvm");
    CHECK_OK(kvgen_memory_save(m, file, NULL));
    kvgen_memory *l = NULL;
    kvgen_memory_desc expect = {.dim = dim, .embedding_id = 42};
    CHECK_OK(kvgen_memory_load(file, &expect, &l, NULL));
    if (l) {
        kvgen_memory_info a, b;
        kvgen_memory_get_info(m, &a);
        kvgen_memory_get_info(l, &b);
        CHECK(a.count == b.count && a.next_id == b.next_id && a.dim == b.dim && a.storage == b.storage &&
              b.embedding_id == 42);
        for (int t = 0; t < 3; t++) {
            random_vec(v, dim);
            kvgen_memory_hit h1[20], h2[20];
            size_t n1 = 0, n2 = 0;
            kvgen_memory_field w = {"town", TOWNS[t]};
            for (int f = 0; f < 2; f++) {
                CHECK_OK(kvgen_memory_search(m, v, (size_t)dim, 20, f ? &w : NULL, h1, &n1, NULL));
                CHECK_OK(kvgen_memory_search(l, v, (size_t)dim, 20, f ? &w : NULL, h2, &n2, NULL));
                bool same = n1 == n2 && n1 == 20;
                for (size_t j = 0; same && j < n1; j++) same = h1[j].id == h2[j].id && h1[j].score == h2[j].score;
                CHECKF(same, "%s: %zu %zu hits, first %llu %g / %llu %g",
                       what, n1, n2, (unsigned long long)h1[0].id, (double)h1[0].score, (unsigned long long)h2[0].id,
                       (double)h2[0].score);
            }
        }
        for (uint64_t i = 1; i <= (uint64_t)N + 1; i++) {
            kvgen_memory_entry e1, e2;
            kvgen_status s1 = kvgen_memory_get(m, i, &e1, NULL, 0, NULL), s2 = kvgen_memory_get(l, i, &e2, NULL, 0, NULL);
            CHECK(s1 == s2);
            if (s1 == KVGEN_OK && s2 == KVGEN_OK) {
                CHECK(!strcmp(e1.text, e2.text) && e1.n_fields == e2.n_fields);
                for (size_t f = 0; f < e1.n_fields && f < e2.n_fields; f++)
                    CHECK(!strcmp(e1.fields[f].key, e2.fields[f].key) && !strcmp(e1.fields[f].value, e2.fields[f].value));
            }
        }
        uint64_t lid = 0;
        CHECK_OK(kvgen_memory_add(l, "after load", NULL, 0, v, (size_t)dim, &lid, NULL));
        CHECK(lid == (uint64_t)N + 2);
        kvgen_memory_free(l);
    }
    free(file);
    free(v);
    kvgen_memory_free(m);
}

static void test_refusals(void) {
    kvgen_error err = {0};
    kvgen_memory *m = NULL;
    kvgen_memory_desc d = {.dim = 0};
    CHECK(kvgen_memory_create(&d, &m, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "kvgen_memory_create") &&
          strstr(err.message, "dim 0"));
    d.dim = 70000;
    CHECK(kvgen_memory_create(&d, &m, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "dim 70000"));
    d = (kvgen_memory_desc){.dim = 4, .storage = (kvgen_memory_storage)7};
    CHECK(kvgen_memory_create(&d, &m, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "storage 7"));
    CHECK(kvgen_memory_create(NULL, &m, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "desc"));
    d = (kvgen_memory_desc){.dim = 4, .embedding_id = 7};
    CHECK(kvgen_memory_create(&d, NULL, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK_OK(kvgen_memory_create(&d, &m, NULL));
    if (!m) return;
    float v[5] = {1, 2, 3, 4, 5}, zero[4] = {0}, bad[4] = {1, NAN, 0, 0}, inf[4] = {0, 0, INFINITY, 0};
    uint64_t id = 99;
    CHECK(kvgen_memory_add(m, "x", NULL, 0, zero, 4, &id, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "kvgen_memory_add: vec is the zero vector") && id == 0);
    CHECK(kvgen_memory_add(m, "x", NULL, 0, bad, 4, &id, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "vec[1] is nan"));
    CHECK(kvgen_memory_add(m, "x", NULL, 0, inf, 4, &id, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "vec[2] is inf"));
    CHECK(kvgen_memory_add(m, "x", NULL, 0, v, 5, &id, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "vec has 5 elements, the store's dim is 4"));
    CHECK(kvgen_memory_add(m, "x", NULL, 0, NULL, 4, &id, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "vec is NULL"));
    CHECK(kvgen_memory_add(m, NULL, NULL, 0, v, 4, &id, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "text is NULL"));
    CHECK(kvgen_memory_add(NULL, "x", NULL, 0, v, 4, &id, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_memory_add(m, "x", NULL, 2, v, 4, &id, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "fields is NULL"));
    kvgen_memory_field f[2] = {{"a", "1"}, {"a", "2"}};
    CHECK(kvgen_memory_add(m, "x", f, 2, v, 4, &id, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "fields[1].key 'a' repeats"));
    f[1] = (kvgen_memory_field){"", "2"};
    CHECK(kvgen_memory_add(m, "x", f, 2, v, 4, &id, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "fields[1].key is empty"));
    f[1] = (kvgen_memory_field){"b", NULL};
    CHECK(kvgen_memory_add(m, "x", f, 2, v, 4, &id, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "fields[1].value (key 'b') is NULL"));
    CHECK(kvgen_memory_count(m) == 0);
    CHECK_OK(kvgen_memory_add(m, "ok", NULL, 0, v, 4, &id, NULL));
    CHECK(id == 1);
    kvgen_memory_hit h[2];
    size_t n = 0;
    CHECK(kvgen_memory_search(m, zero, 4, 2, NULL, h, &n, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "kvgen_memory_search: query is the zero vector"));
    CHECK(kvgen_memory_search(m, v, 3, 2, NULL, h, &n, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "query has 3 elements"));
    CHECK(kvgen_memory_search(m, v, 4, 2, NULL, NULL, &n, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "out is NULL"));
    CHECK(kvgen_memory_search(m, v, 4, 2, NULL, h, NULL, &err) == KVGEN_E_INVALID_ARGUMENT);
    kvgen_memory_field w = {"k", NULL};
    CHECK(kvgen_memory_search(m, v, 4, 2, &w, h, &n, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "where->value is NULL"));
    w.value = "absent";
    CHECK_OK(kvgen_memory_search(m, v, 4, 2, &w, h, &n, NULL));
    CHECK(n == 0);
    /* a filter on a memory's fifth field */
    kvgen_memory_field five[5] = {{"a", "1"}, {"b", "2"}, {"c", "3"}, {"d", "4"}, {"e", "5"}};
    uint64_t id5 = 0;
    CHECK_OK(kvgen_memory_add(m, "five", five, 5, v, 4, &id5, NULL));
    for (int i = 0; i < 5; i++) {
        CHECK_OK(kvgen_memory_search(m, v, 4, 2, &five[i], h, &n, NULL));
        CHECK(n == 1 && h[0].id == id5);
    }
    w = (kvgen_memory_field){"e", "4"};
    CHECK_OK(kvgen_memory_search(m, v, 4, 2, &w, h, &n, NULL));
    CHECK(n == 0);
    CHECK_OK(kvgen_memory_remove(m, id5, NULL));
    CHECK_OK(kvgen_memory_search(m, v, 4, 0, NULL, NULL, &n, NULL));
    CHECK(n == 0);
    float got[4];
    kvgen_memory_entry e;
    CHECK(kvgen_memory_get(m, 1, &e, got, 3, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "vec has 3"));
    CHECK(kvgen_memory_get(m, 0, &e, NULL, 0, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "id 0"));

    /* files */
    char *file = tu_tmpfile("refusals.kvm"), *bad_file = tu_tmpfile("bad.kvm");
    CHECK(kvgen_memory_save(m, "", &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_memory_save(NULL, file, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK_OK(kvgen_memory_save(m, file, NULL));
    size_t size = 0;
    unsigned char *bytes = (unsigned char *)tu_read_file(file, &size);
    CHECK(bytes && size > 64);
    kvgen_memory *l = NULL;
    kvgen_memory_desc expect = {.dim = 5};
    CHECK(kvgen_memory_load(file, &expect, &l, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "kvgen_memory_load") && strstr(err.message, "vectors of dim 4, expected 5") && !l);
    expect = (kvgen_memory_desc){.embedding_id = 8};
    CHECK(kvgen_memory_load(file, &expect, &l, &err) == KVGEN_E_INVALID_ARGUMENT &&
          strstr(err.message, "another embedding model") && !l);
    expect = (kvgen_memory_desc){.dim = 4, .embedding_id = 7};
    CHECK_OK(kvgen_memory_load(file, &expect, &l, NULL));
    kvgen_memory_free(l);
    l = NULL;
    CHECK_OK(kvgen_memory_load(file, NULL, &l, NULL)); /* no expectation: anything */
    kvgen_memory_free(l);
    l = NULL;
    CHECK(kvgen_memory_load(NULL, NULL, &l, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_memory_load(file, NULL, NULL, &err) == KVGEN_E_INVALID_ARGUMENT);
    /* truncated at every length */
    for (size_t cut = 0; cut < size; cut++) {
        FILE *fp = fopen(bad_file, "wb");
        fwrite(bytes, 1, cut, fp);
        fclose(fp);
        kvgen_status st = kvgen_memory_load(bad_file, NULL, &l, &err);
        CHECKF(st == KVGEN_E_FORMAT && !l, "cut at %zu: %s", cut, err.message);
        if (cut >= 64 + 8) CHECKF(strstr(err.message, "truncated"), "cut at %zu: %s", cut, err.message);
    }
    /* every byte flipped */
    for (size_t i = 0; i < size; i++) {
        bytes[i] ^= 0x10;
        FILE *fp = fopen(bad_file, "wb");
        fwrite(bytes, 1, size, fp);
        fclose(fp);
        bytes[i] ^= 0x10;
        kvgen_status st = kvgen_memory_load(bad_file, &expect, &l, &err);
        CHECKF(st != KVGEN_OK && !l, "byte %zu flipped: loaded", i);
        CHECKF(st == KVGEN_E_FORMAT || st == KVGEN_E_UNSUPPORTED, "byte %zu: %s", i, err.message);
        if (i >= 16 && i < 56) CHECKF(strstr(err.message, "corrupted"), "byte %zu: %s", i, err.message);
    }
    /* not a memory file */
    FILE *fp = fopen(bad_file, "wb");
    fputs("KVGSESS\0 something else entirely, long enough to be a header of some sort..........", fp);
    fclose(fp);
    CHECK(kvgen_memory_load(bad_file, NULL, &l, &err) == KVGEN_E_FORMAT && strstr(err.message, "not a kvgen memory file"));
    CHECK(kvgen_memory_load("/nonexistent/x.kvm", NULL, &l, &err) == KVGEN_E_IO && strstr(err.message, "cannot open"));
#ifndef _WIN32
    CHECK(kvgen_memory_load("/dev/zero", NULL, &l, &err) == KVGEN_E_IO && strstr(err.message, "not a regular file"));
#endif
    /* a save into a missing folder, or onto a folder, fails and leaves the old file intact */
    char missing[512];
    snprintf(missing, sizeof missing, "%s.nodir/x.kvm", file);
    CHECK(kvgen_memory_save(m, missing, &err) == KVGEN_E_IO && strstr(err.message, "kvgen_memory_save") &&
          strstr(err.message, "temporary file"));
#ifndef _WIN32
    CHECK(kvgen_memory_save(m, "/dev/null", &err) == KVGEN_E_IO && strstr(err.message, "not a regular file"));
#endif
    CHECK_OK(kvgen_memory_add(m, "second", NULL, 0, v, 4, &id, NULL));
    CHECK(kvgen_memory_save(m, bad_file, NULL) == KVGEN_OK); /* another file: the first stays */
    snprintf(missing, sizeof missing, "%s.nodir/deeper/y.kvm", file);
    CHECK(kvgen_memory_save(m, missing, &err) == KVGEN_E_IO);
    size_t size2 = 0;
    char *after = tu_read_file(file, &size2);
    CHECK(after && size2 == size && memcmp(after, bytes, size) == 0);
    free(after);
    free(bytes);
    free(file);
    free(bad_file);
    kvgen_memory_free(m);
}

int main(void) {
    test_refusals();
    int dims[] = {1, 3, 8, 17, 64, 100, 384};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        test_search(dims[i], KVGEN_MEMORY_F32);
        test_search(dims[i], KVGEN_MEMORY_F16);
    }
    /* the portable C path (and avx2 where the best is another) against the same reference */
    const char *isas[] = {"portable", "avx2"};
    for (int p = 0; p < 2; p++) {
        setenv("KVGEN_CPU_ISA", isas[p], 1);
        kvgen_memory *m = NULL;
        kvgen_memory_desc d = {.dim = 8};
        if (kvgen_memory_create(&d, &m, NULL) != KVGEN_OK) continue; /* the CPU lacks it */
        kvgen_memory_info info;
        kvgen_memory_get_info(m, &info);
        CHECK(!strcmp(info.isa, isas[p]));
        kvgen_memory_free(m);
        test_search(17, KVGEN_MEMORY_F32);
        test_search(100, KVGEN_MEMORY_F16);
    }
    setenv("KVGEN_CPU_ISA", "sse9", 1);
    kvgen_memory *m = NULL;
    kvgen_memory_desc d = {.dim = 8};
    kvgen_error err = {0};
    CHECK(kvgen_memory_create(&d, &m, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "KVGEN_CPU_ISA=sse9"));
    unsetenv("KVGEN_CPU_ISA");
    return tu_finish("test_memory");
}
