#!/usr/bin/python3
"""Metrics over OTLP, end to end (issue 31): a real tokenmeterd with
--otlp-metrics-endpoint pushing to OpenTelemetry's receiver (tests/otel:
protobuf bodies decoded by OpenTelemetry's generated code, JSON parsed),
fed hand-written frames through its Unix socket.

Checked, against the same daemon's /metrics (text, parsed by
prometheus_client) once the engine series stopped changing: every engine
family's points (names as /metrics' TYPE lines give them: counters with
_total; types, monotonicity, cumulative
temporality, attributes equal to the labels, values equal), histograms as
exponential (count, sum, the native buckets' total) or, with
--otlp-histograms explicit, as explicit buckets equal to the de-cumulated
`le` buckets; the resource's service.name; start times: a series' start
before its first event, the daemon families' the daemon's start, and,
across a restart with --state-dir, the same start times and cumulative
values that carry on (process_* and tokenmeter_otlp_*: the new process's
start); a receiver that never answers blocks nothing.

Usage: metrics_push_e2e_test.py TOKENMETERD [unittest args]
Skips (exit 77) without node and tests/otel/node_modules.
"""
import math
import os
import socket
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import otel  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa
import tokenmeter_testutil as tu  # noqa: E402
from tokenmeter_testutil import Daemon, batch, hello, poll_until  # noqa: E402

MS = 1_000_000


def events(t0, n, first_rid=1):
    ev = []
    for i in range(n):
        rid, t = first_rid + i, t0 + i * 10 * MS
        ev += [[1, t, rid, 20 + i, {"max_tokens": 32}], [2, t + 1 * MS, rid],
               [3, t + 3 * MS, rid]]
        ev += [[4, t + (8 + 4 * k) * MS, rid, 1] for k in range(3 + i % 4)]
        ev.append([5, t + (40 + 7 * i) * MS, rid, "stop"])
    ev.sort(key=lambda e: e[1])
    return ev


def metrics_of(record):
    """name -> the normalized metric, of one received request."""
    out = {}
    for rm in (record.get("message") or {}).get("resource_metrics", []):
        for sm in rm["scope_metrics"]:
            for m in sm["metrics"]:
                out[m["name"]] = m
    return out


def resource_of(record):
    rms = record["message"]["resource_metrics"]
    return {k: v["value"] for k, v in rms[0]["resource"]["attributes"]
            .items()}


def attrs(point):
    return {k: v["value"] for k, v in point["attributes"].items()}


def number(point):
    v = point["value"]
    return float(v["value"]) if v["type"] == "double" else int(v["value"])


class MetricsPush(unittest.TestCase):
    def run_daemon(self, rx, *flags, state_dir=None):
        args = ["--otlp-metrics-endpoint", rx.metrics_url,
                "--otlp-metrics-interval", "1", "--finished-grace", "0",
                "--log-interval", "0", *flags]
        if state_dir:
            args += ["--state-dir", state_dir]
        d = Daemon(*args)
        d.start()
        self.addCleanup(d.cleanup)
        return d

    def feed(self, d, n=6, first_rid=1, finished=None):
        """n requests; waits until `finished` (default n) FINISHED events
        were applied since the daemon's state began."""
        s = d.connect()
        s.sendall(hello(engine="vllm", model="m"))
        s.sendall(batch(events(time.monotonic_ns() - 5_000 * MS, n,
                               first_rid)))
        self.addCleanup(s.close)
        d.wait_value("tokenmeter_ingest_events_total",
                     n if finished is None else finished, kind="finished")

    def push_after(self, rx, t_unix_ns, timeout=15):
        """The first good push received after t_unix_ns."""
        def found():
            for r in rx.requests():
                if r["signal"] == "metrics" and r["status"] == 200 and \
                        int(r["received_unix_nano"]) > t_unix_ns:
                    self.assertEqual(r["errors"], [], r["errors"])
                    return r
            return None
        return poll_until(found, timeout=timeout, what="a push")

    def check_against_metrics(self, d, rx, explicit=False):
        settled = time.time_ns()
        push = self.push_after(rx, settled)
        text = d.metrics_text()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        got = metrics_of(push)
        checked = 0
        for name, f in fams.items():
            if not name.startswith("vllm:"):
                continue
            # The Prometheus metric name, not altered: text 0.0.4's, a
            # counter's with _total (the parser's family name has none).
            otlp_name = name + "_total" if f.type == "counter" else name
            self.assertIn(otlp_name, got, name)
            self.assertIn(f"# TYPE {otlp_name} {f.type}\n", text)
            m = got[otlp_name]
            samples = [s for s in f.samples]
            if f.type == "counter":
                self.assertEqual(m["type"], "sum", name)
                self.assertTrue(m["is_monotonic"], name)
                self.assertEqual(m["aggregation_temporality"], 2, name)
                want = {frozenset(s.labels.items()): s.value
                        for s in samples if s.name == name + "_total"}
                have = {frozenset(attrs(p).items()): number(p)
                        for p in m["data_points"]}
                self.assertEqual(have, want, name)
            elif f.type == "gauge":
                self.assertIn(m["type"], ("gauge", "sum"), name)
                if name.endswith("_info"):
                    self.assertEqual(m["type"], "sum", name)
                    self.assertFalse(m["is_monotonic"], name)
                want = {frozenset(s.labels.items()): s.value
                        for s in samples if s.name == name}
                have = {frozenset(attrs(p).items()): number(p)
                        for p in m["data_points"]}
                self.assertEqual(set(have), set(want), name)
                for k, v in want.items():
                    if math.isnan(v):
                        self.assertTrue(math.isnan(have[k]), name)
                    else:
                        self.assertEqual(have[k], v, name)
            elif f.type == "histogram":
                want_type = "histogram" if explicit else \
                    "exponential_histogram"
                self.assertEqual(m["type"], want_type, name)
                self.assertEqual(m["aggregation_temporality"], 2, name)
                for p in m["data_points"]:
                    key = attrs(p)
                    mine = [s for s in samples if {
                        k: v for k, v in s.labels.items() if k != "le"}
                        == key]
                    count = [s.value for s in mine
                             if s.name == name + "_count"][0]
                    total = [s.value for s in mine
                             if s.name == name + "_sum"][0]
                    self.assertEqual(int(p["count"]), count, name)
                    self.assertAlmostEqual(float(p.get("sum") or 0), total,
                                           delta=1e-9 * max(1, total))
                    if explicit:
                        les = sorted(((float(s.labels["le"]), s.value)
                                      for s in mine
                                      if s.name == name + "_bucket"))
                        cum = [v for _, v in les]
                        per = [int(c - (cum[i - 1] if i else 0))
                               for i, c in enumerate(cum)]
                        self.assertEqual(
                            [int(c) for c in p["bucket_counts"]], per, name)
                        self.assertEqual(
                            [float(b) for b in p["explicit_bounds"]],
                            [b for b, _ in les[:-1]], name)
                    else:
                        in_buckets = int(p["zero_count"]) + sum(
                            int(c) for side in ("positive", "negative")
                            for c in (p[side] or {}).get("bucket_counts",
                                                         []))
                        self.assertEqual(in_buckets, count, name)
            checked += 1
        self.assertGreater(checked, 20)
        return push

    def test_push_equals_the_exposition(self):
        with otel.Receiver() as rx:
            before = time.time_ns()
            d = self.run_daemon(rx)
            self.feed(d)
            push = self.check_against_metrics(d, rx)
            res = resource_of(push)
            self.assertEqual(res["service.name"],
                             "unknown_service:tokenmeterd")
            # Prometheus' `instance`: this host (--listen's port is 0 here,
            # a free one, so no port).
            self.assertEqual(res["service.instance.id"], socket.gethostname())
            got = metrics_of(push)
            # Start times: the series' (made at the first HELLO, after the
            # daemon started) and the daemon's own families'.
            p = got["vllm:generation_tokens_total"]["data_points"][0]
            start = int(p["start_time_unix_nano"])
            self.assertGreaterEqual(start, before)
            self.assertLess(start, int(p["time_unix_nano"]))
            own = got["tokenmeter_ingest_frames_total"]["data_points"][0] \
                if "tokenmeter_ingest_frames_total" in got else None
            if own is not None:
                self.assertGreaterEqual(int(own["start_time_unix_nano"]),
                                        before)
                self.assertLessEqual(int(own["start_time_unix_nano"]), start)

    def test_explicit_histograms(self):
        with otel.Receiver() as rx:
            d = self.run_daemon(rx, "--otlp-histograms", "explicit")
            self.feed(d)
            self.check_against_metrics(d, rx, explicit=True)

    def test_json_pushes(self):
        with otel.Receiver() as rx:
            d = self.run_daemon(rx, "--otlp-protocol", "http/json")
            self.feed(d)
            push = self.check_against_metrics(d, rx)
            self.assertEqual(push["content_type"], "application/json")

    def test_restart_with_state_keeps_start_times_and_values(self):
        state = tempfile.mkdtemp(prefix="tm-push-state-", dir="/tmp")
        self.addCleanup(lambda: __import__("shutil").rmtree(
            state, ignore_errors=True))
        with otel.Receiver() as rx:
            d = self.run_daemon(rx, state_dir=state)
            self.feed(d, n=4)
            first = metrics_of(self.push_after(rx, time.time_ns()))
            d.stop()
            d2 = self.run_daemon(rx, state_dir=state)
            self.feed(d2, n=3, first_rid=100, finished=4 + 3)
            second = metrics_of(self.push_after(rx, time.time_ns()))
            for name in ("vllm:generation_tokens_total",
                         "vllm:prompt_tokens_total",
                         "vllm:e2e_request_latency_seconds"):
                a, b = (first[name]["data_points"][0],
                        second[name]["data_points"][0])
                self.assertEqual(a["start_time_unix_nano"],
                                 b["start_time_unix_nano"], name)
                if "count" in a:
                    self.assertEqual(int(b["count"]), int(a["count"]) + 3)
                else:
                    self.assertGreater(number(b), number(a), name)
            # The daemon's own restored families keep their start; those
            # of the process (process_*, the OTLP exporters') start again
            # with the new process, later than the first one's.
            a, b = (first["tokenmeter_ingest_frames_total"]["data_points"][0],
                    second["tokenmeter_ingest_frames_total"]["data_points"][0])
            self.assertEqual(a["start_time_unix_nano"],
                             b["start_time_unix_nano"])
            self.assertGreater(number(b), number(a))
            a, b = (first["process_cpu_seconds_total"]["data_points"][0],
                    second["process_cpu_seconds_total"]["data_points"][0])
            self.assertGreater(int(b["start_time_unix_nano"]),
                               int(a["start_time_unix_nano"]))
            self.assertGreater(int(b["start_time_unix_nano"]),
                               int(first["vllm:generation_tokens_total"]
                                   ["data_points"][0]["time_unix_nano"]))

    def test_a_receiver_that_never_answers_blocks_nothing(self):
        # The first push waits for an answer that never comes, the later
        # ones wait in the queue; ingest and /metrics go on, and the stop
        # line counts it all (nothing exported, the rest failed at the
        # stop's deadline or never sent).
        with otel.Receiver(stall=True) as rx:
            d = self.run_daemon(rx, "--otlp-timeout", "60000")
            self.feed(d, n=3)
            poll_until(lambda: len(rx.requests()) >= 1, what="a push")
            self.feed(d, n=2, first_rid=10, finished=3 + 2)
            self.assertIn("vllm:generation_tokens_total", d.metrics_text())
            time.sleep(2.5)  # two more pushes, queued
            d.stop()
            line = [ln for ln in d.read_log().decode().splitlines()
                    if "metrics push:" in ln]
            self.assertEqual(len(line), 1, d.read_log())
            import re
            m = re.search(r"(\d+) pushes, data points: (\d+) exported, "
                          r"(\d+) dropped \(queue full\), (\d+) failed, "
                          r"(\d+) not sent", line[0])
            self.assertIsNotNone(m, line[0])
            pushes, exported, dropped, failed, unsent = map(int, m.groups())
            self.assertGreaterEqual(pushes, 3)
            self.assertEqual(exported, 0)
            points = int(rx.requests()[0]["items"])
            self.assertGreater(points, 0)
            # Every push's points: failed at the deadline, never sent, or
            # (a queue too small) dropped; none lost from the count.
            self.assertGreaterEqual(dropped + failed + unsent,
                                    pushes * points - points)

class PushSettings(unittest.TestCase):
    """OTEL_METRIC_EXPORT_INTERVAL as the OpenTelemetry SDKs read it: empty
    is unset; a bad value stops the start with one line and exit status 2,
    as a bad flag does."""

    ENDPOINT = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT":
                "http://127.0.0.1:1/v1/metrics"}

    def start(self, interval):
        d = Daemon("--log-interval", "0",
                   env={**self.ENDPOINT,
                        "OTEL_METRIC_EXPORT_INTERVAL": interval})
        d.start()
        self.addCleanup(d.cleanup)
        return d

    def push_line(self, d):
        poll_until(lambda: "metrics: OTLP push to" in d.read_log().decode(),
                   what="the push's start line")
        return [ln for ln in d.read_log().decode().splitlines()
                if "metrics: OTLP push to" in ln][0]

    def test_interval_from_the_environment(self):
        self.assertIn("every 2 s", self.push_line(self.start("2000")))

    def test_empty_interval_is_unset(self):
        self.assertIn("every 15 s", self.push_line(self.start("")))

    def test_sub_second_interval_is_raised_to_the_floor(self):
        # Valid for the SDKs (any positive count), under the daemon's 1 s.
        line = self.push_line(self.start("250"))
        self.assertIn("every 1 s", line)
        self.assertIn("OTEL_METRIC_EXPORT_INTERVAL 250 ms is below the "
                      "daemon's 1 s floor", line)

    def test_bad_interval_stops_the_start(self):
        import subprocess
        for value in ("abc", "0", "15s", "-1000", "1.5"):
            proc = subprocess.run(
                [tu.DAEMON, "--ingest", "/tmp/tm-never.sock", "--listen",
                 "127.0.0.1:0"],
                env={**os.environ, **self.ENDPOINT,
                     "OTEL_METRIC_EXPORT_INTERVAL": value},
                capture_output=True, text=True, timeout=20)
            self.assertEqual(proc.returncode, 2, proc.stderr)
            lines = [line for line in proc.stderr.splitlines()
                     if line.startswith("tokenmeterd:")]
            self.assertEqual(len(lines), 1, proc.stderr)
            self.assertIn("OTEL_METRIC_EXPORT_INTERVAL", lines[0])
            self.assertIn(f'"{value}"', lines[0])


if __name__ == "__main__":
    tu.DAEMON = os.path.abspath(sys.argv.pop(1))
    otel.skip_unless_otel()
    tu.main()
