/* kvg_grammar.h: GBNF grammars, JSON schemas compiled to them, the byte matcher and the token
 * mask walked over the vocabulary's byte trie (private; see docs/generation.md, "Grammars").
 *
 * A grammar is matched over bytes: string literals and character classes are UTF-8, a class
 * that excludes characters ([^...]) and `.` match one whole UTF-8 character (its bytes one
 * after the other), so a token that ends inside a character leaves the matcher inside that
 * character's byte sequence and only tokens that continue it validly are allowed next. */
#ifndef KVG_GRAMMAR_H
#define KVG_GRAMMAR_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvgen.h"

typedef struct kvg_gram kvg_gram;         /* a compiled grammar (immutable, shareable) */
typedef struct kvg_gram_match kvg_gram_match; /* one matcher over it (one generation) */

/* Parses GBNF text; errors are KVGEN_E_INVALID_ARGUMENT "grammar: line L column C: ..." or
 * name the rule ("grammar: rule 'x' (line L column C) ..."). Bounds (refused naming the bound
 * and the byte offset): groups nested 256 deep, repetition counts 4096, 1 << 20 elements with
 * every repetition written out (nested repetitions multiply). */
kvgen_status kvg_gram_parse(const char *text, kvg_gram **out, kvgen_error *err);
void kvg_gram_free(kvg_gram *g);

/* Compiles a JSON schema (text) to GBNF (*gbnf malloc'd, caller frees); errors name the schema
 * path and the keyword: "schema: #/properties/a: keyword 'pattern' is not supported". */
kvgen_status kvg_schema_to_gbnf(const char *schema, char **gbnf, kvgen_error *err);

/* The matcher's work is bounded per call (one mask, one feed) in counted steps, and its memory
 * by bounds on its stacks and states; a call that reaches one fails (KVGEN_E_UNSUPPORTED, the
 * message names the bound and the grammar's cost) and so does every later call until a reset. */
kvgen_status kvg_gram_match_new(const kvg_gram *g, kvg_gram_match **out, kvgen_error *err);
void kvg_gram_match_free(kvg_gram_match *mt);
void kvg_gram_match_reset(kvg_gram_match *mt); /* back to the start; forgets a failure */
/* The bound on steps per call (<= 0: the default, 1 << 21); tests set smaller ones. */
void kvg_gram_match_set_max_steps(kvg_gram_match *mt, long max_steps);
/* Why the matcher stopped (a bound or out of memory); NULL while it has not. */
const kvgen_error *kvg_gram_match_failure(const kvg_gram_match *mt);
/* Feeds bytes; false (state unchanged) when the grammar does not accept them here, or when
 * the matcher failed (kvg_gram_match_failure). */
bool kvg_gram_feed(kvg_gram_match *mt, const unsigned char *bytes, size_t n);
bool kvg_gram_can_end(const kvg_gram_match *mt); /* the text so far is a complete sentence */
bool kvg_gram_done(const kvg_gram_match *mt);    /* complete, and nothing can follow */

/* The vocabulary as a byte trie, built on first use and kept on the model (thread-safe). */
typedef struct kvg_vocab_trie kvg_vocab_trie;
kvgen_status kvg_vocab_trie_get(const kvgen_model *m, const kvg_vocab_trie **out, kvgen_error *err);
/* A trie of n tokens whose bytes are bytes[off[t] .. off[t + 1]), eog[t] != 0 for an
 * end-of-generation token (tests: a vocabulary of their own); NULL when out of memory. */
kvg_vocab_trie *kvg_vocab_trie_build(int n, const uint32_t *off, const unsigned char *bytes, const uint8_t *eog);
void kvg_vocab_trie_free(kvg_vocab_trie *t);
/* allowed[t] = 1 for each token whose bytes the matcher accepts (end-of-generation tokens when
 * the text can end), 0 for every other; returns how many are allowed. n_vocab bytes. -1 (and
 * err) when the matcher reached a bound. */
int kvg_gram_mask(kvg_gram_match *mt, const kvg_vocab_trie *trie, uint8_t *allowed, kvgen_error *err);
/* The same, token by token (tests: the reference the trie walk is checked against). */
int kvg_gram_mask_brute(kvg_gram_match *mt, const kvgen_model *m, uint8_t *allowed);

#endif
