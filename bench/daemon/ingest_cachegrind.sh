#!/usr/bin/env bash
# Instructions and simulated cache misses per TOKENS event of the ingest
# path, under cachegrind: deterministic where wall-clock and CPU-second
# figures on a shared machine are not (docs/performance.md, "The requests
# API"). Runs bench/daemon/daemon_ingest_bench --receivers inproc (the
# pipeline in a forked child, the figures of that child only) of each
# build, and of NEW_BUILD again with the requests API's keeper attached
# (--inproc-keep-requests 50, as the daemon's default --keep-requests 50).
#
# Usage: bench/daemon/ingest_cachegrind.sh OLD_BUILD NEW_BUILD [EVENTS]
#   OLD_BUILD   a build dir of an older commit with
#               bench/daemon/daemon_ingest_bench built ("-" to skip)
#   NEW_BUILD   this tree's build dir (its bench has --inproc-keep-requests)
#   EVENTS      TOKENS events per run (default 2000000; about 10 s each)
#
# Under valgrind the pipeline runs ~40x slower, so the tick log's budget
# (20,000 written ticks per 100 ms sweep) writes a larger share of the
# ticks than at full speed: the keeper's figure is an upper bound.
#
# Prints one line per run: instructions (Ir), D1 read and write misses and
# LL misses per event, and the ratio of Ir to the first run's.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,22p' "$0"
  exit 2
fi
old=$1 new=$2 events=${3:-2000000}
command -v valgrind >/dev/null || { echo "valgrind not found" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {  # NAME BUILD [ARGS...]
  local name=$1 build=$2
  shift 2
  local dir=$out/$name
  mkdir -p "$dir"
  valgrind --tool=cachegrind --cache-sim=yes \
    --cachegrind-out-file="$dir/cg.%p.out" \
    "$build/bench/daemon/daemon_ingest_bench" --receivers inproc --reps 1 \
    --events "$events" "$@" >"$dir/log" 2>&1 || {
    echo "$name: the bench failed (log below)" >&2
    cat "$dir/log" >&2
    exit 1
  }
  grep -q 'VOID' "$dir/log" && { echo "$name: VOID run" >&2; exit 1; }
  # The receiver child is the process with the most instructions.
  local best=0 line
  for f in "$dir"/cg.*.out; do
    line=$(grep '^summary:' "$f")
    read -r _ ir _ _ _ d1mr _ _ d1mw dlmw <<<"$line"
    if ((ir > best)); then
      best=$ir
      echo "$name $ir $d1mr $d1mw $dlmw" >"$dir/summary"
    fi
  done
  cat "$dir/summary"
}

{
  [[ $old != - ]] && run old "$old"
  run new "$new"
  run new_keep50 "$new" --inproc-keep-requests 50
} >"$out/all"

n=$(( events / 512 * 512 ))
awk -v n="$n" '
  NR == 1 { base = $2; first = $1 }
  { printf "%-12s %7.1f Ir/event (%.4f of %s)  D1 misses %.2f rd %.2f wr, LL wr %.3f per event\n",
           $1, $2 / n, $2 / base, first, $3 / n, $4 / n, $5 / n }' "$out/all"
