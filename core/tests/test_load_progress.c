/* test_load_progress.c: kvgen_model_desc.progress. On every backend: the stages come in their
 * order, done rises within a stage and ends at total, the read stage counts every tensor's
 * bytes; returning 0 at any call cancels the load with KVGEN_E_CANCELLED, *out NULL, a message
 * naming the stage, and every host allocation made through kvgen's allocator given back (the
 * sanitizer build checks the backends' own memory; the validation layer the Vulkan objects);
 * a load after a cancelled one works. */
#include <string.h>
#include "testutil.h"

#define MAX_CALLS 4096

typedef struct call {
    kvgen_load_stage stage;
    uint64_t done, total;
} call;

typedef struct recorder {
    call calls[MAX_CALLS];
    int n;
    int cancel_at; /* the call that returns 0; -1: none */
} recorder;

static int record(void *user, kvgen_load_stage stage, uint64_t done, uint64_t total) {
    recorder *r = user;
    if (r->n < MAX_CALLS) r->calls[r->n] = (call){stage, done, total};
    return r->n++ == r->cancel_at ? 0 : 1;
}

/* counts the host allocations kvgen makes through its allocator */
static long live_blocks;
static void *count_malloc(void *user, size_t n) {
    (void)user;
    void *p = malloc(n);
    if (p) live_blocks++;
    return p;
}
static void *count_realloc(void *user, void *p, size_t n) {
    (void)user;
    void *q = realloc(p, n);
    if (q && !p) live_blocks++;
    return q;
}
static void count_free(void *user, void *p) {
    (void)user;
    if (p) live_blocks--;
    free(p);
}

static const char *stage_label(kvgen_load_stage s) {
    return s == KVGEN_LOAD_READ ? "read" : s == KVGEN_LOAD_UPLOAD ? "upload" : s == KVGEN_LOAD_PIPELINES ? "pipelines" : "?";
}

/* the sequence of a load that ran to the end: stages ascending, each rising to its total */
static void check_sequence(const char *backend, const recorder *r, uint64_t weight_bytes, int want_upload,
                           int want_pipelines) {
    CHECKF(r->n > 0 && r->n < MAX_CALLS, "%s: %d calls", backend, r->n);
    int seen[4] = {0};
    for (int i = 0; i < r->n && i < MAX_CALLS; i++) {
        const call *c = &r->calls[i];
        CHECKF(c->stage >= KVGEN_LOAD_READ && c->stage <= KVGEN_LOAD_PIPELINES, "%s: stage %d", backend, (int)c->stage);
        if (c->stage < KVGEN_LOAD_READ || c->stage > KVGEN_LOAD_PIPELINES) return;
        seen[c->stage]++;
        if (c->stage != KVGEN_LOAD_PIPELINES || c->total) CHECKF(c->done <= c->total, "%s: %s %llu of %llu", backend,
                                                              stage_label(c->stage), (unsigned long long)c->done,
                                                              (unsigned long long)c->total);
        if (i == 0) continue;
        const call *p = &r->calls[i - 1];
        CHECKF(c->stage >= p->stage, "%s: %s after %s", backend, stage_label(c->stage), stage_label(p->stage));
        if (c->stage == p->stage) {
            /* pipelines: the count rises while the total is 0 (unknown), then one call gives it */
            int total_given = c->stage == KVGEN_LOAD_PIPELINES && p->total == 0 && c->total != 0;
            CHECKF(total_given ? c->done == p->done && c->done == c->total : c->done > p->done,
                   "%s: %s: %llu of %llu after %llu of %llu", backend, stage_label(c->stage),
                   (unsigned long long)c->done, (unsigned long long)c->total, (unsigned long long)p->done,
                   (unsigned long long)p->total);
            if (!total_given) CHECKF(c->total == p->total, "%s: %s total changed", backend, stage_label(c->stage));
        } else {
            /* the stage before ended exactly at its total */
            CHECKF(p->done == p->total, "%s: %s ended at %llu of %llu", backend, stage_label(p->stage),
                   (unsigned long long)p->done, (unsigned long long)p->total);
        }
    }
    const call *last = &r->calls[r->n - 1];
    CHECKF(last->done == last->total && last->total > 0, "%s: the last call is %llu of %llu", backend,
           (unsigned long long)last->done, (unsigned long long)last->total);
    CHECKF(seen[KVGEN_LOAD_READ] >= 1, "%s: no read stage", backend);
    CHECKF(!!seen[KVGEN_LOAD_UPLOAD] == want_upload, "%s: upload stage %d calls", backend, seen[KVGEN_LOAD_UPLOAD]);
    CHECKF(!!seen[KVGEN_LOAD_PIPELINES] == want_pipelines, "%s: pipelines stage %d calls", backend,
           seen[KVGEN_LOAD_PIPELINES]);
    /* the read stage's total: every tensor's bytes, which is the model's weight_bytes */
    for (int i = 0; i < r->n; i++)
        if (r->calls[i].stage == KVGEN_LOAD_READ) {
            CHECKF(r->calls[i].total == weight_bytes, "%s: read total %llu, weight_bytes %llu", backend,
                   (unsigned long long)r->calls[i].total, (unsigned long long)weight_bytes);
            break;
        }
}

typedef struct backend_case {
    const char *path;
    kvgen_backend backend;
    const char *name;
    int upload, pipelines; /* the stages it has */
} backend_case;

static recorder rec; /* large: not on the stack */

static void run_backend(const backend_case *bc) {
    kvgen_model_desc d = {.path = bc->path, .backend = bc->backend, .n_threads = 2, .kv_pool_tokens = 256,
                          .progress = record, .progress_user = &rec};
    memset(&rec, 0, sizeof rec);
    rec.cancel_at = -1;
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvgen_model_load(&d, &m, &err);
    CHECKF(st == KVGEN_OK, "%s: %s", bc->name, err.message);
    if (st != KVGEN_OK) return;
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    check_sequence(bc->name, &rec, info.weight_bytes, bc->upload, bc->pipelines);
    /* the callback is the load's: a session's work does not call it */
    int n_load = rec.n;
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    int32_t toks[3] = {1, 2, 3};
    if (s) CHECK_OK(kvgen_session_prefill(s, toks, 3, NULL, &err));
    CHECK(rec.n == n_load);
    kvgen_session_close(s);
    kvgen_model_unload(m);
    printf("%s: %d progress calls\n", bc->name, n_load);

    /* cancelling at the first call, one in the middle of each stage and the last */
    int n = n_load;
    int at[8], n_at = 0;
    int start = 0;
    at[n_at++] = 0;
    for (int i = 1; i < n; i++)
        if (rec.calls[i].stage != rec.calls[i - 1].stage) {
            at[n_at++] = start + (i - start) / 2; /* within the stage before */
            at[n_at++] = i;                       /* a stage's first call */
            start = i;
        }
    at[n_at++] = start + (n - start) / 2;
    at[n_at++] = n - 1;
    for (int k = 0; k < n_at; k++) {
        memset(&rec, 0, sizeof rec);
        rec.cancel_at = at[k];
        long before = live_blocks;
        m = (kvgen_model *)&rec; /* must be reset to NULL */
        kvgen_error cerr = {0};
        st = kvgen_model_load(&d, &m, &cerr);
        CHECKF(st == KVGEN_E_CANCELLED, "%s: cancel at call %d: %s (%s)", bc->name, at[k], kvgen_status_name(st),
               cerr.message);
        CHECK(m == NULL);
        if (st == KVGEN_OK) kvgen_model_unload(m);
        CHECKF(rec.n == at[k] + 1, "%s: %d calls after cancelling at %d", bc->name, rec.n, at[k]);
        CHECKF(strstr(cerr.message, "kvgen_model_load") && strstr(cerr.message, "cancelled by the progress callback") &&
                   strstr(cerr.message, bc->path),
               "%s: message: %s", bc->name, cerr.message);
        CHECKF(live_blocks == before, "%s: cancel at %d: %ld allocations left", bc->name, at[k], live_blocks - before);
    }
    /* after all that, a load runs as before */
    memset(&rec, 0, sizeof rec);
    rec.cancel_at = -1;
    m = NULL;
    CHECK_OK(kvgen_model_load(&d, &m, &err));
    CHECK(rec.n == n_load);
    kvgen_model_unload(m);
}

static void vulkan_body(void *arg) { run_backend(arg); }

int main(void) {
    kvgen_allocator a = {count_malloc, count_realloc, count_free, NULL};
    kvgen_error err = {0};
    CHECK_OK(kvgen_set_allocator(&a, &err));
    /* several MiB, so the byte stages have more than one report */
    char *path = tu_make_model("progress.gguf", "--layers 4 --embd 512 --heads 8 --kv-heads 4 --ff 1024 --type Q8_0");
    CHECK(path != NULL);
    if (!path) return tu_finish("test_load_progress");

    /* no callback: nothing is reported (and nothing changes) */
    kvgen_model *m = NULL;
    kvgen_model_desc plain = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .kv_pool_tokens = 256};
    CHECK_OK(kvgen_model_load(&plain, &m, &err));
    kvgen_model_unload(m);

    backend_case ref = {path, KVGEN_BACKEND_REFERENCE, "reference", 0, 0};
    backend_case cpu = {path, KVGEN_BACKEND_CPU, "cpu", 1, 0};
    backend_case vk = {path, KVGEN_BACKEND_VULKAN, "vulkan", 1, 1};
    run_backend(&ref);
    run_backend(&cpu);
    tu_vulkan_child("the Vulkan backend's load progress", vulkan_body, &vk);
    CHECKF(live_blocks == 0, "%ld allocations left", live_blocks);
    CHECK_OK(kvgen_set_allocator(NULL, &err));
    free(path);
    return tu_finish("test_load_progress");
}
