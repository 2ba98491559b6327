#include "daemon/http/connection.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <exception>
#include <optional>
#include <utility>

#include "daemon/base/ascii.h"
#include "daemon/http/basic_auth.h"
#include "daemon/http/negotiation.h"
#include "daemon/http/tls_pump.h"

namespace tokenmeter::daemon::http {
namespace {

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
  if (auth_job_ != nullptr) {
    server_->verifier_->Abandon(auth_job_);
    auth_job_ = nullptr;
  }
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
  if (server_->verifier_ == nullptr) {
    Dispatch(BasicAuthVerifier::Result::kAllowed);
    return;
  }
  BasicAuthVerifier::Job* job = nullptr;
  std::optional<BasicAuthVerifier::Result> result = server_->verifier_->Check(
      authorization_, [this](BasicAuthVerifier::Result r) { OnVerified(r); },
      &job);
  if (result) {
    Dispatch(*result);
    return;
  }
  // The parser is paused on this request; nothing more is read until it
  // is answered, so a connection holds at most one check. A peer that
  // leaves meanwhile is noticed only after the answer: its check runs to
  // the end, so that a scraper that gave up (its scrape timeout) finds its
  // password cached on its next try instead of queueing again.
  server_->password_checks_.fetch_add(1, std::memory_order_relaxed);
  auth_job_ = job;
  uv_read_stop(stream());
  state_ = State::kVerifying;
}

void Server::Connection::OnVerified(BasicAuthVerifier::Result result) {
  auth_job_ = nullptr;  // Freed by the verifier.
  state_ = State::kReading;
  Dispatch(result);
}

void Server::Connection::Dispatch(BasicAuthVerifier::Result auth) {
  server_->requests_served_.fetch_add(1, std::memory_order_relaxed);
  auto method = static_cast<llhttp_method_t>(parser_.method);
  bool head = method == HTTP_HEAD;
  Target target = SplitTarget(url_);
  const Handler* handler = nullptr;
  int route_status = RouteCheck(target, &handler);
  Response response;
  if (auth == BasicAuthVerifier::Result::kDenied) {
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
  } else if (auth == BasicAuthVerifier::Result::kBusy) {
    if (!server_->auth_busy_) {
      spdlog::warn(
          "HTTP: {}: {} password checks waiting; answering 503 (said once "
          "until a request is checked again)",
          peer_, server_->verifier_->waiting());
    }
    server_->auth_busy_ = true;
    route_status = 503;
    response.status = 503;
    response.body = "503 Service Unavailable: too many password checks\n";
    response.headers.emplace_back("Retry-After", "1");
  } else if (options().basic_auth) {
    server_->auth_failing_ = false;
  }
  if (auth != BasicAuthVerifier::Result::kBusy && options().basic_auth) {
    server_->auth_busy_ = false;
  }
  if (route_status == 401 || route_status == 503) {
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
    std::string cipher;
    if (!SealResponse(*tls_, out_head_, out_body_, close_after, &cipher)) {
      spdlog::debug("HTTP: {}: TLS write failed: {}", peer_, tls_->error());
      Close();
      return;
    }
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

}  // namespace tokenmeter::daemon::http
