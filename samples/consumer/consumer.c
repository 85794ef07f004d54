/* consumer.c: the smallest program against an installed kvgen (kvgen.h and the library only):
 * its own logger, a model, a session, a few greedy tokens. Prints the backend, the text and
 * "ok" at the end; exit status 0 on success. Usage: kvgen_consumer MODEL.gguf [N_TOKENS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <kvgen.h>

static void log_line(void *user, kvgen_log_level level, const char *message) {
    (void)user;
    fprintf(stderr, "[kvgen %s] %s\n", kvgen_log_level_name(level), message);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [N_TOKENS]\n", argv[0]);
        return 2;
    }
    int n_tokens = argc > 2 ? atoi(argv[2]) : 8;
    printf("kvgen %s (header %s)\n", kvgen_version(), KVGEN_VERSION_STRING);
    kvgen_set_logger(log_line, NULL);

    kvgen_error err = {0};
    kvgen_model *model = NULL;
    kvgen_model_desc md = {.path = argv[1]};
    if (kvgen_model_load(&md, &model, &err) != KVGEN_OK) {
        fprintf(stderr, "kvgen_consumer: %s\n", err.message);
        return 1;
    }
    kvgen_model_info info;
    kvgen_model_get_info(model, &info);
    printf("model %s on %s (%s)\n", info.name, info.backend, info.device);

    kvgen_session *s = NULL;
    int32_t ids[64];
    size_t n = 0;
    const char *prompt = "Once upon a time";
    kvgen_status st = kvgen_session_create(model, NULL, &s, &err);
    if (st == KVGEN_OK) st = kvgen_tokenize(model, prompt, strlen(prompt), 0, ids, 64, &n, &err);
    if (st == KVGEN_OK) st = kvgen_session_prefill(s, ids, n, NULL, &err);
    char text[1024];
    size_t len = 0;
    kvgen_generate_desc gd = {.max_tokens = n_tokens, .ignore_eog = 1};
    if (st == KVGEN_OK) st = kvgen_generate(s, &gd, text, sizeof text, &len, NULL, &err);
    if (st == KVGEN_OK) printf("%s|%.*s\n", prompt, (int)len, text);
    else fprintf(stderr, "kvgen_consumer: %s\n", err.message);
    int generated = (int)kvgen_session_length(s) - (int)n;
    kvgen_session_close(s);
    kvgen_model_unload(model);
    if (st != KVGEN_OK || generated != n_tokens) {
        fprintf(stderr, "kvgen_consumer: generated %d tokens, wanted %d\n", generated, n_tokens);
        return 1;
    }
    printf("ok\n");
    return 0;
}
