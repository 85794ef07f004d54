/* test_host.c: the host's hooks. A logger installed with kvgen_set_logger receives kvgen's
 * warnings (a default load leaving a Vulkan backend without a loader, an ignored pipeline
 * cache file) and nothing reaches stderr meanwhile; kvgen_set_allocator's functions serve the
 * allocations of a model's whole life (load, sessions, forks, generation, jobs on the worker
 * thread, save/restore) on each backend and get every block back; bad allocators and a switch
 * under a loaded model are refused by name. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "testutil.h"

/* ---- a logger that keeps what it gets ---- */

#define MAX_MSGS 64
static struct {
    int level[MAX_MSGS];
    char text[MAX_MSGS][512];
    atomic_int n;
} logged;

static void keep_log(void *user, kvgen_log_level level, const char *message) {
    CHECK(user == &logged);
    int i = atomic_fetch_add(&logged.n, 1);
    if (i >= MAX_MSGS) return;
    logged.level[i] = (int)level;
    snprintf(logged.text[i], sizeof logged.text[i], "%s", message);
}

#ifdef KVGEN_TEST_HAVE_VULKAN
static int find_log(kvgen_log_level level, const char *what) {
    int n = atomic_load(&logged.n);
    for (int i = 0; i < n && i < MAX_MSGS; i++)
        if (logged.level[i] == (int)level && strstr(logged.text[i], what)) return 1;
    return 0;
}

/* validation messages reach the test's logger, not stderr: print them after the capture so that
 * ctest's FAIL_REGULAR_EXPRESSION still sees them */
static void report_validation(void) {
    int n = atomic_load(&logged.n);
    for (int i = 0; i < n && i < MAX_MSGS; i++)
        if (strstr(logged.text[i], "vulkan validation:")) fprintf(stderr, "kvgen: %s\n", logged.text[i]);
}
#endif

/* stderr into a file while kvgen runs */
static int saved_stderr = -1;
static char *capture_path;

static void capture_begin(void) {
    fflush(stderr);
    if (!capture_path) capture_path = tu_tmpfile("stderr.txt");
    int fd = open(capture_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0);
    saved_stderr = dup(2);
    dup2(fd, 2);
    close(fd);
}

static size_t capture_end(void) {
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    size_t size = 0;
    char *text = tu_read_file(capture_path, &size);
    if (size) fprintf(stderr, "captured stderr: %.*s\n", (int)size, text);
    free(text);
    return size;
}

/* ---- an allocator that counts and checks its blocks ---- */

#define MAGIC 0x6b766765u
typedef struct { uint32_t magic, pad; size_t size; } header;
static atomic_long n_alloc, n_free, n_bad, live_bytes, peak_bytes;
static int user_token;

static void note_live(long delta) {
    long now = atomic_fetch_add(&live_bytes, delta) + delta, peak = atomic_load(&peak_bytes);
    while (now > peak && !atomic_compare_exchange_weak(&peak_bytes, &peak, now)) {}
}

static void *count_malloc(void *user, size_t size) {
    if (user != &user_token) atomic_fetch_add(&n_bad, 1);
    header *h = malloc(sizeof *h + size);
    if (!h) return NULL;
    *h = (header){MAGIC, 0, size};
    atomic_fetch_add(&n_alloc, 1);
    note_live((long)size);
    return h + 1;
}

static void count_free(void *user, void *p) {
    if (user != &user_token) atomic_fetch_add(&n_bad, 1);
    if (!p) return;
    header *h = (header *)p - 1;
    if (h->magic != MAGIC) { /* not one of ours: leave it alone, count the mistake */
        atomic_fetch_add(&n_bad, 1);
        return;
    }
    h->magic = 0;
    atomic_fetch_add(&n_free, 1);
    atomic_fetch_sub(&live_bytes, (long)h->size);
    free(h);
}

static void *count_realloc(void *user, void *p, size_t size) {
    if (!p) return count_malloc(user, size);
    header *h = (header *)p - 1;
    if (h->magic != MAGIC) {
        atomic_fetch_add(&n_bad, 1);
        return NULL;
    }
    size_t old = h->size;
    header *g = realloc(h, sizeof *g + size);
    if (!g) return NULL;
    g->size = size;
    note_live((long)size - (long)old);
    return g + 1;
}

static const kvgen_allocator counting = {count_malloc, count_realloc, count_free, &user_token};

/* a model's life on one backend: sessions, a fork, generation, a job on the worker, a save and
 * restore */
static void model_life(const char *path, kvgen_backend backend) {
    kvgen_model_desc md = {.path = path, .backend = backend};
    kvgen_model *m = tu_load(&md);
    if (!m) return;
    kvgen_error err = {0};
    CHECKF(kvgen_set_allocator(NULL, &err) == KVGEN_E_INVALID_ARGUMENT && strstr(err.message, "1 model is still loaded"),
           "%s", err.message);
    kvgen_session *s = NULL, *f = NULL, *r = NULL;
    CHECK_OK(kvgen_session_create(m, NULL, &s, &tu_err_));
    int32_t toks[12];
    tu_fill_tokens(toks, 12, 3, 256);
    if (s) CHECK_OK(kvgen_session_prefill(s, toks, 12, NULL, &tu_err_));
    if (s) CHECK_OK(kvgen_session_fork(s, &f, &tu_err_));
    char out[256];
    size_t len = 0;
    kvgen_generate_desc gd = {.max_tokens = 6, .ignore_eog = 1};
    if (f) CHECK_OK(kvgen_generate(f, &gd, out, sizeof out, &len, NULL, &tu_err_));
    char *file = tu_tmpfile("host.session");
    if (f) CHECK_OK(kvgen_session_save(f, file, &tu_err_));
    CHECK_OK(kvgen_session_restore(m, file, &r, &tu_err_));
    free(file);
    kvgen_job_desc jd = {.prompt = KVGEN_PROMPT_TEXT, .text = "hello there", .gen = {.max_tokens = 4, .ignore_eog = 1}};
    kvgen_job *job = NULL;
    if (s) CHECK_OK(kvgen_job_submit(s, &jd, &job, &tu_err_));
    kvgen_job_state st = KVGEN_JOB_QUEUED;
    for (int i = 0; job && i < 600000 && st < KVGEN_JOB_DONE; i++) { /* a hang guard (minutes), not a time limit */
        st = kvgen_job_poll(job, NULL, NULL);
        if (st < KVGEN_JOB_DONE) nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    CHECKF(st == KVGEN_JOB_DONE, "job state %d", (int)st);
    kvgen_job_release(job);
    kvgen_session_close(r);
    kvgen_session_close(f);
    kvgen_session_close(s);
    kvgen_model_unload(m);
}

static void check_balanced(const char *what) {
    long a = atomic_load(&n_alloc), f = atomic_load(&n_free);
    CHECKF(a > 100, "%s: only %ld allocations went through the host's allocator", what, a);
    CHECKF(a == f && atomic_load(&live_bytes) == 0, "%s: %ld allocations, %ld frees, %ld bytes live", what, a, f,
           atomic_load(&live_bytes));
    CHECKF(atomic_load(&n_bad) == 0, "%s: %ld blocks freed or resized that the allocator did not hand out", what,
           atomic_load(&n_bad));
    printf("%s: %ld allocations through the host's allocator, all freed\n", what, a);
}

static const char *model_path;

#ifdef KVGEN_TEST_HAVE_VULKAN
static void vulkan_body(void *arg) {
    (void)arg;
    model_life(model_path, KVGEN_BACKEND_VULKAN);
    check_balanced("vulkan");

    /* a damaged pipeline cache file: ignored with a warning to the logger, nothing on stderr */
    char *cache = tu_tmpfile("damaged-pipelines.bin");
    FILE *fp = fopen(cache, "wb");
    CHECK(fp != NULL);
    if (fp) {
        fputs("not a pipeline cache", fp);
        fclose(fp);
    }
    atomic_store(&logged.n, 0);
    kvgen_set_logger(keep_log, &logged);
    capture_begin();
    kvgen_model_desc md = {.path = model_path, .backend = KVGEN_BACKEND_VULKAN, .pipeline_cache_path = cache};
    kvgen_error err = {0};
    kvgen_model *m = NULL;
    kvgen_status st = kvgen_model_load(&md, &m, &err);
    kvgen_model_unload(m);
    size_t leaked = capture_end();
    kvgen_set_logger(NULL, NULL);
    report_validation();
    CHECKF(st == KVGEN_OK, "%s", err.message);
    CHECKF(find_log(KVGEN_LOG_WARNING, "vulkan pipeline cache") && find_log(KVGEN_LOG_WARNING, "damaged-pipelines.bin"),
           "no warning about the ignored cache file (%d messages)", atomic_load(&logged.n));
    CHECKF(leaked == 0, "%zu bytes reached stderr with a logger installed", leaked);
    free(cache);
}
#endif

int main(void) {
    CHECK(strcmp(kvgen_log_level_name(KVGEN_LOG_WARNING), "warning") == 0);
    CHECK(strcmp(kvgen_log_level_name(KVGEN_LOG_DEBUG), "debug") == 0);
    kvgen_error err = {0};
    kvgen_allocator half = {count_malloc, NULL, count_free, NULL};
    CHECKF(kvgen_set_allocator(&half, &err) == KVGEN_E_INVALID_ARGUMENT &&
               strstr(err.message, "kvgen_set_allocator: allocator->realloc is NULL"),
           "%s", err.message);
    char *path = tu_make_model("host.gguf", "--layers 2 --embd 64 --heads 4 --kv-heads 2 --type Q8_0");
    CHECK(path != NULL);
    if (!path) return tu_finish("test_host");
    model_path = path;

    CHECK_OK(kvgen_set_allocator(&counting, &tu_err_));
    model_life(path, KVGEN_BACKEND_REFERENCE);
    check_balanced("reference");
    atomic_store(&peak_bytes, 0);
    model_life(path, KVGEN_BACKEND_CPU);
    check_balanced("cpu");
    /* the cpu backend keeps its packed copy of the weights in host memory: from the host's
     * allocator, like the rest of the backend's state */
    struct stat sb;
    if (stat(path, &sb) == 0)
        CHECKF(atomic_load(&peak_bytes) >= (long)sb.st_size / 2,
               "cpu: %ld bytes at most were live through the host's allocator for a %lld-byte model (its packed "
               "weights bypassed it)", atomic_load(&peak_bytes), (long long)sb.st_size);

    /* a default load without a Vulkan loader: runs on the cpu backend and says why, to the
     * host's logger only (the loader is looked for again at the next load, so the Vulkan child
     * below finds it) */
    const char *validate_env = getenv("KVGEN_VALIDATE");
    char validate[16];
    snprintf(validate, sizeof validate, "%s", validate_env ? validate_env : "");
    setenv("KVGEN_VULKAN_LOADER", "none", 1);
    setenv("KVGEN_VALIDATE", "0", 1);
    kvgen_set_logger(keep_log, &logged);
    capture_begin();
    kvgen_model_desc md = {.path = path};
    kvgen_model *m = NULL;
    err = (kvgen_error){0};
    kvgen_status st = kvgen_model_load(&md, &m, &err);
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    kvgen_model_unload(m);
    size_t leaked = capture_end();
    kvgen_set_logger(NULL, NULL);
    CHECKF(st == KVGEN_OK, "%s", err.message);
#ifdef KVGEN_TEST_HAVE_VULKAN
    CHECKF(info.backend && strcmp(info.backend, "cpu") == 0, "backend %s", info.backend ? info.backend : "(none)");
    CHECKF(find_log(KVGEN_LOG_WARNING, "no Vulkan loader (KVGEN_VULKAN_LOADER=none") &&
               find_log(KVGEN_LOG_WARNING, "running on the cpu backend"),
           "no warning saying why the load left Vulkan (%d messages)", atomic_load(&logged.n));
#endif
    CHECKF(leaked == 0, "%zu bytes reached stderr with a logger installed", leaked);
    unsetenv("KVGEN_VULKAN_LOADER");
    check_balanced("default load");
    if (validate[0]) setenv("KVGEN_VALIDATE", validate, 1);
    else unsetenv("KVGEN_VALIDATE");
#ifdef KVGEN_TEST_HAVE_VULKAN
    tu_vulkan_child("the host's allocator and logger on Vulkan", vulkan_body, NULL);
#endif
    CHECK_OK(kvgen_set_allocator(NULL, &tu_err_));
    free(path);
    return tu_finish("test_host");
}
