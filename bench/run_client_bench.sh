#!/usr/bin/env bash
# Builds and runs the libtokenmeter client benchmark (bench/client_bench.cpp)
# and prints median ns per call for each case, the ratio to prometheus-cpp's
# Histogram::Observe, and PASS/MISS for each goal (docs/performance.md).
#
# Usage: bench/run_client_bench.sh [BUILD_DIR] [-- EXTRA_BENCHMARK_ARGS...]
#   BUILD_DIR    default build-bench in the source tree; configured with
#                buildtype=release (an existing one is switched to release).
# Environment:
#   RUNS=1         whole benchmark runs; the summary takes the median of runs
#   REPETITIONS=10 --benchmark_repetitions per run (median aggregate used)
#   MIN_TIME=0.2   --benchmark_min_time, seconds per repetition
#   STATIC=1       also run the tm_tokens cases linked against the static
#                  library (0: skip)
#
# Exit status: non-zero when building or running fails, or when a run is
# invalid (a benchmark errored, events were dropped). A missed goal is a
# measurement, reported as MISS, and still exits 0.
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$src/build-bench"
if [[ $# -gt 0 && "$1" != "--" ]]; then
  build="$1"
  shift
fi
if [[ $# -gt 0 && "$1" == "--" ]]; then shift; fi
extra=("$@")

runs="${RUNS:-1}"
repetitions="${REPETITIONS:-10}"
min_time="${MIN_TIME:-0.2}"
static="${STATIC:-1}"
python=/usr/bin/python3
[[ -x "$python" ]] || python=python3

if [[ -f "$build/build.ninja" ]]; then
  meson configure "$build" -Dbuildtype=release
else
  meson setup "$build" "$src" --buildtype=release -Dtests=disabled
fi
targets=(bench/client_bench)
if [[ "$static" == 1 ]]; then targets+=(bench/client_bench_static); fi
if ! meson compile -C "$build" "${targets[@]}"; then
  echo "run_client_bench: build failed (is Google Benchmark installed?" \
       "meson skips bench/ without it)" >&2
  exit 1
fi

echo
echo "machine: $(nproc) CPUs," \
     "$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "source:  $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')" \
     "$(git -C "$src" diff --quiet HEAD -- client_lib 2>/dev/null \
        || echo '(client_lib modified)')"

common=(--benchmark_repetitions="$repetitions"
        --benchmark_min_time="$min_time"
        --benchmark_display_aggregates_only=true
        --benchmark_out_format=json)
rm -f "$build"/client_bench.run*.json "$build"/client_bench_static.run*.json
jsons=()
static_jsons=()
for ((i = 1; i <= runs; i++)); do
  echo
  echo "== run $i of $runs (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  out="$build/client_bench.run$i.json"
  "$build/bench/client_bench" "${common[@]}" --benchmark_out="$out" \
      "${extra[@]}"
  jsons+=("$out")
  if [[ "$static" == 1 ]]; then
    out="$build/client_bench_static.run$i.json"
    "$build/bench/client_bench_static" "${common[@]}" \
        --benchmark_filter='^tm_tokens/' --benchmark_out="$out" "${extra[@]}"
    static_jsons+=("$out")
  fi
done

echo
if [[ "$static" == 1 ]]; then
  "$python" "$src/bench/client_bench_summary.py" "${jsons[@]}" \
      --static "${static_jsons[@]}"
else
  "$python" "$src/bench/client_bench_summary.py" "${jsons[@]}"
fi
