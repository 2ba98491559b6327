// The periodic summary line, one per engine series, in the wording of the
// engine family its profile follows (docs/operations.md shows each, with
// the engine source and release it follows). Every line starts with
//   engine=<instance> model=<m>:
// and then, by the series' profile:
//   vllm      Avg prompt throughput: X tokens/s, Avg generation throughput:
//             Y tokens/s, Running: N reqs, Waiting: N reqs, GPU KV cache
//             usage: P%, Prefix cache hit rate: H%
//             [, Spec decode: Accepted throughput: A tokens/s, Drafted
//             throughput: D tokens/s, Draft acceptance rate: R%]
//   lmdeploy  Avg thr (in/out): X / Y tokens/s, Server (succeeded/failed):
//             S / F, Engine (running/waiting): N / N, KV cache: P%
//             [, Prefix cache hit rate: H%] [, SpecDecoding metrics: Draft
//             acceptance rate: R%, Mean acceptance length: L, Accepted: A
//             tokens, Drafted: D tokens[, Per-position acceptance rate:
//             p0, p1, ...]]
//   sglang    #running-req: N, token usage: U, [accept len: L, accept rate:
//             R, ]gen throughput (token/s): Y, #queue-req: N, #new-token:
//             C, #cached-token: K, input throughput (token/s): X
// Throughputs and spec-decode figures cover the window; running, waiting
// and KV usage are the gauges at its end; LMDeploy's succeeded / failed
// and its prefix cache hit rate are totals, as LMDeploy's are (since the
// daemon started, or since the snapshot's state began). Every profile then
// adds the worst MoE layer's imbalance (max / mean of its latest
// EXPERT_LOAD) when it sends EXPERT_LOAD, and the window's admission
// rejections when there were any:
//   Rejected: R reqs/s (queue_full 10, token_cap 2)
// R over the window, then the window's count of each reason, most first,
// at most kMaxReasonsShown of them, the rest summed as "other reasons N".
// A series idle for the last two windows logs at debug level only (a
// window with rejections is not idle).
//
// SummaryLog keeps each series' window (store/series_windows.h: the
// registry holds only the totals) and, per series, its admission part's
// count per reason at the window's start (at most ReasonCounts::kMaxReasons
// + 1 reasons of at most 64 bytes), an lmdeploy series' accepted tokens
// per draft position at the window's start (at most the protocol's 64
// positions) and how many windows running it was idle.
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
  // previous Line() for it (since its creation the first time), in its
  // profile's wording; moves the series' window on. Sets *idle when
  // nothing happened in it. Prompt and generation tokens count every
  // request of the series, whatever its per-request labels.
  std::string Line(const EngineSeries& s, double window_s, bool* idle);

  // Logs every series' line (info, or debug when idle two windows running).
  void LogAll(const Registry& registry, double window_s);
  // Starts every series' window at its counters' present values (after a
  // snapshot was loaded: the restored totals are not one window's).
  void Restart(const Registry& registry);

 private:
  // Each reason's count at the start of the window, first-come order.
  using ReasonMarks = std::vector<std::pair<std::string, uint64_t>>;
  // What SummaryLog keeps of one series besides its window.
  struct SeriesMarks {
    ReasonMarks rejections;
    // lmdeploy: spec_decode_num_accepted_tokens_per_pos at the window's
    // start, by position.
    std::vector<uint64_t> accepted_per_pos;
    int idle_windows = 0;  // windows in a row the series was idle
  };

  // The profile's figures, appended to `line` after the prefix.
  static void AppendVllm(const EngineSeries& s, const WindowCounters& d,
                         double w, std::string& line);
  static void AppendSglang(const EngineSeries& s, const WindowCounters& d,
                           double w, std::string& line);
  static void AppendLmdeploy(const EngineSeries& s, const WindowCounters& d,
                             double w, SeriesMarks& marks, std::string& line);
  // The rejections of `s` since its marks, moving them to now: appends
  // the Rejected figure to `line` when there were any; returns how many.
  static uint64_t AppendRejections(const EngineSeries& s, double window_s,
                                   ReasonMarks& marks, std::string& line);
  static void MarkRejections(const EngineSeries& s, ReasonMarks& marks);

  SeriesWindows windows_;
  // Bounded like the series (the registry's cap); their addresses are
  // stable for the daemon's life.
  std::unordered_map<const EngineSeries*, SeriesMarks> marks_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_LOGGING_SUMMARY_H_
