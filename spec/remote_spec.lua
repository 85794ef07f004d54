-- Remote models against a real OpenAI-compatible server: llama-cpp-python's, serving the default
-- model on 127.0.0.1 (scripts/llama_server.sh: installed by `install`, started and stopped here).
-- Faults a real server does not produce on demand are core/tests/test_remote.c's (a stub).
-- Without the server installed the specs are pending, unless KVGEN_TEST_REMOTE=1 asks for them.
-- No outcome here waits on the clock: a deadline only guards against a hang.
local support = require("kvgen_support")
local kvgen = support.kvgen
local error_of = support.error_of

-- the server and the plain client are Python: a sanitizer run's preloads stay out of them
local plain_env = "env -u LD_PRELOAD -u ASAN_OPTIONS -u UBSAN_OPTIONS "
local script = plain_env .. "bash scripts/llama_server.sh"
local installed = os.execute(script .. " ready >/dev/null 2>&1")
local have_model = support.exists(support.model_path())
local base_port = 18200 + (os.time() % 400) * 2

local function server(cmd, port)
  return os.execute(string.format("%s %s %d >/dev/null 2>&1", script, cmd, port))
end

local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    local named = { ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
    return named[c] or string.format("\\u%04x", c:byte())
  end) .. '"'
end

-- The reference: the same request as a plain HTTP client sends it (no stream).
local function plain_request(url, body)
  local f = support.tmpname(".json")
  local h = assert(io.open(f, "wb"))
  h:write(body)
  h:close()
  local p = assert(io.popen(string.format("%spython3 spec/support/http_post.py %s %s", plain_env, url, f)))
  local out = p:read("a")
  assert(p:close(), "the plain request failed")
  return out
end

-- Spins (kvgen.poll never blocks) until cond() holds.
local function wait_until(cond, seconds)
  local deadline = os.time() + (seconds or 120)
  while not cond() do
    kvgen.poll()
    assert(os.time() < deadline, "timed out")
  end
end

-- Waits until the job is final; its whole text and finish (kvgen.poll hands the pieces out as
-- events meanwhile, so job.text is read, not job:poll).
local function poll_to_end(job)
  wait_until(function()
    local st = job.state
    return st == "done" or st == "failed" or st == "cancelled"
  end)
  return job.text, job.finish
end

local GREEDY = ', "temperature": 0, "top_k": 0, "top_p": 1, "min_p": 0, "repeat_penalty": 1, "seed": 24301'

describe("a remote model #remote #model", function()
  if not (installed and have_model) then
    if os.getenv("KVGEN_TEST_REMOTE") == "1" then
      it("has its server", function()
        error("llama-cpp-python's server is not installed (bash scripts/llama_server.sh install) or the default "
          .. "model is missing (scripts/fetch_model.sh)")
      end)
    else
      pending("llama-cpp-python's server is not installed (bash scripts/llama_server.sh install)")
    end
    return
  end

  local port = base_port
  local url = "http://127.0.0.1:" .. port .. "/v1"
  local m

  setup(function()
    assert(server("start", port), "the server did not start (see $TMPDIR/kvgen-llama-server/" .. port .. ".log)")
    m = kvgen.load(url)
  end)
  teardown(function()
    if m then m:close() end
    collectgarbage()
    server("stop", port)
    support.cleanup()
  end)

  it("describes itself", function()
    local info = m:info()
    assert.are.equal("remote", info.backend)
    assert.are.equal(url, info.device)
    assert.matches("SmolLM2", info.name)
    assert.matches("not among the models the server lists", error_of(kvgen.load, url, { model = "no-such-model" }))
    -- a URL's password is shown as *** in the model's description and in every error
    local with_pw = "http://user:s3cretpw@127.0.0.1:" .. port .. "/v1"
    local shown = "http://user:***@127.0.0.1:" .. port .. "/v1"
    local cm = kvgen.load(with_pw, { api_key = "sk-topsecret-key" })
    assert.are.equal(shown, cm:info().device)
    cm:close()
    local e = error_of(kvgen.load, with_pw, { model = "no-such-model", api_key = "sk-topsecret-key" })
    assert.is_truthy(e:find(shown, 1, true), e)
    assert.is_nil(e:find("s3cretpw", 1, true), e)
    assert.is_nil(e:find("sk-topsecret-key", 1, true), e)
  end)

  it("gives the text a plain request gives, and the local model's up to its first near-tie", function()
    local prompt = "The capital of France is"
    local s = m:session()
    local body = '{"prompt": ' .. json_string(prompt) .. ', "max_tokens": 24' .. GREEDY .. "}"
    -- llama-cpp-python's first evaluation of a whole prompt (a batch) and its later ones (the
    -- prompt's last token alone, the rest from its cache) differ in the last bits, which can flip
    -- a near-tie: one plain request first, so that both compared requests take the second way
    plain_request(url .. "/completions", body)
    local text, finish = s:generate(prompt, { max_tokens = 24 })
    assert.are.equal("length", finish)
    local ref = plain_request(url .. "/completions", body)
    assert.are.equal(ref, text)
    assert.are.equal(#prompt + #text, s.length) -- a text history counts bytes

    -- the local engine on the same file: the same tokens until its top two are within 1 logit
    local lm = kvgen.load(support.model_path(), { backend = "cpu" })
    local ls = lm:session()
    ls:prefill(prompt)
    local ids = {}
    for _ = 1, 24 do
      local top = ls:logits(2)
      if top[1].logit - top[2].logit < 1.0 then break end
      ids[#ids + 1] = top[1].id
      ls:decode(top[1].id)
    end
    local agreed = lm:detokenize(ids)
    assert.is_true(#ids >= 2, "the local model has a near-tie at its first tokens")
    assert.are.equal(agreed, text:sub(1, #agreed))
    ls:close()
    lm:close()
  end)

  it("gives a chat reply a plain chat request gives, and keeps the conversation", function()
    local s = m:session { system = "You are a helpful assistant." }
    local body = '{"messages": [{"role": "system", "content": "You are a helpful assistant."}, '
      .. '{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32' .. GREEDY .. "}"
    plain_request(url .. "/chat/completions", body) -- as above: the prompt into the server's cache
    local reply, finish = s:chat("What is the capital of France?", { max_tokens = 32 })
    assert.is_true(finish == "stop" or finish == "length", finish)
    local ref = plain_request(url .. "/chat/completions", body)
    assert.are.equal(ref, reply)
    -- three messages: each counts its bytes + 1
    assert.are.equal(#"You are a helpful assistant." + #"What is the capital of France?" + #reply + 3, s.length)
    assert.matches("remote", error_of(s.tokens, s))
    assert.matches("server renders chats", error_of(s.set_template, s, "chatml"))
  end)

  it("streams the reply in pieces, stop strings held back", function()
    local s = m:session()
    local whole = m:session():generate("Once upon a time", { max_tokens = 40 })
    local pieces, got = 0, {}
    for piece in s:stream("Once upon a time", { max_tokens = 40 }) do
      pieces = pieces + 1
      got[#got + 1] = piece
    end
    assert.is_true(pieces > 5)
    assert.are.equal(whole, table.concat(got))
    -- a stop string inside the reply: the text ends before it and nothing of it leaks
    local cut = whole:find(" ", 8, true)
    local stop = whole:sub(cut, cut + 2)
    local text, finish = m:session():generate("Once upon a time", { max_tokens = 40, stop = stop })
    assert.are.equal("stop_string", finish)
    assert.are.equal(whole:sub(1, whole:find(stop, 1, true) - 1), text)
  end)

  it("ends a reply at the first sentence past soft_max_tokens", function()
    local whole = m:session():generate("Once upon a time", { max_tokens = 120 })
    local text, finish = m:session():generate("Once upon a time", { max_tokens = 120, soft_max_tokens = 1 })
    assert.are.equal("sentence", finish, text)
    assert.are.equal(text, whole:sub(1, #text)) -- the same greedy reply, cut short
    assert.is_true(#text < #whole)
    assert.matches("[%.!?][\"')]*$", text)
  end)

  it("cancels a stream, keeping what arrived", function()
    local s = m:session()
    local st = s:stream("Once upon a time", { max_tokens = 200 })
    local got = {}
    for piece in st do
      got[#got + 1] = piece
      if #got == 3 then st:cancel() end
    end
    assert.are.equal("cancelled", st.finish)
    assert.are.equal(table.concat(got), st.text)
    assert.are.equal(#"Once upon a time" + #st.text, s.length)
  end)

  it("forks and rewinds a chat", function()
    local s = m:session { system = "Answer in one short sentence." }
    local r1 = s:chat("Name a fruit.", { max_tokens = 24 })
    local len = s.length
    local child = s:fork()
    local c1 = child:chat("Name a color.", { max_tokens = 24 })
    assert.are.equal(len, s.length) -- the parent is untouched
    assert.is_true(child.length > len)
    -- the same turn on the parent gives the child's reply (greedy, same history)
    local p1 = s:chat("Name a color.", { max_tokens = 24 })
    assert.are.equal(c1, p1)
    -- rewinding both messages of that turn, then asking again, gives it again
    assert.are.equal(len, s:rewind(s.length - len))
    assert.are.equal(p1, s:chat("Name a color.", { max_tokens = 24 }))
    assert.matches("rewind whole messages", error_of(s.rewind, s, 1))
    assert.is_string(r1)
  end)

  it("saves and restores a session", function()
    local s = m:session { system = "Answer in one short sentence." }
    s:chat("Name an animal.", { max_tokens = 24 })
    local path = support.tmpname(".kvgs")
    s:save(path)
    local r = m:restore(path)
    assert.are.equal(s.length, r.length)
    assert.are.equal(s:chat("And a bird?", { max_tokens = 24 }), r:chat("And a bird?", { max_tokens = 24 }))
    -- a local session's file is refused by the remote model, and the other way round
    local lm = kvgen.load(support.model_path(), { backend = "cpu" })
    assert.matches("remote model", error_of(lm.restore, lm, path))
    local ls = lm:session()
    ls:prefill("Hello")
    local lpath = support.tmpname(".kvgs")
    ls:save(lpath)
    assert.matches("local session", error_of(m.restore, m, lpath))
    ls:close()
    lm:close()
  end)

  it("passes constraints as grammars", function()
    local s = m:session()
    local text, finish = s:generate("Is the sky blue? Answer:", { choices = { " yes", " no" } })
    assert.are.equal("stop", finish)
    assert.is_true(text == " yes" or text == " no", text)
    local j, jf, value = m:session():generate("A person as JSON:", {
      schema = '{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer"}},'
        .. '"required":["name","age"]}' })
    assert.are.equal("stop", jf, j)
    assert.is_table(value, j)
    assert.is_string(value.name)
  end)

  it("maps the server's errors, leaving the session as it was", function()
    local s = m:session()
    local long = string.rep("hello ", 5000)
    -- llama-cpp-python answers a streamed request over its context with an empty stream; the
    -- failed call leaves the session as it was, however often it is retried
    for _ = 1, 2 do
      assert.matches("without any event", error_of(s.generate, s, long, { max_tokens = 4 }))
      assert.are.equal(0, s.length)
    end
    local c = m:session { system = "Be brief." }
    local len = c.length
    for _ = 1, 2 do
      assert.is_string(error_of(c.chat, c, long, { max_tokens = 4 }))
      assert.are.equal(len, c.length)
      assert.is_string(error_of(function() for _ in c:chat_stream(long, { max_tokens = 4 }) do end end))
      assert.are.equal(len, c.length)
    end
    -- and a plain request with HTTP 400 and its message: context_full (the history holds the
    -- long text: a stream closed before its first step keeps its prompt, as a local one does)
    s:stream(long, { max_tokens = 4 }):close()
    assert.are.equal(#long, s.length)
    local err = error_of(s.choose, s, { " a", " b" })
    assert.matches("HTTP 400", err)
    assert.matches("maximum context length", err)
    -- choice scoring needs echoed log-probabilities aligned as OpenAI's API defines them
    local c = m:session()
    c:generate("The capital of France is", { max_tokens = 1 })
    assert.matches("distribution after", error_of(c.choose, c, { " Paris", " Rome" }))
    assert.matches("token ids", error_of(function() return m:session():generate({ 1, 2, 3 }) end))
    assert.are.equal(#long, s.length) -- choice scoring changes nothing, failed or not
  end)

  it("runs 32 concurrent sessions as jobs", function()
    local ss, jobs = {}, {}
    for i = 1, 32 do
      ss[i] = m:session { system = "You count." }
      jobs[i] = ss[i]:submit_chat("Say a number between 1 and 9.", { max_tokens = 8 })
    end
    local expected = m:session { system = "You count." }:chat("Say a number between 1 and 9.", { max_tokens = 8 })
    for i = 1, 32 do
      local text, finish = poll_to_end(jobs[i])
      assert.are.equal("done", jobs[i].state, jobs[i].error)
      assert.are.equal(expected, text, "session " .. i .. " (" .. finish .. ")")
    end
    for i = 1, 32 do ss[i]:close() end
  end)

  it("keeps the 60 Hz frame loop's frames short while jobs stream (samples/host)", function()
    local host = support.tool("kvgen_host")
    if not support.exists(host) then
      pending("no kvgen_host in this build")
      return
    end
    local p = assert(io.popen(string.format("%s samples/npc_village.lua %s 2>&1", host, url)))
    local out = p:read("a")
    assert(p:close(), out)
    local function p99(what) return tonumber(out:match(what .. "%s+%d+ frames%s+median%s+[%d.]+%s+p99%s+([%d.]+)")) end
    local busy_update = p99("generating: update")
    assert.is_number(busy_update, out)
    -- the frame's own work (update + poll) never waits on the network: a wait would hold a frame
    -- for a whole reply (seconds here); the bound is generous, as the server and other work share
    -- this machine's cores (the figures themselves are the sample's to report, not a test's)
    assert.is_true(busy_update < 100.0, out)
    assert.matches("aggregate: %d+ tokens", out)
  end)
end)

describe("a remote model whose server goes away #remote #model", function()
  if not (installed and have_model) then
    pending("llama-cpp-python's server is not installed")
    return
  end
  local port = base_port + 1
  local url = "http://127.0.0.1:" .. port .. "/v1"

  teardown(function()
    server("stop", port)
    support.cleanup()
  end)

  it("ends the job that was streaming with an error, and the others recover when it returns", function()
    assert(server("start", port))
    local m = kvgen.load(url, { timeout_ms = 20000 })
    local a, b = m:session(), m:session()
    -- a reply that cannot end before the kill: no end-of-generation, far more tokens than the
    -- server makes in the moment between its first piece and the kill
    local job = a:submit("Once upon a time", { max_tokens = 3000, ignore_eog = true })
    wait_until(function() return #job.text > 0 end)
    assert(server("kill", port))
    local _, finish = poll_to_end(job)
    assert.are.equal("failed", job.state)
    assert.are.equal("error", finish)
    assert.matches("connection dropped", job.error)
    -- while it is down: a clear error, not a hang
    local down = b:submit("Hello", { max_tokens = 4 })
    poll_to_end(down)
    assert.are.equal("failed", down.state)
    assert.matches("127.0.0.1:" .. port, down.error)
    assert.are.equal(0, b.length) -- nothing came: the prompt was taken back
    -- it returns: the other sessions go on
    assert(server("start", port))
    local back = b:submit("Hello", { max_tokens = 4 })
    poll_to_end(back)
    assert.are.equal("done", back.state, back.error)
    local again = a:submit(" The end.", { max_tokens = 4 })
    poll_to_end(again)
    assert.are.equal("done", again.state, again.error)
    a:close()
    b:close()
    m:close()
  end)
end)
