#!/usr/bin/env bash
# Installs what is missing, builds with warnings as errors, runs every test,
# and ends with the line "N passed, N failed, N skipped".
# Usage: scripts/test.sh [BUILD_DIR] (default: build-test)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-test}

scripts/install-deps.sh
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dwerror=true --buildtype=debugoptimized >/dev/null
fi
ninja -C "$build"
status=0
meson test -C "$build" --print-errorlogs --num-processes 2 || status=$?
/usr/bin/python3 scripts/summarize-tests.py "$build" || status=1
exit $status
