// docs/metrics.md must list exactly the series of each profile's table
// (daemon/store/profile.cpp) and of the daemon's (catalog.cpp). The
// tables between the GENERATED markers are compared with what the tables
// say; run with TOKENMETER_UPDATE_DOCS=1 to rewrite them after a change.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "daemon/base/text_format.h"
#include "daemon/store/catalog.h"
#include "daemon/store/parts/kv_transfer.h"
#include "daemon/store/profile.h"

namespace tokenmeter::daemon {
namespace {

std::string BucketText(BucketSet set) {
  switch (set) {
    case BucketSet::kNone:
      return "";
    case BucketSet::kTokens:
      return "1-2-5 up to --max-model-len";
    default: {
      std::string out;
      for (double b : DefaultBuckets(set, 32768)) {
        if (!out.empty()) out += ' ';
        AppendDouble(out, b);
      }
      return out;
    }
  }
}

std::string SourceText(const FamilyDef& f) {
  switch (f.source) {
    case FamilySource::kMetric:
      return "`" + std::string(kEngineMetrics[f.metric].suffix) + "`";
    case FamilySource::kRatio:
      return std::string(f.plus_one ? "1 + " : "") + "`" +
             std::string(kEngineMetrics[f.metric].suffix) + "` / `" +
             std::string(kEngineMetrics[f.metric2].suffix) + "`";
    case FamilySource::kPerPositionRate:
      return "`" + std::string(kEngineMetrics[f.metric].suffix) +
             "` per position / `" +
             std::string(kEngineMetrics[f.metric2].suffix) + "`";
    case FamilySource::kPart:
      switch (f.part_family) {
        case PartFamily::kCacheConfigInfo:
          return "1 (HELLO `cache_config`)";
        case PartFamily::kLoraRequestsInfo:
          return "Unix time of the last change of the LoRA sets";
        case PartFamily::kCacheConfigValue:
          return "HELLO `cache_config` `" + std::string(f.key) + "`";
        case PartFamily::kMoeRoutedTokens:
          return "sum of EXPERT_LOAD `counts`";
        case PartFamily::kMoeExpertTokens:
          return "EXPERT_LOAD `counts[expert]` (--moe-expert-series)";
        case PartFamily::kMoeLayerImbalance:
          return "max / mean of the latest EXPERT_LOAD with a non-zero sum";
        case PartFamily::kAdmissionRejections:
          return "ADMISSION_REJECTED events (16 reasons, then `__other__`)";
        case PartFamily::kWaitingByReason:
          return "STEP `waiting` - `waiting_deferred`, `waiting_deferred`";
        case PartFamily::kKvTransferTime:
          return "KV_TRANSFER `t` - `start`";
        case PartFamily::kKvTransferBytes:
          return "KV_TRANSFER `bytes`";
        case PartFamily::kKvTransferFailures:
          return "KV_TRANSFER with `ok` false (`reason` default `error`)";
        case PartFamily::kKvTransferFailedTotal:
          return "KV_TRANSFER with `ok` false, every role and reason";
        case PartFamily::kKvTransferTimeouts: {
          // Each stage with the reason it counts (kTimeoutStages).
          std::string text = "KV_TRANSFER with `ok` false and `reason`";
          const auto& stages = KvTransferPart::kTimeoutStages;
          for (size_t i = 0; i < stages.size(); ++i) {
            text += std::string(i == 0 ? " " : " or ") + "`" +
                    std::string(stages[i].second) + "` (stage `" +
                    std::string(stages[i].first) + "`)";
          }
          return text +
                 "; every stage from the series' first KV_TRANSFER, at 0 "
                 "until then, as SGLang creates them";
        }
        case PartFamily::kSleepState:
          return "SLEEP: awake, weights offloaded, weights discarded";
        case PartFamily::kSleepResourceState:
          return "SLEEP: 1 for each resource's current state";
        case PartFamily::kFullyAwake:
          return "SLEEP: scheduler running, weights and KV cache resident";
        case PartFamily::kNone:
          break;
      }
      break;
  }
  return "";
}

std::string LabelText(const FamilyDef& f) {
  std::string labels = "model_name, engine";
  if (f.part_family == PartFamily::kCacheConfigInfo) {
    labels += ", every `cache_config` key";
  } else if (f.part_family == PartFamily::kMoeRoutedTokens ||
             f.part_family == PartFamily::kMoeLayerImbalance) {
    labels += ", layer";
  } else if (f.part_family == PartFamily::kMoeExpertTokens) {
    labels += ", layer, expert";
  } else if (f.part_family == PartFamily::kLoraRequestsInfo) {
    labels += ", max_lora, running_lora_adapters, waiting_lora_adapters";
  } else if (f.part_family == PartFamily::kAdmissionRejections ||
             f.part_family == PartFamily::kWaitingByReason) {
    labels += ", reason";
  } else if (f.part_family == PartFamily::kKvTransferTime ||
             f.part_family == PartFamily::kKvTransferBytes) {
    labels += ", role";
  } else if (f.part_family == PartFamily::kKvTransferFailures) {
    labels += ", role, reason";
  } else if (f.part_family == PartFamily::kKvTransferTimeouts) {
    labels += ", " + std::string(f.const_label) + "=";
    const auto& stages = KvTransferPart::kTimeoutStages;
    for (size_t i = 0; i < stages.size(); ++i) {
      labels += std::string(i == 0 ? "" : " / ") + "\"" +
                std::string(stages[i].first) + "\"";
    }
  } else if (f.part_family == PartFamily::kSleepState) {
    labels += ", sleep_state";
  } else if (f.part_family == PartFamily::kSleepResourceState) {
    labels += ", resource, state";
  } else if (f.source == FamilySource::kMetric ||
             f.source == FamilySource::kPerPositionRate) {
    const EngineMetricDef& d = kEngineMetrics[f.metric];
    if (!d.own_label.empty()) labels += ", " + std::string(d.own_label);
    if (f.reason_names != nullptr) {
      labels += " (";
      for (size_t i = 0; i < std::size(kFinishedReasonValues); ++i) {
        labels += std::string(i ? ", " : "") + std::string(f.reason_names[i]);
      }
      labels += " for stop, length, abort, error)";
    }
    if (!f.const_label.empty()) {
      labels += ", " + std::string(f.const_label) + "=\"" +
                std::string(f.const_value) + "\"";
    }
    if (d.request_level && f.source == FamilySource::kMetric) {
      labels += ", request labels";
    }
  }
  return labels;
}

std::string ProfileTable(Profile p) {
  std::string t =
      "| name | type | labels | buckets | value | help |\n"
      "|---|---|---|---|---|---|\n";
  const std::string prefix =
      p == Profile::kVllm ? "<ns>:" : std::string(ProfileName(p)) + ":";
  for (const FamilyDef& f : ProfileFamilies(p)) {
    t += "| `" + prefix + std::string(FamilyName(f)) +
         (f.type == MetricType::kCounter ? "_total" : "") + "`" +
         (f.legacy ? " (--legacy-names)" : "") + " | " +
         std::string(MetricTypeName(f.type)) + " | " + LabelText(f) + " | " +
         (f.type == MetricType::kHistogram ? BucketText(f.buckets) : "") +
         " | " + SourceText(f) + " | " + std::string(FamilyHelp(f)) + " |\n";
  }
  return t;
}

std::string DaemonTable() {
  std::string t = "| name | type | labels | help |\n|---|---|---|---|\n";
  for (const DaemonMetricDef& d : kDaemonMetrics) {
    std::string labels(d.labels);
    for (size_t p = labels.find(','); p != std::string::npos;
         p = labels.find(',', p + 2)) {
      labels.replace(p, 1, ", ");
    }
    t += "| `" + std::string(d.name) +
         (d.type == MetricType::kCounter ? "_total" : "") + "` | " +
         std::string(MetricTypeName(d.type)) + " | " + labels + " | " +
         std::string(d.help) + " |\n";
  }
  return t;
}

// Replaces (update) or returns the text between the named markers.
std::string Section(std::string& doc, const std::string& name,
                    const std::string* replacement) {
  const std::string begin = "<!-- BEGIN GENERATED: " + name + " -->\n";
  const std::string end = "<!-- END GENERATED: " + name + " -->";
  const size_t b = doc.find(begin);
  const size_t e = doc.find(end);
  if (b == std::string::npos || e == std::string::npos || e < b) return "";
  const size_t start = b + begin.size();
  if (replacement != nullptr) doc.replace(start, e - start, *replacement);
  return doc.substr(start, e - start);
}

TEST(MetricsDocTest, TablesMatchTheCatalog) {
  const char* path = std::getenv("METRICS_DOC");
  ASSERT_NE(path, nullptr) << "METRICS_DOC is not set";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  std::string doc = ss.str();
  const std::string daemon = DaemonTable();
  const bool update = std::getenv("TOKENMETER_UPDATE_DOCS") != nullptr;
  for (int p = 0; p < kNumProfiles; ++p) {
    const std::string name = "profile " + std::string(ProfileName(Profile(p)));
    const std::string table = ProfileTable(Profile(p));
    if (update) Section(doc, name, &table);
    EXPECT_EQ(Section(doc, name, nullptr), table)
        << "docs/metrics.md is out of date: rerun with "
           "TOKENMETER_UPDATE_DOCS=1";
  }
  if (update) {
    Section(doc, "daemon series", &daemon);
    std::ofstream(path) << doc;
  }
  EXPECT_EQ(Section(doc, "daemon series", nullptr), daemon)
      << "docs/metrics.md is out of date: rerun with TOKENMETER_UPDATE_DOCS=1";
}

}  // namespace
}  // namespace tokenmeter::daemon
