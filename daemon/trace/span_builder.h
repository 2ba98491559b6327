// A retired request's timeline as OpenTelemetry spans: one root span for
// the request and a child for each phase the timeline has both ends of.
// docs/traces.md is the user's description; this header is the contract.
//
// Spans, in the order they are appended (root first):
//
//   llm_request        SERVER  ARRIVED -> FINISHED (see "Root extent")
//   queue              INTERNAL QUEUED (else ARRIVED) -> first SCHEDULED
//   kv_transfer.send   INTERNAL one per KV_TRANSFER of role send,
//   kv_transfer.recv            role recv: start -> t; ERROR when !ok
//   prefill            INTERNAL first SCHEDULED -> first TOKENS
//   preempted          INTERNAL one per PREEMPTED: PREEMPTED -> the
//                               SCHEDULED that resumed it, else FINISHED,
//                               else the root's end
//   decode             INTERNAL first TOKENS -> FINISHED, else last TOKENS
//
// The root is SERVER, as vLLM's own llm_request span: it is the serving
// side of the call whose context the traceparent carries (a remote
// parent); the children are INTERNAL. TOKENS events are not spans.
//
// Root extent: from ARRIVED, else the earliest time point the timeline
// has (lifecycle points, KV transfer ends, preemption points); to
// FINISHED, else the latest. If the end would precede the start, the end
// is the start (the root is kept: it holds the attributes). A timeline
// without any time point gives no span at all. Children keep their
// events' exact times, even where they reach outside the root (a KV
// transfer the timeline holds with an end past FINISHED).
//
// A child is left out when one of its ends is missing (0) or when its end
// precedes its start (never a negative duration, nor a clamped made-up
// one); a zero duration is kept.
//
// Ids: the root's trace id and parent come from the traceparent
// (TraceContext), else a new trace id and no parent; every span gets a new
// span id from the IdSource; children's parent is the root. Flags: sampled
// (0x01, every built span is exported) and "has is-remote" (0x100), plus
// "is remote" (0x200) on a root whose parent is the traceparent's, as the
// OpenTelemetry JS SDK writes them. Every span carries the tracestate.
//
// Times: a span's Unix time is its CLOCK_MONOTONIC time plus
// SpanOptions::unix_minus_monotonic_ns, one offset for the whole export.
// The engine stamps its events with CLOCK_MONOTONIC of the same host, the
// daemon's clock (engine and daemon in one time namespace). Error bound:
// durations and the spans' relative placement are exact to the
// nanosecond, whatever the offset. The absolute placement is off by the
// offset's own error: the time between the caller's two clock reads
// (CLOCK_REALTIME and CLOCK_MONOTONIC, back to back) plus any step of the
// wall clock between the event and the export (settimeofday, an NTP step,
// a leap second), since CLOCK_MONOTONIC does not step. NTP slewing moves
// both clocks alike and adds no error. A Unix time below 0 is written as
// 0.
//
// Root attributes (after the OpenTelemetry GenAI semantic conventions where
// they have a name, vLLM's gen_ai.latency.* where they do not, then
// tokenmeter's own; each only when the timeline has it):
//
//   gen_ai.provider.name               string  the HELLO's engine
//   gen_ai.request.model               string  the series' model_name
//   gen_ai.request.max_tokens          int     ARRIVED max_tokens (> 0)
//   gen_ai.request.choice.count        int     ARRIVED n (when not 1)
//   gen_ai.usage.input_tokens          int     prompt tokens (with ARRIVED)
//   gen_ai.usage.output_tokens         int     generation tokens (always)
//   gen_ai.usage.cache_read.input_tokens int   SCHEDULED cached_tokens
//   gen_ai.response.finish_reasons     string[1] the FINISHED reason
//   gen_ai.latency.time_in_queue       double s  QUEUED (else ARRIVED) ->
//                                                SCHEDULED
//   gen_ai.latency.time_to_first_token double s  ARRIVED -> first TOKENS
//   gen_ai.latency.e2e                 double s  ARRIVED -> FINISHED
//   gen_ai.latency.time_in_model_prefill double s SCHEDULED -> first TOKENS
//   gen_ai.latency.time_in_model_decode double s first -> last TOKENS
//   gen_ai.latency.time_in_model_inference double s SCHEDULED -> last TOKENS
//   error.type                         string  "_OTHER" with status ERROR
//   tokenmeter.request_id              string  (always)
//   tokenmeter.external_tokens         int     SCHEDULED external_tokens
//   tokenmeter.preemptions             int     PREEMPTED count (always)
//   tokenmeter.priority                int     ARRIVED priority
//   tokenmeter.lora                    string  ARRIVED lora
//   tokenmeter.evicted                 bool    true: retired unfinished
//   tokenmeter.engine.<label>          string  each engine series label
//   tokenmeter.label.<name>            string  each per-request label
//
// A gen_ai.latency.* value is left out when an end is missing or the
// interval is negative. Status: ERROR ("request finished with error") for
// finish reason "error"; "abort" (often the client going away) stays UNSET
// and shows in finish_reasons. KV transfer spans: tokenmeter.kv.bytes,
// tokenmeter.kv.blocks (int, when given), tokenmeter.kv.connector (string,
// when given); a failed one has status ERROR with its reason as message
// and error.type the reason (else "_OTHER"). Preempted spans:
// tokenmeter.preemption.resumed (bool).
//
// Cost: O(spans + attributes); no allocation once `out` has the capacity.
// Pure: no clock, no I/O; one thread at a time per IdSource and batch.
#ifndef TOKENMETER_DAEMON_TRACE_SPAN_BUILDER_H_
#define TOKENMETER_DAEMON_TRACE_SPAN_BUILDER_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "daemon/trace/ids.h"
#include "daemon/trace/span.h"
#include "daemon/trace/timeline.h"
#include "daemon/trace/trace_context.h"

namespace tokenmeter::daemon::trace {

inline constexpr std::string_view kRootSpanName = "llm_request";
inline constexpr std::string_view kQueueSpanName = "queue";
inline constexpr std::string_view kPrefillSpanName = "prefill";
inline constexpr std::string_view kDecodeSpanName = "decode";
inline constexpr std::string_view kKvSendSpanName = "kv_transfer.send";
inline constexpr std::string_view kKvRecvSpanName = "kv_transfer.recv";
inline constexpr std::string_view kPreemptedSpanName = "preempted";

struct SpanOptions {
  // Unix time minus CLOCK_MONOTONIC time, in ns, read by the caller once per
  // export (UnixMinusMonotonicNs()).
  int64_t unix_minus_monotonic_ns = 0;
};

// The root span's extent in CLOCK_MONOTONIC ns (rules above); valid false
// when the timeline has no time point.
struct RequestExtent {
  bool valid = false;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;  // >= start_ns
};
RequestExtent RootExtent(const RequestTimeline& timeline);

// Appends the request's spans to *out (root first) in the trace `context`
// (ResolveTraceContext()); returns how many (0: no time point). Views in
// the spans point into `timeline` and `context.trace_state`.
size_t BuildSpans(const RequestTimeline& timeline, const TraceContext& context,
                  const SpanOptions& options, IdSource& ids, SpanBatch* out);

// The same, resolving the context from the timeline first (a new trace id
// from `ids` when it has no valid traceparent).
size_t BuildSpans(const RequestTimeline& timeline, const SpanOptions& options,
                  IdSource& ids, SpanBatch* out);

// The spans would point into a temporary timeline: refused at compile time.
size_t BuildSpans(RequestTimeline&& timeline, const TraceContext& context,
                  const SpanOptions& options, IdSource& ids,
                  SpanBatch* out) = delete;
size_t BuildSpans(RequestTimeline&& timeline, const SpanOptions& options,
                  IdSource& ids, SpanBatch* out) = delete;

// monotonic_ns + offset, or 0 when that is below 0.
uint64_t ToUnixNs(uint64_t monotonic_ns, int64_t unix_minus_monotonic_ns);

// The offset from a Unix time and a CLOCK_MONOTONIC time read together.
inline int64_t UnixMinusMonotonicNs(uint64_t unix_ns, uint64_t monotonic_ns) {
  return int64_t(unix_ns - monotonic_ns);
}

}  // namespace tokenmeter::daemon::trace

#endif  // TOKENMETER_DAEMON_TRACE_SPAN_BUILDER_H_
