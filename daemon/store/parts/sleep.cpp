#include "daemon/store/parts/sleep.h"

#include <string>

#include "daemon/base/state_io.h"
#include "daemon/base/text_format.h"
#include "daemon/store/engine_series.h"
#include "daemon/store/metric_writer.h"
#include "daemon/store/profile.h"

namespace tokenmeter::daemon {
namespace {

size_t StateCount(SleepPart::Resource r) {
  return r == SleepPart::kWeights ? 3 : 2;
}

}  // namespace

void SleepPart::Apply(int scheduler, int weights, int kv_cache) {
  const std::array<int, kNumResources> states = {scheduler, weights, kv_cache};
  bool changed = false;
  for (size_t r = 0; r < kNumResources; ++r) {
    const int st = states[r];
    if (st < 0 || size_t(st) >= StateCount(Resource(r))) continue;
    changed = changed || state_[r] != st;
    state_[r] = uint8_t(st);
  }
  if (changed) ++transitions_;
}

bool SleepPart::Shows(const FamilyDef& f, const RegistryOptions& /*o*/) const {
  return f.part_family == PartFamily::kSleepState ||
         f.part_family == PartFamily::kSleepResourceState ||
         f.part_family == PartFamily::kFullyAwake;
}

void SleepPart::Write(const FamilyDef& f, const EngineSeries& s,
                      MetricWriter& w) const {
  const SampleLabels labels{s.label_text(), s.label_pairs(), {}, {}};
  switch (f.part_family) {
    case PartFamily::kSleepState: {
      // vLLM's legacy gauge: one of awake, weights_offloaded, discard_all,
      // or none of them (e.g. only the KV cache released).
      w.Sample(labels.WithOwn("sleep_state", "awake"),
               fully_awake() ? 1.0 : 0.0);
      w.Sample(labels.WithOwn("sleep_state", "weights_offloaded"),
               state_[kWeights] == 1 ? 1.0 : 0.0);
      w.Sample(labels.WithOwn("sleep_state", "discard_all"),
               state_[kWeights] == 2 ? 1.0 : 0.0);
      return;
    }
    case PartFamily::kSleepResourceState: {
      // Two labels of the daemon's: the resource goes into the series'
      // labels, the state is the own label.
      for (size_t r = 0; r < kNumResources; ++r) {
        std::string text = s.label_text();
        AppendLabel(text, "resource", kResourceNames[r]);
        LabelPairs pairs = s.label_pairs();
        pairs.emplace_back("resource", kResourceNames[r]);
        const SampleLabels with{text, pairs, {}, {}};
        for (size_t st = 0; st < StateCount(Resource(r)); ++st) {
          w.Sample(with.WithOwn("state", kStateNames[r][st]),
                   state_[r] == st ? 1.0 : 0.0);
        }
      }
      return;
    }
    case PartFamily::kFullyAwake:
      w.Sample(labels, fully_awake() ? 1.0 : 0.0);
      return;
    default:
      return;
  }
}

void SleepPart::SaveState(StateWriter& w) const {
  for (uint8_t st : state_) w.U8(st);
  w.U64(transitions_);
}

void SleepPart::LoadState(StateReader& r) {
  for (size_t i = 0; i < kNumResources; ++i) {
    state_[i] = r.U8();
    if (state_[i] >= StateCount(Resource(i))) r.Fail();
  }
  transitions_ = r.U64();
}

}  // namespace tokenmeter::daemon
