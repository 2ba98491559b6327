// HistogramLayout::BucketFor() (daemon/store/histogram.h) against a binary
// search over the same thresholds (SearchBucket(), what it did before it had
// a table) and, where raw / divisor is a normal number or <= 0, against the
// contract itself (the first bound >= raw / divisor): the table of binades
// it starts from must
// never change the bucket, for the catalog's layouts and for layouts made
// to stress it (many bounds in one binade, bounds at powers of two, a bound
// of 0, bounds past the table's range), with values at, next to and between
// every bound, at powers of two, and at 0, negatives, subnormals, huge
// values, infinities and NaN.
#include "daemon/store/histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace tokenmeter::daemon {
namespace {

// Thresholds as the layout computes them are not visible; the reference
// finds the first bound b with raw / divisor <= b, the contract itself.
size_t Reference(const std::vector<double>& bounds, double divisor,
                 double raw) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (raw / divisor <= bounds[i]) return i;
  }
  return bounds.size();
}

std::vector<double> Probes(const std::vector<double>& bounds, double divisor,
                           std::mt19937_64& rng) {
  std::vector<double> v = {0.0,
                           -0.0,
                           -1.0,
                           -1e300,
                           std::numeric_limits<double>::denorm_min(),
                           std::numeric_limits<double>::min(),
                           std::numeric_limits<double>::max(),
                           HUGE_VAL,
                           -HUGE_VAL,
                           std::ldexp(1.0, -64),
                           std::nextafter(std::ldexp(1.0, -64), 0.0),
                           std::ldexp(1.0, 63),
                           std::ldexp(1.0, 64),
                           std::nextafter(std::ldexp(1.0, 64), 0.0)};
  for (int e = -70; e <= 70; ++e) {
    const double p = std::ldexp(1.0, e);
    v.insert(v.end(), {p, std::nextafter(p, 0.0), std::nextafter(p, HUGE_VAL)});
  }
  for (double b : bounds) {
    const double t = b * divisor;
    for (double x :
         {t, std::nextafter(t, -HUGE_VAL), std::nextafter(t, HUGE_VAL)}) {
      v.push_back(x);
    }
  }
  std::uniform_real_distribution<double> exp(-70.0, 70.0);
  for (int i = 0; i < 20000; ++i) v.push_back(std::exp2(exp(rng)));
  if (!bounds.empty()) {
    std::uniform_real_distribution<double> in(0.0,
                                              bounds.back() * divisor * 1.5);
    for (int i = 0; i < 20000; ++i) v.push_back(in(rng));
  }
  return v;
}

void Check(std::vector<double> bounds, double divisor) {
  const HistogramLayout layout(bounds, divisor);
  std::mt19937_64 rng(7);
  for (double raw : Probes(bounds, divisor, rng)) {
    ASSERT_EQ(layout.BucketFor(raw), layout.SearchBucket(raw))
        << "raw " << raw << " divisor " << divisor;
    // Below that, raw / divisor rounds to a subnormal or 0 and the layout
    // (which leaves a bound of 0 as it is) and the contract part ways, as
    // they did before the table.
    if (raw <= 0 || raw / divisor >= std::numeric_limits<double>::min()) {
      ASSERT_EQ(layout.BucketFor(raw), Reference(bounds, divisor, raw))
          << "raw " << raw << " divisor " << divisor;
    }
  }
  // NaN: no bound is >= it; a binary search gives the first bucket.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(layout.BucketFor(nan), size_t{0});
  EXPECT_EQ(layout.SearchBucket(nan), size_t{0});
}

TEST(HistogramLayoutTest, SecondsBucketsInNanoseconds) {
  Check(
      {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
       1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0},
      1e9);
}

TEST(HistogramLayoutTest, TokenCountBuckets) {
  Check({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000}, 1.0);
}

TEST(HistogramLayoutTest, ABoundOfZero) {
  Check({0, 0.001, 0.002, 0.5, 1}, 1e9);
}

TEST(HistogramLayoutTest, ManyBoundsInOneBinade) {
  std::vector<double> b;
  for (int i = 0; i < 200; ++i) b.push_back(1.0 + i / 256.0);
  Check(b, 1.0);
  Check(b, 1e9);
}

TEST(HistogramLayoutTest, BoundsAtPowersOfTwoAndPastTheTable) {
  std::vector<double> b;
  for (int e = -80; e <= 80; e += 3) b.push_back(std::ldexp(1.0, e));
  Check(b, 1.0);
  Check({1e-30, 1e30}, 1.0);
  Check({}, 1.0);
}

}  // namespace
}  // namespace tokenmeter::daemon
