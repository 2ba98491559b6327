#!/usr/bin/python3
"""The wheel, as a user gets it: built from a clean checkout of the source
tree's HEAD (`git archive`, so nothing of a build folder or an uncommitted
file comes along) with `pip wheel --no-build-isolation --no-deps`,
installed with `pip install --no-index --no-deps` into a fresh
`python3 -m venv` (no system site packages), imported from another folder,
and used against a real tokenmeterd: the events reach /metrics.

Also checks what the wheel holds: the package, the extension (with
libtokenmeter linked in: no libtokenmeter.so beside it, none needed at run
time), the type hints, nothing outside the package; and the vLLM
stat-logger plugin's entry point, as vLLM's loader finds it in the venv.

    wheel_test.py SOURCE_DIR TOKENMETERD

Skips (exit 77) only when python3-mesonpy or python3-venv is missing, or
SOURCE_DIR is not a git checkout; scripts/install-deps.sh installs both.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

SRC = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ""
DAEMON = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else ""

# Run inside the venv, from a folder that is not the source tree.
USER_SCRIPT = r"""
import sys
from array import array
import tokenmeter
assert tokenmeter.backend == "native", tokenmeter.backend
print(tokenmeter.__file__)
print(tokenmeter.library_path)
with tokenmeter.Client(socket_path=sys.argv[1], engine="wheel",
                       model="m", instance="w0") as c:
    t0 = tokenmeter.now_ns() - 1_000_000_000
    for rid in (1, 2, 3):
        c.arrived(rid, 10, max_tokens=4, t_ns=t0)
        c.scheduled(rid, t_ns=t0 + 1_000_000)
    c.tokens_batch(array("Q", [1, 2, 3]), t_ns=t0 + 5_000_000)
    c.tokens_batch([1, 2, 3], n=[2, 2, 2], t_ns=t0 + 9_000_000)
    c.tokens(1, t_ns=t0 + 10_000_000)
    for rid in (1, 2, 3):
        c.finished(rid, "length", t_ns=t0 + 11_000_000)
    c.step(running=0, waiting=0, kv_usage=0.25)
    c.expert_load(0, array("Q", [5, 1]))
    stats = c.close()
print(stats.events_sent, stats.events_dropped, stats.events_rejected)
"""


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n"
                             f"{p.stdout}\n{p.stderr}")
    return p


def clean_env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TOKENMETER_LIBRARY",
                        "TOKENMETER_BACKEND", "LD_LIBRARY_PATH",
                        "LD_PRELOAD", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    env["PIP_NO_CACHE_DIR"] = "1"  # leave the user's pip cache alone
    return env


class Wheel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="tm-wheel-")
        tmp = cls.tmp.name
        env = clean_env()
        # A clean checkout: HEAD's files only.
        src = os.path.join(tmp, "src")
        os.mkdir(src)
        archive = subprocess.run(["git", "-C", SRC, "archive", "HEAD"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
        dist = os.path.join(tmp, "dist")
        run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation",
             "--no-deps", "--no-index", "-w", dist, src], env=env)
        wheels = glob.glob(os.path.join(dist, "tokenmeter-*.whl"))
        assert len(wheels) == 1, wheels
        cls.wheel = wheels[0]
        venv = os.path.join(tmp, "venv")
        run([sys.executable, "-m", "venv", venv], env=env)
        cls.python = os.path.join(venv, "bin", "python")
        run([cls.python, "-m", "pip", "install", "--no-index", "--no-deps",
             cls.wheel], env=env)
        cls.venv = venv
        cls.env = env

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_wheel_holds_the_package_and_the_extension(self):
        with zipfile.ZipFile(self.wheel) as z:
            names = z.namelist()
        outside = [n for n in names if not n.startswith(("tokenmeter/",
                                                         "tokenmeter-"))]
        self.assertEqual(outside, [])
        for f in ("__init__.py", "__init__.pyi", "py.typed", "client.py",
                  "_lib.py", "_common.py", "_native_client.py",
                  "integrations/__init__.py", "integrations/lmdeploy.py"):
            self.assertIn("tokenmeter/" + f, names)
        native = [n for n in names if n.startswith("tokenmeter/_native.")
                  and n.endswith(".so")]
        self.assertEqual(len(native), 1, names)
        self.assertFalse([n for n in names if "libtokenmeter" in n])
        self.assertRegex(os.path.basename(self.wheel),
                         r"^tokenmeter-\d+\.\d+\.\d+-cp3\d+-cp3\d+-linux_")

    def test_wheel_registers_the_vllm_plugin(self):
        # The entry point vLLM's loader reads (vllm/plugins/__init__.py:
        # importlib.metadata.entry_points(group="vllm.stat_logger_plugins")),
        # in the wheel's metadata and as the venv's Python finds it.
        with zipfile.ZipFile(self.wheel) as z:
            names = z.namelist()
            self.assertIn("tokenmeter/integrations/__init__.py", names)
            self.assertIn("tokenmeter/integrations/vllm.py", names)
            ep = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
            self.assertEqual(len(ep), 1, names)
            text = z.read(ep[0]).decode()
        self.assertIn("[vllm.stat_logger_plugins]", text)
        self.assertRegex(text, r"tokenmeter\s*=\s*tokenmeter\.integrations"
                               r"\.vllm:TokenmeterStatLogger")
        p = run([self.python, "-c",
                 "from importlib.metadata import entry_points; "
                 "print([(e.name, e.value) for e in "
                 "entry_points(group='vllm.stat_logger_plugins')])"],
                cwd=self.tmp.name, env=self.env)
        self.assertEqual(p.stdout.strip(), "[('tokenmeter', "
                         "'tokenmeter.integrations.vllm:TokenmeterStatLogger')]")

    def test_venv_has_no_system_site_packages(self):
        p = run([self.python, "-c",
                 "import sys; print(sys.prefix != sys.base_prefix); "
                 "import importlib.util as u; "
                 "print(u.find_spec('prometheus_client') is None)"],
                env=self.env)
        self.assertEqual(p.stdout.split(), ["True", "True"])

    def test_events_from_the_venv_reach_metrics(self):
        d = tu.Daemon("--log-interval", "0", binary=DAEMON).start()
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        elsewhere = os.path.join(self.tmp.name, "elsewhere")
        os.makedirs(elsewhere, exist_ok=True)
        p = run([self.python, "-c", USER_SCRIPT, d.sock], cwd=elsewhere,
                env=self.env)
        module, library, counts = p.stdout.strip().split("\n")
        self.assertTrue(module.startswith(self.venv + os.sep), module)
        self.assertTrue(library.startswith(self.venv + os.sep), library)
        self.assertEqual(counts.split(), ["18", "0", "0"])
        labels = {"model_name": "m", "engine": "w0"}
        d.wait_value("wheel:request_success_total", 3,
                     finished_reason="length", **labels)
        self.assertEqual(d.value("wheel:generation_tokens_total", **labels),
                         3 + 6 + 1)
        self.assertEqual(d.value("wheel:prompt_tokens_total", **labels), 30)
        self.assertEqual(
            d.value("wheel:time_to_first_token_seconds_count", **labels), 3)
        self.assertAlmostEqual(
            d.value("wheel:time_to_first_token_seconds_sum", **labels),
            3 * 0.005, delta=1e-12)
        self.assertEqual(d.value("wheel:kv_cache_usage_perc", **labels),
                         0.25)
        self.assertEqual(d.value("tokenmeter_ingest_events_total",
                                 kind="expert_load"), 1)
        self.assertEqual(
            d.samples().sum("tokenmeter_ingest_errors_total"), 0)

    def test_tokenmeter_sglang_console_script(self):
        # pyproject.toml's [project.scripts]: meson-python writes it into
        # entry_points.txt, pip makes the command.
        with zipfile.ZipFile(self.wheel) as z:
            names = z.namelist()
            (ep,) = [n for n in names if n.endswith("/entry_points.txt")]
            entry_points = z.read(ep).decode()
        self.assertIn("tokenmeter/integrations/sglang.py", names)
        self.assertIn("tokenmeter-sglang = tokenmeter.integrations.sglang:main",
                      entry_points)
        command = os.path.join(self.venv, "bin", "tokenmeter-sglang")
        self.assertIn("SGLang", run([command, "--help"],
                                    env=self.env).stdout)
        # One record of SGLang's file, through the installed command.
        d = tu.Daemon("--profile", "sglang", binary=DAEMON).start()
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        metrics = os.path.join(self.tmp.name, "sglang-metrics")
        os.makedirs(metrics, exist_ok=True)
        with open(os.path.join(
                metrics, "sglang-request-metrics-20261205_17.log"), "w") as f:
            f.write(SGLANG_LINE + "\n")
        run([command, "--once", "--model", "m", "--socket", d.sock, metrics],
            env=self.env)
        labels = {"model_name": "m", "engine": "0"}
        d.wait_value("sglang:num_requests_total", 1, **labels)
        self.assertEqual(d.value("sglang:generation_tokens_total", **labels),
                         7)
        self.assertAlmostEqual(
            d.value("sglang:time_to_first_token_seconds_sum", **labels),
            0.5 - 7 / 14.0, delta=1e-9)


# One record as SGLang's --export-metrics-to-file writes it (docs/
# integrations.md, "SGLang"): 7 tokens, decode_throughput 14/s, so its
# time to first token is 0.5 - 7 / 14 s.
SGLANG_LINE = json.dumps({
    "request_parameters": json.dumps({"rid": "r1", "text": "hi",
                                      "stream": False, "log_metrics": True}),
    "id": "r1", "finish_reason": {"type": "stop", "matched": 2},
    "prompt_tokens": 5, "weight_version": "default", "num_retractions": 0,
    "forward_entry_time": time.time() - 0.45, "queue_time": 0.01,
    "reasoning_tokens": 0, "completion_tokens": 7, "cached_tokens": 0,
    "e2e_latency": 0.5, "request_received_ts": time.time() - 0.5,
    "request_finished_ts": time.time(), "decode_throughput": 14.0})

if __name__ == "__main__":
    try:
        import mesonpy  # noqa: F401
    except ImportError:
        tu.skip("python3-mesonpy is not installed (scripts/install-deps.sh)")
    if subprocess.run([sys.executable, "-c", "import ensurepip, venv"],
                      capture_output=True).returncode != 0:
        tu.skip("python3-venv is not installed (scripts/install-deps.sh)")
    if subprocess.run(["git", "-C", SRC, "rev-parse", "HEAD"],
                      capture_output=True).returncode != 0:
        tu.skip(f"{SRC} is not a git checkout: no clean HEAD to build from")
    tu.main(sys.argv[:1])
