// The periodic summary line (daemon/logging/summary.cpp).
#include "daemon/logging/summary.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>

#include "daemon/store/parts/admission.h"
#include "daemon/store/parts/moe.h"

namespace tokenmeter::daemon {
namespace {

class SummaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Registry::Create(RegistryOptions{}, &registry_).ok());
    s_ = registry_->GetOrCreate({"vllm", "llama", "dp0", {}});
  }
  std::unique_ptr<Registry> registry_;
  EngineSeries* s_ = nullptr;
  SummaryLog log_;
};

TEST_F(SummaryTest, HasVllmShapeWithWindowRates) {
  s_->Add(kPromptTokens, 1000);
  s_->Add(kGenerationTokens, 250);
  s_->Set(kNumRequestsRunning, 7);
  s_->Set(kNumRequestsWaiting, 2);
  s_->Set(kKvCacheUsagePerc, 0.4567);
  s_->Add(kPrefixCacheQueries, 200);
  s_->Add(kPrefixCacheHits, 50);
  bool idle = true;
  EXPECT_EQ(log_.Line(*s_, 10.0, &idle),
            "engine=dp0 model=llama: Avg prompt throughput: 100.0 tokens/s, "
            "Avg generation throughput: 25.0 tokens/s, Running: 7 reqs, "
            "Waiting: 2 reqs, GPU KV cache usage: 45.7%, Prefix cache hit "
            "rate: 25.0%");
  EXPECT_FALSE(idle);
}

TEST_F(SummaryTest, RatesCoverOnlyTheLastWindow) {
  s_->Add(kGenerationTokens, 100);
  bool idle = false;
  log_.Line(*s_, 10.0, &idle);
  s_->Add(kGenerationTokens, 30);
  const std::string line = log_.Line(*s_, 10.0, &idle);
  EXPECT_NE(line.find("Avg generation throughput: 3.0 tokens/s"),
            std::string::npos)
      << line;
}

TEST_F(SummaryTest, DerivedGaugesWithoutStepData) {
  s_->AddDerived(kNumRequestsRunning, 3);
  s_->AddDerived(kNumRequestsWaiting, 1);
  bool idle = true;
  const std::string line = log_.Line(*s_, 10.0, &idle);
  EXPECT_NE(line.find("Running: 3 reqs, Waiting: 1 reqs"), std::string::npos)
      << line;
  EXPECT_FALSE(idle);
}

TEST_F(SummaryTest, IdleWindowIsReported) {
  bool idle = false;
  log_.Line(*s_, 10.0, &idle);
  EXPECT_TRUE(idle);
}

TEST_F(SummaryTest, SpecDecodeFiguresOnlyWhenPresent) {
  bool idle = false;
  EXPECT_EQ(log_.Line(*s_, 10.0, &idle).find("Spec decode"), std::string::npos);
  s_->Add(kSpecDecodeNumDraftTokens, 100);
  s_->Add(kSpecDecodeNumAcceptedTokens, 60);
  const std::string line = log_.Line(*s_, 10.0, &idle);
  EXPECT_NE(line.find("Draft acceptance rate: 60.0%"), std::string::npos)
      << line;
  EXPECT_NE(line.find("Accepted throughput: 6.0 tokens/s"), std::string::npos)
      << line;
}

TEST_F(SummaryTest, WorstMoeLayerOnlyWithExpertLoad) {
  bool idle = false;
  EXPECT_EQ(log_.Line(*s_, 10.0, &idle).find("MoE"), std::string::npos);
  const uint64_t balanced[] = {2, 2, 2, 2};
  const uint64_t skewed[] = {5, 1, 1, 1};  // max 5, mean 2
  const uint64_t none[] = {0, 0, 0, 0};
  ASSERT_TRUE(
      s_->part<MoePart>().Add(0, std::span<const uint64_t>(balanced, 4), true));
  ASSERT_TRUE(
      s_->part<MoePart>().Add(17, std::span<const uint64_t>(skewed, 4), true));
  ASSERT_TRUE(
      s_->part<MoePart>().Add(30, std::span<const uint64_t>(none, 4), true));
  const std::string line = log_.Line(*s_, 10.0, &idle);
  EXPECT_NE(line.find(", MoE worst layer imbalance: 2.50 (layer 17)"),
            std::string::npos)
      << line;
}

void Reject(EngineSeries* s, std::string_view reason, int n) {
  for (int i = 0; i < n; ++i) s->part<AdmissionPart>().Reject(reason);
}

TEST_F(SummaryTest, RejectionsOnlyInAWindowWithSome) {
  bool idle = false;
  EXPECT_EQ(log_.Line(*s_, 10.0, &idle).find("Rejected"), std::string::npos);
  Reject(s_, "token_cap", 2);
  Reject(s_, "queue_full", 10);
  // Nothing else happened, but rejections are not idleness.
  idle = true;
  EXPECT_EQ(log_.Line(*s_, 10.0, &idle),
            "engine=dp0 model=llama: Avg prompt throughput: 0.0 tokens/s, "
            "Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, "
            "Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit "
            "rate: 0.0%, Rejected: 1.2 reqs/s (queue_full 10, token_cap 2)");
  EXPECT_FALSE(idle);
  // The next window has none: no figure, and the series is idle again.
  std::string line = log_.Line(*s_, 10.0, &idle);
  EXPECT_EQ(line.find("Rejected"), std::string::npos) << line;
  EXPECT_TRUE(idle);
  // Then only this window's, counted from where the last one ended.
  Reject(s_, "token_cap", 5);
  line = log_.Line(*s_, 5.0, &idle);
  EXPECT_NE(line.find(", Rejected: 1.0 reqs/s (token_cap 5)"),
            std::string::npos)
      << line;
}

TEST_F(SummaryTest, RejectionsNameTheLargestReasonsAndSumTheRest) {
  bool idle = false;
  Reject(s_, "a", 1);
  Reject(s_, "b", 4);
  Reject(s_, "c", 1);
  Reject(s_, "d", 4);
  Reject(s_, "e", 2);
  // Most first, ties in first-come order; the two smallest summed.
  const std::string line = log_.Line(*s_, 10.0, &idle);
  EXPECT_NE(line.find(", Rejected: 1.2 reqs/s (b 4, d 4, e 2, other reasons "
                      "2)"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.back(), ')') << line;
}

TEST_F(SummaryTest, RejectionsPastTheReasonCapShowAsOther) {
  bool idle = false;
  for (size_t i = 0; i < ReasonCounts::kMaxReasons; ++i) {
    Reject(s_, "r" + std::to_string(i), 1);
  }
  log_.Line(*s_, 10.0, &idle);
  Reject(s_, "late", 3);  // the 17th reason
  Reject(s_, "r7", 1);
  const std::string line = log_.Line(*s_, 10.0, &idle);
  EXPECT_NE(line.find(", Rejected: 0.4 reqs/s (__other__ 3, r7 1)"),
            std::string::npos)
      << line;
}

// A registry with the request label `tenant`, and the label cell of
// tenant "acme" in its series of profile `p`.
struct Tenanted {
  explicit Tenanted(Profile p) {
    RegistryOptions options;
    options.request_labels = {"tenant"};
    EXPECT_TRUE(Registry::Create(options, &reg).ok());
    s = reg->GetOrCreate({std::string(ProfileName(p)), "llama", "dp0", {}, p});
    const uint16_t acme = reg->request_labels().Intern(0, "acme");
    EXPECT_TRUE(s->Admit(0, acme));
    cell = &s->Cell(RequestLabels::Pack(0, 0, acme));
  }
  std::unique_ptr<Registry> reg;
  EngineSeries* s = nullptr;
  SeriesValues* cell = nullptr;
};

TEST(SummaryLogTest, CountsTheTokensOfRequestsWithPerRequestLabels) {
  // Request labels split the request-level counters into label cells; the
  // line is per series and counts them all.
  Tenanted t(Profile::kVllm);
  EngineSeries* s = t.s;
  SeriesValues& cell = *t.cell;
  s->Add(kPromptTokens, 100);
  cell.Add(kPromptTokens, 900);
  cell.Add(kGenerationTokens, 50);
  SummaryLog log;
  bool idle = true;
  const std::string line = log.Line(*s, 10.0, &idle);
  EXPECT_NE(line.find("Avg prompt throughput: 100.0 tokens/s, Avg "
                      "generation throughput: 5.0 tokens/s"),
            std::string::npos)
      << line;
  EXPECT_FALSE(idle);
}

TEST(SummaryLogTest, RestartStartsTheWindowAtTheRestoredTotals) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* s = reg->GetOrCreate({"vllm", "llama", "dp0", {}});
  s->Add(kGenerationTokens, 1'000'000);  // restored
  Reject(s, "queue_full", 5000);         // restored
  SummaryLog log;
  log.Restart(*reg);
  s->Add(kGenerationTokens, 20);
  Reject(s, "queue_full", 3);
  bool idle = true;
  const std::string line = log.Line(*s, 10.0, &idle);
  EXPECT_NE(line.find("Avg generation throughput: 2.0 tokens/s"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find(", Rejected: 0.3 reqs/s (queue_full 3)"),
            std::string::npos)
      << line;
}

// The sglang and lmdeploy profiles: the same window in their engine's
// wording (docs/operations.md, "The summary line").
class ProfileSummaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Registry::Create(RegistryOptions{}, &registry_).ok());
    sglang_ = registry_->GetOrCreate(
        {"sglang", "llama", "dp0", {}, Profile::kSglang});
    lmdeploy_ = registry_->GetOrCreate(
        {"lmdeploy", "llama", "dp0", {}, Profile::kLmdeploy});
  }
  // One window's traffic, the same for every profile.
  static void Traffic(EngineSeries* s) {
    s->Add(kPromptTokens, 1000);
    s->AddChild(kPromptTokensBySource, kLocalCompute, 800);
    s->AddChild(kPromptTokensBySource, kLocalCacheHit, 150);
    s->AddChild(kPromptTokensBySource, kExternalKv, 50);
    s->Add(kPromptTokensCached, 200);
    s->Add(kGenerationTokens, 2505);
    s->Set(kNumRequestsRunning, 7);
    s->Set(kNumRequestsWaiting, 2);
    s->Set(kKvCacheUsagePerc, 0.4567);
    s->Add(kPrefixCacheQueries, 200);
    s->Add(kPrefixCacheHits, 50);
  }
  std::unique_ptr<Registry> registry_;
  EngineSeries* sglang_ = nullptr;
  EngineSeries* lmdeploy_ = nullptr;
  SummaryLog log_;
};

TEST_F(ProfileSummaryTest, SglangLineInSglangWords) {
  Traffic(sglang_);
  bool idle = true;
  EXPECT_EQ(log_.Line(*sglang_, 10.0, &idle),
            "engine=dp0 model=llama: #running-req: 7, token usage: 0.46, gen "
            "throughput (token/s): 250.50, #queue-req: 2, #new-token: 800, "
            "#cached-token: 200, input throughput (token/s): 80.00");
  EXPECT_FALSE(idle);
  // The next window: the gauges stay, the window's figures start again.
  sglang_->Add(kGenerationTokens, 10);
  EXPECT_EQ(log_.Line(*sglang_, 5.0, &idle),
            "engine=dp0 model=llama: #running-req: 7, token usage: 0.46, gen "
            "throughput (token/s): 2.00, #queue-req: 2, #new-token: 0, "
            "#cached-token: 0, input throughput (token/s): 0.00");
}

TEST_F(ProfileSummaryTest, SglangTakesPromptTokensWithoutCachedOnesAsComputed) {
  // An engine that reports no cached tokens (no SCHEDULED info, or only
  // the prompt count of protocol 1.3's LATENCIES): all computed.
  sglang_->Add(kPromptTokens, 640);
  bool idle = false;
  const std::string line = log_.Line(*sglang_, 10.0, &idle);
  EXPECT_NE(line.find(", #new-token: 640, #cached-token: 0, input throughput "
                      "(token/s): 64.00"),
            std::string::npos)
      << line;
}

TEST_F(ProfileSummaryTest, SglangSpecDecodeWhereSglangPutsIt) {
  bool idle = false;
  EXPECT_EQ(log_.Line(*sglang_, 10.0, &idle).find("accept"), std::string::npos);
  sglang_->Add(kSpecDecodeNumDrafts, 10);
  sglang_->Add(kSpecDecodeNumDraftTokens, 40);
  sglang_->Add(kSpecDecodeNumAcceptedTokens, 24);
  const std::string line = log_.Line(*sglang_, 10.0, &idle);
  // 1 + 24 / 10 tokens a round with the bonus token; 24 / 40 drafts.
  EXPECT_NE(line.find(": #running-req: 0, token usage: 0.00, accept len: "
                      "3.40, accept rate: 0.60, gen throughput (token/s): "),
            std::string::npos)
      << line;
}

TEST_F(ProfileSummaryTest, LmdeployLineInLmdeployWords) {
  Traffic(lmdeploy_);
  lmdeploy_->AddChild(kRequestSuccess, 0, 5);  // stop
  lmdeploy_->AddChild(kRequestSuccess, 1, 2);  // length
  lmdeploy_->AddChild(kRequestSuccess, 2, 1);  // abort
  lmdeploy_->AddChild(kRequestSuccess, 3, 1);  // error
  bool idle = true;
  EXPECT_EQ(log_.Line(*lmdeploy_, 10.0, &idle),
            "engine=dp0 model=llama: Avg thr (in/out): 100.0 / 250.5 "
            "tokens/s, Server (succeeded/failed): 7 / 2, Engine "
            "(running/waiting): 7 / 2, KV cache: 45.7%, Prefix cache hit "
            "rate: 25.0%");
  EXPECT_FALSE(idle);
  // The request counts and the hit rate are totals, as LMDeploy's are;
  // the throughputs cover the window.
  lmdeploy_->AddChild(kRequestSuccess, 0, 1);
  lmdeploy_->Add(kPrefixCacheQueries, 200);
  EXPECT_EQ(log_.Line(*lmdeploy_, 10.0, &idle),
            "engine=dp0 model=llama: Avg thr (in/out): 0.0 / 0.0 tokens/s, "
            "Server (succeeded/failed): 8 / 2, Engine (running/waiting): 7 / "
            "2, KV cache: 45.7%, Prefix cache hit rate: 12.5%");
}

TEST_F(ProfileSummaryTest, LmdeployHitRateOnlyWhenNotZero) {
  lmdeploy_->Add(kPrefixCacheQueries, 100);
  bool idle = false;
  const std::string line = log_.Line(*lmdeploy_, 10.0, &idle);
  EXPECT_EQ(line,
            "engine=dp0 model=llama: Avg thr (in/out): 0.0 / 0.0 tokens/s, "
            "Server (succeeded/failed): 0 / 0, Engine (running/waiting): 0 / "
            "0, KV cache: 0.0%");
}

TEST_F(ProfileSummaryTest, LmdeployCountsRequestsOfEveryLabelCell) {
  Tenanted t(Profile::kLmdeploy);
  EngineSeries* s = t.s;
  SeriesValues& cell = *t.cell;
  s->AddChild(kRequestSuccess, 0, 1);
  cell.AddChild(kRequestSuccess, 0, 3);
  cell.AddChild(kRequestSuccess, 3, 4);
  bool idle = false;
  const std::string line = log_.Line(*s, 10.0, &idle);
  EXPECT_NE(line.find("Server (succeeded/failed): 4 / 4,"), std::string::npos)
      << line;
}

TEST_F(ProfileSummaryTest, LmdeploySpecDecodingPerWindowWithPositions) {
  bool idle = false;
  EXPECT_EQ(log_.Line(*lmdeploy_, 10.0, &idle).find("SpecDecoding"),
            std::string::npos);
  lmdeploy_->Add(kSpecDecodeNumDrafts, 10);
  lmdeploy_->Add(kSpecDecodeNumDraftTokens, 30);
  lmdeploy_->Add(kSpecDecodeNumAcceptedTokens, 18);
  lmdeploy_->AddChild(kSpecDecodeNumAcceptedTokensPerPos, 0, 8);
  lmdeploy_->AddChild(kSpecDecodeNumAcceptedTokensPerPos, 1, 6);
  lmdeploy_->AddChild(kSpecDecodeNumAcceptedTokensPerPos, 2, 4);
  std::string line = log_.Line(*lmdeploy_, 10.0, &idle);
  EXPECT_NE(line.find("KV cache: 0.0%, SpecDecoding metrics: Draft "
                      "acceptance rate: 60.00%, Mean acceptance length: "
                      "2.80, Accepted: 18 tokens, Drafted: 30 tokens, "
                      "Per-position acceptance rate: 0.800, 0.600, 0.400"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.back(), '0') << line;
  // The next window counts only its own drafts, per position too.
  lmdeploy_->Add(kSpecDecodeNumDrafts, 5);
  lmdeploy_->Add(kSpecDecodeNumDraftTokens, 15);
  lmdeploy_->Add(kSpecDecodeNumAcceptedTokens, 6);
  lmdeploy_->AddChild(kSpecDecodeNumAcceptedTokensPerPos, 0, 4);
  lmdeploy_->AddChild(kSpecDecodeNumAcceptedTokensPerPos, 1, 2);
  line = log_.Line(*lmdeploy_, 10.0, &idle);
  EXPECT_NE(line.find("SpecDecoding metrics: Draft acceptance rate: 40.00%, "
                      "Mean acceptance length: 2.20, Accepted: 6 tokens, "
                      "Drafted: 15 tokens, Per-position acceptance rate: "
                      "0.800, 0.400, 0.000"),
            std::string::npos)
      << line;
  // No drafts in a window: no figures.
  line = log_.Line(*lmdeploy_, 10.0, &idle);
  EXPECT_EQ(line.find("SpecDecoding"), std::string::npos) << line;
}

TEST_F(ProfileSummaryTest, RestartStartsLmdeployPositionsAtTheRestore) {
  lmdeploy_->AddChild(kSpecDecodeNumAcceptedTokensPerPos, 0, 1000);  // restored
  lmdeploy_->Add(kSpecDecodeNumDrafts, 2000);                        // restored
  log_.Restart(*registry_);
  lmdeploy_->Add(kSpecDecodeNumDrafts, 4);
  lmdeploy_->Add(kSpecDecodeNumDraftTokens, 4);
  lmdeploy_->Add(kSpecDecodeNumAcceptedTokens, 2);
  lmdeploy_->AddChild(kSpecDecodeNumAcceptedTokensPerPos, 0, 2);
  bool idle = false;
  const std::string line = log_.Line(*lmdeploy_, 10.0, &idle);
  EXPECT_NE(line.find("Mean acceptance length: 1.50, Accepted: 2 tokens, "
                      "Drafted: 4 tokens, Per-position acceptance rate: "
                      "0.500"),
            std::string::npos)
      << line;
}

TEST_F(ProfileSummaryTest, TailsFollowEveryProfilesFigures) {
  const uint64_t skewed[] = {5, 1, 1, 1};
  for (EngineSeries* s : {sglang_, lmdeploy_}) {
    ASSERT_TRUE(
        s->part<MoePart>().Add(3, std::span<const uint64_t>(skewed, 4), true));
    Reject(s, "queue_full", 4);
  }
  bool idle = true;
  EXPECT_EQ(log_.Line(*sglang_, 10.0, &idle),
            "engine=dp0 model=llama: #running-req: 0, token usage: 0.00, gen "
            "throughput (token/s): 0.00, #queue-req: 0, #new-token: 0, "
            "#cached-token: 0, input throughput (token/s): 0.00, MoE worst "
            "layer imbalance: 2.50 (layer 3), Rejected: 0.4 reqs/s "
            "(queue_full 4)");
  EXPECT_FALSE(idle);
  idle = true;
  EXPECT_EQ(log_.Line(*lmdeploy_, 10.0, &idle),
            "engine=dp0 model=llama: Avg thr (in/out): 0.0 / 0.0 tokens/s, "
            "Server (succeeded/failed): 0 / 0, Engine (running/waiting): 0 / "
            "0, KV cache: 0.0%, MoE worst layer imbalance: 2.50 (layer 3), "
            "Rejected: 0.4 reqs/s (queue_full 4)");
  EXPECT_FALSE(idle);
}

TEST_F(ProfileSummaryTest, TheVllmLineOfTheSameWindowIsUnchanged) {
  EngineSeries* vllm = registry_->GetOrCreate({"vllm", "llama", "dp0", {}});
  Traffic(vllm);
  bool idle = true;
  EXPECT_EQ(log_.Line(*vllm, 10.0, &idle),
            "engine=dp0 model=llama: Avg prompt throughput: 100.0 tokens/s, "
            "Avg generation throughput: 250.5 tokens/s, Running: 7 reqs, "
            "Waiting: 2 reqs, GPU KV cache usage: 45.7%, Prefix cache hit "
            "rate: 25.0%");
}

}  // namespace
}  // namespace tokenmeter::daemon
