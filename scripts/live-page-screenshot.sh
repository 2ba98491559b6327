#!/usr/bin/env bash
# Regenerates docs/live-page.png, the README's picture of the live page:
# builds tokenmeterd and the reference engine, starts the daemon on a
# temporary socket and an ephemeral port, feeds it from two engines (CPU,
# different rates and lengths, a small KV cache so that requests wait and
# get preempted) for about two minutes, then has headless Chromium load
# http://127.0.0.1:PORT/ and save the screenshot.
# Usage: scripts/live-page-screenshot.sh [BUILD_DIR] (default: build-demo)
#        SECONDS_OF_TRAFFIC=N (default 120): how long the engines feed it.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-demo}
seconds=${SECONDS_OF_TRAFFIC:-120}

if [ ! -x /usr/bin/chromium ]; then
  echo "live-page-screenshot: /usr/bin/chromium not found" \
    "(scripts/install-deps.sh installs it)" >&2
  exit 1
fi
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" --buildtype=release >/dev/null
fi
ninja -C "$build" daemon/tokenmeterd engine/tokenmeter-engine >/dev/null

tmp=$(mktemp -d /tmp/tokenmeter-shot.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

"$build/daemon/tokenmeterd" --ingest "$tmp/ingest.sock" \
  --listen 127.0.0.1:0 --log-interval 0 --ready-fd 3 3>"$tmp/ready" \
  2>"$tmp/daemon.log" &
pids+=($!)
port=""
for _ in $(seq 200); do
  port=$(sed -n 's/^ready http=[^ ]*:\([0-9][0-9]*\) .*/\1/p' "$tmp/ready")
  [ -n "$port" ] && break
  sleep 0.05
done
if [ -z "$port" ]; then
  echo "live-page-screenshot: tokenmeterd did not start:" >&2
  cat "$tmp/daemon.log" >&2
  exit 1
fi

# Two engines of different load, both still running at the screenshot.
engine() {  # INSTANCE MODEL RATE OUTPUT_LEN
  "$build/engine/tokenmeter-engine" --metrics-socket "$tmp/ingest.sock" \
    --backend cpu --instance "$1" --model "$2" --rate "$3" \
    --requests "$(($3 * (seconds + 30)))" --prompt-len 256 --output-len "$4" \
    --shared-prefix 0.25 --kv-blocks 96 --max-batch 16 --seed 5 \
    >/dev/null 2>&1 &
  pids+=($!)
}
engine dp0 llama-demo 8 96
engine dp1 qwen-demo 3 192
echo "live-page-screenshot: feeding http://127.0.0.1:$port/ for ${seconds}s"
sleep "$seconds"

/usr/bin/chromium --headless=new --no-sandbox --disable-gpu \
  --hide-scrollbars --user-data-dir="$tmp/chromium" \
  --window-size=1280,1100 --virtual-time-budget=3000 \
  --screenshot="$tmp/live-page.png" "http://127.0.0.1:$port/" \
  >"$tmp/chromium.log" 2>&1
mv "$tmp/live-page.png" docs/live-page.png
echo "live-page-screenshot: wrote docs/live-page.png"
