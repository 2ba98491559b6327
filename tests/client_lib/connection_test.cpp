// The sender thread's life with a daemon that is absent, appears late,
// closes the connection, stops reading, or writes back; and
// tm_client_flush().
#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "client_fixture.h"
#include "protocol_checks.h"
#include "test_server.h"
#include "tokenmeter/tokenmeter.h"

namespace tokenmeter::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

milliseconds Since(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
}

// Event calls made while nothing drains the buffer: how many were taken and
// how many the full buffer refused.
struct PushResult {
  uint32_t ok = 0;
  uint32_t dropped = 0;
  uint32_t other = 0;
};
PushResult PushTokens(tm_client* c, uint32_t count, uint64_t rid = 1) {
  PushResult r;
  for (uint32_t i = 0; i < count; ++i) {
    const int rc = tm_tokens(c, 1000 + i, rid, i + 1);
    if (rc == TM_OK) {
      ++r.ok;
    } else if (rc == TM_E_DROPPED) {
      ++r.dropped;
    } else {
      ++r.other;
    }
  }
  return r;
}

// The events' n fields, which the tests number 1, 2, 3, ...
std::vector<uint64_t> CountsOf(const std::vector<Value>& events) {
  std::vector<uint64_t> n;
  for (const Value& ev : events) n.push_back(ev.array.at(3).uint);
  return n;
}
std::vector<uint64_t> OneTo(uint64_t n) {
  std::vector<uint64_t> v;
  for (uint64_t i = 1; i <= n; ++i) v.push_back(i);
  return v;
}

using DaemonAbsentTest = ClientFixture;

TEST_F(DaemonAbsentTest, CountsConnectFailures) {
  NewClient();
  EXPECT_TRUE(
      PollUntil([&] { return Stats()[TM_STAT_CONNECT_FAILURES] >= 3; }));
  const StatsArray s = Stats();
  EXPECT_EQ(s[TM_STAT_CONNECTED], 0u);
  EXPECT_EQ(s[TM_STAT_RECONNECTS], 0u);
  EXPECT_EQ(s[TM_STAT_BATCHES_SENT], 0u);
  EXPECT_EQ(s[TM_STAT_BYTES_SENT], 0u);
}

TEST_F(DaemonAbsentTest, DropsAndCountsEventsOnceBufferIsFull) {
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_buffer_capacity(opts.get(), 1024), TM_OK);
  ASSERT_EQ(tm_options_set_close_timeout_ms(opts.get(), 0), TM_OK);
  NewClient(opts.get());
  constexpr uint32_t kPushed = 5000;
  const Clock::time_point start = Clock::now();
  const PushResult r = PushTokens(client_, kPushed);
  // Thousands of calls against a full buffer still return at once.
  EXPECT_LT(Since(start), milliseconds(1000));
  EXPECT_EQ(r.other, 0u);
  EXPECT_EQ(r.ok + r.dropped, kPushed);
  // The buffer holds at least its capacity in 24-byte events.
  EXPECT_GE(r.ok, 1024u);
  EXPECT_GT(r.dropped, 0u);
  const StatsArray s = Stats();
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], r.dropped);
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], 0u);
  EXPECT_EQ(s[TM_STAT_EVENTS_REJECTED], 0u);
  // Close (timeout 0) gives the buffered ones up too: all are dropped.
  StatsArray final_stats{};
  EXPECT_EQ(CloseClient(&final_stats), TM_E_TIMEOUT);
  EXPECT_EQ(final_stats[TM_STAT_EVENTS_DROPPED], kPushed);
}

TEST_F(DaemonAbsentTest, CloseGivesUpAfterCloseTimeout) {
  constexpr uint32_t kCloseTimeoutMs = 200;
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_close_timeout_ms(opts.get(), kCloseTimeoutMs),
            TM_OK);
  NewClient(opts.get());
  const PushResult r = PushTokens(client_, 10);
  ASSERT_EQ(r.ok, 10u);
  StatsArray s{};
  const Clock::time_point start = Clock::now();
  EXPECT_EQ(CloseClient(&s), TM_E_TIMEOUT);
  const milliseconds took = Since(start);
  EXPECT_GE(took, milliseconds(kCloseTimeoutMs - 10));
  EXPECT_LT(took, milliseconds(kCloseTimeoutMs + 800));
  // Unsent at close counts as dropped.
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 10u);
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], 0u);
  EXPECT_GE(s[TM_STAT_CONNECT_FAILURES], 1u);
  EXPECT_EQ(s[TM_STAT_CONNECTED], 0u);
}

TEST_F(DaemonAbsentTest, CloseWithNothingBufferedReturnsAtOnce) {
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_close_timeout_ms(opts.get(), 60000), TM_OK);
  NewClient(opts.get());
  const Clock::time_point start = Clock::now();
  EXPECT_EQ(CloseClient(), TM_OK);
  EXPECT_LT(Since(start), milliseconds(1000));
}

// ---- the daemon appears later
// ------------------------------------------------

using DaemonLaterTest = ClientFixture;

TEST_F(DaemonLaterTest, ConnectsAndSendsHelloThenBufferedEvents) {
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_buffer_capacity(opts.get(), 1024), TM_OK);
  NewClient(opts.get());
  const PushResult r = PushTokens(client_, 3000);
  ASSERT_EQ(r.other, 0u);
  ASSERT_GT(r.dropped, 0u);
  // Let the backoff grow a little before the daemon shows up.
  ASSERT_TRUE(
      PollUntil([&] { return Stats()[TM_STAT_CONNECT_FAILURES] >= 4; }));

  StartServer();
  const Clock::time_point started = Clock::now();
  ASSERT_TRUE(server_->WaitUntil([](const TestServer::Connections& c) {
    return !c.empty() && !c[0].frames.empty();
  }));
  // The backoff never exceeds 1 s (here it is far below).
  EXPECT_LT(Since(started), milliseconds(1000 + 500));
  ASSERT_TRUE(WaitForEvents(r.ok));
  EXPECT_EQ(tm_tokens(client_, 1, 2, 1), TM_OK);  // and new events follow
  ASSERT_TRUE(WaitForEvents(r.ok + 1));
  ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);  // counters settled

  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 1u);
  ASSERT_TRUE(IsWellFormed(conns[0]));  // HELLO first, seq from 0
  std::vector<Value> events = EventsOf(conns[0]);
  ASSERT_EQ(events.size(), r.ok + 1);
  EXPECT_EQ(events.back().ToString(), "[4,1,2,1]");
  events.pop_back();
  // The first r.ok events, in order; the rest were dropped.
  EXPECT_EQ(CountsOf(events), OneTo(r.ok));
  // Every BATCH reports the drops.
  for (const Frame* b : BatchesOf(conns[0])) {
    EXPECT_EQ(b->value.array[2].uint, r.dropped);
  }
  const StatsArray s = Stats();
  EXPECT_EQ(s[TM_STAT_CONNECTED], 1u);
  EXPECT_EQ(s[TM_STAT_RECONNECTS], 0u);
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], r.ok + 1);
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], r.dropped);
}

// ---- the daemon closes the connection ---------------------------------------

using ReconnectTest = ClientFixture;

// Without ack (protocol 1.0), seq counts each connection's batches.
TEST_F(ReconnectTest, ReconnectsAndStartsOverAfterServerCloses) {
  StartServer();
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_ack(opts.get(), 0), TM_OK);
  NewClient(opts.get());
  ASSERT_EQ(tm_tokens(client_, 10, 1, 1), TM_OK);
  ASSERT_EQ(tm_tokens(client_, 11, 1, 2), TM_OK);
  ASSERT_TRUE(WaitForEvents(2));
  server_->Drop(0);
  // Sent after the server's close: must come on the new connection.
  ASSERT_EQ(tm_tokens(client_, 12, 1, 3), TM_OK);
  ASSERT_TRUE(server_->WaitUntil([](const TestServer::Connections& c) {
    return c.size() == 2 && CountEvents({c[1]}) >= 1;
  }));
  EXPECT_TRUE(PollUntil([&] { return Stats()[TM_STAT_RECONNECTS] == 1; }));
  ASSERT_EQ(tm_tokens(client_, 13, 1, 4), TM_OK);
  ASSERT_TRUE(WaitForEvents(4));
  ASSERT_EQ(CloseClient(), TM_OK);
  ASSERT_TRUE(WaitForEof(1));

  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 2u);
  EXPECT_TRUE(conns[0].dropped);
  ASSERT_TRUE(IsWellFormed(conns[0]));
  ASSERT_TRUE(IsWellFormed(conns[1]));  // HELLO again, seq from 0 again
  EXPECT_EQ(CountsOf(EventsOf(conns[0])), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(CountsOf(EventsOf(conns[1])), (std::vector<uint64_t>{3, 4}));
  const std::vector<const Frame*> batches = BatchesOf(conns[1]);
  ASSERT_FALSE(batches.empty());
  EXPECT_EQ(batches[0]->value.array[1].uint, 0u);
  EXPECT_EQ(conns[1].frames.front().value.array[0].uint, 0u);  // HELLO
  EXPECT_EQ(conns[1].frames.back().value.ToString(), "[2]");
}

// With ack (the default), seq counts the client's batches across
// reconnects; what the server acked before it closed is not sent again.
TEST_F(ReconnectTest, SeqGoesOnAcrossReconnectsWithAck) {
  StartServer();
  NewClient();
  ASSERT_EQ(tm_tokens(client_, 10, 1, 1), TM_OK);
  ASSERT_TRUE(WaitForEvents(1));
  ASSERT_EQ(tm_tokens(client_, 11, 1, 2), TM_OK);
  ASSERT_TRUE(WaitForEvents(2));
  server_->Drop(0);
  ASSERT_EQ(tm_tokens(client_, 12, 1, 3), TM_OK);
  ASSERT_TRUE(server_->WaitUntil([](const TestServer::Connections& c) {
    return c.size() == 2 && CountEvents({c[1]}) >= 1;
  }));
  ASSERT_EQ(tm_tokens(client_, 13, 1, 4), TM_OK);
  ASSERT_TRUE(WaitForEvents(4));
  StatsArray s;
  ASSERT_EQ(CloseClient(&s), TM_OK);
  ASSERT_TRUE(WaitForEof(1));

  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 2u);
  ASSERT_TRUE(IsWellFormed(conns[0]));
  ASSERT_TRUE(IsWellFormed(conns[1]));
  EXPECT_EQ(CountsOf(EventsOf(conns[0])), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(CountsOf(EventsOf(conns[1])), (std::vector<uint64_t>{3, 4}));
  const std::vector<const Frame*> first = BatchesOf(conns[0]);
  const std::vector<const Frame*> second = BatchesOf(conns[1]);
  ASSERT_EQ(first.size(), 2u);
  ASSERT_FALSE(second.empty());
  EXPECT_EQ(first[0]->value.array[1].uint, 0u);
  EXPECT_EQ(first[1]->value.array[1].uint, 1u);
  EXPECT_EQ(second[0]->value.array[1].uint, 2u);  // not 0 again
  EXPECT_EQ(conns[0].acked, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(s[TM_STAT_BATCHES_REPLAYED], 0u);
  EXPECT_EQ(s[TM_STAT_EVENTS_UNACKED], 0u);
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], 4u);
}

TEST_F(ReconnectTest, CountsEachReconnect) {
  StartServer();
  NewClient();
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_EQ(tm_tokens(client_, 10 + i, 1, i + 1), TM_OK);
    ASSERT_TRUE(WaitForEvents(i + 1));
    server_->Drop(i);
    ASSERT_TRUE(server_->WaitUntil(
        [i](const TestServer::Connections& c) { return c.size() == i + 2; }));
  }
  EXPECT_TRUE(PollUntil([&] { return Stats()[TM_STAT_RECONNECTS] == 3; }));
  EXPECT_EQ(Stats()[TM_STAT_CONNECTED], 1u);
  ASSERT_EQ(CloseClient(), TM_OK);
  ASSERT_TRUE(WaitForEof(3));
  for (const Connection& c : server_->Snapshot()) {
    EXPECT_TRUE(IsWellFormed(c));
    ASSERT_FALSE(c.frames.empty());
    EXPECT_EQ(c.frames[0].value.array[0].uint, 0u);
  }
}

TEST_F(ReconnectTest, ReconnectsToRestartedDaemon) {
  StartServer();
  NewClient();
  ASSERT_EQ(tm_tokens(client_, 10, 1, 1), TM_OK);
  ASSERT_TRUE(WaitForEvents(1));
  server_.reset();  // the daemon goes away, socket file and all
  ASSERT_TRUE(PollUntil([&] { return Stats()[TM_STAT_CONNECTED] == 0; }));
  ASSERT_EQ(tm_tokens(client_, 11, 1, 2), TM_OK);  // buffered meanwhile
  ASSERT_TRUE(
      PollUntil([&] { return Stats()[TM_STAT_CONNECT_FAILURES] >= 1; }));
  StartServer();
  ASSERT_TRUE(WaitForEvents(1));
  ASSERT_EQ(tm_tokens(client_, 12, 1, 3), TM_OK);
  ASSERT_TRUE(WaitForEvents(2));
  ASSERT_EQ(CloseClient(), TM_OK);
  ASSERT_TRUE(WaitForEof(0));
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 1u);
  ASSERT_TRUE(IsWellFormed(conns[0]));
  EXPECT_EQ(CountsOf(EventsOf(conns[0])), (std::vector<uint64_t>{2, 3}));
}

// ---- the peer writes to the client -----------------------------------------

// Ack off (protocol 1.0) and on: bytes that are not ACK frames.
class InboundBytesTest : public ClientFixture,
                         public ::testing::WithParamInterface<bool> {};

// User plus system CPU time of the whole process (every thread: the client's
// sender, the test server, this one).
std::chrono::microseconds ProcessCpu() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return std::chrono::seconds(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         std::chrono::microseconds(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// A client that did not ask for ACKs, or one that did and gets bytes that
// are no ACK frame (0xc1, a byte msgpack never uses), closes the connection
// and reconnects with backoff; it never spins on them.
TEST_P(InboundBytesTest, ClosesReconnectsWithBackoffAndStaysIdle) {
  StartServer();
  server_->SetWriteJunk(true);
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_ack(opts.get(), GetParam() ? 1 : 0), TM_OK);
  NewClient(opts.get());
  ASSERT_TRUE(server_->WaitUntil(
      [](const TestServer::Connections& c) { return !c.empty(); }));
  const Clock::time_point start = Clock::now();
  const std::chrono::microseconds cpu_start = ProcessCpu();
  // Seven connections are at least 10 + 20 + 40 + 80 + 160 + 320 ms of
  // backoff apart: over half a second with a peer that never stops talking.
  constexpr size_t kConns = 7;
  const bool reconnected = server_->WaitUntil(
      [](const TestServer::Connections& c) { return c.size() >= kConns; });
  const auto cpu = ProcessCpu() - cpu_start;
  const auto wall = std::chrono::duration_cast<std::chrono::microseconds>(
      Clock::now() - start);
  EXPECT_TRUE(reconnected);
  EXPECT_GE(wall, milliseconds(500));
  // Generous: the idle case is a few milliseconds; a sender that keeps
  // reading takes most of a core.
  EXPECT_LT(double(cpu.count()), 0.2 * double(wall.count()))
      << "cpu " << cpu.count() << " us over " << wall.count() << " us";
  // The server may see a connection before the client has counted it.
  EXPECT_TRUE(
      PollUntil([&] { return Stats()[TM_STAT_RECONNECTS] >= kConns - 1; }));

  // A quiet peer again: events flow on the next connection.
  server_->SetWriteJunk(false);
  ASSERT_EQ(tm_tokens(client_, 10, 1, 1), TM_OK);
  ASSERT_TRUE(WaitForEvents(1));
  ASSERT_EQ(CloseClient(), TM_OK);
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_GE(conns.size(), kConns);
  for (const Connection& c : conns) {
    ASSERT_FALSE(c.frames.empty());
    EXPECT_TRUE(IsValidHello(c.frames[0].value));  // HELLO on every one
    EXPECT_EQ(c.frames[0].value.array[1].Find("ack") != nullptr, GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Ack, InboundBytesTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "AckOn" : "AckOff");
                         });

// ---- flush -----------------------------------------------------------------

using FlushTest = ClientFixture;

TEST_F(FlushTest, ReturnsOkOnceEverythingIsWritten) {
  StartServer();
  NewClient();
  constexpr uint32_t kEvents = 5000;
  ASSERT_EQ(PushTokens(client_, kEvents).ok, kEvents);
  ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
  // Written to the socket before flush returned.
  EXPECT_EQ(Stats()[TM_STAT_EVENTS_SENT], kEvents);
  ASSERT_TRUE(WaitForEvents(kEvents));
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_TRUE(IsWellFormed(conns[0]));
  EXPECT_EQ(CountsOf(EventsOf(conns[0])), OneTo(kEvents));
  // Nothing new: flush has nothing to wait for.
  EXPECT_EQ(tm_client_flush(client_, 5000), TM_OK);
}

TEST_F(FlushTest, ReturnsDisconnectedAtOnceWhenDaemonIsAway) {
  NewClient();
  ASSERT_EQ(tm_tokens(client_, 1, 1, 1), TM_OK);
  const Clock::time_point start = Clock::now();
  EXPECT_EQ(tm_client_flush(client_, 10000), TM_E_DISCONNECTED);
  EXPECT_LT(Since(start), milliseconds(1000));
  // The event stays buffered and is sent once the daemon is there.
  StartServer();
  ASSERT_TRUE(WaitForEvents(1));
  EXPECT_EQ(tm_client_flush(client_, 5000), TM_OK);
}

TEST_F(FlushTest, TimesOutWhileDaemonDoesNotRead) {
  StartServer();
  server_->SetReading(false);
  NewClient();
  // Far more than a Unix socket buffer holds (each event ~20 bytes).
  constexpr uint32_t kEvents = 60000;
  const Clock::time_point start = Clock::now();
  ASSERT_EQ(PushTokens(client_, kEvents).ok, kEvents);
  EXPECT_LT(Since(start), milliseconds(1000));  // never blocked
  EXPECT_EQ(tm_client_flush(client_, 50), TM_E_TIMEOUT);
  EXPECT_LT(Stats()[TM_STAT_EVENTS_SENT], kEvents);
  server_->SetReading(true);
  EXPECT_EQ(tm_client_flush(client_, 5000), TM_OK);
  EXPECT_EQ(Stats()[TM_STAT_EVENTS_SENT], kEvents);
  ASSERT_TRUE(WaitForEvents(kEvents));
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 1u);
  ASSERT_TRUE(IsWellFormed(conns[0]));
  EXPECT_EQ(CountsOf(EventsOf(conns[0])), OneTo(kEvents));
}

// Once the socket takes data again, the sender writes every full batch
// at once, not one per flush interval: with a 10 s interval, a flush of
// ~15 batches after the socket was full must complete within its 5 s.
TEST_F(FlushTest, DrainsAllBatchesWhenTheSocketTakesDataAgain) {
  StartServer();
  server_->SetReading(false);
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_flush_interval_ms(opts.get(), 10000), TM_OK);
  NewClient(opts.get());
  ASSERT_TRUE(PollUntil([&] { return Stats()[TM_STAT_CONNECTED] == 1; }));
  constexpr uint32_t kEvents = 60000;
  ASSERT_EQ(PushTokens(client_, kEvents).ok, kEvents);
  EXPECT_EQ(tm_client_flush(client_, 100), TM_E_TIMEOUT);  // socket full
  EXPECT_LT(Stats()[TM_STAT_EVENTS_SENT], kEvents);
  server_->SetReading(true);
  EXPECT_EQ(tm_client_flush(client_, 5000), TM_OK);
  EXPECT_EQ(Stats()[TM_STAT_EVENTS_SENT], kEvents);
  ASSERT_TRUE(WaitForEvents(kEvents));
}

}  // namespace
}  // namespace tokenmeter::testing
