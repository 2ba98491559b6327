#include "daemon/store/histogram.h"

#include <cmath>

#include "daemon/base/state_io.h"
#include "daemon/base/text_format.h"

namespace tokenmeter::daemon {

HistogramLayout::HistogramLayout(std::vector<double> bounds, double divisor,
                                 int native_schema)
    : bounds_(std::move(bounds)),
      divisor_(divisor),
      native_schema_(native_schema) {
  thresholds_.reserve(bounds_.size());
  le_text_.reserve(bounds_.size() + 1);
  for (double b : bounds_) {
    // The largest raw value whose exposed value (raw / divisor, as the sum
    // is exposed) is still <= b: b * divisor alone can round below it (a
    // bound of 9.97e-07 s gives 996.9999999999999 ns), which would put an
    // observation of exactly 997 ns past its inclusive le bucket.
    double t = b * divisor_;
    // At and below 0 there is nothing to adjust (observations are never
    // negative), and stepping through the subnormals above a bound of 0
    // (SGLang's queue-time buckets start at 0) would take ages.
    if (b > 0) {
      while (t / divisor_ > b) t = std::nextafter(t, -HUGE_VAL);
      for (double up = std::nextafter(t, HUGE_VAL); up / divisor_ <= b;
           up = std::nextafter(up, HUGE_VAL)) {
        t = up;
      }
    }
    thresholds_.push_back(t);
    std::string text;
    AppendDouble(text, b);
    le_text_.push_back(std::move(text));
  }
  le_text_.push_back("+Inf");
  for (size_t j = 0; j < start_.size(); ++j) {
    const double lo = std::ldexp(1.0, int(j) + kMinExp);
    start_[j] =
        uint32_t(std::lower_bound(thresholds_.begin(), thresholds_.end(), lo) -
                 thresholds_.begin());
  }
}

void Histogram::SaveState(StateWriter& w) const {
  w.U64s(counts_);
  w.U64(count_);
  w.F64(sum_raw_);
  native_.SaveState(w);
}

void Histogram::LoadState(StateReader& r) {
  std::vector<uint64_t> counts;
  r.U64s(counts_.size(), &counts);
  if (counts.size() != counts_.size()) {
    r.Fail();
    return;
  }
  const uint64_t count = r.U64();
  const double sum_raw = r.F64();
  NativeHistogram native(layout_->native_schema());
  // Format 1 had no native buckets: they start empty, the classic counts
  // go on (a native count above its buckets' total is what NaN
  // observations give too; rates over the new samples are exact).
  if (r.version() >= 2) native.LoadState(r);
  if (!r.ok()) return;
  counts_ = std::move(counts);
  count_ = count;
  sum_raw_ = sum_raw;
  native_ = std::move(native);
}

}  // namespace tokenmeter::daemon
