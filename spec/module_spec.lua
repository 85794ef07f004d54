-- The module table: version, type, devices, load and its options, errors.
local support = require("kvgen_support")
local kvgen = support.kvgen
local error_of = support.error_of

describe("kvgen module", function()
  teardown(support.cleanup)

  it("loads with require and reports its version", function()
    assert.are.equal(kvgen, require("kvgen"))
    assert.is_string(kvgen.version)
    assert.matches("^%d+%.%d+%.%d+$", kvgen.version)
  end)

  it("kvgen.devices() returns a list of device descriptions", function()
    local devices = kvgen.devices()
    assert.is_table(devices)
    local defaults = 0
    for i, d in ipairs(devices) do
      assert.is_table(d, "device " .. i)
      assert.is_string(d.name)
      assert.are.equal("integer", math.type(d.index))
      assert.is_truthy(({ discrete = 1, integrated = 1, virtual = 1, cpu = 1, other = 1 })[d.type], d.type)
      assert.matches("^%d+%.%d+%.%d+$", d.api_version)
      assert.is_boolean(d.shader_float16)
      assert.is_true(d.device_local_bytes > 0)
      -- the compute units where the driver reports them, else 0 (lavapipe: 0)
      assert.are.equal("integer", math.type(d.compute_units))
      assert.is_true(d.compute_units >= 0)
      if d.type == "cpu" then assert.are.equal(0, d.compute_units) end
      -- the cooperative matrices' shape: 8 or 16 each, or all 0 where kvgen can use none
      local shape = { d.coopmat_m, d.coopmat_n, d.coopmat_k }
      for _, v in ipairs(shape) do
        assert.are.equal("integer", math.type(v))
        assert.is_truthy(v == 0 or v == 8 or v == 16, v)
      end
      assert.are.equal(d.coopmat_m == 0, d.coopmat_n == 0)
      assert.are.equal(d.coopmat_m == 0, d.coopmat_k == 0)
      -- 8-bit integer dot products, and whether the driver calls them fast (only where offered)
      assert.is_boolean(d.int_dot)
      assert.is_boolean(d.int_dot_fast)
      assert.is_true(d.int_dot or not d.int_dot_fast)
      if d.type == "cpu" then assert.is_false(d.int_dot_fast) end
      if d.default then defaults = defaults + 1 end
    end
    assert.is_true(#devices == 0 or defaults == 1)
  end)

  it("the device option picks a listed device by index or name", function()
    local devices = kvgen.devices()
    if #devices == 0 then return end -- no Vulkan here: nothing to pick
    local d = devices[1]
    local m = kvgen.load(support.random_model_path(), { backend = "vulkan", device = d.index })
    assert.are.equal("vulkan", m.backend)
    assert.are.equal(d.name, m.device)
    m:close()
    m = kvgen.load(support.random_model_path(), { backend = "vulkan", device = d.name:sub(1, 4) })
    assert.are.equal("vulkan", m.backend)
    m:close()
    assert.matches("^kvgen: ", support.error_of(kvgen.load, support.random_model_path(),
      { backend = "vulkan", device = "no such device name" }))
    assert.are.equal("device", (kvgen.last_error()))
  end)

  describe("kvgen.type", function()
    it("answers like io.type", function()
      local m = support.random_model()
      local s = m:session()
      assert.are.equal("model", kvgen.type(m))
      assert.are.equal("session", kvgen.type(s))
      assert.are.equal("detokenizer", kvgen.type(m:detokenizer()))
      s:close()
      assert.are.equal("closed session", kvgen.type(s))
      m:close()
      assert.are.equal("closed model", kvgen.type(m))
    end)

    it("returns nil for anything else", function()
      assert.is_nil(kvgen.type(nil))
      assert.is_nil(kvgen.type(1))
      assert.is_nil(kvgen.type("model"))
      assert.is_nil(kvgen.type({}))
      assert.is_nil(kvgen.type(io.stdout))
    end)

    it("needs an argument", function()
      assert.matches("bad argument #1", error_of(kvgen.type))
    end)
  end)

  describe("kvgen.load", function()
    it("loads a model on the reference backend", function()
      local m = kvgen.load(support.random_model_path(), { backend = "reference" })
      assert.are.equal("model", kvgen.type(m))
      assert.are.equal("reference", m.backend)
      assert.are.equal("cpu", m.device)
      m:close()
    end)

    it("loads a model on the cpu backend", function()
      local m = kvgen.load(support.random_model_path(), { backend = "cpu", threads = 2 })
      assert.are.equal("cpu", m.backend)
      assert.matches("^cpu %(", m.device)
      assert.matches("2 threads", m:describe())
      m:close()
    end)

    it("takes activation_bits for the cpu backend: 8-bit logits stay close to 16-bit ones", function()
      local path = support.random_model_path("--type Q4_0")
      local m16 = kvgen.load(path, { backend = "cpu", threads = 2, activation_bits = 16 })
      local m8 = kvgen.load(path, { backend = "cpu", threads = 2, activation_bits = 8 })
      local s16, s8 = m16:session(), m8:session()
      s16:prefill({ 1, 2, 3, 4, 5 })
      s8:prefill({ 1, 2, 3, 4, 5 })
      local l16, l8 = s16:logits(m16.vocab_size), s8:logits(m8.vocab_size)
      local by_id, lo, hi, worst = {}, math.huge, -math.huge, 0
      for _, e in ipairs(l16) do
        by_id[e.id] = e.logit
        lo, hi = math.min(lo, e.logit), math.max(hi, e.logit)
      end
      for _, e in ipairs(l8) do worst = math.max(worst, math.abs(e.logit - by_id[e.id])) end
      -- every path but the portable one has 8-bit kernels for Q4_0 (its row groups): avx2,
      -- avxvnni, avx512 (avx2's for 32-element blocks), avx512vnni, neon, dotprod
      local has8 = not m8.device:find("portable", 1, true)
      if has8 then
        assert.is_true(worst > 0)                -- the 8-bit kernels ran
        assert.is_true(worst <= 0.05 * (hi - lo)) -- within a few percent of the logit range
      else
        assert.are.equal(0, worst)               -- no 8-bit kernels on this CPU: the same arithmetic
      end
      s16:close(); s8:close(); m16:close(); m8:close()
      local err = error_of(kvgen.load, path, { backend = "cpu", activation_bits = 7 })
      assert.matches("activation_bits 7", err)
    end)

    local kv_backends = { "cpu" }
    if #kvgen.devices() > 0 then kv_backends[#kv_backends + 1] = "vulkan" end
    for _, backend in ipairs(kv_backends) do
      it("takes kv_type for the " .. backend .. " backend: quantized pages, fewer bytes, logits close to f16's", function()
        -- head_dim 32: whole blocks of 32
        local path = support.random_model_path("--embd 128 --seed 51")
        local tokens = {}
        for i = 1, 40 do tokens[i] = (i * 7) % 200 + 1 end
        local function run(kv_type)
          local m = kvgen.load(path, { backend = backend, threads = 2, kv_type = kv_type })
          local s = m:session()
          s:prefill(tokens)
          local by_id = {}
          for _, e in ipairs(s:logits(m.vocab_size)) do by_id[e.id] = e.logit end
          local info = { kv_type = m.kv_type, bytes_per_token = s:cache_info().bytes_per_token, logits = by_id }
          s:close(); m:close()
          return info
        end
        local f16, q8, q4 = run(nil), run("q8_0"), run("q4_0")
        assert.are.equal("f16", f16.kv_type)
        assert.are.equal("q8_0", q8.kv_type)
        assert.are.equal("q4_0", q4.kv_type)
        assert.are.equal(f16.bytes_per_token * 34 / 64, q8.bytes_per_token)
        assert.are.equal(f16.bytes_per_token * 18 / 64, q4.bytes_per_token)
        local lo, hi = math.huge, -math.huge
        for _, v in pairs(f16.logits) do lo, hi = math.min(lo, v), math.max(hi, v) end
        local function worst(other)
          local w = 0
          for id, v in pairs(other.logits) do w = math.max(w, math.abs(v - f16.logits[id])) end
          return w / (hi - lo)
        end
        assert.is_true(worst(q8) > 0 and worst(q8) <= 0.02)
        assert.is_true(worst(q4) > 0 and worst(q4) <= 0.2)
      end)
    end

    it("refuses a kv_type by name", function()
      local path = support.random_model_path("--embd 128 --seed 51")
      local err = error_of(kvgen.load, path, { backend = "cpu", kv_type = "q5_1" })
      assert.matches("kvgen_model_load: desc.kv_type \"q5_1\" is not a KV type", err, 1, true)
      err = error_of(kvgen.load, path, { backend = "reference", kv_type = "q8_0" })
      assert.matches('kv_type "q8_0": the reference backend stores K/V pages as f32 only', err, 1, true)
      err = error_of(kvgen.load, support.random_model_path(), { backend = "cpu", kv_type = "q4_0" })
      assert.matches("head_dim 16", err, 1, true)
      assert.matches("kv_type", error_of(kvgen.load, path, { kv_type = 8 }))
      assert.are.equal("f32", kvgen.load(path, { backend = "reference" }).kv_type)
    end)

    it("accepts no options table and an empty one", function()
      local m = kvgen.load(support.random_model_path(), { backend = "reference" })
      m:close()
      m = kvgen.load(support.random_model_path(), {})
      assert.are.equal("model", kvgen.type(m))
      m:close()
    end)

    it("takes the threads option", function()
      local m = kvgen.load(support.random_model_path(), { backend = "reference", threads = 1 })
      assert.matches("1 thread", m:describe())
      m:close()
    end)

    it("rejects a path that is not a string", function()
      assert.matches("bad argument #1 to 'load' %(path: string expected, got no value%)", error_of(function()
        return kvgen.load()
      end))
      assert.matches("path: string expected, got number", error_of(kvgen.load, 42))
    end)

    it("rejects an options argument that is not a table", function()
      assert.matches("bad argument #2 .*options: table expected, got string",
        error_of(kvgen.load, support.random_model_path(), "reference"))
    end)

    it("rejects unknown options", function()
      assert.matches("unknown option 'backnd'", error_of(kvgen.load, support.random_model_path(), { backnd = "reference" }))
      assert.matches("unknown option %[1%] %(options are named fields%)",
        error_of(kvgen.load, support.random_model_path(), { 1 }))
    end)

    it("checks every option's type and range", function()
      local p = support.random_model_path()
      assert.matches("option 'backend': 'cuda' is not one of 'default', 'reference', 'vulkan', 'cpu'",
        error_of(kvgen.load, p, { backend = "cuda" }))
      assert.matches("option 'backend': string expected, got number", error_of(kvgen.load, p, { backend = 1 }))
      assert.matches("option 'threads': integer expected, got string", error_of(kvgen.load, p, { threads = "2" }))
      assert.matches("option 'threads': integer expected, got number", error_of(kvgen.load, p, { threads = 1.5 }))
      assert.matches("option 'threads': %-1 is out of range", error_of(kvgen.load, p, { threads = -1 }))
      assert.matches("option 'force_f32': boolean expected, got number", error_of(kvgen.load, p, { force_f32 = 1 }))
      assert.matches("option 'device': string expected, got table", error_of(kvgen.load, p, { device = {} }))
      assert.matches("option 'device': a device index must be an integer >= 0", error_of(kvgen.load, p, { device = -1 }))
    end)

    it("raises 'kvgen: <message>' for a missing file and records the code", function()
      local err = error_of(kvgen.load, "/nonexistent/model.gguf")
      assert.matches("^kvgen: /nonexistent/model.gguf: ", err)
      local code, msg = kvgen.last_error()
      assert.are.equal("io", code)
      assert.are.equal(err, "kvgen: " .. msg)
    end)

    it("raises a format error for a file that is not GGUF", function()
      local p = support.tmpname(".gguf")
      local f = assert(io.open(p, "wb"))
      f:write("this is not a gguf file, just some text that is long enough to read a header from")
      f:close()
      local err = error_of(kvgen.load, p, { backend = "reference" })
      assert.matches("^kvgen: ", err)
      assert.matches(p, err, 1, true)
      assert.are.equal("format", (kvgen.last_error()))
    end)

    it("raises for a truncated GGUF", function()
      local src = assert(io.open(support.random_model_path(), "rb"))
      local data = src:read(4096)
      src:close()
      local p = support.tmpname(".gguf")
      local f = assert(io.open(p, "wb"))
      f:write(data)
      f:close()
      assert.matches("^kvgen: ", error_of(kvgen.load, p, { backend = "reference" }))
      assert.are.equal("format", (kvgen.last_error()))
    end)

    it("backend='vulkan' either loads on a Vulkan device or raises a kvgen error", function()
      local ok, m = pcall(kvgen.load, support.random_model_path(), { backend = "vulkan" })
      if ok then
        assert.are.equal("vulkan", m.backend)
        m:close()
      else
        assert.matches("^kvgen: ", m)
        local code = kvgen.last_error()
        assert.is_truthy(code == "unsupported" or code == "device", code)
      end
    end)

    it("backend='default' loads on some backend", function()
      local m = kvgen.load(support.random_model_path(), { backend = "default" })
      assert.is_truthy(m.backend == "cpu" or m.backend == "reference" or m.backend == "vulkan")
      m:close()
    end)
  end)

  describe("kvgen.last_error", function()
    it("names the status of a runtime failure, not argument errors", function()
      pcall(kvgen.load, "/nonexistent/x.gguf")
      assert.are.equal("io", (kvgen.last_error()))
      local m = support.random_model()
      local s = m:session { context = 4 }
      assert.matches("^kvgen: context full", error_of(s.prefill, s, { 1, 2, 3, 4, 5 }))
      assert.are.equal("context_full", (kvgen.last_error()))
      m:close()
    end)
  end)
end)
