// Model configurations, validation and the seeded weights both backends use.
#include <algorithm>
#include <cmath>
#include <string>

#include "engine/model.h"
#include "engine/rng.h"

namespace tokenmeter::engine {
namespace {

struct Preset {
  const char* name;
  uint32_t vocab, d_model, n_layers, n_heads, d_ff, max_context;
};

constexpr Preset kPresets[] = {
    {"tiny", 256, 64, 2, 4, 192, 2048},
    {"small", 1024, 256, 4, 8, 768, 4096},
    {"medium", 4096, 512, 8, 8, 1536, 4096},
    {"large", 32000, 1024, 16, 16, 2816, 8192},
};

// Uniform in [-a, a) with a = sqrt(3 / fan_in): variance 1 / fan_in, so that
// activations keep their scale through each linear layer.
std::vector<float> Linear(Rng& rng, uint32_t in, uint32_t out) {
  std::vector<float> w(size_t(in) * out);
  const auto a = float(std::sqrt(3.0 / in));
  for (float& x : w) x = rng.Symmetric(a);
  return w;
}

std::vector<float> NormGain(Rng& rng, uint32_t d) {
  std::vector<float> g(d);
  for (float& x : g) x = 1.0f + rng.Symmetric(0.1f);
  return g;
}

}  // namespace

bool ModelConfigForSize(const std::string& size, ModelConfig* out) {
  for (const Preset& p : kPresets) {
    if (size == p.name) {
      const uint64_t seed = out->seed;
      *out = ModelConfig();
      out->size = p.name;
      out->vocab = p.vocab;
      out->d_model = p.d_model;
      out->n_layers = p.n_layers;
      out->n_heads = p.n_heads;
      out->d_ff = p.d_ff;
      out->max_context = p.max_context;
      out->seed = seed;
      return true;
    }
  }
  return false;
}

const char* ModelSizeNames() { return "tiny, small, medium, large"; }

Status ValidateModel(const ModelConfig& c, const KvLayout& kv) {
  if (c.n_heads == 0 || c.d_model % c.n_heads != 0) {
    return Status::Error("d_model must be a multiple of n_heads");
  }
  const uint32_t hd = c.head_dim();
  if (hd != 16 && hd != 32 && hd != 64 && hd != 128) {
    return Status::Error("head_dim must be 16, 32, 64 or 128");
  }
  if (c.vocab < 2 || c.n_layers == 0 || c.d_ff == 0 || c.max_context == 0) {
    return Status::Error("model sizes must be positive (vocab >= 2)");
  }
  if (c.max_context > 8192) {
    return Status::Error("max_context must be at most 8192");
  }
  if (c.moe_experts > 0) {
    if (c.moe_experts > kMaxMoeExperts) {
      return Status::Error("--moe-experts must be at most " +
                           std::to_string(kMaxMoeExperts));
    }
    if (c.moe_top_k < 1 || c.moe_top_k > kMaxMoeTopK ||
        c.moe_top_k > c.moe_experts) {
      return Status::Error("--moe-top-k must be 1.." +
                           std::to_string(kMaxMoeTopK) +
                           " and at most --moe-experts");
    }
    if (MoeWeightBytes(c) > kMaxMoeBytes) {
      return Status::Error(
          "the experts' weights would take " +
          std::to_string(MoeWeightBytes(c) >> 20) + " MiB (--moe-experts " +
          std::to_string(c.moe_experts) + " of the " + c.size +
          " model), more than " + std::to_string(kMaxMoeBytes >> 20) + " MiB");
    }
  }
  if (kv.block_size == 0 || kv.block_size > 1024) {
    return Status::Error("--block-size must be 1..1024");
  }
  if (kv.num_blocks == 0 || kv.num_blocks > (1u << 24)) {
    return Status::Error("--kv-blocks must be 1..16777216");
  }
  if (uint64_t(kv.num_blocks) * kv.block_size > (uint64_t(1) << 30)) {
    return Status::Error("--kv-blocks x --block-size must be at most 2^30");
  }
  return Status::Ok();
}

uint64_t MoeWeightBytes(const ModelConfig& c) {
  if (c.moe_experts == 0) return 0;
  const uint64_t per_layer =
      uint64_t(c.d_model) * c.moe_experts + c.moe_experts +
      uint64_t(c.moe_experts) * 3 * c.d_model * c.moe_d_ff();
  return per_layer * c.n_layers * sizeof(float);
}

size_t LoraAdapterFloats(const ModelConfig& c, uint32_t rank) {
  return size_t(4) * c.n_layers * c.d_model * rank;
}

LoraOffsets LoraLayerOffsets(const ModelConfig& c, uint32_t rank, uint32_t l) {
  const size_t m = size_t(c.d_model) * rank;  // one matrix
  const size_t base = size_t(l) * 4 * m;
  return {base, base + m, base + 2 * m, base + 3 * m};
}

LoraAdapter MakeLoraAdapter(const ModelConfig& c, uint32_t rank,
                            uint32_t index) {
  LoraAdapter a;
  a.rank = rank;
  a.scale = 1.0f;  // alpha = rank
  a.weights.resize(LoraAdapterFloats(c, rank));
  // A stream of its own per adapter: adapter i is the same whatever N.
  Rng rng(Mix64(c.seed ^ 0x6c6f7261ULL ^ Mix64(index + 1)));
  const auto amp_a = float(std::sqrt(3.0 / c.d_model));
  const auto amp_b = float(0.25 * std::sqrt(3.0 / rank));
  const size_t m = size_t(c.d_model) * rank;
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    const LoraOffsets o = LoraLayerOffsets(c, rank, l);
    for (size_t off : {o.a_q, o.a_v}) {
      for (size_t i = 0; i < m; ++i) a.weights[off + i] = rng.Symmetric(amp_a);
    }
    for (size_t off : {o.b_q, o.b_v}) {
      for (size_t i = 0; i < m; ++i) a.weights[off + i] = rng.Symmetric(amp_b);
    }
  }
  return a;
}

std::unique_ptr<Weights> MakeWeights(const ModelConfig& c) {
  auto w = std::make_unique<Weights>();
  w->config = c;
  Rng rng(Mix64(c.seed ^ 0x77656967ULL));
  const uint32_t d = c.d_model;
  w->embed.resize(size_t(c.vocab) * d);
  for (float& x : w->embed) x = rng.Symmetric(1.7320508f);  // variance 1
  w->layers.resize(c.n_layers);
  for (LayerWeights& l : w->layers) {
    l.attn_norm = NormGain(rng, d);
    l.wq = Linear(rng, d, d);
    l.wk = Linear(rng, d, d);
    l.wv = Linear(rng, d, d);
    l.wo = Linear(rng, d, d);
    l.mlp_norm = NormGain(rng, d);
    if (c.moe_experts == 0) {
      l.w_gate = Linear(rng, d, c.d_ff);
      l.w_up = Linear(rng, d, c.d_ff);
      l.w_down = Linear(rng, c.d_ff, d);
    }
  }
  if (c.moe_experts > 0) {
    // The experts and routers from a stream of their own per layer.
    const uint32_t e = c.moe_experts, f = c.moe_d_ff();
    for (uint32_t li = 0; li < c.n_layers; ++li) {
      LayerWeights& l = w->layers[li];
      Rng er(Mix64(c.seed ^ 0x6d6f65ULL ^ Mix64(li + 1)));
      l.router = Linear(er, d, e);
      l.router_bias.resize(e);
      for (float& b : l.router_bias) b = er.Symmetric(1.0f);
      l.e_gate.resize(size_t(e) * d * f);
      l.e_up.resize(l.e_gate.size());
      l.e_down.resize(l.e_gate.size());
      for (uint32_t x = 0; x < e; ++x) {
        const size_t off = size_t(x) * d * f;
        auto fill = [&](std::vector<float>& dst, uint32_t in, uint32_t out) {
          const std::vector<float> m = Linear(er, in, out);
          std::copy(m.begin(), m.end(), dst.begin() + ptrdiff_t(off));
        };
        fill(l.e_gate, d, f);
        fill(l.e_up, d, f);
        fill(l.e_down, f, d);
      }
    }
  }
  w->final_norm = NormGain(rng, d);
  w->lm_head = Linear(rng, d, c.vocab);

  const uint32_t half = c.head_dim() / 2;
  w->rope_cos.resize(size_t(c.max_context) * half);
  w->rope_sin.resize(size_t(c.max_context) * half);
  for (uint32_t pos = 0; pos < c.max_context; ++pos) {
    for (uint32_t i = 0; i < half; ++i) {
      const double freq =
          std::pow(double(c.rope_theta), -2.0 * i / double(c.head_dim()));
      const double angle = pos * freq;
      w->rope_cos[size_t(pos) * half + i] = float(std::cos(angle));
      w->rope_sin[size_t(pos) * half + i] = float(std::sin(angle));
    }
  }
  return w;
}

}  // namespace tokenmeter::engine
