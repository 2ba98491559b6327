// Naming profiles (metrics-v1.md "Naming profiles"): each profile is one
// table of the engine families a connection's series expose, under the
// engine family's own names, types, label names and buckets, reading the
// values the daemon measures once (catalog.h). A series has one profile,
// chosen at HELLO; a metric namespace holds series of one profile only.
//
// Tables are static and read-only: any thread.
#ifndef TOKENMETER_DAEMON_STORE_PROFILE_H_
#define TOKENMETER_DAEMON_STORE_PROFILE_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "daemon/store/catalog.h"
#include "daemon/store/part.h"

namespace tokenmeter::daemon {

enum class Profile : uint8_t { kVllm, kSglang, kLmdeploy };
inline constexpr int kNumProfiles = 3;
std::string_view ProfileName(Profile p);  // "vllm", "sglang", "lmdeploy"
std::optional<Profile> ParseProfile(std::string_view name);
// --profile auto: sglang for engine "sglang", lmdeploy for "lmdeploy",
// vllm otherwise.
Profile AutoProfile(std::string_view engine);

// Where a family's samples come from.
enum class FamilySource : uint8_t {
  kMetric,           // the measured metric `metric`
  kRatio,            // count(metric) / count(metric2) (+ 1 with plus_one);
                     // 0 while count(metric2) is 0
  kPerPositionRate,  // each position of `metric` / count(metric2)
  kPart,             // the series' part `part`, its family `part_family`
                     // (store/part.h): the part says whether it is shown
                     // and writes its samples
};

struct FamilyDef {
  // after the "<ns>:" prefix; counters without _total
  std::string_view name = {};
  MetricType type = MetricType::kGauge;
  FamilySource source = FamilySource::kMetric;
  EngineMetric metric = kNumEngineMetrics;  // kMetric, kRatio, ...Rate
  BucketSet buckets = BucketSet::kNone;     // kMetric histograms: the profile's
  std::string_view help = {};
  bool legacy = false;        // exposed only with --legacy-names
  std::string_view key = {};  // PartFamily::kCacheConfigValue: the entry
  EngineMetric metric2 = kNumEngineMetrics;  // kRatio, kPerPositionRate
  bool plus_one = false;                     // kRatio
  // A constant label of this family's samples (e.g. SGLang's
  // cache_source="total"); empty name: none.
  std::string_view const_label = {};
  std::string_view const_value = {};
  // request_success: the finished_reason value of each FinishReason (stop,
  // length, abort, error); equal names are summed. Null: the catalog's.
  const std::string_view* reason_names = nullptr;
  // kPart: the part that writes this family, and which of its families it
  // is. With another source: the family is shown only for series that
  // have this part (the MoE imbalance histogram: those that sent
  // EXPERT_LOAD).
  PartKind part = PartKind::kNone;
  PartFamily part_family = PartFamily::kNone;
  // Histograms: raw units per exposed unit of the profile's layout of
  // `metric` (a kPart histogram names the catalog histogram whose layout
  // its part keeps in `metric`); 0: the catalog's (1e9 for seconds, else
  // 1). SGLang's KV-transfer histograms are in ms and MB.
  double divisor = 0;
};

// The families of profile `p`, in exposition order. Within a profile a
// measured histogram has one bucket set (every row naming it agrees).
std::span<const FamilyDef> ProfileFamilies(Profile p);

// A row's exposed name after the prefix (counters without _total) and help:
// its own, or its metric's catalog name and help.
std::string_view FamilyName(const FamilyDef& f);
std::string_view FamilyHelp(const FamilyDef& f);

// The bucket set the series of profile `p` keep for histogram `m` (the
// catalog's when the profile does not expose it).
BucketSet ProfileBuckets(Profile p, EngineMetric m);
// The catalog's divisor of histogram `m`: raw units per exposed unit (1e9
// for seconds, else 1).
double CatalogDivisor(EngineMetric m);
// The divisor of the layout the series of profile `p` keep for histogram
// `m` (FamilyDef::divisor, else CatalogDivisor()).
double ProfileDivisor(Profile p, EngineMetric m);

// Whether the series of profile `p` need metric `m` measured (a metric no
// row of the profile reads is not computed for them).
bool ProfileUses(Profile p, EngineMetric m);

// The metric namespace of a series: --namespace when set, else "sglang" /
// "lmdeploy" for those profiles, else the sanitized HELLO engine.
std::string ProfileNamespace(Profile p, std::string_view engine,
                             std::string_view namespace_override);

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_PROFILE_H_
