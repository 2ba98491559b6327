// Engine: the reference inference engine's loop. One thread runs it: admit
// arrivals, schedule, run the model, sample, report. Each step reports to
// tokenmeterd through libtokenmeter's public C++ API (docs/engine.md maps
// every call to its place in a real engine).
#ifndef TOKENMETER_ENGINE_ENGINE_H_
#define TOKENMETER_ENGINE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/kv_channel.h"
#include "engine/model.h"
#include "engine/options.h"
#include "engine/report.h"
#include "engine/request.h"
#include "engine/rng.h"
#include "engine/scheduler.h"
#include "engine/sleep_cycle.h"
#include "engine/status.h"
#include "tokenmeter/client.hpp"

namespace tokenmeter::engine {

// Which part of the engine a process is (docs/engine.md, "Disaggregated
// prefill and decode"): the whole engine, or with --disaggregate the
// prefill process (admits the workload, computes each prompt and its first
// token, hands the request and its KV cache over) or the decode process
// (receives them and decodes).
enum class EngineRole : uint8_t { kMonolithic, kPrefill, kDecode };

const char* RoleName(EngineRole role);

class Engine {
 public:
  // Draws the workload and the weights, picks the backend (auto: CUDA when
  // built and a device answers, else the CPU) and, unless metrics are off,
  // creates the client (which connects in the background: a missing daemon
  // is not an error). Fails for --backend cuda without a device, a CUDA
  // error, or options the client refuses (e.g. --engine-name).
  static Status Create(const EngineOptions& o, std::unique_ptr<Engine>* out);
  // One process of --disaggregate: the prefill or the decode role, talking
  // to the other through `channel` (borrowed: it must outlive the engine).
  // HELLO instance "prefill" / "decode" (or "<--instance>-prefill" ...) and
  // label kv_role = "kv_producer" / "kv_consumer". kMonolithic with a null
  // channel is Create(o, out).
  static Status Create(const EngineOptions& o, EngineRole role,
                       KvChannel* channel, std::unique_ptr<Engine>* out);

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();

  // Runs every request to its end, then closes the client (bounded by the
  // client's close timeout, 1 s). The prefill role returns once every
  // workload request is finished or rejected and every hand-over has been
  // pulled (or given up), after sending END; the decode role once END has
  // come and every request it received has finished. Fails for a model
  // backend error, or a KV channel error (the other process gone, a
  // malformed message).
  Status Run();

  // The figures of the run (after Run()).
  Report BuildReport() const;

  const char* backend() const { return model_->backend(); }
  EngineRole role() const { return role_; }
  // Request i's output tokens (for tests: runs must be reproducible); the
  // decode role holds the requests it received, in arrival order.
  std::vector<int32_t> Output(size_t i) const {
    const Request& r = requests_.at(i);
    return {r.tokens.begin() + r.prompt_len, r.tokens.end()};
  }
  // The output tokens of the request with id `id`, if this process holds
  // it (else empty).
  std::vector<int32_t> OutputById(uint64_t id) const;
  size_t num_requests() const { return requests_.size(); }

  // Prefill role, after Run(): blocks until the decode process's REPORT
  // message (its --report JSON) has come, and returns its text. Fails when
  // the decode process closes the channel first.
  Status ReceivePeerReport(std::string* json);

 private:
  Engine(const EngineOptions& o, EngineRole role, KvChannel* channel);
  // Admits the workload's arrivals due by now_ns (not the decode role),
  // rejecting those the --max-queued cap refuses.
  void Admit(uint64_t now_ns);
  // Sends ARRIVED (and QUEUED at queued_ns) for r; `max_tokens` as asked
  // of this process.
  void SendArrived(const Request& r, uint64_t arrived_ns, uint64_t queued_ns,
                   uint32_t max_tokens);
  // One scheduler iteration; *acted: it changed something (else nothing
  // could run now).
  Status Step(bool* acted);
  // Sends STEP with the scheduler's state after an iteration.
  void SendStep(uint64_t t_ns, uint64_t prompt_tokens, uint64_t generated,
                uint64_t lora_skips, uint64_t prefix_queries,
                uint64_t prefix_hits);
  // Between iterations, when blocks went back to the cache: with nothing
  // running, waiting or deferred there is no step to come, so a STEP of its
  // own (no tokens) says so, or the waiting count and the KV usage would
  // stay at the last step's values after the run.
  void SendStepIfIdle(uint64_t t_ns);
  // Sleep mode: the transitions SleepCycle asks for.
  Status DriveSleep(uint64_t now_ns);
  // Moves bytes on the KV channel and handles every complete message.
  Status ServeChannel();
  Status ServePull(const KvPull& p);  // prefill
  Status OnAck(const KvAck& a);       // prefill
  Status OnHandoff(KvHandoff& h);     // decode
  Status OnKv(const KvData& k);       // decode
  void HandOver(Request* r);          // prefill
  void SendPull(Request* r);          // decode
  void SendKvTransfer(const Request& r, bool recv, uint64_t t_ns,
                      uint64_t bytes, bool ok, const std::string& reason);
  // Blocks until the next arrival, the sleep cycle's next deadline, or KV
  // channel traffic.
  Status Idle();
  bool Done() const;
  size_t Index(uint64_t id) const { return size_t(id - 1); }
  // MoE: takes the model's routed-token counts since the last call, adds
  // them to the run's totals and sends one EXPERT_LOAD per layer at t_ns.
  Status SendExpertLoad(uint64_t t_ns);
  bool counts_experts() const {
    return options_.model.moe_experts > 0 && options_.expert_load_every > 0;
  }

  const EngineOptions options_;
  const EngineRole role_;
  KvChannel* const channel_;  // null for kMonolithic
  std::string instance_;      // HELLO instance
  std::vector<std::pair<std::string, std::string>> labels_;  // HELLO labels
  // Monolithic and prefill: the workload, in id (arrival) order. Decode:
  // the requests received, in arrival order (capacity reserved for the
  // workload's size, so that pointers stay valid), and where each id is.
  std::vector<Request> requests_;
  std::vector<int32_t> index_of_;
  std::vector<uint64_t> arrival_offset_ns_;
  uint64_t start_ns_ = 0;
  size_t next_ = 0;        // the next workload request to admit
  uint64_t resolved_ = 0;  // finished or rejected (monolithic, prefill)
  uint64_t finished_ = 0;  // decode: finished requests
  // Prefill: requests whose blocks are held for a pull (by index).
  std::vector<Request*> held_;
  uint64_t num_held_ = 0;
  uint64_t kv_sends_ = 0;  // KV messages sent (--kv-fail-every counts them)
  bool end_sent_ = false;
  bool end_received_ = false;  // decode
  size_t block_floats_ = 0;    // floats of one KV block record
  std::vector<float> kv_scratch_;
  KvMessage msg_;
  std::string peer_report_;  // prefill: the REPORT, if it came during Run()
  bool has_peer_report_ = false;
  Rng trace_rng_{0};  // traceparent ids (seeded from getrandom)
  SleepCycle sleep_;
  SchedulerOutput sleep_out_;
  std::unique_ptr<BlockManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Model> model_;
  // Every LoRA adapter's weights (host memory; the backend's slots hold
  // copies of at most --max-lora of them).
  std::vector<LoraAdapter> adapters_;
  // "lora-<i>" and "tenant-<i>", for ARRIVED.
  std::vector<std::string> lora_names_, tenant_names_;
  std::unique_ptr<tokenmeter::Client> meter_;  // null with --no-metrics
  // The admission reason and the KV connector, registered once with the
  // client (tm_register_value()): sent by id, no string pass per event.
  tokenmeter::ValueId queue_full_id_, connector_id_;
  Recorder recorder_;
  uint64_t client_dropped_ = 0;
  tokenmeter::Stats client_stats_;  // final, after Close()
  double loop_cpu_s_ = 0, process_cpu_s_ = 0;
  // Per-step scratch, kept to avoid allocating every step.
  SchedulerOutput plan_;
  std::vector<SeqChunk> chunks_;
  std::vector<float> logits_;
  // MoE counts [layer][expert]: the latest taken, and the run's totals.
  std::vector<uint64_t> expert_delta_, expert_total_;
  uint32_t steps_since_expert_load_ = 0;
  uint64_t expert_load_events_ = 0;
};

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_ENGINE_H_
