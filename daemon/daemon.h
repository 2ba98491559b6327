// Daemon: owns the libuv loop and composes what runs on it: the ingest
// pipeline (registry, tracker, ingest server), the HTTP server and its
// routes, the snapshotter, the periodic timers (sweep, summary window,
// live page, watchdog, status) and the signal handlers. main() builds one.
#ifndef TOKENMETER_DAEMON_DAEMON_H_
#define TOKENMETER_DAEMON_DAEMON_H_

#include <uv.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/base/clock.h"
#include "daemon/base/status.h"
#include "daemon/config.h"
#include "daemon/exposition/process_collector.h"
#include "daemon/http/server.h"
#include "daemon/live/history.h"
#include "daemon/logging/summary.h"
#include "daemon/pipeline/pipeline.h"
#include "daemon/pushing/metrics_pusher.h"
#include "daemon/requests/request_keeper.h"
#include "daemon/service/systemd.h"
#include "daemon/state/snapshotter.h"
#include "daemon/store/registry.h"
#include "daemon/store/window_gauges.h"
#include "daemon/tracing/tracer.h"

namespace tokenmeter::daemon {

class Daemon {
 public:
  // Validates the configuration and builds the components; with
  // --state-dir, restores the newest snapshot (binds nothing).
  static Status Create(const Config& config, std::unique_ptr<Daemon>* out);
  // The OTLP settings (the --otlp-* flags and the OTEL_* environment) as
  // Create() reads them, checked without building anything: an error is a
  // bad value (tokenmeterd exits 2). Create() still fails on what only
  // building finds (a certificate file that cannot be read: exit 1).
  static Status CheckOtlpSettings(const Config& config);
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  ~Daemon();

  // Binds the ingest socket and the HTTP listener, or adopts the sockets
  // named "ingest" and "http" that systemd passed (socket activation);
  // starts the timers and signal handlers; then tells systemd READY=1.
  Status Start();
  // Runs the loop until SIGTERM/SIGINT (or Stop()) has shut everything
  // down, then closes it: 0, or 1 (logged) when uv_loop_close() finds a
  // handle still open. Call once.
  int Run();
  // Begins a graceful shutdown; callable from the loop thread only.
  void Stop();

  uint16_t http_port() const { return http_->port(); }
  // What --ready-fd reports, set by a successful Start(): the HTTP address
  // as HOST:PORT (HOST as --listen gave it, empty for every interface; the
  // bound port, also for port 0) and the ingest socket path; under socket
  // activation the addresses of the inherited sockets.
  const std::string& http_address() const { return http_address_; }
  const std::string& ingest_address() const { return ingest_address_; }
  Registry& registry() { return pipeline_->registry(); }

 private:
  class SelfCollector;  // build info, scrape duration, HTTP counters
  struct Timer;         // a repeating timer and what it calls
  explicit Daemon(const Config& config);

  // (Re)makes the pipeline: at Create(), and again when a snapshot failed
  // to load halfway.
  Status BuildPipeline();
  // --state-dir: loads DIR/snapshot if there is one.
  Status Restore();
  // The payload of a snapshot: the pipeline, the snapshotter's counters,
  // the HTTP counters; LoadPayload() is true when it took it whole.
  void EncodeState(StateWriter& w);
  bool LoadPayload(StateReader& r);

  // Start(), step by step.
  Status StartIngest(int inherited_fd);
  Status StartHttp(int inherited_fd);
  void AddRoutes();
  void StartSignals();
  void StartTimers();
  // A repeating timer every `ms` milliseconds (closed by Stop()).
  void Every(uint64_t ms, std::function<void()> tick);

  void HandleMetrics(const http::Request& req, http::Response& resp);
  // The end of a summary window: window gauges, summary line.
  void EndWindow();
  void UpdateStatus();
  void OnStopped();
  // --otlp-endpoint (or the OTEL_* variables): the tracer, as the
  // tracker's timeline sink. A bad value is a start-up error.
  Status StartTracing();
  // --otlp-metrics-endpoint (or the OTEL_* variables): the metrics pusher.
  // A bad value is a start-up error.
  Status StartMetricsPush();
  // How long a stopping daemon keeps sending its pending spans.
  static constexpr uint64_t kTraceDrainNs = 3'000'000'000;

  const Config config_;
  uv_loop_t loop_{};
  bool loop_initialized_ = false;
  SystemClock clock_;
  // Declared in dependency order: collectors register with the pipeline's
  // registry and unregister (in reverse order) before it goes.
  std::unique_ptr<Pipeline> pipeline_;
  std::unique_ptr<http::Server> http_;
  std::unique_ptr<Snapshotter> snapshotter_;  // inactive without --state-dir
  std::unique_ptr<ProcessCollector> process_;
  std::unique_ptr<SelfCollector> self_;
  // Request traces over OTLP (--otlp-endpoint); null when off. The
  // tracker's timeline sink.
  std::unique_ptr<Tracer> tracer_;
  // Info lines of Create() (a restored state, the OTLP exports), logged by
  // Start() once it listens: a start-up error is one line on stderr
  // (interfaces.md), not these before it.
  std::vector<std::string> started_notes_;
  // The requests API's keeper (--keep-requests; null with 0): the
  // tracker's timeline sink after the tracer.
  std::unique_ptr<requests::RequestKeeper> keeper_;
  // Metrics over OTLP (--otlp-metrics-endpoint); null when off.
  std::unique_ptr<MetricsPusher> pusher_;
  SummaryLog summary_;
  WindowGauges window_gauges_;
  // The live page's history (`/`, /api/v1/live), one point a second.
  live::History live_;
  uint64_t scrape_duration_ns_ = 0;  // the previous scrape's render
  std::vector<std::unique_ptr<Timer>> timers_;
  uv_signal_t sigterm_{};
  uv_signal_t sigint_{};
  bool signals_started_ = false;
  Notifier notifier_;
  uint64_t status_events_ = 0;  // events applied at the last STATUS=
  uint64_t status_ns_ = 0;
  uint64_t last_window_ns_ = 0;
  bool stopping_ = false;
  bool started_ = false;  // Start() succeeded
  int pending_closes_ = 0;
  std::string http_address_;
  std::string ingest_address_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_DAEMON_H_
