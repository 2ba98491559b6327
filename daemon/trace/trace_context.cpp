#include "daemon/trace/trace_context.h"

#include "tokenmeter/protocol.h"

namespace tokenmeter::daemon::trace {
namespace {

constexpr char kHex[] = "0123456789abcdef";

uint8_t HexValue(char c) { return uint8_t(c >= 'a' ? c - 'a' + 10 : c - '0'); }

// n bytes from 2n lowercase hex digits (already validated).
void FromHex(const char* s, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    out[i] = uint8_t(HexValue(s[2 * i]) << 4 | HexValue(s[2 * i + 1]));
  }
}

void ToHex(const uint8_t* p, size_t n, char* out) {
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[p[i] >> 4];
    out[2 * i + 1] = kHex[p[i] & 0xf];
  }
}

}  // namespace

bool ParseTraceparent(std::string_view traceparent, TraceContext* out) {
  if (!tm_proto_valid_traceparent(traceparent.data(), traceparent.size())) {
    return false;
  }
  const char* s = traceparent.data();
  FromHex(s + 3, out->trace_id.data(), 16);
  FromHex(s + 36, out->parent_span_id.data(), 8);
  out->has_parent = true;
  out->parent_sampled = tm_proto_traceparent_sampled(s) != 0;
  out->trace_state = {};
  return true;
}

TraceContext ResolveTraceContext(const RequestTimeline& timeline,
                                 IdSource& ids) {
  TraceContext ctx;
  if (!timeline.traceparent.empty() &&
      ParseTraceparent(timeline.traceparent, &ctx)) {
    const std::string& ts = timeline.tracestate;
    if (!ts.empty() && tm_proto_valid_tracestate(ts.data(), ts.size())) {
      ctx.trace_state = ts;
    }
    return ctx;
  }
  ctx.trace_id = ids.NewTraceId();
  return ctx;
}

uint64_t TraceRandomness(const TraceId& trace_id) {
  uint64_t r = 0;
  for (size_t i = 9; i < 16; ++i) r = r << 8 | trace_id[i];
  return r;
}

void HexId(const TraceId& id, char out[32]) { ToHex(id.data(), 16, out); }
void HexId(const SpanId& id, char out[16]) { ToHex(id.data(), 8, out); }

}  // namespace tokenmeter::daemon::trace
