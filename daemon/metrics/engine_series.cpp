#include "daemon/metrics/engine_series.h"

#include "daemon/metrics/text_format.h"

namespace tokenmeter::daemon {

SeriesIdentity SeriesIdentity::Canonical() const {
  SeriesIdentity c = *this;
  std::sort(c.labels.begin(), c.labels.end());
  return c;
}

std::string SanitizeNamespace(std::string_view engine) {
  std::string ns(engine);
  for (char& c : ns) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_';
    if (!ok) c = '_';
  }
  return ns;
}

EngineSeries::EngineSeries(SeriesIdentity identity,
                           const LabelPairs& label_order,
                           const std::vector<HistogramLayout>& layouts)
    : identity_(std::move(identity)) {
  label_pairs_.reserve(label_order.size() + 2);
  label_pairs_.emplace_back("model_name", identity_.model);
  label_pairs_.emplace_back("engine", identity_.instance);
  label_pairs_.insert(label_pairs_.end(), label_order.begin(),
                      label_order.end());
  for (const auto& [name, value] : label_pairs_) {
    if (!label_text_.empty()) label_text_ += ',';
    label_text_ += name;
    label_text_ += "=\"";
    AppendEscaped(label_text_, value);
    label_text_ += '"';
  }
  for (const EngineMetricDef& def : kEngineMetrics) {
    const size_t fixed = FixedLabelValues(def.id).size();
    if (fixed > 0) children_[def.id].assign(fixed, 0);
  }
  hists_.reserve(layouts.size());
  for (const HistogramLayout& layout : layouts) hists_.emplace_back(&layout);
}

}  // namespace tokenmeter::daemon
