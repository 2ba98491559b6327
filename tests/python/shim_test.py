#!/usr/bin/python3
"""The Python shim (client_lib/python/tokenmeter) against the real
tokenmeterd: every event kind reaches the series it should, to the
nanosecond where the test sets the times; bad arguments raise before
anything is sent; transport trouble never raises; the two-process example's
time to first token is joined across its processes; a missing library gives
an error naming every place tried; the protocol 1.1 HELLO keys and ARRIVED
params, and the protocol 1.2 and 1.3 calls, reach the socket as the
protocol says (decoded from the bytes a recording socket read).

Every suite runs against both implementations of the package
(tests/python/meson.build): the ctypes binding (PYTHONPATH=client_lib/python,
TOKENMETER_LIBRARY the built libtokenmeter.so) and the C extension
tokenmeter._native (TOKENMETER_BACKEND=native, PYTHONPATH the build folder's
copy of the package); Buffers covers the buffer forms of tokens_batch() and
expert_load() and the calls the extension's fast path hands on.

Environment: TOKENMETERD, the daemon; TOKENMETER_LIBRARY; PYTHONPATH;
TOKENMETER_BACKEND. The daemon harness is tests/testutil.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from array import array

import msgpack

import tokenmeter
from tokenmeter import DROPPED, INVALID, OK, FinishReason

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

MS = 1_000_000
HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
PACKAGE = os.path.join(SRC, "client_lib", "python", "tokenmeter")
EXAMPLE = os.path.join(SRC, "client_lib", "python", "examples",
                       "two_process.py")
LIBRARY = os.environ["TOKENMETER_LIBRARY"]


class DaemonTest(unittest.TestCase):
    """A fresh tokenmeterd per test; self.client() makes clients of it."""

    def setUp(self):
        self.d = tu.Daemon("--log-interval", "0").start()
        self.addCleanup(self.d.cleanup)
        self.addCleanup(self.d.stop)

    def client(self, **kw):
        kw.setdefault("engine", "py-shim")
        kw.setdefault("model", "m")
        kw.setdefault("instance", "i0")
        c = tokenmeter.Client(socket_path=self.d.sock, flush_interval=0.002,
                              **kw)
        self.addCleanup(c.close)
        return c

    def v(self, name, engine="i0", **labels):
        return self.d.value("py_shim:" + name, model_name="m", engine=engine,
                            **labels)

    def wait(self, name, expected, engine="i0", **labels):
        self.d.wait_value("py_shim:" + name, expected, model_name="m",
                          engine=engine, **labels)


class EventKinds(DaemonTest):
    def test_int_id_request_intervals_to_the_nanosecond(self):
        c = self.client(labels={"team": "a"})
        t0 = time.monotonic_ns() - 5_000 * MS
        self.assertEqual(c.arrived(7, 100, max_tokens=64, n=1, t_ns=t0), OK)
        self.assertEqual(c.queued(7, t_ns=t0 + 1 * MS + 1), OK)
        self.assertEqual(c.scheduled(7, t_ns=t0 + 3 * MS + 2), OK)
        self.assertEqual(c.tokens(7, 1, t_ns=t0 + 10 * MS + 3), OK)
        self.assertEqual(c.tokens_batch([7], n=[2], t_ns=t0 + 25 * MS + 5), 1)
        self.assertEqual(c.tokens(7, t_ns=t0 + 40 * MS + 8), OK)
        self.assertEqual(c.finished(7, "stop", t_ns=t0 + 41 * MS + 13), OK)
        lab = {"team": "a"}
        self.wait("request_success_total", 1, finished_reason="stop", **lab)
        v = self.v
        self.assertEqual(v("time_to_first_token_seconds_sum", **lab),
                         (10 * MS + 3) / 1e9)
        self.assertEqual(v("time_to_first_token_seconds_count", **lab), 1)
        self.assertEqual(v("inter_token_latency_seconds_count", **lab), 2)
        self.assertEqual(v("inter_token_latency_seconds_sum", **lab),
                         (30 * MS + 5) / 1e9)
        self.assertEqual(v("e2e_request_latency_seconds_sum", **lab),
                         (41 * MS + 13) / 1e9)
        self.assertEqual(v("request_queue_time_seconds_sum", **lab),
                         (2 * MS + 1) / 1e9)
        self.assertEqual(v("request_prefill_time_seconds_sum", **lab),
                         (7 * MS + 1) / 1e9)
        self.assertEqual(v("request_decode_time_seconds_sum", **lab),
                         (30 * MS + 5) / 1e9)
        self.assertEqual(v("prompt_tokens_total", **lab), 100)
        self.assertEqual(v("generation_tokens_total", **lab), 4)
        self.assertEqual(v("request_params_max_tokens_sum", **lab), 64)
        self.assertEqual(v("request_params_n_count", **lab), 1)
        for kind, n in (("arrived", 1), ("queued", 1), ("scheduled", 1),
                        ("tokens", 3), ("finished", 1)):
            self.assertEqual(self.d.value("tokenmeter_ingest_events_total",
                                          kind=kind), n, kind)

    def test_str_ids_every_reason_and_preemption(self):
        c = self.client()
        t0 = time.monotonic_ns() - 1_000 * MS
        ids = ["stop-1", "length-1", "abort-1", "error-1", "é-ü",
               "x" * tokenmeter.MAX_RID_BYTES]
        reasons = ["stop", FinishReason.LENGTH, "abort", FinishReason.ERROR,
                   "stop", "length"]
        for i, (rid, reason) in enumerate(zip(ids, reasons)):
            t = t0 + i * 10 * MS
            c.arrived(rid, 10, t_ns=t)
            c.scheduled(rid, t_ns=t + 1 * MS)
            c.tokens(rid, 2, t_ns=t + 2 * MS)
            if i == 0:
                c.preempted(rid, t_ns=t + 3 * MS)
            c.finished(rid, reason, t_ns=t + 4 * MS)
        c.preempted(b"bytes-id", t_ns=t0)  # bytes ids work too
        self.wait("request_success_total", 2, finished_reason="length")
        self.assertEqual(self.v("request_success_total",
                                finished_reason="stop"), 2)
        self.assertEqual(self.v("request_success_total",
                                finished_reason="abort"), 1)
        self.assertEqual(self.v("request_success_total",
                                finished_reason="error"), 1)
        self.assertEqual(self.v("num_preemptions_total"), 2)
        self.assertEqual(self.v("generation_tokens_total"), 12)
        self.assertEqual(self.v("time_to_first_token_seconds_count"), 6)
        self.assertAlmostEqual(self.v("time_to_first_token_seconds_sum"),
                               6 * 2 * MS / 1e9, delta=1e-12)
        self.assertEqual(self.d.value("tokenmeter_ingest_errors_total",
                                      reason="bad_event"), 0)

    def test_step_figures(self):
        c = self.client()
        self.assertEqual(c.step(running=3, waiting=2, kv_usage=0.5,
                                prompt_tokens=7, generation_tokens=9,
                                prefix_queries=10, prefix_hits=4,
                                spec_drafts=2, spec_draft_tokens=6,
                                spec_accepted_tokens=4,
                                spec_accepted_per_pos=[2, 1, 1]), OK)
        self.wait("kv_cache_usage_perc", 0.5)
        self.assertEqual(self.v("num_requests_running"), 3)
        self.assertEqual(self.v("num_requests_waiting"), 2)
        self.assertEqual(self.v("prefix_cache_queries_total"), 10)
        self.assertEqual(self.v("prefix_cache_hits_total"), 4)
        self.assertEqual(self.v("spec_decode_num_drafts_total"), 2)
        self.assertEqual(self.v("spec_decode_num_draft_tokens_total"), 6)
        self.assertEqual(self.v("spec_decode_num_accepted_tokens_total"), 4)
        per_pos = "spec_decode_num_accepted_tokens_per_pos_total"
        self.assertEqual(self.v(per_pos, position="0"), 2)
        self.assertEqual(self.v(per_pos, position="2"), 1)
        self.assertEqual(self.v("iteration_tokens_total_sum"), 16)
        # A later STEP with only some figures leaves the others alone.
        c.step(running=1)
        self.wait("num_requests_running", 1)
        self.assertEqual(self.v("kv_cache_usage_perc"), 0.5)
        self.assertEqual(self.d.value("tokenmeter_ingest_events_total",
                                      kind="step"), 2)

    def test_tokens_batch_every_form(self):
        c = self.client()
        t0 = time.monotonic_ns() - 1_000 * MS
        for rid in (1, 2, 3):
            c.arrived(rid, 5, t_ns=t0)
        for rid in ("a", "b"):
            c.arrived(rid, 5, t_ns=t0)
        step = t0 + 10 * MS
        self.assertEqual(c.tokens_batch([1, 2, 3], t_ns=step), 3)
        self.assertEqual(c.tokens_batch(array("Q", [1, 2, 3]),
                                        n=array("I", [2, 0, 1]),
                                        t_ns=step + MS), 2)
        self.assertEqual(c.tokens_batch(["a", "b"], n=[0, 3],
                                        t_ns=step + 2 * MS), 1)
        self.assertEqual(c.tokens_batch(["a", "b"], n=4, t_ns=step + 3 * MS),
                         2)
        self.assertEqual(c.tokens_batch([], t_ns=step), 0)
        self.assertEqual(c.tokens_batch([1, 2], n=0), 0)
        # 1+1+1 + 2+1 + 3 + 4+4
        self.wait("generation_tokens_total", 17)
        # First tokens: 1, 2, 3 at step, "a" at step+3ms, "b" at step+2ms.
        self.assertEqual(self.v("time_to_first_token_seconds_count"), 5)
        self.assertAlmostEqual(self.v("time_to_first_token_seconds_sum"),
                               (3 * 10 * MS + 13 * MS + 12 * MS) / 1e9,
                               delta=1e-12)
        # Later tokens of the same requests: inter-token latencies.
        self.assertEqual(self.v("inter_token_latency_seconds_count"), 3)
        self.assertEqual(self.d.value("tokenmeter_ingest_events_total",
                                      kind="tokens"), 8)

    def test_batch_longer_than_the_library_takes_is_split(self):
        c = self.client(buffer_capacity=1 << 18)
        self.assertEqual(c.tokens_batch(range(70_000)), 70_000)
        self.wait("generation_tokens_total", 70_000)
        self.assertEqual(c.stats().events_dropped, 0)

    def test_protocol_11_keys_and_params_are_accepted(self):
        # A daemon of either version takes them: the events count, nothing
        # is refused (1.0 ignores the new keys).
        c = self.client(cache_config={"block_size": 16, "prefix": True},
                        max_lora=4)
        t0 = time.monotonic_ns() - 1_000 * MS
        c.arrived(1, 10, lora="sql-lora", labels={"tenant": "acme"}, t_ns=t0)
        c.arrived("r", 10, 8, 1, t0, None, {"tenant": "b", "tier": "x"})
        c.tokens(1, t_ns=t0 + MS)
        c.tokens("r", t_ns=t0 + MS)
        self.d.wait_value("tokenmeter_ingest_events_total", 2, kind="tokens")
        self.assertEqual(self.d.value("tokenmeter_ingest_events_total",
                                      kind="arrived"), 2)
        self.assertEqual(
            self.d.samples().sum("tokenmeter_ingest_errors_total"), 0)
        self.assertEqual(c.stats().events_rejected, 0)

    def test_expert_load_reaches_the_daemon(self):
        # From the real library to the real daemon: the MoE series add up.
        from array import array
        c = self.client()
        c.expert_load(3, array("Q", [6, 2, 0, 0]))
        c.expert_load(3, [1, 1, 1, 1])
        c.expert_load(7, array("Q", range(256)))
        self.d.wait_value("tokenmeter_ingest_events_total", 3,
                          kind="expert_load")
        labels = {"model_name": "m", "engine": "i0"}
        self.assertEqual(self.d.value("py_shim:moe_routed_tokens_total",
                                      layer="3", **labels), 12)
        self.assertEqual(self.d.value("py_shim:moe_routed_tokens_total",
                                      layer="7", **labels), sum(range(256)))
        self.assertEqual(self.d.value("py_shim:moe_layer_imbalance",
                                      layer="3", **labels), 1)
        self.assertEqual(
            self.d.samples().sum("tokenmeter_ingest_errors_total"), 0)

    def test_now_is_time_monotonic_ns(self):
        c = self.client()
        start = time.monotonic_ns()
        c.arrived("r", 3)
        time.sleep(0.03)
        c.tokens("r")
        end = time.monotonic_ns()
        self.wait("time_to_first_token_seconds_count", 1)
        ttft = self.v("time_to_first_token_seconds_sum")
        self.assertGreaterEqual(ttft, 0.03)
        self.assertLessEqual(ttft, (end - start) / 1e9)
        self.assertAlmostEqual(tokenmeter.now_ns(), time.monotonic_ns(),
                               delta=1e9)

    def test_arrived_now_forms_carry_both_counts(self):
        # arrived() stamped now without n takes the packed entries
        # (tm_arrived_packed, _str); with n or a time, the full ones.
        c = self.client()
        self.assertEqual(c.arrived("p-1", 100, 64), OK)
        self.assertEqual(c.arrived(11, 200, max_tokens=(1 << 32) - 1), OK)
        self.assertEqual(c.arrived("p-3", (1 << 32) - 1), OK)
        self.assertEqual(c.arrived(12, 300, 16, n=2), OK)
        for rid in ("p-1", 11, "p-3", 12):  # params are observed at the end
            c.finished(rid, "stop")
        self.wait("request_success_total", 4, finished_reason="stop")
        self.assertEqual(self.v("request_prompt_tokens_sum"),
                         100 + 200 + (1 << 32) - 1 + 300)
        self.assertEqual(self.v("request_params_max_tokens_count"), 3)
        self.assertEqual(self.v("request_params_max_tokens_sum"),
                         64 + (1 << 32) - 1 + 16)
        self.assertEqual(self.v("request_params_n_count"), 1)
        self.assertEqual(self.d.value("tokenmeter_ingest_events_total",
                                      kind="arrived"), 4)

    def test_threads_share_one_client(self):
        c = self.client()
        errors = []

        def work(k):
            try:
                c.attach_thread()
                for i in range(300):
                    c.tokens(k * 1000 + i)
                for i in range(30):
                    c.tokens_batch([f"t{k}-{j}" for j in range(10)], n=2)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)
        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.wait("generation_tokens_total", 8 * (300 + 30 * 10 * 2))
        self.assertTrue(c.flush(5.0))
        s = c.stats()
        self.assertEqual((s.events_dropped, s.events_rejected), (0, 0))
        self.assertEqual(s.events_sent, 8 * (300 + 300))
        self.assertEqual(s.connected, 1)

    def test_threads_started_one_after_another_keep_every_event(self):
        # Each thread is joined before the next starts, so that the
        # C library hands the next one its stack and TCB: the library,
        # loaded with dlopen(), must still give each thread its own ring
        # (its slot cache is keyed by the thread pointer).
        n_threads, per_thread = 100, 20
        c = self.client(max_threads=n_threads, buffer_capacity=1024)
        idents, errors = set(), []

        def work(k):
            idents.add(threading.get_ident())  # pthread_self()
            try:
                for i in range(1, per_thread + 1):
                    self.assertEqual(c.tokens(k, n=i), tokenmeter.OK)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)
        for k in range(n_threads):
            t = threading.Thread(target=work, args=(k,))
            t.start()
            t.join()
        self.assertEqual(errors, [])
        self.assertLess(len(idents), n_threads)  # TCBs were reused
        self.wait("generation_tokens_total",
                  n_threads * per_thread * (per_thread + 1) // 2)
        self.assertTrue(c.flush(5.0))
        s = c.stats()
        self.assertEqual((s.events_dropped, s.events_rejected), (0, 0))
        self.assertEqual(s.events_sent, n_threads * per_thread)

    def test_close_sends_what_is_buffered(self):
        c = tokenmeter.Client(socket_path=self.d.sock, engine="py-shim",
                              model="m", instance="i0",
                              flush_interval=10.0)  # only close sends
        for i in range(100):
            c.tokens(i)
        stats = c.close()
        self.assertEqual(stats.events_sent, 100)
        self.wait("generation_tokens_total", 100)

    def test_context_manager(self):
        with tokenmeter.Client(socket_path=self.d.sock, engine="py-shim",
                               model="m", instance="i0") as c:
            c.tokens(1)
        self.assertTrue(c.closed)
        self.wait("generation_tokens_total", 1)


class ArgumentChecks(unittest.TestCase):
    """No daemon: the library keeps retrying in the background."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tm-py-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.c = tokenmeter.Client(
            socket_path=os.path.join(self.dir, "absent.sock"), model="m",
            close_timeout=0)
        self.addCleanup(self.c.close)

    def assertNothingReachedTheLibrary(self):
        self.assertEqual(self.c.stats().events_rejected, 0)

    def test_bad_event_arguments_raise_before_the_library(self):
        c = self.c
        cases = [
            (ValueError, r"n \(tokens\) = 0", lambda: c.tokens(1, 0)),
            (ValueError, r"n \(tokens\) = -1", lambda: c.tokens("r", -1)),
            (ValueError, r"outside 1 \.\. 4294967295",
             lambda: c.tokens(1, 1 << 32)),
            (TypeError, r"n \(tokens\) must be an int",
             lambda: c.tokens(1, 1.0)),
            (ValueError, r"129 bytes of UTF-8; it must be 1 \.\. 128",
             lambda: c.tokens("x" * 129)),
            (ValueError, r"130 bytes", lambda: c.arrived("é" * 65, 1)),
            (ValueError, r"0 bytes", lambda: c.scheduled("")),
            (ValueError, r"0 bytes", lambda: c.arrived("", 1)),
            (TypeError, r"prompt_tokens must be an int, not float",
             lambda: c.arrived("a", 1.5)),
            (ValueError, r"t_ns .* = -1 is outside",
             lambda: c.arrived("a", 1, t_ns=-1)),
            (ValueError, r"outside 0 \.\. 2\*\*64-1", lambda: c.queued(-1)),
            (ValueError, r"outside 0 \.\. 2\*\*64-1",
             lambda: c.preempted(1 << 64)),
            (TypeError, r"request id must be an int or a str, not float",
             lambda: c.tokens(1.5)),
            (TypeError, r"not bool", lambda: c.tokens(True)),
            (ValueError, r"finish reason 'done' is not one of",
             lambda: c.finished(1, "done")),
            (ValueError, r"finish reason 7", lambda: c.finished(1, 7)),
            (ValueError, r"finish reason True", lambda: c.finished(1, True)),
            (ValueError, r"t_ns .* = -5 is outside",
             lambda: c.tokens(1, t_ns=-5)),
            (TypeError, r"t_ns .* must be an int",
             lambda: c.tokens(1, t_ns=1.5e9)),
            (ValueError, r"prompt_tokens = -1", lambda: c.arrived(1, -1)),
            (ValueError, r"max_tokens = 4294967296",
             lambda: c.arrived(1, 1, max_tokens=1 << 32)),
            (TypeError, r"all ints or all strs",
             lambda: c.tokens_batch([1, "a"])),
            (TypeError, r"all ints or all strs",
             lambda: c.tokens_batch([b"a"])),
            (TypeError, r"not one str", lambda: c.tokens_batch("abc")),
            (TypeError, r"rids must be a sequence of request ids, not int",
             lambda: c.tokens_batch(5)),
            (TypeError, r"n must be None, an int or a sequence of ints",
             lambda: c.tokens_batch([1, 2], n=[1.5, 2])),
            (ValueError, r"integer request ids must be 0 \.\. 2\*\*64-1",
             lambda: c.tokens_batch([1, -2])),
            (ValueError, r"n has 1 entries for 2 request ids",
             lambda: c.tokens_batch([1, 2], n=[1])),
            (ValueError, r"token counts n must be 0 \.\. 2\*\*32-1",
             lambda: c.tokens_batch([1], n=[-1])),
            (ValueError, r"n = -1 is outside",
             lambda: c.tokens_batch([1], n=-1)),
            (ValueError, r"request id 1 \('x+'\) is 129 bytes",
             lambda: c.tokens_batch(["a", "x" * 129])),
            (ValueError, r"request id 0 \(''\) is 0 bytes",
             lambda: c.tokens_batch(["", "a"])),
            (ValueError, r"contains a NUL character",
             lambda: c.tokens_batch(["a\0b"])),
            (ValueError, r"kv_usage = 1.5 is outside 0 \.\. 1",
             lambda: c.step(kv_usage=1.5)),
            (ValueError, r"kv_usage = nan",
             lambda: c.step(kv_usage=float("nan"))),
            (ValueError, r"running = -1 is outside",
             lambda: c.step(running=-1)),
            (TypeError, r"waiting must be an int",
             lambda: c.step(waiting=2.5)),
            (ValueError, r"at most 64",
             lambda: c.step(spec_accepted_per_pos=[1] * 65)),
            (ValueError, r"prefix_queries = 4294967296 is outside",
             lambda: c.step(prefix_queries=2**32)),
            (ValueError, r"entries must be ints 0 \.\. 2\*\*32-1",
             lambda: c.step(spec_accepted_per_pos=[1, 2**32])),
            (TypeError, r"unexpected keyword", lambda: c.step(foo=1)),
            (ValueError, r"lora must not be empty",
             lambda: c.arrived(1, 1, lora="")),
            (ValueError, r"lora 'x+' is 129 bytes of UTF-8; the limit is 128",
             lambda: c.arrived(1, 1, lora="x" * 129)),
            (ValueError, r"lora .* contains a NUL",
             lambda: c.arrived("r", 1, lora="a\0b")),
            (TypeError, r"lora must be a str, not bytes",
             lambda: c.arrived(1, 1, lora=b"a")),
            (ValueError, r"labels has 5 entries; at most 4",
             lambda: c.arrived(1, 1, labels={k: "v" for k in "abcde"})),
            (TypeError, r"labels must be a dict of str to str, not list",
             lambda: c.arrived(1, 1, labels=[("a", "b")])),
            (ValueError, r"request label 'tenant' value 'v+' is 129 bytes",
             lambda: c.arrived(1, 1, labels={"tenant": "v" * 129})),
            (TypeError, r"request label 'tenant' value must be a str",
             lambda: c.arrived(1, 1, labels={"tenant": 1})),
            (TypeError, r"request label name must be a str, not int",
             lambda: c.arrived(1, 1, labels={1: "v"})),
            (ValueError, r"request label name must not be empty",
             lambda: c.arrived(1, 1, labels={"": "v"})),
            (ValueError, r"request label name 'n+' is 257 bytes",
             lambda: c.arrived(1, 1, labels={"n" * 257: "v"})),
            (ValueError, r"130 bytes",
             lambda: c.arrived("é" * 65, 1, lora="a")),
            (ValueError, r"prompt_tokens = -1",
             lambda: c.arrived(1, -1, labels={"a": "b"})),
        ]
        for exc, pattern, call in cases:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    call()
        # The string batch's malformed cases reach the library (its whole
        # batch is rejected there, then diagnosed); the rest do not.
        self.assertEqual(self.c.stats().events_rejected, 2 + 2 + 1)

    def test_bad_request_label_names_are_diagnosed_after_the_library(self):
        # The label-name rules live in protocol.h: the library refuses (and
        # counts) such an ARRIVED, the binding then raises naming the rule.
        for name in ("le", "model_name", "__x", "1a", "a-b", "é"):
            with self.subTest(name=name):
                with self.assertRaisesRegex(ValueError, "request labels"):
                    self.c.arrived(1, 1, labels={name: "v"})
        self.assertEqual(self.c.stats().events_rejected, 6)

    def test_other_int_types_are_accepted(self):
        class Id:
            def __index__(self):
                return 42
        self.assertIn(self.c.tokens(Id(), n=Id()), (OK, DROPPED))
        self.assertIn(self.c.finished(1, 2), (OK, DROPPED))  # abort
        self.assertEqual(self.c.tokens_batch([Id(), Id()], n=[Id(), 1]), 2)
        self.assertNothingReachedTheLibrary()

    def test_bad_options_raise(self):
        sock = os.path.join(self.dir, "s")
        cases = [
            (ValueError, r"engine 'a b' must match",
             dict(model="m", engine="a b")),
            (ValueError, r"model must not be empty", dict(model="")),
            (TypeError, r"model must be a str", dict(model=None)),
            (ValueError, r"label 'le'", dict(model="m", labels={"le": "1"})),
            (ValueError, r"label 'l8': at most 8 labels",
             dict(model="m", labels={f"l{i}": "v" for i in range(9)})),
            (ValueError, r"socket_path .* must be 1 \.\. 107 bytes",
             dict(model="m", socket_path="/" + "x" * 200)),
            (ValueError, r"buffer_capacity = 10 is outside",
             dict(model="m", buffer_capacity=10)),
            (ValueError, r"flush_interval = 0 s is outside",
             dict(model="m", flush_interval=0)),
            (ValueError, r"contains a NUL", dict(model="m\0")),
            (ValueError, r"is 257 bytes", dict(model="m" * 257)),
            (ValueError, r"profile 'tgi' must be one of 'vllm', 'sglang', "
             r"'lmdeploy'", dict(model="m", profile="tgi")),
            (ValueError, r"profile '' must be one of",
             dict(model="m", profile="")),
            (TypeError, r"profile must be a str", dict(model="m", profile=1)),
            (ValueError, r"cache_config key 'k32': at most 32 entries",
             dict(model="m",
                  cache_config={f"k{i}": i for i in range(33)})),
            (ValueError, r"cache_config key 'le'",
             dict(model="m", cache_config={"le": 1})),
            (ValueError, r"cache_config key '__x'",
             dict(model="m", cache_config={"__x": 1})),
            (ValueError, r"cache_config key 'a-b'",
             dict(model="m", cache_config={"a-b": 1})),
            (ValueError, r"cache_config 'util' = nan is not a finite",
             dict(model="m", cache_config={"util": float("nan")})),
            (ValueError, r"cache_config 'util' = inf is not a finite",
             dict(model="m", cache_config={"util": float("inf")})),
            (ValueError, r"cache_config 'dtype' value .* contains a NUL",
             dict(model="m", cache_config={"dtype": "a\0"})),
            (UnicodeEncodeError, r"surrogates not allowed",
             dict(model="m", cache_config={"dtype": "\ud800"})),
            (ValueError, r"cache_config 'dtype' value .* is 257 bytes",
             dict(model="m", cache_config={"dtype": "d" * 257})),
            (ValueError, r"cache_config 'n' = 9223372036854775808 is outside",
             dict(model="m", cache_config={"n": 2**63})),
            (TypeError, r"cache_config 'l' must be a str, int, float or "
             r"bool, not list", dict(model="m", cache_config={"l": [1]})),
            (TypeError, r"cache_config key must be a str, not int",
             dict(model="m", cache_config={1: 1})),
            (TypeError, r"cache_config must be a dict, not list",
             dict(model="m", cache_config=[("a", 1)])),
            (ValueError, r"max_lora = -1 is outside",
             dict(model="m", max_lora=-1)),
            (TypeError, r"max_lora must be an int, not bool",
             dict(model="m", max_lora=True)),
            (TypeError, r"ack must be a bool, not int",
             dict(model="m", ack=1)),
            (ValueError, r"replay_bytes = 524287 is outside",
             dict(model="m", replay_bytes=512 * 1024 - 1)),
            (ValueError, r"replay_bytes = 1073741825 is outside",
             dict(model="m", replay_bytes=(1 << 30) + 1)),
            (TypeError, r"replay_bytes must be an int, not float",
             dict(model="m", replay_bytes=1e6)),
        ]
        for exc, pattern, kw in cases:
            kw.setdefault("socket_path", sock)
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    tokenmeter.Client(**kw)
        with self.assertRaises(TypeError):
            tokenmeter.Client("m")  # keyword-only

    def test_transport_trouble_never_raises_and_is_counted(self):
        c = tokenmeter.Client(
            socket_path=os.path.join(self.dir, "absent.sock"), model="m",
            buffer_capacity=1024, close_timeout=0)
        results = [c.tokens(i) for i in range(3000)]
        results += [c.tokens_batch(list(range(3000)))]
        self.assertIn(DROPPED, results)
        dropped_singles = results[:3000].count(DROPPED)
        s = c.stats()
        self.assertEqual(s.events_dropped, dropped_singles + 3000 -
                         results[3000])
        self.assertEqual(s.events_sent, 0)
        self.assertEqual(s.connected, 0)
        self.assertFalse(c.flush(0.1))  # daemon away: False, no raise
        final = c.close()
        self.assertGreaterEqual(final.connect_failures, 1)

    def test_closed_client_calls_do_nothing(self):
        c = self.c
        c.tokens(1)
        final = c.close()
        self.assertEqual(c.close(), final)  # idempotent
        self.assertEqual(c.stats(), final)
        self.assertEqual(c.tokens(1), INVALID)
        self.assertEqual(c.tokens("a"), INVALID)
        self.assertEqual(c.arrived(1, 2), INVALID)
        self.assertEqual(c.tokens_batch([1, 2]), 0)
        self.assertEqual(c.tokens_batch(["a"]), 0)
        self.assertEqual(c.step(running=1), INVALID)
        self.assertFalse(c.attach_thread())
        with self.assertRaisesRegex(ValueError, "closed"):
            c.flush()
        self.assertIn("closed", repr(c))

    def test_forked_child_reports_nothing_and_parent_is_unharmed(self):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: the copied client is inert, closing is safe
            try:
                ok = (self.c.tokens(1) == INVALID and self.c.closed
                      and self.c.close() is not None)
                os.write(w, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(w)
        self.assertEqual(os.read(r, 1), b"1")
        os.close(r)
        os.waitpid(pid, 0)
        self.assertEqual(self.c.tokens(1), OK)


class AckDelivery(DaemonTest):
    """Acknowledged delivery (the default) against the real daemon."""

    def test_close_returns_once_the_daemon_acked_everything(self):
        c = self.client(close_timeout=10)
        for i in range(1, 4):
            self.assertEqual(c.tokens(1, i), OK)
            self.assertTrue(c.flush(5))
        final = c.close()
        self.assertEqual(final.events_sent, 3)
        self.assertEqual(final.events_unacked, 0)
        self.assertEqual(final.batches_replayed, 0)
        self.assertEqual(final.events_dropped, 0)
        self.wait("generation_tokens_total", 6)
        self.assertEqual(self.d.samples().sum(
            "tokenmeter_ingest_duplicate_batches_total"), 0)

    def test_batches_a_killed_daemon_never_applied_are_sent_again(self):
        c = self.client(close_timeout=10)
        self.assertEqual(c.tokens(1, 1), OK)
        self.assertTrue(c.flush(5))
        self.wait("generation_tokens_total", 1)
        # The daemon stops reading, the client writes one more batch into
        # the socket, and the daemon dies without having applied it.
        os.kill(self.d.proc.pid, signal.SIGSTOP)
        self.assertEqual(c.tokens(1, 2), OK)
        self.assertEqual(c.tokens(1, 3), OK)
        self.assertTrue(c.flush(5))
        self.d.kill()
        d2 = tu.Daemon("--log-interval", "0", ingest=self.d.sock).start()
        self.addCleanup(d2.cleanup)
        self.addCleanup(d2.stop)
        name = "py_shim:generation_tokens_total"
        tu.poll_until(lambda: (d2.value(name, model_name="m", engine="i0")
                               or 0) >= 5, what="the replayed tokens")
        final = c.close()
        self.assertEqual(final.events_sent, 3)  # once each
        self.assertEqual(final.events_unacked, 0)
        self.assertEqual(final.events_dropped, 0)
        self.assertGreaterEqual(final.reconnects, 1)
        # The second batch always; the first too if its ACK had not been
        # read when the daemon stopped.
        self.assertIn(final.batches_replayed, (1, 2))
        expected = 5 if final.batches_replayed == 1 else 6
        self.assertEqual(d2.value(name, model_name="m", engine="i0"),
                         expected)


class Recorder:
    """A Unix socket that records every byte one client sends (no daemon):
    what the library put on the wire, decoded with msgpack. With ack=True
    it also plays a daemon of protocol 1.2 without a state directory: a
    HELLO that asked for ACKs is answered with [3, nil] (ACK at HELLO), and
    each of its BATCHes acked ([3, seq]) as soon as it is read."""

    def __init__(self, path, ack=False):
        self.path = path
        self.ack = ack
        self.acked = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(1)
        self.data = bytearray()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        conn, _ = self.listener.accept()
        unpacker = msgpack.Unpacker(raw=False)
        asked = False
        with conn:
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                self.data += chunk
                if not self.ack:
                    continue
                unpacker.feed(chunk)
                for frame in unpacker:
                    if frame[0] == 0:
                        asked = frame[1].get("ack") is True
                        if asked:
                            conn.sendall(msgpack.packb([3, None]))
                    elif frame[0] == 1 and asked:
                        conn.sendall(msgpack.packb([3, frame[1]]))
                        self.acked.append(frame[1])

    def frames(self, timeout=10.0):
        """Every frame, once the client closed the connection."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError("the client did not close its connection")
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(bytes(self.data))
        return list(unpacker)

    def close(self):
        self.listener.close()


class Protocol11(unittest.TestCase):
    """HELLO profile / cache_config / max_lora and ARRIVED lora / labels,
    as the bytes on the socket show them."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tm-py-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.rec = Recorder(os.path.join(self.dir, "s"))
        self.addCleanup(self.rec.close)

    def client(self, **kw):
        # The recorder sends no ACKs: close waits that long for them.
        kw.setdefault("close_timeout", 0.2)
        c = tokenmeter.Client(socket_path=self.rec.path, model="m",
                              flush_interval=0.002, **kw)
        self.addCleanup(c.close)
        return c

    def hello_and_events(self, c):
        c.close()
        frames = self.rec.frames()
        self.assertEqual(frames[0][0], 0, frames)
        events = [ev for f in frames if f[0] == 1 for ev in f[3]]
        return frames[0][1], events

    def test_hello_carries_the_11_keys(self):
        c = self.client(profile="sglang", max_lora=8, cache_config={
            "page_size": 16, "kv_dtype": "fp8_e5m2", "mem_fraction": 0.5,
            "chunked_prefill": True, "disabled": False, "num_pages": 2**63 - 1,
            "offset": -1})
        meta, _ = self.hello_and_events(c)
        self.assertEqual(meta["profile"], "sglang")
        self.assertEqual(meta["max_lora"], 8)
        cc = meta["cache_config"]
        self.assertEqual(list(cc.items()), [
            ("page_size", 16), ("kv_dtype", "fp8_e5m2"), ("mem_fraction", 0.5),
            ("chunked_prefill", True), ("disabled", False),
            ("num_pages", 2**63 - 1), ("offset", -1)])
        # Each with its own msgpack type: bools are not ints, 0.5 a float.
        self.assertEqual([type(v) for v in cc.values()],
                         [int, str, float, bool, bool, int, int])

    def test_hello_without_the_11_keys(self):
        # session and ack are sent by every client (ack unless ack=False).
        meta, _ = self.hello_and_events(self.client())
        self.assertEqual(sorted(meta), ["ack", "engine", "model", "pid",
                                        "proto", "session"])
        self.assertIs(meta["ack"], True)
        self.assertIsInstance(meta["session"], int)
        self.assertNotEqual(meta["session"], 0)

    def test_hello_with_ack_off_has_a_session_and_no_ack(self):
        meta, _ = self.hello_and_events(self.client(ack=False))
        self.assertEqual(sorted(meta), ["engine", "model", "pid", "proto",
                                        "session"])

    def test_each_client_picks_its_own_session(self):
        first, _ = self.hello_and_events(self.client(ack=False))
        rec = Recorder(os.path.join(self.dir, "s2"))
        self.addCleanup(rec.close)
        c = tokenmeter.Client(socket_path=rec.path, model="m", ack=False)
        c.close()
        self.assertNotEqual(rec.frames()[0][1]["session"], first["session"])

    def test_close_waits_for_the_acks(self):
        rec = Recorder(os.path.join(self.dir, "s2"), ack=True)
        self.addCleanup(rec.close)
        c = tokenmeter.Client(socket_path=rec.path, model="m",
                              flush_interval=0.002, close_timeout=10)
        for i in range(5):
            self.assertEqual(c.tokens(i), OK)
        final = c.close()
        self.assertEqual(final.events_sent, 5)
        self.assertEqual(final.events_unacked, 0)
        self.assertEqual(final.batches_replayed, 0)
        batches = [f[1] for f in rec.frames() if f[0] == 1]
        self.assertEqual(rec.acked, batches)

    def test_close_gives_up_on_missing_acks_and_counts_them(self):
        c = self.client(close_timeout=0.05)
        for i in range(5):
            self.assertEqual(c.tokens(i), OK)
        self.assertTrue(c.flush(5))
        final = c.close()
        self.assertEqual(final.events_sent, 5)
        self.assertEqual(final.events_unacked, 5)
        self.assertEqual(final.events_dropped, 0)

    def test_max_lora_zero_and_an_empty_cache_config(self):
        meta, _ = self.hello_and_events(self.client(max_lora=0,
                                                    cache_config={}))
        self.assertEqual(meta["max_lora"], 0)
        self.assertNotIn("cache_config", meta)

    def test_arrived_carries_lora_and_labels(self):
        c = self.client()
        t = time.monotonic_ns()
        self.assertEqual(c.arrived(1, 10, lora="sql-lora", t_ns=t), OK)
        self.assertEqual(c.arrived("r-2", 20, 64, 2, t, "a",
                                   {"tenant": "acme", "tier": ""}), OK)
        self.assertEqual(c.arrived(3, 30, labels={"tenant": "é"}, t_ns=t), OK)
        self.assertEqual(c.arrived("r-4", 40, lora="x" * 128), OK)
        self.assertEqual(c.arrived(5, 50, lora=None, labels={}, t_ns=t), OK)
        self.assertEqual(c.arrived(6, 60, t_ns=t), OK)  # the fast path
        self.assertEqual(c.arrived("r-7", 70, 16), OK)  # the packed one
        _, events = self.hello_and_events(c)
        for ev in events[3:4] + events[6:]:
            self.assertGreaterEqual(ev[1], t)
            ev[1] = t
        self.assertEqual(events, [
            [1, t, 1, 10, {"lora": "sql-lora"}],
            [1, t, "r-2", 20, {"max_tokens": 64, "n": 2, "lora": "a",
                               "labels": {"tenant": "acme", "tier": ""}}],
            [1, t, 3, 30, {"labels": {"tenant": "é"}}],
            [1, t, "r-4", 40, {"lora": "x" * 128}],
            [1, t, 5, 50],
            [1, t, 6, 60],
            [1, t, "r-7", 70, {"max_tokens": 16}],
        ])
        self.assertEqual(list(events[1][4]["labels"]), ["tenant", "tier"])

    def test_rejected_arrived_is_counted_and_not_sent(self):
        c = self.client()
        with self.assertRaisesRegex(ValueError, r"request labels \['le'\]"):
            c.arrived(1, 10, labels={"le": "x"})
        with self.assertRaisesRegex(ValueError, r"request labels"):
            c.arrived("r", 10, lora="a", labels={"a": "1", "__b": "2"})
        self.assertEqual(c.stats().events_rejected, 2)
        with self.assertRaisesRegex(ValueError, "must not be empty"):
            c.arrived(1, 10, lora="")  # raised before the library
        self.assertEqual(c.stats().events_rejected, 2)
        self.assertEqual(c.arrived(2, 20, lora="ok", t_ns=5), OK)
        _, events = self.hello_and_events(c)
        self.assertEqual(events, [[1, 5, 2, 20, {"lora": "ok"}]])

    def test_arrived_after_close_does_nothing(self):
        c = self.client()
        c.close()
        self.assertEqual(c.arrived(1, 1, lora="a", labels={"t": "v"}),
                         INVALID)


class RecordedClient(unittest.TestCase):
    """self.c, a client of a Recorder; events() closes it and returns the
    events it sent."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tm-py-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.rec = Recorder(os.path.join(self.dir, "s"))
        self.addCleanup(self.rec.close)
        self.c = tokenmeter.Client(socket_path=self.rec.path, model="m",
                                   flush_interval=0.002)
        self.addCleanup(self.c.close)

    def events(self):
        self.c.close()
        frames = self.rec.frames()
        return [ev for f in frames if f[0] == 1 for ev in f[3]]


class ExpertLoad(RecordedClient):
    """expert_load() (protocol 1.1 EXPERT_LOAD) from every counts form, as
    the bytes on the socket show them, and its argument checks."""

    def test_every_counts_form(self):
        import ctypes
        c = self.c
        big = list(range(1000, 1000 + 256))
        self.assertEqual(c.expert_load(0, array("Q", [7]), t_ns=5), OK)
        self.assertEqual(c.expert_load(1, array("Q", big), 6), OK)
        self.assertEqual(c.expert_load(2, [1, 2**32 - 1, 0], t_ns=7), OK)
        self.assertEqual(c.expert_load(3, (4, 5), t_ns=8), OK)
        self.assertEqual(c.expert_load(4, range(3), t_ns=9), OK)
        raw = array("Q", [9, 8, 7]).tobytes()
        self.assertEqual(c.expert_load(5, raw, t_ns=10), OK)
        self.assertEqual(c.expert_load(6, bytearray(raw), t_ns=11), OK)
        self.assertEqual(c.expert_load(7, memoryview(raw), t_ns=12), OK)
        self.assertEqual(c.expert_load(8, (ctypes.c_uint64 * 2)(3, 4),
                                       t_ns=13), OK)
        self.assertEqual(c.expert_load(9, array("I", [1, 2]), t_ns=14), OK)
        # A misaligned view of bytes is copied once, not misread.
        shifted = bytearray(1) + bytearray(raw)
        self.assertEqual(c.expert_load(10, memoryview(shifted)[1:], 15), OK)
        self.assertEqual(c.expert_load(4095, [0] * 1024, t_ns=16), OK)
        t = time.monotonic_ns()
        self.assertEqual(c.expert_load(11, [1]), OK)  # now
        self.assertEqual(c.stats().events_rejected, 0)
        events = self.events()
        self.assertGreaterEqual(events[-1][1], t)
        events[-1][1] = 0
        self.assertEqual(events, [
            [8, 5, 0, [7]],
            [8, 6, 1, big],
            [8, 7, 2, [1, 2**32 - 1, 0]],
            [8, 8, 3, [4, 5]],
            [8, 9, 4, [0, 1, 2]],
            [8, 10, 5, [9, 8, 7]],
            [8, 11, 6, [9, 8, 7]],
            [8, 12, 7, [9, 8, 7]],
            [8, 13, 8, [3, 4]],
            [8, 14, 9, [1, 2]],
            [8, 15, 10, [9, 8, 7]],
            [8, 16, 4095, [0] * 1024],
            [8, 0, 11, [1]],
        ])

    def test_numpy_arrays(self):
        try:
            import numpy as np
        except ImportError:
            self.skipTest("numpy is not installed")
        c = self.c
        a = np.arange(256, dtype=np.uint64)
        self.assertEqual(c.expert_load(0, a, t_ns=1), OK)  # in place
        ro = np.array([5, 6], dtype=np.uint64)
        ro.flags.writeable = False
        self.assertEqual(c.expert_load(1, ro, t_ns=2), OK)
        self.assertEqual(c.expert_load(2, np.array([3, 4], np.int64), 3), OK)
        self.assertEqual(c.expert_load(3, a[::2][:3], t_ns=4), OK)  # strided
        with self.assertRaisesRegex(ValueError, r"0 \.\. 2\*\*32-1"):
            c.expert_load(4, np.array([2**32], np.uint64))
        self.assertEqual(c.stats().events_rejected, 1)
        self.assertEqual(self.events(), [
            [8, 1, 0, list(range(256))],
            [8, 2, 1, [5, 6]],
            [8, 3, 2, [3, 4]],
            [8, 4, 3, [0, 2, 4]],
        ])

    def test_bad_arguments_raise_and_send_nothing(self):
        c = self.c
        cases = [
            (ValueError, r"layer = 4096 is outside 0 \.\. 4095",
             lambda: c.expert_load(4096, [1])),
            (ValueError, r"layer = -1", lambda: c.expert_load(-1, [1])),
            (TypeError, r"layer must be an int",
             lambda: c.expert_load(1.0, [1])),
            (ValueError, r"counts has 0 entries; an expert_load carries "
                         r"1 \.\. 1024", lambda: c.expert_load(0, [])),
            (ValueError, r"counts has 0 entries",
             lambda: c.expert_load(0, b"")),
            (ValueError, r"counts has 1025 entries",
             lambda: c.expert_load(0, [1] * 1025)),
            (ValueError, r"counts has 1025 entries",
             lambda: c.expert_load(0, array("Q", [1] * 1025))),
            (ValueError, r"0 \.\. 2\*\*32-1", lambda: c.expert_load(0, [-1])),
            (ValueError, r"0 \.\. 2\*\*32-1",
             lambda: c.expert_load(0, [2**64])),
            (ValueError, r"not a whole number of uint64s",
             lambda: c.expert_load(0, b"1234567")),
            (TypeError, r"counts must be a sequence or buffer of ints",
             lambda: c.expert_load(0, None)),
            (TypeError, r"counts must be a sequence or buffer of ints",
             lambda: c.expert_load(0, 5)),
            (TypeError, r"counts must be a sequence or buffer of ints",
             lambda: c.expert_load(0, ["a"])),
            (ValueError, r"t_ns", lambda: c.expert_load(0, [1], t_ns=-1)),
        ]
        for exc, pattern, call in cases:
            with self.subTest(pattern):
                with self.assertRaisesRegex(exc, pattern):
                    call()
        self.assertEqual(c.stats().events_rejected, 0)
        # Counts above 2**32-1 are found by the library, in every form.
        for counts in ([1, 2**32], array("Q", [2**32]),
                       array("Q", [2**63]).tobytes()):
            with self.assertRaisesRegex(ValueError, r"counted as rejected"):
                c.expert_load(0, counts)
        self.assertEqual(c.stats().events_rejected, 3)
        self.assertEqual(c.expert_load(0, [2**32 - 1], t_ns=3), OK)
        self.assertEqual(self.events(), [[8, 3, 0, [2**32 - 1]]])

    def test_after_close_does_nothing(self):
        self.c.close()
        self.assertEqual(self.c.expert_load(0, [1]), INVALID)
        self.assertEqual(self.c.expert_load(0, array("Q", [1])), INVALID)


class Protocol12(RecordedClient):
    """The protocol 1.2 calls (arrived priority / traceparent / tracestate,
    scheduled with its info, admission_rejected, kv_transfer, sleep_state,
    step waiting_deferred), as the bytes on the socket show them, and their
    argument checks: what the binding refuses raises before the library;
    what only protocol.h's rules refuse is counted as rejected by the
    library, then raises naming the rule. Nothing refused is sent."""

    TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    def rejected(self):
        return self.c.stats().events_rejected

    def test_arrived_carries_the_12_params(self):
        class S(str):
            pass
        c, tp = self.c, self.TP
        self.assertEqual(c.arrived(1, 10, priority=-7, t_ns=5), OK)
        self.assertEqual(c.arrived("r-2", 20, 64, 2, 6, "a", {"t": "v"},
                                   tokenmeter.MAX_PRIORITY, tp, "a=1,b=2"),
                         OK)
        self.assertEqual(c.arrived(3, 30, priority=tokenmeter.MIN_PRIORITY,
                                   tracestate="", t_ns=7), OK)
        self.assertEqual(c.arrived(4, 40, traceparent=S(tp), priority=0,
                                   t_ns=8), OK)  # a str subclass: slow path
        self.assertEqual(c.arrived(5, 50, priority=None, traceparent=None,
                                   tracestate=None, t_ns=9), OK)
        self.assertEqual(self.rejected(), 0)
        self.assertEqual(self.events(), [
            [1, 5, 1, 10, {"priority": -7}],
            [1, 6, "r-2", 20, {"max_tokens": 64, "n": 2, "lora": "a",
                               "labels": {"t": "v"},
                               "priority": 2**31 - 1, "traceparent": tp,
                               "tracestate": "a=1,b=2"}],
            [1, 7, 3, 30, {"priority": -2**31, "tracestate": ""}],
            [1, 8, 4, 40, {"priority": 0, "traceparent": tp}],
            [1, 9, 5, 50],
        ])

    def test_arrived_params_the_binding_refuses(self):
        c, tp = self.c, self.TP
        cases = [
            (ValueError, r"priority = 2147483648 is outside "
                         r"-2147483648 \.\. 2147483647",
             lambda: c.arrived(1, 1, priority=2**31)),
            (ValueError, r"priority = -2147483649",
             lambda: c.arrived(1, 1, priority=-2**31 - 1)),
            (TypeError, r"priority must be an int, not float",
             lambda: c.arrived(1, 1, priority=1.0)),
            (TypeError, r"priority must be an int, not bool",
             lambda: c.arrived("r", 1, priority=True)),
            (TypeError, r"traceparent must be a str, not bytes",
             lambda: c.arrived(1, 1, traceparent=tp.encode())),
            (TypeError, r"tracestate must be a str, not int",
             lambda: c.arrived("r", 1, tracestate=1)),
            (ValueError, r"prompt_tokens = -1",
             lambda: c.arrived(1, -1, priority=1)),
        ]
        for exc, pattern, call in cases:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    call()
        self.assertEqual(self.rejected(), 0)
        self.assertEqual(self.events(), [])

    def test_arrived_params_the_library_refuses(self):
        c, tp = self.c, self.TP
        with self.assertRaisesRegex(ValueError, r"request labels \['le'\]"):
            c.arrived(1, 1, labels={"le": "x"}, traceparent=tp)
        self.assertEqual(self.rejected(), 1)
        self.assertEqual(c.arrived(9, 1, traceparent=tp, t_ns=3), OK)
        self.assertEqual(self.events(),
                         [[1, 3, 9, 1, {"traceparent": tp}]])

    def test_arrived_leaves_malformed_trace_strings_out(self):
        """A trace string the library would not send (protocol.h's rules,
        and what cannot reach it: a NUL, a lone surrogate, any length) is
        left out and counted in fields_dropped, a malformed traceparent
        with its tracestate; the ARRIVED is sent all the same."""
        c, tp = self.c, self.TP
        zero_trace = "00-" + "0" * 32 + tp[35:]
        zero_parent = tp[:36] + "0" * 16 + tp[52:]
        bad_traceparents = [tp.upper(), "01" + tp[2:], "ff" + tp[2:],
                            zero_trace, zero_parent, tp[:54], tp + "0", "",
                            tp.replace("-", "_"), "é" * 28,
                            tp[:54] + "\0", tp + "\0", tp[:54] + "\ud800",
                            tp + "f" * 10000]
        for i, bad in enumerate(bad_traceparents):
            with self.subTest(traceparent=bad):
                self.assertEqual(c.arrived("r", 1, traceparent=bad,
                                           t_ns=100 + i), OK)
        bad_tracestates = ["Rojo=1", "rojo", "=v", "a=b=c", "a@=1",
                           ",".join(f"k{i}=v" for i in range(33)), "a=é",
                           "a=\x01", "a=1\0", "a=\udfff",
                           "a=" + "v" * 255, "a=" + "v" * 100000]
        for i, bad in enumerate(bad_tracestates):
            with self.subTest(tracestate=bad):
                self.assertEqual(c.arrived(i, 1, tracestate=bad, priority=3,
                                           t_ns=200 + i), OK)
        # A bad traceparent takes a good tracestate with it.
        self.assertEqual(c.arrived(7, 1, traceparent=tp.upper(),
                                   tracestate="a=1", t_ns=300), OK)
        self.assertEqual(self.rejected(), 0)
        st = c.stats()
        self.assertEqual(st.fields_dropped,
                         len(bad_traceparents) + len(bad_tracestates) + 2)
        self.assertEqual(self.events(),
                         [[1, 100 + i, "r", 1]
                          for i in range(len(bad_traceparents))] +
                         [[1, 200 + i, i, 1, {"priority": 3}]
                          for i in range(len(bad_tracestates))] +
                         [[1, 300, 7, 1]])

    def test_scheduled_with_its_info(self):
        c = self.c
        self.assertEqual(c.scheduled(1, 5, 512, 0), OK)
        self.assertEqual(c.scheduled("r", t_ns=6, cached_tokens=0,
                                     external_tokens=2**32 - 1), OK)
        self.assertEqual(c.scheduled(2, t_ns=7), OK)
        self.assertEqual(c.scheduled(3, t_ns=8, cached_tokens=None,
                                     external_tokens=None), OK)
        for exc, pattern, call in [
                (TypeError, r"cached_tokens and external_tokens together",
                 lambda: c.scheduled(1, cached_tokens=1)),
                (TypeError, r"together \(both or neither\)",
                 lambda: c.scheduled(1, external_tokens=1)),
                (ValueError, r"cached_tokens = -1 is outside",
                 lambda: c.scheduled(1, cached_tokens=-1, external_tokens=0)),
                (ValueError, r"external_tokens = 4294967296",
                 lambda: c.scheduled(1, 0, 0, 2**32)),
                (TypeError, r"cached_tokens must be an int, not str",
                 lambda: c.scheduled(1, 0, "1", 2)),
                (ValueError, r"0 bytes", lambda: c.scheduled("", 0, 1, 1))]:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    call()
        self.assertEqual(self.rejected(), 0)
        self.assertEqual(self.events(), [
            [3, 5, 1, {"cached_tokens": 512, "external_tokens": 0}],
            [3, 6, "r", {"cached_tokens": 0, "external_tokens": 2**32 - 1}],
            [3, 7, 2], [3, 8, 3],
        ])

    def test_admission_rejected(self):
        class S(str):
            pass
        c = self.c
        t = time.monotonic_ns()
        self.assertEqual(c.admission_rejected("queue_full"), OK)  # now
        self.assertEqual(c.admission_rejected("token cap", 7, t_ns=5), OK)
        self.assertEqual(c.admission_rejected("délai", rid="r-1", t_ns=6),
                         OK)
        self.assertEqual(c.admission_rejected(S("x" * 64), b"r", 7), OK)
        self.assertEqual(c.admission_rejected(reason="e", rid=None, t_ns=8),
                         OK)
        for exc, pattern, call in [
                (ValueError, r"reason must not be empty",
                 lambda: c.admission_rejected("")),
                (ValueError, r"65 bytes of UTF-8; the limit is 64",
                 lambda: c.admission_rejected("x" * 65)),
                (ValueError, r"65 bytes", lambda: c.admission_rejected(
                    "é" * 32 + "x")),
                (TypeError, r"reason must be a str or a register_value\(\) "
                            r"id, not bytes",
                 lambda: c.admission_rejected(b"full")),
                (TypeError, r"reason must be a str or a register_value\(\) "
                            r"id, not NoneType",
                 lambda: c.admission_rejected(None)),
                (TypeError, r"reason must be a str or a register_value\(\) "
                            r"id, not bool",
                 lambda: c.admission_rejected(True)),
                (ValueError, r"reason .* contains a NUL",
                 lambda: c.admission_rejected("a\0b")),
                (ValueError, r"0 bytes", lambda: c.admission_rejected("x",
                                                                     "")),
                (ValueError, r"outside 0 \.\. 2\*\*64-1",
                 lambda: c.admission_rejected("x", -1)),
                (ValueError, r"t_ns", lambda: c.admission_rejected(
                    "x", t_ns=-1))]:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    call()
        self.assertEqual(self.rejected(), 0)
        # Control characters: protocol.h's rule, applied by the library.
        for bad in ("tab\there", "new\nline", "\x7f", "c1 \x85"):
            with self.subTest(reason=bad):
                with self.assertRaisesRegex(
                        ValueError, r"contains the control character U\+00"
                                    r".*counted as rejected"):
                    c.admission_rejected(bad, rid=1)
        self.assertEqual(self.rejected(), 4)
        events = self.events()
        self.assertGreaterEqual(events[0][1], t)
        events[0][1] = 0
        self.assertEqual(events, [
            [9, 0, "queue_full"], [9, 5, "token cap", 7],
            [9, 6, "délai", "r-1"], [9, 7, "x" * 64, "r"], [9, 8, "e"],
        ])

    def test_kv_transfer(self):
        class S(str):
            pass
        c = self.c
        self.assertEqual(c.kv_transfer(1, "send", 100, t_ns=200), OK)
        self.assertEqual(c.kv_transfer("r", "recv", 200, 200, 2**48 - 1, 0,
                                       False, "timeout", "nixl"), OK)
        self.assertEqual(c.kv_transfer(2, S("send"), start_ns=0, t_ns=300,
                                       bytes=5, connector=S("mooncake")), OK)
        now = time.monotonic_ns()
        self.assertEqual(c.kv_transfer(3, "recv", now, ok=True,
                                       reason="é"), OK)
        for exc, pattern, call in [
                (ValueError, r"role 'sned' is not one of 'send', 'recv'",
                 lambda: c.kv_transfer(1, "sned", 1)),
                (TypeError, r"role must be 'send' or 'recv', not int",
                 lambda: c.kv_transfer(1, 0, 1)),
                (ValueError, r"start_ns = 11 is after the event time "
                             r"t_ns = 10",
                 lambda: c.kv_transfer(1, "send", 11, t_ns=10)),
                (ValueError, r"start_ns .* = -1 is outside",
                 lambda: c.kv_transfer(1, "send", -1)),
                (ValueError, r"bytes = 281474976710656 is outside "
                             r"0 \.\. 281474976710655",
                 lambda: c.kv_transfer(1, "send", 1, bytes=2**48)),
                (ValueError, r"blocks = -1",
                 lambda: c.kv_transfer(1, "send", 1, blocks=-1)),
                (TypeError, r"bytes must be an int, not float",
                 lambda: c.kv_transfer(1, "send", 1, bytes=1.0)),
                (TypeError, r"ok must be a bool, not int",
                 lambda: c.kv_transfer(1, "send", 1, ok=0)),
                (ValueError, r"reason must not be empty",
                 lambda: c.kv_transfer(1, "send", 1, reason="")),
                (ValueError, r"connector 'x+' is 65 bytes",
                 lambda: c.kv_transfer(1, "send", 1, connector="x" * 65)),
                (TypeError, r"connector must be a str",
                 lambda: c.kv_transfer(1, "send", 1, connector=b"nixl")),
                (ValueError, r"129 bytes",
                 lambda: c.kv_transfer("x" * 129, "send", 1)),
                (TypeError, r"missing 1 required positional argument: "
                            r"'start_ns'",
                 lambda: c.kv_transfer(1, "send"))]:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    call()
        self.assertEqual(self.rejected(), 0)
        # What only the library finds: a start after now (t_ns 0), a
        # control character.
        with self.assertRaisesRegex(ValueError, r"is after now .*counted"):
            c.kv_transfer(1, "send", time.monotonic_ns() + 60 * 10**9)
        with self.assertRaisesRegex(ValueError, r"connector .* control "
                                                r"character U\+0009"):
            c.kv_transfer(1, "send", 1, reason="ok", connector="a\tb")
        with self.assertRaisesRegex(ValueError, r"reason .* U\+001B"):
            c.kv_transfer("r", "recv", 1, t_ns=2, reason="\x1b[0m")
        self.assertEqual(self.rejected(), 3)
        events = self.events()
        self.assertGreaterEqual(events[3][1], now)
        events[3][1] = 0
        self.assertEqual(events, [
            [10, 200, 1, {"role": "send", "start": 100}],
            [10, 200, "r", {"role": "recv", "start": 200,
                            "bytes": 2**48 - 1, "blocks": 0, "ok": False,
                            "reason": "timeout", "connector": "nixl"}],
            [10, 300, 2, {"role": "send", "start": 0, "bytes": 5,
                          "connector": "mooncake"}],
            [10, 0, 3, {"role": "recv", "start": now, "reason": "é"}],
        ])

    def test_registered_values(self):
        """register_value() (tm_register_value()): an id for a reason or
        connector, passed in place of the str; the wire is the same."""
        import enum
        c = self.c
        full = c.register_value("queue_full")
        nixl = c.register_value("nixl")
        self.assertEqual((full, nixl), (1, 2))
        self.assertEqual(c.register_value("queue_full"), full)  # again
        self.assertEqual(tokenmeter.MAX_VALUE_IDS, 255)
        for exc, pattern, call in [
                (ValueError, r"value must not be empty",
                 lambda: c.register_value("")),
                (ValueError, r"65 bytes",
                 lambda: c.register_value("x" * 65)),
                (TypeError, r"value must be a str, not int",
                 lambda: c.register_value(1)),
                (ValueError, r"value .* contains the control character "
                             r"U\+000A",
                 lambda: c.register_value("a\nb"))]:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    call()
        self.assertEqual(self.rejected(), 0)  # no event was made

        class Ids(enum.IntEnum):
            FULL = full

        self.assertEqual(c.admission_rejected(full, t_ns=5), OK)
        self.assertEqual(c.admission_rejected(Ids.FULL, 7, t_ns=6), OK)
        self.assertEqual(c.admission_rejected(full, rid="r-1", t_ns=7), OK)
        self.assertEqual(c.kv_transfer(1, "send", 100, 200, 4096, 2,
                                       connector=nixl), OK)
        self.assertEqual(c.kv_transfer("r", "recv", 100, 300, ok=False,
                                       reason=full, connector="mooncake"),
                         OK)
        for exc, pattern, call in [
                (ValueError, r"reason id = 0 is outside 1 \.\. 255",
                 lambda: c.admission_rejected(0)),
                (ValueError, r"connector id = 256 is outside",
                 lambda: c.kv_transfer(1, "send", 1, connector=256))]:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    call()
        self.assertEqual(self.rejected(), 0)
        # An id this client did not return: the library refuses it.
        with self.assertRaisesRegex(ValueError, r"reason id 9 was not "
                                                r"returned by this client's "
                                                r"register_value\(\).*"
                                                r"counted as rejected"):
            c.admission_rejected(9, rid=1)
        with self.assertRaisesRegex(ValueError, r"connector id 200 must be "
                                                r"returned.*counted"):
            c.kv_transfer(1, "send", 1, t_ns=2, connector=200)
        self.assertEqual(self.rejected(), 2)
        self.assertEqual(self.events(), [
            [9, 5, "queue_full"], [9, 6, "queue_full", 7],
            [9, 7, "queue_full", "r-1"],
            [10, 200, 1, {"role": "send", "start": 100, "bytes": 4096,
                          "blocks": 2, "connector": "nixl"}],
            [10, 300, "r", {"role": "recv", "start": 100, "ok": False,
                            "reason": "queue_full",
                            "connector": "mooncake"}],
        ])

    def test_register_value_when_full_and_after_close(self):
        """255 values registered: NOMEM; the same value again still its id;
        after close(): INVALID. No event is made."""
        c = self.c
        ids = [c.register_value(f"v{i}") for i in range(255)]
        self.assertEqual(ids, list(range(1, 256)))
        self.assertEqual(tokenmeter.NOMEM, -3)
        self.assertEqual(c.register_value("one-more"), tokenmeter.NOMEM)
        self.assertEqual(c.register_value("v7"), 8)
        self.assertEqual(self.rejected(), 0)
        c.close()
        self.assertEqual(c.register_value("v7"), INVALID)

    def test_arrived_checks_prompt_tokens_first(self):
        # Both bindings name the same argument when several are bad.
        for kw in ({}, {"priority": 1}):
            with self.subTest(**kw):
                with self.assertRaisesRegex(ValueError, r"prompt_tokens"):
                    self.c.arrived(1, -1, max_tokens=-1, n=-1, **kw)

    def test_sleep_state(self):
        class S(str):
            pass
        c = self.c
        self.assertEqual(c.sleep_state("paused", "offloaded", "released",
                                       t_ns=1), OK)
        self.assertEqual(c.sleep_state(weights="discarded", t_ns=2), OK)
        self.assertEqual(c.sleep_state(scheduler=S("running"),
                                       kv_cache="resident", t_ns=3), OK)
        self.assertEqual(c.sleep_state(weights="resident", t_ns=4), OK)
        self.assertEqual(c.sleep_state(t_ns=5), OK)  # nothing: an empty map
        for exc, pattern, call in [
                (ValueError, r"scheduler 'asleep' is not one of 'running', "
                             r"'paused'",
                 lambda: c.sleep_state("asleep")),
                (ValueError, r"weights 'released' is not one of 'resident', "
                             r"'offloaded', 'discarded'",
                 lambda: c.sleep_state(weights="released")),
                (ValueError, r"kv_cache 'offloaded' is not one of",
                 lambda: c.sleep_state(kv_cache="offloaded")),
                (TypeError, r"kv_cache must be None or a str, not int",
                 lambda: c.sleep_state(kv_cache=1)),
                (TypeError, r"unexpected keyword argument 'state'",
                 lambda: c.sleep_state(state="paused")),
                (ValueError, r"t_ns", lambda: c.sleep_state(t_ns=-1))]:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    call()
        self.assertEqual(self.rejected(), 0)
        self.assertEqual(self.events(), [
            [11, 1, {"scheduler": "paused", "weights": "offloaded",
                     "kv_cache": "released"}],
            [11, 2, {"weights": "discarded"}],
            [11, 3, {"scheduler": "running", "kv_cache": "resident"}],
            [11, 4, {"weights": "resident"}],
            [11, 5, {}],
        ])

    def test_step_waiting_deferred(self):
        c = self.c
        self.assertEqual(c.step(waiting=3, waiting_deferred=3, t_ns=1), OK)
        self.assertEqual(c.step(running=1, waiting=0, waiting_deferred=0,
                                t_ns=2), OK)
        for exc, pattern, call in [
                (ValueError, r"waiting_deferred needs waiting",
                 lambda: c.step(waiting_deferred=1)),
                (ValueError, r"waiting_deferred = 4 is above waiting = 3",
                 lambda: c.step(waiting=3, waiting_deferred=4)),
                (ValueError, r"waiting_deferred = -1 is outside",
                 lambda: c.step(waiting=3, waiting_deferred=-1)),
                (TypeError, r"waiting_deferred must be an int",
                 lambda: c.step(waiting=3, waiting_deferred=1.5))]:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    call()
        self.assertEqual(self.rejected(), 0)
        self.assertEqual(self.events(), [
            [7, 1, {"waiting": 3, "waiting_deferred": 3}],
            [7, 2, {"running": 1, "waiting": 0, "waiting_deferred": 0}],
        ])

    def test_after_close_does_nothing(self):
        c = self.c
        c.close()
        self.assertEqual(c.arrived(1, 1, priority=1, traceparent=self.TP),
                         INVALID)
        self.assertEqual(c.scheduled(1, cached_tokens=1, external_tokens=1),
                         INVALID)
        self.assertEqual(c.admission_rejected("x"), INVALID)
        self.assertEqual(c.admission_rejected("x\t"), INVALID)
        self.assertEqual(c.kv_transfer(1, "send", 1), INVALID)
        self.assertEqual(c.sleep_state("paused"), INVALID)
        self.assertEqual(c.step(waiting=1, waiting_deferred=1), INVALID)


class Protocol13(RecordedClient):
    """The protocol 1.3 calls (request_summary, latencies), as the bytes on
    the socket show them, their argument checks (nothing refused is sent),
    and what a real daemon makes of them."""

    def test_request_summary(self):
        c = self.c
        self.assertEqual(c.request_summary(
            "length", prompt_tokens=812, generation_tokens=256,
            cached_tokens=512, max_tokens=256, n=2, ttft_ns=41 * MS,
            queue_ns=5, prefill_ns=6, decode_ns=7, inference_ns=8,
            e2e_ns=(1 << 48) - 1, tpot_ns=9, rid=7, t_ns=1,
            max_generation_tokens=300), OK)
        self.assertEqual(c.request_summary(
            FinishReason.ABORT, prompt_tokens=0, generation_tokens=0,
            t_ns=2), OK)
        self.assertEqual(c.request_summary(
            "error", prompt_tokens=3, generation_tokens=1, rid="req-1",
            e2e_ns=0, t_ns=3), OK)
        self.assertEqual(c.stats().events_rejected, 0)
        self.assertEqual(self.events(), [
            [12, 1, "length", {
                "prompt_tokens": 812, "generation_tokens": 256,
                "cached_tokens": 512, "max_tokens": 256, "n": 2,
                "max_generation_tokens": 300, "ttft": 41 * MS, "queue": 5,
                "prefill": 6, "decode": 7, "inference": 8,
                "e2e": (1 << 48) - 1, "tpot": 9}, 7],
            [12, 2, "abort", {"prompt_tokens": 0, "generation_tokens": 0}],
            [12, 3, "error", {"prompt_tokens": 3, "generation_tokens": 1,
                              "e2e": 0}, "req-1"],
        ])

    def test_request_summary_refusals(self):
        c = self.c
        ok = {"prompt_tokens": 5, "generation_tokens": 1}
        for exc, pattern, kw in [
                (ValueError, r"finish reason 'done'", {"reason": "done"}),
                (ValueError, r"prompt_tokens = 4294967296 is outside",
                 {"prompt_tokens": 1 << 32}),
                (TypeError, r"generation_tokens must be an int",
                 {"generation_tokens": 1.0}),
                (ValueError, r"cached_tokens = 6 is above prompt_tokens = 5",
                 {"cached_tokens": 6}),
                (ValueError, r"ttft_ns = 281474976710656 is outside",
                 {"ttft_ns": 1 << 48}),
                (ValueError, r"e2e_ns = -1 is outside", {"e2e_ns": -1}),
                (TypeError, r"tpot_ns must be an int", {"tpot_ns": 0.5}),
                (ValueError, r"n = -1", {"n": -1}),
                (ValueError, r"request id", {"rid": ""}),
                (ValueError, r"t_ns", {"t_ns": -1}),
                (TypeError, r"unexpected keyword argument 'ttft'",
                 {"ttft": 1})]:
            args = dict(ok)
            args.update(kw)
            reason = args.pop("reason", "stop")
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    c.request_summary(reason, **args)
        with self.assertRaisesRegex(TypeError, "generation_tokens"):
            c.request_summary("stop", prompt_tokens=1)
        self.assertEqual(c.stats().events_rejected, 0)
        self.assertEqual(self.events(), [])

    def test_latencies(self):
        c = self.c
        self.assertEqual(c.latencies([41 * MS, 1], [9 * MS, 0], t_ns=1), OK)
        self.assertEqual(c.latencies(itl_ns=array("Q", [5]), t_ns=2,
                                     prompt_tokens=812, generation_tokens=3,
                                     preemptions=1), OK)
        self.assertEqual(c.latencies(t_ns=3, generation_tokens=0), OK)
        self.assertEqual(c.latencies((), (), 4), OK)
        # 1500 values: two events of at most 1024, the counts on the first.
        ttft = list(range(1000))
        itl = list(range(500))
        self.assertEqual(c.latencies(ttft, itl, 5, preemptions=2), OK)
        events = self.events()
        self.assertEqual(events[:4], [
            [13, 1, [41 * MS, 1], [9 * MS, 0]],
            [13, 2, [], [5], {"prompt_tokens": 812, "generation_tokens": 3,
                              "preemptions": 1}],
            [13, 3, [], [], {"generation_tokens": 0}],
            [13, 4, [], []],
        ])
        self.assertEqual(events[4:], [
            [13, 5, ttft, itl[:24], {"preemptions": 2}],
            [13, 5, [], itl[24:]],
        ])

    def test_latencies_refusals(self):
        c = self.c
        for exc, pattern, call in [
                (ValueError, r"ttft_ns value = 281474976710656 is outside",
                 lambda: c.latencies([1 << 48])),
                (ValueError, r"itl_ns value = -1 is outside",
                 lambda: c.latencies([], [1, -1])),
                (TypeError, r"itl_ns value must be an int",
                 lambda: c.latencies([], [0.5])),
                (TypeError, r"ttft_ns must be a sequence of ints",
                 lambda: c.latencies(5)),
                (ValueError, r"preemptions = 4294967296",
                 lambda: c.latencies(preemptions=1 << 32)),
                (TypeError, r"unexpected keyword argument 'ttft'",
                 lambda: c.latencies(ttft=[1]))]:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    call()
        self.assertEqual(c.stats().events_rejected, 0)
        self.assertEqual(self.events(), [])

    def test_after_close_does_nothing(self):
        self.c.close()
        self.assertEqual(self.c.request_summary(
            "stop", prompt_tokens=1, generation_tokens=1), INVALID)
        self.assertEqual(self.c.latencies([1], [2]), INVALID)

    def test_the_daemon_observes_them(self):
        d = tu.Daemon("--log-interval", "0").start()
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        c = tokenmeter.Client(socket_path=d.sock, engine="vllm", model="m",
                              instance="e0", flush_interval=0.002)
        self.addCleanup(c.close)
        c.request_summary("stop", prompt_tokens=812, generation_tokens=256,
                          max_tokens=1000, n=2, ttft_ns=41 * MS,
                          queue_ns=5 * MS, prefill_ns=36 * MS,
                          decode_ns=2550 * MS, inference_ns=2586 * MS,
                          e2e_ns=2600 * MS, tpot_ns=10 * MS,
                          max_generation_tokens=300, cached_tokens=12)
        c.request_summary("abort", prompt_tokens=7, generation_tokens=0,
                          rid="r-2", e2e_ns=100 * MS)
        c.latencies([41 * MS, 60 * MS], [8 * MS, 9 * MS, 10 * MS],
                    prompt_tokens=819, generation_tokens=256, preemptions=1)
        labels = {"model_name": "m", "engine": "e0"}
        d.wait_value("vllm:request_success_total", 1,
                     finished_reason="abort", **labels)
        v = d.samples()

        def value(name, **extra):
            return v.value("vllm:" + name, **labels, **extra)
        self.assertEqual(value("request_success_total",
                               finished_reason="stop"), 1)
        for name, count, total in [
                ("e2e_request_latency_seconds", 2, 2.7),
                ("request_queue_time_seconds", 1, 0.005),
                ("request_prefill_time_seconds", 1, 0.036),
                ("request_decode_time_seconds", 1, 2.55),
                ("request_inference_time_seconds", 1, 2.586),
                ("request_time_per_output_token_seconds", 1, 0.01),
                # one from the summary, two from the latencies
                ("time_to_first_token_seconds", 3, 0.142),
                ("inter_token_latency_seconds", 3, 0.027),
                ("request_prompt_tokens", 2, 819),
                ("request_generation_tokens", 2, 256),
                ("request_params_max_tokens", 1, 1000),
                ("request_params_n", 1, 2),
                ("request_max_num_generation_tokens", 1, 300),
                ("request_prefill_kv_computed_tokens", 1, 800)]:
            with self.subTest(name=name):
                self.assertEqual(value(name + "_count"), count)
                self.assertAlmostEqual(value(name + "_sum"), total,
                                       delta=1e-9)
        self.assertEqual(value("prompt_tokens_total"), 819)
        self.assertEqual(value("generation_tokens_total"), 256)
        self.assertEqual(value("num_preemptions_total"), 1)
        self.assertEqual(value("request_num_preemptions_count"), 0)
        self.assertEqual(v.value("tokenmeter_tracked_requests"), 0)
        self.assertEqual(v.value("tokenmeter_ingest_events_total",
                                 kind="request_summary"), 2)
        self.assertEqual(v.value("tokenmeter_ingest_events_total",
                                 kind="latencies"), 1)
        self.assertEqual(v.sum("tokenmeter_ingest_errors_total"), 0)


class Buffers(RecordedClient):
    """tokens_batch() and expert_load() read buffers of integers (array,
    numpy, memoryview, bytes of native uint64s, ctypes arrays) in place or
    item by item, and refuse a buffer of another kind clearly; the call
    forms the C fast path hands to the slow path come out the same. As the
    bytes on the socket show them."""

    def test_backend_is_the_one_asked_for(self):
        wanted = os.environ.get("TOKENMETER_BACKEND") or "ctypes"
        self.assertEqual(tokenmeter.backend, wanted)

    def test_tokens_batch_every_id_buffer(self):
        import ctypes
        c = self.c
        ids = [3, 2**64 - 1, 0]
        raw = array("Q", ids).tobytes()
        forms = [
            array("Q", ids), array("L", ids), raw, bytearray(raw),
            memoryview(raw), memoryview(bytearray(1) + raw)[1:],
            (ctypes.c_uint64 * 3)(*ids), tuple(ids), ids,
        ]
        for t, rids in enumerate(forms, start=1):
            with self.subTest(t=t, kind=type(rids).__name__):
                self.assertEqual(c.tokens_batch(rids, t_ns=t), 3)
        small = [5, 6]
        for t, rids in enumerate([array("q", small), array("I", small),
                                  array("H", small), range(5, 7)],
                                 start=100):
            with self.subTest(t=t):
                self.assertEqual(c.tokens_batch(rids, t_ns=t), 2)
        # Token counts from buffers too; 0 skips the id.
        self.assertEqual(c.tokens_batch(array("Q", small),
                                        n=array("I", [0, 7]), t_ns=200), 1)
        self.assertEqual(c.tokens_batch(small, n=array("H", [2, 3]),
                                        t_ns=201), 2)
        self.assertEqual(c.tokens_batch(["a", "b"], n=(1, 2), t_ns=202), 2)
        self.assertEqual(c.stats().events_rejected, 0)
        events = self.events()
        expected = []
        for t in range(1, len(forms) + 1):
            expected += [[4, t, rid, 1] for rid in ids]
        for t in range(100, 104):
            expected += [[4, t, 5, 1], [4, t, 6, 1]]
        expected += [[4, 200, 6, 7], [4, 201, 5, 2], [4, 201, 6, 3],
                     [4, 202, "a", 1], [4, 202, "b", 2]]
        self.assertEqual(events, expected)

    def test_numpy_buffers(self):
        try:
            import numpy as np
        except ImportError:
            self.skipTest("numpy is not installed")
        c = self.c
        self.assertEqual(c.tokens_batch(np.array([1, 2], np.uint64), t_ns=1),
                         2)
        self.assertEqual(c.tokens_batch(np.array([3, 4], np.int64), t_ns=2),
                         2)
        self.assertEqual(c.tokens_batch(np.arange(10, dtype=np.uint64)[::4],
                                        t_ns=3), 3)  # strided: 0, 4, 8
        self.assertEqual(c.tokens_batch(np.array([5], np.int32),
                                        n=np.array([9], np.uint32), t_ns=4),
                         1)
        for bad in (np.array([1.0]), np.zeros((2, 2), np.uint64)):
            with self.assertRaisesRegex(TypeError, r"rids: a buffer of "
                                        r"format '\w+', itemsize 8"):
                c.tokens_batch(bad)
        with self.assertRaisesRegex(ValueError, r"request ids must be "
                                    r"0 \.\. 2\*\*64-1"):
            c.tokens_batch(np.array([1, -1], np.int64))
        self.assertEqual(c.stats().events_rejected, 0)
        self.assertEqual(self.events(), [
            [4, 1, 1, 1], [4, 1, 2, 1], [4, 2, 3, 1], [4, 2, 4, 1],
            [4, 3, 0, 1], [4, 3, 4, 1], [4, 3, 8, 1], [4, 4, 5, 9]])

    def test_wrong_buffers_are_refused_clearly(self):
        c = self.c
        cases = [
            (TypeError, r"rids: a buffer of format 'd', itemsize 8, 1 "
                        r"dimension\(s\): it must be one-dimensional with "
                        r"integer items", lambda: c.tokens_batch(
                            array("d", [1.0]))),
            (TypeError, r"format 'f', itemsize 4",
             lambda: c.tokens_batch(memoryview(array("f", [1.0])))),
            (ValueError, r"rids given as bytes: 7 bytes is not a whole "
                         r"number of uint64s",
             lambda: c.tokens_batch(b"1234567")),
            (ValueError, r"request ids must be 0 \.\. 2\*\*64-1",
             lambda: c.tokens_batch(array("q", [5, -1]))),
            (ValueError, r"token counts n must be 0 \.\. 2\*\*32-1",
             lambda: c.tokens_batch([1], n=array("Q", [2**32]))),
            (TypeError, r"n", lambda: c.tokens_batch([1],
                                                     n=array("d", [1.0]))),
            (ValueError, r"n has 2 entries for 1 request ids",
             lambda: c.tokens_batch(array("Q", [1]), n=array("I", [1, 1]))),
            (TypeError, r"rids must be a sequence of request ids, not "
                        r"generator",
             lambda: c.tokens_batch(i for i in [1])),
            (TypeError, r"counts: a buffer of format 'd'",
             lambda: c.expert_load(0, array("d", [1.0]))),
        ]
        for exc, pattern, call in cases:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    call()
        # A refused or used buffer is released: the array can grow again.
        for call in (c.tokens_batch, lambda a: c.expert_load(0, a)):
            a = array("d", [1.0])
            with self.assertRaises(TypeError):
                call(a)
            a.append(2.0)
        ids = array("Q", [1, 2**40])
        self.assertEqual(c.tokens_batch(ids, n=array("I", [0, 0])), 0)
        ids.append(3)
        self.assertEqual(c.stats().events_rejected, 0)
        self.assertEqual(self.events(), [])

    def test_calls_leak_no_memory(self):
        # Every path, fast, slow and refused, many times over: what Python
        # allocates (PyMem, objects: tracemalloc sees both) comes back.
        import tracemalloc
        c = tokenmeter.Client(socket_path=os.path.join(self.dir, "absent"),
                              model="m", close_timeout=0)
        self.addCleanup(c.close)
        big = list(range(1000))  # past the stack buffer: PyMem
        big_str = [f"r{i}" for i in range(700)]  # past 8 KiB packed
        tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

        def rounds(k):
            for i in range(k):
                c.tokens(i)
                c.tokens(f"s{i % 7}", 2, t_ns=5)
                c.arrived(i, 3, lora="l", labels={"a": "b"})
                c.finished(i, FinishReason.STOP)
                c.step(running=1, kv_usage=0.5, spec_accepted_per_pos=[1])
                c.tokens_batch(big, n=2)
                c.tokens_batch(big_str)
                c.tokens_batch(array("Q", big), n=array("I", big))
                c.expert_load(1, big[:256])
                c.arrived(i, 3, priority=-1, traceparent=tp, tracestate="a=1")
                c.scheduled(i, cached_tokens=1, external_tokens=2)
                c.admission_rejected("queue_full", rid=f"r{i % 5}")
                c.kv_transfer(i, "send", 1, t_ns=2, bytes=3, ok=False,
                              reason="timeout", connector="nixl")
                c.sleep_state("paused", weights="offloaded")
                c.step(waiting=2, waiting_deferred=1)
                for bad in (lambda: c.tokens_batch(array("d", [1.0])),
                            lambda: c.tokens(-1),
                            lambda: c.tokens_batch(["", "x"]),
                            lambda: c.arrived(1, 1, labels={"le": "x"}),
                            lambda: c.arrived(1, 1, traceparent="00-x"),
                            lambda: c.admission_rejected("a\tb", rid=1),
                            lambda: c.kv_transfer(1, "send", 1,
                                                  connector="\x01"),
                            lambda: c.kv_transfer(1, "sned", 1),
                            lambda: c.sleep_state("asleep"),
                            lambda: c.step(waiting_deferred=1)):
                    try:
                        bad()
                    except (TypeError, ValueError):
                        pass
        import gc
        rounds(50)  # warm caches (interned strs, the thread's buffer)
        tracemalloc.start()
        try:
            rounds(10)
            gc.collect()  # the exceptions' cycles, whenever gc ran
            before = tracemalloc.get_traced_memory()[0]
            rounds(300)
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        self.assertLess(after - before, 64 * 1024, (before, after))

    def test_call_errors_name_the_public_method(self):
        c = self.c
        for pattern, call in (
                (r"^Client\.tokens\(\) got an unexpected keyword argument "
                 r"'foo'$", lambda: c.tokens(1, foo=2)),
                (r"^Client\.step\(\) takes 1 positional argument but 2 "
                 r"were given$", lambda: c.step(1)),
                (r"^Client\.arrived\(\) missing 2 required positional "
                 r"arguments", lambda: c.arrived()),
                (r"^Client\.tokens_batch\(\) got multiple values for "
                 r"argument 'rids'$", lambda: c.tokens_batch([1], rids=[1]))):
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(TypeError, pattern):
                    call()

    def test_slow_forms_send_what_the_fast_ones_do(self):
        # Arguments the C fast path hands on (keywords made at run time, int
        # and str subclasses, FinishReason, bytes ids) give the same events.
        class Rid(str):
            pass
        c = self.c
        rid_kw = "".join(["r", "id"])  # not interned
        self.assertEqual(c.tokens(**{rid_kw: 5, "t_ns": 1}), OK)
        self.assertEqual(c.tokens(Rid("s"), n=True + 1, t_ns=2), OK)
        self.assertEqual(c.finished(b"b", FinishReason.ABORT, t_ns=3), OK)
        self.assertEqual(c.queued(rid=7, t_ns=4), OK)
        self.assertEqual(c.arrived(8, 1, labels={Rid("tenant"): Rid("x")},
                                   t_ns=5), OK)
        self.assertEqual(c.step(**{"".join(["run", "ning"]): 2}, t_ns=6), OK)
        self.assertEqual(self.events(), [
            [4, 1, 5, 1], [4, 2, "s", 2], [5, 3, "b", "abort"], [2, 4, 7],
            [1, 5, 8, 1, {"labels": {"tenant": "x"}}], [7, 6, {"running": 2}],
        ])


class TwoProcessExample(DaemonTest):
    def test_ttft_joined_across_processes(self):
        # An engine of its own, run as the reference engine is (it takes
        # --socket where that takes --metrics-socket).
        example = tu.Engine("--requests", "24", binary=EXAMPLE,
                            launcher=[sys.executable], socket=self.d.sock,
                            socket_flag="--socket", dir=self.d.dir,
                            name="two_process")
        self.addCleanup(example.cleanup)
        r = example.start().report(timeout=60)
        self.assertIn("24 requests", example.read_output())
        self.assertEqual(len(r["arrived_ns"]), 24)
        expected = sum(r["first_token_ns"][rid] - t
                       for rid, t in r["arrived_ns"].items()) / 1e9
        core = dict(model_name="example-model", engine="core-0")
        front = dict(model_name="example-model", engine="frontend")
        d = self.d
        d.wait_value("my_engine:time_to_first_token_seconds_count", 24,
                     **core)
        self.assertAlmostEqual(
            d.value("my_engine:time_to_first_token_seconds_sum", **core),
            expected, delta=1e-9)
        self.assertEqual(
            d.value("my_engine:time_to_first_token_seconds_count", **front),
            0)
        # ARRIVED came from the frontend's connection, the rest from the
        # engine's: the prompt tokens are counted at the join, on the core.
        self.assertGreater(d.value("my_engine:prompt_tokens_total", **core),
                           0)
        self.assertEqual(d.value("tokenmeter_ingest_events_total",
                                 kind="arrived"), 24)
        self.assertEqual(d.value("my_engine:request_success_total",
                                 finished_reason="length", **core), 24)
        self.assertEqual(r["frontend_stats"]["events_sent"], 24)
        self.assertEqual(r["frontend_stats"]["events_dropped"], 0)
        self.assertEqual(d.value("tokenmeter_incomplete_intervals_total",
                                 interval="time_to_first_token"), 0)
        self.assertEqual(d.value("tokenmeter_negative_intervals_total",
                                 interval="time_to_first_token"), 0)


class Library(unittest.TestCase):
    """Finding libtokenmeter: each place, and the error when none has it."""

    def import_in_subprocess(self, env_lib, pythonpath=None):
        env = {k: v for k, v in os.environ.items()
               if k not in ("TOKENMETER_LIBRARY", "LD_LIBRARY_PATH",
                            "TOKENMETER_BACKEND")}
        if env_lib is not None:
            env["TOKENMETER_LIBRARY"] = env_lib
        env["PYTHONPATH"] = pythonpath or os.path.dirname(PACKAGE)
        return subprocess.run(
            [sys.executable, "-c",
             "import tokenmeter; print(tokenmeter.library_path)"],
            env=env, capture_output=True, text=True, timeout=30)

    def system_has_library(self):
        p = subprocess.run(
            [sys.executable, "-c",
             "import ctypes; ctypes.CDLL('libtokenmeter.so.0')"],
            env={k: v for k, v in os.environ.items()
                 if k != "LD_LIBRARY_PATH"}, capture_output=True)
        return p.returncode == 0

    def test_missing_library_names_all_three_places(self):
        if self.system_has_library():
            self.skipTest("libtokenmeter is installed on this system")
        p = self.import_in_subprocess(None)
        self.assertNotEqual(p.returncode, 0)
        err = p.stderr
        self.assertIn("tokenmeter.LibraryNotFoundError: libtokenmeter "
                      "not found", err)
        self.assertIn("1. $TOKENMETER_LIBRARY: not set", err)
        self.assertIn(f"2. the package folder {PACKAGE}: no "
                      "libtokenmeter.so* there", err)
        self.assertIn("3. the system library path", err)
        self.assertIn("libtokenmeter.so.0: cannot open shared object file",
                      err)

    def test_error_is_an_import_error(self):
        self.assertTrue(issubclass(tokenmeter.LibraryNotFoundError,
                                   ImportError))

    def test_wrong_env_path_is_an_error_not_a_fallback(self):
        p = self.import_in_subprocess("/nonexistent/libtokenmeter.so")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("1. $TOKENMETER_LIBRARY=/nonexistent/libtokenmeter.so:"
                      " /nonexistent/libtokenmeter.so: cannot open", p.stderr)
        self.assertIn("2. the package folder", p.stderr)
        self.assertIn("not tried ($TOKENMETER_LIBRARY is set)", p.stderr)
        self.assertIn("3. the system library path: not tried", p.stderr)

    def test_library_without_the_batch_calls_is_refused(self):
        libc = "/lib/x86_64-linux-gnu/libc.so.6"
        if not os.path.exists(libc):
            self.skipTest("no " + libc)
        p = self.import_in_subprocess(libc)
        self.assertIn("lacks tm_tokens_batch, tm_tokens_batch_str", p.stderr)

    def test_env_var_and_package_folder(self):
        p = self.import_in_subprocess(LIBRARY)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), LIBRARY)
        with tempfile.TemporaryDirectory() as tmp:
            pkg = os.path.join(tmp, "tokenmeter")
            shutil.copytree(PACKAGE, pkg,
                            ignore=shutil.ignore_patterns("__pycache__"))
            shutil.copy(LIBRARY, os.path.join(pkg, "libtokenmeter.so.0"))
            p = self.import_in_subprocess(None, pythonpath=tmp)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stdout.strip(),
                             os.path.join(pkg, "libtokenmeter.so.0"))


if __name__ == "__main__":
    tu.main()
