// TickLog: each request's ticks found through its chain among others',
// the newest kept when the ring has moved past the older ones, counts, and
// the cap on what one Collect returns.
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
  EXPECT_EQ(log.Collect(a, 4096, &ta), 3u);
  EXPECT_EQ(log.Collect(b, 4096, &tb), 2u);
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
  EXPECT_EQ(log.Collect(a, 4, &t), 10u);
  EXPECT_EQ(Times(t), (std::vector<uint64_t>{106, 107, 108, 109}));
}

// Request `a` ticks once, then others fill the ring past its tick, then it
// ticks again: only the newest survives, the count says two.
TEST(TickLogTest, TicksTheRingMovedPastAreGoneButCounted) {
  TickLog log;
  log.Enable();
  uint64_t a = 0, other = 0;
  log.Append(a, 1, 1);
  for (uint64_t i = 0; i < TickLog::kCapacity; ++i) {
    if (i % TickLog::kTicksPerRefill == 0) log.Refill();
    log.Append(other, 2, 1);
  }
  std::vector<trace::TokenTick> t;
  EXPECT_EQ(log.Collect(a, 4096, &t), 1u);
  EXPECT_TRUE(t.empty());  // overwritten
  log.Append(a, 3, 7);
  EXPECT_EQ(log.Collect(a, 4096, &t), 2u);
  EXPECT_EQ(Times(t), (std::vector<uint64_t>{3}));
  EXPECT_EQ(t[0].n, 7u);
  // `other`: its newest ticks, at most the ring's worth.
  t.clear();
  EXPECT_EQ(log.Collect(other, TickLog::kCapacity + 5, &t), TickLog::kCapacity);
  EXPECT_EQ(t.size(), TickLog::kCapacity - 1);  // one slot now a's
}

// Past the budget a tick is only counted; a refill writes again, and the
// chain skips the counted ones.
TEST(TickLogTest, TicksPastTheBudgetAreCountedNotWritten) {
  TickLog log;
  log.Enable();
  uint64_t a = 0, b = 0;
  for (uint64_t i = 0; i < TickLog::kTicksPerRefill - 1; ++i) {
    log.Append(b, 1, 1);
  }
  log.Append(a, 10, 1);  // the budget's last
  log.Append(a, 11, 1);  // counted only
  uint64_t c = 0;
  log.Append(c, 12, 1);  // counted only: c has no tick written
  std::vector<trace::TokenTick> t;
  EXPECT_EQ(log.Collect(c, 10, &t), 1u);
  EXPECT_TRUE(t.empty());
  log.Refill();
  log.Append(a, 13, 1);
  log.Append(c, 14, 1);
  EXPECT_EQ(log.Collect(a, 10, &t), 3u);
  EXPECT_EQ(Times(t), (std::vector<uint64_t>{10, 13}));
  t.clear();
  EXPECT_EQ(log.Collect(c, 10, &t), 2u);
  EXPECT_EQ(Times(t), (std::vector<uint64_t>{14}));
}

TEST(TickLogTest, LargeCountsClampAndAppendToWhatIsThere) {
  TickLog log;
  log.Enable();
  uint64_t a = 0;
  log.Append(a, 5, uint64_t{1} << 40);
  std::vector<trace::TokenTick> t = {{1, 1}};
  EXPECT_EQ(log.Collect(a, 10, &t), 1u);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[1].n, UINT32_MAX);
  EXPECT_EQ(t[1].t_ns, 5u);
}

}  // namespace
}  // namespace tokenmeter::daemon
