#!/usr/bin/python3
"""The live page (`/`) and its data (/api/v1/live), on a real daemon.

* LiveApi: the HTTP answers of both routes (content types, HEAD, query
  strings ignored as on /metrics, 404 for near paths, 405 with Allow for
  other methods) and the JSON's shape. No browser needed.
* LivePage: two reference engines feed one daemon while Debian's headless
  Chromium, driven over the DevTools protocol on a pipe
  (--remote-debugging-pipe: no extra Python package), shows the page; a
  third series (Feed12: a protocol 1.2 gateway that only rejects requests
  and reports deferred waiting) is fed from here. The DOM must hold a panel
  per engine series with six drawn charts and the 1.2 charts its history
  has data for (eight for the gateway: waiting by reason and rejections;
  a reference engine's STEP waiting_deferred, when it sends it), and every
  figure the page shows (the panel's "now" values and the summary table at
  the top) must equal /api/v1/live's history at the point in time the page
  says it shows (data-t): points never change once made, so the comparison
  does not race the feed. Every request the page makes goes to the daemon
  itself. After a reload the charts hold at least the points they held
  before (the history is the daemon's). A phone-sized viewport must not
  scroll sideways. Screenshots: live_page.png and live_page_phone.png in
  $LIVE_PAGE_SCREENSHOT_DIR (the build directory under meson).
* RequestView: the request view (api/v1/requests as waterfalls) on a
  daemon fed hand-written frames: rows equal to the API, each waterfall
  drew every phase and token tick. Screenshot: live_page_requests.png.
* LivePageAuth: the same page behind --web-config with TLS and basic auth;
  the browser answers the 401 challenge as a user would (Fetch.authRequired),
  and the page's own requests then carry the credentials.

Usage: live_page_test.py TOKENMETERD CLASS [unittest args]. Needs
TOKENMETER_ENGINE (the reference engine) for LivePage*. Exits 77 (skipped)
only when chromium is not installed (scripts/install-deps.sh installs it),
or, for LivePageAuth, when openssl or htpasswd is not.
"""
import base64
import decimal
import http.server
import json
import os
import select
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
sys.path.insert(0, os.path.join(HERE, "..", "monitoring"))
import tokenmeter_testutil as tu  # noqa: E402
from https_prometheus_test import USER, make_cert, make_hash  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SHOT_DIR = os.environ.get("LIVE_PAGE_SCREENSHOT_DIR", "")
PASSWORD = "live-page-pw"
KEYS = ["running", "waiting", "kv_usage", "prompt_tokens_per_s",
        "generation_tokens_per_s", "preemptions_per_s",
        "prefix_cache_hit_rate", "ttft_p50_s", "ttft_p99_s", "itl_p50_s",
        "itl_p99_s", "e2e_p50_s", "e2e_p99_s", "admission_rejections_per_s",
        "waiting_capacity", "waiting_deferred"]
# The protocol 1.2 keys: null for a series that never sent their events,
# and their charts (page.html's optional ones) shown only for one that did.
KEYS_12 = {"admission_rejections_per_s", "waiting_capacity",
           "waiting_deferred"}
CHARTS = ["Time to first token", "Inter-token latency", "End-to-end latency",
          "Tokens/s", "Requests", "KV cache usage"]
CHARTS_12 = ["Time to first token", "Inter-token latency",
             "End-to-end latency", "Tokens/s", "Requests", "Waiting by reason",
             "Admission rejections/s", "KV cache usage"]
OPTIONAL_CHARTS = {"Waiting by reason": ["waiting_capacity",
                                         "waiting_deferred"],
                   "Admission rejections/s": ["admission_rejections_per_s"]}


def stopped_cleanly(d):
    """Stops the daemon; a non-zero exit (a sanitizer's report, a handle
    left open) fails the class, with the log."""
    rc = d.stop()
    log = d.read_log().decode(errors="replace")
    d.cleanup()
    if rc != 0:
        raise AssertionError(f"tokenmeterd exited {rc}: {log[-3000:]}")


class LiveApi(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = tu.Daemon("--log-interval", "0").start()

    @classmethod
    def tearDownClass(cls):
        stopped_cleanly(cls.d)

    def test_page_is_html(self):
        status, headers, body = self.d.get("/")
        self.assertEqual(status, 200)
        self.assertEqual(headers["Content-Type"], "text/html; charset=utf-8")
        self.assertTrue(body.startswith(b"<!doctype html>"))
        # The browser itself refuses anything from elsewhere.
        self.assertEqual(headers["Content-Security-Policy"],
                         "default-src 'none'; script-src 'unsafe-inline'; "
                         "style-src 'unsafe-inline'; connect-src 'self'; "
                         "base-uri 'none'; form-action 'none'; "
                         "frame-ancestors 'none'")
        self.assertNotIn(b"http://", body)
        self.assertNotIn(b"https://", body)

    def test_json_without_series(self):
        with tu.Daemon("--log-interval", "0") as d:
            status, headers, body = d.get("/api/v1/live")
        self.assertEqual(status, 200)
        self.assertEqual(headers["Content-Type"],
                         "application/json; charset=utf-8")
        self.assertEqual(headers["Cache-Control"], "no-store")
        self.assertEqual(json.loads(body), {
            "series": [], "points_max": 900, "series_max": 64,
            "series_unfollowed": 0})

    def test_json_of_a_series_grows_a_point_a_second(self):
        s = self.d.connect()
        s.sendall(tu.hello(instance="api", labels={"team": "a\"b"}))
        t0 = time.monotonic_ns() - 1_000_000
        s.sendall(tu.batch([[1, t0, 1, 10], [4, t0 + 500_000, 1, 1]]))

        def doc():
            data = json.loads(self.d.get("/api/v1/live")[2])
            mine = [x for x in data["series"] if x["engine"] == "api"]
            return mine[0] if mine and len(mine[0]["history"]["t"]) >= 3 \
                else None
        x = tu.poll_until(doc, timeout=10, what="three points")
        self.assertEqual(x["engine_family"], "vllm")
        self.assertEqual(x["model_name"], "m")
        self.assertEqual(x["labels"], {"team": "a\"b"})
        h = x["history"]
        self.assertEqual(set(h), {"t", *KEYS})
        self.assertEqual(set(x["now"]), {"t", *KEYS})
        for k in h:
            self.assertEqual(len(h[k]), len(h["t"]), k)
            self.assertEqual(x["now"][k], h[k][-1], k)
        self.assertEqual(h["t"], sorted(set(h["t"])))
        self.assertLess(abs(h["t"][-1] - time.time()), 5)
        # The prompt's 10 tokens and the TTFT of 0.5 ms in some second.
        self.assertAlmostEqual(sum(h["prompt_tokens_per_s"]), 10, delta=0.5)
        # TTFT 0.5 ms, alone in (0, 0.001]: p50 0.0005, p99 0.00099.
        self.assertIn(0.0005, h["ttft_p50_s"])
        self.assertIn(0.00099, h["ttft_p99_s"])
        # No protocol 1.2 event: those keys are null throughout.
        for k in KEYS_12:
            self.assertEqual(set(h[k]), {None}, k)
        s.close()

    def test_json_of_rejections_and_waiting_by_reason(self):
        """ADMISSION_REJECTED and STEP waiting_deferred: the rejections of
        each second, and the waiting requests by reason at each point; null
        before the first of them."""
        s = self.d.connect()
        s.sendall(tu.hello(instance="gw"))
        s.sendall(tu.batch([[7, time.monotonic_ns(), {"waiting": 1}]]))

        def doc(n):
            data = json.loads(self.d.get("/api/v1/live")[2])
            mine = [x for x in data["series"] if x["engine"] == "gw"]
            return mine[0] if mine and len(mine[0]["history"]["t"]) >= n \
                else None
        x = tu.poll_until(lambda: doc(1), timeout=10, what="a first point")
        self.assertEqual(x["now"]["waiting"], 1)
        for k in KEYS_12:
            self.assertIsNone(x["now"][k], k)
        n = len(x["history"]["t"])
        t = time.monotonic_ns()
        s.sendall(tu.batch([
            [9, t, "queue_full"], [9, t, "queue_full", 17],
            [9, t, "token_cap"],
            [7, t, {"running": 2, "waiting": 5, "waiting_deferred": 2}]],
            seq=1))
        def after():
            # A point after the first one that holds the events (their
            # STEP's waiting 5 comes with or after their rejections).
            d = doc(n)
            w = d["history"]["waiting"] if d else []
            return d if 5 in w[:-1] else None
        x = tu.poll_until(after, timeout=10,
                          what="a point after the 1.2 events")
        h = x["history"]
        rejected = [v for v in h["admission_rejections_per_s"] if v]
        # Three rejections within one tick: one point of 3 over the time
        # since the tick before (about a second; later on a loaded machine).
        self.assertEqual(len(rejected), 1, h["admission_rejections_per_s"])
        self.assertTrue(1 < rejected[0] <= 3.5, rejected)
        self.assertEqual(x["now"]["admission_rejections_per_s"], 0)
        self.assertEqual((x["now"]["waiting_capacity"],
                          x["now"]["waiting_deferred"]), (3, 2))
        # Null up to the first point after the events, numbers from then on.
        for k in KEYS_12:
            first = next(i for i, v in enumerate(h[k]) if v is not None)
            self.assertGreaterEqual(first, n, k)
            self.assertNotIn(None, h[k][first:], k)
        s.close()

    def test_head_sends_no_body(self):
        for path in ("/", "/api/v1/live"):
            status, headers, body = self.d.get(path, method="HEAD")
            self.assertEqual(status, 200, path)
            self.assertEqual(body, b"", path)
            self.assertGreater(int(headers["Content-Length"]), 0, path)

    def test_query_string_is_ignored_as_on_metrics(self):
        for path in ("/?x=1", "/api/v1/live?since=abc&x", "/api/v1/live?"):
            self.assertEqual(self.d.get(path)[0], 200, path)

    def test_near_paths_are_not_found(self):
        for path in ("/api/v1/live/", "/api/v1/livex", "/api/v1", "/api/",
                     "/index.html", "/api/v1/LIVE", "//"):
            status, _, body = self.d.get(path)
            self.assertEqual(status, 404, path)
            self.assertEqual(body, b"404 page not found\n", path)

    def test_other_methods_get_405_with_allow(self):
        for path in ("/", "/api/v1/live"):
            for method in ("POST", "PUT", "DELETE", "OPTIONS", "PATCH"):
                status, headers, _ = self.d.get(path, method=method)
                self.assertEqual(status, 405, (path, method))
                self.assertEqual(headers["Allow"], "GET, HEAD")


class Cdp:
    """The DevTools protocol over --remote-debugging-pipe: JSON messages
    ending in NUL, the browser reading fd 3 and writing fd 4. `on_event`
    sees every event (method, params, sessionId) as it arrives."""

    def __init__(self, user_data_dir, on_event=None):
        to_r, self.to_w = os.pipe()
        self.from_r, from_w = os.pipe()
        os.makedirs(user_data_dir, exist_ok=True)
        self.log = open(os.path.join(user_data_dir, "..", "chromium.log"),
                        "wb")
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c", f'exec "$@" 3<&{to_r} 4>&{from_w}', "sh",
             CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--no-default-browser-check",
             "--ignore-certificate-errors", "--remote-debugging-pipe",
             "--hide-scrollbars", f"--user-data-dir={user_data_dir}",
             "about:blank"],
            pass_fds=(to_r, from_w), stdout=self.log, stderr=self.log)
        os.close(to_r)
        os.close(from_w)
        self.buf = b""
        self.next_id = 1
        self.on_event = on_event
        self.events = []
        self.session = None

    def close(self):
        try:
            self.send("Browser.close", session=False, timeout=5)
        except (AssertionError, OSError):
            pass
        tu.stop_process(self.proc, timeout=5)
        for fd in (self.to_w, self.from_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()

    def _read_one(self, deadline):
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("chromium: no answer in time")
            if not select.select([self.from_r], [], [], min(left, 0.2))[0]:
                if self.proc.poll() is not None:
                    raise AssertionError(
                        f"chromium exited ({self.proc.returncode})")
                continue
            chunk = os.read(self.from_r, 1 << 20)
            if not chunk:
                raise AssertionError("chromium closed its pipe")
            self.buf += chunk
        msg, _, self.buf = self.buf.partition(b"\0")
        return json.loads(msg)

    def _dispatch(self, msg):
        if "method" in msg:
            self.events.append(msg)
            if self.on_event is not None:
                self.on_event(msg["method"], msg.get("params", {}),
                              msg.get("sessionId"))

    def send(self, method, params=None, session=True, timeout=30):
        """Sends a command and returns its result (events meanwhile go to
        on_event); an error answer raises AssertionError."""
        mid = self.next_id
        self.next_id += 1
        msg = {"id": mid, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_one(deadline)
            if reply.get("id") == mid:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._dispatch(reply)

    def pump(self, seconds):
        """Handles the events that arrive within `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                self._dispatch(self._read_one(deadline))
            except AssertionError as e:
                if "in time" in str(e):
                    return
                raise

    def attach_page(self):
        targets = self.send("Target.getTargets", session=False)
        page = next(t for t in targets["targetInfos"] if t["type"] == "page")
        self.session = self.send(
            "Target.attachToTarget",
            {"targetId": page["targetId"], "flatten": True},
            session=False)["sessionId"]

    def eval(self, expression):
        r = self.send("Runtime.evaluate", {"expression": expression,
                                           "returnByValue": True,
                                           "awaitPromise": True})
        if "exceptionDetails" in r:
            raise AssertionError(
                f"page script failed: {r['exceptionDetails']}")
        return r["result"].get("value")

    def viewport(self, width, height, scale, mobile):
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height,
                   "deviceScaleFactor": scale, "mobile": mobile})

    def screenshot(self, path):
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))


# Everything a check needs from the page, read in one go (the page changes
# only between two of its updates, never during this script).
SNAPSHOT_JS = r"""
(() => {
  const panels = [...document.querySelectorAll("section.panel")].map(p => ({
    series: p.dataset.series, t: p.dataset.t,
    values: Object.fromEntries([...p.querySelectorAll("dd[data-k]")]
      .map(d => [d.dataset.k, d.dataset.v])),
    texts: Object.fromEntries([...p.querySelectorAll("dd[data-k]")]
      .map(d => [d.dataset.k, d.textContent])),
    shown: [...p.querySelectorAll("dd[data-k]")]
      .filter(d => !d.parentNode.hidden).map(d => d.dataset.k),
    charts: [...p.querySelectorAll("figure:not([hidden]) canvas")].map(c => {
      const px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
      let inked = 0;
      for (let i = 3; i < px.length; i += 4) if (px[i] > 0) inked++;
      return {title: c.dataset.chart, points: +c.dataset.points,
              drawn: +c.dataset.drawn, inked, width: c.clientWidth};
    }),
  }));
  const rows = [...document.querySelectorAll("#summary tbody tr")].map(r => ({
    series: r.dataset.series || null, total: r.classList.contains("total"),
    values: Object.fromEntries([...r.querySelectorAll("td[data-k]")]
      .map(d => [d.dataset.k, d.dataset.v])),
  }));
  return {panels, rows, updates: +(document.body.dataset.updates || 0),
          metrics: [...document.querySelectorAll("a")]
            .map(a => a.getAttribute("href")),
          scrollWidth: document.documentElement.scrollWidth,
          innerWidth: window.innerWidth,
          status: document.getElementById("status").textContent};
})()
"""


def js_fixed(v, digits):
    """Number.prototype.toFixed: the nearest decimal, the larger on a tie
    (of the exact binary value)."""
    q = decimal.Decimal(1).scaleb(-digits)
    return str(decimal.Decimal(v).quantize(q, rounding=decimal.ROUND_HALF_UP))


def page_text(k, v):
    """The page's fmt(): what it shows for value v of key k."""
    if v is None:
        return "\u2013"
    if k.endswith("_s") and not k.endswith("per_s"):
        return js_fixed(v * 1000, 1) + " ms" if v < 1 else \
            js_fixed(v, 3) + " s"
    if k in ("kv_usage", "prefix_cache_hit_rate"):
        return js_fixed(v * 100, 1) + " %"
    if k.endswith("per_s"):
        return js_fixed(v, 1)
    return str(int(v)) if float(v).is_integer() else repr(v)


def dom_value(text):
    return None if text == "null" else float(text)


class Feed12(threading.Thread):
    """A protocol 1.2 gateway in front of an engine, fed from the test: a
    STEP with waiting_deferred and a few ADMISSION_REJECTED every 0.2 s,
    no request. Its series has the 1.2 figures and charts; the reference
    engines' do not."""

    def __init__(self, sock_path):
        super().__init__(daemon=True)
        self.sock_path = sock_path
        self.halt = threading.Event()
        self.error = None

    def run(self):
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(self.sock_path)
            s.sendall(tu.hello(engine="vllm", model="tiny-gw",
                               instance="gw0"))
            seq = 0
            while not self.halt.wait(0.2):
                t = time.monotonic_ns()
                events = [[9, t, ("queue_full", "token_cap")[i % 2]]
                          for i in range(seq % 4)]
                events.append([7, t, {"running": 0, "waiting": 2 + seq % 3,
                                      "waiting_deferred": 1 + seq % 2,
                                      "kv_usage": 0.0}])
                s.sendall(tu.batch(events, seq=seq))
                seq += 1
            s.sendall(tu.frame(2))
            s.close()
        except Exception as e:  # reported by the test, not lost in a thread
            self.error = e

    def stop(self):
        self.halt.set()
        self.join(timeout=10)


class PageCase(unittest.TestCase):
    """A daemon (with `daemon_args`), two engines feeding it, a browser."""
    daemon_args = ()
    scheme = "http"
    auth = None  # (user, password) the browser and the checks use

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(CHROMIUM):
            raise unittest.SkipTest(f"{CHROMIUM} not installed")
        if not tu.ENGINE:
            raise AssertionError("TOKENMETER_ENGINE is not set")
        cls.tmp = tempfile.mkdtemp(prefix="tm-live-", dir="/tmp")
        cls.prepare()
        cls.d = tu.Daemon("--log-interval", "0", *cls.daemon_args).start()
        cls.engines = []
        for name, model, rate in (("dp0", "tiny-a", "12"),
                                  ("dp1", "tiny-b", "6")):
            engine = tu.Engine(
                "--requests", "400", "--rate", rate, "--prompt-len", "48",
                "--output-len", "24", "--backend", "cpu", "--instance", name,
                "--model", model, "--seed", "3", socket=cls.d.sock,
                report=None, dir=cls.tmp, name=f"engine-{name}")
            # Killed even when the rest of setUpClass fails.
            cls.addClassCleanup(engine.cleanup)
            cls.engines.append(engine.start())
        cls.feed = Feed12(cls.d.sock)
        cls.feed.start()
        cls.origin = f"{cls.scheme}://127.0.0.1:{cls.d.port}"
        cls.cdp = Cdp(os.path.join(cls.tmp, "chromium"), cls.on_event)
        cls.urls = []
        cls.cdp.attach_page()
        cls.cdp.send("Page.enable")
        cls.cdp.send("Runtime.enable")
        cls.cdp.send("Network.enable")
        cls.cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
        if cls.auth:
            cls.cdp.send("Fetch.enable", {"handleAuthRequests": True,
                                          "patterns": [{"urlPattern": "*"}]})
        cls.cdp.viewport(1280, 900, 1, False)

    @classmethod
    def prepare(cls):
        pass

    @classmethod
    def on_event(cls, method, params, session):
        if method == "Network.requestWillBeSent":
            cls.urls.append(params["request"]["url"])
        elif method == "Fetch.requestPaused":
            cls.cdp_async("Fetch.continueRequest",
                          {"requestId": params["requestId"]}, session)
        elif method == "Fetch.authRequired":
            cls.auth_challenges += 1
            user, password = cls.auth
            cls.cdp_async("Fetch.continueWithAuth", {
                "requestId": params["requestId"],
                "authChallengeResponse": {"response": "ProvideCredentials",
                                          "username": user,
                                          "password": password}}, session)

    auth_challenges = 0

    @classmethod
    def cdp_async(cls, method, params, session):
        """A command sent from an event handler: its answer is not waited
        for (the ids are told apart by send())."""
        mid = cls.cdp.next_id
        cls.cdp.next_id += 1
        msg = {"id": mid, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(cls.cdp.to_w, json.dumps(msg).encode() + b"\0")

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "cdp", None):
            cls.cdp.close()
        for engine in getattr(cls, "engines", []):
            engine.stop()
        if getattr(cls, "feed", None):
            cls.feed.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if getattr(cls, "d", None):
            stopped_cleanly(cls.d)

    def live(self):
        """/api/v1/live, parsed."""
        req = urllib.request.Request(self.origin + "/api/v1/live")
        if self.auth:
            token = base64.b64encode(":".join(self.auth).encode()).decode()
            req.add_header("Authorization", "Basic " + token)
        ctx = ssl._create_unverified_context() if self.scheme == "https" \
            else None
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return json.loads(r.read())

    def snapshot(self):
        return self.cdp.eval(SNAPSHOT_JS)

    def wait_page(self, what, predicate, timeout=60):
        """Polls the page's snapshot until predicate(snapshot) holds, handling
        the browser's events meanwhile."""
        last = [None]

        def ready():
            self.cdp.pump(0.2)
            try:
                last[0] = self.snapshot()
                return last[0] if predicate(last[0]) else None
            except AssertionError as e:  # a navigation under way
                if "page script failed" not in str(e) and \
                        "Execution context" not in str(e) and \
                        "Cannot find context" not in str(e):
                    raise
                return None
        try:
            return tu.poll_until(ready, timeout=timeout, interval=0, what=what)
        except AssertionError:
            raise AssertionError(f"{what}: last page state {last[0]}; "
                                 f"daemon log: {self.d.read_log()[-2000:]}")

    @staticmethod
    def chart(panel, title):
        (c,) = [c for c in panel["charts"] if c["title"] == title]
        return c

    @staticmethod
    def is_feed12(panel):
        return json.loads(panel["series"])[2] == "gw0"

    def busy(self, snap):
        """The engines' panels show traffic (throughput and an e2e latency
        drawn), the 1.2 gateway's its rejections."""
        if len(snap["panels"]) != 3:
            return False
        for p in snap["panels"]:
            titles = [c["title"] for c in p["charts"]]
            if self.is_feed12(p):
                if titles != CHARTS_12 or not self.chart(
                        p, "Admission rejections/s")["drawn"]:
                    return False
            elif not (self.chart(p, "End-to-end latency")["drawn"] > 0 and
                      self.chart(p, "Tokens/s")["drawn"] > 0):
                return False
        return True

    def open_page(self):
        self.cdp.send("Page.navigate", {"url": self.origin + "/"})
        return self.wait_page("three busy panels",
                              lambda s: s["updates"] >= 3 and self.busy(s))

    def check_against_api(self, snap):
        data = self.live()
        by_id = {json.dumps([s["engine_family"], s["model_name"],
                             s["engine"], s["labels"]]): s
                 for s in data["series"]}
        self.assertIsNone(self.feed.error)
        self.assertEqual(len(data["series"]), 3)
        self.assertEqual(len(snap["panels"]), 3)
        totals = {"prompt_tokens_per_s": 0, "generation_tokens_per_s": 0,
                  "running": 0, "waiting": 0}
        rows = {r["series"]: r for r in snap["rows"] if not r["total"]}
        for p in snap["panels"]:
            key = json.dumps(json.loads(p["series"]))
            self.assertIn(key, by_id)
            s = by_id[key]
            h = s["history"]
            t = int(p["t"])
            self.assertIn(t, h["t"], "the page's point is in the history")
            i = h["t"].index(t)
            for k in KEYS:
                want = h[k][i]
                self.assertEqual(dom_value(p["values"][k]), want, (key, k))
                self.assertEqual(p["texts"][k], page_text(k, want), (key, k))
            # The 1.2 figures and charts only where the history has them:
            # all of them for the gateway (numbers since its first STEP);
            # for a reference engine, what it sends (a 1.2 one its STEP
            # waiting_deferred, no rejection without --max-queued).
            feed12 = self.is_feed12(p)
            with_12 = {k for k in KEYS_12 if any(v is not None
                                                 for v in h[k][:i + 1])}
            if feed12:
                self.assertEqual(with_12, KEYS_12, key)
            else:
                self.assertNotIn("admission_rejections_per_s", with_12, key)
            self.assertEqual(p["shown"], [k for k in KEYS
                                          if k not in KEYS_12 or
                                          k in with_12], key)
            # Six charts and the 1.2 ones that have data (all eight for
            # the gateway), each over the history up to that point.
            self.assertEqual(
                [c["title"] for c in p["charts"]],
                [c for c in CHARTS_12 if c in CHARTS or
                 set(OPTIONAL_CHARTS[c]) & with_12], key)
            for c in p["charts"]:
                self.assertEqual(c["points"], i + 1, c["title"])
                self.assertGreater(c["inked"], 500, c["title"])
            # Throughput, requests and KV usage are numbers at every point.
            self.assertEqual(self.chart(p, "Tokens/s")["drawn"], 2 * (i + 1))
            self.assertEqual(self.chart(p, "Requests")["drawn"], 2 * (i + 1))
            self.assertEqual(self.chart(p, "KV cache usage")["drawn"], i + 1)
            # An optional chart draws every point from the first with a
            # value (each STEP has waiting_deferred; the history's null is
            # before it).
            for title, keys in OPTIONAL_CHARTS.items():
                want = sum(v is not None for k in keys for v in h[k][:i + 1])
                if want:
                    self.assertEqual(self.chart(p, title)["drawn"], want,
                                     title)
                else:
                    self.assertFalse(feed12, title)
            row = rows[p["series"]]
            for k, v in row["values"].items():
                self.assertEqual(dom_value(v), h[k][i], ("summary", key, k))
            for k in totals:
                totals[k] += h[k][i] or 0
        total = [r for r in snap["rows"] if r["total"]]
        self.assertEqual(len(total), 1)
        for k, v in totals.items():
            self.assertAlmostEqual(dom_value(total[0]["values"][k]), v,
                                   delta=1e-9, msg=k)
        self.assertIn("metrics", snap["metrics"])

    def check_own_origin_only(self):
        self.assertTrue(self.urls)
        for url in self.urls:
            self.assertTrue(url.startswith(self.origin + "/"), url)


class LivePage(PageCase):
    def test_page(self):
        snap = self.open_page()
        self.check_against_api(snap)
        if SHOT_DIR:
            self.cdp.screenshot(os.path.join(SHOT_DIR, "live_page.png"))

        # The history is the daemon's: a reload shows at least as much.
        before = snap["panels"][0]["charts"][0]["points"]
        self.cdp.eval("window.__before_reload = 1")
        self.cdp.send("Page.reload", {"ignoreCache": True})
        snap = self.wait_page(
            "the reloaded page",
            lambda s: s["updates"] >= 1 and len(s["panels"]) == 3 and
            self.cdp.eval("window.__before_reload") is None)
        self.assertGreaterEqual(snap["panels"][0]["charts"][0]["points"],
                                before)
        self.check_against_api(snap)

        # A phone: one column, nothing wider than the screen.
        self.cdp.viewport(390, 844, 2, True)
        updates = snap["updates"]
        snap = self.wait_page("an update at phone size",
                              lambda s: s["updates"] > updates)
        self.assertEqual(snap["innerWidth"], 390)
        self.assertLessEqual(snap["scrollWidth"], 390)
        for p in snap["panels"]:
            for c in p["charts"]:
                self.assertLessEqual(c["width"], 390)
        self.check_against_api(snap)
        if SHOT_DIR:
            self.cdp.screenshot(os.path.join(SHOT_DIR, "live_page_phone.png"))
        self.check_own_origin_only()


class LivePageAuth(PageCase):
    daemon_args = ()
    scheme = "https"
    auth = (USER, PASSWORD)

    @classmethod
    def prepare(cls):
        for tool in ("openssl", "htpasswd"):
            if shutil.which(tool) is None:
                raise unittest.SkipTest(f"{tool} not installed")
        make_cert(cls.tmp)
        path = os.path.join(cls.tmp, "web.yml")
        with open(path, "w") as f:
            f.write("tls_server_config:\n"
                    "  cert_file: server.crt\n"
                    "  key_file: server.key\n"
                    "basic_auth_users:\n"
                    f"  {USER}: {make_hash(PASSWORD)}\n")
        cls.daemon_args = ("--web-config", path)

    def test_page_behind_tls_and_basic_auth(self):
        # Without credentials: 401 for the page and its data.
        ctx = ssl._create_unverified_context()
        for path in ("/", "/api/v1/live"):
            with self.assertRaises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(self.origin + path, timeout=10,
                                       context=ctx)
            self.assertEqual(e.exception.code, 401)
            self.assertIn("Basic", e.exception.headers["WWW-Authenticate"])
        snap = self.open_page()
        self.assertGreaterEqual(self.auth_challenges, 1)
        self.check_against_api(snap)
        self.check_own_origin_only()


# The request view, read in one go: per series box its rows, each with
# the numbers it keeps and what its canvas drew.
REQUESTS_JS = r"""
(() => {
  const boxes = [...document.querySelectorAll("#rq-list .rq-series")];
  return {
    hidden: document.getElementById("requests").hidden,
    updates: +(document.body.dataset.requestUpdates || 0),
    series: boxes.map(b => ({
      series: b.dataset.series,
      title: b.querySelector("h3").textContent,
      rows: [...b.querySelectorAll("tbody tr")].map(r => {
        const c = r.querySelector("canvas");
        const px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
        let inked = 0;
        for (let i = 3; i < px.length; i += 4) if (px[i] > 0) inked++;
        return {id: r.dataset.requestId, kept: r.dataset.kept,
                e2e: r.dataset.e2e, trace: r.dataset.traceId,
                e2eText: r.querySelector("td[data-k=e2e]").textContent,
                ttftText: r.querySelector("td[data-k=ttft]").textContent,
                traceText: r.querySelector("td.trace").textContent,
                phases: +c.dataset.phases, ticks: +c.dataset.ticks,
                inked, width: c.clientWidth};
      }),
    })),
  };
})()
"""


class _AcceptAll(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that accepts every body (200, empty answer:
    an ExportTraceServiceResponse without partial_success)."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class RequestView(unittest.TestCase):
    """The live page's request view (issue 30) on a daemon fed hand-written
    frames with known times: slow, failed, preempted, KV-transferring and
    traced requests in two series. Every row must equal /api/v1/requests
    (ids, newest first by FINISHED, e2e, trace id) and its waterfall must
    have drawn each phase and token tick of the API's document. Tracing
    goes to a receiver here that accepts every body, so that each row has
    its trace id (shown once exported).
    Screenshot: live_page_requests.png."""

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(CHROMIUM):
            raise unittest.SkipTest(f"{CHROMIUM} not installed")
        cls.tmp = tempfile.mkdtemp(prefix="tm-rqview-", dir="/tmp")
        cls.sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                   _AcceptAll)
        threading.Thread(target=cls.sink.serve_forever, daemon=True).start()
        endpoint = f"http://127.0.0.1:{cls.sink.server_address[1]}/v1/traces"
        cls.d = tu.Daemon("--log-interval", "0", "--finished-grace", "0",
                          "--otlp-endpoint", endpoint,
                          "--trace-ratio", "1", "--keep-requests", "3").start()
        cls.origin = f"http://127.0.0.1:{cls.d.port}"
        cls.cdp = Cdp(os.path.join(cls.tmp, "chromium"))
        cls.cdp.attach_page()
        cls.cdp.send("Page.enable")
        cls.cdp.send("Runtime.enable")
        cls.cdp.viewport(1280, 900, 1, False)

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "cdp", None):
            cls.cdp.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if getattr(cls, "d", None):
            stopped_cleanly(cls.d)
        if getattr(cls, "sink", None):
            cls.sink.shutdown()
            cls.sink.server_close()

    def feed(self):
        ms = 1_000_000
        t0 = time.monotonic_ns() - 20_000 * ms
        tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        events = []
        for i, e2e in enumerate([400, 120, 900, 250, 60]):
            t = t0 + i * 1000 * ms
            rid = i + 1
            opts = {"traceparent": tp} if rid == 3 else {}
            events += [[1, t, rid, 32, opts], [2, t + 2 * ms, rid],
                       [3, t + 30 * ms, rid]]
            events += [[4, t + (50 + 10 * k) * ms, rid, 1]
                       for k in range(e2e // 20 - 3)]
            events.append([5, t + e2e * ms, rid, "stop"])
        # Request 3: preempted and resumed, a KV recv before prefill.
        t = t0 + 2000 * ms
        events += [[6, t + 300 * ms, 3], [3, t + 420 * ms, 3],
                   [10, t + 28 * ms, 3, {"role": "recv", "start": t + 5 * ms,
                                         "bytes": 1 << 20}]]
        # A failed one: an error with a failed KV send.
        t = t0 + 6000 * ms
        events += [[1, t, "bad", 8], [3, t + 5 * ms, "bad"],
                   [10, t + 20 * ms, "bad", {"role": "send", "start": t + 6 * ms,
                                             "ok": False, "reason": "timeout"}],
                   [5, t + 25 * ms, "bad", "error"]]
        events.sort(key=lambda e: e[1])
        s = self.d.connect()
        s.sendall(tu.hello(engine="vllm", model="wf-a"))
        s.sendall(tu.batch(events))
        s2 = self.d.connect()
        s2.sendall(tu.hello(engine="sglang", model="wf-b"))
        # And one without ARRIVED (its TTFT is not known: "-").
        s2.sendall(tu.batch([[1, t0, 9, 4], [3, t0 + ms, 9],
                             [4, t0 + 3 * ms, 9, 2],
                             [5, t0 + 9 * ms, 9, "stop"],
                             [2, t0 + 10 * ms, "na"], [3, t0 + 12 * ms, "na"],
                             [4, t0 + 15 * ms, "na", 1],
                             [5, t0 + 30 * ms, "na", "stop"]]))
        return s, s2

    def api(self):
        with urllib.request.urlopen(self.origin + "/api/v1/requests",
                                    timeout=10) as r:
            return json.loads(r.read())

    def test_waterfalls_equal_the_api(self):
        socks = self.feed()
        tu.poll_until(lambda: sum(len(s["requests"])
                                  for s in self.api()["series"]) == 5,
                      what="5 kept requests")
        # Each trace id shows once its spans were exported.
        tu.poll_until(lambda: all(r["trace_id"]
                                  for s in self.api()["series"]
                                  for r in s["requests"]),
                      what="every kept request's trace id")
        doc = self.api()
        self.cdp.send("Page.navigate", {"url": self.origin + "/"})

        def shown():
            self.cdp.pump(0.2)
            try:
                snap = self.cdp.eval(REQUESTS_JS)
            except AssertionError:
                return None
            n = sum(len(s["rows"]) for s in snap["series"])
            return snap if snap["updates"] >= 1 and n == 5 else None
        snap = tu.poll_until(shown, timeout=60, interval=0,
                             what="the request view")
        for s in socks:
            s.close()
        if SHOT_DIR:
            self.cdp.eval('document.getElementById("requests")'
                          '.scrollIntoView()')
            self.cdp.screenshot(os.path.join(SHOT_DIR,
                                             "live_page_requests.png"))
        self.assertFalse(snap["hidden"])
        by_series = {json.dumps([s["engine_family"], s["profile"],
                                 s["labels"]],
                                separators=(",", ":")): s
                     for s in doc["series"]}
        self.assertEqual(len(snap["series"]), 2)
        for box in snap["series"]:
            key = json.dumps(json.loads(box["series"]), separators=(",", ":"))
            api = by_series[key]
            # Newest first by FINISHED.
            want = sorted(api["requests"], key=lambda r: -(
                r["start_monotonic_ns"] + r["finished_ns"]))
            self.assertEqual([r["id"] for r in box["rows"]],
                             [r["request_id"] for r in want], key)
            for row, r in zip(box["rows"], want):
                self.assertEqual(float(row["e2e"]), r["e2e_seconds"])
                self.assertEqual(row["kept"], r["kept"])
                self.assertEqual(row["e2eText"],
                                 page_text("e2e_s", r["e2e_seconds"]))
                self.assertEqual(
                    row["ttftText"],
                    "\u2013" if r["arrived_ns"] is None
                    or r["first_token_ns"] is None else
                    page_text("ttft_s",
                              (r["first_token_ns"] - r["arrived_ns"]) / 1e9),
                    r["request_id"])
                self.assertEqual(row["trace"], r["trace_id"] or "")
                self.assertEqual(row["traceText"], r["trace_id"] or "")
                self.assertEqual(row["phases"], len(r["phases"]))
                self.assertEqual(row["ticks"], len(r["tokens"]))
                self.assertGreater(row["inked"], 50, row)
        a = by_series[[k for k in by_series if "wf-a" in k][0]]
        ids = [r["request_id"] for r in a["requests"]]
        # --keep-requests 3: the failed one, then the two slowest.
        self.assertEqual(ids, ["bad", "3", "1"])
        r3 = a["requests"][1]
        self.assertEqual(r3["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736")
        self.assertEqual(sorted(p["name"] for p in r3["phases"]),
                         ["decode", "kv_transfer.recv", "preempted",
                          "prefill", "queue"])
        self.assertTrue(all(len(r["trace_id"] or "") == 32
                            for s in doc["series"] for r in s["requests"]))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    tu.DAEMON = sys.argv[1]
    tu.main([sys.argv[0], *sys.argv[2:]])
