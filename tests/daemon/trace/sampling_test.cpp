// The sampling decision: failed and slow requests kept whatever the ratio
// or the parent, the parent's flag, the ratio on the trace's randomness.
#include "daemon/trace/sampling.h"

#include <gtest/gtest.h>

#include <cmath>

#include "daemon/trace/ids.h"
#include "daemon/trace/trace_context.h"

namespace tokenmeter::daemon::trace {
namespace {

constexpr uint64_t k56 = uint64_t(1) << 56;
constexpr const char* kSampled =
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
constexpr const char* kUnsampled =
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";

RequestTimeline Finished(const char* reason, uint64_t e2e_ns) {
  RequestTimeline t;
  t.request_id = "1";
  t.arrived_ns = 1000;
  t.finished_ns = 1000 + e2e_ns;
  t.finish_reason = reason;
  return t;
}

SamplingOptions Options(double ratio, uint64_t slower_than_ns) {
  SamplingOptions o;
  o.ratio = ratio;
  o.slower_than_ns = slower_than_ns;
  return o;
}

TEST(SamplingTest, ErrorAndAbortAreKeptWhateverTheRatioOrParent) {
  for (const char* reason : {"error", "abort"}) {
    RequestTimeline t = Finished(reason, 10);
    EXPECT_EQ(DecideTrace(t, Options(0, kNoSlowThreshold), 0),
              SampleDecision::kFailed)
        << reason;
    t.traceparent = kUnsampled;
    EXPECT_EQ(DecideTrace(t, Options(0, kNoSlowThreshold), 0),
              SampleDecision::kFailed)
        << reason;
  }
  for (const char* reason : {"stop", "length", ""}) {
    EXPECT_FALSE(
        KeepTrace(Finished(reason, 10), Options(0, kNoSlowThreshold), k56 - 1))
        << reason;
  }
}

TEST(SamplingTest, SlowRequestsAreKeptFromTheThresholdOn) {
  const SamplingOptions o = Options(0, 2000000000);
  EXPECT_EQ(DecideTrace(Finished("stop", 2000000000), o, 0),
            SampleDecision::kSlow);
  EXPECT_EQ(DecideTrace(Finished("stop", 1999999999), o, 0),
            SampleDecision::kDrop);
  RequestTimeline t = Finished("stop", 3000000000);
  t.traceparent = kUnsampled;
  EXPECT_EQ(DecideTrace(t, o, 0), SampleDecision::kSlow);
  // Off: even a very slow request needs the ratio.
  EXPECT_EQ(DecideTrace(Finished("stop", 3000000000),
                        Options(0, kNoSlowThreshold), 0),
            SampleDecision::kDrop);
}

TEST(SamplingTest, SlowUsesTheRootExtentWithoutArrivedOrFinished) {
  RequestTimeline t;
  t.request_id = "1";
  t.scheduled_ns = 1000;
  t.last_token_ns = 1000 + 5000;
  EXPECT_EQ(DecideTrace(t, Options(0, 5000), 0), SampleDecision::kSlow);
  EXPECT_EQ(DecideTrace(t, Options(0, 5001), 0), SampleDecision::kDrop);
  // FINISHED before ARRIVED: e2e 0.
  RequestTimeline u;
  u.arrived_ns = 9000;
  u.finished_ns = 1000;
  u.finish_reason = "stop";
  EXPECT_EQ(DecideTrace(u, Options(0, 1), 0), SampleDecision::kDrop);
}

TEST(SamplingTest, AParentsSampledFlagDecides) {
  RequestTimeline t = Finished("stop", 10);
  t.traceparent = kSampled;
  EXPECT_EQ(DecideTrace(t, Options(0, kNoSlowThreshold), 0),
            SampleDecision::kParentSampled);
  t.traceparent = kUnsampled;
  EXPECT_EQ(DecideTrace(t, Options(1, kNoSlowThreshold), k56 - 1),
            SampleDecision::kDrop);
}

TEST(SamplingTest, AnInvalidTraceparentFallsBackToTheRatio) {
  RequestTimeline t = Finished("stop", 10);
  t.traceparent = "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-00";
  EXPECT_EQ(DecideTrace(t, Options(1, kNoSlowThreshold), 0),
            SampleDecision::kRatio);
  EXPECT_EQ(DecideTrace(t, Options(0, kNoSlowThreshold), k56 - 1),
            SampleDecision::kDrop);
}

TEST(SamplingTest, RatioThresholds) {
  EXPECT_EQ(RatioThreshold(0), k56);
  EXPECT_EQ(RatioThreshold(-1), k56);
  EXPECT_EQ(RatioThreshold(std::nan("")), k56);
  EXPECT_EQ(RatioThreshold(1), 0u);
  EXPECT_EQ(RatioThreshold(2), 0u);
  EXPECT_EQ(RatioThreshold(0.5), k56 / 2);
  EXPECT_EQ(RatioThreshold(0.25), k56 - k56 / 4);
  EXPECT_EQ(RatioThreshold(std::ldexp(1, -56)), k56 - 1);
}

TEST(SamplingTest, RatioKeepsRandomnessFromTheThresholdUp) {
  const RequestTimeline t = Finished("stop", 10);
  const SamplingOptions half = Options(0.5, kNoSlowThreshold);
  EXPECT_FALSE(KeepTrace(t, half, k56 / 2 - 1));
  EXPECT_TRUE(KeepTrace(t, half, k56 / 2));
  EXPECT_TRUE(KeepTrace(t, half, k56 - 1));
  // Bits above the 56 are not randomness.
  EXPECT_FALSE(KeepTrace(t, half, (k56 / 2 - 1) | (uint64_t(0xff) << 56)));
  EXPECT_FALSE(KeepTrace(t, Options(0, kNoSlowThreshold), k56 - 1));
  EXPECT_TRUE(KeepTrace(t, Options(1, kNoSlowThreshold), 0));
}

TEST(SamplingTest, HigherRatioKeepsASupersetAndAboutTheRatio) {
  const RequestTimeline t = Finished("stop", 10);
  RandomIdSource ids(2024);
  int kept_low = 0;
  int kept_high = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const uint64_t r = TraceRandomness(ids.NewTraceId());
    const bool low = KeepTrace(t, Options(0.1, kNoSlowThreshold), r);
    const bool high = KeepTrace(t, Options(0.25, kNoSlowThreshold), r);
    EXPECT_TRUE(!low || high);
    kept_low += low;
    kept_high += high;
  }
  // Binomial: 5 standard deviations are under 0.5 and 0.7 percentage points.
  EXPECT_NEAR(double(kept_low) / n, 0.1, 0.005);
  EXPECT_NEAR(double(kept_high) / n, 0.25, 0.007);
}

}  // namespace
}  // namespace tokenmeter::daemon::trace
