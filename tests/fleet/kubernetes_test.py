#!/usr/bin/python3
"""The Kubernetes manifests of deploy/kubernetes/, checked with what Debian
has (no cluster): yamllint; every object's references (volumes, ports,
selectors, probe paths); every tokenmeterd and tokenmeter-engine flag they
use exists (--help and the man page); one socket path everywhere, the
client library's default; the PrometheusRule is the rule files; and the
daemon and the engine, run here with the manifests' own args (paths moved
into a temp dir), start, share the socket and count the engine's
requests."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

SRC = os.environ.get("TOKENMETER_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(HERE)))
K8S = os.path.join(SRC, "deploy", "kubernetes")
PROM = os.path.join(SRC, "docs", "prometheus")
ENGINE = os.environ.get("TOKENMETER_ENGINE", "")
MANIFESTS = ("namespace.yaml", "daemonset.yaml", "podmonitor.yaml",
             "sidecar.yaml", "servicemonitor.yaml", "prometheusrule.yaml")


def load(name):
    with open(os.path.join(K8S, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def objects():
    return {(d["kind"], d["metadata"]["name"]): d
            for name in MANIFESTS for d in load(name)}


def flag_names(text):
    return set(re.findall(r"--([a-z][a-z0-9-]*)", text))


def help_flags(binary):
    p = subprocess.run([binary, "--help"], capture_output=True, text=True,
                       timeout=30)
    return flag_names(p.stdout + p.stderr)


def args_flags(args):
    return {re.match(r"--([a-z][a-z0-9-]*)", a).group(1)
            for a in args if a.startswith("--")}


def arg_value(args, flag):
    for a in args:
        if a.startswith(f"--{flag}="):
            return a.split("=", 1)[1]
    raise AssertionError(f"no --{flag}=VALUE in {args}")


def default_socket():
    with open(os.path.join(SRC, "client_lib", "include", "tokenmeter",
                           "protocol.h")) as f:
        return re.search(r'#define TM_DEFAULT_SOCKET_PATH "([^"]+)"',
                         f.read()).group(1)


def project_version():
    with open(os.path.join(SRC, "meson.build")) as f:
        return re.search(r"version : '([^']+)'", f.read()).group(1)


def containers(workload):
    spec = workload["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec["containers"]}


def mount_of(container, path, pod_spec):
    """The (volume, mountPath) of `container` that holds `path`."""
    for m in container.get("volumeMounts", []):
        if path == m["mountPath"] or path.startswith(m["mountPath"] + "/"):
            (vol,) = [v for v in pod_spec["volumes"]
                      if v["name"] == m["name"]]
            return vol, m["mountPath"]
    raise AssertionError(f"{path} is on no volume of {container['name']}")


class Manifests(unittest.TestCase):
    def test_yamllint(self):
        if not shutil.which("yamllint"):
            self.skipTest("no yamllint (scripts/install-deps.sh installs it)")
        p = subprocess.run(["yamllint", "-f", "parsable", "-c",
                            os.path.join(K8S, ".yamllint"), K8S],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(p.stdout.strip(), "")

    def test_every_file_of_the_directory_is_known(self):
        names = {n for n in os.listdir(K8S) if n.endswith(".yaml")}
        self.assertEqual(names, set(MANIFESTS))
        # ... and installed (<datadir>/tokenmeter/kubernetes/).
        with open(os.path.join(SRC, "docs", "meson.build")) as f:
            installed = set(re.findall(r"'\.\./deploy/kubernetes/([^']+)'",
                                       f.read()))
        self.assertEqual(installed, set(MANIFESTS))
        kinds = sorted(k for k, _ in objects())
        self.assertEqual(kinds, sorted([
            "Namespace", "DaemonSet", "Deployment", "Deployment", "Service",
            "PodMonitor", "ServiceMonitor", "PrometheusRule"]))
        for (kind, name), d in objects().items():
            if kind != "Namespace":
                self.assertEqual(d["metadata"]["namespace"], "tokenmeter",
                                 name)

    def test_flags_exist(self):
        daemon = help_flags(tu.DAEMON)
        with open(os.path.join(SRC, "docs", "man", "tokenmeterd.8.scd")) as f:
            man = set(re.findall(r"^\*--([a-z0-9-]+)\*", f.read(), re.M))
        engine = help_flags(ENGINE)
        self.assertIn("state-dir", daemon)
        self.assertIn("metrics-socket", engine)
        seen = 0
        for (kind, name), d in objects().items():
            if kind not in ("DaemonSet", "Deployment"):
                continue
            spec = d["spec"]["template"]["spec"]
            for c in spec["containers"] + spec.get("initContainers", []):
                flags = args_flags(c.get("args", []))
                if c["name"] == "tokenmeterd":
                    self.assertLessEqual(flags, daemon, name)
                    self.assertLessEqual(flags, man, name)
                    seen += 1
                elif c["name"] == "engine":
                    self.assertEqual(c["command"], ["tokenmeter-engine"])
                    self.assertLessEqual(flags, engine, name)
                    seen += 1
                # The images are of this version.
                self.assertTrue(c["image"].endswith(":" + project_version()),
                                c["image"])
        self.assertEqual(seen, 4)

    def test_one_socket_path_on_a_shared_volume(self):
        objs = objects()
        sock = default_socket()
        ds = objs[("DaemonSet", "tokenmeterd")]
        side = objs[("Deployment", "llama-3-8b")]
        node_engine = objs[("Deployment", "engine-example")]
        d_spec = ds["spec"]["template"]["spec"]
        daemon = containers(ds)["tokenmeterd"]
        self.assertEqual(arg_value(daemon["args"], "ingest"), sock)
        # DaemonSet: the socket's directory is a hostPath, and the engine
        # pod mounts that same host directory at the same place.
        vol, mp = mount_of(daemon, sock, d_spec)
        self.assertEqual(mp, os.path.dirname(sock))
        host_dir = vol["hostPath"]["path"]
        engine = containers(node_engine)["engine"]
        self.assertEqual(arg_value(engine["args"], "metrics-socket"), sock)
        evol, emp = mount_of(engine, sock, node_engine["spec"]["template"][
            "spec"])
        self.assertEqual((evol["hostPath"]["path"], emp), (host_dir, mp))
        # The init container prepares that directory and the state dir.
        (init,) = d_spec["initContainers"]
        state = arg_value(daemon["args"], "state-dir")
        svol, _ = mount_of(daemon, state, d_spec)
        self.assertIn("hostPath", svol)
        self.assertLessEqual({mp, state}, set(init["command"]))
        for path in (mp, state):
            self.assertEqual(mount_of(init, path, d_spec)[0],
                             mount_of(daemon, path, d_spec)[0])
        # Sidecar: one emptyDir shared by engine and daemon.
        s_spec = side["spec"]["template"]["spec"]
        sd, se = containers(side)["tokenmeterd"], containers(side)["engine"]
        self.assertEqual(arg_value(sd["args"], "ingest"), sock)
        self.assertEqual(arg_value(se["args"], "metrics-socket"), sock)
        a, b = mount_of(sd, sock, s_spec), mount_of(se, sock, s_spec)
        self.assertEqual(a, b)
        self.assertIn("emptyDir", a[0])
        # The group that may open the 0660 socket: the same everywhere.
        for spec in (d_spec, s_spec,
                     node_engine["spec"]["template"]["spec"]):
            self.assertEqual(spec["securityContext"]["runAsGroup"], 1000)

    def test_ports_probes_and_selectors(self):
        objs = objects()
        for wl in (objs[("DaemonSet", "tokenmeterd")],
                   objs[("Deployment", "llama-3-8b")]):
            d = containers(wl)["tokenmeterd"]
            port = int(arg_value(d["args"], "listen").rpartition(":")[2])
            (p,) = d["ports"]
            self.assertEqual((p["name"], p["containerPort"]),
                             ("tm-metrics", port))
            for probe in ("readinessProbe", "livenessProbe"):
                self.assertEqual(d[probe]["httpGet"],
                                 {"path": "/healthz", "port": "tm-metrics"})
            labels = wl["spec"]["template"]["metadata"]["labels"]
            self.assertLessEqual(
                wl["spec"]["selector"]["matchLabels"].items(), labels.items())
        ds = objs[("DaemonSet", "tokenmeterd")]
        pm = objs[("PodMonitor", "tokenmeterd")]
        self.assertLessEqual(pm["spec"]["selector"]["matchLabels"].items(),
                             ds["spec"]["template"]["metadata"][
                                 "labels"].items())
        svc = objs[("Service", "llama-3-8b-metrics")]
        side = objs[("Deployment", "llama-3-8b")]
        self.assertLessEqual(svc["spec"]["selector"].items(),
                             side["spec"]["template"]["metadata"][
                                 "labels"].items())
        (sp,) = svc["spec"]["ports"]
        self.assertEqual(sp["targetPort"], "tm-metrics")
        sm = objs[("ServiceMonitor", "tokenmeterd-sidecars")]
        self.assertLessEqual(sm["spec"]["selector"]["matchLabels"].items(),
                             svc["metadata"]["labels"].items())
        # Both monitors: the port by name, the host label, the job the
        # rules and alerts expect, and prometheus.yml's metric relabelling.
        with open(os.path.join(PROM, "prometheus.yml")) as f:
            (mrc,) = yaml.safe_load(f)["scrape_configs"][0][
                "metric_relabel_configs"]
        want_mr = {"sourceLabels": mrc["source_labels"],
                   "regex": mrc["regex"],
                   "targetLabel": mrc["target_label"],
                   "replacement": mrc["replacement"]}
        for ep, source in ((pm["spec"]["podMetricsEndpoints"],
                            "__meta_kubernetes_pod_node_name"),
                           (sm["spec"]["endpoints"],
                            "__meta_kubernetes_pod_name")):
            (ep,) = ep
            self.assertEqual((ep["port"], ep["path"]),
                             ("tm-metrics", "/metrics"))
            self.assertIn({"sourceLabels": [source], "targetLabel": "host"},
                          ep["relabelings"])
            self.assertIn({"targetLabel": "job", "replacement": "tokenmeter"},
                          ep["relabelings"])
            self.assertEqual(ep["metricRelabelings"], [want_mr])

    def test_prometheusrule_is_the_rule_files(self):
        gen = os.path.join(K8S, "generate-prometheusrule.py")
        p = subprocess.run(["/usr/bin/python3", gen, "--check"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        (rule,) = load("prometheusrule.yaml")
        groups = []
        for name in ("tokenmeter.rules.yml", "tokenmeter.alerts.yml",
                     "fleet/fleet.rules.yml"):
            with open(os.path.join(PROM, name)) as f:
                groups += yaml.safe_load(f)["groups"]
        self.assertEqual(rule["spec"]["groups"], groups)
        self.assertGreater(sum(len(g["rules"]) for g in groups), 100)

    def test_daemon_and_engine_run_with_the_manifest_args(self):
        objs = objects()
        sock = default_socket()
        for wl, engine_wl in ((("DaemonSet", "tokenmeterd"),
                               ("Deployment", "engine-example")),
                              (("Deployment", "llama-3-8b"),
                               ("Deployment", "llama-3-8b"))):
            with self.subTest(wl):
                self._run(containers(objs[wl])["tokenmeterd"]["args"],
                          containers(objs[engine_wl])["engine"]["args"],
                          sock)

    def _run(self, daemon_args, engine_args, sock):
        tmp = tempfile.mkdtemp(prefix="tm-k8s-", dir="/tmp")
        self.addCleanup(shutil.rmtree, tmp, True)

        def move(a):
            # /run/tokenmeter, /var/lib/tokenmeter -> the temp dir; the
            # port -> a free one.
            a = re.sub(r"=/(run|var/lib)/tokenmeter",
                       lambda m: f"={tmp}/{m.group(1).replace('/', '-')}", a)
            return "--listen=127.0.0.1:0" if a.startswith("--listen=") else a
        args = [move(a) for a in daemon_args]
        for a in args:
            if a.startswith(("--ingest=", "--state-dir=")):
                os.makedirs(os.path.dirname(a.split("=", 1)[1])
                            if a.startswith("--ingest=")
                            else a.split("=", 1)[1], exist_ok=True)
        d = tu.Daemon(*args, ingest=None, listen=None)
        self.addCleanup(d.cleanup)
        d.start()
        self.assertEqual(d.sock, move("=" + sock)[1:])
        status, _, body = d.get("/healthz")
        self.assertEqual(status, 200, body)
        # The engine's own args, but a workload of 5 requests at once.
        eargs = [move(a) for a in engine_args
                 if not a.startswith(("--requests=", "--rate="))]
        # The socket is among the manifest's args; a non-zero exit fails.
        engine = tu.Engine(*eargs, "--requests=5", "--rate=0",
                           "--backend=cpu", "--quiet", report=None, dir=tmp)
        self.addCleanup(engine.cleanup)
        engine.start().wait(timeout=60)
        model = arg_value(engine_args, "model")
        tu.poll_until(lambda: d.samples().sum(
            "tokenmeter_engine:request_success_total", model_name=model) == 5,
            timeout=10, what="the engine's 5 requests counted")
        self.assertEqual(d.stop(), 0)
        if any(a.startswith("--state-dir=") for a in args):
            state = [a.split("=", 1)[1] for a in args
                     if a.startswith("--state-dir=")][0]
            self.assertTrue(os.listdir(state), "no snapshot in --state-dir")


if __name__ == "__main__":
    if not tu.DAEMON or not ENGINE:
        tu.skip("TOKENMETERD / TOKENMETER_ENGINE not set (meson test)")
    tu.main()
