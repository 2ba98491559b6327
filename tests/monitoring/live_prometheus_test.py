#!/usr/bin/python3
"""The monitoring stack of docs/ proven on a live Prometheus.

Two tokenmeterd daemons (two "hosts") on temp sockets and loopback ports
are fed by the reference engine (tokenmeter-engine, namespace
tokenmeter_engine) and by simulated engines that introduce themselves as
vllm and lmdeploy (sim_engine.py). Debian's /usr/bin/prometheus runs on
docs/prometheus/prometheus.yml itself, with only the targets rewritten to
the test daemons (a third target is a dead port), the intervals set to 1 s,
and the rule files of docs/prometheus/ beside it. Then, through the HTTP
API, every query must succeed and return data:

* every target expression of docs/grafana/tokenmeter.json, for every engine
  family the dashboard's namespace variable finds, with the other variables
  set as Grafana would set them: "All", and explicit selections (regex
  escaped the way Grafana escapes them);
* every variable query of the dashboard;
* every recording rule (its expression and its recorded series), with every
  rule, recording or alerting, loaded and evaluated without error;
* the alerts whose conditions the feeds create (ingest errors, client
  drops, KV cache near full, daemon down);
* (class PeerDashboards, its own meson test, skipped without the peers
  directory beside the repository) every expression of vLLM's dashboard
  (shared/peers/vllm/grafana-exprs.txt) and of LMDeploy's
  (shared/peers/lmdeploy/lmdeploy-dashboard.json, through
  docs/prometheus/lmdeploy-compat.rules.yml);
* the federation matchers of docs/prometheus/global.yml.

"Data" means a non-empty result with at least one finite value. The one
exception is speculative decoding in the tokenmeter_engine family: the
reference engine does not speculate, so those panels are empty or NaN for
it (they are proven on the vllm and lmdeploy families).

Exits 77 (skipped) when /usr/bin/prometheus is not installed
(scripts/install-deps.sh installs Debian's prometheus package).
"""
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
from sim_engine import SimEngine  # noqa: E402

SRC = os.environ.get("TOKENMETER_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(HERE)))
PROMETHEUS = os.environ.get("PROMETHEUS", "/usr/bin/prometheus")
DAEMON = os.environ.get("TOKENMETERD", "")
ENGINE = os.environ.get("TOKENMETER_ENGINE", "")
PEERS = tu.peers_dir()
DOCS_PROM = os.path.join(SRC, "docs", "prometheus")
DASHBOARD = os.path.join(SRC, "docs", "grafana", "tokenmeter.json")

# Grafana's built-in intervals. With a 1 s scrape interval Grafana's
# $__rate_interval would be at least 4 s; 15 s keeps several points in
# every window on a loaded machine.
BUILTINS = {"__rate_interval": "15s", "__interval": "5s", "__range": "1m"}

VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LMDEPLOY_MODEL = "internlm/internlm2_5-7b-chat"
NAMESPACES = {"tokenmeter_engine", "vllm", "lmdeploy"}


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


class Env:
    """Daemons, feeds and Prometheus for the whole test class."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tm-mon-", dir="/tmp")
        self.procs = []
        self.sims = []
        self.daemons = []
        self.prom = None
        self.uses_engine = bool(ENGINE) and os.access(ENGINE, os.X_OK)
        for _ in range(2):
            d = tu.Daemon("--log-interval", "0", binary=DAEMON)
            self.daemons.append(d)
            d.start()
        a, b = self.daemons
        if self.uses_engine:
            for i, d in enumerate(self.daemons):
                with open(os.path.join(self.dir, f"engine{i}.log"),
                          "wb") as log:
                    self.procs.append(subprocess.Popen(
                        [ENGINE, "--requests", "5000", "--rate", "25",
                         "--backend", "cpu", "--kv-blocks", "256",
                         "--shared-prefix", "0.5", "--seed", str(7 + i),
                         "--metrics-socket", d.sock, "--quiet"],
                        stdout=subprocess.DEVNULL, stderr=log))
        else:
            # TODO(engine): only while tokenmeter-engine is not built.
            for i, d in enumerate(self.daemons):
                self.sims.append(SimEngine(d.sock, "tokenmeter-engine",
                                           "tokenmeter-tiny", spec_tokens=0,
                                           arrival_rate=20, seed=10 + i))
        self.sims += [
            SimEngine(a.sock, "vllm", VLLM_MODEL, "0", seed=1),
            SimEngine(b.sock, "vllm", VLLM_MODEL, "0", seed=2,
                      drops_per_s=5),
            SimEngine(b.sock, "lmdeploy", LMDEPLOY_MODEL, "0", seed=3,
                      kv_floor=0.97),
        ]
        for s in self.sims:
            s.start()
        self.targets = [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]
        self.dead_target = f"127.0.0.1:{free_port()}"
        self.start_prometheus()

    # -- Prometheus ---------------------------------------------------------
    def start_prometheus(self):
        with open(os.path.join(DOCS_PROM, "prometheus.yml")) as f:
            text = f.read()
        text, n1 = re.subn(r"scrape_interval: 15s", "scrape_interval: 1s", text)
        text, n2 = re.subn(r"evaluation_interval: 15s",
                           "evaluation_interval: 1s", text)
        assert (n1, n2) == (1, 1), "intervals not found in prometheus.yml"
        hosts = re.findall(r"gpu-node-\d+:10062", text)
        assert len(hosts) >= 2, "prometheus.yml lists fewer than 2 hosts"
        mapping = dict(zip(hosts, self.targets + [self.dead_target] * 99))
        text = re.sub(r"gpu-node-\d+:10062", lambda m: mapping[m.group(0)],
                      text)
        for attempt in range(3):
            self.prom_port = free_port()
            conf = text.replace("localhost:9090",
                                f"127.0.0.1:{self.prom_port}")
            pdir = os.path.join(self.dir, f"prom{attempt}")
            os.makedirs(pdir)
            with open(os.path.join(pdir, "prometheus.yml"), "w") as f:
                f.write(conf)
            for name in os.listdir(DOCS_PROM):
                if name.endswith((".rules.yml", ".alerts.yml")):
                    shutil.copy(os.path.join(DOCS_PROM, name), pdir)
            self.prom, self.prom_log = tu.start_prometheus(
                PROMETHEUS, pdir, self.prom_port)
            if self.wait_prometheus_ready():
                return
            self.prom.kill()
            self.prom.wait()
        raise AssertionError("prometheus did not start: " + self.prom_tail())

    def prom_tail(self):
        try:
            with open(self.prom_log, errors="replace") as f:
                return f.read()[-3000:]
        except OSError:
            return ""

    def wait_prometheus_ready(self, timeout=30):
        """True once /-/ready answers 200; False if Prometheus exits (e.g.
        its port was taken)."""
        def ready():
            if self.prom.poll() is not None:
                return "exited"
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{self.prom_port}/-/ready",
                        timeout=2) as r:
                    return "ready" if r.status == 200 else None
            except (urllib.error.URLError, OSError):
                return None
        return tu.poll_until(ready, timeout=timeout, interval=0.1,
                             what="prometheus /-/ready") == "ready"

    def api(self, path, params=None, post=True):
        url = f"http://127.0.0.1:{self.prom_port}{path}"
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

    def close(self):
        for s in self.sims:
            s.stop()
        for p in self.procs + ([self.prom] if self.prom else []):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for d in self.daemons:
            d.stop()
            d.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)


def poll(what, predicate, timeout=60, interval=0.5):
    """Until predicate returns True (anything else is what is missing)."""
    last = []

    def done():
        last[:] = [predicate()]
        return last[0] is True
    tu.poll_until(done, timeout=timeout, interval=interval,
                  what=f"{what} (missing: {last})")


class LiveBase(unittest.TestCase):
    """The Env of one class's tests, and the helpers (no tests here)."""

    @classmethod
    def setUpClass(cls):
        cls.env = env = Env()
        try:
            cls.wait_for_data()
        except BaseException:
            env.close()
            raise
        with open(DASHBOARD) as f:
            cls.dashboard = json.load(f)

    @classmethod
    def tearDownClass(cls):
        for s in cls.env.sims:
            if s.error:
                print(f"sim engine error: {s.error!r}", file=sys.stderr)
        cls.env.close()

    @classmethod
    def wait_for_data(cls):
        env = cls.env

        def targets_scraped():
            r = env.api("/api/v1/targets", post=False)
            health = {t["labels"]["instance"]: t["health"]
                      for t in r["data"]["activeTargets"]
                      if t["labels"]["job"] == "tokenmeter"}
            want = {t: "up" for t in env.targets}
            want[env.dead_target] = "down"
            return health == want or health
        poll("targets scraped", targets_scraped)
        # Scraped once, so an ingest error from now on shows as an increase.
        s = env.daemons[0].connect()
        s.sendall(b"\xc1")
        s.close()

        def enough_points():
            out = {}
            for ns in NAMESPACES:
                r = env.query("min(count_over_time("
                              f"{ns}:generation_tokens_total[15s]))")
                res = r["data"]["result"]
                out[ns] = res[0]["value"][1] if res else None
            ok = all(v is not None and float(v) >= 6 for v in out.values())
            return ok or out
        poll("6 scrapes of every engine family", enough_points)

        def rules_evaluated():
            r = env.api("/api/v1/rules", post=False)
            bad = [(rule["name"], rule["health"], rule.get("lastError"))
                   for g in r["data"]["groups"] for rule in g["rules"]
                   if rule["health"] != "ok"]
            return not bad or bad
        poll("every rule evaluated", rules_evaluated)

    # -- helpers --------------------------------------------------------------
    def evaluate(self, exprs, allow_no_data=lambda key: False, rounds=3):
        """exprs: {key: promql}. Queries all at one instant (in parallel);
        retries the ones without data a few times (a window may fall
        between two finished requests on a loaded machine). Returns the
        keys that returned no data but were allowed to."""
        pending = dict(exprs)
        failures = {}
        for attempt in range(rounds):
            t = time.time()

            def run(item):
                key, expr = item
                r = self.env.query(expr, t)
                if r.get("status") != "success":
                    return key, f"error: {r.get('error')}"
                if not r["data"]["result"]:
                    return key, "empty result"
                if not finite_values(r["data"]):
                    return key, "no finite value (NaN only)"
                return key, None
            with ThreadPoolExecutor(max_workers=4) as pool:
                results = list(pool.map(run, pending.items()))
            failures = {k: why for k, why in results if why}
            errors = {k: w for k, w in failures.items()
                      if w.startswith("error")}
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

    def variables(self):
        return {v["name"]: v for v in self.dashboard["templating"]["list"]}

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
            r = self.env.api("/api/v1/series", {
                "match[]": selector, "start": f"{t - 3600:.3f}",
                "end": f"{t:.3f}"})
            self.assertEqual(r.get("status"), "success", (q, r))
            found = {s[label] for s in r["data"] if label in s}
        else:
            r = self.env.api(f"/api/v1/label/{label}/values", post=False)
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

    def dashboard_targets(self):
        for p in self.dashboard["panels"]:
            for t in p.get("targets", []):
                yield p["title"], t["refId"], t["expr"]



class LivePrometheus(LiveBase):
    """Everything that needs nothing from outside the repository."""

    def test_targets_health_matches_the_hosts(self):
        r = self.env.query('up{job="tokenmeter"}')
        up = {x["metric"]["instance"]: x["value"][1]
              for x in r["data"]["result"]}
        want = {t: "1" for t in self.env.targets}
        want[self.env.dead_target] = "0"
        self.assertEqual(up, want)

    def test_every_rule_file_loaded_and_every_rule_healthy(self):
        r = self.env.api("/api/v1/rules", post=False)
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

    def test_every_recording_rule_returns_data(self):
        r = self.env.api("/api/v1/rules", {"type": "record"}, post=False)
        rules = [rule for g in r["data"]["groups"] for rule in g["rules"]
                 if rule["type"] == "recording"]
        exprs = {}
        for rule in rules:
            exprs[f"expr of {rule['name']}"] = rule["query"]
            exprs[f"recorded {rule['name']}"] = rule["name"]
        self.evaluate(exprs)
        print(f"\nrecording rules: {len(rules)} rules, each expression and "
              "recorded series returned data", file=sys.stderr)

    def test_every_dashboard_variable_and_expression_returns_data(self):
        variables = self.variables()
        t = time.time()
        jobs = self.resolve_variable(variables["job"], {}, t)
        self.assertEqual(jobs, ["tokenmeter"])
        values = {"job": format_var(variables["job"], jobs[:1])}
        namespaces = self.resolve_variable(variables["namespace"], values, t)
        self.assertTrue(NAMESPACES <= set(namespaces), namespaces)
        exprs = {}
        for ns in sorted(NAMESPACES):
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
                    exprs[f"[{ns}, {mode}] {title} / {ref}"] = \
                        interpolate(expr, v)
        for e in exprs.values():
            self.assertNotIn("$", e)

        def allowed(key):
            # The reference engine does not speculate (nor does its
            # stand-in).
            return (key.startswith("[tokenmeter_engine")
                    and "spec_decode" in exprs[key])
        no_data = self.evaluate(exprs, allowed)
        n_targets = len(list(self.dashboard_targets()))
        print(f"\ndashboard: {n_targets} target expressions x "
              f"{len(NAMESPACES)} engine families x 2 variable selections "
              f"= {len(exprs)} queries; {len(exprs) - len(no_data)} returned "
              f"data; without data as expected (the reference engine does "
              f"not speculate): {len(no_data)}", file=sys.stderr)
        for k in no_data:
            print("  " + k, file=sys.stderr)
        self.assertLessEqual(len(no_data), 2 * 3)

    def test_alerts_fire_on_live_conditions(self):
        env = self.env
        a, b = env.targets
        expected = [
            ("TokenmeterIngestErrors", {"instance": a,
                                        "reason": "invalid_msgpack"}),
            ("TokenmeterClientDroppedEvents", {"instance": b,
                                               "engine_family": "vllm"}),
            ("TokenmeterKVCacheNearFull", {"instance": b,
                                           "metric_namespace": "lmdeploy"}),
            ("TokenmeterDaemonDown", {"instance": env.dead_target}),
        ]

        def present():
            alerts = env.api("/api/v1/alerts", post=False)["data"]["alerts"]
            missing = []
            for name, labels in expected:
                if not any(al["labels"].get("alertname") == name
                           and al["state"] in ("pending", "firing")
                           and all(al["labels"].get(k) == v
                                   for k, v in labels.items())
                           for al in alerts):
                    missing.append(name)
            return not missing or missing
        poll("alerts pending or firing", present, timeout=30)

    def test_federation_matchers_return_series(self):
        with open(os.path.join(DOCS_PROM, "global.yml")) as f:
            text = f.read()
        block = text.split('"match[]":', 1)[1].split("static_configs", 1)[0]
        matchers = re.findall(r"^\s*- '(.+)'\s*$", block, re.M)
        self.assertEqual(len(matchers), 3, matchers)
        for m in matchers:
            body = self.env.api("/federate", {"match[]": m}, post=False)
            samples = [ln for ln in body.splitlines()
                       if ln and not ln.startswith("#")]
            self.assertTrue(samples, f"/federate match[]={m} returned nothing")


class PeerDashboards(LiveBase):
    """The vLLM and LMDeploy dashboards, from the peers directory beside
    the repository (PEERS_DIR): skipped, before anything starts, without
    it."""

    VLLM_EXPRS = os.path.join(PEERS, "vllm", "grafana-exprs.txt")
    LMDEPLOY_DASHBOARD = os.path.join(PEERS, "lmdeploy",
                                      "lmdeploy-dashboard.json")

    @classmethod
    def setUpClass(cls):
        tu.need_path(cls.VLLM_EXPRS, "vLLM's dashboard expressions")
        tu.need_path(cls.LMDEPLOY_DASHBOARD, "LMDeploy's dashboard")
        super().setUpClass()

    def test_vllm_dashboard_expressions_return_data(self):
        path = self.VLLM_EXPRS
        with open(path) as f:
            lines = [ln.strip() for ln in f if ln.strip()]
        self.assertGreater(len(lines), 20)
        exprs = {f"vllm #{i + 1}": interpolate(ln, {"model_name": VLLM_MODEL})
                 for i, ln in enumerate(lines)}
        self.evaluate(exprs)
        print(f"\nvLLM dashboard: {len(exprs)} expressions returned data",
              file=sys.stderr)

    def test_lmdeploy_dashboard_expressions_return_data(self):
        path = self.LMDEPLOY_DASHBOARD
        with open(path) as f:
            dash = json.load(f)
        exprs = {}
        for p in dash["panels"]:
            for t in p.get("targets", []):
                exprs[f"lmdeploy {p['title']} / {t['refId']}"] = interpolate(
                    t["expr"], {"model_name": LMDEPLOY_MODEL})
        self.assertGreater(len(exprs), 20)
        self.evaluate(exprs)
        print(f"\nLMDeploy dashboard: {len(exprs)} expressions returned data",
              file=sys.stderr)


def main():
    if not os.access(PROMETHEUS, os.X_OK):
        tu.skip(f"{PROMETHEUS} not installed (Debian package prometheus; "
                "scripts/install-deps.sh installs it)")
    if not DAEMON:
        tu.skip("TOKENMETERD not set (run through meson test)")
    tu.main()


if __name__ == "__main__":
    main()
