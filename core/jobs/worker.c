/* worker.c: the jobs API of kvgen.h: non-blocking generation on one worker thread per model,
 * with continuous batching. (Over 1,000 lines: one job state machine whose submit, step,
 * poll and cancel paths read each other's invariants; split, it would spread one lock's rules.)
 *
 * The host thread only submits, cancels and polls; everything that runs the model happens on
 * the worker. One mutex (kvg_worker.mu) guards the job list and every field the host can see;
 * the worker holds it to plan a step and to publish its results, never while the model runs,
 * so a poll waits at most for that bookkeeping. A step:
 *   plan (locked)    pick the jobs to advance: every generating session (up to max_batch), the
 *                    one prompt that most deserves a prefill chunk, and the other waiting
 *                    prompts (riders); mark them in_step;
 *   run (unlocked)   the prompts are started (a chat turn rendered); those whose rest fits the
 *                    step's budget of prefill_chunk prompt tokens ride with the decodes (a rest
 *                    longer than a KV page runs alone, for the prefix cache), the chosen one, if
 *                    longer than the budget, runs one prefill chunk on its own; then
 *                    every generating job samples its token (kvg_gen_sample), the tokens and the
 *                    riders' prompts run together as one batch (kvg_session_run_batch: one
 *                    backend forward pass, each weight read once for all), and each job commits
 *                    its token (kvg_gen_commit: text, stop strings, finish); a rider whose prompt
 *                    ran begins generating, and samples its first token in the next step;
 *   commit (locked)  text, states and timing become visible; released final jobs are freed.
 * A job is touched by the worker only while in_step, and by the host (close, cancel, release)
 * only while it is not, which is what makes session close and release safe: close waits for
 * the step that holds the session, release of a job in a step is finished by the commit.
 *
 * Lifetime: a job holds a model reference until released, a session holds one until closed,
 * and the worker holds none, so the model (and with it the worker, see kvg_worker_stop) is
 * freed on a host thread after every job and session is gone.
 *
 * Busy sessions: a session with a job that is not final (released or not) belongs to the
 * worker: the worker counts such jobs in the session (s->jobs_active, changed under w->mu), which
 * kvgen_session_busy reads, and kvg_session_check_host (session.c) refuses the session to every
 * thread but the model's worker (which marks itself in kvg_session_worker_thread), so the host
 * cannot touch a session the worker is using. */
#define _POSIX_C_SOURCE 200809L
#include "kvg_platform.h"
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#endif
#include "kvg_constrain.h"
#include "kvg_generate.h"
#include "kvg_sampler.h"
#include "kvg_session.h"
#include "kvg_str.h"
#include "kvg_toolcall.h"

#define DEFAULT_PREFILL_CHUNK 32
#define DEFAULT_MAX_BATCH 64
#define DEFAULT_NICE 5
struct kvgen_job {
    kvgen_model *model;
    struct kvg_worker *w;
    kvgen_session *s; /* NULL once its session closed */
    uint64_t seq;     /* submission order */

    /* the request, immutable after submit */
    kvgen_prompt_kind prompt;
    char *text, *role;
    size_t text_len; /* TEXT on a model whose sessions take text (a remote model's): kept as bytes, not tokenized */
    int32_t *tokens; /* TEXT (tokenized at submit) and TOKENS */
    size_t n_tokens;
    kvgen_generate_desc gen; /* stop, constraint and tools point into stops / cons_arena / tools_arena */
    char **stops;
    void *cons_arena;
    kvgen_tools_desc tools;  /* a chat reply's tools (gen.tools points here) */
    void *tools_arena;
    char *vars;     /* a chat job's template variables (NULL with has_vars: none), set at its start */
    bool has_vars;
    const void *owner;
    void *user_data;

    /* shared: read and written under w->mu */
    int priority;
    kvgen_job_state state;
    kvgen_finish finish;
    kvgen_error error;
    bool cancel;    /* asked for; the worker sees it at the next plan */
    bool detaching; /* its session is closing: never planned again */
    bool released, in_step, final_reported;
    bool wrider, wserved; /* in this step as a rider; its prompt ran (then it counts as served) */
    kvg_buf out; /* produced, not yet polled */
    kvg_buf reason; /* a chat reply's reasoning so far (kvgen_job_reasoning copies it out) */
    kvgen_tool_call *calls; /* a "tool_calls" finish: its calls, set before the state turns final */
    int n_calls;
    size_t prompt_total, prompt_done;
    int n_gen;
    double t_submit, t_start, t_first, t_last, t_end;
    uint64_t last_served; /* step number of its last prefill chunk or decode: round robin */

    /* the worker's, touched only while in_step (or by the host once detached, see closing) */
    kvgen_gen *g;
    kvg_tokens prompt_toks; /* the prompt as built at start (a chat turn is captured) */
    size_t len_before;      /* session length when the job started */
    kvg_chat *chat_before;  /* chat state when it started: a rollback restores it */
    int32_t *kept;          /* a chat job: the session's tokens when it started, for a rollback past
                               a turn that re-rendered earlier text (new tools, say) */
    size_t n_kept;
    bool chat_saved;
    bool wcancel;      /* cancel as planned */
    kvgen_job_state wstate;
    kvgen_finish wfinish;
    kvgen_error werr;
    kvg_buf wout; /* text of this step */
    kvg_buf wreason; /* reasoning of this step */
    struct kvg_tools *wtools; /* the tools offered at the turn, until the reply's generator takes them */
    size_t wprompt_total, wprompt_done;
    int wn_gen;
    double wt_start, wt_first, wt_last, wt_end;

    /* the host's (under w->mu): every byte committed so far once moved out of `out`; polls
     * hand out host_text[delivered..] */
    kvg_buf host_text;
    size_t delivered;
    kvg_buf host_reason; /* kvgen_job_reasoning's copy */
    struct kvgen_job *prev, *next;
};

typedef struct kvg_worker {
    kvgen_model *m;
    const kvg_session_kind *kind; /* of the model's sessions */
    bool replies;                 /* its sessions generate their replies themselves (kvg_gen_reply_step) */
    kvg_mutex mu;
    kvg_cond wake;    /* worker: work arrived, or quit */
    kvg_cond stepped; /* host: a step was committed (session close waits for it) */
    kvg_thread thread;
    bool started, quit;
    kvgen_jobs_desc cfg;
    kvgen_job *head, *tail;
    uint64_t seq, step_no, poll_after;
    kvgen_jobs_stats stats;
    kvgen_jobs_stats wstats; /* the worker's counters, copied into stats at each commit */
    /* the worker's scratch */
    kvgen_job **plan, **ride, **ride_now; /* ride_now: the riders of the running step */
    size_t plan_cap;
    kvgen_session **flush; /* a batch's sessions, jobs, tokens and outcomes */
    kvgen_job **flush_jobs;
    int32_t *flush_tokens;
    const int32_t **flush_ptrs;
    int *flush_counts;
    kvgen_status *flush_status;
    kvgen_error *flush_errs;
} kvg_worker;

static double now_ms(void) {
    return (double)kvg_time_ns() / 1e6;
}

static bool is_final(kvgen_job_state st) {
    return st == KVGEN_JOB_DONE || st == KVGEN_JOB_CANCELLED || st == KVGEN_JOB_FAILED;
}

/* Under w->mu: every change of a job's published state goes through here, so that its
 * session's count of jobs that are not final (s->jobs_active, kvgen_session_busy) stays exact. */
static void set_state(kvgen_job *j, kvgen_job_state st) {
    if (j->s && !is_final(j->state) && is_final(st)) __atomic_sub_fetch(&j->s->jobs_active, 1, __ATOMIC_RELEASE);
    j->state = st;
}

const char *kvgen_job_state_name(kvgen_job_state st) {
    switch (st) {
    case KVGEN_JOB_QUEUED: return "queued";
    case KVGEN_JOB_PREFILLING: return "prefilling";
    case KVGEN_JOB_GENERATING: return "generating";
    case KVGEN_JOB_DONE: return "done";
    case KVGEN_JOB_CANCELLED: return "cancelled";
    case KVGEN_JOB_FAILED: return "failed";
    }
    return "unknown";
}

/* ---- request copies -------------------------------------------------------------------- */

static size_t align_up(size_t n) {
    size_t a = alignof(max_align_t);
    return (n + a - 1) / a * a;
}

/* Copies a constraint into one allocation (the job frees one pointer): structs and pointer
 * arrays first, then the strings. */
static kvgen_constraint *copy_constraint(const kvgen_constraint *k, void **arena) {
    size_t size = align_up(sizeof *k), strings = 0;
    size += align_up((size_t)k->n_choices * sizeof(char *));
    for (int i = 0; i < k->n_choices; i++) strings += strlen(k->choices[i]) + 1;
    size += align_up((size_t)k->n_fields * sizeof(kvgen_json_field));
    for (int i = 0; i < k->n_fields; i++) {
        const kvgen_json_field *f = &k->fields[i];
        strings += strlen(f->key) + 1;
        if (f->type == KVGEN_JSON_ENUM) {
            size += align_up((size_t)f->n_values * sizeof(char *));
            for (int v = 0; v < f->n_values; v++) strings += strlen(f->values[v]) + 1;
        }
    }
    if (k->grammar) strings += strlen(k->grammar) + 1;
    if (k->schema) strings += strlen(k->schema) + 1;
    char *a = kvg_malloc(size + strings);
    if (!a) return NULL;
    char *at = a, *str = a + size;
    kvgen_constraint *c = (kvgen_constraint *)(void *)at;
    *c = *k;
    at += align_up(sizeof *k);
    const char **choices = (const char **)(void *)at;
    at += align_up((size_t)k->n_choices * sizeof(char *));
    for (int i = 0; i < k->n_choices; i++) {
        size_t n = strlen(k->choices[i]) + 1;
        choices[i] = memcpy(str, k->choices[i], n);
        str += n;
    }
    c->choices = k->n_choices > 0 ? choices : NULL;
    kvgen_json_field *fields = (kvgen_json_field *)(void *)at;
    at += align_up((size_t)k->n_fields * sizeof(kvgen_json_field));
    for (int i = 0; i < k->n_fields; i++) {
        const kvgen_json_field *f = &k->fields[i];
        fields[i] = *f;
        size_t n = strlen(f->key) + 1;
        fields[i].key = memcpy(str, f->key, n);
        str += n;
        fields[i].values = NULL;
        if (f->type == KVGEN_JSON_ENUM) {
            const char **values = (const char **)(void *)at;
            at += align_up((size_t)f->n_values * sizeof(char *));
            for (int v = 0; v < f->n_values; v++) {
                n = strlen(f->values[v]) + 1;
                values[v] = memcpy(str, f->values[v], n);
                str += n;
            }
            fields[i].values = values;
        }
    }
    c->fields = k->n_fields > 0 ? fields : NULL;
    if (k->grammar) {
        size_t n = strlen(k->grammar) + 1;
        c->grammar = memcpy(str, k->grammar, n);
        str += n;
    }
    if (k->schema) {
        size_t n = strlen(k->schema) + 1;
        c->schema = memcpy(str, k->schema, n);
        str += n;
    }
    *arena = a;
    return c;
}

static void job_free(kvgen_job *j) {
    if (!j) return;
    kvgen_gen_end(j->g);
    kvg_free(j->text);
    kvg_free(j->role);
    kvg_free(j->vars);
    kvg_free(j->tokens);
    for (int i = 0; j->stops && i < j->gen.n_stop; i++) kvg_free(j->stops[i]);
    kvg_free(j->stops);
    kvg_free(j->cons_arena);
    kvg_free(j->tools_arena);
    kvg_tools_free(j->wtools);
    kvg_free(j->calls);
    kvg_free(j->reason.p);
    kvg_free(j->wreason.p);
    kvg_free(j->host_reason.p);
    kvg_free(j->prompt_toks.v);
    kvg_chat_mark_free(j->chat_before);
    kvg_free(j->kept);
    kvg_free(j->out.p);
    kvg_free(j->wout.p);
    kvg_free(j->host_text.p);
    kvg_free(j);
}

/* Checks what kvgen_gen_begin would refuse, and copies the strings and the constraint. */
/* Strings copied into one allocation (a job's tools, its calls): str_size counts a string's
 * bytes (0 for NULL), str_put copies it at *at and moves past it (NULL stays NULL). */
static size_t str_size(const char *str) { return str ? strlen(str) + 1 : 0; }
static const char *str_put(char **at, const char *str) {
    if (!str) return NULL;
    size_t n = strlen(str) + 1;
    memcpy(*at, str, n);
    *at += n;
    return *at - n;
}

/* A chat job's tools: checked as kvgen_chat_gen_begin checks them (the template's format is
 * known on the worker: one it lacks fails the job), then copied. */
static kvgen_status copy_tools(kvgen_job *j, const kvgen_model *m, const kvgen_generate_desc *d, kvgen_error *err) {
    const kvgen_tools_desc *td = d->tools;
    if (j->prompt != KVGEN_PROMPT_CHAT)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_job_submit: gen.tools: only a chat job "
                        "(KVGEN_PROMPT_CHAT) takes tools, not prompt %d", (int)j->prompt);
    if (kvg_session_kind_replies(kvg_session_kind_of(m)))
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "kvgen_job_submit: gen.tools: a remote model's jobs take no tools");
    if (d->constraint || d->soft_max_tokens > 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_job_submit: gen.tools with a constraint or "
                        "soft_max_tokens (a reply that may call tools is constrained by the tools' grammar)");
    kvgen_status st = kvg_tools_check(td, "kvgen_job_submit: gen.", err);
    if (st != KVGEN_OK) return st;
    size_t size = (size_t)td->n_tools * sizeof(kvgen_tool) + str_size(td->name);
    for (int i = 0; i < td->n_tools; i++)
        size += str_size(td->tools[i].name) + str_size(td->tools[i].description) + str_size(td->tools[i].parameters);
    kvgen_tool *tools = kvg_malloc(size);
    if (!tools) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_job_submit: out of memory");
    char *at = (char *)(tools + td->n_tools);
    for (int i = 0; i < td->n_tools; i++) {
        tools[i].name = str_put(&at, td->tools[i].name);
        tools[i].description = str_put(&at, td->tools[i].description);
        tools[i].parameters = str_put(&at, td->tools[i].parameters);
    }
    j->tools_arena = tools;
    j->tools = (kvgen_tools_desc){.tools = tools, .n_tools = td->n_tools, .choice = td->choice,
                                  .name = str_put(&at, td->name)};
    j->gen.tools = &j->tools;
    return KVGEN_OK;
}

static kvgen_status copy_gen(kvgen_job *j, const kvgen_model *m, const kvgen_generate_desc *d, kvgen_error *err) {
    j->gen = *d;
    j->gen.stop = NULL;
    j->gen.n_stop = 0;
    j->gen.constraint = NULL;
    j->gen.tools = NULL;
    /* as kvgen_gen_begin checks them: reported at submit rather than as a failed job */
    kvgen_generate_desc without_tools = *d;
    without_tools.tools = NULL;
    kvgen_status chk = kvg_gen_check_desc(&without_tools, "kvgen_job_submit", "gen.", err);
    if (chk == KVGEN_OK && d->tools) chk = copy_tools(j, m, d, err);
    if (chk != KVGEN_OK) return chk;
    if (d->constraint) {
        /* validates it, and that the vocabulary spells its choices (without the session, which
         * may be the worker's now) */
        kvgen_status st = kvg_session_kind_replies(kvg_session_kind_of(m)) ? kvgen_generate_check(d, err)
                                                                            : kvg_cons_check(d->constraint, m, err);
        if (st != KVGEN_OK) return st;
        j->gen.constraint = copy_constraint(d->constraint, &j->cons_arena);
        if (!j->gen.constraint) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_job_submit: out of memory");
    }
    if (d->n_stop > 0) {
        j->stops = kvg_calloc((size_t)d->n_stop, sizeof *j->stops);
        if (!j->stops) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_job_submit: out of memory");
        for (int i = 0; i < d->n_stop; i++) {
            j->stops[i] = kvg_memdup0(d->stop[i], strlen(d->stop[i]));
            if (!j->stops[i]) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_job_submit: out of memory");
            j->gen.n_stop = i + 1;
        }
        j->gen.stop = (const char *const *)j->stops;
    }
    return KVGEN_OK;
}

static kvgen_status copy_prompt(kvgen_job *j, const kvgen_model *m, const kvgen_job_desc *d, kvgen_error *err) {
    int n_vocab = m->w.hp.n_vocab;
    j->prompt = d->prompt;
    switch (d->prompt) {
    case KVGEN_PROMPT_NONE: return KVGEN_OK;
    case KVGEN_PROMPT_TOKENS:
        if (!(kvg_session_kind_of(m)->caps & KVG_CAN_TOKEN_JOBS))
            return kvg_session_can(m, NULL, KVG_CAN_TOKEN_JOBS, "kvgen_job_submit", err);
        if (d->n_tokens > 0 && !d->tokens)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_job_submit: tokens is NULL");
        for (size_t i = 0; i < d->n_tokens; i++)
            if (d->tokens[i] < 0 || d->tokens[i] >= n_vocab)
                return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                                "kvgen_job_submit: token %zu: id %d is outside the vocabulary [0, %d)", i,
                                (int)d->tokens[i], n_vocab);
        if (d->n_tokens > 0) {
            j->tokens = kvg_malloc(d->n_tokens * sizeof *j->tokens);
            if (!j->tokens) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_job_submit: out of memory");
            memcpy(j->tokens, d->tokens, d->n_tokens * sizeof *j->tokens);
        }
        j->n_tokens = d->n_tokens;
        return KVGEN_OK;
    case KVGEN_PROMPT_TEXT: {
        if (!d->text) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_job_submit: text is NULL");
        if (d->tokenize_flags & ~(unsigned)(KVGEN_TOKENIZE_SPECIAL | KVGEN_TOKENIZE_ADD_BOS))
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_job_submit: tokenize_flags 0x%x", d->tokenize_flags);
        size_t len = d->text_len ? d->text_len : strlen(d->text), n = 0;
        if (kvg_session_kind_of(m)->add_text) { /* sent as text */
            if (!(j->text = kvg_memdup0(d->text, len))) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_job_submit: out of memory");
            j->text_len = len;
            return KVGEN_OK;
        }
        kvgen_error e2;
        kvgen_status st = kvgen_tokenize(m, d->text, len, d->tokenize_flags, NULL, 0, &n, &e2);
        if (st != KVGEN_OK && st != KVGEN_E_INVALID_ARGUMENT) {
            if (err) *err = e2;
            return st;
        }
        if (n > 0) {
            j->tokens = kvg_malloc(n * sizeof *j->tokens);
            if (!j->tokens) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_job_submit: out of memory");
            st = kvgen_tokenize(m, d->text, len, d->tokenize_flags, j->tokens, n, &j->n_tokens, err);
            if (st != KVGEN_OK) return st;
        }
        return KVGEN_OK;
    }
    case KVGEN_PROMPT_CHAT:
        if (d->role && strcmp(d->role, "system") != 0 && strcmp(d->role, "user") != 0 &&
            strcmp(d->role, "assistant") != 0 && strcmp(d->role, "tool") != 0)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                            "kvgen_job_submit: role \"%s\" (system, user, assistant or tool; NULL: only open the "
                            "reply)",
                            d->role);
        if (d->role && !d->text)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_job_submit: a chat turn needs text");
        if (d->role && !(j->role = kvg_memdup0(d->role, strlen(d->role))))
            return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_job_submit: out of memory");
        if (d->text) {
            size_t len = d->text_len ? d->text_len : strlen(d->text);
            if (memchr(d->text, 0, len))
                return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_job_submit: chat text contains a NUL byte");
            if (!(j->text = kvg_memdup0(d->text, len)))
                return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_job_submit: out of memory");
        }
        return KVGEN_OK;
    }
    return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_job_submit: prompt %d is not a kvgen_prompt_kind",
                    (int)d->prompt);
}

/* A chat job's template variables: checked as kvgen_chat_set_vars checks them, kept compact. */
static kvgen_status copy_vars(kvgen_job *j, const kvgen_model *m, const kvgen_job_desc *d, kvgen_error *err) {
    if (!d->chat_vars) return KVGEN_OK;
    if (d->prompt != KVGEN_PROMPT_CHAT)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_job_submit: chat_vars: only a chat job "
                        "(KVGEN_PROMPT_CHAT) takes them, not prompt %d", (int)d->prompt);
    kvgen_status st = kvg_session_can(m, NULL, KVG_CAN_CHAT_TEMPLATE, "kvgen_job_submit: chat_vars", err);
    if (st == KVGEN_OK) st = kvg_chat_vars_check(d->chat_vars, "kvgen_job_submit", "chat_vars", &j->vars, err);
    j->has_vars = st == KVGEN_OK;
    return st;
}

/* ---- the worker object ------------------------------------------------------------------- */

static void *worker_main(void *arg);
static void kvg_worker_stop(kvgen_model *m);
static void kvg_worker_session_closing(kvgen_session *s);
static void worker_free(void *value);

/* the model's worker, hung on it (kvg_model_attach) at the first submit or configure */
static const kvg_attach_key worker_key = {"jobs worker", worker_free};

static kvg_worker *model_worker(const kvgen_model *m) { return kvg_model_attached(m, &worker_key); }

static kvg_worker *get_worker(kvgen_model *m, kvgen_error *err) {
    kvg_worker *w = model_worker(m);
    if (w) return w;
    w = kvg_calloc(1, sizeof *w);
    if (!w) {
        kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen jobs: out of memory");
        return NULL;
    }
    w->m = m;
    w->kind = kvg_session_kind_of(m);
    w->replies = kvg_session_kind_replies(w->kind);
    kvg_mutex_init(&w->mu);
    kvg_cond_init(&w->wake);
    kvg_cond_init(&w->stepped);
    kvg_worker *there = kvg_model_attach(m, &worker_key, w);
    if (there != w) { /* another thread attached one first, or memory ran out */
        worker_free(w);
        if (!there) kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen jobs: out of memory");
        return there;
    }
    /* from now on model_free stops it first, and a session close makes it let go of the session */
    __atomic_store_n(&m->on_session_close, kvg_worker_session_closing, __ATOMIC_RELEASE);
    __atomic_store_n(&m->on_unload, kvg_worker_stop, __ATOMIC_RELEASE);
    return w;
}

static void unlink_job(kvg_worker *w, kvgen_job *j) {
    if (j->prev) j->prev->next = j->next;
    else w->head = j->next;
    if (j->next) j->next->prev = j->prev;
    else w->tail = j->prev;
    j->prev = j->next = NULL;
}

/* model_free's first step (on_unload): the thread joined and the jobs left freed, before any
 * other state of the model goes; worker_free frees the rest with the model's attachments */
static void kvg_worker_stop(kvgen_model *m) {
    kvg_worker *w = model_worker(m);
    if (!w) return;
    kvg_mutex_lock(&w->mu);
    w->quit = true;
    kvg_cond_broadcast(&w->wake);
    kvg_mutex_unlock(&w->mu);
    if (w->started) kvg_thread_join(&w->thread);
    /* every job holds a model reference until released, so only released ones can be left */
    while (w->head) {
        kvgen_job *j = w->head;
        unlink_job(w, j);
        job_free(j);
    }
}

static void worker_free(void *value) {
    kvg_worker *w = value;
    kvg_free(w->plan);
    kvg_free(w->ride);
    kvg_free(w->ride_now);
    kvg_free(w->flush_ptrs);
    kvg_free(w->flush_counts);
    kvg_free(w->flush);
    kvg_free(w->flush_jobs);
    kvg_free(w->flush_tokens);
    kvg_free(w->flush_status);
    kvg_free(w->flush_errs);
    kvg_mutex_destroy(&w->mu);
    kvg_cond_destroy(&w->wake);
    kvg_cond_destroy(&w->stepped);
    kvg_free(w);
}

kvgen_status kvgen_jobs_configure(kvgen_model *m, const kvgen_jobs_desc *desc, kvgen_error *err) {
    if (!m) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_jobs_configure: model is NULL");
    kvgen_jobs_desc d = {0};
    if (desc) d = *desc;
    if (d.prefill_chunk < 0 || d.max_batch < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "kvgen_jobs_configure: prefill_chunk %d and max_batch %d must not be negative", d.prefill_chunk,
                        d.max_batch);
    kvg_worker *w = get_worker(m, err);
    if (!w) return KVGEN_E_NO_MEMORY;
    kvg_mutex_lock(&w->mu);
    w->cfg = d;
    kvg_mutex_unlock(&w->mu);
    return KVGEN_OK;
}

void kvgen_jobs_get_stats(kvgen_model *m, kvgen_jobs_stats *stats) {
    if (!stats) return;
    memset(stats, 0, sizeof *stats);
    kvg_worker *w = m ? model_worker(m) : NULL;
    if (!w) return;
    kvg_mutex_lock(&w->mu);
    *stats = w->stats;
    stats->worker_running = w->started && !w->quit;
    stats->jobs_active = 0;
    for (kvgen_job *j = w->head; j; j = j->next)
        if (!is_final(j->state)) stats->jobs_active++;
    kvg_mutex_unlock(&w->mu);
}

/* ---- host calls ----------------------------------------------------------------------------- */

kvgen_status kvgen_job_submit(kvgen_session *s, const kvgen_job_desc *desc, kvgen_job **out, kvgen_error *err) {
    if (out) *out = NULL;
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_job_submit: session is NULL");
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_job_submit: out is NULL");
    kvgen_job_desc d = {0};
    if (desc) d = *desc;
    kvgen_model *m = s->model;
    kvgen_job *j = kvg_calloc(1, sizeof *j);
    if (!j) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_job_submit: out of memory");
    kvgen_status st = copy_prompt(j, m, &d, err);
    if (st == KVGEN_OK) st = copy_vars(j, m, &d, err);
    if (st == KVGEN_OK) st = copy_gen(j, m, &d.gen, err);
    if (st == KVGEN_OK && !(kvg_buf_add(&j->host_text, "", 0) && kvg_buf_add(&j->out, "", 0) && kvg_buf_add(&j->wout, "", 0) &&
                            kvg_buf_add(&j->reason, "", 0) && kvg_buf_add(&j->wreason, "", 0)))
        st = kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_job_submit: out of memory");
    kvg_worker *w = NULL;
    if (st == KVGEN_OK && !(w = get_worker(m, err))) st = KVGEN_E_NO_MEMORY;
    if (st != KVGEN_OK) {
        job_free(j);
        return st;
    }
    j->model = m;
    j->w = w;
    j->s = s;
    j->owner = d.owner;
    j->user_data = d.user_data;
    j->priority = d.priority;
    j->state = KVGEN_JOB_QUEUED;
    j->t_start = j->t_first = j->t_last = j->t_end = -1;

    kvg_mutex_lock(&w->mu);
    if (!w->started) {
        if (w->quit || kvg_thread_create(&w->thread, worker_main, w) != 0) {
            kvg_mutex_unlock(&w->mu);
            job_free(j);
            return kvg_fail(err, KVGEN_E_INTERNAL, "kvgen_job_submit: cannot start the worker thread");
        }
        w->started = true;
    }
    __atomic_add_fetch(&m->refcount, 1, __ATOMIC_RELAXED); /* dropped by kvgen_job_release */
    __atomic_add_fetch(&s->jobs_active, 1, __ATOMIC_RELEASE); /* QUEUED: the session is the worker's */
    j->seq = ++w->seq;
    j->t_submit = now_ms();
    j->prev = w->tail;
    if (w->tail) w->tail->next = j;
    else w->head = j;
    w->tail = j;
    kvg_cond_signal(&w->wake);
    kvg_mutex_unlock(&w->mu);
    if (kvg_session_kind_of(m)->wakeup) kvg_session_kind_of(m)->wakeup(m); /* the worker may be waiting on the network */
    *out = j;
    return KVGEN_OK;
}

/* under w->mu, for a job the worker does not hold */
static void finish_now(kvgen_job *j, kvgen_job_state state, kvgen_finish why) {
    set_state(j, state);
    j->finish = why;
    j->t_end = now_ms();
}

static void cancel_locked(kvg_worker *w, kvgen_job *j) {
    if (is_final(j->state)) return;
    if (j->state == KVGEN_JOB_QUEUED && !j->in_step) {
        finish_now(j, KVGEN_JOB_CANCELLED, KVGEN_FINISH_CANCELLED); /* nothing ran: nothing to undo */
        return;
    }
    j->cancel = true;
    kvg_cond_signal(&w->wake);
    if (w->kind->wakeup) w->kind->wakeup(w->m);
}

void kvgen_job_cancel(kvgen_job *j) {
    if (!j) return;
    kvg_mutex_lock(&j->w->mu);
    cancel_locked(j->w, j);
    kvg_mutex_unlock(&j->w->mu);
}

void kvgen_job_release(kvgen_job *j) {
    if (!j) return;
    kvg_worker *w = j->w;
    kvgen_model *m = j->model;
    kvg_mutex_lock(&w->mu);
    j->released = true;
    cancel_locked(w, j);
    if (is_final(j->state) && !j->in_step) { /* else the worker's commit frees it */
        unlink_job(w, j);
        job_free(j);
    }
    kvg_mutex_unlock(&w->mu);
    kvg_model_release(m); /* may be the last reference: frees the model and joins the worker */
}

void kvgen_job_set_priority(kvgen_job *j, int priority) {
    if (!j) return;
    kvg_mutex_lock(&j->w->mu);
    j->priority = priority;
    kvg_mutex_unlock(&j->w->mu);
}

/* under w->mu: appends the worker's committed text to host_text (left in `out` if memory runs
 * out, for the next call) */
static void move_out(kvgen_job *j) {
    if (j->out.n > 0 && kvg_buf_add(&j->host_text, j->out.p, j->out.n)) {
        j->out.n = 0;
        j->out.p[0] = 0;
    }
}

/* under w->mu: the state a poll reports with the text it hands out. The worker commits a
 * step's text and its state together; polls and kvgen_job_text move the committed text to
 * host_text before they look, so a final state (a poll's, or kvgen_job_get_info's) is never
 * seen without its text. Only a move that ran out of memory leaves text in `out`, and then a
 * poll does not report the job final yet. */
static kvgen_job_state host_state(const kvgen_job *j) {
    return j->out.n > 0 && is_final(j->state) ? KVGEN_JOB_GENERATING : j->state;
}

/* under w->mu: hands the text not yet delivered by a poll to the host */
static bool take_news(kvgen_job *j, kvgen_event *ev) {
    move_out(j);
    kvgen_job_state st = host_state(j);
    bool final = is_final(st) && !j->final_reported; /* its event carries the last text */
    size_t at = j->delivered;
    if (j->host_text.n == at && !final) return false;
    j->delivered = j->host_text.n;
    if (final) j->final_reported = true;
    if (ev) {
        ev->job = j;
        ev->user_data = j->user_data;
        ev->state = st;
        ev->text = j->host_text.p + at;
        ev->len = j->host_text.n - at;
        ev->finished = final;
        ev->finish = final ? j->finish : KVGEN_FINISH_NONE;
    }
    return true;
}

kvgen_job_state kvgen_job_poll(kvgen_job *j, const char **text, size_t *len) {
    if (text) *text = "";
    if (len) *len = 0;
    if (!j) return KVGEN_JOB_FAILED;
    kvgen_event ev = {0};
    kvg_mutex_lock(&j->w->mu);
    bool news = take_news(j, &ev);
    kvgen_job_state st = host_state(j);
    kvg_mutex_unlock(&j->w->mu);
    if (news && text) *text = ev.text;
    if (news && len) *len = ev.len;
    return st;
}

const char *kvgen_job_text(const kvgen_job *cj, size_t *len) {
    if (len) *len = 0;
    if (!cj) return NULL;
    kvgen_job *j = (kvgen_job *)cj; /* const for the caller: it only takes in committed text */
    kvg_mutex_lock(&j->w->mu);
    move_out(j);
    if (len) *len = j->host_text.n;
    const char *text = j->host_text.p;
    kvg_mutex_unlock(&j->w->mu);
    return text;
}

const char *kvgen_job_reasoning(const kvgen_job *cj, size_t *len) {
    if (len) *len = 0;
    if (!cj) return NULL;
    kvgen_job *j = (kvgen_job *)cj; /* const for the caller: its copy is the host's own */
    kvg_mutex_lock(&j->w->mu);
    j->host_reason.n = 0;
    bool ok = kvg_buf_add(&j->host_reason, j->reason.p, j->reason.n);
    kvg_mutex_unlock(&j->w->mu);
    if (!ok) return NULL;
    if (len) *len = j->host_reason.n;
    return j->host_reason.p;
}

int kvgen_job_tool_calls(const kvgen_job *j, const kvgen_tool_call **calls) {
    if (calls) *calls = NULL;
    if (!j) return 0;
    kvg_mutex_lock(&j->w->mu);
    int n = is_final(j->state) && j->finish == KVGEN_FINISH_TOOL_CALLS ? j->n_calls : 0;
    kvg_mutex_unlock(&j->w->mu);
    if (calls && n > 0) *calls = j->calls;
    return n;
}

void kvgen_job_get_info(const kvgen_job *j, kvgen_job_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    info->state = KVGEN_JOB_FAILED;
    info->queue_ms = info->first_token_ms = info->total_ms = -1;
    if (!j) return;
    kvg_mutex_lock(&j->w->mu);
    info->state = j->state;
    info->finish = j->finish;
    info->error = j->error;
    info->priority = j->priority;
    info->prompt_tokens = j->prompt_total;
    info->prompt_done = j->prompt_done;
    info->n_tokens = j->n_gen;
    if (j->t_start >= 0) info->queue_ms = j->t_start - j->t_submit;
    if (j->t_first >= 0) info->first_token_ms = j->t_first - j->t_submit;
    if (j->t_end >= 0) info->total_ms = j->t_end - j->t_submit;
    if (j->n_gen >= 2 && j->t_last > j->t_first) info->tokens_per_s = (j->n_gen - 1) / ((j->t_last - j->t_first) / 1e3);
    kvg_mutex_unlock(&j->w->mu);
}

int kvgen_poll(kvgen_model *m, const void *owner, kvgen_event *events, int cap) {
    if (!m || !events || cap <= 0) return 0;
    kvg_worker *w = model_worker(m);
    if (!w) return 0;
    int n = 0;
    kvg_mutex_lock(&w->mu);
    /* two passes from where the last full call stopped, so no job waits behind others forever */
    for (int pass = 0; pass < 2 && n < cap; pass++)
        for (kvgen_job *j = w->head; j && n < cap; j = j->next) {
            if ((pass == 0) != (j->seq > w->poll_after) || j->owner != owner || j->released) continue;
            if (take_news(j, &events[n])) {
                n++;
                if (n == cap) w->poll_after = j->seq;
            }
        }
    if (n < cap) w->poll_after = 0;
    kvg_mutex_unlock(&w->mu);
    return n;
}

static void kvg_worker_session_closing(kvgen_session *s) {
    kvg_worker *w = model_worker(s->model);
    if (!w) return;
    kvg_mutex_lock(&w->mu);
    for (;;) {
        bool busy = false;
        for (kvgen_job *j = w->head; j; j = j->next)
            if (j->s == s) {
                j->detaching = true; /* the worker plans it no more */
                busy |= j->in_step;
            }
        if (!busy) break;
        kvg_cond_wait(&w->stepped, &w->mu); /* at most the one step that holds the session */
    }
    for (kvgen_job *j = w->head, *next; j; j = next) {
        next = j->next;
        if (j->s != s) continue;
        if (!is_final(j->state)) finish_now(j, KVGEN_JOB_CANCELLED, KVGEN_FINISH_CANCELLED);
        kvgen_gen_end(j->g); /* it points at the session */
        j->g = NULL;
        j->s = NULL;
        if (j->released) {
            unlink_job(w, j);
            job_free(j);
        }
    }
    if (w->replies) kvg_cond_signal(&w->wake); /* to close the requests ended here */
    kvg_mutex_unlock(&w->mu);
}

/* ---- the worker ------------------------------------------------------------------------------- */

/* Orders candidates: cancellations first (they are cheap and free their session), then
 * priority, then whoever was served longest ago, then submission order. */
static bool before(const kvgen_job *a, const kvgen_job *b) {
    if (a->cancel != b->cancel) return a->cancel;
    if (a->priority != b->priority) return a->priority > b->priority;
    if (a->last_served != b->last_served) return a->last_served < b->last_served;
    return a->seq < b->seq;
}

/* A job may run when it is the oldest unfinished job of its session. */
static bool is_head(const kvgen_job *j) {
    for (const kvgen_job *o = j->prev; o; o = o->prev)
        if (o->s == j->s && !is_final(o->state)) return false;
    return true;
}

typedef struct step_plan {
    kvgen_job *prefill;  /* one job to start or prefill a chunk of, or NULL */
    kvgen_job **decode;  /* generating jobs */
    int n_decode;
    kvgen_job **ride;    /* other waiting prompts, best first: started, and run with the decodes if short */
    int n_ride;
    int chunk;
} step_plan;

/* Under w->mu: chooses this step's work. False when there is none. */
static bool plan_step(kvg_worker *w, step_plan *p) {
    size_t n_jobs = 0;
    for (kvgen_job *j = w->head; j; j = j->next) n_jobs++;
    if (n_jobs > w->plan_cap) {
        kvgen_job **plan = kvg_realloc(w->plan, n_jobs * sizeof *plan);
        kvgen_session **flush = kvg_realloc(w->flush, n_jobs * sizeof *flush);
        kvgen_job **flush_jobs = kvg_realloc(w->flush_jobs, n_jobs * sizeof *flush_jobs);
        int32_t *tokens = kvg_realloc(w->flush_tokens, n_jobs * sizeof *tokens);
        kvgen_status *status = kvg_realloc(w->flush_status, n_jobs * sizeof *status);
        kvgen_error *errs = kvg_realloc(w->flush_errs, n_jobs * sizeof *errs);
        kvgen_job **ride = kvg_realloc(w->ride, n_jobs * sizeof *ride);
        kvgen_job **ride_now = kvg_realloc(w->ride_now, n_jobs * sizeof *ride_now);
        if (ride_now) w->ride_now = ride_now;
        const int32_t **ptrs = kvg_realloc(w->flush_ptrs, n_jobs * sizeof *ptrs);
        int *counts = kvg_realloc(w->flush_counts, n_jobs * sizeof *counts);
        if (ride) w->ride = ride;
        if (ptrs) w->flush_ptrs = ptrs;
        if (counts) w->flush_counts = counts;
        if (plan) w->plan = plan;
        if (flush) w->flush = flush;
        if (flush_jobs) w->flush_jobs = flush_jobs;
        if (tokens) w->flush_tokens = tokens;
        if (status) w->flush_status = status;
        if (errs) w->flush_errs = errs;
        if (!plan || !flush || !flush_jobs || !tokens || !status || !errs || !ride || !ride_now || !ptrs || !counts)
            return false; /* retried when the next job arrives */
        w->plan_cap = n_jobs;
    }
    int max_batch = w->cfg.max_batch > 0 ? w->cfg.max_batch : DEFAULT_MAX_BATCH;
    p->chunk = w->cfg.prefill_chunk > 0 ? w->cfg.prefill_chunk : DEFAULT_PREFILL_CHUNK;
    p->prefill = NULL;
    p->decode = w->plan;
    p->n_decode = 0;
    p->ride = w->ride;
    p->n_ride = 0;
    /* the jobs of a model whose sessions generate their replies themselves (a remote model's)
     * are requests: every running one is stepped (its reply read), and queued ones start while
     * fewer than its max_requests (remote_max_requests) are running */
    int slots = 0;
    if (w->replies) {
        max_batch = INT32_MAX;
        slots = w->kind->max_requests(w->m);
        for (kvgen_job *j = w->head; j; j = j->next)
            if (!is_final(j->state) && j->state != KVGEN_JOB_QUEUED) slots--;
    }
    for (kvgen_job *j = w->head; j; j = j->next) {
        if (is_final(j->state) || !j->s || j->detaching || !is_head(j)) continue;
        if (w->replies && j->state == KVGEN_JOB_QUEUED && !j->cancel && slots-- <= 0) continue;
        if (j->state == KVGEN_JOB_GENERATING || w->replies) {
            /* insertion into the sorted batch, keeping the best max_batch */
            int at = p->n_decode;
            while (at > 0 && before(j, p->decode[at - 1])) at--;
            if (at >= max_batch) continue;
            int n = p->n_decode < max_batch ? p->n_decode : max_batch - 1;
            memmove(p->decode + at + 1, p->decode + at, (size_t)(n - at) * sizeof *p->decode);
            p->decode[at] = j;
            if (p->n_decode < max_batch) p->n_decode++;
        } else {
            /* every waiting prompt, sorted; the best is the prefill job */
            int at = p->n_ride;
            while (at > 0 && before(j, p->ride[at - 1])) at--;
            memmove(p->ride + at + 1, p->ride + at, (size_t)(p->n_ride - at) * sizeof *p->ride);
            p->ride[at] = j;
            p->n_ride++;
        }
    }
    if (p->n_ride > 0) {
        p->prefill = p->ride[0];
        p->ride++;
        p->n_ride--;
    }
    int room = max_batch - (max_batch < p->n_decode ? max_batch : p->n_decode); /* the batch's rest */
    if (p->n_ride > room) p->n_ride = room;
    /* such a model also steps to close the requests of sessions that closed */
    if (!p->prefill && p->n_decode == 0) return w->replies && w->kind->has_freed(w->m);
    w->step_no++;
    if (p->prefill) p->prefill->in_step = true;
    for (int i = 0; i < p->n_decode; i++) p->decode[i]->in_step = true;
    for (int i = 0; i < p->n_ride; i++) p->ride[i]->in_step = p->ride[i]->wrider = true;
    for (kvgen_job *j = w->head; j; j = j->next)
        if (j->in_step) {
            j->wcancel = j->cancel;
            j->wstate = j->state;
            j->wfinish = j->finish;
            j->werr = j->error;
            j->wprompt_total = j->prompt_total;
            j->wprompt_done = j->prompt_done;
            j->wn_gen = j->n_gen;
            j->wt_start = j->t_start;
            j->wt_first = j->t_first;
            j->wt_last = j->t_last;
            j->wt_end = j->t_end;
            if (!j->wrider) j->last_served = w->step_no;
        }
    return true;
}

/* A "tool_calls" finish: the calls copied out of the generator, in one allocation. */
static void keep_calls(kvgen_job *j) {
    const kvgen_tool_call *calls = NULL;
    int n = j->g ? kvgen_gen_tool_calls(j->g, &calls) : 0;
    if (n <= 0) return;
    size_t size = (size_t)n * sizeof *calls;
    for (int i = 0; i < n; i++) size += str_size(calls[i].id) + str_size(calls[i].name) + str_size(calls[i].arguments);
    kvgen_tool_call *kept = kvg_malloc(size);
    if (!kept) return; /* the finish stands; the calls read as none */
    char *at = (char *)(kept + n);
    for (int i = 0; i < n; i++) {
        kept[i].id = str_put(&at, calls[i].id);
        kept[i].name = str_put(&at, calls[i].name);
        kept[i].arguments = str_put(&at, calls[i].arguments);
    }
    j->calls = kept;
    j->n_calls = n;
}

static void end_job(kvgen_job *j, kvgen_job_state state, kvgen_finish why) {
    kvgen_session *s = j->s;
    if (why == KVGEN_FINISH_TOOL_CALLS) keep_calls(j);
    kvgen_gen_end(j->g);
    kvg_tools_free(j->wtools);
    j->wtools = NULL;
    j->g = NULL;
    if ((j->wn_gen == 0 && state == KVGEN_JOB_CANCELLED) ||
        (state == KVGEN_JOB_FAILED && (j->wn_gen == 0 || kvg_session_kind_replies(s->kind)))) {
        /* nothing was generated, or a request for a reply failed (its reply is not kept): take the
         * prompt back, so the session is as it was */
        size_t len = kvgen_session_length(s);
        if (len > j->len_before) kvgen_session_rewind(s, len - j->len_before, NULL);
        if (j->chat_saved) {
            kvg_chat_return_to(s, j->chat_before);
            j->chat_before = NULL;
            j->chat_saved = false;
        }
        /* the turn re-rendered earlier text and rewound below it: those tokens go back in */
        len = kvgen_session_length(s);
        if (j->kept && j->n_kept > len) kvgen_session_prefill(s, j->kept + len, j->n_kept - len, NULL, NULL);
    }
    j->wstate = state;
    j->wfinish = why;
    j->wt_end = now_ms();
}

static void fail_job(kvgen_job *j, const kvgen_error *e) {
    j->werr = *e;
    if (j->werr.status == KVGEN_OK) j->werr.status = KVGEN_E_INTERNAL;
    end_job(j, KVGEN_JOB_FAILED, KVGEN_FINISH_ERROR);
}

/* QUEUED -> PREFILLING: builds the prompt (a chat turn is applied now, after the session's
 * earlier jobs, its tokens kept for chunked prefill). */
static bool start_job(kvgen_job *j, kvgen_error *e) {
    kvgen_session *s = j->s;
    j->wt_start = now_ms();
    j->len_before = kvgen_session_length(s);
    j->prompt_toks.n = 0;
    kvgen_status st = KVGEN_OK;
    if (j->prompt == KVGEN_PROMPT_CHAT) {
        kvg_free(j->kept);
        j->n_kept = j->len_before;
        j->kept = j->n_kept ? kvg_malloc(j->n_kept * sizeof *j->kept) : NULL;
        if (j->n_kept && !j->kept) st = kvg_fail(e, KVGEN_E_NO_MEMORY, "kvgen job: out of memory");
        else if (j->n_kept) memcpy(j->kept, kvgen_session_tokens(s), j->n_kept * sizeof *j->kept);
        if (st == KVGEN_OK) st = kvg_chat_mark(s, &j->chat_before, e);
        if (st == KVGEN_OK) {
            j->chat_saved = true;
            /* the turn's variables, in place of the session's (the mark puts those back) */
            if (j->has_vars) st = kvgen_chat_set_vars(s, j->vars, e);
            if (st == KVGEN_OK && j->gen.tools) st = kvg_chat_offer_tools(s, j->gen.tools, "kvgen job", &j->wtools, e);
            if (st == KVGEN_OK) st = kvg_chat_begin_tokens(s, j->role, j->text, &j->prompt_toks, e);
            /* a turn that changed the rendered prefix rewound the cache to where they agree */
            j->len_before = kvgen_session_length(s);
        }
    } else if (j->n_tokens > 0) {
        j->prompt_toks.v = kvg_malloc(j->n_tokens * sizeof *j->prompt_toks.v);
        if (!j->prompt_toks.v) st = kvg_fail(e, KVGEN_E_NO_MEMORY, "kvgen job: out of memory");
        else memcpy(j->prompt_toks.v, j->tokens, j->n_tokens * sizeof *j->tokens);
        j->prompt_toks.n = j->prompt_toks.cap = j->n_tokens;
    }
    j->wprompt_total = j->prompt_toks.n;
    j->wprompt_done = 0;
    j->wstate = KVGEN_JOB_PREFILLING;
    return st == KVGEN_OK;
}

/* PREFILLING -> GENERATING, once the whole prompt ran */
static void begin_generating(kvgen_job *j) {
    kvgen_error e = {0};
    kvgen_status st;
    if (j->prompt == KVGEN_PROMPT_CHAT) { /* read at its end: reasoning, calls */
        st = kvg_chat_reply_gen(j->s, &j->gen, j->wtools, "kvgen job", &j->g, &e);
        j->wtools = NULL;
    } else {
        st = kvgen_gen_begin(j->s, &j->gen, &j->g, &e);
    }
    if (st != KVGEN_OK) {
        fail_job(j, &e);
        return;
    }
    j->wstate = KVGEN_JOB_GENERATING;
}

/* A waiting job started (a QUEUED one's prompt built): how many prompt tokens it has left to
 * run, or -1 when it has none (it ended, cancelled or failed, or began generating). */
static int prompt_left(kvgen_job *j) {
    kvgen_error e = {0};
    if (j->wcancel) {
        end_job(j, KVGEN_JOB_CANCELLED, KVGEN_FINISH_CANCELLED);
        return -1;
    }
    if (j->wstate == KVGEN_JOB_QUEUED && !start_job(j, &e)) {
        fail_job(j, &e);
        return -1;
    }
    size_t left = j->wprompt_total - j->wprompt_done;
    if (left == 0) {
        begin_generating(j);
        return -1;
    }
    return left > (size_t)INT32_MAX ? INT32_MAX : (int)left;
}

/* One chunk of a started job's prompt on its own (a prompt longer than the step's budget). */
static void prefill_chunk(kvg_worker *w, kvgen_job *j, int left, int chunk) {
    kvgen_error e = {0};
    size_t n = left < chunk ? (size_t)left : (size_t)chunk;
    if (kvgen_session_prefill(j->s, j->prompt_toks.v + j->wprompt_done, n, NULL, &e) != KVGEN_OK) {
        fail_job(j, &e);
        return;
    }
    j->wprompt_done += n;
    w->wstats.prefill_chunks++;
    if (j->wprompt_done == j->wprompt_total) begin_generating(j);
}

/* The step's prompts: the chosen one and then the other riders, best first, are started; each
 * whose rest fits what is left of the budget of `chunk` tokens joins riders[] (its rest runs
 * in the batch); the chosen one, if longer, runs a chunk on its own. Returns the riders. */
static int plan_prompts(kvg_worker *w, step_plan *p, kvgen_job **riders) {
    int budget = p->chunk, nr = 0;
    if (p->prefill) {
        int left = prompt_left(p->prefill);
        if (left > 0 && left <= budget) {
            riders[nr++] = p->prefill;
            budget -= left;
        } else if (left > 0) {
            prefill_chunk(w, p->prefill, left, p->chunk);
            budget = 0;
        }
    }
    for (int i = 0; i < p->n_ride; i++) {
        kvgen_job *j = p->ride[i];
        if (budget <= 0 && !j->wcancel) continue; /* untouched until a later step */
        int left = prompt_left(j);
        if (left > 0 && left <= budget) {
            riders[nr++] = j;
            budget -= left;
        }
    }
    return nr;
}

/* A job's step text: appended to what the host will see at commit. */
static void add_step_text(kvgen_job *j, kvgen_status st, const kvgen_gen_step *step, const kvgen_error *e) {
    if (step->token >= 0) {
        double t = now_ms();
        if (j->wn_gen == 0) j->wt_first = t;
        j->wt_last = t;
        j->wn_gen++;
    }
    if (st != KVGEN_OK) {
        fail_job(j, e);
    } else if ((step->len > 0 && !kvg_buf_add(&j->wout, step->text, step->len)) ||
               (step->reasoning_len > 0 && !kvg_buf_add(&j->wreason, step->reasoning, step->reasoning_len))) {
        kvgen_error oom = {KVGEN_E_NO_MEMORY, "kvgen job: out of memory for its text"};
        fail_job(j, &oom);
    }
}

/* Every generating job samples; their tokens and the riders' prompts run as one batch; each
 * generating job commits its token, each rider whose prompt ran begins generating. */
static void decode_step(kvg_worker *w, kvgen_job **jobs, int n, kvgen_job **riders, int nr) {
    kvgen_gen_step step[1];
    int nb = 0;
    for (int i = 0; i < n; i++) {
        kvgen_job *j = jobs[i];
        kvgen_error e = {0};
        int32_t tok;
        if (j->wcancel) kvgen_gen_cancel(j->g);
        kvgen_status st = kvg_gen_sample(j->g, step, &tok, &e);
        if (tok < 0) { /* over: finished, cancelled or failed before a token */
            add_step_text(j, st, step, &e);
            continue;
        }
        w->flush[nb] = j->s;
        w->flush_jobs[nb] = j;
        w->flush_tokens[nb] = tok;
        w->flush_ptrs[nb] = &w->flush_tokens[nb];
        w->flush_counts[nb++] = 1;
    }
    int nd = nb; /* the decodes, then the riders */
    for (int i = 0; i < nr; i++) {
        kvgen_job *j = riders[i];
        w->flush[nb] = j->s;
        w->flush_jobs[nb] = j;
        w->flush_ptrs[nb] = j->prompt_toks.v + j->wprompt_done;
        w->flush_counts[nb++] = (int)(j->wprompt_total - j->wprompt_done);
    }
    if (nb > 0)
        kvg_session_run_batch(w->flush, w->flush_ptrs, w->flush_counts, nb, false, w->flush_status, w->flush_errs);
    for (int a = nd; a < nb; a++) {
        kvgen_job *j = w->flush_jobs[a];
        j->wserved = true;
        if (w->flush_status[a] != KVGEN_OK) {
            fail_job(j, &w->flush_errs[a]);
            continue;
        }
        j->wprompt_done = j->wprompt_total;
        w->wstats.prefill_chunks++;
        w->wstats.prompts_batched++;
        begin_generating(j);
    }
    nb = nd;
    int ran = 0;
    for (int a = 0; a < nb; a++) ran += w->flush_status[a] == KVGEN_OK;
    if (ran > 0) {
        w->wstats.batches++;
        w->wstats.batched_tokens += (uint64_t)ran;
        if (ran > w->wstats.max_batch_seen) w->wstats.max_batch_seen = ran;
    }
    for (int a = 0; a < nb; a++) {
        kvgen_job *j = w->flush_jobs[a];
        kvgen_error e = {0};
        kvgen_status st = kvg_gen_commit(j->g, step, w->flush_tokens[a], w->flush_status[a], &w->flush_errs[a], &e);
        add_step_text(j, st, step, &e);
    }
    for (int i = 0; i < n; i++) {
        kvgen_job *j = jobs[i];
        if (!j->g || is_final(j->wstate)) continue;
        kvgen_finish f = kvgen_gen_finish(j->g);
        if (f == KVGEN_FINISH_NONE) continue;
        end_job(j, f == KVGEN_FINISH_CANCELLED ? KVGEN_JOB_CANCELLED : KVGEN_JOB_DONE, f);
    }
}

/* The step of a model whose sessions generate their replies themselves (a remote model's):
 * queued jobs start their requests (the turn or text joins the session), the kind's drive runs
 * the transfers until news arrives (at most a short wait), and every running job takes its
 * reply's new text. */
static void reply_step(kvg_worker *w, kvgen_job **jobs, int n) {
    kvgen_gen_step step[1];
    int started = 0;
    for (int i = 0; i < n; i++) {
        kvgen_job *j = jobs[i];
        if (j->wstate != KVGEN_JOB_QUEUED) continue;
        if (j->wcancel) {
            end_job(j, KVGEN_JOB_CANCELLED, KVGEN_FINISH_CANCELLED);
            continue;
        }
        kvgen_error e = {0};
        kvgen_session *s = j->s;
        j->wt_start = now_ms();
        j->len_before = kvgen_session_length(s);
        kvgen_status st = KVGEN_OK;
        if (j->prompt == KVGEN_PROMPT_CHAT) st = kvgen_chat_begin(s, j->role, j->text, &e);
        else if (j->prompt == KVGEN_PROMPT_TEXT) st = s->kind->add_text(s, j->text, j->text_len, false, "kvgen job", &e);
        if (st == KVGEN_OK) st = kvgen_gen_begin(s, &j->gen, &j->g, &e);
        if (st != KVGEN_OK) {
            fail_job(j, &e);
            continue;
        }
        j->wprompt_total = j->wprompt_done = kvgen_session_length(s) - j->len_before;
        j->wstate = KVGEN_JOB_GENERATING;
        started++;
    }
    w->kind->drive(w->m, started ? 0 : 50);
    for (int i = 0; i < n; i++) {
        kvgen_job *j = jobs[i];
        if (j->wstate != KVGEN_JOB_GENERATING || !j->g) continue;
        if (j->wcancel) kvgen_gen_cancel(j->g);
        kvgen_error e = {0};
        int pieces = 0;
        kvgen_status st = kvg_gen_reply_step(j->g, 0, step, &pieces, &e);
        if (pieces > 0) {
            double t = now_ms();
            if (j->wn_gen == 0) j->wt_first = t;
            j->wt_last = t;
            j->wn_gen += pieces;
        }
        step->token = -1; /* counted above */
        add_step_text(j, st, step, &e);
        if (is_final(j->wstate)) continue;
        kvgen_finish f = kvgen_gen_finish(j->g);
        if (f != KVGEN_FINISH_NONE) end_job(j, f == KVGEN_FINISH_CANCELLED ? KVGEN_JOB_CANCELLED : KVGEN_JOB_DONE, f);
    }
    w->wstats.batches++;
}

/* Under w->mu: publishes the step. */
static void commit_step(kvg_worker *w) {
    for (kvgen_job *j = w->head, *next; j; j = next) {
        next = j->next;
        if (!j->in_step) continue;
        j->in_step = false;
        if (j->wserved) j->last_served = w->step_no;
        j->wrider = j->wserved = false;
        if (j->wout.n > 0) {
            if (kvg_buf_add(&j->out, j->wout.p, j->wout.n)) j->wout.n = 0;
        }
        if (j->wreason.n > 0 && kvg_buf_add(&j->reason, j->wreason.p, j->wreason.n)) j->wreason.n = 0;
        if (j->wn_gen > j->n_gen) w->stats.decode_tokens += (uint64_t)(j->wn_gen - j->n_gen);
        set_state(j, j->wstate);
        j->finish = j->wfinish;
        j->error = j->werr;
        j->prompt_total = j->wprompt_total;
        j->prompt_done = j->wprompt_done;
        j->n_gen = j->wn_gen;
        j->t_start = j->wt_start;
        j->t_first = j->wt_first;
        j->t_last = j->wt_last;
        j->t_end = j->wt_end;
        if (is_final(j->state) && j->released) {
            unlink_job(w, j);
            job_free(j);
        }
    }
    w->wstats.steps++;
    w->wstats.decode_tokens = w->stats.decode_tokens;
    w->stats = w->wstats;
}

static void *worker_main(void *arg) {
    kvg_worker *w = arg;
    kvg_session_worker_thread = w->m; /* its session calls are never refused as busy */
    kvg_mutex_lock(&w->mu);
    int nice_inc = w->cfg.nice == 0 ? DEFAULT_NICE : w->cfg.nice;
    /* per thread (Linux's nice value, Windows' thread priority): only the worker yields to the
     * host's thread; elsewhere nothing changes */
    if (nice_inc > 0) kvg_thread_nice(nice_inc);
    for (;;) {
        step_plan p;
        while (!w->quit && !plan_step(w, &p)) kvg_cond_wait(&w->wake, &w->mu);
        if (w->quit) break;
        kvg_mutex_unlock(&w->mu);
        if (w->replies) {
            reply_step(w, p.decode, p.n_decode);
        } else {
            int nr = plan_prompts(w, &p, w->ride_now);
            if (p.n_decode > 0 || nr > 0) decode_step(w, p.decode, p.n_decode, w->ride_now, nr);
        }
        kvg_mutex_lock(&w->mu);
        commit_step(w);
        kvg_cond_broadcast(&w->stepped);
    }
    kvg_mutex_unlock(&w->mu);
    return NULL;
}
