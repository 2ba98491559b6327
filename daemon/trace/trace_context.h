// A request's place in a trace: the W3C trace context its ARRIVED carried
// (traceparent, tracestate), or a new trace of its own.
#ifndef TOKENMETER_DAEMON_TRACE_TRACE_CONTEXT_H_
#define TOKENMETER_DAEMON_TRACE_TRACE_CONTEXT_H_

#include <cstdint>
#include <string_view>

#include "daemon/trace/ids.h"
#include "daemon/trace/span.h"
#include "daemon/trace/timeline.h"

namespace tokenmeter::daemon::trace {

struct TraceContext {
  TraceId trace_id{};
  // The caller's span (the traceparent's parent-id); all zeros: none, the
  // request's root span starts a trace.
  SpanId parent_span_id{};
  bool has_parent = false;      // a valid traceparent was given
  bool parent_sampled = false;  // its sampled flag (bit 0 of trace-flags)
  // The request's tracestate, only with a valid traceparent and only when
  // itself valid (W3C: a tracestate without its traceparent is ignored).
  // A view into the timeline.
  std::string_view trace_state;
};

// Parses a W3C traceparent of version 00 ("00-<32 hex>-<16 hex>-<2 hex>",
// lowercase, neither id all zeros: tm_proto_valid_traceparent(), the rule
// the ingest decoder applies). False, and *out untouched, when it is not
// one; the tracker keeps only valid ones, so this guards other callers.
bool ParseTraceparent(std::string_view traceparent, TraceContext* out);

// The request's trace: its traceparent's (with the tracestate when that is
// valid too), else a new trace id from `ids` and no parent. O(1).
TraceContext ResolveTraceContext(const RequestTimeline& timeline,
                                 IdSource& ids);

// The trace's randomness as OpenTelemetry's probability sampler reads it
// (W3C Trace Context Level 2): the 7 rightmost bytes of the trace id as a
// big-endian number, 0 .. 2^56 - 1.
uint64_t TraceRandomness(const TraceId& trace_id);

// Lowercase hex of an id, written to `out` (32 or 16 characters).
void HexId(const TraceId& id, char out[32]);
void HexId(const SpanId& id, char out[16]);

}  // namespace tokenmeter::daemon::trace

#endif  // TOKENMETER_DAEMON_TRACE_TRACE_CONTEXT_H_
