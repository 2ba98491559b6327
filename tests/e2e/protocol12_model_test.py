#!/usr/bin/python3
"""Protocol 1.2 against an independent model of the spec.

Random streams of the 1.2 events (SCHEDULED info, KV_TRANSFER, PREEMPTED,
ADMISSION_REJECTED, SLEEP, STEP waiting_deferred, ARRIVED priority and
trace context), each request's events delivered in a random order and the
requests interleaved, go through a real Unix socket into a real
tokenmeterd. A model written from protocol-v1.md "Additions in 1.2" and
metrics-v1.md "Catalog 1.2 additions" (not from the daemon's code: it
replays the stream event by event, in delivery order, with its own state)
predicts every 1.2 figure; the daemon's /metrics must equal it exactly
(counts and bucket counts; sums to the last bit of their decimal text).

Usage: protocol12_model_test.py TOKENMETERD [unittest args]
       TOKENMETER_MODEL_SEEDS=N runs N seeds (default 6).
"""
import bisect
import os
import random
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402
from tokenmeter_testutil import Daemon, batch, hello, poll_until  # noqa: E402

MS = 1_000_000
NS = "vllm"
LABELS = dict(model_name="m", engine="0")

# metrics-v1.md bucket sets (exposed units).
PHASE = [0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120,
         240, 480, 960, 1920, 7680]
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1,
       2.5, 5, 7.5, 10, 20, 40, 80]
PREEMPTIONS = [0, 1, 2, 3, 4, 5, 10, 20]
KV_BYTES = [2.0 ** e for e in range(11, 34, 2)]


def one_two_five(top):
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > top:
                return out
            out.append(m * scale)
        scale *= 10


TOKENS = one_two_five(32768)


class Hist:
    """A classic histogram: bucket counts (non-cumulative), count, raw sum."""

    def __init__(self, bounds, divisor=1):
        self.bounds = bounds
        self.divisor = divisor
        self.counts = [0] * (len(bounds) + 1)
        self.raw_sum = 0

    def observe(self, raw):
        self.counts[bisect.bisect_left(self.bounds, raw / self.divisor)] += 1
        self.raw_sum += raw

    def count(self):
        return sum(self.counts)


class Model:
    """The spec's 1.2 figures for one engine series, fed in delivery order."""

    def __init__(self):
        self.req = {}
        self.by_source = {"local_compute": 0, "local_cache_hit": 0,
                          "external_kv_transfer": 0}
        self.cached = 0
        self.computed = Hist(TOKENS)
        self.preempt = Hist(PREEMPTIONS)
        self.kv_wait = Hist(PHASE, 1e9)
        self.kv_negative = 0  # KV waits whose recv came before SCHEDULED
        self.kv_time = {r: Hist(ITL, 1e9) for r in ("send", "recv")}
        self.kv_bytes = {r: Hist(KV_BYTES) for r in ("send", "recv")}
        self.kv_fail = {"send": {}, "recv": {}}
        self.admission = {}
        self.admission_other = 0
        self.bad_field = 0
        self.waiting = None  # (capacity, deferred) once deferred seen
        self.sleep = None    # [scheduler, weights, kv_cache] once sent

    def r(self, rid):
        return self.req.setdefault(rid, dict(
            arrived=None, prompt=0, sched=None, info=None, first=False,
            finished=False, preempt=0, kv_ready=None, kv_open=False,
            ttft_done=False,
            stats_done=False))

    def _settle(self, q):
        # Prompt tokens by source: when ARRIVED and the first token are
        # both known.
        if not q["ttft_done"] and q["arrived"] is not None and q["first"]:
            q["ttft_done"] = True
            c, e = q["info"] or (0, 0)
            self.by_source["local_compute"] += q["prompt"] - c - e
            self.by_source["local_cache_hit"] += c
            self.by_source["external_kv_transfer"] += e
            self.cached += c + e
        # Per-request histograms: when FINISHED and ARRIVED are known.
        if not q["stats_done"] and q["finished"] and \
                q["arrived"] is not None:
            q["stats_done"] = True
            c, e = q["info"] or (0, 0)
            self.computed.observe(q["prompt"] - c - e)
            self.preempt.observe(q["preempt"])
        # The KV wait: exists for a finished request with a successful recv
        # (one after the FINISHED too), closes once SCHEDULED is known (no
        # ARRIVED needed).
        if q["kv_open"] and q["sched"] is not None:
            q["kv_open"] = False
            if q["kv_ready"] >= q["sched"]:
                self.kv_wait.observe(q["kv_ready"] - q["sched"])
            else:
                self.kv_negative += 1

    def apply(self, ev):
        kind = ev[0]
        if kind == 9:
            reason = ev[2]
            if reason in self.admission:
                self.admission[reason] += 1
            elif len(self.admission) < 16:
                self.admission[reason] = 1
            else:
                self.admission_other += 1
            return
        if kind == 11:
            if self.sleep is None:
                self.sleep = ["running", "resident", "resident"]
            for i, key in enumerate(("scheduler", "weights", "kv_cache")):
                if key in ev[2]:
                    self.sleep[i] = ev[2][key]
            return
        if kind == 7:
            st = ev[2]
            if "waiting_deferred" in st:
                if "waiting" not in st or st["waiting_deferred"] > st["waiting"]:
                    self.bad_field += 1
                else:
                    self.waiting = (st["waiting"] - st["waiting_deferred"],
                                    st["waiting_deferred"])
                    return
            if "waiting" in st and self.waiting is not None:
                self.waiting = (st["waiting"], 0)
            return
        if kind == 10:
            info = ev[3]
            role = info["role"]
            self.kv_time[role].observe(ev[1] - info["start"])
            if "bytes" in info:
                self.kv_bytes[role].observe(info["bytes"])
            ok = info.get("ok", True)
            if not ok:
                reason = info.get("reason", "error")
                f = self.kv_fail[role]
                if reason in f or len(f) < 16:
                    f[reason] = f.get(reason, 0) + 1
                else:
                    f["__other__"] = f.get("__other__", 0) + 1
            if role == "recv" and ok:
                q = self.r(ev[2])
                if q["kv_ready"] is None:
                    q["kv_ready"] = ev[1]
                    q["kv_open"] = q["finished"]
                    self._settle(q)
            return
        q = self.r(ev[2])
        if kind == 1:
            if q["arrived"] is None:
                q["arrived"] = ev[1]
                q["prompt"] = ev[3]
                if q["info"] is not None and sum(q["info"]) > q["prompt"]:
                    q["info"] = None
                    self.bad_field += 1
        elif kind == 3:
            if q["sched"] is None:
                q["sched"] = ev[1]
                if len(ev) > 3:
                    c = ev[3].get("cached_tokens", 0)
                    e = ev[3].get("external_tokens", 0)
                    if q["arrived"] is not None and c + e > q["prompt"]:
                        self.bad_field += 1
                    else:
                        q["info"] = (c, e)
        elif kind == 4:
            q["first"] = True
        elif kind == 6:
            if not q["finished"]:
                q["preempt"] += 1
        elif kind == 5:
            if not q["finished"]:
                q["kv_open"] = q["kv_ready"] is not None
            q["finished"] = True
        self._settle(q)


def random_stream(rng, t0):
    """One stream: a list of events in delivery order (seq of batches)."""
    per_request = []
    t = t0
    for rid in range(1, rng.randint(30, 60)):
        ev = []
        prompt = rng.randint(1, 4000)
        a = t + rng.randint(0, 50) * MS
        ev.append([1, a, rid, prompt,
                   {"priority": rng.randint(-3, 3)} if rng.random() < 0.5
                   else {}])
        s = a + rng.randint(1, 400) * MS + rng.randint(0, 999)
        sched = [3, s, rid]
        x = rng.random()
        if x < 0.6:
            c = rng.randint(0, prompt)
            e = rng.randint(0, prompt - c)
            if rng.random() < 0.1:
                e = prompt - c + rng.randint(1, 5)  # above the prompt
            info = {}
            if c or rng.random() < 0.5:
                info["cached_tokens"] = c
            if e or rng.random() < 0.5:
                info["external_tokens"] = e
            sched.append(info)
        ev.append(sched)
        # Decode side: KV transfers around SCHEDULED, some failing.
        for _ in range(rng.randint(0, 3)):
            start = s + rng.randint(-100, 300) * MS
            end = start + rng.randint(0, 3000) * MS // 10 + rng.randint(1, 999)
            info = {"role": "recv", "start": start}
            if rng.random() < 0.7:
                info["bytes"] = rng.randint(0, 1 << 34)
            if rng.random() < 0.3:
                info["ok"] = False
                if rng.random() < 0.7:
                    info["reason"] = rng.choice(["timeout", "nixl_error"])
            ev.append([10, end, rid, info])
        first = s + rng.randint(1, 900) * MS
        ev.append([4, first, rid, 1])
        for k in range(rng.randint(0, 3)):
            ev.append([6, first + (k + 1) * MS, rid])
        ev.append([4, first + 9 * MS, rid, rng.randint(1, 5)])
        ev.append([5, first + 10 * MS, rid,
                   rng.choice(["stop", "length", "abort"])])
        # Random delivery order within the request, mostly in order.
        if rng.random() < 0.5:
            rng.shuffle(ev)
        per_request.append(ev)
        t += rng.randint(0, 20) * MS
    # Prefill side of the same host: sends, which touch no request.
    for rid in range(1000, 1000 + rng.randint(0, 20)):
        start = t0 + rng.randint(0, 3000) * MS
        info = {"role": "send", "start": start, "connector": "uds",
                "bytes": rng.randint(0, 1 << 30)}
        if rng.random() < 0.2:
            info["ok"] = False
            info["reason"] = "r%d" % rng.randint(0, 20)  # past 16 reasons
        per_request.append([[10, start + rng.randint(1, 10**9), rid, info]])
    # Engine-wide events.
    engine = []
    for i in range(rng.randint(0, 40)):
        engine.append([9, t0 + i * MS, "r%d" % rng.randint(0, 25)]
                      + ([rng.randint(1, 9)] if rng.random() < 0.5 else []))
    for i in range(rng.randint(1, 8)):
        w = rng.randint(0, 50)
        st = {"waiting": w}
        if rng.random() < 0.6:
            st["waiting_deferred"] = rng.randint(0, w + 3)
        if rng.random() < 0.1:
            st = {"waiting_deferred": 1}
        engine.append([7, t0 + i * MS, st])
    for i in range(rng.randint(0, 5)):
        state = {}
        if rng.random() < 0.6:
            state["scheduler"] = rng.choice(["running", "paused"])
        if rng.random() < 0.6:
            state["weights"] = rng.choice(
                ["resident", "offloaded", "discarded"])
        if rng.random() < 0.6:
            state["kv_cache"] = rng.choice(["resident", "released"])
        engine.append([11, t0 + i * MS, state])
    per_request.append(engine)
    # Interleave: repeatedly take the next event of a random stream.
    out = []
    queues = [list(q) for q in per_request]
    while queues:
        i = rng.randrange(len(queues))
        out.append(queues[i].pop(0))
        if not queues[i]:
            queues.pop(i)
    return out


class ModelAgainstDaemon(unittest.TestCase):
    def run_seed(self, seed):
        rng = random.Random(seed)
        d = Daemon("--log-interval", "0").start()
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        t0 = time.monotonic_ns() - 600 * 1000 * MS
        events = random_stream(rng, t0)
        model = Model()
        for ev in events:
            model.apply(ev)
        s = d.connect()
        self.addCleanup(s.close)
        s.sendall(hello())
        for i in range(0, len(events), 50):
            s.sendall(batch(events[i:i + 50], seq=i))
        s.sendall(tu.frame(2))
        n = len(events)

        def applied():
            v = d.samples()
            got = sum(x for (name, lab), x in v.items()
                      if name == "tokenmeter_ingest_events_total")
            return got >= n
        poll_until(applied, timeout=20, what="every event applied")
        got = d.samples()

        def value(name, **labels):
            return got.value(name, **{**LABELS, **labels})

        def buckets(name, **labels):
            """{upper bound: cumulative count} of one histogram."""
            want = {**LABELS, **labels}
            out = {}
            for (n, ls), v in got.items():
                ls = dict(ls)
                le = ls.pop("le", None)
                if n == name + "_bucket" and ls == want:
                    out[float(le)] = v
            return out

        msg = "seed %d" % seed
        self.assertEqual(got.value("tokenmeter_ingest_errors_total",
                                   reason="bad_field"),
                         model.bad_field, msg)
        for src, n_tokens in model.by_source.items():
            self.assertEqual(value(NS + ":prompt_tokens_by_source_total",
                                   source=src), n_tokens, msg + " " + src)
        self.assertEqual(value(NS + ":prompt_tokens_cached_total"),
                         model.cached, msg)
        self.assertEqual(
            sum(model.by_source.values()),
            value(NS + ":prompt_tokens_total"), msg)

        def check_hist(name, h, **labels):
            want, cum = {}, 0
            for b, c in zip(h.bounds + [float("inf")], h.counts):
                cum += c
                want[float(b)] = cum
            self.assertEqual(buckets(name, **labels), want, msg + " " + name)
            self.assertEqual(value(name + "_count", **labels), h.count(),
                             msg + " " + name)
            self.assertEqual(value(name + "_sum", **labels),
                             h.raw_sum / h.divisor, msg + " " + name)

        check_hist(NS + ":request_prefill_kv_computed_tokens", model.computed)
        check_hist(NS + ":request_num_preemptions", model.preempt)
        check_hist(NS + ":request_kv_wait_time_seconds", model.kv_wait)
        self.assertEqual(got.value("tokenmeter_negative_intervals_total",
                                   interval="kv_wait_time"),
                         model.kv_negative, msg)
        for role in ("send", "recv"):
            if model.kv_time[role].count():
                check_hist(NS + ":kv_transfer_time_seconds",
                           model.kv_time[role], role=role)
            if model.kv_bytes[role].count():
                check_hist(NS + ":kv_transfer_bytes", model.kv_bytes[role],
                           role=role)
            for reason, c in model.kv_fail[role].items():
                self.assertEqual(value(NS + ":kv_transfer_failures_total",
                                       role=role, reason=reason), c,
                                 msg + " " + role + " " + reason)
        names = [k for k in got
                 if k[0] == NS + ":kv_transfer_failures_total"]
        self.assertEqual(len(names), sum(len(f) for f in
                                         model.kv_fail.values()), msg)
        for reason, c in model.admission.items():
            self.assertEqual(value(NS + ":admission_rejections_total",
                                   reason=reason), c, msg + " " + reason)
        if model.admission_other:
            self.assertEqual(value(NS + ":admission_rejections_total",
                                   reason="__other__"),
                             model.admission_other, msg)
        if model.waiting is None:
            self.assertIsNone(value(NS + ":num_requests_waiting_by_reason",
                                    reason="capacity"), msg)
        else:
            self.assertEqual(value(NS + ":num_requests_waiting_by_reason",
                                   reason="capacity"), model.waiting[0], msg)
            self.assertEqual(value(NS + ":num_requests_waiting_by_reason",
                                   reason="deferred"), model.waiting[1], msg)
        if model.sleep is None:
            self.assertIsNone(value(NS + ":engine_fully_awake"), msg)
        else:
            sched, weights, kv = model.sleep
            awake = sched == "running" and weights == "resident" and \
                kv == "resident"
            self.assertEqual(value(NS + ":engine_fully_awake"), int(awake),
                             msg)
            self.assertEqual(value(NS + ":engine_sleep_state",
                                   sleep_state="awake"), int(awake), msg)
            self.assertEqual(value(NS + ":engine_sleep_state",
                                   sleep_state="weights_offloaded"),
                             int(weights == "offloaded"), msg)
            self.assertEqual(value(NS + ":engine_sleep_state",
                                   sleep_state="discard_all"),
                             int(weights == "discarded"), msg)
            for res, states, now in (
                    ("scheduler", ("running", "paused"), sched),
                    ("weights", ("resident", "offloaded", "discarded"),
                     weights),
                    ("kv_cache", ("resident", "released"), kv)):
                for st in states:
                    self.assertEqual(
                        value(NS + ":engine_sleep_resource_state",
                              resource=res, state=st), int(st == now),
                        "%s %s %s" % (msg, res, st))

    def test_random_streams(self):
        seeds = int(os.environ.get("TOKENMETER_MODEL_SEEDS", "6"))
        base = int(os.environ.get("TOKENMETER_MODEL_SEED", "1200"))
        for seed in range(base, base + seeds):
            with self.subTest(seed=seed):
                self.run_seed(seed)


if __name__ == "__main__":
    tu.DAEMON = os.path.abspath(sys.argv.pop(1))
    tu.main()
