// C++ wrapper over the C ABI in tokenmeter.h: RAII, string_view ids,
// default "now" timestamps. Header-only; every call forwards to one C call
// and has that call's cost, thread rules and failure behaviour (see
// tokenmeter.h). Nothing here throws. C++17; the Arrived() overloads with
// request labels as a std::span and ExpertLoad() need C++20.
#ifndef TOKENMETER_CLIENT_HPP_
#define TOKENMETER_CLIENT_HPP_

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>
#if __cplusplus >= 202002L
#include <span>
#endif

#include "tokenmeter/tokenmeter.h"

namespace tokenmeter {

// A HELLO cache_config value: str, int, float (finite) or bool, sent with
// its own msgpack type. {"block_size", 16}, {"dtype", "auto"},
// {"gpu_memory_utilization", 0.9} and {"enable_prefix_caching", true} pick
// the alternative their literal suggests.
using CacheConfigValue = std::variant<std::string, int64_t, double, bool>;

struct Options {
  std::string socket_path = TM_DEFAULT_SOCKET_PATH;
  std::string engine = "tokenmeter-engine";
  std::string model;     // required
  std::string instance;  // empty: the daemon's default "0"
  std::string scope;     // empty: a private request-id space
  std::vector<std::pair<std::string, std::string>> labels;
  // Protocol 1.1 HELLO keys (tm_options_set_profile() and the others).
  std::string profile;  // "vllm", "sglang" or "lmdeploy"; empty: not sent
  // The engine's KV-cache configuration, sent in this order; at most
  // TM_MAX_CACHE_CONFIG entries, keys as label names, none twice.
  std::vector<std::pair<std::string, CacheConfigValue>> cache_config;
  std::optional<int64_t> max_lora;  // >= 0; nullopt: not sent
  size_t buffer_capacity = 65536;
  uint32_t flush_interval_ms = 20;
  uint32_t close_timeout_ms = 1000;
  uint32_t max_threads = 64;
  // Acknowledged delivery and its replay buffer (tm_options_set_ack(),
  // tm_options_set_replay_bytes()).
  bool ack = true;
  size_t replay_bytes = TM_DEFAULT_REPLAY_BYTES;
};

struct Stats {
  uint64_t events_sent = 0;
  uint64_t events_dropped = 0;
  uint64_t events_rejected = 0;
  uint64_t reconnects = 0;
  uint64_t batches_sent = 0;
  uint64_t bytes_sent = 0;
  bool connected = false;
  uint64_t connect_failures = 0;
  uint64_t batches_replayed = 0;
  uint64_t events_unacked = 0;
  uint64_t events_discarded = 0;
  uint64_t fields_dropped = 0;  // TM_STAT_FIELDS_DROPPED
};

// One request label of Arrived(): (name, value).
using RequestLabel = std::pair<std::string_view, std::string_view>;

enum class FinishReason : int {
  kStop = TM_FINISH_STOP,
  kLength = TM_FINISH_LENGTH,
  kAbort = TM_FINISH_ABORT,
  kError = TM_FINISH_ERROR,
};

// ARRIVED params for Arrived(rid, prompt_tokens, params): tm_arrived_params()
// (protocol 1.1 and 1.2). An empty string_view means "none" (an empty
// tracestate, which the C call can send, says nothing a missing one does
// not); `labels` points at n_labels (name, value) pairs. The rules are the C
// call's.
struct RequestParams {
  uint32_t max_tokens = 0;  // 0: not given
  uint32_t n = 0;           // 0: not given
  std::string_view lora;
  const RequestLabel* labels = nullptr;
  size_t n_labels = 0;
  std::optional<int32_t> priority;  // nullopt: not sent; lower runs first
  std::string_view traceparent;     // W3C traceparent, version 00
  std::string_view tracestate;      // W3C tracestate, at most 256 bytes
};

// The first SCHEDULED's info (protocol 1.2): tm_scheduled_ex().
struct SchedulingInfo {
  uint32_t cached_tokens = 0;    // found in the local prefix cache
  uint32_t external_tokens = 0;  // received instead of computed
};

// A value registered with Client::RegisterValue() (tm_register_value()):
// passed in place of its string, it costs no pass over the string per call.
// id 0: none.
struct ValueId {
  uint32_t id = 0;
};

// One KV-cache transfer (protocol 1.2): tm_kv_transfer().
enum class KvRole : int { kSend = TM_KV_SEND, kRecv = TM_KV_RECV };
struct KvTransferInfo {
  KvRole role = KvRole::kSend;
  uint64_t start_ns = 0;          // required: when the transfer began
  std::optional<uint64_t> bytes;  // nullopt: not sent
  std::optional<uint64_t> blocks;
  bool ok = true;
  std::string_view reason;     // empty: none; label-value syntax
  std::string_view connector;  // empty: none; label-value syntax
  ValueId reason_id;           // in place of reason (then empty)
  ValueId connector_id;        // in place of connector (then empty)
};

// The engine's sleep state (protocol 1.2): tm_sleep_state(). kKeep leaves a
// part out of the event (the daemon keeps its previous value).
enum class SchedulerState : int {
  kKeep = TM_SCHEDULER_KEEP,
  kRunning = TM_SCHEDULER_RUNNING,
  kPaused = TM_SCHEDULER_PAUSED,
};
enum class WeightsState : int {
  kKeep = TM_WEIGHTS_KEEP,
  kResident = TM_WEIGHTS_RESIDENT,
  kOffloaded = TM_WEIGHTS_OFFLOADED,
  kDiscarded = TM_WEIGHTS_DISCARDED,
};
enum class KvCacheState : int {
  kKeep = TM_KV_CACHE_KEEP,
  kResident = TM_KV_CACHE_RESIDENT,
  kReleased = TM_KV_CACHE_RELEASED,
};

// One finished request as its engine computed it (protocol 1.3):
// tm_request_summary(). nullopt: not given (not sent, nothing observed).
struct RequestSummary {
  FinishReason reason = FinishReason::kStop;
  uint64_t prompt_tokens = 0;             // required
  uint64_t generation_tokens = 0;         // required
  std::optional<uint64_t> cached_tokens;  // at most prompt_tokens
  std::optional<uint64_t> max_tokens;
  std::optional<uint64_t> n;
  std::optional<uint64_t> max_generation_tokens;  // of the request's group
  // Durations in ns, each at most TM_MAX_DURATION_NS.
  std::optional<uint64_t> ttft_ns;
  std::optional<uint64_t> queue_ns;
  std::optional<uint64_t> prefill_ns;
  std::optional<uint64_t> decode_ns;
  std::optional<uint64_t> inference_ns;
  std::optional<uint64_t> e2e_ns;
  std::optional<uint64_t> tpot_ns;
};

// What one iteration counted (protocol 1.3, the counts of tm_latencies()).
struct IterationCounts {
  std::optional<uint64_t> prompt_tokens;
  std::optional<uint64_t> generation_tokens;
  std::optional<uint64_t> preemptions;
};

// One STEP's statistics; set only what the engine knows.
class StepStats {
 public:
  StepStats& Running(uint64_t v) { return Set(TM_STEP_KEY_RUNNING, double(v)); }
  StepStats& Waiting(uint64_t v) { return Set(TM_STEP_KEY_WAITING, double(v)); }
  StepStats& KvUsage(double fraction) {
    return Set(TM_STEP_KEY_KV_USAGE, fraction);
  }
  StepStats& PromptTokens(uint64_t v) {
    return Set(TM_STEP_KEY_PROMPT_TOKENS, double(v));
  }
  StepStats& GenerationTokens(uint64_t v) {
    return Set(TM_STEP_KEY_GENERATION_TOKENS, double(v));
  }
  StepStats& PrefixQueries(uint64_t v) {
    return Set(TM_STEP_KEY_PREFIX_QUERIES, double(v));
  }
  StepStats& PrefixHits(uint64_t v) {
    return Set(TM_STEP_KEY_PREFIX_HITS, double(v));
  }
  StepStats& SpecDrafts(uint64_t v) {
    return Set(TM_STEP_KEY_SPEC_DRAFTS, double(v));
  }
  StepStats& SpecDraftTokens(uint64_t v) {
    return Set(TM_STEP_KEY_SPEC_DRAFT_TOKENS, double(v));
  }
  StepStats& SpecAcceptedTokens(uint64_t v) {
    return Set(TM_STEP_KEY_SPEC_ACCEPTED_TOKENS, double(v));
  }
  // Protocol 1.2: of Waiting(), those waiting for something other than
  // capacity; needs Waiting() and at most its value, else Step() fails.
  StepStats& WaitingDeferred(uint64_t v) {
    return Set(TM_STEP_KEY_WAITING_DEFERRED, double(v));
  }
  // Copies at most TM_MAX_SPEC_POSITIONS entries; more makes Step() fail.
  StepStats& SpecAcceptedPerPos(const uint64_t* counts, size_t n) {
    n_pos_ = n;
    for (size_t i = 0; i < n && i < TM_MAX_SPEC_POSITIONS; ++i) {
      pos_[i] = counts[i];
    }
    return *this;
  }

 private:
  friend class Client;
  StepStats& Set(tm_step_key key, double v) {
    for (size_t i = 0; i < n_; ++i) {
      if (keys_[i] == key) {
        values_[i] = v;
        return *this;
      }
    }
    keys_[n_] = key;
    values_[n_++] = v;
    return *this;
  }
  tm_step_key keys_[TM_STEP_KEY_COUNT] = {};
  double values_[TM_STEP_KEY_COUNT] = {};
  size_t n_ = 0;
  uint64_t pos_[TM_MAX_SPEC_POSITIONS] = {};
  size_t n_pos_ = 0;
};

// Owns one tm_client; closing (flush with the close timeout, then free)
// happens in Close() or the destructor. Neither copyable nor movable:
// Create() hands it out in a std::unique_ptr.
class Client {
 public:
  // Returns TM_OK and sets *out, or a TM_E_* code (an option the C layer
  // refused, or tm_client_new's failure).
  static int Create(const Options& o, std::unique_ptr<Client>* out) {
    tm_options* opts = tm_options_new();
    if (opts == nullptr) return TM_E_NOMEM;
    int rc = tm_options_set_socket_path(opts, o.socket_path.c_str());
    if (rc == TM_OK) rc = tm_options_set_engine(opts, o.engine.c_str());
    if (rc == TM_OK) rc = tm_options_set_model(opts, o.model.c_str());
    if (rc == TM_OK && !o.instance.empty()) {
      rc = tm_options_set_instance(opts, o.instance.c_str());
    }
    if (rc == TM_OK && !o.scope.empty()) {
      rc = tm_options_set_scope(opts, o.scope.c_str());
    }
    for (const auto& [name, value] : o.labels) {
      if (rc == TM_OK) {
        rc = tm_options_add_label(opts, name.c_str(), value.c_str());
      }
    }
    if (rc == TM_OK && !o.profile.empty()) {
      rc = tm_options_set_profile(opts, o.profile.c_str());
    }
    for (const auto& [key, value] : o.cache_config) {
      if (rc == TM_OK) rc = AddCacheConfig(opts, key.c_str(), value);
    }
    if (rc == TM_OK && o.max_lora.has_value()) {
      rc = tm_options_set_max_lora(opts, *o.max_lora);
    }
    if (rc == TM_OK) {
      rc = tm_options_set_buffer_capacity(opts, o.buffer_capacity);
    }
    if (rc == TM_OK) {
      rc = tm_options_set_flush_interval_ms(opts, o.flush_interval_ms);
    }
    if (rc == TM_OK) {
      rc = tm_options_set_close_timeout_ms(opts, o.close_timeout_ms);
    }
    if (rc == TM_OK) rc = tm_options_set_max_threads(opts, o.max_threads);
    if (rc == TM_OK) rc = tm_options_set_ack(opts, o.ack ? 1 : 0);
    if (rc == TM_OK) rc = tm_options_set_replay_bytes(opts, o.replay_bytes);
    tm_client* c = nullptr;
    if (rc == TM_OK) rc = tm_client_new(opts, &c);
    tm_options_free(opts);
    if (rc != TM_OK) return rc;
    out->reset(new (std::nothrow) Client(c));
    if (*out == nullptr) {
      tm_client_close(c, nullptr, 0);
      return TM_E_NOMEM;
    }
    return TM_OK;
  }

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client() { Close(); }

  // Flushes (bounded by the close timeout) and frees the C client; returns
  // the final counters. Later event calls return TM_E_INVALID.
  Stats Close() noexcept {
    uint64_t s[TM_STAT_COUNT] = {};
    if (c_ != nullptr) {
      tm_client_close(c_, s, TM_STAT_COUNT);
      c_ = nullptr;
      final_ = ToStats(s);
    }
    return final_;
  }

  int Arrived(uint64_t rid, uint32_t prompt_tokens, uint32_t max_tokens = 0,
              uint32_t n = 0, uint64_t t_ns = 0) noexcept {
    return tm_arrived(c_, t_ns, rid, prompt_tokens, max_tokens, n);
  }
  int Arrived(std::string_view rid, uint32_t prompt_tokens,
              uint32_t max_tokens = 0, uint32_t n = 0,
              uint64_t t_ns = 0) noexcept {
    return tm_arrived_str(c_, t_ns, rid.data(), rid.size(), prompt_tokens,
                          max_tokens, n);
  }
#if __cplusplus >= 202002L
  // ARRIVED with the protocol 1.1 params: tm_arrived_ex(_str). `lora`
  // empty means none; `labels` are (name, value) pairs, the rules of
  // tm_arrived_ex(). The strings are copied once more, NUL-terminated, into
  // buffers on the stack (about 1.7 KB; no allocation); one holding a NUL
  // byte, or longer than its limit, makes the call TM_E_INVALID, counted as
  // rejected like any the C call refuses.
  int Arrived(uint64_t rid, uint32_t prompt_tokens, uint32_t max_tokens,
              uint32_t n, std::string_view lora,
              std::span<const RequestLabel> labels = {},
              uint64_t t_ns = 0) noexcept {
    ArrivedStrings a;
    if (!a.Copy(lora, labels.data(), labels.size())) {
      return tm_arrived_ex(c_, t_ns, rid, prompt_tokens, max_tokens, n, nullptr,
                           nullptr, kRefusedLabels);
    }
    return tm_arrived_ex(c_, t_ns, rid, prompt_tokens, max_tokens, n,
                         a.lora_arg, a.labels, a.n_labels);
  }
  int Arrived(std::string_view rid, uint32_t prompt_tokens, uint32_t max_tokens,
              uint32_t n, std::string_view lora,
              std::span<const RequestLabel> labels = {},
              uint64_t t_ns = 0) noexcept {
    ArrivedStrings a;
    if (!a.Copy(lora, labels.data(), labels.size())) {
      return tm_arrived_ex_str(c_, t_ns, rid.data(), rid.size(), prompt_tokens,
                               max_tokens, n, nullptr, nullptr, kRefusedLabels);
    }
    return tm_arrived_ex_str(c_, t_ns, rid.data(), rid.size(), prompt_tokens,
                             max_tokens, n, a.lora_arg, a.labels, a.n_labels);
  }
#endif
  // ARRIVED with the protocol 1.1 and 1.2 params: tm_arrived_params(_str).
  // The strings are copied once more, NUL-terminated, into buffers on the
  // stack (about 2 KB; no allocation); a lora or label holding a NUL byte,
  // or longer than its limit, makes the call TM_E_INVALID, counted as
  // rejected like any the C call refuses; such a traceparent or tracestate
  // is left out as a malformed one is (TM_STAT_FIELDS_DROPPED; the event
  // is sent).
  int Arrived(uint64_t rid, uint32_t prompt_tokens, const RequestParams& p,
              uint64_t t_ns = 0) noexcept {
    ArrivedStrings a;
    tm_request_params cp = TM_REQUEST_PARAMS_INIT;
    a.Fill(p, &cp);
    return tm_arrived_params(c_, t_ns, rid, prompt_tokens, &cp);
  }
  int Arrived(std::string_view rid, uint32_t prompt_tokens,
              const RequestParams& p, uint64_t t_ns = 0) noexcept {
    ArrivedStrings a;
    tm_request_params cp = TM_REQUEST_PARAMS_INIT;
    a.Fill(p, &cp);
    return tm_arrived_params_str(c_, t_ns, rid.data(), rid.size(),
                                 prompt_tokens, &cp);
  }
  int Queued(uint64_t rid, uint64_t t_ns = 0) noexcept {
    return tm_queued(c_, t_ns, rid);
  }
  int Queued(std::string_view rid, uint64_t t_ns = 0) noexcept {
    return tm_queued_str(c_, t_ns, rid.data(), rid.size());
  }
  int Scheduled(uint64_t rid, uint64_t t_ns = 0) noexcept {
    return tm_scheduled(c_, t_ns, rid);
  }
  int Scheduled(std::string_view rid, uint64_t t_ns = 0) noexcept {
    return tm_scheduled_str(c_, t_ns, rid.data(), rid.size());
  }
  // The first SCHEDULED with where the prompt tokens came from (protocol
  // 1.2): tm_scheduled_ex(_str).
  int Scheduled(uint64_t rid, const SchedulingInfo& info,
                uint64_t t_ns = 0) noexcept {
    return tm_scheduled_ex(c_, t_ns, rid, info.cached_tokens,
                           info.external_tokens);
  }
  int Scheduled(std::string_view rid, const SchedulingInfo& info,
                uint64_t t_ns = 0) noexcept {
    return tm_scheduled_ex_str(c_, t_ns, rid.data(), rid.size(),
                               info.cached_tokens, info.external_tokens);
  }
  int Tokens(uint64_t rid, uint32_t n, uint64_t t_ns = 0) noexcept {
    return tm_tokens(c_, t_ns, rid, n);
  }
  int Tokens(std::string_view rid, uint32_t n, uint64_t t_ns = 0) noexcept {
    return tm_tokens_str(c_, t_ns, rid.data(), rid.size(), n);
  }
  // One step's tokens: tm_tokens_batch(). `n` nullptr means 1 token each,
  // else `count` counts (0 skips that entry). Returns the number of events
  // appended, or TM_E_INVALID.
  int TokensBatch(const uint64_t* rids, size_t count,
                  const uint32_t* n = nullptr, uint64_t t_ns = 0) noexcept {
    return tm_tokens_batch(c_, t_ns, rids, n, count);
  }
  int Finished(uint64_t rid, FinishReason reason, uint64_t t_ns = 0) noexcept {
    return tm_finished(c_, t_ns, rid, static_cast<tm_finish_reason>(reason));
  }
  int Finished(std::string_view rid, FinishReason reason,
               uint64_t t_ns = 0) noexcept {
    return tm_finished_str(c_, t_ns, rid.data(), rid.size(),
                           static_cast<tm_finish_reason>(reason));
  }
  int Preempted(uint64_t rid, uint64_t t_ns = 0) noexcept {
    return tm_preempted(c_, t_ns, rid);
  }
  int Preempted(std::string_view rid, uint64_t t_ns = 0) noexcept {
    return tm_preempted_str(c_, t_ns, rid.data(), rid.size());
  }
  int Step(const StepStats& s, uint64_t t_ns = 0) noexcept {
    return tm_step(c_, t_ns, s.keys_, s.values_, s.n_, s.pos_, s.n_pos_);
  }
#if __cplusplus >= 202002L
  // MoE expert load, protocol 1.1: tm_expert_load(). `counts` are the
  // tokens MoE layer `layer` routed to each expert since the previous call
  // for that layer (1 .. TM_MAX_MOE_EXPERTS entries, each at most
  // TM_MAX_EVENT_COUNT); copied into the buffer, no allocation.
  int ExpertLoad(uint32_t layer, std::span<const uint64_t> counts,
                 uint64_t t_ns = 0) noexcept {
    return tm_expert_load(c_, t_ns, layer, counts.data(), counts.size());
  }
#endif

  // Protocol 1.2: a request refused before it entered the engine,
  // tm_admission_rejected(_rid, _str): without an id, or with the request's
  // integer or string id (first, as in the other calls). `reason` in
  // label-value syntax (1 to 64 bytes of UTF-8, no control characters); it
  // is copied NUL-terminated onto the stack, and one holding a NUL byte or
  // longer than 64 bytes makes the call TM_E_INVALID, counted as rejected.
  int AdmissionRejected(std::string_view reason, uint64_t t_ns = 0) noexcept {
    LabelValue r(reason);
    return tm_admission_rejected(c_, t_ns, r.c_str());
  }
  int AdmissionRejected(uint64_t rid, std::string_view reason,
                        uint64_t t_ns = 0) noexcept {
    LabelValue r(reason);
    return tm_admission_rejected_rid(c_, t_ns, r.c_str(), rid);
  }
  int AdmissionRejected(std::string_view rid, std::string_view reason,
                        uint64_t t_ns = 0) noexcept {
    LabelValue r(reason);
    return tm_admission_rejected_str(c_, t_ns, r.c_str(), rid.data(),
                                     rid.size());
  }
  // Registers a reason or connector once (tm_register_value()): TM_OK and
  // *id, or TM_E_INVALID (not label-value syntax, or longer than 64 bytes;
  // NULL id; after Close(), which lets go of the client), TM_E_NOMEM
  // (TM_MAX_VALUE_IDS values registered), TM_E_CLOSED / TM_E_FORKED (the
  // C client closed or inherited), *id untouched. Takes a mutex and allocates:
  // at start-up, not per request. The string is copied NUL-terminated onto the
  // stack.
  int RegisterValue(std::string_view value, ValueId* id) noexcept {
    if (id == nullptr) return TM_E_INVALID;
    LabelValue v(value);
    const int rc = tm_register_value(c_, v.c_str());
    if (rc < 0) return rc;
    id->id = uint32_t(rc);
    return TM_OK;
  }
  // AdmissionRejected() with a registered reason: a tm_tokens()'s cost.
  int AdmissionRejected(ValueId reason, uint64_t t_ns = 0) noexcept {
    return tm_admission_rejected_id(c_, t_ns, reason.id);
  }
  int AdmissionRejected(uint64_t rid, ValueId reason,
                        uint64_t t_ns = 0) noexcept {
    return tm_admission_rejected_id_rid(c_, t_ns, reason.id, rid);
  }
  int AdmissionRejected(std::string_view rid, ValueId reason,
                        uint64_t t_ns = 0) noexcept {
    return tm_admission_rejected_id_str(c_, t_ns, reason.id, rid.data(),
                                        rid.size());
  }
  // Protocol 1.2: one KV-cache transfer of the request ended at t_ns (0:
  // now), tm_kv_transfer(_str). reason and connector are copied as
  // AdmissionRejected()'s reason is; a `bytes` or `blocks` of UINT64_MAX
  // (TM_KV_UNKNOWN in C) is refused like any value over the limit.
  int KvTransfer(uint64_t rid, const KvTransferInfo& info,
                 uint64_t t_ns = 0) noexcept {
    LabelValue reason(info.reason), connector(info.connector);
    const tm_kv_transfer_info kv = ToC(info, reason, connector);
    return tm_kv_transfer(c_, t_ns, rid, &kv);
  }
  int KvTransfer(std::string_view rid, const KvTransferInfo& info,
                 uint64_t t_ns = 0) noexcept {
    LabelValue reason(info.reason), connector(info.connector);
    const tm_kv_transfer_info kv = ToC(info, reason, connector);
    return tm_kv_transfer_str(c_, t_ns, rid.data(), rid.size(), &kv);
  }
  // Protocol 1.2: the engine's sleep state changed, tm_sleep_state().
  int SleepState(SchedulerState scheduler, WeightsState weights,
                 KvCacheState kv_cache, uint64_t t_ns = 0) noexcept {
    return tm_sleep_state(c_, t_ns, static_cast<tm_scheduler_state>(scheduler),
                          static_cast<tm_weights_state>(weights),
                          static_cast<tm_kv_cache_state>(kv_cache));
  }

  // Protocol 1.3: one finished request as the engine computed it,
  // tm_request_summary(_rid, _str): without an id, or with the request's
  // integer or string id (it only names the request). A field given as
  // UINT64_MAX (TM_NOT_GIVEN in C) is refused like any value over its
  // limit.
  int RequestSummary(const tokenmeter::RequestSummary& s,
                     uint64_t t_ns = 0) noexcept {
    const tm_request_summary_info c = ToC(s);
    return tm_request_summary(c_, t_ns, &c);
  }
  int RequestSummary(uint64_t rid, const tokenmeter::RequestSummary& s,
                     uint64_t t_ns = 0) noexcept {
    const tm_request_summary_info c = ToC(s);
    return tm_request_summary_rid(c_, t_ns, rid, &c);
  }
  int RequestSummary(std::string_view rid, const tokenmeter::RequestSummary& s,
                     uint64_t t_ns = 0) noexcept {
    const tm_request_summary_info c = ToC(s);
    return tm_request_summary_str(c_, t_ns, rid.data(), rid.size(), &c);
  }
#if __cplusplus >= 202002L
  // Protocol 1.3: one iteration's times to first token and inter-token
  // latencies (ns, at most TM_MAX_LATENCIES together) and what it counted,
  // tm_latencies(); copied into the buffer, no allocation.
  int Latencies(std::span<const uint64_t> ttft_ns,
                std::span<const uint64_t> itl_ns,
                const IterationCounts& counts = {},
                uint64_t t_ns = 0) noexcept {
    tm_iteration_counts c = TM_ITERATION_COUNTS_INIT;
    c.prompt_tokens = Given(counts.prompt_tokens);
    c.generation_tokens = Given(counts.generation_tokens);
    c.preemptions = Given(counts.preemptions);
    return tm_latencies(c_, t_ns, ttft_ns.data(), ttft_ns.size(), itl_ns.data(),
                        itl_ns.size(), &c);
  }
#endif

  int Flush(uint32_t timeout_ms) noexcept {
    return tm_client_flush(c_, timeout_ms);
  }
  int AttachThread() noexcept { return tm_thread_attach(c_); }
  Stats GetStats() const noexcept {
    uint64_t s[TM_STAT_COUNT] = {};
    if (c_ == nullptr) return final_;
    tm_client_stats(c_, s, TM_STAT_COUNT);
    return ToStats(s);
  }
  // The C handle, for code that mixes both APIs. Owned by this object.
  tm_client* handle() const noexcept { return c_; }

 private:
  explicit Client(tm_client* c) : c_(c) {}
  static int AddCacheConfig(tm_options* opts, const char* key,
                            const CacheConfigValue& v) {
    if (const auto* s = std::get_if<std::string>(&v)) {
      return tm_options_add_cache_config_str(opts, key, s->c_str());
    }
    if (const auto* i = std::get_if<int64_t>(&v)) {
      return tm_options_add_cache_config_int(opts, key, *i);
    }
    if (const auto* d = std::get_if<double>(&v)) {
      return tm_options_add_cache_config_float(opts, key, *d);
    }
    return tm_options_add_cache_config_bool(opts, key, std::get<bool>(v));
  }

  // An n_labels the C call always refuses (and counts): what Arrived()
  // passes when its strings cannot be handed over.
  static constexpr size_t kRefusedLabels = TM_MAX_REQUEST_LABELS + 1;

  // Copies `s` NUL-terminated into out[cap]; false when it holds a NUL byte
  // or does not fit (then longer than the C call takes).
  static bool CopyOne(std::string_view s, char* out, size_t cap) noexcept {
    if (s.size() >= cap) return false;
    if (!s.empty()) {
      if (std::memchr(s.data(), 0, s.size()) != nullptr) return false;
      std::memcpy(out, s.data(), s.size());
    }
    out[s.size()] = '\0';
    return true;
  }

  // NUL-terminated copies of Arrived()'s strings. The buffers are left
  // uninitialized (2 KB not cleared per call); Copy() and Fill() write what
  // the C call reads.
  struct ArrivedStrings {  // NOLINT(cppcoreguidelines-pro-type-member-init)
    // False when a string holds a NUL byte or does not fit, or there are
    // too many labels, or labels_in is null with n_in not 0.
    bool Copy(std::string_view lora_in, const RequestLabel* labels_in,
              size_t n_in) noexcept {
      if (n_in > TM_MAX_REQUEST_LABELS || (labels_in == nullptr && n_in != 0))
        return false;
      if (!lora_in.empty()) {
        if (!CopyOne(lora_in, lora, sizeof lora)) return false;
        lora_arg = lora;
      }
      for (size_t i = 0; i < n_in; ++i) {
        const auto& [name, value] = labels_in[i];
        if (!CopyOne(name, names[n_labels], sizeof names[n_labels]) ||
            !CopyOne(value, values[n_labels], sizeof values[n_labels])) {
          return false;
        }
        labels[n_labels] = {names[n_labels], values[n_labels]};
        ++n_labels;
      }
      return true;
    }
    // `out` from `p`; a lora or label that cannot be handed over makes
    // `out` one the C call refuses, a trace string that cannot (too long
    // for its rule, or holding a NUL byte) one the C call leaves out and
    // counts in TM_STAT_FIELDS_DROPPED, as a malformed one.
    void Fill(const RequestParams& p, tm_request_params* out) noexcept {
      out->max_tokens = p.max_tokens;
      out->n = p.n;
      if (p.priority.has_value()) {
        out->has_priority = 1;
        out->priority = *p.priority;
      }
      const bool ok = Copy(p.lora, p.labels, p.n_labels);
      if (!p.traceparent.empty()) {
        out->traceparent =
            CopyOne(p.traceparent, traceparent, sizeof traceparent)
                ? traceparent
                : "";  // 0 bytes: never a traceparent
      }
      if (!p.tracestate.empty()) {
        out->tracestate = CopyOne(p.tracestate, tracestate, sizeof tracestate)
                              ? tracestate
                              : "=";  // a member without a key: never valid
      }
      out->lora = lora_arg;
      out->labels = labels;
      out->n_labels = ok ? n_labels : kRefusedLabels;
    }

    char lora[TM_MAX_LORA_BYTES + 1];
    char names[TM_MAX_REQUEST_LABELS][TM_MAX_STRING_BYTES + 1];
    char values[TM_MAX_REQUEST_LABELS][TM_MAX_REQUEST_LABEL_VALUE_BYTES + 1];
    char traceparent[TM_TRACEPARENT_BYTES + 1];
    char tracestate[TM_MAX_TRACESTATE_BYTES + 1];
    tm_label labels[TM_MAX_REQUEST_LABELS];
    const char* lora_arg = nullptr;  // nullptr: no lora
    size_t n_labels = 0;
  };

  // A NUL-terminated copy of a label-value string on the stack: c_str() is
  // nullptr for an empty one (none), "" (which the C calls refuse and count)
  // for one that cannot be handed over.
  class LabelValue {
   public:
    explicit LabelValue(std::string_view s) noexcept {
      if (s.empty()) {
        p_ = nullptr;
      } else if (!CopyOne(s, buf_, sizeof buf_)) {
        buf_[0] = '\0';
      }
    }
    LabelValue(const LabelValue&) = delete;
    LabelValue& operator=(const LabelValue&) = delete;
    const char* c_str() const noexcept { return p_; }

   private:
    char buf_[TM_MAX_LABEL_VALUE_BYTES + 1];
    const char* p_ = buf_;
  };

  static tm_kv_transfer_info ToC(const KvTransferInfo& info,
                                 const LabelValue& reason,
                                 const LabelValue& connector) noexcept {
    // TM_KV_UNKNOWN means "not given" in C; given here, it is over the
    // limit: passed as the smallest value the C call refuses.
    constexpr uint64_t kRefused = TM_MAX_KV_TRANSFER_BYTES + 1;
    const auto amount = [](const std::optional<uint64_t>& v) {
      if (!v.has_value()) return uint64_t{TM_KV_UNKNOWN};
      return *v == TM_KV_UNKNOWN ? kRefused : *v;
    };
    tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
    kv.role = static_cast<tm_kv_role>(info.role);
    kv.start_ns = info.start_ns;
    kv.bytes = amount(info.bytes);
    kv.blocks = amount(info.blocks);
    kv.ok = info.ok ? 1 : 0;
    kv.reason = reason.c_str();  // NULL when empty: an id may stand in
    kv.connector = connector.c_str();
    kv.reason_id = info.reason_id.id;
    kv.connector_id = info.connector_id.id;
    return kv;
  }

  // TM_NOT_GIVEN for nullopt; a given UINT64_MAX becomes the largest value
  // (still over every limit, so refused as such).
  static uint64_t Given(const std::optional<uint64_t>& v) noexcept {
    if (!v.has_value()) return TM_NOT_GIVEN;
    return *v == TM_NOT_GIVEN ? TM_NOT_GIVEN - 1 : *v;
  }
  static tm_request_summary_info ToC(
      const tokenmeter::RequestSummary& s) noexcept {
    tm_request_summary_info c = TM_REQUEST_SUMMARY_INFO_INIT;
    c.reason = static_cast<tm_finish_reason>(s.reason);
    c.prompt_tokens = s.prompt_tokens;
    c.generation_tokens = s.generation_tokens;
    c.cached_tokens = Given(s.cached_tokens);
    c.max_tokens = Given(s.max_tokens);
    c.n = Given(s.n);
    c.max_generation_tokens = Given(s.max_generation_tokens);
    c.ttft_ns = Given(s.ttft_ns);
    c.queue_ns = Given(s.queue_ns);
    c.prefill_ns = Given(s.prefill_ns);
    c.decode_ns = Given(s.decode_ns);
    c.inference_ns = Given(s.inference_ns);
    c.e2e_ns = Given(s.e2e_ns);
    c.tpot_ns = Given(s.tpot_ns);
    return c;
  }

  static Stats ToStats(const uint64_t* s) {
    Stats r;
    r.events_sent = s[TM_STAT_EVENTS_SENT];
    r.events_dropped = s[TM_STAT_EVENTS_DROPPED];
    r.events_rejected = s[TM_STAT_EVENTS_REJECTED];
    r.reconnects = s[TM_STAT_RECONNECTS];
    r.batches_sent = s[TM_STAT_BATCHES_SENT];
    r.bytes_sent = s[TM_STAT_BYTES_SENT];
    r.connected = s[TM_STAT_CONNECTED] != 0;
    r.connect_failures = s[TM_STAT_CONNECT_FAILURES];
    r.batches_replayed = s[TM_STAT_BATCHES_REPLAYED];
    r.events_unacked = s[TM_STAT_EVENTS_UNACKED];
    r.events_discarded = s[TM_STAT_EVENTS_DISCARDED];
    r.fields_dropped = s[TM_STAT_FIELDS_DROPPED];
    return r;
  }
  tm_client* c_;
  Stats final_;
};

// The clock every event uses.
inline uint64_t NowNs() noexcept { return tm_now_ns(); }

}  // namespace tokenmeter

#endif  // TOKENMETER_CLIENT_HPP_
