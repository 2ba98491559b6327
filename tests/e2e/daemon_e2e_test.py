#!/usr/bin/python3
"""End to end: hand-written frames -> real tokenmeterd -> real HTTP scrape
-> prometheus_client's parser. Values are checked to the nanosecond.

Usage: daemon_e2e_test.py TOKENMETERD [unittest args]
"""
import gzip
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import unittest

import msgpack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402
from tokenmeter_testutil import (  # noqa: E402
    Daemon, batch, hello, poll_until, wait_closed)

MS = 1_000_000


class HandWrittenFrames(unittest.TestCase):
    def setUp(self):
        self.d = Daemon("--log-interval", "0").start()
        self.addCleanup(self.d.cleanup)
        self.addCleanup(self.d.stop)

    def test_intervals_to_the_nanosecond(self):
        t0 = time.monotonic_ns() - 5_000 * MS
        lab = dict(model_name="m", engine="dp0", team="a")
        s = self.d.connect()
        s.sendall(hello(instance="dp0", labels={"team": "a"}))
        s.sendall(batch([
            [1, t0, 7, 100, {"max_tokens": 64, "n": 1}],
            [2, t0 + 1 * MS + 1, 7],
            [3, t0 + 3 * MS + 2, 7],
            [4, t0 + 10 * MS + 3, 7, 1],
            [4, t0 + 25 * MS + 5, 7, 2],
            [4, t0 + 40 * MS + 8, 7, 1],
            [5, t0 + 41 * MS + 13, 7, "stop"],
        ]))
        d = self.d
        d.wait_value("vllm:request_success_total", 1, finished_reason="stop",
                     **lab)

        def v(name):
            return d.value(name, **lab)
        self.assertEqual(v("vllm:time_to_first_token_seconds_sum"),
                         (10 * MS + 3) / 1e9)
        self.assertEqual(v("vllm:time_to_first_token_seconds_count"), 1)
        self.assertEqual(v("vllm:inter_token_latency_seconds_count"), 2)
        self.assertEqual(v("vllm:inter_token_latency_seconds_sum"),
                         (30 * MS + 5) / 1e9)
        self.assertEqual(v("vllm:e2e_request_latency_seconds_sum"),
                         (41 * MS + 13) / 1e9)
        self.assertEqual(v("vllm:request_queue_time_seconds_sum"),
                         (2 * MS + 1) / 1e9)
        self.assertEqual(v("vllm:request_prefill_time_seconds_sum"),
                         (7 * MS + 1) / 1e9)
        self.assertEqual(v("vllm:request_decode_time_seconds_sum"),
                         (30 * MS + 5) / 1e9)
        self.assertEqual(v("vllm:request_inference_time_seconds_sum"),
                         (37 * MS + 6) / 1e9)
        self.assertAlmostEqual(
            v("vllm:request_time_per_output_token_seconds_sum"),
            (30 * MS + 5) / 3 / 1e9, delta=1e-15)
        self.assertEqual(v("vllm:prompt_tokens_total"), 100)
        self.assertEqual(v("vllm:generation_tokens_total"), 4)
        self.assertEqual(v("vllm:request_prompt_tokens_sum"), 100)
        self.assertEqual(v("vllm:request_generation_tokens_sum"), 4)
        self.assertEqual(v("vllm:request_params_max_tokens_sum"), 64)
        self.assertEqual(v("vllm:request_params_n_count"), 1)
        self.assertEqual(d.value("vllm:time_to_first_token_seconds_bucket",
                                 le="0.01", **lab), 0)
        self.assertEqual(d.value("vllm:time_to_first_token_seconds_bucket",
                                 le="0.02", **lab), 1)
        self.assertEqual(d.value("tokenmeter_ingest_events_total",
                                 kind="tokens"), 3)
        s.close()

    def test_scope_joins_frontend_and_core(self):
        """ARRIVED from a frontend reaches the daemon after the core's first
        TOKENS; TTFT carries the core's labels."""
        t0 = time.monotonic_ns() - 1_000 * MS
        core = self.d.connect()
        core.sendall(hello(instance="core", scope="srv"))
        core.sendall(batch([[3, t0 + 2 * MS, "r1"], [4, t0 + 5 * MS, "r1", 1]]))
        self.d.wait_value("tokenmeter_ingest_events_total", 1, kind="tokens")
        front = self.d.connect()
        front.sendall(hello(instance="front", scope="srv"))
        front.sendall(batch([[1, t0, "r1", 10]]))
        core_lab = dict(model_name="m", engine="core")
        self.d.wait_value("vllm:time_to_first_token_seconds_count", 1,
                          **core_lab)
        self.assertEqual(
            self.d.value("vllm:time_to_first_token_seconds_sum", **core_lab),
            5 * MS / 1e9)
        self.assertEqual(self.d.value("vllm:prompt_tokens_total", **core_lab),
                         10)
        self.assertEqual(
            self.d.value("vllm:time_to_first_token_seconds_count",
                         model_name="m", engine="front"), 0)
        core.close()
        front.close()

    def read_acks(self, sock, want_seq, timeout=5.0):
        """Reads ACK frames until one carries want_seq; returns them all."""
        unpacker = msgpack.Unpacker()
        acks = []
        sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while not acks or acks[-1] != want_seq:
            if time.monotonic() > deadline:
                self.fail(f"no ACK {want_seq} (got {acks})")
            data = sock.recv(4096)
            self.assertNotEqual(data, b"", "closed while waiting for an ACK")
            unpacker.feed(data)
            for f in unpacker:
                self.assertEqual(len(f), 2, f)
                self.assertEqual(f[0], 3, f)
                acks.append(f[1])
        return acks

    def test_ack_session_skips_replayed_batches(self):
        """An ack session acks what it applied; after a reconnect the
        replayed batches at or below the highest applied seq are skipped
        and counted, the rest applied; the request in flight across the
        reconnect keeps its ARRIVED (the session's request-id space)."""
        t0 = time.monotonic_ns() - 1_000 * MS
        session = 0xfeedface12345678
        a = self.d.connect()
        a.sendall(hello(instance="e", session=session, ack=True))
        a.sendall(batch([[1, t0, "r1", 10]], seq=0))
        a.sendall(batch([[2, t0 + 1 * MS, "r1"]], seq=1))
        self.read_acks(a, 1)
        a.close()
        b = self.d.connect()
        b.sendall(hello(instance="e", session=session, ack=True))
        # seq 1 again (its ACK "was lost"), then new ones; a seq past a gap
        # (batches the client dropped) is applied too.
        b.sendall(batch([[2, t0 + 1 * MS, "r1"]], seq=1))
        b.sendall(batch([[3, t0 + 2 * MS, "r1"], [4, t0 + 5 * MS, "r1", 1]],
                        seq=2))
        b.sendall(batch([[5, t0 + 9 * MS, "r1", "stop"]], seq=200))
        acks = self.read_acks(b, 200)
        self.assertEqual(acks, sorted(acks))
        lab = dict(model_name="m", engine="e")
        self.d.wait_value("vllm:request_success_total", 1,
                          finished_reason="stop", **lab)
        self.assertEqual(self.d.value("tokenmeter_ingest_duplicate_batches_total"), 1)
        self.assertEqual(self.d.value("tokenmeter_ingest_events_total", kind="queued"), 1)
        # TTFT from the ARRIVED sent on the first connection.
        self.assertEqual(
            self.d.value("vllm:time_to_first_token_seconds_sum", **lab),
            5 * MS / 1e9)
        self.assertEqual(
            self.d.value("vllm:e2e_request_latency_seconds_count", **lab), 1)
        # The same seqs in another session are that session's own.
        c = self.d.connect()
        c.sendall(hello(instance="e", session=session + 1, ack=True))
        c.sendall(batch([[1, t0, "r2", 5]], seq=1))
        self.read_acks(c, 1)
        self.d.wait_value("tokenmeter_ingest_events_total", 2, kind="arrived")
        self.assertEqual(self.d.value("tokenmeter_ingest_duplicate_batches_total"), 1)
        for sock in (b, c):
            sock.close()

    def test_at_the_session_cap_one_that_said_goodbye_goes_first(self):
        """Sessions are capped (4 x --max-engine-series). A new one takes
        the place of one whose client said GOODBYE (it replays nothing
        more), not of one whose client went away without it and may come
        back to replay: that replay is still skipped as a duplicate."""
        d = Daemon("--log-interval", "0", "--max-engine-series", "1").start()
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        t0 = time.monotonic_ns() - 1_000 * MS

        def run(session, rid, goodbye):
            s = d.connect()
            s.sendall(hello(instance="e", session=session, ack=True))
            s.sendall(batch([[1, t0, rid, 5]], seq=0))
            self.read_acks(s, 0)
            if goodbye:
                s.sendall(tu.frame(2))
            s.close()

        run(1, "a", goodbye=False)  # gone without GOODBYE: may replay
        for k in (2, 3, 4):
            run(k, f"b{k}", goodbye=True)
        poll_until(lambda: d.value("tokenmeter_ingest_connections") == 0,
                   what="every connection closed")
        run(5, "c", goodbye=False)  # past the cap
        d.wait_value("tokenmeter_ingest_events_total", 5, kind="arrived")
        # Session 1's client comes back and replays seq 0.
        s = d.connect()
        s.sendall(hello(instance="e", session=1, ack=True))
        self.assertEqual(self.read_acks(s, 0), [0])  # the answer: seq 0
        s.sendall(batch([[1, t0, "a", 5]], seq=0))
        poll_until(lambda: d.value(
            "tokenmeter_ingest_duplicate_batches_total") == 1,
            what="the replay skipped as a duplicate")
        s.close()
        self.assertEqual(
            d.value("tokenmeter_ingest_events_total", kind="arrived"), 5)

    def test_ack_hello_is_answered_at_once(self):
        """Protocol 1.2, "ACK at HELLO": a HELLO with ack is answered before
        any BATCH, with [3, nil] while the session has applied nothing and
        with [3, highest applied seq] after; a client learns from it that
        this daemon acks (docs/protocol.md)."""
        t0 = time.monotonic_ns() - 1_000 * MS
        session = 0x5eed0000abcd
        a = self.d.connect()
        a.sendall(hello(instance="h", session=session, ack=True))
        self.assertEqual(self.read_acks(a, None, timeout=1.0), [None])
        a.sendall(batch([[1, t0, "h1", 10]], seq=0))
        a.sendall(batch([[2, t0 + 1 * MS, "h1"]], seq=7))
        self.read_acks(a, 7)
        a.close()
        b = self.d.connect()
        b.sendall(hello(instance="h", session=session, ack=True))
        self.assertEqual(self.read_acks(b, 7, timeout=1.0), [7])
        # Another session has applied nothing.
        c = self.d.connect()
        c.sendall(hello(instance="h", session=session + 1, ack=True))
        self.assertEqual(self.read_acks(c, None, timeout=1.0), [None])
        # A HELLO and a BATCH in one write (one read for the daemon): the
        # answer is what the session held at the HELLO, the batch is acked
        # after it.
        e = self.d.connect()
        e.sendall(hello(instance="h", session=session + 2, ack=True) +
                  batch([[1, t0, "h2", 10]], seq=5))
        self.assertEqual(self.read_acks(e, 5, timeout=2.0), [None, 5])
        for sock in (b, c, e):
            sock.close()

    def test_no_bytes_without_ack(self):
        """A session without `ack`, and a v1 HELLO, never get a byte; their
        seqs are not deduplicated (per connection, as in v1)."""
        t0 = time.monotonic_ns() - 1_000 * MS
        conns = [self.d.connect(), self.d.connect()]
        conns[0].sendall(hello(instance="x", session=7))
        conns[1].sendall(hello(instance="y"))
        for i, sock in enumerate(conns):
            sock.sendall(batch([[1, t0, f"q{i}", 3]], seq=5))
            sock.sendall(batch([[2, t0 + MS, f"q{i}"]], seq=5))
        self.d.wait_value("tokenmeter_ingest_events_total", 2, kind="queued")
        for sock in conns:
            sock.settimeout(0.3)
            with self.assertRaises(socket.timeout):
                sock.recv(1)
            sock.close()
        self.assertEqual(self.d.value("tokenmeter_ingest_duplicate_batches_total"), 0)

    def test_ack_needs_a_session_and_bools(self):
        for meta in ({"ack": True}, {"ack": 1, "session": 3},
                     {"session": -1}, {"session": "x"}):
            with self.subTest(meta=meta):
                before = self.d.value("tokenmeter_ingest_errors_total",
                                      reason="bad_hello") or 0
                sock = self.d.connect()
                sock.sendall(hello(**meta))
                self.assertTrue(wait_closed(sock))
                sock.close()
                self.d.wait_value("tokenmeter_ingest_errors_total", before + 1,
                                  reason="bad_hello")

    def test_bad_frame_closes_only_that_connection(self):
        good = self.d.connect()
        good.sendall(hello())
        bad = self.d.connect()
        bad.sendall(hello() + b"\xc1")
        self.assertTrue(wait_closed(bad))
        self.d.wait_value("tokenmeter_ingest_errors_total", 1,
                          reason="invalid_msgpack")
        log = self.d.read_log().decode()
        self.assertRegex(log, r"peer#\d+ pid=\d+ uid=\d+.*invalid_msgpack")
        t = time.monotonic_ns()
        good.sendall(batch([[4, t, 1, 1]]))
        self.d.wait_value("vllm:generation_tokens_total", 1, model_name="m",
                          engine="0")
        good.close()
        bad.close()

    def test_lying_length_rejected_without_waiting_for_bytes(self):
        s = self.d.connect()
        s.sendall(hello())
        # A BATCH whose event array declares 2^32-1 events: rejected at the
        # header, the bytes never come.
        s.sendall(b"\x94\x01\x00\x00\xdd\xff\xff\xff\xff")
        self.assertTrue(wait_closed(s))
        errors = {k: v for k, v in self.d.samples().items()
                  if k[0] == "tokenmeter_ingest_errors_total" and v}
        self.assertEqual(sum(errors.values()), 1, errors)
        s.close()

    def test_invalid_event_skipped_rest_applied(self):
        s = self.d.connect()
        s.sendall(hello())
        t = time.monotonic_ns()
        s.sendall(batch([[4, t, 1, 1], [5, t, 1, "bogus"], [99, t],
                         [4, t + 10 ** 12, 1, 1], [4, t, 2, 3]]))
        self.d.wait_value("vllm:generation_tokens_total", 4, model_name="m",
                          engine="0")
        self.assertEqual(self.d.value("tokenmeter_ingest_errors_total",
                                      reason="bad_reason"), 1)
        self.assertEqual(self.d.value("tokenmeter_ingest_errors_total",
                                      reason="unknown_kind"), 1)
        self.assertEqual(self.d.value("tokenmeter_ingest_errors_total",
                                      reason="bad_timestamp"), 1)
        s.close()

    def test_expert_load_series_and_bad_events(self):
        d = Daemon("--log-interval", "0", "--moe-expert-series").start()
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        s = d.connect()
        s.sendall(hello())
        t = time.monotonic_ns()
        s.sendall(batch([
            [8, t, 3, [6, 2, 0, 0]], [8, t, 3, [1, 1, 1, 1]],
            [8, t, 3, [1, 2]],            # another expert count: bad
            [8, t, 4096, [1]],            # layer too large: bad
            [8, t, 5, []],                # no experts: bad
            [8, t, 5, [0] * 1025],        # too many experts: bad
            [4, t, 1, 1]]))               # the rest of the batch applies
        d.wait_value("vllm:generation_tokens_total", 1, model_name="m",
                     engine="0")
        labels = {"model_name": "m", "engine": "0"}
        self.assertEqual(d.value("vllm:moe_routed_tokens_total", layer="3",
                                 **labels), 12)
        self.assertEqual(d.value("vllm:moe_expert_tokens_total", layer="3",
                                 expert="0", **labels), 7)
        self.assertEqual(d.value("vllm:moe_expert_tokens_total", layer="3",
                                 expert="3", **labels), 1)
        self.assertEqual(d.value("vllm:moe_layer_imbalance", layer="3",
                                 **labels), 1)
        self.assertEqual(d.value("vllm:moe_imbalance_count", **labels), 2)
        self.assertEqual(d.value("tokenmeter_ingest_events_total",
                                 kind="expert_load"), 2)
        self.assertEqual(d.value("tokenmeter_ingest_errors_total",
                                 reason="bad_event"), 4)
        s.close()

    def test_client_dropped_reported(self):
        s = self.d.connect()
        s.sendall(hello(instance="dp1", pid=4242))
        s.sendall(batch([], seq=0, dropped=17))
        self.d.wait_value("tokenmeter_client_dropped_events_total", 17,
                          engine_family="vllm", model_name="m", engine="dp1")
        s.close()


class Http(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon("--log-interval", "0").start()
        s = cls.d.connect()
        t = time.monotonic_ns() - 1000 * MS
        s.sendall(hello(engine="tokenmeter-engine"))
        s.sendall(batch([
            [1, t, 1, 5], [3, t + MS, 1], [4, t + 2 * MS, 1, 1],
            [4, t + 3 * MS, 1, 1], [6, t + 4 * MS, 1],
            [5, t + 5 * MS, 1, "length"],
            [7, t, {"running": 3, "waiting": 2, "kv_usage": 0.5,
                    "prompt_tokens": 7, "generation_tokens": 9,
                    "prefix_queries": 10, "prefix_hits": 4,
                    "spec_drafts": 2, "spec_draft_tokens": 6,
                    "spec_accepted_tokens": 4,
                    "spec_accepted_per_pos": [2, 1, 1]}],
        ]))
        cls.d.wait_value("tokenmeter_engine:request_success_total", 1,
                         model_name="m", engine="0", finished_reason="length")
        s.close()

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()
        cls.d.cleanup()

    def test_content_type_and_families(self):
        status, headers, body = self.d.get()
        self.assertEqual(status, 200)
        self.assertEqual(headers["Content-Type"],
                         "text/plain; version=0.0.4; charset=utf-8")
        text = body.decode()
        for name in ("tokenmeter_engine:num_requests_running",
                     "tokenmeter_engine:kv_cache_usage_perc",
                     "tokenmeter_engine:spec_decode_num_accepted_tokens_per_pos_total",
                     "tokenmeter_build_info", "process_resident_memory_bytes",
                     "tokenmeter_scrape_duration_seconds"):
            self.assertIn("\n" + name, text)
        self.assertEqual(self.d.value("tokenmeter_engine:num_requests_running",
                                      model_name="m", engine="0"), 3)
        self.assertEqual(
            self.d.value(
                "tokenmeter_engine:spec_decode_num_accepted_tokens_per_pos_total",
                model_name="m", engine="0", position="2"), 1)

    def test_promtool_check_metrics(self):
        promtool = "/usr/bin/promtool"
        if not os.path.exists(promtool):
            self.skipTest("promtool not installed")
        text = self.d.metrics_text()
        r = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                           capture_output=True)
        out = (r.stdout + r.stderr).decode()
        self.assertIn(r.returncode, (0, 3), out)
        for line in out.splitlines():
            if not line.strip():
                continue
            # The two findings the catalog keeps on purpose (metrics-v1.md).
            self.assertTrue(
                "should not contain ':'" in line
                or "iteration_tokens_total" in line,
                "unexpected promtool finding: " + line)

    def test_openmetrics_when_preferred(self):
        accept = ("application/openmetrics-text;version=1.0.0;q=0.5,"
                  "text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
        status, headers, body = self.d.get(headers={"Accept": accept})
        self.assertEqual(status, 200)
        self.assertTrue(headers["Content-Type"].startswith(
            "application/openmetrics-text; version=1.0.0"))
        text = body.decode()
        self.assertTrue(text.endswith("# EOF\n"))
        self.assertIn("# TYPE tokenmeter_engine:generation_tokens counter\n",
                      text)

    def test_gzip(self):
        status, headers, body = self.d.get(
            headers={"Accept-Encoding": "gzip"})
        self.assertEqual(headers.get("Content-Encoding"), "gzip")
        self.assertIn(b"tokenmeter_build_info", gzip.decompress(body))

    def test_protobuf_as_prometheus_asks_gzipped(self):
        """Prometheus 2.42 --enable-feature=native-histograms: the protobuf
        format, gzipped; the same families as the text format's with
        samples (names as in text 0.0.4), each one length-delimited
        MetricFamily whose field 1 is its name."""
        accept = ("application/vnd.google.protobuf;"
                  "proto=io.prometheus.client.MetricFamily;"
                  "encoding=delimited,application/openmetrics-text;"
                  "version=1.0.0;q=0.8,text/plain;version=0.0.4;q=0.5,"
                  "*/*;q=0.1")
        status, headers, body = self.d.get(
            headers={"Accept": accept, "Accept-Encoding": "gzip"})
        self.assertEqual(status, 200)
        self.assertEqual(headers["Content-Type"],
                         "application/vnd.google.protobuf; "
                         "proto=io.prometheus.client.MetricFamily; "
                         "encoding=delimited")
        self.assertEqual(headers.get("Content-Encoding"), "gzip")
        data = gzip.decompress(body)

        def varint(buf, i):
            v = shift = 0
            while True:
                b = buf[i]
                i += 1
                v |= (b & 0x7f) << shift
                shift += 7
                if b < 0x80:
                    return v, i
        names = []
        i = 0
        while i < len(data):
            size, i = varint(data, i)
            msg = data[i:i + size]
            i += size
            self.assertEqual(msg[0], 0x0a)  # field 1, length-delimited
            n, j = varint(msg, 1)
            names.append(msg[j:j + n].decode())
        self.assertEqual(i, len(data))
        text = self.d.metrics_text()
        with_samples = []
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                family = line.split()[2]
            elif line and not line.startswith("#"):
                if not with_samples or with_samples[-1] != family:
                    with_samples.append(family)
        self.assertEqual(names, with_samples)
        self.assertIn("tokenmeter_engine:time_to_first_token_seconds", names)
        self.assertIn("tokenmeter_engine:generation_tokens_total", names)

    def test_routes(self):
        self.assertEqual(self.d.get("/healthz")[0], 200)
        self.assertEqual(self.d.get("/healthz")[2], b"ok\n")
        self.assertEqual(self.d.get("/nope")[0], 404)
        status, headers, _ = self.d.get("/metrics", method="POST")
        self.assertEqual(status, 405)
        self.assertEqual(headers["Allow"], "GET, HEAD")
        status, headers, body = self.d.get("/metrics", method="HEAD")
        self.assertEqual((status, body), (200, b""))


class Lifecycle(unittest.TestCase):
    def test_sigterm_exits_zero_and_unlinks_socket(self):
        d = Daemon("--log-interval", "0").start()
        self.addCleanup(d.cleanup)
        self.assertTrue(os.path.exists(d.sock))
        s = d.connect()
        t = time.monotonic_ns()
        # Sent just before SIGTERM: read before the daemon exits.
        s.sendall(hello())
        s.sendall(batch([[4, t, 1, 1]]))
        self.assertEqual(d.stop(), 0)
        self.assertFalse(os.path.exists(d.sock))
        self.assertIn(b"hello engine=vllm", d.read_log())
        s.close()

    def run_daemon(self, *args):
        r = subprocess.run([tu.DAEMON, *args], capture_output=True,
                           timeout=20)
        return r.returncode, r.stderr.decode()

    def test_bad_flag(self):
        rc, err = self.run_daemon("--bogus")
        self.assertNotEqual(rc, 0)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertIn("--bogus", err)

    def test_live_socket_refused_stale_replaced(self):
        with Daemon("--log-interval", "0") as first:
            rc, err = self.run_daemon("--ingest", first.sock, "--listen",
                                      "127.0.0.1:0")
            self.assertNotEqual(rc, 0)
            self.assertIn("in use", err)
        # A stale socket file nobody listens on is replaced.
        d = Daemon("--log-interval", "0")
        self.addCleanup(d.cleanup)
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(d.sock)
        stale.close()
        d.start()
        d.connect().close()
        self.assertEqual(d.stop(), 0)

    def test_address_in_use(self):
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        d = Daemon()
        self.addCleanup(d.cleanup)
        rc, err = self.run_daemon("--ingest", d.sock, "--listen",
                                  f"127.0.0.1:{port}")
        taken.close()
        self.assertNotEqual(rc, 0)
        self.assertIn(str(port), err)

    def test_version_long_and_short(self):
        for flag in ("--version", "-V"):
            r = subprocess.run([tu.DAEMON, flag], capture_output=True,
                               timeout=20)
            self.assertEqual(r.returncode, 0, flag)
            self.assertRegex(r.stdout.decode(), r"^tokenmeterd \d+\.\d+\.\d+\n$")
            self.assertEqual(r.stderr, b"")

    def test_bad_listen_address_is_a_bad_flag(self):
        """Syntax errors in --listen (flag or config file) exit 2 with one
        line, before anything is bound or logged."""
        d = Daemon()
        self.addCleanup(d.cleanup)
        cases = {
            ":99999": 'bad port "99999" (want 0-65535)',
            "127.0.0.1": "expected HOST:PORT, :PORT or [IPV6]:PORT",
            "[::1": "expected [IPV6]:PORT",
            "::1:80": "an IPv6 address needs brackets",
            "localhost:": 'bad port "" (want 0-65535)',
            "localhost:8x": 'bad port "8x"',
        }
        for listen, why in cases.items():
            with self.subTest(listen=listen):
                rc, err = self.run_daemon("--ingest", d.sock, "--listen",
                                          listen)
                self.assertEqual(rc, 2, err)
                self.assertEqual(len(err.splitlines()), 1, err)
                self.assertTrue(err.startswith(
                    f'tokenmeterd: --listen "{listen}": {why}'), err)
                self.assertFalse(os.path.exists(d.sock))
        conf = os.path.join(d.dir, "bad.conf")
        with open(conf, "w") as f:
            f.write("listen = :99999\n")
        rc, err = self.run_daemon("--config", conf, "--ingest", d.sock)
        self.assertEqual(rc, 2, err)
        self.assertIn('bad port "99999"', err)

    def test_failed_start_has_no_stopped_line(self):
        """A start that fails says why, in one line on stderr
        (interfaces.md), and nothing about a run that never was: not the
        descriptor limit nor the OTLP exports it would have had."""
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        self.addCleanup(taken.close)
        d = Daemon()
        self.addCleanup(d.cleanup)
        for extra in ((), ("--otlp-endpoint", "http://127.0.0.1:9/v1/traces",
                           "--otlp-metrics-endpoint",
                           "http://127.0.0.1:9/v1/metrics")):
            with self.subTest(extra=extra):
                rc, err = self.run_daemon(
                    "--ingest", d.sock, "--listen",
                    f"127.0.0.1:{taken.getsockname()[1]}", *extra)
                self.assertEqual(rc, 1, err)
                self.assertEqual(len(err.splitlines()), 1, err)
                self.assertIn("address already in use", err)
                self.assertNotIn("stopped:", err)

    def test_missing_socket_directory_is_named(self):
        d = Daemon()
        self.addCleanup(d.cleanup)
        missing = os.path.join(d.dir, "run", "tokenmeter")
        rc, err = self.run_daemon("--ingest", os.path.join(missing, "i.sock"),
                                  "--listen", "127.0.0.1:0")
        self.assertEqual(rc, 1, err)
        self.assertIn(f'its directory "{missing}" does not exist', err)
        self.assertIn("--ingest", err)
        self.assertNotIn("ermission", err)

    def test_unwritable_socket_directory_says_permission(self):
        d = Daemon()
        self.addCleanup(d.cleanup)
        locked = os.path.join(d.dir, "locked")
        os.mkdir(locked, 0o555)
        cmd = [tu.DAEMON, "--ingest", os.path.join(locked, "i.sock"),
               "--listen", "127.0.0.1:0"]
        if os.geteuid() == 0:
            # root writes anywhere: run it as nobody.
            if not shutil.which("setpriv"):
                self.skipTest("running as root without setpriv")
            os.chmod(d.dir, 0o755)
            cmd = ["setpriv", "--reuid=65534", "--regid=65534",
                   "--clear-groups", *cmd]
        r = subprocess.run(cmd, capture_output=True, timeout=20)
        err = r.stderr.decode()
        self.assertEqual(r.returncode, 1, err)
        self.assertIn(f'permission denied: this user (uid ', err)
        self.assertIn(f'cannot create a file in "{locked}"', err)

    def test_ready_line_names_the_bound_port_and_the_socket(self):
        # Port 0 on the command line: the line has the port bound.
        with Daemon("--log-interval", "0") as d:
            self.assertRegex(d.ready_line,
                             r"^ready http=127\.0\.0\.1:[1-9][0-9]* ingest=")
            self.assertEqual(d.ready_line, f"ready http=127.0.0.1:{d.port} "
                             f"ingest={os.path.join(d.dir, 'i.sock')}")
            self.assertEqual(d.get("/healthz")[2], b"ok\n")
            d.connect().close()
        # Every interface: HOST empty, as --listen spells it.
        with Daemon("--log-interval", "0", listen=":0") as d:
            self.assertRegex(d.ready_line, r"^ready http=:[1-9][0-9]* ")
            self.assertEqual(d.get("/healthz")[0], 200)

    def test_ready_fd_from_the_config_file(self):
        d = Daemon()
        self.addCleanup(d.cleanup)
        conf = os.path.join(d.dir, "tokenmeterd.conf")
        with open(conf, "w") as f:
            f.write("ready-fd = 1\nlog-interval = 0\n")
        r = subprocess.Popen([tu.DAEMON, "--config", conf, "--ingest", d.sock,
                              "--listen", "127.0.0.1:0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = r.stdout.readline().decode()
        self.assertRegex(line, rf"^ready http=127\.0\.0\.1:\d+ "
                               rf"ingest={d.sock}\n$")
        self.assertEqual(r.stdout.read(), b"")  # the fd was closed
        r.terminate()
        self.assertEqual(r.wait(timeout=20), 0)
        r.stdout.close()
        r.stderr.close()

    def test_bad_ready_fd_is_a_one_line_start_up_error(self):
        d = Daemon()
        self.addCleanup(d.cleanup)
        for fd, why in (("77", "not an open file descriptor"),
                        ("0", "not open for writing")):
            with open(os.devnull, "rb") as null:
                r = subprocess.run(
                    [tu.DAEMON, "--ingest", d.sock, "--listen", "127.0.0.1:0",
                     "--ready-fd", fd], stdin=null, capture_output=True,
                    timeout=20)
            err = r.stderr.decode()
            self.assertEqual(r.returncode, 2, err)
            self.assertEqual(err, f"tokenmeterd: --ready-fd: {fd} is {why}\n")
            self.assertFalse(os.path.exists(d.sock))

    def test_ingest_path_too_long(self):
        # A bad flag (exit 2, the flag named), found before anything is
        # bound; so is an empty path.
        for path in ("/tmp/" + "x" * 200, ""):
            rc, err = self.run_daemon("--ingest", path,
                                      "--listen", "127.0.0.1:0")
            self.assertEqual(rc, 2, err)
            self.assertIn("tokenmeterd: --ingest: ", err)
            self.assertIn("is not a socket path of 1 to 107 bytes", err)


class ClientLibrary(unittest.TestCase):
    """libtokenmeter -> real daemon -> scrape: values equal what was sent."""

    def test_values_equal_what_was_sent(self):
        prog = os.environ.get("CLIENT_E2E")
        if not prog:
            self.skipTest("CLIENT_E2E not set")
        import json
        with Daemon("--log-interval", "0") as d:
            r = subprocess.run([prog, d.sock, "my-engine"], capture_output=True,
                               timeout=60, check=True)
            want = json.loads(r.stdout)
            self.assertEqual(want["dropped"], 0)
            lab = dict(model_name="e2e-model", engine="dp0", host_role="test")
            d.wait_value("my_engine:request_success_total", want["requests"],
                         finished_reason="stop", **lab)

            def v(name):
                return d.value("my_engine:" + name, **lab)
            self.assertEqual(v("time_to_first_token_seconds_count"),
                             want["requests"])
            self.assertEqual(v("time_to_first_token_seconds_sum"),
                             want["ttft_sum_ns"] / 1e9)
            self.assertEqual(v("inter_token_latency_seconds_count"),
                             want["itl_count"])
            self.assertEqual(v("inter_token_latency_seconds_sum"),
                             want["itl_sum_ns"] / 1e9)
            self.assertEqual(v("e2e_request_latency_seconds_sum"),
                             want["e2e_sum_ns"] / 1e9)
            self.assertEqual(v("request_queue_time_seconds_sum"),
                             want["queue_sum_ns"] / 1e9)
            self.assertEqual(v("prompt_tokens_total"), want["prompt_tokens"])
            self.assertEqual(v("generation_tokens_total"),
                             want["generation_tokens"])
            self.assertEqual(
                d.value("tokenmeter_ingest_events_total", kind="tokens")
                + d.value("tokenmeter_ingest_events_total", kind="arrived")
                + d.value("tokenmeter_ingest_events_total", kind="scheduled")
                + d.value("tokenmeter_ingest_events_total", kind="finished"),
                want["sent"])


class SummaryLine(unittest.TestCase):
    """The summary line of a running daemon in each profile's wording
    (docs/operations.md): one batch of traffic, then the line of the window
    that holds it (the one with the rejection) and the line of the window
    after, read from the log. Throughputs depend on the measured window, so
    only their ratio is checked; gauges and counts are exact."""

    @staticmethod
    def send(sock, requests):
        """In one batch: a STEP, the events `requests(t0)` and a
        rejection."""
        t0 = time.monotonic_ns() - 1_000 * MS
        sock.sendall(batch([
            [7, t0, {"running": 3, "waiting": 1, "kv_usage": 0.25,
                     "prefix_queries": 100, "prefix_hits": 40}],
            *requests(t0),
            [9, t0 + 4 * MS, "queue_full"],
        ]))

    # Two requests (100 + 50 prompt tokens, 30 of them cached; 10 + 5
    # output tokens; one stop, one abort).
    @classmethod
    def traffic(cls, sock):
        cls.send(sock, lambda t0: [
            [1, t0, 1, 100], [3, t0 + MS, 1, {"cached_tokens": 30}],
            [4, t0 + 2 * MS, 1, 10], [5, t0 + 3 * MS, 1, "stop"],
            [1, t0, 2, 50], [3, t0 + MS, 2],
            [4, t0 + 2 * MS, 2, 5], [5, t0 + 3 * MS, 2, "abort"]])

    # The same two requests from an engine that hands over only its own
    # figures (protocol 1.3): LATENCIES with the token counts, one
    # REQUEST_SUMMARY per request.
    @classmethod
    def computed_traffic(cls, sock):
        cls.send(sock, lambda t0: [
            [13, t0, [MS, MS], [],
             {"prompt_tokens": 150, "generation_tokens": 15}],
            [12, t0, "stop", {"prompt_tokens": 100, "generation_tokens": 10,
                              "cached_tokens": 30}],
            [12, t0, "abort", {"prompt_tokens": 50,
                               "generation_tokens": 5}]])

    def lines(self, profile, pattern, traffic=None):
        """The summary line of the window with the traffic and the next
        one, each the figures after the `engine=dp0 model=m: ` prefix
        matched in full against `pattern`; returns the two matches."""
        d = Daemon("--log-interval", "0.4", "--profile", profile).start()
        self.addCleanup(d.cleanup)
        s = d.connect()
        self.addCleanup(s.close)
        # An engine name with no profile of its own: --profile decides.
        s.sendall(hello(engine="myengine", instance="dp0"))
        (traffic or self.traffic)(s)
        prefix = "engine=dp0 model=m: "

        def busy_and_next():
            text = d.read_log().decode(errors="replace")
            lines = [ln[ln.index(prefix) + len(prefix):]
                     for ln in text.splitlines() if prefix in ln]
            busy = [i for i, ln in enumerate(lines) if "Rejected" in ln]
            return busy and lines[busy[0]:busy[0] + 2]
        poll_until(lambda: len(busy_and_next() or []) == 2, timeout=10,
                   what=profile + " summary lines")
        lines = busy_and_next()
        self.assertEqual(d.stop(), 0)
        tail = r", Rejected: \d+\.\d reqs/s \(queue_full 1\)"
        busy = re.fullmatch(pattern + tail, lines[0])
        after = re.fullmatch(pattern, lines[1])
        self.assertIsNotNone(busy, lines[0])
        self.assertIsNotNone(after, lines[1])
        return busy, after

    @staticmethod
    def ratio(m, num, den):
        return float(m.group(num)) / float(m.group(den))

    def test_vllm_wording(self):
        busy, after = self.lines("vllm", (
            r"Avg prompt throughput: (?P<p>\d+\.\d) tokens/s, "
            r"Avg generation throughput: (?P<g>\d+\.\d) tokens/s, "
            r"Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: 25\.0%, "
            r"Prefix cache hit rate: (?P<hit>\d+\.\d)%"))
        self.assertEqual(busy.group("hit"), "40.0")
        self.assertAlmostEqual(self.ratio(busy, "p", "g"), 10, delta=0.5)
        # The next window: no tokens, no prefix lookups.
        self.assertEqual((after.group("p"), after.group("hit")),
                         ("0.0", "0.0"))

    def test_sglang_wording(self):
        busy, after = self.lines("sglang", (
            r"#running-req: 3, token usage: 0\.25, "
            r"gen throughput \(token/s\): (?P<g>\d+\.\d\d), "
            r"#queue-req: 1, #new-token: (?P<new>\d+), "
            r"#cached-token: (?P<cached>\d+), "
            r"input throughput \(token/s\): (?P<i>\d+\.\d\d)"))
        self.assertEqual((busy.group("new"), busy.group("cached")),
                         ("120", "30"))
        self.assertAlmostEqual(self.ratio(busy, "i", "g"), 8, delta=0.1)
        self.assertEqual((after.group("new"), after.group("cached"),
                          after.group("g")), ("0", "0", "0.00"))

    def test_lmdeploy_wording(self):
        # LMDeploy's request counts and hit rate are totals: the next
        # window shows them again, its throughputs 0.
        busy, after = self.lines("lmdeploy", (
            r"Avg thr \(in/out\): (?P<p>\d+\.\d) / (?P<g>\d+\.\d) "
            r"tokens/s, Server \(succeeded/failed\): 1 / 1, "
            r"Engine \(running/waiting\): 3 / 1, KV cache: 25\.0%, "
            r"Prefix cache hit rate: 40\.0%"))
        self.assertAlmostEqual(self.ratio(busy, "p", "g"), 10, delta=0.5)
        self.assertEqual((after.group("p"), after.group("g")), ("0.0", "0.0"))

    def test_engines_that_send_their_own_figures(self):
        """Protocol 1.3: the counts of LATENCIES and REQUEST_SUMMARY feed
        the same figures (SGLang counts prompt tokens at the finish: a
        summary's cached tokens are #cached-token, the rest #new-token)."""
        busy, _ = self.lines("lmdeploy", (
            r"Avg thr \(in/out\): (?P<p>\d+\.\d) / (?P<g>\d+\.\d) "
            r"tokens/s, Server \(succeeded/failed\): 1 / 1, "
            r"Engine \(running/waiting\): 3 / 1, KV cache: 25\.0%, "
            r"Prefix cache hit rate: 40\.0%"), self.computed_traffic)
        self.assertAlmostEqual(self.ratio(busy, "p", "g"), 10, delta=0.5)
        busy, _ = self.lines("sglang", (
            r"#running-req: 3, token usage: 0\.25, "
            r"gen throughput \(token/s\): (?P<g>\d+\.\d\d), "
            r"#queue-req: 1, #new-token: (?P<new>\d+), "
            r"#cached-token: (?P<cached>\d+), "
            r"input throughput \(token/s\): (?P<i>\d+\.\d\d)"),
            self.computed_traffic)
        self.assertEqual((busy.group("new"), busy.group("cached")),
                         ("120", "30"))
        self.assertAlmostEqual(self.ratio(busy, "i", "g"), 8, delta=0.1)


class VllmDashboard(unittest.TestCase):
    def test_every_metric_the_vllm_dashboard_queries_exists(self):
        exprs = tu.need_path(
            os.path.join(tu.peers_dir(), "vllm", "grafana-exprs.txt"),
            "vLLM's dashboard expressions")
        import re
        names = set()
        with open(exprs) as f:
            for line in f:
                names.update(re.findall(r"vllm:[a-zA-Z0-9_]+", line))
        with Daemon("--log-interval", "0") as d:
            s = d.connect()
            s.sendall(hello())
            s.close()
            poll_until(lambda: "vllm:" in d.metrics_text())
            text = d.metrics_text()
        self.assertGreater(len(names), 10)
        for name in sorted(names):
            self.assertTrue(re.search(r"\n" + name + r"[{ ]", text),
                            name + " is not exposed")


if __name__ == "__main__":
    tu.DAEMON = os.path.abspath(sys.argv.pop(1))
    tu.main()
