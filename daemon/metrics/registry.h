// The daemon's metric state and its text exposition.
//
// Engine series are grouped by identity (namespace, model_name, engine
// instance, HELLO labels): one EngineSeries holds every metric of one
// identity, so an ingest connection resolves its series once, at HELLO, and
// each event then updates plain fields. Series are never removed while the
// daemon runs (counters must not reset); their number is capped.
//
// Single-threaded: everything runs on the daemon's loop.
#ifndef TOKENMETER_DAEMON_METRICS_REGISTRY_H_
#define TOKENMETER_DAEMON_METRICS_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "daemon/ingest/event.h"
#include "daemon/metrics/catalog.h"
#include "daemon/metrics/histogram.h"
#include "daemon/status.h"

namespace tokenmeter::daemon {

inline constexpr EngineMetric kFirstHistogram = kTimeToFirstToken;
inline constexpr int kNumHistograms = kIterationTokens - kTimeToFirstToken + 1;

struct SeriesIdentity {
  std::string ns;        // metric namespace (sanitized engine or --namespace)
  std::string model;     // model_name
  std::string instance;  // engine
  std::vector<std::pair<std::string, std::string>> labels;  // HELLO order

  auto operator<=>(const SeriesIdentity&) const = default;
};

// The metric namespace for a HELLO engine name: every character outside
// [a-zA-Z0-9_] becomes '_'.
std::string SanitizeNamespace(std::string_view engine);

struct EngineSeries {
  // layouts: kNumHistograms entries, in EngineMetric order.
  EngineSeries(const SeriesIdentity& id,
               const std::vector<HistogramLayout>& layouts);

  Histogram& hist(EngineMetric m) { return hists[m - kFirstHistogram]; }
  const Histogram& hist(EngineMetric m) const {
    return hists[m - kFirstHistogram];
  }

  const SeriesIdentity identity;
  std::string label_text;  // model_name="..",engine="..",k="v" (escaped)

  // Gauges: STEP values when the engine sends them, else derived.
  bool has_step_running = false;
  bool has_step_waiting = false;
  uint64_t step_running = 0;
  uint64_t step_waiting = 0;
  double kv_usage = 0;
  int64_t derived_running = 0;
  int64_t derived_waiting = 0;

  uint64_t prefix_queries = 0;
  uint64_t prefix_hits = 0;
  uint64_t preemptions = 0;
  uint64_t prompt_tokens = 0;
  uint64_t generation_tokens = 0;
  uint64_t success[kNumFinishReasons] = {};
  uint64_t spec_drafts = 0;
  uint64_t spec_draft_tokens = 0;
  uint64_t spec_accepted_tokens = 0;
  std::vector<uint64_t> spec_accepted_per_pos;
  std::vector<Histogram> hists;

  // Summary-line bookkeeping (logging/summary.cpp).
  uint64_t last_log_prompt_tokens = 0;
  uint64_t last_log_generation_tokens = 0;
  uint64_t last_log_prefix_queries = 0;
  uint64_t last_log_prefix_hits = 0;
  uint64_t last_log_spec_draft_tokens = 0;
  uint64_t last_log_spec_accepted_tokens = 0;
  int idle_windows = 0;
};

// Self-metrics of the daemon (tokenmeter_*).
struct DaemonCounters {
  int64_t ingest_connections = 0;
  uint64_t ingest_frames = 0;
  uint64_t ingest_events[kNumEventKinds] = {};
  uint64_t ingest_errors[size_t(IngestError::kCount)] = {};
  int64_t tracked_requests = 0;
  uint64_t evicted_requests = 0;
  uint64_t incomplete[size_t(Interval::kCount)] = {};
  uint64_t negative[size_t(Interval::kCount)] = {};
  double scrape_duration_seconds = 0;
  uint64_t series_rejected = 0;  // identities refused by the series cap
  // Set by the daemon from its HTTP server before each render: responses by
  // status code label ("200", ..., "other"), and connections refused at the
  // server's connection cap.
  std::vector<std::pair<std::string, uint64_t>> http_responses;
  uint64_t http_connections_rejected = 0;
};

enum class ExpositionFormat { kText004, kOpenMetrics100 };

struct RegistryOptions {
  uint64_t max_model_len = 32768;
  // Per-histogram bucket overrides, by suffix (e.g.
  // "time_to_first_token_seconds"), in exposed units.
  std::map<std::string, std::vector<double>, std::less<>> buckets;
  size_t max_engine_series = 4096;  // identities, all namespaces together
};

class Registry {
 public:
  // Checks the options (known suffixes, increasing finite bounds).
  static Status Create(const RegistryOptions& options,
                       std::unique_ptr<Registry>* out);
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The series of `id`, created on first use; nullptr when the cap is
  // reached (counted in DaemonCounters::series_rejected). Stable pointer.
  EngineSeries* GetOrCreate(const SeriesIdentity& id);
  size_t series_count() const { return series_.size(); }
  // Every series, in exposition order.
  template <typename F>
  void ForEachSeries(F&& f) {
    for (auto& [id, s] : series_) f(*s);
  }

  // Records the latest dropped_total a client reported. `client` tells
  // clients of one identity apart (their pid, else a connection id).
  void SetClientDropped(const std::string& family, const std::string& model,
                        const std::string& instance, int64_t client,
                        uint64_t dropped_total);

  DaemonCounters& counters() { return counters_; }
  const DaemonCounters& counters() const { return counters_; }

  // Appends the whole exposition to `out`.
  void Render(ExpositionFormat format, std::string& out) const;

 private:
  Registry(const RegistryOptions& options,
           std::vector<HistogramLayout> layouts);
  void RenderEngine(ExpositionFormat format, std::string& out) const;
  void RenderDaemon(ExpositionFormat format, std::string& out) const;

  const RegistryOptions options_;
  const std::vector<HistogramLayout> layouts_;  // kNumHistograms
  std::map<SeriesIdentity, std::unique_ptr<EngineSeries>> series_;
  // (family, model, instance) -> client -> latest dropped_total.
  std::map<std::tuple<std::string, std::string, std::string>,
           std::map<int64_t, uint64_t>>
      client_dropped_;
  DaemonCounters counters_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_METRICS_REGISTRY_H_
