#!/usr/bin/env bash
# Runs every benchmark pair of docs/performance.md's top table in one
# invocation and prints that table (markdown): each row a ratio of
# tokenmeter against a peer (prometheus-cpp, libprotobuf, client_golang,
# VictoriaMetrics/metrics, prometheus_client) or against a limit, measured
# in this run on this machine, with its goal and PASS/MISS, then the
# commands it ran, the machine load and the git commit.
#
#   client   bench/client_bench (shared library) and client_bench_static:
#            tm_tokens per call; prometheus-cpp Histogram::Observe;
#            bench/go peers_bench observe: client_golang (classic, native)
#            and VictoriaMetrics/metrics, the same buckets and values
#   render   bench/daemon/daemon_render_bench: tokenmeterd's text and
#            protobuf renders, prometheus-cpp, libprotobuf's classes;
#            peers_bench render: client_golang (text, protobuf) and
#            VictoriaMetrics on a registry of the same shape
#   ingest   bench/daemon/daemon_ingest_bench --receivers ceiling,daemon
#   python   bench/python/run_bench_shim.sh (the C extension) beside
#            prometheus_client
# Client and render run ROUNDS times, ours and the Go peers' in turn, and
# each row is the median of the rounds' ratios; ingest and Python pair
# their cases inside one run.
#
# Usage: bench/run_all.sh [--quick] [--no-build] [BUILD_DIR]
#   BUILD_DIR   default build-rel in the source tree; configured (or
#               switched) to buildtype=release, -Db_ndebug=true, and the
#               targets built, unless --no-build (then used as it is: the
#               table says its buildtype).
#   --quick     tiny counts (seconds): the whole table's shape, noisy
#               figures (tests/scripts/run_all_quick_test.py runs it).
# Environment: ROUNDS (3; quick 1), EVENTS (20000000; quick 200000), GO
#   (the go command, default go; bench/go/build.sh),
#   RECEIVER_CPU=0 SENDER_CPU=1, OUT (a folder to keep the raw outputs in;
#   default a temporary one, removed at the end).
#
# A peer whose toolchain is missing (no go, no prometheus-cpp, no Python
# extension) has its rows say n/a and why; the rest still run. Exit status:
# non-zero when building or running fails or a run is invalid (events
# dropped, expositions not equal); a missed goal is reported as MISS and
# exits 0.
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$src/build-rel"
quick=0
no_build=0
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    --no-build) no_build=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    -*) echo "run_all: unknown option $a" >&2; exit 2 ;;
    *) build="$a" ;;
  esac
done
build="$(cd "$build" 2>/dev/null && pwd || echo "$build")"
python=/usr/bin/python3
[[ -x "$python" ]] || python=python3

if ((quick)); then
  rounds="${ROUNDS:-1}"; events="${EVENTS:-200000}"; ingest_reps=1
  reps=2; min_time=0.01; go_min_time=10ms; identities=4
  py_args=(--reps 1 --min-time 0.01)
else
  rounds="${ROUNDS:-3}"; events="${EVENTS:-20000000}"; ingest_reps=5
  reps=5; min_time=0.2; go_min_time=200ms; identities=42
  py_args=(--reps 5 --min-time 0.2)
fi

ext="$("$python" -c \
  'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX")[1:])')"
pkg=client_lib/python/tokenmeter
native="$pkg/_native.$ext"
targets=(daemon/tokenmeterd bench/daemon/daemon_ingest_bench
         bench/daemon/daemon_render_bench bench/client_bench
         bench/client_bench_static)
py_build=()  # run_bench_shim.sh builds the package, or is told not to
if ((!no_build)); then
  if [[ ! -f "$build/build.ninja" ]]; then
    meson setup "$build" "$src" --buildtype=release -Db_ndebug=true \
      -Dtests=disabled >/dev/null
  elif [[ "$(meson introspect "$build" --buildoptions | "$python" -c \
      'import json,sys; o={x["name"]: x["value"] for x in json.load(sys.stdin)}
print(o["buildtype"], o["b_ndebug"])')" != "release true" ]]; then
    meson configure "$build" -Dbuildtype=release -Db_ndebug=true
  fi
  # What this configuration can build (no prometheus-cpp: no render bench,
  # no Python headers: no extension); the rest is said in the table.
  known="$(ninja -C "$build" -t targets all 2>/dev/null | cut -d: -f1)"
  have=()
  for t in "${targets[@]}"; do
    grep -qxF "$t" <<<"$known" && have+=("$t")
  done
  ninja -C "$build" "${have[@]}" >/dev/null
  grep -qxF "$native" <<<"$known" || py_build=(none)
  "$src/bench/go/build.sh" "$build/bench/go" || [[ $? == 77 ]]
else
  [[ -f "$build/$native" ]] || py_build=(none)
  py_build+=(NO_BUILD=1)
fi

out="${OUT:-}"
if [[ -z "$out" ]]; then
  out="$(mktemp -d /tmp/tm-run-all-XXXXXX)"
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"
rm -f "$out"/*.json "$out"/*.txt

# Each command is logged (quoted as it could be typed again) and run.
run() {
  local key="$1" log="$2" a line
  shift 2
  line="[$key]"
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then
      line+=" $a"
    else
      line+=" '${a//\'/\'\\\'\'}'"
    fi
  done
  echo "$line" >>"$out/commands.txt"
  "$@" >"$log" 2>&1 || {
    echo "run_all: [$key] failed; its output:" >&2
    tail -n 30 "$log" >&2
    return 1
  }
}

{
  echo "commit $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')" \
       "$(git -C "$src" diff --quiet HEAD 2>/dev/null || echo '(modified)')"
  echo "machine $(nproc) CPUs," \
       "$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "build $build ($(meson introspect "$build" --buildoptions 2>/dev/null |
       "$python" -c 'import json,sys
print(next(x["value"] for x in json.load(sys.stdin) if x["name"] == "buildtype"))' \
       2>/dev/null || echo '?'))"
  echo "mode $( ((quick)) && echo quick || echo full), $rounds round(s)"
  echo "load_start $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/header.txt"

peers="$build/bench/go/peers_bench"
if [[ ! -x "$peers" ]]; then
  if "$src/bench/go/build.sh" --check 2>"$out/go_missing.txt"; then
    echo "peers_bench not built (bench/go/build.sh $build/bench/go)" \
      >"$out/go_missing.txt"
  fi
fi

gb=(--benchmark_repetitions="$reps" --benchmark_display_aggregates_only=true
    --benchmark_out_format=json)
for ((r = 1; r <= rounds; r++)); do
  echo "run_all: round $r of $rounds (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  if [[ -x "$build/bench/client_bench" ]]; then
    run c "$out/client.$r.log" "$build/bench/client_bench" "${gb[@]}" \
      --benchmark_min_time="$min_time" \
      --benchmark_filter='^(tm_tokens/(caller_ts|now)/threads|prometheus_observe|clock_gettime)' \
      --benchmark_out="$out/client.$r.json"
  fi
  if [[ -x "$build/bench/client_bench_static" ]]; then
    run s "$out/static.$r.log" "$build/bench/client_bench_static" "${gb[@]}" \
      --benchmark_min_time="$min_time" \
      --benchmark_filter='^tm_tokens/caller_ts/threads' \
      --benchmark_out="$out/static.$r.json"
  fi
  if [[ -x "$peers" ]]; then
    run go "$out/go_observe.$r.txt" "$peers" observe -reps "$reps" \
      -min-time "$go_min_time"
  fi
  if [[ -x "$build/bench/daemon/daemon_render_bench" ]]; then
    run r "$out/render.$r.log" "$build/bench/daemon/daemon_render_bench" \
      --identities="$identities" --dump-text="$out/exposition.txt" \
      --dump-protobuf="$out/exposition.pb" "${gb[@]}" \
      --benchmark_filter='^(tokenmeterd_render|tokenmeterd_render_protobuf|tokenmeterd_render_protobuf_library|prometheus_cpp_collect_serialize)$' \
      --benchmark_out="$out/render.$r.json"
    if [[ -x "$peers" ]]; then
      run gr "$out/go_render.$r.txt" "$peers" render \
        -text "$out/exposition.txt" -protobuf "$out/exposition.pb" \
        -reps "$reps" -min-time "$go_min_time"
    fi
  fi
done

echo "run_all: ingest (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
run i "$out/ingest.txt" "$build/bench/daemon/daemon_ingest_bench" \
  --tokenmeterd "$build/daemon/tokenmeterd" --receivers ceiling,daemon \
  --events "$events" --reps "$ingest_reps" \
  --receiver-cpu "${RECEIVER_CPU:-0}" --sender-cpu "${SENDER_CPU:-1}"

if [[ "${py_build[0]:-}" != none ]]; then
  echo "run_all: python (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  py_cmd=("$src/bench/python/run_bench_shim.sh" "$build" -- "${py_args[@]}"
          --json "$out/python.json")
  if ((${#py_build[@]})); then py_cmd=(env "${py_build[@]}" "${py_cmd[@]}"); fi
  run p "$out/python.txt" "${py_cmd[@]}"
else
  echo "tokenmeter._native not built in $build (python3-dev)" \
    >"$out/python_missing.txt"
fi

echo "load_end $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/header.txt"
"$python" "$src/bench/run_all_table.py" "$out"
