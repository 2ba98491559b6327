// JSON output for the OTLP/JSON encoders (daemon/trace/otlp_trace_encoder,
// daemon/otlp_metrics/otlp_metrics_encoder): strings escaped, integers,
// 64-bit integers as strings (the protobuf JSON mapping) and doubles as the
// shortest text that reads back exactly, with "NaN", "Infinity" and
// "-Infinity" as strings. Locale-independent (std::to_chars). Appends to
// a std::string; pure functions, any thread.
#ifndef TOKENMETER_DAEMON_BASE_JSON_WRITE_H_
#define TOKENMETER_DAEMON_BASE_JSON_WRITE_H_

#include <charconv>
#include <cstddef>
#include <string>
#include <string_view>

namespace tokenmeter::daemon::json_write {

// `s` with '"', '\\' and control characters escaped (no quotes). The input
// is taken as UTF-8 and written as is otherwise. Eight bytes at a time
// where nothing needs escaping.
void JsonEscaped(std::string* out, std::string_view s);

// A JSON string holding a followed by b.
inline void JsonString(std::string* out, std::string_view a,
                       std::string_view b = {}) {
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

void JsonDouble(std::string* out, double v);

}  // namespace tokenmeter::daemon::json_write

#endif  // TOKENMETER_DAEMON_BASE_JSON_WRITE_H_
