/* test_session_pool.c: the KV page pool under many sessions: memory of 64 forked NPCs, a
 * seeded random interleaving of session operations, and pool exhaustion. */
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include "testutil.h"

static int n_vocab;
static kvgen_model *oracle; /* same weights, its own pool: sessions recompute from scratch */

static kvgen_model *load(const char *path, const kvgen_model_desc *extra) {
    kvgen_model_desc md = {0};
    if (extra) md = *extra;
    md.path = path;
    md.backend = KVGEN_BACKEND_REFERENCE;
    md.n_threads = 2;
    return tu_load(&md);
}

static uint64_t rng_next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void fill_tokens(int32_t *t, size_t n, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) t[i] = (int32_t)(rng_next(rng) % (uint64_t)n_vocab);
}

static double max_diff(const float *a, const float *b) {
    return tu_max_diff(a, b, n_vocab);
}

static double diff_to_scratch(const kvgen_session *s) {
    kvgen_error err = {0};
    kvgen_session *o = NULL;
    kvgen_session_desc sd = {.n_ctx = 1024};
    CHECK_OK(kvgen_session_create(oracle, &sd, &o, &err));
    CHECK_OK(kvgen_session_prefill(o, kvgen_session_tokens(s), kvgen_session_length(s), NULL, &err));
    double d = max_diff(kvgen_session_logits(s), kvgen_session_logits(o));
    kvgen_session_close(o);
    return d;
}

/* 64 NPCs forked from one 512-token persona prompt, each adding 32 tokens of its own. */
static void test_forked_npcs(kvgen_model *m) {
    enum { PROMPT = 512, OWN = 32, NPCS = 64 };
    kvgen_error err = {0};
    uint64_t rng = 99;
    int32_t prompt[PROMPT], own[OWN];
    fill_tokens(prompt, PROMPT, &rng);
    kvgen_session *persona = NULL, *npc[NPCS] = {0};
    kvgen_session_desc sd = {.n_ctx = 1024};
    CHECK_OK(kvgen_session_create(m, &sd, &persona, &err));
    CHECK_OK(kvgen_session_prefill(persona, prompt, PROMPT, NULL, &err));
    for (int i = 0; i < NPCS; i++) {
        CHECK_OK(kvgen_session_fork(persona, &npc[i], &err));
        fill_tokens(own, OWN, &rng);
        if (npc[i]) CHECK_OK(kvgen_session_prefill(npc[i], own, OWN, NULL, &err));
    }
    kvgen_pool_info pi;
    kvgen_model_pool_info(m, &pi);
    size_t tokens = PROMPT + NPCS * OWN;
    size_t bound = tokens * pi.bytes_per_token + NPCS * pi.bytes_per_page;
    double ratio = (double)pi.bytes_used / (double)bound;
    printf("64 forked NPCs: %zu pages used = %.2f MiB; (512 + 64*32) tokens + one page per session = %.2f MiB; "
           "ratio %.3f; %zu tokens alone = %.2f MiB; page size %zu\n",
           pi.pages_used, pi.bytes_used / 1048576.0, bound / 1048576.0, ratio, tokens,
           tokens * pi.bytes_per_token / 1048576.0, pi.page_size);
    CHECKF(ratio <= 1.10, "pool memory %.3f of the bound", ratio);
    CHECK(pi.bytes_used >= tokens * pi.bytes_per_token);
    /* the prompt ends on a page boundary and each NPC adds one page: no waste at all here */
    CHECK(pi.bytes_used == tokens * pi.bytes_per_token);
    CHECK(pi.sessions == NPCS + 1);
    kvgen_cache_info ci;
    kvgen_session_cache_info(npc[7], &ci);
    CHECK(ci.pages_shared == PROMPT / ci.page_size && ci.length == PROMPT + OWN);
    CHECKF(diff_to_scratch(npc[7]) <= 1e-5, "npc 7 logits differ from a recomputation");
    CHECKF(diff_to_scratch(npc[NPCS - 1]) <= 1e-5, "npc 63 logits differ from a recomputation");
    for (int i = 0; i < NPCS; i++) kvgen_session_close(npc[i]);
    kvgen_session_close(persona);
    kvgen_model_pool_info(m, &pi);
    CHECK(pi.pages_used == 0 && pi.sessions == 0);
}

/* Sessions created, prefilled, decoded, forked, rewound and closed in a seeded random order.
 * After each step every other live session still has the logits it had, and a sample of
 * sessions match a recomputation from scratch. */
static void test_interleaving(kvgen_model *m) {
    enum { MAX = 10, STEPS = 300 };
    kvgen_error err = {0};
    kvgen_session *s[MAX] = {0};
    float *last[MAX];
    for (int i = 0; i < MAX; i++) last[i] = malloc((size_t)n_vocab * sizeof(float));
    bool has[MAX] = {0};
    uint64_t rng = 12345;
    int32_t toks[48];
    /* a shared stem makes prefix reuse and page sharing happen often */
    int32_t stem[96];
    fill_tokens(stem, 96, &rng);
    kvgen_session_desc sd = {.n_ctx = 512};
    int checked = 0, ops[6] = {0};
    for (int step = 0; step < STEPS; step++) {
        int i = (int)(rng_next(&rng) % MAX), op = (int)(rng_next(&rng) % 6);
        kvgen_status st = KVGEN_OK;
        if (!s[i]) op = 0;
        ops[op]++;
        switch (op) {
        case 0: /* create, often with the stem */
            if (!s[i]) {
                CHECK_OK(kvgen_session_create(m, &sd, &s[i], &err));
                if (s[i] && rng_next(&rng) % 2) st = kvgen_session_prefill(s[i], stem, 33 + rng_next(&rng) % 63, NULL, &err);
            }
            break;
        case 1: { /* prefill */
            size_t n = 1 + rng_next(&rng) % 48;
            fill_tokens(toks, n, &rng);
            if (kvgen_session_length(s[i]) + n <= 512) st = kvgen_session_prefill(s[i], toks, n, NULL, &err);
            break;
        }
        case 2: /* decode */
            fill_tokens(toks, 1, &rng);
            if (kvgen_session_length(s[i]) < 512) st = kvgen_session_decode(s[i], toks[0], &err);
            break;
        case 3: { /* fork into a free slot */
            int j = (int)(rng_next(&rng) % MAX);
            if (!s[j]) st = kvgen_session_fork(s[i], &s[j], &err);
            if (st == KVGEN_OK && s[j] && j != i) {
                has[j] = kvgen_session_logits(s[j]) != NULL;
                if (has[j]) memcpy(last[j], kvgen_session_logits(s[j]), (size_t)n_vocab * sizeof(float));
            }
            break;
        }
        case 4: /* rewind */
            st = kvgen_session_rewind(s[i], rng_next(&rng) % (kvgen_session_length(s[i]) + 1), &err);
            break;
        case 5: /* close */
            kvgen_session_close(s[i]);
            s[i] = NULL;
            break;
        }
        CHECKF(st == KVGEN_OK, "step %d op %d: %s", step, op, err.message);
        if (s[i]) {
            has[i] = kvgen_session_logits(s[i]) != NULL;
            if (has[i]) memcpy(last[i], kvgen_session_logits(s[i]), (size_t)n_vocab * sizeof(float));
        }
        for (int j = 0; j < MAX; j++) {
            if (!s[j] || j == i) continue;
            const float *now = kvgen_session_logits(s[j]);
            CHECKF((now != NULL) == has[j] && (!now || memcmp(now, last[j], (size_t)n_vocab * sizeof(float)) == 0),
                   "step %d (op %d on session %d) changed session %d's logits", step, op, i, j);
        }
        if (s[i] && has[i] && step % 10 == 0) {
            double d = diff_to_scratch(s[i]);
            CHECKF(d <= 1e-5, "step %d: session %d (%zu tokens) differs from a recomputation by %g", step, i,
                   kvgen_session_length(s[i]), d);
            checked++;
        }
    }
    /* every live session against a recomputation at the end */
    for (int j = 0; j < MAX; j++)
        if (s[j] && has[j]) {
            CHECKF(diff_to_scratch(s[j]) <= 1e-5, "end: session %d differs from a recomputation", j);
            checked++;
        }
    printf("interleaving: %d steps (create %d, prefill %d, decode %d, fork %d, rewind %d, close %d), %d checked "
           "against recomputation\n", STEPS, ops[0], ops[1], ops[2], ops[3], ops[4], ops[5], checked);
    for (int j = 0; j < MAX; j++) {
        kvgen_session_close(s[j]);
        free(last[j]);
    }
    kvgen_pool_info pi;
    kvgen_model_pool_info(m, &pi);
    CHECK(pi.pages_used == 0);
}

/* A pool of 8 pages of 32 tokens. */
static void test_exhaustion(const char *path) {
    kvgen_model_desc small = {.kv_pool_tokens = 256};
    kvgen_model *m = load(path, &small);
    if (!m) return;
    kvgen_error err = {0};
    uint64_t rng = 7;
    int32_t t[300];
    fill_tokens(t, 300, &rng);
    kvgen_session *a = NULL, *b = NULL, *c = NULL;
    kvgen_session_desc sd = {.n_ctx = 512, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(m, &sd, &a, &err));
    CHECK_OK(kvgen_session_create(m, &sd, &b, &err));
    CHECK_OK(kvgen_session_prefill(a, t, 160, NULL, &err)); /* 5 pages */
    CHECK_OK(kvgen_session_prefill(b, t + 160, 10, NULL, &err)); /* 1 page */
    float *before = malloc((size_t)n_vocab * sizeof(float));
    memcpy(before, kvgen_session_logits(b), (size_t)n_vocab * sizeof(float));
    /* b needs 4 more pages, 2 are left */
    CHECK(kvgen_session_prefill(b, t, 120, NULL, &err) == KVGEN_E_POOL_FULL);
    CHECKF(strstr(err.message, "KV pool full") != NULL, "%s", err.message);
    CHECK(kvgen_session_length(b) == 10 && max_diff(before, kvgen_session_logits(b)) == 0);
    kvgen_pool_info pi;
    kvgen_model_pool_info(m, &pi);
    CHECKF(pi.pages_used == 6 && pi.pages_free == 2, "used %zu free %zu after the refusal", pi.pages_used,
           pi.pages_free);
    /* both keep working */
    CHECK_OK(kvgen_session_decode(a, t[200], &err));
    CHECK(diff_to_scratch(a) <= 1e-5);
    CHECK_OK(kvgen_session_prefill(b, t, 40, NULL, &err));
    CHECK(diff_to_scratch(b) <= 1e-5);
    /* a fork of a partly filled page needs one page: none left */
    kvgen_model_pool_info(m, &pi);
    CHECK(pi.pages_free == 0);
    CHECK(kvgen_session_fork(a, &c, &err) == KVGEN_E_POOL_FULL && c == NULL);
    kvgen_model_pool_info(m, &pi);
    CHECK(pi.pages_free == 0 && pi.sessions == 2);
    /* closing frees: now it fits */
    kvgen_session_close(b);
    CHECK_OK(kvgen_session_fork(a, &c, &err));
    if (c) {
        CHECK_OK(kvgen_session_decode(c, t[3], &err));
        CHECK(diff_to_scratch(c) <= 1e-5);
    }
    free(before);
    kvgen_session_close(c);
    kvgen_session_close(a);
    kvgen_model_unload(m);
}

int main(void) {
    char *path = tu_make_model("session_pool.gguf", "--seed 41 --layers 2 --embd 64 --ff 96 --heads 4 --kv-heads 2 "
                                                    "--ctx 2048");
    CHECK(path != NULL);
    if (!path) return tu_finish("test_session_pool");
    kvgen_model *m = load(path, NULL);
    oracle = load(path, NULL);
    if (m && oracle) {
        kvgen_model_info info;
        kvgen_model_get_info(m, &info);
        n_vocab = info.n_vocab;
        test_forked_npcs(m);
        test_interleaving(m);
        test_exhaustion(path);
    }
    kvgen_model_unload(m);
    kvgen_model_unload(oracle);
    free(path);
    return tu_finish("test_session_pool");
}
