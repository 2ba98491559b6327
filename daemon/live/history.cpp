#include "daemon/live/history.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace tokenmeter::daemon::live {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Decimals each value keeps: gauges and rates to the hundredth, KV usage
// and the hit rate (fractions) to 1e-4, latencies to the microsecond.
constexpr int kDecimals[kNumLiveKeys] = {2, 2, 4, 2, 2, 2, 4, 6, 6, 6, 6, 6, 6};

constexpr uint64_t kPow10[] = {
    1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000};

// The three latency histograms a point holds quantiles of.
constexpr int kNumLatencies = 3;
constexpr LiveKey kP50Key[kNumLatencies] = {kTtftP50, kItlP50, kE2eP50};

void AppendUint(std::string& out, uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, end);
}

// The sum of a counter over a series' label cells (request labels split the
// request-level counters).
uint64_t CellSum(const EngineSeries& s, EngineMetric m) {
  uint64_t n = s.count(m);
  for (const LabelCell& c : s.cells()) n += c.values->count(m);
  return n;
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

// A followed series: its history and what the next point's increases are
// measured from.
struct History::State {
  EngineMetric latency[kNumLatencies] = {};
  std::array<std::vector<uint64_t>, kNumLatencies> prev;  // summed buckets
  uint64_t prompt = 0;
  uint64_t generation = 0;
  uint64_t preemptions = 0;
  uint64_t prefix_queries = 0;
  uint64_t prefix_hits = 0;
  Series series;
};

History::History() = default;
History::~History() = default;

History::State* History::StateFor(const EngineSeries& s, bool baseline) {
  auto it = states_.find(&s);
  if (it != states_.end()) return it->second.get();
  if (states_.size() >= kMaxSeries) return nullptr;
  auto st = std::make_unique<State>();
  // SGLang's profile shows the per-token ITL as its inter-token latency.
  st->latency[0] = kTimeToFirstToken;
  st->latency[1] = s.uses(kInterTokenLatency) ? kInterTokenLatency
                                              : kInterTokenLatencyPerToken;
  st->latency[2] = kE2eRequestLatency;
  for (int h = 0; h < kNumLatencies; ++h) {
    std::vector<uint64_t>& prev = st->prev[h];
    prev.assign(s.hist(st->latency[h]).counts().size(), 0);
    if (!baseline) continue;
    for (size_t i = 0; i < prev.size(); ++i) {
      prev[i] = s.hist(st->latency[h]).counts()[i];
    }
    for (const LabelCell& c : s.cells()) {
      const std::vector<uint64_t>& counts =
          c.values->hist(st->latency[h]).counts();
      for (size_t i = 0; i < prev.size(); ++i) prev[i] += counts[i];
    }
  }
  if (baseline) {
    st->prompt = CellSum(s, kPromptTokens);
    st->generation = CellSum(s, kGenerationTokens);
    st->preemptions = s.count(kNumPreemptions);
    st->prefix_queries = s.count(kPrefixCacheQueries);
    st->prefix_hits = s.count(kPrefixCacheHits);
  }
  State* raw = st.get();
  states_.emplace(&s, std::move(st));
  return raw;
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
  // An increase since the previous point, moving the mark on; a counter
  // below its mark (never, but a restore could) counts as no increase.
  auto delta = [](uint64_t now, uint64_t& mark) {
    const uint64_t d = now >= mark ? now - mark : 0;
    mark = now;
    return d;
  };
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
    v[kPromptTokensPerS] =
        double(delta(CellSum(s, kPromptTokens), st->prompt)) / elapsed_s;
    v[kGenerationTokensPerS] =
        double(delta(CellSum(s, kGenerationTokens), st->generation)) /
        elapsed_s;
    v[kPreemptionsPerS] =
        double(delta(s.count(kNumPreemptions), st->preemptions)) / elapsed_s;
    const uint64_t queries =
        delta(s.count(kPrefixCacheQueries), st->prefix_queries);
    const uint64_t hits = delta(s.count(kPrefixCacheHits), st->prefix_hits);
    v[kPrefixCacheHitRate] =
        queries > 0 ? double(hits) / double(queries) : kNaN;
    for (int h = 0; h < kNumLatencies; ++h) {
      const Histogram& own = s.hist(st->latency[h]);
      std::vector<uint64_t>& prev = st->prev[h];
      const std::vector<uint64_t>& counts = own.counts();
      scratch_.resize(counts.size());
      uint64_t total = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        uint64_t now = counts[i];
        for (const LabelCell& c : s.cells()) {
          now += c.values->hist(st->latency[h]).counts()[i];
        }
        const uint64_t d = now >= prev[i] ? now - prev[i] : 0;
        scratch_[i] = d;
        total += d;
        prev[i] = now;
      }
      const std::vector<double>& bounds = own.layout().bounds();
      v[kP50Key[h]] = QuantileOf(0.5, bounds, scratch_.data(), total);
      v[kP50Key[h] + 1] = QuantileOf(0.99, bounds, scratch_.data(), total);
    }
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
  // it grows.
  const size_t ring_text =
      2 * ((kPoints * (kMaxEntryBytes + 1)) * 5 / 4 + 256 + kMaxEntryBytes + 1);
  return sizeof(State) + (kNumLiveKeys + 1) * ring_text +
         kNumLatencies * buckets * sizeof(uint64_t);
}

size_t History::BytesHeld(const EngineSeries& s) const {
  auto it = states_.find(&s);
  if (it == states_.end()) return 0;
  const State& st = *it->second;
  size_t n = sizeof(State) + st.series.t.capacity();
  for (const TextRing& r : st.series.values) n += r.capacity();
  for (const std::vector<uint64_t>& p : st.prev) {
    n += p.capacity() * sizeof(uint64_t);
  }
  return n;
}

}  // namespace tokenmeter::daemon::live
