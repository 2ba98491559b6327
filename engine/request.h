// Request: one request's state inside the engine core.
#ifndef TOKENMETER_ENGINE_REQUEST_H_
#define TOKENMETER_ENGINE_REQUEST_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/rng.h"

namespace tokenmeter::engine {

enum class RequestState : uint8_t { kPending, kWaiting, kRunning, kFinished };

struct Request {
  Request(uint64_t id_in, std::vector<int32_t> prompt, uint32_t max_tokens_in,
          uint64_t sampling_seed)
      : id(id_in),
        tokens(std::move(prompt)),
        prompt_len(uint32_t(tokens.size())),
        max_tokens(max_tokens_in),
        rng(sampling_seed) {
    tokens.reserve(size_t(prompt_len) + max_tokens);
  }

  uint32_t num_tokens() const { return uint32_t(tokens.size()); }
  uint32_t num_output() const { return num_tokens() - prompt_len; }

  uint64_t id;
  std::vector<int32_t> tokens;  // the prompt, then every output token
  uint32_t prompt_len;
  uint32_t max_tokens;
  // Leading tokens whose K/V are in the cache. A step computes tokens
  // [num_computed, num_computed + n); when that reaches num_tokens(), the
  // step's logits give the next output token. Preemption resets it to 0.
  uint32_t num_computed = 0;
  RequestState state = RequestState::kPending;
  bool ever_scheduled = false;
  // The LoRA adapter serving it (0..N-1), or -1 for the base model; and,
  // while it runs, the backend slot holding that adapter (else -1).
  int32_t lora = -1;
  int32_t lora_slot = -1;
  int32_t tenant = -1;  // for the metrics and the report only
  KvSeq kv;
  Rng rng;  // this request's sampling stream: same outputs whatever the batch
};

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_REQUEST_H_
