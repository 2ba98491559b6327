// Token sampling and the stop rules.
#ifndef TOKENMETER_ENGINE_SAMPLER_H_
#define TOKENMETER_ENGINE_SAMPLER_H_

#include <cstdint>

#include "engine/rng.h"

namespace tokenmeter::engine {

// The token that ends a request (EOS). Prompts never contain it.
inline constexpr int32_t kStopToken = 0;

// Draws the next token from `logits` (vocab floats). temperature 0: greedy
// (the lowest index among the largest logits); otherwise softmax(logits / T)
// sampled with one draw from `rng`. O(vocab), no allocation.
int32_t SampleToken(const float* logits, uint32_t vocab, float temperature,
                    Rng& rng);

// kError: the engine failed the request (a disaggregated request whose KV
// never arrived); CheckFinish() never returns it.
enum class Finish : uint8_t { kNone, kStop, kLength, kError };

// Why a request whose latest output token is `token` and which now has
// `num_output` output tokens (that one included) ends, if it does: the stop
// token ends it by stop (the stop token counts as an output token, as in
// vLLM), reaching max_tokens by length. Stop wins when both hold.
Finish CheckFinish(int32_t token, uint32_t num_output, uint32_t max_tokens);

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_SAMPLER_H_
