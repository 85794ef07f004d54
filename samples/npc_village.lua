-- npc_village.lua: run by samples/host (kvgen_host) at 60 Hz. Four villagers answer the player
-- at the same time through kvgen jobs; their replies stream in over the frames while the game
-- keeps running. The host gives the script its model as the global `model`.
--
-- Two ways to consume a job are shown: Mira's reply is pumped by callbacks that run inside
-- kvgen.poll(); the others are read by game coroutines that poll their own job once per frame
-- and yield (chat_stream_async: the job is an iterator that gives "" while nothing new is
-- ready, so a coroutine never waits, and kvgen.poll() leaves its text alone).
--
-- update(dt) returns false when the scene is over; summary() prints the per-NPC figures.
local kvgen = require("kvgen")

local villagers = {
  { name = "Mira",  persona = "You are Mira, the village blacksmith. Gruff but kind. Answer in one short sentence." },
  { name = "Tobin", persona = "You are Tobin, a cheerful innkeeper who loves gossip. Answer in one short sentence." },
  { name = "Elda",  persona = "You are Elda, an old herbalist. Answer calmly in one short sentence." },
  { name = "Rook",  persona = "You are Rook, a nervous town guard. Answer in one short sentence." },
}
for i, v in ipairs(villagers) do
  -- load time: creating a session prefills the persona (this blocks; it is not a frame)
  v.session = model:session { system = v.persona, context = 1024, seed = 1000 + i, temperature = 0.7, top_p = 0.9 }
  v.reply = {}
end

local clock, phase, pending = 0, "idle", 0
local IDLE_SECONDS, TAIL_SECONDS = 2.0, 1.0
local QUESTION = "Did you see the dragon over the hills this morning?"
-- a reply ends at its first sentence end past 24 tokens, at a line end, or at 64 tokens at most
local GEN = { soft_max_tokens = 24, max_tokens = 64, stop = "\n" }
local finished_at
local talkers = {} -- game coroutines, resumed once per frame

-- a game-side workload, so frames are not empty
local function simulate_world()
  local x = 0
  for i = 1, 2000 do x = x + math.sin(i * clock) end
  return x
end

local function finished(v, job)
  local info = job:info()
  v.ttft_ms, v.tokens, v.tokens_per_s, v.finish = info.first_token_ms, info.n_tokens, info.tokens_per_s, info.finish
  pending = pending - 1
  print(string.format("[%6.2fs] %-5s (%2d tokens, first after %6.0f ms, %5.1f tok/s, %s): %s", clock, v.name,
                      v.tokens, v.ttft_ms or -1, v.tokens_per_s, v.finish, table.concat(v.reply)))
  job:close()
end

local function ask_all()
  for i, v in ipairs(villagers) do
    local opts = { soft_max_tokens = GEN.soft_max_tokens, max_tokens = GEN.max_tokens, stop = GEN.stop }
    if i == 1 then
      -- the villager the player looks at: first in line, pumped by callbacks in kvgen.poll()
      opts.priority = 5
      opts.on_piece = function(piece) v.reply[#v.reply + 1] = piece end
      opts.on_done = function(_, _, job) finished(v, job) end
      v.session:submit_chat(QUESTION, opts)
    else
      -- the job itself, without the closing value, so it stays open after the loop for job:info()
      local job = v.session:chat_stream_async(QUESTION, opts)
      talkers[#talkers + 1] = coroutine.wrap(function()
        for piece in job do -- "" while nothing new: yield and try again next frame
          if piece ~= "" then v.reply[#v.reply + 1] = piece end
          coroutine.yield(true)
        end
        finished(v, job)
        return false
      end)
    end
    pending = pending + 1
  end
end

function update(dt)
  clock = clock + dt
  simulate_world()
  if phase == "idle" and clock >= IDLE_SECONDS then
    ask_all() -- the player shouts a question to the whole square
    phase = "talking"
  end
  kvgen.poll() -- runs the callbacks; never waits
  for i = #talkers, 1, -1 do
    if not talkers[i]() then table.remove(talkers, i) end
  end
  if phase == "talking" and pending == 0 then phase = "after"; finished_at = clock end
  if phase == "after" and clock - finished_at >= TAIL_SECONDS then return false end
  return true
end

function summary()
  print("time to first token per NPC (submit -> first token):")
  for _, v in ipairs(villagers) do
    print(string.format("  %-5s %8.1f ms  %2d tokens  %5.1f tok/s", v.name, v.ttft_ms or -1, v.tokens or 0,
                        v.tokens_per_s or 0))
  end
end
