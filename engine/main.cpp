// tokenmeter-engine: runs a synthetic workload through the reference engine
// and prints one summary line; --report writes the figures as JSON.
#include <cstdio>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "engine/options.h"
#include "engine/report.h"

namespace {

using tokenmeter::engine::Engine;
using tokenmeter::engine::EngineOptions;
using tokenmeter::engine::Report;
using tokenmeter::engine::Status;

Status WriteFile(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return Status::Error("cannot write --report " + path);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) {
    return Status::Error("cannot write --report " + path);
  }
  return Status::Ok();
}

void PrintSummary(const Report& r) {
  const double hit =
      r.prefix_cache_queries > 0
          ? 100.0 * double(r.prefix_cache_hits) / double(r.prefix_cache_queries)
          : 0.0;
  std::printf(
      "tokenmeter-engine: %llu requests (%llu stop, %llu length) in %.3f s "
      "on %s: %llu prompt + %llu generation tokens, %.1f output tokens/s, "
      "TTFT p50 %.4f s p99 %.4f s, ITL p50 %.4f s p99 %.4f s, %llu steps, "
      "%llu preemptions, prefix cache hit rate %.1f%%, metrics %s "
      "(%llu events dropped)",
      (unsigned long long)r.requests, (unsigned long long)r.finished_stop,
      (unsigned long long)r.finished_length, r.duration_s, r.backend.c_str(),
      (unsigned long long)r.prompt_tokens,
      (unsigned long long)r.generation_tokens, r.output_tokens_per_s,
      r.ttft.p50, r.ttft.p99, r.itl.p50, r.itl.p99, (unsigned long long)r.steps,
      (unsigned long long)r.preemptions, hit, r.metrics ? "on" : "off",
      (unsigned long long)r.client_dropped_events);
  if (!r.lora_adapters.empty()) {
    std::printf(", %zu LoRA adapters: %llu loads, %llu evictions",
                r.lora_adapters.size(), (unsigned long long)r.lora_loads,
                (unsigned long long)r.lora_evictions);
  }
  if (r.moe_experts > 0) {
    // The worst layer over the whole run: max / mean tokens per expert.
    double worst = 0;
    size_t worst_layer = 0;
    for (size_t l = 0; l < r.moe_expert_tokens.size(); ++l) {
      const std::vector<uint64_t>& e = r.moe_expert_tokens[l];
      uint64_t mx = 0;
      for (uint64_t v : e) mx = v > mx ? v : mx;
      const double mean = double(r.moe_routed_tokens[l]) / double(e.size());
      if (mean > 0 && double(mx) / mean > worst) {
        worst = double(mx) / mean;
        worst_layer = l;
      }
    }
    std::printf(
        ", MoE %u experts top-%u: worst layer imbalance %.2f (layer "
        "%zu)",
        r.moe_experts, r.moe_top_k, worst, worst_layer);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  EngineOptions options;
  Status s = tokenmeter::engine::ParseOptions(argc, argv, &options);
  if (!s.ok()) {
    std::fprintf(stderr, "tokenmeter-engine: %s (see --help)\n",
                 s.message().c_str());
    return 2;
  }
  if (options.show_help) {
    const auto usage = tokenmeter::engine::UsageText();
    std::fwrite(usage.data(), 1, usage.size(), stdout);
    return 0;
  }
  if (options.show_version) {
    std::printf("tokenmeter-engine %s (libtokenmeter %s)\n", TOKENMETER_VERSION,
                tm_version());
    return 0;
  }
  std::unique_ptr<Engine> engine;
  s = Engine::Create(options, &engine);
  if (s.ok()) s = engine->Run();
  if (!s.ok()) {
    std::fprintf(stderr, "tokenmeter-engine: %s\n", s.message().c_str());
    return 1;
  }
  const Report report = engine->BuildReport();
  if (!options.quiet) PrintSummary(report);
  if (!options.report_path.empty()) {
    s = WriteFile(options.report_path, tokenmeter::engine::ReportJson(report));
    if (!s.ok()) {
      std::fprintf(stderr, "tokenmeter-engine: %s\n", s.message().c_str());
      return 1;
    }
  }
  return 0;
}
