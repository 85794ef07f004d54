/* test_session_file.c: kvgen_session_save / kvgen_session_restore: identical next-token
 * logits and samples after a restore, and clear refusals of foreign, truncated, corrupted and
 * newer files. */
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include "testutil.h"

static int n_vocab;

static kvgen_model *load(const char *path, int contiguous) {
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 2,
                           .kv_contiguous = contiguous};
    return tu_load(&md);
}

static bool write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static void expect_refusal(kvgen_model *m, const char *path, kvgen_status want, const char *phrase, const char *what) {
    kvgen_error err = {0};
    kvgen_session *s = (kvgen_session *)&err; /* must be reset to NULL */
    kvgen_status st = kvgen_session_restore(m, path, &s, &err);
    CHECKF(st == want && s == NULL, "%s: status %s, want %s", what, kvgen_status_name(st), kvgen_status_name(want));
    CHECKF(strstr(err.message, phrase) != NULL && strstr(err.message, path) != NULL, "%s: message '%s' lacks '%s'",
           what, err.message, phrase);
    printf("%s: %s\n", what, err.message);
}

/* save, restore, then both continue the same way: same logits, same samples */
static void round_trip(kvgen_model *saver, kvgen_model *loader, bool shift, const char *what) {
    kvgen_error err = {0};
    kvgen_session *s = NULL, *r = NULL;
    kvgen_session_desc sd = {.n_ctx = 96, .temperature = 0.8f, .top_k = 20, .seed = 5};
    if (shift) {
        sd.on_full = KVGEN_ON_FULL_SHIFT;
        sd.keep = 4;
    }
    CHECK_OK(kvgen_session_create(saver, &sd, &s, &err));
    int32_t t[150];
    tu_fill_tokens(t, 150, 9, n_vocab);
    CHECK_OK(kvgen_session_prefill(s, t, shift ? 96 : 70, NULL, &err));
    if (shift) CHECK_OK(kvgen_session_decode(s, t[100], &err));
    kvgen_session_sample(s); /* advance the RNG: the restored one must continue from here */
    char *file = tu_tmpfile("session.kvs");
    CHECK_OK(kvgen_session_save(s, file, &err));
    CHECK_OK(kvgen_session_restore(loader, file, &r, &err));
    if (r) {
        CHECK(kvgen_session_length(r) == kvgen_session_length(s));
        CHECK(memcmp(kvgen_session_tokens(r), kvgen_session_tokens(s), kvgen_session_length(s) * 4) == 0);
        const float *a = kvgen_session_logits(s), *b = kvgen_session_logits(r);
        CHECKF(a && b && memcmp(a, b, (size_t)n_vocab * 4) == 0, "%s: restored logits differ", what);
        kvgen_cache_info ca, cb;
        kvgen_session_cache_info(s, &ca);
        kvgen_session_cache_info(r, &cb);
        CHECK(ca.capacity == cb.capacity && ca.shifts == cb.shifts);
        size_t nf = (size_t)ca.n_head_kv * ca.length * ca.head_dim;
        float *ka = malloc(nf * 4), *kb = malloc(nf * 4);
        CHECK_OK(kvgen_session_read_cache(s, 1, 0, ka, nf, &err));
        CHECK_OK(kvgen_session_read_cache(r, 1, 0, kb, nf, &err));
        double d = 0;
        for (size_t i = 0; i < nf; i++) d = fmax(d, fabs((double)ka[i] - kb[i]));
        /* a contiguous loader recomputes, which equals the saved K/V unless a shift made them differ */
        CHECKF(d == 0 || (shift && saver != loader), "%s: restored K differs by %g", what, d);
        free(ka);
        free(kb);
        /* a contiguous loader recomputes a shifted session's K/V, which then differ slightly:
         * only the first draw (from the saved logits) must agree */
        int n_draws = shift && saver != loader ? 1 : 12;
        for (int i = 0; i < n_draws; i++) {
            int32_t x = kvgen_session_sample(s), y = kvgen_session_sample(r);
            CHECKF(x == y, "%s: sample %d differs (%d vs %d)", what, i, (int)x, (int)y);
            CHECK_OK(kvgen_session_decode(s, x, &err));
            CHECK_OK(kvgen_session_decode(r, y, &err));
            if (!shift || saver == loader)
                CHECKF(memcmp(kvgen_session_logits(s), kvgen_session_logits(r), (size_t)n_vocab * 4) == 0,
                       "%s: logits differ %d tokens after the restore", what, i + 1);
        }
    }
    kvgen_session_close(r);
    kvgen_session_close(s);
    free(file);
}

static void test_refusals(kvgen_model *m, kvgen_model *other) {
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {.n_ctx = 64};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    int32_t t[40];
    tu_fill_tokens(t, 40, 3, n_vocab);
    CHECK_OK(kvgen_session_prefill(s, t, 40, NULL, &err));
    char *file = tu_tmpfile("good.kvs"), *bad = tu_tmpfile("bad.kvs");
    CHECK_OK(kvgen_session_save(s, file, &err));
    kvgen_session_close(s);
    size_t size = 0;
    char *bytes = tu_read_file(file, &size);
    CHECK(bytes && size > 200);
    if (!bytes) return;

    expect_refusal(other, file, KVGEN_E_INVALID_ARGUMENT, "another model", "other model");
    char *missing = tu_tmpfile("missing.kvs");
    remove(missing);
    expect_refusal(m, missing, KVGEN_E_IO, "cannot open", "missing file");
    free(missing);

    write_file(bad, bytes, size / 2);
    expect_refusal(m, bad, KVGEN_E_FORMAT, "truncated", "truncated file");
    write_file(bad, bytes, 10);
    expect_refusal(m, bad, KVGEN_E_FORMAT, "truncated", "truncated header");
    write_file(bad, bytes, 0);
    expect_refusal(m, bad, KVGEN_E_FORMAT, "not a kvgen session", "empty file");

    /* one flipped bit anywhere past the magic and version: checksum */
    size_t spots[] = {20, 60, 130, size / 2, size - 20, size - 1};
    for (size_t i = 0; i < sizeof spots / sizeof spots[0]; i++) {
        bytes[spots[i]] ^= 0x10;
        write_file(bad, bytes, size);
        bytes[spots[i]] ^= 0x10;
        char what[64];
        snprintf(what, sizeof what, "bit flip at %zu", spots[i]);
        expect_refusal(m, bad, KVGEN_E_FORMAT, "corrupted", what);
    }
    /* extra bytes */
    char *longer = malloc(size + 3);
    memcpy(longer, bytes, size);
    memset(longer + size, 0, 3);
    write_file(bad, longer, size + 3);
    expect_refusal(m, bad, KVGEN_E_FORMAT, "corrupted", "trailing bytes");
    free(longer);

    /* a newer version: refused before anything else is read */
    bytes[8] = 2;
    write_file(bad, bytes, size);
    expect_refusal(m, bad, KVGEN_E_UNSUPPORTED, "newer", "version 2");
    bytes[8] = 1;
    bytes[0] = 'X';
    write_file(bad, bytes, size);
    expect_refusal(m, bad, KVGEN_E_FORMAT, "not a kvgen session", "bad magic");
    bytes[0] = 'K';
    write_file(bad, bytes, size);
    CHECK_OK(kvgen_session_restore(m, bad, &s, &err)); /* the untouched bytes still load */
    kvgen_session_close(s);

    CHECK(kvgen_session_save(NULL, file, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_session_restore(m, NULL, &s, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    CHECK(kvgen_session_save(s, "/nonexistent-dir/x.kvs", &err) == KVGEN_E_IO);
    /* an empty session round-trips too */
    CHECK_OK(kvgen_session_save(s, file, &err));
    kvgen_session_close(s);
    s = NULL;
    CHECK_OK(kvgen_session_restore(m, file, &s, &err));
    CHECK(s && kvgen_session_length(s) == 0 && kvgen_session_logits(s) == NULL);
    kvgen_session_close(s);
    free(bytes);
    free(file);
    free(bad);
}

int main(void) {
    char *path = tu_make_model("session_file.gguf", "--seed 51 --layers 2 --embd 64 --ff 96 --heads 4 --kv-heads 2");
    char *path2 = tu_make_model("session_file2.gguf", "--seed 52 --layers 2 --embd 64 --ff 96 --heads 4 --kv-heads 2");
    CHECK(path && path2);
    if (!path || !path2) return tu_finish("test_session_file");
    kvgen_model *m = load(path, 0), *again = load(path, 0), *flat = load(path, 1), *other = load(path2, 0);
    if (m && again && flat && other) {
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        n_vocab = info.n_vocab;
        round_trip(m, m, false, "same model handle");
        round_trip(m, again, false, "another load of the file");
        round_trip(m, again, true, "shifted session");
        round_trip(m, flat, false, "paged to contiguous");
        round_trip(flat, m, false, "contiguous to paged");
        round_trip(m, flat, true, "shifted, paged to contiguous");
        test_refusals(m, other);
    }
    kvgen_model_unload(m);
    kvgen_model_unload(again);
    kvgen_model_unload(flat);
    kvgen_model_unload(other);
    free(path);
    free(path2);
    return tu_finish("test_session_file");
}
