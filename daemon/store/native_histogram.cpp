#include "daemon/store/native_histogram.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>

#include "daemon/base/state_io.h"

namespace tokenmeter::daemon {

namespace native_histogram_internal {
namespace {

KeyTables BuildKeyTables() {
  KeyTables t{};
  for (int j = 0; j < 256; ++j) {
    // exp2l carries 11 bits beyond a double's, so rounding its result gives
    // the correctly rounded 2^(j/256) (checked against 60-digit values; the
    // test checks the power-of-two and square-root boundaries exactly).
    const double b =
        static_cast<double>(std::exp2(static_cast<long double>(j) / 256));
    t.mant[j] = std::bit_cast<uint64_t>(b) & ((uint64_t(1) << 52) - 1);
  }
  t.mant[256] = uint64_t(1) << 52;
  for (int j = 0; j < 256; ++j) {
    if (t.mant[j + 1] - t.mant[j] <= (uint64_t(1) << 43)) std::abort();
  }
  int j = 0;
  for (uint64_t k = 0; k < 512; ++k) {
    while (t.mant[j] < (k << 43)) ++j;
    t.lut[k] = uint16_t(j);
  }
  return t;
}

}  // namespace

const KeyTables kKeyTables = BuildKeyTables();

}  // namespace native_histogram_internal

NativeHistogram::NativeHistogram(int schema)
    : initial_schema_(schema), schema_(schema), shift_(8 - schema) {
  if (schema < kMinSchema || schema > kMaxSchema) std::abort();
}

int32_t NativeHistogram::BucketIndex(double v, int schema) {
  if (schema < kMinSchema || schema > kMaxSchema) std::abort();
  const int shift = 8 - schema;
  const uint64_t abs = std::bit_cast<uint64_t>(v) & ~kSignBit;
  if (abs == 0 || abs > kInfBits) return INT32_MIN;
  if (abs == kInfBits) return KeyOfNormal(kInfBits - 1, shift) + 1;
  if (abs < (uint64_t(1) << 52)) {
    // Subnormal: scaled by 2^64 (exact) it is normal.
    const double scaled = std::bit_cast<double>(abs) * 0x1p64;
    const int32_t key8 =
        KeyOfNormal(std::bit_cast<uint64_t>(scaled), 0) - 64 * 256;
    return (key8 + (int32_t(1) << shift) - 1) >> shift;
  }
  return KeyOfNormal(abs, shift);
}

void NativeHistogram::ObserveNonFinite(uint64_t bits, uint64_t n) {
  if ((bits & ~kSignBit) != kInfBits) return;  // NaN
  Add(bits >> 63 ? negative_ : positive_, KeyOfNormal(kInfBits - 1, shift_) + 1,
      n);
}

void NativeHistogram::AddOutsideWindow(Buckets& b, int32_t key, uint64_t n) {
  const auto by_key = [](const std::pair<int32_t, uint64_t>& p, int32_t k) {
    return p.first < k;
  };
  auto it = std::lower_bound(b.sparse.begin(), b.sparse.end(), key, by_key);
  if (it != b.sparse.end() && it->first == key) {
    it->second += n;
    return;
  }
  Sparse pairs = Pairs(b);
  pairs.insert(std::lower_bound(pairs.begin(), pairs.end(), key, by_key),
               {key, n});
  Layout(std::move(pairs), b);
  ++populated_;
  ReduceToLimit();
}

void NativeHistogram::ReduceToLimit() {
  while (populated_ > kMaxBuckets && schema_ > kMinSchema) HalveResolution();
}

void NativeHistogram::HalveResolution() {
  --schema_;
  ++shift_;
  populated_ = 0;
  for (Buckets* b : {&positive_, &negative_}) {
    Sparse merged;
    for (const auto& [key, count] : Pairs(*b)) {
      // ceil(key / 2); >> of a negative int rounds down (C++20).
      const int32_t k = (key + 1) >> 1;
      if (!merged.empty() && merged.back().first == k) {
        merged.back().second += count;
      } else {
        merged.emplace_back(k, count);
      }
    }
    populated_ += merged.size();
    Layout(std::move(merged), *b);
  }
}

NativeHistogram::Sparse NativeHistogram::Pairs(const Buckets& b) {
  Sparse out;
  out.reserve(b.sparse.size() + b.dense.size());
  auto it = b.sparse.begin();
  for (; it != b.sparse.end() && it->first < b.base; ++it) out.push_back(*it);
  for (size_t i = 0; i < b.dense.size(); ++i) {
    if (b.dense[i] != 0) out.emplace_back(b.base + int32_t(i), b.dense[i]);
  }
  out.insert(out.end(), it, b.sparse.end());
  return out;
}

void NativeHistogram::Layout(Sparse pairs, Buckets& b) {
  b.dense.clear();
  b.sparse.clear();
  b.base = 0;
  if (pairs.empty()) return;
  // Two pointers over the sorted indexes: [lo, hi) spans < kMaxDenseSpan.
  size_t best_lo = 0;
  size_t best_hi = 0;
  uint64_t best = 0;
  uint64_t in_window = 0;
  size_t hi = 0;
  for (size_t lo = 0; lo < pairs.size(); ++lo) {
    while (hi < pairs.size() && int64_t(pairs[hi].first) - pairs[lo].first <
                                    int64_t(kMaxDenseSpan)) {
      in_window += pairs[hi].second;
      ++hi;
    }
    if (in_window > best || best_hi == 0) {
      best = in_window;
      best_lo = lo;
      best_hi = hi;
    }
    in_window -= pairs[lo].second;
  }
  b.base = pairs[best_lo].first;
  b.dense.assign(size_t(pairs[best_hi - 1].first - b.base) + 1, 0);
  for (size_t i = best_lo; i < best_hi; ++i) {
    b.dense[size_t(pairs[i].first - b.base)] = pairs[i].second;
  }
  b.sparse.assign(pairs.begin(), pairs.begin() + ptrdiff_t(best_lo));
  b.sparse.insert(b.sparse.end(), pairs.begin() + ptrdiff_t(best_hi),
                  pairs.end());
}

void NativeHistogram::SaveState(StateWriter& w) const {
  w.U8(uint8_t(int8_t(schema_)));
  w.U64(zero_count_);
  for (const Buckets* b : {&positive_, &negative_}) {
    const Sparse pairs = Pairs(*b);
    w.U64(pairs.size());
    for (const auto& [key, count] : pairs) {
      w.U32(uint32_t(key));
      w.U64(count);
    }
  }
}

void NativeHistogram::LoadState(StateReader& r) {
  // The schema's two's-complement byte (SaveState()).
  const uint8_t raw = r.U8();
  const int schema = raw < 128 ? int(raw) : int(raw) - 256;
  if (schema < kMinSchema || schema > kMaxSchema) {
    r.Fail();
    return;
  }
  const uint64_t zero_count = r.U64();
  // The indexes values above the zero bucket reach, +-Inf's included.
  const int32_t lowest = BucketIndex(std::nextafter(kZeroThreshold, 1), schema);
  const int32_t highest = BucketIndex(HUGE_VAL, schema);
  Sparse loaded[2];
  size_t total = 0;
  for (Sparse& pairs : loaded) {
    const size_t n = r.Count(kMaxBuckets, 12);
    pairs.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const int32_t key = int32_t(r.U32());
      const uint64_t count = r.U64();
      if (key < lowest || key > highest || count == 0 ||
          (!pairs.empty() && key <= pairs.back().first)) {
        r.Fail();
        return;
      }
      pairs.emplace_back(key, count);
    }
    total += n;
  }
  if (total > kMaxBuckets || !r.ok()) {
    r.Fail();
    return;
  }
  schema_ = schema;
  shift_ = 8 - schema;
  zero_count_ = zero_count;
  populated_ = total;
  Layout(std::move(loaded[0]), positive_);
  Layout(std::move(loaded[1]), negative_);
  while (schema_ > initial_schema_) HalveResolution();
}

}  // namespace tokenmeter::daemon
