// A plain client socket for tests that talk to the daemon's listeners
// directly (a raw engine on the ingest socket, an HTTP scrape over TCP).
#ifndef TOKENMETER_TESTS_TESTUTIL_SOCKET_H_
#define TOKENMETER_TESTS_TESTUTIL_SOCKET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace tokenmeter::testutil {

// A blocking stream socket whose sends and receives give up after 5 s (a
// failing test ends instead of hanging); closed on destruction. Not
// thread-safe; one test thread uses it.
class TestSocket {
 public:
  // AF_UNIX or AF_INET; a failed socket() makes every call below fail.
  explicit TestSocket(int family)
      : fd_(socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    timeval tv{5, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  TestSocket(const TestSocket&) = delete;
  TestSocket& operator=(const TestSocket&) = delete;
  ~TestSocket() {
    if (fd_ >= 0) close(fd_);
  }

  // connect() to a listening Unix socket completes in the kernel (the
  // backlog), before the server's loop accepts.
  bool ConnectUnix(const std::string& path) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path) return false;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    return connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }

  // 127.0.0.1:port.
  bool ConnectLoopback(uint16_t port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }

  // All of `data`, or false (the peer closed, an error, the timeout).
  template <typename Container>
  bool SendAll(const Container& data) {
    const auto* p = reinterpret_cast<const uint8_t*>(data.data());
    size_t left = data.size();
    while (left > 0) {
      const ssize_t n = send(fd_, p, left, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      p += n;
      left -= size_t(n);
    }
    return true;
  }

  // Appends everything until the peer closes; false on an error or the
  // timeout.
  bool ReadToEof(std::string* out) {
    char buf[16384];
    for (;;) {
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n == 0) return true;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return false;
      out->append(buf, size_t(n));
    }
  }

  // True once the peer has closed and nothing is left to read. Never
  // blocks (for polling while the test thread runs the server's loop).
  bool SawEof() const {
    char c;
    return recv(fd_, &c, 1, MSG_DONTWAIT | MSG_PEEK) == 0;
  }

 private:
  int fd_;
};

}  // namespace tokenmeter::testutil

#endif  // TOKENMETER_TESTS_TESTUTIL_SOCKET_H_
