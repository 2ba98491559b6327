#include "daemon/store/parts/lora.h"

#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/base/state_io.h"
#include "daemon/base/text_format.h"
#include "daemon/store/engine_series.h"
#include "daemon/store/metric_writer.h"
#include "daemon/store/profile.h"
#include "daemon/store/request_labels.h"

namespace tokenmeter::daemon {

LoraPart::LoraPart(const EngineSeries& series)
    : labels_(series.request_labels()) {}

void LoraPart::SetMaxLora(int64_t max_lora) {
  max_lora_ = std::to_string(max_lora);
}

void LoraPart::Add(uint16_t lora, bool running, int delta, double unix_s) {
  if (lora == 0) return;
  std::array<int64_t, 2>& counts = sets_[lora];
  const int64_t before = counts[running];
  counts[running] += delta;
  if ((before > 0) != (counts[running] > 0)) changed_unix_s_ = unix_s;
  if (counts[0] <= 0 && counts[1] <= 0) sets_.erase(lora);
}

std::string LoraPart::Set(bool running) const {
  std::vector<std::string_view> names;
  for (const auto& [id, counts] : sets_) {
    if (counts[running] > 0) names.push_back(labels_.LoraName(id));
  }
  std::sort(names.begin(), names.end());
  std::string out;
  for (std::string_view n : names) {
    if (!out.empty()) out += ',';
    out += n;
  }
  return out;
}

bool LoraPart::Shows(const FamilyDef& f, const RegistryOptions& /*o*/) const {
  return f.part_family == PartFamily::kLoraRequestsInfo;
}

void LoraPart::Write(const FamilyDef& f, const EngineSeries& s,
                     MetricWriter& w) const {
  if (f.part_family != PartFamily::kLoraRequestsInfo) return;
  // Three labels of the daemon's after the series': built per render (one
  // sample per series).
  const std::string running = Set(true);
  const std::string waiting = Set(false);
  std::string text = s.label_text();
  LabelPairs pairs = s.label_pairs();
  const std::pair<std::string_view, const std::string*> own[] = {
      {"max_lora", &max_lora_},
      {"running_lora_adapters", &running},
      {"waiting_lora_adapters", &waiting}};
  for (const auto& [name, value] : own) {
    AppendLabel(text, name, *value);
    pairs.emplace_back(name, *value);
  }
  w.Sample(SampleLabels{text, pairs, {}, {}}, changed_unix_s_);
}

void LoraPart::SaveState(StateWriter& w) const {
  w.Str(max_lora_);
  w.U64(sets_.size());
  for (const auto& [id, counts] : sets_) {
    w.U16(id);
    w.I64(counts[0]);
    w.I64(counts[1]);
  }
  w.F64(changed_unix_s_);
}

void LoraPart::LoadState(StateReader& r) {
  LoadMaxLora(r);
  LoadSets(r);
}

void LoraPart::LoadMaxLora(StateReader& r) { max_lora_ = r.Str(64); }

void LoraPart::LoadSets(StateReader& r) {
  const size_t n = r.Count(RequestLabels::kMaxLoras, 18);
  for (size_t i = 0; i < n && r.ok(); ++i) {
    const uint16_t id = r.U16();
    if (id == 0 || id >= labels_.lora_count()) r.Fail();
    std::array<int64_t, 2>& counts = sets_[id];
    counts[0] = r.I64();
    counts[1] = r.I64();
  }
  changed_unix_s_ = r.F64();
}

}  // namespace tokenmeter::daemon
