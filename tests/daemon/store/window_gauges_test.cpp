// WindowGauges (SGLang's gen_throughput, cache_hit_rate, spec_accept_length
// and spec_accept_rate): each window's gauges from the counters' increase
// over it, set exactly, for the series whose profile shows them.
#include "daemon/store/window_gauges.h"

#include <gtest/gtest.h>

#include <memory>

#include "daemon/store/registry.h"
#include "daemon/store/request_labels.h"

namespace tokenmeter::daemon {
namespace {

struct Window {
  double gen_throughput;
  double cache_hit_rate;
  double spec_accept_length;
  double spec_accept_rate;
};

void ExpectWindow(const EngineSeries& s, const Window& w) {
  EXPECT_EQ(s.gauge(kWindowGenerationThroughput).value(), w.gen_throughput);
  EXPECT_EQ(s.gauge(kWindowCacheHitRate).value(), w.cache_hit_rate);
  EXPECT_EQ(s.gauge(kWindowSpecAcceptLength).value(), w.spec_accept_length);
  EXPECT_EQ(s.gauge(kWindowSpecAcceptRate).value(), w.spec_accept_rate);
}

// Counter increases of one window.
void Add(EngineSeries& s, uint64_t tokens, uint64_t queries, uint64_t hits,
         uint64_t drafts, uint64_t draft_tokens, uint64_t accepted) {
  s.Add(kGenerationTokens, tokens);
  s.Add(kPrefixCacheQueries, queries);
  s.Add(kPrefixCacheHits, hits);
  s.Add(kSpecDecodeNumDrafts, drafts);
  s.Add(kSpecDecodeNumDraftTokens, draft_tokens);
  s.Add(kSpecDecodeNumAcceptedTokens, accepted);
}

TEST(WindowGaugesTest, SetsEachWindowFromItsIncrease) {
  RegistryOptions options;
  options.request_labels = {"tenant"};
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(options, &reg).ok());
  EngineSeries* s =
      reg->GetOrCreate({"sglang", "m", "0", {}, Profile::kSglang});
  WindowGauges w;
  // Before any window: 0.
  ExpectWindow(*s, {0, 0, 0, 0});
  Add(*s, 500, 200, 50, 10, 40, 30);
  // Generation tokens of requests with per-request labels count too.
  const uint16_t id = reg->request_labels().Intern(0, "acme");
  ASSERT_TRUE(s->Admit(0, id));
  s->Cell(RequestLabels::Pack(0, 0, id)).Add(kGenerationTokens, 500);
  w.Update(*reg, 10);
  ExpectWindow(*s, {100, 0.25, 4, 0.75});
  // The next window sees only its own increase.
  Add(*s, 60, 100, 100, 4, 8, 2);
  w.Update(*reg, 4);
  ExpectWindow(*s, {15, 1, 1.5, 0.25});
  // A window with nothing: 0 for each.
  w.Update(*reg, 10);
  ExpectWindow(*s, {0, 0, 0, 0});
  // No window length: nothing changes.
  Add(*s, 10, 10, 10, 1, 1, 1);
  w.Update(*reg, 0);
  ExpectWindow(*s, {0, 0, 0, 0});
  w.Update(*reg, 2);
  ExpectWindow(*s, {5, 1, 2, 1});
}

TEST(WindowGaugesTest, LeavesSeriesOfOtherProfilesAlone) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* v = reg->GetOrCreate({"vllm", "m", "0", {}, Profile::kVllm});
  EngineSeries* l =
      reg->GetOrCreate({"lmdeploy", "m", "0", {}, Profile::kLmdeploy});
  EngineSeries* s =
      reg->GetOrCreate({"sglang", "m", "0", {}, Profile::kSglang});
  for (EngineSeries* e : {v, l, s}) Add(*e, 100, 10, 5, 1, 2, 1);
  WindowGauges w;
  w.Update(*reg, 10);
  EXPECT_FALSE(v->gauge(kWindowGenerationThroughput).has_set);
  EXPECT_FALSE(l->gauge(kWindowCacheHitRate).has_set);
  ExpectWindow(*s, {10, 0.5, 2, 0.5});
}

}  // namespace
}  // namespace tokenmeter::daemon
