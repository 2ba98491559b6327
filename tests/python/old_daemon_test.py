#!/usr/bin/python3
"""This tree's client library against a real tokenmeterd of protocol 1.0,
built from commit c0992d4 (the last before ACKs): the issue-28 case. The
client asks for ACKs, the old daemon ignores the key (as protocol 1.1 lets
it) and never answers HELLO, and a proxy between them cuts the first
connection after 200 batches. The daemon must apply each token once: the
client replays nothing to a daemon that did not answer HELLO (protocol 1.2,
"ACK at HELLO"), counts what it had kept for it as discarded, and close
reports nothing unacked and nothing dropped.

Usage: old_daemon_test.py SRC_DIR CACHE_DIR [unittest args]
  The old daemon is $TOKENMETERD_OLD if set, else CACHE_DIR/tokenmeterd,
  built there once from `git archive c0992d4` of SRC_DIR (meson,
  -Dtests=disabled, only daemon/tokenmeterd: about 55 s of CPU) and kept
  for the next run. Exits 77 (skipped) when there is no such daemon and
  SRC_DIR has no git history to build one from, or when
  TOKENMETER_OLD_DAEMON=0.
Environment: TOKENMETER_LIBRARY (this build's libtokenmeter.so) and
PYTHONPATH (client_lib/python), as for tests/python/shim_test.py.
"""
import os
import shutil
import socket
import sys
import tempfile
import threading
import unittest

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testutil"))
import tokenmeter_testutil as tu  # noqa: E402

OLD_COMMIT = "c0992d4"
BATCHES = 400
PER_BATCH = 10
CUT_AFTER = 200  # batches before the proxy cuts the first connection


def old_daemon(src, cache):
    """The path of a protocol 1.0 tokenmeterd, built into `cache` if need
    be; None when it cannot be had (no git history)."""
    if os.environ.get("TOKENMETERD_OLD"):
        return os.environ["TOKENMETERD_OLD"]
    return tu.build_old_daemon(src, cache, OLD_COMMIT)

class CuttingProxy:
    """A Unix socket in front of the daemon's: forwards every connection's
    bytes both ways, whole frames at a time from the client, counting the
    events of the BATCH frames forwarded; cut() closes the first connection (both sides),
    as a daemon that drops a connection would."""

    def __init__(self, path, upstream):
        self.path = path
        self.upstream = upstream
        self.connections = 0
        self.events = 0        # events of the BATCHes forwarded, in all
        self.daemon_bytes = 0  # bytes the daemon wrote to a client
        self.first = None      # the first connection's two sockets
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(4)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            daemon.connect(self.upstream)
            if self.first is None:
                self.first = (client, daemon)
            threading.Thread(target=self._up, args=(client, daemon),
                             daemon=True).start()
            threading.Thread(target=self._down, args=(daemon, client),
                             daemon=True).start()

    def cut(self):
        for s in self.first:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _up(self, client, daemon):
        unpacker = msgpack.Unpacker(raw=False)
        pending = bytearray()  # the bytes from stream offset `sent` on
        sent = 0
        try:
            while True:
                chunk = client.recv(65536)
                if not chunk:
                    break
                pending += chunk
                unpacker.feed(chunk)
                events = sum(len(f[3]) for f in unpacker if f[0] == 1)
                consumed = unpacker.tell() - sent
                daemon.sendall(bytes(pending[:consumed]))
                del pending[:consumed]
                sent += consumed
                self.events += events
        except OSError:
            pass
        finally:
            for s in (client, daemon):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _down(self, daemon, client):
        try:
            while True:
                chunk = daemon.recv(65536)
                if not chunk:
                    break
                self.daemon_bytes += len(chunk)
                client.sendall(chunk)
        except OSError:
            pass

    def close(self):
        self.listener.close()


class OldDaemon(unittest.TestCase):
    def test_a_daemon_that_does_not_ack_applies_each_batch_once(self):
        import tokenmeter
        d = tu.Daemon("--log-interval", "0", binary=DAEMON_OLD).start()
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)
        tmp = tempfile.mkdtemp(prefix="tm-old-")
        self.addCleanup(shutil.rmtree, tmp, True)
        proxy = CuttingProxy(os.path.join(tmp, "p.sock"), d.sock)
        self.addCleanup(proxy.close)
        c = tokenmeter.Client(socket_path=proxy.path, engine="old-e",
                              model="m", instance="i0", flush_interval=0.002,
                              close_timeout=10)
        self.addCleanup(c.close)
        for b in range(BATCHES):
            if b == CUT_AFTER:
                # The daemon has the first 200 batches' events (all that was
                # written) and drops the connection; the next batch goes
                # once the client has seen that (a batch written into a
                # dropped connection is lost to any daemon, acked or not:
                # not what this test is about).
                tu.poll_until(lambda: proxy.events >= c.stats().events_sent
                              == CUT_AFTER * PER_BATCH,
                              what="200 batches through the proxy")
                proxy.cut()
                tu.poll_until(lambda: c.stats().reconnects >= 1,
                              what="the client reconnected")
            for _ in range(PER_BATCH):
                c.tokens(b)
            c.flush(5)  # False while the client reconnects: events wait
        final = c.close()
        name = "old_e:generation_tokens_total"
        total = BATCHES * PER_BATCH
        tu.poll_until(lambda: (d.value(name, model_name="m", engine="i0")
                               or 0) >= total, what="the tokens applied")
        self.assertGreaterEqual(proxy.connections, 2)
        self.assertEqual(proxy.events, total)
        self.assertEqual(proxy.daemon_bytes, 0)  # a 1.0 daemon: no ACK
        self.assertEqual(final.events_sent, total)
        self.assertEqual(final.batches_replayed, 0)
        self.assertEqual(final.events_dropped, 0)
        self.assertEqual(final.events_unacked, 0)
        self.assertGreater(final.events_discarded, 0)
        self.assertLessEqual(final.events_discarded, total)
        # Applied once each, and nothing more arrives.
        self.assertEqual(d.value(name, model_name="m", engine="i0"), total)


if __name__ == "__main__":
    if os.environ.get("TOKENMETER_OLD_DAEMON") == "0":
        print("TOKENMETER_OLD_DAEMON=0: skipped")
        sys.exit(77)
    DAEMON_OLD = old_daemon(sys.argv[1], sys.argv[2])
    if DAEMON_OLD is None:
        print(f"no tokenmeterd of {OLD_COMMIT} and no git history to build "
              "one: skipped")
        sys.exit(77)
    unittest.main(argv=[sys.argv[0], *sys.argv[3:]])
