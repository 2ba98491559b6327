#include "daemon/logging/summary.h"

#include <algorithm>

#include "daemon/store/parts/admission.h"
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
  if (AppendRejections(s, w, line) > 0) *idle = false;
  return line;
}

void SummaryLog::MarkRejections(const EngineSeries& s, ReasonMarks& marks) {
  const AdmissionPart* admission = s.find_part<AdmissionPart>();
  if (admission == nullptr) return;
  marks.clear();
  admission->reasons().ForEach([&](std::string_view reason, uint64_t n) {
    marks.emplace_back(std::string(reason), n);
  });
}

uint64_t SummaryLog::AppendRejections(const EngineSeries& s, double window_s,
                                      std::string& line) {
  const AdmissionPart* admission = s.find_part<AdmissionPart>();
  if (admission == nullptr) return 0;
  ReasonMarks& marks = rejection_marks_[&s];
  // The window's count per reason. The part keeps its reasons in
  // first-come order with __other__ last and never drops one, so the
  // marks are in the part's order and one forward scan finds each.
  std::vector<std::pair<std::string_view, uint64_t>> window;
  uint64_t total = 0;
  size_t i = 0;
  admission->reasons().ForEach([&](std::string_view reason, uint64_t n) {
    uint64_t before = 0;
    for (size_t j = i; j < marks.size(); ++j) {
      if (marks[j].first == reason) {
        before = marks[j].second;
        i = j + 1;
        break;
      }
    }
    if (n > before) {
      window.emplace_back(reason, n - before);
      total += n - before;
    }
  });
  if (total > 0) {
    std::stable_sort(
        window.begin(), window.end(),
        [](const auto& a, const auto& b) { return a.second > b.second; });
    line +=
        fmt::format(", Rejected: {:.1f} reqs/s (", double(total) / window_s);
    uint64_t rest = 0;
    for (size_t k = 0; k < window.size(); ++k) {
      if (k < kMaxReasonsShown) {
        line += fmt::format("{}{} {}", k > 0 ? ", " : "", window[k].first,
                            window[k].second);
      } else {
        rest += window[k].second;
      }
    }
    if (rest > 0) line += fmt::format(", other reasons {}", rest);
    line += ')';
  }
  MarkRejections(s, marks);
  return total;
}

void SummaryLog::Restart(const Registry& registry) {
  windows_.Restart(registry);
  registry.ForEachSeries([&](const EngineSeries& s) {
    if (s.find_part<AdmissionPart>() != nullptr) {
      MarkRejections(s, rejection_marks_[&s]);
    }
  });
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
