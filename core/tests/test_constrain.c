/* test_constrain.c: choice-constrained output on random models (synthetic byte-level BPE
 * vocabulary, and the llama SentencePiece vocabulary): the text is byte-identical to one of
 * the choices (bytes that are not UTF-8, choices sharing prefixes, one- and many-token
 * choices) for step-wise generation and jobs; the pick is the argmax of kvgen_session_choose
 * (also after a chat turn's assistant header) and the session then holds exactly the tokens
 * that were scored; a sampled pick follows the choices' sequence probabilities and is the same
 * for the same seed on every path; JSON enum values must be UTF-8. The reference backend, and
 * Vulkan when a device is present. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "testutil.h"

static const char *const g_nonutf8[] = {"\xff\xfe"};
static const char *const g_prefixes[] = {"\xff", "\xff\xfe", "\xff\xfe\xfd!", "ab\xc3", "ab\xc3\xa9", "\xc3"};
static const char *const g_words[] = {" yes", " yes please", " no", " \xe2\x82\xac", " the quick brown fox jumps",
                                      "!"};
static const struct {
    const char *const *v;
    int n;
} g_sets[] = {{g_nonutf8, 1}, {g_prefixes, 6}, {g_words, 6}};
static const char *const g_prompts[] = {"pick:", "the", "hello world", "a b c", "x", "once upon", "zz", "fire"};

static kvgen_session *new_session(kvgen_model *m, const kvgen_sampler_desc *sd) {
    kvgen_session_desc d = {.n_ctx = 256, .sampler = sd};
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_create(m, &d, &s, &err));
    return s;
}

static size_t tokens_of(kvgen_model *m, const char *text, int32_t *ids, size_t cap) {
    size_t n = 0;
    kvgen_error err = {0};
    CHECK_OK(kvgen_tokenize(m, text, strlen(text), 0, ids, cap, &n, &err));
    return n;
}

/* index of the choice whose bytes are exactly text[0..len), or -1 */
static int which(const char *const *v, int n, const char *text, size_t len) {
    for (int i = 0; i < n; i++)
        if (strlen(v[i]) == len && memcmp(v[i], text, len) == 0) return i;
    return -1;
}

/* s:choose's best: the highest total log-probability, the first on ties */
static int best_of(kvgen_session *s, const char *const *v, int n) {
    kvgen_choice r[16];
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_choose(s, v, (size_t)n, r, &err));
    int best = 0;
    for (int i = 1; i < n; i++)
        if (r[i].logprob > r[best].logprob) best = i;
    return best;
}

/* Runs a generation step by step; the steps must add up to the text. Returns the text's
 * length (copied into out) and its finish reason. */
static size_t run_steps(kvgen_session *s, const kvgen_generate_desc *d, char *out, size_t cap, kvgen_finish *fin) {
    kvgen_gen *g = NULL;
    kvgen_error err = {0};
    *fin = KVGEN_FINISH_ERROR;
    CHECK_OK(kvgen_gen_begin(s, d, &g, &err));
    if (!g) return 0;
    char joined[4096];
    size_t jl = 0;
    kvgen_gen_step st;
    do {
        if (kvgen_gen_next(g, &st, &err) != KVGEN_OK) {
            CHECKF(0, "kvgen_gen_next: %s", err.message);
            break;
        }
        if (jl + st.len < sizeof joined) memcpy(joined + jl, st.text, st.len);
        jl += st.len;
    } while (st.finish == KVGEN_FINISH_NONE);
    size_t n;
    const char *text = kvgen_gen_text(g, &n);
    CHECKF(jl == n && memcmp(joined, text, n) == 0, "the steps do not add up to the text");
    if (n < cap) memcpy(out, text, n);
    *fin = kvgen_gen_finish(g);
    kvgen_gen_end(g);
    return n;
}

/* The same through a job: the delivered pieces and kvgen_job_text must agree. */
static size_t run_job(kvgen_session *s, const kvgen_job_desc *jd, char *out, size_t cap, kvgen_finish *fin) {
    kvgen_job *j = NULL;
    kvgen_error err = {0};
    *fin = KVGEN_FINISH_ERROR;
    CHECK_OK(kvgen_job_submit(s, jd, &j, &err));
    if (!j) return 0;
    size_t n = 0;
    for (long long spin = 0; spin < 10000000000LL; spin++) { /* a hang guard, not a time limit */
        const char *t;
        size_t l;
        kvgen_job_state st = kvgen_job_poll(j, &t, &l);
        if (n + l < cap) memcpy(out + n, t, l);
        n += l;
        if (st == KVGEN_JOB_DONE || st == KVGEN_JOB_CANCELLED || st == KVGEN_JOB_FAILED) break;
    }
    kvgen_job_info info;
    kvgen_job_get_info(j, &info);
    CHECKF(info.state == KVGEN_JOB_DONE, "job: %s %s", kvgen_job_state_name(info.state), info.error.message);
    size_t tl;
    const char *t = kvgen_job_text(j, &tl);
    CHECK(tl == n && memcmp(t, out, n) == 0);
    *fin = info.finish;
    kvgen_job_release(j);
    return n;
}

/* Every set, every prompt, greedy and sampled: the text is one of the choices, byte for byte,
 * on both paths; greedy picks s:choose's best and the session holds that choice's tokens. */
static void check_exact(kvgen_model *m, const char *what, int n_prompts) {
    int bad_bytes = 0, bad_pick = 0, bad_tokens = 0, bad_job = 0, runs = 0;
    for (size_t si = 0; si < sizeof g_sets / sizeof g_sets[0]; si++) {
        const char *const *v = g_sets[si].v;
        int nv = g_sets[si].n;
        for (int pi = 0; pi < n_prompts; pi++) {
            for (int mode = 0; mode < 2; mode++) {
                kvgen_sampler_desc sd = {.temperature = mode ? 1.3f : 0.0f, .seed = 11 + (uint64_t)pi};
                kvgen_constraint c = {.kind = KVGEN_CONSTRAIN_CHOICE, .choices = v, .n_choices = nv};
                kvgen_generate_desc gd = {.constraint = &c};
                int32_t prompt[64];
                size_t np = tokens_of(m, g_prompts[pi], prompt, 64);
                kvgen_session *a = new_session(m, &sd), *b = new_session(m, &sd);
                if (!a || !b) return;
                kvgen_error err = {0};
                CHECK_OK(kvgen_session_prefill(a, prompt, np, NULL, &err));
                int best = best_of(a, v, nv);
                char text[4096], jtext[4096];
                kvgen_finish fin, jfin;
                size_t n = run_steps(a, &gd, text, sizeof text, &fin);
                int got = which(v, nv, text, n);
                runs++;
                if (got < 0 || fin != KVGEN_FINISH_STOP) bad_bytes++;
                if (mode == 0 && got != best) bad_pick++;
                if (got >= 0) {
                    int32_t want[64];
                    size_t nw = tokens_of(m, v[got], want, 64);
                    size_t len = kvgen_session_length(a);
                    if (len != np + nw || memcmp(kvgen_session_tokens(a) + np, want, nw * sizeof *want) != 0)
                        bad_tokens++;
                }
                kvgen_job_desc jd = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = prompt, .n_tokens = np, .gen = gd};
                size_t jn = run_job(b, &jd, jtext, sizeof jtext, &jfin);
                if (jn != n || memcmp(jtext, text, n) != 0 || jfin != fin) bad_job++;
                kvgen_session_close(a);
                kvgen_session_close(b);
            }
        }
    }
    CHECKF(bad_bytes == 0, "%s: %d of %d replies are none of the choices (byte for byte)", what, bad_bytes, runs);
    CHECKF(bad_pick == 0, "%s: %d of %d greedy replies are not s:choose's best", what, bad_pick, runs / 2);
    CHECKF(bad_tokens == 0, "%s: %d of %d sessions do not hold the scored tokens", what, bad_tokens, runs);
    CHECKF(bad_job == 0, "%s: %d of %d jobs differ from the blocking reply", what, bad_job, runs);
}

/* After a chat turn the assistant header is in the session: s:choose there scores exactly
 * the continuation a choices reply is (same prompt tokens, same spelling). */
static void check_chat(kvgen_model *m, const char *what) {
    static const char *const q[] = {"Is fire hot or cold?", "Left or right?", "hi"};
    static const char *const v[] = {"Hot", "Cold", "Left", "Right", "I do not know"};
    kvgen_chat_template chatml = {.name = "chatml"};
    int bad = 0;
    for (int i = 0; i < 3; i++) {
        kvgen_session *a = new_session(m, NULL), *b = new_session(m, NULL);
        if (!a || !b) return;
        kvgen_error err = {0};
        CHECK_OK(kvgen_chat_set_template(a, &chatml, &err));
        CHECK_OK(kvgen_chat_set_template(b, &chatml, &err));
        CHECK_OK(kvgen_chat_begin(a, "user", q[i], &err));
        size_t np = kvgen_session_length(a);
        int best = best_of(a, v, 5);
        kvgen_constraint c = {.kind = KVGEN_CONSTRAIN_CHOICE, .choices = v, .n_choices = 5};
        kvgen_generate_desc gd = {.constraint = &c};
        char text[256], jtext[256];
        kvgen_finish fin, jfin;
        size_t n = run_steps(a, &gd, text, sizeof text, &fin);
        int32_t want[64];
        size_t nw = tokens_of(m, v[best], want, 64);
        if (which(v, 5, text, n) != best || kvgen_session_length(a) != np + nw ||
            memcmp(kvgen_session_tokens(a) + np, want, nw * sizeof *want) != 0)
            bad++;
        kvgen_job_desc jd = {.prompt = KVGEN_PROMPT_CHAT, .role = "user", .text = q[i], .gen = gd};
        size_t jn = run_job(b, &jd, jtext, sizeof jtext, &jfin);
        if (jn != n || memcmp(jtext, text, n) != 0) bad++;
        kvgen_session_close(a);
        kvgen_session_close(b);
    }
    CHECKF(bad == 0, "%s: %d chat replies disagree with s:choose after the assistant header", what, bad);
}

/* Sampled picks: p(choice) ~ exp(logprob / T) from s:choose's scores, the same pick for the
 * same seed on the blocking and job paths. */
static void check_sampled(kvgen_model *m, const char *what, int n_seeds) {
    /* one- and two-token choices sharing prefixes; T flattens the random model's scores so
     * that each comes up (about 9% for the two-token ones) */
    static const char *const v[] = {"ab", "ba", "b", "a"};
    const float T = 4.0f;
    int32_t prompt[16];
    size_t np = tokens_of(m, "pick one", prompt, 16);
    kvgen_session *ref = new_session(m, NULL);
    if (!ref) return;
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_prefill(ref, prompt, np, NULL, &err));
    kvgen_choice r[4];
    CHECK_OK(kvgen_session_choose(ref, v, 4, r, &err));
    kvgen_session_close(ref);
    double p[4], total = 0, max = -INFINITY;
    for (int i = 0; i < 4; i++) max = fmax(max, r[i].logprob);
    for (int i = 0; i < 4; i++) total += p[i] = exp((r[i].logprob - max) / T);
    int count[4] = {0}, differ = 0, stray = 0;
    for (int k = 0; k < n_seeds; k++) {
        kvgen_sampler_desc sd = {.temperature = T, .seed = 500 + (uint64_t)k};
        kvgen_constraint c = {.kind = KVGEN_CONSTRAIN_CHOICE, .choices = v, .n_choices = 4};
        kvgen_generate_desc gd = {.constraint = &c};
        kvgen_session *a = new_session(m, &sd), *b = new_session(m, &sd);
        if (!a || !b) return;
        CHECK_OK(kvgen_session_prefill(a, prompt, np, NULL, &err));
        char text[256], jtext[256];
        kvgen_finish fin, jfin;
        size_t n = run_steps(a, &gd, text, sizeof text, &fin);
        int got = which(v, 4, text, n);
        if (got >= 0) count[got]++;
        else stray++;
        kvgen_job_desc jd = {.prompt = KVGEN_PROMPT_TOKENS, .tokens = prompt, .n_tokens = np, .gen = gd};
        size_t jn = run_job(b, &jd, jtext, sizeof jtext, &jfin);
        if (jn != n || memcmp(jtext, text, n) != 0) differ++;
        kvgen_session_close(a);
        kvgen_session_close(b);
    }
    CHECKF(stray == 0 && differ == 0, "%s: %d replies not a choice, %d jobs differ", what, stray, differ);
    for (int i = 0; i < 4; i++) {
        double want = p[i] / total, got = (double)count[i] / n_seeds;
        /* 4 standard deviations of a binomial frequency, plus a little */
        double allow = 4 * sqrt(want * (1 - want) / n_seeds) + 0.01;
        CHECKF(fabs(got - want) <= allow, "%s: \"%s\" picked %.3f of the time, expected %.3f (+-%.3f)", what, v[i],
               got, want, allow);
    }
}

/* SentencePiece adds a prefix space to text tokenized alone: a choice is still spelled by
 * tokens whose bytes are exactly its own, and s:choose scores that spelling. */
static void check_spm(kvgen_model *m) {
    static const char *const v[] = {"Hot", "Cold", " Hot", "\xff\xfe", "caf\xc3\xa9"};
    int bad = 0;
    for (int pi = 0; pi < 4; pi++) {
        kvgen_session *s = new_session(m, NULL);
        if (!s) return;
        int32_t prompt[64];
        size_t np = tokens_of(m, g_prompts[pi], prompt, 64);
        kvgen_error err = {0};
        CHECK_OK(kvgen_session_prefill(s, prompt, np, NULL, &err));
        kvgen_choice r[5];
        CHECK_OK(kvgen_session_choose(s, v, 5, r, &err));
        int best = best_of(s, v, 5);
        kvgen_constraint c = {.kind = KVGEN_CONSTRAIN_CHOICE, .choices = v, .n_choices = 5};
        kvgen_generate_desc gd = {.constraint = &c};
        char text[256];
        kvgen_finish fin;
        size_t n = run_steps(s, &gd, text, sizeof text, &fin);
        int got = which(v, 5, text, n);
        /* the appended tokens' bytes are the reply, and as many as s:choose scored */
        char bytes[256];
        size_t nb = 0, len = kvgen_session_length(s);
        for (size_t t = np; t < len && nb < 200; t++)
            nb += kvgen_token_piece(m, kvgen_session_tokens(s)[t], 0, bytes + nb, sizeof bytes - nb);
        if (got != best || nb != n || memcmp(bytes, text, n) != 0 || (int)(len - np) != r[best].n_tokens) bad++;
        kvgen_session_close(s);
    }
    CHECKF(bad == 0, "spm: %d of 4 replies are not exactly s:choose's best spelling", bad);
}

/* JSON is UTF-8: an enum value that is not is refused when the generation is set up, and at
 * submit for a job. */
static void check_json_utf8(kvgen_model *m) {
    static const char *const vals[] = {"ok", "\xff"};
    kvgen_json_field f = {.key = "k", .type = KVGEN_JSON_ENUM, .values = vals, .n_values = 2};
    kvgen_constraint c = {.kind = KVGEN_CONSTRAIN_JSON, .fields = &f, .n_fields = 1};
    kvgen_generate_desc gd = {.constraint = &c};
    kvgen_session *s = new_session(m, NULL);
    if (!s) return;
    int32_t one = 1;
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_prefill(s, &one, 1, NULL, &err));
    kvgen_gen *g = NULL;
    CHECK(kvgen_gen_begin(s, &gd, &g, &err) == KVGEN_E_INVALID_ARGUMENT && !g && strstr(err.message, "UTF-8"));
    kvgen_gen_end(g);
    kvgen_job_desc jd = {.gen = gd};
    kvgen_job *j = NULL;
    CHECK(kvgen_job_submit(s, &jd, &j, &err) == KVGEN_E_INVALID_ARGUMENT && !j && strstr(err.message, "UTF-8"));
    kvgen_job_release(j);
    kvgen_session_close(s);
}

static kvgen_model *load(const char *path, kvgen_backend backend) {
    kvgen_model_desc md = {.path = path, .backend = backend, .n_threads = 1};
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    return m;
}

static void vulkan_body(void *arg) {
    kvgen_model *m = load(arg, KVGEN_BACKEND_VULKAN);
    if (m) {
        check_exact(m, "vulkan", 4);
        check_chat(m, "vulkan");
        check_sampled(m, "vulkan", 100);
    }
    kvgen_model_unload(m);
}

/* the Vulkan runs, in a child (tu_vulkan_child) */
static void check_vulkan(const char *path) { tu_vulkan_child("constraints", vulkan_body, (void *)path); }

int main(void) {
    char *path = tu_make_model("constrain.gguf", "--seed 53 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2 "
                                                 "--type Q8_0");
    if (!path) return tu_finish("test_constrain");
    kvgen_model *m = load(path, KVGEN_BACKEND_REFERENCE);
    if (m) {
        check_exact(m, "reference", 8);
        check_chat(m, "reference");
        check_sampled(m, "reference", 400);
        check_json_utf8(m);
    }
    kvgen_model_unload(m);
    char *vocab = tu_testdata("tokenizer/ggml-vocab-llama-spm.gguf");
    char args[1024];
    snprintf(args, sizeof args, "--seed 54 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2 --vocab %s", vocab);
    char *spm_path = tu_make_model("constrain-spm.gguf", args);
    kvgen_model *spm = spm_path ? load(spm_path, KVGEN_BACKEND_REFERENCE) : NULL;
    CHECK(spm != NULL);
    if (spm) check_spm(spm);
    kvgen_model_unload(spm);
    check_vulkan(path);
    free(spm_path);
    free(vocab);
    free(path);
    return tu_finish("test_constrain");
}
