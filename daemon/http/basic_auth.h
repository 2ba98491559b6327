// HTTP basic authentication (RFC 7617) against bcrypt hashes, as the
// exporter-toolkit web configuration's basic_auth_users.
//
// Threads: loop thread only (the cache is not locked).
// Cost: a bcrypt check (crypt_r; about 50-100 ms at cost 10, blocking the
// loop) the first time a user's password is seen and for every wrong or
// unknown one; afterwards a correct password is recognised by an HMAC
// (microseconds) kept per user in memory (at most one entry per user).
#ifndef TOKENMETER_DAEMON_HTTP_BASIC_AUTH_H_
#define TOKENMETER_DAEMON_HTTP_BASIC_AUTH_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "daemon/base/status.h"

namespace tokenmeter::daemon::http {

class BasicAuth {
 public:
  // users: name -> bcrypt hash ($2a$, $2b$ or $2y$, 60 characters). A hash
  // crypt_r does not accept is an error naming the user.
  static Status Create(std::map<std::string, std::string> users,
                       std::unique_ptr<BasicAuth>* out);
  BasicAuth(const BasicAuth&) = delete;
  BasicAuth& operator=(const BasicAuth&) = delete;

  // True when `authorization` (the Authorization header's value) is
  // "Basic base64(user:password)" for a configured user and password.
  bool Check(std::string_view authorization);

  // True for a string crypt_r accepts as a bcrypt hash.
  static bool IsBcryptHash(const std::string& hash);

 private:
  using Mac = std::array<uint8_t, 32>;
  explicit BasicAuth(std::map<std::string, std::string> users);
  Mac MacOf(std::string_view user, std::string_view password) const;
  static bool BcryptMatches(const std::string& password,
                            const std::string& hash);

  std::map<std::string, std::string, std::less<>> users_;
  // Per-process random key of the cache's HMAC.
  std::array<uint8_t, 32> key_{};
  // user -> HMAC(key, user NUL password) of the last password that passed.
  std::map<std::string, Mac, std::less<>> verified_;
};

}  // namespace tokenmeter::daemon::http

#endif  // TOKENMETER_DAEMON_HTTP_BASIC_AUTH_H_
