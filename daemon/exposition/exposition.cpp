#include "daemon/exposition/exposition.h"

#include <map>
#include <vector>

#include "daemon/base/text_format.h"
#include "daemon/store/profile.h"

namespace tokenmeter::daemon {
namespace {

void WriteValues(const FamilyDef& f, const SeriesValues& v,
                 const SampleLabels& labels, MetricWriter& w) {
  const EngineMetricDef& def = kEngineMetrics[f.metric];
  switch (def.type) {
    case MetricType::kHistogram:
      w.HistogramSample(labels, v.hist(def.id));
      return;
    case MetricType::kGauge:
      w.Sample(labels, v.gauge(def.id).value());
      return;
    case MetricType::kCounter:
      break;
  }
  if (def.own_label.empty()) {
    w.Sample(f.const_label.empty()
                 ? labels
                 : labels.WithOwn(f.const_label, f.const_value),
             v.count(def.id));
    return;
  }
  const std::vector<uint64_t>& children = v.children(def.id);
  const std::span<const std::string_view> fixed = FixedLabelValues(def.id);
  if (f.reason_names != nullptr) {
    // The profile's names; children with one name are summed, shown in
    // the order of their first child.
    for (size_t i = 0; i < fixed.size(); ++i) {
      bool seen = false;
      for (size_t j = 0; j < i; ++j) {
        seen = seen || f.reason_names[j] == f.reason_names[i];
      }
      if (seen) continue;
      uint64_t sum = 0;
      for (size_t j = i; j < fixed.size(); ++j) {
        if (f.reason_names[j] == f.reason_names[i]) {
          sum =
              __builtin_add_overflow(sum, children[j], &sum) ? UINT64_MAX : sum;
        }
      }
      w.Sample(labels.WithOwn(def.own_label, f.reason_names[i]), sum);
    }
    return;
  }
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

void WriteMetric(const FamilyDef& f, const EngineSeries& s, MetricWriter& w) {
  if (!kEngineMetrics[f.metric].request_level) {
    WriteValues(f, s, SampleLabels{s.label_text(), s.label_pairs(), {}, {}}, w);
    return;
  }
  if (s.own_cell_shown()) {
    WriteValues(f, s,
                SampleLabels{s.base_label_text(), s.base_label_pairs(), {}, {}},
                w);
  }
  for (const LabelCell& c : s.cells()) {
    WriteValues(f, *c.values, SampleLabels{c.label_text, c.label_pairs, {}, {}},
                w);
  }
}

double Ratio(uint64_t num, uint64_t den) {
  return den == 0 ? 0.0 : double(num) / double(den);
}

// Whether family `f` has a sample in any series of `group`.
bool Shown(const FamilyDef& f, std::span<const EngineSeries* const> group,
           const RegistryOptions& options) {
  for (const EngineSeries* s : group) {
    if (f.part != PartKind::kNone) {
      const Part* part = s->parts().get(f.part);
      if (part == nullptr) continue;
      if (f.source == FamilySource::kPart) {
        if (part->Shows(f, options)) return true;
        continue;
      }
      return true;  // a measured family shown with its part
    }
    switch (f.source) {
      case FamilySource::kRatio:
        return true;
      case FamilySource::kPerPositionRate:
        if (!s->children(f.metric).empty()) return true;
        break;
      case FamilySource::kMetric: {
        // A family whose children appear as counted (positions) is shown
        // once some series has one.
        const EngineMetricDef& def = kEngineMetrics[f.metric];
        if (def.own_label.empty() || !FixedLabelValues(def.id).empty() ||
            !s->children(def.id).empty()) {
          return true;
        }
        break;
      }
      case FamilySource::kPart:
        break;  // f.part names the part
    }
  }
  return false;
}

void WriteFamily(const FamilyDef& f, const EngineSeries& s, MetricWriter& w) {
  if (f.part != PartKind::kNone) {
    const Part* part = s.parts().get(f.part);
    if (part == nullptr) return;
    if (f.source == FamilySource::kPart) {
      part->Write(f, s, w);
      return;
    }
  }
  switch (f.source) {
    case FamilySource::kMetric:
      WriteMetric(f, s, w);
      return;
    case FamilySource::kRatio: {
      double v = Ratio(s.count(f.metric), s.count(f.metric2));
      if (f.plus_one && s.count(f.metric2) > 0) v += 1.0;
      w.Sample(SampleLabels{s.label_text(), s.label_pairs(), {}, {}}, v);
      return;
    }
    case FamilySource::kPerPositionRate: {
      const SampleLabels labels{s.label_text(), s.label_pairs(), {}, {}};
      const std::vector<uint64_t>& children = s.children(f.metric);
      std::string index;
      for (size_t i = 0; i < children.size(); ++i) {
        index.clear();
        AppendUint(index, i);
        w.Sample(labels.WithOwn(kEngineMetrics[f.metric].own_label, index),
                 Ratio(children[i], s.count(f.metric2)));
      }
      return;
    }
    case FamilySource::kPart:
      return;  // without f.part: nothing to write
  }
}

void RenderEngine(const Registry& registry, MetricWriter& w) {
  // Series come ordered by identity, so each namespace's series are
  // contiguous (and of one profile): render one namespace's families at a
  // time.
  std::vector<const EngineSeries*> all;
  all.reserve(registry.series_count());
  registry.ForEachSeries([&](const EngineSeries& s) { all.push_back(&s); });
  const RegistryOptions& options = registry.options();
  size_t begin = 0;
  while (begin < all.size()) {
    size_t end = begin;
    const std::string& ns = all[begin]->identity().ns;
    while (end < all.size() && all[end]->identity().ns == ns) ++end;
    const std::span<const EngineSeries* const> group(all.data() + begin,
                                                     end - begin);
    const std::string prefix = ns + ":";
    for (const FamilyDef& f : ProfileFamilies(all[begin]->profile())) {
      if (f.legacy && !options.legacy_names) continue;
      if (!Shown(f, group, options)) continue;
      w.BeginFamily(prefix, FamilyName(f), f.type, FamilyHelp(f));
      for (const EngineSeries* s : group) WriteFamily(f, *s, w);
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
