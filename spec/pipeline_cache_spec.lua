-- kvgen.load's pipeline_cache option: a Vulkan pipeline cache file kvgen reads at load and
-- writes back (docs/lua-api.md, docs/vulkan.md). Random model; the Vulkan cases run where a
-- device works, the argument checks and the reference backend everywhere.
local support = require("kvgen_support")
local kvgen = support.kvgen

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local d = f:read("a")
  f:close()
  return d
end

local function write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

-- A fresh folder name (not created: kvgen creates it) and the files to remove afterwards.
local made = {}
local function fresh_dir()
  local d = support.tmpname("-pcache")
  made[#made + 1] = d
  return d
end

local function remove_tree(files)
  for i = #files, 1, -1 do os.remove(files[i]) end
end

-- The first Vulkan device, or nil where there is none.
local function device()
  local ok, devices = pcall(kvgen.devices)
  return ok and devices[1] or nil
end

local function expanded(dir, dev)
  return string.format("%s/sub/pipelines-%04x-%04x.bin", dir, dev.vendor_id, dev.device_id)
end

-- The 32 best next tokens after a fixed prompt ({id=, logit=, p=}, best first).
local function logits(m)
  local s = m:session()
  s:prefill({ 1, 2, 3, 4, 5, 6, 7 })
  local l = s:logits(32)
  s:close()
  return l
end

local function same(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do
    if a[i].id ~= b[i].id or a[i].logit ~= b[i].logit then return false end
  end
  return true
end

describe("kvgen.load pipeline_cache", function()
  teardown(support.cleanup)
  local cleanup = {}
  after_each(function()
    remove_tree(cleanup)
    cleanup = {}
    for _, d in ipairs(made) do
      os.remove(d .. "/sub")
      os.remove(d)
    end
    made = {}
  end)

  it("writes the file a Vulkan load names, headed by the device's pipeline cache header", function()
    local dev = device()
    if not dev then return end -- no Vulkan here
    local dir = fresh_dir()
    local path = expanded(dir, dev)
    cleanup[#cleanup + 1] = path
    local m = kvgen.load(support.random_model_path(), { backend = "vulkan", device = dev.index,
      pipeline_cache = dir .. "/sub/pipelines-{device}.bin" })
    assert.are.equal("vulkan", m.backend)
    local want = logits(m)
    m:close()
    local data = read(path)
    assert.is_truthy(data, "no file at " .. path)
    assert.is_true(#data >= 32 + 24)
    local hsize, hversion, vendor, devid = string.unpack("<I4I4I4I4", data)
    assert.are.equal(32, hsize)
    assert.are.equal(1, hversion)
    assert.are.equal(dev.vendor_id, vendor)
    assert.are.equal(dev.device_id, devid)
    assert.are.equal("kvgenPC1", data:sub(#data - 23, #data - 16))
    assert.are.equal(#data - 24, (string.unpack("<I8", data, #data - 15)))

    -- a second load reads it, computes the same logits and leaves the file as it was
    m = kvgen.load(support.random_model_path(), { backend = "vulkan", device = dev.index,
      pipeline_cache = dir .. "/sub/pipelines-{device}.bin" })
    assert.is_true(same(want, logits(m)))
    m:close()
    assert.are.equal(data, read(path))
  end)

  it("ignores a damaged file: the load works and the file is replaced by a valid one", function()
    local dev = device()
    if not dev then return end
    local path = support.tmpname("-pipelines.bin")
    write(path, string.rep("\0", 40) .. "not a pipeline cache")
    local m = kvgen.load(support.random_model_path(), { backend = "vulkan", device = dev.index, pipeline_cache = path })
    local want = logits(m)
    m:close()
    local data = read(path)
    assert.are.equal(32, (string.unpack("<I4", data)))
    assert.are.equal("kvgenPC1", data:sub(#data - 23, #data - 16))
    m = kvgen.load(support.random_model_path(), { backend = "vulkan", device = dev.index, pipeline_cache = false })
    assert.is_true(same(want, logits(m)))
    m:close()
  end)

  it("pipeline_cache = false and true load on either backend", function()
    local m = kvgen.load(support.random_model_path(), { pipeline_cache = false })
    assert.is_truthy(#logits(m) > 0)
    m:close()
    m = kvgen.load(support.random_model_path(), { backend = "reference", pipeline_cache = true })
    assert.are.equal("reference", m.backend)
    m:close()
  end)

  it("the reference backend ignores the option", function()
    local dir = fresh_dir()
    local m = kvgen.load(support.random_model_path(), { backend = "reference",
      pipeline_cache = dir .. "/sub/pipelines.bin" })
    m:close()
    assert.is_nil(read(dir .. "/sub/pipelines.bin"))
  end)

  it("a bad value is an argument error naming kvgen.load, the option and the value", function()
    local path = support.random_model_path()
    local e = support.error_of(kvgen.load, path, { pipeline_cache = 42 })
    assert.matches("bad argument #2 to 'kvgen.load'", e, 1, true)
    assert.matches("option 'pipeline_cache': path (string) or false expected, got number (42)", e, 1, true)
    e = support.error_of(kvgen.load, path, { pipeline_cache = { "a" } })
    assert.matches("option 'pipeline_cache': path (string) or false expected, got table", e, 1, true)
    e = support.error_of(kvgen.load, path, { pipeline_cache = "" })
    assert.matches("option 'pipeline_cache': empty path", e, 1, true)
    assert.matches("unknown option 'pipeline_cahce'", support.error_of(kvgen.load, path, { pipeline_cahce = "x" }),
      1, true)
  end)
end)
