// The thread registry: one ring per producer thread, handed out on the
// thread's first event and cached in a thread_local table, so that the hot
// path finds its ring without a lock. Slots are appended, never removed
// before the registry dies; a slot whose thread exited (orphaned) is reused
// by the next thread that attaches once its events are all drained.
//
// Threads: CachedSlot()/AttachSlow() run on producer threads; everything
// under "consumer side" runs on the sender thread (and the stats caller);
// the destructor runs after the sender thread has been joined.
#ifndef TOKENMETER_CLIENT_LIB_SRC_THREAD_REGISTRY_H_
#define TOKENMETER_CLIENT_LIB_SRC_THREAD_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "counters.h"
#include "ring.h"

namespace tokenmeter::client {

// One producer thread's ring. Shared between the registry (whose sender
// drains it) and the thread (whose thread-local cache points at it):
// reference counted so that whichever of the two goes last frees it.
struct ThreadSlot {
  enum State : int { kFree = 0, kActive = 1, kOrphaned = 2 };

  explicit ThreadSlot(size_t capacity_words) : ring(capacity_words) {}

  Ring ring;
  std::atomic<int> state{kFree};
  std::atomic<int> refs{1};              // the registry's reference
  std::atomic<bool> client_gone{false};  // set when the registry dies

  // Drops one reference; the last one frees the slot.
  static void Unref(ThreadSlot* slot) {
    if (slot->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete slot;
  }
};

// Returns the calling thread's slot for registry `id`, or nullptr when it
// has none yet. Hot path: a thread_local lookup, no lock, no allocation.
ThreadSlot* CachedSlot(uint64_t registry_id);

class ThreadRegistry {
 public:
  // Rings of `buffer_capacity` events each (32 bytes of ring per event), at
  // most `max_threads` of them (the cap on slots). `counters` is borrowed
  // for the registry's life (it counts events dropped for want of a slot).
  ThreadRegistry(size_t buffer_capacity, uint32_t max_threads,
                 ClientCounters& counters);
  ThreadRegistry(const ThreadRegistry&) = delete;
  ThreadRegistry& operator=(const ThreadRegistry&) = delete;
  // Releases the registry's reference on every slot and marks them so that
  // threads drop their cached entries on their next attach. The sender must
  // be stopped.
  ~ThreadRegistry();

  // The id the calling thread's cache is keyed by: CachedSlot(id()) is the
  // hot path's lookup (tm_client::Enter()).
  uint64_t id() const { return id_; }

  // Producer side, a thread that CachedSlot() found nothing for: attaches
  // the thread and returns its ring; nullptr when no slot can be had (all
  // max_threads slots in use, or no memory). An event that finds no slot is
  // dropped and counted (count_drop); tm_thread_attach() drops no event.
  // Takes a mutex and may allocate a ring.
  Ring* AttachSlow(bool count_drop);

  // Consumer side. Slots [0, size()) are valid; size() only grows.
  uint32_t size() const { return n_slots_.load(std::memory_order_acquire); }
  ThreadSlot* slot(uint32_t i) const {
    return slots_[i].load(std::memory_order_relaxed);
  }
  // Frees orphaned slots whose rings are drained, for the next thread.
  void RecycleOrphans();
  bool RingsEmpty() const;
  // Events still in the rings (walks every record: close only).
  uint64_t CountBufferedEvents() const;
  // Events the rings refused because they were full.
  uint64_t RingDrops() const;

 private:
  const uint64_t id_;  // never reused, unlike an address
  const uint32_t max_threads_;
  const size_t ring_words_;
  ClientCounters& counters_;

  // Slots, appended under mu_. The sender reads the first n_slots_ entries
  // without the lock.
  std::mutex mu_;
  std::unique_ptr<std::atomic<ThreadSlot*>[]> slots_;
  std::atomic<uint32_t> n_slots_{0};
};

}  // namespace tokenmeter::client

#endif  // TOKENMETER_CLIENT_LIB_SRC_THREAD_REGISTRY_H_
