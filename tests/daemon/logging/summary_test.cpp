// The periodic summary line (daemon/logging/summary.cpp).
#include "daemon/logging/summary.h"

#include <gtest/gtest.h>

#include <memory>

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
};

TEST_F(SummaryTest, HasVllmShapeWithWindowRates) {
  s_->prompt_tokens = 1000;
  s_->generation_tokens = 250;
  s_->has_step_running = true;
  s_->step_running = 7;
  s_->has_step_waiting = true;
  s_->step_waiting = 2;
  s_->kv_usage = 0.4567;
  s_->prefix_queries = 200;
  s_->prefix_hits = 50;
  bool idle = true;
  EXPECT_EQ(SummaryLine(*s_, 10.0, &idle),
            "engine=dp0 model=llama: Avg prompt throughput: 100.0 tokens/s, "
            "Avg generation throughput: 25.0 tokens/s, Running: 7 reqs, "
            "Waiting: 2 reqs, GPU KV cache usage: 45.7%, Prefix cache hit "
            "rate: 25.0%");
  EXPECT_FALSE(idle);
}

TEST_F(SummaryTest, RatesCoverOnlyTheLastWindow) {
  s_->generation_tokens = 100;
  bool idle = false;
  SummaryLine(*s_, 10.0, &idle);
  s_->generation_tokens = 130;
  const std::string line = SummaryLine(*s_, 10.0, &idle);
  EXPECT_NE(line.find("Avg generation throughput: 3.0 tokens/s"),
            std::string::npos)
      << line;
}

TEST_F(SummaryTest, DerivedGaugesWithoutStepData) {
  s_->derived_running = 3;
  s_->derived_waiting = 1;
  bool idle = true;
  const std::string line = SummaryLine(*s_, 10.0, &idle);
  EXPECT_NE(line.find("Running: 3 reqs, Waiting: 1 reqs"), std::string::npos)
      << line;
  EXPECT_FALSE(idle);
}

TEST_F(SummaryTest, IdleWindowIsReported) {
  bool idle = false;
  SummaryLine(*s_, 10.0, &idle);
  EXPECT_TRUE(idle);
}

TEST_F(SummaryTest, SpecDecodeFiguresOnlyWhenPresent) {
  bool idle = false;
  EXPECT_EQ(SummaryLine(*s_, 10.0, &idle).find("Spec decode"),
            std::string::npos);
  s_->spec_draft_tokens = 100;
  s_->spec_accepted_tokens = 60;
  const std::string line = SummaryLine(*s_, 10.0, &idle);
  EXPECT_NE(line.find("Draft acceptance rate: 60.0%"), std::string::npos)
      << line;
  EXPECT_NE(line.find("Accepted throughput: 6.0 tokens/s"), std::string::npos)
      << line;
}

}  // namespace
}  // namespace tokenmeter::daemon
