"""The one way tests and benches run tokenmeterd and read its metrics.

* Daemon: the real binary on a temp dir with a short socket path and HTTP
  on 127.0.0.1:0; start() passes --ready-fd over a pipe and waits (bounded)
  for the daemon's "ready http=HOST:PORT ingest=PATH" line, so nothing
  reads the port out of the log; stop() returns the exit code.
* poll_until: bounded polling that raises with a message, never a sleep to
  wait.
* scrape / Samples: /metrics parsed by prometheus_client.parser, and a dict
  view: Samples.value(name, **labels).
* skip / need_path / main: exit 77 (meson's SKIP) when an input that lives
  outside the repository (../shared/peers, an optional tool) is absent, so
  that a plain clone does not report such a test as passed.
* Engine: one run of the reference engine (tokenmeter-engine, in
  $TOKENMETER_ENGINE) on a daemon's socket: argv built from keyword
  arguments, stderr and stdout in files, wait_ready() until the daemon
  logged its HELLO (bounded), report() waits (bounded; a timeout kills it),
  checks the exit status and parses --report; stop/kill/cleanup.
* start_prometheus / wait_prometheus_ready / stop_process: a real
  Prometheus (or any helper process) for a test.
* frame / hello / batch / wait_closed: protocol-v1 frames written by hand.

Scripts find this file with sys.path.insert(0, <repo>/tests/testutil) and
the daemon binary in $TOKENMETERD, the engine's in $TOKENMETER_ENGINE (meson
sets them) unless they set DAEMON or ENGINE from their own arguments.
"""
import fcntl
import gzip
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import msgpack
from prometheus_client.parser import text_string_to_metric_families

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
DAEMON = os.environ.get("TOKENMETERD", "")
ENGINE = os.environ.get("TOKENMETER_ENGINE", "")
SKIP = 77  # meson's exit status for "skipped"
READY_TIMEOUT_S = 30.0


def skip(reason):
    """Ends the script as skipped (exit 77), saying why."""
    print(f"SKIP: {reason}", flush=True)
    sys.exit(SKIP)


def peers_dir():
    """The peers directory beside the repository (PEERS_DIR overrides)."""
    return os.environ.get("PEERS_DIR") or os.path.join(
        SOURCE_ROOT, "..", "shared", "peers")


def need_path(path, what=None):
    """Returns `path` if it exists; otherwise skips the current unittest
    test (unittest.SkipTest; main() exits 77 when every test skipped)."""
    if path and os.path.exists(path):
        return path
    raise unittest.SkipTest(f"{what or path} not found ({path}): an input "
                            "from outside the repository")


def main(argv=None):
    """unittest.main for a test script: exit 0 when every test passed, 1 on
    a failure or when nothing ran, 77 when every test (or its whole class,
    from setUpClass) skipped."""
    prog = unittest.main(argv=argv, exit=False, verbosity=2)
    result = prog.result
    if not result.wasSuccessful():
        sys.exit(1)
    # A class skipped in setUpClass counts one skip and no test run.
    if result.skipped and len(result.skipped) >= result.testsRun:
        print("SKIP: every test skipped:", "; ".join(
            sorted({why for _, why in result.skipped})), flush=True)
        sys.exit(SKIP)
    sys.exit(0 if result.testsRun > 0 else 1)


def poll_until(predicate, timeout=10.0, interval=0.02, what="condition"):
    """Calls predicate until it returns a true value (returned) or
    `timeout` seconds pass (AssertionError naming `what` and the last
    value). Exceptions from predicate propagate."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for "
                                 f"{what} (last: {value!r})")
        time.sleep(interval)


class Samples(dict):
    """{(sample name, frozenset(labels.items())): value} of one scrape."""

    def value(self, name, **labels):
        """The sample with exactly these labels, or None."""
        return self.get((name, frozenset(labels.items())))

    def sum(self, name, **labels):
        """The sum over samples of `name` whose labels include `labels`."""
        want = labels.items()
        return sum(v for (n, ls), v in self.items()
                   if n == name and want <= dict(ls).items())


def parse(text):
    """Prometheus text exposition -> Samples (prometheus_client's parser)."""
    out = Samples()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def http_get(host, port, path="/metrics", headers=None, method="GET",
             timeout=10):
    """(status, headers dict, body bytes); an HTTP error status is returned,
    not raised."""
    req = urllib.request.Request(f"http://{host}:{port}{path}",
                                 headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def metrics_text(port, host="127.0.0.1", headers=None, timeout=10):
    """The body of a 200 /metrics, gunzipped if it came gzipped."""
    status, hdrs, body = http_get(host, port, "/metrics", headers,
                                  timeout=timeout)
    if status != 200:
        raise AssertionError(f"GET /metrics on {host}:{port}: {status}")
    if hdrs.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return body.decode()


def scrape(port, host="127.0.0.1", timeout=10):
    """One /metrics scrape, parsed: Samples."""
    return parse(metrics_text(port, host, timeout=timeout))


class Daemon:
    """tokenmeterd on a temp dir ("tm-*" under /tmp, socket i.sock) and an
    ephemeral loopback port, its stderr in daemon.log there.

    args: extra flags. ingest/listen: the --ingest and --listen values
    (None leaves the flag out, e.g. under socket activation). launcher:
    argv put before the binary (e.g. systemd-socket-activate ...); a
    launcher that closes the descriptors it does not know needs
    ready_fifo=True: the ready line then comes through a FIFO in the temp
    dir that a shell opens as fd 9 just before it execs the daemon. env,
    pass_fds, preexec_fn: as for subprocess.Popen (env is merged over
    os.environ). After start(): port, host, sock (the daemon's own report
    of its addresses), ready_line and proc."""

    def __init__(self, *args, binary=None, ingest="", listen="127.0.0.1:0",
                 launcher=(), ready_fifo=False, env=None, pass_fds=(),
                 preexec_fn=None, prefix="tm-"):
        self.dir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
        self.sock = os.path.join(self.dir, "i.sock") if ingest == "" \
            else ingest
        self.ingest_flag = ingest is not None
        self.listen = listen
        self.log_path = os.path.join(self.dir, "daemon.log")
        self.binary = binary
        self.args = list(args)
        self.launcher = list(launcher)
        self.ready_fifo = ready_fifo
        self.env = dict(env or {})
        self.pass_fds = tuple(pass_fds)
        self.preexec_fn = preexec_fn
        self.proc = None
        # Created now, so that a test can stat it before start().
        self.log = open(self.log_path, "ab")
        self.port = None
        self.host = None
        self.ready_line = None

    def command(self, ready_fd):
        cmd = [*self.launcher, self.binary or DAEMON]
        if self.ready_fifo:
            cmd[len(self.launcher):len(self.launcher)] = [
                "/bin/sh", "-c", 'exec "$@" 9>"$0"', self._fifo_path()]
        if self.ingest_flag:
            cmd += ["--ingest", self.sock]
        if self.listen is not None:
            cmd += ["--listen", self.listen]
        return cmd + ["--ready-fd", str(ready_fd), *self.args]

    def start(self, timeout=READY_TIMEOUT_S, before_ready=None):
        """Starts the daemon and returns self once it has said "ready".
        before_ready, if given, is called after the process started and
        before the wait (e.g. to make a socket activator exec it). Raises
        AssertionError with the log if it exits or stays silent."""
        if not (self.binary or DAEMON):
            raise AssertionError("no tokenmeterd: set TOKENMETERD")
        if self.log is None or self.log.closed:
            self.log = open(self.log_path, "ab")
        if self.ready_fifo:
            if not os.path.exists(self._fifo_path()):
                os.mkfifo(self._fifo_path())
            # Non-blocking: the open does not wait for the writer.
            r = os.open(self._fifo_path(), os.O_RDONLY | os.O_NONBLOCK)
            w_high = 9
            pass_fds = self.pass_fds
        else:
            r, w = os.pipe()
            # Above the fds a launcher or preexec_fn may claim (LISTEN_FDS
            # from 3 on).
            w_high = fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, 64)
            os.close(w)
            pass_fds = (*self.pass_fds, w_high)
        try:
            self.proc = subprocess.Popen(
                self.command(w_high), stdout=subprocess.DEVNULL,
                stderr=self.log, env=dict(os.environ, **self.env),
                pass_fds=pass_fds, preexec_fn=self.preexec_fn)
        finally:
            if not self.ready_fifo:
                os.close(w_high)
        try:
            if before_ready is not None:
                before_ready()
            line = self._read_ready(r, timeout)
        finally:
            os.close(r)
        self.ready_line = line
        http, sep, ingest = line[len("ready http="):].partition(" ingest=")
        if not line.startswith("ready http=") or not sep:
            raise AssertionError(f"unexpected ready line {line!r}")
        host, _, port = http.rpartition(":")
        self.port = int(port)
        self.host = host.strip("[]") or "127.0.0.1"
        if host.strip("[]") in ("0.0.0.0", "::"):
            self.host = "127.0.0.1"
        self.sock = ingest
        return self

    def start_or_exit(self):
        """start() for a script (a bench): on failure, cleans up and exits
        with the reason instead of raising."""
        try:
            return self.start()
        except AssertionError as e:
            self.cleanup()
            sys.exit(f"tokenmeterd did not start: {e}")

    def _fifo_path(self):
        return os.path.join(self.dir, "ready.fifo")

    def _read_ready(self, fd, timeout):
        deadline = time.monotonic() + timeout
        data = b""
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"tokenmeterd not ready after {timeout} s: " +
                    self.read_log().decode(errors="replace"))
            # In slices: a FIFO nobody opened never reports end of file.
            if not select.select([fd], [], [], min(left, 0.1))[0]:
                if self.proc.poll() is not None:
                    self._exited_early()
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                self.proc.wait(timeout=timeout)
                self._exited_early()
            data += chunk
        return data.decode().rstrip("\n")

    def _exited_early(self):
        raise AssertionError(
            f"tokenmeterd exited ({self.proc.returncode}) before it was "
            "ready: " + self.read_log().decode(errors="replace"))

    def read_log(self):
        if self.log is not None and not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read()

    def signal(self, signum):
        self.proc.send_signal(signum)

    def stop(self, timeout=20):
        """SIGTERM, then waits for the exit; returns the exit code (None if
        never started). Idempotent."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=timeout)
        return self.wait(timeout)

    def wait(self, timeout=20):
        """Waits for an exit already under way; returns the exit code."""
        rc = self.proc.wait(timeout=timeout)
        if self.log is not None:
            self.log.close()
        return rc

    def kill(self):
        """SIGKILL (a crash: the socket file stays); returns the code."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        return self.wait()

    def cleanup(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        self.cleanup()

    # HTTP --------------------------------------------------------------
    def get(self, path="/metrics", headers=None, method="GET"):
        return http_get(self.host, self.port, path, headers, method)

    def metrics_text(self, headers=None):
        return metrics_text(self.port, self.host, headers)

    def samples(self):
        return scrape(self.port, self.host)

    def value(self, name, **labels):
        return self.samples().value(name, **labels)

    def wait_value(self, name, expected, timeout=10.0, **labels):
        last = []

        def equal():
            last[:] = [self.value(name, **labels)]
            return last[0] == expected
        poll_until(equal, timeout=timeout,
                   what=f"{name}{labels} == {expected} (last {last})")

    # Ingest ------------------------------------------------------------
    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.sock)
        return s


class Engine:
    """One run of the reference engine (tokenmeter-engine) with its stderr
    in `log` and its stdout in `log` with .out for .log (default: NAME.log
    and NAME.out in `dir`).

    args: the engine's own flags (the workload). socket: the
    --metrics-socket value (a Daemon's .sock; None leaves the flag out:
    --no-metrics, or the flag among args). report: the --report path (""
    puts NAME.json in `dir`; None leaves the flag out). dir: where the
    files go (default: a "tm-engine-*" temp dir of its own, which cleanup()
    removes). binary: default ENGINE ($TOKENMETER_ENGINE). launcher: argv
    put before the binary (ip netns exec NS, an interpreter).
    socket_flag: the flag that takes `socket` (another engine-like
    program's). env: merged over os.environ. new_session: its own process
    group, signalled as a whole. After start(): proc, pid.

    wait_ready() and report() raise AssertionError with the end of the log
    when the engine exits badly or runs past their bound; a run past it is
    killed. A test pairs start() with cleanup() (addCleanup, or `with`:
    __enter__ starts, __exit__ cleans up), which kills a running engine."""

    def __init__(self, *args, socket=None, report="", dir=None,
                 name="engine", log="", binary=None, launcher=(),
                 socket_flag="--metrics-socket", env=None,
                 new_session=False):
        self.own_dir = dir is None
        self.dir = tempfile.mkdtemp(prefix="tm-engine-", dir="/tmp") \
            if dir is None else dir
        self.name = name
        self.args = list(args)
        self.socket = socket
        self.report_path = os.path.join(self.dir, f"{name}.json") \
            if report == "" else report
        self.log_path = os.path.join(self.dir, f"{name}.log") \
            if log == "" else log
        stem = self.log_path[:-len(".log")] \
            if self.log_path.endswith(".log") else self.log_path
        self.out_path = stem + ".out"
        self.binary = binary
        self.launcher = list(launcher)
        self.socket_flag = socket_flag
        self.env = dict(env or {})
        self.new_session = new_session
        self.proc = None
        self.pid = None

    def command(self):
        cmd = [*self.launcher, self.binary or ENGINE, *self.args]
        if self.socket is not None:
            cmd += [self.socket_flag, self.socket]
        if self.report_path is not None:
            cmd += ["--report", self.report_path]
        return cmd

    def start(self):
        """Starts the engine (no wait); returns self."""
        if not (self.binary or ENGINE):
            raise AssertionError("no tokenmeter-engine: set "
                                 "TOKENMETER_ENGINE")
        with open(self.log_path, "ab") as err, \
                open(self.out_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=out,
                stderr=err, env=dict(os.environ, **self.env),
                start_new_session=self.new_session)
        self.pid = self.proc.pid
        return self

    def poll(self):
        """The exit code, or None while it runs (or before start())."""
        return None if self.proc is None else self.proc.poll()

    def wait_ready(self, daemon, timeout=READY_TIMEOUT_S):
        """Until `daemon` (a Daemon, or anything with read_log()) has
        logged this process's HELLO ("pid=PID ...: hello" from its peer
        credentials; a launcher must exec the engine, as ip netns exec
        does); returns self. Raises (and kills the engine) when it exits
        non-zero first or `timeout` seconds pass."""
        hello = re.compile(rb" pid=%d [^:\n]*: hello " % self.pid)

        def seen():
            if hello.search(daemon.read_log()):
                return "ready"
            rc = self.proc.poll()
            return f"exited ({rc})" if rc not in (None, 0) else None
        try:
            got = poll_until(seen, timeout=timeout, interval=0.05,
                             what=f"the daemon logging {self.name}'s HELLO "
                             f"(pid {self.pid})")
        except AssertionError as e:
            why = str(e)
        else:
            if got == "ready":
                return self
            why = f"{self.name} {got} before the daemon saw its HELLO"
        self.kill()
        self._fail(why)

    def wait(self, timeout=120):
        """Waits for the exit; returns 0. Raises AssertionError with the
        log when the exit code is not 0, or when it runs past `timeout`
        seconds (it is then killed first)."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        if rc is None:
            self.kill()
            self._fail(f"{self.name} still running after {timeout} s: "
                       "killed")
        if rc != 0:
            self._fail(f"{self.name} exited {rc}")
        return rc

    def report(self, timeout=120):
        """wait(timeout), then the --report JSON, parsed."""
        self.wait(timeout)
        try:
            with open(self.report_path) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            self._fail(f"{self.name} exited 0 without a readable report "
                       f"{self.report_path} ({e})")

    def signal(self, signum):
        """Sends `signum` (to the whole group under new_session)."""
        if self.new_session:
            os.killpg(self.proc.pid, signum)
        else:
            self.proc.send_signal(signum)

    def stop(self, timeout=10):
        """SIGTERM, SIGKILL after `timeout` seconds; returns the exit code
        (None if never started), whatever it is. Idempotent."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.wait()

    def kill(self):
        """SIGKILL if it runs; returns the exit code (None if never
        started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                self.signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
        return self.proc.wait()

    def cleanup(self):
        """kill(), and removes `dir` when it is the engine's own."""
        self.kill()
        if self.own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def read_log(self):
        """Its stderr so far, as text."""
        return self._read(self.log_path)

    def read_output(self):
        """Its stdout so far, as text."""
        return self._read(self.out_path)

    def tail(self, n=3000):
        """The last `n` characters of stderr (and of stdout, if any), for
        a failure message."""
        out = self.read_output()
        return self.read_log()[-n:] + (f"\n(stdout) {out[-n:]}" if out
                                       else "")

    @staticmethod
    def _read(path):
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def _fail(self, what):
        tail = self.tail()
        raise AssertionError(f"{what}: {tail}" if tail.strip() else
                             f"{what} (nothing on stderr or stdout)")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()


def start_prometheus(binary, config_dir, port, extra_args=()):
    """Starts a real Prometheus with config_dir/prometheus.yml, its TSDB in
    config_dir/data, the HTTP API on 127.0.0.1:port, warnings to
    config_dir/prometheus.log, and extra_args (e.g.
    --enable-feature=native-histograms). Returns (process, log_path); the
    caller waits for readiness and stops it."""
    log_path = os.path.join(config_dir, "prometheus.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [binary,
             "--config.file=" + os.path.join(config_dir, "prometheus.yml"),
             "--storage.tsdb.path=" + os.path.join(config_dir, "data"),
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
             *extra_args],
            stdout=subprocess.DEVNULL, stderr=log, cwd=config_dir)
    return proc, log_path


def stop_process(proc, timeout=10):
    """SIGTERM to a subprocess.Popen still running, SIGKILL if it has not
    exited after `timeout` seconds; reaps it. None is ignored."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_prometheus_ready(proc, port, timeout=30):
    """True once the Prometheus of start_prometheus() answers /-/ready on
    127.0.0.1:port with 200; False if it exits first (e.g. its port was
    taken meanwhile). Bounded by `timeout`."""
    def ready():
        if proc.poll() is not None:
            return "exited"
        try:
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
                return "ready" if r.status == 200 else None
        except (urllib.error.URLError, OSError):
            return None
    return poll_until(ready, timeout=timeout, interval=0.1,
                      what="prometheus /-/ready") == "ready"


# The reference engine's --report histogram keys -> the histogram each one
# equals (docs/metrics.md names, without the namespace).
ENGINE_REPORT_HISTOGRAMS = {
    "ttft_s": "time_to_first_token_seconds",
    "itl_s": "inter_token_latency_seconds",
    "e2e_s": "e2e_request_latency_seconds",
    "queue_s": "request_queue_time_seconds",
    "prefill_s": "request_prefill_time_seconds",
    "decode_s": "request_decode_time_seconds",
    "inference_s": "request_inference_time_seconds",
    "tpot_s": "request_time_per_output_token_seconds",
}


def build_old_daemon(src, cache, commit):
    """tokenmeterd built from `git archive COMMIT` of the tree `src` into
    `cache` (meson, -Dtests=disabled, only daemon/tokenmeterd, buildtype
    plain: no optimization and no debug information, 55 to 105 s of CPU
    where debugoptimized took 100 to 180; the tests send it a few thousand
    events), or the one a previous run left there; None when `src` has no
    such history. The sanitizer runtime a test preloads is kept out of the
    build."""
    binary = os.path.join(cache, "build", "daemon", "tokenmeterd")
    if os.path.exists(binary):
        return binary
    tree = os.path.join(cache, "src")
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    shutil.rmtree(cache, ignore_errors=True)
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", src, "archive", commit],
                             capture_output=True, env=env)
    if archive.returncode != 0:
        sys.stderr.write(archive.stderr.decode())
        return None
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout,
                   check=True)
    subprocess.run(["meson", "setup", os.path.join(cache, "build"), tree,
                    "--buildtype=plain", "-Dtests=disabled",
                    "-Dcuda=disabled", "-Dman=disabled"],
                   check=True, stdout=subprocess.DEVNULL, env=env)
    subprocess.run(["ninja", "-C", os.path.join(cache, "build"), "-j2",
                    "daemon/tokenmeterd"], check=True,
                   stdout=subprocess.DEVNULL, env=env)
    return binary


def frame(*items):
    return msgpack.packb(list(items), use_bin_type=True)


def hello(engine="vllm", model="m", **extra):
    meta = {"proto": 1, "engine": engine, "model": model}
    meta.update(extra)
    return frame(0, meta)


def batch(events, seq=0, dropped=0):
    return frame(1, seq, dropped, events)


def wait_closed(sock, timeout=5.0):
    """True when the peer closed the connection."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
