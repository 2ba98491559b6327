#include "daemon/store/engine_series.h"

#include "daemon/base/state_io.h"
#include "daemon/base/text_format.h"
#include "daemon/store/request_labels.h"

namespace tokenmeter::daemon {
namespace {

// Children of an index label (spec decode positions): far more than any
// engine drafts.
constexpr size_t kMaxChildren = 1 << 16;

}  // namespace

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
  MakeEveryPart(*this);
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
  if (id == RequestLabels::kEmpty || id == RequestLabels::kOther ||
      !request_labels_.capped(label)) {
    return true;
  }
  std::vector<uint16_t>& admitted = admitted_[label];
  if (std::find(admitted.begin(), admitted.end(), id) != admitted.end()) {
    return true;
  }
  if (admitted.size() >= request_labels_.max_values()) return false;
  admitted.push_back(id);
  return true;
}

bool EngineSeries::HasRoom(size_t label) const {
  return !request_labels_.capped(label) ||
         admitted_[label].size() < request_labels_.max_values();
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

// ---- snapshots

// Format 5 on: each array with its length, in catalog order (a later
// catalog maps these ids as Format4Metric() maps format 4's). Formats 1 to
// 4: the arrays of the 1.1 catalog, without a length.
void SeriesValues::SaveState(StateWriter& w) const {
  w.U64(counts_.size());
  for (uint64_t c : counts_) w.U64(c);
  for (const GaugeCell& g : gauges_) {
    w.F64(g.set_value);
    w.I64(g.derived);
    w.Bool(g.has_set);
  }
  for (const std::vector<uint64_t>& c : children_) w.U64s(c);
  w.U64(hists_.size());
  for (const Histogram& h : hists_) h.SaveState(w);
}

void SeriesValues::LoadState(StateReader& r) {
  const bool sized = r.version() >= 5;
  const size_t metrics =
      sized ? r.Count(kNumEngineMetrics, 8) : kFormat4Metrics;
  const auto id = [sized](size_t i) {
    return sized ? EngineMetric(i) : Format4Metric(i);
  };
  for (size_t i = 0; i < metrics; ++i) counts_[id(i)] = r.U64();
  for (size_t i = 0; i < metrics; ++i) {
    GaugeCell& g = gauges_[id(i)];
    g.set_value = r.F64();
    g.derived = r.I64();
    g.has_set = r.Bool();
  }
  for (size_t i = 0; i < metrics; ++i) {
    std::vector<uint64_t>& c = children_[id(i)];
    const size_t fixed = c.size();
    r.U64s(kMaxChildren, &c);
    if (fixed > 0 && c.size() != fixed) r.Fail();
  }
  const size_t hists = sized ? r.Count(hists_.size(), 8) : kFormat4Histograms;
  for (size_t i = 0; i < hists; ++i) hists_[i].LoadState(r);
}

void SaveLabelPairs(StateWriter& w, const LabelPairs& pairs) {
  w.U64(pairs.size());
  for (const auto& [name, value] : pairs) {
    w.Str(name);
    w.Str(value);
  }
}

LabelPairs LoadLabelPairs(StateReader& r) {
  LabelPairs pairs(r.Count(64, 8));
  for (auto& [name, value] : pairs) {
    name = r.Str(kMaxLabelStateBytes);
    value = r.Str(kMaxLabelStateBytes);
  }
  return pairs;
}

void EngineSeries::SaveState(StateWriter& w) const {
  // The label order: label_pairs_ after model_name and engine.
  SaveLabelPairs(w, LabelPairs(label_pairs_.begin() + 2, label_pairs_.end()));
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
  w.U64(parts_.size());
  parts_.ForEach([&w](const Part& p) {
    w.U8(uint8_t(p.kind()));
    p.SaveState(w);
  });
  w.U64(start_unix_ns_);  // format 6
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
  if (r.version() < 3) {
    LoadLegacyParts(r, *this);
    return;
  }
  const size_t parts = r.Count(kNumPartKinds, 1);
  uint32_t seen = 0;
  for (size_t i = 0; i < parts && r.ok(); ++i) {
    const uint8_t kind = r.U8();
    if (kind >= kNumPartKinds || (seen & (1u << kind)) != 0) {
      r.Fail();
      break;
    }
    seen |= 1u << kind;
    std::unique_ptr<Part> part = MakePart(PartKind(kind), *this);
    part->LoadState(r);
    parts_.Put(std::move(part));
  }
  // Before format 6 the start was not saved: the load's time stays.
  if (r.version() >= 6) start_unix_ns_ = r.U64();
}

}  // namespace tokenmeter::daemon
