// The periodic summary line, one per engine series, in vLLM's shape:
//   engine=<instance> model=<m>: Avg prompt throughput: X tokens/s, Avg
//   generation throughput: Y tokens/s, Running: N reqs, Waiting: N reqs,
//   GPU KV cache usage: P%, Prefix cache hit rate: H%
// plus spec-decode figures when the engine reports them, and the worst MoE
// layer's imbalance (max / mean of its latest EXPERT_LOAD) when it sends
// EXPERT_LOAD. A series idle for
// the last two windows logs at debug level only.
//
// SummaryLog keeps each series' counter values at the end of the previous
// window (the registry holds only the totals). Single-threaded: the loop.
#ifndef TOKENMETER_DAEMON_LOGGING_SUMMARY_H_
#define TOKENMETER_DAEMON_LOGGING_SUMMARY_H_

#include <cstdint>
#include <string>
#include <unordered_map>

#include "daemon/store/registry.h"

namespace tokenmeter::daemon {

class SummaryLog {
 public:
  // The line for one series over a window of `window_s` seconds since the
  // previous Line() for it (since its creation the first time); moves the
  // series' window on. Sets *idle when nothing happened in it.
  std::string Line(const EngineSeries& s, double window_s, bool* idle);

  // Logs every series' line (info, or debug when idle two windows running).
  void LogAll(const Registry& registry, double window_s);
  // Starts every series' window at its counters' present values (after a
  // snapshot was loaded: the restored totals are not one window's).
  void StartWindows(const Registry& registry);

 private:
  struct Window {
    uint64_t prompt_tokens = 0;
    uint64_t generation_tokens = 0;
    uint64_t prefix_queries = 0;
    uint64_t prefix_hits = 0;
    uint64_t spec_draft_tokens = 0;
    uint64_t spec_accepted_tokens = 0;
    int idle_windows = 0;
  };
  // One entry per series (bounded by the registry's series cap); series
  // live as long as the daemon, so their addresses are stable keys.
  std::unordered_map<const EngineSeries*, Window> windows_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_LOGGING_SUMMARY_H_
