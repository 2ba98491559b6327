#include "daemon/http/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <spdlog/fmt/fmt.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tokenmeter::daemon::http {
namespace {

// OpenSSL's error queue as one line, emptied.
std::string TakeOpenSslErrors() {
  std::string text;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!text.empty()) text += "; ";
    text += buf;
  }
  return text.empty() ? "unknown OpenSSL error" : text;
}

// fopen first: "No such file or directory" is clearer than OpenSSL's code.
Status CheckReadable(const char* what, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return Status::Error(
        fmt::format("cannot read {} \"{}\": {}", what, path, strerror(errno)));
  }
  std::fclose(f);
  return Status::Ok();
}

}  // namespace

Status TlsContext::Create(const std::string& cert_file,
                          const std::string& key_file,
                          std::shared_ptr<const TlsContext>* out) {
  Status s = CheckReadable("cert_file", cert_file);
  if (!s.ok()) return s;
  s = CheckReadable("key_file", key_file);
  if (!s.ok()) return s;
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) {
    return Status::Error("TLS: " + TakeOpenSslErrors());
  }
  std::shared_ptr<const TlsContext> context(new TlsContext(ctx));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION |
                               SSL_OP_CIPHER_SERVER_PREFERENCE);
  // Responses are written whole; the memory BIO always takes them.
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1) {
    return Status::Error(fmt::format("cannot load cert_file \"{}\": {}",
                                     cert_file, TakeOpenSslErrors()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) !=
      1) {
    return Status::Error(fmt::format("cannot load key_file \"{}\": {}",
                                     key_file, TakeOpenSslErrors()));
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return Status::Error(
        fmt::format("key_file \"{}\" does not match cert_file \"{}\": {}",
                    key_file, cert_file, TakeOpenSslErrors()));
  }
  *out = std::move(context);
  return Status::Ok();
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

TlsSession::TlsSession(const TlsContext& context)
    : ssl_(SSL_new(context.ctx())) {
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  if (ssl_ == nullptr || in == nullptr || out == nullptr) {
    // Allocation failure of a few hundred bytes: treated like bad_alloc.
    std::abort();
  }
  // An empty input BIO means "want more", never EOF.
  BIO_set_mem_eof_return(in, -1);
  SSL_set_bio(ssl_, in, out);  // The session owns both BIOs.
  SSL_set_accept_state(ssl_);
}

TlsSession::~TlsSession() { SSL_free(ssl_); }

void TlsSession::FeedCiphertext(const char* data, size_t length) {
  BIO_write(SSL_get_rbio(ssl_), data, static_cast<int>(length));
}

TlsSession::ReadResult TlsSession::Read(char* buffer, size_t capacity,
                                        size_t* length) {
  ERR_clear_error();
  size_t n = 0;
  if (SSL_read_ex(ssl_, buffer, capacity, &n) == 1) {
    *length = n;
    return ReadResult::kData;
  }
  switch (SSL_get_error(ssl_, 0)) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
      return ReadResult::kNeedMore;
    case SSL_ERROR_ZERO_RETURN:
      return ReadResult::kClosed;
    default:
      plain_http_ = ERR_GET_REASON(ERR_peek_error()) == SSL_R_HTTP_REQUEST;
      error_ = TakeOpenSslErrors();
      return ReadResult::kError;
  }
}

bool TlsSession::Write(std::string_view plaintext) {
  while (!plaintext.empty()) {
    ERR_clear_error();
    size_t n = 0;
    if (SSL_write_ex(ssl_, plaintext.data(), plaintext.size(), &n) != 1) {
      error_ = TakeOpenSslErrors();
      return false;
    }
    plaintext.remove_prefix(n);
  }
  return true;
}

void TlsSession::Shutdown() {
  ERR_clear_error();
  SSL_shutdown(ssl_);
  ERR_clear_error();
}

void TlsSession::TakeOutput(std::string* out) {
  BIO* bio = SSL_get_wbio(ssl_);
  size_t pending = BIO_ctrl_pending(bio);
  if (pending == 0) return;
  size_t old = out->size();
  out->resize(old + pending);
  int n = BIO_read(bio, out->data() + old, static_cast<int>(pending));
  out->resize(old + (n > 0 ? static_cast<size_t>(n) : 0));
}

bool TlsSession::HasOutput() const {
  return BIO_ctrl_pending(SSL_get_wbio(ssl_)) > 0;
}

}  // namespace tokenmeter::daemon::http
