-- Session files on disk: model:restore reads regular files only, and no more than their header
-- says; s:save replaces its target whole or not at all, through symbolic links, and refuses
-- what is not a regular file.
local support = require("kvgen_support")
local kvgen = support.kvgen
local error_of = support.error_of

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local function sh(cmd) return os.execute(cmd) == true end

local function read_all(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function write_all(path, bytes)
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
end

-- the names in a folder, sorted, hidden ones too (a leftover temporary file would be hidden)
local function listing(dir)
  local p = assert(io.popen("ls -A " .. q(dir)))
  local names = {}
  for name in p:lines() do names[#names + 1] = name end
  p:close()
  table.sort(names)
  return table.concat(names, " ")
end

-- asserts that `text` is in `err` (plain text, not a pattern)
local function has(err, text)
  assert(err:find(text, 1, true), string.format("%q lacks %q", err, text))
end

local dirs = {}
local function fresh_dir()
  local d = support.tmpname(".d")
  assert(sh("mkdir " .. q(d)))
  dirs[#dirs + 1] = d
  return d
end

local function ids(n, from)
  local t = {}
  for i = 1, n do t[i] = (from + 7 * i) % 200 + 1 end
  return t
end

describe("session files", function()
  local m
  setup(function() m = support.random_model() end)
  teardown(function()
    m:close()
    for _, d in ipairs(dirs) do os.execute("rm -rf " .. q(d)) end
    support.cleanup()
  end)

  local function saved(n, path)
    local s <close> = m:session()
    if n > 0 then s:prefill(ids(n, n)) end
    s:save(path)
    return s:tokens()
  end

  describe("model:restore", function()
    for _, dev in ipairs { "/dev/zero", "/dev/urandom" } do
      it("refuses " .. dev .. " at once, without reading it", function()
        -- (the message shows the file was refused from its type, before any read; a read of
        -- /dev/zero would never end)
        local err = error_of(m.restore, m, dev)
        has(err, "kvgen: kvgen_session_restore: " .. dev .. " is not a regular file (a character device)")
        assert.are.equal("io", (kvgen.last_error()))
      end)
    end

    it("refuses a FIFO without waiting for a writer, and a folder", function()
      local d = fresh_dir()
      local fifo = d .. "/pipe.kvs"
      if sh("mkfifo " .. q(fifo)) then
        has(error_of(m.restore, m, fifo), fifo .. " is not a regular file (a FIFO)")
      end
      has(error_of(m.restore, m, d), d .. " is not a regular file (a directory)")
    end)

    it("refuses a header claiming more than the file holds, before allocating it", function()
      local p = support.tmpname(".kvs")
      saved(10, p)
      local bytes = read_all(p)
      for _, claim in ipairs { 1 << 40, 1 << 62, -1 } do
        write_all(p, bytes:sub(1, 96) .. string.pack("<i8", claim) .. bytes:sub(105))
        local err = error_of(m.restore, m, p)
        has(err, "kvgen_session_restore: " .. p .. ": truncated")
        assert.are.equal("format", (kvgen.last_error())) -- not no_memory
      end
    end)

    it("reads no more of a file than its header says", function()
      local p = support.tmpname(".kvs")
      saved(10, p)
      local f = assert(io.open(p, "r+b"))
      f:seek("set", (1 << 30) - 1) -- 1 GiB, sparse
      f:write("\0")
      f:close()
      -- refused from the sizes alone (test_session_file counts the bytes read)
      has(error_of(m.restore, m, p), "bytes where the header says")
      os.remove(p)
    end)
  end)

  describe("s:save", function()
    it("through a symbolic link updates the file it points to and keeps the link", function()
      local d = fresh_dir()
      saved(3, d .. "/real.kvs")
      assert(sh("ln -s real.kvs " .. q(d .. "/link.kvs")))
      local want = saved(9, d .. "/link.kvs")
      assert.is_true(sh("test -L " .. q(d .. "/link.kvs")))
      local r <close> = m:restore(d .. "/real.kvs")
      assert.are.same(want, r:tokens())
      assert.are.equal("link.kvs real.kvs", listing(d))
    end)

    it("refuses /dev/null and leaves it a device", function()
      local s <close> = m:session()
      s:prefill(ids(4, 1))
      has(error_of(s.save, s, "/dev/null"), "kvgen: kvgen_session_save: /dev/null is not a regular file")
      assert.are.equal("io", (kvgen.last_error()))
      assert.is_true(sh("test -c /dev/null"))
    end)

    it("refuses a folder and leaves it as it was", function()
      local d = fresh_dir()
      write_all(d .. "/kept.txt", "kept")
      local s <close> = m:session()
      has(error_of(s.save, s, d), d .. " is not a regular file (a directory)")
      assert.is_true(sh("test -d " .. q(d)))
      assert.are.equal("kept", read_all(d .. "/kept.txt"))
      assert.are.equal("kept.txt", listing(d))
    end)

    it("that fails half-way leaves the previous save byte-identical, and no temporary file", function()
      local d = fresh_dir()
      local path = d .. "/game.kvs"
      local old = saved(2, path)
      local before = read_all(path)
      -- a second process saves a much larger session under a file-size limit between the two
      -- sizes (ulimit -f counts 512- or 1024-byte blocks, depending on the shell: both fit)
      local script = support.tmpname(".lua")
      write_all(script, support.cpath_line() .. string.format([[
local kvgen = require("kvgen")
local m = kvgen.load(%q, { backend = "reference" })
local s = m:session()
local t = {}
for i = 1, 300 do t[i] = (i * 7) %% 200 + 1 end
s:prefill(t)
local ok, err = pcall(s.save, s, %q)
io.stderr:write(tostring(err), "\n")
os.exit(ok and 0 or 3)
]], support.random_model_path(), path))
      local out = support.tmpname(".out")
      local ok, how, code = os.execute(string.format("sh -c %s > %s 2>&1",
        q("trap '' XFSZ; ulimit -f 48; exec lua5.4 " .. q(script)), q(out)))
      os.remove(script)
      local said = read_all(out) or ""
      assert.are.equal("exit", how)
      assert.are.equal(3, code, said)
      assert.is_nil(ok)
      has(said, "kvgen_session_save: " .. path .. ": write failed: File too large")
      assert.are.equal(before, read_all(path))
      assert.are.equal("game.kvs", listing(d))
      local r <close> = m:restore(path)
      assert.are.same(old, r:tokens())
    end)
  end)
end)
