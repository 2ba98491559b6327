#include "daemon/http/listen_address.h"

namespace tokenmeter::daemon::http {
namespace {

bool ParsePort(std::string_view text, uint16_t* port) {
  if (text.empty() || text.size() > 5) return false;
  uint32_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<uint32_t>(c - '0');
  }
  if (value > 65535) return false;
  *port = static_cast<uint16_t>(value);
  return true;
}

}  // namespace

Status ParseListenAddress(std::string_view text, ListenAddress* out) {
  ListenAddress a;
  std::string_view port_text;
  if (!text.empty() && text[0] == '[') {
    const size_t end = text.find(']');
    if (end == std::string_view::npos || end + 1 >= text.size() ||
        text[end + 1] != ':' || end == 1) {
      return Status::Error("expected [IPV6]:PORT");
    }
    a.host = std::string(text.substr(1, end - 1));
    port_text = text.substr(end + 2);
    a.bracketed = true;
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      return Status::Error("expected HOST:PORT, :PORT or [IPV6]:PORT");
    }
    a.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
    if (a.host.find(':') != std::string::npos) {
      return Status::Error("an IPv6 address needs brackets, as in [::1]:PORT");
    }
  }
  if (!ParsePort(port_text, &a.port)) {
    return Status::Error("bad port \"" + std::string(port_text) +
                         "\" (want 0-65535)");
  }
  *out = std::move(a);
  return Status::Ok();
}

}  // namespace tokenmeter::daemon::http
