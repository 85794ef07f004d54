#!/usr/bin/env bash
# The main job: set up (packages, default model), build, and run the NPC dialogue sample
# (samples/npc_dialogue.lua: three NPCs with their own sessions sharing one model).
#   KVGEN_BACKEND=cpu|reference|vulkan picks the backend (default: Vulkan when a device works, else cpu).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$here/scripts/setup.sh"
cmake -S "$here" -B "$here/build" >/dev/null
cmake --build "$here/build" -j"$(nproc)" >/dev/null
model=${KVGEN_MODEL:-$here/models/SmolLM2-135M-Instruct.Q4_1.gguf}
cd "$here"
KVGEN_BUILD="$here/build" exec lua5.4 "$here/samples/npc_dialogue.lua" "$model"
