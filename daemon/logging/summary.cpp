#include "daemon/logging/summary.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "daemon/store/parts/admission.h"
#include "daemon/store/parts/moe.h"
#include "spdlog/spdlog.h"

namespace tokenmeter::daemon {

namespace {

// The accepted tokens per draft position of `s` (a STEP counter: the
// series' own values only).
const std::vector<uint64_t>& AcceptedPerPos(const EngineSeries& s) {
  return s.children(kSpecDecodeNumAcceptedTokensPerPos);
}

}  // namespace

std::string SummaryLog::Line(const EngineSeries& s, double window_s,
                             bool* idle) {
  const WindowCounters& d = windows_.Advance(s).increase;
  SeriesMarks& marks = marks_[&s];
  const double w = window_s > 0 ? window_s : 1;
  *idle = d.prompt_tokens == 0 && d.generation_tokens == 0 &&
          uint64_t(s.gauge(kNumRequestsRunning).value()) == 0 &&
          uint64_t(s.gauge(kNumRequestsWaiting).value()) == 0;
  std::string line = fmt::format("engine={} model={}: ", s.identity().instance,
                                 s.identity().model);
  switch (s.profile()) {
    case Profile::kVllm:
      AppendVllm(s, d, w, line);
      break;
    case Profile::kSglang:
      AppendSglang(s, d, w, line);
      break;
    case Profile::kLmdeploy:
      AppendLmdeploy(s, d, w, marks, line);
      break;
  }
  // MoE: the layer whose latest load was the least balanced.
  uint32_t worst_layer = 0;
  const MoePart* moe = s.find_part<MoePart>();
  if (const MoePart::Layer* worst =
          moe != nullptr ? moe->WorstLayer(&worst_layer) : nullptr) {
    line += fmt::format(", MoE worst layer imbalance: {:.2f} (layer {})",
                        worst->imbalance, worst_layer);
  }
  if (AppendRejections(s, w, marks.rejections, line) > 0) *idle = false;
  return line;
}

void SummaryLog::AppendVllm(const EngineSeries& s, const WindowCounters& d,
                            double w, std::string& line) {
  const auto running = uint64_t(s.gauge(kNumRequestsRunning).value());
  const auto waiting = uint64_t(s.gauge(kNumRequestsWaiting).value());
  line += fmt::format(
      "Avg prompt throughput: {:.1f} tokens/s, Avg generation throughput: "
      "{:.1f} tokens/s, Running: {} reqs, Waiting: {} reqs, GPU KV cache "
      "usage: {:.1f}%, Prefix cache hit rate: {:.1f}%",
      double(d.prompt_tokens) / w, double(d.generation_tokens) / w, running,
      waiting, s.gauge(kKvCacheUsagePerc).value() * 100,
      d.prefix_queries > 0
          ? 100.0 * double(d.prefix_hits) / double(d.prefix_queries)
          : 0.0);
  if (d.spec_draft_tokens > 0) {
    line += fmt::format(
        ", Spec decode: Accepted throughput: {:.1f} tokens/s, Drafted "
        "throughput: {:.1f} tokens/s, Draft acceptance rate: {:.1f}%",
        double(d.spec_accepted_tokens) / w, double(d.spec_draft_tokens) / w,
        100.0 * double(d.spec_accepted_tokens) / double(d.spec_draft_tokens));
  }
}

// SGLang's scheduler logs a "Decode batch" line every decode_log_interval
// steps and a "Prefill batch" line per prefill batch; one window's line
// carries the figures of both that the daemon has, in SGLang's words and
// number formats (its token usage a fraction with two decimals).
void SummaryLog::AppendSglang(const EngineSeries& s, const WindowCounters& d,
                              double w, std::string& line) {
  line += fmt::format("#running-req: {}, token usage: {:.2f}, ",
                      uint64_t(s.gauge(kNumRequestsRunning).value()),
                      s.gauge(kKvCacheUsagePerc).value());
  if (d.spec_drafts > 0) {
    line += fmt::format("accept len: {:.2f}, accept rate: {:.2f}, ",
                        d.SpecAcceptLength(), d.SpecAcceptRate());
  }
  // Computed prompt tokens: those not found cached or received (all of
  // them for an engine that reports no cached tokens).
  const uint64_t computed = d.prompt_tokens >= d.prompt_tokens_cached
                                ? d.prompt_tokens - d.prompt_tokens_cached
                                : 0;
  line += fmt::format(
      "gen throughput (token/s): {:.2f}, #queue-req: {}, #new-token: {}, "
      "#cached-token: {}, input throughput (token/s): {:.2f}",
      double(d.generation_tokens) / w,
      uint64_t(s.gauge(kNumRequestsWaiting).value()), computed,
      d.prompt_tokens_cached, double(computed) / w);
}

// LMDeploy's LoggingStatLogger.log(): its request counts and prefix cache
// hit rate are totals since the server started, its throughputs and
// spec-decode figures cover the interval since the previous line.
void SummaryLog::AppendLmdeploy(const EngineSeries& s, const WindowCounters& d,
                                double w, SeriesMarks& marks,
                                std::string& line) {
  uint64_t succeeded = 0;
  uint64_t failed = 0;
  for (size_t i = 0; i < std::size(kFinishedReasonValues); ++i) {
    const std::string_view reason = kFinishedReasonValues[i];
    (reason == "stop" || reason == "length" ? succeeded : failed) +=
        CellChildSum(s, kRequestSuccess, i);
  }
  line += fmt::format(
      "Avg thr (in/out): {:.1f} / {:.1f} tokens/s, Server (succeeded/failed): "
      "{} / {}, Engine (running/waiting): {} / {}, KV cache: {:.1f}%",
      double(d.prompt_tokens) / w, double(d.generation_tokens) / w, succeeded,
      failed, uint64_t(s.gauge(kNumRequestsRunning).value()),
      uint64_t(s.gauge(kNumRequestsWaiting).value()),
      s.gauge(kKvCacheUsagePerc).value() * 100);
  const uint64_t queries = s.count(kPrefixCacheQueries);
  const uint64_t hits = s.count(kPrefixCacheHits);
  if (queries > 0 && hits > 0) {
    line += fmt::format(", Prefix cache hit rate: {:.1f}%",
                        100.0 * double(hits) / double(queries));
  }
  // Accepted tokens per position in the window, the marks moved on.
  const std::vector<uint64_t>& per_pos = AcceptedPerPos(s);
  std::vector<uint64_t>& mark = marks.accepted_per_pos;
  mark.resize(per_pos.size(), 0);
  std::vector<uint64_t> window(per_pos.size());
  for (size_t i = 0; i < per_pos.size(); ++i) {
    window[i] = per_pos[i] >= mark[i] ? per_pos[i] - mark[i] : 0;
    mark[i] = per_pos[i];
  }
  if (d.spec_drafts == 0) return;
  const double drafts = double(d.spec_drafts);
  line += fmt::format(
      ", SpecDecoding metrics: Draft acceptance rate: {:.2f}%, Mean "
      "acceptance length: {:.2f}, Accepted: {} tokens, Drafted: {} tokens",
      d.spec_draft_tokens > 0
          ? 100.0 * double(d.spec_accepted_tokens) / double(d.spec_draft_tokens)
          : std::nan(""),
      d.SpecAcceptLength(), d.spec_accepted_tokens, d.spec_draft_tokens);
  if (!window.empty()) {
    line += ", Per-position acceptance rate: ";
    for (size_t i = 0; i < window.size(); ++i) {
      line += fmt::format("{}{:.3f}", i > 0 ? ", " : "",
                          double(window[i]) / drafts);
    }
  }
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
                                      ReasonMarks& marks, std::string& line) {
  const AdmissionPart* admission = s.find_part<AdmissionPart>();
  if (admission == nullptr) return 0;
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
    SeriesMarks& marks = marks_[&s];
    MarkRejections(s, marks.rejections);
    marks.accepted_per_pos = AcceptedPerPos(s);
  });
}

void SummaryLog::LogAll(const Registry& registry, double window_s) {
  registry.ForEachSeries([&](const EngineSeries& s) {
    bool idle = false;
    const std::string line = Line(s, window_s, &idle);
    int& idle_windows = marks_[&s].idle_windows;
    idle_windows = idle ? idle_windows + 1 : 0;
    if (idle_windows >= 2) {
      spdlog::debug("{}", line);
    } else {
      spdlog::info("{}", line);
    }
  });
}

}  // namespace tokenmeter::daemon
