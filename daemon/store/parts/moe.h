// MoE expert load (EXPERT_LOAD, protocol 1.1): per layer, the tokens the
// router sent to each expert, their sum, and max / mean of the layer's
// latest event with a non-zero sum; each such ratio is also observed into
// the series' moe_imbalance histogram. A series has this part from its
// first EXPERT_LOAD; its families show only then.
//
// Memory: 8 bytes per expert of every layer seen, plus about 100 per
// layer (at most TM_MAX_MOE_LAYERS x TM_MAX_MOE_EXPERTS).
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_PARTS_MOE_H_
#define TOKENMETER_DAEMON_STORE_PARTS_MOE_H_

#include <cstdint>
#include <map>
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
    std::vector<uint64_t> experts;  // tokens per expert (saturating)
    uint64_t routed = 0;            // their sum (saturating)
    double imbalance = 0;           // of the latest non-zero load
    bool has_imbalance = false;
  };
  // Adds one EXPERT_LOAD of `layer`; false (nothing changed) when the
  // number of counts differs from the layer's expert count, which its
  // first event fixed. O(counts).
  bool Add(uint32_t layer, std::span<const uint64_t> counts);
  bool has_layer(uint32_t layer) const { return layers_.count(layer) != 0; }
  const std::map<uint32_t, Layer>& layers() const { return layers_; }
  // The layer whose latest load was the least balanced (the summary line),
  // or nullptr when no layer has had a non-zero load. O(layers).
  const Layer* WorstLayer(uint32_t* layer) const;

  PartKind kind() const override { return kKind; }
  bool Shows(const FamilyDef& f, const RegistryOptions& o) const override;
  void Write(const FamilyDef& f, const EngineSeries& s,
             MetricWriter& w) const override;
  void SaveState(StateWriter& w) const override;
  void LoadState(StateReader& r) override;

 private:
  Histogram& imbalance_;  // the series' moe_imbalance
  std::map<uint32_t, Layer> layers_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_PARTS_MOE_H_
