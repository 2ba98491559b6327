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

static_assert(sizeof(MoePart::Layer) <= MoePart::kLayerBytes);

namespace {

std::unique_ptr<uint64_t[]> ZeroCounts(size_t n) {
  return std::make_unique<uint64_t[]>(n);  // value-initialised: zeros
}

}  // namespace

const MoePart::Layer* MoePart::FindLayer(uint32_t layer) const {
  auto it = std::lower_bound(
      layers_.begin(), layers_.end(), layer,
      [](const Layer& l, uint32_t index) { return l.index < index; });
  return it != layers_.end() && it->index == layer ? &*it : nullptr;
}

bool MoePart::Add(uint32_t layer, std::span<const uint64_t> counts,
                  bool per_expert) {
  const size_t n = counts.size();
  auto it = std::lower_bound(
      layers_.begin(), layers_.end(), layer,
      [](const Layer& l, uint32_t index) { return l.index < index; });
  if (it == layers_.end() || it->index != layer) {
    it = layers_.insert(it, Layer{});
    it->index = layer;
    it->expert_count = uint16_t(n);
  } else if (it->expert_count != n) {
    return false;
  }
  Layer& l = *it;
  if (per_expert != (l.experts != nullptr)) {
    l.experts = per_expert ? ZeroCounts(n) : nullptr;
  }
  uint64_t sum = 0, max = 0;
  if (uint64_t* experts = l.experts.get()) {
    for (size_t i = 0; i < n; ++i) {
      if (__builtin_add_overflow(experts[i], counts[i], &experts[i])) {
        experts[i] = UINT64_MAX;
      }
      sum += counts[i];  // at most 1024 x (2^32 - 1): no overflow
      max = std::max(max, counts[i]);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      sum += counts[i];
      max = std::max(max, counts[i]);
    }
  }
  if (__builtin_add_overflow(l.routed, sum, &l.routed)) l.routed = UINT64_MAX;
  if (sum > 0) {
    l.imbalance = double(max) * double(n) / double(sum);
    l.has_imbalance = true;
    imbalance_.Observe(l.imbalance);
  }
  return true;
}

void MoePart::SetPerExpert(bool per_expert) {
  for (Layer& l : layers_) {
    if (per_expert != (l.experts != nullptr)) {
      l.experts = per_expert ? ZeroCounts(l.expert_count) : nullptr;
    }
  }
}

const MoePart::Layer* MoePart::WorstLayer(uint32_t* layer) const {
  const Layer* worst = nullptr;
  for (const Layer& l : layers_) {
    if (l.has_imbalance &&
        (worst == nullptr || l.imbalance > worst->imbalance)) {
      worst = &l;
      *layer = l.index;
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
  for (const Layer& l : layers_) {
    layer.clear();
    AppendUint(layer, l.index);
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
        // Every expert of a known layer has a series (0 until it gets
        // tokens), also before SetPerExpert() gave it counts.
        for (size_t e = 0; e < l.expert_count; ++e) {
          expert.clear();
          AppendUint(expert, e);
          w.Sample(SampleLabels{text, pairs, "expert", expert},
                   l.experts != nullptr ? l.experts[e] : uint64_t{0});
        }
        break;
      default:
        break;
    }
  }
}

void MoePart::SaveState(StateWriter& w) const {
  w.U64(layers_.size());
  for (const Layer& l : layers_) {
    w.U32(l.index);
    w.U32(l.expert_count);
    w.Bool(l.experts != nullptr);
    for (uint64_t x : l.expert_tokens()) w.U64(x);
    w.U64(l.routed);
    w.F64(l.imbalance);
    w.Bool(l.has_imbalance);
  }
}

void MoePart::LoadState(StateReader& r) {
  // Format 4 layer: u32 index, u32 experts, bool, u64 routed, f64, bool.
  // Formats 1 to 3: u32 index, u64 experts and their counts, u64, f64, bool.
  const bool old = r.version() < 4;
  const size_t n = r.Count(TM_MAX_MOE_LAYERS, old ? 29 : 26);
  layers_.clear();
  layers_.reserve(n);
  for (size_t i = 0; i < n && r.ok(); ++i) {
    Layer l;
    l.index = r.U32();
    const size_t experts =
        old ? r.Count(TM_MAX_MOE_EXPERTS, 8) : size_t(r.U32());
    const bool has_counts = old || r.Bool();
    // Indexes as the decoder lets them in, each once, in order (the layout
    // Add() keeps); an expert count as the first EXPERT_LOAD fixes it.
    if (l.index >= TM_MAX_MOE_LAYERS || experts == 0 ||
        experts > TM_MAX_MOE_EXPERTS ||
        (!layers_.empty() && l.index <= layers_.back().index)) {
      r.Fail();
      break;
    }
    l.expert_count = uint16_t(experts);
    if (has_counts) {
      l.experts = ZeroCounts(experts);
      for (size_t e = 0; e < experts; ++e) l.experts[e] = r.U64();
    }
    l.routed = r.U64();
    l.imbalance = r.F64();
    l.has_imbalance = r.Bool();
    layers_.push_back(std::move(l));
  }
}

}  // namespace tokenmeter::daemon
