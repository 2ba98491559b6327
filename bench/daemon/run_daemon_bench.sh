#!/usr/bin/env bash
# Builds (release) and runs the tokenmeterd benchmarks in bench/daemon/ and
# prints the figures docs/performance.md reports, with PASS/MISS per goal:
#   ingest   daemon_ingest_bench: events/s into the real tokenmeterd binary on
#            one core vs. a read()+msgpack-c receiver (the ceiling); goal
#            >= 5 M events/s
#   render   daemon_render_bench: /metrics render at ~12.5 k samples vs.
#            prometheus-cpp's Collect()+TextSerializer; goal >= 2x faster;
#            the protobuf exposition (native histograms) at most 1.5x the
#            text render
# Ingest goals are judged on events per CPU-second of the receiver and render
# goals on CPU time, so that a machine shared with other work measures the
# code rather than its share of the CPU; wall-clock figures are printed
# beside them (they agree on an otherwise idle machine).
#   memory   rss_bench.py: VmRSS idle (goal <= 20 MiB) and per tracked
#            request with integer ids (goal <= 200 B); 36-byte string ids
#            reported without a goal
#
# Usage: bench/daemon/run_daemon_bench.sh [BUILD_DIR]
#   BUILD_DIR   default build-dbench in the source tree; configured with
#               buildtype=release (an existing one is switched to release).
# Environment:
#   EVENTS=20000000      TOKENS events per ingest run
#   REPS=5               ingest runs per receiver (median reported)
#   RENDER_REPS=10       --benchmark_repetitions of the render cases (median)
#   RSS_RUNS=3           memory runs per id kind (median)
#   RECEIVER_CPU=0 SENDER_CPU=1
#
# Exit status: non-zero when building or running fails, or when a run is
# invalid (events not all applied, expositions not equal). A missed goal is
# a measurement, reported as MISS, and still exits 0.
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$src/build-dbench}"
events="${EVENTS:-20000000}"
reps="${REPS:-5}"
render_reps="${RENDER_REPS:-10}"
rss_runs="${RSS_RUNS:-3}"
receiver_cpu="${RECEIVER_CPU:-0}"
sender_cpu="${SENDER_CPU:-1}"
python=/usr/bin/python3
[[ -x "$python" ]] || python=python3

if ! grep -q "subdir('daemon')" "$src/bench/meson.build"; then
  echo "run_daemon_bench: bench/meson.build does not include" \
       "subdir('daemon')" >&2
  exit 1
fi
if [[ -f "$build/build.ninja" ]]; then
  meson configure "$build" -Dbuildtype=release
else
  meson setup "$build" "$src" --buildtype=release
fi
if ! meson compile -C "$build" daemon/tokenmeterd \
     bench/daemon/daemon_ingest_bench bench/daemon/daemon_render_bench; then
  echo "run_daemon_bench: build failed (the render bench needs Google" \
       "Benchmark and prometheus-cpp-core)" >&2
  exit 1
fi

out="$(mktemp -d /tmp/tm-daemon-bench-XXXXXX)"
trap 'rm -rf "$out"' EXIT

echo
echo "machine: $(nproc) CPUs," \
     "$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "source:  $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')" \
     "$(git -C "$src" diff --quiet HEAD -- daemon 2>/dev/null \
        || echo '(daemon/ modified)')"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) at start"

echo
echo "== ingest =="
"$build/bench/daemon/daemon_ingest_bench" --tokenmeterd "$build/daemon/tokenmeterd" \
  --events "$events" --reps "$reps" --receiver-cpu "$receiver_cpu" \
  --sender-cpu "$sender_cpu" | tee "$out/ingest.txt"

echo
echo "== render =="
"$build/bench/daemon/daemon_render_bench" \
  --benchmark_repetitions="$render_reps" \
  --benchmark_display_aggregates_only=true \
  --benchmark_out="$out/render.json" --benchmark_out_format=json \
  | tee "$out/render.txt"

echo
echo "== memory =="
"$python" "$src/bench/daemon/rss_bench.py" \
  --tokenmeterd "$build/daemon/tokenmeterd" --runs "$rss_runs" \
  | tee "$out/rss.txt"

echo
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) at end"
echo
"$python" - "$out" <<'EOF'
import json, re, sys

out = sys.argv[1]
res = {}
for name in ("ingest.txt", "render.txt", "rss.txt"):
    for line in open(f"{out}/{name}"):
        m = re.match(r"RESULT (\w+)=(\S+)", line)
        if m:
            res[m.group(1)] = float(m.group(2))
render = {}
for b in json.load(open(f"{out}/render.json"))["benchmarks"]:
    if b.get("aggregate_name") == "median":
        # ms (the cases set kMillisecond)
        render[b["run_name"]] = (b["cpu_time"], b["real_time"])

def verdict(ok):
    return "PASS" if ok else "MISS"

print("summary (medians)")
d = res["ingest_daemon_events_per_cpu_s"]
c = res["ingest_ceiling_events_per_cpu_s"]
i = res.get("ingest_inproc_events_per_cpu_s")
dw = res["ingest_daemon_events_per_s"]
cw = res["ingest_ceiling_events_per_s"]
print(f"  ingest  per CPU-second of the receiver: tokenmeterd {d / 1e6:.2f} M "
      f"events, ceiling (read + msgpack-c) {c / 1e6:.2f} M, ratio {d / c:.2f}"
      + (f"; in-process core {i / 1e6:.2f} M" if i else ""))
print(f"          wall clock: tokenmeterd {dw / 1e6:.2f} M events/s, ceiling "
      f"{cw / 1e6:.2f} M events/s, ratio {dw / cw:.2f}")
print(f"          goal >= 5 M events/s into the tracker on one core: "
      f"{verdict(d >= 5e6)} (per CPU-second; wall clock "
      f"{verdict(dw >= 5e6)})")
t, tr = render["tokenmeterd_render"]
p, pr = render["prometheus_cpp_collect_serialize"]
s = render.get("prometheus_cpp_serialize", (None, None))[0]
print(f"  render  {int(res['render_samples'])} samples, CPU time: tokenmeterd "
      f"{t:.3f} ms, prometheus-cpp Collect+Serialize {p:.3f} ms"
      + (f" (Serialize alone {s:.3f} ms)" if s else "")
      + f"; prometheus-cpp / tokenmeterd = {p / t:.2f}x")
print(f"          wall clock: tokenmeterd {tr:.3f} ms, prometheus-cpp "
      f"{pr:.3f} ms, {pr / tr:.2f}x")
print(f"          goal >= 2x faster than prometheus-cpp: {verdict(p / t >= 2)}"
      f" (CPU time; wall clock {verdict(pr / tr >= 2)})")
pb = render.get("tokenmeterd_render_protobuf")
pl = render.get("tokenmeterd_render_protobuf_library")
if pb:
    print(f"          protobuf exposition (native histograms): {pb[0]:.3f} ms, "
          f"{pb[0] / t:.2f}x the text render"
          + (f"; with libprotobuf's generated classes {pl[0]:.3f} ms, "
             f"{pl[0] / t:.2f}x" if pl else ""))
    print(f"          goal <= 1.5x the text render: {verdict(pb[0] / t <= 1.5)}")
idle = res["rss_idle_mib"]
bi = res["rss_bytes_per_request_int"]
bs = res["rss_bytes_per_request_str36"]
print(f"  memory  idle {idle:.2f} MiB; per tracked request {bi:.1f} B "
      f"(integer ids), {bs:.1f} B (36-byte string ids, no goal)")
print(f"          goal <= 20 MiB idle: {verdict(idle <= 20)}")
print(f"          goal <= 200 B per tracked request: {verdict(bi <= 200)}")
EOF
