// MetricWriter for the Prometheus protobuf exposition
// (application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily;
// encoding=delimited): each family as one io.prometheus.client.MetricFamily
// message of metrics.proto, preceded by its size as a varint, appended to a
// string.
//
// A hand-written encoder of the few messages the exposition needs. The
// message classes protoc generates from Debian's metrics.proto are built
// too (tests/testutil/protobuf/meson.build) and serve as its reference:
// LibraryProtoWriter writes the same exposition with them, the tests
// require the two to agree byte for byte and decode this one with the
// generated parser, and bench/daemon/render_bench.cpp shows why the daemon
// does not use the library: building and serializing the generated
// messages costs 2.4x the text render, this encoder within 1.5x
// (docs/performance.md, "Native histograms").
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
// Encoding: proto2 as the generated code writes it: every field the
// exposition sets is written (zeros and empty strings too), in field number
// order, repeated scalars unpacked.
//
// Cost: proportional to the bytes written; the scratch buffers are reused
// from family to family (no allocation per sample once the largest family
// has been seen). Single-threaded (the daemon's loop); never fails.
#ifndef TOKENMETER_DAEMON_EXPOSITION_PROTO_WRITER_H_
#define TOKENMETER_DAEMON_EXPOSITION_PROTO_WRITER_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "daemon/store/metric_writer.h"

namespace tokenmeter::daemon {

// ProtoWriter's scratch buffer: bytes written through a pointer
// (std::string's append costs a call per field); `len` bytes of `buf` are
// used, the rest is room.
struct ProtoWriterBytes {
  std::string buf;
  size_t len = 0;
  // Room for n more bytes at the returned pointer (len unchanged).
  char* Room(size_t n) {
    if (len + n > buf.size()) buf.resize(std::max(2 * buf.size(), len + n));
    return buf.data() + len;
  }
  std::string_view view() const { return {buf.data(), len}; }
};

class ProtoWriter : public MetricWriter {
 public:
  explicit ProtoWriter(std::string& out) : out_(out) {}

  void BeginFamily(std::string_view prefix, std::string_view name,
                   MetricType type, std::string_view help) override;
  void Sample(const SampleLabels& labels, uint64_t value) override;
  void Sample(const SampleLabels& labels, double value) override;
  void HistogramSample(const SampleLabels& labels, const Histogram& h) override;
  void Finish() override;

 private:
  // The labels of a Metric into metric_ (cleared first).
  void MetricLabels(const SampleLabels& labels);
  // metric_ plus field `tag` holding `inner` as one Metric of the family.
  void AddMetric(uint32_t tag, std::string_view inner);
  // Appends the current family (when it has samples) to out_.
  void Flush();

  using Bytes = ProtoWriterBytes;
  std::string& out_;
  Bytes header_;  // the family's name, help and type fields
  Bytes body_;    // its Metric fields
  Bytes metric_;  // one Metric's label fields
  Bytes inner_;   // one Metric's value message
  Bytes deltas_;  // one sign's native bucket deltas
  MetricType type_ = MetricType::kGauge;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_EXPOSITION_PROTO_WRITER_H_
