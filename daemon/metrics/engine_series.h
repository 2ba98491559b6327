// One engine series: every metric of one identity (namespace, model_name,
// engine instance, HELLO labels), stored by catalog id so that a metric is
// declared once (catalog.cpp) and then only observed: the exposition and the
// summary line read it back by id.
//
// Single-threaded: everything runs on the daemon's loop.
#ifndef TOKENMETER_DAEMON_METRICS_ENGINE_SERIES_H_
#define TOKENMETER_DAEMON_METRICS_ENGINE_SERIES_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "daemon/metrics/catalog.h"
#include "daemon/metrics/histogram.h"

namespace tokenmeter::daemon {

// Histograms are contiguous in the catalog, from kTimeToFirstToken to
// kIterationTokens (Registry::Create checks it).
inline constexpr EngineMetric kFirstHistogram = kTimeToFirstToken;
inline constexpr int kNumHistograms = kIterationTokens - kTimeToFirstToken + 1;

using LabelPairs = std::vector<std::pair<std::string, std::string>>;

// The identity of an engine series. Canonical: labels sorted by name, so
// that two HELLOs whose labels differ only in order name one series.
struct SeriesIdentity {
  std::string ns;        // metric namespace (sanitized engine or --namespace)
  std::string model;     // model_name
  std::string instance;  // engine
  LabelPairs labels;     // sorted by name (Canonical())

  auto operator<=>(const SeriesIdentity&) const = default;
  // This identity with its labels sorted by name.
  SeriesIdentity Canonical() const;
};

// The metric namespace for a HELLO engine name: every character outside
// [a-zA-Z0-9_] becomes '_'.
std::string SanitizeNamespace(std::string_view engine);

// A gauge set from STEP data when the engine sends it, else derived from
// request states (+1/-1 as requests move). kv_cache_usage_perc is only set.
struct GaugeCell {
  double set_value = 0;
  int64_t derived = 0;
  bool has_set = false;
  double value() const {
    return has_set ? set_value : double(std::max<int64_t>(0, derived));
  }
};

class EngineSeries {
 public:
  // `identity` canonical; `label_order` the same labels in the order the
  // exposition shows them (the first HELLO's). layouts: kNumHistograms
  // entries, in catalog order, outliving the series.
  EngineSeries(SeriesIdentity identity, const LabelPairs& label_order,
               const std::vector<HistogramLayout>& layouts);
  EngineSeries(const EngineSeries&) = delete;
  EngineSeries& operator=(const EngineSeries&) = delete;

  const SeriesIdentity& identity() const { return identity_; }
  // model_name="..",engine="..",k="v" (escaped, text formats).
  const std::string& label_text() const { return label_text_; }
  // (name, value) pairs in label_text() order, model_name and engine first.
  const LabelPairs& label_pairs() const { return label_pairs_; }

  // Scalar counters. Saturating: a counter stops at 2^64 - 1 instead of
  // wrapping to a small value (which Prometheus would read as a reset).
  void Add(EngineMetric m, uint64_t n) { SaturatingAdd(counts_[m], n); }
  uint64_t count(EngineMetric m) const { return counts_[m]; }

  // Counters with an own label: child `i` is FixedLabelValues(m)[i], or
  // position i for an index label (children grow to fit).
  void AddChild(EngineMetric m, size_t i, uint64_t n) {
    std::vector<uint64_t>& c = children_[m];
    if (c.size() <= i) c.resize(i + 1, 0);
    SaturatingAdd(c[i], n);
  }
  const std::vector<uint64_t>& children(EngineMetric m) const {
    return children_[m];
  }

  // Gauges.
  void Set(EngineMetric m, double v) {
    gauges_[m].set_value = v;
    gauges_[m].has_set = true;
  }
  void AddDerived(EngineMetric m, int64_t delta) {
    gauges_[m].derived += delta;
  }
  const GaugeCell& gauge(EngineMetric m) const { return gauges_[m]; }

  Histogram& hist(EngineMetric m) { return hists_[m - kFirstHistogram]; }
  const Histogram& hist(EngineMetric m) const {
    return hists_[m - kFirstHistogram];
  }

 private:
  static void SaturatingAdd(uint64_t& acc, uint64_t n) {
    if (__builtin_add_overflow(acc, n, &acc)) acc = UINT64_MAX;
  }

  const SeriesIdentity identity_;
  LabelPairs label_pairs_;
  std::string label_text_;
  std::array<uint64_t, kNumEngineMetrics> counts_{};
  std::array<GaugeCell, kNumEngineMetrics> gauges_{};
  std::array<std::vector<uint64_t>, kNumEngineMetrics> children_;
  std::vector<Histogram> hists_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_METRICS_ENGINE_SERIES_H_
