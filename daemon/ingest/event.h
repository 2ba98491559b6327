// Decoded protocol frames (docs/protocol.md), as the frame decoder hands
// them to the daemon. Plain values; string views point into the decoder's
// buffer and are valid only until the next FrameDecoder call.
#ifndef TOKENMETER_DAEMON_INGEST_EVENT_H_
#define TOKENMETER_DAEMON_INGEST_EVENT_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/store/parts/cache_config.h"
#include "tokenmeter/protocol.h"

namespace tokenmeter::daemon {

enum class EventKind : uint8_t {
  kArrived = TM_EV_ARRIVED,
  kQueued = TM_EV_QUEUED,
  kScheduled = TM_EV_SCHEDULED,
  kTokens = TM_EV_TOKENS,
  kFinished = TM_EV_FINISHED,
  kPreempted = TM_EV_PREEMPTED,
  kStep = TM_EV_STEP,
  kExpertLoad = TM_EV_EXPERT_LOAD,  // 1.1
};
inline constexpr int kNumEventKinds = 8;
// "arrived", "queued", ... (the kind label of tokenmeter_ingest_events_total).
std::string_view EventKindName(EventKind kind);

enum class FinishReason : uint8_t { kStop, kLength, kAbort, kError };
inline constexpr int kNumFinishReasons = 4;
std::string_view FinishReasonName(FinishReason reason);

// A request id: an unsigned integer or a byte string (1..128 bytes).
struct RequestId {
  bool is_string = false;
  uint64_t number = 0;
  std::string_view text;  // valid while the frame is
};

// STEP statistics; `has` bits say which keys were present.
struct StepStats {
  enum Key : uint32_t {
    kRunning = 1u << 0,
    kWaiting = 1u << 1,
    kKvUsage = 1u << 2,
    kPromptTokens = 1u << 3,
    kGenerationTokens = 1u << 4,
    kPrefixQueries = 1u << 5,
    kPrefixHits = 1u << 6,
    kSpecDrafts = 1u << 7,
    kSpecDraftTokens = 1u << 8,
    kSpecAcceptedTokens = 1u << 9,
    kSpecAcceptedPerPos = 1u << 10,
  };
  uint32_t has = 0;
  uint64_t running = 0;
  uint64_t waiting = 0;
  double kv_usage = 0;
  uint64_t prompt_tokens = 0;
  uint64_t generation_tokens = 0;
  uint64_t prefix_queries = 0;
  uint64_t prefix_hits = 0;
  uint64_t spec_drafts = 0;
  uint64_t spec_draft_tokens = 0;
  uint64_t spec_accepted_tokens = 0;
  // Index into Batch::positions: spec_accepted_per_pos occupies
  // positions[pos_begin, pos_begin + pos_count).
  uint32_t pos_begin = 0;
  uint32_t pos_count = 0;
};

// ARRIVED params of protocol 1.1: the LoRA adapter and per-request labels
// (validated: label-name rules, UTF-8, the limits of protocol.h).
struct ArrivedExtras {
  std::string_view lora;  // empty: none
  uint8_t num_labels = 0;
  std::pair<std::string_view, std::string_view> labels[TM_MAX_REQUEST_LABELS];
};

// EXPERT_LOAD ([8, t, layer, counts]), as Event::expert_load() shows it:
// the layer (below TM_MAX_MOE_LAYERS) and its 1 to TM_MAX_MOE_EXPERTS
// counts, which live in Batch::positions.
struct ExpertLoadView {
  uint32_t layer;
  std::span<const uint64_t> counts;
};

// Where an EXPERT_LOAD's data is kept in an Event (beside StepStats, in
// the same bytes: Event stays 176 bytes).
struct ExpertLoadRef {
  uint32_t layer;
  uint32_t begin;  // index into Batch::positions
  uint32_t count;
};

struct Event {
  static constexpr uint32_t kNoExtras = UINT32_MAX;
  EventKind kind;
  uint64_t t_ns;
  RequestId rid;            // not for kStep, kExpertLoad
  uint64_t count = 0;       // ARRIVED prompt_tokens; TOKENS n
  uint64_t max_tokens = 0;  // ARRIVED params; valid when has_max_tokens
  uint64_t n = 0;           // ARRIVED params; valid when has_n
  bool has_max_tokens = false;
  bool has_n = false;
  FinishReason reason = FinishReason::kStop;  // FINISHED
  // ARRIVED with a lora or labels param: index into Batch::arrivals (in
  // the padding before `step`: Event stays 176 bytes).
  uint32_t extras = kNoExtras;
  union {
    StepStats step{};               // STEP
    ExpertLoadRef expert_load_ref;  // EXPERT_LOAD: read it with expert_load()
  };

  // An EXPERT_LOAD's layer and counts; `positions` is its batch's
  // Batch::positions. Only for kind kExpertLoad.
  ExpertLoadView expert_load(const uint64_t* positions) const {
    return {expert_load_ref.layer,
            {positions + expert_load_ref.begin, expert_load_ref.count}};
  }
};
static_assert(sizeof(Event) == 176, "Event is copied per event: keep it");

struct Hello {
  int64_t proto = 0;
  std::string engine;
  std::string model;
  std::string instance = "0";
  std::string scope;  // empty: the connection's private id space
  bool has_scope = false;
  std::vector<std::pair<std::string, std::string>> labels;  // in HELLO order
  int64_t pid = 0;
  bool has_pid = false;
  // Protocol 1.1.
  std::string profile;  // "vllm", "sglang", "lmdeploy"; empty: not sent
  // cache_config entries in HELLO order (store/parts/cache_config.h says
  // how values are rendered).
  std::vector<CacheConfigEntry> cache_config;
  bool has_cache_config = false;
  int64_t max_lora = 0;
  bool has_max_lora = false;
  // The client instance (random, repeated on every reconnect), and whether
  // it reads ACK frames (only with a session).
  uint64_t session = 0;
  bool has_session = false;
  bool ack = false;
  // Optional fields dropped (partial acceptance: pid, max_lora, the
  // cache_config map or entries): each counts as one bad_field.
  uint32_t bad_fields = 0;
};

// Why a frame or an event was rejected: the `reason` label of
// tokenmeter_ingest_errors_total. Frame-level reasons close the connection;
// event-level ones skip one event.
enum class IngestError : uint8_t {
  // Frame level.
  kInvalidMsgpack,      // bytes that are not msgpack
  kBadFrame,            // not an array starting with a known frame type
  kFrameTooLarge,       // frame over the size limit (or a length that says so)
  kStringTooLong,       // a string over the string limit
  kBatchTooLarge,       // more events than the batch limit
  kTooDeep,             // nesting deeper than the decoder allows
  kBatchBeforeHello,    // BATCH (or GOODBYE) before HELLO
  kSecondHello,         // HELLO after HELLO
  kBadHello,            // HELLO missing a key, wrong type, bad proto
  kBadName,             // HELLO engine name or label name breaks the rules
  kReservedLabel,       // HELLO label that the daemon sets or starts with __
  kTooManyLabels,       // more than 8 HELLO labels
  kPeerNotAllowed,      // peer credentials not in the allow-list
  kSeriesLimit,         // HELLO would create a series beyond the series cap
  kConnectionLimit,     // accepted beyond --max-connections and closed
  kUidConnectionLimit,  // accepted beyond --max-connections-per-uid
  kHelloTimeout,        // no complete HELLO within --hello-timeout
  kFdLimit,             // accept() out of descriptors: accepted, closed
  // Event level.
  kBadEvent,      // wrong types or arity inside one event
  kBadTimestamp,  // more than 1 s ahead or 1 h behind the daemon's clock
  kBadReason,     // FINISHED reason not one of the four
  kUnknownKind,   // an event kind this daemon does not know
  // Field level (1.2, partial acceptance): an optional field with a wrong
  // type or out of its range was dropped and its event (or HELLO) kept.
  kBadField,
  kCount,
};
std::string_view IngestErrorName(IngestError e);
inline constexpr bool IsEventLevel(IngestError e) {
  return e >= IngestError::kBadEvent;
}

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_INGEST_EVENT_H_
