// The client behind the C ABI: a thin owner that wires three parts
// together (see each header for its contract):
//   ThreadRegistry (thread_registry.h)  per-thread rings, attach, recycling
//   Sender         (sender.h)           the sender thread: batching,
//                                       connect/backoff, flush and close
//   Transport      (transport.h)        the socket calls, owned by the Sender
// and holds the counters that tm_client_stats() reports (counters.h).
#ifndef TOKENMETER_CLIENT_LIB_SRC_CLIENT_H_
#define TOKENMETER_CLIENT_LIB_SRC_CLIENT_H_

#include <cstdint>
#include <string>

#include "counters.h"
#include "encoder.h"
#include "ring.h"
#include "sender.h"
#include "thread_registry.h"
#include "tokenmeter/tokenmeter.h"
#include "transport.h"

struct tm_options {
  std::string socket_path = TM_DEFAULT_SOCKET_PATH;
  tokenmeter::client::HelloMeta meta;
  size_t buffer_capacity = 65536;
  uint32_t flush_interval_ms = 20;
  uint32_t close_timeout_ms = 1000;
  uint32_t max_threads = 64;
  // Internal, for tests only (no C setter): makes the client's transport.
  // Empty: the Unix socket at socket_path.
  tokenmeter::client::TransportFactory make_transport;
};

struct tm_client {
 public:
  // Builds the parts; starts nothing. Throws std::bad_alloc (and whatever
  // opts.make_transport throws); tm_client_new() catches.
  explicit tm_client(const tm_options& opts);
  tm_client(const tm_client&) = delete;
  tm_client& operator=(const tm_client&) = delete;
  // Stops the sender (as Close() does) if Close() was not called.
  ~tm_client() = default;

  // Starts the sender thread. TM_OK or TM_E_SYSTEM.
  int Start() { return sender_.Start(); }
  // Sends what is buffered (within close_timeout_ms), says GOODBYE, stops
  // the sender thread, then copies the final stats. TM_OK, or TM_E_TIMEOUT
  // when events were given up (counted as dropped).
  int Close(uint64_t* stats_out, size_t n);
  // See Sender::Flush().
  int Flush(uint32_t timeout_ms) { return sender_.Flush(timeout_ms); }
  // Any thread, any time; never blocks.
  int Stats(uint64_t* out, size_t n) const;

  // Hot path, producer threads: the calling thread's ring, attaching the
  // thread on its first call; nullptr when no slot can be had. An event
  // that finds no slot is dropped and counted (count_drop);
  // tm_thread_attach() drops no event.
  tokenmeter::client::Ring* LocalRing(bool count_drop = true) {
    return registry_.LocalRing(count_drop);
  }

  void CountRejected() {
    counters_.rejected.fetch_add(1, std::memory_order_relaxed);
  }
  void CountRejected(uint64_t n) {
    counters_.rejected.fetch_add(n, std::memory_order_relaxed);
  }
  // Events dropped outside any ring: a batch call that found no slot (after
  // the one LocalRing() counted).
  void CountDropped(uint64_t n) {
    counters_.dropped_extra.fetch_add(n, std::memory_order_relaxed);
  }

 private:
  // Declaration order is construction order: the sender borrows the
  // registry and the counters, and is destroyed (its thread joined) first.
  tokenmeter::client::ClientCounters counters_;
  tokenmeter::client::ThreadRegistry registry_;
  tokenmeter::client::Sender sender_;
};

#endif  // TOKENMETER_CLIENT_LIB_SRC_CLIENT_H_
