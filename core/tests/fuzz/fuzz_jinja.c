/* fuzz_jinja: the Jinja interpreter of chat templates: kvg_jinja_parse over the input up to its
 * first NUL byte, then kvg_jinja_render of a four-turn conversation whose contents come from
 * the rest of the input (split at NUL bytes), with and without the generation prompt. Errors
 * are fine; a crash, a sanitizer report, a leak, or a render whose user flags do not cover its
 * text is a finding. Seeds: corpus/jinja/ (the chat templates kvgen knows, and pieces of the
 * language). */
#include "fuzz_util.h"
#include "kvg_jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 32768) return 0;
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    kvg_jinja *t = NULL;
    char msg[256];
    if (!kvg_jinja_parse((const char *)data, tlen, &t, msg, sizeof msg)) return 0;
    /* contents: the rest, NUL-separated (a copy, NUL-terminated) */
    size_t rest = nul ? size - tlen - 1 : 0;
    char *buf = malloc(rest + 1);
    if (rest) memcpy(buf, nul + 1, rest);
    buf[rest] = 0;
    const char *content[4] = {"You are a smith.", "Hello!", "Well met.", "Fix my sword?"};
    char *p = buf, *end = buf + rest;
    for (int i = 0; i < 4 && nul && p <= end; i++) {
        content[i] = p;
        p += strlen(p) + 1;
    }
    kvg_jinja_msg msgs[4] = {{"system", content[0], NULL}, {"user", content[1], NULL},
                             {"assistant", content[2], NULL}, {"user", content[3], NULL}};
    for (int gen = 0; gen < 2; gen++) {
        kvg_jinja_input in = {.messages = msgs + gen, .n_messages = 4 - (size_t)gen, .add_generation_prompt = gen == 0,
                              .bos_token = "<s>", .eos_token = "</s>"};
        kvg_jinja_output out = {0};
        if (kvg_jinja_render(t, &in, &out, msg, sizeof msg)) {
            if (!out.text || (out.len && !out.user) || out.text[out.len] != 0) abort();
            free(out.text);
            free(out.user);
        }
    }
    free(buf);
    kvg_jinja_free(t);
    return 0;
}
