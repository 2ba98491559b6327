// The acceptor on a real libuv loop and a real listening TCP socket
// (127.0.0.1, port 0). The test thread is the loop thread: it steps the
// loop with uv_run(UV_RUN_NOWAIT) while it polls. Running out of
// descriptors is real too: the soft RLIMIT_NOFILE is lowered to the lowest
// free descriptor. Every test ends with the acceptor closed, the
// loop run to completion and uv_loop_close() == 0.
#include "daemon/net/acceptor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "testutil/poll.h"

namespace tokenmeter::daemon::net {
namespace {

using testutil::PollUntil;

// A listening, non-blocking TCP socket on 127.0.0.1 and a free port.
int ListenLoopback(uint16_t* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

// The port of the peer of an accepted connection.
uint16_t PeerPort(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  return ntohs(addr.sin_port);
}

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) >= 0; }

// A blocking client connected to 127.0.0.1:port (a loopback connect
// completes in the kernel, before any accept); closed on destruction.
class Client {
 public:
  explicit Client(uint16_t port)
      : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&addr),
                                     sizeof addr) == 0;
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client() {
    if (fd_ >= 0) close(fd_);
  }

  bool connected() const { return connected_; }
  // What the server's getpeername() says of this connection.
  uint16_t port() const {
    sockaddr_in addr{};
    socklen_t len = sizeof addr;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    return ntohs(addr.sin_port);
  }
  // The server closed the connection (and sent nothing). Never blocks.
  bool SawEof() const {
    char c;
    return recv(fd_, &c, 1, MSG_DONTWAIT | MSG_PEEK) == 0;
  }

 private:
  int fd_;
  bool connected_ = false;
};

// The lowest descriptor free now (the next open() would get it), or -1.
int LowestFreeFd() {
  const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) close(fd);
  return fd;
}

// While it lives, the soft RLIMIT_NOFILE is `limit`. At the lowest free
// descriptor, every descriptor under it is in use, so that none can be
// opened (EMFILE) until one under it is closed. The destructor puts the
// limit back.
class DescriptorLimit {
 public:
  explicit DescriptorLimit(int limit) {
    if (limit < 0 || getrlimit(RLIMIT_NOFILE, &saved_) != 0) return;
    rlimit low = saved_;
    low.rlim_cur = rlim_t(limit);
    lowered_ = setrlimit(RLIMIT_NOFILE, &low) == 0;
  }
  DescriptorLimit(const DescriptorLimit&) = delete;
  DescriptorLimit& operator=(const DescriptorLimit&) = delete;
  ~DescriptorLimit() {
    if (lowered_) setrlimit(RLIMIT_NOFILE, &saved_);
  }

  // The limit is lowered and no descriptor can be opened.
  bool exhausted() const { return lowered_ && LowestFreeFd() < 0; }

 private:
  rlimit saved_{};
  bool lowered_ = false;
};

class AcceptorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    loop_initialized_ = true;
    listen_fd_ = ListenLoopback(&port_);
    ASSERT_GE(listen_fd_, 0);
  }

  void TearDown() override {
    for (int fd : accepted_) close(fd);
    if (acceptor_ != nullptr) CloseAcceptor();
    if (listen_fd_ >= 0) close(listen_fd_);  // Never handed over.
    if (loop_initialized_) {
      ASSERT_EQ(uv_run(&loop_, UV_RUN_DEFAULT), 0);
      EXPECT_EQ(uv_loop_close(&loop_), 0);
    }
  }

  // Makes the acceptor and starts it on the listening socket.
  void Start(AcceptorOptions options = AcceptorOptions()) {
    Acceptor::Callbacks callbacks;
    callbacks.accepted = [this](int fd) { accepted_.push_back(fd); };
    callbacks.shed = [this](int fd, int err) {
      shed_.emplace_back(PeerPort(fd), err);
    };
    callbacks.failed = [this](AcceptFailure failure, int err) {
      failures_.emplace_back(failure, err);
    };
    acceptor_ = std::make_unique<Acceptor>(&loop_, options, callbacks);
    const int fd = listen_fd_;
    listen_fd_ = -1;
    ASSERT_EQ(acceptor_->Start(fd), 0);
  }

  // Closes the acceptor; it is destroyed in done(), from its close callback.
  void CloseAcceptor() {
    bool done = false;
    acceptor_->Close([&] {
      done = true;
      acceptor_.reset();
    });
    EXPECT_TRUE(RunUntil([&] { return done; }));
  }

  ::testing::AssertionResult RunUntil(const std::function<bool()>& cond) {
    return PollUntil([&] {
      uv_run(&loop_, UV_RUN_NOWAIT);
      return cond();
    });
  }

  size_t Count(AcceptFailure failure) const {
    return size_t(
        std::count_if(failures_.begin(), failures_.end(),
                      [failure](const auto& f) { return f.first == failure; }));
  }
  size_t ShedFrom(uint16_t port) const {
    return size_t(
        std::count_if(shed_.begin(), shed_.end(),
                      [port](const auto& s) { return s.first == port; }));
  }

  uv_loop_t loop_{};
  bool loop_initialized_ = false;
  int listen_fd_ = -1;  // Until the acceptor takes it.
  uint16_t port_ = 0;
  std::unique_ptr<Acceptor> acceptor_;
  // What the callbacks were given: the accepted fds (closed by TearDown),
  // the peer port and error of each connection shed, each failure.
  std::vector<int> accepted_;
  std::vector<std::pair<uint16_t, int>> shed_;
  std::vector<std::pair<AcceptFailure, int>> failures_;
};

TEST_F(AcceptorTest, HandsOverNonBlockingCloseOnExecConnections) {
  Start();
  Client a(port_), b(port_);
  ASSERT_TRUE(a.connected() && b.connected());
  ASSERT_TRUE(RunUntil([&] { return accepted_.size() == 2; }));
  for (int fd : accepted_) {
    EXPECT_NE(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
    EXPECT_NE(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  }
  // The fds are the callee's, and are the connections made.
  const uint16_t ports[] = {PeerPort(accepted_[0]), PeerPort(accepted_[1])};
  EXPECT_TRUE(ports[0] == a.port() || ports[1] == a.port());
  EXPECT_TRUE(ports[0] == b.port() || ports[1] == b.port());
  EXPECT_TRUE(failures_.empty());
  EXPECT_TRUE(acceptor_->has_spare());
}

TEST_F(AcceptorTest, AcceptsAtMostTheBoundPerWake) {
  AcceptorOptions options;
  options.max_accepts_per_wake = 2;
  Start(options);
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 5; ++i) {
    clients.push_back(std::make_unique<Client>(port_));
    ASSERT_TRUE(clients.back()->connected());
  }
  // One loop iteration polls once: two accepts, the rest wait.
  uv_run(&loop_, UV_RUN_NOWAIT);
  EXPECT_EQ(accepted_.size(), 2u);
  ASSERT_TRUE(RunUntil([&] { return accepted_.size() == 5; }));
}

// Out of descriptors, each pending connection is accepted in place of the
// spare, shown to the owner and closed at once (the peer sees EOF instead
// of waiting); once descriptors are free again, connections are handed over
// as before.
TEST_F(AcceptorTest, ShedsPendingConnectionsWhileOutOfDescriptors) {
  Start();
  Client a(port_), b(port_), c(port_);
  for (Client* s : {&a, &b, &c}) ASSERT_TRUE(s->connected());
  {
    DescriptorLimit limit(LowestFreeFd());
    ASSERT_TRUE(limit.exhausted());
    ASSERT_TRUE(
        RunUntil([&] { return a.SawEof() && b.SawEof() && c.SawEof(); }));
    EXPECT_TRUE(accepted_.empty());
    ASSERT_EQ(shed_.size(), 3u);
    for (Client* s : {&a, &b, &c}) EXPECT_EQ(ShedFrom(s->port()), 1u);
    for (const auto& [port, err] : shed_) EXPECT_EQ(err, UV_EMFILE);
    // Said before each shed (and once more when the queue ran dry); the
    // spare always helped, so the acceptor never paused.
    EXPECT_GE(Count(AcceptFailure::kOutOfFds), 3u);
    EXPECT_EQ(Count(AcceptFailure::kSpareNoHelp), 0u);
    EXPECT_FALSE(acceptor_->paused());
    EXPECT_TRUE(acceptor_->has_spare());
  }
  Client d(port_);
  ASSERT_TRUE(d.connected());
  ASSERT_TRUE(RunUntil([&] { return accepted_.size() == 1; }));
  EXPECT_EQ(PeerPort(accepted_[0]), d.port());
  EXPECT_FALSE(d.SawEof());
  EXPECT_EQ(shed_.size(), 3u);
}

// Out of descriptors with the spare no help (the limit lowered under it):
// the pending connection cannot be taken, so the acceptor stops polling for
// retry_ms instead of spinning, retries, and hands the connection over once
// descriptors are back.
TEST_F(AcceptorTest, PausesAndRetriesWhenTheSpareCannotHelp) {
  // The spare is opened in the lowest free descriptor.
  const int spare = LowestFreeFd();
  ASSERT_GE(spare, 0);
  AcceptorOptions options;
  options.retry_ms = 50;
  Start(options);
  Client client(port_);
  ASSERT_TRUE(client.connected());
  const auto started = std::chrono::steady_clock::now();
  {
    // Every descriptor under the spare's is in use, and the spare's, once
    // given up, cannot be had again.
    DescriptorLimit limit(spare);
    ASSERT_TRUE(limit.exhausted());
    ASSERT_TRUE(
        RunUntil([&] { return Count(AcceptFailure::kSpareNoHelp) >= 3; }));
    // Three tries: at least two pauses of 50 ms between them.
    EXPECT_GE(std::chrono::steady_clock::now() - started,
              std::chrono::milliseconds(90));
    EXPECT_TRUE(acceptor_->paused());
    EXPECT_FALSE(acceptor_->has_spare());
    EXPECT_TRUE(accepted_.empty());
    EXPECT_TRUE(shed_.empty());
    EXPECT_FALSE(client.SawEof());
    for (const auto& [failure, err] : failures_) {
      EXPECT_TRUE(failure == AcceptFailure::kOutOfFds ||
                  failure == AcceptFailure::kSpareNoHelp);
      EXPECT_EQ(err, UV_EMFILE);
    }
    EXPECT_EQ(Count(AcceptFailure::kOutOfFds),
              Count(AcceptFailure::kSpareNoHelp));
  }
  ASSERT_TRUE(RunUntil([&] { return accepted_.size() == 1; }));
  EXPECT_EQ(PeerPort(accepted_[0]), client.port());
  EXPECT_FALSE(acceptor_->paused());
  EXPECT_TRUE(acceptor_->has_spare());
}

// Pause() by the owner: nothing is accepted for retry_ms, then what waited
// is.
TEST_F(AcceptorTest, PauseStopsAcceptingUntilTheRetry) {
  AcceptorOptions options;
  options.retry_ms = 50;
  Start(options);
  uv_update_time(&loop_);
  const auto paused_at = std::chrono::steady_clock::now();
  acceptor_->Pause();
  EXPECT_TRUE(acceptor_->paused());
  Client client(port_);
  ASSERT_TRUE(client.connected());
  for (int i = 0; i < 10 && acceptor_->paused(); ++i) {
    uv_run(&loop_, UV_RUN_NOWAIT);
    if (acceptor_->paused()) {
      EXPECT_TRUE(accepted_.empty());
    }
  }
  ASSERT_TRUE(RunUntil([&] { return accepted_.size() == 1; }));
  EXPECT_GE(std::chrono::steady_clock::now() - paused_at,
            std::chrono::milliseconds(40));
  EXPECT_FALSE(acceptor_->paused());
  EXPECT_TRUE(failures_.empty());
}

// Close() while paused: both handles and the listening socket are closed
// (TearDown checks uv_loop_close()), and connecting is refused.
TEST_F(AcceptorTest, CloseWhilePausedClosesTheSocketAndEveryHandle) {
  Start();
  const int fd = acceptor_->fd();
  acceptor_->Pause();
  CloseAcceptor();
  EXPECT_EQ(acceptor_, nullptr);
  EXPECT_FALSE(IsOpen(fd));
  Client client(port_);
  EXPECT_FALSE(client.connected());
}

// A connection accepted by a callback that closes the acceptor is the last:
// the rest are left to the kernel.
TEST_F(AcceptorTest, StopsAcceptingOnceClosedFromACallback) {
  bool done = false;
  Acceptor::Callbacks callbacks;
  callbacks.accepted = [&](int fd) {
    accepted_.push_back(fd);
    acceptor_->Close([&] { done = true; });
  };
  acceptor_ = std::make_unique<Acceptor>(&loop_, AcceptorOptions(), callbacks);
  ASSERT_EQ(acceptor_->Start(listen_fd_), 0);
  listen_fd_ = -1;
  Client a(port_), b(port_);
  ASSERT_TRUE(a.connected() && b.connected());
  ASSERT_TRUE(RunUntil([&] { return done; }));
  EXPECT_EQ(accepted_.size(), 1u);
  acceptor_.reset();
}

// Start() on a descriptor epoll cannot watch fails, and closes it; Close()
// then completes at once.
TEST_F(AcceptorTest, StartFailureClosesTheDescriptor) {
  Acceptor acceptor(&loop_, AcceptorOptions(),
                    {[](int fd) { close(fd); }, nullptr, nullptr});
  const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_NE(acceptor.Start(fd), 0);
  EXPECT_FALSE(IsOpen(fd));
  bool done = false;
  acceptor.Close([&] { done = true; });
  EXPECT_TRUE(done);
}

// Close() before Start(): done() at once, and Start() then refuses (and
// closes the socket it was given).
TEST_F(AcceptorTest, CloseBeforeStartCompletesAtOnce) {
  Acceptor acceptor(&loop_, AcceptorOptions(),
                    {[](int fd) { close(fd); }, nullptr, nullptr});
  bool done = false;
  acceptor.Close([&] { done = true; });
  EXPECT_TRUE(done);
  const int fd = listen_fd_;
  listen_fd_ = -1;
  EXPECT_EQ(acceptor.Start(fd), UV_ECANCELED);
  EXPECT_FALSE(IsOpen(fd));
}

}  // namespace
}  // namespace tokenmeter::daemon::net
