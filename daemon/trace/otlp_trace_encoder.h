// Spans as an OTLP ExportTraceServiceRequest
// (opentelemetry/proto/collector/trace/v1/trace_service.proto), in
// protobuf (application/x-protobuf) or OTLP/JSON (application/json), the
// body daemon/otlp's transport sends to /v1/traces.
//
// One request holds one ResourceSpans (the caller's resource attributes,
// as strings) with one ScopeSpans (scope "tokenmeterd" and the daemon's
// version) and the spans in the order they were added.
//
// Protobuf: hand-written (no generated code, no libprotobuf), fields in
// field-number order as the generated encoders write them, proto3 defaults
// left out except inside AnyValue's oneof (flags, field 16, is fixed32 and
// never 0 on a built span). JSON: the OTLP/JSON mapping: lowerCamelCase keys,
// trace and span ids as lowercase hex, 64-bit integers (times, intValue) as
// decimal strings, enums (kind, status code) as numbers, doubles as the
// shortest text that reads back exactly ("NaN", "Infinity", "-Infinity"
// as strings), fields at their default left out. Strings are written as
// given: the timeline's text was checked as UTF-8 by the ingest decoder;
// JSON escapes '"', '\\' and control characters.
//
// The checks against OpenTelemetry's own decoders are
// tests/daemon/trace/otlp_trace_encoder_otel_test.py.
#ifndef TOKENMETER_DAEMON_TRACE_OTLP_TRACE_ENCODER_H_
#define TOKENMETER_DAEMON_TRACE_OTLP_TRACE_ENCODER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/trace/span.h"

namespace tokenmeter::daemon::trace {

enum class OtlpEncoding : uint8_t { kProtobuf, kJson };

// "application/x-protobuf" or "application/json".
std::string_view ContentType(OtlpEncoding encoding);

// What every request of an encoder carries besides its spans.
struct TraceResource {
  // Resource attributes in order (service.name first, by convention), all
  // string-valued; keys should be unique (OTLP requires it; not checked).
  std::vector<std::pair<std::string, std::string>> attributes;
  std::string scope_name = "tokenmeterd";
  std::string scope_version;  // empty: left out
};

// Appends the spans of `batch` to *out as elements of ScopeSpans.spans:
// protobuf, one length-delimited field 2 per span (so that encoded spans
// of several calls concatenate); JSON, one object per span, with a comma
// before each when *out is not empty. Cost: proportional to the bytes
// written (protobuf: each span's exact size first, then one pass of
// writes); besides *out's growth, one scratch vector per call
// (OtlpTraceEncoder::Add() reuses its own).
void AppendSpans(OtlpEncoding encoding, const SpanBatch& batch,
                 std::string* out);

// Builds export requests from spans added one request at a time: Add()
// encodes at once (the batch and the timeline its views point into may go
// away after it), Finish() wraps what was added. The resource and scope
// are encoded once, at construction. One thread at a time.
class OtlpTraceEncoder {
 public:
  OtlpTraceEncoder(OtlpEncoding encoding, const TraceResource& resource);

  OtlpEncoding encoding() const { return encoding_; }

  // Encodes every span of `batch` into the pending request.
  void Add(const SpanBatch& batch);

  // Spans and encoded span bytes pending (for batching: a request is
  // about pending_bytes() + overhead_bytes() long).
  size_t pending_spans() const { return pending_spans_; }
  size_t pending_bytes() const { return spans_.size(); }
  // The request's bytes besides the spans, at most (the resource, the
  // scope, the envelope).
  size_t overhead_bytes() const {
    return prefix_.size() + suffix_.size() + 2 * 10;
  }

  // Appends the ExportTraceServiceRequest of the pending spans to *out and
  // clears them (keeping the buffer); returns how many spans it holds. With
  // none pending it appends nothing and returns 0.
  size_t Finish(std::string* out);

 private:
  OtlpEncoding encoding_;
  // Protobuf: the Resource field and the InstrumentationScope field (the
  // lengths around them depend on the spans). JSON: the text before and
  // after the spans.
  std::string prefix_;
  std::string suffix_;
  std::string spans_;
  size_t pending_spans_ = 0;
  std::vector<uint32_t> scratch_;  // a span's attribute sizes
};

// One request of `batch`'s spans, appended to *out (an empty batch gives
// an empty request: no bytes in protobuf, "{}" in JSON).
void EncodeExportTraceRequest(OtlpEncoding encoding,
                              const TraceResource& resource,
                              const SpanBatch& batch, std::string* out);

}  // namespace tokenmeter::daemon::trace

#endif  // TOKENMETER_DAEMON_TRACE_OTLP_TRACE_ENCODER_H_
