#include "daemon/pushing/metrics_pusher.h"

#include <algorithm>
#include <utility>

#include "daemon/exposition/exposition.h"
#include "daemon/store/catalog.h"

namespace tokenmeter::daemon {
namespace {

uint64_t SystemUnixNs() {
  static const SystemClock clock;
  return UnixNowNs(clock);
}

}  // namespace

MetricsPusher::MetricsPusher(const Registry& registry,
                             MetricsPusherOptions options,
                             otlp_metrics::OtlpMetricsOptions encoder_options)
    : registry_(registry),
      options_(std::move(options)),
      encoder_([this, &encoder_options] {
        // Each point's start: its engine series' (found by the series'
        // label text, which a series' own samples carry), else the
        // registry's: the daemon families and the per-request-label cells;
        // this process's for the families that start again with it.
        encoder_options.start_time = [this](std::string_view name,
                                            const SampleLabels& labels) {
          auto it = starts_.find(labels.text);
          if (it != starts_.end() && it->second != 0) return it->second;
          return CountsFromProcessStart(name)
                     ? registry_.process_start_unix_ns()
                     : registry_.start_unix_ns();
        };
        return std::move(encoder_options);
      }()) {}

MetricsPusher::~MetricsPusher() = default;

Status MetricsPusher::Create(uv_loop_t* loop, const Registry& registry,
                             otlp::OtlpConfig config,
                             MetricsPusherOptions options,
                             std::unique_ptr<MetricsPusher>* out) {
  otlp_metrics::OtlpMetricsOptions eo;
  eo.encoding = config.protocol == otlp::Protocol::kHttpJson
                    ? otlp_metrics::OtlpEncoding::kJson
                    : otlp_metrics::OtlpEncoding::kProtobuf;
  eo.histograms = options.histograms;
  eo.resource_attributes = config.resource_attributes;
  eo.scope_version = options.version;
  otlp::OtlpExporterOptions xo;
  xo.max_queue_items = std::max<uint64_t>(1, options.max_queue_points);
  xo.user_agent = "tokenmeterd/" + options.version;
  const uint64_t interval_ns = std::max<uint64_t>(1, options.interval_ns);
  std::unique_ptr<MetricsPusher> p(
      new MetricsPusher(registry, std::move(options), std::move(eo)));
  Status s = otlp::OtlpHttpExporter::Create(loop, std::move(config), xo,
                                            &p->exporter_);
  if (!s.ok()) return s;
  uv_timer_init(loop, &p->timer_);
  p->timer_.data = p.get();
  const uint64_t ms = std::max<uint64_t>(1, interval_ns / 1'000'000);
  uv_timer_start(&p->timer_, OnTimer, ms, ms);
  uv_unref(reinterpret_cast<uv_handle_t*>(&p->timer_));
  *out = std::move(p);
  return Status::Ok();
}

void MetricsPusher::Push() {
  if (exporter_ == nullptr) return;
  if (starts_series_ != registry_.series_count()) {
    starts_series_ = registry_.series_count();
    starts_.clear();
    registry_.ForEachSeries([this](const EngineSeries& s) {
      starts_.emplace(s.label_text(), s.start_unix_ns());
    });
  }
  const uint64_t now =
      options_.clock != nullptr ? UnixNowNs(*options_.clock) : SystemUnixNs();
  encoder_.Reset(now);
  Render(registry_, encoder_);
  if (encoder_.data_points() == 0) return;
  ++pushes_;
  // A body the queue cannot take is counted by the exporter as dropped.
  exporter_->Submit(encoder_.body(), uint32_t(std::min<size_t>(
                                         encoder_.data_points(), UINT32_MAX)));
}

void MetricsPusher::OnTimer(uv_timer_t* t) {
  static_cast<MetricsPusher*>(t->data)->Push();
}

void MetricsPusher::Shutdown(uint64_t deadline_ns, std::function<void()> done) {
  if (shut_down_) return;
  Push();
  shut_down_ = true;
  done_ = std::move(done);
  uv_timer_stop(&timer_);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), [](uv_handle_t* h) {
    auto* self = static_cast<MetricsPusher*>(h->data);
    self->timer_closed_ = true;
    self->MaybeDone();
  });
  exporter_->Shutdown(deadline_ns, [this] {
    exporter_closed_ = true;
    MaybeDone();
  });
}

void MetricsPusher::MaybeDone() {
  if (!timer_closed_ || !exporter_closed_ || !done_) return;
  auto done = std::move(done_);
  done_ = nullptr;
  done();
}

MetricsPusherStats MetricsPusher::stats() const {
  MetricsPusherStats st;
  st.pushes = pushes_;
  if (exporter_ != nullptr) {
    const otlp::OtlpExporterStats x = exporter_->stats();
    st.points_exported = x.exported_items;
    st.points_dropped = x.dropped_items;
    st.points_failed = x.failed_items;
    st.points_queued = x.queued_items + x.in_flight_items;
  }
  return st;
}

}  // namespace tokenmeter::daemon
