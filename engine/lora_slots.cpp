#include "engine/lora_slots.h"

#include <cstdlib>

namespace tokenmeter::engine {

AdapterSlots::AdapterSlots(uint32_t num_slots)
    : slots_(num_slots), idle_(num_slots) {}

int32_t AdapterSlots::Acquire(int32_t adapter, AdapterLoad* load,
                              bool* loaded) {
  if (adapter < 0) std::abort();
  *loaded = false;
  int32_t s = SlotOf(adapter);
  if (s < 0) {
    // An empty slot first, else the least recently used idle one.
    int32_t lru = -1;
    for (size_t i = 0; i < slots_.size() && s < 0; ++i) {
      const Slot& c = slots_[i];
      if (c.users > 0) continue;
      if (c.adapter < 0) {
        s = int32_t(i);
      } else if (lru < 0 || c.last_used < slots_[size_t(lru)].last_used) {
        lru = int32_t(i);
      }
    }
    if (s < 0) s = lru;
    if (s < 0) std::abort();  // every slot pinned: CanAcquire() was false
    Slot& victim = slots_[size_t(s)];
    *load = {s, adapter, victim.adapter};
    *loaded = true;
    if (victim.adapter >= 0) slot_of_[size_t(victim.adapter)] = -1;
    victim.adapter = adapter;
    if (size_t(adapter) >= slot_of_.size()) {
      slot_of_.resize(size_t(adapter) + 1, -1);
    }
    slot_of_[size_t(adapter)] = s;
  }
  Slot& slot = slots_[size_t(s)];
  if (slot.users++ == 0) --idle_;
  slot.last_used = ++tick_;
  return s;
}

void AdapterSlots::Release(int32_t adapter) {
  const int32_t s = SlotOf(adapter);
  if (s < 0) std::abort();
  Slot& slot = slots_[size_t(s)];
  if (slot.users == 0) std::abort();
  if (--slot.users == 0) ++idle_;
  slot.last_used = ++tick_;
}

}  // namespace tokenmeter::engine
