#!/usr/bin/env bash
# Builds libtokenmeter's Python extension (release) and runs the
# tokenmeter-sglang benchmark (bench/python/sglang_follower_bench.py): us
# per record of the follower beside SGLang's own Prometheus logger for the
# same requests, and PASS/MISS for the goal (docs/performance.md,
# "tokenmeter-sglang"). The build is run_bench_shim.sh's.
#
# Usage: bench/python/run_sglang_bench.sh [BUILD_DIR] [-- BENCH_ARGS...]
#   BUILD_DIR   default build-bench-py in the source tree (buildtype=release)
#   BENCH_ARGS  e.g. --reps 9 --records 8192 --json FILE
#   BACKENDS    (environment) "native" (default), "ctypes" or both
#   NO_BUILD=1  (environment) use BUILD_DIR as it is, built already
set -euo pipefail
BENCH=sglang_follower_bench.py \
  exec "$(dirname "${BASH_SOURCE[0]}")/run_bench_shim.sh" "$@"
