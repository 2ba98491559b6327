// The native (sparse, exponential) buckets of one histogram, as the
// Prometheus protobuf exposition carries them (docs: metrics-v1.md, "Native
// histograms"): a schema s in -4..8, a zero bucket of threshold 2^-128, and
// positive and negative buckets where bucket i holds
// (base^(i-1), base^i], base = 2^(2^-s) (upper bound inclusive). Sum- and
// count-free: the classic Histogram beside it keeps those.
//
// Bucket limit: at most kMaxBuckets (160) positive and negative buckets are
// populated. An observation that would populate the 161st halves the
// resolution (schema - 1, pairs of buckets merged: client_golang's
// doubleBucketWidth) until at most 160 are, which always holds by schema -4
// (at most 73 buckets per sign exist there). Unlike client_golang, there is
// no reset and no widening of the zero bucket, and the halving repeats at
// once rather than once per later observation, so the limit holds after
// every call.
//
// Special values, as client_golang: NaN is ignored here (the classic
// histogram still counts it, so the exposed count may exceed the buckets'
// total by the NaNs); +Inf and -Inf go to the bucket just above the one of
// +-DBL_MAX; |v| <= 2^-128 (0, -0, subnormals) goes to the zero bucket.
//
// Cost: Observe() is a few integer operations and two table loads (no
// log(), no search) and an increment when the bucket is in the dense window
// (below); a newly populated bucket outside it re-lays the buckets out,
// O(populated), which happens at most 160 times per schema.
//
// Memory: per sign, a dense window of counts covering at most kMaxDenseSpan
// (320) consecutive indexes (the run holding the most observations) plus a
// sorted list of the populated buckets outside it: at most
// 2 x 320 x 8 B + 161 x 16 B + ~150 B, about 7.7 KiB; a histogram whose values
// lie within 40 octaves at schema 3 uses 8 B per index between its smallest
// and largest value (10 octaves at schema 3: 80 x 8 B).
//
// Threads: none of its own; single-threaded (the daemon's loop).
#ifndef TOKENMETER_DAEMON_STORE_NATIVE_HISTOGRAM_H_
#define TOKENMETER_DAEMON_STORE_NATIVE_HISTOGRAM_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace tokenmeter::daemon {

class StateReader;
class StateWriter;

namespace native_histogram_internal {
// The schema-8 boundaries' mantissas: mant[j] is the 52-bit mantissa of
// 2^(j/256) (correctly rounded), mant[256] = 2^52 (the next power of two);
// lut[k] is the smallest j with mant[j] >= k << 43. No two boundaries are
// closer than 2^43 (2^(1/256) - 1 > 2^-9), so the bucket of a mantissa m is
// lut[m >> 43] or the one after.
struct KeyTables {
  uint64_t mant[257];
  uint16_t lut[512];
};
// Built before main() (a constant after that); no NativeHistogram may be
// used from a static initializer.
extern const KeyTables kKeyTables;
}  // namespace native_histogram_internal

class NativeHistogram {
 public:
  static constexpr int kMinSchema = -4;
  static constexpr int kMaxSchema = 8;
  static constexpr int kDefaultSchema = 3;
  static constexpr size_t kMaxBuckets = 160;
  static constexpr size_t kMaxDenseSpan = 320;
  static constexpr double kZeroThreshold = 0x1p-128;

  // `schema` in kMinSchema..kMaxSchema (outside it aborts: the flag parser
  // checks the range). The schema only decreases from there.
  explicit NativeHistogram(int schema);

  // One observation in exposed units (seconds, tokens).
  void Observe(double v) { ObserveN(v, 1); }
  // `n` observations of `v` (n = 0 does nothing).
  void ObserveN(double v, uint64_t n) {
    const uint64_t bits = std::bit_cast<uint64_t>(v);
    const uint64_t abs = bits & ~kSignBit;
    if (n == 0) return;
    if (abs <= kZeroThresholdBits) {
      zero_count_ += n;
      return;
    }
    if (abs >= kInfBits) {
      ObserveNonFinite(bits, n);
      return;
    }
    Add(bits >> 63 ? negative_ : positive_, KeyOfNormal(abs, shift_), n);
  }

  // The current schema (initial schema or lower).
  int schema() const { return schema_; }
  // Observations with |v| <= kZeroThreshold.
  uint64_t zero_count() const { return zero_count_; }
  // Positive plus negative buckets with a nonzero count (<= kMaxBuckets).
  size_t populated() const { return populated_; }

  // Calls f(int32_t index, uint64_t count) for every populated positive
  // (`positive`) or negative bucket, in increasing index order (a protobuf
  // writer's spans and deltas). O(populated + dense window).
  template <class F>
  void ForEachBucket(bool positive, F f) const {
    const Buckets& b = positive ? positive_ : negative_;
    auto it = b.sparse.begin();
    for (; it != b.sparse.end() && it->first < b.base; ++it) {
      f(it->first, it->second);
    }
    for (size_t i = 0; i < b.dense.size(); ++i) {
      if (b.dense[i] != 0) f(b.base + int32_t(i), b.dense[i]);
    }
    for (; it != b.sparse.end(); ++it) f(it->first, it->second);
  }

  // The index of the bucket holding |v| at `schema` (kMinSchema..kMaxSchema),
  // ignoring the zero bucket: ceil(log_base |v|) with the boundaries rounded
  // to doubles as Prometheus computes them; +-Inf gives the index of DBL_MAX
  // plus one. v = 0 or NaN gives INT32_MIN.
  static int32_t BucketIndex(double v, int schema);

  // Snapshots (daemon/base/state_io.h): the schema, the zero count and the
  // populated buckets. A load with a schema outside -4..8, more than
  // kMaxBuckets buckets, an index no value reaches at that schema, indexes
  // out of order or a zero count fails the reader and leaves this histogram
  // as it was. A loaded schema finer than this histogram's initial one is
  // reduced to it on load.
  void SaveState(StateWriter& w) const;
  void LoadState(StateReader& r);

 private:
  using Sparse = std::vector<std::pair<int32_t, uint64_t>>;
  // One sign's buckets: dense[i] counts index base + i; `sparse` holds the
  // populated indexes outside the dense window, sorted.
  struct Buckets {
    int32_t base = 0;
    std::vector<uint64_t> dense;
    Sparse sparse;
  };

  static constexpr uint64_t kSignBit = uint64_t(1) << 63;
  static constexpr uint64_t kMantissaMask = (uint64_t(1) << 52) - 1;
  static constexpr uint64_t kInfBits = uint64_t(0x7ff) << 52;
  static constexpr uint64_t kZeroThresholdBits = uint64_t(1023 - 128) << 52;

  // The index at schema 8 - shift of the normal double whose bits (sign
  // cleared) are `abs`.
  static int32_t KeyOfNormal(uint64_t abs, int shift) {
    using native_histogram_internal::kKeyTables;
    const uint64_t m = abs & kMantissaMask;
    const unsigned j0 = kKeyTables.lut[m >> 43];
    const int32_t j = int32_t(j0) + (m > kKeyTables.mant[j0] ? 1 : 0);
    const int32_t key8 = j + (int32_t(abs >> 52) - 1023) * 256;
    // ceil(key8 / 2^shift): the schema-s bucket i is the union of schema-8
    // buckets (i-1) 2^shift + 1 .. i 2^shift.
    return (key8 + (int32_t(1) << shift) - 1) >> shift;
  }

  void Add(Buckets& b, int32_t key, uint64_t n) {
    const uint32_t off = uint32_t(key) - uint32_t(b.base);
    if (off < b.dense.size()) {
      uint64_t& c = b.dense[off];
      if (c == 0 && ++populated_ > kMaxBuckets) {
        c = n;
        ReduceToLimit();
        return;
      }
      c += n;
      return;
    }
    AddOutsideWindow(b, key, n);
  }
  void ObserveNonFinite(uint64_t bits, uint64_t n);
  void AddOutsideWindow(Buckets& b, int32_t key, uint64_t n);
  // Halves the resolution while more than kMaxBuckets are populated.
  void ReduceToLimit();
  // schema - 1: merges bucket pairs.
  void HalveResolution();

  static Sparse Pairs(const Buckets& b);
  // Lays sorted, nonzero (index, count) pairs out into `b`: the dense window
  // over the run of at most kMaxDenseSpan indexes holding the most
  // observations, the rest sparse.
  static void Layout(Sparse pairs, Buckets& b);

  int initial_schema_;
  int schema_;
  int shift_;  // 8 - schema_
  uint64_t zero_count_ = 0;
  size_t populated_ = 0;
  Buckets positive_;
  Buckets negative_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_NATIVE_HISTOGRAM_H_
