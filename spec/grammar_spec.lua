-- Grammars and JSON schemas as constrained output through Lua: grammar = GBNF text, schema =
-- a table or JSON text, the parsed value returned beside the text (and as job.value), bad
-- grammars and schemas refused naming the call and the option, and jobs. Random model,
-- reference backend, sampled with temperature (random text forced through the grammar).
local support = require("kvgen_support")
local kvgen = support.kvgen
local error_of = support.error_of

local npc = {
  type = "object",
  properties = {
    line = { type = "string", maxLength = 40 },
    mood = { enum = { "angry", "calm" } },
    action = {
      type = "object",
      properties = {
        type = { const = "give" },
        item = { type = "string", maxLength = 12 },
        count = { type = "integer", minimum = 1, maximum = 5 },
      },
      required = { "type", "item", "count" },
    },
  },
  required = { "line", "mood", "action" },
}

local function check_npc(v)
  assert.are.equal("table", type(v))
  assert.are.equal("string", type(v.line))
  assert.is_true(utf8.len(v.line) ~= nil and utf8.len(v.line) <= 40)
  assert.is_truthy(v.mood == "angry" or v.mood == "calm", v.mood)
  assert.are.equal("give", v.action.type)
  assert.are.equal("string", type(v.action.item))
  assert.is_true(math.type(v.action.count) == "integer" and v.action.count >= 1 and v.action.count <= 5)
end

local function wait_final(job)
  local deadline = os.time() + 120
  while true do
    local _, done = job:poll()
    if done then return end
    assert(os.time() < deadline, "the job did not finish")
  end
end

describe("grammars and schemas (random model)", function()
  local m
  setup(function() m = support.random_model { threads = 1 } end)
  teardown(function() support.release(m) end)

  it("a schema table: the text is JSON in the schema's required order, and its value comes back", function()
    for seed = 1, 6 do
      local s <close> = m:session { seed = seed, temperature = 1.0 }
      local text, finish, value = s:generate("npc:", { schema = npc })
      assert.are.equal("stop", finish)
      assert.matches('^{"line":".*","mood":"%a+","action":{"type":"give","item":".*","count":%d}}$', text)
      check_npc(value)
    end
  end)

  it("a schema as JSON text, optional properties, arrays, null", function()
    local schema = [[{"type":"object","properties":{"tags":{"type":"array","items":{"type":"string",
      "enum":["a","b"]},"minItems":1,"maxItems":3},"n":{"type":["integer","null"],"minimum":-3,"maximum":3},
      "ok":{"type":"boolean"}},"required":["tags"]}]]
    for seed = 1, 6 do
      local s <close> = m:session { seed = seed, temperature = 1.0 }
      local text, finish, value = s:generate("json:", { schema = schema })
      assert.are.equal("stop", finish)
      assert.are.equal("table", type(value), text)
      assert.is_true(#value.tags >= 1 and #value.tags <= 3)
      for _, t in ipairs(value.tags) do assert.is_truthy(t == "a" or t == "b") end
      assert.is_truthy(value.n == nil or value.n == kvgen.null or (value.n >= -3 and value.n <= 3))
      assert.is_truthy(value.ok == nil or type(value.ok) == "boolean")
    end
  end)

  it("a grammar: the text matches it; generate keeps returning text, finish", function()
    local g = 'root ::= "<" word ("," word){0,2} ">"\nword ::= [a-z]{1,4}  # a short word'
    for seed = 1, 6 do
      local s <close> = m:session { seed = seed, temperature = 1.0 }
      local text, finish, extra = s:generate("x", { grammar = g })
      assert.are.equal("stop", finish)
      assert.is_nil(extra)
      assert.matches("^<%l%l?%l?%l?(,?%l*)(,?%l*)>$", text)
    end
  end)

  it("chat takes a schema too", function()
    local s <close> = m:session { seed = 3, temperature = 1.0 }
    local reply, finish, value = s:chat("hello", { schema = npc })
    assert.are.equal("stop", finish)
    check_npc(value)
    local text2, finish2, v2 = s:chat("again", { schema = [[{"const":{"a":[1,2.5,"x\n"],"b":null}}]] })
    assert.are.equal("stop", finish2)
    assert.are.equal('{"a":[1,2.5,"x\\n"],"b":null}', text2)
    assert.are.same({ a = { 1, 2.5, "x\n" }, b = kvgen.null }, v2)
  end)

  it("a grammar and a schema through jobs; job.value is the parsed value", function()
    local s <close> = m:session { seed = 9, temperature = 1.0 }
    local job = s:submit("x", { grammar = 'root ::= "yes" | "no" | [0-9]{3}' })
    wait_final(job)
    assert.are.equal("stop", job.finish)
    assert.is_truthy(job.text == "yes" or job.text == "no" or job.text:match("^%d%d%d$"), job.text)
    assert.is_nil(job.value)
    job:close()
    local j2 = s:submit("npc:", { schema = npc })
    wait_final(j2)
    assert.are.equal("stop", j2.finish)
    check_npc(j2.value)
    j2:close()
  end)

  -- the message s:generate({ 1 }, opts) raises
  local function refusal(s, opts) return error_of(function() return s:generate({ 1 }, opts) end) end

  it("refuses bad grammars and schemas, naming the call, the option and the place", function()
    local s <close> = m:session()
    for _, c in ipairs {
      { "bad argument #2 to 'generate' %(option 'grammar': grammar: rule 'word' is used %(line 1 column 10%) but never defined%)",
        { grammar = "root ::= word" } },
      { "bad argument #2 to 'generate' %(option 'grammar': grammar: rule 'e' %(line 2 column 1%) is left%-recursive",
        { grammar = 'root ::= e\ne ::= e "+" | "1"' } },
      { "bad argument #2 to 'generate' %(option 'schema': schema: #/properties/a: keyword 'pattern' is not supported%)",
        { schema = { type = "object", properties = { a = { type = "string", pattern = "x" } } } } },
      { "option 'schema': a function cannot be JSON at schema.properties.f", { schema = { properties = { f = print } } } },
      { "option 'schema': cannot be combined with another constraint", { choices = { "a" }, schema = npc } },
      { "option 'grammar': GBNF text expected, got number 3", { grammar = 3 } },
    } do
      assert.matches(c[1], refusal(s, c[2]))
    end
    assert.matches("bad argument #2 to 'submit' %(option 'schema': schema: not valid JSON",
      error_of(function() return s:submit({ 1 }, { schema = "{" }) end))
    assert.are.equal(0, s.length) -- refused before the prompt was appended
  end)

  it("a stream under a schema: st.value once it is done", function()
    local s <close> = m:session { seed = 12, temperature = 1.0 }
    local st = s:stream("npc:", { schema = npc })
    local pieces = {}
    for piece in st do pieces[#pieces + 1] = piece end
    assert.are.equal("stop", st.finish)
    assert.are.equal(st.text, table.concat(pieces))
    check_npc(st.value)
    local plain = s:stream("x", { max_tokens = 2 })
    for _ in plain do end
    assert.is_nil(plain.value)
  end)

  it("refuses grammars past the parser's bounds, naming the bound and the byte", function()
    local s <close> = m:session()
    local deep = "root ::= " .. string.rep("(", 100000) .. '"a"' .. string.rep(")", 100000)
    for _, c in ipairs {
      { "option 'grammar': grammar: line 1 column 266: groups nested over 256 deep %(byte 265%)", { grammar = deep } },
      { "the repetition expands to 16777216 elements, over the limit of 1048576 %(byte 23%)",
        { grammar = 'root ::= (("a"{0,4096}){0,4096}){0,4096}' } },
      { "grammar: line 1 column 14: '\\' at the end of the grammar %(byte 13%)", { grammar = 'root ::= "abc\\' } },
      { "'\\' at the end of the grammar %(byte 10%)", { grammar = "root ::= [\\" } },
      { "option 'schema': schema: #/properties/a: keyword 'const' holds a string that is not valid UTF%-8",
        { schema = '{"properties":{"a":{"const":"\xff"}}}' } },
      { "schema: #: keyword 'enum' value 0 holds a string that is not valid UTF%-8", { schema = { enum = { "\xc3" } } } },
      { "option 'grammar': grammar: its start needs over 2097152 matcher steps",
        { grammar = 'root ::= (("a"?){1000}){1000}' } },
    } do
      assert.matches(c[1], refusal(s, c[2]))
    end
    assert.are.equal(0, s.length)
  end)

  -- grammars the matcher finds costly: each ends (completes, or fails with a message naming the
  -- matcher's bound), never by a silent refusal; asserted on what happens, never on time
  local costly = {
    '(("a"?){0,300}){0,300}',
    '("b" root "b"?)+ "!" | ""',
    '([^x]{0,64} [a-z]{0,64}){0,64}',
  }

  it("costly grammars end with their text or a clear error", function()
    for _, body in ipairs(costly) do
      local s <close> = m:session { seed = 5, temperature = 1.0 }
      local ok, text, finish = pcall(s.generate, s, "x", { grammar = "root ::= " .. body, max_tokens = 20 })
      if ok then
        assert.is_truthy(finish == "stop" or finish == "length" or finish == "dead_end", finish)
        assert.are.equal("string", type(text))
      else
        assert.matches("grammar: .*matcher", text)
      end
    end
  end)

  it("a costly grammar's job does not hold up another session's plain job", function()
    local s1 <close> = m:session { seed = 6, temperature = 1.0 }
    local s2 <close> = m:session { seed = 7 }
    local costly_job <close> = s1:submit("x", { grammar = "root ::= " .. costly[3], max_tokens = 20 })
    local plain <close> = s2:submit("x", { max_tokens = 20, ignore_eog = true })
    wait_final(costly_job)
    wait_final(plain)
    assert.are.equal("length", plain.finish)
    if costly_job.finish == "error" then
      assert.matches("grammar: one token needs over %d+ matcher steps", costly_job.error)
    else
      assert.is_nil(costly_job.error)
    end
  end)

  it("choices still work next to the new options", function()
    local s <close> = m:session { seed = 4, temperature = 1.0 }
    local text, finish = s:generate("pick:", { choices = { "left", "right" } })
    assert.are.equal("stop", finish)
    assert.is_truthy(text == "left" or text == "right")
  end)
end)
