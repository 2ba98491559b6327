// Admission rejections (ADMISSION_REJECTED, protocol 1.2): the requests the
// server refused before they entered the engine, by reason (at most 16
// reasons per series, then __other__: ReasonCounts). A series has this
// part from its first ADMISSION_REJECTED; its family shows only then.
//
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_PARTS_ADMISSION_H_
#define TOKENMETER_DAEMON_STORE_PARTS_ADMISSION_H_

#include <cstdint>
#include <string_view>

#include "daemon/store/part.h"
#include "daemon/store/parts/reason_counts.h"

namespace tokenmeter::daemon {

class AdmissionPart : public Part {
 public:
  static constexpr PartKind kKind = PartKind::kAdmission;
  explicit AdmissionPart(const EngineSeries& /*series*/) {}

  // One rejection for `reason` (label-value syntax). O(16).
  void Reject(std::string_view reason) { reasons_.Add(reason); }
  const ReasonCounts& reasons() const { return reasons_; }
  // Every rejection, all reasons (the summary line and the live page).
  uint64_t total() const;

  PartKind kind() const override { return kKind; }
  bool Shows(const FamilyDef& f, const RegistryOptions& o) const override;
  void Write(const FamilyDef& f, const EngineSeries& s,
             MetricWriter& w) const override;
  void SaveState(StateWriter& w) const override { reasons_.SaveState(w); }
  void LoadState(StateReader& r) override { reasons_.LoadState(r); }

 private:
  ReasonCounts reasons_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_PARTS_ADMISSION_H_
