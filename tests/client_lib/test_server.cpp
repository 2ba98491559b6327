#include "test_server.h"

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tokenmeter::testing {

TestServer::TestServer(std::string path) : path_(std::move(path)) {
  if (pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    error_ = std::string("pipe2: ") + std::strerror(errno);
    return;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path_.size() >= sizeof addr.sun_path) {
    error_ = "socket path too long: " + path_;
    return;
  }
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    error_ = std::string("socket: ") + std::strerror(errno);
    return;
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(fd, 16) != 0) {
    error_ = "bind/listen " + path_ + ": " + std::strerror(errno);
    close(fd);
    return;
  }
  listen_fd_ = fd;
  thread_ = std::thread([this] { Run(); });
}

TestServer::~TestServer() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    Wake();
    thread_.join();
  }
  for (int fd : fds_) {
    if (fd >= 0) close(fd);
  }
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    unlink(path_.c_str());
  }
  if (wake_pipe_[0] >= 0) close(wake_pipe_[0]);
  if (wake_pipe_[1] >= 0) close(wake_pipe_[1]);
}

void TestServer::Wake() {
  const char c = 1;
  [[maybe_unused]] ssize_t w = write(wake_pipe_[1], &c, 1);
}

bool TestServer::WaitUntil(const std::function<bool(const Connections&)>& pred,
                           std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  return changed_.wait_for(l, timeout, [&] { return pred(conns_); });
}

TestServer::Connections TestServer::Snapshot() const {
  std::lock_guard<std::mutex> l(mu_);
  return conns_;
}

void TestServer::Drop(size_t index) {
  std::lock_guard<std::mutex> l(mu_);
  if (index < fds_.size() && fds_[index] >= 0) {
    // The fd stays open (the reader thread may be polling it) until the
    // reader sees EOF; shutdown alone makes the peer see the close.
    shutdown(fds_[index], SHUT_RDWR);
    conns_[index].dropped = true;
  }
}

void TestServer::SetReading(bool reading) {
  {
    std::lock_guard<std::mutex> l(mu_);
    reading_ = reading;
  }
  Wake();
}

void TestServer::SetWriteJunk(bool junk) {
  {
    std::lock_guard<std::mutex> l(mu_);
    write_junk_ = junk;
  }
  Wake();
}

std::vector<uint8_t> AckFrame(uint64_t seq) {
  std::vector<uint8_t> b = {0x92, 0x03};
  int bytes = 0;
  if (seq <= 0x7f) {
    b.push_back(uint8_t(seq));
  } else if (seq <= 0xff) {
    b.push_back(0xcc);
    bytes = 1;
  } else if (seq <= 0xffff) {
    b.push_back(0xcd);
    bytes = 2;
  } else if (seq <= 0xffffffffu) {
    b.push_back(0xce);
    bytes = 4;
  } else {
    b.push_back(0xcf);
    bytes = 8;
  }
  for (int i = bytes - 1; i >= 0; --i) b.push_back(uint8_t(seq >> (8 * i)));
  return b;
}

void TestServer::SetAcking(bool acking) {
  std::lock_guard<std::mutex> l(mu_);
  acking_ = acking;
}

void TestServer::SetAnswering(bool answering) {
  std::lock_guard<std::mutex> l(mu_);
  answering_ = answering;
}

void TestServer::SetMaxBatchEvents(size_t n) {
  std::lock_guard<std::mutex> l(mu_);
  max_batch_events_ = n;
}

void TestServer::DropAfterBatches(size_t index, size_t batches) {
  std::lock_guard<std::mutex> l(mu_);
  drop_after_[index] = batches;
}

bool TestServer::SendLocked(size_t index, const std::vector<uint8_t>& bytes) {
  return send(fds_[index], bytes.data(), bytes.size(),
              MSG_NOSIGNAL | MSG_DONTWAIT) == ssize_t(bytes.size());
}

void TestServer::Send(size_t index, const std::vector<uint8_t>& bytes) {
  std::lock_guard<std::mutex> l(mu_);
  if (index < fds_.size() && fds_[index] >= 0) {
    [[maybe_unused]] ssize_t w = send(fds_[index], bytes.data(), bytes.size(),
                                      MSG_NOSIGNAL | MSG_DONTWAIT);
  }
}

void TestServer::AckNewFrames(size_t index, size_t first) {
  Connection& c = conns_[index];
  if (session_of_.size() <= index) session_of_.resize(index + 1);
  std::optional<uint64_t>& session = session_of_[index];
  for (size_t i = first; i < c.frames.size(); ++i) {
    const Value& f = c.frames[i].value;
    if (!f.IsArray() || f.array.size() < 2 || !f.array[0].IsUint()) continue;
    if (f.array[0].uint == 1) ++c.batches;
    if (f.array[0].uint == 0 && f.array[1].IsMap()) {
      const Value* ack = f.array[1].Find("ack");
      c.ack = ack != nullptr && ack->type == Value::Type::kBool && ack->boolean;
      const Value* s = f.array[1].Find("session");
      if (s != nullptr && s->IsUint()) session = s->uint;
      if (!c.ack || !answering_) continue;
      const auto it =
          session ? session_acked_.find(*session) : session_acked_.end();
      if (it != session_acked_.end()) c.answer = it->second;
      c.answered =
          SendLocked(index, c.answer ? AckFrame(*c.answer)
                                     : std::vector<uint8_t>{0x92, 0x03, 0xc0});
    } else if (f.array[0].uint == 1 && max_batch_events_ != 0 &&
               f.array.size() >= 4 && f.array[3].IsArray() &&
               f.array[3].array.size() > max_batch_events_) {
      // The daemon's batch_too_large: the connection closed, nothing acked
      // (the frames after it on this connection are not read).
      if (!c.dropped) {
        shutdown(fds_[index], SHUT_RDWR);
        c.dropped = true;
      }
      break;
    } else if (f.array[0].uint == 1 && c.ack && acking_ &&
               f.array[1].IsUint()) {
      const uint64_t seq = f.array[1].uint;
      if (SendLocked(index, AckFrame(seq))) {
        c.acked.push_back(seq);
        if (session) {
          auto [it, added] = session_acked_.emplace(*session, seq);
          if (!added && it->second < seq) it->second = seq;
        }
      }
    }
  }
  const auto quota = drop_after_.find(index);
  if (quota != drop_after_.end() && !c.dropped && c.batches >= quota->second) {
    shutdown(fds_[index], SHUT_RDWR);
    c.dropped = true;
  }
}

void TestServer::ReadFrom(size_t index) {
  uint8_t buf[64 * 1024];
  const ssize_t n = read(fds_[index], buf, sizeof buf);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  std::lock_guard<std::mutex> l(mu_);
  Connection& c = conns_[index];
  if (n <= 0) {
    c.eof = true;
    close(fds_[index]);
    fds_[index] = -1;
  } else {
    c.bytes.insert(c.bytes.end(), buf, buf + n);
    const size_t first = c.frames.size();
    if (!c.decode_error &&
        !DecodeFrames(c.bytes, &c.decoded_bytes, &c.frames)) {
      c.decode_error = true;
    }
    AckNewFrames(index, first);
  }
  changed_.notify_all();
}

void TestServer::Run() {
  std::vector<pollfd> pfds;
  std::vector<size_t> index_of;  // pfds[i + 2] is connection index_of[i]
  for (;;) {
    pfds.clear();
    index_of.clear();
    pfds.push_back({wake_pipe_[0], POLLIN, 0});
    pfds.push_back({listen_fd_, POLLIN, 0});
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      const short events =
          short((reading_ ? POLLIN : 0) | (write_junk_ ? POLLOUT : 0));
      for (size_t i = 0; events != 0 && i < fds_.size(); ++i) {
        if (fds_[i] < 0) continue;
        pfds.push_back({fds_[i], events, 0});
        index_of.push_back(i);
      }
    }
    if (poll(pfds.data(), pfds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (pfds[0].revents & POLLIN) {
      char sink[64];
      while (read(wake_pipe_[0], sink, sizeof sink) > 0) {
      }
    }
    if (pfds[1].revents & POLLIN) {
      const int fd =
          accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        std::lock_guard<std::mutex> l(mu_);
        fds_.push_back(fd);
        conns_.emplace_back();
        changed_.notify_all();
      }
    }
    for (size_t i = 2; i < pfds.size(); ++i) {
      if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        ReadFrom(index_of[i - 2]);
      } else if (pfds[i].revents & POLLOUT) {
        static const std::vector<uint8_t> junk(64 * 1024, 0xc1);
        // Whatever the socket takes; a closed peer is EPIPE, ignored.
        [[maybe_unused]] ssize_t w = send(pfds[i].fd, junk.data(), junk.size(),
                                          MSG_NOSIGNAL | MSG_DONTWAIT);
      }
    }
  }
}

}  // namespace tokenmeter::testing
