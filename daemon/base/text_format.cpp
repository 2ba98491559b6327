#include "daemon/base/text_format.h"

#include <charconv>
#include <cmath>

namespace tokenmeter::daemon {

void AppendDouble(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
    return;
  }
  char buf[32];
  // std::to_chars is locale-independent and, without a precision, gives the
  // shortest representation that round-trips.
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, end);
}

void AppendUint(std::string& out, uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, end);
}

void AppendEscaped(std::string& out, std::string_view value) {
  size_t start = 0;
  for (size_t i = 0; i < value.size(); ++i) {
    const char c = value[i];
    if (c != '\\' && c != '"' && c != '\n') continue;
    out.append(value.data() + start, i - start);
    out += '\\';
    out += c == '\n' ? 'n' : c;
    start = i + 1;
  }
  out.append(value.data() + start, value.size() - start);
}

void AppendLabel(std::string& text, std::string_view name,
                 std::string_view value) {
  if (!text.empty()) text += ',';
  text += name;
  text += "=\"";
  AppendEscaped(text, value);
  text += '"';
}

void AppendHelpEscaped(std::string& out, std::string_view help) {
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

}  // namespace tokenmeter::daemon
