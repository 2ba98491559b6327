#!/usr/bin/python3
"""Hostile input against the real daemon, table-driven.

Every ingest case names the bytes a peer sends and the expected reaction:
"close" (a frame-level error: the connection is closed), "skip" (an
event-level error: that event is skipped, the connection stays usable) or
"accept". For each case the test checks the reaction, that
tokenmeter_ingest_errors_total{reason} moved by exactly the expected
amount, that a log line names the peer (peer#N pid=... uid=... gid=...)
and the reason, and that a second, well-behaved connection that stays open
across every case still gets its events applied. The resource cases
(request-id floods, label cardinality, connection storms, slow and huge
HTTP requests) also check the daemon's resident memory stays bounded.

Usage: hostile_test.py TOKENMETERD [unittest args]
"""
import os
import re
import socket
import struct
import sys
import time
import unittest
import warnings

import msgpack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402
from tokenmeter_testutil import (  # noqa: E402
    Daemon, batch, frame, hello, poll_until, wait_closed)

PID = os.getpid()
SEC = 1_000_000_000
PEER = rf"peer#\d+ pid={PID} uid=\d+ gid=\d+"


def now():
    return time.monotonic_ns()


def is_closed(sock):
    try:
        return wait_closed(sock, timeout=0.2)
    except TimeoutError:
        return False


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def raw_map(pairs):
    """A msgpack map from (key bytes, value bytes) pairs, repeats allowed."""
    assert len(pairs) < 16
    return bytes([0x80 | len(pairs)]) + b"".join(k + v for k, v in pairs)


def hello_raw(meta_pairs):
    return b"\x92\x00" + raw_map(meta_pairs)


def nested(depth):
    return b"\x91" * depth + b"\x00"


BASE = {"proto": 1, "engine": "vllm", "model": "m"}


def meta(**changes):
    m = dict(BASE)
    for k, v in changes.items():
        if v is DROP:
            m.pop(k)
        else:
            m[k] = v
    return m


DROP = object()


# (name, bytes after connect (a callable of t for fresh timestamps),
#  reaction, reason or None, expected log regex or None)
def frame_cases():
    cases = [
        ("garbage byte 0xc1", lambda t: b"\xc1", "invalid_msgpack"),
        ("http request on the ingest socket",
         lambda t: b"GET /metrics HTTP/1.1\r\n\r\n", "bad_frame"),
        ("random bytes", lambda t: bytes(range(0x80, 0x100)) * 4,
         None),  # any frame-level reason
        ("top level not an array", lambda t: pack(5), "bad_frame"),
        ("top level a map", lambda t: pack({"a": 1}), "bad_frame"),
        ("empty array", lambda t: b"\x90", "bad_frame"),
        ("unknown frame type", lambda t: frame(9, {}), "bad_frame"),
        ("frame type a string", lambda t: frame("hello", BASE), "bad_frame"),
        ("negative frame type", lambda t: frame(-1, BASE), "bad_frame"),
        ("BATCH before HELLO", lambda t: batch([[4, t, 1, 1]]),
         "batch_before_hello"),
        ("GOODBYE before HELLO", lambda t: b"\x91\x02", "batch_before_hello"),
        ("two HELLOs", lambda t: hello() + hello(), "second_hello"),
        ("frame after GOODBYE", lambda t: hello() + b"\x91\x02" + batch([]),
         "bad_frame"),
        ("HELLO meta not a map", lambda t: frame(0, [1, 2]), "bad_hello"),
        ("HELLO without meta", lambda t: frame(0), "bad_hello"),
        ("HELLO meta with an int key",
         lambda t: hello_raw([(pack(1), pack(1))]), "bad_hello"),
        ("HELLO 2-byte model, invalid utf-8",
         lambda t: hello_raw([(pack("proto"), pack(1)),
                              (pack("engine"), pack("vllm")),
                              (pack("model"), b"\xa2\xc3\x28")]),
         "bad_hello"),
        ("engine name with a space", lambda t: frame(0, meta(engine="a b")),
         "bad_name"),
        ("engine name starting with a digit",
         lambda t: frame(0, meta(engine="9x")), "bad_name"),
        ("engine name with a quote",
         lambda t: frame(0, meta(engine='x"y')), "bad_name"),
        ("label name with a dash",
         lambda t: frame(0, meta(labels={"a-b": "v"})), "bad_name"),
        ("label name injection",
         lambda t: frame(0, meta(labels={'a="x",b': "v"})), "bad_name"),
        ("label name with a newline",
         lambda t: frame(0, meta(labels={"a\nb": "v"})), "bad_name"),
        ("label repeated",
         lambda t: hello_raw([(pack("proto"), pack(1)),
                              (pack("engine"), pack("vllm")),
                              (pack("model"), pack("m")),
                              (pack("labels"),
                               raw_map([(pack("a"), pack("1")),
                                        (pack("a"), pack("2"))]))]),
         "bad_name"),
        ("too many labels",
         lambda t: frame(0, meta(labels={f"l{i}": "v" for i in range(9)})),
         "too_many_labels"),
        ("string over 256 bytes", lambda t: frame(0, meta(model="m" * 300)),
         "string_too_long"),
        ("str32 header claiming 2 GiB",
         lambda t: b"\x92\x00\x81\xa5model\xdb\x80\x00\x00\x00",
         "string_too_long"),
        ("map32 header claiming 4 G entries",
         lambda t: b"\x92\x00\xdf\xff\xff\xff\xff", "frame_too_large"),
        ("events array claiming 4 G entries",
         lambda t: hello() + b"\x94\x01\x00\x00\xdd\xff\xff\xff\xff",
         None),
        ("events array over the batch limit",
         lambda t: hello() + b"\x94\x01\x00\x00\xdd\x00\x01\x00\x01",
         "batch_too_large"),
        ("frame over 1 MiB",
         lambda t: hello() + batch([[4, t, "x" * 120, 1]] * 9000),
         "frame_too_large"),
        ("nesting 40 deep in HELLO",
         lambda t: hello_raw([(pack("proto"), pack(1)),
                              (pack("engine"), pack("vllm")),
                              (pack("model"), pack("m")),
                              (pack("x"), nested(40))]), "too_deep"),
        ("nesting 40 deep in an event",
         lambda t: hello() + b"\x94\x01\x00\x00\x91" + nested(40),
         "too_deep"),
        ("BATCH seq a string", lambda t: hello() + frame(1, "x", 0, []),
         "bad_frame"),
        ("BATCH dropped_total negative",
         lambda t: hello() + frame(1, 0, -5, []), "bad_frame"),
        ("BATCH events not an array",
         lambda t: hello() + frame(1, 0, 0, {"a": 1}), "bad_frame"),
        ("BATCH too short", lambda t: hello() + frame(1, 0), "bad_frame"),
    ]
    for name in ("model_name", "engine", "engine_family", "finished_reason",
                 "position", "le", "quantile", "interval", "reason", "kind",
                 "__meta"):
        cases.append((f"reserved label {name}",
                      lambda t, n=name: frame(0, meta(labels={n: "v"})),
                      "reserved_label"))
    # A refused HELLO counts once, under its reason: the informing field it
    # would have dropped (pid) is not counted as bad_field as well.
    cases.append(("HELLO label clashing with cache_config, pid a str",
                  lambda t: frame(0, meta(labels={"block_size": "v"},
                                          cache_config={"block_size": 16},
                                          pid="x")),
                  "reserved_label"))
    # Wrong types at every HELLO position.
    wrong = {"proto": [2, 0, "1", None, 1.0, [1], -1],
             "engine": [5, None, "", [b"x"], {"a": 1}],
             "model": [5, None, "", ["m"]],
             "instance": [5, None, ["x"]],
             "scope": [5, ["x"]],
             "labels": [5, "a=b", ["a"], {"a": 1}, {"a": None}]}
    for key, values in wrong.items():
        for v in values:
            expect = "bad_hello"
            if key == "engine" and v == "":
                expect = None  # bad_hello or bad_name
            cases.append((f"HELLO {key}={v!r}",
                          lambda t, k=key, v=v: frame(0, meta(**{k: v})),
                          expect))
    for key in ("proto", "engine", "model"):
        cases.append((f"HELLO without {key}",
                      lambda t, k=key: frame(0, meta(**{k: DROP})),
                      "bad_hello"))
    return cases


def event_cases():
    """(name, events (callable of t), reason) for events that are skipped,
    or (reason bad_field) applied without the field."""
    rid_wrong = [-1, 1.5, None, [1], {"a": 1}, "", "r" * 129, True]
    t_wrong = ["1", -1, 1.5, None, [1], True]
    layouts = {  # kind: a valid event as a function of (t)
        1: lambda t: [1, t, 1, 10],
        2: lambda t: [2, t, 1],
        3: lambda t: [3, t, 1],
        4: lambda t: [4, t, 1, 1],
        5: lambda t: [5, t, 1, "stop"],
        6: lambda t: [6, t, 1],
        7: lambda t: [7, t, {"running": 1}],
    }
    cases = [
        ("event not an array", lambda t: [5], "bad_event"),
        ("event an empty array", lambda t: [[]], "bad_event"),
        ("event a map", lambda t: [{"a": 1}], "bad_event"),
        ("kind a string", lambda t: [["tokens", t, 1, 1]], "bad_event"),
        ("kind negative", lambda t: [[-4, t, 1, 1]], "bad_event"),
        ("unknown kind 99", lambda t: [[99, t]], "unknown_kind"),
        ("unknown kind 200 with payload",
         lambda t: [[200, t, 1, 2, {"x": [1, 2]}]], "unknown_kind"),
        ("unknown kind 0", lambda t: [[0, t, 1]], "unknown_kind"),
        ("TOKENS n of 0", lambda t: [[4, t, 1, 0]], "bad_event"),
        ("FINISHED bogus reason", lambda t: [[5, t, 1, "bogus"]],
         "bad_reason"),
        ("FINISHED reason with a quote",
         lambda t: [[5, t, 1, 'stop"} 1']], "bad_reason"),
        # Optional fields (protocol 1.2, partial acceptance): the field is
        # dropped and counted, the event applied.
        ("ARRIVED params not a map", lambda t: [[1, t, 1, 10, [1]]],
         "bad_field"),
        ("ARRIVED max_tokens a string",
         lambda t: [[1, t, 1, 10, {"max_tokens": "x"}]], "bad_field"),
        ("ARRIVED max_tokens 2^64-1",
         lambda t: [[1, t, 1, 10, {"max_tokens": 2 ** 64 - 1}]], "bad_field"),
        ("ARRIVED lora of 200 bytes",
         lambda t: [[1, t, 1, 10, {"lora": "l" * 200}]], "bad_field"),
        ("ARRIVED labels not a map",
         lambda t: [[1, t, 1, 10, {"labels": ["a"]}]], "bad_field"),
        ("STEP kv_usage a string", lambda t: [[7, t, {"kv_usage": "x"}]],
         "bad_field"),
        ("STEP kv_usage 2", lambda t: [[7, t, {"kv_usage": 2.0}]],
         "bad_field"),
        ("STEP running negative", lambda t: [[7, t, {"running": -1}]],
         "bad_field"),
        ("STEP 65 accepted positions",
         lambda t: [[7, t, {"spec_accepted_per_pos": [1] * 65}]],
         "bad_field"),
        ("timestamp 10 s in the future", lambda t: [[4, t + 10 * SEC, 1, 1]],
         "bad_timestamp"),
        ("timestamp at 2^64-1", lambda t: [[4, 2 ** 64 - 1, 1, 1]],
         "bad_timestamp"),
        # A skipped event counts once: the field it would have lost is not
        # counted as well.
        ("ARRIVED max_tokens str, 10 s in the future",
         lambda t: [[1, t + 10 * SEC, 3, 10, {"max_tokens": "x"}]],
         "bad_timestamp"),
        ("STEP running -1, 10 s in the future",
         lambda t: [[7, t + 10 * SEC, {"running": -1, "waiting": 2}]],
         "bad_timestamp"),
    ]
    if now() > 2 * 3600 * SEC:
        cases.append(("timestamp 2 h in the past",
                      lambda t: [[4, t - 2 * 3600 * SEC, 1, 1]],
                      "bad_timestamp"))
    for kind, make in layouts.items():
        valid = make(0)
        cases.append((f"kind {kind} too short",
                      lambda t, m=make: [m(t)[:-1]], "bad_event"))
        for v in t_wrong:
            cases.append((f"kind {kind} t={v!r}",
                          lambda t, m=make, v=v: [[m(t)[0], v, *m(t)[2:]]],
                          "bad_event"))
        if kind == 7:
            for v in (5, "x", None, [1]):
                cases.append((f"STEP stats={v!r}",
                              lambda t, v=v: [[7, t, v]], "bad_event"))
            continue
        for v in rid_wrong:
            cases.append((f"kind {kind} rid={v!r}",
                          lambda t, m=make, v=v: [[*m(t)[:2], v,
                                                   *m(t)[3:]]],
                          "bad_event"))
        if len(valid) > 3:
            for v in ([1], None, -1, 1.5, {"a": 1}) + \
                    ((5,) if kind == 5 else ("x",)):
                cases.append((f"kind {kind} last={v!r}",
                              lambda t, m=make, v=v: [[*m(t)[:3], v]],
                              "bad_event"))
    return cases


class Base(unittest.TestCase):
    args = ()

    @classmethod
    def setUpClass(cls):
        cls.d = Daemon("--log-interval", "0", *cls.args).start()
        cls.pid = cls.d.proc.pid
        # The well-behaved connection that stays open across every case.
        cls.good = cls.d.connect()
        cls.good.sendall(hello(model="good"))
        cls.good_tokens = 0

    @classmethod
    def tearDownClass(cls):
        cls.good.close()
        rc = cls.d.stop()
        cls.d.cleanup()
        assert rc == 0, f"daemon exited {rc}"

    def errors(self):
        return {dict(k[1])["reason"]: v for k, v in self.d.samples().items()
                if k[0] == "tokenmeter_ingest_errors_total"}

    def assert_good_connection_works(self):
        cls = type(self)
        cls.good_tokens += 1
        cls.good.sendall(batch([[4, now(), 1, 1]]))
        self.d.wait_value("vllm:generation_tokens_total", cls.good_tokens,
                          model_name="good", engine="0")

    def log_count(self, pattern):
        return len(re.findall(pattern.encode(), self.d.read_log()))


class IngestFrames(Base):
    def test_frame_level_errors_close_only_that_connection(self):
        rss0 = rss_kib(self.pid)
        for name, make, reason in frame_cases():
            with self.subTest(name):
                before = self.errors()
                closes = self.log_count(
                    PEER + r": closing the connection: ")
                s = self.d.connect()
                try:
                    s.sendall(make(now()))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # closed while we were still writing
                self.assertTrue(wait_closed(s), "connection not closed")
                s.close()
                poll_until(lambda: self.log_count(
                    PEER + r": closing the connection: ") == closes + 1,
                    what="one log line naming the peer")
                after = self.errors()
                moved = {r: after[r] - before.get(r, 0) for r in after
                         if after[r] != before.get(r, 0)}
                self.assertEqual(sum(moved.values()), 1, moved)
                if reason is not None:
                    self.assertEqual(moved, {reason: 1})
                    self.assertGreater(self.log_count(
                        PEER + r": closing the connection: " + reason), 0)
                self.assert_good_connection_works()
        self.assertLess(rss_kib(self.pid) - rss0, 64 * 1024)

    def test_truncated_frames_are_discarded_and_logged(self):
        whole = hello() + batch([[4, now(), 1, 1]])
        for cut in (1, 2, 5, len(hello()) - 1, len(hello()) + 3,
                    len(whole) - 1):
            with self.subTest(cut=cut):
                before = self.errors()
                lines = self.log_count(PEER + r": closed in the middle")
                s = self.d.connect()
                s.sendall(whole[:cut])
                s.close()
                poll_until(lambda: self.log_count(
                    PEER + r": closed in the middle") == lines + 1,
                    what="the truncation logged")
                self.assertEqual(self.errors(), before)
                self.assert_good_connection_works()
        # No partial TOKENS was applied to any series but "good".
        self.assertIn(self.d.value("vllm:generation_tokens_total",
                                   model_name="m", engine="0"), (None, 0))

    def test_label_injection_is_escaped_not_interpreted(self):
        evil = 'a"} 1\nvllm:evil{x="1'
        s = self.d.connect()
        s.sendall(frame(0, meta(model='m"\\\n', labels={"team": evil})))
        s.sendall(batch([[4, now(), 1, 5]]))
        self.d.wait_value("vllm:generation_tokens_total", 5,
                          model_name='m"\\\n', engine="0", team=evil)
        text = self.d.metrics_text()
        self.assertNotIn("\nvllm:evil", text)
        self.assertIn(r'team="a\"} 1\nvllm:evil{x=\"1"', text)
        s.close()
        self.assert_good_connection_works()


class IngestEvents(Base):
    def test_invalid_events_are_skipped_and_the_rest_applied(self):
        s = self.d.connect()
        s.sendall(hello(model="ev"))
        applied = 0
        logged = False
        for name, make, reason in event_cases():
            with self.subTest(name):
                before = self.errors()
                t = now()
                applied += 2
                s.sendall(batch([[4, t, 1, 1], *make(t), [4, t, 2, 1]]))
                self.d.wait_value("vllm:generation_tokens_total", applied,
                                  model_name="ev", engine="0")
                after = self.errors()
                moved = {r: after[r] - before.get(r, 0) for r in after
                         if after[r] != before.get(r, 0)}
                self.assertEqual(moved, {reason: 1})
                if not logged:
                    logged = True
                    self.assertGreater(self.log_count(
                        PEER + r": skipped an invalid event \(" + reason), 0)
        # One line per connection, not per event.
        self.assertEqual(self.log_count(PEER + r": skipped an invalid event"),
                         1)
        s.close()
        self.assert_good_connection_works()


class PartialAcceptance(Base):
    """Protocol 1.2: an optional field out of range loses only itself."""

    def test_max_tokens_2_64_still_starts_the_request(self):
        s = self.d.connect()
        s.sendall(hello(model="partial"))
        t = now()
        ms = 1_000_000
        before = self.errors().get("bad_field", 0)
        s.sendall(batch([[1, t, 7, 10, {"max_tokens": 2 ** 64 - 1, "n": 1}],
                         [2, t + 1 * ms, 7],
                         [3, t + 3 * ms, 7],
                         [4, t + 6 * ms, 7, 1],
                         [4, t + 8 * ms, 7, 1],
                         [5, t + 8 * ms, 7, "stop"]]))
        labels = {"model_name": "partial", "engine": "0"}
        self.d.wait_value("vllm:e2e_request_latency_seconds_count", 1,
                          **labels)
        self.assertEqual(self.d.value("vllm:time_to_first_token_seconds_count",
                                      **labels), 1)
        self.assertAlmostEqual(self.d.value(
            "vllm:time_to_first_token_seconds_sum", **labels), 0.006)
        self.assertAlmostEqual(self.d.value(
            "vllm:e2e_request_latency_seconds_sum", **labels), 0.008)
        self.assertAlmostEqual(self.d.value(
            "vllm:request_queue_time_seconds_sum", **labels), 0.002)
        # The field itself is left out: n kept, max_tokens not observed.
        self.assertEqual(self.d.value("vllm:request_params_n_count",
                                      **labels), 1)
        self.assertIn(self.d.value("vllm:request_params_max_tokens_count",
                                   **labels), (None, 0))
        self.assertEqual(self.errors().get("bad_field", 0) - before, 1)
        self.assertEqual(self.errors().get("bad_event", 0), 0)
        s.close()

    def test_informing_hello_keys_are_dropped_not_the_connection(self):
        before = self.errors().get("bad_field", 0)
        lines = self.log_count(PEER + r": dropped an optional field")
        s = self.d.connect()
        s.sendall(hello(model="informs", pid="x", max_lora=-1,
                        cache_config=[1]))
        s.sendall(batch([[4, now(), 1, 3]]))
        self.d.wait_value("vllm:generation_tokens_total", 3,
                          model_name="informs", engine="0")
        self.assertEqual(self.errors().get("bad_field", 0) - before, 3)
        # One line per connection, naming the peer.
        self.assertEqual(
            self.log_count(PEER + r": dropped an optional field"), lines + 1)
        s.close()
        self.assert_good_connection_works()


class LogForgery(unittest.TestCase):
    """No peer string can end a log line or start one of its own: every
    string a peer sends (HELLO model, instance, scope, label values,
    request ids, finish reasons) carries a newline, a carriage return, a
    journald priority prefix, an escape sequence and a C1 control; the
    daemon's log keeps one line per message, each with the daemon's own
    prefix, plain and under journald (JOURNAL_STREAM)."""

    EVIL = "x\n<0>FORGED\r\n<1>FORGED\x1b[2J\u0085<0>FORGED\u2028\x00"
    PLAIN = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} "
                       rb"(debug|info|warning|error|critical) ")
    JOURNAL = re.compile(rb"^<[2-7]>(?!<)")

    def feed(self, d):
        s = d.connect()
        s.sendall(frame(0, meta(model="m" + self.EVIL,
                                instance="i" + self.EVIL,
                                scope="s" + self.EVIL,
                                labels={"team": self.EVIL})))
        t = now()
        s.sendall(batch([[1, t, "r" + self.EVIL, 3,
                          {"labels": {"team": self.EVIL},
                           "lora": "l" + self.EVIL}],
                         [4, t, "r" + self.EVIL, 2],
                         [5, t, "r" + self.EVIL, "stop" + self.EVIL],
                         [5, t, "r" + self.EVIL, "stop"],
                         [7, t, {"running": "1" + self.EVIL}]]))
        d.wait_value("vllm:generation_tokens_total", 2,
                     model_name="m" + self.EVIL, engine="i" + self.EVIL,
                     team=self.EVIL)
        # The summary line names the series.
        poll_until(lambda: b"Avg prompt throughput" in d.read_log(),
                   what="a summary line")
        s.close()

    def check_lines(self, log, prefix):
        lines = log.split(b"\n")
        self.assertEqual(lines[-1], b"")
        for line in lines[:-1]:
            self.assertRegex(line, prefix)
            self.assertNotRegex(line, rb"[\x00-\x1f\x7f]")
        forged = [l for l in lines if b"FORGED" in l]
        # The hello and the summary line, escaped.
        self.assertGreaterEqual(len(forged), 2, log)
        for line in forged:
            self.assertIn(rb"x\n<0>FORGED\r\n<1>FORGED\x1b[2J\u0085<0>FORGED"
                          rb"\u2028\x00", line)

    def run_daemon(self, journal):
        d = Daemon("--log-interval", "1")
        try:
            if journal:
                st = os.stat(d.log_path)
                d.env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
            d.start()
            self.feed(d)
            self.assertEqual(d.stop(), 0)
            return d.read_log()
        finally:
            d.cleanup()

    def test_plain_lines_keep_the_daemons_prefix(self):
        self.check_lines(self.run_daemon(journal=False), self.PLAIN)

    def test_journald_lines_keep_the_daemons_priority(self):
        self.check_lines(self.run_daemon(journal=True), self.JOURNAL)


class RequestFlood(Base):
    args = ("--max-requests", "1000")

    def test_requests_that_never_finish_are_capped_and_evicted(self):
        rss0 = rss_kib(self.pid)
        s = self.d.connect()
        s.sendall(hello(model="flood"))
        n = 20_000
        for start in range(0, n, 2000):
            t = now()
            s.sendall(batch([[1, t, f"req-{i}", 10]
                             for i in range(start, start + 2000)]))
        self.d.wait_value("tokenmeter_ingest_events_total", n, kind="arrived")
        self.assertEqual(self.d.value("tokenmeter_tracked_requests"), 1000)
        self.assertEqual(self.d.value("tokenmeter_evicted_requests_total"),
                         n - 1000)
        s.close()
        self.assert_good_connection_works()
        self.assertLess(rss_kib(self.pid) - rss0, 64 * 1024)


class IdleEviction(Base):
    args = ("--request-idle-timeout", "1")

    def test_idle_requests_are_evicted(self):
        s = self.d.connect()
        s.sendall(hello(model="idle"))
        s.sendall(batch([[1, now(), i, 10] for i in range(500)]))
        self.d.wait_value("tokenmeter_ingest_events_total", 500,
                          kind="arrived")
        self.d.wait_value("tokenmeter_evicted_requests_total", 500)
        self.assertEqual(self.d.value("tokenmeter_tracked_requests"), 0)
        s.close()
        self.assert_good_connection_works()


class LabelCardinality(Base):
    args = ("--max-engine-series", "20")

    def test_series_beyond_the_cap_are_refused_and_counted(self):
        rss0 = rss_kib(self.pid)
        # "good" holds one series; 19 more fit.
        socks = []
        for i in range(200):
            s = self.d.connect()
            socks.append(s)
            try:
                s.sendall(hello(labels={"user": f"u{i}"}))
                s.sendall(batch([[4, now(), 1, 1]]))
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused already
        self.d.wait_value("tokenmeter_ingest_errors_total", 181,
                          reason="series_limit")
        closed = sum(1 for s in socks if is_closed(s))
        self.assertEqual(closed, 181)
        self.assertEqual(self.log_count(
            PEER + r": closing the connection: series_limit"), 181)
        text = self.d.metrics_text()
        self.assertEqual(len(set(re.findall(r'user="(u\d+)"', text))), 19)
        for s in socks:
            s.close()
        self.assert_good_connection_works()
        self.assertLess(rss_kib(self.pid) - rss0, 64 * 1024)


class RequestLabelCardinality(Base):
    args = ("--request-label", "tenant", "--request-label-values", "50",
            "--max-requests", "1000")

    def assert_good_connection_works(self):
        cls = type(self)
        cls.good_tokens += 1
        cls.good.sendall(batch([[4, now(), 1, 1]]))
        self.d.wait_value("vllm:generation_tokens_total", cls.good_tokens,
                          model_name="good", engine="0", tenant="")

    def test_distinct_values_beyond_the_cap_are_other(self):
        rss0 = rss_kib(self.pid)
        s = self.d.connect()
        s.sendall(hello(model="tenants"))
        n = 70_000  # more values than the daemon could ever intern
        for start in range(0, n, 2000):
            t = now()
            events = []
            for i in range(start, start + 2000):
                events.append([1, t, i, 10, {"labels": {"tenant": f"t{i}"}}])
                events.append([5, t, i, "stop"])
            s.sendall(batch(events))
        self.d.wait_value("tokenmeter_ingest_events_total", n,
                          kind="finished")
        self.assertEqual(self.d.value(
            "tokenmeter_request_label_overflow_total", label="tenant"),
            n - 50)
        text = self.d.metrics_text()
        values = set(re.findall(
            r'vllm:request_success_total\{model_name="tenants",engine="0",'
            r'tenant="([^"]*)"', text))
        # 50 values and __other__ (every request had one: no "" copy).
        self.assertEqual(len(values), 51)
        self.assertIn("__other__", values)
        self.assertNotIn("", values)
        self.assertEqual(self.d.value(
            "vllm:request_success_total", model_name="tenants", engine="0",
            tenant="__other__", finished_reason="stop"), n - 50)
        s.close()
        # Another series still has places of its own.
        self.good.sendall(batch([[1, now(), 99, 10,
                                  {"labels": {"tenant": "fresh"}}],
                                 [5, now(), 99, "stop"]]))
        self.d.wait_value("vllm:request_success_total", 1,
                          model_name="good", engine="0", tenant="fresh",
                          finished_reason="stop")
        self.assert_good_connection_works()
        self.assertLess(rss_kib(self.pid) - rss0, 64 * 1024)


class ConnectionStorm(Base):
    args = ("--max-connections", "150")

    def test_200_connections_opened_and_dropped_at_once(self):
        rss0 = rss_kib(self.pid)
        for rnd in range(3):
            socks = [self.d.connect() for _ in range(200)]
            for i, s in enumerate(socks):
                try:
                    if i % 3 == 0:
                        s.sendall(hello(model=f"storm{i}"))
                    elif i % 3 == 1:
                        s.sendall(hello()[:5])  # half a HELLO
                except (BrokenPipeError, ConnectionResetError):
                    pass  # over --max-connections: closed at accept
                # Abortive close (RST) for half of them.
                if i % 2:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                 struct.pack("ii", 1, 0))
            for s in socks:
                s.close()
            self.d.wait_value("tokenmeter_ingest_connections", 1)
            self.assert_good_connection_works()
        # Refusals are counted one by one and logged once per burst,
        # naming the first refused peer. How many of each round's 200 are
        # refused depends on how far the daemon's accepts run ahead of this
        # process's closes: 51 when all are accepted before the first close
        # (the fixture's own connection stays open beside the 200).
        refused = self.d.value("tokenmeter_ingest_errors_total",
                               reason="connection_limit")
        self.assertGreater(refused, 0)
        self.assertLessEqual(refused, 3 * 51)
        log = self.d.read_log().decode()
        lines = re.findall(
            PEER + r": closing the connection: connection_limit \(150 "
            r"engine connections open, --max-connections\)", log)
        self.assertGreaterEqual(len(lines), 1)
        self.assertLessEqual(len(lines), refused)
        self.assertLess(rss_kib(self.pid) - rss0, 64 * 1024)


class HostileHttp(Base):
    args = ("--max-http-connections", "32")

    def http(self, data, read_timeout=15):
        c = socket.create_connection(("127.0.0.1", self.d.port))
        self.last_peer = "127.0.0.1:%d" % c.getsockname()[1]
        c.settimeout(read_timeout)
        try:
            c.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        out = b""
        try:
            while True:
                chunk = c.recv(65536)
                if not chunk:
                    break
                out += chunk
        except (ConnectionResetError, socket.timeout):
            pass
        c.close()
        return out

    def status_of(self, data):
        m = re.match(rb"HTTP/1\.[01] (\d{3})", self.http(data))
        return int(m.group(1)) if m else None

    def responses(self, code):
        return self.d.value("tokenmeter_http_responses_total", code=str(code))

    def test_bad_requests_get_4xx(self):
        big = b"x" * (20 * 1024)
        cases = [
            ("garbage", b"\x00\x01\x02\x03\r\n\r\n", 400),
            ("not http", b"HELLO\r\n\r\n", 400),
            ("huge header", b"GET /metrics HTTP/1.1\r\nX-A: " + big +
             b"\r\n\r\n", 431),
            ("many headers", b"GET /metrics HTTP/1.1\r\n" +
             b"".join(b"X-%d: %s\r\n" % (i, b"y" * 100) for i in range(300))
             + b"\r\n", 431),
            ("huge target", b"GET /" + big + b" HTTP/1.1\r\n\r\n", 431),
            ("body", b"POST /metrics HTTP/1.1\r\nHost: x\r\n"
             b"Content-Length: 5\r\n\r\nhello", 405),
            ("body on GET", b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
             b"Content-Length: 100\r\n\r\n" + b"z" * 100, 413),
            ("negative length", b"GET /metrics HTTP/1.1\r\nContent-Length: "
             b"-1\r\n\r\n", 400),
            ("chunked body", b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
             413),
            ("chunk size overflow", b"GET /metrics HTTP/1.1\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n"
             b"fffffffffffffffff\r\n", 400),
            ("unknown path",
             b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n", 404),
            ("bad method", b"DELETE /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
             405),
            ("HTTP/1.1 without Host", b"GET /metrics HTTP/1.1\r\n\r\n", 400),
            ("two Hosts",
             b"GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
            ("HTTP/1.0 without Host", b"GET /nope HTTP/1.0\r\n\r\n", 404),
            ("bad version", b"GET /metrics HTTP/9.9\r\n\r\n", 400),
            ("NUL in header", b"GET /metrics HTTP/1.1\r\nX: a\x00b\r\n\r\n",
             400),
            ("two content-lengths", b"GET /metrics HTTP/1.1\r\n"
             b"Content-Length: 0\r\nContent-Length: 5\r\n\r\n", 400),
        ]
        rss0 = rss_kib(self.pid)
        for name, data, want in cases:
            with self.subTest(name):
                before = self.responses(want)
                self.assertEqual(self.status_of(data), want)
                # The counter moved by exactly this answer.
                self.assertEqual(self.responses(want), before + 1)
                if want in (400, 413, 431):  # protocol errors name the peer
                    poll_until(lambda: re.search(
                        rb"HTTP: " + re.escape(self.last_peer.encode()) +
                        rb": .*closing", self.d.read_log()),
                        what="a log line naming " + self.last_peer)
                status, _, _ = self.d.get("/healthz")
                self.assertEqual(status, 200)
        self.assertLess(rss_kib(self.pid) - rss0, 64 * 1024)
        self.assert_good_connection_works()

    def test_slow_and_half_sent_requests(self):
        # A scraper that stops halfway: the other scrapes go on, and the
        # server answers 408 after its 10 s header timeout.
        timeouts0 = self.responses(408)
        half = socket.create_connection(("127.0.0.1", self.d.port))
        half.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        silent = [socket.create_connection(("127.0.0.1", self.d.port))
                  for _ in range(10)]
        # A byte-at-a-time scraper (slowloris) is bounded by the same timer.
        slow = socket.create_connection(("127.0.0.1", self.d.port))
        t0 = time.monotonic()
        for b in b"GET /metrics HTTP/1.1\r\n":
            slow.send(bytes([b]))
            status, _, body = self.d.get()
            self.assertEqual(status, 200)
            time.sleep(0.05)
        self.assert_good_connection_works()
        half.settimeout(20)
        resp = b""
        while True:
            chunk = half.recv(4096)
            if not chunk:
                break
            resp += chunk
        waited = time.monotonic() - t0
        self.assertTrue(resp.startswith(b"HTTP/1.1 408"), resp[:40])
        self.assertLess(waited, 15)
        slow.settimeout(10)
        self.assertTrue(slow.recv(4096).startswith(b"HTTP/1.1 408"))
        for s in silent:  # silent ones are closed without a word
            s.settimeout(10)
            self.assertEqual(s.recv(1), b"")
            s.close()
        half.close()
        slow.close()
        self.assertEqual(self.responses(408), timeouts0 + 2)

    def test_connection_cap_then_recovery(self):
        rejected0 = self.d.value("tokenmeter_http_connections_rejected_total")
        held = [socket.create_connection(("127.0.0.1", self.d.port))
                for _ in range(40)]
        for s in held:
            try:
                s.sendall(b"GET /metrics HTTP/1.1\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # over the cap: closed at accept
        # Wait until those past the cap have been closed at accept (a
        # scrape now would be refused too): seen from this end.
        def refused(s):
            try:
                return s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                return False
            except OSError:  # reset
                return True
        poll_until(lambda: sum(map(refused, held)) >= 8,
                   what="8 connections over the cap refused")
        for s in held:
            s.close()
        def healthy():
            try:
                return self.d.get("/healthz")[0] == 200
            except OSError:  # refused while the old ones are being freed
                return False
        poll_until(healthy, what="scrapes served again")
        self.assert_good_connection_works()
        # 40 held against a cap of 32: at least 8 refused and counted (more
        # if earlier connections were still being freed), and logged.
        rejected = (self.d.value("tokenmeter_http_connections_rejected_total")
                    - rejected0)
        self.assertGreaterEqual(rejected, 8)
        self.assertLessEqual(rejected, 40)
        self.assertRegex(self.d.read_log().decode(),
                         r"HTTP: 32 connections open \(max_connections\); "
                         r"closing the new one from 127\.0\.0\.1:\d+")


if __name__ == "__main__":
    tu.DAEMON = os.path.abspath(sys.argv.pop(1))
    # Sockets the daemon closed on us are left to the garbage collector.
    warnings.simplefilter("ignore", ResourceWarning)
    tu.main()
