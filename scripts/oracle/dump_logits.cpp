// Oracle for kvgen's CPU reference: evaluates a teacher-forced token sequence with llama.cpp
// (built separately, outside the kvgen tree) and writes, for every position, the top-K logits.
// Not built or run by CI; scripts/oracle/README.md says how the fixture was made.
//   c++ -O2 -std=c++17 dump_logits.cpp -I$LLAMA/include -I$LLAMA/ggml/include -L$LLAMA/build/bin -lllama -o dump_logits
//   ./dump_logits MODEL.gguf "text" TOPK [ADAPTER.gguf SCALE] > fixture.txt
// With ADAPTER and SCALE, the LoRA adapter runs at that scale (llama_set_adapters_lora).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>
#include "llama.h"

int main(int argc, char **argv) {
    if (argc < 4 || argc == 5) {
        fprintf(stderr, "usage: %s MODEL TEXT|ids:ID,ID,... TOPK [ADAPTER SCALE]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    std::string text = argv[2];
    int topk = atoi(argv[3]);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model *model = llama_model_load_from_file(path, mp);
    if (!model) return 1;
    const llama_vocab *vocab = llama_model_get_vocab(model);
    std::vector<llama_token> toks(4096);
    int n = 0;
    if (text.rfind("ids:", 0) == 0) { /* token ids given directly: "ids:1,2,3" (random-weight test models) */
        const char *p = text.c_str() + 4;
        while (*p && n < (int)toks.size()) {
            toks[n++] = (llama_token)strtol(p, (char **)&p, 10);
            if (*p == ',') p++;
        }
    } else {
        n = llama_tokenize(vocab, text.c_str(), (int)text.size(), toks.data(), (int)toks.size(), false, true);
    }
    if (n < 0) return 1;
    toks.resize(n);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512; cp.n_batch = 512; cp.n_ubatch = 512; cp.n_threads = 2; cp.n_threads_batch = 2;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (argc >= 6) {
        llama_adapter_lora *adapter = llama_adapter_lora_init(model, argv[4]);
        if (!adapter) return 1;
        float scale = (float)atof(argv[5]);
        if (llama_set_adapters_lora(ctx, &adapter, 1, &scale) != 0) return 1;
    }
    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = toks[i]; batch.pos[i] = i; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = 0; batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) return 1;
    int nv = llama_vocab_n_tokens(vocab);
    printf("# llama.cpp CPU logits, teacher-forced; format: 'tokens N ids...' then per position 'pos P K id:logit ...' (top-K, descending)\n");
    printf("tokens %d", n);
    for (int i = 0; i < n; i++) printf(" %d", toks[i]);
    printf("\n");
    std::vector<int> idx(nv);
    for (int i = 0; i < n; i++) {
        const float *lg = llama_get_logits_ith(ctx, i);
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + topk, idx.end(), [&](int a, int b) { return lg[a] > lg[b]; });
        printf("pos %d %d", i, topk);
        for (int k = 0; k < topk; k++) printf(" %d:%.6f", idx[k], lg[idx[k]]);
        printf("\n");
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
