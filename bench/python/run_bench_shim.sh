#!/usr/bin/env bash
# Builds libtokenmeter (release) and runs the Python shim benchmark
# (bench/python/bench_shim.py): ns per event of the shim's calls beside
# prometheus_client's Histogram.observe, and PASS/MISS for each goal
# (docs/performance.md, "Python shim").
#
# Usage: bench/python/run_bench_shim.sh [BUILD_DIR] [-- BENCH_ARGS...]
#   BUILD_DIR   default build-bench-py in the source tree; configured with
#               buildtype=release; only the shared library is built.
#   BENCH_ARGS  e.g. --reps 7 --min-time 0.2 --json FILE
#
# Exit status: non-zero when building fails or the run is invalid (events
# dropped or rejected). A missed goal is reported as MISS and exits 0.
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$src/build-bench-py"
if [[ $# -gt 0 && "$1" != "--" ]]; then
  build="$1"
  shift
fi
if [[ $# -gt 0 && "$1" == "--" ]]; then shift; fi

if [[ -f "$build/build.ninja" ]]; then
  meson configure "$build" -Dbuildtype=release
else
  meson setup "$build" "$src" --buildtype=release -Dtests=disabled
fi
meson compile -C "$build" tokenmeter:shared_library

echo "source: $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')" \
     "$(git -C "$src" diff --quiet HEAD -- client_lib 2>/dev/null \
        || echo '(client_lib modified)')"
TOKENMETER_LIBRARY="$build/client_lib/libtokenmeter.so" \
PYTHONPATH="$src/client_lib/python" \
  exec /usr/bin/python3 "$src/bench/python/bench_shim.py" "$@"
