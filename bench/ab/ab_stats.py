#!/usr/bin/python3
"""Statistics and verdicts for bench/ab/run_ab.sh (old against new, one run).

Subcommands:
  summarize DIR [threshold flags]
      Reads the raw outputs run_ab.sh left in DIR, named METRIC.SIDE.REP.EXT
      (SIDE old or new, REP 1..N), pairs old and new of the same REP, and
      prints per metric the median of the per-pair ratios new/old, their
      spread (min .. max, and every ratio), the old and new medians, then one
      PASS/FAIL line per requirement. Exit 0: every requirement of the
      metrics found passed; 1: at least one FAIL; 2: a run is invalid (a
      benchmark errored, dropped events, a VOID ingest run, a REP with only
      one side) or nothing was found.
  describe BUILD
      One line: the build's buildtype, b_ndebug and source commit.
  source BUILD
      The source directory the build was configured from.
  --self-test
      Runs summarize on synthetic outputs written to a temporary directory:
      equal figures must PASS, a slower new side and a tightened threshold
      must FAIL, an errored run must be invalid. Needs no build.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

# (key, file metric, label, unit, scale, lower_is_better). The file metric
# names the raw outputs the figure is read from; see FIGURE_READERS.
METRICS = [
    ("client_tokens", "client", "tm_tokens, caller t_ns, 1 thread, CPU",
     "ns/call", 1.0, True),
    ("client_arrived", "client", "tm_arrived, caller t_ns, 1 thread, CPU",
     "ns/call", 1.0, True),
    ("ingest", "ingest", "ingest, tokenmeterd, per receiver CPU-second",
     "M ev/CPU-s", 1e-6, False),
    ("render", "render", "/metrics render (~12.5k samples), CPU",
     "ms", 1.0, True),
    ("rss", "rss", "RSS per tracked request, integer ids", "B", 1.0, True),
]

CLIENT_CASES = {
    "client_tokens": "tm_tokens/caller_ts/threads:1",
    "client_arrived": "tm_arrived/caller_ts/threads:1",
}
RENDER_CASE = "tokenmeterd_render"

# Issue 12's requirements. (metric, kind, threshold flag, default, text):
# kind "max_abs" judges the new side's median figure, "max_ratio" and
# "min_ratio" the median of the per-pair ratios new/old.
REQUIREMENTS = [
    ("client_tokens", "max_abs", "client_max_ns", 15.0),
    ("client_tokens", "max_ratio", "client_max_ratio", 1.10),
    ("client_arrived", "max_abs", "client_max_ns", 15.0),
    ("client_arrived", "max_ratio", "client_max_ratio", 1.10),
    ("ingest", "min_ratio", "ingest_min_ratio", 0.95),
    ("render", "max_ratio", "render_max_ratio", 1.10),
    ("rss", "max_abs", "rss_max_bytes", 200.0),
]


class InvalidRun(Exception):
    """A raw output that is not a valid measurement."""


def results(path):
    """The "RESULT key=value" lines of a text output, as floats."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"RESULT (\w+)=(\S+)", line)
            if m:
                out[m.group(1)] = float(m.group(2))
    return out


def gbench_median(path, case, check_events):
    """Median aggregate of one Google Benchmark case: (cpu, unit).

    With check_events, every repetition must have dropped and rejected
    nothing and sent every call it made (client_bench's counters)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    median = None
    for b in data.get("benchmarks", []):
        if b.get("run_name", b["name"]) != case:
            continue
        if b.get("error_occurred"):
            raise InvalidRun(f"{path}: {b['name']}: {b.get('error_message')}")
        if check_events and b.get("run_type") == "iteration":
            if (b.get("dropped", -1) != 0 or b.get("rejected", -1) != 0 or
                    b.get("events_sent") != b["iterations"]):
                raise InvalidRun(
                    f"{path}: {case} repetition {b.get('repetition_index')}: "
                    f"dropped={b.get('dropped')} rejected={b.get('rejected')} "
                    f"events_sent={b.get('events_sent')} "
                    f"calls={b['iterations']}")
        if b.get("aggregate_name") == "median":
            median = b
    if median is None:
        raise InvalidRun(f"{path}: no median aggregate for {case}")
    return median["cpu_time"], median.get("time_unit", "ns")


def client_figure(key):
    def read(path):
        ns, unit = gbench_median(path, CLIENT_CASES[key], True)
        if unit != "ns":
            raise InvalidRun(f"{path}: {key} in {unit}, expected ns")
        return ns
    return read


def ingest_figure(path):
    r = results(path)
    if r.get("ingest_runs_void", 1) != 0 or \
            "ingest_daemon_events_per_cpu_s" not in r:
        raise InvalidRun(f"{path}: a void ingest run or no daemon figure")
    return r["ingest_daemon_events_per_cpu_s"]


def render_figure(path):
    t, unit = gbench_median(path, RENDER_CASE, False)
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
    if unit not in scale:
        raise InvalidRun(f"{path}: unknown time unit {unit}")
    return t * scale[unit]


def rss_figure(path):
    r = results(path)
    if "rss_bytes_per_request_int" not in r:
        raise InvalidRun(f"{path}: no rss_bytes_per_request_int")
    return r["rss_bytes_per_request_int"]


FIGURE_READERS = {
    "client_tokens": client_figure("client_tokens"),
    "client_arrived": client_figure("client_arrived"),
    "ingest": ingest_figure,
    "render": render_figure,
    "rss": rss_figure,
}


def collect(directory):
    """{metric key: [(rep, old figure, new figure)]} for every metric whose
    files are in directory. Raises InvalidRun."""
    files = {}  # (file metric, rep) -> {side: path}
    for name in os.listdir(directory):
        m = re.fullmatch(r"(\w+)\.(old|new)\.(\d+)\.(json|txt)", name)
        if m:
            files.setdefault((m.group(1), int(m.group(3))), {})[m.group(2)] = \
                os.path.join(directory, name)
    pairs = {}
    for key, file_metric, *_ in METRICS:
        for (fm, rep), sides in sorted(files.items()):
            if fm != file_metric:
                continue
            if set(sides) != {"old", "new"}:
                raise InvalidRun(f"{file_metric} rep {rep}: only "
                                 f"{', '.join(sides)} present")
            read = FIGURE_READERS[key]
            pairs.setdefault(key, []).append(
                (rep, read(sides["old"]), read(sides["new"])))
    return pairs


def summarize(directory, thresholds):
    """Prints the table and verdicts; returns the exit status."""
    try:
        pairs = collect(directory)
    except (InvalidRun, OSError, ValueError, KeyError) as e:
        print(f"INVALID {e}")
        return 2
    if not pairs:
        print(f"INVALID no benchmark outputs in {directory}")
        return 2
    print(f"{'metric':<46} {'unit':>10} {'old':>8} {'new':>8} "
          f"{'new/old':>7}  spread (min .. max; each pair)")
    stats = {}
    for key, _, label, unit, scale, _lower in METRICS:
        if key not in pairs:
            continue
        reps = pairs[key]
        ratios = [new / old for _, old, new in reps]
        old = statistics.median(o for _, o, _ in reps) * scale
        new = statistics.median(n for _, _, n in reps) * scale
        ratio = statistics.median(ratios)
        stats[key] = (new, ratio)
        print(f"{label:<46} {unit:>10} {old:8.2f} {new:8.2f} {ratio:7.3f}  "
              f"{min(ratios):.3f} .. {max(ratios):.3f}; "
              + " ".join(f"{r:.3f}" for r in ratios))
    print()
    failed = False
    skipped = set()
    for key, kind, flag, _default in REQUIREMENTS:
        label, unit = next((m[2], m[3]) for m in METRICS if m[0] == key)
        limit = thresholds[flag]
        if key not in stats:
            if key not in skipped:
                print(f"SKIP  {label}: not run")
            skipped.add(key)
            continue
        new, ratio = stats[key]
        if kind == "max_abs":
            ok, text = new <= limit, f"new {new:.2f} {unit} <= {limit:g} {unit}"
        elif kind == "max_ratio":
            ok, text = ratio <= limit, f"median new/old {ratio:.3f} <= {limit:.2f}"
        else:
            ok, text = ratio >= limit, f"median new/old {ratio:.3f} >= {limit:.2f}"
        failed |= not ok
        print(f"{'PASS' if ok else 'FAIL'}  {label}: {text}")
    return 1 if failed else 0


def add_threshold_flags(ap):
    for _, _, flag, default in REQUIREMENTS:
        if not any(a.dest == flag for a in ap._actions):
            ap.add_argument("--" + flag.replace("_", "-"), dest=flag,
                            type=float, default=default,
                            help=f"default {default:g}")


def source_dir(build):
    """The source directory a meson build dir was configured from."""
    with open(os.path.join(build, "meson-info", "meson-info.json"),
              encoding="utf-8") as f:
        return json.load(f)["directories"]["source"]


def describe(build):
    """'buildtype=... b_ndebug=... source ... commit' for a meson build."""
    with open(os.path.join(build, "meson-info", "intro-buildoptions.json"),
              encoding="utf-8") as f:
        opts = {o["name"]: o["value"] for o in json.load(f)}
    src = source_dir(build)

    def git(*args):
        r = subprocess.run(["git", "-C", src, *args], capture_output=True,
                           text=True, check=False)
        return r.returncode, r.stdout.strip()
    _, commit = git("rev-parse", "--short", "HEAD")
    dirty, _ = git("diff", "--quiet", "HEAD", "--", "client_lib", "daemon",
                   "bench")
    print(f"buildtype={opts.get('buildtype')} b_ndebug={opts.get('b_ndebug')} "
          f"source {src} at {commit or '?'}"
          + (" (client_lib/daemon/bench modified)" if dirty else ""))
    return 0


# ---------------------------------------------------------------------------
# Self-test on synthetic outputs.

def write_client(path, tokens_ns, arrived_ns, dropped=0):
    bms = []
    for case, ns in ((CLIENT_CASES["client_tokens"], tokens_ns),
                     (CLIENT_CASES["client_arrived"], arrived_ns)):
        for i, f in enumerate((1.02, 0.98, 1.0)):
            bms.append({"name": case, "run_name": case,
                        "run_type": "iteration", "repetition_index": i,
                        "iterations": 1000, "cpu_time": ns * f,
                        "time_unit": "ns", "dropped": dropped, "rejected": 0,
                        "events_sent": 1000})
        bms.append({"name": case + "_median", "run_name": case,
                    "run_type": "aggregate", "aggregate_name": "median",
                    "cpu_time": ns, "time_unit": "ns"})
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"benchmarks": bms}, f)


def write_outputs(directory, reps, client_ns=5.0, ingest=12e6, render=0.43,
                  rss_b=189.0, new_factor=None):
    """Old and new outputs for reps pairs; new_factor maps a file metric to
    the factor its new figure gets."""
    new_factor = new_factor or {}
    for rep in range(1, reps + 1):
        jitter = 1 + 0.01 * (rep % 3 - 1)
        for side in ("old", "new"):
            factors = new_factor if side == "new" else {}

            def f(metric, factors=factors):
                return factors.get(metric, 1.0)
            base = os.path.join(directory, "%s." + f"{side}.{rep}.")
            write_client(base % "client" + "json",
                         client_ns * jitter * f("client"),
                         client_ns * 1.1 * jitter * f("client"))
            with open(base % "ingest" + "txt", "w", encoding="utf-8") as o:
                o.write(f"RESULT ingest_daemon_events_per_cpu_s="
                        f"{ingest * jitter * f('ingest'):.0f}\n"
                        "RESULT ingest_runs_void=0\n")
            with open(base % "render" + "json", "w", encoding="utf-8") as o:
                json.dump({"benchmarks": [{
                    "name": RENDER_CASE + "_median", "run_name": RENDER_CASE,
                    "run_type": "aggregate", "aggregate_name": "median",
                    "cpu_time": render * jitter * f("render"),
                    "time_unit": "ms"}]}, o)
            with open(base % "rss" + "txt", "w", encoding="utf-8") as o:
                o.write(f"RESULT rss_bytes_per_request_int="
                        f"{rss_b * f('rss'):.1f}\n")


def self_test():
    defaults = {flag: d for _, _, flag, d in REQUIREMENTS}
    cases = [
        # (name, writer kwargs, threshold overrides, expected exit, expected
        #  FAIL lines)
        ("equal figures", {}, {}, 0, 0),
        ("client 20% slower", {"new_factor": {"client": 1.2}}, {}, 1, 2),
        ("client over 15 ns", {"client_ns": 14.5}, {}, 1, 1),
        ("ingest 10% lower", {"new_factor": {"ingest": 0.9}}, {}, 1, 1),
        ("render 4% slower", {"new_factor": {"render": 1.04}}, {}, 0, 0),
        ("render 15% slower", {"new_factor": {"render": 1.15}}, {}, 1, 1),
        ("rss 201 B", {"rss_b": 201.0}, {}, 1, 1),
        ("tightened: 1.00 must be <= 0.99", {},
         {"render_max_ratio": 0.99}, 1, 1),
    ]
    bad = 0
    for name, kwargs, overrides, want_rc, want_fails in cases:
        d = tempfile.mkdtemp(prefix="tm-ab-selftest-")
        try:
            write_outputs(d, 5, **kwargs)
            rc, out = run_captured(d, {**defaults, **overrides})
        finally:
            shutil.rmtree(d)
        fails = out.count("\nFAIL")
        ok = rc == want_rc and fails == want_fails
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {name}: exit {rc} (want {want_rc}), "
              f"{fails} FAIL lines (want {want_fails})")
        if not ok:
            print(out)
    # Invalid runs: a dropped event, a missing side.
    for name, damage in (("dropped events", "dropped"),
                         ("missing new side", "missing")):
        d = tempfile.mkdtemp(prefix="tm-ab-selftest-")
        try:
            write_outputs(d, 3)
            if damage == "dropped":
                write_client(os.path.join(d, "client.new.2.json"), 5, 5,
                             dropped=7)
            else:
                os.unlink(os.path.join(d, "rss.new.3.txt"))
            rc, out = run_captured(d, defaults)
        finally:
            shutil.rmtree(d)
        ok = rc == 2 and out.lstrip().startswith("INVALID")
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {name}: exit {rc} (want 2)")
    print(f"self-test: {'PASS' if bad == 0 else 'FAIL'}")
    return 0 if bad == 0 else 1


def run_captured(directory, thresholds):
    """summarize() with its output captured: (exit status, text)."""
    import contextlib  # pylint: disable=import-outside-toplevel
    import io  # pylint: disable=import-outside-toplevel
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = summarize(directory, thresholds)
    return rc, "\n" + buf.getvalue()


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("dir")
    add_threshold_flags(s)
    for name in ("describe", "source"):
        sub.add_parser(name).add_argument("build")
    args = ap.parse_args()
    if args.cmd == "summarize":
        return summarize(args.dir, vars(args))
    if args.cmd == "source":
        print(source_dir(args.build))
        return 0
    return describe(args.build)


if __name__ == "__main__":
    sys.exit(main())
