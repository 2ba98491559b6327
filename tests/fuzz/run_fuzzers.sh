#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-14, ASan + UBSan, code under test with
# -fsanitize=fuzzer-no-link) and runs each for a fixed number of executions
# over its seed corpus, the targets side by side (one per CPU). New inputs
# go to a scratch directory, never into the committed corpus. Exits
# non-zero when a target met a crash, leak, UB report or timeout (libFuzzer
# writes the input as crash-*/leak-*/timeout-* in the current directory).
#
# Usage: tests/fuzz/run_fuzzers.sh [BUILD_DIR] [EXECS] [TARGET...]
#   BUILD_DIR default build-fuzz, EXECS default 200000 (the CI smoke),
#   TARGETs default: frame_decoder http_server negotiation
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-fuzz}
execs=${2:-200000}
shift $(( $# > 2 ? 2 : $# ))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(frame_decoder http_server negotiation)

if [ ! -f "$build/build.ninja" ]; then
  CC=clang-14 CXX=clang++-14 meson setup "$build" \
    -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
    -Dc_args=-fno-sanitize-recover=all -Dcpp_args=-fno-sanitize-recover=all \
    -Dtests=disabled -Dcuda=disabled -Dsystemd=disabled \
    --buildtype=debugoptimized >/dev/null
fi
ninja -C "$build" "${targets[@]/#/tests/fuzz/fuzz_}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
scratch=$(mktemp -d /tmp/tm-fuzz-XXXXXX)
trap 'rm -rf "$scratch"' EXIT
# The targets run side by side, at most one per CPU (the longest,
# frame_decoder, sets the time), and are reported in the order given.
cpus=$(nproc 2>/dev/null || echo 1)
run_one() {
  local t=$1 log="$scratch/$1.log" start end result runs cov
  mkdir -p "$scratch/$t"
  start=$(date +%s.%N)
  if "$build/tests/fuzz/fuzz_$t" -runs="$execs" -timeout=10 \
      -print_final_stats=1 "$scratch/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1
  then result=ok; else result=FAILED; fi
  end=$(date +%s.%N)
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" |
         grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  printf '%s: %s, %s execs in %.1f s (%s)\n' "$t" "$result" "$runs" \
    "$(awk "BEGIN{print $end - $start}")" "$cov" >"$scratch/$t.result"
  [ "$result" = ok ] || tail -40 "$log" >>"$scratch/$t.result"
}
pids=()
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$cpus" ]; do wait -n || true; done
  run_one "$t" &
  pids+=($!)
done
wait "${pids[@]}" || true
status=0
for t in "${targets[@]}"; do
  if [ -f "$scratch/$t.result" ]; then
    cat "$scratch/$t.result"
  else
    echo "$t: FAILED, no result"
  fi
  grep -q "^$t: ok," "$scratch/$t.result" 2>/dev/null || status=1
done
exit $status
