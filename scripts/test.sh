#!/usr/bin/env bash
# Installs what is missing, builds with warnings as errors, runs every test,
# the client tests under TSan, the hostile suite under ASan+UBSan, the style
# check and the fuzz smoke, and ends with the line
# "N passed, N failed, N skipped".
# Usage: scripts/test.sh [BUILD_DIR] (default: build-test)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-test}

# Each step's wall time, printed before the closing line ("times: install
# 12 s, build 378 s, ...": docs/testing.md, "How long CI takes").
times=()
step_start=$SECONDS
step_done() {  # NAME
  times+=("$1 $((SECONDS - step_start)) s")
  step_start=$SECONDS
}

scripts/install-deps.sh
step_done install
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dwerror=true --buildtype=debugoptimized >/dev/null
fi
ninja -C "$build"
step_done build
status=0
# Every suite, 'packaging' (tests/install/deb_test.py: dpkg-buildpackage
# and lintian, run alone) included; TOKENMETER_PACKAGING=0 leaves it out.
suites=()
[ "${TOKENMETER_PACKAGING:-1}" != 0 ] || suites=(--no-suite packaging)
meson test -C "$build" --print-errorlogs --num-processes 2 "${suites[@]}" ||
  status=$?
step_done tests

# Results beyond meson's, one "name ok|FAILED" per line, for the summary.
extra_results="$build/extra-test-results.txt"
rm -f "$extra_results"
touch "$extra_results"

# Sanitizer runs, each in a build dir of its own beside "$build", building
# only what its suite needs; their tests count in the summary as tsan/NAME
# and asan/NAME.
sanitizer_builds=()
sanitizer_setup() {  # DIR SANITIZERS [MESON ARGS...]
  local dir=$1 sanitizers=$2
  shift 2
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" -Dwerror=true --buildtype=debugoptimized \
      -Db_sanitize="$sanitizers" -Db_lundef=false "$@" >/dev/null
  fi
}

# The client library's tests under ThreadSanitizer (suite client_lib: the
# close race, fork, threads, sender, ...). TOKENMETER_TSAN=0 skips it.
if [ "${TOKENMETER_TSAN:-1}" != 0 ]; then
  echo "tsan: building the client_lib tests in $build-tsan"
  tsan_targets=()
  if sanitizer_setup "$build-tsan" thread; then
    mapfile -t tsan_targets < <(ninja -C "$build-tsan" -t targets all |
      grep -oE '^tests/client_lib/client_lib_[a-z_]+_test' | sort -u)
  fi
  if [ "${#tsan_targets[@]}" -gt 0 ] &&
    ninja -C "$build-tsan" "${tsan_targets[@]}"; then
    TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1} \
      meson test -C "$build-tsan" --no-rebuild --print-errorlogs \
      --num-processes 2 --suite client_lib || status=$?
    sanitizer_builds+=("tsan=$build-tsan")
  else
    echo "tsan/build FAILED" >>"$extra_results"
    status=1
  fi
  step_done tsan
fi

# The hostile suite (tests/hostile) against a tokenmeterd built with
# AddressSanitizer and UndefinedBehaviorSanitizer; any report stops the
# daemon, which fails the case. Built with clang-14, as the fuzz smoke is:
# gcc's ASan+UBSan build of the daemon took 8 minutes of a CI run on 2
# cores, clang's takes 2. TOKENMETER_ASAN_HOSTILE=0 skips it.
if [ "${TOKENMETER_ASAN_HOSTILE:-1}" != 0 ]; then
  echo "asan: building tokenmeterd in $build-asan for the hostile suite"
  if CC=clang-14 CXX=clang++-14 sanitizer_setup "$build-asan" \
    address,undefined -Dc_args=-fno-sanitize-recover=all \
    -Dcpp_args=-fno-sanitize-recover=all &&
    ninja -C "$build-asan" daemon/tokenmeterd; then
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
      meson test -C "$build-asan" --no-rebuild --print-errorlogs \
      --num-processes 2 --suite hostile || status=$?
    sanitizer_builds+=("asan=$build-asan")
  else
    echo "asan/build FAILED" >>"$extra_results"
    status=1
  fi
  step_done asan
fi

# The style check (scripts/check-style.sh): clang-format on the C/C++ files
# changed since the start of the change (the merge base with origin/main,
# so every commit of a push; HEAD~1 without origin/main or on it; every
# file in a clone without that commit; TOKENMETER_STYLE_BASE overrides),
# clang-tidy on the changed lines of all the shipped .cpp files among them
# (0.3 to 10 s a file on 2 cores, two at a time: see the script's header;
# TOKENMETER_TIDY_MAX_FILES caps it); one test in the summary.
# TOKENMETER_STYLE_CHECK=0 skips it.
if [ "${TOKENMETER_STYLE_CHECK:-1}" != 0 ]; then
  style_log="$build/style-check.log"
  if scripts/check-style.sh -p "$build" >"$style_log" 2>&1; then
    echo "style ok" >>"$extra_results"
    grep -E '^(clang-format|clang-tidy):' "$style_log" || true
  else
    echo "style FAILED" >>"$extra_results"
    status=1
    cat "$style_log"
  fi
  step_done style
fi

# The libFuzzer smoke (tests/fuzz/run_fuzzers.sh): its own clang ASan+UBSan
# build in "$build-fuzz", 200,000 executions per target; each target counts
# as one test in the summary. TOKENMETER_FUZZ_SMOKE=0 skips it.
fuzz_results="$build/fuzz-smoke-results.txt"
rm -f "$fuzz_results"
if [ "${TOKENMETER_FUZZ_SMOKE:-1}" != 0 ]; then
  fuzz_log="$build/fuzz-smoke.log"
  echo "fuzz smoke: building $build-fuzz and running 200000 executions per target"
  tests/fuzz/run_fuzzers.sh "$build-fuzz" 200000 >"$fuzz_log" 2>&1 || status=1
  grep -E '^[a-z_]+: (ok|FAILED),' "$fuzz_log" >"$fuzz_results.lines" || true
  cat "$fuzz_results.lines"
  sed -E 's/^([a-z_]+): (ok|FAILED),.*/fuzz_smoke_\1 \2/' \
    "$fuzz_results.lines" >"$fuzz_results"
  if [ ! -s "$fuzz_results" ]; then
    echo "fuzz_smoke_build FAILED" >"$fuzz_results"
    tail -40 "$fuzz_log"
  elif grep -q FAILED "$fuzz_results"; then
    cat "$fuzz_log"
  fi
  step_done fuzz
fi
if [ -f "$fuzz_results" ]; then
  cat "$fuzz_results" >>"$extra_results"
fi
more=()
for b in "${sanitizer_builds[@]}"; do more+=(--also "$b"); done
joined=$(printf ', %s' "${times[@]}")
echo "times: ${joined:2}; in all $SECONDS s"
/usr/bin/python3 scripts/summarize-tests.py "$build" "$extra_results" \
  "${more[@]}" || status=1
exit $status
