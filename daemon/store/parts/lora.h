// The LoRA sets of a series (vLLM's lora_requests_info): the max_lora its
// latest HELLO sent, the adapters of the requests waiting and running on
// the series, and the wall time of the last change of either set. Every
// series has this part (its family shows one sample per series), made
// with the series.
//
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_PARTS_LORA_H_
#define TOKENMETER_DAEMON_STORE_PARTS_LORA_H_

#include <array>
#include <cstdint>
#include <map>
#include <string>

#include "daemon/store/part.h"

namespace tokenmeter::daemon {

class RequestLabels;

class LoraPart : public Part {
 public:
  static constexpr PartKind kKind = PartKind::kLora;
  explicit LoraPart(const EngineSeries& series);

  // The max_lora label (the latest HELLO's; "0" when none sent one).
  void SetMaxLora(int64_t max_lora);
  const std::string& max_lora() const { return max_lora_; }
  // A request with adapter `lora` (RequestLabels::InternLora(); 0: none, a
  // no-op) joins (delta 1) or leaves (-1) the running or waiting set;
  // `unix_s`, the wall time of the call, becomes the time of the last
  // change when a set changes. O(log adapters in use).
  void Add(uint16_t lora, bool running, int delta, double unix_s);
  // Adapter names of the running (or waiting) set, sorted, joined by ",".
  std::string Set(bool running) const;
  double changed_unix_s() const { return changed_unix_s_; }
  // Sets the time of the last change if none is set yet (the series' first
  // HELLO: the sets start empty then).
  void InitTime(double unix_s) {
    if (changed_unix_s_ == 0) changed_unix_s_ = unix_s;
  }

  PartKind kind() const override { return kKind; }
  bool Shows(const FamilyDef& f, const RegistryOptions& o) const override;
  void Write(const FamilyDef& f, const EngineSeries& s,
             MetricWriter& w) const override;
  void SaveState(StateWriter& w) const override;
  void LoadState(StateReader& r) override;
  // Snapshot formats 1 and 2 kept max_lora and the sets apart (the MoE
  // layers between them): LoadState() is these two in a row.
  void LoadMaxLora(StateReader& r);
  void LoadSets(StateReader& r);

 private:
  const RequestLabels& labels_;
  std::string max_lora_ = "0";
  // adapter id -> (waiting, running) request counts, for adapters in use.
  std::map<uint16_t, std::array<int64_t, 2>> sets_;
  double changed_unix_s_ = 0;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_PARTS_LORA_H_
