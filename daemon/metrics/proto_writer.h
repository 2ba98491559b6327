// MetricWriter for the Prometheus protobuf exposition
// (application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily;
// encoding=delimited): each family as one io.prometheus.client.MetricFamily
// message, preceded by its size as a varint, appended to a string. The
// message code is generated at build time from Debian's metrics.proto
// (daemon/metrics/meson.build).
//
// What it writes (docs/metrics.md, "Native histograms"):
// * family names as in text 0.0.4 (counters with _total); HELP as given;
//   counters, gauges and histograms as COUNTER, GAUGE and HISTOGRAM;
// * a family without samples is left out (the text formats show its HELP
//   and TYPE; Prometheus skips an empty family in protobuf anyway);
// * histograms with their classic buckets (cumulative, the +Inf bucket left
//   out as client_golang does: the count stands for it), sum and count, and
//   their native buckets: schema, zero threshold (2^-128), zero count, and
//   the positive and negative buckets as spans and deltas; a histogram with
//   no native bucket populated gets one empty span at offset 0, as
//   client_golang writes it, so that it still reads as native.
//
// Cost: proportional to the samples; the message objects of one family are
// reused for the next (no allocation per sample once the largest family
// has been seen). Single-threaded (the daemon's loop); never fails.
#ifndef TOKENMETER_DAEMON_METRICS_PROTO_WRITER_H_
#define TOKENMETER_DAEMON_METRICS_PROTO_WRITER_H_

#include <memory>
#include <string>
#include <string_view>

#include "daemon/metrics/metric_writer.h"

namespace io::prometheus::client {
class Metric;
class MetricFamily;
}  // namespace io::prometheus::client

namespace tokenmeter::daemon {

class ProtoWriter : public MetricWriter {
 public:
  explicit ProtoWriter(std::string& out);
  ~ProtoWriter() override;
  ProtoWriter(const ProtoWriter&) = delete;
  ProtoWriter& operator=(const ProtoWriter&) = delete;

  void BeginFamily(std::string_view prefix, std::string_view name,
                   MetricType type, std::string_view help) override;
  void Sample(const SampleLabels& labels, uint64_t value) override;
  void Sample(const SampleLabels& labels, double value) override;
  void HistogramSample(const SampleLabels& labels, const Histogram& h) override;
  void Finish() override;

 private:
  // A new Metric of the current family with `labels`.
  io::prometheus::client::Metric* AddMetric(const SampleLabels& labels);
  // Appends the current family (when it has samples) to out_.
  void Flush();

  std::string& out_;
  std::unique_ptr<io::prometheus::client::MetricFamily> family_;
  MetricType type_ = MetricType::kGauge;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_METRICS_PROTO_WRITER_H_
