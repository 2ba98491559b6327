// Accepting connections on a listening socket, shared by the ingest and
// HTTP servers.
//
// An Acceptor polls one listening socket with a uv_poll_t and calls
// accept4() itself rather than going through uv_listen(), so that running
// out of file descriptors is seen and told to its owner (libuv would shed
// those connections silently). Out of descriptors (EMFILE, ENFILE), it
// closes a spare descriptor held for the purpose (/dev/null), accepts one
// pending connection in its place, hands it to the owner to name and
// closes it at once ("sheds" it, so that the peer fails fast instead of
// hanging in the backlog and the listener is not woken again and again for
// it), and reopens the spare. When that cannot help (no spare can be
// opened, or the accept through it fails as well), and after any other
// accept or poll error, it stops polling for retry_ms and then tries again.
//
// Threads: everything runs on the loop's thread (construction, OpenSpare()
// and Start() may also run on another thread before the loop runs). The
// callbacks run on the loop thread, from the poll callback.
//
// Cost: one uv_poll_t, one uv_timer_t and two descriptors (the listening
// socket and the spare) per acceptor. Per readable event at most
// max_accepts_per_wake connections are accepted or shed (a shed costs two
// accept4() calls and an open()), so that a flood of connects cannot keep
// the loop from the rest of its work; the rest wait for the next loop
// iteration (the poll is level-triggered).
#ifndef TOKENMETER_DAEMON_NET_ACCEPTOR_H_
#define TOKENMETER_DAEMON_NET_ACCEPTOR_H_

#include <uv.h>

#include <cstdint>
#include <functional>

namespace tokenmeter::daemon::net {

struct AcceptorOptions {
  // Connections accepted or shed per readable event; at least 1.
  int max_accepts_per_wake = 64;
  // How long polling stops after an error that retrying at once would only
  // repeat, and after Pause().
  uint64_t retry_ms = 100;
};

// What went wrong, told to the owner for its log lines and counters.
enum class AcceptFailure {
  // Polling the listening socket failed (err: the poll callback's status).
  // The acceptor pauses.
  kPoll,
  // accept4() failed for a reason other than running out of descriptors
  // (ENOBUFS, ENOMEM, a network error of the new connection). The acceptor
  // pauses.
  kAccept,
  // accept4() failed with EMFILE or ENFILE. Said before each attempt to
  // shed a pending connection through the spare (which may find that
  // nothing is pending: accept4() reports EMFILE before looking at the
  // queue); the acceptor goes on.
  kOutOfFds,
  // Out of descriptors and the spare did not help: none could be opened,
  // or accepting in its place failed too (a limit lowered under it).
  // err: the EMFILE or ENFILE that started it. The acceptor pauses.
  kSpareNoHelp,
};

class Acceptor {
 public:
  // `err` arguments are libuv error codes (a negated errno): UvError-style
  // text comes from uv_strerror(err)/uv_err_name(err), strerror() text
  // from std::strerror(-err). A callback may call Pause() or Close() (not
  // destroy the acceptor); no connection is then accepted after it returns
  // until the retry, or ever.
  struct Callbacks {
    // Required. A new connection: `fd` is non-blocking and close-on-exec,
    // and the callee's from now on (it must close it).
    std::function<void(int fd)> accepted;
    // Optional. A pending connection shed for lack of descriptors (err:
    // UV_EMFILE or UV_ENFILE): the callee may look at `fd` (getpeername,
    // SO_PEERCRED) to count and log it, not keep it; the acceptor closes it
    // when this returns.
    std::function<void(int fd, int err)> shed;
    // Optional. Told after the acceptor paused (when the failure pauses),
    // so that the owner may pause others too.
    std::function<void(AcceptFailure failure, int err)> failed;
  };

  // Borrows the loop, which must outlive the acceptor. Starts nothing and
  // opens nothing.
  Acceptor(uv_loop_t* loop, AcceptorOptions options, Callbacks callbacks);
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;
  // Closes the spare. Aborts when Start() succeeded and Close() has not
  // completed (its done() has not run).
  ~Acceptor();

  // Opens the spare descriptor now, if it is not open, so that an owner
  // that needs it can fail early: 0, or the libuv error of open(). Start()
  // opens it too; without one the acceptor works, and tries to open it
  // again before each shed and at each retry.
  [[nodiscard]] int OpenSpare();

  // Starts polling `listen_fd`, a bound, listening, non-blocking stream
  // socket, and takes ownership of it in every case. Returns 0, after which
  // Close() is required before destruction; or the libuv error of
  // uv_poll_init() (a descriptor epoll cannot watch, or one already
  // polled), after which `listen_fd` is closed and nothing is open. Call
  // once.
  [[nodiscard]] int Start(int listen_fd);

  // Stops polling for retry_ms (restarting the wait when already paused),
  // then polls again. For an owner that pauses several acceptors together;
  // nothing before Start() or after Close().
  void Pause();

  // Stops accepting, closes the spare now and both handles (the listening
  // socket in the poll's close callback). done() runs on the loop thread
  // once both close callbacks have run, or before Close() returns when
  // nothing was open; it may destroy the acceptor. A second call does
  // nothing (the first done() runs).
  void Close(std::function<void()> done);

  // The listening socket (-1 before Start() and once Close() completed).
  int fd() const { return fd_; }
  // Whether the spare descriptor is open now.
  bool has_spare() const { return spare_fd_ >= 0; }
  // Between a pause and the retry.
  bool paused() const { return paused_; }

 private:
  enum class ShedResult { kGoOn, kNothingPending, kNoHelp };

  static void OnReadable(uv_poll_t* poll, int status, int events);
  static void OnRetryTimer(uv_timer_t* timer);
  static void OnClosed(uv_handle_t* handle);

  void AcceptPending();
  // Sheds one pending connection through the spare.
  ShedResult ShedOne(int out_of_fds_errno);
  void Fail(AcceptFailure failure, int err);

  uv_loop_t* const loop_;
  const AcceptorOptions options_;
  const Callbacks callbacks_;
  uv_poll_t poll_{};
  uv_timer_t retry_timer_{};
  int fd_ = -1;        // the listening socket, owned
  int spare_fd_ = -1;  // /dev/null, given up to shed; -1 while it cannot open
  bool started_ = false;
  bool paused_ = false;
  bool closing_ = false;
  int open_handles_ = 0;  // poll_ and retry_timer_ until their close callbacks
  std::function<void()> close_done_;
};

}  // namespace tokenmeter::daemon::net

#endif  // TOKENMETER_DAEMON_NET_ACCEPTOR_H_
