// The CPU model computes each row with the same operations whatever the
// batch, chunking, block placement or prefix-cache reuse around it, so these
// tests ask for bit-identical logits.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "engine/model.h"
#include "engine/rng.h"

namespace tokenmeter::engine {
namespace {

constexpr uint32_t kBlockSize = 4;

class ModelCpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ModelConfigForSize("tiny", &config_));
    config_.seed = 3;
    weights_ = MakeWeights(config_);
  }
  std::unique_ptr<Model> NewModel() {
    return MakeCpuModel(*weights_, KvLayout{64, kBlockSize});
  }
  std::vector<int32_t> Prompt(size_t n, uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> t(n);
    for (auto& x : t) x = int32_t(rng.UniformInt(1, config_.vocab - 1));
    return t;
  }
  // Feeds `tokens` in chunks of `chunk` through `model` with the given block
  // table; returns the logits after the last token.
  std::vector<float> Run(Model& model, const std::vector<int32_t>& tokens,
                         const std::vector<int32_t>& table, uint32_t chunk,
                         uint32_t start = 0) {
    std::vector<float> logits(config_.vocab);
    for (uint32_t pos = start; pos < tokens.size(); pos += chunk) {
      SeqChunk c;
      c.tokens = tokens.data() + pos;
      c.num_tokens = std::min<uint32_t>(chunk, uint32_t(tokens.size()) - pos);
      c.start_pos = pos;
      c.block_table = table.data();
      c.num_blocks = uint32_t(table.size());
      c.want_logits = pos + c.num_tokens == tokens.size();
      EXPECT_TRUE(model.Forward({c}, logits.data()).ok());
    }
    return logits;
  }
  static std::vector<int32_t> Table(int32_t first, size_t n) {
    std::vector<int32_t> t(n);
    std::iota(t.begin(), t.end(), first);
    return t;
  }

  ModelConfig config_;
  std::unique_ptr<Weights> weights_;
};

TEST_F(ModelCpuTest, LogitsAreFiniteAndDependOnTheInput) {
  auto m = NewModel();
  const auto a = Run(*m, Prompt(9, 1), Table(0, 3), 9);
  const auto b = Run(*m, Prompt(9, 2), Table(3, 3), 9);
  double spread = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i]));
    spread += std::fabs(a[i] - b[i]);
  }
  EXPECT_GT(spread, 1.0);
}

TEST_F(ModelCpuTest, ChunkedPrefillAndDecodeMatchOneShotPrefill) {
  const auto prompt = Prompt(23, 5);
  auto one = NewModel();
  auto chunked = NewModel();
  auto decode = NewModel();
  const auto a = Run(*one, prompt, Table(0, 6), 23);
  const auto b = Run(*chunked, prompt, Table(0, 6), 5);
  const auto c = Run(*decode, prompt, Table(0, 6), 1);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
}

TEST_F(ModelCpuTest, BlockPlacementDoesNotMatter) {
  const auto prompt = Prompt(15, 6);
  auto m1 = NewModel();
  auto m2 = NewModel();
  const auto a = Run(*m1, prompt, {0, 1, 2, 3}, 4);
  const auto b = Run(*m2, prompt, {40, 7, 33, 12}, 4);
  EXPECT_EQ(a, b);
}

TEST_F(ModelCpuTest, BatchingDoesNotChangeASequencesLogits) {
  const auto p1 = Prompt(10, 7), p2 = Prompt(13, 8);
  auto alone1 = NewModel();
  auto alone2 = NewModel();
  const auto a1 = Run(*alone1, p1, Table(0, 3), 10);
  const auto a2 = Run(*alone2, p2, Table(0, 4), 13);

  auto batched = NewModel();
  const auto t1 = Table(0, 3), t2 = Table(10, 4);
  SeqChunk c1{p1.data(), 10, 0, t1.data(), 3, true};
  SeqChunk c2{p2.data(), 13, 0, t2.data(), 4, true};
  std::vector<float> logits(2 * config_.vocab);
  ASSERT_TRUE(batched->Forward({c1, c2}, logits.data()).ok());
  EXPECT_EQ(std::vector<float>(logits.begin(), logits.begin() + config_.vocab),
            a1);
  EXPECT_EQ(std::vector<float>(logits.begin() + config_.vocab, logits.end()),
            a2);
}

TEST_F(ModelCpuTest, ReusingCachedPrefixBlocksMatchesRecomputing) {
  // Two prompts sharing their first two blocks (8 tokens).
  auto p1 = Prompt(12, 9);
  auto p2 = p1;
  const auto tail = Prompt(5, 10);
  p2.resize(8);
  p2.insert(p2.end(), tail.begin(), tail.end());

  auto shared = NewModel();
  Run(*shared, p1, {0, 1, 2}, 12);
  // p2 reuses blocks 0 and 1 (written by p1) and computes from position 8.
  const auto reused = Run(*shared, p2, {0, 1, 5, 6}, 13, 8);

  auto fresh = NewModel();
  const auto full = Run(*fresh, p2, {0, 1, 2, 3}, 13);
  EXPECT_EQ(reused, full);
}

TEST_F(ModelCpuTest, WantLogitsSelectsTheRows) {
  const auto p1 = Prompt(4, 11), p2 = Prompt(4, 12);
  auto m = NewModel();
  const auto t1 = Table(0, 1), t2 = Table(1, 1);
  SeqChunk c1{p1.data(), 4, 0, t1.data(), 1, false};
  SeqChunk c2{p2.data(), 4, 0, t2.data(), 1, true};
  std::vector<float> logits(config_.vocab, -12345.0f);
  ASSERT_TRUE(m->Forward({c1, c2}, logits.data()).ok());
  auto alone = NewModel();
  EXPECT_EQ(logits, Run(*alone, p2, Table(1, 1), 4));
}

TEST_F(ModelCpuTest, ValidatesConfigurations) {
  KvLayout kv{64, 16};
  EXPECT_TRUE(ValidateModel(config_, kv).ok());
  ModelConfig bad = config_;
  bad.n_heads = 3;
  EXPECT_FALSE(ValidateModel(bad, kv).ok());
  bad = config_;
  bad.n_heads = 16;  // head_dim 4
  EXPECT_FALSE(ValidateModel(bad, kv).ok());
  EXPECT_FALSE(ValidateModel(config_, KvLayout{0, 16}).ok());
  for (const char* size : {"tiny", "small", "medium", "large"}) {
    ModelConfig c;
    ASSERT_TRUE(ModelConfigForSize(size, &c)) << size;
    EXPECT_TRUE(ValidateModel(c, kv).ok()) << size;
  }
  ModelConfig c;
  EXPECT_FALSE(ModelConfigForSize("huge", &c));
}

TEST_F(ModelCpuTest, SameSeedSameWeights) {
  const auto again = MakeWeights(config_);
  EXPECT_EQ(again->embed, weights_->embed);
  EXPECT_EQ(again->layers[1].w_down, weights_->layers[1].w_down);
  ModelConfig other = config_;
  other.seed = 4;
  EXPECT_NE(MakeWeights(other)->embed, weights_->embed);
}

}  // namespace
}  // namespace tokenmeter::engine
