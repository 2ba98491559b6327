#include "daemon/trace/otlp_trace_encoder.h"

#include <bit>
#include <charconv>
#include <cmath>
#include <cstdlib>
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

// Every tag here fits one byte except Span.flags' (field 16): two.
constexpr uint8_t Tag1(uint32_t field, uint32_t wire) {
  return uint8_t(field << 3 | wire);
}
static_assert(kSpanStatus < 16 && kSpanFlags == 16);

size_t VarintSize(uint64_t v) { return size_t(std::bit_width(v | 1) + 6) / 7; }

// A length-delimited field of a one-byte tag holding n bytes.
size_t LenFieldSize(size_t n) { return 1 + VarintSize(n) + n; }

// The writers below write at p, into room the caller made from the exact
// sizes (the *Size() functions), and return the end of what they wrote:
// no bounds check, no allocation, one pass.
char* PutVarint(char* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = char(v | 0x80);
    v >>= 7;
  }
  *p++ = char(v);
  return p;
}

char* PutRaw(char* p, const void* data, size_t n) {
  if (n) std::memcpy(p, data, n);
  return p + n;
}

char* PutVarintField(char* p, uint32_t field, uint64_t v) {
  *p++ = char(Tag1(field, kVarint));
  return PutVarint(p, v);
}

char* PutFixed64Field(char* p, uint32_t field, uint64_t v) {
  *p++ = char(Tag1(field, kFixed64));
  for (int i = 0; i < 8; ++i) *p++ = char(v >> (8 * i));
  return p;
}

// A length-delimited field holding a followed by b.
char* PutLenField(char* p, uint32_t field, std::string_view a,
                  std::string_view b = {}) {
  *p++ = char(Tag1(field, kLen));
  p = PutVarint(p, a.size() + b.size());
  p = PutRaw(p, a.data(), a.size());
  return PutRaw(p, b.data(), b.size());
}

char* PutLenField(char* p, uint32_t field, const uint8_t* data, size_t n) {
  return PutLenField(p, field,
                     std::string_view(reinterpret_cast<const char*>(data), n));
}

// A nested message's tag and length; its body follows.
char* PutMessageHeader(char* p, uint32_t field, size_t body) {
  *p++ = char(Tag1(field, kLen));
  return PutVarint(p, body);
}

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

// Appends bytes made by `put`, exactly `n` of them, to *out.
template <typename Put>
void AppendExact(std::string* out, size_t n, Put put) {
  const size_t old = out->size();
  out->resize(old + n);
  char* const begin = out->data() + old;
  [[maybe_unused]] char* const end = put(begin);
  // The sizes and the writers agree, or the output is garbage: abort.
  if (size_t(end - begin) != n) std::abort();
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

void Varint(std::string* out, uint64_t v) {
  char buf[10];
  out->append(buf, size_t(PutVarint(buf, v) - buf));
}

void BytesField(std::string* out, uint32_t field, std::string_view v) {
  out->push_back(char(Tag1(field, kLen)));
  Varint(out, v.size());
  out->append(v);
}

// ---------------------------------------------------------------------------
// OTLP/JSON.

// The index of the first byte of [p, p + n) that JSON must escape (a
// control character, '"' or '\\'), or n. Eight bytes at a time: each test
// below is exact as a yes/no for the whole word (Anderson's "bit twiddling
// hacks", hasless() and haszero()); bytes of 0x80 and up never match.
size_t FirstToEscape(const char* p, size_t n) {
  constexpr uint64_t k01 = 0x0101010101010101ULL;
  constexpr uint64_t k80 = 0x8080808080808080ULL;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    const uint64_t quote = v ^ (k01 * '"');
    const uint64_t backslash = v ^ (k01 * '\\');
    const uint64_t hit = ((v - k01 * 0x20) & ~v & k80) |
                         ((quote - k01) & ~quote & k80) |
                         ((backslash - k01) & ~backslash & k80);
    if (hit) break;
  }
  for (; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(p[i]);
    if (c < 0x20 || c == '"' || c == '\\') return i;
  }
  return n;
}

void JsonEscaped(std::string* out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  const char* p = s.data();
  size_t n = s.size();
  while (true) {
    const size_t plain = FirstToEscape(p, n);
    out->append(p, plain);
    if (plain == n) return;
    const unsigned char c = static_cast<unsigned char>(p[plain]);
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
        const char esc[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xf]};
        out->append(esc, 6);
      }
    }
    p += plain + 1;
    n -= plain + 1;
  }
}

// A JSON string holding a followed by b.
void JsonString(std::string* out, std::string_view a, std::string_view b = {}) {
  out->push_back('"');
  JsonEscaped(out, a);
  JsonEscaped(out, b);
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
