// The daemon's metrics as one OTLP ExportMetricsServiceRequest
// (opentelemetry/proto/collector/metrics/v1/metrics_service.proto), in
// protobuf (application/x-protobuf) or OTLP/JSON (application/json), the
// body daemon/otlp's transport sends to /v1/metrics. A MetricWriter: the
// daemon renders the registry into it with Render(registry, encoder)
// (daemon/exposition/exposition.h), so a push holds exactly the families
// and samples /metrics shows at that moment.
//
// Conversion (the OpenTelemetry Prometheus compatibility specification,
// "Prometheus Metric points to OTLP"; docs/otlp-metrics.md, "Conversion",
// has the worked examples):
//
// * One request: one ResourceMetrics (the options' resource attributes, as
//   strings), one ScopeMetrics (scope name and version), one Metric per
//   family with at least one sample, in render order. A family without
//   samples is left out.
// * Name: the Prometheus metric name, not altered (the specification's
//   default): the name /metrics (text 0.0.4) gives the family in its HELP
//   and TYPE lines, prefix + name, and for a counter + `_total`
//   (vllm:prompt_tokens_total). The OTLP-to-Prometheus direction adds
//   `_total` only to a monotonic Sum without it, so the counter lands under
//   the name /metrics shows. Help text is the description; metadata holds
//   prometheus.type = the family's TYPE ("counter", "gauge", "histogram";
//   `_info` families are gauges in /metrics and say "gauge").
// * Unit (the catalog has none; UnitOf()): from the family name's last
//   word (a counter's before `_total`):
//   `_seconds` -> "s", `_bytes` -> "By", `_ratio` -> "1", anything else ""
//   (no unit: a unit such as "1" or "{token}" would make Prometheus append
//   a suffix, `_ratio`, to a name that has none, and rename the series).
// * Type: counter -> Sum {is_monotonic, CUMULATIVE}; gauge -> Gauge, except
//   a family whose name ends in `_info` -> Sum {not monotonic, CUMULATIVE}
//   (an info series); histogram -> ONE of (options.histograms):
//   - kExponential (default): its native buckets (Histogram::native()) as
//     an ExponentialHistogram point: scale = schema, zero_threshold =
//     NativeHistogram::kZeroThreshold (2^-128), zero_count, and positive
//     and negative Buckets with absolute counts, dense from the first to
//     the last populated index (zeros between). Index convention: a
//     Prometheus native bucket k holds (base^(k-1), base^k], an OTLP bucket
//     i holds (base^i, base^(i+1)], so OTLP index = Prometheus index - 1
//     (offset = first populated Prometheus index - 1; the same for the
//     negative side, by absolute value). Lossless: no re-bucketing.
//   - kExplicit: its classic buckets as a Histogram point: explicit_bounds
//     = the layout's bounds (exposed units), bucket_counts per bucket (not
//     cumulative; one more than the bounds, the last the +Inf bucket).
//   Both carry count = Histogram::count() and sum = Histogram::sum(), the
//   /metrics _count and _sum (the native buckets plus zero_count may total
//   less than count by the NaN observations the native buckets ignore).
// * Values: a uint64 sample as as_int (exact) when it fits int64, else as
//   as_double; a double sample as as_double (NaN, +-Inf as JSON strings).
// * Attributes of each point: the sample's label pairs in order, then its
//   own label (SampleLabels::own_name/value), all string-valued.
// * Times: time_unix_nano = options.time_unix_nano on every point;
//   start_time_unix_nano = options.start_time(name, labels) (name: the
//   family name, prefix + name, without `_total`) when the hook
//   is set and returns non-zero, else options.start_time_unix_nano (left
//   out when 0) — on every point, gauges included.
//
// Protobuf: hand-written (daemon/base/proto_wire.h), proto3 defaults left
// out except sum (explicit presence: always written), fields in field-number
// order. Field numbers from opentelemetry-proto v1
// (opentelemetry/proto/metrics/v1/metrics.proto and
// collector/metrics/v1/metrics_service.proto), as the generated code in
// @opentelemetry/otlp-transformer 0.216.0 (build/src/generated/root.js)
// encodes them. JSON: the OTLP/JSON mapping: lowerCamelCase keys, 64-bit
// integers (times, counts, asInt, zeroCount, bucketCounts) as decimal
// strings, enums (aggregationTemporality) as numbers, doubles as the
// shortest text that reads back exactly.
//
// Cost: one pass over what Render() writes; each data point is encoded
// into a scratch buffer and copied three times in all (into its metric,
// into the metrics, into the body): O(bytes). The buffers are kept across
// Reset(), so a steady push allocates only where a buffer must grow (and
// whatever the start-time hook does). Measured (bench/daemon/
// render_bench.cpp, tokenmeterd_otlp_metrics; docs/otlp-metrics.md,
// "Cost"): 1,660 points (14,932 text samples) in 0.51 ms, 301 KB, as
// protobuf with exponential histograms (about 0.3 us a point); 1.2 ms,
// 936 KB, as JSON; /metrics text of the same registry takes 0.66 ms.
// An exponential point holds one count per index between its lowest and
// highest populated bucket: within 10 octaves at schema 3, 80 counts
// (~100 B); the worst case, populated buckets 2^-128 and 2^1024 apart at
// schema 8, ~295k one-byte counts per sign — inherent to OTLP's dense
// buckets (it has no spans).
//
// Threads: none; one thread at a time (the daemon's loop).
#ifndef TOKENMETER_DAEMON_OTLP_METRICS_OTLP_METRICS_ENCODER_H_
#define TOKENMETER_DAEMON_OTLP_METRICS_OTLP_METRICS_ENCODER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/store/catalog.h"
#include "daemon/store/histogram.h"
#include "daemon/store/metric_writer.h"
#include "daemon/trace/otlp_trace_encoder.h"

namespace tokenmeter::daemon::otlp_metrics {

using trace::OtlpEncoding;

// --otlp-histograms: the one form every histogram takes.
enum class HistogramForm : uint8_t { kExponential, kExplicit };

// The start time of one series' points, in Unix nanoseconds: called once
// per data point with the OTLP metric name (prefix + name, counters without
// _total) and the sample's labels (views valid during the call only); 0
// means "use start_time_unix_nano".
using StartTimeHook =
    std::function<uint64_t(std::string_view name, const SampleLabels& labels)>;

struct OtlpMetricsOptions {
  OtlpEncoding encoding = OtlpEncoding::kProtobuf;
  HistogramForm histograms = HistogramForm::kExponential;
  // The push's time, on every point (Reset() sets it for the next push).
  uint64_t time_unix_nano = 0;
  // The default start time (the daemon's start); 0: left out.
  uint64_t start_time_unix_nano = 0;
  // Per-series start times; null: start_time_unix_nano for every point.
  StartTimeHook start_time;
  // Resource attributes in order (service.name first, by convention), all
  // string-valued; keys should be unique (OTLP requires it; not checked).
  std::vector<std::pair<std::string, std::string>> resource_attributes;
  std::string scope_name = "tokenmeterd";
  std::string scope_version;  // empty: left out
};

// The OTLP unit of a family named `name` (a counter's family name, without
// _total): "s", "By", "1" or "" (see the top of this file).
std::string_view UnitOf(std::string_view name);

class OtlpMetricsEncoder final : public MetricWriter {
 public:
  // The resource and scope are encoded once, here.
  explicit OtlpMetricsEncoder(OtlpMetricsOptions options);
  OtlpMetricsEncoder(const OtlpMetricsEncoder&) = delete;
  OtlpMetricsEncoder& operator=(const OtlpMetricsEncoder&) = delete;

  const OtlpMetricsOptions& options() const { return options_; }
  // "application/x-protobuf" or "application/json".
  std::string_view content_type() const {
    return trace::ContentType(options_.encoding);
  }

  // Starts the next request, its points at `time_unix_nano`: forgets the
  // body and the counts, keeps the buffers.
  void Reset(uint64_t time_unix_nano);

  // MetricWriter: Render() calls these; Finish() completes the body.
  void BeginFamily(std::string_view prefix, std::string_view name,
                   MetricType type, std::string_view help) override;
  void Sample(const SampleLabels& labels, uint64_t value) override;
  void Sample(const SampleLabels& labels, double value) override;
  void HistogramSample(const SampleLabels& labels, const Histogram& h) override;
  void Finish() override;

  // After Finish(): the ExportMetricsServiceRequest. With no data point it
  // is empty in protobuf (an empty request) and "{}" in JSON; the caller
  // may skip sending it (data_points() == 0).
  const std::string& body() const { return body_; }
  // Data points and metrics in body() (an export response's
  // partial_success counts rejected data points).
  size_t data_points() const { return data_points_; }
  size_t metrics() const { return metrics_count_; }

 private:
  enum class Kind : uint8_t { kGauge, kSum, kHistogram, kExponential };

  // Writes the pending family's Metric (if it has points) to metrics_.
  void FlushFamily();
  uint64_t StartTime(const SampleLabels& labels) const;
  // One NumberDataPoint into points_.
  void NumberPoint(const SampleLabels& labels, bool is_int, uint64_t bits);
  // The point's attributes, protobuf (field `field`) or JSON ("attributes"
  // key with a leading comma), appended to point_.
  void Attributes(const SampleLabels& labels, uint32_t field);
  void ExponentialPoint(const SampleLabels& labels, const Histogram& h);
  void ExplicitPoint(const SampleLabels& labels, const Histogram& h);
  // JSON: a point's opening brace and its times; a histogram point's
  // times, attributes, count and sum.
  void JsonPointTimes(uint64_t start);
  void JsonHistogramHead(const SampleLabels& labels, uint64_t start,
                         const Histogram& h);
  // Appends the finished point_ to points_.
  void AddPoint();

  OtlpMetricsOptions options_;
  bool json_;
  // Protobuf: the Resource field and the InstrumentationScope field. JSON:
  // the text before the metrics.
  std::string resource_;
  std::string scope_;

  // The pending family.
  std::string name_;         // the family's: prefix + name
  std::string metric_name_;  // the OTLP metric's: name_, a counter's + _total
  std::string help_;
  MetricType type_ = MetricType::kGauge;
  Kind kind_ = Kind::kGauge;
  size_t family_points_ = 0;

  std::string point_;     // one point being encoded
  std::string points_;    // the pending family's encoded points
  std::string metrics_;   // every finished Metric
  std::string metadata_;  // one Metric's metadata field
  std::string body_;
  // One sign's packed bucket counts (grown, never shrunk: no allocation
  // per point once it fits the widest histogram).
  std::string packed_;
  size_t data_points_ = 0;
  size_t metrics_count_ = 0;
};

}  // namespace tokenmeter::daemon::otlp_metrics

#endif  // TOKENMETER_DAEMON_OTLP_METRICS_OTLP_METRICS_ENCODER_H_
