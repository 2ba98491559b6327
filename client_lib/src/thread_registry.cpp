#include "thread_registry.h"

#include <algorithm>
#include <new>

namespace tokenmeter::client {
namespace {

// Ids are never reused, so a thread's cache entry can never match a later
// registry that happens to live at the same address.
std::atomic<uint64_t> next_registry_id{1};

// The thread's slots, one per registry it attached to, with the entry its
// client's ThreadSlotCache holds for it (nullptr: none, the bucket was
// full). Holds the thread's reference on each slot.
struct TlsEntry {
  uint64_t registry_id;
  ThreadSlot* slot;
  ThreadSlotCache::Entry* cached;
};
constexpr int kTlsEntries = 8;

// Trivially destructible so that the lookup needs no TLS guard; the reaper
// below (touched only when attaching) releases the slots when the thread
// exits.
thread_local TlsEntry tls_entries[kTlsEntries];

// Lets the slot go, in this order: the cache entry first (the thread's
// lookups no longer find it, and a thread that later gets this thread
// pointer finds it free), then the ring's producer, then the state that
// lets another thread adopt the slot; the reference last. The client's
// handle, where the cache entry lives, is never freed.
void ReleaseEntry(TlsEntry& e, bool orphan) {
  if (e.cached != nullptr) ThreadSlotCache::Erase(e.cached);
  if (orphan) {
    e.slot->ring.SetProducer(0);
    e.slot->state.store(ThreadSlot::kOrphaned, std::memory_order_release);
  }
  ThreadSlot::Unref(e.slot);
  e = TlsEntry{0, nullptr, nullptr};
}

struct TlsReaper {
  ~TlsReaper() {
    for (TlsEntry& e : tls_entries) {
      if (e.slot != nullptr) ReleaseEntry(e, /*orphan=*/true);
    }
  }
};
thread_local TlsReaper tls_reaper;

size_t RingWords(size_t capacity_events) {
  // 32 bytes = 4 words per event of capacity.
  size_t words = 1;
  while (words < capacity_events * 4) words <<= 1;
  return words;
}

}  // namespace

ThreadSlot* CachedSlot(uint64_t registry_id) {
  if (tls_entries[0].registry_id == registry_id) [[likely]]
    return tls_entries[0].slot;
  for (int i = 1; i < kTlsEntries; ++i) {
    if (tls_entries[i].registry_id == registry_id) {
      std::swap(tls_entries[0], tls_entries[i]);
      return tls_entries[0].slot;
    }
  }
  return nullptr;
}

ThreadSlot* ThreadSlotCache::FindSlow(uint64_t registry_id) const {
  if constexpr (kHaveThreadPointer) {
    const uintptr_t self = ThreadPointer();
    const Bucket& b = buckets_[BucketOf(self)];
    for (int i = 1; i < kWays; ++i) {
      const Entry& e = b.entries[i];
      if (e.thread.load(std::memory_order_relaxed) != self) continue;
      ThreadSlot* slot = e.slot.load(std::memory_order_relaxed);
      if (slot->ring.producer() == self) return slot;
    }
  }
  return CachedSlot(registry_id);
}

ThreadSlotCache::Entry* ThreadSlotCache::Insert(ThreadSlot* slot) {
  if constexpr (!kHaveThreadPointer) return nullptr;
  const uintptr_t self = ThreadPointer();
  // Inserts are serialised by the registry's mutex; an Erase() may run
  // meanwhile, but only on an entry that is not free.
  for (Entry& e : buckets_[BucketOf(self)].entries) {
    if (e.thread.load(std::memory_order_acquire) != 0) continue;
    e.slot.store(slot, std::memory_order_relaxed);
    e.thread.store(self, std::memory_order_release);
    return &e;
  }
  return nullptr;
}

ThreadRegistry::ThreadRegistry(size_t buffer_capacity, uint32_t max_threads,
                               ClientCounters& counters, ThreadSlotCache& cache)
    : id_(next_registry_id.fetch_add(1)),
      max_threads_(max_threads),
      ring_words_(RingWords(buffer_capacity)),
      counters_(counters),
      cache_(cache),
      slots_(new std::atomic<ThreadSlot*>[max_threads]) {
  for (uint32_t i = 0; i < max_threads_; ++i) slots_[i] = nullptr;
}

ThreadRegistry::~ThreadRegistry() {
  const uint32_t n = n_slots_.load();
  for (uint32_t i = 0; i < n; ++i) {
    ThreadSlot* s = slots_[i].load();
    s->client_gone.store(true, std::memory_order_release);
    ThreadSlot::Unref(s);
  }
}

Ring* ThreadRegistry::AttachSlow(bool count_drop) {
  std::lock_guard<std::mutex> l(mu_);
  // Forget slots of registries that are gone, and find a free entry.
  TlsEntry* free_entry = nullptr;
  for (TlsEntry& e : tls_entries) {
    if (e.slot != nullptr &&
        e.slot->client_gone.load(std::memory_order_acquire)) {
      ReleaseEntry(e, /*orphan=*/false);
    }
    if (e.slot == nullptr && free_entry == nullptr) free_entry = &e;
  }
  ThreadSlot* slot = nullptr;
  if (free_entry != nullptr) {
    const uint32_t n = n_slots_.load(std::memory_order_relaxed);
    for (uint32_t i = 0; i < n && slot == nullptr; ++i) {
      ThreadSlot* s = slots_[i].load(std::memory_order_relaxed);
      // A free slot, or one whose thread exited and whose events are all
      // sent: the latter is taken now rather than after the sender's next
      // RecycleOrphans() pass (which may race us to kFree; then retry).
      int state = s->state.load(std::memory_order_acquire);
      while (state == ThreadSlot::kFree || (state == ThreadSlot::kOrphaned &&
                                            s->ring.head() == s->ring.tail())) {
        if (s->state.compare_exchange_weak(state, ThreadSlot::kActive)) {
          slot = s;
          break;
        }
      }
    }
    if (slot == nullptr && n < max_threads_) {
      auto* s = new (std::nothrow) ThreadSlot(ring_words_);
      if (s != nullptr && s->ring.ok()) {
        s->state.store(ThreadSlot::kActive, std::memory_order_relaxed);
        slots_[n].store(s, std::memory_order_release);
        n_slots_.store(n + 1, std::memory_order_release);
        slot = s;
      } else {
        delete s;
      }
    }
  }
  if (slot == nullptr) {
    if (count_drop) {
      counters_.dropped_extra.fetch_add(1, std::memory_order_relaxed);
    }
    return nullptr;
  }
  slot->refs.fetch_add(1, std::memory_order_relaxed);
  slot->ring.SetProducer(ThreadPointer());
  *free_entry = TlsEntry{id_, slot, cache_.Insert(slot)};
  // Registers the thread-exit hook that releases this thread's slots.
  [[maybe_unused]] volatile auto* reaper = &tls_reaper;
  return &slot->ring;
}

void ThreadRegistry::RecycleOrphans() {
  const uint32_t n = size();
  for (uint32_t i = 0; i < n; ++i) {
    ThreadSlot* s = slot(i);
    if (s->state.load(std::memory_order_acquire) != ThreadSlot::kOrphaned) {
      continue;
    }
    if (s->ring.head() != s->ring.tail()) continue;
    int expected = ThreadSlot::kOrphaned;
    s->state.compare_exchange_strong(expected, ThreadSlot::kFree);
  }
}

bool ThreadRegistry::RingsEmpty() const {
  const uint32_t n = size();
  for (uint32_t i = 0; i < n; ++i) {
    const Ring& r = slot(i)->ring;
    if (r.head() != r.tail()) return false;
  }
  return true;
}

uint64_t ThreadRegistry::CountBufferedEvents() const {
  uint64_t events = 0;
  const uint32_t n = size();
  for (uint32_t i = 0; i < n; ++i) {
    const Ring& r = slot(i)->ring;
    for (uint64_t p = r.head(), tail = r.tail(); p < tail;) {
      const uint64_t* rec = r.At(p);
      if (HeaderKind(*rec) != kPadKind) ++events;
      p += HeaderWords(*rec);
    }
  }
  return events;
}

uint64_t ThreadRegistry::RingDrops() const {
  uint64_t total = 0;
  const uint32_t n = size();
  for (uint32_t i = 0; i < n; ++i) total += slot(i)->ring.dropped();
  return total;
}

}  // namespace tokenmeter::client
