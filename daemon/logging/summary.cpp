#include "daemon/logging/summary.h"

#include "spdlog/spdlog.h"

namespace tokenmeter::daemon {

std::string SummaryLine(EngineSeries& s, double window_s, bool* idle) {
  const uint64_t prompt = s.prompt_tokens - s.last_log_prompt_tokens;
  const uint64_t generation =
      s.generation_tokens - s.last_log_generation_tokens;
  const uint64_t queries = s.prefix_queries - s.last_log_prefix_queries;
  const uint64_t hits = s.prefix_hits - s.last_log_prefix_hits;
  const uint64_t drafted = s.spec_draft_tokens - s.last_log_spec_draft_tokens;
  const uint64_t accepted =
      s.spec_accepted_tokens - s.last_log_spec_accepted_tokens;
  s.last_log_prompt_tokens = s.prompt_tokens;
  s.last_log_generation_tokens = s.generation_tokens;
  s.last_log_prefix_queries = s.prefix_queries;
  s.last_log_prefix_hits = s.prefix_hits;
  s.last_log_spec_draft_tokens = s.spec_draft_tokens;
  s.last_log_spec_accepted_tokens = s.spec_accepted_tokens;

  const uint64_t running =
      s.has_step_running ? s.step_running
                         : uint64_t(std::max<int64_t>(0, s.derived_running));
  const uint64_t waiting =
      s.has_step_waiting ? s.step_waiting
                         : uint64_t(std::max<int64_t>(0, s.derived_waiting));
  *idle = prompt == 0 && generation == 0 && running == 0 && waiting == 0;
  const double w = window_s > 0 ? window_s : 1;
  std::string line = fmt::format(
      "engine={} model={}: Avg prompt throughput: {:.1f} tokens/s, Avg "
      "generation throughput: {:.1f} tokens/s, Running: {} reqs, Waiting: {} "
      "reqs, GPU KV cache usage: {:.1f}%, Prefix cache hit rate: {:.1f}%",
      s.identity.instance, s.identity.model, double(prompt) / w,
      double(generation) / w, running, waiting, s.kv_usage * 100,
      queries > 0 ? 100.0 * double(hits) / double(queries) : 0.0);
  if (drafted > 0) {
    line += fmt::format(
        ", Spec decode: Accepted throughput: {:.1f} tokens/s, Drafted "
        "throughput: {:.1f} tokens/s, Draft acceptance rate: {:.1f}%",
        double(accepted) / w, double(drafted) / w,
        100.0 * double(accepted) / double(drafted));
  }
  return line;
}

void LogSummaries(Registry& registry, double window_s) {
  registry.ForEachSeries([&](EngineSeries& s) {
    bool idle = false;
    const std::string line = SummaryLine(s, window_s, &idle);
    s.idle_windows = idle ? s.idle_windows + 1 : 0;
    if (s.idle_windows >= 2) {
      spdlog::debug("{}", line);
    } else {
      spdlog::info("{}", line);
    }
  });
}

}  // namespace tokenmeter::daemon
