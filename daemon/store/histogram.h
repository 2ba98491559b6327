// Histograms with fixed, per-metric bucket layouts. Observations arrive in
// raw units (nanoseconds, or token counts) and are exposed divided by the
// layout's divisor (seconds = ns / 1e9). Each histogram also keeps native
// (sparse, exponential) buckets of the exposed values at the layout's
// native schema (native_histogram.h), which only the protobuf exposition
// shows. Single-threaded (the daemon's loop).
#ifndef TOKENMETER_DAEMON_STORE_HISTOGRAM_H_
#define TOKENMETER_DAEMON_STORE_HISTOGRAM_H_

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "daemon/store/native_histogram.h"

namespace tokenmeter::daemon {

class StateReader;
class StateWriter;

class HistogramLayout {
 public:
  // `bounds`: strictly increasing finite upper bounds in exposed units (the
  // +Inf bucket is implicit). `divisor`: raw units per exposed unit.
  // `native_schema`: the initial schema of the native buckets
  // (NativeHistogram::kMinSchema..kMaxSchema; --native-histogram-schema).
  HistogramLayout(std::vector<double> bounds, double divisor,
                  int native_schema = NativeHistogram::kDefaultSchema);

  // The bucket an observation falls in: the first bound b with
  // raw / divisor <= b (le is inclusive), or bounds().size() for +Inf.
  // Cost: for raw in [2^-64, 2^64) the binade's first candidate from a
  // table and a scan of the bounds inside that binade (usually 0 to 3
  // compares); otherwise (0, negative, NaN, huge) a binary search.
  size_t BucketFor(double raw) const {
    const uint64_t j =
        (std::bit_cast<uint64_t>(raw) >> 52) - uint64_t(1023 + kMinExp);
    if (j < uint64_t(kMaxExp - kMinExp)) [[likely]] {
      size_t i = start_[j];
      const size_t hi = start_[j + 1];
      if (hi - i <= 8) [[likely]] {
        while (i < hi && thresholds_[i] < raw) ++i;
        return i;
      }
      return size_t(std::lower_bound(thresholds_.begin() + i,
                                     thresholds_.begin() + hi, raw) -
                    thresholds_.begin());
    }
    return SearchBucket(raw);
  }
  // The same by a binary search over every bound (what BucketFor() does
  // outside its table; tests compare the two).
  size_t SearchBucket(double raw) const {
    return size_t(
        std::lower_bound(thresholds_.begin(), thresholds_.end(), raw) -
        thresholds_.begin());
  }
  const std::vector<double>& bounds() const { return bounds_; }
  // Each bound formatted for the `le` label, then "+Inf".
  const std::vector<std::string>& le_text() const { return le_text_; }
  double divisor() const { return divisor_; }
  int native_schema() const { return native_schema_; }

 private:
  // The binades that BucketFor()'s table covers: [2^kMinExp, 2^kMaxExp).
  static constexpr int kMinExp = -64;
  static constexpr int kMaxExp = 64;
  std::vector<double> bounds_;
  std::vector<double> thresholds_;
  // start_[j]: the first threshold >= 2^(j + kMinExp), j in 0 .. 128.
  std::array<uint32_t, kMaxExp - kMinExp + 1> start_{};
  std::vector<std::string> le_text_;
  double divisor_;
  int native_schema_;
};

class Histogram {
 public:
  explicit Histogram(const HistogramLayout* layout)
      : layout_(layout),
        counts_(layout->bounds().size() + 1, 0),
        native_(layout->native_schema()) {}

  // Cost: BucketFor() (a table look-up and a short scan), a division and
  // NativeHistogram::Observe() (a few ns).
  void Observe(double raw) {
    ++counts_[layout_->BucketFor(raw)];
    ++count_;
    sum_raw_ += raw;
    native_.Observe(raw / layout_->divisor());
  }
  // Observe(raw) when `bucket` is layout().BucketFor(raw) (computed once
  // for two histograms of one layout's bounds).
  void ObserveIn(size_t bucket, double raw) {
    ++counts_[bucket];
    ++count_;
    sum_raw_ += raw;
    native_.Observe(raw / layout_->divisor());
  }
  // `n` observations of `raw_each` whose sum is `raw_sum` (SGLang's
  // token-weighted inter-token latency: one chunk interval over n tokens).
  void ObserveWeighted(double raw_each, uint64_t n, double raw_sum) {
    counts_[layout_->BucketFor(raw_each)] += n;
    count_ += n;
    sum_raw_ += raw_sum;
    native_.ObserveN(raw_each / layout_->divisor(), n);
  }
  const HistogramLayout& layout() const { return *layout_; }
  // Per-bucket (not cumulative) counts; the last is the +Inf bucket.
  const std::vector<uint64_t>& counts() const { return counts_; }
  uint64_t count() const { return count_; }
  // In exposed units. Exact for integer raw sums below 2^53.
  double sum() const { return sum_raw_ / layout_->divisor(); }
  // The native buckets of the same observations (in exposed units). Their
  // total plus the zero count is count() less the NaN observations.
  const NativeHistogram& native() const { return native_; }

  // Snapshots (daemon/base/state_io.h): the counts, the raw sum and the
  // native buckets. A load whose bucket count differs from the layout's
  // fails the reader; native buckets of a finer schema than the layout's
  // are reduced to it (NativeHistogram::LoadState()). From format 1
  // (before native buckets) the native buckets start empty.
  void SaveState(StateWriter& w) const;
  void LoadState(StateReader& r);

 private:
  const HistogramLayout* layout_;
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  double sum_raw_ = 0;
  NativeHistogram native_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_HISTOGRAM_H_
