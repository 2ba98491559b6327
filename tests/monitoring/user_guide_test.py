#!/usr/bin/python3
"""docs/user-guide.md: its Python protocol example, run against the real
daemon, produces the series it promises; its links resolve; it names every
file of the monitoring stack; README.md links to it."""
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("TOKENMETER_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(HERE)))
GUIDE = os.path.join(SRC, "docs", "user-guide.md")
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402


def guide():
    with open(GUIDE) as f:
        return f.read()


class PythonExample(unittest.TestCase):
    def test_example_reports_one_request(self):
        m = re.search(r"<!-- BEGIN python-example -->\n```python\n(.*?)```\n"
                      r"<!-- END python-example -->", guide(), re.S)
        self.assertTrue(m, "python-example block not found")
        code = m.group(1)
        self.assertLessEqual(len(code.splitlines()), 40)
        with tu.Daemon("--log-interval", "0") as d, \
                tempfile.NamedTemporaryFile("w", suffix=".py") as f:
            f.write(code)
            f.flush()
            env = dict(os.environ, TOKENMETER_SOCKET=d.sock)
            p = subprocess.run(["/usr/bin/python3", f.name], env=env,
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, 0, p.stderr)
            labels = {"model_name": "my-model", "engine": "0"}
            d.wait_value("my_engine:request_success_total", 1,
                         finished_reason="length", **labels)
            self.assertEqual(d.value("my_engine:generation_tokens_total",
                                     **labels), 8)
            self.assertEqual(d.value("my_engine:prompt_tokens_total",
                                     **labels), 12)
            self.assertEqual(d.value(
                "my_engine:time_to_first_token_seconds_count", **labels), 1)
            self.assertEqual(d.value(
                "my_engine:inter_token_latency_seconds_count", **labels), 7)
            self.assertEqual(d.value("my_engine:kv_cache_usage_perc",
                                     **labels), 0.05)
            self.assertEqual(d.value("tokenmeter_ingest_errors_total",
                                     reason="bad_event"), 0)


class Links(unittest.TestCase):
    def test_relative_links_resolve(self):
        base = os.path.dirname(GUIDE)
        links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", guide())
        self.assertGreater(len(links), 10)
        for link in links:
            if re.match(r"[a-z]+://", link):
                continue
            self.assertTrue(os.path.exists(os.path.join(base, link)), link)

    def test_names_every_file_of_the_monitoring_stack(self):
        text = guide()
        docs = os.path.join(SRC, "docs")
        for sub in ("prometheus", "grafana"):
            for name in os.listdir(os.path.join(docs, sub)):
                if name == "tests":
                    self.assertIn(f"({sub}/tests/)", text)
                else:
                    self.assertIn(f"({sub}/{name})", text, name)

    def test_readme_links_the_guide(self):
        with open(os.path.join(SRC, "README.md")) as f:
            self.assertIn("(docs/user-guide.md)", f.read())


if __name__ == "__main__":
    if not tu.DAEMON:
        tu.skip("TOKENMETERD not set (run through meson test)")
    tu.main()
