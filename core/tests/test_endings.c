/* test_endings.c: soft_max_tokens, ending a reply where a sentence ends. The rule on its own
 * (kvg_sentence.h: marks, closing quotes, multi-byte UTF-8, abbreviations, lines); then on the
 * default model (greedy, a reply longer than the limits): the text is the prefix of the
 * unlimited reply up to a sentence's end, the cache holds exactly the emitted tokens, and
 * kvgen_gen_*, kvgen_generate and a job give the same reply; max_tokens stays the hard limit;
 * a random model (sampled) keeps the same invariants; bad descs are refused. */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include <time.h>
#include "kvg_sentence.h"
#include "testutil.h"

static void test_rule(void) {
    static const struct {
        const char *text, *next;
        bool want;
    } cases[] = {
        {"Hello there.", " The", true},
        {"Hello there.", "The", false},  /* no space after: not an end ("3.14", "a.b") */
        {"It costs 3.", "14", false},
        {"Hello there", " and", false},
        {"Really?", " Yes", true},
        {"Wow!", "\n", true},
        {"He said \"stop.\"", " Then", true},
        {"(as I said.)", " Then", true},
        {"Wait\xE2\x80\xA6", " no", true}, /* … */
        {"Wait...", " no", true},
        {"Ask Dr.", " Smith", false},
        {"ask mr.", " Smith", false},
        {"J.", " R. R. Tolkien", false},
        {"Fruit, e.g.", " apples", false},
        {"Items:\n2.", " Bread", false},
        {"It was 2019.", " Then", true},
        {"First line", "\nSecond", true},
        {"Steps:", "\n1.", false},
        {"Done.\n", "Next", true},
        {"Done. ", "Next", true},
        {"", " x", false},
        {"   ", "\n", false},
        {"\xE3\x81\xAF\xE3\x81\x84\xE3\x80\x82", "\xE5\x85\x83", true},             /* はい。元 */
        {"\xE3\x80\x8C\xE3\x81\xAF\xE3\x81\x84\xE3\x80\x82", "\xE3\x80\x8D", false}, /* 「はい。 then 」 */
        {"\xE3\x80\x8C\xE3\x81\xAF\xE3\x81\x84\xE3\x80\x82\xE3\x80\x8D", "\xE5\x85\x83", true},
        {"She smiled. *waves.*", " Hi", true},
        {"Hello, \xE2\x80\x9C" "friend.\xE2\x80\x9D", " Then", true}, /* “friend.” */
        {"\xC3\x87" "a va?", " Oui", true},                          /* Ça va? */
        {"Hello.", "", false}, /* nothing after it (a control token): not confirmed */
        {"And so on, etc.", " Then", true},
        {"Yes, no.", " Then", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool got = kvg_sentence_ends(cases[i].text, strlen(cases[i].text), cases[i].next, strlen(cases[i].next));
        CHECKF(got == cases[i].want, "\"%s\" + \"%s\": %d, want %d", cases[i].text, cases[i].next, got,
               cases[i].want);
    }
    /* a tail of a longer text decides the same way */
    const char *longer = "The first sentence is long enough to pass the tail's sixty-four bytes, and it ends here.";
    size_t n = strlen(longer);
    CHECK(kvg_sentence_ends(longer + n - KVG_SENTENCE_TAIL, KVG_SENTENCE_TAIL, " Next", 5));
}

typedef struct reply {
    char text[8192];
    size_t len;
    kvgen_finish finish;
    int n_tokens;
    int32_t last_token; /* the last step's token field */
} reply;

/* runs a generation step by step; the steps joined must be the generator's text */
static void run_steps(kvgen_gen *g, reply *r) {
    kvgen_error err = {0};
    kvgen_gen_step st;
    r->len = 0;
    r->text[0] = 0;
    do {
        if (kvgen_gen_next(g, &st, &err) != KVGEN_OK) break;
        if (r->len + st.len < sizeof r->text) {
            memcpy(r->text + r->len, st.text, st.len + 1);
            r->len += st.len;
        }
        r->last_token = st.token;
    } while (st.finish == KVGEN_FINISH_NONE);
    size_t n;
    const char *text = kvgen_gen_text(g, &n);
    CHECKF(n == r->len && memcmp(text, r->text, n) == 0, "steps \"%s\" vs text \"%s\"", r->text, text);
    r->finish = kvgen_gen_finish(g);
    r->n_tokens = kvgen_gen_n_tokens(g);
}

/* the cache past `from` holds exactly the reply's tokens: streamed through a detokenizer as
 * the generator does (a continuation keeps its leading space), they give its text */
static void check_cache(const kvgen_model *m, kvgen_session *s, size_t from, const reply *r) {
    size_t len = kvgen_session_length(s);
    CHECKF(len == from + (size_t)r->n_tokens, "cache %zu tokens, prompt %zu + reply %d", len, from, r->n_tokens);
    if (len < from) return;
    static char text[8192];
    size_t n = 0;
    kvgen_detok d;
    kvgen_detok_init(&d);
    d.first = 0;
    for (size_t i = from; i < len && n + 600 < sizeof text; i++)
        n += kvgen_detok_push(m, &d, kvgen_session_tokens(s)[i], 0, text + n, sizeof text - n);
    n += kvgen_detok_flush(&d, text + n, sizeof text - n);
    CHECKF(n == r->len && memcmp(text, r->text, n) == 0, "cache \"%s\" (%zu bytes) vs reply \"%s\" (%zu)", text, n,
           r->text, r->len);
}

static kvgen_session *chat_session(kvgen_model *m, const char *user, size_t *prompt_len) {
    kvgen_session_desc sd = {.n_ctx = 1024};
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    if (!s) return NULL;
    CHECK_OK(kvgen_chat_begin(s, "user", user, &err));
    *prompt_len = kvgen_session_length(s);
    return s;
}

static const char *STORY = "Tell me a long story about a brave knight who fights a dragon.";

static void test_real(const char *path) {
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_CPU};
    kvgen_model *m = tu_load(&md);
    if (!m) return;
    kvgen_error err = {0};
    size_t np;

    /* the whole reply, no soft limit */
    static reply full;
    kvgen_session *s = chat_session(m, STORY, &np);
    kvgen_gen *g = NULL;
    kvgen_generate_desc whole = {.max_tokens = 160};
    CHECK_OK(kvgen_gen_begin(s, &whole, &g, &err));
    if (g) run_steps(g, &full);
    kvgen_gen_end(g);
    int32_t full_tokens[160];
    size_t n_full = kvgen_session_length(s) - np;
    memcpy(full_tokens, kvgen_session_tokens(s) + np, n_full * sizeof *full_tokens);
    kvgen_session_close(s);
    CHECKF(full.n_tokens > 60, "the story has only %d tokens: \"%s\"", full.n_tokens, full.text);

    const int softs[] = {16, 40};
    for (int k = 0; k < 2; k++) {
        int soft = softs[k];
        static reply r;
        s = chat_session(m, STORY, &np);
        kvgen_generate_desc d = {.max_tokens = 160, .soft_max_tokens = soft};
        g = NULL;
        CHECK_OK(kvgen_gen_begin(s, &d, &g, &err));
        if (g) run_steps(g, &r);
        kvgen_gen_end(g);
        printf("soft_max_tokens %d: %d tokens (%s): \"%s\"\n", soft, r.n_tokens, kvgen_finish_name(r.finish), r.text);
        CHECKF(r.finish == KVGEN_FINISH_SENTENCE && r.n_tokens >= soft && r.n_tokens < full.n_tokens,
               "soft %d: %s after %d tokens", soft, kvgen_finish_name(r.finish), r.n_tokens);
        CHECK(r.last_token == -1); /* the token after the end was not taken */
        check_cache(m, s, np, &r);
        /* greedy: the same tokens as the whole reply, cut where a sentence ends */
        CHECK(memcmp(kvgen_session_tokens(s) + np, full_tokens, (size_t)r.n_tokens * sizeof *full_tokens) == 0);
        CHECKF(r.len < full.len && memcmp(full.text, r.text, r.len) == 0, "soft %d: \"%s\" is not a prefix", soft,
               r.text);
        CHECK(kvg_sentence_ends(r.text, r.len, full.text + r.len, full.len - r.len));
        /* the reply before it did not end a sentence past the limit: the generation took the first end */
        char next[512];
        int32_t after = full_tokens[r.n_tokens];
        size_t nn = kvgen_detokenize(m, &after, 1, 0, next, sizeof next);
        CHECK(nn > 0 && (next[0] == ' ' || next[0] == '\n'));
        /* the conversation goes on: the open reply is closed by the next turn */
        CHECK_OK(kvgen_chat_begin(s, "user", "Thanks!", &err));
        kvgen_session_close(s);

        /* one-shot: the same reply */
        s = chat_session(m, STORY, &np);
        char out[8192];
        size_t len = 0;
        kvgen_finish fin = KVGEN_FINISH_NONE;
        CHECK_OK(kvgen_generate(s, &d, out, sizeof out, &len, &fin, &err));
        CHECKF(fin == r.finish && len == r.len && memcmp(out, r.text, len) == 0, "one-shot \"%s\" (%s)", out,
               kvgen_finish_name(fin));
        CHECK(kvgen_session_length(s) == np + (size_t)r.n_tokens);
        kvgen_session_close(s);

        /* a job on the worker: the same reply */
        kvgen_session_desc sd = {.n_ctx = 1024};
        s = NULL;
        CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
        kvgen_job_desc jd = {.prompt = KVGEN_PROMPT_CHAT, .role = "user", .text = STORY, .gen = d};
        kvgen_job *j = NULL;
        CHECK_OK(kvgen_job_submit(s, &jd, &j, &err));
        if (j) {
            CHECK(tu_job_wait(j));
            kvgen_job_info info;
            kvgen_job_get_info(j, &info);
            size_t jl;
            const char *jt = kvgen_job_text(j, &jl);
            CHECKF(info.state == KVGEN_JOB_DONE && info.finish == KVGEN_FINISH_SENTENCE && info.n_tokens == r.n_tokens &&
                       jl == r.len && memcmp(jt, r.text, jl) == 0,
                   "job: %s %s %d tokens \"%s\"", kvgen_job_state_name(info.state), kvgen_finish_name(info.finish),
                   info.n_tokens, jt);
            kvgen_job_release(j);
            CHECK(kvgen_session_length(s) == np + (size_t)r.n_tokens);
        }
        kvgen_session_close(s);

        if (k == 0) {
            /* the hard limit comes first: a length finish at max_tokens */
            s = chat_session(m, STORY, &np);
            kvgen_generate_desc hard = {.max_tokens = r.n_tokens - 1, .soft_max_tokens = soft};
            g = NULL;
            static reply h;
            CHECK_OK(kvgen_gen_begin(s, &hard, &g, &err));
            if (g) run_steps(g, &h);
            kvgen_gen_end(g);
            CHECKF(h.finish == KVGEN_FINISH_LENGTH && h.n_tokens == r.n_tokens - 1, "hard limit: %s, %d tokens",
                   kvgen_finish_name(h.finish), h.n_tokens);
            check_cache(m, s, np, &h);
            kvgen_session_close(s);
        }
    }
    kvgen_model_unload(m);
}

/* sampled text from random weights: whatever ends it, the invariants hold, and some seeds end
 * at a sentence */
static void test_random(void) {
    char *path = tu_make_model("endings.gguf", "--seed 7 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2 --type Q8_0");
    if (!path) return;
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 1};
    kvgen_model *m = tu_load(&md);
    free(path);
    if (!m) return;
    kvgen_error err = {0};
    int sentences = 0, lengths = 0;
    for (unsigned seed = 1; seed <= 24; seed++) {
        kvgen_sampler_desc hot = {.temperature = 1.0f, .seed = seed};
        kvgen_session_desc sd = {.n_ctx = 256, .sampler = &hot};
        kvgen_session *s = NULL;
        CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
        if (!s) break;
        int32_t ids[64];
        size_t np = 0;
        CHECK_OK(kvgen_tokenize(m, "the quest. ", 11, 0, ids, 64, &np, &err));
        CHECK_OK(kvgen_session_prefill(s, ids, np, NULL, &err));
        kvgen_generate_desc d = {.max_tokens = 48, .soft_max_tokens = 4, .ignore_eog = 1};
        kvgen_gen *g = NULL;
        static reply r;
        CHECK_OK(kvgen_gen_begin(s, &d, &g, &err));
        if (g) run_steps(g, &r);
        kvgen_gen_end(g);
        if (r.finish == KVGEN_FINISH_SENTENCE) {
            sentences++;
            CHECK(r.n_tokens >= 4 && r.last_token == -1);
            /* the next token is not known here; the text itself must end with a mark, a closer or a line */
            CHECKF(kvg_sentence_ends(r.text, r.len, " ", 1) || kvg_sentence_ends(r.text, r.len, "\n", 1),
                   "seed %u: \"%s\"", seed, r.text);
        } else {
            lengths++;
            CHECKF(r.finish == KVGEN_FINISH_LENGTH && r.n_tokens == 48, "seed %u: %s after %d", seed,
                   kvgen_finish_name(r.finish), r.n_tokens);
        }
        check_cache(m, s, np, &r);
        kvgen_session_close(s);
    }
    printf("random model: %d sentence ends, %d length ends\n", sentences, lengths);
    CHECK(sentences > 0);

    /* refused descs change nothing */
    kvgen_generate_desc bad = {.soft_max_tokens = -1};
    CHECK(kvgen_generate_check(&bad, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "soft_max_tokens -1"));
    const char *choices[] = {"yes", "no"};
    kvgen_constraint c = {.kind = KVGEN_CONSTRAIN_CHOICE, .choices = choices, .n_choices = 2};
    kvgen_generate_desc with_c = {.soft_max_tokens = 8, .constraint = &c};
    CHECK(kvgen_generate_check(&with_c, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "constraint"));
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    if (s) {
        int32_t ids[8];
        size_t np = 0;
        CHECK_OK(kvgen_tokenize(m, "hi", 2, 0, ids, 8, &np, &err));
        CHECK_OK(kvgen_session_prefill(s, ids, np, NULL, &err));
        kvgen_gen *g = NULL;
        CHECK(kvgen_gen_begin(s, &bad, &g, &err) == KVGEN_E_INVALID_ARGUMENT && !g &&
              strstr(err.message, "kvgen_gen_begin"));
        kvgen_job *j = NULL;
        kvgen_job_desc jd = {.gen = bad};
        CHECK(kvgen_job_submit(s, &jd, &j, &err) == KVGEN_E_INVALID_ARGUMENT && !j &&
              strstr(err.message, "gen.soft_max_tokens"));
        CHECK(kvgen_session_length(s) == np);
        kvgen_session_close(s);
    }
    CHECK(strcmp(kvgen_finish_name(KVGEN_FINISH_SENTENCE), "sentence") == 0);
    kvgen_model_unload(m);
}

int main(void) {
    test_rule();
    test_random();
    const char *path = tu_model_path();
    if (path)
        test_real(path);
    else
        printf("default model absent: the real-model checks did not run\n");
    return tu_finish("test_endings");
}
