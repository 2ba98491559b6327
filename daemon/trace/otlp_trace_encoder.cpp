#include "daemon/trace/otlp_trace_encoder.h"

#include <cstring>

#include "daemon/base/json_write.h"
#include "daemon/base/proto_wire.h"
#include "daemon/trace/trace_context.h"

namespace tokenmeter::daemon::trace {
namespace {

// ---------------------------------------------------------------------------
// Protobuf (the wire format: daemon/base/proto_wire.h).

using proto_wire::AppendExact;
using proto_wire::BytesField;
using proto_wire::kFixed32;
using proto_wire::kLen;
using proto_wire::LenFieldSize;
using proto_wire::PutFixed64Field;
using proto_wire::PutLenField;
using proto_wire::PutMessageHeader;
using proto_wire::PutVarint;
using proto_wire::PutVarintField;
using proto_wire::Tag1;
using proto_wire::Varint;
using proto_wire::VarintSize;

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

// Every tag here fits one byte except Span.flags' (field 16): two.
static_assert(kSpanStatus < 16 && kSpanFlags == 16);

size_t AnyValueSize(const Attribute& a) {
  switch (a.type) {
    case Attribute::Type::kString:
      return LenFieldSize(a.str.size());
    case Attribute::Type::kBool:
      return 2;
    case Attribute::Type::kInt:
      return 1 + VarintSize(uint64_t(a.int_value));
    case Attribute::Type::kDouble:
      return 9;
    case Attribute::Type::kStringArray1:
      // AnyValue { array_value { values { string_value } } }
      return LenFieldSize(LenFieldSize(LenFieldSize(a.str.size())));
  }
  return 0;
}

size_t KeyValueSize(const Attribute& a) {
  return LenFieldSize(a.key_prefix.size() + a.key.size()) +
         LenFieldSize(AnyValueSize(a));
}

// One KeyValue body (key, value).
char* PutKeyValue(char* p, const Attribute& a) {
  p = PutLenField(p, kKeyValueKey, a.key_prefix, a.key);
  const size_t any = AnyValueSize(a);
  p = PutMessageHeader(p, kKeyValueValue, any);
  switch (a.type) {
    case Attribute::Type::kString:
      return PutLenField(p, kAnyString, a.str);
    case Attribute::Type::kBool:
      return PutVarintField(p, kAnyBool, a.bool_value ? 1 : 0);
    case Attribute::Type::kInt:
      return PutVarintField(p, kAnyInt, uint64_t(a.int_value));
    case Attribute::Type::kDouble: {
      uint64_t bits;
      std::memcpy(&bits, &a.double_value, sizeof bits);
      return PutFixed64Field(p, kAnyDouble, bits);
    }
    case Attribute::Type::kStringArray1: {
      const size_t element = LenFieldSize(a.str.size());
      p = PutMessageHeader(p, kAnyArray, LenFieldSize(element));
      p = PutMessageHeader(p, kArrayValues, element);
      return PutLenField(p, kAnyString, a.str);
    }
  }
  return p;
}

bool HasStatus(const Span& s) {
  return s.status_code != StatusCode::kUnset || !s.status_message.empty();
}

size_t StatusSize(const Span& s) {
  size_t n = 0;
  if (!s.status_message.empty()) n += LenFieldSize(s.status_message.size());
  if (s.status_code != StatusCode::kUnset) n += 2;
  return n;
}

// The Span's size; each attribute's KeyValue size into kv_sizes.
size_t SpanSize(const SpanBatch& batch, const Span& s,
                std::vector<uint32_t>* kv_sizes) {
  kv_sizes->clear();
  size_t n = LenFieldSize(16) + LenFieldSize(8);
  if (!s.trace_state.empty()) n += LenFieldSize(s.trace_state.size());
  if (!IsZero(s.parent_span_id)) n += LenFieldSize(8);
  if (!s.name.empty()) n += LenFieldSize(s.name.size());
  if (s.kind != SpanKind::kUnspecified) n += 2;
  if (s.start_unix_ns) n += 9;
  if (s.end_unix_ns) n += 9;
  for (const Attribute& a : batch.AttributesOf(s)) {
    const size_t kv = KeyValueSize(a);
    kv_sizes->push_back(uint32_t(kv));
    n += LenFieldSize(kv);
  }
  if (HasStatus(s)) n += LenFieldSize(StatusSize(s));
  if (s.flags) n += 2 + 4;
  return n;
}

// One Span body (SpanSize() bytes, kv_sizes from it).
char* PutSpan(char* p, const SpanBatch& batch, const Span& s,
              const uint32_t* kv_sizes) {
  p = PutLenField(p, kSpanTraceId, s.trace_id.data(), s.trace_id.size());
  p = PutLenField(p, kSpanSpanId, s.span_id.data(), s.span_id.size());
  if (!s.trace_state.empty())
    p = PutLenField(p, kSpanTraceState, s.trace_state);
  if (!IsZero(s.parent_span_id)) {
    p = PutLenField(p, kSpanParentSpanId, s.parent_span_id.data(),
                    s.parent_span_id.size());
  }
  if (!s.name.empty()) p = PutLenField(p, kSpanName, s.name);
  if (s.kind != SpanKind::kUnspecified) {
    p = PutVarintField(p, kSpanKind, uint64_t(s.kind));
  }
  if (s.start_unix_ns) p = PutFixed64Field(p, kSpanStartTime, s.start_unix_ns);
  if (s.end_unix_ns) p = PutFixed64Field(p, kSpanEndTime, s.end_unix_ns);
  for (const Attribute& a : batch.AttributesOf(s)) {
    p = PutMessageHeader(p, kSpanAttributes, *kv_sizes++);
    p = PutKeyValue(p, a);
  }
  if (HasStatus(s)) {
    p = PutMessageHeader(p, kSpanStatus, StatusSize(s));
    if (!s.status_message.empty()) {
      p = PutLenField(p, kStatusMessage, s.status_message);
    }
    if (s.status_code != StatusCode::kUnset) {
      p = PutVarintField(p, kStatusCode, uint64_t(s.status_code));
    }
  }
  if (s.flags) {
    p = PutVarint(p, kSpanFlags << 3 | kFixed32);  // two bytes
    for (int i = 0; i < 4; ++i) *p++ = char(s.flags >> (8 * i));
  }
  return p;
}

void ProtoAttribute(std::string* out, uint32_t field, const Attribute& a) {
  const size_t kv = KeyValueSize(a);
  AppendExact(out, LenFieldSize(kv), [&](char* p) {
    return PutKeyValue(PutMessageHeader(p, field, kv), a);
  });
}

void ProtoSpan(std::string* out, const SpanBatch& batch, const Span& s,
               std::vector<uint32_t>* scratch) {
  const size_t size = SpanSize(batch, s, scratch);
  AppendExact(out, LenFieldSize(size), [&](char* p) {
    return PutSpan(PutMessageHeader(p, kScopeSpansSpans, size), batch, s,
                   scratch->data());
  });
}

// ---------------------------------------------------------------------------
// OTLP/JSON.

using json_write::JsonDouble;
using json_write::JsonInt;
using json_write::JsonQuotedInt;
using json_write::JsonString;

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

namespace {

void AppendSpans(OtlpEncoding encoding, const SpanBatch& batch,
                 std::string* out, std::vector<uint32_t>* scratch) {
  for (const Span& s : batch.spans) {
    if (encoding == OtlpEncoding::kProtobuf) {
      ProtoSpan(out, batch, s, scratch);
    } else {
      if (!out->empty()) out->push_back(',');
      JsonSpan(out, batch, s);
    }
  }
}

}  // namespace

void AppendSpans(OtlpEncoding encoding, const SpanBatch& batch,
                 std::string* out) {
  std::vector<uint32_t> scratch;
  AppendSpans(encoding, batch, out, &scratch);
}

OtlpTraceEncoder::OtlpTraceEncoder(OtlpEncoding encoding,
                                   const TraceResource& resource)
    : encoding_(encoding) {
  if (encoding == OtlpEncoding::kProtobuf) {
    // prefix_: ResourceSpans.resource; suffix_: ScopeSpans.scope.
    std::string resource_body;
    for (const auto& [key, value] : resource.attributes) {
      Attribute a;
      a.key = key;
      a.str = value;
      ProtoAttribute(&resource_body, kResourceAttributes, a);
    }
    BytesField(&prefix_, kResourceSpansResource, resource_body);
    std::string scope_body;
    if (!resource.scope_name.empty()) {
      BytesField(&scope_body, kScopeName, resource.scope_name);
    }
    if (!resource.scope_version.empty()) {
      BytesField(&scope_body, kScopeVersion, resource.scope_version);
    }
    BytesField(&suffix_, kScopeSpansScope, scope_body);
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
  AppendSpans(encoding_, batch, &spans_, &scratch_);
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
    out->push_back(char(Tag1(kRequestResourceSpans, kLen)));
    Varint(out, resource_spans);
    out->append(prefix_);
    out->push_back(char(Tag1(kResourceSpansScopeSpans, kLen)));
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
