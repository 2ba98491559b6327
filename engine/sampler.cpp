#include "engine/sampler.h"

#include <cmath>

namespace tokenmeter::engine {

int32_t SampleToken(const float* logits, uint32_t vocab, float temperature,
                    Rng& rng) {
  uint32_t best = 0;
  for (uint32_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  if (!(temperature > 0)) return int32_t(best);
  // Inverse CDF over exp((l - max) / T); two passes, nothing stored.
  const double inv_t = 1.0 / double(temperature);
  const double mx = logits[best];
  double total = 0;
  for (uint32_t i = 0; i < vocab; ++i) {
    total += std::exp((double(logits[i]) - mx) * inv_t);
  }
  const double target = rng.Uniform01() * total;
  double acc = 0;
  for (uint32_t i = 0; i < vocab; ++i) {
    acc += std::exp((double(logits[i]) - mx) * inv_t);
    if (acc > target) return int32_t(i);
  }
  return int32_t(best);  // rounding left target at the very end
}

Finish CheckFinish(int32_t token, uint32_t num_output, uint32_t max_tokens) {
  if (token == kStopToken) return Finish::kStop;
  if (num_output >= max_tokens) return Finish::kLength;
  return Finish::kNone;
}

}  // namespace tokenmeter::engine
