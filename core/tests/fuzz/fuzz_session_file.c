/* fuzz_session_file: kvgen_session_restore over arbitrary files for one small random model
 * (kvgen-mkmodel, fixed seed, so the seeds' model identity matches). The first byte of an
 * input chooses how the rest becomes the file: even, as it is (the header checks, truncation,
 * the checksum); odd, with its size field and checksum made right first, so that mutations
 * reach what lies behind them (shapes, counts, sampler state, tokens, K/V). A restored session
 * is used a little (tokens, a decode, a save). Seeds: corpus/session_file/ (saved sessions of
 * that model with and without logits, shifted, with a sampler; written by this program:
 * KVGEN_FUZZ_WRITE_SEEDS=folder ./fuzz_session_file). */
#include "fuzz_util.h"
#include "kvg_hash.h"
#include <sys/stat.h>

static kvgen_model *g_model;

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

enum { FILE_BYTES_AT = 96, HEADER_BYTES = 104 };

static void write_seeds(const char *dir) {
    mkdir(dir, 0755);
    kvgen_error err = {0};
    for (int kind = 0; kind < 4; kind++) {
        kvgen_sampler_desc sd = {.temperature = 0.7f, .top_k = 5, .seed = 3};
        kvgen_session_desc d = {.n_ctx = 32, .on_full = kind == 2 ? KVGEN_ON_FULL_SHIFT : KVGEN_ON_FULL_ERROR,
                                .keep = kind == 2 ? 2 : 0, .sampler = kind == 3 ? &sd : NULL};
        kvgen_session *s = NULL;
        if (kvgen_session_create(g_model, &d, &s, &err) != KVGEN_OK) exit(1);
        int32_t toks[40];
        int n = kind == 0 ? 0 : kind == 2 ? 40 : 5;
        for (int i = 0; i < n; i++) toks[i] = (i * 7 + 1) % 200;
        for (int i = 0; i < n; i++)
            if (kvgen_session_decode(s, toks[i], &err) != KVGEN_OK) exit(1);
        char path[1024];
        snprintf(path, sizeof path, "%s/seed-%d.kvs", dir, kind);
        if (kvgen_session_save(s, path, &err) != KVGEN_OK) {
            fprintf(stderr, "%s\n", err.message);
            exit(1);
        }
        /* the corpus form: a leading byte 1 (fix the size and checksum) before the file */
        FILE *f = fopen(path, "rb");
        if (!f) exit(1);
        static uint8_t buf[1 << 20];
        buf[0] = 1;
        size_t got = fread(buf + 1, 1, sizeof buf - 1, f);
        fclose(f);
        fuzz_write(path, buf, got + 1);
        kvgen_session_close(s);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    g_model = fuzz_random_model(NULL);
    const char *seeds = getenv("KVGEN_FUZZ_WRITE_SEEDS");
    if (seeds && *seeds) {
        write_seeds(seeds);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char path[512], saved[512];
    static uint8_t *buf;
    if (!path[0]) {
        fuzz_path(path, sizeof path, "input.kvs");
        fuzz_path(saved, sizeof saved, "saved.kvs");
        buf = malloc(1 << 22);
    }
    if (size < 1 || size - 1 > (1 << 22)) return 0;
    size_t n = size - 1;
    memcpy(buf, data + 1, n);
    if ((data[0] & 1) && n >= HEADER_BYTES + 8) {
        put_u64(buf + FILE_BYTES_AT, n);
        put_u64(buf + n - 8, kvg_hash64_of(buf, n - 8));
    }
    if (!fuzz_write(path, buf, n)) return 0;
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    if (kvgen_session_restore(g_model, path, &s, &err) == KVGEN_OK) {
        size_t len = kvgen_session_length(s);
        const int32_t *t = kvgen_session_tokens(s);
        if (len && t) (void)kvgen_session_decode(s, t[len - 1], &err);
        if (kvgen_session_logits(s)) (void)kvgen_session_sample(s);
        (void)kvgen_session_save(s, saved, &err);
        kvgen_session_close(s);
    }
    return 0;
}
