/* fuzz_json: the JSON codec (base/kvg_json.h) over arbitrary bytes, strict (UTF-8) and with
 * KVG_JSON_ANY_BYTES, numbers as written or not: a refusal must name a byte inside the text; an accepted text is written,
 * the writing read again and written again, and the two writings must be equal (else abort: the
 * writer wrote what the reader reads otherwise, or refuses). Seeds: corpus/json/. */
#include "fuzz_util.h"
#include "kvg_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 65536) return 0;
    for (unsigned flags = 0; flags <= (KVG_JSON_ANY_BYTES | KVG_JSON_NUMBER_TEXT); flags++) {
        char err[128] = "";
        size_t at = 0;
        kvg_json *v = kvg_json_parse_ex((const char *)data, size, 64, flags, NULL, &at, err, sizeof err);
        if (!v) {
            if (at != KVG_JSON_NO_MEMORY && (at > size || !strstr(err, "not valid JSON at byte "))) {
                fprintf(stderr, "fuzz_json: refused at %zu of %zu bytes: %s\n", at, size, err);
                abort();
            }
            continue;
        }
        size_t n1 = 0, n2 = 0;
        char *first = kvg_json_print(v, &n1);
        kvg_json *w = first ? kvg_json_parse_ex(first, n1, 64, flags, NULL, &at, err, sizeof err) : NULL;
        char *second = w ? kvg_json_print(w, &n2) : NULL;
        if (first && (!w || !second || n1 != n2 || memcmp(first, second, n1) != 0)) {
            fprintf(stderr, "fuzz_json: wrote %.*s\nthen %s (%s)\n", (int)n1, first, second ? second : "nothing",
                    w ? "" : err);
            abort();
        }
        kvg_free(second);
        kvg_json_free(w);
        kvg_free(first);
        kvg_json_free(v);
    }
    return 0;
}
