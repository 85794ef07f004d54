/* test_parity.c: the CPU reference against an outside oracle (llama.cpp's CPU backend) on the
 * default model. The fixture (tests/fixtures/smollm2_oracle_logits.txt) holds a 65-token
 * teacher-forced sequence and the oracle's top-20 logits at every position; see
 * scripts/oracle/README.md for how it was made. */
#include <math.h>
#include <string.h>
#include "testutil.h"

#define MAX_TOK 128
#define TOPK 20

static const char *TEXT =
    "<|im_start|>system\nYou are Mira, the blacksmith of Oakvale. Answer briefly.<|im_end|>\n"
    "<|im_start|>user\nCan you repair my sword before the festival tomorrow? It cost me 125 gold.<|im_end|>\n"
    "<|im_start|>assistant\nOf course! Bring it to my forge at dawn and it will be sharp by noon.";

int main(void) {
    const char *model_path = tu_model_path();
    if (!model_path) tu_skip("default model absent (run scripts/setup.sh)");
    char *fx_path = NULL;
    {
        const char *d = getenv("KVGEN_FIXTURES");
        size_t n = strlen(d ? d : ".") + 64;
        fx_path = malloc(n);
        snprintf(fx_path, n, "%s/smollm2_oracle_logits.txt", d ? d : ".");
    }
    FILE *f = fopen(fx_path, "r");
    CHECKF(f != NULL, "cannot open %s", fx_path);
    if (!f) return tu_finish("test_parity");

    int n_tok = 0, tokens[MAX_TOK];
    int top_id[MAX_TOK][TOPK];
    float top_val[MAX_TOK][TOPK];
    char line[8192];
    int n_pos = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        char *p = line;
        int off = 0;
        if (sscanf(p, "tokens %d%n", &n_tok, &off) == 1) {
            p += off;
            for (int i = 0; i < n_tok && i < MAX_TOK; i++) {
                sscanf(p, "%d%n", &tokens[i], &off);
                p += off;
            }
        } else {
            int pos, k;
            if (sscanf(p, "pos %d %d%n", &pos, &k, &off) != 2 || pos >= MAX_TOK || k != TOPK) continue;
            p += off;
            for (int j = 0; j < TOPK; j++) {
                sscanf(p, " %d:%f%n", &top_id[pos][j], &top_val[pos][j], &off);
                p += off;
            }
            if (pos + 1 > n_pos) n_pos = pos + 1;
        }
    }
    fclose(f);
    CHECK(n_tok == 65 && n_pos == n_tok);

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
    for (int i = 0; same && i < n_tok; i++) same = ours[i] == tokens[i];
    CHECKF(same, "tokenization differs from the oracle's (%zu vs %d tokens)", n_ours, n_tok);

    kvgen_model_info info;
    kvgen_model_get_info(model, &info);
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {0};
    CHECK_OK(kvgen_session_create(model, &sd, &s, &err));
    float *logits = malloc(sizeof(float) * (size_t)n_tok * (size_t)info.n_vocab);
    int32_t ids[MAX_TOK];
    for (int i = 0; i < n_tok; i++) ids[i] = tokens[i];
    CHECK_OK(kvgen_session_prefill(s, ids, (size_t)n_tok, logits, &err));

    int top1_same = 0;
    double max_diff = 0, sum_diff = 0;
    int n_diff = 0;
    for (int p = 0; p < n_tok; p++) {
        const float *l = logits + (size_t)p * (size_t)info.n_vocab;
        int best = 0;
        for (int v = 1; v < info.n_vocab; v++)
            if (l[v] > l[best]) best = v;
        if (best == top_id[p][0]) top1_same++;
        else fprintf(stderr, "position %d: top-1 %d (%.4f) vs oracle %d (%.4f, ours %.4f)\n", p, best, l[best],
                     top_id[p][0], top_val[p][0], l[top_id[p][0]]);
        for (int j = 0; j < TOPK; j++) {
            double d = fabs((double)l[top_id[p][j]] - (double)top_val[p][j]);
            if (d > max_diff) max_diff = d;
            sum_diff += d;
            n_diff++;
        }
    }
    printf("parity vs llama.cpp: top-1 identical at %d/%d positions; max |logit diff| over the oracle's top-%d = %.4f, "
           "mean %.4f\n", top1_same, n_tok, TOPK, max_diff, sum_diff / n_diff);
    /* 64 teacher-forced positions after the first token must agree on top-1 */
    CHECKF(top1_same == n_tok, "top-1 differs at %d positions", n_tok - top1_same);
    /* llama.cpp quantizes activations to 8 bits for Q4_1 dot products; the reference is f32
     * throughout, so logits differ a little; 0.5 on logits of magnitude ~20 bounds that */
    CHECKF(max_diff < 0.5, "max logit difference %.4f", max_diff);

    free(logits);
    free(fx_path);
    kvgen_session_close(s);
    kvgen_model_unload(model);
    return tu_finish("test_parity");
}
