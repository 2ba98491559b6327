// AdapterSlots: the scheduler's view of the backend's LoRA adapter slots
// (--max-lora of them): which adapter each slot holds, how many running
// requests use it, and which one to evict. An adapter is resident while it
// occupies a slot; a running request pins its adapter's slot. Making an
// adapter resident takes an empty slot if there is one, else evicts the
// least recently used adapter that no running request uses (LRU by the last
// time a request took or released it). When every slot is pinned by other
// adapters, the adapter cannot be made resident and its request waits.
//
// Adapters are numbered 0..N-1 (-1 is the base model, never passed here).
// Memory: O(slots + highest adapter number). Every call is O(1) but
// Acquire() of a non-resident adapter, O(slots). Not thread-safe: the
// scheduler owns it.
#ifndef TOKENMETER_ENGINE_LORA_SLOTS_H_
#define TOKENMETER_ENGINE_LORA_SLOTS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tokenmeter::engine {

// One adapter upload the backend must do before the step's forward pass.
struct AdapterLoad {
  int32_t slot = -1;
  int32_t adapter = -1;
  int32_t evicted = -1;  // the adapter the slot held, -1 when it was empty
};

class AdapterSlots {
 public:
  explicit AdapterSlots(uint32_t num_slots);
  AdapterSlots(const AdapterSlots&) = delete;
  AdapterSlots& operator=(const AdapterSlots&) = delete;

  uint32_t num_slots() const { return uint32_t(slots_.size()); }
  // The slot holding `adapter`, or -1 when it is not resident.
  int32_t SlotOf(int32_t adapter) const {
    return size_t(adapter) < slot_of_.size() ? slot_of_[size_t(adapter)] : -1;
  }
  // Slots no running request pins (empty ones included).
  uint32_t num_idle() const { return idle_; }
  // True when `adapter` is resident, or a slot is empty or idle.
  bool CanAcquire(int32_t adapter) const {
    return SlotOf(adapter) >= 0 || idle_ > 0;
  }
  // Makes `adapter` resident (see above) and pins its slot for one more
  // user. Returns the slot. When the adapter had to be loaded, sets *load
  // (the caller uploads it before the slot is used) and returns true in
  // *loaded. Aborts unless CanAcquire(adapter).
  int32_t Acquire(int32_t adapter, AdapterLoad* load, bool* loaded);
  // One user of `adapter` is done (it finished or was preempted). The
  // adapter stays resident. Aborts when it has no user.
  void Release(int32_t adapter);

 private:
  struct Slot {
    int32_t adapter = -1;  // -1: empty
    uint32_t users = 0;
    uint64_t last_used = 0;  // tick of the last Acquire/Release
  };
  std::vector<Slot> slots_;
  std::vector<int32_t> slot_of_;  // adapter -> slot or -1
  uint32_t idle_;                 // slots with users == 0
  uint64_t tick_ = 0;
};

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_LORA_SLOTS_H_
