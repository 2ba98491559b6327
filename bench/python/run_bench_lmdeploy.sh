#!/usr/bin/env bash
# Builds libtokenmeter and the Python extension (release) and runs the
# LMDeploy adapter benchmark (bench/python/bench_lmdeploy.py): the cost of
# tokenmeter's LMDeploy stat logger beside LMDeploy's own
# PrometheusStatLogger (the stand-in's) for the same stats, per record_*
# call and for a whole pass, and PASS/MISS for the goal (ratio <= 1.0;
# docs/performance.md, "LMDeploy adapter").
#
# Usage: bench/python/run_bench_lmdeploy.sh [BUILD_DIR] [-- BENCH_ARGS...]
#   BUILD_DIR   default build-bench-py in the source tree (shared with
#               run_bench_shim.sh); configured with buildtype=release.
#   BENCH_ARGS  e.g. --reps 7 --json FILE
#   BACKENDS    (environment) "native" (default), "ctypes", or both.
#
# Exit status: non-zero when building fails or the run is invalid (events
# dropped or rejected, or an error in the logger). A missed goal is MISS
# and exits 0.
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
pkg=client_lib/python/tokenmeter
meson compile -C "$build" tokenmeter:shared_library >/dev/null
ninja -C "$build" "$pkg/_native.$(/usr/bin/python3 -c \
     'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX")[1:])')" \
  "$pkg/__init__.py" "$pkg/__init__.pyi" "$pkg/_common.py" "$pkg/_lib.py" \
  "$pkg/_native_client.py" "$pkg/client.py" "$pkg/py.typed" \
  "$pkg/integrations/__init__.py" "$pkg/integrations/lmdeploy.py" >/dev/null

echo "source: $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')" \
     "$(git -C "$src" diff --quiet HEAD -- client_lib 2>/dev/null \
        || echo '(client_lib modified)')"
status=0
for backend in ${BACKENDS:-native}; do
  case "$backend" in
    native)
      TOKENMETER_BACKEND=native PYTHONPATH="$build/client_lib/python" \
        /usr/bin/python3 "$src/bench/python/bench_lmdeploy.py" "$@" \
        || status=1 ;;
    ctypes)
      TOKENMETER_BACKEND=ctypes \
      TOKENMETER_LIBRARY="$build/client_lib/libtokenmeter.so" \
      PYTHONPATH="$src/client_lib/python" \
        /usr/bin/python3 "$src/bench/python/bench_lmdeploy.py" "$@" \
        || status=1 ;;
    *) echo "BACKENDS: unknown '$backend'" >&2; exit 2 ;;
  esac
done
exit $status
