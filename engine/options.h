// tokenmeter-engine's command line (docs/engine.md lists every flag; the
// ones in /work/shared/design/interfaces.md are fixed).
#ifndef TOKENMETER_ENGINE_OPTIONS_H_
#define TOKENMETER_ENGINE_OPTIONS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "engine/status.h"
#include "engine/workload.h"

namespace tokenmeter::engine {

enum class Backend : uint8_t { kAuto, kCpu, kCuda };

struct EngineOptions {
  WorkloadOptions workload;
  SchedulerOptions scheduler;
  KvCacheOptions kv;
  ModelConfig model;  // from --model-size; vocab feeds the workload
  Backend backend = Backend::kAuto;
  float temperature = 1.0f;  // 0: greedy
  // LoRA: workload.lora_adapters adapters (0: none) of rank lora_rank, at
  // most max_lora resident (scheduler.max_lora is max_lora with adapters,
  // else 0). workload.tenants: the tenants (3 by default).
  uint32_t max_lora = 4;
  uint32_t lora_rank = 8;
  // MoE (model.moe_experts > 0): the routed-token counts go to tokenmeterd
  // as EXPERT_LOAD every this many steps, and once more at the end; 0:
  // neither counted nor sent (the MoE metrics off).
  uint32_t expert_load_every = 16;

  // Protocol 1.2 modes (docs/engine.md). --disaggregate: the engine runs
  // as a prefill and a decode process linked by a KV channel; every
  // kv_fail_every-th KV message the prefill side sends is corrupted (0:
  // none), and the decode side retries a failed transfer kv_retries times
  // before it ends the request with `error`.
  bool disaggregate = false;
  uint32_t kv_fail_every = 0;
  uint32_t kv_retries = 1;
  // Admission cap: an arrival finding this many requests waiting is
  // rejected (ADMISSION_REJECTED "queue_full"); 0: no cap.
  uint32_t max_queued = 0;
  // One sleep/wake cycle: sleep sleep_after_s after the start, wake
  // wake_after_s later (both set, or neither: sleep_after_s < 0).
  double sleep_after_s = -1;
  double wake_after_s = -1;
  // ARRIVED carries a W3C traceparent (always with --disaggregate).
  bool trace_context = false;

  bool metrics = true;
  // Acknowledged delivery (the library's default); --no-ack for a
  // protocol 1.0 daemon, which never acks.
  bool metrics_ack = true;
  std::string metrics_socket;  // default TM_DEFAULT_SOCKET_PATH
  std::string engine_name = "tokenmeter-engine";
  std::string model_name;  // default "tokenmeter-<size>"
  std::string instance;
  std::string scope;
  // HELLO profile: "vllm", "sglang", "lmdeploy", or empty (not sent). It
  // also picks the cache_config keys (SGLang's with "sglang").
  std::string metrics_profile;
  std::string report_path;
  bool quiet = false;

  bool show_help = false;
  bool show_version = false;
};

// Parses argv (argv[0] skipped; `--flag value` and `--flag=value`) and
// checks the combination: a request must fit the model's context and the
// KV cache; LoRA flags in range (--max-lora >= 1 with adapters, --lora-rank
// 1..64 and at most d_model, the adapters' weights within 4 GiB), MoE flags
// in range (--moe-experts 0..1024, --moe-top-k 1..16 and at most the
// experts, the experts' weights within 4 GiB), the 1.2 modes' (--kv-*
// only with --disaggregate, --kv-retries at most kMaxKvRetries, --scope
// not with --disaggregate, --sleep-after and --wake-after together, each
// 0..kMaxSleepSeconds). Errors name the flag.
Status ParseOptions(int argc, const char* const* argv, EngineOptions* o);

std::string_view UsageText();

// The cap on the memory of every LoRA adapter (the host store of all
// --lora-adapters plus the --max-lora slots).
inline constexpr uint64_t kMaxLoraBytes = uint64_t(4) << 30;
inline constexpr uint32_t kMaxLoraSlots = 256;
inline constexpr uint32_t kMaxKvRetries = 16;
inline constexpr double kMaxSleepSeconds = 86400;

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_OPTIONS_H_
