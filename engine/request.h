// Request: one request's state inside the engine core.
#ifndef TOKENMETER_ENGINE_REQUEST_H_
#define TOKENMETER_ENGINE_REQUEST_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/rng.h"

namespace tokenmeter::engine {

// kDeferred: scheduled, its blocks allocated, waiting for its prompt's K/V
// from the prefill process (disaggregated decode). kHeld: finished on the
// prefill side, its blocks kept until the decode side has pulled them.
enum class RequestState : uint8_t {
  kPending,
  kWaiting,
  kDeferred,
  kRunning,
  kHeld,
  kFinished
};

struct Request {
  Request(uint64_t id_in, std::vector<int32_t> prompt, uint32_t max_tokens_in,
          uint64_t sampling_seed_in)
      : id(id_in),
        tokens(std::move(prompt)),
        prompt_len(uint32_t(tokens.size())),
        max_tokens(max_tokens_in),
        sampling_seed(sampling_seed_in),
        rng(sampling_seed_in) {
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
  // Priority scheduling (SchedulerOptions::priority): lower runs first,
  // ties in arrival order (arrival_seq, set by the scheduler's first Add).
  int32_t priority = 0;
  bool has_priority = false;  // ARRIVED carries it
  uint64_t arrival_seq = 0;
  // The W3C traceparent ARRIVED carries ("" for none): 55 characters.
  std::string traceparent;
  // Where the prompt's K/V came from at the first scheduling: found in the
  // local prefix cache, and received from the prefill process.
  uint32_t cached_tokens = 0;
  uint32_t external_tokens = 0;
  // Disaggregated decode: the prompt's K/V beyond the local prefix-cache
  // hit come from the prefill process, into blocks [kv_first_block,
  // kv_first_block + kv_num_blocks) of the block table; kv_attempts pulls
  // so far, the latest begun at kv_start_ns.
  bool remote_kv = false;
  uint32_t kv_first_block = 0;
  uint32_t kv_num_blocks = 0;
  uint32_t kv_attempts = 0;
  uint64_t kv_start_ns = 0;
  uint32_t preemptions = 0;
  uint64_t sampling_seed;  // rng's seed (the hand-over carries it)
  KvSeq kv;
  Rng rng;  // this request's sampling stream: same outputs whatever the batch
};

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_REQUEST_H_
