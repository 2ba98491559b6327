// The sender against a scripted transport (fake_transport.h): partial
// writes, EAGAIN, resets, inbound bytes, EOF and refused connections, with
// every transport call counted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "client.h"
#include "fake_transport.h"
#include "msgpack_value.h"
#include "protocol_checks.h"
#include "test_server.h"
#include "tokenmeter/tokenmeter.h"

namespace tokenmeter::testing {
namespace {

using StatsArray = std::vector<uint64_t>;

constexpr uint64_t kMsNs = 1000000;
// The sender polls with millisecond timeouts computed from its own clock
// reading, taken a moment before the fake's: allow that much early.
constexpr uint64_t kSlackNs = 1 * kMsNs;

// Events with fixed times and ids, so that two clients that send the same
// events in the same batches write the same bytes.
void PushEvents(tm_client* c, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t t = 1000 + i;
    int rc;
    if (i % 3 == 0) {
      const std::string rid = "req-" + std::to_string(i % 97);
      rc = tm_tokens_str(c, t, rid.data(), rid.size(), i + 1);
    } else if (i % 3 == 1) {
      rc = tm_tokens(c, t, i % 89, i + 1);
    } else {
      rc = tm_arrived(c, t, i, 100 + i % 7, 200, 1);
    }
    ASSERT_EQ(rc, TM_OK) << "event " << i;
  }
}

// The bytes as a TestServer connection, for the protocol checks.
Connection AsConnection(const std::vector<uint8_t>& bytes) {
  Connection c;
  c.bytes = bytes;
  c.decode_error = !DecodeFrames(c.bytes, &c.decoded_bytes, &c.frames);
  c.eof = true;
  return c;
}

::testing::AssertionResult StartsWithHello(const std::vector<uint8_t>& bytes) {
  std::vector<Frame> frames;
  size_t off = 0;
  if (!DecodeFrames(bytes, &off, &frames) || frames.empty()) {
    return ::testing::AssertionFailure() << "no frame in " << Hex(bytes);
  }
  return IsValidHello(frames[0].value);
}

// The bytes with HELLO's session (random per client) replaced by a uint64
// of 0, so that the streams of two clients compare equal.
std::vector<uint8_t> MaskSession(std::vector<uint8_t> bytes) {
  static const uint8_t kKey[] = {0xa7, 's', 'e', 's', 's', 'i', 'o', 'n'};
  const auto key =
      std::search(bytes.begin(), bytes.end(), std::begin(kKey), std::end(kKey));
  if (key == bytes.end()) return bytes;
  const auto value = key + ptrdiff_t(sizeof kKey);
  size_t len = 0;
  switch (value == bytes.end() ? 0 : *value) {
    case 0xcc:
      len = 2;
      break;
    case 0xcd:
      len = 3;
      break;
    case 0xce:
      len = 5;
      break;
    case 0xcf:
      len = 9;
      break;
    default:
      len = 1;  // a positive fixint
  }
  const size_t at = size_t(value - bytes.begin());
  if (at + len > bytes.size()) return bytes;
  static const uint8_t kZero[9] = {0xcf};
  bytes.erase(bytes.begin() + ptrdiff_t(at),
              bytes.begin() + ptrdiff_t(at + len));
  bytes.insert(bytes.begin() + ptrdiff_t(at), kZero, kZero + 9);
  return bytes;
}

uint64_t SessionOf(const std::vector<uint8_t>& bytes) {
  std::vector<Frame> frames;
  size_t off = 0;
  if (!DecodeFrames(bytes, &off, &frames) || frames.empty()) return 0;
  const Value* s = frames[0].value.array[1].Find("session");
  return s != nullptr && s->IsUint() ? s->uint : 0;
}

size_t HelloSize(const std::vector<uint8_t>& bytes) {
  std::vector<Frame> frames;
  size_t off = 0;
  DecodeFrames(bytes, &off, &frames);
  return frames.empty() ? 0 : frames[0].raw.size();
}

// The delivery mechanics below (partial writes, EAGAIN, resets, inbound
// bytes) are those of ack off (protocol 1.0): the fake peer sends no ACKs.
// Acknowledged delivery is tested against the TestServer (ack_test.cpp).
class SenderTest : public ::testing::Test {
 protected:
  ~SenderTest() override {
    if (client_ != nullptr) tm_client_close(client_, nullptr, 0);
  }

  void NewClient(uint32_t flush_interval_ms = 20) {
    ASSERT_EQ(client_, nullptr);
    tm_options* opts = tm_options_new();
    ASSERT_NE(opts, nullptr);
    EXPECT_EQ(tm_options_set_model(opts, "m"), TM_OK);
    EXPECT_EQ(tm_options_set_flush_interval_ms(opts, flush_interval_ms), TM_OK);
    EXPECT_EQ(tm_options_set_ack(opts, 0), TM_OK);
    opts->make_transport = peer_->Factory();
    const int rc = tm_client_new(opts, &client_);
    tm_options_free(opts);
    ASSERT_EQ(rc, TM_OK);
  }

  // The client buffers `events` while the peer refuses, then connects: all
  // of them are in the rings before the first BATCH is built, so the batches
  // do not depend on timing.
  void ConnectWithBuffered(uint32_t events) {
    peer_->SetRefuseConnect(true);
    NewClient();
    ASSERT_TRUE(PollUntil([&] { return !peer_->ConnectAttemptsNs().empty(); }));
    PushEvents(client_, events);
    peer_->SetRefuseConnect(false);
    ASSERT_TRUE(PollUntil([&] { return peer_->connected(); }));
  }

  int CloseClient(StatsArray* stats = nullptr) {
    StatsArray s(TM_STAT_COUNT);
    const int rc = tm_client_close(client_, s.data(), s.size());
    client_ = nullptr;
    if (stats != nullptr) *stats = s;
    return rc;
  }

  StatsArray Stats() const {
    StatsArray s(TM_STAT_COUNT);
    EXPECT_EQ(tm_client_stats(client_, s.data(), s.size()), TM_OK);
    return s;
  }

  std::shared_ptr<FakePeer> peer_ = FakePeer::New();
  tm_client* client_ = nullptr;
};

constexpr uint32_t kEvents = 10000;  // three BATCHes (4096 events at most)

// What a client writes for ConnectWithBuffered(events) when every write
// takes all it is given: HELLO, the BATCHes, GOODBYE.
std::vector<uint8_t> WholeWriteStream(uint32_t events) {
  std::shared_ptr<FakePeer> peer = FakePeer::New();
  peer->SetRefuseConnect(true);
  tm_options* opts = tm_options_new();
  EXPECT_EQ(tm_options_set_model(opts, "m"), TM_OK);
  EXPECT_EQ(tm_options_set_ack(opts, 0), TM_OK);
  opts->make_transport = peer->Factory();
  tm_client* c = nullptr;
  EXPECT_EQ(tm_client_new(opts, &c), TM_OK);
  tm_options_free(opts);
  EXPECT_TRUE(PollUntil([&] { return !peer->ConnectAttemptsNs().empty(); }));
  PushEvents(c, events);
  peer->SetRefuseConnect(false);
  EXPECT_TRUE(PollUntil([&] { return peer->connected(); }));
  EXPECT_EQ(tm_client_flush(c, 5000), TM_OK);
  EXPECT_EQ(tm_client_close(c, nullptr, 0), TM_OK);
  const std::vector<FakeConn> conns = peer->Conns();
  EXPECT_EQ(conns.size(), 1u);
  return conns.empty() ? std::vector<uint8_t>{} : MaskSession(conns[0].bytes);
}

TEST_F(SenderTest, WholeWritesProduceAWellFormedStream) {
  const std::vector<uint8_t> whole = WholeWriteStream(kEvents);
  const Connection c = AsConnection(whole);
  ASSERT_TRUE(IsWellFormed(c));
  EXPECT_EQ(EventsOf(c).size(), kEvents);
  EXPECT_GE(BatchesOf(c).size(), 3u);
  EXPECT_EQ(c.frames.back().value.ToString(), "[2]");
}

TEST_F(SenderTest, PartialWritesProduceTheSameBytesAsWholeWrites) {
  const std::vector<uint8_t> whole = WholeWriteStream(kEvents);
  ASSERT_FALSE(whole.empty());
  const struct {
    const char* name;
    std::vector<size_t> sizes;
  } kCases[] = {
      {"one byte at a time", {1}},
      {"odd sizes", {3, 7, 1, 4093, 13, 65537, 2}},
      {"just under a frame", {whole.size() / 7 - 1}},
  };
  for (const auto& tc : kCases) {
    SCOPED_TRACE(tc.name);
    peer_ = FakePeer::New();
    peer_->SetWriteSizes(tc.sizes);
    ConnectWithBuffered(kEvents);
    ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
    StatsArray s;
    ASSERT_EQ(CloseClient(&s), TM_OK);
    const std::vector<FakeConn> conns = peer_->Conns();
    ASSERT_EQ(conns.size(), 1u);
    EXPECT_EQ(MaskSession(conns[0].bytes), whole);
    EXPECT_TRUE(conns[0].shutdown);
    EXPECT_NE(conns[0].closed_ns, 0u);
    EXPECT_EQ(s[TM_STAT_EVENTS_SENT], kEvents);
    EXPECT_EQ(s[TM_STAT_BYTES_SENT], whole.size());
    // The writes really were partial: no call moved more than allowed.
    const size_t largest = *std::max_element(tc.sizes.begin(), tc.sizes.end());
    EXPECT_GE(peer_->writes(), whole.size() / largest);
  }
}

TEST_F(SenderTest, WaitsOutEagainThenCarriesOn) {
  const std::vector<uint8_t> whole = WholeWriteStream(kEvents);
  constexpr size_t kTaken = 100;  // past HELLO, inside the first BATCH
  ASSERT_GT(HelloSize(whole), 0u);
  ASSERT_LT(HelloSize(whole), kTaken);
  peer_->SetWriteLimit(kTaken);
  ConnectWithBuffered(kEvents);
  ASSERT_TRUE(PollUntil([&] {
    const std::vector<FakeConn> c = peer_->Conns();
    return !c.empty() && c[0].bytes.size() == kTaken;
  }));
  const uint64_t writes_before = peer_->writes();
  // The transport takes nothing for 200 ms: the flush times out, nothing
  // counts as sent, and the sender retries at most once per flush interval
  // (20 ms) rather than spinning on EAGAIN.
  EXPECT_EQ(tm_client_flush(client_, 200), TM_E_TIMEOUT);
  EXPECT_EQ(Stats()[TM_STAT_EVENTS_SENT], 0u);
  EXPECT_EQ(Stats()[TM_STAT_BATCHES_SENT], 0u);
  EXPECT_EQ(Stats()[TM_STAT_BYTES_SENT], kTaken);
  EXPECT_LE(peer_->writes() - writes_before, 30u);
  EXPECT_EQ(peer_->Conns().at(0).bytes.size(), kTaken);
  // The transport drains: the rest follows on the same connection.
  peer_->SetWriteLimit(SIZE_MAX);
  ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
  EXPECT_EQ(Stats()[TM_STAT_EVENTS_SENT], kEvents);
  ASSERT_EQ(CloseClient(), TM_OK);
  const std::vector<FakeConn> conns = peer_->Conns();
  ASSERT_EQ(conns.size(), 1u);
  EXPECT_EQ(MaskSession(conns[0].bytes), whole);
}

class SenderResetTest : public SenderTest,
                        public ::testing::WithParamInterface<int> {};

TEST_P(SenderResetTest, ReconnectsAfterBackoffAndSendsTheBatchWholeAgain) {
  const std::vector<uint8_t> whole = WholeWriteStream(kEvents);
  const size_t cut = HelloSize(whole) + 57;  // inside the first BATCH
  ConnScript broken;
  broken.fail_after = cut;
  broken.fail_errno = GetParam();
  peer_->SetScript(0, broken);
  ConnectWithBuffered(kEvents);
  ASSERT_TRUE(PollUntil(
      [&] { return peer_->Conns().size() == 2 && peer_->connected(); }));
  ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
  StatsArray s;
  ASSERT_EQ(CloseClient(&s), TM_OK);

  const std::vector<FakeConn> conns = peer_->Conns();
  ASSERT_EQ(conns.size(), 2u);
  // The first connection got HELLO and part of a BATCH, then broke.
  EXPECT_EQ(MaskSession(conns[0].bytes),
            std::vector<uint8_t>(whole.begin(), whole.begin() + cut));
  EXPECT_FALSE(conns[0].shutdown);
  // The sender waited at least the minimum backoff before reconnecting.
  ASSERT_NE(conns[0].closed_ns, 0u);
  EXPECT_GE(conns[1].connected_ns - conns[0].closed_ns,
            client::kBackoffMinNs - kSlackNs);
  // HELLO again, then every BATCH from seq 0 with the same events: the cut
  // one was sent whole, nothing twice.
  EXPECT_EQ(MaskSession(conns[1].bytes), whole);
  // The same session on both connections of the client.
  EXPECT_NE(SessionOf(conns[0].bytes), 0u);
  EXPECT_EQ(SessionOf(conns[0].bytes), SessionOf(conns[1].bytes));
  EXPECT_EQ(s[TM_STAT_RECONNECTS], 1u);
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], kEvents);
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 0u);
  EXPECT_EQ(s[TM_STAT_BYTES_SENT], cut + whole.size());
}

INSTANTIATE_TEST_SUITE_P(Errno, SenderResetTest,
                         ::testing::Values(EPIPE, ECONNRESET),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(
                               info.param == EPIPE ? "EPIPE" : "ECONNRESET");
                         });

TEST_F(SenderTest, ClosesOnInboundBytesAndReconnectsWithBackoff) {
  constexpr size_t kJunkConns = 4;
  ConnScript junk;
  junk.inbound_bytes = 100000;  // more than one read takes
  for (size_t i = 0; i < kJunkConns; ++i) peer_->SetScript(i, junk);
  NewClient();
  ASSERT_TRUE(PollUntil([&] {
    return peer_->Conns().size() == kJunkConns + 1 && peer_->connected();
  }));
  // The connection that stays quiet carries events as usual.
  ASSERT_EQ(tm_tokens(client_, 5, 7, 3), TM_OK);
  ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
  StatsArray s;
  ASSERT_EQ(CloseClient(&s), TM_OK);

  const std::vector<FakeConn> conns = peer_->Conns();
  ASSERT_EQ(conns.size(), kJunkConns + 1);
  uint64_t backoff_ns = client::kBackoffMinNs;
  for (size_t i = 0; i < conns.size(); ++i) {
    SCOPED_TRACE("connection " + std::to_string(i));
    EXPECT_TRUE(StartsWithHello(conns[i].bytes));
    if (i + 1 < conns.size()) {
      // Closed by the client, then the normal backoff: 10, 20, 40, 80 ms
      // (each connection was short-lived).
      ASSERT_NE(conns[i].closed_ns, 0u);
      EXPECT_FALSE(conns[i].shutdown);
      EXPECT_GE(conns[i + 1].connected_ns - conns[i].closed_ns,
                backoff_ns - kSlackNs);
      backoff_ns *= 2;
    }
  }
  const Connection last = AsConnection(conns.back().bytes);
  ASSERT_TRUE(IsWellFormed(last));
  ASSERT_EQ(EventsOf(last).size(), 1u);
  EXPECT_EQ(EventsOf(last)[0].ToString(), "[4,5,7,3]");
  // Read in bulk, once per junk connection; no spinning on the bytes.
  EXPECT_GE(peer_->max_read_cap(), size_t{64 * 1024});
  EXPECT_GE(peer_->reads(), kJunkConns);
  EXPECT_LE(peer_->reads(), 2 * kJunkConns);
  EXPECT_LE(peer_->writes(), 4 * conns.size());
  EXPECT_EQ(s[TM_STAT_RECONNECTS], kJunkConns);
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], 1u);
}

TEST_F(SenderTest, TreatsEofFromThePeerAsABrokenConnection) {
  ConnScript eof;
  eof.eof_after_connect = true;
  peer_->SetScript(0, eof);
  NewClient();
  ASSERT_TRUE(PollUntil(
      [&] { return peer_->Conns().size() == 2 && peer_->connected(); }));
  ASSERT_EQ(tm_tokens(client_, 5, 7, 3), TM_OK);
  ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
  StatsArray s;
  ASSERT_EQ(CloseClient(&s), TM_OK);
  const std::vector<FakeConn> conns = peer_->Conns();
  ASSERT_EQ(conns.size(), 2u);
  EXPECT_TRUE(StartsWithHello(conns[0].bytes));
  EXPECT_GE(conns[1].connected_ns - conns[0].closed_ns,
            client::kBackoffMinNs - kSlackNs);
  const Connection second = AsConnection(conns[1].bytes);
  ASSERT_TRUE(IsWellFormed(second));
  EXPECT_EQ(EventsOf(second).size(), 1u);
  EXPECT_LE(peer_->reads(), 2u);
  EXPECT_EQ(s[TM_STAT_RECONNECTS], 1u);
}

TEST_F(SenderTest, BackoffDoublesWhileConnectFails) {
  peer_->SetRefuseConnect(true);
  NewClient();
  constexpr size_t kAttempts = 6;  // 10 + 20 + 40 + 80 + 160 ms apart
  ASSERT_TRUE(PollUntil(
      [&] { return peer_->ConnectAttemptsNs().size() >= kAttempts; }));
  const StatsArray s = Stats();
  ASSERT_EQ(CloseClient(), TM_OK);
  const std::vector<uint64_t> at = peer_->ConnectAttemptsNs();
  uint64_t backoff_ns = client::kBackoffMinNs;
  for (size_t i = 0; i + 1 < kAttempts; ++i) {
    SCOPED_TRACE("attempt " + std::to_string(i + 1));
    const uint64_t gap = at[i + 1] - at[i];
    EXPECT_GE(gap, backoff_ns - kSlackNs);
    // Not the cap yet: well below a second (bounds a failure only).
    EXPECT_LT(gap, backoff_ns + 500 * kMsNs);
    backoff_ns *= 2;
  }
  EXPECT_GE(s[TM_STAT_CONNECT_FAILURES], kAttempts);
  EXPECT_EQ(s[TM_STAT_CONNECTED], 0u);
  // Nothing touches a transport that never connected.
  EXPECT_EQ(peer_->writes(), 0u);
  EXPECT_EQ(peer_->reads(), 0u);
}

}  // namespace
}  // namespace tokenmeter::testing
