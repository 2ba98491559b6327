#!/usr/bin/python3
"""Prints bench/run_all.sh's table from the outputs it left in OUT_DIR.

Usage: run_all_table.py OUT_DIR

Every row is a ratio from this run: tokenmeter against a peer measured in
the same invocation, or against a limit (a goal in absolute units). The
client and render rows are the median over the rounds of each round's
ratio (the tokenmeter and peer columns are the medians of their own
figures); ingest and Python pair their cases inside one run. A row whose
peer could not run says n/a and why (SKIP). The row names are fixed
(ROWS): tests/scripts/run_all_quick_test.py checks that all are printed.

Exit status: 0 whatever the goals say; 3 when a run is invalid (a client
benchmark dropped events, an ingest run was void, the Python run invalid).
"""

import contextlib
import io
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "ab")]
import client_bench_summary as cbs  # noqa: E402
from ab_stats import results  # noqa: E402  "RESULT key=value" lines

# (key, figure, unit, source, goal op, goal value); "peer" rows divide the
# peer by tokenmeter (>= goal: tokenmeter that many times cheaper), "limit"
# rows divide tokenmeter by the limit (<= goal), "self" rows one tokenmeter
# figure by another.
ROWS = [
    # client: ns per call, CPU time of the calling thread(s)
    ("tm_tokens_caller_1t",
     "`tm_tokens`, caller `t_ns`, 1 thread: vs 15 ns",
     "ns", "c", "<=", 1.0),
    ("tm_tokens_caller_2t",
     "`tm_tokens`, caller `t_ns`, 2 threads: vs 15 ns",
     "ns", "c", "<=", 1.0),
    ("tm_tokens_now_1t",
     "`tm_tokens`, `t_ns = 0` (now), 1 thread: vs 35 ns",
     "ns", "c", "<=", 1.0),
    ("tm_tokens_now_clock",
     "`tm_tokens` now / `clock_gettime` alone",
     "ns", "c", None, None),
    ("tm_tokens_shared_static",
     "`tm_tokens` caller, shared / static library",
     "ns", "c s", None, None),
    ("prometheus_cpp_observe_1t",
     "prometheus-cpp `Observe` / `tm_tokens`, 1 thread",
     "ns", "c", ">=", 1.8),
    ("prometheus_cpp_observe_2t",
     "prometheus-cpp `Observe` / `tm_tokens`, 2 threads (one child)",
     "ns", "c", ">=", 1.8),
    ("client_golang_classic_1t",
     "client_golang `Observe` classic / `tm_tokens`, 1 goroutine",
     "ns", "c go", ">=", 1.8),
    ("client_golang_classic_2t",
     "client_golang `Observe` classic / `tm_tokens`, 2 goroutines (one child)",
     "ns", "c go", ">=", 1.8),
    ("client_golang_native_1t",
     "client_golang `Observe` native / `tm_tokens`, 1 goroutine",
     "ns", "c go", ">=", 1.8),
    ("client_golang_native_2t",
     "client_golang `Observe` native / `tm_tokens`, 2 goroutines (one child)",
     "ns", "c go", ">=", 1.8),
    ("victoriametrics_1t",
     "VictoriaMetrics `Update` / `tm_tokens`, 1 goroutine",
     "ns", "c go", ">=", 1.8),
    ("victoriametrics_2t",
     "VictoriaMetrics `Update` / `tm_tokens`, 2 goroutines (one child)",
     "ns", "c go", ">=", 1.8),
    # ingest: M events per CPU-second of the receiver
    ("ingest_ceiling",
     "ingest: tokenmeterd / read + msgpack-c ceiling, per CPU-s",
     "M ev/CPU-s", "i", ">=", 0.70),
    ("ingest_limit",
     "ingest: tokenmeterd vs 5 M events per CPU-s",
     "M ev/CPU-s", "i", ">=", 1.0),
    # render: ms of CPU per scrape of the same registry
    ("render_prometheus_cpp",
     "render text: prometheus-cpp / tokenmeterd",
     "ms", "r", ">=", 2.0),
    ("render_client_golang_text",
     "render text: client_golang / tokenmeterd",
     "ms", "r gr", ">=", 2.0),
    ("render_victoriametrics",
     "render text: VictoriaMetrics / tokenmeterd",
     "ms", "r gr", ">=", 2.0),
    ("render_protobuf_text",
     "render: tokenmeterd protobuf / text",
     "ms", "r", "<=", 1.5),
    ("render_libprotobuf",
     "render protobuf: libprotobuf classes / tokenmeterd",
     "ms", "r", None, None),
    ("render_client_golang_protobuf",
     "render protobuf: client_golang / tokenmeterd",
     "ms", "r gr", ">=", 2.0),
    # Python: ns per event, CPU time
    ("python_tokens_int",
     "Python: prometheus_client `observe` / `tokens(int)`",
     "ns", "p", ">=", 5.0),
    ("python_tokens_str",
     "Python: prometheus_client `observe` / `tokens(str)`",
     "ns", "p", ">=", 5.0),
    ("python_batch_256",
     "Python: `tokens_batch` list[int] x256 vs 10 ns/event",
     "ns", "p", "<=", 1.0),
]

def gb_cpu(path):
    """Google Benchmark JSON: {run_name: median cpu_time} (aggregates)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return {b["run_name"]: b["cpu_time"] for b in data["benchmarks"]
            if b.get("aggregate_name") == "median"}


def numbered(out, prefix):
    """The round numbers N of OUT/PREFIX.N.json, in order."""
    return sorted(int(m.group(1)) for p in os.listdir(out)
                  for m in [re.match(re.escape(prefix) + r"\.(\d+)\.json$", p)]
                  if m)


def quiet_load(path):
    """client_bench_summary.load() of one file, without its notes (the
    load at each start: the table says the run's)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return cbs.load([path])


class Table:
    def __init__(self):
        # key -> (tokenmeter figures, peer figures, ratios) over rounds, or
        # a reason it is n/a
        self.rounds = {k[0]: ([], [], []) for k in ROWS}
        self.na = {}

    def add(self, key, ours, theirs, ratio):
        t, p, r = self.rounds[key]
        t.append(ours)
        p.append(theirs)
        r.append(ratio)

    def skip(self, keys, why):
        for k in keys:
            self.na.setdefault(k, why)


def collect(out, table):
    problems = []
    rounds = numbered(out, "client")
    go_missing = None
    if os.path.exists(f"{out}/go_missing.txt"):
        go_missing = open(f"{out}/go_missing.txt").read().strip()
    go_keys = [k[0] for k in ROWS if "go" in k[3].split()]
    gr_keys = [k[0] for k in ROWS if "gr" in k[3].split()]
    if go_missing:
        table.skip(go_keys + gr_keys, go_missing)

    # client
    if not rounds:
        table.skip([k[0] for k in ROWS if k[3].startswith("c")],
                   "client_bench not built (Google Benchmark)")
    for r in rounds:
        medians, bad, _ = quiet_load(f"{out}/client.{r}.json")
        problems += bad
        cpu = {}
        for name, entries in medians.items():
            cpu[name] = cbs.figure(entries, "cpu")[0]
        tok1 = cpu.get("tm_tokens/caller_ts/threads:1")
        tok2 = cpu.get("tm_tokens/caller_ts/threads:2")
        now1 = cpu.get("tm_tokens/now/threads:1")
        clock = cpu.get("clock_gettime_monotonic")
        table.add("tm_tokens_caller_1t", tok1, 15.0, tok1 / 15.0)
        table.add("tm_tokens_caller_2t", tok2, 15.0, tok2 / 15.0)
        table.add("tm_tokens_now_1t", now1, 35.0, now1 / 35.0)
        table.add("tm_tokens_now_clock", now1, clock, now1 / clock)
        static = f"{out}/static.{r}.json"
        if os.path.exists(static):
            smed, bad, _ = quiet_load(static)
            problems += bad
            st = cbs.figure(smed["tm_tokens/caller_ts/threads:1"], "cpu")[0]
            table.add("tm_tokens_shared_static", tok1, st, tok1 / st)
        for threads, tok in ((1, tok1), (2, tok2)):
            prom = cpu.get(f"prometheus_observe/threads:{threads}")
            key = f"prometheus_cpp_observe_{threads}t"
            if prom is None:
                table.skip([key], "prometheus-cpp not found at build time")
            else:
                table.add(key, tok, prom, prom / tok)
        go = f"{out}/go_observe.{r}.txt"
        if os.path.exists(go):
            res = results(go)
            for threads, tok in ((1, tok1), (2, tok2)):
                for peer in ("client_golang_classic", "client_golang_native",
                             "victoriametrics"):
                    v = res[f"observe_{peer}_g{threads}_ns"]
                    table.add(f"{peer}_{threads}t", tok, v, v / tok)
    # the static library is built with the shared one: absent only when the
    # client bench is
    table.skip(["tm_tokens_shared_static"], "client_bench_static not run")

    # render
    render_rounds = numbered(out, "render")
    if not render_rounds:
        table.skip([k[0] for k in ROWS if k[0].startswith("render_")],
                   "daemon_render_bench not built (Google Benchmark, "
                   "prometheus-cpp)")
    samples = {}
    for r in render_rounds:
        cpu = gb_cpu(f"{out}/render.{r}.json")
        text = cpu["tokenmeterd_render"]
        pb = cpu["tokenmeterd_render_protobuf"]
        prom = cpu["prometheus_cpp_collect_serialize"]
        table.add("render_prometheus_cpp", text, prom, prom / text)
        table.add("render_protobuf_text", pb, text, pb / text)
        lib = cpu.get("tokenmeterd_render_protobuf_library")
        if lib is None:
            table.skip(["render_libprotobuf"], "built without libprotobuf "
                       "(protobuf-compiler, libprotobuf-dev)")
        else:
            table.add("render_libprotobuf", pb, lib, lib / pb)
        samples.update(results(f"{out}/render.{r}.log"))
        go = f"{out}/go_render.{r}.txt"
        if os.path.exists(go):
            res = results(go)
            samples.update(res)
            for key, name, ours in (
                    ("render_client_golang_text", "client_golang_text", text),
                    ("render_victoriametrics", "victoriametrics_text", text),
                    ("render_client_golang_protobuf", "client_golang_protobuf",
                     pb)):
                v = res[f"render_{name}_ms"]
                table.add(key, ours, v, v / ours)

    # ingest
    res = results(f"{out}/ingest.txt")
    if res.get("ingest_runs_void", 1) != 0:
        problems.append("ingest: a run was VOID (not every event applied)")
    d = res.get("ingest_daemon_events_per_cpu_s")
    c = res.get("ingest_ceiling_events_per_cpu_s")
    if d and c:
        table.add("ingest_ceiling", d / 1e6, c / 1e6, d / c)
        table.add("ingest_limit", d / 1e6, 5.0, d / 5e6)

    # Python
    py = f"{out}/python.json"
    if os.path.exists(py):
        with open(py, encoding="utf-8") as f:
            data = json.load(f)
        if not data["valid"]:
            problems.append("python: the run was INVALID: %s" % data["stats"])
        cases = data["cases"]
        obs = cases["prometheus observe"]["median_cpu_ns"]
        for key, name in (("python_tokens_int", "tokens(int)"),
                          ("python_tokens_str", "tokens(str)")):
            table.add(key, cases[name]["median_cpu_ns"], obs,
                      cases[name]["paired_observe_ratio"])
        b = cases["tokens_batch list[int] x256"]["median_cpu_ns"]
        table.add("python_batch_256", b, 10.0, b / 10.0)
    else:
        why = "the Python run did not happen"
        if os.path.exists(f"{out}/python_missing.txt"):
            why = open(f"{out}/python_missing.txt").read().strip()
        table.skip([k[0] for k in ROWS if k[3] == "p"], why)
    return problems, samples


def fmt(v, unit):
    if v is None:
        return "n/a"
    if unit == "ms":
        return "%.3f ms" % v
    if unit == "M ev/CPU-s":
        return "%.2f M" % v
    return "%.1f ns" % v


def main(argv):
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[0]
    header = {}
    with open(f"{out}/header.txt", encoding="utf-8") as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition(" ")
            header[k] = v.strip()
    table = Table()
    problems, samples = collect(out, table)

    print("| figure | tokenmeter | peer or limit (same run) | ratio | goal | |")
    print("|---|---:|---:|---:|---|---|")
    for key, figure, unit, source, op, goal in ROWS:
        t, p, r = table.rounds[key]
        srcs = " ".join("[%s]" % s for s in source.split())
        goal_text = "%s %g" % (op, goal) if op else "(none)"
        if not r:
            why = table.na.get(key, "not measured")
            print(f"| {figure} {srcs} | n/a | n/a | n/a | {goal_text} | "
                  f"SKIP: {why} |")
            continue
        ratio = statistics.median(r)
        verdict = ""
        if op == ">=":
            verdict = "PASS" if ratio >= goal else "MISS"
        elif op == "<=":
            verdict = "PASS" if ratio <= goal else "MISS"
        print(f"| {figure} {srcs} | {fmt(statistics.median(t), unit)} | "
              f"{fmt(statistics.median(p), unit)} | **{ratio:.2f}** | "
              f"{goal_text} | {verdict} |")
    print()
    print(f"Commit {header.get('commit', '?')}; {header.get('machine', '?')}; "
          f"build {header.get('build', '?')}; {header.get('mode', '?')}; "
          f"load average (1/5/15 min) {header.get('load_start', '?')} at the "
          f"start, {header.get('load_end', '?')} at the end.")
    if "render_samples" in samples:
        extra = ""
        if "render_client_golang_samples" in samples:
            extra = (", client_golang %d, VictoriaMetrics %d (its own "
                     "buckets); native buckets populated: tokenmeterd %d, "
                     "client_golang %d" % (
                         samples["render_client_golang_samples"],
                         samples["render_victoriametrics_samples"],
                         samples["render_tokenmeterd_native_buckets"],
                         samples["render_client_golang_native_buckets"]))
        print(f"Render registry: {int(samples['render_identities'])} engine "
              f"series identities, {int(samples['render_samples'])} samples "
              f"in tokenmeterd's text{extra}.")
    print()
    print("Commands (the rows' [keys]; in the source tree, OUT a folder "
          "for the outputs):")
    src = os.path.dirname(HERE)
    with open(f"{out}/commands.txt", encoding="utf-8") as f:
        seen = set()
        for line in f:
            line = line.rstrip("\n").replace(src + "/", "")
            line = line.replace(os.path.abspath(out), "$OUT")
            # one line per distinct command (the rounds repeat them, their
            # outputs numbered by round)
            line = re.sub(r"\.\d+\.json\b", ".N.json", line)
            if line not in seen:
                seen.add(line)
                print("    " + line)
    for p in problems:
        print("INVALID " + p)
    return 3 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
