// The syntax of an HTTP listen address (--listen), shared by the flag
// parser (a bad address is a bad flag: exit 2) and Server::Listen().
#ifndef TOKENMETER_DAEMON_HTTP_LISTEN_ADDRESS_H_
#define TOKENMETER_DAEMON_HTTP_LISTEN_ADDRESS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "daemon/base/status.h"

namespace tokenmeter::daemon::http {

struct ListenAddress {
  std::string host;        // empty for ":PORT" (every interface)
  uint16_t port = 0;       // 0: a free port
  bool bracketed = false;  // "[IPV6]:PORT"
};

// Splits "HOST:PORT", ":PORT" or "[IPV6]:PORT" and checks PORT (0..65535,
// decimal digits). Resolves nothing: whether HOST is an address or a name
// is Server::Listen()'s business. The error says what is wrong with
// `text`, without naming it. O(size), no allocation beyond `out->host`.
Status ParseListenAddress(std::string_view text, ListenAddress* out);

}  // namespace tokenmeter::daemon::http

#endif  // TOKENMETER_DAEMON_HTTP_LISTEN_ADDRESS_H_
