// The registry's options (the --max-model-len, --buckets, --max-engine-series,
// --request-label*, --legacy-names, --moe-expert-series, --max-moe-layers and
// --native-histogram-schema flags): a plain value, so that the
// configuration holds it without the registry. Registry::Create() checks it.
#ifndef TOKENMETER_DAEMON_STORE_REGISTRY_OPTIONS_H_
#define TOKENMETER_DAEMON_STORE_REGISTRY_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tokenmeter::daemon {

// NativeHistogram::kDefaultSchema (registry.cpp checks that they agree).
inline constexpr int kDefaultNativeHistogramSchema = 3;

struct RegistryOptions {
  uint64_t max_model_len = 32768;
  // Per-histogram bucket overrides (the configuration's buckets.<name>),
  // by the name a profile exposes a histogram under, in its unit (e.g.
  // "kv_transfer_latency_ms", SGLang's, in ms), or by the catalog suffix,
  // in the catalog's unit, converted per profile (e.g.
  // "kv_transfer_time_seconds": seconds, ms in SGLang's); a profile's own
  // name wins. Registry::Create() resolves them (docs/metrics.md).
  std::map<std::string, std::vector<double>, std::less<>> buckets;
  size_t max_engine_series = 4096;  // identities, all namespaces together
  // --request-label names (at most TM_MAX_REQUEST_LABELS) and
  // --request-label-values.
  std::vector<std::string> request_labels;
  size_t request_label_values = 100;
  // --priority-label (protocol 1.2): one more request label, "priority",
  // whose value is the request's ARRIVED priority bucketed as vLLM does
  // ("<-1", "-1", "0", "1", ">1"; "0" when absent). Counts toward the four
  // request labels.
  bool priority_label = false;
  bool legacy_names = false;  // --legacy-names (vllm profile aliases)
  // --moe-expert-series: moe_expert_tokens{layer,expert}; each expert of a
  // layer counts as one series toward max_engine_series.
  bool moe_expert_series = false;
  // --max-moe-layers: MoE layers (a layer number of one series, from its
  // first EXPERT_LOAD) all series hold together; an EXPERT_LOAD that would
  // open one more is refused (Registry::ReserveMoeLayer()).
  size_t max_moe_layers = 262144;
  // --native-histogram-schema: the initial schema of every histogram's
  // native buckets (NativeHistogram::kMinSchema..kMaxSchema).
  int native_histogram_schema = kDefaultNativeHistogramSchema;
};

// The request labels' names: --request-label's, then "priority" with
// --priority-label (the name it adds).
inline constexpr std::string_view kPriorityLabel = "priority";

inline std::vector<std::string> RequestLabelNames(const RegistryOptions& o) {
  std::vector<std::string> names = o.request_labels;
  if (o.priority_label) names.emplace_back(kPriorityLabel);
  return names;
}

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_REGISTRY_OPTIONS_H_
