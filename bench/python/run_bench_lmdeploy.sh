#!/usr/bin/env bash
# Builds libtokenmeter and the Python extension (release) and runs the
# LMDeploy adapter benchmark (bench/python/bench_lmdeploy.py): the cost of
# tokenmeter's LMDeploy stat logger beside LMDeploy's own
# PrometheusStatLogger (the stand-in's) for the same stats, per record_*
# call and for a whole pass, and PASS/MISS for the goal (ratio <= 1.0;
# docs/performance.md, "LMDeploy adapter"). run_bench_shim.sh does the
# building and the running, for each of $BACKENDS.
#
# Usage: bench/python/run_bench_lmdeploy.sh [BUILD_DIR] [-- BENCH_ARGS...]
#   BUILD_DIR   default build-bench-py (shared with run_bench_shim.sh).
#   BENCH_ARGS  e.g. --reps 7 --json FILE
#   BACKENDS    (environment) "native" (default), "ctypes", or both.
#
# Exit status: non-zero when building fails or the run is invalid (events
# dropped or rejected, or an error in the logger). A missed goal is MISS
# and exits 0.
BENCH=bench_lmdeploy.py exec "$(dirname "${BASH_SOURCE[0]}")/run_bench_shim.sh" "$@"
