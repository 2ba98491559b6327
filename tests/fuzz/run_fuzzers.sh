#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-14, ASan + UBSan, code under test with
# -fsanitize=fuzzer-no-link) and runs each for a fixed number of executions
# over its seed corpus. New inputs go to a scratch directory, never into the
# committed corpus. Exits non-zero on the first crash, leak, UB report or
# timeout (libFuzzer writes the input as crash-*/leak-*/timeout-* in the
# current directory).
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
status=0
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t"
  start=$(date +%s.%N)
  log="$scratch/$t.log"
  if "$build/tests/fuzz/fuzz_$t" -runs="$execs" -timeout=10 \
      -print_final_stats=1 "$scratch/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1
  then result=ok; else result=FAILED; status=1; fi
  end=$(date +%s.%N)
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" |
         grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  printf '%s: %s, %s execs in %.1f s (%s)\n' "$t" "$result" "$runs" \
    "$(awk "BEGIN{print $end - $start}")" "$cov"
  [ "$result" = ok ] || tail -40 "$log"
done
exit $status
