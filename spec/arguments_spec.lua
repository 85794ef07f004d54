-- Arguments and failures of the generation calls: a refused call leaves the session exactly as
-- it was, every generation has a finite bound, a stream keeps the text it delivered, strings
-- with NUL bytes and tables that are not lists are refused the same way everywhere, and bad
-- numbers are named in the message. Random models; the reference backend for everything and
-- the Vulkan backend (where a device works) for a representative subset.
local support = require("kvgen_support")
local kvgen = support.kvgen

-- The message a call raises (called as a method inside `f`, so the message names the method).
local function err(f)
  local ok, e = pcall(f)
  assert(not ok, "expected an error")
  return tostring(e)
end

local function long_stop() return { stop = string.rep("z", 2000) } end
local function many_stops()
  local t = {}
  for i = 1, 65 do t[i] = "s" .. i end
  return { stop = t }
end
local function bad_json() return { json = { { key = 'a"b', type = "number" } } } end

-- The tokens a session holds after one short chat turn (the chat state shows in them: an open
-- reply left behind would be closed before the next turn).
local function after_turn(s)
  s:chat("hello", { max_tokens = 4, ignore_eog = true })
  return s:tokens()
end

local function vulkan_model()
  local ok, m = pcall(kvgen.load, support.random_model_path(), { backend = "vulkan" })
  if ok then return m end
  return nil, m
end

-- Tests run on both backends (the representative subset).
local function shared_tests(get_model)
  local m, s
  before_each(function()
    m = get_model()
    if not m then return end
    s = m:session()
  end)
  after_each(function()
    if s then s:close() end
    s = nil
  end)
  local function skip_without_model()
    if not m then
      pending("no model on this backend")
      return true
    end
  end

  it("a refused generate leaves the session as it was (long stop string, 65 stop strings, bad json)", function()
    if skip_without_model() then return end
    for _, opts in ipairs { long_stop(), many_stops(), bad_json() } do
      local e = err(function() return s:generate("a prompt", opts) end)
      assert.are.equal(0, s.length)
      assert.matches("bad argument #2 to 'generate' %(option '", e)
    end
    s:prefill("abc")
    local before = s:tokens()
    err(function() return s:generate("a prompt", long_stop()) end)
    assert.are.same(before, s:tokens())
  end)

  it("a refused chat leaves neither the user turn nor chat state behind", function()
    if skip_without_model() then return end
    s:set_template("chatml")
    for _, opts in ipairs { long_stop(), many_stops(), bad_json() } do
      local e = err(function() return s:chat("hello", opts) end)
      assert.are.equal(0, s.length)
      assert.matches("bad argument #2 to 'chat' %(option '", e)
    end
    local fresh <close> = m:session { template = "chatml" }
    assert.are.same(after_turn(fresh), after_turn(s))
  end)

  it("max_tokens = -1 with on_full = 'shift' ends after one context of tokens", function()
    if skip_without_model() then return end
    local t <close> = m:session { context = 32, on_full = "shift" }
    local st = t:stream("a prompt", { max_tokens = -1, ignore_eog = true })
    local steps = 0
    for _ in st do
      steps = steps + 1
      if steps > 1000 then
        st:close()
        error("the generation did not end")
      end
    end
    assert.are.equal("length", st.finish)
    assert.are.equal(32, st.n_tokens)
  end)

  it("st.text keeps the delivered text when s:close() ends the stream", function()
    if skip_without_model() then return end
    local st = s:stream("once upon", { max_tokens = 40, ignore_eog = true })
    local got = {}
    for _ = 1, 4 do got[#got + 1] = st() end
    local delivered = table.concat(got)
    assert.is_true(#delivered > 0)
    assert.are.equal(delivered, st.text)
    s:close()
    assert.are.equal("cancelled", st.finish)
    assert.are.equal(delivered, st.text)
  end)

  it("temperature = -1 is accepted and greedy, like temperature 0", function()
    if skip_without_model() then return end
    local a <close> = m:session { temperature = -1, seed = 3 }
    local b <close> = m:session { temperature = 0, seed = 3 }
    assert.are.equal(-1, a:sampler().temperature)
    local opts = { max_tokens = 12, ignore_eog = true }
    assert.are.equal(b:generate("once upon", opts), (a:generate("once upon", opts)))
    s:set_sampler { temperature = -0.5 }
    assert.are.equal(-0.5, s:sampler().temperature)
  end)
end

describe("arguments (random model)", function()
  local m, s
  setup(function() m = support.random_model() end)
  teardown(function() m:close() end)
  before_each(function() s = m:session() end)
  after_each(function() s:close() end)

  describe("reference backend", function()
    shared_tests(function() return m end)
  end)

  describe("a failed call leaves the session as it was", function()
    it("stream with token ids", function()
      local ids = m:tokenize("a prompt")
      for _, opts in ipairs { long_stop(), many_stops(), bad_json() } do
        local e = err(function() return s:stream(ids, opts) end)
        assert.are.equal(0, s.length)
        assert.matches("bad argument #2 to 'stream'", e)
      end
      for _ in s:stream(ids, { max_tokens = 2 }) do end -- and the session is not busy
    end)

    it("chat_stream", function()
      s:set_template("chatml")
      for _, opts in ipairs { long_stop(), many_stops(), bad_json() } do
        local e = err(function() return s:chat_stream("hello", opts) end)
        assert.are.equal(0, s.length)
        assert.matches("bad argument #2 to 'chat_stream'", e)
      end
      local fresh <close> = m:session { template = "chatml" }
      assert.are.same(after_turn(fresh), after_turn(s))
    end)

    it("submit and stream_async: argument errors, nothing queued", function()
      for _, call in ipairs {
        function(opts) return s:submit("a prompt", opts) end,
        function(opts) return s:stream_async("a prompt", opts) end,
      } do
        for _, opts in ipairs { long_stop(), many_stops(), bad_json() } do
          local e = err(function() return call(opts) end)
          assert.are.equal(0, s.length)
          assert.matches("bad argument #2 to '[%w_]+' %(option '", e)
        end
      end
      assert.are.same({}, kvgen.poll())
    end)

    it("submit_chat and chat_stream_async: no user turn left behind", function()
      s:set_template("chatml")
      for _, call in ipairs {
        function(opts) return s:submit_chat("hello", opts) end,
        function(opts) return s:chat_stream_async("hello", opts) end,
      } do
        for _, opts in ipairs { long_stop(), many_stops(), bad_json() } do
          local e = err(function() return call(opts) end)
          assert.are.equal(0, s.length)
          assert.matches("bad argument #2 to '[%w_]+' %(option '", e)
        end
      end
      assert.are.same({}, kvgen.poll())
      local fresh <close> = m:session { template = "chatml" }
      assert.are.same(after_turn(fresh), after_turn(s))
    end)
  end)

  describe("every generation has a finite bound", function()
    it("generate: max_tokens = -1 with on_full = 'shift'", function()
      local t <close> = m:session { context = 32, on_full = "shift" }
      local pieces = 0
      local ok, text, finish = pcall(t.generate, t, "a prompt", {
        max_tokens = -1,
        ignore_eog = true,
        on_piece = function()
          pieces = pieces + 1
          if pieces > 1000 then error("the generation did not end") end
        end,
      })
      assert.is_true(ok, text)
      assert.are.equal("length", finish)
      assert.is_true(pieces <= 32)
      assert.is_true(t:cache_info().shifts >= 1)
      -- without shift, max_tokens = -1 still runs until the context is full
      local u <close> = m:session { context = 24 }
      local _, finish2 = u:generate("abc", { max_tokens = -1, ignore_eog = true })
      assert.are.equal("context_full", finish2)
      assert.are.equal(24, u.length)
    end)

    it("a job: max_tokens = -1 with on_full = 'shift'", function()
      local t <close> = m:session { context = 32, on_full = "shift" }
      local job <close> = t:submit("a prompt", { max_tokens = -1, ignore_eog = true })
      local _, finish = support.poll_to_end(job, { limit = 1000 })
      assert.are.equal("length", finish)
      assert.are.equal(32, job:info().n_tokens)
    end)
  end)

  describe("stream text", function()
    it("chat_stream: st.text after s:close() half-way", function()
      s:set_template("chatml")
      local st = s:chat_stream("hello", { max_tokens = 40, ignore_eog = true })
      local got = {}
      for _ = 1, 3 do got[#got + 1] = st() end
      s:close()
      assert.are.equal(table.concat(got), st.text)
      assert.is_true(#st.text > 0)
      -- and st:close(), or the end of the loop: always everything delivered
      local t <close> = m:session()
      local st2 = t:stream("once upon", { max_tokens = 20, ignore_eog = true })
      local two = {}
      two[1] = st2()
      two[2] = st2()
      st2:close()
      assert.are.equal(table.concat(two), st2.text)
      local all = {}
      local st3 = t:stream("more", { max_tokens = 10, ignore_eog = true })
      for piece in st3 do all[#all + 1] = piece end
      assert.are.equal(table.concat(all), st3.text)
    end)
  end)

  describe("NUL bytes are refused wherever a string reaches C without its length", function()
    local nul = "a\0b"
    local function refused(e, fn, what, at)
      assert.matches("bad argument #%d to '" .. fn .. "' %(" .. what .. ": contains a NUL byte at position "
        .. (at or 2), e)
    end

    it("s:add", function()
      s:set_template("chatml")
      refused(err(function() return s:add("user", nul) end), "add", "text")
      refused(err(function() return s:add("user\0x", "hi") end), "add", "role", 5)
      assert.are.equal(0, s.length)
      -- text that goes in with its length (prompts) keeps every byte
      local ids = m:tokenize(nul)
      assert.is_true(#ids > #m:tokenize("a"))
      assert.are.equal(#ids, s:prefill(nul))
      local t <close> = m:session()
      t:generate(nul, { max_tokens = 1 })
      assert.are.same(ids, { table.unpack(t:tokens(), 1, #ids) })
    end)

    it("s:chat and s:submit_chat, the same way", function()
      s:set_template("chatml")
      refused(err(function() return s:chat(nul) end), "chat", "message")
      refused(err(function() return s:chat_stream(nul) end), "chat_stream", "message")
      refused(err(function() return s:submit_chat(nul) end), "submit_chat", "message")
      refused(err(function() return s:chat_stream_async(nul) end), "chat_stream_async", "message")
      refused(err(function() return s:chat("hi", { role = "user\0" }) end), "chat", "option 'role'", 5)
      assert.are.equal(0, s.length)
    end)

    it("session options system= and template=", function()
      refused(err(function() return m:session { template = "chatml", system = nul } end), "session", "option 'system'")
      refused(err(function() return m:session { template = "chatml\0" } end), "session", "template", 7)
      refused(err(function() return s:set_template { user_prefix = nul } end), "set_template", "template.user_prefix")
    end)

    it("stop=", function()
      refused(err(function() return s:generate("x", { stop = nul }) end), "generate", "option 'stop'")
      refused(err(function() return s:generate("x", { stop = { "ok", nul } }) end), "generate", "stop%[2%]")
      refused(err(function() return s:submit("x", { stop = nul }) end), "submit", "option 'stop'")
      assert.are.equal(0, s.length)
    end)

    it("choices= and json=", function()
      refused(err(function() return s:generate("x", { choices = { nul } }) end), "generate", "choices%[1%]")
      refused(err(function() return s:generate("x", { json = { { key = nul, type = "number" } } }) end), "generate",
        "json%[1%]%.key")
      refused(err(function() return s:generate("x", { json = { { key = "k", type = "enum", values = { nul } } } }) end),
        "generate", "json%[1%]%.values%[1%]")
      assert.are.equal(0, s.length)
    end)

    it("option and field names", function()
      refused(err(function() return s:generate("x", { ["max_tokens\0x"] = 1 }) end), "generate", "option name", 11)
      refused(err(function() return s:set_template { ["user_prefix\0"] = "U" } end), "set_template",
        "template field name", 12)
      refused(err(function() return s:generate("x", { json = { { key = "a", type = "number", ["max_len\0"] = 1 } } }) end),
        "generate", "json%[1%] field name", 8)
      assert.is_nil(s["length\0"])
      assert.is_nil(m["vocab_size\0"])
      assert.is_nil(s:stream("x", { max_tokens = 1 })["text\0"])
    end)

    it("s:choose", function()
      s:prefill("abc")
      refused(err(function() return s:choose { "ok", nul } end), "choose", "candidates%[2%]")
    end)

    it("m:token", function()
      refused(err(function() return m:token(nul) end), "token", "text")
    end)

    it("save and restore paths", function()
      s:prefill("abc")
      local p = support.tmpname(".kvs")
      refused(err(function() return s:save(p .. "\0.bak") end), "save", "path", #p + 1)
      refused(err(function() return m:restore(p .. "\0.bak") end), "restore", "path", #p + 1)
      s:save(p)
      local r <close> = m:restore(p)
      assert.are.same(s:tokens(), r:tokens())
    end)

    it("kvgen.load's path", function()
      local p = support.random_model_path()
      refused(err(function() return kvgen.load(p .. "\0.old", { backend = "reference" }) end), "load", "path",
        #p + 1)
    end)
  end)

  describe("tables and strings are what the docs say", function()
    it("stop = a map, not a list, is refused", function()
      local e = err(function() return s:generate("x", { stop = { first = "a" } }) end)
      assert.matches("bad argument #2 to 'generate' %(option 'stop': a list .* key 'first'", e)
      assert.are.equal(0, s.length)
    end)

    it("other lists refuse maps too: choices, json, candidates, ids", function()
      assert.matches("option 'choices': a list", err(function() return s:generate("x", { choices = { a = "x" } }) end))
      assert.matches("option 'json': a list", err(function()
        return s:generate("x", { json = { f = { key = "a", type = "number" } } })
      end))
      s:prefill("abc")
      assert.matches("candidates: a list", err(function() return s:choose { "a", x = "b" } end))
      assert.matches("ids: a list", err(function() return s:prefill { 1, 2, x = 3 } end))
      assert.matches("prompt: a list", err(function() return s:generate({ [2] = 5 }) end))
    end)

    it("a misspelt key in a json field is refused", function()
      local e = err(function() return s:generate("x", { json = { { key = "a", type = "string", maxlen = 3 } } }) end)
      assert.matches("bad argument #2 to 'generate' %(json%[1%]: unknown field 'maxlen'", e)
      assert.matches("json%[1%]%.max_len: only for type 'string'",
        err(function() return s:generate("x", { json = { { key = "a", type = "number", max_len = 3 } } }) end))
      assert.matches("json%[1%]%.values: only for type 'enum'",
        err(function() return s:generate("x", { json = { { key = "a", type = "number", values = { "x" } } } }) end))
      assert.are.equal(0, s.length)
    end)

    it("s:logits refuses a string", function()
      s:prefill("abc")
      assert.matches("bad argument #1 to 'logits' %(k: integer expected, got string%)",
        err(function() return s:logits("3") end))
      assert.are.equal(3, #s:logits(3))
    end)
  end)

  describe("numbers are named in the message", function()
    it("max_tokens = 1.5, NaN, inf", function()
      for _, case in ipairs { { 1.5, "1%.5" }, { 0 / 0, "nan" }, { math.huge, "inf" }, { -math.huge, "%-inf" } } do
        local e = err(function() return s:generate("x", { max_tokens = case[1] }) end)
        assert.matches("bad argument #2 to 'generate' %(option 'max_tokens': integer expected, got number " .. case[2]
          .. "%)", e)
      end
      assert.are.equal(0, s.length)
    end)

    it("bias = {[42] = math.huge} is an argument error naming token 42", function()
      local e = err(function() return m:session { bias = { [42] = math.huge } } end)
      assert.matches("bad argument #1 to 'session' %(option 'bias': bias of token 42: inf is not allowed", e)
      e = err(function() return s:set_sampler { bias = { [42] = 0 / 0 } } end)
      assert.matches("option 'bias': bias of token 42: nan is not allowed", e)
      e = err(function() return s:set_sampler { bias = { [42] = 1e300 } } end)
      assert.matches("option 'bias': bias of token 42: 1e%+300 is not allowed", e)
      assert.matches("keys must be token ids in %[0, %d+%), got 1%.5",
        err(function() return s:set_sampler { bias = { [1.5] = 1 } } end))
      s:set_sampler { bias = { [42] = -math.huge } } -- a ban is fine
      assert.are.equal(-math.huge, s:sampler().bias[42])
    end)

    it("the other numeric options name their value", function()
      local function opt(o) return err(function() return m:session(o) end) end
      assert.matches("option 'seed': integer expected, got number 0%.5", opt { seed = 0.5 })
      assert.matches("option 'top_k': integer expected, got number 2%.5", opt { top_k = 2.5 })
      assert.matches("option 'top_p': nan is out of range %[0, 1%]", opt { top_p = 0 / 0 })
      assert.matches("option 'min_p': 1%.5 is out of range %[0, 1%]", opt { min_p = 1.5 })
      assert.matches("option 'temperature': inf is out of range", opt { temperature = math.huge })
      assert.matches("option 'repeat_penalty': %-1 is out of range", opt { repeat_penalty = -1 })
      assert.matches("option 'frequency_penalty': 1e%+300 is out of range", opt { frequency_penalty = 1e300 })
      assert.matches("option 'penalty_window': integer expected, got number inf", opt { penalty_window = math.huge })
      assert.matches("option 'context': integer expected, got number 1%.5", opt { context = 1.5 })
      assert.matches("json%[1%]%.max_len: integer >= 0 expected, got number 2%.5",
        err(function() return s:generate("x", { json = { { key = "a", type = "string", max_len = 2.5 } } }) end))
      assert.matches("option 'priority': integer expected, got number 1%.5",
        err(function() return s:submit("x", { priority = 1.5 }) end))
      s:prefill("abc")
      assert.matches("n: integer expected, got number 0%.5", err(function() return s:rewind(0.5) end))
      assert.matches("id: integer token id expected, got number 1%.5", err(function() return s:decode(1.5) end))
      assert.matches("ids%[2%]: integer expected, got number nan", err(function() return s:prefill { 1, 0 / 0 } end))
      assert.matches("layer: integer expected, got number 0%.5", err(function() return s:read_cache(0.5, "k") end))
    end)
  end)
end)

describe("arguments (random model, vulkan backend)", function()
  local m
  setup(function()
    local why
    m, why = vulkan_model()
    if not m then print("arguments_spec: no Vulkan model: " .. tostring(why)) end
  end)
  teardown(function()
    if m then m:close() end
    support.cleanup()
  end)
  shared_tests(function()
    if m then assert.are.equal("vulkan", m.backend) end
    return m
  end)
end)
