/* generate.c: step-wise generation with stop conditions (end-of-generation tokens, max_tokens,
 * stop strings across token boundaries, cancel, context full, a sentence's end past
 * soft_max_tokens), constrained output, and the public sampler settings calls.
 *
 * Every sampled token is decoded into the session before its step returns, so the session's
 * logits are ready for the next step and, whatever ends the generation, the cache holds
 * exactly the tokens that were sampled. (About 1,000 lines: stop strings, constraints, a
 * thinking budget and a tool call's grammar all act on the same step, which stays in one
 * place.) */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include "kvg_constrain.h"
#include "kvg_generate.h"
#include "kvg_grammar.h"
#include "kvg_model.h"
#include "kvg_sampler.h"
#include "kvg_sentence.h"
#include "kvg_session.h"
#include "kvg_spell.h"
#include "kvg_str.h"
#include "kvg_toolcall.h"

#define DEFAULT_MAX_TOKENS 256

kvgen_status kvg_gen_check_desc(const kvgen_generate_desc *d, const char *who, const char *field, kvgen_error *err) {
    if (d->n_stop < 0 || d->n_stop > KVGEN_MAX_STOPS || (d->n_stop > 0 && !d->stop))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %sn_stop %d (0..%d, with a stop array)", who, field,
                        d->n_stop, KVGEN_MAX_STOPS);
    for (int i = 0; i < d->n_stop; i++)
        if (!d->stop[i] || !d->stop[i][0] || strlen(d->stop[i]) > KVGEN_MAX_STOP_LEN)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %sstop[%d] is NULL, empty or over %d bytes", who,
                            field, i, KVGEN_MAX_STOP_LEN);
    if (d->flags & ~(unsigned)KVGEN_TOKENIZE_SPECIAL)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %sflags 0x%x (only KVGEN_TOKENIZE_SPECIAL)", who, field,
                        d->flags);
    if (d->soft_max_tokens < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %ssoft_max_tokens %d (0: off, or > 0)", who, field,
                        d->soft_max_tokens);
    if (d->tools)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: %stools: only kvgen_chat_gen_begin takes tools", who, field);
    if (d->thinking_budget < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %sthinking_budget %d (0: no limit, or > 0)", who, field,
                        d->thinking_budget);
    if (d->thinking_budget > 0 && d->constraint)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: %sthinking_budget with a constraint", who, field);
    if (d->soft_max_tokens > 0 && d->constraint)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "%s: %ssoft_max_tokens %d with a constraint (constrained text ends where it is complete)", who,
                        field, d->soft_max_tokens);
    return KVGEN_OK;
}

/* Where the bytes a chat reply emits go, under a template with think tags: the reply's start
 * (spaces, then its opening tag or not), the spaces that begin the reasoning, the reasoning,
 * the spaces after the closing tag, and the reply text, where no tag is looked for any more. */
enum { ROUTE_START, ROUTE_THINK_LEAD, ROUTE_THINK, ROUTE_AFTER, ROUTE_REPLY };

struct kvgen_gen {
    kvgen_session *s;
    const kvgen_model *m;
    int max_tokens; /* < 0: no limit */
    int soft_max_tokens; /* > 0: past this many, end where a sentence ends */
    /* every token's bytes: with soft_max_tokens (the next token's bytes decide) or a constraint
     * (a token's bytes are fed to it) */
    const kvg_token_bytes *pieces;
    char **stop;
    size_t *stop_len;
    int n_stop;
    bool ignore_eog;
    unsigned flags;
    kvg_cons *cons;
    kvg_cons_state cst;
    uint8_t *allowed; /* n_vocab, with a constraint */
    kvgen_detok detok;
    kvg_buf pending; /* decoded text not yet emitted: it may begin a stop string */
    kvg_buf text;    /* everything emitted */
    kvg_buf step;    /* what the current step emits */
    int n_tokens;
    kvgen_finish finish;
    int cancel;
    /* a generation by a session kind that generates its replies itself (a remote session's
     * server): the stream of its reply, the grammar it was sent and a local matcher over it
     * that checks the reply kept to it */
    void *stream;
    char *grammar;
    kvg_gram *gram;
    kvg_gram_match *gmatch;
    size_t checked; /* bytes of text + pending the matcher has seen */
    int n_events;   /* server events with text so far */
    kvg_buf ends;   /* where each event of the current step ends (size_t offsets) */
    size_t len0; /* the session's length when the generation began: a failure goes back to it */
    struct kvg_tools *tools; /* a chat reply that may call tools: read at its end */
    size_t tools_base;       /* the session's length at the reply's start: the calls' ids */
    kvg_reply_fn reply;      /* a chat reply: read at its end */
    const char *think_open, *think_close; /* static strings of the think-tag table, or NULL */
    kvg_buf reasoning;       /* what the reply thought, out of its text */
    int thinking_budget;     /* > 0: reasoning tokens before the closing tag is forced */
    int thinking;            /* 0: not (yet) reasoning; 1: reasoning (tokens counted); 2: done */
    int thought;             /* reasoning tokens so far */
    bool closing;            /* g->cons spells the closing tag, then goes away */
    /* the steps' channels (a reply with think tags): emitted bytes wait in `hold` until it is
     * known whether they are reasoning, a tag or reply text; `route` is where they stand */
    int route;
    kvg_buf hold;
    kvg_buf rstep; /* the reasoning the current step emits */
    size_t tools_scanned; /* bytes of text + pending searched for the call opener */
    size_t call_at;       /* where the call markup begins in text + pending (SIZE_MAX: none yet) */
    size_t calls_scanned; /* bytes of text + pending searched for a call's start */
    bool call_cut;        /* the reply ended inside its call markup, which was cut off */
    bool tools_lazy_done; /* the opener was found (the grammar took over, or could not) */
};

const char *kvgen_finish_name(kvgen_finish f) {
    switch (f) {
    case KVGEN_FINISH_NONE: return "none";
    case KVGEN_FINISH_STOP: return "stop";
    case KVGEN_FINISH_STOP_STRING: return "stop_string";
    case KVGEN_FINISH_LENGTH: return "length";
    case KVGEN_FINISH_CANCELLED: return "cancelled";
    case KVGEN_FINISH_CONTEXT_FULL: return "context_full";
    case KVGEN_FINISH_ERROR: return "error";
    case KVGEN_FINISH_DEAD_END: return "dead_end";
    case KVGEN_FINISH_SENTENCE: return "sentence";
    case KVGEN_FINISH_TOOL_CALLS: return "tool_calls";
    case KVGEN_FINISH_BAD_TOOL_CALL: return "bad_tool_call";
    }
    return "unknown";
}

kvgen_status kvgen_session_set_sampler(kvgen_session *s, const kvgen_sampler_desc *desc, kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_set_sampler: session is NULL");
    kvgen_status busy_ = kvg_session_check_host(s, "kvgen_session_set_sampler", err);
    if (busy_ != KVGEN_OK) return busy_;
    if (desc && desc->n_bias > 0) {
        kvgen_status can = kvg_session_can(s->model, s, KVG_CAN_BIAS, "kvgen_session_set_sampler", err);
        if (can != KVGEN_OK) return can;
    }
    return kvg_sampler_set(kvg_session_sampler(s), desc, false, err);
}

void kvgen_session_get_sampler(const kvgen_session *s, kvgen_sampler_desc *desc) {
    if (!desc) return;
    memset(desc, 0, sizeof *desc);
    if (s) kvg_sampler_get(kvg_session_sampler((kvgen_session *)s), desc);
}

void kvgen_gen_end(kvgen_gen *g) {
    if (!g) return;
    if (g->stream) g->s->kind->reply_free(g->stream);
    kvg_free(g->grammar);
    kvg_gram_match_free(g->gmatch);
    kvg_gram_free(g->gram);
    for (int i = 0; i < g->n_stop; i++) kvg_free(g->stop[i]);
    kvg_free(g->stop);
    kvg_free(g->stop_len);
    kvg_cons_free(g->cons);
    kvg_free(g->allowed);
    kvg_free(g->pending.p);
    kvg_free(g->text.p);
    kvg_free(g->step.p);
    kvg_free(g->ends.p);
    kvg_tools_free(g->tools);
    kvg_free(g->reasoning.p);
    kvg_free(g->hold.p);
    kvg_free(g->rstep.p);
    kvg_free(g);
}

void kvg_gen_attach_reply(kvgen_gen *g, struct kvg_tools *t, const char *think_open, const char *think_close,
                          bool thinking, kvg_reply_fn reply) {
    g->thinking = thinking && think_close ? 1 : 0;
    g->tools = t;
    g->call_at = t && kvg_tools_forced_grammar(t) ? 0 : SIZE_MAX;
    g->think_open = think_open;
    g->think_close = think_close;
    g->reply = reply;
    g->tools_base = kvgen_session_length(g->s);
    g->route = g->thinking ? ROUTE_THINK_LEAD : ROUTE_START;
}

const char *kvgen_gen_reasoning(const kvgen_gen *g, size_t *len) {
    if (len) *len = g && g->reasoning.p ? g->reasoning.n : 0;
    return g && g->reasoning.p ? g->reasoning.p : NULL;
}

int kvgen_gen_tool_calls(const kvgen_gen *g, const kvgen_tool_call **calls) {
    if (calls) *calls = NULL;
    if (!g || g->finish != KVGEN_FINISH_TOOL_CALLS) return 0;
    return kvg_tools_calls(g->tools, calls);
}

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* The longest end of b[0..n) that begins `tag` without being all of it. */
static size_t tag_start_at_end(const char *b, size_t n, const char *tag) {
    size_t k = strlen(tag) - 1;
    if (k > n) k = n;
    for (; k > 0; k--)
        if (memcmp(b + n - k, tag, k) == 0) return k;
    return 0;
}

/* byte i of text + pending */
static char text_byte(const kvgen_gen *g, size_t i) {
    return i < g->text.n ? g->text.p[i] : g->pending.p[i - g->text.n];
}

/* From this step on, the text is constrained by the grammar gbnf (a thinking budget's closing
 * tag, a tool call once its opener appeared): the matcher, the vocabulary's bytes and the mask,
 * the matcher started. */
static kvgen_status constrain_from_here(kvgen_gen *g, const char *gbnf, kvgen_error *err) {
    kvgen_constraint k = {.kind = KVGEN_CONSTRAIN_GRAMMAR, .grammar = gbnf};
    kvgen_status st = kvg_cons_build(&k, &g->cons, err);
    if (st == KVGEN_OK) st = kvg_vocab_bytes(g->m, &g->pieces, err);
    if (st == KVGEN_OK && !g->allowed && !(g->allowed = kvg_malloc((size_t)kvg_session_sampler(g->s)->n_vocab)))
        st = kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_gen_next: out of memory");
    if (st == KVGEN_OK) kvg_cons_start(g->cons, &g->cst);
    return st;
}

/* thinking_budget: counts the tokens of reasoning (from the opening tag, or from the start
 * when the prompt opened it) and, at the budget, forces the closing tag by a grammar that
 * goes away once it is out. */
static kvgen_status think_budget(kvgen_gen *g, kvgen_error *err) {
    if (g->thinking == 2 || g->closing) return KVGEN_OK;
    size_t n = g->text.n + g->pending.n, cn = strlen(g->think_close), on = strlen(g->think_open);
    bool closed = false, opened = false;
    for (size_t i = 0; i + cn <= n && !closed; i++) {
        size_t k = 0;
        while (k < cn && text_byte(g, i + k) == g->think_close[k]) k++;
        closed = k == cn;
    }
    for (size_t i = 0; g->thinking == 0 && i + on <= n && !opened; i++) {
        size_t k = 0;
        while (k < on && text_byte(g, i + k) == g->think_open[k]) k++;
        opened = k == on;
    }
    if (closed) {
        g->thinking = 2;
        return KVGEN_OK;
    }
    if (g->thinking == 0 && !opened) return KVGEN_OK;
    g->thinking = 1;
    if (++g->thought < g->thinking_budget) return KVGEN_OK;
    /* the closing tag, as GBNF (the tags are plain ASCII without quotes or backslashes) */
    char gbnf[96];
    snprintf(gbnf, sizeof gbnf, "root ::= \"\\n%s\\n\\n\"", g->think_close);
    kvgen_status st = constrain_from_here(g, gbnf, err);
    if (st != KVGEN_OK) return st;
    g->closing = true;
    g->thinking = 2;
    return KVGEN_OK;
}

static kvgen_status tools_trigger(kvgen_gen *g, kvgen_error *err);

/* tool_choice auto: where a call starts in the reply (its opener, or the JSON that begins one in
 * a format read at the end), so that from there on nothing streams (held_back). The scan goes
 * on from where the last one stopped; a format with a lazy grammar is then constrained too. */
static kvgen_status calls_scan(kvgen_gen *g, kvgen_error *err) {
    const char *marks[4];
    int nm = kvg_tools_call_marks(g->tools, marks);
    size_t n = g->text.n + g->pending.n, from = g->calls_scanned;
    for (int k = 0; k < nm; k++) {
        size_t mn = strlen(marks[k]);
        size_t i = from >= mn ? from - mn + 1 : 0;
        for (; i + mn <= n && i < g->call_at; i++) {
            size_t b = 0;
            while (b < mn && text_byte(g, i + b) == marks[k][b]) b++;
            if (b == mn) {
                g->call_at = i;
                break;
            }
        }
    }
    g->calls_scanned = n;
    return g->cons || g->tools_lazy_done ? KVGEN_OK : tools_trigger(g, err);
}

/* tool_choice auto: once the call opener is in the reply, the tools' grammar constrains the
 * rest as if it had been given from there (the bytes past the opener fed to it first). A reply
 * whose bytes past the opener the grammar refuses already stays free, and is read as a bad
 * call at its end. */
static kvgen_status tools_trigger(kvgen_gen *g, kvgen_error *err) {
    const char *opener = NULL;
    const char *gbnf = kvg_tools_lazy_grammar(g->tools, &opener);
    size_t n = g->text.n + g->pending.n, on = opener ? strlen(opener) : 0;
    if (!gbnf || on == 0 || n < on) return KVGEN_OK;
    size_t from = g->tools_scanned >= on ? g->tools_scanned - on + 1 : 0, at = n;
    for (size_t i = from; i + on <= n && at == n; i++) {
        size_t k = 0;
        while (k < on && text_byte(g, i + k) == opener[k]) k++;
        if (k == on) at = i;
    }
    g->tools_scanned = n;
    if (at == n) return KVGEN_OK;
    g->tools_lazy_done = true;
    g->call_at = at;
    kvgen_status st = constrain_from_here(g, gbnf, err);
    bool fits = st == KVGEN_OK;
    for (size_t i = at + on; fits && i < n; i++) fits = kvg_cons_feed(g->cons, &g->cst, (unsigned char)text_byte(g, i));
    if (!fits) { /* free text to the end */
        kvg_cons_free(g->cons);
        g->cons = NULL;
        kvg_free(g->allowed);
        g->allowed = NULL;
    }
    return st;
}

/* The reasoning between the think tags (the opening one may be the template's, before the
 * reply) leaves the text for g->reasoning; a reply cut inside it is reasoning alone. */
static bool take_reasoning(kvgen_gen *g) {
    const char *t = g->text.p, *close = strstr(t, g->think_close);
    size_t lead = 0, on = strlen(g->think_open);
    while (is_space(t[lead])) lead++;
    bool opened = strncmp(t + lead, g->think_open, on) == 0;
    if (!close && !opened && g->thinking != 1) return true; /* (1: the prompt opened it) */
    size_t from = opened ? lead + on : lead, to = close ? (size_t)(close - t) : g->text.n;
    while (from < to && is_space(t[from])) from++;
    while (to > from && is_space(t[to - 1])) to--;
    if (!kvg_buf_add(&g->reasoning, t + from, to - from)) return false;
    size_t rest = close ? (size_t)(close - t) + strlen(g->think_close) : g->text.n;
    while (rest < g->text.n && is_space(t[rest])) rest++;
    memmove(g->text.p, t + rest, g->text.n - rest);
    g->text.n -= rest;
    g->text.p[g->text.n] = '\0';
    return true;
}

/* A chat reply at its end: its reasoning out of the text; then, when it ended on its own, its
 * tool calls read (their markup leaves the text), and a reply that thought or called tools
 * goes into the conversation as the message it is, in place of the reply as generated. */
static kvgen_status read_reply(kvgen_gen *g, kvgen_error *err) {
    if (g->think_close && !take_reasoning(g)) {
        g->finish = KVGEN_FINISH_ERROR;
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_gen_next: out of memory");
    }
    if (g->finish != KVGEN_FINISH_STOP) {
        /* a call cut short is no call: the conversation keeps the text before it */
        kvgen_status st = g->call_cut ? g->reply(g->s, g->text.p, g->reasoning.p, NULL, err) : KVGEN_OK;
        if (st != KVGEN_OK) g->finish = KVGEN_FINISH_ERROR;
        return st;
    }
    kvgen_finish why = KVGEN_FINISH_NONE;
    size_t content = g->text.n;
    kvgen_status st = KVGEN_OK;
    if (g->tools) st = kvg_tools_parse(g->tools, g->text.p, g->text.n, g->tools_base, &why, &content, err);
    if (st != KVGEN_OK) {
        g->finish = KVGEN_FINISH_ERROR;
        return st;
    }
    /* the markup and the spaces before it, held back until the finish: out of the last step too */
    size_t cut = g->text.n - content;
    g->step.n = cut < g->step.n ? g->step.n - cut : 0;
    g->step.p[g->step.n] = '\0';
    g->text.n = content;
    g->text.p[content] = '\0';
    if (why != KVGEN_FINISH_NONE) g->finish = why;
    bool calls = why == KVGEN_FINISH_TOOL_CALLS;
    if (calls || g->reasoning.p)
        st = g->reply(g->s, g->text.p, g->reasoning.p, calls ? kvg_tools_calls_json(g->tools) : NULL, err);
    if (st != KVGEN_OK) g->finish = KVGEN_FINISH_ERROR;
    return st;
}

kvgen_status kvgen_generate_check(const kvgen_generate_desc *desc, kvgen_error *err) {
    if (!desc) return KVGEN_OK;
    kvgen_status st = kvg_gen_check_desc(desc, "kvgen_generate_check", "", err);
    if (st != KVGEN_OK || !desc->constraint) return st;
    kvg_cons *c = NULL;
    st = kvg_cons_build(desc->constraint, &c, err); /* validates it */
    kvg_cons_free(c);
    return st;
}

/* Checks the desc and builds the generator; touches nothing in the session that a prefill or
 * a generation would see (the token byte table it may build is a cache of the model's). The
 * logits are not needed yet: kvgen_gen_begin_prompt and kvgen_chat_gen_begin create the
 * generator before they append the prompt, so that nothing can fail after it. */
/* The desc's stop strings, copied into the generator. */
static kvgen_status copy_stops(kvgen_gen *g, const kvgen_generate_desc *d, const char *who, kvgen_error *err) {
    if (d->n_stop <= 0) return KVGEN_OK;
    g->stop = kvg_calloc((size_t)d->n_stop, sizeof *g->stop);
    g->stop_len = kvg_calloc((size_t)d->n_stop, sizeof *g->stop_len);
    if (!g->stop || !g->stop_len) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    for (int i = 0; i < d->n_stop; i++) {
        if (!(g->stop[i] = kvg_strdup(d->stop[i]))) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
        g->stop_len[i] = strlen(d->stop[i]);
        g->n_stop++;
    }
    return KVGEN_OK;
}

/* pending, text and step start as empty NUL-terminated buffers */
static kvgen_status init_text(kvgen_gen *g, const char *who, kvgen_error *err) {
    if (kvg_buf_add(&g->pending, "", 0) && kvg_buf_add(&g->text, "", 0) && kvg_buf_add(&g->step, "", 0) &&
        kvg_buf_add(&g->rstep, "", 0) && kvg_buf_add(&g->hold, "", 0))
        return KVGEN_OK;
    return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
}

static kvgen_status reply_create(kvgen_gen *g, const kvgen_generate_desc *d, kvgen_gen **out, const char *who,
                                 kvgen_error *err);

static kvgen_status gen_create(kvgen_session *s, const kvgen_generate_desc *desc, kvgen_gen **out, const char *who,
                               kvgen_error *err) {
    kvgen_generate_desc d = {0};
    if (desc) d = *desc;
    kvgen_status chk = kvg_gen_check_desc(&d, who, "", err);
    if (chk != KVGEN_OK) return chk;

    kvgen_gen *g = kvg_calloc(1, sizeof *g);
    if (!g) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    g->s = s;
    g->m = kvg_session_model(s);
    if (kvg_session_kind_replies(s->kind)) return reply_create(g, &d, out, who, err);
    g->ignore_eog = d.ignore_eog != 0;
    g->flags = d.flags;
    kvgen_status st = kvg_cons_build(d.constraint, &g->cons, err);
    /* a constraint bounds the length itself; free text gets the default limit */
    g->max_tokens = d.max_tokens != 0 ? d.max_tokens : g->cons ? -1 : DEFAULT_MAX_TOKENS;
    /* "no limit" means until the context is full, which a shifting session never is: there it
     * means at most one context's worth of tokens (finish "length") */
    if (g->max_tokens < 0 && s->on_full == KVGEN_ON_FULL_SHIFT) g->max_tokens = s->n_ctx;
    g->soft_max_tokens = d.soft_max_tokens;
    g->thinking_budget = d.thinking_budget;
    if (st == KVGEN_OK && g->soft_max_tokens > 0) st = kvg_vocab_bytes(g->m, &g->pieces, err);
    if (st == KVGEN_OK) st = copy_stops(g, &d, who, err);
    if (st == KVGEN_OK && g->cons) {
        kvg_cons_start(g->cons, &g->cst);
        g->allowed = kvg_malloc((size_t)kvg_session_sampler(s)->n_vocab);
        if (!g->allowed) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    }
    if (st == KVGEN_OK && g->cons) {
        st = kvg_vocab_bytes(g->m, &g->pieces, err);
        kvg_speller sp; /* a choice the vocabulary cannot spell exactly is refused here */
        kvg_speller_init(&sp, g->m);
        if (st == KVGEN_OK) st = kvg_cons_spell(g->cons, &sp, true, err);
        kvg_speller_free(&sp);
    }
    if (st == KVGEN_OK) st = init_text(g, who, err);
    if (st != KVGEN_OK) {
        kvgen_gen_end(g);
        return st;
    }
    kvgen_detok_init(&g->detok);
    g->detok.first = 0; /* a continuation keeps its leading space */
    *out = g;
    return KVGEN_OK;
}

static kvgen_status no_logits(const char *who, kvgen_error *err) {
    return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                    "%s: the session has no logits yet: prefill a prompt (or kvgen_chat_begin) first", who);
}

kvgen_status kvgen_gen_begin(kvgen_session *s, const kvgen_generate_desc *desc, kvgen_gen **out, kvgen_error *err) {
    if (out) *out = NULL;
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_gen_begin: session is NULL");
    kvgen_status busy_ = kvg_session_check_host(s, "kvgen_gen_begin", err);
    if (busy_ != KVGEN_OK) return busy_;
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_gen_begin: out is NULL");
    if (!kvg_session_kind_replies(s->kind) && !kvg_session_has_logits(s)) return no_logits("kvgen_gen_begin", err);
    return gen_create(s, desc, out, "kvgen_gen_begin", err);
}

kvgen_status kvgen_gen_begin_prompt(kvgen_session *s, const int32_t *prompt, size_t n, const kvgen_generate_desc *desc,
                                    kvgen_gen **out, kvgen_error *err) {
    if (out) *out = NULL;
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_gen_begin_prompt: session is NULL");
    kvgen_status busy_ = kvg_session_check_host(s, "kvgen_gen_begin_prompt", err);
    if (busy_ != KVGEN_OK) return busy_;
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_gen_begin_prompt: out is NULL");
    if (n > 0 && (busy_ = kvg_session_local_only(s, "kvgen_gen_begin_prompt", err)) != KVGEN_OK) return busy_;
    if (kvg_session_kind_replies(s->kind)) return gen_create(s, desc, out, "kvgen_gen_begin_prompt", err);
    if (n > 0 && !prompt) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_gen_begin_prompt: prompt is NULL");
    if (n == 0 && !kvg_session_has_logits(s)) return no_logits("kvgen_gen_begin_prompt", err);
    kvgen_gen *g = NULL;
    kvgen_status st = gen_create(s, desc, &g, "kvgen_gen_begin_prompt", err);
    if (st != KVGEN_OK) return st;
    /* the last step that can fail; a failed prefill leaves the session as it was */
    if (n > 0) st = kvgen_session_prefill(s, prompt, n, NULL, err);
    if (st != KVGEN_OK) {
        kvgen_gen_end(g);
        return st;
    }
    *out = g;
    return KVGEN_OK;
}

kvgen_status kvgen_gen_begin_text(kvgen_session *s, const char *text, size_t len, const kvgen_generate_desc *desc,
                                  kvgen_gen **out, kvgen_error *err) {
    const char *who = "kvgen_gen_begin_text";
    if (out) *out = NULL;
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: session is NULL", who);
    kvgen_status st = kvg_session_check_host(s, who, err);
    if (st != KVGEN_OK) return st;
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: out is NULL", who);
    if (len > 0 && !text) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: text is NULL", who);
    if (!s->kind->add_text) {
        /* tokenized as plain text, then all or nothing as kvgen_gen_begin_prompt */
        size_t n = 0;
        int32_t *ids = NULL;
        if (len > 0) {
            kvgen_error e2;
            st = kvgen_tokenize(s->model, text, len, 0, NULL, 0, &n, &e2);
            if (st != KVGEN_OK && !(st == KVGEN_E_INVALID_ARGUMENT && n > 0)) {
                if (err) *err = e2;
                return st;
            }
            if (n > 0 && !(ids = kvg_malloc(n * sizeof *ids))) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
            if (n > 0 && (st = kvgen_tokenize(s->model, text, len, 0, ids, n, &n, err)) != KVGEN_OK) {
                kvg_free(ids);
                return st;
            }
        }
        st = kvgen_gen_begin_prompt(s, ids, n, desc, out, err);
        kvg_free(ids);
        return st;
    }
    st = s->kind->add_text(s, text, len, true, who, err); /* a refusal (in a chat) comes first */
    if (st != KVGEN_OK) return st;
    kvgen_gen *g = NULL;
    st = gen_create(s, desc, &g, who, err);
    if (st == KVGEN_OK) st = s->kind->add_text(s, text, len, false, who, err);
    if (st != KVGEN_OK) {
        kvgen_gen_end(g);
        return st;
    }
    *out = g;
    return KVGEN_OK;
}

kvgen_status kvg_gen_create(kvgen_session *s, const kvgen_generate_desc *desc, kvgen_gen **out, const char *who,
                            kvgen_error *err) {
    if (out) *out = NULL;
    return gen_create(s, desc, out, who, err);
}

/* drops the first n bytes of b (NUL-terminated) */
static void buf_drop(kvg_buf *b, size_t n) {
    memmove(b->p, b->p + n, b->n - n + 1);
    b->n -= n;
}

/* Sends what waits in g->hold to the step's channels, as far as it is decided: the tags and
 * the spaces around the reasoning go nowhere (as take_reasoning cuts them out at the end), so
 * that the reasoning the steps give adds up to kvgen_gen_reasoning and their text to the reply
 * text. `last`: nothing follows, everything is decided. */
static bool route_held(kvgen_gen *g, bool last) {
    kvg_buf *h = &g->hold;
    for (;;) {
        size_t lead = 0;
        switch (g->route) {
        case ROUTE_START: {
            while (lead < h->n && is_space(h->p[lead])) lead++;
            size_t on = strlen(g->think_open), have = h->n - lead;
            if (have >= on && memcmp(h->p + lead, g->think_open, on) == 0) {
                buf_drop(h, lead + on);
                g->route = ROUTE_THINK_LEAD;
            } else if (!last && (have == 0 || (have < on && memcmp(h->p + lead, g->think_open, have) == 0))) {
                return true; /* undecided: spaces, or the beginning of the tag */
            } else {
                g->route = ROUTE_REPLY;
            }
            break;
        }
        case ROUTE_THINK_LEAD:
        case ROUTE_AFTER:
            while (lead < h->n && is_space(h->p[lead])) lead++;
            buf_drop(h, lead);
            if (h->n == 0) return true;
            g->route = g->route == ROUTE_AFTER ? ROUTE_REPLY : ROUTE_THINK;
            break;
        case ROUTE_THINK: {
            const char *close = strstr(h->p, g->think_close);
            size_t upto = close ? (size_t)(close - h->p) : h->n;
            if (!close && !last) upto -= tag_start_at_end(h->p, h->n, g->think_close);
            size_t out = upto;
            while (out > 0 && is_space(h->p[out - 1])) out--; /* the reasoning's end is trimmed */
            if (!kvg_buf_add(&g->rstep, h->p, out)) return false;
            if (close) {
                buf_drop(h, upto + strlen(g->think_close));
                g->route = ROUTE_AFTER;
                break;
            }
            buf_drop(h, last ? h->n : out); /* spaces that may end it and the tag's beginning wait */
            return true;
        }
        default: /* ROUTE_REPLY */
            if (!kvg_buf_add(&g->step, h->p, h->n)) return false;
            buf_drop(h, h->n);
            return true;
        }
    }
}

/* moves the first n pending bytes into the text and this step's channels; `last`: the
 * generation ends with them */
static bool emit_to(kvgen_gen *g, size_t n, bool last) {
    bool routed = g->think_close != NULL;
    if (!kvg_buf_add(routed ? &g->hold : &g->step, g->pending.p, n) || !kvg_buf_add(&g->text, g->pending.p, n))
        return false;
    buf_drop(&g->pending, n);
    return !routed || route_held(g, last);
}

static bool emit(kvgen_gen *g, size_t n) { return emit_to(g, n, false); }

/* The earliest complete stop string in pending: its offset, or -1. */
static long find_stop(const kvgen_gen *g) {
    long best = -1;
    for (int i = 0; i < g->n_stop; i++) {
        size_t k = g->stop_len[i];
        for (size_t at = 0; at + k <= g->pending.n; at++)
            if (memcmp(g->pending.p + at, g->stop[i], k) == 0) {
                if (best < 0 || (long)at < best) best = (long)at;
                break;
            }
    }
    return best;
}

/* Bytes at the end of pending that might begin a stop string: they wait for the next token. */
static size_t held_back(const kvgen_gen *g) {
    size_t hold = 0;
    if (g->tools) { /* tool-call markup is not streamed: a forced call, or a reply past a call's start */
        const char *marks[4];
        if (kvg_tools_forced_grammar(g->tools) || g->tools_lazy_done || g->call_at != SIZE_MAX) return g->pending.n;
        int n = kvg_tools_call_marks(g->tools, marks);
        for (int i = 0; i < n; i++) { /* what may begin one stays back until decided */
            size_t k = tag_start_at_end(g->pending.p, g->pending.n, marks[i]);
            if (k > hold) hold = k;
        }
        /* and the spaces before it, which the reply's text loses when a call follows */
        while (n > 0 && hold < g->pending.n && is_space(g->pending.p[g->pending.n - hold - 1])) hold++;
    }
    for (int i = 0; i < g->n_stop; i++) {
        size_t k = g->stop_len[i] - 1; /* a complete match was handled already */
        if (k > g->pending.n) k = g->pending.n;
        for (; k > hold; k--)
            if (memcmp(g->pending.p + g->pending.n - k, g->stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

static kvgen_status oom(kvgen_gen *g, kvgen_error *err) {
    g->finish = KVGEN_FINISH_ERROR;
    return kvg_fail(err, KVGEN_E_NO_MEMORY, "generate: out of memory");
}

/* Past soft_max_tokens, before `tok` (sampled, not decoded) goes in: does the text so far end a
 * sentence, with tok's bytes as what follows? An end-of-generation token is left to end the
 * reply itself; a character still incomplete in the detokenizer means the text goes on. */
static bool sentence_ended(const kvgen_gen *g, int32_t tok) {
    if (g->soft_max_tokens <= 0 || g->n_tokens < g->soft_max_tokens || g->detok.n_pending > 0) return false;
    if (kvgen_token_is_eog(g->m, tok) && !g->ignore_eog) return false;
    char tail[KVG_SENTENCE_TAIL];
    size_t from_pending = g->pending.n < sizeof tail ? g->pending.n : sizeof tail;
    size_t from_text = g->text.n < sizeof tail - from_pending ? g->text.n : sizeof tail - from_pending;
    memcpy(tail, g->text.p + g->text.n - from_text, from_text);
    memcpy(tail + from_text, g->pending.p + g->pending.n - from_pending, from_pending);
    const kvg_token_bytes *p = g->pieces;
    const char *next = "";
    size_t next_n = 0;
    if (tok < p->n) {
        next = (const char *)p->bytes + p->off[tok];
        next_n = p->off[tok + 1] - p->off[tok];
    }
    return kvg_sentence_ends(tail, from_text + from_pending, next, next_n);
}

/* A reply that ends other than on its own (length, a stop string, cancel) inside its tool-call
 * markup, or inside what may begin it: the markup, still held back, is dropped with the spaces
 * before it. */
static void cut_call(kvgen_gen *g) {
    if (!g->tools || !g->reply) return;
    size_t at = g->pending.n;
    if (g->call_at != SIZE_MAX) {
        at = g->call_at > g->text.n ? g->call_at - g->text.n : 0;
    } else { /* cut inside what may begin a call */
        const char *marks[4];
        int n = kvg_tools_call_marks(g->tools, marks);
        for (int i = 0; i < n; i++) {
            size_t k = tag_start_at_end(g->pending.p, g->pending.n, marks[i]);
            if (g->pending.n - k < at) at = g->pending.n - k;
        }
    }
    if (at >= g->pending.n) return;
    while (at > 0 && is_space(g->pending.p[at - 1])) at--;
    g->pending.n = at;
    g->pending.p[at] = 0;
    g->call_cut = true;
}

/* Ends the generation: flushes an unfinished character and emits what was held back. */
static kvgen_status finish(kvgen_gen *g, kvgen_finish why, kvgen_error *err) {
    char tail[8];
    size_t n = g->cons ? kvg_detok_flush_exact(&g->detok, tail, sizeof tail) /* exact bytes */
                       : kvgen_detok_flush(&g->detok, tail, sizeof tail);
    if (!kvg_buf_add(&g->pending, tail, n)) return oom(g, err);
    long at = find_stop(g);
    if (at >= 0) {
        g->pending.n = (size_t)at;
        why = KVGEN_FINISH_STOP_STRING;
    }
    if (why != KVGEN_FINISH_STOP && why != KVGEN_FINISH_ERROR) cut_call(g);
    if (!emit_to(g, g->pending.n, true)) return oom(g, err);
    g->finish = why;
    if (g->reply && why != KVGEN_FINISH_ERROR) return read_reply(g, err);
    return KVGEN_OK;
}

static void fill_step(const kvgen_gen *g, kvgen_gen_step *step, int32_t token) {
    if (!step) return;
    step->text = g->step.p;
    step->len = g->step.n;
    step->token = token;
    step->finish = g->finish;
    step->reasoning = g->rstep.p ? g->rstep.p : "";
    step->reasoning_len = g->rstep.n;
}

kvgen_status kvg_gen_sample(kvgen_gen *g, kvgen_gen_step *step, int32_t *token, kvgen_error *err) {
    *token = -1;
    if (step) *step = (kvgen_gen_step){.text = "", .token = -1, .finish = KVGEN_FINISH_ERROR, .reasoning = ""};
    if (!g) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_gen_next: gen is NULL");
    g->step.n = 0;
    g->step.p[0] = 0;
    g->rstep.n = 0;
    g->rstep.p[0] = 0;
    kvgen_status st = KVGEN_OK;
    if (g->finish != KVGEN_FINISH_NONE) {
        fill_step(g, step, -1);
        return KVGEN_OK;
    }
    if (__atomic_load_n(&g->cancel, __ATOMIC_ACQUIRE)) {
        st = finish(g, KVGEN_FINISH_CANCELLED, err);
        fill_step(g, step, -1);
        return st;
    }
    kvgen_session *s = g->s;
    if (!kvg_session_has_logits(s)) {
        g->finish = KVGEN_FINISH_ERROR;
        fill_step(g, step, -1);
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_gen_next: the session has no logits (was it used "
                        "by another call during the generation?)");
    }
    if (g->cons) {
        st = kvg_cons_select(g->cons, &g->cst, s, err); /* a choice: picked by its score */
        int n_allowed = 0;
        if (st == KVGEN_OK) st = kvg_cons_mask(g->cons, &g->cst, g->pieces, g->m, g->allowed, &n_allowed, err);
        if (st == KVGEN_OK && n_allowed == 0) {
            /* a dead end: no token continues the text (it is a prefix the constraint accepts) */
            st = finish(g, KVGEN_FINISH_DEAD_END, err);
            fill_step(g, step, -1);
            return st;
        }
        if (st != KVGEN_OK) {
            g->finish = KVGEN_FINISH_ERROR;
            fill_step(g, step, -1);
            return st;
        }
    }
    /* reads back from the device only what the sampler needs (one id for greedy) */
    int32_t tok = kvg_session_sample_masked(s, g->allowed);
    if (tok < 0) {
        g->finish = KVGEN_FINISH_ERROR;
        fill_step(g, step, -1);
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "generate: every token is banned by the logit bias");
    }
    if (sentence_ended(g, tok)) { /* tok would begin the next sentence: it is not decoded */
        st = finish(g, KVGEN_FINISH_SENTENCE, err);
        fill_step(g, step, -1);
        return st;
    }
    *token = tok;
    return KVGEN_OK;
}

kvgen_status kvgen_gen_next(kvgen_gen *g, kvgen_gen_step *step, kvgen_error *err) {
    if (g && kvg_session_kind_replies(g->s->kind)) { /* waits for the next piece of the reply, or its end */
        kvgen_status st;
        int pieces = 0;
        do st = kvg_gen_reply_step(g, 50, step, &pieces, err);
        while (st == KVGEN_OK && g->finish == KVGEN_FINISH_NONE && g->step.n == 0);
        return st;
    }
    int32_t tok;
    kvgen_status st = kvg_gen_sample(g, step, &tok, err);
    if (st != KVGEN_OK || tok < 0) return st;
    kvgen_error derr = {0};
    st = kvgen_session_decode(g->s, tok, &derr);
    return kvg_gen_commit(g, step, tok, st, &derr, err);
}

kvgen_status kvg_gen_commit(kvgen_gen *g, kvgen_gen_step *step, int32_t tok, kvgen_status decoded,
                            const kvgen_error *derr, kvgen_error *err) {
    kvgen_status st = decoded;
    if (st == KVGEN_E_CONTEXT_FULL) {
        st = finish(g, KVGEN_FINISH_CONTEXT_FULL, err); /* the token is dropped, not appended */
        fill_step(g, step, -1);
        return st;
    }
    if (st != KVGEN_OK) {
        if (err) *err = *derr;
        g->finish = KVGEN_FINISH_ERROR;
        fill_step(g, step, -1);
        return st;
    }
    g->n_tokens++;
    bool eog = kvgen_token_is_eog(g->m, tok) && (!g->ignore_eog || g->cons);
    if (eog) {
        st = finish(g, KVGEN_FINISH_STOP, err);
        fill_step(g, step, tok);
        return st;
    }
    if (g->cons) {
        const kvg_token_bytes *p = g->pieces;
        for (uint32_t i = p->off[tok]; i < p->off[tok + 1]; i++) kvg_cons_feed(g->cons, &g->cst, p->bytes[i]);
        /* the accepted bytes are the text, exactly (never U+FFFD) */
        if (!kvg_detok_exact(&g->detok, p->bytes + p->off[tok], p->off[tok + 1] - p->off[tok], &g->pending))
            return oom(g, err);
    }
    char piece[512];
    size_t n = g->cons ? 0 : kvgen_detok_push(g->m, &g->detok, tok, g->flags, piece, sizeof piece);
    if (n >= sizeof piece) { /* a very long token: ask again with room for it */
        char *big = kvg_malloc(n + 1);
        if (!big) return oom(g, err);
        n = kvgen_detok_push(g->m, &g->detok, tok, g->flags, big, n + 1);
        bool ok = kvg_buf_add(&g->pending, big, n);
        kvg_free(big);
        if (!ok) return oom(g, err);
    } else if (!kvg_buf_add(&g->pending, piece, n)) {
        return oom(g, err);
    }
    if (g->think_close && g->thinking_budget > 0) {
        st = think_budget(g, err);
        if (st != KVGEN_OK) {
            g->finish = KVGEN_FINISH_ERROR;
            fill_step(g, step, tok);
            return st;
        }
    }
    if (g->tools && g->call_at == SIZE_MAX) {
        st = calls_scan(g, err);
        if (st != KVGEN_OK) {
            g->finish = KVGEN_FINISH_ERROR;
            fill_step(g, step, tok);
            return st;
        }
    }
    long at = find_stop(g);
    if (at >= 0) {
        g->pending.n = (size_t)at;
        g->pending.p[at] = 0;
        cut_call(g);
        if (!emit_to(g, g->pending.n, true)) return oom(g, err);
        g->finish = KVGEN_FINISH_STOP_STRING;
        if (g->reply && (st = read_reply(g, err)) != KVGEN_OK) {
            fill_step(g, step, tok);
            return st;
        }
    } else if (g->closing && kvg_cons_done(g->cons, &g->cst)) { /* the closing tag is out: free again */
        kvg_cons_free(g->cons);
        g->cons = NULL;
        kvg_free(g->allowed);
        g->allowed = NULL;
        g->closing = false;
        if (!emit(g, g->pending.n - held_back(g))) return oom(g, err);
    } else if (g->cons && kvg_cons_done(g->cons, &g->cst)) {
        st = finish(g, KVGEN_FINISH_STOP, err);
    } else if (g->max_tokens >= 0 && g->n_tokens >= g->max_tokens) {
        st = finish(g, KVGEN_FINISH_LENGTH, err);
    } else if (!emit(g, g->pending.n - held_back(g))) {
        return oom(g, err);
    }
    fill_step(g, step, tok);
    return st;
}

void kvgen_gen_cancel(kvgen_gen *g) {
    if (g) __atomic_store_n(&g->cancel, 1, __ATOMIC_RELEASE);
}

const char *kvgen_gen_text(const kvgen_gen *g, size_t *len) {
    if (len) *len = g ? g->text.n : 0;
    return g ? g->text.p : NULL;
}

int kvgen_gen_n_tokens(const kvgen_gen *g) { return g ? g->n_tokens : 0; }

kvgen_finish kvgen_gen_finish(const kvgen_gen *g) { return g ? g->finish : KVGEN_FINISH_ERROR; }

kvgen_status kvgen_generate(kvgen_session *s, const kvgen_generate_desc *desc, char *out, size_t size, size_t *len,
                            kvgen_finish *fin, kvgen_error *err) {
    if (len) *len = 0;
    if (fin) *fin = KVGEN_FINISH_ERROR;
    if (out && size) out[0] = 0;
    kvgen_gen *g = NULL;
    kvgen_status st = kvgen_gen_begin(s, desc, &g, err);
    while (st == KVGEN_OK && g->finish == KVGEN_FINISH_NONE) st = kvgen_gen_next(g, NULL, err);
    if (g) {
        size_t n;
        const char *text = kvgen_gen_text(g, &n);
        if (out && size) {
            size_t k = n < size - 1 ? n : size - 1;
            memcpy(out, text, k);
            out[k] = 0;
        }
        if (len) *len = n;
        if (fin) *fin = g->finish;
    }
    kvgen_gen_end(g);
    return st;
}

/* ---- replies a session kind generates itself (a remote session's server) ------------------------
 * The kind samples (the server); kvgen sends the settings, reads the reply as it streams,
 * and applies what it promises itself: stop strings (never sent, so that each is seen and held
 * back here exactly as for a local model), max_tokens, soft_max_tokens, cancel, and a check of
 * constrained output against its grammar. One piece of the reply (one server event) stands for
 * one token. When the generation ends, its text joins the session (the history). */

/* a GBNF string literal of s */
static bool gbnf_literal(kvg_buf *b, const char *s, size_t n) {
    bool ok = kvg_buf_add(b, "\"", 1);
    for (size_t i = 0; ok && i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') snprintf(esc, sizeof esc, "\\%c", c);
        else if (c == '\n') snprintf(esc, sizeof esc, "\\n");
        else if (c == '\r') snprintf(esc, sizeof esc, "\\r");
        else if (c == '\t') snprintf(esc, sizeof esc, "\\t");
        else if (c < 32 || c == 127) snprintf(esc, sizeof esc, "\\x%02x", c);
        else esc[0] = (char)c, esc[1] = 0;
        ok = kvg_buf_add(b, esc, strlen(esc));
    }
    return ok && kvg_buf_add(b, "\"", 1);
}

static bool buf_str(kvg_buf *b, const char *s) { return kvg_buf_add(b, s, strlen(s)); }

/* The constraint as GBNF text: a grammar as given, a schema compiled, choices and JSON fields
 * written as the grammar of exactly what the local constraint accepts. */
static kvgen_status reply_grammar(const kvgen_constraint *k, char **out, const char *who, kvgen_error *err) {
    *out = NULL;
    if (!k || k->kind == KVGEN_CONSTRAIN_NONE) return KVGEN_OK;
    if (k->kind == KVGEN_CONSTRAIN_GRAMMAR) {
        if (!(*out = kvg_strdup(k->grammar))) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
        return KVGEN_OK;
    }
    if (k->kind == KVGEN_CONSTRAIN_SCHEMA) return kvg_schema_to_gbnf(k->schema, out, err);
    kvg_buf b = {0};
    bool ok = true;
    if (k->kind == KVGEN_CONSTRAIN_CHOICE) {
        ok = buf_str(&b, "root ::= ");
        for (int i = 0; ok && i < k->n_choices; i++)
            ok = (i == 0 || buf_str(&b, " | ")) && gbnf_literal(&b, k->choices[i], strlen(k->choices[i]));
    } else { /* KVGEN_CONSTRAIN_JSON */
        ok = buf_str(&b, "root ::= \"{\"");
        for (int i = 0; ok && i < k->n_fields; i++) {
            const kvgen_json_field *f = &k->fields[i];
            char key[600];
            snprintf(key, sizeof key, "%s\"%s\":", i ? "," : "", f->key);
            ok = buf_str(&b, " ") && gbnf_literal(&b, key, strlen(key)) && buf_str(&b, " ");
            if (ok && f->type == KVGEN_JSON_STRING) {
                char cls[80];
                snprintf(cls, sizeof cls, "\"\\\"\" [^\"\\\\\\x00-\\x1f]{0,%d} \"\\\"\"", f->max_len > 0 ? f->max_len : 64);
                ok = buf_str(&b, cls);
            } else if (ok && f->type == KVGEN_JSON_NUMBER) {
                ok = buf_str(&b, "\"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)?");
            } else if (ok) {
                ok = buf_str(&b, "(");
                for (int v = 0; ok && v < f->n_values; v++) {
                    char val[1100];
                    snprintf(val, sizeof val, "\"%s\"", f->values[v]);
                    ok = (v == 0 || buf_str(&b, " | ")) && gbnf_literal(&b, val, strlen(val));
                }
                ok = ok && buf_str(&b, ")");
            }
        }
        ok = ok && buf_str(&b, " \"}\"");
    }
    if (!ok || !kvg_buf_add(&b, "\n", 1)) {
        kvg_free(b.p);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    }
    *out = b.p;
    return KVGEN_OK;
}

static kvgen_status reply_create(kvgen_gen *g, const kvgen_generate_desc *d, kvgen_gen **out, const char *who,
                                 kvgen_error *err) {
    g->len0 = kvgen_session_length(g->s);
    g->ignore_eog = d->ignore_eog != 0;
    g->flags = d->flags;
    g->max_tokens = d->max_tokens != 0 ? d->max_tokens : d->constraint ? -1 : DEFAULT_MAX_TOKENS;
    g->soft_max_tokens = d->soft_max_tokens;
    kvgen_status st = kvg_cons_build(d->constraint, &g->cons, err); /* validates it as locally */
    kvg_cons_free(g->cons);
    g->cons = NULL;
    if (st == KVGEN_OK) st = reply_grammar(d->constraint, &g->grammar, who, err);
    if (st == KVGEN_OK && g->grammar) st = kvg_gram_parse(g->grammar, &g->gram, err);
    if (st == KVGEN_OK && g->gram) st = kvg_gram_match_new(g->gram, &g->gmatch, err);
    if (st == KVGEN_OK) st = copy_stops(g, d, who, err);
    if (st == KVGEN_OK) st = init_text(g, who, err);
    if (st != KVGEN_OK) {
        kvgen_gen_end(g);
        return st;
    }
    *out = g;
    return KVGEN_OK;
}

/* The reply so far joins the session (the kind's reply_commit: a chat's assistant message, or
 * the text and the stop string that ended it). */
static kvgen_status reply_commit(kvgen_gen *g, const char *stop, size_t stop_len, kvgen_error *err) {
    if (g->text.n == 0 && stop_len == 0 && g->finish == KVGEN_FINISH_CANCELLED)
        return KVGEN_OK; /* cancelled before anything came: no empty reply joins it */
    return g->s->kind->reply_commit(g->s, g->text.p, g->text.n, stop, stop_len, err);
}

/* A failed generation leaves the session as the call found it: it goes back to its length
 * before the prompt (or turn) that began the generation, and no reply joins it. */
static kvgen_status reply_fail(kvgen_gen *g, kvgen_status failed) {
    kvgen_session *s = g->s;
    g->finish = KVGEN_FINISH_ERROR;
    if (g->stream) s->kind->reply_free(g->stream);
    g->stream = NULL;
    size_t len = kvgen_session_length(s);
    if (len > g->len0) s->kind->rewind(s, len - g->len0, NULL);
    return failed;
}

/* Ends the generation of a reply: what was held back is emitted (up to a stop string), the
 * stream closes, and the reply joins the session (a failure: reply_fail). */
static kvgen_status reply_finish(kvgen_gen *g, kvgen_finish why, kvgen_status failed, kvgen_error *err) {
    long at = find_stop(g);
    const char *stop = NULL;
    size_t stop_len = 0;
    if (at >= 0) {
        for (int i = 0; i < g->n_stop; i++)
            if ((size_t)at + g->stop_len[i] <= g->pending.n && memcmp(g->pending.p + at, g->stop[i], g->stop_len[i]) == 0) {
                stop = g->stop[i];
                stop_len = g->stop_len[i];
                break;
            }
        g->pending.n = (size_t)at;
        g->pending.p[at] = 0;
        why = KVGEN_FINISH_STOP_STRING;
        failed = KVGEN_OK;
    }
    if (!emit(g, g->pending.n)) return reply_fail(g, oom(g, err));
    if (failed != KVGEN_OK) return reply_fail(g, failed);
    g->finish = why;
    if (g->stream) g->s->kind->reply_free(g->stream);
    g->stream = NULL;
    kvgen_status st = reply_commit(g, stop, stop_len, err);
    return st != KVGEN_OK ? reply_fail(g, st) : st;
}

/* Where event i of this step begins in pending: the first at `before`, each next where the one
 * before it ends. */
static size_t event_start(const kvgen_gen *g, size_t before, int i) {
    if (i == 0) return before;
    size_t end;
    if ((size_t)i * sizeof end > g->ends.n) return SIZE_MAX; /* not known: never counted as begun */
    memcpy(&end, g->ends.p + (size_t)(i - 1) * sizeof end, sizeof end);
    return before + end;
}

/* soft_max_tokens on a reply that arrives as server events, one standing for one token: the
 * first place in this step's new text (pending from `before` on, `n_events` events whose ends
 * g->ends holds) where a sentence ends with at least soft_max_tokens events begun before it, the
 * text after it being what comes next (as a local generation asks before each token). The
 * place, with *counted set to the new events begun before it; SIZE_MAX when there is none. A
 * place at the very end of what arrived waits for what follows; one inside an event is taken
 * too (a server may send many words at once), never one right after whitespace. */
static size_t soft_cut(const kvgen_gen *g, size_t before, int n_events, int *counted) {
    *counted = 0;
    if (g->soft_max_tokens <= 0 || g->pending.n <= before) return SIZE_MAX;
    int begun = 0;
    for (size_t p = before; p < g->pending.n; p++) {
        /* a place after whitespace: the sentence ended before it, where the count was decided */
        char last = p > 0 ? g->pending.p[p - 1] : g->text.n > 0 ? g->text.p[g->text.n - 1] : 'x';
        if (last == ' ' || last == '\t' || last == '\n' || last == '\r' || last == '\f' || last == '\v') continue;
        while (begun < n_events && event_start(g, before, begun) < p) begun++;
        if (g->n_tokens + begun < g->soft_max_tokens) continue;
        char tail[KVG_SENTENCE_TAIL];
        size_t from_pending = p < sizeof tail ? p : sizeof tail;
        size_t from_text = g->text.n < sizeof tail - from_pending ? g->text.n : sizeof tail - from_pending;
        memcpy(tail, g->text.p + g->text.n - from_text, from_text);
        memcpy(tail + from_text, g->pending.p + p - from_pending, from_pending);
        if (kvg_sentence_ends(tail, from_text + from_pending, g->pending.p + p, g->pending.n - p)) {
            *counted = begun;
            return p;
        }
    }
    return SIZE_MAX;
}

kvgen_status kvg_gen_reply_step(kvgen_gen *g, int wait_ms, kvgen_gen_step *step, int *pieces, kvgen_error *err) {
    *pieces = 0;
    if (step) *step = (kvgen_gen_step){.text = "", .token = -1, .finish = KVGEN_FINISH_ERROR, .reasoning = ""};
    if (!g) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_gen_next: gen is NULL");
    g->step.n = 0;
    g->step.p[0] = 0;
    g->rstep.n = 0;
    g->rstep.p[0] = 0;
    if (g->finish != KVGEN_FINISH_NONE) {
        fill_step(g, step, -1);
        return KVGEN_OK;
    }
    kvgen_status st = KVGEN_OK;
    if (__atomic_load_n(&g->cancel, __ATOMIC_ACQUIRE)) {
        st = reply_finish(g, KVGEN_FINISH_CANCELLED, KVGEN_OK, err);
        fill_step(g, step, -1);
        return st;
    }
    kvgen_session *s = g->s;
    if (!g->stream) {
        kvgen_sampler_desc sp;
        kvgen_session_get_sampler(s, &sp);
        /* the request's max_tokens is a ceiling the server applies too; kvgen counts pieces itself */
        kvg_reply_request q = {.sampler = &sp, .ignore_eog = g->ignore_eog, .grammar = g->grammar,
                               .max_tokens = g->max_tokens, .worker = kvg_session_worker_thread != NULL};
        st = s->kind->reply_start(s, &q, &g->stream, "kvgen_gen_next", err);
        if (st != KVGEN_OK) {
            st = reply_fail(g, st);
            fill_step(g, step, -1);
            return st;
        }
    }
    size_t before = g->pending.n;
    kvgen_finish fin = KVGEN_FINISH_NONE;
    kvgen_error serr = {0};
    g->ends.n = 0;
    kvgen_status sst = s->kind->reply_pump(g->stream, wait_ms, &g->pending, &g->ends, pieces, &fin, &serr);
    g->n_events += *pieces;
    int counted = 0;
    size_t cut = soft_cut(g, before, *pieces, &counted);
    if (cut != SIZE_MAX) { /* past soft_max_tokens, a sentence ended: the reply ends there */
        g->pending.n = cut;
        g->pending.p[cut] = 0;
        g->n_tokens += counted;
        st = reply_finish(g, KVGEN_FINISH_SENTENCE, KVGEN_OK, err);
        fill_step(g, step, -1);
        return st;
    }
    g->n_tokens += *pieces;
    if (g->gmatch && g->pending.n > before &&
        !kvg_gram_feed(g->gmatch, (const unsigned char *)g->pending.p + before, g->pending.n - before)) {
        char ex[64];
        size_t n = g->pending.n - before < 40 ? g->pending.n - before : 40;
        memcpy(ex, g->pending.p + before, n);
        ex[n] = 0;
        g->pending.n = before;
        st = reply_finish(g, KVGEN_FINISH_ERROR,
                           kvg_fail(err, KVGEN_E_UNSUPPORTED,
                                    "kvgen_gen_next: the server's reply leaves the constraint at '%s': it does not "
                                    "apply the grammar it was sent (docs/remote.md)",
                                    ex),
                           err);
        fill_step(g, step, -1);
        return st;
    }
    if (fin != KVGEN_FINISH_NONE) {
        if (sst != KVGEN_OK) {
            if (err) *err = serr;
            st = reply_finish(g, KVGEN_FINISH_ERROR, sst, err);
        } else if (fin == KVGEN_FINISH_STOP && g->gmatch && !kvg_gram_can_end(g->gmatch)) {
            st = reply_finish(g, KVGEN_FINISH_ERROR,
                               kvg_fail(err, KVGEN_E_UNSUPPORTED,
                                        "kvgen_gen_next: the server ended its reply where the constraint is not "
                                        "complete: it does not apply the grammar it was sent (docs/remote.md)"),
                               err);
        } else {
            st = reply_finish(g, fin, KVGEN_OK, err);
        }
        fill_step(g, step, *pieces > 0 ? 0 : -1);
        return st;
    }
    long at = find_stop(g);
    if (at >= 0) {
        st = reply_finish(g, KVGEN_FINISH_STOP_STRING, KVGEN_OK, err);
    } else if (g->gmatch && kvg_gram_done(g->gmatch)) {
        st = reply_finish(g, KVGEN_FINISH_STOP, KVGEN_OK, err);
    } else if (g->max_tokens >= 0 && g->n_tokens >= g->max_tokens) {
        st = reply_finish(g, KVGEN_FINISH_LENGTH, KVGEN_OK, err);
    } else if (!emit(g, g->pending.n - held_back(g))) {
        return reply_fail(g, oom(g, err));
    }
    fill_step(g, step, *pieces > 0 ? 0 : -1);
    return st;
}
