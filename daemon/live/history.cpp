#include "daemon/live/history.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "daemon/store/parts/admission.h"
#include "daemon/store/parts/waiting_reason.h"

namespace tokenmeter::daemon::live {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Decimals each value keeps: gauges and rates to the hundredth, KV usage
// and the hit rate (fractions) to 1e-4, latencies to the microsecond.
constexpr int kDecimals[kNumLiveKeys] = {2, 2, 4, 2, 2, 2, 4, 6,
                                         6, 6, 6, 6, 6, 2, 2, 2};

constexpr uint64_t kPow10[] = {
    1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000};

// The p50 key of each latency histogram a point holds quantiles of
// (SeriesWindows' order: TTFT, ITL, e2e).
constexpr LiveKey kP50Key[kNumWindowLatencies] = {kTtftP50, kItlP50, kE2eP50};

void AppendUint(std::string& out, uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, end);
}

}  // namespace

namespace {

// BucketQuantile() with the counts' sum known.
double QuantileOf(double q, const std::vector<double>& bounds,
                  const uint64_t* counts, uint64_t total) {
  const size_t n = bounds.size();
  if (total == 0) return kNaN;
  const double rank = q * double(total);
  uint64_t below = 0;
  for (size_t i = 0; i <= n; ++i) {
    const uint64_t c = counts[i];
    if (c > 0 && double(below + c) >= rank) {
      if (i == n) return n > 0 ? bounds[n - 1] : kNaN;
      const double upper = bounds[i];
      if (i == 0 && upper <= 0) return upper;
      const double lower = i == 0 ? 0 : bounds[i - 1];
      return lower + (upper - lower) * (rank - double(below)) / double(c);
    }
    below += c;
  }
  return n > 0 ? bounds[n - 1] : kNaN;  // not reached: rank <= total
}

}  // namespace

double BucketQuantile(double q, const std::vector<double>& bounds,
                      const uint64_t* counts) {
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds.size(); ++i) total += counts[i];
  return QuantileOf(q, bounds, counts, total);
}

void AppendJsonNumber(std::string& out, double v, int decimals) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  const double a = std::fabs(v);
  if (a >= 1e12) {
    char buf[32];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v,
                                   std::chars_format::scientific, 5);
    out.append(buf, end);
    return;
  }
  // At most 12 integer digits, a sign, a point and a possible carry
  // (9.99 -> 10.0): the decimals that still fit kMaxEntryBytes.
  int digits = 1;
  for (double p = 10; p <= a && digits < 12; p *= 10) ++digits;
  decimals = std::clamp(decimals, 0, 9);
  decimals = std::min(decimals, int(kMaxEntryBytes) - 3 - digits);
  const uint64_t scale = kPow10[decimals];
  // a * scale < 1e12 * 1e3 here: well inside int64_t.
  const auto r = uint64_t(std::llround(a * double(scale)));
  if (v < 0 && r != 0) out += '-';
  AppendUint(out, r / scale);
  uint64_t frac = r % scale;
  if (frac == 0) return;
  int width = decimals;
  while (frac % 10 == 0) {
    frac /= 10;
    --width;
  }
  out += '.';
  char buf[16];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, frac);
  out.append(size_t(width - (end - buf)), '0');
  out.append(buf, end);
}

void TextRing::Push(std::string_view entry) {
  if (entry.size() > kMaxEntryBytes) std::abort();
  if (count_ == kPoints) {
    begin_ += len_[head_];
    head_ = (head_ + 1) % kPoints;
    --count_;
    // Reclaim the dropped text once it is a quarter of what is kept (and
    // more than a few entries): one move of the rest per ~225 pushes.
    const size_t live = text_.size() - begin_;
    if (begin_ > 256 && begin_ * 4 > live) {
      text_.erase(0, begin_);
      begin_ = 0;
    }
  }
  len_[(head_ + count_) % kPoints] = uint8_t(entry.size() + 1);
  text_.append(entry);
  text_ += ',';
  ++count_;
}

std::string_view TextRing::Joined() const {
  if (count_ == 0) return {};
  return std::string_view(text_).substr(begin_, text_.size() - begin_ - 1);
}

std::string_view TextRing::Last() const {
  if (count_ == 0) return {};
  const size_t len = len_[(head_ + count_ - 1) % kPoints];
  return std::string_view(text_).substr(text_.size() - len, len - 1);
}

// A followed series: its history (what the next point's increases are
// measured from is in windows_).
struct History::State {
  SeriesWindows::Marks marks;    // where the next point's increase starts
  uint64_t rejections_mark = 0;  // the admission part's total then
  Series series;
};

History::History() : windows_(/*latencies=*/true) {}
History::~History() = default;

History::State* History::StateFor(const EngineSeries& s, bool baseline) {
  auto it = states_.find(&s);
  if (it != states_.end()) return it->second.get();
  if (states_.size() >= kMaxSeries) return nullptr;
  State* st =
      states_.emplace(&s, std::make_unique<State>()).first->second.get();
  // A series there was at Start() (restored from a snapshot) starts at its
  // totals; one made since counts from zero.
  if (baseline) {
    windows_.Mark(s, st->marks);
    if (const AdmissionPart* a = s.find_part<AdmissionPart>()) {
      st->rejections_mark = a->total();
    }
  }
  return st;
}

void History::Start(const Registry& registry, uint64_t now_ns) {
  last_tick_ns_ = now_ns;
  started_ = true;
  registry.ForEachSeries(
      [&](const EngineSeries& s) { StateFor(s, /*baseline=*/true); });
}

void History::Tick(const Registry& registry, uint64_t now_ns, int64_t unix_s) {
  if (!started_) Start(registry, now_ns);
  const double elapsed_s =
      now_ns > last_tick_ns_ ? double(now_ns - last_tick_ns_) / 1e9 : 1.0;
  last_tick_ns_ = now_ns;
  if (last_unix_s_ != 0 && unix_s <= last_unix_s_) unix_s = last_unix_s_ + 1;
  last_unix_s_ = unix_s;
  std::string text;
  text.reserve(32);
  std::string t_text;
  AppendUint(t_text, uint64_t(std::max<int64_t>(0, unix_s)));
  registry.ForEachSeries([&](const EngineSeries& s) {
    State* st = StateFor(s, /*baseline=*/false);
    if (st == nullptr) return;
    std::array<double, kNumLiveKeys>& v = st->series.last;
    const std::array<double, kNumLiveKeys> prev_v = v;
    v[kRunning] = s.gauge(kNumRequestsRunning).value();
    v[kWaiting] = s.gauge(kNumRequestsWaiting).value();
    v[kKvUsage] = s.gauge(kKvCacheUsagePerc).value();
    const SeriesWindows::Window& w = windows_.Advance(s, st->marks);
    const WindowCounters& d = w.increase;
    v[kPromptTokensPerS] = double(d.prompt_tokens) / elapsed_s;
    v[kGenerationTokensPerS] = double(d.generation_tokens) / elapsed_s;
    v[kPreemptionsPerS] = double(d.preemptions) / elapsed_s;
    v[kPrefixCacheHitRate] =
        d.prefix_queries > 0 ? double(d.prefix_hits) / double(d.prefix_queries)
                             : kNaN;
    for (size_t h = 0; h < kNumWindowLatencies; ++h) {
      const std::vector<double>& bounds =
          s.hist(WindowLatency(s, h)).layout().bounds();
      const uint64_t* counts = w.buckets[h]->data();
      v[kP50Key[h]] = QuantileOf(0.5, bounds, counts, w.observations[h]);
      v[kP50Key[h] + 1] = QuantileOf(0.99, bounds, counts, w.observations[h]);
    }
    // Protocol 1.2: null until the series has the part.
    v[kAdmissionRejectionsPerS] = kNaN;
    if (const AdmissionPart* a = s.find_part<AdmissionPart>()) {
      const uint64_t total = a->total();
      v[kAdmissionRejectionsPerS] =
          total > st->rejections_mark
              ? double(total - st->rejections_mark) / elapsed_s
              : 0.0;
      st->rejections_mark = total;
    }
    const WaitingReasonPart* wr = s.find_part<WaitingReasonPart>();
    v[kWaitingCapacity] = wr != nullptr ? double(wr->capacity()) : kNaN;
    v[kWaitingDeferred] = wr != nullptr ? double(wr->deferred()) : kNaN;
    st->series.t.Push(t_text);
    for (int k = 0; k < kNumLiveKeys; ++k) {
      TextRing& ring = st->series.values[k];
      // A value like the previous point's (a quiet gauge, a null) reuses
      // its text.
      const bool same =
          ring.size() > 0 &&
          (prev_v[k] == v[k] || (std::isnan(prev_v[k]) && std::isnan(v[k])));
      text.clear();
      if (same) {
        text.append(ring.Last());
      } else {
        AppendJsonNumber(text, v[k], kDecimals[k]);
      }
      ring.Push(text);
    }
  });
  unfollowed_ = registry.series_count() - states_.size();
}

const History::Series* History::Find(const EngineSeries& s) const {
  auto it = states_.find(&s);
  return it == states_.end() ? nullptr : &it->second->series;
}

size_t History::MaxBytesPerSeries(size_t buckets) {
  // A ring's string: at most 1.25 times kPoints full entries plus the 256
  // bytes and one entry before a move; std::string may double that when
  // it grows. The window's marks: its counters and the latency buckets.
  const size_t ring_text =
      2 * ((kPoints * (kMaxEntryBytes + 1)) * 5 / 4 + 256 + kMaxEntryBytes + 1);
  return sizeof(State) + (kNumLiveKeys + 1) * ring_text + 128 +
         kNumWindowLatencies * (32 + buckets * sizeof(uint64_t));
}

size_t History::BytesHeld(const EngineSeries& s) const {
  auto it = states_.find(&s);
  if (it == states_.end()) return 0;
  const State& st = *it->second;
  size_t n = sizeof(State) + st.series.t.capacity() +
             SeriesWindows::BytesHeld(st.marks) - sizeof(st.marks);
  for (const TextRing& r : st.series.values) n += r.capacity();
  return n;
}

}  // namespace tokenmeter::daemon::live
