// Daemon: owns the libuv loop and everything on it (registry, tracker,
// ingest listener, HTTP server, timers, signal handlers). main() builds one.
#ifndef TOKENMETER_DAEMON_DAEMON_H_
#define TOKENMETER_DAEMON_DAEMON_H_

#include <uv.h>

#include <memory>
#include <string>

#include "daemon/base/status.h"
#include "daemon/config.h"
#include "daemon/exposition/process_collector.h"
#include "daemon/http/server.h"
#include "daemon/ingest/ingest_server.h"
#include "daemon/ingest/ingest_stats.h"
#include "daemon/ingest/tracker.h"
#include "daemon/live/history.h"
#include "daemon/logging/summary.h"
#include "daemon/service/systemd.h"
#include "daemon/state/snapshot.h"
#include "daemon/store/registry.h"
#include "daemon/store/window_gauges.h"

namespace tokenmeter::daemon {

class Daemon {
 public:
  // Validates the configuration and builds the components (binds nothing).
  static Status Create(const Config& config, std::unique_ptr<Daemon>* out);
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
  Registry& registry() { return *registry_; }

 private:
  class SelfCollector;  // build info, scrape duration, HTTP and state counters
  explicit Daemon(const Config& config);
  // (Re)makes the registry and what registers with it (ingest stats,
  // tracker, ingest server, process and self collectors): at Create(), and
  // again when a snapshot failed to load halfway.
  Status BuildComponents();
  // --state-dir: reads this boot's id, loads DIR/snapshot if there is one.
  Status RestoreState();
  // A snapshot of the state now, unsealed (SaveCoreState(), then the
  // daemon's own counters), and the reverse of its payload; LoadPayload()
  // is true when it took the payload whole.
  void EncodeState(std::string* out);
  bool LoadPayload(StateReader& r);
  // The snapshot timer: encodes a snapshot on the loop and writes it on
  // libuv's thread pool (one at a time); OnSnapshotWritten() then lets the
  // ingest server send the ACKs it now may. WriteFinalSnapshot() at stop,
  // on the loop, once no write is in flight.
  void StartSnapshot();
  void OnSnapshotWritten(const Status& s);
  void WriteFinalSnapshot();
  void HandleMetrics(const http::Request& req, http::Response& resp);
  void OnStopped();
  void UpdateStatus();

  const Config config_;
  uv_loop_t loop_{};
  bool loop_initialized_ = false;
  SystemClock clock_;
  // Declared in dependency order: collectors register with the registry
  // and unregister (in reverse order) before it goes.
  std::unique_ptr<Registry> registry_;
  std::unique_ptr<IngestStats> ingest_stats_;
  std::unique_ptr<Tracker> tracker_;
  std::unique_ptr<IngestServer> ingest_;
  std::unique_ptr<http::Server> http_;
  std::unique_ptr<ProcessCollector> process_;
  std::unique_ptr<SelfCollector> self_;
  SummaryLog summary_;
  WindowGauges window_gauges_;
  uint64_t scrape_duration_ns_ = 0;  // the previous scrape's render
  uv_timer_t sweep_timer_{};
  uv_timer_t log_timer_{};
  uv_signal_t sigterm_{};
  uv_signal_t sigint_{};
  uv_timer_t watchdog_timer_{};
  uv_timer_t status_timer_{};
  // The live page's history (`/`, /api/v1/live), one point a second.
  live::History live_;
  uv_timer_t live_timer_{};
  // --state-dir.
  uv_timer_t snapshot_timer_{};
  std::string boot_id_;
  SnapshotFingerprint fingerprint_;
  bool restored_ = false;      // started from a snapshot
  uint64_t snapshots_ok_ = 0;  // tokenmeter_state_snapshots_total
  uint64_t snapshots_error_ = 0;
  struct SnapshotWrite;  // uv_work_t and its bytes
  bool snapshot_in_flight_ = false;
  bool final_snapshot_due_ = false;  // stopped while one was in flight
  bool snapshot_failing_ = false;    // the latest write failed (logged)
  size_t snapshot_bytes_ = 0;        // the latest snapshot's size, to reserve
  Notifier notifier_;
  uint64_t status_events_ = 0;  // events applied at the last STATUS=
  uint64_t status_ns_ = 0;
  uint64_t last_log_ns_ = 0;
  bool stopping_ = false;
  bool started_ = false;  // Start() succeeded
  int pending_closes_ = 0;
  std::string http_address_;
  std::string ingest_address_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_DAEMON_H_
