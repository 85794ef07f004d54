#!/usr/bin/env python3
"""Chat-template fixtures with tools, tool calls, tool results, reasoning and extra template
variables, rendered by jinja2 the way Hugging Face's apply_chat_template renders them: the same
environment as chat_templates.py, and render(messages=..., tools=..., documents=None,
add_generation_prompt=..., bos_token=..., eos_token=..., **extra variables) (tools None when
not given).

    python3 scripts/oracle/chat_tools.py > core/tests/fixtures/chat_tools.txt

Templates: Qwen2.5-Coder-0.5B-Instruct's own (read from models/ with gguf-py; without gguf-py or
the file, the copy in core/tests/fixtures/chat_templates.txt), the published Qwen3 template of
chat_templates.py, the model publishers' own templates in scripts/oracle/templates/ (PUBLISHED
below names the model each comes from) and Gemma 3's (chat_templates.py), and one-feature
templates for the interpreter's Python details (dicts with keys that are not strings,
str.format, filters of none, 'in' an undefined value).

Records as in chat_templates.py (lengths in bytes, payload on the following line):
    template NAME LEN          then the template source
    case NAME TEMPLATE AGP N   then:
    bos LEN / eos LEN          the special tokens' text
    msg ROLE LEN               a message's content, followed by
    fields LEN                 its further fields as a JSON object ("null": none)
    vars LEN                   the extra template variables as a JSON object ("null": none)
    expect LEN | expect error  the rendered text, or a template error
    ids FILE LEN               (after expect, for the Qwen templates' cases whose messages the
                               public chat calls can add) Hugging Face's token ids of the text,
                               for models/FILE, as in chat_templates.py (needs transformers)
"""
import json
import os
import sys

import jinja2

sys.path.insert(0, os.path.dirname(__file__))
from chat_templates import GEMMA3, QWEN3, ROOT, env, hf_tokenizers, record  # noqa: E402

# The publishers' chat templates (tokenizer_config.json's chat_template, "tool_use" where a model
# has several), as files in scripts/oracle/templates/: name -> (model, file). Hermes-2-Pro-Llama-3-8B's
# tool_use template is the same text as Hermes-3-Llama-3.1-8B's.
PUBLISHED = {
    "llama31": ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama-Llama-3.1-8B-Instruct.jinja"),
    "llama32": ("meta-llama/Llama-3.2-3B-Instruct", "meta-llama-Llama-3.2-3B-Instruct.jinja"),
    "mistral_nemo": ("mistralai/Mistral-Nemo-Instruct-2407", "mistralai-Mistral-Nemo-Instruct-2407.jinja"),
    "hermes3": ("NousResearch/Hermes-3-Llama-3.1-8B (tool_use)", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"),
    "qwen25": ("Qwen/Qwen2.5-7B-Instruct", "Qwen-Qwen2.5-7B-Instruct.jinja"),
    "qwen3_06b": ("Qwen/Qwen3-0.6B", "Qwen-Qwen3-0.6B.jinja"),
    "phi4_mini": ("microsoft/Phi-4-mini-instruct", "microsoft-Phi-4-mini-instruct.jinja"),
}
# the special tokens' text each family's template is given
BOS_EOS = {
    "llama31": ("<|begin_of_text|>", "<|eot_id|>"), "llama32": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistral_nemo": ("<s>", "</s>"), "hermes3": ("<|begin_of_text|>", "<|im_end|>"),
    "phi4_mini": ("<|endoftext|>", "<|endoftext|>"), "gemma3": ("<bos>", "<eos>"),
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_price", "description": "The price of an item in the village shop, in gold coins.",
        "parameters": {"type": "object", "properties": {
            "item": {"type": "string", "description": "what to buy"},
            "quantity": {"type": "integer", "minimum": 1}}, "required": ["item"]}}},
    {"type": "function", "function": {
        "name": "give_item", "description": "Hand an item to the player (\"é\" <ok>).",
        "parameters": {"type": "object", "properties": {"item": {"type": "string"}, "weight": {"type": "number"}},
                       "required": ["item"]}}},
]

CALL = {"id": "call_1", "type": "function", "function": {"name": "get_price", "arguments": {"item": "sword", "quantity": 1}}}
CALL2 = {"id": "call_2", "type": "function",
         "function": {"name": "give_item", "arguments": {"item": "shield", "weight": 2.5, "note": None, "ok": True}}}
CALL_STR = {"id": "call_3", "type": "function", "function": {"name": "get_price", "arguments": "{\"item\": \"bow\"}"}}
# ids of nine letters and digits (Mistral's templates refuse any other)
CALL9 = {"id": "a1b2c3d4e", "type": "function", "function": {"name": "get_price", "arguments": {"item": "sword", "quantity": 1}}}
CALL9_2 = {"id": "f5g6h7i8j", "type": "function",
           "function": {"name": "give_item", "arguments": {"item": "shield", "weight": 2.5}}}
SEARCH = {"id": "call_4", "type": "function", "function": {"name": "brave_search", "arguments": {"query": "sword prices"}}}
# Phi-4-mini takes the tools as JSON text in the system message's "tools" field (a list of the
# functions themselves), and its replies' calls stay in the content as the model writes them
PHI_TOOLS = json.dumps([t["function"] for t in TOOLS], ensure_ascii=False)
PHI_CALL = "<|tool_call|>[{\"name\": \"get_price\", \"arguments\": {\"item\": \"sword\", \"quantity\": 1}}]<|/tool_call|>"

# the model file whose tokenizer gives a case's token ids: the Qwen templates, on the Qwen2.5 vocabulary
TOKEN_FILES = {name: "qwen2.5-coder-0.5b-instruct.gguf" for name in ("qwen25_coder", "qwen25", "qwen3", "qwen3_06b")}
# the fields kvgen_chat_message carries ("content": null with tool calls: content NULL)
PUBLIC_FIELDS = {"tool_calls", "tool_call_id", "reasoning_content", "content"}


def public(msgs):
    """whether the public chat calls can add these messages as they are"""
    for role, _content, fields in msgs:
        if role not in ("system", "user", "assistant", "tool") or not set(fields or {}) <= PUBLIC_FIELDS:
            return False
        if fields and "content" in fields and (fields["content"] is not None or "tool_calls" not in fields):
            return False
    return True


# (role, content, further fields or None)
CONVERSATIONS = {
    "tool_call": [("system", "You are Mira, the village blacksmith.", None),
                  ("user", "How much is a sword?", None),
                  ("assistant", "", {"tool_calls": [CALL]}),
                  ("tool", "{\"price\": 12}", {"tool_call_id": "call_1"})],
    "two_calls": [("user", "Price a sword and give me a shield.", None),
                  ("assistant", "Let me check.", {"tool_calls": [CALL, CALL2]}),
                  ("tool", "12", {"tool_call_id": "call_1"}),
                  ("tool", "done", {"tool_call_id": "call_2", "name": "give_item"}),
                  ("assistant", "A sword is 12 gold; here is your shield.", None),
                  ("user", "And a bow?", None),
                  ("assistant", "", {"content": None, "tool_calls": [CALL_STR]})],
    "reasoning": [("user", "2+2?", None),
                  ("assistant", "4", {"reasoning_content": "two and two\n"}),
                  ("user", "and 3+3?", None)],
    "plain": [("user", "Hello! Who are you?", None)],
    # a call, its result (as a JSON object in content, as Llama's template allows), the answer, more
    "call9": [("system", "You are Mira, the village blacksmith.", None),
              ("user", "How much is a sword?", None),
              ("assistant", "", {"content": None, "tool_calls": [CALL9]}),
              ("tool", "{\"price\": 12}", {"tool_call_id": "a1b2c3d4e"}),
              ("assistant", "A sword is 12 gold.", None),
              ("user", "And a shield?", None)],
    "call9_two": [("user", "Price a sword and give me a shield.", None),
                  ("assistant", "", {"content": None, "tool_calls": [CALL9, CALL9_2]}),
                  ("tool", "12", {"tool_call_id": "a1b2c3d4e"}),
                  ("tool", "done", {"tool_call_id": "f5g6h7i8j"})],
    "result_object": [("user", "How much is a sword?", None),
                      ("assistant", "", {"tool_calls": [CALL]}),
                      ("ipython", "", {"content": {"price": 12, "currency": "gold"}})],
    "builtin": [("user", "Search for sword prices.", None),
                ("assistant", "", {"tool_calls": [SEARCH]}),
                ("ipython", "[\"12 gold\"]", None)],
    "phi_tools": [("system", "You are Mira, the village blacksmith.", {"tools": PHI_TOOLS}),
                  ("user", "How much is a sword?", None),
                  ("assistant", PHI_CALL, {"tool_calls": [CALL]}),
                  ("tool", "{\"price\": 12}", {"tool_call_id": "call_1"}),
                  ("assistant", "A sword is 12 gold.", None),
                  ("user", "Thanks!", None)],
    "alternating": [("user", "one", None), ("assistant", "two", None), ("user", "three", None)],
    # as kvgen gives them to Phi-4-mini's template: the tools in the system message (one of no
    # text where the chat has none), a call as text after the content
    "phi_session": [("system", "You are Mira, the village blacksmith.", {"tools": PHI_TOOLS}),
                    ("user", "How much is a sword?", None),
                    ("assistant", PHI_CALL, None),
                    ("tool", "{\"price\": 12}", {"tool_call_id": "call_1"})],
    "phi_nosys": [("system", "", {"tools": PHI_TOOLS}), ("user", "How much is a sword?", None)],
}

VARS = {
    "none": None,
    "tools": {"tools": TOOLS},
    "tools_nothink": {"tools": TOOLS, "enable_thinking": False},
    "think": {"enable_thinking": True},
    "nothink": {"enable_thinking": False},
    "tools_dated": {"tools": TOOLS, "date_string": "05 Dec 2026"},
    "tools_system": {"tools": TOOLS, "date_string": "05 Dec 2026", "tools_in_user_message": False},
    "builtin": {"tools": TOOLS, "date_string": "05 Dec 2026", "builtin_tools": ["brave_search", "code_interpreter"]},
    "dated": {"date_string": "05 Dec 2026"},
}

# (template, conversation, variables) cases
CASES = [
    ("qwen25_coder", "tool_call", "tools"), ("qwen25_coder", "two_calls", "tools"),
    ("qwen25_coder", "tool_call", "none"), ("qwen25_coder", "plain", "tools"),
    ("qwen3", "tool_call", "tools"), ("qwen3", "two_calls", "tools_nothink"), ("qwen3", "reasoning", "think"),
    ("qwen3", "reasoning", "nothink"), ("qwen3", "plain", "nothink"), ("qwen3", "two_calls", "none"),
    ("feat_tools", "two_calls", "tools_nothink"), ("feat_tools", "reasoning", "none"),
    ("feat_gaps", "plain", "none"),
    ("feat_vars", "plain", "none"),
    ("feat_undef", "plain", "none"),
]
# the published templates: tools, calls (one, several, arguments as JSON text), results, plain
for _t in ("llama31", "llama32"):
    CASES += [(_t, "tool_call", "tools_dated"), (_t, "tool_call", "tools_system"), (_t, "two_calls", "tools_dated"),
              (_t, "call9", "tools_dated"), (_t, "result_object", "tools_dated"), (_t, "builtin", "builtin"),
              (_t, "plain", "tools_dated"), (_t, "plain", "dated"), (_t, "alternating", "dated")]
CASES += [("llama31", "plain", "tools"), ("llama31", "tool_call", "none")]
CASES += [("mistral_nemo", "call9", "tools"), ("mistral_nemo", "call9", "none"), ("mistral_nemo", "call9_two", "tools"),
          ("mistral_nemo", "tool_call", "tools"), ("mistral_nemo", "plain", "tools"),
          ("mistral_nemo", "alternating", "none"), ("mistral_nemo", "two_calls", "tools")]
for _t in ("hermes3", "qwen25", "qwen3_06b"):
    CASES += [(_t, "tool_call", "tools"), (_t, "two_calls", "tools"), (_t, "call9_two", "tools"),
              (_t, "plain", "tools"), (_t, "tool_call", "none"), (_t, "alternating", "none")]
CASES += [("qwen3_06b", "reasoning", "think"), ("qwen3_06b", "two_calls", "tools_nothink"),
          ("qwen3_06b", "plain", "nothink")]
CASES += [("phi4_mini", "phi_tools", "tools"), ("phi4_mini", "phi_tools", "none"), ("phi4_mini", "plain", "none"),
          ("phi4_mini", "alternating", "tools"), ("phi4_mini", "tool_call", "tools"),
          ("phi4_mini", "phi_session", "tools"), ("phi4_mini", "phi_nosys", "tools")]
CASES += [("gemma3", "plain", "tools"), ("gemma3", "alternating", "tools"), ("gemma3", "tool_call", "tools"),
          ("gemma3", "call9", "tools")]

FEATURES = {
    "feat_tools": "{% for t in tools or [] %}{{ t.function.name }}: {{ t | tojson }}\n{% endfor %}"
                  "{% for m in messages %}{{ m.role }}: {{ m.content }}"
                  "{% for c in m.tool_calls or [] %} <{{ c.id }} {{ c.function.name }} {{ c.function.arguments | tojson }}>"
                  "{% endfor %}{% if m.tool_call_id is defined %} #{{ m.tool_call_id }}{% endif %}"
                  "{% if m.name is defined %} @{{ m.name }}{% endif %}"
                  "{% if m.reasoning_content %} [{{ m.reasoning_content | trim }}]{% endif %}\n{% endfor %}"
                  "{{ enable_thinking is defined }} {{ enable_thinking }} {{ tools is none }} {{ documents is none }}",
    "feat_gaps": "{{ none | selectattr('a') | list }}|{{ none | rejectattr('a', 'equalto', 1) | list }}|"
                 "{{ none | select | list }}|{{ none | reject('none') | list }}|{{ none | map(attribute='a') | list }}|"
                 "{{ none | map('upper') | list }}|{{ nothing | selectattr('role') | list }}|"
                 "{{ 'a' in nothing }} {{ 'a' not in nothing }} {{ nothing in [1] }}|"
                 "{% set d = {1: 'one', 2: 'two', 'k': 3, none: 'n', 1.5: 'f', true: 't'} %}"
                 "{{ d[1] }} {{ d[2] }} {{ d.k }} {{ d[none] }} {{ d[1.5] }} {{ d['1'] is defined }} {{ d }} "
                 "{{ d | tojson }} {{ 2 in d }} {{ '2' in d }} {{ d.get(2) }}"
                 "{% for k, v in d.items() %}[{{ k }}={{ v }}]{% endfor %}{{ {0: 'z'} == {0.0: 'z'} }}|"
                 "{{ '{} {}'.format('a', 1) }} {{ '{0}-{1}-{0}'.format('x', 2.5) }} "
                 "{{ '{name}!'.format(name=messages[0].role) }} {{ '{{}} {}'.format(none) }} "
                 "{{ '{0[0]} {0[1]}'.format([1, 'b']) }} {{ '{m.role}: {m[content]}'.format(m=messages[0]) }} "
                 "{{ '{}'.format(true) }} {{ '{!s}'.format([1, 'a']) }} {{ 'x'.format(1) }}",
    # string filters of an undefined value (Hermes' template trims a parameter's missing description)
    "feat_undef": "[{{ messages[0].y | trim }}][{{ nothing | upper }}][{{ nothing | lower }}][{{ nothing | string }}]"
                  "[{{ nothing | length }}][{{ nothing | title }}][{{ nothing | replace('a', 'b') }}]"
                  "[{{ 'a' + nothing | trim }}][{{ nothing | capitalize }}]"
                  "[{{ messages[0].nothing | trim }}]",
    "feat_vars": "{{ npc_name }} {{ mood | default('calm') }} {{ level + 1 }} {{ items | join(',') }} "
                 "{{ stats.hp }} {{ stats.tags[1] }} {{ big }} {{ ratio }} {{ flag }} {{ missing is none }}",
}
FEATURE_VARS = {
    "feat_vars": {"npc_name": "Mira", "level": 41, "items": ["sword", "shield"], "stats": {"hp": 9, "tags": ["a", "b"]},
                  "big": 9007199254740993, "ratio": 0.25, "flag": True, "missing": None},
}

BAD = {
    "bad_format_mixed": "{{ '{} {1}'.format('a', 'b') }}",
    "bad_format_missing": "{{ '{}'.format() }}",
    "bad_format_brace": "{{ '{'.format(1) }}",
    "bad_in_none": "{{ 'a' in none }}",
    "bad_dict_key": "{{ {[1]: 2} }}",
}


def added_user_tokens(tok, path):
    """The GGUF loader leaves the vocabulary's user-defined tokens (type 4: Qwen2.5's <tool_call>
    and </tool_call>) to the BPE model, which spells them in pieces; the published tokenizer.json
    has them as added tokens (not special), matched before the model runs: added so here."""
    from gguf import GGUFReader
    from tokenizers import AddedToken

    r = GGUFReader(path)
    tokens, types = (r.fields[k].contents() for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"))
    tok.backend_tokenizer.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                                      for i in range(len(tokens)) if types[i] == 4])


def qwen25_template():
    path = os.path.join(ROOT, "models", "qwen2.5-coder-0.5b-instruct.gguf")
    try:
        from chat_templates import gguf_template
        if os.path.exists(path):
            return gguf_template(path)
    except ImportError:
        pass
    # the copy chat_templates.py took from the same file
    with open(os.path.join(ROOT, "core", "tests", "fixtures", "chat_templates.txt"), "rb") as f:
        while True:
            head = f.readline().decode()
            if not head:
                raise SystemExit("no qwen25_coder template")
            name, n = head.rsplit(" ", 1)
            body = f.read(int(n))
            f.readline()
            if name == "template qwen25_coder":
                return body.decode("utf-8")


def main():
    templates = {"qwen25_coder": qwen25_template(), "qwen3": QWEN3}
    for name, (_model, file) in PUBLISHED.items():
        with open(os.path.join(os.path.dirname(__file__), "templates", file), encoding="utf-8") as f:
            templates[name] = f.read()
    templates["gemma3"] = GEMMA3
    templates.update(FEATURES)
    templates.update(BAD)
    e = env()
    toks = hf_tokenizers(TOKEN_FILES)
    for file, tok in toks.items():
        added_user_tokens(tok, os.path.join(ROOT, "models", file))
    out = sys.stdout.buffer
    for name, src in templates.items():
        record(out, f"template {name}", src)
    cases = list(CASES) + [(name, "plain", "none") for name in BAD]
    for tname, cname, vname in cases:
        msgs = CONVERSATIONS[cname]
        variables = FEATURE_VARS.get(tname, VARS[vname])
        for agp in (False, True):
            bos, eos = BOS_EOS.get(tname, ("", "<|im_end|>"))
            out.write(f"case {tname}/{cname}/{vname}/{int(agp)} {tname} {int(agp)} {len(msgs)}\n".encode())
            record(out, "bos", bos)
            record(out, "eos", eos)
            messages = []
            for role, content, fields in msgs:
                record(out, f"msg {role}", content)
                record(out, "fields", json.dumps(fields, ensure_ascii=False))
                m = {"role": role, "content": content}
                m.update(fields or {})
                messages.append(m)
            record(out, "vars", json.dumps(variables, ensure_ascii=False))
            kw = dict(variables or {})
            tools = kw.pop("tools", None)
            try:
                text = e.from_string(templates[tname]).render(messages=messages, tools=tools, documents=None,
                                                              add_generation_prompt=agp, bos_token=bos,
                                                              eos_token=eos, **kw)
                record(out, "expect", text)
                file = TOKEN_FILES.get(tname)
                if file in toks and public(msgs):
                    ids = toks[file](text, add_special_tokens=False)["input_ids"]
                    record(out, f"ids {file}", " ".join(str(i) for i in ids))
            except (jinja2.TemplateError, TypeError, ValueError, IndexError, KeyError):
                out.write(b"expect error\n")


if __name__ == "__main__":
    main()
