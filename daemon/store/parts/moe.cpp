#include "daemon/store/parts/moe.h"

#include <algorithm>
#include <string>

#include "daemon/base/state_io.h"
#include "daemon/base/text_format.h"
#include "daemon/store/engine_series.h"
#include "daemon/store/metric_writer.h"
#include "daemon/store/profile.h"
#include "daemon/store/registry.h"
#include "tokenmeter/protocol.h"

namespace tokenmeter::daemon {

MoePart::MoePart(EngineSeries& series)
    : imbalance_(series.hist(kMoeImbalance)) {}

bool MoePart::Add(uint32_t layer, std::span<const uint64_t> counts) {
  auto [it, created] = layers_.try_emplace(layer);
  Layer& l = it->second;
  const size_t n = counts.size();
  if (created) {
    l.experts.assign(n, 0);
  } else if (l.experts.size() != n) {
    return false;
  }
  uint64_t sum = 0, max = 0;
  for (size_t i = 0; i < n; ++i) {
    if (__builtin_add_overflow(l.experts[i], counts[i], &l.experts[i])) {
      l.experts[i] = UINT64_MAX;
    }
    sum += counts[i];  // at most 1024 x (2^32 - 1): no overflow
    max = std::max(max, counts[i]);
  }
  if (__builtin_add_overflow(l.routed, sum, &l.routed)) l.routed = UINT64_MAX;
  if (sum > 0) {
    l.imbalance = double(max) * double(n) / double(sum);
    l.has_imbalance = true;
    imbalance_.Observe(l.imbalance);
  }
  return true;
}

const MoePart::Layer* MoePart::WorstLayer(uint32_t* layer) const {
  const Layer* worst = nullptr;
  for (const auto& [index, l] : layers_) {
    if (l.has_imbalance &&
        (worst == nullptr || l.imbalance > worst->imbalance)) {
      worst = &l;
      *layer = index;
    }
  }
  return worst;
}

bool MoePart::Shows(const FamilyDef& f, const RegistryOptions& o) const {
  if (layers_.empty()) return false;
  switch (f.part_family) {
    case PartFamily::kMoeRoutedTokens:
    case PartFamily::kMoeLayerImbalance:
      return true;
    case PartFamily::kMoeExpertTokens:
      return o.moe_expert_series;
    default:
      return false;
  }
}

void MoePart::Write(const FamilyDef& f, const EngineSeries& s,
                    MetricWriter& w) const {
  std::string layer, expert, text;
  LabelPairs pairs;
  const SampleLabels labels{s.label_text(), s.label_pairs(), {}, {}};
  for (const auto& [index, l] : layers_) {
    layer.clear();
    AppendUint(layer, index);
    switch (f.part_family) {
      case PartFamily::kMoeRoutedTokens:
        w.Sample(labels.WithOwn("layer", layer), l.routed);
        break;
      case PartFamily::kMoeLayerImbalance:
        if (l.has_imbalance) {
          w.Sample(labels.WithOwn("layer", layer), l.imbalance);
        }
        break;
      case PartFamily::kMoeExpertTokens:
        // Two labels of the daemon's: the layer goes into the series'
        // labels, the expert is the own label.
        text = s.label_text();
        AppendLabel(text, "layer", layer);
        pairs = s.label_pairs();
        pairs.emplace_back("layer", layer);
        for (size_t e = 0; e < l.experts.size(); ++e) {
          expert.clear();
          AppendUint(expert, e);
          w.Sample(SampleLabels{text, pairs, "expert", expert}, l.experts[e]);
        }
        break;
      default:
        break;
    }
  }
}

void MoePart::SaveState(StateWriter& w) const {
  w.U64(layers_.size());
  for (const auto& [index, l] : layers_) {
    w.U32(index);
    w.U64(l.experts.size());
    for (uint64_t x : l.experts) w.U64(x);
    w.U64(l.routed);
    w.F64(l.imbalance);
    w.Bool(l.has_imbalance);
  }
}

void MoePart::LoadState(StateReader& r) {
  const size_t n = r.Count(TM_MAX_MOE_LAYERS, 29);
  for (size_t i = 0; i < n && r.ok(); ++i) {
    Layer& l = layers_[r.U32()];
    l.experts.assign(r.Count(TM_MAX_MOE_EXPERTS, 8), 0);
    for (uint64_t& x : l.experts) x = r.U64();
    l.routed = r.U64();
    l.imbalance = r.F64();
    l.has_imbalance = r.Bool();
  }
}

}  // namespace tokenmeter::daemon
