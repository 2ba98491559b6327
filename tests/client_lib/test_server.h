// Test doubles for the daemon side of the ingest socket: a temp dir with a
// short socket path, and a Unix socket server that accepts connections in
// its own thread, records every byte and decodes the frames.
#ifndef TOKENMETER_TESTS_CLIENT_LIB_TEST_SERVER_H_
#define TOKENMETER_TESTS_CLIENT_LIB_TEST_SERVER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "msgpack_value.h"
#include "testutil/poll.h"
#include "testutil/temp_dir.h"

namespace tokenmeter::testing {

// How long WaitUntil() waits by default: the shared polling bound.
inline constexpr std::chrono::milliseconds kDeadline = testutil::kPollTimeout;

// A fresh directory under /tmp, removed on destruction (testutil/temp_dir.h).
using testutil::TempDir;

// What the server saw on one accepted connection.
struct Connection {
  std::vector<uint8_t> bytes;   // everything read, in order
  std::vector<Frame> frames;    // complete frames decoded from `bytes`
  size_t decoded_bytes = 0;     // bytes covered by `frames`
  bool decode_error = false;    // `bytes` is not valid msgpack
  bool eof = false;             // the peer closed (or the server dropped it)
  bool dropped = false;         // the server closed it (Drop())
  bool ack = false;             // its HELLO asked for ACKs
  size_t batches = 0;           // BATCH frames among `frames`
  std::vector<uint64_t> acked;  // the seq of every BATCH ACK the server wrote
  // The answer to an `ack` HELLO the server wrote: [3, *answer] or, with
  // no value, [3, nil].
  bool answered = false;
  std::optional<uint64_t> answer;
};

// An ACK frame [3, seq] in the smallest msgpack encoding of seq, written by
// hand from the msgpack spec.
std::vector<uint8_t> AckFrame(uint64_t seq);

// Polls a condition until it holds or a timeout passes (testutil/poll.h).
using testutil::PollUntil;

// Listens on a Unix stream socket at `path` from construction to
// destruction. Accepts any number of connections; one thread reads them all.
class TestServer {
 public:
  using Connections = std::vector<Connection>;

  explicit TestServer(std::string path);
  TestServer(const TestServer&) = delete;
  TestServer& operator=(const TestServer&) = delete;
  // Closes every connection and the listener, removes the socket file.
  ~TestServer();

  // False when the socket could not be set up (errno text in error()).
  bool ok() const { return listen_fd_ >= 0; }
  const std::string& error() const { return error_; }

  // Waits until `pred` holds for the connections seen so far (checked on
  // every change) or `timeout` passes; true when it held.
  bool WaitUntil(const std::function<bool(const Connections&)>& pred,
                 std::chrono::milliseconds timeout = kDeadline);
  // A copy of what has been seen so far.
  Connections Snapshot() const;

  // Closes connection `index` from the server side (shutdown both ways):
  // the client sees EOF, and its writes fail from now on.
  void Drop(size_t index);
  // While false, the server stops reading (the client's socket fills up).
  void SetReading(bool reading);
  // While true, the server writes junk (0xc1, a byte msgpack never uses) to
  // every open connection whenever it can: a peer that talks back to a v1
  // client, which never asked it to.
  void SetWriteJunk(bool junk);
  // While true (the default), the server plays a daemon without a state
  // directory: it acks every BATCH of a connection whose HELLO had
  // `ack: true` as soon as it has read it.
  void SetAcking(bool acking);
  // While true (the default), the server answers a HELLO with `ack: true`
  // as a daemon of protocol 1.2 does ("ACK at HELLO"): [3, the highest seq
  // it acked of that HELLO's session], or [3, nil] when none. False, with
  // SetAcking(false): a daemon of protocol 1.0, which never writes.
  void SetAnswering(bool answering);
  // Connection `index` is dropped (as Drop()) by the server's thread as
  // soon as it has read `batches` BATCH frames of it.
  void DropAfterBatches(size_t index, size_t batches);
  // Plays a daemon started with --max-batch-events `n`: a BATCH of more
  // events closes its connection at once, not applied or acked (0: none).
  void SetMaxBatchEvents(size_t n);
  // Writes `bytes` to connection `index` (what the socket takes at once).
  void Send(size_t index, const std::vector<uint8_t>& bytes);

 private:
  void Run();
  void Wake();
  void ReadFrom(size_t index);
  // Answers the HELLO and acks the BATCHes among connection `index`'s
  // frames from `first` on; drops the connection after its BATCH quota
  // (mu_ held).
  void AckNewFrames(size_t index, size_t first);
  // Writes `bytes` to connection `index` at once; false if the socket did
  // not take them all (mu_ held).
  bool SendLocked(size_t index, const std::vector<uint8_t>& bytes);

  const std::string path_;
  std::string error_;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};

  mutable std::mutex mu_;
  std::condition_variable changed_;
  Connections conns_;
  std::vector<int> fds_;  // per connection; -1 once closed
  bool reading_ = true;
  bool write_junk_ = false;
  bool acking_ = true;
  bool answering_ = true;
  std::map<size_t, size_t> drop_after_;  // connection -> BATCHes
  size_t max_batch_events_ = 0;          // 0: no limit
  // The highest seq acked per HELLO session, and each connection's session.
  std::map<uint64_t, uint64_t> session_acked_;
  std::vector<std::optional<uint64_t>> session_of_;
  bool stop_ = false;

  std::thread thread_;
};

}  // namespace tokenmeter::testing

#endif  // TOKENMETER_TESTS_CLIENT_LIB_TEST_SERVER_H_
