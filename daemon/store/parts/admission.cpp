#include "daemon/store/parts/admission.h"

#include "daemon/store/engine_series.h"
#include "daemon/store/metric_writer.h"
#include "daemon/store/profile.h"

namespace tokenmeter::daemon {

uint64_t AdmissionPart::total() const {
  uint64_t sum = 0;
  reasons_.ForEach([&sum](std::string_view, uint64_t n) {
    if (__builtin_add_overflow(sum, n, &sum)) sum = UINT64_MAX;
  });
  return sum;
}

bool AdmissionPart::Shows(const FamilyDef& f,
                          const RegistryOptions& /*o*/) const {
  return f.part_family == PartFamily::kAdmissionRejections && !reasons_.empty();
}

void AdmissionPart::Write(const FamilyDef& f, const EngineSeries& s,
                          MetricWriter& w) const {
  if (f.part_family != PartFamily::kAdmissionRejections) return;
  const SampleLabels labels{s.label_text(), s.label_pairs(), {}, {}};
  reasons_.ForEach([&](std::string_view reason, uint64_t n) {
    w.Sample(labels.WithOwn("reason", reason), n);
  });
}

}  // namespace tokenmeter::daemon
