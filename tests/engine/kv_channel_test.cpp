// The disaggregated hand-over: KvChannel's messages, and the KV bytes moved
// from one CPU model's cache into another's, byte for byte.
#include "engine/kv_channel.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "engine/model.h"

namespace tokenmeter::engine {
namespace {

// Two connected channels.
struct Pair {
  Pair() {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) std::abort();
    a = std::make_unique<KvChannel>(fds[0]);
    b = std::make_unique<KvChannel>(fds[1]);
    raw_b = fds[1];
  }
  // Moves a's output to b and returns b's next message.
  KvMessage Deliver() {
    EXPECT_TRUE(a->Flush().ok());
    KvMessage m;
    const Status s = b->Receive(&m);
    EXPECT_TRUE(s.ok()) << s.message();
    return m;
  }
  std::unique_ptr<KvChannel> a, b;
  int raw_b = -1;
};

TEST(KvChannelTest, RoundTripsEveryMessage) {
  Pair p;
  KvHandoff h;
  h.rid = 42;
  h.max_tokens = 77;
  h.priority = -3;
  h.has_priority = true;
  h.lora = 2;
  h.tenant = 1;
  h.sampling_seed = 0x1234567890abcdefULL;
  h.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  h.prompt = {5, 6, 7, 255};
  p.a->SendHandoff(h);
  KvMessage m = p.Deliver();
  ASSERT_EQ(m.type, KvMsgType::kHandoff);
  EXPECT_EQ(m.handoff.rid, 42u);
  EXPECT_EQ(m.handoff.max_tokens, 77u);
  EXPECT_EQ(m.handoff.priority, -3);
  EXPECT_TRUE(m.handoff.has_priority);
  EXPECT_EQ(m.handoff.lora, 2);
  EXPECT_EQ(m.handoff.tenant, 1);
  EXPECT_EQ(m.handoff.sampling_seed, h.sampling_seed);
  EXPECT_EQ(m.handoff.traceparent, h.traceparent);
  EXPECT_EQ(m.handoff.prompt, h.prompt);

  p.a->SendPull({9, 2, 3, 4});
  m = p.Deliver();
  ASSERT_EQ(m.type, KvMsgType::kPull);
  EXPECT_EQ(m.pull.rid, 9u);
  EXPECT_EQ(m.pull.attempt, 2u);
  EXPECT_EQ(m.pull.first_block, 3u);
  EXPECT_EQ(m.pull.num_blocks, 4u);

  std::vector<float> data(1000);
  std::iota(data.begin(), data.end(), -3.25f);
  const uint64_t sum = KvChecksum(data.data(), data.size() * sizeof(float));
  p.a->SendKv({9, 2, 3, 4}, data.data(), data.size(), sum);
  m = p.Deliver();
  ASSERT_EQ(m.type, KvMsgType::kKv);
  EXPECT_EQ(m.kv.rid, 9u);
  EXPECT_EQ(m.kv.attempt, 2u);
  EXPECT_EQ(m.kv.first_block, 3u);
  EXPECT_EQ(m.kv.num_blocks, 4u);
  EXPECT_EQ(m.kv.checksum, sum);
  ASSERT_EQ(m.kv.data.size(), data.size());
  EXPECT_EQ(std::memcmp(m.kv.data.data(), data.data(), 4000), 0);

  p.a->SendAck({9, 2, false, true, "checksum"});
  m = p.Deliver();
  ASSERT_EQ(m.type, KvMsgType::kAck);
  EXPECT_EQ(m.ack.rid, 9u);
  EXPECT_EQ(m.ack.attempt, 2u);
  EXPECT_FALSE(m.ack.ok);
  EXPECT_TRUE(m.ack.retry);
  EXPECT_EQ(m.ack.reason, "checksum");

  p.a->SendEnd();
  EXPECT_EQ(p.Deliver().type, KvMsgType::kEnd);
  p.a->SendReport("{\"requests\": 1}");
  m = p.Deliver();
  ASSERT_EQ(m.type, KvMsgType::kReport);
  EXPECT_EQ(m.text, "{\"requests\": 1}");
  EXPECT_EQ(p.a->bytes_sent(), p.b->bytes_received());
}

// A message larger than the socket buffers goes through Pump() and Next()
// piece by piece, both sides non-blocking.
TEST(KvChannelTest, MovesAMessageLargerThanTheSocketBuffer) {
  Pair p;
  std::vector<float> data(size_t(4) << 20);  // 16 MiB
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i % 9973) * 0.5f;
  const uint64_t sum = KvChecksum(data.data(), data.size() * sizeof(float));
  p.a->SendKv({1, 1, 0, 7}, data.data(), data.size(), sum);
  KvMessage m;
  bool got = false;
  for (int i = 0; i < 100000 && !got; ++i) {
    ASSERT_TRUE(p.a->Pump().ok());
    ASSERT_TRUE(p.b->Pump().ok());
    ASSERT_TRUE(p.b->Next(&m, &got).ok());
  }
  ASSERT_TRUE(got);
  EXPECT_EQ(p.a->pending_out(), 0u);
  ASSERT_EQ(m.kv.data.size(), data.size());
  EXPECT_EQ(KvChecksum(m.kv.data.data(), m.kv.data.size() * sizeof(float)),
            sum);
}

TEST(KvChannelTest, ChecksumSeesOneFlippedBit) {
  std::vector<float> data(4096, 1.0f);
  const uint64_t sum = KvChecksum(data.data(), data.size() * sizeof(float));
  EXPECT_EQ(KvChecksum(data.data(), data.size() * sizeof(float)), sum);
  for (size_t byte : {size_t(0), size_t(7), size_t(8191), size_t(16383)}) {
    std::vector<float> copy = data;
    reinterpret_cast<uint8_t*>(copy.data())[byte] ^= 0x10;
    EXPECT_NE(KvChecksum(copy.data(), copy.size() * sizeof(float)), sum)
        << byte;
  }
  // The length counts too (trailing bytes, not only words).
  EXPECT_NE(KvChecksum(data.data(), 13), KvChecksum(data.data(), 14));
}

// Raw frames written to b's peer socket: each broken one is an error.
TEST(KvChannelTest, RejectsMalformedFrames) {
  struct Case {
    const char* what;
    std::vector<uint8_t> bytes;
  };
  auto frame = [](uint32_t len, uint8_t type, std::vector<uint8_t> body) {
    std::vector<uint8_t> f(4);
    std::memcpy(f.data(), &len, 4);
    f.push_back(type);
    f.insert(f.end(), body.begin(), body.end());
    return f;
  };
  const Case cases[] = {
      {"zero length", {0, 0, 0, 0, 1}},
      {"over the cap", {0xff, 0xff, 0xff, 0xff, 1}},
      {"unknown type", frame(1, 99, {})},
      {"short pull", frame(5, uint8_t(KvMsgType::kPull), {1, 2, 3, 4})},
      {"long end", frame(2, uint8_t(KvMsgType::kEnd), {0})},
      // A KV frame whose float count runs past its body.
      {"kv past its body",
       frame(37, uint8_t(KvMsgType::kKv),
             {1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0,
              0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0})},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    KvChannel ch(fds[0]);
    ASSERT_EQ(write(fds[1], c.bytes.data(), c.bytes.size()),
              ssize_t(c.bytes.size()));
    ASSERT_TRUE(ch.Pump().ok());
    KvMessage m;
    bool got = true;
    const Status s = ch.Next(&m, &got);
    EXPECT_FALSE(s.ok());
    EXPECT_FALSE(got);
    EXPECT_NE(s.message().find("KV channel"), std::string::npos);
    close(fds[1]);
  }
}

TEST(KvChannelTest, ReceiveFailsWhenThePeerCloses) {
  Pair p;
  p.a->SendEnd();
  ASSERT_TRUE(p.a->Flush().ok());
  p.a.reset();  // closes
  KvMessage m;
  ASSERT_TRUE(p.b->Receive(&m).ok());  // what came before the close
  EXPECT_EQ(m.type, KvMsgType::kEnd);
  const Status s = p.b->Receive(&m);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(p.b->closed());
  // Writing to a closed peer fails without SIGPIPE.
  p.b->SendEnd();
  EXPECT_FALSE(p.b->Flush().ok());
}

// The hand-over as the two processes do it: model A (prefill) computes a
// prompt; the K/V of all but its last position go through the channel into
// other blocks of model B (decode), which computes the last prompt token
// itself. B's cache then holds A's bytes exactly, and B's logits for the
// first output token equal A's bit for bit.
TEST(KvHandoverTest, MovesTheKvCacheByteForByte) {
  ModelConfig c;
  ASSERT_TRUE(ModelConfigForSize("tiny", &c));
  c.seed = 7;
  const KvLayout layout{32, 8};
  std::unique_ptr<Weights> w = MakeWeights(c);
  std::unique_ptr<Model> a = MakeCpuModel(*w, layout);
  std::unique_ptr<Model> b = MakeCpuModel(*w, layout);
  std::vector<int32_t> prompt(37);
  for (size_t i = 0; i < prompt.size(); ++i) {
    prompt[i] = int32_t(1 + (i * 37) % (c.vocab - 1));
  }
  const uint32_t n = uint32_t(prompt.size());
  const int32_t blocks_a[] = {9, 3, 20, 14, 5};  // 5 blocks: 40 positions
  const int32_t blocks_b[] = {0, 31, 2, 17, 6};
  // Something else in B's blocks first, so a copy that missed a byte shows.
  std::vector<float> noise(5 * KvBlockBytes(c, layout) / sizeof(float), 3.5f);
  ASSERT_TRUE(b->WriteKvBlocks(blocks_b, 5, noise.data()).ok());

  SeqChunk ch;
  ch.tokens = prompt.data();
  ch.num_tokens = n;
  ch.block_table = blocks_a;
  ch.num_blocks = 5;
  ch.want_logits = true;
  std::vector<float> logits_a(c.vocab), logits_b(c.vocab);
  ASSERT_TRUE(a->Forward({ch}, logits_a.data()).ok());

  // Positions 0..n-2 live in blocks 0..4 (36 positions: 4.5 blocks).
  const uint32_t pulled = (n - 1 + layout.block_size - 1) / layout.block_size;
  ASSERT_EQ(pulled, 5u);
  const size_t floats = pulled * KvBlockBytes(c, layout) / sizeof(float);
  std::vector<float> sent(floats);
  ASSERT_TRUE(a->ReadKvBlocks(blocks_a, pulled, sent.data()).ok());
  Pair p;
  p.a->SendKv({1, 1, 0, pulled}, sent.data(), floats,
              KvChecksum(sent.data(), floats * sizeof(float)));
  KvMessage m = p.Deliver();
  ASSERT_EQ(m.kv.data.size(), floats);
  ASSERT_EQ(KvChecksum(m.kv.data.data(), floats * sizeof(float)),
            m.kv.checksum);
  ASSERT_TRUE(b->WriteKvBlocks(blocks_b, pulled, m.kv.data.data()).ok());
  std::vector<float> landed(floats);
  ASSERT_TRUE(b->ReadKvBlocks(blocks_b, pulled, landed.data()).ok());
  EXPECT_EQ(std::memcmp(landed.data(), sent.data(), floats * sizeof(float)), 0);

  // B computes the last prompt token over the received K/V.
  SeqChunk last;
  last.tokens = &prompt[n - 1];
  last.num_tokens = 1;
  last.start_pos = n - 1;
  last.block_table = blocks_b;
  last.num_blocks = 5;
  last.want_logits = true;
  ASSERT_TRUE(b->Forward({last}, logits_b.data()).ok());
  EXPECT_EQ(
      std::memcmp(logits_a.data(), logits_b.data(), c.vocab * sizeof(float)),
      0);

  // Control: without the transfer (B's blocks hold noise) the logits
  // differ, so the comparison above can fail.
  std::unique_ptr<Model> fresh = MakeCpuModel(*w, layout);
  ASSERT_TRUE(fresh->WriteKvBlocks(blocks_b, 5, noise.data()).ok());
  std::vector<float> logits_c(c.vocab);
  ASSERT_TRUE(fresh->Forward({last}, logits_c.data()).ok());
  EXPECT_NE(
      std::memcmp(logits_a.data(), logits_c.data(), c.vocab * sizeof(float)),
      0);
}

TEST(KvHandoverTest, ReleasedCacheRefusesWorkUntilRestoredZeroed) {
  ModelConfig c;
  ASSERT_TRUE(ModelConfigForSize("tiny", &c));
  const KvLayout layout{8, 4};
  std::unique_ptr<Weights> w = MakeWeights(c);
  std::unique_ptr<Model> m = MakeCpuModel(*w, layout);
  const int32_t blocks[] = {1};
  const size_t floats = KvBlockBytes(c, layout) / sizeof(float);
  std::vector<float> ones(floats, 1.0f), back(floats, 9.0f);
  ASSERT_TRUE(m->WriteKvBlocks(blocks, 1, ones.data()).ok());
  EXPECT_TRUE(m->kv_cache_resident());
  ASSERT_TRUE(m->ReleaseKvCache().ok());
  EXPECT_FALSE(m->kv_cache_resident());
  EXPECT_FALSE(m->ReadKvBlocks(blocks, 1, back.data()).ok());
  EXPECT_FALSE(m->WriteKvBlocks(blocks, 1, ones.data()).ok());
  const int32_t tok = 3;
  SeqChunk ch;
  ch.tokens = &tok;
  ch.num_tokens = 1;
  ch.block_table = blocks;
  ch.num_blocks = 1;
  ch.want_logits = true;
  std::vector<float> logits(c.vocab);
  EXPECT_FALSE(m->Forward({ch}, logits.data()).ok());
  ASSERT_TRUE(m->RestoreKvCache().ok());
  ASSERT_TRUE(m->RestoreKvCache().ok());  // idempotent
  ASSERT_TRUE(m->ReadKvBlocks(blocks, 1, back.data()).ok());
  EXPECT_EQ(back, std::vector<float>(floats, 0.0f));
  EXPECT_TRUE(m->Forward({ch}, logits.data()).ok());
}

}  // namespace
}  // namespace tokenmeter::engine
