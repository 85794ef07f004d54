-- The Lua module on Windows, under a Lua built as lua54.dll (lua/windows.cmake, ctest
-- lua_module_load): loads, tokenizes and detokenizes, generates, and saves and restores a session
-- (the save replaces an existing file). arg[1]: a random-weight model, arg[2]: a scratch file.
local kvgen = require("kvgen")
assert(type(kvgen.version) == "string", "kvgen.version")
local model <close> = kvgen.load(arg[1], { backend = "reference" })
local ids = model:tokenize("hello world")
assert(#ids > 0, "tokenize gave no ids")
assert(model:detokenize(ids) == "hello world", "detokenize(tokenize(s)) ~= s")
local s <close> = model:session { seed = 7 }
assert(s:prefill("hello world") == #ids, "prefill")
local text = s:generate(nil, { max_tokens = 4 })
assert(type(text) == "string", "generate")
local before = s:tokens()
s:save(arg[2])
s:save(arg[2]) -- over the file just written
local r <close> = model:restore(arg[2])
local after = r:tokens()
assert(#after == #before, "restored " .. #after .. " tokens of " .. #before)
for i = 1, #before do assert(after[i] == before[i], "token " .. i) end
-- the default pipeline cache: in the local application data folder (Windows has no HOME)
local pc = kvgen.pipeline_cache_path()
local env = os.getenv("KVGEN_PIPELINE_CACHE")
if env then
  local want = env
  if env == "" or env == "off" then want = nil end
  assert(pc == want, "pipeline_cache_path() " .. tostring(pc))
else
  local base = os.getenv("LOCALAPPDATA") or os.getenv("APPDATA")
  assert(base and pc == base .. "\\kvgen\\pipelines-{device}.bin", "pipeline_cache_path() " .. tostring(pc))
end
print("ok " .. kvgen.version .. " " .. #before .. " tokens")
