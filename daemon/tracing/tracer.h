// The tracer: turns the tracker's retired request timelines into OTLP
// spans and hands them to the OTLP/HTTP transport (docs/traces.md).
//
// At each retirement (Tracker → trace::TimelineSink::OnRetired) it decides
// whether the request is traced (trace/sampling.h: failed and slow ones
// always, a parent's sampled flag, else --trace-ratio), builds its spans
// (trace/span_builder.h) and encodes them at once into the pending export
// request (trace/otlp_trace_encoder.h); the timeline is freed. A request
// body goes to the exporter when it holds max_batch_spans spans or when
// the flush timer finds spans pending (every flush_interval_ns), so a span
// waits at most that long before it is sent. The exporter's queue bound
// (--otlp-queue-spans) limits what waits for the receiver; past it, spans
// are dropped and counted, never waited for: nothing here blocks ingest.
//
// Clock: spans carry Unix times. The offset Unix − CLOCK_MONOTONIC is read
// once per export request, when its first span is built (two adjacent
// clock_gettime() calls; the engines stamp CLOCK_MONOTONIC of the same
// host), and applied to every span of that request (docs/traces.md, "Clock
// conversion").
//
// Owns tokenmeter_otlp_spans_total{result}, tokenmeter_otlp_export_seconds
// and tokenmeter_otlp_queue_spans. Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_TRACING_TRACER_H_
#define TOKENMETER_DAEMON_TRACING_TRACER_H_

#include <uv.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/base/status.h"
#include "daemon/otlp/otlp_config.h"
#include "daemon/otlp/otlp_http_exporter.h"
#include "daemon/store/histogram.h"
#include "daemon/store/metric_writer.h"
#include "daemon/store/registry.h"
#include "daemon/trace/ids.h"
#include "daemon/trace/otlp_trace_encoder.h"
#include "daemon/trace/sampling.h"
#include "daemon/trace/span.h"
#include "daemon/trace/timeline.h"

namespace tokenmeter::daemon {

struct TracerOptions {
  trace::SamplingOptions sampling;
  // Spans per export request at most (and at most max_queue_spans); one
  // request's spans are never split, so a request with more makes a body
  // of its own.
  size_t max_batch_spans = 512;
  // How long a span may wait for its request to fill.
  uint64_t flush_interval_ns = 1'000'000'000;
  // --otlp-queue-spans: spans waiting in the exporter's queue at most.
  uint64_t max_queue_spans = 65536;
  // The daemon's version (the instrumentation scope's).
  std::string version;
  // Seeds the trace and span ids; 0: from std::random_device.
  uint64_t seed = 0;
  // Unix − CLOCK_MONOTONIC in ns, read per export request; null: the
  // system clocks. For tests.
  std::function<int64_t()> clock_offset;
};

// Counters since Create (spans).
struct TracerStats {
  uint64_t requests_seen = 0;    // timelines handed over
  uint64_t requests_traced = 0;  // kept by sampling, with at least a span
  uint64_t spans_built = 0;
  uint64_t spans_exported = 0;
  uint64_t spans_dropped = 0;  // the exporter's queue was full
  uint64_t spans_failed = 0;   // gave up, refused, or rejected
  uint64_t spans_pending = 0;  // built, not yet handed to the exporter
};

class Tracer : public trace::TimelineSink, public Collector {
 public:
  // `config` must be enabled (an endpoint). Creates the exporter on `loop`
  // (OtlpHttpExporter::Create's errors: one line) and the flush timer, and
  // registers the tracer's daemon families with `registry`.
  static Status Create(uv_loop_t* loop, Registry& registry,
                       otlp::OtlpConfig config, TracerOptions options,
                       std::unique_ptr<Tracer>* out);
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;
  // Requires Shutdown()'s `done` to have run.
  ~Tracer() override;

  // trace::TimelineSink. Cost: the sampling decision; for a traced request
  // the spans' build and encoding (a few µs, docs/performance.md) and,
  // when the batch is full, the exporter's Submit (with gzip, a deflate).
  // Writes the trace id of a request it traces into the timeline's
  // exported_trace_id, and trace_exported, which turns true once the
  // receiver accepted the body holding its spans (for the requests API).
  void OnRetired(trace::RequestTimeline& timeline, bool evicted) override;

  // Sends the pending spans now (also what the timer does).
  void Flush();
  // Flushes, then stops the exporter at `deadline_ns` (CLOCK_MONOTONIC)
  // and closes the timer; `done` runs on the loop once all is closed.
  // Later retirements are counted as dropped. Call once.
  void Shutdown(uint64_t deadline_ns, std::function<void()> done);

  TracerStats stats() const;

  void Collect(DaemonMetric id, MetricWriter& w) const override;

 private:
  Tracer(Registry& registry, TracerOptions options,
         trace::OtlpEncoding encoding, const trace::TraceResource& resource);
  static void OnTimer(uv_timer_t* t);
  void OnResult(const otlp::ExportResult& r);
  // Runs Shutdown()'s `done` once the timer and the exporter are closed.
  void MaybeDone();

  TracerOptions options_;
  trace::RandomIdSource ids_;
  trace::OtlpTraceEncoder encoder_;
  trace::SpanBatch batch_;
  int64_t offset_ns_ = 0;  // of the pending request
  // The trace_exported flags of the requests in the encoder's pending body,
  // then of each body submitted and not yet answered, in submission order
  // (the exporter sends one body at a time and answers them in that order).
  std::vector<std::shared_ptr<bool>> pending_flags_;
  std::deque<std::vector<std::shared_ptr<bool>>> submitted_flags_;
  std::unique_ptr<otlp::OtlpHttpExporter> exporter_;
  uv_timer_t timer_{};
  bool shut_down_ = false;
  bool timer_closed_ = false;
  bool exporter_closed_ = false;
  std::function<void()> done_;
  TracerStats stats_;
  HistogramLayout export_layout_;
  Histogram export_seconds_;
  Registration registration_;  // last: unregisters first
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_TRACING_TRACER_H_
