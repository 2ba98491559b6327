#!/usr/bin/python3
"""The shared library's cost against the static one's, in one run.

Usage: client_shared_static.py BUILD [BUILD...] [--rounds N]
           [--repetitions N] [--min-time S] [--filter REGEX] [--out DIR]

Each BUILD is a meson build directory with bench/client_bench (the shared
library) and bench/client_bench_static built (release, alike). A round runs
every binary of every build once, in an order that rotates from round to
round (and is reversed every other round), so that no binary always runs
first; each run interleaves its cases at random
(--benchmark_enable_random_interleaving) and keeps the median of its
repetitions. Figures are CPU ns per call of the calling thread.

Printed, per case: each binary's median over the rounds, then the ratios
of runs next to each other in time, the median of the per-round ratios
(with the smallest and largest): shared/static per build, and, given two or
more builds, new/old (each later build against the first) per linkage.
On a loaded machine a ratio of neighbours is steadier than a figure.

Exit status: 0 when every run was valid; 2 on a usage error or a failed or
invalid run (a benchmark errored, or a repetition dropped or rejected events
or sent fewer than it made calls).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

BINARIES = (("shared", "client_bench"), ("static", "client_bench_static"))


def parse(argv):
    p = argparse.ArgumentParser(add_help=True, usage=__doc__)
    p.add_argument("builds", nargs="+")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--repetitions", type=int, default=5)
    p.add_argument("--min-time", default="0.1")
    p.add_argument("--filter", default="^tm_tokens/caller_ts/threads:[12]$")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def commit_of(build):
    """The source tree's commit (and a mark when client_lib differs)."""
    info = json.loads(subprocess.run(
        ["meson", "introspect", "--projectinfo", build],
        capture_output=True, text=True, check=False).stdout or "{}")
    src = None
    buildtype = "?"
    cpp_args = []
    for opt in json.loads(subprocess.run(
            ["meson", "introspect", "--buildoptions", build],
            capture_output=True, text=True, check=False).stdout or "[]"):
        if opt.get("name") == "buildtype":
            buildtype = opt.get("value")
        if opt.get("name") == "cpp_args":
            cpp_args = opt.get("value") or []
    bi = os.path.join(build, "meson-info", "meson-info.json")
    if os.path.exists(bi):
        with open(bi, encoding="utf-8") as f:
            src = json.load(f).get("directories", {}).get("source")
    rev = "?"
    if src:
        r = subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, check=False)
        rev = r.stdout.strip() or "?"
        d = subprocess.run(["git", "-C", src, "diff", "--quiet", "HEAD", "--",
                            "client_lib"], check=False)
        if d.returncode != 0:
            rev += " (client_lib modified)"
    return "%s %s, %s%s" % (info.get("version", "?"), rev, buildtype,
                            ", cpp_args " + " ".join(cpp_args)
                            if cpp_args else "")


def run_one(binary, args, out_path):
    """{case: median cpu ns} of one run, or raises RuntimeError."""
    cmd = [binary, "--benchmark_filter=" + args.filter,
           "--benchmark_repetitions=%d" % args.repetitions,
           "--benchmark_min_time=%s" % args.min_time,
           "--benchmark_enable_random_interleaving=true",
           "--benchmark_display_aggregates_only=true",
           "--benchmark_out_format=json", "--benchmark_out=" + out_path]
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError("%s exited %d: %s" %
                           (binary, r.returncode, r.stderr.strip()[-500:]))
    with open(out_path, encoding="utf-8") as f:
        data = json.load(f)
    medians = {}
    for b in data["benchmarks"]:
        name = b.get("run_name", b["name"])
        if b.get("error_occurred"):
            raise RuntimeError("%s: %s: %s" %
                               (binary, b["name"], b.get("error_message")))
        if b["run_type"] == "iteration":
            if (b.get("dropped", -1) != 0 or b.get("rejected", -1) != 0 or
                    b.get("events_sent") != b["iterations"]):
                raise RuntimeError(
                    "%s: %s: dropped=%s rejected=%s events_sent=%s calls=%s" %
                    (binary, name, b.get("dropped"), b.get("rejected"),
                     b.get("events_sent"), b["iterations"]))
        if b.get("aggregate_name") == "median":
            medians[name] = b["cpu_time"]
    if not medians:
        raise RuntimeError("%s: no case matched %s" % (binary, args.filter))
    return medians


def spread(values):
    return "%.3f [%.3f .. %.3f]" % (statistics.median(values), min(values),
                                    max(values))


def main(argv):
    args = parse(argv)
    runs = []  # (build index, linkage, path)
    for i, build in enumerate(args.builds):
        for linkage, name in BINARIES:
            path = os.path.join(build, "bench", name)
            if not os.access(path, os.X_OK):
                print("client_shared_static: %s: not built" % path,
                      file=sys.stderr)
                return 2
            runs.append((i, linkage, path))
    out_dir = args.out or tempfile.mkdtemp(prefix="tm-shared-static.")
    os.makedirs(out_dir, exist_ok=True)

    print("machine: %d CPUs, %s" % (os.cpu_count(), cpu_model()))
    for i, build in enumerate(args.builds):
        print("build %d: %s (%s)" % (i, build, commit_of(build)))
    print("load average at start: %s" % load_avg())
    # figures[(build, linkage)][case] = [median per round]
    figures = {}
    for rnd in range(args.rounds):
        order = runs[rnd % len(runs):] + runs[:rnd % len(runs)]
        if rnd % 2 == 1:
            order.reverse()
        for i, linkage, path in order:
            out = os.path.join(out_dir, "b%d-%s-r%d.json" % (i, linkage, rnd))
            try:
                medians = run_one(path, args, out)
            except RuntimeError as e:
                print("client_shared_static: INVALID %s" % e, file=sys.stderr)
                print("raw outputs kept in %s" % out_dir, file=sys.stderr)
                return 2
            for case, ns in medians.items():
                figures.setdefault((i, linkage), {}).setdefault(case,
                                                               []).append(ns)
    print("load average at end:   %s" % load_avg())
    print("%d rounds, each binary %d repetitions of %s s per case; raw "
          "outputs in %s" % (args.rounds, args.repetitions, args.min_time,
                             out_dir))

    cases = sorted(figures[(0, "shared")])
    print()
    print("Median CPU ns per call over the rounds:")
    for case in cases:
        for i in range(len(args.builds)):
            print("  %-32s build %d  shared %6.2f  static %6.2f" %
                  (case, i, statistics.median(figures[(i, "shared")][case]),
                   statistics.median(figures[(i, "static")][case])))
    print()
    print("Ratios of neighbours in time, median [min .. max] over the rounds:")
    for case in cases:
        for i in range(len(args.builds)):
            r = [s / t for s, t in zip(figures[(i, "shared")][case],
                                       figures[(i, "static")][case])]
            d = [s - t for s, t in zip(figures[(i, "shared")][case],
                                       figures[(i, "static")][case])]
            print("  %-32s build %d  shared/static %s  shared-static %+.2f ns"
                  % (case, i, spread(r), statistics.median(d)))
        for i in range(1, len(args.builds)):
            for linkage, _ in BINARIES:
                r = [n / o for n, o in zip(figures[(i, linkage)][case],
                                           figures[(0, linkage)][case])]
                print("  %-32s build %d/build 0 %-6s %s" %
                      (case, i, linkage, spread(r)))
    return 0


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def load_avg():
    try:
        with open("/proc/loadavg", encoding="utf-8") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
