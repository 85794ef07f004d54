/* kvg_tokenizer.h: byte-level BPE, SentencePiece and WordPiece tokenizers built from GGUF metadata (private). */
#ifndef KVG_TOKENIZER_H
#define KVG_TOKENIZER_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvg_buf.h"
#include "kvg_gguf.h"
#include "kvgen.h"

typedef struct kvg_tokenizer kvg_tokenizer;

/* Builds the tokenizer from tokenizer.ggml.* keys; errors name the file and the key. */
kvgen_status kvg_tokenizer_load(const kvg_gguf *g, kvg_tokenizer **out, kvgen_error *err);
void kvg_tokenizer_free(kvg_tokenizer *t);

kvgen_tokenizer_kind kvg_tokenizer_kind(const kvg_tokenizer *t);
const char *kvg_tokenizer_pre(const kvg_tokenizer *t);
int32_t kvg_tokenizer_n_vocab(const kvg_tokenizer *t);
int32_t kvg_tokenizer_bos(const kvg_tokenizer *t); /* -1 when none */
int32_t kvg_tokenizer_eos(const kvg_tokenizer *t);
int32_t kvg_tokenizer_eot(const kvg_tokenizer *t);
int kvg_tokenizer_add_bos(const kvg_tokenizer *t);

/* Same contract as kvgen_tokenize / kvgen_token_piece / kvgen_token_is_eog in kvgen.h. */
kvgen_status kvg_tokenize(const kvg_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t *out,
                          size_t cap, size_t *n_tokens, kvgen_error *err);
/* kvg_tokenize of a whole rendered chat, where content[i] = 1 marks bytes of message content:
 * with KVGEN_TOKENIZE_SPECIAL control tokens are matched only over unmarked bytes (template
 * text), and the text between them is tokenized as one piece, template and content together,
 * as a tokenizer given the whole string does. content NULL: kvg_tokenize. */
kvgen_status kvg_tokenize_marked(const kvg_tokenizer *t, const char *text, size_t len, unsigned flags,
                                 const unsigned char *content, int32_t *out, size_t cap, size_t *n_tokens,
                                 kvgen_error *err);
size_t kvg_token_piece(const kvg_tokenizer *t, int32_t token, unsigned flags, char *buf, size_t size);
int kvg_token_is_eog(const kvg_tokenizer *t, int32_t token);
int kvg_token_is_control(const kvg_tokenizer *t, int32_t token);
int32_t kvg_token_find(const kvg_tokenizer *t, const char *text);
/* SentencePiece with add_space_prefix: the first piece of a detokenized text drops its leading space. */
int kvg_tokenizer_strips_leading_space(const kvg_tokenizer *t);

/* ---- wordpiece.c: BERT's WordPiece over a fragment of text ----
 * Emits the ids of text[0..len) through emit; false when memory ran out. */
typedef struct kvg_wordpiece {
    bool lowercase; /* lower-case and strip accents first (an uncased vocabulary) */
    bool phantom;   /* word starts are "\u2581piece" and continuations "piece" (llama.cpp's converter),
                       else starts "piece" and continuations "##piece" (Hugging Face's) */
    int32_t unk;    /* the id of a word no pieces make */
    int32_t (*find)(const void *ctx, const char *s, size_t n); /* a piece's id, -1 when absent */
    const void *ctx;
} kvg_wordpiece;
bool kvg_wordpiece_encode(const kvg_wordpiece *wp, const char *text, size_t len, void (*emit)(void *, int32_t),
                          void *ectx);

/* ---- every token's bytes (token_bytes.c) ------------------------------------------------
 * Token t's bytes are bytes[off[t] .. off[t + 1]): kvg_token_piece's with flags 0 (control and
 * unknown tokens, and ids past the tokenizer's own, are empty). */
typedef struct kvg_token_bytes {
    int n;                /* ids 0 .. n - 1 */
    uint32_t *off;        /* n + 1 offsets into bytes */
    unsigned char *bytes; /* off[n] bytes, then a NUL */
} kvg_token_bytes;
/* The table of ids 0 .. n_ids - 1 (n_ids: the model's vocabulary size, the same on every call),
 * built on the first call and kept with the tokenizer until kvg_tokenizer_free. Thread-safe:
 * threads that build it at once keep the first one stored. NULL when memory runs out (or for
 * another n_ids than the table's). */
const kvg_token_bytes *kvg_token_bytes_get(const kvg_tokenizer *t, int n_ids);
void kvg_token_bytes_free(kvg_token_bytes *b); /* (tokenizer.c's, which frees the table it keeps) */
/* where the tokenizer keeps that table (NULL until built; token_bytes.c's alone) */
kvg_token_bytes **kvg_tokenizer_bytes_slot(const kvg_tokenizer *t);

/* UTF-8 at s[0..n) (n >= 1): *len is the length its lead byte announces (1 for a byte that
 * cannot start a character), *ok how many bytes of it are valid. Complete: ok == len;
 * cut off by the end: ok < len && ok == n; invalid: ok < len && ok < n (ok may be 0). */
void kvg_utf8_scan(const unsigned char *s, size_t n, size_t *len, size_t *ok);

/* ---- detok.c: token ids back to text ----
 * Same contract as kvgen_detokenize / kvgen_detok_push in kvgen.h; t NULL (a model without a
 * tokenizer) gives "". */
size_t kvg_detokenize(const kvg_tokenizer *t, const int32_t *tokens, size_t n, unsigned flags, char *buf,
                      size_t size);
size_t kvg_detok_push(const kvg_tokenizer *t, kvgen_detok *d, int32_t token, unsigned flags, char *buf,
                      size_t size);
/* The text of constrained output: the bytes the constraint accepted, exactly, never U+FFFD.
 * Complete UTF-8 characters go out at once, a valid character cut by the end of the token
 * waits in d for the next one, and bytes that are not UTF-8 go out as they are. */
bool kvg_detok_exact(kvgen_detok *d, const unsigned char *bytes, size_t n, kvg_buf *out);
/* What d still holds, as it is (size >= 8). */
size_t kvg_detok_flush_exact(kvgen_detok *d, char *buf, size_t size);

#endif
