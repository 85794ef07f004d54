-- kvgen.Model: fields, tokenizer calls, the handle's life cycle.
local support = require("kvgen_support")
local kvgen = support.kvgen
local error_of = support.error_of

describe("kvgen.Model", function()
  local m
  before_each(function() m = support.random_model() end)
  after_each(function() m:close() end)
  teardown(support.cleanup)

  describe("fields", function()
    it("describe the model", function()
      assert.are.equal("llama", m.architecture)
      assert.is_string(m.name)
      assert.are.equal(2, m.n_layer)
      assert.are.equal(64, m.n_embd)
      assert.are.equal(128, m.n_ff)
      assert.are.equal(4, m.n_head)
      assert.are.equal(2, m.n_head_kv)
      assert.are.equal(16, m.head_dim)
      assert.is_true(m.n_ctx > 0)
      assert.is_true(m.vocab_size > 256)
      assert.are.equal("bpe", m.tokenizer)
      assert.is_string(m.tokenizer_pre)
      assert.is_true(m.n_params > 0)
      assert.is_true(m.weight_bytes > 0)
      assert.is_number(m.rope_freq_base)
      assert.is_number(m.rms_norm_eps)
      assert.is_boolean(m.tied_embeddings)
      assert.are.equal("integer", math.type(m.bos))
      assert.are.equal("integer", math.type(m.eos))
    end)

    it("are nil for unknown names", function()
      assert.is_nil(m.no_such_field)
    end)

    it("match model:info()", function()
      local info = m:info()
      for k, v in pairs(info) do assert.are.equal(v, m[k], k) end
      assert.are.equal(m.vocab_size, info.vocab_size)
      assert.are.equal(m.n_layer, info.n_layer)
    end)

    it("describe() gives the multi-line text of `kvgen info`", function()
      local text = m:describe()
      assert.matches("architecture:%s+llama", text)
      assert.matches("layers:%s+2", text)
    end)
  end)

  describe("tokenizer", function()
    it("tokenize and detokenize round-trip", function()
      local ids = m:tokenize("Hello world, how are you?")
      assert.is_true(#ids > 0)
      for _, id in ipairs(ids) do assert.is_true(math.type(id) == "integer" and id >= 0 and id < m.vocab_size) end
      assert.are.equal("Hello world, how are you?", m:detokenize(ids))
    end)

    it("tokenize of the empty string is an empty list", function()
      assert.are.same({}, m:tokenize(""))
      assert.are.equal("", m:detokenize({}))
    end)

    it("keeps embedded NUL bytes and invalid UTF-8", function()
      local text = "a\0b\255c"
      assert.are.equal(text, m:detokenize(m:tokenize(text)))
    end)

    it("special=true recognises control tokens; the default keeps them as text", function()
      local im_end = m:token("<|im_end|>")
      assert.are.equal("integer", math.type(im_end))
      assert.are.same({ im_end }, m:tokenize("<|im_end|>", { special = true }))
      local plain = m:tokenize("<|im_end|>")
      assert.is_true(#plain > 1)
      assert.are.equal("<|im_end|>", m:detokenize(plain))
    end)

    it("bos=true prepends BOS only when the model asks for it", function()
      local with = m:tokenize("hi", { bos = true })
      local without = m:tokenize("hi")
      assert.is_true(#with == #without or (#with == #without + 1 and with[1] == m.bos))
    end)

    it("detokenize shows control tokens only with special=true", function()
      local im_end = m:token("<|im_end|>")
      assert.are.equal("", m:detokenize({ im_end }))
      assert.are.equal("<|im_end|>", m:detokenize({ im_end }, { special = true }))
    end)

    it("piece gives one token's bytes", function()
      local ids = m:tokenize("Hello")
      local text = {}
      for _, id in ipairs(ids) do text[#text + 1] = m:piece(id) end
      assert.are.equal("Hello", table.concat(text))
      local im_end = m:token("<|im_end|>")
      assert.are.equal("", m:piece(im_end))
      assert.are.equal("<|im_end|>", m:piece(im_end, { special = true }))
    end)

    it("is_eog and is_control classify tokens", function()
      local im_end = m:token("<|im_end|>")
      assert.is_true(m:is_eog(im_end))
      assert.is_true(m:is_control(im_end))
      local a = m:tokenize("a")[1]
      assert.is_false(m:is_eog(a))
      assert.is_false(m:is_control(a))
      assert.is_true(m:is_eog(m.eos))
    end)

    it("token() finds a token by its exact text, nil when absent", function()
      assert.is_nil(m:token("no such token text"))
      assert.are.equal(m.eos, m:token(m:piece(m.eos, { special = true })))
    end)

    it("the streaming detokenizer holds back split UTF-8", function()
      local text = "héllo wörld ✓"
      local ids = m:tokenize(text)
      local d = m:detokenizer()
      local out = {}
      for _, id in ipairs(ids) do
        local piece = d:push(id)
        assert.is_truthy(utf8.len(piece), "piece is not complete UTF-8")
        out[#out + 1] = piece
      end
      out[#out + 1] = d:flush()
      assert.are.equal(text, table.concat(out))
      assert.matches("^kvgen.Detokenizer", tostring(d))
    end)

    it("the streaming detokenizer flushes an incomplete character as U+FFFD", function()
      local d = m:detokenizer()
      local ids = m:tokenize("\226\156") -- the first two bytes of a three-byte character
      local out = {}
      for _, id in ipairs(ids) do out[#out + 1] = d:push(id) end
      assert.are.equal("", table.concat(out))
      assert.are.equal("\239\191\189", d:flush())
    end)

    it("the detokenizer refuses a closed model", function()
      local d = m:detokenizer()
      m:close()
      assert.matches("attempt to use a closed kvgen.Model", error_of(d.push, d, 65))
    end)
  end)

  describe("bad arguments", function()
    it("tokenize", function()
      assert.matches("bad argument #1 to 'tokenize' %(text: string expected, got nil%)", error_of(function() return m:tokenize(nil) end))
      assert.matches("text: string expected, got number", error_of(m.tokenize, m, 12))
      assert.matches("options: table expected, got boolean", error_of(m.tokenize, m, "x", true))
      assert.matches("unknown option 'speical'", error_of(m.tokenize, m, "x", { speical = true }))
      assert.matches("option 'special': boolean expected, got number", error_of(m.tokenize, m, "x", { special = 1 }))
      assert.matches("option 'bos': boolean expected, got string", error_of(m.tokenize, m, "x", { bos = "yes" }))
    end)

    it("detokenize", function()
      assert.matches("ids: table of token ids expected, got string", error_of(m.detokenize, m, "x"))
      assert.matches("ids%[2%]: integer expected, got string", error_of(m.detokenize, m, { 1, "2" }))
      assert.matches("ids%[1%]: integer expected, got number", error_of(m.detokenize, m, { 1.5 }))
      assert.matches("ids%[1%]: %-1 is outside the vocabulary", error_of(m.detokenize, m, { -1 }))
      assert.matches("ids%[1%]: " .. m.vocab_size .. " is outside the vocabulary", error_of(m.detokenize, m, { m.vocab_size }))
      assert.matches("unknown option 'bos'", error_of(m.detokenize, m, { 1 }, { bos = true }))
    end)

    it("piece, is_eog, is_control", function()
      for _, name in ipairs { "piece", "is_eog", "is_control" } do
        assert.matches("id: integer token id expected, got no value", error_of(m[name], m))
        assert.matches("id: integer token id expected, got string", error_of(m[name], m, "1"))
        assert.matches("id: %-1 is outside the vocabulary", error_of(m[name], m, -1))
        assert.matches("id: 1000000000 is outside", error_of(m[name], m, 1000000000))
      end
    end)

    it("token", function()
      assert.matches("text: string expected, got number", error_of(m.token, m, 1))
    end)

    it("methods called on something that is not a model", function()
      assert.matches("kvgen.Model expected, got nil", error_of(m.tokenize, nil, "x"))
      assert.matches("kvgen.Model expected, got table", error_of(m.tokenize, {}, "x"))
      local s = m:session()
      assert.matches("kvgen.Model expected, got kvgen.Session", error_of(m.tokenize, s, "x"))
    end)
  end)

  describe("life cycle", function()
    it("__name, __tostring, close twice", function()
      assert.are.equal("kvgen.Model", getmetatable(m).__name)
      assert.matches("^kvgen.Model %(.*reference%) %(0x%x+%)$", tostring(m))
      m:close()
      m:close()
      assert.are.equal("kvgen.Model (closed)", tostring(m))
    end)

    it("__gc and __close are the close function", function()
      local mt = getmetatable(m)
      assert.are.equal(mt.__gc, mt.__close)
      assert.are.equal(mt.__gc, m.close)
    end)

    it("a closed model raises on every use", function()
      m:close()
      local msg = "attempt to use a closed kvgen.Model"
      assert.matches(msg, error_of(function() return m.vocab_size end))
      assert.matches(msg, error_of(m.tokenize, m, "x"))
      assert.matches(msg, error_of(m.detokenize, m, {}))
      assert.matches(msg, error_of(m.piece, m, 1))
      assert.matches(msg, error_of(m.is_eog, m, 1))
      assert.matches(msg, error_of(m.is_control, m, 1))
      assert.matches(msg, error_of(m.token, m, "x"))
      assert.matches(msg, error_of(m.info, m))
      assert.matches(msg, error_of(m.describe, m))
      assert.matches(msg, error_of(m.session, m))
      assert.matches(msg, error_of(m.detokenizer, m))
    end)

    it("works as a to-be-closed variable", function()
      local outer
      do
        local inner <close> = support.random_model()
        outer = inner
        assert.are.equal("model", kvgen.type(inner))
      end
      assert.are.equal("closed model", kvgen.type(outer))
    end)

    it("is collected without being closed", function()
      local weak = setmetatable({}, { __mode = "v" })
      weak[1] = support.random_model()
      collectgarbage()
      collectgarbage()
      assert.is_nil(weak[1])
    end)
  end)
end)
