// TickLog: each request's ticks found through its chain among others',
// the newest kept when the ring has moved past the older ones, the tokens
// of what one Collect returns, its cap, and the budget.
#include "daemon/ingest/tick_log.h"

#include <gtest/gtest.h>

#include <vector>

namespace tokenmeter::daemon {
namespace {

std::vector<uint64_t> Times(const std::vector<trace::TokenTick>& ticks) {
  std::vector<uint64_t> t;
  for (const auto& k : ticks) t.push_back(k.t_ns);
  return t;
}

TEST(TickLogTest, InterleavedRequestsKeepTheirOwnTicks) {
  TickLog log;
  log.Enable();
  uint64_t a = 0, b = 0, c = 0;
  log.Append(a, 10, 1);
  log.Append(b, 11, 2);
  log.Append(a, 12, 3);
  log.Append(b, 13, 4);
  log.Append(a, 14, 5);
  std::vector<trace::TokenTick> ta, tb, tc;
  EXPECT_EQ(log.Collect(a, 4096, &ta), 1u + 3 + 5);  // their tokens
  EXPECT_EQ(log.Collect(b, 4096, &tb), 2u + 4);
  EXPECT_EQ(log.Collect(c, 4096, &tc), 0u);
  EXPECT_EQ(Times(ta), (std::vector<uint64_t>{10, 12, 14}));
  EXPECT_EQ(Times(tb), (std::vector<uint64_t>{11, 13}));
  EXPECT_EQ(ta[2].n, 5u);
  EXPECT_EQ(tb[0].n, 2u);
  EXPECT_TRUE(tc.empty());
}

TEST(TickLogTest, CollectKeepsTheNewestUpToMax) {
  TickLog log;
  log.Enable();
  uint64_t a = 0;
  for (uint64_t i = 0; i < 10; ++i) log.Append(a, 100 + i, 1);
  std::vector<trace::TokenTick> t;
  EXPECT_EQ(log.Collect(a, 4, &t), 4u);
  EXPECT_EQ(Times(t), (std::vector<uint64_t>{106, 107, 108, 109}));
}

// Request `a` ticks once, then others fill the ring past its tick, then it
// ticks again: only the newest survives.
TEST(TickLogTest, TicksTheRingMovedPastAreGone) {
  TickLog log;
  log.Enable();
  uint64_t a = 0, other = 0;
  log.Append(a, 1, 1);
  for (uint64_t i = 0; i < TickLog::kCapacity; ++i) {
    if (i % TickLog::kTicksPerRefill == 0) log.Refill();
    log.Append(other, 2, 1);
  }
  std::vector<trace::TokenTick> t;
  EXPECT_EQ(log.Collect(a, 4096, &t), 0u);
  EXPECT_TRUE(t.empty());  // overwritten
  log.Append(a, 3, 7);
  EXPECT_EQ(log.Collect(a, 4096, &t), 7u);
  EXPECT_EQ(Times(t), (std::vector<uint64_t>{3}));
  EXPECT_EQ(t[0].n, 7u);
  // `other`: its newest ticks, at most the ring's worth.
  t.clear();
  EXPECT_EQ(log.Collect(other, TickLog::kCapacity + 5, &t),
            TickLog::kCapacity - 1);  // one slot now a's
  EXPECT_EQ(t.size(), TickLog::kCapacity - 1);
}

// Nothing is written before Enable(); past the budget writing() is false
// (the caller skips the tick); a refill writes again, and the chain links
// the written ticks only.
TEST(TickLogTest, TheBudgetStopsWritingUntilARefill) {
  TickLog log;
  EXPECT_FALSE(log.writing());
  log.Refill();
  EXPECT_FALSE(log.writing());  // not enabled
  log.Enable();
  uint64_t a = 0, b = 0;
  for (uint64_t i = 0; i < TickLog::kTicksPerRefill - 1; ++i) {
    ASSERT_TRUE(log.writing());
    log.Append(b, 1, 1);
  }
  ASSERT_TRUE(log.writing());
  log.Append(a, 10, 1);  // the budget's last
  EXPECT_FALSE(log.writing());
  log.Refill();
  ASSERT_TRUE(log.writing());
  log.Append(a, 13, 2);
  std::vector<trace::TokenTick> t;
  EXPECT_EQ(log.Collect(a, 10, &t), 3u);
  EXPECT_EQ(Times(t), (std::vector<uint64_t>{10, 13}));
}

TEST(TickLogTest, LargeCountsClampAndAppendToWhatIsThere) {
  TickLog log;
  log.Enable();
  uint64_t a = 0;
  log.Append(a, 5, uint64_t{1} << 40);
  std::vector<trace::TokenTick> t = {{1, 1}};
  EXPECT_EQ(log.Collect(a, 10, &t), UINT32_MAX);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[1].n, UINT32_MAX);
  EXPECT_EQ(t[1].t_ns, 5u);
}

}  // namespace
}  // namespace tokenmeter::daemon
