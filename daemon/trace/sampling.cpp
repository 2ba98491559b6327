#include "daemon/trace/sampling.h"

#include <cmath>

#include "daemon/trace/span_builder.h"
#include "daemon/trace/trace_context.h"

namespace tokenmeter::daemon::trace {
namespace {

constexpr uint64_t kRandomnessLimit = uint64_t(1) << 56;

}  // namespace

uint64_t RatioThreshold(double ratio) {
  if (!(ratio > 0)) return kRandomnessLimit;  // NaN too
  if (ratio >= 1) return 0;
  // ratio * 2^56 is exact (a power of two); llround gives the nearest
  // count of kept randomness values, at least 0 and at most 2^56.
  const uint64_t kept = uint64_t(std::llround(std::ldexp(ratio, 56)));
  return kRandomnessLimit - kept;
}

SampleDecision DecideTrace(const RequestTimeline& tl,
                           const SamplingOptions& options, uint64_t random) {
  if (tl.finish_reason == "error" || tl.finish_reason == "abort") {
    return SampleDecision::kFailed;
  }
  if (options.slower_than_ns != kNoSlowThreshold) {
    uint64_t e2e;
    if (tl.arrived_ns && tl.finished_ns) {
      e2e =
          tl.finished_ns >= tl.arrived_ns ? tl.finished_ns - tl.arrived_ns : 0;
    } else {
      const RequestExtent extent = RootExtent(tl);
      e2e = extent.end_ns - extent.start_ns;
    }
    if (e2e >= options.slower_than_ns) return SampleDecision::kSlow;
  }
  TraceContext ctx;
  if (!tl.traceparent.empty() && ParseTraceparent(tl.traceparent, &ctx)) {
    return ctx.parent_sampled ? SampleDecision::kParentSampled
                              : SampleDecision::kDrop;
  }
  const uint64_t r = random & (kRandomnessLimit - 1);
  return r >= RatioThreshold(options.ratio) ? SampleDecision::kRatio
                                            : SampleDecision::kDrop;
}

bool KeepTrace(const RequestTimeline& tl, const SamplingOptions& options,
               uint64_t random) {
  return DecideTrace(tl, options, random) != SampleDecision::kDrop;
}

}  // namespace tokenmeter::daemon::trace
