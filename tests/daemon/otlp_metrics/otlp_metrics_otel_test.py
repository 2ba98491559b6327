#!/usr/bin/python3
"""tokenmeterd's OTLP metrics encoder (daemon/otlp_metrics/) read by
OpenTelemetry's own code, every data point compared with /metrics of the
same registry at the same moment:

* encode_metrics_tool renders two registries (tests/daemon/exposition's
  PopulatedRegistry and ProfilesRegistry, plus native-bucket boundary,
  zero and spread observations) as /metrics text 0.0.4, the Prometheus
  protobuf exposition, and OTLP bodies (protobuf and JSON; exponential and
  explicit histograms);
* each OTLP body is POSTed to tests/otel/receiver.mjs, which decodes
  protobuf with the generated code of @opentelemetry/otlp-transformer and
  JSON with JSON.parse, and normalizes both (otlp_normalize.mjs): no
  errors, no unknown fields, and the protobuf and JSON bodies of one
  content decode to the identical message;
* the text is parsed with prometheus_client's parser: every counter,
  gauge and info sample is one OTLP point of equal value and labels (the
  counter's OTLP name its text 0.0.4 name, with _total; counter -> monotonic cumulative Sum,
  gauge -> Gauge, *_info -> non-monotonic cumulative Sum), every histogram
  one point with the text's _count and _sum; explicit form: the bounds are
  the text's finite `le` values and the counts its de-cumulated buckets;
* the exponential form against the protobuf exposition's native buckets
  (decoded here by a small reader written from Prometheus' metrics.proto):
  scale = schema, zero count and threshold, and the same buckets with OTLP
  index = Prometheus index - 1; and the quantiles 0.01 .. 0.99 computed as
  Prometheus' histogram_quantile computes them for a native histogram
  (promql/quantile.go: ascending buckets, the rank's bucket, linear in
  the zero bucket, exponential interpolation inside an exponential bucket;
  Prometheus' OTLP receiver turns an ExponentialHistogram into that native
  histogram with the same scale and index + 1) equal, from each side with
  its own index convention;
* every point: time_unix_nano the push's, start_time_unix_nano the default
  except the series engine="1" (the per-series hook); resource and scope.

Usage: otlp_metrics_otel_test.py ENCODE_METRICS_TOOL
Skipped (77) without node or tests/otel/node_modules.
"""
import copy
import http.client
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

from prometheus_client.parser import text_string_to_metric_families

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(SRC, "tests", "testutil"))
import otel  # noqa: E402
import tokenmeter_testutil as tu  # noqa: E402,F401

TOOL = None  # set from argv in __main__
K_TIME = "1750000000000000123"
K_START = 1749999000000000000
REGISTRIES = ("populated", "profiles")
BODIES = ("exp.pb", "exp.json", "explicit.pb", "explicit.json")
QUANTILES = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99)


def post(url, body, content_type):
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


# ---- the Prometheus protobuf exposition (metrics.proto), read by hand

def varint(buf, i):
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            return v, i
        shift += 7


def fields(buf):
    """[(number, wire, value)]: value an int (varint, fixed64 bits) or
    bytes (length-delimited)."""
    out = []
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v = struct.unpack_from("<Q", buf, i)[0]
            i += 8
        elif wire == 2:
            n, i = varint(buf, i)
            v = bytes(buf[i:i + n])
            i += n
        elif wire == 5:
            v = struct.unpack_from("<I", buf, i)[0]
            i += 4
        else:
            raise AssertionError(f"wire type {wire}")
        out.append((number, wire, v))
    return out


def as_double(bits):
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def unzigzag(v):
    return (v >> 1) ^ -(v & 1)


def repeated_varints(wire, v):
    """A repeated varint field's values, packed or not."""
    if wire == 0:
        return [v]
    out, i = [], 0
    while i < len(v):
        x, i = varint(v, i)
        out.append(x)
    return out


def native_buckets(spans, deltas):
    """Spans and deltas -> {prometheus index: count}."""
    out, idx, count, d = {}, 0, 0, iter(deltas)
    for offset, length in spans:
        idx += offset  # the first: the start; then the gap
        for _ in range(length):
            count += next(d)
            if count:
                out[idx] = count
            idx += 1
    return out


def parse_prom_protobuf(buf):
    """{(family name, frozenset(labels)): native histogram dict} for every
    histogram sample."""
    out = {}
    i = 0
    while i < len(buf):
        n, i = varint(buf, i)
        family = fields(buf[i:i + n])
        i += n
        name = next(v.decode() for f, _, v in family if f == 1)
        for f, _, metric in family:
            if f != 4:
                continue
            labels, hist = {}, None
            for mf, _, mv in fields(metric):
                if mf == 1:
                    lp = dict((a, b.decode()) for a, _, b in fields(mv))
                    labels[lp[1]] = lp[2]
                elif mf == 7:
                    hist = mv
            if hist is None:
                continue
            h = {"count": 0, "sum": 0.0, "schema": 0, "zero_threshold": 0.0,
                 "zero_count": 0}
            spans = {9: [], 12: []}
            deltas = {10: [], 13: []}
            for hf, wire, hv in fields(hist):
                if hf == 1:
                    h["count"] = hv
                elif hf == 2:
                    h["sum"] = as_double(hv)
                elif hf == 5:
                    h["schema"] = unzigzag(hv)
                elif hf == 6:
                    h["zero_threshold"] = as_double(hv)
                elif hf == 7:
                    h["zero_count"] = hv
                elif hf in spans:
                    s = dict((a, b) for a, _, b in fields(hv))
                    spans[hf].append((unzigzag(s.get(1, 0)), s.get(2, 0)))
                elif hf in deltas:
                    deltas[hf] += [unzigzag(x)
                                   for x in repeated_varints(wire, hv)]
            h["negative"] = native_buckets(spans[9], deltas[10])
            h["positive"] = native_buckets(spans[12], deltas[13])
            out[(name, frozenset(labels.items()))] = h
    return out


# ---- quantiles as Prometheus computes them for a native histogram

def histogram_quantile(q, count, zero_count, zero_threshold, buckets):
    """promql/quantile.go HistogramQuantile for an exponential native
    histogram. `buckets`: [(lower, upper, count)] of the negative and
    positive buckets (any order; lower < upper)."""
    if count == 0:
        return math.nan
    neg = sorted((b for b in buckets if b[1] <= 0), key=lambda b: b[0])
    pos = sorted((b for b in buckets if b[0] >= 0), key=lambda b: b[0])
    has_neg = any(c for _, _, c in neg)
    has_pos = any(c for _, _, c in pos)
    zero = (-zero_threshold, zero_threshold, zero_count)
    rank = q * count
    seen = 0
    bucket = None
    for b in neg + [zero] + pos:
        if b[2] == 0:
            continue
        bucket = b
        seen += b[2]
        if seen >= rank:
            break
    lower, upper, c = bucket
    if lower < 0 < upper:
        if not has_neg and has_pos:
            lower = 0
        elif not has_pos and has_neg:
            upper = 0
    seen = min(seen, count)
    if seen < rank:
        return upper
    rank -= seen - c
    fraction = rank / c
    if lower <= 0 <= upper:
        return lower + (upper - lower) * fraction
    log_lower = math.log2(abs(lower))
    log_upper = math.log2(abs(upper))
    if lower > 0:
        return math.exp2(log_lower + (log_upper - log_lower) * fraction)
    return -math.exp2(log_upper + (log_lower - log_upper) * (1 - fraction))


def prometheus_bounds(schema, k):
    """Native bucket k at `schema`: (base^(k-1), base^k]."""
    return 2.0 ** ((k - 1) / 2.0 ** schema), 2.0 ** (k / 2.0 ** schema)


def otlp_bounds(scale, i):
    """OTLP exponential bucket i at `scale`: (base^i, base^(i+1)]."""
    return 2.0 ** (i / 2.0 ** scale), 2.0 ** ((i + 1) / 2.0 ** scale)


def native_quantiles(h):
    buckets = []
    for k, c in h["positive"].items():
        lo, hi = prometheus_bounds(h["schema"], k)
        buckets.append((lo, hi, c))
    for k, c in h["negative"].items():
        lo, hi = prometheus_bounds(h["schema"], k)
        buckets.append((-hi, -lo, c))
    return [histogram_quantile(q, h["count"], h["zero_count"],
                               h["zero_threshold"], buckets)
            for q in QUANTILES]


def otlp_quantiles(p):
    buckets = []
    for side, sign in (("positive", 1), ("negative", -1)):
        off = p[side]["offset"]
        for j, c in enumerate(p[side]["bucket_counts"]):
            lo, hi = otlp_bounds(p["scale"], off + j)
            c = int(c)
            if c:
                buckets.append((lo, hi, c) if sign > 0 else (-hi, -lo, c))
    return [histogram_quantile(q, int(p["count"]), int(p["zero_count"]),
                               p["zero_threshold"], buckets)
            for q in QUANTILES]


# ---- helpers over the normalized OTLP message

def attrs(point):
    out = {}
    for k, v in point["attributes"].items():
        assert v["type"] == "string", (k, v)
        out[k] = v["value"]
    return frozenset(out.items())


def number(point):
    v = point["value"]
    if v["type"] == "int":
        return float(int(v["value"]))
    if v["type"] == "double":
        return float(v["value"]) if not isinstance(v["value"], str) \
            else float(v["value"].replace("Infinity", "inf"))
    raise AssertionError(f"no value: {point}")


def without_process_values(message):
    """The message with the process_* points' values blanked: the tool
    renders each body separately and those are read from /proc each time."""
    m = copy.deepcopy(message)
    for rm in m["resource_metrics"]:
        for sm in rm["scope_metrics"]:
            for metric in sm["metrics"]:
                if metric["name"].startswith("process_"):
                    for p in metric["data_points"]:
                        p["value"] = None
    return m


def unit_of(name):
    for suffix, unit in (("_seconds", "s"), ("_bytes", "By"),
                         ("_ratio", "1")):
        if name.endswith(suffix) and len(name) > len(suffix):
            return unit
    return ""


class OtlpMetricsOtelTest(unittest.TestCase):
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        otel.skip_unless_otel()
        cls.tmp = tempfile.mkdtemp(prefix="tm-otlpm-", dir="/tmp")
        run = subprocess.run([TOOL, cls.tmp], capture_output=True,
                             text=True, timeout=60)
        if run.returncode != 0:
            raise AssertionError(f"{TOOL} exited {run.returncode}: "
                                 f"{run.stderr}")
        cls.text, cls.prom, cls.records, cls.statuses = {}, {}, {}, {}
        with otel.Receiver() as r:
            n = 0
            for reg in REGISTRIES:
                with open(os.path.join(cls.tmp, reg + ".txt")) as f:
                    cls.text[reg] = f.read()
                with open(os.path.join(cls.tmp, reg + ".prom.pb"), "rb") as f:
                    cls.prom[reg] = f.read()
                for body in BODIES:
                    with open(os.path.join(cls.tmp, f"{reg}.{body}"),
                              "rb") as f:
                        data = f.read()
                    ctype = ("application/json" if body.endswith("json")
                             else "application/x-protobuf")
                    cls.statuses[(reg, body)] = post(r.metrics_url, data,
                                                     ctype)[0]
                    n += 1
                    cls.records[(reg, body)] = r.wait_requests(n)[n - 1]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def metrics(self, reg, body):
        m = self.records[(reg, body)]["message"]
        self.assertEqual(len(m["resource_metrics"]), 1)
        rm = m["resource_metrics"][0]
        self.assertEqual(len(rm["scope_metrics"]), 1)
        return rm["scope_metrics"][0]["metrics"]

    def test_a_every_body_decodes_cleanly_and_json_equals_protobuf(self):
        for reg in REGISTRIES:
            for body in BODIES:
                rec = self.records[(reg, body)]
                with self.subTest(reg=reg, body=body):
                    self.assertEqual(self.statuses[(reg, body)], 200)
                    self.assertEqual(rec["status"], 200, rec["errors"])
                    self.assertEqual(rec["errors"], [])
                    self.assertEqual(rec["unknown_fields"], [])
                    self.assertGreater(rec["items"], 20)
                    if body.endswith("pb"):
                        self.assertIn("otlp-transformer", rec["decoder"])
            for form in ("exp", "explicit"):
                self.assertEqual(
                    without_process_values(
                        self.records[(reg, form + ".json")]["message"]),
                    without_process_values(
                        self.records[(reg, form + ".pb")]["message"]),
                    f"{reg} {form}")

    def test_resource_scope_and_times(self):
        for reg in REGISTRIES:
            rm = self.records[(reg, "exp.pb")]["message"][
                "resource_metrics"][0]
            self.assertEqual(rm["resource"]["attributes"], {
                "service.name": {"type": "string", "value": "tokenmeterd"},
                "service.instance.id": {"type": "string",
                                        "value": "test:9400"}})
            scope = rm["scope_metrics"][0]["scope"]
            self.assertEqual((scope["name"], scope["version"]),
                             ("tokenmeterd", "test"))
            hooked = 0
            for m in rm["scope_metrics"][0]["metrics"]:
                for p in m["data_points"]:
                    self.assertEqual(p["time_unix_nano"], K_TIME)
                    engine1 = ("engine", "1") in attrs(p)
                    hooked += engine1
                    self.assertEqual(int(p["start_time_unix_nano"]),
                                     K_START + (1 if engine1 else 0),
                                     m["name"])
            if reg == "populated":
                self.assertGreater(hooked, 10)

    def test_counters_gauges_and_info_equal_the_text(self):
        for reg in REGISTRIES:
            # By OTLP name: the Prometheus metric name, not altered (a
            # counter's text 0.0.4 name has _total; the parser's family
            # name does not).
            families = {f.name + ("_total" if f.type == "counter" else ""): f
                        for f in
                        text_string_to_metric_families(self.text[reg])}
            for body in ("exp.pb", "explicit.pb"):
                metrics = self.metrics(reg, body)
                names = [m["name"] for m in metrics]
                self.assertEqual(len(names), len(set(names)),
                                 "a name twice")
                # Every text family with samples is one OTLP metric.
                shown = {n for n, f in families.items() if f.samples}
                self.assertEqual(set(names), shown)
                for m in metrics:
                    f = families[m["name"]]
                    with self.subTest(reg=reg, body=body, metric=m["name"]):
                        self.assertEqual(m["description"], f.documentation)
                        self.assertEqual(m["unit"], unit_of(f.name))
                        self.assertEqual(
                            m["metadata"]["prometheus.type"]["value"],
                            f.type)
                        if f.type == "histogram":
                            continue
                        if f.type == "counter":
                            self.assertEqual(m["type"], "sum")
                            self.assertTrue(m["is_monotonic"])
                            self.assertEqual(m["aggregation_temporality"], 2)
                            sample_name = f.name + "_total"
                        elif f.name.endswith("_info"):
                            self.assertEqual(m["type"], "sum")
                            self.assertFalse(m["is_monotonic"])
                            self.assertEqual(m["aggregation_temporality"], 2)
                            sample_name = f.name
                        else:
                            self.assertEqual(f.type, "gauge")
                            self.assertEqual(m["type"], "gauge")
                            sample_name = f.name
                        want = {frozenset(s.labels.items()): s.value
                                for s in f.samples
                                if s.name == sample_name}
                        got = {attrs(p): number(p) for p in m["data_points"]}
                        self.assertEqual(len(got), len(m["data_points"]))
                        self.assertEqual(got.keys(), want.keys())
                        if m["name"].startswith("process_"):
                            continue  # read from /proc again at each render
                        for k, v in want.items():
                            if math.isnan(v):
                                self.assertTrue(math.isnan(got[k]))
                            else:
                                self.assertEqual(got[k], v, sorted(k))

    def text_histograms(self, reg):
        """{(name, labels): {count, sum, les: [(le, cumulative)]}}"""
        out = {}
        for f in text_string_to_metric_families(self.text[reg]):
            if f.type != "histogram":
                continue
            for s in f.samples:
                labels = dict(s.labels)
                le = labels.pop("le", None)
                h = out.setdefault((f.name, frozenset(labels.items())),
                                   {"les": []})
                if s.name.endswith("_bucket"):
                    h["les"].append((float(le), s.value))
                elif s.name.endswith("_count"):
                    h["count"] = s.value
                elif s.name.endswith("_sum"):
                    h["sum"] = s.value
        return out

    def test_explicit_histograms_equal_the_text_buckets(self):
        for reg in REGISTRIES:
            text = self.text_histograms(reg)
            seen = 0
            for m in self.metrics(reg, "explicit.pb"):
                if m["name"] not in {n for n, _ in text}:
                    continue
                self.assertEqual(m["type"], "histogram")
                self.assertEqual(m["aggregation_temporality"], 2)
                for p in m["data_points"]:
                    h = text[(m["name"], attrs(p))]
                    les = sorted(h["les"])
                    self.assertEqual(les[-1][0], math.inf)
                    self.assertEqual(p["explicit_bounds"],
                                     [le for le, _ in les[:-1]])
                    per_bucket = [int(c - (les[i - 1][1] if i else 0))
                                  for i, (_, c) in enumerate(les)]
                    self.assertEqual([int(c) for c in p["bucket_counts"]],
                                     per_bucket, m["name"])
                    self.assertEqual(int(p["count"]), h["count"])
                    self.assertEqual(p["sum"], h["sum"])
                    seen += 1
            self.assertEqual(seen, len(text), reg)

    def test_exponential_histograms_equal_the_native_buckets(self):
        for reg in REGISTRIES:
            text = self.text_histograms(reg)
            native = parse_prom_protobuf(self.prom[reg])
            self.assertEqual(set(native), set(text))
            seen = boundary_points = 0
            for m in self.metrics(reg, "exp.pb"):
                if m["type"] != "exponential_histogram":
                    self.assertNotIn(m["name"], {n for n, _ in text})
                    continue
                self.assertEqual(m["aggregation_temporality"], 2)
                for p in m["data_points"]:
                    key = (m["name"], attrs(p))
                    h = native[key]
                    with self.subTest(reg=reg, series=str(sorted(key[1])),
                                      metric=m["name"]):
                        self.assertEqual(int(p["count"]), text[key]["count"])
                        self.assertEqual(int(p["count"]), h["count"])
                        self.assertEqual(p["sum"], text[key]["sum"])
                        self.assertEqual(p["scale"], h["schema"])
                        self.assertEqual(int(p["zero_count"]),
                                         h["zero_count"])
                        self.assertEqual(p["zero_threshold"],
                                         h["zero_threshold"])
                        for side in ("positive", "negative"):
                            off = p[side]["offset"]
                            otlp = {off + j + 1: int(c) for j, c in
                                    enumerate(p[side]["bucket_counts"])
                                    if int(c)}
                            self.assertEqual(otlp, h[side], side)
                            counts = p[side]["bucket_counts"]
                            if counts:
                                # dense: the first and last are populated
                                self.assertNotEqual(int(counts[0]), 0)
                                self.assertNotEqual(int(counts[-1]), 0)
                        total = int(p["zero_count"]) + sum(
                            int(c) for s in ("positive", "negative")
                            for c in p[s]["bucket_counts"])
                        self.assertEqual(total, int(p["count"]))
                        if int(p["count"]):
                            self.assertEqual(otlp_quantiles(p),
                                             native_quantiles(h))
                        boundary_points += int(p["zero_count"]) > 0
                        seen += 1
            self.assertEqual(seen, len(text), reg)
            if reg == "populated":
                self.assertGreater(boundary_points, 0)

    def test_quantile_rule_written_by_hand(self):
        # Schema 0: 1 in (0.5, 1], 3 in (2, 4]; the median of {1, 3} is the
        # upper edge of the first bucket, q=0.75 halfway (in log2) through
        # (2, 4]: 2^1.5.
        b = [(0.5, 1.0, 1), (2.0, 4.0, 1)]
        self.assertEqual(histogram_quantile(0.5, 2, 0, 2 ** -128, b), 1.0)
        self.assertAlmostEqual(histogram_quantile(0.75, 2, 0, 2 ** -128, b),
                               2 ** 1.5)
        # OTLP bucket -1 is Prometheus bucket 0: the same bounds.
        self.assertEqual(otlp_bounds(0, -1), prometheus_bounds(0, 0))
        self.assertEqual(otlp_bounds(3, 7), (2 ** (7 / 8), 2.0))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print("usage: otlp_metrics_otel_test.py ENCODE_METRICS_TOOL",
              file=sys.stderr)
        sys.exit(2)
    TOOL = sys.argv.pop(1)
    unittest.main()
