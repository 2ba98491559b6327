#!/usr/bin/python3
"""tokenmeter.integrations.lmdeploy against a real tokenmeterd, driven
through the LMDeploy stand-in (tests/python/standins/lmdeploy: LMDeploy
v0.16.0's metrics path, its module paths, classes, methods, fields and
clocks, and a reimplementation of its PrometheusStatLogger).

LMDeploy cannot be installed here (torch, a GPU stack), so the stand-in is
the engine: a seeded workload of 300 request lifecycles (replay.py:
queueing, prefix-cache hits, speculative decoding, 1..8-token outputs,
preemptions, aborts, engine errors) goes through its AsyncEngine,
metrics_processor and the loggers of _build_stat_loggers(), LMDeploy's
own and the adapter's side by side.

* Equality: every series both LMDeploy's PrometheusStatLogger and the
  daemon (--profile lmdeploy) expose has the same samples and values
  (counts and bucket counts exactly, sums to 1e-9); the families only
  LMDeploy has are exactly the ones docs/integrations.md lists.
* Dashboard: LMDeploy's own Grafana dashboard (../shared/peers/lmdeploy),
  every target of every panel, returns data on a real Prometheus scraping
  the daemon with LMDeploy's own scrape config (skips without prometheus
  or the peers directory).
* DaemonDown, BadInputs: the engine's logging path never sees an
  exception from the adapter and never blocks; what it cannot send is
  counted.
* Install: the hook in AsyncEngine._build_stat_loggers, install(engine),
  metrics off, replace_prometheus, uninstall, the engine label from
  dp_rank.
* Clock: the wall-to-monotonic conversion with injected clocks (offset,
  bound, steps, resync) and on this machine.
* Launcher: `python3 -m tokenmeter.integrations.lmdeploy serve api_server
  ...` through the stand-in's CLI, --dp 2 spawning two servers.
"""
import asyncio
import contextlib
import io
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "standins", "lmdeploy")
sys.path.insert(0, STANDIN)
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
sys.path.insert(0, os.path.join(HERE, "..", "monitoring"))
import tokenmeter_testutil as tu  # noqa: E402

import prometheus_client  # noqa: E402
import replay  # noqa: E402
import tokenmeter  # noqa: E402
import tokenmeter.integrations.lmdeploy as tm_lmdeploy  # noqa: E402
from lmdeploy.messages import (EngineOutput, PytorchEngineConfig,  # noqa: E402
                               RequestMetrics, ResponseType,
                               SpeculativeConfig)
from lmdeploy.metrics.metrics_processor import metrics_processor  # noqa: E402
from lmdeploy.metrics.stats import (IterationStats, RequestStats,  # noqa: E402
                                    SchedulerStats,
                                    SpeculativeDecodingStats)
from lmdeploy.serve.core import AsyncEngine, VLAsyncEngine  # noqa: E402

MODEL = "internlm/internlm2_5-7b-chat"
SESSION_LEN = 32768  # = the daemon's default --max-model-len: same buckets
PEERS = tu.peers_dir()
DASHBOARD = os.path.join(PEERS, "lmdeploy", "lmdeploy-dashboard.json")
SCRAPE_CONFIG = os.path.join(PEERS, "lmdeploy", "prometheus.yaml")
PROMETHEUS = os.environ.get("PROMETHEUS", "/usr/bin/prometheus")
SRC = os.path.dirname(os.path.dirname(HERE))
INTEGRATIONS_MD = os.path.join(SRC, "docs", "integrations.md")

# LMDeploy's families no tokenmeter event carries (docs/integrations.md,
# "What differs from LMDeploy's own /metrics").
ONLY_LMDEPLOY = {
    "lmdeploy:num_requests_succeeded", "lmdeploy:num_requests_failed",
    "lmdeploy:num_api_requests_routed", "lmdeploy:num_api_requests_waiting",
    "lmdeploy:prefix_cache_hit_rate", "lmdeploy:backend_config_info",
}


def engine(**kw):
    cfg = dict(session_len=SESSION_LEN)
    cfg.update(kw.pop("config", {}))
    return AsyncEngine(MODEL, backend=kw.pop("backend", "pytorch"),
                       backend_config=PytorchEngineConfig(**cfg),
                       speculative_config=SpeculativeConfig(
                           num_speculative_tokens=replay.SPEC_TOKENS), **kw)


def run_replay(eng, requests=300, pace=None, seed=20240611):
    """The seeded workload through `eng`; LMDeploy's 10-second log line is
    kept out of the test's output. Returns the workload's request count.
    Stamps are integer wall seconds + virtual offsets, so the float
    stamps (and every interval) are the same on every run."""
    timelines, samples = replay.workload(seed=seed, requests=requests)
    span = max(t for tl in timelines for t, _ in tl.outputs)
    base = float(math.floor(time.time() - span - 2))
    replay.shift(timelines, base)
    clock = replay.VirtualClock(base)
    replay.use_clock(clock)
    with contextlib.redirect_stdout(io.StringIO()):
        asyncio.run(replay.replay(eng, timelines, samples, clock, base,
                                  pace=pace))
    return len(timelines)


def lmdeploy_families(text):
    """{family: {(sample name, labels): value}} of the lmdeploy: families
    in an exposition text; `le` normalized to a float."""
    out = {}
    for fam in tu.text_string_to_metric_families(text):
        if not fam.name.startswith("lmdeploy:"):
            continue
        samples = out.setdefault(fam.name, {})
        for s in fam.samples:
            labels = dict(s.labels)
            if "le" in labels:
                labels["le"] = float(labels["le"])
            samples[(s.name, frozenset(labels.items()))] = s.value
    return out


def reference_families():
    return lmdeploy_families(
        prometheus_client.generate_latest(prometheus_client.REGISTRY)
        .decode())


class AdapterBase(unittest.TestCase):

    def setUp(self):
        replay.reset_processor()
        replay.use_clock(time)
        self.addCleanup(tm_lmdeploy.uninstall)
        self.addCleanup(replay.reset_processor)

    def start_daemon(self, *args):
        d = tu.Daemon("--profile", "lmdeploy", *args)
        d.start()
        self.addCleanup(d.cleanup)
        return d

    def flushed(self, daemon, want_iterations):
        """Flushes every adapter client and waits until the daemon applied
        `want_iterations` LATENCIES (its iteration_tokens_total count)."""
        for lg in tm_lmdeploy.loggers():
            self.assertTrue(lg.client.flush(timeout=10))
        return tu.poll_until(
            lambda: (daemon.samples().value(
                "lmdeploy:iteration_tokens_total_count", model_name=MODEL,
                engine="0") == want_iterations) and daemon.samples(),
            timeout=15, what="the daemon to apply every LATENCIES")


class Equality(AdapterBase):
    """The daemon's series = LMDeploy's PrometheusStatLogger's, from the
    same stats."""

    def test_daemon_series_equal_lmdeploys_own(self):
        daemon = self.start_daemon()
        tm_lmdeploy.install(socket_path=daemon.sock)
        eng = engine()
        self.assertEqual([type(x).__name__ for x in eng.stat_loggers],
                         ["LoggingStatLogger", "PrometheusStatLogger",
                          "TokenmeterStatLogger"])
        t0 = time.monotonic()
        n = run_replay(eng)
        replay_s = time.monotonic() - t0
        ref = reference_families()
        iterations = ref["lmdeploy:iteration_tokens_total"][
            ("lmdeploy:iteration_tokens_total_count",
             frozenset({("model_name", MODEL), ("engine", "0")}))]
        self.assertGreater(iterations, 5000)
        self.flushed(daemon, iterations)
        got = lmdeploy_families(daemon.metrics_text())
        (lg,) = tm_lmdeploy.loggers()
        self.assertEqual(lg.errors, {})
        self.assertEqual(lg.stats()["client"].events_rejected, 0)

        # What LMDeploy has and the daemon has not: exactly the list.
        self.assertEqual(set(ref) - set(got), ONLY_LMDEPLOY)
        common = sorted(set(ref) & set(got))
        compared = 0
        for fam in common:
            r, g = ref[fam], got[fam]
            for key, want in r.items():
                name, labels = key
                if key not in g:
                    # LMDeploy makes a request_success child for each of
                    # its 13 ResponseTypes up front; only FINISH reaches
                    # record_finish, so the others stay 0.
                    self.assertEqual(fam, "lmdeploy:request_success", key)
                    self.assertEqual(want, 0, key)
                    continue
                have = g[key]
                if name.endswith("_sum"):
                    # Durations travel as whole ns (rounded: 0.5 ns each
                    # at most); token counts are exact.
                    count = r[(name[:-4] + "_count", labels)]
                    tol = count * 0.5e-9 if fam.endswith(
                        ("_seconds", "_latency")) else 0
                    self.assertLessEqual(abs(have - want),
                                         tol + 1e-12 * abs(want),
                                         f"{name}{dict(labels)}: daemon "
                                         f"{have}, LMDeploy {want}")
                elif fam.startswith(("lmdeploy:spec_decode_mean",
                                     "lmdeploy:spec_decode_per_position")):
                    self.assertTrue(math.isclose(have, want, rel_tol=1e-12),
                                    f"{name}{dict(labels)}: daemon {have}, "
                                    f"LMDeploy {want}")
                else:
                    self.assertEqual(have, want,
                                     f"{name}{dict(labels)}: daemon {have}, "
                                     f"LMDeploy {want}")
                compared += 1
            # Nothing the daemon shows in a common family that LMDeploy
            # does not (the other request_success reasons aside).
            extra = set(g) - set(r)
            self.assertEqual(extra, set(), fam)
        # Every family the dashboard reads is among the compared ones.
        for fam in ("e2e_request_latency_seconds", "prompt_tokens",
                    "generation_tokens", "time_per_output_token_seconds",
                    "iter_token_latency", "num_requests_running",
                    "num_requests_waiting", "time_to_first_token_seconds",
                    "gpu_cache_usage_perc", "request_success",
                    "request_queue_time_seconds"):
            self.assertIn("lmdeploy:" + fam, common)
        self.assertGreater(compared, 250)
        print(f"\n{n} requests, {int(iterations)} outputs replayed in "
              f"{replay_s:.1f} s; {len(common)} families, {compared} samples "
              "equal", file=sys.stderr)

    def test_docs_list_the_families_only_lmdeploy_has(self):
        with open(INTEGRATIONS_MD) as f:
            text = f.read()
        section = text[text.index("## LMDeploy"):]
        for fam in ONLY_LMDEPLOY:
            self.assertIn(f"`{fam}", section)


class Dashboard(AdapterBase):
    """LMDeploy's own dashboard and scrape config, unchanged, against the
    daemon fed through the adapter."""

    def test_every_panel_returns_data(self):
        if not os.access(PROMETHEUS, os.X_OK):
            self.skipTest(f"{PROMETHEUS} not installed")
        tu.need_path(DASHBOARD, "LMDeploy's dashboard")
        tu.need_path(SCRAPE_CONFIG, "LMDeploy's prometheus.yaml")
        import live_prometheus_test as live

        daemon = self.start_daemon()
        with open(SCRAPE_CONFIG) as f:
            conf = f.read()
        conf = conf.replace("'127.0.0.1:23333'",
                            f"'{daemon.host}:{daemon.port}'")
        conf = conf.replace("scrape_interval: 5s", "scrape_interval: 1s")
        self.assertIn(f"{daemon.host}:{daemon.port}", conf)
        work = tempfile.mkdtemp(prefix="tm-lmd-prom-")
        prom = live.Prometheus(work, conf, [])
        prom.start()
        self.addCleanup(prom.close)
        tm_lmdeploy.install(socket_path=daemon.sock)
        eng = engine()
        prom.wait_ready()
        # Prometheus starts scraping a few seconds after it is ready (its
        # target updates are throttled): wait for the first scrape, so that
        # the requests run while it scrapes (about 5 s, 1 s apart).
        tu.poll_until(lambda: prom.vector('up{job="lmdeploy"} == 1'),
                      timeout=30, interval=0.2, what="the first scrape")
        run_replay(eng, requests=200, pace=0.7)
        for lg in tm_lmdeploy.loggers():
            self.assertTrue(lg.client.flush(timeout=10))
        t_done = time.time()
        tu.poll_until(lambda: prom.vector(
            "timestamp(lmdeploy:e2e_request_latency_seconds_count) > "
            f"{t_done + 0.5}"), timeout=20, what="a scrape after the replay")

        with open(DASHBOARD) as f:
            dash = json.load(f)
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        t = time.time()
        base = live.LiveBase("run")
        base.prom = prom
        models = base.resolve_variable(variables["model_name"], {}, t)
        self.assertIn(MODEL, models)
        values = {"model_name": live.format_var(variables["model_name"],
                                                [MODEL])}
        exprs = {}
        for p in dash["panels"]:
            for tgt in p.get("targets", []):
                exprs[f"{p['title']} / {tgt['refId']}"] = live.interpolate(
                    tgt["expr"], values)
        self.assertEqual(len(exprs), 27)
        base.evaluate(exprs)
        # Data, and moving: the rates the requests made are above zero.
        for title in ("Token Throughput", "Finish Reason", "Queue Time"):
            for key, expr in exprs.items():
                if key.startswith(title + " /"):
                    vals = [v for _, v in prom.vector(expr)]
                    self.assertTrue(vals and max(vals) > 0, (key, vals))
        print(f"\nLMDeploy dashboard: {len(exprs)} expressions of "
              f"{len(dash['panels'])} panels returned data", file=sys.stderr)


class DaemonDown(AdapterBase):

    def test_no_daemon_costs_drops_only(self):
        sock = os.path.join(tempfile.mkdtemp(prefix="tm-none-"), "none.sock")
        tm_lmdeploy.install(socket_path=sock)
        eng = engine()
        failures = []
        handler = _ListHandler(failures)
        logging.getLogger("lmdeploy").addHandler(handler)
        self.addCleanup(logging.getLogger("lmdeploy").removeHandler, handler)
        (lg,) = tm_lmdeploy.loggers()
        slowest = _time_calls(lg)
        run_replay(eng, requests=80)
        self.assertEqual(failures, [])
        self.assertEqual(lg.errors, {})
        st = lg.stats()["client"]
        self.assertEqual(st.connected, 0)
        self.assertGreater(st.connect_failures, 0)
        # LMDeploy's own logger got everything.
        ref = reference_families()
        self.assertGreater(len(ref["lmdeploy:e2e_request_latency_seconds"]),
                           0)
        # No call waited on the socket: the slowest record_* of the run.
        self.assertLess(max(slowest.values()), 0.05, slowest)
        # Closing does not hang either (the close timeout, 1 s, bounds it).
        t0 = time.monotonic()
        tm_lmdeploy.uninstall()
        self.assertLess(time.monotonic() - t0, 3.0)
        after = lg.client.stats() if not lg.client.closed else None
        self.assertIsNone(after)


class BadInputs(AdapterBase):
    """Stats LMDeploy should never produce, and some it does: no exception
    into LMDeploy, the odd figure left out and counted, nothing the daemon
    would reject."""

    def setUp(self):
        super().setUp()
        self.daemon = self.start_daemon()
        self.client = tokenmeter.Client(model=MODEL, engine="lmdeploy",
                                        profile="lmdeploy",
                                        socket_path=self.daemon.sock)
        self.lg = tm_lmdeploy.TokenmeterStatLogger(self.client)
        self.addCleanup(self.lg.close)

    def test_garbage_is_counted_not_raised(self):
        lg = self.lg
        it = IterationStats()
        it.ttft = "soon"
        lg.record_iteration(it)
        lg.record_iteration(object())
        lg.record_finish(None)
        lg.record_schedule(SchedulerStats(num_running_reqs=-3))
        spec = SpeculativeDecodingStats(2)
        spec.num_drafts = 1
        spec.num_accepted_tokens_per_pos = ["x"]
        lg.record_specdecode(spec)
        lg.log()
        self.assertEqual(lg.errors, {"record_iteration": 2,
                                     "record_finish": 1,
                                     "record_schedule": 1,
                                     "record_specdecode": 1})

    def test_unset_and_negative_intervals_are_left_out(self):
        lg = self.lg
        now = time.time()
        rs = RequestStats(arrival_time=now - 2.0, prompt_tokens=100)
        rs.generation_tokens = 10
        rs.cached_tokens = 150   # more than the prompt: not sent
        rs.queued_time = 0.0     # never set: queue interval left out
        rs.scheduled_time = now - 1.5
        rs.first_token_time = now - 1.6  # before scheduled: negative
        rs.finish_time = now
        rs.finish_reason = ResponseType.FINISH
        lg.record_finish(rs)
        it = IterationStats()
        it.ttft = -0.5           # truthy and negative: left out
        it.new_generation_tokens = 1
        lg.record_iteration(it)
        it2 = IterationStats()
        it2.itl = float("nan")   # truthy NaN: left out
        it2.new_generation_tokens = 2
        lg.record_iteration(it2)
        self.assertEqual(lg.errors, {})
        # cached, queue, prefill, decode (first token before scheduled
        # is not negative for decode: first -> finish), ttft, itl.
        self.assertEqual(lg.skipped, 5)
        self.assertTrue(self.client.flush(timeout=5))
        s = tu.poll_until(lambda: (self.daemon.samples().value(
            "lmdeploy:iteration_tokens_total_count", model_name=MODEL,
            engine="0") == 2) and self.daemon.samples(), timeout=10)
        lab = {"model_name": MODEL, "engine": "0"}
        self.assertEqual(s.value("lmdeploy:request_success_total",
                                 finished_reason="ResponseType.FINISH",
                                 **lab), 1)
        self.assertEqual(s.value("lmdeploy:request_queue_time_seconds_count",
                                 **lab), 0)
        self.assertEqual(s.value(
            "lmdeploy:request_prefill_time_seconds_count", **lab), 0)
        self.assertEqual(s.value("lmdeploy:e2e_request_latency_seconds_count",
                                 **lab), 1)
        self.assertEqual(s.value("lmdeploy:request_decode_time_seconds_count",
                                 **lab), 1)
        self.assertEqual(s.value("lmdeploy:time_to_first_token_seconds_count",
                                 **lab), 0)
        self.assertEqual(s.value("lmdeploy:iter_token_latency_count", **lab),
                         0)
        self.assertEqual(s.value("lmdeploy:generation_tokens_total", **lab),
                         3)
        # Nothing the daemon refused, nothing the client refused.
        self.assertEqual(s.sum("tokenmeter_ingest_errors_total"), 0)
        self.assertEqual(self.client.stats().events_rejected, 0)

    def test_finish_without_tokens_breaks_lmdeploys_logger_first(self):
        """LMDeploy 0.16.0 sets finish_reason only on an output with tokens,
        so a FINISH output without any makes PrometheusStatLogger's
        record_finish raise KeyError(None); metrics_processor logs it and
        skips the loggers after it, ours included. With
        replace_prometheus=True ours runs and counts the request."""
        for replace in (False, True):
            replay.reset_processor()
            tm_lmdeploy.uninstall()
            tm_lmdeploy.install(socket_path=self.daemon.sock,
                                replace_prometheus=replace)
            eng = engine()
            (lg,) = tm_lmdeploy.loggers()
            failures = []
            handler = _ListHandler(failures)
            logging.getLogger("lmdeploy").addHandler(handler)
            try:
                outputs = [
                    EngineOutput(ResponseType.SUCCESS, [5],
                                 req_metrics=RequestMetrics(time.time())),
                    EngineOutput(ResponseType.FINISH, [],
                                 req_metrics=RequestMetrics(time.time()))]
                replay.use_clock(time)
                asyncio.run(_drive(eng, 3, outputs,
                                   join=replace))
            finally:
                logging.getLogger("lmdeploy").removeHandler(handler)
            self.assertEqual(lg.errors, {})
            if replace:
                self.assertEqual(failures, [])
                # No engine events, no finish time: every interval out.
                self.assertEqual(lg.skipped, 5)
            else:
                self.assertEqual(len(failures), 1)
                self.assertIn("KeyError", failures[0])


class Install(AdapterBase):

    def test_hook_adds_one_logger_to_each_engine_built_later(self):
        tm_lmdeploy.install(socket_path="/nonexistent/tm.sock")
        a = engine()
        b = VLAsyncEngine(MODEL, backend="turbomind",
                          backend_config=PytorchEngineConfig(
                              session_len=SESSION_LEN))
        self.assertIs(metrics_processor.stat_loggers, b.stat_loggers)
        for eng in (a, b):
            self.assertIsInstance(eng.stat_loggers[-1],
                                  tm_lmdeploy.TokenmeterStatLogger)
            self.assertEqual(len(eng.stat_loggers), 3)
        self.assertEqual(len(tm_lmdeploy.loggers()), 2)
        # Again: the options change, the hook stays one.
        tm_lmdeploy.install(socket_path="/nonexistent/tm.sock",
                            replace_prometheus=True)
        c = engine()
        self.assertEqual([type(x).__name__ for x in c.stat_loggers],
                         ["LoggingStatLogger", "TokenmeterStatLogger"])
        tm_lmdeploy.uninstall()
        self.assertEqual(tm_lmdeploy.loggers(), [])
        self.assertNotIn(tm_lmdeploy.TokenmeterStatLogger,
                         [type(x) for x in metrics_processor.stat_loggers])
        self.assertEqual([type(x).__name__ for x in engine().stat_loggers],
                         ["LoggingStatLogger", "PrometheusStatLogger"])

    def test_install_into_an_engine_already_built(self):
        eng, other = engine(), engine()
        lg = tm_lmdeploy.install(eng, socket_path="/nonexistent/tm.sock")
        self.assertIs(eng.stat_loggers[-1], lg)
        self.assertIs(tm_lmdeploy.install(eng), lg)  # once per engine
        self.assertEqual(len(eng.stat_loggers), 3)
        with self.assertRaises(ValueError):  # tokenmeter.Client's rules
            tm_lmdeploy.install(other, labels={"1bad": "x"})
        self.assertEqual(len(other.stat_loggers), 2)

    def test_metrics_off_adds_nothing_and_says_so(self):
        tm_lmdeploy._warned.discard("off")
        with self.assertLogs("tokenmeter.integrations.lmdeploy",
                             "WARNING") as logs:
            tm_lmdeploy.install(socket_path="/nonexistent/tm.sock")
            eng = engine(config={"enable_metrics": False})
        self.assertEqual(eng.stat_loggers, [])
        self.assertEqual(tm_lmdeploy.loggers(), [])
        self.assertIn("metrics are off", logs.output[0])

    def test_engine_label_is_lmdeploys_dp_rank(self):
        daemon = self.start_daemon()
        tm_lmdeploy.install(socket_path=daemon.sock)
        engine(config={"dp": 2, "dp_rank": 1})
        # Turbomind: LMDeploy labels it 0 whatever the dp_rank.
        AsyncEngine("other-model", backend="turbomind",
                    backend_config=PytorchEngineConfig(
                        session_len=SESSION_LEN, dp_rank=1))
        for lg in tm_lmdeploy.loggers():
            lg.record_schedule(SchedulerStats(num_running_reqs=4))
            self.assertTrue(lg.client.flush(timeout=5))
        tu.poll_until(lambda: daemon.value(
            "lmdeploy:num_requests_running", model_name=MODEL,
            engine="1") == 4 and daemon.value(
            "lmdeploy:num_requests_running", model_name="other-model",
            engine="0") == 4, what="both engines' series")

    def test_install_needs_lmdeploy_the_module_does_not(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and "standins" not in p)
        code = ("import tokenmeter.integrations.lmdeploy as m\n"
                "try:\n    m.install()\nexcept ImportError as e:\n"
                "    print('ImportError', e.name)\n")
        r = subprocess.run([sys.executable, "-c", code], env=env,
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "ImportError lmdeploy")


class Clock(unittest.TestCase):

    def fake(self, readings_wall, readings_mono):
        w, m = iter(readings_wall), iter(readings_mono)
        return (lambda: next(w)), (lambda: next(m))

    def test_offset_from_the_narrowest_bracket(self):
        # Three brackets: widths 400, 100, 250 ns; the second wins.
        wall, mono = self.fake(
            [5_000_000_300, 5_000_001_050, 5_000_002_000],
            [1000, 1400, 2000, 2100, 2800, 3050])
        c = tm_lmdeploy.WallClock(tries=3, wall_ns=wall, mono_ns=mono)
        self.assertEqual(c.offset_ns, 5_000_001_050 - 2050)
        self.assertEqual(c.bound_ns, 50)
        self.assertEqual(c.syncs, 1)

    def test_conversion_is_exact_for_the_float_given(self):
        wall, mono = self.fake([1_700_000_000_000_000_000], [10, 10])
        c = tm_lmdeploy.WallClock(tries=1, resync_s=1e9, wall_ns=wall,
                                  mono_ns=lambda: 10)
        # 1.7e9 + 0.25 is exact in a double; so is 2**-22 s steps.
        self.assertEqual(c.to_mono_ns(1_700_000_000.25), 250_000_010)
        x = 1_700_000_000 + 3 * 2.0 ** -22
        self.assertEqual(c.to_mono_ns(x),
                         round(3 * 2.0 ** -22 * 1e9) + 10)
        # Far from the measurement's second, still to the nanosecond.
        self.assertEqual(c.to_mono_ns(1_700_000_000 - 1000 + 0.5),
                         10 - 999_500_000_000)

    def test_resync_after_resync_s_and_steps_counted(self):
        t = {"mono": 0, "wall": 1_000_000_000_000}

        def mono():
            return t["mono"]

        def wall():
            return t["wall"] + t["mono"]
        c = tm_lmdeploy.WallClock(resync_s=10, tries=1, wall_ns=wall,
                                  mono_ns=mono)
        self.assertEqual(c.offset_ns, 1_000_000_000_000)
        t["mono"] = 9_000_000_000
        t["wall"] += 5_000_000  # stepped 5 ms; not measured yet
        c.to_mono_ns(1000.0)
        self.assertEqual((c.syncs, c.steps), (1, 0))
        t["mono"] = 10_000_000_000
        self.assertEqual(c.to_mono_ns(1000.0),
                         1000 * 10**9 - 1_000_005_000_000)
        self.assertEqual((c.syncs, c.steps), (2, 1))
        # A slew-sized change (under 1 ms) is not a step.
        t["wall"] += 200_000
        t["mono"] = 20_000_000_000
        c.to_mono_ns(1.0)
        self.assertEqual((c.syncs, c.steps), (3, 1))

    def test_bad_parameters(self):
        with self.assertRaises(ValueError):
            tm_lmdeploy.WallClock(resync_s=0)
        with self.assertRaises(ValueError):
            tm_lmdeploy.WallClock(tries=0)

    def test_this_machine(self):
        c = tm_lmdeploy.WallClock()
        now_w, now_m = time.time(), time.monotonic_ns()
        # The conversion of "now" lands within a millisecond of now (the
        # two reads above are not one instant; the bound is far tighter).
        self.assertLess(abs(c.to_mono_ns(now_w) - now_m), 1_000_000)
        self.assertLess(c.bound_ns, 100_000)
        r = subprocess.run([sys.executable, "-m",
                            "tokenmeter.integrations.lmdeploy", "--clock"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"^offset -?\d+ ns .* bound \+-\d+ ns")


class Launcher(AdapterBase):
    """The launcher runs LMDeploy's own CLI (the stand-in's
    lmdeploy.cli.run: `serve api_server` builds the engine as serve()
    does, then replays a few requests instead of serving HTTP)."""

    def run_launcher(self, daemon, *args):
        env = dict(os.environ, STANDIN_REPLAY_REQUESTS="12")
        env["PYTHONPATH"] = os.pathsep.join(
            [STANDIN] + [p for p in env.get("PYTHONPATH", "").split(
                os.pathsep) if p])
        r = subprocess.run(
            [sys.executable, "-m", "tokenmeter.integrations.lmdeploy",
             "--socket", daemon.sock, "--label", "cluster=c1", "serve",
             "api_server", MODEL, *args], env=env, capture_output=True,
            text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r

    def test_serve_api_server(self):
        daemon = self.start_daemon()
        self.run_launcher(daemon)
        s = tu.poll_until(lambda: (daemon.samples().value(
            "lmdeploy:request_success_total", model_name=MODEL, engine="0",
            cluster="c1", finished_reason="ResponseType.FINISH") or 0) > 0
            and daemon.samples(), timeout=10, what="the server's requests")
        self.assertGreater(s.value("lmdeploy:generation_tokens_total",
                                   model_name=MODEL, engine="0",
                                   cluster="c1"), 0)

    def test_dp_servers_spawned_report_too(self):
        daemon = self.start_daemon()
        self.run_launcher(daemon, "--dp", "2", "--tp", "2")
        for rank in ("0", "1"):
            tu.poll_until(lambda: (daemon.value(
                "lmdeploy:generation_tokens_total", model_name=MODEL,
                engine=rank, cluster="c1") or 0) > 0, timeout=10,
                what=f"dp rank {rank}'s series")

    def test_usage(self):
        r = subprocess.run([sys.executable, "-m",
                            "tokenmeter.integrations.lmdeploy"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("usage:", r.stdout)


class _ListHandler(logging.Handler):
    def __init__(self, out):
        super().__init__(logging.ERROR)
        self.out = out

    def emit(self, record):
        self.out.append(record.getMessage() + (
            "" if record.exc_info is None else
            repr(record.exc_info[1]) + type(record.exc_info[1]).__name__))


def _time_calls(lg):
    """Wraps lg's record_* methods to keep each one's slowest call."""
    slowest = {}
    for name in ("record_schedule", "record_iteration", "record_specdecode",
                 "record_finish"):
        fn = getattr(lg, name)

        def timed(stats, fn=fn, name=name):
            t0 = time.perf_counter()
            fn(stats)
            dt = time.perf_counter() - t0
            slowest[name] = max(slowest.get(name, 0.0), dt)
        setattr(lg, name, timed)
    return slowest


async def _drive(eng, prompt, outputs, join=True):
    metrics_processor.start_metrics_handler(enable_metrics=True)

    async def source():
        for o in outputs:
            yield o
    async for _ in eng.generate(prompt, source()):
        pass
    if join:
        await metrics_processor.metrics_queue.join()
    else:
        # LMDeploy's handler skips task_done() after an exception: wait
        # for the queue to empty instead.
        while not metrics_processor.metrics_queue.empty():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
    await metrics_processor.stop_metrics_handler()


if __name__ == "__main__":
    if not tu.DAEMON:
        tu.skip("TOKENMETERD not set (run through meson test)")
    tu.main()
