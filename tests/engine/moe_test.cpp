// The mixture-of-experts MLP of the CPU backend: the model against an
// independent double-precision reference (routing, dispatch, combine), the
// batch invariance the dense model has, the routed-token counters, and
// the configuration checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

#include "engine/model.h"
#include "engine/rng.h"

namespace tokenmeter::engine {
namespace {

constexpr uint32_t kBlockSize = 4;

ModelConfig MoeConfig(uint32_t experts, uint32_t top_k, uint32_t layers) {
  ModelConfig c;
  EXPECT_TRUE(ModelConfigForSize("tiny", &c));
  c.seed = 5;
  c.n_layers = layers;
  c.moe_experts = experts;
  c.moe_top_k = top_k;
  return c;
}

std::vector<int32_t> Tokens(size_t n, uint64_t seed, uint32_t vocab) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng.UniformInt(1, vocab - 1));
  return t;
}

SeqChunk Chunk(const std::vector<int32_t>& tokens,
               const std::vector<int32_t>& table, uint32_t start, uint32_t n,
               bool want_logits) {
  SeqChunk c;
  c.tokens = tokens.data() + start;
  c.num_tokens = n;
  c.start_pos = start;
  c.block_table = table.data();
  c.num_blocks = uint32_t(table.size());
  c.want_logits = want_logits;
  return c;
}

// y = x W for a row-major [in][out] W, in double.
std::vector<double> Apply(const std::vector<double>& x, const float* w,
                          size_t out) {
  std::vector<double> y(out, 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    for (size_t j = 0; j < out; ++j) y[j] += x[i] * double(w[i * out + j]);
  }
  return y;
}

std::vector<double> Norm(const std::vector<double>& x,
                         const std::vector<float>& gain, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * double(gain[i]);
  return out;
}

struct Reference {
  std::vector<int32_t> experts;  // chosen, highest score first
  std::vector<double> logits;
  double margin = 0;  // k-th minus (k+1)-th score
};

// A one-layer model's logits for one token at position 0, from the
// weights alone: attention over one position is that position's value,
// then the MoE MLP written out directly from the description in model.h.
Reference OneToken(const Weights& w, int32_t token) {
  const ModelConfig& c = w.config;
  const size_t d = c.d_model, e_n = c.moe_experts, k = c.moe_top_k;
  const size_t f = c.moe_d_ff();
  const LayerWeights& l = w.layers[0];
  std::vector<double> x(d);
  for (size_t i = 0; i < d; ++i) x[i] = w.embed[size_t(token) * d + i];
  const std::vector<double> h = Norm(x, l.attn_norm, c.norm_eps);
  const std::vector<double> att =
      Apply(Apply(h, l.wv.data(), d), l.wo.data(), d);
  for (size_t i = 0; i < d; ++i) x[i] += att[i];
  const std::vector<double> hm = Norm(x, l.mlp_norm, c.norm_eps);
  std::vector<double> score = Apply(hm, l.router.data(), e_n);
  for (size_t e = 0; e < e_n; ++e) score[e] += l.router_bias[e];
  std::vector<int32_t> order(e_n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return score[size_t(a)] > score[size_t(b)];
  });
  Reference ref;
  ref.experts.assign(order.begin(), order.begin() + ptrdiff_t(k));
  ref.margin = k < e_n ? score[size_t(order[k - 1])] - score[size_t(order[k])]
                       : std::numeric_limits<double>::infinity();
  double sum = 0;
  std::vector<double> wt(k);
  for (size_t i = 0; i < k; ++i) {
    wt[i] = std::exp(score[size_t(order[i])] - score[size_t(order[0])]);
    sum += wt[i];
  }
  for (size_t i = 0; i < k; ++i) {
    const size_t off = size_t(order[i]) * d * f;
    const std::vector<double> g = Apply(hm, &l.e_gate[off], f);
    const std::vector<double> u = Apply(hm, &l.e_up[off], f);
    std::vector<double> a(f);
    for (size_t j = 0; j < f; ++j) a[j] = g[j] / (1 + std::exp(-g[j])) * u[j];
    const std::vector<double> y = Apply(a, &l.e_down[off], d);
    for (size_t j = 0; j < d; ++j) x[j] += wt[i] / sum * y[j];
  }
  ref.logits =
      Apply(Norm(x, w.final_norm, c.norm_eps), w.lm_head.data(), c.vocab);
  return ref;
}

TEST(MoeTest, MatchesAnIndependentReference) {
  for (const uint32_t k : {1u, 2u, 4u}) {
    const ModelConfig c = MoeConfig(16, k, 1);
    const auto w = MakeWeights(c);
    auto model = MakeCpuModel(*w, KvLayout{16, kBlockSize});
    const std::vector<int32_t> table = {0};
    for (int32_t token = 1; token < 40; ++token) {
      const std::vector<int32_t> t = {token};
      std::vector<float> logits(c.vocab);
      ASSERT_TRUE(
          model->Forward({Chunk(t, table, 0, 1, true)}, logits.data()).ok());
      std::vector<int32_t> experts;
      std::vector<float> margin;
      ASSERT_TRUE(model->LastRouting(&experts, &margin).ok());
      const Reference ref = OneToken(*w, token);
      ASSERT_EQ(experts.size(), k);
      ASSERT_EQ(margin.size(), 1u);
      EXPECT_NEAR(margin[0], ref.margin, 1e-4) << "token " << token;
      if (ref.margin > 1e-4) {
        EXPECT_EQ(experts, ref.experts) << "token " << token << " k " << k;
      }
      double diff = 0, scale = 0;
      for (size_t i = 0; i < c.vocab; ++i) {
        diff = std::max(diff, std::fabs(double(logits[i]) - ref.logits[i]));
        scale = std::max(scale, std::fabs(ref.logits[i]));
      }
      EXPECT_LT(diff / scale, 1e-4) << "token " << token << " k " << k;
    }
  }
}

TEST(MoeTest, RoutingSpreadsOverExpertsAndChangesTheLogits) {
  const ModelConfig moe = MoeConfig(16, 2, 2);
  ModelConfig dense = moe;
  dense.moe_experts = 0;
  auto wm = MakeWeights(moe);
  auto wd = MakeWeights(dense);
  EXPECT_TRUE(wm->layers[0].w_gate.empty());
  EXPECT_EQ(wm->layers[1].e_gate.size(),
            size_t(16) * moe.d_model * moe.moe_d_ff());
  EXPECT_EQ(wd->layers[0].router.size(), 0u);
  auto mm = MakeCpuModel(*wm, KvLayout{64, kBlockSize});
  auto md = MakeCpuModel(*wd, KvLayout{64, kBlockSize});
  const auto t = Tokens(60, 9, moe.vocab);
  std::vector<int32_t> table(15);
  std::iota(table.begin(), table.end(), 0);
  std::vector<float> lm(moe.vocab), ld(moe.vocab);
  ASSERT_TRUE(mm->Forward({Chunk(t, table, 0, 60, true)}, lm.data()).ok());
  ASSERT_TRUE(md->Forward({Chunk(t, table, 0, 60, true)}, ld.data()).ok());
  EXPECT_NE(lm, ld);
  for (float v : lm) EXPECT_TRUE(std::isfinite(v));
  std::vector<uint64_t> counts(2 * 16);
  ASSERT_TRUE(mm->TakeExpertCounts(counts.data()).ok());
  for (int l = 0; l < 2; ++l) {
    const auto* c = &counts[size_t(l) * 16];
    EXPECT_GE(std::count_if(c, c + 16, [](uint64_t v) { return v > 0; }), 6)
        << "layer " << l;
  }
}

TEST(MoeTest, BatchingAndChunkingDoNotChangeASequencesLogitsOrRouting) {
  const ModelConfig c = MoeConfig(8, 3, 2);
  const auto w = MakeWeights(c);
  const auto a = Tokens(23, 1, c.vocab), b = Tokens(17, 2, c.vocab);
  std::vector<int32_t> ta(6), tb(6);
  std::iota(ta.begin(), ta.end(), 0);
  std::iota(tb.begin(), tb.end(), 10);

  auto alone = MakeCpuModel(*w, KvLayout{32, kBlockSize});
  std::vector<float> la(c.vocab);
  ASSERT_TRUE(alone->Forward({Chunk(a, ta, 0, 23, true)}, la.data()).ok());
  std::vector<int32_t> ea;
  std::vector<float> ma;
  ASSERT_TRUE(alone->LastRouting(&ea, &ma).ok());

  // b first in the batch, a after it; then a again in chunks of 5.
  auto batched = MakeCpuModel(*w, KvLayout{32, kBlockSize});
  std::vector<float> lb(2 * c.vocab);
  ASSERT_TRUE(
      batched
          ->Forward({Chunk(b, tb, 0, 17, true), Chunk(a, ta, 0, 23, true)},
                    lb.data())
          .ok());
  EXPECT_TRUE(std::equal(la.begin(), la.end(), lb.begin() + c.vocab));
  std::vector<int32_t> eb;
  std::vector<float> mb;
  ASSERT_TRUE(batched->LastRouting(&eb, &mb).ok());
  ASSERT_EQ(eb.size(), size_t(2) * 40 * 3);
  for (size_t l = 0; l < 2; ++l) {
    // Layer l's rows: b's 17, then a's 23.
    EXPECT_TRUE(std::equal(ea.begin() + ptrdiff_t(l * 23 * 3),
                           ea.begin() + ptrdiff_t((l + 1) * 23 * 3),
                           eb.begin() + ptrdiff_t((l * 40 + 17) * 3)))
        << "layer " << l;
  }

  auto chunked = MakeCpuModel(*w, KvLayout{32, kBlockSize});
  std::vector<float> lc(c.vocab);
  for (uint32_t pos = 0; pos < 23; pos += 5) {
    const uint32_t n = std::min(5u, 23 - pos);
    ASSERT_TRUE(
        chunked->Forward({Chunk(a, ta, pos, n, pos + n == 23)}, lc.data())
            .ok());
  }
  EXPECT_EQ(la, lc);
}

TEST(MoeTest, CountersAddTopKPerTokenAndTakeZeroesThem) {
  const ModelConfig c = MoeConfig(16, 2, 2);
  const auto w = MakeWeights(c);
  auto model = MakeCpuModel(*w, KvLayout{64, kBlockSize});
  const auto t = Tokens(50, 4, c.vocab);
  std::vector<int32_t> table(13);
  std::iota(table.begin(), table.end(), 0);
  std::vector<float> logits(c.vocab);
  std::vector<uint64_t> expected(2 * 16, 0);
  // Two steps: 30 rows, then 20; counts accumulate over both.
  for (auto [start, n] : {std::pair{0u, 30u}, std::pair{30u, 20u}}) {
    ASSERT_TRUE(
        model->Forward({Chunk(t, table, start, n, true)}, logits.data()).ok());
    std::vector<int32_t> experts;
    std::vector<float> margin;
    ASSERT_TRUE(model->LastRouting(&experts, &margin).ok());
    ASSERT_EQ(experts.size(), size_t(2) * n * 2);
    for (size_t i = 0; i < experts.size(); ++i) {
      const size_t layer = i / (n * 2);
      ASSERT_GE(experts[i], 0);
      ASSERT_LT(experts[i], 16);
      ++expected[layer * 16 + size_t(experts[i])];
    }
  }
  std::vector<uint64_t> counts(2 * 16, 7);
  ASSERT_TRUE(model->TakeExpertCounts(counts.data()).ok());
  EXPECT_EQ(counts, expected);
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(std::accumulate(counts.begin() + l * 16,
                              counts.begin() + (l + 1) * 16, uint64_t(0)),
              100u);
  }
  ASSERT_TRUE(model->TakeExpertCounts(counts.data()).ok());
  EXPECT_EQ(counts, std::vector<uint64_t>(32, 0));

  // Counting off: the same logits, no counts.
  auto quiet = MakeCpuModel(*w, KvLayout{64, kBlockSize});
  quiet->SetExpertCounting(false);
  std::vector<float> lq(c.vocab);
  ASSERT_TRUE(quiet->Forward({Chunk(t, table, 0, 30, true)}, lq.data()).ok());
  ASSERT_TRUE(quiet->Forward({Chunk(t, table, 30, 20, true)}, lq.data()).ok());
  EXPECT_EQ(lq, logits);
  ASSERT_TRUE(quiet->TakeExpertCounts(counts.data()).ok());
  EXPECT_EQ(counts, std::vector<uint64_t>(32, 0));
}

TEST(MoeTest, AllExpertsChosenHasAnInfiniteMargin) {
  const ModelConfig c = MoeConfig(4, 4, 1);
  const auto w = MakeWeights(c);
  auto model = MakeCpuModel(*w, KvLayout{16, kBlockSize});
  const auto t = Tokens(3, 8, c.vocab);
  const std::vector<int32_t> table = {0};
  std::vector<float> logits(c.vocab);
  ASSERT_TRUE(
      model->Forward({Chunk(t, table, 0, 3, true)}, logits.data()).ok());
  std::vector<int32_t> experts;
  std::vector<float> margin;
  ASSERT_TRUE(model->LastRouting(&experts, &margin).ok());
  ASSERT_EQ(margin.size(), 3u);
  for (float m : margin) EXPECT_TRUE(std::isinf(m));
  for (size_t r = 0; r < 3; ++r) {
    std::vector<int32_t> row(experts.begin() + ptrdiff_t(r * 4),
                             experts.begin() + ptrdiff_t(r * 4 + 4));
    std::sort(row.begin(), row.end());
    EXPECT_EQ(row, (std::vector<int32_t>{0, 1, 2, 3}));
  }
}

TEST(MoeTest, DenseModelsHaveNoRouting) {
  ModelConfig c;
  ASSERT_TRUE(ModelConfigForSize("tiny", &c));
  const auto w = MakeWeights(c);
  auto model = MakeCpuModel(*w, KvLayout{16, kBlockSize});
  std::vector<int32_t> experts = {1};
  std::vector<float> margin = {1};
  ASSERT_TRUE(model->LastRouting(&experts, &margin).ok());
  EXPECT_TRUE(experts.empty());
  EXPECT_TRUE(margin.empty());
  EXPECT_EQ(MoeWeightBytes(c), 0u);
}

TEST(MoeTest, ValidatesTheExpertsAndTheirMemory) {
  const KvLayout kv{64, 16};
  auto check = [&](uint32_t e, uint32_t k, const char* size = "tiny") {
    ModelConfig c;
    EXPECT_TRUE(ModelConfigForSize(size, &c));
    c.moe_experts = e;
    c.moe_top_k = k;
    return ValidateModel(c, kv);
  };
  EXPECT_TRUE(check(16, 2).ok());
  EXPECT_TRUE(check(1024, 16).ok());
  EXPECT_TRUE(check(1, 1).ok());
  EXPECT_TRUE(check(0, 99).ok());  // dense: top-k unused
  const Status too_many = check(1025, 2);
  EXPECT_NE(too_many.message().find("--moe-experts"), std::string::npos);
  EXPECT_NE(check(4, 5).message().find("--moe-top-k"), std::string::npos);
  EXPECT_NE(check(64, 17).message().find("--moe-top-k"), std::string::npos);
  EXPECT_NE(check(64, 0).message().find("--moe-top-k"), std::string::npos);
  const Status big = check(1024, 2, "large");
  EXPECT_NE(big.message().find("MiB"), std::string::npos) << big.message();
  ModelConfig c;
  ASSERT_TRUE(ModelConfigForSize("tiny", &c));
  c.moe_experts = 16;
  c.moe_top_k = 2;
  // 2 layers x (router 64 x 16 + bias 16 + 16 experts x 3 x 64 x 96).
  EXPECT_EQ(MoeWeightBytes(c),
            uint64_t(2) * (1024 + 16 + 16 * 3 * 64 * 96) * 4);
  EXPECT_EQ(c.moe_d_ff(), 96u);
  c.moe_top_k = 1000;
  EXPECT_EQ(c.moe_d_ff(), 1u);
}

}  // namespace
}  // namespace tokenmeter::engine
