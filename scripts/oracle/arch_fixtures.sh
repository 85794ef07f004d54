#!/usr/bin/env bash
# Makes core/tests/fixtures/arch_<name>_logits.txt: llama.cpp's logits on tiny random-weight
# models of each architecture kvgen runs (kvgen-mkmodel, F32), teacher-forced over a fixed
# 40-token sequence, for test_arch_parity. Usage (llama.cpp built outside the tree, see README):
#   scripts/oracle/arch_fixtures.sh BUILD_DIR DUMP_LOGITS [OUT_DIR]
# The configurations and the token ids must match core/tests/test_arch_parity.c.
set -euo pipefail
build=$1 dump=$2
out=${3:-$(cd "$(dirname "$0")/../.." && pwd)/core/tests/fixtures}
ids="ids:1,17,42,99,3,250,7,130,64,5,77,201,12,180,33,9,144,60,2,222,18,95,41,170,8,66,133,27,240,50,11,190,73,36,155,4,210,88,29,120"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
while read -r name args; do
  [ -z "$name" ] && continue
  "$build/kvgen-mkmodel" -o "$tmp/$name.gguf" $args
  { echo "# llama.cpp ($(git -C "$(dirname "$dump")/llama.cpp" rev-parse HEAD 2>/dev/null || echo unknown)) on kvgen-mkmodel $args"
    "$dump" "$tmp/$name.gguf" "$ids" 8; } > "$out/arch_${name}_logits.txt"
  echo "arch_fixtures: $name"
done <<'CONFIGS'
llama_rope_freqs --arch llama --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --rope-freqs --seed 71
qwen2 --arch qwen2 --qkv-bias --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --rope-base 1000000 --seed 72
qwen3 --arch qwen3 --qk-norm --layers 2 --embd 64 --heads 4 --kv-heads 2 --head-dim 32 --ff 96 --rope-base 1000000 --seed 73
gemma2 --arch gemma2 --post-norms --swa 8 --softcap 50,30 --layers 3 --embd 64 --heads 4 --kv-heads 2 --ff 96 --seed 74
gemma3 --arch gemma3 --qk-norm --post-norms --swa 8 --layers 7 --embd 64 --heads 4 --kv-heads 1 --head-dim 32 --ff 96 --rope-base 1000000 --seed 75
phi3 --arch phi3 --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 96 --rope-dim 12 --untied --seed 76
phi3_longrope --arch phi3 --layers 2 --embd 64 --heads 4 --ff 96 --ctx 4096 --orig-ctx 512 --rope-factors --seed 77
phi3_longrope_long --arch phi3 --layers 2 --embd 64 --heads 4 --ff 96 --ctx 4096 --orig-ctx 256 --rope-factors --seed 78
CONFIGS
