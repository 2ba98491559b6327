// Metrics over OTLP (interfaces.md "Metrics over OTLP"; docs/otlp-metrics.md):
// every --otlp-metrics-interval the pusher renders the registry, every
// engine and daemon family /metrics shows at that moment, into an
// otlp_metrics::OtlpMetricsEncoder and hands the body to its own
// OTLP/HTTP exporter (daemon/otlp: the traces' transport, headers, TLS,
// retries with backoff and Retry-After, a queue bounded in data points).
//
// Times: each point's time is the push's (Unix ns); its start time is its
// engine series' start_unix_ns() (the series' creation, kept across
// restarts by --state-dir snapshots), else the registry's (the daemon
// families, and per-request-label cells: the state's start), so that a
// backend never sees a cumulative value restart that did not.
//
// Cost: one Render() into the encoder per interval on the loop (the time of
// about one protobuf render of /metrics, docs/otlp-metrics.md "Cost"), and
// the exporter's send; nothing between pushes. A receiver that is down or
// slow never blocks the loop: bodies wait in the exporter's queue (at most
// --otlp-queue-spans data points), past which a push is dropped and
// counted (stats()). Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_PUSHING_METRICS_PUSHER_H_
#define TOKENMETER_DAEMON_PUSHING_METRICS_PUSHER_H_

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "daemon/base/clock.h"
#include "daemon/base/status.h"
#include "daemon/otlp/otlp_config.h"
#include "daemon/otlp/otlp_http_exporter.h"
#include "daemon/otlp_metrics/otlp_metrics_encoder.h"
#include "daemon/store/registry.h"

namespace tokenmeter::daemon {

struct MetricsPusherOptions {
  uint64_t interval_ns = 15'000'000'000;  // > 0
  otlp_metrics::HistogramForm histograms =
      otlp_metrics::HistogramForm::kExponential;
  // Data points waiting for the receiver at most (--otlp-queue-spans).
  uint64_t max_queue_points = 65536;
  std::string version;  // the instrumentation scope's
  // The wall clock of the points' times; null: the system's.
  const Clock* clock = nullptr;
};

// Counters since Create.
struct MetricsPusherStats {
  uint64_t pushes = 0;           // bodies rendered and submitted
  uint64_t points_exported = 0;  // data points the receiver took
  uint64_t points_dropped = 0;   // the queue was full
  uint64_t points_failed = 0;    // gave up, refused, or rejected
  uint64_t points_queued = 0;    // now: waiting or in flight
};

class MetricsPusher {
 public:
  // `config` must be enabled (an endpoint). Creates the exporter on `loop`
  // (OtlpHttpExporter::Create's errors: one line) and the interval timer
  // (unreferenced: it does not keep the loop alive). `registry` outlives
  // the pusher.
  static Status Create(uv_loop_t* loop, const Registry& registry,
                       otlp::OtlpConfig config, MetricsPusherOptions options,
                       std::unique_ptr<MetricsPusher>* out);
  MetricsPusher(const MetricsPusher&) = delete;
  MetricsPusher& operator=(const MetricsPusher&) = delete;
  // Requires Shutdown()'s `done` to have run.
  ~MetricsPusher();

  // Renders and submits one push now (what the timer does). Cost: one
  // Render() into the encoder plus the exporter's Submit (a move, or with
  // gzip a deflate).
  void Push();
  // A last push (the values at stop), then the exporter sends what it
  // holds until `deadline_ns` (CLOCK_MONOTONIC) and closes; `done` runs on
  // the loop once all is closed. Call once.
  void Shutdown(uint64_t deadline_ns, std::function<void()> done);

  MetricsPusherStats stats() const;
  const std::string& endpoint() const { return exporter_->endpoint(); }

 private:
  MetricsPusher(const Registry& registry, MetricsPusherOptions options,
                otlp_metrics::OtlpMetricsOptions encoder_options);
  static void OnTimer(uv_timer_t* t);
  void MaybeDone();

  const Registry& registry_;
  MetricsPusherOptions options_;
  otlp_metrics::OtlpMetricsEncoder encoder_;
  // An engine series' label text (a view: series live as long as the
  // registry) -> its start time; made again when series were added.
  std::unordered_map<std::string_view, uint64_t> starts_;
  size_t starts_series_ = SIZE_MAX;  // the series count starts_ was made at
  std::unique_ptr<otlp::OtlpHttpExporter> exporter_;
  uv_timer_t timer_{};
  bool shut_down_ = false;
  bool timer_closed_ = false;
  bool exporter_closed_ = false;
  std::function<void()> done_;
  uint64_t pushes_ = 0;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_PUSHING_METRICS_PUSHER_H_
