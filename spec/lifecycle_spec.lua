-- Session state over time: fork, rewind, save/restore, context shift, the KV page pool.
local support = require("kvgen_support")
local kvgen = support.kvgen
local error_of = support.error_of

describe("session state (random model)", function()
  local m
  setup(function() m = support.random_model() end)
  teardown(function() support.release(m) end)

  describe("fork", function()
    it("continues from the same tokens, logits and sampler state", function()
      local s <close> = m:session { seed = 4, temperature = 1.2 }
      s:prefill("a shared persona prompt")
      local f <close> = s:fork()
      assert.are.equal("session", kvgen.type(f))
      assert.are.same(s:tokens(), f:tokens())
      assert.are.same(s:logits(5), f:logits(5))
      assert.are.equal(s.model, f.model)
      local a = { s:sample(), s:sample(), s:sample() }
      local b = { f:sample(), f:sample(), f:sample() }
      assert.are.same(a, b)
    end)

    it("parent and child are independent afterwards", function()
      local s <close> = m:session()
      s:prefill("base")
      local f = s:fork()
      f:prefill(" child only")
      local base = #m:tokenize("base")
      assert.are.equal(base, s.length)
      assert.are.equal(base + #m:tokenize(" child only"), f.length)
      s:close()
      f:prefill(" more")
      assert.are.equal("integer", math.type(f:decode(f:sample())))
      f:close()
    end)

    it("a fork of a closed session raises", function()
      local s = m:session()
      s:close()
      assert.matches("attempt to use a closed kvgen.Session", error_of(s.fork, s))
    end)
  end)

  describe("rewind", function()
    it("drops tokens and gives the logits back", function()
      local s <close> = m:session()
      s:prefill { 5, 6, 7 }
      local logits2
      do
        local t <close> = m:session()
        t:prefill { 5, 6 }
        logits2 = t:logits(5)
      end
      assert.are.equal(2, s:rewind(1))
      assert.are.same({ 5, 6 }, s:tokens())
      assert.are.same(logits2, s:logits(5))
      assert.are.equal(2, s:rewind(0))
      assert.are.equal(0, s:rewind(2))
      assert.is_nil(s:sample())
    end)

    it("rejects n out of range", function()
      local s <close> = m:session()
      s:prefill { 1, 2 }
      assert.matches("n: 3 is out of range %[0, 2%]", error_of(s.rewind, s, 3))
      assert.matches("n: %-1 is out of range", error_of(s.rewind, s, -1))
      assert.matches("n: integer expected, got string", error_of(s.rewind, s, "1"))
      assert.are.equal(2, s.length)
    end)
  end)

  describe("save and restore", function()
    it("restore gives the same next-token logits and samples", function()
      local s <close> = m:session { seed = 9, temperature = 1 }
      s:prefill("a conversation worth keeping") -- an odd number of tokens on purpose
      local path = support.tmpname(".kvs")
      s:save(path)
      local r <close> = m:restore(path)
      assert.are.equal("session", kvgen.type(r))
      assert.are.equal(m, r.model)
      assert.are.same(s:tokens(), r:tokens())
      assert.are.same(s:logits(5), r:logits(5))
      assert.are.same({ s:sample(), s:sample() }, { r:sample(), r:sample() })
    end)

    it("refuses missing and corrupted files with kvgen errors", function()
      assert.matches("^kvgen: ", error_of(m.restore, m, "/nonexistent/session.kvs"))
      assert.are.equal("io", (kvgen.last_error()))
      local p = support.tmpname(".kvs")
      local f = assert(io.open(p, "wb"))
      f:write(string.rep("x", 100))
      f:close()
      assert.matches("^kvgen: ", error_of(m.restore, m, p))
      assert.are.equal("format", (kvgen.last_error()))
    end)

    it("refuses a file saved from another model", function()
      local other <close> = kvgen.load(support.random_model_path("--seed 77"), { backend = "reference" })
      local s <close> = other:session()
      s:prefill { 1, 2 }
      local p = support.tmpname(".kvs")
      s:save(p)
      assert.matches("^kvgen: .*another model", error_of(m.restore, m, p))
      assert.are.equal("invalid_argument", (kvgen.last_error()))
    end)

    it("rejects bad paths", function()
      local s <close> = m:session()
      assert.matches("path: string expected, got nil", error_of(s.save, s, nil))
      assert.matches("path: string expected, got number", error_of(m.restore, m, 1))
      assert.matches("^kvgen: ", error_of(s.save, s, "/nonexistent/dir/x.kvs"))
      assert.are.equal("io", (kvgen.last_error()))
    end)
  end)

  describe("context limits", function()
    it("on_full = 'shift' keeps the first `keep` tokens and drops old ones", function()
      local s <close> = m:session { context = 32, on_full = "shift", keep = 4 }
      local ids = {}
      for i = 1, 30 do ids[i] = 10 + i end
      s:prefill(ids)
      local t = s:sample()
      for _ = 1, 10 do t = s:decode(t) end
      local ci = s:cache_info()
      assert.is_true(ci.shifts >= 1)
      assert.is_true(s.length <= 32)
      assert.are.same({ 11, 12, 13, 14 }, { table.unpack(s:tokens(), 1, 4) })
    end)

    it("on_full = 'error' (the default) raises context full", function()
      local s <close> = m:session { context = 8, on_full = "error" }
      s:prefill { 1, 2, 3, 4, 5, 6, 7, 8 }
      assert.matches("^kvgen: context full %(8/8%)", error_of(s.decode, s, 1))
    end)

    it("rejects bad on_full and keep", function()
      assert.matches("option 'on_full': 'wrap' is not one of 'error', 'shift'", error_of(m.session, m, { on_full = "wrap" }))
      assert.matches("option 'keep': %-1 is out of range", error_of(m.session, m, { keep = -1 }))
      assert.matches("option 'prefix_reuse': boolean expected", error_of(m.session, m, { prefix_reuse = 0 }))
    end)

    it("a phi3 model loaded with a context over its original one runs longer sessions", function()
      local path = support.random_model_path("--arch phi3 --ctx 1024 --orig-ctx 256 --rope-factors --seed 3")
      local short <close> = kvgen.load(path, { backend = "reference" })
      assert.matches("n_ctx 512 is over the model's 256 positions", error_of(short.session, short, { context = 512 }))
      local long <close> = kvgen.load(path, { backend = "reference", context = 1024 })
      local s <close> = long:session()
      assert.are.equal(1024, s:cache_info().capacity)
      local a <close> = short:session { context = 64 }
      local b <close> = long:session { context = 64 }
      a:prefill { 1, 7, 3, 9 }
      b:prefill { 1, 7, 3, 9 }
      local la, lb, d = a:logits(5), b:logits(5), 0
      for i = 1, #la do
        d = math.max(d, math.abs(la[i].logit - lb[i].logit), la[i].id ~= lb[i].id and 1 or 0)
      end
      assert.is_true(d > 1e-3, "the long factors moved the logits by " .. d)
      assert.matches("option 'context': %-1 is out of range", error_of(kvgen.load, path, { context = -1 }))
    end)
  end)

  describe("the KV page pool", function()
    it("pool_info accounts for sessions and pages", function()
      local p <close> = support.random_model { page_size = 16, pool_tokens = 1024 }
      local info = p:pool_info()
      assert.are.equal(16, info.page_size)
      assert.is_true(info.pages_total >= 1024 / 16)
      assert.are.equal(0, info.sessions)
      assert.are.equal(0, info.pages_used)
      local s <close> = p:session()
      s:prefill(string.rep("x", 40))
      info = p:pool_info()
      assert.are.equal(1, info.sessions)
      assert.is_true(info.pages_used >= 1)
      assert.are.equal(info.pages_used * info.bytes_per_page, info.bytes_used)
      local ci = s:cache_info()
      assert.are.equal(16, ci.page_size)
      assert.are.equal(math.ceil(s.length / 16), ci.pages)
      assert.are.equal(ci.pages * info.bytes_per_page, ci.bytes_held)
    end)

    it("sessions with the same prompt share pages (prefix reuse) unless asked not to", function()
      local p <close> = support.random_model { page_size = 16 }
      local prompt = {}
      for i = 1, 48 do prompt[i] = 20 + i end
      local a <close> = p:session()
      a:prefill(prompt)
      local b <close> = p:session()
      b:prefill(prompt)
      assert.is_true(b:cache_info().tokens_reused >= 32)
      local c <close> = p:session { prefix_reuse = false }
      c:prefill(prompt)
      assert.are.equal(0, c:cache_info().tokens_reused)
      assert.are.same(a:logits(3), b:logits(3))
      assert.are.same(a:logits(3), c:logits(3))
    end)

    it("forks share full pages", function()
      local p <close> = support.random_model { page_size = 16 }
      local s <close> = p:session()
      local ids = {}
      for i = 1, 40 do ids[i] = i end
      s:prefill(ids)
      local f <close> = s:fork()
      assert.is_true(f:cache_info().pages_shared >= 2)
    end)

    it("an exhausted pool raises pool_full", function()
      local p <close> = support.random_model { page_size = 16, pool_tokens = 32 }
      local s <close> = p:session()
      local ids = {}
      for i = 1, 48 do ids[i] = i end
      assert.matches("^kvgen: ", error_of(s.prefill, s, ids))
      assert.are.equal("pool_full", (kvgen.last_error()))
    end)

    it("rejects bad pool options", function()
      local path = support.random_model_path()
      assert.matches("option 'page_size': integer expected", error_of(kvgen.load, path, { page_size = "16" }))
      assert.matches("option 'pool_tokens': %-1 is out of range", error_of(kvgen.load, path, { pool_tokens = -1 }))
      assert.matches("option 'pool_bytes': integer expected", error_of(kvgen.load, path, { pool_bytes = 1.5 }))
      assert.matches("^kvgen: ", error_of(kvgen.load, path, { backend = "reference", page_size = 17 }))
      assert.are.equal("invalid_argument", (kvgen.last_error()))
    end)
  end)
end)

describe("session state (default model) #model", function()
  it("save and restore round-trip a chat", function()
    local m = support.default_model()
    local s <close> = m:session { system = "You are terse." }
    s:chat("Say hi.", { max_tokens = 8 })
    local path = support.tmpname(".kvs")
    s:save(path)
    local r <close> = m:restore(path)
    assert.are.same(s:tokens(), r:tokens())
    assert.are.same(s:logits(5), r:logits(5))
    local a = s:chat("Again.", { max_tokens = 8 })
    local b = r:chat("Again.", { max_tokens = 8 })
    assert.are.equal(a, b)
    m:close()
    support.cleanup()
  end)
end)
