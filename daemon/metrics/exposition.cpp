#include "daemon/metrics/exposition.h"

#include <map>
#include <vector>

#include "daemon/metrics/text_format.h"

namespace tokenmeter::daemon {
namespace {

SampleLabels LabelsOf(const EngineSeries& s) {
  return SampleLabels{s.label_text(), s.label_pairs(), {}, {}};
}

void WriteEngineSample(const EngineMetricDef& def, const EngineSeries& s,
                       MetricWriter& w) {
  const SampleLabels labels = LabelsOf(s);
  switch (def.type) {
    case MetricType::kHistogram:
      w.HistogramSample(labels, s.hist(def.id));
      return;
    case MetricType::kGauge:
      w.Sample(labels, s.gauge(def.id).value());
      return;
    case MetricType::kCounter:
      break;
  }
  if (def.own_label.empty()) {
    w.Sample(labels, s.count(def.id));
    return;
  }
  const std::vector<uint64_t>& children = s.children(def.id);
  const std::span<const std::string_view> fixed = FixedLabelValues(def.id);
  std::string index;
  for (size_t i = 0; i < children.size(); ++i) {
    std::string_view value;
    if (i < fixed.size()) {
      value = fixed[i];
    } else {
      index.clear();
      AppendUint(index, i);
      value = index;
    }
    w.Sample(labels.WithOwn(def.own_label, value), children[i]);
  }
}

void RenderEngine(const Registry& registry, MetricWriter& w) {
  // Series come ordered by identity, so each namespace's series are
  // contiguous: render one namespace's families at a time.
  std::vector<const EngineSeries*> all;
  all.reserve(registry.series_count());
  registry.ForEachSeries([&](const EngineSeries& s) { all.push_back(&s); });
  size_t begin = 0;
  while (begin < all.size()) {
    size_t end = begin;
    const std::string& ns = all[begin]->identity().ns;
    while (end < all.size() && all[end]->identity().ns == ns) ++end;
    const std::string prefix = ns + ":";
    for (const EngineMetricDef& def : kEngineMetrics) {
      // A family whose children appear as counted (positions) is shown
      // once some series has one.
      if (!def.own_label.empty() && FixedLabelValues(def.id).empty()) {
        bool any = false;
        for (size_t i = begin; i < end; ++i) {
          any = any || !all[i]->children(def.id).empty();
        }
        if (!any) continue;
      }
      w.BeginFamily(prefix, def.suffix, def.type, def.help);
      for (size_t i = begin; i < end; ++i) WriteEngineSample(def, *all[i], w);
    }
    begin = end;
  }
}

}  // namespace

void Render(const Registry& registry, MetricWriter& w) {
  RenderEngine(registry, w);
  std::vector<const Collector*> begun;
  for (const DaemonMetricDef& def : kDaemonMetrics) {
    const Collector* c = registry.collector(def.id);
    if (c == nullptr) continue;
    bool seen = false;
    for (const Collector* b : begun) seen = seen || b == c;
    if (!seen) {
      c->BeginRender();
      begun.push_back(c);
    }
    w.BeginFamily("", def.name, def.type, def.help);
    c->Collect(def.id, w);
  }
  w.Finish();
}

void Render(const Registry& registry, ExpositionFormat format,
            std::string& out) {
  TextWriter w(format, out);
  Render(registry, w);
}

}  // namespace tokenmeter::daemon
