-- npc_memory.lua: an NPC who remembers what she was told, across runs. Mira the blacksmith is
-- told facts in one run; each is embedded (all-MiniLM-L6-v2) and kept in a memory store saved
-- to a file. In a later run the player asks questions: the facts closest to each question are
-- searched out of the saved store and put into Mira's prompt, and she answers from them.
--
--   lua5.4 samples/npc_memory.lua tell [SAVE.kvm]   -- run 1: tell Mira the facts, save her memory
--   lua5.4 samples/npc_memory.lua ask  [SAVE.kvm]   -- run 2: ask; she answers from what she recalls
--   lua5.4 samples/npc_memory.lua                   -- both, one after the other
--
-- Models: $KVGEN_EMBED_MODEL (default models/all-MiniLM-L6-v2.gguf, from
-- scripts/fetch_model.sh --minilm) for the embeddings, $KVGEN_MODEL (default
-- models/SmolLM2-135M-Instruct.Q4_1.gguf) for the replies. The module comes from $KVGEN_BUILD
-- (default build/) or the installed path.
local build = os.getenv("KVGEN_BUILD")
if not build or build == "" then build = "build" end
package.cpath = build .. "/?.so;" .. package.cpath
local kvgen = require("kvgen")

local function env(name, default)
  local v = os.getenv(name)
  return (v and v ~= "") and v or default
end

local mode, save_path = arg[1] or "both", arg[2] or os.tmpname() .. "-mira.kvm"
local embed_path = env("KVGEN_EMBED_MODEL", "models/all-MiniLM-L6-v2.gguf")
local chat_path = env("KVGEN_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf")
-- a number naming the embedding model, saved in the store: a store made with another model is refused
local EMBEDDING_ID = 0x4d694e4c4d36 -- "MiNLM6"

local FACTS = {
  "The player's name is Arin and they arrived from the northern pass.",
  "Arin paid three gold coins to have a dagger sharpened.",
  "The mayor's daughter lost her silver ring near the old mill.",
  "Wolves were seen at the edge of the forest two nights ago.",
  "Arin promised to bring back iron ore from the mine.",
  "The innkeeper Tobin owes Mira ten silver pieces.",
  "A storm damaged the bridge over the river last week.",
}

local QUESTIONS = {
  "What did I pay you for?",
  "Has anyone lost something?",
  "Is the road east safe to travel?",
  "What did I promise you?",
}

local function tell(embedder)
  local mem <close> = kvgen.memory { dim = embedder.n_embd, embedding_id = EMBEDDING_ID }
  local vectors = embedder:embed(FACTS) -- one batched call for every fact
  for i, fact in ipairs(FACTS) do
    mem:add(fact, vectors[i], { npc = "mira" })
    print("told Mira: " .. fact)
  end
  mem:save(save_path)
  print(string.format("Mira's memory: %d facts saved to %s\n", #mem, save_path))
end

local function ask(embedder)
  local mem <close> = kvgen.memory_load(save_path, { dim = embedder.n_embd, embedding_id = EMBEDDING_ID })
  local chat_model <close> = kvgen.load(chat_path)
  for _, question in ipairs(QUESTIONS) do
    local hits = mem:search(embedder:embed(question), { k = 2, where = { npc = "mira" } })
    local recalled, shown = {}, {}
    for _, hit in ipairs(hits) do
      recalled[#recalled + 1] = "- " .. hit.text
      shown[#shown + 1] = string.format("%s (%.2f)", hit.text, hit.score)
    end
    -- a fresh session per question: what she knows comes from the store, not from the chat so far
    local mira <close> = chat_model:session {
      system = "You are Mira, the village blacksmith. Answer the player in one short sentence, using what "
        .. "you remember:\n" .. table.concat(recalled, "\n"),
      seed = 1,
    }
    print("Player: " .. question)
    print("  (Mira recalls: " .. table.concat(shown, " | ") .. ")")
    io.write("Mira: ")
    for piece in mira:chat_stream(question, { max_tokens = 48 }) do io.write(piece) end
    io.write("\n\n")
  end
end

local embedder <close> = kvgen.load(embed_path, { backend = env("KVGEN_BACKEND", "cpu") })
if mode == "tell" or mode == "both" then tell(embedder) end
if mode == "ask" or mode == "both" then ask(embedder) end
