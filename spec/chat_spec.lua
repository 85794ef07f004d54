-- Chat turns under Jinja templates: many turns at context 128 with the system prompt kept,
-- through s:chat, s:chat_stream, s:submit_chat and s:chat_stream_async (each turn holds the
-- latest turns in order, never ones a shift dropped, and a shift in the middle of a reply
-- leaves the chat usable); a switch to a family and back; a template that renders nothing;
-- the numbers of a turn that does not fit. The default model on the cpu backend.
local support = require("kvgen_support")
local kvgen = support.kvgen
local error_of = support.error_of

local GIVEN = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
  .. "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
local SYSTEM = "You are Brom, the gate guard of Eastwatch."

-- The user turns "[qNN] ..." the session holds, in order, and its text.
local function turns(m, s)
  local text = m:detokenize(s:tokens(), { special = true })
  local got = {}
  for q in text:gmatch("user\n%[q(%d+)%]") do got[#got + 1] = tonumber(q) end
  return got, text
end

local entries = {
  chat = function(s, msg, opts) return (s:chat(msg, opts)) end,
  chat_stream = function(s, msg, opts)
    local t = {}
    for piece in s:chat_stream(msg, opts) do t[#t + 1] = piece end
    return table.concat(t)
  end,
  submit_chat = function(s, msg, opts)
    local job <close> = s:submit_chat(msg, opts)
    local text, finish = support.poll_to_end(job, { seconds = 300 })
    assert(finish ~= "error", job.error)
    return text
  end,
  chat_stream_async = function(s, msg, opts)
    local t = {}
    for piece in s:chat_stream_async(msg, opts) do t[#t + 1] = piece end
    return table.concat(t)
  end,
}

describe("chat under Jinja templates (default model) #model", function()
  local m
  setup(function() m = kvgen.load(support.model_path(), { backend = "cpu" }) end)
  teardown(function()
    m:close()
    collectgarbage()
  end)

  local function shifted_chat(entry, tpl)
    local probe <close> = m:session { system = SYSTEM, template = tpl }
    local keep = probe.length
    local s <close> = m:session { context = 128, on_full = "shift", keep = keep, system = SYSTEM, template = tpl }
    local first = 0
    for q = 1, 8 do
      local msg = string.format("[q%02d] Tell me about the old tower by the river, and the bridge.", q)
      local ok, e = pcall(entries[entry], s, msg, { max_tokens = 20 })
      assert(ok, string.format("turn %d: %s", q, tostring(e)))
      local held, text = turns(m, s)
      assert.is_true(#held > 0, text)
      for i = 2, #held do assert.are.equal(held[i - 1] + 1, held[i], text) end
      assert.are.equal(q, held[#held], text)
      assert.are.equal("<|im_start|>system\n" .. SYSTEM .. "<|im_end|>\n", text:sub(1, #SYSTEM + 30))
      first = held[1]
    end
    assert.is_true(s:cache_info().shifts >= 3)
    assert.is_true(first > 1, "no turn was shifted out")
  end

  for _, entry in ipairs { "chat", "chat_stream", "submit_chat", "chat_stream_async" } do
    it(entry .. ": turns survive context shifts (the caller's template)", function()
      shifted_chat(entry, { jinja = GIVEN })
    end)
  end
  it("chat: turns survive context shifts (the file's template)", function()
    shifted_chat("chat", nil)
  end)

  it("a switch to a family and back keeps each message in its role", function()
    local s <close> = m:session()
    local r1 = s:chat("[q01] Who are you?", { max_tokens = 12 })
    s:set_template("chatml")
    local r2 = s:chat("[q02] Where is the gate?", { max_tokens = 12 })
    s:set_template(nil)
    assert.are.equal("jinja", s.template)
    s:add("user", "[q03] Thanks.")
    local want = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      .. "<|im_start|>user\n[q01] Who are you?<|im_end|>\n<|im_start|>assistant\n" .. r1 .. "<|im_end|>\n"
      .. "<|im_start|>user\n[q02] Where is the gate?<|im_end|>\n<|im_start|>assistant\n" .. r2 .. "<|im_end|>\n"
      .. "<|im_start|>user\n[q03] Thanks.<|im_end|>\n"
    assert.are.equal(want, m:detokenize(s:tokens(), { special = true }))
  end)

  it("a template that renders nothing is named in the error", function()
    local s <close> = m:session { template = { jinja = "{% if false %}x{% endif %}" } }
    local e = error_of(s.chat, s, "hi")
    assert.matches("the session's chat template renders nothing", e, 1, true)
    assert.are.equal(0, s.length)
    e = error_of(function() for _ in s:chat_stream_async("hi") do end end)
    assert.matches("renders nothing", e, 1, true)
    assert.are.equal(0, s.length)
  end)

  it("a turn that does not fit reports the session's own numbers", function()
    local s <close> = m:session {
      context = 64,
      template = { jinja = "turns {{ messages | length }}\n{% for m in messages %}{{ m.role }}: {{ m.content }}\n"
        .. "{% endfor %}" },
    }
    local e
    for _ = 1, 64 do
      local ok, err = pcall(s.add, s, "user", "one more line of text")
      if not ok then
        e = err
        break
      end
    end
    assert.is_string(e)
    assert.matches("^kvgen: context full %(" .. s.length .. "/64%)", e)
  end)
  describe("tools, tool calls and template variables", function()
    local TOOLS_TPL = "{% for t in tools or [] %}T:{{ t.function.name }} {{ t.function.parameters | tojson }}\n{% endfor %}"
      .. "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
      .. "{% for c in m.tool_calls or [] %}<call {{ c.id }} {{ c.function.name }} {{ c.function.arguments | tojson }}>"
      .. "{% endfor %}{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %}"
      .. "{% if m.reasoning_content %}[{{ m.reasoning_content }}]{% endif %}<|im_end|>\n{% endfor %}"
      .. "{% if add_generation_prompt %}<|im_start|>assistant\n"
      .. "{% if enable_thinking is false %}<think></think>{% endif %}{% endif %}{{ npc | default('') }}"
    local TOOLS = {
      { type = "function", ["function"] = { name = "get_price", description = "Price in gold.",
        parameters = { type = "object", properties = { item = { type = "string" } }, required = { "item" } } } },
    }

    it("s:chat takes tools and template_vars; s:add takes tool calls; s:add_tool_result a result", function()
      local s <close> = m:session { template = { jinja = TOOLS_TPL } }
      s:add("user", "How much is a sword?")
      s:add("assistant", "", { tool_calls = { { id = "c1", type = "function",
        ["function"] = { name = "get_price", arguments = { item = "sword" } } } }, reasoning_content = "look it up" })
      s:add_tool_result("c1", { price = 12 })
      s:chat(nil, { tools = TOOLS, template_vars = { enable_thinking = false, npc = "" }, max_tokens = 1 })
      local text = m:detokenize(s:tokens(), { special = true })
      -- a table's keys in order (a schema's properties in its required order first), as for schemas
      local want = 'T:get_price {"properties": {"item": {"type": "string"}}, "required": ["item"], "type": "object"}\n'
        .. "<|im_start|>user\nHow much is a sword?<|im_end|>\n"
        .. '<|im_start|>assistant\n<call c1 get_price {"item": "sword"}>[look it up]<|im_end|>\n'
        .. '<|im_start|>tool\n{"price":12}#c1<|im_end|>\n<|im_start|>assistant\n<think></think>'
      assert.are.equal(want, text:sub(1, #want))
      -- the variables stay for later turns, and a session file keeps them with the fields
      local path = os.tmpname()
      s:save(path)
      local r <close> = m:restore(path)
      os.remove(path)
      local kept = want:sub(1, #want - #"<think></think>") -- the reply is a message now
      for _, x in ipairs { s, r } do
        x:add("user", "Thanks")
        assert.are.equal(kept, m:detokenize(x:tokens(), { special = true }):sub(1, #kept))
      end
      s:set_chat_vars(nil)
      s:add("user", "Bye")
      assert.is_nil(m:detokenize(s:tokens(), { special = true }):find("T:get_price", 1, true))
    end)

    it("submit_chat takes tools and the tool role", function()
      local s <close> = m:session { template = { jinja = TOOLS_TPL } }
      s:add("user", "Price of a bow?")
      s:add("assistant", "", { tool_calls = '[{"id": "c2", "type": "function", '
        .. '"function": {"name": "get_price", "arguments": "{\\"item\\": \\"bow\\"}"}}]' })
      local job <close> = s:submit_chat('{"price": 3}', { role = "tool", tools = TOOLS, max_tokens = 1 })
      local _, finish = support.poll_to_end(job, { seconds = 300 })
      assert.are_not.equal("error", finish, job.error)
      local text = m:detokenize(s:tokens(), { special = true })
      assert.matches('^T:get_price', text)
      assert.matches('<call c2 get_price "{\\"item\\": \\"bow\\"}"><|im_end|>\n<|im_start|>tool\n{"price": 3}<|im_end|>\n',
        text, 1, true)
    end)

    it("bad tools, fields and variables name the call and change nothing", function()
      local s <close> = m:session { template = { jinja = TOOLS_TPL } }
      s:add("user", "hi")
      local len = s.length
      local e = error_of(s.chat, s, "x", { tools = 5 })
      assert.matches("option 'tools': a table or JSON text expected, got number", e, 1, true)
      e = error_of(s.chat, s, "x", { tools = "[1," })
      assert.matches("option 'tools'", e, 1, true)
      e = error_of(s.chat, s, "x", { tools = { print } })
      assert.matches("a function cannot be JSON at tools[1]", e, 1, true)
      e = error_of(s.add, s, "assistant", "", { tool_calls = "{" })
      assert.matches("kvgen_chat_add_message: tool_calls: not valid JSON", e, 1, true)
      e = error_of(s.add, s, "assistant", "", { tool_calls = { { id = "c1" } } })
      assert.matches("tool_calls[0]: not", e, 1, true)
      e = error_of(s.add, s, "assistant", "", { tool_id = "c1" })
      assert.matches("tool_id", e, 1, true)
      e = error_of(s.add_tool_result, s, 5, "x")
      assert.matches("id: string expected, got number", e, 1, true)
      e = error_of(s.set_chat_vars, s, "[1]")
      assert.matches("kvgen_chat_set_vars: json: not a JSON object", e, 1, true)
      e = error_of(s.set_chat_vars, s, { messages = {} })
      assert.matches("\"messages\" is the chat's own variable", e, 1, true)
      assert.are.equal(len, s.length)
      -- a turn refused after the options' variables were set puts the old ones back
      local small <close> = m:session { template = { jinja = TOOLS_TPL }, context = 48 }
      small:set_chat_vars { npc = "A" }
      e = error_of(small.chat, small, string.rep("word ", 60), { template_vars = { npc = "B" } })
      assert.matches("context full", e, 1, true)
      assert.are.equal(0, small.length)
      small:add("user", "x")
      assert.matches("A$", m:detokenize(small:tokens(), { special = true }))
      -- a built-in family has no place for tool messages
      local f <close> = m:session { template = "chatml" }
      e = error_of(s.add_tool_result, f, "c1", "12")
      assert.matches("need a Jinja chat template", e, 1, true)
      assert.are.equal(0, f.length)
    end)
  end)
end)

describe("the conversation read back and undone (random model)", function()
  local m
  setup(function() m = support.random_model() end)
  teardown(function() support.release(m) end)

  local SYSTEM_MSG = { role = "system", content = "You keep a shop." }
  local USERS = { "Hello there", "A sword, please", "Goodbye" }
  local ANSWERS = { "Welcome!", "A sword is 12 gold." }

  -- A system prompt and n user turns, each answered with a choice (so the reply is known);
  -- returns the session and the messages it should hold.
  local function converse(n, tpl)
    local s = m:session { system = SYSTEM_MSG.content, template = tpl or { jinja = GIVEN } }
    local want = { SYSTEM_MSG }
    for i = 1, n do
      assert.are.equal(ANSWERS[i], (s:chat(USERS[i], { choices = { ANSWERS[i] } })))
      want[#want + 1] = { role = "user", content = USERS[i] }
      want[#want + 1] = { role = "assistant", content = ANSWERS[i] }
    end
    return s, want
  end

  local function first(t, n) return table.move(t, 1, n, 1, {}) end

  it("s:messages() gives what was added and generated, in order", function()
    local s <close>, want = converse(2)
    assert.are.same(want, s:messages())
    local none <close> = m:session()
    assert.are.same({}, none:messages())
    -- the reply being generated is the last message while the stream runs
    local st <close> = m:session { template = { jinja = GIVEN } }
    local stream = st:chat_stream(USERS[1], { choices = { ANSWERS[1] } })
    local text = {}
    for piece in stream do
      text[#text + 1] = piece
      local now = st:messages()
      assert.are.same({ role = "assistant", content = table.concat(text) }, now[2])
    end
    assert.are.equal(ANSWERS[1], table.concat(text))
    assert.are.same({ { role = "user", content = USERS[1] }, { role = "assistant", content = table.concat(text) } },
      st:messages())
  end)

  for _, case in ipairs { { "a Jinja template", { jinja = GIVEN } }, { "a built-in family", "chatml" } } do
    it("s:undo(n) under " .. case[1] .. ": the next turn is as on a session that never had the messages",
      function()
        local s <close>, want = converse(2, case[2])
        local ref <close> = converse(1, case[2])
        s:undo()     -- the second reply
        assert.are.same(first(want, 4), s:messages())
        s:undo(1)    -- the second user turn
        assert.are.same(first(want, 3), s:messages())
        assert.are.same(ref:messages(), s:messages())
        if case[2] ~= "chatml" then -- (a family keeps the closed reply's end of turn in the cache)
          assert.are.same(ref:tokens(), s:tokens())
        end
        local a = s:chat(USERS[3], { max_tokens = 4, ignore_eog = true })
        local b = ref:chat(USERS[3], { max_tokens = 4, ignore_eog = true })
        assert.are.equal(b, a)
        assert.are.same(ref:tokens(), s:tokens())
        assert.are.same(ref:logits(5), s:logits(5))
      end)
  end

  it("s:undo takes the system prompt too when n reaches it", function()
    local s <close>, want = converse(1)
    s:undo(#want)
    assert.are.equal(0, s.length)
    assert.are.same({}, s:messages())
    s:chat(USERS[1], { choices = { ANSWERS[1] } })
    assert.are.same({ { role = "user", content = USERS[1] }, { role = "assistant", content = ANSWERS[1] } },
      s:messages())
  end)

  it("tool calls, results and reasoning read back as given", function()
    local s <close> = m:session { template = { jinja = GIVEN } }
    local calls = { { id = "c1", type = "function", ["function"] = { name = "get_price", arguments = { item = "sword" } } } }
    s:add("user", "How much is a sword?")
    s:add("assistant", "", { tool_calls = calls, reasoning_content = "look it up" })
    s:add_tool_result("c1", "12")
    assert.are.same({
      { role = "user", content = "How much is a sword?" },
      { role = "assistant", content = "", tool_calls = calls, reasoning_content = "look it up" },
      { role = "tool", content = "12", tool_call_id = "c1" },
    }, s:messages())
    s:undo(2)
    assert.are.same({ { role = "user", content = "How much is a sword?" } }, s:messages())
  end)

  it("bad n names the call, the argument and the value, and changes nothing", function()
    local s <close>, want = converse(2)
    local tokens = s:tokens()
    local function undo(n) return error_of(function() s:undo(n) end) end
    assert.matches("bad argument #1 to 'undo' (n: -1 is out of range [0, 5] (the messages held))", undo(-1), 1, true)
    assert.matches("bad argument #1 to 'undo' (n: 6 is out of range [0, 5]", undo(6), 1, true)
    assert.matches("bad argument #1 to 'undo' (n: integer expected, got number 1.5)", undo(1.5), 1, true)
    assert.matches("bad argument #1 to 'undo' (n: integer expected, got string", undo("1"), 1, true)
    assert.are.same(tokens, s:tokens())
    assert.are.same(want, s:messages())
    s:undo(0)
    assert.are.same(want, s:messages())
    s:close()
    assert.matches("closed", error_of(function() return s:messages() end), 1, true)
  end)
end)
