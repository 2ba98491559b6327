#include "replay_buffer.h"

#include <cstring>

namespace tokenmeter::client {
namespace {

constexpr size_t RoundUp8(size_t n) { return (n + 7) & ~size_t{7}; }

// Entry header, kEntryOverhead bytes: seq, body size, events.
struct Header {
  uint64_t seq;
  uint32_t size;
  uint32_t events;
};
static_assert(sizeof(Header) == ReplayBuffer::kEntryOverhead);

}  // namespace

ReplayBuffer::ReplayBuffer(size_t capacity)
    : cap_(RoundUp8(capacity)),
      buf_(cap_ > 0 ? new uint8_t[cap_] : nullptr),
      lap_end_(cap_) {}

ReplayBuffer::Entry ReplayBuffer::At(size_t off) const {
  Header h{};
  std::memcpy(&h, buf_.get() + off, sizeof h);
  return Entry{h.seq, h.events, buf_.get() + off + sizeof h, h.size};
}

size_t ReplayBuffer::NextOffset(size_t off) const {
  const size_t next = off + sizeof(Header) + RoundUp8(At(off).size);
  return next == lap_end_ ? 0 : next;
}

// Where an entry of `need` bytes goes without overwriting a kept one:
// after the newest, or (not yet wrapped) at the start, before the oldest.
bool ReplayBuffer::Fits(size_t need, size_t* at) const {
  if (wrapped_) {
    *at = tail_;
    return tail_ + need <= head_;
  }
  if (tail_ + need <= cap_) {
    *at = tail_;
    return true;
  }
  *at = 0;
  return need <= head_;
}

bool ReplayBuffer::Oldest(Entry* e) const {
  if (count_ == 0) return false;
  *e = At(head_);
  return true;
}

uint64_t ReplayBuffer::PopOldest() {
  const Entry e = At(head_);
  const bool cursor_here = cursor_left_ == count_;
  const size_t next = NextOffset(head_);
  if (next == 0 && wrapped_) {
    wrapped_ = false;
    lap_end_ = cap_;
  }
  head_ = next;
  --count_;
  events_ -= e.events;
  if (cursor_here) {
    cursor_ = head_;
    --cursor_left_;
  }
  if (count_ == 0) {
    head_ = tail_ = cursor_ = 0;
    wrapped_ = false;
    lap_end_ = cap_;
  }
  return e.events;
}

uint64_t ReplayBuffer::Push(uint64_t seq, uint32_t events, const uint8_t* body,
                            size_t n) {
  const size_t need = sizeof(Header) + RoundUp8(n);
  if (need > cap_ || n > UINT32_MAX) return events;
  uint64_t dropped = 0;
  size_t at = 0;
  while (!Fits(need, &at)) dropped += PopOldest();
  if (at != tail_) {  // the start: the entries before it end at tail_
    wrapped_ = true;
    lap_end_ = tail_;
  }
  const Header h{seq, uint32_t(n), events};
  std::memcpy(buf_.get() + at, &h, sizeof h);
  if (n > 0) std::memcpy(buf_.get() + at + sizeof h, body, n);
  tail_ = at + need;
  ++count_;
  events_ += events;
  return dropped;
}

void ReplayBuffer::Release(uint64_t acked) {
  while (count_ > 0 && At(head_).seq <= acked) PopOldest();
}

bool ReplayBuffer::FitsWithoutDropping(size_t n) const {
  const size_t need = sizeof(Header) + RoundUp8(n);
  size_t at = 0;
  return need <= cap_ && n <= UINT32_MAX && Fits(need, &at);
}

uint64_t ReplayBuffer::Clear() {
  uint64_t events = 0;
  while (count_ > 0) events += PopOldest();
  return events;
}

void ReplayBuffer::Rewind() {
  cursor_ = head_;
  cursor_left_ = count_;
}

bool ReplayBuffer::Current(Entry* e) const {
  if (cursor_left_ == 0) return false;
  *e = At(cursor_);
  return true;
}

void ReplayBuffer::AdvancePast(uint64_t seq) {
  while (cursor_left_ > 0 && At(cursor_).seq <= seq) {
    cursor_ = NextOffset(cursor_);
    --cursor_left_;
  }
}

}  // namespace tokenmeter::client
