// Test material for --web-config: a self-signed certificate made in-process
// with OpenSSL, bcrypt hashes, Basic credentials, and a TLS client.
#ifndef TOKENMETER_TESTS_DAEMON_HTTP_TEST_CERTS_H_
#define TOKENMETER_TESTS_DAEMON_HTTP_TEST_CERTS_H_

#include <crypt.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

namespace tokenmeter::testutil {

// Writes a P-256 key and a self-signed certificate for CN=localhost (also
// DNS:localhost, IP:127.0.0.1) as PEM files; false on any failure.
inline bool WriteSelfSignedCert(const std::string& cert_path,
                                const std::string& key_path) {
  EVP_PKEY* key = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
  X509* cert = X509_new();
  bool ok = key != nullptr && cert != nullptr;
  if (ok) {
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), 86400);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(
        name, "CN", MBSTRING_ASC,
        reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
    X509_set_issuer_name(cert, name);
    X509_EXTENSION* san =
        X509V3_EXT_conf_nid(nullptr, nullptr, NID_subject_alt_name,
                            const_cast<char*>("DNS:localhost,IP:127.0.0.1"));
    ok = san != nullptr && X509_add_ext(cert, san, -1) == 1 &&
         X509_sign(cert, key, EVP_sha256()) > 0;
    X509_EXTENSION_free(san);
  }
  if (ok) {
    FILE* c = std::fopen(cert_path.c_str(), "w");
    FILE* k = std::fopen(key_path.c_str(), "w");
    ok = c != nullptr && k != nullptr && PEM_write_X509(c, cert) == 1 &&
         PEM_write_PrivateKey(k, key, nullptr, nullptr, 0, nullptr, nullptr) ==
             1;
    if (c != nullptr) std::fclose(c);
    if (k != nullptr) std::fclose(k);
  }
  X509_free(cert);
  EVP_PKEY_free(key);
  return ok;
}

// A bcrypt ($2b$, cost 4 unless given: each step doubles the time) hash of
// `password`; empty on failure.
inline std::string BcryptHash(const std::string& password,
                              unsigned long cost = 4) {
  char setting[CRYPT_GENSALT_OUTPUT_SIZE];
  if (crypt_gensalt_rn("$2b$", cost, nullptr, 0, setting, sizeof(setting)) ==
      nullptr) {
    return "";
  }
  auto data = std::make_unique<crypt_data>();
  const char* hash = crypt_r(password.c_str(), setting, data.get());
  return hash != nullptr && hash[0] == '$' ? hash : "";
}

// The Authorization value "Basic base64(user_pass)".
inline std::string Basic(const std::string& user_pass) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < user_pass.size(); i += 3) {
    uint32_t w = (uint8_t(user_pass[i]) << 16) |
                 (uint8_t(user_pass[i + 1]) << 8) | uint8_t(user_pass[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(w >> s) & 63];
  }
  if (user_pass.size() - i == 1) {
    uint32_t w = uint8_t(user_pass[i]) << 16;
    out += kAlphabet[(w >> 18) & 63];
    out += kAlphabet[(w >> 12) & 63];
    out += "==";
  } else if (user_pass.size() - i == 2) {
    uint32_t w =
        (uint8_t(user_pass[i]) << 16) | (uint8_t(user_pass[i + 1]) << 8);
    out += kAlphabet[(w >> 18) & 63];
    out += kAlphabet[(w >> 12) & 63];
    out += kAlphabet[(w >> 6) & 63];
    out += "=";
  }
  return "Basic " + out;
}

// A blocking TLS client over an already connected socket (not owned).
class TlsClient {
 public:
  TlsClient() : ctx_(SSL_CTX_new(TLS_client_method())) {}
  TlsClient(const TlsClient&) = delete;
  TlsClient& operator=(const TlsClient&) = delete;
  ~TlsClient() {
    SSL_free(ssl_);
    SSL_CTX_free(ctx_);
  }

  // Handshakes, verifying the server against `ca_file` when given.
  bool Handshake(int fd, const std::string& ca_file = "") {
    if (!ca_file.empty()) {
      if (SSL_CTX_load_verify_locations(ctx_, ca_file.c_str(), nullptr) != 1)
        return false;
      SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER, nullptr);
    }
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd);
    SSL_set_tlsext_host_name(ssl_, "localhost");
    SSL_set1_host(ssl_, "localhost");
    return SSL_connect(ssl_) == 1;
  }

  bool Send(std::string_view data) {
    size_t n = 0;
    return SSL_write_ex(ssl_, data.data(), data.size(), &n) == 1 &&
           n == data.size();
  }

  // Reads until the server closes the TLS session or the socket (or the
  // socket's receive timeout).
  std::string ReadAll() {
    std::string out;
    char buf[16384];
    size_t n = 0;
    while (SSL_read_ex(ssl_, buf, sizeof(buf), &n) == 1) out.append(buf, n);
    return out;
  }

  // Reads until `out` holds a complete response with Content-Length.
  bool ReadResponse(std::string* out) {
    out->clear();
    char buf[16384];
    size_t n = 0;
    while (true) {
      size_t end = out->find("\r\n\r\n");
      if (end != std::string::npos) {
        size_t cl = out->find("Content-Length: ");
        if (cl != std::string::npos && cl < end) {
          size_t length = std::stoul(out->substr(cl + 16));
          if (out->size() >= end + 4 + length) return true;
        }
      }
      if (SSL_read_ex(ssl_, buf, sizeof(buf), &n) != 1) return false;
      out->append(buf, n);
    }
  }

 private:
  SSL_CTX* ctx_;
  SSL* ssl_ = nullptr;
};

}  // namespace tokenmeter::testutil

#endif  // TOKENMETER_TESTS_DAEMON_HTTP_TEST_CERTS_H_
