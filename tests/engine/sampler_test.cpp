#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <vector>

namespace tokenmeter::engine {
namespace {

TEST(SamplerTest, GreedyTakesTheLargestLogit) {
  const std::vector<float> l = {0.1f, 2.0f, -1.0f, 1.9f};
  Rng rng(1);
  EXPECT_EQ(SampleToken(l.data(), 4, 0.0f, rng), 1);
}

TEST(SamplerTest, GreedyBreaksTiesTowardTheLowestIndex) {
  const std::vector<float> l = {0.0f, 3.0f, 3.0f};
  Rng rng(1);
  EXPECT_EQ(SampleToken(l.data(), 3, 0.0f, rng), 1);
}

TEST(SamplerTest, SamplingFollowsTheSoftmax) {
  // p = softmax([0, ln 3]) = [0.25, 0.75].
  const std::vector<float> l = {0.0f, float(std::log(3.0))};
  Rng rng(42);
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += SampleToken(l.data(), 2, 1.0f, rng);
  EXPECT_NEAR(double(ones) / n, 0.75, 0.015);
}

TEST(SamplerTest, SeededSamplingIsDeterministic) {
  std::vector<float> l(50);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float(i % 7) * 0.3f;
  Rng a(9), b(9);
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(SampleToken(l.data(), 50, 0.8f, a),
              SampleToken(l.data(), 50, 0.8f, b));
  }
}

TEST(SamplerTest, LowTemperatureApproachesGreedy) {
  const std::vector<float> l = {1.0f, 1.5f, 0.2f};
  Rng rng(3);
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(SampleToken(l.data(), 3, 0.01f, rng), 1);
  }
}

TEST(SamplerTest, StopTokenFinishesByStop) {
  EXPECT_EQ(CheckFinish(kStopToken, 3, 10), Finish::kStop);
}

TEST(SamplerTest, ReachingMaxTokensFinishesByLength) {
  EXPECT_EQ(CheckFinish(5, 10, 10), Finish::kLength);
  EXPECT_EQ(CheckFinish(5, 9, 10), Finish::kNone);
}

TEST(SamplerTest, StopWinsOverLengthOnTheLastToken) {
  EXPECT_EQ(CheckFinish(kStopToken, 10, 10), Finish::kStop);
}

}  // namespace
}  // namespace tokenmeter::engine
