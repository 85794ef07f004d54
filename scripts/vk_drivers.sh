#!/usr/bin/env bash
# The Vulkan tests on more lavapipe configurations than the machine's own: kvgen's kernels must be
# correct by the Vulkan specification, not by one driver's behaviour (subgroup width, how a loop,
# a barrier or shared memory is compiled). Runs ctest on an existing build (build/, or
# KVGEN_BUILD_DIR) once per configuration:
#   sg8     the system lavapipe as it is (Debian 12: Mesa 22.3, subgroups of 8)
#   sg4     the system lavapipe with LP_NATIVE_VECTOR_WIDTH=128: subgroups of 4
#   sg16    the system lavapipe with LP_NATIVE_VECTOR_WIDTH=512: subgroups of 16
#   mesa25  Mesa 25.0's lavapipe from Debian's bookworm-backports, fetched once into
#           build/vk-drivers/mesa25 (apt-get download with a private apt state: nothing is
#           installed and /etc is not touched; then dpkg -x) and loaded through
#           VK_ICD_FILENAMES; needs network access the first time
# Arguments: the configurations to run (default: all four).
#   KVGEN_VK_DRIVER_TESTS    ctest -R regex (default '^test_vk_(kernels|arch)$'; '^test_vk_'
#                            runs every Vulkan test)
#   KVGEN_VK_DRIVER_TIMEOUT  ctest --timeout (default 1800): only for tests without a TIMEOUT of
#                            their own; core/CMakeLists.txt gives the C tests 1500 s each
#   KVGEN_TEST_TYPES         passed on to test_vk_kernels: only these weight types' mat-mul and
#                            embedding cases (e.g. Q4_1,Q4_K); attention always runs
# A test that skips (no Vulkan device) counts as neither passed nor failed.
# Every configuration keeps its own Mesa shader cache in build/vk-drivers/cache-<config>: the
# first run compiles every pipeline (minutes: lavapipe compiles at the first dispatch), later
# runs only the shaders that changed. The validation layer is on (KVGEN_VALIDATE=1).
# The last line is "N passed, N failed" over the tests run.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KVGEN_BUILD_DIR:-$here/build}
tests=${KVGEN_VK_DRIVER_TESTS:-'^test_vk_(kernels|arch)$'}
timeout=${KVGEN_VK_DRIVER_TIMEOUT:-1800}
cache=$build/vk-drivers
passed=0
failed=0

if [ ! -f "$build/CTestTestfile.cmake" ]; then
  echo "vk_drivers: no build in $build (cmake -S . -B build && cmake --build build first)"
  exit 1
fi
mkdir -p "$cache"

# Mesa 25.0's lavapipe (mesa-vulkan-drivers) and the libdrm it needs, newer than bookworm's
fetch_mesa25() {
  local dir=$cache/mesa25 lib missing
  lib=$dir/root/usr/lib/x86_64-linux-gnu
  if [ ! -f "$dir/lvp_icd.json" ]; then
    [ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ] || { echo "mesa25: needs Debian amd64"; return 1; }
    rm -rf "$dir"
    mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial" "$dir/debs"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian" \
      "bookworm-backports main" >"$dir/apt/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$dir/apt/sources.list" -o "Dir::Etc::SourceParts=$dir/apt/none"
                -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt/cache" -o Debug::NoLocking=1)
    [ "$(id -u)" = 0 ] && opts+=(-o APT::Sandbox::User=root)
    if ! apt-get "${opts[@]}" update >"$dir/fetch.log" 2>&1 ||
       ! (cd "$dir/debs" && apt-get "${opts[@]}" download mesa-vulkan-drivers/bookworm-backports \
            libdrm2/bookworm-backports libdrm-amdgpu1/bookworm-backports) >>"$dir/fetch.log" 2>&1; then
      cat "$dir/fetch.log"; echo "mesa25: download failed"; return 1
    fi
    local deb
    for deb in "$dir"/debs/*.deb; do dpkg -x "$deb" "$dir/root" || return 1; done
    [ -f "$lib/libvulkan_lvp.so" ] || { echo "mesa25: no libvulkan_lvp.so in the package"; return 1; }
    printf '{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "1.4.305"}}\n' \
      "$lib/libvulkan_lvp.so" >"$dir/lvp_icd.json"
    rm -rf "$dir/apt"
  fi
  missing=$(LD_LIBRARY_PATH=$lib ldd "$lib/libvulkan_lvp.so" | grep 'not found')
  if [ -n "$missing" ]; then echo "mesa25: libraries missing for the driver:"; echo "$missing"; return 1; fi
  echo "mesa25: $(cd "$dir/debs" && echo *.deb)"
}

run_config() { # name, env (VAR=value ...)
  local name=$1; shift
  local log=$cache/ctest-$name.log start p f
  start=$(date +%s)
  env "$@" MESA_SHADER_CACHE_DIR="$cache/cache-$name" KVGEN_VALIDATE=1 \
    "$build/kvgen" devices 2>&1 | sed -n 1,2p
  env "$@" MESA_SHADER_CACHE_DIR="$cache/cache-$name" KVGEN_VALIDATE=1 \
    ctest --test-dir "$build" --output-on-failure --timeout "$timeout" -R "$tests" >"$log" 2>&1
  p=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed' "$log")
  f=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*(\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|Not Run)' "$log")
  [ "$f" -eq 0 ] || cat "$log"
  grep -E '^ *[0-9]+/[0-9]+ Test +#' "$log"
  if ! grep -qE '^ *[0-9]+/[0-9]+ Test +#' "$log"; then cat "$log"; echo "$name: no test matched '$tests'"; f=1; fi
  passed=$((passed + p)); failed=$((failed + f))
  echo "$name: $p passed, $f failed ($(($(date +%s) - start)) s)"
}

configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(sg8 sg4 sg16 mesa25)
for c in "${configs[@]}"; do
  case $c in
    sg8) run_config sg8 ;;
    sg4) run_config sg4 LP_NATIVE_VECTOR_WIDTH=128 ;;
    sg16) run_config sg16 LP_NATIVE_VECTOR_WIDTH=512 ;;
    mesa25)
      if fetch_mesa25; then
        lib=$cache/mesa25/root/usr/lib/x86_64-linux-gnu
        run_config mesa25 VK_ICD_FILENAMES="$cache/mesa25/lvp_icd.json" \
          LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      else
        failed=$((failed + 1))
      fi ;;
    *) echo "vk_drivers: unknown configuration $c (sg8, sg4, sg16, mesa25)"; failed=$((failed + 1)) ;;
  esac
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
