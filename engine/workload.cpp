#include "engine/workload.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/rng.h"

namespace tokenmeter::engine {
namespace {

uint32_t LowLen(uint32_t mean) {
  return mean - mean / 2 > 0 ? mean - mean / 2 : 1;
}
uint32_t HighLen(uint32_t mean) { return mean + mean / 2; }

uint32_t SharedLen(const WorkloadOptions& o) {
  const auto wanted = uint32_t(std::lround(o.shared_prefix * o.prompt_len));
  const uint32_t most = LowLen(o.prompt_len) - 1;  // keep one own token
  return wanted < most ? wanted : most;
}

}  // namespace

std::string LoraName(int32_t adapter) {
  return "lora-" + std::to_string(adapter);
}
std::string TenantName(int32_t tenant) {
  return "tenant-" + std::to_string(tenant);
}

uint32_t MaxPromptLen(const WorkloadOptions& o) {
  return HighLen(o.prompt_len);
}
uint32_t MaxOutputLen(const WorkloadOptions& o) {
  return HighLen(o.output_len);
}

Status ValidateWorkload(const WorkloadOptions& o) {
  if (o.requests < 1 || o.requests > kMaxRequests) {
    return Status::Error("--requests must be 1.." +
                         std::to_string(kMaxRequests));
  }
  if (!std::isfinite(o.rate) || o.rate < 0) {
    return Status::Error("--rate must be a finite number >= 0");
  }
  if (o.prompt_len < 1) return Status::Error("--prompt-len must be >= 1");
  if (o.output_len < 1) return Status::Error("--output-len must be >= 1");
  if (!(o.shared_prefix >= 0 && o.shared_prefix <= 1)) {
    return Status::Error("--shared-prefix must be in [0, 1]");
  }
  if (o.vocab < 2) return Status::Error("vocabulary must hold >= 2 tokens");
  if (o.lora_adapters > kMaxLoraAdapters) {
    return Status::Error("--lora-adapters must be 0.." +
                         std::to_string(kMaxLoraAdapters));
  }
  if (o.tenants > kMaxTenants) {
    return Status::Error("--tenants must be 0.." + std::to_string(kMaxTenants));
  }
  if (o.priority_levels > kMaxPriorityLevels) {
    return Status::Error("--priority-levels must be 0.." +
                         std::to_string(kMaxPriorityLevels));
  }
  return Status::Ok();
}

std::vector<WorkloadRequest> GenerateWorkload(const WorkloadOptions& o) {
  // Separate streams, so that changing the rate does not change the prompts.
  Rng arrivals(Mix64(o.seed ^ 0x61727269ULL));
  Rng lengths(Mix64(o.seed ^ 0x6c656e67ULL));
  Rng tokens(Mix64(o.seed ^ 0x746f6b73ULL));
  Rng adapters(Mix64(o.seed ^ 0x6c6f7261ULL));
  Rng tenants(Mix64(o.seed ^ 0x74656e61ULL));
  Rng priorities(Mix64(o.seed ^ 0x7072696fULL));

  // Zipf's cumulative weights, for inverse-CDF draws.
  std::vector<double> lora_cdf(o.lora_adapters);
  double total = 0;
  for (uint32_t i = 0; i < o.lora_adapters; ++i) {
    total += 1.0 / double(i + 1);
    lora_cdf[i] = total;
  }

  std::vector<int32_t> shared(SharedLen(o));
  for (auto& t : shared) t = int32_t(tokens.UniformInt(1, o.vocab - 1));

  std::vector<WorkloadRequest> out(o.requests);
  double offset_s = 0;
  for (uint32_t i = 0; i < o.requests; ++i) {
    WorkloadRequest& r = out[i];
    r.id = i + 1;
    if (i > 0 && o.rate > 0) offset_s += arrivals.Exponential(1.0 / o.rate);
    r.arrival_offset_ns = uint64_t(std::llround(offset_s * 1e9));
    const auto prompt_len = uint32_t(
        lengths.UniformInt(LowLen(o.prompt_len), HighLen(o.prompt_len)));
    r.max_tokens = uint32_t(
        lengths.UniformInt(LowLen(o.output_len), HighLen(o.output_len)));
    r.prompt.reserve(prompt_len);
    r.prompt.assign(shared.begin(), shared.end());
    while (r.prompt.size() < prompt_len) {
      r.prompt.push_back(int32_t(tokens.UniformInt(1, o.vocab - 1)));
    }
    if (o.lora_adapters > 0) {
      const double u = adapters.Uniform01() * total;
      const auto a =
          size_t(std::upper_bound(lora_cdf.begin(), lora_cdf.end(), u) -
                 lora_cdf.begin());
      r.lora = int32_t(std::min<size_t>(a, o.lora_adapters - 1));
    }
    if (o.tenants > 0) {
      r.tenant = int32_t(tenants.UniformInt(0, o.tenants - 1));
    }
    if (o.priority_levels > 0) {
      r.has_priority = true;
      r.priority = int32_t(priorities.UniformInt(0, o.priority_levels - 1)) -
                   int32_t((o.priority_levels - 1) / 2);
    }
  }
  return out;
}

}  // namespace tokenmeter::engine
