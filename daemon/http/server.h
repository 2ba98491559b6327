// A small HTTP/1.x server on a libuv loop, for /metrics and /healthz.
//
// Scope: GET and HEAD on exact paths, answered with Content-Length (never
// chunked), keep-alive, pipelining, optional gzip. An HTTP/1.1 request
// without Host, or any request with more than one, is answered 400 and the
// connection closed (RFC 9112 3.2). Requests carrying a
// body larger than ServerOptions::max_body_bytes (by default any body) are
// answered 413 (or 404/405 when the path or method is wrong anyway) and the
// connection is closed; smaller bodies are read and ignored.
//
// Threads: every member function runs on the loop's thread (construction,
// AddRoute and Listen may also run on another thread before the loop
// starts running). connections() and requests_served() may be read from
// any thread. Handlers run on the loop thread and must not block.
//
// Limits (all per connection unless stated): request line + headers
// <= max_header_bytes (431, then close); one request parsed at a time (a
// pipelined request is not parsed until the previous response is written,
// so at most one read buffer of 64 KiB is held unparsed); reading stops
// while a response is being written; at most max_connections connections
// (server-wide; more are accepted and closed at once; likewise while the
// process is out of file descriptors, using a spare descriptor each
// listener holds for that: daemon/net/acceptor.h).
//
// Timeouts: a request's headers (and body, if any) must arrive within
// header_timeout_ns of its first byte (408, then close); a new connection
// that sends nothing within header_timeout_ns, and a keep-alive connection
// with no request in progress for idle_timeout_ns, are closed silently; a
// response the peer does not take within idle_timeout_ns closes the
// connection. After the last
// response on a connection the server shuts down its sending side and
// discards what the peer still sends for up to 2 s (a "lingering close",
// so that an early 400/431 reaches the peer instead of being lost to a
// TCP reset).
#ifndef TOKENMETER_DAEMON_HTTP_SERVER_H_
#define TOKENMETER_DAEMON_HTTP_SERVER_H_

#include <uv.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/base/status.h"

namespace tokenmeter::daemon {
class StateReader;
class StateWriter;
}  // namespace tokenmeter::daemon

namespace tokenmeter::daemon::net {
class Acceptor;
enum class AcceptFailure;
}  // namespace tokenmeter::daemon::net

namespace tokenmeter::daemon::http {

class BasicAuth;
class BasicAuthVerifier;
class TlsContext;

// A parsed request, as a handler sees it. Views are valid for the duration
// of the handler call only.
struct Request {
  std::string_view method;           // "GET" or "HEAD" for handlers.
  std::string_view path;             // Request target without the query string.
  std::string_view query;            // After '?', without it; empty if none.
  std::string_view accept;           // Accept header(s), joined by ", ".
  std::string_view accept_encoding;  // Accept-Encoding, joined likewise.
};

// What a handler fills in. The server adds Content-Length, Connection and,
// when it compresses, Content-Encoding; Vary: Accept-Encoding is added to
// every compressible response. Headers named Content-Length,
// Transfer-Encoding or Connection, or containing CR/LF, are dropped.
struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool compressible = false;  // gzip if the client accepts it and the body
                              // is at least ServerOptions::gzip_min_bytes.
};

// Called on the loop thread once per GET/HEAD request to its path. For
// HEAD the server sends the headers the GET would have (including its
// Content-Length) and drops the body. An exception escaping a handler
// becomes a 500.
using Handler = std::function<void(const Request&, Response&)>;

// Timeouts of 0 disable that timeout.
struct ServerOptions {
  size_t max_header_bytes = 16 * 1024;  // Request target + header names and
                                        // values + 4 bytes per header line.
  uint64_t header_timeout_ns = 10'000'000'000;
  uint64_t idle_timeout_ns = 60'000'000'000;
  uint32_t max_connections = 256;
  size_t gzip_min_bytes = 256;
  // Largest request body read (and ignored); larger bodies get 413 and
  // close. 0: any body is refused (a chunked request's empty body is fine).
  size_t max_body_bytes = 0;
  // --web-config (web_config.h). With `tls`, every connection speaks TLS
  // (a failed handshake is logged, counted as a protocol error and closes
  // that connection); null costs plain HTTP nothing. With `basic_auth`,
  // every request, whatever its path, needs valid credentials: others get
  // 401 with "WWW-Authenticate: Basic" (the connection stays open). A
  // password not in BasicAuth's cache is checked with bcrypt on libuv's
  // thread pool, at most auth_max_in_flight at once; meanwhile the request
  // waits and its connection reads nothing more. Beyond auth_max_waiting
  // waiting requests, a request that needs a check is answered 503 with
  // "Retry-After: 1" at once (the connection stays open). A connection has
  // at most one request waiting, so with the defaults (256 waiting, 256
  // connections) no request is ever refused as busy; each waits at most
  // (the requests ahead of it) x (one bcrypt) / auth_max_in_flight.
  std::shared_ptr<const TlsContext> tls;
  std::shared_ptr<BasicAuth> basic_auth;
  size_t auth_max_in_flight = 1;
  size_t auth_max_waiting = 256;
};

class Server {
 public:
  // Borrows the loop, which must outlive the server. Starts nothing.
  Server(uv_loop_t* loop, ServerOptions options);
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  // Requires Close() to have completed (its done() to have run) whenever a
  // Listen or Adopt was attempted; aborts otherwise.
  ~Server();

  // Routes an exact path (compared before the query string) to a handler;
  // GET and HEAD are allowed on it, other methods get 405. A second call
  // for the same path replaces the handler.
  void AddRoute(std::string path, Handler handler);

  // Binds and listens. Accepts "HOST:PORT" (IPv4 literal or host name,
  // resolved once, blocking), "[IPV6]:PORT" and ":PORT" (every interface:
  // "::" dual-stack, falling back to 0.0.0.0 where IPv6 is unavailable).
  // PORT is 0..65535; 0 picks a free port (see port()). May be called more
  // than once to listen on several addresses. Errors (bad syntax, address
  // in use, permission) come back as one line naming the address.
  Status Listen(std::string_view host_port);

  // Listens on an inherited socket that is already bound and listening
  // (systemd socket activation). Takes ownership of fd in every case: it is
  // closed on failure and by Close().
  Status Adopt(int fd);

  // The port of the first address listened on (0 before any).
  uint16_t port() const { return port_; }

  // Stops listening and closes every connection at once (responses in
  // flight are cut). done() runs on the loop thread once every handle's
  // close callback has run and no password check is left on the thread
  // pool (one not yet started there is cancelled; a running one takes at
  // most one bcrypt); it runs before Close() returns when nothing was
  // open. Call once.
  void Close(std::function<void()> done);

  // Open connections (accepted and not yet freed). Any thread.
  size_t connections() const {
    return connections_count_.load(std::memory_order_relaxed);
  }
  // Complete requests answered through routing (handler, 404, 405, 500),
  // not counting protocol errors (400, 408, 413, 431). Any thread.
  uint64_t requests_served() const {
    return requests_served_.load(std::memory_order_relaxed);
  }
  // Connections closed unanswered at once: max_connections were open, or
  // the process or system was out of file descriptors (EMFILE, ENFILE:
  // logged once per burst; the listener keeps accepting once descriptors
  // free up). Any thread.
  uint64_t connections_rejected() const {
    return connections_rejected_.load(std::memory_order_relaxed);
  }
  // Connections closed for a malformed (400), too slow (408), body-carrying
  // (413) or oversized (431) request. Any thread.
  uint64_t protocol_errors() const {
    return protocol_errors_.load(std::memory_order_relaxed);
  }

  // Requests whose credentials were not in the cache and went to the
  // password check queue (BasicAuthVerifier): each costs a bcrypt unless
  // its connection closes while it waits. Any thread.
  uint64_t password_checks() const {
    return password_checks_.load(std::memory_order_relaxed);
  }

  // Responses started, by status code: kCountedStatuses[i] for i <
  // kNumCountedStatuses, every other code in slot kNumCountedStatuses
  // ("other"). Counted when the response is handed to the socket, so a
  // handler reading these does not see its own response. Any thread.
  static constexpr int kCountedStatuses[] = {200, 400, 401, 403, 404, 405,
                                             408, 413, 431, 500, 503};
  static constexpr size_t kNumCountedStatuses = std::size(kCountedStatuses);
  uint64_t responses(size_t slot) const {
    return slot <= kNumCountedStatuses
               ? responses_[slot].load(std::memory_order_relaxed)
               : 0;
  }
  // The slot a status code is counted in.
  static size_t ResponseSlot(int status);

  // Snapshots (daemon/base/state_io.h): the counters behind
  // tokenmeter_http_* (responses, rejected connections), so that they do
  // not reset across a restart. LoadState() reads the payload's last part
  // and adds to what is counted only when the reader is then ok and at its
  // end (the server outlives a failed load); call it before Listen(). Loop
  // thread.
  void SaveState(StateWriter& w) const;
  void LoadState(StateReader& r);

 private:
  class Connection;

  // Return a libuv error code. StartListener takes ownership of fd (a
  // bound, listening, non-blocking socket) and closes it on failure.
  int BindAndListen(const struct sockaddr* addr);
  int StartListener(int fd);
  void CloseAcceptor(net::Acceptor* acceptor);
  // Logs an accept failure once per burst; pauses every listener when the
  // failure is one that retrying at once would only repeat.
  void OnAcceptFailure(net::AcceptFailure failure, int err);
  void Accept(int fd);
  void Reject(int fd);
  void OnConnectionClosed(Connection* connection);
  void OnHandleClosed();
  void FinishCloseIfDone();

  uv_loop_t* loop_;
  const ServerOptions options_;
  std::map<std::string, Handler, std::less<>> routes_;
  // One per listening socket; each freed once its Close() completed.
  std::vector<std::unique_ptr<net::Acceptor>> acceptors_;
  std::list<std::unique_ptr<Connection>> connection_list_;
  // Null without basic auth.
  std::unique_ptr<BasicAuthVerifier> verifier_;
  // Acceptors and connections whose close has not yet completed, and the
  // verifier while checks it ran are on the thread pool.
  size_t open_handles_ = 0;
  bool closing_ = false;
  bool listen_attempted_ = false;
  std::function<void()> close_done_;
  uint16_t port_ = 0;
  // True between the first refusal of a burst and the next accepted
  // connection, so that a burst logs once.
  bool rejecting_ = false;
  // Likewise for failed accepts (EMFILE and the like).
  bool accept_failing_ = false;
  // Likewise for refused credentials (401) and failed TLS handshakes.
  bool auth_failing_ = false;
  bool auth_busy_ = false;  // Likewise for 503s of a full check queue.
  bool tls_failing_ = false;
  // One read buffer shared by every connection: libuv calls read_cb right
  // after alloc_cb, and unparsed bytes are copied out before returning.
  std::unique_ptr<char[]> read_buffer_;
  std::atomic<size_t> connections_count_{0};
  std::atomic<uint64_t> requests_served_{0};
  std::atomic<uint64_t> connections_rejected_{0};
  std::atomic<uint64_t> protocol_errors_{0};
  std::atomic<uint64_t> password_checks_{0};
  std::array<std::atomic<uint64_t>, kNumCountedStatuses + 1> responses_{};
};

}  // namespace tokenmeter::daemon::http

#endif  // TOKENMETER_DAEMON_HTTP_SERVER_H_
