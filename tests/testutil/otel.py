"""OpenTelemetry's own receivers and senders for the OTLP tests (tests/otel).

* otel_available / skip_unless_otel: node and tests/otel/node_modules
  (`npm ci` there, run by scripts/install-deps.sh); without them a test
  exits 77 (meson's SKIP) with one line saying what is missing.
* Receiver: tests/otel/receiver.mjs, an OTLP/HTTP receiver that decodes
  with OpenTelemetry's code, on 127.0.0.1 and an ephemeral port, with its
  fault modes as keyword arguments; requests() reads its JSON lines (one a
  request, normalized so that protobuf and JSON bodies of one content are
  equal), wait_for() polls them (bounded), stop() returns its counts.
* export_reference_spans: the spans of a document exported by the
  OpenTelemetry JS SDK (tests/otel/reference_spans.mjs) to a URL.
* spans_of: the spans of received requests, flattened.

The formats (the receiver's lines, the reference document) are described
at the top of receiver.mjs, otlp_normalize.mjs and reference_spans.mjs, and
in docs/development.md.
"""
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time

import tokenmeter_testutil as tu

OTEL_DIR = os.path.join(tu.SOURCE_ROOT, "tests", "otel")
NODE_MODULES = os.path.join(OTEL_DIR, "node_modules")
RECEIVER = os.path.join(OTEL_DIR, "receiver.mjs")
REFERENCE_SPANS = os.path.join(OTEL_DIR, "reference_spans.mjs")
READY_TIMEOUT_S = 30.0


def node():
    """The node binary ($NODE, else node on PATH, else /usr/bin/node), or
    None."""
    for candidate in (os.environ.get("NODE"), shutil.which("node"),
                      "/usr/bin/node"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def missing():
    """Why the OpenTelemetry tooling cannot run, or None when it can."""
    if node() is None:
        return "node not found"
    marker = os.path.join(NODE_MODULES, "@opentelemetry",
                          "contrib-test-utils", "package.json")
    if not os.path.exists(marker):
        return (f"{NODE_MODULES} has no @opentelemetry packages "
                "(run scripts/install-deps.sh, which runs npm ci there)")
    return None


def otel_available():
    """True when node and tests/otel/node_modules are present."""
    return missing() is None


def skip_unless_otel():
    """Exits 77 (skipped) with one line saying what is missing, unless the
    OpenTelemetry tooling is available."""
    why = missing()
    if why is not None:
        tu.skip(f"OpenTelemetry test tooling unavailable: {why}")


class Receiver:
    """tests/otel/receiver.mjs on 127.0.0.1 and an ephemeral port, its
    lines in requests.jsonl and its stderr in receiver.log of a temp dir.

    Keyword arguments are its fault and TLS flags: fail_status (int),
    fail_count, retry_after (sent as given), reset_count, stall (every
    request), stall_count, partial_success (rejected count),
    partial_message, tls_cert, tls_key, client_ca. After start(): port,
    url (the base, http(s)://127.0.0.1:PORT), traces_url, metrics_url.
    `with Receiver(...) as r:` starts it and stops it (and removes the temp
    dir) at the end."""

    FLAGS = ("fail_status", "fail_count", "retry_after", "reset_count",
             "stall_count", "partial_success", "partial_message",
             "tls_cert", "tls_key", "client_ca")

    def __init__(self, stall=False, **flags):
        unknown = set(flags) - set(self.FLAGS)
        if unknown:
            raise TypeError(f"Receiver: unknown flags {sorted(unknown)}")
        self.args = ["--stall"] if stall else []
        for name, value in flags.items():
            if value is not None:
                self.args += ["--" + name.replace("_", "-"), str(value)]
        self.tls = flags.get("tls_cert") is not None
        self.dir = tempfile.mkdtemp(prefix="tm-otel-", dir="/tmp")
        self.out_path = os.path.join(self.dir, "requests.jsonl")
        self.log_path = os.path.join(self.dir, "receiver.log")
        self.proc = None
        self.port = None
        self.url = None
        self.counts = None

    @property
    def traces_url(self):
        return self.url + "/v1/traces"

    @property
    def metrics_url(self):
        return self.url + "/v1/metrics"

    def start(self, timeout=READY_TIMEOUT_S):
        """Starts the receiver and waits (bounded) for its "PORT n" line;
        returns self. Raises AssertionError with its log if it exits or
        stays silent."""
        binary = node()
        if binary is None:
            raise AssertionError("no node: call skip_unless_otel() first")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [binary, RECEIVER, "--out", self.out_path, *self.args],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=log, cwd=OTEL_DIR)
        line = self._read_port_line(timeout)
        if not line.startswith(b"PORT "):
            self.cleanup()
            raise AssertionError(f"receiver said {line!r}, not PORT n")
        self.port = int(line.split()[1])
        scheme = "https" if self.tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        return self

    def _read_port_line(self, timeout):
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        data = b""
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                self.cleanup()
                raise AssertionError(f"receiver not ready after {timeout} s"
                                     f": {self.read_log()}")
            if not select.select([fd], [], [], min(left, 0.1))[0]:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                self.proc.wait(timeout=timeout)
                log = self.read_log()
                self.cleanup()
                raise AssertionError(
                    f"receiver exited ({self.proc.returncode}) before it "
                    f"was ready: {log}")
            data += chunk
        return data.rstrip(b"\n")

    def requests(self):
        """Every request received so far: its JSON line, parsed (a line
        still being written is left for the next call)."""
        try:
            with open(self.out_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        lines = data.split(b"\n")
        return [json.loads(line) for line in lines[:-1] if line]

    def wait_for(self, predicate, timeout=10.0, what="receiver requests"):
        """Polls until predicate(requests()) is true and returns that value;
        AssertionError naming `what` after `timeout` seconds."""
        return tu.poll_until(lambda: predicate(self.requests()),
                             timeout=timeout, what=what)

    def wait_requests(self, n, timeout=10.0):
        """The requests once there are at least `n` of them (bounded)."""
        return self.wait_for(lambda rs: rs if len(rs) >= n else None,
                             timeout=timeout, what=f"{n} requests")

    def read_log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def stop(self, timeout=10):
        """SIGTERM, then waits; returns its counts ({"received": n, "ok":
        n, "failed_status": n, "reset": n, "stalled": n, "bad": n,
        "tls_errors": n}, from its last stderr line), also kept in .counts.
        Raises AssertionError when it does not exit 0. Idempotent."""
        if self.proc is None:
            return self.counts
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"receiver ignored SIGTERM for "
                                     f"{timeout} s: killed")
        self.proc.stdout.close()
        rc = self.proc.returncode
        self.proc = None
        log = self.read_log()
        if rc != 0:
            raise AssertionError(f"receiver exited {rc}: {log}")
        last = [line for line in log.splitlines()
                if line.startswith("receiver: received=")]
        if not last:
            raise AssertionError(f"receiver printed no counts: {log}")
        self.counts = {k: int(v) for k, v in (
            field.split("=") for field in last[-1].split()[1:])}
        return self.counts

    def cleanup(self):
        """Kills a receiver still running; removes the temp dir."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        try:
            if exc[0] is None:
                self.stop()
        finally:
            self.cleanup()


def export_reference_spans(doc, url, compression=None, headers=None,
                           timeout=60):
    """Exports the spans of `doc` (a dict in reference_spans.mjs's format)
    with the OpenTelemetry JS SDK to `url` (a /v1/traces endpoint) in one
    OTLP/HTTP protobuf request; compression "gzip" or None; headers a dict.
    Returns its stdout ("exported N spans"); AssertionError with its stderr
    when it fails or runs past `timeout` seconds."""
    binary = node()
    if binary is None:
        raise AssertionError("no node: call skip_unless_otel() first")
    with tempfile.NamedTemporaryFile("w", prefix="tm-otel-doc-",
                                     suffix=".json", dir="/tmp") as f:
        json.dump(doc, f)
        f.flush()
        cmd = [binary, REFERENCE_SPANS, f.name, url]
        if compression:
            cmd += ["--compression", compression]
        for name, value in (headers or {}).items():
            cmd += ["--header", f"{name}={value}"]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True,
                                 timeout=timeout, cwd=OTEL_DIR)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"reference_spans.mjs still running after "
                                 f"{timeout} s: {e.stderr}") from None
    if run.returncode != 0:
        raise AssertionError(f"reference_spans.mjs exited {run.returncode}:"
                             f" {run.stderr.strip()}")
    return run.stdout


def spans_of(requests):
    """The spans of received trace requests (records of
    Receiver.requests(), or one record), in order, each a dict of the
    normalized span with "resource" and "scope" added."""
    if isinstance(requests, dict):
        requests = [requests]
    out = []
    for record in requests:
        message = record.get("message") or {}
        for rs in message.get("resource_spans", []):
            for ss in rs["scope_spans"]:
                for span in ss["spans"]:
                    out.append(dict(span, resource=rs["resource"],
                                    scope=ss["scope"]))
    return out


def norm_value(v):
    """A reference document's attribute value as the receiver normalizes it
    (ints as decimal strings)."""
    if v["type"] == "int":
        return {"type": "int", "value": str(int(v["value"]))}
    if v["type"] == "array":
        return {"type": "array", "value": [norm_value(e) for e in v["value"]]}
    return dict(v)


def norm_attrs(attrs):
    return {k: norm_value(v) for k, v in attrs.items()}


def sdk_flags(doc, span):
    """The Span.flags the JS SDK sends: sampled (0x01), "has is-remote"
    (0x100), is-remote (0x200) for a parent outside the document."""
    ids = {x["span_id"] for x in doc["spans"]}
    remote = bool(span["parent_span_id"]) and span["parent_span_id"] not in ids
    return 0x101 | (0x200 if remote else 0)


def expected_message(doc, sdk=False):
    """Every field of the normalized ExportTraceServiceRequest the receiver
    must report for a reference document (reference_spans.mjs's input):
    its flags and trace_state as the document gives them, or with sdk=True
    as the JS SDK exports them (sdk_flags(), no trace_state)."""
    spans = [{
        "trace_id": sp["trace_id"], "span_id": sp["span_id"],
        "trace_state": "" if sdk else sp["trace_state"],
        "parent_span_id": sp["parent_span_id"],
        "flags": sdk_flags(doc, sp) if sdk else sp["flags"],
        "name": sp["name"], "kind": sp["kind"],
        "start_time_unix_nano": sp["start_unix_nano"],
        "end_time_unix_nano": sp["end_unix_nano"],
        "attributes": norm_attrs(sp["attributes"]),
        "dropped_attributes_count": 0,
        "events": [{"time_unix_nano": e["time_unix_nano"], "name": e["name"],
                    "attributes": norm_attrs(e["attributes"]),
                    "dropped_attributes_count": 0}
                   for e in sp.get("events", [])],
        "dropped_events_count": 0, "links": [], "dropped_links_count": 0,
        "status": dict(sp["status"]),
    } for sp in doc["spans"]]
    return {"resource_spans": [{
        "resource": {"attributes": norm_attrs(doc["resource_attributes"]),
                     "dropped_attributes_count": 0, "entity_refs": []},
        "schema_url": "",
        "scope_spans": [{
            "scope": {"name": doc["scope"]["name"],
                      "version": doc["scope"]["version"], "attributes": {},
                      "dropped_attributes_count": 0},
            "schema_url": "",
            "spans": spans}]}]}
