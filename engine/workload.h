// The synthetic workload: N requests with Poisson arrivals, prompt and output
// lengths drawn around given means, and an optional prompt prefix shared by
// every request (so the prefix cache hits), and optionally a LoRA adapter
// and a tenant for each request. Deterministic for a seed.
#ifndef TOKENMETER_ENGINE_WORKLOAD_H_
#define TOKENMETER_ENGINE_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/status.h"

namespace tokenmeter::engine {

struct WorkloadOptions {
  uint32_t requests = 200;
  // Requests per second; arrivals form a Poisson process (exponential gaps).
  // 0: every request arrives at offset 0.
  double rate = 0;
  // Means. A length is drawn uniformly from [mean - mean/2, mean + mean/2]
  // (at least 1), whose mean is `mean` up to rounding.
  uint32_t prompt_len = 128;
  uint32_t output_len = 64;
  // Fraction (0..1) of the mean prompt length that is one token sequence
  // shared by every prompt. Every prompt keeps at least one token of its own.
  double shared_prefix = 0;
  uint64_t seed = 1;
  // Prompt tokens are drawn from [1, vocab); 0 is the stop token, which a
  // prompt never contains.
  uint32_t vocab = 256;
  // LoRA adapters 0..N-1 to draw from (0: every request uses the base
  // model). Adapter i is chosen with probability proportional to 1/(i+1)
  // (Zipf, exponent 1), so a few adapters are hot and the rest cold.
  uint32_t lora_adapters = 0;
  // Tenants 0..T-1, drawn uniformly (0: requests have no tenant).
  uint32_t tenants = 0;
  // Priority levels K (0: requests carry no priority): each request's
  // priority is i - (K-1)/2 for i drawn uniformly from 0..K-1, so K = 5
  // gives -2..2, vLLM's five priority buckets.
  uint32_t priority_levels = 0;
};

struct WorkloadRequest {
  uint64_t id = 0;                 // 1..N, in arrival order
  uint64_t arrival_offset_ns = 0;  // from the workload's start; first is 0
  std::vector<int32_t> prompt;
  uint32_t max_tokens = 0;    // the request's output length limit, >= 1
  int32_t lora = -1;          // adapter 0..N-1, or -1 (base model)
  int32_t tenant = -1;        // tenant 0..T-1, or -1 (none)
  bool has_priority = false;  // priority_levels > 0
  int32_t priority = 0;       // lower runs first
};

// The names the engine reports: "lora-<i>" and "tenant-<i>".
std::string LoraName(int32_t adapter);
std::string TenantName(int32_t tenant);

// The longest prompt and prompt + output a workload with these options can
// draw (for checking them against the model's context).
uint32_t MaxPromptLen(const WorkloadOptions& o);
uint32_t MaxOutputLen(const WorkloadOptions& o);

// Checks the options: requests in 1..kMaxRequests, rate >= 0 and finite,
// lengths >= 1, shared_prefix in [0, 1], vocab >= 2, at most
// kMaxLoraAdapters adapters, kMaxTenants tenants and kMaxPriorityLevels
// priority levels.
Status ValidateWorkload(const WorkloadOptions& o);

// Every request of the workload, in arrival order. `o` must be valid. Costs
// O(total prompt tokens) time and memory.
std::vector<WorkloadRequest> GenerateWorkload(const WorkloadOptions& o);

// The cap on --requests: bounds the engine's per-request memory.
inline constexpr uint32_t kMaxRequests = 1'000'000;
// The caps on --lora-adapters (host memory: every adapter is kept there)
// and --tenants.
inline constexpr uint32_t kMaxLoraAdapters = 1024;
inline constexpr uint32_t kMaxTenants = 1024;
inline constexpr uint32_t kMaxPriorityLevels = 1024;
// --priority without a value: -2..2, one level in each of vLLM's priority
// buckets (<-1, -1, 0, 1, >1).
inline constexpr uint32_t kPriorityWorkloadLevels = 5;

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_WORKLOAD_H_
