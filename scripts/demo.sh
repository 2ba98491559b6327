#!/usr/bin/env bash
# Installs what is missing, builds, and runs the demo.
# Until the daemon and the reference engine land, the demo runs the
# quickstart client against a socket nobody listens on, which shows that the
# client never blocks and counts what it could not deliver.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-demo}

scripts/install-deps.sh
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" --buildtype=release >/dev/null
fi
ninja -C "$build" >/dev/null
echo "== quickstart client, no daemon listening =="
"$build/examples/quickstart" "/tmp/tokenmeter-demo-$$.sock"
