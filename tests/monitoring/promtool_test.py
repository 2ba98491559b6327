#!/usr/bin/python3
"""promtool on the shipped Prometheus files (docs/prometheus/):
check config, check rules, the rule unit tests (tests/*.test.yml), and the
quick start's edit of prometheus.yml as docs/user-guide.md prints it.

Exits 77 (skipped) when promtool is not installed (Debian package
prometheus; scripts/install-deps.sh installs it).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("TOKENMETER_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(HERE)))
PROMTOOL = os.environ.get("PROMTOOL", "/usr/bin/promtool")
DOCS_PROM = os.path.join(SRC, "docs", "prometheus")
GUIDE = os.path.join(SRC, "docs", "user-guide.md")


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
        self.assertEqual(len(tests), 2, tests)
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


if __name__ == "__main__":
    if not os.access(PROMTOOL, os.X_OK):
        print(f"SKIP: {PROMTOOL} not installed (Debian package prometheus; "
              "scripts/install-deps.sh installs it)")
        sys.exit(77)
    prog = unittest.main(exit=False, verbosity=2)
    sys.exit(0 if prog.result.wasSuccessful() else 1)
