// Acknowledged delivery (docs/protocol.md, "Frame type 3: ACK"): the ACK
// decoder and the replay buffer on their own, then the client against a
// TestServer that acks (or not) like the daemon: batches released once
// acked, replayed in order with their original seq after a reconnect, the
// replay bound, close waiting for the last ACK, malformed ACKs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "ack_decoder.h"
#include "client_fixture.h"
#include "protocol_checks.h"
#include "replay_buffer.h"
#include "test_server.h"
#include "tokenmeter/tokenmeter.h"

namespace tokenmeter::testing {
namespace {

using client::AckDecoder;
using client::ReplayBuffer;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---- AckDecoder
// ---------------------------------------------------------------

struct AckCase {
  const char* name;
  std::vector<uint8_t> bytes;  // written by hand from the msgpack spec
  bool ok;
  bool any;
  uint64_t acked;
};

TEST(AckDecoderTest, DecodesAckFramesAndRefusesAnythingElse) {
  const AckCase kCases[] = {
      {"fixint 0", {0x92, 0x03, 0x00}, true, true, 0},
      {"fixint 127", {0x92, 0x03, 0x7f}, true, true, 127},
      {"uint8", {0x92, 0x03, 0xcc, 0xc8}, true, true, 200},
      {"uint16", {0x92, 0x03, 0xcd, 0x12, 0x34}, true, true, 0x1234},
      {"uint32",
       {0x92, 0x03, 0xce, 0x12, 0x34, 0x56, 0x78},
       true,
       true,
       0x12345678},
      {"uint64",
       {0x92, 0x03, 0xcf, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08},
       true,
       true,
       0x0102030405060708},
      {"a small seq in a wide uint",
       {0x92, 0x03, 0xcf, 0, 0, 0, 0, 0, 0, 0, 0x05},
       true,
       true,
       5},
      {"two frames: the highest",
       {0x92, 0x03, 0x09, 0x92, 0x03, 0x04},
       true,
       true,
       9},
      {"half a frame", {0x92, 0x03, 0xcd, 0x01}, true, false, 0},
      {"nothing", {}, true, false, 0},
      {"not an array of 2", {0x93, 0x03, 0x01, 0x01}, false, false, 0},
      {"another frame type", {0x92, 0x01, 0x00}, false, false, 0},
      {"a negative seq", {0x92, 0x03, 0xff}, false, false, 0},
      // Any msgpack form of the same values (a Go or Java encoder writes
      // signed forms; some write arrays 16/32).
      {"an int8 seq", {0x92, 0x03, 0xd0, 0x01}, true, true, 1},
      {"an int64 seq",
       {0x92, 0x03, 0xd3, 0, 0, 0, 0, 0, 0, 0x01, 0x00},
       true,
       true,
       256},
      {"an int16 type", {0x92, 0xd1, 0x00, 0x03, 0x07}, true, true, 7},
      {"a uint8 type", {0x92, 0xcc, 0x03, 0x07}, true, true, 7},
      {"array 16", {0xdc, 0x00, 0x02, 0x03, 0x07}, true, true, 7},
      {"array 32", {0xdd, 0x00, 0x00, 0x00, 0x02, 0x03, 0x07}, true, true, 7},
      {"the longest form",
       {0xdd, 0x00, 0x00, 0x00, 0x02, 0xd3, 0,    0,    0,    0,    0,   0,
        0,    0x03, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe},
       true,
       true,
       0xfffffffffffffffe},
      {"a negative int8 seq", {0x92, 0x03, 0xd0, 0xff}, false, false, 0},
      {"a negative int64 seq",
       {0x92, 0x03, 0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0},
       false,
       false,
       0},
      {"array 16 of 3", {0xdc, 0x00, 0x03, 0x03, 0x07, 0x07}, false, false, 0},
      {"array 32 of 2^16 + 2", {0xdd, 0x00, 0x01, 0x00, 0x02}, false, false, 0},
      {"a type of 3 + 256", {0x92, 0xcd, 0x01, 0x03, 0x07}, false, false, 0},
      {"a nil type", {0x92, 0xc0, 0x07}, false, false, 0},
      {"a float seq", {0x92, 0x03, 0xca, 0, 0, 0, 0}, false, false, 0},
      {"a str seq", {0x92, 0x03, 0xa1, 0x31}, false, false, 0},
      {"junk", {0xc1}, false, false, 0},
      {"junk after an ACK", {0x92, 0x03, 0x01, 0xc1}, false, true, 1},
      // The answer to HELLO of a daemon that applied nothing of the
      // session (protocol 1.2, "ACK at HELLO"): a frame, no seq.
      {"nil", {0x92, 0x03, 0xc0}, true, false, 0},
      {"nil, then a seq", {0x92, 0x03, 0xc0, 0x92, 0x03, 0x05}, true, true, 5},
      {"a bool seq", {0x92, 0x03, 0xc3}, false, false, 0},
  };
  for (const AckCase& tc : kCases) {
    SCOPED_TRACE(tc.name);
    AckDecoder d;
    uint64_t acked = 0;
    bool any = false;
    EXPECT_EQ(d.Feed(tc.bytes.data(), tc.bytes.size(), &acked, &any), tc.ok);
    // What came before a bad byte still counts.
    EXPECT_EQ(any, tc.any);
    if (tc.any) {
      EXPECT_EQ(acked, tc.acked);
    }
  }
}

// Feeds `bytes` one at a time; the seq each completed frame acked.
std::vector<uint64_t> FeedByteByByte(AckDecoder& d,
                                     const std::vector<uint8_t>& bytes) {
  std::vector<uint64_t> seen;
  for (uint8_t b : bytes) {
    uint64_t acked = 0;
    bool any = false;
    EXPECT_TRUE(d.Feed(&b, 1, &acked, &any));
    if (any) seen.push_back(acked);
  }
  return seen;
}

TEST(AckDecoderTest, DecodesFramesSplitAnywhere) {
  const std::vector<uint8_t> bytes = {0x92, 0x03, 0xce, 0x00, 0x01,
                                      0x00, 0x00, 0x92, 0x03, 0x2a};
  AckDecoder d;
  const std::vector<uint64_t> seen = FeedByteByByte(d, bytes);
  EXPECT_EQ(seen, (std::vector<uint64_t>{65536, 42}));
  // Reset() forgets a partial frame: a new connection starts clean.
  const uint8_t half[] = {0x92, 0x03, 0xcd};
  uint64_t acked = 0;
  bool any = false;
  ASSERT_TRUE(d.Feed(half, sizeof half, &acked, &any));
  d.Reset();
  const uint8_t whole[] = {0x92, 0x03, 0x07};
  ASSERT_TRUE(d.Feed(whole, sizeof whole, &acked, &any));
  EXPECT_TRUE(any);
  EXPECT_EQ(acked, 7u);
}

// The longest form, then a nil answer in array 16, a byte at a time: the
// buffer holds the whole partial frame and no more.
TEST(AckDecoderTest, DecodesTheLongestFormsByteByByte) {
  const std::vector<uint8_t> bytes = {
      0xdd, 0x00, 0x00, 0x00, 0x02, 0xd3, 0,    0,    0,    0,
      0,    0,    0,    0x03, 0xcf, 0,    0,    0,    0,    0,
      0,    0,    9,    0xdc, 0x00, 0x02, 0xd0, 0x03, 0xc0, 0x92,
      0xd2, 0,    0,    0,    3,    0xd2, 0,    0,    0,    10};
  AckDecoder d;
  const std::vector<uint64_t> seen = FeedByteByByte(d, bytes);
  EXPECT_EQ(seen, (std::vector<uint64_t>{9, 10}));
  EXPECT_EQ(d.frames(), 3u);
}

TEST(AckDecoderTest, CountsCompleteFramesNilIncludedUntilReset) {
  AckDecoder d;
  uint64_t acked = 0;
  bool any = false;
  EXPECT_EQ(d.frames(), 0u);
  const uint8_t nil_half[] = {0x92, 0x03};
  ASSERT_TRUE(d.Feed(nil_half, sizeof nil_half, &acked, &any));
  EXPECT_EQ(d.frames(), 0u);  // not a frame yet
  const uint8_t rest[] = {0xc0, 0x92, 0x03, 0xcc, 0xc8};
  ASSERT_TRUE(d.Feed(rest, sizeof rest, &acked, &any));
  EXPECT_EQ(d.frames(), 2u);
  EXPECT_TRUE(any);
  EXPECT_EQ(acked, 200u);
  d.Reset();
  EXPECT_EQ(d.frames(), 0u);
}

// ---- ReplayBuffer
// -------------------------------------------------------------

std::vector<uint8_t> Body(uint8_t fill, size_t n) {
  return std::vector<uint8_t>(n, fill);
}

// The seqs the replay pass visits, from the oldest.
std::vector<uint64_t> ReplaySeqs(ReplayBuffer& r) {
  std::vector<uint64_t> seqs;
  r.Rewind();
  ReplayBuffer::Entry e;
  while (r.Current(&e)) {
    seqs.push_back(e.seq);
    r.AdvancePast(e.seq);
  }
  return seqs;
}

TEST(ReplayBufferTest, KeepsBatchesUntilReleased) {
  ReplayBuffer r(1024);
  const std::vector<uint8_t> a = Body(0xaa, 10);
  const std::vector<uint8_t> b = Body(0xbb, 20);
  EXPECT_EQ(r.Push(0, 3, a.data(), a.size()), 0u);
  EXPECT_EQ(r.Push(1, 5, b.data(), b.size()), 0u);
  EXPECT_EQ(r.count(), 2u);
  EXPECT_EQ(r.events(), 8u);
  r.Rewind();
  ReplayBuffer::Entry e;
  ASSERT_TRUE(r.Current(&e));
  EXPECT_EQ(e.seq, 0u);
  EXPECT_EQ(e.events, 3u);
  EXPECT_EQ(std::vector<uint8_t>(e.body, e.body + e.size), a);
  r.Release(0);
  EXPECT_EQ(r.count(), 1u);
  EXPECT_EQ(r.events(), 5u);
  ASSERT_TRUE(r.Current(&e));  // the cursor moved on with the release
  EXPECT_EQ(e.seq, 1u);
  EXPECT_EQ(std::vector<uint8_t>(e.body, e.body + e.size), b);
  r.Release(7);  // an ACK past everything releases everything
  EXPECT_TRUE(r.empty());
  EXPECT_FALSE(r.Current(&e));
}

TEST(ReplayBufferTest, DropsTheOldestWhenFullAndWrapsAround) {
  // 16 bytes of header + 48 of body: 64 bytes an entry, four fit.
  ReplayBuffer r(256);
  uint64_t dropped = 0;
  for (uint64_t seq = 0; seq < 10; ++seq) {
    const std::vector<uint8_t> body = Body(uint8_t(seq), 48);
    dropped += r.Push(seq, 2, body.data(), body.size());
    EXPECT_LE(r.count(), 4u);
  }
  EXPECT_EQ(dropped, 12u);  // six entries of two events
  EXPECT_EQ(r.events(), 8u);
  EXPECT_EQ(ReplaySeqs(r), (std::vector<uint64_t>{6, 7, 8, 9}));
  // The bodies survived the wrap intact.
  r.Rewind();
  ReplayBuffer::Entry e;
  while (r.Current(&e)) {
    EXPECT_EQ(std::vector<uint8_t>(e.body, e.body + e.size),
              Body(uint8_t(e.seq), 48));
    r.AdvancePast(e.seq);
  }
  // Entries of other sizes, odd ones, after partial releases.
  r.Release(7);
  for (uint64_t seq = 10; seq < 40; ++seq) {
    const std::vector<uint8_t> body = Body(uint8_t(seq), 1 + seq % 61);
    r.Push(seq, 1, body.data(), body.size());
    if (seq % 3 == 0) r.Release(seq - 2);
    const std::vector<uint64_t> seqs = ReplaySeqs(r);
    ASSERT_FALSE(seqs.empty());
    EXPECT_EQ(seqs.back(), seq);
    for (size_t i = 1; i < seqs.size(); ++i) {
      EXPECT_EQ(seqs[i], seqs[i - 1] + 1);
    }
  }
  r.Rewind();
  while (r.Current(&e)) {
    EXPECT_EQ(e.size, 1 + e.seq % 61);
    EXPECT_EQ(std::vector<uint8_t>(e.body, e.body + e.size),
              Body(uint8_t(e.seq), e.size));
    r.AdvancePast(e.seq);
  }
}

TEST(ReplayBufferTest, DoesNotKeepABatchLargerThanItself) {
  ReplayBuffer r(64);
  const std::vector<uint8_t> big = Body(1, 64);
  EXPECT_EQ(r.Push(0, 9, big.data(), big.size()), 9u);
  EXPECT_TRUE(r.empty());
}

TEST(ReplayBufferTest, FitsWithoutDroppingSaysWhetherAPushWouldDrop) {
  ReplayBuffer r(128);  // two entries of 48 bytes (16 + 32), not three
  const std::vector<uint8_t> b = Body(1, 32);
  EXPECT_TRUE(r.FitsWithoutDropping(b.size()));
  EXPECT_FALSE(r.FitsWithoutDropping(113));  // 16 + 120 > 128
  ASSERT_EQ(r.Push(0, 1, b.data(), b.size()), 0u);
  EXPECT_TRUE(r.FitsWithoutDropping(b.size()));
  ASSERT_EQ(r.Push(1, 1, b.data(), b.size()), 0u);
  EXPECT_FALSE(r.FitsWithoutDropping(b.size()));
  EXPECT_TRUE(r.FitsWithoutDropping(16));  // 32 bytes: the rest exactly
  EXPECT_EQ(r.Push(2, 1, b.data(), b.size()), 1u);  // as it said: one drop
  ReplayBuffer none(0);
  EXPECT_FALSE(none.FitsWithoutDropping(0));
}

TEST(ReplayBufferTest, ClearDropsEveryBatchAndEndsThePass) {
  ReplayBuffer r(1024);
  const std::vector<uint8_t> b = Body(1, 8);
  r.Push(0, 3, b.data(), b.size());
  r.Push(1, 4, b.data(), b.size());
  r.Rewind();
  ASSERT_TRUE(r.replay_pending());
  EXPECT_EQ(r.Clear(), 7u);
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(r.events(), 0u);
  EXPECT_FALSE(r.replay_pending());
  EXPECT_EQ(r.Clear(), 0u);
  // Usable again from the start.
  r.Push(2, 1, b.data(), b.size());
  EXPECT_EQ(ReplaySeqs(r), (std::vector<uint64_t>{2}));
}

TEST(ReplayBufferTest, APushDuringThePassIsNotPartOfIt) {
  ReplayBuffer r(1024);
  const std::vector<uint8_t> b = Body(1, 8);
  r.Push(0, 1, b.data(), b.size());
  r.Rewind();
  r.Push(1, 1, b.data(), b.size());
  ReplayBuffer::Entry e;
  ASSERT_TRUE(r.Current(&e));
  EXPECT_EQ(e.seq, 0u);
  r.AdvancePast(0);
  EXPECT_FALSE(r.Current(&e));
  EXPECT_EQ(r.count(), 2u);
}

// ---- the client against a server that acks ------------------------------

class AckTest : public ClientFixture {
 protected:
  // A flush interval longer than any test: the sender drains the buffers
  // only when asked (PushBatch()'s flush), so each batch is exactly what
  // one PushBatch() appended.
  OptionsPtr AckOptions(uint32_t close_timeout_ms = 5000) const {
    OptionsPtr opts = DefaultOptions();
    EXPECT_EQ(tm_options_set_flush_interval_ms(opts.get(), 10000), TM_OK);
    EXPECT_EQ(tm_options_set_close_timeout_ms(opts.get(), close_timeout_ms),
              TM_OK);
    return opts;
  }

  // One batch of `n` events per call: they are appended, then flushed.
  void PushBatch(uint32_t n, uint32_t first) {
    for (uint32_t i = 0; i < n; ++i) {
      ASSERT_EQ(tm_tokens(client_, 1000 + first + i, 1, first + i), TM_OK);
    }
    ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
  }

  // Waits until the client has reconnected and its HELLO has arrived.
  bool WaitForSecondHello() {
    return server_->WaitUntil([](const TestServer::Connections& c) {
      return c.size() >= 2 && !c[1].frames.empty();
    });
  }

  static std::vector<uint64_t> SeqsOf(const Connection& c) {
    std::vector<uint64_t> seqs;
    for (const Frame* b : BatchesOf(c)) seqs.push_back(b->value.array[1].uint);
    return seqs;
  }
};

TEST_F(AckTest, ReleasesAckedBatchesAndClosesAtOnce) {
  StartServer();
  NewClient(AckOptions().get());
  PushBatch(3, 1);
  PushBatch(2, 4);
  const Clock::time_point start = Clock::now();
  StatsArray s;
  ASSERT_EQ(CloseClient(&s), TM_OK);
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  ASSERT_TRUE(WaitForEof(0));
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 1u);
  ASSERT_TRUE(IsWellFormed(conns[0]));
  EXPECT_TRUE(conns[0].ack);
  EXPECT_EQ(SeqsOf(conns[0]), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(conns[0].acked, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(conns[0].frames.back().value.ToString(), "[2]");
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], 5u);
  EXPECT_EQ(s[TM_STAT_BATCHES_SENT], 2u);
  EXPECT_EQ(s[TM_STAT_EVENTS_UNACKED], 0u);
  EXPECT_EQ(s[TM_STAT_BATCHES_REPLAYED], 0u);
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 0u);
}

TEST_F(AckTest, ReplaysUnackedBatchesInOrderWithTheirSeqAfterReconnect) {
  StartServer();
  server_->SetAcking(false);
  NewClient(AckOptions().get());
  PushBatch(3, 1);  // seq 0
  PushBatch(2, 4);  // seq 1
  ASSERT_TRUE(WaitForEvents(5));
  server_->SetAcking(true);  // from the next connection's batches on
  server_->Drop(0);
  ASSERT_TRUE(server_->WaitUntil([](const TestServer::Connections& c) {
    return c.size() == 2 && CountEvents({c[1]}) >= 5;
  }));
  PushBatch(1, 6);  // seq 2
  StatsArray s;
  ASSERT_EQ(CloseClient(&s), TM_OK);
  ASSERT_TRUE(WaitForEof(1));

  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 2u);
  ASSERT_TRUE(IsWellFormed(conns[0]));
  ASSERT_TRUE(IsWellFormed(conns[1]));
  EXPECT_TRUE(conns[0].acked.empty());
  // HELLO with the same session, the two unacked batches again, in order
  // and with their seq, then the new one.
  const Value* s0 = conns[0].frames[0].value.array[1].Find("session");
  const Value* s1 = conns[1].frames[0].value.array[1].Find("session");
  ASSERT_TRUE(s0 != nullptr && s1 != nullptr);
  EXPECT_EQ(s0->uint, s1->uint);
  EXPECT_EQ(SeqsOf(conns[0]), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(SeqsOf(conns[1]), (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(EventsOf(conns[1]).size(), 6u);
  const std::vector<Value> first = EventsOf(conns[0]);
  const std::vector<Value> again = EventsOf(conns[1]);
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(again[i].ToString(), first[i].ToString()) << "event " << i;
  }
  EXPECT_EQ(conns[1].acked, (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(s[TM_STAT_BATCHES_REPLAYED], 2u);
  EXPECT_EQ(s[TM_STAT_BATCHES_SENT], 3u);
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], 6u);  // once each, not on the replay
  EXPECT_EQ(s[TM_STAT_RECONNECTS], 1u);
  EXPECT_EQ(s[TM_STAT_EVENTS_UNACKED], 0u);
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 0u);
}

TEST_F(AckTest, ReplayBoundDropsTheOldestBatchesAndCountsTheirEvents) {
  StartServer();
  server_->SetAcking(false);
  OptionsPtr opts = AckOptions();
  ASSERT_EQ(tm_options_set_replay_bytes(opts.get(), TM_MIN_REPLAY_BYTES),
            TM_OK);
  NewClient(opts.get());
  // Six flushes of 1000 events with 120-byte ids: about 130 KB each, so
  // the 512 KiB bound keeps the newest three. A flush is one batch unless
  // the sender drained the ring while the loop was still filling it (a slow
  // build: ASan), which splits it in two; the first connection's batches
  // are what the client sent.
  constexpr uint32_t kPerFlush = 1000;
  constexpr uint64_t kFlushes = 6;
  const std::string id(120, 'r');
  for (uint64_t b = 0; b < kFlushes; ++b) {
    for (uint32_t i = 0; i < kPerFlush; ++i) {
      ASSERT_EQ(tm_tokens_str(client_, 1000 + i, id.data(), id.size(), 1),
                TM_OK);
    }
    ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
  }
  ASSERT_TRUE(WaitForEvents(kFlushes * kPerFlush));
  const StatsArray before = Stats();
  const uint64_t batches = SeqsOf(server_->Snapshot()[0]).size();
  ASSERT_GE(batches, kFlushes);
  server_->SetAcking(true);
  server_->Drop(0);
  ASSERT_TRUE(server_->WaitUntil([batches](const TestServer::Connections& c) {
    return c.size() == 2 && c[1].acked.size() >= 1 &&
           c[1].acked.back() == batches - 1;
  }));
  StatsArray s;
  ASSERT_EQ(CloseClient(&s), TM_OK);

  const TestServer::Connections conns = server_->Snapshot();
  std::vector<uint64_t> all(batches);
  std::iota(all.begin(), all.end(), uint64_t{0});
  ASSERT_EQ(SeqsOf(conns[0]), all);
  const std::vector<const Frame*> sent = BatchesOf(conns[0]);
  const std::vector<uint64_t> replayed = SeqsOf(conns[1]);
  ASSERT_TRUE(IsWellFormed(conns[1]));
  ASSERT_FALSE(replayed.empty());
  // The newest batches, consecutive up to the last one; the older ones were
  // dropped from the buffer, their events counted.
  const uint64_t kept = replayed.size();
  const uint64_t lost = batches - kept;
  EXPECT_EQ(replayed.front(), lost);
  EXPECT_EQ(replayed.back(), batches - 1);
  uint64_t lost_events = 0, kept_bytes = 0, largest = 0;
  for (uint64_t i = 0; i < batches; ++i) {
    const uint64_t n = sent[i]->value.array[3].array.size();
    const uint64_t body = sent[i]->raw.size();
    if (i < lost) {
      lost_events += n;
    } else {
      kept_bytes += body;
    }
    largest = std::max(largest, body);
  }
  // What the bound holds, and not much less: the buffer lays its entries
  // out in a ring, so at most the room of about two entries goes unused
  // (with six whole batches: two or three dropped).
  EXPECT_LE(kept_bytes, TM_MIN_REPLAY_BYTES);
  EXPECT_GE(kept_bytes + 2 * largest, TM_MIN_REPLAY_BYTES);
  EXPECT_EQ(before[TM_STAT_EVENTS_DROPPED], lost_events);
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], lost_events);
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], kFlushes * kPerFlush);
  EXPECT_EQ(s[TM_STAT_BATCHES_REPLAYED], kept);
  // The replays carry the dropped_total of now.
  for (const Frame* b : BatchesOf(conns[1])) {
    EXPECT_EQ(b->value.array[2].uint, lost_events);
  }
}

// A kept batch the daemon refuses each time (a BATCH over a limit it was
// started with: --max-batch-events below the client's batch) is replayed
// until kMaxReplayRefusals connections in a row ended on it, then dropped
// and counted, and the batches after it go on; without this the client
// would replay it forever and deliver nothing more.
TEST_F(AckTest, ABatchTheDaemonKeepsRefusingIsDroppedAndTheRestGoesOn) {
  StartServer();
  server_->SetMaxBatchEvents(4);
  NewClient(AckOptions().get());
  PushBatch(2, 1);  // seq 0: applied and acked
  PushBatch(6, 3);  // seq 1: over the limit, refused
  // seq 2, behind it (the flush may find the client reconnecting).
  ASSERT_EQ(tm_tokens(client_, 1009, 1, 9), TM_OK);
  tm_client_flush(client_, 5000);
  ASSERT_TRUE(server_->WaitUntil([](const TestServer::Connections& c) {
    for (const Connection& conn : c) {
      for (uint64_t seq : conn.acked) {
        if (seq == 2) return true;
      }
    }
    return false;
  }));
  StatsArray s;
  ASSERT_EQ(CloseClient(&s), TM_OK);
  const TestServer::Connections conns = server_->Snapshot();
  size_t with_seq1 = 0;
  for (const Connection& c : conns) {
    for (uint64_t seq : SeqsOf(c)) with_seq1 += seq == 1;
    for (uint64_t seq : c.acked) EXPECT_NE(seq, 1u);
  }
  // Written once, then replayed on the kMaxReplayRefusals connections that
  // ended on it.
  EXPECT_EQ(with_seq1, 1u + 3u);
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 6u);
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], 9u);
  EXPECT_EQ(s[TM_STAT_EVENTS_UNACKED], 0u);
}

TEST_F(AckTest, CloseWaitsForTheLastAck) {
  StartServer();
  server_->SetAcking(false);
  NewClient(AckOptions(5000).get());
  PushBatch(2, 1);
  PushBatch(2, 3);
  ASSERT_TRUE(WaitForEvents(4));
  // The daemon acks both batches only 300 ms later (as after a snapshot):
  // one ACK for the last covers both.
  std::thread acker([this] {
    std::this_thread::sleep_for(milliseconds(300));
    server_->Send(0, AckFrame(1));
  });
  const Clock::time_point start = Clock::now();
  StatsArray s;
  const int rc = CloseClient(&s);
  const auto took = Clock::now() - start;
  acker.join();
  EXPECT_EQ(rc, TM_OK);
  EXPECT_GE(took, milliseconds(290));
  EXPECT_LT(took, milliseconds(4000));
  EXPECT_EQ(s[TM_STAT_EVENTS_UNACKED], 0u);
  ASSERT_TRUE(WaitForEof(0));
  EXPECT_EQ(server_->Snapshot()[0].frames.back().value.ToString(), "[2]");
}

TEST_F(AckTest, CloseGivesUpAtItsTimeoutAndCountsTheUnackedEvents) {
  StartServer();
  server_->SetAcking(false);
  NewClient(AckOptions(300).get());
  PushBatch(3, 1);
  PushBatch(2, 4);
  const Clock::time_point start = Clock::now();
  StatsArray s;
  EXPECT_EQ(CloseClient(&s), TM_E_TIMEOUT);
  EXPECT_GE(Clock::now() - start, milliseconds(290));
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], 5u);
  EXPECT_EQ(s[TM_STAT_EVENTS_UNACKED], 5u);
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 0u);  // delivered, not dropped
  ASSERT_TRUE(WaitForEof(0));
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_TRUE(IsWellFormed(conns[0]));
  EXPECT_EQ(conns[0].frames.back().value.ToString(), "[2]");
}

TEST_F(AckTest, PartialAckReleasesOnlyWhatItCovers) {
  StartServer();
  server_->SetAcking(false);
  NewClient(AckOptions(300).get());
  PushBatch(3, 1);  // seq 0
  PushBatch(2, 4);  // seq 1
  ASSERT_TRUE(WaitForEvents(5));
  server_->Send(0, AckFrame(0));
  StatsArray s;
  EXPECT_EQ(CloseClient(&s), TM_E_TIMEOUT);
  EXPECT_EQ(s[TM_STAT_EVENTS_UNACKED], 2u);  // seq 1's
}

TEST_F(AckTest, AMalformedAckClosesTheConnectionAndTheClientReconnects) {
  StartServer();
  NewClient(AckOptions().get());
  PushBatch(1, 1);
  ASSERT_TRUE(WaitForEvents(1));
  server_->Send(0, {0x92, 0x03, 0xff});  // [3, -1]
  ASSERT_TRUE(WaitForEof(0));
  ASSERT_TRUE(WaitForSecondHello());
  PushBatch(1, 2);
  StatsArray s;
  ASSERT_EQ(CloseClient(&s), TM_OK);
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 2u);
  ASSERT_TRUE(IsWellFormed(conns[1]));
  EXPECT_EQ(SeqsOf(conns[1]), (std::vector<uint64_t>{1}));  // 0 was acked
  EXPECT_EQ(s[TM_STAT_RECONNECTS], 1u);
  EXPECT_EQ(s[TM_STAT_BATCHES_REPLAYED], 0u);
}

// ---- ACK at HELLO (protocol 1.2): which daemon acks ----------------------

// The case: a daemon of protocol 1.0 (no answer to HELLO, no ACK)
// drops the first connection after 200 batches. The client must not send
// any of them again: the daemon applied them, and would apply them twice.
TEST_F(AckTest, DoesNotReplayToADaemonThatNeverAnswersHello) {
  StartServer();
  server_->SetAcking(false);
  server_->SetAnswering(false);
  server_->DropAfterBatches(0, 200);
  NewClient(AckOptions().get());
  constexpr uint32_t kPerBatch = 10;
  constexpr uint32_t kBatches = 400;
  for (uint32_t b = 0; b < kBatches; ++b) {
    for (uint32_t i = 0; i < kPerBatch; ++i) {
      ASSERT_EQ(tm_tokens(client_, 1000 + b * kPerBatch + i, b, 1), TM_OK);
    }
    // TM_E_DISCONNECTED while the client reconnects: the events wait.
    const int rc = tm_client_flush(client_, 5000);
    ASSERT_TRUE(rc == TM_OK || rc == TM_E_DISCONNECTED) << rc;
  }
  StatsArray s;
  EXPECT_EQ(CloseClient(&s), TM_OK);
  ASSERT_TRUE(WaitForAllEof());
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_GE(conns.size(), 2u);
  EXPECT_TRUE(conns[0].dropped);
  for (const Connection& c : conns) EXPECT_FALSE(c.answered);
  // What the daemon applied is what the engine reported, once.
  EXPECT_EQ(CountEvents(conns), size_t{kBatches} * kPerBatch);
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], uint64_t{kBatches} * kPerBatch);
  EXPECT_EQ(s[TM_STAT_BATCHES_REPLAYED], 0u);
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 0u);
  EXPECT_EQ(s[TM_STAT_EVENTS_UNACKED], 0u);
  EXPECT_GE(s[TM_STAT_RECONNECTS], 1u);
  // Each seq once, in order, across the connections (while the client
  // reconnects, the events of several flushes make one batch).
  std::vector<uint64_t> seqs;
  for (const Connection& c : conns) {
    ASSERT_TRUE(IsWellFormed(c));
    for (uint64_t seq : SeqsOf(c)) seqs.push_back(seq);
  }
  EXPECT_GE(seqs.size(), 201u);
  EXPECT_EQ(seqs.size(), s[TM_STAT_BATCHES_SENT]);
  for (uint64_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(seqs[i], i);
}

// What was kept for a daemon that turned out not to ack is counted as
// discarded, not dropped; past the wait nothing more is kept on that
// connection, and nothing kept reaches the next one.
TEST_F(AckTest, KeepsNothingForADaemonThatDoesNotAnswerAndCountsTheDiscarded) {
  StartServer();
  server_->SetAcking(false);
  server_->SetAnswering(false);
  NewClient(AckOptions().get());
  const Clock::time_point start = Clock::now();
  PushBatch(2, 1);  // seq 0: kept while the answer is awaited
  ASSERT_TRUE(
      PollUntil([this] { return Stats()[TM_STAT_EVENTS_DISCARDED] == 2; }));
  // The bound: not before 1 s after connecting (it connected after start).
  EXPECT_GE(Clock::now() - start, milliseconds(990));
  PushBatch(3, 3);  // seq 1: not kept
  ASSERT_TRUE(WaitForEvents(5));
  server_->Drop(0);
  ASSERT_TRUE(WaitForSecondHello());
  PushBatch(1, 6);  // seq 2, on a connection awaiting its answer again
  StatsArray s;
  ASSERT_EQ(CloseClient(&s), TM_OK);
  ASSERT_TRUE(WaitForAllEof());
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 2u);
  EXPECT_EQ(SeqsOf(conns[0]), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(SeqsOf(conns[1]), (std::vector<uint64_t>{2}));
  EXPECT_EQ(CountEvents(conns), 6u);
  // Seq 0's two events and seq 2's one (its connection did not answer
  // either); seq 1 was never kept.
  EXPECT_EQ(s[TM_STAT_EVENTS_DISCARDED], 3u);
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], 6u);
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 0u);
  EXPECT_EQ(s[TM_STAT_EVENTS_UNACKED], 0u);
  EXPECT_EQ(s[TM_STAT_BATCHES_REPLAYED], 0u);
}

// A daemon that acks answers HELLO with the highest seq it applied of the
// session: the client replays only the batches above it, and only after
// the answer; a batch made meanwhile waits behind them.
TEST_F(AckTest, ReplaysOnlyTheBatchesAboveTheAnswersSeqAfterTheAnswer) {
  StartServer();
  server_->SetAcking(false);  // applied but not acked (a lost ACK)
  NewClient(AckOptions().get());
  PushBatch(1, 1);  // seq 0
  PushBatch(1, 2);  // seq 1
  PushBatch(1, 3);  // seq 2
  PushBatch(1, 4);  // seq 3
  ASSERT_TRUE(WaitForEvents(4));
  server_->SetAnswering(false);  // the test answers the next HELLO itself
  server_->SetAcking(true);
  server_->Drop(0);
  ASSERT_TRUE(WaitForSecondHello());
  ASSERT_EQ(tm_tokens(client_, 1005, 1, 5), TM_OK);  // seq 4, not flushed
  server_->Send(1, AckFrame(1));                     // "I applied up to seq 1"
  ASSERT_TRUE(server_->WaitUntil(
      [](const TestServer::Connections& c) { return c[1].batches >= 3; }));
  StatsArray s;
  ASSERT_EQ(CloseClient(&s), TM_OK);
  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_TRUE(IsWellFormed(conns[1]));
  EXPECT_EQ(SeqsOf(conns[0]), (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(SeqsOf(conns[1]), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(s[TM_STAT_BATCHES_REPLAYED], 2u);
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], 5u);
  EXPECT_EQ(s[TM_STAT_EVENTS_DISCARDED], 0u);
  EXPECT_EQ(s[TM_STAT_EVENTS_UNACKED], 0u);
}

// [3, nil]: the daemon applied nothing of the session; all is replayed.
TEST_F(AckTest, ReplaysEverythingKeptAfterANilAnswer) {
  StartServer();
  server_->SetAcking(false);
  NewClient(AckOptions().get());
  PushBatch(2, 1);  // seq 0
  ASSERT_TRUE(WaitForEvents(2));
  server_->SetAcking(true);
  server_->Drop(0);
  ASSERT_TRUE(server_->WaitUntil([](const TestServer::Connections& c) {
    return c.size() == 2 && c[1].acked.size() == 1;
  }));
  StatsArray s;
  ASSERT_EQ(CloseClient(&s), TM_OK);
  const TestServer::Connections conns = server_->Snapshot();
  EXPECT_TRUE(conns[1].answered);
  EXPECT_FALSE(conns[1].answer.has_value());  // it never acked seq 0
  EXPECT_EQ(SeqsOf(conns[1]), (std::vector<uint64_t>{0}));
  EXPECT_EQ(s[TM_STAT_BATCHES_REPLAYED], 1u);
  EXPECT_EQ(s[TM_STAT_EVENTS_DISCARDED], 0u);
}

}  // namespace
}  // namespace tokenmeter::testing
