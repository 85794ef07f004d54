/* kvgen_cli.c: the `kvgen` command-line tool. It uses only the public kvgen.h, so it doubles
 * as an example of the API.
 *
 *   kvgen info MODEL
 *   kvgen tokenize MODEL [--special]                 (text on stdin, ids on stdout)
 *   kvgen embed MODEL [--no-normalize] [--pooling P] (texts on stdin, one per line; a vector per line out)
 *   kvgen generate MODEL -p PROMPT [-n N] [options]  (see usage())
 *
 * Exit status: 0 on success, 1 when kvgen reports an error, 2 on a usage error. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(_WIN32)
#include <fcntl.h>
#include <io.h>
#endif
#include "kvgen.h"
#include "bench.h"
#include "progress.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvgen info MODEL [--backend B] [--device D] [--pipeline-cache F]\n"
            "       kvgen tokenize MODEL [--special]        (reads text from stdin)\n"
            "       kvgen embed MODEL [--no-normalize] [--pooling mean|cls|last]\n"
            "                                             (a text per line of stdin; prints a vector per line)\n"
            "       kvgen generate MODEL -p PROMPT [options]\n"
            "       kvgen bench MODEL [options]            (kvgen bench --help)\n"
            "       kvgen devices\n"
            "generate options:\n"
            "  -n N                 generate at most N tokens (default 64)\n"
            "  --soft-max N         past N tokens, end where a sentence ends (finish \"sentence\")\n"
            "  --temp T             sampling temperature (default 0: greedy)\n"
            "  --top-k K            keep the K most likely tokens (0: off)\n"
            "  --top-p P            keep the smallest set reaching probability P (1: off)\n"
            "  --min-p P            drop tokens below P x the most likely one's probability (0: off)\n"
            "  --repeat-penalty R   penalise tokens seen in the last --penalty-window tokens (1: off)\n"
            "  --frequency-penalty F, --presence-penalty F   subtract F per occurrence / once (0: off)\n"
            "  --penalty-window N   tokens looked back for penalties (default 64, -1: all)\n"
            "  --seed S             sampler seed; sampling options without --temp sample at T = 1\n"
            "  --stop STR           stop when STR appears (not printed); may be given up to 16 times\n"
            "  --ignore-eos         keep going past end-of-generation tokens\n"
            "  --grammar FILE       the output must match this GBNF grammar (rule root)\n"
            "  --schema FILE        the output must be JSON valid against this JSON schema\n"
            "  --chat               apply the model's chat template: PROMPT is the user's turn\n"
            "  --system TEXT        with --chat: a system turn first\n"
            "  --backend B          vulkan | cpu | reference (default: $KVGEN_BACKEND, else vulkan on a GPU, else cpu)\n"
            "  --device D           Vulkan device index or name substring\n"
            "  --pipeline-cache F   Vulkan pipeline cache file, or off (default: $KVGEN_PIPELINE_CACHE, else\n"
            "                       $XDG_CACHE_HOME/kvgen/pipelines-{device}.bin, else ~/.cache/kvgen/...;\n"
            "                       on Windows %%LOCALAPPDATA%%\\kvgen\\pipelines-{device}.bin)\n"
            "  --threads N          cpu and reference backend threads (default: all cores)\n"
            "  --activation-bits B  activations of 16 bits (default) or 8: faster prompts on the cpu backend,\n"
            "                       integer dot products on a vulkan device that has them fast\n"
            "  --kv-type T          what K/V pages hold: f16 (default), q8_0 or q4_0 (cpu, Vulkan: 0.53x and\n"
            "                       0.28x the bytes a token)\n"
            "  --ctx N              context limit in tokens (default: min(training context, 4096))\n"
            "  --special            parse control tokens such as <|im_start|> in the prompt and print them\n"
            "  --ids                print the generated token ids instead of text\n"
            "  --no-cache           recompute the whole sequence for every token (the O(N^2) baseline)\n");
}

/* The backend named `name` among kvgen_backends (also one this build lacks: loading it then
 * says why); 0 when kvgen knows no such name. */
static int parse_backend(const char *name, kvgen_backend *out) {
    kvgen_backend_info b[16];
    int n = kvgen_backends(b, 16);
    for (int i = 0; i < n && i < 16; i++)
        if (strcmp(name, b[i].name) == 0) {
            *out = b[i].backend;
            return 1;
        }
    return 0;
}

/* "vulkan, reference, got 'tpu'" for --backend's usage error (a static buffer) */
static const char *backend_list(const char *got) {
    static char buf[384];
    kvgen_backend_info b[16];
    int n = kvgen_backends(b, 16);
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n && i < 16 && len < sizeof buf; i++) {
        int w = snprintf(buf + len, sizeof buf - len, "%s%s", i ? ", " : "", b[i].name);
        if (w < 0) break;
        len += (size_t)w;
    }
    if (len < sizeof buf) snprintf(buf + len, sizeof buf - len, ", got '%.200s'", got);
    return buf;
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "kvgen: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    usage(stderr);
    return 2;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static int parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || v != v) return 0;
    *out = v;
    return 1;
}

typedef struct options {
    const char *model, *prompt, *device;
    const char *pipeline_cache; /* --pipeline-cache; NULL: the default */
    kvgen_backend backend;
    long n_predict, soft_max, ctx, threads, activation_bits;
    const char *kv_type; /* NULL: the backend's default */
    uint64_t seed;
    float temp, top_p, min_p, repeat_penalty, frequency_penalty, presence_penalty;
    long top_k, penalty_window;
    const char *stop[16];
    int n_stop;
    const char *system;
    const char *grammar, *schema; /* files */
    int temp_set, sampling_opt, special, ids, no_cache, ignore_eos, chat;
    int no_normalize;      /* embed */
    kvgen_pooling pooling; /* embed */
} options;

/* Parses argv[2..]: the first non-option is MODEL. Returns 0, or 2 after printing a usage error. */
static int parse_options(int argc, char **argv, options *o) {
    *o = (options){.n_predict = 64};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE()                                                       \
    do {                                                                   \
        if (!val) return usage_error("option %s needs a value", a);        \
        i++;                                                               \
    } while (0)
        if (strcmp(a, "--special") == 0) o->special = 1;
        else if (strcmp(a, "--ids") == 0) o->ids = 1;
        else if (strcmp(a, "--no-cache") == 0) o->no_cache = 1;
        else if (strcmp(a, "--ignore-eos") == 0) o->ignore_eos = 1;
        else if (strcmp(a, "--chat") == 0) o->chat = 1;
        else if (strcmp(a, "--no-normalize") == 0) o->no_normalize = 1;
        else if (strcmp(a, "--pooling") == 0) {
            NEED_VALUE();
            o->pooling = strcmp(val, "mean") == 0   ? KVGEN_POOLING_MEAN
                         : strcmp(val, "cls") == 0  ? KVGEN_POOLING_CLS
                         : strcmp(val, "last") == 0 ? KVGEN_POOLING_LAST
                                                    : (kvgen_pooling)-1;
            if ((int)o->pooling < 0) return usage_error("--pooling: expected mean, cls or last, got '%s'", val);
        }
        else if (strcmp(a, "--system") == 0) {
            NEED_VALUE();
            o->system = val;
        } else if (strcmp(a, "--grammar") == 0) {
            NEED_VALUE();
            o->grammar = val;
        } else if (strcmp(a, "--schema") == 0) {
            NEED_VALUE();
            o->schema = val;
        } else if (strcmp(a, "--stop") == 0) {
            NEED_VALUE();
            if (o->n_stop == 16 || !*val) return usage_error("--stop: at most 16 non-empty strings ('%s')", val);
            o->stop[o->n_stop++] = val;
        } else if (strcmp(a, "--min-p") == 0 || strcmp(a, "--repeat-penalty") == 0 ||
                   strcmp(a, "--frequency-penalty") == 0 || strcmp(a, "--presence-penalty") == 0) {
            NEED_VALUE();
            float v;
            if (!parse_float(val, &v)) return usage_error("bad number '%s'", val);
            if (a[2] == 'm') o->min_p = v;
            else if (a[2] == 'r') o->repeat_penalty = v;
            else if (a[2] == 'f') o->frequency_penalty = v;
            else o->presence_penalty = v;
            o->sampling_opt |= a[2] == 'm';
        } else if (strcmp(a, "--penalty-window") == 0) {
            NEED_VALUE();
            if (!parse_long(val, -1, 1 << 20, &o->penalty_window)) return usage_error("--penalty-window: bad value '%s'", val);
        }
        else if (strcmp(a, "-p") == 0 || strcmp(a, "--prompt") == 0) {
            NEED_VALUE();
            o->prompt = val;
        } else if (strcmp(a, "-n") == 0) {
            NEED_VALUE();
            if (!parse_long(val, 0, 1 << 20, &o->n_predict)) return usage_error("-n: bad token count '%s'", val);
        } else if (strcmp(a, "--soft-max") == 0) {
            NEED_VALUE();
            if (!parse_long(val, 0, 1 << 20, &o->soft_max)) return usage_error("--soft-max: bad token count '%s'", val);
        } else if (strcmp(a, "--ctx") == 0) {
            NEED_VALUE();
            if (!parse_long(val, 1, 1 << 20, &o->ctx)) return usage_error("--ctx: bad context size '%s'", val);
        } else if (strcmp(a, "--threads") == 0 || strcmp(a, "-t") == 0) {
            NEED_VALUE();
            if (!parse_long(val, 1, 1024, &o->threads)) return usage_error("--threads: bad thread count '%s'", val);
        } else if (strcmp(a, "--kv-type") == 0) {
            NEED_VALUE();
            o->kv_type = val;
        } else if (strcmp(a, "--activation-bits") == 0) {
            NEED_VALUE();
            if (!parse_long(val, 8, 16, &o->activation_bits) || (o->activation_bits != 8 && o->activation_bits != 16))
                return usage_error("--activation-bits: expected 8 or 16, got '%s'", val);
        } else if (strcmp(a, "--seed") == 0) {
            NEED_VALUE();
            char *end;
            errno = 0;
            unsigned long long v = strtoull(val, &end, 10);
            if (errno || end == val || *end || val[0] == '-') return usage_error("--seed: bad seed '%s'", val);
            o->seed = v;
            o->sampling_opt = 1;
        } else if (strcmp(a, "--temp") == 0) {
            NEED_VALUE();
            if (!parse_float(val, &o->temp)) return usage_error("--temp: bad temperature '%s'", val);
            o->temp_set = 1;
        } else if (strcmp(a, "--top-k") == 0) {
            NEED_VALUE();
            if (!parse_long(val, 0, 1 << 30, &o->top_k)) return usage_error("--top-k: bad value '%s'", val);
            o->sampling_opt = 1;
        } else if (strcmp(a, "--top-p") == 0) {
            NEED_VALUE();
            if (!parse_float(val, &o->top_p) || o->top_p < 0) return usage_error("--top-p: bad value '%s'", val);
            o->sampling_opt = 1;
        } else if (strcmp(a, "--backend") == 0) {
            NEED_VALUE();
            if (!parse_backend(val, &o->backend)) return usage_error("--backend: expected one of %s", backend_list(val));
        } else if (strcmp(a, "--device") == 0) {
            NEED_VALUE();
            o->device = val;
        } else if (strcmp(a, "--pipeline-cache") == 0) {
            NEED_VALUE();
            o->pipeline_cache = val;
        } else if (a[0] == '-' && a[1] != 0) {
            return usage_error("unknown option %s", a);
        } else if (!o->model) {
            o->model = a;
        } else {
            return usage_error("unexpected argument '%s'", a);
        }
#undef NEED_VALUE
    }
    if (!o->model) return usage_error("%s: MODEL is required", argv[1]);
    if (!o->temp_set && o->sampling_opt) o->temp = 1.0f;
    return 0;
}

/* The Vulkan pipeline cache file: --pipeline-cache, else $KVGEN_PIPELINE_CACHE, else
 * $XDG_CACHE_HOME/kvgen/pipelines-{device}.bin (an absolute XDG_CACHE_HOME only, as the XDG base
 * directory spec says), else $HOME/.cache/kvgen/...; on Windows %LOCALAPPDATA%\kvgen\..., else
 * %APPDATA%\kvgen\..., else %USERPROFILE%\AppData\Local\kvgen\...; "" or "off": none (NULL). A built path is
 * malloc'd into *buf for the caller to free. kvgen expands {device} for the device it picks. */
static const char *pipeline_cache_path(const options *o, char **buf) {
    *buf = NULL;
    const char *p = o->pipeline_cache ? o->pipeline_cache : getenv("KVGEN_PIPELINE_CACHE");
    if (p) return *p && strcmp(p, "off") != 0 ? p : NULL;
#ifdef _WIN32 /* usually neither XDG_CACHE_HOME nor HOME: the local application data folder */
    const char *base = getenv("LOCALAPPDATA"), *sub = "kvgen", *sep = "\\";
    if (!base || !*base) base = getenv("APPDATA");
    if (!base || !*base) {
        base = getenv("USERPROFILE");
        sub = "AppData\\Local\\kvgen";
    }
#else
    const char *base = getenv("XDG_CACHE_HOME"), *sub = "kvgen", *sep = "/";
    if (!base || base[0] != '/') {
        base = getenv("HOME");
        sub = ".cache/kvgen";
    }
#endif
    if (!base || !*base) return NULL;
    size_t n = strlen(base) + strlen(sub) + 32;
    if (!(*buf = malloc(n))) return NULL;
    snprintf(*buf, n, "%s%s%s%spipelines-{device}.bin", base, sep, sub, sep);
    return *buf;
}

static kvgen_model *load(const options *o) {
    char *cache_buf = NULL;
    /* the one session's context is the model's too (a phi3 file's long RoPE factors past its original one) */
    kvgen_model_desc md = {.path = o->model, .backend = o->backend, .device = o->device, .n_threads = (int)o->threads,
                           .n_ctx = (int)o->ctx, .activation_bits = (int)o->activation_bits, .kv_type = o->kv_type,
                           .pipeline_cache_path = pipeline_cache_path(o, &cache_buf),
                           .progress = kvgen_cli_progress()};
    kvgen_model *m = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvgen_model_load(&md, &m, &err);
    kvgen_cli_progress_end();
    free(cache_buf);
    if (st != KVGEN_OK) {
        fprintf(stderr, "kvgen: %s\n", err.message);
        return NULL;
    }
    return m;
}

static int cmd_info(const options *o) {
    kvgen_model *m = load(o);
    if (!m) return 1;
    size_t n = kvgen_model_describe(m, NULL, 0);
    char *text = malloc(n + 1);
    if (!text) {
        kvgen_model_unload(m);
        return 1;
    }
    kvgen_model_describe(m, text, n + 1);
    fputs(text, stdout);
    free(text);
    kvgen_model_unload(m);
    return 0;
}

/* Tokenizes text (any size), returning a malloc'd id array; NULL after printing an error. */
static int32_t *tokenize(kvgen_model *m, const char *text, size_t len, unsigned flags, size_t *n) {
    kvgen_error err = {0};
    size_t cap = len + 16; /* a byte-level tokenizer never needs more than one id per byte (+BOS) */
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return NULL;
    kvgen_status st = kvgen_tokenize(m, text, len, flags, ids, cap, n, &err);
    if (st == KVGEN_E_INVALID_ARGUMENT && *n > cap) { /* the buffer was short after all: size it exactly */
        int32_t *bigger = realloc(ids, *n * sizeof *ids);
        if (!bigger) {
            free(ids);
            return NULL;
        }
        ids = bigger;
        cap = *n;
        st = kvgen_tokenize(m, text, len, flags, ids, cap, n, &err);
    }
    if (st != KVGEN_OK) {
        fprintf(stderr, "kvgen: tokenize: %s\n", err.message);
        free(ids);
        return NULL;
    }
    return ids;
}

/* all of stdin, malloc'd (*len bytes); NULL after printing an error */
static char *read_stdin(size_t *len) {
    size_t cap = 4096;
    *len = 0;
    char *text = malloc(cap);
    while (text) {
        size_t got = fread(text + *len, 1, cap - *len, stdin);
        *len += got;
        if (*len < cap) break;
        char *bigger = realloc(text, cap * 2);
        if (!bigger) {
            free(text);
            text = NULL;
            break;
        }
        text = bigger;
        cap *= 2;
    }
    if (!text || ferror(stdin)) {
        fprintf(stderr, "kvgen: cannot read stdin\n");
        free(text);
        return NULL;
    }
    return text;
}

static int cmd_tokenize(const options *o) {
    size_t len = 0;
    char *text = read_stdin(&len);
    if (!text) return 1;
    kvgen_model *m = load(o);
    if (!m) {
        free(text);
        return 1;
    }
    size_t n = 0;
    int32_t *ids = tokenize(m, text, len, o->special ? KVGEN_TOKENIZE_SPECIAL : 0, &n);
    int rc = 1;
    if (ids) {
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
        printf("\n");
        rc = 0;
    }
    free(ids);
    free(text);
    kvgen_model_unload(m);
    return rc;
}

/* A text per line of stdin ("\n" or "\r\n" ends a line; an empty line is the empty text), all
 * embedded in one kvgen_embed call, a vector per line out: n_embd floats separated by spaces. */
static int cmd_embed(const options *o) {
    size_t len = 0;
    char *text = read_stdin(&len);
    if (!text) return 1;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += text[i] == '\n';
    if (len && text[len - 1] != '\n') n++; /* a last line without its newline */
    const char **lines = malloc((n ? n : 1) * sizeof *lines);
    size_t *lens = malloc((n ? n : 1) * sizeof *lens);
    kvgen_model *m = lines && lens ? load(o) : NULL;
    float *out = NULL;
    int rc = 1;
    if (!m) goto done;
    for (size_t i = 0, at = 0; i < n; i++) {
        size_t end = at;
        while (end < len && text[end] != '\n') end++;
        lines[i] = text + at;
        lens[i] = end - at - (end > at && text[end - 1] == '\r');
        at = end + 1;
    }
    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    size_t D = (size_t)info.n_embd;
    out = malloc((n ? n : 1) * D * sizeof *out);
    kvgen_error err = {0};
    kvgen_embed_desc d = {.pooling = o->pooling, .no_normalize = o->no_normalize};
    kvgen_status st = out ? kvgen_embed(m, lines, lens, n, &d, out, n * D, &err) : KVGEN_E_NO_MEMORY;
    if (st != KVGEN_OK) {
        fprintf(stderr, "kvgen: %s\n", out ? err.message : "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < D; k++) printf(k ? " %.9g" : "%.9g", (double)out[i * D + k]);
        printf("\n");
    }
    rc = 0;
done:
    free(out);
    free(lines);
    free(lens);
    free(text);
    kvgen_model_unload(m);
    return rc;
}

static int cmd_generate(const options *o) {
    if (!o->prompt) return usage_error("%s: -p PROMPT is required", "generate");
    kvgen_model *m = load(o);
    if (!m) return 1;
    int rc = 1;
    kvgen_error err = {0};
    kvgen_session *s = NULL;
    kvgen_gen *g = NULL;
    unsigned tok_flags = KVGEN_TOKENIZE_ADD_BOS | (o->special ? KVGEN_TOKENIZE_SPECIAL : 0);
    size_t n_prompt = 0;
    int32_t *prompt = NULL;
    char *cons_text = NULL; /* --grammar / --schema file */
    kvgen_model_info mi;
    kvgen_model_get_info(m, &mi);
    bool remote = strcmp(mi.backend, "remote") == 0; /* a server's model: the prompt goes as text */
    if (!o->chat && !remote) {
        prompt = tokenize(m, o->prompt, strlen(o->prompt), tok_flags, &n_prompt);
        if (!prompt) goto done;
        if (n_prompt == 0) {
            fprintf(stderr, "kvgen: the prompt has no tokens\n");
            goto done;
        }
    }
    kvgen_sampler_desc smp = {.seed = o->seed,
                              .temperature = o->temp,
                              .top_k = (int)o->top_k,
                              .top_p = o->top_p,
                              .min_p = o->min_p,
                              .repeat_penalty = o->repeat_penalty,
                              .frequency_penalty = o->frequency_penalty,
                              .presence_penalty = o->presence_penalty,
                              .penalty_window = (int)o->penalty_window};
    kvgen_session_desc sd = {.n_ctx = (int)o->ctx, .no_cache = o->no_cache, .sampler = &smp};
    if (kvgen_session_create(m, &sd, &s, &err) != KVGEN_OK) {
        fprintf(stderr, "kvgen: %s\n", err.message);
        goto done;
    }

    double t0 = now_s();
    kvgen_status st = KVGEN_OK;
    if (o->chat) {
        if (o->system) st = kvgen_chat_add(s, "system", o->system, &err);
        if (st == KVGEN_OK) st = kvgen_chat_begin(s, "user", o->prompt, &err);
        n_prompt = kvgen_session_length(s);
    } else if (!remote) {
        st = kvgen_session_prefill(s, prompt, n_prompt, NULL, &err);
    }
    if (st != KVGEN_OK) {
        fprintf(stderr, "kvgen: prompt: %s\n", err.message);
        goto done;
    }
    double t_prompt = now_s() - t0;

    kvgen_generate_desc gd = {.max_tokens = o->n_predict > 0 ? (int)o->n_predict : -1,
                              .stop = o->stop,
                              .n_stop = o->n_stop,
                              .ignore_eog = o->ignore_eos,
                              .flags = o->special ? KVGEN_TOKENIZE_SPECIAL : 0,
                              .soft_max_tokens = (int)o->soft_max};
    kvgen_constraint cons = {0};
    if (o->grammar || o->schema) {
        const char *path = o->grammar ? o->grammar : o->schema;
        FILE *f = fopen(path, "rb");
        long size = -1;
        if (f && fseek(f, 0, SEEK_END) == 0) size = ftell(f);
        if (size >= 0 && fseek(f, 0, SEEK_SET) == 0 && (cons_text = malloc((size_t)size + 1)) != NULL) {
            if (fread(cons_text, 1, (size_t)size, f) != (size_t)size) size = -1;
            cons_text[size >= 0 ? size : 0] = 0;
        }
        if (f) fclose(f);
        if (!cons_text || size < 0) {
            fprintf(stderr, "kvgen: %s: cannot read %s\n", o->grammar ? "--grammar" : "--schema", path);
            free(cons_text);
            goto done;
        }
        cons.kind = o->grammar ? KVGEN_CONSTRAIN_GRAMMAR : KVGEN_CONSTRAIN_SCHEMA;
        if (o->grammar) cons.grammar = cons_text;
        else cons.schema = cons_text;
        gd.constraint = &cons;
    }
    kvgen_finish finish = KVGEN_FINISH_LENGTH;
    int n_gen = 0;
    t0 = now_s();
    if (o->n_predict > 0) {
        kvgen_status bst = remote && !o->chat ? kvgen_gen_begin_text(s, o->prompt, strlen(o->prompt), &gd, &g, &err)
                                              : kvgen_gen_begin(s, &gd, &g, &err);
        if (remote && !o->chat) n_prompt = kvgen_session_length(s);
        free(cons_text); /* copied at begin */
        cons_text = NULL;
        if (bst != KVGEN_OK) {
            fprintf(stderr, "kvgen: %s\n", err.message);
            goto done;
        }
        kvgen_gen_step step;
        do {
            if (kvgen_gen_next(g, &step, &err) != KVGEN_OK) {
                fprintf(stderr, "\nkvgen: generate: %s\n", err.message);
                goto done;
            }
            bool eog = step.finish == KVGEN_FINISH_STOP && step.token >= 0 && kvgen_token_is_eog(m, step.token);
            if (o->ids) {
                if (step.token >= 0 && !eog) printf(n_gen++ ? " %d" : "%d", (int)step.token);
            } else {
                fputs(step.text, stdout);
            }
            fflush(stdout);
        } while (step.finish == KVGEN_FINISH_NONE);
        finish = step.finish;
        if (!o->ids) n_gen = kvgen_gen_n_tokens(g);
    }
    double t_gen = now_s() - t0;
    printf("\n");
    fflush(stdout);

    kvgen_model_info info;
    kvgen_model_get_info(m, &info);
    int n_decoded = g ? kvgen_gen_n_tokens(g) : 0;
    if (remote) /* the server runs the prompt within the request: one figure, the reply's */
        fprintf(stderr, "[remote on %s] history: %zu bytes; generated: %d pieces (%s) in %.1f ms (%.1f pieces/s, first "
                "request included)\n",
                info.device, kvgen_session_length(s), n_gen, kvgen_finish_name(finish), t_gen * 1e3,
                n_gen / (t_gen > 0 ? t_gen : 1e-9));
    else
        fprintf(stderr, "[%s on %s] prompt: %zu tokens in %.1f ms (%.1f tok/s); generated: %d tokens (%s), "
                "%d decodes in %.1f ms (%.1f tok/s)%s\n",
                info.backend, info.device, n_prompt, t_prompt * 1e3, n_prompt / (t_prompt > 0 ? t_prompt : 1e-9), n_gen,
                kvgen_finish_name(finish), n_decoded, t_gen * 1e3, n_decoded / (t_gen > 0 ? t_gen : 1e-9),
                o->no_cache ? " [no cache]" : "");
    rc = 0;
done:
    kvgen_gen_end(g);
    free(prompt);
    free(cons_text);
    kvgen_session_close(s);
    kvgen_model_unload(m);
    return rc;
}

int main(int argc, char **argv) {
#if defined(_WIN32)
    /* the same bytes as elsewhere ("\n" line ends), so that piped ids and JSON compare equal */
    _setmode(_fileno(stdout), _O_BINARY);
#endif
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "bench") == 0) return kvgen_cli_bench(argc, argv);
    if (strcmp(cmd, "devices") == 0) return kvgen_cli_devices(argc, argv);
    if (strcmp(cmd, "info") && strcmp(cmd, "tokenize") && strcmp(cmd, "generate") && strcmp(cmd, "embed"))
        return usage_error("unknown command '%s'", cmd);
    options o;
    int rc = parse_options(argc, argv, &o);
    if (rc) return rc;
    if (strcmp(cmd, "info") == 0) return cmd_info(&o);
    if (strcmp(cmd, "tokenize") == 0) return cmd_tokenize(&o);
    if (strcmp(cmd, "embed") == 0) return cmd_embed(&o);
    return cmd_generate(&o);
}
