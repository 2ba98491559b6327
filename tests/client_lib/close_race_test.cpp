// tm_client_close() against other threads' calls (issue 13, item 4): calls
// after the close are refused and counted, calls racing it are either sent
// or refused (never lost, never a use of freed memory), and the handle stays
// readable as a tombstone. Run under TSan and ASan in CI (scripts/test.sh).
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "client_fixture.h"
#include "protocol_checks.h"
#include "test_server.h"
#include "tokenmeter/tokenmeter.h"

namespace tokenmeter::testing {
namespace {

using CloseRaceTest = ClientFixture;

StatsArray StatsOf(const tm_client* c) {
  StatsArray s{};
  EXPECT_EQ(tm_client_stats(c, s.data(), s.size()), TM_OK);
  return s;
}

TEST_F(CloseRaceTest, CallsAfterCloseReturnClosedAndCountAsRejected) {
  StartServer();
  NewClient();
  tm_client* c = client_;
  ASSERT_EQ(tm_tokens(c, 0, 1, 1), TM_OK);
  ASSERT_EQ(tm_tokens(c, 0, 2, 1), TM_OK);
  StatsArray at_close{};
  ASSERT_EQ(CloseClient(&at_close), TM_OK);
  EXPECT_EQ(at_close[TM_STAT_EVENTS_SENT], 2u);
  EXPECT_EQ(at_close[TM_STAT_EVENTS_REJECTED], 0u);

  // Every event function, from a thread that had a ring ...
  const uint64_t rids[3] = {1, 2, 3};
  const tm_step_key keys[1] = {TM_STEP_KEY_RUNNING};
  const double values[1] = {1};
  EXPECT_EQ(tm_arrived(c, 0, 9, 10, 0, 0), TM_E_CLOSED);
  EXPECT_EQ(tm_arrived_str(c, 0, "r", 1, 10, 0, 0), TM_E_CLOSED);
  EXPECT_EQ(tm_arrived_packed(c, 9, 10), TM_E_CLOSED);
  EXPECT_EQ(tm_arrived_packed_str(c, "r", 1, 10), TM_E_CLOSED);
  EXPECT_EQ(tm_queued(c, 0, 9), TM_E_CLOSED);
  EXPECT_EQ(tm_queued_str(c, 0, "r", 1), TM_E_CLOSED);
  EXPECT_EQ(tm_scheduled(c, 0, 9), TM_E_CLOSED);
  EXPECT_EQ(tm_scheduled_str(c, 0, "r", 1), TM_E_CLOSED);
  EXPECT_EQ(tm_tokens(c, 0, 9, 1), TM_E_CLOSED);
  EXPECT_EQ(tm_tokens_str(c, 0, "r", 1, 1), TM_E_CLOSED);
  EXPECT_EQ(tm_finished(c, 0, 9, TM_FINISH_STOP), TM_E_CLOSED);
  EXPECT_EQ(tm_finished_str(c, 0, "r", 1, TM_FINISH_STOP), TM_E_CLOSED);
  EXPECT_EQ(tm_preempted(c, 0, 9), TM_E_CLOSED);
  EXPECT_EQ(tm_preempted_str(c, 0, "r", 1), TM_E_CLOSED);
  EXPECT_EQ(tm_step(c, 0, keys, values, 1, nullptr, 0), TM_E_CLOSED);
  EXPECT_EQ(tm_tokens_batch(c, 0, rids, nullptr, 3), TM_E_CLOSED);  // 3
  EXPECT_EQ(tm_tokens_batch_str(c, 0, "a\0b\0", 4, nullptr, 2),
            TM_E_CLOSED);  // 2
  uint64_t rejected = 15 + 3 + 2;
  // ... and from one that never had one (the attach path).
  std::thread fresh([&] {
    EXPECT_EQ(tm_thread_attach(c), TM_E_CLOSED);
    EXPECT_EQ(tm_tokens(c, 0, 9, 1), TM_E_CLOSED);
  });
  fresh.join();
  rejected += 1;
  // A bad argument is still TM_E_INVALID, and still counted.
  EXPECT_EQ(tm_tokens(c, 0, 9, 0), TM_E_INVALID);
  rejected += 1;

  EXPECT_EQ(tm_client_flush(c, 100), TM_E_CLOSED);
  EXPECT_EQ(tm_thread_attach(c), TM_E_CLOSED);
  StatsArray s = StatsOf(c);
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], 2u);
  EXPECT_EQ(s[TM_STAT_EVENTS_REJECTED], rejected);
  EXPECT_EQ(s[TM_STAT_CONNECTED], 0u);
  // A second close does nothing but report.
  StatsArray again{};
  EXPECT_EQ(tm_client_close(c, again.data(), again.size()), TM_E_CLOSED);
  EXPECT_EQ(again, s);
  EXPECT_STREQ(tm_strerror(TM_E_CLOSED),
               "client closed: the call did nothing (counted as rejected)");

  // Nothing after the close reached the daemon.
  ASSERT_TRUE(WaitForEof(0));
  EXPECT_EQ(CountEvents(server_->Snapshot()), 2u);
}

TEST_F(CloseRaceTest, TwoThreadsClosingAtOnceCloseOnce) {
  StartServer();
  NewClient();
  tm_client* c = client_;
  client_ = nullptr;
  ASSERT_EQ(tm_tokens(c, 0, 1, 1), TM_OK);
  std::atomic<bool> go{false};
  int rc[2] = {0, 0};
  std::vector<std::thread> closers;
  for (int i = 0; i < 2; ++i) {
    closers.emplace_back([&, i] {
      while (!go.load()) {
      }
      rc[i] = tm_client_close(c, nullptr, 0);
    });
  }
  go = true;
  for (std::thread& t : closers) t.join();
  EXPECT_TRUE((rc[0] == TM_OK && rc[1] == TM_E_CLOSED) ||
              (rc[1] == TM_OK && rc[0] == TM_E_CLOSED))
      << rc[0] << " " << rc[1];
  EXPECT_EQ(StatsOf(c)[TM_STAT_EVENTS_SENT], 1u);
}

// What one hammering thread saw.
struct Tally {
  uint64_t ok = 0;
  uint64_t closed = 0;
  uint64_t dropped = 0;
  uint64_t other = 0;
};

// Producers hammer every kind of call while the main thread closes; some
// threads start during the close (the attach path), one calls flush and
// stats in a loop. Every event a call accepted (TM_OK) is sent or counted
// as dropped at close; every refused one is counted as rejected; nothing
// else happens to any of them.
TEST_F(CloseRaceTest, CloseRacingEventCallsLosesNothingAndFreesSafely) {
  StartServer();
  constexpr int kRounds = 8;
  constexpr int kProducers = 4;
  for (int round = 0; round < kRounds; ++round) {
    OptionsPtr opts = DefaultOptions();
    // Room to drain all the rounds' events: tens of thousands sent through
    // the in-process test server, taking 0.5-1.2 s under TSan on a quiet
    // machine and past 5 s once on a loaded CI one.
    ASSERT_EQ(tm_options_set_close_timeout_ms(opts.get(), 60000), TM_OK);
    tm_client* c = nullptr;
    ASSERT_EQ(tm_client_new(opts.get(), &c), TM_OK);
    std::vector<Tally> tallies(kProducers + 2);
    std::atomic<uint64_t> calls{0};
    std::atomic<bool> closed{false};
    auto hammer = [&](Tally* t, uint64_t base) {
      const uint64_t rids[2] = {base, base + 1};
      const uint32_t n[2] = {1, 0};  // one event, one skipped entry
      // Go on until the close was refused to us a few times.
      for (uint64_t i = 0; t->closed < 3; ++i) {
        int rc;
        const uint64_t events = 1;
        switch (i % 4) {
          case 0:
            rc = tm_tokens(c, i + 1, base, 1);
            break;
          case 1:
            rc = tm_tokens_str(c, i + 1, "abc", 3, 2);
            break;
          case 2:
            // The number appended (1, or 0 when dropped) or an error.
            rc = tm_tokens_batch(c, i + 1, rids, n, 2);
            rc = rc == 1 ? TM_OK : rc == 0 ? TM_E_DROPPED : rc;
            break;
          default: {
            const tm_step_key keys[1] = {TM_STEP_KEY_WAITING};
            const double values[1] = {2};
            rc = tm_step(c, i + 1, keys, values, 1, nullptr, 0);
          }
        }
        if (rc == TM_OK) {
          t->ok += events;
        } else if (rc == TM_E_CLOSED) {
          t->closed += events;
        } else if (rc == TM_E_DROPPED) {
          t->dropped += events;
        } else {
          ++t->other;
        }
        calls.fetch_add(1, std::memory_order_relaxed);
      }
    };
    std::vector<std::thread> threads;
    for (int k = 0; k < kProducers; ++k) {
      threads.emplace_back(hammer, &tallies[k], uint64_t(k) * 1000);
    }
    std::thread control([&] {
      while (!closed.load()) {
        StatsArray s{};
        EXPECT_EQ(tm_client_stats(c, s.data(), s.size()), TM_OK);
        const int rc = tm_client_flush(c, 50);
        EXPECT_TRUE(rc == TM_OK || rc == TM_E_TIMEOUT || rc == TM_E_CLOSED ||
                    rc == TM_E_DISCONNECTED)
            << rc;
      }
    });
    ASSERT_TRUE(PollUntil([&] { return calls.load() >= 2000; }));
    // Two threads that attach while the close runs.
    for (int k = kProducers; k < kProducers + 2; ++k) {
      threads.emplace_back(hammer, &tallies[k], uint64_t(k) * 1000);
    }
    StatsArray at_close{};
    const int rc = tm_client_close(c, at_close.data(), at_close.size());
    EXPECT_EQ(rc, TM_OK);
    closed = true;
    for (std::thread& t : threads) t.join();
    control.join();

    Tally sum;
    for (const Tally& t : tallies) {
      sum.ok += t.ok;
      sum.closed += t.closed;
      sum.dropped += t.dropped;
      sum.other += t.other;
    }
    EXPECT_EQ(sum.other, 0u);
    const StatsArray s = StatsOf(c);
    // Accepted: sent, or dropped by the close (none here: it had 60 s).
    EXPECT_EQ(sum.ok, at_close[TM_STAT_EVENTS_SENT] +
                          at_close[TM_STAT_EVENTS_DROPPED] - sum.dropped)
        << "round " << round;
    EXPECT_EQ(s[TM_STAT_EVENTS_SENT], at_close[TM_STAT_EVENTS_SENT]);
    EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], at_close[TM_STAT_EVENTS_DROPPED]);
    // Refused: counted as rejected, after the close's snapshot or in it.
    EXPECT_EQ(s[TM_STAT_EVENTS_REJECTED], sum.closed) << "round " << round;
    EXPECT_GE(sum.closed, uint64_t{3} * (kProducers + 2));
    // The daemon got exactly what was counted as sent.
    const size_t seen_before = size_t(round);
    ASSERT_TRUE(WaitForEof(seen_before));
    const TestServer::Connections conns = server_->Snapshot();
    ASSERT_GT(conns.size(), seen_before);
    ASSERT_TRUE(IsWellFormed(conns[seen_before]));
    EXPECT_EQ(EventsOf(conns[seen_before]).size(),
              at_close[TM_STAT_EVENTS_SENT])
        << "round " << round;
  }
}

}  // namespace
}  // namespace tokenmeter::testing
