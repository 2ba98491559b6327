#include "transport.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tokenmeter::client {
namespace {

class UnixSocketTransport final : public Transport {
 public:
  UnixSocketTransport() = default;
  UnixSocketTransport(const UnixSocketTransport&) = delete;
  UnixSocketTransport& operator=(const UnixSocketTransport&) = delete;
  ~UnixSocketTransport() override { Close(); }

  int Connect(const std::string& path) override {
    const int fd =
        socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return errno;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(),
                std::min(path.size(), sizeof addr.sun_path - 1));
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      const int err = errno;
      close(fd);
      return err;
    }
    fd_ = fd;
    return 0;
  }

  IoResult Write(const uint8_t* data, size_t n) override {
    for (;;) {
      const ssize_t w = send(fd_, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w >= 0) return {IoResult::Status::kOk, size_t(w), 0};
      if (errno == EINTR) continue;
      return Failed(errno);
    }
  }

  IoResult Read(uint8_t* buf, size_t cap) override {
    for (;;) {
      const ssize_t r = recv(fd_, buf, cap, MSG_DONTWAIT);
      if (r > 0) return {IoResult::Status::kOk, size_t(r), 0};
      if (r == 0) return {IoResult::Status::kEof, 0, 0};
      if (errno == EINTR) continue;
      return Failed(errno);
    }
  }

  void Shutdown() override {
    if (fd_ >= 0) shutdown(fd_, SHUT_WR);
  }

  void Close() override {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  int fd() const override { return fd_; }

 private:
  static IoResult Failed(int err) {
    if (err == EAGAIN || err == EWOULDBLOCK) {
      return {IoResult::Status::kAgain, 0, 0};
    }
    return {IoResult::Status::kError, 0, err};
  }

  int fd_ = -1;
};

}  // namespace

std::unique_ptr<Transport> NewUnixSocketTransport() {
  return std::make_unique<UnixSocketTransport>();
}

}  // namespace tokenmeter::client
