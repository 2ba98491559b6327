// libFuzzer target: arbitrary bytes as an HTTP client's side of a real
// connection to an in-process http::Server (llhttp on libuv, the daemon's
// settings and limits), on loopback TCP.
//
// Per input: connect, write the bytes (split at a point taken from the
// first byte, with loop turns between the two writes), half-close, and
// read until the server closes. Checks: every answer starts with an HTTP/1.1
// status line, and the server frees the connection afterwards.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "daemon/http/negotiation.h"
#include "daemon/http/server.h"

namespace {

using tokenmeter::daemon::http::Request;
using tokenmeter::daemon::http::Response;
using tokenmeter::daemon::http::Server;
using tokenmeter::daemon::http::ServerOptions;

struct State {
  State() {
    spdlog::set_level(spdlog::level::off);
    if (uv_loop_init(&loop) != 0) __builtin_trap();
    ServerOptions options;
    options.max_header_bytes = 4096;  // reach the 431 path with small inputs
    options.gzip_min_bytes = 16;
    server = new Server(&loop, options);
    server->AddRoute("/metrics", [](const Request& req, Response& resp) {
      const auto f = tokenmeter::daemon::http::ChooseFormat(req.accept);
      resp.content_type = std::string(tokenmeter::daemon::http::ContentType(f));
      resp.compressible = true;
      resp.body.assign(200, 'm');
      resp.body += req.query;
    });
    server->AddRoute("/healthz", [](const Request&, Response& resp) {
      resp.body = "ok\n";
      resp.headers.emplace_back("X-Evil", "a\r\nb");  // must be dropped
    });
    server->AddRoute("/throw", [](const Request&, Response&) {
      throw std::runtime_error("handler failed");
    });
    if (!server->Listen("127.0.0.1:0").ok()) __builtin_trap();
    port = server->port();
  }
  uv_loop_t loop{};
  Server* server = nullptr;  // never destroyed: lives for the process
  uint16_t port = 0;
};

State& GetState() {
  static State* state = new State;
  return *state;
}

// One loop turn without blocking, then a short wait on our socket.
void Turn(State& s, int fd, short events) {
  uv_run(&s.loop, UV_RUN_NOWAIT);
  pollfd p{fd, events, 0};
  poll(&p, 1, 0);
  uv_run(&s.loop, UV_RUN_NOWAIT);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  State& s = GetState();
  if (size < 1) return 0;
  const size_t split = 1 + (size - 1) * data[0] / 255;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0) __builtin_trap();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(s.port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 &&
      errno != EINPROGRESS) {
    __builtin_trap();
  }
  size_t sent = 1;  // data[0] is the split control byte
  bool write_closed = false;
  bool eof = false;
  std::string got;
  char buf[65536];
  for (int turns = 0; !eof; ++turns) {
    if (turns > 2'000'000) __builtin_trap();  // the server stopped answering
    Turn(s, fd, POLLIN | POLLOUT);
    if (!write_closed) {
      const size_t limit = sent < split ? split : size;
      if (sent < limit) {
        const ssize_t n = send(fd, data + sent, limit - sent, MSG_NOSIGNAL);
        if (n > 0) sent += size_t(n);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
            errno != ENOTCONN) {
          write_closed = true;  // reset by the server: it answered already
        }
      } else if (sent >= size) {
        shutdown(fd, SHUT_WR);
        write_closed = true;
      }
    }
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      if (got.size() < 64) got.append(buf, size_t(n));
    } else if (n == 0 ||
               (errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOTCONN)) {
      eof = true;
    }
  }
  if (!got.empty() && got.compare(0, 9, "HTTP/1.1 ") != 0) __builtin_trap();
  close(fd);
  for (int turns = 0; s.server->connections() > 0; ++turns) {
    if (turns > 2'000'000) __builtin_trap();  // connection never freed
    uv_run(&s.loop, UV_RUN_NOWAIT);
  }
  return 0;
}
