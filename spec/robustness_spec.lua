-- What a demanding script may hand the module never crashes the host: schema tables nested
-- deep, nested without end or containing themselves are refused by an argument error that
-- names the call, the option, the bound and the place (as the same schemas given as JSON text
-- are); deep JSON values come back as tables; every argument error names the function the
-- script called, also when it was called from C (pcall(s.submit, s, ...), a coroutine), where
-- Lua itself knows no name; and the default pipeline cache path follows the platform's
-- environment. Random model, reference backend.
local support = require("kvgen_support")
local kvgen = support.kvgen
local error_of = support.error_of

-- {type="object", properties={a=<inner>}, required={"a"}} around a boolean, `levels` times:
-- 2 * levels + 1 tables deep
local function nested_schema(levels)
  local t = { type = "boolean" }
  for _ = 1, levels do t = { type = "object", properties = { a = t }, required = { "a" } } end
  return t
end

-- the same schema as JSON text
local function nested_schema_text(levels)
  return string.rep('{"type":"object","properties":{"a":', levels) .. '{"type":"boolean"}' ..
    string.rep('},"required":["a"]}', levels)
end

-- a list inside a list ..., `levels` deep, around 1
local function nested_list(levels)
  local t = 1
  for _ = 1, levels do t = { t } end
  return t
end

local function many_stops()
  local t = {}
  for i = 1, 65 do t[i] = "s" .. i end
  return t
end

describe("robustness", function()
  local m, s
  setup(function() m = support.random_model { threads = 1 } end)
  teardown(function() support.release(m) end)
  before_each(function() s = m:session { seed = 3, temperature = 1.0 } end)
  after_each(function()
    s:close()
    s = nil
    collectgarbage()
  end)

  describe("schema tables", function()
    it("nested up to the bound generate, at every depth (the writer's stack is checked per level)", function()
      for levels = 1, 31 do
        local text, finish, value = s:generate("x", { schema = nested_schema(levels), max_tokens = 8 * levels + 16 })
        assert.are.equal("stop", finish, "levels " .. levels)
        assert.are.equal(string.rep('{"a":', levels), text:sub(1, 5 * levels))
        for _ = 1, levels do value = value.a end
        assert.are.equal("boolean", type(value))
        s:reset()
      end
    end)

    it("nested past the bound are refused naming the call, the option, the bound and the path", function()
      for _, levels in ipairs { 32, 40, 200000 } do
        local e = error_of(function() s:generate("x", { schema = nested_schema(levels) }) end)
        assert.matches("^.-bad argument #2 to 'generate' %(option 'schema': nested deeper than 64 levels", e)
        assert.matches("at schema%.properties%.a%.properties%.a", e)
        assert.are.equal(0, s.length)
      end
      -- the same schema as JSON text: refused by the library, as cleanly
      assert.matches("option 'schema'", error_of(function()
        s:generate("x", { schema = nested_schema_text(40) })
      end))
      -- a plain list nested 200000 deep, anywhere in the schema
      local e = error_of(function() s:generate("x", { schema = { const = nested_list(200000) } }) end)
      assert.matches("option 'schema': nested deeper than 64 levels %(the most kvgen takes%) at schema%.const%[1%]%[1%]", e)
    end)

    it("a table that contains itself is refused with both paths", function()
      local c = { type = "object" }
      c.properties = { self = c }
      assert.matches("bad argument #2 to 'generate' %(option 'schema': a table that contains itself cannot be " ..
        "JSON %(the table at schema%) at schema%.properties%.self%)", error_of(function()
          s:generate("x", { schema = c })
        end))
      -- deeper, through a list, and through `required` (written first, as the property order)
      local inner = { type = "array" }
      local outer = { type = "object", properties = { list = inner }, required = { "list" } }
      inner.items = { anyOf = { outer } }
      assert.matches("a table that contains itself cannot be JSON %(the table at schema%) at " ..
        "schema%.properties%.list%.items%.anyOf%[1%]", error_of(function() s:generate("x", { schema = outer }) end))
      local req = { "a" }
      req[2] = req
      assert.matches("contains itself cannot be JSON %(the table at schema%.required%) at schema%.required%[2%]",
        error_of(function()
          s:generate("x", { schema = { type = "object", properties = { a = { type = "boolean" } }, required = req } })
        end))
      -- for every call that takes a schema, also called from C (pcall of the function)
      for _, name in ipairs { "generate", "stream", "chat", "chat_stream", "submit", "submit_chat",
        "stream_async", "chat_stream_async" } do
        assert.matches("bad argument #3 to 'kvgen%.Session%." .. name .. "' %(option 'schema': a table that contains " ..
          "itself", error_of(s[name], s, "x", { schema = c }))
      end
      assert.are.equal(0, s.length)
      assert.are.same({}, kvgen.poll())
    end)

    it("a table used twice (not inside itself) is written twice", function()
      local shared = { type = "boolean" }
      local schema = { type = "object", properties = { a = shared, b = shared }, required = { "a", "b" } }
      local text, finish, value = s:generate("x", { schema = schema, max_tokens = 32 })
      assert.are.equal("stop", finish)
      assert.matches('^{"a":%a+,"b":%a+}$', text)
      assert.are.equal("boolean", type(value.a))
      assert.are.equal("boolean", type(value.b))
    end)

    it("is read raw: no metamethod of the script's runs", function()
      local trap = { __index = function() error("__index ran") end, __len = function() error("__len ran") end,
        __pairs = function() error("__pairs ran") end }
      local schema = setmetatable({ type = "object", properties = setmetatable({ a = { type = "boolean" } }, trap),
        required = setmetatable({ "a" }, trap) }, trap)
      local text, finish = s:generate("x", { schema = schema, max_tokens = 16 })
      assert.are.equal("stop", finish)
      assert.matches('^{"a":%a+}$', text)
    end)

    it("refuses keys it cannot write, naming the path", function()
      assert.matches("option 'schema': a boolean key cannot be JSON at schema%.properties",
        error_of(function() s:generate("x", { schema = { properties = { [true] = 1 } } }) end))
      assert.matches("option 'schema': the key 'a' holds a NUL byte", error_of(function()
        s:generate("x", { schema = { properties = { ["a\0b"] = { type = "boolean" } } } })
      end))
    end)
  end)

  describe("JSON values read back", function()
    it("come back as tables at every depth up to the bound", function()
      for _, levels in ipairs { 1, 16, 17, 30, 62 } do
        local text, finish, value = s:generate("x", { schema = { const = nested_list(levels) },
          max_tokens = 4 * levels + 8 })
        assert.are.equal("stop", finish, "levels " .. levels)
        assert.are.equal(string.rep("[", levels) .. "1" .. string.rep("]", levels), text)
        assert.are.same(nested_list(levels), value)
        s:reset()
      end
    end)

    it("through a job and a stream", function()
      local schema = { const = nested_list(40) }
      local job = s:submit("x", { schema = schema, max_tokens = 100 })
      local deadline = os.time() + 120
      repeat
        local _, done = job:poll()
        assert(os.time() < deadline, "the job did not finish")
      until done
      assert.are.same(nested_list(40), job.value)
      job:close()
      s:reset()
      local st = s:stream("x", { schema = schema, max_tokens = 100 })
      for _ in st do end
      assert.are.same(nested_list(40), st.value)
    end)
  end)

  describe("argument errors name the function", function()
    -- {method name, the bad arguments after self} for each type
    local model_calls = {
      { "close" }, { "info" }, { "describe" }, { "pool_info" },
      { "tokenize", 12 }, { "detokenize", "x" }, { "piece", "x" }, { "is_eog", "x" }, { "is_control", "x" },
      { "token", 1 }, { "detokenizer", { bogus = true } }, { "session", { bogus = 1 } }, { "restore", 1 },
    }
    local session_calls = {
      { "close" }, { "sample" }, { "tokens" }, { "reset" }, { "cache_info" }, { "fork" }, { "sampler" },
      { "prefill", true }, { "decode", "x" }, { "logits", "x" }, { "read_cache", "x" }, { "read_cache", 0, "q" },
      { "rewind", "x" }, { "save", 1 }, { "set_sampler", { top_p = 2 } }, { "set_template", 1 }, { "add", "x", "y" },
      { "add", "user", "y", 5 }, { "add_tool_result", 1, "x" }, { "add_tool_result", "c1", true }, { "set_chat_vars", 1 },
      { "chat", "p", { tools = 1 } }, { "chat", "p", { template_vars = { f = print } } }, { "choose", 1 },
      { "generate", "p", { stop = many_stops() } }, { "stream", "p", { stop = many_stops() } },
      { "chat", "p", { stop = many_stops() } }, { "chat_stream", "p", { bogus = 1 } },
      { "submit", "p", { stop = many_stops() } }, { "submit_chat", "p", { stop = many_stops() } },
      { "stream_async", "p", { max_tokens = "x" } }, { "chat_stream_async", "p", { stop = many_stops() } },
    }
    local stream_calls = { { "next" }, { "cancel" }, { "close" } }
    local job_calls = { { "poll" }, { "info" }, { "cancel" }, { "close" }, { "set_priority", "x" } }
    local detok_calls = { { "push", "x" }, { "flush" } }

    -- calls `name` on `obj` with the bad arguments three ways: from C (pcall of the function),
    -- as a method (s:name(...)) and with a bad self; each message must name the function
    local function check(obj, type_name, calls)
      for _, call in ipairs(calls) do
        local name = call[1]
        local fn = obj[name]
        assert.are.equal("function", type(fn), name)
        local full = "'" .. type_name:gsub("%.", "%%.") .. "%." .. name .. "'"
        if #call > 1 then
          local e = error_of(fn, obj, table.unpack(call, 2))
          assert.matches("^bad argument #%d to " .. full .. " %(", e)
          local as_method = load("local o = ...; o:" .. name .. "(select(2, ...)) return true")
          e = error_of(as_method, obj, table.unpack(call, 2))
          assert.matches("bad argument #%d to '" .. name .. "' %(", e)
        end
        assert.matches("^bad argument #1 to " .. full .. " %(" .. type_name:gsub("%.", "%%.") ..
          " expected, got number%)", error_of(fn, 42))
        -- a method call on something else that has the function
        local other = load("local o = { " .. name .. " = ... }; o:" .. name .. "()")
        assert.matches("calling '" .. name .. "' on bad self %(" .. type_name:gsub("%.", "%%.") ..
          " expected, got table%)", error_of(other, fn))
        -- the body of a coroutine is called from C too
        if #call > 1 then
          assert.matches("to " .. full, error_of(coroutine.wrap(fn), obj, table.unpack(call, 2)))
        end
      end
    end

    it("model, session, stream, job and detokenizer methods", function()
      check(m, "kvgen.Model", model_calls)
      s:set_template("chatml")
      check(s, "kvgen.Session", session_calls)
      assert.are.equal(0, s.length)
      assert.are.same({}, kvgen.poll())
      local st = s:stream("p", { max_tokens = 1 })
      check(st, "kvgen.Stream", stream_calls)
      st:close()
      local job = s:submit("p", { max_tokens = 1 })
      check(job, "kvgen.Job", job_calls)
      job:close()
      local d = m:detokenizer()
      check(d, "kvgen.Detokenizer", detok_calls)
    end)

    it("the stop list over its bound, as the script saw it", function()
      assert.are.equal("bad argument #3 to 'kvgen.Session.submit' (option 'stop': 65 stop strings, at most 64)",
        error_of(s.submit, s, "p", { stop = many_stops() }))
      assert.matches("bad argument #2 to 'submit' %(option 'stop': 65 stop strings, at most 64%)",
        error_of(function() return s:submit("p", { stop = many_stops() }) end))
    end)

    it("module functions", function()
      assert.matches("^bad argument #1 to 'kvgen%.load' %(path: string expected, got number 42%)", error_of(kvgen.load, 42))
      assert.matches("^bad argument #1 to 'kvgen%.type' %(value expected%)", error_of(kvgen.type))
      assert.matches("^bad argument #1 to 'kvgen%.poll' %(kvgen%.Model expected, got number%)", error_of(kvgen.poll, 42))
      assert.matches("^bad argument #1 to 'kvgen%.set_logger' %(function expected, got number%)",
        error_of(kvgen.set_logger, 42))
      assert.matches("bad argument #1 to 'set_logger' %(function expected, got number%)",
        error_of(function() kvgen.set_logger(42) end))
    end)
  end)
end)

describe("kvgen.pipeline_cache_path", function()
  -- kvgen.pipeline_cache_path() in a child lua5.4 with the environment `env` (VAR=value words;
  -- -u VAR unsets), as the child prints it
  local function child_path(env)
    local code = support.cpath_line() .. 'print(tostring(require("kvgen").pipeline_cache_path()))'
    local cmd = string.format("env -u KVGEN_PIPELINE_CACHE -u XDG_CACHE_HOME -u HOME %s lua5.4 -e '%s' 2>/dev/null", env,
      code)
    local p = assert(io.popen(cmd))
    local out = p:read("a")
    p:close()
    return (out:gsub("\n$", ""))
  end

  it("is the path kvgen.load uses by default, from the environment of this platform", function()
    assert.are.equal("nil", child_path(""))
    assert.are.equal("/x/p-{device}.bin", child_path("KVGEN_PIPELINE_CACHE=/x/p-{device}.bin HOME=/home/u"))
    assert.are.equal("nil", child_path("KVGEN_PIPELINE_CACHE=off HOME=/home/u"))
    assert.are.equal("nil", child_path("KVGEN_PIPELINE_CACHE= HOME=/home/u"))
    assert.are.equal("/c/kvgen/pipelines-{device}.bin", child_path("XDG_CACHE_HOME=/c HOME=/home/u"))
    -- a relative XDG_CACHE_HOME is ignored (the XDG base directory spec)
    assert.are.equal("/home/u/.cache/kvgen/pipelines-{device}.bin", child_path("XDG_CACHE_HOME=c HOME=/home/u"))
    assert.are.equal("/home/u/.cache/kvgen/pipelines-{device}.bin", child_path("HOME=/home/u"))
    -- Windows' folders are Windows' only (lua/tests/windows_smoke.lua checks them there)
    assert.are.equal("nil", child_path("LOCALAPPDATA=/l APPDATA=/a USERPROFILE=/u"))
  end)

  it("in this process: $KVGEN_PIPELINE_CACHE when it is set, else under a cache folder", function()
    local p = kvgen.pipeline_cache_path()
    local env = os.getenv("KVGEN_PIPELINE_CACHE")
    if env then
      if env == "" or env == "off" then assert.is_nil(p) else assert.are.equal(env, p) end
    else
      assert.is_truthy(p == nil or p:match("kvgen/pipelines%-{device}%.bin$"))
    end
  end)
end)
