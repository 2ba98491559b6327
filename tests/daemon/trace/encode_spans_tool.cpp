// The trace encoder's side of otlp_trace_encoder_otel_test.py: builds the
// spans of the test timelines (test_timelines.h) with predictable ids and
// writes, into OUT_DIR,
//
//   spans.pb       the ExportTraceServiceRequest in protobuf
//   spans.json     the same in OTLP/JSON
//   expected.json  what a receiver should decode, as a document of
//                  tests/otel/reference_spans.mjs (ids, parents, names,
//                  kinds, times, typed attributes, status), plus each
//                  span's "flags" and "trace_state", which that script
//                  ignores and the test compares too
//
// The expected document is written here from the Span structs, by code
// that shares nothing with the encoder, so the test checks the encoder
// (the builder's values are checked by span_builder_test).
//
// Usage: encode_spans_tool OUT_DIR
#include <charconv>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>

#include "daemon/trace/ids.h"
#include "daemon/trace/otlp_trace_encoder.h"
#include "daemon/trace/span_builder.h"
#include "daemon/trace/trace_context.h"
#include "test_timelines.h"

namespace trace = tokenmeter::daemon::trace;

namespace {

void Quote(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  out += '"';
}

template <typename T>
std::string Number(T v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, end);
}

void TypedValue(std::string& out, const trace::Attribute& a) {
  using Type = trace::Attribute::Type;
  switch (a.type) {
    case Type::kString:
      out += "{\"type\":\"string\",\"value\":";
      Quote(out, a.str);
      out += '}';
      break;
    case Type::kBool:
      out += a.bool_value ? "{\"type\":\"bool\",\"value\":true}"
                          : "{\"type\":\"bool\",\"value\":false}";
      break;
    case Type::kInt:
      out += "{\"type\":\"int\",\"value\":\"" + Number(a.int_value) + "\"}";
      break;
    case Type::kDouble:
      out += "{\"type\":\"double\",\"value\":" + Number(a.double_value) + "}";
      break;
    case Type::kStringArray1:
      out += "{\"type\":\"array\",\"value\":[{\"type\":\"string\",\"value\":";
      Quote(out, a.str);
      out += "}]}";
      break;
  }
}

std::string Hex(const trace::TraceId& id) {
  char buf[32];
  trace::HexId(id, buf);
  return std::string(buf, 32);
}
std::string Hex(const trace::SpanId& id) {
  if (trace::IsZero(id)) return "";
  char buf[16];
  trace::HexId(id, buf);
  return std::string(buf, 16);
}

std::string ExpectedDocument(const trace::TraceResource& resource,
                             const trace::SpanBatch& batch) {
  std::string out = "{\"resource_attributes\":{";
  bool first = true;
  for (const auto& [key, value] : resource.attributes) {
    if (!first) out += ',';
    first = false;
    Quote(out, key);
    out += ":{\"type\":\"string\",\"value\":";
    Quote(out, value);
    out += '}';
  }
  out += "},\"scope\":{\"name\":";
  Quote(out, resource.scope_name);
  out += ",\"version\":";
  Quote(out, resource.scope_version);
  out += "},\"spans\":[";
  first = true;
  for (const trace::Span& s : batch.spans) {
    if (!first) out += ',';
    first = false;
    out += "\n{\"trace_id\":\"" + Hex(s.trace_id) + "\",\"span_id\":\"" +
           Hex(s.span_id) + "\",\"parent_span_id\":\"" + Hex(s.parent_span_id) +
           "\",\"name\":";
    Quote(out, s.name);
    out += ",\"kind\":" + Number(int(s.kind)) + ",\"start_unix_nano\":\"" +
           Number(s.start_unix_ns) + "\",\"end_unix_nano\":\"" +
           Number(s.end_unix_ns) + "\",\"attributes\":{";
    bool first_attribute = true;
    for (const trace::Attribute& a : batch.AttributesOf(s)) {
      if (!first_attribute) out += ',';
      first_attribute = false;
      Quote(out, std::string(a.key_prefix) + std::string(a.key));
      out += ':';
      TypedValue(out, a);
    }
    out += "},\"status\":{\"code\":" + Number(int(s.status_code)) +
           ",\"message\":";
    Quote(out, s.status_message);
    out += "},\"events\":[],\"flags\":" + Number(s.flags) + ",\"trace_state\":";
    Quote(out, s.trace_state);
    out += '}';
  }
  out += "]}\n";
  return out;
}

bool Write(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  f.close();
  if (!f) {
    std::fprintf(stderr, "encode_spans_tool: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: encode_spans_tool OUT_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  const std::vector<trace::RequestTimeline> timelines =
      trace::testing::AllTimelines();
  trace::CountingIdSource ids(0x5eed000000000000ULL, 0x1000);
  trace::SpanOptions options;
  options.unix_minus_monotonic_ns = trace::testing::kTestOffsetNs;
  trace::SpanBatch batch;
  for (const trace::RequestTimeline& t : timelines) {
    trace::BuildSpans(t, options, ids, &batch);
  }

  trace::TraceResource resource;
  resource.attributes = {{"service.name", "tokenmeterd"},
                         {"service.instance.id", "host-1"},
                         {"deployment.environment.name", "test"}};
  resource.scope_version = "1.2.0";

  std::string pb;
  std::string json;
  trace::EncodeExportTraceRequest(trace::OtlpEncoding::kProtobuf, resource,
                                  batch, &pb);
  trace::EncodeExportTraceRequest(trace::OtlpEncoding::kJson, resource, batch,
                                  &json);
  if (!Write(dir + "/spans.pb", pb) || !Write(dir + "/spans.json", json) ||
      !Write(dir + "/expected.json", ExpectedDocument(resource, batch))) {
    return 1;
  }
  std::printf("spans %zu protobuf %zu json %zu\n", batch.spans.size(),
              pb.size(), json.size());
  return 0;
}
