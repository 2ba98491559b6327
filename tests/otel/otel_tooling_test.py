#!/usr/bin/python3
"""The OpenTelemetry test tooling (tests/otel, tests/testutil/otel.py)
tested itself, before any daemon test relies on it:

* spans exported by the OpenTelemetry JS SDK's OTLP/HTTP protobuf exporter
  (reference_spans.mjs) decode, through OpenTelemetry's generated protobuf
  code in receiver.mjs, to exactly the document's ids, parents, names,
  kinds, nanosecond times (up to 2^64-1), typed attributes, events and
  status;
* the same content posted as OTLP/JSON, built here from the OTLP/JSON rules
  (hex ids, 64-bit integers as decimal strings, enums as integers), is
  accepted by contrib-test-utils' TestCollector and normalizes to the very
  same message; gzip bodies of both encodings too;
* the fault modes as an HTTP client sees them: 503 with Retry-After for the
  first N requests then 200 (and the SDK's exporter retries through it),
  a reset connection, a stalled request (the client times out), partial
  success, HTTPS with a required client certificate;
* what is not valid OTLP is reported in the receiver's errors, and a body
  of another Content-Type is refused (415).

Skipped (77) without node or tests/otel/node_modules.
"""
import gzip
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tests", "testutil"))
import otel  # noqa: E402
import tokenmeter_testutil as tu  # noqa: E402

TRACE_A = "0af7651916cd43dd8448eb211c80319c"
TRACE_B = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = "00f067aa0ba902b7"  # the caller's span (a traceparent): remote
ROOT_A = "b7ad6b7169203331"


def s(v):
    return {"type": "string", "value": v}


def i(v):
    return {"type": "int", "value": v}


def d(v):
    return {"type": "double", "value": v}


def b(v):
    return {"type": "bool", "value": v}


def arr(*values):
    return {"type": "array", "value": list(values)}


# One request's spans as tokenmeterd will build them (a request span under
# the caller's traceparent, its phases as children) and a root span of a
# second trace; times with every nanosecond digit used, one end at 2^63-1
# and one event at 2^64-1 ns (beyond a double's 2^53).
DOC = {
    "resource_attributes": {
        "service.name": s("tokenmeterd"),
        "service.instance.id": s("host-1:8080"),
        "tokenmeter.engine.pid": i("4242"),
    },
    "scope": {"name": "tokenmeterd", "version": "1.2.0"},
    "spans": [
        {"trace_id": TRACE_A, "span_id": ROOT_A, "parent_span_id": CALLER,
         "name": "llm_request", "kind": 2,
         "start_unix_nano": "1767225600123456789",
         "end_unix_nano": "1767225601987654321",
         "attributes": {
             "gen_ai.request.model": s("llama-3-8b"),
             "gen_ai.usage.input_tokens": i("512"),
             "gen_ai.usage.output_tokens": i(128),
             "gen_ai.latency.time_to_first_token": d(0.0123456789),
             "tokenmeter.label": s("é ✓ \"quoted\"\n"),
             "tokenmeter.empty": s(""),
             "tokenmeter.aborted": b(False),
             "tokenmeter.big": i("9007199254740991"),
             "tokenmeter.negative": i("-9007199254740991"),
             "tokenmeter.tiny": d(-2.5e-300),
             "tokenmeter.strings": arr(s("a"), s("")),
             "tokenmeter.ints": arr(i("1"), i("-2"), i("0")),
             "tokenmeter.doubles": arr(d(0.5), d(-1.25e-10)),
             "tokenmeter.bools": arr(b(True), b(False)),
             "tokenmeter.none": arr(),
         },
         "status": {"code": 2, "message": "aborted by the client"},
         "events": [
             {"name": "first_token", "time_unix_nano": "1767225600135913578",
              "attributes": {"n": i("1")}},
             {"name": "preempted", "time_unix_nano": "1767225600999999999",
              "attributes": {}},
         ]},
        {"trace_id": TRACE_A, "span_id": "1111111111111111",
         "parent_span_id": ROOT_A, "name": "queue", "kind": 1,
         "start_unix_nano": "1767225600123456789",
         "end_unix_nano": "1767225600123456790",
         "attributes": {}, "status": {"code": 0, "message": ""}},
        {"trace_id": TRACE_A, "span_id": "2222222222222222",
         "parent_span_id": ROOT_A, "name": "prefill", "kind": 1,
         "start_unix_nano": "1767225600123456790",
         "end_unix_nano": "9223372036854775807",
         "attributes": {"gen_ai.usage.input_tokens": i("512")},
         "status": {"code": 1, "message": ""}},
        {"trace_id": TRACE_B, "span_id": "00000000000000a1",
         "parent_span_id": "", "name": "kv_transfer", "kind": 3,
         "start_unix_nano": "1", "end_unix_nano": "2",
         "attributes": {"tokenmeter.kv.bytes": i("1048576")},
         "status": {"code": 0, "message": ""},
         "events": [{"name": "last", "time_unix_nano": "18446744073709551615",
                     "attributes": {"x": d(1.5)}}]},
    ],
}


def json_any(v):
    """A document attribute value as OTLP/JSON's AnyValue."""
    t = v["type"]
    if t == "string":
        return {"stringValue": v["value"]}
    if t == "bool":
        return {"boolValue": v["value"]}
    if t == "int":
        return {"intValue": str(int(v["value"]))}  # int64: a string
    if t == "double":
        return {"doubleValue": v["value"]}
    if t == "array":
        return {"arrayValue": {"values": [json_any(e) for e in v["value"]]}}
    raise ValueError(t)


def json_attrs(attrs):
    return [{"key": k, "value": json_any(v)} for k, v in attrs.items()]


def otlp_json(doc):
    """The OTLP/JSON ExportTraceServiceRequest of `doc`, written from the
    specification (lowerCamelCase keys, hex ids, 64-bit integers as decimal
    strings, enums as integers, empty fields left out), with the SDK's
    flags."""
    spans = []
    for sp in doc["spans"]:
        span = {"traceId": sp["trace_id"], "spanId": sp["span_id"],
                "name": sp["name"], "kind": sp["kind"],
                "startTimeUnixNano": sp["start_unix_nano"],
                "endTimeUnixNano": sp["end_unix_nano"],
                "attributes": json_attrs(sp["attributes"]),
                "flags": otel.sdk_flags(doc, sp),
                "status": {"code": sp["status"]["code"]}}
        if sp["parent_span_id"]:
            span["parentSpanId"] = sp["parent_span_id"]
        if sp["status"]["message"]:
            span["status"]["message"] = sp["status"]["message"]
        if sp.get("events"):
            span["events"] = [{"timeUnixNano": e["time_unix_nano"],
                               "name": e["name"],
                               "attributes": json_attrs(e["attributes"])}
                              for e in sp["events"]]
        spans.append(span)
    return {"resourceSpans": [{
        "resource": {"attributes": json_attrs(doc["resource_attributes"])},
        "scopeSpans": [{"scope": dict(doc["scope"]), "spans": spans}]}]}


def post(url, body, content_type="application/json", encoding=None,
         headers=None, timeout=10, context=None):
    """One POST with http.client: (status, headers dict, body bytes)."""
    scheme, _, rest = url.partition("://")
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    if scheme == "https":
        conn = http.client.HTTPSConnection(host, int(port), timeout=timeout,
                                           context=context)
    else:
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    hdrs = {"Content-Type": content_type, **(headers or {})}
    if encoding:
        hdrs["Content-Encoding"] = encoding
    try:
        conn.request("POST", "/" + path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def json_body(doc=DOC):
    return json.dumps(otlp_json(doc)).encode()


class OtelToolingTest(unittest.TestCase):
    maxDiff = None

    def assert_clean(self, record, status=200):
        self.assertEqual(record["status"], status, record["errors"])
        self.assertEqual(record["errors"], [])
        self.assertEqual(record["unknown_fields"], [])

    def test_protobuf_from_the_sdk_decodes_exactly_and_json_equals_it(self):
        with otel.Receiver() as r:
            out = otel.export_reference_spans(
                DOC, r.traces_url, headers={"x-tokenmeter": "a b",
                                            "Authorization": "Bearer t"})
            self.assertEqual(out.strip(), f"exported {len(DOC['spans'])} "
                             "spans")
            status, hdrs, body = post(r.traces_url, json_body())
            self.assertEqual((status, body), (200, b"{}"))
            self.assertEqual(hdrs["Content-Type"], "application/json")
            pb, js = r.wait_requests(2)
        # (a) the SDK's protobuf, decoded by OpenTelemetry's generated code.
        self.assert_clean(pb)
        self.assertEqual(pb["content_type"], "application/x-protobuf")
        self.assertIn("otlp-transformer 0.216.0 generated root",
                      pb["decoder"])
        self.assertEqual(pb["headers"]["x-tokenmeter"], "a b")
        self.assertEqual(pb["headers"]["authorization"], "Bearer t")
        self.assertTrue(pb["headers"]["user-agent"].startswith(
            "OTel-OTLP-Exporter-JavaScript/"))
        self.assertEqual(pb["message"], otel.expected_message(DOC, sdk=True))
        self.assertEqual(pb["items"], 4)
        spans = otel.spans_of(pb)
        self.assertEqual([x["parent_span_id"] for x in spans],
                         [CALLER, ROOT_A, ROOT_A, ""])
        self.assertEqual(spans[2]["end_time_unix_nano"],
                         "9223372036854775807")
        self.assertEqual(spans[3]["events"][0]["time_unix_nano"],
                         "18446744073709551615")
        self.assertEqual(spans[0]["flags"], 0x301)
        self.assertEqual(spans[0]["resource"]["attributes"]["service.name"],
                         s("tokenmeterd"))
        # (b) the same content as OTLP/JSON, through TestCollector.
        self.assert_clean(js)
        self.assertIn("TestCollector", js["decoder"])
        self.assertEqual(js["test_collector"], {"status": 200, "spans": 4})
        self.assertEqual(js["message"], pb["message"])

    def test_gzip_bodies_decode_to_the_same_message(self):
        with otel.Receiver() as r:
            otel.export_reference_spans(DOC, r.traces_url, compression="gzip")
            raw = json_body()
            zipped = gzip.compress(raw)
            status, _, _ = post(r.traces_url, zipped, encoding="gzip")
            self.assertEqual(status, 200)
            pb, js = r.wait_requests(2)
        for record in (pb, js):
            self.assert_clean(record)
            self.assertEqual(record["content_encoding"], "gzip")
            self.assertEqual(record["message"],
                             otel.expected_message(DOC, sdk=True))
        self.assertEqual(js["body_bytes"], len(zipped))
        self.assertEqual(js["decoded_bytes"], len(raw))
        self.assertEqual(js["test_collector"], {"status": 200, "spans": 4})
        self.assertGreater(pb["decoded_bytes"], pb["body_bytes"])

    def test_fail_status_with_retry_after_then_ok(self):
        with otel.Receiver(fail_status=503, fail_count=2,
                           retry_after=7) as r:
            answers = [post(r.traces_url, json_body()) for _ in range(3)]
            records = r.wait_requests(3)
            counts = r.stop()
        self.assertEqual([a[0] for a in answers], [503, 503, 200])
        self.assertEqual([a[1].get("Retry-After") for a in answers],
                         ["7", "7", None])
        self.assertEqual([x["fault"] for x in records],
                         ["status 503", "status 503", None])
        self.assertEqual([x["status"] for x in records], [503, 503, 200])
        # A failed request is still decoded and recorded.
        self.assertEqual([x["items"] for x in records], [4, 4, 4])
        self.assertEqual((counts["received"], counts["failed_status"],
                          counts["ok"]), (3, 2, 1))

    def test_sdk_exporter_retries_through_503(self):
        # OpenTelemetry's own exporter must take the 503 as retryable.
        with otel.Receiver(fail_status=503, fail_count=1,
                           retry_after=2) as r:
            start = time.monotonic()
            otel.export_reference_spans(DOC, r.traces_url)
            elapsed = time.monotonic() - start
            first, second = r.wait_requests(2)
        self.assertEqual((first["status"], second["status"]), (503, 200))
        self.assertEqual(first["message"], second["message"])
        gap_ns = int(second["monotonic_ns"]) - int(first["monotonic_ns"])
        gap_s = gap_ns / 1e9
        # Its own backoff would wait 0.8 to 1.2 s.
        self.assertGreaterEqual(gap_s, 1.9, "Retry-After: 2 not honoured")
        self.assertLess(elapsed, 30)

    def test_reset_then_ok(self):
        with otel.Receiver(reset_count=1) as r:
            with self.assertRaises((ConnectionResetError,
                                    http.client.RemoteDisconnected,
                                    BrokenPipeError)):
                post(r.traces_url, json_body())
            self.assertEqual(post(r.traces_url, json_body())[0], 200)
            reset, ok = r.wait_requests(2)
            counts = r.stop()
        self.assertEqual((reset["fault"], reset["status"]), ("reset", None))
        self.assertEqual(reset["items"], 4)
        self.assertEqual((ok["fault"], ok["status"]), (None, 200))
        self.assertEqual((counts["reset"], counts["ok"]), (1, 1))

    def test_stall_times_out_the_client(self):
        with otel.Receiver(stall_count=1) as r:
            start = time.monotonic()
            with self.assertRaises((socket.timeout, TimeoutError)):
                post(r.traces_url, json_body(), timeout=0.5)
            self.assertGreaterEqual(time.monotonic() - start, 0.5)
            stalled = r.wait_requests(1)[0]
            self.assertEqual(post(r.traces_url, json_body())[0], 200)
            counts = r.stop()
        self.assertEqual((stalled["fault"], stalled["status"]),
                         ("stall", None))
        self.assertEqual((counts["stalled"], counts["ok"]), (1, 1))

    def test_stall_every_request(self):
        with otel.Receiver(stall=True) as r:
            for _ in range(2):
                with self.assertRaises((socket.timeout, TimeoutError)):
                    post(r.traces_url, json_body(), timeout=0.3)
            self.assertEqual([x["fault"] for x in r.wait_requests(2)],
                             ["stall", "stall"])

    def test_partial_success(self):
        with otel.Receiver(partial_success=3, partial_message="too old") as r:
            status, _, body = post(r.traces_url, json_body())
            mstatus, _, mbody = post(r.metrics_url, json.dumps(
                METRICS_JSON).encode())
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body), {"partialSuccess": {
            "rejectedSpans": "3", "errorMessage": "too old"}})
        self.assertEqual(mstatus, 200)
        self.assertEqual(json.loads(mbody), {"partialSuccess": {
            "rejectedDataPoints": "3", "errorMessage": "too old"}})

    def test_metrics_json_normalized(self):
        with otel.Receiver() as r:
            status, _, _ = post(r.metrics_url, json.dumps(
                METRICS_JSON).encode())
            record = r.wait_requests(1)[0]
        self.assertEqual(status, 200)
        self.assert_clean(record)
        self.assertEqual(record["signal"], "metrics")
        self.assertEqual(record["items"], 3)
        metrics = record["message"]["resource_metrics"][0]["scope_metrics"][
            0]["metrics"]
        self.assertEqual(metrics, METRICS_EXPECTED)

    def test_invalid_otlp_is_reported(self):
        bad = otlp_json(DOC)
        span = bad["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        span["traceId"] = "CvdlGRbNQ92ESOshHIAxnA=="  # base64, not hex
        span["start_time_unix_nano"] = span.pop("startTimeUnixNano")
        span["kind"] = "SPAN_KIND_SERVER"
        span["endTimeUnixNano"] = 1767225601987654321  # inexact number
        with otel.Receiver() as r:
            status, _, _ = post(r.traces_url, json.dumps(bad).encode())
            other, _, _ = post(r.traces_url, json_body(),
                               content_type="application/json; "
                               "charset=utf-8")
            junk, _, _ = post(r.traces_url, b"\x0a\x05junk",
                              content_type="application/x-protobuf")
            record, typed, garbled = r.wait_requests(3)
        self.assertEqual(status, 200)  # read, with its faults reported
        errors = "\n".join(record["errors"])
        self.assertIn("traceId", errors)
        self.assertIn("is not hex", errors)
        self.assertIn("enum by name SPAN_KIND_SERVER", errors)
        self.assertIn("beyond 2^53", errors)
        self.assertEqual(record["unknown_fields"],
                         ["resourceSpans[0].scopeSpans[0].spans[0]."
                          "start_time_unix_nano"])
        self.assertEqual(other, 415)
        self.assertEqual(typed["status"], 415)
        self.assertEqual(junk, 400)
        self.assertIsNone(garbled["message"])
        self.assertTrue(garbled["errors"][0].startswith("protobuf:"))

    def test_client_gone_before_the_body_ended_is_recorded(self):
        with otel.Receiver() as r:
            with socket.create_connection(("127.0.0.1", r.port)) as c:
                c.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/json\r\n"
                          b"Content-Length: 100\r\n\r\n{\"resource")
            record = r.wait_requests(1)[0]
            counts = r.stop()
        self.assertEqual((record["status"], record["message"]), (None, None))
        self.assertEqual(record["body_bytes"], 10)
        self.assertIn("before the body ended", record["errors"][0])
        self.assertEqual((counts["received"], counts["bad"]), (1, 1))

    @unittest.skipUnless(shutil.which("openssl"), "openssl not found")
    def test_https_requires_a_client_certificate(self):
        with tempfile.TemporaryDirectory(prefix="tm-otel-tls-") as tmp:
            certs = make_certs(tmp)
            with otel.Receiver(tls_cert=certs["server.crt"],
                               tls_key=certs["server.key"],
                               client_ca=certs["ca.crt"]) as r:
                self.assertTrue(r.url.startswith("https://"))
                ctx = ssl.create_default_context(cafile=certs["ca.crt"])
                ctx.load_cert_chain(certs["client.crt"], certs["client.key"])
                status, _, _ = post(r.traces_url, json_body(), context=ctx)
                self.assertEqual(status, 200)
                bare = ssl.create_default_context(cafile=certs["ca.crt"])
                with self.assertRaises((ssl.SSLError, ConnectionResetError,
                                        BrokenPipeError,
                                        http.client.RemoteDisconnected)):
                    post(r.traces_url, json_body(), context=bare)
                record = r.wait_requests(1)[0]
                counts = r.stop()
        self.assertEqual(record["tls"], {"authorized": True,
                                         "peer_subject": "otel-client"})
        self.assertEqual(record["message"],
                         otel.expected_message(DOC, sdk=True))
        self.assertEqual((counts["received"], counts["tls_errors"]), (1, 1))


METRICS_JSON = {"resourceMetrics": [{
    "resource": {"attributes": [{"key": "service.name",
                                 "value": {"stringValue": "tokenmeterd"}}]},
    "scopeMetrics": [{"scope": {"name": "tokenmeterd"}, "metrics": [
        {"name": "tokenmeter_requests", "unit": "{request}",
         "sum": {"aggregationTemporality": 2, "isMonotonic": True,
                 "dataPoints": [{"startTimeUnixNano": "1",
                                 "timeUnixNano": "1767225600000000001",
                                 "asInt": "9007199254740993",
                                 "attributes": [{"key": "model", "value": {
                                     "stringValue": "m"}}]}]}},
        {"name": "tokenmeter_e2e_seconds", "unit": "s",
         "exponentialHistogram": {"aggregationTemporality": 2, "dataPoints": [
             {"startTimeUnixNano": "1", "timeUnixNano": "2", "count": "3",
              "sum": 0.75, "scale": 3, "zeroCount": "1",
              "zeroThreshold": 1e-128,
              "positive": {"offset": -5, "bucketCounts": ["1", "0", "1"]}}]}},
        {"name": "tokenmeter_queue_seconds", "unit": "s",
         "histogram": {"aggregationTemporality": 2, "dataPoints": [
             {"startTimeUnixNano": "1", "timeUnixNano": "2", "count": "2",
              "bucketCounts": ["1", "1"], "explicitBounds": [0.5],
              "min": 0.25, "max": 1}]}},
    ]}]}]}

METRICS_EXPECTED = [
    {"name": "tokenmeter_requests", "description": "", "unit": "{request}",
     "metadata": {}, "type": "sum", "aggregation_temporality": 2,
     "is_monotonic": True, "data_points": [{
         "attributes": {"model": s("m")}, "start_time_unix_nano": "1",
         "time_unix_nano": "1767225600000000001",
         "value": {"type": "int", "value": "9007199254740993"},
         "exemplars": [], "flags": 0}]},
    {"name": "tokenmeter_e2e_seconds", "description": "", "unit": "s",
     "metadata": {}, "type": "exponential_histogram",
     "aggregation_temporality": 2, "data_points": [{
         "attributes": {}, "start_time_unix_nano": "1",
         "time_unix_nano": "2", "count": "3", "sum": 0.75, "scale": 3,
         "zero_count": "1",
         "positive": {"offset": -5, "bucket_counts": ["1", "0", "1"]},
         "negative": {"offset": 0, "bucket_counts": []}, "flags": 0,
         "exemplars": [], "min": None, "max": None,
         "zero_threshold": 1e-128}]},
    {"name": "tokenmeter_queue_seconds", "description": "", "unit": "s",
     "metadata": {}, "type": "histogram", "aggregation_temporality": 2,
     "data_points": [{
         "attributes": {}, "start_time_unix_nano": "1", "time_unix_nano": "2",
         "count": "2", "sum": None, "bucket_counts": ["1", "1"],
         "explicit_bounds": [0.5], "exemplars": [], "flags": 0, "min": 0.25,
         "max": 1}]},
]


def make_certs(tmp):
    """A CA, a server certificate for 127.0.0.1 and a client certificate
    (CN otel-client), EC P-256, made with the openssl command; {name:
    path}."""
    def run(*args):
        subprocess.run(["openssl", *args], cwd=tmp, check=True,
                       capture_output=True)
    paths = {n: os.path.join(tmp, n) for n in (
        "ca.key", "ca.crt", "server.key", "server.crt", "client.key",
        "client.crt")}
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "2", "-subj", "/CN=otel-test-ca")
    ext = os.path.join(tmp, "server.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    for name, extra in (("server", ["-extfile", ext]), ("client", [])):
        cn = "127.0.0.1" if name == "server" else "otel-client"
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={cn}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt",
            "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
            "-out", f"{name}.crt", *extra)
    return paths


if __name__ == "__main__":
    otel.skip_unless_otel()
    tu.main()
