// The CPU and CUDA backends compute the same function: the same weights
// (one seed), the same steps (a batched, chunked prefill over a paged cache
// then greedy decode steps), logits within 1e-3 relative error (the largest
// absolute difference over the largest absolute logit of the row); then
// again with LoRA adapters in two slots (sequences on slot 0, the base
// model and slot 1; slot 1 reloaded with another adapter midway).
//
// Exits 77 (meson's "skipped") when this build has no CUDA backend or no
// CUDA device answers.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/rng.h"

namespace tokenmeter::engine {
namespace {

constexpr double kMaxRelativeError = 1e-3;

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> table;
  uint32_t computed = 0;
};

double RelativeError(const float* a, const float* b, uint32_t n) {
  double diff = 0, scale = 0;
  for (uint32_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(a[i])));
  }
  return diff / std::max(scale, 1e-6);
}

constexpr uint32_t kLoraRank = 16;

// Loads adapter `index` into `slot` of both models.
bool LoadBoth(Model& cpu, Model& gpu, const ModelConfig& cfg, uint32_t slot,
              uint32_t index) {
  const LoraAdapter a = MakeLoraAdapter(cfg, kLoraRank, index);
  Status s = cpu.LoadLora(slot, a);
  if (s.ok()) s = gpu.LoadLora(slot, a);
  if (!s.ok()) std::fprintf(stderr, "LoadLora: %s\n", s.message().c_str());
  return s.ok();
}

// Returns the largest relative error seen, or a negative value on failure.
double Compare(const char* size, bool lora) {
  ModelConfig cfg;
  if (!ModelConfigForSize(size, &cfg)) return -1;
  cfg.seed = 11;
  const KvLayout kv{256, 16};
  const LoraLayout lora_layout{lora ? 2u : 0u, kLoraRank};
  const auto weights = MakeWeights(cfg);
  auto cpu = MakeCpuModel(*weights, kv, lora_layout);
  std::unique_ptr<Model> gpu;
  Status s = MakeCudaModel(*weights, kv, lora_layout, &gpu);
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", size, s.message().c_str());
    return -1;
  }
  if (lora &&
      (!LoadBoth(*cpu, *gpu, cfg, 0, 0) || !LoadBoth(*cpu, *gpu, cfg, 1, 1))) {
    return -1;
  }
  const int32_t slot_of_seq[] = {0, -1, 1};

  Rng rng(5);
  std::vector<Seq> seqs(3);
  const uint32_t lens[] = {37, 64, 5};
  int32_t next_block = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (uint32_t k = 0; k < lens[i]; ++k) {
      seqs[i].tokens.push_back(int32_t(rng.UniformInt(1, cfg.vocab - 1)));
    }
    // Blocks interleaved across sequences, room for 16 more tokens.
    const uint32_t blocks = (lens[i] + 16 + 15) / 16;
    for (uint32_t b = 0; b < blocks; ++b) {
      seqs[i].table.push_back(next_block + int32_t(b) * 3);
    }
    next_block += 1;
  }

  double worst = 0;
  std::vector<float> lc(seqs.size() * cfg.vocab), lg(lc.size());
  for (int step = 0; step < 10; ++step) {
    if (lora && step == 5 && !LoadBoth(*cpu, *gpu, cfg, 1, 2)) return -1;
    std::vector<SeqChunk> chunks;
    std::vector<Seq*> wanting;
    for (size_t qi = 0; qi < seqs.size(); ++qi) {
      Seq& q = seqs[qi];
      SeqChunk c;
      c.lora_slot = lora ? slot_of_seq[qi] : -1;
      // Step 0 prefills the long sequence in two chunks (chunked prefill).
      const uint32_t remaining = uint32_t(q.tokens.size()) - q.computed;
      c.num_tokens = step == 0 && remaining > 40 ? 40 : remaining;
      c.tokens = q.tokens.data() + q.computed;
      c.start_pos = q.computed;
      c.block_table = q.table.data();
      c.num_blocks = uint32_t(q.table.size());
      c.want_logits = q.computed + c.num_tokens == q.tokens.size();
      chunks.push_back(c);
      if (c.want_logits) wanting.push_back(&q);
    }
    if (!cpu->Forward(chunks, lc.data()).ok()) return -1;
    s = gpu->Forward(chunks, lg.data());
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", size, s.message().c_str());
      return -1;
    }
    for (size_t i = 0; i < chunks.size(); ++i) {
      seqs[i].computed += chunks[i].num_tokens;
    }
    for (size_t r = 0; r < wanting.size(); ++r) {
      const float* a = &lc[r * cfg.vocab];
      const double e = RelativeError(a, &lg[r * cfg.vocab], cfg.vocab);
      worst = std::max(worst, e);
      // Greedy from the CPU logits, fed to both backends.
      const auto best = std::max_element(a, a + cfg.vocab) - a;
      wanting[r]->tokens.push_back(int32_t(best));
    }
  }
  std::printf("%s%s: largest relative logit error %.3g\n", size,
              lora ? " with LoRA" : "", worst);
  return worst;
}

}  // namespace
}  // namespace tokenmeter::engine

int main() {
  using namespace tokenmeter::engine;
  std::string why;
  if (!CudaBuilt() || !CudaDeviceAvailable(&why)) {
    std::printf("SKIP: %s\n",
                CudaBuilt() ? why.c_str() : "built without the CUDA backend");
    return 77;
  }
  int failures = 0;
  for (const bool lora : {false, true}) {
    for (const char* size : {"tiny", "small", "medium"}) {
      const double e = Compare(size, lora);
      if (e < 0 || e > kMaxRelativeError) {
        std::printf("FAIL: %s%s (limit %g)\n", size, lora ? " with LoRA" : "",
                    kMaxRelativeError);
        ++failures;
      }
    }
  }
  return failures == 0 ? 0 : 1;
}
