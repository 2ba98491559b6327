#include "daemon/logging/summary.h"

#include "daemon/store/parts/moe.h"
#include "spdlog/spdlog.h"

namespace tokenmeter::daemon {

std::string SummaryLog::Line(const EngineSeries& s, double window_s,
                             bool* idle) {
  const WindowCounters& d = windows_.Advance(s).increase;
  const uint64_t prompt = d.prompt_tokens;
  const uint64_t generation = d.generation_tokens;
  const uint64_t queries = d.prefix_queries;
  const uint64_t hits = d.prefix_hits;
  const uint64_t drafted = d.spec_draft_tokens;
  const uint64_t accepted = d.spec_accepted_tokens;

  const auto running = uint64_t(s.gauge(kNumRequestsRunning).value());
  const auto waiting = uint64_t(s.gauge(kNumRequestsWaiting).value());
  *idle = prompt == 0 && generation == 0 && running == 0 && waiting == 0;
  const double w = window_s > 0 ? window_s : 1;
  std::string line = fmt::format(
      "engine={} model={}: Avg prompt throughput: {:.1f} tokens/s, Avg "
      "generation throughput: {:.1f} tokens/s, Running: {} reqs, Waiting: {} "
      "reqs, GPU KV cache usage: {:.1f}%, Prefix cache hit rate: {:.1f}%",
      s.identity().instance, s.identity().model, double(prompt) / w,
      double(generation) / w, running, waiting,
      s.gauge(kKvCacheUsagePerc).value() * 100,
      queries > 0 ? 100.0 * double(hits) / double(queries) : 0.0);
  if (drafted > 0) {
    line += fmt::format(
        ", Spec decode: Accepted throughput: {:.1f} tokens/s, Drafted "
        "throughput: {:.1f} tokens/s, Draft acceptance rate: {:.1f}%",
        double(accepted) / w, double(drafted) / w,
        100.0 * double(accepted) / double(drafted));
  }
  // MoE: the layer whose latest load was the least balanced.
  uint32_t worst_layer = 0;
  const MoePart* moe = s.find_part<MoePart>();
  if (const MoePart::Layer* worst =
          moe != nullptr ? moe->WorstLayer(&worst_layer) : nullptr) {
    line += fmt::format(", MoE worst layer imbalance: {:.2f} (layer {})",
                        worst->imbalance, worst_layer);
  }
  return line;
}

void SummaryLog::LogAll(const Registry& registry, double window_s) {
  registry.ForEachSeries([&](const EngineSeries& s) {
    bool idle = false;
    const std::string line = Line(s, window_s, &idle);
    int& idle_windows = idle_windows_[&s];
    idle_windows = idle ? idle_windows + 1 : 0;
    if (idle_windows >= 2) {
      spdlog::debug("{}", line);
    } else {
      spdlog::info("{}", line);
    }
  });
}

}  // namespace tokenmeter::daemon
