#!/usr/bin/python3
"""--web-config proven on a live Prometheus: TLS and basic auth.

A self-signed certificate (openssl req) and a bcrypt hash (htpasswd -nbBC
10) are made in a temp dir; tokenmeterd starts with a web configuration
file naming them (relative paths). Debian's /usr/bin/prometheus (2.42)
scrapes it with `scheme: https`, `tls_config: {ca_file, server_name}` and
`basic_auth`; through Prometheus's HTTP API `up` must be 1 for that job and
0 (HTTP 401) for a job with the wrong password, and the scraped metrics
must be queryable. Direct requests check 401 + WWW-Authenticate on every
path (/healthz included) and that plain HTTP gets no answer. Bad files
(YAML error, unknown key, missing cert, a password that is not a bcrypt
hash) must stop the daemon at start-up with one line on stderr.

Exits 77 (skipped) when prometheus, openssl or htpasswd is not installed
(scripts/install-deps.sh installs them).
"""
import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

PROMETHEUS = os.environ.get("PROMETHEUS", "/usr/bin/prometheus")
DAEMON = os.environ.get("TOKENMETERD", "")
USER = "prometheus"
PASSWORD = "s3cret-scrape-pw"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_cert(d):
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
         "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
         "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", os.path.join(d, "server.key"),
         "-out", os.path.join(d, "server.crt")],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_hash(password):
    out = subprocess.run(["htpasswd", "-nbBC", "10", USER, password],
                         check=True, capture_output=True, text=True).stdout
    user, _, h = out.strip().partition(":")
    assert user == USER and h.startswith("$2y$10$"), out
    return h


class WebConfigBase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for tool in ("openssl", "htpasswd"):
            if shutil.which(tool) is None:
                raise unittest.SkipTest(f"{tool} not installed")
        cls.dir = tempfile.mkdtemp(prefix="tm-https-", dir="/tmp")
        make_cert(cls.dir)
        cls.hash = make_hash(PASSWORD)
        cls.ca = os.path.join(cls.dir, "server.crt")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def write(cls, name, text):
        path = os.path.join(cls.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    @classmethod
    def good_config(cls):
        return cls.write("web.yml", (
            "tls_server_config:\n"
            "  cert_file: server.crt\n"
            "  key_file: server.key\n"
            "basic_auth_users:\n"
            f"  {USER}: {cls.hash}\n"))


class StartupErrors(WebConfigBase):
    @staticmethod
    def run_daemon(web_config):
        """Runs the daemon with --web-config web_config until it exits."""
        d = tempfile.mkdtemp(prefix="tm-", dir="/tmp")
        try:
            return subprocess.run(
                [DAEMON, "--ingest", os.path.join(d, "i.sock"), "--listen",
                 "127.0.0.1:0", "--web-config", web_config],
                capture_output=True, text=True, timeout=30)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def start_fails(self, text):
        path = self.write("bad.yml", text)
        r = self.run_daemon(path)
        self.assertNotEqual(r.returncode, 0, r.stderr)
        lines = [ln for ln in r.stderr.splitlines()
                 if ln.startswith("tokenmeterd:")]
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn(f'--web-config "{path}"', lines[0])
        return lines[0]

    def test_yaml_error(self):
        self.assertIn("YAML error at line 3",
                      self.start_fails("tls_server_config:\n  cert_file: [x\n"))

    def test_unknown_key(self):
        self.assertIn('unknown or unsupported key "tls_config"',
                      self.start_fails("tls_config:\n  cert_file: a\n"))

    def test_missing_cert(self):
        line = self.start_fails("tls_server_config:\n  cert_file: gone.crt\n"
                                "  key_file: server.key\n")
        self.assertIn("cannot read cert_file", line)
        self.assertIn(os.path.join(self.dir, "gone.crt"), line)

    def test_password_not_a_bcrypt_hash(self):
        self.assertIn("not a bcrypt hash", self.start_fails(
            f"basic_auth_users:\n  {USER}: {PASSWORD}\n"))

    def test_missing_file(self):
        r = self.run_daemon(os.path.join(self.dir, "absent.yml"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("cannot read the file: No such file or directory",
                      r.stderr)


class HttpsScrape(WebConfigBase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not os.access(PROMETHEUS, os.X_OK):
            raise unittest.SkipTest(f"{PROMETHEUS} not installed")
        cls.daemon = tu.Daemon("--log-interval", "0", "--web-config",
                               cls.good_config(), binary=DAEMON)
        cls.daemon.start()
        cls.prom = None
        cls.start_prometheus()

    @classmethod
    def tearDownClass(cls):
        tu.stop_process(cls.prom)
        cls.daemon.stop()
        cls.daemon.cleanup()
        super().tearDownClass()

    @classmethod
    def start_prometheus(cls):
        target = f"127.0.0.1:{cls.daemon.port}"
        for attempt in range(3):
            cls.prom_port = free_port()
            pdir = os.path.join(cls.dir, f"prom{attempt}")
            os.makedirs(pdir)
            jobs = []
            for job, pw in (("tokenmeter", PASSWORD),
                            ("wrong_password", PASSWORD + "x")):
                jobs.append({
                    "job_name": job,
                    "scheme": "https",
                    "tls_config": {"ca_file": cls.ca,
                                   "server_name": "localhost"},
                    "basic_auth": {"username": USER, "password": pw},
                    "static_configs": [{"targets": [target]}],
                })
            conf = {"global": {"scrape_interval": "1s",
                               "scrape_timeout": "1s"},
                    "scrape_configs": jobs}
            with open(os.path.join(pdir, "prometheus.yml"), "w") as f:
                json.dump(conf, f)  # JSON is YAML
            cls.prom, cls.prom_log = tu.start_prometheus(
                PROMETHEUS, pdir, cls.prom_port)
            if cls.wait_ready():
                return
            cls.prom.kill()
            cls.prom.wait()
        raise AssertionError("prometheus did not start: " + cls.prom_tail())

    @classmethod
    def prom_tail(cls):
        with open(cls.prom_log, errors="replace") as f:
            return f.read()[-3000:]

    @classmethod
    def wait_ready(cls):
        return tu.wait_prometheus_ready(cls.prom, cls.prom_port)

    def api(self, path, params=None):
        url = f"http://127.0.0.1:{self.prom_port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())

    def query(self, expr):
        data = self.api("/api/v1/query", {"query": expr})["data"]["result"]
        return {r["metric"].get("job", ""): float(r["value"][1])
                for r in data}

    def https_get(self, path, auth=None):
        ctx = ssl.create_default_context(cafile=self.ca)
        req = urllib.request.Request(
            f"https://localhost:{self.daemon.port}{path}")
        if auth is not None:
            req.add_header("Authorization", "Basic " + base64.b64encode(
                auth.encode()).decode())
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def test_prometheus_scrapes_over_https_with_basic_auth(self):
        def up():
            v = self.query("up")
            return v if v.get("tokenmeter") == 1.0 and \
                v.get("wrong_password") == 0.0 else None
        try:
            tu.poll_until(up, timeout=60, interval=0.5,
                          what="up == 1 (tokenmeter), 0 (wrong_password)")
        except AssertionError:
            raise AssertionError(
                json.dumps(self.api("/api/v1/targets"))[:3000] +
                self.prom_tail())
        targets = self.api("/api/v1/targets")["data"]["activeTargets"]
        wrong = [t for t in targets
                 if t["labels"]["job"] == "wrong_password"][0]
        self.assertIn("401", wrong["lastError"])
        # The metrics came through: the daemon's own counters, including
        # the 401s it gave the wrong-password job.
        tu.poll_until(lambda: self.query(
            'tokenmeter_http_responses_total{code="401"} > 0')
            .get("tokenmeter"), timeout=30, interval=0.5,
            what="the 401 count scraped over https")
        self.assertIn("tokenmeter", self.query("process_open_fds"))

    def test_every_path_needs_credentials(self):
        for path in ("/metrics", "/healthz", "/nope"):
            status, headers, _ = self.https_get(path)
            self.assertEqual(status, 401, path)
            self.assertTrue(headers.get("WWW-Authenticate", "")
                            .startswith("Basic"), headers)
            status, _, _ = self.https_get(path, f"{USER}:wrong")
            self.assertEqual(status, 401, path)
        status, _, body = self.https_get("/metrics", f"{USER}:{PASSWORD}")
        self.assertEqual(status, 200)
        self.assertIn(b"tokenmeter_build_info", body)
        self.assertEqual(self.https_get("/healthz", f"{USER}:{PASSWORD}")[0],
                         200)

    def test_plain_http_gets_400_and_no_metrics(self):
        with socket.create_connection(("127.0.0.1", self.daemon.port),
                                      timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            try:
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    got += chunk
            except ConnectionResetError:
                pass
        self.assertNotIn(b"tokenmeter_", got)
        self.assertTrue(got.startswith(b"HTTP/1.1 400 "), got)
        self.assertIn(b"HTTP request to an HTTPS server", got)


if __name__ == "__main__":
    if not DAEMON:
        tu.skip("TOKENMETERD not set")
    tu.main()
