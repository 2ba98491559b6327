#!/usr/bin/python3
"""tokenmeterd's OTLP trace encoder (daemon/trace/otlp_trace_encoder.*)
read by OpenTelemetry's own code, not by ours:

* (a) the protobuf body of the test timelines' spans
  (tests/daemon/trace/test_timelines.h, written by encode_spans_tool) is
  POSTed to tests/otel/receiver.mjs, which decodes it with OpenTelemetry's
  generated protobuf code; the normalized message must equal the expected
  spans exactly: ids, parent links, names, kinds, flags, trace_state,
  times to the nanosecond, typed attributes, status, resource and scope;
* (b) the OTLP/JSON body of the same spans goes through contrib-test-utils'
  TestCollector and JSON.parse and must normalize to the identical
  message;
* (c) differential: the same spans exported by the OpenTelemetry JS SDK
  (tests/otel/reference_spans.mjs) decode to the same message, except
  trace_state, which the SDK cannot set on a span (docs/testing.md).
  Flags are compared too: ours follow the SDK's (0x101, 0x301 under a
  remote parent).

A few values are also checked as written by hand here, so that the test
does not rest on the tool's expected document alone.

Usage: otlp_trace_encoder_otel_test.py ENCODE_SPANS_TOOL
Skipped (77) without node or tests/otel/node_modules.
"""
import copy
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(SRC, "tests", "testutil"))
import otel  # noqa: E402
import tokenmeter_testutil as tu  # noqa: E402

TOOL = None  # set from argv in __main__


def post(url, body, content_type):
    """One POST: (status, body bytes)."""
    rest = url.partition("://")[2]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        conn.request("POST", "/" + path, body=body,
                     headers={"Content-Type": content_type})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def without_trace_state(message):
    m = copy.deepcopy(message)
    for rs in m["resource_spans"]:
        for ss in rs["scope_spans"]:
            for sp in ss["spans"]:
                sp["trace_state"] = ""
    return m


class TraceEncoderOtelTest(unittest.TestCase):
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        otel.skip_unless_otel()
        cls.tmp = tempfile.mkdtemp(prefix="tm-trace-", dir="/tmp")
        run = subprocess.run([TOOL, cls.tmp], capture_output=True,
                             text=True, timeout=60)
        if run.returncode != 0:
            raise AssertionError(f"{TOOL} exited {run.returncode}: "
                                 f"{run.stderr}")
        with open(os.path.join(cls.tmp, "spans.pb"), "rb") as f:
            cls.pb_body = f.read()
        with open(os.path.join(cls.tmp, "spans.json"), "rb") as f:
            cls.json_body = f.read()
        with open(os.path.join(cls.tmp, "expected.json")) as f:
            cls.doc = json.load(f)
        # The SDK's document: what it can express (trace_state cannot be
        # set; flags are the SDK's own; both keys are ours).
        sdk_doc = copy.deepcopy(cls.doc)
        for sp in sdk_doc["spans"]:
            del sp["trace_state"], sp["flags"]
        with otel.Receiver() as r:
            cls.pb_status = post(r.traces_url, cls.pb_body,
                                 "application/x-protobuf")
            r.wait_requests(1)
            cls.json_status = post(r.traces_url, cls.json_body,
                                   "application/json")
            r.wait_requests(2)
            cls.sdk_out = otel.export_reference_spans(sdk_doc, r.traces_url)
            cls.records = r.wait_requests(3)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def assert_clean(self, record):
        self.assertEqual(record["status"], 200, record["errors"])
        self.assertEqual(record["errors"], [])
        self.assertEqual(record["unknown_fields"], [])
        self.assertEqual(record["items"], len(self.doc["spans"]))

    def test_a_protobuf_decodes_to_exactly_the_expected_spans(self):
        self.assertEqual(self.pb_status[0], 200)
        pb = self.records[0]
        self.assert_clean(pb)
        self.assertEqual(pb["content_type"], "application/x-protobuf")
        self.assertIn("generated", pb["decoder"])
        self.assertEqual(pb["message"], otel.expected_message(self.doc))

    def test_b_json_normalizes_to_the_identical_message(self):
        self.assertEqual(self.json_status, (200, b"{}"))
        js = self.records[1]
        self.assert_clean(js)
        self.assertIn("TestCollector", js["decoder"])
        self.assertEqual(js["test_collector"],
                         {"status": 200, "spans": len(self.doc["spans"])})
        self.assertEqual(js["message"], self.records[0]["message"])

    def test_c_the_sdk_export_of_the_same_spans_decodes_the_same(self):
        n = len(self.doc["spans"])
        self.assertEqual(self.sdk_out.strip(), f"exported {n} spans")
        sdk = self.records[2]
        self.assert_clean(sdk)
        self.assertEqual(sdk["message"],
                         without_trace_state(self.records[0]["message"]))

    def test_values_written_by_hand(self):
        spans = otel.spans_of(self.records[0])
        self.assertEqual(len(spans), 4 + 7 + 4 + 4)
        self.assertEqual(
            [s["name"] for s in spans[:11]],
            ["llm_request", "queue", "prefill", "decode",
             "llm_request", "queue", "kv_transfer.recv", "prefill",
             "preempted", "preempted", "decode"])
        root = spans[0]
        self.assertEqual(root["trace_id"], "0af7651916cd43dd8448eb211c80319c")
        self.assertEqual(root["parent_span_id"], "b7ad6b7169203331")
        self.assertEqual(root["kind"], 2)
        self.assertEqual(root["flags"], 0x301)
        self.assertEqual(root["trace_state"], "vendor=abc,other=x1")
        # ARRIVED at monotonic 1000 s + the offset: 2026-01-01 UTC.
        self.assertEqual(root["start_time_unix_nano"], "1767225600123456789")
        self.assertEqual(root["end_time_unix_nano"], "1767225602123956800")
        attrs = root["attributes"]
        self.assertEqual(attrs["gen_ai.latency.e2e"],
                         {"type": "double", "value": 2.000500011})
        self.assertEqual(attrs["gen_ai.usage.input_tokens"],
                         {"type": "int", "value": "512"})
        self.assertEqual(attrs["tokenmeter.priority"],
                         {"type": "int", "value": "-3"})
        self.assertEqual(attrs["gen_ai.response.finish_reasons"],
                         {"type": "array",
                          "value": [{"type": "string", "value": "stop"}]})
        self.assertEqual(attrs["tokenmeter.label.tenant"],
                         {"type": "string", "value": "acme"})
        child = spans[1]
        self.assertEqual(child["parent_span_id"], root["span_id"])
        self.assertEqual(child["flags"], 0x101)
        self.assertEqual(child["kind"], 1)
        # The failed request: ERROR root, a KV send failed with a reason.
        failed = spans[11]
        self.assertEqual(failed["status"],
                         {"code": 2, "message": "request finished with error"})
        self.assertEqual(failed["attributes"]["tokenmeter.request_id"],
                         {"type": "string", "value": 'req-"\u03b1"\\1\t'})
        self.assertEqual(failed["attributes"]["tokenmeter.label.route"],
                         {"type": "string", "value": "r" * 150})
        self.assertEqual(failed["parent_span_id"], "")
        self.assertEqual(failed["flags"], 0x101)
        self.assertEqual(spans[13]["status"],
                         {"code": 2, "message": "timeout"})
        self.assertEqual(spans[13]["start_time_unix_nano"],
                         "1767227600223456848")
        resource = spans[0]["resource"]["attributes"]
        self.assertEqual(resource["service.name"],
                         {"type": "string", "value": "tokenmeterd"})
        self.assertEqual(spans[0]["scope"]["name"], "tokenmeterd")
        self.assertEqual(spans[0]["scope"]["version"], "1.2.0")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    TOOL = sys.argv.pop(1)
    otel.skip_unless_otel()
    tu.main()
