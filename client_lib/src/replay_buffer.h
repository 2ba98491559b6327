// The sender's copies of the batches it wrote and the daemon has not acked
// yet (protocol 1.1, "Frame type 3: ACK"): a byte ring of a fixed capacity,
// allocated once when the client is created, holding each batch's events
// (its body) with its seq and event count. The header is not kept: a replay
// gets a fresh one with the batch's original seq and the current
// dropped_total.
//
// Sender thread only; never allocates after construction; no call fails.
#ifndef TOKENMETER_CLIENT_LIB_SRC_REPLAY_BUFFER_H_
#define TOKENMETER_CLIENT_LIB_SRC_REPLAY_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <memory>

namespace tokenmeter::client {

class ReplayBuffer {
 public:
  // One kept batch. `body` points into the ring: valid until the next
  // Push() or Release().
  struct Entry {
    uint64_t seq = 0;
    uint32_t events = 0;
    const uint8_t* body = nullptr;
    size_t size = 0;
  };

  // Reserves `capacity` bytes (rounded up to 8; 0: keeps nothing). The
  // pages become resident as batches are kept. Throws std::bad_alloc.
  explicit ReplayBuffer(size_t capacity);
  ReplayBuffer(const ReplayBuffer&) = delete;
  ReplayBuffer& operator=(const ReplayBuffer&) = delete;

  // Keeps a copy of a batch written with `seq` (above every seq kept).
  // Drops the oldest batches until it fits, and returns the number of
  // events dropped (the batch's own when it is larger than the ring).
  // Each entry costs kEntryOverhead bytes plus its body rounded up to 8.
  uint64_t Push(uint64_t seq, uint32_t events, const uint8_t* body, size_t n);
  // Drops every batch with seq <= `acked`.
  void Release(uint64_t acked);
  // Whether a batch of an `n`-byte body would be kept without dropping
  // any kept one.
  bool FitsWithoutDropping(size_t n) const;
  // Drops every batch; returns their events.
  uint64_t Clear();
  // The oldest batch kept (false: none).
  bool Oldest(Entry* e) const;
  // Drops the oldest batch (one must be kept); returns its events.
  uint64_t PopOldest();

  // The replay pass after a reconnect: Rewind() puts the cursor on the
  // oldest batch; Current() is the batch there (false past the newest one
  // kept when the pass began: a Push() adds after the pass);
  // AdvancePast(seq) moves the cursor past the batches with seq <= `seq`.
  // Dropping the batch under the cursor moves the cursor on.
  void Rewind();
  bool Current(Entry* e) const;
  void AdvancePast(uint64_t seq);
  bool replay_pending() const { return cursor_left_ > 0; }

  bool empty() const { return count_ == 0; }
  size_t count() const { return count_; }
  uint64_t events() const { return events_; }
  size_t capacity() const { return cap_; }

  static constexpr size_t kEntryOverhead = 16;

 private:
  Entry At(size_t off) const;
  size_t NextOffset(size_t off) const;
  bool Fits(size_t need, size_t* at) const;

  const size_t cap_;
  std::unique_ptr<uint8_t[]> buf_;
  size_t head_ = 0;       // oldest entry
  size_t tail_ = 0;       // where the next entry goes
  bool wrapped_ = false;  // tail_ has wrapped to the start, head_ has not
  size_t lap_end_;        // end of the entries before the wrap (cap_ if none)
  size_t count_ = 0;
  uint64_t events_ = 0;
  size_t cursor_ = 0;       // the replay pass's entry
  size_t cursor_left_ = 0;  // entries from cursor_ to the newest one
};

}  // namespace tokenmeter::client

#endif  // TOKENMETER_CLIENT_LIB_SRC_REPLAY_BUFFER_H_
