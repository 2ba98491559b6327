#include "daemon/store/request_labels.h"

#include "daemon/base/state_io.h"

namespace tokenmeter::daemon {

RequestLabels::RequestLabels(std::vector<std::string> names, size_t max_values,
                             bool last_is_priority)
    : names_(std::move(names)),
      max_values_(max_values),
      last_is_priority_(last_is_priority),
      values_(names_.size(),
              std::vector<std::string>{"", std::string(kOtherValue)}),
      ids_(names_.size()),
      overflow_(names_.size(), 0),
      loras_{""} {
  if (last_is_priority && !values_.empty())
    values_.back()[kEmpty].assign(1, '0');
}

std::optional<uint16_t> RequestLabels::Find(size_t label,
                                            std::string_view value) const {
  if (const std::optional<uint16_t> fixed = FixedId(label, value)) return fixed;
  const auto& ids = ids_[label];
  auto it = ids.find(std::string(value));
  if (it == ids.end()) return std::nullopt;
  return it->second;
}

uint16_t RequestLabels::Intern(size_t label, std::string_view value) {
  if (const std::optional<uint16_t> fixed = FixedId(label, value)) {
    return *fixed;
  }
  std::vector<std::string>& values = values_[label];
  auto [it, inserted] = ids_[label].try_emplace(std::string(value), 0);
  if (!inserted) return it->second;
  if (values.size() >= kMaxValues) {
    ids_[label].erase(it);
    return kOther;
  }
  it->second = uint16_t(values.size());
  values.emplace_back(value);
  return it->second;
}

uint16_t RequestLabels::InternLora(std::string_view name) {
  if (name.empty()) return 0;
  auto [it, inserted] = lora_ids_.try_emplace(std::string(name), 0);
  if (!inserted) return it->second;
  if (loras_.size() > kMaxLoras) {
    lora_ids_.erase(it);
    return 0;
  }
  it->second = uint16_t(loras_.size());
  loras_.emplace_back(name);
  return it->second;
}

uint32_t RequestLabels::InternSet(uint64_t key, uint16_t lora) {
  if (key == 0 && lora == 0) return 0;
  const Set set{key, lora};
  auto it = set_ids_.find(set);
  if (it != set_ids_.end()) return it->second;
  if (sets_.size() >= kMaxSets) return 0;
  const uint32_t id = uint32_t(sets_.size());
  sets_.push_back(set);
  set_ids_.emplace(set, id);
  return id;
}

void RequestLabels::Collect(DaemonMetric id, MetricWriter& w) const {
  if (id != kRequestLabelOverflow) return;
  const SampleLabels none;
  for (size_t i = 0; i < names_.size(); ++i) {
    w.Sample(none.WithOwn("label", names_[i]), overflow_[i]);
  }
}

void RequestLabels::SaveState(StateWriter& w) const {
  for (const std::vector<std::string>& values : values_) {
    w.U64(values.size() - 2);  // after "" and __other__
    for (size_t i = 2; i < values.size(); ++i) w.Str(values[i]);
  }
  w.U64s(overflow_);
  w.U64(loras_.size() - 1);  // after ""
  for (size_t i = 1; i < loras_.size(); ++i) w.Str(loras_[i]);
  w.U64(sets_.size() - 1);  // after (0, 0)
  for (size_t i = 1; i < sets_.size(); ++i) {
    w.U64(sets_[i].key);
    w.U16(sets_[i].lora);
  }
}

void RequestLabels::LoadState(StateReader& r) {
  for (size_t l = 0; l < values_.size(); ++l) {
    const size_t n = r.Count(kMaxValues - 2, 4);
    for (size_t i = 0; i < n && r.ok(); ++i) {
      std::string v = r.Str(TM_MAX_REQUEST_LABEL_VALUE_BYTES);
      // A value this daemon keeps at a fixed id ("", "__other__", "0" of
      // the priority label with --priority-label: a snapshot from before
      // they were folded, or from --request-label priority) would render
      // a second sample with the same labels: not restored (set aside).
      if (FixedId(l, v).has_value() ||
          !ids_[l].emplace(v, uint16_t(values_[l].size())).second)
        r.Fail();
      values_[l].push_back(std::move(v));
    }
  }
  std::vector<uint64_t> overflow;
  r.U64s(overflow_.size(), &overflow);
  if (overflow.size() != overflow_.size()) r.Fail();
  if (r.ok()) overflow_ = std::move(overflow);
  const size_t loras = r.Count(kMaxLoras, 4);
  for (size_t i = 0; i < loras && r.ok(); ++i) {
    std::string name = r.Str(TM_MAX_LORA_BYTES);
    if (name.empty() ||
        !lora_ids_.emplace(name, uint16_t(loras_.size())).second)
      r.Fail();
    loras_.push_back(std::move(name));
  }
  const size_t sets = r.Count(kMaxSets - 1, 10);
  for (size_t i = 0; i < sets && r.ok(); ++i) {
    const Set set{r.U64(), r.U16()};
    if (set.lora >= loras_.size()) r.Fail();
    for (size_t l = 0; l < values_.size(); ++l) {
      if (Unpack(set.key, l) >= values_[l].size()) r.Fail();
    }
    if (!set_ids_.emplace(set, uint32_t(sets_.size())).second) r.Fail();
    sets_.push_back(set);
  }
}

}  // namespace tokenmeter::daemon
