#!/usr/bin/python3
"""Cost, on LMDeploy's logging path, of tokenmeter's LMDeploy logger
(tokenmeter.integrations.lmdeploy.TokenmeterStatLogger) beside LMDeploy's
own PrometheusStatLogger (the stand-in's reimplementation: the same
prometheus_client calls per record_* call as LMDeploy v0.16.0's), for the
same stats.

The stats are those of a real run: the seeded workload of
tests/python/standins/lmdeploy/replay.py (300 requests, about 9,000 engine
outputs) replayed once through the stand-in's AsyncEngine and
metrics_processor, every record_* call and its argument kept in order
(SchedulerStats copied: LMDeploy passes the same object each time).
Then both loggers make those calls, a repetition each in turn: one timed
loop over all of them in their order (the "whole pass" row), then one
timed loop over each method's calls alone (its row); CPU time of the
calling thread (time.thread_time_ns, a system call here: read once per
loop, never per call). tokenmeter's client writes to a Unix socket whose
reader (a separate process, bench_shim.py's) discards the bytes, with
ack=False (the reader never acknowledges: bench_shim.py says why); its
buffer holds a whole repetition, and Client.flush() empties it between
repetitions, untimed.
One untimed repetition each comes first. At the end nothing may have been
dropped, rejected, discarded or left unacked, or the run is INVALID.

Prints, per method and for the whole pass: ns per call of each logger
(median over --reps passes) and the ratio tokenmeter / prometheus_client
(the median of the per-pass ratios). The goal (issue 32): the ratio of the
whole pass <= 1.0 (tokenmeter costs LMDeploy no more than its own
Prometheus logger does).

Environment: PYTHONPATH, and TOKENMETER_BACKEND or TOKENMETER_LIBRARY, as
for the tests; bench/python/run_bench_lmdeploy.sh sets them.
"""
import argparse
import asyncio
import contextlib
import dataclasses
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tests", "python", "standins",
                                "lmdeploy"))
sys.path.insert(0, os.path.join(SRC, "tests", "testutil"))

import tokenmeter  # noqa: E402
from bench_shim import SINK  # noqa: E402 (the socket reader that discards)
import tokenmeter.integrations.lmdeploy as tm_lmdeploy  # noqa: E402
import replay  # noqa: E402
from lmdeploy.messages import PytorchEngineConfig, SpeculativeConfig  # noqa
from lmdeploy.metrics.loggers import PrometheusStatLogger  # noqa: E402
from lmdeploy.serve.core import AsyncEngine  # noqa: E402

METHODS = ("record_iteration", "record_specdecode", "record_finish",
           "record_schedule")


class Recorder:
    """A stat logger that keeps every call, in order."""

    def __init__(self):
        self.calls = []

    def record_schedule(self, stats):
        self.calls.append(("record_schedule", dataclasses.replace(stats)))

    def record_iteration(self, stats):
        self.calls.append(("record_iteration", stats))

    def record_specdecode(self, stats):
        self.calls.append(("record_specdecode", stats))

    def record_finish(self, stats):
        self.calls.append(("record_finish", stats))

    def log(self):
        pass


def capture(requests, seed):
    """The calls LMDeploy's metrics path makes for the seeded workload."""
    replay.reset_processor()
    timelines, samples = replay.workload(seed=seed, requests=requests)
    span = max(t for tl in timelines for t, _ in tl.outputs)
    base = float(int(time.time() - span - 2))
    replay.shift(timelines, base)
    eng = AsyncEngine("internlm/internlm2_5-7b-chat", backend="pytorch",
                      backend_config=PytorchEngineConfig(session_len=32768),
                      speculative_config=SpeculativeConfig(
                          num_speculative_tokens=replay.SPEC_TOKENS))
    rec = Recorder()
    eng.stat_loggers[:] = [rec]
    clock = replay.VirtualClock(base)
    replay.use_clock(clock)
    with contextlib.redirect_stdout(io.StringIO()):
        asyncio.run(replay.replay(eng, timelines, samples, clock, base))
    replay.use_clock(time)
    return rec.calls


def one_pass(logger, calls, by_method):
    """CPU ns of one pass over calls, in their order ("pass"), and of one
    pass over each method's calls alone (the methods' rows): each a single
    timed loop, so the clock's own cost (a system call here) is not
    counted per call."""
    clock = time.thread_time_ns
    out = {}
    bound = {m: getattr(logger, m) for m in METHODS}
    t0 = clock()
    for method, stats in calls:
        bound[method](stats)
    out["pass"] = clock() - t0
    for m in METHODS:
        fn = bound[m]
        group = by_method[m]
        t0 = clock()
        for stats in group:
            fn(stats)
        out[m] = clock() - t0
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()

    calls = capture(args.requests, args.seed)
    by_method = {m: [s for c, s in calls if c == m] for m in METHODS}
    counts = {m: len(by_method[m]) for m in METHODS}
    counts["pass"] = len(calls)

    tmp = tempfile.mkdtemp(prefix="tm-bench-lmd-")
    sock = os.path.join(tmp, "sink.sock")
    sink = subprocess.Popen([sys.executable, "-c", SINK, sock],
                            stdout=subprocess.PIPE, text=True)
    try:
        if sink.stdout.readline().strip() != "ready":
            raise SystemExit("sink did not start")
        client = tokenmeter.Client(model="internlm/internlm2_5-7b-chat",
                                   engine="lmdeploy", profile="lmdeploy",
                                   socket_path=sock,
                                   buffer_capacity=1 << 19,
                                   ack=False)  # the sink never acks
        ours = tm_lmdeploy.TokenmeterStatLogger(client)
        with contextlib.redirect_stdout(io.StringIO()):
            theirs = PrometheusStatLogger("internlm/internlm2_5-7b-chat",
                                          32768, 0)
        # One untimed pass each: first-call costs (children, caches) out.
        one_pass(theirs, calls, by_method)
        one_pass(ours, calls, by_method)
        client.flush(30.0)
        results = {"prometheus": [], "tokenmeter": []}
        for _ in range(args.reps):
            results["prometheus"].append(one_pass(theirs, calls, by_method))
            results["tokenmeter"].append(one_pass(ours, calls, by_method))
            if not client.flush(30.0):
                raise SystemExit(f"flush failed: {client.stats()}")
        st = client.stats()
        valid = (st.events_dropped == 0 and st.events_rejected == 0 and
                 st.events_discarded == 0 and st.events_unacked == 0 and
                 not ours.errors)
    finally:
        sink.kill()
        sink.wait()

    print(f"tokenmeter {tokenmeter.library_version()} "
          f"({tokenmeter.backend}), prometheus_client, "
          f"{platform.python_implementation()} {platform.python_version()}; "
          f"{args.requests} requests, {len(calls)} calls a pass, "
          f"{args.reps} passes")
    print(f"{'call':<20}{'calls':>8}{'prometheus ns':>15}"
          f"{'tokenmeter ns':>15}{'ratio':>8}")
    out = {"backend": tokenmeter.backend, "calls": counts, "rows": {}}
    for m in METHODS + ("pass",):
        n = counts[m]
        if n == 0:
            continue
        p = statistics.median(r[m] / n for r in results["prometheus"])
        t = statistics.median(r[m] / n for r in results["tokenmeter"])
        ratio = statistics.median(
            tr[m] / pr[m] for tr, pr in zip(results["tokenmeter"],
                                            results["prometheus"]) if pr[m])
        out["rows"][m] = {"prometheus_ns": p, "tokenmeter_ns": t,
                          "ratio": ratio}
        label = "whole pass (per call)" if m == "pass" else m
        print(f"{label:<20}{n:>8}{p:>15.0f}{t:>15.0f}{ratio:>8.2f}")
    ratio = out["rows"]["pass"]["ratio"]
    verdict = "INVALID" if not valid else ("PASS" if ratio <= 1.0 else
                                           "MISS")
    print(f"goal: tokenmeter / prometheus_client <= 1.0 for the whole "
          f"pass: {ratio:.2f} {verdict}"
          + ("" if valid else f" (client {st}, errors {ours.errors})"))
    out["verdict"] = verdict
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if valid else 1


if __name__ == "__main__":
    sys.exit(main())
