#!/usr/bin/python3
"""A fleet on Prometheus, proven with simulated hosts (issue 20).

Three hosts, each a Linux network namespace with its own tokenmeterd,
reference engines (tokenmeter-engine with --report) and two Prometheus
processes, one per topology of docs/user-guide.md section 9:

* remote-write: a Prometheus agent (--enable-feature=agent) on
  docs/prometheus/fleet/agent.yml, remote-writing to the central store;
* federation: a Prometheus server on docs/prometheus/fleet/host.yml with
  fleet/host.rules.yml, federated by the central Prometheus.

The central Prometheus (its own namespace, a bridge with one veth per host,
10.250.0.0/24) runs docs/prometheus/fleet/central.yml with
--web.enable-remote-write-receiver and fleet/fleet.rules.yml, so it holds
both topologies' series at once: the check that the two rule groups never
add up each other's inputs. Only host names, targets, the write URL, its
batch_send_deadline and the intervals (1 s, all) of the files are
rewritten. Nothing leaves the namespaces: the test talks to them by
entering them (setns on its own thread).

Checks, on the central Prometheus:
* the fleet totals (per host, per model, whole fleet; requests by finish
  reason, prompt and generation tokens, TTFT and ITL counts) equal the sum
  of the engines' --report figures exactly, for each `via`;
* each via's fleet p50/p99 rules equal histogram_quantile() of that via's
  input bucket rates summed here over hosts and engines (a mean of the
  hosts' quantiles, which differs, would fail), and lie between the hosts'
  own; gauges equal the daemons' own values;
* every series carries its host (`host`, or for the federation job's own
  series the host Prometheus's `instance`), and every fleet series one
  `via`, one series per via;
* every panel of docs/grafana/tokenmeter-fleet.json returns data, for
  both values of its `via` variable.
It prints the figures docs/user-guide.md section 9 quotes (a FIGURES line).
Every namespace, process and temp dir it made is removed, also on failure
or SIGTERM; stale ones of an earlier run that died are swept first.

Exits 77 (skipped) without root, without `ip netns`, or without
/usr/bin/prometheus.
"""
import ctypes
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

SRC = os.environ.get("TOKENMETER_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(HERE)))
FLEET_DOCS = os.path.join(SRC, "docs", "prometheus", "fleet")
DASHBOARD = os.path.join(SRC, "docs", "grafana", "tokenmeter-fleet.json")
PROMETHEUS = os.environ.get("PROMETHEUS", "/usr/bin/prometheus")

PREFIX = "tmfleet-"       # netns and temp dir names: PREFIX<pid>-...
SUBNET = "10.250.0"
CENTRAL_IP = f"{SUBNET}.1"
NS = "tokenmeter_engine"  # the reference engine's metric namespace
VIAS = ("remote_write", "federation")
DEADLINE_S = 60.0

# host -> its engines: (instance, model, seed, extra flags). Two models;
# host 1 runs two tiny engines (latencies of microseconds, all in the first
# ITL bucket), hosts 2 and 3 one small engine each (milliseconds, over
# many buckets): the hosts' latency distributions differ, so that a mean
# of their quantiles is not the fleet's quantile.
HOSTS = {
    "gpu-node-1": [("e0", "llama-a", 11, []), ("e1", "llama-a", 12, [])],
    "gpu-node-2": [("e0", "llama-a", 21, ["--model-size", "small"])],
    "gpu-node-3": [("e0", "qwen-b", 31, ["--model-size", "small",
                                         "--output-len", "32"])],
}
WORKLOAD = ["--requests", "100", "--rate", "20", "--prompt-len", "48",
            "--output-len", "24", "--max-batch", "8", "--backend", "cpu",
            "--quiet"]

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class InNetns:
    """Runs the calling thread in a named network namespace for the block:
    sockets made inside belong to it (and keep working after)."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
        try:
            if _libc.setns(target, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns {self.name}")
        finally:
            os.close(target)

    def __exit__(self, *exc):
        try:
            if _libc.setns(self.own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
        finally:
            os.close(self.own)


def ip(*args, check=True):
    p = subprocess.run(["ip", *args], capture_output=True, text=True,
                       timeout=30)
    if check and p.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)}: {p.stderr.strip()}")
    return p


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def kill_netns(name):
    """SIGKILL whatever still runs in namespace `name`, then deletes it."""
    p = ip("netns", "pids", name, check=False)
    for pid in p.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    ip("netns", "del", name, check=False)


def sweep_stale():
    """Removes the namespaces and temp dirs of earlier runs whose process
    is gone (a run killed with SIGKILL cannot clean up after itself)."""
    for line in ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(rf"{PREFIX}(\d+)-", name)
        if m and not pid_alive(int(m.group(1))):
            kill_netns(name)
    for name in os.listdir("/tmp"):
        m = re.match(rf"{PREFIX}(\d+)-", name)
        if m and not pid_alive(int(m.group(1))):
            shutil.rmtree(os.path.join("/tmp", name), ignore_errors=True)


def our_namespaces():
    out = []
    for line in ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(f"{PREFIX}{os.getpid()}-"):
            out.append(name)
    return out


def http_json(netns, url, timeout=10):
    with InNetns(netns):
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.load(r)


def http_text(netns, url, timeout=10):
    with InNetns(netns):
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()


def histogram_quantile(q, buckets):
    """Prometheus's histogram_quantile() on {le: cumulative count}, with
    what its bucketQuantile() does first (promql/quantile.go): a count
    within a relative 1e-12 of the one before is taken as equal to it (sums
    of rates differ in their last bits with the order of the summing), then
    the counts' monotonic envelope."""
    bs = [[le, count] for le, count in sorted(buckets.items())]
    if len(bs) < 2 or not math.isinf(bs[-1][0]):
        return math.nan
    prev = bs[0][1]
    for b in bs[1:]:
        delta = abs(b[1] - prev)
        if delta == 0:
            continue
        if b[1] != 0 and delta / b[1] <= 1e-12:
            b[1] = prev
        else:
            prev = b[1]
    top = bs[0][1]
    for b in bs[1:]:
        top = max(top, b[1])
        b[1] = top
    total = bs[-1][1]
    if total <= 0:
        return math.nan
    rank = q * total
    for i, (le, count) in enumerate(bs):
        if count >= rank:
            break
    if math.isinf(le):
        return bs[-2][0]
    lower, below = (0.0, 0.0) if i == 0 else bs[i - 1]
    if i == 0 and le <= 0:
        return le
    return lower + (le - lower) * (rank - below) / (count - below)


class Fleet:
    """The namespaces, daemons, engines and Prometheus processes; cleanup()
    removes all of it and may be called any number of times."""

    def __init__(self):
        self.tag = f"{PREFIX}{os.getpid()}"
        self.central = f"{self.tag}-c"
        self.hosts = {h: f"{self.tag}-h{i + 1}"
                      for i, h in enumerate(HOSTS)}
        self.addr = {h: f"{SUBNET}.{11 + i}" for i, h in enumerate(HOSTS)}
        self.dir = tempfile.mkdtemp(prefix=f"{self.tag}-", dir="/tmp")
        self.procs = []    # (name, Popen), each its own process group
        self.daemons = {}  # host -> tu.Daemon
        self.reports = {}  # (host, instance) -> --report dict
        self.logs = {}

    # Network ---------------------------------------------------------
    def make_network(self):
        c = self.central
        ip("netns", "add", c)
        ip("-n", c, "link", "set", "lo", "up")
        ip("-n", c, "link", "add", "br0", "type", "bridge")
        ip("-n", c, "addr", "add", f"{CENTRAL_IP}/24", "dev", "br0")
        ip("-n", c, "link", "set", "br0", "up")
        for i, (host, ns) in enumerate(self.hosts.items()):
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
            veth = f"vh{i + 1}"
            ip("-n", c, "link", "add", veth, "type", "veth", "peer", "name",
               "eth0", "netns", ns)
            ip("-n", c, "link", "set", veth, "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{self.addr[host]}/24", "dev",
               "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")

    # Processes -------------------------------------------------------
    def spawn(self, name, netns, argv, cwd=None):
        log = open(os.path.join(self.dir, f"{name}.log"), "wb")
        self.logs[name] = log.name
        proc = subprocess.Popen(["ip", "netns", "exec", netns, *argv],
                                stdout=log, stderr=subprocess.STDOUT,
                                cwd=cwd, start_new_session=True)
        log.close()
        self.procs.append((name, proc))
        return proc

    def log_tail(self, name, n=3000):
        try:
            with open(self.logs[name], errors="replace") as f:
                return f.read()[-n:]
        except (KeyError, OSError):
            return ""

    def start_daemons(self):
        for host, ns in self.hosts.items():
            d = tu.Daemon("--log-interval", "0",
                          listen=f"{self.addr[host]}:10062",
                          launcher=["ip", "netns", "exec", ns],
                          preexec_fn=os.setsid, prefix=f"{self.tag}-d-")
            self.daemons[host] = d
            d.start()

    def write_config(self, name, doc, *rule_files):
        pdir = os.path.join(self.dir, name)
        os.makedirs(pdir)
        with open(os.path.join(pdir, "prometheus.yml"), "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
        for r in rule_files:
            shutil.copy(os.path.join(FLEET_DOCS, r), pdir)
        return pdir

    def prometheus(self, name, netns, pdir, listen, *flags):
        return self.spawn(name, netns, [
            PROMETHEUS, "--config.file=" + os.path.join(pdir,
                                                        "prometheus.yml"),
            f"--web.listen-address={listen}", "--log.level=warn", *flags],
            cwd=pdir)

    def start_prometheus(self):
        def load(name):
            with open(os.path.join(FLEET_DOCS, name)) as f:
                return yaml.safe_load(f)

        def local_target(doc, host):
            (job,) = doc["scrape_configs"]
            job["static_configs"] = [{"targets": [
                f"{self.addr[host]}:10062"]}]

        central = load("central.yml")
        central["global"].update(scrape_interval="1s",
                                 evaluation_interval="1s")
        (fed,) = central["scrape_configs"]
        fed["static_configs"] = [{"targets": [
            f"{self.addr[h]}:9090" for h in HOSTS]}]
        pdir = self.write_config("central", central, "fleet.rules.yml")
        self.prometheus("central", self.central, pdir, f"{CENTRAL_IP}:9090",
                        "--storage.tsdb.path=" + os.path.join(pdir, "data"),
                        "--web.enable-remote-write-receiver")
        for host, ns in self.hosts.items():
            agent = load("agent.yml")
            agent["global"]["scrape_interval"] = "1s"
            agent["global"]["external_labels"]["host"] = host
            local_target(agent, host)
            (rw,) = agent["remote_write"]
            rw["url"] = f"http://{CENTRAL_IP}:9090/api/v1/write"
            rw["queue_config"]["batch_send_deadline"] = "1s"
            pdir = self.write_config(f"agent-{host}", agent)
            self.prometheus(f"agent-{host}", ns, pdir, "127.0.0.1:9091",
                            "--enable-feature=agent",
                            "--storage.agent.path=" +
                            os.path.join(pdir, "wal"))
            server = load("host.yml")
            server["global"].update(scrape_interval="1s",
                                    evaluation_interval="1s")
            server["global"]["external_labels"]["host"] = host
            local_target(server, host)
            pdir = self.write_config(f"server-{host}", server,
                                     "host.rules.yml")
            self.prometheus(f"server-{host}", ns, pdir,
                            f"{self.addr[host]}:9090",
                            "--storage.tsdb.path=" +
                            os.path.join(pdir, "data"))
        # Every one answers /-/ready, in its own namespace.
        waits = [("central", self.central, f"{CENTRAL_IP}:9090")]
        for host, ns in self.hosts.items():
            waits += [(f"agent-{host}", ns, "127.0.0.1:9091"),
                      (f"server-{host}", ns, f"{self.addr[host]}:9090")]
        for name, ns, addr in waits:
            proc = dict(self.procs)[name]

            def ready():
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited {proc.returncode}"
                                         f": {self.log_tail(name)}")
                try:
                    http_text(ns, f"http://{addr}/-/ready", timeout=2)
                    return True
                except (urllib.error.URLError, OSError):
                    return False
            tu.poll_until(ready, timeout=30, interval=0.1,
                          what=f"{name} /-/ready")
        # Ready is not scraping: wait until both topologies deliver every
        # host's `up` to the central store, so that the engines' whole runs
        # are in the series.
        def live():
            rw = values_by(self.query('up{job="tokenmeter", host!=""}'),
                           "host")
            fed = values_by(self.query('host_job:up:sum{job="tokenmeter"}'),
                            "host")
            want = {(h,): 1.0 for h in HOSTS}
            return rw == want and fed == want
        tu.poll_until(live, timeout=30, interval=0.2,
                      what="every host's up at the central store")

    def run_engines(self):
        running = []
        for host, engines in HOSTS.items():
            for inst, model, seed, extra in engines:
                e = tu.Engine(
                    *WORKLOAD, *extra, "--seed", str(seed), "--model", model,
                    "--instance", inst, socket=self.daemons[host].sock,
                    dir=self.dir, name=f"engine-{host}-{inst}",
                    launcher=["ip", "netns", "exec", self.hosts[host]],
                    new_session=True).start()
                # cleanup() stops its process group with the others'.
                self.procs.append((e.name, e.proc))
                running.append((host, inst, e))
        for host, inst, e in running:
            self.reports[(host, inst)] = e.report(timeout=90)

    # Queries ---------------------------------------------------------
    def query(self, expr, at=None):
        """An instant query on the central Prometheus: its result list."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        url = (f"http://{CENTRAL_IP}:9090/api/v1/query?"
               + urllib.parse.urlencode(params))
        body = http_json(self.central, url)
        if body.get("status") != "success":
            raise AssertionError(f"query {expr!r}: {body}")
        return body["data"]["result"]

    def scrape_daemon(self, host):
        d = self.daemons[host]
        with InNetns(self.hosts[host]):
            return tu.scrape(d.port, d.host)

    # Cleanup ---------------------------------------------------------
    def cleanup(self):
        t = time.monotonic()
        # The agents first, while the central store still takes their
        # last flush (an agent waits for it up to its flush deadline).
        agents = [p for n, p in self.procs if n.startswith("agent-")]
        others = [p for n, p in self.procs if not n.startswith("agent-")]
        for group in (agents, others):
            for proc in group:
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            for proc in group:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        for d in self.daemons.values():
            try:
                d.stop(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            d.cleanup()
        for ns in [self.central, *self.hosts.values()]:
            kill_netns(ns)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.procs:
            print(f"cleanup: {time.monotonic() - t:.1f} s", flush=True)


def values_by(result, *labels):
    """{tuple of the labels' values: float value} of a query result."""
    out = {}
    for r in result:
        key = tuple(r["metric"].get(n, "") for n in labels)
        if key in out:
            raise AssertionError(f"two series for {key}: {result}")
        out[key] = float(r["value"][1])
    return out


FLEET = None


def on_sigterm(signum, frame):
    # meson's timeout: clean up before going.
    if FLEET is not None:
        FLEET.cleanup()
    os._exit(1)


class FleetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        global FLEET
        sweep_stale()
        cls.t0 = time.monotonic()
        cls.fleet = FLEET = Fleet()
        try:
            cls.fleet.make_network()
            cls.fleet.start_daemons()
            cls.fleet.start_prometheus()
            cls.sent0 = cls.agents_sent()
            cls.fleet.run_engines()
            cls.engines_done = time.time()
            cls.expected = cls.expectations(cls.fleet.reports)
            cls.wait_delivered()
        except BaseException:
            cls.fleet.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.fleet.cleanup()
        # Nothing of ours is left.
        left = our_namespaces()
        dirs = [n for n in os.listdir("/tmp")
                if n.startswith(f"{PREFIX}{os.getpid()}-")]
        alive = [n for n, p in cls.fleet.procs if p.poll() is None]
        print(f"fleet test: {time.monotonic() - cls.t0:.1f} s in all; left "
              f"behind: namespaces {left}, dirs {dirs}, processes {alive}",
              flush=True)
        if left or dirs or alive:
            raise AssertionError(f"left behind: {left} {dirs} {alive}")

    @classmethod
    def agents_sent(cls):
        """{host: (time, samples the host's agent has sent so far)}, and
        "central": (time, samples the central one has appended)."""
        out = {}
        for host, ns in cls.fleet.hosts.items():
            text = http_text(ns, "http://127.0.0.1:9091/metrics")
            out[host] = (time.monotonic(), tu.parse(text).sum(
                "prometheus_remote_storage_samples_total"))
        text = http_text(cls.fleet.central,
                         f"http://{CENTRAL_IP}:9090/metrics")
        out["central"] = (time.monotonic(), tu.parse(text).sum(
            "prometheus_tsdb_head_samples_appended_total"))
        return out

    @staticmethod
    def expectations(reports):
        """{(level, key...): value} of what the engines counted."""
        exp = {}

        def add(key, v):
            exp[key] = exp.get(key, 0) + v
        for (host, inst), r in reports.items():
            model = [m for i, m, *_ in HOSTS[host] if i == inst][0]
            for lvl, key in (("host_model", (host, model)),
                             ("model", (model,)), ("fleet", ())):
                add((lvl, "prompt_tokens") + key, r["prompt_tokens"])
                add((lvl, "generation_tokens") + key,
                    r["generation_tokens"])
                add((lvl, "requests") + key, r["requests"])
                for reason, n in r["finished"].items():
                    # The report names every reason (error too, since the
                    # engine's KV retries may end one so); the central
                    # figures keep the non-zero ones.
                    if n:
                        add((lvl, "finished", reason) + key, n)
                add((lvl, "ttft_count") + key, r["ttft_s"]["count"])
                add((lvl, "itl_count") + key, r["itl_s"]["count"])
        return exp

    @classmethod
    def central_figures(cls, via):
        """The same keys as expectations(), from the central Prometheus's
        fleet rules for one `via` (and its bucket inputs for the counts)."""
        f = cls.fleet
        got = {}
        levels = (("host_model", "fleet_host_model", ("host", "model_name")),
                  ("model", "fleet_model", ("model_name",)),
                  ("fleet", "fleet", ()))
        for lvl, rec, labels in levels:
            sel = f'{{via="{via}", metric_namespace="{NS}"}}'
            for name in ("prompt_tokens", "generation_tokens"):
                for k, v in values_by(f.query(f"{rec}:{name}_total:sum{sel}"),
                                      *labels).items():
                    got[(lvl, name) + k] = v
            res = f.query(f"{rec}:request_success_total:sum{sel}")
            for k, v in values_by(res, "finished_reason", *labels).items():
                if v:
                    got[(lvl, "finished", k[0]) + k[1:]] = v
                got[(lvl, "requests") + k[1:]] = \
                    got.get((lvl, "requests") + k[1:], 0) + v
        # TTFT and ITL counts: the +Inf bucket of each via's inputs.
        for hist, key in (("time_to_first_token_seconds", "ttft_count"),
                          ("inter_token_latency_seconds", "itl_count")):
            if via == "remote_write":
                src = (f'{{__name__="{NS}:{hist}_bucket", le="+Inf", '
                       'host!=""}')
            else:
                src = f'host_model:{hist}_bucket:sum{{le="+Inf", host!=""}}'
            for lvl, by in (("host_model", ("host", "model_name")),
                            ("model", ("model_name",)), ("fleet", ())):
                res = f.query(f"sum by ({', '.join(by)}) ({src})")
                for k, v in values_by(res, *by).items():
                    got[(lvl, key) + k] = v
        return got

    @classmethod
    def wait_delivered(cls):
        """Polls until both vias' fleet totals are final: equal to the
        engines' reports (or DEADLINE_S passes: the last mismatch is then
        the failure)."""
        last = {}

        def delivered():
            for via in VIAS:
                got = cls.central_figures(via)
                if got != cls.expected:
                    diff = {k: (got.get(k), v)
                            for k, v in cls.expected.items()
                            if got.get(k) != v}
                    extra = set(got) - set(cls.expected)
                    last[via] = (diff, extra)
                    return False
            return True
        t = time.monotonic()
        tu.poll_until(delivered, timeout=DEADLINE_S, interval=0.5,
                      what=f"fleet totals == engine reports (last: {last})")
        cls.delivery_s = time.monotonic() - t

    # ------------------------------------------------------------------
    def test_fleet_totals_equal_engine_reports(self):
        for via in VIAS:
            got = self.central_figures(via)
            self.assertEqual(got, self.expected, via)
        # Real traffic: every host and both models are in the figures.
        self.assertEqual({k[2] for k in self.expected
                          if k[:2] == ("host_model", "requests")}, set(HOSTS))
        self.assertEqual(self.expected[("fleet", "requests")],
                         100 * sum(len(e) for e in HOSTS.values()))

    def test_quantiles_come_from_summed_bucket_rates(self):
        """Each via's fleet_model p50/p99 rule, evaluated at one instant,
        equals histogram_quantile() of its input bucket rates summed here
        over hosts and engines; a mean of the hosts' quantiles would not
        (checked to differ where a model has several hosts)."""
        f = self.fleet
        # An instant whose samples have all arrived: the engines' end, once
        # both topologies have delivered samples 2 s younger of every
        # series the rules read (an agent's remote write sends series in
        # shards, so one series' sample says nothing of another's).
        at = self.engines_done

        def caught_up():
            exprs = ['min by (host) (timestamp(up{job="tokenmeter", '
                     'host!=""}))',
                     'min by (host) (timestamp(host_job:up:sum))']
            for hist in ("time_to_first_token_seconds",
                         "inter_token_latency_seconds"):
                exprs += [f'min by (host) (timestamp({NS}:{hist}_bucket'
                          '{host!=""}))',
                          f'min by (host) (timestamp(host_model:{hist}'
                          '_bucket:sum{host!=""}))']
            for expr in exprs:
                ts = values_by(f.query(expr), "host")
                if set(ts) != {(h,) for h in HOSTS} or \
                        min(ts.values()) < at + 2:
                    return False
            return True
        tu.poll_until(caught_up, timeout=30, interval=0.2,
                      what="samples after the engines' end delivered")
        with open(os.path.join(FLEET_DOCS, "fleet.rules.yml")) as fh:
            groups = yaml.safe_load(fh)["groups"]
        exprs = {(g["name"], r["record"]): r["expr"]
                 for g in groups for r in g["rules"]}
        mean_differs = []
        for hist in ("time_to_first_token_seconds",
                     "inter_token_latency_seconds"):
            # Each via's input bucket rates: the engine series, the
            # host-level sums.
            inputs = {
                "remote_write": f'{{__name__="{NS}:{hist}_bucket", '
                                'host!=""}',
                "federation": f'host_model:{hist}_bucket:sum{{host!=""}}'}
            for via, sel in inputs.items():
                fleet, hosts = {}, {}
                for r in f.query(f"rate({sel}[5m])", at):
                    m, v = r["metric"], float(r["value"][1])
                    le = float(m["le"])
                    b = fleet.setdefault(m["model_name"], {})
                    b[le] = b.get(le, 0.0) + v
                    b = hosts.setdefault((m["model_name"], m["host"]), {})
                    b[le] = b.get(le, 0.0) + v
                self.assertEqual(set(fleet), {"llama-a", "qwen-b"})
                for q, qv in (("p50", 0.5), ("p99", 0.99)):
                    group = f"tokenmeter-fleet-{via.replace('_', '-')}"
                    expr = exprs[(group, f"fleet_model:{hist}:{q}_5m")]
                    got = values_by(f.query(expr, at), "model_name")
                    self.assertEqual(set(got), {(m,) for m in fleet})
                    for (model,), v in got.items():
                        want = histogram_quantile(qv, fleet[model])
                        what = f"{via} {model} {hist} {q}"
                        self.assertTrue(math.isfinite(want), what)
                        self.assertAlmostEqual(
                            v, want, delta=1e-9 * max(1.0, abs(want)),
                            msg=what)
                        parts = [histogram_quantile(qv, b) for (m, _), b
                                 in hosts.items() if m == model]
                        # A merged quantile lies between its parts'.
                        self.assertTrue(min(parts) - 1e-12 <= v
                                        <= max(parts) + 1e-12, what)
                        if len(parts) > 1:
                            mean = sum(parts) / len(parts)
                            mean_differs.append(
                                abs(mean - v) > 1e-6 * abs(v))
                # The recorded series exist and are finite.
                for q in ("p50", "p99"):
                    res = f.query(f'fleet_model:{hist}:{q}_5m{{via="{via}"}}')
                    self.assertTrue(res and all(math.isfinite(float(
                        r["value"][1])) for r in res), (via, hist, q, res))
        self.assertTrue(mean_differs)
        self.assertTrue(any(mean_differs), "the hosts' quantiles are all "
                        "alike: this test could not tell a mean from them")

    def test_gauges_equal_the_daemons(self):
        f = self.fleet
        want_wait, want_run, want_kv = {}, {}, {}
        for host in HOSTS:
            s = f.scrape_daemon(host)
            for (name, labels), v in s.items():
                model = dict(labels).get("model_name")
                if name == f"{NS}:num_requests_waiting":
                    want_wait[model] = want_wait.get(model, 0) + v
                elif name == f"{NS}:num_requests_running":
                    want_run[model] = want_run.get(model, 0) + v
                elif name == f"{NS}:kv_cache_usage_perc":
                    want_kv.setdefault(model, []).append(v)
        self.assertEqual(set(want_kv), {"llama-a", "qwen-b"})
        for via in VIAS:
            sel = f'{{via="{via}"}}'

            def got(rec):
                return {k[0]: v for k, v in values_by(
                    f.query(f"fleet_model:{rec}{sel}"), "model_name").items()}
            self.assertEqual(got("num_requests_waiting:sum"), want_wait, via)
            self.assertEqual(got("num_requests_running:sum"), want_run, via)
            self.assertEqual(got("kv_cache_usage_perc:max"),
                             {m: max(v) for m, v in want_kv.items()}, via)
            for m, v in got("kv_cache_usage_perc:avg").items():
                self.assertAlmostEqual(v, sum(want_kv[m]) / len(want_kv[m]),
                                       places=12)
            # Every host's target is up, through either topology.
            up = values_by(f.query(f"fleet_job:up:sum{sel}"), "job")
            self.assertEqual(up, {("tokenmeter",): float(len(HOSTS))}, via)
            tok = values_by(f.query(f"fleet:generation_tokens:rate5m{sel}"),
                            "metric_namespace")
            self.assertGreater(tok[(NS,)], 0, via)

    def test_every_series_names_its_host_and_nothing_is_twice(self):
        f = self.fleet
        hosts = set(HOSTS)
        servers = {f"{f.addr[h]}:9090" for h in HOSTS}
        # With a host label: only our hosts.
        res = f.query('count by (host) ({__name__=~".+", host!=""})')
        self.assertEqual({r["metric"]["host"] for r in res}, hosts)
        # ... and on the engine series an `instance` that names the same
        # host (the scrape target is the host, not localhost).
        res = f.query('group by (host, instance) ({__name__=~"[^:]+:.+", '
                      '__name__!~"host_.+", job="tokenmeter", host!=""})')
        self.assertEqual({(r["metric"]["host"], r["metric"]["instance"])
                          for r in res},
                         {(h, f"{f.addr[h]}:10062") for h in HOSTS})
        # Without one: the fleet rules' aggregates, and the federation
        # job's own series, named by the host Prometheus's instance.
        for r in f.query('group by (__name__, job, instance, via) '
                         '({__name__=~".+", host=""})'):
            m = r["metric"]
            if m["__name__"].startswith(("fleet_model:", "fleet:",
                                         "fleet_job:")):
                self.assertIn(m.get("via"), VIAS, m)
            else:
                self.assertEqual(m.get("job"), "federate-tokenmeter", m)
                self.assertIn(m.get("instance"), servers, m)
        # Each via's inputs are only its own: the engine series came once
        # (remote-write; federation pulls none), the host-level ones once
        # (federation; the agents record none).
        engines = sum(len(e) for e in HOSTS.values())
        n = f.query(f'count({{__name__="{NS}:prompt_tokens_total"}})')
        self.assertEqual(float(n[0]["value"][1]), engines)
        n = f.query('count by (host) (host_model:prompt_tokens_total:sum)')
        self.assertEqual(values_by(n, "host"),
                         {(h,): 1.0 for h in HOSTS})
        # Every recorded fleet series once per via, never without one.
        res = f.query('count by (__name__, via) ({__name__=~"fleet.*:.+"})')
        names = {}
        for r in res:
            names.setdefault(r["metric"]["__name__"], set()).add(
                r["metric"].get("via", ""))
        self.assertGreater(len(names), 40)
        for name, vias in names.items():
            self.assertEqual(vias, set(VIAS), name)
        # And per (model, via), one series of each fleet_model total.
        res = f.query('count by (model_name, via) '
                      '(fleet_model:prompt_tokens_total:sum)')
        self.assertEqual(values_by(res, "model_name", "via"), {
            (m, v): 1.0 for m in ("llama-a", "qwen-b") for v in VIAS})

    def test_fleet_dashboard_panels_return_data(self):
        f = self.fleet
        with open(DASHBOARD) as fh:
            d = json.load(fh)
        variables = {v["name"]: v for v in d["templating"]["list"]}
        self.assertEqual(set(variables),
                         {"datasource", "via", "host", "model_name"})
        # The variable queries give the hosts and models.
        self.assertEqual({r["metric"]["host"] for r in f.query(
            'group by (host) (fleet_host_model:prompt_tokens_total:sum)')},
            set(HOSTS))
        targets = [(p["title"], t) for p in d["panels"]
                   for t in p.get("targets", [])]
        self.assertGreaterEqual(len(targets), 12)
        for via in VIAS:
            values = {"via": via, "host": ".*", "model_name": ".*",
                      "__rate_interval": "15s"}
            for title, t in targets:
                expr = re.sub(r"\$\{?(\w+)\}?",
                              lambda m: values[m.group(1)], t["expr"])
                res = f.query(expr)
                finite = [float(r["value"][1]) for r in res
                          if math.isfinite(float(r["value"][1]))]
                self.assertTrue(finite, f"{via}: {title}: {expr}: {res}")

    def test_zz_figures(self):
        """The figures of docs/user-guide.md section 9 (printed)."""
        f = self.fleet
        per_host = values_by(f.query('scrape_samples_scraped{job='
                                     '"tokenmeter", host!=""}'), "host")
        fed = values_by(f.query('count by (host) ({__name__=~"host_.+:.+"})'),
                        "host")
        buckets = values_by(f.query(
            'count by (host) ({__name__=~"[^:]+:.+_bucket", job="tokenmeter",'
            ' __name__!~"host_.+"})'), "host")
        # Samples sent by each agent, appended by the central Prometheus,
        # per second since the engines started.
        now = self.agents_sent()
        rate = {k: (now[k][1] - v) / (now[k][0] - t)
                for k, (t, v) in self.sent0.items()}
        self.assertTrue(all(r > 0 for r in rate.values()), rate)
        tsdb = http_json(f.central, f"http://{CENTRAL_IP}:9090/api/v1/"
                         "status/tsdb")["data"]["headStats"]
        self.assertGreater(tsdb["numSeries"], sum(per_host.values()))
        own = tu.parse(http_text(f.central,
                                 f"http://{CENTRAL_IP}:9090/metrics"))
        rss_mib = own.sum("process_resident_memory_bytes") / 2**20
        engines = {h: len(e) for h, e in HOSTS.items()}
        print("FIGURES: " + "; ".join(
            f"{h} ({engines[h]} engine{'s' if engines[h] > 1 else ''}): "
            f"{int(per_host[(h,)])} series scraped ({int(buckets[(h,)])} "
            f"histogram buckets), {int(fed[(h,)])} "
            f"federated, agent {rate[h]:.0f} samples/s sent"
            for h in HOSTS) +
            f"; scrape interval 1 s; central: {tsdb['numSeries']} head "
            f"series, {rate['central']:.0f} "
            f"samples/s appended, {rss_mib:.0f} MiB resident; "
            f"delivery {self.delivery_s:.1f} s after "
            f"the engines; setup+run {time.monotonic() - self.t0:.1f} s",
            flush=True)


def available():
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_SYS_ADMIN"
    if not shutil.which("ip"):
        return "no ip (iproute2)"
    if not os.path.exists(PROMETHEUS):
        return f"no {PROMETHEUS} (Debian's prometheus package)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    p = ip("netns", "add", probe, check=False)
    if p.returncode != 0:
        return f"ip netns add failed: {p.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


if __name__ == "__main__":
    if not tu.DAEMON or not tu.ENGINE:
        tu.skip("TOKENMETERD / TOKENMETER_ENGINE not set (meson test)")
    why = available()
    if why:
        tu.skip(why)
    signal.signal(signal.SIGTERM, on_sigterm)
    tu.main()
