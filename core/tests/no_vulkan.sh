#!/bin/sh
# kvgen on a machine without Vulkan: the Vulkan loader hidden (KVGEN_VULKAN_LOADER=none), a
# default load runs on the cpu backend and says why, an explicit Vulkan request fails naming
# the missing loader, and no binary links libvulkan.
# usage: no_vulkan.sh BUILD_DIR TMP_DIR
set -u
bin=$1
tmp=$2/no_vulkan
mkdir -p "$tmp"
fail() { echo "no_vulkan: $*"; exit 1; }
for f in "$bin/kvgen" "$bin/kvgen.so"; do
  [ -f "$f" ] || continue
  # (LD_PRELOAD left out: the sanitizer pass preloads the Vulkan driver, which ldd would list)
  if command -v ldd >/dev/null && env -u LD_PRELOAD ldd "$f" | grep -q libvulkan; then fail "$f links libvulkan"; fi
done
m=$tmp/tiny.gguf
"$bin/kvgen-mkmodel" -o "$m" --layers 2 --embd 64 --heads 4 --kv-heads 2 --type Q4_1 >/dev/null || fail "kvgen-mkmodel"
export KVGEN_VULKAN_LOADER=none KVGEN_VALIDATE=0
unset KVGEN_BACKEND KVGEN_DEVICE
"$bin/kvgen" info "$m" >"$tmp/info.out" 2>"$tmp/info.err" || fail "kvgen info: $(cat "$tmp/info.err")"
grep -q '^backend: *cpu ' "$tmp/info.out" || fail "default load not on the cpu backend: $(grep backend "$tmp/info.out")"
grep -q 'no Vulkan loader (KVGEN_VULKAN_LOADER=none' "$tmp/info.err" || fail "no message saying why: $(cat "$tmp/info.err")"
"$bin/kvgen" generate "$m" -p "hello there" -n 5 --ids >"$tmp/gen.out" 2>"$tmp/gen.err" || fail "generate: $(cat "$tmp/gen.err")"
[ "$(wc -w <"$tmp/gen.out")" -ge 5 ] || fail "generate printed $(cat "$tmp/gen.out")"
if "$bin/kvgen" generate "$m" -p hello -n 2 --backend vulkan >/dev/null 2>"$tmp/vk.err"; then
  fail "--backend vulkan succeeded without a loader"
fi
grep -q 'no Vulkan loader' "$tmp/vk.err" || fail "--backend vulkan: $(cat "$tmp/vk.err")"
"$bin/kvgen" devices >"$tmp/dev.out" 2>&1 || fail "kvgen devices: $(cat "$tmp/dev.out")"
echo "no_vulkan: cpu backend chosen, vulkan refused: $(cat "$tmp/vk.err")"
