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
constexpr uint32_t kRank = 8;

class ModelCpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ModelConfigForSize("tiny", &config_));
    config_.seed = 3;
    weights_ = MakeWeights(config_);
  }
  std::unique_ptr<Model> NewModel(uint32_t lora_slots = 0) {
    return MakeCpuModel(*weights_, KvLayout{64, kBlockSize},
                        LoraLayout{lora_slots, kRank});
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
                         uint32_t start = 0, int32_t lora_slot = -1) {
    std::vector<float> logits(config_.vocab);
    for (uint32_t pos = start; pos < tokens.size(); pos += chunk) {
      SeqChunk c;
      c.tokens = tokens.data() + pos;
      c.num_tokens = std::min<uint32_t>(chunk, uint32_t(tokens.size()) - pos);
      c.start_pos = pos;
      c.block_table = table.data();
      c.num_blocks = uint32_t(table.size());
      c.want_logits = pos + c.num_tokens == tokens.size();
      c.lora_slot = lora_slot;
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

static double MeanAbsDiff(const std::vector<float>& a,
                          const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::fabs(a[i] - b[i]);
  return sum / double(a.size());
}

TEST_F(ModelCpuTest, AnAdapterChangesTheLogits) {
  const auto prompt = Prompt(11, 21);
  auto m = NewModel(1);
  ASSERT_TRUE(m->LoadLora(0, MakeLoraAdapter(config_, kRank, 0)).ok());
  const auto base = Run(*m, prompt, Table(0, 3), 11);
  const auto adapted = Run(*m, prompt, Table(3, 3), 11, 0, /*lora_slot=*/0);
  for (float x : adapted) ASSERT_TRUE(std::isfinite(x));
  // A real change, of the order of the logits' own spread, not noise.
  const double scale = MeanAbsDiff(base, std::vector<float>(base.size(), 0));
  EXPECT_GT(MeanAbsDiff(base, adapted), 0.05 * scale);
  EXPECT_LT(MeanAbsDiff(base, adapted), 2.0 * scale);
  // The base rows of a model with adapters are the base model's.
  auto plain = NewModel();
  EXPECT_EQ(base, Run(*plain, prompt, Table(0, 3), 11));
}

TEST_F(ModelCpuTest, TheSlotsContentIsWhatCounts) {
  const auto prompt = Prompt(9, 22);
  auto m = NewModel(2);
  const LoraAdapter a0 = MakeLoraAdapter(config_, kRank, 0);
  const LoraAdapter a1 = MakeLoraAdapter(config_, kRank, 1);
  // A slot never loaded adds nothing.
  const auto base = Run(*m, prompt, Table(0, 3), 9);
  EXPECT_EQ(Run(*m, prompt, Table(3, 3), 9, 0, 1), base);
  ASSERT_TRUE(m->LoadLora(0, a0).ok());
  ASSERT_TRUE(m->LoadLora(1, a1).ok());
  const auto with0 = Run(*m, prompt, Table(6, 3), 9, 0, 0);
  const auto with1 = Run(*m, prompt, Table(9, 3), 9, 0, 1);
  EXPECT_NE(with0, with1);
  EXPECT_NE(with0, base);
  // Slot 1 reloaded with adapter 0 computes what slot 0 does.
  ASSERT_TRUE(m->LoadLora(1, a0).ok());
  EXPECT_EQ(Run(*m, prompt, Table(12, 3), 9, 0, 1), with0);
  // And the same adapter on another model gives the same logits.
  auto other = NewModel(3);
  ASSERT_TRUE(other->LoadLora(2, a0).ok());
  EXPECT_EQ(Run(*other, prompt, Table(0, 3), 9, 0, 2), with0);
}

TEST_F(ModelCpuTest, AdaptersKeepBatchingAndChunkingInvariance) {
  const auto p1 = Prompt(10, 23), p2 = Prompt(13, 24), p3 = Prompt(6, 25);
  auto load = [&](Model& m) {
    ASSERT_TRUE(m.LoadLora(0, MakeLoraAdapter(config_, kRank, 3)).ok());
    ASSERT_TRUE(m.LoadLora(1, MakeLoraAdapter(config_, kRank, 4)).ok());
  };
  auto alone = NewModel(2);
  load(*alone);
  const auto a1 = Run(*alone, p1, Table(0, 3), 10, 0, 0);
  const auto a2 = Run(*alone, p2, Table(3, 4), 13, 0, -1);
  const auto a3 = Run(*alone, p3, Table(7, 2), 6, 0, 1);
  // Chunked prefill and decode with the adapter: the same logits.
  EXPECT_EQ(Run(*alone, p1, Table(9, 3), 3, 0, 0), a1);
  EXPECT_EQ(Run(*alone, p1, Table(12, 3), 1, 0, 0), a1);

  auto batched = NewModel(2);
  load(*batched);
  const auto t1 = Table(0, 3), t2 = Table(10, 4), t3 = Table(20, 2);
  SeqChunk c1{p1.data(), 10, 0, t1.data(), 3, true, 0};
  SeqChunk c2{p2.data(), 13, 0, t2.data(), 4, true, -1};
  SeqChunk c3{p3.data(), 6, 0, t3.data(), 2, true, 1};
  std::vector<float> logits(3 * config_.vocab);
  ASSERT_TRUE(batched->Forward({c1, c2, c3}, logits.data()).ok());
  const auto row = [&](size_t r) {
    return std::vector<float>(logits.begin() + r * config_.vocab,
                              logits.begin() + (r + 1) * config_.vocab);
  };
  EXPECT_EQ(row(0), a1);
  EXPECT_EQ(row(1), a2);
  EXPECT_EQ(row(2), a3);
}

TEST_F(ModelCpuTest, LoadLoraRefusesWhatDoesNotFit) {
  auto m = NewModel(2);
  EXPECT_FALSE(m->LoadLora(2, MakeLoraAdapter(config_, kRank, 0)).ok());
  EXPECT_FALSE(m->LoadLora(0, MakeLoraAdapter(config_, kRank / 2, 0)).ok());
  auto none = NewModel();
  EXPECT_FALSE(none->LoadLora(0, MakeLoraAdapter(config_, kRank, 0)).ok());
}

TEST_F(ModelCpuTest, AdaptersAreSeededAndDistinct) {
  const LoraAdapter a = MakeLoraAdapter(config_, kRank, 0);
  EXPECT_EQ(a.weights.size(), LoraAdapterFloats(config_, kRank));
  EXPECT_EQ(a.weights.size(), 4u * config_.n_layers * config_.d_model * kRank);
  EXPECT_EQ(a.rank, kRank);
  EXPECT_EQ(a.scale, 1.0f);  // alpha = rank
  EXPECT_EQ(MakeLoraAdapter(config_, kRank, 0).weights, a.weights);
  EXPECT_NE(MakeLoraAdapter(config_, kRank, 1).weights, a.weights);
  ModelConfig other = config_;
  other.seed = 4;
  EXPECT_NE(MakeLoraAdapter(other, kRank, 0).weights, a.weights);
}

}  // namespace
}  // namespace tokenmeter::engine
