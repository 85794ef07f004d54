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

enum { MAX_T = 64, MAX_MSG = 16, MAX_FILES = 4 };
static char *tnames[MAX_T], *tsrc[MAX_T];
static int nt;

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

/* runs the conversation through kvgen's chat; the session's tokens, then compared */
static void run_case(const char *cname, const char *src, kvgen_model *m, char **roles, char **contents, int nmsg,
                     int agp, const int32_t *want, size_t n_want) {
    kvgen_session_desc sd = {.n_ctx = 2048};
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    if (!s) return;
    kvgen_chat_template tpl = {.jinja = src};
    kvgen_status st = kvgen_chat_set_template(s, &tpl, &err);
    for (int i = 0; st == KVGEN_OK && i < nmsg; i++)
        st = i == nmsg - 1 && agp ? kvgen_chat_begin(s, roles[i], contents[i], &err)
                                  : kvgen_chat_add(s, roles[i], contents[i], &err);
    CHECKF(st == KVGEN_OK, "%s: %s", cname, err.message);
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
               cname, n, n_want, at, at < n ? have[at] : -1, got_text, at < n_want ? want[at] : -1, want_text);
    }
    kvgen_session_close(s);
}

/* a case of chat_tools.txt: its messages added with their fields, the variables set */
static void run_tool_case(const char *cname, const char *src, kvgen_model *m, const char *vars, char **roles,
                          char **contents, char **fields, int nmsg, int agp, const int32_t *want, size_t n_want) {
    kvgen_session_desc sd = {.n_ctx = 4096};
    kvgen_session *s = NULL;
    kvgen_error err = {0};
    CHECK_OK(kvgen_session_create(m, &sd, &s, &err));
    if (!s) return;
    kvgen_chat_template tpl = {.jinja = src};
    kvgen_status st = kvgen_chat_set_template(s, &tpl, &err);
    if (st == KVGEN_OK && strcmp(vars, "null") != 0) st = kvgen_chat_set_vars(s, vars, &err);
    for (int i = 0; st == KVGEN_OK && i < nmsg; i++) {
        kvg_json *f = strcmp(fields[i], "null") ? kvg_json_parse(fields[i], strlen(fields[i]), 64, NULL, NULL, 0) : NULL;
        const kvg_json *calls = kvg_json_get(f, "tool_calls"), *content = kvg_json_get(f, "content");
        char *calls_text = calls ? kvg_json_print(calls, NULL) : NULL;
        kvgen_chat_message msg = {.role = roles[i],
                                  .content = content && content->type == KVG_JSON_NULL ? NULL : contents[i],
                                  .tool_calls = calls_text,
                                  .tool_call_id = kvg_json_get_string(f, "tool_call_id", NULL),
                                  .reasoning_content = kvg_json_get_string(f, "reasoning_content", NULL)};
        st = kvgen_chat_add_message(s, &msg, &err);
        kvg_free(calls_text);
        kvg_json_free(f);
    }
    if (st == KVGEN_OK && agp) st = kvgen_chat_begin(s, NULL, NULL, &err);
    CHECKF(st == KVGEN_OK, "%s: %s", cname, err.message);
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
               cname, n, n_want, at, at < n ? have[at] : -1, got_text, at < n_want ? want[at] : -1, want_text);
    }
    kvgen_session_close(s);
}

/* chat_tools.txt's cases that carry token ids; returns how many ran */
static int tool_cases(void) {
    FILE *f = tu_open_fixture("chat_tools.txt");
    if (!f) return 0;
    enum { N = 32 };
    char *names[N], *srcs[N];
    int n_t = 0, ran = 0;
    char cname[128] = "", tname[64] = "", *vars = NULL;
    int agp = 0, nmsg = 0;
    char *roles[MAX_MSG] = {0}, *contents[MAX_MSG] = {0}, *fields[MAX_MSG] = {0};
    tu_record r;
    while (tu_read_record(f, &r)) {
        if (strncmp(r.head, "template ", 9) == 0) {
            if (n_t < N) {
                names[n_t] = strdup(r.head + 9);
                srcs[n_t++] = r.body;
            } else {
                free(r.body);
            }
            continue;
        }
        if (strncmp(r.head, "case ", 5) == 0) {
            for (int i = 0; i < nmsg; i++) {
                free(roles[i]);
                free(contents[i]);
                free(fields[i]);
            }
            free(vars);
            int n = 0;
            CHECK(sscanf(r.head + 5, "%127s %63s %d %d", cname, tname, &agp, &n) == 4 && n <= MAX_MSG);
            nmsg = n < MAX_MSG ? n : MAX_MSG;
            free(r.body);
            tu_record bos, eos, ex;
            tu_read_record(f, &bos);
            tu_read_record(f, &eos);
            free(bos.body);
            free(eos.body);
            for (int i = 0; i < nmsg; i++) {
                tu_record m, fl;
                tu_read_record(f, &m);
                tu_read_record(f, &fl);
                roles[i] = strdup(m.head + 4);
                contents[i] = m.body;
                fields[i] = fl.body;
            }
            tu_record v;
            tu_read_record(f, &v);
            vars = v.body;
            tu_read_record(f, &ex);
            free(ex.body);
            continue;
        }
        if (strncmp(r.head, "ids ", 4) == 0) {
            int ti = -1;
            for (int i = 0; i < n_t; i++)
                if (strcmp(names[i], tname) == 0) ti = i;
            CHECKF(ti >= 0, "%s: no template %s", cname, tname);
            model_slot *slot = NULL;
            kvgen_model *m = ti >= 0 ? model_for(r.head + 4, &slot) : NULL;
            if (slot && m) {
                size_t cap = r.len / 2 + 1;
                int32_t *want = malloc(cap * sizeof *want);
                size_t n_want = parse_ids(r.body, want, cap);
                run_tool_case(cname, srcs[ti], m, vars, roles, contents, fields, nmsg, agp, want, n_want);
                free(want);
                slot->cases++;
                ran++;
            } else if (slot) {
                slot->skipped++;
            }
        }
        free(r.body);
    }
    fclose(f);
    for (int i = 0; i < nmsg; i++) {
        free(roles[i]);
        free(contents[i]);
        free(fields[i]);
    }
    free(vars);
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

    FILE *f = tu_open_fixture("chat_templates.txt");
    if (!f) return tu_finish("test_chat_tokens");

    tu_record r;
    int dflt_cases = 0;
    /* a case's records, kept until its ids (if any) arrive */
    char cname[128] = "", tname[64] = "";
    int agp = 0, nmsg = 0;
    char *roles[MAX_MSG] = {0}, *contents[MAX_MSG] = {0};
    while (tu_read_record(f, &r)) {
        if (strncmp(r.head, "template ", 9) == 0 && nt < MAX_T) {
            tnames[nt] = strdup(r.head + 9);
            tsrc[nt++] = r.body;
            continue;
        }
        if (strncmp(r.head, "case ", 5) == 0) {
            for (int i = 0; i < nmsg; i++) {
                free(roles[i]);
                free(contents[i]);
                roles[i] = contents[i] = NULL;
            }
            nmsg = 0;
            int n = 0;
            CHECK(sscanf(r.head + 5, "%127s %63s %d %d", cname, tname, &agp, &n) == 4);
            nmsg = n < MAX_MSG ? n : MAX_MSG;
            tu_record bos, eos;
            tu_read_record(f, &bos);
            tu_read_record(f, &eos);
            free(bos.body);
            free(eos.body);
            for (int i = 0; i < n; i++) {
                tu_record m;
                tu_read_record(f, &m);
                if (i < MAX_MSG) {
                    roles[i] = strdup(m.head + 4);
                    contents[i] = m.body;
                } else {
                    free(m.body);
                }
            }
            continue;
        }
        if (strncmp(r.head, "ids ", 4) == 0) {
            const char *file = r.head + 4;
            int ti = -1;
            for (int i = 0; i < nt; i++)
                if (strcmp(tnames[i], tname) == 0) ti = i;
            CHECKF(ti >= 0, "%s: no template %s", cname, tname);
            model_slot *slot = NULL;
            kvgen_model *m = ti >= 0 ? model_for(file, &slot) : NULL;
            if (slot && m) {
                size_t cap = r.len / 2 + 1;
                int32_t *want = malloc(cap * sizeof *want);
                size_t n_want = parse_ids(r.body, want, cap);
                run_case(cname, tsrc[ti], m, roles, contents, nmsg, agp, want, n_want);
                free(want);
                slot->cases++;
                if (strcmp(file, dflt_file) == 0) dflt_cases++;
            } else if (slot) {
                slot->skipped++;
            }
        }
        free(r.body);
    }
    fclose(f);
    for (int i = 0; i < nmsg; i++) {
        free(roles[i]);
        free(contents[i]);
    }
    int tool_ran = tool_cases();
    printf("chat_tools.txt: %d cases with token ids run\n", tool_ran);
    for (int i = 0; i < MAX_FILES && models[i].file[0]; i++) {
        if (models[i].m)
            printf("%s: %d cases checked against Hugging Face's ids\n", models[i].file, models[i].cases);
        else
            printf("%s: absent, %d cases skipped\n", models[i].file, models[i].skipped);
        kvgen_model_unload(models[i].m);
    }
    CHECKF(dflt_cases >= 8, "only %d cases of the default model (%s) in the fixture", dflt_cases, dflt_file);
    for (int i = 0; i < nt; i++) {
        free(tnames[i]);
        free(tsrc[i]);
    }
    return tu_finish("test_chat_tokens");
}
