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
exactly the events the client counted as written, with none dropped. The
clients run with acknowledged delivery on (the default): a daemon stopped
by SIGTERM acks what it drained before it closes, so nothing is sent twice
to the next daemon (which has no --state-dir).

KillRestart: the daemon owns its socket (no parent holds it) and is
SIGKILLed while the engine runs, then restarted on the same path after a
pause. The engine must finish unharmed, its client must reconnect and
deliver to the new daemon; what was in the dead daemon's socket buffer
is lost, which this test only bounds. Throughput and reconnect time are
measured by bench/faults/restart_bench.py, not asserted here.

Environment: TOKENMETERD, TOKENMETER_ENGINE, TOKENMETER_LOADGEN.
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402
from tokenmeter_testutil import Daemon, batch, hello, poll_until  # noqa: E402

LOADGEN = os.environ.get("TOKENMETER_LOADGEN", "")

# About 4 s of Poisson arrivals: a steady stream of events to restart under.
WORKLOAD = [
    "--requests", "400", "--rate", "100", "--prompt-len", "64",
    "--output-len", "32", "--seed", "5", "--backend", "cpu",
    "--model", "faults", "--instance", "f0", "--quiet",
]


STOPPED = re.compile(rb"stopped: (\d+) events applied, (\d+) frames")


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

    def daemon(self):
        """A Daemon (not started) that gets these listeners as LISTEN_FDS."""
        ingest, http = self.ingest.fileno(), self.http.fileno()

        def to_3_and_4():
            # In the child: move the listeners to fds 3 and 4 (dup2 clears
            # close-on-exec) whatever numbers they had here.
            a, b = os.dup(ingest), os.dup(http)
            os.dup2(a, 3)
            os.dup2(b, 4)
        # LISTEN_PID must be the daemon's pid: the shell sets it to its own
        # and then becomes the daemon.
        return Daemon(
            "--log-interval", "0", ingest=None, listen=None,
            launcher=["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$0" "$@"'],
            env={"LISTEN_FDS": "2", "LISTEN_FDNAMES": "ingest:http"},
            preexec_fn=to_3_and_4, pass_fds=(ingest, http),
            prefix="tm-faults-")

    def close(self):
        self.ingest.close()
        self.http.close()


class GracefulRestart(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tm-faults-", dir="/tmp")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.held = HeldSockets(self.dir)
        self.addCleanup(self.held.close)
        self.daemons = []

    def start_daemon(self):
        d = self.held.daemon()
        self.addCleanup(d.cleanup)
        self.daemons.append(d)
        d.start()
        # Its ready line reports the sockets it inherited.
        self.assertEqual(d.ready_line, f"ready http=127.0.0.1:"
                         f"{self.held.port} ingest={self.held.path}")
        self.assertIn(b"(inherited socket)", d.read_log())
        return d

    def stop_daemon(self, d, backlog_s=0):
        if backlog_s:
            # Freeze the daemon first so that unread batches pile up in its
            # sockets (and the client's writes block half-way): the stop
            # then has to read all that was written before it, and make
            # the client send again whatever it had not finished writing.
            d.signal(signal.SIGSTOP)
            time.sleep(backlog_s)  # the freeze itself
            d.signal(signal.SIGTERM)
            d.signal(signal.SIGCONT)
            rc = d.wait()
        else:
            rc = d.stop()
        self.assertEqual(rc, 0)
        m = STOPPED.search(d.read_log())
        self.assertIsNotNone(m, d.read_log().decode())
        return int(m.group(1))

    def scrape(self, name, **labels):
        """The sum of the samples of `name` whose labels include `labels`."""
        return tu.scrape(self.held.port).sum(name, **labels)

    def restart_under_load(self, client, restarts):
        """Starts a daemon, then `client` (returns what it started, a Popen
        or a tu.Engine, reporting to the held socket), restarts the daemon
        `restarts` times with SIGTERM while the client runs; returns the
        events each daemon applied, in order, the last daemon and the
        client, for the caller to wait for."""
        d = self.start_daemon()
        client_proc = client()
        applied = []
        for _ in range(restarts):
            # Restart only once events flow, so that each restart cuts a
            # live stream.
            before = self.scrape("tokenmeter_ingest_events_total")
            poll_until(lambda: self.scrape("tokenmeter_ingest_events_total")
                       > before, timeout=30, what="events reaching the daemon")
            time.sleep(0.3)  # a stretch of the live stream before the cut
            self.assertIsNone(client_proc.poll(), "the client ended too soon")
            applied.append(self.stop_daemon(d, backlog_s=0.3))
            d = self.start_daemon()
        return applied, d, client_proc

    def finish(self, applied, last, sent):
        # The client has closed (everything written): wait until the last
        # daemon has applied what it was sent, then stop it.
        try:
            poll_until(lambda: sum(applied) + self.scrape(
                "tokenmeter_ingest_events_total") >= sent, timeout=10,
                what="the last events applied")
        except AssertionError:
            pass  # events lost: the comparison below says how many
        applied.append(self.stop_daemon(last))
        self.assertTrue(all(n > 0 for n in applied), applied)
        self.assertEqual(sum(applied), sent,
                         f"applied per daemon {applied}, sent {sent}")
        for d in self.daemons:
            self.assertEqual(d.proc.returncode, 0, d.read_log().decode())

    def test_engine_across_two_sigterm_restarts_loses_nothing(self):
        engine = tu.Engine(*WORKLOAD, socket=self.held.path, dir=self.dir)
        self.addCleanup(engine.cleanup)
        applied, last, _ = self.restart_under_load(engine.start, 2)
        report = engine.report(timeout=120)
        self.assertEqual(report["requests"], 400)
        self.assertEqual(report["client_dropped_events"], 0)
        self.assertGreaterEqual(report["client_reconnects"], 2)
        self.finish(applied, last, report["client_events_sent"])

    def test_200k_events_per_s_across_three_sigterm_restarts_lose_nothing(
            self):
        # The socket always holds unread batches here, so each stop has
        # to read what was written before it and refuse what comes after.
        applied, last, loadgen = self.restart_under_load(
            lambda: subprocess.Popen(
                [LOADGEN, "--socket", self.held.path, "--rate", "200000",
                 "--duration", "4", "--buffer", str(1 << 20)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE), 3)
        out, err = loadgen.communicate(timeout=120)
        self.assertEqual(loadgen.returncode, 0, err.decode())
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
            d.signal(signal.SIGSTOP)
            # The freeze itself: long enough for the writer to fill the
            # socket and block half-way through a frame.
            time.sleep(0.3)
            d.signal(signal.SIGTERM)
            d.signal(signal.SIGCONT)
            rc = d.wait()
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
        engine = tu.Engine(*WORKLOAD, socket=d.sock, dir=d.dir).start()
        self.addCleanup(engine.cleanup)
        engine.wait_ready(d, timeout=30)  # connected: the daemon saw HELLO
        time.sleep(0.3)  # events flow for a while, then the crash
        d.kill()
        # The socket file is left behind, as after a crash; the new daemon
        # replaces it (no process listens on it).
        self.assertTrue(os.path.exists(d.sock))
        time.sleep(0.5)  # the pause without a daemon
        self.assertIsNone(engine.poll(), "the engine ended too soon")
        d.start()
        poll_until(lambda: (d.value("tokenmeter_ingest_connections") or 0)
                   == 1, timeout=30, what="the engine reconnected")
        report = engine.report(timeout=120)
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
    tu.main()
