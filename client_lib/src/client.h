// The client behind the C ABI: per-thread rings, the thread registry, and
// the sender thread that drains the rings into msgpack frames on the socket.
#ifndef TOKENMETER_CLIENT_LIB_SRC_CLIENT_H_
#define TOKENMETER_CLIENT_LIB_SRC_CLIENT_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "encoder.h"
#include "ring.h"
#include "tokenmeter/tokenmeter.h"

struct tm_options {
  std::string socket_path = TM_DEFAULT_SOCKET_PATH;
  tokenmeter::client::HelloMeta meta;
  size_t buffer_capacity = 65536;
  uint32_t flush_interval_ms = 20;
  uint32_t close_timeout_ms = 1000;
  uint32_t max_threads = 64;
};

namespace tokenmeter::client {

// One producer thread's ring. Shared between the client (which drains it)
// and the thread (whose thread-local cache points at it): reference counted
// so that whichever of the two goes last frees it.
struct ThreadSlot {
  enum State : int { kFree = 0, kActive = 1, kOrphaned = 2 };

  explicit ThreadSlot(size_t capacity_words) : ring(capacity_words) {}

  Ring ring;
  std::atomic<int> state{kFree};
  std::atomic<int> refs{1};              // the client's reference
  std::atomic<bool> client_gone{false};  // set by close

  // Drops one reference; the last one frees the slot.
  static void Unref(ThreadSlot* slot) {
    if (slot->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete slot;
  }
};

// Returns the calling thread's slot for client `id`, or nullptr when it has
// none yet. Hot path.
ThreadSlot* CachedSlot(uint64_t client_id);

}  // namespace tokenmeter::client

struct tm_client {
 public:
  explicit tm_client(const tm_options& opts);
  tm_client(const tm_client&) = delete;
  tm_client& operator=(const tm_client&) = delete;
  ~tm_client();

  // Starts the sender thread. TM_OK or TM_E_SYSTEM.
  int Start();
  int Close(uint64_t* stats_out, size_t n);
  int Flush(uint32_t timeout_ms);
  int Stats(uint64_t* out, size_t n) const;

  // The calling thread's ring, attaching the thread on its first call;
  // nullptr when no slot can be had. An event that finds no slot is dropped
  // and counted (count_drop); tm_thread_attach() drops no event.
  tokenmeter::client::Ring* LocalRing(bool count_drop = true) {
    tokenmeter::client::ThreadSlot* slot = tokenmeter::client::CachedSlot(id_);
    if (slot != nullptr) [[likely]]
      return &slot->ring;
    return AttachSlow(count_drop);
  }
  tokenmeter::client::Ring* AttachSlow(bool count_drop);

  void CountRejected() { rejected_.fetch_add(1, std::memory_order_relaxed); }
  void CountRejected(uint64_t n) {
    rejected_.fetch_add(n, std::memory_order_relaxed);
  }
  // Events dropped outside any ring: a batch call that found no slot (after
  // the one LocalRing() counted).
  void CountDropped(uint64_t n) {
    dropped_extra_.fetch_add(n, std::memory_order_relaxed);
  }

 private:
  using ThreadSlot = tokenmeter::client::ThreadSlot;
  using ByteBuffer = tokenmeter::client::ByteBuffer;

  void Run();
  void Wake();
  // Drains the rings into batch_body_ until they are empty or the batch is
  // full. Returns true when the batch filled up (more may be waiting).
  bool FillBatch();
  // Writes as much of out_ as the socket takes. False on a broken
  // connection.
  bool WritePending();
  bool TryConnect(uint64_t now_ns);
  void Disconnect(uint64_t now_ns);
  void PrepareBatchFrame();
  bool RingsEmpty() const;
  uint64_t CountBufferedEvents() const;
  void RecycleOrphans();
  // Events thrown away (buffer full, no slot, unsent at close).
  uint64_t DroppedEvents() const;
  // What BATCH headers carry: dropped plus rejected events.
  uint64_t DroppedTotal() const;

  const tm_options opts_;
  const uint64_t id_;
  const size_t ring_words_;

  // Slots, appended under mu_, never removed before the destructor. The
  // sender reads the first n_slots_ entries without the lock.
  std::mutex mu_;
  std::unique_ptr<std::atomic<ThreadSlot*>[]> slots_;
  std::atomic<uint32_t> n_slots_{0};

  // Flush and close requests (mu_ guards the non-atomic members).
  std::condition_variable cv_;
  uint64_t flush_requested_ = 0;
  uint64_t flush_done_ = 0;
  int flush_result_ = TM_OK;
  bool closing_ = false;
  bool sender_done_ = false;
  int wake_fd_ = -1;  // eventfd
  std::thread sender_;

  // Sender-thread state.
  int fd_ = -1;
  uint64_t seq_ = 0;
  uint64_t connected_at_ns_ = 0;
  uint64_t next_attempt_ns_ = 0;
  uint64_t backoff_ns_ = 0;
  bool ever_connected_ = false;
  ByteBuffer batch_body_;  // events of the batch being built
  uint32_t batch_events_ = 0;
  bool batch_ready_ = false;  // batch_body_ awaits sending
  ByteBuffer out_;            // bytes to write on this connection
  size_t out_off_ = 0;
  uint32_t out_batch_events_ = 0;        // events in out_ (0: no batch in out_)
  std::vector<uint64_t> flush_targets_;  // per-slot tails a flush waits for
  uint64_t flush_ticket_ = 0;
  uint64_t close_dropped_ = 0;  // written by the sender before it exits

  // Counters (tm_stat).
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> dropped_extra_{0};  // no slot, or unsent at close
  std::atomic<uint64_t> reconnects_{0};
  std::atomic<uint64_t> batches_{0};
  std::atomic<uint64_t> bytes_{0};
  std::atomic<uint64_t> connected_{0};
  std::atomic<uint64_t> connect_failures_{0};
};

#endif  // TOKENMETER_CLIENT_LIB_SRC_CLIENT_H_
