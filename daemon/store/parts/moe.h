// MoE expert load (EXPERT_LOAD, protocol 1.1): per layer, the sum of the
// tokens its router sent, its expert count, and max / mean of the layer's
// latest event with a non-zero sum; each such ratio is also observed into
// the series' moe_imbalance histogram. Only with --moe-expert-series
// (RegistryOptions::moe_expert_series) does a layer also keep the tokens
// of each expert: without it nothing exposed needs them. A series has this
// part from its first EXPERT_LOAD; its families show only then.
//
// Memory: the layers are one sorted vector of kLayerBytes each (at most
// twice that with the vector's spare capacity), plus 8 bytes per expert
// and one allocation per layer with per-expert counts. How many layers
// all series hold together is capped by the registry
// (--max-moe-layers, Registry::ReserveMoeLayer()), so this part's memory
// is bounded daemon-wide (docs/metrics.md, "MoE expert load").
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_PARTS_MOE_H_
#define TOKENMETER_DAEMON_STORE_PARTS_MOE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "daemon/store/part.h"

namespace tokenmeter::daemon {

class Histogram;

class MoePart : public Part {
 public:
  static constexpr PartKind kKind = PartKind::kMoe;
  explicit MoePart(EngineSeries& series);

  struct Layer {
    uint64_t routed = 0;        // tokens routed, all experts (saturating)
    double imbalance = 0;       // of the latest non-zero load
    uint32_t index = 0;         // the layer number, below TM_MAX_MOE_LAYERS
    uint16_t expert_count = 0;  // 1..TM_MAX_MOE_EXPERTS, fixed by the first
    bool has_imbalance = false;
    // Tokens per expert (saturating), expert_count of them; null when the
    // part keeps no per-expert counts.
    std::unique_ptr<uint64_t[]> experts;

    std::span<const uint64_t> expert_tokens() const {
      if (experts == nullptr) return {};
      return {experts.get(), expert_count};
    }
  };
  // What one layer costs in the vector (without spare capacity and
  // without its per-expert counts); docs/metrics.md states the bound.
  static constexpr size_t kLayerBytes = 32;

  // Adds one EXPERT_LOAD of `layer`, creating the layer on its first load
  // (the caller has taken its place: Registry::ReserveMoeLayer()); keeps
  // per-expert counts when `per_expert` (--moe-expert-series), dropping or
  // starting them at 0 if the layer had them not or did. False (nothing
  // changed) when the number of counts (1..TM_MAX_MOE_EXPERTS, which the
  // decoder checks) differs from the layer's expert count, which its first
  // event fixed. O(counts + log layers), O(layers) when it creates a layer.
  bool Add(uint32_t layer, std::span<const uint64_t> counts, bool per_expert);
  // The layer `layer`, or nullptr when it has had no EXPERT_LOAD. O(log
  // layers).
  const Layer* FindLayer(uint32_t layer) const;
  bool has_layer(uint32_t layer) const { return FindLayer(layer) != nullptr; }
  // Every layer, by index.
  std::span<const Layer> layers() const { return layers_; }
  // Keeps per-expert counts iff `per_expert` from now on: drops them, or
  // starts them at 0 (a snapshot saved under another --moe-expert-series).
  // O(layers + experts).
  void SetPerExpert(bool per_expert);
  // The layer whose latest load was the least balanced (the summary line),
  // or nullptr when no layer has had a non-zero load. O(layers).
  const Layer* WorstLayer(uint32_t* layer) const;

  PartKind kind() const override { return kKind; }
  bool Shows(const FamilyDef& f, const RegistryOptions& o) const override;
  void Write(const FamilyDef& f, const EngineSeries& s,
             MetricWriter& w) const override;
  // Format 4: per layer its index, expert count, whether per-expert counts
  // follow and then them, routed, imbalance. Formats 1 to 3 (a count and
  // the per-expert counts of every layer) still load.
  void SaveState(StateWriter& w) const override;
  void LoadState(StateReader& r) override;

 private:
  Histogram& imbalance_;       // the series' moe_imbalance
  std::vector<Layer> layers_;  // sorted by index, no two alike
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_PARTS_MOE_H_
