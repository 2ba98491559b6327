#!/usr/bin/python3
"""promtool on the shipped Prometheus files (docs/prometheus/):
check config, check rules, the rule unit tests (tests/*.test.yml), and the
quick start's edit of prometheus.yml as docs/user-guide.md prints it; and
promtool check metrics on a real daemon's /metrics in every naming profile,
whose only findings must be the ones docs/metrics.md keeps on purpose.

Exits 77 (skipped) when promtool is not installed (Debian package
prometheus; scripts/install-deps.sh installs it).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402
import profiles  # noqa: E402

SRC = os.environ.get("TOKENMETER_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(HERE)))
PROMTOOL = os.environ.get("PROMTOOL", "/usr/bin/promtool")
DOCS_PROM = os.path.join(SRC, "docs", "prometheus")
GUIDE = os.path.join(SRC, "docs", "user-guide.md")
METRICS_MD = os.path.join(SRC, "docs", "metrics.md")


def promtool(*args, cwd=DOCS_PROM):
    p = subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True,
                       text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def rule_files():
    return sorted(n for n in os.listdir(DOCS_PROM)
                  if n.endswith((".rules.yml", ".alerts.yml")))


class Promtool(unittest.TestCase):
    def test_check_config_prometheus_yml(self):
        rc, out = promtool("check", "config", "prometheus.yml")
        self.assertEqual(rc, 0, out)
        # Every rule file of the directory is loaded through the globs.
        self.assertIn(f"SUCCESS: {len(rule_files())} rule files found", out)

    def test_check_config_global_yml(self):
        rc, out = promtool("check", "config", "global.yml")
        self.assertEqual(rc, 0, out)

    def test_check_rules(self):
        for name in rule_files():
            rc, out = promtool("check", "rules", name)
            self.assertEqual(rc, 0, out)
            self.assertIn("SUCCESS", out)

    def test_rule_unit_tests(self):
        tests = sorted(os.path.join("tests", n)
                       for n in os.listdir(os.path.join(DOCS_PROM, "tests"))
                       if n.endswith(".test.yml"))
        self.assertEqual(len(tests), 1, tests)
        rc, out = promtool("test", "rules", *tests)
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.count("SUCCESS"), len(tests), out)

    def test_quick_start_edit_of_prometheus_yml(self):
        """The guide's sed turns the example into a one-host config."""
        with open(GUIDE) as f:
            guide = f.read()
        seds = re.findall(r"^sudo (sed -i .+ /etc/prometheus/prometheus\.yml)$",
                          guide, re.M)
        self.assertEqual(len(seds), 1, seds)
        tmp = tempfile.mkdtemp(prefix="tm-promtool-")
        try:
            for name in rule_files() + ["prometheus.yml"]:
                shutil.copy(os.path.join(DOCS_PROM, name), tmp)
            conf = os.path.join(tmp, "prometheus.yml")
            cmd = seds[0].replace("/etc/prometheus/prometheus.yml", conf)
            subprocess.run(cmd, shell=True, check=True)
            with open(conf) as f:
                text = f.read()
            self.assertNotIn("gpu-node", text)
            self.assertEqual(text.count("localhost:10062"), 1, text)
            rc, out = promtool("check", "config", conf, cwd=tmp)
            self.assertEqual(rc, 0, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_kubernetes_scrape_config_of_the_guide(self):
        with open(GUIDE) as f:
            guide = f.read()
        m = re.search(r"<!-- BEGIN k8s-scrape -->\n```yaml\n(.*?)```\n"
                      r"<!-- END k8s-scrape -->", guide, re.S)
        self.assertTrue(m, "k8s-scrape block not found in the guide")
        text = m.group(1)
        rc, out = self.check_config_text(text)
        if rc != 0 and "field kubernetes_sd_configs not found" in out:
            # Debian builds Prometheus without Kubernetes discovery; check
            # everything else with a static target in its place.
            text, n = re.subn(r"kubernetes_sd_configs:\n\s+- role: pod\n",
                              'static_configs: [{targets: ["pod:10062"]}]\n',
                              text)
            self.assertEqual(n, 1, text)
            rc, out = self.check_config_text(text)
        self.assertEqual(rc, 0, out)

    @staticmethod
    def check_config_text(text):
        with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
            f.write(text)
            f.flush()
            return promtool("check", "config", f.name)


# promtool check metrics findings that docs/metrics.md ("Names and
# labels") keeps on purpose, per profile: (metric name pattern, finding).
# REQUIRED ones must appear (the list stays true); ALLOWED may (what a
# newer promtool might add for a listed name).
COLON = "metric names should not contain ':'"
TOTAL = 'non-counter metrics should not have "_total" suffix'
HISTOGRAM = "metric name should not include type 'histogram'"
UNITS = "metric names should not contain abbreviated units"
REQUIRED = {
    "vllm": {("vllm:iteration_tokens_total", TOTAL)},
    "sglang": {("sglang:prompt_tokens_histogram", HISTOGRAM),
               ("sglang:generation_tokens_histogram", HISTOGRAM),
               # SGLang's KV-transfer histograms in ms and MB (protocol
               # 1.2; the feed sends KV_TRANSFER).
               ("sglang:kv_transfer_latency_ms", UNITS),
               ("sglang:kv_transfer_total_mb", UNITS)},
    "lmdeploy": {("lmdeploy:iteration_tokens_total", TOTAL)},
}
# LMDeploy's iter_token_latency, a histogram of seconds without a unit
# suffix, as LMDeploy names it: docs/metrics.md lists it, promtool 2.42
# does not report it.
ALLOWED = {"lmdeploy": {"lmdeploy:iter_token_latency"}}
FINDING = re.compile(r"^(\S+) (.+)$")


def one_request(t, rid, tenant, lora):
    """Events of one request from ARRIVED to FINISHED, and a STEP with
    every key, so that every family of every profile has samples; with
    the protocol 1.2 events whose families show only once sent (an
    admission rejection, a failed and a successful KV transfer, a SLEEP,
    STEP waiting_deferred)."""
    ms = 1_000_000
    kv = {"start": t + ms, "bytes": 100 * 131072, "blocks": 7,
          "connector": "nixl"}
    return [
        [9, t, "queue_full"],
        [1, t, rid, 100, {"max_tokens": 8, "n": 1, "lora": lora,
                          "labels": {"tenant": tenant}, "priority": 0}],
        [2, t, rid], [3, t + ms, rid, {"cached_tokens": 50,
                                       "external_tokens": 30}],
        [10, t + 2 * ms, rid, dict(kv, role="recv", ok=False,
                                   reason="timeout")],
        [10, t + 2 * ms, rid, dict(kv, role="recv")],
        [4, t + 2 * ms, rid, 1],
        [4, t + 3 * ms, rid, 2], [4, t + 4 * ms, rid, 1],
        [7, t + 4 * ms, {"running": 1, "waiting": 2, "waiting_deferred": 1,
                         "kv_usage": 0.5,
                         "prompt_tokens": 100, "generation_tokens": 4,
                         "prefix_queries": 100, "prefix_hits": 50,
                         "spec_drafts": 2, "spec_draft_tokens": 4,
                         "spec_accepted_tokens": 3,
                         "spec_accepted_per_pos": [2, 1]}],
        [11, t + 4 * ms, {"scheduler": "running", "weights": "resident",
                          "kv_cache": "resident"}],
        [5, t + 5 * ms, rid, "stop"],
    ]


class CheckMetrics(unittest.TestCase):
    """One daemon (--request-label tenant --legacy-names
    --moe-expert-series, so that every family of every profile is there)
    with an engine of each profile, each also sending EXPERT_LOAD."""

    @classmethod
    def setUpClass(cls):
        if not tu.DAEMON:
            raise unittest.SkipTest("TOKENMETERD not set (run through meson "
                                    "test)")
        cls.d = tu.Daemon("--log-interval", "0", "--request-label", "tenant",
                          "--legacy-names", "--moe-expert-series").start()
        try:
            hellos = [
                ("vllm", {"cache_config": {"block_size": 16,
                                           "num_gpu_blocks": 1024,
                                           "enable_prefix_caching": True},
                          "max_lora": 2}),
                ("sglang", {"cache_config": {"page_size": 1,
                                             "num_pages": 4096},
                            "max_lora": 2}),
                ("lmdeploy", {"profile": "lmdeploy",
                              "cache_config": {"block_size": 64}}),
            ]
            for engine, meta in hellos:
                s = cls.d.connect()
                s.sendall(tu.hello(engine, "m", **meta))
                t = time.monotonic_ns()
                events = one_request(t, 1, "acme", "sql")
                events.append([8, t, 0, [3, 1, 0, 0]])  # EXPERT_LOAD
                s.sendall(tu.batch(events))
                s.sendall(tu.frame(2))
                s.close()
            for ns, success in (("vllm", "request_success_total"),
                                ("sglang", "num_requests_total"),
                                ("lmdeploy", "request_success_total")):
                tu.poll_until(lambda: cls.d.samples().sum(
                    f"{ns}:{success}", tenant="acme") == 1,
                    what=f"{ns}'s request applied")
            cls.text = cls.d.metrics_text()
        except BaseException:
            cls.d.stop()
            cls.d.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()
        cls.d.cleanup()

    def test_every_profile_present(self):
        by_profile, _ = profiles.catalogs(METRICS_MD)
        for profile in profiles.PROFILES:
            names = {ln.split()[2] for ln in self.text.splitlines()
                     if ln.startswith(f"# TYPE {profile}:")}
            # The histograms, counters and gauges the profile lists, with
            # the --legacy-names ones (OpenMetrics-free text: counters
            # carry _total in # TYPE too).
            want = {n[:-len("_bucket")] if n.endswith("_bucket") else n
                    for n in by_profile[profile]
                    if not n.endswith(("_sum", "_count"))}
            self.assertEqual({n.split(":", 1)[1] for n in names}, want,
                             profile)

    def test_only_the_findings_the_catalog_keeps(self):
        p = subprocess.run([PROMTOOL, "check", "metrics"],
                           input=self.text.encode(), capture_output=True,
                           timeout=60)
        out = (p.stdout + p.stderr).decode()
        # 0: clean; 3: lint findings only. 1 would be a parse error.
        self.assertIn(p.returncode, (3,), out)
        found = {profile: set() for profile in profiles.PROFILES}
        colons = set()
        for line in out.splitlines():
            if not line.strip():
                continue
            m = FINDING.match(line)
            self.assertTrue(m, f"unexpected promtool output: {line!r}")
            name, finding = m.groups()
            ns = name.split(":", 1)[0]
            self.assertIn(ns, found, f"finding outside the profiles' "
                          f"series: {line!r}")
            if finding == COLON:
                colons.add(name)
                continue
            if name in ALLOWED.get(ns, ()):
                continue
            self.assertIn((name, finding), REQUIRED[ns],
                          f"unexpected promtool finding: {line!r}")
            found[ns].add((name, finding))
        self.assertEqual(found, REQUIRED)
        # Every engine family of every profile has the colon finding, and
        # nothing else (tokenmeter_*, process_*) has any.
        families = {ln.split()[2] for ln in self.text.splitlines()
                    if ln.startswith("# TYPE ") and ":" in ln.split()[2]}
        self.assertEqual(colons, families)


if __name__ == "__main__":
    if not os.access(PROMTOOL, os.X_OK):
        print(f"SKIP: {PROMTOOL} not installed (Debian package prometheus; "
              "scripts/install-deps.sh installs it)")
        sys.exit(77)
    prog = unittest.main(exit=False, verbosity=2)
    sys.exit(0 if prog.result.wasSuccessful() else 1)
