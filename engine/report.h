// The engine's own figures, computed from exactly the timestamps it sends
// to tokenmeterd, with the daemon's definitions (docs/protocol.md, "What the
// daemon computes"), so that the two can be compared.
#ifndef TOKENMETER_ENGINE_REPORT_H_
#define TOKENMETER_ENGINE_REPORT_H_

#include <cstdint>
#include <string>
#include <utility>
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
  uint64_t finished_error = 0;
  bool operator==(const GroupCounts&) const = default;
};

// One KV-transfer role's figures (the events of that role this process
// sent): transfers, failures by reason, the bytes and blocks of every
// transfer (failed ones too) and each one's end - start.
struct KvTransferFigures {
  uint64_t count = 0;
  std::vector<std::pair<std::string, uint64_t>> failures;  // by reason, sorted
  uint64_t bytes = 0;
  uint64_t blocks = 0;
  Summary time_s;
};

// The SLEEP events this process sent: how many, the state after the last
// (the protocol's default, awake, without any), and the time asleep.
struct SleepFigures {
  uint64_t transitions = 0;
  std::string scheduler = "running";
  std::string weights = "resident";
  std::string kv_cache = "resident";
  double asleep_s = 0;     // from the sleep event to the wake event
  uint64_t preempted = 0;  // requests preempted by the sleep
};

// The last STEP's values.
struct LastStepFigures {
  uint64_t running = 0, waiting = 0, waiting_deferred = 0;
  double kv_usage = 0;
};

// vLLM's priority buckets (the daemon's `priority` label), in order.
inline constexpr const char* kPriorityBuckets[] = {"<-1", "-1", "0", "1", ">1"};
// The bucket index of a priority.
inline size_t PriorityBucket(int32_t priority) {
  return priority < -1 ? 0 : priority > 1 ? 4 : size_t(priority + 2);
}

struct Report {
  uint64_t requests = 0;  // finished requests
  uint64_t finished_stop = 0, finished_length = 0, finished_error = 0;
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

  // Protocol 1.2 (docs/engine.md, "The report"). Which daemon series this
  // report is to be compared with: HELLO engine, model, instance and
  // labels, and the process's part ("monolithic", "prefill", "decode").
  std::string role = "monolithic";
  std::string engine_name, model_name, instance;
  std::vector<std::pair<std::string, std::string>> labels;
  // ADMISSION_REJECTED by reason (sorted).
  std::vector<std::pair<std::string, uint64_t>> admission_rejections;
  // Prompt tokens by source, at each request's first token, from its first
  // SCHEDULED's cached/external tokens: they sum to prompt_tokens.
  uint64_t prompt_local_compute = 0, prompt_local_cache_hit = 0,
           prompt_external_kv = 0;
  // Per finished request: computed prompt tokens (prompt - cached -
  // external) and PREEMPTED events.
  Summary prefill_kv_computed_tokens, num_preemptions_per_request;
  KvTransferFigures kv_send, kv_recv;
  // Decode side: first successful recv's end - first SCHEDULED, per
  // finished request that had one.
  Summary kv_wait;
  uint64_t kv_handoffs = 0;  // requests handed over (sent or received)
  SleepFigures sleep;
  LastStepFigures last_step;
  // With priorities: finished requests and tokens per vLLM priority bucket
  // (kPriorityBuckets order); empty without.
  std::vector<GroupCounts> priorities;
  uint64_t traceparents = 0;  // ARRIVED events with a traceparent
};

// The --report JSON: interfaces.md's keys in its order, then the extras;
// lora_adapters and tenants are objects keyed by name; with MoE counts,
// moe_experts, moe_top_k, moe_routed_tokens (a list by layer),
// moe_expert_tokens (a list of lists [layer][expert]) and
// moe_expert_load_events close it.
// The 1.2 figures come after the tenants, before the MoE keys.
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
  // Request i's priority (once EnablePriorities() was called).
  void Priority(size_t i, int32_t priority);
  void EnablePriorities() { priorities_ = true; }
  void Queued(size_t i, uint64_t t_ns);
  // The first call counts; later ones are ignored. `cached` and `external`
  // are the first SCHEDULED's info.
  void Scheduled(size_t i, uint64_t t_ns, uint32_t cached = 0,
                 uint32_t external = 0);
  void Tokens(size_t i, uint64_t t_ns, uint32_t n);
  void Finished(size_t i, uint64_t t_ns, Finish reason);
  void Preempted() { ++preemptions_; }
  void Preempted(size_t i) {
    ++preemptions_;
    ++times_.at(i).preemptions;
  }
  void Rejected(const std::string& reason);
  // One KV_TRANSFER of request i: recv (else send), [start_ns, t_ns].
  void KvTransfer(size_t i, bool recv, uint64_t start_ns, uint64_t t_ns,
                  uint64_t bytes, uint64_t blocks, bool ok,
                  const std::string& reason);
  void Handoff() { ++handoffs_; }
  void Traced() { ++traceparents_; }
  // A SLEEP event with the full state after it.
  void Sleep(uint64_t t_ns, const char* scheduler, const char* weights,
             const char* kv_cache, uint64_t preempted);
  void LastStep(uint64_t running, uint64_t waiting, uint64_t waiting_deferred,
                double kv_usage) {
    last_step_ = {running, waiting, waiting_deferred, kv_usage};
  }
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
    int32_t priority = 0;
    uint32_t cached = 0, external = 0;  // the first SCHEDULED's info
    uint32_t preemptions = 0;
    uint64_t kv_ready = 0;  // the first successful recv's end
    bool has_kv_ready = false;
  };
  struct Transfer {
    uint64_t bytes = 0, blocks = 0;
    std::vector<double> time_s;
    std::vector<std::pair<std::string, uint64_t>> failures;
  };
  static void Count(std::vector<std::pair<std::string, uint64_t>>& counts,
                    const std::string& key);
  static KvTransferFigures Figures(const Transfer& t);
  std::vector<Times> times_;
  std::vector<uint64_t> lora_loads_;  // per adapter
  uint32_t num_tenants_;
  uint64_t lora_evictions_ = 0, lora_skips_ = 0;
  std::vector<double> itl_s_;
  uint64_t preemptions_ = 0, steps_ = 0;
  uint64_t prefix_queries_ = 0, prefix_hits_ = 0;
  bool priorities_ = false;
  std::vector<std::pair<std::string, uint64_t>> rejections_;
  Transfer send_, recv_;
  uint64_t handoffs_ = 0, traceparents_ = 0;
  SleepFigures sleep_;
  uint64_t asleep_since_ = 0;
  LastStepFigures last_step_;
};

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_REPORT_H_
