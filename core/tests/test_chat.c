/* test_chat.c: generation on the default model (SmolLM2, skipped when absent), reference
 * backend: its own chat template runs (the default system prompt when there is no system
 * turn), turns tokenize as the whole rendered conversation does, a new turn prefills only its
 * tokens, a rewind takes turns back, message text never becomes control tokens, the caller's
 * Jinja template replaces the file's, a greedy reply knows Paris and carries no template text, a stop string
 * cuts it, choice scoring prefers the right answer, and constrained JSON parses. Tools, tool
 * calls and results under Qwen2.5-Coder's template render what jinja2 renders and survive fork
 * and session files. The conversation reads back and undoes whole messages (a random-weight
 * model, so this part runs without the default one). */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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
    CHECKF(st == KVGEN_E_CONTEXT_FULL && turns > 1, "status %s after %d turns", kvgen_status_name(st), turns);
    /* the message gives the numbers of the session as it is, not those after the rewind */
    char full[64];
    snprintf(full, sizeof full, "context full (%zu/64)", n_held);
    CHECKF(strncmp(err.message, full, strlen(full)) == 0, "%s", err.message);
    CHECKF(kvgen_session_length(s) == n_held && memcmp(held, kvgen_session_tokens(s), n_held * sizeof *held) == 0,
           "after the failed turn: %zu tokens, %zu before", kvgen_session_length(s), n_held);
    kvgen_session_close(s);
}

/* ---- context shifts, template switches, empty renderings (cpu backend) ---- */

/* The user turns "[qNN] ..." the session holds, in order: a run of consecutive ones ending at
 * `last` (0 when they are not); *first gets the oldest. */
static int turns_held(kvgen_model *mm, kvgen_session *s, int last, int *first) {
    static char text[16384];
    kvgen_detokenize(mm, kvgen_session_tokens(s), kvgen_session_length(s), KVGEN_TOKENIZE_SPECIAL, text, sizeof text);
    int n = 0, prev = 0;
    *first = 0;
    for (const char *p = text; (p = strstr(p, "user\n[q")) != NULL; p++) {
        int q = atoi(p + 7);
        if (n > 0 && q != prev + 1) return 0;
        if (n == 0) *first = q;
        prev = q;
        n++;
    }
    return n > 0 && prev == last ? n : 0;
}

static bool job_final(kvgen_job *j) {
    for (long i = 0; i < 60000000; i++) { /* a generous bound: a hang, not a timing check */
        kvgen_job_state st = kvgen_job_poll(j, NULL, NULL);
        if (st == KVGEN_JOB_DONE || st == KVGEN_JOB_CANCELLED || st == KVGEN_JOB_FAILED) return true;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return false;
}

/* Many turns at context 128 with the system prompt kept, under a Jinja template (the file's,
 * or the caller's), through kvgen_chat_begin + kvgen_generate, kvgen_chat_gen_begin, and a
 * job: each turn renders the conversation the cache still holds (the latest turns, in order,
 * after the kept system prompt), never turns a shift dropped; a shift in the middle of a reply
 * keeps the chat usable. */
static void shifted_chat(kvgen_model *mm, const char *jinja, int entry, int *mid_reply, int *in_prefill) {
    kvgen_error err = {0};
    const char *sys_text = "You are Brom, the gate guard of Eastwatch.";
    kvgen_chat_template tpl = {.jinja = jinja};
    /* the kept tokens: the system turn as the template renders it */
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(mm, NULL, &s, &err));
    if (jinja) CHECK_OK(kvgen_chat_set_template(s, &tpl, &err));
    CHECK_OK(kvgen_chat_add(s, "system", sys_text, &err));
    int keep = (int)kvgen_session_length(s);
    kvgen_session_close(s);
    kvgen_session_desc sd = {.n_ctx = 128, .on_full = KVGEN_ON_FULL_SHIFT, .keep = keep};
    CHECK_OK(kvgen_session_create(mm, &sd, &s, &err));
    if (jinja) CHECK_OK(kvgen_chat_set_template(s, &tpl, &err));
    CHECK_OK(kvgen_chat_add(s, "system", sys_text, &err));
    kvgen_generate_desc gd = {.max_tokens = 20};
    int turns = 10, first = 0, dropped_any = 0;
    for (int q = 1; q <= turns; q++) {
        char text[128];
        snprintf(text, sizeof text, "[q%02d] Tell me about the old tower by the river, and the bridge.", q);
        kvgen_cache_info info;
        kvgen_session_cache_info(s, &info);
        size_t shifts0 = info.shifts;
        kvgen_status st = KVGEN_OK;
        if (entry == 0) {
            st = kvgen_chat_begin(s, "user", text, &err);
            CHECKF(st == KVGEN_OK, "turn %d: %s", q, err.message);
            if (st != KVGEN_OK) break;
            CHECKF(turns_held(mm, s, q, &first) > 0, "turn %d: the session holds turns out of order", q);
            kvgen_session_cache_info(s, &info);
            size_t shifts1 = info.shifts;
            *in_prefill += shifts1 > shifts0;
            char reply[512];
            kvgen_finish fin;
            st = kvgen_generate(s, &gd, reply, sizeof reply, NULL, &fin, &err);
            CHECKF(st == KVGEN_OK, "turn %d reply: %s", q, err.message);
            kvgen_session_cache_info(s, &info);
            *mid_reply += info.shifts > shifts1;
        } else if (entry == 1) {
            kvgen_gen *g = NULL;
            st = kvgen_chat_gen_begin(s, "user", text, &gd, &g, &err);
            CHECKF(st == KVGEN_OK, "turn %d: %s", q, err.message);
            if (st != KVGEN_OK) break;
            CHECKF(turns_held(mm, s, q, &first) > 0, "turn %d: the session holds turns out of order", q);
            kvgen_session_cache_info(s, &info);
            size_t shifts1 = info.shifts;
            *in_prefill += shifts1 > shifts0;
            kvgen_gen_step step;
            do st = kvgen_gen_next(g, &step, &err);
            while (st == KVGEN_OK && step.finish == KVGEN_FINISH_NONE);
            CHECKF(st == KVGEN_OK, "turn %d reply: %s", q, err.message);
            kvgen_gen_end(g);
            kvgen_session_cache_info(s, &info);
            *mid_reply += info.shifts > shifts1;
        } else {
            kvgen_job_desc jd = {.prompt = KVGEN_PROMPT_CHAT, .role = "user", .text = text, .gen = gd};
            kvgen_job *j = NULL;
            CHECK_OK(kvgen_job_submit(s, &jd, &j, &err));
            CHECK(j && job_final(j));
            kvgen_job_info ji;
            kvgen_job_get_info(j, &ji);
            CHECKF(ji.state == KVGEN_JOB_DONE, "turn %d: %s %s", q, kvgen_job_state_name(ji.state), ji.error.message);
            kvgen_job_release(j);
            if (ji.state != KVGEN_JOB_DONE) break;
            kvgen_session_cache_info(s, &info);
            *mid_reply += info.shifts > shifts0;
            CHECKF(turns_held(mm, s, q, &first) > 0, "turn %d: the session holds turns out of order", q);
        }
        dropped_any |= first > 1;
        /* the system prompt is where it was */
        CHECKF(strncmp(session_text(s), "<|im_start|>system\nYou are Brom", 31) == 0, "turn %d: \"%.60s\"", q,
               session_text(s));
    }
    kvgen_cache_info info;
    kvgen_session_cache_info(s, &info);
    CHECKF(info.shifts >= 3 && dropped_any, "%zu shifts, oldest turn held %d", info.shifts, first);
    kvgen_session_close(s);
}

/* A Jinja turn, a family turn, a Jinja turn again: each message stays the role it was sent as. */
static void switched_templates(kvgen_model *mm) {
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(mm, NULL, &s, &err));
    char want[8192], reply[512];
    kvgen_generate_desc gd = {.max_tokens = 12};
    kvgen_finish fin;
    CHECK_OK(kvgen_chat_begin(s, "user", "[q01] Who are you?", &err));
    CHECK_OK(kvgen_generate(s, &gd, reply, sizeof reply, NULL, &fin, &err));
    snprintf(want, sizeof want,
             "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
             "<|im_start|>user\n[q01] Who are you?<|im_end|>\n<|im_start|>assistant\n%s<|im_end|>\n",
             reply);
    kvgen_chat_template fam = {.name = "chatml"};
    CHECK_OK(kvgen_chat_set_template(s, &fam, &err));
    CHECK_OK(kvgen_chat_begin(s, "user", "[q02] Where is the gate?", &err));
    CHECK_OK(kvgen_generate(s, &gd, reply, sizeof reply, NULL, &fin, &err));
    size_t k = strlen(want);
    snprintf(want + k, sizeof want - k, "<|im_start|>user\n[q02] Where is the gate?<|im_end|>\n<|im_start|>assistant\n%s"
             "<|im_end|>\n", reply);
    CHECK_OK(kvgen_chat_set_template(s, NULL, &err));
    CHECK_OK(kvgen_chat_begin(s, "user", "[q03] Thanks.", &err));
    k = strlen(want);
    snprintf(want + k, sizeof want - k, "<|im_start|>user\n[q03] Thanks.<|im_end|>\n<|im_start|>assistant\n");
    CHECKF(strcmp(session_text(s), want) == 0, "\"%s\"\nwanted \"%s\"", session_text(s), want);
    /* and back to the family once more: the Jinja turn's reply is closed, nothing repeated */
    CHECK_OK(kvgen_generate(s, &gd, reply, sizeof reply, NULL, &fin, &err));
    k = strlen(want);
    snprintf(want + k, sizeof want - k, "%s<|im_end|>\n<|im_start|>user\n[q04] Bye.<|im_end|>\n<|im_start|>assistant\n",
             reply);
    CHECK_OK(kvgen_chat_set_template(s, &fam, &err));
    CHECK_OK(kvgen_chat_begin(s, "user", "[q04] Bye.", &err));
    CHECKF(strcmp(session_text(s), want) == 0, "\"%s\"\nwanted \"%s\"", session_text(s), want);
    kvgen_session_close(s);
}

/* A template that renders nothing is named in the error; the session is left as it was. */
static void empty_rendering(kvgen_model *mm) {
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(mm, NULL, &s, &err));
    kvgen_chat_template none = {.jinja = "{% if false %}x{% endif %}"};
    CHECK_OK(kvgen_chat_set_template(s, &none, &err));
    CHECK(kvgen_chat_begin(s, "user", "hi", &err) == KVGEN_E_UNSUPPORTED);
    CHECKF(strstr(err.message, "kvgen_chat_begin: the session's chat template renders nothing"), "%s", err.message);
    CHECK(kvgen_session_length(s) == 0);
    kvgen_gen *g = NULL;
    CHECK(kvgen_chat_gen_begin(s, "user", "hi", NULL, &g, &err) == KVGEN_E_UNSUPPORTED && !g);
    CHECKF(strstr(err.message, "renders nothing"), "%s", err.message);
    kvgen_session_close(s);
}

static void shifts(const char *path) {
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_CPU};
    kvgen_error err = {0};
    kvgen_model *mm = NULL;
    CHECK_OK(kvgen_model_load(&md, &mm, &err));
    if (!mm) return;
    kvgen_model *saved = m;
    m = mm; /* session_text */
    const char *given = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    /* the caller's template through every entry point, the file's through one (the same path) */
    for (int entry = 0; entry < 3; entry++)
        for (int t = entry == 0 ? 0 : 1; t < 2; t++) {
            int mid = 0, pre = 0;
            shifted_chat(mm, t ? given : NULL, entry, &mid, &pre);
            printf("entry %d, %s template: shifts in %d replies, %d turns' prefills\n", entry, t ? "given" : "file's",
                   mid, pre);
            CHECKF(mid > 0, "entry %d template %d: no shift in the middle of a reply", entry, t);
        }
    switched_templates(mm);
    empty_rendering(mm);
    m = saved;
    kvgen_model_unload(mm);
}

/* chat_tools.txt's template `tname` and, for case `cname`, its variables and jinja2's text */
static bool tool_case(const char *tname, const char *cname, char **tpl, char **vars, char **expect) {
    FILE *f = tu_open_fixture("chat_tools.txt");
    *tpl = *vars = *expect = NULL;
    if (!f) return false;
    tu_record r;
    char head[256];
    snprintf(head, sizeof head, "template %s", tname);
    bool in_case = false;
    while (tu_read_record(f, &r)) {
        if (strcmp(r.head, head) == 0 && !*tpl) {
            *tpl = r.body;
            continue;
        }
        if (strncmp(r.head, "case ", 5) == 0) in_case = strncmp(r.head + 5, cname, strlen(cname)) == 0 &&
                                                     r.head[5 + strlen(cname)] == ' ';
        else if (in_case && strcmp(r.head, "vars") == 0 && !*vars) {
            *vars = r.body;
            continue;
        } else if (in_case && strcmp(r.head, "expect") == 0 && !*expect) {
            *expect = r.body;
            continue;
        }
        free(r.body);
    }
    fclose(f);
    return *tpl && *vars && *expect;
}

/* the blacksmith's exchange up to a tool call: system and user messages, then the assistant's
 * call of get_price (content as given: NULL for none); returns the call's message */
static kvgen_chat_message add_price_call(kvgen_session *s, const char *content) {
    kvgen_error err = {0};
    CHECK_OK(kvgen_chat_add(s, "system", "You are Mira, the village blacksmith.", &err));
    CHECK_OK(kvgen_chat_add(s, "user", "How much is a sword?", &err));
    kvgen_chat_message call = {
        .role = "assistant",
        .content = content,
        .tool_calls = "[{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_price\", "
                      "\"arguments\": {\"item\": \"sword\", \"quantity\": 1}}}]"};
    CHECK_OK(kvgen_chat_add_message(s, &call, &err));
    return call;
}
/* Phi-4-mini's template reads the tools from the system message's "tools" field and renders
 * no tool_calls: through the public calls, the chat's tools reach it there (in a system message
 * of no text when the chat has none) and a call goes to it as text after the message's content,
 * rendering what jinja2 renders for those messages. */
static void phi4_tools(void) {
    char *tpl, *vars, *expect, *tpl2, *vars2, *expect2;
    CHECK(tool_case("phi4_mini", "phi4_mini/phi_session/tools/1", &tpl, &vars, &expect));
    CHECK(tool_case("phi4_mini", "phi4_mini/phi_nosys/tools/1", &tpl2, &vars2, &expect2));
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    if (expect && expect2) CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    if (s) {
        kvgen_chat_template t = {.jinja = tpl};
        CHECK_OK(kvgen_chat_set_template(s, &t, &err));
        CHECKF(strcmp(kvgen_chat_tool_format(s), "phi4") == 0, "%s", kvgen_chat_tool_format(s));
        CHECK_OK(kvgen_chat_set_vars(s, vars, &err));
        CHECK_OK(kvgen_chat_begin(s, "user", "How much is a sword?", &err));
        CHECKF(strcmp(session_text(s), expect2) == 0, "\n--- jinja2\n%s\n--- kvgen\n%s\n---", expect2, session_text(s));
        kvgen_session_close(s);
        s = NULL;
        CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    }
    if (s) {
        kvgen_chat_template t = {.jinja = tpl};
        CHECK_OK(kvgen_chat_set_template(s, &t, &err));
        CHECK_OK(kvgen_chat_set_vars(s, vars, &err));
        add_price_call(s, NULL);
        kvgen_chat_message result = {.role = "tool", .content = "{\"price\": 12}", .tool_call_id = "call_1"};
        CHECK_OK(kvgen_chat_add_message(s, &result, &err));
        CHECK_OK(kvgen_chat_begin(s, NULL, NULL, &err));
        CHECKF(strcmp(session_text(s), expect) == 0, "\n--- jinja2\n%s\n--- kvgen\n%s\n---", expect, session_text(s));
        /* without the tools, the system message is the chat's own */
        CHECK_OK(kvgen_chat_set_vars(s, NULL, &err));
        CHECK_OK(kvgen_chat_begin(s, "user", "Thanks!", &err));
        CHECKF(!strstr(session_text(s), "<|tool|>[") &&
                   strncmp(session_text(s), "<|system|>You are Mira, the village blacksmith.<|end|>", 54) == 0,
               "%s", session_text(s));
        kvgen_session_close(s);
    }
    free(tpl);
    free(vars);
    free(expect);
    free(tpl2);
    free(vars2);
    free(expect2);
}

/* Qwen2.5-Coder's template with tools, a tool call and its result, through the public calls
 * turn by turn, renders what jinja2 renders (SmolLM2's vocabulary has ChatML's control tokens);
 * fork and session files keep the tools and the messages' fields; bad input changes nothing. */
static void tools(void) {
    char *tpl, *vars, *expect;
    CHECK(tool_case("qwen25_coder", "qwen25_coder/tool_call/tools/1", &tpl, &vars, &expect));
    if (!expect) return;
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    kvgen_chat_template t = {.jinja = tpl};
    CHECK_OK(kvgen_chat_set_template(s, &t, &err));
    CHECK_OK(kvgen_chat_set_vars(s, vars, &err));
    kvgen_chat_message call = add_price_call(s, "");
    size_t len = kvgen_session_length(s);
    /* bad input: an error naming what is wrong, and the session as it was */
    kvgen_chat_message bad = call;
    bad.tool_calls = "[{\"id\": 1, \"function\": {\"name\": \"x\"}}]";
    CHECK(kvgen_chat_add_message(s, &bad, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECKF(strstr(err.message, "kvgen_chat_add_message: tool_calls[0]"), "%s", err.message);
    bad.tool_calls = "[{\"id\": 1,";
    CHECK(kvgen_chat_add_message(s, &bad, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECKF(strstr(err.message, "kvgen_chat_add_message: tool_calls: not valid JSON at byte"), "%s", err.message);
    bad = (kvgen_chat_message){.role = "user", .content = "x", .tool_call_id = "call_1"};
    CHECK(kvgen_chat_add_message(s, &bad, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECKF(strstr(err.message, "tool_call_id belongs to a tool message"), "%s", err.message);
    CHECK(kvgen_chat_set_vars(s, "[1]", &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECKF(strstr(err.message, "kvgen_chat_set_vars: json: not a JSON object"), "%s", err.message);
    CHECK(kvgen_chat_set_vars(s, "{\"messages\": []}", &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECKF(strstr(err.message, "\"messages\" is the chat's own variable"), "%s", err.message);
    CHECK(kvgen_chat_set_vars(s, "{\"tools\": [}", &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_session_length(s) == len);

    kvgen_chat_message result = {.role = "tool", .content = "{\"price\": 12}", .tool_call_id = "call_1"};
    CHECK_OK(kvgen_chat_add_message(s, &result, &err));
    CHECK_OK(kvgen_chat_begin(s, NULL, NULL, &err));
    CHECKF(strcmp(session_text(s), expect) == 0, "\n--- jinja2\n%s\n--- kvgen\n%s\n---", expect, session_text(s));

    /* a fork and a session file keep the variables and the fields: the next turn renders on */
    char *path = tu_tmpfile("tools.kvgs");
    CHECK_OK(kvgen_session_save(s, path, &err));
    kvgen_session *r = NULL, *fk = NULL;
    CHECK_OK(kvgen_session_restore(m, path, &r, &err));
    CHECK_OK(kvgen_session_fork(s, &fk, &err));
    kvgen_session *each[3] = {s, r, fk};
    char first[8192] = "";
    for (int i = 0; i < 3; i++) {
        if (!each[i]) continue;
        size_t before = kvgen_session_length(each[i]);
        CHECK_OK(kvgen_chat_add(each[i], "assistant", "A sword is 12 gold.", &err));
        CHECK_OK(kvgen_chat_begin(each[i], "user", "Thanks!", &err));
        CHECKF(kvgen_session_length(each[i]) > before && strncmp(session_text(each[i]), expect, strlen(expect)) == 0,
               "session %d: \"%s\"", i, session_text(each[i]));
        if (i == 0) snprintf(first, sizeof first, "%s", session_text(each[i]));
        else CHECKF(strcmp(first, session_text(each[i])) == 0, "session %d differs", i);
    }
    /* removing the tools changes the system prompt: the cache rewinds to where it differs */
    CHECK_OK(kvgen_chat_set_vars(s, NULL, &err));
    CHECK_OK(kvgen_chat_begin(s, "user", "Bye", &err));
    CHECKF(!strstr(session_text(s), "# Tools") && strstr(session_text(s), "<tool_call>\n{\"name\": \"get_price\""),
           "\"%s\"", session_text(s));
    /* a built-in family has no place for tool messages */
    kvgen_chat_template fam = {.name = "chatml"};
    CHECK_OK(kvgen_chat_set_template(r, &fam, &err));
    len = kvgen_session_length(r);
    CHECK(kvgen_chat_add(r, "tool", "12", &err) == KVGEN_E_UNSUPPORTED);
    CHECKF(strstr(err.message, "need a Jinja chat template"), "%s", err.message);
    CHECK(kvgen_session_length(r) == len);
    kvgen_session_close(s);
    kvgen_session_close(r);
    kvgen_session_close(fk);
    remove(path);
    free(path);
    free(tpl);
    free(vars);
    free(expect);
}

/* ---- the conversation read back and undone (a random-weight model: runs without the default) ---- */

static const char *const READBACK_TEMPLATE =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

static bool same_str(const char *a, const char *b) { return (!a && !b) || (a && b && strcmp(a, b) == 0); }

/* whether the session's messages are exactly want[0..n) */
static bool messages_are(kvgen_session *s, const kvgen_chat_message *want, size_t n) {
    kvgen_error err = {0};
    kvgen_chat_message *got = NULL;
    size_t n_got = 99;
    CHECK_OK(kvgen_chat_messages(s, &got, &n_got, &err));
    bool same = n_got == n;
    for (size_t i = 0; same && i < n; i++) {
        same = same_str(got[i].role, want[i].role) && same_str(got[i].content, want[i].content) &&
               same_str(got[i].tool_calls, want[i].tool_calls) && same_str(got[i].tool_call_id, want[i].tool_call_id) &&
               same_str(got[i].reasoning_content, want[i].reasoning_content);
        if (!same)
            fprintf(stderr, "message %zu: %s \"%s\", want %s \"%s\"\n", i, got[i].role,
                    got[i].content ? got[i].content : "(null)", want[i].role,
                    want[i].content ? want[i].content : "(null)");
    }
    if (n_got != n) fprintf(stderr, "%zu messages, want %zu\n", n_got, n);
    kvgen_chat_messages_free(got);
    return same;
}

/* whether two sessions hold the same tokens and logits */
static bool same_session(kvgen_model *mm, kvgen_session *a, kvgen_session *b) {
    size_t n = kvgen_session_length(a);
    if (n != kvgen_session_length(b) || memcmp(kvgen_session_tokens(a), kvgen_session_tokens(b), n * sizeof(int32_t)))
        return false;
    kvgen_model_info info;
    kvgen_model_get_info(mm, &info);
    const float *la = kvgen_session_logits(a), *lb = kvgen_session_logits(b);
    return la && lb && tu_max_diff(la, lb, info.n_vocab) == 0.0;
}

static char replies[2][256];

/* The first `steps` of one conversation: a system prompt, then two user turns each answered
 * greedily (step 4: the second user turn without its reply). Jinja: the template above, else the
 * built-in family the vocabulary gives. */
static kvgen_session *converse(kvgen_model *mm, bool jinja, int steps) {
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(mm, NULL, &s, &err));
    if (!s) return NULL;
    kvgen_chat_template t = {.jinja = READBACK_TEMPLATE};
    if (jinja) CHECK_OK(kvgen_chat_set_template(s, &t, &err));
    const char *users[2] = {"Hello there", "A sword, please"};
    kvgen_generate_desc gd = {.max_tokens = 6};
    if (steps >= 1) CHECK_OK(kvgen_chat_add(s, "system", "You keep a shop.", &err));
    for (int u = 0; u < 2; u++) {
        /* a user turn whose reply is not generated: under a family without the assistant header
         * (kvgen_chat_add: an open header would be closed as an empty reply) */
        if (steps == 2 + 2 * u && !jinja) CHECK_OK(kvgen_chat_add(s, "user", users[u], &err));
        else if (steps >= 2 + 2 * u) CHECK_OK(kvgen_chat_begin(s, "user", users[u], &err));
        if (steps < 3 + 2 * u) continue;
        /* the reply as its tokens spell it (the generator's text shows the invalid UTF-8 a random
         * model may sample as U+FFFD; the conversation keeps the bytes) */
        char text[256];
        size_t at = kvgen_session_length(s);
        CHECK_OK(kvgen_generate(s, &gd, text, sizeof text, NULL, NULL, &err));
        kvgen_detokenize(mm, kvgen_session_tokens(s) + at, kvgen_session_length(s) - at, 0, replies[u],
                         sizeof replies[u]);
    }
    return s;
}

static void readback(void) {
    char *path = tu_make_model("chat_readback.gguf", "--seed 7 --layers 2");
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE};
    kvgen_model *mm = path ? tu_load(&md) : NULL;
    if (!mm) {
        free(path);
        return;
    }
    kvgen_error err = {0};
    for (int jinja = 1; jinja >= 0; jinja--) {
        /* read back: what was added, and the replies as generated */
        kvgen_session *s = converse(mm, jinja, 5);
        kvgen_chat_message all[5] = {{.role = "system", .content = "You keep a shop."},
                                     {.role = "user", .content = "Hello there"},
                                     {.role = "assistant", .content = replies[0]},
                                     {.role = "user", .content = "A sword, please"},
                                     {.role = "assistant", .content = replies[1]}};
        CHECKF(messages_are(s, all, 5), "%s", jinja ? "jinja" : "family");
        /* bad n: refused by name, nothing changes */
        size_t len = kvgen_session_length(s);
        CHECK(kvgen_chat_undo(s, -1, &err) == KVGEN_E_INVALID_ARGUMENT);
        CHECKF(strstr(err.message, "kvgen_chat_undo: n -1 is out of range [0, 5]"), "%s", err.message);
        CHECK(kvgen_chat_undo(s, 6, &err) == KVGEN_E_INVALID_ARGUMENT);
        CHECKF(strstr(err.message, "kvgen_chat_undo: n 6 is out of range [0, 5]"), "%s", err.message);
        CHECK_OK(kvgen_chat_undo(s, 0, &err));
        CHECK(kvgen_session_length(s) == len && messages_are(s, all, 5));
        kvgen_session_close(s);

        /* undo 1 (the reply) and 2 (the user turn too): the messages of a session that never had
         * them; under the Jinja template its tokens too; and the next turn is the same on both */
        for (int n = 1; n <= 2; n++) {
            s = converse(mm, jinja, 5);
            kvgen_session *ref = converse(mm, jinja, 5 - n);
            CHECK_OK(kvgen_chat_undo(s, n, &err));
            CHECKF(messages_are(s, all, (size_t)(5 - n)) && messages_are(ref, all, (size_t)(5 - n)), "undo %d", n);
            if (jinja)
                CHECKF(kvgen_session_length(s) == kvgen_session_length(ref) &&
                           memcmp(kvgen_session_tokens(s), kvgen_session_tokens(ref),
                                  kvgen_session_length(s) * sizeof(int32_t)) == 0,
                       "undo %d: %zu tokens, %zu on the session without the turns", n, kvgen_session_length(s),
                       kvgen_session_length(ref));
            CHECK_OK(kvgen_chat_begin(s, "user", "Goodbye", &err));
            CHECK_OK(kvgen_chat_begin(ref, "user", "Goodbye", &err));
            CHECKF(same_session(mm, s, ref), "%s, undo %d: the next turn differs", jinja ? "jinja" : "family", n);
            kvgen_session_close(s);
            kvgen_session_close(ref);
        }

        /* every message, the system prompt included: an empty session */
        s = converse(mm, jinja, 5);
        CHECK_OK(kvgen_chat_undo(s, 5, &err));
        CHECK(kvgen_session_length(s) == 0 && messages_are(s, NULL, 0));
        CHECK(kvgen_chat_undo(s, 1, &err) == KVGEN_E_INVALID_ARGUMENT);
        CHECKF(strstr(err.message, "n 1 is out of range [0, 0]"), "%s", err.message);
        kvgen_session_close(s);
    }

    /* tool calls, tool results and reasoning read back as given (tool_calls as compact JSON) */
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(mm, NULL, &s, &err));
    kvgen_chat_template t = {.jinja = READBACK_TEMPLATE};
    CHECK_OK(kvgen_chat_set_template(s, &t, &err));
    const char *calls = "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"price\",\"arguments\":"
                        "{\"item\":\"sword\",\"count\":2}}}]";
    kvgen_chat_message tools[4] = {
        {.role = "user", .content = "How much is a sword?"},
        {.role = "assistant", .tool_calls = calls, .reasoning_content = "I should look it up."},
        {.role = "tool", .content = "12", .tool_call_id = "c1"},
        {.role = "assistant", .content = "12 gold."}};
    for (int i = 0; i < 4; i++) CHECK_OK(kvgen_chat_add_message(s, &tools[i], &err));
    CHECK(messages_are(s, tools, 4));
    size_t before = kvgen_session_length(s);
    CHECK_OK(kvgen_chat_undo(s, 2, &err));
    CHECK(messages_are(s, tools, 2) && kvgen_session_length(s) < before);
    CHECK_OK(kvgen_chat_add_message(s, &tools[2], &err));
    CHECK(messages_are(s, tools, 3));
    /* a fork and a session file read back the same */
    kvgen_session *fk = NULL;
    CHECK_OK(kvgen_session_fork(s, &fk, &err));
    CHECK(fk && messages_are(fk, tools, 3));
    kvgen_session_close(fk);
    kvgen_session_close(s);
    /* a session without a chat has no messages */
    CHECK_OK(kvgen_session_create(mm, NULL, &s, &err));
    kvgen_chat_message *none = (kvgen_chat_message *)&err;
    size_t n_none = 7;
    CHECK_OK(kvgen_chat_messages(s, &none, &n_none, &err));
    CHECK(none == NULL && n_none == 0);
    CHECK(kvgen_chat_messages(NULL, &none, &n_none, &err) == KVGEN_E_INVALID_ARGUMENT);
    CHECK(kvgen_chat_undo(NULL, 1, &err) == KVGEN_E_INVALID_ARGUMENT);
    kvgen_session_close(s);
    kvgen_model_unload(mm);
    free(path);
}

int main(void) {
    readback();
    const char *path = tu_model_path();
    if (!path) {
        printf("default model absent: only the random-weight model's part ran\n");
        return tu_finish("test_chat");
    }
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE};
    kvgen_error err = {0};
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    if (!m) return tu_finish("test_chat");
    shifts(path);
    tools();
    phi4_tools();
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
