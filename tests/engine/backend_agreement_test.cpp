// The CPU and CUDA backends compute the same function: the same weights
// (one seed), the same steps (a batched, chunked prefill over a paged cache
// then greedy decode steps), logits within 1e-3 relative error (the largest
// absolute difference over the largest absolute logit of the row).
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

// Returns the largest relative error seen, or a negative value on failure.
double Compare(const char* size) {
  ModelConfig cfg;
  if (!ModelConfigForSize(size, &cfg)) return -1;
  cfg.seed = 11;
  const KvLayout kv{256, 16};
  const auto weights = MakeWeights(cfg);
  auto cpu = MakeCpuModel(*weights, kv);
  std::unique_ptr<Model> gpu;
  Status s = MakeCudaModel(*weights, kv, &gpu);
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", size, s.message().c_str());
    return -1;
  }

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
    std::vector<SeqChunk> chunks;
    std::vector<Seq*> wanting;
    for (Seq& q : seqs) {
      SeqChunk c;
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
  std::printf("%s: largest relative logit error %.3g\n", size, worst);
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
  for (const char* size : {"tiny", "small", "medium"}) {
    const double e = Compare(size);
    if (e < 0 || e > kMaxRelativeError) {
      std::printf("FAIL: %s (limit %g)\n", size, kMaxRelativeError);
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}
