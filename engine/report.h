// The engine's own figures, computed from exactly the timestamps it sends
// to tokenmeterd, with the daemon's definitions (docs/protocol.md, "What the
// daemon computes"), so that the two can be compared.
#ifndef TOKENMETER_ENGINE_REPORT_H_
#define TOKENMETER_ENGINE_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace tokenmeter::engine {

// count, sum, and nearest-rank percentiles of a set of observations.
struct Summary {
  uint64_t count = 0;
  double sum = 0;
  double p50 = 0;  // 0 when count is 0
  double p99 = 0;
};

// Summarizes `values` (sorted in place). The p-th percentile is the
// smallest value with at least p% of the values at or below it.
Summary Summarize(std::vector<double>& values);

struct Report {
  uint64_t requests = 0;  // finished requests
  uint64_t finished_stop = 0, finished_length = 0;
  uint64_t prompt_tokens = 0;  // of requests that produced a first token
  uint64_t generation_tokens = 0;
  double duration_s = 0;  // first arrival to last finish
  double output_tokens_per_s = 0;
  Summary ttft, itl, e2e, queue, prefill, decode, inference, tpot;
  std::string backend;
  bool metrics = false;
  uint64_t client_dropped_events = 0;
  // Beyond interfaces.md's fixed keys:
  uint64_t preemptions = 0;
  uint64_t prefix_cache_queries = 0, prefix_cache_hits = 0;
  uint64_t steps = 0;
  // libtokenmeter's final counters (tm_client_close): events written to the
  // daemon's socket, and connections made after the first.
  uint64_t client_events_sent = 0, client_reconnects = 0;
  // CPU time over Run() (client close included): the loop thread's, and
  // the whole process's (the loop plus libtokenmeter's sender thread).
  double loop_cpu_s = 0, process_cpu_s = 0;
};

// The --report JSON: interfaces.md's keys in its order, then the extras.
// Numbers are written locale-independently, doubles in shortest round-trip
// form.
std::string ReportJson(const Report& r);

// Collects each request's event timestamps (CLOCK_MONOTONIC ns) as the
// engine sends them. Requests are indexed 0..n-1. Memory: O(n) plus 8 bytes
// per inter-token gap. Not thread-safe.
class Recorder {
 public:
  explicit Recorder(size_t num_requests);

  void Arrived(size_t i, uint64_t t_ns, uint32_t prompt_tokens);
  void Queued(size_t i, uint64_t t_ns);
  void Scheduled(size_t i, uint64_t t_ns);  // later calls are ignored
  void Tokens(size_t i, uint64_t t_ns, uint32_t n);
  void Finished(size_t i, uint64_t t_ns, Finish reason);
  void Preempted() { ++preemptions_; }
  void Step(uint64_t prefix_queries, uint64_t prefix_hits) {
    ++steps_;
    prefix_queries_ += prefix_queries;
    prefix_hits_ += prefix_hits;
  }

  // The figures over every request recorded so far. `backend`, `metrics`
  // and the drop count are copied into the report.
  Report Build(const std::string& backend, bool metrics,
               uint64_t client_dropped_events) const;

 private:
  struct Times {
    uint64_t arrived = 0, queued = 0, scheduled = 0, first_token = 0,
             last_token = 0, finished = 0;
    bool has_arrived = false, has_queued = false, has_scheduled = false,
         has_first_token = false, has_finished = false;
    uint32_t prompt_tokens = 0;
    uint64_t generation_tokens = 0;
    Finish reason = Finish::kNone;
  };
  std::vector<Times> times_;
  std::vector<double> itl_s_;
  uint64_t preemptions_ = 0, steps_ = 0;
  uint64_t prefix_queries_ = 0, prefix_hits_ = 0;
};

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_REPORT_H_
