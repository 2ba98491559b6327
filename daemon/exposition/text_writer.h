// MetricWriter for the Prometheus text format 0.0.4 and OpenMetrics 1.0
// text: appends to a string; never fails, never allocates beyond `out`.
#ifndef TOKENMETER_DAEMON_EXPOSITION_TEXT_WRITER_H_
#define TOKENMETER_DAEMON_EXPOSITION_TEXT_WRITER_H_

#include <string>
#include <string_view>

#include "daemon/store/metric_writer.h"

namespace tokenmeter::daemon {

enum class ExpositionFormat { kText004, kOpenMetrics100 };

class TextWriter : public MetricWriter {
 public:
  TextWriter(ExpositionFormat format, std::string& out)
      : format_(format), out_(out) {}

  void BeginFamily(std::string_view prefix, std::string_view name,
                   MetricType type, std::string_view help) override;
  void Sample(const SampleLabels& labels, uint64_t value) override;
  void Sample(const SampleLabels& labels, double value) override;
  void HistogramSample(const SampleLabels& labels, const Histogram& h) override;
  void Finish() override;

 private:
  // name[suffix]{labels} (with the trailing space).
  void AppendName(std::string_view suffix, const SampleLabels& labels);

  const ExpositionFormat format_;
  std::string& out_;
  std::string_view prefix_;
  std::string_view name_;
  MetricType type_ = MetricType::kGauge;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_EXPOSITION_TEXT_WRITER_H_
