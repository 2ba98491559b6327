// The two interfaces between the metric state and the exposition formats:
// a MetricWriter turns families and samples into one format's bytes (text
// 0.0.4 and OpenMetrics in text_writer.h; a protobuf writer can implement
// the same calls), and a Collector is a component (ingest, tracker, HTTP,
// the process) that owns some daemon families' values and writes their
// samples when asked. Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_METRIC_WRITER_H_
#define TOKENMETER_DAEMON_STORE_METRIC_WRITER_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "daemon/store/catalog.h"
#include "daemon/store/histogram.h"

namespace tokenmeter::daemon {

// The labels of one sample: a series' labels (pre-rendered, escaped, for
// the text formats, and as unescaped pairs for structured formats) plus at
// most one label of the family's own (`own_name` empty: none). Own label
// values are chosen by the daemon (reasons, kinds, le bounds, positions)
// and need no escaping in any format.
struct SampleLabels {
  std::string_view text;  // 'a="x",b="y"', escaped; may be empty
  std::span<const std::pair<std::string, std::string>> pairs;  // same labels
  std::string_view own_name;
  std::string_view own_value;

  SampleLabels WithOwn(std::string_view name, std::string_view value) const {
    SampleLabels l = *this;
    l.own_name = name;
    l.own_value = value;
    return l;
  }
};

class MetricWriter {
 public:
  virtual ~MetricWriter() = default;
  // Starts a family named prefix + name (counters without _total); every
  // sample until the next BeginFamily() belongs to it.
  virtual void BeginFamily(std::string_view prefix, std::string_view name,
                           MetricType type, std::string_view help) = 0;
  // One counter or gauge sample of the current family (uint64: exact).
  virtual void Sample(const SampleLabels& labels, uint64_t value) = 0;
  virtual void Sample(const SampleLabels& labels, double value) = 0;
  // Every bucket, the sum and the count of one histogram of the family.
  virtual void HistogramSample(const SampleLabels& labels,
                               const Histogram& h) = 0;
  // After the last family.
  virtual void Finish() = 0;
};

// A component's daemon families. The component registers itself for the
// DaemonMetric ids it owns (Registry::Register) and must outlive every
// render or unregister first.
class Collector {
 public:
  virtual ~Collector() = default;
  // Called once per render, before this collector's first Collect(): a
  // chance to read a snapshot (e.g. /proc) shared by its families.
  virtual void BeginRender() const {}
  // Writes the samples of family `id`; its metadata is written already.
  virtual void Collect(DaemonMetric id, MetricWriter& w) const = 0;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_METRIC_WRITER_H_
