// The spans the builder makes of a retired request and the encoder writes
// as OTLP: plain data. A span refers to its attributes by index into the
// batch that holds both, and its strings are views (into the
// RequestTimeline it was built from, or static text), so building a
// request's spans allocates nothing once a reused SpanBatch has grown to
// the largest request; the views are valid while that timeline lives.
#ifndef TOKENMETER_DAEMON_TRACE_SPAN_H_
#define TOKENMETER_DAEMON_TRACE_SPAN_H_

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace tokenmeter::daemon::trace {

// W3C / OTLP ids, in wire (big-endian) byte order. All zeros is invalid.
using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

inline bool IsZero(const TraceId& id) {
  for (uint8_t b : id)
    if (b) return false;
  return true;
}
inline bool IsZero(const SpanId& id) {
  for (uint8_t b : id)
    if (b) return false;
  return true;
}

// OTLP's Span.SpanKind and Status.StatusCode numbers.
enum class SpanKind : uint8_t {
  kUnspecified = 0,
  kInternal = 1,
  kServer = 2,
  kClient = 3,
  kProducer = 4,
  kConsumer = 5,
};
enum class StatusCode : uint8_t { kUnset = 0, kOk = 1, kError = 2 };

// OTLP Span.flags bits: the W3C trace flags in the low byte, then whether
// the parent's remoteness is known and whether the parent is remote.
inline constexpr uint32_t kFlagSampled = 0x01;
inline constexpr uint32_t kFlagHasIsRemote = 0x100;
inline constexpr uint32_t kFlagIsRemote = 0x200;

// One attribute: the key is key_prefix followed by key (the prefix lets a
// label's key, "tokenmeter.label." + name, be written without building
// it); the value is the member of its type.
struct Attribute {
  enum class Type : uint8_t {
    kString,
    kBool,
    kInt,
    kDouble,
    // An array holding one string, `str` (gen_ai.response.finish_reasons:
    // a request has one finish reason).
    kStringArray1,
  };
  std::string_view key_prefix;
  std::string_view key;
  Type type = Type::kString;
  bool bool_value = false;
  int64_t int_value = 0;
  double double_value = 0;
  std::string_view str;
};

struct Span {
  TraceId trace_id{};
  SpanId span_id{};
  SpanId parent_span_id{};  // all zeros: none (a root without parent)
  uint32_t flags = 0;       // OTLP Span.flags (kFlag*)
  SpanKind kind = SpanKind::kInternal;
  StatusCode status_code = StatusCode::kUnset;
  std::string_view name;
  std::string_view trace_state;     // W3C tracestate; empty: none
  std::string_view status_message;  // only with kError
  uint64_t start_unix_ns = 0;
  uint64_t end_unix_ns = 0;
  // This span's attributes: SpanBatch::attributes[begin, end).
  uint32_t attributes_begin = 0;
  uint32_t attributes_end = 0;
};

// Spans and their attributes, appended to by BuildSpans(), read by the
// encoder. Clear() keeps the capacity for the next request.
struct SpanBatch {
  std::vector<Span> spans;
  std::vector<Attribute> attributes;

  void Clear() {
    spans.clear();
    attributes.clear();
  }
  std::span<const Attribute> AttributesOf(const Span& s) const {
    return {attributes.data() + s.attributes_begin,
            attributes.data() + s.attributes_end};
  }
};

}  // namespace tokenmeter::daemon::trace

#endif  // TOKENMETER_DAEMON_TRACE_SPAN_H_
