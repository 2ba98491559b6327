#!/usr/bin/python3
"""Cost per event of the Python binding (client_lib/python/tokenmeter),
either implementation (the C extension tokenmeter._native, or the ctypes
binding: tokenmeter.backend, chosen by the environment), beside
prometheus_client's Histogram.observe, in one process, in one run.

Cases (ns per event; a batch call's time is divided by its events):

  empty loop             `for x in xs: pass`: the loop every case pays
  tokens(int)            c.tokens(rid), timestamp "now"
  tokens(str)            c.tokens("cmpl-<32 hex>-0"), timestamp "now"
  arrived(int), (str)    c.arrived(rid, 512, 256)
  queued, scheduled,     c.queued(rid), ..., c.finished(rid, "stop"): the
  preempted, finished    other single calls, with str ids
  tokens_batch list[int] c.tokens_batch(step_ids), a list of N ints: the
                         realistic path (the list is converted to an array)
  tokens_batch array('Q') the same with ids already in an array('Q')
  tokens_batch list[str] the same with N vLLM-style string ids
  prometheus observe     prometheus_client Histogram(...).labels(...)
                         .observe(v), the 22 TTFT buckets, the child
                         resolved once; v cycles through 16 values

Only the calls are timed: the library's buffer must not fill, or the timed
calls would take the drop path. Each timed chunk appends at most 16384
events to a 131072-event buffer; then, untimed, Client.flush() waits until
the library's sender has written them to a Unix socket whose reader (a
separate process) discards them. That reader never writes, like a daemon
without acknowledged delivery, so the client is made with ack=False: with
ack on it would wait 1 s for an answer to HELLO and then discard what it had
kept for replay (events_discarded), a path a real daemon never takes. The
ack work is the sender thread's, not the calling thread's (client_bench's
ack_off cases show the calls cost the same). At the end every event must
have been sent once: nothing dropped, rejected, discarded, left unacked or
replayed, no reconnect, or the run is reported INVALID.

A repetition times every case one chunk at a time, in turn, until each has
--min-time seconds of CPU time, so that the load of a shared machine falls on
all cases alike. The figure is CPU time of the calling thread
(time.thread_time_ns) per event, the median over --reps repetitions (wall
time beside it). A single call is compared with observe per repetition (the
two measured under the same load): the median of those ratios decides.

Goals (docs/performance.md): the step batch call (list[int], 64 and 256
requests) <= 100 ns per event; each single call no slower than
prometheus_client's observe. With the C extension (issue 16): tokens() at
least 5 times faster than observe (int and str ids), and a step of 256 ids
<= 10 ns per event (list[int] and array('Q')).

Environment: PYTHONPATH, and TOKENMETER_BACKEND or TOKENMETER_LIBRARY, as
for the tests (bench/python/run_bench_shim.sh sets them).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from array import array

import tokenmeter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tests", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

BUFFER_EVENTS = 1 << 17
CHUNK_EVENTS = 16384  # appended between two flushes; well under the buffer
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                640.0, 2560.0]
STEP_GOAL_NS = 100.0
NATIVE_STEP_GOAL_NS = 10.0  # the C extension's goal (issue 16)

SINK = r"""
import os, socket, sys, threading
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(8)
print("ready", flush=True)
def drain(c):
    while c.recv(1 << 20):
        pass
while True:
    c, _ = s.accept()
    threading.Thread(target=drain, args=(c,), daemon=True).start()
"""


class Case:
    """One timed case: `run(n)` makes calls covering n events (n a multiple
    of events_per_call) and returns the events appended."""

    def __init__(self, name, run, events_per_call=1, appends=True):
        self.name = name
        self.run = run
        self.events_per_call = events_per_call
        self.appends = appends
        self.cpu = []   # ns per event, one per repetition
        self.wall = []


def make_cases(c, hist):
    ids_int = list(range(CHUNK_EVENTS))
    ids_str = [f"cmpl-{uuid.uuid4().hex}-0" for _ in range(CHUNK_EVENTS)]
    values = [0.0005 * 3 ** (k % 16) / 10 for k in range(CHUNK_EVENTS)]
    cases = []

    def empty(n):
        for _ in ids_int[:n]:
            pass
        return 0
    cases.append(Case("empty loop", empty, appends=False))

    def tokens_int(n, tokens=c.tokens):
        for rid in ids_int[:n]:
            tokens(rid)
        return n
    cases.append(Case("tokens(int)", tokens_int))

    def tokens_str(n, tokens=c.tokens):
        for rid in ids_str[:n]:
            tokens(rid)
        return n
    cases.append(Case("tokens(str)", tokens_str))

    def arrived_int(n, arrived=c.arrived):
        for rid in ids_int[:n]:
            arrived(rid, 512, 256)
        return n
    cases.append(Case("arrived(int)", arrived_int))

    def arrived_str(n, arrived=c.arrived):
        for rid in ids_str[:n]:
            arrived(rid, 512, 256)
        return n
    cases.append(Case("arrived(str)", arrived_str))

    # The other single calls, with the costlier str ids.
    def one_arg(method):
        def run(n, m=method):
            for rid in ids_str[:n]:
                m(rid)
            return n
        return run
    for name in ("queued", "scheduled", "preempted"):
        cases.append(Case(f"{name}(str)", one_arg(getattr(c, name))))

    def finished_str(n, finished=c.finished):
        for rid in ids_str[:n]:
            finished(rid, "stop")
        return n
    cases.append(Case("finished(str)", finished_str))

    for size in (64, 256):
        steps_int = [ids_int[i:i + size]
                     for i in range(0, CHUNK_EVENTS, size)]
        steps_arr = [array("Q", s) for s in steps_int]
        steps_str = [ids_str[i:i + size]
                     for i in range(0, CHUNK_EVENTS, size)]

        def batch(n, steps, size=size, tb=c.tokens_batch):
            appended = 0
            for step in steps[:n // size]:
                appended += tb(step)
            return appended
        for kind, steps in (("list[int]", steps_int),
                            ("array('Q')", steps_arr),
                            ("list[str]", steps_str)):
            cases.append(Case(
                f"tokens_batch {kind} x{size}",
                lambda n, steps=steps, batch=batch: batch(n, steps),
                events_per_call=size))

    def observe(n, obs=hist.observe):
        for v in values[:n]:
            obs(v)
        return 0
    cases.append(Case("prometheus observe", observe, appends=False))
    return cases


def run_chunk(case, c):
    """Times one chunk of the case: (cpu ns, wall ns, events, appended)."""
    chunk = CHUNK_EVENTS - CHUNK_EVENTS % case.events_per_call
    w0 = time.perf_counter_ns()
    c0 = time.thread_time_ns()
    appended = case.run(chunk)
    c1 = time.thread_time_ns()
    w1 = time.perf_counter_ns()
    if case.appends and not c.flush(30.0):  # untimed: empty the buffer
        raise SystemExit(f"{case.name}: flush failed: {c.stats()}")
    return c1 - c0, w1 - w0, chunk, appended


def repetition(cases, c, min_time_s):
    """One repetition: every case one chunk in turn (so that the machine's
    load, which changes by the second here, falls on all cases alike) until
    each has min_time_s of CPU time. Returns events appended."""
    cpu = {k.name: 0 for k in cases}
    wall = dict(cpu)
    events = dict(cpu)
    appended = 0
    while min(cpu.values()) < min_time_s * 1e9:
        for case in cases:
            if cpu[case.name] >= min_time_s * 1e9:
                continue
            dc, dw, n, got = run_chunk(case, c)
            cpu[case.name] += dc
            wall[case.name] += dw
            events[case.name] += n
            appended += got
    for case in cases:
        case.cpu.append(cpu[case.name] / events[case.name])
        case.wall.append(wall[case.name] / events[case.name])
    return appended


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.2,
                    help="CPU seconds per case per repetition")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    from importlib.metadata import version
    from prometheus_client import CollectorRegistry, Histogram

    tmp = tempfile.mkdtemp(prefix="tm-bench-py-")
    sock = os.path.join(tmp, "sink.sock")
    sink = subprocess.Popen([sys.executable, "-c", SINK, sock],
                            stdout=subprocess.PIPE, text=True)
    assert sink.stdout.readline().strip() == "ready"
    try:
        # ack=False: the sink never writes (see the module docstring).
        c = tokenmeter.Client(socket_path=sock, engine="bench", model="m",
                              buffer_capacity=BUFFER_EVENTS, ack=False)
        tu.poll_until(lambda: c.stats().connected, timeout=10, interval=0.01,
                      what="the client connected to the sink")
        c.attach_thread()
        hist = Histogram("ttft_seconds", "TTFT", ["model_name", "engine"],
                         buckets=TTFT_BUCKETS,
                         registry=CollectorRegistry()).labels("m", "0")
        cases = make_cases(c, hist)
        appended = 0
        for case in cases:  # warm-up
            appended += case.run(CHUNK_EVENTS - CHUNK_EVENTS
                                 % case.events_per_call)
            c.flush(30.0)
        for case in cases:
            case.cpu.clear()
            case.wall.clear()
        print(f"backend {tokenmeter.backend}; "
              f"python {platform.python_version()}, prometheus_client "
              f"{version('prometheus_client')}, "
              f"libtokenmeter {tokenmeter.library_version()} "
              f"({tokenmeter.library_path}); {os.cpu_count()} CPUs; load "
              f"{open('/proc/loadavg').read().split()[:3]}", flush=True)
        for rep in range(args.reps):
            appended += repetition(cases, c, args.min_time)
            print(f"repetition {rep + 1}/{args.reps} done", flush=True)
        stats = c.close()
    finally:
        sink.kill()
        sink.wait()
        try:
            os.unlink(sock)
            os.rmdir(tmp)
        except OSError:
            pass

    valid = (stats.events_dropped == 0 and stats.events_rejected == 0
             and stats.events_discarded == 0 and stats.events_unacked == 0
             and stats.batches_replayed == 0 and stats.reconnects == 0
             and stats.events_sent == appended)
    med = {k.name: statistics.median(k.cpu) for k in cases}
    print()
    print(f"{'case':30s} {'ns/event':>9s} {'min':>7s} {'max':>7s} "
          f"{'wall':>7s}  vs observe")
    for k in cases:
        ratio = med["prometheus observe"] / med[k.name] if med[k.name] else 0
        print(f"{k.name:30s} {med[k.name]:9.1f} {min(k.cpu):7.1f} "
              f"{max(k.cpu):7.1f} {statistics.median(k.wall):7.1f}  "
              f"{ratio:5.1f}x")
    print()
    print(f"events appended {appended}, sent {stats.events_sent}, dropped "
          f"{stats.events_dropped}, rejected {stats.events_rejected}, "
          f"discarded {stats.events_discarded}, unacked "
          f"{stats.events_unacked}; batches replayed "
          f"{stats.batches_replayed}, reconnects {stats.reconnects}: "
          + ("valid" if valid else "INVALID"))
    observe = med["prometheus observe"]
    obs = next(k for k in cases if k.name == "prometheus observe")

    def paired_ratio(name):
        """Median over repetitions of observe / case, each repetition's
        pair measured under the same load."""
        k = next(k for k in cases if k.name == name)
        return statistics.median(o / v for o, v in zip(obs.cpu, k.cpu))
    goals = []
    for size in (64, 256):
        v = med[f"tokens_batch list[int] x{size}"]
        goals.append((f"step batch list[int] x{size} <= {STEP_GOAL_NS:.0f} "
                      f"ns/event: {v:.1f}", v <= STEP_GOAL_NS))
    for name in ("tokens(int)", "tokens(str)", "arrived(int)",
                 "arrived(str)", "queued(str)", "scheduled(str)",
                 "preempted(str)", "finished(str)"):
        r = paired_ratio(name)
        goals.append((f"{name} <= prometheus observe: {med[name]:.0f} vs "
                      f"{observe:.0f} ns; paired ratio {r:.2f}x", r >= 1.0))
    if tokenmeter.backend == "native":
        for name in ("tokens(int)", "tokens(str)"):
            r = paired_ratio(name)
            goals.append((f"{name} >= 5x faster than prometheus observe: "
                          f"{med[name]:.0f} vs {observe:.0f} ns; paired ratio "
                          f"{r:.2f}x", r >= 5.0))
        for kind in ("list[int]", "array('Q')"):
            v = med[f"tokens_batch {kind} x256"]
            goals.append((f"step batch {kind} x256 <= {NATIVE_STEP_GOAL_NS:.0f}"
                          f" ns/event: {v:.1f}", v <= NATIVE_STEP_GOAL_NS))
    for text, ok in goals:
        print(f"{'PASS' if ok else 'MISS'}  {text}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cases": {k.name: {"cpu_ns": k.cpu, "wall_ns": k.wall,
                                          "median_cpu_ns": med[k.name],
                                          "paired_observe_ratio":
                                              paired_ratio(k.name)
                                              if med[k.name] else None}
                                 for k in cases},
                       "stats": stats._asdict(), "valid": valid}, f,
                      indent=1)
    return 0 if valid else 1


if __name__ == "__main__":
    sys.exit(main())
