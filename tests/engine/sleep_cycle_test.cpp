#include "engine/sleep_cycle.h"

#include <gtest/gtest.h>

namespace tokenmeter::engine {
namespace {

using Action = SleepCycle::Action;
using Phase = SleepCycle::Phase;

TEST(SleepCycleTest, OffNeverActs) {
  SleepCycle c;
  EXPECT_EQ(c.Poll(0, false), Action::kNone);
  EXPECT_EQ(c.Poll(UINT64_MAX, false), Action::kNone);
  EXPECT_FALSE(c.paused());
  EXPECT_FALSE(c.asleep());
  EXPECT_EQ(c.next_deadline_ns(), 0u);
  EXPECT_EQ(c.phase(), Phase::kOff);
}

TEST(SleepCycleTest, SleepsAtItsTimeAndWakesAfterTheDelay) {
  SleepCycle c(1000, 500, 300);
  EXPECT_EQ(c.next_deadline_ns(), 1500u);
  EXPECT_EQ(c.Poll(1499, false), Action::kNone);
  EXPECT_FALSE(c.paused());
  EXPECT_EQ(c.Poll(1500, false), Action::kSleep);
  EXPECT_TRUE(c.paused());
  EXPECT_TRUE(c.asleep());
  EXPECT_EQ(c.slept_ns(), 1500u);
  EXPECT_EQ(c.next_deadline_ns(), 1800u);
  EXPECT_EQ(c.Poll(1799, false), Action::kNone);
  EXPECT_EQ(c.Poll(1800, false), Action::kWake);
  EXPECT_EQ(c.woke_ns(), 1800u);
  EXPECT_FALSE(c.paused());
  EXPECT_FALSE(c.asleep());
  EXPECT_EQ(c.phase(), Phase::kWoken);
  // One cycle per run.
  EXPECT_EQ(c.Poll(1'000'000, false), Action::kNone);
  EXPECT_EQ(c.next_deadline_ns(), 0u);
}

TEST(SleepCycleTest, WaitsForThePullsInFlightAndWakesFromTheSleep) {
  SleepCycle c(0, 100, 50);
  EXPECT_EQ(c.Poll(150, true), Action::kNone);
  EXPECT_EQ(c.phase(), Phase::kPausing);
  EXPECT_TRUE(c.paused());              // admits nobody ...
  EXPECT_FALSE(c.asleep());             // ... but what runs keeps running
  EXPECT_EQ(c.next_deadline_ns(), 0u);  // waits for the pulls, not a time
  EXPECT_EQ(c.Poll(400, true), Action::kNone);
  EXPECT_EQ(c.Poll(410, false), Action::kSleep);
  EXPECT_EQ(c.next_deadline_ns(), 460u);  // the delay counts from the sleep
  EXPECT_EQ(c.Poll(459, true), Action::kNone);
  EXPECT_EQ(c.Poll(460, true), Action::kWake);
}

// The sleep's work (preempting, releasing the cache) takes time: the wake
// counts from when the engine says it fell asleep, never earlier.
TEST(SleepCycleTest, WakeCountsFromTheReportedSleep) {
  SleepCycle c(0, 100, 50);
  EXPECT_EQ(c.Poll(100, false), Action::kSleep);
  c.AsleepSince(107);
  EXPECT_EQ(c.slept_ns(), 107u);
  EXPECT_EQ(c.next_deadline_ns(), 157u);
  EXPECT_EQ(c.Poll(156, false), Action::kNone);
  c.AsleepSince(90);  // never back
  EXPECT_EQ(c.next_deadline_ns(), 157u);
  EXPECT_EQ(c.Poll(157, false), Action::kWake);
  c.AsleepSince(200);  // awake: no effect
  EXPECT_EQ(c.slept_ns(), 107u);
}

TEST(SleepCycleTest, ZeroDelaysSleepAndWakeAtOnce) {
  SleepCycle c(7, 0, 0);
  EXPECT_EQ(c.Poll(7, false), Action::kSleep);
  EXPECT_EQ(c.Poll(7, false), Action::kWake);
  EXPECT_EQ(c.Poll(7, false), Action::kNone);
}

}  // namespace
}  // namespace tokenmeter::engine
