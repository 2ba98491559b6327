// Decoded protocol frames (docs/protocol.md), as the frame decoder hands
// them to the daemon. Plain values; string views point into the decoder's
// buffer and are valid only until the next FrameDecoder call.
#ifndef TOKENMETER_DAEMON_INGEST_EVENT_H_
#define TOKENMETER_DAEMON_INGEST_EVENT_H_

#include <algorithm>
#include <cstddef>
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
  // 1.2
  kAdmissionRejected = TM_EV_ADMISSION_REJECTED,
  kKvTransfer = TM_EV_KV_TRANSFER,
  kSleep = TM_EV_SLEEP,
  // 1.3
  kRequestSummary = TM_EV_REQUEST_SUMMARY,
  kLatencies = TM_EV_LATENCIES,
};
inline constexpr int kNumEventKinds = TM_EV_LAST;
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

// STEP statistics; `has` bits say which keys were present. Every count is
// at most TM_MAX_EVENT_COUNT (the decoder drops larger ones), so 32 bits.
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
    kWaitingDeferred = 1u << 11,  // 1.2; only with kWaiting, at most waiting
  };
  uint32_t has = 0;
  uint32_t running = 0;
  uint32_t waiting = 0;
  uint32_t prompt_tokens = 0;
  uint32_t generation_tokens = 0;
  uint32_t prefix_queries = 0;
  uint32_t prefix_hits = 0;
  uint32_t spec_drafts = 0;
  uint32_t spec_draft_tokens = 0;
  uint32_t spec_accepted_tokens = 0;
  uint32_t waiting_deferred = 0;
  // Index into Batch::positions: spec_accepted_per_pos occupies
  // positions[pos_begin, pos_begin + pos_count).
  uint32_t pos_begin = 0;
  uint32_t pos_count = 0;
  double kv_usage = 0;
};

// The data of the 1.2 events, in Event's union: plain aggregates (a union
// member may not have initializers); the decoder sets every field.
//
// A string in the decoder's buffer (trivial, unlike std::string_view, so
// that it may live in Event's union).
struct TextRef {
  const char* data;
  uint32_t size;
  std::string_view view() const { return {data, size}; }
  static TextRef Of(std::string_view s) {
    return {s.data(), uint32_t(s.size())};
  }
};

// SCHEDULED info (1.2, [3, t, rid, info]): `has` bits say which keys were
// given; has 0 and present false: no info map (or one dropped whole).
struct ScheduledInfo {
  enum Key : uint8_t { kCached = 1u << 0, kExternal = 1u << 1 };
  uint32_t cached_tokens;
  uint32_t external_tokens;
  uint8_t has;
  bool present;  // a map was given (possibly with no known key)
};

// KV_TRANSFER info (1.2, [10, t, rid, info]), validated: role and start
// (at most t) required; the optional keys dropped when bad.
enum class KvRole : uint8_t { kSend, kRecv };
inline constexpr int kNumKvRoles = 2;
struct KvTransferInfo {
  uint64_t start_ns;
  uint64_t bytes;     // valid when has_bytes
  uint64_t blocks;    // valid when has_blocks
  TextRef reason;     // empty: none (label-value syntax)
  TextRef connector;  // empty: none (label-value syntax)
  KvRole role;
  bool ok;
  bool has_bytes;
  bool has_blocks;
};

// ADMISSION_REJECTED (1.2, [9, t, reason(, rid)]): the reason (label-value
// syntax); Event::rid is valid when has_rid.
struct AdmissionInfo {
  TextRef reason;
  bool has_rid;
};

// SLEEP (1.2, [11, t, state]): each resource's new state, or kKeep.
enum class SchedulerState : int8_t { kKeep = -1, kRunning, kPaused };
enum class WeightsState : int8_t {
  kKeep = -1,
  kResident,
  kOffloaded,
  kDiscarded
};
enum class KvCacheState : int8_t { kKeep = -1, kResident, kReleased };
struct SleepInfo {
  SchedulerState scheduler;
  WeightsState weights;
  KvCacheState kv_cache;
};

// REQUEST_SUMMARY (1.3, [12, t, reason, summary(, rid)]): one finished
// request as its engine computed it. Event::count holds prompt_tokens,
// Event::max_tokens / n their params (has_max_tokens / has_n),
// Event::reason the reason and Event::rid the id when has_rid; the rest is
// here. A duration is valid when its bit (1 << SummaryDuration) is in `has`.
enum class SummaryDuration : uint8_t {
  kTtft,
  kQueue,
  kPrefill,
  kDecode,
  kInference,
  kE2e,
  kTpot,
  kCount,
};
inline constexpr size_t kNumSummaryDurations = size_t(SummaryDuration::kCount);
struct RequestSummaryInfo {
  enum Key : uint16_t {
    kCachedTokens = 1u << kNumSummaryDurations,
    kMaxGenerationTokens = 1u << (kNumSummaryDurations + 1),
  };
  uint64_t duration_ns[kNumSummaryDurations];  // at most TM_MAX_DURATION_NS
  uint32_t generation_tokens;
  uint32_t cached_tokens;          // at most prompt_tokens
  uint32_t max_generation_tokens;  // of the request's group
  uint16_t has;
  bool has_rid;
};

// LATENCIES (1.3, [13, t, ttft, itl(, counts)]): the values live in
// Batch::positions, positions[begin, begin + ttft_count) the times to first
// token, the itl_count after them the inter-token latencies (ns); the
// optional counts are valid when their bit is in `has`.
struct LatenciesRef {
  enum Key : uint8_t {
    kPromptTokens = 1u << 0,
    kGenerationTokens = 1u << 1,
    kPreemptions = 1u << 2,
  };
  uint32_t begin;
  uint32_t ttft_count;
  uint32_t itl_count;
  uint32_t prompt_tokens;
  uint32_t generation_tokens;
  uint32_t preemptions;
  uint8_t has;
};

// ARRIVED params of protocol 1.1: the LoRA adapter and per-request labels
// (validated: label-name rules, UTF-8, the limits of protocol.h); of 1.2:
// priority and the W3C trace context (validated by protocol.h's rules).
struct ArrivedExtras {
  std::string_view lora;  // empty: none
  uint8_t num_labels = 0;
  std::pair<std::string_view, std::string_view> labels[TM_MAX_REQUEST_LABELS];
  bool has_priority = false;
  int32_t priority = 0;
  std::string_view traceparent;  // empty: none; else 55 bytes
  std::string_view tracestate;   // empty: none
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

// The bytes of Event's union (its largest member).
inline constexpr size_t kEventUnionBytes =
    std::max({sizeof(StepStats), sizeof(ExpertLoadRef), sizeof(ScheduledInfo),
              sizeof(KvTransferInfo), sizeof(AdmissionInfo), sizeof(SleepInfo),
              sizeof(RequestSummaryInfo), sizeof(LatenciesRef)});

struct Event {
  static constexpr uint32_t kNoExtras = UINT32_MAX;
  // Every member zero (the union whole) or its default below.
  Event() : union_bytes{} {}
  // For the frame decoder, once per event: the members before the union by
  // their defaults, the union left to the decoder, which sets the member
  // of the event's kind (none for ARRIVED, QUEUED, TOKENS, FINISHED,
  // PREEMPTED). Value-initializing instead (an implicit constructor)
  // zeroed all 176 bytes with a `rep stos`, a sixth of the daemon's ingest
  // time (docs/performance.md, "The decoder's Event").
  struct ForDecoder {};
  explicit Event(ForDecoder) {}

  EventKind kind = EventKind::kArrived;
  uint64_t t_ns = 0;
  RequestId rid;       // not for kStep, kExpertLoad, kSleep, kLatencies;
                       // kAdmissionRejected: when admission.has_rid;
                       // kRequestSummary: when summary.has_rid
  uint64_t count = 0;  // ARRIVED and REQUEST_SUMMARY prompt_tokens; TOKENS n
  // ARRIVED params, REQUEST_SUMMARY keys; valid when has_max_tokens / has_n.
  uint64_t max_tokens = 0;
  uint64_t n = 0;
  bool has_max_tokens = false;
  bool has_n = false;
  FinishReason reason = FinishReason::kStop;  // FINISHED, REQUEST_SUMMARY
  // ARRIVED with a lora, labels, priority or trace param: index into
  // Batch::arrivals (in the padding before `step`).
  uint32_t extras = kNoExtras;
  union {
    StepStats step;                 // STEP
    ExpertLoadRef expert_load_ref;  // EXPERT_LOAD: read it with expert_load()
    ScheduledInfo scheduled;        // SCHEDULED
    KvTransferInfo kv_transfer;     // KV_TRANSFER
    AdmissionInfo admission;        // ADMISSION_REJECTED
    SleepInfo sleep;                // SLEEP
    RequestSummaryInfo summary;     // REQUEST_SUMMARY
    LatenciesRef latencies;         // LATENCIES
    unsigned char union_bytes[kEventUnionBytes];
  };

  // An EXPERT_LOAD's layer and counts; `positions` is its batch's
  // Batch::positions. Only for kind kExpertLoad.
  ExpertLoadView expert_load(const uint64_t* positions) const {
    return {expert_load_ref.layer,
            {positions + expert_load_ref.begin, expert_load_ref.count}};
  }
};
static_assert(sizeof(Event) <= 176, "Event is copied per event: keep it");

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
