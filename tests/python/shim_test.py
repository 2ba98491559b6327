#!/usr/bin/python3
"""The Python shim (client_lib/python/tokenmeter) against the real
tokenmeterd: every event kind reaches the series it should, to the
nanosecond where the test sets the times; bad arguments raise before
anything is sent; transport trouble never raises; the two-process example's
time to first token is joined across its processes; a missing library gives
an error naming every place tried.

Environment (tests/python/meson.build sets it): TOKENMETERD, the daemon;
TOKENMETER_LIBRARY, the built libtokenmeter.so; PYTHONPATH with
client_lib/python. The daemon harness is tests/testutil.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from array import array

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
        ]
        for exc, pattern, call in cases:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(exc, pattern):
                    call()
        # The string batch's malformed cases reach the library (its whole
        # batch is rejected there, then diagnosed); the rest do not.
        self.assertEqual(self.c.stats().events_rejected, 2 + 2 + 1)

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


class TwoProcessExample(DaemonTest):
    def test_ttft_joined_across_processes(self):
        report = os.path.join(self.d.dir, "report.json")
        p = subprocess.run(
            [sys.executable, EXAMPLE, "--socket", self.d.sock,
             "--requests", "24", "--report", report],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("24 requests", p.stdout)
        with open(report) as f:
            r = json.load(f)
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
               if k not in ("TOKENMETER_LIBRARY", "LD_LIBRARY_PATH")}
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
