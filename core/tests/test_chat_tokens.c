/* test_chat_tokens.c: the token ids kvgen's chat prefills against Hugging Face's tokenizer
 * (fixtures/chat_templates.txt, "ids" records from scripts/oracle/chat_templates.py: the ids
 * transformers gives for the rendered conversation, loaded from the same GGUF file). Each case
 * runs its conversation through the public chat calls, turn by turn (kvgen_chat_add; the last
 * turn with kvgen_chat_begin when the generation prompt is on), under the case's template, and
 * the session's tokens must be exactly those ids. The default model's cases always run; the
 * other files' cases are skipped, with a message, when the file is absent. Likewise
 * fixtures/chat_tools.txt (scripts/oracle/chat_tools.py): the Qwen templates (Qwen2.5-Coder's,
 * the publishers' Qwen2.5 and Qwen3) with tools, calls, results and reasoning on the Qwen2.5
 * vocabulary, the messages added with their fields (kvgen_chat_set_vars,
 * kvgen_chat_add_message, then kvgen_chat_begin for the generation prompt). */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <string.h>
#include "kvg_json.h"
#include "testutil.h"

enum { MAX_MSG = 16, MAX_FILES = 4 };

typedef struct model_slot {
    char file[256];
    kvgen_model *m; /* NULL: absent or failed */
    bool tried;
    int cases, skipped;
} model_slot;
static model_slot models[MAX_FILES];
static char model_dir[1024];

static kvgen_model *model_for(const char *file, model_slot **slot) {
    int i = 0;
    while (i < MAX_FILES && models[i].file[0] && strcmp(models[i].file, file) != 0) i++;
    if (i == MAX_FILES) return NULL;
    model_slot *ms = &models[i];
    *slot = ms;
    if (!ms->tried) {
        ms->tried = true;
        size_t fl = strlen(file) < sizeof ms->file ? strlen(file) : sizeof ms->file - 1;
        memcpy(ms->file, file, fl);
        ms->file[fl] = 0;
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", model_dir, ms->file);
        FILE *probe = fopen(path, "rb");
        if (probe) {
            fclose(probe);
            kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_CPU};
            ms->m = tu_load(&md);
        }
    }
    return ms->m;
}

/* the ids of a record's payload ("1 2 3"); returns how many */
static size_t parse_ids(const char *s, int32_t *ids, size_t cap) {
    size_t n = 0;
    char *end;
    for (;;) {
        long v = strtol(s, &end, 10);
        if (end == s) break;
        if (n < cap) ids[n] = (int32_t)v;
        n++;
        s = end;
    }
    return n;
}

/* a case's records: its head, then its messages (and, in chat_tools.txt, each message's fields,
 * the template variables) */
typedef struct chat_case {
    char name[128], tname[64];
    int agp, nmsg;
    char *roles[MAX_MSG], *contents[MAX_MSG], *fields[MAX_MSG], *vars;
} chat_case;

static void case_clear(chat_case *c) {
    for (int i = 0; i < c->nmsg; i++) {
        free(c->roles[i]);
        free(c->contents[i]);
        free(c->fields[i]);
    }
    free(c->vars);
    memset(c, 0, sizeof *c);
}

/* reads the records that follow a "case" head (its bos and eos, the messages; with_fields: each
 * message's fields, then the variables and the expected text) into c */
static void case_read(FILE *f, const char *head, bool with_fields, chat_case *c) {
    case_clear(c);
    int n = 0;
    CHECK(sscanf(head + 5, "%127s %63s %d %d", c->name, c->tname, &c->agp, &n) == 4);
    c->nmsg = n < MAX_MSG ? n : MAX_MSG;
    tu_record r;
    for (int i = 0; i < 2; i++) { /* bos, eos */
        tu_read_record(f, &r);
        free(r.body);
    }
    for (int i = 0; i < n; i++) {
        tu_record fl = {0};
        tu_read_record(f, &r);
        if (with_fields) tu_read_record(f, &fl);
        if (i < MAX_MSG) {
            c->roles[i] = strdup(r.head + 4);
            c->contents[i] = r.body;
            c->fields[i] = fl.body;
        } else {
            free(r.body);
            free(fl.body);
        }
    }
    if (with_fields) {
        tu_read_record(f, &r);
        c->vars = r.body;
        tu_read_record(f, &r); /* the expected text: compared by test_chat_tools */
        free(r.body);
    }
}

/* the messages of a chat_templates.txt case, each with kvgen_chat_add (the last with
 * kvgen_chat_begin when the generation prompt is on) */
static kvgen_status add_plain(kvgen_session *s, const chat_case *c, kvgen_error *err) {
    kvgen_status st = KVGEN_OK;
    for (int i = 0; st == KVGEN_OK && i < c->nmsg; i++)
        st = i == c->nmsg - 1 && c->agp ? kvgen_chat_begin(s, c->roles[i], c->contents[i], err)
                                        : kvgen_chat_add(s, c->roles[i], c->contents[i], err);
    return st;
}

/* a chat_tools.txt case: the variables set, the messages added with their fields */
static kvgen_status add_with_fields(kvgen_session *s, const chat_case *c, kvgen_error *err) {
    kvgen_status st = KVGEN_OK;
    if (strcmp(c->vars, "null") != 0) st = kvgen_chat_set_vars(s, c->vars, err);
    for (int i = 0; st == KVGEN_OK && i < c->nmsg; i++) {
        const char *fields = c->fields[i];
        kvg_json *f = strcmp(fields, "null") ? kvg_json_parse(fields, strlen(fields), 64, NULL, NULL, 0) : NULL;
        const kvg_json *calls = kvg_json_get(f, "tool_calls"), *content = kvg_json_get(f, "content");
        char *calls_text = calls ? kvg_json_print(calls, NULL) : NULL;
        kvgen_chat_message msg = {.role = c->roles[i],
                                  .content = content && content->type == KVG_JSON_NULL ? NULL : c->contents[i],
                                  .tool_calls = calls_text,
                                  .tool_call_id = kvg_json_get_string(f, "tool_call_id", NULL),
                                  .reasoning_content = kvg_json_get_string(f, "reasoning_content", NULL)};
        st = kvgen_chat_add_message(s, &msg, err);
        kvg_free(calls_text);
        kvg_json_free(f);
    }
    if (st == KVGEN_OK && c->agp) st = kvgen_chat_begin(s, NULL, NULL, err);
    return st;
}

/* runs the case's conversation through kvgen's chat under template src; the session's tokens
 * must be want[0..n_want) */
static void run_case(const chat_case *c, bool with_fields, const char *src, kvgen_model *m, const int32_t *want,
                     size_t n_want) {
    kvgen_session_desc sd = {.n_ctx = with_fields ? 4096 : 2048};
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    if (!s) return;
    kvgen_chat_template tpl = {.jinja = src};
    kvgen_status st = kvgen_chat_set_template(s, &tpl, &err);
    if (st == KVGEN_OK) st = with_fields ? add_with_fields(s, c, &err) : add_plain(s, c, &err);
    CHECKF(st == KVGEN_OK, "%s: %s", c->name, err.message);
    size_t n = kvgen_session_length(s);
    const int32_t *have = kvgen_session_tokens(s);
    size_t at = 0;
    while (at < n && at < n_want && have[at] == want[at]) at++;
    if (st == KVGEN_OK && (at < n || at < n_want)) {
        char got_text[256] = "", want_text[256] = "";
        if (at < n) kvgen_detokenize(m, have + at, n - at < 6 ? n - at : 6, KVGEN_TOKENIZE_SPECIAL, got_text, sizeof got_text);
        if (at < n_want)
            kvgen_detokenize(m, want + at, n_want - at < 6 ? n_want - at : 6, KVGEN_TOKENIZE_SPECIAL, want_text,
                             sizeof want_text);
        CHECKF(0, "%s: %zu tokens, Hugging Face %zu; first difference at %zu: kvgen %d \"%s...\", HF %d \"%s...\"",
               c->name, n, n_want, at, at < n ? have[at] : -1, got_text, at < n_want ? want[at] : -1, want_text);
    }
    kvgen_session_close(s);
}

/* one fixture's cases: its templates, its cases, and each "ids FILE" record run on FILE's model
 * (counted as skipped when the file is absent); returns how many ran, *on_default those of the
 * default model's file */
static int run_fixture(const char *fixture, bool with_fields, const char *dflt_file, int *on_default) {
    FILE *f = tu_open_fixture(fixture);
    if (!f) return 0;
    enum { MAX_T = 64 };
    char *names[MAX_T], *srcs[MAX_T];
    int n_t = 0, ran = 0;
    chat_case c = {0};
    tu_record r;
    while (tu_read_record(f, &r)) {
        if (strncmp(r.head, "template ", 9) == 0 && n_t < MAX_T) {
            names[n_t] = strdup(r.head + 9);
            srcs[n_t++] = r.body;
            continue;
        }
        if (strncmp(r.head, "case ", 5) == 0) {
            case_read(f, r.head, with_fields, &c);
        } else if (strncmp(r.head, "ids ", 4) == 0) {
            const char *file = r.head + 4;
            int ti = -1;
            for (int i = 0; i < n_t; i++)
                if (strcmp(names[i], c.tname) == 0) ti = i;
            CHECKF(ti >= 0, "%s: no template %s", c.name, c.tname);
            model_slot *slot = NULL;
            kvgen_model *m = ti >= 0 ? model_for(file, &slot) : NULL;
            if (slot && m) {
                size_t cap = r.len / 2 + 1;
                int32_t *want = malloc(cap * sizeof *want);
                size_t n_want = parse_ids(r.body, want, cap);
                run_case(&c, with_fields, srcs[ti], m, want, n_want);
                free(want);
                slot->cases++;
                ran++;
                if (on_default && strcmp(file, dflt_file) == 0) (*on_default)++;
            } else if (slot) {
                slot->skipped++;
            }
        }
        free(r.body);
    }
    fclose(f);
    case_clear(&c);
    for (int i = 0; i < n_t; i++) {
        free(names[i]);
        free(srcs[i]);
    }
    return ran;
}

int main(void) {
    const char *dflt = tu_model_path();
    if (!dflt) tu_skip("default model absent");
    snprintf(model_dir, sizeof model_dir, "%s", dflt);
    char *slash = strrchr(model_dir, '/');
    if (slash) *slash = 0;
    else snprintf(model_dir, sizeof model_dir, ".");
    const char *dflt_file = slash ? strrchr(dflt, '/') + 1 : dflt;

    int dflt_cases = 0;
    run_fixture("chat_templates.txt", false, dflt_file, &dflt_cases);
    int tool_ran = run_fixture("chat_tools.txt", true, dflt_file, NULL);
    printf("chat_tools.txt: %d cases with token ids run\n", tool_ran);
    for (int i = 0; i < MAX_FILES && models[i].file[0]; i++) {
        if (models[i].m)
            printf("%s: %d cases checked against Hugging Face's ids\n", models[i].file, models[i].cases);
        else
            printf("%s: absent, %d cases skipped\n", models[i].file, models[i].skipped);
        kvgen_model_unload(models[i].m);
    }
    CHECKF(dflt_cases >= 8, "only %d cases of the default model (%s) in the fixture", dflt_cases, dflt_file);
    return tu_finish("test_chat_tokens");
}
