#include "daemon/trace/span_builder.h"

#include <algorithm>

namespace tokenmeter::daemon::trace {
namespace {

constexpr std::string_view kEngineLabelPrefix = "tokenmeter.engine.";
constexpr std::string_view kRequestLabelPrefix = "tokenmeter.label.";
constexpr std::string_view kOtherError = "_OTHER";

// Calls f(t) for every time point of the timeline that is set.
template <typename F>
void ForEachPoint(const RequestTimeline& tl, F f) {
  for (uint64_t t : {tl.arrived_ns, tl.queued_ns, tl.scheduled_ns,
                     tl.first_token_ns, tl.last_token_ns, tl.finished_ns}) {
    if (t) f(t);
  }
  for (const KvTransfer& kv : tl.kv_transfers) {
    if (kv.start_ns) f(kv.start_ns);
    if (kv.end_ns) f(kv.end_ns);
  }
  for (const Preemption& p : tl.preemptions) {
    if (p.preempted_ns) f(p.preempted_ns);
    if (p.resumed_ns) f(p.resumed_ns);
  }
}

// Seconds between two points, when both are set and in order.
bool Seconds(uint64_t from, uint64_t to, double* out) {
  if (!from || !to || to < from) return false;
  *out = double(to - from) / 1e9;
  return true;
}

class Builder {
 public:
  Builder(const TraceContext& ctx, const SpanOptions& options, IdSource& ids,
          SpanBatch* out)
      : ctx_(ctx),
        offset_(options.unix_minus_monotonic_ns),
        ids_(ids),
        out_(out) {}

  // Starts a span (its attributes follow until the next Begin or Finish).
  void Begin(std::string_view name, SpanKind kind, uint64_t start_ns,
             uint64_t end_ns) {
    Close();
    Span& s = out_->spans.emplace_back();
    s.trace_id = ctx_.trace_id;
    s.span_id = ids_.NewSpanId();
    s.trace_state = ctx_.trace_state;
    s.name = name;
    s.kind = kind;
    s.start_unix_ns = ToUnixNs(start_ns, offset_);
    s.end_unix_ns = ToUnixNs(end_ns, offset_);
    s.attributes_begin = s.attributes_end = uint32_t(out_->attributes.size());
    if (count_ == 0) {
      s.parent_span_id = ctx_.parent_span_id;
      s.flags = kFlagSampled | kFlagHasIsRemote |
                (ctx_.has_parent ? kFlagIsRemote : 0);
      root_id_ = s.span_id;
    } else {
      s.parent_span_id = root_id_;
      s.flags = kFlagSampled | kFlagHasIsRemote;
    }
    open_ = true;
    ++count_;
  }

  // A child, when both ends are set and in order.
  void Child(std::string_view name, uint64_t start_ns, uint64_t end_ns) {
    if (!start_ns || !end_ns || end_ns < start_ns) {
      Close();
      return;
    }
    Begin(name, SpanKind::kInternal, start_ns, end_ns);
  }
  // Whether the last Child() made a span (its attributes may follow).
  bool open() const { return open_; }

  void Error(std::string_view message) {
    Span& s = out_->spans.back();
    s.status_code = StatusCode::kError;
    s.status_message = message;
  }

  Attribute& Add(std::string_view key, Attribute::Type type,
                 std::string_view prefix = {}) {
    Attribute& a = out_->attributes.emplace_back();
    a.key_prefix = prefix;
    a.key = key;
    a.type = type;
    return a;
  }
  void Str(std::string_view key, std::string_view v,
           std::string_view prefix = {}) {
    Add(key, Attribute::Type::kString, prefix).str = v;
  }
  void Int(std::string_view key, int64_t v) {
    Add(key, Attribute::Type::kInt).int_value = v;
  }
  void Double(std::string_view key, double v) {
    Add(key, Attribute::Type::kDouble).double_value = v;
  }
  void Bool(std::string_view key, bool v) {
    Add(key, Attribute::Type::kBool).bool_value = v;
  }

  size_t Finish() {
    Close();
    return count_;
  }

 private:
  void Close() {
    if (open_) {
      out_->spans.back().attributes_end = uint32_t(out_->attributes.size());
    }
    open_ = false;
  }

  const TraceContext& ctx_;
  const int64_t offset_;
  IdSource& ids_;
  SpanBatch* out_;
  SpanId root_id_{};
  bool open_ = false;
  size_t count_ = 0;
};

void RootAttributes(const RequestTimeline& tl, Builder& b) {
  if (!tl.engine.empty()) b.Str("gen_ai.provider.name", tl.engine);
  for (const auto& [name, value] : tl.engine_labels) {
    if (name == "model_name" && !value.empty()) {
      b.Str("gen_ai.request.model", value);
      break;
    }
  }
  if (tl.max_tokens > 0) b.Int("gen_ai.request.max_tokens", tl.max_tokens);
  if (tl.n != 0 && tl.n != 1) b.Int("gen_ai.request.choice.count", tl.n);
  // The prompt's size comes with ARRIVED: without it, unknown (not 0).
  if (tl.arrived_ns) b.Int("gen_ai.usage.input_tokens", tl.prompt_tokens);
  b.Int("gen_ai.usage.output_tokens", tl.generation_tokens);
  if (tl.has_info) {
    b.Int("gen_ai.usage.cache_read.input_tokens", tl.cached_tokens);
  }
  if (!tl.finish_reason.empty()) {
    b.Add("gen_ai.response.finish_reasons", Attribute::Type::kStringArray1)
        .str = tl.finish_reason;
  }

  // vLLM's definitions (vllm/v1/engine/output_processor.py, do_tracing()).
  const uint64_t queue_start = tl.queued_ns ? tl.queued_ns : tl.arrived_ns;
  double s;
  if (Seconds(queue_start, tl.scheduled_ns, &s)) {
    b.Double("gen_ai.latency.time_in_queue", s);
  }
  if (Seconds(tl.arrived_ns, tl.first_token_ns, &s)) {
    b.Double("gen_ai.latency.time_to_first_token", s);
  }
  if (Seconds(tl.arrived_ns, tl.finished_ns, &s)) {
    b.Double("gen_ai.latency.e2e", s);
  }
  if (Seconds(tl.scheduled_ns, tl.first_token_ns, &s)) {
    b.Double("gen_ai.latency.time_in_model_prefill", s);
  }
  if (Seconds(tl.first_token_ns, tl.last_token_ns, &s)) {
    b.Double("gen_ai.latency.time_in_model_decode", s);
  }
  if (Seconds(tl.scheduled_ns, tl.last_token_ns, &s)) {
    b.Double("gen_ai.latency.time_in_model_inference", s);
  }

  if (tl.finish_reason == "error") b.Str("error.type", kOtherError);
  b.Str("tokenmeter.request_id", tl.request_id);
  if (tl.has_info) b.Int("tokenmeter.external_tokens", tl.external_tokens);
  b.Int("tokenmeter.preemptions",
        int64_t(std::max<size_t>(tl.preemptions.size(), tl.preemption_count)));
  if (tl.has_priority) b.Int("tokenmeter.priority", tl.priority);
  if (!tl.lora.empty()) b.Str("tokenmeter.lora", tl.lora);
  if (tl.finish_reason.empty()) b.Bool("tokenmeter.evicted", true);
  for (const auto& [name, value] : tl.engine_labels) {
    b.Str(name, value, kEngineLabelPrefix);
  }
  for (const auto& [name, value] : tl.request_labels) {
    b.Str(name, value, kRequestLabelPrefix);
  }
}

}  // namespace

uint64_t ToUnixNs(uint64_t monotonic_ns, int64_t unix_minus_monotonic_ns) {
  if (unix_minus_monotonic_ns < 0) {
    const uint64_t back = uint64_t(0) - uint64_t(unix_minus_monotonic_ns);
    return monotonic_ns > back ? monotonic_ns - back : 0;
  }
  return monotonic_ns + uint64_t(unix_minus_monotonic_ns);
}

RequestExtent RootExtent(const RequestTimeline& tl) {
  RequestExtent e;
  uint64_t lo = UINT64_MAX;
  uint64_t hi = 0;
  ForEachPoint(tl, [&](uint64_t t) {
    lo = std::min(lo, t);
    hi = std::max(hi, t);
  });
  if (hi == 0) return e;
  e.valid = true;
  e.start_ns = tl.arrived_ns ? tl.arrived_ns : lo;
  e.end_ns = tl.finished_ns ? tl.finished_ns : hi;
  if (e.end_ns < e.start_ns) e.end_ns = e.start_ns;
  return e;
}

size_t BuildSpans(const RequestTimeline& tl, const TraceContext& ctx,
                  const SpanOptions& options, IdSource& ids, SpanBatch* out) {
  const RequestExtent root = RootExtent(tl);
  if (!root.valid) return 0;
  Builder b(ctx, options, ids, out);

  b.Begin(kRootSpanName, SpanKind::kServer, root.start_ns, root.end_ns);
  if (tl.finish_reason == "error") b.Error("request finished with error");
  RootAttributes(tl, b);

  b.Child(kQueueSpanName, tl.queued_ns ? tl.queued_ns : tl.arrived_ns,
          tl.scheduled_ns);
  for (const KvTransfer& kv : tl.kv_transfers) {
    b.Child(kv.recv ? kKvRecvSpanName : kKvSendSpanName, kv.start_ns,
            kv.end_ns);
    if (!b.open()) continue;
    if (kv.bytes != UINT64_MAX) b.Int("tokenmeter.kv.bytes", int64_t(kv.bytes));
    if (kv.blocks != UINT64_MAX) {
      b.Int("tokenmeter.kv.blocks", int64_t(kv.blocks));
    }
    if (!kv.connector.empty()) b.Str("tokenmeter.kv.connector", kv.connector);
    if (!kv.ok) {
      b.Error(kv.reason.empty() ? std::string_view("KV transfer failed")
                                : std::string_view(kv.reason));
      b.Str("error.type",
            kv.reason.empty() ? kOtherError : std::string_view(kv.reason));
    }
  }
  b.Child(kPrefillSpanName, tl.scheduled_ns, tl.first_token_ns);
  for (const Preemption& p : tl.preemptions) {
    const uint64_t end = p.resumed_ns     ? p.resumed_ns
                         : tl.finished_ns ? tl.finished_ns
                                          : root.end_ns;
    b.Child(kPreemptedSpanName, p.preempted_ns, end);
    if (b.open()) b.Bool("tokenmeter.preemption.resumed", p.resumed_ns != 0);
  }
  b.Child(kDecodeSpanName, tl.first_token_ns,
          tl.finished_ns ? tl.finished_ns : tl.last_token_ns);
  return b.Finish();
}

size_t BuildSpans(const RequestTimeline& tl, const SpanOptions& options,
                  IdSource& ids, SpanBatch* out) {
  return BuildSpans(tl, ResolveTraceContext(tl, ids), options, ids, out);
}

}  // namespace tokenmeter::daemon::trace
