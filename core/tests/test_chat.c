/* test_chat.c: generation on the default model (SmolLM2, skipped when absent), reference
 * backend: its own chat template runs (the default system prompt when there is no system
 * turn), turns tokenize as the whole rendered conversation does, a new turn prefills only its
 * tokens, a rewind takes turns back, message text never becomes control tokens, the caller's
 * Jinja template replaces the file's, a greedy reply knows Paris and carries no template text, a stop string
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

static size_t count_token(kvgen_session *s, const char *text) {
    int32_t id[4];
    size_t n = 0, k = 0;
    kvgen_tokenize(m, text, strlen(text), KVGEN_TOKENIZE_SPECIAL, id, 4, &n, NULL);
    for (size_t i = 0; i < kvgen_session_length(s); i++) k += kvgen_session_tokens(s)[i] == id[0];
    return k;
}

/* the file's template, turn by turn, without generating */
static void templates(void) {
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    /* no system turn: the template's default system prompt (as apply_chat_template renders it) */
    CHECK_OK(kvgen_chat_begin(s, "user", "Hi <|im_end|> there", &err));
    const char *want = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                       "Face<|im_end|>\n<|im_start|>user\nHi <|im_end|> there<|im_end|>\n<|im_start|>assistant\n";
    CHECKF(strcmp(session_text(s), want) == 0, "\"%s\"", session_text(s));
    CHECK(count_token(s, "<|im_end|>") == 2); /* the typed one is plain text */
    /* a reply, then the next turn: the cache is kept and only the new tokens are added */
    int32_t reply[3];
    size_t nr = 0;
    CHECK_OK(kvgen_tokenize(m, "Hello!", 6, 0, reply, 2, &nr, &err));
    reply[nr++] = 2; /* <|im_end|> */
    CHECK_OK(kvgen_session_prefill(s, reply, nr, NULL, &err));
    size_t before = kvgen_session_length(s);
    static int32_t copy[4096];
    memcpy(copy, kvgen_session_tokens(s), before * sizeof *copy);
    CHECK_OK(kvgen_chat_begin(s, "user", "Bye", &err));
    CHECK(kvgen_session_length(s) > before && memcmp(copy, kvgen_session_tokens(s), before * sizeof *copy) == 0);
    char want2[1024];
    snprintf(want2, sizeof want2, "%sHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n",
             want);
    CHECKF(strcmp(session_text(s), want2) == 0, "\"%s\"", session_text(s));
    /* rewinding to before that turn takes it back */
    CHECK_OK(kvgen_session_rewind(s, kvgen_session_length(s) - before, &err));
    CHECK_OK(kvgen_chat_begin(s, "user", "Ciao", &err));
    snprintf(want2, sizeof want2, "%sHello!<|im_end|>\n<|im_start|>user\nCiao<|im_end|>\n<|im_start|>assistant\n",
             want);
    CHECKF(strcmp(session_text(s), want2) == 0, "\"%s\"", session_text(s));
    kvgen_session_close(s);

    /* the caller's template: no default system prompt here */
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    kvgen_chat_template t = {.jinja = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}"
                                      "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                                      "{% endif %}"};
    CHECK_OK(kvgen_chat_set_template(s, &t, &err));
    CHECK(strcmp(kvgen_chat_template_name(s, &err), "jinja") == 0);
    CHECK_OK(kvgen_chat_add(s, "system", " Be kind. ", &err));
    CHECK_OK(kvgen_chat_begin(s, "user", "Hi", &err));
    CHECKF(strcmp(session_text(s), "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                                   "<|im_start|>assistant\n") == 0,
           "\"%s\"", session_text(s));
    /* a template that refuses the conversation: an error that says where, nothing appended */
    size_t len = kvgen_session_length(s);
    kvgen_chat_template bad = {.jinja = "{{ raise_exception('no ' + messages[-1].role) }}"};
    CHECK_OK(kvgen_chat_set_template(s, &bad, &err));
    CHECK(kvgen_chat_add(s, "user", "x", &err) == KVGEN_E_UNSUPPORTED);
    CHECKF(strstr(err.message, "line 1 column") && strstr(err.message, "no user"), "%s", err.message);
    CHECK(kvgen_session_length(s) == len);
    kvgen_chat_template syntax = {.jinja = "{% if true %}\n{{ 1 + }}"};
    CHECK(kvgen_chat_set_template(s, &syntax, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECKF(strstr(err.message, "kvgen_chat_set_template: jinja: line 2 column"), "%s", err.message);
    kvgen_session_close(s);

    /* a template whose first line changes with every turn: each turn rewinds to the common prefix;
     * the turn that no longer fits the context fails and leaves the session as it was */
    kvgen_session_desc sd = {.n_ctx = 64};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    kvgen_chat_template counted = {.jinja = "turns {{ messages | length }}\n{% for m in messages %}{{ m.role }}: "
                                            "{{ m.content }}\n{% endfor %}"};
    CHECK_OK(kvgen_chat_set_template(s, &counted, &err));
    static int32_t held[64];
    size_t n_held = 0;
    kvgen_status st = KVGEN_OK;
    int turns = 0;
    for (; turns < 64 && st == KVGEN_OK; turns++) {
        n_held = kvgen_session_length(s);
        memcpy(held, kvgen_session_tokens(s), n_held * sizeof *held);
        st = kvgen_chat_add(s, "user", "one more line of text", &err);
    }
    CHECKF(st != KVGEN_OK && turns > 1, "status %s after %d turns", kvgen_status_name(st), turns);
    CHECKF(kvgen_session_length(s) == n_held && memcmp(held, kvgen_session_tokens(s), n_held * sizeof *held) == 0,
           "after the failed turn: %zu tokens, %zu before", kvgen_session_length(s), n_held);
    kvgen_session_close(s);
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
    CHECK(strcmp(kvgen_chat_template_name(s, &err), "jinja") == 0);

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
    templates();

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
