#!/usr/bin/python3
"""Protocol 1.2 against 1.1, both ways, with a 1.1 tokenmeterd built from
git (commit 9166c1f, the last before the 1.2 events):

* a 1.1 stream into this daemon and into the old one
  (bench/ab/same_exposition.py's randomized stream: every 1.1 feature, all
  three profiles): every line the old daemon serves, this one serves
  alike (text 0.0.4, OpenMetrics, protobuf family by family); only the
  families and event kinds 1.2 adds are left out of the comparison;
* a 1.2 stream (tests/e2e/protocol12_model_test.py's random streams: the
  new kinds, SCHEDULED info, STEP waiting_deferred, ARRIVED priority;
  the trace context comes with the reference engine below) into the old
  daemon, and the same stream with every 1.2
  addition taken out into another old daemon: both expose the same, except
  that the first counts kinds 9 to 11 as unknown_kind, and nothing else
  changes;
* a real 1.2 client, the reference engine with --disaggregate, admission
  rejections and a sleep cycle ($TOKENMETER_ENGINE; skipped without), into
  the old daemon: only the new kinds are refused, as unknown_kind, and the
  1.1 figures equal the engine's report.

Usage: compat12_test.py SRC_DIR CACHE_DIR TOKENMETERD [unittest args]
  The old daemon is $TOKENMETERD_OLD12 if set, else CACHE_DIR/build/daemon/
  tokenmeterd, built there once from `git archive 9166c1f` of SRC_DIR
  (about 105 s of CPU) and kept. Exits 77 (skipped) without git history.
"""
import os
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "engine"))
import tokenmeter_testutil as tu  # noqa: E402
import protocol12_model_test as model  # noqa: E402
import engine_e2e_test  # noqa: E402
from tokenmeter_testutil import Daemon, batch, hello, poll_until  # noqa: E402

OLD_COMMIT = "9166c1f"
SRC = CACHE = NEW = None

# What 1.2 adds to a daemon fed a 1.1 stream: new families (shown for
# every series, from the 1.1 events: prompt tokens by source, the new
# per-request histograms) and the new kinds of tokenmeter_ingest_events.
NEW_IN_12 = [
    "prompt_tokens_by_source", "prompt_tokens_cached",
    "request_prefill_kv_computed_tokens", "request_num_preemptions",
    "request_kv_wait_time_seconds", "lmdeploy:cached_tokens",
    "request_cached_tokens", "request_cache_hit_ratio",
    'kind="admission_rejected"', 'kind="kv_transfer"', 'kind="sleep"',
    # and the kinds protocol 1.3 adds since
    'kind="request_summary"', 'kind="latencies"',
    # and the KV wait's interval counts (a sample more in two families)
    'interval="kv_wait_time"',
]
# Families that gained a sample: compared in text, less the new sample.
GREW_IN_12 = ["tokenmeter_ingest_events_total",
              "tokenmeter_incomplete_intervals_total",
              "tokenmeter_negative_intervals_total"]


def old_daemon():
    if os.environ.get("TOKENMETERD_OLD12"):
        return os.environ["TOKENMETERD_OLD12"]
    return tu.build_old_daemon(SRC, CACHE, OLD_COMMIT)

def strip_12(ev):
    """The 1.1 event of a 1.2 one (None: a 1.2 kind)."""
    if ev[0] >= 9:
        return None
    ev = list(ev)
    if ev[0] == 3:
        ev = ev[:3]
    elif ev[0] == 1 and len(ev) > 4:
        ev[4] = {k: v for k, v in ev[4].items()
                 if k not in ("priority", "traceparent", "tracestate")}
    elif ev[0] == 7:
        ev[2] = {k: v for k, v in ev[2].items() if k != "waiting_deferred"}
    return ev


def feed(d, events):
    s = d.connect()
    s.sendall(hello())
    for i in range(0, len(events), 50):
        s.sendall(batch(events[i:i + 50], seq=i))
    s.sendall(tu.frame(2))
    s.close()


def comparable(text):
    """The lines to compare: without the process, the scrapes, the ingest
    counters (compared apart) and the value of lora_requests_info (the wall
    time each daemon saw the LoRA sets change)."""
    return [line.rsplit(" ", 1)[0] if ":lora_requests_info{" in line
            and not line.startswith("#") else line
            for line in text.splitlines()
            if not line.startswith(("process_", "# HELP process_",
                                    "# TYPE process_"))
            and "tokenmeter_scrape_duration_seconds" not in line
            and "tokenmeter_http_responses" not in line
            and "tokenmeter_ingest_events" not in line
            and "tokenmeter_ingest_errors" not in line
            and "tokenmeter_ingest_frames" not in line]


class Compat(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.environ.get("TOKENMETER_OLD_DAEMON") == "0":
            raise unittest.SkipTest("TOKENMETER_OLD_DAEMON=0")
        cls.old = old_daemon()
        if cls.old is None:
            raise unittest.SkipTest("no git history to build " + OLD_COMMIT)

    def test_a_11_stream_into_a_12_daemon_changes_nothing_it_knew(self):
        args = [sys.executable,
                os.path.join(SRC, "bench", "ab", "same_exposition.py"),
                self.old, NEW, "--seed", "29", "--requests", "600"]
        for name in NEW_IN_12:
            args += ["--ignore", name]
        for family in GREW_IN_12:
            args += ["--ignore-protobuf", family]
        r = subprocess.run(args, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr[-2000:])
        print(r.stdout.strip().splitlines()[-1], flush=True)

    def test_a_12_stream_into_a_11_daemon_counts_unknown_kinds_only(self):
        for seed in (2901, 2902, 2903):
            with self.subTest(seed=seed):
                import random
                rng = random.Random(seed)
                t0 = time.monotonic_ns() - 600 * 1000 * model.MS
                events = model.random_stream(rng, t0)
                stripped = [e for e in map(strip_12, events) if e is not None]
                unknown = len(events) - len(stripped)
                self.assertGreater(unknown, 0)
                a = Daemon("--log-interval", "0", binary=self.old).start()
                b = Daemon("--log-interval", "0", binary=self.old).start()
                for d in (a, b):
                    self.addCleanup(d.cleanup)
                    self.addCleanup(d.stop)
                feed(a, events)
                feed(b, stripped)
                poll_until(lambda: a.value(
                    "tokenmeter_ingest_errors_total",
                    reason="unknown_kind") == unknown, timeout=20,
                    what="the 1.2 kinds counted as unknown_kind")
                poll_until(lambda: b.samples().sum(
                    "tokenmeter_ingest_events_total") == len(stripped),
                    timeout=20, what="the 1.1 stream applied")
                poll_until(lambda: a.samples().sum(
                    "tokenmeter_ingest_events_total") == len(stripped),
                    timeout=20, what="the 1.2 stream applied")
                # Only the new kinds were refused; no event, field or
                # frame otherwise.
                sa, sb = a.samples(), b.samples()
                for (name, labels), v in sa.items():
                    if name == "tokenmeter_ingest_errors_total" and \
                            dict(labels)["reason"] != "unknown_kind":
                        self.assertEqual(v, sb.value(name, **dict(labels)),
                                         dict(labels))
                self.assertEqual(comparable(a.metrics_text()),
                                 comparable(b.metrics_text()))

    def test_the_12_engine_into_a_11_daemon(self):
        """A real 1.2 client: the reference engine (libtokenmeter) with
        --disaggregate, admission rejections, priorities, trace context and
        a sleep cycle, into the old daemon. The new kinds are counted as
        unknown_kind and nothing else is refused; every 1.1 figure equals
        the engine's report."""
        engine = os.environ.get("TOKENMETER_ENGINE")
        if not engine:
            self.skipTest("TOKENMETER_ENGINE not set")
        d = Daemon("--log-interval", "0", binary=self.old).start()
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        with tu.Engine(*engine_e2e_test.DISAGGREGATED, socket=d.sock,
                       binary=engine,
                       report=os.path.join(d.dir, "report.json")) as e:
            report = e.report(timeout=90)
        parts = [report[p] for p in ("prefill", "decode")]
        sent = sum(r["client_events_sent"] for r in parts)
        new_kinds = sum(sum(r["admission_rejections"].values())
                        + r["kv_transfer"]["send"]["count"]
                        + r["kv_transfer"]["recv"]["count"]
                        + r["sleep"]["transitions"] for r in parts)
        self.assertGreater(new_kinds, 0)
        self.assertGreater(sum(r["traceparents"] for r in parts), 0)
        poll_until(lambda: d.value("tokenmeter_ingest_errors_total",
                                   reason="unknown_kind") == new_kinds,
                   timeout=20, what="the 1.2 kinds counted as unknown_kind")
        poll_until(lambda: d.samples().sum("tokenmeter_ingest_events_total")
                   == sent - new_kinds, timeout=20,
                   what="every other event applied")
        samples = d.samples()
        self.assertEqual(samples.sum("tokenmeter_ingest_errors_total"),
                         new_kinds)
        for part, r in zip(("prefill", "decode"), parts):
            with self.subTest(part=part):
                engine_e2e_test.assert_counters_equal(
                    self, samples, r, engine_e2e_test.part_labels(part, r))


if __name__ == "__main__":
    SRC = os.path.abspath(sys.argv.pop(1))
    CACHE = os.path.abspath(sys.argv.pop(1))
    NEW = os.path.abspath(sys.argv.pop(1))
    tu.DAEMON = NEW
    if not os.path.exists(os.path.join(SRC, ".git")) and \
            not os.environ.get("TOKENMETERD_OLD12"):
        print("SKIP: no git history in", SRC, flush=True)
        sys.exit(tu.SKIP)
    tu.main()
