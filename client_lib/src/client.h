// The client behind the C ABI. A tm_client is two things:
//
//  * the handle (this struct): the counters, the state word the event calls
//    check, and the guards that keep the parts alive while a call uses
//    them. It is never freed: after tm_client_close() it stays behind as a
//    tombstone (1,344 bytes on x86-64, 1 KiB of it the slot cache; on a
//    list of closed clients, so that leak checkers see it reachable) until
//    the process exits, so that a call on a closed handle, or one racing
//    the close, reads valid memory and is refused and counted
//    (tokenmeter.h, tm_client_close()).
//  * the parts (ClientParts), freed at close once no thread can use them:
//      ThreadRegistry (thread_registry.h)  per-thread rings, attach, recycling
//      Sender         (sender.h)           the sender thread: batching,
//                                          connect/backoff, flush and close
//      Transport      (transport.h)        the socket calls, owned by the
//      Sender
//
// Who touches what. An event call reads the handle's hot line (state,
// registry id), its thread's entry in the handle's slot cache and its
// thread's slot (reference counted by the thread's thread_local table,
// thread_registry.h): never the parts, except to attach a thread
// (AttachRing(), under attaching_). Flush, stats and attach hold callers_
// or attaching_ while they use the parts; Close() waits for both to drain
// before it frees them.
//
// fork(): a pthread_atfork child handler marks every open client kForked in
// the child (its sender thread is not there and its socket is the
// parent's): calls are refused and counted, close frees nothing.
#ifndef TOKENMETER_CLIENT_LIB_SRC_CLIENT_H_
#define TOKENMETER_CLIENT_LIB_SRC_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "counters.h"
#include "encoder.h"
#include "ring.h"
#include "sender.h"
#include "thread_registry.h"
#include "tokenmeter/tokenmeter.h"
#include "transport.h"
#include "value_table.h"

struct tm_options {
  std::string socket_path = TM_DEFAULT_SOCKET_PATH;
  tokenmeter::client::HelloMeta meta;
  size_t buffer_capacity = 65536;
  uint32_t flush_interval_ms = 20;
  uint32_t close_timeout_ms = 1000;
  uint32_t max_threads = 64;
  bool ack = true;
  size_t replay_bytes = size_t{4} << 20;
  // Internal, for tests only (no C setter): makes the client's transport.
  // Empty: the Unix socket at socket_path.
  tokenmeter::client::TransportFactory make_transport;
};

namespace tokenmeter::client {

// What a client frees at close. Declaration order is construction order:
// the sender borrows the registry, and is destroyed (its thread joined)
// first.
struct ClientParts {
  ClientParts(const tm_options& opts, ClientCounters& counters,
              ThreadSlotCache& cache);
  ThreadRegistry registry;
  ValueTable values;  // the sender reads it
  Sender sender;
};

}  // namespace tokenmeter::client

struct tm_client {
 public:
  // The state word every event call reads.
  enum State : int { kOpen = 0, kClosed = 1, kForked = 2 };

  // Builds the parts; starts nothing. Throws std::bad_alloc (and whatever
  // opts.make_transport throws); tm_client_new() catches. The handle is
  // then never deleted: use New(), which also registers it for fork().
  explicit tm_client(const tm_options& opts);
  tm_client(const tm_client&) = delete;
  tm_client& operator=(const tm_client&) = delete;

  // Creates, starts and registers a client. TM_OK and *out, or TM_E_NOMEM,
  // TM_E_SYSTEM (nothing is left behind then).
  static int New(const tm_options& opts, tm_client** out);

  // tm_client_close(): see tokenmeter.h. Any thread; once per handle does
  // the work, later or concurrent calls return TM_E_CLOSED.
  int Close(uint64_t* stats_out, size_t n);
  // tm_client_flush(), tm_client_stats(), tm_thread_attach(): any thread;
  // TM_E_CLOSED / TM_E_FORKED once the client is closed or inherited.
  int Flush(uint32_t timeout_ms);
  int Stats(uint64_t* out, size_t n) const;
  int Attach();
  // tm_register_value(): see tokenmeter.h. Any thread; TM_E_CLOSED /
  // TM_E_FORKED once the client is closed or inherited.
  int RegisterValue(const char* value);

  // ---- hot path (producer threads) -----------------------------------------
  // An event call brackets its ring access with Enter() and Leave():
  //   Ring* r; int rc = c->Enter(&r); if (rc != TM_OK) return rc;
  //   ... reserve, write, commit ...; c->Leave(r);
  // Enter() returns TM_OK with the calling thread's ring marked "in a call"
  // (attaching the thread on its first call), or TM_E_CLOSED / TM_E_FORKED
  // (the event counted as rejected) or TM_E_DROPPED (no thread slot,
  // counted). Cost on a cached thread: the thread pointer, one entry of
  // slot_cache_ and the ring's producer (loads, no call, no thread-local
  // storage: ThreadSlotCache::Find()), one store to the ring's own line,
  // one acquire load of state_; no read-modify-write. See Close() for why
  // that suffices. A thread the cache has no entry for takes EnterSlow().
  int Enter(tokenmeter::client::Ring** ring, uint64_t events = 1) {
    tokenmeter::client::ThreadSlot* slot;
    if (!slot_cache_.Find(&slot)) [[unlikely]]
      return EnterSlow(ring, events);
    return EnterSlot(slot, ring, events);
  }
  static void Leave(tokenmeter::client::Ring* ring) { ring->EndCall(); }
  // Enter() for a lean path that has a full call to fall back on: the
  // thread's ring marked "in a call" when the thread is cached and the
  // client open, else nullptr with nothing marked or counted (the caller
  // then makes its call through Enter()). No call, no out-parameter: a
  // caller can stay a leaf function.
  tokenmeter::client::Ring* TryEnter() {
    tokenmeter::client::ThreadSlot* slot;
    if (!slot_cache_.Find(&slot) || BeginCall(slot) != kOpen) [[unlikely]]
      return nullptr;
    tokenmeter::client::Ring* const ring = &slot->ring;
    if (ring == nullptr) __builtin_unreachable();  // a member's address
    return ring;
  }

  // TM_OK while open, else the code a call on this client returns (the
  // call's `events` counted as rejected). For calls that reject their
  // arguments before Enter().
  int CheckOpen(uint64_t events) {
    const int state = state_.load(std::memory_order_acquire);
    return state == kOpen ? TM_OK : Refuse(state, events);
  }

  // True when `id` is one tm_register_value() returned on this client (0
  // is not). One relaxed load of the line Enter() reads: an id a thread
  // holds was published (release) before that thread could learn it.
  bool ValidValueId(uint32_t id) const { return id - 1 < ValueIds(); }
  uint32_t ValueIds() const {
    return value_ids_.load(std::memory_order_relaxed);
  }
  void CountRejected(uint64_t n = 1) {
    counters_.rejected.fetch_add(n, std::memory_order_relaxed);
  }
  void CountFieldsDropped(uint64_t n) {
    counters_.fields_dropped.fetch_add(n, std::memory_order_relaxed);
  }
  // Events dropped outside any ring: a batch call that found no slot (after
  // the one the attach counted).
  void CountDropped(uint64_t n) {
    counters_.dropped_extra.fetch_add(n, std::memory_order_relaxed);
  }

  // fork() child handler (client.cpp): marks the client inert and closes
  // the child's copies of its descriptors. Only the forking thread exists.
  void ForgetAfterFork();

  // Links in the process-wide lists of open and of closed clients (the
  // fork handler's, and the tombstones'; guarded by a mutex in client.cpp).
  tm_client* prev_ = nullptr;
  tm_client* next_ = nullptr;

 private:
  // Out of line: Enter() for a thread that is not in slot_cache_'s first
  // entries (ThreadSlotCache::FindSlow()), or not attached (AttachRing()).
  int EnterSlow(tokenmeter::client::Ring** ring, uint64_t events);
  // Marks the slot's ring "in a call" and returns the client's state,
  // the mark undone when it is not kOpen (Enter()'s store and load: see
  // Close()).
  int BeginCall(tokenmeter::client::ThreadSlot* slot) {
    slot->ring.BeginCall();
    const int state = state_.load(std::memory_order_acquire);
    if (state != kOpen) [[unlikely]]
      slot->ring.EndCall();
    return state;
  }
  // The rest of Enter(), once the thread's slot is found.
  int EnterSlot(tokenmeter::client::ThreadSlot* slot,
                tokenmeter::client::Ring** ring, uint64_t events) {
    const int state = BeginCall(slot);
    if (state != kOpen) [[unlikely]]
      return Refuse(state, events);
    *ring = &slot->ring;
    return TM_OK;
  }
  int AttachRing(tokenmeter::client::Ring** ring, uint64_t events);
  int Refuse(int state, uint64_t events) {
    CountRejected(events);
    return state == kForked ? TM_E_FORKED : TM_E_CLOSED;
  }
  // The parts while they exist; callers hold callers_ (or attaching_).
  tokenmeter::client::ClientParts* Parts() const {
    return parts_.load(std::memory_order_seq_cst);
  }

  // Line 0: counters (the sender writes them per batch).
  tokenmeter::client::ClientCounters counters_;
  // Line 1, read by every event call: written once at close or fork.
  alignas(64) std::atomic<int> state_{kOpen};
  uint64_t registry_id_ = 0;  // set by the constructor, then read-only
  // The number of registered values (ids 1 .. value_ids_), stored by the
  // value table under its mutex.
  std::atomic<uint32_t> value_ids_{0};
  // Lines 2 to 17 (1 KiB): each thread's slot by its thread pointer, written
  // when a thread attaches or lets its slot go. In the handle, never freed, so
  // that an event call may read it after close; before the parts, which
  // borrow it.
  tokenmeter::client::ThreadSlotCache slot_cache_;
  // Then the slow paths' guards and the parts.
  alignas(64) mutable std::atomic<uint32_t> callers_{0};  // flush, stats
  std::atomic<uint32_t> attaching_{0};                    // AttachRing()
  std::atomic<tokenmeter::client::ClientParts*> parts_{nullptr};
  std::unique_ptr<tokenmeter::client::ClientParts> owned_parts_;
  // Ring drops at close, for the tombstone's stats (written before parts_
  // is cleared).
  uint64_t final_ring_drops_ = 0;
};

#endif  // TOKENMETER_CLIENT_LIB_SRC_CLIENT_H_
