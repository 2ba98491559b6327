#!/usr/bin/python3
"""systemd integration of tokenmeterd, without systemd as PID 1:
socket activation through systemd-socket-activate, the notify protocol to a
test-owned datagram socket, journald-style stderr, and the unit files
checked by systemd-analyze.

Usage: systemd_test.py TOKENMETERD UNIT_DIR_SRC SERVICE_IN [unittest args]
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402
from tokenmeter_testutil import Daemon, batch, hello, poll_until  # noqa: E402

UNITS = SERVICE_IN = ""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class NotifySocket:
    def __init__(self, directory):
        self.path = os.path.join(directory, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages = []

    def close(self):
        self.sock.close()

    def drain(self):
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except socket.timeout:
                return

    def wait_for(self, text, timeout=10):
        def seen():
            self.drain()
            return any(text in m for m in self.messages)
        poll_until(seen, timeout=timeout, what=f"notify {text!r}")


class SocketActivation(unittest.TestCase):
    def setUp(self):
        if not shutil.which("systemd-socket-activate"):
            self.skipTest("systemd-socket-activate is not installed")
        self.dir = tempfile.mkdtemp(prefix="tm-sd-", dir="/tmp")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def test_inherited_sockets_ready_status_stopping(self):
        ingest = os.path.join(self.dir, "ingest.sock")
        port = free_port()
        notify = NotifySocket(self.dir)
        self.addCleanup(notify.close)
        d = Daemon(
            "--log-interval", "0",
            # Flags the inherited sockets must win over:
            ingest=os.path.join(self.dir, "unused.sock"),
            listen="127.0.0.1:1", ready_fifo=True,
            launcher=["systemd-socket-activate", "-l", ingest,
                      "-l", f"127.0.0.1:{port}", "--fdname=ingest:http",
                      "-E", f"NOTIFY_SOCKET={notify.path}"])
        self.addCleanup(d.cleanup)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

        def first_connection():
            # It makes systemd-socket-activate exec the daemon.
            poll_until(lambda: os.path.exists(ingest), what="ingest socket")
            s.connect(ingest)
            s.sendall(hello(engine="vllm", model="m"))
            s.sendall(batch([[4, time.monotonic_ns(), 1, 5]]))
        d.start(before_ready=first_connection)
        # The ready line names the inherited sockets, not the flags.
        self.assertEqual(d.ready_line,
                         f"ready http=127.0.0.1:{port} ingest={ingest}")
        notify.wait_for("READY=1")
        notify.wait_for("STATUS=")

        def scraped():
            import urllib.request
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    return b'vllm:generation_tokens_total{model_name="m",' \
                           b'engine="0"} 5' in r.read()
            except OSError:
                return False
        poll_until(scraped, what="metrics on the inherited HTTP socket")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "unused.sock")))
        self.assertEqual(d.stop(), 0)
        notify.wait_for("STOPPING=1")
        # The socket file belongs to the service manager: not unlinked.
        self.assertTrue(os.path.exists(ingest))
        self.assertIn(b"(inherited socket)", d.read_log())
        s.close()


class Notify(unittest.TestCase):
    def test_watchdog_pings_at_half_the_interval(self):
        d = Daemon("--log-interval", "0")
        self.addCleanup(d.cleanup)
        notify = NotifySocket(d.dir)
        self.addCleanup(notify.close)
        d.env = {"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "200000"}
        d.start()
        notify.wait_for("READY=1")
        start = time.monotonic()
        notify.wait_for("WATCHDOG=1", timeout=5)
        # Half the 200 ms interval is 100 ms; the bound leaves room for a
        # loaded CI machine (a run of the suite on 2 cores once took 1.1 s)
        # and still tells this interval from the daemon's own (half of
        # WatchdogSec=30, 15 s) or none.
        self.assertLess(time.monotonic() - start, 3.0)
        self.assertEqual(d.stop(), 0)


class Journal(unittest.TestCase):
    def test_every_stderr_line_has_a_priority_prefix_under_journald(self):
        d = Daemon("--log-interval", "0")
        self.addCleanup(d.cleanup)
        st = os.stat(d.log_path)  # the daemon's stderr
        d.env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        d.start()
        s = d.connect()
        s.sendall(b"\xc1")  # a warning line
        poll_until(lambda: b"invalid_msgpack" in d.read_log(),
                   what="warning line")
        self.assertEqual(d.stop(), 0)
        s.close()
        lines = d.read_log().decode().splitlines()
        self.assertGreater(len(lines), 2)
        for line in lines:
            self.assertRegex(line, r"^<[0-7]>[^<0-9]", line)
        self.assertTrue(any(l.startswith("<4>") for l in lines), lines)
        self.assertTrue(any(l.startswith("<6>") for l in lines), lines)

    def test_human_format_with_timestamps_otherwise(self):
        saved = os.environ.pop("JOURNAL_STREAM", None)
        if saved is not None:
            self.addCleanup(os.environ.__setitem__, "JOURNAL_STREAM", saved)
        with Daemon("--log-interval", "0") as d:
            line = d.read_log().decode().splitlines()[0]
        self.assertRegex(line, r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} info ")


class Units(unittest.TestCase):
    def render(self, d):
        with open(SERVICE_IN) as f:
            text = f.read().replace("@sbindir@", os.path.dirname(tu.DAEMON))
        text = text.replace("@sysconfdir@", d)
        with open(os.path.join(d, "tokenmeterd.service"), "w") as f:
            f.write(text)
        for name in ("tokenmeterd.socket", "tokenmeterd-http.socket"):
            shutil.copy(os.path.join(UNITS, name), d)

    def setUp(self):
        if not shutil.which("systemd-analyze"):
            self.skipTest("systemd-analyze is not installed")
        self.dir = tempfile.mkdtemp(prefix="tm-units-", dir="/tmp")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.render(self.dir)

    def test_verify(self):
        r = subprocess.run(
            ["systemd-analyze", "verify", "tokenmeterd.service",
             "tokenmeterd.socket", "tokenmeterd-http.socket"],
            cwd=self.dir, capture_output=True)
        self.assertEqual(r.returncode, 0, (r.stdout + r.stderr).decode())

    def test_security_exposure_at_most_2_5(self):
        r = subprocess.run(
            ["systemd-analyze", "security", "--offline=true", "--threshold=25",
             "tokenmeterd.service"],
            cwd=self.dir, capture_output=True)
        out = (r.stdout + r.stderr).decode()
        self.assertEqual(r.returncode, 0, out[-2000:])
        self.assertRegex(out, r"Overall exposure level for tokenmeterd.service: "
                              r"(0\.\d|1\.\d|2\.[0-5]) ")

    def test_service_sets_a_descriptor_limit_above_the_caps(self):
        # 1,024 engine + 256 HTTP connections by default, plus the
        # daemon's own: systemd's default soft limit (1,024) is too low.
        with open(os.path.join(self.dir, "tokenmeterd.service")) as f:
            limits = [line.split("=", 1)[1].strip() for line in f
                      if line.startswith("LimitNOFILE=")]
        self.assertEqual(limits, ["8192"])
        self.assertGreater(int(limits[0]), 1024 + 256 + 64)

    def test_restart_after_a_crash_comes_well_within_the_answer_wait(self):
        # The sockets stay with systemd, so an engine reconnects at once and
        # waits at most 1 s (the client's answer wait, protocol "ACK at
        # HELLO") for the new daemon: the restart delay plus a start must
        # fit in it, or the unsaved batches are discarded, not replayed.
        with open(os.path.join(self.dir, "tokenmeterd.service")) as f:
            lines = [line.strip() for line in f]
        self.assertIn("Restart=on-failure", lines)
        delays = [line.split("=", 1)[1] for line in lines
                  if line.startswith("RestartSec=")]
        self.assertEqual(len(delays), 1, delays)
        m = re.fullmatch(r"(\d+)(ms|s)?", delays[0])
        self.assertIsNotNone(m, delays[0])
        ms = int(m.group(1)) * (1 if m.group(2) == "ms" else 1000)
        self.assertLessEqual(ms, 250, delays[0])

    def test_socket_units_name_their_descriptors(self):
        with open(os.path.join(self.dir, "tokenmeterd.socket")) as f:
            ingest = f.read()
        with open(os.path.join(self.dir, "tokenmeterd-http.socket")) as f:
            http = f.read()
        self.assertIn("FileDescriptorName=ingest", ingest)
        self.assertIn("SocketMode=0660", ingest)
        self.assertIn("SocketGroup=tokenmeter", ingest)
        self.assertIn("ListenStream=/run/tokenmeter/ingest.sock", ingest)
        self.assertIn("FileDescriptorName=http", http)
        self.assertIn("ListenStream=10062", http)


if __name__ == "__main__":
    tu.DAEMON = os.path.abspath(sys.argv.pop(1))
    UNITS = os.path.abspath(sys.argv.pop(1))
    SERVICE_IN = os.path.abspath(sys.argv.pop(1))
    tu.main()
