#include "daemon/daemon.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstring>

#include "daemon/exposition/exposition.h"
#include "daemon/exposition/proto_writer.h"
#include "daemon/http/listen_address.h"
#include "daemon/http/negotiation.h"
#include "daemon/http/web_config.h"
#include "daemon/live/live_json.h"
#include "daemon/logging/summary.h"
#include "daemon/pushing/metrics_pusher.h"
#include "daemon/requests/requests_json.h"
#include "daemon/snapshot_bound.h"
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
      : d_(d), registration_(d.registry(), this, kOwned) {}
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
      default:
        break;
    }
  }

 private:
  static constexpr DaemonMetric kOwned[] = {
      kBuildInfo, kScrapeDuration, kHttpResponses, kHttpConnectionsRejected};
  Daemon& d_;
  Registration registration_;
};

struct Daemon::Timer {
  uv_timer_t handle{};
  std::function<void()> tick;
};

Daemon::Daemon(const Config& config) : config_(config) {}

Status Daemon::BuildPipeline() {
  PipelineOptions options{config_.registry, config_.tracker, config_.ingest};
  options.ingest.ack_after_snapshot = !config_.state_dir.empty();
  pipeline_.reset();
  // The server keeps &loop_, which is initialised before it listens.
  return Pipeline::Create(&loop_, clock_, options, &pipeline_);
}

Status Daemon::Create(const Config& config, std::unique_ptr<Daemon>* out) {
  std::unique_ptr<Daemon> d(new Daemon(config));
  Status s = d->BuildPipeline();
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
  SnapshotterOptions snapshots{config.state_dir, config.snapshot_interval_ns,
                               config.boot_id_file, config.state_dir_unsafe_ok};
  snapshots.max_snapshot_bytes =
      MaxSnapshotBytes(config, d->registry(), d->pipeline_->Fingerprint())
          .total;
  s = Snapshotter::Create(&d->loop_, snapshots, &d->snapshotter_);
  if (!s.ok()) return s;
  s = d->Restore();
  if (!s.ok()) return s;
  // The collectors outside the pipeline, on the registry that stays.
  d->process_ = std::make_unique<ProcessCollector>(d->registry());
  d->self_ = std::make_unique<SelfCollector>(*d);
  d->snapshotter_->Expose(d->registry());
  s = d->StartTracing();
  if (!s.ok()) return s;
  s = d->StartMetricsPush();
  if (!s.ok()) return s;
  // After the tracer: the keeper shows the trace id it exported under.
  if (config.keep_requests != 0) {
    requests::RequestKeeperOptions keep;
    keep.keep = config.keep_requests;
    d->keeper_ = std::make_unique<requests::RequestKeeper>(keep);
    d->pipeline_->tracker().AddTimelineSink(d->keeper_.get());
  }
  *out = std::move(d);
  return Status::Ok();
}

Status Daemon::StartTracing() {
  otlp::OtlpConfig otlp;
  Status s = otlp::ParseOtlpConfig(otlp::Signal::kTraces, config_.otlp_traces,
                                   otlp::ProcessOtlpEnvironment(), &otlp);
  if (!s.ok()) return s;
  if (!otlp.enabled()) return Status::Ok();
  TracerOptions options;
  options.sampling.ratio = config_.trace_ratio;
  if (config_.trace_slower_than_ns != 0) {
    options.sampling.slower_than_ns = config_.trace_slower_than_ns;
  }
  options.max_queue_spans = config_.otlp_queue_spans;
  options.version = TOKENMETER_VERSION;
  const std::string endpoint = otlp.endpoint;
  s = Tracer::Create(&loop_, registry(), std::move(otlp), std::move(options),
                     &tracer_);
  if (!s.ok()) return s;
  pipeline_->tracker().AddTimelineSink(tracer_.get());
  started_notes_.push_back(fmt::format(
      "tracing: OTLP spans to {} (ratio {}, slower than {})", endpoint,
      config_.trace_ratio,
      config_.trace_slower_than_ns == 0
          ? std::string("off")
          : fmt::format("{} s", double(config_.trace_slower_than_ns) / 1e9)));
  return Status::Ok();
}

namespace {

// The metrics push's service.instance.id unless OTEL_RESOURCE_ATTRIBUTES
// gives one: "HOST:PORT", this machine's name and the --listen port, as a
// scrape's `instance` label names a target (what Prometheus' OTLP
// ingestion turns it into), so that two daemons pushing to one backend
// make two series, not one that jumps between them. The host name alone
// when it has no port (0: a free port) or the name cannot be read
// ("localhost" then).
std::string DefaultInstanceId(const Config& config) {
  char name[256] = {};
  std::string host = gethostname(name, sizeof name - 1) == 0 && name[0] != 0
                         ? std::string(name)
                         : std::string("localhost");
  http::ListenAddress address;
  if (http::ParseListenAddress(config.listen, &address).ok() &&
      address.port != 0) {
    host += ':';
    host += std::to_string(address.port);
  }
  return host;
}

// The metrics push's OTLP overrides: the traces' flags with its own
// endpoint, and a default service.instance.id.
otlp::OtlpOverrides MetricsOverrides(const Config& config) {
  otlp::OtlpOverrides overrides = config.otlp_traces;
  overrides.endpoint = config.otlp_metrics_endpoint;
  overrides.default_instance_id = DefaultInstanceId(config);
  return overrides;
}

// The interval between pushes: --otlp-metrics-interval, else
// OTEL_METRIC_EXPORT_INTERVAL in milliseconds as the OpenTelemetry SDKs
// read it (unset or empty: not given, *ns left as it is), below 1000
// raised to the daemon's 1 s floor (*raised set), which the SDKs' values
// (any positive count) may go under.
Status MetricsInterval(const Config& config, const otlp::Environment& env,
                       uint64_t* ns, bool* raised) {
  *raised = false;
  if (config.otlp_metrics_interval_ns.has_value()) {
    *ns = *config.otlp_metrics_interval_ns;
    return Status::Ok();
  }
  auto it = env.find("OTEL_METRIC_EXPORT_INTERVAL");
  if (it == env.end() || it->second.empty()) return Status::Ok();
  uint64_t ms = 0;
  const std::string& v = it->second;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), ms);
  if (ec != std::errc() || end != v.data() + v.size() || ms < 1 ||
      ms > 10'000'000'000) {
    return Status::Error("OTEL_METRIC_EXPORT_INTERVAL: \"" + v +
                         "\" is not a whole number of milliseconds from "
                         "1 to 10000000000");
  }
  *raised = ms < 1000;
  *ns = std::max<uint64_t>(ms, 1000) * 1'000'000;
  return Status::Ok();
}

}  // namespace

Status Daemon::CheckOtlpSettings(const Config& config) {
  const otlp::Environment env = otlp::ProcessOtlpEnvironment();
  otlp::OtlpConfig traces;
  Status s = otlp::ParseOtlpConfig(otlp::Signal::kTraces, config.otlp_traces,
                                   env, &traces);
  if (!s.ok()) return s;
  otlp::OtlpConfig metrics;
  s = otlp::ParseOtlpConfig(otlp::Signal::kMetrics, MetricsOverrides(config),
                            env, &metrics);
  if (!s.ok() || !metrics.enabled()) return s;
  uint64_t ns = 0;
  bool raised = false;
  return MetricsInterval(config, env, &ns, &raised);
}

Status Daemon::StartMetricsPush() {
  const otlp::Environment env = otlp::ProcessOtlpEnvironment();
  otlp::OtlpConfig otlp;
  Status s = otlp::ParseOtlpConfig(otlp::Signal::kMetrics,
                                   MetricsOverrides(config_), env, &otlp);
  if (!s.ok()) return s;
  if (!otlp.enabled()) return Status::Ok();
  MetricsPusherOptions options;
  bool raised = false;
  s = MetricsInterval(config_, env, &options.interval_ns, &raised);
  if (!s.ok()) return s;
  options.histograms = config_.otlp_histograms_explicit
                           ? otlp_metrics::HistogramForm::kExplicit
                           : otlp_metrics::HistogramForm::kExponential;
  options.max_queue_points = config_.otlp_queue_spans;
  options.version = TOKENMETER_VERSION;
  options.clock = &clock_;
  const std::string endpoint = otlp.endpoint;
  const double interval_s = double(options.interval_ns) / 1e9;
  s = MetricsPusher::Create(&loop_, registry(), std::move(otlp),
                            std::move(options), &pusher_);
  if (!s.ok()) return s;
  started_notes_.push_back(fmt::format(
      "metrics: OTLP push to {} every {} s ({} histograms){}", endpoint,
      interval_s, config_.otlp_histograms_explicit ? "explicit" : "exponential",
      raised ? fmt::format("; OTEL_METRIC_EXPORT_INTERVAL {} ms is below "
                           "the daemon's 1 s floor",
                           env.at("OTEL_METRIC_EXPORT_INTERVAL"))
             : std::string()));
  return Status::Ok();
}

Status Daemon::Restore() {
  if (!snapshotter_->enabled()) return Status::Ok();
  bool applied = false;
  const LoadOutcome outcome = snapshotter_->Restore(
      pipeline_->Fingerprint(),
      [this](StateReader& r) { return LoadPayload(r); }, &applied);
  if (outcome == LoadOutcome::kRestored) {
    // The first window after the restart starts now, not at zero.
    summary_.Restart(registry());
    window_gauges_.Restart(registry());
    started_notes_.push_back(fmt::format(
        "state: restored {}/{}: {} engine series, {} requests in flight",
        config_.state_dir, kSnapshotName, registry().series_count(),
        pipeline_->tracker().size()));
  } else if (applied) {
    // Half loaded: start from nothing rather than from part of it.
    return BuildPipeline();
  }
  return Status::Ok();
}

void Daemon::EncodeState(StateWriter& w) {
  pipeline_->SaveState(w);
  snapshotter_->SaveState(w);
  http_->SaveState(w);  // last (see LoadPayload())
}

bool Daemon::LoadPayload(StateReader& r) {
  pipeline_->LoadState(r);
  snapshotter_->LoadState(r);
  // The HTTP server outlives a failed load (BuildPipeline() does not
  // remake it): it takes its counts only from a whole, valid payload.
  http_->LoadState(r);
  return r.ok() && r.at_end();
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
  const auto take = [&inherited](const std::string& name) {
    auto it = inherited.find(name);
    if (it == inherited.end()) return -1;
    const int fd = it->second;
    inherited.erase(it);
    return fd;
  };
  const int ingest_fd = take("ingest");
  const int http_fd = take("http");
  Status s = StartIngest(ingest_fd);
  if (!s.ok()) return s;
  AddRoutes();
  s = StartHttp(http_fd);
  if (!s.ok()) return s;
  for (const std::string& note : started_notes_) spdlog::info("{}", note);
  started_notes_.clear();
  for (const auto& [name, fd] : inherited) {
    spdlog::warn(
        "ignoring inherited socket \"{}\" (fd {}): expected "
        "FileDescriptorName=ingest or http",
        name, fd);
  }
  StartSignals();
  StartTimers();
  snapshotter_->Start(
      pipeline_->Fingerprint(), [this](StateWriter& w) { EncodeState(w); },
      [this] { pipeline_->server().SnapshotWritten(); });
  spdlog::info("tokenmeterd {} listening: ingest {} http port {}{}",
               TOKENMETER_VERSION,
               ingest_fd >= 0 ? "(inherited socket)" : config_.ingest_path,
               http_->port(), http_fd >= 0 ? " (inherited socket)" : "");
  // Both listeners are live: the only moment READY=1 may be sent.
  notifier_.Ready();
  started_ = true;
  UpdateStatus();
  return Status::Ok();
}

Status Daemon::StartIngest(int inherited_fd) {
  if (inherited_fd >= 0) {
    Status s = pipeline_->server().Adopt(inherited_fd);
    if (s.ok()) ingest_address_ = LocalAddress(inherited_fd);
    return s;
  }
  Status s = pipeline_->server().Listen(config_.ingest_path);
  if (s.ok()) ingest_address_ = config_.ingest_path;
  return s;
}

Status Daemon::StartHttp(int inherited_fd) {
  if (inherited_fd >= 0) {
    Status s = http_->Adopt(inherited_fd);
    if (s.ok()) http_address_ = LocalAddress(inherited_fd);
    return s;
  }
  Status s = http_->Listen(config_.listen);
  if (s.ok()) {
    http_address_ = fmt::format(
        "{}:{}", config_.listen.substr(0, config_.listen.rfind(':')),
        http_->port());
  }
  return s;
}

void Daemon::AddRoutes() {
  http_->AddRoute("/metrics",
                  [this](const http::Request& req, http::Response& resp) {
                    HandleMetrics(req, resp);
                  });
  http_->AddRoute("/healthz", [](const http::Request&, http::Response& resp) {
    resp.status = 200;
    resp.content_type = "text/plain; charset=utf-8";
    resp.body = "ok\n";
  });
  live::AddRoutes(*http_, registry(), live_);
  if (keeper_ != nullptr) requests::AddRoutes(*http_, *keeper_, clock_);
}

void Daemon::StartSignals() {
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
  signals_started_ = true;
}

void Daemon::StartTimers() {
  // The loop's cached time is that of its last iteration (or its init):
  // refreshed, so that each timer's first tick comes one period after the
  // marks taken below with the clock (the live history's first rate).
  uv_update_time(&loop_);
  // Retire finished requests, evict idle ones.
  Every(100, [this] { pipeline_->tracker().Sweep(); });
  // The summary window: the log line's period, and the window of the
  // window gauges (10 s when the line is off).
  const uint64_t window_ns =
      config_.log_interval_ns > 0 ? config_.log_interval_ns : 10'000'000'000;
  last_window_ns_ = clock_.NowNs();
  Every(std::max<uint64_t>(1, window_ns / 1'000'000), [this] { EndWindow(); });
  // The live page: one point a second.
  live_.Start(registry(), clock_.NowNs());
  Every(1000, [this] {
    live_.Tick(registry(), clock_.NowNs(), int64_t(clock_.UnixNowS()));
  });
  // systemd's watchdog, pinged at half its interval from the loop itself,
  // so a stuck loop is what stops the pings.
  if (notifier_.watchdog_usec() > 0) {
    Every(std::max<uint64_t>(1, notifier_.watchdog_usec() / 2000),
          [this] { notifier_.Watchdog(); });
  }
  status_ns_ = clock_.NowNs();
  if (notifier_.enabled()) Every(5000, [this] { UpdateStatus(); });
}

void Daemon::Every(uint64_t ms, std::function<void()> tick) {
  auto timer = std::make_unique<Timer>();
  timer->tick = std::move(tick);
  uv_timer_init(&loop_, &timer->handle);
  timer->handle.data = timer.get();
  uv_timer_start(
      &timer->handle,
      [](uv_timer_t* t) { static_cast<Timer*>(t->data)->tick(); }, ms, ms);
  timers_.push_back(std::move(timer));
}

void Daemon::EndWindow() {
  const uint64_t now = clock_.NowNs();
  const double window_s = double(now - last_window_ns_) / 1e9;
  window_gauges_.Update(registry(), window_s);
  if (config_.log_interval_ns > 0) summary_.LogAll(registry(), window_s);
  last_window_ns_ = now;
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
      Render(registry(), ExpositionFormat::kText004, resp.body);
      break;
    case http::Format::kOpenMetrics100:
      Render(registry(), ExpositionFormat::kOpenMetrics100, resp.body);
      break;
    case http::Format::kProtobufDelimited: {
      ProtoWriter w(resp.body);
      Render(registry(), w);
      break;
    }
  }
  scrape_duration_ns_ = clock_.NowNs() - start_ns;
}

void Daemon::UpdateStatus() {
  const IngestStats& stats = pipeline_->stats();
  const uint64_t events = stats.events_total();
  const uint64_t now = clock_.NowNs();
  const double rate = now > status_ns_ ? double(events - status_events_) /
                                             (double(now - status_ns_) / 1e9)
                                       : 0;
  status_events_ = events;
  status_ns_ = now;
  notifier_.Status(fmt::format("{} engine connections, {:.0f} events/s",
                               stats.connections(), rate));
}

void Daemon::Stop() {
  if (stopping_) return;
  stopping_ = true;
  notifier_.Stopping();
  const auto closed = [this] {
    if (--pending_closes_ == 0) OnStopped();
  };
  auto close_handle = [this](uv_handle_t* h) {
    if (uv_is_closing(h)) return;
    ++pending_closes_;
    h->data = this;
    uv_close(h, [](uv_handle_t* handle) {
      auto* d = static_cast<Daemon*>(handle->data);
      if (--d->pending_closes_ == 0) d->OnStopped();
    });
  };
  ++pending_closes_;  // held until every close below has been started
  for (const std::unique_ptr<Timer>& t : timers_) {
    close_handle(reinterpret_cast<uv_handle_t*>(&t->handle));
  }
  if (signals_started_) {
    close_handle(reinterpret_cast<uv_handle_t*>(&sigterm_));
    close_handle(reinterpret_cast<uv_handle_t*>(&sigint_));
  }
  // After a failed Create() some of these may not exist.
  if (snapshotter_ != nullptr) {
    ++pending_closes_;
    snapshotter_->Close(closed);
  }
  if (http_ != nullptr) {
    ++pending_closes_;
    http_->Close(closed);
  }
  // The exports end after the engine connections have been read to their
  // end, so that they carry what those last reads applied.
  ++pending_closes_;
  const auto export_rest = [this, closed] {
    // Without a state directory nothing outlives the stop: the requests
    // finished within their grace period are retired now, so that their
    // traces go out (with one, they are saved and retired after the
    // restart, traced once).
    if (pipeline_ != nullptr &&
        (snapshotter_ == nullptr || !snapshotter_->enabled())) {
      pipeline_->tracker().RetireFinished();
    }
    if (tracer_ != nullptr) {
      // What is pending goes out, for at most kTraceDrainNs; then the rest
      // is counted failed.
      ++pending_closes_;
      tracer_->Shutdown(clock_.NowNs() + kTraceDrainNs, closed);
    }
    if (pusher_ != nullptr) {
      // A last push of the values at stop, sent within the same drain time.
      ++pending_closes_;
      pusher_->Shutdown(clock_.NowNs() + kTraceDrainNs, closed);
    }
    closed();
  };
  if (pipeline_ != nullptr) {
    pipeline_->server().Close(export_rest);
  } else {
    export_rest();
  }
  closed();
}

void Daemon::OnStopped() {
  // After a failed Start() there is nothing to sum up: the error was the
  // message.
  if (!started_) return;
  // Everything the connections had sent is applied: the last snapshot
  // holds it all.
  if (snapshotter_->enabled()) {
    snapshotter_->WriteFinal(
        fmt::format("{} requests in flight", pipeline_->tracker().size()));
  }
  const IngestStats& stats = pipeline_->stats();
  spdlog::info("stopped: {} events applied, {} frames accepted since start",
               stats.events_total(), stats.frames());
  if (pusher_ != nullptr) {
    // The catalog has no series for the metrics push: its counts, once.
    const MetricsPusherStats p = pusher_->stats();
    spdlog::info(
        "metrics push: {} pushes, data points: {} exported, {} dropped "
        "(queue full), {} failed, {} not sent",
        p.pushes, p.points_exported, p.points_dropped, p.points_failed,
        p.points_queued);
  }
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
