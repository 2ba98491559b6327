// The sender: one thread that drains the registry's rings into BATCH frames
// and writes them to the daemon through a Transport. It owns the connection
// (connect, backoff, HELLO, GOODBYE), the batching, and the flush and close
// handshakes with the application's threads.
//
// Threads: Start(), Flush() and Stop() are called by application threads
// (Flush() from any number of them at once); Run() and everything it calls
// run on the sender thread, the only one that touches the transport and the
// batch state.
//
// Delivery: a BATCH counts as sent once all of its bytes are written. A
// BATCH that was only partly written when the connection broke is sent
// again whole, with a fresh header, on the next connection (the daemon
// discards the truncated frame).
//
// Acknowledged delivery (protocol 1.1, `ack`, the default): seq counts
// batches per client, across reconnects. A written batch's events stay in
// the replay buffer (replay_buffer.h, `replay_bytes`) until an ACK covers
// its seq; past the bound the oldest are dropped and counted. The inbound
// side is decoded as ACK frames (ack_decoder.h); bytes that are none close
// the connection (backoff follows). Without `ack` any inbound byte does.
// Stop() waits, within close_timeout_ms, for the ACKs of every written
// batch too.
//
// ACK at HELLO (protocol 1.2, mends 1.1): a daemon that acks answers HELLO
// at once with [3, seq] (the highest seq it applied of this session) or
// [3, nil]; a 1.0 daemon ignores `ack` and says nothing, and a batch
// replayed to it would be applied twice. So on each connection the sender
// awaits that answer (any ACK frame is one), for at most kAnswerWaitNs:
//  * meanwhile it replays nothing; with batches kept from an earlier
//    connection it writes nothing but HELLO (a new batch must not overtake
//    them); with none, it writes new batches as long as the replay buffer
//    keeps them without dropping one;
//  * with the answer, the kept batches at or below its seq are released
//    and the rest written again, in order, with their original seq (a
//    fresh header: the current dropped_total), then new ones;
//  * without it by the deadline, the daemon is taken for one that does not
//    ack: every kept batch is discarded (counted in counters.discarded, not
//    as dropped) and nothing is kept for replay on this connection.
// All of it is the sender thread's; no event call waits for it.
#ifndef TOKENMETER_CLIENT_LIB_SRC_SENDER_H_
#define TOKENMETER_CLIENT_LIB_SRC_SENDER_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ack_decoder.h"
#include "counters.h"
#include "encoder.h"
#include "replay_buffer.h"
#include "thread_registry.h"
#include "tokenmeter/tokenmeter.h"
#include "transport.h"
#include "value_table.h"

namespace tokenmeter::client {

// Caps of one BATCH frame: it closes at whichever comes first.
inline constexpr uint32_t kBatchMaxEvents = 4096;
inline constexpr size_t kBatchMaxBytes = 256 * 1024;
// Reconnect backoff: doubles on every failed attempt or short-lived
// connection, from kBackoffMinNs up to kBackoffMaxNs; a connection that
// lived kStableConnectionNs resets it.
inline constexpr uint64_t kBackoffMinNs = 10'000'000;
inline constexpr uint64_t kBackoffMaxNs = 1'000'000'000;
inline constexpr uint64_t kStableConnectionNs = 1'000'000'000;
// Inbound bytes are read this many at a time, at most kMaxReadsPerWake
// times per wake-up (the next poll reports what is left).
inline constexpr size_t kInboundReadBytes = 64 * 1024;
inline constexpr int kMaxReadsPerWake = 16;
// After a failed write with ack on: how long the sender thread waits for
// the daemon's last ACKs and close (AwaitFinalAcks()).
inline constexpr uint64_t kFinalAckWaitNs = 100'000'000;
// With ack on: how long after connecting the sender waits for the
// daemon's answer to HELLO before it takes the daemon for one that does
// not ack (protocol 1.2 "ACK at HELLO": at most 1 s).
inline constexpr uint64_t kAnswerWaitNs = 1'000'000'000;
// With ack on: a kept batch whose replay ends its connection this many
// times in a row, each time before the connection lived
// kStableConnectionNs and before the batch was acked, is one the daemon
// refuses (a BATCH over a limit it was started with, --max-batch-events or
// --max-frame-bytes below this library's caps): it is dropped and counted
// in dropped_total, so that the batches after it go on (replaying it
// forever would deliver nothing more).
inline constexpr int kMaxReplayRefusals = 3;

struct SenderOptions {
  std::string socket_path;
  HelloMeta meta;
  uint32_t flush_interval_ms = 20;
  uint32_t close_timeout_ms = 1000;
  // Acknowledged delivery (meta.ack says the same to the daemon) and the
  // replay buffer's bytes, reserved when the Sender is made.
  bool ack = false;
  size_t replay_bytes = 0;
};

class Sender {
 public:
  // Borrows `registry`, `values` and `counters` for its whole life; owns
  // `transport` (non-null). Starts nothing. Reserves opts.replay_bytes when
  // opts.ack (throws std::bad_alloc).
  Sender(SenderOptions opts, std::unique_ptr<Transport> transport,
         ThreadRegistry& registry, const ValueTable& values,
         ClientCounters& counters);
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;
  // Stop() if it was not called.
  ~Sender();

  // Starts the sender thread. TM_OK, or TM_E_SYSTEM (no eventfd, no thread).
  int Start();
  // Waits up to `timeout_ms` until every event committed to any ring before
  // the call has been written. TM_OK; TM_E_DISCONNECTED at once while there
  // is no connection; TM_E_TIMEOUT; TM_E_INVALID once Stop() has begun.
  int Flush(uint32_t timeout_ms);
  // Sends what the rings hold (within close_timeout_ms), then GOODBYE, and
  // joins the thread. Returns the number of events given up (also counted
  // in counters.dropped_extra). Call once; later calls return 0. With ack,
  // also waits for the ACKs; the events still unacked then are
  // unacked_at_close() (and counters.unacked).
  uint64_t Stop();
  uint64_t unacked_at_close() const { return close_unacked_; }
  // In the child of a fork(), from the atfork handler (the only thread):
  // closes the child's copies of the wake-up descriptor and the socket (the
  // parent's connection: the child never writes to it) without shutting the
  // connection down. The sender must not be used afterwards; the child
  // never runs its destructor (the thread it would join is the parent's).
  void ForgetAfterFork();

 private:
  void Run();
  void Wake();
  // Application requests, taken under mu_ at the top of each round.
  void TakeRequests(uint64_t now_ns, bool* closing, uint64_t* close_deadline_ns,
                    bool* flush_active);
  // True once the flush being served is complete (or cannot be).
  bool FlushDone(int* result) const;

  bool TryConnect(uint64_t now_ns);
  void OnConnected(uint64_t now_ns);
  void Disconnect(uint64_t now_ns);
  void CountReplayRefusal(uint64_t now_ns);
  // Builds and writes batches until the rings are empty or the transport
  // is full. Returns true when more events may be waiting. Disconnects on
  // a broken connection.
  bool SendBatches(uint64_t now_ns);
  // Drains the rings into batch_body_ until they are empty or the batch is
  // full. Returns true when the batch filled up (more may be waiting).
  bool FillBatch();
  void PrepareBatchFrame();
  // The replay pass's next kept batch, with a fresh header.
  void PrepareReplayFrame();
  // Writes as much of out_ as the transport takes. False on a broken
  // connection.
  bool WritePending();
  void OnBatchWritten();
  // Reads what the peer sent, in bulk, until kAgain. False when the
  // connection must be closed (EOF, error, or bytes 1.0 forbids).
  bool ReadInbound();
  bool OnInbound(const uint8_t* data, size_t n);
  // No answer to HELLO by answer_deadline_ns_: discards the kept batches
  // (counted) and keeps none on this connection.
  void GiveUpOnAnswer();
  // A write failed. With ack on, a daemon stopping gracefully shuts its
  // read side (the write's EPIPE), acks what it drained, then closes: this
  // reads until that close, at most kFinalAckWaitNs (the sender thread
  // only), so that what it acked is not replayed to the next daemon.
  void AwaitFinalAcks();
  // Nothing left to send or to wait for at close.
  bool AllDelivered() const;
  // Dropped plus rejected events: what BATCH headers carry.
  uint64_t DroppedTotal() const;

  const SenderOptions opts_;
  const std::unique_ptr<Transport> transport_;
  ThreadRegistry& registry_;
  const ValueTable& values_;
  ClientCounters& counters_;

  // Flush and close requests (mu_ guards the non-atomic members).
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t flush_requested_ = 0;
  uint64_t flush_done_ = 0;
  int flush_result_ = TM_OK;
  bool closing_ = false;
  bool sender_done_ = false;
  bool stopped_ = false;
  int wake_fd_ = -1;  // eventfd
  std::thread thread_;

  // Sender-thread state.
  bool connected_ = false;
  // This connection's acknowledged delivery: kOff without `ack`; else the
  // answer to HELLO is awaited until answer_deadline_ns_, then the daemon
  // acks or it does not (nothing kept for replay).
  enum class AckMode : uint8_t { kOff, kAwaiting, kAcking, kNotAcking };
  AckMode ack_mode_ = AckMode::kOff;
  uint64_t answer_deadline_ns_ = 0;
  uint64_t seq_ = 0;
  uint64_t connected_at_ns_ = 0;
  uint64_t next_attempt_ns_ = 0;
  uint64_t backoff_ns_ = 0;
  bool ever_connected_ = false;
  ByteBuffer batch_body_;  // events of the batch being built
  uint32_t batch_events_ = 0;
  ByteBuffer out_;  // bytes to write on this connection
  size_t out_off_ = 0;
  uint32_t out_batch_events_ = 0;  // events in out_ (0: no batch in out_)
  bool out_replay_ = false;        // out_'s batch is a replay of out_seq_
  uint64_t out_seq_ = 0;
  ReplayBuffer replay_;  // written, unacked batches (ack only)
  // This connection replayed the batch that was then the oldest kept,
  // replayed_seq_; refused_seq_ / refusals_: the oldest kept batch whose
  // replays ended that many short connections in a row
  // (kMaxReplayRefusals).
  bool replayed_oldest_ = false;
  uint64_t replayed_seq_ = 0;
  uint64_t refused_seq_ = 0;
  int refusals_ = 0;
  AckDecoder acks_;
  std::vector<uint64_t> flush_targets_;  // per-slot tails a flush waits for
  uint64_t flush_ticket_ = 0;
  std::vector<uint8_t> inbound_;  // kInboundReadBytes
  uint64_t close_dropped_ = 0;    // written by the sender before it exits
  uint64_t close_unacked_ = 0;    // likewise
};

}  // namespace tokenmeter::client

#endif  // TOKENMETER_CLIENT_LIB_SRC_SENDER_H_
