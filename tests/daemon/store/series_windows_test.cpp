// SeriesWindows (daemon/store/series_windows.h): a window's increase per
// series, summed over label cells, the marks (Mark(), Restart()) and the
// latency buckets.
#include "daemon/store/series_windows.h"

#include <gtest/gtest.h>

#include <memory>

namespace tokenmeter::daemon {
namespace {

constexpr double kMs = 1e6;

class SeriesWindowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RegistryOptions options;
    options.request_labels = {"tenant"};
    ASSERT_TRUE(Registry::Create(options, &reg_).ok());
    s_ = reg_->GetOrCreate({"vllm", "m", "0", {}});
    ASSERT_NE(s_, nullptr);
  }
  // The values of a request with tenant `tenant`.
  SeriesValues& Tenant(const char* tenant) {
    const uint16_t id = reg_->request_labels().Intern(0, tenant);
    EXPECT_TRUE(s_->Admit(0, id));
    return s_->Cell(RequestLabels::Pack(0, 0, id));
  }
  std::unique_ptr<Registry> reg_;
  EngineSeries* s_ = nullptr;
};

TEST_F(SeriesWindowsTest, FirstWindowCountsFromTheSeriesCreation) {
  s_->Add(kPromptTokens, 10);
  s_->Add(kNumPreemptions, 2);
  s_->Add(kSpecDecodeNumDrafts, 3);
  SeriesWindows w;
  const WindowCounters& d = w.Advance(*s_).increase;
  EXPECT_EQ(d.prompt_tokens, 10u);
  EXPECT_EQ(d.preemptions, 2u);
  EXPECT_EQ(d.spec_drafts, 3u);
  EXPECT_EQ(d.generation_tokens, 0u);
}

TEST_F(SeriesWindowsTest, EachWindowSeesOnlyItsOwnIncrease) {
  SeriesWindows w;
  s_->Add(kGenerationTokens, 100);
  s_->Add(kPrefixCacheQueries, 8);
  s_->Add(kPrefixCacheHits, 2);
  w.Advance(*s_);
  s_->Add(kGenerationTokens, 30);
  s_->Add(kSpecDecodeNumDraftTokens, 4);
  s_->Add(kSpecDecodeNumAcceptedTokens, 1);
  const WindowCounters d = w.Advance(*s_).increase;
  EXPECT_EQ(d.generation_tokens, 30u);
  EXPECT_EQ(d.prefix_queries, 0u);
  EXPECT_EQ(d.prefix_hits, 0u);
  EXPECT_EQ(d.spec_draft_tokens, 4u);
  EXPECT_EQ(d.spec_accepted_tokens, 1u);
  EXPECT_EQ(w.Advance(*s_).increase.generation_tokens, 0u);
}

TEST_F(SeriesWindowsTest, RequestLevelCountersSumTheLabelCells) {
  SeriesWindows w;
  s_->Add(kPromptTokens, 1);
  Tenant("acme").Add(kPromptTokens, 20);
  Tenant("beta").Add(kGenerationTokens, 300);
  const WindowCounters& d = w.Advance(*s_).increase;
  EXPECT_EQ(d.prompt_tokens, 21u);
  EXPECT_EQ(d.generation_tokens, 300u);
}

TEST_F(SeriesWindowsTest, CachedPromptTokensSumTheLabelCells) {
  SeriesWindows w;
  s_->Add(kPromptTokensCached, 1);
  SeriesValues& acme = Tenant("acme");
  acme.Add(kPromptTokensCached, 30);
  EXPECT_EQ(w.Advance(*s_).increase.prompt_tokens_cached, 31u);
  acme.Add(kPromptTokensCached, 4);
  EXPECT_EQ(w.Advance(*s_).increase.prompt_tokens_cached, 4u);
}

TEST_F(SeriesWindowsTest, CellChildSumAddsOneChildOfEveryCell) {
  s_->AddChild(kRequestSuccess, 0, 5);
  SeriesValues& acme = Tenant("acme");
  acme.AddChild(kRequestSuccess, 0, 70);
  acme.AddChild(kRequestSuccess, 3, 2);
  EXPECT_EQ(CellChildSum(*s_, kRequestSuccess, 0), 75u);
  EXPECT_EQ(CellChildSum(*s_, kRequestSuccess, 3), 2u);
  EXPECT_EQ(CellChildSum(*s_, kRequestSuccess, 1), 0u);  // never added
  EXPECT_EQ(CellChildSum(*s_, kRequestSuccess, 9), 0u);  // past the children
}

TEST(WindowCountersTest, RatiosAreZeroWithoutADenominator) {
  WindowCounters d;
  EXPECT_EQ(d.CacheHitRate(), 0.0);
  EXPECT_EQ(d.SpecAcceptLength(), 0.0);
  EXPECT_EQ(d.SpecAcceptRate(), 0.0);
  d.prefix_queries = 8;
  d.prefix_hits = 2;
  d.spec_drafts = 4;
  d.spec_draft_tokens = 12;
  d.spec_accepted_tokens = 6;
  EXPECT_DOUBLE_EQ(d.CacheHitRate(), 0.25);
  EXPECT_DOUBLE_EQ(d.SpecAcceptLength(), 2.5);  // 1 + 6 / 4
  EXPECT_DOUBLE_EQ(d.SpecAcceptRate(), 0.5);
}

TEST_F(SeriesWindowsTest, RestartTakesThePresentTotalsAsTheMark) {
  // A series restored from a snapshot: its totals are not one window's.
  s_->Add(kPromptTokens, 1'000'000);
  Tenant("acme").Add(kGenerationTokens, 5);
  EngineSeries* other = reg_->GetOrCreate({"vllm", "m", "1", {}});
  other->Add(kNumPreemptions, 9);
  SeriesWindows w;
  w.Restart(*reg_);
  s_->Add(kPromptTokens, 7);
  EXPECT_EQ(w.Advance(*s_).increase.prompt_tokens, 7u);
  EXPECT_EQ(w.Advance(*other).increase.preemptions, 0u);
  // Mark() does it for one series.
  other->Add(kNumPreemptions, 1);
  w.Mark(*other);
  other->Add(kNumPreemptions, 2);
  EXPECT_EQ(w.Advance(*other).increase.preemptions, 2u);
  EXPECT_EQ(w.series(), 2u);
}

TEST_F(SeriesWindowsTest, LatencyBucketsOnlyWhenAskedFor) {
  SeriesWindows plain;
  s_->hist(kTimeToFirstToken).Observe(3 * kMs);
  const SeriesWindows::Window& p = plain.Advance(*s_);
  EXPECT_EQ(p.buckets[0], nullptr);

  SeriesWindows w(/*latencies=*/true);
  // TTFT 3 ms twice (one in a label cell), ITL 12 ms, e2e nothing.
  Tenant("acme").hist(kTimeToFirstToken).Observe(3 * kMs);
  s_->hist(kInterTokenLatency).Observe(12 * kMs);
  const SeriesWindows::Window& a = w.Advance(*s_);
  ASSERT_NE(a.buckets[0], nullptr);
  const std::vector<double>& ttft =
      s_->hist(kTimeToFirstToken).layout().bounds();
  ASSERT_EQ(a.buckets[0]->size(), ttft.size() + 1);
  EXPECT_EQ(a.observations[0], 2u);
  EXPECT_EQ(
      (*a.buckets[0])[s_->hist(kTimeToFirstToken).layout().BucketFor(3 * kMs)],
      2u);
  EXPECT_EQ(a.observations[1], 1u);
  EXPECT_EQ(a.observations[2], 0u);
  // The next window: only what came since.
  s_->hist(kE2eRequestLatency).Observe(2e9);
  const SeriesWindows::Window& b = w.Advance(*s_);
  EXPECT_EQ(b.observations[0], 0u);
  EXPECT_EQ(b.observations[2], 1u);
  EXPECT_GT(w.BytesHeld(*s_), ttft.size() * sizeof(uint64_t));
}

TEST_F(SeriesWindowsTest, SglangWindowsFollowItsTokenWeightedItl) {
  EngineSeries* sg =
      reg_->GetOrCreate({"sglang", "m", "0", {}, Profile::kSglang});
  EXPECT_EQ(WindowLatency(*s_, 1), kInterTokenLatency);
  EXPECT_EQ(WindowLatency(*sg, 1), kInterTokenLatencyPerToken);
  EXPECT_EQ(WindowLatency(*sg, 0), kTimeToFirstToken);
  EXPECT_EQ(WindowLatency(*sg, 2), kE2eRequestLatency);
}

TEST_F(SeriesWindowsTest, UnseenSeriesHoldsNothing) {
  SeriesWindows w(true);
  EXPECT_EQ(w.BytesHeld(*s_), 0u);
  EXPECT_EQ(w.series(), 0u);
}

}  // namespace
}  // namespace tokenmeter::daemon
