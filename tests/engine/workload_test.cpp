#include "engine/workload.h"

#include <gtest/gtest.h>

#include <cmath>
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

TEST(WorkloadTest, WithoutAdaptersOrTenantsRequestsCarryNone) {
  for (const auto& r : GenerateWorkload(Options(20, 0))) {
    EXPECT_EQ(r.lora, -1);
    EXPECT_EQ(r.tenant, -1);
  }
}

TEST(WorkloadTest, AdaptersAreZipfSkewedAndTenantsUniform) {
  WorkloadOptions o = Options(20000, 0);
  o.lora_adapters = 8;
  o.tenants = 3;
  std::vector<double> adapters(8), tenants(3);
  for (const auto& r : GenerateWorkload(o)) {
    ASSERT_GE(r.lora, 0);
    ASSERT_LT(r.lora, 8);
    ASSERT_GE(r.tenant, 0);
    ASSERT_LT(r.tenant, 3);
    ++adapters[size_t(r.lora)];
    ++tenants[size_t(r.tenant)];
  }
  double h = 0;
  for (int i = 1; i <= 8; ++i) h += 1.0 / i;
  for (size_t i = 0; i < 8; ++i) {
    const double p = 1.0 / double(i + 1) / h;
    // Within 5 standard errors of the binomial count.
    EXPECT_NEAR(adapters[i], p * 20000, 5 * std::sqrt(20000 * p * (1 - p)))
        << "adapter " << i;
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(tenants[i], 20000 / 3.0, 5 * std::sqrt(20000 * 2 / 9.0));
  }
}

TEST(WorkloadTest, AdaptersAndTenantsDoNotChangeTheRest) {
  WorkloadOptions o = Options(30, 10);
  const auto a = GenerateWorkload(o);
  o.lora_adapters = 5;
  o.tenants = 4;
  const auto b = GenerateWorkload(o);
  const auto c = GenerateWorkload(o);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_EQ(a[i].max_tokens, b[i].max_tokens);
    EXPECT_EQ(a[i].arrival_offset_ns, b[i].arrival_offset_ns);
    EXPECT_EQ(b[i].lora, c[i].lora);
    EXPECT_EQ(b[i].tenant, c[i].tenant);
  }
}

TEST(WorkloadTest, NamesAdaptersAndTenants) {
  EXPECT_EQ(LoraName(0), "lora-0");
  EXPECT_EQ(LoraName(12), "lora-12");
  EXPECT_EQ(TenantName(2), "tenant-2");
}

TEST(WorkloadTest, CapsAdaptersAndTenants) {
  WorkloadOptions o = Options(10, 0);
  o.lora_adapters = kMaxLoraAdapters;
  o.tenants = kMaxTenants;
  EXPECT_TRUE(ValidateWorkload(o).ok());
  o.lora_adapters = kMaxLoraAdapters + 1;
  EXPECT_FALSE(ValidateWorkload(o).ok());
  o.lora_adapters = 1;
  o.tenants = kMaxTenants + 1;
  EXPECT_FALSE(ValidateWorkload(o).ok());
}

}  // namespace
}  // namespace tokenmeter::engine
