-- Tool calls: a Hermes-style template (<tool_call> blocks) on a random-weight model. A call
-- forced by tool_choice (required or a tool's name) comes back as finish "tool_calls" with
-- arguments valid for the tool's schema, goes into the conversation as the assistant's
-- tool_calls, and the next turn takes the tool's result. Bad tools name the option. On the
-- default model (greedy), tool_choice auto: the model writes <tool_call> itself and the tools'
-- grammar takes over from there (a gate outside the schema's enum cannot be written).
local support = require("kvgen_support")
local error_of = support.error_of

local HERMES = "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
  .. "</tools>\nCall a tool with <tool_call>\n{\"name\": <name>, \"arguments\": <args>}\n</tool_call><|im_end|>\n"
  .. "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}"
  .. "{% for c in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
  .. "{{ c.function.arguments | tojson }}{{ '}' }}\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
  .. "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
local PLAIN = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"

local TOOLS = {
  { name = "open_gate", description = "Opens a gate.",
    parameters = { type = "object", properties = { gate = { type = "string", enum = { "north", "south" } },
      count = { type = "integer" } }, required = { "gate", "count" } } },
  { name = "ring_bell", description = "Rings the bell.",
    parameters = { type = "object", properties = { times = { type = "integer" } }, required = { "times" } } },
}

describe("tool calls", function()
  local m
  setup(function() m = support.random_model() end)
  teardown(function() support.release(m) end)

  it("tool_choice required forces a valid call, kept in the conversation; the result's turn follows", function()
    local s <close> = m:session { context = 4096, template = { jinja = HERMES } }
    local text, finish, calls = s:chat("Open the north gate", { tools = TOOLS, tool_choice = "required" })
    assert.are.equal("tool_calls", finish)
    assert.are.equal("", text)
    assert.are.equal(1, #calls)
    local c = calls[1]
    assert.matches("^call_", c.id)
    assert.is_true(c.name == "open_gate" or c.name == "ring_bell")
    if c.name == "open_gate" then
      assert.is_true(c.arguments.gate == "north" or c.arguments.gate == "south")
      assert.are.equal("integer", math.type(c.arguments.count))
    else
      assert.are.equal("integer", math.type(c.arguments.times))
    end
    local msgs = s:messages()
    local last = msgs[#msgs]
    assert.are.equal("assistant", last.role)
    assert.are.equal(c.id, last.tool_calls[1].id)
    assert.are.equal(c.name, last.tool_calls[1]["function"].name)
    local rendered = m:detokenize(s:tokens(), { special = true })
    assert.matches('<tool_call>\n{"name": "' .. c.name .. '", "arguments": {', rendered, 1, true)
    s:add_tool_result(c.id, { ok = true })
    assert.truthy(rendered:find("<tools>", 1, true))
    local _, f2 = s:chat(nil, { tools = TOOLS, tool_choice = "none", max_tokens = 3 })
    assert.is_string(f2)
    -- tool_choice none: the template is not shown the tools; the earlier call stays
    rendered = m:detokenize(s:tokens(), { special = true })
    assert.falsy(rendered:find("<tools>", 1, true))
    assert.truthy(rendered:find('<tool_call>\n{"name": "' .. c.name, 1, true))
    msgs = s:messages()
    assert.are.equal("tool", msgs[3].role)
    assert.are.equal(c.id, msgs[3].tool_call_id)
    assert.are.equal('{"ok":true}', msgs[3].content)
  end)

  it("a tool's name forces that tool; chat_stream gives the calls on the stream", function()
    local s <close> = m:session { context = 4096, template = { jinja = HERMES } }
    local _, finish, calls = s:chat("Ring", { tools = TOOLS, tool_choice = "ring_bell" })
    assert.are.equal("tool_calls", finish)
    assert.are.equal("ring_bell", calls[1].name)
    assert.are.equal("integer", math.type(calls[1].arguments.times))
    local st = s:chat_stream("Again", { tools = TOOLS, tool_choice = "open_gate" })
    local streamed = {}
    for piece in st do streamed[#streamed + 1] = piece end
    assert.are.equal("", table.concat(streamed)) -- the call's markup is not streamed
    assert.are.equal("tool_calls", st.finish)
    assert.are.equal("open_gate", st.tool_calls[1].name)
    assert.are.equal(3, #s:messages() - 1) -- user, call, user, call
  end)

  it("Llama 3, Mistral and Phi-4-mini templates: a forced call in their formats", function()
    local LLAMA = "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}"
      .. "{% for c in m.tool_calls or [] %}{\"name\": \"{{ c.function.name }}\", \"parameters\": "
      .. "{{ c.function.arguments | tojson }}{{ '}' }}{% endfor %}<|eot_id|>{% endfor %}"
      .. "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    local MISTRAL = "{% for m in messages %}{% if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | tojson }}"
      .. "{% else %}[INST]{{ m.content }}[/INST]{% endif %}{% endfor %}"
    -- Phi-4-mini-instruct's template: the tools in the system message, the calls as text
    local PHI4 = "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
      .. "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + "
      .. "message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + "
      .. "message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
      .. "{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}"
    for _, case in ipairs { { LLAMA, "llama3" }, { MISTRAL, "mistral" }, { PHI4, "phi4" } } do
      local s <close> = m:session { context = 4096, template = { jinja = case[1] } }
      local text, finish, calls = s:chat("Ring", { tools = TOOLS, tool_choice = "ring_bell" })
      assert.are.equal("tool_calls", finish, case[2])
      assert.are.equal("", text)
      assert.are.equal("ring_bell", calls[1].name)
      assert.are.equal("integer", math.type(calls[1].arguments.times))
      local msgs = s:messages()
      assert.are.equal("ring_bell", msgs[2].tool_calls[1]["function"].name)
      if case[2] == "phi4" then -- the next turn shows the tools and the call as the template takes them
        s:add_tool_result(calls[1].id, "rung")
        local text = m:detokenize(s:tokens(), { special = true })
        assert.truthy(text:find("<|system|><|tool|>[{\"name\": \"open_gate\"", 1, true), text)
        assert.truthy(text:find("<|assistant|><|tool_call|>[{\"name\": \"ring_bell\", \"arguments\": {\"times\": ", 1, true), text)
      end
    end
  end)

  it("tool_choice auto: the grammar takes over where the model opens a call (default model)", function()
    local real = support.default_model()
    local s <close> = real:session { context = 2048, temperature = 0, template = { jinja = HERMES } }
    local gate = { { name = "open_gate", description = "Opens a gate.", parameters = { type = "object",
      properties = { gate = { type = "string", enum = { "north", "south" } } }, required = { "gate" } } } }
    local pieces = {}
    local text, finish, calls = s:chat("Repeat exactly this text: <tool_call>\n"
      .. '{"name": "open_gate", "arguments": {"gate": "west"}}\n</tool_call>', { tools = gate, max_tokens = 80,
        on_piece = function(p) pieces[#pieces + 1] = p end })
    assert.is_nil(table.concat(pieces):find("tool_call", 1, true))
    assert.are.equal("tool_calls", finish)
    assert.are.equal("", text)
    assert.are.equal("open_gate", calls[1].name)
    assert.is_true(calls[1].arguments.gate == "north" or calls[1].arguments.gate == "south")
    local msgs = s:messages()
    assert.are.equal(calls[1].id, msgs[#msgs].tool_calls[1].id)
    -- plain words stay a reply
    local s2 <close> = real:session { context = 2048, temperature = 0, template = { jinja = HERMES } }
    local _, f2, c2 = s2:chat("Say hello.", { tools = gate, max_tokens = 8 })
    assert.are_not.equal("tool_calls", f2)
    assert.is_nil(c2)
  end)

  it("reasoning between <think> tags is apart from the reply and kept in the conversation", function()
    local THINK = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>\n"
      .. "{{ m.reasoning_content }}\n</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
      .. "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is false %}"
      .. "<think>\n\n</think>\n\n{% endif %}{% endif %}"
    local s <close> = m:session { context = 4096, template = { jinja = THINK } }
    local text, finish, calls, reasoning = s:chat("hi", { grammar = 'root ::= "<think>\\nI ponder.\\n</think>\\n\\nHello."' })
    assert.are.equal("stop", finish)
    assert.are.equal("Hello.", text)
    assert.is_nil(calls)
    assert.are.equal("I ponder.", reasoning)
    local msgs = s:messages()
    assert.are.equal("Hello.", msgs[2].content)
    assert.are.equal("I ponder.", msgs[2].reasoning_content)
    -- a stream has it as st.reasoning
    local st = s:chat_stream("again", { grammar = 'root ::= "<think>ok</think>Yes."' })
    for _ in st do end
    assert.are.equal("Yes.", st.text)
    assert.are.equal("ok", st.reasoning)
    -- thinking = false reaches the template as enable_thinking
    s:chat("quiet", { thinking = false, max_tokens = 1 })
    assert.matches("quiet<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
      m:detokenize(s:tokens(), { special = true }), 1, true)
    assert.matches("option 'thinking': a boolean expected", error_of(s.chat, s, "x", { thinking = 1 }), 1, true)
  end)

  it("a stream gives the reasoning apart: no tag, no thought in its text", function()
    local THINK = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>\n"
      .. "{{ m.reasoning_content }}\n</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
      .. "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    local s <close> = m:session { context = 4096, template = { jinja = THINK } }
    local grammar = 'root ::= "<think>\\nThe gate is old.\\n</think>\\n\\nIt stays shut."'
    local text, thought, steps, thinking_steps = {}, {}, 0, 0
    local st = s:chat_stream("Open it?", { grammar = grammar })
    for piece, token, reasoning in st do
      steps = steps + 1
      assert.is_string(piece)
      assert.are.equal("integer", math.type(token))
      assert.is_nil(piece:find("<", 1, true))
      assert.is_nil(piece:find("old", 1, true))
      text[#text + 1] = piece
      if reasoning then
        thinking_steps = thinking_steps + 1
        assert.is_nil(reasoning:find("<", 1, true))
        assert.is_nil(reasoning:find("think", 1, true))
        thought[#thought + 1] = reasoning
      end
    end
    assert.are.equal("stop", st.finish)
    assert.are.equal("It stays shut.", table.concat(text))
    assert.are.equal("It stays shut.", st.text)
    assert.are.equal("The gate is old.", table.concat(thought))
    assert.are.equal("The gate is old.", st.reasoning)
    assert.is_true(thinking_steps >= 2 and steps > thinking_steps)
    -- on_piece gets them the same way
    local got, gotr = {}, {}
    local t2, f2, _, r2 = s:chat("Again?", { grammar = grammar, on_piece = function(piece, _, reasoning)
      got[#got + 1] = piece
      gotr[#gotr + 1] = reasoning
    end })
    assert.are.equal("stop", f2)
    assert.are.equal(t2, table.concat(got))
    assert.are.equal(r2, table.concat(gotr))
    assert.are.equal("The gate is old.", r2)
    -- a forced tool call streams nothing of its markup
    local h <close> = m:session { context = 4096, template = { jinja = HERMES } }
    local hs = h:chat_stream("Open the north gate", { tools = TOOLS, tool_choice = "open_gate" })
    for piece in hs do assert.are.equal("", piece) end
    assert.are.equal("tool_calls", hs.finish)
    assert.are.equal("open_gate", hs.tool_calls[1].name)
  end)

  it("a tool call cut by max_tokens or a stop string is no call, and the conversation keeps none", function()
    for _, opts in ipairs { { max_tokens = 6 }, { stop = "count" } } do
      local s <close> = m:session { context = 4096, template = { jinja = HERMES } }
      opts.tools, opts.tool_choice = TOOLS, "open_gate"
      local text, finish, calls = s:chat("Open the north gate", opts)
      assert.are.equal(opts.stop and "stop_string" or "length", finish)
      assert.are.equal("", text)
      assert.is_nil(calls)
      local msgs = s:messages()
      assert.are.equal(2, #msgs)
      assert.are.equal("assistant", msgs[2].role)
      assert.is_nil(msgs[2].tool_calls)
      assert.is_nil((msgs[2].content or ""):find("tool_call", 1, true))
      local rendered, reply = m:detokenize(s:tokens(), { special = true }), 0
      repeat
        local at = rendered:find("<|im_start|>assistant\n", reply + 1, true)
        reply = at or reply
      until not at
      assert.is_true(reply > 0)
      assert.is_nil(rendered:find("<tool_call>", reply, true))
    end
  end)

  it("a chat job takes tools and thinking as s:chat does", function()
    local s <close> = m:session { context = 4096, template = { jinja = HERMES } }
    local job = s:submit_chat("Open the north gate", { tools = TOOLS, tool_choice = "open_gate" })
    local streamed = {}
    for piece in job do streamed[#streamed + 1] = piece end
    assert.are.equal("done", job.state)
    assert.are.equal("tool_calls", job.finish)
    assert.are.equal("", table.concat(streamed))
    assert.are.equal("", job.text)
    local calls = job.tool_calls
    assert.are.equal(1, #calls)
    assert.are.equal("open_gate", calls[1].name)
    assert.is_true(calls[1].arguments.gate == "north" or calls[1].arguments.gate == "south")
    assert.matches("^call_", calls[1].id)
    local msgs = s:messages()
    assert.are.equal(calls[1].id, msgs[2].tool_calls[1].id)
    s:add_tool_result(calls[1].id, { ok = true })
    -- cut by max_tokens inside the call: no call, none kept
    local cut = s:submit_chat("And the south one", { tools = TOOLS, tool_choice = "open_gate", max_tokens = 6 })
    for _ in cut do end
    assert.are.equal("length", cut.finish)
    assert.is_nil(cut.tool_calls)
    msgs = s:messages()
    assert.is_nil(msgs[#msgs].tool_calls)
    assert.are.equal("assistant", msgs[#msgs].role)
    -- reasoning apart from the job's text, and kept
    local THINK = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>\n"
      .. "{{ m.reasoning_content }}\n</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
      .. "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    local t <close> = m:session { context = 4096, template = { jinja = THINK } }
    local think = t:submit_chat("Open it?", { grammar = 'root ::= "<think>\\nThe gate is old.\\n</think>\\n\\nNo."' })
    streamed = {}
    for piece in think do streamed[#streamed + 1] = piece end
    assert.are.equal("stop", think.finish)
    assert.are.equal("No.", table.concat(streamed))
    assert.are.equal("No.", think.text)
    assert.are.equal("The gate is old.", think.reasoning)
    assert.is_nil(think.tool_calls)
    msgs = t:messages()
    assert.are.equal("The gate is old.", msgs[2].reasoning_content)
    -- a job queued behind another on the same session takes its tools too
    local first = s:submit_chat("Ring it", { tools = TOOLS, tool_choice = "ring_bell" })
    local second = s:submit_chat("Once more", { tools = TOOLS, tool_choice = "ring_bell" })
    for _ in second do end
    assert.are.equal("tool_calls", first.finish)
    assert.are.equal("tool_calls", second.finish)
    assert.are.equal("ring_bell", second.tool_calls[1].name)
    assert.are_not.equal(first.tool_calls[1].id, second.tool_calls[1].id)
    -- a job that is no chat turn reads no calls
    assert.matches("unknown option 'tools'", error_of(s.submit, s, "x", { tools = TOOLS }), 1, true)
  end)

  it("a chat job queued on a busy session takes thinking and template_vars, set when its turn starts", function()
    local THINK = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      .. "{% if add_generation_prompt %}<|im_start|>assistant{{ npc | default('') }}\n"
      .. "{% if enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
    local s <close> = m:session { context = 4096, template = { jinja = THINK } }
    -- a turn that runs until cancelled keeps the session busy: the host may not set its variables
    local long = s:submit_chat("Talk", { max_tokens = math.tointeger(2 ^ 31 - 1), ignore_eog = true })
    assert.matches("is busy", error_of(s.set_chat_vars, s, { npc = "x" }), 1, true)
    local quiet = s:submit_chat("Quiet", { thinking = false, template_vars = { npc = "[Guard]" }, max_tokens = 1 })
    -- bad variables are refused at submit, naming the option
    assert.matches("option 'template_vars': \"messages\" is the chat's own variable",
      error_of(s.submit_chat, s, "x", { template_vars = { messages = {} } }), 1, true)
    assert.matches("option 'template_vars': not a table of variables",
      error_of(s.chat_stream_async, s, "x", { template_vars = "[1]" }), 1, true)
    assert.matches("option 'thinking': a boolean expected",
      error_of(s.submit_chat, s, "x", { thinking = "no" }), 1, true)
    -- cancelled while queued, and failed at its start (tools under a template that writes no
    -- calls): neither leaves its turn or its variables
    local never = s:submit_chat("Never", { template_vars = { npc = "[Never]" }, max_tokens = 1 })
    never:cancel()
    local failing = s:submit_chat("Open", { tools = TOOLS, template_vars = { npc = "[Failed]" }, max_tokens = 1 })
    local deadline = os.time() + 120
    while long.state ~= "generating" do assert(os.time() < deadline, "timed out") end
    long:cancel() -- after its first token: its turn stays
    support.poll_to_end(long)
    local _, qf = support.poll_to_end(quiet)
    assert.are.equal("length", qf, quiet.error)
    local _, ff = support.poll_to_end(failing) -- the session is the host's again
    assert.are.equal("error", ff)
    assert.are.equal("failed", failing.state)
    assert.matches("tools", failing.error, 1, true)
    assert.are.equal("cancelled", never.state)
    -- the template saw them when the turn started
    local text = m:detokenize(s:tokens(), { special = true })
    local talk = "<|im_start|>user\nTalk<|im_end|>\n<|im_start|>assistant\n"
    assert.are.equal(talk, text:sub(1, #talk))
    local quiet_turn = "<|im_start|>user\nQuiet<|im_end|>\n<|im_start|>assistant[Guard]\n<think>\n\n</think>\n\n"
    assert.matches(quiet_turn, text, 1, true)
    -- the variables stay for later turns, as after s:chat
    local again = s:submit_chat("Again", { max_tokens = 1 })
    local _, af = support.poll_to_end(again)
    assert.are.equal("length", af, again.error)
    text = m:detokenize(s:tokens(), { special = true })
    local again_turn = "<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant[Guard]\n<think>\n\n</think>\n\n"
    assert.matches(again_turn, text, 1, true)
    for _, gone in ipairs { "Never", "Open", "[Failed]" } do assert.is_nil(text:find(gone, 1, true)) end
    for _, j in ipairs { long, quiet, never, failing, again } do j:close() end
  end)

  it("thinking_budget forces the closing tag and the reply goes on", function()
    local OPENED = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
      .. "{% if add_generation_prompt %}assistant: <think>\n{% endif %}{# </think> #}"
    local s <close> = m:session { context = 4096, template = { jinja = OPENED } }
    local text, finish, _, reasoning = s:chat("hi", { thinking_budget = 4, max_tokens = 20 })
    assert.are.equal("length", finish)
    assert.is_string(reasoning)
    local all = m:detokenize(s:tokens(), { special = true })
    local after = all:match("assistant: <think>\n(.*)$")
    assert.is_string(after)
    local cut = after:find("\n</think>\n\n", 1, true)
    assert.is_number(cut)
    assert.are.equal(4, #m:tokenize(after:sub(1, cut - 1)))
    assert.are.equal(after:sub(cut + #"\n</think>\n\n"), text)
    -- without a budget the reply stays inside its reasoning
    local s2 <close> = m:session { context = 4096, template = { jinja = OPENED } }
    local text2, _, _, r2 = s2:chat("hi", { max_tokens = 6 })
    assert.are.equal("", text2)
    assert.is_string(r2)
    assert.matches("option 'thinking_budget': -1 is out of range", error_of(s.chat, s, "x", { thinking_budget = -1 }), 1, true)
  end)

  it("bad tools and tool_choice name the option and change nothing", function()
    local s <close> = m:session { context = 4096, template = { jinja = HERMES } }
    s:add("user", "hi")
    local len = s.length
    local e = error_of(s.chat, s, "x", { tools = { { description = "no name" } } })
    assert.matches("option 'tools': tools[1]: name: a string expected", e, 1, true)
    e = error_of(s.chat, s, "x", { tools = { { name = "a", parameters = 5 } } })
    assert.matches("tools[1]: parameters: a table (a JSON schema) expected", e, 1, true)
    e = error_of(s.chat, s, "x", { tools = { { name = "a", parameters = { type = "string", pattern = "x+" } } } })
    assert.matches("tools[0].parameters ('a')", e, 1, true)
    assert.matches("pattern", e, 1, true)
    e = error_of(s.chat, s, "x", { tools = TOOLS, tool_choice = "fly" })
    assert.matches("name 'fly' is none of the tools given", e, 1, true)
    e = error_of(s.chat, s, "x", { tools = { { name = "bad name" } }, tool_choice = "required" })
    assert.matches("tools[0].name 'bad name'", e, 1, true)
    e = error_of(s.chat, s, "x", { tool_choice = "required" })
    assert.matches("option 'tool_choice': no tools given", e, 1, true)
    assert.are.equal(len, s.length)
    assert.are.equal(1, #s:messages())
    assert.is_nil(s.chat_vars)
    local p <close> = m:session { template = { jinja = PLAIN } }
    e = error_of(p.chat, p, "x", { tools = TOOLS, tool_choice = "required" })
    assert.matches("option 'tool_choice': tool calls are read", e, 1, true)
  end)
end)
