// The rejected-item count of an OTLP export response's partial_success
// (ExportTraceServiceResponse, ExportMetricsServiceResponse and
// ExportLogsServiceResponse all carry `partial_success = 1` whose field 1
// is the count: rejected_spans, rejected_data_points,
// rejected_log_records), read without a protobuf or JSON library.
//
// Pure functions, any thread; cost linear in the body, no allocation
// beyond the returned message.
#ifndef TOKENMETER_DAEMON_OTLP_PARTIAL_SUCCESS_H_
#define TOKENMETER_DAEMON_OTLP_PARTIAL_SUCCESS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tokenmeter::daemon::otlp {

struct PartialSuccess {
  int64_t rejected = 0;
  std::string error_message;  // At most 256 bytes of it.
};

// From a binary protobuf response body. nullopt when the body has no
// partial_success or is not a well-formed message (a malformed answer to
// a 2xx is not worth failing the export over: the caller counts the
// items exported).
std::optional<PartialSuccess> ParseProtobufPartialSuccess(
    std::string_view body);

// From a JSON response body (OTLP/JSON: lowerCamelCase field names, int64
// as a string or a number): the first "rejectedSpans",
// "rejectedDataPoints" or "rejectedLogRecords" member (snake_case names
// accepted too) and "errorMessage". A scan for those keys, not a JSON
// parser: it does not check that the key sits inside "partialSuccess".
// Without such a count (proto3 JSON leaves out a zero), a "partialSuccess"
// key and a non-empty "errorMessage" are a warning: rejected 0 and the
// message. nullopt otherwise.
std::optional<PartialSuccess> ParseJsonPartialSuccess(std::string_view body);

}  // namespace tokenmeter::daemon::otlp

#endif  // TOKENMETER_DAEMON_OTLP_PARTIAL_SUCCESS_H_
