/* test_cli.c: the `kvgen` command line on a random model: exit codes, `info`, `tokenize` and
 * `generate --ids` against the library called directly; `info --backend cpu`; `info` on a model of
 * K types, which every backend runs. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <string.h>
#include <sys/wait.h>
#include "testutil.h"

static char bin[1024];

/* Runs `kvgen ARGS` (stdin from `input` when not NULL); returns its exit status and stdout (malloc'd). */
static int run(const char *args, const char *input, char **out) {
    char *in_path = tu_tmpfile("cli_stdin.txt");
    FILE *f = fopen(in_path, "wb");
    if (f) {
        if (input) fputs(input, f);
        fclose(f);
    }
    size_t n = strlen(bin) + strlen(args) + strlen(in_path) + 64;
    char *cmd = malloc(n);
    snprintf(cmd, n, "%s %s < %s 2>/dev/null", bin, args, in_path);
    FILE *p = popen(cmd, "r");
    size_t cap = 1 << 16, len = 0;
    char *buf = calloc(1, cap);
    if (p) {
        size_t got;
        while (len + 1 < cap && (got = fread(buf + len, 1, cap - 1 - len, p)) > 0) len += got;
    }
    int status = p ? pclose(p) : -1;
    free(cmd);
    free(in_path);
    *out = buf;
    return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Runs a shell command and returns all it printed (malloc'd). */
static char *capture(const char *cmd) {
    FILE *p = popen(cmd, "r");
    size_t cap = 1 << 16, len = 0, got;
    char *buf = calloc(1, cap);
    while (p && len + 1 < cap && (got = fread(buf + len, 1, cap - 1 - len, p)) > 0) len += got;
    if (p) pclose(p);
    return buf;
}

/* The load-progress line: on stderr only when it is a terminal (script(1) gives the command a
 * pseudo-terminal), each report rewriting the line, cleared at the end; none into a pipe. */
static void test_progress_line(const char *model) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s info %s --backend cpu 2>&1 >/dev/null", bin, model);
    char *piped = capture(cmd);
    CHECKF(!strstr(piped, "loading:"), "progress into a pipe:\n%s", piped);
    free(piped);
    char *have = capture("command -v script 2>/dev/null");
    if (!*have) {
        printf("script(1) absent: the progress line on a terminal is not checked\n");
        free(have);
        return;
    }
    free(have);
    snprintf(cmd, sizeof cmd, "script -qec '%s info %s --backend cpu >/dev/null' /dev/null 2>&1", bin, model);
    char *tty = capture(cmd);
    const char *read = strstr(tty, "kvgen: loading: reading the weights:");
    const char *upload = strstr(tty, "kvgen: loading: preparing the weights:");
    CHECKF(read && upload && read < upload && strstr(upload, "100%"), "progress on a terminal:\n%s", tty);
    /* the last thing on the line is the clear */
    const char *last = strrchr(tty, '\r');
    CHECKF(last && strncmp(last, "\r\033[K", 4) == 0, "the progress line is not cleared:\n%s", tty);
    free(tty);
}

static void expect_status(const char *args, int want) {
    char *out;
    int rc = run(args, NULL, &out);
    CHECKF(rc == want, "kvgen %s: exit %d, want %d", args, rc, want);
    free(out);
}

/* kvgen embed: a line in, a line of n_embd floats out, unit vectors unless --no-normalize, the
 * same numbers as kvgen_embed; a decoder model and a bad --pooling are refused */
static void test_embed_command(void) {
    char *bert = tu_make_model("cli-bert.gguf", "--arch bert --layers 1 --embd 32 --ff 64 --heads 2 --ctx 32");
    CHECK(bert != NULL);
    if (!bert) return;
    char args[1200], *out = NULL;
    snprintf(args, sizeof args, "embed %s --backend reference", bert);
    CHECK(run(args, "hello world\n\nthe sword\r\nplaying", &out) == 0);
    int lines = 0;
    for (char *line = out, *next; line && *line; line = next, lines++) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        double ss = 0, got[32] = {0};
        int n = 0;
        for (char *tok = strtok(line, " "); tok; tok = strtok(NULL, " "), n++) {
            if (n < 32) got[n] = atof(tok);
            ss += atof(tok) * atof(tok);
        }
        CHECKF(n == 32 && fabs(ss - 1.0) < 1e-5, "line %d: %d floats, squared norm %g", lines, n, ss);
        if (lines == 2) { /* "the sword" as kvgen_embed gives it ("\r" is not the text's) */
            kvgen_model *m = NULL;
            kvgen_model_desc d = {.path = bert, .backend = KVGEN_BACKEND_REFERENCE};
            float v[32] = {0};
            const char *t[] = {"the sword"};
            CHECK_OK(kvgen_model_load(&d, &m, NULL));
            if (m) CHECK_OK(kvgen_embed(m, t, NULL, 1, NULL, v, 32, NULL));
            kvgen_model_unload(m);
            double worst = 0;
            for (int k = 0; k < 32; k++) worst = fmax(worst, fabs(got[k] - v[k]));
            CHECKF(worst < 1e-7, "kvgen embed and kvgen_embed differ by %g", worst);
        }
    }
    CHECKF(lines == 4, "%d lines:\n%s", lines, out);
    free(out);
    snprintf(args, sizeof args, "embed %s --backend reference --no-normalize", bert);
    CHECK(run(args, "hello world\n", &out) == 0);
    double ss = 0;
    for (char *tok = strtok(out, " \n"); tok; tok = strtok(NULL, " \n")) ss += atof(tok) * atof(tok);
    CHECKF(fabs(ss - 1.0) > 1e-3, "--no-normalize: squared norm %g", ss);
    free(out);
    snprintf(args, sizeof args, "embed %s --pooling median", bert);
    expect_status(args, 2);
    free(bert);
}

int main(void) {
    const char *dir = getenv("KVGEN_BIN");
    snprintf(bin, sizeof bin, "%s/kvgen", dir && *dir ? dir : ".");
    char *model = tu_make_model("cli.gguf", "--seed 21 --layers 2 --embd 64 --heads 4 --kv-heads 2 --type Q8_0");
    CHECK(model != NULL);
    if (!model) return tu_finish("test_cli");
    char args[2048];

    /* usage errors exit 2, kvgen errors 1 */
    expect_status("", 2);
    expect_status("frobnicate x", 2);
    expect_status("info", 2);
    snprintf(args, sizeof args, "generate %s", model);
    expect_status(args, 2); /* no -p */
    snprintf(args, sizeof args, "generate %s -p hi -n many", model);
    expect_status(args, 2);
    snprintf(args, sizeof args, "generate %s -p hi --backend tpu", model);
    expect_status(args, 2);
    snprintf(args, sizeof args, "info %s --bogus", model);
    expect_status(args, 2);
    snprintf(args, sizeof args, "generate %s -p hi --activation-bits 7", model);
    expect_status(args, 2);
    snprintf(args, sizeof args, "generate %s -p hi -n 2 --backend cpu --activation-bits 8", model);
    expect_status(args, 0);
    expect_status("info /nonexistent/model.gguf", 1);

    kvgen_error err = {0};
    kvgen_model *m = NULL;
    kvgen_model_desc md = {.path = model, .backend = KVGEN_BACKEND_REFERENCE};
    CHECK_OK(kvgen_model_load(&md, &m, &err));
    if (!m) return tu_finish("test_cli");

    /* info prints the description */
    char *out;
    snprintf(args, sizeof args, "info %s --backend reference", model);
    CHECK(run(args, NULL, &out) == 0);
    char desc[4096];
    kvgen_model_describe(m, desc, sizeof desc);
    CHECKF(strcmp(out, desc) == 0, "info output:\n%s", out);
    /* every tensor type with its count and, per backend, whether that backend's table has it:
     * the model holds 5 F32 norms and 15 Q8_0 matrices, both run by every backend */
    CHECKF(strstr(out, "tensors:         20\n") != NULL, "info output:\n%s", out);
    int n_dev = 0;
    kvgen_error dev_err = {0};
    int have_vk = kvgen_devices(NULL, 0, &n_dev, &dev_err) == KVGEN_OK && n_dev > 0; /* so a Vulkan build */
    const char *lines[] = {"\n  F32:           5 tensors (", "\n  Q8_0:          15 tensors ("};
    for (int i = 0; i < 2; i++) {
        const char *l = strstr(out, lines[i]);
        CHECKF(l != NULL, "info lacks '%s':\n%s", lines[i] + 1, out);
        const char *end = l ? strchr(l + 1, '\n') : NULL;
        const char *ref = l ? strstr(l + 1, "reference: yes") : NULL;
        const char *vk = l ? strstr(l + 1, "vulkan: ") : NULL;
        CHECKF(ref && end && ref < end, "info:\n%s", out);
        /* a Vulkan build lists the Vulkan backend too (it may be built where no device runs, as
           under Wine without a display): listed means "yes", and a device means listed */
        int vk_listed = vk && end && vk < end;
        CHECKF(vk_listed ? strncmp(vk, "vulkan: yes", 11) == 0 : !have_vk, "info:\n%s", out);
        CHECK(end && end[-1] == ')');
    }
    free(out);
    /* --backend cpu: the cpu backend, on the threads asked for, with the path it chose */
    snprintf(args, sizeof args, "info %s --backend cpu --threads 2", model);
    CHECK(run(args, NULL, &out) == 0);
    CHECKF(strstr(out, "backend:         cpu (device cpu (") && strstr(out, "2 threads)") &&
               strstr(out, "cpu: yes, reference: yes"),
           "info --backend cpu:\n%s", out);
    CHECKF(strstr(out, "K/V pages:       f16 ("), "info --backend cpu:\n%s", out);
    free(out);
    /* --kv-type: the pages' type, or the library's refusal naming it (this model's head_dim is
     * 16: no whole blocks of 32) */
    snprintf(args, sizeof args, "info %s --backend reference --kv-type f32", model);
    CHECK(run(args, NULL, &out) == 0);
    CHECKF(strstr(out, "K/V pages:       f32 ("), "info --kv-type f32:\n%s", out);
    free(out);
    snprintf(args, sizeof args, "info %s --backend cpu --kv-type q5_1", model);
    CHECK(run(args, NULL, &out) != 0);
    free(out);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s info %s --backend cpu --kv-type q5_1 2>&1 >/dev/null", bin, model);
    out = capture(cmd);
    CHECKF(strstr(out, "desc.kv_type \"q5_1\" is not a KV type"), "info --kv-type q5_1:\n%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s info %s --backend cpu --kv-type q8_0 2>&1 >/dev/null", bin, model);
    out = capture(cmd);
    CHECKF(strstr(out, "desc.kv_type \"q8_0\"") && strstr(out, "head_dim 16"), "info --kv-type q8_0:\n%s", out);
    free(out);

    /* tokenize: the same ids the library gives, one line */
    const char *text = "Hello world, hello kvgen";
    int32_t ids[64];
    size_t n_ids = 0;
    CHECK_OK(kvgen_tokenize(m, text, strlen(text), 0, ids, 64, &n_ids, &err));
    char want[1024] = "";
    for (size_t i = 0; i < n_ids; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), i ? " %d" : "%d", (int)ids[i]);
    strcat(want, "\n");
    snprintf(args, sizeof args, "tokenize %s", model);
    CHECK(run(args, text, &out) == 0);
    CHECKF(strcmp(out, want) == 0, "tokenize: '%s' vs '%s'", out, want);
    free(out);

    /* generate --ids: greedy, the library's own greedy continuation; --no-cache agrees */
    const char *prompt = "Hello";
    CHECK_OK(kvgen_tokenize(m, prompt, strlen(prompt), KVGEN_TOKENIZE_ADD_BOS, ids, 64, &n_ids, &err));
    kvgen_session *s = NULL;
    CHECK_OK(kvgen_session_create(m, NULL, &s, &err));
    want[0] = 0;
    if (s) {
        CHECK_OK(kvgen_session_prefill(s, ids, n_ids, NULL, &err));
        for (int i = 0; i < 10; i++) {
            int32_t t = kvgen_session_sample(s);
            if (kvgen_token_is_eog(m, t)) break;
            snprintf(want + strlen(want), sizeof want - strlen(want), i ? " %d" : "%d", (int)t);
            CHECK_OK(kvgen_session_decode(s, t, &err));
        }
        strcat(want, "\n");
    }
    snprintf(args, sizeof args, "generate %s -p %s -n 10 --ids --backend reference", model, prompt);
    CHECK(run(args, NULL, &out) == 0);
    CHECKF(strcmp(out, want) == 0, "generate: '%s' vs '%s'", out, want);
    free(out);
    snprintf(args, sizeof args, "generate %s -p %s -n 10 --ids --backend reference --no-cache --threads 1", model,
             prompt);
    CHECK(run(args, NULL, &out) == 0);
    CHECKF(strcmp(out, want) == 0, "generate --no-cache: '%s' vs '%s'", out, want);
    free(out);

    /* generate --grammar / --schema: the text matches; an unreadable file or a bad grammar fails */
    char *gpath = tu_tmpfile("cli_grammar.gbnf"), *spath = tu_tmpfile("cli_schema.json");
    FILE *gf = fopen(gpath, "wb"), *sf = fopen(spath, "wb");
    if (gf) fputs("root ::= (\"yes\" | \"no\") \"!\"{1,3}\n", gf), fclose(gf);
    if (sf) fputs("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":3,\"maximum\":7}},"
                  "\"required\":[\"n\"]}", sf), fclose(sf);
    snprintf(args, sizeof args, "generate %s -p %s -n 20 --seed 3 --temp 1 --grammar %s", model, prompt, gpath);
    CHECK(run(args, NULL, &out) == 0);
    CHECKF(out && (strcmp(out, "yes!\n") == 0 || strcmp(out, "no!!\n") == 0 || strcmp(out, "yes!!\n") == 0 ||
                   strcmp(out, "no!\n") == 0 || strcmp(out, "yes!!!\n") == 0 || strcmp(out, "no!!!\n") == 0),
           "generate --grammar: '%s'", out ? out : "");
    free(out);
    snprintf(args, sizeof args, "generate %s -p %s -n 20 --seed 3 --temp 1 --schema %s", model, prompt, spath);
    CHECK(run(args, NULL, &out) == 0);
    CHECKF(out && strlen(out) == 8 && strncmp(out, "{\"n\":", 5) == 0 && out[5] >= '3' && out[5] <= '7',
           "generate --schema: '%s'", out ? out : "");
    free(out);
    snprintf(args, sizeof args, "generate %s -p %s -n 20 --schema %s.missing", model, prompt, spath);
    CHECK(run(args, NULL, &out) == 1);
    free(out);
    free(gpath);
    free(spath);

    /* sampling with a seed is repeatable */
    char *a = NULL, *b = NULL;
    snprintf(args, sizeof args, "generate %s -p %s -n 12 --ids --seed 5 --temp 1.2 --top-k 20 --top-p 0.9", model,
             prompt);
    int rc_a = run(args, NULL, &a), rc_b = run(args, NULL, &b);
    CHECK(rc_a == 0 && rc_b == 0);
    CHECK(strlen(a) > 1 && strcmp(a, b) == 0);
    free(a);
    free(b);
    /* a context that the prompt already fills is reported, not crashed on */
    snprintf(args, sizeof args, "generate %s -p %s -n 4 --ctx 1", model, "\"Hello world\"");
    expect_status(args, 1);

    /* a Q4_K_M-mix model (2 tied layers: token_embd, blk.1's attn_v and ffn_down Q6_K, the other 12
     * matrices Q4_K): info lists both types, which every backend runs; the default backend on a
     * CPU-only machine is the cpu one, an explicit --backend vulkan runs it too */
    char *kmodel = tu_make_model("cli-k.gguf", "--seed 22 --layers 2 --embd 256 --ff 256 --heads 4 --kv-heads 2 "
                                               "--mix q4_k_m");
    CHECK(kmodel != NULL);
    const char *validate = getenv("KVGEN_VALIDATE"), *env_backend = getenv("KVGEN_BACKEND");
    int fallback = !(validate && strcmp(validate, "1") == 0) && !(env_backend && *env_backend);
    if (kmodel) {
        snprintf(args, sizeof args, fallback ? "info %s" : "info %s --backend reference", kmodel);
        CHECK(run(args, NULL, &out) == 0);
        CHECKF(strstr(out, fallback ? "backend:         cpu" : "backend:         reference") != NULL, "info:\n%s",
               out);
        const char *klines[] = {"\n  Q4_K:          12 tensors (", "\n  Q6_K:          3 tensors ("};
        for (int i = 0; i < 2; i++) {
            const char *l = strstr(out, klines[i]);
            const char *end = l ? strchr(l + 1, '\n') : NULL;
            const char *ref = l ? strstr(l + 1, "reference: yes") : NULL;
            const char *vk = l ? strstr(l + 1, "vulkan: ") : NULL;
            CHECKF(l && end && ref && ref < end, "info lacks '%s':\n%s", klines[i] + 1, out);
            /* a build with the Vulkan backend lists it: "vulkan: yes" */
            CHECKF(!have_vk || (vk && end && vk < end && strncmp(vk, "vulkan: yes", 11) == 0), "info:\n%s", out);
        }
        free(out);
        if (have_vk) {
            snprintf(args, sizeof args, "info %s --backend vulkan", kmodel);
            expect_status(args, 0);
        }
    }
    free(kmodel);

    kvgen_session_close(s);
    kvgen_model_unload(m);
    test_progress_line(model);
    free(model);
    test_embed_command();
    return tu_finish("test_cli");
}
