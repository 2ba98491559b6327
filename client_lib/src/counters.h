// The counters behind tm_client_stats(). Owned by tm_client; the thread
// registry and the sender borrow them. Relaxed atomics: each is a plain
// count that stats readers may see slightly stale.
#ifndef TOKENMETER_CLIENT_LIB_SRC_COUNTERS_H_
#define TOKENMETER_CLIENT_LIB_SRC_COUNTERS_H_

#include <atomic>
#include <cstdint>

namespace tokenmeter::client {

// A cache line of its own: the sender bumps `bytes` and `sent` on every
// batch, and that must not evict the line producers read on every event
// (ThreadRegistry's id, which follows the counters in tm_client).
struct alignas(64) ClientCounters {
  // Written by the sender thread.
  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> reconnects{0};
  std::atomic<uint64_t> batches{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> connected{0};
  std::atomic<uint64_t> connect_failures{0};
  std::atomic<uint64_t> replayed{0};  // batches written again (ack)
  std::atomic<uint64_t> unacked{0};   // set once, at close
  // Kept for replay, then discarded unacked: the daemon did not answer
  // HELLO's `ack` (sender.h, "ACK at HELLO").
  std::atomic<uint64_t> discarded{0};
  // Written by any producer thread (and, for dropped_extra, by the sender
  // at close). Per-ring drops are counted in the rings themselves.
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> dropped_extra{0};  // no slot, or unsent at close
  // Optional fields not sent for breaking their rule (the event sent).
  std::atomic<uint64_t> fields_dropped{0};
};

}  // namespace tokenmeter::client

#endif  // TOKENMETER_CLIENT_LIB_SRC_COUNTERS_H_
