// A scripted stand-in for the daemon's socket: FakePeer plays the daemon
// behind the client's Transport interface (client_lib/src/transport.h), so
// that tests choose how many bytes each write takes, when writes return
// EAGAIN or fail, and what the peer sends back, and count every call.
#ifndef TOKENMETER_TESTS_CLIENT_LIB_FAKE_TRANSPORT_H_
#define TOKENMETER_TESTS_CLIENT_LIB_FAKE_TRANSPORT_H_

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "transport.h"

namespace tokenmeter::testing {

// What the peer does on one connection.
struct ConnScript {
  // Once this many bytes of the connection are written, Write() fails with
  // fail_errno (and keeps failing on this connection).
  size_t fail_after = SIZE_MAX;
  int fail_errno = EPIPE;
  // Bytes the peer sends right after the connection is made.
  size_t inbound_bytes = 0;
  // The peer closes its side right after the connection is made.
  bool eof_after_connect = false;
};

// Everything one connection saw.
struct FakeConn {
  std::vector<uint8_t> bytes;  // written by the client, in order
  uint64_t connected_ns = 0;   // CLOCK_MONOTONIC
  uint64_t closed_ns = 0;      // 0 while open
  bool shutdown = false;       // the client called Shutdown()
};

// Thread-safe: the client's sender thread makes the transport calls, the
// test scripts and inspects from its own thread. The transports it makes
// share ownership of it, so a test may inspect it after closing the client.
class FakePeer : public std::enable_shared_from_this<FakePeer> {
 public:
  static std::shared_ptr<FakePeer> New();
  FakePeer(const FakePeer&) = delete;
  FakePeer& operator=(const FakePeer&) = delete;
  ~FakePeer();

  // For tm_options::make_transport.
  client::TransportFactory Factory();

  // ---- script (any time) ----
  // While true, Connect() fails with ECONNREFUSED.
  void SetRefuseConnect(bool refuse);
  // Write() takes at most sizes[k % sizes.size()] bytes on its k-th call
  // (empty: all it is given).
  void SetWriteSizes(std::vector<size_t> sizes);
  // Each connection takes at most `bytes` bytes in all; beyond that Write()
  // returns kAgain. Raising it makes fd() readable, as a socket that drains
  // makes the sender's poll return.
  void SetWriteLimit(size_t bytes);
  // The script of connection `index` (0 = the first); others get the
  // default ConnScript.
  void SetScript(size_t index, ConnScript script);

  // ---- observation ----
  std::vector<FakeConn> Conns() const;
  std::vector<uint64_t> ConnectAttemptsNs() const;
  bool connected() const;
  uint64_t writes() const;
  uint64_t reads() const;
  size_t max_read_cap() const;

 private:
  class Transport;
  FakePeer();
  // Makes fd() readable (the sender's poll returns).
  void SignalLocked();
  void DrainSignalLocked();

  int Connect();
  client::IoResult Write(const uint8_t* data, size_t n);
  client::IoResult Read(uint8_t* buf, size_t cap);
  void Shutdown();
  void Close();
  int fd() const;

  mutable std::mutex mu_;
  int pipe_[2] = {-1, -1};  // [0] is what the client polls
  bool refuse_ = false;
  std::vector<size_t> write_sizes_;
  size_t write_limit_ = SIZE_MAX;
  std::vector<ConnScript> scripts_;
  std::vector<FakeConn> conns_;
  std::vector<uint64_t> attempts_ns_;
  bool connected_ = false;
  size_t inbound_left_ = 0;  // junk bytes the peer has queued
  bool eof_ = false;
  uint64_t writes_ = 0;
  uint64_t reads_ = 0;
  size_t max_read_cap_ = 0;
};

}  // namespace tokenmeter::testing

#endif  // TOKENMETER_TESTS_CLIENT_LIB_FAKE_TRANSPORT_H_
