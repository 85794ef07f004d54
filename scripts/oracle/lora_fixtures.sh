#!/usr/bin/env bash
# Makes core/tests/fixtures/lora_<name>_logits.txt: llama.cpp's logits on tiny random-weight F32
# models running a random LoRA adapter (both from kvgen-mkmodel, the adapter with --lora and the
# model's shape flags) at a scale, teacher-forced over the fixed 40-token sequence of
# test_arch_parity, for test_lora_parity. Usage (llama.cpp built outside the tree, see README):
#   scripts/oracle/lora_fixtures.sh BUILD_DIR DUMP_LOGITS [OUT_DIR]
# LLAMA_COMMIT names the llama.cpp commit in the headers where its tree has no .git.
# The configurations and the token ids must match core/tests/test_lora_parity.c.
set -euo pipefail
build=$1 dump=$2
out=${3:-$(cd "$(dirname "$0")/../.." && pwd)/core/tests/fixtures}
ids="ids:1,17,42,99,3,250,7,130,64,5,77,201,12,180,33,9,144,60,2,222,18,95,41,170,8,66,133,27,240,50,11,190,73,36,155,4,210,88,29,120"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
while IFS='|' read -r name model adapter scale; do
  [ -z "$name" ] && continue
  "$build/kvgen-mkmodel" -o "$tmp/$name.gguf" $model
  "$build/kvgen-mkmodel" -o "$tmp/$name-lora.gguf" $model --lora $adapter
  { echo "# llama.cpp (${LLAMA_COMMIT:-$(git -C "$(dirname "$dump")/llama.cpp" rev-parse HEAD 2>/dev/null || echo unknown)}) on kvgen-mkmodel $model with --lora $adapter at scale $scale"
    "$dump" "$tmp/$name.gguf" "$ids" 8 "$tmp/$name-lora.gguf" "$scale"; } > "$out/lora_${name}_logits.txt"
  echo "lora_fixtures: $name"
done <<'CONFIGS'
all_targets|--layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --seed 81|--lora-rank 8 --seed 82|0.8
alpha|--layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --seed 81|--lora-rank 32 --lora-alpha 5 --lora-targets q,v,down --seed 83|1.5
qwen2|--arch qwen2 --qkv-bias --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --rope-base 1000000 --seed 84|--lora-rank 4 --lora-alpha 0 --lora-targets k,o,gate,up --seed 85|0.5
CONFIGS
