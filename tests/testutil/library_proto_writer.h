// The Prometheus protobuf exposition written with the message classes that
// protoc generates at build time from Debian's metrics.proto
// (tests/testutil/protobuf/meson.build): the reference for ProtoWriter, the
// hand-written encoder the daemon uses. Not linked into tokenmeterd: the
// tests compare ProtoWriter's bytes with these, and
// bench/daemon/render_bench.cpp times both, which is why the daemon does not
// use the library (docs/performance.md, "Native histograms": building the
// messages and serializing them costs more than 2x the text render).
//
// It writes the same fields in the same order as ProtoWriter (proto2: each
// field set explicitly is written, repeated scalars unpacked, fields in
// number order), so the two agree byte for byte. Single-threaded.
#ifndef TOKENMETER_TESTS_TESTUTIL_LIBRARY_PROTO_WRITER_H_
#define TOKENMETER_TESTS_TESTUTIL_LIBRARY_PROTO_WRITER_H_

#include <memory>
#include <string>
#include <string_view>

#include "daemon/store/metric_writer.h"

namespace io::prometheus::client {
class Metric;
class MetricFamily;
}  // namespace io::prometheus::client

namespace tokenmeter::daemon {

class LibraryProtoWriter : public MetricWriter {
 public:
  explicit LibraryProtoWriter(std::string& out);
  ~LibraryProtoWriter() override;
  LibraryProtoWriter(const LibraryProtoWriter&) = delete;
  LibraryProtoWriter& operator=(const LibraryProtoWriter&) = delete;

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

#endif  // TOKENMETER_TESTS_TESTUTIL_LIBRARY_PROTO_WRITER_H_
