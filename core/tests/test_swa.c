/* test_swa.c: sliding-window layers release their KV pages.
 *
 * A random-weight gemma3 file (5 local layers with a window of 16, one global; pages of 16)
 * on the reference, cpu and (where there is a device) Vulkan backends. A session past its window must hold the global
 * layers' pages for all its tokens and only the pages the window still sees for the local
 * ones (the formula of docs/architecture.md, "Sliding-window pages"), and its logits must equal
 * a fresh prefill of the same tokens on a second load (its own pools) after decode, rewind
 * (within and past the released pages), fork, prefix reuse, save/restore and context shift. A
 * model without windows keeps one group. With ./models/gemma-3-270m-q4_k_m.gguf present, a
 * short session past its 512-position window checks the formula on the real file. */
#include <libgen.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "testutil.h"

enum { P = 16, W = 16 };

typedef struct swa_case {
    const char *path;
    kvgen_backend backend;
    double tol; /* logits against the fresh prefill */
    kvgen_model *m, *oracle;
    int n_vocab;
} swa_case;

static kvgen_model *load(const swa_case *c, int page) {
    kvgen_model_desc md = {.path = c->path, .backend = c->backend, .n_threads = 2, .kv_page_size = page};
    return tu_load(&md);
}

/* the logits of s against a fresh prefill of its tokens on the oracle */
static void check_fresh(const swa_case *c, const kvgen_session *s, const char *what) {
    kvgen_error err = {0};
    kvgen_session *o = NULL;
    kvgen_session_desc sd = {.n_ctx = 512, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(c->oracle, &sd, &o, &err));
    if (!o) return;
    size_t n = kvgen_session_length(s);
    CHECK_OK(kvgen_session_prefill(o, kvgen_session_tokens(s), n, NULL, &err));
    double d = tu_max_diff(kvgen_session_logits(s), kvgen_session_logits(o), c->n_vocab);
    CHECKF(d <= c->tol, "%s: logits at length %zu differ from a fresh prefill by %g", what, n, d);
    kvgen_session_close(o);
}

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/* The held bytes of a session of n tokens: every page of the global layers, and of the local
 * ones page i stays while (i + 1) * P > n + 1 - W (a query at n sees [n - W + 1, n]). */
static size_t expected_held(const kvgen_pool_info *pi, size_t n) {
    size_t pages = ceil_div(n, pi->page_size);
    size_t gone = n + 1 > pi->window ? (n + 1 - pi->window) / pi->page_size : 0;
    return pi->bytes_per_page * pages + pi->window_bytes_per_page * (pages - gone);
}

static void check_held(const kvgen_model *m, const kvgen_session *s, const char *what) {
    kvgen_pool_info pi;
    kvgen_model_pool_info(m, &pi);
    kvgen_cache_info ci;
    kvgen_session_cache_info(s, &ci);
    size_t n = ci.length, want = expected_held(&pi, n);
    CHECKF(ci.bytes_held == want, "%s: %zu tokens hold %zu bytes, the formula says %zu", what, n, ci.bytes_held, want);
    /* the local layers never hold more than the window plus one page */
    CHECKF(ci.window_pages * pi.page_size <= (n < pi.window + pi.page_size ? ceil_div(n, pi.page_size) * pi.page_size
                                                                             : pi.window + pi.page_size),
           "%s: %zu local pages at length %zu", what, ci.window_pages, n);
}

static void decode_n(kvgen_session *s, const int32_t *t, size_t n) {
    kvgen_error err = {0};
    for (size_t i = 0; i < n; i++) CHECK_OK(kvgen_session_decode(s, t[i], &err));
}

static void run_case(swa_case *c, bool groups) {
    kvgen_error err = {0};
    c->m = load(c, P);
    c->oracle = load(c, 0);
    if (!c->m || !c->oracle) goto done;
    c->n_vocab = tu_vocab(c->m);
    kvgen_pool_info pi;
    kvgen_model_pool_info(c->m, &pi);
    if (groups) {
        CHECKF(pi.window == W && pi.window_bytes_per_page > 0 && pi.bytes_per_page > 0,
               "pool: window %zu, %zu + %zu bytes a page", pi.window, pi.bytes_per_page, pi.window_bytes_per_page);
        /* 5 local layers of 6: the two pools split one page of every layer */
        CHECK(pi.bytes_per_page + pi.window_bytes_per_page == P * pi.bytes_per_token);
        CHECK(pi.window_bytes_per_page == 5 * pi.bytes_per_page);
    } else {
        CHECK(pi.window == 0 && pi.window_bytes_per_page == 0);
    }

    int32_t t[300];
    tu_fill_tokens(t, 300, 7, c->n_vocab);
    kvgen_session_desc sd = {.n_ctx = 512};
    kvgen_session *s = NULL, *f = NULL;
    CHECK_OK(kvgen_session_create(c->m, &sd, &s, &err));
    if (!s) goto done;

    /* decode past the window, a prefill on top: logits and held memory at each step */
    CHECK_OK(kvgen_session_prefill(s, t, 5, NULL, &err));
    for (size_t i = 5; i < 70; i++) {
        CHECK_OK(kvgen_session_decode(s, t[i], &err));
        if (groups) check_held(c->m, s, "decode");
        if (i % 13 == 0) check_fresh(c, s, "decode past the window");
    }
    CHECK_OK(kvgen_session_prefill(s, t + 70, 40, NULL, &err));
    check_fresh(c, s, "prefill past the window");
    if (groups) {
        check_held(c->m, s, "prefill");
        kvgen_cache_info ci;
        kvgen_session_cache_info(s, &ci);
        CHECKF(ci.window == W && ci.window_pages < ci.pages, "window %zu: %zu of %zu pages", ci.window,
               ci.window_pages, ci.pages);
        kvgen_pool_info now;
        kvgen_model_pool_info(c->m, &now);
        CHECKF(now.bytes_used == ci.bytes_held, "pool uses %zu bytes, the one session holds %zu", now.bytes_used,
               ci.bytes_held);
    }

    /* rewind within what the window still holds (one token), then past it (the refill) */
    CHECK_OK(kvgen_session_rewind(s, 1, &err));
    check_fresh(c, s, "rewind by one");
    CHECK_OK(kvgen_session_rewind(s, 40, &err));
    CHECK(kvgen_session_length(s) == 69);
    check_fresh(c, s, "rewind past the released pages");
    if (groups) check_held(c->m, s, "rewind");
    decode_n(s, t + 200, 20);
    check_fresh(c, s, "decode after the rewind");

    /* fork: both go their own way past the window */
    CHECK_OK(kvgen_session_fork(s, &f, &err));
    if (f) {
        decode_n(f, t + 230, 25);
        decode_n(s, t + 260, 25);
        check_fresh(c, f, "fork: child");
        check_fresh(c, s, "fork: parent");
        if (groups) check_held(c->m, f, "fork: child");
        kvgen_session_close(f);
    }

    /* save/restore round-trips the windowed session; both continue alike */
    char *file = tu_tmpfile("swa.kvs");
    CHECK_OK(kvgen_session_save(s, file, &err));
    kvgen_session *r = NULL;
    CHECK_OK(kvgen_session_restore(c->m, file, &r, &err));
    if (r) {
        CHECK(kvgen_session_length(r) == kvgen_session_length(s));
        CHECK(tu_max_diff(kvgen_session_logits(r), kvgen_session_logits(s), c->n_vocab) == 0.0);
        if (groups) check_held(c->m, r, "restored");
        decode_n(r, t + 100, 20);
        check_fresh(c, r, "restored, then decoded");
        kvgen_session_close(r);
    }
    free(file);

    /* prefix reuse: a new session takes the published pages of both groups back */
    kvgen_session *a = NULL, *b = NULL;
    CHECK_OK(kvgen_session_create(c->m, &sd, &a, &err));
    CHECK_OK(kvgen_session_create(c->m, &sd, &b, &err));
    if (a && b) {
        CHECK_OK(kvgen_session_prefill(a, t, 100, NULL, &err));
        kvgen_session_close(a);
        a = NULL;
        CHECK_OK(kvgen_session_prefill(b, t, 110, NULL, &err));
        kvgen_cache_info ci;
        kvgen_session_cache_info(b, &ci);
        CHECKF(ci.tokens_reused >= 64, "prefix reuse: %zu tokens reused", ci.tokens_reused);
        check_fresh(c, b, "prefix reuse");
        if (groups) check_held(c->m, b, "prefix reuse");
    }
    kvgen_session_close(a);
    kvgen_session_close(b);

    /* context shift: the kept tokens, as a fresh prefill gives them */
    kvgen_session *h = NULL;
    kvgen_session_desc shd = {.n_ctx = 64, .on_full = KVGEN_ON_FULL_SHIFT, .keep = 4};
    CHECK_OK(kvgen_session_create(c->m, &shd, &h, &err));
    if (h) {
        decode_n(h, t, 100);
        kvgen_cache_info ci;
        kvgen_session_cache_info(h, &ci);
        CHECKF(ci.shifts >= 1 && ci.length <= 64, "shift: %zu shifts, length %zu", ci.shifts, ci.length);
        if (groups) {
            check_fresh(c, h, "after a context shift"); /* the kept tokens ran again */
            check_held(c->m, h, "after a context shift");
        }
        kvgen_session_close(h);
    }
    kvgen_session_close(s);
done:
    kvgen_model_unload(c->m);
    kvgen_model_unload(c->oracle);
}

static void vulkan_body(void *arg) {
    swa_case c = {.path = arg, .backend = KVGEN_BACKEND_VULKAN, .tol = 2e-3};
    run_case(&c, true);
}

/* One long prefill on a fresh pool: it runs in pieces of the window, so the local layers never
 * commit more than a few pages (released pages go back free: no prefix cache keeps them). */
static void test_peak(const char *path) {
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 2, .kv_page_size = P};
    kvgen_model *m = tu_load(&md);
    if (!m) return;
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {.n_ctx = 512, .no_prefix_reuse = 1};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    int32_t t[200];
    tu_fill_tokens(t, 200, 5, tu_vocab(m));
    float *all = malloc(200 * (size_t)tu_vocab(m) * sizeof *all);
    CHECK(all != NULL);
    if (s && all) {
        CHECK_OK(kvgen_session_prefill(s, t, 200, all, &err));
        kvgen_pool_info pi;
        kvgen_model_pool_info(m, &pi);
        size_t global = ceil_div(200, P) * pi.bytes_per_page;
        size_t local = (pi.bytes_committed - global) / pi.window_bytes_per_page;
        size_t piece = ceil_div(W, P) * P < 4 * P ? 4 * P : ceil_div(W, P) * P; /* session.c's pieces */
        CHECKF(pi.bytes_committed >= global && local <= (W + piece) / P + 2 && local < ceil_div(200, P),
               "a 200-token prefill committed %zu local pages (window %d, pages of %d)", local, W, P);
        check_held(m, s, "one long prefill");
        /* the pieces' logits are the ones a prefill in one go gives: the last against a fresh run,
         * an early one against a session of that many tokens */
        kvgen_session *o = NULL;
        CHECK_OK(kvgen_session_create(m, &sd, &o, &err));
        if (o) {
            CHECK_OK(kvgen_session_prefill(o, t, 37, NULL, &err));
            CHECK(tu_max_diff(kvgen_session_logits(o), all + 36 * (size_t)tu_vocab(m), tu_vocab(m)) <= 1e-5);
            kvgen_session_close(o);
        }
    }
    free(all);
    kvgen_session_close(s);
    kvgen_model_unload(m);
}

/* A model without windows: one group, nothing released. */
static void test_plain(const char *path) {
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 2, .kv_page_size = P};
    kvgen_model *m = tu_load(&md);
    if (!m) return;
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {.n_ctx = 256};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    int32_t t[100];
    tu_fill_tokens(t, 100, 3, tu_vocab(m));
    if (s) CHECK_OK(kvgen_session_prefill(s, t, 100, NULL, &err));
    kvgen_pool_info pi;
    kvgen_model_pool_info(m, &pi);
    kvgen_cache_info ci;
    kvgen_session_cache_info(s, &ci);
    CHECK(pi.window == 0 && pi.window_bytes_per_page == 0 && pi.bytes_per_page == P * pi.bytes_per_token);
    CHECK(ci.window == 0 && ci.window_pages == 0 && ci.bytes_held == ci.pages * pi.bytes_per_page && ci.pages == 7);
    kvgen_session_close(s);
    kvgen_model_unload(m);
}

/* The real Gemma 3 file, past its 512-position window on the cpu backend. */
static void test_real_gemma(void) {
    const char *dflt = getenv("KVGEN_DEFAULT_MODEL");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", dflt ? dflt : "models/x");
    char path[4200];
    snprintf(path, sizeof path, "%s/gemma-3-270m-q4_k_m.gguf", dirname(dir));
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("%s is absent: the real Gemma 3 window check did not run\n", path);
        return;
    }
    fclose(f);
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_CPU, .n_threads = 2, .kv_page_size = 32};
    kvgen_model *m = tu_load(&md);
    if (!m) return;
    kvgen_pool_info pi;
    kvgen_model_pool_info(m, &pi);
    CHECKF(pi.window == 512, "gemma-3-270m: window %zu", pi.window);
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    kvgen_session_desc sd = {.n_ctx = 1024};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    int32_t t[620];
    tu_fill_tokens(t, 620, 11, tu_vocab(m));
    if (s) {
        CHECK_OK(kvgen_session_prefill(s, t, 600, NULL, &err));
        check_held(m, s, "gemma-3-270m, 600 tokens");
        decode_n(s, t + 600, 20);
        check_held(m, s, "gemma-3-270m, 620 tokens");
        kvgen_cache_info ci;
        kvgen_session_cache_info(s, &ci);
        printf("gemma-3-270m at %zu tokens: %zu bytes held (%zu local pages of %zu), all layers would be %zu\n",
               ci.length, ci.bytes_held, ci.window_pages, ci.pages, ci.pages * pi.page_size * ci.bytes_per_token);
    }
    kvgen_session_close(s);
    kvgen_model_unload(m);
}

int main(void) {
    char *g3 = tu_make_model("swa-gemma3.gguf", "--arch gemma3 --qk-norm --post-norms --swa 16 --layers 6 --embd 64 "
                                                "--heads 4 --kv-heads 2 --head-dim 16 --ff 96 --ctx 1024 --seed 31");
    char *llama = tu_make_model("swa-llama.gguf", "--layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --seed 32");
    CHECK(g3 && llama);
    if (g3) {
        swa_case ref = {.path = g3, .backend = KVGEN_BACKEND_REFERENCE, .tol = 1e-5};
        run_case(&ref, true);
        swa_case cpu = {.path = g3, .backend = KVGEN_BACKEND_CPU, .tol = 1e-4};
        run_case(&cpu, true);
        tu_vulkan_child("sliding-window sessions", vulkan_body, g3);
    }
    if (g3) test_peak(g3);
    if (llama) test_plain(llama);
    test_real_gemma();
    free(g3);
    free(llama);
    return tu_finish("test_swa");
}
