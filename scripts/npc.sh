#!/usr/bin/env bash
# The main job: set up (packages, default model), build, and run the NPC dialogue sample.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$here/scripts/setup.sh"
cmake -S "$here" -B "$here/build" >/dev/null
cmake --build "$here/build" -j"$(nproc)" >/dev/null
model=${KVGEN_MODEL:-$here/models/SmolLM2-135M-Instruct.Q4_1.gguf}
exec "$here/build/npc_dialogue" "$model"
