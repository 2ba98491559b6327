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
import datetime
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
                           capture_reference_engine, scaled, summary_stats)
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
            rec, log_metrics = follower.parse_line(line)
            s = follower.summarize(rec, log_metrics)
            calls = by_rid[rec["id"]]
            full = json.loads(line)
            self.assertEqual(rec, {k: v for k, v in full.items()
                                   if k != "request_parameters"})
            if s is None:
                self.assertFalse(json.loads(full["request_parameters"])
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
            rec, log_metrics = follower.parse_line(line)
            s = follower.summarize(rec, log_metrics)
            if s is not None:
                got[rec["finish_reason"]["type"]] = s.kwargs["reason"]
        self.assertEqual(got, {"stop": "stop", "length": "length",
                               "abort": "abort"})
        rec = json.loads(self.lines[0])
        rec["finish_reason"] = {"type": "something_new"}
        self.assertEqual(follower.summarize(rec).kwargs["reason"], "error")

    def test_decode_throughput_of_sglang_before_19984(self):
        # Older SGLang divided by the finish's perf_counter() reading for a
        # request whose only output was its last: TTFT = e2e, not < 0.
        rec = next(r for r in map(json.loads, self.lines)
                   if r["completion_tokens"] > 0 and "decode_throughput" in r)
        ok = follower.summarize(rec).kwargs
        self.assertLess(ok["ttft_ns"], ok["e2e_ns"])
        rec["decode_throughput"] = rec["completion_tokens"] / 86400.0
        kw = follower.summarize(rec).kwargs
        self.assertEqual(kw["ttft_ns"], kw["e2e_ns"])

    def test_without_enable_metrics_no_stage_times(self):
        rec = json.loads(self.lines[1])
        for k in list(rec):
            if k.endswith(("_ts", "_time", "_latency")) and \
                    k != "e2e_latency" or k == "decode_throughput":
                del rec[k]
        kw = follower.summarize(rec).kwargs
        for k in ("ttft_ns", "queue_ns"):
            self.assertNotIn(k, kw)
        self.assertIn("e2e_ns", kw)
        self.assertIsNone(follower.summarize(rec).finished_ts)

    def test_log_metrics_false_is_skipped(self):
        rec = json.loads(self.lines[0])
        p = json.loads(rec["request_parameters"])

        def summary(params, first=True):
            r = dict(rec, request_parameters=json.dumps(params))
            if not first:  # another layout: the whole line is decoded
                r = dict(reversed(list(r.items())))
            line = json.dumps(r).encode()
            self.assertEqual(line.startswith(b'{"request_parameters"'),
                             first)
            return follower.summarize(*follower.parse_line(line))
        self.assertIsNotNone(summary(p))
        p["log_metrics"] = False
        self.assertIsNone(summary(p))
        self.assertIsNone(summary(p, first=False))
        # The words in the prompt text do not count.
        p["log_metrics"] = True
        p["text"] = 'say "log_metrics": false'
        self.assertIsNotNone(summary(p))
        self.assertIsNotNone(summary(p, first=False))

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

    def test_the_line_in_the_docs(self):
        with open(os.path.join(SRC, "docs", "integrations.md")) as f:
            doc = f.read()
        sglang = doc[doc.index("## SGLang"):]
        line = sglang[sglang.index("```json\n") + 8:]
        line = line[:line.index("\n")].encode()
        rec, log_metrics = follower.parse_line(line)
        self.assertEqual(rec, {k: v for k, v in json.loads(line).items()
                               if k != "request_parameters"})
        kw = follower.summarize(rec, log_metrics).kwargs
        self.assertEqual(kw["generation_tokens"], rec["completion_tokens"])
        self.assertAlmostEqual(
            kw["ttft_ns"] / 1e9, rec["e2e_latency"] -
            rec["completion_tokens"] / rec["decode_throughput"], delta=1e-9)
        # Streamed: its first output is its first chunk, sent to the client.
        self.assertAlmostEqual(
            rec["request_received_ts"] + kw["ttft_ns"] / 1e9,
            rec["response_sent_to_client_ts"], delta=1e-3)

    def test_man_page_lists_every_flag(self):
        sys.path.insert(0, os.path.join(SRC, "tests", "docs"))
        import man_pages_test as man
        with open(os.path.join(SRC, "docs", "man",
                               "tokenmeter-sglang.1.scd")) as f:
            in_page = man.page_flags(f.read())
        in_help = {o for a in follower.build_parser()._actions
                   for o in a.option_strings}
        self.assertGreater(len(in_help), 8)
        self.assertEqual(in_page, in_help)

    # -- bad input, one test each -------------------------------------------
    def assert_malformed(self, line, pattern):
        with self.assertRaisesRegex(follower.Malformed, pattern):
            follower.summarize(*follower.parse_line(line))

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

    def test_more_cached_than_prompt_tokens(self):
        rec = json.loads(self.lines[0])
        self.assert_malformed(self.mutated(
            cached_tokens=rec["prompt_tokens"] + 1), "cached_tokens")

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

    def test_a_line_cut_short(self):
        self.assert_malformed(self.lines[0][:len(self.lines[0]) // 2],
                              "not JSON")
        self.assert_malformed(self.lines[0][:-5], "not JSON")

    def test_a_negative_stage_time_is_left_out(self):
        line = self.mutated(queue_time=-3.0)
        kw = follower.summarize(*follower.parse_line(line)).kwargs
        self.assertNotIn("queue_ns", kw)
        self.assertIn("ttft_ns", kw)


def put(path, data, mode="ab"):
    with open(path, mode) as f:
        f.write(data)


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
        put(self.path(name), data)

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

    def test_from_end_does_not_open_the_files_of_past_hours(self):
        old = time.time() - 3600
        for h in range(10, 17):
            name = f"sglang-request-metrics-20261205_{h}.log"
            self.append(b"old\n", name)
            os.utime(self.path(name), (old, old))
        self.append(b"1\n")
        src = follower.Source(self.dir, True, None)
        self.assertEqual(self.read(src), [])
        self.assertEqual(src.closed_through,
                         "sglang-request-metrics-20261205_16.log")
        self.assertEqual(list(src.tails),
                         ["sglang-request-metrics-20261205_17.log"])
        self.append(b"2\n")
        self.assertEqual(self.read(src), [b"2"])

    def test_a_backfill_of_many_files_opens_a_few_at_a_time(self):
        old = time.time() - 3600
        names = [f"sglang-request-metrics-202612{d:02d}_{h:02d}.log"
                 for d in (4, 5) for h in range(0, 24, 2)]
        for n in names:
            self.append(n.encode() + b"\n", n)
            os.utime(self.path(n), (old, old))
        src = follower.Source(self.dir, False, None)
        got = []
        for _ in range(5):
            got += self.read(src)
            opened = sum(t.fd is not None for t in src.tails.values())
            self.assertLessEqual(opened, follower.MAX_OPEN_FILES)
        # Each once (the newest first: SGLang may be writing there).
        self.assertEqual(sorted(got), [n.encode() for n in names])
        self.assertEqual(src.closed_through, names[-2])

    def test_truncation_starts_again_at_zero(self):
        self.append(b"1\n2\n")
        src = follower.Source(self.dir, False, None)
        self.assertEqual(self.read(src), [b"1", b"2"])
        put(self.path(), b"3\n", "wb")
        self.assertEqual(self.read(src), [b"3"])
        self.assertTrue(any("truncated" in m for m in self.logs), self.logs)

    def test_single_file_rename_and_new_file(self):
        p = os.path.join(self.dir, "metrics.log")
        put(p, b"1\n")
        src = follower.Source(p, False, None)
        self.assertEqual(self.read(src), [b"1"])
        put(p, b"2\n")
        os.rename(p, p + ".1")
        put(p + ".1", b"3\n")  # the writer still had it open
        put(p, b"4\n")
        self.assertEqual(self.read(src), [b"2", b"3", b"4"])
        self.assertEqual(self.read(src), [])
        self.assertTrue(any("renamed file is read" in m for m in self.logs))

    def test_single_file_renamed_with_a_partial_line(self):
        p = os.path.join(self.dir, "metrics.log")
        put(p, b"1\n{\"cut")
        src = follower.Source(p, False, None)
        self.assertEqual(self.read(src), [b"1"])
        os.rename(p, p + ".1")
        put(p, b"2\n")
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


# 120 requests at 60/s into 12 slots and a KV cache of 64 blocks of 16:
# some queueing, prefix-cache hits (a shared 30 % of each prompt), a few
# preemptions (how many depends on the machine's speed); about 2.2 s on 2
# cores, slowed down 60 times (a step then takes 10 to 30 ms, as on a GPU:
# TTFT about 0.6 s at the median, 1.7 s at p90, e2e 3.5 s).
ENGINE_ARGS = ("--requests", "120", "--rate", "60", "--prompt-len", "96",
               "--output-len", "96", "--max-batch", "12", "--kv-blocks", "64",
               "--block-size", "16", "--shared-prefix", "0.3",
               "--tenants", "0", "--seed", "7")
TIME_SCALE = 60


def engine_timelines(workdir):
    """The reference engine's requests (captured), or a skip without it."""
    engine = os.environ.get("TOKENMETER_ENGINE", "")
    if not os.access(engine, os.X_OK):
        tu.skip("TOKENMETER_ENGINE not set (run through meson test)")
    return scaled(capture_reference_engine(engine, workdir, *ENGINE_ARGS),
                  TIME_SCALE)


class Hours:
    """The exporter's datetime.now(): the hour turns when told to."""

    def __init__(self):
        self.hour = datetime.datetime(2026, 12, 5, 17, 59, 58)

    def __call__(self):
        return self.hour

    def turn(self):
        self.hour += datetime.timedelta(seconds=4)


def start_follower(workdir, sock, *extra):
    cmd = [sys.executable, "-m", "tokenmeter.integrations.sglang",
           os.path.join(workdir, "metrics"), "--model", MODEL,
           "--socket", sock, "--poll-interval", "0.05", *extra]
    with open(os.path.join(workdir, "follower.log"), "ab") as err:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)


def stop_follower(proc, workdir):
    """SIGTERM, then its exit status and its stderr."""
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(20)
    with open(os.path.join(workdir, "follower.log")) as f:
        return rc, f.read()


def histogram(samples, name, labels):
    """{le: cumulative count}, count, sum of one histogram series."""
    buckets, count, total = {}, None, None
    for (n, lb), v in samples.items():
        lb = dict(lb)
        if any(lb.get(k) != w for k, w in labels.items()):
            continue
        if n == name + "_bucket":
            buckets[float(lb["le"])] = v
        elif n == name + "_count":
            count = v
        elif n == name + "_sum":
            total = v
    return buckets, count, total


class Daemon(unittest.TestCase):
    """The stand-in SGLang server and tokenmeter-sglang into a real
    tokenmeterd: the daemon's sglang series against SGLang's collector."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sgld-")
        cls.timelines = engine_timelines(cls.dir)
        cls.daemon = tu.Daemon("--profile", "sglang").start()
        cls.collector = SGLangCollector({"model_name": MODEL})
        cls.hours = Hours()
        cls.server = StandInServer(
            cls.collector, FileExporter(os.path.join(cls.dir, "metrics"),
                                        now=cls.hours), seed=11)
        cls.built = cls.server.build(cls.timelines)
        cls.stats = summary_stats(cls.built)
        half = len(cls.built) // 2
        # The first half before the follower starts, the rest after; the
        # hour turns in the middle of the second part, and one record
        # reaches the file in two pieces.
        cls.server.run(cls.built[:half])
        cls.proc = start_follower(cls.dir, cls.daemon.sock, "--from-start",
                                  "--state", os.path.join(cls.dir, "state"))
        rest = cls.built[half:]
        turn_at = len(rest) // 2

        def written(i):
            if i == turn_at:
                cls.hours.turn()

        def paused(i):
            time.sleep(0.3)  # the follower polls every 0.05 s meanwhile
        cls.server.run(rest, pause_at=turn_at + 3, pause=paused,
                       on_written=written)
        cls.server.exporter.close()
        cls.daemon.wait_value("sglang:num_requests_total",
                              cls.stats["logged"], timeout=30,
                              model_name=MODEL, engine="0")
        cls.rc, cls.follower_log = stop_follower(cls.proc, cls.dir)
        cls.got = cls.daemon.samples()
        cls.want = cls.collector.samples()

    @classmethod
    def tearDownClass(cls):
        if cls.proc.poll() is None:
            cls.proc.kill()
        cls.daemon.stop()
        cls.daemon.cleanup()

    LB = {"model_name": MODEL}

    def value(self, samples, name, **labels):
        want = dict(self.LB, **labels)
        vals = [v for (n, lb), v in samples.items() if n == name
                and all(dict(lb).get(k) == w for k, w in want.items())]
        self.assertEqual(len(vals), 1, f"{name}{want}: {vals}")
        return vals[0]

    def test_workload_has_every_path(self):
        c = self.stats
        self.assertGreater(c["records"], 100)
        self.assertGreater(c["aborts"], 3)
        self.assertGreater(c["health"], 0)
        # Preempted by the engine: usually a few (the Records suite has
        # them for sure).
        print(f"\n{self.server.retracted} requests retracted",
              file=sys.stderr)
        self.assertGreater(c["records"] - c["logged"], 0)  # log_metrics false
        names = sorted(n for n in os.listdir(os.path.join(self.dir,
                                                          "metrics")))
        self.assertEqual(names, ["sglang-request-metrics-20261205_17.log",
                                 "sglang-request-metrics-20261205_18.log"])

    def test_follower_stopped_cleanly_and_counted(self):
        self.assertEqual(self.rc, 0, self.follower_log)
        c = self.stats
        self.assertIn(f"{c['logged']} records sent, "
                      f"{c['records'] - c['logged']} skipped (log_metrics "
                      "false), 0 malformed, 0 backfilled", self.follower_log)
        self.assertIn("0 dropped, 0 unacked", self.follower_log)

    def test_counters_equal_sglangs(self):
        for name in ("sglang:prompt_tokens_total",
                     "sglang:generation_tokens_total",
                     "sglang:num_requests_total"):
            self.assertEqual(self.value(self.got, name),
                             self.value(self.want, name), name)
        self.assertEqual(
            self.value(self.got, "sglang:cached_tokens_total",
                       cache_source="total"),
            self.value(self.want, "sglang:cached_tokens_total",
                       cache_source="total"))
        self.assertGreater(self.value(self.want, "sglang:cached_tokens_total",
                                      cache_source="total"), 0)

    def test_aborted_requests_differ_by_the_unlogged_aborts(self):
        # SGLang counts abort_request() calls (any request); the file
        # gives the records that finished as abort (log_metrics true).
        unlogged = sum(1 for _, obj, out, _ in self.built
                       if not obj["log_metrics"]
                       and not obj["rid"].startswith("HEALTH_CHECK")
                       and out["meta_info"]["finish_reason"]["type"]
                       == "abort")
        got = self.value(self.got, "sglang:num_aborted_requests_total")
        want = self.value(self.want, "sglang:num_aborted_requests_total")
        self.assertEqual(got, self.stats["aborts"])
        self.assertEqual(got, want - unlogged)

    def assert_histograms_equal(self, name, sum_tolerance):
        gb, gc, gs = histogram(self.got, name, self.LB)
        wb, wc, ws = histogram(self.want, name, self.LB)
        self.assertEqual(gb, wb, name)
        self.assertEqual(gc, wc, name)
        self.assertAlmostEqual(gs, ws, delta=sum_tolerance * wc, msg=name)
        self.assertGreater(wc, 100)

    def test_e2e_histogram_equals_sglangs(self):
        self.assert_histograms_equal("sglang:e2e_request_latency_seconds",
                                     1e-9)

    def test_ttft_histogram_equals_sglangs(self):
        # A request whose only output was its last: e2e, within SGLang's
        # two clock readings (2 us in the stand-in).
        self.assert_histograms_equal("sglang:time_to_first_token_seconds",
                                     3e-6)

    def test_token_histograms_equal_sglangs(self):
        self.assert_histograms_equal("sglang:prompt_tokens_histogram", 0)
        self.assert_histograms_equal("sglang:generation_tokens_histogram",
                                     0)

    def test_queue_time_is_sglangs_but_what_no_record_gives(self):
        # Expected: SGLang's observations less the ones no record carries
        # (health checks, log_metrics false, and a retracted request's
        # queue_time, negative in the file).
        expect = SGLangCollector({"model_name": MODEL})
        for _, obj, out, calls in self.built:
            m = out["meta_info"]
            if obj["log_metrics"] and "forward_entry_time" in m and \
                    m["queue_time"] >= 0:
                expect.observe_queue_time(m["queue_time"])
        name = "sglang:queue_time_seconds"
        gb, gc, gs = histogram(self.got, name, self.LB)
        eb, ec, es = histogram(expect.samples(), name, self.LB)
        wb, wc, ws = histogram(self.want, name, self.LB)
        self.assertEqual(gb, eb)
        self.assertAlmostEqual(gs, es, delta=1e-9 * ec)
        self.assertEqual(gc, wc - self.stats["queue_observed_not_sent"])
        self.assertGreater(self.stats["queue_observed_not_sent"], 0)
        self.assertGreater(gc, 50)

    def test_what_the_file_cannot_feed(self):
        # Per-token inter-token latency: the file has one line per finished
        # request, no output times. SGLang observed it; the daemon has none.
        _, wc, _ = histogram(self.want, "sglang:inter_token_latency_seconds",
                             self.LB)
        _, gc, _ = histogram(self.got, "sglang:inter_token_latency_seconds",
                             self.LB)
        self.assertGreater(wc, 1000)
        self.assertIn(gc, (None, 0))
        # Scheduler state (running, queued requests, KV usage): no STEP
        # with it is ever sent.
        for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs",
                     "sglang:token_usage"):
            vals = [v for (n, _), v in self.got.items() if n == name]
            self.assertTrue(all(v == 0 for v in vals), (name, vals))


class Delivery(unittest.TestCase):
    """The follower against a daemon that comes and goes, restarts with
    --state, --once without a daemon, and bad lines."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="sgldl-", dir="/tmp")
        self.sock = os.path.join(self.dir, "i.sock")
        self.state = os.path.join(self.dir, "state")
        self.server = StandInServer(
            SGLangCollector({"model_name": MODEL}),
            FileExporter(os.path.join(self.dir, "metrics")), seed=21,
            health_every=0, no_log_every=0)
        self.built = self.server.build(synthetic_timelines(60))
        self.procs = []
        self.daemons = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for d in self.daemons:
            d.stop()
            d.cleanup()

    def daemon(self):
        d = tu.Daemon("--profile", "sglang", ingest=self.sock).start()
        self.daemons.append(d)
        return d

    def follower(self, *extra):
        p = start_follower(self.dir, self.sock, "--state", self.state,
                           *extra)
        self.procs.append(p)
        return p

    def log_text(self):
        with open(os.path.join(self.dir, "follower.log")) as f:
            return f.read()

    def count(self, d):
        return d.value("sglang:num_requests_total", model_name=MODEL,
                       engine="0") or 0

    def test_daemon_away_then_back_then_restarted(self):
        self.server.run(self.built[:20])
        p = self.follower("--from-start")
        tu.poll_until(lambda: "waiting for tokenmeterd" in self.log_text(),
                      timeout=10, what="the follower waits for the daemon")
        d1 = self.daemon()
        d1.wait_value("sglang:num_requests_total", 20, timeout=20,
                      model_name=MODEL, engine="0")
        d1.stop()  # away: what is written meanwhile waits in the file
        self.server.run(self.built[20:45])
        tu.poll_until(lambda: "waiting for tokenmeterd" in
                      self.log_text().split("connected to tokenmeterd")[-1],
                      timeout=10, what="the follower noticed")
        d2 = self.daemon()  # a new daemon: it counts from 0
        self.server.run(self.built[45:])
        d2.wait_value("sglang:num_requests_total", 40, timeout=20,
                      model_name=MODEL, engine="0")
        rc, log = stop_follower(p, self.dir)
        self.assertEqual(rc, 0, log)
        self.assertIn("60 records sent", log)
        self.assertEqual(self.count(d2), 40)  # none twice, none lost

    def test_restart_with_state_sends_nothing_twice(self):
        d = self.daemon()
        self.server.run(self.built[:30])
        p = self.follower("--from-start")
        d.wait_value("sglang:num_requests_total", 30, timeout=20,
                     model_name=MODEL, engine="0")
        rc, log = stop_follower(p, self.dir)
        self.assertEqual(rc, 0, log)
        self.server.run(self.built[30:])
        # --from-start is ignored: the state says where to go on.
        p = self.follower("--from-start")
        d.wait_value("sglang:num_requests_total", 60, timeout=20,
                     model_name=MODEL, engine="0")
        rc, log = stop_follower(p, self.dir)
        self.assertEqual(rc, 0, log)
        self.assertIn("30 records sent", log.splitlines()[-1])
        self.assertEqual(self.count(d), 60)

    def test_once_without_a_daemon_exits_1_and_keeps_no_state(self):
        self.server.run(self.built[:5])
        p = self.follower("--once", "--connect-timeout", "0.5")
        rc = p.wait(20)
        self.assertEqual(rc, 1)
        self.assertIn("tokenmeterd did not answer", self.log_text())
        self.assertFalse(os.path.exists(self.state))

    def test_bad_lines_are_counted_and_the_first_is_logged(self):
        d = self.daemon()
        self.server.run(self.built[:3])
        path = self.server.exporter.path()
        with open(path, "a") as f:
            f.write("not json\n[1]\n{\"prompt_tokens\": 3}\n")
        self.server.run(self.built[3:6])
        p = self.follower("--once")
        self.assertEqual(p.wait(20), 0, self.log_text())
        self.assertEqual(self.count(d), 6)
        log = self.log_text()
        self.assertIn(f"{path}:4: skipped: not JSON", log)
        self.assertIn("6 records sent, 0 skipped (log_metrics false), "
                      "3 malformed", log)

    def test_bad_arguments_exit_2(self):
        for args in (["--model", MODEL, "/nonexistent"],
                     ["--model", MODEL, "--poll-interval", "0", self.dir],
                     ["--model", "", self.dir],
                     [self.dir]):
            r = subprocess.run([sys.executable, "-m",
                                "tokenmeter.integrations.sglang", *args],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn("tokenmeter-sglang", r.stderr)


sys.path.insert(0, os.path.join(SRC, "tests", "monitoring"))
import live_prometheus_test as live  # noqa: E402

PROM_YML = """global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: tokenmeter
    static_configs:
      - targets: ['{target}']
"""
# SGLang's dashboard panels the file cannot feed: scheduler state, which a
# request's record, written when it finishes, does not have.
NOT_FED = {"Num Running Requests": "sglang:num_running_reqs",
           "Number Queued Requests": "sglang:num_queue_reqs"}


class Dashboard(live.LiveBase):
    """SGLang's example dashboard, unchanged, on a real Prometheus that
    scrapes a tokenmeterd fed only by tokenmeter-sglang."""

    @classmethod
    def setUpClass(cls):
        if not os.access(live.PROMETHEUS, os.X_OK):
            tu.skip(f"{live.PROMETHEUS} not installed (Debian package "
                    "prometheus)")
        cls.dir = tempfile.mkdtemp(prefix="sgldash-")
        timelines = engine_timelines(cls.dir)
        # Windows of 1 s for gen_throughput and cache_hit_rate.
        cls.daemon = tu.Daemon("--profile", "sglang",
                               "--log-interval", "1").start()
        target = f"{cls.daemon.host}:{cls.daemon.port}"
        cls.prom = live.Prometheus(os.path.join(cls.dir, "prom"),
                                   PROM_YML.format(target=target), [])
        cls.prom.start()
        cls.server = StandInServer(
            SGLangCollector({"model_name": MODEL}),
            FileExporter(os.path.join(cls.dir, "metrics")), seed=5)
        built = cls.server.build(timelines)
        cls.proc = start_follower(cls.dir, cls.daemon.sock, "--from-start")
        cls.prom.wait_ready()
        # The records over 8 s, so that each rate window sees increases.
        for k in range(8):
            cls.server.run(built[k * len(built) // 8:
                                 (k + 1) * len(built) // 8])
            time.sleep(1.0)  # the pace of the workload, not a wait
        cls.server.exporter.close()
        logged = summary_stats(built)["logged"]
        cls.daemon.wait_value("sglang:num_requests_total", logged,
                              timeout=30, model_name=MODEL, engine="0")

        def scraped():
            r = cls.prom.vector(f'sglang:num_requests_total'
                                f'{{model_name="{MODEL}"}}')
            return r and r[0][1] == logged
        tu.poll_until(scraped, timeout=20, interval=0.5,
                      what="Prometheus scraped every request")
        with open(SGLANG_DASHBOARD, "rb") as f:
            cls.dashboard = json.load(f)

    @classmethod
    def tearDownClass(cls):
        tu.stop_process(cls.proc)
        cls.prom.close()
        cls.daemon.stop()
        cls.daemon.cleanup()

    def panel_exprs(self):
        variables = {v["name"]: v
                     for v in self.dashboard["templating"]["list"]}
        t = time.time()
        self.assertIn(MODEL, self.resolve_variable(variables["model_name"],
                                                   {}, t))
        target = f"{self.daemon.host}:{self.daemon.port}"
        self.assertIn(target, self.resolve_variable(variables["instance"],
                                                    {}, t))
        values = {"model_name": live.format_var(variables["model_name"],
                                                [MODEL]),
                  "instance": live.format_var(variables["instance"],
                                              [target])}
        out = {}
        for title, ref, expr in self.panel_targets(self.dashboard):
            out[(title, ref)] = live.interpolate(expr, values)
        return out

    def test_every_panel_the_file_feeds_returns_data(self):
        exprs = self.panel_exprs()
        self.assertEqual(len(exprs), 14)
        fed = {f"{t} / {r}": e for (t, r), e in exprs.items()
               if t not in NOT_FED}
        self.assertEqual(len(fed), 12)
        self.evaluate(fed)
        print(f"\nSGLang dashboard: {len(fed)} of {len(exprs)} expressions "
              "returned data from tokenmeter-sglang alone", file=sys.stderr)

    def test_window_gauges_moved(self):
        # gen_throughput and cache_hit_rate: the counts of the records
        # that came in each 1 s window (their STEP), not 0 throughout.
        for name in ("sglang:gen_throughput", "sglang:cache_hit_rate"):
            r = self.prom.vector(f"max_over_time({name}[30s])")
            self.assertTrue(r and r[0][1] > 0, (name, r))

    def test_panels_the_file_cannot_feed(self):
        # Nothing sends running or waiting requests: the daemon's gauges
        # stay at their start (0, or absent), never a made-up figure.
        for title, name in NOT_FED.items():
            r = self.prom.vector(f"max_over_time({name}[30s])")
            self.assertTrue(all(v == 0 for _, v in r), (title, r))


SGLANG_DASHBOARD = os.path.join(SRC, "tests", "data", "peers", "sglang",
                                "sglang-dashboard.json")


def main():
    suites = {c.__name__: c for c in (Records, Tailing, Daemon, Delivery,
                                      Dashboard)}
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
