#include "daemon/store/parts/waiting_reason.h"

#include "daemon/base/state_io.h"
#include "daemon/store/engine_series.h"
#include "daemon/store/metric_writer.h"
#include "daemon/store/profile.h"

namespace tokenmeter::daemon {

bool WaitingReasonPart::Shows(const FamilyDef& f,
                              const RegistryOptions& /*o*/) const {
  return f.part_family == PartFamily::kWaitingByReason;
}

void WaitingReasonPart::Write(const FamilyDef& f, const EngineSeries& s,
                              MetricWriter& w) const {
  if (f.part_family != PartFamily::kWaitingByReason) return;
  const SampleLabels labels{s.label_text(), s.label_pairs(), {}, {}};
  w.Sample(labels.WithOwn("reason", "capacity"), double(capacity_));
  w.Sample(labels.WithOwn("reason", "deferred"), double(deferred_));
}

void WaitingReasonPart::SaveState(StateWriter& w) const {
  w.U64(capacity_);
  w.U64(deferred_);
}

void WaitingReasonPart::LoadState(StateReader& r) {
  capacity_ = r.U64();
  deferred_ = r.U64();
}

}  // namespace tokenmeter::daemon
