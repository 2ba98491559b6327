#!/usr/bin/python3
"""tokenmeter's vLLM stat-logger plugin (tokenmeter.integrations.vllm)
against the vLLM v0.12 stand-in (tests/python/standins/vllm: vLLM's
interfaces, not vLLM, which needs torch and a GPU) and a real tokenmeterd.

* EntryPoint: the entry point pyproject.toml declares is what vLLM's
  loader (load_stat_logger_plugin_factories(), VLLM_PLUGINS) finds, and
  what StatLoggerManager builds: an aggregate logger beside vLLM's own
  Prometheus logger; TOKENMETER_VLLM=0 turns it off.
* SameSeries: a replayed workload (tests/python/standins/vllm_workload.py:
  two data-parallel engines, speculative decoding, parallel sampling,
  preemptions, every finish reason, a sleep cycle; fixed seed) goes through
  StatLoggerManager to both the plugin and the stand-in's reimplementation
  of vLLM's PrometheusStatLogger; the daemon's /metrics must equal that
  registry sample by sample (counts and buckets exactly, sums to rounding:
  the plugin sends whole nanoseconds) for every series both have, and the
  families only vLLM has must be the ones docs/integrations.md lists.
* NeverRaises: a daemon that is not there, stats that are not stats, a
  negative duration, a finish reason the protocol lacks: record() returns,
  counts, logs once.
* Dashboard: every expression of vLLM's own Grafana dashboard
  (shared/peers/vllm/grafana-exprs.txt) returns data on a live Prometheus
  scraping the daemon the plugin feeds (skipped without /usr/bin/prometheus
  or the peers directory).

Environment: TOKENMETERD; PYTHONPATH with the tokenmeter package.
"""
import json
import logging
import math
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import tomllib
import unittest
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "standins"))
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
import prometheus_client  # noqa: E402
import tokenmeter_testutil as tu  # noqa: E402
from vllm.config import (ModelConfig, SpeculativeConfig,  # noqa: E402
                         VllmConfig)
from vllm.v1.engine import FinishReason  # noqa: E402
from vllm.v1.metrics import loggers  # noqa: E402
from vllm.v1.metrics.stats import (FinishedRequestStats,  # noqa: E402
                                   IterationStats, SchedulerStats)
from vllm_workload import Workload  # noqa: E402

from tokenmeter.integrations import vllm as plugin  # noqa: E402

MODEL = "org/model-a"
MAX_MODEL_LEN = 2048
PROMETHEUS = os.environ.get("PROMETHEUS", "/usr/bin/prometheus")

# vLLM v0.12 families the plugin cannot feed from what a stat logger gets,
# each with why (docs/integrations.md, "vLLM", says the same).
NOT_FED = {
    # The external (KV-connector) prefix cache and the multi-modal cache:
    # tokenmeterd has no such series.
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:mm_cache_queries_total",
    "vllm:mm_cache_hits_total",
}
# vllm:cache_config_info: tokenmeterd's carries model_name too (every
# engine series does); compared label by label below.


def entry_points_txt():
    """pyproject.toml's entry points as the wheel's entry_points.txt."""
    with open(os.path.join(SRC, "pyproject.toml"), "rb") as f:
        groups = tomllib.load(f)["project"]["entry-points"]
    out = []
    for group, eps in groups.items():
        out.append(f"[{group}]")
        out += [f"{name} = {target}" for name, target in eps.items()]
    return "\n".join(out) + "\n"


class WithEntryPoint(unittest.TestCase):
    """sys.path holds a dist-info with pyproject.toml's entry points (what
    installing the wheel gives; wheel_test.py checks the wheel's own)."""

    @classmethod
    def setUpClass(cls):
        cls.site = tempfile.mkdtemp(prefix="tm-vllm-site-")
        info = os.path.join(cls.site, "tokenmeter-0.0.0.dist-info")
        os.mkdir(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: tokenmeter\n"
                    "Version: 0.0.0\n")
        with open(os.path.join(info, "entry_points.txt"), "w") as f:
            f.write(entry_points_txt())
        sys.path.insert(0, cls.site)

    @classmethod
    def tearDownClass(cls):
        sys.path.remove(cls.site)
        shutil.rmtree(cls.site, True)

    def setUp(self):
        for var in ("VLLM_PLUGINS", plugin.ENV_VAR, plugin.SOCKET_VAR):
            self.addCleanup(os.environ.pop, var, None)
            os.environ.pop(var, None)
        self.registry = prometheus_client.CollectorRegistry()
        loggers.PrometheusStatLogger.registry = self.registry

    def daemon(self):
        d = tu.Daemon("--log-interval", "0", "--max-model-len",
                      str(MAX_MODEL_LEN)).start()
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        os.environ[plugin.SOCKET_VAR] = d.sock
        return d

    def manager(self, engines=(0,), spec=3):
        """vLLM's AsyncLLM set-up: the plugins' factories, then the
        manager over the engines."""
        cfg = VllmConfig(
            model_config=ModelConfig(model=MODEL,
                                     max_model_len=MAX_MODEL_LEN),
            speculative_config=SpeculativeConfig(spec) if spec else None)
        m = loggers.StatLoggerManager(
            cfg, engine_idxs=list(engines),
            custom_stat_loggers=loggers.load_stat_logger_plugin_factories())
        ours = [x for x in m.stat_loggers
                if isinstance(x, plugin.TokenmeterStatLogger)]
        self.assertEqual(len(ours), 1, m.stat_loggers)
        self.addCleanup(self.close_clients, ours[0])
        return m, ours[0]

    @staticmethod
    def close_clients(p):
        for c in p.clients.values():
            c.close()

    @staticmethod
    def flush(p):
        for c in p.clients.values():
            c.flush(10)


class EntryPoint(WithEntryPoint):
    def test_vllms_loader_finds_the_plugin(self):
        self.assertEqual(loggers.load_stat_logger_plugin_factories(),
                         [plugin.TokenmeterStatLogger])
        os.environ["VLLM_PLUGINS"] = "tokenmeter"
        self.assertEqual(loggers.load_stat_logger_plugin_factories(),
                         [plugin.TokenmeterStatLogger])
        os.environ["VLLM_PLUGINS"] = "someone_else"
        self.assertEqual(loggers.load_stat_logger_plugin_factories(), [])

    def test_an_aggregate_logger_beside_vllms_own(self):
        d = self.daemon()
        m, p = self.manager(engines=(0, 3))
        self.assertIsInstance(p, loggers.AggregateStatLoggerBase)
        self.assertIsInstance(m.stat_loggers[-1],
                              loggers.PrometheusStatLogger)
        self.assertEqual(p.engine_indexes, [0, 3])
        self.assertEqual(p.clients, {})  # made once vLLM's engines are up
        m.log_engine_initialized()
        self.assertEqual(sorted(p.clients), [0, 3])
        self.flush(p)
        # HELLO: engine vllm, the served model, the engine index; the
        # cache_config labels; vLLM's engines start awake.
        for idx in ("0", "3"):
            labels = {"model_name": MODEL, "engine": idx}
            d.wait_value("vllm:engine_sleep_state", 1, sleep_state="awake",
                         **labels)
            self.assertEqual(d.value("vllm:cache_config_info",
                                     block_size="16", cache_dtype="auto",
                                     enable_prefix_caching="True",
                                     gpu_memory_utilization="0.9",
                                     num_cpu_blocks="None",
                                     num_gpu_blocks="None", **labels), 1)

    def test_a_per_engine_construction_works_too(self):
        # vLLM without aggregate loggers calls factory(vllm_config, index).
        p = plugin.TokenmeterStatLogger(VllmConfig(), 2)
        self.assertEqual(p.engine_indexes, [2])

    def test_off_switch(self):
        d = self.daemon()
        os.environ[plugin.ENV_VAR] = "0"
        m, p = self.manager()
        m.log_engine_initialized()
        w = Workload(seed=2)
        for _ in range(20):
            for e, s, it in w.step():
                m.record(s, it, engine_idx=e)
        m.record_sleep_state(1, 1)
        self.assertEqual(p.clients, {})
        self.assertEqual(p.errors, 0)
        time.sleep(0.2)
        self.assertEqual(d.samples().sum("tokenmeter_ingest_connections_total"),
                         0)


def normalized(labels):
    """Labels with `le` as a number (prometheus_client writes 1.0 where
    tokenmeterd writes 1: the same bound)."""
    return frozenset((k, float(v) if k == "le" else v)
                     for k, v in dict(labels).items())


def reference_samples(registry):
    """{(name, labels): value} of the reference logger's registry, without
    prometheus_client's _created samples."""
    out = {}
    for fam in registry.collect():
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            out[(s.name, normalized(s.labels))] = s.value
    return out


def family_of(name):
    for suffix in ("_bucket", "_count", "_sum"):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


class SameSeries(WithEntryPoint):
    ITERATIONS = 700  # per engine: about 20 s of the workload's clock

    def test_daemon_series_equal_vllms_own(self):
        d = self.daemon()
        m, p = self.manager(engines=(0, 1), spec=3)
        m.log_engine_initialized()
        w = Workload(seed=7, engines=(0, 1), spec_tokens=3,
                     max_model_len=MAX_MODEL_LEN, kv_blocks=300)
        for i in range(self.ITERATIONS):
            if i == 300:
                m.record_sleep_state(1, 1)  # level 1: weights offloaded
            if i == 320:
                m.record_sleep_state(0, 0)  # awake
            if i == 600:
                m.record_sleep_state(1, 2)  # level 2: discard all
            for e, s, it in w.step():
                m.record(s, it, engine_idx=e)
        self.assertEqual(p.errors, 0)
        self.assertEqual(p.durations_dropped, 0)
        self.assertEqual(p.reasons_dropped, 0)
        self.assertEqual(p.group_figures_dropped, 0)
        self.flush(p)
        ref = reference_samples(self.registry)
        # Everything applied: the requests the reference counted.
        want = sum(v for (n, _), v in ref.items()
                   if n == "vllm:request_success_total")
        self.assertGreater(want, 500)
        tu.poll_until(lambda: d.samples().sum("vllm:request_success_total")
                      == want, timeout=20, what="every summary applied")
        got = {(n, normalized(ls)): v for (n, ls), v in d.samples().items()}
        compared, missing, differ = 0, set(), []
        for (name, labels), v in sorted(ref.items(), key=str):
            lab = dict(labels)
            if family_of(name) == "vllm:cache_config_info":
                continue
            g = got.get((name, labels))
            if g is None:
                missing.add(name)
                continue
            compared += 1
            if name.endswith("_sum"):
                count = ref[(family_of(name) + "_count", labels)]
                ok = math.isclose(g, v, rel_tol=1e-9, abs_tol=1e-9 * count)
            else:
                ok = g == v
            if not ok:
                differ.append((name, lab, v, g))
        self.assertEqual(differ, [])
        self.assertEqual(missing, NOT_FED)
        # cache_config_info: vLLM's labels (and engine), model_name added.
        infos = [dict(ls) for (n, ls), _ in ref.items()
                 if n == "vllm:cache_config_info"]
        self.assertEqual(len(infos), 2)
        for lab in infos:
            lab["model_name"] = MODEL
            self.assertEqual(got.get(("vllm:cache_config_info",
                                      normalized(lab))), 1.0)
        # What the workload covered, so that the comparison means something.
        def total(name, **labels):
            return sum(v for (n, ls), v in ref.items() if n == name and
                       labels.items() <= dict(ls).items())
        for reason in ("stop", "length", "abort", "error"):
            self.assertGreater(total("vllm:request_success_total",
                                     finished_reason=reason), 0, reason)
        self.assertGreater(total("vllm:num_preemptions_total"), 0)
        self.assertGreater(total("vllm:request_params_n_count"),
                           total("vllm:request_params_n_bucket", le="1.0"))
        self.assertGreater(total("vllm:spec_decode_num_drafts_total"), 0)
        self.assertGreater(total("vllm:request_params_max_tokens_count"), 0)
        self.assertEqual(total("vllm:engine_sleep_state",
                               sleep_state="discard_all"), 2)
        self.assertGreater(compared, 500)
        print(f"\n{compared} samples equal over {want:.0f} requests, "
              f"{self.ITERATIONS} iterations x 2 engines", file=sys.stderr)
        self.assertEqual(sum(v for (n, _), v in got.items()
                             if n == "tokenmeter_ingest_errors_total"), 0)


class NeverRaises(WithEntryPoint):
    def test_daemon_away_costs_nothing_but_drops(self):
        os.environ[plugin.SOCKET_VAR] = "/nonexistent/tokenmeter.sock"
        m, p = self.manager(engines=(0,))
        m.log_engine_initialized()
        w = Workload(seed=4)
        steps = [x for _ in range(200) for x in w.step()]
        t0 = time.perf_counter()
        for e, s, it in steps:
            p.record(s, it, engine_idx=e)
        took = time.perf_counter() - t0
        self.assertEqual(p.errors, 0)
        self.assertLess(took / len(steps), 0.005)  # never blocks
        st = p.clients[0].stats()
        self.assertEqual(st.events_sent, 0)
        self.assertEqual(st.connected, 0)

    def test_bad_stats_are_counted_and_logged_once(self):
        os.environ[plugin.SOCKET_VAR] = "/nonexistent/tokenmeter.sock"
        p = plugin.TokenmeterStatLogger(VllmConfig(), [0])
        self.addCleanup(self.close_clients, p)
        with self.assertLogs("tokenmeter.integrations.vllm",
                             logging.WARNING) as logs:
            self.assertIsNone(p.record(object(), None))
            self.assertIsNone(p.record(SchedulerStats(), object()))
            self.assertIsNone(p.record_sleep_state("x", object()))
        self.assertEqual(len(logs.records), 1)
        self.assertIn("record() failed", logs.output[0])
        self.assertEqual(p.errors, 2)

    def test_negative_durations_and_unknown_reasons_are_not_sent(self):
        d = self.daemon()
        p = plugin.TokenmeterStatLogger(VllmConfig(), [0])
        self.addCleanup(self.close_clients, p)
        it = IterationStats()
        it.num_prompt_tokens = 5
        it.time_to_first_tokens_iter = [0.25, -0.001]

        class Repetition:
            def __str__(self):
                return "repetition"  # a later vLLM's reason
        it.finished_requests = [
            # vLLM computes queued_time = scheduled_ts - queued_ts, negative
            # for a request aborted before it was scheduled.
            FinishedRequestStats(FinishReason.ABORT, e2e_latency=0.5,
                                 num_prompt_tokens=5, queued_time=-5000.0),
            FinishedRequestStats(Repetition(), e2e_latency=1.0)]
        p.record(SchedulerStats(), it)
        self.assertEqual(p.errors, 0)
        self.assertEqual(p.durations_dropped, 2)
        self.assertEqual(p.reasons_dropped, 1)
        self.flush(p)
        labels = {"model_name": "facebook/opt-125m", "engine": "0"}
        d.wait_value("vllm:request_success_total", 1, finished_reason="abort",
                     **labels)
        self.assertEqual(d.value("vllm:e2e_request_latency_seconds_count",
                                 **labels), 1)
        self.assertEqual(d.value("vllm:request_queue_time_seconds_count",
                                 **labels), 0)
        self.assertEqual(d.value("vllm:time_to_first_token_seconds_count",
                                 **labels), 1)
        self.assertEqual(d.value("vllm:prompt_tokens_total", **labels), 5)


class Dashboard(WithEntryPoint):
    EXPRS = os.path.join(tu.peers_dir(), "vllm", "grafana-exprs.txt")
    RATE = "3s"

    def test_every_vllm_dashboard_expression_returns_data(self):
        path = tu.need_path(self.EXPRS, "vLLM's dashboard expressions")
        if not os.path.exists(PROMETHEUS):
            self.skipTest(f"{PROMETHEUS} is not installed")
        with open(path) as f:
            exprs = [ln.strip() for ln in f if ln.strip()]
        d = self.daemon()
        pdir = tempfile.mkdtemp(prefix="tm-vllm-prom-")
        self.addCleanup(shutil.rmtree, pdir, True)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with open(os.path.join(pdir, "prometheus.yml"), "w") as f:
            f.write("global:\n  scrape_interval: 250ms\n"
                    "scrape_configs:\n  - job_name: tokenmeter\n"
                    "    static_configs:\n"
                    f"      - targets: ['{d.host}:{d.port}']\n")
        proc, log = tu.start_prometheus(PROMETHEUS, pdir, port)
        self.addCleanup(tu.stop_process, proc)
        self.assertTrue(tu.wait_prometheus_ready(proc, port), log)
        m, p = self.manager(engines=(0,), spec=0)
        m.log_engine_initialized()
        w = Workload(seed=5, arrivals_per_s=60.0)
        stop = threading.Event()

        def feed():  # the workload at four times real speed
            start = time.monotonic()
            while not stop.is_set():
                while w.t < 4 * (time.monotonic() - start):
                    for e, s, it in w.step():
                        m.record(s, it, engine_idx=e)
                time.sleep(0.02)
        t = threading.Thread(target=feed, daemon=True)
        t.start()
        self.addCleanup(t.join)
        self.addCleanup(stop.set)

        def query(expr):
            url = f"http://127.0.0.1:{port}/api/v1/query?" + \
                urllib.parse.urlencode({"query": expr})
            with urllib.request.urlopen(url, timeout=10) as r:
                data = json.load(r)["data"]
            return [float(x["value"][1]) for x in data["result"]
                    if math.isfinite(float(x["value"][1]))]

        queries = {e: e.replace("$model_name", MODEL)
                   .replace("$__rate_interval", self.RATE) for e in exprs}
        empty = {}

        def all_have_data():
            empty.clear()
            for e, q in queries.items():
                if not query(q):
                    empty[e] = q
            return not empty
        tu.poll_until(all_have_data, timeout=15, interval=0.5,
                      what=f"data for every expression (empty: {empty})")
        print(f"\nvLLM dashboard: {len(exprs)} expressions returned data",
              file=sys.stderr)


if __name__ == "__main__":
    tu.main()
