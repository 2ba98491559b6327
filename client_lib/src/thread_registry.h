// The thread registry: one ring per producer thread, handed out on the
// thread's first event. The thread finds its ring again without a lock
// through its client's ThreadSlotCache (keyed by the thread pointer, no
// thread-local storage on the hot path) and, when that has no room for it,
// through a thread_local table (CachedSlot()), which also holds the
// thread's references and releases them when it exits. Slots are appended,
// never removed before the registry dies; a slot whose thread exited
// (orphaned) is reused by the next thread that attaches once its events
// are all drained.
//
// Threads: ThreadSlotCache::Find(), CachedSlot() and AttachSlow() run on
// producer threads; everything under "consumer side" runs on the sender
// thread (and the stats caller); the destructor runs after the sender
// thread has been joined.
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
// has none yet: a thread_local lookup, no lock, no allocation. In a shared
// library that is a call to __tls_get_addr; the event calls look in the
// client's ThreadSlotCache first and come here only when it has no entry
// for the thread.
ThreadSlot* CachedSlot(uint64_t registry_id);

// Whether the compiler gives the thread pointer (GCC and Clang on x86-64,
// AArch64 and most other Linux targets). Without it ThreadSlotCache stays
// empty and every lookup is CachedSlot()'s.
#if defined(__has_builtin)
#if __has_builtin(__builtin_thread_pointer)
#define TOKENMETER_HAVE_THREAD_POINTER 1
#endif
#endif
#ifdef TOKENMETER_HAVE_THREAD_POINTER
inline constexpr bool kHaveThreadPointer = true;
#else
inline constexpr bool kHaveThreadPointer = false;
#endif

// The calling thread's thread pointer (its TCB's address: %fs:0 on x86-64,
// TPIDR_EL0 on AArch64), one register or %fs-relative load in any TLS
// model. Nonzero and unique among the process's live threads; a thread
// created after another exited may get the same value (glibc reuses a
// joined thread's stack, and the TCB at its top). 0 without the builtin.
inline uintptr_t ThreadPointer() {
#ifdef TOKENMETER_HAVE_THREAD_POINTER
  return reinterpret_cast<uintptr_t>(__builtin_thread_pointer());
#else
  return 0;
#endif
}

// One client's map from thread pointer to the thread's slot: how an event
// call finds its ring without thread-local storage, which in a shared
// library costs a call to __tls_get_addr (docs/performance.md, "Where the
// time goes"). It lives in the client's handle, which is never freed, so a
// lookup may read it even on a closed client.
//
// 16 buckets of 4 entries, one bucket per cache line, picked by a hash of
// the thread pointer. The hot path (Find()) reads the bucket's first entry;
// FindSlow() the other three, then CachedSlot(). An entry is written when
// its thread attaches (Insert(), under the registry's mutex, into a free
// entry) and when that thread lets the slot go (Erase(): at its exit, or at
// its next attach once the client has closed), never on the hot path:
// threads that share a bucket share a line that they only read. A thread
// whose bucket is full gets no entry and finds its slot through
// CachedSlot() (correct, at about the cost of every lookup before this
// cache).
//
// Why a thread never reaches another thread's ring through it:
//  * an entry holding thread pointer P is written only by the thread that
//    has P, which erases it (P replaced by 0) before it releases the slot
//    and before it exits; a later thread that gets P was created after
//    that exit, so it sees 0, never the old entry;
//  * a lookup compares P before it reads the slot, so it reads only a slot
//    that its own thread holds a reference to (never one another thread
//    may be freeing);
//  * the slot is used only when its ring names P as its producer
//    (Ring::producer(), set at attach, cleared at release, before the slot
//    can be adopted by another thread): even an entry left behind by
//    mistake could not hand over a ring that another thread now fills.
class ThreadSlotCache {
 public:
  struct Entry {
    std::atomic<uintptr_t> thread{0};  // the thread pointer; 0: free
    // Valid while `thread` is not 0; written before `thread`.
    std::atomic<ThreadSlot*> slot{nullptr};
  };

  ThreadSlotCache() = default;
  ThreadSlotCache(const ThreadSlotCache&) = delete;
  ThreadSlotCache& operator=(const ThreadSlotCache&) = delete;

  // Hot path: true and the calling thread's slot in *slot when the first
  // entry of its bucket is its own (else FindSlow()). Loads only: the
  // thread pointer, one entry, the ring's producer (on the line the event
  // call writes next).
  bool Find(ThreadSlot** slot) const {
    if constexpr (kHaveThreadPointer) {
      const uintptr_t self = ThreadPointer();
      const Entry& e = buckets_[BucketOf(self)].entries[0];
      if (e.thread.load(std::memory_order_relaxed) == self) [[likely]] {
        *slot = e.slot.load(std::memory_order_relaxed);
        return (*slot)->ring.producer() == self;
      }
    }
    return false;
  }

  // Out of line, when Find() found nothing: the bucket's other entries,
  // then CachedSlot(registry_id); nullptr when the thread is not attached.
  ThreadSlot* FindSlow(uint64_t registry_id) const;

  // Attach, under the registry's mutex: maps the calling thread to `slot`
  // in a free entry of its bucket and returns the entry (for Erase()), or
  // nullptr when the bucket is full or there is no thread pointer.
  Entry* Insert(ThreadSlot* slot);
  // The thread that Insert()ed `e`, before it lets the slot go.
  static void Erase(Entry* e) { e->thread.store(0, std::memory_order_release); }

 private:
  static constexpr int kBucketBits = 4;
  static constexpr int kWays = 4;
  struct alignas(64) Bucket {
    Entry entries[kWays];
  };

  // The page number's low bits (the offset in the page is the same for
  // every thread). glibc's thread stacks, with the TCB at their top, are a
  // stack size plus a guard page apart: with the default sizes (a power of
  // two and one page) an odd number of pages, so threads created one after
  // another take the buckets in turn, 16 of them before two share one.
  // (A multiplicative hash measured worse on such strides: 2049 pages, the
  // default 8 MiB stack and its guard page, repeats every third thread.)
  static size_t BucketOf(uintptr_t thread) {
    return size_t(thread >> 12) & ((size_t{1} << kBucketBits) - 1);
  }

  Bucket buckets_[1 << kBucketBits];
};

class ThreadRegistry {
 public:
  // Rings of `buffer_capacity` events each (32 bytes of ring per event), at
  // most `max_threads` of them (the cap on slots). `counters` is borrowed
  // for the registry's life (it counts events dropped for want of a slot);
  // `cache` is the client's, which outlives the registry (threads erase
  // their entries from it after the registry is gone).
  ThreadRegistry(size_t buffer_capacity, uint32_t max_threads,
                 ClientCounters& counters, ThreadSlotCache& cache);
  ThreadRegistry(const ThreadRegistry&) = delete;
  ThreadRegistry& operator=(const ThreadRegistry&) = delete;
  // Releases the registry's reference on every slot and marks them so that
  // threads drop their cached entries on their next attach. The sender must
  // be stopped.
  ~ThreadRegistry();

  // The id the calling thread's thread_local cache is keyed by:
  // CachedSlot(id()) (tm_client::Enter(), through ThreadSlotCache::FindSlow()).
  uint64_t id() const { return id_; }

  // Producer side, a thread that ThreadSlotCache::FindSlow() found nothing for:
  // attaches the thread (an entry in the cache when its bucket has room,
  // one in its thread_local table) and returns its ring; nullptr when no
  // slot can be had (all
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
  ThreadSlotCache& cache_;

  // Slots, appended under mu_. The sender reads the first n_slots_ entries
  // without the lock.
  std::mutex mu_;
  std::unique_ptr<std::atomic<ThreadSlot*>[]> slots_;
  std::atomic<uint32_t> n_slots_{0};
};

}  // namespace tokenmeter::client

#endif  // TOKENMETER_CLIENT_LIB_SRC_THREAD_REGISTRY_H_
