#!/usr/bin/python3
"""Soak: tokenmeterd under a steady event stream for minutes, scraped every
second. Not a CI test: it takes --duration seconds (default 600).

tokenmeter-loadgen sends engine-like events through libtokenmeter at
--rate events/s (default 1,000,000) to a real tokenmeterd; every second
this script scrapes /metrics over HTTP and reads the daemon's VmRSS from
/proc. At the end it checks:

  * no loss: the load generator refused no event (buffer full) and dropped
    none, and the daemon applied exactly what the client sent (its
    "stopped: N events applied" line after SIGTERM);
  * no errors: tokenmeter_ingest_errors_total stays 0, every scrape
    answered 200, the daemon exits 0;
  * RSS flat: the highest VmRSS of the last minute is within 5% (or 4 MiB)
    of the highest of the second minute (the first minute is warm-up:
    the tracker's finished-request grace and the buffers fill);
  * the rate held: events applied per second, from the scrapes.

Prints a line every 10 s, then the figures and PASS/MISS lines.

Usage: bench/soak/soak.py [--build DIR] [--duration S] [--rate N]
                          [--threads N] [--json FILE]
docs/reliability.md records a run and the command.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tests", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402


def vm_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port):
    """(status, seconds the answer took, {name: sum over its samples},
    body bytes)."""
    t0 = time.monotonic()
    status, _, body = tu.http_get("127.0.0.1", port)
    elapsed = time.monotonic() - t0
    samples = tu.parse(body.decode())
    values = {}
    for (name, _), v in samples.items():
        values[name] = values.get(name, 0) + v
    return status, elapsed, values, len(body)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build-tests")
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--rate", type=float, default=1e6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the per-second series here")
    args = ap.parse_args()
    daemon_bin = os.path.join(args.build, "daemon", "tokenmeterd")
    loadgen_bin = os.path.join(args.build, "bench", "loadgen",
                               "tokenmeter-loadgen")
    for b in (daemon_bin, loadgen_bin):
        if not os.access(b, os.X_OK):
            sys.exit(f"{b} is not built (meson compile -C {args.build})")

    d = tu.Daemon("--log-interval", "10", binary=daemon_bin,
                  prefix="tm-soak-").start_or_exit()
    daemon, sock, port = d.proc, d.sock, d.port

    print(f"soak: {args.rate:,.0f} events/s for {args.duration:.0f} s, "
          f"{args.threads} producer threads; daemon {daemon_bin}; load "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    loadgen = subprocess.Popen(
        [loadgen_bin, "--socket", sock, "--rate", str(args.rate),
         "--duration", str(args.duration), "--threads", str(args.threads),
         "--instance", "soak"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    series = []  # one dict a second
    start = time.monotonic()
    bad_scrapes = 0
    next_tick = start + 1
    try:
        while loadgen.poll() is None:
            time.sleep(max(0.0, next_tick - time.monotonic()))
            next_tick += 1
            try:
                status, took, v, size = scrape(port)
            except OSError as e:
                bad_scrapes += 1
                print(f"scrape failed: {e}", flush=True)
                continue
            if status != 200:
                bad_scrapes += 1
            row = {
                "t": round(time.monotonic() - start, 3),
                "rss_kib": vm_rss_kib(daemon.pid),
                "cpu_s": cpu_seconds(daemon.pid),
                "events": v.get("tokenmeter_ingest_events_total", 0),
                "errors": v.get("tokenmeter_ingest_errors_total", 0),
                "tracked": v.get("tokenmeter_tracked_requests", 0),
                "scrape_s": took,
                "render_s": v.get("tokenmeter_scrape_duration_seconds", 0),
                "bytes": size,
            }
            series.append(row)
            if len(series) % 10 == 0:
                prev = series[-11] if len(series) > 10 else series[0]
                rate = (row["events"] - prev["events"]) / max(
                    1e-9, row["t"] - prev["t"])
                print(f"t={row['t']:6.0f}s rss {row['rss_kib'] / 1024:6.1f} "
                      f"MiB  events/s {rate:10,.0f}  tracked "
                      f"{row['tracked']:7.0f}  errors {row['errors']:.0f}  "
                      f"scrape {row['scrape_s'] * 1000:.1f} ms", flush=True)
        out, err = loadgen.communicate()
        if loadgen.returncode != 0:
            sys.exit("loadgen failed: " + err.decode())
        gen = json.loads(out)
        # Let the daemon apply the tail, then stop it and read its total
        # (a shortfall is reported by the checks below).
        try:
            tu.poll_until(lambda: scrape(port)[2].get(
                "tokenmeter_ingest_events_total", 0) >= gen["events_sent"],
                timeout=30, interval=0.1, what="the tail applied")
        except AssertionError:
            pass
        rc = d.stop(timeout=30)
        log = d.read_log()
        m = re.search(rb"stopped: (\d+) events applied", log)
        applied = int(m.group(1)) if m else -1
        summaries = len(re.findall(rb"Avg prompt throughput", log))
    finally:
        if loadgen.poll() is None:
            loadgen.kill()
        d.cleanup()

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "loadgen": gen,
                       "series": series}, f)

    def peak(lo, hi):
        rows = [r["rss_kib"] for r in series if lo <= r["t"] < hi]
        return max(rows) if rows else 0
    dur = series[-1]["t"] if series else 0
    rss_early = peak(60, 120)
    rss_late = peak(dur - 60, dur + 1)
    rss_max = max(r["rss_kib"] for r in series)
    steady = [r for r in series if r["t"] >= 60]
    if len(steady) >= 2:
        achieved = (steady[-1]["events"] - steady[0]["events"]) / (
            steady[-1]["t"] - steady[0]["t"])
        cpu = (steady[-1]["cpu_s"] - steady[0]["cpu_s"]) / (
            steady[-1]["t"] - steady[0]["t"])
    else:
        achieved = cpu = 0
    scrape_ms = sorted(r["scrape_s"] * 1000 for r in series)
    render_ms = sorted(r["render_s"] * 1000 for r in series)

    def pct(xs, q):
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0
    print()
    print(f"events: appended {gen['appended']:,}, refused (buffer full) "
          f"{gen['refused_full']:,}, sent {gen['events_sent']:,}, dropped "
          f"{gen['events_dropped']:,}, applied by the daemon {applied:,}")
    print(f"rate after the first minute: {achieved:,.0f} events/s applied; "
          f"daemon CPU {cpu * 100:.1f}% of a core")
    print(f"daemon VmRSS: peak {rss_max / 1024:.1f} MiB; peak of minute 2 "
          f"{rss_early / 1024:.1f} MiB, of the last minute "
          f"{rss_late / 1024:.1f} MiB")
    print(f"scrapes: {len(series)} ({bad_scrapes} failed), answer p50 "
          f"{pct(scrape_ms, 0.5):.1f} ms p99 {pct(scrape_ms, 0.99):.1f} ms "
          f"max {scrape_ms[-1] if scrape_ms else 0:.1f} ms; render p50 "
          f"{pct(render_ms, 0.5):.2f} ms; "
          f"ingest errors {series[-1]['errors'] if series else -1:.0f}; "
          f"summary lines logged {summaries}; daemon exit {rc}")
    checks = [
        ("no loss (0 refused, 0 dropped, applied == sent)",
         gen["refused_full"] == 0 and gen["events_dropped"] == 0 and
         applied == gen["events_sent"]),
        ("no errors (0 ingest errors, all scrapes 200, exit 0)",
         bad_scrapes == 0 and series and series[-1]["errors"] == 0 and
         rc == 0),
        ("RSS flat (last minute's peak within 5% or 4 MiB of minute 2's)",
         rss_early > 0 and rss_late - rss_early <= max(0.05 * rss_early,
                                                       4096)),
        (f"rate held (>= 99% of {args.rate:,.0f} events/s)",
         achieved >= 0.99 * args.rate),
    ]
    for what, ok in checks:
        print(f"{'PASS' if ok else 'MISS'}  {what}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
