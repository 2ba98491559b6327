// Tests of the request tracker against "What the daemon computes" in
// docs/protocol.md: intervals, counters, labels (the closing event's
// source), order independence, grace, eviction, timestamps and gauges.
// Events are built as values; time is a fake clock.
#include "daemon/ingest/tracker.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/exposition/exposition.h"
#include "daemon/ingest/event.h"
#include "daemon/ingest/frame_decoder.h"
#include "daemon/pipeline/pipeline.h"
#include "daemon/store/catalog.h"
#include "daemon/store/histogram.h"
#include "daemon/store/parts/lora.h"
#include "daemon/store/parts/moe.h"
#include "daemon/store/profile.h"
#include "daemon/store/registry.h"

namespace tokenmeter::daemon {
namespace {

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kSecond = 1'000'000'000;
// Event times are T(ms) = kBase + ms; the clock starts a minute later so
// that every event of a test is comfortably inside the accepted window.
constexpr uint64_t kBase = 100'000 * kSecond;
constexpr uint64_t kStart = kBase + 60 * kSecond;
constexpr uint64_t kSpace = 1;

constexpr uint64_t T(uint64_t ms) { return kBase + ms * kMs; }

class FakeClock : public Clock {
 public:
  uint64_t NowNs() const override { return now; }
  double UnixNowS() const override { return unix_s; }
  uint64_t now = kStart;
  double unix_s = 1'700'000'000;
};

// ---- event builders
// ----------------------------------------------------------

RequestId Rid(uint64_t number) {
  RequestId r;
  r.number = number;
  return r;
}

RequestId Rid(std::string_view text) {
  RequestId r;
  r.is_string = true;
  r.text = text;
  return r;
}

Event Ev(EventKind kind, uint64_t t_ns, RequestId rid) {
  Event e{};
  e.kind = kind;
  e.t_ns = t_ns;
  e.rid = rid;
  return e;
}

Event Arrived(uint64_t t, RequestId rid, uint64_t prompt_tokens) {
  Event e = Ev(EventKind::kArrived, t, rid);
  e.count = prompt_tokens;
  return e;
}

Event ArrivedWithParams(uint64_t t, RequestId rid, uint64_t prompt_tokens,
                        uint64_t max_tokens, uint64_t n) {
  Event e = Arrived(t, rid, prompt_tokens);
  e.has_max_tokens = true;
  e.max_tokens = max_tokens;
  e.has_n = true;
  e.n = n;
  return e;
}

Event Queued(uint64_t t, RequestId rid) {
  return Ev(EventKind::kQueued, t, rid);
}

Event Scheduled(uint64_t t, RequestId rid) {
  return Ev(EventKind::kScheduled, t, rid);
}

Event Tokens(uint64_t t, RequestId rid, uint64_t n) {
  Event e = Ev(EventKind::kTokens, t, rid);
  e.count = n;
  return e;
}

Event Finished(uint64_t t, RequestId rid,
               FinishReason reason = FinishReason::kStop) {
  Event e = Ev(EventKind::kFinished, t, rid);
  e.reason = reason;
  return e;
}

Event Preempted(uint64_t t, RequestId rid) {
  return Ev(EventKind::kPreempted, t, rid);
}

Event Step(uint64_t t, const StepStats& stats) {
  Event e{};
  e.kind = EventKind::kStep;
  e.t_ns = t;
  e.step = stats;
  return e;
}

// ---- harness
// -----------------------------------------------------------------

// A registry with two engine series of one namespace ("core" and "front",
// as an engine core and an API frontend of one server would have), a fake
// clock and a tracker.
// Series of `profile` (namespace as its HELLO engine "vllm" gives it) and
// registry options (request labels) of a test's choosing.
struct Harness {
  explicit Harness(TrackerOptions options = {})
      : Harness(RegistryOptions{}, Profile::kVllm, options) {}
  Harness(const RegistryOptions& registry_options, Profile profile,
          TrackerOptions options = {}) {
    const Status s = Pipeline::Create(
        nullptr, clock, {registry_options, options, IngestOptions{}},
        &pipeline);
    EXPECT_TRUE(s.ok()) << s.message();
    registry = &pipeline->registry();
    stats = &pipeline->stats();
    tracker = &pipeline->tracker();
    const std::string ns = ProfileNamespace(profile, "vllm", "");
    core = registry->GetOrCreate({ns, "m", "core", {}, profile});
    front = registry->GetOrCreate({ns, "m", "front", {}, profile});
  }

  Source Core(uint64_t space = kSpace) const { return {core, space}; }
  Source Front(uint64_t space = kSpace) const { return {front, space}; }

  void Send(const Source& src, const Event& ev) {
    tracker->Apply(src, ev, nullptr, clock.NowNs());
  }
  void Send(const Source& src, std::initializer_list<Event> events) {
    for (const Event& ev : events) Send(src, ev);
  }
  // An ARRIVED with lora / labels params (Batch::arrivals).
  void SendArrived(const Source& src, Event ev, const ArrivedExtras& x) {
    ev.extras = 0;
    tracker->Apply(src, ev, nullptr, clock.NowNs(), std::span(&x, 1));
  }
  void AdvanceAndSweep(uint64_t ns) {
    clock.now += ns;
    tracker->Sweep();
  }

  std::array<uint64_t, size_t(Interval::kCount)> Incomplete() const {
    std::array<uint64_t, size_t(Interval::kCount)> a{};
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = tracker->incomplete(Interval(i));
    }
    return a;
  }
  std::array<uint64_t, size_t(Interval::kCount)> Negative() const {
    std::array<uint64_t, size_t(Interval::kCount)> a{};
    for (size_t i = 0; i < a.size(); ++i) a[i] = tracker->negative(Interval(i));
    return a;
  }
  int64_t Tracked() const { return int64_t(tracker->size()); }
  std::string Render() {
    std::string out;
    daemon::Render(*registry, ExpositionFormat::kText004, out);
    return out;
  }

  FakeClock clock;
  std::unique_ptr<Pipeline> pipeline;
  Registry* registry = nullptr;
  EngineSeries* core = nullptr;
  EngineSeries* front = nullptr;
  IngestStats* stats = nullptr;
  Tracker* tracker = nullptr;
};

uint64_t TotalObservations(const EngineSeries& s) {
  uint64_t n = 0;
  for (int m = kFirstHistogram; m < kFirstHistogram + kNumHistograms; ++m) {
    n += s.hist(EngineMetric(m)).count();
  }
  return n;
}

std::string_view MetricName(EngineMetric m) { return kEngineMetrics[m].suffix; }

// Expects `count` observations summing to `raw_sum` (ns for seconds
// histograms, tokens otherwise), compared exactly.
void ExpectHist(const EngineSeries& s, EngineMetric m, uint64_t count,
                double raw_sum) {
  const Histogram& h = s.hist(m);
  EXPECT_EQ(h.count(), count) << MetricName(m);
  EXPECT_EQ(h.sum(), raw_sum / h.layout().divisor()) << MetricName(m);
}

// The index of the bucket whose bound is `le` (exposed units).
size_t BucketIndex(const Histogram& h, double le) {
  const auto& b = h.layout().bounds();
  for (size_t i = 0; i < b.size(); ++i) {
    if (b[i] == le) return i;
  }
  ADD_FAILURE() << "no bucket le=" << le;
  return b.size();
}

uint64_t CountIn(const Histogram& h, double le) {
  return h.counts()[BucketIndex(h, le)];
}

std::array<uint64_t, size_t(Interval::kCount)> Intervals(
    std::initializer_list<Interval> intervals) {
  std::array<uint64_t, size_t(Interval::kCount)> a{};
  for (Interval i : intervals) ++a[size_t(i)];
  return a;
}

// ---- intervals
// ---------------------------------------------------------------

struct HistExpectation {
  EngineMetric metric;
  uint64_t count;
  double raw_sum;
};

TEST(TrackerTest, ComputesEveryIntervalOfOneRequest) {
  Harness h;
  const uint64_t a = T(0);
  const uint64_t q = a + 1'000'000;
  const uint64_t s = a + 5'000'000;
  const uint64_t f = a + 123'456'789;
  const uint64_t t2 = f + 20'000'000;
  const uint64_t t3 = t2 + 30'000'001;
  const uint64_t e = t3 + 1'000;
  h.Send(h.Core(),
         {ArrivedWithParams(a, Rid(1), 7, 100, 2), Queued(q, Rid(1)),
          Scheduled(s, Rid(1)), Tokens(f, Rid(1), 1), Tokens(t2, Rid(1), 2),
          Tokens(t3, Rid(1), 3), Finished(e, Rid(1), FinishReason::kLength)});

  const uint64_t decode = t3 - f;
  const HistExpectation want[] = {
      {kTimeToFirstToken, 1, double(f - a)},
      {kInterTokenLatency, 2, double(t3 - f)},
      {kRequestTimePerOutputToken, 1, double(decode) / double(6 - 1)},
      {kE2eRequestLatency, 1, double(e - a)},
      {kRequestQueueTime, 1, double(s - q)},
      {kRequestPrefillTime, 1, double(f - s)},
      {kRequestDecodeTime, 1, double(decode)},
      {kRequestInferenceTime, 1, double(t3 - s)},
      {kRequestPromptTokens, 1, 7},
      {kRequestGenerationTokens, 1, 6},
      {kRequestMaxNumGenerationTokens, 1, 6},
      {kRequestParamsMaxTokens, 1, 100},
      {kRequestParamsN, 1, 2},
      {kIterationTokens, 0, 0},
  };
  for (const HistExpectation& w : want) {
    ExpectHist(*h.core, w.metric, w.count, w.raw_sum);
  }
  // Seconds exposed, exact to the nanosecond.
  EXPECT_EQ(h.core->hist(kTimeToFirstToken).sum(), 0.123456789);
  EXPECT_EQ(h.core->hist(kInterTokenLatency).sum(), 0.050000001);
  EXPECT_EQ(CountIn(h.core->hist(kTimeToFirstToken), 0.25), 1u);
  EXPECT_EQ(CountIn(h.core->hist(kInterTokenLatency), 0.025), 1u);
  EXPECT_EQ(CountIn(h.core->hist(kInterTokenLatency), 0.05), 1u);

  EXPECT_EQ(h.core->count(kPromptTokens), 7u);
  EXPECT_EQ(h.core->count(kGenerationTokens), 6u);
  EXPECT_EQ(h.core->children(kRequestSuccess)[size_t(FinishReason::kLength)],
            1u);
  EXPECT_EQ(h.core->children(kRequestSuccess)[size_t(FinishReason::kStop)], 0u);
  EXPECT_EQ(h.core->count(kNumPreemptions), 0u);
  EXPECT_EQ(TotalObservations(*h.front), 0u);
  EXPECT_EQ(h.Negative(), Intervals({}));
}

TEST(TrackerTest, TtftAndPrefillAtFirstTokenOtherPhasesAtFinished) {
  Harness h;
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 5), Scheduled(T(10), Rid(1)),
                    Tokens(T(30), Rid(1), 1)});
  ExpectHist(*h.core, kTimeToFirstToken, 1, double(30 * kMs));
  ExpectHist(*h.core, kRequestPrefillTime, 1, double(20 * kMs));
  EXPECT_EQ(h.core->count(kPromptTokens), 5u);
  for (EngineMetric m :
       {kE2eRequestLatency, kRequestQueueTime, kRequestDecodeTime,
        kRequestInferenceTime, kRequestTimePerOutputToken, kRequestPromptTokens,
        kRequestGenerationTokens, kRequestMaxNumGenerationTokens}) {
    EXPECT_EQ(h.core->hist(m).count(), 0u) << MetricName(m);
  }
  h.Send(h.Core(), Finished(T(40), Rid(1)));
  ExpectHist(*h.core, kE2eRequestLatency, 1, double(40 * kMs));
  ExpectHist(*h.core, kRequestQueueTime, 1, double(10 * kMs));
  ExpectHist(*h.core, kRequestDecodeTime, 1, 0);
  ExpectHist(*h.core, kRequestInferenceTime, 1, double(20 * kMs));
  // One token: no time per output token.
  ExpectHist(*h.core, kRequestTimePerOutputToken, 0, 0);
  ExpectHist(*h.core, kRequestGenerationTokens, 1, 1);
}

TEST(TrackerTest, LeIsInclusiveAtExactBucketBound) {
  Harness h;
  // 100 ms lands in le="0.1"; one nanosecond more in le="0.25".
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 1), Tokens(T(100), Rid(1), 1),
                    Arrived(T(0), Rid(2), 1), Tokens(T(100) + 1, Rid(2), 1)});
  const Histogram& ttft = h.core->hist(kTimeToFirstToken);
  EXPECT_EQ(CountIn(ttft, 0.1), 1u);
  EXPECT_EQ(CountIn(ttft, 0.25), 1u);
  EXPECT_EQ(CountIn(ttft, 0.08), 0u);
  EXPECT_EQ(ttft.sum(), 0.200000001);
}

TEST(TrackerTest, QueueTimeStartsAtArrivedWithoutQueued) {
  Harness h;
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 1), Scheduled(T(7), Rid(1)),
                    Finished(T(9), Rid(1), FinishReason::kAbort)});
  ExpectHist(*h.core, kRequestQueueTime, 1, double(7 * kMs));
}

TEST(TrackerTest, TimePerOutputTokenIsDecodeOverTokensMinusOne) {
  Harness h;
  // 10 tokens in three steps: decode 90 ms over 9 gaps.
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 1), Tokens(T(10), Rid(1), 1),
                    Tokens(T(40), Rid(1), 4), Tokens(T(100), Rid(1), 5),
                    Finished(T(101), Rid(1))});
  ExpectHist(*h.core, kRequestTimePerOutputToken, 1, double(90 * kMs) / 9.0);
  EXPECT_EQ(h.core->hist(kRequestTimePerOutputToken).sum(), 0.01);
  ExpectHist(*h.core, kInterTokenLatency, 2, double(90 * kMs));
  EXPECT_EQ(h.core->count(kGenerationTokens), 10u);
}

TEST(TrackerTest, ParamsHistogramsOnlyWhenGiven) {
  Harness h;
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 3), Finished(T(1), Rid(1))});
  ExpectHist(*h.core, kRequestPromptTokens, 1, 3);
  ExpectHist(*h.core, kRequestParamsMaxTokens, 0, 0);
  ExpectHist(*h.core, kRequestParamsN, 0, 0);
  ExpectHist(*h.core, kRequestGenerationTokens, 1, 0);
}

TEST(TrackerTest, CountsFinishedRequestsByReason) {
  Harness h;
  const FinishReason reasons[] = {FinishReason::kStop,   FinishReason::kLength,
                                  FinishReason::kLength, FinishReason::kAbort,
                                  FinishReason::kError,  FinishReason::kError,
                                  FinishReason::kError};
  uint64_t id = 0;
  for (FinishReason r : reasons) {
    ++id;
    h.Send(h.Core(), {Arrived(T(0), Rid(id), 1), Finished(T(1), Rid(id), r)});
  }
  EXPECT_EQ(h.core->children(kRequestSuccess)[size_t(FinishReason::kStop)], 1u);
  EXPECT_EQ(h.core->children(kRequestSuccess)[size_t(FinishReason::kLength)],
            2u);
  EXPECT_EQ(h.core->children(kRequestSuccess)[size_t(FinishReason::kAbort)],
            1u);
  EXPECT_EQ(h.core->children(kRequestSuccess)[size_t(FinishReason::kError)],
            3u);
}

TEST(TrackerTest, RepeatedArrivedAndFinishedChangeNothing) {
  Harness h;
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 4), Arrived(T(5), Rid(1), 99),
                    Tokens(T(10), Rid(1), 1), Finished(T(20), Rid(1)),
                    Finished(T(30), Rid(1), FinishReason::kError)});
  ExpectHist(*h.core, kTimeToFirstToken, 1, double(10 * kMs));
  ExpectHist(*h.core, kE2eRequestLatency, 1, double(20 * kMs));
  EXPECT_EQ(h.core->count(kPromptTokens), 4u);
  EXPECT_EQ(h.core->children(kRequestSuccess)[size_t(FinishReason::kStop)], 1u);
  EXPECT_EQ(h.core->children(kRequestSuccess)[size_t(FinishReason::kError)],
            0u);
}

// ---- labels: the source of the closing event
// -----------------------------------

TEST(TrackerTest, FrontendArrivedEngineCoreRestLabelsEverythingWithCore) {
  Harness h;
  h.Send(h.Front(), ArrivedWithParams(T(0), Rid(1), 8, 64, 1));
  h.Send(h.Core(), {Queued(T(1), Rid(1)), Scheduled(T(2), Rid(1)),
                    Tokens(T(10), Rid(1), 1), Tokens(T(20), Rid(1), 1),
                    Finished(T(30), Rid(1))});
  EXPECT_EQ(TotalObservations(*h.front), 0u);
  EXPECT_EQ(h.front->count(kPromptTokens), 0u);
  EXPECT_EQ(h.front->count(kGenerationTokens), 0u);
  for (int i = 0; i < kNumHistograms; ++i) {
    const auto m = EngineMetric(kFirstHistogram + i);
    // Iterations come with STEP; a profile's own metrics only to its series.
    const uint64_t want = m == kIterationTokens || m == kMoeImbalance ||
                                  m == kRequestKvWaitTime || !h.core->uses(m)
                              ? 0
                              : 1;
    EXPECT_EQ(h.core->hist(m).count(), want) << MetricName(m);
  }
  EXPECT_EQ(h.core->count(kPromptTokens), 8u);
  EXPECT_EQ(h.core->count(kGenerationTokens), 2u);
  EXPECT_EQ(h.core->children(kRequestSuccess)[size_t(FinishReason::kStop)], 1u);
}

TEST(TrackerTest, LateArrivedFromFrontendPutsTtftInCoreSeries) {
  Harness h;
  h.Send(h.Core(), {Scheduled(T(5), Rid(1)), Tokens(T(50), Rid(1), 1)});
  EXPECT_EQ(h.core->hist(kTimeToFirstToken).count(), 0u);
  EXPECT_EQ(h.core->count(kPromptTokens), 0u);
  h.Send(h.Front(), Arrived(T(0), Rid(1), 12));
  ExpectHist(*h.core, kTimeToFirstToken, 1, double(50 * kMs));
  EXPECT_EQ(h.front->hist(kTimeToFirstToken).count(), 0u);
  // The prompt tokens are counted with the first token's source too.
  EXPECT_EQ(h.core->count(kPromptTokens), 12u);
  EXPECT_EQ(h.front->count(kPromptTokens), 0u);
}

TEST(TrackerTest, FinishPhasesGoToTheFinishedSource) {
  Harness h;
  h.Send(h.Front(), Arrived(T(0), Rid(1), 2));
  h.Send(h.Core(), {Scheduled(T(1), Rid(1)), Tokens(T(10), Rid(1), 1),
                    Tokens(T(15), Rid(1), 1)});
  h.Send(h.Front(), Finished(T(20), Rid(1)));
  for (EngineMetric m :
       {kTimeToFirstToken, kRequestPrefillTime, kInterTokenLatency}) {
    EXPECT_EQ(h.core->hist(m).count(), 1u) << MetricName(m);
    EXPECT_EQ(h.front->hist(m).count(), 0u) << MetricName(m);
  }
  for (EngineMetric m :
       {kE2eRequestLatency, kRequestQueueTime, kRequestDecodeTime,
        kRequestInferenceTime, kRequestTimePerOutputToken, kRequestPromptTokens,
        kRequestGenerationTokens, kRequestMaxNumGenerationTokens}) {
    EXPECT_EQ(h.front->hist(m).count(), 1u) << MetricName(m);
    EXPECT_EQ(h.core->hist(m).count(), 0u) << MetricName(m);
  }
  EXPECT_EQ(h.front->children(kRequestSuccess)[size_t(FinishReason::kStop)],
            1u);
  EXPECT_EQ(h.core->children(kRequestSuccess)[size_t(FinishReason::kStop)], 0u);
}

TEST(TrackerTest, EachItlGoesToItsTokensSource) {
  Harness h;
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 1), Tokens(T(10), Rid(1), 1)});
  h.Send(h.Front(), Tokens(T(25), Rid(1), 3));
  h.Send(h.Core(), Tokens(T(45), Rid(1), 1));
  ExpectHist(*h.front, kInterTokenLatency, 1, double(15 * kMs));
  ExpectHist(*h.core, kInterTokenLatency, 1, double(20 * kMs));
  EXPECT_EQ(h.core->count(kGenerationTokens), 2u);
  EXPECT_EQ(h.front->count(kGenerationTokens), 3u);
}

// ---- order independence
// ------------------------------------------------------

TEST(TrackerTest, ScheduledAfterFirstTokenStillGivesPrefill) {
  Harness h;
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 1), Tokens(T(30), Rid(1), 1)});
  EXPECT_EQ(h.core->hist(kRequestPrefillTime).count(), 0u);
  h.Send(h.Front(), Scheduled(T(10), Rid(1)));
  // Prefill closes at the first token: the core's series.
  ExpectHist(*h.core, kRequestPrefillTime, 1, double(20 * kMs));
  EXPECT_EQ(h.front->hist(kRequestPrefillTime).count(), 0u);
  h.Send(h.Core(), {Tokens(T(40), Rid(1), 1), Finished(T(41), Rid(1))});
  ExpectHist(*h.core, kRequestQueueTime, 1, double(10 * kMs));
  ExpectHist(*h.core, kRequestInferenceTime, 1, double(30 * kMs));
  EXPECT_EQ(h.Negative(), Intervals({}));
}

TEST(TrackerTest, ScheduledAfterFinishedGivesQueueAndInference) {
  Harness h;
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 1), Tokens(T(30), Rid(1), 1),
                    Tokens(T(50), Rid(1), 1), Finished(T(60), Rid(1))});
  EXPECT_EQ(h.core->hist(kRequestQueueTime).count(), 0u);
  EXPECT_EQ(h.core->hist(kRequestInferenceTime).count(), 0u);
  h.AdvanceAndSweep(kSecond);
  h.Send(h.Front(), Scheduled(T(10), Rid(1)));
  ExpectHist(*h.core, kRequestQueueTime, 1, double(10 * kMs));
  ExpectHist(*h.core, kRequestInferenceTime, 1, double(40 * kMs));
  ExpectHist(*h.core, kRequestPrefillTime, 1, double(20 * kMs));
  EXPECT_EQ(TotalObservations(*h.front), 0u);
  h.AdvanceAndSweep(2 * kSecond);
  EXPECT_EQ(h.tracker->size(), 0u);
  EXPECT_EQ(h.Incomplete(), Intervals({}));
}

TEST(TrackerTest, ArrivedAfterFinishedWithinGraceGivesE2eAndQueue) {
  Harness h;
  h.Send(h.Core(), {Queued(T(2), Rid(1)), Scheduled(T(5), Rid(1)),
                    Tokens(T(20), Rid(1), 1), Tokens(T(30), Rid(1), 2),
                    Finished(T(35), Rid(1), FinishReason::kLength)});
  ExpectHist(*h.core, kRequestQueueTime, 1, double(3 * kMs));
  EXPECT_EQ(h.core->hist(kE2eRequestLatency).count(), 0u);
  EXPECT_EQ(h.core->hist(kTimeToFirstToken).count(), 0u);
  EXPECT_EQ(h.core->hist(kRequestPromptTokens).count(), 0u);

  h.AdvanceAndSweep(2 * kSecond - 1);  // still within the grace period
  ASSERT_EQ(h.tracker->size(), 1u);
  h.Send(h.Front(), ArrivedWithParams(T(0), Rid(1), 9, 50, 3));
  ExpectHist(*h.core, kE2eRequestLatency, 1, double(35 * kMs));
  ExpectHist(*h.core, kTimeToFirstToken, 1, double(20 * kMs));
  ExpectHist(*h.core, kRequestQueueTime, 1, double(3 * kMs));  // not again
  ExpectHist(*h.core, kRequestPromptTokens, 1, 9);
  ExpectHist(*h.core, kRequestParamsMaxTokens, 1, 50);
  ExpectHist(*h.core, kRequestParamsN, 1, 3);
  EXPECT_EQ(h.core->count(kPromptTokens), 9u);
  EXPECT_EQ(TotalObservations(*h.front), 0u);

  h.AdvanceAndSweep(1);
  EXPECT_EQ(h.tracker->size(), 0u);
  EXPECT_EQ(h.Incomplete(), Intervals({}));
}

TEST(TrackerTest, ArrivedAfterFinishedWithoutQueuedGivesQueueFromArrived) {
  Harness h;
  h.Send(h.Core(), {Scheduled(T(5), Rid(1)), Tokens(T(20), Rid(1), 1),
                    Finished(T(35), Rid(1))});
  EXPECT_EQ(h.core->hist(kRequestQueueTime).count(), 0u);
  h.Send(h.Front(), Arrived(T(1), Rid(1), 1));
  ExpectHist(*h.core, kRequestQueueTime, 1, double(4 * kMs));
  ExpectHist(*h.core, kE2eRequestLatency, 1, double(34 * kMs));
  h.AdvanceAndSweep(10 * kSecond);
  EXPECT_EQ(h.Incomplete(), Intervals({}));
}

TEST(TrackerTest, LaterScheduledDoesNotMoveTheFirst) {
  Harness h;
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 1), Scheduled(T(10), Rid(1)),
                    Preempted(T(15), Rid(1)), Scheduled(T(25), Rid(1)),
                    Tokens(T(40), Rid(1), 1), Preempted(T(45), Rid(1)),
                    Scheduled(T(50), Rid(1)), Tokens(T(60), Rid(1), 1),
                    Finished(T(70), Rid(1))});
  ExpectHist(*h.core, kRequestQueueTime, 1, double(10 * kMs));
  ExpectHist(*h.core, kRequestPrefillTime, 1, double(30 * kMs));
  ExpectHist(*h.core, kRequestInferenceTime, 1, double(50 * kMs));
  EXPECT_EQ(h.core->count(kNumPreemptions), 2u);
}

TEST(TrackerTest, QueuedComesOnlyFromTheFirstQueued) {
  Harness h;
  h.Send(h.Core(),
         {Arrived(T(0), Rid(1), 1), Queued(T(3), Rid(1)), Queued(T(8), Rid(1)),
          Scheduled(T(10), Rid(1)), Finished(T(12), Rid(1))});
  ExpectHist(*h.core, kRequestQueueTime, 1, double(7 * kMs));
}

// ---- grace, incomplete and negative intervals
// ------------------------------------

TEST(TrackerTest, FinishedRequestRetiredAfterGrace) {
  TrackerOptions options;
  options.grace_ns = 500 * kMs;
  Harness h(options);
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 1), Finished(T(1), Rid(1))});
  EXPECT_EQ(h.tracker->size(), 1u);
  h.AdvanceAndSweep(500 * kMs - 1);
  EXPECT_EQ(h.tracker->size(), 1u);
  EXPECT_EQ(h.Tracked(), 1);
  h.AdvanceAndSweep(1);
  EXPECT_EQ(h.tracker->size(), 0u);
  EXPECT_EQ(h.Tracked(), 0);
  EXPECT_EQ(h.tracker->evicted(), 0u);
  // Events in the grace period do not extend it.
  h.Send(h.Core(), {Arrived(T(0), Rid(2), 1), Finished(T(1), Rid(2))});
  h.AdvanceAndSweep(400 * kMs);
  h.Send(h.Core(), Tokens(T(2), Rid(2), 1));
  h.AdvanceAndSweep(100 * kMs);
  EXPECT_EQ(h.tracker->size(), 0u);
}

TEST(TrackerTest, EventAfterRetirementDoesNotJoin) {
  Harness h;
  h.Send(h.Core(), {Tokens(T(10), Rid(1), 1), Finished(T(20), Rid(1))});
  h.AdvanceAndSweep(2 * kSecond);
  ASSERT_EQ(h.tracker->size(), 0u);
  h.Send(h.Front(), Arrived(T(0), Rid(1), 1));
  EXPECT_EQ(h.core->hist(kTimeToFirstToken).count(), 0u);
  EXPECT_EQ(h.core->hist(kE2eRequestLatency).count(), 0u);
  EXPECT_EQ(h.tracker->incomplete(Interval::kTtft), 1u);
  EXPECT_EQ(h.tracker->incomplete(Interval::kE2e), 1u);
}

struct IncompleteCase {
  const char* name;
  std::vector<Event> events;  // all from the core; the last is FINISHED
  std::array<uint64_t, size_t(Interval::kCount)> incomplete;
};

TEST(TrackerTest, CountsIncompleteIntervalsAtRetirementNeverObservesThem) {
  const RequestId r = Rid(1);
  const IncompleteCase cases[] = {
      // Without ARRIVED the decode phase (decode, inference, TPOT) is not
      // observed either: the request may have produced tokens before the
      // first one seen (it was in flight across a daemon restart).
      {"tokens but no arrived, scheduled",
       {Tokens(T(10), r, 1), Finished(T(20), r)},
       Intervals({Interval::kTtft, Interval::kPrefill, Interval::kE2e,
                  Interval::kQueue, Interval::kDecode, Interval::kInference})},
      {"scheduled and tokens but no arrived",
       {Scheduled(T(5), r), Tokens(T(10), r, 1), Finished(T(20), r)},
       Intervals({Interval::kTtft, Interval::kE2e, Interval::kQueue,
                  Interval::kDecode, Interval::kInference})},
      {"queued but no arrived",
       {Queued(T(2), r), Scheduled(T(5), r), Tokens(T(10), r, 1),
        Finished(T(20), r)},
       Intervals({Interval::kTtft, Interval::kE2e, Interval::kDecode,
                  Interval::kInference})},
      {"several tokens but no arrived (TPOT too)",
       {Scheduled(T(5), r), Tokens(T(10), r, 1), Tokens(T(12), r, 1),
        Finished(T(20), r)},
       Intervals({Interval::kTtft, Interval::kE2e, Interval::kQueue,
                  Interval::kDecode, Interval::kInference, Interval::kTpot})},
      {"arrived and tokens but no scheduled",
       {Arrived(T(0), r, 1), Tokens(T(10), r, 1), Finished(T(20), r)},
       Intervals({Interval::kPrefill, Interval::kQueue, Interval::kInference})},
      {"aborted while waiting",
       {Arrived(T(0), r, 1), Finished(T(20), r, FinishReason::kAbort)},
       Intervals({})},
      {"aborted after scheduling, before the first token",
       {Arrived(T(0), r, 1), Scheduled(T(5), r),
        Finished(T(20), r, FinishReason::kAbort)},
       Intervals({})},
      {"complete",
       {Arrived(T(0), r, 1), Scheduled(T(5), r), Tokens(T(10), r, 1),
        Finished(T(20), r)},
       Intervals({})},
  };
  for (const IncompleteCase& c : cases) {
    SCOPED_TRACE(c.name);
    Harness h;
    for (const Event& ev : c.events) h.Send(h.Core(), ev);
    EXPECT_EQ(h.Incomplete(), Intervals({})) << "counted before retirement";
    h.AdvanceAndSweep(2 * kSecond);
    EXPECT_EQ(h.tracker->size(), 0u);
    EXPECT_EQ(h.Incomplete(), c.incomplete);
    const auto inc = h.Incomplete();
    if (inc[size_t(Interval::kTtft)] != 0) {
      EXPECT_EQ(h.core->hist(kTimeToFirstToken).count(), 0u);
    }
    if (inc[size_t(Interval::kE2e)] != 0) {
      EXPECT_EQ(h.core->hist(kE2eRequestLatency).count(), 0u);
      EXPECT_EQ(h.core->hist(kRequestPromptTokens).count(), 0u);
    }
    if (inc[size_t(Interval::kQueue)] != 0) {
      EXPECT_EQ(h.core->hist(kRequestQueueTime).count(), 0u);
    }
    if (inc[size_t(Interval::kPrefill)] != 0) {
      EXPECT_EQ(h.core->hist(kRequestPrefillTime).count(), 0u);
    }
    if (inc[size_t(Interval::kInference)] != 0) {
      EXPECT_EQ(h.core->hist(kRequestInferenceTime).count(), 0u);
    }
    EXPECT_EQ(h.tracker->evicted(), 0u);
  }
}

TEST(TrackerTest, AbortBeforeFirstTokenCountsNoIncompleteTtft) {
  Harness h;
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 6), Scheduled(T(3), Rid(1)),
                    Finished(T(9), Rid(1), FinishReason::kAbort)});
  h.AdvanceAndSweep(3 * kSecond);
  EXPECT_EQ(h.tracker->incomplete(Interval::kTtft), 0u);
  EXPECT_EQ(h.core->hist(kTimeToFirstToken).count(), 0u);
  ExpectHist(*h.core, kE2eRequestLatency, 1, double(9 * kMs));
  EXPECT_EQ(h.core->children(kRequestSuccess)[size_t(FinishReason::kAbort)],
            1u);
  // No first token: no prompt tokens counted.
  EXPECT_EQ(h.core->count(kPromptTokens), 0u);
}

struct NegativeCase {
  const char* name;
  std::vector<Event> events;  // all from the core
  std::array<uint64_t, size_t(Interval::kCount)> negative;
  std::vector<EngineMetric> not_observed;
};

TEST(TrackerTest, CountsNegativeIntervalsNeverObservesThem) {
  const RequestId r = Rid(1);
  const NegativeCase cases[] = {
      {"first token before arrived",
       {Arrived(T(100), r, 1), Tokens(T(50), r, 1)},
       Intervals({Interval::kTtft}),
       {kTimeToFirstToken}},
      {"late arrived after the first token",
       {Tokens(T(50), r, 1), Arrived(T(100), r, 1)},
       Intervals({Interval::kTtft}),
       {kTimeToFirstToken}},
      {"tokens before the previous tokens",
       {Arrived(T(0), r, 1), Tokens(T(100), r, 1), Tokens(T(90), r, 1)},
       Intervals({Interval::kItl}),
       {kInterTokenLatency}},
      {"finished before arrived",
       {Arrived(T(100), r, 1), Finished(T(50), r, FinishReason::kAbort)},
       Intervals({Interval::kE2e}),
       {kE2eRequestLatency}},
      {"scheduled before arrived",
       {Arrived(T(100), r, 1), Scheduled(T(50), r),
        Finished(T(200), r, FinishReason::kAbort)},
       Intervals({Interval::kQueue}),
       {kRequestQueueTime}},
      {"scheduled before queued",
       {Arrived(T(0), r, 1), Queued(T(60), r), Scheduled(T(50), r),
        Finished(T(200), r, FinishReason::kAbort)},
       Intervals({Interval::kQueue}),
       {kRequestQueueTime}},
      {"first token before scheduled",
       {Arrived(T(0), r, 1), Scheduled(T(100), r), Tokens(T(50), r, 1),
        Finished(T(200), r)},
       Intervals({Interval::kPrefill, Interval::kInference}),
       {kRequestPrefillTime, kRequestInferenceTime}},
      {"late scheduled after the first token",
       {Arrived(T(0), r, 1), Tokens(T(50), r, 1), Scheduled(T(100), r)},
       Intervals({Interval::kPrefill}),
       {kRequestPrefillTime}},
  };
  for (const NegativeCase& c : cases) {
    SCOPED_TRACE(c.name);
    Harness h;
    for (const Event& ev : c.events) h.Send(h.Core(), ev);
    EXPECT_EQ(h.Negative(), c.negative);
    for (EngineMetric m : c.not_observed) {
      EXPECT_EQ(h.core->hist(m).count(), 0u) << MetricName(m);
    }
  }
}

// ---- eviction and the cap
// ------------------------------------------------------

TEST(TrackerTest, EvictsIdleUnfinishedRequests) {
  TrackerOptions options;
  options.idle_timeout_ns = 10 * kSecond;
  Harness h(options);
  h.Send(h.Core(), Arrived(T(0), Rid(1), 1));
  h.Send(h.Core(), Arrived(T(0), Rid(2), 1));
  EXPECT_EQ(h.core->gauge(kNumRequestsWaiting).derived, 2);
  h.AdvanceAndSweep(6 * kSecond);
  h.Send(h.Core(), Scheduled(T(1), Rid(2)));  // activity: restarts its timer
  h.AdvanceAndSweep(4 * kSecond - 1);
  EXPECT_EQ(h.tracker->size(), 2u);
  h.AdvanceAndSweep(1);
  EXPECT_EQ(h.tracker->size(), 1u);
  EXPECT_EQ(h.tracker->evicted(), 1u);
  EXPECT_EQ(h.Tracked(), 1);
  EXPECT_EQ(h.core->gauge(kNumRequestsWaiting).derived, 0);
  EXPECT_EQ(h.core->gauge(kNumRequestsRunning).derived, 1);
  h.AdvanceAndSweep(6 * kSecond);
  EXPECT_EQ(h.tracker->size(), 0u);
  EXPECT_EQ(h.tracker->evicted(), 2u);
  EXPECT_EQ(h.Tracked(), 0);
  EXPECT_EQ(h.core->gauge(kNumRequestsRunning).derived, 0);
  // An evicted request was never finished: nothing observed at finish.
  EXPECT_EQ(h.core->hist(kE2eRequestLatency).count(), 0u);
}

TEST(TrackerTest, CapEvictsLeastRecentlyActiveRequest) {
  TrackerOptions options;
  options.max_requests = 2;
  Harness h(options);
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 1), Arrived(T(0), Rid(2), 1),
                    Tokens(T(10), Rid(1), 1)});  // 2 is now the oldest
  h.Send(h.Core(), Arrived(T(0), Rid(3), 1));
  EXPECT_EQ(h.tracker->size(), 2u);
  EXPECT_EQ(h.Tracked(), 2);
  EXPECT_EQ(h.tracker->evicted(), 1u);
  // 1 and 3 are still tracked: their tokens join their arrivals.
  h.Send(h.Core(), Tokens(T(20), Rid(3), 1));
  EXPECT_EQ(h.core->hist(kTimeToFirstToken).count(), 2u);
  h.Send(h.Core(), Tokens(T(30), Rid(1), 1));
  EXPECT_EQ(h.core->hist(kInterTokenLatency).count(), 1u);
  EXPECT_EQ(h.tracker->size(), 2u);
  // 2 is gone: its tokens start a new request (pushing out 3).
  h.Send(h.Core(), Tokens(T(40), Rid(2), 1));
  EXPECT_EQ(h.core->hist(kTimeToFirstToken).count(), 2u);
  EXPECT_EQ(h.tracker->evicted(), 2u);
  EXPECT_EQ(h.tracker->size(), 2u);
  EXPECT_EQ(h.Tracked(), 2);
}

TEST(TrackerTest, CapRetiresFinishedRequestFirstWithoutCountingEviction) {
  TrackerOptions options;
  options.max_requests = 2;
  Harness h(options);
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 1), Arrived(T(0), Rid(2), 1),
                    Finished(T(5), Rid(2), FinishReason::kAbort)});
  h.Send(h.Core(), Arrived(T(0), Rid(3), 1));
  EXPECT_EQ(h.tracker->size(), 2u);
  EXPECT_EQ(h.tracker->evicted(), 0u);
  EXPECT_EQ(h.Tracked(), 2);
  EXPECT_EQ(h.core->gauge(kNumRequestsWaiting).derived, 2);
  // 1 survived.
  h.Send(h.Core(), Tokens(T(10), Rid(1), 1));
  EXPECT_EQ(h.core->hist(kTimeToFirstToken).count(), 1u);
}

// ---- timestamps
// ------------------------------------------------------------------

struct TimestampCase {
  const char* name;
  int64_t offset_ns;  // from the clock
  bool accepted;
};

TEST(TrackerTest, RejectsTimestampsOutsideTheWindow) {
  const int64_t future = int64_t(TM_MAX_FUTURE_NS);
  const int64_t past = int64_t(TM_MAX_PAST_NS);
  const TimestampCase cases[] = {
      {"now", 0, true},
      {"at the future limit", future, true},
      {"past the future limit", future + 1, false},
      {"at the past limit", -past, true},
      {"past the past limit", -past - 1, false},
      {"far future", int64_t(1) << 62, false},
  };
  for (const TimestampCase& c : cases) {
    SCOPED_TRACE(c.name);
    Harness h;
    const uint64_t t = uint64_t(int64_t(h.clock.now) + c.offset_ns);
    h.Send(h.Core(), Arrived(t, Rid(1), 3));
    StepStats st;
    st.has = StepStats::kRunning;
    st.running = 4;
    h.Send(h.Core(), Step(t, st));
    const uint64_t bad = c.accepted ? 0 : 2;
    EXPECT_EQ(h.stats->errors(IngestError::kBadTimestamp), bad);
    EXPECT_EQ(h.tracker->size(), c.accepted ? 1u : 0u);
    EXPECT_EQ(h.core->gauge(kNumRequestsWaiting).derived, c.accepted ? 1 : 0);
    EXPECT_EQ(h.core->gauge(kNumRequestsRunning).has_set, c.accepted);
    EXPECT_EQ(h.stats->events(EventKind::kArrived), c.accepted ? 1u : 0u);
  }
}

TEST(TrackerTest, TimestampWindowFollowsOptions) {
  TrackerOptions options;
  options.max_future_ns = 5;
  options.max_past_ns = 10;
  Harness h(options);
  const uint64_t now = h.clock.now;
  h.Send(h.Core(),
         {Arrived(now + 5, Rid(1), 1), Arrived(now + 6, Rid(2), 1),
          Arrived(now - 10, Rid(3), 1), Arrived(now - 11, Rid(4), 1)});
  EXPECT_EQ(h.stats->errors(IngestError::kBadTimestamp), 2u);
  EXPECT_EQ(h.tracker->size(), 2u);
}

TEST(TrackerTest, ApplyBatchSkipsOnlyTheBadEvent) {
  Harness h;
  Batch batch;
  batch.events = {Arrived(T(0), Rid(1), 2),
                  Arrived(h.clock.now + 2 * kSecond, Rid(2), 1),
                  Tokens(T(10), Rid(1), 1)};
  h.tracker->ApplyBatch(h.Core(), batch);
  EXPECT_EQ(h.stats->errors(IngestError::kBadTimestamp), 1u);
  EXPECT_EQ(h.tracker->size(), 1u);
  ExpectHist(*h.core, kTimeToFirstToken, 1, double(10 * kMs));
  EXPECT_EQ(h.stats->events(EventKind::kArrived), 1u);
  EXPECT_EQ(h.stats->events(EventKind::kTokens), 1u);
}

// The fields the decoder dropped count as bad_field when their event is
// applied; an event then skipped for its timestamp drops none, as one the
// decoder skipped (protocol.md: a skipped event counts once).
TEST(TrackerTest, ApplyBatchCountsTheDroppedFieldsOfAppliedEventsOnly) {
  Harness h;
  Batch batch;
  batch.events = {Arrived(T(0), Rid(1), 2),
                  Arrived(h.clock.now + 2 * kSecond, Rid(2), 1),
                  Arrived(T(1), Rid(3), 1)};
  batch.bad_fields = 6;
  batch.field_drops = {{0, 1}, {1, 2}, {2, 3}};
  h.tracker->ApplyBatch(h.Core(), batch);
  EXPECT_EQ(h.stats->errors(IngestError::kBadTimestamp), 1u);
  EXPECT_EQ(h.stats->errors(IngestError::kBadField), 4u);
  EXPECT_EQ(h.tracker->size(), 2u);
}

// ---- gauges and STEP
// -----------------------------------------------------------

bool HasLine(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(TrackerTest, DerivesRunningAndWaitingWithoutStepData) {
  Harness h;
  const std::string running_core =
      "vllm:num_requests_running{model_name=\"m\",engine=\"core\"} ";
  const std::string waiting_core =
      "vllm:num_requests_waiting{model_name=\"m\",engine=\"core\"} ";
  h.Send(h.Core(), Arrived(T(0), Rid(1), 1));
  EXPECT_EQ(h.core->gauge(kNumRequestsWaiting).derived, 1);
  EXPECT_EQ(h.core->gauge(kNumRequestsRunning).derived, 0);
  EXPECT_TRUE(HasLine(h.Render(), waiting_core + "1"));
  h.Send(h.Core(), Scheduled(T(1), Rid(1)));
  EXPECT_EQ(h.core->gauge(kNumRequestsWaiting).derived, 0);
  EXPECT_EQ(h.core->gauge(kNumRequestsRunning).derived, 1);
  EXPECT_TRUE(HasLine(h.Render(), running_core + "1"));
  EXPECT_TRUE(HasLine(h.Render(), waiting_core + "0"));
  h.Send(h.Core(), Preempted(T(2), Rid(1)));
  EXPECT_EQ(h.core->gauge(kNumRequestsWaiting).derived, 1);
  EXPECT_EQ(h.core->gauge(kNumRequestsRunning).derived, 0);
  EXPECT_EQ(h.core->count(kNumPreemptions), 1u);
  h.Send(h.Core(), {Scheduled(T(3), Rid(1)), Tokens(T(4), Rid(1), 1)});
  EXPECT_EQ(h.core->gauge(kNumRequestsWaiting).derived, 0);
  EXPECT_EQ(h.core->gauge(kNumRequestsRunning).derived, 1);
  h.Send(h.Core(), Finished(T(5), Rid(1)));
  EXPECT_EQ(h.core->gauge(kNumRequestsWaiting).derived, 0);
  EXPECT_EQ(h.core->gauge(kNumRequestsRunning).derived, 0);
  EXPECT_TRUE(HasLine(h.Render(), running_core + "0"));
  // Events after FINISHED do not bring the request back into a gauge.
  h.Send(h.Core(), {Scheduled(T(6), Rid(1)), Preempted(T(7), Rid(1))});
  EXPECT_EQ(h.core->gauge(kNumRequestsWaiting).derived, 0);
  EXPECT_EQ(h.core->gauge(kNumRequestsRunning).derived, 0);
}

TEST(TrackerTest, DerivedGaugesFollowTheSourceOfTheLatestState) {
  Harness h;
  h.Send(h.Front(), Arrived(T(0), Rid(1), 1));
  EXPECT_EQ(h.front->gauge(kNumRequestsWaiting).derived, 1);
  h.Send(h.Core(), Scheduled(T(1), Rid(1)));
  EXPECT_EQ(h.front->gauge(kNumRequestsWaiting).derived, 0);
  EXPECT_EQ(h.core->gauge(kNumRequestsRunning).derived, 1);
  // An ARRIVED after the first token does not count it as waiting.
  h.Send(h.Core(), Tokens(T(10), Rid(2), 1));
  h.Send(h.Front(), Arrived(T(0), Rid(2), 1));
  EXPECT_EQ(h.front->gauge(kNumRequestsWaiting).derived, 0);
  EXPECT_EQ(h.core->gauge(kNumRequestsRunning).derived, 2);
}

TEST(TrackerTest, StepGaugesOverrideDerivedOnes) {
  Harness h;
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 1), Arrived(T(0), Rid(2), 1),
                    Scheduled(T(1), Rid(2))});
  StepStats st;
  st.has = StepStats::kRunning | StepStats::kWaiting | StepStats::kKvUsage;
  st.running = 7;
  st.waiting = 3;
  st.kv_usage = 0.25;
  h.Send(h.Core(), Step(T(2), st));
  const std::string text = h.Render();
  const std::string labels = "{model_name=\"m\",engine=\"core\"} ";
  EXPECT_TRUE(HasLine(text, "vllm:num_requests_running" + labels + "7"));
  EXPECT_TRUE(HasLine(text, "vllm:num_requests_waiting" + labels + "3"));
  EXPECT_TRUE(HasLine(text, "vllm:kv_cache_usage_perc" + labels + "0.25"));
  // A later STEP without those keys keeps the last values.
  StepStats empty;
  h.Send(h.Core(), Step(T(3), empty));
  EXPECT_TRUE(HasLine(h.Render(), "vllm:num_requests_running" + labels + "7"));
  // The other series has no STEP data and stays derived.
  EXPECT_TRUE(HasLine(
      h.Render(),
      "vllm:num_requests_running{model_name=\"m\",engine=\"front\"} 0"));
}

TEST(TrackerTest, StepCountersAndIterationTokensAccumulate) {
  Harness h;
  Batch batch;
  batch.positions = {99, 3, 1, 0, 1, 1};
  StepStats a;
  a.has = StepStats::kPromptTokens | StepStats::kGenerationTokens |
          StepStats::kPrefixQueries | StepStats::kPrefixHits |
          StepStats::kSpecDrafts | StepStats::kSpecDraftTokens |
          StepStats::kSpecAcceptedTokens | StepStats::kSpecAcceptedPerPos;
  a.prompt_tokens = 100;
  a.generation_tokens = 28;
  a.prefix_queries = 50;
  a.prefix_hits = 20;
  a.spec_drafts = 2;
  a.spec_draft_tokens = 6;
  a.spec_accepted_tokens = 4;
  a.pos_begin = 1;
  a.pos_count = 3;
  StepStats b;  // no token keys: no iteration observation
  b.has = StepStats::kPrefixQueries | StepStats::kSpecAcceptedPerPos;
  b.prefix_queries = 5;
  b.pos_begin = 4;
  b.pos_count = 2;
  StepStats c;
  c.has = StepStats::kGenerationTokens;
  c.generation_tokens = 1;
  batch.events = {Step(T(0), a), Step(T(1), b), Step(T(2), c)};
  h.tracker->ApplyBatch(h.Core(), batch);

  const Histogram& it = h.core->hist(kIterationTokens);
  EXPECT_EQ(it.count(), 2u);
  EXPECT_EQ(it.sum(), 129.0);
  EXPECT_EQ(CountIn(it, 128), 1u);
  EXPECT_EQ(CountIn(it, 1), 1u);
  EXPECT_EQ(h.core->count(kPrefixCacheQueries), 55u);
  EXPECT_EQ(h.core->count(kPrefixCacheHits), 20u);
  EXPECT_EQ(h.core->count(kSpecDecodeNumDrafts), 2u);
  EXPECT_EQ(h.core->count(kSpecDecodeNumDraftTokens), 6u);
  EXPECT_EQ(h.core->count(kSpecDecodeNumAcceptedTokens), 4u);
  EXPECT_EQ(h.core->children(kSpecDecodeNumAcceptedTokensPerPos),
            (std::vector<uint64_t>{4, 2, 0}));
  EXPECT_EQ(h.stats->events(EventKind::kStep), 3u);
  EXPECT_EQ(h.tracker->size(), 0u);  // STEP belongs to no request
  EXPECT_EQ(TotalObservations(*h.front), 0u);
}

// ---- request ids
// -----------------------------------------------------------------

TEST(TrackerTest, StringAndIntegerIdsAreDistinctRequests) {
  Harness h;
  h.Send(h.Core(), {Arrived(T(0), Rid(7), 1), Arrived(T(5), Rid("7"), 1)});
  EXPECT_EQ(h.tracker->size(), 2u);
  h.Send(h.Core(), Tokens(T(10), Rid("7"), 1));
  ExpectHist(*h.core, kTimeToFirstToken, 1, double(5 * kMs));
  h.Send(h.Core(), Tokens(T(20), Rid(7), 1));
  ExpectHist(*h.core, kTimeToFirstToken, 2, double(25 * kMs));
  EXPECT_EQ(h.tracker->size(), 2u);
}

TEST(TrackerTest, SameIdInTwoSpacesIsTwoRequests) {
  Harness h;
  h.Send(h.Core(1), Arrived(T(0), Rid("abc"), 1));
  h.Send(h.Core(2), Tokens(T(10), Rid("abc"), 1));
  h.Send(h.Core(1), Arrived(T(0), Rid(5), 1));
  h.Send(h.Core(2), Tokens(T(10), Rid(5), 1));
  EXPECT_EQ(h.tracker->size(), 4u);
  EXPECT_EQ(h.core->hist(kTimeToFirstToken).count(), 0u);
}

TEST(TrackerTest, KeepsItsOwnCopyOfStringIds) {
  Harness h;
  std::string id(128, 'x');  // the longest id the protocol allows
  id[0] = 'a';
  h.Send(h.Core(), Arrived(T(0), Rid(id), 1));
  id.assign(128, 'y');  // the frame buffer is reused
  const std::string same = "a" + std::string(127, 'x');
  h.Send(h.Core(), Tokens(T(10), Rid(same), 1));
  EXPECT_EQ(h.tracker->size(), 1u);
  ExpectHist(*h.core, kTimeToFirstToken, 1, double(10 * kMs));
  // Ids that hash alike or share a prefix do not join.
  h.Send(h.Core(), Tokens(T(10), Rid(same.substr(0, 127)), 1));
  EXPECT_EQ(h.tracker->size(), 2u);
}

TEST(TrackerTest, ExtremeIntegerIds) {
  Harness h;
  h.Send(h.Core(), {Arrived(T(0), Rid(0), 1), Arrived(T(0), Rid(UINT64_MAX), 1),
                    Tokens(T(1), Rid(0), 1), Tokens(T(2), Rid(UINT64_MAX), 1)});
  EXPECT_EQ(h.tracker->size(), 2u);
  EXPECT_EQ(h.core->hist(kTimeToFirstToken).count(), 2u);
}

// A TTFT whose first token is stamped before the ARRIVED is not observed
// (counted as negative), but the request's prompt tokens are still counted
// when it closes, in either arrival order. (A differential run against the
// previous tracker found this.)
TEST(TrackerTest, NegativeTtftStillCountsPromptTokens) {
  Harness h;
  h.Send(h.Core(), {Arrived(T(20), Rid(1), 9), Tokens(T(10), Rid(1), 1)});
  h.Send(h.Core(), {Tokens(T(30), Rid(2), 1), Arrived(T(40), Rid(2), 5)});
  EXPECT_EQ(h.core->count(kPromptTokens), 14u);
  EXPECT_EQ(h.tracker->negative(Interval::kTtft), 2u);
  EXPECT_EQ(h.core->hist(kTimeToFirstToken).count(), 0u);
}

// TPOT is one of the table's intervals: observed at FINISHED from decode /
// (tokens - 1), only with more than one token, with the finisher's labels.
TEST(TrackerTest, TpotAtFinishWithMoreThanOneToken) {
  Harness h;
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 3), Scheduled(T(1), Rid(1)),
                    Tokens(T(10), Rid(1), 1), Tokens(T(20), Rid(1), 2)});
  EXPECT_EQ(h.core->hist(kRequestTimePerOutputToken).count(), 0u);
  h.Send(h.Front(), Finished(T(30), Rid(1), FinishReason::kStop));
  EXPECT_EQ(h.front->hist(kRequestTimePerOutputToken).count(), 1u);
  EXPECT_DOUBLE_EQ(h.front->hist(kRequestTimePerOutputToken).sum(), 0.010 / 2);
  h.Send(h.Core(), {Arrived(T(0), Rid(2), 3), Tokens(T(10), Rid(2), 1),
                    Finished(T(30), Rid(2), FinishReason::kStop)});
  EXPECT_EQ(h.core->hist(kRequestTimePerOutputToken).count(), 0u);
  h.AdvanceAndSweep(10 * kSecond);
  EXPECT_EQ(h.tracker->incomplete(Interval::kTpot), 0u);
}

// A request in flight across a daemon restart: the new daemon sees some
// TOKENS and the FINISHED, never the ARRIVED. Only the inter-token
// latencies between tokens it saw are observed; every phase and the
// per-request histograms (which would be biased short or low) are not,
// and the phases are counted as incomplete.
TEST(TrackerTest, RequestWhoseStartWasNeverSeenObservesNoPhase) {
  Harness h;
  h.Send(h.Core(), {Tokens(T(100), Rid(1), 1), Tokens(T(110), Rid(1), 1),
                    Tokens(T(125), Rid(1), 1), Finished(T(130), Rid(1))});
  h.AdvanceAndSweep(10 * kSecond);
  EXPECT_EQ(h.core->hist(kInterTokenLatency).count(), 2u);
  EXPECT_EQ(TotalObservations(*h.core), 2u);  // the two ITLs only
  EXPECT_EQ(h.Incomplete(),
            Intervals({Interval::kTtft, Interval::kPrefill, Interval::kE2e,
                       Interval::kQueue, Interval::kDecode,
                       Interval::kInference, Interval::kTpot}));
  EXPECT_EQ(h.core->count(kGenerationTokens), 3u);  // the counter counts
}

// A frontend's ARRIVED that reaches the daemon after the engine core's
// FINISHED (within the grace period) completes the decode phase then.
TEST(TrackerTest, LateArrivedCompletesTheDecodePhase) {
  Harness h;
  h.Send(h.Core(), {Scheduled(T(5), Rid(1)), Tokens(T(10), Rid(1), 1),
                    Tokens(T(20), Rid(1), 1), Finished(T(30), Rid(1))});
  EXPECT_EQ(h.core->hist(kRequestDecodeTime).count(), 0u);
  EXPECT_EQ(h.core->hist(kRequestGenerationTokens).count(), 0u);
  h.Send(h.Front(), Arrived(T(0), Rid(1), 4));
  EXPECT_EQ(h.core->hist(kRequestDecodeTime).count(), 1u);
  EXPECT_EQ(h.core->hist(kRequestInferenceTime).count(), 1u);
  EXPECT_EQ(h.core->hist(kRequestTimePerOutputToken).count(), 1u);
  EXPECT_EQ(h.core->hist(kRequestGenerationTokens).count(), 1u);
  EXPECT_EQ(h.core->hist(kRequestMaxNumGenerationTokens).count(), 1u);
  h.AdvanceAndSweep(10 * kSecond);
  EXPECT_EQ(h.Incomplete(), Intervals({}));
}

// A request looked up for a later event of the chunk but evicted by an
// earlier one is not used: the later event makes a new request.
TEST(TrackerTest, ApplyBatchDoesNotUseARequestEvictedInsideTheChunk) {
  TrackerOptions options;
  options.max_requests = 2;
  Harness h(options);
  Batch first;
  first.events = {Arrived(T(0), Rid(1), 1), Arrived(T(1), Rid(2), 1)};
  h.tracker->ApplyBatch(h.Core(), first);
  Batch second;  // 3 evicts 1 (the least recently active), then 1 returns
  second.events = {Arrived(T(2), Rid(3), 1), Tokens(T(3), Rid(1), 1),
                   Tokens(T(4), Rid(1), 1)};
  h.tracker->ApplyBatch(h.Core(), second);
  EXPECT_EQ(h.tracker->evicted(), 2u);  // 1, then 2 for the new 1
  EXPECT_EQ(h.tracker->size(), 2u);
  // The new 1 has no ARRIVED: no TTFT; its second TOKENS gives one ITL.
  EXPECT_EQ(h.core->hist(kTimeToFirstToken).count(), 0u);
  ExpectHist(*h.core, kInterTokenLatency, 1, double(1 * kMs));
  // 3 is untouched: its tokens still give a TTFT from its ARRIVED.
  h.Send(h.Core(), Tokens(T(12), Rid(3), 1));
  ExpectHist(*h.core, kTimeToFirstToken, 1, double(10 * kMs));
}

// ApplyBatch() looks each chunk's requests up before applying it: the
// same as Apply() on each event in order, also where an eviction inside a
// chunk removes a request looked up for a later event of it, and for
// batches that end inside a chunk. Random streams over a small cap (so
// evictions are frequent), integer and string ids, two sources.
TEST(TrackerTest, ApplyBatchEqualsApplyingEachEvent) {
  const std::vector<std::string> names = {"a", "bb", "req-c", "d", "e-long-id"};
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(seed);
    TrackerOptions options;
    options.max_requests = 6 + seed % 5;
    options.grace_ns = 50 * kMs;
    options.idle_timeout_ns = 400 * kMs;
    Harness batched(options);
    Harness single(options);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull;
    auto next = [&x](uint64_t n) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      return x % n;
    };
    uint64_t ms = 0;
    for (int round = 0; round < 30; ++round) {
      Batch batch;
      const size_t size = next(3 * Tracker::kLookAhead + 5);
      for (size_t i = 0; i < size; ++i) {
        ms += next(3);
        const uint64_t id = next(12);
        const RequestId rid =
            id < names.size() ? Rid(std::string_view(names[id])) : Rid(id);
        switch (next(8)) {
          case 0:
            batch.events.push_back(Arrived(T(ms), rid, 1 + next(9)));
            break;
          case 1:
            batch.events.push_back(Queued(T(ms), rid));
            break;
          case 2:
            batch.events.push_back(Scheduled(T(ms), rid));
            break;
          case 3:
            batch.events.push_back(
                Finished(T(ms), rid, FinishReason(next(kNumFinishReasons))));
            break;
          case 4:
            batch.events.push_back(Preempted(T(ms), rid));
            break;
          default:
            batch.events.push_back(Tokens(T(ms), rid, 1 + next(4)));
            break;
        }
      }
      const bool front = next(4) == 0;
      batched.tracker->ApplyBatch(front ? batched.Front() : batched.Core(),
                                  batch);
      for (const Event& ev : batch.events) {
        single.Send(front ? single.Front() : single.Core(), ev);
      }
      if (next(3) == 0) {
        const uint64_t ns = next(300) * kMs;
        batched.AdvanceAndSweep(ns);
        single.AdvanceAndSweep(ns);
      }
      ASSERT_EQ(batched.tracker->size(), single.tracker->size());
      ASSERT_EQ(batched.tracker->evicted(), single.tracker->evicted());
      ASSERT_EQ(batched.Incomplete(), single.Incomplete());
      ASSERT_EQ(batched.Negative(), single.Negative());
      ASSERT_EQ(batched.Render(), single.Render());
    }
    EXPECT_GT(single.tracker->evicted(), 0u);
  }
}

TEST(TrackerTest, TrackedRequestsGaugeEqualsSize) {
  TrackerOptions options;
  options.max_requests = 50;
  options.grace_ns = kSecond;
  Harness h(options);
  for (uint64_t i = 0; i < 80; ++i) {
    h.Send(h.Core(), Arrived(T(i), Rid(i), 1));
    if (i % 3 == 0) h.Send(h.Core(), Finished(T(i + 1), Rid(i)));
    EXPECT_EQ(h.Tracked(), int64_t(h.tracker->size()));
  }
  EXPECT_EQ(h.tracker->size(), 50u);
  h.AdvanceAndSweep(kSecond);
  EXPECT_EQ(h.Tracked(), int64_t(h.tracker->size()));
  h.AdvanceAndSweep(options.idle_timeout_ns);
  EXPECT_EQ(h.tracker->size(), 0u);
  EXPECT_EQ(h.Tracked(), 0);
  EXPECT_EQ(h.core->gauge(kNumRequestsWaiting).derived, 0);
}

// ---- profiles: what only some profiles measure
// -------------------------------------------------

TEST(TrackerTest, SglangInterTokenLatencyCountsEveryToken) {
  Harness h(RegistryOptions{}, Profile::kSglang);
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 3), Tokens(T(10), Rid(1), 1),
                    Tokens(T(30), Rid(1), 4)});
  // 20 ms over 4 tokens: 4 observations of 5 ms, summing to the interval.
  const Histogram& itl = h.core->hist(kInterTokenLatencyPerToken);
  EXPECT_EQ(itl.count(), 4u);
  EXPECT_EQ(itl.sum(), 0.02);
  EXPECT_EQ(CountIn(itl, 0.006), 4u);
  EXPECT_EQ(CountIn(itl, 0.004), 0u);
  h.Send(h.Core(), Tokens(T(37), Rid(1), 1));
  EXPECT_EQ(itl.count(), 5u);
  EXPECT_EQ(itl.sum(), 0.027);
  EXPECT_EQ(CountIn(itl, 0.008), 1u);
  // vLLM's (one per TOKENS) is not measured for a series not showing it.
  EXPECT_EQ(h.core->hist(kInterTokenLatency).count(), 0u);

  Harness vllm;
  vllm.Send(vllm.Core(), {Arrived(T(0), Rid(1), 3), Tokens(T(10), Rid(1), 1),
                          Tokens(T(30), Rid(1), 4)});
  EXPECT_EQ(vllm.core->hist(kInterTokenLatencyPerToken).count(), 0u);
  ExpectHist(*vllm.core, kInterTokenLatency, 1, double(20 * kMs));
}

TEST(TrackerTest, SglangCountsTokensAndRequestsAtFinish) {
  Harness h(RegistryOptions{}, Profile::kSglang);
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 7), Tokens(T(10), Rid(1), 1),
                    Tokens(T(20), Rid(1), 3)});
  EXPECT_EQ(h.core->count(kPromptTokensAtFinish), 0u);
  EXPECT_EQ(h.core->count(kGenerationTokensAtFinish), 0u);
  EXPECT_EQ(h.core->count(kNumFinishedRequests), 0u);
  EXPECT_EQ(h.core->count(kGenerationTokens), 4u);  // as they come
  h.Send(h.Core(), Finished(T(30), Rid(1)));
  EXPECT_EQ(h.core->count(kPromptTokensAtFinish), 7u);
  EXPECT_EQ(h.core->count(kGenerationTokensAtFinish), 4u);
  EXPECT_EQ(h.core->count(kNumFinishedRequests), 1u);
  EXPECT_EQ(h.core->count(kNumAbortedRequests), 0u);
  h.Send(h.Core(), {Arrived(T(0), Rid(2), 5),
                    Finished(T(5), Rid(2), FinishReason::kAbort)});
  h.Send(h.Core(), {Arrived(T(0), Rid(3), 2), Tokens(T(8), Rid(3), 1),
                    Finished(T(9), Rid(3), FinishReason::kLength)});
  EXPECT_EQ(h.core->count(kPromptTokensAtFinish), 14u);
  EXPECT_EQ(h.core->count(kGenerationTokensAtFinish), 5u);
  EXPECT_EQ(h.core->count(kNumFinishedRequests), 3u);
  EXPECT_EQ(h.core->count(kNumAbortedRequests), 1u);
  // A repeated FINISHED counts nothing.
  h.Send(h.Core(), Finished(T(40), Rid(1), FinishReason::kAbort));
  EXPECT_EQ(h.core->count(kNumFinishedRequests), 3u);
  EXPECT_EQ(h.core->count(kNumAbortedRequests), 1u);

  Harness vllm;
  vllm.Send(vllm.Core(), {Arrived(T(0), Rid(1), 7), Tokens(T(10), Rid(1), 1),
                          Finished(T(30), Rid(1), FinishReason::kAbort)});
  EXPECT_EQ(vllm.core->count(kPromptTokensAtFinish), 0u);
  EXPECT_EQ(vllm.core->count(kNumFinishedRequests), 0u);
  EXPECT_EQ(vllm.core->count(kNumAbortedRequests), 0u);
}

TEST(TrackerTest, LmdeployTimePerOutputTokenAndIterationTokensPerChunk) {
  Harness h(RegistryOptions{}, Profile::kLmdeploy);
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 20), Scheduled(T(2), Rid(1)),
                    Tokens(T(10), Rid(1), 1)});
  // The first chunk: no interval yet; its tokens and the prompt.
  EXPECT_EQ(h.core->hist(kTimePerOutputTokenChunk).count(), 0u);
  ExpectHist(*h.core, kIterationTokensChunk, 1, 21);
  h.Send(h.Core(), {Tokens(T(30), Rid(1), 4), Tokens(T(36), Rid(1), 2)});
  // 20 ms / 4 and 6 ms / 2: once per TOKENS, not per token.
  const Histogram& tpot = h.core->hist(kTimePerOutputTokenChunk);
  ExpectHist(*h.core, kTimePerOutputTokenChunk, 2, double(8 * kMs));
  EXPECT_EQ(CountIn(tpot, 0.005), 2u);
  ExpectHist(*h.core, kInterTokenLatency, 2, double(26 * kMs));
  const Histogram& it = h.core->hist(kIterationTokensChunk);
  ExpectHist(*h.core, kIterationTokensChunk, 3, 27);
  EXPECT_EQ(CountIn(it, 32), 1u);
  EXPECT_EQ(CountIn(it, 8), 2u);
  // STEP's iteration histogram is another measurement.
  EXPECT_EQ(h.core->hist(kIterationTokens).count(), 0u);

  Harness vllm;
  vllm.Send(vllm.Core(), {Arrived(T(0), Rid(1), 20), Tokens(T(10), Rid(1), 1),
                          Tokens(T(30), Rid(1), 4)});
  EXPECT_EQ(vllm.core->hist(kTimePerOutputTokenChunk).count(), 0u);
  EXPECT_EQ(vllm.core->hist(kIterationTokensChunk).count(), 0u);
}

TEST(TrackerTest, LmdeployDecodeAndInferenceEndAtFinished) {
  Harness h(RegistryOptions{}, Profile::kLmdeploy);
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 5), Scheduled(T(5), Rid(1)),
                    Tokens(T(10), Rid(1), 1), Tokens(T(30), Rid(1), 2)});
  EXPECT_EQ(h.core->hist(kRequestDecodeToFinish).count(), 0u);
  EXPECT_EQ(h.core->hist(kRequestInferenceToFinish).count(), 0u);
  h.Send(h.Core(), Finished(T(50), Rid(1)));
  ExpectHist(*h.core, kRequestDecodeToFinish, 1, double(40 * kMs));
  ExpectHist(*h.core, kRequestInferenceToFinish, 1, double(45 * kMs));
  // vLLM's phases end at the last token.
  ExpectHist(*h.core, kRequestDecodeTime, 1, double(20 * kMs));
  ExpectHist(*h.core, kRequestInferenceTime, 1, double(25 * kMs));

  Harness vllm;
  vllm.Send(vllm.Core(), {Arrived(T(0), Rid(1), 5), Scheduled(T(5), Rid(1)),
                          Tokens(T(10), Rid(1), 1), Finished(T(50), Rid(1))});
  EXPECT_EQ(vllm.core->hist(kRequestDecodeToFinish).count(), 0u);
  EXPECT_EQ(vllm.core->hist(kRequestInferenceToFinish).count(), 0u);
}

// The tokenmeter_* interval counters do not depend on the profile: the
// LMDeploy-only rows are never counted incomplete or negative.
TEST(TrackerTest, ProfileOnlyIntervalsCountNothingIncompleteOrNegative) {
  for (Profile p : {Profile::kVllm, Profile::kSglang, Profile::kLmdeploy}) {
    SCOPED_TRACE(ProfileName(p));
    Harness h(RegistryOptions{}, p);
    // No SCHEDULED: queue, prefill and inference never close.
    h.Send(h.Core(), {Arrived(T(0), Rid(1), 5), Tokens(T(10), Rid(1), 1),
                      Tokens(T(20), Rid(1), 1), Finished(T(30), Rid(1))});
    // FINISHED timed before the first token (clocks of two processes):
    // LMDeploy's decode phase would be negative.
    h.Send(h.Core(), {Arrived(T(0), Rid(2), 5), Scheduled(T(1), Rid(2)),
                      Tokens(T(50), Rid(2), 1), Finished(T(40), Rid(2))});
    h.AdvanceAndSweep(10 * kSecond);
    EXPECT_EQ(h.Tracked(), 0);
    EXPECT_EQ(h.Incomplete(), Intervals({Interval::kQueue, Interval::kPrefill,
                                         Interval::kInference}));
    EXPECT_EQ(h.Negative(), Intervals({}));
  }
}

// ---- lora_requests_info
// ----------------------------------------------------------

ArrivedExtras Lora(std::string_view name) {
  ArrivedExtras x;
  x.lora = name;
  return x;
}

// The series' LoRA sets and the time of their last change.
struct LoraState {
  std::string running;
  std::string waiting;
  double changed;
  bool operator==(const LoraState&) const = default;
};

LoraState Lora(const EngineSeries& s) {
  const LoraPart& lora = *s.find_part<LoraPart>();
  return {lora.Set(true), lora.Set(false), lora.changed_unix_s()};
}

std::ostream& operator<<(std::ostream& os, const LoraState& l) {
  return os << "running=\"" << l.running << "\" waiting=\"" << l.waiting
            << "\" changed=" << l.changed;
}

TEST(TrackerTest, LoraSetsFollowRequestStates) {
  Harness h;
  h.core->part<LoraPart>().InitTime(100);
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "", 100}));
  h.core->part<LoraPart>().InitTime(
      150);  // a later HELLO: the sets have not changed
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "", 100}));
  h.clock.unix_s = 101;
  h.SendArrived(h.Core(), Arrived(T(0), Rid(1), 1), Lora("b"));
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "b", 101}));
  h.clock.unix_s = 102;
  h.SendArrived(h.Core(), Arrived(T(0), Rid(2), 1), Lora("a"));
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "a,b", 102}));
  h.clock.unix_s = 103;  // one more request of a waiting adapter
  h.SendArrived(h.Core(), Arrived(T(0), Rid(3), 1), Lora("a"));
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "a,b", 102}));
  h.clock.unix_s = 104;
  h.Send(h.Core(), Scheduled(T(1), Rid(1)));
  EXPECT_EQ(Lora(*h.core), (LoraState{"b", "a", 104}));
  h.clock.unix_s = 105;
  h.Send(h.Core(), Preempted(T(2), Rid(1)));
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "a,b", 105}));
  h.clock.unix_s = 106;
  h.Send(h.Core(), Scheduled(T(3), Rid(1)));
  EXPECT_EQ(Lora(*h.core), (LoraState{"b", "a", 106}));
  h.clock.unix_s = 107;
  h.Send(h.Core(), Finished(T(4), Rid(1)));
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "a", 107}));
  // The first TOKENS makes a request running too.
  h.clock.unix_s = 108;
  h.Send(h.Core(), Tokens(T(5), Rid(2), 1));
  EXPECT_EQ(Lora(*h.core), (LoraState{"a", "a", 108}));
  h.clock.unix_s = 109;
  h.Send(h.Core(), Finished(T(6), Rid(2)));
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "a", 109}));
  // Requests without an adapter change nothing.
  h.clock.unix_s = 110;
  h.Send(h.Core(), {Arrived(T(0), Rid(4), 1), Scheduled(T(7), Rid(4)),
                    Finished(T(8), Rid(4))});
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "a", 109}));
  h.clock.unix_s = 111;
  h.Send(h.Core(), Scheduled(T(9), Rid(3)));
  EXPECT_EQ(Lora(*h.core), (LoraState{"a", "", 111}));
  EXPECT_EQ(h.core->find_part<LoraPart>()->max_lora(), "0");
}

TEST(TrackerTest, LoraSetsAreSortedAndJoinedWithoutSpaces) {
  Harness h;
  const char* names[] = {"zeta", "alpha", "m-2", "m-10", "Beta"};
  uint64_t rid = 1;
  for (const char* n : names) {
    h.SendArrived(h.Core(), Arrived(T(0), Rid(rid++), 1), Lora(n));
  }
  EXPECT_EQ(h.core->find_part<LoraPart>()->Set(false),
            "Beta,alpha,m-10,m-2,zeta");
  EXPECT_EQ(h.core->find_part<LoraPart>()->Set(true), "");
}

TEST(TrackerTest, LoraSetsMoveAcrossTwoConnections) {
  Harness h;
  h.clock.unix_s = 200;
  h.SendArrived(h.Front(), Arrived(T(0), Rid(1), 1), Lora("x"));
  EXPECT_EQ(Lora(*h.front), (LoraState{"", "x", 200}));
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "", 0}));
  h.clock.unix_s = 201;
  h.Send(h.Core(), Scheduled(T(1), Rid(1)));
  EXPECT_EQ(Lora(*h.front), (LoraState{"", "", 201}));
  EXPECT_EQ(Lora(*h.core), (LoraState{"x", "", 201}));
  h.clock.unix_s = 202;
  h.Send(h.Core(), Preempted(T(2), Rid(1)));
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "x", 202}));
  h.clock.unix_s = 203;
  h.Send(h.Front(), Finished(T(3), Rid(1)));
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "", 203}));
  EXPECT_EQ(Lora(*h.front), (LoraState{"", "", 201}));
}

TEST(TrackerTest, LateArrivedJoinsTheLoraSetItsRequestIsIn) {
  Harness h;
  h.Send(h.Core(), Tokens(T(10), Rid(1), 1));  // running, no adapter known
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "", 0}));
  h.clock.unix_s = 301;
  h.SendArrived(h.Front(), Arrived(T(0), Rid(1), 1), Lora("late"));
  EXPECT_EQ(Lora(*h.core), (LoraState{"late", "", 301}));
  EXPECT_EQ(Lora(*h.front), (LoraState{"", "", 0}));
  h.clock.unix_s = 302;
  h.Send(h.Core(), Finished(T(20), Rid(1)));
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "", 302}));
  // One that finished before its ARRIVED came is in no set.
  h.Send(h.Core(), Finished(T(20), Rid(2)));
  h.clock.unix_s = 303;
  h.SendArrived(h.Core(), Arrived(T(0), Rid(2), 1), Lora("gone"));
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "", 302}));
}

TEST(TrackerTest, EvictedRequestLeavesItsLoraSet) {
  TrackerOptions options;
  options.idle_timeout_ns = 10 * kSecond;
  Harness h(options);
  h.clock.unix_s = 400;
  h.SendArrived(h.Core(), Arrived(T(0), Rid(1), 1), Lora("x"));
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "x", 400}));
  h.clock.unix_s = 411;
  h.AdvanceAndSweep(11 * kSecond);
  EXPECT_EQ(h.tracker->evicted(), 1u);
  EXPECT_EQ(Lora(*h.core), (LoraState{"", "", 411}));
}

// ---- per-request labels
// ----------------------------------------------------------

RegistryOptions LabelOptions(std::vector<std::string> names, size_t values) {
  RegistryOptions o;
  o.request_labels = std::move(names);
  o.request_label_values = values;
  return o;
}

ArrivedExtras Labels(
    std::initializer_list<std::pair<std::string_view, std::string_view>> l) {
  ArrivedExtras x;
  for (const auto& p : l) x.labels[x.num_labels++] = p;
  return x;
}

// ARRIVED (with `labels`), 2 tokens and FINISHED of request `rid`.
void Lifecycle(Harness& h, const Source& arrive, const Source& rest,
               uint64_t rid, const ArrivedExtras& labels) {
  h.SendArrived(arrive, Arrived(T(0), Rid(rid), 3), labels);
  h.Send(rest, {Tokens(T(10), Rid(rid), 1), Tokens(T(20), Rid(rid), 1),
                Finished(T(30), Rid(rid))});
}

// The number of lines of `text` that start with `prefix`.
size_t LinesStartingWith(const std::string& text, const std::string& prefix) {
  size_t n = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    if (text.compare(at, prefix.size(), prefix) == 0) ++n;
    at = end + 1;
  }
  return n;
}

// An engine's own value "__other__" is the overflow's value: one sample
// (never two with the same labels), and not counted as an overflow.
TEST(TrackerTest, AnEnginesOwnOtherValueIsTheOverflowsSample) {
  Harness h(LabelOptions({"tenant"}, 1), Profile::kVllm);
  Lifecycle(h, h.Core(), h.Core(), 1, Labels({{"tenant", "__other__"}}));
  Lifecycle(h, h.Core(), h.Core(), 2, Labels({{"tenant", "a"}}));
  Lifecycle(h, h.Core(), h.Core(), 3, Labels({{"tenant", "b"}}));  // cap: 1
  EXPECT_EQ(h.registry->request_labels().overflow(0), 1u);         // b
  const std::string text = h.Render();
  const std::string other =
      "vllm:generation_tokens_total{model_name=\"m\",engine=\"core\","
      "tenant=\"__other__\"}";
  EXPECT_TRUE(HasLine(text, other + " 4")) << text;
  EXPECT_EQ(LinesStartingWith(text, other), 1u);
}

TEST(TrackerTest, RequestLabelValuesAreCappedPerSeries) {
  Harness h(LabelOptions({"tenant"}, 2), Profile::kVllm);
  uint64_t rid = 1;
  for (const char* v : {"a", "b", "c", "a", "", "d"}) {
    Lifecycle(h, h.Core(), h.Core(), rid++, Labels({{"tenant", v}}));
  }
  Lifecycle(h, h.Core(), h.Core(), rid++, Labels({}));  // no tenant at all
  // Not a --request-label: ignored.
  Lifecycle(h, h.Core(), h.Core(), rid++, Labels({{"user", "u1"}}));
  EXPECT_EQ(h.registry->request_labels().overflow(0), 2u);  // c, d
  const std::string text = h.Render();
  const std::string p = "vllm:generation_tokens_total{model_name=\"m\",";
  EXPECT_TRUE(HasLine(text, p + "engine=\"core\",tenant=\"\"} 6")) << text;
  EXPECT_TRUE(HasLine(text, p + "engine=\"core\",tenant=\"a\"} 4"));
  EXPECT_TRUE(HasLine(text, p + "engine=\"core\",tenant=\"b\"} 2"));
  EXPECT_TRUE(HasLine(text, p + "engine=\"core\",tenant=\"__other__\"} 4"));
  EXPECT_EQ(text.find("tenant=\"c\""), std::string::npos);
  EXPECT_EQ(text.find("tenant=\"d\""), std::string::npos);
  EXPECT_EQ(text.find("u1"), std::string::npos);
  EXPECT_TRUE(HasLine(text,
                      "vllm:request_success_total{model_name=\"m\",engine="
                      "\"core\",tenant=\"a\",finished_reason=\"stop\"} 2"));
  EXPECT_TRUE(HasLine(text,
                      "vllm:time_to_first_token_seconds_count{model_name=\"m\","
                      "engine=\"core\",tenant=\"__other__\"} 2"));
  EXPECT_TRUE(HasLine(text,
                      "vllm:prompt_tokens_total{model_name=\"m\",engine="
                      "\"core\",tenant=\"b\"} 3"));
  EXPECT_TRUE(HasLine(text,
                      "vllm:num_requests_running{model_name=\"m\",engine="
                      "\"core\"} 0"));
  EXPECT_TRUE(HasLine(
      text, "tokenmeter_request_label_overflow_total{label=\"tenant\"} 2"));
  // The other series has its own places.
  Lifecycle(h, h.Front(), h.Front(), rid++, Labels({{"tenant", "c"}}));
  EXPECT_TRUE(HasLine(h.Render(), p + "engine=\"front\",tenant=\"c\"} 2"));
  EXPECT_EQ(h.registry->request_labels().overflow(0), 2u);
}

TEST(TrackerTest, TwoRequestLabelsCombine) {
  Harness h(LabelOptions({"tenant", "tier"}, 100), Profile::kVllm);
  Lifecycle(h, h.Core(), h.Core(), 1, Labels({{"tier", "x"}, {"tenant", "a"}}));
  Lifecycle(h, h.Core(), h.Core(), 2, Labels({{"tenant", "a"}}));
  Lifecycle(h, h.Core(), h.Core(), 3, Labels({{"tier", "x"}}));
  Lifecycle(h, h.Core(), h.Core(), 4, Labels({{"tenant", "a"}, {"tier", "x"}}));
  const std::string text = h.Render();
  const std::string p =
      "vllm:request_generation_tokens_count{model_name=\"m\",engine=\"core\",";
  EXPECT_TRUE(HasLine(text, p + "tenant=\"a\",tier=\"x\"} 2")) << text;
  EXPECT_TRUE(HasLine(text, p + "tenant=\"a\",tier=\"\"} 1"));
  EXPECT_TRUE(HasLine(text, p + "tenant=\"\",tier=\"x\"} 1"));
  // Every request had a label: no copy with both empty.
  EXPECT_EQ(text.find("tenant=\"\",tier=\"\""), std::string::npos);
  EXPECT_EQ(h.core->cells().size(), 3u);
}

// The empty-label copy of the request-level families appears once a
// request without labels was observed into the series (an always-present
// one at zero would make per-series averages NaN).
TEST(TrackerTest, EmptyLabelCopyAppearsOnceARequestWithoutLabelsCounts) {
  Harness h(LabelOptions({"tenant"}, 10), Profile::kVllm);
  const std::string p =
      "vllm:generation_tokens_total{model_name=\"m\",engine=\"core\",";
  Lifecycle(h, h.Core(), h.Core(), 1, Labels({{"tenant", "a"}}));
  std::string text = h.Render();
  EXPECT_TRUE(HasLine(text, p + "tenant=\"a\"} 2")) << text;
  EXPECT_EQ(text.find("tenant=\"\""), std::string::npos);
  // Gauges carry no request label and are there all along.
  EXPECT_TRUE(HasLine(
      text, "vllm:num_requests_running{model_name=\"m\",engine=\"core\"} 0"));
  Lifecycle(h, h.Core(), h.Core(), 2, Labels({{"user", "u"}}));
  text = h.Render();
  EXPECT_TRUE(HasLine(text, p + "tenant=\"\"} 2")) << text;
  EXPECT_TRUE(HasLine(text, p + "tenant=\"a\"} 2"));
  // The other series has had no request at all.
  EXPECT_EQ(text.find("engine=\"front\",tenant=\"\""), std::string::npos);
}

TEST(TrackerTest, RequestLabelValueAdmittedOnAnotherSeries) {
  Harness h(LabelOptions({"tenant"}, 1), Profile::kVllm);
  const std::string p = "vllm:generation_tokens_total{model_name=\"m\",";
  // Core's one place goes to "b"; "a" arrives on the frontend, which has
  // room, and its tokens come from the core, which has none: __other__
  // there, counted once as overflow nowhere (it was admitted where it
  // arrived).
  Lifecycle(h, h.Core(), h.Core(), 1, Labels({{"tenant", "b"}}));
  Lifecycle(h, h.Front(), h.Core(), 2, Labels({{"tenant", "a"}}));
  std::string text = h.Render();
  EXPECT_TRUE(HasLine(text, p + "engine=\"core\",tenant=\"b\"} 2")) << text;
  EXPECT_TRUE(HasLine(text, p + "engine=\"core\",tenant=\"__other__\"} 2"));
  EXPECT_EQ(text.find("tenant=\"a\""), std::string::npos);
  EXPECT_EQ(h.registry->request_labels().overflow(0), 0u);
  // "a" again on the frontend, all of it there this time.
  Lifecycle(h, h.Front(), h.Front(), 3, Labels({{"tenant", "a"}}));
  EXPECT_TRUE(HasLine(h.Render(), p + "engine=\"front\",tenant=\"a\"} 2"));
  // The frontend is full now: "b" becomes __other__ where it arrives, and
  // so it is in the core too.
  Lifecycle(h, h.Front(), h.Core(), 4, Labels({{"tenant", "b"}}));
  EXPECT_EQ(h.registry->request_labels().overflow(0), 1u);
  EXPECT_TRUE(HasLine(h.Render(), p + "engine=\"core\",tenant=\"b\"} 2"));
  EXPECT_TRUE(
      HasLine(h.Render(), p + "engine=\"core\",tenant=\"__other__\"} 4"));

  // With room on both, the core takes the frontend's value.
  Harness roomy(LabelOptions({"tenant"}, 2), Profile::kVllm);
  Lifecycle(roomy, roomy.Front(), roomy.Core(), 1, Labels({{"tenant", "a"}}));
  EXPECT_TRUE(HasLine(roomy.Render(), p + "engine=\"core\",tenant=\"a\"} 2"));
}

TEST(TrackerTest, EventsBeforeTheArrivedCountWithEmptyLabels) {
  Harness h(LabelOptions({"tenant"}, 10), Profile::kVllm);
  h.Send(h.Core(), Tokens(T(10), Rid(1), 5));
  h.SendArrived(h.Front(), Arrived(T(0), Rid(1), 3), Labels({{"tenant", "a"}}));
  h.Send(h.Core(), {Tokens(T(20), Rid(1), 2), Finished(T(30), Rid(1))});
  const std::string text = h.Render();
  const std::string p =
      "vllm:generation_tokens_total{model_name=\"m\",engine=\"core\",";
  EXPECT_TRUE(HasLine(text, p + "tenant=\"\"} 5")) << text;
  EXPECT_TRUE(HasLine(text, p + "tenant=\"a\"} 2"));
}

// A flood of distinct values on one series: past the cap every one is
// __other__, none is kept, and other series still get places of their own.
TEST(TrackerTest, RequestLabelFloodKeepsNoValueBeyondTheCap) {
  Harness h(LabelOptions({"tenant"}, 100), Profile::kVllm);
  for (uint64_t i = 0; i < 70'000; ++i) {
    const std::string v = "t" + std::to_string(i);
    h.SendArrived(h.Front(), Arrived(T(0), Rid(i), 1), Labels({{"tenant", v}}));
    h.Send(h.Front(), Finished(T(1), Rid(i)));
  }
  const RequestLabels& labels = h.registry->request_labels();
  EXPECT_EQ(labels.overflow(0), 70'000u - 100u);
  EXPECT_TRUE(labels.Find(0, "t99").has_value());
  EXPECT_FALSE(labels.Find(0, "t100").has_value());
  EXPECT_FALSE(labels.Find(0, "t69999").has_value());
  EXPECT_EQ(h.front->cells().size(), 101u);  // 100 values and __other__
  Lifecycle(h, h.Core(), h.Core(), 100'000, Labels({{"tenant", "fresh"}}));
  EXPECT_TRUE(HasLine(h.Render(),
                      "vllm:generation_tokens_total{model_name=\"m\",engine="
                      "\"core\",tenant=\"fresh\"} 2"));
  EXPECT_EQ(labels.overflow(0), 70'000u - 100u);
}

// ---- MoE expert load
// ----------------------------------------------------------

// Applies EXPERT_LOAD of `layer` with `counts` (Batch::positions).
void SendExpertLoad(Harness& h, const Source& src, uint32_t layer,
                    std::vector<uint64_t> counts) {
  Event ev{};
  ev.kind = EventKind::kExpertLoad;
  ev.t_ns = T(1);
  ev.expert_load_ref = {layer, 0, uint32_t(counts.size())};
  h.tracker->Apply(src, ev, counts.data(), h.clock.NowNs());
}

// The per-expert counts of `layer` on `s` (empty when none are kept).
std::vector<uint64_t> Experts(const EngineSeries& s, uint32_t layer) {
  const MoePart::Layer* l = s.find_part<MoePart>()->FindLayer(layer);
  if (l == nullptr) return {};
  return {l->expert_tokens().begin(), l->expert_tokens().end()};
}

TEST(TrackerTest, ExpertLoadAddsUpPerLayerAndExpert) {
  RegistryOptions options;
  options.moe_expert_series = true;
  Harness h(options, Profile::kVllm);
  SendExpertLoad(h, h.Core(), 2, {6, 2, 0, 0});
  SendExpertLoad(h, h.Core(), 2, {1, 1, 1, 1});
  SendExpertLoad(h, h.Core(), 5, {0, 0});
  EXPECT_EQ(h.stats->events(EventKind::kExpertLoad), 3u);
  const MoePart& moe = *h.core->find_part<MoePart>();
  ASSERT_EQ(moe.layers().size(), 2u);
  EXPECT_EQ(Experts(*h.core, 2), (std::vector<uint64_t>{7, 3, 1, 1}));
  EXPECT_EQ(moe.FindLayer(2)->routed, 12u);
  // The latest non-zero load.
  EXPECT_DOUBLE_EQ(moe.FindLayer(2)->imbalance, 1.0);
  EXPECT_FALSE(moe.FindLayer(5)->has_imbalance);  // known, never loaded
  EXPECT_EQ(h.core->hist(kMoeImbalance).count(), 2u);
  EXPECT_DOUBLE_EQ(h.core->hist(kMoeImbalance).sum(), 4.0);  // 3 + 1
  EXPECT_EQ(h.front->find_part<MoePart>(), nullptr);
}

TEST(TrackerTest, ExpertLoadWithAnotherExpertCountIsABadEvent) {
  RegistryOptions options;
  options.moe_expert_series = true;
  Harness h(options, Profile::kVllm);
  SendExpertLoad(h, h.Core(), 0, {0, 0, 0});  // fixes 3 experts
  SendExpertLoad(h, h.Core(), 0, {1, 2});
  SendExpertLoad(h, h.Core(), 0, {1, 2, 3, 4});
  SendExpertLoad(h, h.Core(), 0, {1, 1, 1});
  EXPECT_EQ(h.stats->errors(IngestError::kBadEvent), 2u);
  EXPECT_EQ(h.stats->events(EventKind::kExpertLoad), 2u);
  EXPECT_EQ(Experts(*h.core, 0), (std::vector<uint64_t>{1, 1, 1}));
  // Another series has its own layers.
  SendExpertLoad(h, h.Front(), 0, {9, 9});
  EXPECT_EQ(Experts(*h.front, 0).size(), 2u);
}

// Without --moe-expert-series nothing exposed needs a layer's per-expert
// counts: a layer of 1024 experts keeps none (issue 28, defect 4).
TEST(TrackerTest, ExpertLoadKeepsNoPerExpertCountsWithoutTheOption) {
  Harness h;
  SendExpertLoad(h, h.Core(), 4095, std::vector<uint64_t>(1024, 2));
  SendExpertLoad(h, h.Core(), 4095, std::vector<uint64_t>(1024, 1));
  EXPECT_EQ(h.stats->events(EventKind::kExpertLoad), 2u);
  const MoePart::Layer* l = h.core->find_part<MoePart>()->FindLayer(4095);
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->experts, nullptr);
  EXPECT_EQ(l->expert_count, 1024u);
  EXPECT_EQ(l->routed, 3u * 1024);
  EXPECT_DOUBLE_EQ(l->imbalance, 1.0);
  SendExpertLoad(h, h.Core(), 4095, std::vector<uint64_t>(1023, 1));
  EXPECT_EQ(h.stats->errors(IngestError::kBadEvent), 1u);
}

// --max-moe-layers: the layers of all series together; a new layer beyond
// it is refused and counted as series_limit, a known one still adds up.
TEST(TrackerTest, ExpertLoadBeyondTheMoeLayerCapIsRefusedAndCounted) {
  RegistryOptions options;
  options.max_moe_layers = 3;
  Harness h(options, Profile::kVllm);
  SendExpertLoad(h, h.Core(), 0, {1, 1});
  SendExpertLoad(h, h.Core(), 4095, {1, 1});
  SendExpertLoad(h, h.Front(), 0, {1, 1});  // another series' layer 0
  EXPECT_EQ(h.registry->moe_layers(), 3u);
  EXPECT_EQ(h.registry->series_rejected(), 0u);
  SendExpertLoad(h, h.Front(), 1, {1, 1});  // a fourth: refused
  SendExpertLoad(h, h.Core(), 7, {5});      // also refused
  EXPECT_EQ(h.stats->errors(IngestError::kSeriesLimit), 2u);
  EXPECT_EQ(h.registry->series_rejected(), 2u);
  EXPECT_EQ(h.registry->moe_layers(), 3u);
  EXPECT_FALSE(h.front->find_part<MoePart>()->has_layer(1));
  EXPECT_FALSE(h.core->find_part<MoePart>()->has_layer(7));
  SendExpertLoad(h, h.Front(), 0, {2, 2});  // known: still applied
  EXPECT_EQ(h.front->find_part<MoePart>()->FindLayer(0)->routed, 6u);
  EXPECT_EQ(h.stats->events(EventKind::kExpertLoad), 4u);
  // A refused first EXPERT_LOAD makes no part; 0 refuses every one.
  RegistryOptions none;
  none.max_moe_layers = 0;
  Harness off(none, Profile::kVllm);
  SendExpertLoad(off, off.Core(), 0, {1});
  EXPECT_EQ(off.stats->errors(IngestError::kSeriesLimit), 1u);
  EXPECT_EQ(off.core->find_part<MoePart>(), nullptr);
}

TEST(TrackerTest, ExpertSeriesCountTowardTheSeriesCap) {
  RegistryOptions options;
  options.max_engine_series = 2 + 6;  // the harness's two series, 6 more
  options.moe_expert_series = true;
  Harness h(options, Profile::kVllm);
  SendExpertLoad(h, h.Core(), 0, {1, 1, 1, 1});  // 4 places
  SendExpertLoad(h, h.Core(), 1, {1, 1, 1});     // 3 more: no room
  SendExpertLoad(h, h.Core(), 2, {1, 1});        // 2: fits
  SendExpertLoad(h, h.Core(), 0, {1, 1, 1, 1});  // known layer: no new place
  EXPECT_EQ(h.stats->errors(IngestError::kSeriesLimit), 1u);
  EXPECT_EQ(h.stats->events(EventKind::kExpertLoad), 3u);
  EXPECT_FALSE(h.core->find_part<MoePart>()->has_layer(1));
  EXPECT_EQ(h.registry->GetOrCreate({"vllm", "m", "new", {}}), nullptr);
  // Without the option, layers take no place.
  RegistryOptions two;
  two.max_engine_series = 2;
  Harness plain(two, Profile::kVllm);
  SendExpertLoad(plain, plain.Core(), 0, std::vector<uint64_t>(1024, 1));
  EXPECT_EQ(plain.stats->events(EventKind::kExpertLoad), 1u);
}

}  // namespace
}  // namespace tokenmeter::daemon

// ---- protocol 1.2
// --------------------------------------------------------------

namespace tokenmeter::daemon {
namespace {

Event ScheduledWithInfo(uint64_t t, RequestId rid, uint32_t cached,
                        uint32_t external) {
  Event e = Scheduled(t, rid);
  e.scheduled =
      ScheduledInfo{cached, external,
                    ScheduledInfo::kCached | ScheduledInfo::kExternal, true};
  return e;
}

Event KvTransfer(uint64_t t, RequestId rid, KvRole role, uint64_t start,
                 bool ok = true, std::string_view reason = {},
                 int64_t bytes = -1) {
  Event e = Ev(EventKind::kKvTransfer, t, rid);
  e.kv_transfer = KvTransferInfo{};
  e.kv_transfer.role = role;
  e.kv_transfer.start_ns = start;
  e.kv_transfer.ok = ok;
  e.kv_transfer.reason = TextRef::Of(reason);
  if (bytes >= 0) {
    e.kv_transfer.has_bytes = true;
    e.kv_transfer.bytes = uint64_t(bytes);
  }
  return e;
}

Event Rejected(uint64_t t, std::string_view reason) {
  Event e{};
  e.kind = EventKind::kAdmissionRejected;
  e.t_ns = t;
  e.admission = AdmissionInfo{TextRef::Of(reason), false};
  return e;
}

Event Sleep(uint64_t t, SchedulerState s, WeightsState w, KvCacheState k) {
  Event e{};
  e.kind = EventKind::kSleep;
  e.t_ns = t;
  e.sleep = SleepInfo{s, w, k};
  return e;
}

const std::string kCoreLabels = "{model_name=\"m\",engine=\"core\"";

std::string BySource(const std::string& source) {
  return "vllm:prompt_tokens_by_source_total" + kCoreLabels + ",source=\"" +
         source + "\"} ";
}

TEST(Tracker12Test, CountsPromptTokensBySourceAtTheFirstToken) {
  Harness h;
  h.Send(h.Core(),
         {Arrived(T(0), Rid(1), 100), ScheduledWithInfo(T(5), Rid(1), 30, 20)});
  // Nothing before the first token.
  EXPECT_TRUE(HasLine(h.Render(), BySource("local_compute") + "0"));
  h.Send(h.Core(), {Tokens(T(10), Rid(1), 1), Tokens(T(20), Rid(1), 1)});
  // Without info every prompt token was computed.
  h.Send(h.Core(), {Arrived(T(0), Rid(2), 7), Scheduled(T(5), Rid(2)),
                    Tokens(T(10), Rid(2), 1)});
  const std::string text = h.Render();
  EXPECT_TRUE(HasLine(text, BySource("local_compute") + "57"));
  EXPECT_TRUE(HasLine(text, BySource("local_cache_hit") + "30"));
  EXPECT_TRUE(HasLine(text, BySource("external_kv_transfer") + "20"));
  EXPECT_TRUE(
      HasLine(text, "vllm:prompt_tokens_cached_total" + kCoreLabels + "} 50"));
  EXPECT_TRUE(
      HasLine(text, "vllm:prompt_tokens_total" + kCoreLabels + "} 107"));
  EXPECT_EQ(h.stats->errors(IngestError::kBadField), 0u);
}

// SGLang counts prompt_tokens at FINISHED, also for a request that ended
// before its first token: the sources of such a request's tokens are
// counted then, so that the three sum to prompt_tokens once the requests
// finished, and a first token that comes after the FINISHED adds none.
TEST(Tracker12Test, SglangSourcesSumToPromptTokensAtFinish) {
  Harness h(RegistryOptions{}, Profile::kSglang);
  const auto by_source = [&](const std::string& source) {
    return "sglang:prompt_tokens_by_source_total" + kCoreLabels + ",source=\"" +
           source + "\"} ";
  };
  const auto expect = [&](uint64_t computed, uint64_t cache, uint64_t ext,
                          uint64_t prompt) {
    const std::string text = h.Render();
    EXPECT_TRUE(
        HasLine(text, by_source("local_compute") + std::to_string(computed)));
    EXPECT_TRUE(
        HasLine(text, by_source("local_cache_hit") + std::to_string(cache)));
    EXPECT_TRUE(
        HasLine(text, by_source("external_kv_transfer") + std::to_string(ext)));
    EXPECT_TRUE(HasLine(text, "sglang:prompt_tokens_cached_total" +
                                  kCoreLabels + "} " +
                                  std::to_string(cache + ext)));
    EXPECT_TRUE(HasLine(text, "sglang:prompt_tokens_total" + kCoreLabels +
                                  "} " + std::to_string(prompt)));
  };
  // A request with tokens: its sources at the first token, as in every
  // profile; SGLang's prompt_tokens at its FINISHED.
  h.Send(h.Core(),
         {Arrived(T(0), Rid(1), 100), ScheduledWithInfo(T(5), Rid(1), 30, 20),
          Tokens(T(10), Rid(1), 1)});
  expect(50, 30, 20, 0);
  h.Send(h.Core(), Finished(T(20), Rid(1)));
  expect(50, 30, 20, 100);
  // Aborted before its first token: both at its FINISHED.
  h.Send(h.Core(),
         {Arrived(T(0), Rid(2), 70), ScheduledWithInfo(T(5), Rid(2), 10, 0)});
  expect(50, 30, 20, 100);
  h.Send(h.Core(), Finished(T(8), Rid(2), FinishReason::kAbort));
  expect(110, 40, 20, 170);
  // Without SCHEDULED: all computed.
  h.Send(h.Core(), {Arrived(T(0), Rid(3), 9),
                    Finished(T(3), Rid(3), FinishReason::kAbort)});
  expect(119, 40, 20, 179);
  // A first token after the FINISHED (another connection, in the grace
  // period) closes TTFT and counts no source again.
  h.Send(h.Core(), Tokens(T(9), Rid(2), 1));
  EXPECT_EQ(h.core->hist(kTimeToFirstToken).count(), 2u);
  expect(119, 40, 20, 179);

  // The vllm profile is unchanged: a request without a first token counts
  // neither prompt_tokens nor its sources.
  Harness vllm;
  vllm.Send(vllm.Core(),
            {Arrived(T(0), Rid(2), 70), ScheduledWithInfo(T(5), Rid(2), 10, 0),
             Finished(T(8), Rid(2), FinishReason::kAbort)});
  const std::string text = vllm.Render();
  EXPECT_TRUE(HasLine(text, BySource("local_compute") + "0"));
  EXPECT_TRUE(HasLine(text, "vllm:prompt_tokens_total" + kCoreLabels + "} 0"));
}

TEST(Tracker12Test, DropsScheduledInfoAboveThePromptInEitherOrder) {
  Harness h;
  // Info first, ARRIVED later: checked when ARRIVED comes.
  h.Send(h.Core(), {ScheduledWithInfo(T(5), Rid(1), 60, 50),
                    Arrived(T(0), Rid(1), 100), Tokens(T(10), Rid(1), 1)});
  EXPECT_EQ(h.stats->errors(IngestError::kBadField), 1u);
  // ARRIVED first.
  h.Send(h.Core(),
         {Arrived(T(0), Rid(2), 10), ScheduledWithInfo(T(5), Rid(2), 11, 0),
          Tokens(T(10), Rid(2), 1)});
  EXPECT_EQ(h.stats->errors(IngestError::kBadField), 2u);
  // A later SCHEDULED's info is ignored (the first one's counts).
  h.Send(h.Core(),
         {Arrived(T(0), Rid(3), 10), Scheduled(T(5), Rid(3)),
          ScheduledWithInfo(T(6), Rid(3), 10, 0), Tokens(T(10), Rid(3), 1)});
  const std::string text = h.Render();
  EXPECT_TRUE(HasLine(text, BySource("local_compute") + "120"));
  EXPECT_TRUE(HasLine(text, BySource("local_cache_hit") + "0"));
}

TEST(Tracker12Test, ObservesComputedTokensPreemptionsAndKvWaitAtFinish) {
  Harness h;
  h.Send(h.Core(),
         {Arrived(T(0), Rid(1), 100), ScheduledWithInfo(T(10), Rid(1), 0, 100),
          KvTransfer(T(60), Rid(1), KvRole::kRecv, T(20)),
          KvTransfer(T(90), Rid(1), KvRole::kRecv, T(70)),
          Tokens(T(100), Rid(1), 1), Preempted(T(110), Rid(1)),
          Preempted(T(120), Rid(1)), Tokens(T(130), Rid(1), 1),
          Finished(T(140), Rid(1))});
  const EngineSeries& s = *h.core;
  EXPECT_EQ(s.hist(kRequestPrefillKvComputedTokens).count(), 1u);
  EXPECT_EQ(s.hist(kRequestPrefillKvComputedTokens).sum(), 0.0);
  EXPECT_EQ(s.hist(kRequestNumPreemptions).count(), 1u);
  EXPECT_EQ(s.hist(kRequestNumPreemptions).sum(), 2.0);
  // The first successful recv, 50 ms after SCHEDULED.
  ASSERT_EQ(s.hist(kRequestKvWaitTime).count(), 1u);
  EXPECT_DOUBLE_EQ(s.hist(kRequestKvWaitTime).sum(), 0.05);

  // Every recv failed: no KV wait, nothing incomplete.
  h.Send(h.Core(),
         {Arrived(T(0), Rid(2), 8), Scheduled(T(10), Rid(2)),
          KvTransfer(T(30), Rid(2), KvRole::kRecv, T(20), false, "timeout"),
          Tokens(T(40), Rid(2), 1), Finished(T(50), Rid(2))});
  EXPECT_EQ(s.hist(kRequestKvWaitTime).count(), 1u);
  EXPECT_EQ(s.hist(kRequestNumPreemptions).count(), 2u);
  EXPECT_EQ(s.hist(kRequestPrefillKvComputedTokens).sum(), 8.0);
  h.AdvanceAndSweep(3600 * kSecond);
  EXPECT_EQ(h.Tracked(), 0);
  EXPECT_EQ(h.Incomplete(), (std::array<uint64_t, size_t(Interval::kCount)>{}));
}

// The KV wait is an interval like the others (protocol-v1.md: a negative
// one is never observed and is counted): it exists for a finished request
// with a successful recv (also one that comes after the FINISHED, before
// the request is retired), it closes once SCHEDULED is known, a recv
// before SCHEDULED counts it negative, and one whose SCHEDULED never comes
// counts incomplete at retirement. It needs no ARRIVED: both of its ends
// are the decode side's own.
TEST(Tracker12Test, KvWaitIsAnInterval) {
  Harness h;
  const EngineSeries& s = *h.core;
  // A recv before SCHEDULED (its t 10 ms before): negative, not observed.
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 8),
                    KvTransfer(T(20), Rid(1), KvRole::kRecv, T(5)),
                    Scheduled(T(30), Rid(1)), Tokens(T(40), Rid(1), 1),
                    Finished(T(50), Rid(1))});
  EXPECT_EQ(s.hist(kRequestKvWaitTime).count(), 0u);
  EXPECT_EQ(h.Negative(), Intervals({Interval::kKvWait}));
  // No ARRIVED: observed all the same (20 ms).
  h.Send(h.Core(), {Scheduled(T(10), Rid(2)),
                    KvTransfer(T(30), Rid(2), KvRole::kRecv, T(15)),
                    Tokens(T(40), Rid(2), 1), Finished(T(50), Rid(2))});
  ASSERT_EQ(s.hist(kRequestKvWaitTime).count(), 1u);
  EXPECT_DOUBLE_EQ(s.hist(kRequestKvWaitTime).sum(), 0.02);
  // SCHEDULED after FINISHED (another connection's, late): it closes then.
  h.Send(h.Core(), {KvTransfer(T(70), Rid(3), KvRole::kRecv, T(60)),
                    Tokens(T(80), Rid(3), 1), Finished(T(90), Rid(3))});
  EXPECT_EQ(s.hist(kRequestKvWaitTime).count(), 1u);
  h.Send(h.Core(), Scheduled(T(40), Rid(3)));
  ASSERT_EQ(s.hist(kRequestKvWaitTime).count(), 2u);
  EXPECT_DOUBLE_EQ(s.hist(kRequestKvWaitTime).sum(), 0.02 + 0.03);
  // A recv that arrives after FINISHED (another connection's, late): the
  // wait exists and closes then (20 ms); a second recv changes nothing.
  h.Send(h.Core(), {Scheduled(T(10), Rid(4)), Tokens(T(40), Rid(4), 1),
                    Finished(T(50), Rid(4))});
  EXPECT_EQ(s.hist(kRequestKvWaitTime).count(), 2u);
  h.Send(h.Core(), KvTransfer(T(30), Rid(4), KvRole::kRecv, T(15)));
  ASSERT_EQ(s.hist(kRequestKvWaitTime).count(), 3u);
  EXPECT_DOUBLE_EQ(s.hist(kRequestKvWaitTime).sum(), 0.02 + 0.03 + 0.02);
  h.Send(h.Core(), KvTransfer(T(35), Rid(4), KvRole::kRecv, T(15)));
  // A failed recv after FINISHED opens nothing.
  h.Send(h.Core(), {Scheduled(T(10), Rid(7)), Tokens(T(40), Rid(7), 1),
                    Finished(T(50), Rid(7)),
                    KvTransfer(T(30), Rid(7), KvRole::kRecv, T(15), false)});
  // SCHEDULED never comes: incomplete at retirement, once; also when the
  // recv came after the FINISHED.
  h.Send(h.Core(), {KvTransfer(T(30), Rid(5), KvRole::kRecv, T(15)),
                    Tokens(T(40), Rid(5), 1), Finished(T(50), Rid(5))});
  h.Send(h.Core(), {Tokens(T(40), Rid(8), 1), Finished(T(50), Rid(8)),
                    KvTransfer(T(30), Rid(8), KvRole::kRecv, T(15))});
  // Not finished: at-finish intervals do not exist.
  h.Send(h.Core(), {KvTransfer(T(30), Rid(6), KvRole::kRecv, T(15))});
  EXPECT_EQ(s.hist(kRequestKvWaitTime).count(), 3u);
  EXPECT_EQ(h.Incomplete(), Intervals({}));
  h.AdvanceAndSweep(3600 * kSecond);
  EXPECT_EQ(h.Tracked(), 0);
  auto incomplete = h.Incomplete();
  EXPECT_EQ(incomplete[size_t(Interval::kKvWait)], 2u);
  EXPECT_EQ(h.Negative(), Intervals({Interval::kKvWait}));
  EXPECT_EQ(s.hist(kRequestKvWaitTime).count(), 3u);
  // Both counters show it as interval="kv_wait_time".
  const std::string text = h.Render();
  EXPECT_TRUE(HasLine(
      text,
      "tokenmeter_negative_intervals_total{interval=\"kv_wait_time\"} 1"));
  EXPECT_TRUE(HasLine(
      text,
      "tokenmeter_incomplete_intervals_total{interval=\"kv_wait_time\"} 2"));
}

TEST(Tracker12Test, KeepsKvTransfersPerRoleWithoutTouchingRequestsOnSend) {
  Harness h;
  h.Send(h.Core(),
         {KvTransfer(T(30), Rid(9), KvRole::kSend, T(20), true, {}, 4096),
          KvTransfer(T(50), Rid(9), KvRole::kSend, T(20), false, {}, 1 << 20),
          KvTransfer(T(70), Rid(9), KvRole::kSend, T(60), false, "timeout")});
  // A send names a request the prefill side may have retired: none made.
  EXPECT_EQ(h.Tracked(), 0);
  const std::string text = h.Render();
  const std::string send = kCoreLabels + ",role=\"send\"";
  EXPECT_TRUE(
      HasLine(text, "vllm:kv_transfer_time_seconds_count" + send + "} 3"));
  EXPECT_TRUE(
      HasLine(text, "vllm:kv_transfer_time_seconds_sum" + send + "} 0.05"));
  EXPECT_TRUE(HasLine(text, "vllm:kv_transfer_bytes_count" + send + "} 2"));
  EXPECT_TRUE(HasLine(
      text, "vllm:kv_transfer_bytes_bucket" + send + ",le=\"8192\"} 1"));
  EXPECT_TRUE(HasLine(
      text, "vllm:kv_transfer_failures_total" + send + ",reason=\"error\"} 1"));
  EXPECT_TRUE(HasLine(text, "vllm:kv_transfer_failures_total" + send +
                                ",reason=\"timeout\"} 1"));
  // No recv yet: no recv samples.
  EXPECT_EQ(text.find("role=\"recv\""), std::string::npos);
  EXPECT_EQ(h.stats->events(EventKind::kKvTransfer), 3u);
}

// Timelines (issue 30): with a sink, every request keeps its TOKENS times,
// preemptions, KV transfers and trace context, handed over when it leaves.
struct TimelineCollector : trace::TimelineSink {
  explicit TimelineCollector(bool ticks = true) : ticks(ticks) {}
  bool wants_token_ticks() const override { return ticks; }
  void OnRetired(trace::RequestTimeline& t, bool evicted) override {
    got.push_back(std::make_unique<trace::RequestTimeline>(std::move(t)));
    evicted_flags.push_back(evicted);
  }
  bool ticks;
  std::vector<std::unique_ptr<trace::RequestTimeline>> got;
  std::vector<bool> evicted_flags;
};

// The timeline's engine (gen_ai.provider.name) is the HELLO's engine of
// the series, not its metric namespace (which --namespace or a profile
// may set apart from it).
TEST(TrackerTimelineTest, EngineIsTheHellosEngine) {
  Harness h;
  TimelineCollector sink;
  h.tracker->AddTimelineSink(&sink);
  h.core->set_hello_engine("tokenmeter-engine");
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 4), Tokens(T(1), Rid(1), 1),
                    Finished(T(2), Rid(1))});
  h.AdvanceAndSweep(3600 * kSecond);
  ASSERT_EQ(sink.got.size(), 1u);
  EXPECT_EQ(sink.got[0]->engine, "tokenmeter-engine");
  EXPECT_EQ(h.core->identity().ns, "vllm");
}

TEST(TrackerTimelineTest, HandsOverTheWholeTimelineAtRetirement) {
  Harness h;
  TimelineCollector sink;
  h.tracker->AddTimelineSink(&sink);
  ArrivedExtras x;
  x.lora = "ad-1";
  x.num_labels = 1;
  x.labels[0] = {"tenant", "a"};
  x.has_priority = true;
  x.priority = -3;
  x.traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  x.tracestate = "k=v";
  h.SendArrived(h.Core(), ArrivedWithParams(T(0), Rid("req-1"), 100, 64, 1), x);
  h.Send(
      h.Core(),
      {Queued(T(1), Rid("req-1")),
       ScheduledWithInfo(T(10), Rid("req-1"), 40, 0),
       KvTransfer(T(60), Rid("req-1"), KvRole::kRecv, T(20), false, "timeout"),
       KvTransfer(T(90), Rid("req-1"), KvRole::kRecv, T(70), true, {}, 4096),
       Tokens(T(100), Rid("req-1"), 1), Tokens(T(105), Rid("req-1"), 2),
       Preempted(T(110), Rid("req-1")), Scheduled(T(120), Rid("req-1")),
       Preempted(T(125), Rid("req-1")), Tokens(T(130), Rid("req-1"), 1),
       Finished(T(140), Rid("req-1"), FinishReason::kLength)});
  // A send after the request finished joins it while it is still tracked;
  // one for a request never seen makes nothing.
  h.Send(h.Front(), KvTransfer(T(150), Rid("req-1"), KvRole::kSend, T(141)));
  h.Send(h.Front(), KvTransfer(T(150), Rid("other"), KvRole::kSend, T(141)));
  EXPECT_EQ(h.Tracked(), 1);
  EXPECT_TRUE(sink.got.empty());
  h.AdvanceAndSweep(3600 * kSecond);
  ASSERT_EQ(sink.got.size(), 1u);
  EXPECT_FALSE(sink.evicted_flags[0]);
  EXPECT_EQ(h.tracker->timelines_handed(), 1u);
  const trace::RequestTimeline& t = *sink.got[0];
  EXPECT_EQ(t.request_id, "req-1");
  EXPECT_TRUE(t.string_id);
  EXPECT_EQ(t.profile, "vllm");
  EXPECT_EQ(t.engine, "vllm");  // no HELLO joined the series: its namespace
  ASSERT_FALSE(t.engine_labels.empty());
  EXPECT_EQ(t.engine_labels[0],
            std::make_pair(std::string("model_name"), std::string("m")));
  EXPECT_EQ(t.arrived_ns, T(0));
  EXPECT_EQ(t.queued_ns, T(1));
  EXPECT_EQ(t.scheduled_ns, T(10));
  EXPECT_EQ(t.first_token_ns, T(100));
  EXPECT_EQ(t.last_token_ns, T(130));
  EXPECT_EQ(t.finished_ns, T(140));
  EXPECT_EQ(t.finish_reason, "length");
  EXPECT_EQ(t.prompt_tokens, 100u);
  EXPECT_EQ(t.generation_tokens, 4u);
  EXPECT_EQ(t.max_tokens, 64u);
  EXPECT_EQ(t.n, 1u);
  EXPECT_TRUE(t.has_info);
  EXPECT_EQ(t.cached_tokens, 40u);
  EXPECT_TRUE(t.has_priority);
  EXPECT_EQ(t.priority, -3);
  EXPECT_EQ(t.lora, "ad-1");
  ASSERT_EQ(t.request_labels.size(), 1u);
  EXPECT_EQ(t.request_labels[0].second, "a");
  EXPECT_EQ(t.traceparent, x.traceparent);
  EXPECT_EQ(t.tracestate, "k=v");
  ASSERT_EQ(t.tokens.size(), 3u);
  EXPECT_EQ(t.tokens[1].t_ns, T(105));
  EXPECT_EQ(t.tokens[1].n, 2u);
  ASSERT_EQ(t.preemptions.size(), 2u);
  EXPECT_EQ(t.preemptions[0].preempted_ns, T(110));
  EXPECT_EQ(t.preemptions[0].resumed_ns, T(120));
  EXPECT_EQ(t.preemptions[1].preempted_ns, T(125));
  EXPECT_EQ(t.preemptions[1].resumed_ns, 0u);  // never rescheduled
  ASSERT_EQ(t.kv_transfers.size(), 3u);
  EXPECT_TRUE(t.kv_transfers[0].recv);
  EXPECT_FALSE(t.kv_transfers[0].ok);
  EXPECT_EQ(t.kv_transfers[0].reason, "timeout");
  EXPECT_EQ(t.kv_transfers[0].start_ns, T(20));
  EXPECT_EQ(t.kv_transfers[0].end_ns, T(60));
  EXPECT_EQ(t.kv_transfers[1].bytes, 4096u);
  EXPECT_EQ(t.kv_transfers[1].blocks, UINT64_MAX);
  EXPECT_FALSE(t.kv_transfers[2].recv);
  EXPECT_EQ(t.kv_transfers[2].end_ns, T(150));
}

// Request 7 arrives and sends `events` TOKENS of `n` tokens each, 1 ns
// apart, within one sweep; it never finishes and is evicted idle.
struct TokenFlood {
  TokenFlood(size_t events, uint64_t n) : h(Options()) {
    h.tracker->AddTimelineSink(&sink);
    h.Send(h.Core(), Arrived(T(0), Rid(7), 5));
    for (size_t i = 0; i < events; ++i) {
      h.Send(h.Core(), Tokens(T(1) + i, Rid(7), n));
    }
    h.AdvanceAndSweep(3600 * kSecond);
  }
  static TrackerOptions Options() {
    TrackerOptions o;
    o.idle_timeout_ns = 10 * kSecond;
    return o;
  }
  TimelineCollector sink;  // outlives the tracker's use of it
  Harness h;
};

TEST(TrackerTimelineTest, CapsTokenTicksAndHandsOverEvictedRequests) {
  const size_t n = trace::RequestTimeline::kMaxTokenTicks + 10;
  TokenFlood f(n, 1);
  ASSERT_EQ(f.sink.got.size(), 1u);
  EXPECT_TRUE(f.sink.evicted_flags[0]);
  const trace::RequestTimeline& t = *f.sink.got[0];
  EXPECT_EQ(t.request_id, "7");
  EXPECT_FALSE(t.string_id);
  EXPECT_EQ(t.tokens.size(), trace::RequestTimeline::kMaxTokenTicks);
  EXPECT_EQ(t.tokens_not_shown, 10u);
  EXPECT_EQ(t.generation_tokens, n);
  EXPECT_EQ(t.finished_ns, 0u);
  EXPECT_TRUE(t.finish_reason.empty());
}

// Past the tick log's budget (TickLog::kTicksPerRefill between sweeps) a
// TOKENS event writes no tick; the timeline's newest ticks are then the
// last written ones, and tokens_not_shown counts every token without one.
TEST(TrackerTimelineTest, TicksPastTheBudgetAreSkippedAndCountedAsTokens) {
  const size_t n = TickLog::kTicksPerRefill + 5;
  TokenFlood f(n, 2);
  ASSERT_EQ(f.sink.got.size(), 1u);
  const trace::RequestTimeline& t = *f.sink.got[0];
  ASSERT_EQ(t.tokens.size(), trace::RequestTimeline::kMaxTokenTicks);
  EXPECT_EQ(t.tokens.back().t_ns, T(1) + TickLog::kTicksPerRefill - 1);
  EXPECT_EQ(t.generation_tokens, 2 * n);
  EXPECT_EQ(t.tokens_not_shown,
            2 * (n - trace::RequestTimeline::kMaxTokenTicks));
}

// A sink that does not want token ticks (the tracer's) gets the points
// and no TOKENS list.
TEST(TrackerTimelineTest, KeepsNoTokenTicksUnlessTheSinkWantsThem) {
  Harness h;
  TimelineCollector sink(/*ticks=*/false);
  h.tracker->AddTimelineSink(&sink);
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 5), Tokens(T(1), Rid(1), 1),
                    Tokens(T(2), Rid(1), 3), Finished(T(3), Rid(1))});
  h.AdvanceAndSweep(3600 * kSecond);
  ASSERT_EQ(sink.got.size(), 1u);
  EXPECT_TRUE(sink.got[0]->tokens.empty());
  EXPECT_EQ(sink.got[0]->first_token_ns, T(1));
  EXPECT_EQ(sink.got[0]->last_token_ns, T(2));
  EXPECT_EQ(sink.got[0]->generation_tokens, 4u);
}

// Two sinks see one timeline in the order added: what the first writes
// the second reads; either wanting ticks gets them.
TEST(TrackerTimelineTest, HandsOneTimelineToEachSinkInOrder) {
  struct Marker : trace::TimelineSink {
    void OnRetired(trace::RequestTimeline& t, bool) override {
      t.exported_trace_id = "seen-by-first";
      ++calls;
    }
    int calls = 0;
  } first;
  TimelineCollector second(/*ticks=*/true);
  Harness h;
  h.tracker->AddTimelineSink(&first);
  h.tracker->AddTimelineSink(&second);
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 5), Tokens(T(1), Rid(1), 1),
                    Tokens(T(2), Rid(1), 3), Finished(T(3), Rid(1))});
  h.AdvanceAndSweep(3600 * kSecond);
  EXPECT_EQ(first.calls, 1);
  ASSERT_EQ(second.got.size(), 1u);
  EXPECT_EQ(second.got[0]->exported_trace_id, "seen-by-first");
  EXPECT_EQ(second.got[0]->tokens.size(), 2u);
  EXPECT_EQ(h.tracker->timelines_handed(), 1u);
}

TEST(TrackerTimelineTest, KeepsNothingWithoutASink) {
  Harness h;
  h.Send(h.Core(), {Arrived(T(0), Rid(1), 5), Tokens(T(1), Rid(1), 1),
                    Finished(T(2), Rid(1))});
  h.AdvanceAndSweep(3600 * kSecond);
  EXPECT_EQ(h.tracker->timelines_handed(), 0u);
}

TEST(Tracker12Test, CountsAdmissionRejectionsBySixteenReasonsThenOther) {
  Harness h;
  EXPECT_EQ(h.Render().find("admission_rejections"), std::string::npos);
  for (int i = 0; i < 18; ++i) {
    h.Send(h.Core(), Rejected(T(i), "r" + std::to_string(i)));
  }
  h.Send(h.Core(), Rejected(T(20), "r0"));
  EXPECT_EQ(h.Tracked(), 0);
  const std::string text = h.Render();
  const std::string name = "vllm:admission_rejections_total" + kCoreLabels;
  EXPECT_TRUE(HasLine(text, name + ",reason=\"r0\"} 2"));
  EXPECT_TRUE(HasLine(text, name + ",reason=\"r15\"} 1"));
  EXPECT_FALSE(HasLine(text, name + ",reason=\"r16\"} 1"));
  EXPECT_TRUE(HasLine(text, name + ",reason=\"__other__\"} 2"));
  EXPECT_EQ(h.stats->events(EventKind::kAdmissionRejected), 19u);
}

// A reason "__other__" an engine sends itself is counted with the
// overflow: one sample per family, never two with the same labels.
TEST(Tracker12Test, AnEnginesOwnOtherReasonIsTheOverflowsSample) {
  Harness h;
  h.Send(h.Core(), Rejected(T(0), "__other__"));
  for (int i = 0; i < 17; ++i) {
    h.Send(h.Core(), Rejected(T(1 + i), "r" + std::to_string(i)));
  }
  h.Send(h.Core(),
         {KvTransfer(T(30), Rid(9), KvRole::kSend, T(20), false, "__other__"),
          KvTransfer(T(40), Rid(9), KvRole::kSend, T(20), false, "timeout")});
  const std::string text = h.Render();
  const std::string rejected = "vllm:admission_rejections_total" + kCoreLabels +
                               ",reason=\"__other__\"}";
  EXPECT_TRUE(HasLine(text, rejected + " 2")) << text;  // its own and r16
  EXPECT_EQ(LinesStartingWith(text, rejected), 1u);
  EXPECT_TRUE(HasLine(text, "vllm:admission_rejections_total" + kCoreLabels +
                                ",reason=\"r15\"} 1"));
  const std::string failed = "vllm:kv_transfer_failures_total" + kCoreLabels +
                             ",role=\"send\",reason=\"__other__\"}";
  EXPECT_TRUE(HasLine(text, failed + " 1"));
  EXPECT_EQ(LinesStartingWith(text, failed), 1u);
}

TEST(Tracker12Test, FollowsSleepStatesKeyByKey) {
  Harness h;
  EXPECT_EQ(h.Render().find("engine_sleep_state"), std::string::npos);
  h.Send(h.Core(), Sleep(T(1), SchedulerState::kPaused,
                         WeightsState::kOffloaded, KvCacheState::kReleased));
  std::string text = h.Render();
  const std::string state = "vllm:engine_sleep_state" + kCoreLabels;
  EXPECT_TRUE(HasLine(text, state + ",sleep_state=\"awake\"} 0"));
  EXPECT_TRUE(HasLine(text, state + ",sleep_state=\"weights_offloaded\"} 1"));
  EXPECT_TRUE(HasLine(text, state + ",sleep_state=\"discard_all\"} 0"));
  EXPECT_TRUE(HasLine(text, "vllm:engine_fully_awake" + kCoreLabels + "} 0"));
  const std::string res = "vllm:engine_sleep_resource_state" + kCoreLabels;
  EXPECT_TRUE(
      HasLine(text, res + ",resource=\"kv_cache\",state=\"released\"} 1"));
  EXPECT_TRUE(
      HasLine(text, res + ",resource=\"scheduler\",state=\"paused\"} 1"));
  // Weights come back; the KV cache stays released (key not given).
  h.Send(h.Core(), Sleep(T(2), SchedulerState::kRunning,
                         WeightsState::kResident, KvCacheState::kKeep));
  text = h.Render();
  EXPECT_TRUE(HasLine(text, state + ",sleep_state=\"awake\"} 0"));
  EXPECT_TRUE(HasLine(text, state + ",sleep_state=\"weights_offloaded\"} 0"));
  EXPECT_TRUE(
      HasLine(text, res + ",resource=\"kv_cache\",state=\"released\"} 1"));
  h.Send(h.Core(), Sleep(T(3), SchedulerState::kKeep, WeightsState::kKeep,
                         KvCacheState::kResident));
  text = h.Render();
  EXPECT_TRUE(HasLine(text, state + ",sleep_state=\"awake\"} 1"));
  EXPECT_TRUE(HasLine(text, "vllm:engine_fully_awake" + kCoreLabels + "} 1"));
  // The other series never slept: no sleep series.
  EXPECT_EQ(text.find("engine_sleep_state{model_name=\"m\",engine=\"front\""),
            std::string::npos);
}

TEST(Tracker12Test, SplitsWaitingByReasonOnceAnEngineSendsDeferred) {
  Harness h;
  StepStats st{};
  st.has = StepStats::kWaiting;
  st.waiting = 5;
  h.Send(h.Core(), Step(T(1), st));
  EXPECT_EQ(h.Render().find("num_requests_waiting_by_reason"),
            std::string::npos);
  st.has |= StepStats::kWaitingDeferred;
  st.waiting_deferred = 2;
  h.Send(h.Core(), Step(T(2), st));
  const std::string name =
      "vllm:num_requests_waiting_by_reason" + kCoreLabels + ",reason=";
  std::string text = h.Render();
  EXPECT_TRUE(HasLine(text, name + "\"capacity\"} 3"));
  EXPECT_TRUE(HasLine(text, name + "\"deferred\"} 2"));
  st.has = StepStats::kWaiting;
  st.waiting = 4;
  h.Send(h.Core(), Step(T(3), st));
  text = h.Render();
  EXPECT_TRUE(HasLine(text, name + "\"capacity\"} 4"));
  EXPECT_TRUE(HasLine(text, name + "\"deferred\"} 0"));
}

}  // namespace
}  // namespace tokenmeter::daemon

namespace tokenmeter::daemon {
namespace {

TEST(Tracker12Test, LabelsRequestsByPriorityBucketWithThePriorityLabel) {
  RegistryOptions o;
  o.priority_label = true;
  Harness h(o, Profile::kVllm);
  int rid = 0;
  for (int32_t p : {-7, -1, 0, 1, 2, 1}) {
    ArrivedExtras x;
    x.has_priority = true;
    x.priority = p;
    h.SendArrived(h.Core(), Arrived(T(0), Rid(++rid), 4), x);
    h.Send(h.Core(), {Tokens(T(10), Rid(rid), 1), Finished(T(20), Rid(rid))});
  }
  // No priority at all: "0".
  h.Send(h.Core(), {Arrived(T(0), Rid(100), 4), Tokens(T(10), Rid(100), 1),
                    Finished(T(20), Rid(100))});
  const std::string text = h.Render();
  const std::string name =
      "vllm:request_success_total" + kCoreLabels + ",priority=";
  EXPECT_TRUE(HasLine(text, name + "\"<-1\",finished_reason=\"stop\"} 1"));
  EXPECT_TRUE(HasLine(text, name + "\"-1\",finished_reason=\"stop\"} 1"));
  EXPECT_TRUE(HasLine(text, name + "\"0\",finished_reason=\"stop\"} 2"));
  EXPECT_TRUE(HasLine(text, name + "\"1\",finished_reason=\"stop\"} 2"));
  EXPECT_TRUE(HasLine(text, name + "\">1\",finished_reason=\"stop\"} 1"));
  // Gauges keep the engine labels only.
  EXPECT_EQ(text.find("num_requests_running{model_name=\"m\",engine=\"core\","
                      "priority"),
            std::string::npos);
}

// A request without an ARRIVED (a decode instance's: SCHEDULED, tokens,
// FINISHED) has priority "0" too: the same sample as one whose ARRIVED has
// no priority or priority 0, never priority="".
TEST(Tracker12Test, ARequestWithoutArrivedHasPriorityZero) {
  RegistryOptions o = LabelOptions({"tenant"}, 10);
  o.priority_label = true;
  Harness h(o, Profile::kVllm);
  h.Send(h.Core(), {Scheduled(T(0), Rid(1)), Tokens(T(10), Rid(1), 1),
                    Finished(T(20), Rid(1))});
  h.Send(h.Core(), {Arrived(T(0), Rid(2), 4), Tokens(T(10), Rid(2), 1),
                    Finished(T(20), Rid(2))});
  ArrivedExtras x;
  x.has_priority = true;
  x.priority = 0;
  h.SendArrived(h.Core(), Arrived(T(0), Rid(3), 4), x);
  h.Send(h.Core(), {Tokens(T(10), Rid(3), 1), Finished(T(20), Rid(3))});
  x.priority = 1;
  h.SendArrived(h.Core(), Arrived(T(0), Rid(4), 4), x);
  h.Send(h.Core(), {Tokens(T(10), Rid(4), 1), Finished(T(20), Rid(4))});
  const std::string text = h.Render();
  const std::string name =
      "vllm:request_success_total" + kCoreLabels + ",tenant=\"\",priority=";
  EXPECT_TRUE(HasLine(text, name + "\"0\",finished_reason=\"stop\"} 3"))
      << text;
  EXPECT_TRUE(HasLine(text, name + "\"1\",finished_reason=\"stop\"} 1"));
  EXPECT_EQ(text.find("priority=\"\""), std::string::npos);
  EXPECT_EQ(LinesStartingWith(text, "vllm:e2e_request_latency_seconds_count" +
                                        kCoreLabels +
                                        ",tenant=\"\",priority="
                                        "\"0\"}"),
            1u);
}

// --request-label-values caps the other labels, not the priority label:
// its values are the five buckets, never __other__, whatever the cap.
TEST(Tracker12Test, ThePriorityLabelIsNotHeldToTheValueCap) {
  RegistryOptions o = LabelOptions({"tenant"}, 1);
  o.priority_label = true;
  Harness h(o, Profile::kVllm);
  int rid = 0;
  for (const int32_t p : {-7, -1, 0, 1, 2}) {
    for (const std::string_view tenant : {"a", "b"}) {
      ArrivedExtras x = Labels({{"tenant", tenant}});
      x.has_priority = true;
      x.priority = p;
      h.SendArrived(h.Core(), Arrived(T(0), Rid(++rid), 4), x);
      h.Send(h.Core(), {Tokens(T(10), Rid(rid), 1), Finished(T(20), Rid(rid))});
    }
  }
  const std::string text = h.Render();
  for (const std::string_view bucket : {"<-1", "-1", "0", "1", ">1"}) {
    const std::string name = "vllm:request_success_total" + kCoreLabels +
                             ",tenant=\"a\",priority=\"" + std::string(bucket) +
                             "\"";
    EXPECT_TRUE(HasLine(text, name + ",finished_reason=\"stop\"} 1"))
        << bucket << "\n"
        << text;
    const std::string other = "vllm:request_success_total" + kCoreLabels +
                              ",tenant=\"__other__\",priority=\"" +
                              std::string(bucket) + "\"";
    EXPECT_TRUE(HasLine(text, other + ",finished_reason=\"stop\"} 1"))
        << bucket;
  }
  EXPECT_EQ(text.find("priority=\"__other__\""), std::string::npos);
  EXPECT_TRUE(HasLine(
      text, "tokenmeter_request_label_overflow_total{label=\"tenant\"} 5"));
  EXPECT_TRUE(HasLine(
      text, "tokenmeter_request_label_overflow_total{label=\"priority\"} 0"));
}

TEST(Tracker12Test, RefusesAPriorityLabelBeyondFourOrTwice) {
  FakeClock clock;
  std::unique_ptr<Pipeline> p;
  RegistryOptions four;
  four.priority_label = true;
  four.request_labels = {"a", "b", "c", "d"};
  EXPECT_FALSE(Pipeline::Create(nullptr, clock, {four, {}, {}}, &p).ok());
  RegistryOptions twice;
  twice.priority_label = true;
  twice.request_labels = {"priority"};
  EXPECT_FALSE(Pipeline::Create(nullptr, clock, {twice, {}, {}}, &p).ok());
  RegistryOptions three;
  three.priority_label = true;
  three.request_labels = {"a", "b", "c"};
  EXPECT_TRUE(Pipeline::Create(nullptr, clock, {three, {}, {}}, &p).ok());
}

// ---- protocol 1.3: REQUEST_SUMMARY and LATENCIES
// ---------------------------------------------------

// A REQUEST_SUMMARY of `reason` with the two required counts.
Event Summary(uint64_t t, FinishReason reason, uint32_t prompt,
              uint32_t generation) {
  Event e{};
  e.kind = EventKind::kRequestSummary;
  e.t_ns = t;
  e.reason = reason;
  e.count = prompt;
  e.summary = RequestSummaryInfo{};
  e.summary.generation_tokens = generation;
  return e;
}
void SetDuration(Event& e, SummaryDuration d, uint64_t ns) {
  e.summary.duration_ns[size_t(d)] = ns;
  e.summary.has |= uint16_t(1u << size_t(d));
}

TEST(Tracker13Test, SummaryObservesWhatARetirementDoes) {
  Harness h;
  Event e = Summary(T(0), FinishReason::kLength, 812, 256);
  e.has_max_tokens = true;
  e.max_tokens = 256;
  e.has_n = true;
  e.n = 2;
  e.summary.cached_tokens = 512;
  e.summary.max_generation_tokens = 300;
  e.summary.has = RequestSummaryInfo::kCachedTokens |
                  RequestSummaryInfo::kMaxGenerationTokens;
  SetDuration(e, SummaryDuration::kTtft, 41 * kMs);
  SetDuration(e, SummaryDuration::kQueue, 5 * kMs);
  SetDuration(e, SummaryDuration::kPrefill, 36 * kMs);
  SetDuration(e, SummaryDuration::kDecode, 2550 * kMs);
  SetDuration(e, SummaryDuration::kInference, 2586 * kMs);
  SetDuration(e, SummaryDuration::kE2e, 2600 * kMs);
  SetDuration(e, SummaryDuration::kTpot, 10 * kMs);
  h.Send(h.Core(), e);

  EXPECT_EQ(h.core->children(kRequestSuccess),
            (std::vector<uint64_t>{0, 1, 0, 0}));
  const HistExpectation want[] = {
      {kTimeToFirstToken, 1, double(41 * kMs)},
      {kRequestQueueTime, 1, double(5 * kMs)},
      {kRequestPrefillTime, 1, double(36 * kMs)},
      {kRequestDecodeTime, 1, double(2550 * kMs)},
      {kRequestInferenceTime, 1, double(2586 * kMs)},
      {kE2eRequestLatency, 1, double(2600 * kMs)},
      {kRequestTimePerOutputToken, 1, double(10 * kMs)},
      {kRequestPromptTokens, 1, 812},
      {kRequestGenerationTokens, 1, 256},
      {kRequestParamsMaxTokens, 1, 256},
      {kRequestParamsN, 1, 2},
      {kRequestMaxNumGenerationTokens, 1, 300},
      {kRequestPrefillKvComputedTokens, 1, 300},
  };
  uint64_t observations = 0;
  for (const HistExpectation& w : want) {
    ExpectHist(*h.core, w.metric, w.count, w.raw_sum);
    observations += w.count;
  }
  // Nothing else: no ITL, no token counters, no preemptions per request,
  // no request tracked, nothing incomplete; the event counted by kind.
  EXPECT_EQ(TotalObservations(*h.core), observations);
  EXPECT_EQ(h.core->count(kPromptTokens), 0u);
  EXPECT_EQ(h.core->count(kGenerationTokens), 0u);
  EXPECT_EQ(h.tracker->size(), 0u);
  EXPECT_EQ(h.Incomplete(), Intervals({}));
  EXPECT_EQ(h.stats->events(EventKind::kRequestSummary), 1u);
  EXPECT_EQ(TotalObservations(*h.front), 0u);
}

TEST(Tracker13Test, SummaryObservesOnlyWhatItGives) {
  Harness h;
  h.Send(h.Core(), Summary(T(0), FinishReason::kAbort, 7, 0));
  Event e = Summary(T(1), FinishReason::kStop, 3, 1);
  SetDuration(e, SummaryDuration::kE2e, 0);  // zero is a value
  h.Send(h.Core(), e);
  EXPECT_EQ(h.core->children(kRequestSuccess),
            (std::vector<uint64_t>{1, 0, 1, 0}));
  ExpectHist(*h.core, kRequestPromptTokens, 2, 10);
  ExpectHist(*h.core, kRequestGenerationTokens, 2, 1);
  ExpectHist(*h.core, kE2eRequestLatency, 1, 0);
  for (EngineMetric m :
       {kTimeToFirstToken, kRequestQueueTime, kRequestPrefillTime,
        kRequestDecodeTime, kRequestInferenceTime, kRequestTimePerOutputToken,
        kRequestParamsMaxTokens, kRequestParamsN,
        kRequestMaxNumGenerationTokens, kRequestPrefillKvComputedTokens,
        kRequestNumPreemptions}) {
    EXPECT_EQ(h.core->hist(m).count(), 0u) << MetricName(m);
  }
}

TEST(Tracker13Test, SummaryFollowsEachProfilesOwnFigures) {
  // SGLang counts tokens and requests at finish; a summary is a finish.
  Harness sglang(RegistryOptions{}, Profile::kSglang);
  sglang.Send(sglang.Core(), {Summary(T(0), FinishReason::kStop, 7, 4),
                              Summary(T(1), FinishReason::kAbort, 5, 0)});
  EXPECT_EQ(sglang.core->count(kPromptTokensAtFinish), 12u);
  EXPECT_EQ(sglang.core->count(kGenerationTokensAtFinish), 4u);
  EXPECT_EQ(sglang.core->count(kNumFinishedRequests), 2u);
  EXPECT_EQ(sglang.core->count(kNumAbortedRequests), 1u);
  // LMDeploy: the engine's decode and inference end at its finish, and its
  // cached tokens per request.
  Harness lmdeploy(RegistryOptions{}, Profile::kLmdeploy);
  Event e = Summary(T(0), FinishReason::kStop, 20, 3);
  SetDuration(e, SummaryDuration::kDecode, 40 * kMs);
  SetDuration(e, SummaryDuration::kInference, 45 * kMs);
  e.summary.cached_tokens = 5;
  e.summary.has |= RequestSummaryInfo::kCachedTokens;
  lmdeploy.Send(lmdeploy.Core(), e);
  ExpectHist(*lmdeploy.core, kRequestDecodeToFinish, 1, double(40 * kMs));
  ExpectHist(*lmdeploy.core, kRequestInferenceToFinish, 1, double(45 * kMs));
  EXPECT_EQ(lmdeploy.core->hist(kRequestDecodeTime).count(), 0u);
  ExpectHist(*lmdeploy.core, kRequestCachedTokens, 1, 5);
  ExpectHist(*lmdeploy.core, kRequestCacheHitRatio, 1, 0.25);
  // LMDeploy counts cached_tokens_total at finish too.
  EXPECT_EQ(lmdeploy.core->count(kPromptTokensCached), 5u);
  // vLLM's series measure none of those.
  Harness vllm;
  vllm.Send(vllm.Core(), {e, Summary(T(1), FinishReason::kStop, 7, 4)});
  EXPECT_EQ(vllm.core->count(kPromptTokensAtFinish), 0u);
  EXPECT_EQ(vllm.core->hist(kRequestDecodeToFinish).count(), 0u);
  EXPECT_EQ(vllm.core->hist(kRequestCachedTokens).count(), 0u);
  EXPECT_EQ(vllm.core->count(kPromptTokensCached), 0u);
  ExpectHist(*vllm.core, kRequestDecodeTime, 1, double(40 * kMs));
}

Event Latencies(uint64_t t, uint32_t begin, uint32_t ttft, uint32_t itl) {
  Event e{};
  e.kind = EventKind::kLatencies;
  e.t_ns = t;
  e.latencies = LatenciesRef{};
  e.latencies.begin = begin;
  e.latencies.ttft_count = ttft;
  e.latencies.itl_count = itl;
  return e;
}

// REQUEST_SUMMARY and LATENCIES carry no request labels: with request
// labels on they are the samples whose labels are all absent (priority
// "0"), shown as soon as they are used.
TEST(Tracker13Test, SummaryAndLatenciesAreShownWithRequestLabels) {
  RegistryOptions o = LabelOptions({"tenant"}, 10);
  o.priority_label = true;
  Harness h(o, Profile::kVllm);
  Batch batch;
  batch.positions = {40 * kMs};
  Event l = Latencies(T(0), 0, 1, 0);
  l.latencies.has = LatenciesRef::kPromptTokens;
  l.latencies.prompt_tokens = 7;
  batch.events = {l};
  h.tracker->ApplyBatch(h.Core(), batch);
  h.Send(h.Core(), Summary(T(1), FinishReason::kStop, 7, 4));
  const std::string text = h.Render();
  const std::string labels = kCoreLabels + ",tenant=\"\",priority=\"0\"";
  EXPECT_TRUE(HasLine(text, "vllm:request_success_total" + labels +
                                ",finished_reason=\"stop\"} 1"))
      << text;
  EXPECT_TRUE(
      HasLine(text, "vllm:time_to_first_token_seconds_count" + labels + "} 1"));
  EXPECT_TRUE(HasLine(text, "vllm:prompt_tokens_total" + labels + "} 7"));
  EXPECT_TRUE(
      HasLine(text, "vllm:request_prompt_tokens_count" + labels + "} 1"));
}

// prompt_tokens_by_source sums to the profile's prompt_tokens also for
// the adapters' events: a LATENCIES' prompt tokens are computed ones (no
// SCHEDULED info); where prompt tokens count at finish (SGLang), a
// summary's, its cached ones a local cache hit.
TEST(Tracker13Test, PromptSourcesSumToPromptTokensForSummariesAndLatencies) {
  Batch batch;
  Event l = Latencies(T(0), 0, 0, 0);
  l.latencies.has = LatenciesRef::kPromptTokens;
  l.latencies.prompt_tokens = 20;
  batch.events = {l};
  Event summary = Summary(T(1), FinishReason::kStop, 20, 3);
  summary.summary.cached_tokens = 5;
  summary.summary.has |= RequestSummaryInfo::kCachedTokens;

  // The prompt_tokens each profile shows; LMDeploy's cached_tokens_total
  // counts at finish (once).
  const struct {
    Profile profile;
    EngineMetric prompt_tokens;
    uint64_t prompt;
    std::vector<uint64_t> sources;
    uint64_t cached;
  } cases[] = {
      {Profile::kVllm, kPromptTokens, 20, {20, 0, 0}, 0},
      {Profile::kSglang, kPromptTokensAtFinish, 24, {19, 5, 0}, 5},
      {Profile::kLmdeploy, kPromptTokens, 20, {20, 0, 0}, 5},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(ProfileName(c.profile));
    Harness h(RegistryOptions{}, c.profile);
    h.tracker->ApplyBatch(h.Core(), batch);
    h.Send(h.Core(), {summary, Summary(T(2), FinishReason::kAbort, 4, 0)});
    EXPECT_EQ(h.core->count(c.prompt_tokens), c.prompt);
    EXPECT_EQ(h.core->children(kPromptTokensBySource), c.sources);
    EXPECT_EQ(h.core->count(kPromptTokensCached), c.cached);
  }
}

TEST(Tracker13Test, LatenciesObserveEachValueAndAddTheCounts) {
  Harness h;
  Batch batch;
  batch.positions = {99, 40 * kMs, 60 * kMs, 8 * kMs, 9 * kMs, 10 * kMs};
  Event a = Latencies(T(0), 1, 2, 3);
  a.latencies.has = LatenciesRef::kPromptTokens |
                    LatenciesRef::kGenerationTokens |
                    LatenciesRef::kPreemptions;
  a.latencies.prompt_tokens = 812;
  a.latencies.generation_tokens = 5;
  a.latencies.preemptions = 1;
  Event b = Latencies(T(1), 3, 0, 1);  // 8 ms again, no counts
  batch.events = {a, b};
  h.tracker->ApplyBatch(h.Core(), batch);
  ExpectHist(*h.core, kTimeToFirstToken, 2, double(100 * kMs));
  ExpectHist(*h.core, kInterTokenLatency, 4, double(35 * kMs));
  EXPECT_EQ(CountIn(h.core->hist(kInterTokenLatency), 0.01), 4u);
  EXPECT_EQ(h.core->count(kPromptTokens), 812u);
  EXPECT_EQ(h.core->count(kGenerationTokens), 5u);
  EXPECT_EQ(h.core->count(kNumPreemptions), 1u);
  EXPECT_EQ(TotalObservations(*h.core), 6u);
  EXPECT_EQ(h.tracker->size(), 0u);
  EXPECT_EQ(h.stats->events(EventKind::kLatencies), 2u);

  // SGLang's inter-token latency counts tokens: each value is one.
  Harness sglang(RegistryOptions{}, Profile::kSglang);
  sglang.tracker->ApplyBatch(sglang.Core(), batch);
  ExpectHist(*sglang.core, kInterTokenLatencyPerToken, 4, double(35 * kMs));
  EXPECT_EQ(sglang.core->hist(kInterTokenLatency).count(), 0u);
}

// LMDeploy's adapter sends one LATENCIES with counts per engine output of
// one request: in the lmdeploy profile each is one chunk of
// iteration_tokens_total (prompt + generation tokens, 0 for an output
// without tokens, as LMDeploy observes it) and, with one ITL and tokens,
// one time per output token (ITL / tokens). Other profiles: neither.
TEST(Tracker13Test, LmdeployLatenciesAreOneOutputEach) {
  Batch batch;
  batch.positions = {40 * kMs, 30 * kMs, 8 * kMs, 9 * kMs, 7 * kMs};
  auto with_counts = [](Event e, uint32_t prompt, uint32_t generated) {
    e.latencies.has =
        LatenciesRef::kPromptTokens | LatenciesRef::kGenerationTokens;
    e.latencies.prompt_tokens = prompt;
    e.latencies.generation_tokens = generated;
    return e;
  };
  batch.events = {
      with_counts(Latencies(T(0), 0, 1, 0), 100, 1),  // first output
      with_counts(Latencies(T(1), 1, 0, 1), 0, 3),    // 30 ms, 3 tokens
      with_counts(Latencies(T(2), 2, 0, 0), 0, 0),    // no tokens
      with_counts(Latencies(T(3), 2, 0, 2), 0, 2),    // two ITLs: no TPOT
      Latencies(T(4), 4, 0, 1),                       // no counts
  };
  Harness lmdeploy(RegistryOptions{}, Profile::kLmdeploy);
  lmdeploy.tracker->ApplyBatch(lmdeploy.Core(), batch);
  ExpectHist(*lmdeploy.core, kIterationTokensChunk, 4, 106);
  EXPECT_EQ(CountIn(lmdeploy.core->hist(kIterationTokensChunk), 1), 1u);
  EXPECT_EQ(CountIn(lmdeploy.core->hist(kIterationTokensChunk), 8), 2u);
  ExpectHist(*lmdeploy.core, kTimePerOutputTokenChunk, 1, double(10 * kMs));
  ExpectHist(*lmdeploy.core, kInterTokenLatency, 4, double(54 * kMs));
  ExpectHist(*lmdeploy.core, kTimeToFirstToken, 1, double(40 * kMs));
  EXPECT_EQ(lmdeploy.core->count(kPromptTokens), 100u);
  EXPECT_EQ(lmdeploy.core->count(kGenerationTokens), 6u);

  Harness vllm;
  vllm.tracker->ApplyBatch(vllm.Core(), batch);
  EXPECT_EQ(vllm.core->hist(kIterationTokensChunk).count(), 0u);
  EXPECT_EQ(vllm.core->hist(kIterationTokens).count(), 0u);
  EXPECT_EQ(vllm.core->hist(kTimePerOutputTokenChunk).count(), 0u);
  ExpectHist(*vllm.core, kInterTokenLatency, 4, double(54 * kMs));
}

}  // namespace
}  // namespace tokenmeter::daemon
