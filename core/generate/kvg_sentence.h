/* kvg_sentence.h: where a reply may end early (private; generate.c's soft_max_tokens).
 *
 * A sentence ends at ". ! ? ..." or "…" (also the full-width "。！？"), followed by any
 * closing quotes, brackets or emphasis marks (" ' ” ’ » ) ] } * _ 」 』 ）), where the
 * next text is whitespace: a space or newline at the end of the text itself, or at the start
 * of the next token's bytes. A single "." after a common abbreviation ("Mr.", "Dr.", "e.g."),
 * a single letter (an initial, "J.") or a number that begins its line (a list's "2.") ends
 * nothing. A line that ends (the newline comes next) also ends a sentence unless it is empty
 * or ends with ':' (which announces more). The full-width marks need no space after them. */
#ifndef KVG_SENTENCE_H
#define KVG_SENTENCE_H
#include <stdbool.h>
#include <stddef.h>

/* The last bytes a decision reads: a caller passes at most this much of the text's tail. */
#define KVG_SENTENCE_TAIL 64

/* 1 when text (its last n bytes, the whole text or a tail of it) followed by next (the next
 * token's bytes, next_n of them; may be empty) ends a sentence at the end of text. */
bool kvg_sentence_ends(const char *text, size_t n, const char *next, size_t next_n);

#endif
