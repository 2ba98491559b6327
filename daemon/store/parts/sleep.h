// Sleep mode (SLEEP, protocol 1.2; vLLM's sleep/wake, SGLang's memory
// release): the state of the engine's scheduler, weights and KV cache, each
// set by the latest SLEEP that names it. A series has this part from its
// first SLEEP (an engine that never sends one is awake and shows no sleep
// series).
//
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_PARTS_SLEEP_H_
#define TOKENMETER_DAEMON_STORE_PARTS_SLEEP_H_

#include <array>
#include <cstdint>
#include <string_view>

#include "daemon/store/part.h"

namespace tokenmeter::daemon {

class SleepPart : public Part {
 public:
  static constexpr PartKind kKind = PartKind::kSleep;
  // Resources and their states, in exposition order; a resource's state is
  // an index into its names (the decoder's SchedulerState, WeightsState and
  // KvCacheState values).
  enum Resource : uint8_t { kScheduler, kWeights, kKvCache, kNumResources };
  static constexpr std::array<std::string_view, kNumResources> kResourceNames =
      {"scheduler", "weights", "kv_cache"};
  static constexpr std::array<std::array<std::string_view, 3>, kNumResources>
      kStateNames = {{{"running", "paused", ""},
                      {"resident", "offloaded", "discarded"},
                      {"resident", "released", ""}}};
  explicit SleepPart(const EngineSeries& /*series*/) {}

  // One SLEEP: each resource to its state (an index of kStateNames[r]; a
  // negative one keeps the current state); counts a transition when a
  // state changed. O(1).
  void Apply(int scheduler, int weights, int kv_cache);
  uint8_t state(Resource r) const { return state_[r]; }
  // Scheduler running, weights and KV cache resident.
  bool fully_awake() const {
    return state_[kScheduler] == 0 && state_[kWeights] == 0 &&
           state_[kKvCache] == 0;
  }
  uint64_t transitions() const { return transitions_; }

  PartKind kind() const override { return kKind; }
  bool Shows(const FamilyDef& f, const RegistryOptions& o) const override;
  void Write(const FamilyDef& f, const EngineSeries& s,
             MetricWriter& w) const override;
  void SaveState(StateWriter& w) const override;
  void LoadState(StateReader& r) override;

 private:
  std::array<uint8_t, kNumResources> state_{};  // awake
  uint64_t transitions_ = 0;  // SLEEP events that changed a state
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_PARTS_SLEEP_H_
