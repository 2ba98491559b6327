#!/usr/bin/python3
"""Summarizes client_bench JSON output: medians, ratios, goals.

Usage: client_bench_summary.py RUN.json... [--static STATIC.json...]

Each RUN.json is one `client_bench --benchmark_repetitions=N
--benchmark_out_format=json` run. A case's figure is the median over the
repetitions of one run (Google Benchmark's `median` aggregate), then the
median of those over the runs. "ns/call" is CPU time per call of the calling
thread; "wall" is wall-clock time per call per thread (real_time x threads).

Exit status: 0 when the figures are valid, whatever the goals say; 3 when
a run is invalid (a benchmark errored, or a tm_* repetition dropped or
rejected events, or sent fewer events than it made calls).
"""

import json
import statistics
import sys

CALLER_TS_GOAL_NS = 15.0
NOW_GOAL_NS = 35.0
RATIO_GOAL = 1.8

ROWS = [
    ("tm_tokens/caller_ts", "tm_tokens, caller t_ns"),
    ("tm_tokens/now", "tm_tokens, t_ns = 0 (now)"),
    ("tm_arrived/caller_ts", "tm_arrived, caller t_ns"),
    ("tm_arrived/now", "tm_arrived, t_ns = 0 (now)"),
    ("tm_tokens/caller_ts/ack_off", "tm_tokens, caller t_ns, ack off"),
    ("tm_arrived/caller_ts/ack_off", "tm_arrived, caller t_ns, ack off"),
    ("tm_kv_transfer/caller_ts", "tm_kv_transfer, caller t_ns"),
    ("tm_kv_transfer/now", "tm_kv_transfer, t_ns = 0 (now)"),
    ("tm_admission_rejected/caller_ts", "tm_admission_rejected, caller t_ns"),
    ("tm_admission_rejected/now", "tm_admission_rejected, t_ns = 0"),
    ("tm_kv_transfer_id/caller_ts", "tm_kv_transfer, ids, caller t_ns"),
    ("tm_kv_transfer_id/now", "tm_kv_transfer, ids, t_ns = 0"),
    ("tm_admission_rejected_id/caller_ts", "tm_admission_rejected_id, caller"),
    ("tm_admission_rejected_id/now", "tm_admission_rejected_id, t_ns = 0"),
    ("tm_admission_rejected_id_rid/caller_ts",
     "tm_admission_rejected_id_rid, caller"),
    ("prometheus_observe", "prometheus-cpp Histogram::Observe"),
    ("clock_gettime_monotonic", "clock_gettime(CLOCK_MONOTONIC)"),
    ("mutex_lock_unlock", "std::mutex lock+unlock, uncontended"),
]


def load(paths):
    """Returns ({run_name: [median entry per run]}, problems, checked)."""
    medians = {}
    problems = []
    checked = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        load_avg = data.get("context", {}).get("load_avg")
        if load_avg:
            print("%s: load average at start %s" %
                  (path, " ".join("%.2f" % x for x in load_avg)))
        for b in data["benchmarks"]:
            name = b.get("run_name", b["name"])
            if b.get("error_occurred"):
                problems.append("%s: %s: %s" %
                                (path, b["name"], b.get("error_message")))
                continue
            if b["run_type"] == "iteration" and name.startswith("tm_"):
                checked += 1
                if (b.get("dropped", -1) != 0 or b.get("rejected", -1) != 0 or
                        b.get("events_sent") != b["iterations"]):
                    problems.append(
                        "%s: %s repetition %s: dropped=%s rejected=%s "
                        "events_sent=%s calls=%s" %
                        (path, name, b.get("repetition_index"),
                         b.get("dropped"), b.get("rejected"),
                         b.get("events_sent"), b["iterations"]))
            if b.get("aggregate_name") == "median":
                medians.setdefault(name, []).append(b)
    return medians, problems, checked


def figure(entries, key):
    """Median over runs of a per-run median; key 'cpu' or 'wall'."""
    if key == "cpu":
        values = [e["cpu_time"] for e in entries]
    else:
        values = [e["real_time"] * e["threads"] for e in entries]
    return statistics.median(values), values


def verdict(ok):
    return "PASS" if ok else "MISS"


def main(argv):
    if "--static" in argv:
        i = argv.index("--static")
        run_paths, static_paths = argv[:i], argv[i + 1:]
    else:
        run_paths, static_paths = argv, []
    if not run_paths:
        print(__doc__, file=sys.stderr)
        return 2
    medians, problems, checked = load(run_paths)
    static_medians, static_problems, static_checked = load(static_paths)
    problems += static_problems
    checked += static_checked

    print()
    print("Medians over repetitions, then over %d run(s); ns per call." %
          len(run_paths))
    header = "%-40s %7s %9s %9s  %s" % ("case", "threads", "ns/call",
                                         "wall", "ns/call in each run")
    print(header)
    print("-" * len(header))
    cpu = {}
    for prefix, label in ROWS:
        for threads in (1, 2):
            for name in ("%s/threads:%d" % (prefix, threads),
                         prefix if threads == 1 else None):
                if name is None or name not in medians:
                    continue
                c, per_run = figure(medians[name], "cpu")
                w, _ = figure(medians[name], "wall")
                cpu[(prefix, threads)] = c
                print("%-40s %7d %9.1f %9.1f  %s" %
                      (label, threads, c, w,
                       " ".join("%.1f" % v for v in per_run)))
                break

    if ("prometheus_observe", 2) in cpu:
        print("(prometheus_observe at 2 threads: both threads observe one "
              "child, so they contend\n for its mutex; a thread that waits "
              "sleeps, and only wall time shows that wait.)")

    if static_medians:
        print()
        print("Statically linked library (informational), same cases:")
        for prefix, label in ROWS:
            for threads in (1, 2):
                name = "%s/threads:%d" % (prefix, threads)
                if name not in static_medians:
                    continue
                c, per_run = figure(static_medians[name], "cpu")
                shared = cpu.get((prefix, threads))
                delta = ("  (shared library: %+.1f ns)" % (shared - c)
                         if shared is not None else "")
                print("%-40s %7d %9.1f%s" % (label, threads, c, delta))

    print()
    print("Checks: %d repetitions of tm_* cases, each with dropped=0, "
          "rejected=0 and events_sent == calls: %s" %
          (checked, "OK" if not problems else "FAILED"))
    for p in problems:
        print("  INVALID " + p)

    print()
    print("Goals (ns/call = median CPU time per call):")
    for prefix in ("tm_tokens/caller_ts", "tm_arrived/caller_ts"):
        for threads in (1, 2):
            if (prefix, threads) in cpu:
                v = cpu[(prefix, threads)]
                print("  %-24s %d thread(s): %5.1f ns (goal <= %.0f ns) %s" %
                      (prefix, threads, v, CALLER_TS_GOAL_NS,
                       verdict(v <= CALLER_TS_GOAL_NS)))
    for prefix in ("tm_tokens/now", "tm_arrived/now"):
        for threads in (1, 2):
            if (prefix, threads) in cpu:
                v = cpu[(prefix, threads)]
                print("  %-24s %d thread(s): %5.1f ns (goal <= %.0f ns) %s" %
                      (prefix, threads, v, NOW_GOAL_NS,
                       verdict(v <= NOW_GOAL_NS)))
    # Protocol 1.2: each of these at most what a TOKENS costs, same
    # timestamp mode, same threads, with the reason and connector
    # registered (the goal); with a string per call for comparison (a pass
    # over each string: informational).
    for calls, goal in (
            (("tm_kv_transfer_id", "tm_admission_rejected_id",
              "tm_admission_rejected_id_rid"), True),
            (("tm_kv_transfer", "tm_admission_rejected"), False)):
        if not goal:
            print("  Informational, a string per call:")
        for call in calls:
            for mode in ("caller_ts", "now"):
                for threads in (1, 2):
                    v = cpu.get(("%s/%s" % (call, mode), threads))
                    t = cpu.get(("tm_tokens/%s" % mode, threads))
                    if v is None or t is None:
                        continue
                    print("  %-38s %d thread(s): %5.1f ns (%s tm_tokens "
                          "%.1f ns)%s" %
                          ("%s/%s" % (call, mode), threads, v,
                           "goal <=" if goal else "vs", t,
                           " " + verdict(v <= t) if goal else ""))
    clock = cpu.get(("clock_gettime_monotonic", 1))
    if clock is not None:
        print("  (clock_gettime(CLOCK_MONOTONIC) alone: %.1f ns)" % clock)

    prom = cpu.get(("prometheus_observe", 1))
    tokens = cpu.get(("tm_tokens/caller_ts", 1))
    arrived = cpu.get(("tm_arrived/caller_ts", 1))
    if prom is None or tokens is None:
        print("ratio prometheus-cpp observe / tm_tokens: not measured "
              "(prometheus-cpp not found at build time)")
    else:
        if arrived is not None:
            print("ratio prometheus-cpp observe / tm_arrived = %.1fx "
                  "(informational)" % (prom / arrived))
        ratio = prom / tokens
        print("ratio prometheus-cpp observe / tm_tokens = %.1fx "
              "(goal >= %.1fx) %s" % (ratio, RATIO_GOAL,
                                      verdict(ratio >= RATIO_GOAL)))
    return 3 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
