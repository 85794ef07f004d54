-- kvgen.Memory: the memory store (texts, fields and embedding vectors searched by cosine).
local support = require("kvgen_support")
local kvgen = support.kvgen
local error_of = support.error_of

local function rand_vec(dim, seed)
  local v, x = {}, seed
  for i = 1, dim do
    x = (x * 1103515245 + 12345) % 2147483648
    v[i] = x / 1073741824 - 1
  end
  return v
end

local function cosine(a, b)
  local ab, aa, bb = 0, 0, 0
  for i = 1, #a do
    ab, aa, bb = ab + a[i] * b[i], aa + a[i] * a[i], bb + b[i] * b[i]
  end
  return ab / math.sqrt(aa * bb)
end

describe("kvgen.Memory", function()
  teardown(support.cleanup)

  for _, storage in ipairs({ "f32", "f16" }) do
    it("finds the nearest memories by cosine, best first (" .. storage .. ")", function()
      local dim = 13
      local m <close> = kvgen.memory { dim = dim, storage = storage }
      local vecs = {}
      for i = 1, 60 do
        vecs[i] = rand_vec(dim, i * 7919)
        local id = m:add("memory " .. i, vecs[i], { town = (i % 2 == 0) and "mill" or "inn", n = i })
        assert.are.equal(i, id)
      end
      assert.are.equal(60, #m)
      assert.are.equal(60, m:count())
      local q = rand_vec(dim, 4242)
      local hits = m:search(q, { k = 5 })
      assert.are.equal(5, #hits)
      -- the reference: every memory's cosine, sorted
      local ref = {}
      for i = 1, 60 do ref[i] = { id = i, s = cosine(q, vecs[i]) } end
      table.sort(ref, function(a, b) return a.s > b.s end)
      local tol = storage == "f16" and 2e-3 or 1e-5
      for r = 1, 5 do
        assert.is_true(math.abs(hits[r].score - ref[r].s) < tol)
        assert.are.equal("memory " .. hits[r].id, hits[r].text)
        assert.are.equal(tostring(hits[r].id), hits[r].fields.n) -- numbers are kept as text
        if r > 1 then assert.is_true(hits[r].score <= hits[r - 1].score) end
      end
      assert.are.equal(ref[1].id, hits[1].id)
      -- a filter: only the matching memories
      local inn = m:search(q, { k = 100, where = { town = "inn" } })
      assert.are.equal(30, #inn)
      for _, h in ipairs(inn) do assert.are.equal(1, h.id % 2) end
      assert.are.same({}, m:search(q, { where = { town = "nowhere" } }))
      assert.are.equal(1, #m:search(q, { where = { n = 7 } }))
      -- the default k is 5
      assert.are.equal(5, #m:search(q))
    end)
  end

  it("removes, gets, and keeps ids unique", function()
    local m <close> = kvgen.memory { dim = 3 }
    local a = m:add("the player stole bread", { 1, 0, 0 }, { mood = "angry" })
    local b = m:add("the player paid", { 0, 1, 0 })
    local e = m:get(a)
    assert.are.equal("the player stole bread", e.text)
    assert.are.same({ mood = "angry" }, e.fields)
    assert.are.equal(a, e.id)
    assert.are.equal(3, #e.vector)
    assert.is_true(math.abs(e.vector[1] - 1) < 1e-6)
    assert.are.same({}, m:get(b).fields)
    assert.is_true(m:remove(a))
    assert.is_false(m:remove(a))
    assert.is_nil(m:get(a))
    assert.are.equal(1, #m)
    local c = m:add("later", { 0, 0, 2 })
    assert.are.equal(3, c)
    local hits = m:search({ 1, 0, 0 }, { k = 10 })
    assert.are.equal(2, #hits)
    -- ties: the lower id first
    local t <close> = kvgen.memory { dim = 2 }
    t:add("x", { 1, 1 })
    t:add("y", { 2, 2 })
    local th = t:search({ 1, 1 })
    assert.are.equal(1, th[1].id)
    assert.are.equal(2, th[2].id)
  end)

  it("saves and loads atomically, refusing other dims and embedding models", function()
    local path = support.tmpname(".kvm")
    local m <close> = kvgen.memory { dim = 4, storage = "f16", embedding_id = 1234 }
    m:add("one", { 1, 2, 3, 4 }, { npc = "mira" })
    m:add("two", { 4, 3, 2, 1 })
    m:save(path)
    local l <close> = kvgen.memory_load(path)
    assert.are.equal(2, #l)
    local info = l:info()
    assert.are.equal(4, info.dim)
    assert.are.equal("f16", info.storage)
    assert.are.equal(1234, info.embedding_id)
    assert.are.equal(3, info.next_id)
    assert.are.equal("mira", l:get(1).fields.npc)
    local q = { 1, 1, 3, 4 }
    local h1, h2 = m:search(q), l:search(q)
    assert.are.equal(h1[1].id, h2[1].id)
    assert.are.equal(h1[1].score, h2[1].score)
    kvgen.memory_load(path, { dim = 4, embedding_id = 1234 }):close()
    assert.matches("vectors of dim 4, expected 8", error_of(kvgen.memory_load, path, { dim = 8 }))
    assert.are.equal("invalid_argument", kvgen.last_error())
    assert.matches("another embedding model", error_of(kvgen.memory_load, path, { embedding_id = 99 }))
    -- a save that fails leaves the old file
    local f = assert(io.open(path, "rb"))
    local before = f:read("a")
    f:close()
    m:add("three", { 0, 0, 0, 1 })
    assert.matches("kvgen_memory_save", error_of(m.save, m, path .. ".missing/x.kvm"))
    assert.are.equal("io", kvgen.last_error())
    f = assert(io.open(path, "rb"))
    assert.are.equal(before, f:read("a"))
    f:close()
    -- a truncated or corrupted file is refused by name
    local bad = support.tmpname(".kvm")
    f = assert(io.open(bad, "wb"))
    f:write(before:sub(1, #before - 3))
    f:close()
    assert.matches("truncated", error_of(kvgen.memory_load, bad))
    assert.are.equal("format", kvgen.last_error())
    f = assert(io.open(bad, "wb"))
    f:write(before:sub(1, 70) .. string.char((before:byte(71) + 1) % 256) .. before:sub(72))
    f:close()
    assert.matches("corrupted", error_of(kvgen.memory_load, bad))
    f = assert(io.open(bad, "wb"))
    f:write("not a memory file at all, just some text long enough to look like one........")
    f:close()
    assert.matches("not a kvgen memory file", error_of(kvgen.memory_load, bad))
  end)

  it("refuses bad arguments naming the function, the argument and the value", function()
    local m <close> = kvgen.memory { dim = 3 }
    assert.matches("bad argument #1 to '.*memory' %(option 'dim': 0 is out of range", error_of(kvgen.memory, { dim = 0 }))
    assert.matches("option 'dim': required", error_of(kvgen.memory, {}))
    assert.matches("option 'storage': 'f8' is not one of", error_of(kvgen.memory, { dim = 3, storage = "f8" }))
    assert.matches("unknown option 'dims'", error_of(kvgen.memory, { dims = 3 }))
    assert.matches("bad argument #1 to '.*memory' %(options: table expected, got number", error_of(kvgen.memory, 3))
    assert.matches("bad argument #3 to '.*add' %(vector: the zero vector has no direction%)",
      error_of(m.add, m, "x", { 0, 0, 0 }))
    assert.matches("vector: 2 numbers, the store's dim is 3", error_of(m.add, m, "x", { 1, 2 }))
    assert.matches("vector%[2%]: number expected, got string", error_of(m.add, m, "x", { 1, "a", 3 }))
    assert.matches("vector%[3%]: nan is not allowed", error_of(m.add, m, "x", { 1, 2, 0 / 0 }))
    assert.matches("vector%[1%]: inf is not allowed", error_of(m.add, m, "x", { math.huge, 2, 3 }))
    assert.matches("vector: a list", error_of(m.add, m, "x", { 1, 2, 3, x = 1 }))
    assert.matches("bad argument #2 to '.*add' %(text: string expected, got number",
      error_of(m.add, m, 5, { 1, 2, 3 }))
    assert.matches("text: contains a NUL byte", error_of(m.add, m, "a\0b", { 1, 2, 3 }))
    assert.matches("bad argument #4 to '.*add' %(fields: table expected, got string",
      error_of(m.add, m, "x", { 1, 2, 3 }, "mill"))
    assert.matches("fields.town: string expected, got boolean", error_of(m.add, m, "x", { 1, 2, 3 }, { town = true }))
    assert.matches("fields: non%-empty string keys expected", error_of(m.add, m, "x", { 1, 2, 3 }, { "mill" }))
    assert.are.equal(0, #m)
    assert.matches("bad argument #2 to '.*remove' %(id: integer expected, got number 1.5",
      error_of(m.remove, m, 1.5))
    assert.matches("id: 0 is not an id", error_of(m.get, m, 0))
    assert.matches("option 'k': 0 is out of range", error_of(m.search, m, { 1, 2, 3 }, { k = 0 }))
    assert.matches("option 'where': exactly one key = value expected, got 2",
      error_of(m.search, m, { 1, 2, 3 }, { where = { a = "1", b = "2" } }))
    assert.matches("option 'where': table {key = value} expected, got string",
      error_of(m.search, m, { 1, 2, 3 }, { where = "town" }))
    assert.matches("unknown option 'limit'", error_of(m.search, m, { 1, 2, 3 }, { limit = 3 }))
    assert.matches("bad argument #1 to '.*memory_load' %(path: string expected", error_of(kvgen.memory_load, nil))
    assert.matches("cannot open", error_of(kvgen.memory_load, "/nonexistent/x.kvm"))
  end)

  it("closes like the other handles", function()
    local m = kvgen.memory { dim = 2 }
    assert.are.equal("memory", kvgen.type(m))
    assert.matches("^kvgen.Memory %(0 memories of dim 2%)", tostring(m))
    m:close()
    m:close()
    assert.are.equal("closed memory", kvgen.type(m))
    assert.are.equal("kvgen.Memory (closed)", tostring(m))
    assert.matches("attempt to use a closed kvgen.Memory", error_of(m.add, m, "x", { 1, 2 }))
    assert.matches("attempt to use a closed kvgen.Memory", error_of(function() return #m end))
    do
      local s <close> = kvgen.memory { dim = 2 }
      s:add("x", { 1, 0 })
    end
    collectgarbage()
  end)
end)
