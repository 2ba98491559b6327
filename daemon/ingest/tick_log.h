// The TOKENS ticks of every tracked request, for the requests API's
// timelines (trace/timeline.h `tokens`), in one ring shared by all
// requests: an append is a sequential 16-byte store and an update of the
// request's 8-byte handle, with no allocation and no memory of its own per
// request (a per-request list halved ingest: an allocation per request, a
// cache miss per TOKENS, and memory growing with every request's output).
//
// Each entry links back to its request's previous tick, so a request's
// ticks are found by walking its chain from the handle at retirement. The
// ring holds the newest kCapacity ticks of all requests (16 MB, touched as
// it fills): a tick older than that is gone, so a request keeps its
// newest ticks, and its count says how many it had.
//
// Single-threaded: the daemon's loop (the tracker's).
#ifndef TOKENMETER_DAEMON_INGEST_TICK_LOG_H_
#define TOKENMETER_DAEMON_INGEST_TICK_LOG_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "daemon/trace/timeline.h"

namespace tokenmeter::daemon {

class TickLog {
 public:
  static constexpr uint64_t kCapacity = uint64_t{1} << 20;
  // A request's handle: 0 for none; else its newest tick's sequence number
  // (modulo 2^40) in the low 40 bits and its tick count (saturating) in
  // the high 24.
  static constexpr int kCountShift = 40;
  static constexpr uint64_t kSeqMask = (uint64_t{1} << kCountShift) - 1;
  static constexpr uint64_t kMaxCount = (uint64_t{1} << 24) - 1;

  // Allocates the ring (untouched until used). Call before Append().
  // Collect() on the loop's thread after Append() sees its stores (the
  // non-temporal stores are ordered with the same thread's loads).
  void Enable() {
    if (!entries_)
      entries_ = std::make_unique_for_overwrite<Entry[]>(kCapacity);
  }
  bool enabled() const { return entries_ != nullptr; }

  // Appends a tick of the request whose handle is `handle` (updated).
  // Cost: a few stores; never fails.
  void Append(uint64_t& handle, uint64_t t_ns, uint64_t n) {
    const uint64_t seq = next_ & kSeqMask;
    uint64_t count = handle >> kCountShift;
    uint32_t back = 0;
    if (count != 0) {
      const uint64_t age = (seq - (handle & kSeqMask)) & kSeqMask;
      if (age < kCapacity) back = uint32_t(age);
    }
    Entry& e = entries_[seq & (kCapacity - 1)];
    const uint64_t n_back =
        std::min<uint64_t>(n, UINT32_MAX) | (uint64_t{back} << 32);
#if defined(__SSE2__)
    // Non-temporal: the ring is written once and read rarely, so its lines
    // need not be read in (an ownership read per line costs more than the
    // rest of the append) nor evict the tracker's working set.
    _mm_stream_si64(reinterpret_cast<long long*>(&e.t_ns),
                    static_cast<long long>(t_ns));
    _mm_stream_si64(reinterpret_cast<long long*>(&e.n_back),
                    static_cast<long long>(n_back));
#else
    e.t_ns = t_ns;
    e.n_back = n_back;
#endif
    if (count < kMaxCount) ++count;
    handle = (count << kCountShift) | seq;
    ++next_;
  }

  // Appends to *out (oldest first) the newest ticks of the request, at most
  // `max`, that the ring still holds; returns how many ticks it had in all
  // (saturating at kMaxCount). Cost: O(ticks collected).
  uint64_t Collect(uint64_t handle, size_t max,
                   std::vector<trace::TokenTick>* out) const {
    const uint64_t count = handle >> kCountShift;
    if (count == 0 || !entries_) return 0;
    const size_t first = out->size();
    uint64_t seq = handle & kSeqMask;
    while (out->size() - first < max) {
      const uint64_t age = (next_ - seq) & kSeqMask;  // 1: the newest
      if (age == 0 || age > kCapacity) break;         // overwritten
      const Entry& e = entries_[seq & (kCapacity - 1)];
      out->push_back({e.t_ns, uint32_t(e.n_back)});
      const uint32_t back = uint32_t(e.n_back >> 32);
      if (back == 0) break;
      seq = (seq - back) & kSeqMask;
    }
    std::reverse(out->begin() + std::ptrdiff_t(first), out->end());
    return count;
  }

 private:
  struct Entry {
    uint64_t t_ns;
    // The TOKENS count in the low 32 bits; in the high 32, entries back to
    // the same request's previous tick (0: none: its first, or one the
    // ring no longer held).
    uint64_t n_back;
  };
  std::unique_ptr<Entry[]> entries_;
  uint64_t next_ = 0;  // appends so far
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_INGEST_TICK_LOG_H_
