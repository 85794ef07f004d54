-- Shared by the specs: where the module and tools are, random test models, the default model.
local support = {}

-- $KVGEN_BUILD: a build folder, whose kvgen.so .busted puts first on package.cpath and whose
-- kvgen-mkmodel the specs run. Unset: the installed module (plain require) and the
-- kvgen-mkmodel on PATH (both installed by `luarocks make` or `cmake --install`).
support.build = os.getenv("KVGEN_BUILD")
if support.build == "" then support.build = nil end

local found, kvgen = pcall(require, "kvgen")
if not found then
  error(string.format("kvgen_support: require(\"kvgen\") failed with %s: %s", support.build and
    ("KVGEN_BUILD=" .. support.build) or "KVGEN_BUILD unset (the installed module; KVGEN_BUILD=build for the build tree)",
    tostring(kvgen)), 0)
end
support.kvgen = kvgen
-- where require found it
support.module_path = package.searchpath("kvgen", package.cpath)

-- the tool `name` of the build, or the installed one
function support.tool(name)
  return support.build and (support.build .. "/" .. name) or name
end

-- Lua source that makes a child lua5.4 process find the same module (its package.cpath is
-- the parent's environment, LUA_CPATH, plus the build folder when there is one)
function support.cpath_line()
  if not support.build then return "" end
  return string.format("package.cpath = %q .. \"/?.so;\" .. package.cpath\n", support.build)
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end
support.exists = exists

-- The default model (specs that use it are tagged #model).
function support.model_path()
  local p = os.getenv("KVGEN_MODEL")
  if not p or p == "" then p = "models/SmolLM2-135M-Instruct.Q4_1.gguf" end
  return p
end

local tmpfiles = {}
local made = {} -- random_model_path's files, by argument list

-- A fresh temporary path; removed by support.cleanup(), or when the interpreter exits.
function support.tmpname(suffix)
  local p = os.tmpname()
  os.remove(p)
  p = p .. (suffix or "")
  tmpfiles[#tmpfiles + 1] = p
  return p
end

function support.cleanup()
  for _, p in ipairs(tmpfiles) do os.remove(p) end
  tmpfiles = {}
  made = {}
end

-- what a spec file left behind goes when the Lua state closes (its finalizers run then)
support.exit_cleanup = setmetatable({}, { __gc = function() support.cleanup() end })

-- Writes a random llama GGUF (synthetic vocabulary) with kvgen-mkmodel and returns its path.
-- Extra arguments go to kvgen-mkmodel; one file per distinct argument list per spec file.
function support.random_model_path(extra)
  extra = extra or ""
  if made[extra] then return made[extra] end
  local path = support.tmpname(".gguf")
  local cmd = string.format("%s -o %s --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 128 %s",
    support.tool("kvgen-mkmodel"), path, extra)
  local ok = os.execute(cmd .. " >/dev/null 2>&1")
  assert(ok, "could not run " .. cmd)
  made[extra] = path
  return path
end

-- A random model on the reference backend.
function support.random_model(opts)
  local o = { backend = "reference" }
  for k, v in pairs(opts or {}) do o[k] = v end
  return kvgen.load(support.random_model_path(), o)
end

-- The default model, loaded once per spec file.
local default_model
function support.default_model()
  if not default_model then
    default_model = kvgen.load(support.model_path(), { backend = "reference" })
  end
  return default_model
end

-- Calls f and returns the error message it raises (fails when it does not raise).
function support.error_of(f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected an error")
  return tostring(err)
end

-- Greedy continuation of `ids` by `n` tokens with decode (returns the new ids).
function support.greedy(session, prompt, n)
  session:prefill(prompt)
  local out = {}
  local t = session:sample()
  for i = 1, n do
    out[i] = t
    if i < n then t = session:decode(t) end
  end
  return out
end

-- Closes the model a describe block's setup loaded (if any), collects the module's garbage and
-- removes the spec's temporary files: a block's teardown.
function support.release(m)
  if m then m:close() end
  collectgarbage()
  support.cleanup()
end

-- Spins on job:poll (it never blocks) until the job is final; returns text, finish. opts.limit:
-- gives up (cancels the job, raises) after that many tokens; opts.seconds: how long it may take
-- (120).
function support.poll_to_end(job, opts)
  local limit = opts and opts.limit
  local deadline = os.time() + (opts and opts.seconds or 120)
  local text = {}
  while true do
    local piece, done, finish = job:poll()
    text[#text + 1] = piece
    if done then return table.concat(text), finish end
    if limit and job:info().n_tokens > limit then
      job:cancel()
      error("the job ran past " .. limit .. " tokens")
    end
    assert(os.time() < deadline, "the job did not finish")
  end
end

return support
