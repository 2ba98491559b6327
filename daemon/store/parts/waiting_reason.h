// Why requests wait (STEP waiting_deferred, protocol 1.2): of the STEP's
// `waiting`, those waiting for capacity and those deferred for something
// else (a LoRA slot, a KV transfer in flight, a grammar compile). A series
// has this part from its first STEP with waiting_deferred; from then on
// every STEP with `waiting` sets both (a STEP without waiting_deferred
// then counts every waiting request as capacity).
//
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_PARTS_WAITING_REASON_H_
#define TOKENMETER_DAEMON_STORE_PARTS_WAITING_REASON_H_

#include <cstdint>

#include "daemon/store/part.h"

namespace tokenmeter::daemon {

class WaitingReasonPart : public Part {
 public:
  static constexpr PartKind kKind = PartKind::kWaitingReason;
  explicit WaitingReasonPart(const EngineSeries& /*series*/) {}

  // `deferred` <= `waiting` (the decoder checks it). O(1).
  void Set(uint64_t waiting, uint64_t deferred) {
    capacity_ = waiting - deferred;
    deferred_ = deferred;
  }
  uint64_t capacity() const { return capacity_; }
  uint64_t deferred() const { return deferred_; }

  PartKind kind() const override { return kKind; }
  bool Shows(const FamilyDef& f, const RegistryOptions& o) const override;
  void Write(const FamilyDef& f, const EngineSeries& s,
             MetricWriter& w) const override;
  void SaveState(StateWriter& w) const override;
  void LoadState(StateReader& r) override;

 private:
  uint64_t capacity_ = 0;
  uint64_t deferred_ = 0;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_PARTS_WAITING_REASON_H_
