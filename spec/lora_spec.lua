-- LoRA adapters: loaded once per model (model:load_adapter), run per session at a scale
-- (model:session{adapters = ...}, s:set_adapters), inherited by forks, recorded by save files
-- and found again by restore. The adapters come from kvgen-mkmodel --lora with the same shape
-- flags as the random model, so they fit it.
local support = require("kvgen_support")
local kvgen = support.kvgen
local error_of = support.error_of

local function has(err, text)
  assert(err:find(text, 1, true), string.format("%q lacks %q", err, text))
end

-- the largest absolute difference of two logit vectors
local function max_diff(a, b)
  assert.equals(#a, #b)
  local d = 0
  for i = 1, #a do d = math.max(d, math.abs(a[i] - b[i])) end
  return d
end

local prompt = { 1, 5, 9, 14, 3, 7 }

-- every next-token logit of s, indexed by id + 1
local function all_logits(s)
  local v = {}
  for _, e in ipairs(s:logits(s.model.vocab_size)) do v[e.id + 1] = e.logit end
  return v
end

local function logits_after(s, ids)
  s:prefill(ids)
  return all_logits(s)
end

-- the Vulkan backend where a device exists (none: its cases are left out)
local backends = { "reference", "cpu" }
if #kvgen.devices() > 0 then backends[#backends + 1] = "vulkan" end

for _, backend in ipairs(backends) do
  describe("LoRA adapters on the " .. backend .. " backend", function()
    local m, ad, ad2
    setup(function()
      m = kvgen.load(support.random_model_path(), { backend = backend })
      ad = m:load_adapter(support.random_model_path("--lora"))
      ad2 = m:load_adapter(support.random_model_path("--lora --seed 7 --lora-rank 4"))
    end)
    teardown(function()
      ad, ad2 = nil, nil
      m:close()
      collectgarbage()
    end)

    it("load_adapter gives an adapter handle with its facts", function()
      assert.equals("adapter", kvgen.type(ad))
      local info = ad:info()
      assert.is_true(info.n_matrices > 0)
      assert.equals(8, info.max_rank)
      assert.equals(4, ad2:info().max_rank)
      assert.is_string(info.name)
      assert.is_number(info.hash)
      assert.not_equals(info.hash, ad2:info().hash)
      assert.matches("kvgen.Adapter", tostring(ad))
    end)

    it("an adapter changes the logits; scale 0 and no adapters are the base model", function()
      local base = logits_after(m:session(), prompt)
      local with = logits_after(m:session { adapters = { ad } }, prompt)
      assert.is_true(max_diff(base, with) > 1e-3, "the adapter changed nothing")
      local zero = logits_after(m:session { adapters = { { ad, 0 } } }, prompt)
      assert.is_true(max_diff(base, zero) == 0, "scale 0 is not the base model")
      local s = m:session { adapters = { ad } }
      s:set_adapters({})
      assert.is_true(max_diff(base, logits_after(s, prompt)) == 0)
    end)

    it("s:adapters gives back the handles and scales, in order", function()
      local s = m:session { adapters = { { ad, 0.5 }, ad2 } }
      local list = s:adapters()
      assert.equals(2, #list)
      assert.equals(ad, list[1][1])
      assert.equals(0.5, list[1][2])
      assert.equals(ad2, list[2][1])
      assert.equals(1, list[2][2])
      s:set_adapters()
      assert.same({}, s:adapters())
    end)

    it("the scale is linear in the low-rank product: two halves equal one whole", function()
      local whole = logits_after(m:session { adapters = { ad } }, prompt)
      local halves = logits_after(m:session { adapters = { { ad, 0.5 }, { ad, 0.5 } } }, prompt)
      assert.is_true(max_diff(whole, halves) < 1e-3, "two halves differ from the whole by " .. max_diff(whole, halves))
    end)

    it("a fork runs its parent's adapters", function()
      local s = m:session { adapters = { { ad, 0.7 } } }
      s:prefill(prompt)
      local child = s:fork()
      assert.equals(ad, child:adapters()[1][1])
      assert.near(0.7, child:adapters()[1][2], 1e-6)
      s:decode(11)
      child:decode(11)
      assert.is_true(max_diff(all_logits(s), all_logits(child)) == 0)
    end)

    it("sessions with different adapters do not share cached pages", function()
      local long = {}
      for i = 1, 80 do long[i] = (i * 7) % 50 + 1 end
      local base = m:session()
      base:prefill(long)
      local s = m:session { adapters = { ad } }
      local got = logits_after(s, long)
      assert.equals(0, s:cache_info().tokens_reused)
      local fresh = logits_after(m:session { adapters = { ad }, prefix_reuse = false }, long)
      assert.is_true(max_diff(got, fresh) < 1e-3)
      -- the same adapters at the same scale do share them
      local same = m:session { adapters = { ad } }
      assert.is_true(max_diff(logits_after(same, long), fresh) < 1e-3)
      assert.is_true(same:cache_info().tokens_reused > 0)
      -- and so does the base model with itself
      local base2 = m:session()
      base2:prefill(long)
      assert.is_true(base2:cache_info().tokens_reused > 0)
    end)

    it("jobs of sessions with different adapters, run in one batch, equal their separate runs", function()
      local sets = { { ad }, { { ad2, 0.6 } }, {}, { ad, ad2 } }
      local want = {}
      for i, set in ipairs(sets) do
        local s = m:session { adapters = set }
        s:generate("a prompt", { max_tokens = 10, ignore_eog = true })
        want[i] = s:tokens()
      end
      local ss, jobs = {}, {}
      for i, set in ipairs(sets) do
        ss[i] = m:session { adapters = set }
        jobs[i] = ss[i]:submit("a prompt", { max_tokens = 10, ignore_eog = true })
      end
      for i = 1, #sets do
        support.poll_to_end(jobs[i])
        jobs[i]:close()
        assert.same(want[i], ss[i]:tokens())
      end
      -- the adapters made a difference, or the comparison says nothing
      local differ = false
      for k = 1, #want[1] do differ = differ or want[1][k] ~= want[3][k] end
      assert.is_true(differ, "the adapter did not change the greedy text")
    end)

    it("save records the adapters and restore finds them among the loaded ones", function()
      local path = support.tmpname(".kvgs")
      local s = m:session { adapters = { { ad2, 0.25 } } }
      s:prefill(prompt)
      s:save(path)
      local r = m:restore(path)
      assert.equals(ad2, r:adapters()[1][1])
      assert.equals(0.25, r:adapters()[1][2])
      s:decode(4)
      r:decode(4)
      assert.is_true(max_diff(all_logits(s), all_logits(r)) == 0)
    end)

    it("restore refuses a session whose adapter is not loaded", function()
      local other = m:load_adapter(support.random_model_path("--lora --seed 99"))
      local path = support.tmpname(".kvgs")
      local s = m:session { adapters = { other } }
      s:prefill(prompt)
      s:save(path)
      s:close()
      other:close()
      collectgarbage()
      local err = error_of(m.restore, m, path)
      has(err, "not loaded")
      has(err, "kvgen_session_restore")
    end)

    it("bad adapters lists are argument errors naming the entry", function()
      has(error_of(m.session, m, { adapters = 3 }), "option 'adapters': table of adapters expected")
      has(error_of(m.session, m, { adapters = { 42 } }), "option 'adapters'[1]: kvgen.Adapter or {adapter, scale} expected, got number")
      has(error_of(m.session, m, { adapters = { { ad, "x" } } }), "option 'adapters'[1][2] (the scale): finite number expected")
      has(error_of(m.session, m, { adapters = { { ad, 0 / 0 } } }), "finite number expected")
      local nine = {}
      for i = 1, 9 do nine[i] = ad end
      has(error_of(m.session, m, { adapters = nine }), "9 adapters, at most 8")
      local s = m:session()
      has(error_of(s.set_adapters, s, { ad, "no" }), "adapters[2]")
      local closed = m:load_adapter(support.random_model_path("--lora --seed 5"))
      closed:close()
      assert.equals("closed adapter", kvgen.type(closed))
      has(error_of(s.set_adapters, s, { closed }), "adapters[1]: the adapter is closed")
      has(error_of(closed.info, closed), "closed kvgen.Adapter")
    end)

    it("bad adapter files are refused, naming the file", function()
      local missing = support.tmpname(".gguf")
      has(error_of(m.load_adapter, m, missing), missing)
      -- a model file is not an adapter
      has(error_of(m.load_adapter, m, support.random_model_path()), "adapter")
      -- an adapter for another shape names the tensor
      local wide = support.random_model_path("--lora --embd 96")
      has(error_of(m.load_adapter, m, wide), "blk.0.attn_q.weight")
      has(error_of(m.load_adapter, m, 7), "path")
    end)

    it("an adapter of another model is refused by set_adapters", function()
      local m2 = kvgen.load(support.random_model_path(), { backend = backend })
      local theirs = m2:load_adapter(support.random_model_path("--lora"))
      local s = m:session()
      has(error_of(s.set_adapters, s, { theirs }), "another model")
      assert.same({}, s:adapters())
      theirs:close()
      m2:close()
    end)
  end)
end

describe("LoRA adapters across backends", function()
  it("the cpu backend agrees with the reference", function()
    local ref = kvgen.load(support.random_model_path(), { backend = "reference" })
    local cpu = kvgen.load(support.random_model_path(), { backend = "cpu" })
    local a1 = ref:load_adapter(support.random_model_path("--lora"))
    local a2 = cpu:load_adapter(support.random_model_path("--lora"))
    local l1 = logits_after(ref:session { adapters = { { a1, 0.8 } } }, prompt)
    local l2 = logits_after(cpu:session { adapters = { { a2, 0.8 } } }, prompt)
    local range = 0
    for i = 1, #l1 do range = math.max(range, math.abs(l1[i])) end
    -- the cpu backend multiplies with 16-bit activations: a few parts in a thousand of the range
    assert.is_true(max_diff(l1, l2) < 5e-3 * range + 1e-3, "cpu vs reference: " .. max_diff(l1, l2))
    a1:close()
    a2:close()
    ref:close()
    cpu:close()
  end)

  if #kvgen.devices() > 0 then
    it("the vulkan backend agrees with the reference, several adapters at once", function()
      local ref = kvgen.load(support.random_model_path(), { backend = "reference" })
      local vk = kvgen.load(support.random_model_path(), { backend = "vulkan" })
      local set = {}
      for _, m in ipairs({ ref, vk }) do
        set[m] = { { m:load_adapter(support.random_model_path("--lora")), 0.8 },
                   { m:load_adapter(support.random_model_path("--lora --seed 7 --lora-rank 4")), -0.5 } }
      end
      local base_r = logits_after(ref:session(), prompt)
      local l1 = logits_after(ref:session { adapters = set[ref] }, prompt)
      local l2 = logits_after(vk:session { adapters = set[vk] }, prompt)
      local range = 0
      for i = 1, #l1 do range = math.max(range, math.abs(l1[i])) end
      -- the device keeps K/V in f16 and sums in its own order: a few parts in a thousand of the
      -- range, well below what the adapters change
      assert.is_true(max_diff(l1, l2) < 5e-3 * range + 1e-3, "vulkan vs reference: " .. max_diff(l1, l2))
      assert.is_true(max_diff(l1, base_r) > 10 * max_diff(l1, l2), "the adapters changed too little to tell")
      set = nil
      ref:close()
      vk:close()
    end)
  end

  teardown(function() support.release() end)
end)
