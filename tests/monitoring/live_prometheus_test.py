#!/usr/bin/python3
"""The monitoring stack of docs/ proven on a live Prometheus, for every
naming profile.

Two tokenmeterd daemons (two "hosts", both with --request-label tenant and
--moe-expert-series, the second also with --legacy-names) on temp sockets
and loopback ports are fed by the reference engine (tokenmeter-engine: the
vllm profile under namespace tokenmeter_engine, with LoRA adapters and
tenants) and by simulated engines (sim_engine.py) that introduce
themselves as vllm, lmdeploy (profile auto) and sglang (profile auto on one
host, HELLO profile "sglang" from an engine of another name on the other),
with cache_config, max_lora, LoRA adapters and tenant labels. Every
simulated engine serves a mixture-of-experts model (EXPERT_LOAD, 4 layers
x 8 experts, uneven), and so does the reference engine when it has
--moe-experts. One environment serves the whole script: Debian's
/usr/bin/prometheus runs twice on docs/prometheus/prometheus.yml itself,
with only the targets rewritten to the test daemons (a third target is a
dead port) and the intervals set to 1 s: once with the rule files of
docs/prometheus/ beside it (class LivePrometheus), once with no rule file
at all (class PeerDashboards).
Then, through the HTTP API, every query must succeed and return data:

* every target expression of docs/grafana/tokenmeter.json, for every engine
  family (tokenmeter_engine, vllm, sglang, lmdeploy), with the other
  variables set as Grafana would set them: "All", and explicit selections
  (regex escaped the way Grafana escapes them); the targets of a quantity
  an engine family does not export (profiles.NOT_EXPORTED) must return
  nothing instead;
* every variable query of the dashboard;
* every recording rule (its expression and its recorded series) for each
  engine family that has its quantity, with every rule, recording or
  alerting, loaded and evaluated without error;
* the alerts whose conditions the feeds create (ingest errors, client
  drops, KV cache near full in the lmdeploy and the sglang family, daemon
  down);
* the router series' values: cache_config_info as each engine sent it,
  lora_requests_info one series per engine series whose adapter sets are
  the engine's (checked exactly while a simulated engine is paused), and
  the per-tenant request counts;
* the federation matchers of docs/prometheus/global.yml;
* (class PeerDashboards, no rule files) every expression of SGLang's
  example dashboard (tests/data/peers/sglang/), and, when the peers
  directory beside the repository is there, of vLLM's
  (shared/peers/vllm/grafana-exprs.txt) and of LMDeploy's
  (shared/peers/lmdeploy/lmdeploy-dashboard.json), unchanged.

"Data" means a non-empty result with at least one finite value. The
exceptions are in the tokenmeter_engine family: the reference engine does
not speculate, so the speculative-decoding panels are empty or NaN for it,
a reference engine without --moe-experts leaves the MoE panels empty, and
the KV-transfer panels (and the KV wait per request) are empty for it: it
transfers KV only with --disaggregate, not run here. With its protocol
1.2 modes (--max-queued, one --sleep-after/--wake-after cycle) it fills
the admission and sleep panels, and it always sends STEP waiting_deferred
and SCHEDULED info; an older reference engine without them, and its
simulated stand-in (a 1.1 engine, like the second vllm engine), leave
every 1.2-only panel empty (the computed prompt tokens and preemptions
per request fill for every engine).
All are proven on the other families, whose simulated engines send every
1.2 event (sim_engine.py). The MoE panels
are also checked by value against a simulated engine's own counts: 8
experts in every
layer's row of the grid with the engine's hot expert the hottest, the same
routed tokens in every layer, each layer's imbalance that of the engine's
latest counts. The 1.2 series are checked by value too: a simulated
engine's admission rejections per reason, KV-transfer failures per role
and reason and sleep state, and of its finished requests the preemptions,
the computed prompt tokens and those that received KV (the per-request
histograms' _sum and _count), against its own counts while it is paused.

Exits 77 (skipped) when /usr/bin/prometheus is not installed
(scripts/install-deps.sh installs Debian's prometheus package).
"""
import hashlib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402
import profiles  # noqa: E402
from sim_engine import SimEngine  # noqa: E402

SRC = os.environ.get("TOKENMETER_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(HERE)))
PROMETHEUS = os.environ.get("PROMETHEUS", "/usr/bin/prometheus")
DAEMON = os.environ.get("TOKENMETERD", "")
ENGINE = os.environ.get("TOKENMETER_ENGINE", "")
PEERS = tu.peers_dir()
DOCS_PROM = os.path.join(SRC, "docs", "prometheus")
DASHBOARD = os.path.join(SRC, "docs", "grafana", "tokenmeter.json")
SGLANG_DIR = os.path.join(SRC, "tests", "data", "peers", "sglang")

# Grafana's built-in intervals. With a 1 s scrape interval Grafana's
# $__rate_interval would be at least 4 s; 15 s keeps several points in
# every window on a loaded machine.
BUILTINS = {"__rate_interval": "15s", "__interval": "5s", "__range": "1m"}

VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LMDEPLOY_MODEL = "internlm/internlm2_5-7b-chat"
SGLANG_MODEL = "Qwen/Qwen2.5-7B-Instruct"
NAMESPACES = {"tokenmeter_engine", "vllm", "sglang", "lmdeploy"}
TENANTS = ("acme", "globex", "initech")
LORAS = ("sql-lora", "chat-lora", "code-lora")
# The reference engine's: --lora-adapters 4 --max-lora 2, --tenants 3.
ENGINE_LORAS = tuple(f"lora-{i}" for i in range(4))
ENGINE_TENANTS = tuple(f"tenant-{i}" for i in range(3))
# The simulated engines' MoE model (and the reference engine's experts).
MOE_LAYERS = 4
MOE_EXPERTS = 8
# The series only a protocol 1.2 engine makes (metrics-v1.md "Catalog 1.2
# additions"), and of those the KV-transfer ones (--disaggregate only; the
# KV wait per request needs a KV_TRANSFER recv): the tokenmeter_engine
# family may leave them empty (the module docstring). (Prompt tokens by
# source, computed prompt tokens and preemptions per request are not among
# them: without SCHEDULED info every prompt token is local_compute, and
# every finished request is observed, with 0 preemptions if need be.)
PROTOCOL_12_ONLY = ("admission_rejections_total",
                    "num_queue_rejected_requests_total",
                    "num_requests_waiting_by_reason", "kv_transfer_",
                    "num_transfer_failed_reqs_total", "engine_sleep_",
                    "engine_fully_awake", "request_kv_wait_time_seconds")


KV_TRANSFER_ONLY = ("kv_transfer_", "num_transfer_failed_reqs_total",
                    "request_kv_wait_time_seconds")


def names_protocol_12_only(expr, names=PROTOCOL_12_ONLY):
    return any(f":{name}" in expr for name in names)


def engine_12_flags():
    """The reference engine's protocol 1.2 modes the live test turns on
    (an admission cap the queue reaches during one sleep cycle early in
    the run, priorities, trace context), or [] when it has none."""
    p = subprocess.run([ENGINE, "--help"], capture_output=True, text=True,
                       timeout=30)
    if not all(f in p.stdout for f in ("--max-queued", "--sleep-after",
                                       "--priority-levels")):
        return []
    return ["--max-queued", "8", "--sleep-after", "2", "--wake-after", "3",
            "--priority-levels", "5", "--trace-context"]


def engine_moe_flags():
    """The reference engine's MoE flags, or [] when it has none (the MoE
    panels are then empty for its family)."""
    p = subprocess.run([ENGINE, "--help"], capture_output=True, text=True,
                       timeout=30)
    if "--moe-experts" not in p.stdout:
        return []
    flags = ["--moe-experts", str(MOE_EXPERTS)]
    if "--expert-load-every" in p.stdout:
        flags += ["--expert-load-every", "4"]
    return flags


def prometheus_regular_escape(v):
    """Grafana's escaping of a single-value variable in a Prometheus query."""
    return v.replace("\\", "\\\\").replace("'", "\\\\'")


def prometheus_regex_escape(v):
    """Grafana's escaping of a multi-value / All variable's values."""
    v = v.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), v)


VAR_RE = re.compile(r"\$\{(\w+)\}|\$(\w+)|\[\[(\w+)\]\]")


def interpolate(expr, values):
    """Replaces $var, ${var}, [[var]] as Grafana does; values holds the
    already formatted text of each variable. An unknown variable fails."""
    def sub(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name in BUILTINS:
            return BUILTINS[name]
        if name not in values:
            raise KeyError(f"undefined variable ${name} in {expr!r}")
        return values[name]
    return VAR_RE.sub(sub, expr)


def format_var(var, selected):
    """Formats a variable's selection like Grafana's Prometheus data source.
    selected is None for "All"."""
    multi = var.get("multi") or var.get("includeAll")
    if not multi:
        return prometheus_regular_escape(selected[0])
    if selected is None:
        return var.get("allValue") or ".*"
    escaped = [prometheus_regex_escape(v) for v in selected]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def finite_values(data):
    if data["resultType"] == "scalar":
        vals = [data["result"][1]]
    else:
        vals = [r["value"][1] for r in data["result"]]
    return [float(v) for v in vals if math.isfinite(float(v))]


class Prometheus:
    """One /usr/bin/prometheus on a config text, its API on a free port
    (a start that loses its port to another process is retried)."""

    def __init__(self, workdir, config, rule_files, extra_args=()):
        self.workdir = workdir
        self.config = config
        self.rule_files = rule_files
        self.extra_args = tuple(extra_args)
        self.proc = None
        self.attempt = 0

    def start(self):
        self.port = free_port()
        conf = self.config.replace("localhost:9090", f"127.0.0.1:{self.port}")
        pdir = os.path.join(self.workdir, f"try{self.attempt}")
        self.attempt += 1
        os.makedirs(pdir)
        with open(os.path.join(pdir, "prometheus.yml"), "w") as f:
            f.write(conf)
        for path in self.rule_files:
            shutil.copy(path, pdir)
        self.proc, self.log = tu.start_prometheus(PROMETHEUS, pdir, self.port,
                                                  self.extra_args)

    def wait_ready(self, timeout=30):
        """Once /-/ready answers 200; restarts on another port (3 tries in
        all) when Prometheus exits, e.g. because its port was taken."""
        while not tu.wait_prometheus_ready(self.proc, self.port, timeout):
            self.proc.wait()
            if self.attempt >= 3:
                raise AssertionError("prometheus did not start: " +
                                     self.tail())
            self.start()

    def tail(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-3000:]
        except OSError:
            return ""

    def api(self, path, params=None, post=True):
        url = f"http://127.0.0.1:{self.port}{path}"
        data = urllib.parse.urlencode(params or {}, doseq=True)
        if post:
            req = urllib.request.Request(url, data=data.encode())
        else:
            req = urllib.request.Request(url + ("?" + data if data else ""))
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                body = r.read()
        except urllib.error.HTTPError as e:
            body = e.read()
        if path == "/federate":
            return body.decode()
        return json.loads(body)

    def query(self, expr, t=None):
        params = {"query": expr}
        if t is not None:
            params["time"] = f"{t:.3f}"
        return self.api("/api/v1/query", params)

    def vector(self, expr):
        """An instant query's result: [(labels, float value)]."""
        r = self.query(expr)
        assert r.get("status") == "success", (expr, r)
        return [(x["metric"], float(x["value"][1]))
                for x in r["data"]["result"]]

    def close(self):
        tu.stop_process(self.proc)


class Env:
    """Daemons, feeds and the two Prometheus servers of the whole script."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tm-mon-", dir="/tmp")
        self.started_unix = time.time()
        self.engines = []
        self.sims = []
        self.daemons = []
        self.proms = {}
        self.uses_engine = bool(ENGINE) and os.access(ENGINE, os.X_OK)
        for extra in ((), ("--legacy-names",)):
            d = tu.Daemon("--log-interval", "0", "--request-label", "tenant",
                          "--moe-expert-series", *extra, binary=DAEMON)
            self.daemons.append(d)
            d.start()
        a, b = self.daemons
        # Every simulated engine serves an MoE model.
        moe = {"moe_layers": MOE_LAYERS, "moe_experts": MOE_EXPERTS}
        self.engine_moe = True
        self.engine_12 = False  # the reference engine's 1.2 modes are on
        if self.uses_engine:
            moe_flags = engine_moe_flags()
            self.engine_moe = bool(moe_flags)
            flags_12 = engine_12_flags()
            self.engine_12 = bool(flags_12)
            for i, d in enumerate(self.daemons):
                self.engines.append(tu.Engine(
                    "--requests", "5000", "--rate", "25", "--backend", "cpu",
                    "--kv-blocks", "256", "--shared-prefix", "0.5", "--seed",
                    str(7 + i), "--lora-adapters", "4", "--max-lora", "2",
                    "--quiet", *moe_flags, *flags_12, binary=ENGINE,
                    socket=d.sock, report=None, dir=self.dir,
                    name=f"engine{i}").start())
            self.engine_loras = ENGINE_LORAS
            self.engine_tenants = ENGINE_TENANTS
        else:
            # TODO(engine): only while tokenmeter-engine is not built.
            for i, d in enumerate(self.daemons):
                self.sims.append(SimEngine(
                    d.sock, "tokenmeter-engine", "tokenmeter-tiny",
                    spec_tokens=0, arrival_rate=20, seed=10 + i,
                    cache_config={"block_size": 16, "num_gpu_blocks": 256,
                                  "enable_prefix_caching": True},
                    max_lora=2, loras=ENGINE_LORAS, tenants=ENGINE_TENANTS,
                    proto12=False, **moe))
            self.engine_loras = ENGINE_LORAS
            self.engine_tenants = ENGINE_TENANTS
        # The engines whose state the tests read (name -> sim, its host).
        self.vllm = SimEngine(
            a.sock, "vllm", VLLM_MODEL, "0", seed=1, profile="vllm",
            cache_config={"block_size": 16, "num_gpu_blocks": 2048,
                          "enable_prefix_caching": True},
            max_lora=2, loras=LORAS, tenants=TENANTS, **moe)
        self.lmdeploy = SimEngine(
            b.sock, "lmdeploy", LMDEPLOY_MODEL, "0", seed=3, kv_floor=0.97,
            cache_config={"block_size": 64, "num_gpu_blocks": 4096},
            max_lora=2, loras=LORAS, tenants=TENANTS, **moe)
        self.sglang = SimEngine(
            a.sock, "sglang", SGLANG_MODEL, "0", seed=4, kv_floor=0.97,
            cache_config={"page_size": 1, "num_pages": 65536},
            max_lora=2, loras=LORAS, tenants=TENANTS, untenanted=0.25,
            **moe)
        self.sims += [
            self.vllm,
            # No 1.1 HELLO keys: lora_requests_info with max_lora "0" and
            # empty sets, no cache_config_info; and a 1.1 engine: no 1.2
            # series beside the first vllm engine's.
            SimEngine(b.sock, "vllm", VLLM_MODEL, "0", seed=2,
                      drops_per_s=5, tenants=TENANTS, proto12=False, **moe),
            self.lmdeploy,
            self.sglang,
            # The sglang profile chosen by HELLO, for an engine of another
            # name.
            SimEngine(b.sock, "sglang-fork", SGLANG_MODEL, "0", seed=5,
                      profile="sglang",
                      cache_config={"page_size": 16, "num_pages": 4096},
                      tenants=TENANTS, untenanted=0.25, **moe),
        ]
        for s in self.sims:
            s.start()
        self.targets = [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]
        self.host = {self.vllm: self.targets[0],
                     self.lmdeploy: self.targets[1],
                     self.sglang: self.targets[0]}
        self.daemon_of = {self.vllm: a, self.lmdeploy: b, self.sglang: a}
        self.dead_target = f"127.0.0.1:{free_port()}"
        self.start_prometheus()

    # -- Prometheus ---------------------------------------------------------
    def start_prometheus(self):
        text, bare = docs_prometheus_yml(self.targets, self.dead_target)
        rule_files = [os.path.join(DOCS_PROM, n)
                      for n in sorted(os.listdir(DOCS_PROM))
                      if n.endswith((".rules.yml", ".alerts.yml"))]
        for name, conf, rules in (("rules", text, rule_files),
                                  ("bare", bare, [])):
            prom = Prometheus(os.path.join(self.dir, name), conf, rules)
            self.proms[name] = prom
            prom.start()
        for prom in self.proms.values():
            prom.wait_ready()

    def close(self):
        stop_all(self.sims, self.engines, self.proms.values(), self.daemons,
                 self.dir)


def docs_prometheus_yml(targets, others=None):
    """docs/prometheus/prometheus.yml with the intervals at 1 s and its
    example hosts replaced by `targets` in order, the hosts beyond them by
    `others` (None: removed); returns (that text, the same without rule
    files)."""
    with open(os.path.join(DOCS_PROM, "prometheus.yml")) as f:
        text = f.read()
    text, n1 = re.subn(r"scrape_interval: 15s", "scrape_interval: 1s", text)
    text, n2 = re.subn(r"evaluation_interval: 15s",
                       "evaluation_interval: 1s", text)
    assert (n1, n2) == (1, 1), "intervals not found in prometheus.yml"
    hosts = re.findall(r"gpu-node-\d+:10062", text)
    assert len(hosts) >= len(targets) >= 1, \
        f"prometheus.yml lists fewer than {len(targets)} hosts"
    for extra in hosts[len(targets):]:
        if others is None:
            text = re.sub(r"\n\s*- " + re.escape(extra), "", text)
    mapping = dict(zip(hosts, list(targets) + [others] * len(hosts)))
    text = re.sub(r"gpu-node-\d+:10062", lambda m: mapping[m.group(0)],
                  text)
    bare, n3 = re.subn(r"^rule_files:\n(?:[ #].*\n)+", "rule_files: []\n",
                       text, flags=re.M)
    assert n3 == 1, "rule_files not found in prometheus.yml"
    return text, bare


def stop_all(sims, engines, proms, daemons, workdir):
    """Stops a test environment's parts, feeds (simulated engines and
    tu.Engine runs) first, and removes its directory."""
    for s in sims:
        s.stop()
    for e in engines:
        e.stop()
    for prom in proms:
        prom.close()
    for d in daemons:
        d.stop()
        d.cleanup()
    shutil.rmtree(workdir, ignore_errors=True)


def poll(what, predicate, timeout=60, interval=0.5):
    """Until predicate returns True (anything else is what is missing)."""
    last = []

    def done():
        last[:] = [predicate()]
        return last[0] is True
    tu.poll_until(done, timeout=timeout, interval=interval,
                  what=f"{what} (missing: {last})")


def wait_for_data(env):
    def targets_scraped():
        out = {}
        for name, prom in env.proms.items():
            r = prom.api("/api/v1/targets", post=False)
            health = {t["labels"]["instance"]: t["health"]
                      for t in r["data"]["activeTargets"]
                      if t["labels"]["job"] == "tokenmeter"}
            want = {t: "up" for t in env.targets}
            want[env.dead_target] = "down"
            if health != want:
                out[name] = health
        return not out or out
    poll("targets scraped", targets_scraped)
    # Scraped once, so an ingest error from now on shows as an increase.
    s = env.daemons[0].connect()
    s.sendall(b"\xc1")
    s.close()

    def enough_points():
        out = {}
        for name, prom in env.proms.items():
            for ns in NAMESPACES:
                r = prom.query("min(count_over_time("
                               f"{ns}:generation_tokens_total[15s]))")
                res = r["data"]["result"]
                v = res[0]["value"][1] if res else None
                if v is None or float(v) < 6:
                    out[f"{name} {ns}"] = v
        return not out or out
    poll("6 scrapes of every engine family", enough_points)

    def rules_evaluated():
        r = env.proms["rules"].api("/api/v1/rules", post=False)
        bad = [(rule["name"], rule["health"], rule.get("lastError"))
               for g in r["data"]["groups"] for rule in g["rules"]
               if rule["health"] != "ok"]
        return not bad or bad
    poll("every rule evaluated", rules_evaluated)


_ENV = []


def shared_env():
    """The one Env of this script, started by the first class that needs
    it and stopped by tearDownModule."""
    if not _ENV:
        env = Env()
        try:
            wait_for_data(env)
        except BaseException:
            env.close()
            raise
        _ENV.append(env)
    return _ENV[0]


def close_envs(envs):
    """Closes each environment (reporting its simulated engines' errors)
    and empties the list."""
    for env in envs:
        for s in env.sims:
            if s.error:
                print(f"sim engine error: {s.error!r}", file=sys.stderr)
        env.close()
    envs.clear()


def tearDownModule():  # noqa: N802 (unittest's name)
    close_envs(_ENV)


class LiveBase(unittest.TestCase):
    """The shared Env and one of its Prometheus servers, and the helpers
    (no tests here)."""

    PROM = None  # "rules" or "bare"

    @classmethod
    def setUpClass(cls):
        cls.env = shared_env()
        cls.prom = cls.env.proms[cls.PROM]
        with open(DASHBOARD) as f:
            cls.dashboard = json.load(f)

    # -- helpers --------------------------------------------------------------
    def evaluate(self, exprs, allow_no_data=lambda key: False,
                 expect_empty=(), rounds=3):
        """exprs: {key: promql}. Queries all at one instant (in parallel);
        retries the ones without data a few times (a window may fall
        between two finished requests on a loaded machine). The keys of
        expect_empty must return an empty result instead. Returns the keys
        that returned no data but were allowed to."""
        pending = dict(exprs)
        failures = {}
        expect_empty = set(expect_empty)
        for attempt in range(rounds):
            t = time.time()

            def run(item):
                key, expr = item
                r = self.prom.query(expr, t)
                if r.get("status") != "success":
                    return key, f"error: {r.get('error')}"
                if key in expect_empty:
                    return key, (None if not r["data"]["result"] else
                                 f"data where none was expected: "
                                 f"{r['data']['result'][:3]}")
                if not r["data"]["result"]:
                    return key, "empty result"
                if not finite_values(r["data"]):
                    return key, "no finite value (NaN only)"
                return key, None
            with ThreadPoolExecutor(max_workers=4) as pool:
                results = list(pool.map(run, pending.items()))
            failures = {k: why for k, why in results if why}
            errors = {k: w for k, w in failures.items()
                      if w.startswith(("error", "data where"))}
            if errors:
                self.fail("queries failed:\n" + "\n".join(
                    f"{k}: {w}\n  {pending[k]}" for k, w in errors.items()))
            pending = {k: pending[k] for k in failures
                       if not allow_no_data(k)}
            if not pending:
                break
            time.sleep(2)  # the interval of this bounded retry (rounds)
        allowed = sorted(k for k in failures if allow_no_data(k))
        if pending:
            self.fail("queries without data:\n" + "\n".join(
                f"{k}: {failures[k]}\n  {pending[k]}" for k in pending))
        return allowed

    def resolve_variable(self, var, values, t):
        """Runs a query variable the way Grafana's Prometheus data source
        does and applies its regex; returns the option values."""
        q = var["query"]["query"] if isinstance(var["query"], dict) \
            else var["query"]
        q = interpolate(q, values)
        m = re.fullmatch(r"label_values\((?:(.+),\s*)?(\w+)\)", q.strip())
        self.assertTrue(m, f"unsupported variable query {q!r}")
        selector, label = m.groups()
        if selector:
            r = self.prom.api("/api/v1/series", {
                "match[]": selector, "start": f"{t - 3600:.3f}",
                "end": f"{t:.3f}"})
            self.assertEqual(r.get("status"), "success", (q, r))
            found = {s[label] for s in r["data"] if label in s}
        else:
            r = self.prom.api(f"/api/v1/label/{label}/values", post=False)
            found = set(r["data"])
        rx = var.get("regex")
        if rx:
            self.assertTrue(rx.startswith("/") and rx.endswith("/"), rx)
            pat = re.compile(rx[1:-1])
            out = set()
            for v in found:
                mm = pat.search(v)
                if mm:
                    out.add(mm.group(1) if mm.groups() else mm.group(0))
            found = out
        return sorted(found)

    @staticmethod
    def panel_targets(dashboard):
        for p in dashboard["panels"]:
            for t in p.get("targets", []):
                yield p["title"], t["refId"], t["expr"]

    def dashboard_targets(self):
        return self.panel_targets(self.dashboard)


class LivePrometheus(LiveBase):
    """The project's dashboard, rules and alerts, with every rule file."""

    PROM = "rules"

    def test_targets_health_matches_the_hosts(self):
        r = self.prom.query('up{job="tokenmeter"}')
        up = {x["metric"]["instance"]: x["value"][1]
              for x in r["data"]["result"]}
        want = {t: "1" for t in self.env.targets}
        want[self.env.dead_target] = "0"
        self.assertEqual(up, want)

    def test_every_rule_file_loaded_and_every_rule_healthy(self):
        r = self.prom.api("/api/v1/rules", post=False)
        rules = [rule for g in r["data"]["groups"] for rule in g["rules"]]
        expected = 0
        for name in os.listdir(DOCS_PROM):
            if name.endswith((".rules.yml", ".alerts.yml")):
                with open(os.path.join(DOCS_PROM, name)) as f:
                    expected += len(re.findall(r"^\s*- (record|alert):",
                                               f.read(), re.M))
        self.assertGreater(expected, 40)
        self.assertEqual(len(rules), expected)
        for rule in rules:
            self.assertEqual((rule["name"], rule["health"]),
                             (rule["name"], "ok"), rule.get("lastError"))

    # The engine families each recorded series has no finite value for:
    # what the family's profile does not export (tokenmeter.rules.yml's
    # header), and speculative decoding for the reference engine.
    RULE_GAPS = {
        "request_prefill_time_seconds:": {"sglang"},
        "request_decode_time_seconds:": {"sglang"},
        "request_inference_time_seconds:": {"sglang"},
        "request_success:": {"sglang"},
        "num_preemptions:": {"sglang", "lmdeploy"},
        "spec_decode_": {"tokenmeter_engine"},
    }

    def test_every_recording_rule_returns_data_for_each_family(self):
        r = self.prom.api("/api/v1/rules", {"type": "record"}, post=False)
        rules = [rule for g in r["data"]["groups"] for rule in g["rules"]
                 if rule["type"] == "recording"]
        exprs = {}
        for rule in rules:
            exprs[f"expr of {rule['name']}"] = rule["query"]
            exprs[f"recorded {rule['name']}"] = rule["name"]
        self.evaluate(exprs)
        # Per engine family: finite values (x == x drops NaN) for every
        # family whose profile has the quantity, and only for those.
        wrong = {}
        for rule in rules:
            name = rule["name"]
            gaps = set().union(*(v for k, v in self.RULE_GAPS.items()
                                 if name.startswith("namespace_model:" + k)))
            want = NAMESPACES - gaps

            def families():
                got = {m["metric_namespace"] for m, _ in self.prom.vector(
                    f"count by (metric_namespace) ({name} == {name})")}
                return got == want or got
            try:
                poll(name, families, timeout=20, interval=1)
            except AssertionError as e:
                wrong[name] = str(e)
        self.assertFalse(wrong, "\n".join(f"{k}: {v}" for k, v in
                                          wrong.items()))
        print(f"\nrecording rules: {len(rules)} rules, each expression and "
              "recorded series returned data, for every engine family with "
              "the quantity", file=sys.stderr)

    def test_every_dashboard_variable_and_expression_returns_data(self):
        variables = {v["name"]: v for v in
                     self.dashboard["templating"]["list"]}
        t = time.time()
        jobs = self.resolve_variable(variables["job"], {}, t)
        self.assertEqual(jobs, ["tokenmeter"])
        values = {"job": format_var(variables["job"], jobs[:1])}
        namespaces = self.resolve_variable(variables["namespace"], values, t)
        self.assertTrue(NAMESPACES <= set(namespaces), namespaces)
        exprs = {}
        empty = set()
        for ns in sorted(NAMESPACES):
            missing = profiles.NOT_EXPORTED[profiles.profile_of(ns)]
            vals = dict(values, namespace=format_var(variables["namespace"],
                                                     [ns]))
            instances = self.resolve_variable(variables["instance"], vals, t)
            self.assertEqual(set(instances), set(self.env.targets), ns)
            for mode in ("all", "selected"):
                v = dict(vals)
                # "selected": every host picked explicitly, (a|b) escaped.
                v["instance"] = format_var(
                    variables["instance"],
                    None if mode == "all" else instances)
                models = self.resolve_variable(variables["model_name"], v, t)
                self.assertTrue(models, (ns, mode))
                # "selected": one model, escaped (dots in the name).
                v["model_name"] = format_var(
                    variables["model_name"],
                    None if mode == "all" else models[:1])
                engines = self.resolve_variable(variables["engine"], v, t)
                self.assertTrue(engines, (ns, mode))
                v["engine"] = format_var(
                    variables["engine"],
                    None if mode == "all" else engines)
                for title, ref, expr in self.dashboard_targets():
                    key = f"[{ns}, {mode}] {title} / {ref}"
                    exprs[key] = interpolate(expr, v)
                    if (title, ref) in missing:
                        empty.add(key)
        for e in exprs.values():
            self.assertNotIn("$", e)

        # The 1.2 series the tokenmeter_engine family may leave empty:
        # the KV transfers (no --disaggregate here), or all of them
        # without the reference engine's 1.2 modes.
        gaps_12 = KV_TRANSFER_ONLY if self.env.engine_12 else PROTOCOL_12_ONLY

        def allowed(key):
            # The reference engine does not speculate (nor does its
            # stand-in); without --moe-experts it sends no EXPERT_LOAD.
            return (key.startswith("[tokenmeter_engine")
                    and ("spec_decode" in exprs[key] or
                         names_protocol_12_only(exprs[key], gaps_12) or
                         ("moe_" in exprs[key] and not self.env.engine_moe)))
        no_data = self.evaluate(exprs, allowed, expect_empty=empty)
        n_targets = len(list(self.dashboard_targets()))
        n_data = len(exprs) - len(no_data) - len(empty)
        print(f"\ndashboard: {n_targets} target expressions x "
              f"{len(NAMESPACES)} engine families x 2 variable selections "
              f"= {len(exprs)} queries; {n_data}"
              f" returned data; empty as expected, the family exports no "
              f"such series (profiles.NOT_EXPORTED): {len(empty)}; without "
              f"data as expected (the reference engine does not speculate"
              f"{'' if self.env.engine_moe else ', nor send EXPERT_LOAD'}"
              f", nor transfer KV"
              f"{'' if self.env.engine_12 else ', nor send 1.2 events'}): "
              f"{len(no_data)}", file=sys.stderr)
        for k in no_data:
            print("  " + k, file=sys.stderr)
        n_moe = sum("moe_" in e for _, _, e in self.dashboard_targets())
        self.assertEqual(n_moe, 5)
        self.assertEqual(sum(names_protocol_12_only(e)
                             for _, _, e in self.dashboard_targets()), 14)
        n_12 = sum(names_protocol_12_only(e, gaps_12)
                   for _, _, e in self.dashboard_targets())
        # Every 1.2 target returned data in the other families (evaluate()
        # fails otherwise): the sum of both selections' no-data keys is
        # bounded by the reference engine's gaps alone.
        self.assertLessEqual(
            len(no_data),
            2 * (3 + n_12 + (0 if self.env.engine_moe else n_moe)))

    def test_alerts_fire_on_live_conditions(self):
        env = self.env
        a, b = env.targets
        expected = [
            ("TokenmeterIngestErrors", {"instance": a,
                                        "reason": "invalid_msgpack"}),
            ("TokenmeterClientDroppedEvents", {"instance": b,
                                               "engine_family": "vllm"}),
            # The KV-cache alert through each profile's own gauge:
            # lmdeploy:gpu_cache_usage_perc, sglang:token_usage.
            ("TokenmeterKVCacheNearFull", {"instance": b,
                                           "metric_namespace": "lmdeploy"}),
            ("TokenmeterKVCacheNearFull", {"instance": a,
                                           "metric_namespace": "sglang"}),
            ("TokenmeterDaemonDown", {"instance": env.dead_target}),
        ]

        def present():
            alerts = self.prom.api("/api/v1/alerts",
                                   post=False)["data"]["alerts"]
            missing = []
            for name, labels in expected:
                if not any(al["labels"].get("alertname") == name
                           and al["state"] in ("pending", "firing")
                           and all(al["labels"].get(k) == v
                                   for k, v in labels.items())
                           for al in alerts):
                    missing.append((name, labels))
            return not missing or missing
        poll("alerts pending or firing", present, timeout=30)

    def test_federation_matchers_return_series(self):
        with open(os.path.join(DOCS_PROM, "global.yml")) as f:
            text = f.read()
        block = text.split('"match[]":', 1)[1].split("static_configs", 1)[0]
        matchers = re.findall(r"^\s*- '(.+)'\s*$", block, re.M)
        self.assertEqual(len(matchers), 3, matchers)
        for m in matchers:
            body = self.prom.api("/federate", {"match[]": m}, post=False)
            samples = [ln for ln in body.splitlines()
                       if ln and not ln.startswith("#")]
            self.assertTrue(samples, f"/federate match[]={m} returned nothing")

    # -- the router series, by value ----------------------------------------
    def test_cache_config_info_has_the_values_each_engine_sent(self):
        env = self.env
        a, b = env.targets

        def info(ns):
            out = {}
            for m, v in self.prom.vector(f'{ns}:cache_config_info'
                                         '{job="tokenmeter"}'):
                self.assertEqual(v, 1, m)
                key = (m["instance"], m["model_name"], m["engine"])
                self.assertNotIn(key, out, "two cache_config_info series")
                out[key] = {k: m[k] for k in m if k not in (
                    "__name__", "job", "instance", "model_name", "engine",
                    "metric_namespace")}
            return out
        self.assertEqual(info("sglang"), {
            (a, SGLANG_MODEL, "0"): {"page_size": "1", "num_pages": "65536"},
            (b, SGLANG_MODEL, "0"): {"page_size": "16", "num_pages": "4096"},
        })
        # The vllm engine on b sent no cache_config: no series for it.
        self.assertEqual(info("vllm"), {
            (a, VLLM_MODEL, "0"): {"block_size": "16",
                                   "num_gpu_blocks": "2048",
                                   "enable_prefix_caching": "True"}})
        self.assertEqual(info("lmdeploy"), {
            (b, LMDEPLOY_MODEL, "0"): {"block_size": "64",
                                       "num_gpu_blocks": "4096"}})
        engine = info("tokenmeter_engine")
        self.assertEqual({k[0] for k in engine}, set(env.targets))
        for labels in engine.values():
            self.assertEqual(labels, {"block_size": "16",
                                      "num_gpu_blocks": "256",
                                      "enable_prefix_caching": "True"})
        # SGLang's own gauges of the same entries (SGLang v0.5.12).
        for name, want in (("page_size", {a: 1, b: 16}),
                           ("num_pages", {a: 65536, b: 4096})):
            got = {m["instance"]: v for m, v in self.prom.vector(
                f'sglang:{name}{{job="tokenmeter"}}')}
            self.assertEqual(got, want, name)

    def test_lora_requests_info_is_one_series_per_engine_series(self):
        env = self.env
        now = time.time()
        adapters = {"tokenmeter_engine": set(env.engine_loras),
                    "vllm": set(LORAS), "sglang": set(LORAS),
                    "lmdeploy": set(LORAS)}
        seen_waiting = set()
        for ns in sorted(NAMESPACES):
            running = "num_running_reqs" if ns == "sglang" \
                else "num_requests_running"
            engines = {(m["instance"], m["model_name"], m["engine"])
                       for m, _ in self.prom.vector(
                           f'{ns}:{running}{{job="tokenmeter"}}')}
            infos = self.prom.vector(
                f'{ns}:lora_requests_info{{job="tokenmeter"}}')
            keys = [(m["instance"], m["model_name"], m["engine"])
                    for m, _ in infos]
            self.assertEqual(sorted(keys), sorted(engines), ns)
            for m, v in infos:
                # The last change: after the daemons started, not later
                # than now.
                self.assertGreaterEqual(v, env.started_unix - 1, m)
                self.assertLessEqual(v, now + 1, m)
                self.assertIn(m["max_lora"], ("0", "2"), m)
                for label in ("running_lora_adapters",
                              "waiting_lora_adapters"):
                    # Prometheus drops a label whose value is empty.
                    names = m[label].split(",") if m.get(label) else []
                    self.assertEqual(names, sorted(set(names)), m)
                    self.assertLessEqual(set(names), adapters[ns], m)
                    if m["max_lora"] == "0":
                        self.assertEqual(names, [], m)
                if m.get("running_lora_adapters"):
                    # At most max_lora adapters run at once.
                    self.assertLessEqual(
                        len(m["running_lora_adapters"].split(",")),
                        int(m["max_lora"]), m)
            # Over the run, some request of the family waited for an
            # adapter slot (max_lora 2 of 3 or 4 adapters).
            r = self.prom.vector(
                f'count(count_over_time({ns}:lora_requests_info'
                f'{{job="tokenmeter", waiting_lora_adapters!=""}}[1h]))')
            if r:
                seen_waiting.add(ns)
        self.assertTrue(seen_waiting, "no engine ever waited for an adapter")
        print(f"\nlora_requests_info: one series per engine series in "
              f"{len(NAMESPACES)} families; requests waited for an adapter "
              f"in {sorted(seen_waiting)}", file=sys.stderr)

    def test_lora_sets_and_tenant_counts_are_the_engines_own(self):
        """Each simulated engine, paused between two steps, against its
        daemon's /metrics: lora_requests_info's sets are the adapters of
        its running and waiting requests, and the finished requests per
        tenant are the engine's own count."""
        env = self.env
        for sim, ns, finished in (
                (env.vllm, "vllm", "vllm:request_success_total"),
                (env.lmdeploy, "lmdeploy", "lmdeploy:request_success_total"),
                (env.sglang, "sglang", "sglang:num_requests_total")):
            daemon = env.daemon_of[sim]
            model = sim.hello["model"]
            running, waiting = sim.pause()
            try:
                want = {"running_lora_adapters": running,
                        "waiting_lora_adapters": waiting,
                        "tenants": dict(sim.finished_by_tenant)}
                last = []

                def same():
                    samples = daemon.samples()
                    infos = [dict(ls) for (n, ls) in samples
                             if n == f"{ns}:lora_requests_info"
                             and dict(ls)["model_name"] == model]
                    got = {k: infos[0][k] if len(infos) == 1 else infos
                           for k in ("running_lora_adapters",
                                     "waiting_lora_adapters")}
                    got["tenants"] = {}
                    for (n, ls), v in samples.items():
                        ls = dict(ls)
                        if n == finished and ls["model_name"] == model \
                                and v:
                            t = ls["tenant"]
                            got["tenants"][t] = got["tenants"].get(t, 0) + v
                    last[:] = [got]
                    return got == want
                tu.poll_until(same, timeout=10, interval=0.05,
                              what=f"{ns} daemon = engine {want} (last "
                                   f"{last})")
            finally:
                sim.resume()
            self.assertTrue(want["tenants"], ns)
            print(f"\n{ns} paused: running adapters {running!r}, waiting "
                  f"{waiting!r}, finished per tenant {want['tenants']}",
                  file=sys.stderr, end="")

    # -- protocol 1.2, by value ---------------------------------------------
    def test_protocol_12_series_are_the_engines_own(self):
        """Each 1.2 simulated engine, paused between two steps, against its
        daemon's /metrics: admission rejections per reason, failed KV
        transfers per role and reason, the sleep state, and the per-request
        histograms of its finished requests (preemptions: _sum and _count;
        computed prompt tokens: _sum; KV wait: _count, the requests that
        received KV) are the engine's own; and, for the vllm engine, the
        dashboard's sleep panels on Prometheus (Host, Model and Engine
        selected) show its state."""
        env = self.env
        for sim, ns in ((env.vllm, "vllm"), (env.lmdeploy, "lmdeploy"),
                        (env.sglang, "sglang")):
            daemon = env.daemon_of[sim]
            model = sim.hello["model"]
            sim.pause()
            try:
                state = dict(sim.sleep_state)
                awake = state == {"scheduler": "running",
                                  "weights": "resident",
                                  "kv_cache": "resident"}
                # By role and reason (the vllm suffix in every profile),
                # and SGLang's own counters: every failure, and timeouts.
                kv_failed = {f"{role} {reason}": n for (role, reason), n
                             in sim.kv_failed.items()}
                if ns == "sglang":
                    kv_failed["any"] = sum(sim.kv_failed.values())
                    for stage, reason in (("transfer", "timeout"),
                                          ("bootstrap", "bootstrap_timeout")):
                        kv_failed[stage] = sum(
                            n for (_, r), n in sim.kv_failed.items()
                            if r == reason)
                want = {
                    "rejected": dict(sim.rejected),
                    "kv_failed": kv_failed,
                    "fully_awake": 1 if awake else 0,
                    "resources": {f"{res} {st}": 1 for res, st
                                  in state.items()},
                    "per_request": {
                        "request_num_preemptions_count": sim.finished,
                        "request_num_preemptions_sum":
                            sim.finished_preemptions,
                        "request_prefill_kv_computed_tokens_sum":
                            sim.finished_computed,
                        "request_kv_wait_time_seconds_count":
                            sim.finished_kv_received},
                }
                last = []

                def same():
                    got = {"rejected": {}, "kv_failed": {}, "resources": {},
                           "fully_awake": None,
                           "per_request": dict.fromkeys(
                               want["per_request"], 0)}
                    for (n, ls), v in daemon.samples().items():
                        ls = dict(ls)
                        if ls.get("model_name") != model or \
                                not n.startswith(ns + ":"):
                            continue
                        n = n.split(":", 1)[1]
                        if n in ("admission_rejections_total",
                                 "num_queue_rejected_requests_total"):
                            got["rejected"][ls["reason"]] = v
                        elif n == "kv_transfer_failures_total":
                            got["kv_failed"][
                                f"{ls['role']} {ls['reason']}"] = v
                        elif n == "num_transfer_failed_reqs_total":
                            got["kv_failed"]["any"] = v
                        elif n == "kv_transfer_timeouts_total":
                            got["kv_failed"][ls["stage"]] = v
                        elif n == "engine_fully_awake":
                            got["fully_awake"] = v
                        elif n == "engine_sleep_resource_state" and v:
                            got["resources"][
                                f"{ls['resource']} {ls['state']}"] = v
                        elif n in got["per_request"]:  # summed over tenants
                            got["per_request"][n] += v
                    last[:] = [got]
                    return got == want
                tu.poll_until(same, timeout=10, interval=0.05,
                              what=f"{ns} daemon = engine {want} (last "
                                   f"{last})")
                if sim is env.vllm:
                    self.check_sleep_panels(want)
                if sim is env.sglang:
                    self.check_kv_failure_panel(sim, ns, want["kv_failed"])
            finally:
                sim.resume()
            self.assertTrue(want["rejected"], ns)
            self.assertTrue(want["kv_failed"].get(
                "transfer" if ns == "sglang" else "recv timeout"), ns)
            # Every per-request histogram has observations (a preempted
            # request among the finished ones, one that received KV).
            self.assertTrue(all(want["per_request"].values()), want)
            print(f"\n{ns} paused: rejected {want['rejected']}, failed KV "
                  f"transfers {want['kv_failed']}, sleep {state}, finished "
                  f"requests {want['per_request']}", file=sys.stderr, end="")

    def vllm_selection(self):
        """The variables as Grafana sends them with the first host's vllm
        engine alone selected (Host, Model and Engine)."""
        variables = {v["name"]: v for v in
                     self.dashboard["templating"]["list"]}
        return {
            "job": format_var(variables["job"], ["tokenmeter"]),
            "namespace": format_var(variables["namespace"], ["vllm"]),
            "instance": format_var(variables["instance"],
                                   [self.env.host[self.env.vllm]]),
            "model_name": format_var(variables["model_name"], [VLLM_MODEL]),
            "engine": format_var(variables["engine"], ["0"]),
        }

    def selection(self, sim, ns):
        """The variables as Grafana sends them with engine `sim` (of
        namespace `ns`) alone selected (Host, Model and Engine)."""
        variables = {v["name"]: v for v in
                     self.dashboard["templating"]["list"]}
        return {
            "job": format_var(variables["job"], ["tokenmeter"]),
            "namespace": format_var(variables["namespace"], [ns]),
            "instance": format_var(variables["instance"],
                                   [self.env.host[sim]]),
            "model_name": format_var(variables["model_name"],
                                     [sim.hello["model"]]),
            "engine": format_var(variables["engine"],
                                 [sim.hello["instance"]]),
        }

    def check_kv_failure_panel(self, sim, ns, kv_failed):
        """The KV transfer failures panel for `sim`, an engine of the
        sglang profile: the daemon's series by role and reason, and not
        SGLang's own counters (any, timeout) again, which count the same
        failures (`or` alone would draw each failure two or three times)."""
        values = self.selection(sim, ns)
        exprs = [interpolate(expr, values)
                 for title, ref, expr in self.dashboard_targets()
                 if "num_transfer_failed_reqs_total" in expr]
        self.assertEqual(len(exprs), 1, exprs)
        want = {k for k in kv_failed if " " in k}  # "role reason"
        self.assertTrue(want, kv_failed)
        last = []

        def shown():
            got = {f"{m.get('role', '')} {m.get('reason', '')}"
                   for m, _ in self.prom.vector(exprs[0])}
            last[:] = [got]
            return got == want
        tu.poll_until(shown, timeout=10, interval=0.2,
                      what=f"the KV failures panel shows {want} (last "
                           f"{last})")

    def check_sleep_panels(self, want):
        """The dashboard's sleep panels for the first host's vllm engine
        alone, once Prometheus has scraped its paused state."""
        values = self.vllm_selection()
        exprs = {(title, ref): interpolate(expr, values)
                 for title, ref, expr in self.dashboard_targets()
                 if "engine_sleep_resource_state" in expr
                 or "engine_fully_awake" in expr}
        self.assertEqual(len(exprs), 2, exprs)
        last = []

        def shown():
            got = {}
            for (title, ref), expr in exprs.items():
                for m, v in self.prom.vector(expr):
                    if "resource" in m:
                        if v:
                            got[f"{m['resource']} {m['state']}"] = v
                    else:
                        got["not fully awake"] = v
            last[:] = [got]
            return got == dict(want["resources"],
                               **{"not fully awake": 1 - want["fully_awake"]})
        tu.poll_until(shown, timeout=10, interval=0.2,
                      what=f"the sleep panels show {want} (last {last})")

    # -- MoE expert load, by value ------------------------------------------
    def test_moe_panels_show_the_engines_layers_and_experts(self):
        """The MoE panels' queries for one simulated engine (vllm on the
        first host; Host, Model and Engine selected as Grafana sends them):
        the grid has a cell for every layer x expert, and each layer's
        hottest cell is the engine's hot expert; every layer routes the same
        tokens; the histogram's p50 and p99 lie between 1 and the bucket
        bound above the number of experts; and, with the engine paused, each layer's imbalance is max
        / mean of the counts of the engine's latest EXPERT_LOAD."""
        sim = self.env.vllm
        values = self.vllm_selection()
        moe = {}
        for title, ref, expr in self.dashboard_targets():
            if "moe_" in expr:
                moe[(title, ref)] = self.prom.vector(interpolate(expr,
                                                                 values))
        self.assertEqual(len(moe), 5, sorted(moe))
        layers = {str(la) for la in range(MOE_LAYERS)}
        got = {}
        for (title, ref), result in moe.items():
            self.assertTrue(result, (title, ref))
            if "layer x expert" in title:
                got["grid"] = {(m["layer"], m["expert"]): v
                               for m, v in result}
            elif "routed" in title:
                got["routed"] = {m["layer"]: v for m, v in result}
            elif ref == "A":
                got["imbalance"] = {m["layer"]: v for m, v in result}
            else:
                got[f"imbalance {ref}"] = [v for _, v in result]
        self.assertEqual(set(got), {"grid", "routed", "imbalance",
                                    "imbalance B", "imbalance C"})
        grid = got["grid"]
        self.assertEqual(set(grid), {(la, str(e)) for la in layers
                                     for e in range(MOE_EXPERTS)})
        for la in sorted(layers):
            row = {e: v for (layer, e), v in grid.items() if layer == la}
            self.assertGreater(min(row.values()), 0, la)
            self.assertEqual(max(row, key=row.get),
                             str(sim.moe_hot[int(la)]), (la, row))
        routed = got["routed"]
        self.assertEqual(set(routed), layers)
        for la in layers:
            self.assertGreater(routed[la], 0)
            self.assertAlmostEqual(routed[la] / routed["0"], 1, places=6)
        self.assertEqual(set(got["imbalance"]), layers)
        for ref in ("B", "C"):
            # At most the upper bound of the bucket that holds E = 8 (a
            # load all on one expert): histogram_quantile interpolates.
            (q,) = got[f"imbalance {ref}"]
            self.assertTrue(1 <= q <= 10, (ref, q))
        imbalance_expr = interpolate(next(
            e for _, _, e in self.dashboard_targets()
            if "moe_layer_imbalance" in e), values)
        sim.pause()
        try:
            want = {str(la): max(c) * len(c) / sum(c)
                    for la, c in sim.moe_last.items()}
            last = []

            def latest():
                last[:] = [{m["layer"]: v for m, v in
                            self.prom.vector(imbalance_expr)}]
                return (set(last[0]) == set(want) and
                        all(math.isclose(last[0][k], want[k], rel_tol=1e-9)
                            for k in want))
            tu.poll_until(latest, timeout=10, interval=0.2,
                          what=f"imbalance by layer {want} (last {last})")
        finally:
            sim.resume()
        imbalance = last[0]
        print(f"\nMoE panels ({sim.hello['engine']} on "
              f"{self.env.host[sim]}): {len(grid)} cells, hot experts "
              f"{sim.moe_hot}, routed tokens/s per layer "
              f"{routed['0']:.0f}, imbalance by layer "
              f"{ {k: round(v, 2) for k, v in sorted(imbalance.items())} }",
              file=sys.stderr)


class PeerDashboards(LiveBase):
    """Other engines' own dashboards, unchanged, on a Prometheus with no
    rule file: SGLang's (tests/data/peers/sglang, in the repository), and
    vLLM's and LMDeploy's from the peers directory beside the repository
    (PEERS_DIR; their tests skip without it)."""

    PROM = "bare"
    VLLM_EXPRS = os.path.join(PEERS, "vllm", "grafana-exprs.txt")
    LMDEPLOY_DASHBOARD = os.path.join(PEERS, "lmdeploy",
                                      "lmdeploy-dashboard.json")
    SGLANG_DASHBOARD = os.path.join(SGLANG_DIR, "sglang-dashboard.json")

    def test_prometheus_has_no_rule_file(self):
        r = self.prom.api("/api/v1/rules", post=False)
        self.assertEqual(r["data"]["groups"], [])
        # Nothing recorded either: every series name is a scraped one.
        names = self.prom.api("/api/v1/label/__name__/values",
                              post=False)["data"]
        self.assertFalse([n for n in names
                          if n.startswith("namespace_model:")], names)

    def dashboard_exprs(self, dash, values, prefix):
        exprs = {}
        for title, ref, expr in self.panel_targets(dash):
            exprs[f"{prefix} {title} / {ref}"] = interpolate(expr, values)
        return exprs

    def test_vllm_dashboard_expressions_return_data(self):
        path = tu.need_path(self.VLLM_EXPRS, "vLLM's dashboard expressions")
        with open(path) as f:
            lines = [ln.strip() for ln in f if ln.strip()]
        self.assertGreater(len(lines), 20)
        exprs = {f"vllm #{i + 1}": interpolate(ln, {"model_name": VLLM_MODEL})
                 for i, ln in enumerate(lines)}
        self.evaluate(exprs)
        print(f"\nvLLM dashboard: {len(exprs)} expressions returned data",
              file=sys.stderr)

    def test_lmdeploy_dashboard_expressions_return_data(self):
        path = tu.need_path(self.LMDEPLOY_DASHBOARD, "LMDeploy's dashboard")
        with open(path) as f:
            dash = json.load(f)
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        models = self.resolve_variable(variables["model_name"], {},
                                       time.time())
        self.assertIn(LMDEPLOY_MODEL, models)
        exprs = self.dashboard_exprs(
            dash, {"model_name": format_var(variables["model_name"],
                                            [LMDEPLOY_MODEL])}, "lmdeploy")
        self.assertGreater(len(exprs), 20)
        self.evaluate(exprs)
        print(f"\nLMDeploy dashboard: {len(exprs)} expressions returned "
              "data, no rule file loaded", file=sys.stderr)

    def test_sglang_dashboard_expressions_return_data(self):
        with open(self.SGLANG_DASHBOARD, "rb") as f:
            raw = f.read()
        # Unchanged: the bytes the README names.
        with open(os.path.join(SGLANG_DIR, "README.md")) as f:
            sha = re.search(r"SHA-256 `([0-9a-f]{64})`", f.read()).group(1)
        self.assertEqual(hashlib.sha256(raw).hexdigest(), sha)
        dash = json.loads(raw)
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        t = time.time()
        self.assertIn(SGLANG_MODEL, self.resolve_variable(
            variables["model_name"], {}, t))
        self.assertTrue(set(self.env.targets) <= set(self.resolve_variable(
            variables["instance"], {}, t)))
        values = {"model_name": format_var(variables["model_name"],
                                           [SGLANG_MODEL]),
                  "instance": format_var(variables["instance"],
                                         self.env.targets[:1])}
        exprs = self.dashboard_exprs(dash, values, "sglang")
        self.assertEqual(len(exprs), 14)
        self.evaluate(exprs)
        print(f"\nSGLang dashboard: {len(exprs)} expressions returned data, "
              "no rule file loaded", file=sys.stderr)


def main():
    if not os.access(PROMETHEUS, os.X_OK):
        tu.skip(f"{PROMETHEUS} not installed (Debian package prometheus; "
                "scripts/install-deps.sh installs it)")
    if not DAEMON:
        tu.skip("TOKENMETERD not set (run through meson test)")
    tu.main()


if __name__ == "__main__":
    main()
