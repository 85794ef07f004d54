-- The jobs API through Lua: non-blocking generation on the model's worker thread, kvgen.poll,
-- job:poll, callbacks, the coroutine patterns, lifetimes. Random models, reference backend.
local support = require("kvgen_support")
local kvgen = support.kvgen
local error_of = support.error_of

-- Events drain() saw for other jobs, kept for their own drain().
local stashed = setmetatable({}, { __mode = "k" })

-- Waits (spinning on kvgen.poll, which never blocks) until `job` reported its final event;
-- returns the concatenated text of its events and its last event.
local function drain(job)
  local deadline = os.time() + 120
  local evs = stashed[job] or {}
  stashed[job] = nil
  local i = 1
  while true do
    while evs[i] do
      if evs[i].finished then
        local text = {}
        for k = 1, i do text[k] = evs[k].text end
        return table.concat(text), evs[i]
      end
      i = i + 1
    end
    for _, ev in ipairs(kvgen.poll()) do
      if ev.job == job then
        evs[#evs + 1] = ev
      else
        stashed[ev.job] = stashed[ev.job] or {}
        table.insert(stashed[ev.job], ev)
      end
    end
    assert(os.time() < deadline, "the job did not finish")
  end
end

local function wait_until(cond)
  local deadline = os.time() + 120
  while not cond() do assert(os.time() < deadline, "timed out") end
end

describe("jobs (random model)", function()
  local m
  setup(function() m = support.random_model { threads = 1 } end)
  teardown(function() support.release(m) end)

  -- A job that never ends by itself, however slowly the host runs beside the worker: the
  -- context shifts, and max_tokens is explicit (-1 would stop after one context of tokens,
  -- which a busy machine's worker can reach before the host looks). The spec cancels it.
  local ENDLESS = math.tointeger(2 ^ 31 - 1)
  local function endless_opts(extra)
    local o = { max_tokens = ENDLESS, ignore_eog = true }
    for k, v in pairs(extra or {}) do o[k] = v end
    return o
  end
  local function endless(s_opts)
    local o = { context = 64, on_full = "shift" }
    for k, v in pairs(s_opts or {}) do o[k] = v end
    local s = m:session(o)
    return s, s:submit("x", endless_opts())
  end

  describe("submit", function()
    it("returns a kvgen.Job at once", function()
      local s <close> = m:session()
      local job <close> = s:submit("hello", { max_tokens = 4 })
      assert.are.equal("job", kvgen.type(job))
      assert.are.equal("kvgen.Job", getmetatable(job).__name)
      assert.matches("^kvgen%.Job %((%a+)%) %(0x", tostring(job))
      assert.are.equal(s, job.session)
      assert.are.equal(0, job.priority)
      drain(job)
      assert.are.equal("done", job.state)
    end)

    it("greedy: the same text as s:generate (text, ids and nil prompts)", function()
      local a <close> = m:session()
      local want = a:generate("the same prompt", { max_tokens = 12, ignore_eog = true })
      local b <close> = m:session()
      local job <close> = b:submit("the same prompt", { max_tokens = 12, ignore_eog = true })
      local got, ev = drain(job)
      assert.are.equal(want, got)
      assert.are.equal(want, job.text)
      assert.are.equal("length", ev.finish)
      assert.are.same(a:tokens(), b:tokens())

      local c <close> = m:session()
      local ids = m:tokenize("the same prompt")
      local j2 <close> = c:submit(ids, { max_tokens = 12, ignore_eog = true })
      assert.are.equal(want, (drain(j2)))

      local d <close> = m:session()
      d:prefill("the same prompt")
      local j3 <close> = d:submit(nil, { max_tokens = 12, ignore_eog = true })
      assert.are.equal(want, (drain(j3)))
    end)

    it("sampled: the same seed gives the same text as s:generate", function()
      local opts = { seed = 77, temperature = 0.9, top_k = 40 }
      local a <close> = m:session(opts)
      local want = a:generate("seeded", { max_tokens = 16, ignore_eog = true })
      local b <close> = m:session(opts)
      local job <close> = b:submit("seeded", { max_tokens = 16, ignore_eog = true })
      assert.are.equal(want, (support.poll_to_end(job)))
    end)

    it("honours generation options: stop strings, choices", function()
      local a <close> = m:session()
      local full = a:generate("stops", { max_tokens = 20, ignore_eog = true })
      local stop = full:sub(5, 6)
      local b <close> = m:session()
      local want, wfinish = b:generate("stops", { max_tokens = 20, ignore_eog = true, stop = stop })
      local c <close> = m:session()
      local job <close> = c:submit("stops", { max_tokens = 20, ignore_eog = true, stop = { stop } })
      local got, ev = drain(job)
      assert.are.equal(want, got)
      assert.are.equal(wfinish, ev.finish)

      local d <close> = m:session()
      local j2 <close> = d:submit("pick", { choices = { "alpha", "beta" } })
      local text = drain(j2)
      assert.is_truthy(text == "alpha" or text == "beta")
    end)

    it("submit_chat: a chat turn then the reply, as s:chat", function()
      local a <close> = m:session { template = "chatml", system = "sys" }
      local want = a:chat("hi there", { max_tokens = 8, ignore_eog = true })
      local b <close> = m:session { template = "chatml", system = "sys" }
      local job <close> = b:submit_chat("hi there", { max_tokens = 8, ignore_eog = true })
      assert.are.equal(want, (drain(job)))
      assert.are.same(a:tokens(), b:tokens())

      local c <close> = m:session { template = "chatml" }
      local j2 <close> = c:submit_chat("as the system", { role = "system", max_tokens = 2, ignore_eog = true })
      drain(j2)
      assert.matches("^<|im_start|>system\nas the system<|im_end|>\n<|im_start|>assistant\n",
        m:detokenize(c:tokens(), { special = true }))

      local d <close> = m:session { template = "chatml" }
      d:add("user", "q")
      local j3 <close> = d:submit_chat(nil, { max_tokens = 2, ignore_eog = true })
      drain(j3)
      assert.matches("^<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n",
        m:detokenize(d:tokens(), { special = true }))
    end)

    it("jobs of one session run in submission order", function()
      local a <close> = m:session()
      local w1 = a:generate("one", { max_tokens = 5, ignore_eog = true })
      local w2 = a:generate(" two", { max_tokens = 5, ignore_eog = true })
      local b <close> = m:session()
      local j1 <close> = b:submit("one", { max_tokens = 5, ignore_eog = true })
      local j2 <close> = b:submit(" two", { max_tokens = 5, ignore_eog = true })
      local texts = {}
      wait_until(function()
        for _, ev in ipairs(kvgen.poll()) do
          texts[ev.job] = (texts[ev.job] or "") .. ev.text
        end
        return j2.state == "done" and j1.state == "done" and texts[j2] ~= nil
      end)
      kvgen.poll()
      assert.are.equal(w1, j1.text)
      assert.are.equal(w2, j2.text)
    end)

    it("rejects bad arguments before anything is queued", function()
      local s <close> = m:session()
      assert.matches("bad argument #%d to '%S+' %(prompt: string, table of token ids or nil expected, got boolean%)",
        error_of(s.submit, s, true))
      assert.matches("unknown option 'max_token'", error_of(s.submit, s, "x", { max_token = 3 }))
      assert.matches("option 'priority': integer expected, got string", error_of(s.submit, s, "x", { priority = "1" }))
      assert.matches("option 'priority': integer expected, got number", error_of(s.submit, s, "x", { priority = 1.5 }))
      assert.matches("option 'on_piece': function expected, got number", error_of(s.submit, s, "x", { on_piece = 1 }))
      assert.matches("option 'on_done': function expected, got string", error_of(s.submit, s, "x", { on_done = "f" }))
      assert.matches("stop strings must not be empty", error_of(s.submit, s, "x", { stop = "" }))
      assert.matches("prompt%[2%]: %-1 is outside the vocabulary", error_of(s.submit, s, { 1, -1 }))
      assert.matches("options: table expected, got string", error_of(s.submit, s, "x", "y"))
      assert.matches("message: string or nil expected, got number", error_of(s.submit_chat, s, 5))
      assert.matches("option 'role': 'robot' is not one of", error_of(s.submit_chat, s, "x", { role = "robot" }))
      assert.matches("unknown option 'on_piece'", error_of(s.stream_async, s, "x", { on_piece = print }))
      assert.matches("unknown option 'role'", error_of(s.submit, s, "x", { role = "user" }))
      s:set_template("chatml")
      assert.matches("message: contains a NUL byte", error_of(s.submit_chat, s, "a\0b"))
      assert.are.equal(0, s.length)
      assert.are.same({}, kvgen.poll())
    end)

    it("refuses a closed session and a session with a stream running", function()
      local s = m:session()
      local st = s:stream("x", { max_tokens = 4 })
      for _, name in ipairs { "submit", "submit_chat", "stream_async" } do
        assert.matches("busy: a kvgen.Stream is generating", error_of(s[name], s, "y"))
      end
      st:close()
      s:close()
      for _, name in ipairs { "submit", "submit_chat", "chat_stream_async" } do
        assert.matches("attempt to use a closed kvgen.Session", error_of(s[name], s, "y"))
      end
    end)

    it("a failed job reports its error; the session is as it was", function()
      local s <close> = m:session { context = 8 }
      s:prefill { 1, 2 }
      local job <close> = s:submit("a prompt that is much longer than eight tokens of context", { max_tokens = 2 })
      local _, ev = drain(job)
      assert.are.equal("failed", ev.state)
      assert.are.equal("error", ev.finish)
      assert.matches("^kvgen: context full", job.error)
      assert.matches("^kvgen: context full", job:info().error)
      assert.are.equal(2, s.length)
      local it = s:submit("another prompt much longer than the eight tokens of context", { max_tokens = 2 })
      assert.matches("^kvgen: context full", error_of(function() for _ in it do end end))
      it:close()
      local ok <close> = s:submit("", { max_tokens = 1 })
      assert.is_nil(ok.error)
      drain(ok)
    end)
  end)

  describe("polling", function()
    it("kvgen.poll returns an empty list when there is nothing", function()
      assert.are.same({}, kvgen.poll())
      assert.are.same({}, kvgen.poll(m))
    end)

    it("events carry job, text, state, finished, finish; finished exactly once", function()
      local s <close> = m:session()
      local job <close> = s:submit("events", { max_tokens = 6, ignore_eog = true })
      local n_final, seen = 0, {}
      wait_until(function()
        for _, ev in ipairs(kvgen.poll(m)) do
          assert.are.equal(job, ev.job)
          assert.is_string(ev.text)
          assert.is_boolean(ev.finished)
          assert.is_string(ev.state)
          assert.is_string(ev.finish)
          seen[#seen + 1] = ev.text
          if ev.finished then
            n_final = n_final + 1
            assert.are.equal("done", ev.state)
            assert.are.equal("length", ev.finish)
          end
        end
        return n_final > 0
      end)
      for _ = 1, 3 do assert.are.same({}, kvgen.poll()) end
      assert.are.equal(1, n_final)
      assert.are.equal(job.text, table.concat(seen))
    end)

    it("a queued job gives no events and poll returns at once", function()
      local s <close>, long = endless()
      local queued <close> = s:submit("later", { max_tokens = 3 })
      for _ = 1, 200 do
        for _, ev in ipairs(kvgen.poll()) do
          assert.are.equal(long, ev.job) -- never the queued one
        end
      end
      assert.are.equal("queued", queued.state)
      assert.are.same({ "", false }, { queued:poll() })
      assert.are.equal("", queued())
      assert.is_nil(queued:info().queue_ms)
      long:cancel()
      drain(long)
      local text = drain(queued)
      assert.are.equal(queued.text, text)
      long:close()
    end)

    it("kvgen.poll(model) returns only that model's jobs", function()
      local m2 <close> = support.random_model { threads = 1 }
      local a <close> = m:session()
      local b <close> = m2:session()
      local ja <close> = a:submit("a", { max_tokens = 4, ignore_eog = true })
      local jb <close> = b:submit("b", { max_tokens = 4, ignore_eog = true })
      wait_until(function() return ja.state == "done" and jb.state == "done" end)
      local evs = kvgen.poll(m2)
      assert.are.equal(1, #evs)
      assert.are.equal(jb, evs[1].job)
      evs = kvgen.poll()
      assert.are.equal(1, #evs)
      assert.are.equal(ja, evs[1].job)
    end)

    it("kvgen.poll checks its argument", function()
      assert.matches("kvgen.Model expected, got string", error_of(kvgen.poll, "m"))
      local m2 = support.random_model()
      m2:close()
      assert.matches("attempt to use a closed kvgen.Model", error_of(kvgen.poll, m2))
    end)

    it("job:poll returns new text, done and finish; it never waits", function()
      local s <close> = m:session()
      local a <close> = m:session()
      local want = a:generate("poll me", { max_tokens = 7, ignore_eog = true })
      local job <close> = s:submit("poll me", { max_tokens = 7, ignore_eog = true })
      local text, finish = support.poll_to_end(job)
      assert.are.equal(want, text)
      assert.are.equal("length", finish)
      assert.are.same({ "", true, "length" }, { job:poll() })
      assert.are.same({}, kvgen.poll()) -- job:poll took the events
      assert.are.equal(want, job.text)
    end)

    it("job:info gives progress and timing", function()
      local s <close> = m:session()
      local prompt = "info about this prompt"
      local job <close> = s:submit(prompt, { max_tokens = 6, ignore_eog = true, priority = 3 })
      drain(job)
      local info = job:info()
      assert.are.equal("done", info.state)
      assert.are.equal("length", info.finish)
      assert.is_nil(info.error)
      assert.are.equal(3, info.priority)
      assert.are.equal(#m:tokenize(prompt), info.prompt_tokens)
      assert.are.equal(info.prompt_tokens, info.prompt_done)
      assert.are.equal(6, info.n_tokens)
      assert.is_true(info.queue_ms >= 0)
      assert.is_true(info.first_token_ms >= info.queue_ms)
      assert.is_true(info.total_ms >= info.first_token_ms)
      assert.is_true(info.tokens_per_s >= 0)
    end)
  end)

  describe("two jobs at once", function()
    it("sessions generate side by side and match sequential generation", function()
      local wants, jobs, sessions = {}, {}, {}
      for i = 1, 4 do
        local r <close> = m:session { seed = i, temperature = 0.8 }
        wants[i] = r:generate("npc " .. i, { max_tokens = 10, ignore_eog = true })
      end
      for i = 1, 4 do
        sessions[i] = m:session { seed = i, temperature = 0.8 }
        jobs[i] = sessions[i]:submit("npc " .. i, { max_tokens = 10, ignore_eog = true, priority = i == 2 and 5 or 0 })
      end
      local texts, left = {}, 4
      wait_until(function()
        for _, ev in ipairs(kvgen.poll()) do
          for i = 1, 4 do
            if ev.job == jobs[i] then
              texts[i] = (texts[i] or "") .. ev.text
              if ev.finished then left = left - 1 end
            end
          end
        end
        return left == 0
      end)
      for i = 1, 4 do
        assert.are.equal(wants[i], texts[i])
        jobs[i]:close()
        sessions[i]:close()
      end
    end)
  end)

  describe("cancel and priority", function()
    it("cancel ends a running job with 'cancelled'", function()
      local s <close>, job = endless()
      wait_until(function() return job.state == "generating" end)
      job:cancel()
      local _, ev = drain(job)
      assert.are.equal("cancelled", ev.state)
      assert.are.equal("cancelled", job.finish)
      assert.is_true(job:info().n_tokens > 0)
      job:cancel() -- final: left alone
      assert.are.equal("cancelled", job.state)
      job:close()
      assert.is_true(s.length > 0) -- generated tokens stay
    end)

    it("a queued job cancels at once and leaves the session as it was", function()
      local s <close>, long = endless { template = "chatml" }
      wait_until(function() return long.state == "generating" end)
      local q = s:submit_chat("never said", { max_tokens = 3 }) -- queued behind the endless job
      q:cancel()
      assert.are.equal("cancelled", q.state)
      local text, finish = support.poll_to_end(q)
      assert.are.equal("", text)
      assert.are.equal("cancelled", finish)
      q:close()
      long:close() -- cancels; the session drains
      wait_until(function() return not tostring(s):find("busy") end)
      assert.is_true(s.length > 0)
      assert.is_nil(m:detokenize(s:tokens(), { special = true }):find("never said", 1, true))
    end)

    it("on_piece returning false cancels", function()
      local s <close>, job = endless()
      job:close()
      wait_until(function() return not tostring(s):find("busy") end)
      local pieces = 0
      local j2 <close> = s:submit("go", endless_opts { on_piece = function()
        pieces = pieces + 1
        return false
      end })
      local _, ev = drain(j2)
      assert.are.equal("cancelled", ev.finish)
      assert.is_true(pieces >= 1)
    end)

    it("set_priority changes the priority and checks its argument", function()
      local s <close>, job = endless()
      job:set_priority(7)
      assert.are.equal(7, job.priority)
      assert.are.equal(7, job:info().priority)
      job:set_priority(-2)
      assert.are.equal(-2, job.priority)
      assert.matches("priority: integer expected, got string", error_of(job.set_priority, job, "1"))
      assert.matches("priority: integer expected, got no value", error_of(job.set_priority, job))
      assert.matches("priority: %d+ is out of range", error_of(job.set_priority, job, math.maxinteger))
      job:cancel()
      drain(job)
      job:close()
    end)
  end)

  describe("handles", function()
    it("close is safe twice, works with <close>, and closed use raises", function()
      local s <close> = m:session()
      local job = s:submit("x", { max_tokens = 2 })
      job:close()
      job:close()
      assert.are.equal("closed job", kvgen.type(job))
      assert.are.equal("kvgen.Job (closed)", tostring(job))
      for _, f in ipairs { "poll", "info", "cancel", "set_priority" } do
        assert.matches("attempt to use a closed kvgen.Job", error_of(job[f], job, 1))
      end
      for _, k in ipairs { "state", "finish", "text", "session", "priority", "error" } do
        assert.matches("attempt to use a closed kvgen.Job", error_of(function() return job[k] end))
      end
      assert.matches("attempt to use a closed kvgen.Job", error_of(job))
      assert.are.equal(getmetatable(job).__gc, getmetatable(job).__close)
      assert.are.equal(getmetatable(job).__gc, job.close)
      local kept
      do
        local j2 <close> = s:submit("y", { max_tokens = 2 })
        kept = j2
      end
      assert.are.equal("closed job", kvgen.type(kept))
      assert.matches("kvgen.Job expected", error_of(job.poll, s))
      local open <close> = s:submit("z", { max_tokens = 1 })
      assert.is_nil(open.no_such_field)
    end)

    it("the session is busy while a job is not final", function()
      local s <close>, job = endless()
      local busy = "kvgen.Session is busy: a kvgen.Job is running on it"
      assert.matches(busy, error_of(s.generate, s, "x"))
      assert.matches(busy, error_of(s.prefill, s, "x"))
      assert.matches(busy, error_of(s.stream, s, "x"))
      assert.matches(busy, error_of(s.tokens, s))
      assert.matches(busy, error_of(function() return s.length end))
      assert.matches("busy: jobs running", tostring(s))
      assert.are.equal(m, s.model)
      local queued <close> = s:submit("more", { max_tokens = 1 }) -- queuing is allowed
      job:cancel()
      drain(job)
      drain(queued)
      assert.is_number(s.length)
      job:close()
    end)

    it("every call that uses a busy session raises the same message; submits queue", function()
      local s <close>, job = endless { template = "chatml" }
      local busy = "kvgen.Session is busy: a kvgen.Job is running on it"
      local p = support.tmpname(".kvs")
      for name, call in pairs {
        decode = function() return s:decode(1) end,
        sample = function() return s:sample() end,
        logits = function() return s:logits() end,
        rewind = function() return s:rewind(1) end,
        reset = function() return s:reset() end,
        fork = function() return s:fork() end,
        choose = function() return s:choose { "a", "b" } end,
        save = function() return s:save(p) end,
        cache_info = function() return s:cache_info() end,
        read_cache = function() return s:read_cache(0, "k") end,
        sampler = function() return s:sampler() end,
        set_sampler = function() return s:set_sampler { temperature = 0.5 } end,
        set_template = function() return s:set_template("chatml") end,
        add = function() return s:add("user", "hi") end,
        chat = function() return s:chat("hi") end,
        chat_stream = function() return s:chat_stream("hi") end,
        template = function() return s.template end,
        context = function() return s.context end,
      } do
        assert.matches(busy, error_of(call), 1, true, name)
      end
      assert.is_false(support.exists(p))
      local queued <close> = s:submit_chat("later", { max_tokens = 1 })
      local async = s:stream_async("later", { max_tokens = 1 })
      assert.are.equal("queued", queued.state)
      -- closed while running: released at once, the session busy until the worker lets go of it
      job:close()
      async:close()
      drain(queued)
      wait_until(function() return not tostring(s):find("busy") end)
      assert.is_table(s:cache_info())
      s:prefill("free again")
    end)

    it("a job keeps its session and model alive", function()
      local job
      do
        local m2 = support.random_model { threads = 1 }
        local s = m2:session()
        job = s:submit("alive", { max_tokens = 5, ignore_eog = true })
        m2:close()
      end
      collectgarbage()
      collectgarbage()
      local text = drain(job)
      assert.are.equal(job.text, text)
      assert.are.equal("session", kvgen.type(job.session))
      assert.are.equal("closed model", kvgen.type(job.session.model))
      job:close()
    end)
  end)

  describe("shutdown with work in flight", function()
    it("closing the session cancels its jobs", function()
      local s, job = endless()
      local queued = s:submit("q", { max_tokens = 2 })
      wait_until(function() return job.state == "generating" end)
      s:close()
      assert.are.equal("cancelled", job.state)
      assert.are.equal("cancelled", queued.state)
      local _, ev = drain(job)
      assert.are.equal("cancelled", ev.finish)
      assert.are.equal("closed session", kvgen.type(job.session))
      job:close()
      queued:close()
    end)

    it("closing the model lets the work finish", function()
      local m2 = support.random_model { threads = 1 }
      local r <close> = m2:session()
      local want = r:generate("model closed", { max_tokens = 20, ignore_eog = true })
      local s <close> = m2:session()
      local job <close> = s:submit("model closed", { max_tokens = 20, ignore_eog = true })
      m2:close()
      assert.are.equal(want, (drain(job)))
    end)

    it("closing the model and dropping everything with work in flight frees it all", function()
      local finish
      do
        local m2 = support.random_model { threads = 1 }
        local s = m2:session { context = 64, on_full = "shift" }
        s:submit("x", endless_opts())
        -- queued behind the endless one, which is collected (cancelled) below; callbacks keep
        -- this one alive until it is done
        s:submit("y", { max_tokens = 3, ignore_eog = true, on_done = function(_, f) finish = f end })
        m2:close()
      end
      collectgarbage()
      collectgarbage()
      wait_until(function()
        kvgen.poll()
        return finish ~= nil
      end)
      assert.are.equal("length", finish)
      collectgarbage()
      -- (ASan/LeakSanitizer runs of the specs check that nothing leaks)
    end)

    it("a dropped job in flight is cancelled; the session waits for the worker, then works", function()
      local s <close> = m:session { context = 64, on_full = "shift" }
      do
        local _ = s:submit("x", endless_opts())
      end
      collectgarbage()
      collectgarbage()
      wait_until(function() return not tostring(s):find("busy") end)
      local n = s.length
      s:prefill("y")
      local text = s:generate(nil, { max_tokens = 2, ignore_eog = true })
      assert.is_string(text)
      assert.are.equal(n + 1 + 2, s.length)
    end)

    it("a dropped job with callbacks is kept until it is done", function()
      local s <close> = m:session()
      local done_text, pieces = nil, {}
      do
        s:submit("fire and forget", { max_tokens = 5, ignore_eog = true,
          on_piece = function(p) pieces[#pieces + 1] = p end,
          on_done = function(text, finish, job)
            done_text = text
            assert.are.equal("length", finish)
            assert.are.equal("job", kvgen.type(job))
          end })
      end
      collectgarbage()
      collectgarbage()
      wait_until(function()
        kvgen.poll()
        return done_text ~= nil
      end)
      assert.are.equal(done_text, table.concat(pieces))
      local r <close> = m:session()
      assert.are.equal(r:generate("fire and forget", { max_tokens = 5, ignore_eog = true }), done_text)
    end)
  end)

  describe("callbacks", function()
    it("run only inside kvgen.poll, on the calling thread", function()
      local s <close> = m:session()
      local calls = 0
      local job <close> = s:submit("cb", { max_tokens = 4, ignore_eog = true, on_piece = function() calls = calls + 1 end })
      wait_until(function() return job.state == "done" end)
      assert.are.equal(0, calls) -- the worker finished, but nothing was called yet
      kvgen.poll()
      assert.is_true(calls >= 1)
    end)

    it("an error in on_piece is raised by kvgen.poll after every event was handled", function()
      local s1 <close> = m:session { context = 64, on_full = "shift" }
      local s2 <close> = m:session()
      local other_done = false
      local bad = s1:submit("bad", endless_opts { on_piece = function() error({ code = 42 }) end })
      local good <close> = s2:submit("good", { max_tokens = 4, ignore_eog = true, on_done = function() other_done = true end })
      local err
      wait_until(function()
        local ok, e = pcall(kvgen.poll)
        if not ok then err = e end
        return err ~= nil and other_done
      end)
      assert.are.same({ code = 42 }, err) -- the error value, unchanged
      -- (the raise lost that poll's list; the job still tells its state)
      wait_until(function()
        kvgen.poll() -- no callbacks left: no more errors
        return bad.state == "cancelled"
      end)
      assert.are.equal("cancelled", bad.finish)
      bad:close()
    end)

    it("an error in on_done is raised too; the job stays usable", function()
      local s <close> = m:session()
      local job <close> = s:submit("x", { max_tokens = 2, ignore_eog = true, on_done = function() error("boom") end })
      local err
      wait_until(function()
        local ok, e = pcall(kvgen.poll)
        if not ok then err = e end
        return err ~= nil
      end)
      assert.matches("boom", err)
      assert.are.equal("done", job.state)
      assert.are.same({}, kvgen.poll())
    end)
  end)

  describe("coroutines", function()
    it("a synchronous stream inside a game coroutine", function()
      local npc <close> = m:session()
      local r <close> = m:session()
      local want = r:generate("story", { max_tokens = 8, ignore_eog = true })
      local got = {}
      local co = coroutine.wrap(function()
        for piece in npc:stream("story", { max_tokens = 8, ignore_eog = true }) do
          got[#got + 1] = piece
          coroutine.yield()
        end
        return "end"
      end)
      local frames = 0
      repeat frames = frames + 1 until co() == "end"
      assert.are.equal(want, table.concat(got))
      assert.are.equal(#got + 1, frames)
    end)

    it("stream_async yields '' while nothing is ready and closes the job after the loop", function()
      local s <close>, long = endless()
      -- queued behind the endless job of its session, this one can have nothing ready however
      -- the host and the worker are timed: every frame gets ''
      local frames = {}
      local waiting = coroutine.wrap(function()
        for piece in s:stream_async("later", { max_tokens = 2 }) do
          frames[#frames + 1] = piece
          if #frames == 3 then break end -- closes (cancels) the queued job
          coroutine.yield()
        end
        return "end"
      end)
      repeat until waiting() == "end"
      assert.are.same({ "", "", "" }, frames)
      -- on a free session the pieces (with '' between them when the host is the faster) add up
      -- to the blocking generation
      local r <close> = m:session()
      local npc <close> = m:session()
      local want = r:generate("async", { max_tokens = 8, ignore_eog = true })
      local got = {}
      local co = coroutine.wrap(function()
        for piece in npc:stream_async("async", { max_tokens = 8, ignore_eog = true }) do
          assert.is_string(piece)
          got[#got + 1] = piece
          coroutine.yield()
        end
        return "end"
      end)
      repeat until co() == "end"
      assert.are.equal(want, table.concat(got))
      long:cancel()
      drain(long)
      long:close()
    end)

    it("breaking out of stream_async closes and cancels the job", function()
      local s <close> = m:session { context = 64, on_full = "shift" }
      local seen
      for piece, _ in s:stream_async("x", endless_opts()) do
        if piece ~= "" then
          seen = piece
          break
        end
      end
      assert.is_string(seen)
      -- the endless job was cancelled: the session drains and works again
      wait_until(function() return not tostring(s):find("busy") end)
      assert.is_string(s:generate("more", { max_tokens = 1 }))
    end)

    it("a kept job iterates with `for piece in job` and stays readable", function()
      local s <close> = m:session { template = "chatml" }
      local r <close> = m:session { template = "chatml" }
      local want = r:chat("hello", { max_tokens = 6, ignore_eog = true })
      local job <close> = s:submit_chat("hello", { max_tokens = 6, ignore_eog = true })
      local got = {}
      for piece in job do got[#got + 1] = piece end
      assert.are.equal(want, table.concat(got))
      assert.are.equal("length", job.finish)
      assert.are.equal(want, job.text)
      assert.is_nil(job())
    end)

    it("kvgen.poll never takes the text of a stream_async job", function()
      local s <close> = m:session()
      local r <close> = m:session()
      local want = r:generate("mine", { max_tokens = 8, ignore_eog = true })
      local job <close> = s:stream_async("mine", { max_tokens = 8, ignore_eog = true })
      wait_until(function() return job.state == "done" end)
      assert.are.same({}, kvgen.poll())
      local got = {}
      for piece in job do got[#got + 1] = piece end
      assert.are.equal(want, table.concat(got))
    end)

    it("chat_stream_async works as stream_async for chat turns", function()
      local s <close> = m:session { template = "chatml" }
      local r <close> = m:session { template = "chatml" }
      local want = r:chat("hey", { max_tokens = 5, ignore_eog = true })
      local got = {}
      for piece in s:chat_stream_async("hey", { max_tokens = 5, ignore_eog = true }) do got[#got + 1] = piece end
      assert.are.equal(want, table.concat(got))
    end)
  end)
end)
