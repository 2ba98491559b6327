// Scheduler: continuous batching in the style of vLLM v1. Every step it
// hands out a token budget: first to the running requests, in the order they
// were scheduled (a decode takes one token; a prefill as many as remain or
// the budget allows: chunked prefill), then to waiting requests in FCFS
// order while the batch has room. When the KV cache cannot hold a running
// request's next tokens, the most recently scheduled running request is
// preempted by recompute: its blocks are freed, its computed tokens
// forgotten, and it goes back to the front of the waiting queue (its output
// tokens so far are kept and recomputed with the prompt). A step that
// preempts admits no waiting request. The head of the waiting queue blocks
// the queue when the cache cannot take it (strict FCFS).
//
// LoRA (max_lora > 0): a waiting request with an adapter is admitted only
// when its adapter is resident or can be made resident (AdapterSlots: an
// empty slot, or evicting the least recently used adapter no running
// request uses). Otherwise it keeps its place and the scheduler looks
// further down the queue (FCFS with skip, as vLLM v1 does for max_loras):
// later requests whose adapter fits, or that need none, may go ahead. At
// most kMaxLoraSkips requests are passed over per step, which bounds a
// step's cost with a long queue. The KV cache stays strict: the first
// request the cache cannot take still stops admission.
//
// Priority scheduling (SchedulerOptions::priority, vLLM's "priority"
// policy): the waiting queue is ordered by (Request::priority, arrival
// order), lower first; a preempted request goes back to its place in that
// order; the victim of a preemption is the running request with the
// highest (priority, arrival order), whose chunk of this step, if it
// already had one, is taken back.
//
// Disaggregated decode (Request::remote_kv): admitting such a request
// allocates its blocks and counts it as first scheduled, but it computes
// nothing until its prompt's K/V have arrived: it is deferred (holds its
// blocks and a place in the batch, counts as waiting) until LandKv()
// makes it running, or AbortDeferred() drops it. The prefill side keeps a
// finished request's blocks for the hand-over (FinishHold, ReleaseHeld).
//
// Not thread-safe: the engine loop owns it. Requests are borrowed; they must
// outlive the scheduler.
#ifndef TOKENMETER_ENGINE_SCHEDULER_H_
#define TOKENMETER_ENGINE_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/lora_slots.h"
#include "engine/request.h"

namespace tokenmeter::engine {

struct SchedulerOptions {
  uint32_t max_batch = 32;             // running requests at most
  uint32_t max_tokens_per_step = 512;  // token budget of one step
  uint32_t max_lora = 0;  // LoRA adapter slots; 0: requests carry none
  bool priority = false;  // order by Request::priority, not FCFS
};

// Waiting requests one step passes over for lack of an adapter slot, at most.
inline constexpr uint32_t kMaxLoraSkips = 1024;

struct ScheduledChunk {
  Request* request;
  uint32_t num_tokens;  // computes tokens [num_computed, num_computed + n)
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;
  std::vector<Request*> first_scheduled;  // scheduled for the first time
  std::vector<Request*> preempted;
  uint64_t prefix_queries = 0;  // prompt tokens looked up in the prefix cache
  uint64_t prefix_hits = 0;     // of which found cached
  // Adapters to upload into their slots before the chunks run (the chunks
  // read them through Request::lora_slot).
  std::vector<AdapterLoad> lora_loads;
  // Waiting requests passed over because their adapter could not be made
  // resident.
  uint64_t lora_skips = 0;
  // Remote-KV requests deferred this step: their pulls begin.
  std::vector<Request*> kv_pulls;
  bool empty() const { return chunks.empty(); }
  // Whether the step changed anything: computed, scheduled, preempted.
  bool acted() const {
    return !chunks.empty() || !preempted.empty() || !first_scheduled.empty() ||
           !kv_pulls.empty();
  }
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& o, BlockManager& kv);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Appends a request to the waiting queue (at its priority's place with
  // priority scheduling). Aborts for a request with an adapter when
  // max_lora is 0.
  void Add(Request* r);
  // Plans one step. The caller runs the model on out->chunks, then calls
  // Advance() for each chunk and Finish() for each finished request.
  void Schedule(SchedulerOutput* out);
  // Records that a chunk was computed: advances num_computed and registers
  // newly completed prompt blocks in the prefix cache.
  void Advance(const ScheduledChunk& c);
  // Removes a finished running request and frees its blocks.
  void Finish(Request* r);
  // Removes a finished running request but keeps its blocks (kHeld) until
  // ReleaseHeld(): the prefill side's hand-over.
  void FinishHold(Request* r);
  void ReleaseHeld(Request* r);
  // A deferred request's K/V are in its blocks: it has its first
  // cached_tokens + external_tokens prompt tokens computed, registers its
  // full prompt blocks in the prefix cache and joins the running requests
  // (last in scheduling order). Aborts for a request not deferred.
  void LandKv(Request* r);
  // Drops a deferred request (its K/V never arrived): frees its blocks.
  void AbortDeferred(Request* r);
  // Whether waiting requests may be admitted (false while the engine
  // pauses for sleep mode). Running requests keep running.
  void set_admitting(bool on) { admitting_ = on; }
  // Preempts every running request (sleep mode: the KV cache is about to
  // be released), into out->preempted; they keep their scheduling order
  // at the front of the queue (by priority with priority scheduling).
  void PreemptAll(SchedulerOutput* out);

  size_t num_running() const { return running_.size(); }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_deferred() const { return deferred_.size(); }
  const std::vector<Request*>& running() const { return running_; }
  const std::deque<Request*>& waiting() const { return waiting_; }
  const AdapterSlots& adapter_slots() const { return lora_; }

 private:
  void Preempt(Request* r, SchedulerOutput* out);
  void ReleaseAdapter(Request* r);
  // Puts a request into the waiting queue: at the back (FCFS), at the
  // front (FCFS, preempted), or at its (priority, arrival) place, found by
  // binary search (an O(waiting) insertion in the deque).
  void Enqueue(Request* r, bool front);
  // The running request to preempt: the last scheduled (FCFS) or the
  // highest (priority, arrival order).
  size_t VictimIndex() const;

  const SchedulerOptions options_;
  BlockManager& kv_;
  AdapterSlots lora_;
  std::vector<Request*> running_;   // in scheduling order
  std::deque<Request*> waiting_;    // FCFS, preempted ones at the front; or
                                    // by (priority, arrival)
  std::vector<Request*> deferred_;  // waiting for their K/V
  uint64_t next_seq_ = 1;           // Request::arrival_seq
  bool admitting_ = true;
};

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_SCHEDULER_H_
