// A scripted HTTP/1.1 server for the exporter's tests: plain or TLS (with
// an optional client-certificate requirement), one thread per connection,
// blocking sockets, keep-alive. Each request is recorded whole and answered
// as the test's script says: a response (after an optional delay), a TCP
// reset, a close without an answer, or a stall until the server stops.
// Also a small PKI (CA, server and client certificates) made with OpenSSL
// at test time.
#ifndef TOKENMETER_TESTS_DAEMON_OTLP_TEST_SERVER_H_
#define TOKENMETER_TESTS_DAEMON_OTLP_TEST_SERVER_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tokenmeter::testutil {

struct ReceivedRequest {
  std::string method;
  std::string target;
  // As sent, in order; names as written.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::chrono::steady_clock::time_point at;  // when fully read
  std::string client_cn;  // TLS: the client certificate's CN, if any

  // The first header of that name (case-insensitive); nullopt if none.
  std::optional<std::string> Header(std::string_view name) const {
    for (const auto& [n, v] : headers) {
      if (n.size() == name.size() &&
          std::equal(n.begin(), n.end(), name.begin(), [](char a, char b) {
            return std::tolower(static_cast<unsigned char>(a)) ==
                   std::tolower(static_cast<unsigned char>(b));
          })) {
        return v;
      }
    }
    return std::nullopt;
  }
};

struct Reply {
  enum class Kind { kRespond, kReset, kClose, kStall };
  Kind kind = Kind::kRespond;
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::chrono::milliseconds delay{0};  // before answering

  static Reply Status(int status, std::string body = "") {
    Reply r;
    r.status = status;
    r.body = std::move(body);
    return r;
  }
  static Reply Of(Kind kind) {
    Reply r;
    r.kind = kind;
    return r;
  }
};

// Called on a connection thread for request number `index` (0-based,
// server-wide order of arrival).
using Script = std::function<Reply(const ReceivedRequest&, int index)>;

class TestServer {
 public:
  struct Tls {
    std::string cert_file;
    std::string key_file;
    std::string client_ca_file;  // non-empty: a client certificate is required
  };

  explicit TestServer(Script script, std::optional<Tls> tls = std::nullopt)
      : script_(std::move(script)), tls_(std::move(tls)) {}
  TestServer(const TestServer&) = delete;
  TestServer& operator=(const TestServer&) = delete;
  ~TestServer() { Stop(); }

  // Listens on 127.0.0.1, a free port. False (with a reason in error())
  // on failure.
  bool Start() {
    if (tls_.has_value() && !MakeContext()) return false;
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (listen_fd_ < 0 ||
        bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
            0 ||
        listen(listen_fd_, 64) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) !=
            0) {
      error_ = std::string("listen: ") + std::strerror(errno);
      return false;
    }
    port_ = ntohs(addr.sin_port);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
    return true;
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
      if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);
      for (int fd : connection_fds_) shutdown(fd, SHUT_RDWR);
    }
    cv_.notify_all();
    if (accept_thread_.joinable()) accept_thread_.join();
    {
      // Connections accepted before the accept thread ended.
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : connection_fds_) shutdown(fd, SHUT_RDWR);
    }
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    if (listen_fd_ >= 0) close(listen_fd_);
    listen_fd_ = -1;
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
    ctx_ = nullptr;
  }

  uint16_t port() const { return port_; }
  std::string Url(const std::string& path) const {
    return std::string(tls_.has_value() ? "https" : "http") +
           "://127.0.0.1:" + std::to_string(port_) + path;
  }
  const std::string& error() const { return error_; }

  std::vector<ReceivedRequest> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  size_t request_count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_.size();
  }
  // The most requests ever being answered at once (received, reply not yet
  // written).
  int max_concurrent() const {
    std::lock_guard<std::mutex> lock(mu_);
    return max_active_;
  }
  int connections() const {
    std::lock_guard<std::mutex> lock(mu_);
    return connections_;
  }
  int handshake_failures() const {
    std::lock_guard<std::mutex> lock(mu_);
    return handshake_failures_;
  }

 private:
  bool MakeContext() {
    ctx_ = SSL_CTX_new(TLS_server_method());
    if (ctx_ == nullptr ||
        SSL_CTX_use_certificate_chain_file(ctx_, tls_->cert_file.c_str()) !=
            1 ||
        SSL_CTX_use_PrivateKey_file(ctx_, tls_->key_file.c_str(),
                                    SSL_FILETYPE_PEM) != 1) {
      error_ = "TLS context: cannot load the server certificate";
      return false;
    }
    if (!tls_->client_ca_file.empty()) {
      if (SSL_CTX_load_verify_locations(ctx_, tls_->client_ca_file.c_str(),
                                        nullptr) != 1) {
        error_ = "TLS context: cannot load the client CA";
        return false;
      }
      SSL_CTX_set_verify(
          ctx_, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    }
    return true;
  }

  void AcceptLoop() {
    while (true) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      std::lock_guard<std::mutex> lock(mu_);
      if (fd < 0) {
        if (errno == EINTR && !stopping_) continue;
        return;
      }
      if (stopping_) {
        close(fd);
        return;
      }
      ++connections_;
      connection_fds_.push_back(fd);
      threads_.emplace_back([this, fd] { Serve(fd); });
    }
  }

  // One connection: plain or TLS reads and writes.
  struct Conn {
    int fd = -1;
    SSL* ssl = nullptr;
    ssize_t Read(char* buf, size_t n) {
      if (ssl != nullptr) return SSL_read(ssl, buf, static_cast<int>(n));
      return recv(fd, buf, n, 0);
    }
    bool Write(std::string_view data) {
      while (!data.empty()) {
        ssize_t n =
            ssl != nullptr
                ? SSL_write(ssl, data.data(), static_cast<int>(data.size()))
                : send(fd, data.data(), data.size(), MSG_NOSIGNAL);
        if (n <= 0) return false;
        data.remove_prefix(static_cast<size_t>(n));
      }
      return true;
    }
  };

  void Serve(int fd) {
    Conn c;
    c.fd = fd;
    std::string client_cn;
    bool closed = false;
    if (ctx_ != nullptr) {
      c.ssl = SSL_new(ctx_);
      SSL_set_fd(c.ssl, fd);
      if (SSL_accept(c.ssl) != 1) {
        std::lock_guard<std::mutex> lock(mu_);
        ++handshake_failures_;
      } else {
        X509* peer = SSL_get1_peer_certificate(c.ssl);
        if (peer != nullptr) {
          char cn[256] = {};
          X509_NAME_get_text_by_NID(X509_get_subject_name(peer), NID_commonName,
                                    cn, sizeof(cn));
          client_cn = cn;
          X509_free(peer);
        }
        closed = ServeRequests(&c, client_cn);
      }
      SSL_free(c.ssl);
      ERR_clear_error();
    } else {
      closed = ServeRequests(&c, client_cn);
    }
    std::lock_guard<std::mutex> lock(mu_);
    connection_fds_.erase(
        std::find(connection_fds_.begin(), connection_fds_.end(), fd));
    if (!closed) close(fd);
  }

  // True when it closed the socket itself (a reset).
  bool ServeRequests(Conn* c, const std::string& client_cn) {
    std::string buffer;
    char chunk[16384];
    while (true) {
      size_t end;
      while ((end = buffer.find("\r\n\r\n")) == std::string::npos) {
        const ssize_t n = c->Read(chunk, sizeof(chunk));
        if (n <= 0) return false;
        buffer.append(chunk, static_cast<size_t>(n));
      }
      ReceivedRequest r;
      r.client_cn = client_cn;
      const std::string head = buffer.substr(0, end);
      buffer.erase(0, end + 4);
      size_t line_end = head.find("\r\n");
      const std::string request_line = head.substr(0, line_end);
      const size_t sp1 = request_line.find(' ');
      const size_t sp2 = request_line.find(' ', sp1 + 1);
      r.method = request_line.substr(0, sp1);
      r.target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
      while (line_end != std::string::npos) {
        const size_t start = line_end + 2;
        line_end = head.find("\r\n", start);
        const std::string line = head.substr(
            start, line_end == std::string::npos ? std::string::npos
                                                 : line_end - start);
        const size_t colon = line.find(':');
        if (colon == std::string::npos) return false;
        const size_t v = line.find_first_not_of(' ', colon + 1);
        r.headers.emplace_back(line.substr(0, colon),
                               v == std::string::npos ? "" : line.substr(v));
      }
      const size_t length =
          std::stoul(r.Header("content-length").value_or("0"));
      while (buffer.size() < length) {
        const ssize_t n = c->Read(chunk, sizeof(chunk));
        if (n <= 0) return false;
        buffer.append(chunk, static_cast<size_t>(n));
      }
      r.body = buffer.substr(0, length);
      buffer.erase(0, length);
      r.at = std::chrono::steady_clock::now();

      int index;
      {
        std::lock_guard<std::mutex> lock(mu_);
        index = static_cast<int>(requests_.size());
        requests_.push_back(r);
        max_active_ = std::max(max_active_, ++active_);
      }
      const Reply reply = script_(r, index);
      std::unique_lock<std::mutex> lock(mu_);
      if (reply.delay.count() > 0) {
        cv_.wait_for(lock, reply.delay, [this] { return stopping_; });
      }
      --active_;
      switch (reply.kind) {
        case Reply::Kind::kStall:
          cv_.wait(lock, [this] { return stopping_; });
          return false;
        case Reply::Kind::kClose:
          return false;
        case Reply::Kind::kReset: {
          // SO_LINGER 0: close() sends RST instead of FIN.
          linger l{1, 0};
          setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
          close(c->fd);
          return true;
        }
        case Reply::Kind::kRespond:
          break;
      }
      lock.unlock();
      std::string out =
          "HTTP/1.1 " + std::to_string(reply.status) +
          " X\r\nContent-Length: " + std::to_string(reply.body.size()) + "\r\n";
      for (const auto& [n, v] : reply.headers) out += n + ": " + v + "\r\n";
      out += "\r\n" + reply.body;
      if (!c->Write(out)) return false;
    }
  }

  Script script_;
  std::optional<Tls> tls_;
  SSL_CTX* ctx_ = nullptr;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::string error_;
  std::thread accept_thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<int> connection_fds_;
  std::vector<std::thread> threads_;
  std::vector<ReceivedRequest> requests_;
  int active_ = 0;
  int max_active_ = 0;
  int connections_ = 0;
  int handshake_failures_ = 0;
};

// A CA and a server and a client certificate it signed (P-256), as PEM
// files in `dir`: ca.pem, server.pem/server.key (CN and SAN localhost,
// 127.0.0.1), client.pem/client.key (CN tokenmeter-test-client).
class TestPki {
 public:
  explicit TestPki(const std::string& dir)
      : ca_file(dir + "/ca.pem"),
        server_cert(dir + "/server.pem"),
        server_key(dir + "/server.key"),
        client_cert(dir + "/client.pem"),
        client_key(dir + "/client.key") {}

  bool Make() {
    EVP_PKEY* ca_key = NewKey();
    EVP_PKEY* s_key = NewKey();
    EVP_PKEY* c_key = NewKey();
    X509* ca = Cert(ca_key, "tokenmeter-test-ca", nullptr, nullptr, true,
                    nullptr, nullptr, 1);
    X509* s = Cert(s_key, "localhost", ca, ca_key, false,
                   "DNS:localhost,IP:127.0.0.1", "serverAuth", 2);
    X509* c = Cert(c_key, "tokenmeter-test-client", ca, ca_key, false, nullptr,
                   "clientAuth", 3);
    const bool ok =
        ca != nullptr && s != nullptr && c != nullptr &&
        Write(ca_file, ca, nullptr) && Write(server_cert, s, nullptr) &&
        Write(server_key, nullptr, s_key) && Write(client_cert, c, nullptr) &&
        Write(client_key, nullptr, c_key);
    X509_free(ca);
    X509_free(s);
    X509_free(c);
    EVP_PKEY_free(ca_key);
    EVP_PKEY_free(s_key);
    EVP_PKEY_free(c_key);
    return ok;
  }

  const std::string ca_file;
  const std::string server_cert;
  const std::string server_key;
  const std::string client_cert;
  const std::string client_key;

 private:
  static EVP_PKEY* NewKey() {
    return EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
  }

  static bool AddExt(X509* cert, X509V3_CTX* ctx, int nid, const char* value) {
    X509_EXTENSION* ext =
        X509V3_EXT_conf_nid(nullptr, ctx, nid, const_cast<char*>(value));
    const bool ok = ext != nullptr && X509_add_ext(cert, ext, -1) == 1;
    X509_EXTENSION_free(ext);
    return ok;
  }

  // Self-signed when issuer is null.
  static X509* Cert(EVP_PKEY* key, const char* cn, X509* issuer,
                    EVP_PKEY* issuer_key, bool is_ca, const char* san,
                    const char* eku, long serial) {
    if (key == nullptr) return nullptr;
    X509* cert = X509_new();
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), serial);
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), 86400);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(cn), -1,
                               -1, 0);
    X509_set_issuer_name(
        cert, issuer != nullptr ? X509_get_subject_name(issuer) : name);
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, issuer != nullptr ? issuer : cert, cert, nullptr,
                   nullptr, 0);
    bool ok = AddExt(cert, &ctx, NID_basic_constraints,
                     is_ca ? "critical,CA:TRUE" : "critical,CA:FALSE") &&
              AddExt(cert, &ctx, NID_key_usage,
                     is_ca ? "critical,keyCertSign,cRLSign"
                           : "critical,digitalSignature") &&
              AddExt(cert, &ctx, NID_subject_key_identifier, "hash") &&
              AddExt(cert, &ctx, NID_authority_key_identifier, "keyid:always");
    if (ok && san != nullptr) {
      ok = AddExt(cert, &ctx, NID_subject_alt_name, san);
    }
    if (ok && eku != nullptr) ok = AddExt(cert, &ctx, NID_ext_key_usage, eku);
    ok = ok && X509_sign(cert, issuer_key != nullptr ? issuer_key : key,
                         EVP_sha256()) > 0;
    if (!ok) {
      X509_free(cert);
      return nullptr;
    }
    return cert;
  }

  static bool Write(const std::string& path, X509* cert, EVP_PKEY* key) {
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) return false;
    const bool ok = cert != nullptr
                        ? PEM_write_X509(f, cert) == 1
                        : PEM_write_PrivateKey(f, key, nullptr, nullptr, 0,
                                               nullptr, nullptr) == 1;
    return std::fclose(f) == 0 && ok;
  }
};

}  // namespace tokenmeter::testutil

#endif  // TOKENMETER_TESTS_DAEMON_OTLP_TEST_SERVER_H_
