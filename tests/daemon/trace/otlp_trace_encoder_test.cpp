// The OTLP trace encoder against bytes and text written by hand from the
// OTLP definitions (trace.proto, common.proto, resource.proto,
// trace_service.proto and the OTLP/JSON mapping), and its batching.
// OpenTelemetry's own decoders read its output in
// otlp_trace_encoder_otel_test.py.
#include "daemon/trace/otlp_trace_encoder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "daemon/trace/ids.h"
#include "daemon/trace/span_builder.h"
#include "test_timelines.h"

namespace tokenmeter::daemon::trace {
namespace {

// Bytes from hex digits (spaces ignored).
std::string Bytes(std::string_view hex) {
  std::string out;
  int half = -1;
  for (char c : hex) {
    if (c == ' ') continue;
    const int v = c <= '9' ? c - '0' : c - 'a' + 10;
    if (half < 0) {
      half = v;
    } else {
      out.push_back(char(half << 4 | v));
      half = -1;
    }
  }
  return out;
}

std::string Hex(std::string_view bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 0xf]);
  }
  return out;
}

// One span: trace id 01..10, span id 11..18, no parent, "q", INTERNAL,
// times 1 and 2, flags 0x101, and the attributes given.
SpanBatch OneSpan(std::vector<Attribute> attributes) {
  SpanBatch b;
  Span& s = b.spans.emplace_back();
  for (size_t i = 0; i < 16; ++i) s.trace_id[i] = uint8_t(1 + i);
  for (size_t i = 0; i < 8; ++i) s.span_id[i] = uint8_t(0x11 + i);
  s.name = "q";
  s.kind = SpanKind::kInternal;
  s.start_unix_ns = 1;
  s.end_unix_ns = 2;
  s.flags = 0x101;
  b.attributes = std::move(attributes);
  s.attributes_end = uint32_t(b.attributes.size());
  return b;
}

Attribute IntAttr(std::string_view key, int64_t v) {
  Attribute a;
  a.key = key;
  a.type = Attribute::Type::kInt;
  a.int_value = v;
  return a;
}

TraceResource SmallResource() {
  TraceResource r;
  r.attributes = {{"service.name", "s"}};
  r.scope_version = "1";
  return r;
}

// The span of OneSpan({k = 5}): 66 bytes.
const char kSpanBody[] =
    "0a10 0102030405060708090a0b0c0d0e0f10"  // trace_id
    "1208 1112131415161718"                  // span_id
    "2a01 71"                                // name "q"
    "3001"                                   // kind INTERNAL
    "39 0100000000000000"                    // start_time_unix_nano
    "41 0200000000000000"                    // end_time_unix_nano
    "4a07 0a016b 1202 1805"                  // attributes {k: int 5}
    "8501 01010000";                         // flags 0x101

TEST(OtlpTraceEncoderTest, ProtobufRequestMatchesTheHandWrittenBytes) {
  std::string out;
  EncodeExportTraceRequest(OtlpEncoding::kProtobuf, SmallResource(),
                           OneSpan({IntAttr("k", 5)}), &out);
  const std::string want =
      Bytes(std::string("0a6f"  // ExportTraceServiceRequest.resource_spans
                        "0a15"  // ResourceSpans.resource
                        "0a13"  // Resource.attributes
                        "0a0c" +
                        Hex("service.name") +
                        "1203 0a0173"
                        "1256"  // ResourceSpans.scope_spans
                        "0a10"  // ScopeSpans.scope
                        "0a0b" +
                        Hex("tokenmeterd") +
                        "1201 31"
                        "1242") +  // ScopeSpans.spans
            kSpanBody);
  EXPECT_EQ(Hex(out), Hex(want));
}

TEST(OtlpTraceEncoderTest, JsonRequestMatchesTheHandWrittenText) {
  std::string out;
  EncodeExportTraceRequest(OtlpEncoding::kJson, SmallResource(),
                           OneSpan({IntAttr("k", 5)}), &out);
  EXPECT_EQ(out,
            R"({"resourceSpans":[{"resource":{"attributes":[)"
            R"({"key":"service.name","value":{"stringValue":"s"}}]},)"
            R"("scopeSpans":[{"scope":{"name":"tokenmeterd","version":"1"},)"
            R"("spans":[{"traceId":"0102030405060708090a0b0c0d0e0f10",)"
            R"("spanId":"1112131415161718","flags":257,"name":"q","kind":1,)"
            R"("startTimeUnixNano":"1","endTimeUnixNano":"2",)"
            R"("attributes":[{"key":"k","value":{"intValue":"5"}}]}]}]}]})");
}

TEST(OtlpTraceEncoderTest, EveryValueTypeInProtobuf) {
  SpanBatch b = OneSpan({});
  Attribute s;
  s.key_prefix = "p.";
  s.key = "s";
  s.str = "";  // empty, still written (a oneof member)
  Attribute f;
  f.key = "b";
  f.type = Attribute::Type::kBool;
  Attribute d;
  d.key = "d";
  d.type = Attribute::Type::kDouble;
  d.double_value = 0.5;
  Attribute a;
  a.key = "a";
  a.type = Attribute::Type::kStringArray1;
  a.str = "stop";
  b.attributes = {s, f, IntAttr("i", -1), d, a};
  Span& span = b.spans[0];
  span.attributes_end = uint32_t(b.attributes.size());
  span.parent_span_id = {0, 0, 0, 0, 0, 0, 0, 9};
  span.trace_state = "k=v";
  span.status_code = StatusCode::kError;
  span.status_message = "x";
  std::string out;
  AppendSpans(OtlpEncoding::kProtobuf, b, &out);
  const std::string want = Bytes(
      "12 9601"  // 150 bytes: a two-byte length
      "0a10 0102030405060708090a0b0c0d0e0f10"
      "1208 1112131415161718"
      "1a03 6b3d76"            // trace_state "k=v"
      "2208 0000000000000009"  // parent_span_id
      "2a01 71 3001"
      "39 0100000000000000 41 0200000000000000"
      "4a09 0a03702e73 1202 0a00"                // p.s = ""
      "4a07 0a0162 1202 1000"                    // b = false
      "4a10 0a0169 120b 18ffffffffffffffffff01"  // i = -1 (10 bytes)
      "4a0e 0a0164 1209 21000000000000e03f"      // d = 0.5
      "4a0f 0a0161 120a 2a08 0a06 0a0473746f70"  // a = ["stop"]
      "7a05 120178 1802"  // status {message "x", code ERROR}
      "8501 01010000");
  EXPECT_EQ(Hex(out), Hex(want));
}

TEST(OtlpTraceEncoderTest, EveryValueTypeAndEscapingInJson) {
  SpanBatch b = OneSpan({});
  Attribute s;
  s.key_prefix = "tokenmeter.label.";
  s.key = "q\"k";
  s.str = std::string_view("a\"b\\c\n\t\x01\x1f caf\xc3\xa9");
  Attribute t;
  t.key = "t";
  t.type = Attribute::Type::kBool;
  t.bool_value = true;
  Attribute d;
  d.key = "d";
  d.type = Attribute::Type::kDouble;
  d.double_value = 1e-06;
  Attribute nan = d;
  nan.key = "nan";
  nan.double_value = std::numeric_limits<double>::quiet_NaN();
  Attribute inf = d;
  inf.key = "inf";
  inf.double_value = -std::numeric_limits<double>::infinity();
  Attribute a;
  a.key = "a";
  a.type = Attribute::Type::kStringArray1;
  a.str = "stop";
  b.attributes = {s, t, IntAttr("i", INT64_MIN), d, nan, inf, a};
  Span& span = b.spans[0];
  span.attributes_end = uint32_t(b.attributes.size());
  span.parent_span_id = {0, 0, 0, 0, 0, 0, 0, 0xab};
  span.trace_state = "k=v";
  span.status_code = StatusCode::kError;
  span.status_message = "x\"";
  span.kind = SpanKind::kServer;
  std::string out;
  AppendSpans(OtlpEncoding::kJson, b, &out);
  EXPECT_EQ(out, R"({"traceId":"0102030405060708090a0b0c0d0e0f10",)"
                 R"("spanId":"1112131415161718","traceState":"k=v",)"
                 R"("parentSpanId":"00000000000000ab","flags":257,"name":"q",)"
                 R"("kind":2,"startTimeUnixNano":"1","endTimeUnixNano":"2",)"
                 R"("attributes":[{"key":"tokenmeter.label.q\"k","value":)"
                 R"({"stringValue":"a\"b\\c\n\t\u0001\u001f café"}},)"
                 R"({"key":"t","value":{"boolValue":true}},)"
                 R"({"key":"i","value":{"intValue":"-9223372036854775808"}},)"
                 R"({"key":"d","value":{"doubleValue":1e-06}},)"
                 R"({"key":"nan","value":{"doubleValue":"NaN"}},)"
                 R"({"key":"inf","value":{"doubleValue":"-Infinity"}},)"
                 R"({"key":"a","value":{"arrayValue":{"values":[)"
                 R"({"stringValue":"stop"}]}}}],)"
                 R"("status":{"message":"x\"","code":2}})");
}

// The escaping of every byte value at every position of a short string
// (the encoder scans eight bytes at a time), against a byte-by-byte rule.
TEST(OtlpTraceEncoderTest, JsonEscapesEveryByteAtEveryPosition) {
  auto reference = [](std::string_view s) {
    static const char kHex[] = "0123456789abcdef";
    std::string out;
    for (unsigned char c : s) {
      if (c == '"') {
        out += "\\\"";
      } else if (c == '\\') {
        out += "\\\\";
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c < 0x20) {
        out += "\\u00";
        out += kHex[c >> 4];
        out += kHex[c & 0xf];
      } else {
        out += char(c);
      }
    }
    return out;
  };
  for (int byte = 1; byte < 256; ++byte) {
    for (size_t len : {1u, 7u, 8u, 9u, 17u}) {
      for (size_t pos = 0; pos < len; ++pos) {
        std::string value(len, 'a');
        value[pos] = char(byte);
        Attribute a;
        a.key = "k";
        a.str = value;
        SpanBatch b = OneSpan({a});
        std::string out;
        AppendSpans(OtlpEncoding::kJson, b, &out);
        const std::string want = R"({"key":"k","value":{"stringValue":")" +
                                 reference(value) + R"("}})";
        ASSERT_NE(out.find(want), std::string::npos)
            << "byte " << byte << " at " << pos << " of " << len;
      }
    }
  }
}

// A protobuf reader for the checks below: the fields of one message.
struct Field {
  uint32_t number;
  uint32_t wire;
  uint64_t value;         // varint or fixed
  std::string_view body;  // length-delimited
};

bool ReadVarint(std::string_view& in, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
    const uint8_t b = uint8_t(in[0]);
    in.remove_prefix(1);
    *v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

std::vector<Field> Fields(std::string_view in) {
  std::vector<Field> out;
  while (!in.empty()) {
    uint64_t key;
    Field f{};
    EXPECT_TRUE(ReadVarint(in, &key));
    f.number = uint32_t(key >> 3);
    f.wire = uint32_t(key & 7);
    if (f.wire == 0) {
      EXPECT_TRUE(ReadVarint(in, &f.value));
    } else if (f.wire == 1 || f.wire == 5) {
      const size_t n = f.wire == 1 ? 8 : 4;
      EXPECT_GE(in.size(), n);
      if (in.size() < n) return out;
      for (size_t i = 0; i < n; ++i)
        f.value |= uint64_t(uint8_t(in[i])) << 8 * i;
      in.remove_prefix(n);
    } else if (f.wire == 2) {
      uint64_t len;
      EXPECT_TRUE(ReadVarint(in, &len));
      EXPECT_LE(len, in.size());
      if (len > in.size()) return out;
      f.body = in.substr(0, len);
      in.remove_prefix(len);
    } else {
      ADD_FAILURE() << "wire type " << f.wire;
      return out;
    }
    out.push_back(f);
  }
  return out;
}

std::vector<Field> Only(std::string_view in, uint32_t number) {
  std::vector<Field> out;
  for (const Field& f : Fields(in)) {
    if (f.number == number) out.push_back(f);
  }
  return out;
}

TEST(OtlpTraceEncoderTest, LongFieldsGetMultiByteLengths) {
  const std::string long_value(300, 'v');
  Attribute a;
  a.key = "long";
  a.str = long_value;
  std::string out;
  EncodeExportTraceRequest(OtlpEncoding::kProtobuf, SmallResource(),
                           OneSpan({a, IntAttr("after", 7)}), &out);
  const auto rs = Only(out, 1);
  ASSERT_EQ(rs.size(), 1u);
  const auto ss = Only(rs[0].body, 2);
  ASSERT_EQ(ss.size(), 1u);
  const auto spans = Only(ss[0].body, 2);
  ASSERT_EQ(spans.size(), 1u);
  const auto attrs = Only(spans[0].body, 9);
  ASSERT_EQ(attrs.size(), 2u);
  const auto any = Only(attrs[0].body, 2);
  ASSERT_EQ(any.size(), 1u);
  const auto str = Only(any[0].body, 1);
  ASSERT_EQ(str.size(), 1u);
  EXPECT_EQ(str[0].body, long_value);
  EXPECT_EQ(Only(Only(attrs[1].body, 2)[0].body, 3)[0].value, 7u);
  EXPECT_EQ(Only(spans[0].body, 16)[0].value, 0x101u);
}

TEST(OtlpTraceEncoderTest, BuiltSpansParseBackWholly) {
  CountingIdSource ids;
  SpanOptions options;
  options.unix_minus_monotonic_ns = testing::kTestOffsetNs;
  SpanBatch b;
  const std::vector<RequestTimeline> timelines = testing::AllTimelines();
  for (const RequestTimeline& t : timelines) BuildSpans(t, options, ids, &b);
  TraceResource resource = SmallResource();
  resource.attributes.emplace_back("long", std::string(200, 'x'));
  std::string out;
  EncodeExportTraceRequest(OtlpEncoding::kProtobuf, resource, b, &out);
  const auto rs = Only(out, 1);
  ASSERT_EQ(rs.size(), 1u);
  const auto resources = Only(rs[0].body, 1);
  ASSERT_EQ(resources.size(), 1u);
  EXPECT_EQ(Only(resources[0].body, 1).size(), 2u);
  const auto ss = Only(rs[0].body, 2);
  ASSERT_EQ(ss.size(), 1u);
  const auto spans = Only(ss[0].body, 2);
  ASSERT_EQ(spans.size(), b.spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = b.spans[i];
    EXPECT_EQ(Only(spans[i].body, 5)[0].body, s.name);
    EXPECT_EQ(Only(spans[i].body, 7)[0].value, s.start_unix_ns);
    EXPECT_EQ(Only(spans[i].body, 8)[0].value, s.end_unix_ns);
    const auto attrs = Only(spans[i].body, 9);
    ASSERT_EQ(attrs.size(), s.attributes_end - s.attributes_begin);
    for (size_t j = 0; j < attrs.size(); ++j) {
      const Attribute& a = b.attributes[s.attributes_begin + j];
      EXPECT_EQ(Only(attrs[j].body, 1)[0].body,
                std::string(a.key_prefix) + std::string(a.key));
    }
  }
}

TEST(OtlpTraceEncoderTest, AddsConcatenateAndFinishClears) {
  CountingIdSource ids;
  SpanBatch one;
  SpanBatch two;
  SpanBatch both;
  SpanOptions options;
  const RequestTimeline typical = testing::TypicalTimeline();
  const RequestTimeline failed = testing::FailedTimeline();
  BuildSpans(typical, options, ids, &one);
  BuildSpans(failed, options, ids, &two);
  for (const SpanBatch* part : {&one, &two}) {
    for (const Span& s : part->spans) {
      Span copy = s;
      copy.attributes_begin = uint32_t(both.attributes.size());
      for (const Attribute& a : part->AttributesOf(s)) {
        both.attributes.push_back(a);
      }
      copy.attributes_end = uint32_t(both.attributes.size());
      both.spans.push_back(copy);
    }
  }
  for (OtlpEncoding e : {OtlpEncoding::kProtobuf, OtlpEncoding::kJson}) {
    OtlpTraceEncoder encoder(e, SmallResource());
    EXPECT_EQ(encoder.encoding(), e);
    std::string none;
    EXPECT_EQ(encoder.Finish(&none), 0u);
    EXPECT_TRUE(none.empty());
    encoder.Add(one);
    encoder.Add(two);
    EXPECT_EQ(encoder.pending_spans(), one.spans.size() + two.spans.size());
    std::string request;
    EXPECT_EQ(encoder.Finish(&request), both.spans.size());
    std::string want;
    EncodeExportTraceRequest(e, SmallResource(), both, &want);
    EXPECT_EQ(request, want);
    EXPECT_EQ(encoder.pending_spans(), 0u);
    EXPECT_EQ(encoder.pending_bytes(), 0u);
    // Reused: the same request again.
    encoder.Add(both);
    const size_t pending = encoder.pending_bytes();
    std::string again;
    encoder.Finish(&again);
    EXPECT_EQ(again, want);
    EXPECT_LE(again.size(), pending + encoder.overhead_bytes());
  }
}

TEST(OtlpTraceEncoderTest, EmptyBatchGivesAnEmptyRequest) {
  std::string pb;
  std::string json;
  EncodeExportTraceRequest(OtlpEncoding::kProtobuf, SmallResource(),
                           SpanBatch(), &pb);
  EncodeExportTraceRequest(OtlpEncoding::kJson, SmallResource(), SpanBatch(),
                           &json);
  EXPECT_EQ(pb, "");
  EXPECT_EQ(json, "{}");
}

TEST(OtlpTraceEncoderTest, ContentTypes) {
  EXPECT_EQ(ContentType(OtlpEncoding::kProtobuf), "application/x-protobuf");
  EXPECT_EQ(ContentType(OtlpEncoding::kJson), "application/json");
}

}  // namespace
}  // namespace tokenmeter::daemon::trace
