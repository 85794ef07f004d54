/* test_generate.c: step-wise generation on a random model with the synthetic byte-level
 * vocabulary (reference backend): stop strings split across tokens (held back, never
 * emitted), UTF-8 split across tokens, end-of-generation, max_tokens, cancel, context full,
 * the cache length after every stop, constrained output, chat templates of every family,
 * template injection, choice scoring against separate decodes, determinism across processes. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "testutil.h"

static kvgen_model *g_model;
static int32_t g_eos, g_im_start;

static kvgen_session *session(const kvgen_sampler_desc *sd, int n_ctx) {
    kvgen_session_desc d = {.n_ctx = n_ctx, .sampler = sd};
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_create(g_model, &d, &s, &err));
    return s;
}

static size_t prompt(kvgen_session *s, const char *text) {
    int32_t ids[256];
    size_t n = 0;
    kvgen_error err = {0};
    CHECK_OK(kvgen_tokenize(g_model, text, strlen(text), 0, ids, 256, &n, &err));
    CHECK_OK(kvgen_session_prefill(s, ids, n, NULL, &err));
    return n;
}

/* runs a generation to the end; returns the text (malloc'd), the concatenated steps must equal it */
static char *run(kvgen_session *s, const kvgen_generate_desc *d, kvgen_finish *fin, int *n_tokens) {
    kvgen_gen *g = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_gen_begin(s, d, &g, &err));
    if (!g) return NULL;
    char joined[8192] = "";
    size_t jl = 0;
    kvgen_gen_step st;
    do {
        if (kvgen_gen_next(g, &st, &err) != KVGEN_OK) break;
        CHECK(st.len == strlen(st.text));
        if (jl + st.len < sizeof joined) {
            memcpy(joined + jl, st.text, st.len + 1);
            jl += st.len;
        }
    } while (st.finish == KVGEN_FINISH_NONE);
    size_t n;
    const char *text = kvgen_gen_text(g, &n);
    CHECKF(n == jl && memcmp(text, joined, n) == 0, "steps \"%s\" vs text \"%s\"", joined, text);
    *fin = kvgen_gen_finish(g);
    if (n_tokens) *n_tokens = kvgen_gen_n_tokens(g);
    char *out = strdup(text);
    kvgen_gen_end(g);
    return out;
}

static void test_length_eog_cancel_full(void) {
    kvgen_sampler_desc hot = {.temperature = 1.0f, .seed = 5};
    kvgen_session *s = session(&hot, 64);
    size_t np = prompt(s, "the game");
    kvgen_generate_desc d = {.max_tokens = 7, .ignore_eog = 1};
    kvgen_finish fin;
    int nt;
    char *t = run(s, &d, &fin, &nt);
    CHECK(fin == KVGEN_FINISH_LENGTH && nt == 7 && kvgen_session_length(s) == np + 7);
    free(t);
    /* context full: 64 positions */
    kvgen_generate_desc lots = {.max_tokens = -1, .ignore_eog = 1};
    t = run(s, &lots, &fin, &nt);
    CHECKF(fin == KVGEN_FINISH_CONTEXT_FULL && kvgen_session_length(s) == 64 && nt == (int)(64 - np - 7), "%s %d",
           kvgen_finish_name(fin), nt);
    free(t);
    kvgen_session_close(s);

    /* end of generation: the EOG token is in the cache, its text is not in the reply */
    kvgen_logit_bias force = {g_eos, 100.0f};
    kvgen_sampler_desc eos = {.bias = &force, .n_bias = 1};
    s = session(&eos, 64);
    np = prompt(s, "hello");
    t = run(s, NULL, &fin, &nt);
    CHECK(fin == KVGEN_FINISH_STOP && nt == 1 && t && t[0] == 0);
    CHECK(kvgen_session_length(s) == np + 1 && kvgen_session_tokens(s)[np] == g_eos);
    free(t);
    /* cancel: nothing sampled, cache unchanged */
    kvgen_gen *g = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_gen_begin(s, NULL, &g, &err));
    kvgen_gen_cancel(g);
    kvgen_gen_step st;
    CHECK_OK(kvgen_gen_next(g, &st, &err));
    CHECK(st.finish == KVGEN_FINISH_CANCELLED && st.token == -1 && kvgen_session_length(s) == np + 1);
    CHECK_OK(kvgen_gen_next(g, &st, &err)); /* stays finished */
    CHECK(st.finish == KVGEN_FINISH_CANCELLED && st.len == 0);
    kvgen_gen_end(g);
    /* argument errors */
    const char *empty[1] = {""};
    kvgen_generate_desc bad = {.stop = empty, .n_stop = 1};
    CHECK(kvgen_gen_begin(s, &bad, &g, &err) == KVGEN_E_INVALID_ARGUMENT && g == NULL);
    kvgen_session_close(s);
    s = session(NULL, 64);
    CHECK(kvgen_gen_begin(s, NULL, &g, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "prefill"));
    kvgen_session_close(s);
}

/* generate once freely, then again with a stop string spanning two tokens' text */
static void test_stop_strings(void) {
    kvgen_logit_bias ban = {g_eos, -INFINITY};
    kvgen_sampler_desc sd = {.temperature = 0.8f, .seed = 77, .bias = &ban, .n_bias = 1};
    kvgen_session *s = session(&sd, 128);
    size_t np = prompt(s, "once upon a time");
    const int32_t *toks = kvgen_session_tokens(s);
    kvgen_generate_desc d = {.max_tokens = 40};
    kvgen_finish fin;
    char *free_text = run(s, &d, &fin, NULL);
    /* find two consecutive generated tokens with printable, non-empty pieces */
    char stop[64] = "";
    size_t at = 0, expect_tokens = 0;
    for (size_t i = np; i + 1 < np + 40 && !stop[0]; i++) {
        char a[64], b[64];
        size_t na = kvgen_token_piece(g_model, toks[i], 0, a, sizeof a);
        size_t nb = kvgen_token_piece(g_model, toks[i + 1], 0, b, sizeof b);
        if (na == 0 || nb == 0 || na > 60 || nb > 60 || (unsigned char)a[na - 1] >= 0x80 || (unsigned char)b[0] >= 0x80)
            continue;
        char cand[4] = {a[na - 1], b[0], 0};
        char *first = strstr(free_text, cand);
        if (!first) continue;
        memcpy(stop, cand, 3);
        at = (size_t)(first - free_text);
        /* the token that completes the first occurrence */
        size_t len = 0;
        for (size_t k = np; k < np + 40; k++) {
            len += kvgen_token_piece(g_model, toks[k], 0, NULL, 0);
            if (len >= at + 2) {
                expect_tokens = k - np + 1;
                break;
            }
        }
    }
    CHECKF(stop[0] != 0, "no stop string candidate in \"%s\"", free_text);
    kvgen_session_close(s);
    if (!stop[0]) {
        free(free_text);
        return;
    }
    s = session(&sd, 128);
    prompt(s, "once upon a time");
    const char *stops[2] = {"\x01never", stop};
    kvgen_generate_desc ds = {.max_tokens = 40, .stop = stops, .n_stop = 2};
    int nt;
    char *t = run(s, &ds, &fin, &nt);
    CHECKF(fin == KVGEN_FINISH_STOP_STRING, "%s", kvgen_finish_name(fin));
    CHECKF(strlen(t) == at && strncmp(t, free_text, at) == 0, "stop \"%s\": got \"%s\", free \"%s\"", stop, t,
           free_text);
    CHECK(strstr(t, stop) == NULL);
    CHECKF((size_t)nt == expect_tokens && kvgen_session_length(s) == np + expect_tokens, "%d tokens, expected %zu",
           nt, expect_tokens);
    free(t);
    free(free_text);
    kvgen_session_close(s);
}

/* é is two byte tokens in the synthetic vocabulary: the first step must hold its lead byte */
static void test_utf8_split(void) {
    kvgen_session *s = session(NULL, 64);
    prompt(s, "say");
    const char *choices[1] = {"\xc3\xa9!"};
    kvgen_constraint c = {.kind = KVGEN_CONSTRAIN_CHOICE, .choices = choices, .n_choices = 1};
    kvgen_generate_desc d = {.constraint = &c};
    kvgen_gen *g = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_gen_begin(s, &d, &g, &err));
    kvgen_gen_step st[4];
    int n = 0;
    do CHECK_OK(kvgen_gen_next(g, &st[n], &err));
    while (st[n++].finish == KVGEN_FINISH_NONE && n < 4);
    CHECKF(n == 3, "%d steps", n);
    if (n == 3) {
        CHECK(st[0].len == 0 && st[0].token >= 0);
        CHECK(st[1].len == 2 && strcmp(kvgen_gen_text(g, NULL), "\xc3\xa9!") == 0);
        CHECK(st[2].finish == KVGEN_FINISH_STOP);
    }
    kvgen_gen_end(g);
    kvgen_session_close(s);
}

/* a tiny checker for the documented JSON shape */
static const char *json_str(const char *p) {
    if (*p++ != '"') return NULL;
    while (*p && *p != '"') {
        if ((unsigned char)*p < 0x20 || *p == '\\') return NULL;
        p++;
    }
    return *p == '"' ? p + 1 : NULL;
}

static const char *json_num(const char *p) {
    const char *s = p;
    if (*p == '-') p++;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9')
        while (*p >= '0' && *p <= '9') p++;
    else return NULL;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9')) return NULL;
        while (*p >= '0' && *p <= '9') p++;
    }
    return p > s ? p : NULL;
}

static void test_constraints(void) {
    static const char *const moods[] = {"angry", "calm", "happy"};
    kvgen_json_field fields[3] = {{.key = "name", .type = KVGEN_JSON_STRING, .max_len = 12},
                                  {.key = "gold", .type = KVGEN_JSON_NUMBER},
                                  {.key = "mood", .type = KVGEN_JSON_ENUM, .values = moods, .n_values = 3}};
    kvgen_constraint json = {.kind = KVGEN_CONSTRAIN_JSON, .fields = fields, .n_fields = 3};
    static const char *const acts[] = {"attack", "flee", "trade", "trade more"};
    kvgen_constraint choice = {.kind = KVGEN_CONSTRAIN_CHOICE, .choices = acts, .n_choices = 4};
    int seen[4] = {0};
    for (uint64_t seed = 1; seed <= 6; seed++) {
        kvgen_sampler_desc sd = {.temperature = 1.2f, .seed = seed};
        kvgen_session *s = session(&sd, 512);
        size_t np = prompt(s, "npc:");
        kvgen_generate_desc d = {.constraint = &json};
        kvgen_finish fin;
        int nt;
        char *t = run(s, &d, &fin, &nt);
        const char *p = t;
        bool ok = fin == KVGEN_FINISH_STOP && strncmp(p, "{\"name\":", 8) == 0 && (p = json_str(p + 8)) &&
                  strncmp(p, ",\"gold\":", 8) == 0 && (p = json_num(p + 8)) && strncmp(p, ",\"mood\":\"", 9) == 0;
        if (ok) {
            p += 9;
            bool hit = false;
            for (int i = 0; i < 3; i++)
                if (strncmp(p, moods[i], strlen(moods[i])) == 0 && strcmp(p + strlen(moods[i]), "\"}") == 0) hit = true;
            ok = hit;
        }
        CHECKF(ok, "seed %llu: %s (%s)", (unsigned long long)seed, t, kvgen_finish_name(fin));
        CHECK(kvgen_session_length(s) == np + (size_t)nt);
        free(t);
        kvgen_generate_desc dc = {.constraint = &choice};
        t = run(s, &dc, &fin, &nt);
        int which = -1;
        for (int i = 0; i < 4; i++)
            if (strcmp(t, acts[i]) == 0) which = i;
        CHECKF(which >= 0 && fin == KVGEN_FINISH_STOP, "choice \"%s\"", t);
        if (which >= 0) seen[which]++;
        free(t);
        kvgen_session_close(s);
    }
    /* refusals */
    kvgen_session *s = session(NULL, 64);
    prompt(s, "x");
    kvgen_gen *g = NULL;
    kvgen_error err = {0};
    kvgen_json_field nested = {.key = "inv", .type = (kvgen_json_type)9};
    kvgen_constraint bad1 = {.kind = KVGEN_CONSTRAIN_JSON, .fields = &nested, .n_fields = 1};
    kvgen_generate_desc d = {.constraint = &bad1};
    CHECK(kvgen_gen_begin(s, &d, &g, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "nested"));
    static const char *const quoted[] = {"a\"b"};
    kvgen_json_field q = {.key = "k", .type = KVGEN_JSON_ENUM, .values = quoted, .n_values = 1};
    kvgen_constraint bad2 = {.kind = KVGEN_CONSTRAIN_JSON, .fields = &q, .n_fields = 1};
    d.constraint = &bad2;
    CHECK(kvgen_gen_begin(s, &d, &g, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "quote"));
    kvgen_constraint bad3 = {.kind = KVGEN_CONSTRAIN_CHOICE, .n_choices = 0};
    d.constraint = &bad3;
    CHECK(kvgen_gen_begin(s, &d, &g, &err) == KVGEN_E_INVALID_ARGUMENT && g == NULL);
    kvgen_session_close(s);
}

/* Renders a conversation through the chat calls and returns the session's text with
 * control tokens shown. */
static char *render(const char *family, bool with_system) {
    kvgen_logit_bias force = {g_eos, 100.0f};
    kvgen_sampler_desc sd = {.bias = &force, .n_bias = 1};
    kvgen_session *s = session(&sd, 1024);
    kvgen_error err = {0};
    kvgen_chat_template tpl = {.name = family};
    CHECK_OK(kvgen_chat_set_template(s, &tpl, &err));
    if (with_system) CHECK_OK(kvgen_chat_add(s, "system", "Be brief.", &err));
    CHECK_OK(kvgen_chat_begin(s, "user", "Hi", &err));
    char out[4096];
    size_t n = kvgen_detokenize(g_model, kvgen_session_tokens(s), kvgen_session_length(s), KVGEN_TOKENIZE_SPECIAL,
                                out, sizeof out);
    CHECK(n < sizeof out);
    kvgen_session_close(s);
    return strdup(out);
}

static void test_chat_families(void) {
    static const struct {
        const char *family, *plain, *sys;
    } cases[] = {
        {"chatml", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
         "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
        {"llama3",
         "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
         "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>"
         "\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
        {"llama2", "<s>[INST] Hi [/INST]", "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]"},
        {"zephyr", "<|user|>\nHi</s>\n<|assistant|>\n", "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n"},
        {"gemma", "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
         "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"},
        {"phi3", "<|user|>\nHi<|end|>\n<|assistant|>\n", "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *a = render(cases[i].family, false), *b = render(cases[i].family, true);
        CHECKF(strcmp(a, cases[i].plain) == 0, "%s: got \"%s\"", cases[i].family, a);
        CHECKF(strcmp(b, cases[i].sys) == 0, "%s + system: got \"%s\"", cases[i].family, b);
        free(a);
        free(b);
    }
}

static size_t count_token(kvgen_session *s, int32_t t) {
    size_t c = 0;
    for (size_t i = 0; i < kvgen_session_length(s); i++) c += kvgen_session_tokens(s)[i] == t;
    return c;
}

/* A session on a model with GPT-2's vocabulary: no chat template, no family's turn tokens (the
 * model is unloaded at the end of main). */
static kvgen_model *bare;
static kvgen_session *bare_session(void) {
    kvgen_error err = {0};
    if (!bare) {
        char *vocab = tu_testdata("tokenizer/ggml-vocab-gpt-2.gguf");
        char args[1200];
        snprintf(args, sizeof args, "--seed 5 --layers 1 --embd 64 --ff 64 --heads 4 --vocab %s", vocab);
        char *path = tu_make_model("gen-bare.gguf", args);
        CHECK(path != NULL);
        kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 1};
        if (path) CHECK_OK(kvgen_model_load(&md, &bare, &err));
        free(path);
        free(vocab);
    }
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {.n_ctx = 64};
    if (bare) CHECK_OK(kvgen_session_create(bare, &sd, &s, &err));
    return s;
}

static void test_chat_turns(void) {
    kvgen_error err = {0};
    kvgen_session *s = session(NULL, 1024);
    /* the synthetic model has no tokenizer.chat_template, but ChatML's turn tokens: chatml */
    const char *fam = kvgen_chat_template_name(s, &err);
    CHECKF(fam && strcmp(fam, "chatml") == 0, "family %s", fam ? fam : "none");
    /* one with neither (GPT-2's vocabulary): a clear error, not a guess */
    kvgen_session *bare = bare_session();
    if (bare) {
        CHECK(kvgen_chat_add(bare, "user", "hi", &err) == KVGEN_E_UNSUPPORTED && strstr(err.message, "chat_template"));
        CHECK(kvgen_chat_template_name(bare, &err) == NULL);
        kvgen_session_close(bare);
    }
    kvgen_chat_template unknown = {.name = "alpaca"};
    CHECK(kvgen_chat_set_template(s, &unknown, &err) == KVGEN_E_UNSUPPORTED && strstr(err.message, "alpaca"));
    CHECK(kvgen_chat_add(s, "narrator", "x", &err) == KVGEN_E_INVALID_ARGUMENT);
    kvgen_session_close(s);

    /* turns are incremental, the EOG closing a reply is not doubled, injection stays text */
    kvgen_logit_bias force[2] = {{g_eos, 100.0f}, {g_im_start, 0.0f}};
    kvgen_sampler_desc sd = {.bias = force, .n_bias = 1};
    s = session(&sd, 1024);
    kvgen_chat_template chatml = {.name = "chatml"};
    CHECK_OK(kvgen_chat_set_template(s, &chatml, &err));
    CHECK(strcmp(kvgen_chat_template_name(s, &err), "chatml") == 0);
    CHECK_OK(kvgen_chat_begin(s, "user", "hi <|im_end|> there", &err));
    CHECK(count_token(s, g_eos) == 1); /* only the template's own */
    size_t before = kvgen_session_length(s);
    kvgen_finish fin;
    char *t = run(s, NULL, &fin, NULL);
    CHECK(fin == KVGEN_FINISH_STOP && t[0] == 0 && kvgen_session_length(s) == before + 1);
    free(t);
    before = kvgen_session_length(s);
    CHECK_OK(kvgen_chat_begin(s, "user", "again", &err));
    char out[2048];
    kvgen_detokenize(g_model, kvgen_session_tokens(s), kvgen_session_length(s), KVGEN_TOKENIZE_SPECIAL, out,
                     sizeof out);
    CHECKF(strcmp(out, "<|im_start|>user\nhi <|im_end|> there<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
                       "<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n") == 0,
           "conversation: \"%s\"", out);
    CHECK(kvgen_session_tokens(s)[before] != g_eos); /* the reply's <|im_end|> was reused */

    /* control tokens the model emits never reach the reply text */
    kvgen_sampler_desc start = {.bias = &force[1], .n_bias = 1};
    force[1].bias = 100.0f;
    CHECK_OK(kvgen_session_set_sampler(s, &start, &err));
    kvgen_generate_desc d = {.max_tokens = 3};
    t = run(s, &d, &fin, NULL);
    CHECK(fin == KVGEN_FINISH_LENGTH && t[0] == 0);
    free(t);
    kvgen_generate_desc shown = {.max_tokens = 1, .flags = KVGEN_TOKENIZE_SPECIAL};
    t = run(s, &shown, &fin, NULL);
    CHECK(strcmp(t, "<|im_start|>") == 0);
    free(t);
    kvgen_sampler_desc got;
    kvgen_session_get_sampler(s, &got);
    CHECK(got.n_bias == 1 && got.bias[0].token == g_im_start && got.seed == 0x5eed);

    /* a custom template */
    kvgen_chat_template custom = {.user_prefix = "U: ", .user_suffix = "\n", .assistant_prefix = "A:",
                                  .assistant_suffix = "\n"};
    kvgen_session *c = session(NULL, 256);
    CHECK_OK(kvgen_chat_set_template(c, &custom, &err));
    CHECK(strcmp(kvgen_chat_template_name(c, &err), "custom") == 0);
    CHECK_OK(kvgen_chat_add(c, "assistant", "Hello.", &err));
    CHECK_OK(kvgen_chat_begin(c, "user", "Hi", &err));
    kvgen_detokenize(g_model, kvgen_session_tokens(c), kvgen_session_length(c), 0, out, sizeof out);
    CHECKF(strcmp(out, "A:Hello.\nU: Hi\nA:") == 0, "custom: \"%s\"", out);
    kvgen_session_close(c);
    kvgen_session_close(s);
}

static double lp_of(const float *l, int n, int32_t t) {
    double max = l[0], sum = 0;
    for (int i = 1; i < n; i++) max = l[i] > max ? l[i] : max;
    for (int i = 0; i < n; i++) sum += exp(l[i] - max);
    return l[t] - max - log(sum);
}

/* Scores of kvgen_session_choose on model m against summing per-token log-probs from separate
 * decodes of each candidate. tol < 0: bit-identical (the reference backend's batched rows equal
 * its single decodes exactly); else each token may differ by tol * (2 + max|logit|) (Vulkan). */
static void check_choose(kvgen_model *m, const char *what, double tol, const char *const *cands, int nc) {
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    kvgen_session_desc d = {.n_ctx = 256};
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(m, &d, &s, &err));
    if (!s) return;
    int32_t ctx[64];
    size_t np = 0;
    CHECK_OK(kvgen_tokenize(m, "the hero should", 15, 0, ctx, 64, &np, &err));
    CHECK_OK(kvgen_session_prefill(s, ctx, np, NULL, &err));
    float *ctx_logits = malloc(info.n_vocab * sizeof(float));
    kvgen_choice *r = calloc((size_t)nc, sizeof *r);
    CHECK(ctx_logits && r);
    if (!ctx_logits || !r) return;
    memcpy(ctx_logits, kvgen_session_logits(s), info.n_vocab * sizeof(float));
    CHECK_OK(kvgen_session_choose(s, cands, (size_t)nc, r, &err));
    CHECKF(kvgen_session_length(s) == np &&
               memcmp(ctx_logits, kvgen_session_logits(s), info.n_vocab * sizeof(float)) == 0,
           "%s: choose changed the session", what);
    double worst = 0;
    for (int i = 0; i < nc; i++) {
        kvgen_session *ref = NULL;
        CHECK_OK(kvgen_session_create(m, &d, &ref, &err));
        if (!ref) continue;
        CHECK_OK(kvgen_session_prefill(ref, ctx, np, NULL, &err));
        int32_t ids[64];
        size_t n = 0;
        CHECK_OK(kvgen_tokenize(m, cands[i], strlen(cands[i]), 0, ids, 64, &n, &err));
        double sum = 0, allow = 0;
        for (size_t k = 0; k < n; k++) {
            const float *l = kvgen_session_logits(ref);
            double mx = 0;
            for (int v = 0; v < info.n_vocab; v++) mx = fmax(mx, fabs((double)l[v]));
            allow += tol * (2 + mx);
            sum += lp_of(l, info.n_vocab, ids[k]);
            if (k + 1 < n) CHECK_OK(kvgen_session_decode(ref, ids[k], &err));
        }
        double diff = fabs(r[i].logprob - sum);
        if (tol < 0) {
            CHECKF(diff == 0, "%s: candidate %d: choose %.17g, decodes %.17g", what, i, r[i].logprob, sum);
        } else {
            CHECKF(diff <= allow, "%s: candidate %d: choose %.6f, decodes %.6f (allowed %.3g)", what, i, r[i].logprob,
                   sum, allow);
            if (allow > 0 && diff / allow > worst) worst = diff / allow;
        }
        CHECKF(r[i].n_tokens == (int)n, "%s: candidate %d: %d tokens, tokenizer %zu", what, i, r[i].n_tokens, n);
        CHECK(fabs(r[i].logprob_mean - r[i].logprob / r[i].n_tokens) < 1e-12 && r[i].logprob < 0);
        kvgen_session_close(ref);
    }
    if (tol >= 0) printf("%s: choose vs separate decodes: worst %.3g x the tolerance\n", what, worst);
    free(r);
    free(ctx_logits);
    kvgen_session_close(s);
}

/* more candidates than one batch group (16), lengths 1..~12 tokens, so they drop out at
 * different steps */
static const char *const g_many[] = {" attack", " flee", " trade the sword", " a", " wait for the dawn",
                                     " run", " speak softly to the guard at the gate", " hide", " bargain",
                                     " cast a spell of fire and ice", " x", " sleep", " climb the tower",
                                     " call for help", " pray", " fight", " steal the golden key quietly",
                                     " go home", " sing", " look around the room carefully"};
enum { N_MANY = (int)(sizeof g_many / sizeof g_many[0]) };

static void test_choose(void) {
    const char *cands[3] = {" attack", " flee", " trade the sword"};
    check_choose(g_model, "reference", -1, cands, 3);
    check_choose(g_model, "reference, many", -1, g_many, N_MANY);
    kvgen_error err = {0};

    /* a candidate longer than the room left runs as a prefill on its fork: the context-full
     * error of the session's policy, and the session unchanged */
    kvgen_session *tight = session(NULL, 16);
    size_t nt = prompt(tight, "the hero");
    const char *longc[2] = {" a", " speak softly to the guard at the gate"};
    kvgen_choice r[N_MANY];
    CHECK(kvgen_session_choose(tight, longc, 2, r, &err) == KVGEN_E_CONTEXT_FULL);
    CHECK(kvgen_session_length(tight) == nt && kvgen_session_logits(tight) != NULL);
    kvgen_session_close(tight);

    kvgen_session *s = session(NULL, 256);
    prompt(s, "the hero should");
    const char *bad[1] = {""};
    CHECK(kvgen_session_choose(s, bad, 1, r, &err) == KVGEN_E_INVALID_ARGUMENT);
    kvgen_session *empty = session(NULL, 16);
    CHECK(kvgen_session_choose(empty, cands, 1, r, &err) == KVGEN_E_INVALID_ARGUMENT);
    kvgen_session_close(empty);
    kvgen_session_close(s);
}

static void choose_vulkan_body(void *arg) {
    (void)arg;
    kvgen_error err = {0};
    char *path = tu_make_model("gen-vk.gguf", "--seed 31 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2 "
                                              "--type Q8_0");
    CHECK(path != NULL);
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_VULKAN, .n_threads = 1, .kv_page_size = 16};
    kvgen_model *m = NULL;
    if (path) CHECK_OK(kvgen_model_load(&md, &m, &err));
    if (m) check_choose(m, "vulkan", 0.004, g_many, N_MANY);
    kvgen_model_unload(m);
    free(path);
}

/* the same on a random model on the Vulkan backend (paged: batched steps of up to 8 columns),
 * within test_vk_batch's tolerance per token, when a device is present (tu_vulkan_child) */
static void test_choose_vulkan(void) { tu_vulkan_child("choose", choose_vulkan_body, NULL); }

/* same seed => same text, in two separate processes of the CLI */
static void test_cli_determinism(const char *model_path) {
    const char *bin = getenv("KVGEN_BIN");
    char *outs[3];
    const char *seeds[3] = {"42", "42", "43"};
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "gen-det-%d.txt", i);
        outs[i] = tu_tmpfile(name);
        char cmd[2048];
        snprintf(cmd, sizeof cmd,
                 "%s/kvgen generate %s --backend reference --threads 1 -p 'the quest' -n 24 --temp 1.0 --top-p 0.95 "
                 "--min-p 0.01 --repeat-penalty 1.1 --seed %s > %s 2>/dev/null",
                 bin ? bin : ".", model_path, seeds[i], outs[i]);
        CHECKF(system(cmd) == 0, "%s", cmd);
    }
    char *a = tu_read_file(outs[0], NULL), *b = tu_read_file(outs[1], NULL), *c = tu_read_file(outs[2], NULL);
    CHECK(a && b && c && strlen(a) > 5);
    if (a && b && c) {
        CHECKF(strcmp(a, b) == 0, "seed 42 twice: \"%s\" vs \"%s\"", a, b);
        CHECKF(strcmp(a, c) != 0, "seeds 42 and 43 gave the same text \"%s\"", a);
    }
    free(a);
    free(b);
    free(c);
    for (int i = 0; i < 3; i++) free(outs[i]);
}

static bool same_tokens(kvgen_session *a, kvgen_session *b) {
    size_t n = kvgen_session_length(a);
    return n == kvgen_session_length(b) &&
           (n == 0 || memcmp(kvgen_session_tokens(a), kvgen_session_tokens(b), n * sizeof(int32_t)) == 0);
}

/* a chatml session whose replies are short and deterministic (greedy) */
static kvgen_session *chat_session(int n_ctx) {
    kvgen_session *s = session(NULL, n_ctx);
    kvgen_error err = {0};
    kvgen_chat_template chatml = {.name = "chatml"};
    CHECK_OK(kvgen_chat_set_template(s, &chatml, &err));
    return s;
}

/* one user turn and a 3-token reply through kvgen_chat_gen_begin */
static void chat_turn_reply(kvgen_session *s, const char *text) {
    kvgen_generate_desc d = {.max_tokens = 3, .ignore_eog = 1};
    kvgen_gen *g = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_chat_gen_begin(s, "user", text, &d, &g, &err));
    kvgen_gen_step st;
    while (g && kvgen_gen_next(g, &st, &err) == KVGEN_OK && st.finish == KVGEN_FINISH_NONE) {}
    kvgen_gen_end(g);
}

/* A refused generation changes nothing: the desc is checked (kvgen_generate_check) and the
 * generator built before kvgen_gen_begin_prompt / kvgen_chat_gen_begin append the prompt or
 * the chat turn, and a failed append leaves no turn or chat state behind. */
static void test_atomic_begin(void) {
    kvgen_error err = {0};
    static char long_stop[2001];
    memset(long_stop, 'z', 2000);
    const char *one_long[] = {long_stop};
    const char *many[65];
    for (int i = 0; i < 65; i++) many[i] = "s";
    kvgen_json_field bad_key = {.key = "a\"b", .type = KVGEN_JSON_NUMBER};
    kvgen_constraint bad_json = {.kind = KVGEN_CONSTRAIN_JSON, .fields = &bad_key, .n_fields = 1};
    const kvgen_generate_desc bad[] = {
        {.stop = one_long, .n_stop = 1},
        {.stop = many, .n_stop = 65},
        {.constraint = &bad_json},
        {.flags = 0x80},
    };
    const int n_bad = (int)(sizeof bad / sizeof bad[0]);
    CHECK_OK(kvgen_generate_check(NULL, &err));
    kvgen_generate_desc good = {.max_tokens = 2, .ignore_eog = 1, .stop = many, .n_stop = 64};
    CHECK_OK(kvgen_generate_check(&good, &err));
    for (int i = 0; i < n_bad; i++)
        CHECKF(kvgen_generate_check(&bad[i], &err) == KVGEN_E_INVALID_ARGUMENT, "bad desc %d accepted", i);

    int32_t ids[64];
    size_t n = 0;
    CHECK_OK(kvgen_tokenize(g_model, "a prompt", 8, 0, ids, 64, &n, &err));
    kvgen_session *s = session(NULL, 64);
    for (int i = 0; i < n_bad; i++) {
        kvgen_gen *g = (kvgen_gen *)&err; /* overwritten with NULL on failure */
        CHECK(kvgen_gen_begin_prompt(s, ids, n, &bad[i], &g, &err) == KVGEN_E_INVALID_ARGUMENT && g == NULL);
        CHECKF(kvgen_session_length(s) == 0 && kvgen_session_logits(s) == NULL, "bad desc %d: length %zu", i,
               kvgen_session_length(s));
    }
    /* no prompt and no logits: refused before anything */
    kvgen_gen *g = NULL;
    CHECK(kvgen_gen_begin_prompt(s, NULL, 0, &good, &g, &err) == KVGEN_E_INVALID_ARGUMENT && !g);
    /* a prompt that does not fit (on_full error): the failed prefill appends nothing */
    int32_t big[80];
    for (int i = 0; i < 80; i++) big[i] = ids[i % (int)n];
    CHECK(kvgen_gen_begin_prompt(s, big, 80, &good, &g, &err) == KVGEN_E_CONTEXT_FULL && !g);
    CHECK(kvgen_session_length(s) == 0);
    /* and a good one works like prefill + kvgen_gen_begin */
    CHECK_OK(kvgen_gen_begin_prompt(s, ids, n, &good, &g, &err));
    CHECK(g && kvgen_session_length(s) == n);
    kvgen_gen_step st;
    while (g && kvgen_gen_next(g, &st, &err) == KVGEN_OK && st.finish == KVGEN_FINISH_NONE) {}
    CHECK(kvgen_gen_finish(g) == KVGEN_FINISH_LENGTH && kvgen_session_length(s) == n + 2);
    kvgen_gen_end(g);
    /* on a session with text, a refused kvgen_gen_begin_prompt keeps exactly its tokens */
    size_t len = kvgen_session_length(s);
    CHECK(kvgen_gen_begin_prompt(s, ids, n, &bad[0], &g, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_session_length(s) == len);
    CHECK(kvgen_gen_begin(s, &bad[1], &g, &err) == KVGEN_E_INVALID_ARGUMENT && kvgen_session_length(s) == len);
    kvgen_session_close(s);

    /* chat: a refused reply leaves no user turn and no chat state behind, on an empty session
     * and after a complete exchange (whose reply is still open) */
    kvgen_session *a = chat_session(256), *twin = chat_session(256);
    for (int round = 0; round < 2; round++) {
        size_t before = kvgen_session_length(a);
        for (int i = 0; i < n_bad; i++) {
            g = (kvgen_gen *)&err;
            CHECK(kvgen_chat_gen_begin(a, "user", "hello", &bad[i], &g, &err) == KVGEN_E_INVALID_ARGUMENT && !g);
            CHECKF(kvgen_session_length(a) == before, "round %d, bad desc %d: length %zu, was %zu", round, i,
                   kvgen_session_length(a), before);
        }
        CHECK(same_tokens(a, twin));
        chat_turn_reply(a, "hello");
        chat_turn_reply(twin, "hello");
        CHECK(same_tokens(a, twin)); /* the chat state was as the twin's: the same turn layout */
    }
    /* a turn that does not fit the context fails on its own and leaves nothing either */
    kvgen_session *small = chat_session(48), *small_twin = chat_session(48);
    static const char too_long[] = "a user turn much too long for the forty-eight tokens of context that this "
                                   "session has, so that its prefill is refused";
    CHECK(kvgen_chat_gen_begin(small, "user", too_long, &good, &g, &err) == KVGEN_E_CONTEXT_FULL && !g);
    CHECK(kvgen_session_length(small) == 0);
    CHECK(kvgen_chat_begin(small, "user", too_long, &err) == KVGEN_E_CONTEXT_FULL);
    CHECK(kvgen_session_length(small) == 0);
    CHECK_OK(kvgen_chat_begin(small, "user", "hi", &err));
    CHECK_OK(kvgen_chat_begin(small_twin, "user", "hi", &err));
    CHECK(same_tokens(small, small_twin));
    kvgen_session_close(small);
    kvgen_session_close(small_twin);
    /* without a template (nor a family's turn tokens) the chat call fails and no chat state is created */
    kvgen_session *plain = bare_session();
    if (plain) {
        CHECK(kvgen_chat_gen_begin(plain, "user", "hi", NULL, &g, &err) == KVGEN_E_UNSUPPORTED && !g);
        CHECK(kvgen_session_length(plain) == 0);
    }
    kvgen_session_close(plain);
    kvgen_session_close(a);
    kvgen_session_close(twin);
}

/* "no limit" (max_tokens < 0) under KVGEN_ON_FULL_SHIFT, whose context never fills, is at most
 * n_ctx tokens: for kvgen_gen_*, kvgen_generate and jobs alike. */
static void test_shift_bound(void) {
    kvgen_error err = {0};
    kvgen_session_desc sd = {.n_ctx = 32, .on_full = KVGEN_ON_FULL_SHIFT};
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(g_model, &sd, &s, &err));
    if (!s) return;
    prompt(s, "a prompt");
    kvgen_generate_desc d = {.max_tokens = -1, .ignore_eog = 1};
    kvgen_gen *g = NULL;
    CHECK_OK(kvgen_gen_begin(s, &d, &g, &err));
    kvgen_gen_step st;
    int steps = 0;
    while (g && steps < 10000 && kvgen_gen_next(g, &st, &err) == KVGEN_OK && st.finish == KVGEN_FINISH_NONE) steps++;
    bool bounded = kvgen_gen_finish(g) == KVGEN_FINISH_LENGTH && kvgen_gen_n_tokens(g) == 32;
    CHECKF(bounded, "%s after %d tokens", kvgen_finish_name(kvgen_gen_finish(g)), kvgen_gen_n_tokens(g));
    kvgen_cache_info ci;
    kvgen_session_cache_info(s, &ci);
    CHECK(ci.shifts >= 1 && ci.length <= 32);
    kvgen_gen_end(g);
    /* an explicit max_tokens above n_ctx is a bound of its own and is kept */
    kvgen_generate_desc more = {.max_tokens = 40, .ignore_eog = 1};
    kvgen_finish fin;
    char *t = run(s, &more, &fin, &steps);
    CHECK(fin == KVGEN_FINISH_LENGTH && steps == 40);
    free(t);
    /* the one-shot call (only when bounded: it has no step limit of its own) */
    char out[64];
    size_t len = 0;
    if (bounded) CHECK_OK(kvgen_generate(s, &d, out, sizeof out, &len, &fin, &err));
    CHECK(!bounded || fin == KVGEN_FINISH_LENGTH);
    /* and a job on the worker */
    kvgen_job_desc jd = {.gen = d};
    kvgen_job *job = NULL;
    CHECK_OK(kvgen_job_submit(s, &jd, &job, &err));
    kvgen_job_info info = {0};
    for (int spin = 0; job && spin < 6000000; spin++) { /* a hang guard (minutes), not a time limit */
        kvgen_job_state js = kvgen_job_poll(job, NULL, NULL);
        kvgen_job_get_info(job, &info);
        if (js >= KVGEN_JOB_DONE) break;
        if (info.n_tokens > 1000) {
            kvgen_job_cancel(job); /* unbounded: give up (and fail below) */
        }
        nanosleep(&(struct timespec){.tv_nsec = 100000}, NULL);
    }
    CHECKF(info.state == KVGEN_JOB_DONE && info.finish == KVGEN_FINISH_LENGTH && info.n_tokens == 32,
           "job: %s, %s after %d tokens", kvgen_job_state_name(info.state), kvgen_finish_name(info.finish),
           info.n_tokens);
    kvgen_job_release(job);
    kvgen_session_close(s);

    /* without shift "no limit" still means until the context is full */
    s = session(NULL, 24);
    prompt(s, "abc");
    t = run(s, &d, &fin, NULL);
    CHECK(fin == KVGEN_FINISH_CONTEXT_FULL && kvgen_session_length(s) == 24);
    free(t);
    kvgen_session_close(s);
}

int main(void) {
    char *path = tu_make_model("gen.gguf", "--seed 31 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2 --type Q8_0");
    if (!path) return tu_finish("test_generate");
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 1};
    kvgen_error err = {0};
    CHECK_OK(kvgen_model_load(&md, &g_model, &err));
    if (!g_model) return tu_finish("test_generate");
    g_eos = kvgen_token_find(g_model, "<|im_end|>");
    g_im_start = kvgen_token_find(g_model, "<|im_start|>");
    CHECK(g_eos >= 0 && g_im_start >= 0 && kvgen_token_is_eog(g_model, g_eos));
    CHECK(strcmp(kvgen_finish_name(KVGEN_FINISH_STOP_STRING), "stop_string") == 0);
    test_length_eog_cancel_full();
    test_stop_strings();
    test_utf8_split();
    test_constraints();
    test_chat_families();
    test_chat_turns();
    test_choose();
    test_choose_vulkan();
    test_cli_determinism(path);
    test_atomic_begin();
    test_shift_bound();
    kvgen_model_unload(g_model);
    kvgen_model_unload(bare);
    free(path);
    return tu_finish("test_generate");
}
