#!/usr/bin/python3
"""tests/testutil itself: poll_until's bound and message, the Samples view
of a parsed scrape, main()'s exit codes (77 only when everything skipped),
Daemon.start() against the real tokenmeterd and against stand-ins that
exit at once or never say "ready", and Engine: a run of the real engine
(when TOKENMETER_ENGINE is set) against the real daemon, its argv, and
stand-ins that fail, exit without a report, or never end or connect.

Usage: testutil_test.py TOKENMETERD [unittest args]
"""
import os
import signal
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


class StandIns(unittest.TestCase):
    def stand_in(self, script, interpreter="/bin/sh"):
        """An executable `script` in a temp dir removed after the test."""
        d = tempfile.mkdtemp(prefix="tm-tu-", dir="/tmp")
        self.addCleanup(subprocess.run, ["rm", "-rf", d])
        path = os.path.join(d, "stand-in")
        with open(path, "w") as f:
            f.write(f"#!{interpreter}\n" + script)
        os.chmod(path, 0o755)
        return path


class DaemonStart(StandIns):

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


class FakeDaemon:
    """What Engine.wait_ready() reads of a Daemon: its log."""

    def __init__(self, log=b""):
        self.log = log

    def read_log(self):
        return self.log


class EngineRun(StandIns):
    def engine(self, *args, **kw):
        e = tu.Engine(*args, **kw)
        self.addCleanup(e.cleanup)
        return e

    def started(self, sh_script, **kw):
        """An Engine of a shell stand-in, started."""
        return self.engine(binary=self.stand_in(sh_script), **kw).start()

    def test_real_engine_against_the_real_daemon(self):
        if not tu.ENGINE:
            self.skipTest("TOKENMETER_ENGINE not set")
        with tu.Daemon("--log-interval", "0") as d:
            e = self.engine("--requests", "5", "--rate", "0", "--backend",
                            "cpu", "--instance", "tu", socket=d.sock,
                            dir=d.dir).start()
            self.assertIs(e.wait_ready(d), e)
            report = e.report(timeout=60)
            self.assertEqual(report["requests"], 5)
            self.assertEqual(e.report_path, os.path.join(d.dir,
                                                         "engine.json"))
            self.assertIn("5 requests", e.read_output())  # no --quiet
            tu.poll_until(lambda: d.samples().sum(
                "tokenmeter_engine:request_success_total", engine="tu") == 5,
                what="the engine's 5 requests counted")
        self.assertEqual(e.poll(), 0)

    def test_argv_from_flags_and_keywords(self):
        # Writes its arguments as the report; stdout and stderr apart.
        e = self.engine("--requests", "3", socket="/tmp/x.sock",
                        binary=self.stand_in(
                            "import json, sys\n"
                            "print('out'); print('err', file=sys.stderr)\n"
                            "with open(sys.argv[-1], 'w') as f:\n"
                            "    json.dump(sys.argv[1:], f)\n",
                            sys.executable)).start()
        self.assertEqual(e.report(timeout=30), [
            "--requests", "3", "--metrics-socket", "/tmp/x.sock",
            "--report", os.path.join(e.dir, "engine.json")])
        self.assertEqual((e.read_output(), e.read_log()), ("out\n", "err\n"))
        e.cleanup()
        self.assertFalse(os.path.exists(e.dir))  # its own temp dir
        # No socket, a report path and a log of the caller's, a launcher
        # (here the interpreter) and another socket flag.
        d = tempfile.mkdtemp(prefix="tm-tu-", dir="/tmp")
        self.addCleanup(subprocess.run, ["rm", "-rf", d])
        script = self.stand_in("import json, sys\n"
                               "json.dump(sys.argv[1:], open(sys.argv[-1], "
                               "'w'))\n", "/nonexistent/python")
        e = self.engine(binary=script, launcher=[sys.executable],
                        socket="s", socket_flag="--socket",
                        report=os.path.join(d, "r.json"),
                        log=os.path.join(d, "e.log")).start()
        self.assertEqual(e.report(timeout=30),
                         ["--socket", "s", "--report",
                          os.path.join(d, "r.json")])
        self.assertEqual(e.out_path, os.path.join(d, "e.out"))
        e.cleanup()
        self.assertTrue(os.path.exists(os.path.join(d, "r.json")))

    def assert_report_fails(self, sh_script, pattern, timeout=120, **kw):
        """report() on a stand-in raises AssertionError matching pattern;
        returns the Engine."""
        e = self.started(sh_script, **kw)
        with self.assertRaisesRegex(AssertionError, pattern):
            e.report(timeout=timeout)
        return e

    def test_failing_engine_raises_with_its_log(self):
        self.assert_report_fails("echo 'unknown flag --bogus' >&2; exit 3\n",
                                 r"^engine exited 3: unknown flag --bogus")

    def test_exit_0_without_a_report_raises(self):
        self.assert_report_fails("exit 0\n", r"exited 0 without a readable "
                                 r"report .*engine\.json")

    def test_timeout_kills_the_engine(self):
        t0 = time.monotonic()
        e = self.assert_report_fails(
            "echo started >&2; exec sleep 30\n",
            r"^slow still running after 0\.3 s: killed: started",
            timeout=0.3, name="slow")
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(e.poll(), -signal.SIGKILL)

    def test_ready_is_bounded_and_kills_the_engine(self):
        e = self.started("exec sleep 30\n")
        # Another process's HELLO does not count.
        other = b"ingest: peer#1 pid=%d uid=0 gid=0: hello engine=x " \
            b"model=m instance=0\n" % (e.pid + 1)
        t0 = time.monotonic()
        with self.assertRaisesRegex(AssertionError,
                                    r"timed out after 0\.3 s waiting for "
                                    r"the daemon logging engine's HELLO"):
            e.wait_ready(FakeDaemon(other), timeout=0.3)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(e.poll(), -signal.SIGKILL)

    def test_ready_on_its_own_hello(self):
        e = self.started("exec sleep 30\n")
        mine = b"ingest: peer#2 pid=%d uid=0 gid=0: hello engine=x " \
            b"model=m instance=0\n" % e.pid
        self.assertIs(e.wait_ready(FakeDaemon(mine), timeout=5), e)
        self.assertIsNone(e.poll())
        self.assertEqual(e.stop(), -signal.SIGTERM)
        self.assertEqual(e.stop(), -signal.SIGTERM)  # idempotent

    def test_exit_before_ready_raises_with_the_log(self):
        e = self.started("echo 'cannot connect' >&2; exit 1\n")
        with self.assertRaisesRegex(AssertionError,
                                    r"^engine exited \(1\) before the "
                                    r"daemon saw its HELLO: cannot connect"):
            e.wait_ready(FakeDaemon(), timeout=30)

    def test_with_block_kills_a_running_engine(self):
        with tu.Engine(binary=self.stand_in("exec sleep 30\n")) as e:
            self.assertIsNone(e.poll())
        self.assertEqual(e.poll(), -signal.SIGKILL)
        self.assertFalse(os.path.exists(e.dir))

    def test_no_binary_is_a_clear_error(self):
        saved, tu.ENGINE = tu.ENGINE, ""
        self.addCleanup(setattr, tu, "ENGINE", saved)
        e = self.engine()
        with self.assertRaisesRegex(AssertionError,
                                    "no tokenmeter-engine: set "
                                    "TOKENMETER_ENGINE"):
            e.start()


if __name__ == "__main__":
    tu.DAEMON = os.path.abspath(sys.argv.pop(1))
    tu.main()
