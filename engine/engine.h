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
#include "engine/model.h"
#include "engine/options.h"
#include "engine/report.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/status.h"
#include "tokenmeter/client.hpp"

namespace tokenmeter::engine {

class Engine {
 public:
  // Draws the workload and the weights, picks the backend (auto: CUDA when
  // built and a device answers, else the CPU) and, unless metrics are off,
  // creates the client (which connects in the background: a missing daemon
  // is not an error). Fails for --backend cuda without a device, a CUDA
  // error, or options the client refuses (e.g. --engine-name).
  static Status Create(const EngineOptions& o, std::unique_ptr<Engine>* out);

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();

  // Runs every request to its end, then closes the client (bounded by the
  // client's close timeout, 1 s). Fails only for a model backend error.
  Status Run();

  // The figures of the run (after Run()).
  Report BuildReport() const;

  const char* backend() const { return model_->backend(); }
  // Request i's output tokens (for tests: runs must be reproducible).
  std::vector<int32_t> Output(size_t i) const {
    const Request& r = requests_.at(i);
    return {r.tokens.begin() + r.prompt_len, r.tokens.end()};
  }
  size_t num_requests() const { return requests_.size(); }

 private:
  explicit Engine(const EngineOptions& o);
  Status Step(uint64_t* finished);
  // MoE: takes the model's routed-token counts since the last call, adds
  // them to the run's totals and sends one EXPERT_LOAD per layer at t_ns.
  Status SendExpertLoad(uint64_t t_ns);
  bool counts_experts() const {
    return options_.model.moe_experts > 0 && options_.expert_load_every > 0;
  }

  const EngineOptions options_;
  std::vector<Request> requests_;
  std::vector<uint64_t> arrival_offset_ns_;
  std::unique_ptr<BlockManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Model> model_;
  // Every LoRA adapter's weights (host memory; the backend's slots hold
  // copies of at most --max-lora of them).
  std::vector<LoraAdapter> adapters_;
  // "lora-<i>" and "tenant-<i>", for ARRIVED.
  std::vector<std::string> lora_names_, tenant_names_;
  std::unique_ptr<tokenmeter::Client> meter_;  // null with --no-metrics
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
