"""Helpers for end-to-end tests: run the real tokenmeterd, talk to it over
its real Unix socket and HTTP port, parse /metrics with prometheus_client.
"""
import gzip
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import msgpack
from prometheus_client.parser import text_string_to_metric_families

DAEMON = os.environ.get("TOKENMETERD", "")


def poll_until(predicate, timeout=10.0, interval=0.02, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


class Daemon:
    """tokenmeterd on a temp socket and an ephemeral loopback port."""

    def __init__(self, *args, binary=None):
        self.dir = tempfile.mkdtemp(prefix="tm-e2e-", dir="/tmp")
        self.sock = os.path.join(self.dir, "i.sock")
        self.log_path = os.path.join(self.dir, "daemon.log")
        self.binary = binary or DAEMON
        self.args = list(args)
        self.proc = None
        self.port = None

    def start(self):
        self.log = open(self.log_path, "w+b")
        self.proc = subprocess.Popen(
            [self.binary, "--ingest", self.sock, "--listen", "127.0.0.1:0",
             *self.args],
            stdout=subprocess.DEVNULL, stderr=self.log)

        def port():
            m = re.search(rb"http port (\d+)", self.read_log())
            if self.proc.poll() is not None:
                raise AssertionError(
                    "daemon exited: " + self.read_log().decode())
            return int(m.group(1)) if m else None
        self.port = poll_until(port, what="daemon start")
        return self

    def read_log(self):
        with open(self.log_path, "rb") as f:
            return f.read()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)
        rc = self.proc.returncode if self.proc else None
        self.log.close()
        return rc

    def cleanup(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        self.cleanup()

    # HTTP --------------------------------------------------------------
    def get(self, path="/metrics", headers=None, method="GET"):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", headers=headers or {},
            method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def metrics_text(self, headers=None):
        status, hdrs, body = self.get("/metrics", headers)
        assert status == 200, status
        if hdrs.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return body.decode()

    def samples(self):
        """{(sample name, frozenset(labels.items())): value}"""
        out = {}
        for family in text_string_to_metric_families(self.metrics_text()):
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out

    def value(self, name, **labels):
        return self.samples().get((name, frozenset(labels.items())))

    def wait_value(self, name, expected, **labels):
        poll_until(lambda: self.value(name, **labels) == expected,
                   what=f"{name}{labels} == {expected} "
                        f"(last {self.value(name, **labels)})")

    # Ingest ------------------------------------------------------------
    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.sock)
        return s


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
