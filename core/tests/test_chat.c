/* test_chat.c: generation on the default model (SmolLM2, skipped when absent), reference
 * backend: its chat template is recognised (ChatML), turns tokenize as the whole rendered
 * conversation does, a greedy reply knows Paris and carries no template text, a stop string
 * cuts it, choice scoring prefers the right answer, and constrained JSON parses. */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include "testutil.h"

static kvgen_model *m;

static char *session_text(kvgen_session *s) {
    static char out[8192];
    kvgen_detokenize(m, kvgen_session_tokens(s), kvgen_session_length(s), KVGEN_TOKENIZE_SPECIAL, out, sizeof out);
    return out;
}

int main(void) {
    const char *path = tu_model_path();
    if (!path) tu_skip("default model absent");
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE};
    kvgen_error err = {0};
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    if (!m) return tu_finish("test_chat");
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    CHECK(strcmp(kvgen_chat_template_name(s, &err), "chatml") == 0);

    CHECK_OK(kvgen_chat_add(s, "system", "You are a helpful assistant.", &err));
    CHECK_OK(kvgen_chat_begin(s, "user", "What is the capital of France?", &err));
    const char *rendered = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is "
                           "the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    CHECK(strcmp(session_text(s), rendered) == 0);
    int32_t whole[256];
    size_t n_whole = 0;
    CHECK_OK(kvgen_tokenize(m, rendered, strlen(rendered), KVGEN_TOKENIZE_SPECIAL, whole, 256, &n_whole, &err));
    CHECK(n_whole == kvgen_session_length(s) &&
          memcmp(whole, kvgen_session_tokens(s), n_whole * sizeof *whole) == 0);

    char reply[1024];
    size_t len = 0;
    kvgen_finish fin;
    kvgen_generate_desc gd = {.max_tokens = 40};
    CHECK_OK(kvgen_generate(s, &gd, reply, sizeof reply, &len, &fin, &err));
    CHECKF(strstr(reply, "Paris") && !strstr(reply, "<|") && fin == KVGEN_FINISH_STOP, "reply \"%s\" (%s)", reply,
           kvgen_finish_name(fin));
    CHECK(kvgen_token_is_eog(m, kvgen_session_tokens(s)[kvgen_session_length(s) - 1]));

    /* the next turn continues the template: the whole conversation renders as one string */
    CHECK_OK(kvgen_chat_begin(s, "user", "And of Italy?", &err));
    char want[2048];
    snprintf(want, sizeof want, "%s%s<|im_end|>\n<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n",
             rendered, reply);
    CHECKF(strcmp(session_text(s), want) == 0, "conversation \"%s\"", session_text(s));
    /* a stop string cuts the reply before it */
    const char *stop[1] = {"Rome"};
    kvgen_generate_desc gs = {.max_tokens = 40, .stop = stop, .n_stop = 1};
    CHECK_OK(kvgen_generate(s, &gs, reply, sizeof reply, &len, &fin, &err));
    CHECKF(fin == KVGEN_FINISH_STOP_STRING && !strstr(reply, "Rome") && len == strlen(reply), "\"%s\" (%s)", reply,
           kvgen_finish_name(fin));
    kvgen_session_close(s);

    /* choice scoring: the context once, candidates on forks */
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    const char *ctx = "The capital of France is";
    int32_t ids[64];
    size_t n = 0;
    CHECK_OK(kvgen_tokenize(m, ctx, strlen(ctx), KVGEN_TOKENIZE_ADD_BOS, ids, 64, &n, &err));
    CHECK_OK(kvgen_session_prefill(s, ids, n, NULL, &err));
    const char *cands[3] = {" London", " Paris", " a city in Europe"};
    kvgen_choice r[3];
    CHECK_OK(kvgen_session_choose(s, cands, 3, r, &err));
    CHECKF(r[1].logprob > r[0].logprob && r[1].logprob_mean > r[2].logprob_mean, "%f %f %f", r[0].logprob,
           r[1].logprob, r[2].logprob_mean);
    CHECK(kvgen_session_length(s) == n);

    /* constrained JSON on a real model */
    static const char *const moods[] = {"friendly", "hostile"};
    kvgen_json_field f[3] = {{.key = "name", .type = KVGEN_JSON_STRING, .max_len = 20},
                             {.key = "age", .type = KVGEN_JSON_NUMBER},
                             {.key = "mood", .type = KVGEN_JSON_ENUM, .values = moods, .n_values = 2}};
    kvgen_constraint c = {.kind = KVGEN_CONSTRAIN_JSON, .fields = f, .n_fields = 3};
    kvgen_generate_desc gj = {.constraint = &c};
    kvgen_session_close(s);
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    CHECK_OK(kvgen_chat_begin(s, "user", "Describe a village guard as JSON with name, age and mood.", &err));
    CHECK_OK(kvgen_generate(s, &gj, reply, sizeof reply, &len, &fin, &err));
    CHECKF(fin == KVGEN_FINISH_STOP && strncmp(reply, "{\"name\":\"", 9) == 0 && strstr(reply, "\",\"age\":") &&
               (strstr(reply, ",\"mood\":\"friendly\"}") || strstr(reply, ",\"mood\":\"hostile\"}")),
           "json \"%s\"", reply);
    printf("constrained reply: %s\n", reply);
    kvgen_session_close(s);
    kvgen_model_unload(m);
    return tu_finish("test_chat");
}
