/* kvg_toolcall.h: tool calls in a model's own format (private; docs/generation.md, "Tools").
 *
 * toolcall.c holds one table row per format a chat template can ask for (Hermes/Qwen
 * <tool_call> blocks, Llama 3's JSON object, Mistral's [TOOL_CALLS] list, Phi-4-mini's
 * <|tool_call|> list): how a template is recognised, where a call starts in the reply, how
 * calls are written and parsed, how the template takes the tools. kvg_tools
 * is one generation's tools: the format, the tools' compiled argument grammars, the grammar
 * that forces a call (tool_choice required or a name) and, once the reply is finished, the
 * calls parsed from it. */
#ifndef KVG_TOOLCALL_H
#define KVG_TOOLCALL_H
#include <stdbool.h>
#include <stddef.h>
#include "kvgen.h"

typedef struct kvg_tools kvg_tools;

/* The format a template's text asks for ("hermes", "llama3", "mistral", "phi4"), or NULL when it
 * names none kvgen knows. */
const char *kvg_tool_format_detect(const char *tpl, size_t len);
/* The system message's field from which the template reads the tools ("tools": Phi-4-mini's,
 * JSON text of a list of the functions), or NULL when it reads its `tools` variable. */
const char *kvg_tool_system_field(const char *tpl, size_t len);
/* Whether the template renders no tool_calls and takes an assistant's calls as text in its
 * content (Phi-4-mini's). */
bool kvg_tool_calls_as_text(const char *tpl, size_t len);
/* For a template that renders no tool_calls (Phi-4-mini's): the calls of a kvgen_chat_message's
 * tool_calls JSON written as the model writes them, to go into the message's content (a new
 * string, kvg_free it; Python's json.dumps spacing); NULL for any other template (or out of
 * memory). */
char *kvg_tool_calls_text(const char *tpl, size_t len, const char *calls_json);

/* Checks desc and builds a generation's tools for the template `tpl` (its text decides the
 * format). Errors name `who`, the tool's index and field. */
kvgen_status kvg_tools_build(const kvgen_tools_desc *desc, const char *tpl, size_t tpl_len, const char *who,
                             kvg_tools **out, kvgen_error *err);
void kvg_tools_free(kvg_tools *t);
/* Checks desc as kvg_tools_build does, for any template that writes calls (a job's tools, checked
 * at submit before the session's template is known). */
kvgen_status kvg_tools_check(const kvgen_tools_desc *desc, const char *who, kvgen_error *err);
const char *kvg_tools_format(const kvg_tools *t);
/* The grammar that forces one call from the first token (GBNF), or NULL when calls are left to
 * the model (tool_choice auto) or not allowed (none). */
const char *kvg_tools_forced_grammar(const kvg_tools *t);
/* tool_choice auto in a format whose call opener is text (Hermes' <tool_call>): the grammar
 * of what follows the opener, which constrains the reply once *opener appeared in it (a lazy
 * grammar); NULL when the format has none or the choice is not auto. */
const char *kvg_tools_lazy_grammar(const kvg_tools *t, const char **opener);
/* tool_choice auto: the texts where kvg_tools_parse sees a call start in the reply (an opener,
 * or the JSON that begins one), written to marks; how many (0 for any other choice). A
 * generation holds back what may begin one and, once one is there, the rest. */
int kvg_tools_call_marks(const kvg_tools *t, const char *marks[4]);
/* The tools as the template takes them: a JSON array of {"type": "function", "function":
 * {...}} (compact text). */
const char *kvg_tools_json(const kvg_tools *t);

/* Reads a finished reply. No call markup: KVGEN_FINISH_NONE (the reply stands). Calls that all
 * name a tool and whose arguments its schema accepts: KVGEN_FINISH_TOOL_CALLS, the calls kept
 * (ids "call_<id_base>_<i>"; Mistral's: id_base * 1000 + i as nine base-36 digits); anything else: KVGEN_FINISH_BAD_TOOL_CALL, none kept. *content_len:
 * the reply's length before the markup. KVGEN_E_NO_MEMORY is the only error. */
kvgen_status kvg_tools_parse(kvg_tools *t, const char *text, size_t len, size_t id_base, kvgen_finish *finish,
                             size_t *content_len, kvgen_error *err);
/* The calls kept by kvg_tools_parse (valid until kvg_tools_free), and as the JSON array that
 * kvgen_chat_message.tool_calls takes. */
int kvg_tools_calls(const kvg_tools *t, const kvgen_tool_call **calls);
const char *kvg_tools_calls_json(const kvg_tools *t);

/* The think tags a template's text writes (<think> ... </think>: Qwen3, DeepSeek-R1, QwQ),
 * from a small table; false (*open, *close NULL) when it writes none. */
bool kvg_think_detect(const char *tpl, size_t len, const char **open, const char **close);

#endif
