/* tokens.c: the public tokenizer calls of kvgen.h over a model: argument checks, then the
 * model's tokenizer (format/tokenizer.c, detok.c); a remote model has none. */
#include "kvg_model.h"

static const kvg_tokenizer *model_tok(const kvgen_model *model) { return model ? model->tok : NULL; }

kvgen_status kvgen_tokenize(const kvgen_model *model, const char *text, size_t len, unsigned flags, int32_t *out,
                            size_t cap, size_t *n_tokens, kvgen_error *err) {
    if (n_tokens) *n_tokens = 0;
    if (!model) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_tokenize: model is NULL");
    if (!model_tok(model))
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "kvgen_tokenize: model '%s' is remote: its tokenizer is the server's (send text instead)",
                        model->name);
    if (!text) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_tokenize: text is NULL");
    if (!n_tokens) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_tokenize: n_tokens is NULL");
    if (!out && cap > 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_tokenize: out is NULL but cap is %zu", cap);
    if (flags & ~(unsigned)(KVGEN_TOKENIZE_SPECIAL | KVGEN_TOKENIZE_ADD_BOS))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_tokenize: unknown flags 0x%x", flags);
    return kvg_tokenize(model->tok, text, len, flags, out, cap, n_tokens, err);
}

size_t kvgen_token_piece(const kvgen_model *model, int32_t token, unsigned flags, char *buf, size_t size) {
    if (!model_tok(model)) return 0;
    if (!buf) size = 0;
    return kvg_token_piece(model->tok, token, flags, buf, size);
}

int kvgen_token_is_eog(const kvgen_model *model, int32_t token) {
    return model_tok(model) ? kvg_token_is_eog(model->tok, token) : 0;
}

int kvgen_token_is_control(const kvgen_model *model, int32_t token) {
    return model_tok(model) ? kvg_token_is_control(model->tok, token) : 0;
}

int32_t kvgen_token_find(const kvgen_model *model, const char *text) {
    return model_tok(model) && text ? kvg_token_find(model->tok, text) : -1;
}

size_t kvgen_detokenize(const kvgen_model *model, const int32_t *tokens, size_t n, unsigned flags, char *buf,
                        size_t size) {
    return kvg_detokenize(model_tok(model), tokens, n, flags, buf, size);
}

size_t kvgen_detok_push(const kvgen_model *model, kvgen_detok *d, int32_t token, unsigned flags, char *buf,
                        size_t size) {
    return kvg_detok_push(model_tok(model), d, token, flags, buf, size);
}
