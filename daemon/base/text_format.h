// Locale-independent number formatting and label escaping for the
// Prometheus text formats. Appends to a std::string; never allocates more
// than the appended text needs.
#ifndef TOKENMETER_DAEMON_BASE_TEXT_FORMAT_H_
#define TOKENMETER_DAEMON_BASE_TEXT_FORMAT_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace tokenmeter::daemon {

// The shortest text that reads back as exactly `v` ("0.1", "1e-06",
// "2560"), "+Inf", "-Inf" or "NaN". Independent of the C locale.
void AppendDouble(std::string& out, double v);
void AppendUint(std::string& out, uint64_t v);
// A label value escaped per the text format: backslash, double quote and
// newline become \\, \" and \n.
void AppendEscaped(std::string& out, std::string_view value);
// One label of a series' pre-rendered label text: `name="value"` with the
// value escaped, after a comma unless `text` is empty.
void AppendLabel(std::string& text, std::string_view name,
                 std::string_view value);
// HELP text escaped per the text format (backslash and newline).
void AppendHelpEscaped(std::string& out, std::string_view help);

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_BASE_TEXT_FORMAT_H_
