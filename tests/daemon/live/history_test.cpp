// The live page's history: per-second quantiles from bucket deltas (the
// Prometheus rule, checked by hand and against the true quantile's bucket),
// JSON number text, the text ring's bounds, and one point a tick for every
// followed series.
#include "daemon/live/history.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "daemon/store/parts/admission.h"
#include "daemon/store/parts/waiting_reason.h"
#include "daemon/store/registry.h"
#include "daemon/store/request_labels.h"

namespace tokenmeter::daemon::live {
namespace {

constexpr uint64_t kSec = 1'000'000'000;

struct QuantileCase {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;  // per bucket, +Inf last
  double q;
  double want;  // NaN: no data
};

TEST(BucketQuantileTest, FollowsPrometheusHistogramQuantile) {
  const double nan = std::nan("");
  const QuantileCase cases[] = {
      // Rank 2 of 4, all in (1, 2]: 1 + (2 - 1) * 2 / 4.
      {{1, 2, 4}, {0, 4, 0, 0}, 0.5, 1.5},
      {{1, 2, 4}, {0, 4, 0, 0}, 0.99, 1 + 3.96 / 4},
      // The first bucket's lower bound is 0.
      {{1, 2, 4}, {2, 0, 2, 0}, 0.5, 1.0},
      {{1, 2, 4}, {1, 0, 0, 0}, 0.99, 0.99},
      // Rank 3.96 of 4 lands in (2, 4] after 2 below: 2 + 2 * 1.96 / 2.
      {{1, 2, 4}, {2, 0, 2, 0}, 0.99, 3.96},
      // In +Inf: the highest finite bound.
      {{1, 2, 4}, {0, 0, 0, 3}, 0.5, 4},
      {{1, 2, 4}, {1, 0, 0, 99}, 0.5, 4},
      // A first bound <= 0 is the answer when the rank falls there.
      {{0, 1}, {5, 0, 0}, 0.5, 0},
      // Nothing observed.
      {{1, 2, 4}, {0, 0, 0, 0}, 0.5, nan},
  };
  for (const QuantileCase& c : cases) {
    const double got = BucketQuantile(c.q, c.bounds, c.counts.data());
    if (std::isnan(c.want)) {
      EXPECT_TRUE(std::isnan(got)) << got;
    } else {
      EXPECT_DOUBLE_EQ(got, c.want) << "q=" << c.q;
    }
  }
}

// The answer lies in the bucket of the true quantile (the rank-th smallest
// observation): exact to the bucket, as docs/operations.md says.
TEST(BucketQuantileTest, LandsInTheTrueQuantilesBucket) {
  const std::vector<double> bounds = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06,
                                      0.08,  0.1,   0.25, 0.5,  0.75, 1.0};
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(-3, 1.2);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 1 + rng() % 300;
    std::vector<double> xs(n);
    std::vector<uint64_t> counts(bounds.size() + 1, 0);
    for (double& x : xs) {
      x = dist(rng);
      counts[size_t(std::lower_bound(bounds.begin(), bounds.end(), x) -
                    bounds.begin())]++;
    }
    std::sort(xs.begin(), xs.end());
    for (double q : {0.5, 0.99}) {
      const size_t rank = size_t(std::ceil(q * double(n)));
      const double truth = xs[rank - 1];
      const size_t b =
          size_t(std::lower_bound(bounds.begin(), bounds.end(), truth) -
                 bounds.begin());
      const double got = BucketQuantile(q, bounds, counts.data());
      if (b == bounds.size()) {
        EXPECT_EQ(got, bounds.back());
      } else {
        EXPECT_GE(got, b == 0 ? 0 : bounds[b - 1]) << "truth " << truth;
        EXPECT_LE(got, bounds[b]) << "truth " << truth;
      }
    }
  }
}

struct NumberCase {
  double v;
  int decimals;
  const char* want;
};

TEST(AppendJsonNumberTest, WritesShortLocaleFreeJson) {
  const NumberCase cases[] = {
      {0, 2, "0"},
      {3, 2, "3"},
      {-2.5, 2, "-2.5"},
      {0.0125, 6, "0.0125"},
      {0.1234567, 6, "0.123457"},
      {0.9999999, 6, "1"},
      {1234.5, 2, "1234.5"},
      {-0.001, 2, "0"},
      {0.5, 0, "1"},
      {std::nan(""), 2, "null"},
      {HUGE_VAL, 2, "null"},
      {-HUGE_VAL, 2, "null"},
      {1e12, 2, "1.00000e+12"},
      {-3.5e20, 6, "-3.50000e+20"},
      // Too many digits for kMaxEntryBytes: fewer decimals.
      {123456789012.345678, 6, "123456789012.3"},
      {-99999999999.99, 9, "-99999999999.99"},
  };
  for (const NumberCase& c : cases) {
    std::string out = "x";
    AppendJsonNumber(out, c.v, c.decimals);
    EXPECT_EQ(out, std::string("x") + c.want) << c.v;
  }
  std::mt19937_64 rng(3);
  for (int i = 0; i < 20000; ++i) {
    const double v =
        std::ldexp(double(int64_t(rng())) / 9.2e18, int(rng() % 100) - 50);
    std::string out;
    AppendJsonNumber(out, v, int(rng() % 10));
    EXPECT_LE(out.size(), kMaxEntryBytes) << v;
    EXPECT_NEAR(std::stod(out), v, std::fabs(v) * 1e-5 + 0.51) << out;
  }
}

TEST(TextRingTest, KeepsTheNewestPointsJoined) {
  TextRing r;
  EXPECT_EQ(r.Joined(), "");
  EXPECT_EQ(r.Last(), "");
  r.Push("1");
  r.Push("null");
  r.Push("0.25");
  EXPECT_EQ(r.Joined(), "1,null,0.25");
  EXPECT_EQ(r.Last(), "0.25");
  EXPECT_EQ(r.size(), 3u);
  for (size_t i = 0; i < 2 * kPoints; ++i) r.Push(std::to_string(i));
  EXPECT_EQ(r.size(), kPoints);
  std::string want;
  for (size_t i = kPoints; i < 2 * kPoints; ++i) {
    want += (want.empty() ? "" : ",") + std::to_string(i);
  }
  EXPECT_EQ(r.Joined(), want);
  EXPECT_EQ(r.Last(), std::to_string(2 * kPoints - 1));
}

TEST(TextRingTest, HoldsBoundedBytes) {
  TextRing r;
  const std::string longest(kMaxEntryBytes, '9');
  for (size_t i = 0; i < 20 * kPoints; ++i) {
    r.Push(i % 3 == 0 ? longest : std::string_view("0"));
  }
  const size_t bound =
      2 * (kPoints * (kMaxEntryBytes + 1) * 5 / 4 + 256 + kMaxEntryBytes + 1);
  EXPECT_LE(r.capacity(), bound);
}

TEST(TextRingDeathTest, RefusesALongEntry) {
  TextRing r;
  EXPECT_DEATH(r.Push(std::string(kMaxEntryBytes + 1, '1')), "");
}

class HistoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RegistryOptions options;
    options.request_labels = {"tenant"};
    ASSERT_TRUE(Registry::Create(options, &reg_).ok());
  }
  EngineSeries* Series(const std::string& instance,
                       Profile p = Profile::kVllm) {
    const std::string ns = p == Profile::kSglang ? "sglang" : "vllm";
    return reg_->GetOrCreate({ns, "m", instance, {}, p});
  }
  std::unique_ptr<Registry> reg_;
};

TEST_F(HistoryTest, OnePointPerTickFromTheSecondsIncrease) {
  EngineSeries* s = Series("0");
  History h;
  h.Start(*reg_, 10 * kSec);
  // TTFT 3, 3, 7 and 30 ms: buckets (0.001, 0.005] twice, (0.005, 0.01],
  // (0.02, 0.04]; e2e nothing.
  for (double ms : {3.0, 3.0, 7.0, 30.0}) {
    s->hist(kTimeToFirstToken).Observe(ms * 1e6);
  }
  s->hist(kInterTokenLatency).Observe(12e6);
  s->Add(kPromptTokens, 100);
  s->Add(kGenerationTokens, 51);
  s->Add(kNumPreemptions, 2);
  s->Add(kPrefixCacheQueries, 8);
  s->Add(kPrefixCacheHits, 2);
  s->AddDerived(kNumRequestsRunning, 3);
  s->Set(kKvCacheUsagePerc, 0.125);
  h.Tick(*reg_, 11 * kSec, 1'700'000'000);
  const History::Series* hs = h.Find(*s);
  ASSERT_NE(hs, nullptr);
  const auto& v = hs->last;
  EXPECT_EQ(v[kRunning], 3);
  EXPECT_EQ(v[kWaiting], 0);
  EXPECT_EQ(v[kKvUsage], 0.125);
  EXPECT_EQ(v[kPromptTokensPerS], 100);
  EXPECT_EQ(v[kGenerationTokensPerS], 51);
  EXPECT_EQ(v[kPreemptionsPerS], 2);
  EXPECT_EQ(v[kPrefixCacheHitRate], 0.25);
  // Rank 2 of 4 is the second of two in (0.001, 0.005]: 0.005.
  EXPECT_DOUBLE_EQ(v[kTtftP50], 0.005);
  // Rank 3.96 in (0.02, 0.04], after 3 below: 0.02 + 0.02 * 0.96.
  EXPECT_DOUBLE_EQ(v[kTtftP99], 0.02 + 0.02 * 0.96);
  EXPECT_TRUE(std::isnan(v[kE2eP50]));
  EXPECT_EQ(hs->t.Joined(), "1700000000");
  EXPECT_EQ(hs->values[kTtftP99].Last(), "0.0392");
  EXPECT_EQ(hs->values[kE2eP99].Last(), "null");
  EXPECT_EQ(hs->values[kKvUsage].Last(), "0.125");

  // The next second: nothing new; the gauges stay.
  h.Tick(*reg_, 12 * kSec, 1'700'000'001);
  EXPECT_EQ(hs->t.Joined(), "1700000000,1700000001");
  EXPECT_EQ(hs->values[kPromptTokensPerS].Joined(), "100,0");
  EXPECT_EQ(hs->values[kRunning].Joined(), "3,3");
  EXPECT_EQ(hs->values[kTtftP50].Joined(), "0.005,null");
  EXPECT_EQ(hs->values[kPrefixCacheHitRate].Joined(), "0.25,null");
  EXPECT_TRUE(std::isnan(hs->last[kTtftP50]));
}

TEST_F(HistoryTest, RejectionsAndWaitingByReasonNullUntilTheSeriesHasThem) {
  EngineSeries* s = Series("0");
  History h;
  h.Start(*reg_, 0);
  s->Set(kNumRequestsWaiting, 4);
  h.Tick(*reg_, kSec, 100);
  const History::Series* hs = h.Find(*s);
  ASSERT_NE(hs, nullptr);
  EXPECT_TRUE(std::isnan(hs->last[kAdmissionRejectionsPerS]));
  EXPECT_TRUE(std::isnan(hs->last[kWaitingCapacity]));
  EXPECT_TRUE(std::isnan(hs->last[kWaitingDeferred]));
  // ADMISSION_REJECTED three times, a STEP with waiting 4, deferred 1.
  for (int i = 0; i < 3; ++i) s->part<AdmissionPart>().Reject("queue_full");
  s->part<WaitingReasonPart>().Set(4, 1);
  h.Tick(*reg_, 2 * kSec, 101);
  EXPECT_EQ(hs->last[kAdmissionRejectionsPerS], 3);
  EXPECT_EQ(hs->last[kWaitingCapacity], 3);
  EXPECT_EQ(hs->last[kWaitingDeferred], 1);
  // Two more of another reason over half a second; then a quiet second.
  s->part<AdmissionPart>().Reject("token_cap");
  s->part<AdmissionPart>().Reject("queue_full");
  s->part<WaitingReasonPart>().Set(2, 2);
  h.Tick(*reg_, 2 * kSec + kSec / 2, 102);
  h.Tick(*reg_, 3 * kSec + kSec / 2, 103);
  EXPECT_EQ(hs->values[kAdmissionRejectionsPerS].Joined(), "null,3,4,0");
  EXPECT_EQ(hs->values[kWaitingCapacity].Joined(), "null,3,0,0");
  EXPECT_EQ(hs->values[kWaitingDeferred].Joined(), "null,1,2,2");
  EXPECT_EQ(hs->values[kWaiting].Joined(), "4,4,4,4");
}

TEST_F(HistoryTest, RatesAreOverTheTimeSinceThePreviousTick) {
  EngineSeries* s = Series("0");
  History h;
  h.Start(*reg_, 0);
  s->Add(kGenerationTokens, 300);
  h.Tick(*reg_, 2 * kSec, 100);  // a late tick: two seconds
  EXPECT_EQ(h.Find(*s)->last[kGenerationTokensPerS], 150);
  s->Add(kGenerationTokens, 50);
  h.Tick(*reg_, 2 * kSec + kSec / 2, 101);
  EXPECT_EQ(h.Find(*s)->last[kGenerationTokensPerS], 100);
}

TEST_F(HistoryTest, StartTakesTheTotalsThereAreAsTheBaseline) {
  // A series restored from a snapshot: its totals are not one second's.
  EngineSeries* s = Series("0");
  s->Add(kPromptTokens, 1'000'000);
  s->hist(kE2eRequestLatency).Observe(2e9);
  for (int i = 0; i < 50; ++i) s->part<AdmissionPart>().Reject("queue_full");
  History h;
  h.Start(*reg_, 0);
  s->Add(kPromptTokens, 7);
  s->part<AdmissionPart>().Reject("queue_full");
  h.Tick(*reg_, kSec, 100);
  EXPECT_EQ(h.Find(*s)->last[kPromptTokensPerS], 7);
  EXPECT_EQ(h.Find(*s)->last[kAdmissionRejectionsPerS], 1);
  EXPECT_TRUE(std::isnan(h.Find(*s)->last[kE2eP50]));
  // A series created after Start() counts from zero.
  EngineSeries* late = Series("1");
  late->Add(kPromptTokens, 5);
  late->hist(kE2eRequestLatency).Observe(2e9);
  late->part<AdmissionPart>().Reject("deadline");
  h.Tick(*reg_, 2 * kSec, 101);
  EXPECT_EQ(h.Find(*late)->last[kPromptTokensPerS], 5);
  EXPECT_EQ(h.Find(*late)->last[kAdmissionRejectionsPerS], 1);
  EXPECT_FALSE(std::isnan(h.Find(*late)->last[kE2eP50]));
  EXPECT_EQ(h.Find(*late)->t.Joined(), "101");
}

TEST_F(HistoryTest, SumsTheRequestLabelCells) {
  EngineSeries* s = Series("0");
  const uint16_t id = reg_->request_labels().Intern(0, "acme");
  ASSERT_TRUE(s->Admit(0, id));
  SeriesValues& cell = s->Cell(RequestLabels::Pack(0, 0, id));
  History h;
  h.Start(*reg_, 0);
  cell.Add(kGenerationTokens, 40);
  s->Add(kGenerationTokens, 2);
  cell.hist(kTimeToFirstToken).Observe(0.5e6);
  h.Tick(*reg_, kSec, 100);
  EXPECT_EQ(h.Find(*s)->last[kGenerationTokensPerS], 42);
  EXPECT_DOUBLE_EQ(h.Find(*s)->last[kTtftP50], 0.0005);
}

TEST_F(HistoryTest, SglangUsesItsPerTokenInterTokenLatency) {
  EngineSeries* s = Series("0", Profile::kSglang);
  History h;
  h.Start(*reg_, 0);
  s->hist(kInterTokenLatencyPerToken).ObserveWeighted(3e6, 4, 12e6);
  h.Tick(*reg_, kSec, 100);
  EXPECT_FALSE(std::isnan(h.Find(*s)->last[kItlP50]));
}

TEST_F(HistoryTest, PointTimesStrictlyIncrease) {
  EngineSeries* s = Series("0");
  History h;
  h.Start(*reg_, 0);
  h.Tick(*reg_, kSec, 100);
  h.Tick(*reg_, 2 * kSec, 100);  // the same wall second
  h.Tick(*reg_, 3 * kSec, 50);   // the wall clock stepped back
  h.Tick(*reg_, 4 * kSec, 200);
  EXPECT_EQ(h.Find(*s)->t.Joined(), "100,101,102,200");
}

TEST_F(HistoryTest, KeepsFifteenMinutesInBoundedMemory) {
  EngineSeries* s = Series("0");
  History h;
  h.Start(*reg_, 0);
  std::mt19937_64 rng(1);
  for (uint64_t i = 1; i <= 3 * kPoints; ++i) {
    for (int j = 0; j < 20; ++j) {
      s->hist(kTimeToFirstToken).Observe(double(rng() % 2'000'000'000));
      s->hist(kInterTokenLatency).Observe(double(rng() % 200'000'000));
      s->hist(kE2eRequestLatency).Observe(double(rng() % 20'000'000'000));
    }
    s->Add(kGenerationTokens, rng() % 100'000);
    s->Set(kKvCacheUsagePerc, double(rng() % 1000) / 999);
    for (uint64_t r = rng() % 30; r > 0; --r) {
      s->part<AdmissionPart>().Reject("queue_full");
    }
    const uint64_t waiting = rng() % 200;
    s->part<WaitingReasonPart>().Set(waiting, rng() % (waiting + 1));
    h.Tick(*reg_, i * kSec, int64_t(1'700'000'000 + i));
  }
  const History::Series* hs = h.Find(*s);
  EXPECT_EQ(hs->t.size(), kPoints);
  for (const TextRing& r : hs->values) EXPECT_EQ(r.size(), kPoints);
  EXPECT_EQ(hs->t.Joined().substr(0, 10),
            std::to_string(1'700'000'000 + 2 * kPoints + 1));
  const size_t buckets = s->hist(kE2eRequestLatency).counts().size();
  EXPECT_LE(h.BytesHeld(*s), History::MaxBytesPerSeries(buckets));
  // What docs/operations.md states for ordinary values.
  EXPECT_LE(h.BytesHeld(*s), 176u * 1024) << h.BytesHeld(*s);
  std::printf("bytes held for one series of busy values: %zu (bound %zu)\n",
              h.BytesHeld(*s), History::MaxBytesPerSeries(buckets));
}

TEST_F(HistoryTest, FollowsAtMostMaxSeries) {
  for (size_t i = 0; i < kMaxSeries + 6; ++i) Series(std::to_string(i));
  History h;
  h.Start(*reg_, 0);
  h.Tick(*reg_, kSec, 100);
  EXPECT_EQ(h.followed(), kMaxSeries);
  EXPECT_EQ(h.unfollowed(), 6u);
  size_t found = 0;
  reg_->ForEachSeries(
      [&](const EngineSeries& s) { found += h.Find(s) != nullptr ? 1 : 0; });
  EXPECT_EQ(found, kMaxSeries);
}

}  // namespace
}  // namespace tokenmeter::daemon::live
