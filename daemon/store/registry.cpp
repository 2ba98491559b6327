#include "daemon/store/registry.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "daemon/base/state_io.h"
#include "daemon/store/profile.h"

namespace tokenmeter::daemon {

static_assert(kDefaultNativeHistogramSchema == NativeHistogram::kDefaultSchema);

namespace {

// The histogram of catalog name `name` (a histogram's suffix), or
// kNumEngineMetrics.
EngineMetric CatalogHistogram(std::string_view name) {
  for (const EngineMetricDef& def : kEngineMetrics) {
    if (def.type == MetricType::kHistogram && def.suffix == name) return def.id;
  }
  return kNumEngineMetrics;
}

// The histogram families a profile exposes under their own names: measured
// ones and those a part writes, not the --legacy-names aliases (an alias
// shows its current name's histogram and follows its override).
bool OwnHistogram(const FamilyDef& f) {
  return f.type == MetricType::kHistogram && !f.legacy &&
         (f.source == FamilySource::kMetric || f.source == FamilySource::kPart);
}

// Whether `name` is a histogram family's name (after the namespace) in
// some profile.
bool FamilyHistogramName(std::string_view name) {
  for (int p = 0; p < kNumProfiles; ++p) {
    for (const FamilyDef& f : ProfileFamilies(Profile(p))) {
      if (OwnHistogram(f) && FamilyName(f) == name) return true;
    }
  }
  return false;
}

// A bound given in the catalog's unit (seconds, bytes, tokens) in a
// profile's unit (SGLang's ms and MB): times `scale`, then to 15
// significant digits, so that 1.1 s is le="1100" and not
// 1100.0000000000002 (a double holds any 15-digit decimal exactly enough
// to print it back).
double InProfileUnit(double bound, double scale) {
  if (scale == 1) return bound;
  char text[32];
  std::snprintf(text, sizeof text, "%.15g", bound * scale);
  return std::strtod(text, nullptr);
}

// The bounds of profile `p`'s layout of histogram `m`: an override by the
// name `p` exposes it under (in that family's unit), else one by its
// catalog name (in the catalog's unit, converted), else the profile's
// default. Error: the converted bounds are no longer increasing.
Status LayoutBounds(const RegistryOptions& options, Profile p, EngineMetric m,
                    std::vector<double>* out) {
  for (const FamilyDef& f : ProfileFamilies(p)) {
    if (!OwnHistogram(f) || f.metric != m) continue;
    auto it = options.buckets.find(FamilyName(f));
    if (it != options.buckets.end()) {
      *out = it->second;
      return Status::Ok();
    }
  }
  const EngineMetricDef& def = kEngineMetrics[m];
  auto it = options.buckets.find(def.suffix);
  if (it == options.buckets.end()) {
    *out = DefaultBuckets(ProfileBuckets(p, m), options.max_model_len);
    return Status::Ok();
  }
  const double scale = CatalogDivisor(m) / ProfileDivisor(p, m);
  out->clear();
  for (double b : it->second) {
    const double v = InProfileUnit(b, scale);
    if (!out->empty() && v <= out->back()) {
      return Status::Error("buckets." + std::string(def.suffix) +
                           ": bounds too close to stay apart in the " +
                           std::string(ProfileName(p)) + " profile's unit");
    }
    out->push_back(v);
  }
  return Status::Ok();
}

}  // namespace

Status Registry::Create(const RegistryOptions& options,
                        std::unique_ptr<Registry>* out) {
  if (options.max_model_len < 1) {
    return Status::Error("max-model-len must be at least 1");
  }
  for (const auto& [suffix, bounds] : options.buckets) {
    if (CatalogHistogram(suffix) == kNumEngineMetrics &&
        !FamilyHistogramName(suffix)) {
      return Status::Error("buckets: no histogram named \"" + suffix + "\"");
    }
    if (bounds.empty()) {
      return Status::Error("buckets." + suffix + ": no bounds given");
    }
    for (size_t i = 0; i < bounds.size(); ++i) {
      if (!std::isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
        return Status::Error("buckets." + suffix +
                             ": bounds must be finite and increasing");
      }
    }
  }
  if (options.native_histogram_schema < NativeHistogram::kMinSchema ||
      options.native_histogram_schema > NativeHistogram::kMaxSchema) {
    return Status::Error("--native-histogram-schema must be -4 to 8");
  }
  if (options.request_labels.size() > TM_MAX_REQUEST_LABELS) {
    return Status::Error("at most 4 --request-label names");
  }
  if (options.priority_label) {
    if (RequestLabelNames(options).size() > TM_MAX_REQUEST_LABELS) {
      return Status::Error(
          "--priority-label takes one of the 4 request labels: at most 3 "
          "--request-label names with it");
    }
    for (const std::string& n : options.request_labels) {
      if (n == kPriorityLabel) {
        return Status::Error(
            "--request-label priority and --priority-label: the label is "
            "the priority bucket with --priority-label; drop one");
      }
    }
  }
  if (options.request_label_values < 1 ||
      options.request_label_values > RequestLabels::kMaxValues - 2) {
    return Status::Error("--request-label-values must be 1 to 65533");
  }
  for (const EngineMetricDef& def : kEngineMetrics) {
    const bool in_range =
        def.id >= kFirstHistogram && def.id < kFirstHistogram + kNumHistograms;
    if ((def.type == MetricType::kHistogram) != in_range) std::abort();
  }
  Layouts layouts;
  for (int p = 0; p < kNumProfiles; ++p) {
    layouts[p].reserve(kNumHistograms);
    for (int i = 0; i < kNumHistograms; ++i) {
      const EngineMetricDef& def = kEngineMetrics[kFirstHistogram + i];
      std::vector<double> bounds;
      if (Status s = LayoutBounds(options, Profile(p), def.id, &bounds);
          !s.ok()) {
        return s;
      }
      layouts[p].emplace_back(std::move(bounds),
                              ProfileDivisor(Profile(p), def.id),
                              options.native_histogram_schema);
    }
  }
  out->reset(new Registry(options, std::move(layouts)));
  return Status::Ok();
}

Registry::Registry(const RegistryOptions& options, Layouts layouts)
    : options_(options),
      layouts_(std::move(layouts)),
      request_labels_(RequestLabelNames(options), options.request_label_values,
                      options.priority_label) {
  static constexpr DaemonMetric kOverflow[] = {kRequestLabelOverflow};
  if (request_labels_.enabled()) {
    request_labels_registration_ =
        std::make_unique<Registration>(*this, &request_labels_, kOverflow);
  }
}

Registry::~Registry() = default;

bool Registry::ReserveMoeLayer(size_t experts) {
  const size_t places = options_.moe_expert_series ? experts : 0;
  if (moe_layers_ >= options_.max_moe_layers ||
      series_.size() + expert_series_ + places > options_.max_engine_series) {
    ++series_rejected_;
    return false;
  }
  ++moe_layers_;
  expert_series_ += places;
  return true;
}

bool Registry::NamespaceConflict(const SeriesIdentity& id) const {
  auto it = ns_profiles_.find(id.ns);
  return it != ns_profiles_.end() && it->second != id.profile;
}

EngineSeries* Registry::GetOrCreate(const SeriesIdentity& id) {
  SeriesIdentity key = id.Canonical();
  auto it = series_.find(key);
  if (it != series_.end()) return it->second.get();
  if (NamespaceConflict(key)) return nullptr;
  if (series_.size() + expert_series_ >= options_.max_engine_series) {
    ++series_rejected_;
    return nullptr;
  }
  auto s = std::make_unique<EngineSeries>(
      key, id.labels, layouts_[size_t(key.profile)], request_labels_);
  EngineSeries* raw = s.get();
  if (clock_ != nullptr) raw->set_start_unix_ns(UnixNowNs(*clock_));
  ns_profiles_.emplace(key.ns, key.profile);
  series_.emplace(std::move(key), std::move(s));
  return raw;
}

void Registry::SetClock(const Clock* clock) {
  clock_ = clock;
  start_unix_ns_ = clock != nullptr ? UnixNowNs(*clock) : 0;
  process_start_unix_ns_ = start_unix_ns_;
}

void Registry::Register(DaemonMetric id, const Collector* c) {
  if (c == nullptr || collectors_[id] != nullptr) std::abort();
  collectors_[id] = c;
}

void Registry::Unregister(DaemonMetric id, const Collector* c) {
  if (collectors_[id] == c) collectors_[id] = nullptr;
}

void Registry::SaveState(
    StateWriter& w,
    std::unordered_map<const EngineSeries*, uint32_t>* index) const {
  request_labels_.SaveState(w);
  w.U64(series_rejected_);
  w.U64(expert_series_);
  w.U64(start_unix_ns_);  // format 6
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
  r.U64();  // the expert places when saved: counted again below
  // Before format 6 the start was not saved: this daemon's stays.
  if (r.version() >= 6) start_unix_ns_ = r.U64();
  const size_t n = r.Count(options_.max_engine_series, 16);
  for (size_t i = 0; i < n && r.ok(); ++i) {
    SeriesIdentity id;
    id.ns = r.Str(kMaxLabelStateBytes);
    id.model = r.Str(kMaxLabelStateBytes);
    id.instance = r.Str(kMaxLabelStateBytes);
    const uint8_t profile = r.U8();
    id.labels = LoadLabelPairs(r);
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
  // The expert places are counted from the parts, under this daemon's
  // --moe-expert-series. More layers than --max-moe-layers, or experts
  // beyond the series cap, fail the snapshot like more series than
  // --max-engine-series do; checked before any per-expert count is made.
  MoeSize moe;
  for (EngineSeries* s : *by_index) {
    const MoeSize one = MoePartSize(*s);
    moe.layers += one.layers;
    moe.experts += one.experts;
  }
  moe_layers_ = moe.layers;
  expert_series_ = options_.moe_expert_series ? moe.experts : 0;
  if (moe_layers_ > options_.max_moe_layers ||
      expert_series_ > options_.max_engine_series - series_.size()) {
    r.Fail();
    return;
  }
  for (EngineSeries* s : *by_index) {
    FitMoePart(*s, options_.moe_expert_series);
  }
}

}  // namespace tokenmeter::daemon
