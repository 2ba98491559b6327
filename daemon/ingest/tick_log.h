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
// newest ticks.
//
// A budget bounds what the ring costs the event path at peak ingest: at
// most kTicksPerRefill ticks are written between two Refill()s (the
// tracker's sweep, every 100 ms: 200 000 ticks a second); past that the
// caller's check of writing() fails and a tick costs nothing at all (not
// even a count: a request's timeline says how many of its tokens have no
// tick shown, from its token count), so that even at millions of TOKENS a
// second the ring stays a small, bounded share of the loop.
//
// Single-threaded: the daemon's loop (the tracker's).
#ifndef TOKENMETER_DAEMON_INGEST_TICK_LOG_H_
#define TOKENMETER_DAEMON_INGEST_TICK_LOG_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
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
  static constexpr uint64_t kTicksPerRefill = 20'000;
  // A request's handle: 0 for none; else kHasEntry and the newest written
  // tick's sequence number (modulo 2^39) in the low 39 bits.
  static constexpr uint64_t kHasEntry = uint64_t{1} << 39;
  static constexpr uint64_t kSeqMask = kHasEntry - 1;

  // Allocates the ring (untouched until used) and gives the first budget;
  // until then writing() is false. Collect() on the loop's thread after
  // Append() sees its stores (the non-temporal stores are ordered with the
  // same thread's loads).
  void Enable() {
    if (!entries_) {
      entries_ = std::make_unique_for_overwrite<Entry[]>(kCapacity);
      budget_ = kTicksPerRefill;
    }
  }
  bool enabled() const { return entries_ != nullptr; }

  // Whether Append() may be called: enabled and budget left. The event
  // path's one check (a load and a branch).
  bool writing() const { return budget_ != 0; }

  // Appends a tick of the request whose handle is `handle` (updated).
  // Only while writing(). Cost: a few stores; never fails.
  void Append(uint64_t& handle, uint64_t t_ns, uint64_t n) {
    --budget_;
    const uint64_t seq = next_ & kSeqMask;
    uint32_t back = 0;
    if ((handle & kHasEntry) != 0) {
      const uint64_t age = (seq - (handle & kSeqMask)) & kSeqMask;
      if (age < kCapacity) back = uint32_t(age);
    }
    Entry& e = entries_[seq & (kCapacity - 1)];
    const uint64_t n_back =
        std::min<uint64_t>(n, UINT32_MAX) | (uint64_t{back} << 32);
#if defined(__SSE2__)
    // One non-temporal 16-byte store: the ring is written once and read
    // rarely, so its lines need not be read in (an ownership read per
    // line) nor evict the tracker's working set.
    _mm_stream_si128(reinterpret_cast<__m128i*>(&e),
                     _mm_set_epi64x(static_cast<long long>(n_back),
                                    static_cast<long long>(t_ns)));
#else
    e.t_ns = t_ns;
    e.n_back = n_back;
#endif
    handle = kHasEntry | seq;
    ++next_;
  }

  // A new budget of kTicksPerRefill writes (what is left is not carried);
  // nothing before Enable().
  void Refill() {
    if (entries_) budget_ = kTicksPerRefill;
  }

  // Appends to *out (oldest first) the newest written ticks of the
  // request, at most `max`, that the ring still holds; returns the sum of
  // their token counts. Cost: O(ticks collected).
  uint64_t Collect(uint64_t handle, size_t max,
                   std::vector<trace::TokenTick>* out) const {
    uint64_t tokens = 0;
    if ((handle & kHasEntry) == 0 || !entries_) return tokens;
    const size_t first = out->size();
    uint64_t seq = handle & kSeqMask;
    while (out->size() - first < max) {
      const uint64_t age = (next_ - seq) & kSeqMask;  // 1: the newest
      if (age == 0 || age > kCapacity) break;         // overwritten
      const Entry& e = entries_[seq & (kCapacity - 1)];
      out->push_back({e.t_ns, uint32_t(e.n_back)});
      tokens += uint32_t(e.n_back);
      const uint32_t back = uint32_t(e.n_back >> 32);
      if (back == 0) break;
      seq = (seq - back) & kSeqMask;
    }
    std::reverse(out->begin() + std::ptrdiff_t(first), out->end());
    return tokens;
  }

 private:
  struct alignas(16) Entry {
    uint64_t t_ns;
    // The TOKENS count in the low 32 bits; in the high 32, entries back to
    // the same request's previous tick (0: none: its first, or one the
    // ring no longer held).
    uint64_t n_back;
  };
  std::unique_ptr<Entry[]> entries_;
  uint64_t next_ = 0;    // ticks written so far
  uint64_t budget_ = 0;  // writes left until the next Refill()
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_INGEST_TICK_LOG_H_
