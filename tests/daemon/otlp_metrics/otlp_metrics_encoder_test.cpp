// OtlpMetricsEncoder: the protobuf body read back by a small decoder
// written here from the OTLP field numbers (opentelemetry-proto v1
// metrics.proto), per conversion rule: names, types, temporality, units,
// attributes, both histogram forms, the exponential index convention on
// bucket boundaries, the zero bucket, negative buckets, empty histograms,
// start times; and a whole registry rendered into it against the text
// exposition of the same registry. OpenTelemetry's own decoders read the
// bodies in otlp_metrics_otel_test.py.
#include "daemon/otlp_metrics/otlp_metrics_encoder.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/exposition/exposition.h"
#include "daemon/store/histogram.h"
#include "daemon/store/native_histogram.h"
#include "tests/daemon/exposition/exposition_fixture.h"

namespace tokenmeter::daemon::otlp_metrics {
namespace {

// ---- a protobuf reader (test-only: a failure on malformed input)

struct Field {
  uint32_t number = 0;
  uint32_t wire = 0;
  uint64_t value = 0;      // varint, fixed64
  std::string_view bytes;  // length-delimited
};

uint64_t ReadVarint(std::string_view& in) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (in.empty()) {
      ADD_FAILURE() << "truncated varint";
      return 0;
    }
    const uint8_t b = uint8_t(in[0]);
    in.remove_prefix(1);
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  ADD_FAILURE() << "varint too long";
  return v;
}

std::vector<Field> Fields(std::string_view in) {
  std::vector<Field> out;
  while (!in.empty()) {
    Field f;
    const uint64_t key = ReadVarint(in);
    f.number = uint32_t(key >> 3);
    f.wire = uint32_t(key & 7);
    switch (f.wire) {
      case 0:
        f.value = ReadVarint(in);
        break;
      case 1:
        if (in.size() < 8) {
          ADD_FAILURE() << "truncated fixed64";
          return out;
        }
        for (int i = 0; i < 8; ++i)
          f.value |= uint64_t(uint8_t(in[i])) << (8 * i);
        in.remove_prefix(8);
        break;
      case 2: {
        const uint64_t n = ReadVarint(in);
        if (n > in.size()) {
          ADD_FAILURE() << "length " << n << " past the end";
          return out;
        }
        f.bytes = in.substr(0, n);
        in.remove_prefix(n);
        break;
      }
      default:
        ADD_FAILURE() << "unexpected wire type " << f.wire;
        return out;
    }
    out.push_back(f);
  }
  return out;
}

int32_t UnZigZag32(uint64_t v) {
  return int32_t(uint32_t(v >> 1) ^ -uint32_t(v & 1));
}

// ---- the decoded request

struct Point {
  std::vector<std::pair<std::string, std::string>> attributes;
  uint64_t start = 0;
  uint64_t time = 0;
  // NumberDataPoint
  bool has_int = false;
  bool has_double = false;
  int64_t as_int = 0;
  double as_double = 0;
  // Histogram and ExponentialHistogram points
  uint64_t count = 0;
  bool has_sum = false;
  double sum = 0;
  std::vector<uint64_t> bucket_counts;
  std::vector<double> bounds;
  int32_t scale = 0;
  uint64_t zero_count = 0;
  double zero_threshold = 0;
  bool has_positive = false;
  bool has_negative = false;
  int32_t positive_offset = 0;
  std::vector<uint64_t> positive;
  int32_t negative_offset = 0;
  std::vector<uint64_t> negative;
};

struct Metric {
  std::string name;
  std::string description;
  std::string unit;
  std::map<std::string, std::string> metadata;
  std::string kind;  // gauge, sum, histogram, exponential_histogram
  int kinds = 0;     // data fields present (must be 1)
  uint64_t temporality = 0;
  bool monotonic = false;
  std::vector<Point> points;
};

struct Request {
  int resource_metrics = 0;
  int scope_metrics = 0;
  std::vector<std::pair<std::string, std::string>> resource;
  std::string scope_name;
  std::string scope_version;
  std::vector<Metric> metrics;
};

std::pair<std::string, std::string> KeyValue(std::string_view kv) {
  std::pair<std::string, std::string> out;
  for (const Field& f : Fields(kv)) {
    if (f.number == 1) out.first = std::string(f.bytes);
    if (f.number == 2) {
      for (const Field& a : Fields(f.bytes)) {
        EXPECT_EQ(a.number, 1u) << "not a string_value";
        out.second = std::string(a.bytes);
      }
    }
  }
  return out;
}

void ExponentialBuckets(std::string_view b, int32_t* offset,
                        std::vector<uint64_t>* counts) {
  for (const Field& f : Fields(b)) {
    if (f.number == 1) *offset = UnZigZag32(f.value);
    if (f.number == 2) {
      std::string_view packed = f.bytes;
      while (!packed.empty()) counts->push_back(ReadVarint(packed));
    }
  }
}

Point DecodePoint(std::string_view kind, std::string_view p) {
  Point out;
  const bool number = kind == "gauge" || kind == "sum";
  const bool exponential = kind == "exponential_histogram";
  const uint32_t attributes_field = number ? 7 : exponential ? 1 : 9;
  for (const Field& f : Fields(p)) {
    if (f.number == attributes_field) {
      out.attributes.push_back(KeyValue(f.bytes));
    } else if (f.number == 2) {
      out.start = f.value;
    } else if (f.number == 3) {
      out.time = f.value;
    } else if (number && f.number == 4) {
      out.has_double = true;
      out.as_double = std::bit_cast<double>(f.value);
    } else if (number && f.number == 6) {
      out.has_int = true;
      out.as_int = int64_t(f.value);
    } else if (!number && f.number == 4) {
      out.count = f.value;
    } else if (!number && f.number == 5) {
      out.has_sum = true;
      out.sum = std::bit_cast<double>(f.value);
    } else if (kind == "histogram" && f.number == 6) {
      for (size_t i = 0; i + 8 <= f.bytes.size(); i += 8) {
        uint64_t v = 0;
        for (int j = 0; j < 8; ++j)
          v |= uint64_t(uint8_t(f.bytes[i + j])) << (8 * j);
        out.bucket_counts.push_back(v);
      }
    } else if (kind == "histogram" && f.number == 7) {
      for (size_t i = 0; i + 8 <= f.bytes.size(); i += 8) {
        uint64_t v = 0;
        for (int j = 0; j < 8; ++j)
          v |= uint64_t(uint8_t(f.bytes[i + j])) << (8 * j);
        out.bounds.push_back(std::bit_cast<double>(v));
      }
    } else if (exponential && f.number == 6) {
      out.scale = UnZigZag32(f.value);
    } else if (exponential && f.number == 7) {
      out.zero_count = f.value;
    } else if (exponential && f.number == 8) {
      out.has_positive = true;
      ExponentialBuckets(f.bytes, &out.positive_offset, &out.positive);
    } else if (exponential && f.number == 9) {
      out.has_negative = true;
      ExponentialBuckets(f.bytes, &out.negative_offset, &out.negative);
    } else if (exponential && f.number == 14) {
      out.zero_threshold = std::bit_cast<double>(f.value);
    } else {
      ADD_FAILURE() << kind << " point: unexpected field " << f.number;
    }
  }
  return out;
}

Metric DecodeMetric(std::string_view m) {
  Metric out;
  for (const Field& f : Fields(m)) {
    switch (f.number) {
      case 1:
        out.name = std::string(f.bytes);
        break;
      case 2:
        out.description = std::string(f.bytes);
        break;
      case 3:
        out.unit = std::string(f.bytes);
        break;
      case 12:
        out.metadata.insert(KeyValue(f.bytes));
        break;
      case 5:
      case 7:
      case 9:
      case 10: {
        ++out.kinds;
        out.kind = f.number == 5   ? "gauge"
                   : f.number == 7 ? "sum"
                   : f.number == 9 ? "histogram"
                                   : "exponential_histogram";
        for (const Field& d : Fields(f.bytes)) {
          if (d.number == 1) {
            out.points.push_back(DecodePoint(out.kind, d.bytes));
          } else if (d.number == 2 && f.number != 5) {
            out.temporality = d.value;
          } else if (d.number == 3 && f.number == 7) {
            out.monotonic = d.value != 0;
          } else {
            ADD_FAILURE() << out.kind << ": unexpected field " << d.number;
          }
        }
        break;
      }
      default:
        ADD_FAILURE() << "Metric: unexpected field " << f.number;
    }
  }
  return out;
}

Request Decode(std::string_view body) {
  Request out;
  for (const Field& rm : Fields(body)) {
    EXPECT_EQ(rm.number, 1u);
    ++out.resource_metrics;
    for (const Field& f : Fields(rm.bytes)) {
      if (f.number == 1) {
        for (const Field& a : Fields(f.bytes)) {
          EXPECT_EQ(a.number, 1u);
          out.resource.push_back(KeyValue(a.bytes));
        }
      } else if (f.number == 2) {
        ++out.scope_metrics;
        for (const Field& s : Fields(f.bytes)) {
          if (s.number == 1) {
            for (const Field& sc : Fields(s.bytes)) {
              if (sc.number == 1) out.scope_name = std::string(sc.bytes);
              if (sc.number == 2) out.scope_version = std::string(sc.bytes);
            }
          } else if (s.number == 2) {
            out.metrics.push_back(DecodeMetric(s.bytes));
          } else {
            ADD_FAILURE() << "ScopeMetrics: unexpected field " << s.number;
          }
        }
      } else {
        ADD_FAILURE() << "ResourceMetrics: unexpected field " << f.number;
      }
    }
  }
  return out;
}

// ---- helpers

constexpr uint64_t kNow = 1'700'000'000'123'456'789ULL;
constexpr uint64_t kStart = 1'699'999'000'000'000'001ULL;

OtlpMetricsOptions Options(HistogramForm form = HistogramForm::kExponential,
                           OtlpEncoding encoding = OtlpEncoding::kProtobuf) {
  OtlpMetricsOptions o;
  o.encoding = encoding;
  o.histograms = form;
  o.time_unix_nano = kNow;
  o.start_time_unix_nano = kStart;
  o.resource_attributes = {{"service.name", "tokenmeterd"},
                           {"service.instance.id", "host:9400"}};
  o.scope_version = "9.9.9";
  return o;
}

using Pairs = std::vector<std::pair<std::string, std::string>>;

// One histogram family of one sample, encoded and decoded.
Metric OneHistogram(
    const Histogram& h, HistogramForm form,
    std::string_view name = "vllm:time_to_first_token_seconds") {
  OtlpMetricsEncoder enc(Options(form));
  const Pairs pairs = {{"model_name", "m"}};
  enc.BeginFamily("", name, MetricType::kHistogram, "help");
  enc.HistogramSample(SampleLabels{"", pairs, {}, {}}, h);
  enc.Finish();
  Request r = Decode(enc.body());
  EXPECT_EQ(r.metrics.size(), 1u);
  return r.metrics.empty() ? Metric{} : r.metrics[0];
}

// The OTLP exponential bucket of a positive value, from its definition
// (bucket i holds (base^i, base^(i+1)], base = 2^(2^-scale)), for values
// that are exact powers of two: v = 2^e lies at the upper edge of bucket
// e * 2^scale - 1.
int32_t OtlpIndexOfPowerOfTwo(int e, int scale) {
  return e * (int32_t(1) << scale) - 1;
}

// ---- tests

TEST(OtlpMetricsEncoderTest, ResourceAndScopeOnceAroundAllMetrics) {
  OtlpMetricsEncoder enc(Options());
  const Pairs none;
  enc.BeginFamily("", "a_total_count", MetricType::kGauge, "A.");
  enc.Sample(SampleLabels{"", none, {}, {}}, uint64_t(1));
  enc.BeginFamily("", "b", MetricType::kGauge, "B.");
  enc.Sample(SampleLabels{"", none, {}, {}}, 2.5);
  enc.Finish();
  const Request r = Decode(enc.body());
  EXPECT_EQ(r.resource_metrics, 1);
  EXPECT_EQ(r.scope_metrics, 1);
  EXPECT_EQ(r.resource, (Pairs{{"service.name", "tokenmeterd"},
                               {"service.instance.id", "host:9400"}}));
  EXPECT_EQ(r.scope_name, "tokenmeterd");
  EXPECT_EQ(r.scope_version, "9.9.9");
  ASSERT_EQ(r.metrics.size(), 2u);
  EXPECT_EQ(enc.metrics(), 2u);
  EXPECT_EQ(enc.data_points(), 2u);
  EXPECT_EQ(enc.content_type(), "application/x-protobuf");
}

// The Prometheus metric name, not altered (the specification's default):
// text 0.0.4's HELP/TYPE name, with _total.
TEST(OtlpMetricsEncoderTest, CounterIsMonotonicCumulativeSumNamedWithTotal) {
  OtlpMetricsEncoder enc(Options());
  const Pairs pairs = {{"model_name", "llama"}, {"engine", "0"}};
  enc.BeginFamily("vllm:", "prompt_tokens", MetricType::kCounter,
                  "Number of prefill tokens processed.");
  enc.Sample(SampleLabels{"", pairs, {}, {}}, uint64_t(512));
  enc.Finish();
  const Request r = Decode(enc.body());
  ASSERT_EQ(r.metrics.size(), 1u);
  const Metric& m = r.metrics[0];
  EXPECT_EQ(m.name, "vllm:prompt_tokens_total");
  EXPECT_EQ(m.description, "Number of prefill tokens processed.");
  EXPECT_EQ(m.unit, "");
  EXPECT_EQ(m.kind, "sum");
  EXPECT_EQ(m.kinds, 1);
  EXPECT_EQ(m.temporality, 2u);  // CUMULATIVE
  EXPECT_TRUE(m.monotonic);
  EXPECT_EQ(m.metadata.at("prometheus.type"), "counter");
  ASSERT_EQ(m.points.size(), 1u);
  const Point& p = m.points[0];
  EXPECT_TRUE(p.has_int);
  EXPECT_FALSE(p.has_double);
  EXPECT_EQ(p.as_int, 512);
  EXPECT_EQ(p.time, kNow);
  EXPECT_EQ(p.start, kStart);
  EXPECT_EQ(p.attributes, pairs);
}

TEST(OtlpMetricsEncoderTest, GaugeIsGaugeWithoutTemporality) {
  OtlpMetricsEncoder enc(Options());
  const Pairs none;
  enc.BeginFamily("vllm:", "kv_cache_usage_perc", MetricType::kGauge, "KV.");
  enc.Sample(SampleLabels{"", none, {}, {}}, 0.375);
  enc.Finish();
  const Metric m = Decode(enc.body()).metrics.at(0);
  EXPECT_EQ(m.kind, "gauge");
  EXPECT_EQ(m.temporality, 0u);
  EXPECT_FALSE(m.monotonic);
  EXPECT_EQ(m.unit, "");  // not "1": Prometheus would append _ratio
  EXPECT_EQ(m.metadata.at("prometheus.type"), "gauge");
  ASSERT_EQ(m.points.size(), 1u);
  EXPECT_TRUE(m.points[0].has_double);
  EXPECT_EQ(m.points[0].as_double, 0.375);
  EXPECT_TRUE(m.points[0].attributes.empty());
}

TEST(OtlpMetricsEncoderTest, InfoGaugeIsNonMonotonicCumulativeSum) {
  OtlpMetricsEncoder enc(Options());
  const Pairs pairs = {{"block_size", "16"}};
  enc.BeginFamily("vllm:", "cache_config_info", MetricType::kGauge, "Info.");
  enc.Sample(SampleLabels{"", pairs, {}, {}}, uint64_t(1));
  enc.BeginFamily("", "tokenmeter_build_info", MetricType::kGauge, "Build.");
  enc.Sample(SampleLabels{"", {}, "version", "1.2.3"}, uint64_t(1));
  enc.BeginFamily("", "not_info_x", MetricType::kGauge, "Gauge.");
  enc.Sample(SampleLabels{"", {}, {}, {}}, uint64_t(1));
  enc.Finish();
  const Request r = Decode(enc.body());
  ASSERT_EQ(r.metrics.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    const Metric& m = r.metrics[i];
    EXPECT_EQ(m.kind, "sum") << m.name;
    EXPECT_FALSE(m.monotonic) << m.name;
    EXPECT_EQ(m.temporality, 2u) << m.name;
    EXPECT_EQ(m.metadata.at("prometheus.type"), "gauge") << m.name;
    EXPECT_EQ(m.points.at(0).as_int, 1) << m.name;
  }
  EXPECT_EQ(r.metrics[1].points.at(0).attributes,
            (Pairs{{"version", "1.2.3"}}));
  EXPECT_EQ(r.metrics[2].kind, "gauge");
}

TEST(OtlpMetricsEncoderTest, OwnLabelIsTheLastAttribute) {
  OtlpMetricsEncoder enc(Options());
  const Pairs pairs = {{"model_name", "m"}, {"tier", "back\\slash \"q\"\n"}};
  const SampleLabels labels{"", pairs, {}, {}};
  enc.BeginFamily("vllm:", "request_success", MetricType::kCounter, "S.");
  enc.Sample(labels.WithOwn("finished_reason", "stop"), uint64_t(10));
  enc.Sample(labels.WithOwn("finished_reason", "length"), uint64_t(2));
  enc.Finish();
  const Metric m = Decode(enc.body()).metrics.at(0);
  ASSERT_EQ(m.points.size(), 2u);
  EXPECT_EQ(m.points[0].attributes,
            (Pairs{{"model_name", "m"},
                   {"tier", "back\\slash \"q\"\n"},  // unescaped, as is
                   {"finished_reason", "stop"}}));
  EXPECT_EQ(m.points[1].attributes.back(),
            (std::pair<std::string, std::string>{"finished_reason", "length"}));
  EXPECT_EQ(m.points[1].as_int, 2);
}

TEST(OtlpMetricsEncoderTest, UnitsFromTheNamesLastWord) {
  EXPECT_EQ(UnitOf("vllm:e2e_request_latency_seconds"), "s");
  EXPECT_EQ(UnitOf("process_cpu_seconds"), "s");  // a counter, no _total
  EXPECT_EQ(UnitOf("process_resident_memory_bytes"), "By");
  EXPECT_EQ(UnitOf("vllm:kv_transfer_bytes"), "By");
  EXPECT_EQ(UnitOf("x_ratio"), "1");
  EXPECT_EQ(UnitOf("vllm:kv_cache_usage_perc"), "");
  EXPECT_EQ(UnitOf("vllm:prompt_tokens"), "");
  EXPECT_EQ(UnitOf("seconds"), "");  // no word before it: not a suffix
  EXPECT_EQ(UnitOf("tokenmeter_build_info"), "");
  const Metric m = [] {
    HistogramLayout layout({0.1, 1}, 1e9);
    Histogram h(&layout);
    h.Observe(5e8);
    return OneHistogram(h, HistogramForm::kExplicit);
  }();
  EXPECT_EQ(m.unit, "s");
}

TEST(OtlpMetricsEncoderTest, BigCounterBeyondInt64IsADouble) {
  OtlpMetricsEncoder enc(Options());
  enc.BeginFamily("", "c", MetricType::kCounter, "C.");
  enc.Sample(SampleLabels{}, std::numeric_limits<uint64_t>::max());
  enc.Sample(SampleLabels{}, uint64_t(std::numeric_limits<int64_t>::max()));
  enc.Finish();
  const Metric m = Decode(enc.body()).metrics.at(0);
  ASSERT_EQ(m.points.size(), 2u);
  EXPECT_TRUE(m.points[0].has_double);
  EXPECT_EQ(m.points[0].as_double, 0x1p64);
  EXPECT_TRUE(m.points[1].has_int);
  EXPECT_EQ(m.points[1].as_int, std::numeric_limits<int64_t>::max());
}

TEST(OtlpMetricsEncoderTest, ExponentialIndexIsPrometheusIndexMinusOne) {
  // Schema 0 (base 2), values on bucket boundaries: 1 is the upper edge
  // of Prometheus bucket 0 = OTLP bucket -1 = (0.5, 1]; 2 of OTLP 0; 3 and
  // 4 of OTLP 1; nothing in OTLP 2; 16 in OTLP 3.
  HistogramLayout layout({1, 10}, 1.0, /*native_schema=*/0);
  Histogram h(&layout);
  for (double v : {1.0, 2.0, 3.0, 4.0, 16.0}) h.Observe(v);
  const Metric m = OneHistogram(h, HistogramForm::kExponential);
  EXPECT_EQ(m.kind, "exponential_histogram");
  EXPECT_EQ(m.kinds, 1);
  EXPECT_EQ(m.temporality, 2u);
  EXPECT_EQ(m.metadata.at("prometheus.type"), "histogram");
  ASSERT_EQ(m.points.size(), 1u);
  const Point& p = m.points[0];
  EXPECT_EQ(p.scale, 0);
  EXPECT_EQ(p.positive_offset, -1);
  EXPECT_EQ(p.positive, (std::vector<uint64_t>{1, 1, 2, 0, 1}));
  EXPECT_FALSE(p.has_negative);
  EXPECT_EQ(p.count, 5u);
  EXPECT_TRUE(p.has_sum);
  EXPECT_EQ(p.sum, 26.0);
  EXPECT_EQ(p.zero_count, 0u);
  EXPECT_EQ(p.zero_threshold, 0x1p-128);
  EXPECT_EQ(p.attributes, (Pairs{{"model_name", "m"}}));
  EXPECT_EQ(p.start, kStart);
  EXPECT_EQ(p.time, kNow);
  // The same from the definition: 2^e is in OTLP bucket e - 1 at schema 0.
  for (int e : {0, 1, 2, 4}) {
    const int32_t i = OtlpIndexOfPowerOfTwo(e, 0) - p.positive_offset;
    ASSERT_LT(size_t(i), p.positive.size());
    EXPECT_GE(p.positive[size_t(i)], 1u) << "2^" << e;
  }
}

TEST(OtlpMetricsEncoderTest, ExponentialBoundariesAtEverySchema) {
  // At each schema, 2^e (a boundary at every schema) lands in OTLP bucket
  // e * 2^scale - 1, and a value just above it in the next bucket.
  for (int schema = NativeHistogram::kMinSchema;
       schema <= NativeHistogram::kMaxSchema; ++schema) {
    if (schema < 0) continue;  // boundaries at 2^(2^-schema) only
    HistogramLayout layout({1}, 1.0, schema);
    Histogram h(&layout);
    h.Observe(2.0);
    h.Observe(std::nextafter(2.0, 4.0));
    const Metric m = OneHistogram(h, HistogramForm::kExponential);
    ASSERT_EQ(m.points.size(), 1u);
    const Point& p = m.points[0];
    EXPECT_EQ(p.scale, schema);
    EXPECT_EQ(p.positive_offset, OtlpIndexOfPowerOfTwo(1, schema))
        << "schema " << schema;
    EXPECT_EQ(p.positive, (std::vector<uint64_t>{1, 1})) << "schema " << schema;
  }
  // Negative schemas: base 2^(2^-s); 2^(2^-s) is the upper edge of OTLP
  // bucket 0.
  for (int schema = NativeHistogram::kMinSchema; schema < 0; ++schema) {
    HistogramLayout layout({1}, 1.0, schema);
    Histogram h(&layout);
    h.Observe(std::ldexp(1.0, 1 << -schema));
    const Metric m = OneHistogram(h, HistogramForm::kExponential);
    const Point& p = m.points.at(0);
    EXPECT_EQ(p.scale, schema);
    EXPECT_EQ(p.positive_offset, 0) << "schema " << schema;
    EXPECT_EQ(p.positive, (std::vector<uint64_t>{1}));
  }
}

TEST(OtlpMetricsEncoderTest, ZeroBucketAndThreshold) {
  HistogramLayout layout({1}, 1.0, 3);
  Histogram h(&layout);
  h.Observe(0.0);
  h.Observe(-0.0);
  h.Observe(0x1p-130);  // below the threshold
  h.Observe(1.0);       // Prometheus index 0 at every schema: OTLP -1
  const Point p = OneHistogram(h, HistogramForm::kExponential).points.at(0);
  EXPECT_EQ(p.zero_count, 3u);
  EXPECT_EQ(p.zero_threshold, NativeHistogram::kZeroThreshold);
  EXPECT_EQ(p.positive_offset, -1);
  EXPECT_EQ(p.positive, (std::vector<uint64_t>{1}));
  EXPECT_EQ(p.count, 4u);
}

TEST(OtlpMetricsEncoderTest, NegativeBucketsMirrorThePositiveConvention) {
  HistogramLayout layout({1}, 1.0, 0);
  Histogram h(&layout);
  h.Observe(-1.0);  // |v| = 1: OTLP -1
  h.Observe(-4.0);  // OTLP 1
  h.Observe(-4.0);
  h.Observe(0.75);  // (0.5, 1]: OTLP -1
  const Point p = OneHistogram(h, HistogramForm::kExponential).points.at(0);
  EXPECT_TRUE(p.has_negative);
  EXPECT_EQ(p.negative_offset, -1);
  EXPECT_EQ(p.negative, (std::vector<uint64_t>{1, 0, 2}));
  EXPECT_EQ(p.positive_offset, -1);
  EXPECT_EQ(p.positive, (std::vector<uint64_t>{1}));
  EXPECT_EQ(p.sum, -8.25);
}

TEST(OtlpMetricsEncoderTest, EmptyHistogramHasNoBuckets) {
  HistogramLayout layout({0.5, 1}, 1.0, 3);
  const Histogram h(&layout);
  const Metric e = OneHistogram(h, HistogramForm::kExponential);
  const Point& p = e.points.at(0);
  EXPECT_EQ(p.count, 0u);
  EXPECT_TRUE(p.has_sum);
  EXPECT_EQ(p.sum, 0.0);
  EXPECT_EQ(p.scale, 3);
  EXPECT_FALSE(p.has_positive);
  EXPECT_FALSE(p.has_negative);
  const Metric x = OneHistogram(h, HistogramForm::kExplicit);
  EXPECT_EQ(x.points.at(0).bucket_counts, (std::vector<uint64_t>{0, 0, 0}));
  EXPECT_EQ(x.points.at(0).bounds, (std::vector<double>{0.5, 1}));
}

TEST(OtlpMetricsEncoderTest, ExplicitFormHasPerBucketCountsAndBounds) {
  // Nanoseconds in, seconds out; le inclusive.
  HistogramLayout layout({0.1, 0.5, 1}, 1e9);
  Histogram h(&layout);
  for (double ns : {1e8, 1e8, 2e8, 5e8, 7e8, 3e9}) h.Observe(ns);
  const Metric m = OneHistogram(h, HistogramForm::kExplicit);
  EXPECT_EQ(m.kind, "histogram");
  EXPECT_EQ(m.kinds, 1);
  EXPECT_EQ(m.temporality, 2u);
  const Point& p = m.points.at(0);
  EXPECT_EQ(p.bounds, (std::vector<double>{0.1, 0.5, 1}));
  EXPECT_EQ(p.bucket_counts, (std::vector<uint64_t>{2, 2, 1, 1}));
  EXPECT_EQ(p.count, 6u);
  EXPECT_DOUBLE_EQ(p.sum, 4.6);
  EXPECT_EQ(p.sum, h.sum());
  EXPECT_EQ(p.start, kStart);
}

TEST(OtlpMetricsEncoderTest, StartTimeHookPerSeriesZeroMeansDefault) {
  OtlpMetricsOptions o = Options();
  std::vector<std::string> seen;
  o.start_time = [&seen](std::string_view name, const SampleLabels& l) {
    seen.push_back(std::string(name));
    for (const auto& [k, v] : l.pairs) {
      if (k == "engine" && v == "1") return uint64_t(42);
    }
    return uint64_t(0);
  };
  OtlpMetricsEncoder enc(o);
  const Pairs e0 = {{"engine", "0"}};
  const Pairs e1 = {{"engine", "1"}};
  HistogramLayout layout({1}, 1.0);
  Histogram h(&layout);
  enc.BeginFamily("ns:", "c", MetricType::kCounter, "C.");
  enc.Sample(SampleLabels{"", e0, {}, {}}, uint64_t(1));
  enc.Sample(SampleLabels{"", e1, {}, {}}, uint64_t(1));
  enc.BeginFamily("ns:", "g", MetricType::kGauge, "G.");
  enc.Sample(SampleLabels{"", e1, {}, {}}, 1.0);
  enc.BeginFamily("ns:", "h_seconds", MetricType::kHistogram, "H.");
  enc.HistogramSample(SampleLabels{"", e1, {}, {}}, h);
  enc.Finish();
  const Request r = Decode(enc.body());
  ASSERT_EQ(r.metrics.size(), 3u);
  EXPECT_EQ(r.metrics[0].points.at(0).start, kStart);
  EXPECT_EQ(r.metrics[0].points.at(1).start, 42u);
  EXPECT_EQ(r.metrics[1].points.at(0).start, 42u);
  EXPECT_EQ(r.metrics[2].points.at(0).start, 42u);
  EXPECT_EQ(seen,
            (std::vector<std::string>{"ns:c", "ns:c", "ns:g", "ns:h_seconds"}));

  // Without a hook or a default: no start time at all.
  OtlpMetricsOptions bare = Options();
  bare.start_time_unix_nano = 0;
  OtlpMetricsEncoder enc2(bare);
  enc2.BeginFamily("", "c", MetricType::kCounter, "C.");
  enc2.Sample(SampleLabels{}, uint64_t(1));
  enc2.Finish();
  EXPECT_EQ(Decode(enc2.body()).metrics.at(0).points.at(0).start, 0u);
}

TEST(OtlpMetricsEncoderTest, FamiliesWithoutSamplesAreLeftOutAndEmptyIsEmpty) {
  OtlpMetricsEncoder enc(Options());
  enc.BeginFamily("", "nothing", MetricType::kCounter, "N.");
  enc.Finish();
  EXPECT_EQ(enc.body(), "");
  EXPECT_EQ(enc.data_points(), 0u);
  EXPECT_EQ(enc.metrics(), 0u);
  OtlpMetricsEncoder json(
      Options(HistogramForm::kExponential, OtlpEncoding::kJson));
  json.BeginFamily("", "nothing", MetricType::kCounter, "N.");
  json.Finish();
  EXPECT_EQ(json.body(), "{}");
  EXPECT_EQ(json.content_type(), "application/json");

  OtlpMetricsEncoder some(Options());
  some.BeginFamily("", "empty", MetricType::kGauge, "E.");
  some.BeginFamily("", "full", MetricType::kGauge, "F.");
  some.Sample(SampleLabels{}, 1.0);
  some.BeginFamily("", "empty2", MetricType::kGauge, "E.");
  some.Finish();
  const Request r = Decode(some.body());
  ASSERT_EQ(r.metrics.size(), 1u);
  EXPECT_EQ(r.metrics[0].name, "full");
}

TEST(OtlpMetricsEncoderTest, JsonHasTheOtlpJsonShape) {
  OtlpMetricsEncoder enc(
      Options(HistogramForm::kExponential, OtlpEncoding::kJson));
  const Pairs pairs = {{"q", "a\"b"}};
  enc.BeginFamily("ns:", "c", MetricType::kCounter, "C \"x\".");
  enc.Sample(SampleLabels{"", pairs, {}, {}}, uint64_t(7));
  HistogramLayout layout({1, 10}, 1.0, 0);
  Histogram h(&layout);
  for (double v : {1.0, 2.0, 16.0}) h.Observe(v);
  enc.BeginFamily("ns:", "h", MetricType::kHistogram, "H.");
  enc.HistogramSample(SampleLabels{}, h);
  enc.Finish();
  const std::string& b = enc.body();
  EXPECT_TRUE(b.starts_with(
      "{\"resourceMetrics\":[{\"resource\":{\"attributes\":[{\"key\":"
      "\"service.name\",\"value\":{\"stringValue\":\"tokenmeterd\"}}"))
      << b;
  EXPECT_NE(b.find("\"scope\":{\"name\":\"tokenmeterd\",\"version\":"
                   "\"9.9.9\"}"),
            std::string::npos);
  EXPECT_NE(b.find("{\"name\":\"ns:c_total\",\"description\":\"C \\\"x\\\".\","
                   "\"metadata\":[{\"key\":\"prometheus.type\",\"value\":{"
                   "\"stringValue\":\"counter\"}}],\"sum\":{\"dataPoints\":[{"
                   "\"startTimeUnixNano\":\"1699999000000000001\","
                   "\"timeUnixNano\":\"1700000000123456789\",\"asInt\":\"7\","
                   "\"attributes\":[{\"key\":\"q\",\"value\":{\"stringValue\":"
                   "\"a\\\"b\"}}]}],\"aggregationTemporality\":2,"
                   "\"isMonotonic\":true}}"),
            std::string::npos)
      << b;
  EXPECT_NE(
      b.find("\"count\":\"3\",\"sum\":19,\"scale\":0,\"zeroCount\":\"0\","
             "\"positive\":{\"offset\":-1,\"bucketCounts\":[\"1\",\"1\","
             "\"0\",\"0\",\"1\"]},\"zeroThreshold\":2.938735877055719e-39}"),
      std::string::npos)
      << b;
  EXPECT_TRUE(b.ends_with("]}]}]}"));
}

// A whole registry: every family of /metrics with samples is one metric
// of the name text 0.0.4 gives it (counters with _total), with one point
// per sample (one per histogram), in the same order.
TEST(OtlpMetricsEncoderTest, RegistryRenderMatchesTheTextExposition) {
  using exposition_test::Family;
  const exposition_test::Exposed reg = exposition_test::PopulatedRegistry();
  const std::string text =
      exposition_test::Render(*reg, ExpositionFormat::kOpenMetrics100);
  const std::vector<Family> families =
      exposition_test::Parse(text, ExpositionFormat::kOpenMetrics100);
  for (const HistogramForm form :
       {HistogramForm::kExponential, HistogramForm::kExplicit}) {
    OtlpMetricsEncoder enc(Options(form));
    daemon::Render(*reg, enc);
    const Request r = Decode(enc.body());
    std::vector<const Family*> shown;
    for (const Family& f : families) {
      if (!f.samples.empty()) shown.push_back(&f);
    }
    ASSERT_EQ(r.metrics.size(), shown.size());
    size_t points = 0;
    std::set<std::string> names;
    for (size_t i = 0; i < shown.size(); ++i) {
      const Family& f = *shown[i];
      const Metric& m = r.metrics[i];
      EXPECT_EQ(m.name, f.type == "counter" ? f.name + "_total" : f.name);
      EXPECT_TRUE(names.insert(m.name).second) << "twice: " << m.name;
      EXPECT_EQ(m.kinds, 1) << m.name;
      size_t samples = f.samples.size();
      if (f.type == "histogram") {
        EXPECT_EQ(m.kind, form == HistogramForm::kExplicit
                              ? "histogram"
                              : "exponential_histogram");
        size_t series = 0;
        for (const auto& s : f.samples) series += s.name.ends_with("_count");
        samples = series;
        for (const Point& p : m.points) {
          EXPECT_EQ(
              p.count, p.zero_count +
                           [&] {
                             uint64_t n = 0;
                             for (uint64_t c : p.positive) n += c;
                             for (uint64_t c : p.negative) n += c;
                             for (uint64_t c : p.bucket_counts) n += c;
                             return n;
                           }())
              << m.name;
        }
      } else if (f.type == "counter") {
        EXPECT_EQ(m.kind, "sum");
        EXPECT_TRUE(m.monotonic);
      } else if (f.name.ends_with("_info")) {
        EXPECT_EQ(m.kind, "sum");
        EXPECT_FALSE(m.monotonic);
      } else {
        EXPECT_EQ(m.kind, "gauge") << m.name;
      }
      EXPECT_EQ(m.points.size(), samples) << m.name;
      points += m.points.size();
      // process_* values are read from /proc at each render: they may
      // differ between the text render and this one.
      if (f.type != "histogram" && !f.name.starts_with("process_")) {
        for (size_t j = 0; j < m.points.size() && j < f.samples.size(); ++j) {
          const Point& p = m.points[j];
          const double v = p.has_int ? double(p.as_int) : p.as_double;
          if (std::isnan(f.samples[j].value)) {
            EXPECT_TRUE(std::isnan(v)) << m.name;
          } else {
            EXPECT_EQ(v, f.samples[j].value) << m.name << " #" << j;
          }
          EXPECT_EQ(p.attributes, f.samples[j].labels) << m.name << " #" << j;
        }
      }
    }
    EXPECT_EQ(enc.data_points(), points);
    EXPECT_EQ(enc.metrics(), r.metrics.size());

    // Reset() and a second render: the same bytes up to the process_*
    // families (the last ones, read from /proc again).
    const std::string first = enc.body();
    enc.Reset(kNow);
    daemon::Render(*reg, enc);
    const size_t cut = first.find("process_cpu_seconds");
    ASSERT_NE(cut, std::string::npos);
    EXPECT_TRUE(enc.body().compare(0, cut, first, 0, cut) == 0);
    EXPECT_EQ(enc.data_points(), points);
  }
}

}  // namespace
}  // namespace tokenmeter::daemon::otlp_metrics
