#include "daemon/store/request_labels.h"

namespace tokenmeter::daemon {

RequestLabels::RequestLabels(std::vector<std::string> names, size_t max_values)
    : names_(std::move(names)),
      max_values_(max_values),
      values_(names_.size(), std::vector<std::string>{"", "__other__"}),
      ids_(names_.size()),
      overflow_(names_.size(), 0),
      loras_{""} {}

std::optional<uint16_t> RequestLabels::Find(size_t label,
                                            std::string_view value) const {
  if (value.empty()) return kEmpty;
  const auto& ids = ids_[label];
  auto it = ids.find(std::string(value));
  if (it == ids.end()) return std::nullopt;
  return it->second;
}

uint16_t RequestLabels::Intern(size_t label, std::string_view value) {
  if (value.empty()) return kEmpty;
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

}  // namespace tokenmeter::daemon
