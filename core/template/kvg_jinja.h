/* kvg_jinja.h: a small Jinja interpreter for chat templates (private).
 *
 * Folder core/template/ owns the template language and uses nothing of kvgen but base/ (the
 * allocator, buffers, the JSON codec for its JSON inputs): it parses a template once
 * (kvg_jinja_parse) and renders it for a conversation (kvg_jinja_render) with the settings Hugging Face's apply_chat_template uses (trim_blocks
 * and lstrip_blocks on, loop controls, raise_exception, strftime_now, its tojson).
 *
 * The subset: {{ }}, {% if/elif/else %}, {% for %} (loop.*, else, inline if, over lists,
 * strings and dicts), {% set %} (names, tuples, namespace attributes, set blocks), {% macro %},
 * {% break/continue %}, {% generation %}, comments, whitespace control; expressions with
 * literals, arithmetic, ~, comparisons, in, and/or/not, if-else, indexing and slicing,
 * attributes, filters, tests and the string/dict methods templates call (str.format too);
 * dict keys may be strings, numbers, booleans or none, as in Python.
 *
 * Every byte of the rendered text says whether it came from the caller's message content
 * (user[i] = 1): the caller tokenizes those bytes without special-token parsing, so content
 * can never become a control token. Every string of the JSON inputs (a message's fields, the
 * extra variables: tool descriptions, tool calls' arguments) counts as content.
 *
 * JSON numbers written without '.', 'e' or 'E' that fit 64 bits are integers, the rest floats
 * (as Python's json module reads them).
 *
 * Bounded: output size, memory, nesting and loop iterations are limited; a malformed template
 * or a runtime error gives a message with line and column, never a crash. */
#ifndef KVG_JINJA_H
#define KVG_JINJA_H
#include <stdbool.h>
#include <stddef.h>

typedef struct kvg_jinja kvg_jinja;

typedef struct kvg_jinja_msg {
    const char *role, *content; /* NUL-terminated */
    /* NULL, or a JSON object whose members the message also has, as Hugging Face passes them
     * (tool_calls, tool_call_id, reasoning_content, name, ...); "content" here (null for an
     * assistant turn of tool calls alone) replaces `content`, "role" is ignored */
    const char *fields;
} kvg_jinja_msg;

typedef struct kvg_jinja_input {
    const kvg_jinja_msg *messages;
    size_t n_messages;
    bool add_generation_prompt;
    const char *bos_token, *eos_token; /* NULL: "" */
    /* NULL, or a JSON object whose members are further variables of the template (tools,
     * enable_thinking, ...), over the global functions; tools and documents are none unless
     * given (as apply_chat_template passes them); messages, add_generation_prompt, bos_token
     * and eos_token are always the ones above */
    const char *vars;
} kvg_jinja_input;

typedef struct kvg_jinja_output {
    char *text;          /* NUL-terminated; free() both */
    unsigned char *user; /* one flag per byte of text: 1 where it came from message content */
    size_t len;
} kvg_jinja_output;

/* Parses src; on failure returns false with "line L column C: what" in msg. */
bool kvg_jinja_parse(const char *src, size_t len, kvg_jinja **out, char *msg, size_t msg_size);
void kvg_jinja_free(kvg_jinja *t);
/* Renders; on failure returns false with a message (line, column, what) and *out zeroed. */
bool kvg_jinja_render(const kvg_jinja *t, const kvg_jinja_input *in, kvg_jinja_output *out, char *msg,
                      size_t msg_size);

#endif
