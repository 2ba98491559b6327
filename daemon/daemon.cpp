#include "daemon/daemon.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "daemon/exposition/exposition.h"
#include "daemon/exposition/proto_writer.h"
#include "daemon/http/negotiation.h"
#include "daemon/http/web_config.h"
#include "daemon/live/live_json.h"
#include "daemon/logging/summary.h"
#include "spdlog/spdlog.h"

namespace tokenmeter::daemon {
namespace {

// The local address of an inherited socket, for the --ready-fd line:
// "HOST:PORT", "[HOST6]:PORT" or a Unix socket path ("?" if unknown).
std::string LocalAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "";
  if (ss.ss_family == AF_UNIX) {
    const auto* un = reinterpret_cast<const sockaddr_un*>(&ss);
    const size_t n = len > offsetof(sockaddr_un, sun_path)
                         ? len - offsetof(sockaddr_un, sun_path)
                         : 0;
    return std::string(un->sun_path, strnlen(un->sun_path, n));
  }
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return fmt::format("{}:{}", host, ntohs(in->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return fmt::format("[{}]:{}", host, ntohs(in6->sin6_port));
  }
  return "?";
}

}  // namespace

// The daemon's own families: build info, the previous scrape's duration,
// and the HTTP server's response and refusal counts.
class Daemon::SelfCollector : public Collector {
 public:
  explicit SelfCollector(Daemon& d)
      : d_(d), registration_(*d.registry_, this, kOwned) {}
  SelfCollector(const SelfCollector&) = delete;
  SelfCollector& operator=(const SelfCollector&) = delete;

  void Collect(DaemonMetric id, MetricWriter& w) const override {
    const SampleLabels none;
    switch (id) {
      case kBuildInfo:
        w.Sample(none.WithOwn("version", TOKENMETER_VERSION), uint64_t{1});
        break;
      case kScrapeDuration:
        w.Sample(none, double(d_.scrape_duration_ns_) / 1e9);
        break;
      case kHttpResponses:
        for (size_t i = 0; i <= http::Server::kNumCountedStatuses; ++i) {
          const std::string code =
              i < http::Server::kNumCountedStatuses
                  ? std::to_string(http::Server::kCountedStatuses[i])
                  : "other";
          w.Sample(none.WithOwn("code", code), d_.http_->responses(i));
        }
        break;
      case kHttpConnectionsRejected:
        w.Sample(none, d_.http_->connections_rejected());
        break;
      case kStateSnapshots:
        w.Sample(none.WithOwn("result", "ok"), d_.snapshots_ok_);
        w.Sample(none.WithOwn("result", "error"), d_.snapshots_error_);
        break;
      case kStateRestored:
        w.Sample(none, uint64_t{d_.restored_ ? 1u : 0u});
        break;
      default:
        break;
    }
  }

 private:
  static constexpr DaemonMetric kOwned[] = {
      kBuildInfo,      kScrapeDuration,
      kHttpResponses,  kHttpConnectionsRejected,
      kStateSnapshots, kStateRestored};
  Daemon& d_;
  Registration registration_;
};

Daemon::Daemon(const Config& config) : config_(config) {}

// One snapshot write on libuv's thread pool.
struct Daemon::SnapshotWrite {
  uv_work_t req{};
  Daemon* daemon = nullptr;
  std::string dir;
  std::string bytes;
  Status result = Status::Ok();
};

Status Daemon::BuildComponents() {
  // Those that register with the registry go first.
  self_.reset();
  process_.reset();
  ingest_.reset();
  tracker_.reset();
  ingest_stats_.reset();
  registry_.reset();
  Status s = Registry::Create(config_.registry, &registry_);
  if (!s.ok()) return s;
  ingest_stats_ = std::make_unique<IngestStats>(*registry_);
  tracker_ = std::make_unique<Tracker>(*registry_, *ingest_stats_, clock_,
                                       config_.tracker);
  IngestOptions ingest_options = config_.ingest;
  ingest_options.ack_after_snapshot = !config_.state_dir.empty();
  ingest_ = std::make_unique<IngestServer>(&loop_, *registry_, *tracker_,
                                           *ingest_stats_, ingest_options);
  process_ = std::make_unique<ProcessCollector>(*registry_);
  self_ = std::make_unique<SelfCollector>(*this);
  return Status::Ok();
}

Status Daemon::Create(const Config& config, std::unique_ptr<Daemon>* out) {
  std::unique_ptr<Daemon> d(new Daemon(config));
  // The components keep &loop_, which is initialised below, before any of
  // them touches it.
  Status s = d->BuildComponents();
  if (!s.ok()) return s;
  // Before the loop exists: a bad file is a start-up error with nothing
  // to undo.
  http::WebConfig web;
  if (!config.web_config.empty()) {
    s = http::WebConfig::Load(config.web_config, &web);
    if (!s.ok()) return s;
  }
  const int rc = uv_loop_init(&d->loop_);
  if (rc != 0) {
    return Status::Error(std::string("uv_loop_init: ") + uv_strerror(rc));
  }
  d->loop_initialized_ = true;
  http::ServerOptions http_options;
  http_options.max_connections = config.http_max_connections;
  http_options.tls = std::move(web.tls);
  http_options.basic_auth = std::move(web.basic_auth);
  d->http_ = std::make_unique<http::Server>(&d->loop_, http_options);
  if (!config.state_dir.empty()) {
    s = d->RestoreState();
    if (!s.ok()) return s;
  }
  *out = std::move(d);
  return Status::Ok();
}

Status Daemon::RestoreState() {
  Status s = ReadBootId(config_.boot_id_file, &boot_id_);
  if (!s.ok()) return s;
  s = PrepareStateDir(config_.state_dir);
  if (!s.ok()) return s;
  fingerprint_ = SnapshotFingerprint::Of(config_, *registry_);
  bool applied = false;
  const LoadOutcome outcome = LoadSnapshot(config_.state_dir, boot_id_,
                                           fingerprint_, [&](StateReader& r) {
                                             applied = true;
                                             return LoadPayload(r);
                                           });
  if (outcome == LoadOutcome::kRestored) {
    restored_ = true;
    // The first window after the restart starts now, not at zero.
    summary_.StartWindows(*registry_);
    window_gauges_.Start(*registry_);
    spdlog::info(
        "state: restored {}/{}: {} engine series, {} requests in flight",
        config_.state_dir, kSnapshotName, registry_->series_count(),
        tracker_->size());
  } else if (applied) {
    // Half loaded: start from nothing rather than from part of it.
    snapshots_ok_ = snapshots_error_ = 0;
    s = BuildComponents();
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

void Daemon::EncodeState(std::string* out) {
  EncodeSnapshot(
      boot_id_, fingerprint_,
      [this](StateWriter& w) {
        SaveCoreState(w, *registry_, *tracker_, *ingest_stats_, *ingest_);
        // This snapshot counts itself: it is on disk, to be loaded, only if
        // its write succeeds.
        w.U64(snapshots_ok_ + 1);
        w.U64(snapshots_error_);
        http_->SaveState(w);  // last (see LoadPayload())
      },
      out);
}

bool Daemon::LoadPayload(StateReader& r) {
  LoadCoreState(r, *registry_, *tracker_, *ingest_stats_, *ingest_);
  snapshots_ok_ = r.U64();
  snapshots_error_ = r.U64();
  // The HTTP server outlives a failed load (BuildComponents() does not
  // remake it): it takes its counts only from a whole, valid payload.
  http_->LoadState(r);
  return r.ok() && r.at_end();
}

void Daemon::StartSnapshot() {
  if (snapshot_in_flight_ || stopping_) return;
  auto* write = new SnapshotWrite;
  write->daemon = this;
  write->bytes.reserve(snapshot_bytes_ + snapshot_bytes_ / 8);
  write->dir = config_.state_dir;
  write->req.data = write;
  EncodeState(&write->bytes);
  snapshot_bytes_ = write->bytes.size();
  snapshot_in_flight_ = true;
  const int rc = uv_queue_work(
      &loop_, &write->req,
      [](uv_work_t* req) {
        auto* w = static_cast<SnapshotWrite*>(req->data);
        SealSnapshot(&w->bytes);
        w->result = WriteFileAtomically(w->dir, kSnapshotName, w->bytes);
      },
      [](uv_work_t* req, int status) {
        std::unique_ptr<SnapshotWrite> w(
            static_cast<SnapshotWrite*>(req->data));
        Daemon* d = w->daemon;
        d->snapshot_in_flight_ = false;
        d->OnSnapshotWritten(status == 0 ? w->result
                                         : Status::Error(uv_strerror(status)));
        if (d->final_snapshot_due_) d->WriteFinalSnapshot();
      });
  if (rc != 0) {
    snapshot_in_flight_ = false;
    OnSnapshotWritten(
        Status::Error(std::string("uv_queue_work: ") + uv_strerror(rc)));
    delete write;
  }
}

void Daemon::OnSnapshotWritten(const Status& s) {
  if (s.ok()) {
    ++snapshots_ok_;
    if (snapshot_failing_) {
      snapshot_failing_ = false;
      spdlog::info("state: snapshots are written again");
    }
    ingest_->SnapshotWritten();
    return;
  }
  ++snapshots_error_;
  // Once per run of failures: a full disk would otherwise log every second.
  if (!snapshot_failing_) {
    snapshot_failing_ = true;
    spdlog::warn(
        "state: cannot write a snapshot: {}; ACKs wait until one is written, "
        "further failures are counted in tokenmeter_state_snapshots_total",
        s.message());
  }
}

void Daemon::WriteFinalSnapshot() {
  if (snapshot_in_flight_) {
    final_snapshot_due_ = true;
    return;
  }
  final_snapshot_due_ = false;
  std::string bytes;
  EncodeState(&bytes);
  SealSnapshot(&bytes);
  const Status s = WriteFileAtomically(config_.state_dir, kSnapshotName, bytes);
  if (s.ok()) {
    ++snapshots_ok_;
    spdlog::info("state: wrote {}/{} at stop ({} bytes, {} requests in flight)",
                 config_.state_dir, kSnapshotName, bytes.size(),
                 tracker_->size());
  } else {
    ++snapshots_error_;
    spdlog::error("state: cannot write the snapshot at stop: {}", s.message());
  }
}

Daemon::~Daemon() {
  if (loop_initialized_) {
    // Run() normally leaves nothing behind; this only matters after a
    // failed Start().
    if (!stopping_) Stop();
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
  }
}

Status Daemon::Start() {
  std::map<std::string, int> inherited = TakeInheritedSockets();
  const bool ingest_inherited = inherited.count("ingest") > 0;
  Status s = ingest_inherited ? ingest_->Adopt(inherited["ingest"])
                              : ingest_->Listen(config_.ingest_path);
  if (!s.ok()) return s;
  Daemon* self = this;
  http_->AddRoute("/metrics",
                  [self](const http::Request& req, http::Response& resp) {
                    self->HandleMetrics(req, resp);
                  });
  http_->AddRoute("/healthz", [](const http::Request&, http::Response& resp) {
    resp.status = 200;
    resp.content_type = "text/plain; charset=utf-8";
    resp.body = "ok\n";
  });
  http_->AddRoute("/", [](const http::Request&, http::Response& resp) {
    resp.content_type = std::string(live::kPageContentType);
    resp.headers.emplace_back("Content-Security-Policy", live::kPagePolicy);
    resp.compressible = true;
    resp.body = live::PageHtml();
  });
  // Not compressed: gzip would cost the loop more than the copy.
  http_->AddRoute("/api/v1/live",
                  [self](const http::Request&, http::Response& resp) {
                    resp.content_type = std::string(live::kJsonContentType);
                    resp.headers.emplace_back("Cache-Control", "no-store");
                    live::RenderJson(*self->registry_, self->live_, resp.body);
                  });
  const bool http_inherited = inherited.count("http") > 0;
  s = http_inherited ? http_->Adopt(inherited["http"])
                     : http_->Listen(config_.listen);
  if (!s.ok()) return s;
  ingest_address_ = ingest_inherited ? LocalAddress(inherited["ingest"])
                                     : config_.ingest_path;
  http_address_ =
      http_inherited
          ? LocalAddress(inherited["http"])
          : fmt::format("{}:{}",
                        config_.listen.substr(0, config_.listen.rfind(':')),
                        http_->port());
  for (const auto& [name, fd] : inherited) {
    if (name != "ingest" && name != "http") {
      spdlog::warn(
          "ignoring inherited socket \"{}\" (fd {}): expected "
          "FileDescriptorName=ingest or http",
          name, fd);
    }
  }

  uv_timer_init(&loop_, &sweep_timer_);
  sweep_timer_.data = this;
  uv_timer_start(
      &sweep_timer_,
      [](uv_timer_t* t) { static_cast<Daemon*>(t->data)->tracker_->Sweep(); },
      100, 100);
  uv_timer_init(&loop_, &log_timer_);
  log_timer_.data = this;
  last_log_ns_ = clock_.NowNs();
  {
    // The summary window: the log line's period, and the window of the
    // window gauges (10 s when the line is off).
    const uint64_t window_ns =
        config_.log_interval_ns > 0 ? config_.log_interval_ns : 10'000'000'000;
    const uint64_t ms = std::max<uint64_t>(1, window_ns / 1'000'000);
    uv_timer_start(
        &log_timer_,
        [](uv_timer_t* t) {
          auto* d = static_cast<Daemon*>(t->data);
          const uint64_t now = d->clock_.NowNs();
          const double window_s = double(now - d->last_log_ns_) / 1e9;
          d->window_gauges_.Update(*d->registry_, window_s);
          if (d->config_.log_interval_ns > 0) {
            d->summary_.LogAll(*d->registry_, window_s);
          }
          d->last_log_ns_ = now;
        },
        ms, ms);
  }
  for (uv_signal_t* sig : {&sigterm_, &sigint_}) {
    uv_signal_init(&loop_, sig);
    sig->data = this;
    uv_signal_start(
        sig,
        [](uv_signal_t* h, int signum) {
          spdlog::info("received signal {}; shutting down", signum);
          static_cast<Daemon*>(h->data)->Stop();
        },
        sig == &sigterm_ ? SIGTERM : SIGINT);
  }
  uv_timer_init(&loop_, &live_timer_);
  live_timer_.data = this;
  live_.Start(*registry_, clock_.NowNs());
  uv_timer_start(
      &live_timer_,
      [](uv_timer_t* t) {
        auto* d = static_cast<Daemon*>(t->data);
        timespec wall{};
        clock_gettime(CLOCK_REALTIME, &wall);
        d->live_.Tick(*d->registry_, d->clock_.NowNs(), wall.tv_sec);
      },
      1000, 1000);
  uv_timer_init(&loop_, &watchdog_timer_);
  watchdog_timer_.data = this;
  if (notifier_.watchdog_usec() > 0) {
    // Ping at half the interval systemd expects, from the loop itself, so
    // a stuck loop is what stops the pings.
    const uint64_t ms = std::max<uint64_t>(1, notifier_.watchdog_usec() / 2000);
    uv_timer_start(
        &watchdog_timer_,
        [](uv_timer_t* t) {
          static_cast<Daemon*>(t->data)->notifier_.Watchdog();
        },
        ms, ms);
  }
  uv_timer_init(&loop_, &status_timer_);
  status_timer_.data = this;
  status_ns_ = clock_.NowNs();
  if (notifier_.enabled()) {
    uv_timer_start(
        &status_timer_,
        [](uv_timer_t* t) { static_cast<Daemon*>(t->data)->UpdateStatus(); },
        5000, 5000);
  }
  uv_timer_init(&loop_, &snapshot_timer_);
  snapshot_timer_.data = this;
  if (!config_.state_dir.empty()) {
    const uint64_t ms =
        std::max<uint64_t>(1, config_.snapshot_interval_ns / 1'000'000);
    uv_timer_start(
        &snapshot_timer_,
        [](uv_timer_t* t) { static_cast<Daemon*>(t->data)->StartSnapshot(); },
        ms, ms);
  }
  spdlog::info("tokenmeterd {} listening: ingest {} http port {}{}",
               TOKENMETER_VERSION,
               ingest_inherited ? "(inherited socket)" : config_.ingest_path,
               http_->port(), http_inherited ? " (inherited socket)" : "");
  // Both listeners are live: the only moment READY=1 may be sent.
  notifier_.Ready();
  started_ = true;
  UpdateStatus();
  return Status::Ok();
}

void Daemon::HandleMetrics(const http::Request& req, http::Response& resp) {
  const uint64_t start_ns = clock_.NowNs();
  const http::Format format = http::ChooseFormat(req.accept);
  resp.status = 200;
  resp.content_type = std::string(http::ContentType(format));
  resp.compressible = true;
  resp.body.reserve(64 * 1024);
  switch (format) {
    case http::Format::kText004:
      Render(*registry_, ExpositionFormat::kText004, resp.body);
      break;
    case http::Format::kOpenMetrics100:
      Render(*registry_, ExpositionFormat::kOpenMetrics100, resp.body);
      break;
    case http::Format::kProtobufDelimited: {
      ProtoWriter w(resp.body);
      Render(*registry_, w);
      break;
    }
  }
  scrape_duration_ns_ = clock_.NowNs() - start_ns;
}

void Daemon::UpdateStatus() {
  const uint64_t events = ingest_stats_->events_total();
  const uint64_t now = clock_.NowNs();
  const double rate = now > status_ns_ ? double(events - status_events_) /
                                             (double(now - status_ns_) / 1e9)
                                       : 0;
  status_events_ = events;
  status_ns_ = now;
  notifier_.Status(fmt::format("{} engine connections, {:.0f} events/s",
                               ingest_stats_->connections(), rate));
}

void Daemon::Stop() {
  if (stopping_) return;
  stopping_ = true;
  notifier_.Stopping();
  auto close_handle = [this](uv_handle_t* h) {
    if (h->loop == nullptr || uv_is_closing(h)) return;
    ++pending_closes_;
    h->data = this;
    uv_close(h, [](uv_handle_t* handle) {
      auto* d = static_cast<Daemon*>(handle->data);
      if (--d->pending_closes_ == 0) d->OnStopped();
    });
  };
  ++pending_closes_;  // held until every close below has been started
  close_handle(reinterpret_cast<uv_handle_t*>(&sweep_timer_));
  close_handle(reinterpret_cast<uv_handle_t*>(&log_timer_));
  close_handle(reinterpret_cast<uv_handle_t*>(&sigterm_));
  close_handle(reinterpret_cast<uv_handle_t*>(&sigint_));
  close_handle(reinterpret_cast<uv_handle_t*>(&watchdog_timer_));
  close_handle(reinterpret_cast<uv_handle_t*>(&status_timer_));
  close_handle(reinterpret_cast<uv_handle_t*>(&snapshot_timer_));
  close_handle(reinterpret_cast<uv_handle_t*>(&live_timer_));
  ++pending_closes_;
  ingest_->Close([this] {
    if (--pending_closes_ == 0) OnStopped();
  });
  ++pending_closes_;
  http_->Close([this] {
    if (--pending_closes_ == 0) OnStopped();
  });
  if (--pending_closes_ == 0) OnStopped();
}

void Daemon::OnStopped() {
  // After a failed Start() there is nothing to sum up: the error was the
  // message.
  if (!started_) return;
  // Everything the connections had sent is applied: the last snapshot
  // holds it all.
  if (!config_.state_dir.empty()) WriteFinalSnapshot();
  spdlog::info("stopped: {} events applied, {} frames accepted since start",
               ingest_stats_->events_total(), ingest_stats_->frames());
}

int Daemon::Run() {
  uv_run(&loop_, UV_RUN_DEFAULT);
  // Every handle must be closed by now (libuv's rule, and ours).
  const int rc = uv_loop_close(&loop_);
  if (rc != 0) {
    spdlog::error("the loop still has open handles at exit: {}",
                  uv_strerror(rc));
    return 1;
  }
  loop_initialized_ = false;
  return 0;
}

}  // namespace tokenmeter::daemon
