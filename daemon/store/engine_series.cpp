#include "daemon/store/engine_series.h"

#include "daemon/base/text_format.h"
#include "daemon/store/request_labels.h"

namespace tokenmeter::daemon {

SeriesIdentity SeriesIdentity::Canonical() const {
  SeriesIdentity c = *this;
  std::sort(c.labels.begin(), c.labels.end());
  return c;
}

std::string SanitizeNamespace(std::string_view engine) {
  std::string ns(engine);
  for (char& c : ns) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_';
    if (!ok) c = '_';
  }
  return ns;
}

namespace {

void AppendLabel(std::string& text, std::string_view name,
                 std::string_view value) {
  if (!text.empty()) text += ',';
  text += name;
  text += "=\"";
  AppendEscaped(text, value);
  text += '"';
}

}  // namespace

SeriesValues::SeriesValues(const std::vector<HistogramLayout>& layouts) {
  for (const EngineMetricDef& def : kEngineMetrics) {
    const size_t fixed = FixedLabelValues(def.id).size();
    if (fixed > 0) children_[def.id].assign(fixed, 0);
  }
  hists_.reserve(layouts.size());
  for (const HistogramLayout& layout : layouts) hists_.emplace_back(&layout);
}

EngineSeries::EngineSeries(SeriesIdentity identity,
                           const LabelPairs& label_order,
                           const std::vector<HistogramLayout>& layouts,
                           RequestLabels& request_labels)
    : SeriesValues(layouts),
      identity_(std::move(identity)),
      request_labels_(request_labels),
      layouts_(layouts),
      admitted_(request_labels.names().size()),
      request_labels_off_(!request_labels.enabled()) {
  for (const EngineMetricDef& def : kEngineMetrics) {
    uses_[def.id] = ProfileUses(identity_.profile, def.id);
  }
  tpot_shares_itl_ = hist(kTimePerOutputTokenChunk).layout().bounds() ==
                         hist(kInterTokenLatency).layout().bounds() &&
                     hist(kTimePerOutputTokenChunk).layout().divisor() ==
                         hist(kInterTokenLatency).layout().divisor();
  label_pairs_.reserve(label_order.size() + 2);
  label_pairs_.emplace_back("model_name", identity_.model);
  label_pairs_.emplace_back("engine", identity_.instance);
  label_pairs_.insert(label_pairs_.end(), label_order.begin(),
                      label_order.end());
  for (const auto& [name, value] : label_pairs_) {
    AppendLabel(label_text_, name, value);
  }
  LabelCell base = MakeCell(0);
  base_label_text_ = std::move(base.label_text);
  base_label_pairs_ = std::move(base.label_pairs);
  cache_config_text_ = label_text_;
  cache_config_pairs_ = label_pairs_;
  lora_changed_unix_s_ = 0;
}

LabelCell EngineSeries::MakeCell(LabelKey key) {
  LabelCell cell;
  cell.key = key;
  cell.label_text = label_text_;
  cell.label_pairs = label_pairs_;
  const std::vector<std::string>& names = request_labels_.names();
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string_view value =
        request_labels_.Value(i, RequestLabels::Unpack(key, i));
    AppendLabel(cell.label_text, names[i], value);
    cell.label_pairs.emplace_back(names[i], value);
  }
  return cell;
}

bool EngineSeries::Admit(size_t label, uint16_t id) {
  if (id == RequestLabels::kEmpty || id == RequestLabels::kOther) return true;
  std::vector<uint16_t>& admitted = admitted_[label];
  if (std::find(admitted.begin(), admitted.end(), id) != admitted.end()) {
    return true;
  }
  if (admitted.size() >= request_labels_.max_values()) return false;
  admitted.push_back(id);
  return true;
}

bool EngineSeries::HasRoom(size_t label) const {
  return admitted_[label].size() < request_labels_.max_values();
}

SeriesValues& EngineSeries::CellSlow(LabelKey key) {
  auto it = cell_index_.find(key);
  if (it != cell_index_.end()) return *cells_[it->second].values;
  // A value another series admitted but this one has no place for.
  LabelKey admitted_key = key;
  for (size_t i = 0; i < admitted_.size(); ++i) {
    if (!Admit(i, RequestLabels::Unpack(key, i))) {
      admitted_key =
          RequestLabels::Pack(admitted_key, i, RequestLabels::kOther);
    }
  }
  if (admitted_key != key) {
    SeriesValues& values = Cell(admitted_key);
    // The alias: later lookups of `key` find the same cell at once.
    auto alias = cell_index_.find(admitted_key);
    if (alias != cell_index_.end()) cell_index_.emplace(key, alias->second);
    return values;
  }
  LabelCell cell = MakeCell(key);
  cell.values = std::make_unique<SeriesValues>(layouts_);
  cells_.push_back(std::move(cell));
  cell_index_.emplace(key, cells_.size() - 1);
  return *cells_.back().values;
}

SeriesValues& EngineSeries::CellForSetSlow(uint32_t set) {
  const LabelKey key = set == 0 ? 0 : request_labels_.SetKey(set);
  if (key == 0) UseOwnCell();
  SeriesValues& values = Cell(key);
  if (set < kDirectSets) {
    if (set_cells_.size() <= set) set_cells_.resize(set + 1, nullptr);
    set_cells_[set] = &values;
  }
  return values;
}

void EngineSeries::SetCacheConfig(std::vector<CacheConfigEntry> entries) {
  cache_config_ = std::move(entries);
  has_cache_config_ = true;
  cache_config_text_ = label_text_;
  cache_config_pairs_ = label_pairs_;
  for (const CacheConfigEntry& e : cache_config_) {
    AppendLabel(cache_config_text_, e.key, e.value);
    cache_config_pairs_.emplace_back(e.key, e.value);
  }
}

bool EngineSeries::AddExpertLoad(uint32_t layer, const uint64_t* counts,
                                 size_t n) {
  auto [it, created] = moe_.try_emplace(layer);
  MoeLayer& l = it->second;
  if (created) {
    l.experts.assign(n, 0);
  } else if (l.experts.size() != n) {
    return false;
  }
  uint64_t sum = 0, max = 0;
  for (size_t i = 0; i < n; ++i) {
    if (__builtin_add_overflow(l.experts[i], counts[i], &l.experts[i])) {
      l.experts[i] = UINT64_MAX;
    }
    sum += counts[i];  // at most 1024 x (2^32 - 1): no overflow
    max = std::max(max, counts[i]);
  }
  if (__builtin_add_overflow(l.routed, sum, &l.routed)) l.routed = UINT64_MAX;
  if (sum > 0) {
    l.imbalance = double(max) * double(n) / double(sum);
    l.has_imbalance = true;
    hist(kMoeImbalance).Observe(l.imbalance);
  }
  return true;
}

void EngineSeries::SetMaxLora(int64_t max_lora) {
  max_lora_ = std::to_string(max_lora);
}

void EngineSeries::AddLora(uint16_t lora, bool running, int delta,
                           double unix_s) {
  if (lora == 0) return;
  std::array<int64_t, 2>& counts = lora_[lora];
  const int64_t before = counts[running];
  counts[running] += delta;
  if ((before > 0) != (counts[running] > 0)) lora_changed_unix_s_ = unix_s;
  if (counts[0] <= 0 && counts[1] <= 0) lora_.erase(lora);
}

std::string EngineSeries::LoraSet(bool running) const {
  std::vector<std::string_view> names;
  for (const auto& [id, counts] : lora_) {
    if (counts[running] > 0) names.push_back(request_labels_.LoraName(id));
  }
  std::sort(names.begin(), names.end());
  std::string out;
  for (std::string_view n : names) {
    if (!out.empty()) out += ',';
    out += n;
  }
  return out;
}

}  // namespace tokenmeter::daemon
