#include "engine/workload.h"

#include <gtest/gtest.h>

#include <numeric>

namespace tokenmeter::engine {
namespace {

WorkloadOptions Options(uint32_t n, double rate) {
  WorkloadOptions o;
  o.requests = n;
  o.rate = rate;
  o.prompt_len = 100;
  o.output_len = 40;
  o.vocab = 256;
  o.seed = 7;
  return o;
}

TEST(WorkloadTest, SameSeedGivesSameWorkload) {
  const auto a = GenerateWorkload(Options(50, 10));
  const auto b = GenerateWorkload(Options(50, 10));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].id, b[i].id);
    EXPECT_EQ(a[i].arrival_offset_ns, b[i].arrival_offset_ns);
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_EQ(a[i].max_tokens, b[i].max_tokens);
  }
}

TEST(WorkloadTest, OtherSeedGivesOtherPrompts) {
  WorkloadOptions o = Options(5, 0);
  const auto a = GenerateWorkload(o);
  o.seed = 8;
  const auto b = GenerateWorkload(o);
  EXPECT_NE(a[0].prompt, b[0].prompt);
}

TEST(WorkloadTest, RateChangesArrivalsNotPrompts) {
  const auto a = GenerateWorkload(Options(20, 5));
  const auto b = GenerateWorkload(Options(20, 50));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].prompt, b[i].prompt);
  EXPECT_NE(a[5].arrival_offset_ns, b[5].arrival_offset_ns);
}

TEST(WorkloadTest, RateZeroArrivesAllAtOnce) {
  for (const auto& r : GenerateWorkload(Options(30, 0))) {
    EXPECT_EQ(r.arrival_offset_ns, 0u);
  }
}

TEST(WorkloadTest, PoissonGapsHaveTheRatesMean) {
  const double rate = 20;
  const auto w = GenerateWorkload(Options(20000, rate));
  // The first request arrives at 0; n-1 exponential gaps follow.
  const double mean_gap_s =
      double(w.back().arrival_offset_ns) / 1e9 / double(w.size() - 1);
  // Standard error of the mean of 20k exponential gaps is 0.7% of it.
  EXPECT_NEAR(mean_gap_s, 1.0 / rate, 0.04 / rate);
  for (size_t i = 1; i < w.size(); ++i) {
    ASSERT_GE(w[i].arrival_offset_ns, w[i - 1].arrival_offset_ns);
  }
  // Exponential: about e^-1 of the gaps exceed the mean.
  size_t longer = 0;
  for (size_t i = 1; i < w.size(); ++i) {
    longer += w[i].arrival_offset_ns - w[i - 1].arrival_offset_ns >
              uint64_t(1e9 / rate);
  }
  EXPECT_NEAR(double(longer) / double(w.size() - 1), 0.3679, 0.02);
}

TEST(WorkloadTest, LengthsStayAroundTheirMeans) {
  const auto w = GenerateWorkload(Options(4000, 0));
  double prompt = 0, output = 0;
  for (const auto& r : w) {
    ASSERT_GE(r.prompt.size(), 50u);
    ASSERT_LE(r.prompt.size(), 150u);
    ASSERT_GE(r.max_tokens, 20u);
    ASSERT_LE(r.max_tokens, 60u);
    prompt += double(r.prompt.size());
    output += r.max_tokens;
  }
  EXPECT_NEAR(prompt / double(w.size()), 100, 2);
  EXPECT_NEAR(output / double(w.size()), 40, 1);
  EXPECT_EQ(MaxPromptLen(Options(1, 0)), 150u);
  EXPECT_EQ(MaxOutputLen(Options(1, 0)), 60u);
}

TEST(WorkloadTest, PromptsNeverContainTheStopToken) {
  for (const auto& r : GenerateWorkload(Options(200, 0))) {
    for (int32_t t : r.prompt) {
      ASSERT_GE(t, 1);
      ASSERT_LT(t, 256);
    }
  }
}

TEST(WorkloadTest, SharedPrefixIsCommonToEveryPrompt) {
  WorkloadOptions o = Options(50, 0);
  o.shared_prefix = 0.4;  // 40 of the mean 100 tokens
  const auto w = GenerateWorkload(o);
  for (const auto& r : w) {
    ASSERT_GT(r.prompt.size(), 40u);
    EXPECT_TRUE(std::equal(r.prompt.begin(), r.prompt.begin() + 40,
                           w[0].prompt.begin()));
  }
  // The tails differ.
  EXPECT_FALSE(std::equal(w[0].prompt.begin() + 40, w[0].prompt.begin() + 50,
                          w[1].prompt.begin() + 40));
}

TEST(WorkloadTest, FullSharedPrefixStillLeavesOwnTokens) {
  WorkloadOptions o = Options(20, 0);
  o.shared_prefix = 1.0;
  for (const auto& r : GenerateWorkload(o)) EXPECT_GE(r.prompt.size(), 50u);
}

TEST(WorkloadTest, RejectsBadOptions) {
  WorkloadOptions o = Options(10, 0);
  EXPECT_TRUE(ValidateWorkload(o).ok());
  o.rate = -1;
  EXPECT_FALSE(ValidateWorkload(o).ok());
  o = Options(0, 0);
  EXPECT_FALSE(ValidateWorkload(o).ok());
  o = Options(10, 0);
  o.shared_prefix = 1.5;
  EXPECT_FALSE(ValidateWorkload(o).ok());
  o = Options(10, 0);
  o.prompt_len = 0;
  EXPECT_FALSE(ValidateWorkload(o).ok());
}

}  // namespace
}  // namespace tokenmeter::engine
