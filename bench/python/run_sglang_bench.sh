#!/usr/bin/env bash
# Builds libtokenmeter's Python extension (release) and runs the
# tokenmeter-sglang benchmark (bench/python/sglang_follower_bench.py): us
# per record of the follower beside SGLang's own Prometheus logger for the
# same requests, and PASS/MISS for the goal (docs/performance.md,
# "tokenmeter-sglang").
#
# Usage: bench/python/run_sglang_bench.sh [BUILD_DIR] [-- BENCH_ARGS...]
#   BUILD_DIR   default build-bench-py in the source tree (shared with
#               run_bench_shim.sh); configured with buildtype=release.
#   BENCH_ARGS  e.g. --reps 9 --records 8192 --json FILE
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
ninja -C "$build" "$pkg/_native.$(/usr/bin/python3 -c \
     'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX")[1:])')" \
  "$pkg/__init__.py" "$pkg/__init__.pyi" "$pkg/_common.py" "$pkg/_lib.py" \
  "$pkg/_native_client.py" "$pkg/client.py" "$pkg/py.typed" \
  "$pkg/integrations/__init__.py" "$pkg/integrations/sglang.py" >/dev/null

echo "source: $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')"
TOKENMETER_BACKEND=native PYTHONPATH="$build/client_lib/python" \
  /usr/bin/python3 "$src/bench/python/sglang_follower_bench.py" "$@"
