-- kvgen.Session, low level: options, prefill, decode, sample, logits, cache, life cycle.
local support = require("kvgen_support")
local kvgen = support.kvgen
local error_of = support.error_of

describe("kvgen.Session", function()
  local m, s
  before_each(function()
    m = support.random_model()
    s = m:session()
  end)
  after_each(function()
    s:close()
    m:close()
  end)
  teardown(support.cleanup)

  describe("model:session options", function()
    it("context sets the capacity", function()
      local t = m:session { context = 16 }
      assert.are.equal(16, t.context)
      assert.are.equal(16, t:cache_info().capacity)
      t:close()
    end)

    it("the default context is the model's, at most 4096", function()
      assert.are.equal(math.min(m.n_ctx, 4096), s.context)
    end)

    it("seed, temperature, top_k and top_p drive the sampler reproducibly", function()
      local function draws(opts)
        local t = m:session(opts)
        t:prefill("Once upon a time")
        local out = {}
        for i = 1, 8 do
          out[i] = t:sample()
        end
        t:close()
        return out
      end
      local a = draws { seed = 7, temperature = 1.5, top_k = 50, top_p = 0.95 }
      local b = draws { seed = 7, temperature = 1.5, top_k = 50, top_p = 0.95 }
      local c = draws { seed = 8, temperature = 1.5, top_k = 50, top_p = 0.95 }
      assert.are.same(a, b)
      assert.are_not.same(a, c)
    end)

    it("temperature 0 (the default) is greedy: the arg max of the logits", function()
      s:prefill("abc")
      assert.are.equal(s:logits(1)[1].id, s:sample())
    end)

    it("top_k = 1 always takes the most likely token", function()
      local t = m:session { temperature = 5, top_k = 1, seed = 3 }
      t:prefill("abc")
      local best = t:logits(1)[1].id
      for _ = 1, 5 do assert.are.equal(best, t:sample()) end
      t:close()
    end)

    it("no_cache gives the same logits as the cache", function()
      local t = m:session { no_cache = true }
      t:prefill("hello")
      s:prefill("hello")
      assert.are.same(s:logits(5), t:logits(5))
      t:close()
    end)

    it("rejects bad options", function()
      assert.matches("options: table expected, got number", error_of(m.session, m, 5))
      assert.matches("unknown option 'ctx'", error_of(m.session, m, { ctx = 5 }))
      assert.matches("option 'context': integer expected, got string", error_of(m.session, m, { context = "5" }))
      assert.matches("option 'context': %-1 is out of range", error_of(m.session, m, { context = -1 }))
      assert.matches("option 'no_cache': boolean expected, got number", error_of(m.session, m, { no_cache = 1 }))
      assert.matches("option 'seed': integer expected, got number", error_of(m.session, m, { seed = 0.5 }))
      assert.matches("option 'temperature': number expected, got string", error_of(m.session, m, { temperature = "hot" }))
      assert.matches("option 'temperature': inf is out of range", error_of(m.session, m, { temperature = math.huge }))
      assert.matches("option 'temperature': .* is out of range", error_of(m.session, m, { temperature = 0 / 0 }))
      assert.matches("option 'top_k': %-3 is out of range", error_of(m.session, m, { top_k = -3 }))
      assert.matches("option 'top_p': .* is out of range", error_of(m.session, m, { top_p = 1.5 }))
    end)

    it("a context beyond what kvgen allows is a kvgen error", function()
      assert.matches("^kvgen: .*n_ctx", error_of(m.session, m, { context = 1 << 30 }))
      assert.are.equal("invalid_argument", (kvgen.last_error()))
    end)
  end)

  describe("prefill", function()
    it("takes text and returns the number of tokens appended", function()
      local n = s:prefill("Hello world")
      assert.are.equal(#m:tokenize("Hello world"), n)
      assert.are.equal(n, s.length)
      assert.are.same(m:tokenize("Hello world"), s:tokens())
    end)

    it("takes a list of token ids", function()
      assert.are.equal(3, s:prefill { 10, 20, 30 })
      assert.are.same({ 10, 20, 30 }, s:tokens())
    end)

    it("appends to what is there", function()
      s:prefill { 1, 2 }
      s:prefill { 3 }
      assert.are.same({ 1, 2, 3 }, s:tokens())
    end)

    it("special=true parses control tokens in text", function()
      s:prefill("<|im_start|>", { special = true })
      assert.are.same({ m:token("<|im_start|>") }, s:tokens())
    end)

    it("an empty input does nothing", function()
      assert.are.equal(0, s:prefill(""))
      assert.are.equal(0, s:prefill({}))
      assert.are.equal(0, s.length)
      assert.is_nil(s:sample())
    end)

    it("rejects bad input", function()
      assert.matches("input: string or table of token ids expected, got nil", error_of(s.prefill, s, nil))
      assert.matches("input: string or table of token ids expected, got number", error_of(s.prefill, s, 5))
      assert.matches("ids%[2%]: integer expected, got boolean", error_of(s.prefill, s, { 1, true }))
      assert.matches("ids%[1%]: " .. m.vocab_size .. " is outside the vocabulary", error_of(s.prefill, s, { m.vocab_size }))
      assert.matches("unknown option 'logits'", error_of(s.prefill, s, "x", { logits = true }))
      assert.matches("apply to text, not to token ids", error_of(s.prefill, s, { 1 }, { special = true }))
      assert.are.equal(0, s.length)
    end)

    it("raises context full and leaves the session unchanged and usable", function()
      local t = m:session { context = 8 }
      t:prefill { 1, 2, 3, 4, 5, 6 }
      local before = t:logits(3)
      local err = error_of(t.prefill, t, { 1, 2, 3 })
      assert.matches("^kvgen: context full %(6/8%)", err)
      assert.are.equal("context_full", (kvgen.last_error()))
      assert.are.equal(6, t.length)
      assert.are.same(before, t:logits(3))
      t:prefill { 7, 8 }
      assert.are.equal(8, t.length)
      assert.matches("^kvgen: context full", error_of(t.decode, t, 1))
      t:close()
    end)
  end)

  describe("decode and sample", function()
    it("sample is nil before any logits", function()
      assert.is_nil(s:sample())
      assert.is_nil(s:logits())
    end)

    it("decode appends one token and returns the next sample", function()
      s:prefill("Hi")
      local n = s.length
      local t = s:sample()
      local nxt = s:decode(t)
      assert.are.equal(n + 1, s.length)
      assert.are.equal(t, s:tokens()[n + 1])
      assert.are.equal("integer", math.type(nxt))
      assert.are.equal(s:logits(1)[1].id, nxt) -- greedy
    end)

    it("decode works on an empty session", function()
      assert.are.equal("integer", math.type(s:decode(5)))
      assert.are.same({ 5 }, s:tokens())
    end)

    it("rejects bad token ids", function()
      assert.matches("id: integer token id expected, got no value", error_of(s.decode, s))
      assert.matches("id: integer token id expected, got string", error_of(s.decode, s, "5"))
      assert.matches("id: %-1 is outside the vocabulary", error_of(s.decode, s, -1))
      assert.matches("id: " .. m.vocab_size .. " is outside the vocabulary", error_of(s.decode, s, m.vocab_size))
      assert.are.equal(0, s.length)
    end)
  end)

  describe("logits", function()
    it("lists the k most likely tokens, best first, with probabilities", function()
      s:prefill("abc")
      local top = s:logits(5)
      assert.are.equal(5, #top)
      for i = 2, 5 do assert.is_true(top[i - 1].logit >= top[i].logit) end
      for _, e in ipairs(top) do
        assert.is_true(e.p > 0 and e.p <= 1)
        assert.are.equal("integer", math.type(e.id))
      end
      assert.are.equal(10, #s:logits())
      local all = s:logits(m.vocab_size)
      local sum = 0
      for _, e in ipairs(all) do sum = sum + e.p end
      assert.is_true(math.abs(sum - 1) < 1e-6)
    end)

    it("rejects k out of range", function()
      s:prefill("abc")
      assert.matches("k: 0 is out of range", error_of(s.logits, s, 0))
      assert.matches("k: " .. (m.vocab_size + 1) .. " is out of range", error_of(s.logits, s, m.vocab_size + 1))
      assert.matches("k: integer expected, got table", error_of(s.logits, s, {}))
    end)
  end)

  describe("reset", function()
    it("forgets everything and re-seeds the sampler", function()
      local t = m:session { seed = 11, temperature = 1 }
      t:prefill("story")
      local first = { t:sample(), t:sample(), t:sample() }
      t:reset()
      assert.are.equal(0, t.length)
      assert.is_nil(t:sample())
      t:prefill("story")
      assert.are.same(first, { t:sample(), t:sample(), t:sample() })
      t:close()
    end)
  end)

  describe("cache_info and read_cache", function()
    it("describe the cache", function()
      s:prefill("Hello there")
      local ci = s:cache_info()
      assert.are.equal(m.n_layer, ci.layers)
      assert.are.equal(m.n_head_kv, ci.kv_heads)
      assert.are.equal(m.head_dim, ci.head_dim)
      assert.are.equal(s.length, ci.length)
      assert.are.equal(s.context, ci.capacity)
      assert.are.equal(ci.length * ci.bytes_per_token, ci.bytes)
      assert.is_true(ci.bytes_per_token >= 2 * ci.layers * ci.kv_heads * ci.head_dim)
    end)

    it("read_cache gives K and V of shape (kv_heads, length, head_dim)", function()
      s:prefill { 1, 2, 3 }
      local ci = s:cache_info()
      for layer = 0, ci.layers - 1 do
        for _, which in ipairs { "k", "v" } do
          local x = s:read_cache(layer, which)
          assert.are.equal(ci.kv_heads * 3 * ci.head_dim, #x)
          for _, v in ipairs(x) do assert.is_true(v == v and math.abs(v) < 1e6) end
        end
      end
      assert.are_not.same(s:read_cache(0, "k"), s:read_cache(0, "v"))
    end)

    it("keeps earlier positions when tokens are appended", function()
      s:prefill { 1, 2 }
      local k2 = s:read_cache(1, "k")
      s:decode(3)
      local k3 = s:read_cache(1, "k")
      local ci = s:cache_info()
      for h = 0, ci.kv_heads - 1 do
        for t = 0, 1 do
          for d = 0, ci.head_dim - 1 do
            assert.are.equal(k2[(h * 2 + t) * ci.head_dim + d + 1], k3[(h * 3 + t) * ci.head_dim + d + 1])
          end
        end
      end
    end)

    it("read_cache rejects bad arguments", function()
      assert.matches("layer: integer expected, got nil", error_of(s.read_cache, s, nil, "k"))
      assert.matches("layer: %-1 is out of range", error_of(s.read_cache, s, -1, "k"))
      assert.matches("layer: 2 is out of range", error_of(s.read_cache, s, m.n_layer, "k"))
      assert.matches("invalid option 'q'", error_of(s.read_cache, s, 0, "q"))
      assert.matches("string expected, got no value", error_of(s.read_cache, s, 0))
    end)
  end)

  describe("life cycle", function()
    it("__name, __tostring, close twice", function()
      assert.are.equal("kvgen.Session", getmetatable(s).__name)
      assert.matches("^kvgen.Session %(0 tokens%) %(0x%x+%)$", tostring(s))
      s:close()
      s:close()
      assert.are.equal("kvgen.Session (closed)", tostring(s))
    end)

    it("__gc and __close are the close function", function()
      local mt = getmetatable(s)
      assert.are.equal(mt.__gc, mt.__close)
      assert.are.equal(mt.__gc, s.close)
    end)

    it("a closed session raises on every use", function()
      s:close()
      local msg = "attempt to use a closed kvgen.Session"
      assert.matches(msg, error_of(function() return s.length end))
      assert.matches(msg, error_of(function() return s.model end))
      for _, name in ipairs { "prefill", "decode", "sample", "logits", "tokens", "reset", "cache_info", "read_cache" } do
        assert.matches(msg, error_of(s[name], s, 1, "k"), name)
      end
    end)

    it("methods called on something that is not a session", function()
      assert.matches("kvgen.Session expected, got nil", error_of(s.prefill, nil, "x"))
      assert.matches("kvgen.Session expected, got kvgen.Model", error_of(s.prefill, m, "x"))
    end)

    it("works as a to-be-closed variable", function()
      local outer
      do
        local t <close> = m:session {}
        outer = t
        t:prefill("x")
      end
      assert.are.equal("closed session", kvgen.type(outer))
    end)

    it("is closed when a to-be-closed scope exits with an error", function()
      local outer
      local ok = pcall(function()
        local t <close> = m:session {}
        outer = t
        error("boom")
      end)
      assert.is_false(ok)
      assert.are.equal("closed session", kvgen.type(outer))
    end)

    it("keeps its model alive and knows it", function()
      local t = m:session()
      assert.are.equal(m, t.model)
      local weak = setmetatable({}, { __mode = "v" })
      do
        local model = support.random_model()
        weak[1] = model
        weak[2] = model:session()
      end
      local strong = weak[2]
      collectgarbage()
      collectgarbage()
      assert.is_not_nil(weak[1], "the session's model was collected")
      strong:prefill("still works")
      assert.is_true(strong.length > 0)
      strong = nil
      collectgarbage()
      collectgarbage()
      assert.is_nil(weak[1])
      assert.is_nil(weak[2])
      t:close()
    end)

    it("keeps working after its model is closed", function()
      local t = m:session()
      m:close()
      t:prefill("text still tokenizes")
      assert.is_true(t.length > 0)
      assert.are.equal("integer", math.type(t:decode(t:sample())))
      assert.are.equal("closed model", kvgen.type(t.model))
      assert.matches("attempt to use a closed kvgen.Model", error_of(m.session, m))
      t:close()
    end)

    it("model and sessions may be collected in any order", function()
      for _ = 1, 3 do
        local model = support.random_model()
        for i = 1, 4 do
          local t = model:session()
          t:prefill { i }
        end
      end
      collectgarbage()
      collectgarbage()
      local model = support.random_model()
      local t = model:session()
      model = nil
      collectgarbage()
      t:prefill { 1 }
      t = nil
      collectgarbage()
    end)
  end)
end)
