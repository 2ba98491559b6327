#!/usr/bin/python3
"""Faults under load: the reference engine keeps running while tokenmeterd
is restarted underneath it.

GracefulRestart: the listening sockets are created and held by this test,
as systemd's socket units hold them, and each daemon gets them as
LISTEN_FDS (fds 3 and 4, named ingest and http). While a client runs (the
reference engine; then tokenmeter-loadgen at 200 k events/s) the daemon is
frozen for 0.3 s, so that unread batches pile up and the client's writes
block half-way, then stopped with SIGTERM, and a new one is started on the
same sockets; two and three times. Nothing may be lost: the events the
daemons applied (each logs "stopped: N events applied" at exit) add up to
exactly the events the client counted as written, with none dropped.

KillRestart: the daemon owns its socket (no parent holds it) and is
SIGKILLed while the engine runs, then restarted on the same path after a
pause. The engine must finish unharmed, its client must reconnect and
deliver to the new daemon; what was in the dead daemon's socket buffer
is lost, which this test only bounds. Throughput and reconnect time are
measured by bench/faults/restart_bench.py, not asserted here.

Environment: TOKENMETERD, TOKENMETER_ENGINE, PYTHONPATH with tests/e2e.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from harness import Daemon, batch, hello, poll_until
from prometheus_client.parser import text_string_to_metric_families

DAEMON = os.environ.get("TOKENMETERD", "")
ENGINE = os.environ.get("TOKENMETER_ENGINE", "")
LOADGEN = os.environ.get("TOKENMETER_LOADGEN", "")

# About 4 s of Poisson arrivals: a steady stream of events to restart under.
WORKLOAD = [
    "--requests", "400", "--rate", "100", "--prompt-len", "64",
    "--output-len", "32", "--seed", "5", "--backend", "cpu",
    "--model", "faults", "--instance", "f0", "--quiet",
]

STOPPED = re.compile(rb"stopped: (\d+) events applied, (\d+) frames")


def start_engine(socket_path, report_path):
    return subprocess.Popen(
        [ENGINE, *WORKLOAD, "--metrics-socket", socket_path,
         "--report", report_path],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish_engine(proc, report_path):
    out, err = proc.communicate(timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"engine exited {proc.returncode}: "
                             f"{err.decode()}")
    with open(report_path) as f:
        return json.load(f)


class HeldSockets:
    """The ingest (AF_UNIX) and http (TCP loopback) listeners, owned here
    for the whole test, handed to each daemon as fds 3 and 4."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "ingest.sock")
        self.ingest = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ingest.bind(self.path)
        self.ingest.listen(512)
        self.http = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.http.bind(("127.0.0.1", 0))
        self.http.listen(64)
        self.port = self.http.getsockname()[1]

    def spawn(self, log):
        ingest, http = self.ingest.fileno(), self.http.fileno()

        def to_3_and_4():
            # In the child: move the listeners to fds 3 and 4 (dup2 clears
            # close-on-exec) whatever numbers they had here.
            a, b = os.dup(ingest), os.dup(http)
            os.dup2(a, 3)
            os.dup2(b, 4)
        env = dict(os.environ, LISTEN_FDS="2", LISTEN_FDNAMES="ingest:http")
        # LISTEN_PID must be the daemon's pid: the shell sets it to its own
        # and then becomes the daemon.
        return subprocess.Popen(
            ["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$0" "$@"', DAEMON,
             "--log-interval", "0"],
            env=env, stdout=subprocess.DEVNULL, stderr=log,
            preexec_fn=to_3_and_4, pass_fds=(ingest, http))

    def close(self):
        self.ingest.close()
        self.http.close()


def read(path):
    with open(path, "rb") as f:
        return f.read()


class GracefulRestart(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tm-faults-", dir="/tmp")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.held = HeldSockets(self.dir)
        self.addCleanup(self.held.close)
        self.daemons = []

        def kill_all():
            for p, _ in self.daemons:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        self.addCleanup(kill_all)

    def start_daemon(self):
        log_path = os.path.join(self.dir, f"daemon{len(self.daemons)}.log")
        with open(log_path, "wb") as log:
            proc = self.held.spawn(log)
        self.daemons.append((proc, log_path))

        def ready():
            if proc.poll() is not None:
                raise AssertionError("daemon exited: " +
                                     read(log_path).decode())
            return b"(inherited socket)" in read(log_path)
        poll_until(ready, what="daemon on the held sockets")
        return proc, log_path

    def stop_daemon(self, proc, log_path, backlog_s=0):
        if backlog_s:
            # Freeze the daemon first so that unread batches pile up in its
            # sockets (and the client's writes block half-way): the stop
            # then has to read all that was written before it, and make
            # the client send again whatever it had not finished writing.
            proc.send_signal(signal.SIGSTOP)
            time.sleep(backlog_s)
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGCONT)
        else:
            proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=20), 0)
        m = STOPPED.search(read(log_path))
        self.assertIsNotNone(m, read(log_path).decode())
        return int(m.group(1))

    def scrape(self, name, **labels):
        """The sum of the samples of `name` whose labels include `labels`."""
        with socket.create_connection(("127.0.0.1", self.held.port),
                                      timeout=5) as c:
            c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
                      b"Connection: close\r\n\r\n")
            data = b""
            while chunk := c.recv(65536):
                data += chunk
        body = data.split(b"\r\n\r\n", 1)[1].decode()
        return sum(s.value for f in text_string_to_metric_families(body)
                   for s in f.samples
                   if s.name == name and labels.items() <= s.labels.items())

    def restart_under_load(self, client, restarts):
        """Starts a daemon, then `client` (a Popen reporting to the held
        socket), restarts the daemon `restarts` times with SIGTERM while
        the client runs, waits for the client to end; returns the events
        each daemon applied, in order, and the client's stdout."""
        proc, log_path = self.start_daemon()
        client_proc = client()
        applied = []
        for _ in range(restarts):
            # Restart only once events flow, so that each restart cuts a
            # live stream.
            before = self.scrape("tokenmeter_ingest_events_total")
            poll_until(lambda: self.scrape("tokenmeter_ingest_events_total")
                       > before, timeout=30, what="events reaching the daemon")
            time.sleep(0.3)
            self.assertIsNone(client_proc.poll(), "the client ended too soon")
            applied.append(self.stop_daemon(proc, log_path, backlog_s=0.3))
            proc, log_path = self.start_daemon()
        out, err = client_proc.communicate(timeout=120)
        self.assertEqual(client_proc.returncode, 0, err.decode())
        return applied, (proc, log_path), out

    def finish(self, applied, last, sent):
        # The client has closed (everything written): wait until the last
        # daemon has applied what it was sent, then stop it.
        try:
            poll_until(lambda: sum(applied) + self.scrape(
                "tokenmeter_ingest_events_total") >= sent, timeout=10,
                what="the last events applied")
        except AssertionError:
            pass  # events lost: the comparison below says how many
        applied.append(self.stop_daemon(*last))
        self.assertTrue(all(n > 0 for n in applied), applied)
        self.assertEqual(sum(applied), sent,
                         f"applied per daemon {applied}, sent {sent}")
        for p, path in self.daemons:
            self.assertEqual(p.returncode, 0, read(path).decode())

    def test_engine_across_two_sigterm_restarts_loses_nothing(self):
        report_path = os.path.join(self.dir, "report.json")
        applied, last, _ = self.restart_under_load(
            lambda: start_engine(self.held.path, report_path), 2)
        with open(report_path) as f:
            report = json.load(f)
        self.assertEqual(report["requests"], 400)
        self.assertEqual(report["client_dropped_events"], 0)
        self.assertGreaterEqual(report["client_reconnects"], 2)
        self.finish(applied, last, report["client_events_sent"])

    def test_200k_events_per_s_across_three_sigterm_restarts_lose_nothing(
            self):
        # The socket always holds unread batches here, so each stop has
        # to read what was written before it and refuse what comes after.
        applied, last, out = self.restart_under_load(
            lambda: subprocess.Popen(
                [LOADGEN, "--socket", self.held.path, "--rate", "200000",
                 "--duration", "4", "--buffer", str(1 << 20)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE), 3)
        r = json.loads(out)
        self.assertEqual(r["refused_full"], 0)
        self.assertEqual(r["events_dropped"], 0)
        self.assertEqual(r["events_sent"], r["appended"])
        self.assertGreaterEqual(r["reconnects"], 3)
        self.finish(applied, last, r["events_sent"])


class StopRace(unittest.TestCase):
    """A raw writer that never pauses, against a daemon frozen until the
    socket is full (the writer blocked half-way through a frame) and then
    told to stop: exactly the frames whose write returned are applied.
    The stop reads what is queued; the frame cut short fails with EPIPE in
    the writer and is discarded, not half-applied, by the daemon."""

    def test_every_frame_written_before_the_stop_is_applied(self):
        for attempt in range(5):
            d = Daemon("--log-interval", "0").start()
            self.addCleanup(d.cleanup)
            s = d.connect()
            s.sendall(hello(model="race"))
            sent = [1]  # frames fully written: HELLO, then each BATCH
            stop = threading.Event()

            def write():
                seq = 0
                try:
                    while not stop.is_set():
                        s.sendall(batch([[4, time.monotonic_ns(), seq, 1]],
                                        seq=seq))
                        sent[0] += 1
                        seq += 1
                except OSError:  # EPIPE or reset: the daemon stopped
                    pass
            writer = threading.Thread(target=write)
            writer.start()
            poll_until(lambda: (d.value("tokenmeter_ingest_frames_total")
                                or 0) > 100, what="frames flowing")
            d.proc.send_signal(signal.SIGSTOP)
            time.sleep(0.3)  # the writer fills the socket and blocks
            d.proc.send_signal(signal.SIGTERM)
            d.proc.send_signal(signal.SIGCONT)
            rc = d.proc.wait(timeout=20)
            stop.set()
            writer.join(timeout=20)
            s.close()
            self.assertEqual(rc, 0)
            m = STOPPED.search(d.read_log())
            self.assertIsNotNone(m, d.read_log().decode())
            self.assertEqual(int(m.group(2)), sent[0],
                             f"attempt {attempt}: frames applied vs written")
            self.assertEqual(int(m.group(1)), sent[0] - 1)


class KillRestart(unittest.TestCase):
    def test_engine_survives_sigkill_and_reconnects(self):
        d = Daemon("--log-interval", "0").start()
        self.addCleanup(d.cleanup)
        report_path = os.path.join(d.dir, "report.json")
        engine = start_engine(d.sock, report_path)
        poll_until(lambda: (d.value("tokenmeter_ingest_connections") or 0)
                   == 1, timeout=30, what="the engine connected")
        time.sleep(0.3)
        d.proc.kill()
        d.proc.wait()
        d.log.close()
        # The socket file is left behind, as after a crash; the new daemon
        # replaces it (no process listens on it).
        self.assertTrue(os.path.exists(d.sock))
        time.sleep(0.5)
        self.assertIsNone(engine.poll(), "the engine ended too soon")
        d.start()
        poll_until(lambda: (d.value("tokenmeter_ingest_connections") or 0)
                   == 1, timeout=30, what="the engine reconnected")
        report = finish_engine(engine, report_path)
        self.assertEqual(report["requests"], 400)
        self.assertGreaterEqual(report["client_reconnects"], 1)
        # The events buffered while no daemon listened were delivered:
        # the new daemon saw requests finish; only what sat in the killed
        # daemon's socket buffer can be missing.
        self.assertGreater(d.value("tokenmeter_ingest_events_total",
                                   kind="finished"), 0)
        self.assertEqual(report["client_dropped_events"], 0)
        self.assertEqual(d.stop(), 0)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[1:], verbosity=2)
