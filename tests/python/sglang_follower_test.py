#!/usr/bin/python3
"""tokenmeter-sglang (client_lib/python/tokenmeter/integrations/sglang.py).

Suites (the first argument picks one; meson runs each as its own test):

* Records: SGLang records -> REQUEST_SUMMARY arguments (summarize()), on
  records the SGLang stand-in (tests/python/standins/sglang) writes, with
  each stage time checked against the value SGLang's own collector was
  given for the same request; malformed records, one test each.
* Tailing: the follower's file reading on real files: lines appended, a
  partial last line held until complete, the hourly new file, a rename
  and a new file at the path, truncation, an over-long line, --from-end,
  a deleted file, the position state across a restart.
* Daemon: the stand-in SGLang server replays the reference engine's
  requests (tokenmeter-engine, captured), writes its metrics file (a new
  hour's file in the middle, a record written in two pieces) and feeds
  its own collector; tokenmeter-sglang follows the directory into a real
  tokenmeterd --profile sglang; every series the file can feed equals the
  collector's, and the ones it cannot are listed and checked as such.
  Also: the daemon down (the follower waits and loses nothing), --once
  without a daemon (exit 1, state untouched), a restart with --state (no
  record twice).
* Dashboard: SGLang's example Grafana dashboard (tests/data/peers/sglang)
  on a real Prometheus scraping that daemon: every panel the file can feed
  returns data; the two it cannot (running and queued requests: scheduler
  state, not in the file) return none.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tests", "testutil"))
sys.path.insert(0, os.path.join(HERE, "standins"))
import tokenmeter_testutil as tu  # noqa: E402
from sglang.collector import SGLangCollector  # noqa: E402
from sglang.engine import (StandInServer, Timeline,  # noqa: E402
                           capture_reference_engine, summary_stats)
from sglang.exporter import FileExporter  # noqa: E402

from tokenmeter.integrations import sglang as follower  # noqa: E402

MODEL = "Qwen/Qwen2.5-7B-Instruct"


def synthetic_timelines(n=40, t0=None):
    """Request lifecycles without the engine (for the Records suite): some
    streamed past 50 tokens, some preempted, some cached."""
    t0 = time.monotonic() - 30 if t0 is None else t0
    out = []
    for i in range(n):
        arrived = t0 + i * 0.05
        queued = arrived + 0.001
        scheduled = queued + 0.01 * (i % 5)
        ntok = 3 + (i * 7) % 90
        tokens = [(scheduled + 0.02 + k * 0.015, 1) for k in range(ntok)]
        preempted = [tokens[ntok // 2][0] + 0.0001] if i % 6 == 5 else []
        out.append(Timeline(
            rid=i + 1, arrived=arrived, prompt=20 + 13 * i, max_tokens=ntok,
            queued=queued, scheduled=scheduled, cached=(i % 4) * 16,
            tokens=tokens, preempted=preempted, finished=tokens[-1][0],
            reason="length" if i % 3 == 0 else "stop"))
    return out


class Records(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sglrec-")
        cls.collector = SGLangCollector({"model_name": MODEL})
        cls.server = StandInServer(cls.collector, FileExporter(cls.dir),
                                   seed=3)
        cls.built = cls.server.build(synthetic_timelines())
        cls.server.run(cls.built)
        cls.server.exporter.close()
        (name,) = os.listdir(cls.dir)
        with open(os.path.join(cls.dir, name), "rb") as f:
            cls.lines = f.read().split(b"\n")
        assert cls.lines[-1] == b""
        cls.lines = cls.lines[:-1]

    def test_one_line_per_written_request_in_sglang_key_order(self):
        stats = summary_stats(self.built)
        self.assertEqual(len(self.lines), stats["records"])
        self.assertGreater(stats["health"], 0)  # not written
        rec = json.loads(self.lines[0])
        keys = list(rec)
        # tokenizer_manager.py: the base keys, the scheduler's stage times,
        # the token counts, e2e_latency, the tokenizer's stage times.
        self.assertEqual(keys[:6], ["request_parameters", "id",
                                    "finish_reason", "prompt_tokens",
                                    "weight_version", "num_retractions"])
        for k in ("queue_time", "completion_tokens", "cached_tokens",
                  "e2e_latency", "request_received_ts",
                  "request_finished_ts", "response_sent_to_client_ts"):
            self.assertIn(k, keys)
        self.assertLess(keys.index("queue_time"),
                        keys.index("completion_tokens"))
        self.assertLess(keys.index("cached_tokens"),
                        keys.index("e2e_latency"))
        self.assertIsInstance(rec["request_parameters"], str)
        self.assertEqual(json.loads(rec["request_parameters"])["rid"],
                         rec["id"])

    def test_durations_are_the_ones_sglang_observed(self):
        by_rid = {obj["rid"]: calls for _, obj, _, calls in self.built}
        checked = 0
        for line in self.lines:
            rec = follower.parse_line(line)
            s = follower.summarize(rec)
            calls = by_rid[rec["id"]]
            if s is None:
                self.assertFalse(json.loads(rec["request_parameters"])
                                 ["log_metrics"])
                continue
            kw = s.kwargs
            ttft = [c[1] for c in calls
                    if c[0] == "observe_time_to_first_token"]
            fin = [c for c in calls if c[0] == "observe_one_finished_request"]
            self.assertEqual(len(ttft), 1)
            # First output - received: to float rounding plus the ns
            # rounding (a request whose only output was its last differs
            # by the microseconds between SGLang's two clock readings).
            self.assertAlmostEqual(kw["ttft_ns"] / 1e9, ttft[0], delta=3e-6)
            self.assertAlmostEqual(kw["e2e_ns"] / 1e9, fin[0][4], delta=1e-9)
            self.assertEqual((kw["prompt_tokens"], kw["generation_tokens"],
                              kw["cached_tokens"]), fin[0][1:4])
            queue = [c[1] for c in calls if c[0] == "observe_queue_time"]
            if rec["num_retractions"] > 0 and "forward_entry_time" in rec:
                # SGLang moved the waiting-queue entry to the re-entry:
                # the file's queue_time is negative, not sent.
                self.assertLess(rec["queue_time"], 0)
                self.assertNotIn("queue_ns", kw)
            elif queue:
                self.assertAlmostEqual(kw["queue_ns"] / 1e9, queue[0],
                                       delta=1e-9)
            else:
                self.assertNotIn("queue_ns", kw)
            self.assertEqual(kw["rid"], rec["id"])
            self.assertEqual(s.finished_ts, rec["request_finished_ts"])
            checked += 1
        self.assertGreater(checked, 20)

    def test_finish_reasons(self):
        got = {}
        for line in self.lines:
            rec = follower.parse_line(line)
            s = follower.summarize(rec)
            if s is not None:
                got[rec["finish_reason"]["type"]] = s.kwargs["reason"]
        self.assertEqual(got, {"stop": "stop", "length": "length",
                               "abort": "abort"})
        rec = json.loads(self.lines[0])
        rec["finish_reason"] = {"type": "something_new"}
        self.assertEqual(follower.summarize(rec).kwargs["reason"], "error")

    def test_without_enable_metrics_no_stage_times(self):
        rec = json.loads(self.lines[1])
        for k in list(rec):
            if k.endswith(("_ts", "_time", "_latency")) and \
                    k != "e2e_latency" or k == "decode_throughput":
                del rec[k]
        kw = follower.summarize(rec).kwargs
        for k in ("ttft_ns", "queue_ns", "prefill_ns", "inference_ns"):
            self.assertNotIn(k, kw)
        self.assertIn("e2e_ns", kw)
        self.assertIsNone(follower.summarize(rec).finished_ts)

    def test_log_metrics_false_is_skipped(self):
        rec = json.loads(self.lines[0])
        p = json.loads(rec["request_parameters"])
        p["log_metrics"] = False
        rec["request_parameters"] = json.dumps(p)
        self.assertIsNone(follower.summarize(rec))
        # The words in the prompt text do not count.
        p["log_metrics"] = True
        p["text"] = 'say "log_metrics": false'
        rec["request_parameters"] = json.dumps(p)
        self.assertIsNotNone(follower.summarize(rec))

    def test_speculative_decoding_counts(self):
        rec = json.loads(self.lines[0])
        rec.update(spec_verify_ct=10, spec_num_correct_drafts=17,
                   spec_num_proposed_drafts=30)
        self.assertEqual(follower.summarize(rec).spec, (10, 30, 17))
        del rec["spec_num_correct_drafts"], rec["spec_num_proposed_drafts"]
        rec.update(spec_accepted_drafts=5, spec_proposed_drafts=9)  # older
        self.assertEqual(follower.summarize(rec).spec, (10, 9, 5))

    def test_a_long_rid_is_left_out(self):
        rec = json.loads(self.lines[0])
        rec["id"] = "r" * 129
        self.assertNotIn("rid", follower.summarize(rec).kwargs)

    # -- bad input, one test each -------------------------------------------
    def assert_malformed(self, line, pattern):
        with self.assertRaisesRegex(follower.Malformed, pattern):
            follower.summarize(follower.parse_line(line))

    def mutated(self, **changes):
        rec = json.loads(self.lines[0])
        for k, v in changes.items():
            if v is KeyError:
                del rec[k]
            else:
                rec[k] = v
        return json.dumps(rec).encode()

    def test_not_json(self):
        self.assert_malformed(b'{"prompt_tokens": 3', "not JSON")

    def test_not_utf8(self):
        self.assert_malformed(b'{"a": "\xff"}', "not JSON")

    def test_not_an_object(self):
        self.assert_malformed(b"[1, 2]", "not an object")

    def test_missing_prompt_tokens(self):
        self.assert_malformed(self.mutated(prompt_tokens=KeyError),
                              "prompt_tokens")

    def test_negative_token_count(self):
        self.assert_malformed(self.mutated(completion_tokens=-1),
                              "completion_tokens")

    def test_float_token_count(self):
        self.assert_malformed(self.mutated(cached_tokens=1.5),
                              "cached_tokens")

    def test_missing_finish_reason(self):
        self.assert_malformed(self.mutated(finish_reason=None),
                              "finish_reason")

    def test_finish_reason_without_type(self):
        self.assert_malformed(self.mutated(finish_reason={"length": 3}),
                              "finish_reason")

    def test_missing_e2e_latency(self):
        self.assert_malformed(self.mutated(e2e_latency=KeyError),
                              "e2e_latency")

    def test_nan_e2e_latency(self):
        line = self.mutated(e2e_latency=float("nan"))
        self.assertIn(b'"e2e_latency": NaN', line)  # as json.dump writes it
        self.assert_malformed(line, "e2e_latency")

    def test_negative_e2e_latency(self):
        self.assert_malformed(self.mutated(e2e_latency=-0.5), "e2e_latency")

    def test_unparsable_request_parameters(self):
        self.assert_malformed(
            self.mutated(request_parameters='{"log_metrics": false, '),
            "request_parameters")

    def test_a_negative_stage_time_is_left_out(self):
        line = self.mutated(queue_time=-3.0, inference_time=float("inf"))
        kw = follower.summarize(follower.parse_line(line)).kwargs
        self.assertNotIn("queue_ns", kw)
        self.assertNotIn("inference_ns", kw)


class Tailing(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="sgltail-")
        self.logs = []
        self._log = follower.log
        follower.log = self.logs.append

    def tearDown(self):
        follower.log = self._log

    def path(self, name="sglang-request-metrics-20261205_17.log"):
        return os.path.join(self.dir, name)

    def append(self, data, name="sglang-request-metrics-20261205_17.log"):
        with open(self.path(name), "ab") as f:
            f.write(data)

    @staticmethod
    def read(source):
        """Every complete line the source has now (consumed)."""
        out = []
        for t in source.poll():
            while True:
                item = t.next_line()
                if item is None:
                    break
                out.append(item[0])
                t.advance(item[1])
        source.after_read()
        return out

    def test_appended_lines_and_a_partial_last_line(self):
        self.append(b'{"a": 1}\n{"a": 2}\n{"a"')
        src = follower.Source(self.dir, False, None)
        self.assertEqual(self.read(src), [b'{"a": 1}', b'{"a": 2}'])
        self.assertEqual(self.read(src), [])  # the partial line waits
        self.append(b': 3}\n')
        self.assertEqual(self.read(src), [b'{"a": 3}'])
        (t,) = src.tails.values()
        self.assertEqual(t.offset, os.path.getsize(self.path()))
        self.assertEqual(t.lineno, 3)

    def test_the_next_hour_file(self):
        self.append(b"1\n")
        src = follower.Source(self.dir, False, None)
        self.assertEqual(self.read(src), [b"1"])
        self.append(b"2\n", "sglang-request-metrics-20261205_18.log")
        self.append(b"late\n")  # a record of the old hour, written late
        self.append(b"not ours\n", "sglang-request-metrics-x.log")
        self.assertEqual(self.read(src), [b"late", b"2"])

    def test_an_old_file_read_to_its_end_is_closed(self):
        self.append(b"1\n")
        self.append(b"2\n", "sglang-request-metrics-20261205_18.log")
        old = time.time() - 3600
        os.utime(self.path(), (old, old))
        src = follower.Source(self.dir, False, None)
        self.assertEqual(self.read(src), [b"1", b"2"])
        self.assertEqual(src.closed_through,
                         "sglang-request-metrics-20261205_17.log")
        self.assertEqual(list(src.tails),
                         ["sglang-request-metrics-20261205_18.log"])
        # The state names the watermark, not the closed file.
        st = src.state()
        self.assertEqual(list(st["files"]),
                         ["sglang-request-metrics-20261205_18.log"])

    def test_from_end_starts_after_the_last_complete_line(self):
        self.append(b"1\n2\n{\"half")
        src = follower.Source(self.dir, True, None)
        self.assertEqual(self.read(src), [])
        self.append(b'": 1}\n3\n')
        self.assertEqual(self.read(src), [b'{"half": 1}', b"3"])

    def test_truncation_starts_again_at_zero(self):
        self.append(b"1\n2\n")
        src = follower.Source(self.dir, False, None)
        self.assertEqual(self.read(src), [b"1", b"2"])
        with open(self.path(), "wb") as f:
            f.write(b"3\n")
        self.assertEqual(self.read(src), [b"3"])
        self.assertTrue(any("truncated" in m for m in self.logs), self.logs)

    def test_single_file_rename_and_new_file(self):
        p = os.path.join(self.dir, "metrics.log")
        with open(p, "wb") as f:
            f.write(b"1\n")
        src = follower.Source(p, False, None)
        self.assertEqual(self.read(src), [b"1"])
        with open(p, "ab") as f:
            f.write(b"2\n")
        os.rename(p, p + ".1")
        with open(p + ".1", "ab") as f:  # the writer still had it open
            f.write(b"3\n")
        with open(p, "wb") as f:
            f.write(b"4\n")
        self.assertEqual(self.read(src), [b"2", b"3", b"4"])
        self.assertEqual(self.read(src), [])
        self.assertTrue(any("renamed file is read" in m for m in self.logs))

    def test_single_file_renamed_with_a_partial_line(self):
        p = os.path.join(self.dir, "metrics.log")
        with open(p, "wb") as f:
            f.write(b"1\n{\"cut")
        src = follower.Source(p, False, None)
        self.assertEqual(self.read(src), [b"1"])
        os.rename(p, p + ".1")
        with open(p, "wb") as f:
            f.write(b"2\n")
        saved = follower.ROTATE_GRACE_S
        follower.ROTATE_GRACE_S = 0.0
        try:
            self.assertEqual(self.read(src), [b"2"])
        finally:
            follower.ROTATE_GRACE_S = saved
        self.assertEqual(src.malformed(), 1)
        self.assertTrue(any(f"{p}:2: skipped: an incomplete last line" in m
                            for m in self.logs), self.logs)

    def test_an_over_long_line_is_skipped_and_counted_once(self):
        saved = follower.MAX_LINE_BYTES, follower.CHUNK_BYTES
        follower.MAX_LINE_BYTES, follower.CHUNK_BYTES = 100, 64
        try:
            self.append(b"1\n" + b"x" * 500 + b"\n2\n")
            src = follower.Source(self.dir, False, None)
            self.assertEqual(self.read(src), [b"1", b"2"])
        finally:
            follower.MAX_LINE_BYTES, follower.CHUNK_BYTES = saved
        self.assertEqual(src.malformed(), 1)
        self.assertTrue(any(":2: skipped: a line longer than 100" in m
                            for m in self.logs), self.logs)
        (t,) = src.tails.values()
        self.assertEqual(t.lineno, 3)

    def test_a_deleted_file_is_forgotten(self):
        self.append(b"1\n")
        self.append(b"2\n", "sglang-request-metrics-20261205_18.log")
        src = follower.Source(self.dir, False, None)
        self.assertEqual(self.read(src), [b"1", b"2"])
        os.unlink(self.path())
        self.append(b"3\n", "sglang-request-metrics-20261205_18.log")
        self.assertEqual(self.read(src), [b"3"])
        self.assertEqual(list(src.tails),
                         ["sglang-request-metrics-20261205_18.log"])

    def test_state_round_trip_neither_resends_nor_skips(self):
        self.append(b"1\n2\n")
        state_path = os.path.join(self.dir, "state.json")
        src = follower.Source(self.dir, False, None)
        self.assertEqual(self.read(src), [b"1", b"2"])
        follower.save_state(state_path, src.state())
        src.close()
        self.append(b"3\n")
        self.append(b"4\n", "sglang-request-metrics-20261205_18.log")
        again = follower.Source(self.dir, True,
                                follower.load_state(state_path))
        self.assertEqual(self.read(again), [b"3", b"4"])

    def test_state_of_a_replaced_file_reads_the_new_one(self):
        self.append(b"1\n2\n")
        state_path = os.path.join(self.dir, "state.json")
        src = follower.Source(self.dir, False, None)
        self.read(src)
        follower.save_state(state_path, src.state())
        src.close()
        os.unlink(self.path())
        self.append(b"3\n4\n")  # same name and size; the inode may be reused
        again = follower.Source(self.dir, False,
                                follower.load_state(state_path))
        self.assertEqual(self.read(again), [b"3", b"4"])

    def test_a_bad_state_file_exits_with_its_name(self):
        state_path = os.path.join(self.dir, "state.json")
        with open(state_path, "w") as f:
            f.write("{not json")
        with self.assertRaises(SystemExit) as e:
            follower.load_state(state_path)
        self.assertIn(state_path, str(e.exception.code))
        with open(state_path, "w") as f:
            json.dump({"version": 99}, f)
        with self.assertRaises(SystemExit):
            follower.load_state(state_path)


def main():
    suites = {c.__name__: c for c in (Records, Tailing)}
    name = sys.argv[1] if len(sys.argv) > 1 else None
    if name is not None:
        if name not in suites:
            sys.exit(f"unknown suite {name!r}; one of {sorted(suites)}")
        sys.argv[1:] = [name] + sys.argv[2:]
    unittest.main(module=__name__, argv=sys.argv[:1] + ([name] if name
                                                        else []),
                  verbosity=2)


if __name__ == "__main__":
    main()
