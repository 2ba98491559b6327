#!/usr/bin/env bash
# Old against new in one run (issue 12; docs/performance.md, "Old against new
# in one run"). Runs the benchmarks of two builds interleaved, pairs each old
# run with the new run next to it in time, and judges the median of the
# per-pair ratios new/old, so that a noisy machine slows both sides of a pair
# alike instead of deciding the comparison:
#   client   bench/client_bench, tm_tokens/caller_ts and tm_arrived/caller_ts
#            at 1 thread (CPU ns per call, median of --benchmark_repetitions)
#   ingest   bench/daemon/daemon_ingest_bench --receivers daemon against the
#            build's own tokenmeterd (events per CPU-second of the receiver;
#            it pins the receiver to CPU 0 and the sender to CPU 1 itself)
#   render   bench/daemon/daemon_render_bench, tokenmeterd_render (CPU ms)
#   rss      the build's source tree's bench/daemon/rss_bench.py --runs 1
#            against the build's tokenmeterd (bytes per tracked request with
#            integer ids; it measures 36-byte string ids too, not judged)
# Pair REP runs old first when REP is odd and new first when it is even.
# client and render run under taskset on --cpu.
#
# Usage: bench/ab/run_ab.sh OLD_BUILD NEW_BUILD [--reps N] [--cpu N]
#          [--events N] [--rss-requests N] [--only client,ingest,render,rss]
#          [--out DIR] [--stale-ok] [--new-ingest-args "ARGS"] [--client-max-ns X] [--client-max-ratio X]
#          [--ingest-min-ratio X] [--render-max-ratio X] [--rss-max-bytes X]
#        bench/ab/run_ab.sh --self-test
#   OLD_BUILD, NEW_BUILD  meson build dirs (the same one twice measures the
#          noise) with bench/client_bench, bench/daemon/daemon_ingest_bench,
#          bench/daemon/daemon_render_bench and daemon/tokenmeterd built;
#          configure both alike (run_ab.sh refuses differing buildtype or
#          b_ndebug), e.g.
#            meson setup DIR --buildtype=release -Db_ndebug=true -Dtests=disabled
#            ninja -C DIR bench/client_bench bench/daemon/daemon_ingest_bench \
#              bench/daemon/daemon_render_bench daemon/tokenmeterd
#   --reps N          pairs per benchmark (default 5; 35-50 s per pair on 2 CPUs)
#   --cpu N           CPU for client and render (default 1)
#   --events N        TOKENS events per ingest run (default 10000000)
#   --rss-requests N  tracked requests per rss run (default 1000000)
#   --only LIST       run only these benchmarks (the others report SKIP)
#   --out DIR         keep the raw outputs in DIR (default: a temp dir,
#                     removed at exit unless a run failed)
#   --new-ingest-args "ARGS"
#                     extra daemon_ingest_bench flags for the NEW side only,
#                     e.g. "--label-values 100" (per-request labels against
#                     none, NEW_BUILD given twice) or "--profile lmdeploy"
#   --stale-ok        measure binaries that ninja would rebuild (refused
#                     otherwise: they are not the sources the header names)
#   threshold flags   override a requirement's limit (defaults 15, 1.10,
#                     0.95, 1.10, 200); a limit no noise lets a 1.00 ratio
#                     meet, e.g. --render-max-ratio 0.5, shows the FAIL path
#   --self-test       the statistics and verdicts on synthetic outputs (no
#                     build needed)
#
# Exit status: 0 every requirement PASS; 1 a requirement FAIL; 2 usage
# error, missing binary, a benchmark failed or a run was invalid (events
# dropped, a VOID ingest run).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python=/usr/bin/python3
[[ -x "$python" ]] || python=python3
stats=("$python" "$here/ab_stats.py")

usage() {
  sed -n '/^# Usage:/,/^set -euo/{/^set/!p}' "${BASH_SOURCE[0]}" |
    sed 's/^# \{0,1\}//' >&2
  exit 2
}

if [[ "${1:-}" == "--self-test" ]]; then exec "${stats[@]}" --self-test; fi
[[ $# -ge 2 && "$1" != -* && "$2" != -* ]] || usage
for dir in "$1" "$2"; do
  [[ -d "$dir" ]] || { echo "run_ab: $dir: not a directory" >&2; exit 2; }
done
old_build="$(cd "$1" && pwd)"
new_build="$(cd "$2" && pwd)"
shift 2

reps=5
cpu=1
events=10000000
rss_requests=1000000
only="client,ingest,render,rss"
out=""
thresholds=()
stale_ok=0
new_ingest_args=""
while [[ $# -gt 0 ]]; do
  if [[ "$1" == --stale-ok ]]; then stale_ok=1; shift; continue; fi
  [[ $# -ge 2 ]] || usage
  case "$1" in
    --reps) reps="$2" ;;
    --cpu) cpu="$2" ;;
    --events) events="$2" ;;
    --rss-requests) rss_requests="$2" ;;
    --only) only="$2" ;;
    --out) out="$2" ;;
    --new-ingest-args) new_ingest_args="$2" ;;
    --client-max-ns | --client-max-ratio | --ingest-min-ratio | \
      --render-max-ratio | --rss-max-bytes) thresholds+=("$1" "$2") ;;
    *) usage ;;
  esac
  shift 2
done
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || usage
benches=()
IFS=, read -r -a wanted <<<"$only"
for b in "${wanted[@]}"; do
  case "$b" in
    client | ingest | render | rss) benches+=("$b") ;;
    *) usage ;;
  esac
done

# Binaries each benchmark needs, relative to a build dir.
needs() {
  case "$1" in
    client) echo bench/client_bench ;;
    ingest) echo bench/daemon/daemon_ingest_bench daemon/tokenmeterd ;;
    render) echo bench/daemon/daemon_render_bench ;;
    rss) echo daemon/tokenmeterd ;;
  esac
}
mapfile -t bins < <(for b in "${benches[@]}"; do needs "$b"; done | tr ' ' '\n' | sort -u)
for build in "$old_build" "$new_build"; do
  for bin in "${bins[@]}"; do
    if [[ ! -x "$build/$bin" ]]; then
      echo "run_ab: $build/$bin missing; build with: ninja -C $build ${bins[*]}" >&2
      exit 2
    fi
  done
done
# Binaries older than their sources would measure something else than the
# tree named in the header.
stale=()
for build in "$old_build" "$new_build"; do
  steps="$(ninja -C "$build" -n "${bins[@]}" 2>/dev/null | grep -c '^\[' || true)"
  if [[ "$steps" != 0 ]]; then
    stale+=("$build")
    echo "run_ab: $build: $steps build steps pending for ${bins[*]}" >&2
  fi
done
if [[ ${#stale[@]} -gt 0 && "$stale_ok" == 0 ]]; then
  echo "run_ab: build them (ninja -C DIR ${bins[*]}), or pass --stale-ok" >&2
  exit 2
fi
old_desc="$("${stats[@]}" describe "$old_build")"
new_desc="$("${stats[@]}" describe "$new_build")"
if [[ "${old_desc%% source *}" != "${new_desc%% source *}" ]]; then
  echo "run_ab: the builds differ in configuration:" >&2
  echo "  old: $old_desc" >&2
  echo "  new: $new_desc" >&2
  exit 2
fi

if [[ -n "$out" ]]; then
  mkdir -p "$out"
  rm -f "$out"/{client,ingest,render,rss}.{old,new}.*.{json,txt,log}
  keep=1
else
  out="$(mktemp -d /tmp/tm-ab-XXXXXX)"
  keep=0
fi
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() { if [[ "$keep" == 0 ]]; then rm -rf "$out"; fi; }
trap cleanup EXIT

echo "machine: $(nproc) CPUs," \
     "$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "old:     $old_build: $old_desc"
echo "new:     $new_build: $new_desc"
if [[ "$old_build" == "$new_build" ]]; then
  echo "         (the same build twice: the ratios measure the noise)"
fi
for build in "${stale[@]}"; do
  echo "STALE:   $build: binaries older than their sources (--stale-ok)"
done
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) at start"
echo "pairs:   $reps of ${benches[*]}; client and render on CPU $cpu"

# gbench BINARY FILTER MIN_TIME BASE: a Google Benchmark binary on $cpu,
# 3 repetitions of the cases FILTER matches, JSON into BASE.json.
gbench() {
  timeout 600 taskset -c "$cpu" "$1" --benchmark_filter="$2" \
    --benchmark_repetitions=3 --benchmark_min_time="$3" \
    --benchmark_out="$4.json" --benchmark_out_format=json >"$4.log" 2>&1
}

# run_one BENCH SIDE BUILD REP: one benchmark run, raw output into $out.
run_one() {
  local bench="$1" side="$2" build="$3" rep="$4"
  local base="$out/$bench.$side.$rep" rc=0
  case "$bench" in
    client)
      gbench "$build/bench/client_bench" \
        '^tm_(tokens|arrived)/caller_ts/threads:1$' 0.1 "$base" || rc=$? ;;
    ingest)
      local extra=()
      if [[ "$side" == new && -n "$new_ingest_args" ]]; then
        read -r -a extra <<<"$new_ingest_args"
      fi
      timeout 600 "$build/bench/daemon/daemon_ingest_bench" \
        --tokenmeterd "$build/daemon/tokenmeterd" --receivers daemon \
        --events "$events" --reps 1 "${extra[@]}" >"$base.txt" 2>&1 ||
        rc=$? ;;
    render)
      gbench "$build/bench/daemon/daemon_render_bench" \
        '^tokenmeterd_render$' 0.2 "$base" || rc=$? ;;
    rss)
      timeout 600 "$python" "$("${stats[@]}" source "$build")/bench/daemon/rss_bench.py" \
        --tokenmeterd "$build/daemon/tokenmeterd" --runs 1 \
        --requests "$rss_requests" >"$base.txt" 2>&1 || rc=$? ;;
  esac
  if [[ "$rc" != 0 ]]; then
    keep=1
    echo "run_ab: $bench ($side, pair $rep) exited $rc; outputs kept in $out:" >&2
    tail -n 5 "$base".* >&2 || true
    exit 2
  fi
}

start=$SECONDS
for ((rep = 1; rep <= reps; rep++)); do
  if ((rep % 2)); then order=(old new); else order=(new old); fi
  for bench in "${benches[@]}"; do
    for side in "${order[@]}"; do
      if [[ "$side" == old ]]; then build="$old_build"; else build="$new_build"; fi
      run_one "$bench" "$side" "$build" "$rep"
    done
  done
  echo "pair $rep of $reps done (${order[0]} first), $((SECONDS - start)) s," \
       "load $(cut -d' ' -f1 /proc/loadavg)"
done
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) at end"
echo

rc=0
"${stats[@]}" summarize "$out" "${thresholds[@]}" || rc=$?
if [[ "$rc" == 2 ]]; then keep=1; echo "run_ab: outputs kept in $out" >&2; fi
exit "$rc"
