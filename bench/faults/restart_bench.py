#!/usr/bin/python3
"""What a crashing daemon costs the engine: throughput of tokenmeter-engine
while tokenmeterd is SIGKILLed and restarted under it, against undisturbed
runs, and how soon the engine's client reconnects to the new daemon.

Each round runs the engine three times, in rotating order, on the same
CPU-bound workload (all requests at once, same seed):

  A   a daemon runs throughout (the reference);
  A'  the same again: A'/A is the noise of this machine;
  K   the daemon is SIGKILLed --kills times, --down seconds each, and
      restarted on the same socket path (the stale socket file is
      replaced, as after a crash).

Reported: output tokens/s (from the engine's --report) for each run, the
median over rounds of K/A and of A'/A, the same ratios for output tokens
per CPU second of the engine's loop thread (what the event calls cost the
thread that runs the model, which other load disturbs less), and the
reconnect delay of every
restart: from the new daemon's "listening" log line to its "hello" line
for the engine's connection (both stamped to the millisecond). Verdicts:
throughput PASS when the median K/A lies within the spread of the A'/A
ratios (or within 2% of 1); reconnect PASS when every delay is under 1 s.

Usage: bench/faults/restart_bench.py [--build DIR] [--rounds N]
                                      [--kills N] [--down S]
docs/reliability.md records the figures and the command.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tests", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

ENGINE_ARGS = [
    "--backend", "cpu", "--model-size", "tiny", "--requests", "800",
    "--rate", "0", "--prompt-len", "96", "--output-len", "64",
    "--max-batch", "64", "--max-tokens-per-step", "1024",
    "--kv-blocks", "4096", "--block-size", "16", "--seed", "7", "--quiet",
    "--model", "restart-bench",
]

STAMP = rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}) "


def stamp_of(line):
    return datetime.datetime.strptime(line.decode(), "%Y-%m-%dT%H:%M:%S.%f")


class DaemonProc(tu.Daemon):
    """tokenmeterd restarted on one socket path; each restart() appends to
    the one log, and reconnect_delay() reads the latest start's part."""

    def __init__(self, binary):
        super().__init__("--log-interval", "0", binary=binary,
                         prefix="tm-restart-")
        self.log_from = 0

    def restart(self):
        """Starts it (again), its log read from here on."""
        self.log_from = len(self.read_log())
        return self.start_or_exit()

    def reconnect_delay(self):
        """Seconds from this daemon's listening line to its first hello."""
        log = self.read_log()[self.log_from:]
        listen = re.search(STAMP + rb"\S+ tokenmeterd .* listening: ", log,
                           re.M)
        hello = re.search(STAMP + rb"\S+ ingest: .*: hello ", log, re.M)
        if not listen or not hello:
            return None
        return (stamp_of(hello.group(1)) -
                stamp_of(listen.group(1))).total_seconds()


def run(engine, daemon_bin, kills, down, report_path):
    """One engine run; with kills > 0 the daemon is SIGKILLed and restarted
    that many times. Returns (tokens/s, report, reconnect delays)."""
    d = DaemonProc(daemon_bin)
    delays = []
    try:
        d.restart()
        proc = subprocess.Popen(
            [engine, *ENGINE_ARGS, "--metrics-socket", d.sock, "--report",
             report_path])
        for _ in range(kills):
            time.sleep(1.0)
            if proc.poll() is not None:
                break
            d.kill()
            time.sleep(down)
            d.restart()
            # The delay comes from the log's timestamps; this only waits
            # for the hello line, coarsely, to leave the CPUs to the engine.
            try:
                tu.poll_until(lambda: d.reconnect_delay() is not None or
                              proc.poll() is not None, timeout=5,
                              interval=0.1, what="the engine's hello")
            except AssertionError:
                pass  # reported as an unknown delay
            delays.append(d.reconnect_delay())
        if proc.wait(timeout=300) != 0:
            sys.exit("engine failed")
        d.stop()
    finally:
        d.cleanup()
    with open(report_path) as f:
        report = json.load(f)
    return report["output_tokens_per_s"], report, delays


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build-engine")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--down", type=float, default=0.5)
    args = ap.parse_args()
    engine = os.path.join(args.build, "engine", "tokenmeter-engine")
    daemon = os.path.join(args.build, "daemon", "tokenmeterd")
    for b in (engine, daemon):
        if not os.access(b, os.X_OK):
            sys.exit(f"{b} is not built (meson compile -C {args.build})")
    print(f"engine: {' '.join(ENGINE_ARGS)}")
    print(f"{args.rounds} rounds; K: {args.kills} SIGKILLs, {args.down} s "
          f"down each; load {os.getloadavg()[0]:.2f}")
    report_path = os.path.join(tempfile.gettempdir(),
                               f"tm-restart-{os.getpid()}.json")
    kill_ratio, noise_ratio, delays, lost = [], [], [], []
    cpu_kill_ratio, cpu_noise_ratio = [], []
    orders = ["AaK", "KAa", "aKA"]
    for r in range(args.rounds):
        tps, per_cpu = {}, {}
        for kind in orders[r % 3]:
            kills = args.kills if kind == "K" else 0
            t, report, dl = run(engine, daemon, kills, args.down,
                                report_path)
            tps[kind] = t
            # Output tokens per CPU second of the engine's loop thread:
            # what the event calls cost the thread that runs the model,
            # less disturbed by other load than the wall clock.
            per_cpu[kind] = report["generation_tokens"] / report["loop_cpu_s"]
            if kind == "K":
                k_delays = dl
                delays += dl
                lost.append(report["client_dropped_events"])
                reconnects = report["client_reconnects"]
        kill_ratio.append(tps["K"] / tps["A"])
        noise_ratio.append(tps["a"] / tps["A"])
        cpu_kill_ratio.append(per_cpu["K"] / per_cpu["A"])
        cpu_noise_ratio.append(per_cpu["a"] / per_cpu["A"])
        print(f"round {r + 1}: A {tps['A']:.0f}  A' {tps['a']:.0f}  "
              f"K {tps['K']:.0f} tokens/s; K/A {kill_ratio[-1]:.4f}  "
              f"A'/A {noise_ratio[-1]:.4f}; per loop-CPU s K/A "
              f"{cpu_kill_ratio[-1]:.4f} A'/A {cpu_noise_ratio[-1]:.4f}; "
              f"reconnects {reconnects}, dropped {lost[-1]}; delays "
              f"{', '.join('%.3f' % x if x is not None else '?' for x in k_delays)}"
              " s", flush=True)
    os.unlink(report_path)
    med_k = statistics.median(kill_ratio)
    med_n = statistics.median(noise_ratio)
    lo, hi = min(noise_ratio), max(noise_ratio)
    print(f"median K/A {med_k:.4f} (min {min(kill_ratio):.4f}, max "
          f"{max(kill_ratio):.4f}); A'/A median {med_n:.4f}, spread "
          f"{lo:.4f}..{hi:.4f}")
    print(f"per loop-CPU second: median K/A "
          f"{statistics.median(cpu_kill_ratio):.4f} (min "
          f"{min(cpu_kill_ratio):.4f}, max {max(cpu_kill_ratio):.4f}); A'/A "
          f"median {statistics.median(cpu_noise_ratio):.4f}, spread "
          f"{min(cpu_noise_ratio):.4f}..{max(cpu_noise_ratio):.4f}")
    ok_tp = lo <= med_k <= hi or abs(med_k - 1) <= 0.02
    print(f"{'PASS' if ok_tp else 'MISS'}  throughput with SIGKILLed "
          f"daemon within noise: K/A {med_k:.4f}")
    known = [x for x in delays if x is not None]
    ok_rc = len(known) == len(delays) and known and max(known) < 1.0
    print(f"{'PASS' if ok_rc else 'MISS'}  reconnect < 1 s after restart: "
          f"{len(known)} restarts, median {statistics.median(known):.3f} s, "
          f"max {max(known):.3f} s" if known else
          "MISS  reconnect: no delay measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
