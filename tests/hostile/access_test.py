#!/usr/bin/python3
"""Access control of the ingest socket, against the real daemon:
--ingest-group gives the socket file its group; --allow-uids/--allow-gids
check each peer with SO_PEERCRED at accept; a rejected peer is closed,
counted as ingest_errors{reason="peer_not_allowed"} and logged by pid, uid
and gid.

Usage: access_test.py TOKENMETERD [unittest args]
"""
import grp
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402
from tokenmeter_testutil import Daemon, batch, hello, wait_closed  # noqa: E402

UID = os.getuid()
GID = os.getgid()
OTHER = 54321  # an id that is neither ours nor anyone's


def send_and_count(d):
    """Sends HELLO + one TOKENS event; True when the daemon applied it."""
    s = d.connect()
    s.sendall(hello())
    s.sendall(batch([[4, time.monotonic_ns(), 1, 1]]))
    d.wait_value("vllm:generation_tokens_total", 1, model_name="m",
                 engine="0")
    s.close()
    return True


class AllowList(unittest.TestCase):
    def run_daemon(self, *args):
        d = Daemon("--log-interval", "0", *args).start()
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        return d

    def test_uid_not_listed_is_rejected_counted_and_logged(self):
        d = self.run_daemon("--allow-uids", f"{OTHER},{OTHER + 1}")
        s = d.connect()
        try:
            s.sendall(hello())
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon may close before our first write
        self.assertTrue(wait_closed(s))
        s.close()
        d.wait_value("tokenmeter_ingest_errors_total", 1,
                     reason="peer_not_allowed")
        self.assertEqual(d.value("tokenmeter_ingest_frames_total"), 0)
        log = d.read_log().decode()
        self.assertRegex(
            log, rf"peer#1 pid={os.getpid()} uid={UID} gid={GID}: closing "
                 r"the connection: peer_not_allowed")
        self.assertEqual(d.value("tokenmeter_ingest_connections"), 0)

    def test_uid_listed_is_accepted(self):
        d = self.run_daemon("--allow-uids", f"{OTHER},{UID}")
        self.assertTrue(send_and_count(d))
        self.assertEqual(d.value("tokenmeter_ingest_errors_total",
                                 reason="peer_not_allowed"), 0)

    def test_gid_listed_is_accepted_when_uid_is_not(self):
        d = self.run_daemon("--allow-uids", str(OTHER),
                            "--allow-gids", f"{GID}")
        self.assertTrue(send_and_count(d))

    def test_gid_not_listed_is_rejected(self):
        d = self.run_daemon("--allow-gids", str(OTHER))
        s = d.connect()
        self.assertTrue(wait_closed(s))
        s.close()
        d.wait_value("tokenmeter_ingest_errors_total", 1,
                     reason="peer_not_allowed")

    def test_no_list_accepts_everyone(self):
        d = self.run_daemon()
        self.assertTrue(send_and_count(d))

    def test_rejected_peers_do_not_disturb_an_allowed_one(self):
        d = self.run_daemon("--allow-uids", str(UID))
        good = d.connect()
        good.sendall(hello())
        # A peer with another uid: run a child under setpriv when root.
        if UID == 0 and shutil.which("setpriv"):
            os.chmod(d.dir, 0o755)
            os.chmod(d.sock, 0o666)
            script = ("import socket,sys;s=socket.socket(socket.AF_UNIX);"
                      "s.connect(sys.argv[1]);s.settimeout(5);"
                      "sys.exit(0 if s.recv(1)==b'' else 1)")
            for _ in range(3):
                subprocess.run(
                    ["setpriv", f"--reuid={OTHER}", f"--regid={OTHER}",
                     "--clear-groups", "/usr/bin/python3", "-c", script,
                     d.sock], check=True, timeout=10)
            d.wait_value("tokenmeter_ingest_errors_total", 3,
                         reason="peer_not_allowed")
            self.assertRegex(d.read_log().decode(),
                             rf"uid={OTHER} gid={OTHER}: closing the "
                             r"connection: peer_not_allowed")
        good.sendall(batch([[4, time.monotonic_ns(), 1, 2]]))
        d.wait_value("vllm:generation_tokens_total", 2, model_name="m",
                     engine="0")
        good.close()


class IngestGroup(unittest.TestCase):
    def test_socket_gets_the_group_and_mode_0660(self):
        group = grp.getgrgid(65534).gr_name if UID == 0 else \
            grp.getgrgid(GID).gr_name
        with Daemon("--log-interval", "0", "--ingest-group", group) as d:
            st = os.stat(d.sock)
            self.assertEqual(st.st_gid, grp.getgrnam(group).gr_gid)
            self.assertEqual(stat.S_IMODE(st.st_mode), 0o660)
            self.assertTrue(send_and_count(d))

    def test_numeric_group(self):
        gid = 65534 if UID == 0 else GID
        with Daemon("--log-interval", "0", "--ingest-group", str(gid)) as d:
            self.assertEqual(os.stat(d.sock).st_gid, gid)

    def run_failing(self, *args, user=None):
        tmp = tempfile.mkdtemp(prefix="tm-acc-", dir="/tmp")
        self.addCleanup(shutil.rmtree, tmp, True)
        sock = os.path.join(tmp, "i.sock")
        cmd = [tu.DAEMON, "--ingest", sock, "--listen", "127.0.0.1:0",
               "--log-interval", "0", *args]
        if user is not None:
            os.chmod(tmp, 0o777)
            cmd = ["setpriv", f"--reuid={user}", f"--regid={user}",
                   "--clear-groups", *cmd]
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, timeout=10)
        self.assertFalse(os.path.exists(sock), "socket file left behind")
        return p.returncode, p.stderr.decode()

    def test_unknown_group_is_an_error_naming_it(self):
        rc, err = self.run_failing("--ingest-group", "no-such-group-tm")
        self.assertNotEqual(rc, 0)
        self.assertIn('"no-such-group-tm"', err)
        self.assertIn("--ingest-group", err)

    @unittest.skipUnless(UID == 0 and shutil.which("setpriv"),
                         "needs root to run the daemon as another user")
    def test_group_not_permitted_is_an_error_naming_it(self):
        rc, err = self.run_failing("--ingest-group", "root", user=OTHER)
        self.assertNotEqual(rc, 0)
        self.assertIn('"root"', err)
        self.assertRegex(err, r"Operation not permitted")


if __name__ == "__main__":
    tu.DAEMON = os.path.abspath(sys.argv.pop(1))
    tu.main()
