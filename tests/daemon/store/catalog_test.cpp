// The metric catalog (docs/metrics.md's table in code), the default bucket
// sets and the histogram layouts.
#include "daemon/store/catalog.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "daemon/store/histogram.h"

namespace tokenmeter::daemon {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.substr(s.size() - suffix.size()) == suffix;
}

TEST(CatalogTest, OneTwoFiveSeries) {
  EXPECT_EQ(OneTwoFive(100), (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
  EXPECT_EQ(OneTwoFive(1), (std::vector<double>{1}));
  EXPECT_EQ(OneTwoFive(4), (std::vector<double>{1, 2}));
  EXPECT_EQ(OneTwoFive(99), (std::vector<double>{1, 2, 5, 10, 20, 50}));
  const std::vector<double> def = OneTwoFive(32768);
  EXPECT_EQ(def, (std::vector<double>{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000,
                                      2000, 5000, 10000, 20000}));
}

TEST(CatalogTest, OneTwoFiveDoesNotOverflowAtTheTop) {
  const std::vector<double> all = OneTwoFive(UINT64_MAX);
  ASSERT_FALSE(all.empty());
  for (size_t i = 1; i < all.size(); ++i) {
    EXPECT_GT(all[i], all[i - 1]) << "at " << i;
  }
  EXPECT_EQ(all.back(), 1e19);
  EXPECT_EQ(all.size(), 58u);  // 19 decades of 1, 2, 5, then 1e19
  EXPECT_EQ(OneTwoFive(uint64_t(1) << 40).back(), 1e12);
}

TEST(CatalogTest, DefaultBucketsMatchTheMetricsDocument) {
  struct {
    BucketSet set;
    std::vector<double> bounds;
  } cases[] = {
      {BucketSet::kTtft,
       {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
        1,     2.5,   5,    7.5,  10,   20,   40,   80,  160,  640, 2560}},
      {BucketSet::kItl,
       {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5,
        5, 7.5, 10, 20, 40, 80}},
      {BucketSet::kPhase, {0.3, 0.5, 0.8, 1,  1.5, 2,   2.5, 5,   10,   15,  20,
                           30,  40,  50,  60, 120, 240, 480, 960, 1920, 7680}},
      {BucketSet::kTokens,
       {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000}},
      {BucketSet::kIteration,
       {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}},
      {BucketSet::kParamsN, {1, 2, 5, 10, 20}},
      {BucketSet::kNone, {}},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(DefaultBuckets(c.set, 32768), c.bounds) << int(c.set);
  }
  EXPECT_EQ(DefaultBuckets(BucketSet::kTokens, 100), OneTwoFive(100));
}

TEST(CatalogTest, EngineTableIsConsistent) {
  std::set<std::string_view> suffixes;
  for (int i = 0; i < kNumEngineMetrics; ++i) {
    const EngineMetricDef& d = kEngineMetrics[i];
    SCOPED_TRACE(d.suffix);
    EXPECT_EQ(d.id, i);
    EXPECT_TRUE(suffixes.insert(d.suffix).second) << "duplicate";
    EXPECT_FALSE(d.help.empty());
    if (d.type == MetricType::kHistogram) {
      EXPECT_NE(d.buckets, BucketSet::kNone);
      EXPECT_EQ(d.seconds, EndsWith(d.suffix, "_seconds"));
      EXPECT_EQ(d.own_label, "");
    } else {
      EXPECT_EQ(d.buckets, BucketSet::kNone);
      EXPECT_FALSE(d.seconds);
    }
    if (d.type == MetricType::kCounter) {
      EXPECT_FALSE(EndsWith(d.suffix, "_total")) << "_total is added";
    }
  }
  // The histograms are one contiguous run (EngineSeries::hists).
  for (int i = 0; i < kNumEngineMetrics; ++i) {
    const bool in_run = i >= kTimeToFirstToken && i <= kLastHistogram;
    EXPECT_EQ(kEngineMetrics[i].type == MetricType::kHistogram, in_run)
        << kEngineMetrics[i].suffix;
  }
}

TEST(CatalogTest, DaemonTableIsConsistent) {
  std::set<std::string_view> names;
  for (int i = 0; i < kNumDaemonMetrics; ++i) {
    const DaemonMetricDef& d = kDaemonMetrics[i];
    SCOPED_TRACE(d.name);
    EXPECT_EQ(d.id, i);
    EXPECT_TRUE(names.insert(d.name).second) << "duplicate";
    EXPECT_TRUE(d.name.starts_with("tokenmeter_") ||
                d.name.starts_with("process_"));
    EXPECT_FALSE(d.help.empty());
    if (d.type == MetricType::kCounter) {
      EXPECT_FALSE(EndsWith(d.name, "_total"));
    }
  }
}

TEST(CatalogTest, IntervalNamesAreDistinct) {
  std::set<std::string_view> names;
  for (size_t i = 0; i < size_t(Interval::kCount); ++i) {
    EXPECT_TRUE(names.insert(IntervalName(Interval(i))).second);
    EXPECT_NE(IntervalName(Interval(i)), "unknown");
  }
}

// ---- histograms
// ----------------------------------------------------------------

TEST(HistogramTest, LeIsInclusiveAtEveryDefaultSecondsBound) {
  for (BucketSet set : {BucketSet::kTtft, BucketSet::kItl, BucketSet::kPhase}) {
    const HistogramLayout layout(DefaultBuckets(set, 32768), 1e9);
    const auto& b = layout.bounds();
    for (size_t i = 0; i < b.size(); ++i) {
      const double ns = std::round(b[i] * 1e9);
      EXPECT_EQ(layout.BucketFor(ns), i) << b[i];
      EXPECT_EQ(layout.BucketFor(ns + 1), i + 1) << b[i];
      EXPECT_EQ(layout.BucketFor(ns - 1), i) << b[i];
    }
    EXPECT_EQ(layout.BucketFor(0), 0u);
  }
}

TEST(HistogramTest, LeIsInclusiveAtOddOverriddenBounds) {
  // b * 1e9 rounds below the integer nanosecond for these bounds.
  const std::vector<double> bounds = {9.97e-07,    7.976e-06,   6.3808e-05,
                                      0.000126619, 0.000496506, 0.1};
  const HistogramLayout layout(bounds, 1e9);
  const double ns[] = {997, 7976, 63808, 126619, 496506, 100'000'000};
  for (size_t i = 0; i < bounds.size(); ++i) {
    ASSERT_EQ(ns[i] / 1e9, bounds[i]);  // exposed exactly as the bound
    EXPECT_EQ(layout.BucketFor(ns[i]), i) << bounds[i];
    EXPECT_EQ(layout.BucketFor(ns[i] + 1), i + 1) << bounds[i];
  }
  // Whatever the raw value, the bucket agrees with the exposed value.
  for (double raw = 990; raw < 1010; raw += 0.25) {
    const bool in_first = raw / 1e9 <= bounds[0];
    EXPECT_EQ(layout.BucketFor(raw) == 0, in_first) << raw;
  }
}

TEST(HistogramTest, ZeroAndNegativeBoundsAreInclusive) {
  // SGLang's queue-time buckets start at 0 (a request that never waited).
  const HistogramLayout layout({-1.0, 0.0, 0.001}, 1e9);
  EXPECT_EQ(layout.BucketFor(0), 1u);
  EXPECT_EQ(layout.BucketFor(1), 2u);
  EXPECT_EQ(layout.BucketFor(1'000'000), 2u);
  EXPECT_EQ(layout.BucketFor(1'000'001), 3u);
  EXPECT_EQ(layout.le_text()[1], "0");
}

TEST(HistogramTest, TokenBoundsAreExact) {
  const HistogramLayout layout(OneTwoFive(100), 1.0);
  EXPECT_EQ(layout.BucketFor(1), 0u);
  EXPECT_EQ(layout.BucketFor(2), 1u);
  EXPECT_EQ(layout.BucketFor(3), 2u);
  EXPECT_EQ(layout.BucketFor(100), 6u);
  EXPECT_EQ(layout.BucketFor(101), 7u);
  EXPECT_EQ(layout.le_text(),
            (std::vector<std::string>{"1", "2", "5", "10", "20", "50", "100",
                                      "+Inf"}));
}

TEST(HistogramTest, CountsSumAndLeText) {
  const HistogramLayout layout({0.001, 0.5, 2560}, 1e9);
  EXPECT_EQ(layout.le_text(),
            (std::vector<std::string>{"0.001", "0.5", "2560", "+Inf"}));
  Histogram h(&layout);
  h.Observe(123'456'789);
  h.Observe(1'000'000);
  h.Observe(3e12);
  EXPECT_EQ(h.count(), 3u);
  EXPECT_EQ(h.counts(), (std::vector<uint64_t>{1, 1, 0, 1}));
  EXPECT_EQ(h.sum(), 3000.124456789);
  Histogram one(&layout);
  one.Observe(123'456'789);
  EXPECT_EQ(one.sum(), 0.123456789);
}

}  // namespace
}  // namespace tokenmeter::daemon
