#include "daemon/store/parts/cache_config.h"

#include "daemon/base/state_io.h"
#include "daemon/base/text_format.h"
#include "daemon/store/engine_series.h"
#include "daemon/store/metric_writer.h"
#include "daemon/store/profile.h"
#include "tokenmeter/protocol.h"

namespace tokenmeter::daemon {
CacheConfigPart::CacheConfigPart(const EngineSeries& series)
    : series_(series),
      text_(series.label_text()),
      pairs_(series.label_pairs()) {}

void CacheConfigPart::Set(std::vector<CacheConfigEntry> entries) {
  entries_ = std::move(entries);
  text_ = series_.label_text();
  pairs_ = series_.label_pairs();
  for (const CacheConfigEntry& e : entries_) {
    AppendLabel(text_, e.key, e.value);
    pairs_.emplace_back(e.key, e.value);
  }
}

const CacheConfigEntry* CacheConfigPart::FindNumber(
    std::string_view key) const {
  for (const CacheConfigEntry& e : entries_) {
    if (e.key == key && e.number == e.number) return &e;  // not NaN
  }
  return nullptr;
}

bool CacheConfigPart::Shows(const FamilyDef& f,
                            const RegistryOptions& /*o*/) const {
  if (f.part_family == PartFamily::kCacheConfigValue) {
    return FindNumber(f.key) != nullptr;
  }
  return f.part_family == PartFamily::kCacheConfigInfo;
}

void CacheConfigPart::Write(const FamilyDef& f, const EngineSeries& s,
                            MetricWriter& w) const {
  if (f.part_family == PartFamily::kCacheConfigInfo) {
    w.Sample(SampleLabels{text_, pairs_, {}, {}}, 1.0);
  } else if (f.part_family == PartFamily::kCacheConfigValue) {
    if (const CacheConfigEntry* e = FindNumber(f.key)) {
      w.Sample(SampleLabels{s.label_text(), s.label_pairs(), {}, {}},
               e->number);
    }
  }
}

void CacheConfigPart::SaveState(StateWriter& w) const {
  w.U64(entries_.size());
  for (const CacheConfigEntry& e : entries_) {
    w.Str(e.key);
    w.Str(e.value);
    w.F64(e.number);
  }
}

void CacheConfigPart::LoadState(StateReader& r) {
  std::vector<CacheConfigEntry> entries(r.Count(TM_MAX_CACHE_CONFIG, 20));
  for (CacheConfigEntry& e : entries) {
    e.key = r.Str(kMaxLabelStateBytes);
    e.value = r.Str(kMaxLabelStateBytes);
    e.number = r.F64();
  }
  Set(std::move(entries));
}

}  // namespace tokenmeter::daemon
