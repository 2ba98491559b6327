#!/usr/bin/python3
"""Connection slots against the real daemon: file descriptors, silent
peers, one uid taking every slot (issue 13, items 1 and 3).

* FdLimit: the daemon starts under a low RLIMIT_NOFILE (soft 64, hard 128,
  set in the child before exec). It raises the soft limit to the hard one
  and logs it, lowers --max-connections and --max-http-connections so that
  both fit under it (logged once), and then 200 silent engine connections
  (more than the lowered cap) are refused as connection_limit, counted one
  by one and logged once, while GET /metrics keeps answering 200. Without
  the raise and the clamp the connections ran the daemon out of
  descriptors: the scrape was reset and nothing was counted or logged.
* SilentPeers: a connection that sends no HELLO (or half of one) is closed
  after --hello-timeout, counted as hello_timeout and logged once per
  burst; one that sent HELLO stays.
* PerUid: past --max-connections-per-uid connections of one uid, new ones
  are closed at accept, counted as uid_connection_limit, logged once.

Usage: fd_limit_test.py TOKENMETERD [unittest args]
"""
import os
import re
import resource
import socket
import sys
import time
import unittest
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402
from tokenmeter_testutil import (  # noqa: E402
    Daemon, batch, hello, poll_until, wait_closed)

PID = os.getpid()
PEER = rf"peer#\d+ pid={PID} uid={os.getuid()} gid=\d+"
ERRORS = "tokenmeter_ingest_errors_total"
TOKENS = "vllm:generation_tokens_total"


def low_nofile():
    # In the child, before exec: soft 64, hard 128.
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 128))


def closed_now(sock):
    """True when the peer has closed (or reset) the connection; never
    blocks."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


class Base(unittest.TestCase):
    args = ()
    preexec_fn = None

    def setUp(self):
        self.d = Daemon("--log-interval", "0", *self.args,
                        preexec_fn=self.preexec_fn)
        self.addCleanup(self.d.cleanup)
        self.d.start()
        self.socks = []
        self.addCleanup(self.close_all)

    def close_all(self):
        for s in self.socks:
            s.close()
        self.socks = []

    def log(self):
        return self.d.read_log().decode()

    def assert_engine_works(self, n):
        """A well-behaved engine connection still gets its events in."""
        s = self.d.connect()
        self.socks.append(s)
        before = self.d.value(TOKENS, model_name="m", engine="0") or 0
        s.sendall(hello() + batch([[4, time.monotonic_ns(), 1, n]]))
        self.d.wait_value(TOKENS, before + n, model_name="m", engine="0")


class FdLimit(Base):
    preexec_fn = staticmethod(low_nofile)
    # Keep silent connections open for the whole test.
    args = ("--hello-timeout", "600")

    def test_connections_past_the_fd_limit_are_refused_and_scrapes_served(
            self):
        log = self.log()
        self.assertRegex(log, r"file descriptors: soft limit 128 \(raised "
                              r"from 64\)")
        clamp = re.findall(
            r"file descriptors: the limit \(RLIMIT_NOFILE\) of 128 less "
            r"\d+ kept for the daemon leaves \d+ for connections: "
            r"--max-connections 1024 lowered to (\d+), "
            r"--max-http-connections 256 lowered to (\d+)", log)
        self.assertEqual(len(clamp), 1, log)
        cap, http_cap = int(clamp[0][0]), int(clamp[0][1])
        self.assertGreater(cap, 10)
        self.assertGreater(http_cap, 0)
        self.assertLess(cap + http_cap, 128)

        for i in range(200):
            self.socks.append(self.d.connect())
            if i % 20 == 19:  # scrapes answered all along
                self.assertEqual(self.d.get()[0], 200)
        self.d.wait_value("tokenmeter_ingest_connections", cap)
        # Every connection past the cap is refused and counted, none is
        # lost to EMFILE; the refusals log one line.
        self.d.wait_value(ERRORS, 200 - cap, reason="connection_limit")
        poll_until(lambda: sum(map(closed_now, self.socks)) == 200 - cap,
                   what=f"{200 - cap} connections closed at accept")
        self.assertEqual(self.d.value(ERRORS, reason="fd_limit"), 0)
        status, _, body = self.d.get()
        self.assertEqual(status, 200)
        self.assertIn(b"tokenmeter_ingest_connections %d" % cap, body)
        log = self.log()
        self.assertEqual(len(re.findall(
            PEER + rf": closing the connection: connection_limit \({cap} "
            r"engine connections open, --max-connections\)", log)), 1, log)
        self.assertNotIn("Too many open files", log)

        # Slots freed: engines are served again.
        self.close_all()
        self.d.wait_value("tokenmeter_ingest_connections", 0)
        self.assert_engine_works(5)
        self.assertEqual(self.d.stop(), 0)


class SilentPeers(Base):
    args = ("--hello-timeout", "1")

    def test_connections_without_hello_are_closed_after_the_timeout(self):
        good = self.d.connect()
        self.socks.append(good)
        good.sendall(hello())
        self.d.wait_value("tokenmeter_ingest_frames_total", 1)
        started = time.monotonic()
        silent = [self.d.connect() for _ in range(5)]
        self.socks += silent
        silent[0].sendall(hello()[:5])  # half a HELLO
        self.d.wait_value(ERRORS, 5, reason="hello_timeout")
        waited = time.monotonic() - started
        self.assertGreaterEqual(waited, 0.9)
        self.assertLess(waited, 10)
        for s in silent:
            self.assertTrue(wait_closed(s))
        self.assertEqual(len(re.findall(
            PEER + r": closing the connection: hello_timeout \(no HELLO "
            r"within 1 s, --hello-timeout", self.log())), 1)
        # The connection that sent HELLO stays and is served.
        good.sendall(batch([[4, time.monotonic_ns(), 1, 3]]))
        self.d.wait_value(TOKENS, 3, model_name="m", engine="0")
        self.assertFalse(closed_now(good))
        self.d.wait_value("tokenmeter_ingest_connections", 1)


class PerUid(Base):
    args = ("--max-connections-per-uid", "3")

    def test_one_uid_cannot_take_every_slot(self):
        held = [self.d.connect() for _ in range(3)]
        self.socks += held
        self.d.wait_value("tokenmeter_ingest_connections", 3)
        extra = [self.d.connect() for _ in range(4)]
        self.socks += extra
        self.d.wait_value(ERRORS, 4, reason="uid_connection_limit")
        for s in extra:
            self.assertTrue(wait_closed(s))
        self.assertEqual(len(re.findall(
            PEER + r": closing the connection: uid_connection_limit \(3 "
            rf"connections of uid {os.getuid()} open, "
            r"--max-connections-per-uid\)", self.log())), 1)
        self.assertEqual(self.d.value(ERRORS, reason="connection_limit"), 0)
        # A place given back is taken again.
        held.pop().close()
        self.d.wait_value("tokenmeter_ingest_connections", 2)
        self.assert_engine_works(4)
        self.assertEqual(self.d.value(ERRORS, reason="uid_connection_limit"),
                         4)


if __name__ == "__main__":
    tu.DAEMON = os.path.abspath(sys.argv.pop(1))
    warnings.simplefilter("ignore", ResourceWarning)
    tu.main()
