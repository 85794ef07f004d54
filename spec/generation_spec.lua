-- High-level session calls: generate, stream, chat, choose, sampler settings, constraints.
local support = require("kvgen_support")
local kvgen = support.kvgen
local error_of = support.error_of

-- greedy tokens the low-level loop gives after `prompt` (a fresh session of `m`)
local function manual_greedy(m, prompt, n)
  local s <close> = m:session()
  return support.greedy(s, prompt, n)
end

describe("generation (random model)", function()
  local m, s
  setup(function() m = support.random_model() end)
  teardown(function() support.release(m) end)
  before_each(function() s = m:session() end)
  after_each(function() s:close() end)

  describe("generate", function()
    it("gives the tokens the low-level greedy loop gives", function()
      local before = s.length
      local text, finish = s:generate("once upon", { max_tokens = 12, ignore_eog = true })
      assert.are.equal("length", finish)
      local n_prompt = #m:tokenize("once upon")
      assert.are.equal(before + n_prompt + 12, s.length)
      local ids = s:tokens()
      local generated = { table.unpack(ids, n_prompt + 1) }
      assert.are.same(manual_greedy(m, "once upon", 12), generated)
      assert.are.equal(m:detokenize(generated), text)
    end)

    it("continues from the session's logits when the prompt is nil", function()
      s:prefill("once upon")
      local a = s:generate(nil, { max_tokens = 6, ignore_eog = true })
      local t <close> = m:session()
      assert.are.equal(a, (t:generate("once upon", { max_tokens = 6, ignore_eog = true })))
    end)

    it("takes the prompt as token ids", function()
      local t <close> = m:session()
      local ids = m:tokenize("once upon")
      assert.are.equal(s:generate(ids, { max_tokens = 5, ignore_eog = true }),
        (t:generate("once upon", { max_tokens = 5, ignore_eog = true })))
    end)

    it("max_tokens defaults to 256 and stops early at the context limit", function()
      local t <close> = m:session { context = 40 }
      local _, finish = t:generate("abc", { ignore_eog = true })
      assert.are.equal("context_full", finish)
      assert.are.equal(40, t.length)
      local u <close> = m:session { context = 400 }
      local _, finish2 = u:generate("abc", { ignore_eog = true })
      assert.are.equal("length", finish2)
      assert.are.equal(#m:tokenize("abc") + 256, u.length)
    end)

    it("max_tokens = -1 runs until the context is full", function()
      local t <close> = m:session { context = 24 }
      local _, finish = t:generate("abc", { max_tokens = -1, ignore_eog = true })
      assert.are.equal("context_full", finish)
      assert.are.equal(24, t.length)
    end)

    it("stops at a stop string, which is not part of the text", function()
      local full = s:generate("once upon", { max_tokens = 24, ignore_eog = true })
      -- take a stop string from the middle of what greedy generation writes
      local stop = full:sub(9, 10)
      local expected = full:sub(1, full:find(stop, 1, true) - 1)
      for _, form in ipairs { stop, { "\1never\1", stop } } do
        local t <close> = m:session()
        local text, finish = t:generate("once upon", { max_tokens = 24, ignore_eog = true, stop = form })
        assert.are.equal("stop_string", finish)
        assert.are.equal(expected, text)
      end
    end)

    it("constrains output to one of the choices", function()
      local text, finish = s:generate("pick:", { choices = { "left", "right", "up" } })
      assert.are.equal("stop", finish)
      assert.is_truthy(text == "left" or text == "right" or text == "up", text)
    end)

    it("constrains output to a flat JSON object", function()
      local text, finish = s:generate("json:", {
        max_tokens = 100,
        json = {
          { key = "name", type = "string", max_len = 8 },
          { key = "age", type = "number" },
          { key = "mood", type = "enum", values = { "happy", "sad" } },
        },
      })
      assert.are.equal("stop", finish)
      assert.matches('^{"name":"[^"]*","age":%-?%d+%.?%d*,"mood":"[hs][a][pd]%a*"}$', text)
    end)

    it("calls on_piece with each piece and its token", function()
      local pieces, tokens = {}, {}
      local text = s:generate("once upon", {
        max_tokens = 10,
        ignore_eog = true,
        on_piece = function(piece, token)
          pieces[#pieces + 1] = piece
          tokens[#tokens + 1] = token
        end,
      })
      assert.are.equal(text, table.concat(pieces))
      for _, t in ipairs(tokens) do assert.are.equal("integer", math.type(t)) end
    end)

    it("on_piece returning false cancels", function()
      local calls = 0
      local text, finish = s:generate("once upon", {
        max_tokens = 50,
        ignore_eog = true,
        on_piece = function()
          calls = calls + 1
          return calls < 2 and true or false
        end,
      })
      assert.are.equal("cancelled", finish)
      assert.are.equal(2, calls)
      assert.is_string(text)
    end)

    it("a Lua error in on_piece is raised to the caller and the session stays usable", function()
      local ok, err = pcall(s.generate, s, "once upon", {
        max_tokens = 50,
        ignore_eog = true,
        on_piece = function() error({ reason = "mine" }) end,
      })
      assert.is_false(ok)
      assert.are.same({ reason = "mine" }, err)
      local len = s.length
      assert.is_true(len > 0)
      s:prefill("more")
      assert.is_true(s.length > len)
      local ok2, err2 = pcall(s.generate, s, nil, { on_piece = function() error("plain") end, ignore_eog = true })
      assert.is_false(ok2)
      assert.matches("plain", err2)
    end)

    it("rejects bad options", function()
      assert.matches("prompt: string, table of token ids or nil expected, got number", error_of(s.generate, s, 5))
      assert.matches("unknown option 'max'", error_of(s.generate, s, "x", { max = 3 }))
      assert.matches("option 'max_tokens': %-2 is out of range", error_of(s.generate, s, "x", { max_tokens = -2 }))
      assert.matches("option 'max_tokens': integer expected", error_of(s.generate, s, "x", { max_tokens = "3" }))
      assert.matches("option 'soft_max_tokens': %-1 is out of range", error_of(s.generate, s, "x", { soft_max_tokens = -1 }))
      assert.matches("soft_max_tokens 4 with a constraint",
        error_of(s.generate, s, "x", { soft_max_tokens = 4, choices = { "a", "b" } }))
      assert.matches("option 'stop': string or list of strings expected, got number", error_of(s.generate, s, "x", { stop = 1 }))
      assert.matches("option 'stop': stop strings must not be empty", error_of(s.generate, s, "x", { stop = "" }))
      assert.matches("stop%[2%]: non%-empty string expected, got number", error_of(s.generate, s, "x", { stop = { "a", 2 } }))
      assert.matches("option 'ignore_eog': boolean expected", error_of(s.generate, s, "x", { ignore_eog = 1 }))
      assert.matches("option 'special': boolean expected", error_of(s.generate, s, "x", { special = "yes" }))
      assert.matches("option 'choices': a non%-empty list", error_of(s.generate, s, "x", { choices = {} }))
      assert.matches("choices%[1%]: non%-empty string expected, got an empty string", error_of(s.generate, s, "x", { choices = { "" } }))
      assert.matches("option 'json': a non%-empty list of fields", error_of(s.generate, s, "x", { json = {} }))
      assert.matches("json%[1%]%.type", error_of(s.generate, s, "x", { json = { { key = "a", type = "bool" } } }))
      assert.matches("json%[1%]%.key", error_of(s.generate, s, "x", { json = { { type = "number" } } }))
      assert.matches("json%[1%]%.values", error_of(s.generate, s, "x", { json = { { key = "a", type = "enum" } } }))
      assert.matches("cannot be combined", error_of(s.generate, s, "x", { choices = { "a" }, json = { { key = "a", type = "number" } } }))
      assert.matches("option 'on_piece': function expected, got string", error_of(s.generate, s, "x", { on_piece = "print" }))
      assert.are.equal(0, s.length, "a refused call must not prefill its prompt")
    end)

    it("needs logits: a kvgen error on an empty session without a prompt", function()
      assert.matches("^kvgen: .*no logits", error_of(s.generate, s))
      assert.are.equal("invalid_argument", (kvgen.last_error()))
    end)
  end)

  describe("stream", function()
    it("yields the pieces generate returns", function()
      local t <close> = m:session()
      local expected = t:generate("once upon", { max_tokens = 10, ignore_eog = true })
      local pieces = {}
      local st
      for piece, token in s:stream("once upon", { max_tokens = 10, ignore_eog = true }) do
        assert.is_true(#piece > 0)
        assert.are.equal("integer", math.type(token))
        pieces[#pieces + 1] = piece
      end
      assert.are.equal(expected, table.concat(pieces))
    end)

    it("exposes finish, text, n_tokens and session", function()
      local st = s:stream("once upon", { max_tokens = 4, ignore_eog = true })
      assert.are.equal("stream", kvgen.type(st))
      assert.are.equal("none", st.finish)
      assert.are.equal(s, st.session)
      assert.matches("^kvgen.Stream %(generating%)", tostring(st))
      local parts = {}
      for piece in st do parts[#parts + 1] = piece end
      assert.are.equal("length", st.finish)
      assert.are.equal(4, st.n_tokens)
      assert.are.equal(table.concat(parts), st.text)
      assert.are.equal("closed stream", kvgen.type(st))
      assert.matches("^kvgen.Stream %(length%)", tostring(st))
      assert.is_nil(st())
      assert.is_nil(st:next())
    end)

    it("keeps the session busy until it ends; reading is allowed", function()
      local st = s:stream("once upon", { max_tokens = 4, ignore_eog = true })
      local busy = "kvgen.Session is busy"
      assert.matches(busy, error_of(s.prefill, s, "x"))
      assert.matches(busy, error_of(s.decode, s, 1))
      assert.matches(busy, error_of(s.generate, s, "x"))
      assert.matches(busy, error_of(s.stream, s, "x"))
      assert.matches(busy, error_of(s.fork, s))
      assert.matches(busy, error_of(s.rewind, s, 1))
      assert.matches(busy, error_of(s.reset, s))
      assert.matches(busy, error_of(s.choose, s, { "a" }))
      assert.is_true(s.length > 0)
      assert.is_table(s:tokens())
      assert.is_table(s:cache_info())
      st:close()
      st:close()
      assert.are.equal("cancelled", st.finish)
      s:prefill("x")
    end)

    it("breaking out of the loop closes the stream", function()
      for _ in s:stream("once upon", { max_tokens = 20, ignore_eog = true }) do break end
      s:prefill("free again")
    end)

    it("an unclosed, unreachable stream frees the session when collected", function()
      s:stream("once upon", { max_tokens = 20, ignore_eog = true })
      assert.matches("busy", error_of(s.prefill, s, "x"))
      collectgarbage()
      collectgarbage()
      s:prefill("free again")
    end)

    it("cancel ends the stream at the next step", function()
      local st = s:stream("once upon", { max_tokens = 20, ignore_eog = true })
      st:cancel()
      assert.is_nil(st())
      assert.are.equal("cancelled", st.finish)
    end)

    it("closing the session ends its stream", function()
      local t = m:session()
      local st = t:stream("once upon", { max_tokens = 20, ignore_eog = true })
      t:close()
      assert.are.equal("closed stream", kvgen.type(st))
      assert.are.equal("cancelled", st.finish)
      assert.is_nil(st())
    end)

    it("works as a to-be-closed variable", function()
      do
        local st <close> = s:stream("once upon", { max_tokens = 20, ignore_eog = true })
        st()
      end
      s:prefill("free again")
    end)

    it("rejects bad arguments and on_piece", function()
      assert.matches("unknown option 'on_piece'", error_of(s.stream, s, "x", { on_piece = print }))
      assert.matches("prompt: string, table of token ids or nil expected, got boolean", error_of(s.stream, s, true))
      assert.matches("kvgen.Stream expected", error_of(getmetatable(s:stream("x")).__call, s))
    end)
  end)

  describe("chat", function()
    it("takes the family from the vocabulary when the file has no template", function()
      -- the random model's synthetic vocabulary has ChatML's turn tokens
      assert.are.equal("chatml", s.template)
    end)

    it("needs a template: a model with GPT-2's vocabulary has none and no turn tokens", function()
      local bare <close> = kvgen.load(support.random_model_path("--vocab core/tests/fixtures/tokenizer/ggml-vocab-gpt-2.gguf"),
        { backend = "reference" })
      local bs <close> = bare:session()
      assert.is_nil(bs.template)
      assert.matches("^kvgen: .*chat_template", error_of(bs.chat, bs, "hi"))
      assert.are.equal("unsupported", (kvgen.last_error()))
    end)

    it("uses a built-in template chosen by name", function()
      s:set_template("chatml")
      assert.are.equal("chatml", s.template)
      local reply, finish = s:chat("hi", { max_tokens = 5 })
      assert.is_string(reply)
      assert.is_truthy(finish == "stop" or finish == "length")
      local text = m:detokenize(s:tokens(), { special = true })
      assert.matches("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", text, 1, true)
    end)

    it("uses a custom template", function()
      s:set_template { user_prefix = "U: ", user_suffix = "\n", assistant_prefix = "A: ", assistant_suffix = "\n" }
      assert.are.equal("custom", s.template)
      s:chat("hello", { max_tokens = 3, ignore_eog = true })
      assert.matches("^U: hello\nA: ", m:detokenize(s:tokens()))
    end)

    it("system and template options at creation", function()
      local t <close> = m:session { template = "chatml", system = "You are a test." }
      assert.matches("^<|im_start|>system\nYou are a test.<|im_end|>\n", m:detokenize(t:tokens(), { special = true }))
    end)

    it("add appends whole turns; chat(nil) only opens the reply", function()
      s:set_template("chatml")
      s:add("system", "sys")
      s:add("user", "question")
      s:add("assistant", "answer")
      s:add("user", "again")
      s:chat(nil, { max_tokens = 2, ignore_eog = true })
      local text = m:detokenize(s:tokens(), { special = true })
      assert.matches("<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n", text, 1, true)
    end)

    it("never parses template tokens in the user's text", function()
      s:set_template("chatml")
      s:chat("<|im_end|>", { max_tokens = 1 })
      local im_end = m:token("<|im_end|>")
      local count = 0
      for _, t in ipairs(s:tokens()) do if t == im_end then count = count + 1 end end
      assert.are.equal(1, count) -- only the one closing the user turn
    end)

    it("chat_stream streams a reply; on_piece works with chat", function()
      s:set_template("chatml")
      local t <close> = m:session { template = "chatml" }
      local pieces = {}
      for p in s:chat_stream("hi", { max_tokens = 6, ignore_eog = true }) do pieces[#pieces + 1] = p end
      local seen = {}
      local reply = t:chat("hi", { max_tokens = 6, ignore_eog = true, on_piece = function(p) seen[#seen + 1] = p end })
      assert.are.equal(reply, table.concat(pieces))
      assert.are.equal(reply, table.concat(seen))
    end)

    it("role option", function()
      s:set_template("chatml")
      s:chat("notes", { role = "system", max_tokens = 1 })
      assert.matches("<|im_start|>system\nnotes", m:detokenize(s:tokens(), { special = true }), 1, true)
    end)

    it("rejects bad arguments", function()
      s:set_template("chatml")
      assert.matches("message: string or nil expected, got number", error_of(s.chat, s, 1))
      assert.matches("option 'role': 'narrator' is not one of", error_of(s.chat, s, "x", { role = "narrator" }))
      assert.matches("invalid option 'narrator'", error_of(s.add, s, "narrator", "x"))
      assert.matches("text: string expected, got no value", error_of(s.add, s, "user"))
      assert.matches("template: string or table expected, got number", error_of(s.set_template, s, 1))
      assert.matches("template: unknown field 'user'", error_of(s.set_template, s, { user = "x" }))
      assert.matches("template.user_prefix: string expected", error_of(s.set_template, s, { user_prefix = 1 }))
      assert.matches("^kvgen: ", error_of(s.set_template, s, "klingon"))
      assert.are.equal("unsupported", (kvgen.last_error()))
      assert.matches("unknown option 'role'", error_of(s.stream, s, "x", { role = "user" }))
      assert.matches("option 'stop'", error_of(s.chat, s, "x", { stop = 1 }))
      assert.matches("option 'max_tokens'", error_of(s.chat_stream, s, "x", { max_tokens = "x" }))
      assert.are.equal(0, s.length, "a refused call must not add a turn")
    end)

    it("set_template(nil) returns to the model's template", function()
      s:set_template("llama3")
      assert.are.equal("llama3", s.template)
      s:set_template(nil)
      assert.are.equal("chatml", s.template) -- the model's own (from its vocabulary)
    end)
  end)

  describe("choose", function()
    it("scores candidates and leaves the session unchanged", function()
      s:prefill("the answer is")
      local len, top = s.length, s:logits(3)
      local best, logprobs, details = s:choose { " yes", " no", " maybe later" }
      assert.is_true(best >= 1 and best <= 3)
      assert.are.equal(3, #logprobs)
      for i, lp in ipairs(logprobs) do
        assert.is_true(lp <= 0)
        assert.are.equal(lp, details[i].logprob)
        assert.is_true(details[i].n_tokens >= 1)
        assert.is_true(math.abs(details[i].logprob_mean * details[i].n_tokens - lp) < 1e-9)
      end
      for i = 1, 3 do assert.is_true(logprobs[best] >= logprobs[i]) end
      assert.are.equal(len, s.length)
      assert.are.same(top, s:logits(3))
    end)

    it("by = 'mean' picks by the mean log-probability", function()
      s:prefill("the answer is")
      local best, _, details = s:choose({ " yes", " no", " maybe later" }, { by = "mean" })
      for i = 1, 3 do assert.is_true(details[best].logprob_mean >= details[i].logprob_mean) end
    end)

    it("rejects bad arguments", function()
      s:prefill("x")
      assert.matches("candidates: list of strings expected, got string", error_of(s.choose, s, "a"))
      assert.matches("candidates: a non%-empty list", error_of(s.choose, s, {}))
      assert.matches("candidates%[2%]: non%-empty string expected, got number", error_of(s.choose, s, { "a", 1 }))
      assert.matches("option 'by': 'max' is not one of", error_of(s.choose, s, { "a" }, { by = "max" }))
      local t <close> = m:session()
      assert.matches("^kvgen: ", error_of(t.choose, t, { "a" }))
    end)
  end)

  describe("sampler settings", function()
    it("sampler() reports what the session was created with", function()
      local t <close> = m:session {
        seed = 5, temperature = 0.8, top_k = 20, top_p = 0.9, min_p = 0.05, repeat_penalty = 1.1,
        frequency_penalty = 0.2, presence_penalty = 0.3, penalty_window = 32, bias = { [3] = 1.5 },
      }
      local sd = t:sampler()
      assert.are.equal(5, sd.seed)
      assert.is_true(math.abs(sd.temperature - 0.8) < 1e-6)
      assert.are.equal(20, sd.top_k)
      assert.is_true(math.abs(sd.top_p - 0.9) < 1e-6)
      assert.is_true(math.abs(sd.min_p - 0.05) < 1e-6)
      assert.is_true(math.abs(sd.repeat_penalty - 1.1) < 1e-6)
      assert.is_true(math.abs(sd.frequency_penalty - 0.2) < 1e-6)
      assert.is_true(math.abs(sd.presence_penalty - 0.3) < 1e-6)
      assert.are.equal(32, sd.penalty_window)
      assert.are.same({ [3] = 1.5 }, sd.bias)
    end)

    it("set_sampler changes the given settings and keeps the rest", function()
      s:set_sampler { temperature = 0.5, bias = { [7] = -1 } }
      s:set_sampler { top_k = 3 }
      local sd = s:sampler()
      assert.is_true(math.abs(sd.temperature - 0.5) < 1e-6)
      assert.are.equal(3, sd.top_k)
      assert.are.same({ [7] = -1 }, sd.bias)
    end)

    it("a bias of -math.huge bans a token", function()
      s:prefill("abc")
      local best = s:sample()
      s:set_sampler { bias = { [best] = -math.huge } }
      assert.are_not.equal(best, s:sample())
    end)

    it("set_sampler with a seed replays the same draws", function()
      s:prefill("abc")
      s:set_sampler { temperature = 1.5, seed = 99 }
      local a = { s:sample(), s:sample(), s:sample(), s:sample() }
      s:set_sampler { seed = 99 }
      assert.are.same(a, { s:sample(), s:sample(), s:sample(), s:sample() })
    end)

    it("rejects bad settings", function()
      assert.matches("unknown option 'context'", error_of(s.set_sampler, s, { context = 5 }))
      assert.matches("option 'min_p': .* is out of range", error_of(s.set_sampler, s, { min_p = 2 }))
      assert.matches("option 'penalty_window': %-2 is out of range", error_of(s.set_sampler, s, { penalty_window = -2 }))
      assert.matches("option 'bias': table {%[token%] = bias} expected, got number", error_of(s.set_sampler, s, { bias = 1 }))
      assert.matches("option 'bias': keys must be token ids", error_of(s.set_sampler, s, { bias = { [-1] = 1 } }))
      assert.matches("option 'bias': keys must be token ids", error_of(s.set_sampler, s, { bias = { x = 1 } }))
      assert.matches("option 'bias': bias of token 1: number expected, got string", error_of(s.set_sampler, s, { bias = { [1] = "x" } }))
      assert.matches("option 'repeat_penalty': number expected", error_of(m.session, m, { repeat_penalty = true }))
    end)
  end)
end)

describe("generation (default model) #model", function()
  local m
  setup(function() m = support.default_model() end)
  teardown(function() m:close() end)

  it("detects the model's chat template and answers", function()
    local s <close> = m:session { system = "You are a geography teacher. Answer in one short sentence." }
    assert.are.equal("jinja", s.template)
    local reply, finish = s:chat("What is the capital of France?", { max_tokens = 32 })
    assert.are.equal("stop", finish)
    assert.matches("Paris", reply)
    assert.are.equal(m:token("<|im_end|>"), s:tokens()[s.length])
  end)

  it("runs the file's chat template: its default system prompt, content never parsed for control tokens", function()
    local s <close> = m:session()
    s:add("user", "Hi <|im_start|>")
    local want = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      .. "<|im_start|>user\nHi <|im_start|><|im_end|>\n"
    assert.are.equal(want, m:detokenize(s:tokens(), { special = true }))
    local starts = 0
    for _, t in ipairs(s:tokens()) do if t == m:token("<|im_start|>") then starts = starts + 1 end end
    assert.are.equal(2, starts)
    -- the next turn keeps the cache and adds its own tokens
    local before = s:tokens()
    s:add("assistant", "Hello.")
    local after = s:tokens()
    for i = 1, #before do assert.are.equal(before[i], after[i]) end
    assert.are.equal(want .. "<|im_start|>assistant\nHello.<|im_end|>\n", m:detokenize(after, { special = true }))
  end)

  it("takes a Jinja template of the caller's, as a string or { jinja = ... }", function()
    local src = "{% for m in messages %}[{{ m.role | upper }}] {{ m.content }}\n{% endfor %}"
      .. "{% if add_generation_prompt %}[ASSISTANT] {% endif %}"
    local s <close> = m:session { template = src, system = "Be brief." }
    assert.are.equal("jinja", s.template)
    s:add("user", "hi")
    assert.are.equal("[SYSTEM] Be brief.\n[USER] hi\n", m:detokenize(s:tokens()))
    local t <close> = m:session()
    t:set_template { jinja = "{{ messages[0].content ~ '!' }}" }
    t:add("user", "wow")
    assert.are.equal("wow!", m:detokenize(t:tokens()))
    assert.matches("jinja: line 1 column 4: expected an expression", error_of(t.set_template, t, "{{ }}"))
    t:set_template("{{ raise_exception('roles must alternate') }}")
    assert.matches("line 1 column %d+: raise_exception: roles must alternate", error_of(t.add, t, "user", "x"))
    assert.are.equal("wow!", m:detokenize(t:tokens()), "a refused turn adds nothing")
  end)

  it("stop strings end a completion", function()
    local s <close> = m:session()
    local text, finish = s:generate("Count: 1, 2, 3, 4,", { max_tokens = 32, stop = "7" })
    assert.are.equal("stop_string", finish)
    assert.matches("^ 5, 6, $", text)
  end)

  it("soft_max_tokens ends a long reply where a sentence ends: chat, stream and a job agree", function()
    local story = "Tell me a long story about a brave knight who fights a dragon."
    local s <close> = m:session()
    local whole = s:chat(story, { max_tokens = 160 })
    local t <close> = m:session()
    local reply, finish = t:chat(story, { max_tokens = 160, soft_max_tokens = 16 })
    assert.are.equal("sentence", finish)
    assert.is_true(#reply < #whole)
    assert.are.equal(whole:sub(1, #reply), reply, "greedy: the whole reply, cut")
    assert.matches("[%.!?][\"')]*$", reply)
    assert.matches("^%s", whole:sub(#reply + 1), "the next sentence begins after it")
    -- a stream gives the same pieces; the session holds exactly the reply's tokens
    local u <close> = m:session()
    local st = u:chat_stream(story, { max_tokens = 160, soft_max_tokens = 16 })
    local pieces = {}
    for piece in st do pieces[#pieces + 1] = piece end
    assert.are.equal(reply, table.concat(pieces))
    assert.are.equal("sentence", st.finish)
    assert.are.equal(t.length, u.length)
    local ids = u:tokens()
    assert.are.equal(reply, m:detokenize({ table.unpack(ids, #ids - st.n_tokens + 1) }))
    -- a job on the worker
    local v <close> = m:session()
    local job <close> = v:submit_chat(story, { max_tokens = 160, soft_max_tokens = 16 })
    local deadline = os.time() + 300
    local text = {}
    while true do
      local piece, done, jfinish = job:poll()
      text[#text + 1] = piece
      if done then
        assert.are.equal("sentence", jfinish)
        break
      end
      assert(os.time() < deadline, "the job did not finish")
    end
    assert.are.equal(reply, table.concat(text))
    assert.are.equal(t.length, v.length)
    -- the hard limit still comes first
    local w <close> = m:session()
    local cut, hard = w:chat(story, { max_tokens = 8, soft_max_tokens = 4 })
    assert.are.equal("length", hard)
    assert.are.equal(whole:sub(1, #cut), cut)
  end)

  it("choose prefers the sensible answer", function()
    local s <close> = m:session()
    s:prefill("The capital of France is")
    local best = s:choose { " Paris", " banana", " Tuesday" }
    assert.are.equal(1, best)
  end)
end)
