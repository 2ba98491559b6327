#!/bin/bash
# The checks that need a GPU, prepared to run in one call on a lent device
# machine (docs/testing.md, "On a GPU"). That machine has CUDA but none of
# the project's build dependencies, so the binaries are built here, packed
# with the libraries they load (not glibc's, not CUDA's: the machine's own),
# and carried:
#
#   scripts/device-check.sh pack [BUILD]   here: BUILD (default build), built
#                                          with CUDA, into .device/ (ignored)
#   scripts/device-check.sh run [BACKEND]  there (or here, BACKEND cpu, to
#                                          check the script): the checks;
#                                          the log to $OUT (or .device/out)
#
# The device tool's call: command "scripts/device-check.sh run", carry
# [".device"], timeout_s 300.
#
# What run checks, each printing PASS or FAIL, and exiting 1 on any FAIL:
#  1. nvidia-smi and the engine's device probe (backend_agreement_test
#     exits 77 without a device: a FAIL here, where one is expected).
#  2. backend_agreement_test: the CUDA and CPU backends compute the same
#     logits, route the same experts, and hand KV blocks over between them
#     (ReadKvBlocks / WriteKvBlocks), release and restore the cache.
#  3. tokenmeter-engine --backend BACKEND --disaggregate (prefill and
#     decode processes, the KV cache bytes handed over the KV channel,
#     admission rejections, priorities, a sleep cycle that releases and
#     restores the KV cache, damaged transfers retried) against a real
#     tokenmeterd: every 1.2 figure of each process's --report equals the
#     daemon's series (scripts/device_check_compare.py).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dev="$root/.device"

pack() {
  local build=${1:-build}
  build=$(cd "$root" && cd "$build" && pwd)
  local bins=("$build/engine/tokenmeter-engine" "$build/daemon/tokenmeterd"
              "$build/tests/engine/backend_agreement_test")
  for b in "${bins[@]}"; do
    [[ -x "$b" ]] || { echo "device-check: $b is not built" >&2; exit 1; }
  done
  if ! ldd "$build/engine/tokenmeter-engine" | grep -q libcudart; then
    echo "device-check: $build has no CUDA backend (meson setup -Dcuda=enabled)" >&2
    exit 1
  fi
  rm -rf "$dev"
  mkdir -p "$dev/bin" "$dev/lib"
  for b in "${bins[@]}"; do
    cp "$b" "$dev/bin/"
    strip --strip-debug "$dev/bin/$(basename "$b")"
  done
  # Every library they load but glibc's and CUDA's, with its links.
  local lib
  for lib in $(ldd "${bins[@]}" | awk '/=> \//{print $3}' | sort -u); do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|\
      libcuda*|libcublas*|libcudart*) continue ;;
    esac
    cp -L "$lib" "$dev/lib/"
    strip --strip-debug "$dev/lib/$(basename "$lib")" 2>/dev/null || true
  done
  cp "$root/scripts/device_check_compare.py" "$dev/"
  du -sh "$dev"  # carried (.gitignore has /.device/): at most 64 MiB
}

run() {
  local backend=${1:-cuda}
  local out=${OUT:-$dev/out}
  mkdir -p "$out"
  local log="$out/device-check.log"
  local work
  work=$(mktemp -d)
  local fails=0
  # Only our binaries see the carried libraries: python3 keeps its own.
  local libs="$dev/lib:/usr/local/cuda/lib64"
  exec > >(tee "$log") 2>&1
  echo "device-check: backend $backend, $(date -u +%FT%TZ), $(uname -r)"
  if [[ $backend == cuda ]]; then
    nvidia-smi -L || true
    local rc=0
    LD_LIBRARY_PATH=$libs "$dev/bin/backend_agreement_test" || rc=$?
    if [[ $rc == 0 ]]; then
      echo "PASS backend_agreement_test"
    else
      echo "FAIL backend_agreement_test (exit $rc; 77: no device answered)"
      fails=$((fails + 1))
    fi
  fi
  local sock="$work/ingest.sock" port=19090
  LD_LIBRARY_PATH=$libs "$dev/bin/tokenmeterd" --ingest "$sock" \
    --listen "127.0.0.1:$port" --log-interval 0 >"$work/daemon.log" 2>&1 &
  local daemon=$!
  for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
  local rc=0
  LD_LIBRARY_PATH=$libs timeout 240 "$dev/bin/tokenmeter-engine" \
    --requests 150 --rate 300 --prompt-len 48 --output-len 24 \
    --max-batch 16 --max-tokens-per-step 256 --kv-blocks 48 \
    --block-size 8 --shared-prefix 0.35 --seed 7 --backend "$backend" \
    --model e2e-tiny --instance dc --quiet --disaggregate --max-queued 8 \
    --priority-levels 5 --kv-fail-every 5 --kv-retries 1 \
    --sleep-after 0.05 --wake-after 0.5 --metrics-socket "$sock" \
    --report "$work/report.json" || rc=$?
  if [[ $rc != 0 ]]; then
    echo "FAIL tokenmeter-engine --disaggregate exited $rc"
    fails=$((fails + 1))
  elif python3 "$dev/device_check_compare.py" "$work/report.json" \
      "http://127.0.0.1:$port/metrics" "$backend"; then
    echo "PASS disaggregated report equals the daemon's series"
  else
    echo "FAIL disaggregated report against the daemon's series"
    fails=$((fails + 1))
  fi
  kill "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  cp "$work/report.json" "$out/" 2>/dev/null || true
  tail -20 "$work/daemon.log"
  rm -rf "$work"
  echo "device-check: $fails failed"
  [[ $fails == 0 ]]
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
