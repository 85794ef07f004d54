/* fuzz_schema: the JSON-schema compiler (kvg_schema_to_gbnf) over arbitrary text; a schema it
 * accepts must give GBNF that the grammar parser accepts too (else abort: the compiler wrote a
 * grammar of its own that is not valid), and a matcher over it is fed a few JSON texts. Seeds:
 * corpus/schema/. */
#include "fuzz_util.h"
#include "kvg_grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 16384) return 0;
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    char *gbnf = NULL;
    kvgen_error err = {0};
    kvgen_status st = kvg_schema_to_gbnf(text, &gbnf, &err);
    free(text);
    if (st != KVGEN_OK) return 0;
    kvg_gram *g = NULL;
    st = kvg_gram_parse(gbnf, &g, &err);
    /* (a grammar over one of the parser's bounds is refused by name: "over", "at most") */
    if (st != KVGEN_OK && st != KVGEN_E_UNSUPPORTED && !strstr(err.message, " over ") && !strstr(err.message, "at most")) {
        fprintf(stderr, "fuzz_schema: the compiled grammar does not parse: %s\n%s\n", err.message, gbnf);
        abort();
    }
    free(gbnf);
    if (st != KVGEN_OK) return 0;
    kvg_gram_match *mt = NULL;
    if (kvg_gram_match_new(g, &mt, &err) == KVGEN_OK) {
        kvg_gram_match_set_max_steps(mt, 20000);
        static const char *const texts[] = {"{}", "{\"a\": 1}", "[1, 2]", "\"x\"", "null", "{\"name\": \"Mira\", \"n\": -2.5e3}"};
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
            kvg_gram_match_reset(mt);
            (void)kvg_gram_feed(mt, (const unsigned char *)texts[i], strlen(texts[i]));
            (void)kvg_gram_can_end(mt);
        }
        kvg_gram_match_free(mt);
    }
    kvg_gram_free(g);
    return 0;
}
