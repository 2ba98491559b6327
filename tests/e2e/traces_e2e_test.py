#!/usr/bin/python3
"""Request traces over OTLP, end to end (issue 30).

Hand-written protocol frames with known CLOCK_MONOTONIC times go through a
real Unix socket into a real tokenmeterd started with --otlp-endpoint; its
spans go over OTLP/HTTP to OpenTelemetry's receiver (tests/otel, decoded
by OpenTelemetry's generated protobuf code, or by TestCollector for JSON).
Checked: the span tree (names, parents, the caller's trace and parent from
traceparent), every span's start and end equal to its events' times plus
one offset per request (the documented clock conversion), the offset
within the time the test took of Unix - CLOCK_MONOTONIC, attributes, the
ERROR status of an "error" request, sampling (ratio 0 keeps only the
failed, slow and parent-sampled requests), and that
tokenmeter_otlp_spans_total{result="exported"} counts what arrived.
DisaggregatedTrace: the reference engine's --disaggregate (prefill and
decode processes on two connections) gives one trace per request, both
sides' root spans under the caller's span (needs $TOKENMETER_ENGINE).

Usage: traces_e2e_test.py TOKENMETERD [unittest args]
Skips (exit 77) without node and tests/otel/node_modules.
"""
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import otel  # noqa: E402
import tokenmeter_testutil as tu  # noqa: E402
from tokenmeter_testutil import Daemon, batch, hello, poll_until  # noqa: E402

MS = 1_000_000
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


def unix_minus_mono():
    return time.time_ns() - time.monotonic_ns()


class Traces(unittest.TestCase):
    def run_daemon(self, receiver, *flags):
        d = Daemon("--otlp-endpoint", receiver.traces_url,
                   "--finished-grace", "0", "--log-interval", "0", *flags)
        d.start()
        self.addCleanup(d.cleanup)
        return d

    def send(self, d, events):
        s = d.connect()
        s.sendall(hello(engine="vllm", model="m"))
        s.sendall(batch(events))
        return s

    def spans(self, receiver, n, timeout=15):
        def enough():
            return len(otel.spans_of(receiver.requests())) >= n
        poll_until(enough, timeout=timeout, what="%d spans" % n)
        reqs = receiver.requests()
        for r in reqs:
            self.assertEqual(r["errors"], [], r)
            self.assertEqual(r["status"], 200)
        return otel.spans_of(reqs)

    def test_span_tree_and_times(self, protocol="http/protobuf"):
        with otel.Receiver() as rx:
            d = self.run_daemon(rx, "--trace-ratio", "1", "--otlp-protocol",
                                protocol)
            off_before = unix_minus_mono()
            t0 = time.monotonic_ns() - 5_000 * MS
            tp = "00-%s-%s-01" % (TRACE_ID, PARENT_ID)
            ev = [
                [1, t0, "req-1", 100, {"max_tokens": 64,
                                       "traceparent": tp}],
                [2, t0 + 1 * MS, "req-1"],
                [3, t0 + 10 * MS, "req-1", {"cached_tokens": 40}],
                [10, t0 + 60 * MS, "req-1",
                 {"role": "recv", "start": t0 + 20 * MS, "bytes": 4096}],
                [4, t0 + 100 * MS, "req-1", 1],
                [6, t0 + 110 * MS, "req-1"],
                [3, t0 + 120 * MS, "req-1"],
                [4, t0 + 130 * MS, "req-1", 2],
                [5, t0 + 140 * MS, "req-1", "length"],
                # An error request, no trace context.
                [1, t0, 7, 10],
                [3, t0 + 2 * MS, 7],
                [5, t0 + 3 * MS, 7, "error"],
            ]
            s = self.send(d, ev)
            spans = self.spans(rx, 1)
            off_after = unix_minus_mono()
            s.close()
            poll_until(lambda: len(otel.spans_of(rx.requests())) >= 8,
                       what="8 spans")
            spans = otel.spans_of(rx.requests())
            by_trace = {}
            for sp in spans:
                by_trace.setdefault(sp["trace_id"], []).append(sp)
            self.assertIn(TRACE_ID, by_trace)
            r1 = {sp["name"]: sp for sp in by_trace[TRACE_ID]}
            self.assertEqual(
                sorted(r1), sorted(["llm_request", "queue", "prefill",
                                    "kv_transfer.recv", "preempted",
                                    "decode"]))
            root = r1["llm_request"]
            self.assertEqual(root["parent_span_id"], PARENT_ID)
            for name, sp in r1.items():
                if name != "llm_request":
                    self.assertEqual(sp["parent_span_id"], root["span_id"],
                                     name)
            # One offset per request: every span's times are its events'
            # times plus it, to the nanosecond.
            offset = int(root["start_time_unix_nano"]) - t0
            expect = {
                "llm_request": (0, 140), "queue": (1, 10),
                "prefill": (10, 100), "kv_transfer.recv": (20, 60),
                "preempted": (110, 120), "decode": (100, 140),
            }
            for name, (a, b) in expect.items():
                sp = r1[name]
                self.assertEqual(int(sp["start_time_unix_nano"]),
                                 t0 + a * MS + offset, name)
                self.assertEqual(int(sp["end_time_unix_nano"]),
                                 t0 + b * MS + offset, name)
            # The offset is Unix - CLOCK_MONOTONIC as read around the run
            # (the clocks may be slewed apart by at most that drift).
            lo, hi = sorted([off_before, off_after])
            self.assertLessEqual(lo - 5 * MS, offset)
            self.assertLessEqual(offset, hi + 5 * MS)
            attrs = root["attributes"]
            self.assertEqual(attrs["gen_ai.usage.input_tokens"]["value"],
                             "100")
            self.assertEqual(attrs["gen_ai.usage.output_tokens"]["value"],
                             "3")
            self.assertEqual(attrs["gen_ai.request.max_tokens"]["value"],
                             "64")
            # The error request: its own trace, status ERROR.
            others = [sps for tid, sps in by_trace.items() if tid != TRACE_ID]
            self.assertEqual(len(others), 1)
            root7 = [sp for sp in others[0] if sp["name"] == "llm_request"][0]
            self.assertEqual(root7["parent_span_id"], "")
            self.assertEqual(root7["status"]["code"], 2)
            # What the daemon counts is what arrived.
            n = len(spans)
            d.wait_value("tokenmeter_otlp_spans_total", n, result="exported")
            self.assertEqual(d.value("tokenmeter_otlp_spans_total",
                                     result="dropped"), 0)
            self.assertEqual(d.value("tokenmeter_otlp_spans_total",
                                     result="failed"), 0)
            self.assertEqual(d.value("tokenmeter_otlp_export_seconds_count"),
                             len(rx.requests()))

    def test_json_encoding(self):
        self.test_span_tree_and_times(protocol="http/json")

    def test_tail_sampling_with_ratio_zero(self):
        with otel.Receiver() as rx:
            d = self.run_daemon(rx, "--trace-ratio", "0",
                                "--trace-slower-than", "1")
            t0 = time.monotonic_ns() - 5_000 * MS
            unsampled = "00-%s-%s-00" % (TRACE_ID, PARENT_ID)
            sampled = "00-%s-%s-01" % ("1" * 32, PARENT_ID)
            ev = []
            # 1: fast, stop: dropped. 2: slow (2 s): kept. 3: abort: kept.
            # 4: parent not sampled, fast: dropped. 5: parent sampled: kept.
            for rid, end, reason, params in [
                    (1, 10, "stop", None), (2, 2000, "stop", None),
                    (3, 10, "abort", None),
                    (4, 10, "stop", {"traceparent": unsampled}),
                    (5, 10, "stop", {"traceparent": sampled})]:
                arrived = [1, t0, rid, 10]
                if params:
                    arrived.append(params)
                ev += [arrived, [3, t0 + MS, rid], [4, t0 + 5 * MS, rid, 1],
                       [5, t0 + end * MS, rid, reason]]
            self.send(d, ev)
            poll_until(lambda: len({sp["trace_id"] for sp in
                                    otel.spans_of(rx.requests())}) >= 3,
                       what="3 traces")
            time.sleep(1.5)  # a flush period: nothing more comes
            roots = [sp for sp in otel.spans_of(rx.requests())
                     if sp["name"] == "llm_request"]
            ids = sorted(sp["attributes"]["tokenmeter.request_id"]["value"]
                         for sp in roots)
            self.assertEqual(ids, ["2", "3", "5"])

    def test_stop_exports_requests_in_their_grace_period(self):
        # interfaces.md: every error / abort request is kept whatever the
        # ratio. Finished within --finished-grace before a SIGTERM, they
        # were never exported: retired only after the grace, which the
        # stop cut short. Without a state directory the stop retires them
        # after reading the connections to their end, then exports;
        # with one they are saved (and traced after the restart, once).
        for state in (False, True):
            with self.subTest(state_dir=state), otel.Receiver() as rx:
                flags = ["--otlp-endpoint", rx.traces_url, "--trace-ratio",
                         "0", "--finished-grace", "60", "--log-interval", "0"]
                d = Daemon(*flags)
                if state:
                    d.args += ["--state-dir", os.path.join(d.dir, "state"),
                               "--boot-id-file", os.path.join(d.dir, "boot")]
                    with open(os.path.join(d.dir, "boot"), "w") as f:
                        f.write("b1\n")
                d.start()
                self.addCleanup(d.cleanup)
                t0 = time.monotonic_ns() - 1_000 * MS
                ev = [[1, t0, 1, 10], [3, t0 + MS, 1],
                      [4, t0 + 2 * MS, 1, 1], [5, t0 + 3 * MS, 1, "stop"],
                      [1, t0, 2, 10], [3, t0 + MS, 2],
                      [5, t0 + 3 * MS, 2, "error"],
                      [1, t0, 3, 10], [5, t0 + 3 * MS, 3, "abort"],
                      [1, t0, 4, 10], [3, t0 + MS, 4]]  # still running
                s = self.send(d, ev)
                d.wait_value("tokenmeter_ingest_events_total", 3,
                             kind="finished")
                s.close()
                self.assertEqual(d.stop(), 0, d.read_log())
                roots = [sp for sp in otel.spans_of(rx.requests())
                         if sp["name"] == "llm_request"]
                ids = sorted(sp["attributes"]["tokenmeter.request_id"]
                             ["value"] for sp in roots)
                # Sampled out at ratio 0: 1 (stop); 4 never finished.
                self.assertEqual(ids, [] if state else ["2", "3"])
                if not state:
                    continue
                # The restart loads them and retires them after their
                # grace: each traced once.
                d2 = Daemon(*flags, "--finished-grace", "0.2",
                            "--state-dir", os.path.join(d.dir, "state"),
                            "--boot-id-file", os.path.join(d.dir, "boot"))
                d2.start()
                self.addCleanup(d2.cleanup)
                poll_until(lambda: len(otel.spans_of(rx.requests())) >= 2,
                           what="the restored requests' spans")
                time.sleep(1.5)  # a flush period: nothing more comes
                roots = [sp for sp in otel.spans_of(rx.requests())
                         if sp["name"] == "llm_request"]
                self.assertEqual(
                    sorted(sp["attributes"]["tokenmeter.request_id"]["value"]
                           for sp in roots), ["2", "3"])

    def requests_with(self, t0, n, first_rid=1):
        ev = []
        for rid in range(first_rid, first_rid + n):
            ev += [[1, t0, rid, 10], [3, t0 + MS, rid],
                   [4, t0 + 2 * MS, rid, 1], [5, t0 + 3 * MS, rid, "stop"]]
        return ev

    def test_retries_after_503_with_retry_after(self):
        # The first two exports answered 503 Retry-After: 1: the spans
        # still arrive, once each, and the daemon counts them exported.
        with otel.Receiver(fail_status=503, fail_count=2,
                           retry_after=1) as rx:
            d = self.run_daemon(rx, "--trace-ratio", "1")
            self.send(d, self.requests_with(time.monotonic_ns() - 5_000 * MS,
                                            3))
            d.wait_value("tokenmeter_otlp_spans_total", 3 * 4, timeout=30,
                         result="exported")
            ok = [r for r in rx.requests() if r["status"] == 200]
            failed = [r for r in rx.requests() if r["status"] == 503]
            self.assertEqual(len(failed), 2)
            self.assertEqual(len(otel.spans_of(ok)), 3 * 4)
            self.assertEqual(d.value("tokenmeter_otlp_spans_total",
                                     result="failed"), 0)

    def test_failing_exports_are_logged_once_per_burst(self):
        # A receiver that refuses (400, not retried) the first three
        # exports: one warning naming the endpoint and the status when
        # they start failing, none for the next two, one line when an
        # export succeeds again with the items failed meanwhile.
        with otel.Receiver(fail_status=400, fail_count=3) as rx:
            d = self.run_daemon(rx, "--trace-ratio", "1")
            t0 = time.monotonic_ns() - 5_000 * MS
            for k in range(4):  # one export each (a flush period apart)
                self.send(d, self.requests_with(t0, 1, first_rid=k + 1))
                if k < 3:
                    d.wait_value("tokenmeter_otlp_spans_total", 4 * (k + 1),
                                 timeout=30, result="failed")
                else:
                    d.wait_value("tokenmeter_otlp_spans_total", 4,
                                 timeout=30, result="exported")
            log = d.read_log().decode()
            failed = [line for line in log.splitlines()
                      if "OTLP: export to" in line]
            self.assertEqual(len(failed), 1, log)
            self.assertIn(rx.traces_url, failed[0])
            self.assertIn("400", failed[0])
            self.assertIn("warn", failed[0])
            again = [line for line in log.splitlines()
                     if "succeed again" in line]
            self.assertEqual(len(again), 1, log)
            self.assertIn("(12 items failed meanwhile)", again[0])

    def test_stalled_receiver_bounds_the_queue_and_never_blocks(self):
        # A receiver that never answers, a queue of 100 spans: ingest goes
        # on (every event applied), what does not fit is dropped, and the
        # counts add up: exported + dropped + failed + waiting = built.
        with otel.Receiver(stall=True) as rx:
            d = self.run_daemon(rx, "--trace-ratio", "1",
                                "--otlp-queue-spans", "100",
                                "--otlp-timeout", "60000")
            t0 = time.monotonic_ns() - 5_000 * MS
            n = 300
            self.send(d, self.requests_with(t0, n))
            d.wait_value("tokenmeter_ingest_events_total", n, kind="finished")
            built = 4 * n

            def settled():
                dropped = d.value("tokenmeter_otlp_spans_total",
                                  result="dropped")
                waiting = d.value("tokenmeter_otlp_queue_spans")
                return dropped + waiting == built and dropped > 0
            poll_until(settled, timeout=20, what="every span dropped or "
                       "waiting")
            # The queue and one batch in flight, itself at most the bound.
            self.assertLessEqual(d.value("tokenmeter_otlp_queue_spans"),
                                 100 + 100)
            self.assertEqual(d.value("tokenmeter_otlp_spans_total",
                                     result="exported"), 0)
            # The daemon still answers and ingests.
            self.send(d, self.requests_with(t0, 1, first_rid=10_000))
            d.wait_value("tokenmeter_ingest_events_total", n + 1,
                         kind="finished")

    def test_small_queue_still_exports_every_batch(self):
        # --otlp-queue-spans below the batch size (512): a request body
        # holds at most that many spans, so 200 spans retired at once go
        # as two bodies of 100, both exported (one body of 200 would never
        # fit the queue and was dropped whole).
        with otel.Receiver() as rx:
            d = self.run_daemon(rx, "--trace-ratio", "1",
                                "--otlp-queue-spans", "100")
            n = 50
            self.send(d, self.requests_with(
                time.monotonic_ns() - 5_000 * MS, n))
            d.wait_value("tokenmeter_otlp_spans_total", 4 * n, timeout=30,
                         result="exported")
            self.assertEqual(d.value("tokenmeter_otlp_spans_total",
                                     result="dropped"), 0)
            sizes = [len(otel.spans_of([r])) for r in rx.requests()]
            self.assertEqual(sum(sizes), 4 * n)
            self.assertLessEqual(max(sizes), 100, sizes)

    def test_bad_otlp_settings_stop_the_start(self):
        import subprocess
        # A bad value exits 2, as a bad flag does; a file that cannot be
        # read, 1 (tokenmeterd(8), EXIT STATUS).
        for args, env, needle, rc in [
                (["--otlp-endpoint", "http://127.0.0.1:1/v1/traces",
                  "--otlp-protocol", "grpc"], {}, "--otlp-protocol", 2),
                (["--otlp-endpoint", "ftp://x/v1/traces"], {},
                 "--otlp-endpoint", 2),
                ([], {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                      "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"},
                 "OTEL_EXPORTER_OTLP_COMPRESSION", 2),
                (["--otlp-metrics-endpoint", "http://127.0.0.1:1/v1/metrics",
                  "--otlp-timeout", "0"], {}, "--otlp-timeout", 2),
                (["--otlp-endpoint", "https://127.0.0.1:1/v1/traces",
                  "--otlp-certificate", "/nonexistent/ca.pem"], {},
                 "/nonexistent/ca.pem", 1),
                # No endpoint: a bad flag still stops the start (the
                # OTEL_* variables are read only when a signal is on).
                (["--otlp-protocol", "grpc"], {}, "--otlp-protocol", 2),
                (["--otlp-compression", "br"], {}, "--otlp-compression", 2),
                (["--otlp-client-key", "/k.pem"], {}, "--otlp-client-key",
                 2)]:
            proc = subprocess.run(
                [tu.DAEMON, "--ingest", "/tmp/tm-never.sock", "--listen",
                 "127.0.0.1:0", *args],
                env={**os.environ, **env}, capture_output=True, text=True,
                timeout=20)
            self.assertEqual(proc.returncode, rc, proc.stderr)
            lines = [line for line in proc.stderr.splitlines()
                     if line.startswith("tokenmeterd:")]
            self.assertEqual(len(lines), 1, proc.stderr)
            self.assertIn(needle, lines[0])


class DisaggregatedTrace(unittest.TestCase):
    """Issue 30, item 5: the reference engine's --disaggregate (a prefill
    process handing each request's KV cache over a socket to a decode
    process, both reporting to one daemon on two connections, each ARRIVED
    with the same traceparent) gives one trace per request: the prefill
    side's llm_request (with its queue, prefill and kv_transfer.send) and
    the decode side's (kv_transfer.recv, decode) are siblings under the
    caller's span, in the caller's trace; the engine's --report counts the
    traceparents it sent on each side, and on each side the spans'
    durations (request, queue, prefill, KV send and receive) sum to the
    engine's own summaries of the same intervals (span times equal the
    events' times)."""

    def test_prefill_and_decode_spans_form_one_trace(self):
        if not tu.ENGINE:
            self.skipTest("TOKENMETER_ENGINE is not set")
        with otel.Receiver() as rx:
            d = Daemon("--otlp-endpoint", rx.traces_url, "--trace-ratio",
                       "0", "--log-interval", "0")
            d.start()
            self.addCleanup(d.cleanup)
            engine = tu.Engine(
                "--requests", "24", "--rate", "200", "--prompt-len", "32",
                "--output-len", "8", "--backend", "cpu", "--model", "dg",
                "--instance", "dg", "--seed", "5", "--quiet",
                "--disaggregate", socket=d.sock)
            self.addCleanup(engine.cleanup)
            engine.start()
            report = engine.report()
            sent = report["prefill"]["traceparents"]
            self.assertEqual(sent, 24)
            self.assertEqual(report["decode"]["traceparents"], 24)

            def roots():
                return [sp for sp in otel.spans_of(rx.requests())
                        if sp["name"] == "llm_request"]
            # Both sides of every request, as the daemon retires them.
            poll_until(lambda: len(roots()) >= 2 * sent, timeout=30,
                       what="%d root spans" % (2 * sent))
            spans = otel.spans_of(rx.requests())
            by_trace = {}
            for sp in spans:
                by_trace.setdefault(sp["trace_id"], []).append(sp)
            self.assertEqual(len(by_trace), sent)
            for trace_id, sps in by_trace.items():
                rts = [sp for sp in sps if sp["name"] == "llm_request"]
                self.assertEqual(len(rts), 2, trace_id)
                sides = {sp["attributes"]["tokenmeter.engine.engine"]
                         ["value"]: sp for sp in rts}
                self.assertEqual(sorted(sides), ["dg-decode", "dg-prefill"])
                prefill, decode = sides["dg-prefill"], sides["dg-decode"]
                # Siblings under the caller's span (the traceparent's).
                self.assertEqual(prefill["parent_span_id"],
                                 decode["parent_span_id"])
                self.assertNotEqual(prefill["parent_span_id"], "")
                self.assertNotIn(prefill["parent_span_id"],
                                 {sp["span_id"] for sp in sps})
                self.assertEqual(
                    prefill["attributes"]["tokenmeter.request_id"],
                    decode["attributes"]["tokenmeter.request_id"])
                children = {}
                for sp in sps:
                    if sp["name"] != "llm_request":
                        children.setdefault(sp["parent_span_id"],
                                            set()).add(sp["name"])
                self.assertIn("kv_transfer.send",
                              children.get(prefill["span_id"], set()),
                              trace_id)
                self.assertLessEqual({"kv_transfer.recv", "decode"},
                                     children.get(decode["span_id"], set()),
                                     trace_id)
                # The hand-over: the decode side's receive ends no earlier
                # than the prefill side's send starts, on one host clock.
                send = [sp for sp in sps if sp["name"] == "kv_transfer.send"]
                recv = [sp for sp in sps if sp["name"] == "kv_transfer.recv"]
                self.assertGreaterEqual(int(recv[-1]["end_time_unix_nano"]),
                                        int(send[0]["start_time_unix_nano"]))
            # Span times against the engine's own --report: on each side,
            # the durations of its spans sum to what the engine measured
            # from the same event times (its summaries' count and sum, in
            # seconds: equal to rounding).
            side_of = {}
            for sp in spans:
                if sp["name"] == "llm_request":
                    side_of[sp["span_id"]] = sp["attributes"][
                        "tokenmeter.engine.engine"]["value"][len("dg-"):]

            def sums(name):
                out = {"prefill": [], "decode": []}
                for sp in spans:
                    if sp["name"] != name:
                        continue
                    side = side_of[sp["span_id"] if name == "llm_request"
                                   else sp["parent_span_id"]]
                    out[side].append(int(sp["end_time_unix_nano"]) -
                                     int(sp["start_time_unix_nano"]))
                return out
            checks = [("llm_request", lambda r: r["e2e_s"]),
                      ("queue", lambda r: r["queue_s"]),
                      ("prefill", lambda r: r["prefill_s"]),
                      ("kv_transfer.send",
                       lambda r: r["kv_transfer"]["send"]["time_s"]),
                      ("kv_transfer.recv",
                       lambda r: r["kv_transfer"]["recv"]["time_s"])]
            compared = 0
            for name, figure in checks:
                got = sums(name)
                for side in ("prefill", "decode"):
                    want = figure(report[side])
                    self.assertEqual(len(got[side]), want["count"],
                                     (name, side))
                    self.assertAlmostEqual(sum(got[side]) / 1e9, want["sum"],
                                           delta=1e-9 * (1 + want["count"]),
                                           msg=(name, side))
                    compared += want["count"]
            self.assertGreater(compared, 4 * sent)


if __name__ == "__main__":
    tu.DAEMON = os.path.abspath(sys.argv.pop(1))
    otel.skip_unless_otel()
    tu.main()
