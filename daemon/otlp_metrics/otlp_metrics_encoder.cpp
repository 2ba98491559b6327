#include "daemon/otlp_metrics/otlp_metrics_encoder.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>

#include "daemon/base/json_write.h"
#include "daemon/base/proto_wire.h"
#include "daemon/store/native_histogram.h"

namespace tokenmeter::daemon::otlp_metrics {
namespace {

using json_write::JsonDouble;
using json_write::JsonInt;
using json_write::JsonQuotedInt;
using json_write::JsonString;
using proto_wire::AppendExact;
using proto_wire::BytesField;
using proto_wire::kLen;
using proto_wire::kVarint;
using proto_wire::LenFieldSize;
using proto_wire::PutDoubleField;
using proto_wire::PutFixed64;
using proto_wire::PutFixed64Field;
using proto_wire::PutLenField;
using proto_wire::PutMessageHeader;
using proto_wire::PutVarint;
using proto_wire::PutVarintField;
using proto_wire::Tag1;
using proto_wire::Varint;
using proto_wire::VarintSize;
using proto_wire::ZigZag32;

// Field numbers of the OTLP messages (opentelemetry-proto v1:
// collector/metrics/v1/metrics_service.proto, metrics/v1/metrics.proto,
// resource/v1/resource.proto, common/v1/common.proto).
// ExportMetricsServiceRequest
constexpr uint32_t kRequestResourceMetrics = 1;
// ResourceMetrics
constexpr uint32_t kResourceMetricsResource = 1;
constexpr uint32_t kResourceMetricsScopeMetrics = 2;
// Resource
constexpr uint32_t kResourceAttributes = 1;
// ScopeMetrics
constexpr uint32_t kScopeMetricsScope = 1;
constexpr uint32_t kScopeMetricsMetrics = 2;
// InstrumentationScope
constexpr uint32_t kScopeName = 1;
constexpr uint32_t kScopeVersion = 2;
// Metric
constexpr uint32_t kMetricName = 1;
constexpr uint32_t kMetricDescription = 2;
constexpr uint32_t kMetricUnit = 3;
constexpr uint32_t kMetricGauge = 5;
constexpr uint32_t kMetricSum = 7;
constexpr uint32_t kMetricHistogram = 9;
constexpr uint32_t kMetricExponentialHistogram = 10;
constexpr uint32_t kMetricMetadata = 12;
// Gauge, Sum, Histogram, ExponentialHistogram
constexpr uint32_t kDataPoints = 1;
constexpr uint32_t kAggregationTemporality = 2;
constexpr uint32_t kSumIsMonotonic = 3;
constexpr uint64_t kCumulative = 2;  // AGGREGATION_TEMPORALITY_CUMULATIVE
// NumberDataPoint
constexpr uint32_t kNumberStartTime = 2;
constexpr uint32_t kNumberTime = 3;
constexpr uint32_t kNumberAsDouble = 4;
constexpr uint32_t kNumberAsInt = 6;  // sfixed64
constexpr uint32_t kNumberAttributes = 7;
// HistogramDataPoint
constexpr uint32_t kHistStartTime = 2;
constexpr uint32_t kHistTime = 3;
constexpr uint32_t kHistCount = 4;  // fixed64
constexpr uint32_t kHistSum = 5;
constexpr uint32_t kHistBucketCounts = 6;    // packed fixed64
constexpr uint32_t kHistExplicitBounds = 7;  // packed double
constexpr uint32_t kHistAttributes = 9;
// ExponentialHistogramDataPoint
constexpr uint32_t kExpAttributes = 1;
constexpr uint32_t kExpStartTime = 2;
constexpr uint32_t kExpTime = 3;
constexpr uint32_t kExpCount = 4;  // fixed64
constexpr uint32_t kExpSum = 5;
constexpr uint32_t kExpScale = 6;      // sint32
constexpr uint32_t kExpZeroCount = 7;  // fixed64
constexpr uint32_t kExpPositive = 8;
constexpr uint32_t kExpNegative = 9;
constexpr uint32_t kExpZeroThreshold = 14;
// ExponentialHistogramDataPoint.Buckets
constexpr uint32_t kBucketsOffset = 1;  // sint32
constexpr uint32_t kBucketsCounts = 2;  // packed uint64
// KeyValue, AnyValue
constexpr uint32_t kKeyValueKey = 1;
constexpr uint32_t kKeyValueValue = 2;
constexpr uint32_t kAnyString = 1;
// Every tag written here is one byte.
static_assert(kExpZeroThreshold < 16 && kMetricMetadata < 16);

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.substr(s.size() - suffix.size()) == suffix;
}

// A KeyValue {key, AnyValue{string_value}} as field `field` of *out.
void ProtoKeyValue(std::string* out, uint32_t field, std::string_view key,
                   std::string_view value) {
  const size_t any = LenFieldSize(value.size());
  const size_t kv = LenFieldSize(key.size()) + LenFieldSize(any);
  AppendExact(out, LenFieldSize(kv), [&](char* p) {
    p = PutMessageHeader(p, field, kv);
    p = PutLenField(p, kKeyValueKey, key);
    p = PutMessageHeader(p, kKeyValueValue, any);
    return PutLenField(p, kAnyString, value);
  });
}

void ProtoFixed64(std::string* out, uint32_t field, uint64_t v) {
  AppendExact(out, 9, [&](char* p) { return PutFixed64Field(p, field, v); });
}

void ProtoDouble(std::string* out, uint32_t field, double v) {
  AppendExact(out, 9, [&](char* p) { return PutDoubleField(p, field, v); });
}

void ProtoVarint(std::string* out, uint32_t field, uint64_t v) {
  AppendExact(out, 1 + VarintSize(v),
              [&](char* p) { return PutVarintField(p, field, v); });
}

// {"key":"k","value":{"stringValue":"v"}}
void JsonKeyValue(std::string* out, std::string_view key,
                  std::string_view value) {
  out->append("{\"key\":");
  JsonString(out, key);
  out->append(",\"value\":{\"stringValue\":");
  JsonString(out, value);
  out->append("}}");
}

std::string_view TypeName(MetricType type) { return MetricTypeName(type); }

}  // namespace

std::string_view UnitOf(std::string_view name) {
  if (EndsWith(name, "_seconds")) return "s";
  if (EndsWith(name, "_bytes")) return "By";
  if (EndsWith(name, "_ratio")) return "1";
  return "";
}

OtlpMetricsEncoder::OtlpMetricsEncoder(OtlpMetricsOptions options)
    : options_(std::move(options)),
      json_(options_.encoding == OtlpEncoding::kJson) {
  if (!json_) {
    std::string resource_body;
    for (const auto& [key, value] : options_.resource_attributes) {
      ProtoKeyValue(&resource_body, kResourceAttributes, key, value);
    }
    BytesField(&resource_, kResourceMetricsResource, resource_body);
    std::string scope_body;
    if (!options_.scope_name.empty()) {
      BytesField(&scope_body, kScopeName, options_.scope_name);
    }
    if (!options_.scope_version.empty()) {
      BytesField(&scope_body, kScopeVersion, options_.scope_version);
    }
    BytesField(&scope_, kScopeMetricsScope, scope_body);
    return;
  }
  resource_ = "{\"resourceMetrics\":[{\"resource\":{\"attributes\":[";
  bool first = true;
  for (const auto& [key, value] : options_.resource_attributes) {
    if (!first) resource_.push_back(',');
    first = false;
    JsonKeyValue(&resource_, key, value);
  }
  resource_.append("]},\"scopeMetrics\":[{\"scope\":{");
  bool comma = false;
  if (!options_.scope_name.empty()) {
    resource_.append("\"name\":");
    JsonString(&resource_, options_.scope_name);
    comma = true;
  }
  if (!options_.scope_version.empty()) {
    if (comma) resource_.push_back(',');
    resource_.append("\"version\":");
    JsonString(&resource_, options_.scope_version);
  }
  resource_.append("},\"metrics\":[");
}

void OtlpMetricsEncoder::Reset(uint64_t time_unix_nano) {
  options_.time_unix_nano = time_unix_nano;
  name_.clear();
  family_points_ = 0;
  points_.clear();
  metrics_.clear();
  body_.clear();
  data_points_ = 0;
  metrics_count_ = 0;
}

void OtlpMetricsEncoder::BeginFamily(std::string_view prefix,
                                     std::string_view name, MetricType type,
                                     std::string_view help) {
  FlushFamily();
  name_.assign(prefix);
  name_.append(name);
  metric_name_.assign(name_);
  if (type == MetricType::kCounter) metric_name_.append("_total");
  help_.assign(help);
  type_ = type;
  switch (type) {
    case MetricType::kCounter:
      kind_ = Kind::kSum;
      break;
    case MetricType::kGauge:
      kind_ = EndsWith(name_, "_info") ? Kind::kSum : Kind::kGauge;
      break;
    case MetricType::kHistogram:
      kind_ = options_.histograms == HistogramForm::kExplicit
                  ? Kind::kHistogram
                  : Kind::kExponential;
      break;
  }
}

uint64_t OtlpMetricsEncoder::StartTime(const SampleLabels& labels) const {
  if (options_.start_time) {
    const uint64_t t = options_.start_time(name_, labels);
    if (t != 0) return t;
  }
  return options_.start_time_unix_nano;
}

void OtlpMetricsEncoder::Attributes(const SampleLabels& labels,
                                    uint32_t field) {
  if (!json_) {
    for (const auto& [key, value] : labels.pairs) {
      ProtoKeyValue(&point_, field, key, value);
    }
    if (!labels.own_name.empty()) {
      ProtoKeyValue(&point_, field, labels.own_name, labels.own_value);
    }
    return;
  }
  if (labels.pairs.empty() && labels.own_name.empty()) return;
  point_.append(",\"attributes\":[");
  bool first = true;
  for (const auto& [key, value] : labels.pairs) {
    if (!first) point_.push_back(',');
    first = false;
    JsonKeyValue(&point_, key, value);
  }
  if (!labels.own_name.empty()) {
    if (!first) point_.push_back(',');
    JsonKeyValue(&point_, labels.own_name, labels.own_value);
  }
  point_.push_back(']');
}

// JSON points start with the times (always present: timeUnixNano), so that
// the optional members after them each take a leading comma.
void OtlpMetricsEncoder::JsonPointTimes(uint64_t start) {
  point_.push_back('{');
  if (start != 0) {
    point_.append("\"startTimeUnixNano\":");
    JsonQuotedInt(&point_, start);
    point_.push_back(',');
  }
  point_.append("\"timeUnixNano\":");
  JsonQuotedInt(&point_, options_.time_unix_nano);
}

void OtlpMetricsEncoder::JsonHistogramHead(const SampleLabels& labels,
                                           uint64_t start, const Histogram& h) {
  JsonPointTimes(start);
  Attributes(labels, 0);
  point_.append(",\"count\":");
  JsonQuotedInt(&point_, h.count());
  point_.append(",\"sum\":");
  JsonDouble(&point_, h.sum());
}

void OtlpMetricsEncoder::NumberPoint(const SampleLabels& labels, bool is_int,
                                     uint64_t bits) {
  point_.clear();
  const uint64_t start = StartTime(labels);
  if (!json_) {
    if (start != 0) ProtoFixed64(&point_, kNumberStartTime, start);
    ProtoFixed64(&point_, kNumberTime, options_.time_unix_nano);
    ProtoFixed64(&point_, is_int ? kNumberAsInt : kNumberAsDouble, bits);
    Attributes(labels, kNumberAttributes);
  } else {
    JsonPointTimes(start);
    if (is_int) {
      point_.append(",\"asInt\":");
      JsonQuotedInt(&point_, int64_t(bits));
    } else {
      point_.append(",\"asDouble\":");
      JsonDouble(&point_, std::bit_cast<double>(bits));
    }
    Attributes(labels, 0);
    point_.push_back('}');
  }
  AddPoint();
}

void OtlpMetricsEncoder::Sample(const SampleLabels& labels, uint64_t value) {
  if (value <= uint64_t(std::numeric_limits<int64_t>::max())) {
    NumberPoint(labels, true, value);
  } else {
    Sample(labels, double(value));
  }
}

void OtlpMetricsEncoder::Sample(const SampleLabels& labels, double value) {
  NumberPoint(labels, false, std::bit_cast<uint64_t>(value));
}

void OtlpMetricsEncoder::HistogramSample(const SampleLabels& labels,
                                         const Histogram& h) {
  point_.clear();
  if (kind_ == Kind::kExponential) {
    ExponentialPoint(labels, h);
  } else {
    ExplicitPoint(labels, h);
  }
  AddPoint();
}

void OtlpMetricsEncoder::ExponentialPoint(const SampleLabels& labels,
                                          const Histogram& h) {
  const NativeHistogram& n = h.native();
  const uint64_t start = StartTime(labels);
  if (!json_) {
    Attributes(labels, kExpAttributes);
    if (start != 0) ProtoFixed64(&point_, kExpStartTime, start);
    ProtoFixed64(&point_, kExpTime, options_.time_unix_nano);
    ProtoFixed64(&point_, kExpCount, h.count());
    ProtoDouble(&point_, kExpSum, h.sum());
    if (n.schema() != 0) ProtoVarint(&point_, kExpScale, ZigZag32(n.schema()));
    if (n.zero_count() != 0) {
      ProtoFixed64(&point_, kExpZeroCount, n.zero_count());
    }
  } else {
    JsonHistogramHead(labels, start, h);
    point_.append(",\"scale\":");
    JsonInt(&point_, n.schema());
    point_.append(",\"zeroCount\":");
    JsonQuotedInt(&point_, n.zero_count());
  }
  // One pass per sign over the populated buckets: the packed counts (gaps
  // as zeros) written straight into packed_ (protobuf) or point_ (JSON).
  // Prometheus bucket k is OTLP bucket k - 1 (see the header).
  for (const bool positive : {true, false}) {
    bool any = false;
    int32_t first = 0;
    int32_t next = 0;  // the Prometheus index whose count comes next
    if (!json_) {
      size_t len = 0;
      n.ForEachBucket(positive, [&](int32_t index, uint64_t count) {
        if (!any) {
          any = true;
          first = next = index;
        }
        const size_t gap = size_t(index - next);
        if (packed_.size() < len + gap + 10) {
          packed_.resize(std::max(2 * packed_.size(), len + gap + 10));
        }
        char* p = packed_.data() + len;
        std::memset(p, 0, gap);
        len = size_t(PutVarint(p + gap, count) - packed_.data());
        next = index + 1;
      });
      if (!any) continue;
      const int32_t offset = first - 1;
      const uint64_t zz = ZigZag32(offset);
      const size_t body =
          (zz != 0 ? 1 + VarintSize(zz) : 0) + LenFieldSize(len);
      AppendExact(&point_, LenFieldSize(body), [&](char* p) {
        p = PutMessageHeader(p, positive ? kExpPositive : kExpNegative, body);
        if (zz != 0) p = PutVarintField(p, kBucketsOffset, zz);
        p = PutMessageHeader(p, kBucketsCounts, len);
        std::memcpy(p, packed_.data(), len);
        return p + len;
      });
    } else {
      n.ForEachBucket(positive, [&](int32_t index, uint64_t count) {
        if (!any) {
          any = true;
          next = index;
          point_.append(positive ? ",\"positive\":{\"offset\":"
                                 : ",\"negative\":{\"offset\":");
          JsonInt(&point_, index - 1);
          point_.append(",\"bucketCounts\":[");
        } else {
          point_.push_back(',');
        }
        for (; next < index; ++next) point_.append("\"0\",");
        JsonQuotedInt(&point_, count);
        next = index + 1;
      });
      if (any) point_.append("]}");
    }
  }
  if (!json_) {
    ProtoDouble(&point_, kExpZeroThreshold, NativeHistogram::kZeroThreshold);
  } else {
    point_.append(",\"zeroThreshold\":");
    JsonDouble(&point_, NativeHistogram::kZeroThreshold);
    point_.push_back('}');
  }
}

void OtlpMetricsEncoder::ExplicitPoint(const SampleLabels& labels,
                                       const Histogram& h) {
  const std::vector<double>& bounds = h.layout().bounds();
  const std::vector<uint64_t>& counts = h.counts();
  const uint64_t start = StartTime(labels);
  if (!json_) {
    if (start != 0) ProtoFixed64(&point_, kHistStartTime, start);
    ProtoFixed64(&point_, kHistTime, options_.time_unix_nano);
    ProtoFixed64(&point_, kHistCount, h.count());
    ProtoDouble(&point_, kHistSum, h.sum());
    AppendExact(&point_, LenFieldSize(8 * counts.size()), [&](char* p) {
      p = PutMessageHeader(p, kHistBucketCounts, 8 * counts.size());
      for (uint64_t c : counts) p = PutFixed64(p, c);
      return p;
    });
    if (!bounds.empty()) {
      AppendExact(&point_, LenFieldSize(8 * bounds.size()), [&](char* p) {
        p = PutMessageHeader(p, kHistExplicitBounds, 8 * bounds.size());
        for (double b : bounds) p = PutFixed64(p, std::bit_cast<uint64_t>(b));
        return p;
      });
    }
    Attributes(labels, kHistAttributes);
    return;
  }
  JsonHistogramHead(labels, start, h);
  point_.append(",\"bucketCounts\":[");
  for (size_t i = 0; i < counts.size(); ++i) {
    if (i) point_.push_back(',');
    JsonQuotedInt(&point_, counts[i]);
  }
  point_.append("],\"explicitBounds\":[");
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (i) point_.push_back(',');
    JsonDouble(&point_, bounds[i]);
  }
  point_.append("]}");
}

void OtlpMetricsEncoder::AddPoint() {
  if (!json_) {
    points_.push_back(char(Tag1(kDataPoints, kLen)));
    Varint(&points_, point_.size());
  } else if (family_points_ != 0) {
    points_.push_back(',');
  }
  points_.append(point_);
  ++family_points_;
  ++data_points_;
}

void OtlpMetricsEncoder::FlushFamily() {
  if (family_points_ == 0) return;
  const bool temporal = kind_ != Kind::kGauge;
  const bool monotonic = type_ == MetricType::kCounter;
  const std::string_view unit = UnitOf(name_);
  const std::string_view type_name = TypeName(type_);
  if (!json_) {
    uint32_t data_field = kMetricGauge;
    switch (kind_) {
      case Kind::kGauge:
        break;
      case Kind::kSum:
        data_field = kMetricSum;
        break;
      case Kind::kHistogram:
        data_field = kMetricHistogram;
        break;
      case Kind::kExponential:
        data_field = kMetricExponentialHistogram;
        break;
    }
    const size_t data =
        points_.size() + (temporal ? 2 : 0) + (monotonic ? 2 : 0);
    metadata_.clear();  // prometheus.type, as a KeyValue field
    ProtoKeyValue(&metadata_, kMetricMetadata, "prometheus.type", type_name);
    // The Metric up to its data message's points: exact sizes first.
    const size_t head = LenFieldSize(metric_name_.size()) +
                        (help_.empty() ? 0 : LenFieldSize(help_.size())) +
                        (unit.empty() ? 0 : LenFieldSize(unit.size())) + 1 +
                        VarintSize(data);
    const size_t metric = head + data + metadata_.size();
    AppendExact(&metrics_, 1 + VarintSize(metric) + head, [&](char* p) {
      p = PutMessageHeader(p, kScopeMetricsMetrics, metric);
      p = PutLenField(p, kMetricName, metric_name_);
      if (!help_.empty()) p = PutLenField(p, kMetricDescription, help_);
      if (!unit.empty()) p = PutLenField(p, kMetricUnit, unit);
      return PutMessageHeader(p, data_field, data);
    });
    // The data message: its points (each already a field 1), then the
    // temporality and monotonicity; then the Metric's metadata.
    metrics_.append(points_);
    if (temporal) {
      metrics_.push_back(char(Tag1(kAggregationTemporality, kVarint)));
      metrics_.push_back(char(kCumulative));
    }
    if (monotonic) {
      metrics_.push_back(char(Tag1(kSumIsMonotonic, kVarint)));
      metrics_.push_back(1);
    }
    metrics_.append(metadata_);
  } else {
    if (metrics_count_ != 0) metrics_.push_back(',');
    metrics_.append("{\"name\":");
    JsonString(&metrics_, metric_name_);
    if (!help_.empty()) {
      metrics_.append(",\"description\":");
      JsonString(&metrics_, help_);
    }
    if (!unit.empty()) {
      metrics_.append(",\"unit\":");
      JsonString(&metrics_, unit);
    }
    metrics_.append(",\"metadata\":[");
    JsonKeyValue(&metrics_, "prometheus.type", type_name);
    metrics_.append("],");
    switch (kind_) {
      case Kind::kGauge:
        metrics_.append("\"gauge\":");
        break;
      case Kind::kSum:
        metrics_.append("\"sum\":");
        break;
      case Kind::kHistogram:
        metrics_.append("\"histogram\":");
        break;
      case Kind::kExponential:
        metrics_.append("\"exponentialHistogram\":");
        break;
    }
    metrics_.append("{\"dataPoints\":[");
    metrics_.append(points_);
    metrics_.push_back(']');
    if (temporal) metrics_.append(",\"aggregationTemporality\":2");
    if (monotonic) metrics_.append(",\"isMonotonic\":true");
    metrics_.append("}}");
  }
  ++metrics_count_;
  points_.clear();
  family_points_ = 0;
}

void OtlpMetricsEncoder::Finish() {
  FlushFamily();
  body_.clear();
  if (data_points_ == 0) {
    if (json_) body_ = "{}";
    return;
  }
  if (!json_) {
    // ExportMetricsServiceRequest { resource_metrics: ResourceMetrics {
    //   resource, scope_metrics: ScopeMetrics { scope, metrics... } } }
    const size_t scope_metrics = scope_.size() + metrics_.size();
    const size_t resource_metrics =
        resource_.size() + LenFieldSize(scope_metrics);
    body_.reserve(LenFieldSize(resource_metrics));
    body_.push_back(char(Tag1(kRequestResourceMetrics, kLen)));
    Varint(&body_, resource_metrics);
    body_.append(resource_);
    body_.push_back(char(Tag1(kResourceMetricsScopeMetrics, kLen)));
    Varint(&body_, scope_metrics);
    body_.append(scope_);
    body_.append(metrics_);
    return;
  }
  body_.reserve(resource_.size() + metrics_.size() + 8);
  body_.append(resource_);
  body_.append(metrics_);
  body_.append("]}]}]}");
}

}  // namespace tokenmeter::daemon::otlp_metrics
