-- kvgen.set_logger: kvgen's messages (warnings such as an ignored pipeline cache file) go to a
-- function of the script, on the script's thread, at the end of kvgen.load and in kvgen.poll
-- (docs/lua-api.md). The Vulkan case runs where a device works, the argument checks everywhere.
local support = require("kvgen_support")
local kvgen = support.kvgen

local function device()
  local ok, devices = pcall(kvgen.devices)
  return ok and devices[1] or nil
end

describe("kvgen.set_logger", function()
  teardown(function()
    kvgen.set_logger(nil)
    support.cleanup()
  end)

  it("takes a function or nil, and nothing else", function()
    assert.has_error(function() kvgen.set_logger("print") end)
    assert.has_error(function() kvgen.set_logger({}) end)
    kvgen.set_logger(function() end)
    kvgen.set_logger(nil)
  end)

  it("hands the script kvgen's warning about an ignored pipeline cache file", function()
    local dev = device()
    if not dev then return end -- no Vulkan here
    local path = support.tmpname("-damaged-pipelines.bin")
    local f = assert(io.open(path, "wb"))
    f:write("not a pipeline cache")
    f:close()
    local got = {}
    kvgen.set_logger(function(level, msg) got[#got + 1] = { level = level, msg = msg } end)
    local m = kvgen.load(support.random_model_path(), { backend = "vulkan", device = dev.index, pipeline_cache = path })
    m:close()
    kvgen.poll()
    kvgen.set_logger(nil)
    os.remove(path)
    local found
    for _, e in ipairs(got) do
      assert.is_true(e.level == "error" or e.level == "warning" or e.level == "info" or e.level == "debug")
      assert.are.equal("string", type(e.msg))
      if e.level == "warning" and e.msg:find("pipeline cache", 1, true) and e.msg:find(path, 1, true) then found = e end
    end
    assert.is_truthy(found, "no warning naming " .. path .. " among " .. #got .. " messages")
  end)

  it("lets an error of the logger reach the script", function()
    local dev = device()
    if not dev then return end
    local path = support.tmpname("-damaged2-pipelines.bin")
    local f = assert(io.open(path, "wb"))
    f:write("still not a pipeline cache")
    f:close()
    kvgen.set_logger(function(_, msg) error("logger saw: " .. msg, 0) end)
    local ok, err = pcall(kvgen.load, support.random_model_path(), { backend = "vulkan", device = dev.index,
      pipeline_cache = path })
    kvgen.set_logger(nil)
    os.remove(path)
    collectgarbage()
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("logger saw:", 1, true))
  end)

  -- A Vulkan load whose pipeline cache path is a folder: two warnings queued at once (it is
  -- not read, and not written), whoever runs the spec.
  local function load_two_warnings(dev, name)
    local dir = support.tmpname(name)
    assert(os.execute("mkdir -p '" .. dir .. "'"))
    local ok, err = pcall(kvgen.load, support.random_model_path(), { backend = "vulkan", device = dev.index,
      pipeline_cache = dir })
    os.remove(dir)
    collectgarbage()
    return ok, err
  end

  it("keeps the messages after the one its logger raised on for the next delivery", function()
    local dev = device()
    if not dev then return end
    local calls, seen = 0, {}
    kvgen.set_logger(function(_, msg)
      calls = calls + 1
      if calls == 1 then error("logger saw: " .. msg, 0) end
      seen[#seen + 1] = msg
    end)
    local ok, err = load_two_warnings(dev, "-cache-folder1")
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("logger saw:", 1, true))
    assert.are.equal(0, #seen)
    kvgen.poll()
    kvgen.set_logger(nil)
    assert.are.equal(1, #seen)
    assert.is_truthy(tostring(err):find("ignored (not a regular file)", 1, true), tostring(err))
    assert.is_truthy(seen[1]:find("not written", 1, true), seen[1])
  end)

  it("removes a logger that raises without raising, and tells its successor what it raised", function()
    local dev = device()
    if not dev then return end
    kvgen.set_logger(function(_, msg) error("logger saw: " .. msg, 0) end)
    local ok = load_two_warnings(dev, "-cache-folder2")
    assert.is_false(ok)
    local got = {}
    assert.has_no.errors(function()
      kvgen.set_logger(function(level, msg) got[#got + 1] = { level = level, msg = msg } end)
    end)
    assert.are.equal(1, #got)
    assert.are.equal("warning", got[1].level)
    assert.is_truthy(got[1].msg:find("the previous logger raised: logger saw:", 1, true), got[1].msg)

    kvgen.set_logger(function(_, msg) error("logger saw: " .. msg, 0) end)
    ok = load_two_warnings(dev, "-cache-folder3")
    assert.is_false(ok)
    assert.has_no.errors(function() kvgen.set_logger(nil) end) -- the rest goes to stderr
    assert.has_no.errors(function() kvgen.poll() end)
  end)
end)
