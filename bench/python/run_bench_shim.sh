#!/usr/bin/env bash
# Builds libtokenmeter and the Python extension (release) and runs the
# Python binding benchmark (bench/python/bench_shim.py): ns per event of the
# binding's calls beside prometheus_client's Histogram.observe, and
# PASS/MISS for each goal (docs/performance.md, "Python binding").
#
# Usage: bench/python/run_bench_shim.sh [BUILD_DIR] [-- BENCH_ARGS...]
#   BUILD_DIR   default build-bench-py in the source tree; configured with
#               buildtype=release; only the library and the extension are
#               built.
#   BENCH_ARGS  e.g. --reps 7 --min-time 0.2 --json FILE
#   BACKENDS    (environment) the implementations to run, in turn: "native"
#               (default: tokenmeter._native, the C extension), "ctypes",
#               or "native ctypes".
#   NO_BUILD=1  (environment) use BUILD_DIR as it is, built already
#               (bench/run_all.sh --no-build).
#   BENCH       (environment) the script of bench/python to run (default
#               bench_shim.py; run_bench_lmdeploy.sh sets bench_lmdeploy.py,
#               run_sglang_bench.sh sglang_follower_bench.py).
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

if [[ "${NO_BUILD:-0}" != 1 ]]; then
  if [[ -f "$build/build.ninja" ]]; then
    meson configure "$build" -Dbuildtype=release
  else
    meson setup "$build" "$src" --buildtype=release -Dtests=disabled
  fi
  # The library, the extension and the build folder's copy of the package.
  pkg=client_lib/python/tokenmeter
  meson compile -C "$build" tokenmeter:shared_library >/dev/null
  ninja -C "$build" "$pkg/_native.$(/usr/bin/python3 -c \
       'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX")[1:])')" \
    "$pkg/__init__.py" "$pkg/__init__.pyi" "$pkg/_common.py" "$pkg/_lib.py" \
    "$pkg/_native_client.py" "$pkg/client.py" "$pkg/py.typed" \
    "$pkg/integrations/__init__.py" "$pkg/integrations/lmdeploy.py" \
    "$pkg/integrations/vllm.py" "$pkg/integrations/sglang.py" >/dev/null
fi

echo "source: $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')" \
     "$(git -C "$src" diff --quiet HEAD -- client_lib 2>/dev/null \
        || echo '(client_lib modified)')"
status=0
for backend in ${BACKENDS:-native}; do
  case "$backend" in
    native)
      TOKENMETER_BACKEND=native PYTHONPATH="$build/client_lib/python" \
        /usr/bin/python3 "$src/bench/python/${BENCH:-bench_shim.py}" "$@" || status=1 ;;
    ctypes)
      TOKENMETER_BACKEND=ctypes \
      TOKENMETER_LIBRARY="$build/client_lib/libtokenmeter.so" \
      PYTHONPATH="$src/client_lib/python" \
        /usr/bin/python3 "$src/bench/python/${BENCH:-bench_shim.py}" "$@" || status=1 ;;
    *) echo "BACKENDS: unknown '$backend'" >&2; exit 2 ;;
  esac
done
exit $status
