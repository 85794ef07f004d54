-- npc_dialogue.lua: three villagers share one loaded model; each has a persona and a session
-- of their own (their own KV cache and memory of the conversation). A scripted player talks
-- to them in turn and their replies stream out as they are generated.
--
--   lua5.4 samples/npc_dialogue.lua [MODEL.gguf]
--
-- The model defaults to $KVGEN_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf. From the
-- build tree set KVGEN_BUILD (default build/) or LUA_CPATH so that require("kvgen") finds
-- kvgen.so; after `cmake --install` it is found on the standard path.
local build = os.getenv("KVGEN_BUILD")
if not build or build == "" then build = "build" end
package.cpath = build .. "/?.so;" .. package.cpath
local kvgen = require("kvgen")

local model_path = arg[1] or os.getenv("KVGEN_MODEL")
if not model_path or model_path == "" then model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf" end

-- backend: $KVGEN_BACKEND (reference or vulkan), else Vulkan when a device works, else the CPU
local model <close> = kvgen.load(model_path)
print(string.format("kvgen %s: %s on %s (%s)\n", kvgen.version, model.name, model.device, model.backend))

local npcs = {
  { name = "Mira", persona = "You are Mira, the village blacksmith. You are gruff but kind. Answer in one short sentence." },
  { name = "Tobin", persona = "You are Tobin, a cheerful innkeeper who loves gossip. Answer in one short sentence." },
  { name = "Elda", persona = "You are Elda, an old herbalist who speaks calmly about plants. Answer in one short sentence." },
}

local by_name = {}
for i, npc in ipairs(npcs) do
  -- every NPC samples with its own seed, so the same script gives the same story each run
  npc.session = model:session {
    system = npc.persona,
    seed = 42 + i,
    temperature = 0.7,
    top_k = 40,
    top_p = 0.9,
    repeat_penalty = 1.1,
  }
  by_name[npc.name] = npc
end

local script = {
  { "Mira", "Can you fix my sword before the festival?" },
  { "Tobin", "Any news in town today?" },
  { "Elda", "What herb helps with a cough?" },
  { "Mira", "How much will the repair cost?" },
}

for _, line in ipairs(script) do
  local npc = by_name[line[1]]
  print(string.format("Player -> %s: %s", npc.name, line[2]))
  io.write(npc.name, ": ")
  io.flush()
  -- the reply streams piece by piece (complete UTF-8 only); past soft_max_tokens it ends where a
  -- sentence ends (finish "sentence"), and max_tokens is the hard limit that keeps it short on a CPU
  local st <close> = npc.session:chat_stream(line[2], { soft_max_tokens = 32, max_tokens = 96 })
  for piece in st do
    io.write(piece)
    io.flush()
  end
  if st.finish == "length" then io.write(" ...") end
  io.write("\n\n")
end

for _, npc in ipairs(npcs) do
  local ci = npc.session:cache_info()
  print(string.format("[%s's memory: %d tokens, %d KiB of K/V]", npc.name, ci.length, ci.bytes // 1024))
  npc.session:close()
end
