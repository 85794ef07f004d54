-- chat.lua: an interactive chat in the terminal; the reply streams as it is generated.
--
--   lua5.4 samples/chat.lua [MODEL.gguf] [system prompt]
--
-- Commands: /undo (forget the last exchange), /reset, /save FILE, /load FILE, /quit (or end of input).
-- The model defaults to $KVGEN_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf; the module
-- comes from $KVGEN_BUILD (default build/) or the installed path.
local build = os.getenv("KVGEN_BUILD")
if not build or build == "" then build = "build" end
package.cpath = build .. "/?.so;" .. package.cpath
local kvgen = require("kvgen")

local model_path = arg[1] or os.getenv("KVGEN_MODEL")
if not model_path or model_path == "" then model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf" end
local system = arg[2] or "You are a helpful assistant."
local session_opts = { system = system, temperature = 0.7, top_p = 0.9, seed = os.time(), on_full = "shift" }

local model <close> = kvgen.load(model_path)
local session = model:session(session_opts)
session_opts.keep = session.length -- a context shift never drops the system prompt
session:close()
session = model:session(session_opts)
print(string.format("kvgen %s: %s on %s (%s), %d tokens of context. /quit to leave.",
  kvgen.version, model.name, model.device, model.backend, session.context))

local turns = {} -- session length before each exchange, for /undo
while true do
  io.write("\n> ")
  io.flush()
  local line = io.read("l")
  if not line or line == "/quit" then break end
  local cmd, rest = line:match("^/(%a+)%s*(.*)$")
  if cmd == "undo" then
    if #turns > 0 then
      session:rewind(session.length - table.remove(turns))
      print("(forgot the last exchange)")
    end
  elseif cmd == "reset" then
    session:close()
    session = model:session(session_opts)
    turns = {}
    print("(new conversation)")
  elseif cmd == "save" and rest ~= "" then
    session:save(rest)
    print("(saved to " .. rest .. ")")
  elseif cmd == "load" and rest ~= "" then
    local ok, restored = pcall(model.restore, model, rest)
    if ok then
      session:close()
      session, turns = restored, {}
      print(string.format("(restored %d tokens)", session.length))
    else
      print("(" .. tostring(restored) .. ")")
    end
  elseif cmd then
    print("commands: /undo /reset /save FILE /load FILE /quit")
  elseif line:match("%S") then
    turns[#turns + 1] = session.length
    local ok, err = pcall(function()
      local st <close> = session:chat_stream(line, { soft_max_tokens = 200, max_tokens = 256 })
      for piece in st do
        io.write(piece)
        io.flush()
      end
      if st.finish ~= "stop" and st.finish ~= "sentence" then io.write(" [" .. st.finish .. "]") end
    end)
    if not ok then io.write("\n(error: ", tostring(err), ")") end
    io.write("\n")
  end
end
session:close()
