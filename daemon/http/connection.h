// One connection of the HTTP server (server.h): its llhttp callbacks,
// routing, responses (gzip, HEAD), timers and lingering close; the TLS
// pump is in tls_pump.{h,cpp}. Internal to daemon/http: only server.cpp,
// connection.cpp and tls_pump.cpp include it.
//
// Threads: the loop's thread only. Ownership: the server owns each
// Connection (Server::connection_list_); a Connection owns its uv_tcp_t and
// uv_timer_t and is freed through Server::OnConnectionClosed() once both
// close callbacks have run.
#ifndef TOKENMETER_DAEMON_HTTP_CONNECTION_H_
#define TOKENMETER_DAEMON_HTTP_CONNECTION_H_

#include <llhttp.h>
#include <uv.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <string_view>

#include "daemon/http/basic_auth.h"
#include "daemon/http/server.h"
#include "daemon/http/tls.h"

struct sockaddr;

namespace tokenmeter::daemon::http {

// The size of the read buffer a server shares among its connections.
inline constexpr size_t kReadBufferBytes = 64 * 1024;

// "message (NAME)" for a libuv error code, for log lines.
std::string UvError(int err);
// "1.2.3.4:80", "[::1]:80", or "unknown address" for another family.
std::string FormatAddress(const struct sockaddr* sa);

// A request target split at '?': views into the URL.
struct Target {
  std::string_view path;
  std::string_view query;
};

// One accepted connection. Owns its uv_tcp_t and uv_timer_t; it is freed
// (through Server::OnConnectionClosed) when the second close callback runs.
class Server::Connection {
 public:
  explicit Connection(Server* server);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Takes the accepted socket fd (closed on failure) and starts reading.
  void Start(int fd);
  // Closes both handles (idempotent); the object is freed later.
  void Close();

  std::list<std::unique_ptr<Connection>>::iterator self;

 private:
  // kVerifying: a request waits for its password check on the thread pool
  // (BasicAuthVerifier); nothing is read meanwhile, no timer runs.
  enum class State { kReading, kVerifying, kWriting, kLingering, kClosing };
  enum class TimerKind { kHeader, kIdle, kWrite, kLinger };
  enum class Capture { kNone, kAccept, kAcceptEncoding, kAuthorization };
  // A request's framing or headers that the parser accepts and we refuse.
  enum class Refusal { kNone, kMissingHost, kRepeatedHost };

  static const llhttp_settings_t* Settings();
  static Connection* From(llhttp_t* parser) {
    return static_cast<Connection*>(parser->data);
  }

  static void OnAlloc(uv_handle_t* handle, size_t suggested, uv_buf_t* buf);
  static void OnRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf);
  static void OnWrite(uv_write_t* req, int status);
  static void OnShutdown(uv_shutdown_t* req, int status);
  static void OnTimer(uv_timer_t* timer);
  static void OnClose(uv_handle_t* handle);

  static int OnMessageBegin(llhttp_t* parser);
  static int OnUrl(llhttp_t* parser, const char* at, size_t length);
  static int OnHeaderField(llhttp_t* parser, const char* at, size_t length);
  static int OnHeaderFieldComplete(llhttp_t* parser);
  static int OnHeaderValue(llhttp_t* parser, const char* at, size_t length);
  static int OnHeaderValueComplete(llhttp_t* parser);
  static int OnHeadersComplete(llhttp_t* parser);
  static int OnBody(llhttp_t* parser, const char* at, size_t length);
  static int OnMessageComplete(llhttp_t* parser);

  uv_stream_t* stream() { return reinterpret_cast<uv_stream_t*>(&tcp_); }
  const ServerOptions& options() const { return server_->options_; }

  void StartReading();
  void Feed(const char* data, size_t length);
  // TLS (tls_pump.cpp): decrypts what the session holds and feeds it
  // while reading, then sends what the session produced (handshake,
  // tickets, alerts).
  void PumpTls();
  void FlushTlsOutput();
  static void OnTlsWrite(void* connection, int status);
  // 0 when the current request may reach its handler, else 404 or 405.
  int RouteCheck(Target target, const Handler** handler) const;
  // Checks the credentials (at once, or on the pool: kVerifying), then
  // Dispatch()es.
  void HandleRequest();
  void OnVerified(BasicAuthVerifier::Result result);
  // Answers the parsed request: `auth` is kAllowed without basic auth.
  void Dispatch(BasicAuthVerifier::Result auth);
  void AfterResponse();
  void Respond(Response& response, bool head, bool close_after);
  void SendErrorAndClose(int status);
  void BeginLingeringClose();
  void ArmTimer(TimerKind kind, uint64_t ns);  // 0: stop the timer
  bool AddHeaderBytes(size_t n);
  void ResetRequest();

  Server* server_;
  uv_tcp_t tcp_{};
  uv_timer_t timer_{};
  uv_write_t write_req_{};
  uv_shutdown_t shutdown_req_{};
  int open_handles_ = 0;
  State state_ = State::kReading;
  TimerKind timer_kind_ = TimerKind::kHeader;
  std::string peer_;
  llhttp_t parser_{};

  // The request being parsed; each capped by max_header_bytes.
  std::string url_;
  std::string header_field_;
  std::string accept_;
  std::string accept_encoding_;
  std::string authorization_;
  Capture capture_ = Capture::kNone;
  size_t header_bytes_ = 0;
  uint64_t body_bytes_ = 0;
  int error_status_ = 0;  // 400, 431 or 413, set by a parser callback.
  Refusal refusal_ = Refusal::kNone;  // Why error_status_ is 400.
  int host_headers_ = 0;
  bool message_in_progress_ = false;
  bool upgrade_ = false;
  bool keep_alive_ = false;
  bool http10_ = false;

  // Bytes read after a complete request and not yet parsed (a pipelined
  // request): at most one read buffer.
  std::string pending_;
  // The response being written.
  std::string out_head_;
  std::string out_body_;
  bool close_after_write_ = false;
  size_t lingered_bytes_ = 0;
  std::unique_ptr<TlsSession> tls_;  // Null: plain HTTP.
  // The password check in progress (kVerifying), abandoned by Close().
  BasicAuthVerifier::Job* auth_job_ = nullptr;
};

}  // namespace tokenmeter::daemon::http

#endif  // TOKENMETER_DAEMON_HTTP_CONNECTION_H_
