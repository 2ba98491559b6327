#include "daemon/store/parts/kv_transfer.h"

#include <string>

#include "daemon/base/state_io.h"
#include "daemon/base/text_format.h"
#include "daemon/store/engine_series.h"
#include "daemon/store/metric_writer.h"
#include "daemon/store/profile.h"

namespace tokenmeter::daemon {
namespace {

const HistogramLayout& LayoutOf(const EngineSeries& s, EngineMetric m) {
  return s.layouts()[size_t(m - kFirstHistogram)];
}

}  // namespace

KvTransferPart::KvTransferPart(const EngineSeries& series)
    : time_{Histogram(&LayoutOf(series, kKvTransferTime)),
            Histogram(&LayoutOf(series, kKvTransferTime))},
      bytes_{Histogram(&LayoutOf(series, kKvTransferBytes)),
             Histogram(&LayoutOf(series, kKvTransferBytes))} {}

void KvTransferPart::Add(size_t role, uint64_t time_ns, bool has_bytes,
                         uint64_t bytes, bool ok, std::string_view reason) {
  time_[role].Observe(double(time_ns));
  if (has_bytes) bytes_[role].Observe(double(bytes));
  if (!ok) failures_[role].Add(reason.empty() ? "error" : reason);
}

bool KvTransferPart::Shows(const FamilyDef& f,
                           const RegistryOptions& /*o*/) const {
  switch (f.part_family) {
    case PartFamily::kKvTransferTime:
      return time_[0].count() + time_[1].count() > 0;
    case PartFamily::kKvTransferBytes:
      return bytes_[0].count() + bytes_[1].count() > 0;
    case PartFamily::kKvTransferFailures:
      return !failures_[0].empty() || !failures_[1].empty();
    case PartFamily::kKvTransferFailedTotal:
    case PartFamily::kKvTransferTimeouts:
      return true;  // 0 until the first failure, as SGLang's counters
    default:
      return false;
  }
}

void KvTransferPart::Write(const FamilyDef& f, const EngineSeries& s,
                           MetricWriter& w) const {
  const SampleLabels labels{s.label_text(), s.label_pairs(), {}, {}};
  // The failures of both roles with reason `only` (every failure for an
  // empty one).
  const auto failures = [this](std::string_view only) {
    uint64_t sum = 0;
    for (const ReasonCounts& c : failures_) {
      c.ForEach([&](std::string_view reason, uint64_t n) {
        if (!only.empty() && reason != only) return;
        if (__builtin_add_overflow(sum, n, &sum)) sum = UINT64_MAX;
      });
    }
    return sum;
  };
  if (f.part_family == PartFamily::kKvTransferFailedTotal) {
    w.Sample(labels, failures({}));
    return;
  }
  if (f.part_family == PartFamily::kKvTransferTimeouts) {
    // SGLang's stages, both from the start: a failure with reason
    // "bootstrap_timeout" (the handshake before the transfer) and one with
    // reason "timeout" (the transfer).
    for (const auto& [stage, reason] : kTimeoutStages) {
      w.Sample(labels.WithOwn(f.const_label, stage), failures(reason));
    }
    return;
  }
  for (size_t role = 0; role < kRoleNames.size(); ++role) {
    // The role goes into the series' labels: a histogram's own label is
    // its `le`, the failures' is the reason.
    std::string text = s.label_text();
    AppendLabel(text, "role", kRoleNames[role]);
    LabelPairs pairs = s.label_pairs();
    pairs.emplace_back("role", kRoleNames[role]);
    const SampleLabels with_role{text, pairs, {}, {}};
    switch (f.part_family) {
      case PartFamily::kKvTransferTime:
        if (time_[role].count() > 0) w.HistogramSample(with_role, time_[role]);
        break;
      case PartFamily::kKvTransferBytes:
        if (bytes_[role].count() > 0) {
          w.HistogramSample(with_role, bytes_[role]);
        }
        break;
      case PartFamily::kKvTransferFailures:
        failures_[role].ForEach([&](std::string_view reason, uint64_t n) {
          w.Sample(with_role.WithOwn("reason", reason), n);
        });
        break;
      default:
        return;
    }
  }
}

void KvTransferPart::SaveState(StateWriter& w) const {
  for (size_t role = 0; role < kRoleNames.size(); ++role) {
    time_[role].SaveState(w);
    bytes_[role].SaveState(w);
    failures_[role].SaveState(w);
  }
}

void KvTransferPart::LoadState(StateReader& r) {
  for (size_t role = 0; role < kRoleNames.size(); ++role) {
    time_[role].LoadState(r);
    bytes_[role].LoadState(r);
    failures_[role].LoadState(r);
  }
}

}  // namespace tokenmeter::daemon
