#include "daemon/http/basic_auth.h"

#include <crypt.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <spdlog/fmt/fmt.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

namespace tokenmeter::daemon::http {
namespace {

// A valid bcrypt hash of a random string: unknown users cost the same
// bcrypt check as known ones, so timing does not tell them apart.
constexpr const char* kDummyHash =
    "$2y$10$r/EnNjlHT2US6RvnESfW9uGtTl84pXp.J7DhHkjXHdmTqiByfuw1.";

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with padding; nullopt on anything else.
std::optional<std::string> DecodeBase64(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      char c = in[i + j];
      if (c == '=' && i + 4 == in.size() && j >= 2) {
        v[j] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return std::nullopt;  // data after '='
      v[j] = Base64Value(c);
      if (v[j] < 0) return std::nullopt;
    }
    uint32_t word = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) |
                    (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out += static_cast<char>(word >> 16);
    if (pad < 2) out += static_cast<char>((word >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(word & 0xff);
  }
  return out;
}

bool StartsWithBasic(std::string_view s) {
  if (s.size() < 6) return false;
  static constexpr char kBasic[] = "basic";
  for (size_t i = 0; i < 5; ++i) {
    char c = s[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != kBasic[i]) return false;
  }
  return s[5] == ' ';
}

}  // namespace

bool BasicAuth::IsBcryptHash(const std::string& hash) {
  if (hash.size() != 60 ||
      (hash.compare(0, 4, "$2a$") != 0 && hash.compare(0, 4, "$2b$") != 0 &&
       hash.compare(0, 4, "$2y$") != 0)) {
    return false;
  }
  // libxcrypt's own check of the setting (cost, salt). It also keeps
  // libcrypt linked under ASan, whose crypt_r interceptor would otherwise
  // satisfy the linker and leave the real crypt_r unloaded.
  if (crypt_checksalt(hash.c_str()) != CRYPT_SALT_OK) return false;
  // crypt_r accepts the setting only if it is well formed.
  auto data = std::make_unique<crypt_data>();
  const char* r = crypt_r("", hash.c_str(), data.get());
  return r != nullptr && r[0] == '$' && std::strlen(r) == hash.size();
}

bool BasicAuth::BcryptMatches(const std::string& password,
                              const std::string& hash) {
  auto data = std::make_unique<crypt_data>();  // about 32 KiB
  const char* r = crypt_r(password.c_str(), hash.c_str(), data.get());
  return r != nullptr && std::strlen(r) == hash.size() &&
         CRYPTO_memcmp(r, hash.data(), hash.size()) == 0;
}

Status BasicAuth::Create(std::map<std::string, std::string> users,
                         std::unique_ptr<BasicAuth>* out) {
  for (const auto& [user, hash] : users) {
    if (!IsBcryptHash(hash)) {
      return Status::Error(fmt::format(
          "basic_auth_users: the password of \"{}\" is not a bcrypt hash "
          "($2a$, $2b$ or $2y$; make one with htpasswd -nbBC 10 USER PASS)",
          user));
    }
    if (user.find(':') != std::string::npos) {
      return Status::Error(
          fmt::format("basic_auth_users: user name \"{}\" contains ':'", user));
    }
  }
  out->reset(new BasicAuth(std::move(users)));
  return Status::Ok();
}

BasicAuth::BasicAuth(std::map<std::string, std::string> users)
    : users_(users.begin(), users.end()) {
  if (RAND_bytes(key_.data(), static_cast<int>(key_.size())) != 1) {
    std::abort();  // No randomness: nothing secure can run.
  }
}

BasicAuth::Mac BasicAuth::MacOf(std::string_view user,
                                std::string_view password) const {
  std::string message;
  message.reserve(user.size() + 1 + password.size());
  message.append(user).push_back('\0');
  message.append(password);
  Mac mac{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
       mac.data(), &len);
  OPENSSL_cleanse(message.data(), message.size());
  return mac;
}

bool BasicAuth::Check(std::string_view authorization) {
  while (!authorization.empty() && authorization.front() == ' ') {
    authorization.remove_prefix(1);
  }
  if (!StartsWithBasic(authorization)) return false;
  std::string_view encoded = authorization.substr(6);
  while (!encoded.empty() && encoded.front() == ' ') encoded.remove_prefix(1);
  while (!encoded.empty() && encoded.back() == ' ') encoded.remove_suffix(1);
  std::optional<std::string> decoded = DecodeBase64(encoded);
  if (!decoded) return false;
  size_t colon = decoded->find(':');
  if (colon == std::string::npos) return false;
  std::string user = decoded->substr(0, colon);
  std::string password = decoded->substr(colon + 1);
  OPENSSL_cleanse(decoded->data(), decoded->size());
  // crypt_r reads a C string: a NUL inside would cut the password short.
  if (password.find('\0') != std::string::npos) return false;
  auto it = users_.find(user);
  if (it == users_.end()) {
    BcryptMatches(password, kDummyHash);
    return false;
  }
  Mac mac = MacOf(user, password);
  auto cached = verified_.find(user);
  bool ok = cached != verified_.end() &&
            CRYPTO_memcmp(cached->second.data(), mac.data(), mac.size()) == 0;
  if (!ok && BcryptMatches(password, it->second)) {
    verified_[it->first] = mac;
    ok = true;
  }
  OPENSSL_cleanse(password.data(), password.size());
  return ok;
}

}  // namespace tokenmeter::daemon::http
