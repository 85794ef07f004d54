#!/usr/bin/env bash
# kvgen's whole test suite: builds (warnings as errors), runs the C tests with the Vulkan
# validation layer on, runs them again under ASan+UBSan, then the busted specs on the release
# build and again on the sanitizer build.
# The last line is "N passed, N failed" over everything that ran.
#   KVGEN_TEST_QUICK=1   skip the sanitizer pass and the specs tagged #model
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
jobs=$(nproc 2>/dev/null || echo 2)
passed=0
failed=0
log_dir="$here/build/test-logs"

# count ctest's per-test result lines; skipped tests are neither passed nor failed
count_ctest() {
  local log=$1 p f
  p=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed' "$log")
  f=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*(\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|Not Run)' "$log")
  passed=$((passed + p)); failed=$((failed + f))
  echo "ctest ($2): $p passed, $f failed"
}

build() { # dir, extra cmake args...
  local dir=$1; shift
  cmake -S "$here" -B "$dir" -DKVGEN_WERROR=ON "$@" >/dev/null &&
    cmake --build "$dir" -j"$jobs" >"$dir.build.log" 2>&1 || { cat "$dir.build.log"; return 1; }
}

mkdir -p "$log_dir"
# the Lua module and the CLI keep a Vulkan pipeline cache in the user's cache folder by default;
# tests keep theirs inside the build tree
export KVGEN_PIPELINE_CACHE="$here/build/test-pipelines-{device}.bin"
if build "$here/build"; then
  KVGEN_VALIDATE=1 ctest --test-dir "$here/build" --output-on-failure -j"$jobs" 2>&1 | tee "$log_dir/ctest.log"
  count_ctest "$log_dir/ctest.log" "validation on"
else
  echo "build failed"; failed=$((failed + 1))
fi

if [ "${KVGEN_TEST_QUICK:-0}" != 1 ]; then
  if build "$here/build-asan" -DKVGEN_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo; then
    asan_built=1
    # Mesa's lavapipe leaks a few bytes that LeakSanitizer can only see after the Vulkan loader
    # has unloaded the driver (reported from "<unknown module>"); keeping the driver loaded for
    # the whole process (preload) stops that false report while kvgen's own leaks still show.
    lvp=$(ls /usr/lib/*/libvulkan_lvp.so 2>/dev/null | head -n 1)
    LD_PRELOAD=${lvp} ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:verify_asan_link_order=0 \
      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      ctest --test-dir "$here/build-asan" --output-on-failure -j"$jobs" -LE slow 2>&1 | tee "$log_dir/ctest-asan.log"
    count_ctest "$log_dir/ctest-asan.log" "ASan+UBSan"
  else
    echo "sanitizer build failed"; failed=$((failed + 1))
  fi
fi

# busted over spec/: counts TAP lines; a run that dies part-way (a sanitizer report, a crash)
# counts as one more failure, since the tests it never reached printed nothing
run_busted() { # label, build dir, log name, extra env (VAR=value ...)
  local label=$1 dir=$2 log="$log_dir/$3"; shift 3
  local tags=() rc=0 bp bf plan
  [ "${KVGEN_TEST_QUICK:-0}" = 1 ] && tags=(--exclude-tags=model)
  env "$@" KVGEN_BUILD="$dir" lua5.4 /usr/bin/busted "${tags[@]}" -o TAP >"$log" 2>&1 || rc=$?
  cat "$log"
  bp=$(grep -cE '^ok ' "$log")
  bf=$(grep -cE '^not ok ' "$log")
  plan=$(sed -n 's/^1\.\.\([0-9][0-9]*\)$/\1/p' "$log" | tail -n 1)
  if [ "$bp" -eq 0 ] && [ "$bf" -eq 0 ]; then bf=1; echo "busted ($label) ran nothing"; fi
  if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$log"; then
    bf=$((bf + 1)); echo "busted ($label): sanitizer report"
  elif [ "$rc" -ne 0 ] && [ "$bf" -eq 0 ]; then
    bf=1; echo "busted ($label) exited with status $rc"
  elif [ -z "$plan" ] || [ $((bp + bf)) -lt "$plan" ]; then
    bf=$((bf + 1)); echo "busted ($label) stopped before its last test"
  fi
  passed=$((passed + bp)); failed=$((failed + bf))
  echo "busted ($label): $bp passed, $bf failed"
}

if ls spec/*_spec.lua >/dev/null 2>&1; then
  run_busted "release" "$here/build" busted.log
  if [ "${asan_built:-0}" = 1 ] && [ -f "$here/build-asan/kvgen.so" ]; then
    # lua5.4 itself is not instrumented: the sanitizer runtimes are preloaded ahead of it, with
    # lavapipe kept loaded as for ctest above
    run_busted "ASan+UBSan" "$here/build-asan" busted-asan.log \
      LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so) ${lvp:-}" \
      ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:verify_asan_link_order=0 \
      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
