#include "daemon/http/server.h"

#include <fcntl.h>
#include <llhttp.h>
#include <netdb.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>

#include "daemon/base/ascii.h"
#include "daemon/base/state_io.h"
#include "daemon/http/basic_auth.h"
#include "daemon/http/listen_address.h"
#include "daemon/http/negotiation.h"
#include "daemon/http/tls.h"
#include "daemon/net/acceptor.h"

namespace tokenmeter::daemon::http {
namespace {

constexpr size_t kReadBufferBytes = 64 * 1024;
constexpr int kListenBacklog = 511;
// Connections accepted per readable event of one listener, so that a flood
// of connects cannot keep the loop from the rest of its work.
constexpr int kAcceptsPerWakeup = 64;
// Out of file descriptors with no spare to give back: how long the
// listeners pause before trying again.
constexpr uint64_t kFdRetryMs = 100;
// After the last response: how long, and how much, to keep reading and
// discarding what the peer still sends before closing.
constexpr uint64_t kLingerNs = 2'000'000'000;
constexpr size_t kLingerMaxBytes = 1024 * 1024;
// Header names longer than this cannot be one we look at; only their
// length is counted.
constexpr size_t kMaxInterestingHeaderName = 32;
// Compression runs on the loop thread: favour speed (metrics text still
// shrinks about tenfold).
constexpr int kGzipLevel = 1;

std::string_view ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 301:
      return "Moved Permanently";
    case 302:
      return "Found";
    case 304:
      return "Not Modified";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

// Header text from a handler must not be able to split the response.
bool IsSafeHeaderText(std::string_view s) {
  return s.find_first_of(std::string_view("\r\n\0", 3)) ==
         std::string_view::npos;
}

std::string UvError(int err) {
  return fmt::format("{} ({})", uv_strerror(err), uv_err_name(err));
}

std::string FormatAddress(const struct sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const struct sockaddr_in*>(sa);
    uv_ip4_name(in, host, sizeof(host));
    return fmt::format("{}:{}", host, ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const struct sockaddr_in6*>(sa);
    uv_ip6_name(in6, host, sizeof(host));
    return fmt::format("[{}]:{}", host, ntohs(in6->sin6_port));
  }
  return "unknown address";
}

std::string PeerName(const uv_tcp_t* tcp) {
  struct sockaddr_storage ss = {};
  int len = sizeof(ss);
  if (uv_tcp_getpeername(tcp, reinterpret_cast<struct sockaddr*>(&ss), &len) !=
      0) {
    return "unknown peer";
  }
  return FormatAddress(reinterpret_cast<struct sockaddr*>(&ss));
}

// gzip (deflate with the gzip wrapper) of `in` into `out`; false on failure,
// in which case the caller sends the body uncompressed.
bool GzipCompress(std::string_view in, std::string* out) {
  if (in.size() > UINT_MAX / 2) return false;
  z_stream zs = {};
  if (deflateInit2(&zs, kGzipLevel, Z_DEFLATED, 15 + 16, 8,
                   Z_DEFAULT_STRATEGY) != Z_OK) {
    return false;
  }
  // deflateBound covers the gzip header and trailer for this stream.
  out->resize(deflateBound(&zs, static_cast<uLong>(in.size())));
  zs.next_in =
      reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));  // zlib API
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out->data());
  zs.avail_out = static_cast<uInt>(out->size());
  int rc = deflate(&zs, Z_FINISH);
  uLong produced = zs.total_out;
  deflateEnd(&zs);
  if (rc != Z_STREAM_END) return false;
  out->resize(produced);
  return true;
}

struct Target {
  std::string_view path;
  std::string_view query;
};

// Splits an origin-form ("/p?q") or absolute-form ("http://h/p?q") request
// target into path and query.
Target SplitTarget(std::string_view url) {
  std::string_view rest = url;
  for (std::string_view scheme : {"http://", "https://"}) {
    if (StartsWithIgnoreCase(rest, scheme)) {
      rest.remove_prefix(scheme.size());
      size_t path_start = rest.find_first_of("/?");
      rest = path_start == std::string_view::npos ? std::string_view()
                                                  : rest.substr(path_start);
      if (rest.empty() || rest[0] == '?') {
        Target t{"/", rest.empty() ? rest : rest.substr(1)};
        return t;
      }
      break;
    }
  }
  size_t q = rest.find('?');
  if (q == std::string_view::npos) return Target{rest, {}};
  return Target{rest.substr(0, q), rest.substr(q + 1)};
}

}  // namespace

namespace {

std::string PeerNameOf(int fd) {
  struct sockaddr_storage ss = {};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<struct sockaddr*>(&ss), &len) != 0) {
    return "unknown peer";
  }
  return FormatAddress(reinterpret_cast<struct sockaddr*>(&ss));
}

}  // namespace

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
  enum class State { kReading, kWriting, kLingering, kClosing };
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
  // TLS: decrypts what the session holds and feeds it while reading, then
  // sends what the session produced (handshake, tickets, alerts).
  void PumpTls();
  void FlushTlsOutput();
  static void OnTlsWrite(uv_write_t* req, int status);
  // 0 when the current request may reach its handler, else 404 or 405.
  int RouteCheck(Target target, const Handler** handler) const;
  void HandleRequest();
  void AfterResponse();
  void Respond(Response& response, bool head, bool close_after);
  void SendErrorAndClose(int status);
  void BeginLingeringClose();
  void ArmTimer(TimerKind kind, uint64_t ns);  // 0: stop the timer
  bool AddHeaderBytes(size_t n);
  void ResetRequest();

  Server* server_;
  uv_tcp_t tcp_;
  uv_timer_t timer_;
  uv_write_t write_req_;
  uv_shutdown_t shutdown_req_;
  int open_handles_ = 0;
  State state_ = State::kReading;
  TimerKind timer_kind_ = TimerKind::kHeader;
  std::string peer_;
  llhttp_t parser_;

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
};

namespace {

// Ciphertext sent outside a response (handshake, session tickets); freed in
// its callback, which libuv runs before the handle's close callback.
struct TlsWrite {
  uv_write_t req{};
  std::string data;
};

}  // namespace

const llhttp_settings_t* Server::Connection::Settings() {
  static const llhttp_settings_t settings = [] {
    llhttp_settings_t s;
    llhttp_settings_init(&s);
    s.on_message_begin = &Connection::OnMessageBegin;
    s.on_url = &Connection::OnUrl;
    s.on_header_field = &Connection::OnHeaderField;
    s.on_header_field_complete = &Connection::OnHeaderFieldComplete;
    s.on_header_value = &Connection::OnHeaderValue;
    s.on_header_value_complete = &Connection::OnHeaderValueComplete;
    s.on_headers_complete = &Connection::OnHeadersComplete;
    s.on_body = &Connection::OnBody;
    s.on_message_complete = &Connection::OnMessageComplete;
    return s;
  }();
  return &settings;
}

Server::Connection::Connection(Server* server) : server_(server) {
  if (uv_tcp_init(server_->loop_, &tcp_) != 0 ||
      uv_timer_init(server_->loop_, &timer_) != 0) {
    spdlog::critical("HTTP: cannot initialize a connection handle");
    std::abort();
  }
  open_handles_ = 2;
  tcp_.data = this;
  timer_.data = this;
  write_req_.data = this;
  shutdown_req_.data = this;
  llhttp_init(&parser_, HTTP_REQUEST, Settings());
  parser_.data = this;
}

void Server::Connection::Start(int fd) {
  int rc = uv_tcp_open(&tcp_, fd);
  if (rc != 0) {
    spdlog::warn("HTTP: cannot use an accepted connection: {}", UvError(rc));
    close(fd);
    Close();
    return;
  }
  peer_ = PeerName(&tcp_);
  uv_tcp_nodelay(&tcp_, 1);
  if (options().tls) tls_ = std::make_unique<TlsSession>(*options().tls);
  ArmTimer(TimerKind::kHeader, options().header_timeout_ns);
  StartReading();
}

void Server::Connection::Close() {
  if (state_ == State::kClosing) return;
  state_ = State::kClosing;
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), &Connection::OnClose);
  uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), &Connection::OnClose);
}

void Server::Connection::OnClose(uv_handle_t* handle) {
  auto* c = static_cast<Connection*>(handle->data);
  if (--c->open_handles_ == 0) c->server_->OnConnectionClosed(c);
}

void Server::Connection::StartReading() {
  int rc = uv_read_start(stream(), &Connection::OnAlloc, &Connection::OnRead);
  if (rc != 0) {
    spdlog::debug("HTTP: {}: cannot read: {}", peer_, UvError(rc));
    Close();
  }
}

void Server::Connection::OnAlloc(uv_handle_t* handle, size_t /*suggested*/,
                                 uv_buf_t* buf) {
  auto* c = static_cast<Connection*>(handle->data);
  *buf = uv_buf_init(c->server_->read_buffer_.get(), kReadBufferBytes);
}

void Server::Connection::OnRead(uv_stream_t* stream, ssize_t nread,
                                const uv_buf_t* buf) {
  auto* c = static_cast<Connection*>(stream->data);
  if (c->state_ == State::kClosing || nread == 0) return;
  if (c->state_ == State::kLingering) {
    c->lingered_bytes_ += nread > 0 ? static_cast<size_t>(nread) : 0;
    if (nread < 0 || c->lingered_bytes_ > kLingerMaxBytes) c->Close();
    return;
  }
  if (nread < 0) {
    if (nread != UV_EOF) {
      spdlog::debug("HTTP: {}: read failed: {}", c->peer_,
                    UvError(static_cast<int>(nread)));
    }
    c->Close();
    return;
  }
  if (c->state_ != State::kReading) return;  // Reading is stopped; unreachable.
  if (c->tls_) {
    c->tls_->FeedCiphertext(buf->base, static_cast<size_t>(nread));
    c->PumpTls();
    return;
  }
  c->Feed(buf->base, static_cast<size_t>(nread));
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
  auto* w = new TlsWrite;
  tls_->TakeOutput(&w->data);
  w->req.data = this;
  uv_buf_t buf =
      uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
  int rc = uv_write(&w->req, stream(), &buf, 1, &Connection::OnTlsWrite);
  if (rc != 0) {
    delete w;
    spdlog::debug("HTTP: {}: write failed: {}", peer_, UvError(rc));
    Close();
  }
}

void Server::Connection::OnTlsWrite(uv_write_t* req, int status) {
  auto* w = reinterpret_cast<TlsWrite*>(req);
  auto* c = static_cast<Connection*>(req->data);
  delete w;
  if (status < 0 && c->state_ != State::kClosing) c->Close();
}

void Server::Connection::Feed(const char* data, size_t length) {
  llhttp_errno_t err = llhttp_execute(&parser_, data, length);
  if (err == HPE_OK) return;
  if (err == HPE_PAUSED) {
    // OnMessageComplete paused right after the request; what follows is
    // the next pipelined request, parsed once this one is answered.
    const char* pos = llhttp_get_error_pos(&parser_);
    pending_.assign(pos, static_cast<size_t>(data + length - pos));
    HandleRequest();
    return;
  }
  if (err == HPE_PAUSED_UPGRADE) {
    // Only reachable by resuming past an upgrade request, which always
    // closes the connection.
    Close();
    return;
  }
  server_->protocol_errors_.fetch_add(1, std::memory_order_relaxed);
  int status = error_status_ != 0 ? error_status_ : 400;
  if (status == 431) {
    spdlog::warn(
        "HTTP: {}: request headers over {} bytes; answering 431 "
        "and closing",
        peer_, options().max_header_bytes);
  } else if (status == 413) {
    spdlog::warn("HTTP: {}: request body over {} bytes; closing", peer_,
                 options().max_body_bytes);
  } else if (refusal_ != Refusal::kNone) {
    spdlog::warn("HTTP: {}: {}; answering 400 and closing", peer_,
                 refusal_ == Refusal::kMissingHost
                     ? "HTTP/1.1 request without Host"
                     : "request with more than one Host");
  } else {
    spdlog::warn(
        "HTTP: {}: malformed request ({}: {}); answering 400 and "
        "closing",
        peer_, llhttp_errno_name(err),
        llhttp_get_error_reason(&parser_) != nullptr
            ? llhttp_get_error_reason(&parser_)
            : "");
  }
  SendErrorAndClose(status);
}

int Server::Connection::RouteCheck(Target target,
                                   const Handler** handler) const {
  auto it = server_->routes_.find(target.path);
  if (it == server_->routes_.end()) return 404;
  if (parser_.method != HTTP_GET && parser_.method != HTTP_HEAD) return 405;
  *handler = &it->second;
  return 0;
}

void Server::Connection::HandleRequest() {
  server_->requests_served_.fetch_add(1, std::memory_order_relaxed);
  auto method = static_cast<llhttp_method_t>(parser_.method);
  bool head = method == HTTP_HEAD;
  Target target = SplitTarget(url_);
  const Handler* handler = nullptr;
  int route_status = RouteCheck(target, &handler);
  Response response;
  if (options().basic_auth && !options().basic_auth->Check(authorization_)) {
    // Every path, as exporter-toolkit does: a 404 would tell what exists.
    if (!server_->auth_failing_) {
      spdlog::warn(
          "HTTP: {}: missing or wrong credentials; answering 401 "
          "(said once until a request passes)",
          peer_);
    }
    server_->auth_failing_ = true;
    route_status = 401;
    response.status = 401;
    response.body = "401 Unauthorized\n";
    response.headers.emplace_back("WWW-Authenticate",
                                  "Basic realm=\"tokenmeterd\"");
  } else if (options().basic_auth) {
    server_->auth_failing_ = false;
  }
  if (route_status == 401) {
    // Answered above.
  } else if (route_status == 404) {
    response.status = 404;
    response.body = "404 page not found\n";
  } else if (route_status == 405) {
    response.status = 405;
    response.body = "405 method not allowed\n";
    response.headers.emplace_back("Allow", "GET, HEAD");
  } else {
    Request request{llhttp_method_name(method), target.path, target.query,
                    accept_, accept_encoding_};
    try {
      (*handler)(request, response);
    } catch (const std::exception& e) {
      spdlog::error("HTTP: handler for {} failed: {}", target.path, e.what());
      response = Response();
      response.status = 500;
      response.body = "500 internal server error\n";
    } catch (...) {
      spdlog::error("HTTP: handler for {} failed", target.path);
      response = Response();
      response.status = 500;
      response.body = "500 internal server error\n";
    }
  }
  Respond(response, head, !keep_alive_ || server_->closing_);
}

void Server::Connection::SendErrorAndClose(int status) {
  Response response;
  response.status = status;
  bool head = false;
  if (status == 413) {
    // The request line and headers are complete: a wrong path or method is
    // the more useful answer.
    const Handler* handler = nullptr;
    int route_status = RouteCheck(SplitTarget(url_), &handler);
    if (route_status != 0) response.status = route_status;
    if (route_status == 405)
      response.headers.emplace_back("Allow", "GET, HEAD");
    head = parser_.method == HTTP_HEAD;
  }
  response.body =
      fmt::format("{} {}\n", response.status, ReasonPhrase(response.status));
  Respond(response, head, /*close_after=*/true);
}

void Server::Connection::Respond(Response& response, bool head,
                                 bool close_after) {
  if (state_ == State::kClosing) return;  // The handler closed the server.
  bool gzip = false;
  if (response.compressible &&
      response.body.size() >= options().gzip_min_bytes &&
      AcceptsGzip(accept_encoding_)) {
    std::string compressed;
    if (GzipCompress(response.body, &compressed)) {
      response.body.swap(compressed);
      gzip = true;
    }
  }
  int status = response.status;
  if (status < 100 || status > 999) status = 500;
  server_->responses_[ResponseSlot(status)].fetch_add(
      1, std::memory_order_relaxed);
  out_head_.clear();
  out_head_ += fmt::format("HTTP/1.1 {} {}\r\n", status, ReasonPhrase(status));
  if (!response.content_type.empty() &&
      IsSafeHeaderText(response.content_type)) {
    out_head_ += fmt::format("Content-Type: {}\r\n", response.content_type);
  }
  out_head_ += fmt::format("Content-Length: {}\r\n", response.body.size());
  if (gzip) out_head_ += "Content-Encoding: gzip\r\n";
  if (response.compressible) out_head_ += "Vary: Accept-Encoding\r\n";
  for (const auto& [name, value] : response.headers) {
    if (name.empty() || !IsSafeHeaderText(name) || !IsSafeHeaderText(value) ||
        EqualsIgnoreCase(name, "Content-Length") ||
        EqualsIgnoreCase(name, "Transfer-Encoding") ||
        EqualsIgnoreCase(name, "Connection")) {
      continue;
    }
    out_head_ += fmt::format("{}: {}\r\n", name, value);
  }
  if (close_after) {
    out_head_ += "Connection: close\r\n";
  } else if (http10_) {
    out_head_ += "Connection: keep-alive\r\n";
  }
  out_head_ += "\r\n";
  if (head) {
    out_body_.clear();
  } else {
    out_body_ = std::move(response.body);
  }
  close_after_write_ = close_after;
  if (tls_) {
    // One ciphertext buffer: whatever the session still had to send, then
    // the response's records (and close_notify when closing).
    std::string cipher;
    tls_->TakeOutput(&cipher);
    if (!tls_->Write(out_head_) || !tls_->Write(out_body_)) {
      spdlog::debug("HTTP: {}: TLS write failed: {}", peer_, tls_->error());
      Close();
      return;
    }
    if (close_after) tls_->Shutdown();
    tls_->TakeOutput(&cipher);
    out_head_.swap(cipher);
    out_body_.clear();
  }

  // No reading while the response is out: a client that pipelines without
  // reading answers cannot make the server buffer without bound.
  uv_read_stop(stream());
  state_ = State::kWriting;
  ArmTimer(TimerKind::kWrite, options().idle_timeout_ns);
  uv_buf_t bufs[2] = {
      uv_buf_init(out_head_.data(), static_cast<unsigned>(out_head_.size())),
      uv_buf_init(out_body_.data(), static_cast<unsigned>(out_body_.size())),
  };
  int rc = uv_write(&write_req_, stream(), bufs, out_body_.empty() ? 1 : 2,
                    &Connection::OnWrite);
  if (rc != 0) {
    spdlog::debug("HTTP: {}: write failed: {}", peer_, UvError(rc));
    Close();
  }
}

void Server::Connection::OnWrite(uv_write_t* req, int status) {
  auto* c = static_cast<Connection*>(req->data);
  if (c->state_ == State::kClosing) return;  // Cancelled by Close().
  std::string().swap(c->out_body_);  // Large bodies are not kept around.
  if (c->tls_) std::string().swap(c->out_head_);  // The ciphertext.
  if (status < 0) {
    spdlog::debug("HTTP: {}: write failed: {}", c->peer_, UvError(status));
    c->Close();
    return;
  }
  if (c->close_after_write_) {
    c->BeginLingeringClose();
  } else {
    c->AfterResponse();
  }
}

void Server::Connection::AfterResponse() {
  llhttp_resume(&parser_);
  state_ = State::kReading;
  uv_timer_stop(&timer_);
  if (!pending_.empty()) {
    std::string pending;
    pending.swap(pending_);
    Feed(pending.data(), pending.size());
    if (state_ != State::kReading) return;  // Answering the next request.
  }
  if (tls_) {
    PumpTls();  // Records that arrived with the previous request.
    if (state_ != State::kReading) return;
  }
  // OnMessageBegin armed the header timer if part of a request is here.
  if (!message_in_progress_) {
    ArmTimer(TimerKind::kIdle, options().idle_timeout_ns);
  }
  StartReading();
}

void Server::Connection::BeginLingeringClose() {
  state_ = State::kLingering;
  int rc = uv_shutdown(&shutdown_req_, stream(), &Connection::OnShutdown);
  if (rc != 0) {
    Close();
    return;
  }
  ArmTimer(TimerKind::kLinger, kLingerNs);
  StartReading();
}

void Server::Connection::OnShutdown(uv_shutdown_t* req, int status) {
  auto* c = static_cast<Connection*>(req->data);
  if (c->state_ == State::kClosing) return;
  if (status < 0) c->Close();
  // Otherwise keep discarding input until EOF or the linger timer.
}

void Server::Connection::ArmTimer(TimerKind kind, uint64_t ns) {
  timer_kind_ = kind;
  if (ns == 0) {
    uv_timer_stop(&timer_);
    return;
  }
  // libuv counts milliseconds: round up, so that a timeout never fires early.
  uv_timer_start(&timer_, &Connection::OnTimer, (ns + 999'999) / 1'000'000, 0);
}

void Server::Connection::OnTimer(uv_timer_t* timer) {
  auto* c = static_cast<Connection*>(timer->data);
  if (c->state_ == State::kClosing) return;
  switch (c->timer_kind_) {
    case TimerKind::kHeader:
      if (c->state_ != State::kReading) return;
      if (c->message_in_progress_) {
        c->server_->protocol_errors_.fetch_add(1, std::memory_order_relaxed);
        spdlog::warn(
            "HTTP: {}: request not complete within {} ms; "
            "answering 408 and closing",
            c->peer_, c->options().header_timeout_ns / 1'000'000);
        c->SendErrorAndClose(408);
      } else {
        spdlog::debug("HTTP: {}: no request within {} ms; closing", c->peer_,
                      c->options().header_timeout_ns / 1'000'000);
        c->Close();
      }
      return;
    case TimerKind::kIdle:
      spdlog::debug("HTTP: {}: idle for {} ms; closing", c->peer_,
                    c->options().idle_timeout_ns / 1'000'000);
      c->Close();
      return;
    case TimerKind::kWrite:
      spdlog::warn("HTTP: {}: response not taken within {} ms; closing",
                   c->peer_, c->options().idle_timeout_ns / 1'000'000);
      c->Close();
      return;
    case TimerKind::kLinger:
      c->Close();
      return;
  }
}

void Server::Connection::ResetRequest() {
  url_.clear();
  header_field_.clear();
  accept_.clear();
  accept_encoding_.clear();
  authorization_.clear();
  capture_ = Capture::kNone;
  header_bytes_ = 0;
  body_bytes_ = 0;
  error_status_ = 0;
  refusal_ = Refusal::kNone;
  host_headers_ = 0;
  upgrade_ = false;
  keep_alive_ = false;
  http10_ = false;
}

bool Server::Connection::AddHeaderBytes(size_t n) {
  header_bytes_ += n;
  if (header_bytes_ <= options().max_header_bytes) return true;
  error_status_ = 431;
  return false;
}

int Server::Connection::OnMessageBegin(llhttp_t* parser) {
  Connection* c = From(parser);
  c->ResetRequest();
  c->message_in_progress_ = true;
  c->ArmTimer(TimerKind::kHeader, c->options().header_timeout_ns);
  return 0;
}

int Server::Connection::OnUrl(llhttp_t* parser, const char* at, size_t length) {
  Connection* c = From(parser);
  if (!c->AddHeaderBytes(length)) return -1;
  c->url_.append(at, length);
  return 0;
}

int Server::Connection::OnHeaderField(llhttp_t* parser, const char* at,
                                      size_t length) {
  Connection* c = From(parser);
  if (!c->AddHeaderBytes(length)) return -1;
  size_t room =
      kMaxInterestingHeaderName + 1 -
      std::min(c->header_field_.size(), kMaxInterestingHeaderName + 1);
  c->header_field_.append(at, std::min(length, room));
  return 0;
}

int Server::Connection::OnHeaderFieldComplete(llhttp_t* parser) {
  Connection* c = From(parser);
  // ": " and CRLF of the line.
  if (!c->AddHeaderBytes(4)) return -1;
  std::string* target = nullptr;
  if (EqualsIgnoreCase(c->header_field_, "accept")) {
    c->capture_ = Capture::kAccept;
    target = &c->accept_;
  } else if (EqualsIgnoreCase(c->header_field_, "accept-encoding")) {
    c->capture_ = Capture::kAcceptEncoding;
    target = &c->accept_encoding_;
  } else if (EqualsIgnoreCase(c->header_field_, "authorization")) {
    // Only the first: "user:pass, user2:pass2" is no credential.
    c->capture_ =
        c->authorization_.empty() ? Capture::kAuthorization : Capture::kNone;
    if (c->capture_ == Capture::kNone) c->authorization_ = "invalid";
  } else {
    c->capture_ = Capture::kNone;
    if (EqualsIgnoreCase(c->header_field_, "host")) ++c->host_headers_;
  }
  // A repeated header is the same as one joined by commas (RFC 9110 5.3).
  if (target != nullptr && !target->empty()) target->append(", ");
  c->header_field_.clear();
  return 0;
}

int Server::Connection::OnHeaderValue(llhttp_t* parser, const char* at,
                                      size_t length) {
  Connection* c = From(parser);
  if (!c->AddHeaderBytes(length)) return -1;
  if (c->capture_ == Capture::kAccept) {
    c->accept_.append(at, length);
  } else if (c->capture_ == Capture::kAcceptEncoding) {
    c->accept_encoding_.append(at, length);
  } else if (c->capture_ == Capture::kAuthorization) {
    c->authorization_.append(at, length);
  }
  return 0;
}

int Server::Connection::OnHeaderValueComplete(llhttp_t* parser) {
  From(parser)->capture_ = Capture::kNone;
  return 0;
}

int Server::Connection::OnHeadersComplete(llhttp_t* parser) {
  Connection* c = From(parser);
  c->upgrade_ = parser->upgrade != 0;
  // RFC 9112 3.2: 400 for an HTTP/1.1 request without Host, and for any
  // request with more than one.
  const bool http11 = parser->http_major == 1 && parser->http_minor == 1;
  if (c->host_headers_ > 1 || (http11 && c->host_headers_ == 0)) {
    c->refusal_ =
        c->host_headers_ > 1 ? Refusal::kRepeatedHost : Refusal::kMissingHost;
    c->error_status_ = 400;
    return -1;
  }
  if ((parser->flags & F_CONTENT_LENGTH) != 0 &&
      parser->content_length > c->options().max_body_bytes) {
    c->error_status_ = 413;
    return -1;
  }
  return 0;
}

int Server::Connection::OnBody(llhttp_t* parser, const char* /*at*/,
                               size_t length) {
  Connection* c = From(parser);
  c->body_bytes_ += length;
  if (c->body_bytes_ > c->options().max_body_bytes) {
    c->error_status_ = 413;
    return -1;
  }
  return 0;
}

int Server::Connection::OnMessageComplete(llhttp_t* parser) {
  Connection* c = From(parser);
  c->message_in_progress_ = false;
  // We never switch protocols, so an upgrade request ends the connection.
  c->keep_alive_ = llhttp_should_keep_alive(parser) != 0 && !c->upgrade_;
  c->http10_ = parser->http_major == 1 && parser->http_minor == 0;
  uv_timer_stop(&c->timer_);
  return HPE_PAUSED;
}

Server::Server(uv_loop_t* loop, ServerOptions options)
    : loop_(loop),
      options_(std::move(options)),
      read_buffer_(std::make_unique<char[]>(kReadBufferBytes)) {}

Server::~Server() {
  if (open_handles_ != 0) {
    spdlog::critical("HTTP: server destroyed with {} open handles",
                     open_handles_);
    std::abort();
  }
}

void Server::AddRoute(std::string path, Handler handler) {
  routes_[std::move(path)] = std::move(handler);
}

Status Server::Listen(std::string_view host_port) {
  listen_attempted_ = true;
  auto fail = [host_port](std::string_view why) {
    return Status::Error(fmt::format("cannot listen on HTTP address \"{}\": {}",
                                     host_port, why));
  };
  if (closing_) return fail("the server is closing");

  ListenAddress parsed;
  if (Status st = ParseListenAddress(host_port, &parsed); !st.ok()) {
    return fail(st.message());
  }
  const std::string& host = parsed.host;
  const uint16_t port = parsed.port;
  const bool bracketed = parsed.bracketed;

  if (host.empty()) {
    struct sockaddr_in6 any6 = {};
    uv_ip6_addr("::", port, &any6);
    int rc = BindAndListen(reinterpret_cast<struct sockaddr*>(&any6));
    if (rc == 0) return Status::Ok();
    if (rc == UV_EADDRINUSE || rc == UV_EACCES) return fail(UvError(rc));
    // No IPv6 here: every IPv4 interface instead.
    struct sockaddr_in any4 = {};
    uv_ip4_addr("0.0.0.0", port, &any4);
    rc = BindAndListen(reinterpret_cast<struct sockaddr*>(&any4));
    if (rc != 0) return fail(UvError(rc));
    return Status::Ok();
  }

  struct sockaddr_storage addr = {};
  if (bracketed) {
    if (uv_ip6_addr(host.c_str(), port,
                    reinterpret_cast<struct sockaddr_in6*>(&addr)) != 0) {
      return fail(fmt::format("\"{}\" is not an IPv6 address", host));
    }
  } else if (uv_ip4_addr(host.c_str(), port,
                         reinterpret_cast<struct sockaddr_in*>(&addr)) != 0) {
    // A host name: resolved once, at start-up, so blocking is fine.
    struct addrinfo hints = {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_ADDRCONFIG;
    struct addrinfo* result = nullptr;
    int gai = getaddrinfo(host.c_str(), nullptr, &hints, &result);
    if (gai != 0 || result == nullptr) {
      return fail(fmt::format("cannot resolve \"{}\": {}", host,
                              gai != 0 ? gai_strerror(gai) : "no address"));
    }
    std::memcpy(&addr, result->ai_addr,
                std::min<size_t>(result->ai_addrlen, sizeof(addr)));
    freeaddrinfo(result);
    if (addr.ss_family == AF_INET) {
      reinterpret_cast<struct sockaddr_in*>(&addr)->sin_port = htons(port);
    } else if (addr.ss_family == AF_INET6) {
      reinterpret_cast<struct sockaddr_in6*>(&addr)->sin6_port = htons(port);
    } else {
      return fail(fmt::format("\"{}\" has no IP address", host));
    }
  }
  int rc = BindAndListen(reinterpret_cast<struct sockaddr*>(&addr));
  if (rc != 0) return fail(UvError(rc));
  return Status::Ok();
}

Status Server::Adopt(int fd) {
  listen_attempted_ = true;
  auto fail = [fd](std::string_view why) {
    close(fd);
    return Status::Error(
        fmt::format("cannot use inherited HTTP socket (fd {}): {}", fd, why));
  };
  if (closing_) return fail("the server is closing");
  int type = 0;
  socklen_t len = sizeof(type);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0) {
    return fail(UvError(uv_translate_sys_error(errno)));
  }
  if (type != SOCK_STREAM) return fail("not a stream socket");
  int accepting = 0;
  len = sizeof(accepting);
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 ||
      accepting == 0) {
    return fail("not a listening socket");
  }
  struct sockaddr_storage addr = {};
  len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<struct sockaddr*>(&addr), &len) != 0 ||
      (addr.ss_family != AF_INET && addr.ss_family != AF_INET6)) {
    return fail("not a TCP socket");
  }

  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return fail(UvError(uv_translate_sys_error(errno)));
  }
  int rc = StartListener(fd);  // Closes fd on failure.
  if (rc != 0) {
    return Status::Error(fmt::format(
        "cannot use inherited HTTP socket (fd {}): {}", fd, UvError(rc)));
  }
  return Status::Ok();
}

int Server::BindAndListen(const struct sockaddr* addr) {
  int fd =
      socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return uv_translate_sys_error(errno);
  const int one = 1;
  const socklen_t addr_len = addr->sa_family == AF_INET6
                                 ? sizeof(struct sockaddr_in6)
                                 : sizeof(struct sockaddr_in);
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      bind(fd, addr, addr_len) != 0 || listen(fd, kListenBacklog) != 0) {
    int err = uv_translate_sys_error(errno);
    close(fd);
    return err;
  }
  return StartListener(fd);
}

int Server::StartListener(int fd) {
  net::Acceptor::Callbacks callbacks;
  callbacks.accepted = [this](int connection_fd) {
    if (connections_count_.load(std::memory_order_relaxed) >=
        options_.max_connections) {
      Reject(connection_fd);
    } else {
      Accept(connection_fd);
    }
  };
  callbacks.shed = [this](int /*connection_fd*/, int /*err*/) {
    connections_rejected_.fetch_add(1, std::memory_order_relaxed);
  };
  callbacks.failed = [this](net::AcceptFailure failure, int err) {
    OnAcceptFailure(failure, err);
  };
  net::AcceptorOptions acceptor_options;
  acceptor_options.max_accepts_per_wake = kAcceptsPerWakeup;
  acceptor_options.retry_ms = kFdRetryMs;
  auto acceptor = std::make_unique<net::Acceptor>(loop_, acceptor_options,
                                                  std::move(callbacks));
  int rc = acceptor->Start(fd);  // Closes fd on failure.
  if (rc != 0) return rc;
  acceptors_.push_back(std::move(acceptor));
  ++open_handles_;
  struct sockaddr_storage addr = {};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<struct sockaddr*>(&addr), &len) == 0) {
    uint16_t port = 0;
    if (addr.ss_family == AF_INET) {
      port = ntohs(reinterpret_cast<struct sockaddr_in*>(&addr)->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      port = ntohs(reinterpret_cast<struct sockaddr_in6*>(&addr)->sin6_port);
    }
    if (port_ == 0) port_ = port;
    spdlog::info("HTTP: listening on {}",
                 FormatAddress(reinterpret_cast<struct sockaddr*>(&addr)));
  }
  return 0;
}

void Server::CloseAcceptor(net::Acceptor* acceptor) {
  acceptor->Close([this, acceptor] {
    auto it = std::find_if(
        acceptors_.begin(), acceptors_.end(),
        [acceptor](const auto& owned) { return owned.get() == acceptor; });
    acceptors_.erase(it);  // Frees the acceptor.
    OnHandleClosed();
  });
}

void Server::OnAcceptFailure(net::AcceptFailure failure, int err) {
  switch (failure) {
    case net::AcceptFailure::kPoll:
      // Only that listener pauses (libuv stopped its poll) and retries.
      if (!accept_failing_) {
        spdlog::warn("HTTP: listener failed: {}", UvError(err));
      }
      break;
    case net::AcceptFailure::kAccept:
      if (!accept_failing_) {
        spdlog::warn("HTTP: accept failed: {}", UvError(err));
      }
      for (auto& acceptor : acceptors_) acceptor->Pause();
      break;
    case net::AcceptFailure::kOutOfFds:
      if (!accept_failing_) {
        spdlog::warn(
            "HTTP: out of file descriptors ({}); closing new connections "
            "unanswered until descriptors free up",
            UvError(err));
      }
      break;
    case net::AcceptFailure::kSpareNoHelp:
      // Said as kOutOfFds. The pending connection cannot be taken: stop
      // watching every listener for a while instead of spinning on them.
      for (auto& acceptor : acceptors_) acceptor->Pause();
      break;
  }
  accept_failing_ = true;
}

void Server::Accept(int fd) {
  rejecting_ = false;
  accept_failing_ = false;
  auto owned = std::make_unique<Connection>(this);
  Connection* connection = owned.get();
  connection_list_.push_back(std::move(owned));
  connection->self = std::prev(connection_list_.end());
  ++open_handles_;
  connections_count_.fetch_add(1, std::memory_order_relaxed);
  connection->Start(fd);
}

size_t Server::ResponseSlot(int status) {
  for (size_t i = 0; i < kNumCountedStatuses; ++i) {
    if (kCountedStatuses[i] == status) return i;
  }
  return kNumCountedStatuses;
}

void Server::Reject(int fd) {
  connections_rejected_.fetch_add(1, std::memory_order_relaxed);
  if (!rejecting_) {
    spdlog::warn(
        "HTTP: {} connections open (max_connections); closing the "
        "new one from {} and any more until one ends",
        options_.max_connections, PeerNameOf(fd));
    rejecting_ = true;
  }
  close(fd);
}

void Server::OnConnectionClosed(Connection* connection) {
  connections_count_.fetch_sub(1, std::memory_order_relaxed);
  connection_list_.erase(connection->self);  // Frees the connection.
  OnHandleClosed();
}

void Server::OnHandleClosed() {
  --open_handles_;
  FinishCloseIfDone();
}

void Server::Close(std::function<void()> done) {
  closing_ = true;
  close_done_ = std::move(done);
  // A copy: each is erased from acceptors_ once closed.
  std::vector<net::Acceptor*> acceptors;
  for (auto& acceptor : acceptors_) acceptors.push_back(acceptor.get());
  for (net::Acceptor* acceptor : acceptors) CloseAcceptor(acceptor);
  for (auto& connection : connection_list_) connection->Close();
  FinishCloseIfDone();
}

void Server::FinishCloseIfDone() {
  if (!closing_ || open_handles_ != 0 || !close_done_) return;
  std::function<void()> done = std::move(close_done_);
  close_done_ = nullptr;
  done();  // May destroy this server: nothing after.
}

void Server::SaveState(StateWriter& w) const {
  w.U64(responses_.size());
  for (const auto& n : responses_) w.U64(n.load(std::memory_order_relaxed));
  w.U64(connections_rejected_.load(std::memory_order_relaxed));
}

void Server::LoadState(StateReader& r) {
  std::array<uint64_t, kNumCountedStatuses + 1> responses{};
  if (r.Count(responses.size(), 8) != responses.size()) r.Fail();
  for (uint64_t& n : responses) n = r.U64();
  const uint64_t rejected = r.U64();
  if (!r.ok() || !r.at_end()) return;
  for (size_t i = 0; i < responses.size(); ++i) {
    responses_[i].fetch_add(responses[i], std::memory_order_relaxed);
  }
  connections_rejected_.fetch_add(rejected, std::memory_order_relaxed);
}

}  // namespace tokenmeter::daemon::http
