#include "daemon/trace/otlp_trace_encoder.h"

#include <charconv>
#include <cmath>
#include <cstring>

#include "daemon/trace/trace_context.h"

namespace tokenmeter::daemon::trace {
namespace {

// ---------------------------------------------------------------------------
// Protobuf wire format.

constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLen = 2;
constexpr uint32_t kFixed32 = 5;

// Field numbers of the OTLP messages (opentelemetry-proto, v1).
// ExportTraceServiceRequest
constexpr uint32_t kRequestResourceSpans = 1;
// ResourceSpans
constexpr uint32_t kResourceSpansResource = 1;
constexpr uint32_t kResourceSpansScopeSpans = 2;
// Resource
constexpr uint32_t kResourceAttributes = 1;
// ScopeSpans
constexpr uint32_t kScopeSpansScope = 1;
constexpr uint32_t kScopeSpansSpans = 2;
// InstrumentationScope
constexpr uint32_t kScopeName = 1;
constexpr uint32_t kScopeVersion = 2;
// Span
constexpr uint32_t kSpanTraceId = 1;
constexpr uint32_t kSpanSpanId = 2;
constexpr uint32_t kSpanTraceState = 3;
constexpr uint32_t kSpanParentSpanId = 4;
constexpr uint32_t kSpanName = 5;
constexpr uint32_t kSpanKind = 6;
constexpr uint32_t kSpanStartTime = 7;
constexpr uint32_t kSpanEndTime = 8;
constexpr uint32_t kSpanAttributes = 9;
constexpr uint32_t kSpanStatus = 15;
constexpr uint32_t kSpanFlags = 16;
// Status
constexpr uint32_t kStatusMessage = 2;
constexpr uint32_t kStatusCode = 3;
// KeyValue
constexpr uint32_t kKeyValueKey = 1;
constexpr uint32_t kKeyValueValue = 2;
// AnyValue
constexpr uint32_t kAnyString = 1;
constexpr uint32_t kAnyBool = 2;
constexpr uint32_t kAnyInt = 3;
constexpr uint32_t kAnyDouble = 4;
constexpr uint32_t kAnyArray = 5;
// ArrayValue
constexpr uint32_t kArrayValues = 1;

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// The varint at p (room for 10 bytes); returns its size.
size_t PutVarintAt(char* p, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = char(v | 0x80);
    v >>= 7;
  }
  p[n++] = char(v);
  return n;
}

void Varint(std::string* out, uint64_t v) {
  char buf[10];
  out->append(buf, PutVarintAt(buf, v));
}

void Tag(std::string* out, uint32_t field, uint32_t wire) {
  Varint(out, uint64_t(field) << 3 | wire);
}

void VarintField(std::string* out, uint32_t field, uint64_t v) {
  Tag(out, field, kVarint);
  Varint(out, v);
}

void Fixed64Field(std::string* out, uint32_t field, uint64_t v) {
  Tag(out, field, kFixed64);
  char buf[8];
  for (int i = 0; i < 8; ++i) buf[i] = char(v >> (8 * i));
  out->append(buf, 8);
}

void Fixed32Field(std::string* out, uint32_t field, uint32_t v) {
  Tag(out, field, kFixed32);
  char buf[4];
  for (int i = 0; i < 4; ++i) buf[i] = char(v >> (8 * i));
  out->append(buf, 4);
}

// A length-delimited field holding a followed by b.
void BytesField(std::string* out, uint32_t field, std::string_view a,
                std::string_view b = {}) {
  Tag(out, field, kLen);
  Varint(out, a.size() + b.size());
  out->append(a);
  out->append(b);
}

void BytesField(std::string* out, uint32_t field, const uint8_t* p, size_t n) {
  BytesField(out, field, std::string_view(reinterpret_cast<const char*>(p), n));
}

// A nested message: Open() writes the tag and a one-byte length
// placeholder and returns where the body starts; Close() writes the
// body's length there, moving the body when it needs more than one byte
// (a body of 128 bytes or more: the root span, a long attribute).
size_t Open(std::string* out, uint32_t field) {
  Tag(out, field, kLen);
  out->push_back('\0');
  return out->size();
}

void Close(std::string* out, size_t body) {
  const size_t len = out->size() - body;
  const size_t n = VarintSize(len);
  if (n > 1) out->insert(body, n - 1, '\0');
  PutVarintAt(out->data() + body - 1, len);
}

void ProtoAttribute(std::string* out, uint32_t field, const Attribute& a) {
  const size_t kv = Open(out, field);
  BytesField(out, kKeyValueKey, a.key_prefix, a.key);
  const size_t any = Open(out, kKeyValueValue);
  switch (a.type) {
    case Attribute::Type::kString:
      BytesField(out, kAnyString, a.str);
      break;
    case Attribute::Type::kBool:
      VarintField(out, kAnyBool, a.bool_value ? 1 : 0);
      break;
    case Attribute::Type::kInt:
      VarintField(out, kAnyInt, uint64_t(a.int_value));
      break;
    case Attribute::Type::kDouble: {
      uint64_t bits;
      std::memcpy(&bits, &a.double_value, sizeof bits);
      Fixed64Field(out, kAnyDouble, bits);
      break;
    }
    case Attribute::Type::kStringArray1: {
      const size_t array = Open(out, kAnyArray);
      const size_t element = Open(out, kArrayValues);
      BytesField(out, kAnyString, a.str);
      Close(out, element);
      Close(out, array);
      break;
    }
  }
  Close(out, any);
  Close(out, kv);
}

void ProtoSpan(std::string* out, const SpanBatch& batch, const Span& s) {
  const size_t span = Open(out, kScopeSpansSpans);
  BytesField(out, kSpanTraceId, s.trace_id.data(), s.trace_id.size());
  BytesField(out, kSpanSpanId, s.span_id.data(), s.span_id.size());
  if (!s.trace_state.empty()) BytesField(out, kSpanTraceState, s.trace_state);
  if (!IsZero(s.parent_span_id)) {
    BytesField(out, kSpanParentSpanId, s.parent_span_id.data(),
               s.parent_span_id.size());
  }
  if (!s.name.empty()) BytesField(out, kSpanName, s.name);
  if (s.kind != SpanKind::kUnspecified) {
    VarintField(out, kSpanKind, uint64_t(s.kind));
  }
  if (s.start_unix_ns) Fixed64Field(out, kSpanStartTime, s.start_unix_ns);
  if (s.end_unix_ns) Fixed64Field(out, kSpanEndTime, s.end_unix_ns);
  for (const Attribute& a : batch.AttributesOf(s)) {
    ProtoAttribute(out, kSpanAttributes, a);
  }
  if (s.status_code != StatusCode::kUnset || !s.status_message.empty()) {
    const size_t status = Open(out, kSpanStatus);
    if (!s.status_message.empty()) {
      BytesField(out, kStatusMessage, s.status_message);
    }
    if (s.status_code != StatusCode::kUnset) {
      VarintField(out, kStatusCode, uint64_t(s.status_code));
    }
    Close(out, status);
  }
  if (s.flags) Fixed32Field(out, kSpanFlags, s.flags);
  Close(out, span);
}

// ---------------------------------------------------------------------------
// OTLP/JSON.

void JsonString(std::string* out, std::string_view a, std::string_view b = {}) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (std::string_view part : {a, b}) {
    size_t start = 0;
    for (size_t i = 0; i < part.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(part[i]);
      if (c >= 0x20 && c != '"' && c != '\\') continue;
      out->append(part.data() + start, i - start);
      start = i + 1;
      switch (c) {
        case '"':
          out->append("\\\"");
          break;
        case '\\':
          out->append("\\\\");
          break;
        case '\n':
          out->append("\\n");
          break;
        case '\r':
          out->append("\\r");
          break;
        case '\t':
          out->append("\\t");
          break;
        default: {
          const char esc[6] = {'\\', 'u',          '0',
                               '0',  kHex[c >> 4], kHex[c & 0xf]};
          out->append(esc, 6);
        }
      }
    }
    out->append(part.data() + start, part.size() - start);
  }
  out->push_back('"');
}

template <typename Int>
void JsonInt(std::string* out, Int v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out->append(buf, end);
}

// A 64-bit integer as a JSON string.
template <typename Int>
void JsonQuotedInt(std::string* out, Int v) {
  out->push_back('"');
  JsonInt(out, v);
  out->push_back('"');
}

void JsonDouble(std::string* out, double v) {
  if (std::isnan(v)) {
    out->append("\"NaN\"");
  } else if (std::isinf(v)) {
    out->append(v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
  } else {
    char buf[32];
    // Shortest text that reads back as exactly v; locale-independent.
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    out->append(buf, end);
  }
}

template <size_t N>
void JsonHex(std::string* out, const std::array<uint8_t, N>& id) {
  char hex[2 * N];
  HexId(id, hex);
  out->push_back('"');
  out->append(hex, sizeof hex);
  out->push_back('"');
}

void JsonAttribute(std::string* out, const Attribute& a) {
  out->append("{\"key\":");
  JsonString(out, a.key_prefix, a.key);
  out->append(",\"value\":{");
  switch (a.type) {
    case Attribute::Type::kString:
      out->append("\"stringValue\":");
      JsonString(out, a.str);
      break;
    case Attribute::Type::kBool:
      out->append(a.bool_value ? "\"boolValue\":true" : "\"boolValue\":false");
      break;
    case Attribute::Type::kInt:
      out->append("\"intValue\":");
      JsonQuotedInt(out, a.int_value);
      break;
    case Attribute::Type::kDouble:
      out->append("\"doubleValue\":");
      JsonDouble(out, a.double_value);
      break;
    case Attribute::Type::kStringArray1:
      out->append("\"arrayValue\":{\"values\":[{\"stringValue\":");
      JsonString(out, a.str);
      out->append("}]}");
      break;
  }
  out->append("}}");
}

void JsonSpan(std::string* out, const SpanBatch& batch, const Span& s) {
  out->append("{\"traceId\":");
  JsonHex(out, s.trace_id);
  out->append(",\"spanId\":");
  JsonHex(out, s.span_id);
  if (!s.trace_state.empty()) {
    out->append(",\"traceState\":");
    JsonString(out, s.trace_state);
  }
  if (!IsZero(s.parent_span_id)) {
    out->append(",\"parentSpanId\":");
    JsonHex(out, s.parent_span_id);
  }
  if (s.flags) {
    out->append(",\"flags\":");
    JsonInt(out, s.flags);
  }
  if (!s.name.empty()) {
    out->append(",\"name\":");
    JsonString(out, s.name);
  }
  if (s.kind != SpanKind::kUnspecified) {
    out->append(",\"kind\":");
    JsonInt(out, int(s.kind));
  }
  if (s.start_unix_ns) {
    out->append(",\"startTimeUnixNano\":");
    JsonQuotedInt(out, s.start_unix_ns);
  }
  if (s.end_unix_ns) {
    out->append(",\"endTimeUnixNano\":");
    JsonQuotedInt(out, s.end_unix_ns);
  }
  const auto attributes = batch.AttributesOf(s);
  if (!attributes.empty()) {
    out->append(",\"attributes\":[");
    bool first = true;
    for (const Attribute& a : attributes) {
      if (!first) out->push_back(',');
      first = false;
      JsonAttribute(out, a);
    }
    out->push_back(']');
  }
  if (s.status_code != StatusCode::kUnset || !s.status_message.empty()) {
    out->append(",\"status\":{");
    bool comma = false;
    if (!s.status_message.empty()) {
      out->append("\"message\":");
      JsonString(out, s.status_message);
      comma = true;
    }
    if (s.status_code != StatusCode::kUnset) {
      if (comma) out->push_back(',');
      out->append("\"code\":");
      JsonInt(out, int(s.status_code));
    }
    out->push_back('}');
  }
  out->push_back('}');
}

}  // namespace

std::string_view ContentType(OtlpEncoding encoding) {
  return encoding == OtlpEncoding::kProtobuf ? "application/x-protobuf"
                                             : "application/json";
}

void AppendSpans(OtlpEncoding encoding, const SpanBatch& batch,
                 std::string* out) {
  for (const Span& s : batch.spans) {
    if (encoding == OtlpEncoding::kProtobuf) {
      ProtoSpan(out, batch, s);
    } else {
      if (!out->empty()) out->push_back(',');
      JsonSpan(out, batch, s);
    }
  }
}

OtlpTraceEncoder::OtlpTraceEncoder(OtlpEncoding encoding,
                                   const TraceResource& resource)
    : encoding_(encoding) {
  if (encoding == OtlpEncoding::kProtobuf) {
    // prefix_: ResourceSpans.resource; suffix_: ScopeSpans.scope.
    const size_t r = Open(&prefix_, kResourceSpansResource);
    for (const auto& [key, value] : resource.attributes) {
      Attribute a;
      a.key = key;
      a.str = value;
      ProtoAttribute(&prefix_, kResourceAttributes, a);
    }
    Close(&prefix_, r);
    const size_t s = Open(&suffix_, kScopeSpansScope);
    if (!resource.scope_name.empty()) {
      BytesField(&suffix_, kScopeName, resource.scope_name);
    }
    if (!resource.scope_version.empty()) {
      BytesField(&suffix_, kScopeVersion, resource.scope_version);
    }
    Close(&suffix_, s);
    return;
  }
  prefix_ = "{\"resourceSpans\":[{\"resource\":{\"attributes\":[";
  bool first = true;
  for (const auto& [key, value] : resource.attributes) {
    if (!first) prefix_.push_back(',');
    first = false;
    Attribute a;
    a.key = key;
    a.str = value;
    JsonAttribute(&prefix_, a);
  }
  prefix_.append("]},\"scopeSpans\":[{\"scope\":{");
  bool comma = false;
  if (!resource.scope_name.empty()) {
    prefix_.append("\"name\":");
    JsonString(&prefix_, resource.scope_name);
    comma = true;
  }
  if (!resource.scope_version.empty()) {
    if (comma) prefix_.push_back(',');
    prefix_.append("\"version\":");
    JsonString(&prefix_, resource.scope_version);
  }
  prefix_.append("},\"spans\":[");
  suffix_ = "]}]}]}";
}

void OtlpTraceEncoder::Add(const SpanBatch& batch) {
  AppendSpans(encoding_, batch, &spans_);
  pending_spans_ += batch.spans.size();
}

size_t OtlpTraceEncoder::Finish(std::string* out) {
  const size_t n = pending_spans_;
  if (n == 0) return 0;
  if (encoding_ == OtlpEncoding::kProtobuf) {
    // ExportTraceServiceRequest { resource_spans: ResourceSpans {
    //   resource, scope_spans: ScopeSpans { scope, spans... } } }
    const size_t scope_spans = suffix_.size() + spans_.size();
    const size_t resource_spans =
        prefix_.size() + 1 + VarintSize(scope_spans) + scope_spans;
    out->reserve(out->size() + 2 + 2 * 10 + resource_spans);
    Tag(out, kRequestResourceSpans, kLen);
    Varint(out, resource_spans);
    out->append(prefix_);
    Tag(out, kResourceSpansScopeSpans, kLen);
    Varint(out, scope_spans);
    out->append(suffix_);
    out->append(spans_);
  } else {
    out->reserve(out->size() + prefix_.size() + spans_.size() + suffix_.size());
    out->append(prefix_);
    out->append(spans_);
    out->append(suffix_);
  }
  spans_.clear();
  pending_spans_ = 0;
  return n;
}

void EncodeExportTraceRequest(OtlpEncoding encoding,
                              const TraceResource& resource,
                              const SpanBatch& batch, std::string* out) {
  OtlpTraceEncoder encoder(encoding, resource);
  encoder.Add(batch);
  // Without spans, a request without ResourceSpans (protobuf: no bytes).
  if (encoder.Finish(out) == 0 && encoding == OtlpEncoding::kJson) {
    out->append("{}");
  }
}

}  // namespace tokenmeter::daemon::trace
