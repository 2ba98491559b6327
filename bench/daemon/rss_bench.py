#!/usr/bin/python3
"""Resident memory of tokenmeterd: idle, and per tracked request.

Starts the real tokenmeterd binary (temp ingest socket, --listen
127.0.0.1:0, --log-interval 0), reads VmRSS from /proc/PID/status once it
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
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import msgpack

BATCH = 4096


def vmrss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                timeout=30) as r:
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def poll_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def run_once(binary, requests, string_ids, idle_wait):
    tmp = tempfile.mkdtemp(prefix="tm-rss-bench-", dir="/tmp")
    sock_path = os.path.join(tmp, "i.sock")
    log_path = os.path.join(tmp, "daemon.log")
    log = open(log_path, "w+b")
    proc = subprocess.Popen(
        [binary, "--ingest", sock_path, "--listen", "127.0.0.1:0",
         "--log-interval", "0"],
        stdout=subprocess.DEVNULL, stderr=log)
    try:
        def port():
            if proc.poll() is not None:
                raise RuntimeError("tokenmeterd exited: " +
                                   open(log_path, "rb").read().decode())
            m = re.search(rb"http port (\d+)", open(log_path, "rb").read())
            return int(m.group(1)) if m else None
        http_port = poll_until(port, 30, "tokenmeterd to start")
        time.sleep(idle_wait)
        idle = vmrss_bytes(proc.pid)

        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock_path)
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
            m = scrape(http_port)
            return m if m.get("tokenmeter_tracked_requests") == requests \
                else None
        m = poll_until(all_tracked, 300, f"{requests} tracked requests")
        time.sleep(0.5)
        after = vmrss_bytes(proc.pid)
        m = scrape(http_port)
        s.close()

        errors = sum(v for k, v in m.items()
                     if k.startswith("tokenmeter_ingest_errors_total"))
        arrived = m.get('tokenmeter_ingest_events_total{kind="arrived"}')
        evicted = m.get("tokenmeter_evicted_requests_total")
        tracked = m.get("tokenmeter_tracked_requests")
        if errors or evicted or arrived != requests or tracked != requests:
            raise RuntimeError(
                f"not every request tracked: arrived={arrived} "
                f"tracked={tracked} errors={errors} evicted={evicted}")
        return idle, after
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


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
    except RuntimeError as e:
        print(f"rss_bench: {e}", file=sys.stderr)
        sys.exit(1)
