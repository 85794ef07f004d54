/* test_real_tensors.c: every tensor of the real files people download, dequantized with kvgen's
 * type-traits table, bit-identical with gguf-py's dequantization (fixtures made by
 * scripts/oracle/tensor_hashes.py: a hash of each tensor's f32 bit patterns). Covers every type
 * those files hold (F32, Q8_0, Q5_0, Q4_K, Q6_K) over hundreds of millions of real blocks.
 * Skipped for a file that is absent (scripts/fetch_model.sh --all fetches both). */
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>
#include "kvg_gguf.h"
#include "kvg_quant.h"
#include "testutil.h"


/* sum of bits(x[i]) * (2i + 1), mod 2^64, over the tensor's rows in order */
static uint64_t tensor_hash(const kvg_tensor *t, float *row) {
    uint64_t h = 0, idx = 0, K = t->ne[0];
    size_t row_bytes = kvg_row_bytes(t->type, K);
    for (uint64_t r = 0; r < t->n_elements / K; r++) {
        kvg_dequantize_row(t->type, (const uint8_t *)t->data + r * row_bytes, row, K);
        for (uint64_t i = 0; i < K; i++, idx++) {
            uint32_t bits;
            memcpy(&bits, &row[i], 4);
            h += (uint64_t)bits * (2 * idx + 1);
        }
    }
    return h;
}

static void check_file(const char *file, const char *fixture) {
    char *path = tu_model_file(file);
    if (!path) {
        printf("%s: absent (scripts/fetch_model.sh --all fetches it): skipped\n", file);
        return;
    }
    const char *d = getenv("KVGEN_FIXTURES");
    char fx[1024];
    snprintf(fx, sizeof fx, "%s/%s", d ? d : ".", fixture);
    FILE *f = fopen(fx, "r");
    CHECKF(f != NULL, "cannot open %s", fx);
    kvg_gguf *g = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvg_gguf_open(path, &g, &err));
    float *row = malloc(1 << 22);
    int n = 0, same = 0, lines = 0;
    char line[512];
    while (f && g && fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        char name[256], type[32];
        uint64_t elems, want;
        if (sscanf(line, "%255s %31s %" SCNu64 " %" SCNx64, name, type, &elems, &want) != 4) continue;
        lines++;
        const kvg_tensor *t = kvg_gguf_find_tensor(g, name);
        CHECKF(t != NULL, "%s: no tensor %s", file, name);
        if (!t) continue;
        CHECKF(strcmp(kvg_type_name(t->type), type) == 0 && t->n_elements == elems, "%s: %s is %s x %" PRIu64, file,
               name, kvg_type_name(t->type), t->n_elements);
        uint64_t h = tensor_hash(t, row);
        n++;
        same += h == want;
        CHECKF(h == want, "%s: %s (%s) dequantizes differently from gguf-py (hash %016" PRIx64 ", want %016" PRIx64 ")",
               file, name, type, h, want);
    }
    CHECKF(lines == kvg_gguf_n_tensors(g), "%s: the fixture lists %d tensors, the file has %d", file, lines,
           g ? kvg_gguf_n_tensors(g) : 0);
    printf("%s: %d/%d tensors dequantize bit-identically with gguf-py\n", file, same, n);
    free(row);
    kvg_gguf_close(g);
    if (f) fclose(f);
    free(path);
}

int main(void) {
    check_file("gemma-3-270m-q4_k_m.gguf", "gemma3_tensor_hashes.txt");
    check_file("qwen2.5-coder-0.5b-instruct.gguf", "qwen25_tensor_hashes.txt");
    return tu_finish("test_real_tensors");
}
