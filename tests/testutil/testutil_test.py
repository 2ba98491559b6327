#!/usr/bin/python3
"""tests/testutil itself: poll_until's bound and message, the Samples view
of a parsed scrape, main()'s exit codes (77 only when everything skipped),
and Daemon.start() against the real tokenmeterd and against stand-ins that
exit at once or never say "ready".

Usage: testutil_test.py TOKENMETERD [unittest args]
"""
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenmeter_testutil as tu  # noqa: E402

TEXT = """# TYPE a counter
a_total{kind="x",m="1"} 2
a_total{kind="y",m="1"} 3
a_total{kind="y",m="2"} 4
# TYPE g gauge
g 7.5
"""


class PollUntil(unittest.TestCase):
    def test_returns_the_first_true_value(self):
        calls = []

        def pred():
            calls.append(1)
            return len(calls) if len(calls) == 3 else 0
        self.assertEqual(tu.poll_until(pred, interval=0), 3)

    def test_times_out_naming_what_and_the_last_value(self):
        t0 = time.monotonic()
        with self.assertRaisesRegex(AssertionError,
                                    r"timed out after 0\.1 s waiting for "
                                    r"the thing \(last: \[\]\)"):
            tu.poll_until(lambda: [], timeout=0.1, what="the thing")
        self.assertLess(time.monotonic() - t0, 5)


class SamplesView(unittest.TestCase):
    def test_value_takes_exact_labels_and_sum_a_subset(self):
        s = tu.parse(TEXT)
        self.assertEqual(s.value("a_total", kind="y", m="2"), 4)
        self.assertIsNone(s.value("a_total", kind="y"))
        self.assertEqual(s.value("g"), 7.5)
        self.assertEqual(s.sum("a_total", kind="y"), 7)
        self.assertEqual(s.sum("a_total"), 9)
        self.assertEqual(s.sum("nothing"), 0)


class Main(unittest.TestCase):
    def exit_code(self, body, *args):
        code = textwrap.dedent("""\
            import sys, unittest
            sys.path.insert(0, sys.argv.pop(1))
            import tokenmeter_testutil as tu
            """) + textwrap.dedent(body) + "\ntu.main()\n"
        with tempfile.NamedTemporaryFile("w", suffix=".py") as f:
            f.write(code)
            f.flush()
            return subprocess.run(
                [sys.executable, f.name, os.path.dirname(tu.__file__), *args],
                capture_output=True, timeout=60).returncode

    def test_exit_codes(self):
        self.assertEqual(self.exit_code("""
            class T(unittest.TestCase):
                def test_a(self): pass
                def test_b(self): self.skipTest("x")
            """), 0)
        self.assertEqual(self.exit_code("""
            class T(unittest.TestCase):
                def test_a(self): tu.need_path("/nonexistent/peers")
            """), 77)
        self.assertEqual(self.exit_code("""
            class T(unittest.TestCase):
                @classmethod
                def setUpClass(cls): tu.need_path("/nonexistent/peers")
                def test_a(self): pass
                def test_b(self): pass
            """), 77)
        self.assertEqual(self.exit_code("""
            class T(unittest.TestCase):
                def test_a(self): self.fail("no")
                def test_b(self): self.skipTest("x")
            """), 1)
        self.assertEqual(self.exit_code("""
            class T(unittest.TestCase):
                def test_a(self): pass
            """, "T.test_nonexistent"), 1)


class DaemonStart(unittest.TestCase):
    def stand_in(self, script, interpreter="/bin/sh"):
        d = tempfile.mkdtemp(prefix="tm-tu-", dir="/tmp")
        self.addCleanup(subprocess.run, ["rm", "-rf", d])
        path = os.path.join(d, "fake-tokenmeterd")
        with open(path, "w") as f:
            f.write(f"#!{interpreter}\n" + script)
        os.chmod(path, 0o755)
        return path

    def test_real_daemon_reports_its_addresses(self):
        with tu.Daemon("--log-interval", "0") as d:
            self.assertNotEqual(d.port, 0)
            self.assertEqual(d.sock, os.path.join(d.dir, "i.sock"))
            self.assertEqual(d.value("tokenmeter_ingest_connections"), 0)
            d.connect().close()
        self.assertEqual(d.proc.returncode, 0)

    def test_exit_before_ready_raises_with_the_log(self):
        d = tu.Daemon(binary=self.stand_in("echo broken flag >&2; exit 2\n"))
        self.addCleanup(d.cleanup)
        with self.assertRaisesRegex(AssertionError,
                                    r"exited \(2\) before it was ready: "
                                    r"broken flag"):
            d.start()

    def test_silence_is_bounded(self):
        # Keeps the ready fd open and never writes to it.
        d = tu.Daemon(binary=self.stand_in("exec sleep 30\n"))
        self.addCleanup(d.cleanup)
        t0 = time.monotonic()
        with self.assertRaisesRegex(AssertionError, r"not ready after 0\.3 s"):
            d.start(timeout=0.3)
        self.assertLess(time.monotonic() - t0, 10)

    def test_ready_line_through_a_fifo(self):
        # A launcher that closes every fd but 0-2 (as systemd-socket-activate
        # does) still gets the line through with ready_fifo.
        launcher = self.stand_in(
            "import os, sys\nos.closerange(3, 1 << 16)\n"
            "os.execv(sys.argv[1], sys.argv[1:])\n", sys.executable)
        with tu.Daemon("--log-interval", "0", launcher=[launcher],
                       ready_fifo=True) as d:
            self.assertEqual(d.ready_line, f"ready http=127.0.0.1:{d.port} "
                             f"ingest={d.sock}")
            self.assertEqual(d.get("/healthz")[2], b"ok\n")


if __name__ == "__main__":
    tu.DAEMON = os.path.abspath(sys.argv.pop(1))
    tu.main()
