#include "daemon/net/acceptor.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

namespace tokenmeter::daemon::net {
namespace {

int OpenSpareFd() { return open("/dev/null", O_RDONLY | O_CLOEXEC); }

}  // namespace

Acceptor::Acceptor(uv_loop_t* loop, AcceptorOptions options,
                   Callbacks callbacks)
    : loop_(loop), options_(options), callbacks_(std::move(callbacks)) {
  if (!callbacks_.accepted || options_.max_accepts_per_wake < 1) {
    spdlog::critical("acceptor: no accepted callback, or no accepts per wake");
    std::abort();
  }
}

Acceptor::~Acceptor() {
  if (spare_fd_ >= 0) close(spare_fd_);
  if (open_handles_ != 0) {
    spdlog::critical("acceptor destroyed with {} open handles", open_handles_);
    std::abort();
  }
}

int Acceptor::OpenSpare() {
  if (spare_fd_ >= 0 || closing_) return 0;
  spare_fd_ = OpenSpareFd();
  return spare_fd_ >= 0 ? 0 : uv_translate_sys_error(errno);
}

int Acceptor::Start(int listen_fd) {
  if (started_) {
    spdlog::critical("acceptor: Start() called twice");
    std::abort();
  }
  started_ = true;
  if (closing_) {
    close(listen_fd);
    return UV_ECANCELED;
  }
  // Without a spare the acceptor still works; shedding tries again.
  (void)OpenSpare();
  const int rc = uv_poll_init_socket(loop_, &poll_, listen_fd);
  if (rc != 0) {
    close(listen_fd);
    return rc;
  }
  fd_ = listen_fd;
  poll_.data = this;
  retry_timer_.data = this;
  open_handles_ = 2;
  // Neither fails on Unix but for a closing handle or invalid arguments.
  if (uv_timer_init(loop_, &retry_timer_) != 0 ||
      uv_poll_start(&poll_, UV_READABLE, &Acceptor::OnReadable) != 0) {
    spdlog::critical("acceptor: cannot start polling a listening socket");
    std::abort();
  }
  return 0;
}

void Acceptor::OnReadable(uv_poll_t* poll, int status, int /*events*/) {
  auto* self = static_cast<Acceptor*>(poll->data);
  if (status < 0) {
    // libuv has stopped the poll already.
    self->Fail(AcceptFailure::kPoll, status);
    return;
  }
  self->AcceptPending();
}

void Acceptor::AcceptPending() {
  for (int i = 0; i < options_.max_accepts_per_wake && !closing_ && !paused_;
       ++i) {
    const int fd = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      callbacks_.accepted(fd);
      continue;
    }
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK) return;
    if (err == EINTR || err == ECONNABORTED) continue;
    if (err != EMFILE && err != ENFILE) {
      // ENOBUFS, ENOMEM, a network error of the new connection: give the
      // system a moment rather than being woken again at once for it.
      Fail(AcceptFailure::kAccept, uv_translate_sys_error(err));
      return;
    }
    if (callbacks_.failed) {
      callbacks_.failed(AcceptFailure::kOutOfFds, uv_translate_sys_error(err));
    }
    if (closing_) return;
    switch (ShedOne(err)) {
      case ShedResult::kGoOn:
        break;
      case ShedResult::kNothingPending:
        return;
      case ShedResult::kNoHelp:
        // The pending connection cannot be taken: stop watching the
        // listener for a while instead of spinning on it.
        Fail(AcceptFailure::kSpareNoHelp, uv_translate_sys_error(err));
        return;
    }
  }
}

Acceptor::ShedResult Acceptor::ShedOne(int out_of_fds_errno) {
  (void)OpenSpare();
  if (spare_fd_ < 0) return ShedResult::kNoHelp;
  close(spare_fd_);
  spare_fd_ = -1;
  // Blocking is fine: the connection is closed at once.
  const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  const int accept_errno = errno;
  if (fd >= 0) {
    if (callbacks_.shed) {
      callbacks_.shed(fd, uv_translate_sys_error(out_of_fds_errno));
    }
    close(fd);
  }
  (void)OpenSpare();
  if (fd >= 0) return ShedResult::kGoOn;
  if (accept_errno == EAGAIN || accept_errno == EWOULDBLOCK) {
    return ShedResult::kNothingPending;
  }
  if (accept_errno == EINTR || accept_errno == ECONNABORTED) {
    return ShedResult::kGoOn;
  }
  // EMFILE again (the spare lay above a lowered limit, or another thread
  // took the descriptor), or another error.
  return ShedResult::kNoHelp;
}

void Acceptor::Fail(AcceptFailure failure, int err) {
  Pause();
  if (callbacks_.failed) callbacks_.failed(failure, err);
}

void Acceptor::Pause() {
  if (open_handles_ == 0 || closing_) return;
  paused_ = true;
  uv_poll_stop(&poll_);
  uv_timer_start(&retry_timer_, &Acceptor::OnRetryTimer, options_.retry_ms, 0);
}

void Acceptor::OnRetryTimer(uv_timer_t* timer) {
  auto* self = static_cast<Acceptor*>(timer->data);
  if (self->closing_) return;
  self->paused_ = false;
  (void)self->OpenSpare();
  uv_poll_start(&self->poll_, UV_READABLE, &Acceptor::OnReadable);
}

void Acceptor::Close(std::function<void()> done) {
  if (closing_) return;
  closing_ = true;
  if (spare_fd_ >= 0) {
    close(spare_fd_);
    spare_fd_ = -1;
  }
  if (open_handles_ == 0) {
    if (done) done();  // May destroy the acceptor: nothing after.
    return;
  }
  close_done_ = std::move(done);
  uv_close(reinterpret_cast<uv_handle_t*>(&poll_), &Acceptor::OnClosed);
  uv_close(reinterpret_cast<uv_handle_t*>(&retry_timer_), &Acceptor::OnClosed);
}

void Acceptor::OnClosed(uv_handle_t* handle) {
  auto* self = static_cast<Acceptor*>(handle->data);
  if (handle == reinterpret_cast<uv_handle_t*>(&self->poll_)) {
    close(self->fd_);  // The poll no longer watches it.
    self->fd_ = -1;
  }
  if (--self->open_handles_ > 0) return;
  std::function<void()> done = std::move(self->close_done_);
  self->close_done_ = nullptr;
  if (done) done();  // May destroy the acceptor: nothing after.
}

}  // namespace tokenmeter::daemon::net
