// The periodic summary line, one per engine series, in vLLM's shape:
//   engine=<instance> model=<m>: Avg prompt throughput: X tokens/s, Avg
//   generation throughput: Y tokens/s, Running: N reqs, Waiting: N reqs,
//   GPU KV cache usage: P%, Prefix cache hit rate: H%
// plus spec-decode figures when the engine reports them, the worst MoE
// layer's imbalance (max / mean of its latest EXPERT_LOAD) when it sends
// EXPERT_LOAD, and the window's admission rejections when there were any:
//   Rejected: R reqs/s (queue_full 10, token_cap 2)
// R over the window, then the window's count of each reason, most first,
// at most kMaxReasonsShown of them, the rest summed as "other reasons N".
// A series idle for the last two windows logs at debug level only (a
// window with rejections is not idle).
//
// SummaryLog keeps each series' window (store/series_windows.h: the
// registry holds only the totals), its admission part's count per reason
// at the window's start (at most ReasonCounts::kMaxReasons + 1 reasons of
// at most 64 bytes a series) and how many windows running it was idle.
// Single-threaded: the loop.
#ifndef TOKENMETER_DAEMON_LOGGING_SUMMARY_H_
#define TOKENMETER_DAEMON_LOGGING_SUMMARY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "daemon/store/registry.h"
#include "daemon/store/series_windows.h"

namespace tokenmeter::daemon {

class SummaryLog {
 public:
  // Reasons named in the Rejected figure; the others are summed.
  static constexpr size_t kMaxReasonsShown = 3;

  // The line for one series over a window of `window_s` seconds since the
  // previous Line() for it (since its creation the first time); moves the
  // series' window on. Sets *idle when nothing happened in it. Prompt and
  // generation tokens count every request of the series, whatever its
  // per-request labels.
  std::string Line(const EngineSeries& s, double window_s, bool* idle);

  // Logs every series' line (info, or debug when idle two windows running).
  void LogAll(const Registry& registry, double window_s);
  // Starts every series' window at its counters' present values (after a
  // snapshot was loaded: the restored totals are not one window's).
  void Restart(const Registry& registry);

 private:
  // Each reason's count at the start of the window, first-come order.
  using ReasonMarks = std::vector<std::pair<std::string, uint64_t>>;
  // The rejections of `s` since its marks, moving them to now: appends
  // the Rejected figure to `line` when there were any; returns how many.
  uint64_t AppendRejections(const EngineSeries& s, double window_s,
                            std::string& line);
  static void MarkRejections(const EngineSeries& s, ReasonMarks& marks);

  SeriesWindows windows_;
  std::unordered_map<const EngineSeries*, ReasonMarks> rejection_marks_;
  // Windows in a row each series was idle (bounded like the series).
  std::unordered_map<const EngineSeries*, int> idle_windows_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_LOGGING_SUMMARY_H_
