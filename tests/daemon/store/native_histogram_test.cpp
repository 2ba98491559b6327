// NativeHistogram (daemon/store/native_histogram.h) against an independent
// computation of the bucket index: ceil(log2(v) 2^s) in long double, then
// moved until bound(i-1) < v <= bound(i), with bound(i) = 2^(i 2^-s)
// computed by exp2l and rounded to a double (exact powers of two for
// s <= 0), as Prometheus' boundaries are the doubles nearest those values.
#include "daemon/store/native_histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "daemon/base/state_io.h"

namespace tokenmeter::daemon {
namespace {

using Buckets = std::map<int32_t, uint64_t>;

double Bound(int64_t i, int schema) {
  if (schema <= 0) {
    const int64_t e = i * (int64_t(1) << -schema);
    if (e > 1100) return HUGE_VAL;
    if (e < -1100) return 0;
    return std::ldexp(1.0, int(e));
  }
  return static_cast<double>(
      std::exp2(static_cast<long double>(i) / (int64_t(1) << schema)));
}

int32_t RefIndex(double v, int schema) {
  const double a = std::fabs(v);
  if (std::isinf(a)) {
    return RefIndex(std::numeric_limits<double>::max(), schema) + 1;
  }
  const long double scale = std::ldexp(1.0L, schema);
  auto i = int64_t(std::ceil(std::log2(static_cast<long double>(a)) * scale));
  while (a > Bound(i, schema)) ++i;
  while (a <= Bound(i - 1, schema)) --i;
  return int32_t(i);
}

Buckets Collect(const NativeHistogram& h, bool positive) {
  Buckets out;
  int32_t last = INT32_MIN;
  bool first = true;
  h.ForEachBucket(positive, [&](int32_t index, uint64_t count) {
    EXPECT_TRUE(first || index > last) << "out of order at " << index;
    EXPECT_GT(count, 0u) << index;
    first = false;
    last = index;
    out[index] += count;
  });
  return out;
}

uint64_t Total(const Buckets& b) {
  uint64_t t = 0;
  for (const auto& [i, c] : b) t += c;
  return t;
}

// The buckets `values` fall in at `schema` (zero bucket and NaN excluded).
struct RefHistogram {
  Buckets positive, negative;
  uint64_t zero = 0;
};
RefHistogram Rebucket(const std::vector<std::pair<double, uint64_t>>& values,
                      int schema) {
  RefHistogram r;
  for (const auto& [v, n] : values) {
    if (std::isnan(v)) continue;
    if (std::fabs(v) <= NativeHistogram::kZeroThreshold) {
      r.zero += n;
    } else {
      (v > 0 ? r.positive : r.negative)[RefIndex(v, schema)] += n;
    }
  }
  return r;
}

void ExpectMatches(const NativeHistogram& h,
                   const std::vector<std::pair<double, uint64_t>>& values) {
  const RefHistogram ref = Rebucket(values, h.schema());
  EXPECT_EQ(Collect(h, true), ref.positive);
  EXPECT_EQ(Collect(h, false), ref.negative);
  EXPECT_EQ(h.zero_count(), ref.zero);
  EXPECT_EQ(h.populated(), ref.positive.size() + ref.negative.size());
}

TEST(NativeHistogramTest, BoundaryAtPowerOfBaseIsInclusive) {
  for (int s = NativeHistogram::kMinSchema; s <= NativeHistogram::kMaxSchema;
       ++s) {
    const int per_octave = s >= 0 ? 1 << s : 1;
    std::vector<int64_t> indexes;
    for (int64_t i = -3 * per_octave; i <= 3 * per_octave; ++i) {
      indexes.push_back(i);
    }
    for (int64_t far : {-100, -37, 50, 99}) indexes.push_back(far * per_octave);
    for (int64_t i : indexes) {
      const double b = Bound(i, s);
      if (b <= NativeHistogram::kZeroThreshold || std::isinf(b)) continue;
      EXPECT_EQ(NativeHistogram::BucketIndex(b, s), i) << "s=" << s;
      EXPECT_EQ(NativeHistogram::BucketIndex(-b, s), i) << "s=" << s;
      EXPECT_EQ(NativeHistogram::BucketIndex(std::nextafter(b, HUGE_VAL), s),
                i + 1)
          << "s=" << s << " i=" << i;
      EXPECT_EQ(NativeHistogram::BucketIndex(std::nextafter(b, 0), s), i)
          << "s=" << s << " i=" << i;
    }
  }
}

TEST(NativeHistogramTest, BoundariesAreTheNearestDoubles) {
  // IEEE square roots are correctly rounded: 2^(1/2) is bound 1 of schema 1,
  // 2^(-1/2) bound -1; powers of two are bounds at every schema.
  EXPECT_EQ(NativeHistogram::BucketIndex(std::sqrt(2.0), 1), 1);
  EXPECT_EQ(
      NativeHistogram::BucketIndex(std::nextafter(std::sqrt(2.0), HUGE_VAL), 1),
      2);
  EXPECT_EQ(NativeHistogram::BucketIndex(std::sqrt(0.5), 1), -1);
  EXPECT_EQ(NativeHistogram::BucketIndex(1.0, 0), 0);
  EXPECT_EQ(NativeHistogram::BucketIndex(1.0, 8), 0);
  EXPECT_EQ(NativeHistogram::BucketIndex(std::nextafter(1.0, 2.0), 8), 1);
  EXPECT_EQ(NativeHistogram::BucketIndex(2.0, 3), 8);
  EXPECT_EQ(NativeHistogram::BucketIndex(0.5, 3), -8);
  EXPECT_EQ(NativeHistogram::BucketIndex(4.0, -1), 1);
  EXPECT_EQ(NativeHistogram::BucketIndex(4.1, -1), 2);
  EXPECT_EQ(NativeHistogram::BucketIndex(65536.0, -4), 1);
  EXPECT_EQ(NativeHistogram::BucketIndex(65537.0, -4), 2);
  EXPECT_EQ(NativeHistogram::BucketIndex(1.0 / 65536, -4), -1);
}

TEST(NativeHistogramTest, MatchesIndependentIndexForRandomValues) {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> log10(-6, 6);
  std::uniform_int_distribution<int> exponent(-127, 1023);
  for (int s = NativeHistogram::kMinSchema; s <= NativeHistogram::kMaxSchema;
       ++s) {
    for (int n = 0; n < 4000; ++n) {
      double v;
      if (n % 2 == 0) {
        v = std::pow(10.0, log10(rng));
      } else {
        // Any mantissa at any exponent above the zero bucket.
        const uint64_t mantissa = rng() >> 12;
        const uint64_t bits = (uint64_t(exponent(rng) + 1023) << 52) | mantissa;
        v = std::bit_cast<double>(bits);
        if (v <= NativeHistogram::kZeroThreshold) continue;
      }
      ASSERT_EQ(NativeHistogram::BucketIndex(v, s), RefIndex(v, s))
          << "v=" << v << " s=" << s;
    }
    // Subnormal powers of two (BucketIndex alone; they are in the zero
    // bucket, and exp2l's bounds there are not the doubles nearest).
    for (int e : {-1074, -1060, -1023}) {
      const int32_t want = s >= 0 ? e * (1 << s) : -((-e) >> -s);
      EXPECT_EQ(NativeHistogram::BucketIndex(std::ldexp(1.0, e), s), want)
          << "e=" << e << " s=" << s;
    }
  }
}

TEST(NativeHistogramTest, SmallValuesGoToTheZeroBucket) {
  NativeHistogram h(3);
  for (double v : {0.0, -0.0, NativeHistogram::kZeroThreshold,
                   -NativeHistogram::kZeroThreshold,
                   std::numeric_limits<double>::denorm_min(),
                   std::nextafter(NativeHistogram::kZeroThreshold, 0)}) {
    h.Observe(v);
  }
  EXPECT_EQ(h.zero_count(), 6u);
  EXPECT_EQ(h.populated(), 0u);
  const double above = std::nextafter(NativeHistogram::kZeroThreshold, 1);
  h.Observe(above);
  EXPECT_EQ(h.zero_count(), 6u);
  EXPECT_EQ(Collect(h, true),
            (Buckets{{NativeHistogram::BucketIndex(above, 3), 1}}));
  EXPECT_EQ(NativeHistogram::BucketIndex(above, 3), -128 * 8 + 1);
}

TEST(NativeHistogramTest, NegativeValuesGoToNegativeBuckets) {
  NativeHistogram h(3);
  h.Observe(-0.5);
  h.Observe(-0.5);
  h.Observe(-3);
  h.Observe(2);
  EXPECT_EQ(Collect(h, false), (Buckets{{-8, 2}, {RefIndex(3, 3), 1}}));
  EXPECT_EQ(Collect(h, true), (Buckets{{8, 1}}));
  EXPECT_EQ(h.populated(), 3u);
}

TEST(NativeHistogramTest, InfinitiesGoAboveTheLargestFinite) {
  NativeHistogram h(3);
  h.Observe(HUGE_VAL);
  h.Observe(-HUGE_VAL);
  h.Observe(std::numeric_limits<double>::max());
  // DBL_MAX is just below 2^1024 = base^(1024 * 8).
  EXPECT_EQ(Collect(h, true), (Buckets{{8192, 1}, {8193, 1}}));
  EXPECT_EQ(Collect(h, false), (Buckets{{8193, 1}}));
  EXPECT_EQ(NativeHistogram::BucketIndex(HUGE_VAL, -4), 65);
  EXPECT_EQ(NativeHistogram::BucketIndex(-HUGE_VAL, 8), 262145);
}

TEST(NativeHistogramTest, NaNIsIgnored) {
  NativeHistogram h(3);
  h.Observe(std::nan(""));
  h.Observe(-std::nan(""));
  h.ObserveN(std::nan(""), 5);
  EXPECT_EQ(h.populated(), 0u);
  EXPECT_EQ(h.zero_count(), 0u);
  EXPECT_EQ(NativeHistogram::BucketIndex(std::nan(""), 3), INT32_MIN);
}

TEST(NativeHistogramTest, ObserveNCountsNTimesAndZeroIsNothing) {
  NativeHistogram a(3), b(3);
  a.ObserveN(0.25, 7);
  a.ObserveN(0.0, 3);
  a.ObserveN(1.5, 0);
  for (int i = 0; i < 7; ++i) b.Observe(0.25);
  for (int i = 0; i < 3; ++i) b.Observe(0.0);
  EXPECT_EQ(Collect(a, true), Collect(b, true));
  EXPECT_EQ(a.zero_count(), b.zero_count());
  EXPECT_EQ(a.populated(), 1u);
}

TEST(NativeHistogramTest, ReductionKeepsAtMost160AndEveryObservation) {
  // 80 octaves of values of both signs at schema 8 (40,960 indexes).
  NativeHistogram h(8);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> log2v(-40, 40);
  std::vector<std::pair<double, uint64_t>> values;
  for (int n = 0; n < 100'000; ++n) {
    const double v = std::exp2(log2v(rng)) * (n % 3 == 0 ? -1 : 1);
    h.Observe(v);
    values.emplace_back(v, 1);
    ASSERT_LE(h.populated(), NativeHistogram::kMaxBuckets);
  }
  EXPECT_LT(h.schema(), 8);
  ExpectMatches(h, values);
  EXPECT_EQ(Total(Collect(h, true)) + Total(Collect(h, false)), 100'000u);
  // No more halving than needed: one schema finer holds more than 160.
  const RefHistogram finer = Rebucket(values, h.schema() + 1);
  EXPECT_GT(finer.positive.size() + finer.negative.size(),
            NativeHistogram::kMaxBuckets);
}

TEST(NativeHistogramTest, ReductionAtTheLowestSchemaStillHolds) {
  // Every octave from 2^-127 to 2^1023 and both infinities, both signs: 146
  // indexes at schema -4, so the limit holds there.
  NativeHistogram h(2);
  std::vector<std::pair<double, uint64_t>> values;
  for (int e = -127; e <= 1023; ++e) {
    for (double sign : {1.0, -1.0}) {
      values.emplace_back(sign * std::ldexp(1.5, e - 1), 1);
    }
  }
  values.emplace_back(HUGE_VAL, 1);
  values.emplace_back(-HUGE_VAL, 1);
  for (const auto& [v, n] : values) h.Observe(v);
  EXPECT_EQ(h.schema(), -4);
  EXPECT_LE(h.populated(), NativeHistogram::kMaxBuckets);
  ExpectMatches(h, values);
}

TEST(NativeHistogramTest, FarApartValuesMatchReference) {
  // Mixtures whose indexes span far more than the dense window, with
  // ObserveN, at every schema: every bucket and count as re-bucketed.
  for (int s = NativeHistogram::kMinSchema; s <= NativeHistogram::kMaxSchema;
       ++s) {
    NativeHistogram h(s);
    std::mt19937_64 rng(100 + s);
    std::uniform_real_distribution<double> near(std::log(0.005), std::log(5.0));
    std::uniform_real_distribution<double> wide(-300, 300);
    std::uniform_int_distribution<int> pick(0, 99);
    std::vector<std::pair<double, uint64_t>> values;
    for (int n = 0; n < 5000; ++n) {
      const int k = pick(rng);
      double v;
      if (k < 80) {
        v = std::exp(near(rng));
      } else if (k < 95) {
        v = std::pow(10.0, wide(rng) / 10);
      } else if (k < 97) {
        v = -std::exp(near(rng));
      } else if (k < 98) {
        v = HUGE_VAL;
      } else {
        v = 0;
      }
      const uint64_t count = 1 + uint64_t(pick(rng) % 3);
      h.ObserveN(v, count);
      values.emplace_back(v, count);
      if (n % 500 == 0) ExpectMatches(h, values);
    }
    ExpectMatches(h, values);
    EXPECT_LE(h.populated(), NativeHistogram::kMaxBuckets);
  }
}

TEST(NativeHistogramTest, QuantileBucketsAreNarrowAtSchema3) {
  NativeHistogram h(3);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> logv(std::log(0.005), std::log(5.0));
  std::vector<double> values;
  for (int n = 0; n < 20'000; ++n) {
    values.push_back(std::exp(logv(rng)));
    h.Observe(values.back());
  }
  EXPECT_EQ(h.schema(), 3);
  std::sort(values.begin(), values.end());
  const Buckets buckets = Collect(h, true);
  const double max_width = std::exp2(1.0 / 8) - 1;
  for (double q : {0.5, 0.9, 0.99}) {
    const double exact = values[size_t(q * (values.size() - 1))];
    const int32_t i = NativeHistogram::BucketIndex(exact, 3);
    ASSERT_TRUE(buckets.count(i)) << q;
    const double lower = Bound(i - 1, 3);
    const double upper = Bound(i, 3);
    EXPECT_LE((upper - lower) / lower, max_width + 1e-12) << q;
    // Interpolated as Prometheus does for schema > 0 (exponentially within
    // the bucket), the estimate is within that width of the exact value.
    const double rank = q * double(values.size());
    double below = 0;
    double estimate = 0;
    for (const auto& [index, count] : buckets) {
      if (below + double(count) >= rank) {
        const double f = (rank - below) / double(count);
        estimate = Bound(index - 1, 3) *
                   std::pow(Bound(index, 3) / Bound(index - 1, 3), f);
        break;
      }
      below += double(count);
    }
    EXPECT_LE(std::fabs(estimate - exact) / exact, max_width) << q;
  }
}

std::string Saved(const NativeHistogram& h) {
  std::string bytes;
  StateWriter w(bytes);
  h.SaveState(w);
  return bytes;
}

TEST(NativeHistogramTest, SaveLoadRoundTrip) {
  NativeHistogram h(3);
  std::vector<std::pair<double, uint64_t>> values;
  for (double v : {0.0, 0.01, 0.02, 0.5, 7.0, -1.0, 1e30, HUGE_VAL, 1e-30}) {
    h.ObserveN(v, 3);
    values.emplace_back(v, 3);
  }
  const std::string bytes = Saved(h);
  NativeHistogram loaded(3);
  StateReader r(bytes.data(), bytes.size());
  loaded.LoadState(r);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.at_end());
  EXPECT_EQ(loaded.schema(), 3);
  ExpectMatches(loaded, values);
  EXPECT_EQ(Saved(loaded), bytes);
  loaded.Observe(0.03);
  h.Observe(0.03);
  EXPECT_EQ(Saved(loaded), Saved(h));
}

TEST(NativeHistogramTest, LoadKeepsAReducedSchema) {
  NativeHistogram h(3);
  std::vector<std::pair<double, uint64_t>> values;
  for (int e = -100; e < 100; ++e) {
    values.emplace_back(std::ldexp(1.1, e), 1);
    h.Observe(values.back().first);
  }
  ASSERT_LT(h.schema(), 3);
  const std::string bytes = Saved(h);
  NativeHistogram loaded(3);
  StateReader r(bytes.data(), bytes.size());
  loaded.LoadState(r);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(loaded.schema(), h.schema());
  ExpectMatches(loaded, values);
}

TEST(NativeHistogramTest, LoadReducesAFinerSchemaToTheInitialOne) {
  NativeHistogram fine(6);
  std::vector<std::pair<double, uint64_t>> values;
  for (double v : {0.011, 0.012, 0.013, 0.2, 0.21, 3.0, -0.5}) {
    fine.Observe(v);
    values.emplace_back(v, 1);
  }
  const std::string bytes = Saved(fine);
  NativeHistogram loaded(3);
  StateReader r(bytes.data(), bytes.size());
  loaded.LoadState(r);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(loaded.schema(), 3);
  ExpectMatches(loaded, values);
}

// Hand-written snapshots: schema, zero count, then per sign a count and
// (u32 index, u64 count) pairs.
struct Bad {
  const char* name;
  int schema;
  std::vector<std::pair<uint32_t, uint64_t>> positive;
  uint64_t positive_count_field;  // written as the positive count
  bool truncate;
};

TEST(NativeHistogramTest, CorruptLoadsAreRefused) {
  const int32_t inf_index = NativeHistogram::BucketIndex(HUGE_VAL, 3);
  const int32_t lowest =
      NativeHistogram::BucketIndex(std::nextafter(0x1p-128, 1), 3);
  std::vector<std::pair<uint32_t, uint64_t>> too_many;
  for (uint32_t i = 0; i < 161; ++i) too_many.emplace_back(i, 1);
  const std::vector<Bad> cases = {
      {"schema above 8", 9, {{1, 1}}, 1, false},
      {"schema below -4", -5, {{1, 1}}, 1, false},
      {"161 buckets", 3, too_many, 161, false},
      {"index above +Inf's", 3, {{uint32_t(inf_index + 1), 1}}, 1, false},
      {"index in the zero bucket", 3, {{uint32_t(lowest - 1), 1}}, 1, false},
      {"indexes out of order", 3, {{5, 1}, {4, 1}}, 2, false},
      {"repeated index", 3, {{5, 1}, {5, 1}}, 2, false},
      {"zero count", 3, {{5, 0}}, 1, false},
      {"count beyond the bytes", 3, {{5, 1}}, 2, false},
      {"truncated", 3, {{5, 1}}, 1, true},
  };
  for (const Bad& c : cases) {
    std::string bytes;
    StateWriter w(bytes);
    w.U8(uint8_t(int8_t(c.schema)));
    w.U64(4);
    w.U64(c.positive_count_field);
    for (const auto& [i, n] : c.positive) {
      w.U32(i);
      w.U64(n);
    }
    w.U64(0);
    if (c.truncate) bytes.resize(bytes.size() - 3);
    NativeHistogram h(3);
    h.Observe(0.1);
    const std::string before = Saved(h);
    StateReader r(bytes.data(), bytes.size());
    h.LoadState(r);
    EXPECT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(Saved(h), before) << c.name;
  }
  // The same frame with valid fields loads.
  std::string bytes;
  StateWriter w(bytes);
  w.U8(3);
  w.U64(4);
  w.U64(2);
  w.U32(uint32_t(lowest));
  w.U64(1);
  w.U32(uint32_t(inf_index));
  w.U64(2);
  w.U64(0);
  NativeHistogram h(3);
  StateReader r(bytes.data(), bytes.size());
  h.LoadState(r);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(h.zero_count(), 4u);
  EXPECT_EQ(Collect(h, true), (Buckets{{lowest, 1}, {inf_index, 2}}));
}

}  // namespace
}  // namespace tokenmeter::daemon
