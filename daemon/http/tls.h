// TLS for the HTTP server: OpenSSL 3 over memory BIOs, so that libuv keeps
// doing every socket read and write and the connection feeds the bytes
// through a TlsSession.
//
// Threads: a TlsContext is immutable once created and may be shared; a
// TlsSession belongs to one connection and runs on the loop thread.
// Cost: a handshake (one ECDHE + one signature with the server key) per
// connection; after it, symmetric encryption of what is read and written.
#ifndef TOKENMETER_DAEMON_HTTP_TLS_H_
#define TOKENMETER_DAEMON_HTTP_TLS_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "daemon/base/status.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace tokenmeter::daemon::http {

// The server's certificate chain and private key (PEM files), TLS 1.2 and
// newer, no renegotiation.
class TlsContext {
 public:
  // Loads and checks the pair; a missing or unreadable file, a bad PEM or
  // a key that does not match the certificate is an error naming the file.
  static Status Create(const std::string& cert_file,
                       const std::string& key_file,
                       std::shared_ptr<const TlsContext>* out);
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  ~TlsContext();

  SSL_CTX* ctx() const { return ctx_; }

 private:
  explicit TlsContext(SSL_CTX* ctx) : ctx_(ctx) {}
  SSL_CTX* ctx_;
};

// The server side of one TLS connection. Ciphertext from the peer goes in
// with FeedCiphertext(); Read() returns plaintext; Write() encrypts;
// TakeOutput() hands back the ciphertext (handshake, records, alerts) to
// send, in order. Memory: what was fed and not yet read, plus what was
// written and not yet taken.
class TlsSession {
 public:
  explicit TlsSession(const TlsContext& context);
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;
  ~TlsSession();

  void FeedCiphertext(const char* data, size_t length);

  enum class ReadResult { kData, kNeedMore, kClosed, kError };
  // Up to `capacity` plaintext bytes into `buffer` (*length set on kData).
  // kNeedMore: feed more ciphertext (the handshake may have produced
  // output meanwhile); kClosed: the peer sent close_notify; kError: a
  // protocol or handshake failure, see error().
  ReadResult Read(char* buffer, size_t capacity, size_t* length);

  // Encrypts all of `plaintext` (the handshake must be complete, which it
  // is once Read() returned data). False on failure, see error().
  bool Write(std::string_view plaintext);

  // Queues close_notify.
  void Shutdown();

  // Appends the ciphertext to send to *out and forgets it.
  void TakeOutput(std::string* out);
  bool HasOutput() const;

  // Why the last call failed (OpenSSL's reason), for the log.
  const std::string& error() const { return error_; }
  // After kError: the peer's first bytes were a plain HTTP request.
  bool peer_sent_plain_http() const { return plain_http_; }

 private:
  SSL* ssl_;
  std::string error_;
  bool plain_http_ = false;
};

}  // namespace tokenmeter::daemon::http

#endif  // TOKENMETER_DAEMON_HTTP_TLS_H_
