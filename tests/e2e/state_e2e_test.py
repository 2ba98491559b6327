#!/usr/bin/python3
"""State snapshots (--state-dir) and acknowledged delivery across daemon
restarts, end to end: hand-written frames, a real tokenmeterd restarted with
SIGTERM and killed with SIGKILL, real HTTP scrapes.

Usage: state_e2e_test.py TOKENMETERD [unittest args]
"""
import glob
import grp
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import msgpack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402
from tokenmeter_testutil import Daemon, batch, hello, poll_until  # noqa: E402

MS = 1_000_000
LAB = dict(model_name="m", engine="e")


class AckReader:
    """The ACK frames of one ack connection, read as they come."""

    def __init__(self, sock):
        self.sock = sock
        self.unpacker = msgpack.Unpacker(raw=False)
        self.acked = None

    def read(self, timeout):
        """Reads for up to `timeout` s; returns the highest seq acked."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                break
            if not data:
                break
            self.unpacker.feed(data)
            for f in self.unpacker:
                assert f[0] == 3 and len(f) == 2, f
                assert self.acked is None or f[1] >= self.acked, f
                self.acked = f[1]
        return self.acked

    def wait_for(self, seq, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.read(0.1) is not None and self.acked >= seq:
                return
        raise AssertionError(f"no ACK of seq {seq} (last {self.acked})")


class StateDir(unittest.TestCase):
    """Each test owns a state directory, an ingest path and a boot-id file
    that outlive the daemons it starts."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tm-state-", dir="/tmp")
        self.state = os.path.join(self.tmp, "state")
        self.sock_path = os.path.join(self.tmp, "i.sock")
        self.boot = os.path.join(self.tmp, "boot_id")
        with open(self.boot, "w") as f:
            f.write("11111111-2222-3333-4444-555555555555\n")
        self.daemons = []

    def tearDown(self):
        for d in self.daemons:
            d.cleanup()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # The daemon's launcher (Trust: setpriv to another user).
    launcher = ()

    def start(self, *extra, interval="0.1", timeout=tu.READY_TIMEOUT_S):
        d = Daemon("--log-interval", "0", "--state-dir", self.state,
                   "--snapshot-interval", interval, "--boot-id-file",
                   self.boot, *extra, ingest=self.sock_path,
                   launcher=self.launcher)
        self.daemons.append(d)
        return d.start(timeout=timeout)

    def connect(self, d, session, seq_from=None):
        s = d.connect()
        s.sendall(hello(instance="e", session=session, ack=True))
        return s

    def set_aside(self):
        return glob.glob(os.path.join(self.state, "snapshot.set-aside.*"))

    def write_state(self):
        """A good snapshot (one request arrived), its daemon stopped."""
        d = self.start()
        s = self.connect(d, 1)
        s.sendall(batch([[1, time.monotonic_ns(), 1, 5]], seq=0))
        AckReader(s).wait_for(0)
        s.close()
        self.assertEqual(d.stop(), 0)
        return os.path.join(self.state, "snapshot")

    def assert_set_aside(self, d, reason):
        """Nothing restored, the file renamed, one warning with `reason`."""
        self.assertEqual(d.value("tokenmeter_state_restored"), 0)
        self.assertEqual(d.value("tokenmeter_ingest_events_total",
                                 kind="arrived"), 0)
        self.assertEqual(len(self.set_aside()), 1, os.listdir(self.state))
        log = d.read_log().decode(errors="replace")
        lines = [ln for ln in log.splitlines() if "not restored" in ln]
        self.assertEqual(len(lines), 1, log)
        self.assertIn(reason, lines[0])
        self.assertIn("warn", lines[0])


class Restart(StateDir):
    def test_sigterm_restart_keeps_requests_in_flight_and_counters(self):
        """A request in flight across a graceful restart gets its TTFT, e2e
        and queue observations; counters go on from where they were."""
        t0 = time.monotonic_ns() - 2_000 * MS
        session = 0x5eed
        d = self.start()
        self.assertEqual(d.value("tokenmeter_state_restored"), 0)
        s = self.connect(d, session)
        s.sendall(batch([[1, t0, "r1", 10], [1, t0, "done", 3]], seq=0))
        # seq 1 holds an event the decoder skips (a KV_TRANSFER whose
        # start is after its time): counted once, not again at the replay.
        bad = [10, t0 + 2 * MS, "done", {"role": "send", "start": t0 + 3 * MS}]
        s.sendall(batch([[3, t0 + 3 * MS, "r1"], [3, t0 + 1 * MS, "done"],
                         bad, [4, t0 + 2 * MS, "done", 1],
                         [5, t0 + 4 * MS, "done", "stop"]], seq=1))
        acks = AckReader(s)
        acks.wait_for(1)
        self.assertEqual(d.value("tokenmeter_ingest_errors_total",
                                 reason="bad_event"), 1)
        d.wait_value("vllm:request_success_total", 1, finished_reason="stop",
                     **LAB)
        d.value("vllm:num_requests_running", **LAB)
        self.assertEqual(d.stop(), 0)
        s.close()
        self.assertIn(b"state: wrote", d.read_log())

        d2 = self.start()
        self.assertEqual(d2.value("tokenmeter_state_restored"), 1)
        self.assertIn(b"state: restored", d2.read_log())
        self.assertEqual(d2.value("vllm:request_success_total",
                                  finished_reason="stop", **LAB), 1)
        self.assertEqual(d2.value("tokenmeter_ingest_events_total",
                                  kind="arrived"), 2)
        self.assertEqual(d2.value("vllm:num_requests_running", **LAB), 1)
        self.assertEqual(d2.value("tokenmeter_ingest_errors_total",
                                  reason="bad_event"), 1)
        s2 = self.connect(d2, session)
        # The ACK of seq 1 may have been lost: the client sends it again.
        s2.sendall(batch([[3, t0 + 3 * MS, "r1"], [3, t0 + 1 * MS, "done"],
                          bad, [4, t0 + 2 * MS, "done", 1],
                          [5, t0 + 4 * MS, "done", "stop"]], seq=1))
        s2.sendall(batch([[4, t0 + 8 * MS, "r1", 1],
                          [5, t0 + 20 * MS, "r1", "stop"]], seq=2))
        AckReader(s2).wait_for(2)
        d2.wait_value("vllm:request_success_total", 2, finished_reason="stop",
                      **LAB)
        self.assertEqual(d2.value("tokenmeter_ingest_duplicate_batches_total"),
                         1)
        self.assertEqual(d2.value("tokenmeter_ingest_errors_total",
                                  reason="bad_event"), 1)
        self.assertEqual(d2.value("vllm:time_to_first_token_seconds_sum",
                                  **LAB), (2 * MS + 8 * MS) / 1e9)
        self.assertEqual(d2.value("vllm:e2e_request_latency_seconds_sum",
                                  **LAB), (4 * MS + 20 * MS) / 1e9)
        self.assertEqual(d2.value("vllm:request_queue_time_seconds_sum",
                                  **LAB), (1 * MS + 3 * MS) / 1e9)
        self.assertEqual(d2.value("vllm:num_requests_running", **LAB), 0)
        self.assertEqual(d2.value("tokenmeter_incomplete_intervals_total",
                                  interval="time_to_first_token"), 0)
        self.assertGreaterEqual(
            d2.value("tokenmeter_state_snapshots_total", result="ok"), 2)
        s2.close()

    def test_sigkill_replay_is_exactly_once(self):
        """SIGKILL five times while a client sends: it replays what was not
        acked; the daemon applies each batch once."""
        t0 = time.monotonic_ns() - 60_000 * MS
        session = 77
        sent = []  # (seq, frame bytes) not yet acked
        seq = 0
        n_requests = 0
        for round_ in range(5):
            d = self.start()
            s = self.connect(d, session)
            acks = AckReader(s)
            for _, frame in sent:  # the replay, in order
                s.sendall(frame)
            for _ in range(40):
                rid = n_requests
                n_requests += 1
                ev = [[1, t0 + rid, rid, 5], [4, t0 + rid + 1000, rid, 2],
                      [5, t0 + rid + 3000, rid, "length"]]
                frame = batch(ev, seq=seq)
                sent.append((seq, frame))
                seq += 1
                s.sendall(frame)
                if acks.read(0.003) is not None:
                    sent = [(q, f) for q, f in sent if q > acks.acked]
            d.kill()
            s.close()
        d = self.start()
        s = self.connect(d, session)
        acks = AckReader(s)
        for _, frame in sent:
            s.sendall(frame)
        acks.wait_for(seq - 1)
        self.assertEqual(d.value("vllm:request_success_total",
                                 finished_reason="length", **LAB), n_requests)
        self.assertEqual(d.value("vllm:generation_tokens_total", **LAB),
                         2 * n_requests)
        self.assertEqual(d.value("vllm:e2e_request_latency_seconds_count",
                                 **LAB), n_requests)
        self.assertEqual(d.value("vllm:e2e_request_latency_seconds_sum",
                                 **LAB), n_requests * 3000 / 1e9)
        self.assertEqual(d.value("tokenmeter_ingest_events_total",
                                 kind="arrived"), n_requests)
        self.assertEqual(self.set_aside(), [])
        s.close()

    def test_first_summary_window_after_a_restore_starts_at_the_restore(self):
        """The restored totals are not one window's throughput: the first
        summary line after a restart shows what came since."""
        t0 = time.monotonic_ns() - 1_000 * MS
        d = self.start()
        s = self.connect(d, 3)
        s.sendall(batch([[1, t0, 1, 500], [4, t0 + MS, 1, 1000],
                         [5, t0 + 2 * MS, 1, "stop"]], seq=0))
        AckReader(s).wait_for(0)
        s.close()
        self.assertEqual(d.stop(), 0)
        d2 = Daemon("--log-interval", "0.3", "--state-dir", self.state,
                    "--boot-id-file", self.boot, ingest=self.sock_path)
        self.daemons.append(d2)
        d2.start()
        self.assertEqual(d2.value("vllm:generation_tokens_total", **LAB),
                         1000)
        poll_until(lambda: b"Avg generation throughput" in d2.read_log(),
                   timeout=10, what="a summary line")
        line = [ln for ln in d2.read_log().decode().splitlines()
                if "Avg generation throughput" in ln][0]
        self.assertIn("Avg prompt throughput: 0.0 tokens/s, Avg generation "
                      "throughput: 0.0 tokens/s", line)

    def test_ack_waits_for_the_snapshot(self):
        """With --state-dir an ACK names only what a snapshot on disk holds:
        none comes before the first snapshot interval has passed."""
        d = self.start(interval="30")
        s = self.connect(d, 9)
        s.sendall(batch([[1, time.monotonic_ns(), 1, 5]], seq=0))
        d.wait_value("tokenmeter_ingest_events_total", 1, kind="arrived")
        acks = AckReader(s)
        self.assertIsNone(acks.read(1.0))
        self.assertFalse(os.path.exists(os.path.join(self.state, "snapshot")))
        s.close()
        d.stop()
        d2 = self.start(interval="0.2")
        s = self.connect(d2, 10)
        s.sendall(batch([[1, time.monotonic_ns(), 2, 5]], seq=0))
        acks = AckReader(s)
        acks.wait_for(0)
        self.assertTrue(os.path.exists(os.path.join(self.state, "snapshot")))
        s.close()

    def test_v1_client_and_no_state_dir_as_before(self):
        """Without --state-dir nothing is written and the restored gauge is
        0; a v1 client (no session) is served as before."""
        with Daemon("--log-interval", "0") as d:
            s = d.connect()
            s.sendall(hello(instance="e"))
            t0 = time.monotonic_ns() - 100 * MS
            s.sendall(batch([[1, t0, 1, 5], [4, t0 + MS, 1, 1],
                             [5, t0 + 2 * MS, 1, "stop"]]))
            d.wait_value("vllm:request_success_total", 1,
                         finished_reason="stop", **LAB)
            self.assertEqual(d.value("tokenmeter_state_restored"), 0)
            self.assertEqual(d.value("tokenmeter_state_snapshots_total",
                                     result="ok"), 0)
            s.settimeout(0.3)
            with self.assertRaises(socket.timeout):
                s.recv(1)
            s.close()


FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                       "data", "snapshot_v2")
# Lines a restart changes by itself: the process, the scrapes, the state
# counters.
VOLATILE = ("process_", "tokenmeter_scrape_duration_seconds",
            "tokenmeter_http_responses", "tokenmeter_state_")


def stable_lines(text):
    return [l for l in text.splitlines()
            if not any(l.startswith(p) or l.startswith("# HELP " + p) or
                       l.startswith("# TYPE " + p) for p in VOLATILE)]


class OldFormat(StateDir):
    """A snapshot of format 2, written by tokenmeterd of commit 162d07b
    (tests/e2e/make_old_snapshot.py made tests/data/snapshot_v2/), loads
    in this daemon: the exposition is the one that daemon served, and the
    snapshot this one writes at stop (format 7) loads again.
    Series added since (ADDED_SINCE_V2: a sample, or a family of protocol
    1.2 shown for every series) read 0 and are left out of the
    comparison."""

    ADDED_SINCE_V2 = (
        'tokenmeter_ingest_errors_total{reason="bad_field"} ',
        'tokenmeter_incomplete_intervals_total{interval="kv_wait_time"} ',
        'tokenmeter_negative_intervals_total{interval="kv_wait_time"} ')
    FAMILIES_SINCE_V2 = (
        ":prompt_tokens_by_source_total", ":prompt_tokens_cached_total",
        ":request_prefill_kv_computed_tokens", ":request_num_preemptions",
        ":request_kv_wait_time_seconds", "lmdeploy:cached_tokens_total",
        ":request_cached_tokens", ":request_cache_hit_ratio",
        'tokenmeter_ingest_events_total{kind="admission_rejected"}',
        'tokenmeter_ingest_events_total{kind="kv_transfer"}',
        'tokenmeter_ingest_events_total{kind="sleep"}',
        # Protocol 1.3's kinds.
        'tokenmeter_ingest_events_total{kind="request_summary"}',
        'tokenmeter_ingest_events_total{kind="latencies"}')

    def stable_old_lines(self, text):
        lines = stable_lines(text)
        added = [l for l in lines if l.startswith(self.ADDED_SINCE_V2)]
        self.assertEqual([l.rsplit(" ", 1)[1] for l in added],
                         ["0"] * len(self.ADDED_SINCE_V2), added)
        new = [l for l in lines if any(f in l.split(" ")[2 if l.startswith(
            "#") else 0] for f in self.FAMILIES_SINCE_V2)]
        for line in new:
            if not line.startswith("#"):
                self.assertEqual(line.rsplit(" ", 1)[1], "0", line)
        self.assertGreater(len(new), 0)
        return [l for l in lines if l not in added and l not in new]

    def test_format_2_loads_with_the_same_exposition(self):
        os.makedirs(self.state)
        shutil.copyfile(os.path.join(FIXTURE, "snapshot"),
                        os.path.join(self.state, "snapshot"))
        shutil.copyfile(os.path.join(FIXTURE, "boot_id"), self.boot)
        with open(os.path.join(FIXTURE, "args")) as f:
            args = f.read().split()
        with open(os.path.join(FIXTURE, "exposition.txt")) as f:
            want = stable_lines(f.read())
        with open(os.path.join(FIXTURE, "snapshot"), "rb") as f:
            self.assertEqual(f.read(12)[8:], b"\x02\0\0\0")  # format 2
        d = self.start(*args)
        self.assertEqual(d.value("tokenmeter_state_restored"), 1,
                         d.read_log())
        self.assertEqual(self.set_aside(), [])
        got = self.stable_old_lines(d.metrics_text())
        self.assertEqual(got, want)
        self.assertGreater(len(want), 1000)
        self.assertEqual(d.stop(), 0)
        with open(os.path.join(self.state, "snapshot"), "rb") as f:
            self.assertEqual(f.read(12)[8:], b"\x07\0\0\0")  # format 7
        d2 = self.start(*args)
        self.assertEqual(d2.value("tokenmeter_state_restored"), 1)
        self.assertEqual(self.stable_old_lines(d2.metrics_text()), want)


class SetAside(StateDir):
    def test_another_boot(self):
        self.write_state()
        with open(self.boot, "w") as f:
            f.write("99999999-2222-3333-4444-555555555555\n")
        self.assert_set_aside(self.start(), "another boot")

    def test_other_buckets(self):
        self.write_state()
        conf = os.path.join(self.tmp, "d.conf")
        with open(conf, "w") as f:
            f.write("buckets.time_to_first_token_seconds = 0.1, 1, 10\n")
        self.assert_set_aside(self.start("--config", conf),
                              "other histogram buckets")

    def test_other_request_labels_and_profile(self):
        self.write_state()
        self.assert_set_aside(self.start("--request-label", "tenant"),
                              "other request labels")
        for d in self.daemons:
            d.stop()
        # The fresh state the last daemon wrote at stop, then --profile.
        for f in self.set_aside():
            os.unlink(f)
        self.assert_set_aside(
            self.start("--request-label", "tenant", "--profile", "sglang"),
            "other naming profile")

    def test_corrupt_truncated_empty_and_foreign_files(self):
        path = self.write_state()
        with open(path, "rb") as f:
            good = f.read()
        flipped = bytearray(good)
        flipped[len(good) // 2] ^= 0x40
        cases = {"truncated": good[:len(good) - 3],
                 "a flipped bit": bytes(flipped),
                 "empty": b"",
                 "foreign": b"not a snapshot at all\n" * 10}
        for what, data in cases.items():
            with self.subTest(case=what):
                for f in self.set_aside():
                    os.unlink(f)
                with open(path, "wb") as f:
                    f.write(data)
                d = self.start()
                self.assert_set_aside(d, "")
                # A fresh daemon still works and writes a good snapshot.
                d.stop()

    def test_a_set_aside_file_is_never_replaced(self):
        # Files already set aside in the seconds around this start (as two
        # set-asides in one second would leave them): the new one takes
        # another name, and each keeps its bytes.
        path = self.write_state()
        now = int(time.time())
        old = {}
        for t in range(now - 1, now + 6):
            name = os.path.join(self.state, f"snapshot.set-aside.{t}")
            old[name] = f"earlier {t}\n".encode()
            with open(name, "wb") as f:
                f.write(old[name])
        with open(path, "wb") as f:
            f.write(b"not a snapshot at all\n")
        d = self.start()
        self.assertEqual(d.value("tokenmeter_state_restored"), 0)
        for name, data in old.items():
            with open(name, "rb") as f:
                self.assertEqual(f.read(), data, name)
        new = set(self.set_aside()) - set(old)
        self.assertEqual(len(new), 1, os.listdir(self.state))
        with open(new.pop(), "rb") as f:
            self.assertEqual(f.read(), b"not a snapshot at all\n")
        d.stop()

    def test_bad_flags_and_paths(self):
        for args, needle in (
                (["--snapshot-interval", "0"], "--snapshot-interval"),
                (["--snapshot-interval", "abc"], "--snapshot-interval"),
                (["--state-dir", ""], "--state-dir"),
                (["--state-dir", self.boot], "not a directory"),
                (["--state-dir", self.state, "--boot-id-file",
                  os.path.join(self.tmp, "missing")], "--boot-id-file"),
                (["--state-dir", os.path.join(self.tmp, "no", "such")],
                 "--state-dir")):
            with self.subTest(args=args):
                r = subprocess.run([tu.DAEMON, "--ingest", self.sock_path,
                                    "--listen", "127.0.0.1:0", *args],
                                   capture_output=True, timeout=20)
                self.assertNotEqual(r.returncode, 0)
                err = r.stderr.decode()
                self.assertIn(needle, err)


def daemon_users():
    """Whom Trust runs the daemon as: the test's own user, and when that is
    root, also nobody:nogroup through setpriv (as a packaged unit's
    User= would). (name, uid, gid, launcher)."""
    users = [("self", os.getuid(), os.getgid(), ())]
    if os.getuid() == 0:
        users.append(("nobody", pwd.getpwnam("nobody").pw_uid,
                      grp.getgrnam("nogroup").gr_gid,
                      ("setpriv", "--reuid=nobody", "--regid=nogroup",
                       "--clear-groups")))
    return users


class Trust(StateDir):
    """What the daemon trusts in its state directory (docs/operations.md,
    "Who can reach what"): only a directory of its own uid, writable by no
    one else; in it only a regular file of that uid, writable by no one
    else, no larger than the caps allow; nothing followed, nothing opened
    that could block. Each test runs the daemon as the test's user and,
    under root, also as nobody."""

    def for_each_user(self, body):
        """Runs body() once per daemon user, as a subtest, with a fresh
        state directory that user owns (mode 0750) and self.launcher,
        self.uid and self.gid set."""
        for name, uid, gid, launcher in daemon_users():
            with self.subTest(user=name):
                for d in self.daemons:
                    d.cleanup()
                self.daemons = []
                shutil.rmtree(self.state, ignore_errors=True)
                os.mkdir(self.state, 0o750)
                os.chmod(self.state, 0o750)
                for path in (self.tmp, self.state):
                    os.chown(path, uid, gid)
                os.chmod(self.tmp, 0o755)
                self.uid, self.gid, self.launcher = uid, gid, launcher
                body()

    def refused(self, *extra):
        """Runs the daemon to its exit; returns (code, stderr)."""
        r = subprocess.run([*self.launcher, tu.DAEMON, "--ingest",
                            self.sock_path, "--listen", "127.0.0.1:0",
                            "--state-dir", self.state, "--boot-id-file",
                            self.boot, *extra],
                           capture_output=True, timeout=20)
        return r.returncode, r.stderr.decode()

    @staticmethod
    def error_lines(err):
        """stderr's lines but the info lines of the start."""
        return [ln for ln in err.splitlines() if " info " not in ln]

    def test_fifo_at_snapshot_is_set_aside_and_the_daemon_listens(self):
        """Today: start-up blocks in open() forever, nothing logged."""
        def body():
            path = os.path.join(self.state, "snapshot")
            os.mkfifo(path, 0o600)
            os.chown(path, self.uid, self.gid)
            d = self.start(timeout=10)  # ready, or AssertionError
            self.assert_set_aside(d, "a FIFO")
            self.assertEqual(d.stop(), 0)
        self.for_each_user(body)

    def test_fifo_at_snapshot_tmp_neither_blocks_writes_nor_stop(self):
        """Today: the first write blocks a pool thread in open(); SIGTERM
        then logs "stopped" and the process never exits."""
        def body():
            tmp = os.path.join(self.state, "snapshot.tmp")
            os.mkfifo(tmp, 0o600)
            os.chown(tmp, self.uid, self.gid)
            d = self.start()
            poll_until(lambda: d.value("tokenmeter_state_snapshots_total",
                                       result="ok") >= 2,
                       what="two snapshots written past the FIFO")
            t0 = time.monotonic()
            self.assertEqual(d.stop(timeout=10), 0)
            self.assertLess(time.monotonic() - t0, 5)
            self.assertFalse(os.path.exists(tmp))
            self.assertTrue(os.path.isfile(os.path.join(self.state,
                                                        "snapshot")))
        self.for_each_user(body)

    def test_symlink_at_snapshot_tmp_is_not_written_through(self):
        """Today: the snapshot overwrites whatever file the link names."""
        def body():
            victim = os.path.join(self.tmp, "victim")
            with open(victim, "w") as f:
                f.write("precious\n")
            os.chown(victim, self.uid, self.gid)
            os.symlink(victim, os.path.join(self.state, "snapshot.tmp"))
            d = self.start(interval="3600")  # the one write at stop
            self.assertEqual(d.stop(), 0)
            with open(victim, "rb") as f:
                self.assertEqual(f.read(), b"precious\n")
            path = os.path.join(self.state, "snapshot")
            self.assertTrue(os.path.isfile(path) and
                            not os.path.islink(path))
            self.assertFalse(os.path.lexists(path + ".tmp"))
        self.for_each_user(body)

    def test_symlink_to_a_snapshot_elsewhere_is_set_aside(self):
        """Today: the link is followed and the snapshot restored."""
        def body():
            path = self.write_state()
            elsewhere = os.path.join(self.tmp, "elsewhere")
            os.rename(path, elsewhere)
            os.symlink(elsewhere, path)
            self.assert_set_aside(self.start(), "symbolic link")
            self.assertTrue(os.path.isfile(elsewhere))  # left alone
        self.for_each_user(body)

    def test_group_or_other_writable_snapshot_is_set_aside(self):
        """Today: a mode-0666 snapshot is loaded."""
        def body():
            for mode in (0o666, 0o620):
                with self.subTest(mode=oct(mode)):
                    for f in self.set_aside():
                        os.unlink(f)
                    path = self.write_state()
                    os.chmod(path, mode)
                    d = self.start()
                    self.assert_set_aside(d, "writable by its group or "
                                          "others")
                    d.stop()
        self.for_each_user(body)

    def test_snapshot_of_another_uid_is_set_aside(self):
        """Today: a snapshot of another uid is loaded."""
        if os.getuid() != 0:
            self.skipTest("chown to another uid needs root")
        def body():
            path = self.write_state()
            other = 0 if self.uid != 0 else pwd.getpwnam("nobody").pw_uid
            os.chown(path, other, self.gid)
            os.chmod(path, 0o644)
            self.assert_set_aside(self.start(), f"owned by uid {other}")
        self.for_each_user(body)

    def test_oversize_sparse_snapshot_is_set_aside_unread(self):
        """Today: a 2 GiB sparse file is read whole (2 GiB resident)."""
        def body():
            path = os.path.join(self.state, "snapshot")
            with open(path, "wb") as f:
                f.write(b"TMSTATE\n")
                f.truncate(2 << 30)
            os.chown(path, self.uid, self.gid)
            t0 = time.monotonic()
            d = self.start()
            started_s = time.monotonic() - t0
            with open(f"/proc/{d.proc.pid}/status") as f:
                hwm_kib = int(next(ln for ln in f
                                   if ln.startswith("VmHWM:")).split()[1])
            self.assert_set_aside(d, "more than the")
            self.assertLess(hwm_kib, 512 * 1024)
            self.assertLess(started_s, 5)
        self.for_each_user(body)

    def test_unsafe_state_dir_is_refused_at_start(self):
        """Today: any directory the daemon can write is used."""
        def body():
            for mode in (0o770, 0o757, 0o1777):
                with self.subTest(mode=oct(mode)):
                    os.chmod(self.state, mode)
                    code, err = self.refused()
                    self.assertEqual(code, 1, err)
                    lines = self.error_lines(err)
                    self.assertEqual(len(lines), 1, err)
                    self.assertIn("--state-dir: " + self.state, lines[0])
                    self.assertIn("writable by its group or others",
                                  lines[0])
                    self.assertIn("--state-dir-unsafe-ok", lines[0])
            # The operator's word: one warning, then as usual.
            d = self.start("--state-dir-unsafe-ok")
            log = d.read_log().decode(errors="replace")
            self.assertEqual(log.count("--state-dir-unsafe-ok"), 1, log)
            self.assertEqual(d.stop(), 0)
            os.chmod(self.state, 0o750)
        self.for_each_user(body)

    def test_state_dir_of_another_uid_is_refused_at_start(self):
        """Today: used as long as the daemon can write it."""
        if os.getuid() != 0:
            self.skipTest("chown to another uid needs root")
        def body():
            other = 0 if self.uid != 0 else pwd.getpwnam("nobody").pw_uid
            os.chown(self.state, other, self.gid)
            os.chmod(self.state, 0o777 if self.uid != 0 else 0o750)
            code, err = self.refused()
            self.assertEqual(code, 1, err)
            lines = self.error_lines(err)
            self.assertEqual(len(lines), 1, err)
            self.assertIn(f"is owned by uid {other}", lines[0])
        self.for_each_user(body)


if __name__ == "__main__":
    tu.DAEMON = os.path.abspath(sys.argv.pop(1))
    tu.main()
