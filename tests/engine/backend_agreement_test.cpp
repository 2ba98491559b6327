// The CPU and CUDA backends compute the same function: the same weights
// (one seed), the same steps (a batched, chunked prefill over a paged cache
// then greedy decode steps), logits within 1e-3 relative error (the largest
// absolute difference over the largest absolute logit of the row); then
// again with LoRA adapters in two slots (sequences on slot 0, the base
// model and slot 1; slot 1 reloaded with another adapter midway); then
// with a mixture of experts, where both backends must also route every
// token of every layer to the same experts, in the same order, except at
// a near tie of the router's k-th and (k+1)-th scores (a sequence whose
// routing differed is not compared after that), and count on the device
// exactly what they routed. Last, the disaggregated KV hand-over between
// the backends (CompareKvHandover).
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
// Scores this close may order differently on the two backends (their
// inputs differ by rounding); and at most this share of the choices.
constexpr double kNearTie = 1e-3;
constexpr double kMaxTieShare = 0.01;

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

struct MoeCheck {
  size_t choices = 0, near_ties = 0;
  bool failed = false;
  std::vector<uint64_t> routed_cpu, routed_gpu;  // [layer][expert]
};

// Compares the last step's routing of both models (rows of `chunks`), marks
// the sequences whose routing differed, and adds each backend's choices.
void CompareRouting(Model& cpu, Model& gpu, const std::vector<SeqChunk>& chunks,
                    std::vector<bool>* diverged, MoeCheck* m) {
  const ModelConfig& c = cpu.config();
  const size_t k = c.moe_top_k, e_n = c.moe_experts;
  std::vector<int32_t> ec, eg;
  std::vector<float> mc, mg;
  if (!cpu.LastRouting(&ec, &mc).ok() || !gpu.LastRouting(&eg, &mg).ok() ||
      ec.size() != eg.size() || mc.size() != mg.size()) {
    std::fprintf(stderr, "LastRouting failed or sizes differ\n");
    m->failed = true;
    return;
  }
  const size_t rows = mc.size() / c.n_layers;
  if (m->routed_cpu.empty()) {
    m->routed_cpu.assign(c.n_layers * e_n, 0);
    m->routed_gpu = m->routed_cpu;
  }
  for (size_t l = 0; l < c.n_layers; ++l) {
    size_t r = 0;
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      for (uint32_t t = 0; t < chunks[ci].num_tokens; ++t, ++r) {
        const size_t base = (l * rows + r) * k;
        for (size_t i = 0; i < k; ++i) {
          ++m->routed_cpu[l * e_n + size_t(ec[base + i])];
          ++m->routed_gpu[l * e_n + size_t(eg[base + i])];
        }
        m->choices += 1;
        if (std::equal(&ec[base], &ec[base] + k, &eg[base])) continue;
        // Only the order within the k, or the k-th at a near tie.
        std::vector<int32_t> a(&ec[base], &ec[base] + k);
        std::vector<int32_t> b(&eg[base], &eg[base] + k);
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        if (a != b && !(mc[l * rows + r] < kNearTie)) {
          std::fprintf(stderr,
                       "layer %zu row %zu: routing differs, margin %g\n", l, r,
                       double(mc[l * rows + r]));
          m->failed = true;
        }
        ++m->near_ties;
        (*diverged)[ci] = true;
      }
    }
  }
}

// Returns the largest relative error seen, or a negative value on failure.
double Compare(const char* size, bool lora, uint32_t experts = 0,
               uint32_t top_k = 2) {
  ModelConfig cfg;
  if (!ModelConfigForSize(size, &cfg)) return -1;
  cfg.seed = 11;
  cfg.moe_experts = experts;
  cfg.moe_top_k = top_k;
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
  MoeCheck moe;
  std::vector<bool> diverged(seqs.size(), false);
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
    if (experts > 0) CompareRouting(*cpu, *gpu, chunks, &diverged, &moe);
    for (size_t i = 0; i < chunks.size(); ++i) {
      seqs[i].computed += chunks[i].num_tokens;
    }
    for (size_t r = 0; r < wanting.size(); ++r) {
      const float* a = &lc[r * cfg.vocab];
      const double e = RelativeError(a, &lg[r * cfg.vocab], cfg.vocab);
      if (!diverged[size_t(wanting[r] - seqs.data())])
        worst = std::max(worst, e);
      // Greedy from the CPU logits, fed to both backends.
      const auto best = std::max_element(a, a + cfg.vocab) - a;
      wanting[r]->tokens.push_back(int32_t(best));
    }
  }
  if (experts > 0) {
    // The device counters hold exactly what each backend routed.
    std::vector<uint64_t> cc(moe.routed_cpu.size()), cg(cc.size());
    if (!cpu->TakeExpertCounts(cc.data()).ok() ||
        !gpu->TakeExpertCounts(cg.data()).ok()) {
      return -1;
    }
    if (cc != moe.routed_cpu || cg != moe.routed_gpu) {
      std::fprintf(stderr, "expert counters differ from the routing\n");
      return -1;
    }
    std::printf(
        "%s with %u experts top-%u: %zu of %zu routings differ at a "
        "near tie\n",
        size, experts, top_k, moe.near_ties, moe.choices);
    if (moe.failed ||
        double(moe.near_ties) > kMaxTieShare * double(moe.choices)) {
      return -1;
    }
  }
  std::printf("%s%s%s: largest relative logit error %.3g\n", size,
              lora ? " with LoRA" : "", experts > 0 ? " with MoE" : "", worst);
  return worst;
}

}  // namespace
// The disaggregated hand-over across backends: one backend computes a
// prompt; the K/V of all but its last position are read as block records
// (ReadKvBlocks) and written into other blocks of the other backend
// (WriteKvBlocks), which computes the last prompt token. Its logits must
// agree with the first backend's; the device round trip of the records is
// exact; a released device cache refuses work and comes back zeroed.
// Returns the largest relative error, or -1 for a failure.
double CompareKvHandover(const char* size) {
  ModelConfig cfg;
  if (!ModelConfigForSize(size, &cfg)) return -1;
  cfg.seed = 11;
  const KvLayout layout{64, 16};
  std::unique_ptr<Weights> w = MakeWeights(cfg);
  std::unique_ptr<Model> cpu = MakeCpuModel(*w, layout), gpu;
  Status s = MakeCudaModel(*w, layout, &gpu);
  if (!s.ok()) {
    std::fprintf(stderr, "MakeCudaModel: %s\n", s.message().c_str());
    return -1;
  }
  std::vector<int32_t> prompt(50);
  for (size_t i = 0; i < prompt.size(); ++i) {
    prompt[i] = int32_t(1 + (i * 131) % (cfg.vocab - 1));
  }
  const uint32_t n = uint32_t(prompt.size());
  const int32_t from[] = {3, 7, 11, 19}, to[] = {40, 2, 63, 9};
  const uint32_t pulled = (n - 1 + layout.block_size - 1) / layout.block_size;
  const size_t floats = pulled * KvBlockBytes(cfg, layout) / sizeof(float);
  auto run = [&](Model& m, const int32_t* table, uint32_t start,
                 std::vector<float>* logits) {
    SeqChunk ch;
    ch.tokens = prompt.data() + start;
    ch.num_tokens = n - start;
    ch.start_pos = start;
    ch.block_table = table;
    ch.num_blocks = 4;
    ch.want_logits = true;
    logits->resize(cfg.vocab);
    return m.Forward({ch}, logits->data());
  };
  double worst = 0;
  Model* models[] = {cpu.get(), gpu.get()};
  for (int dir = 0; dir < 2; ++dir) {
    Model& a = *models[dir];
    std::unique_ptr<Model> fresh;
    if (dir == 0) {
      s = MakeCudaModel(*w, layout, &fresh);
      if (!s.ok()) return -1;
    } else {
      fresh = MakeCpuModel(*w, layout);
    }
    std::vector<float> la, lb, records(floats);
    s = run(a, from, 0, &la);
    if (s.ok()) s = a.ReadKvBlocks(from, pulled, records.data());
    if (s.ok()) s = fresh->WriteKvBlocks(to, pulled, records.data());
    if (s.ok()) s = run(*fresh, to, n - 1, &lb);
    if (!s.ok()) {
      std::fprintf(stderr, "hand-over: %s\n", s.message().c_str());
      return -1;
    }
    const double e = RelativeError(la.data(), lb.data(), cfg.vocab);
    std::printf("%s KV hand-over %s: max relative error %.3g\n", size,
                dir == 0 ? "cpu -> cuda" : "cuda -> cpu", e);
    worst = std::max(worst, e);
  }
  // The device round trip is exact.
  std::vector<float> in(floats), out(floats);
  for (size_t i = 0; i < floats; ++i) in[i] = float(i % 977) * 0.25f - 3.0f;
  s = gpu->WriteKvBlocks(to, pulled, in.data());
  if (s.ok()) s = gpu->ReadKvBlocks(to, pulled, out.data());
  if (!s.ok() || in != out) {
    std::fprintf(stderr, "device KV round trip differs\n");
    return -1;
  }
  // Sleep mode on the device.
  std::vector<float> logits;
  if (!gpu->ReleaseKvCache().ok() || gpu->kv_cache_resident() ||
      run(*gpu, to, 0, &logits).ok() ||
      gpu->ReadKvBlocks(to, pulled, out.data()).ok() ||
      !gpu->RestoreKvCache().ok() ||
      !gpu->ReadKvBlocks(to, pulled, out.data()).ok() ||
      out != std::vector<float>(floats, 0.0f) ||
      !run(*gpu, to, 0, &logits).ok()) {
    std::fprintf(stderr, "device KV release/restore misbehaves\n");
    return -1;
  }
  return worst;
}

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
  // Mixtures of experts: few experts, many, all of them chosen.
  struct MoeCase {
    const char* size;
    uint32_t experts, top_k;
  };
  for (const MoeCase& m : {MoeCase{"tiny", 16, 2}, MoeCase{"small", 64, 6},
                           MoeCase{"tiny", 4, 4}, MoeCase{"tiny", 1024, 8}}) {
    const double e = Compare(m.size, false, m.experts, m.top_k);
    if (e < 0 || e > kMaxRelativeError) {
      std::printf("FAIL: %s with %u experts top-%u (limit %g)\n", m.size,
                  m.experts, m.top_k, kMaxRelativeError);
      ++failures;
    }
  }
  for (const char* size : {"tiny", "small"}) {
    const double e = CompareKvHandover(size);
    if (e < 0 || e > kMaxRelativeError) {
      std::printf("FAIL: %s KV hand-over (limit %g)\n", size,
                  kMaxRelativeError);
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}
