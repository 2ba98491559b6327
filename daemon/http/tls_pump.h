// The TLS pump of an HTTP connection: what goes between the socket (libuv
// does every read and write) and a TlsSession's memory BIOs. Reading is
// Server::Connection::PumpTls() (tls_pump.cpp): ciphertext fed in, plaintext
// parsed, then what the session produced (handshake, session tickets,
// alerts) sent with WriteCiphertext(); a response goes out sealed by
// SealResponse(). Internal to daemon/http.
//
// Threads: the loop's thread only. Cost: one copy of the ciphertext per
// write, and the encryption itself.
#ifndef TOKENMETER_DAEMON_HTTP_TLS_PUMP_H_
#define TOKENMETER_DAEMON_HTTP_TLS_PUMP_H_

#include <uv.h>

#include <string>
#include <string_view>

#include "daemon/http/tls.h"

namespace tokenmeter::daemon::http {

// Called once per WriteCiphertext() that returned 0, from the write
// callback: status < 0 when the write failed or was cancelled by closing
// the stream (libuv runs it before the stream's close callback, so `owner`
// is still alive if the stream's owner frees itself in that callback).
using CiphertextWritten = void (*)(void* owner, int status);

// Writes `ciphertext` on `stream` with a write request of its own, which
// owns the bytes and is freed in its callback; `written(owner, status)`
// then runs. Returns 0, or uv_write()'s error (nothing was queued and
// `written` will not run).
[[nodiscard]] int WriteCiphertext(uv_stream_t* stream, std::string ciphertext,
                                  void* owner, CiphertextWritten written);

// A response as one ciphertext buffer: appends to *out whatever the session
// still had to send, then `head` and `body` as records, then close_notify
// when `close_after`. False when encrypting failed (session.error() says
// why); *out is then incomplete.
[[nodiscard]] bool SealResponse(TlsSession& session, std::string_view head,
                                std::string_view body, bool close_after,
                                std::string* out);

}  // namespace tokenmeter::daemon::http

#endif  // TOKENMETER_DAEMON_HTTP_TLS_PUMP_H_
