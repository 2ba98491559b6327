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

// One LoRA adapter's or tenant's share of the run, for comparison with the
// daemon's per-request-label series: finished requests by reason, prompt
// tokens (of requests that produced a first token) and generation tokens.
struct GroupCounts {
  std::string name;  // "lora-<i>" or "tenant-<i>"
  uint64_t requests = 0;
  uint64_t finished_stop = 0, finished_length = 0;
  uint64_t prompt_tokens = 0;
  uint64_t generation_tokens = 0;
  uint64_t loads = 0;  // adapters only: uploads into a slot
  bool operator==(const GroupCounts&) const = default;
};

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
  // daemon's socket, connections made after the first, and event calls the
  // library refused (invalid arguments: none expected).
  uint64_t client_events_sent = 0, client_reconnects = 0;
  uint64_t client_events_rejected = 0;
  // CPU time over Run() (client close included): the loop thread's, and
  // the whole process's (the loop plus libtokenmeter's sender thread).
  double loop_cpu_s = 0, process_cpu_s = 0;
  // LoRA: uploads of an adapter into a slot, of which into a slot that held
  // another adapter (evictions), and waiting requests passed over for lack
  // of a slot (summed over steps); then every adapter and every tenant in
  // number order (empty without adapters or tenants).
  uint64_t lora_loads = 0, lora_evictions = 0, lora_skips = 0;
  std::vector<GroupCounts> lora_adapters, tenants;
  // MoE (moe_experts > 0, counting on): the model's routed-token counts
  // over the run, per layer and per layer and expert, and the EXPERT_LOAD
  // events sent (accepted by the library).
  uint32_t moe_experts = 0, moe_top_k = 0;
  std::vector<uint64_t> moe_routed_tokens;
  std::vector<std::vector<uint64_t>> moe_expert_tokens;
  uint64_t moe_expert_load_events = 0;
};

// The --report JSON: interfaces.md's keys in its order, then the extras;
// lora_adapters and tenants are objects keyed by name; with MoE counts,
// moe_experts, moe_top_k, moe_routed_tokens (a list by layer),
// moe_expert_tokens (a list of lists [layer][expert]) and
// moe_expert_load_events close it.
// Numbers are written locale-independently, doubles in shortest round-trip
// form.
std::string ReportJson(const Report& r);

// Collects each request's event timestamps (CLOCK_MONOTONIC ns) as the
// engine sends them. Requests are indexed 0..n-1. Memory: O(n) plus 8 bytes
// per inter-token gap. Not thread-safe.
class Recorder {
 public:
  // Requests may carry adapters 0..num_adapters-1 and tenants
  // 0..num_tenants-1.
  explicit Recorder(size_t num_requests, uint32_t num_adapters = 0,
                    uint32_t num_tenants = 0);

  void Arrived(size_t i, uint64_t t_ns, uint32_t prompt_tokens);
  // Request i's adapter and tenant (-1: none).
  void Groups(size_t i, int32_t lora, int32_t tenant);
  void Queued(size_t i, uint64_t t_ns);
  void Scheduled(size_t i, uint64_t t_ns);  // later calls are ignored
  void Tokens(size_t i, uint64_t t_ns, uint32_t n);
  void Finished(size_t i, uint64_t t_ns, Finish reason);
  void Preempted() { ++preemptions_; }
  void Step(uint64_t prefix_queries, uint64_t prefix_hits,
            uint64_t lora_skips = 0) {
    ++steps_;
    prefix_queries_ += prefix_queries;
    prefix_hits_ += prefix_hits;
    lora_skips_ += lora_skips;
  }
  // An adapter was uploaded into a slot; `evicted`: another one was there.
  void LoraLoaded(int32_t adapter, bool evicted);

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
    int32_t lora = -1, tenant = -1;
  };
  std::vector<Times> times_;
  std::vector<uint64_t> lora_loads_;  // per adapter
  uint32_t num_tenants_;
  uint64_t lora_evictions_ = 0, lora_skips_ = 0;
  std::vector<double> itl_s_;
  uint64_t preemptions_ = 0, steps_ = 0;
  uint64_t prefix_queries_ = 0, prefix_hits_ = 0;
};

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_REPORT_H_
