-- npc_village.lua: run by samples/host (kvgen_host) at 60 Hz. Four villagers answer the player
-- at the same time; their replies stream in over the frames while the game keeps running.
-- The host's `host` table (npc, say, poll) is a stopgap until the kvgen Lua module exposes the
-- jobs API (kvgen_job_submit / kvgen_poll); the shape of the script stays the same.
--
-- update(dt) returns false when the scene is over.

local villagers = {
  { name = "Mira",  persona = "You are Mira, the village blacksmith. Gruff but kind. Answer in one short sentence." },
  { name = "Tobin", persona = "You are Tobin, a cheerful innkeeper who loves gossip. Answer in one short sentence." },
  { name = "Elda",  persona = "You are Elda, an old herbalist. Answer calmly in one short sentence." },
  { name = "Rook",  persona = "You are Rook, a nervous town guard. Answer in one short sentence." },
}
for _, v in ipairs(villagers) do v.id = host.npc(v.persona); v.reply = {} end

local clock, phase, pending = 0, "idle", 0
local IDLE_SECONDS, TAIL_SECONDS = 2.0, 1.0
local finished_at

-- a game-side workload, so frames are not empty
local function simulate_world()
  local x = 0
  for i = 1, 2000 do x = x + math.sin(i * clock) end
  return x
end

function update(dt)
  clock = clock + dt
  simulate_world()
  if phase == "idle" and clock >= IDLE_SECONDS then
    -- the player shouts a question to the whole square; Mira is the one being looked at
    for i, v in ipairs(villagers) do
      host.say(v.id, "Did you see the dragon over the hills this morning?", i == 1 and 5 or 0)
      pending = pending + 1
    end
    phase = "talking"
  end
  for _, ev in ipairs(host.poll()) do
    local v = villagers[ev.npc]
    v.reply[#v.reply + 1] = ev.text
    if ev.finished then
      pending = pending - 1
      print(string.format("[%6.2fs] %-5s (%2d tokens, first after %6.0f ms, %5.1f tok/s, %s): %s", clock, v.name,
                          ev.tokens, ev.ttft_ms, ev.tokens_per_s, ev.finish, table.concat(v.reply)))
    end
  end
  if phase == "talking" and pending == 0 then phase = "after"; finished_at = clock end
  if phase == "after" and clock - finished_at >= TAIL_SECONDS then return false end
  return true
end
