// Which retired requests become traces: a pure decision, made at
// retirement when the request's whole timeline is known (so slow and
// failed requests can be kept: tail sampling at no cost to the engine).
//
// The rules, first match wins:
//   1. finish reason "error" or "abort": kept;
//   2. --trace-slower-than S set and the request's e2e >= S: kept. e2e is
//      FINISHED - ARRIVED, or the root span's extent where one is missing
//      (span_builder.h, "Root extent");
//   3. a valid traceparent: its sampled flag decides (ParentBased);
//   4. otherwise --trace-ratio R decides on the trace id, as
//      OpenTelemetry's ProbabilitySampler does (the specification's
//      successor to TraceIdRatioBased): kept when the trace's randomness
//      (TraceRandomness(): its 7 rightmost bytes) is at least the
//      rejection threshold T = 2^56 - round(R * 2^56). The same trace id
//      always gets the same answer, and a higher ratio keeps a superset.
//
// Rules 1 and 2 override the parent's flag too: a failed or slow request
// is exported even when the caller's trace was not sampled; its root then
// names a parent span that the backend does not have. No `th` is written
// to tracestate: the kept traces mix ratio and tail decisions, and a
// threshold would make a backend extrapolate counts from tail-kept ones.
//
// At retirement, so that a kept request's spans carry the trace id the
// decision was made on:
//
//   const TraceContext ctx = ResolveTraceContext(timeline, ids);
//   if (KeepTrace(timeline, sampling, TraceRandomness(ctx.trace_id))) {
//     BuildSpans(timeline, ctx, span_options, ids, &batch);
//     encoder.Add(batch);
//     batch.Clear();
//   }
#ifndef TOKENMETER_DAEMON_TRACE_SAMPLING_H_
#define TOKENMETER_DAEMON_TRACE_SAMPLING_H_

#include <cstdint>

#include "daemon/trace/timeline.h"

namespace tokenmeter::daemon::trace {

inline constexpr uint64_t kNoSlowThreshold = UINT64_MAX;

struct SamplingOptions {
  // --trace-ratio, 0..1 (a value outside is clamped; NaN is 0).
  double ratio = 0.01;
  // --trace-slower-than, in ns; kNoSlowThreshold: off.
  uint64_t slower_than_ns = kNoSlowThreshold;
};

// Why a trace is kept, or kDrop.
enum class SampleDecision : uint8_t {
  kDrop,
  kFailed,         // rule 1
  kSlow,           // rule 2
  kParentSampled,  // rule 3
  kRatio,          // rule 4
};

// The decision for a retired request. `random` is its trace's randomness
// (TraceRandomness() of the trace id its spans get; bits above 56 are
// ignored), used by rule 4 only. O(1) plus the timeline's KV transfers and
// preemptions when ARRIVED or FINISHED is missing; pure.
SampleDecision DecideTrace(const RequestTimeline& timeline,
                           const SamplingOptions& options, uint64_t random);

// DecideTrace() != kDrop.
bool KeepTrace(const RequestTimeline& timeline, const SamplingOptions& options,
               uint64_t random);

// Rule 4's rejection threshold for a ratio: 0 keeps all, 2^56 none.
uint64_t RatioThreshold(double ratio);

}  // namespace tokenmeter::daemon::trace

#endif  // TOKENMETER_DAEMON_TRACE_SAMPLING_H_
