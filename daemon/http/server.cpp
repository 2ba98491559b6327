#include "daemon/http/server.h"

#include <fcntl.h>
#include <netdb.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "daemon/base/state_io.h"
#include "daemon/http/basic_auth.h"
#include "daemon/http/connection.h"
#include "daemon/http/listen_address.h"
#include "daemon/net/acceptor.h"

namespace tokenmeter::daemon::http {
namespace {

constexpr int kListenBacklog = 511;
// Connections accepted per readable event of one listener, so that a flood
// of connects cannot keep the loop from the rest of its work.
constexpr int kAcceptsPerWakeup = 64;
// Out of file descriptors with no spare to give back: how long the
// listeners pause before trying again.
constexpr uint64_t kFdRetryMs = 100;

std::string PeerNameOf(int fd) {
  struct sockaddr_storage ss = {};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<struct sockaddr*>(&ss), &len) != 0) {
    return "unknown peer";
  }
  return FormatAddress(reinterpret_cast<struct sockaddr*>(&ss));
}

}  // namespace

Server::Server(uv_loop_t* loop, ServerOptions options)
    : loop_(loop),
      options_(std::move(options)),
      read_buffer_(std::make_unique<char[]>(kReadBufferBytes)) {
  if (options_.basic_auth != nullptr) {
    BasicAuthVerifier::Options verifier_options;
    verifier_options.max_in_flight = options_.auth_max_in_flight;
    verifier_options.max_waiting = options_.auth_max_waiting;
    verifier_ = std::make_unique<BasicAuthVerifier>(loop_, options_.basic_auth,
                                                    verifier_options);
  }
}

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
  // Connections first: each abandons its check.
  for (auto& connection : connection_list_) connection->Close();
  if (verifier_ != nullptr) {
    ++open_handles_;
    if (verifier_->Close([this] { OnHandleClosed(); })) --open_handles_;
  }
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
