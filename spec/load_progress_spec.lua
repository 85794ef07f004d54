-- kvgen.load's progress option: the stages and their counts, cancelling, errors in the callback.
local support = require("kvgen_support")
local kvgen = support.kvgen
local error_of = support.error_of

describe("kvgen.load progress", function()
  local path
  setup(function()
    -- a few MiB of weights, so the byte stages report more than once
    path = support.random_model_path("--layers 3 --embd 256 --heads 4 --kv-heads 2 --ff 512 --type Q8_0 --untied")
  end)
  teardown(support.cleanup)

  local function record(backend, stop)
    local calls = {}
    local ok, m = pcall(kvgen.load, path, {
      backend = backend,
      progress = function(stage, done, total)
        calls[#calls + 1] = { stage = stage, done = done, total = total }
        if stop and stop(#calls, stage) then return false end
      end,
    })
    return calls, ok, m
  end

  for _, backend in ipairs({ "reference", "cpu" }) do
    it("reports rising counts that end at each stage's total (" .. backend .. ")", function()
      local calls, ok, m = record(backend)
      assert.is_true(ok, tostring(m))
      local order = { read = 1, upload = 2, pipelines = 3 }
      assert.is_true(#calls >= 2)
      assert.are.equal("read", calls[1].stage)
      for i, c in ipairs(calls) do
        assert.is_not_nil(order[c.stage], c.stage)
        assert.is_true(c.done <= c.total)
        local p = calls[i - 1]
        if p and p.stage == c.stage then
          assert.is_true(c.done > p.done)
          assert.are.equal(p.total, c.total)
        elseif p then
          assert.is_true(order[c.stage] > order[p.stage])
          assert.are.equal(p.total, p.done)
        end
      end
      local last = calls[#calls]
      assert.are.equal(last.total, last.done)
      -- the read stage counts every tensor's bytes
      for _, c in ipairs(calls) do
        if c.stage == "read" then assert.are.equal(m.weight_bytes, c.total) break end
      end
      local saw_upload = false
      for _, c in ipairs(calls) do saw_upload = saw_upload or c.stage == "upload" end
      assert.are.equal(backend == "cpu", saw_upload)
      m:close()
    end)
  end

  it("cancels the load when the callback returns false", function()
    local calls, ok, err = record("cpu", function(n) return n == 2 end)
    assert.is_false(ok)
    assert.are.equal(2, #calls)
    assert.matches("cancelled by the progress callback", tostring(err), 1, true)
    assert.are.equal("cancelled", (kvgen.last_error()))
    -- nil and true go on; the next load works
    local m = kvgen.load(path, { backend = "cpu", progress = function() return true end })
    m:close()
  end)

  it("raises the callback's own error after cancelling the load", function()
    local calls = 0
    local err = error_of(kvgen.load, path, {
      backend = "cpu",
      progress = function(stage)
        calls = calls + 1
        if stage == "upload" then error("stop here") end
      end,
    })
    assert.matches("stop here", err, 1, true)
    assert.is_nil(err:find("cancelled", 1, true))
    -- a table as the error value comes back as it was raised
    local value = {}
    local ok, got = pcall(kvgen.load, path, { backend = "reference", progress = function() error(value) end })
    assert.is_false(ok)
    assert.are.equal(value, got)
    -- the state is usable afterwards, and the model loads
    collectgarbage()
    local m = kvgen.load(path, { backend = "reference" })
    assert.is_true(m.weight_bytes > 0)
    m:close()
  end)

  it("checks the option", function()
    assert.matches("progress", error_of(kvgen.load, path, { progress = 3 }), 1, true)
  end)
end)
