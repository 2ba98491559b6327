#include "daemon/http/tls_pump.h"

#include <spdlog/spdlog.h>

#include <memory>
#include <utility>

#include "daemon/http/connection.h"

namespace tokenmeter::daemon::http {
namespace {

// Ciphertext sent outside a response (handshake, session tickets); freed in
// its callback, which libuv runs before the handle's close callback.
struct CiphertextWrite {
  uv_write_t req{};
  std::string data;
  void* owner = nullptr;
  CiphertextWritten written = nullptr;
};

void OnCiphertextWritten(uv_write_t* req, int status) {
  std::unique_ptr<CiphertextWrite> w(static_cast<CiphertextWrite*>(req->data));
  w->written(w->owner, status);
}

}  // namespace

int WriteCiphertext(uv_stream_t* stream, std::string ciphertext, void* owner,
                    CiphertextWritten written) {
  auto w = std::make_unique<CiphertextWrite>();
  w->data = std::move(ciphertext);
  w->owner = owner;
  w->written = written;
  w->req.data = w.get();
  uv_buf_t buf =
      uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
  int rc = uv_write(&w->req, stream, &buf, 1, &OnCiphertextWritten);
  if (rc != 0) return rc;
  (void)w.release();  // Freed in OnCiphertextWritten.
  return 0;
}

bool SealResponse(TlsSession& session, std::string_view head,
                  std::string_view body, bool close_after, std::string* out) {
  session.TakeOutput(out);
  if (!session.Write(head) || !session.Write(body)) return false;
  if (close_after) session.Shutdown();
  session.TakeOutput(out);
  return true;
}

void Server::Connection::PumpTls() {
  // The shared read buffer is free again: the ciphertext was copied into
  // the session.
  char* plain = server_->read_buffer_.get();
  while (state_ == State::kReading) {
    size_t n = 0;
    TlsSession::ReadResult r = tls_->Read(plain, kReadBufferBytes, &n);
    if (r == TlsSession::ReadResult::kData) {
      server_->tls_failing_ = false;
      Feed(plain, n);
      continue;
    }
    if (r == TlsSession::ReadResult::kNeedMore) break;
    if (r == TlsSession::ReadResult::kError) {
      server_->protocol_errors_.fetch_add(1, std::memory_order_relaxed);
      if (!server_->tls_failing_) {
        spdlog::warn(
            "HTTP: {}: TLS failed ({}); closing (said once until a "
            "handshake succeeds)",
            peer_, tls_->error());
      }
      server_->tls_failing_ = true;
      if (tls_->peer_sent_plain_http()) {
        // As Go's servers do: say so in plain text, so that curl http://
        // shows why instead of an empty reply.
        tls_.reset();
        Response response;
        response.status = 400;
        response.body = "Client sent an HTTP request to an HTTPS server.\n";
        Respond(response, /*head=*/false, /*close_after=*/true);
        return;
      }
    }
    Close();  // kClosed (close_notify) or kError.
    return;
  }
  if (state_ == State::kReading) FlushTlsOutput();
}

void Server::Connection::FlushTlsOutput() {
  if (!tls_->HasOutput()) return;
  std::string ciphertext;
  tls_->TakeOutput(&ciphertext);
  int rc = WriteCiphertext(stream(), std::move(ciphertext), this,
                           &Connection::OnTlsWrite);
  if (rc != 0) {
    spdlog::debug("HTTP: {}: write failed: {}", peer_, UvError(rc));
    Close();
  }
}

void Server::Connection::OnTlsWrite(void* connection, int status) {
  auto* c = static_cast<Connection*>(connection);
  if (status < 0 && c->state_ != State::kClosing) c->Close();
}

}  // namespace tokenmeter::daemon::http
