/* test_parity.c: the CPU reference against an outside oracle (llama.cpp's CPU backend) on the
 * default model. Each fixture holds a 65-token teacher-forced sequence and the oracle's top-20
 * logits at every position; see scripts/oracle/README.md for how they were made.
 * - smollm2_oracle_logits.txt: llama.cpp on the same weights dequantized to F32, so it does the
 *   reference's math (f32 activations): top-1 must agree everywhere, logits within 0.1.
 * - smollm2_oracle_logits_native.txt: llama.cpp on the Q4_1 file as is; it quantizes activations
 *   to 8 bits inside its dot products, so near-ties may flip: reported, loosely bounded. */
#include <math.h>
#include <string.h>
#include "testutil.h"

#define MAX_TOK 128
#define TOPK 20

static const char *TEXT =
    "<|im_start|>system\nYou are Mira, the blacksmith of Oakvale. Answer briefly.<|im_end|>\n"
    "<|im_start|>user\nCan you repair my sword before the festival tomorrow? It cost me 125 gold.<|im_end|>\n"
    "<|im_start|>assistant\nOf course! Bring it to my forge at dawn and it will be sharp by noon.";

/* an oracle fixture of 65 tokens with a row at each position; -1 otherwise */
static int load_fixture(const char *name, tu_oracle *fx) {
    if (!tu_oracle_load(name, TOPK, fx)) return -1;
    CHECK(fx->n_tok == 65 && fx->n_pos == fx->n_tok);
    return fx->n_tok == 65 && fx->n_pos == fx->n_tok ? 0 : -1;
}

/* compares our logits (n_tok x n_vocab) with a fixture; returns top-1 agreements, writes max diff */
static int compare(const tu_oracle *fx, const float *logits, int n_vocab, double *max_diff, double *mean_diff) {
    tu_oracle_cmp c = tu_oracle_compare(fx, logits, n_vocab, fx->n_tok, TOPK, 0, "");
    *max_diff = c.max_diff;
    *mean_diff = c.mean_diff;
    return c.top1;
}

int main(void) {
    const char *model_path = tu_model_path();
    if (!model_path) tu_skip("default model absent (run scripts/setup.sh)");
    static tu_oracle exact, native;
    if (load_fixture("smollm2_oracle_logits.txt", &exact) || load_fixture("smollm2_oracle_logits_native.txt", &native))
        return tu_finish("test_parity");
    int n_tok = exact.n_tok;
    int same_seq = 1;
    for (int i = 0; i < n_tok; i++) same_seq &= exact.tokens[i] == native.tokens[i];
    CHECK(same_seq);

    kvgen_model *model = NULL;
    kvgen_error err = {0};
    kvgen_model_desc md = {.path = model_path, .backend = KVGEN_BACKEND_REFERENCE};
    CHECK_OK(kvgen_model_load(&md, &model, &err));
    if (!model) {
        fprintf(stderr, "%s\n", err.message);
        return tu_finish("test_parity");
    }

    /* our tokenizer must produce the oracle's ids for the same text */
    int32_t ours[MAX_TOK];
    size_t n_ours = 0;
    CHECK_OK(kvgen_tokenize(model, TEXT, strlen(TEXT), KVGEN_TOKENIZE_SPECIAL, ours, MAX_TOK, &n_ours, &err));
    int same = (int)n_ours == n_tok;
    for (int i = 0; same && i < n_tok; i++) same = ours[i] == exact.tokens[i];
    CHECKF(same, "tokenization differs from the oracle's (%zu vs %d tokens)", n_ours, n_tok);

    kvgen_model_info info;
    kvgen_model_get_info(model, &info);
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {0};
    CHECK_OK(kvgen_session_create(model, &sd, &s, &err));
    float *logits = malloc(sizeof(float) * (size_t)n_tok * (size_t)info.n_vocab);
    CHECK_OK(kvgen_session_prefill(s, exact.tokens, (size_t)n_tok, logits, &err));

    double max_diff, mean_diff;
    int top1 = compare(&exact, logits, info.n_vocab, &max_diff, &mean_diff);
    printf("parity vs llama.cpp (F32 weights): top-1 identical at %d/%d positions; |logit diff| over the oracle's "
           "top-%d: max %.4f, mean %.4f\n", top1, n_tok, TOPK, max_diff, mean_diff);
    CHECKF(top1 == n_tok, "top-1 differs at %d positions", n_tok - top1);
    CHECKF(max_diff < 0.1, "max logit difference %.4f", max_diff);

    top1 = compare(&native, logits, info.n_vocab, &max_diff, &mean_diff);
    printf("parity vs llama.cpp (Q4_1 as is, 8-bit activations): top-1 identical at %d/%d positions; |logit diff|: "
           "max %.4f, mean %.4f\n", top1, n_tok, max_diff, mean_diff);
    CHECKF(top1 >= n_tok - 2, "top-1 differs at %d positions", n_tok - top1);
    CHECKF(max_diff < 1.5, "max logit difference %.4f", max_diff);

    free(logits);
    kvgen_session_close(s);
    kvgen_model_unload(model);
    return tu_finish("test_parity");
}
