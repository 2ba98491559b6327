#!/usr/bin/python3
"""Faults under load with state snapshots: tokenmeterd runs with
--state-dir (one directory kept across all the daemons of a test) while
the reference engine reports to it with acknowledged delivery (the
default), and is restarted underneath it. Nothing may be lost and nothing
counted twice: at the end the last daemon's figures equal the engine's own
--report exactly, as in tests/engine/engine_e2e_test.py
(test_daemon_figures_equal_engine_report): every latency histogram's
_count (and _sum, to float rounding), the token counters, the finish
reasons, preemptions and the prefix-cache counters.

KillRestartWithState: the daemon owns its socket path and is SIGKILLed 5
times while the engine runs (--snapshot-interval 0.2), each time after
events have flowed to it for a while; the next one starts shortly after on
the same path (the stale socket file is replaced) and the same state dir,
and must report tokenmeter_state_restored 1. What a killed daemon applied
after its last snapshot is lost with it, but was not acked, so the client
replays it; what was on disk but not yet acked is replayed too and skipped
as a duplicate.

SigtermRestartNoResets: the listeners are held by this test (HeldSockets
of restart_test.py: a fixed HTTP port across restarts) and a live Debian
Prometheus scrapes the daemon every 0.25 s while it is restarted with
SIGTERM 3 times, each time with requests in flight. Afterwards no counter,
no histogram _bucket/_count/_sum of the engine family or of tokenmeter_*
(tokenmeter_state_snapshots_total included) may show a reset in
Prometheus: resets(X[10m]) is 0 for every series (process_* restart by
design and are left out). Exits 77 (skipped) when /usr/bin/prometheus is
not installed.

Environment: TOKENMETERD, TOKENMETER_ENGINE (PROMETHEUS overrides
/usr/bin/prometheus).
"""
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
sys.path.insert(0, HERE)
import tokenmeter_testutil as tu  # noqa: E402
from tokenmeter_testutil import Daemon, poll_until  # noqa: E402
from restart_test import HeldSockets, STOPPED  # noqa: E402

PROMETHEUS = os.environ.get("PROMETHEUS", "/usr/bin/prometheus")
NS = "tokenmeter_engine"
LABELS = {"model_name": "faults", "engine": "f0"}
SNAPSHOT_INTERVAL = "0.2"

HISTOGRAMS = tu.ENGINE_REPORT_HISTOGRAMS

COMMON = ["--prompt-len", "64", "--seed", "5", "--backend", "cpu",
          "--model", "faults", "--instance", "f0", "--quiet"]
# About 8 s of Poisson arrivals, a 4-wide batch: a request or so in flight
# at any time, and a queue now and then.
KILL_WORKLOAD = ["--requests", "800", "--rate", "100", "--output-len", "128",
                 "--max-batch", "4", *COMMON]
# About 6 s; longer requests (~20 ms each, two in flight on average).
TERM_WORKLOAD = ["--requests", "600", "--rate", "100", "--output-len", "200",
                 "--max-batch", "8", *COMMON]


def applied_events(samples):
    return samples.sum("tokenmeter_ingest_events_total")


class StateBase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tm-state-", dir="/tmp")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.state_dir = os.path.join(self.dir, "state")
        self.daemons = []
        self.engine = None

    def start_engine(self, socket_path, workload):
        """The engine on socket_path, its files in self.dir."""
        self.engine = tu.Engine(*workload, socket=socket_path, dir=self.dir)
        # Registered after the rmtree: runs before it.
        self.addCleanup(self.engine.cleanup)
        self.engine.start()

    def state_flags(self):
        return ["--state-dir", self.state_dir,
                "--snapshot-interval", SNAPSHOT_INTERVAL]

    def logs(self):
        out = []
        for i, d in enumerate(self.daemons):
            out.append(f"--- daemon {i} ---\n" +
                       d.read_log().decode(errors="replace")[-2500:])
        return "\n".join(out)

    def check_started(self, d):
        restored = d.value("tokenmeter_state_restored")
        want = 0 if len(self.daemons) == 1 else 1
        self.assertEqual(restored, want, self.logs())
        if want:
            self.assertIn(b"state: restored", d.read_log())

    def wait_new_events(self, d, what):
        """Until this daemon applied events of its own (more than it
        restored), then a stretch of the live stream."""
        start = applied_events(d.samples())
        poll_until(lambda: applied_events(d.samples()) > start, timeout=30,
                   what=what)
        time.sleep(0.4)
        self.assertIsNone(self.engine.poll(), "the engine ended too soon")

    def wait_all_applied(self, d, report):
        """Until the last daemon holds every event the client wrote and
        every request's FINISHED (its restored counts included)."""
        sent = report["client_events_sent"]

        def done():
            s = d.samples()
            finished = sum(s.sum(f"{NS}:request_success_total",
                                 finished_reason=r, **LABELS)
                           for r in ("stop", "length", "abort", "error"))
            return applied_events(s) >= sent and \
                finished >= report["requests"]
        try:
            poll_until(done, timeout=20, interval=0.05,
                       what="every event applied")
        except AssertionError:
            pass  # the comparisons below say what differs
        # Nothing more arrives: the engine has closed.
        time.sleep(0.3)
        samples = d.samples()
        self.assertEqual(applied_events(samples), sent,
                         "events applied (the last daemon's cumulative "
                         "tokenmeter_ingest_events_total) vs the client's "
                         f"events sent\n{self.logs()}")
        return samples

    def assert_figures_equal(self, samples, report):
        """The comparisons of test_daemon_figures_equal_engine_report."""
        key = frozenset(LABELS.items())

        def v(name):
            value = samples.get((f"{NS}:{name}", key))
            self.assertIsNotNone(value, name)
            return value

        def success(reason):
            return samples.value(f"{NS}:request_success_total",
                                 finished_reason=reason, **LABELS) or 0

        self.assertEqual(report["client_dropped_events"], 0)
        self.assertEqual(report["client_events_rejected"], 0)
        diffs = []
        for rkey, hist in HISTOGRAMS.items():
            count, total = v(hist + "_count"), v(hist + "_sum")
            want = report[rkey]
            if count != want["count"]:
                diffs.append(f"{hist}_count {count} != report {rkey}.count "
                             f"{want['count']}")
            if abs(total - want["sum"]) > 1e-6 * abs(want["sum"]) + 1e-12:
                diffs.append(f"{hist}_sum {total!r} != report {rkey}.sum "
                             f"{want['sum']!r}")
        for name, want in (
                ("prompt_tokens_total", report["prompt_tokens"]),
                ("generation_tokens_total", report["generation_tokens"]),
                ("request_generation_tokens_sum",
                 report["generation_tokens"]),
                ("num_preemptions_total", report["preemptions"]),
                ("prefix_cache_queries_total",
                 report["prefix_cache_queries"]),
                ("prefix_cache_hits_total", report["prefix_cache_hits"]),
                ("num_requests_running", 0),
                ("num_requests_waiting", 0)):
            if v(name) != want:
                diffs.append(f"{name} {v(name)} != {want}")
        for reason in ("stop", "length", "abort", "error"):
            want = report["finished"].get(reason, 0)
            if success(reason) != want:
                diffs.append(f"request_success_total{{{reason}}} "
                             f"{success(reason)} != {want}")
        errors = samples.value("tokenmeter_ingest_errors_total",
                               reason="bad_event") or 0
        if errors:
            diffs.append(f"ingest errors bad_event {errors}")
        self.assertEqual(diffs, [], "daemon figures vs the engine's report\n"
                         + self.logs())
        self.assertGreater(report["ttft_s"]["count"], 0)
        self.assertEqual(report["ttft_s"]["count"], report["requests"])


class KillRestartWithState(StateBase):
    KILLS = 5

    def start_daemon(self):
        d = Daemon("--log-interval", "0", *self.state_flags(),
                   ingest=self.sock, prefix="tm-state-d-")
        self.addCleanup(d.cleanup)
        self.daemons.append(d)
        d.start()
        self.check_started(d)
        return d

    def test_five_sigkills_lose_nothing_and_count_nothing_twice(self):
        self.sock = os.path.join(self.dir, "i.sock")
        t0 = time.monotonic()
        d = self.start_daemon()
        self.start_engine(self.sock, KILL_WORKLOAD)
        for i in range(self.KILLS):
            self.wait_new_events(d, f"events reaching daemon {i}")
            self.assertEqual(d.kill(), -signal.SIGKILL)
            # A crash leaves the socket file; the next daemon replaces it.
            self.assertTrue(os.path.exists(self.sock))
            time.sleep(0.2)  # the pause without a daemon
            self.assertIsNone(self.engine.poll(), "the engine ended too soon")
            d = self.start_daemon()
        self.wait_new_events(d, "events reaching the last daemon")
        report = self.engine.report(timeout=120)
        self.assertEqual(report["requests"], 800)
        self.assertGreaterEqual(report["client_reconnects"], self.KILLS,
                                report)
        samples = self.wait_all_applied(d, report)
        self.assert_figures_equal(samples, report)
        dup = samples.value("tokenmeter_ingest_duplicate_batches_total")
        snaps = samples.value("tokenmeter_state_snapshots_total",
                              result="ok")
        self.assertEqual(samples.value("tokenmeter_state_snapshots_total",
                                       result="error"), 0)
        self.assertEqual(d.stop(), 0)
        self.assertIsNotNone(STOPPED.search(d.read_log()))
        print(f"\n{self.KILLS} SIGKILLs: {report['client_events_sent']} "
              f"events, {report['client_reconnects']} reconnects, "
              f"{dup:.0f} duplicate batches skipped, {snaps:.0f} snapshots; "
              f"{time.monotonic() - t0:.1f} s", file=sys.stderr)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SigtermRestartNoResets(StateBase):
    RESTARTS = 3
    SCRAPE = "250ms"

    def setUp(self):
        super().setUp()
        self.held = HeldSockets(self.dir)
        self.addCleanup(self.held.close)
        self.prom = None
        self.addCleanup(lambda: tu.stop_process(self.prom))

    def start_daemon(self):
        d = self.held.daemon()
        d.args += self.state_flags()
        self.addCleanup(d.cleanup)
        self.daemons.append(d)
        d.start()
        self.assertEqual(d.port, self.held.port)
        self.check_started(d)
        if len(self.daemons) > 1:
            self.wait_scraped(d)
        return d

    def wait_scraped(self, d):
        """Until Prometheus has scraped this daemon (its start time), so
        that it sees every daemon's figures."""
        started = d.value("process_start_time_seconds")
        poll_until(lambda: self.scalar(
            'process_start_time_seconds{job="tokenmeter"}') == started,
            timeout=20, interval=0.05, what="prometheus scraping daemon "
            f"{len(self.daemons) - 1}")

    def start_prometheus(self):
        for attempt in range(3):
            pdir = os.path.join(self.dir, f"prom{attempt}")
            os.makedirs(pdir)
            self.prom_port = free_port()
            with open(os.path.join(pdir, "prometheus.yml"), "w") as f:
                f.write(f"global:\n"
                        f"  scrape_interval: {self.SCRAPE}\n"
                        f"  scrape_timeout: 200ms\n"
                        f"scrape_configs:\n"
                        f"  - job_name: tokenmeter\n"
                        f"    static_configs:\n"
                        f"      - targets: ['127.0.0.1:{self.held.port}']\n")
            self.prom, self.prom_log = tu.start_prometheus(
                PROMETHEUS, pdir, self.prom_port)
            if tu.wait_prometheus_ready(self.prom, self.prom_port):
                return
            self.prom.wait()
        with open(self.prom_log, errors="replace") as f:
            raise AssertionError("prometheus did not start: " +
                                 f.read()[-3000:])

    def api(self, path, params):
        url = f"http://127.0.0.1:{self.prom_port}{path}"
        data = urllib.parse.urlencode(params, doseq=True).encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data),
                                        timeout=30) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
        self.assertEqual(body.get("status"), "success", (path, params, body))
        return body["data"]

    def vector(self, expr):
        return [(r["metric"], float(r["value"][1]))
                for r in self.api("/api/v1/query", {"query": expr})["result"]]

    def scalar(self, expr):
        r = self.vector(expr)
        return r[0][1] if r else None

    def stop_daemon(self, d):
        rc = d.stop()
        self.assertEqual(rc, 0, self.logs())
        log = d.read_log()
        self.assertIsNotNone(STOPPED.search(log), log.decode())
        self.assertIn(b"state: wrote", log)

    def counter_names(self, d):
        """Sample names of the daemon's counter and histogram families
        (from its # TYPE lines), process_* left out."""
        names = set()
        for m in re.finditer(r"^# TYPE (\S+) (counter|histogram)$",
                             d.metrics_text(), re.M):
            name, kind = m.groups()
            if name.startswith("process_"):
                continue
            if kind == "counter":
                names.add(name)
            else:
                names |= {name + "_bucket", name + "_count", name + "_sum"}
        return names

    def test_three_sigterm_restarts_reset_no_counter(self):
        if not os.access(PROMETHEUS, os.X_OK):
            self.skipTest(f"{PROMETHEUS} not installed (Debian package "
                          "prometheus)")
        t0 = time.time()
        self.start_prometheus()
        d = self.start_daemon()
        job = '{job="tokenmeter"}'
        self.wait_scraped(d)
        self.start_engine(self.held.path, TERM_WORKLOAD)
        in_flight = []
        for i in range(self.RESTARTS):
            self.wait_new_events(d, f"events reaching daemon {i}")

            def busy():
                s = d.samples()
                return (s.value(f"{NS}:num_requests_running", **LABELS) or 0)\
                    + (s.value(f"{NS}:num_requests_waiting", **LABELS) or 0)
            in_flight.append(poll_until(busy, timeout=20, interval=0.005,
                                        what="a request in flight"))
            self.stop_daemon(d)
            self.assertIsNone(self.engine.poll(), "the engine ended too soon")
            d = self.start_daemon()
        self.wait_new_events(d, "events reaching the last daemon")
        report = self.engine.report(timeout=120)
        self.assertEqual(report["requests"], 600)
        self.assertGreaterEqual(report["client_reconnects"], self.RESTARTS)
        samples = self.wait_all_applied(d, report)
        self.assert_figures_equal(samples, report)
        sent = report["client_events_sent"]
        names = self.counter_names(d)

        # Prometheus has scraped the final figures.
        poll_until(lambda: self.scalar(
            f"sum(tokenmeter_ingest_events_total{job})") == sent,
            timeout=20, interval=0.1, what="prometheus seeing the last "
            "figures")
        time.sleep(0.6)  # and a couple of scrapes more
        # It saw every daemon: each start time, the first daemon's
        # restored 0 and the others' 1.
        self.assertEqual(self.scalar(
            f"changes(process_start_time_seconds{job}[10m])"), self.RESTARTS)
        self.assertEqual(self.scalar(
            f"min_over_time(tokenmeter_state_restored{job}[10m])"), 0)
        self.assertEqual(self.scalar(
            f"max_over_time(tokenmeter_state_restored{job}[10m])"), 1)
        scrapes = self.scalar(f"count_over_time(up{job}[10m])")

        series = self.api("/api/v1/series", {
            "match[]": ['{job="tokenmeter",__name__=~'
                        '".+_total|.+_count|.+_sum|.+_bucket"}'],
            "start": f"{t0 - 5:.3f}", "end": f"{time.time() + 1:.3f}"})
        stored = {s["__name__"] for s in series}
        names |= {n for n in stored if not n.startswith("process_")}
        for must in (f"{NS}:prompt_tokens_total",
                     f"{NS}:request_success_total",
                     f"{NS}:time_to_first_token_seconds_count",
                     f"{NS}:e2e_request_latency_seconds_sum",
                     "tokenmeter_ingest_events_total",
                     "tokenmeter_state_snapshots_total",
                     "tokenmeter_http_responses_total"):
            self.assertIn(must, stored)
        queried = sorted(n for n in names if n in stored)
        offenders = []
        total = 0.0
        checked = 0
        for name in queried:
            # One name per query: resets() drops __name__.
            for labels, value in self.vector(f"resets({name}{job}[10m])"):
                checked += 1
                total += value
                if value > 0:
                    offenders.append(f"{name}{labels} resets={value:.0f}")
        # The same, in one expression per name, summed.
        summed = sum(self.scalar(f"sum(resets({n}{job}[10m]))") or 0
                     for n in queried)
        if offenders:
            print("\ncounters that reset:\n  " + "\n  ".join(offenders),
                  file=sys.stderr)
        self.assertEqual(offenders, [], self.logs())
        self.assertEqual(total, 0)
        self.assertEqual(summed, 0)
        self.assertEqual(d.stop(), 0)
        print(f"\n{self.RESTARTS} SIGTERM restarts (requests in flight at "
              f"each stop: {in_flight}): {checked} series of "
              f"{len(queried)} counter/histogram names, none reset over "
              f"{scrapes:.0f} scrapes; {sent} events, "
              f"{report['client_reconnects']} reconnects; "
              f"{time.time() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    if not tu.ENGINE or not tu.DAEMON:
        tu.skip("TOKENMETERD or TOKENMETER_ENGINE not set (run through "
                "meson test)")
    tu.main()
