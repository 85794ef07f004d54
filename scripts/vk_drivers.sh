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
#   trixie  Debian 13's lavapipe from trixie-backports (Mesa 26.1), which offers cooperative
#           matrices, with trixie's C library, Vulkan loader, validation layer, glslc, glslang
#           and spirv-val: the packages and their dependencies are downloaded once into
#           build/vk-drivers/trixie (a private apt state with an empty package database, then
#           dpkg -x; nothing is installed), a second build in build/vk-drivers/trixie/build
#           compiles the shaders with that glslc (so gemm_cm.comp is built), and ctest runs
#           its tests through that tree's dynamic linker, its libraries first; needs network
#           access the first time. The tree also holds trixie's Vulkan and SPIR-V headers
#           (scripts/gpu_check.sh builds a Vulkan llama-bench with them and that glslc, when
#           asked)
# Arguments: the configurations to run (default: sg8 sg4 sg16 mesa25); fetch-trixie only
# downloads trixie's tree (its glslc, glslangValidator and spirv-val wrappers are then in
# build/vk-drivers/trixie).
#   KVGEN_VK_DRIVER_TESTS    ctest -R regex (default '^test_vk_(kernels|arch)$'; '^test_vk_'
#                            runs every Vulkan test)
#   KVGEN_VK_DRIVER_TIMEOUT  ctest --timeout (default 1800): only for tests without a TIMEOUT of
#                            their own; core/CMakeLists.txt gives the C tests 1500 s each
#   KVGEN_TEST_TYPES         passed on to test_vk_kernels: only these weight types' mat-mul and
#                            embedding cases (e.g. Q4_1,Q4_K); attention always runs
# A test that skips counts as failed: here a skip means the configuration's driver gave no
# Vulkan device (a driver that did not load), and that must not pass for a run of it.
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

# Debian 13's lavapipe (trixie-backports) and shader tools with everything they need (trixie
# above); on return tx_root, tx_lib and tx_ld name the tree, its library folder and its dynamic
# linker
fetch_trixie() {
  local dir=$cache/trixie
  tx_root=$dir/root
  tx_lib=$tx_root/usr/lib/x86_64-linux-gnu
  tx_ld=$tx_lib/ld-linux-x86-64.so.2
  if [ ! -f "$dir/lvp_icd.json" ] || [ ! -x "$dir/glslc" ] ||
     [ ! -f "$dir/root/usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake" ]; then
    [ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ] || { echo "trixie: needs Debian amd64"; return 1; }
    rm -rf "$dir/root" "$dir/apt"
    mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial" "$dir/root"
    : >"$dir/apt/status"
    printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian %s main\n' \
      trixie trixie-backports >"$dir/apt/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$dir/apt/sources.list" -o "Dir::Etc::SourceParts=$dir/apt/none"
                -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt/cache"
                -o "Dir::State::status=$dir/apt/status" -o Debug::NoLocking=1
                -o APT::Install-Recommends=false -o APT::Architecture=amd64 -o APT::Architectures=amd64)
    [ "$(id -u)" = 0 ] && opts+=(-o APT::Sandbox::User=root)
    if ! apt-get "${opts[@]}" update >"$dir/fetch.log" 2>&1 ||
       ! apt-get "${opts[@]}" install --download-only -y mesa-vulkan-drivers/trixie-backports libvulkan1 vulkan-validationlayers \
            glslc glslang-tools spirv-tools libc6 libvulkan-dev spirv-headers >>"$dir/fetch.log" 2>&1; then
      cat "$dir/fetch.log"; echo "trixie: download failed"; return 1
    fi
    local deb
    for deb in "$dir"/apt/cache/archives/*.deb; do dpkg -x "$deb" "$dir/root" || return 1; done
    [ -x "$tx_ld" ] && [ -f "$tx_lib/libvulkan_lvp.so" ] || { echo "trixie: no dynamic linker or lavapipe"; return 1; }
    # the driver and the layer by absolute paths; the tools through that C library
    printf '{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "1.4.0"}}\n' \
      "$tx_lib/libvulkan_lvp.so" >"$dir/lvp_icd.json.tmp"
    mkdir -p "$dir/layers"
    sed "s#\"library_path\": *\"[^\"]*\"#\"library_path\": \"$tx_lib/libVkLayer_khronos_validation.so\"#" \
      "$tx_root/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json" \
      >"$dir/layers/VkLayer_khronos_validation.json"
    local t
    for t in glslc glslangValidator spirv-val; do
      printf '#!/bin/sh\nexec "%s" --library-path "%s" "%s" "$@"\n' "$tx_ld" "$tx_lib" "$tx_root/usr/bin/$t" \
        >"$dir/$t"
      chmod +x "$dir/$t"
    done
    rm -rf "$dir/apt"
    mv "$dir/lvp_icd.json.tmp" "$dir/lvp_icd.json"
  fi
  echo "trixie: $(ls "$tx_root/usr/share/doc" | grep -c .) packages; $("$dir/glslc" --version | head -1)"
}

# the trixie configuration's own build: its glslc (glslang 15 inside, so gemm_cm.comp is
# compiled); the tests run through trixie's dynamic linker with its libraries first (ctest's emulator: a newer C library runs what
# an older one linked, and the driver then finds everything it needs); only the programs the
# chosen tests need
build_trixie() {
  local dir=$cache/trixie b=$cache/trixie/build targets=(kvgen_cli kvgen-mkmodel) t
  cmake -S "$here" -B "$b" -DCMAKE_BUILD_TYPE=Release -DKVGEN_GLSLC="$dir/glslc" -DKVGEN_SPIRV_VAL="$dir/spirv-val" \
    -DCMAKE_CROSSCOMPILING_EMULATOR="$tx_ld;--library-path;$tx_lib" \
    >"$dir/build.log" 2>&1 || { cat "$dir/build.log"; echo "trixie: configure failed"; return 1; }
  grep -q "cooperative-matrix GEMM (gemm_cm.comp): ON" "$dir/build.log" ||
    { grep "cooperative-matrix" "$dir/build.log"; echo "trixie: glslc did not build gemm_cm.comp"; return 1; }
  for t in $(ctest --test-dir "$b" -N -R "$tests" | sed -n 's/^ *Test *#[0-9]*: *//p'); do targets+=("$t"); done
  cmake --build "$b" -j"$(nproc)" --target "${targets[@]}" >>"$dir/build.log" 2>&1 ||
    { tail -40 "$dir/build.log"; echo "trixie: build failed"; return 1; }
}

run_config() { # name, env (VAR=value ...); the build is $run_build (default: $build), its
               # programs run through $run_prefix (default: none)
  local name=$1; shift
  local build=${run_build:-$build}
  local log=$cache/ctest-$name.log start p f
  start=$(date +%s)
  env "$@" MESA_SHADER_CACHE_DIR="$cache/cache-$name" KVGEN_VALIDATE=1 \
    ${run_prefix:-} "$build/kvgen" devices 2>&1 | sed -n 1,2p
  env "$@" MESA_SHADER_CACHE_DIR="$cache/cache-$name" KVGEN_VALIDATE=1 \
    ctest --test-dir "$build" --output-on-failure --timeout "$timeout" -R "$tests" >"$log" 2>&1
  p=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed' "$log")
  f=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*(\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|Not Run|Skipped)' "$log")
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
    fetch-trixie) # only the download: gpu_check.sh prepare compiles its shaders with this glslc
      fetch_trixie || failed=$((failed + 1)) ;;
    trixie)
      if fetch_trixie && build_trixie; then
        run_build=$cache/trixie/build run_prefix="$tx_ld --library-path $tx_lib" run_config trixie VK_ICD_FILENAMES="$cache/trixie/lvp_icd.json" \
          VK_LAYER_PATH="$cache/trixie/layers"
      else
        failed=$((failed + 1))
      fi ;;
    *) echo "vk_drivers: unknown configuration $c (sg8, sg4, sg16, mesa25, trixie)"; failed=$((failed + 1)) ;;
  esac
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
