-- Results that must not lie: a job that reads "done" has all its text (job.state, job:poll,
-- kvgen.poll callbacks, the job iterator); a choices reply is byte for byte one of the choices
-- (blocking, streaming, jobs), and the choice it picks is the one s:choose ranks best. Random
-- models on the reference backend, and on Vulkan when a device works; the default model
-- (#model) for the "Hot or Cold" question.
local support = require("kvgen_support")
local kvgen = support.kvgen

local backends = { "reference" }
if #kvgen.devices() > 0 then backends[#backends + 1] = "vulkan" end

-- a bound on one job's wait (a hang guard, not a timing assert: each job is a few tokens)
local function deadline()
  local t = os.time() + 300
  return function() assert(os.time() < t, "timed out") end
end

local prompts = { "x", "the", "hello world", "a b c", "once upon", "zz", "fire", "pick:" }

-- the same job as a blocking generation on a fresh session with the same seed
local function blocking(m, i, prompt, n)
  local r <close> = m:session { seed = i, temperature = 0.9 }
  return (r:generate(prompt, { max_tokens = n, ignore_eog = true }))
end

local function hex(s)
  return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

local function index_of(list, s)
  for i, v in ipairs(list) do if v == s then return i end end
end

local function tail(list, from)
  return table.move(list, from, #list, 1, {})
end

for _, backend in ipairs(backends) do
  -- lavapipe runs the same model an order of magnitude slower
  local n_jobs = backend == "reference" and 200 or 60
  local n_prompts = backend == "reference" and #prompts or 4

  describe("results (" .. backend .. ", random model)", function()
    local m
    setup(function() m = kvgen.load(support.random_model_path(), { backend = backend, threads = 1 }) end)
    teardown(function()
      m:close()
      collectgarbage()
    end)

    describe("a job that reads final has all its text", function()
      it("job.state while kvgen.poll() runs; on_piece and on_done add up to it", function()
        local bad = {}
        for i = 1, n_jobs do
          local check = deadline()
          local prompt, n = prompts[i % #prompts + 1], 1 + i % 6
          local want = blocking(m, i, prompt, n)
          local s <close> = m:session { seed = i, temperature = 0.9 }
          local pieces, done_text = {}, nil
          local job <close> = s:submit(prompt, {
            max_tokens = n, ignore_eog = true,
            on_piece = function(piece) pieces[#pieces + 1] = piece end,
            on_done = function(text) done_text = text end,
          })
          while job.state ~= "done" do
            kvgen.poll()
            check()
          end
          local at_done = job.text -- the poll that delivers the last piece may still be due
          while done_text == nil do
            kvgen.poll()
            check()
          end
          if at_done ~= want or table.concat(pieces) ~= want or done_text ~= want or job.text ~= want then
            bad[#bad + 1] = i
          end
        end
        assert.are.same({}, bad)
      end)

      it("job.state between job:poll() calls", function()
        local bad = {}
        for i = 1, n_jobs do
          local check = deadline()
          local prompt, n = prompts[i % #prompts + 1], 1 + i % 6
          local want = blocking(m, i, prompt, n)
          local s <close> = m:session { seed = i, temperature = 0.9 }
          local job <close> = s:submit(prompt, { max_tokens = n, ignore_eog = true })
          local got, early, done, finish = {}, nil, false, nil
          repeat
            local piece
            piece, done, finish = job:poll()
            got[#got + 1] = piece
            if early == nil and job.state == "done" then early = job.text end
            check()
          until done
          if early ~= want or table.concat(got) ~= want or job.text ~= want or finish ~= "length" then
            bad[#bad + 1] = i
          end
        end
        assert.are.same({}, bad)
      end)

      it("job.state inside the job iterator (stream_async)", function()
        local bad = {}
        for i = 1, n_jobs // 2 do
          local check = deadline()
          local prompt, n = prompts[i % #prompts + 1], 1 + i % 6
          local want = blocking(m, i, prompt, n)
          local s <close> = m:session { seed = i, temperature = 0.9 }
          local job <close> = s:stream_async(prompt, { max_tokens = n, ignore_eog = true })
          local got, early = {}, nil
          for piece in job do
            got[#got + 1] = piece
            if early == nil and job.state == "done" then early = job.text end
            check()
          end
          -- (a job without text ends the loop at once: nothing to look at inside it)
          if (early ~= nil and early ~= want) or table.concat(got) ~= want or job.text ~= want then
            bad[#bad + 1] = i
          end
        end
        assert.are.same({}, bad)
      end)
    end)

    describe("choices", function()
      local sets = {
        { "\xff\xfe" },                                                  -- not UTF-8, one choice
        { "\xff", "\xff\xfe", "\xff\xfe\xfd!", "ab\xc3", "ab\xc3\xa9", "\xc3" }, -- shared prefixes
        { " yes", " yes please", " no", " \xe2\x82\xac", " the quick brown fox jumps", "!" },
      }

      it("the reply is byte for byte one of them: generate, stream, submit, on both samplers", function()
        local bad = {}
        for si, list in ipairs(sets) do
          for pi = 1, n_prompts do
            for _, temp in ipairs { 0, 1.3 } do
              local opts = { seed = pi, temperature = temp }
              local a <close> = m:session(opts)
              local text, finish = a:generate(prompts[pi], { choices = list })
              local b <close> = m:session(opts)
              local pieces = {}
              for piece in b:stream(prompts[pi], { choices = list }) do pieces[#pieces + 1] = piece end
              local c <close> = m:session(opts)
              local job <close> = c:submit(prompts[pi], { choices = list })
              local jp, done = {}, false
              repeat
                local piece
                piece, done = job:poll()
                jp[#jp + 1] = piece
              until done
              local where = string.format("set %d, prompt %d, T %g: %s", si, pi, temp, hex(text))
              if not index_of(list, text) or finish ~= "stop" then bad[#bad + 1] = where .. " is no choice" end
              if table.concat(pieces) ~= text then bad[#bad + 1] = where .. ": stream " .. hex(table.concat(pieces)) end
              if table.concat(jp) ~= text or job.text ~= text then
                bad[#bad + 1] = where .. ": job " .. hex(job.text)
              end
            end
          end
        end
        assert.are.same({}, bad)
      end)

      it("greedy picks s:choose's best, and the session holds the tokens it scored", function()
        local bad = {}
        for si = 2, #sets do
          local list = sets[si]
          for pi = 1, n_prompts do
            local s <close> = m:session()
            s:prefill(prompts[pi])
            local n0 = s.length
            local best = s:choose(list)
            local text = s:generate(nil, { choices = list })
            if text ~= list[best] then
              bad[#bad + 1] = string.format("set %d, prompt %d: %s, choose %s", si, pi, hex(text), hex(list[best]))
            else
              local got, want = tail(s:tokens(), n0 + 1), m:tokenize(list[best])
              if table.concat(got, ",") ~= table.concat(want, ",") then
                bad[#bad + 1] = string.format("set %d, prompt %d: tokens %s, scored %s", si, pi,
                  table.concat(got, ","), table.concat(want, ","))
              end
            end
          end
        end
        assert.are.same({}, bad)
      end)

      it("after a chat turn: s:choose on the prompt scores what s:chat replies", function()
        local list = { "Hot", "Cold", "Left", "Right", "I do not know" }
        for _, q in ipairs { "Is fire hot or cold?", "Left or right?", "hi" } do
          local a <close> = m:session { template = "chatml" }
          local reply = a:chat(q, { choices = list })
          local toks = a:tokens()
          local n_reply = #m:tokenize(reply)
          local prompt = table.move(toks, 1, #toks - n_reply, 1, {})
          assert.is_truthy(m:detokenize(prompt, { special = true }):find("<|im_start|>assistant\n", 1, true))
          local b <close> = m:session { template = "chatml" }
          b:prefill(prompt)
          local best = b:choose(list)
          assert.are.equal(list[best], reply)
          assert.are.same(m:tokenize(reply), tail(toks, #prompt + 1))
          local c <close> = m:session { template = "chatml" }
          local job <close> = c:submit_chat(q, { choices = list })
          local got = {}
          for piece in job do got[#got + 1] = piece end
          assert.are.equal(reply, table.concat(got))
        end
      end)

      it("sampled: the same seed picks the same choice on every path", function()
        local list = { "ab", "ba", "b", "a", "\xff\xfe" }
        local seen = {}
        for seed = 1, (backend == "reference" and 40 or 12) do
          local opts = { seed = seed, temperature = 4, template = "chatml" }
          local a <close> = m:session(opts)
          local text = a:generate("pick", { choices = list })
          local b <close> = m:session(opts)
          local job <close> = b:submit("pick", { choices = list })
          local got = {}
          for piece in job do got[#got + 1] = piece end
          local c <close> = m:session(opts)
          local streamed = {}
          for piece in c:stream("pick", { choices = list }) do streamed[#streamed + 1] = piece end
          assert.is_truthy(index_of(list, text))
          assert.are.equal(text, table.concat(got))
          assert.are.equal(text, table.concat(streamed))
          local d <close> = m:session(opts)
          local e <close> = m:session(opts)
          local reply = d:chat("pick", { choices = list })
          local async = {}
          for piece in e:chat_stream_async("pick", { choices = list }) do async[#async + 1] = piece end
          assert.are.equal(reply, table.concat(async))
          seen[text] = true
        end
        local n = 0
        for _ in pairs(seen) do n = n + 1 end
        assert.is_true(n >= 2) -- not stuck on one choice
      end)

      it("JSON enum values must be UTF-8 (refused when the call is made)", function()
        local s <close> = m:session()
        local bad = { { key = "k", type = "enum", values = { "ok", "\xff" } } }
        assert.matches("UTF%-8", support.error_of(s.generate, s, "x", { json = bad }))
        assert.matches("UTF%-8", support.error_of(s.submit, s, "x", { json = bad }))
      end)
    end)
  end)
end

describe("results (default model) #model", function()
  local q = "Is fire hot or cold? Answer with one word."
  local list = { "Hot", "Cold" }

  it("s:chat with choices answers what s:choose ranks best after the assistant header", function()
    local m = support.default_model()
    -- s:choose on the chat prompt: the file template's default system prompt, the user turn and
    -- the assistant header
    local b <close> = m:session()
    b:prefill("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      .. "<|im_start|>user\n" .. q .. "<|im_end|>\n<|im_start|>assistant\n", { special = true })
    local prompt = b:tokens()
    local best, logprobs = b:choose(list)
    assert.are.equal("Hot", list[best]) -- fire is hot, and the model's scores say so
    assert.is_true(logprobs[1] > logprobs[2])
    local a <close> = m:session()
    local reply, finish = a:chat(q, { choices = list })
    assert.are.equal("stop", finish)
    assert.are.same(prompt, table.move(a:tokens(), 1, #prompt, 1, {})) -- the same prompt
    assert.are.equal(list[best], reply)                                -- the same pick
    assert.are.same(m:tokenize(reply), tail(a:tokens(), #prompt + 1))  -- the tokens it scored

    local c <close> = m:session()
    local job <close> = c:submit_chat(q, { choices = list })
    local got = {}
    for piece in job do got[#got + 1] = piece end
    assert.are.equal("Hot", table.concat(got))
  end)
end)
