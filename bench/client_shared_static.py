#!/usr/bin/python3
"""The shared library's cost against the static one's, in one run.

Usage: client_shared_static.py BUILD [BUILD...] [--rounds N]
           [--repetitions N] [--min-time S] [--modes caller_ts,now]
           [--kinds shared,static,pair] [--out DIR]

Each BUILD is a meson build directory with bench/client_bench (linked
against the shared library) and bench/client_bench_static built (release,
configured alike). Per build, three kinds of run of the tm_tokens cases
(CPU ns per call of the calling thread, at 1 and 2 threads):
  shared   bench/client_bench
  static   bench/client_bench_static
  pair     bench/client_bench_static --shared_library=BUILD's
           libtokenmeter.so: in one process the static library's cases and
           the same calls on a dlopen()ed copy of the shared library
           (dlopen/..., through pointers), interleaved at random
A round makes every run of every build once, in an order that rotates from
round to round (and is reversed every other round), so that no run always
goes first; every run interleaves its cases at random
(--benchmark_enable_random_interleaving) over its repetitions.

Printed, per case: each run's median over the rounds; then ratios, each the
median over the rounds (with the smallest and largest) of a ratio taken
within one round: shared/static of the two programs run next to each other,
dlopen/static inside the pair's process (no other program between them,
the steadiest), and, given two or more builds, each later build against the
first; then the fastest repetition of each over the whole run, and their
ratios (load only ever adds time, so the fastest are the least disturbed).

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

KINDS = ("shared", "static", "pair")


def parse(argv):
    p = argparse.ArgumentParser(usage=__doc__)
    p.add_argument("builds", nargs="+")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--repetitions", type=int, default=5)
    p.add_argument("--min-time", default="0.1")
    p.add_argument("--modes", default="caller_ts")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.kinds = args.kinds.split(",")
    if not args.kinds or any(k not in KINDS for k in args.kinds):
        p.error("--kinds: a list of " + ", ".join(KINDS))
    return args


def describe(build):
    """The build's version, source commit, buildtype and cpp_args."""
    def introspect(what, default):
        r = subprocess.run(["meson", "introspect", what, build],
                           capture_output=True, text=True, check=False)
        return json.loads(r.stdout or default)
    info = introspect("--projectinfo", "{}")
    buildtype, cpp_args = "?", []
    for opt in introspect("--buildoptions", "[]"):
        if opt.get("name") == "buildtype":
            buildtype = opt.get("value")
        if opt.get("name") == "cpp_args":
            cpp_args = opt.get("value") or []
    rev = "?"
    path = os.path.join(build, "meson-info", "meson-info.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            src = json.load(f).get("directories", {}).get("source")
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


def command(build, kind, args):
    modes = args.modes.replace(",", "|")
    exe = "client_bench" if kind == "shared" else "client_bench_static"
    extra, prefix = [], ""
    if kind == "pair":
        lib = os.path.abspath(os.path.join(build, "client_lib",
                                           "libtokenmeter.so"))
        extra, prefix = ["--shared_library=" + lib], "(dlopen/)?"
    return [os.path.join(build, "bench", exe),
            "--benchmark_filter=^%stm_tokens/(%s)/threads:[12]$" %
            (prefix, modes),
            "--benchmark_repetitions=%d" % args.repetitions,
            "--benchmark_min_time=%s" % args.min_time,
            "--benchmark_enable_random_interleaving=true",
            "--benchmark_display_aggregates_only=true",
            "--benchmark_out_format=json"] + extra


def run_one(cmd, out_path):
    """{case: (median, fastest) cpu ns} of one run, or raises RuntimeError."""
    r = subprocess.run(cmd + ["--benchmark_out=" + out_path],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError("%s exited %d: %s" %
                           (cmd[0], r.returncode, r.stderr.strip()[-500:]))
    with open(out_path, encoding="utf-8") as f:
        data = json.load(f)
    medians, fastest = {}, {}
    for b in data["benchmarks"]:
        name = b.get("run_name", b["name"])
        if b.get("error_occurred"):
            raise RuntimeError("%s: %s: %s" %
                               (cmd[0], b["name"], b.get("error_message")))
        if b["run_type"] == "iteration":
            if (b.get("dropped", -1) != 0 or b.get("rejected", -1) != 0 or
                    b.get("events_sent") != b["iterations"]):
                raise RuntimeError(
                    "%s: %s: dropped=%s rejected=%s events_sent=%s calls=%s" %
                    (cmd[0], name, b.get("dropped"), b.get("rejected"),
                     b.get("events_sent"), b["iterations"]))
            fastest[name] = min(fastest.get(name, b["cpu_time"]),
                                b["cpu_time"])
        if b.get("aggregate_name") == "median":
            medians[name] = b["cpu_time"]
    if not medians:
        raise RuntimeError("%s: no case matched" % cmd[0])
    return {name: (medians[name], fastest[name]) for name in medians}


def spread(values):
    return "%.3f [%.3f .. %.3f]" % (statistics.median(values), min(values),
                                    max(values))


def main(argv):
    args = parse(argv)
    runs = []  # (build index, kind)
    for i, build in enumerate(args.builds):
        for kind in args.kinds:
            exe = command(build, kind, args)[0]
            if not os.access(exe, os.X_OK):
                print("client_shared_static: %s: not built" % exe,
                      file=sys.stderr)
                return 2
            runs.append((i, kind))
    out_dir = args.out or tempfile.mkdtemp(prefix="tm-shared-static.")
    os.makedirs(out_dir, exist_ok=True)

    print("machine: %d CPUs, %s" % (os.cpu_count(), cpu_model()))
    for i, build in enumerate(args.builds):
        print("build %d: %s (%s)" % (i, build, describe(build)))
    print("load average at start: %s" % load_avg())
    # series[(build, figure)][case] = [median per round], where figure is
    # a kind, or "pair:static" / "pair:dlopen" for the pair's two sides;
    # best[(build, figure)][case] = the fastest repetition of all rounds.
    series, best = {}, {}
    for rnd in range(args.rounds):
        order = runs[rnd % len(runs):] + runs[:rnd % len(runs)]
        if rnd % 2 == 1:
            order.reverse()
        for i, kind in order:
            out = os.path.join(out_dir, "b%d-%s-r%d.json" % (i, kind, rnd))
            try:
                result = run_one(command(args.builds[i], kind, args), out)
            except RuntimeError as e:
                print("client_shared_static: INVALID %s" % e, file=sys.stderr)
                print("raw outputs kept in %s" % out_dir, file=sys.stderr)
                return 2
            for name, (median, fast) in result.items():
                figure, case = kind, name
                if kind == "pair":
                    figure = "pair:dlopen" if name.startswith(
                        "dlopen/") else "pair:static"
                    case = name[len("dlopen/"):] if name.startswith(
                        "dlopen/") else name
                series.setdefault((i, figure), {}).setdefault(
                    case, []).append(median)
                b = best.setdefault((i, figure), {})
                b[case] = min(b.get(case, fast), fast)
    print("load average at end:   %s" % load_avg())
    print("%d rounds; each run %d repetitions of %s s per case; raw "
          "outputs in %s" % (args.rounds, args.repetitions, args.min_time,
                             out_dir))

    figures = [f for f in ("shared", "static", "pair:static", "pair:dlopen")
               if (0, f) in series]
    cases = sorted(next(iter(series.values())))
    n = len(args.builds)
    print()
    print("Median CPU ns per call over the rounds (fastest repetition):")
    for case in cases:
        for i in range(n):
            print("  %-30s build %d  %s" % (case, i, "  ".join(
                "%s %.2f (%.2f)" % (f, statistics.median(series[(i, f)][case]),
                                    best[(i, f)][case]) for f in figures)))

    def ratio(a, b, case):
        return [x / y for x, y in zip(series[a][case], series[b][case])]

    pairs = [("shared", "static", "shared/static, two programs"),
             ("pair:dlopen", "pair:static", "dlopen/static, one process")]
    print()
    print("Ratios within each round, median [min .. max] over the rounds; "
          "then the ratio of the fastest repetitions:")
    for case in cases:
        for i in range(n):
            for a, b, label in pairs:
                if (i, a) in series and (i, b) in series:
                    print("  %-30s build %d  %-27s %s  fastest %.3f" %
                          (case, i, label, spread(ratio((i, a), (i, b), case)),
                           best[(i, a)][case] / best[(i, b)][case]))
        for i in range(1, n):
            for f in figures:
                print("  %-30s build %d/build 0  %-19s %s  fastest %.3f" %
                      (case, i, f, spread(ratio((i, f), (0, f), case)),
                       best[(i, f)][case] / best[(0, f)][case]))
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
