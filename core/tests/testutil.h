/* testutil.h: a tiny test harness for kvgen's C tests (one ctest per file). */
#ifndef KVGEN_TESTUTIL_H
#define KVGEN_TESTUTIL_H
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "kvgen.h"

extern int tu_failures;
extern int tu_checks;

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        tu_checks++;                                                                         \
        if (!(cond)) {                                                                       \
            tu_failures++;                                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);         \
        }                                                                                    \
    } while (0)

#define CHECKF(cond, ...)                                                                    \
    do {                                                                                     \
        tu_checks++;                                                                         \
        if (!(cond)) {                                                                       \
            tu_failures++;                                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);         \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fputc('\n', stderr);                                                             \
        }                                                                                    \
    } while (0)

/* a kvgen call that must succeed; prints the error message otherwise */
#define CHECK_OK(call)                                                                       \
    do {                                                                                     \
        kvgen_error tu_err_ = {0};                                                           \
        (void)tu_err_;                                                                       \
        kvgen_status tu_st_ = (call);                                                        \
        tu_checks++;                                                                         \
        if (tu_st_ != KVGEN_OK) {                                                            \
            tu_failures++;                                                                   \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,             \
                    kvgen_status_name(tu_st_));                                              \
        }                                                                                    \
    } while (0)

/* exit code: 0 when every check passed, 1 otherwise; prints a summary */
int tu_finish(const char *name);
/* exits 77 (ctest: skipped) with a reason */
_Noreturn void tu_skip(const char *why);

/* paths: the default model (KVGEN_MODEL, else KVGEN_DEFAULT_MODEL), NULL when the file is absent */
const char *tu_model_path(void);
/* $KVGEN_TESTDATA/<rel> (static buffer per call site is not needed: returns malloc'd, caller frees) */
char *tu_testdata(const char *rel);
/* `name` in the models/ folder beside the default model (KVGEN_DEFAULT_MODEL, else ./models);
 * NULL when that file is not there; free() it. */
char *tu_model_file(const char *name);
/* a scratch directory for this test (created); returns malloc'd "<dir>/<name>" */
char *tu_tmpfile(const char *name);
/* builds a random-weight model by running kvgen-mkmodel with `args`; returns malloc'd path or NULL */
char *tu_make_model(const char *name, const char *args);
/* runs kvgen-mkmodel -o <scratch>/<name> `args`: its output (stdout and stderr) into out, and its
 * exit status (-1: it did not run) */
int tu_run_mkmodel(const char *name, const char *args, char *out, size_t size);
/* sleeps `us` microseconds */
void tu_pause_us(long us);
/* polls until the job is final; false after a generous bound (a hang, not a timing assert) */
bool tu_job_wait(kvgen_job *j);
/* loads a model (CHECK fails with kvgen's message when it cannot); NULL on failure */
kvgen_model *tu_load(const kvgen_model_desc *desc);
/* the K/V page tests' models: path on `backend` with 2 threads, pages of kv_type (NULL: the
 * backend's default) and a pool of 4,096 tokens; NULL (a failed CHECK) when it cannot load */
kvgen_model *tu_load_kv(const char *path, const char *kv_type, kvgen_backend backend);
/* A session of m (desc NULL: n_ctx 512); NULL, with a failed CHECK and kvgen's message, when it
 * cannot be created */
kvgen_session *tu_open_session(kvgen_model *m, const kvgen_session_desc *desc);
/* The K/V page tests' sizes: a fresh session of m (n_ctx 512) prefilled with n tokens
 * (tu_fill_tokens, seed 3), its pool's sizes into *pi and its cache's into *ci, both CHECKed to
 * agree (bytes a token; the cache n tokens of them, held in whole pages); false where the
 * session could not be made */
bool tu_cache_sizes(kvgen_model *m, int n, kvgen_pool_info *pi, kvgen_cache_info *ci);
/* m's vocabulary size */
int tu_vocab(const kvgen_model *m);
/* max |a - b| over n floats as a share of b's range (INFINITY when either is NULL) */
double tu_rel_diff(const float *a, const float *b, size_t n);
/* s's last logits against a fresh session of m (n_ctx 512, no prefix reuse) that runs s's
 * tokens from position 0, as tu_rel_diff; printed, and CHECKed to be within tol */
double tu_diff_to_fresh(kvgen_model *m, const kvgen_session *s, const char *what, double tol);
/* Sets KVGEN_VK_MAX_PART so that each KV slab of a Vulkan model loaded as d holds 2 pages (a pool
 * of 16 pages then spans all 8 slabs): a load of d (which must succeed) gives the page's bytes.
 * False when it does not load. The variable stays set: the caller unsets it. */
bool tu_two_page_slabs(const kvgen_model_desc *d);
/* n deterministic pseudo-random token ids in [0, n_vocab) for a seed */
void tu_fill_tokens(int32_t *t, size_t n, unsigned seed, int n_vocab);
/* largest |a[i] - b[i]| over n floats; INFINITY when exactly one is NULL, 0 when both are */
double tu_max_diff(const float *a, const float *b, int n);
/* reads a whole file; NULL on failure */
char *tu_read_file(const char *path, size_t *size);
/* Runs body(arg) in a child process when a Vulkan device is present (else prints that `what`
 * was not checked there) and checks the child's checks all passed. The child leaves with
 * _exit: lavapipe leaves a few bytes at unload that LeakSanitizer cannot attribute, and the
 * test's own process stays leak-checked. */
void tu_vulkan_child(const char *what, void (*body)(void *arg), void *arg);

/* $KVGEN_FIXTURES/<name> opened for reading; skips the test when KVGEN_FIXTURES is unset, and
 * fails a CHECK naming the path (returning NULL) when the file cannot be opened */
FILE *tu_open_fixture(const char *name);

/* A record of fixtures/chat_templates.txt (scripts/oracle/chat_templates.py): a header line,
 * and when it ends in a number LEN (not on a "case" line, nor a header ending in "error"), LEN
 * bytes of body and a newline; the number is cut off the header. */
typedef struct tu_record {
    char head[256];
    char *body; /* malloc'd, NUL-terminated; NULL when the header has no body */
    size_t len;
} tu_record;
/* reads the next record: 1, or 0 at the end of the file (or a short body) */
int tu_read_record(FILE *f, tu_record *r);

/* An outside oracle's logits (the fixtures named ..._logits.txt, from scripts/oracle/): a line
 * "tokens N id ...", then per position a line "pos P K id:logit ..." with its top K logits. */
enum { TU_ORACLE_MAX_TOK = 320, TU_ORACLE_MAX_TOPK = 20 };
typedef struct tu_oracle {
    int n_tok; /* as the tokens line says (ids past TU_ORACLE_MAX_TOK are not kept) */
    int32_t tokens[TU_ORACLE_MAX_TOK];
    int n_pos; /* one past the last position read */
    int top_id[TU_ORACLE_MAX_TOK][TU_ORACLE_MAX_TOPK];
    float top_val[TU_ORACLE_MAX_TOK][TU_ORACLE_MAX_TOPK];
} tu_oracle;
/* Reads tu_testdata(name), keeping the rows of `topk` logits (rows of another K, and lines of
 * another shape, are passed over); false (and a failed CHECK) when it cannot be opened. */
bool tu_oracle_load(const char *name, int topk, tu_oracle *o);
/* tu_oracle_load, and a failed CHECK unless the fixture's tokens are ids[0..n) with a row of
 * logits at each position */
bool tu_oracle_load_ids(const char *name, int topk, const int32_t *ids, int n, tu_oracle *o);
/* The 40-token sequence of the architecture and adapter fixtures (scripts/oracle/arch_fixtures.sh
 * and lora_fixtures.sh give it to scripts/oracle/dump_logits.cpp). */
enum { TU_SEQ40_N = 40 };
extern const int32_t tu_seq40[TU_SEQ40_N];
/* Logits (a row of n_vocab per position, positions 0..n_pos) against an oracle's top-K. */
typedef struct tu_oracle_cmp {
    int top1;                   /* positions whose largest logit is the oracle's top-1 */
    int clear, clear_top1;      /* positions where the oracle's top-2 margin is at least `margin`,
                                 * and how many of those agree */
    double max_diff, mean_diff; /* |logit - oracle's| over the oracle's top-K at every position */
} tu_oracle_cmp;
/* label non-NULL: each position whose top-1 differs is printed to stderr after it */
tu_oracle_cmp tu_oracle_compare(const tu_oracle *o, const float *logits, int n_vocab, int n_pos, int topk,
                                float margin, const char *label);

/* A rewrite of a GGUF file: its keys, then its tensors one by one, then what finish adds. */
struct kvg_gguf;
struct kvg_gguf_writer;
struct kvg_tensor;
typedef struct tu_gguf_edit {
    /* writes src's keys to w (NULL: every key as it is) */
    void (*keys)(struct kvg_gguf_writer *w, const struct kvg_gguf *src, const void *ctx);
    /* writes tensor t to w as it is, changed, or not at all (NULL: as it is) */
    void (*tensor)(struct kvg_gguf_writer *w, const struct kvg_tensor *t, const void *ctx);
    /* adds to w after the tensors (NULL: nothing) */
    void (*finish)(struct kvg_gguf_writer *w, const struct kvg_gguf *src, const void *ctx);
    const void *ctx;
} tu_gguf_edit;
/* src_path rewritten by e (NULL: copied) to tu_tmpfile(out_name); malloc'd path, or NULL with a
 * message on stderr */
char *tu_gguf_rewrite(const char *src_path, const char *out_name, const tu_gguf_edit *e);
/* A copy of the GGUF file src_path, written to tu_tmpfile(out_name), with tensor `name` replaced
 * by zeros of `type` (same shape); malloc'd path, or NULL with a message on stderr. */
char *tu_retype(const char *src_path, const char *out_name, const char *name, uint32_t type);
#endif
