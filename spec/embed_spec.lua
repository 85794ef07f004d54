-- model:embed: sentence embeddings from an encoder (a random bert from kvgen-mkmodel).
local support = require("kvgen_support")
local kvgen = support.kvgen
local error_of = support.error_of

local function norm(v)
  local s = 0
  for i = 1, #v do s = s + v[i] * v[i] end
  return math.sqrt(s)
end

local function cosine(a, b)
  local ab = 0
  for i = 1, #a do ab = ab + a[i] * b[i] end
  return ab / (norm(a) * norm(b))
end

describe("model:embed", function()
  local model
  setup(function()
    model = kvgen.load(support.random_model_path("--arch bert --ctx 64"), { backend = "reference" })
  end)
  teardown(function()
    if model then model:close() end
    support.cleanup()
  end)

  it("gives a unit vector of n_embd numbers for a text", function()
    local v = model:embed("the blacksmith sells a sword")
    assert.are.equal(model.n_embd, #v)
    assert.is_true(math.abs(norm(v) - 1) < 1e-5)
    assert.are.equal("bert", model.architecture)
    assert.are.equal("wpm", model.tokenizer)
  end)

  it("embeds a list of texts in one call, each as it would be alone", function()
    local texts = { "hello world", "", "the cat and the dog", "x" }
    local vs = model:embed(texts)
    assert.are.equal(#texts, #vs)
    for i, t in ipairs(texts) do
      local alone = model:embed(t)
      for k = 1, #alone do assert.are.equal(alone[k], vs[i][k]) end
    end
    assert.is_true(cosine(vs[1], vs[3]) < 0.9999)
    assert.are.same({}, model:embed({}))
  end)

  it("takes pooling, normalize and max_tokens", function()
    local mean = model:embed("hello world", { pooling = "mean" })
    local default = model:embed("hello world")
    for k = 1, #mean do assert.are.equal(mean[k], default[k]) end
    local cls = model:embed("hello world", { pooling = "cls" })
    assert.is_true(cosine(mean, cls) < 0.9999)
    local raw = model:embed("hello world", { normalize = false })
    assert.is_true(math.abs(norm(raw) - 1) > 1e-3)
    assert.is_true(cosine(raw, mean) > 0.99999)
    local a = model:embed("a b c d", { max_tokens = 4 })
    local b = model:embed("a b x y", { max_tokens = 4 })
    for k = 1, #a do assert.are.equal(a[k], b[k]) end
  end)

  it("drops NUL bytes as control characters and cuts long texts", function()
    local a, b = model:embed("ca\0t"), model:embed("cat")
    for k = 1, #a do assert.are.equal(a[k], b[k]) end
    local long = string.rep("ab c ", 20000)
    local v = model:embed(long)
    assert.are.equal(model.n_embd, #v)
    local w = model:embed(long .. " zzz")
    for k = 1, #v do assert.are.equal(v[k], w[k]) end
  end)

  it("feeds the memory store", function()
    local mem <close> = kvgen.memory { dim = model.n_embd }
    local facts = { "the sword is in the shop", "the dog sleeps by the fire", "hello world" }
    for _, f in ipairs(facts) do mem:add(f, model:embed(f)) end
    local hits = mem:search(model:embed("the sword is in the shop"), { k = 1 })
    assert.are.equal("the sword is in the shop", hits[1].text)
  end)

  it("names the function, the argument and the value in its errors", function()
    local e = error_of(model.embed, model, 42)
    assert.truthy(e:find("embed", 1, true) and e:find("#2", 1, true) and e:find("string or list of strings", 1, true),
      e)
    e = error_of(model.embed, model, { "ok", 7 })
    assert.truthy(e:find("embed", 1, true) and e:find("texts[2]: string expected, got number 7", 1, true), e)
    e = error_of(model.embed, model, "x", { pooling = "max" })
    assert.truthy(e:find("embed", 1, true) and e:find("pooling", 1, true) and e:find("max", 1, true), e)
    e = error_of(model.embed, model, "x", { max_tokens = -1 })
    assert.truthy(e:find("max_tokens", 1, true) and e:find("-1", 1, true), e)
    e = error_of(model.embed, model, "x", { pooling_type = "mean" })
    assert.truthy(e:find("pooling_type", 1, true), e)
  end)

  it("embeds with a decoder too (last-token pooling) and refuses a session on an encoder", function()
    local llama <close> = support.random_model()
    local v = llama:embed("hello world")
    assert.are.equal(llama.n_embd, #v)
    assert.is_true(math.abs(norm(v) - 1) < 1e-5)
    local e = error_of(llama.embed, llama, { "a", "" })
    assert.truthy(e:find("text 1 has no tokens", 1, true), e)
    e = error_of(model.session, model)
    assert.truthy(e:find("encoder", 1, true), e)
  end)

end)

-- every backend that embeds, with an encoder and with a decoder, against the reference: the cpu
-- backend, and Vulkan when a device works
local backends = { "cpu" }
if #kvgen.devices() > 0 then backends[#backends + 1] = "vulkan" end

describe("model:embed on each backend", function()
  local path, ref
  local texts = { "", "hello world", "the blacksmith sells a sword at the shop", "x",
                  string.rep("the cat and the dog ", 30) }
  setup(function()
    path = support.random_model_path("--arch bert --ctx 128 --seed 9")
    ref = kvgen.load(path, { backend = "reference" })
  end)
  teardown(function()
    if ref then ref:close() end
    support.cleanup()
  end)

  for _, name in ipairs(backends) do
    it("agrees with the reference on " .. name .. ", a batch as its texts alone", function()
      local m <close> = kvgen.load(path, { backend = name })
      local want, got = ref:embed(texts), m:embed(texts)
      assert.are.equal(#texts, #got)
      for i = 1, #texts do
        assert.are.equal(m.n_embd, #got[i])
        assert.is_true(cosine(want[i], got[i]) > 0.9999, name .. ": text " .. i)
        local alone = m:embed(texts[i])
        assert.is_true(cosine(alone, got[i]) > 0.99999, name .. ": text " .. i .. " alone")
      end
    end)

    it("embeds with a decoder on " .. name .. " as the reference does", function()
      local dpath = support.random_model_path("--layers 2 --seed 19")
      local dref <close> = kvgen.load(dpath, { backend = "reference" })
      local m <close> = kvgen.load(dpath, { backend = name })
      local some = { "hello world", "the blacksmith sells a sword at the shop" }
      for _, how in ipairs({ "last", "mean" }) do
        local want, got = dref:embed(some, { pooling = how }), m:embed(some, { pooling = how })
        for i = 1, #some do
          assert.is_true(cosine(want[i], got[i]) > 0.9999, name .. " " .. how .. ": text " .. i)
        end
      end
    end)
  end
end)

-- all-MiniLM-L6-v2 (scripts/fetch_model.sh --minilm); pending without the file
describe("model:embed (all-MiniLM-L6-v2) #model", function()
  local path = "models/all-MiniLM-L6-v2.gguf"
  if not support.exists(path) then
    pending("models/all-MiniLM-L6-v2.gguf absent (scripts/fetch_model.sh --minilm)")
    return
  end

  it("puts a question nearest the fact that answers it", function()
    local minilm <close> = kvgen.load(path, { backend = "cpu" })
    assert.are.equal(384, minilm.n_embd)
    local facts = {
      "The blacksmith sells swords and shields.",
      "Wolves howl in the forest at night.",
      "The innkeeper serves warm stew every evening.",
    }
    local mem <close> = kvgen.memory { dim = minilm.n_embd }
    local vs = minilm:embed(facts)
    for i, f in ipairs(facts) do mem:add(f, vs[i]) end
    local questions = { "Where can I buy a sword?", "Is it dangerous in the woods after dark?", "What's for dinner?" }
    for i, q in ipairs(questions) do
      local hits = mem:search(minilm:embed(q), { k = 3 })
      assert.are.equal(facts[i], hits[1].text)
      assert.is_true(hits[1].score > hits[2].score + 0.1)
    end
  end)
end)
