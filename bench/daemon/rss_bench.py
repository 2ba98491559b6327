#!/usr/bin/python3
"""Resident memory of tokenmeterd: idle, and per tracked request.

Starts the real tokenmeterd binary (tests/testutil: temp ingest socket,
--listen 127.0.0.1:0, --log-interval 0), reads VmRSS from /proc/PID/status once it
has been idle for --idle-wait seconds after start, then sends ARRIVED events
for --requests distinct request ids that never finish (timestamps from
time.monotonic_ns(), so they pass the daemon's clock check), waits until
tokenmeter_tracked_requests says all of them are tracked, and reads VmRSS
again. Bytes per tracked request = (after - idle) / requests.

Done once with integer ids (0 .. N-1) and once with 36-byte string ids
(UUID text). Every run checks that no event was rejected and no request
evicted; a run that fails the check is an error (exit 1).

Usage: rss_bench.py --tokenmeterd PATH [--requests N] [--runs N]
Prints one line per run, then "RESULT key=value" lines (medians over runs).
"""
import argparse
import os
import statistics
import sys
import time
import uuid

import msgpack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tests", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

BATCH = 4096


def vmrss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def run_once(binary, requests, string_ids, idle_wait):
    d = tu.Daemon("--log-interval", "0", binary=binary,
                  prefix="tm-rss-bench-")
    try:
        d.start()
        time.sleep(idle_wait)  # the idle period measured
        idle = vmrss_bytes(d.proc.pid)

        s = d.connect()
        s.sendall(msgpack.packb(
            [0, {"proto": 1, "engine": "bench", "model": "m",
                 "instance": "0", "pid": os.getpid()}]))
        seq = 0
        for first in range(0, requests, BATCH):
            t = time.monotonic_ns()
            ids = range(first, min(first + BATCH, requests))
            if string_ids:
                ids = [str(uuid.UUID(int=i)) for i in ids]
            events = [[1, t, rid, 100] for rid in ids]
            s.sendall(msgpack.packb([1, seq, 0, events], use_bin_type=True))
            seq += 1

        def all_tracked():
            return tu.scrape(d.port, timeout=30).value(
                "tokenmeter_tracked_requests") == requests
        tu.poll_until(all_tracked, 300, interval=0.05,
                      what=f"{requests} tracked requests")
        time.sleep(0.5)  # the allocator settles before the reading
        after = vmrss_bytes(d.proc.pid)
        m = tu.scrape(d.port, timeout=30)
        s.close()

        errors = m.sum("tokenmeter_ingest_errors_total")
        arrived = m.value("tokenmeter_ingest_events_total", kind="arrived")
        evicted = m.value("tokenmeter_evicted_requests_total")
        tracked = m.value("tokenmeter_tracked_requests")
        if errors or evicted or arrived != requests or tracked != requests:
            raise RuntimeError(
                f"not every request tracked: arrived={arrived} "
                f"tracked={tracked} errors={errors} evicted={evicted}")
        return idle, after
    finally:
        try:
            d.stop(timeout=30)
        finally:
            d.cleanup()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenmeterd", required=True)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--idle-wait", type=float, default=1.0,
                    help="seconds between start and the idle reading")
    args = ap.parse_args()

    idles, per = [], {"int": [], "str36": []}
    for run in range(1, args.runs + 1):
        for kind in ("int", "str36"):
            idle, after = run_once(args.tokenmeterd, args.requests,
                                   kind == "str36", args.idle_wait)
            b = (after - idle) / args.requests
            idles.append(idle)
            per[kind].append(b)
            print(f"run {run} {kind:5} ids: idle {idle / 2**20:.2f} MiB, "
                  f"{args.requests} tracked {after / 2**20:.2f} MiB, "
                  f"{b:.1f} B per tracked request", flush=True)
    idle = statistics.median(idles)
    print(f"\nmedians over {args.runs} runs: idle {idle / 2**20:.2f} MiB; "
          f"per tracked request {statistics.median(per['int']):.1f} B "
          f"(integer ids), {statistics.median(per['str36']):.1f} B "
          f"(36-byte string ids)")
    print(f"RESULT rss_idle_mib={idle / 2**20:.2f}")
    print(f"RESULT rss_bytes_per_request_int="
          f"{statistics.median(per['int']):.1f}")
    print(f"RESULT rss_bytes_per_request_str36="
          f"{statistics.median(per['str36']):.1f}")


if __name__ == "__main__":
    try:
        main()
    except (RuntimeError, AssertionError) as e:
        print(f"rss_bench: {e}", file=sys.stderr)
        sys.exit(1)
