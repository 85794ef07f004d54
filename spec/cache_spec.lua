-- The seed's two phases observed through Lua: prefill fills the cache, each decode adds exactly
-- one position, and decoding with the cache gives the same tokens as recomputing without it.
local support = require("kvgen_support")
local kvgen = support.kvgen

local function check_phases(m, prompt, n_new)
  local s <close> = m:session()
  local n = s:prefill(prompt)
  assert.are.equal(#m:tokenize(prompt), n)
  assert.are.equal(n, s:cache_info().length)
  assert.are.equal(n, s.length)
  local t = s:sample()
  for i = 1, n_new do
    local before = s:cache_info().length
    t = s:decode(t)
    local ci = s:cache_info()
    assert.are.equal(before + 1, ci.length)
    assert.are.equal(n + i, ci.length)
    assert.are.equal(ci.length * ci.bytes_per_token, ci.bytes)
  end
end

local function cached_vs_recomputed(m, prompt, n_new)
  local a <close> = m:session()
  local b <close> = m:session { no_cache = true }
  local ta = support.greedy(a, prompt, n_new)
  local tb = support.greedy(b, prompt, n_new)
  assert.are.same(ta, tb)
  assert.are.same(a:logits(5), b:logits(5))
  return ta
end

describe("KV cache (random model)", function()
  local m
  setup(function() m = support.random_model() end)
  teardown(function() support.release(m) end)

  it("prefill of N tokens gives cache length N; each decode adds exactly one", function()
    check_phases(m, "The quick brown fox jumps over the lazy dog", 12)
  end)

  it("decode with the cache gives the same tokens as recomputing without it", function()
    local ids = cached_vs_recomputed(m, "Once upon a time", 16)
    assert.are.equal(16, #ids)
  end)

  it("prefill in one call equals token-by-token decodes", function()
    local ids = m:tokenize("one two three four five")
    local a <close> = m:session()
    local b <close> = m:session()
    a:prefill(ids)
    for _, id in ipairs(ids) do b:decode(id) end
    assert.are.same(a:logits(5), b:logits(5))
    for layer = 0, m.n_layer - 1 do
      assert.are.same(a:read_cache(layer, "k"), b:read_cache(layer, "k"))
      assert.are.same(a:read_cache(layer, "v"), b:read_cache(layer, "v"))
    end
  end)

  it("sessions of one model do not disturb each other", function()
    local a <close> = m:session()
    local alone = support.greedy(a, "alpha beta", 6)
    local b <close> = m:session()
    local c <close> = m:session()
    b:prefill("a different conversation entirely")
    c:prefill("alpha beta")
    local t = c:sample()
    local interleaved = {}
    for i = 1, 6 do
      interleaved[i] = t
      b:decode(b:sample())
      if i < 6 then t = c:decode(t) end
    end
    assert.are.same(alone, interleaved)
  end)
end)

describe("KV cache (default model) #model", function()
  local m
  setup(function() m = support.default_model() end)
  teardown(function() m:close() end)

  it("prefill of N tokens gives cache length N; each decode adds exactly one", function()
    check_phases(m, "The capital of France is", 4)
  end)

  it("decode with the cache gives the same tokens as recomputing without it", function()
    local ids = cached_vs_recomputed(m, "The capital of France is", 8)
    assert.matches("Paris", m:detokenize(ids))
  end)

  it("cache_info matches the model's shape", function()
    local s <close> = m:session { context = 64 }
    s:prefill("Hello")
    local ci = s:cache_info()
    assert.are.equal(30, ci.layers)
    assert.are.equal(3, ci.kv_heads)
    assert.are.equal(64, ci.head_dim)
    assert.are.equal(kvgen.type(s), "session")
  end)
end)
