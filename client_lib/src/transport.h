// The sender's view of its connection to the daemon: a small interface over
// the socket calls, so that tests can drive partial writes, EAGAIN, resets
// and inbound bytes without a real socket (tests/client_lib/sender_test.cpp
// injects a fake through tm_options::make_transport, see client.h).
#ifndef TOKENMETER_CLIENT_LIB_SRC_TRANSPORT_H_
#define TOKENMETER_CLIENT_LIB_SRC_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace tokenmeter::client {

// The outcome of one Write() or Read().
struct IoResult {
  enum class Status : uint8_t {
    kOk,     // `bytes` bytes moved (at least one)
    kAgain,  // nothing moved now; poll fd() and try again
    kEof,    // Read() only: the peer closed its side
    kError,  // the connection is broken (`error` holds the errno)
  };
  Status status = Status::kOk;
  size_t bytes = 0;
  int error = 0;
};

// One connection at a time, non-blocking throughout. Every call is made by
// the sender thread only; none blocks, none throws. Owned by the Sender.
class Transport {
 public:
  virtual ~Transport() = default;

  // Connects to the daemon's socket at `path` (it fits sun_path: the options
  // checked it). 0 when connected, else an errno value (nothing stays open).
  // Only called while not connected.
  virtual int Connect(const std::string& path) = 0;
  // Writes up to `n` bytes of `data` (n > 0); partial writes are normal.
  virtual IoResult Write(const uint8_t* data, size_t n) = 0;
  // Reads up to `cap` bytes that the peer sent into `buf`.
  virtual IoResult Read(uint8_t* buf, size_t cap) = 0;
  // Ends the sending side (the peer reads EOF after the bytes written so
  // far, even when a forked child still holds a copy of the socket).
  virtual void Shutdown() = 0;
  // Closes the connection; no-op when not connected.
  virtual void Close() = 0;
  // What the sender polls while connected: POLLIN for inbound bytes or a
  // broken connection, POLLOUT after kAgain from Write(). -1 when not
  // connected.
  virtual int fd() const = 0;
};

// Makes the client's transport once, when the client is created.
using TransportFactory = std::function<std::unique_ptr<Transport>()>;

// The real one: an AF_UNIX stream socket, SOCK_NONBLOCK | SOCK_CLOEXEC,
// written with MSG_NOSIGNAL (a closed peer is EPIPE, never SIGPIPE).
// Throws std::bad_alloc (tm_client_new() turns that into TM_E_NOMEM).
std::unique_ptr<Transport> NewUnixSocketTransport();

}  // namespace tokenmeter::client

#endif  // TOKENMETER_CLIENT_LIB_SRC_TRANSPORT_H_
