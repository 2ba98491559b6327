// SaveState() / LoadState() of the registry and what it holds (histograms,
// series values, engine series, request labels): the metrics part of a
// state snapshot (daemon/state/snapshot.h). Each writes its members in
// declaration order and reads them back in the same order.
#include <algorithm>
#include <limits>

#include "daemon/base/state_io.h"
#include "daemon/store/engine_series.h"
#include "daemon/store/histogram.h"
#include "daemon/store/registry.h"
#include "daemon/store/request_labels.h"

namespace tokenmeter::daemon {
namespace {

constexpr size_t kMaxLabelBytes = 4096;
// Children of an index label (spec decode positions): far more than any
// engine drafts.
constexpr size_t kMaxChildren = 1 << 16;

void SaveU64s(StateWriter& w, const std::vector<uint64_t>& v) {
  w.U64(v.size());
  for (uint64_t x : v) w.U64(x);
}

void LoadU64s(StateReader& r, size_t max, std::vector<uint64_t>* v) {
  const size_t n = r.Count(max, 8);
  v->assign(n, 0);
  for (uint64_t& x : *v) x = r.U64();
}

void SavePairs(StateWriter& w, const LabelPairs& pairs) {
  w.U64(pairs.size());
  for (const auto& [name, value] : pairs) {
    w.Str(name);
    w.Str(value);
  }
}

LabelPairs LoadPairs(StateReader& r) {
  LabelPairs pairs(r.Count(64, 8));
  for (auto& [name, value] : pairs) {
    name = r.Str(kMaxLabelBytes);
    value = r.Str(kMaxLabelBytes);
  }
  return pairs;
}

}  // namespace

void Histogram::SaveState(StateWriter& w) const {
  SaveU64s(w, counts_);
  w.U64(count_);
  w.F64(sum_raw_);
  native_.SaveState(w);
}

void Histogram::LoadState(StateReader& r) {
  std::vector<uint64_t> counts;
  LoadU64s(r, counts_.size(), &counts);
  if (counts.size() != counts_.size()) {
    r.Fail();
    return;
  }
  const uint64_t count = r.U64();
  const double sum_raw = r.F64();
  NativeHistogram native(layout_->native_schema());
  // Format 1 had no native buckets: they start empty, the classic counts
  // go on (a native count above its buckets' total is what NaN
  // observations give too; rates over the new samples are exact).
  if (r.version() >= 2) native.LoadState(r);
  if (!r.ok()) return;
  counts_ = std::move(counts);
  count_ = count;
  sum_raw_ = sum_raw;
  native_ = std::move(native);
}

void SeriesValues::SaveState(StateWriter& w) const {
  for (uint64_t c : counts_) w.U64(c);
  for (const GaugeCell& g : gauges_) {
    w.F64(g.set_value);
    w.I64(g.derived);
    w.Bool(g.has_set);
  }
  for (const std::vector<uint64_t>& c : children_) SaveU64s(w, c);
  for (const Histogram& h : hists_) h.SaveState(w);
}

void SeriesValues::LoadState(StateReader& r) {
  for (uint64_t& c : counts_) c = r.U64();
  for (GaugeCell& g : gauges_) {
    g.set_value = r.F64();
    g.derived = r.I64();
    g.has_set = r.Bool();
  }
  for (std::vector<uint64_t>& c : children_) {
    const size_t fixed = c.size();
    LoadU64s(r, kMaxChildren, &c);
    if (fixed > 0 && c.size() != fixed) r.Fail();
  }
  for (Histogram& h : hists_) h.LoadState(r);
}

void EngineSeries::SaveState(StateWriter& w) const {
  // The label order: label_pairs_ after model_name and engine.
  SavePairs(w, LabelPairs(label_pairs_.begin() + 2, label_pairs_.end()));
  SeriesValues::SaveState(w);
  w.U64(cells_.size());
  for (const LabelCell& c : cells_) {
    w.U64(c.key);
    c.values->SaveState(w);
  }
  // By key: the same state always makes the same bytes.
  std::vector<std::pair<LabelKey, size_t>> index(cell_index_.begin(),
                                                 cell_index_.end());
  std::sort(index.begin(), index.end());
  w.U64(index.size());
  for (const auto& [key, i] : index) {
    w.U64(key);
    w.U64(i);
  }
  for (const std::vector<uint16_t>& ids : admitted_) {
    w.U64(ids.size());
    for (uint16_t id : ids) w.U16(id);
  }
  w.Bool(own_cell_used_);
  w.Bool(has_cache_config_);
  w.U64(cache_config_.size());
  for (const CacheConfigEntry& e : cache_config_) {
    w.Str(e.key);
    w.Str(e.value);
    w.F64(e.number);
  }
  w.Str(max_lora_);
  w.U64(moe_.size());
  for (const auto& [layer, l] : moe_) {
    w.U32(layer);
    SaveU64s(w, l.experts);
    w.U64(l.routed);
    w.F64(l.imbalance);
    w.Bool(l.has_imbalance);
  }
  w.U64(lora_.size());
  for (const auto& [id, counts] : lora_) {
    w.U16(id);
    w.I64(counts[0]);
    w.I64(counts[1]);
  }
  w.F64(lora_changed_unix_s_);
}

void EngineSeries::LoadState(StateReader& r) {
  SeriesValues::LoadState(r);
  const size_t cells = r.Count(RequestLabels::kMaxSets, 8);
  for (size_t i = 0; i < cells && r.ok(); ++i) {
    const LabelKey key = r.U64();
    for (size_t l = 0; l < admitted_.size(); ++l) {
      // MakeCell() reads the label values: they must exist.
      if (RequestLabels::Unpack(key, l) >= request_labels_.value_count(l)) {
        r.Fail();
      }
    }
    if (key == 0 || !r.ok()) {
      r.Fail();
      break;
    }
    LabelCell cell = MakeCell(key);
    cell.values = std::make_unique<SeriesValues>(layouts_);
    cell.values->LoadState(r);
    cells_.push_back(std::move(cell));
  }
  const size_t index = r.Count(RequestLabels::kMaxSets * 4, 16);
  for (size_t i = 0; i < index && r.ok(); ++i) {
    const LabelKey key = r.U64();
    const uint64_t at = r.U64();
    if (at >= cells_.size()) r.Fail();
    cell_index_.emplace(key, size_t(at));
  }
  for (std::vector<uint16_t>& ids : admitted_) {
    ids.resize(r.Count(RequestLabels::kMaxValues, 2));
    for (uint16_t& id : ids) id = r.U16();
  }
  own_cell_used_ = r.Bool();
  has_cache_config_ = r.Bool();
  std::vector<CacheConfigEntry> entries(r.Count(TM_MAX_CACHE_CONFIG, 20));
  for (CacheConfigEntry& e : entries) {
    e.key = r.Str(kMaxLabelBytes);
    e.value = r.Str(kMaxLabelBytes);
    e.number = r.F64();
  }
  if (has_cache_config_) SetCacheConfig(std::move(entries));
  max_lora_ = r.Str(64);
  const size_t layers = r.Count(TM_MAX_MOE_LAYERS, 29);
  for (size_t i = 0; i < layers && r.ok(); ++i) {
    MoeLayer& l = moe_[r.U32()];
    LoadU64s(r, TM_MAX_MOE_EXPERTS, &l.experts);
    l.routed = r.U64();
    l.imbalance = r.F64();
    l.has_imbalance = r.Bool();
  }
  const size_t loras = r.Count(RequestLabels::kMaxLoras, 18);
  for (size_t i = 0; i < loras && r.ok(); ++i) {
    const uint16_t id = r.U16();
    if (id == 0 || id >= request_labels_.lora_count()) r.Fail();
    std::array<int64_t, 2>& counts = lora_[id];
    counts[0] = r.I64();
    counts[1] = r.I64();
  }
  lora_changed_unix_s_ = r.F64();
}

void RequestLabels::SaveState(StateWriter& w) const {
  for (const std::vector<std::string>& values : values_) {
    w.U64(values.size() - 2);  // after "" and __other__
    for (size_t i = 2; i < values.size(); ++i) w.Str(values[i]);
  }
  SaveU64s(w, overflow_);
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
      if (v.empty() || !ids_[l].emplace(v, uint16_t(values_[l].size())).second)
        r.Fail();
      values_[l].push_back(std::move(v));
    }
  }
  std::vector<uint64_t> overflow;
  LoadU64s(r, overflow_.size(), &overflow);
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

void Registry::SaveState(
    StateWriter& w,
    std::unordered_map<const EngineSeries*, uint32_t>* index) const {
  request_labels_.SaveState(w);
  w.U64(series_rejected_);
  w.U64(expert_series_);
  w.U64(series_.size());
  for (const auto& [id, s] : series_) {
    index->emplace(s.get(), uint32_t(index->size()));
    w.Str(id.ns);
    w.Str(id.model);
    w.Str(id.instance);
    w.U8(uint8_t(id.profile));
    s->SaveState(w);
  }
}

void Registry::LoadState(StateReader& r, std::vector<EngineSeries*>* by_index) {
  request_labels_.LoadState(r);
  series_rejected_ = r.U64();
  const uint64_t expert_series = r.U64();
  const size_t n = r.Count(options_.max_engine_series, 16);
  for (size_t i = 0; i < n && r.ok(); ++i) {
    SeriesIdentity id;
    id.ns = r.Str(kMaxLabelBytes);
    id.model = r.Str(kMaxLabelBytes);
    id.instance = r.Str(kMaxLabelBytes);
    const uint8_t profile = r.U8();
    id.labels = LoadPairs(r);
    if (profile >= kNumProfiles) {
      r.Fail();
      break;
    }
    id.profile = Profile(profile);
    const size_t before = series_.size();
    EngineSeries* s = r.ok() ? GetOrCreate(id) : nullptr;
    if (s == nullptr || series_.size() == before) {  // refused, or a repeat
      r.Fail();
      break;
    }
    s->LoadState(r);
    by_index->push_back(s);
  }
  if (expert_series > options_.max_engine_series - series_.size()) r.Fail();
  expert_series_ = size_t(expert_series);
}

}  // namespace tokenmeter::daemon
