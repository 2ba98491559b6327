#!/usr/bin/python3
"""Native histograms on a live Prometheus 2.42 (Debian's /usr/bin/prometheus).

Two tokenmeterd daemons are scraped by two Prometheus servers running
docs/prometheus/prometheus.yml (targets rewritten to the daemons, intervals
1 s, no rule file): "native", started with --enable-feature=native-histograms
(it asks for the protobuf format first and stores each histogram that has
native buckets as one native series), and "classic", without the flag (text
format, classic buckets).

* Accuracy (class Accuracy): the first daemon gets 20,000 requests whose
  time to first token is drawn log-uniformly over 5 ms to 5 s (seeded). On
  the native server, histogram_quantile() of the native series must be
  within 5 % of the exact p50, p90 and p99; the classic server's
  histogram_quantile() over the _bucket series of the same data is printed
  beside it. histogram_count() and histogram_sum() must be exact, and the
  native server must hold no _bucket series (what docs/user-guide.md says
  of 2.42).
* Dashboards (class NativeDashboard): the second daemon is fed by simulated
  vLLM, SGLang and LMDeploy engines (sim_engine.py). For each engine
  family, every target of docs/grafana/tokenmeter.json is evaluated on the
  classic server and the same target of docs/grafana/tokenmeter-native.json
  (scripts/native-dashboard.py) on the native server, with the variables
  set as Grafana sets them ("All" for host, model and engine): the native
  dashboard must return data exactly where the classic one does, while the
  classic dashboard on the native server loses its histogram panels. The
  simulated engines send the protocol 1.2 events, so every target of the
  1.2 panels (admission, waiting by reason, prompt sources, computed
  prompt tokens, preemptions and KV wait per request, KV transfers,
  sleep) must return data on both.

Exits 77 (skipped) when /usr/bin/prometheus is not installed.
"""
import json
import math
import os
import random
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402
import live_prometheus_test as live  # noqa: E402
from sim_engine import SimEngine  # noqa: E402

SRC = live.SRC
DAEMON = live.DAEMON
CLASSIC_DASHBOARD = os.path.join(SRC, "docs", "grafana", "tokenmeter.json")
NATIVE_DASHBOARD = os.path.join(SRC, "docs", "grafana",
                                "tokenmeter-native.json")
MS = 1_000_000
N_REQUESTS = 20_000
TTFT_RANGE_NS = (5 * MS, 5_000 * MS)
QUANTILES = (0.5, 0.9, 0.99)
ACCURACY_MODEL = "accuracy"
FAMILIES = ("vllm", "sglang", "lmdeploy")
# The 1.2 series that every engine fills (live.PROTOCOL_12_ONLY has the
# others): prompt tokens by source, computed prompt tokens and preemptions
# per request.
PER_REQUEST_12 = ("prompt_tokens_by_source",
                  "request_prefill_kv_computed_tokens",
                  "request_num_preemptions")


def exact_quantile(sorted_values, q):
    """The q-quantile of the sample: its ceil(q n)-th smallest value."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def feed_accuracy(daemon, ttfts_ns):
    """One request per TTFT: ARRIVED, the first token TTFT later, FINISHED;
    all in the past, 1,000 requests per batch."""
    t0 = time.monotonic_ns() - 6_000 * MS
    s = daemon.connect()
    s.sendall(tu.hello(engine="vllm", model=ACCURACY_MODEL))
    for seq, start in enumerate(range(0, len(ttfts_ns), 1000)):
        events = []
        for rid in range(start, min(start + 1000, len(ttfts_ns))):
            first = t0 + ttfts_ns[rid]
            events += [[1, t0, rid, 10], [4, first, rid, 1],
                       [5, first + MS, rid, "stop"]]
        s.sendall(tu.batch(events, seq=seq))
    return s


class Env:
    """The daemons, the feeds and the two Prometheus servers."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tm-native-", dir="/tmp")
        self.daemons = []
        self.sims = []
        self.proms = {}
        self.sock = None
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self):
        for _ in range(2):
            d = tu.Daemon("--log-interval", "0", binary=DAEMON)
            self.daemons.append(d)
            d.start()
        rng = random.Random(20_000)
        lo, hi = (math.log(x) for x in TTFT_RANGE_NS)
        self.ttfts_ns = [round(math.exp(rng.uniform(lo, hi)))
                         for _ in range(N_REQUESTS)]
        self.sock = feed_accuracy(self.daemons[0], self.ttfts_ns)
        b = self.daemons[1].sock
        self.sims = [
            SimEngine(b, "vllm", live.VLLM_MODEL, "0", seed=1,
                      profile="vllm"),
            SimEngine(b, "sglang", live.SGLANG_MODEL, "0", seed=4),
            SimEngine(b, "lmdeploy", live.LMDEPLOY_MODEL, "0", seed=3),
        ]
        for s in self.sims:
            s.start()
        targets = [f"127.0.0.1:{d.port}" for d in self.daemons]
        _, text = live.docs_prometheus_yml(targets)
        self.targets = targets
        for name, extra in (("native", ["--enable-feature=native-histograms"]),
                            ("classic", [])):
            prom = live.Prometheus(os.path.join(self.dir, name), text, [],
                                   extra)
            self.proms[name] = prom
            prom.start()
        for prom in self.proms.values():
            prom.wait_ready()
        self._wait_for_data()

    def _wait_for_data(self):
        count = {
            "native": "histogram_count(vllm:time_to_first_token_seconds"
                      f'{{model_name="{ACCURACY_MODEL}"}})',
            "classic": "vllm:time_to_first_token_seconds_count"
                       f'{{model_name="{ACCURACY_MODEL}"}}'}

        def ready():
            missing = {}
            for name, prom in self.proms.items():
                got = prom.vector(count[name])
                if [v for _, v in got] != [N_REQUESTS]:
                    missing[name] = got
                for ns in FAMILIES:
                    r = prom.vector(f"min(count_over_time({ns}:"
                                    "num_requests_running[15s])) >= 6 or "
                                    f"min(count_over_time({ns}:"
                                    "num_running_reqs[15s])) >= 6")
                    if not r:
                        missing[f"{name} {ns}"] = "fewer than 6 scrapes"
            return not missing or missing
        live.poll("every request counted and 6 scrapes of each family",
                  ready, timeout=90)

    def close(self):
        if self.sock is not None:
            self.sock.close()
        live.stop_all(self.sims, [], self.proms.values(), self.daemons,
                      self.dir)


_ENV = []


def shared_env():
    if not _ENV:
        _ENV.append(Env())
    return _ENV[0]


def tearDownModule():  # noqa: N802 (unittest's name)
    live.close_envs(_ENV)


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        tu.need_path(live.PROMETHEUS, "prometheus")
        cls.env = shared_env()
        cls.native = cls.env.proms["native"]
        cls.classic = cls.env.proms["classic"]


class Accuracy(Base):
    SEL = f'{{model_name="{ACCURACY_MODEL}"}}'

    def test_native_quantiles_within_5_percent_of_the_exact_ones(self):
        values = sorted(v / 1e9 for v in self.env.ttfts_ns)
        rows = []
        for q in QUANTILES:
            exact = exact_quantile(values, q)
            (_, native), = self.native.vector(
                f"histogram_quantile({q}, "
                f"vllm:time_to_first_token_seconds{self.SEL})")
            (_, classic), = self.classic.vector(
                f"histogram_quantile({q}, "
                f"vllm:time_to_first_token_seconds_bucket{self.SEL})")
            rows.append((q, exact, native, classic))
        print(f"\n{N_REQUESTS} TTFT values log-uniform over 5 ms..5 s, "
              "histogram_quantile() on a live Prometheus 2.42:")
        print(f"{'quantile':>8} {'exact s':>10} {'native s':>10} "
              f"{'error':>8} {'classic s':>10} {'error':>8}")
        for q, exact, native, classic in rows:
            print(f"{q:>8} {exact:>10.5f} {native:>10.5f} "
                  f"{(native - exact) / exact:>+8.2%} {classic:>10.5f} "
                  f"{(classic - exact) / exact:>+8.2%}")
        for q, exact, native, _ in rows:
            self.assertLessEqual(abs(native - exact) / exact, 0.05,
                                 f"p{q}: native {native}, exact {exact}")

    def test_native_count_and_sum_are_exact(self):
        (_, count), = self.native.vector(
            f"histogram_count(vllm:time_to_first_token_seconds{self.SEL})")
        (_, total), = self.native.vector(
            f"histogram_sum(vllm:time_to_first_token_seconds{self.SEL})")
        self.assertEqual(count, N_REQUESTS)
        self.assertAlmostEqual(total, sum(self.env.ttfts_ns) / 1e9,
                               delta=1e-9 * total)

    def test_histogram_fraction_reads_a_share_under_a_bound(self):
        """The user guide's histogram_fraction() example: the share of
        requests whose first token came within 500 ms."""
        exact = sum(v <= 500 * MS for v in self.env.ttfts_ns) / N_REQUESTS
        (_, got), = self.native.vector(
            "histogram_fraction(0, 0.5, "
            f"vllm:time_to_first_token_seconds{self.SEL})")
        self.assertAlmostEqual(got, exact, delta=0.01)

    def test_native_server_stores_only_the_native_form(self):
        """Prometheus 2.42: a histogram with native buckets loses its
        _bucket, _sum and _count series; the classic server keeps them and
        has no native series."""
        for suffix in ("_bucket", "_sum", "_count"):
            self.assertEqual(self.native.vector(
                f"vllm:time_to_first_token_seconds{suffix}{self.SEL}"), [])
            self.assertNotEqual(self.classic.vector(
                f"vllm:time_to_first_token_seconds{suffix}{self.SEL}"), [])
        self.assertEqual(self.classic.vector(
            f"vllm:time_to_first_token_seconds{self.SEL}"), [])
        # The native series is one sample per scrape holding the whole
        # histogram (the API answers "histogram", not "value").
        r = self.native.query(f"vllm:time_to_first_token_seconds{self.SEL}")
        (series,) = r["data"]["result"]
        self.assertIn("histogram", series)
        self.assertEqual(series["histogram"][1]["count"], str(N_REQUESTS))


def dashboard_exprs(dashboard, ns):
    """{(panel title, refId): expression} with the variables set as Grafana
    sets them for engine family `ns` and everything else "All"."""
    values = {}
    for var in dashboard["templating"]["list"]:
        name = var["name"]
        if name == "job":
            values[name] = "tokenmeter"
        elif name == "namespace":
            values[name] = ns
        elif var.get("includeAll"):
            values[name] = live.format_var(var, None)
    out = {}
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            out[(p["title"], t["refId"])] = live.interpolate(t["expr"],
                                                             values)
    return out


def has_data(prom, expr):
    r = prom.query(expr)
    assert r.get("status") == "success", (expr, r)
    return bool(live.finite_values(r["data"]))


class NativeDashboard(Base):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        with open(CLASSIC_DASHBOARD) as f:
            cls.classic_dash = json.load(f)
        with open(NATIVE_DASHBOARD) as f:
            cls.native_dash = json.load(f)

    def test_native_dashboard_has_data_wherever_the_classic_one_has(self):
        checked = 0
        histogram_panels = 0
        proto12 = 0
        for ns in FAMILIES:
            classic = dashboard_exprs(self.classic_dash, ns)
            native = dashboard_exprs(self.native_dash, ns)
            titles = {t for t, _ in classic}
            self.assertEqual(titles, {t for t, _ in native})
            for title in sorted(titles):
                c = {r: e for (t, r), e in classic.items() if t == title}
                n = {r: e for (t, r), e in native.items() if t == title}
                c_data = {r: has_data(self.classic, e) for r, e in c.items()}
                n_data = {r: has_data(self.native, e) for r, e in n.items()}
                if set(c) == set(n):
                    want = c_data
                else:  # a heatmap turned into three quantiles
                    want = {r: any(c_data.values()) for r in n}
                with self.subTest(family=ns, panel=title):
                    self.assertEqual(n_data, want, {r: n[r] for r in n})
                    for r, e in n.items():
                        if live.names_protocol_12_only(e) or any(
                                n in e for n in PER_REQUEST_12):
                            proto12 += 1
                            self.assertTrue(n_data[r], e)
                if any(e != n.get(r) for r, e in c.items()):
                    histogram_panels += 1
                checked += len(n)
        self.assertGreater(checked, 150)
        self.assertGreater(histogram_panels, 30)
        # The 1.2 panels' 21 queries, and the prefix-cache hit rate's (its
        # LMDeploy alternative subtracts prompt_tokens_by_source).
        self.assertEqual(proto12, 22 * len(FAMILIES))

    def test_classic_dashboard_on_the_native_server_loses_the_histograms(self):
        """Why the second dashboard exists: on 2.42 with native histograms
        the classic quantile panels are empty."""
        for ns in FAMILIES:
            exprs = dashboard_exprs(self.classic_dash, ns)
            ttft = exprs[("Time to first token", "A")]
            self.assertTrue(has_data(self.classic, ttft), ttft)
            self.assertFalse(has_data(self.native, ttft), ttft)


if __name__ == "__main__":
    if not os.access(live.PROMETHEUS, os.X_OK):
        tu.skip(f"{live.PROMETHEUS} not installed")
    tu.main()
