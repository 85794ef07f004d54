#!/usr/bin/env bash
# The device check: kvgen's Vulkan backend on a real GPU, in one command, on a machine that has
# no network and receives the working tree plus one folder of built files (at most 64 MiB).
#
#   bash scripts/gpu_check.sh prepare   here: builds what the check needs into build-gpu/ (kvgen,
#                                       kvgen-mkmodel and the Vulkan test programs, without Lua
#                                       or remote models) and gathers what travels into
#                                       build-gpu/carry (the shaders compiled by Debian 13's
#                                       glslc, downloaded, so that cooperative matrices are
#                                       built): those programs, stripped and packed into one
#                                       xz archive (run unpacks it), the shared
#                                       libraries they need beyond the C library, and Debian's
#                                       Vulkan loader and validation layer (downloaded, extracted,
#                                       nothing installed). Its last line is that folder's path.
#   bash scripts/gpu_check.sh run       there, from the repository root, with build-gpu/carry in
#                                       place: finds the GPU's Vulkan driver, lists the devices,
#                                       runs the Vulkan parity tests with the validation layer
#                                       (synchronization validation included), makes
#                                       random-weight models of the 135M, 1B (q4_k_m) and 3B
#                                       (q4_k_m) shapes, benchmarks each (prompts 512 and 2048,
#                                       decode at depths 0, 2048 and 8192, 1 to 32 sessions),
#                                       logs per-op times (KVGEN_VK_PROFILE; again with the
#                                       subgroup reductions off, KVGEN_VK_SUBGROUP=0; prompts
#                                       again with the GEMM's f32 tiles, KVGEN_VK_HALF=0, and
#                                       with its f16 tiles instead of cooperative matrices,
#                                       KVGEN_VK_COOPMAT=0), writes
#                                       everything to $OUT (else build-gpu/results) and one
#                                       archive of it, gpu-check.tar.gz.
#
# KVGEN_GPU_CHECK_LLAMA=/path/to/llama.cpp (a source tree of llama.cpp, fetched by hand; it is not
# part of kvgen): prepare also builds its llama-bench with the Vulkan backend (static, its
# shaders compiled by that glslc, with trixie's Vulkan and SPIR-V headers) into
# build-gpu/llama, and it travels too; run then benchmarks the 1B q4_k_m model beside it
# (kvgen bench --peer: llama.cpp's Vulkan backend on the same file, same invocation).
#
# KVGEN_GPU_CHECK_TESTS and KVGEN_GPU_CHECK_MODELS (extended regular expressions; default: all)
# choose the test programs and the model shapes (135m, 1b-q4km, 3b-q4km; tiny under QUICK) that
# run takes, so that a second run on the same machine can spend its budget on what the first
# left out (KVGEN_GPU_CHECK_TESTS='^$': no tests, only benchmarks), and a dry run here can reach
# the benchmarks, which lavapipe's slow tests would otherwise leave no time for.
#
# run keeps to a time budget (KVGEN_GPU_CHECK_BUDGET seconds, default 270): the models are made
# in the background while the tests run, every step has a timeout, and a step that would end
# past the budget is skipped and named in the summary. A dry run here works the same on
# lavapipe (KVGEN_GPU_CHECK_QUICK=1 shrinks the models and the benchmark). docs/vulkan.md, "The
# device check", says how to read the results.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
build="$here/build-gpu"
carry="$build/carry"

# llama.cpp's llama-bench with its Vulkan backend, from the source tree $1, built once into
# build-gpu/llama; prints its path (or why it failed)
build_llama() {
  local src=$1 b=$build/llama tx=$build/vk-drivers/trixie
  [ -f "$src/ggml/src/ggml-vulkan/ggml-vulkan.cpp" ] || { echo "$src is not a llama.cpp source tree"; return 1; }
  KVGEN_BUILD_DIR=$build bash "$here/scripts/vk_drivers.sh" fetch-trixie >>"$build.log" 2>&1 ||
    { echo "llama.cpp's Vulkan build needs Debian 13's glslc and headers (no network?)"; return 1; }
  if [ ! -x "$b/bin/llama-bench" ]; then
    cmake -S "$src" -B "$b" -DCMAKE_BUILD_TYPE=Release -DGGML_VULKAN=ON -DGGML_NATIVE=OFF \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DVulkan_GLSLC_EXECUTABLE="$tx/glslc" -DVulkan_INCLUDE_DIR="$tx/root/usr/include" \
      -DCMAKE_PREFIX_PATH="$tx/root/usr" >"$build/llama.log" 2>&1 &&
      cmake --build "$b" -j"$(nproc 2>/dev/null || echo 2)" --target llama-bench >>"$build/llama.log" 2>&1 ||
      { tail -20 "$build/llama.log" >&2; echo "llama.cpp's Vulkan build failed (build-gpu/llama.log)"; return 1; }
  fi
  echo "$b/bin/llama-bench"
}

prepare() {
  local jobs t
  jobs=$(nproc 2>/dev/null || echo 2)
  cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVGEN_LUA=OFF -DKVGEN_REMOTE=OFF \
    -DKVGEN_TEST_MODELS=OFF >"$build.log" 2>&1 || { cat "$build.log"; echo "prepare: cmake failed"; return 1; }
  # the shaders compiled by Debian 13's glslc (scripts/vk_drivers.sh fetch-trixie), whose
  # glslang knows cooperative matrices, so that the GPU gets gemm_cm_<type>; without it (no network)
  # the machine's compiler builds everything else
  local tx=$build/vk-drivers/trixie
  if KVGEN_BUILD_DIR=$build bash "$here/scripts/vk_drivers.sh" fetch-trixie >>"$build.log" 2>&1; then
    cmake -S "$here" -B "$build" -DKVGEN_GLSLC="$tx/glslc" -DKVGEN_SPIRV_VAL="$tx/spirv-val" >>"$build.log" 2>&1 ||
      { cat "$build.log"; echo "prepare: cmake failed"; return 1; }
  fi
  grep "cooperative-matrix GEMM" "$build.log" | tail -1
  local targets=(kvgen_cli kvgen-mkmodel)
  for t in "$here"/core/tests/test_vk_*.c; do targets+=("$(basename "$t" .c)"); done
  cmake --build "$build" -j"$jobs" --target "${targets[@]}" >>"$build.log" 2>&1 ||
    { tail -40 "$build.log"; echo "prepare: build failed"; return 1; }
  local peer=""
  if [ -n "${KVGEN_GPU_CHECK_LLAMA:-}" ]; then
    peer=$(build_llama "$KVGEN_GPU_CHECK_LLAMA") || { echo "prepare: $peer"; return 1; }
  fi
  rm -rf "$carry"
  mkdir -p "$carry/bin" "$carry/lib" "$carry/layers"
  cp "$build/kvgen" "$build/kvgen-mkmodel" "$carry/bin/"
  cp "$build"/core/test_vk_* "$carry/bin/"
  [ -z "$peer" ] || cp "$peer" "$carry/bin/llama-bench"
  strip "$carry"/bin/* 2>/dev/null || true
  # the shared libraries beyond the C library's own (pcre2 today), found by ldd
  local lib
  for lib in $(ldd "$carry"/bin/* 2>/dev/null | awk '/=> \// {print $3}' | sort -u); do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*) ;;
      *) cp -L "$lib" "$carry/lib/" ;;
    esac
  done
  # Debian's Vulkan loader and validation layer: downloaded and extracted, not installed
  local debs="$build/debs"
  rm -rf "$debs"; mkdir -p "$debs/x"
  (cd "$debs" && apt-get download libvulkan1 vulkan-validationlayers >"$debs/download.log" 2>&1) ||
    { cat "$debs/download.log"; echo "prepare: apt-get download failed (apt-get update first?)"; return 1; }
  for t in "$debs"/*.deb; do dpkg -x "$t" "$debs/x"; done
  cp -L "$debs"/x/usr/lib/x86_64-linux-gnu/libvulkan.so.1 "$carry/lib/"
  cp -L "$debs"/x/usr/lib/x86_64-linux-gnu/libVkLayer_khronos_validation.so "$carry/layers/"
  strip "$carry/layers/libVkLayer_khronos_validation.so" 2>/dev/null || true
  # the layer's manifest, pointing at the library beside it (a path relative to the manifest)
  sed 's#"library_path": *"[^"]*"#"library_path": "./libVkLayer_khronos_validation.so"#' \
    "$debs"/x/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json >"$carry/layers/VkLayer_khronos_validation.json"
  # the programs in one xz archive: each embeds the same SPIR-V (about 5 MB), which the archive
  # stores once; run unpacks it
  local mib n
  n=$(ls "$carry/bin" | wc -l)
  tar -C "$carry" -cf - bin | xz -6 >"$carry/bin.tar.xz" && rm -rf "$carry/bin" ||
    { echo "prepare: packing the programs failed"; return 1; }
  mib=$(du -sm "$carry" | awk '{print $1}')
  echo "prepare: $n programs (packed), $(ls "$carry/lib" | wc -l) libraries, the validation layer; ${mib} MiB"
  if [ "$mib" -gt 64 ]; then echo "prepare: ${mib} MiB is over the 64 MiB that may travel"; return 1; fi
  echo "${carry#$here/}"
}

run() {
  local t0 budget quick res
  t0=$(date +%s)
  budget=${KVGEN_GPU_CHECK_BUDGET:-270}
  quick=${KVGEN_GPU_CHECK_QUICK:-0}
  local tests_re=${KVGEN_GPU_CHECK_TESTS-.} models_re=${KVGEN_GPU_CHECK_MODELS-.}
  res=${OUT:-$build/results}
  [ -d "$carry/bin" ] || [ -f "$carry/bin.tar.xz" ] ||
    { echo "run: $carry is missing (scripts/gpu_check.sh prepare makes it)"; return 1; }
  if [ ! -d "$carry/bin" ]; then # tar with xz, else Python's tarfile
    tar -C "$carry" -xJf "$carry/bin.tar.xz" 2>/dev/null ||
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
        "$carry/bin.tar.xz" "$carry" || { rm -rf "$carry/bin"; echo "run: unpacking the programs failed"; return 1; }
  fi
  mkdir -p "$res/tmp"
  exec > >(tee "$res/log.txt") 2>&1
  export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export VK_LAYER_PATH="$carry/layers"
  export KVGEN_BIN="$carry/bin" KVGEN_FIXTURES="$here/core/tests/fixtures" KVGEN_TEST_TMP="$res/tmp"
  local skipped=() failed=() passed=0
  left() { echo $((budget - ($(date +%s) - t0))); }
  # the GPU's driver: a vendor ICD manifest, else NVIDIA's driver library by name
  if [ -z "${VK_ICD_FILENAMES:-}" ]; then
    local icd="" f dirs=(/usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d)
    for f in "${dirs[@]/%//nvidia*.json}"; do [ -e "$f" ] && icd="${icd:+$icd:}$f"; done
    if [ -z "$icd" ] && { ldconfig -p 2>/dev/null | grep -q libGLX_nvidia.so.0 || ls /usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.0 >/dev/null 2>&1; }; then
      icd="$res/nvidia_icd.json"
      printf '{"file_format_version": "1.0.0", "ICD": {"library_path": "libGLX_nvidia.so.0", "api_version": "1.3"}}\n' >"$icd"
    fi
    if [ -z "$icd" ]; then # another vendor's: every manifest but the CPU driver's
      for f in "${dirs[@]/%//*.json}"; do
        case "$f" in *lvp*|*lavapipe*) ;; *) [ -e "$f" ] && icd="${icd:+$icd:}$f" ;; esac
      done
    fi
    if [ -n "$icd" ]; then export VK_ICD_FILENAMES="$icd"; echo "driver manifests: $icd"; else echo "driver manifests: the system's (no GPU driver manifest found)"; fi
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv 2>/dev/null || true
  "$carry/bin/kvgen" devices

  # the models, made in the background while the tests run
  local shapes
  if [ "$quick" = 1 ]; then
    shapes=("tiny|--layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --vocab-size 2000 --mix q4_k_m")
  else
    shapes=("135m|--layers 30 --embd 576 --ff 1536 --heads 9 --kv-heads 3 --vocab-size 49152 --type Q4_1"
            "1b-q4km|--layers 16 --embd 2048 --ff 8192 --heads 32 --kv-heads 8 --vocab-size 128256 --mix q4_k_m"
            "3b-q4km|--layers 28 --embd 3072 --ff 8192 --heads 24 --kv-heads 8 --vocab-size 128256 --mix q4_k_m")
  fi
  local s name args pids=() chosen=()
  for s in "${shapes[@]}"; do [[ ${s%%|*} =~ $models_re ]] && chosen+=("$s"); done
  [ ${#chosen[@]} -eq ${#shapes[@]} ] || echo "models: ${#chosen[@]} of ${#shapes[@]} (KVGEN_GPU_CHECK_MODELS=$models_re)"
  shapes=("${chosen[@]}")
  for s in "${shapes[@]}"; do
    name=${s%%|*}; args=${s#*|}
    # shellcheck disable=SC2086
    (timeout "$(left)" "$carry/bin/kvgen-mkmodel" -o "$res/tmp/$name.gguf" $args >"$res/mkmodel-$name.log" 2>&1 &&
       echo done >"$res/tmp/$name.ok") &
    pids+=($!)
  done

  # the Vulkan parity tests, with validation; any validation message fails a test (they leave
  # the benchmarks `reserve` seconds of the budget). The carried layer (Debian 12's, Vulkan
  # 1.3.239) predates VK_KHR_cooperative_matrix, so these runs leave it off the device
  # (KVGEN_VK_COOPMAT=0) and the kernel and model tests run once more without the layer, with
  # the cooperative-matrix GEMM where the GPU offers it
  local tst out rc reserve=150
  [ "$quick" = 1 ] && reserve=30
  local left_out=0
  for tst in "$carry"/bin/test_vk_*; do
    name=$(basename "$tst")
    [[ $name =~ $tests_re ]] || { left_out=$((left_out + 1)); continue; }
    if [ "$(left)" -lt "$reserve" ]; then skipped+=("$name"); continue; fi
    out="$res/$name.log"
    KVGEN_VK_COOPMAT=0 KVGEN_VALIDATE=1 timeout 120 "$tst" >"$out" 2>&1; rc=$?
    if [ $rc -eq 77 ]; then echo "$name: skipped ($(tail -1 "$out"))"; continue; fi
    if [ $rc -ne 0 ] || grep -q "kvgen: vulkan validation:" "$out"; then
      failed+=("$name"); echo "$name: FAILED (exit $rc)"; grep -m5 "vulkan validation:\|CHECK failed" "$out"
    else
      passed=$((passed + 1)); echo "$name: passed ($(tail -1 "$out"))"
    fi
  done

  [ "$left_out" -eq 0 ] || echo "tests: $left_out programs left out (KVGEN_GPU_CHECK_TESTS=$tests_re)"
  for name in test_vk_kernels test_vk_model; do
    [[ $name =~ $tests_re ]] || continue
    if [ "$(left)" -lt "$reserve" ]; then skipped+=("$name (cooperative matrices)"); continue; fi
    out="$res/$name-coopmat.log"
    timeout 120 "$carry/bin/$name" >"$out" 2>&1; rc=$?
    if [ $rc -eq 77 ]; then echo "$name (cooperative matrices): skipped"; continue; fi
    if [ $rc -ne 0 ]; then
      failed+=("$name-coopmat"); echo "$name (cooperative matrices): FAILED (exit $rc)"; grep -m5 "CHECK failed" "$out"
    else
      passed=$((passed + 1)); echo "$name (cooperative matrices): passed ($(grep -m1 "cooperative-matrix" "$out"))"
    fi
  done

  # each model as it is ready: the benchmark, then one profiled generation
  local bargs=(--backend vulkan --prompts 512,2048 --depths 0,2048,8192 --sessions 1,2,4,8,16,32 --reps 2 --steps 16)
  [ "$quick" = 1 ] && bargs=(--backend vulkan --quick --sessions 1,4)
  # llama.cpp's Vulkan backend beside kvgen on one model, where prepare carried its llama-bench
  local peer_model=1b-q4km
  [ "$quick" = 1 ] && peer_model=tiny
  local fargs=(--backend vulkan --prompts 512,2048 --depths 0 --sessions 1 --reps 2 --steps 4)
  [ "$quick" = 1 ] && fargs=(--backend vulkan --quick --depths 0 --sessions 1)
  for i in "${!shapes[@]}"; do
    name=${shapes[$i]%%|*}
    wait "${pids[$i]}" 2>/dev/null
    if [ ! -e "$res/tmp/$name.ok" ]; then skipped+=("model $name (not made in time: $(tail -1 "$res/mkmodel-$name.log" 2>/dev/null))"); continue; fi
    if [ "$(left)" -lt 40 ]; then skipped+=("bench $name"); continue; fi
    echo "== $name"
    local peer=()
    [ "$name" = "$peer_model" ] && [ -x "$carry/bin/llama-bench" ] && peer=(--peer "$carry/bin/llama-bench")
    timeout "$(( $(left) - 20 ))" "$carry/bin/kvgen" bench "$res/tmp/$name.gguf" "${bargs[@]}" "${peer[@]}" \
      --json "$res/bench-$name.json" 2>&1 | tee "$res/bench-$name.txt" | tail -40
    [ "${PIPESTATUS[0]}" -eq 0 ] || skipped+=("bench $name (ended early: timeout or error)")
    if [ "$(left)" -gt 15 ]; then
      KVGEN_VK_PROFILE=1 timeout 15 "$carry/bin/kvgen" generate "$res/tmp/$name.gguf" --backend vulkan \
        -p "the quick brown fox" -n 8 --ignore-eos >"$res/profile-$name.txt" 2>&1
      grep -i "ms" "$res/profile-$name.txt" | tail -12
    fi
    if [ "$(left)" -gt 15 ]; then # 8-bit activations: the integer-dot mat-vecs and GEMMs where the GPU has them fast
      KVGEN_VK_PROFILE=1 timeout 15 "$carry/bin/kvgen" generate "$res/tmp/$name.gguf" --backend vulkan \
        --activation-bits 8 -p "the quick brown fox" -n 8 --ignore-eos >"$res/profile-$name-act8.txt" 2>&1
      echo "-- --activation-bits 8:"; grep -i "ms" "$res/profile-$name-act8.txt" | tail -12
    fi
    if [ "$(left)" -gt 40 ]; then # the prefill GEMM's f32 tiles beside the f16 ones above
      KVGEN_VK_HALF=0 timeout 30 "$carry/bin/kvgen" bench "$res/tmp/$name.gguf" "${fargs[@]}" \
        >"$res/bench-$name-f32tiles.txt" 2>&1
      echo "-- KVGEN_VK_HALF=0 (the GEMM's f32 tiles):"; grep -i "prompt" "$res/bench-$name-f32tiles.txt" | tail -4
    fi
    if [ "$(left)" -gt 40 ]; then # the f16 tiles beside the cooperative-matrix GEMM (where the GPU has it)
      KVGEN_VK_COOPMAT=0 timeout 30 "$carry/bin/kvgen" bench "$res/tmp/$name.gguf" "${fargs[@]}" \
        >"$res/bench-$name-nocoopmat.txt" 2>&1
      echo "-- KVGEN_VK_COOPMAT=0 (the GEMM's f16 tiles):"; grep -i "prompt" "$res/bench-$name-nocoopmat.txt" | tail -4
    fi
    if [ "$(left)" -gt 15 ]; then # the same with the shared-memory reductions instead of subgroup ones
      KVGEN_VK_SUBGROUP=0 KVGEN_VK_PROFILE=1 timeout 15 "$carry/bin/kvgen" generate "$res/tmp/$name.gguf" \
        --backend vulkan -p "the quick brown fox" -n 8 --ignore-eos >"$res/profile-$name-nosubgroup.txt" 2>&1
      echo "-- KVGEN_VK_SUBGROUP=0:"; grep -i "ms" "$res/profile-$name-nosubgroup.txt" | tail -12
    fi
  done
  rm -f "$res"/tmp/*.gguf
  echo "== summary: $passed tests passed, ${#failed[@]} failed${failed[*]:+ (${failed[*]})}; $(( $(date +%s) - t0 )) s"
  for s in "${skipped[@]}"; do echo "skipped: $s"; done
  local archive
  archive=$(mktemp)
  tar czf "$archive" -C "$res" --exclude ./tmp . 2>/dev/null && mv "$archive" "$res/gpu-check.tar.gz"
  [ ${#failed[@]} -eq 0 ]
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: bash scripts/gpu_check.sh prepare|run"; exit 2 ;;
esac
