#include "daemon/tracing/tracer.h"

#include <time.h>

#include <algorithm>
#include <random>
#include <utility>

#include "daemon/trace/span_builder.h"
#include "daemon/trace/trace_context.h"

namespace tokenmeter::daemon {
namespace {

constexpr DaemonMetric kOwned[] = {kOtlpSpans, kOtlpExportSeconds,
                                   kOtlpQueueSpans};

int64_t SystemOffsetNs() {
  timespec real{}, mono{};
  clock_gettime(CLOCK_REALTIME, &real);
  clock_gettime(CLOCK_MONOTONIC, &mono);
  const uint64_t unix_ns =
      uint64_t(real.tv_sec) * 1'000'000'000 + uint64_t(real.tv_nsec);
  const uint64_t mono_ns =
      uint64_t(mono.tv_sec) * 1'000'000'000 + uint64_t(mono.tv_nsec);
  return trace::UnixMinusMonotonicNs(unix_ns, mono_ns);
}

uint64_t SeedOf(uint64_t seed) {
  if (seed != 0) return seed;
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

// The export time histogram's bounds, seconds: 1 ms to a minute.
std::vector<double> ExportBounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
          0.5,   1,      2.5,   5,    10,    30,   60};
}

}  // namespace

Tracer::Tracer(Registry& registry, TracerOptions options,
               trace::OtlpEncoding encoding,
               const trace::TraceResource& resource)
    : options_(std::move(options)),
      ids_(SeedOf(options_.seed)),
      encoder_(encoding, resource),
      export_layout_(ExportBounds(), 1e9),
      export_seconds_(&export_layout_),
      registration_(registry, this, kOwned) {
  if (!options_.clock_offset) options_.clock_offset = SystemOffsetNs;
  // A request body never holds more spans than the exporter's queue
  // takes, so that a small --otlp-queue-spans still exports every batch.
  options_.max_batch_spans =
      std::clamp<uint64_t>(options_.max_batch_spans, 1,
                           std::max<uint64_t>(1, options_.max_queue_spans));
}

Tracer::~Tracer() = default;

Status Tracer::Create(uv_loop_t* loop, Registry& registry,
                      otlp::OtlpConfig config, TracerOptions options,
                      std::unique_ptr<Tracer>* out) {
  trace::TraceResource resource;
  resource.attributes = config.resource_attributes;
  resource.scope_version = options.version;
  const trace::OtlpEncoding encoding =
      config.protocol == otlp::Protocol::kHttpJson
          ? trace::OtlpEncoding::kJson
          : trace::OtlpEncoding::kProtobuf;
  otlp::OtlpExporterOptions eo;
  eo.max_queue_items = options.max_queue_spans;
  // One body at a time: results come in submission order, which
  // submitted_flags_ relies on.
  eo.max_in_flight = 1;
  eo.user_agent = "tokenmeterd/" + options.version;
  std::unique_ptr<Tracer> t(
      new Tracer(registry, std::move(options), encoding, resource));
  Tracer* self = t.get();
  eo.on_result = [self](const otlp::ExportResult& r) { self->OnResult(r); };
  Status s = otlp::OtlpHttpExporter::Create(loop, std::move(config), eo,
                                            &t->exporter_);
  if (!s.ok()) return s;
  uv_timer_init(loop, &t->timer_);
  t->timer_.data = self;
  const uint64_t ms =
      std::max<uint64_t>(1, self->options_.flush_interval_ns / 1'000'000);
  uv_timer_start(&t->timer_, OnTimer, ms, ms);
  uv_unref(reinterpret_cast<uv_handle_t*>(&t->timer_));
  *out = std::move(t);
  return Status::Ok();
}

void Tracer::OnRetired(trace::RequestTimeline& timeline, bool /*evicted*/) {
  ++stats_.requests_seen;
  const trace::TraceContext context =
      trace::ResolveTraceContext(timeline, ids_);
  if (!trace::KeepTrace(timeline, options_.sampling,
                        trace::TraceRandomness(context.trace_id))) {
    return;
  }
  if (encoder_.pending_spans() == 0) offset_ns_ = options_.clock_offset();
  batch_.Clear();
  const size_t n =
      trace::BuildSpans(timeline, context, {offset_ns_}, ids_, &batch_);
  if (n == 0) return;
  ++stats_.requests_traced;
  stats_.spans_built += n;
  if (shut_down_) {
    stats_.spans_dropped += n;
    return;
  }
  // A request's spans stay in one body; the pending ones go first when
  // the two would pass the batch size (one request alone may).
  if (encoder_.pending_spans() + n > options_.max_batch_spans) Flush();
  encoder_.Add(batch_);
  timeline.exported_trace_id.resize(32);
  trace::HexId(context.trace_id, timeline.exported_trace_id.data());
  auto exported = std::make_shared<bool>(false);
  timeline.trace_exported = exported;
  pending_flags_.push_back(std::move(exported));
  if (encoder_.pending_spans() >= options_.max_batch_spans) Flush();
}

void Tracer::Flush() {
  if (encoder_.pending_spans() == 0 || exporter_ == nullptr) return;
  std::string body;
  body.reserve(encoder_.pending_bytes() + encoder_.overhead_bytes());
  const size_t n = encoder_.Finish(&body);
  // In line before Submit(), which may answer a body it starts at once.
  // Refused bodies (queue full) are counted by the exporter as dropped and
  // never answered: their requests' flags stay false.
  submitted_flags_.push_back(std::move(pending_flags_));
  pending_flags_.clear();
  if (!exporter_->Submit(std::move(body), uint32_t(n))) {
    submitted_flags_.pop_back();
  }
}

void Tracer::OnTimer(uv_timer_t* t) { static_cast<Tracer*>(t->data)->Flush(); }

void Tracer::OnResult(const otlp::ExportResult& r) {
  if (!submitted_flags_.empty()) {
    if (r.kind == otlp::ExportResult::Kind::kExported) {
      for (const std::shared_ptr<bool>& f : submitted_flags_.front()) *f = true;
    }
    submitted_flags_.pop_front();
  }
  // A body that failed unsent (abandoned at the stop, refused by libcurl)
  // had no export to time.
  if (r.attempts == 0) return;
  export_seconds_.Observe(double(r.elapsed_ns));
}

void Tracer::Shutdown(uint64_t deadline_ns, std::function<void()> done) {
  Flush();
  shut_down_ = true;
  done_ = std::move(done);
  uv_timer_stop(&timer_);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), [](uv_handle_t* h) {
    Tracer* self = static_cast<Tracer*>(h->data);
    self->timer_closed_ = true;
    self->MaybeDone();
  });
  exporter_->Shutdown(deadline_ns, [this] {
    exporter_closed_ = true;
    MaybeDone();
  });
}

void Tracer::MaybeDone() {
  if (!timer_closed_ || !exporter_closed_ || !done_) return;
  std::function<void()> d = std::move(done_);
  done_ = nullptr;
  d();
}

TracerStats Tracer::stats() const {
  TracerStats s = stats_;
  const otlp::OtlpExporterStats e = exporter_->stats();
  s.spans_exported = e.exported_items;
  s.spans_dropped += e.dropped_items;
  s.spans_failed = e.failed_items;
  s.spans_pending = encoder_.pending_spans();
  return s;
}

void Tracer::Collect(DaemonMetric id, MetricWriter& w) const {
  const SampleLabels none;
  switch (id) {
    case kOtlpSpans: {
      const TracerStats s = stats();
      w.Sample(none.WithOwn("result", "exported"), s.spans_exported);
      w.Sample(none.WithOwn("result", "dropped"), s.spans_dropped);
      w.Sample(none.WithOwn("result", "failed"), s.spans_failed);
      return;
    }
    case kOtlpExportSeconds:
      w.HistogramSample(none, export_seconds_);
      return;
    case kOtlpQueueSpans: {
      const otlp::OtlpExporterStats e = exporter_->stats();
      w.Sample(none, e.queued_items + e.in_flight_items +
                         uint64_t(encoder_.pending_spans()));
      return;
    }
    default:
      return;
  }
}

}  // namespace tokenmeter::daemon
