// KV-cache transfers of disaggregated prefill/decode (KV_TRANSFER,
// protocol 1.2), per role (send: the prefill side; recv: the decode side):
// the time of every transfer (t - start, failed ones too), its bytes when
// given, and the failures by reason (at most 16 reasons per role, then
// __other__: ReasonCounts). The histograms have the series' layouts of the
// catalog's kKvTransferTime and kKvTransferBytes (its profile's buckets).
// A series has this part from its first KV_TRANSFER; each family shows
// once it has a sample, each role once it has a transfer.
//
// Memory: four histograms and the reasons; one per series that sent one.
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_PARTS_KV_TRANSFER_H_
#define TOKENMETER_DAEMON_STORE_PARTS_KV_TRANSFER_H_

#include <array>
#include <cstdint>
#include <string_view>
#include <utility>

#include "daemon/store/histogram.h"
#include "daemon/store/part.h"
#include "daemon/store/parts/reason_counts.h"

namespace tokenmeter::daemon {

class KvTransferPart : public Part {
 public:
  static constexpr PartKind kKind = PartKind::kKvTransfer;
  // The role label's values, indexed by role (0 send, 1 recv: the
  // decoder's KvRole).
  static constexpr std::array<std::string_view, 2> kRoleNames = {"send",
                                                                 "recv"};
  // SGLang's kv_transfer_timeouts_total: its `stage` values, each with the
  // failure reason it counts.
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 2>
      kTimeoutStages = {
          {{"bootstrap", "bootstrap_timeout"}, {"transfer", "timeout"}}};
  explicit KvTransferPart(const EngineSeries& series);

  // One transfer of `role` (< 2) that took `time_ns`, moved `bytes` (when
  // has_bytes) and failed with `reason` unless `ok` (empty reason: "error").
  // O(buckets + 16).
  void Add(size_t role, uint64_t time_ns, bool has_bytes, uint64_t bytes,
           bool ok, std::string_view reason);

  const Histogram& time(size_t role) const { return time_[role]; }
  const Histogram& bytes(size_t role) const { return bytes_[role]; }
  const ReasonCounts& failures(size_t role) const { return failures_[role]; }

  PartKind kind() const override { return kKind; }
  bool Shows(const FamilyDef& f, const RegistryOptions& o) const override;
  void Write(const FamilyDef& f, const EngineSeries& s,
             MetricWriter& w) const override;
  void SaveState(StateWriter& w) const override;
  void LoadState(StateReader& r) override;

 private:
  std::array<Histogram, 2> time_;
  std::array<Histogram, 2> bytes_;
  std::array<ReasonCounts, 2> failures_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_PARTS_KV_TRANSFER_H_
