// A flat hash index from 64-bit hashes to 32-bit handles: the tracker's
// look-up of a request by its id (daemon/ingest/tracker.h).
//
// Open addressing with linear probing in one array of 8-byte slots (the
// hash's upper half and the handle), at most 3/4 full, deletion by
// backward shift (no tombstones): a look-up reads one cache line in the
// common case, where a node-based map reads a bucket and then a node.
// The caller keeps the keys; Find() asks it to compare the handles whose
// hash halves match. Handles are the caller's (e.g. slots of a slab):
// 0 .. 2^32 - 2.
//
// Not thread-safe; O(1) expected per call, Insert() O(size) when it grows
// the array (doubling, from 16 slots).
#ifndef TOKENMETER_DAEMON_INGEST_REQUEST_INDEX_H_
#define TOKENMETER_DAEMON_INGEST_REQUEST_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tokenmeter::daemon {

class RequestIndex {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  RequestIndex() : slots_(kMinSlots), mask_(kMinSlots - 1) {}

  size_t size() const { return size_; }
  // Slots in the array (a power of two).
  size_t capacity() const { return slots_.size(); }

  // Starts loading the line a look-up of `hash` reads first.
  void Prefetch(uint64_t hash) const {
    __builtin_prefetch(&slots_[Home(Tag(hash))]);
  }

  // The handle stored with `hash` for which same(handle) holds, else
  // kNone. `same` is called only for handles whose hash shares its upper
  // 32 bits with `hash`.
  template <typename Same>
  uint32_t Find(uint64_t hash, Same&& same) const {
    const uint32_t tag = Tag(hash);
    for (size_t i = Home(tag);; i = (i + 1) & mask_) {
      const Slot s = slots_[i];
      if (s.handle1 == 0) return kNone;
      if (s.tag == tag && same(s.handle1 - 1)) return s.handle1 - 1;
    }
  }

  // Adds `handle` under `hash`; the caller has made sure no equal key is
  // present. Throws std::bad_alloc when the array cannot grow (nothing
  // changed then).
  void Insert(uint64_t hash, uint32_t handle) {
    if ((size_ + 1) * 4 > slots_.size() * 3) Grow();
    Place(Slot{Tag(hash), handle + 1});
    ++size_;
  }

  // Removes `handle`, stored under `hash` (it must be there).
  void Erase(uint64_t hash, uint32_t handle) {
    size_t i = Home(Tag(hash));
    while (slots_[i].handle1 != handle + 1) i = (i + 1) & mask_;
    // Backward shift: each later slot of the run moves into the hole
    // unless its home lies cyclically in (hole, slot].
    for (size_t j = (i + 1) & mask_; slots_[j].handle1 != 0;
         j = (j + 1) & mask_) {
      const size_t home = Home(slots_[j].tag);
      const bool stays =
          i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    --size_;
  }

  // The longest run of occupied slots: what a look-up may walk at worst.
  // O(capacity): for tests and diagnostics.
  size_t LongestRun() const {
    size_t empty = 0;  // there is one: the array is at most 3/4 full
    while (slots_[empty].handle1 != 0) ++empty;
    size_t longest = 0, run = 0;
    for (size_t k = 1; k <= slots_.size(); ++k) {
      run = slots_[(empty + k) & mask_].handle1 != 0 ? run + 1 : 0;
      if (run > longest) longest = run;
    }
    return longest;
  }

  // Grows the array so that `n` handles fit without growing again.
  void Reserve(size_t n) {
    while (n * 4 > slots_.size() * 3) Grow();
  }

 private:
  static constexpr size_t kMinSlots = 16;
  struct Slot {
    uint32_t tag = 0;      // the hash's upper half; its low bits: home
    uint32_t handle1 = 0;  // handle + 1; 0: empty
  };

  static uint32_t Tag(uint64_t hash) { return uint32_t(hash >> 32); }
  size_t Home(uint32_t tag) const { return tag & mask_; }
  void Place(Slot s) {
    size_t i = Home(s.tag);
    while (slots_[i].handle1 != 0) i = (i + 1) & mask_;
    slots_[i] = s;
  }
  void Grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.handle1 != 0) Place(s);
    }
  }

  std::vector<Slot> slots_;
  size_t mask_;
  size_t size_ = 0;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_INGEST_REQUEST_INDEX_H_
