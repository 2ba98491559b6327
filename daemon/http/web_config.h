// The exporter-toolkit web configuration file (--web-config FILE), the
// subset tokenmeterd supports:
//
//   tls_server_config:
//     cert_file: server.crt     # PEM chain; relative to the file's directory
//     key_file: server.key      # PEM private key
//   basic_auth_users:
//     prometheus: $2y$10$...    # bcrypt hash (htpasswd -nbBC 10 USER PASS)
//
// Either section may be absent (an empty file changes nothing). Any other
// key, a YAML error, a missing or unreadable cert or key, a key that does
// not match the certificate, or a password that is not a bcrypt hash is an
// error: one line naming the file and what is wrong.
//
// Threads: Load() runs once at start-up, before the loop.
#ifndef TOKENMETER_DAEMON_HTTP_WEB_CONFIG_H_
#define TOKENMETER_DAEMON_HTTP_WEB_CONFIG_H_

#include <memory>
#include <string>

#include "daemon/base/status.h"
#include "daemon/http/basic_auth.h"
#include "daemon/http/tls.h"

namespace tokenmeter::daemon::http {

struct WebConfig {
  std::shared_ptr<const TlsContext> tls;  // Null: plain HTTP.
  std::shared_ptr<BasicAuth> basic_auth;  // Null: no authentication.

  // Reads and checks `path` (cert and key loaded, hashes checked).
  static Status Load(const std::string& path, WebConfig* out);
};

}  // namespace tokenmeter::daemon::http

#endif  // TOKENMETER_DAEMON_HTTP_WEB_CONFIG_H_
