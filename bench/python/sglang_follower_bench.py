#!/usr/bin/python3
"""Cost per record of tokenmeter-sglang beside SGLang's own Prometheus
logger doing its work for the same requests, in one process, in one run.

The records are SGLang's request-metrics lines written by the SGLang
stand-in (tests/python/standins/sglang: SGLang's exporter format, its
stage times and its collector, reproduced from SGLang's source), for
request lifecycles drawn with a fixed seed: prompts of 64 to 4,096 tokens
(the prompt text is in each line, as SGLang writes it by default), 8 to
512 output tokens, 60 % streamed.

Cases (us per record, CPU time of the calling thread):

  follower            tokenmeter-sglang's Follower.pump() over the file:
                      read, split, json.loads, summarize(), one
                      request_summary() per record and one STEP per poll
                      (4,096 records a poll), into a socket whose reader
                      (another process) discards the bytes
  sglang collector    prometheus_client doing SGLang's collector's work for
                      the same requests at their finish: TTFT,
                      observe_one_finished_request (2 counters, the cached
                      tokens counter, num_requests, 4 histograms) and the
                      scheduler's queue time (the values precomputed)
  sglang collector    the same plus the inter-token latency SGLang
    + ITL             observes at every output of a request (per step when
                      streamed, every 50 tokens otherwise)
  sglang exporter     SGLang's own --export-metrics-to-file write of the
                      record (json.dumps of the parameters and the record,
                      write, flush): what SGLang pays to have the file, for
                      scale

A repetition times each case over all records in turn, so that the load
of the shared machine falls on all alike; the figure is the median over
--reps repetitions, and the ratio follower / sglang collector is the
median of the per-repetition ratios. The follower also reports its whole
process's CPU per record (the library's sender thread included).

The follower runs in its own process, not in SGLang's: SGLang's logging
path pays only its exporter (which it has whether tokenmeter-sglang runs
or not). The goal (issue 32): the follower's cost per record at most the
Prometheus logger's for the same stats (ratio <= 1).

Environment: PYTHONPATH (the build folder's package, with the
integrations), TOKENMETER_BACKEND or TOKENMETER_LIBRARY;
bench/python/run_sglang_bench.sh sets them.
"""
import argparse
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time

import tokenmeter
from tokenmeter.integrations import sglang as follower

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "testutil"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python",
                                "standins"))
import tokenmeter_testutil as tu  # noqa: E402
from bench_shim import SINK  # noqa: E402  (a socket that discards)
from sglang.collector import SGLangCollector  # noqa: E402
from sglang.engine import StandInServer, Timeline  # noqa: E402
from sglang.exporter import FileExporter  # noqa: E402

MODEL = "Qwen/Qwen2.5-7B-Instruct"


def timelines(n, seed):
    """n request lifecycles: Poisson arrivals at 40/s, queueing, a prefill,
    one token a 20 ms step, some preempted."""
    rng = random.Random(seed)
    t = time.monotonic() - 600
    out = []
    for i in range(n):
        t += rng.expovariate(40.0)
        queued = t + 0.002
        scheduled = queued + rng.expovariate(5.0)
        prompt = rng.randint(64, 4096)
        ntok = rng.randint(8, 512)
        first = scheduled + prompt * 2e-5
        tokens = [(first + k * 0.02, 1) for k in range(ntok)]
        pre = [tokens[ntok // 2][0]] if rng.random() < 0.05 else []
        out.append(Timeline(
            rid=i + 1, arrived=t, prompt=prompt, max_tokens=ntok,
            queued=queued, scheduled=scheduled,
            cached=rng.choice((0, 0, prompt // 2, prompt - prompt % 64)),
            tokens=tokens, preempted=pre, finished=tokens[-1][0],
            reason=rng.choice(("stop", "length"))))
    return out


def parts(path, client):
    """Each step of the follower over the same lines, apart (us/record,
    the best of 5). The reading first, before the lines are held in this
    process (43 MB of bytes objects make its large reads slower)."""
    with open(path, "rb") as f:
        n = f.read().count(b"\n")

    def best(fn):
        out = []
        for _ in range(5):
            c0 = time.thread_time_ns()
            fn()
            out.append((time.thread_time_ns() - c0) / n / 1000)
        return min(out)

    def read():
        src = follower.Source(path, False, None)
        for t in src.poll():
            while True:
                item = t.next_line()
                if item is None:
                    break
                t.advance(item[1])
        src.close()
    print("  parts, best of 5:")
    print(f"    {'read and split the lines':29s}{best(read):8.2f} us/record")
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")[:-1]
    parsed = [follower.parse_line(ln) for ln in lines]
    kws = [follower.summarize(*p).kwargs for p in parsed]
    now = time.monotonic_ns()

    def send():
        rs = client.request_summary
        for kw in kws:
            kw = dict(kw)
            rs(kw.pop("reason"), t_ns=now, **kw)
    for name, fn in (
            ("parse_line()", lambda: [follower.parse_line(ln)
                                      for ln in lines]),
            ("json.loads() of whole lines", lambda: [json.loads(ln)
                                                     for ln in lines]),
            ("summarize()", lambda: [follower.summarize(*p)
                                     for p in parsed]),
            ("request_summary()", send)):
        print(f"    {name:29s}{best(fn):8.2f} us/record")
        if name == "request_summary()" and not client.flush(30.0):
            sys.exit(f"flush failed: {client.stats()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the figures to this file too")
    ap.add_argument("--parts", action="store_true",
                    help="also time the follower's steps apart: reading "
                    "and splitting, parse_line(), json.loads() of a whole "
                    "line (what parse_line() avoids), summarize(), "
                    "request_summary()")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="sglbench-")
    sock = os.path.join(work, "s.sock")
    sink = subprocess.Popen([sys.executable, "-c", SINK, sock],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        assert sink.stdout.readline().strip() == "ready"
        run(args, work, sock)
    finally:
        sink.kill()
        sink.wait()


def run(args, work, sock):

    # The records (and each request's collector calls), written once.
    server = StandInServer(SGLangCollector({"model_name": MODEL}),
                           FileExporter(os.path.join(work, "m")),
                           seed=args.seed, abort_every=0, no_log_every=0,
                           health_every=0)
    built = server.build(timelines(args.records, args.seed))
    server.run(built)
    server.exporter.close()
    (name,) = os.listdir(os.path.join(work, "m"))
    path = os.path.join(work, "m", name)
    size = os.path.getsize(path)
    finish_calls = [[c for c in calls if c[0] != "observe_inter_token_latency"]
                    for _, _, _, calls in built]
    all_calls = [calls for _, _, _, calls in built]
    n = len(built)

    client = tokenmeter.Client(socket_path=sock, engine="sglang",
                               model=MODEL, profile="sglang",
                               buffer_capacity=1 << 17)
    tu.poll_until(lambda: client.stats().connected, timeout=10,
                  interval=0.01, what="the client connected to the sink")
    client.attach_thread()

    def run_follower():
        src = follower.Source(path, False, None)
        f = follower.Follower(client, src, max_per_poll=n + 1,
                              rid_bytes=tokenmeter.MAX_RID_BYTES,
                              ok=tokenmeter.OK, dropped=tokenmeter.DROPPED)
        p0, c0 = time.process_time_ns(), time.thread_time_ns()
        handled, status = f.pump()
        c1, p1 = time.thread_time_ns(), time.process_time_ns()
        src.close()
        if (handled, status, f.sent) != (n, f.IDLE, n):
            sys.exit(f"follower handled {handled} ({status}, {f.sent} sent)"
                     f" of {n}")
        if not client.flush(30.0):
            sys.exit(f"flush failed: {client.stats()}")
        return c1 - c0, p1 - p0

    def run_collector(calls_per_request):
        col = SGLangCollector({"model_name": MODEL})
        c0 = time.thread_time_ns()
        for calls in calls_per_request:
            for call in calls:
                getattr(col, call[0])(*call[1:])
        return time.thread_time_ns() - c0

    objs = [(obj, out) for _, obj, out, _ in built]

    def run_exporter():
        d = os.path.join(work, "x")
        exp = FileExporter(d)
        c0 = time.thread_time_ns()
        for obj, out in objs:
            exp.write_record(obj, out)
        c1 = time.thread_time_ns()
        exp.close()
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        return c1 - c0

    # The records and their calls are hundreds of thousands of objects this
    # process keeps; out of the collector's way, so that neither case pays
    # for scanning them (a follower or an SGLang process has no such heap).
    gc.collect()
    gc.freeze()
    res = {k: [] for k in ("follower", "follower process", "collector",
                           "collector+itl", "exporter")}
    ratios = []
    run_follower()  # warm-up: imports, first allocations
    for _ in range(args.reps):
        fc, fp = run_follower()
        cc = run_collector(finish_calls)
        ci = run_collector(all_calls)
        ex = run_exporter()
        res["follower"].append(fc / n)
        res["follower process"].append(fp / n)
        res["collector"].append(cc / n)
        res["collector+itl"].append(ci / n)
        res["exporter"].append(ex / n)
        ratios.append(fc / cc)
    if args.parts:
        parts(path, client)
    st = client.close()
    if st.events_dropped or st.events_rejected:
        sys.exit(f"INVALID: events dropped or rejected: {st}")
    med = {k: statistics.median(v) / 1000 for k, v in res.items()}
    rng = {k: f"({min(v) / 1000:.2f} .. {max(v) / 1000:.2f})"
           for k, v in res.items()}
    ratio = statistics.median(ratios)
    outputs = sum(1 for calls in all_calls for c in calls
                  if c[0] == "observe_inter_token_latency")
    print(f"python {platform.python_version()}, tokenmeter backend "
          f"{tokenmeter.backend}, {n} records, {size / n:.0f} bytes a line "
          f"on average, {args.reps} repetitions: median (min .. max)")
    for key, label, extra in (
            ("follower", "follower (calling thread)", ""),
            ("follower process", "follower (whole process)", ""),
            ("collector", "sglang collector at finish", ""),
            ("collector+itl", "sglang collector + ITL",
             f" ({outputs / n:.1f} later outputs a request)"),
            ("exporter", "sglang exporter (its write)", "")):
        print(f"  {label:29s}{med[key]:8.2f} us/record {rng[key]}{extra}")
    verdict = "PASS" if ratio <= 1.0 else "MISS"
    print(f"ratio follower / sglang collector at finish: {ratio:.3f} "
          f"({min(ratios):.3f} .. {max(ratios):.3f}; goal <= 1: {verdict});"
          f" / collector + ITL: {med['follower'] / med['collector+itl']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"us_per_record": med, "ratio": ratio,
                       "records": n, "bytes_per_line": size / n,
                       "backend": tokenmeter.backend}, f, indent=1)


if __name__ == "__main__":
    main()
