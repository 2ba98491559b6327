// A retired request's timeline: what the tracker saw of one request, handed
// over at retirement to whoever keeps or exports it (OTLP spans, the
// requests API). Plain data, no behaviour; times are the engine's
// CLOCK_MONOTONIC nanoseconds as the events carried them (0: not seen).
#ifndef TOKENMETER_DAEMON_TRACE_TIMELINE_H_
#define TOKENMETER_DAEMON_TRACE_TIMELINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tokenmeter::daemon::trace {

// One KV_TRANSFER event of the request (protocol 1.2).
struct KvTransfer {
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;  // the event's t
  bool recv = false;    // role: false "send" (prefill side), true "recv"
  bool ok = true;
  uint64_t bytes = UINT64_MAX;  // UINT64_MAX: not given
  uint64_t blocks = UINT64_MAX;
  std::string reason;     // empty: none
  std::string connector;  // empty: none
};

// One PREEMPTED event and the SCHEDULED that resumed the request (0 when
// none did before FINISHED).
struct Preemption {
  uint64_t preempted_ns = 0;
  uint64_t resumed_ns = 0;
};

// One TOKENS event.
struct TokenTick {
  uint64_t t_ns = 0;
  uint32_t n = 0;
};

struct RequestTimeline {
  // The tracked request's id: decimal for an integer id, else the string.
  std::string request_id;
  bool string_id = false;
  // The engine series the request was finished on (or, failing that, the
  // one it arrived on): its label pairs in exposition order (model_name,
  // engine, instance, scope and the HELLO labels) and its profile's name.
  std::vector<std::pair<std::string, std::string>> engine_labels;
  std::string profile;  // "vllm", "sglang", "lmdeploy"
  // That series' metric namespace (`vllm`, `tokenmeter_engine`, ...): with
  // the labels, what tells one engine series from another.
  std::string engine_family;
  // The engine's HELLO "engine" field (e.g. "vllm"), for gen_ai.system.
  std::string engine;
  // Per-request labels (ARRIVED labels) and LoRA adapter; empty: none.
  std::vector<std::pair<std::string, std::string>> request_labels;
  std::string lora;

  // Time points (0: not seen). scheduled_ns is the first SCHEDULED.
  uint64_t arrived_ns = 0;
  uint64_t queued_ns = 0;
  uint64_t scheduled_ns = 0;
  uint64_t first_token_ns = 0;
  uint64_t last_token_ns = 0;
  uint64_t finished_ns = 0;
  // FINISHED reason as on the wire ("stop", "length", "abort", "error");
  // empty when the request was retired without FINISHED (evicted).
  std::string finish_reason;

  uint32_t prompt_tokens = 0;
  uint32_t generation_tokens = 0;
  uint32_t max_tokens = 0;  // 0: not given
  uint32_t n = 0;           // 0: not given
  // The first SCHEDULED's info (protocol 1.2).
  bool has_info = false;
  uint32_t cached_tokens = 0;
  uint32_t external_tokens = 0;
  bool has_priority = false;
  int32_t priority = 0;

  std::vector<Preemption> preemptions;
  // The PREEMPTED events: preemptions.size(), or more for a request
  // restored from a snapshot (which holds the count, not the list).
  uint32_t preemption_count = 0;
  std::vector<KvTransfer> kv_transfers;
  // The TOKENS events in arrival order: the newest kMaxTokenTicks (fewer
  // when the tracker's tick log no longer held the older ones or skipped
  // them past its budget); tokens_not_shown: the generated tokens whose
  // TOKENS events are not here (generation_tokens less theirs).
  static constexpr size_t kMaxTokenTicks = 4096;
  std::vector<TokenTick> tokens;
  uint32_t tokens_not_shown = 0;

  // ARRIVED's W3C trace context; empty: none.
  std::string traceparent;
  std::string tracestate;

  // Set by the sinks on the way (TimelineSink): the trace id (32 lowercase
  // hex digits) the tracer built the request's spans under; empty when it
  // did not trace the request (tracing off, or not sampled).
  std::string exported_trace_id;
  // Set by the tracer with exported_trace_id: false until the receiver
  // accepted the request body that holds the spans, then true (the tracer
  // keeps a second reference until then); stays false when the body was
  // dropped or its export failed. Null: not traced.
  std::shared_ptr<const bool> trace_exported;

  // exported_trace_id once the spans were exported, else empty: what the
  // requests API and the live page show ("with their trace id when
  // exported").
  std::string_view shown_trace_id() const {
    return trace_exported != nullptr && *trace_exported
               ? std::string_view(exported_trace_id)
               : std::string_view();
  }
};

// Who receives the timelines: the tracker calls each sink's OnRetired()
// once per request, when the request leaves it (retired after its grace
// period, evicted idle, or dropped to make room: `evicted` says which of
// the last two). The sinks see one timeline in the order they were added
// to the tracker (the tracer, then the requests API's keeper): a sink may
// write to it (exported_trace_id) or move from it (the keeper keeps what it
// wants), and the sinks after it see what it left; the tracker frees it
// after the last. On the daemon's loop; must not call back into the
// tracker.
class TimelineSink {
 public:
  virtual ~TimelineSink() = default;
  // Whether the timelines should hold every TOKENS event (`tokens`): a
  // push per TOKENS, and memory per request proportional to its output.
  // Spans need only the points; the requests API's token ticks need them.
  virtual bool wants_token_ticks() const { return false; }
  virtual void OnRetired(RequestTimeline& timeline, bool evicted) = 0;
};

}  // namespace tokenmeter::daemon::trace

#endif  // TOKENMETER_DAEMON_TRACE_TIMELINE_H_
