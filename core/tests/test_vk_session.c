/* test_vk_session.c: paged KV sessions on the Vulkan backend against the CPU reference.
 * Every session operation runs on a pair of sessions, one on a Vulkan model and one on a
 * reference model of the same file (both paged), and after each step their logits must agree
 * within the tolerance of test_vk_model: |vulkan - reference| <= 0.01 * (2 + max|logit|) with
 * the f16 cache, 5x tighter with force_f32. Covered: fork (copy-on-write of the partly filled
 * page, the parent closing first), rewind, prefix reuse, context shift (keys re-rotated on the
 * device by kv_copy.comp, also compared as read back), save/restore (a restored Vulkan session
 * gives the saved session's logits exactly; restored on the reference, within tolerance), pool
 * exhaustion (an error for the session that asked, the others unharmed) and a pool split over
 * several buffers by a small forced maxStorageBufferRange (KVGEN_VK_MAX_PART). With
 * KVGEN_VALIDATE=1 the validation layer must stay silent. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_vk.h"
#include "testutil.h"

static int n_vocab;
static double rel_tol = 0.01;
static kvgen_model *ref; /* the reference model (paged) */

static kvgen_model *load(const char *path, kvgen_backend backend, const kvgen_model_desc *extra) {
    kvgen_model_desc d = {0};
    if (extra) d = *extra;
    d.path = path;
    d.backend = backend;
    d.n_threads = 2;
    return tu_load(&d);
}

/* worst |a - b| in units of the tolerance (<= 1 passes; NaN fails) */
static double excess(const float *a, const float *b) {
    if (!a || !b) return INFINITY;
    double mx = 0, worst = 0;
    for (int i = 0; i < n_vocab; i++) mx = fmax(mx, fabs((double)b[i]));
    double tol = rel_tol * (2 + mx);
    for (int i = 0; i < n_vocab; i++) {
        double d = fabs((double)a[i] - b[i]) / tol;
        if (!(d <= worst)) worst = d;
    }
    return worst;
}

/* a Vulkan session and its reference twin */
typedef struct pair {
    kvgen_session *v, *r;
} pair;

static void check_pair(const pair *p, const char *what) {
    size_t n = kvgen_session_length(p->v);
    CHECKF(n == kvgen_session_length(p->r), "%s: lengths %zu vs %zu", what, n, kvgen_session_length(p->r));
    CHECKF(memcmp(kvgen_session_tokens(p->v), kvgen_session_tokens(p->r), n * sizeof(int32_t)) == 0,
           "%s: token ids differ", what);
    double e = excess(kvgen_session_logits(p->v), kvgen_session_logits(p->r));
    CHECKF(e <= 1, "%s: logits differ from the reference by %.3g x the tolerance", what, e);
}

static pair pair_create(kvgen_model *mv, const kvgen_session_desc *sd) {
    pair p = {0};
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_create(mv, sd, &p.v, &err));
    CHECK_OK(kvgen_session_create(ref, sd, &p.r, &err));
    return p;
}

static void pair_prefill(pair *p, const int32_t *t, size_t n, const char *what) {
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_prefill(p->v, t, n, NULL, &err));
    CHECK_OK(kvgen_session_prefill(p->r, t, n, NULL, &err));
    check_pair(p, what);
}

static void pair_close(pair *p) {
    kvgen_session_close(p->v);
    kvgen_session_close(p->r);
    p->v = p->r = NULL;
}

static void test_fork(kvgen_model *mv) {
    kvgen_error err = {0};
    kvgen_session_desc sd = {.n_ctx = 512};
    pair p = pair_create(mv, &sd), c = {0};
    int32_t t[300];
    tu_fill_tokens(t, 300, 1, n_vocab);
    pair_prefill(&p, t, 100, "fork: parent prompt"); /* 3 full pages of 32 + 4 tokens */
    CHECK_OK(kvgen_session_fork(p.v, &c.v, &err));
    CHECK_OK(kvgen_session_fork(p.r, &c.r, &err));
    if (!c.v || !c.r) return;
    kvgen_cache_info ci;
    kvgen_session_cache_info(c.v, &ci);
    CHECKF(ci.length == 100 && ci.pages == 4 && ci.pages_shared == 3, "fork: child length %zu pages %zu shared %zu",
           ci.length, ci.pages, ci.pages_shared);
    CHECK(memcmp(kvgen_session_logits(p.v), kvgen_session_logits(c.v), (size_t)n_vocab * sizeof(float)) == 0);
    /* they diverge: the child's copy of the partly filled page and the shared full ones */
    pair_prefill(&p, t + 100, 40, "fork: parent after the fork");
    pair_prefill(&c, t + 150, 50, "fork: child after the fork");
    /* fork of the child at a page boundary (150 tokens: no, 150 % 32 != 0; extend to 160) */
    pair_prefill(&c, t + 200, 10, "fork: child to a page boundary");
    pair g = {0};
    CHECK_OK(kvgen_session_fork(c.v, &g.v, &err));
    CHECK_OK(kvgen_session_fork(c.r, &g.r, &err));
    pair_close(&p); /* the parent closes first: the children keep the shared pages */
    if (g.v && g.r) {
        pair_prefill(&g, t + 220, 33, "fork: grandchild");
        pair_close(&g);
    }
    pair_prefill(&c, t + 260, 1, "fork: child after its parent closed");
    pair_close(&c);
}

static void test_rewind(kvgen_model *mv) {
    kvgen_error err = {0};
    kvgen_session_desc sd = {.n_ctx = 512};
    pair p = pair_create(mv, &sd);
    int32_t t[200];
    tu_fill_tokens(t, 200, 2, n_vocab);
    pair_prefill(&p, t, 90, "rewind: prompt");
    CHECK_OK(kvgen_session_rewind(p.v, 30, &err));
    CHECK_OK(kvgen_session_rewind(p.r, 30, &err));
    check_pair(&p, "rewind: 30 tokens");
    pair_prefill(&p, t + 100, 20, "rewind: new tokens after it");
    CHECK_OK(kvgen_session_rewind(p.v, 80, &err));
    CHECK_OK(kvgen_session_rewind(p.r, 80, &err));
    pair_prefill(&p, t + 150, 3, "rewind: across pages");
    pair_close(&p);
}

static void test_prefix_reuse(kvgen_model *mv) {
    kvgen_session_desc sd = {.n_ctx = 512};
    pair a = pair_create(mv, &sd), b = pair_create(mv, &sd);
    int32_t t[120];
    tu_fill_tokens(t, 120, 3, n_vocab);
    pair_prefill(&a, t, 100, "prefix: first session");
    pair_prefill(&b, t, 110, "prefix: second session, same first 100 tokens");
    kvgen_cache_info ci;
    kvgen_session_cache_info(b.v, &ci);
    CHECKF(ci.tokens_reused == 96, "prefix: %zu tokens reused, expected 96 (3 pages)", ci.tokens_reused);
    pair_close(&a);
    pair_close(&b);
}

static void test_shift(kvgen_model *mv) {
    kvgen_error err = {0};
    kvgen_session_desc sd = {.n_ctx = 64, .on_full = KVGEN_ON_FULL_SHIFT, .keep = 8};
    pair p = pair_create(mv, &sd);
    int32_t t[200];
    tu_fill_tokens(t, 200, 4, n_vocab);
    pair_prefill(&p, t, 64, "shift: full context");
    for (int i = 0; i < 80; i++) {
        CHECK_OK(kvgen_session_decode(p.v, t[64 + i], &err));
        CHECK_OK(kvgen_session_decode(p.r, t[64 + i], &err));
        check_pair(&p, "shift: decode past the context");
    }
    kvgen_cache_info ci;
    kvgen_session_cache_info(p.v, &ci);
    CHECKF(ci.shifts >= 3, "shift: %zu shifts", ci.shifts);
    /* the re-rotated keys as read back */
    size_t nf = (size_t)ci.n_head_kv * ci.length * (size_t)ci.head_dim;
    float *a = malloc(nf * sizeof *a), *b = malloc(nf * sizeof *b);
    for (int which = 0; a && b && which < 2; which++) {
        CHECK_OK(kvgen_session_read_cache(p.v, ci.n_layer - 1, which, a, nf, &err));
        CHECK_OK(kvgen_session_read_cache(p.r, ci.n_layer - 1, which, b, nf, &err));
        double mx = 0, d = 0;
        for (size_t i = 0; i < nf; i++) {
            mx = fmax(mx, fabs((double)b[i]));
            d = fmax(d, fabs((double)a[i] - b[i]));
        }
        CHECKF(d <= rel_tol * 0.5 * (2 + mx), "shift: last layer's %s differs by %g (max %g)", which ? "V" : "K", d,
               mx);
    }
    free(a);
    free(b);
    pair_close(&p);
}

static void test_save_restore(kvgen_model *mv) {
    kvgen_error err = {0};
    kvgen_session_desc sd = {.n_ctx = 256, .temperature = 0.8f, .seed = 9};
    pair p = pair_create(mv, &sd);
    int32_t t[100];
    tu_fill_tokens(t, 100, 5, n_vocab);
    pair_prefill(&p, t, 70, "save: prompt");
    char *path = tu_tmpfile("vk_session.kvs");
    CHECK_OK(kvgen_session_save(p.v, path, &err));
    kvgen_session *back = NULL, *on_ref = NULL;
    CHECK_OK(kvgen_session_restore(mv, path, &back, &err));
    CHECK_OK(kvgen_session_restore(ref, path, &on_ref, &err));
    if (back && on_ref) {
        CHECK(kvgen_session_length(back) == 70);
        CHECK(memcmp(kvgen_session_logits(back), kvgen_session_logits(p.v), (size_t)n_vocab * sizeof(float)) == 0);
        /* the K/V came back exactly: the next step is the same computation */
        CHECK_OK(kvgen_session_decode(back, t[70], &err));
        CHECK_OK(kvgen_session_decode(p.v, t[70], &err));
        CHECK_OK(kvgen_session_decode(p.r, t[70], &err));
        CHECK_OK(kvgen_session_decode(on_ref, t[70], &err));
        CHECK(memcmp(kvgen_session_logits(back), kvgen_session_logits(p.v), (size_t)n_vocab * sizeof(float)) == 0);
        pair x = {back, on_ref};
        check_pair(&x, "restore: on the reference from a Vulkan file");
        check_pair(&p, "save: after the save");
    }
    kvgen_session_close(back);
    kvgen_session_close(on_ref);
    pair_close(&p);
    free(path);
}

/* a pool of 4 pages: the second session's prompt does not fit; the first keeps working */
static void test_exhaustion(const char *path) {
    kvgen_model_desc d = {.kv_pool_tokens = 128};
    kvgen_model *mv = load(path, KVGEN_BACKEND_VULKAN, &d);
    if (!mv) return;
    kvgen_error err = {0};
    kvgen_session_desc sd = {.n_ctx = 256, .no_prefix_reuse = 1};
    pair a = pair_create(mv, &sd);
    int32_t t[100];
    tu_fill_tokens(t, 100, 6, n_vocab);
    pair_prefill(&a, t, 70, "exhaustion: first session");
    kvgen_session *b = NULL;
    CHECK_OK(kvgen_session_create(mv, &sd, &b, &err));
    kvgen_status st = kvgen_session_prefill(b, t + 10, 70, NULL, &err);
    CHECKF(st == KVGEN_E_POOL_FULL, "exhaustion: second prompt gave %s", kvgen_status_name(st));
    CHECK(kvgen_session_length(b) == 0);
    CHECK_OK(kvgen_session_prefill(b, t + 10, 20, NULL, &err)); /* one page still fits */
    pair_prefill(&a, t + 70, 5, "exhaustion: first session goes on");
    kvgen_session_close(b);
    pair_close(&a);
    CHECK(kvg_vk_validation_count(kvg_vk_model_ctx(mv)) == 0);
    kvgen_model_unload(mv);
}

/* every slab holds 2 pages: a pool of 16 pages spans all 8 buffers, one of 20 is refused */
static void test_slabs(const char *path) {
    kvgen_model_desc d = {.path = path, .backend = KVGEN_BACKEND_VULKAN, .n_threads = 2, .kv_pool_tokens = 16 * 32};
    if (!tu_two_page_slabs(&d)) return;
    kvgen_model *mv = tu_load(&d);
    if (mv) {
        kvgen_pool_info pi;
        kvgen_model_pool_info(mv, &pi);
        CHECK(pi.pages_total == 16);
        test_fork(mv);
        test_shift(mv);
        CHECK(kvg_vk_validation_count(kvg_vk_model_ctx(mv)) == 0);
        kvgen_model_unload(mv);
    }
    kvgen_model_desc big = {.kv_pool_tokens = 20 * 32};
    kvgen_model_desc bd = big;
    bd.path = path;
    bd.backend = KVGEN_BACKEND_VULKAN;
    kvgen_model *m2 = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvgen_model_load(&bd, &m2, &err);
    CHECKF(st == KVGEN_E_UNSUPPORTED && strstr(err.message, "maxStorageBufferRange"),
           "a pool beyond 8 slabs: %s (%s)", kvgen_status_name(st), err.message);
    kvgen_model_unload(m2);
    unsetenv("KVGEN_VK_MAX_PART");
}

static void run_all(const char *path, int force_f32) {
    kvgen_model_desc d = {.force_f32 = force_f32};
    kvgen_model *mv = load(path, KVGEN_BACKEND_VULKAN, &d);
    if (!mv) return;
    rel_tol = force_f32 ? 0.002 : 0.01;
    test_fork(mv);
    test_rewind(mv);
    test_prefix_reuse(mv);
    test_shift(mv);
    test_save_restore(mv);
    kvgen_pool_info pi;
    kvgen_model_pool_info(mv, &pi);
    CHECK(pi.page_size == 32 && pi.pages_total > 0 && pi.bytes_per_token > 0);
    printf("vulkan pool (%s): %zu pages of %zu tokens, %zu bytes per token, %zu bytes in all\n",
           force_f32 ? "f32" : "f16", pi.pages_total, pi.page_size, pi.bytes_per_token, pi.bytes_total);
    CHECK(kvg_vk_validation_count(kvg_vk_model_ctx(mv)) == 0);
    kvgen_model_unload(mv);
}

int main(void) {
    int n_dev = 0;
    kvgen_error derr = {0};
    if (kvgen_devices(NULL, 0, &n_dev, &derr) != KVGEN_OK || n_dev == 0) tu_skip("no Vulkan device");
    char *path = tu_make_model("vk_session.gguf", "--type Q8_0 --seed 21 --embd 96 --heads 6 --kv-heads 2 --ff 160 "
                                                  "--layers 3");
    CHECK(path != NULL);
    if (!path) return tu_finish("test_vk_session");
    ref = load(path, KVGEN_BACKEND_REFERENCE, NULL);
    if (ref) {
        kvgen_model_info info;
        kvgen_model_get_info(ref, &info);
        n_vocab = info.n_vocab;
        run_all(path, 0);
        run_all(path, 1);
        rel_tol = 0.01;
        test_exhaustion(path);
        test_slabs(path);
        kvgen_model_unload(ref);
    }
    free(path);
    return tu_finish("test_vk_session");
}
