#!/usr/bin/env bash
# The demo: installs what is missing, builds, starts tokenmeterd on a
# temporary socket and an ephemeral port, runs the reference engine against
# it for a few seconds (CUDA when a device answers, else the CPU), then shows
# a /metrics excerpt and the daemon's summary log lines, and stops the daemon
# with SIGTERM. It prints the live page's URL (`/`) as soon as the daemon
# listens. PROFILE (vllm, sglang or lmdeploy; default: the daemon's auto,
# vllm for the reference engine) is the daemon's --profile: the series'
# names and the summary line's wording (docs/operations.md).
# Usage: scripts/demo.sh [BUILD_DIR [PROFILE]] (default: build-demo)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-demo}
profile=${2:-auto}

scripts/install-deps.sh
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" --buildtype=release >/dev/null
fi
ninja -C "$build" daemon/tokenmeterd engine/tokenmeter-engine >/dev/null

tmp=$(mktemp -d /tmp/tokenmeter-demo.XXXXXX)
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

"$build/daemon/tokenmeterd" --ingest "$tmp/ingest.sock" \
  --listen 127.0.0.1:0 --log-interval 1 --profile "$profile" \
  2>"$tmp/daemon.log" &
daemon_pid=$!
port=""
for _ in $(seq 200); do
  port=$(sed -n 's/.*http port \([0-9][0-9]*\).*/\1/p' "$tmp/daemon.log" |
    head -n 1)
  [ -n "$port" ] && break
  if ! kill -0 "$daemon_pid" 2>/dev/null; then
    echo "demo: tokenmeterd exited:" >&2
    cat "$tmp/daemon.log" >&2
    exit 1
  fi
  sleep 0.05
done
if [ -z "$port" ]; then
  echo "demo: tokenmeterd did not start" >&2
  exit 1
fi
echo "== tokenmeterd: ingest $tmp/ingest.sock, http://127.0.0.1:$port/metrics"
echo "== live page: http://127.0.0.1:$port/ (open it in a browser while the demo runs)"

# About four seconds of arrivals into a 32-wide batch; a KV cache small
# enough to fill up and preempt, and a shared prompt prefix for the prefix
# cache.
echo "== tokenmeter-engine: 600 requests at 150/s"
"$build/engine/tokenmeter-engine" --metrics-socket "$tmp/ingest.sock" \
  --requests 600 --rate 150 --prompt-len 128 --output-len 48 \
  --shared-prefix 0.25 --kv-blocks 32 --max-batch 32

# One more summary period, so the last seconds are logged too.
sleep 1.2
echo
echo "== /metrics excerpt"
curl -fsS "http://127.0.0.1:$port/metrics" | grep -E \
  '^(tokenmeter_engine|sglang|lmdeploy):((time_to_first_token|inter_token_latency)_seconds_(sum|count)|(prompt|generation)_tokens_total|request_success_total|num_preemptions_total|prefix_cache_(queries|hits)_total)' ||
  true

echo
echo "== tokenmeterd summary log lines"
grep -E ' engine=[^ ]* model=[^ ]*: ' "$tmp/daemon.log" || true

kill -TERM "$daemon_pid"
status=0
wait "$daemon_pid" || status=$?
daemon_pid=""
echo
echo "== tokenmeterd stopped by SIGTERM (exit status $status)"
exit "$status"
