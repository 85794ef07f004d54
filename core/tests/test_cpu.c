/* test_cpu.c: the CPU backends' shared helpers (kvg_cpu.h).
 * - Thread pool: a parallel-for over [0, n) hands every index to exactly one call, on a thread
 *   id in [0, threads), for 1..8 threads and sizes around the chunking's edges; per-item
 *   results are bit-identical whatever the thread count; jobs submitted from several threads
 *   at once are all run completely; the thread count follows kvg_cpu_threads.
 * - Host pages, of f32 and of f16 elements: commit bounds, write/read round trips through a
 *   page table spanning pages (exact for values a half holds), copy (plain: the same bytes;
 *   with a RoPE delta: K re-rotated exactly as kvg_ref_rope does in f32, then stored in the
 *   pages' type; V untouched), overlapping moves towards the start of one table; f16 pages
 *   round to nearest even and saturate at +-65504, f32 pages keep every bit. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include "kvg_cpu.h"
#include "kvg_reference.h"
#include "testutil.h"

/* ---- thread pool ---- */

typedef struct cover_job {
    atomic_int *hits;   /* per item */
    float *out;         /* per item: a result that depends on the item only */
    int n_threads;
    atomic_int bad_tid, bad_range;
} cover_job;

/* a float computation whose rounding depends on the order of its terms: any split of one
 * item's work across threads would show */
static float item_value(int item) {
    float s = 0.0f;
    for (int k = 1; k <= 64; k++) s += sinf((float)item * 0.37f + (float)k) / (float)k;
    return s;
}

static void cover_fn(void *ctx, int begin, int end, int tid) {
    cover_job *j = ctx;
    if (tid < 0 || tid >= j->n_threads) atomic_fetch_add(&j->bad_tid, 1);
    if (begin >= end) atomic_fetch_add(&j->bad_range, 1);
    for (int i = begin; i < end; i++) {
        atomic_fetch_add(&j->hits[i], 1);
        j->out[i] = item_value(i);
    }
}

static void test_pool_coverage(void) {
    const int sizes[] = {0, 1, 2, 7, 8, 63, 64, 65, 511, 1000, 4099, 100003};
    const int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
    int max_n = sizes[n_sizes - 1];
    float *first = malloc((size_t)max_n * sizeof *first);
    float *out = malloc((size_t)max_n * sizeof *out);
    atomic_int *hits = malloc((size_t)max_n * sizeof *hits);
    CHECK(first && out && hits);
    if (!first || !out || !hits) goto done;
    for (int i = 0; i < max_n; i++) first[i] = item_value(i);
    for (int threads = 1; threads <= 8; threads++) {
        kvgen_error err = {0};
        kvg_cpu_pool *p = NULL;
        CHECKF(kvg_cpu_pool_create(threads, "test", &p, &err) == KVGEN_OK, "%d threads: %s", threads, err.message);
        if (!p) continue;
        CHECK(kvg_cpu_pool_threads(p) == threads);
        for (int si = 0; si < n_sizes; si++) {
            int n = sizes[si];
            for (int rep = 0; rep < 3; rep++) { /* the pool is reused: generations must not mix */
                for (int i = 0; i < n; i++) atomic_init(&hits[i], 0);
                memset(out, 0, (size_t)max_n * sizeof *out);
                cover_job j = {.hits = hits, .out = out, .n_threads = threads};
                atomic_init(&j.bad_tid, 0);
                atomic_init(&j.bad_range, 0);
                kvg_cpu_pool_run(p, n, cover_fn, &j);
                int missed = 0, twice = 0, differ = 0;
                for (int i = 0; i < n; i++) {
                    int h = atomic_load(&hits[i]);
                    missed += h == 0;
                    twice += h > 1;
                    differ += memcmp(&out[i], &first[i], sizeof(float)) != 0;
                }
                CHECKF(!missed && !twice && !differ, "%d threads, %d items: %d missed, %d twice, %d differ", threads, n,
                       missed, twice, differ);
                CHECKF(atomic_load(&j.bad_tid) == 0 && atomic_load(&j.bad_range) == 0,
                       "%d threads, %d items: bad thread ids or empty ranges", threads, n);
            }
        }
        kvg_cpu_pool_destroy(p);
    }
    kvg_cpu_pool_destroy(NULL);
done:
    free(first);
    free(out);
    free(hits);
}

/* several host threads (sessions on different threads) submitting to one pool at once */
typedef struct submitter {
    kvg_cpu_pool *pool;
    int n, rounds, failures;
} submitter;

static void *submit_main(void *arg) {
    submitter *s = arg;
    atomic_int *hits = malloc((size_t)s->n * sizeof *hits);
    float *out = malloc((size_t)s->n * sizeof *out);
    if (!hits || !out) {
        s->failures++;
        free(hits);
        free(out);
        return NULL;
    }
    for (int r = 0; r < s->rounds; r++) {
        for (int i = 0; i < s->n; i++) atomic_init(&hits[i], 0);
        cover_job j = {.hits = hits, .out = out, .n_threads = kvg_cpu_pool_threads(s->pool)};
        atomic_init(&j.bad_tid, 0);
        atomic_init(&j.bad_range, 0);
        kvg_cpu_pool_run(s->pool, s->n, cover_fn, &j);
        for (int i = 0; i < s->n; i++) s->failures += atomic_load(&hits[i]) != 1;
        s->failures += atomic_load(&j.bad_tid) + atomic_load(&j.bad_range);
    }
    free(hits);
    free(out);
    return NULL;
}

static void test_pool_concurrent(void) {
    kvgen_error err = {0};
    kvg_cpu_pool *p = NULL;
    CHECK(kvg_cpu_pool_create(3, "test", &p, &err) == KVGEN_OK);
    if (!p) return;
    enum { N_SUB = 4 };
    pthread_t th[N_SUB];
    submitter sub[N_SUB];
    int started = 0;
    for (int i = 0; i < N_SUB; i++) {
        sub[i] = (submitter){.pool = p, .n = 300 + 97 * i, .rounds = 40};
        if (pthread_create(&th[i], NULL, submit_main, &sub[i]) == 0) started++;
        else break;
    }
    CHECK(started == N_SUB);
    int failures = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        failures += sub[i].failures;
    }
    CHECKF(failures == 0, "%d items missed or repeated with %d submitting threads", failures, started);
    kvg_cpu_pool_destroy(p);
}

static void test_thread_count(void) {
    CHECK(kvg_cpu_threads(1) == 1 && kvg_cpu_threads(5) == 5);
    CHECK(kvg_cpu_threads(100000) == KVG_CPU_MAX_THREADS);
    int all = kvg_cpu_threads(0);
    CHECK(all >= 1 && all <= KVG_CPU_MAX_THREADS && kvg_cpu_threads(-3) == all);
    kvgen_error err = {0};
    kvg_cpu_pool *p = NULL;
    CHECK(kvg_cpu_pool_create(0, NULL, &p, &err) == KVGEN_OK && kvg_cpu_pool_threads(p) == all);
    kvg_cpu_pool_destroy(p);
}

/* ---- host pages ---- */

static int same_floats(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

static const char *type_name(kvg_cpu_kv_type type) { return kvg_type_name(type); }

/* the block types keep an approximation of what they are given */
static int exact_type(kvg_cpu_kv_type type) { return type == KVG_TYPE_F32 || type == KVG_TYPE_F16; }

/* the head_dim elements at (l, which, h, p) of table t as f32 */
static void row_f32(const kvg_cpu_pages *pg, const int32_t *t, int l, int which, int h, int p, float *out) {
    kvg_cpu_kv_to_f32(pg->type, kvg_cpu_pages_at(pg, t, l, which, h, p), out, (size_t)pg->hp.head_dim);
}

/* the stored bytes of two rows are the same */
static int same_rows(const kvg_cpu_pages *pg, const void *x, const void *y) {
    return memcmp(x, y, pg->row_bytes) == 0;
}

/* a row of the pages' type holds what its quantizer makes of `in`: want, as f32 */
static void stored_f32(kvg_cpu_kv_type type, const float *in, float *want, size_t n) {
    unsigned char bytes[64 * 4];
    kvg_cpu_kv_from_f32(type, in, bytes, n);
    kvg_cpu_kv_to_f32(type, bytes, want, n);
}

static void test_pages(kvg_cpu_kv_type type, int head_dim) {
    const char *tn = type_name(type);
    kvg_hparams hp = {.n_layer = 2, .n_embd = 32, .n_ff = 64, .n_head = 4, .n_head_kv = 2, .head_dim = head_dim,
                      .n_rot = 8, .n_ctx_train = 256, .n_vocab = 100, .rope_freq_base = 10000.0f,
                      .rms_norm_eps = 1e-5f};
    size_t rb = kvg_cpu_kv_row_bytes(type, (size_t)head_dim);
    size_t want_rb = type == KVG_TYPE_F32    ? 4 * (size_t)head_dim
                     : type == KVG_TYPE_F16  ? 2 * (size_t)head_dim
                     : type == KVG_TYPE_Q8_0 ? 34 * (size_t)head_dim / 32
                                             : 18 * (size_t)head_dim / 32;
    CHECKF(rb == want_rb, "%s: a row of %d is %zu bytes", tn, head_dim, rb);
    CHECK(kvg_cpu_kv_bytes_per_token(&hp, type) == 2 * 2 * 2 * rb);
    size_t dflt = kvg_cpu_default_pool_bytes(&hp, type);
    CHECK(dflt > 0 && dflt <= 16 * 256 * kvg_cpu_kv_bytes_per_token(&hp, type));

    const int P = 4, n_pages = 8;
    kvgen_error err = {0};
    kvg_cpu_pages pg;
    /* one group of both layers */
    int group[2] = {0, 0}, slot[2] = {0, 1}, layers[2] = {0, 1};
    kvg_kv_layout kv = {.n_groups = 1, .n_layers = {2, 0}, .group = group, .slot = slot, .layers = {layers, NULL}};
    CHECK(kvg_cpu_pages_init(&pg, &hp, NULL, &kv, 0, P, 0, type, "test pages", &err) != KVGEN_OK);
    kvg_cpu_pages_free(&pg);
    CHECK(kvg_cpu_pages_init(&pg, &hp, NULL, &kv, 0, P, n_pages, type, "test pages", &err) == KVGEN_OK);
    CHECK(pg.type == type && pg.row_bytes == rb);
    CHECK(kvg_cpu_pages_commit(&pg, -1, &err) == KVGEN_E_INTERNAL && strstr(err.message, "test pages"));
    CHECK(kvg_cpu_pages_commit(&pg, n_pages, &err) == KVGEN_E_INTERNAL);
    for (int32_t i = 0; i < n_pages; i++) CHECK(kvg_cpu_pages_commit(&pg, i, &err) == KVGEN_OK);
    unsigned char *before = pg.data[3];
    CHECK(kvg_cpu_pages_commit(&pg, 3, &err) == KVGEN_OK && pg.data[3] == before); /* kept */
    /* rows are head_dim elements of the type apart */
    const int32_t one[1] = {0};
    CHECK((unsigned char *)kvg_cpu_pages_at(&pg, one, 0, 0, 0, 1) - (unsigned char *)kvg_cpu_pages_at(&pg, one, 0, 0, 0, 0) ==
          (ptrdiff_t)rb);

    /* two tables of 3 pages each, deliberately out of order: 12 positions apiece */
    const int32_t a[3] = {5, 0, 6}, b[3] = {2, 7, 1};
    const int n = 12, Hkv = hp.n_head_kv, hd = hp.head_dim;
    size_t per = (size_t)Hkv * n * hd;
    float *in = malloc(per * sizeof *in), *got = malloc(per * sizeof *got);
    float row[64], k[64], held[64];
    unsigned char want[64 * 4];
    CHECK(in && got);
    if (!in || !got) goto done;
    for (int l = 0; l < hp.n_layer; l++)
        for (int which = 0; which < 2; which++) {
            /* distinct values, exact in f16 too (below 256 in steps of 1/4) */
            for (size_t i = 0; i < per; i++) in[i] = (float)(l * 64 + which * 32) + (float)i * 0.25f;
            CHECK(kvg_cpu_pages_write(&pg, a, l, which, 0, n, in, &err) == KVGEN_OK);
            CHECK(kvg_cpu_pages_read(&pg, a, l, which, 0, n, got, &err) == KVGEN_OK);
            CHECKF(!exact_type(type) || same_floats(in, got, per), "%s layer %d which %d: write/read round trip", tn, l,
                   which);
            /* element (h, p) lives where kvg_cpu_pages_at says, as the type's quantizer left it
             * (within half a step of the block's scale: amax / 127 for q8_0, amax / 8 for q4_0) */
            for (int h = 0; h < Hkv; h++)
                for (int p = 0; p < n; p++) {
                    const float *src = in + ((size_t)h * n + p) * hd;
                    row_f32(&pg, a, l, which, h, p, row);
                    stored_f32(type, src, held, (size_t)hd);
                    CHECK(same_floats(row, held, (size_t)hd));
                    CHECK(same_floats(got + ((size_t)h * n + p) * hd, held, (size_t)hd));
                    for (int b = 0; b < hd; b += 32 < hd ? 32 : hd) {
                        int bn = 32 < hd ? 32 : hd;
                        float amax = 0.0f, err_max = 0.0f;
                        for (int i = b; i < b + bn; i++) {
                            amax = fmaxf(amax, fabsf(src[i]));
                            err_max = fmaxf(err_max, fabsf(row[i] - src[i]));
                        }
                        float step = type == KVG_TYPE_Q8_0 ? amax / 127.0f : type == KVG_TYPE_Q4_0 ? amax / 8.0f : 0.0f;
                        CHECKF(err_max <= 0.5f * step * 1.01f + amax * 0x1p-10f, "%s: block error %g, step %g", tn,
                               (double)err_max, (double)step);
                    }
                }
        }
    /* a partial read at an offset */
    CHECK(kvg_cpu_pages_read(&pg, a, 1, 1, 5, 3, got, &err) == KVGEN_OK);
    for (int h = 0; h < Hkv; h++)
        for (int i = 0; i < 3; i++) {
            row_f32(&pg, a, 1, 1, h, 5 + i, row);
            CHECK(same_floats(got + ((size_t)h * 3 + i) * hd, row, (size_t)hd));
        }

    /* plain copy a[2..10) -> b[1..9): the same bytes */
    CHECK(kvg_cpu_pages_copy(&pg, a, 2, b, 1, 8, 0, &err) == KVGEN_OK);
    for (int l = 0; l < hp.n_layer; l++)
        for (int which = 0; which < 2; which++)
            for (int h = 0; h < Hkv; h++)
                for (int i = 0; i < 8; i++)
                    CHECK(same_rows(&pg, kvg_cpu_pages_at(&pg, b, l, which, h, 1 + i),
                                    kvg_cpu_pages_at(&pg, a, l, which, h, 2 + i)));

    /* copy with a RoPE delta: K is re-rotated exactly as kvg_ref_rope does it on the key in f32,
     * then stored in the pages' type (rounded once, for f16); V is copied as it is */
    for (int l = 0; l < hp.n_layer; l++) /* keys that do not stay exact when rotated */
        for (size_t i = 0; i < per; i++) in[i] = sinf((float)(l * 1000 + (int)i) * 0.37f) * 3.0f;
    for (int l = 0; l < hp.n_layer; l++) CHECK(kvg_cpu_pages_write(&pg, a, l, 0, 0, n, in, &err) == KVGEN_OK);
    CHECK(kvg_cpu_pages_copy(&pg, a, 0, b, 0, n, -5, &err) == KVGEN_OK);
    int rounded = 0; /* keys whose rotation f16 had to round */
    for (int l = 0; l < hp.n_layer; l++)
        for (int h = 0; h < Hkv; h++)
            for (int i = 0; i < n; i++) {
                row_f32(&pg, a, l, 0, h, i, k);
                kvg_ref_rope(k, hp.n_rot, -5, hp.rope_freq_base);
                kvg_cpu_kv_from_f32(type, k, want, (size_t)hd);
                CHECKF(same_rows(&pg, kvg_cpu_pages_at(&pg, b, l, 0, h, i), want), "%s: rotated key %d %d %d", tn, l, h,
                       i);
                row_f32(&pg, b, l, 0, h, i, row);
                rounded += !same_floats(row, k, (size_t)hd);
                CHECK(same_rows(&pg, kvg_cpu_pages_at(&pg, b, l, 1, h, i), kvg_cpu_pages_at(&pg, a, l, 1, h, i)));
            }
    CHECKF(type != KVG_TYPE_F32 ? rounded > 0 : rounded == 0, "%s: %d rotated keys rounded", tn, rounded);

    /* a move towards the start of the same table (a context shift): b[6..12) -> b[2..8) */
    float *snap = malloc((size_t)hp.n_layer * 2 * per * sizeof *snap);
    CHECK(snap != NULL);
    if (snap) {
        for (int l = 0; l < hp.n_layer; l++)
            for (int which = 0; which < 2; which++)
                kvg_cpu_pages_read(&pg, b, l, which, 0, n, snap + ((size_t)l * 2 + which) * per, &err);
        CHECK(kvg_cpu_pages_copy(&pg, b, 6, b, 2, 6, 0, &err) == KVGEN_OK);
        for (int l = 0; l < hp.n_layer; l++)
            for (int which = 0; which < 2; which++) {
                const float *old = snap + ((size_t)l * 2 + which) * per;
                for (int h = 0; h < Hkv; h++)
                    for (int i = 0; i < 6; i++) {
                        row_f32(&pg, b, l, which, h, 2 + i, row);
                        CHECKF(same_floats(row, old + ((size_t)h * n + 6 + i) * hd, (size_t)hd),
                               "%s shift: layer %d which %d head %d slot %d", tn, l, which, h, 2 + i);
                    }
            }
        free(snap);
    }
done:
    free(in);
    free(got);
    kvg_cpu_pages_free(&pg);
    kvg_cpu_pages_free(&pg); /* idempotent */
}

/* a block type's rows are whole blocks: pages of head_dim 8 are refused, naming the type */
static void test_pages_blocks_refused(void) {
    kvg_hparams hp = {.n_layer = 1, .n_embd = 16, .n_ff = 32, .n_head = 2, .n_head_kv = 2, .head_dim = 8, .n_rot = 8,
                      .n_ctx_train = 64, .n_vocab = 10, .rope_freq_base = 10000.0f, .rms_norm_eps = 1e-5f};
    int group[1] = {0}, slot[1] = {0}, layers[1] = {0};
    kvg_kv_layout kv = {.n_groups = 1, .n_layers = {1, 0}, .group = group, .slot = slot, .layers = {layers, NULL}};
    kvgen_error err = {0};
    kvg_cpu_pages pg;
    CHECK(kvg_cpu_pages_init(&pg, &hp, NULL, &kv, 0, 4, 1, KVG_TYPE_Q8_0, "test pages", &err) == KVGEN_E_INTERNAL);
    CHECKF(strstr(err.message, "Q8_0") && strstr(err.message, "head_dim 8"), "%s", err.message);
    kvg_cpu_pages_free(&pg);
    CHECK(!kvg_cpu_kv_type_known(KVG_TYPE_Q4_1));
}

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* f16 pages round what they are given to nearest even, saturate finite values beyond the half
 * range at +-65504 and keep infinities and NaN; f32 pages keep every bit */
static void test_pages_rounding(void) {
    kvg_hparams hp = {.n_layer = 1, .n_embd = 16, .n_ff = 32, .n_head = 2, .n_head_kv = 2, .head_dim = 8, .n_rot = 8,
                      .n_ctx_train = 64, .n_vocab = 10, .rope_freq_base = 10000.0f, .rms_norm_eps = 1e-5f};
    int group[1] = {0}, slot[1] = {0}, layers[1] = {0};
    kvg_kv_layout kv = {.n_groups = 1, .n_layers = {1, 0}, .group = group, .slot = slot, .layers = {layers, NULL}};
    /* a value, and what an f16 page gives back */
    static const float cases[16][2] = {
        {1.0f + 0x1p-11f, 1.0f},                      /* a tie: to the even 1.0 */
        {1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-9f},        /* a tie: to the even neighbour above */
        {1.0f + 0x1p-11f + 0x1p-20f, 1.0f + 0x1p-10f}, /* past the tie: up */
        {-(1.0f + 0x1p-11f + 0x1p-20f), -(1.0f + 0x1p-10f)},
        {0.1f, 0.0999755859375f},                     /* 0x2e66 */
        {65504.0f, 65504.0f},                         /* the largest half */
        {65519.0f, 65504.0f},                         /* rounds down to it */
        {65520.0f, 65504.0f},                         /* would round to inf: saturates */
        {70000.0f, 65504.0f},
        {-1e9f, -65504.0f},
        {INFINITY, INFINITY},
        {-INFINITY, -INFINITY},
        {0x1p-24f, 0x1p-24f},                         /* the smallest subnormal half */
        {1e-8f, 0.0f},                                /* below half of it */
        {-0.0f, -0.0f},
        {3.0f * 0x1p-25f, 0x1p-23f},                  /* subnormal tie: 1.5 units, to the even 2 */
    };
    float in[17], got[17];
    for (int i = 0; i < 16; i++) in[i] = cases[i][0];
    for (int t = 0; t < 2; t++) {
        kvg_cpu_kv_type type = t ? KVG_TYPE_F16 : KVG_TYPE_F32;
        kvgen_error err = {0};
        kvg_cpu_pages pg;
        const int32_t table[1] = {0};
        CHECK(kvg_cpu_pages_init(&pg, &hp, NULL, &kv, 0, 4, 1, type, "test pages", &err) == KVGEN_OK);
        CHECK(kvg_cpu_pages_commit(&pg, 0, &err) == KVGEN_OK);
        for (int which = 0; which < 2; which++) {
            CHECK(kvg_cpu_pages_write(&pg, table, 0, which, 1, 1, in, &err) == KVGEN_OK);
            CHECK(kvg_cpu_pages_read(&pg, table, 0, which, 1, 1, got, &err) == KVGEN_OK);
            for (int i = 0; i < 16; i++) {
                float expect = t ? cases[i][1] : cases[i][0];
                CHECKF(bits_of(got[i]) == bits_of(expect), "%s: %a stored as %a, expected %a", type_name(type),
                       (double)in[i], (double)got[i], (double)expect);
            }
        }
        /* NaN stays NaN */
        float nan_row[16];
        for (int i = 0; i < 16; i++) nan_row[i] = i == 3 ? NAN : 1.0f;
        CHECK(kvg_cpu_pages_write(&pg, table, 0, 0, 2, 1, nan_row, &err) == KVGEN_OK);
        CHECK(kvg_cpu_pages_read(&pg, table, 0, 0, 2, 1, got, &err) == KVGEN_OK);
        CHECK(isnan(got[3]) && got[2] == 1.0f && got[4] == 1.0f);
        kvg_cpu_pages_free(&pg);
    }
    /* the element the write stores is the conversion's */
    CHECK(kvg_cpu_f32_to_kv_f16(1.0f) == 0x3c00 && kvg_cpu_f32_to_kv_f16(-2.0f) == 0xc000);
    CHECK(kvg_cpu_f32_to_kv_f16(1e6f) == 0x7bff && kvg_cpu_f32_to_kv_f16(-1e6f) == 0xfbff);
    CHECK(kvg_cpu_f32_to_kv_f16(INFINITY) == 0x7c00);
}

int main(void) {
    test_thread_count();
    test_pool_coverage();
    test_pool_concurrent();
    test_pages(KVG_TYPE_F32, 8);
    test_pages(KVG_TYPE_F16, 8);
    test_pages(KVG_TYPE_F32, 64);
    test_pages(KVG_TYPE_F16, 64);
    test_pages(KVG_TYPE_Q8_0, 64);
    test_pages(KVG_TYPE_Q4_0, 64);
    test_pages_blocks_refused();
    test_pages_rounding();
    return tu_finish("test_cpu");
}
